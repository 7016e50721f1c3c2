;;;; Worker threads: a few threads per connection that serve the client's requests one after
;;;; another, as swank's REPL thread serves SLIME's. A request sent with thread T makes the server
;;;; spawn a thread for it, which is most of what a small call costs; one sent to a worker's id
;;;; goes to that thread's mailbox instead. The client lends each worker to one call at a time and
;;;; sends to a new thread when none is idle.
;;;;
;;;; The server's functions are found by name, in SWANK or SLYNK: for a server that lacks one,
;;;; START-WORKER answers NIL, and the client goes on sending each call to a new thread.

(in-package #:mcp-agent-helper)

(defvar *workers-lock* (sb-thread:make-mutex :name "swank-mcp workers"))

(defvar *workers* '()
  "(connection . thread) for every worker thread alive.")

(defun server-function (package name)
  (let ((symbol (find-symbol name package)))
    (and symbol (fboundp symbol) (fdefinition symbol))))

(defun forget-thread-id (thread)
  "Removes THREAD from the server backend's id table, so that a request still sent to its id is
answered \"thread not found\" (and the client sends it to a new thread) rather than queued for a
thread that will never read it."
  (loop for package-name in '("SWANK/SBCL" "SLYNK-SBCL")
        for package = (find-package package-name)
        for table = (and package (find-symbol "*THREAD-ID-MAP*" package))
        for lock = (and package (find-symbol "*THREAD-ID-MAP-LOCK*" package))
        when (and table lock (boundp table) (boundp lock)
                  (hash-table-p (symbol-value table)) (typep (symbol-value lock) 'sb-thread:mutex))
          do (sb-thread:with-mutex ((symbol-value lock))
               (let ((map (symbol-value table)))
                 (loop for id being the hash-keys of map using (hash-value pointer)
                       when (eq thread (ignore-errors (sb-ext:weak-pointer-value pointer)))
                         do (remhash id map))))))

(defun end-workers (connection)
  "On the server's *CONNECTION-CLOSED-HOOK*: ends CONNECTION's workers, which wait for requests
that can no longer come."
  (let ((threads (sb-thread:with-mutex (*workers-lock*)
                   (loop for entry in *workers*
                         when (eq (car entry) connection) collect (cdr entry) into ending
                           else collect entry into staying
                         finally (setf *workers* staying)
                                 (return ending)))))
    (dolist (thread threads)
      (ignore-errors (sb-thread:terminate-thread thread)))))

(add-connection-closed-hook 'end-workers)

(defun send-replies-at-once (server)
  "Turns Nagle's algorithm off on the socket of this request's connection. The agent's server
sends the image a note of each call's state beside the call itself (src/mcp/activity.rs), so
two replies often leave back to back; with Nagle the second waited for the client's delayed
acknowledgement of the first, 40 ms, in one call of fifty."
  (let* ((socket-io (server-function server "CURRENT-SOCKET-IO"))
         (stream (and socket-io (ignore-errors (funcall socket-io)))))
    (when (typep stream 'sb-sys:fd-stream)
      (sb-alien:with-alien ((on sb-alien:int 1))
        ;; IPPROTO_TCP and TCP_NODELAY are 6 and 1 on Linux, the BSDs and macOS alike.
        (sb-alien:alien-funcall
         (sb-alien:extern-alien "setsockopt" (function sb-alien:int sb-alien:int sb-alien:int sb-alien:int
                                                       (* sb-alien:int) sb-alien:unsigned-int))
         (sb-sys:fd-stream-fd stream) 6 1 (sb-alien:addr on) 4)))))

(defun start-worker ()
  "Starts a worker thread for the connection of this request. Returns the id the server knows it
by, which the client sends requests to in place of T, or NIL when the server lacks what a worker
needs (the client then goes on spawning a thread per call)."
  (multiple-value-bind (server connection) (current-server)
    (let ((handle-requests (and server (server-function server "HANDLE-REQUESTS")))
          (thread-id (and server (server-function server "THREAD-ID")))
          (closed-hook (and server (find-symbol "*CONNECTION-CLOSED-HOOK*" server)))
          (bindings (and server (find-symbol "*DEFAULT-WORKER-THREAD-BINDINGS*" server)))
          (indentation (and server (find-symbol "*CONFIGURE-EMACS-INDENTATION*" server))))
      ;; Without the hook, nothing would end the workers of a closed connection.
      (unless (and handle-requests thread-id closed-hook (boundp closed-hook)
                   (member 'end-workers (symbol-value closed-hook)))
        (return-from start-worker nil))
      (send-replies-at-once server)
      (let* ((worker-bindings
               (append (and bindings (boundp bindings) (symbol-value bindings))
                       ;; After each request the server scans the symbols of its package (some
                       ;; 3,000 through CL-USER's uses), and all of them whenever a package was
                       ;; made, to tell Emacs how to indent them; no client of ours indents.
                       (and indentation (list (cons indentation nil)))))
             (running (sb-thread:make-semaphore :name "swank-mcp worker running"))
             (id nil)
             (thread (sb-thread:make-thread
                      (lambda ()
                        (unwind-protect
                             (progn
                               ;; Asked by the thread itself: where the server numbers threads by
                               ;; their OS thread id (SLIME 2.28+), a thread has none until it runs.
                               (setf id (funcall thread-id sb-thread:*current-thread*))
                               (sb-thread:signal-semaphore running)
                               ;; As the server binds them for a thread it spawns for a request.
                               (progv (mapcar #'car worker-bindings) (mapcar #'cdr worker-bindings)
                                 (funcall handle-requests connection)))
                          (sb-thread:with-mutex (*workers-lock*)
                            (setf *workers* (remove sb-thread:*current-thread* *workers* :key #'cdr)))
                          (forget-thread-id sb-thread:*current-thread*)))
                      :name "swank-mcp worker")))
        (sb-thread:with-mutex (*workers-lock*)
          (push (cons connection thread) *workers*))
        (and (sb-thread:wait-on-semaphore running :timeout 5)
             id)))))

(defun send-counter-symbol ()
  (dolist (name '("SWANK" "SLYNK"))
    (let ((symbol (and (find-package name) (find-symbol "*SEND-COUNTER*" name))))
      (when symbol (return symbol)))))

(defun reset-send-counter ()
  "Starts this call's count of messages afresh. The server makes a thread that sent 100 messages
wait for a ping's answer; a worker serves one call after another, and only a call's own messages
should count, as they do in a thread spawned for it."
  (let ((symbol (load-time-value (send-counter-symbol))))
    (when (and symbol (boundp symbol))
      (setf (symbol-value symbol) 0))))

;;; Connections the server could not close

(defun server-reader-thread-accessor ()
  "The server's reader of a connection's reader thread, or NIL."
  (loop for package-name in '("SWANK" "SLYNK")
        for package = (find-package package-name)
        for function = (and package (server-function package "MCONN.READER-THREAD"))
        when function return function))

(defun connection-serving-p (connection)
  "False once the server's reader thread of CONNECTION has ended; true for a connection the
server serves without one."
  ;; Looked up once, when the helper loads: this runs after every call.
  (let* ((accessor (load-time-value (server-reader-thread-accessor)))
         (reader (and accessor (ignore-errors (funcall accessor connection)))))
    (or (not (typep reader 'sb-thread:thread))
        (sb-thread:thread-alive-p reader))))

(defun close-dead-connections ()
  "Calls this helper's connection-closed hooks for connections whose reader thread has ended:
swank 2.27 stops closing a connection when closing its socket fails, which it does when the
client went away (killed, say) while a reply was still buffered, and then runs none of the hooks;
the sessions' handles and the connections' workers would otherwise stay as long as the image runs."
  (let ((connections '()))
    (sb-ext:with-locked-hash-table (*session-handles*)
      (maphash (lambda (session table)
                 (declare (ignore session))
                 (pushnew (handle-table-connection table) connections))
               *session-handles*))
    (sb-thread:with-mutex (*workers-lock*)
      (dolist (entry *workers*)
        (pushnew (car entry) connections)))
    (dolist (connection connections)
      (unless (or (null connection) (connection-serving-p connection))
        (dolist (function *connection-closed-functions*)
          (funcall function connection))))))
