;;;; Sessions: everything the helper keeps in the image for one client (one swank-mcp server's
;;;; session, named by it), in one SESSION object: its REPL state, apart from the user's own REPL,
;;;; its handles, its traces, its agent threads' output and errors, its running load-system and
;;;; run-tests, the tools the user allowed it in Emacs. The session is made under a lock at its
;;;; first call, and when it ends (END-SESSION, which its server calls when it exits, or the
;;;; server's connection-closed hook, when its client went away) all of it is released at once.

(in-package #:mcp-agent-helper)

(defparameter *history-variables* '(* ** *** + ++ +++ / // /// -)
  "The REPL variables a session keeps for itself, so that the agent's * is not the user's *.")

(defclass session ()
  ((name :initarg :name :reader session-name)
   (lock :initform (sb-thread:make-mutex :name "mcp-agent-helper session") :reader session-lock
         :documentation "Held while its traces, background or allowances change.")
   (package-name :initform "COMMON-LISP-USER" :accessor session-package-name)
   ;; Concurrent calls of one session each work on their own bindings; the last to finish
   ;; writes its history back, as two REPL listeners sharing globals would.
   (history :initform (mapcar (constantly nil) *history-variables*) :accessor session-history)
   (server :initform nil :accessor session-server
           :documentation "The SERVER (servers.lisp) of the connection it last called through.")
   (connection :initform nil :accessor session-connection
               :documentation "That connection: when it closes, the session ends.")
   (handles :initform (new 'handle-table) :accessor session-handle-table
            :documentation "Its HANDLE-TABLE (handles.lisp); NIL once it ended.")
   (traces :initform '() :accessor session-traces
           :documentation "The trace specifications it traces (trace.lisp).")
   (background :initform nil :accessor session-background-slot
               :documentation "Its BACKGROUND (agent-threads.lisp), made when its agent first starts something.")
   (loading-thread :initform nil :accessor session-loading-thread
                   :documentation "The thread of its running load-system, for LOAD-ACTIVITY.")
   (test-run :initform nil :accessor session-test-run
             :documentation "The TEST-COLLECTION of its running run-tests, for TEST-ACTIVITY.")
   (allowances :initform '() :accessor session-allowances
               :documentation "The tools the user allowed it in Emacs, each (number tool client).")
   (ended :initform nil :accessor session-ended-p)))

(defun find-session (name)
  "The SESSION named NAME, made at its first call. Notes the connection the current request came
through, whose closing ends the session."
  (let ((session (or (gethash name *sessions*)
                     ;; Two first calls may come at once: both must get the one session.
                     (sb-ext:with-locked-hash-table (*sessions*)
                       (or (gethash name *sessions*)
                           (setf (gethash name *sessions*) (new 'session :name name)))))))
    (multiple-value-bind (server connection) (current-server)
      (when connection
        (setf (session-server session) server
              (session-connection session) connection)))
    session))

(defun session-count ()
  (hash-table-count *sessions*))

(defun release-session (session)
  "Releases everything SESSION holds in the image: what it traces is untraced (unless another
session traces it too), its breakpoints are removed, its handles (and the objects they kept) and allowances go, and its agent
threads are no longer known as its. A thread of its agent still running writes into its background
buffer, which nobody reads any more."
  (setf (session-ended-p session) t)
  (untrace-session session)
  (forget-session-breakpoints session)
  (sb-thread:with-mutex ((session-lock session))
    (setf (session-handle-table session) nil
          (session-allowances session) '()))
  (forget-agent-threads session))

(defun end-sessions (predicate)
  "Ends the sessions PREDICATE is true of. Returns how many."
  (let ((ending '()))
    (sb-ext:with-locked-hash-table (*sessions*)
      (maphash (lambda (name session)
                 (when (funcall predicate session)
                   (push session ending)
                   (remhash name *sessions*)))
               *sessions*))
    (mapc #'release-session ending)
    (length ending)))

(define-entry (end-session :caller :server :look t) (&key session token)
  "Ends SESSION (its name), for its server that exits: everything it held in the image is released
(see RELEASE-SESSION). With an uninstall asked for once the sessions end (UNINSTALL), this one
being the last, the helper is uninstalled."
  (declare (ignore token))
  (end-sessions (lambda (each) (equal (session-name each) session)))
  (uninstall-if-pending)
  (list :ended t))

(defun connection-closed (connection)
  "On each server's connection-closed hook (see footprint.lisp): a connection's client has gone,
and with it the sessions that called through it, its worker threads and its calls in the activity
record. Never signals: it runs inside the server's closing of the connection."
  ;; First: ending the sessions and the workers interrupts the requests, which would end as if
  ;; their agents had withdrawn them.
  (ignore-errors (end-approvals-of-connection connection))
  (ignore-errors (end-sessions (lambda (session) (eq (session-connection session) connection))))
  (ignore-errors (end-workers connection))
  (ignore-errors (end-calls-of-connection connection))
  (ignore-errors (uninstall-if-pending)))

(defun close-dead-connections ()
  "Runs CONNECTION-CLOSED for the connections whose reader thread has ended: swank 2.27 stops
closing a connection when closing its socket fails, which it does when the client went away
(killed, say) while a reply was still buffered, and then runs none of its hooks; the sessions and
the connections' workers would otherwise stay as long as the image runs."
  (let ((connections '()))
    (flet ((note (server connection)
             (when connection
               (pushnew (cons server connection) connections :key #'cdr))))
      (sb-ext:with-locked-hash-table (*sessions*)
        (maphash (lambda (name session)
                   (declare (ignore name))
                   (note (session-server session) (session-connection session)))
                 *sessions*))
      (loop for (server . connection) in (worker-connections) do (note server connection)))
    (loop for (server . connection) in connections
          unless (connection-serving-p server connection)
            do (connection-closed connection))))

(defun find-package-loosely (name)
  "The package NAME names, written as the user likes: INVENTORY, inventory, :inventory, #:inventory
or \"inventory\" (package names are usually upper case; the prefixes and quotes are how Lisp
code writes a package designator)."
  (let* ((trimmed (string-trim '(#\Space #\Tab #\Newline #\Return) name))
         (bare (cond ((and (> (length trimmed) 2) (string= "#:" trimmed :end2 2)) (subseq trimmed 2))
                     ((and (> (length trimmed) 1) (char= #\: (char trimmed 0))) (subseq trimmed 1))
                     ((and (> (length trimmed) 2) (char= #\" (char trimmed 0))
                           (char= #\" (char trimmed (1- (length trimmed)))))
                      (subseq trimmed 1 (1- (length trimmed))))
                     (t trimmed))))
    (or (find-package name) (find-package bare) (find-package (string-upcase bare)))))

(defun record-history (form values)
  "Updates the REPL variables as the standard REPL does after evaluating FORM."
  (setf +++ ++ ++ + + form
        /// // // / / values
        *** ** ** * * (first values)))
