;;;; What the user's Emacs sees of the agents' work in this image (elisp-compat/swank-mcp.el):
;;;; the activity record, a bounded record of every tool call agents make here. (Approvals, calls
;;;; waiting for the user's yes in Emacs, are approvals.lisp's.)
;;;;
;;;; The record is fed by the agents' servers (src/mcp/activity.rs), which alone see every call:
;;;; those waiting for approval, declined, refused before they reach the image, and the reply
;;;; text exactly as the agent receives it. The image tells Emacs: an activity buffer or approval
;;;; mode subscribes a channel of its connection (*EMACS-FEEDS*), and each change of a call's
;;;; state, and each approval, is sent down it as one message. Nothing runs while no agent works.
;;;; Both live in the image, so an agent's server that reconnects (or a new one) changes nothing
;;;; on the Emacs side, and a buffer opened later still shows the calls made before. The user can
;;;; also end an agent's call from Emacs (CANCEL-CALL): the evaluations of a call are registered
;;;; under tokens that name it (TOKEN-CALL, calls.lisp).

(in-package #:mcp-agent-helper)

(defun emacs-subscribed-p ()
  "True while an Emacs buffer subscribes to agents' calls here."
  (and *emacs-feeds* t))

(defun tell-emacs (topic &rest message)
  "Sends MESSAGE, a flat list (one line in Emacs's event log), to each Emacs subscribed to TOPIC;
forgets those whose connection closed. True when one was told."
  (let ((told nil))
    (dolist (feed *emacs-feeds* told)
      (when (eq (third feed) topic)
        (if (ignore-errors (funcall (fourth feed) message))
            (setf told t)
            (sb-ext:atomic-update (symbol-value '*emacs-feeds*) #'remove feed))))))

(defparameter *activity-limit* 200)

(defun find-activity (id)
  "The record of the call ID, under *ACTIVITY-LOCK*."
  (values (gethash id *activity-by-id*)))

(defun add-activity (record)
  "Records RECORD, under *ACTIVITY-LOCK*, forgetting the oldest beyond *ACTIVITY-LIMIT*."
  (push record *activity*)
  (setf (gethash (record-id record) *activity-by-id*) record)
  (let ((last-kept (nthcdr (1- *activity-limit*) *activity*)))
    (when (cdr last-kept)
      (dolist (forgotten (cdr last-kept))
        (remhash (record-id forgotten) *activity-by-id*))
      (setf (cdr last-kept) nil))))

(defparameter *call-states* '(:waiting :running :declined :timed-out :cancelled :failed :done)
  "Where a call can be, as the agents' servers note it; the first two are not an end. The image
itself ends a call in :LOST when its server's connection closes first (END-CALLS-OF-CONNECTION).")

(defclass activity-record ()
  ((version :initform (incf *activity-version*) :accessor record-version)
   (id :initarg :id :reader record-id)
   (tool :initarg :tool :reader record-tool)
   (client :initarg :client :reader record-client)
   (input :initarg :input :reader record-input)
   (package :initarg :package :reader record-package)
   ;; The files the call's arguments name, which Emacs checks for its writes once it ended.
   (files :initarg :files :initform nil :reader record-files)
   (started :initform (get-universal-time) :reader record-started)
   (state :initarg :state :accessor record-state)
   (milliseconds :initform nil :accessor record-milliseconds)
   ;; How long the call waited for the user's approval, apart from how long it ran.
   (waited :initform nil :accessor record-waited)
   (text :initform nil :accessor record-text)
   ;; Set when the user cancelled the call in Emacs: its end, an error the interruption made,
   ;; is recorded as :CANCELLED.
   (cancelled :initform nil :accessor record-cancelled)
   ;; The connection of the agent's server that sent the last note of the call.
   (connection :initform (server-connection) :accessor record-connection)))

(define-entry (note-activities :caller :server :look t) (notes &key session token)
  "A server's notes on its calls, oldest first, each a plist (:ID :TOOL :STATE &key :INPUT :CLIENT
:PACKAGE :FILES :TEXT :MILLISECONDS :WAITED): its call ID of TOOL is now in STATE (one of
*CALL-STATES*); FILES, the files its arguments name; with TEXT, the reply the agent received, and
MILLISECONDS, how long the call ran (NIL when it never ran), once it ended; WAITED, how long it
waited for approval, once it stopped waiting. A note that arrives after its call's end (notes of
one call come in order, but the end is final) changes nothing. The Emacs activity buffers are
told of each change, and the Emacs that watch files (:FILES) of each call that ran and named files,
as it ends: they revert the buffers of those it wrote."
  (declare (ignore session token))
  (let ((bad (find-if-not (lambda (note)
                            (and (consp note) (evenp (length note))
                                 (stringp (getf note :id)) (stringp (getf note :tool))
                                 (member (getf note :state) *call-states*)))
                          notes))
        (changed '()))
    (when bad
      (return-from note-activities
        (list :failure (format nil "Each note is a plist of a call's :id, :tool, :state (one of ~{~(~S~)~^, ~}) ~
and keywords: ~S"
                               *call-states* bad))))
    ;; A note that does not fit NOTE-ACTIVITY's arguments is reported, not taken to the debugger
    ;; with the lock held.
    (handler-case (sb-thread:with-mutex (*activity-lock*)
                    (dolist (note notes)
                      (let ((plist (apply #'note-activity note)))
                        (when plist (push plist changed)))))
      (error (condition)
        (return-from note-activities (list :failure (format nil "A note was not recorded: ~A" condition)))))
    (dolist (plist (nreverse changed))
      (apply #'tell-emacs :activity :call plist)
      (when (and (getf plist :files) (getf plist :milliseconds))
        (tell-emacs :files :written :id (getf plist :id) :tool (getf plist :tool) :client (getf plist :client)
                                    :time (getf plist :time) :files (getf plist :files))))
    (list :recorded (length notes))))

(defun note-activity (&key id tool state input client package files text milliseconds waited)
  "One of NOTE-ACTIVITIES' notes, under *ACTIVITY-LOCK*: the record's plist when it changed."
  (let ((record (find-activity id))
        (changed nil))
    ;; A call the user cancelled ends as cancelled: by the error its interruption made, or, when
    ;; it waited for approval, by the refusal CANCEL-CALL gave it.
    (when (and record (record-cancelled record) (member state '(:failed :declined)))
      (setf state :cancelled))
    (cond ((null record)
           (setf record (make-instance 'activity-record :id id :tool tool :client client
                                                        :input (or input "") :package package
                                                        :files files :state state)
                 changed t)
           (add-activity record))
          ((member (record-state record) '(:waiting :running))
           (setf (record-state record) state
                 (record-connection record) (server-connection)
                 changed t)))
    (when (and waited (not (eql waited (record-waited record))))
      (setf (record-waited record) waited
            changed t))
    (when (and text (eq (record-state record) state))
      (setf (record-text record) text
            (record-milliseconds record) milliseconds
            changed t))
    (when changed
      (setf (record-version record) (incf *activity-version*))
      (record-plist record))))

(defparameter *lost-call*
  "The agent's server went away before this call ended (its connection to the image closed); how \
the call ended is not known."
  "The reply text of a call in :LOST.")

(defun end-calls-of-connection (connection)
  "For the server's connection-closed hook (CONNECTION-CLOSED): the calls of the agent's server on CONNECTION that have
not ended never will, as far as the record can tell; they are ended in :LOST, so that neither the
activity buffer nor M-x swank-mcp-cancel-call takes them for running."
  (ignore-errors
   (let ((changed (sb-thread:with-mutex (*activity-lock*)
                    (loop for record in *activity*
                          when (and (eq (record-connection record) connection)
                                    (member (record-state record) '(:waiting :running)))
                            do (setf (record-state record) :lost
                                     (record-text record) *lost-call*
                                     (record-version record) (incf *activity-version*))
                            and collect (record-plist record)))))
     (dolist (plist changed)
       (apply #'tell-emacs :activity :call plist)))))

(defun section-heading-p (line)
  "True for a line that only names a section of a reply, such as [warnings] or [stdout]."
  (and (> (length line) 2)
       (char= (char line 0) #\[)
       (char= (char line (1- (length line))) #\])
       (notany (lambda (c) (char= c #\Space)) line)))

(defun outcome-line (text)
  "How the call ended, cut to 200 characters: an evaluation's value (its line \"=> ...\", which
follows its output's and warnings' sections), else the first line of TEXT that says something,
not a section's heading."
  (let* ((lines (loop for start = 0 then (1+ end)
                      for end = (position #\Newline text :start start)
                      collect (string-trim " " (subseq text start end))
                      while end))
         (after-sections (let ((last-heading (position-if #'section-heading-p lines :from-end t)))
                           (if last-heading (nthcdr (1+ last-heading) lines) lines)))
         (line (or (find-if (lambda (line) (eql 0 (search "=> " line))) after-sections)
                   (find-if (lambda (line) (and (plusp (length line)) (not (section-heading-p line)))) lines)
                   "")))
    (if (> (length line) 200) (concatenate 'string (subseq line 0 200) " ...") line)))

(defun reload-line (text)
  "The line of TEXT, a reply, that says ASDF reloaded the person's changed files before the call's
work (run-tests' \"Before the tests, ASDF reloaded ...\", load-system's), cut to 200 characters,
or NIL: the activity buffer shows it under the call, whose first line says only how it ended."
  (let ((at (search "ASDF reloaded " text)))
    (when at
      (let* ((start (1+ (or (position #\Newline text :end at :from-end t) -1)))
             (line (string-trim " " (subseq text start (position #\Newline text :start at)))))
        (if (> (length line) 200) (concatenate 'string (subseq line 0 200) " ...") line)))))

(defparameter *user-cancellation*
  "The user cancelled this call in Emacs (M-x swank-mcp-cancel-call); what it did before that stays done."
  "Why a call the user cancelled was interrupted, as the agent's reply says it.")

(defclass activity-event (activity-record)
  ((kind :initarg :kind :reader event-kind
         :documentation "One of :BREAKPOINT-SET, :BREAKPOINT-REMOVED, :BREAKPOINT-HIT,
:BREAKPOINT-LEFT and :ATTACHED, or one of *EMACS-EVENT-KINDS*."))
  (:documentation "Something an agent's debugging did to the image's threads; its TEXT says what
(see NOTE-EVENT). Defined before RECORD-PLIST, which tells events from calls."))

(defun record-plist (record)
  "What Emacs is told of RECORD: (:ID :STATE :TOOL :VERSION :TIME :CLIENT :INPUT :PACKAGE :FILES
:MILLISECONDS :WAITED :OUTCOME :RELOADED), and :EVENT, its kind, for an ACTIVITY-EVENT; :OUTCOME, the first
line of the reply the agent received, and :MILLISECONDS, how long it ran, are NIL until the call
ends; :WAITED, how long it waited for approval, is NIL until it stops waiting. The reply itself is
asked for (ACTIVITY-REPLY): every message to Emacs is written in its event log (*slime-events*),
which keeps the last 100,000 characters, where the user's own requests must not be pushed out by
an agent's burst of calls."
  (list* :id (record-id record)
        :state (record-state record)
        :tool (record-tool record)
        :version (record-version record)
        :time (multiple-value-bind (s m h) (decode-universal-time (record-started record))
                (format nil "~2,'0D:~2,'0D:~2,'0D" h m s))
        :client (record-client record)
        :input (record-input record)
        :package (record-package record)
        :files (record-files record)
        :milliseconds (record-milliseconds record)
        :waited (record-waited record)
        :outcome (cond ((and (record-cancelled record) (eq (record-state record) :cancelled))
                        "Cancelled in Emacs.")
                       ((record-text record) (outcome-line (record-text record))))
        :reloaded (and (record-text record) (reload-line (record-text record)))
        (and (typep record 'activity-event) (list :event (event-kind record)))))

(define-entry (activity-reply :caller :emacs) (id)
  "For Emacs: the reply the agent received for its call ID, as (:TEXT text), or an event's whole
text; the text is NIL until the call ends, and the whole answer NIL once the call is no longer
recorded."
  (sb-thread:with-mutex (*activity-lock*)
    (let ((record (find-activity id)))
      (and record (list :text (record-text record))))))

(define-entry (activity-records :caller :emacs) ()
  "For an Emacs activity buffer that opens or is refreshed: every recorded call and event, oldest
first, as RECORD-PLIST. Later changes come down its channel."
  (sb-thread:with-mutex (*activity-lock*)
    (mapcar #'record-plist (reverse *activity*))))

;;; ------------------------------------------------------------------------------------------
;;; What the agents' debugging does to the image's threads
;;;
;;; An agent's breakpoint stops the person's own threads, which no call of the agent's runs, and
;;; an agent may attach to a thread that waits in the person's SLDB: the person must see both
;;; where they watch the agents, not only in the reply the agent gets. So breakpoints set and
;;; removed, threads stopped at them and leaving them, and threads attached to are recorded
;;; between the calls, as events: records of their own kind (state :EVENT, tool "debugger"), kept,
;;; bounded and sent to the activity buffers as calls are, so that a buffer opened later shows them.

(defun note-event (kind control &rest arguments)
  "Records the event KIND, whose text FORMAT makes of CONTROL and ARGUMENTS, and tells the
activity buffers. Never fails: a thread stopping at a breakpoint must not fail for its record."
  (ignore-errors
   (let* ((text (apply #'format nil control arguments))
          (plist (sb-thread:with-mutex (*activity-lock*)
                   (let ((event (make-instance 'activity-event
                                               :kind kind
                                               :id (format nil "event-~D" (sb-ext:atomic-incf (car *event-counter*)))
                                               :tool "debugger" :client nil :input "" :package nil
                                               :state :event)))
                     (setf (record-text event) text)
                     (add-activity event)
                     (record-plist event)))))
     (apply #'tell-emacs :activity :call plist))))

(defparameter *emacs-event-kinds* '(:buffer-kept :stale-compile)
  "The events an Emacs records of what the person's buffers hold against the agents' writes:
:BUFFER-KEPT, a buffer with unsaved changes left as it was over an agent's write to its file;
:STALE-COMPILE, the person's compilation of text older than the agent's write of its file.")

(define-entry (note-emacs-event :caller :emacs) (kind text)
  "For Emacs: records the event KIND (one of *EMACS-EVENT-KINDS*), which TEXT tells, among the
agents' calls, and tells the activity buffers of every Emacs, as the agents' own events are."
  (unless (member kind *emacs-event-kinds*)
    (error "An Emacs event is one of ~{~S~^, ~}, not ~S." *emacs-event-kinds* kind))
  (unless (stringp text)
    (error "An Emacs event's text is a string, not ~S." text))
  (note-event kind "~A" text)
  t)

;;; ------------------------------------------------------------------------------------------
;;; Cancelling an agent's call from Emacs

(defparameter *cancelled-calls-limit* 256)

(define-entry (cancel-call :caller :emacs) (&optional id)
  "For Emacs (M-x swank-mcp-cancel-call): ends the agent's call ID, by default the newest one
still waiting or running. A call waiting for approval is declined. A running call's evaluations
are interrupted, and any it starts later abort at once, each with a report that says the user
cancelled it, which the agent receives. Returns (:DECLINED plist) or (:CANCELLED plist
:INTERRUPTED n), where plist is the call's RECORD-PLIST and N how many evaluations were running,
or (:FAILURE message)."
  (let ((record (sb-thread:with-mutex (*activity-lock*)
                  (let ((record (if id
                                    (find-activity id)
                                    (find-if (lambda (record) (member (record-state record) '(:waiting :running)))
                                             *activity*))))
                    (when (and record (member (record-state record) '(:waiting :running)))
                      (setf (record-cancelled record) t))
                    record))))
    (cond ((null record)
           (list :failure (if id
                              "That call is no longer in the image's record."
                              "No agent's call is running or waiting for approval in this image.")))
          ((not (record-cancelled record))
           (list :failure (format nil "That ~A call has already ended (~(~A~))."
                                  (record-tool record) (record-state record))))
          ((decline-approvals-of (record-id record))
           (list :declined (record-plist record)))
          (t
           (list :cancelled (record-plist record)
                 :interrupted (interrupt-call (record-id record) *user-cancellation*))))))

(defun decline-approvals-of (call)
  "Declines the approvals CALL waits for; true when there was one."
  (sb-thread:with-mutex (*approval-lock*)
    (let ((declined nil))
      (dolist (approval *approvals* declined)
        (when (and (equal (approval-call approval) call) (give-verdict approval :cancelled-in-emacs))
          (setf declined t))))))

(defun interrupt-call (call reason)
  "Interrupts every evaluation of the agent's CALL with REASON, and makes the ones it starts later
abort at once. Returns how many were running."
  (let ((tokens (sb-thread:with-mutex (*registry-lock*)
                  (when (>= (hash-table-count *cancelled-calls*) *cancelled-calls-limit*)
                    (clrhash *cancelled-calls*))
                  (setf (gethash call *cancelled-calls*) (cons :cancelled reason))
                  (loop for token being the hash-keys of *running*
                        when (equal (token-call token) call) collect token))))
    (count-if (lambda (token) (cancel token :cancelled reason)) tokens)))
