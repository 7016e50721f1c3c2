;;;; What the user's Emacs sees of the agents' work in this image (elisp-compat/swank-mcp.el):
;;;; the activity feed, a bounded record of the tool calls agents make here, and approvals,
;;;; calls waiting for the user's yes in Emacs (swank-mcp-approval-mode).
;;;;
;;;; The image tells Emacs: an activity buffer or approval mode subscribes a channel of its
;;;; connection (*EMACS-FEEDS*), and each call's start, end and approval is sent down it as one
;;;; message. Nothing runs while no agent works, and nothing is recorded while no Emacs
;;;; subscribes, so the feed costs a call one comparison then. Both live in the image: an agent's
;;;; server that reconnects (or a new one) changes nothing on the Emacs side.
;;;;
;;;; Loaded after loading.lisp, under the rules of helper.lisp.

(in-package #:mcp-agent-helper)

(defvar *emacs-feeds* '()
  "The Emacs channels to tell of agents' calls, each (CONNECTION CHANNEL-ID TOPIC SEND). TOPIC is
:ACTIVITY (an activity buffer) or :APPROVALS (approval mode). SEND queues one message for that
connection's Emacs and returns NIL once the connection has closed. Emacs adds and removes its
entries itself (swank-mcp--subscribe-form), with the server's names, which this file may not
mention, and maybe before any agent has loaded this helper.")

(defun told-p (topic)
  "Whether an Emacs subscribed to TOPIC."
  (find topic *emacs-feeds* :key #'third))

(defun tell-emacs (topic &rest message)
  "Sends MESSAGE, a flat list (one line in Emacs's event log), to each Emacs subscribed to TOPIC;
forgets those whose connection closed. True when one was told."
  (let ((told nil))
    (dolist (feed *emacs-feeds* told)
      (when (eq (third feed) topic)
        (if (ignore-errors (funcall (fourth feed) message))
            (setf told t)
            (sb-ext:atomic-update (symbol-value '*emacs-feeds*) #'remove feed))))))

(defvar *activity-lock* (sb-thread:make-mutex :name "mcp-agent-helper activity"))

(defvar *activity* '()
  "The recorded calls, newest first.")

(defparameter *activity-limit* 200)

(defparameter *full-reply-limit* 20000
  "Characters of a call's reply kept for Emacs to show.")

(defparameter *tool-names*
  '((evaluate . "evaluate-lisp") (compile-code . "compile-form") (expand-form . "macroexpand-form")
    (class-info . "class-info") (describe-symbol . "describe-symbol") (apropos-search . "apropos-search")
    (find-definition . "find-definition") (xref . "xref") (status . "lisp-status")
    (load-system . "load-system") (undo-journal . "undo"))
  "The tool each helper entry point serves.")

(defclass activity-record ()
  ((token :initarg :token :reader record-token)
   (tool :initarg :tool :reader record-tool)
   (input :initarg :input :reader record-input)
   (package :initarg :package :reader record-package)
   (started :initform (get-universal-time) :reader record-started)
   (started-real :initform (get-internal-real-time) :reader record-started-real)
   (milliseconds :initform nil :accessor record-milliseconds)
   (outcome :initform nil :accessor record-outcome)
   (reply :initform nil :accessor record-reply)))

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
  "Records that the call under TOKEN starts, and tells the Emacs activity buffers, when one is open."
  (when (told-p :activity)
    (multiple-value-bind (tool arguments) (helper-request)
      (when tool
        (let* ((keys (member-if #'keywordp arguments))
               (record (make-instance 'activity-record
                                      :token token :tool tool :input (request-input tool arguments)
                                      :package (and (stringp (getf keys :package)) (getf keys :package)))))
          (sb-thread:with-mutex (*activity-lock*)
            (push record *activity*)
            (when (> (length *activity*) *activity-limit*)
              (setf *activity* (subseq *activity* 0 *activity-limit*))))
          (apply #'tell-emacs :activity :call (record-plist record)))))))

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
  "Records how the call under TOKEN ended, if its start was recorded, and tells the Emacs activity
buffers still open."
  (when (and *activity* (told-p :activity))
    (let ((record (sb-thread:with-mutex (*activity-lock*)
                    (let ((record (find token *activity* :key #'record-token :test #'equal)))
                      (when (and record (null (record-milliseconds record)))
                        (setf (record-milliseconds record)
                              (round (* 1000 (- (get-internal-real-time) (record-started-real record)))
                                     internal-time-units-per-second)
                              (record-outcome record) (ignore-errors (outcome-line outcome))
                              (record-reply record) (ignore-errors (print-briefly outcome :length 200 :level 8
                                                                                          :limit *full-reply-limit*)))
                        record)))))
      (when record
        (apply #'tell-emacs :activity :call (record-plist record))))))

(defun record-plist (record)
  "What Emacs is told of RECORD: (:ID :TIME :SESSION :TOOL :INPUT :PACKAGE :MILLISECONDS :OUTCOME
:REPLY), :MILLISECONDS NIL while the call runs."
  (list :id (record-token record)
        :time (multiple-value-bind (s m h) (decode-universal-time (record-started record))
                (format nil "~2,'0D:~2,'0D:~2,'0D" h m s))
        :session (let ((token (record-token record)))
                   (subseq token 0 (or (position #\- token :from-end t) (length token))))
        :tool (record-tool record)
        :input (record-input record)
        :package (record-package record)
        :milliseconds (record-milliseconds record)
        :outcome (record-outcome record)
        :reply (record-reply record)))

;;; ------------------------------------------------------------------------------------------
;;; Approvals in Emacs

(defclass approval ()
  ((id :initarg :id :reader approval-id)
   (answered :initform (sb-thread:make-semaphore :name "mcp-agent-helper approval answered")
             :reader approval-answered)
   (verdict :initform nil :accessor approval-verdict)))

(defvar *approvals* '()
  "Approvals waiting for the user's answer.")

(defvar *approval-lock* (sb-thread:make-mutex :name "mcp-agent-helper approvals"))

(defvar *next-approval-id* 1)

(defun request-approval (tool text &key client timeout-ms session token)
  "Asks the user's Emacs (swank-mcp-approval-mode) whether the call of TOOL, made by the MCP client
named CLIENT, may run: TEXT shows what it would run. Waits up to TIMEOUT-MS milliseconds for the answer,
and returns (:VERDICT v): :YES, :NO, :ALWAYS (yes, and for the rest of the session), :TIMEOUT, or
:UNAVAILABLE when no Emacs is in approval mode. A cancellation interrupts the wait through TOKEN,
as for any call. Emacs is told when the request ends, however it ends, so that its prompt goes."
  (declare (ignore session))
  (run-tool
   token
   (lambda ()
     (let* ((approval (make-instance 'approval :id (sb-thread:with-mutex (*approval-lock*)
                                                     (incf *next-approval-id*))))
            (id (approval-id approval))
            (verdict :cancelled))
       ;; Registered before Emacs hears of it, so that an answer at once finds it.
       (sb-thread:with-mutex (*approval-lock*)
         (push approval *approvals*))
       (unwind-protect
            (if (not (tell-emacs :approvals :approval :id id :client client :tool tool :text text))
                (setf verdict :unavailable)
                (progn
                  ;; A semaphore, not a condition variable: SBCL 2.2.9's CONDITION-WAIT returns from
                  ;; a timeout without the mutex, and a second wait then fails.
                  (sb-thread:wait-on-semaphore (approval-answered approval) :timeout (/ timeout-ms 1000))
                  ;; An answer that came after the wait timed out, but before this, is still taken:
                  ;; ANSWER-APPROVAL told Emacs it was.
                  (sb-thread:with-mutex (*approval-lock*)
                    (setf *approvals* (remove approval *approvals*)
                          verdict (or (approval-verdict approval) :timeout)))))
         (sb-thread:with-mutex (*approval-lock*)
           (setf *approvals* (remove approval *approvals*)))
         (unless (eq verdict :unavailable)
           (tell-emacs :approvals :approval-ended :id id :verdict verdict)))
       (list :verdict verdict)))))

(defun answer-approval (id verdict)
  "The user's answer (:YES, :NO or :ALWAYS) to approval ID: :TAKEN when the request still waited
and gets it, :ENDED when it had already ended (timed out, cancelled), so that nothing runs."
  (unless (member verdict '(:yes :no :always))
    (error "An approval is answered :YES, :NO or :ALWAYS, not ~S." verdict))
  (sb-thread:with-mutex (*approval-lock*)
    (let ((approval (find id *approvals* :key #'approval-id)))
      (cond ((and approval (null (approval-verdict approval)))
             (setf (approval-verdict approval) verdict)
             (sb-thread:signal-semaphore (approval-answered approval))
             :taken)
            (t :ended)))))
