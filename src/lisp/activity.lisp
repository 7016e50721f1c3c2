;;;; What the user's Emacs sees of the agents' work in this image (elisp-compat/swank-mcp.el):
;;;; the activity feed, a bounded record of the tool calls agents make here, and approvals,
;;;; calls waiting for the user's yes in Emacs (swank-mcp-approval-mode).
;;;;
;;;; Emacs asks for both by polling, while its activity buffer is open or its approval mode is
;;;; on; each poll says it is still there for a few seconds. Nothing is recorded while no Emacs
;;;; watches, so the feed costs a call one comparison then. Both live in the image: an agent's
;;;; server that reconnects (or a new one) changes nothing on the Emacs side.
;;;;
;;;; Loaded after loading.lisp, under the rules of helper.lisp.

(in-package #:mcp-agent-helper)

(defparameter *watch-lease* (* 5 internal-time-units-per-second)
  "How long one poll from Emacs keeps the feed recording, or counts as an approver being there.")

(defvar *activity-watched-until* 0
  "Internal real time until which an Emacs activity buffer counts as open.")

(defvar *approver-until* 0
  "Internal real time until which an Emacs with swank-mcp-approval-mode counts as there.")

(defvar *activity-lock* (sb-thread:make-mutex :name "mcp-agent-helper activity"))

(defvar *activity* '()
  "The recorded calls, newest first.")

(defparameter *activity-limit* 200)

(defvar *activity-version* 0
  "Counts every change to a record, so that a poll asks only for what changed since the last.")

(defparameter *full-reply-limit* 20000
  "Characters of a call's reply kept for Emacs to show.")

(defparameter *tool-names*
  '((evaluate . "evaluate-lisp") (compile-code . "compile-form") (expand-form . "macroexpand-form")
    (class-info . "class-info") (describe-symbol . "describe-symbol") (apropos-search . "apropos-search")
    (find-definition . "find-definition") (xref . "xref") (status . "lisp-status")
    (load-system . "load-system") (undo-journal . "undo"))
  "The tool each helper entry point serves.")

(defclass activity-record ()
  ((version :initarg :version :accessor record-version)
   (token :initarg :token :reader record-token)
   (tool :initarg :tool :reader record-tool)
   (input :initarg :input :reader record-input)
   (package :initarg :package :reader record-package)
   (started :initform (get-universal-time) :reader record-started)
   (started-real :initform (get-internal-real-time) :reader record-started-real)
   (milliseconds :initform nil :accessor record-milliseconds)
   (outcome :initform nil :accessor record-outcome)
   (reply :initform nil :accessor record-reply)))

(defun activity-watched-p ()
  (> *activity-watched-until* (get-internal-real-time)))

(defun helper-request ()
  "The tool name and arguments of the request this thread serves: the server evaluates it with
EVAL, so the evaluator's frame holds the form, (MCP-AGENT-HELPER:EVALUATE \"code\" :SESSION ...)."
  (let ((found (block walk
                 (ignore-errors
                  (internal-call
                   "SB-DEBUG" "MAP-BACKTRACE"
                   (lambda (frame)
                     ;; Only the evaluator's frames have their arguments read: reading every
                     ;; frame's made the walk ten times slower.
                     (when (member (internal-call "SB-DI" "DEBUG-FUN-NAME" (internal-call "SB-DI" "FRAME-DEBUG-FUN" frame))
                                   *evaluator-functions*)
                       (let ((form (first (nth-value 1 (frame-name-and-args frame)))))
                         (when (and (consp form) (assoc (first form) *tool-names*))
                           (return-from walk form)))))))
                 nil)))
    (and found (values (cdr (assoc (first found) *tool-names*)) (rest found)))))

