;;;; The image's own threads (the person's: started at init, by a library, from their REPL), which
;;;; swank-mcp must never take, and which the agent may still debug as a SLIME user does.
;;;;
;;;; Where such a thread's debugger goes. No connection serves it, so the server sends it to its
;;;; DEFAULT-CONNECTION, which swank and slynk define as the newest one: swank-mcp's, since it
;;;; attaches after the person's Emacs. PERSON-FIRST-CONNECTION answers the newest connection that
;;;; is not a swank-mcp server's instead, so the person's SLDB shows the error; only with no other
;;;; connection does it stay swank-mcp's, whose server then leaves the thread waiting there. Either
;;;; way every agent session's next reply says that the thread stopped (NOTE-IMAGE-THREAD-STOP).
;;;;
;;;; Acting on a thread that waits in a debugger. Such a thread reads requests from its own mailbox
;;;; whichever connection sent them, so the agent's server sends its debugger requests to the
;;;; thread's id as Emacs does, through ATTACHED. The reply goes to the connection the thread's
;;;; debugger belongs to; ROUTE-ATTACHED-REPLY, around the server's DISPATCH-EVENT, hands it to the
;;;; agent's connection that asked, so the person's Emacs never sees a reply it did not ask for. A restart
;;;; the agent invokes unwinds the thread's debugger as the person's own choice would: their SLDB
;;;; closes (:debug-return) and their connection stays as it was. The person's activity buffer
;;;; says which thread an agent attached to, and the condition it stopped with (NOTE-EVENT).

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Which connections are swank-mcp's

