;;;; The swank or slynk server a request comes through: the one place that knows the two apart.
;;;;
;;;; SLIME's swank and SLY's slynk speak one protocol from packages of different names, with the
;;;; same parts under those names. An image may hold both (SLIME for one Emacs, SLY for another,
;;;; or a library that loads swank into a SLY user's image), and the helper, loaded once, serves
;;;; requests from either. So which server's parts a call uses is decided by the request the
;;;; thread serves (CURRENT-SERVER), never once for the image: a helper loaded through slynk
;;;; must not reset swank's message counter, nor prune swank's mailboxes, nor ask swank whether
;;;; a slynk connection is still read.
;;;;
;;;; The parts are found by name, when the server is first seen: a server that lacks one makes
;;;; the helper do without it (see each use), never fail to load.
;;;;
;;;; This file is the helper's backend, as swank/backend.lisp is swank's: the only one that names
;;;; either server or anything inside it (a package, a symbol found by its name, a variable, a
;;;; function). The other files use the servers through the functions defined here, and
;;;; tests/helper_source.rs fails when one names them itself.

(in-package #:mcp-agent-helper)

(defparameter *server-kinds*
  '((:package "SWANK" :backends ("SWANK/BACKEND" "SWANK-BACKEND") :implementation "SWANK/SBCL"
     :front-end "SLIME" :debugger ("*SLDB-LEVEL*" "*SWANK-DEBUGGER-CONDITION*" "*SLDB-RESTARTS*")
     :steps ("SLDB-STEP" "SLDB-NEXT" "SLDB-OUT"))
    (:package "SLYNK" :backends ("SLYNK-BACKEND") :implementation "SLYNK-SBCL"
     :front-end "SLY" :debugger ("*SLY-DB-LEVEL*" "*SLYNK-DEBUGGER-CONDITION*" "*SLY-DB-RESTARTS*")
     :steps ("SLY-DB-STEP" "SLY-DB-NEXT" "SLY-DB-OUT")))
  "The servers the helper knows: each one's package, its backend's packages (older swank names
it SWANK-BACKEND), the package of its SBCL backend, where its mailboxes and thread ids are, the
Emacs front end it serves, the variables of its debugger (level, condition, restarts) and its
debugger's step commands (into, over, out).")

(defun thread-debugger (&optional (thread sb-thread:*current-thread*))
  "The server's debugger THREAD waits in, as (:LEVEL n :CONDITION c :RESTARTS r :FRONT-END name
:KIND kind), or NIL while it waits in none. Each server's own variables are asked: in an image
with both, a thread in SLY's debugger is in SLY's, whichever server the asking request came
through."
  (loop for kind in *server-kinds*
        for package = (find-package (getf kind :package))
        for (level condition restarts)
          = (and package
                 (mapcar (lambda (name)
                           (let ((symbol (find-symbol name package)))
                             (and symbol (sb-thread:symbol-value-in-thread symbol thread nil))))
                         (getf kind :debugger)))
        when (and (integerp level) (plusp level))
          return (list :level level :condition condition :restarts restarts
                       :front-end (getf kind :front-end) :kind kind)))