(defun request-input (tool arguments)
  "What the user is shown of a call's input: its code, symbol or system, and for xref the kind."
  (let ((first (first arguments)))
    (cond ((equal tool "xref") (format nil "~A ~(~A~)" first (second arguments)))
          ((equal tool "undo")
           (format nil "~@[entries ~A~]~@[since ~A~]" (getf arguments :entries) (getf arguments :since)))
          ((stringp first) first)
          (t ""))))

(defun note-call-start (token)
  "Records that the call under TOKEN starts, when an Emacs watches."
  (when (activity-watched-p)
    (multiple-value-bind (tool arguments) (helper-request)
      (when tool
        (let ((keys (member-if #'keywordp arguments)))
          (sb-thread:with-mutex (*activity-lock*)
            (push (make-instance 'activity-record
                                 :version (incf *activity-version*) :token token :tool tool
                                 :input (request-input tool arguments)
                                 :package (and (stringp (getf keys :package)) (getf keys :package)))
                  *activity*)
            (when (> (length *activity*) *activity-limit*)
              (setf *activity* (subseq *activity* 0 *activity-limit*)))))))))

(defun outcome-line (outcome)
  "One line saying how a call ended, from what CALL-REGISTERED's function returned: (:OK values)
for evaluate-lisp, each value (text dropped); (:OK plist) for the other tools; (:FAILURE
message); or an error report."
  (flet ((one-line (text)
           (let ((line (substitute #\Space #\Newline (string-trim '(#\Space #\Newline) text))))
             (if (> (length line) 200) (concatenate 'string (subseq line 0 200) " ...") line))))
    (cond ((and (consp outcome) (eq (first outcome) :ok))
           (let ((values (second outcome)))
             (cond ((null values) "no values")
                   ;; evaluate-lisp's values, each (text dropped).
                   ((and (consp (first values)) (stringp (first (first values))))
                    (one-line (format nil "=> ~{~A~^, ~}" (mapcar #'first values))))
                   ((and (consp (first values)) (getf (first values) :failure))
                    (one-line (format nil "failed: ~A" (getf (first values) :failure))))
                   (t "done"))))
          ((and (consp outcome) (eq (first outcome) :failure))
           (one-line (format nil "failed: ~A" (second outcome))))
          ((and (consp outcome) (getf outcome :type))
           (one-line (format nil "[ERROR] ~A: ~A" (getf outcome :type) (getf outcome :message))))
          (t "done"))))

(defun note-call-end (token outcome)
  "Records how the call under TOKEN ended, if its start was recorded and an Emacs still watches."
  (when (and *activity* (activity-watched-p))
    (sb-thread:with-mutex (*activity-lock*)
      (let ((record (find token *activity* :key #'record-token :test #'equal)))
        (when (and record (null (record-milliseconds record)))
          (setf (record-milliseconds record)
                (round (* 1000 (- (get-internal-real-time) (record-started-real record)))
                       internal-time-units-per-second)
                (record-outcome record) (ignore-errors (outcome-line outcome))
                (record-reply record) (ignore-errors (print-briefly outcome :length 200 :level 8
                                                                            :limit *full-reply-limit*))
                (record-version record) (incf *activity-version*)))))))

(defun activity-since (version)
  "For the Emacs activity buffer, which polls it: keeps the feed recording for *WATCH-LEASE*, and
returns (current-version records), the records changed since VERSION, oldest first, each a plist
(:ID :TIME :SESSION :TOOL :INPUT :PACKAGE :MILLISECONDS :OUTCOME :REPLY); :MILLISECONDS is NIL
while the call runs."
  (setf *activity-watched-until* (+ (get-internal-real-time) *watch-lease*))
  (sb-thread:with-mutex (*activity-lock*)
    (list *activity-version*
          (loop for record in (reverse *activity*)
                when (> (record-version record) version)
                  collect (list :id (record-token record)
                                :time (multiple-value-bind (s m h) (decode-universal-time (record-started record))
                                        (format nil "~2,'0D:~2,'0D:~2,'0D" h m s))
                                :session (let ((token (record-token record)))
                                           (subseq token 0 (or (position #\- token :from-end t) (length token))))
                                :tool (record-tool record)
                                :input (record-input record)
                                :package (record-package record)
                                :milliseconds (record-milliseconds record)
                                :outcome (record-outcome record)
                                :reply (record-reply record))))))

(defun stop-watching-activity ()
  "The Emacs activity buffer closed: stop recording."
  (setf *activity-watched-until* 0)
  t)

;;; ------------------------------------------------------------------------------------------
;;; Approvals in Emacs

(defclass approval ()
  ((id :initarg :id :reader approval-id)
   (session :initarg :session :reader approval-session)
   (tool :initarg :tool :reader approval-tool)
   (text :initarg :text :reader approval-text)
   (verdict :initform nil :accessor approval-verdict)))

(defvar *approvals* '()
  "Approvals waiting for the user's answer, oldest first.")

(defvar *approval-lock* (sb-thread:make-mutex :name "mcp-agent-helper approvals"))

(defvar *approval-answered* (sb-thread:make-waitqueue :name "mcp-agent-helper approval answered"))

(defvar *next-approval-id* 1)

(defparameter *approver-grace* 1.5
  "Seconds a request waits for an Emacs in approval mode to show itself: one polls every 0.3 s,
and may not have polled since the helper loaded.")

(defun approver-present-p ()
  (> *approver-until* (get-internal-real-time)))

(defun request-approval (tool text &key session token)
  "Asks the user's Emacs (swank-mcp-approval-mode) whether the call of TOOL that TEXT describes
may run, and waits for the answer. Returns (:VERDICT v): :YES, :NO, :ALWAYS (yes, and for the
rest of the session), or :UNAVAILABLE when no Emacs in approval mode polls this image. A timeout
or a cancellation interrupts the wait through TOKEN, as for any call."
  (run-tool
   token
   (lambda ()
     (loop repeat (ceiling *approver-grace* 0.1)
           until (approver-present-p)
           do (sleep 0.1))
     (if (not (approver-present-p))
         (list :verdict :unavailable)
         (let ((approval (sb-thread:with-mutex (*approval-lock*)
                           (let ((approval (make-instance 'approval :id (incf *next-approval-id*)
                                                                    :session session :tool tool :text text)))
                             (setf *approvals* (append *approvals* (list approval)))
                             approval))))
           (unwind-protect
                (sb-thread:with-mutex (*approval-lock*)
                  (loop until (approval-verdict approval)
                        do (sb-thread:condition-wait *approval-answered* *approval-lock* :timeout 1))
                  (list :verdict (approval-verdict approval)))
             (sb-thread:with-mutex (*approval-lock*)
               (setf *approvals* (remove approval *approvals*)))))))))

(defun pending-approvals ()
  "For Emacs in approval mode, which polls it: says the approver is there for *WATCH-LEASE*, and
returns the approvals waiting, each (:ID :SESSION :TOOL :TEXT)."
  (setf *approver-until* (+ (get-internal-real-time) *watch-lease*))
  (sb-thread:with-mutex (*approval-lock*)
    (loop for approval in *approvals*
          unless (approval-verdict approval)
            collect (list :id (approval-id approval) :session (approval-session approval)
                          :tool (approval-tool approval) :text (approval-text approval)))))

(defun answer-approval (id verdict)
  "The user's answer (:YES, :NO or :ALWAYS) to approval ID. True when it was still waiting."
  (sb-thread:with-mutex (*approval-lock*)
    (let ((approval (find id *approvals* :key #'approval-id)))
      (when (and approval (member verdict '(:yes :no :always)))
        (setf (approval-verdict approval) verdict)
        (sb-thread:condition-broadcast *approval-answered*)
        t))))

(defun leave-approval-mode ()
  "Emacs left approval mode: new requests are refused at once."
  (setf *approver-until* 0)
  t)
