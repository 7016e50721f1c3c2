;;;; Approvals in Emacs (swank-mcp-approval-mode): calls waiting for the user's yes, sent down
;;;; the channels Emacs subscribed (activity.lisp), and the tools the user allowed for a session.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Approvals in Emacs

(defclass approval ()
  ((id :initarg :id :reader approval-id)
   ;; The agent's call waiting for it, as the activity record names it, or NIL.
   (call :initarg :call :reader approval-call)
   ;; What Emacs shows, kept for an Emacs that subscribes while the request waits.
   (client :initarg :client :reader approval-client)
   (tool :initarg :tool :reader approval-tool)
   (text :initarg :text :reader approval-text)
   (answered :initform (sb-thread:make-semaphore :name "mcp-agent-helper approval answered")
             :reader approval-answered)
   (verdict :initform nil :accessor approval-verdict)
   ;; The connection of the agent's server that asked, whose close ends the request (:LOST).
   (connection :initform (server-connection) :reader approval-connection)
   ;; Whether the agent's server checks, once the call is approved, that what the user was shown
   ;; still holds (the file a preview was read from), and tells the outcome (SETTLE-APPROVAL):
   ;; until then the approving Emacs cannot say whether the call runs.
   (checked :initarg :checked :initform nil :reader approval-checked)
   (settled :initform (sb-thread:make-semaphore :name "mcp-agent-helper approval settled")
            :reader approval-settled)
   ;; Why the server refused the approved call, as Emacs says it; NIL when it runs.
   (refusal :initform nil :accessor approval-refusal)))