(defun server-step-function (server kind)
  "SERVER's debugger command that steps as KIND says (\"into\", \"over\" or \"out\"), or NIL."
  (let* ((names (getf (find (package-name (server-package server)) *server-kinds*
                            :key (lambda (kind) (getf kind :package)) :test #'string=)
                      :steps))
         (name (cond ((string= kind "into") (first names))
                     ((string= kind "over") (second names))
                     ((string= kind "out") (third names)))))
    (and name (server-function server name))))

(defun server-packages ()
  "The packages of the servers loaded in the image."
  (loop for kind in *server-kinds*
        for package = (find-package (getf kind :package))
        when package collect package))

(defclass server ()
  ((package :initarg :package :reader server-package)
   (backend :initarg :backend :reader server-backend
            :documentation "The package of its backend, or NIL.")
   (implementation :initarg :implementation :reader server-implementation
                   :documentation "The package of its SBCL backend, or NIL.")
   ;; Found once, since they are used in every call.
   (connection-variable :initarg :connection-variable :reader server-connection-variable
                        :documentation "*EMACS-CONNECTION*: bound in the threads serving its requests.")
   (send-counter :initarg :send-counter :reader server-send-counter)
   (reader-thread :initarg :reader-thread :reader server-reader-thread
                  :documentation "The function that gives a connection's reader thread, or NIL.")
   (mailboxes :initarg :mailboxes :reader server-mailboxes
              :documentation "(list-variable lock-variable thread-reader queue-reader), or NIL.")))

(defun found-function (symbol)
  (and symbol (fboundp symbol) (fdefinition symbol)))

(defun mailbox-registry (implementation)
  "The symbols of the mailbox list of the SBCL backend IMPLEMENTATION and its lock, and the readers
of a mailbox's thread and queue, or NIL when it has no such list."
  (let ((names (and implementation
                    (mapcar (lambda (name) (find-symbol name implementation))
                            '("*MAILBOXES*" "*MAILBOX-LOCK*" "MAILBOX.THREAD" "MAILBOX.QUEUE")))))
    (and names (every #'identity names)
         (boundp (first names)) (boundp (second names))
         (fboundp (third names)) (fboundp (fourth names))
         names)))

(defun server-symbol (server name &optional (package (server-package server)))
  "The symbol NAME of PACKAGE (by default SERVER's own), or NIL."
  (and package (find-symbol name package)))

(defun server-function (server name &optional (package (server-package server)))
  "The function NAME of SERVER's package (or of PACKAGE), or NIL."
  (found-function (server-symbol server name package)))

(defun make-server (kind)
  "The SERVER of KIND (an entry of *SERVER-KINDS*) when its package exists, else NIL."
  (destructuring-bind (&key package backends implementation &allow-other-keys) kind
    (let ((package (find-package package))
          (implementation (find-package implementation)))
      (and package
           (new 'server :package package
                        :backend (some #'find-package backends)
                        :implementation implementation
                        :connection-variable (find-symbol "*EMACS-CONNECTION*" package)
                        :send-counter (find-symbol "*SEND-COUNTER*" package)
                        :reader-thread (found-function (find-symbol "MCONN.READER-THREAD" package))
                        :mailboxes (mailbox-registry implementation))))))

(defun servers ()
  "The SERVER of each server package in the image. One loaded after the helper is found the first
time it is asked for here, and gets the helper's footprint (see INSTALL-SERVER)."
  (let ((known *servers*))
    ;; Asked several times a call: the lock is taken only when a server package is new.
    (if (notany (lambda (kind)
                  (let ((package (find-package (getf kind :package))))
                    (and package (not (find package known :key #'server-package)))))
                *server-kinds*)
        known
        (let ((new '()))
          (sb-thread:with-mutex (*servers-lock*)
            (dolist (kind *server-kinds*)
              (unless (find (find-package (getf kind :package)) *servers* :key #'server-package)
                (let ((server (make-server kind)))
                  (when server
                    (push server new)
                    (setf *servers* (append *servers* (list server))))))))
          (dolist (server new)
            (install-server server))
          *servers*))))

(defun forget-servers ()
  "Forgets the servers seen, so that each is found again (and gets the footprint) when asked for."
  (sb-thread:with-mutex (*servers-lock*)
    (setf *servers* '())))

(defun current-server ()
  "The SERVER whose request this thread serves, and that request's connection; NIL when the thread
serves none."
  (dolist (server (servers))
    (let ((variable (server-connection-variable server)))
      (when (and variable (boundp variable) (symbol-value variable))
        (return (values server (symbol-value variable)))))))

(defun server-connection ()
  "The connection the current request came through, or NIL."
  (nth-value 1 (current-server)))

(defun server-package-p (package)
  "True for a package of a swank or slynk server (SWANK, SWANK/BACKEND, SLYNK-MREPL...), whose
frames and symbols are never the user's business."
  (let ((name (package-name package)))
    (some (lambda (kind) (eql 0 (search (getf kind :package) name))) *server-kinds*)))

(defun backend-function (name)
  "The function NAME of the backend of the server whose request this thread serves, or a failure
naming what is missing."
  (let* ((server (current-server))
         (function (and server (server-function server name (server-backend server)))))
    (or function
        (fail "The swank or slynk server in this image has no ~A, which the debugger tool needs." name))))

(defun reset-send-counter ()
  "Starts this call's count of messages afresh. The server makes a thread that sent 100 messages
wait for a ping's answer; a worker serves one call after another, and only a call's own messages
should count, as they do in a thread spawned for it."
  (let* ((server (current-server))
         (counter (and server (server-send-counter server))))
    (when (and counter (boundp counter))
      (setf (symbol-value counter) 0))))

(defun forget-finished-threads ()
  "Drops the mailboxes of threads that have finished and have nothing queued from the list of the
server whose request this thread serves.

The SBCL backends of swank and slynk keep a mailbox for every thread that ever exchanged a
message, in one list searched linearly on every message, and never drop one. Each tool call runs
in a worker thread of its own, so an agent's calls would grow that list without bound: after
86,000 calls every request to the image (the user's own SLIME requests too) took 700 us longer
and the dead threads could never be collected. A finished thread's mailbox can never be read
again, so dropping it changes nothing else."
  (let ((server (current-server)))
    (destructuring-bind (&optional list-symbol lock-symbol thread-reader queue-reader)
        (and server (server-mailboxes server))
      (when (and list-symbol (typep (symbol-value lock-symbol) 'sb-thread:mutex))
        (flet ((finished-p (mailbox)
                 (let ((thread (ignore-errors (funcall thread-reader mailbox))))
                   (and (typep thread 'sb-thread:thread)
                        (not (sb-thread:thread-alive-p thread))
                        (null (ignore-errors (funcall queue-reader mailbox)))))))
          (sb-thread:with-mutex ((symbol-value lock-symbol))
            (let ((mailboxes (symbol-value list-symbol)))
              (when (some #'finished-p mailboxes)
                (setf (symbol-value list-symbol) (remove-if #'finished-p mailboxes))))))))))

(defun forget-thread-id (server thread)
  "Removes THREAD from SERVER's table of thread ids, so that a request still sent to its id is
answered \"thread not found\" (and the client sends it to a new thread) rather than queued for a
thread that will never read it."
  (let* ((implementation (server-implementation server))
         (table (server-symbol server "*THREAD-ID-MAP*" implementation))
         (lock (server-symbol server "*THREAD-ID-MAP-LOCK*" implementation)))
    (when (and table lock (boundp table) (boundp lock)
               (hash-table-p (symbol-value table)) (typep (symbol-value lock) 'sb-thread:mutex))
      (sb-thread:with-mutex ((symbol-value lock))
        (let ((map (symbol-value table)))
          (loop for id being the hash-keys of map using (hash-value pointer)
                when (eq thread (ignore-errors (sb-ext:weak-pointer-value pointer)))
                  do (remhash id map)))))))

(defun connection-serving-p (server connection)
  "False once SERVER's reader thread of CONNECTION has ended; true for a connection it serves
without one."
  (let* ((accessor (server-reader-thread server))
         (reader (and accessor (ignore-errors (funcall accessor connection)))))
    (or (not (typep reader 'sb-thread:thread))
        (sb-thread:thread-alive-p reader))))

(defun server-features ()
  "The features the servers the helper knows push when they load, worth naming in a status line."
  (loop for kind in *server-kinds*
        collect (intern (getf kind :package) :keyword)))

;;; ------------------------------------------------------------------------------------------
;;; The servers' parts in the footprint (footprint.lisp puts them in and takes them out)

(defparameter *server-encapsulations*
  '((("SWANK" "DEFAULT-CONNECTION") mcp-agent-person-first swank-person-first)
    (("SLYNK" "DEFAULT-CONNECTION") mcp-agent-person-first slynk-person-first)
    (("SWANK" "INVOKE-SLIME-DEBUGGER") mcp-agent-stop-notice note-image-thread-stop)
    (("SLYNK" "INVOKE-SLY-DEBUGGER") mcp-agent-stop-notice note-image-thread-stop)
    (("SWANK" "DISPATCH-EVENT") mcp-agent-attached-replies dispatch-through-routes)
    (("SLYNK" "DISPATCH-EVENT") mcp-agent-attached-replies dispatch-through-routes)
    (("SWANK" "CLOSE-CONNECTION%") mcp-agent-quiet-close close-connection-quietly)
    (("SLYNK" "CLOSE-CONNECTION%") mcp-agent-quiet-close close-connection-quietly)
    (("SWANK-REPL" "UPDATE-REDIRECTION-AFTER-CLOSE") mcp-agent-people-only redirect-to-people-only)
    (("SWANK" "UPDATE-REDIRECTION-AFTER-CLOSE") mcp-agent-people-only redirect-to-people-only)
    (("SLYNK" "UPDATE-REDIRECTION-AFTER-CLOSE") mcp-agent-people-only redirect-to-people-only))
  "The servers' functions the helper encapsulates, each ((package name) tag wrapper), as
footprint.lisp's *ENCAPSULATIONS* lists SBCL's (see there).")

(defun server-encapsulations ()
  "The rows of *SERVER-ENCAPSULATIONS* whose function the image has, each (symbol tag wrapper).
A server that lacks one (another release, or not loaded) does without its encapsulation."
  (loop for ((package-name name) tag wrapper) in *server-encapsulations*
        for package = (find-package package-name)
        for symbol = (and package (find-symbol name package))
        when symbol
          collect (list symbol tag wrapper)))

(defun swank-person-first (default-connection)
  (person-first-connection (find-package "SWANK") default-connection))

(defun slynk-person-first (default-connection)
  (person-first-connection (find-package "SLYNK") default-connection))

(defun connection-closed-hooks (&optional server)
  "The variables of the hooks SERVER (by default every server loaded) runs when a connection
closes, where it has them."
  (loop for package in (if server (list (server-package server)) (server-packages))
        for hook = (find-symbol "*CONNECTION-CLOSED-HOOK*" package)
        when hook collect hook))

;;; ------------------------------------------------------------------------------------------
;;; Connections and their threads

(defun server-connections (package)
  "The connections the server of PACKAGE serves, newest first."
  (let ((variable (find-symbol "*CONNECTIONS*" package)))
    (and variable (boundp variable) (symbol-value variable))))

(defun connection-server (connection)
  "The SERVER whose connection CONNECTION is (its structure is of the server's package)."
  (let ((package (symbol-package (class-name (class-of connection)))))
    (find package (servers) :key #'server-package)))

(defun connection-socket-stream (connection)
  "CONNECTION's socket stream, or NIL."
  (let* ((server (connection-server connection))
         (socket-io (and server (server-function server "CONNECTION.SOCKET-IO"))))
    (and socket-io (funcall socket-io connection))))

(defun current-socket-stream (server)
  "The socket stream of the connection of SERVER whose request this thread serves, or NIL."
  (let ((socket-io (server-function server "CURRENT-SOCKET-IO")))
    (and socket-io (ignore-errors (funcall socket-io)))))

(defun close-server-connection (connection)
  "Closes CONNECTION as its server closes one whose client went away (its CLOSE-CONNECTION%: its
threads stop, it leaves the server's list), when the server has that."
  (let* ((server (connection-server connection))
         (close (and server (server-function server "CLOSE-CONNECTION%"))))
    (when close
      (funcall close connection nil nil))))

(defun send-to-connection (connection event)
  "Hands EVENT to CONNECTION's control thread, as its server's SEND does, which writes it to the
client. False when the server lacks the parts."
  (let* ((server (connection-server connection))
         (control-thread (and server (server-function server "MCONN.CONTROL-THREAD")))
         (send (and server (server-function server "SEND"))))
    (when (and control-thread send)
      (funcall send (funcall control-thread connection) event)
      t)))

(defun thread-connection (server thread)
  "The connection of SERVER whose request THREAD serves, or NIL."
  (sb-thread:symbol-value-in-thread (server-connection-variable server) thread nil))

(defun server-thread-id-function (server)
  "The function by which SERVER's backend numbers a thread, or NIL."
  (server-function server "THREAD-ID" (server-backend server)))

(defun server-thread-id (thread)
  "The id by which the servers in the image name THREAD (they share one table), or NIL."
  (loop for server in (servers)
        for id-of = (server-thread-id-function server)
        when id-of
          return (ignore-errors (funcall id-of thread))))

(defun server-thread (server id)
  "The thread the server SERVER numbers ID, or NIL."
  (let ((find (server-function server "FIND-THREAD" (server-backend server))))
    (and find (funcall find id))))

(defun server-sentinel (server)
  "SERVER's sentinel thread, which closes the connections whose client went away, or NIL."
  (let ((find-registered (server-function server "FIND-REGISTERED" (server-backend server)))
        (name (server-symbol server "SENTINEL")))
    (and find-registered name (ignore-errors (funcall find-registered name)))))

;;; ------------------------------------------------------------------------------------------
;;; Worker threads (workers.lisp)

(defun server-worker-parts (server)
  "What a worker thread of SERVER needs, as (:HANDLE-REQUESTS function :THREAD-ID function
:CLOSED-HOOK variable :BINDINGS alist), or NIL when the server lacks one of the functions: the
loop that serves a connection's requests in the calling thread, the function that gives a thread
its id, the hook run when a connection closes, and the special bindings the server makes for a
thread it spawns for a request."
  (let ((handle-requests (server-function server "HANDLE-REQUESTS"))
        (thread-id (server-function server "THREAD-ID"))
        (closed-hook (server-symbol server "*CONNECTION-CLOSED-HOOK*"))
        (bindings (server-symbol server "*DEFAULT-WORKER-THREAD-BINDINGS*"))
        (indentation (server-symbol server "*CONFIGURE-EMACS-INDENTATION*")))
    (and handle-requests thread-id
         (list :handle-requests handle-requests
               :thread-id thread-id
               :closed-hook closed-hook
               :bindings (append (and bindings (boundp bindings) (symbol-value bindings))
                                 ;; After each request the server scans the symbols of its package
                                 ;; (some 3,000 through CL-USER's uses), and all of them whenever a
                                 ;; package was made, to tell Emacs how to indent them; no client
                                 ;; of ours indents.
                                 (and indentation (list (cons indentation nil))))))))

;;; ------------------------------------------------------------------------------------------
;;; The debugger (debugger.lisp, breakpoints.lisp)

(defun server-debugging-function (package)
  "A function of (CONNECTION CONDITION) that enters the debugger of the server of PACKAGE on
CONNECTION, as a request of that connection would, or NIL when the server lacks the parts. Made
from the server's own WITH-CONNECTION and DEBUG-IN-EMACS, found by name; no pending request is
named, so the agent's server takes the stop for a thread it did not start and leaves it waiting."
  (destructuring-bind (&optional with-connection debug pending)
      ;; Slynk kept swank's names for these.
      (mapcar (lambda (name) (find-symbol name package))
              '("WITH-CONNECTION" "DEBUG-IN-EMACS" "*PENDING-CONTINUATIONS*"))
    (and with-connection debug pending (macro-function with-connection) (fboundp debug)
         (compile nil `(,(or (sbcl-symbol :named-lambda) 'lambda)
                        ,@(and (sbcl-symbol :named-lambda) '(enter-agent-debugger))
                        (connection condition)
                        (let ((,pending '()))
                          (,with-connection (connection) (,debug condition))))))))

(defun backend-frame-package (index)
  "The package of frame INDEX's function, as the backend reads and prints in that frame."
  (funcall (backend-function "FRAME-PACKAGE") index))

(defun backend-compute-backtrace (start end)
  "The debugger's frames from START to END (exclusive; NIL for all), innermost first."
  (funcall (backend-function "COMPUTE-BACKTRACE") start end))

(defun backend-frame-locals (index)
  "The locals of frame INDEX, each a plist of :NAME and :VALUE."
  (funcall (backend-function "FRAME-LOCALS") index))

(defun backend-frame-source-location (index)
  "Where frame INDEX's code is, as a swank location."
  (funcall (backend-function "FRAME-SOURCE-LOCATION") index))

(defun backend-eval-in-frame (form index)
  "The values of FORM evaluated in frame INDEX, its locals in scope."
  (funcall (backend-function "EVAL-IN-FRAME") form index))

(defun backend-restart-frame (index)
  "Calls frame INDEX's function again with the same arguments; returns only when it cannot."
  (funcall (backend-function "RESTART-FRAME") index))

(defun backend-return-from-frame (index form)
  "Makes frame INDEX return FORM's values; returns, with a reason, only when it cannot."
  (funcall (backend-function "RETURN-FROM-FRAME") index form))

(defun backend-find-thread (id)
  "The thread the server of this thread's request numbers ID, or NIL."
  (funcall (backend-function "FIND-THREAD") id))
