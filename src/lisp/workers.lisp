;;;; Worker threads: a few threads per connection that serve the client's requests one after
;;;; another, as swank's REPL thread serves SLIME's. A request sent with thread T makes the server
;;;; spawn a thread for it, which is most of what a small call costs; one sent to a worker's id
;;;; goes to that thread's mailbox instead. The client lends each worker to one call at a time and
;;;; sends to a new thread when none is idle.
;;;;
;;;; The server's functions are found by name, in the server the request came through (see
;;;; servers.lisp): for a server that lacks one, START-WORKER answers NIL, and the client goes on
;;;; sending each call to a new thread.

(in-package #:mcp-agent-helper)

(defun worker-connections ()
  "(server . connection) of every connection with workers."
  (sb-thread:with-mutex (*workers-lock*)
    (loop for (connection nil server) in *workers*
          collect (cons server connection))))

(defun end-workers (connection)
  "On the server's *CONNECTION-CLOSED-HOOK*: ends CONNECTION's workers, which wait for requests
that can no longer come."
  (end-workers-if (lambda (worker-connection) (eq worker-connection connection))))

(defun end-workers-if (predicate)
  "Ends the worker threads of the connections PREDICATE is true of, but the current thread's.
Returns how many."
  (let ((threads (sb-thread:with-mutex (*workers-lock*)
                   (loop for entry in *workers*
                         when (funcall predicate (first entry)) collect (second entry) into ending
                           else collect entry into staying
                         finally (setf *workers* staying)
                                 (return ending)))))
    (dolist (thread threads)
      (unless (eq thread sb-thread:*current-thread*)
        (ignore-errors (sb-thread:terminate-thread thread))))
    (length threads)))

(defun send-replies-at-once (server)
  "Turns Nagle's algorithm off on the socket of this request's connection. The agent's server
sends the image a note of each call's state beside the call itself (src/mcp/activity.rs), so
two replies often leave back to back; with Nagle the second waited for the client's delayed
acknowledgement of the first, 40 ms, in one call of fifty."
  (let ((stream (current-socket-stream server)))
    (when (typep stream 'sb-sys:fd-stream)
      (sb-alien:with-alien ((on sb-alien:int 1))
        ;; IPPROTO_TCP and TCP_NODELAY are 6 and 1 on Linux, the BSDs and macOS alike.
        (sb-alien:alien-funcall
         (sb-alien:extern-alien "setsockopt" (function sb-alien:int sb-alien:int sb-alien:int sb-alien:int
                                                       (* sb-alien:int) sb-alien:unsigned-int))
         (sb-sys:fd-stream-fd stream) 6 1 (sb-alien:addr on) 4)))))

(define-entry (start-worker :caller :server) ()
  "Starts a worker thread for the connection of this request. Returns the id the server knows it
by, which the client sends requests to in place of T, or NIL when the server lacks what a worker
needs (the client then goes on spawning a thread per call)."
  (multiple-value-bind (server connection) (current-server)
    (destructuring-bind (&key handle-requests thread-id closed-hook bindings)
        (and server (server-worker-parts server))
      ;; Without the hook, nothing would end the workers of a closed connection.
      (unless (and handle-requests closed-hook (boundp closed-hook)
                   (member 'connection-closed (symbol-value closed-hook)))
        (return-from start-worker nil))
      (send-replies-at-once server)
      (let* ((running (sb-thread:make-semaphore :name "swank-mcp worker running"))
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
                               (progv (mapcar #'car bindings) (mapcar #'cdr bindings)
                                 (funcall handle-requests connection)))
                          (sb-thread:with-mutex (*workers-lock*)
                            (setf *workers* (remove sb-thread:*current-thread* *workers* :key #'second)))
                          (forget-thread-id server sb-thread:*current-thread*)))
                      :name "swank-mcp worker")))
        (sb-thread:with-mutex (*workers-lock*)
          (push (list connection thread server) *workers*))
        (and (sb-thread:wait-on-semaphore running :timeout 5)
             id)))))