(defparameter *settle-timeout* 10
  "Seconds ANSWER-APPROVAL waits for the server's check of an approved call: past it, the server
is taken to have run the call (it stopped answering, or is an older revision).")

(defun approval-message (approval)
  "The message that asks Emacs for APPROVAL."
  (list :approval :id (approval-id approval) :call (approval-call approval)
                  :client (approval-client approval) :tool (approval-tool approval) :text (approval-text approval)))

(define-entry (request-approval :caller :server :look t) (tool text &key client timeout-ms checked session token)
  "Asks the user's Emacs (swank-mcp-approval-mode) whether the call of TOOL, made by the MCP client
named CLIENT, may run: TEXT shows what it would run. Waits up to TIMEOUT-MS milliseconds for the answer,
and returns (:VERDICT v :ID id): :YES, :NO (declined, or cancelled by the user in Emacs), :ALWAYS (yes,
and for the rest of the session), :TIMEOUT,
:UNAVAILABLE when no Emacs is in approval mode, or :TURNED-OFF when the last Emacs in approval mode
turned it off while the request waited (REFUSE-UNWATCHED-APPROVALS). A cancellation interrupts the
wait through TOKEN, as for any call. Emacs is told when the request ends, however it ends, so that
its prompt goes. With CHECKED, the server checks an approved call before it runs it and tells the
outcome of approval ID (SETTLE-APPROVAL), which the Emacs that answered waits for."
  (declare (ignore session))
  (run-tool
   token
   (lambda ()
     (let* ((approval (make-instance 'approval :id (sb-thread:with-mutex (*approval-lock*)
                                                     (incf *next-approval-id*))
                                               :call (token-call token) :client client :tool tool :text text
                                               :checked checked))
            (id (approval-id approval))
            (verdict :cancelled))
       ;; Registered before Emacs hears of it, so that an answer at once finds it.
       (sb-thread:with-mutex (*approval-lock*)
         (push approval *approvals*))
       (unwind-protect
            (if (not (apply #'tell-emacs :approvals (approval-message approval)))
                (setf verdict :unavailable)
                (progn
                  ;; A semaphore, not a condition variable: SBCL 2.2.9's CONDITION-WAIT returns from
                  ;; a timeout without the mutex, and a second wait then fails.
                  (sb-thread:wait-on-semaphore (approval-answered approval) :timeout (/ timeout-ms 1000))
                  ;; An answer that came after the wait timed out, but before this, is still taken:
                  ;; ANSWER-APPROVAL told Emacs it was.
                  (sb-thread:with-mutex (*approval-lock*)
                    (setf *approvals* (remove approval *approvals*)
                          verdict (or (approval-verdict approval) :timeout))
                    (when (and checked (member verdict '(:yes :always)))
                      (push approval *approved-unsettled*)))))
         (sb-thread:with-mutex (*approval-lock*)
           (setf *approvals* (remove approval *approvals*)))
         ;; Even when nobody was told of it at first: an Emacs that subscribed since may have
         ;; been sent it (SEND-WAITING-APPROVALS). A call the user cancelled there is said to be
         ;; cancelled, not declined in another Emacs; its server is told no, and it does not run.
         ;; A request whose server went away may be interrupted as it wakes: its end is :LOST.
         (when (eq (approval-verdict approval) :lost)
           (setf verdict :lost))
         (tell-emacs :approvals :approval-ended :id id :verdict verdict))
       (list :verdict (case verdict (:cancelled-in-emacs :no) (:lost :cancelled) (t verdict)) :id id)))))

(defun end-approvals-of-connection (connection)
  "For CONNECTION-CLOSED: the approval requests of the agent's server on CONNECTION end in :LOST,
before its worker threads are ended, so that Emacs says the agent's server went away (exited, or
was killed) rather than that the agent withdrew its request."
  (sb-thread:with-mutex (*approval-lock*)
    (dolist (approval *approvals*)
      (when (eq (approval-connection approval) connection)
        (give-verdict approval :lost)))))

(define-entry (settle-approval :caller :server :look t) (id refusal &key session token)
  "The server's check of the approved call of approval ID: REFUSAL, a text that says why it did
not run (its file changed since the user was shown it), or NIL when it runs. The Emacs that
approved it, waiting in ANSWER-APPROVAL, says so."
  (declare (ignore session token))
  (sb-thread:with-mutex (*approval-lock*)
    (let ((approval (find id *approved-unsettled* :key #'approval-id)))
      (when approval
        (setf *approved-unsettled* (remove approval *approved-unsettled*)
              (approval-refusal approval) refusal)
        (sb-thread:signal-semaphore (approval-settled approval)))))
  (list :settled t))

(define-entry (send-waiting-approvals :caller :emacs) (connection channel-id)
  "For Emacs, as it subscribes its channel CHANNEL-ID of CONNECTION to approvals (approval mode
turned on, a new connection): sends down it every approval still waiting, oldest first, so that
calls that waited before are answered there too. Under *APPROVAL-LOCK*, which a request holds as
it stops waiting: its end is told after this, and never before the approval itself. An approval
told again (REQUEST-APPROVAL tells the new channel too) is shown once. True when the channel is
subscribed."
  (let ((feed (find-if (lambda (feed) (and (eq (first feed) connection) (eql (second feed) channel-id)))
                       *emacs-feeds*)))
    (when feed
      (sb-thread:with-mutex (*approval-lock*)
        (dolist (approval (reverse *approvals*))
          (unless (approval-verdict approval)
            (funcall (fourth feed) (approval-message approval)))))
      t)))

(defun approvals-watched-p ()
  "True while an Emacs whose connection is open is subscribed to approvals."
  (some (lambda (feed)
          (and (eq (third feed) :approvals)
               (fifth feed)
               (ignore-errors (funcall (fifth feed)))))
        *emacs-feeds*))

(define-entry (refuse-unwatched-approvals :caller :emacs) ()
  "For Emacs, once it has dropped its approval subscription (approval mode turned off): when no
other Emacs is in approval mode here, every approval waiting ends at once in :TURNED-OFF, and its
agent is told why, rather than waiting for an answer nobody can give until --confirm-timeout.
Returns how many ended, or :WATCHED when another Emacs watches them and they wait on for it."
  (sb-thread:with-mutex (*approval-lock*)
    (if (approvals-watched-p)
        :watched
        (count-if (lambda (approval) (give-verdict approval :turned-off)) *approvals*))))

(define-entry (answer-approval :caller :emacs) (id verdict)
  "The user's answer (:YES, :NO or :ALWAYS) to approval ID: :TAKEN when the request still waited
and gets it, :ENDED when it had already ended (timed out, cancelled), so that nothing runs, or
(:REFUSED why) when it was approved but the server refused to run it, WHY saying what changed
since the user was shown it. An approval the server checks is answered once it has."
  (unless (member verdict '(:yes :no :always))
    (error "An approval is answered :YES, :NO or :ALWAYS, not ~S." verdict))
  (let ((taken (sb-thread:with-mutex (*approval-lock*)
                 (let ((approval (find id *approvals* :key #'approval-id)))
                   (and approval (give-verdict approval verdict) approval)))))
    (cond ((null taken) :ended)
          ((and (approval-checked taken) (member verdict '(:yes :always))
                (sb-thread:wait-on-semaphore (approval-settled taken) :timeout *settle-timeout*)
                (approval-refusal taken))
           (list :refused (approval-refusal taken)))
          (t :taken))))

(defun give-verdict (approval verdict)
  "Answers APPROVAL with VERDICT unless it has an answer; true when it took this one. Called with
*APPROVAL-LOCK* held."
  (unless (approval-verdict approval)
    (setf (approval-verdict approval) verdict)
    (sb-thread:signal-semaphore (approval-answered approval))
    t))

;;; ------------------------------------------------------------------------------------------
;;; Tools allowed for a session
;;;
;;; The user's "allow for the session" answer in Emacs is kept here, in the agent's SESSION, where
;;; Emacs can take it back (swank-mcp-revoke-session-allowances): the agent's server asks before
;;; it skips an approval.

(define-entry (allow-for-session :caller :server :look t) (tool client &key session token)
  "The user allowed TOOL for the rest of SESSION, the session of the agent's client CLIENT."
  (declare (ignore token))
  (let ((session (find-session session)))
    (sb-thread:with-mutex ((session-lock session))
      (unless (find tool (session-allowances session) :key #'second :test #'equal)
        (push (list (sb-ext:atomic-incf (car *allowances-given*)) tool client) (session-allowances session)))))
  (list :allowed t))

(define-entry (session-allowed-p :caller :server :look t) (tool &key session token)
  "Whether TOOL is still allowed for SESSION: (:ALLOWED boolean)."
  (declare (ignore token))
  (list :allowed (and (find tool (session-allowances (find-session session)) :key #'second :test #'equal) t)))

(define-entry (revoke-session-allowances :caller :emacs) ()
  "For Emacs: every tool allowed for a session needs the user's approval again. Returns what was
allowed, each (tool client), oldest first."
  (let ((allowances '()))
    (sb-ext:with-locked-hash-table (*sessions*)
      (loop for session being the hash-values of *sessions*
            do (sb-thread:with-mutex ((session-lock session))
                 (setf allowances (append (session-allowances session) allowances)
                       (session-allowances session) '()))))
    (mapcar #'rest (sort allowances #'< :key #'first))))
