;;;; What the user's Emacs sees of the agents' work in this image (elisp-compat/swank-mcp.el):
;;;; the activity record, a bounded record of every tool call agents make here, and approvals,
;;;; calls waiting for the user's yes in Emacs (swank-mcp-approval-mode).
;;;;
;;;; The record is fed by the agents' servers (src/mcp/activity.rs), which alone see every call:
;;;; those waiting for approval, declined, refused before they reach the image, and the reply
;;;; text exactly as the agent receives it. It lives in the image, so an agent's server that
;;;; reconnects (or a new one) changes nothing on the Emacs side, and a buffer opened later still
;;;; shows the calls made before.
;;;;
;;;; Loaded after loading.lisp, under the rules of helper.lisp.

(in-package #:mcp-agent-helper)

(defparameter *watch-lease* (* 5 internal-time-units-per-second)
  "How long one poll from Emacs counts as an Emacs watching, or as an approver being there.")

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

(defparameter *call-states* '(:waiting :running :declined :timed-out :cancelled :failed :done)
  "Where a call can be; the first two are not an end.")

(defclass activity-record ()
  ((version :initarg :version :accessor record-version)
   (id :initarg :id :reader record-id)
   (tool :initarg :tool :reader record-tool)
   (client :initarg :client :reader record-client)
   (input :initarg :input :reader record-input)
   (package :initarg :package :reader record-package)
   (started :initform (get-universal-time) :reader record-started)
   (state :initarg :state :accessor record-state)
   (milliseconds :initform nil :accessor record-milliseconds)
   (text :initform nil :accessor record-text)))

(defun activity-watched-p ()
  (> *activity-watched-until* (get-internal-real-time)))

(defun note-activities (notes &key session token)
  "A server's notes on its calls, oldest first, each (ID TOOL STATE &key INPUT CLIENT PACKAGE TEXT
MILLISECONDS): its call ID of TOOL is now in STATE (one of *CALL-STATES*); with TEXT, the reply
the agent received, and MILLISECONDS, how long the call took, once it ended. A note that arrives
after its call's end (notes of one call come in order, but the end is final) changes nothing."
  (declare (ignore session token))
  (let ((bad (find-if-not (lambda (note)
                            (and (consp note) (stringp (first note)) (stringp (second note))
                                 (member (third note) *call-states*)))
                          notes)))
    (when bad
      (return-from note-activities
        (list :failure (format nil "Each note is a call id, a tool name, one of ~{~(~S~)~^, ~} and keywords: ~S"
                               *call-states* bad)))))
  ;; A note that does not fit NOTE-ACTIVITY's arguments is reported, not taken to the debugger
  ;; with the lock held.
  (handler-case (sb-thread:with-mutex (*activity-lock*)
                  (dolist (note notes)
                    (apply #'note-activity note)))
    (error (condition)
      (return-from note-activities (list :failure (format nil "A note was not recorded: ~A" condition)))))
  (list :recorded (length notes)))

(defun note-activity (id tool state &key input client package text milliseconds)
  "One of NOTE-ACTIVITIES' notes, under *ACTIVITY-LOCK*."
  (let ((record (find id *activity* :key #'record-id :test #'string=)))
    (cond ((null record)
           (push (make-instance 'activity-record :version (incf *activity-version*) :id id :tool tool
                                                 :client client :input (or input "") :package package
                                                 :state state)
                 *activity*)
           (setf record (first *activity*))
           (when (> (length *activity*) *activity-limit*)
             (setf *activity* (subseq *activity* 0 *activity-limit*))))
          ((member (record-state record) '(:waiting :running))
           (setf (record-state record) state
                 (record-version record) (incf *activity-version*))))
    (when (and text (eq (record-state record) state))
      (setf (record-text record) text
            (record-milliseconds record) milliseconds))))

(defun outcome-line (text)
  "The first line of TEXT that says something, cut to 200 characters: how the call ended."
  (let* ((lines (loop for start = 0 then (1+ end)
                      for end = (position #\Newline text :start start)
                      collect (string-trim " " (subseq text start end))
                      while end))
         (line (or (find-if (lambda (line) (plusp (length line))) lines) "")))
    (if (> (length line) 200) (concatenate 'string (subseq line 0 200) " ...") line)))

(defun activity-since (version)
  "For the Emacs activity buffer, which polls it: keeps the Emacs counted as watching for
*WATCH-LEASE*, and returns (current-version records), the records changed since VERSION, oldest
first, each a plist (:ID :TIME :CLIENT :TOOL :INPUT :PACKAGE :STATE :MILLISECONDS :OUTCOME
:TEXT); :TEXT, the reply the agent received, and :MILLISECONDS are NIL until the call ends."
  (setf *activity-watched-until* (+ (get-internal-real-time) *watch-lease*))
  (sb-thread:with-mutex (*activity-lock*)
    (list *activity-version*
          (loop for record in (reverse *activity*)
                when (> (record-version record) version)
                  collect (list :id (record-id record)
                                :time (multiple-value-bind (s m h) (decode-universal-time (record-started record))
                                        (format nil "~2,'0D:~2,'0D:~2,'0D" h m s))
                                :client (record-client record)
                                :tool (record-tool record)
                                :input (record-input record)
                                :package (record-package record)
                                :state (record-state record)
                                :milliseconds (record-milliseconds record)
                                :outcome (and (record-text record) (outcome-line (record-text record)))
                                :text (record-text record))))))

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

;;; ------------------------------------------------------------------------------------------
;;; Tools allowed for a session
;;;
;;; The user's "allow for the session" answer in Emacs is kept here, where Emacs can take it back
;;; (swank-mcp-revoke-session-allowances): the agent's server asks before it skips an approval.

(defvar *session-allowances* '()
  "The tools the user allowed in Emacs for the rest of an agent's session: (session tool client),
newest first.")

(defvar *allowance-lock* (sb-thread:make-mutex :name "mcp-agent-helper allowances"))

(defun allow-for-session (tool client &key session token)
  "The user allowed TOOL for the rest of SESSION, the session of the agent's client CLIENT."
  (declare (ignore token))
  (sb-thread:with-mutex (*allowance-lock*)
    (pushnew (list session tool client) *session-allowances* :test #'equal))
  (list :allowed t))

(defun session-allowed-p (tool &key session token)
  "Whether TOOL is still allowed for SESSION: (:ALLOWED boolean)."
  (declare (ignore token))
  (sb-thread:with-mutex (*allowance-lock*)
    (list :allowed (and (find-if (lambda (allowance)
                                   (and (equal (first allowance) session) (equal (second allowance) tool)))
                                 *session-allowances*)
                        t))))

(defun revoke-session-allowances ()
  "For Emacs: every tool allowed for a session needs the user's approval again. Returns what was
allowed, each (tool client), oldest first."
  (sb-thread:with-mutex (*allowance-lock*)
    (prog1 (mapcar #'rest (reverse *session-allowances*))
      (setf *session-allowances* '()))))