(defun agent-connection-p (connection)
  "True for a connection of a swank-mcp server: one with this helper's workers or sessions."
  (or (find connection (worker-connections) :key #'cdr)
      (sb-ext:with-locked-hash-table (*sessions*)
        (loop for session being the hash-values of *sessions*
              thereis (eq (session-connection session) connection)))))

(defun agent-connections ()
  "The connections of the swank-mcp servers attached to the image."
  (remove-duplicates
   (append (mapcar #'cdr (worker-connections))
           (sb-ext:with-locked-hash-table (*sessions*)
             (loop for session being the hash-values of *sessions*
                   when (session-connection session) collect it)))))

(defun close-connection-socket (connection)
  "Closes CONNECTION's socket without a last flush, which a client gone may never read."
  (ignore-errors
   (let ((stream (connection-socket-stream connection)))
     (when (streamp stream)
       (close stream :abort t)))))

(defun close-agent-connection (connection)
  "Closes CONNECTION, a swank-mcp server's, as its server closes a connection whose client went
away (its CLOSE-CONNECTION%: its threads stop, it leaves the server's list); the swank-mcp server
connects again at its next call."
  (ignore-errors
   (close-connection-socket connection)
   (close-server-connection connection)))

(defun person-connection (package)
  "The newest connection of the server of PACKAGE that is not a swank-mcp server's, or NIL."
  (ignore-errors (find-if-not #'agent-connection-p (server-connections package))))

(defvar *person-connections-only* nil
  "True while a server chooses where the image's global output goes after a connection closed
(REDIRECT-TO-PEOPLE-ONLY): DEFAULT-CONNECTION then answers no swank-mcp connection.")

(defun person-first-connection (package default-connection)
  "The person's connection of the server of PACKAGE (see PERSON-CONNECTION), or what the server's
own DEFAULT-CONNECTION answers when there is none (but while *PERSON-CONNECTIONS-ONLY*)."
  (or (person-connection package)
      (and (not *person-connections-only*) (funcall default-connection))))

(defun redirect-to-people-only (update-redirection closed-connection)
  "Wraps the servers' UPDATE-REDIRECTION-AFTER-CLOSE, which runs when a connection closes and, when
the image's global output went to it (the person's Emacs started the Lisp), sends that output to
the DEFAULT-CONNECTION, or back to the real streams when there is none. A swank-mcp connection has
no REPL streams, so the server would set *STANDARD-OUTPUT*, *TERMINAL-IO* and the rest to NIL:
the next thread to print (the person's worker, a thread in SLDB) errs, its report errs again, and
SBCL halts into LDB with the whole image. Here the output goes to another person's connection, or
back to the real streams, as it does in an image swank-mcp never attached to."
  (let ((*person-connections-only* t))
    (funcall update-redirection closed-connection)))

;;; ------------------------------------------------------------------------------------------
;;; Telling the agents that a thread of the image stopped

(defun note-image-thread-stop (invoke-debugger condition)
  "Wraps the server's entry into its debugger (swank's INVOKE-SLIME-DEBUGGER, slynk's
INVOKE-SLY-DEBUGGER). For a thread no connection serves, every agent session's next reply says
that it stopped, where it waits and how to attach; then the server's debugger runs as ever."
  (unless (or (server-connection) *agent-session*)
    (ignore-errors
     (let ((waits (if (some #'person-connection (server-packages))
                      "in the person's Emacs debugger"
                      "in no one's debugger (no Emacs is connected)"))
           (backtrace (ignore-errors (backtrace-lines condition))))
       (sb-ext:with-locked-hash-table (*sessions*)
         (loop for session being the hash-values of *sessions*
               do (record-background-error (session-background session) condition backtrace :waits waits))))))
  (funcall invoke-debugger condition))

;;; ------------------------------------------------------------------------------------------
;;; Acting on a thread that waits in a server's debugger

(defun attached-request-target (connection event)
  "For an :EMACS-REX EVENT from CONNECTION to an existing thread: the key (thread . id) of its
reply, and who waits for it (the agent's CONNECTION for an ATTACHED request, :OTHER for anyone
else's). NIL for every other event."
  (when (and (consp event) (eq (first event) :emacs-rex))
    (destructuring-bind (&optional form package thread id &rest options) (rest event)
      (declare (ignore package options))
      (when (integerp thread)
        (let* ((server (connection-server connection))
               (target (and server (server-thread server thread))))
          (when target
            (values (cons target id)
                    (if (and (consp form) (eq (first form) 'attached)) connection :other))))))))

(defun route-attached-reply (connection event)
  "Hands the reply EVENT of an ATTACHED request, which the thread sends to the connection its
debugger belongs to (CONNECTION), to the agent's connection that asked. Replies to a thread's
requests come in the order the requests reached it, so the oldest sender of that (thread . id)
is the one this reply is for: the person's Emacs and the agent may both have a request of one id
waiting there. True when the event was handed on."
  (when (and (consp event) (eq (first event) :return) (integerp (car (last event)))
             (plusp (hash-table-count *attached-routes*)))
    (let* ((key (cons (second event) (car (last event))))
           (origin (sb-ext:with-locked-hash-table (*attached-routes*)
                     (let ((waiting (gethash key *attached-routes*)))
                       (if (rest waiting)
                           (setf (gethash key *attached-routes*) (rest waiting))
                           (remhash key *attached-routes*))
                       (first waiting)))))
      (when (and origin (not (eq origin :other)) (not (eq origin connection)))
        (send-to-connection origin event)))))

(defun dispatch-through-routes (dispatch-event connection event)
  "Wraps the server's DISPATCH-EVENT, which a connection's control thread calls on each event:
the replies of ATTACHED requests go to the agent that asked (ROUTE-ATTACHED-REPLY), everything
else as ever. A request to an existing thread is noted, and handed to the thread, under one lock:
the order of the notes is the order the thread reads them in (the person's requests are noted
too, since their ids and the agent's meet). Runs on every event of every
connection, so it is quick and never fails. (Swank runs an event hook there too; slynk has
none.)"
  (multiple-value-bind (key origin) (ignore-errors (attached-request-target connection event))
    (cond (key
           (sb-ext:with-locked-hash-table (*attached-routes*)
             ;; A request whose thread died unanswered would stay: those go now and then.
             (when (> (hash-table-count *attached-routes*) 1000)
               (maphash (lambda (key origins)
                          (declare (ignore origins))
                          (unless (sb-thread:thread-alive-p (car key))
                            (remhash key *attached-routes*)))
                        *attached-routes*))
             (setf (gethash key *attached-routes*)
                   (append (gethash key *attached-routes*) (list origin)))
             (funcall dispatch-event connection event)))
          ((ignore-errors (route-attached-reply connection event)))
          (t (funcall dispatch-event connection event)))))

(defun server-debugger-state ()
  "A PARKED made of the server's debugger this thread waits in, or NIL when it waits in none."
  (destructuring-bind (&key level condition restarts &allow-other-keys) (thread-debugger)
    (and level
         (new 'parked :condition condition
                      :restarts restarts
                      :package *package*
                      :stdout nil
                      :stderr nil
                      :image-thread t))))

(define-entry (attached :caller :server) (version name session token allow-exit stop &rest arguments)
  "CALL for a thread that waits in a server's debugger on its own (a thread of the image's, in the
person's SLDB or in none): the debugger entry NAME applied to ARGUMENTS inside that debugger, as
one of swank-mcp's own parked evaluations would run it (see debugger.lisp), when the thread waits
in the stop numbered STOP. NAME must be an entry defined :ATTACHED (see DEFINE-ENTRY). A request
the thread reads at another stop (it was sent while the thread ran, and waited in its mailbox)
acts on nothing. The agent's code an :AGENT-CODE entry evaluates is SESSION's
(RUN-AS-AGENT-CODE)."
  (let* ((entry (find-symbol (string-upcase name) '#:mcp-agent-helper))
         (attached (and entry (get entry 'attached))))
    (cond ((not (equal version *version*)) :other-helper)
          ((not attached)
           (list :failure (format nil "~A is not a debugger action." name)))
          (t (let ((*parked* (or *parked* (server-debugger-state)))
                   (current (current-stop)))
               (cond ((null *parked*)
                      (list :failure "This thread no longer waits in a debugger."))
                     ((not (eql stop current))
                      (list :failure (format nil "The stop this action was for is gone: the thread left it~@[, and now ~
                                                  waits in stop ~D~]. Nothing was done; attach to it again."
                                             current)))
                     ((eq attached :agent-code)
                      (run-as-agent-code session token allow-exit (lambda () (apply entry arguments))))
                     (t (apply entry arguments))))))))

(defun run-as-agent-code (session token allow-exit function)
  "Calls FUNCTION, which evaluates the agent's code in a thread that is not the agent's, as that
code runs anywhere else: as SESSION's (an exit refused unless ALLOW-EXIT, what it defines in the
undo journal), under TOKEN, so that the server's timeout or cancellation interrupts it. An
interruption unwinds the agent's code only: the thread goes on waiting in its debugger, and the
answer is a failure saying so. The thread keeps its name: it is the person's."
  (let ((outcome (call-registered token
                                  (lambda (evaluation)
                                    (declare (ignore evaluation))
                                    (let ((*agent-session* (gethash session *sessions*))
                                          (*exit-allowed* allow-exit))
                                      (funcall function)))
                                  :rename nil)))
    (if (and (consp outcome) (eq (first outcome) :kind))
        (list :failure (format nil "~A The thread still waits in its debugger, where it was." (getf outcome :message)))
        outcome)))

(defun stop-number (condition)
  "The number of the stop CONDITION made, given at its first asking: under the table's lock, so
that two threads asking at once get the one number."
  (sb-ext:with-locked-hash-table (*stop-numbers*)
    (or (gethash condition *stop-numbers*)
        (setf (gethash condition *stop-numbers*) (1+ (sb-ext:atomic-incf (car *stop-counter*)))))))

(defun current-stop ()
  "The number of the stop this thread waits in, from the server's debugger's condition, or NIL."
  (thread-stop sb-thread:*current-thread*))

(define-entry (attach-thread :caller :server) (designator &key quietly session token)
  "The thread DESIGNATOR (the threads tool's number or a name), when it waits in a server's debugger:
(:THREAD server-id :NUMBER n :NAME name :LEVEL level :STOP n :WHERE text), and the person's activity
record says an agent attached to it, unless QUIETLY (the agent only checks where it waits). Fails,
saying why, otherwise."
  (declare (ignore session))
  (run-tool
   token
   (lambda ()
     (let* ((thread (find-thread designator))
            (debugger (thread-debugger thread))
            (level (getf debugger :level))
            (server (current-server))
            (id-of (and server (server-thread-id-function server))))
       (cond ((sb-thread:symbol-value-in-thread '*parked* thread nil)
              (fail "Thread ~A ~S is an evaluation of swank-mcp's waiting in its debugger: act on it with the ~
                     session its evaluation returned (lisp-status lists the sessions)."
                    (thread-number thread) (sb-thread:thread-name thread)))
             ((null level)
              (fail "Thread ~A ~S does not wait in a debugger~@[ (it ~A)~]. A thread is attached to when it stops in ~
                     one: on an error, a BREAK, or a breakpoint."
                    (thread-number thread) (sb-thread:thread-name thread) (ignore-errors (waiting-text thread))))
             ((null id-of)
              (fail "The server has no THREAD-ID, which attaching needs."))
             (t
              (let* ((connection (thread-connection server thread))
                     (condition (getf debugger :condition))
                     ;; BREAKPOINT-HIT by name: breakpoints.lisp, which defines it, loads after this.
                     (where (cond ((null connection) "a debugger no connection serves")
                                  ((eq (type-of condition) 'breakpoint-hit)
                                   "swank-mcp's connection, at an agent's breakpoint")
                                  ((agent-connection-p connection) "swank-mcp's connection, as no Emacs is connected")
                                  (t "the person's Emacs debugger"))))
                ;; The person is told in their activity buffer: the agent may act on their SLDB's thread.
                (unless quietly
                  (note-event :attached "An agent attached to thread ~D ~S, which waits in ~A~@[ with ~A~]."
                            (thread-number thread) (safe-princ (sb-thread:thread-name thread)) where
                            (and (typep condition 'condition)
                                 (format nil "~A: ~A" (type-of condition) (one-line (condition-message condition) 300)))))
                (list :thread (funcall id-of thread)
                      :number (thread-number thread)
                      :name (safe-princ (sb-thread:thread-name thread))
                      :level level
                      :stop (stop-number condition)
                      :where where))))))))

(defun thread-stop (thread)
  "The number of the stop THREAD waits in, in a server's debugger, or NIL while it waits in none."
  (let ((condition (getf (thread-debugger thread) :condition)))
    (and (typep condition 'condition) (stop-number condition))))

(define-entry (waiting-stops :caller :server :look t) (&key session token)
  "The numbers of the stops the image's threads wait in, in a server's debugger, now: a debugger
session of the agent's whose stop is not among them has ended."
  (declare (ignore session))
  (run-tool token
            (lambda ()
              (list :stops (loop for thread in (sb-thread:list-all-threads)
                                 for stop = (ignore-errors (thread-stop thread))
                                 when stop collect stop)))))

(define-entry (await-thread-stop :caller :server) (designator left milliseconds &key session token)
  "What became of the thread DESIGNATOR that an agent's action moved on from stop LEFT, within
MILLISECONDS: (:STOPPED n :ENDED NIL) as soon as it waits in a debugger at another stop N (a step,
a breakpoint, an error), (:STOPPED NIL :ENDED T) as soon as it has ended (an ABORT of a thread
ends it), or (:STOPPED NIL :ENDED NIL) when it still ran at the end."
  (declare (ignore session))
  (run-tool
   token
   (lambda ()
     (let ((thread (handler-case (find-thread designator)
                     (tool-failure () nil)))
           (deadline (+ (get-internal-real-time)
                        (* milliseconds (/ internal-time-units-per-second 1000)))))
       (loop
         (cond ((or (null thread) (not (sb-thread:thread-alive-p thread)))
                (return (list :stopped nil :ended t)))
               ((let ((stop (ignore-errors (thread-stop thread))))
                  (and stop (/= stop left)
                       (return (list :stopped stop :ended nil)))))
               ((>= (get-internal-real-time) deadline)
                (return (list :stopped nil :ended nil))))
         ;; A thread's stop and end have no hook to wait on; a short sleep stands for one.
         (sleep 0.01))))))

;;; ------------------------------------------------------------------------------------------
;;; Closing a connection whose client went away

(defun close-connection-quietly (close-connection connection &rest arguments)
  "Wraps the server's CLOSE-CONNECTION%, which its sentinel thread runs when a client went away:
the connection's socket is first closed with :ABORT T, dropping what can no longer be sent. The
server's own CLOSE flushes it, and for a client killed with a reply unread that fails (a broken
pipe) in the sentinel thread, which then waits in a debugger for good: every later connection
leaks two threads, and with nobody's Emacs connected the agents are told of it at every call.
The server's CLOSE of a closed stream then does nothing."
  (close-connection-socket connection)
  (apply close-connection connection arguments))
