;;;; The helper's footprint: everything it changes in the image outside its own package, listed
;;;; here, put in by INSTALL (which ENSURE-HELPER, in bootstrap.lisp, calls after each load of the
;;;; helper) and taken out by UNINSTALL. No other file changes anything outside the package;
;;;; docs/security.md's list of what swank-mcp changes in an image is this file's.
;;;;
;;;; - Encapsulations of SBCL functions (*ENCAPSULATIONS*): SB-THREAD::START-THREAD, SB-EXT:EXIT,
;;;;   SB-EXT:MAKE-TIMER, SB-THREAD:INTERRUPT-THREAD, SB-EXT:FINALIZE, SB-IMPL::RUN-EXPIRED-TIMERS
;;;;   and SB-INT:CALL-HOOKS (agent-threads.lisp and exit-guard.lisp: what an agent's code starts
;;;;   or puts on SBCL's hook lists runs as the agent's, and it cannot end the image), and the
;;;;   definers SB-C::%DEFMACRO,
;;;;   SB-PCL::LOAD-DEFMETHOD, SB-PCL::LOAD-DEFCLASS (undo.lisp's journal). Each costs the image's
;;;;   own calls of the function one special-variable test when no agent's call runs, but
;;;;   CALL-HOOKS, which looks each hook it runs up in a table.
;;;; - Encapsulations of the servers' DEFAULT-CONNECTION and INVOKE-SLIME-DEBUGGER (slynk's
;;;;   INVOKE-SLY-DEBUGGER), image-threads.lisp: the debugger of a thread no connection serves goes
;;;;   to the person's connection rather than swank-mcp's, and the agents are told it stopped.
;;;; - A function on SB-INT:*SETF-FDEFINITION-HOOK* (the journal's view of DEFUN).
;;;; - CONNECTION-CLOSED on each server's *CONNECTION-CLOSED-HOOK* (swank's, slynk's, or both):
;;;;   a closed connection's sessions and worker threads end.
;;;; - Encapsulations of the servers' UPDATE-REDIRECTION-AFTER-CLOSE (swank-repl's, or swank's
;;;;   or slynk's own), image-threads.lisp: when the person's connection that the image's global
;;;;   output went to closes, that output never goes to a swank-mcp connection, which has no REPL
;;;;   streams (SBCL would halt at the next thread's output).
;;;; - An encapsulation of each server's DISPATCH-EVENT: the reply to the agent's request to a
;;;;   thread waiting in the person's debugger goes to the agent (image-threads.lisp); and of its
;;;;   CLOSE-CONNECTION%, which closes a dead client's socket without flushing it first, so that
;;;;   the server's sentinel thread never stops in a debugger over a broken pipe.
;;;; - The modules sb-cltl2 and sb-introspect, required when the helper loads (its files name their
;;;;   symbols); swank and slynk have loaded both already. A module cannot be unloaded, so
;;;;   UNINSTALL leaves them.
;;;; The servers' parts among these are named in servers.lisp, the one file that names anything
;;;; of theirs (*SERVER-ENCAPSULATIONS*, CONNECTION-CLOSED-HOOKS).
;;;;
;;;; Besides these, the helper changes the servers' own state as it serves calls (servers.lisp,
;;;; workers.lisp): it drops finished threads' mailboxes and ids, restarts a worker's message
;;;; count at each call, and sets TCP_NODELAY on the socket of a connection that asks for
;;;; workers; and it runs worker threads, which UNINSTALL ends. UNINSTALL also takes the functions
;;;; agents put on SBCL's hook lists off them (exit-guard.lisp's REMOVE-AGENT-HOOKS): without the
;;;; encapsulation of SB-INT:CALL-HOOKS they would run as the person's code, an exit in them
;;;; unrefused. Some tools change the image for as long as they need to: run-tests encapsulates
;;;; the test frameworks' functions and LOAD while a run reads results (testing.lisp), and what
;;;; the trace tool traces stays traced until its session ends. UNINSTALL refuses while a call
;;;; runs and ends every session, so it leaves neither.

(in-package #:mcp-agent-helper)

(eval-when (:compile-toplevel :load-toplevel :execute)
  (require :sb-cltl2)
  (require :sb-introspect))

(defparameter *encapsulations*
  '((:start-thread mcp-agent-thread-watch start-agent-thread)
    (sb-ext:exit mcp-agent-exit-guard refuse-agent-exit)
    (sb-ext:make-timer mcp-agent-timer-watch make-agent-timer)
    (sb-thread:interrupt-thread mcp-agent-interrupt-watch interrupt-as-agent)
    (sb-ext:finalize mcp-agent-finalizer-watch finalize-as-agent)
    (:run-expired-timers mcp-agent-timers-unbound run-timers-as-nobody)
    (:call-hooks mcp-agent-hook-owners call-owned-hooks)
    (:%defmacro mcp-agent-journal journal-defmacro)
    (:%defparameter mcp-agent-journal journal-defparameter)
    (:load-defmethod mcp-agent-journal journal-defmethod)
    (:load-defclass mcp-agent-journal journal-defclass))
  "The SBCL functions the helper encapsulates, each (function tag wrapper): FUNCTION is an SBCL
internal's keyword (sbcl.lisp) or SBCL's exported symbol. Internals are looked up by name, since a
future SBCL may lack one (the helper then does without). The wrapper is called by name, so that a
reloaded helper's definition takes over. The servers' functions it encapsulates are servers.lisp's
to name (SERVER-ENCAPSULATIONS); ENCAPSULATION-SPECS has both.")

(defun encapsulation-specs ()
  "Every encapsulation of the footprint, each (function tag wrapper): *ENCAPSULATIONS* and those
of the servers the image has (SERVER-ENCAPSULATIONS)."
  (append *encapsulations* (server-encapsulations)))

(defun fdefinition-hook ()
  (or *fdefinition-hook*
      (setf *fdefinition-hook*
            ;; Errors are dropped: the hook runs inside every DEFUN of the image, whose definition
            ;; must never fail because the journal did.
            (lambda (name new-definition)
              (ignore-errors (note-fdefinition-change name new-definition))))))

(defun encapsulated-function (designator)
  "The symbol of an encapsulated function as *ENCAPSULATIONS* names it, or NIL when it is missing."
  (if (keywordp designator) (sbcl-symbol designator) designator))

(defun encapsulations-supported-p ()
  (= 3 (length (sbcl-symbols :encapsulate :encapsulated-p :unencapsulate))))

(defun server-hook-items (&optional server)
  "The footprint on SERVER (by default every server loaded): CONNECTION-CLOSED on its
connection-closed hook, where it has one."
  (loop for hook in (connection-closed-hooks server)
        when (and (boundp hook) (listp (symbol-value hook)))
          collect (list :hook hook 'connection-closed)))

(defun image-items ()
  "The footprint outside the servers: the encapsulations and the fdefinition hook."
  (append (and (encapsulations-supported-p)
               (loop for (designator tag) in (encapsulation-specs)
                     for function = (encapsulated-function designator)
                     when (and function (fboundp function))
                       collect (list :encapsulation function tag)))
          (let ((hook (sbcl-symbol :*setf-fdefinition-hook*)))
            (and hook (boundp hook) (list (list :hook hook (fdefinition-hook)))))))

;;; ------------------------------------------------------------------------------------------
;;; Putting it in and taking it out

(defun wrapper-of (item)
  "The wrapper of the encapsulation ITEM, (:ENCAPSULATION function tag)."
  (third (find (second item) (encapsulation-specs)
                :key (lambda (spec) (encapsulated-function (first spec))))))

(defun item-present-p (item)
  (destructuring-bind (kind place value) item
    (ecase kind
      (:encapsulation (and (fboundp place) (sbcl-call :encapsulated-p place value)))
      (:hook (and (boundp place) (member value (symbol-value place)) t)))))

(defun add-item (item)
  "Puts ITEM in, unless it is there (an earlier revision, or one from before *INSTALLED*, put it in)."
  (destructuring-bind (kind place value) item
    (unless (item-present-p item)
      (ecase kind
        (:encapsulation (sbcl-call :encapsulate place value (wrapper-of item)))
        (:hook (push value (symbol-value place)))))
    (pushnew item *installed* :test #'equal)))

(defun remove-item (item)
  "Takes ITEM out. Returns a line saying what it was, or NIL when it was not there."
  (destructuring-bind (kind place value) item
    (setf *installed* (remove item *installed* :test #'equal))
    (when (item-present-p item)
      (ecase kind
        (:encapsulation (sbcl-call :unencapsulate place value))
        (:hook (setf (symbol-value place) (remove value (symbol-value place)))))
      (format nil "~:[the encapsulation of~;a function on~] ~A" (eq kind :hook) (qualified-name place)))))

(defun own-function-p (value)
  "True for a function of this helper named by its symbol."
  (and (symbolp value) (eq (symbol-package value) (load-time-value (find-package '#:mcp-agent-helper)))))

(defun present-items ()
  "What is in the image of any revision's footprint: what *INSTALLED* lists, and the helper's
functions on the servers' hooks (a revision from before *INSTALLED* put some there by name)."
  (union *installed*
         (loop for (nil hook) in (server-hook-items)
               append (loop for function in (symbol-value hook)
                            when (own-function-p function)
                              collect (list :hook hook function)))
         :test #'equal))

(defun install ()
  "Puts the helper's footprint into the image, after a load of the helper: what is missing is put
in, and what another revision installed that this one does not is taken out (its function may no
longer exist)."
  (sb-thread:with-mutex (*footprint-lock*)
    (let ((wanted (append (image-items) (server-hook-items))))
      (mapc #'remove-item (set-difference (present-items) wanted :test #'equal))
      (mapc #'add-item wanted))
    (setf *footprint-installed* t))
  (forget-servers))

(defun install-server (server)
  "Gives SERVER, seen for the first time, its part of the footprint while the helper is installed."
  (sb-thread:with-mutex (*footprint-lock*)
    (when *footprint-installed*
      (mapc #'add-item (server-hook-items server)))))

(defun remove-footprint ()
  "Takes the whole footprint out of the image, whichever revision put it in (an encapsulation of a
revision from before *INSTALLED* is recognised by its tag). Returns a line for each item taken out."
  (sb-thread:with-mutex (*footprint-lock*)
    (setf *footprint-installed* nil)
    (prog1 (append (remove-agent-hooks)
                   (remove nil (mapcar #'remove-item (union (present-items) (image-items) :test #'equal))))
      (forget-servers))))

;;; ------------------------------------------------------------------------------------------
;;; Uninstalling

(define-entry (uninstall :caller :server) (&key when-sessions-end (delete-package t))
  "Takes the helper out of the image, for the person whose image it is (swank-mcp uninstall): the
sessions of the swank-mcp servers attached to it end (see RELEASE-SESSION) and their connections
close (they reconnect at their next call), its worker threads end, its footprint is taken out, its
undo journal dropped, and its package deleted, unless
DELETE-PACKAGE is NIL or an Emacs subscribes to its activity feed (the package then stays, inert).
The image is then as it was before swank-mcp's first call, but for the modules the helper
required and what the agents' own code changed or left running; the next call of a swank-mcp
installs the helper again. Returns (:UNINSTALLED lines :SESSIONS n :WORKERS n :PACKAGE text),
LINES saying what was taken out; or, changing nothing, (:BUSY n) while N calls of swank-mcp run
(besides this one), or with WHEN-SESSIONS-END, (:PENDING n) while N sessions remain: the last one
to end then uninstalls."
  (close-dead-connections)
  (sb-thread:with-mutex (*load-lock*)
    (let ((sessions (session-count))
          (running (- (car *calls-running*) (if (in-call-p) 1 0))))
      (cond ((and when-sessions-end (plusp sessions))
             (setf *uninstall-pending* t)
             (list :pending sessions))
            ((plusp running)
             (list :busy running))
            (t
             (let* ((agents (remove (server-connection) (agent-connections)))
                    (sessions (end-sessions (constantly t)))
                    (workers (end-workers-if (constantly t)))
                    (removed (remove-footprint))
                    (keep (cond ((not delete-package) "kept, as asked")
                                ((emacs-subscribed-p) "kept: an Emacs subscribes to its activity feed"))))
               (forget-journal)
               ;; Without the footprint the servers take the newest connection for the person's:
               ;; the swank-mcp servers still attached would get the person's errors.
               (mapc #'close-agent-connection agents)
               (setf *uninstall-pending* nil
                     *version* nil
                     *release* nil)
               (unless keep
                 (delete-package '#:mcp-agent-helper))
               (list :uninstalled removed :sessions sessions :workers workers
                     :package (or keep "deleted"))))))))

(defun uninstall-if-pending ()
  "Uninstalls the helper when UNINSTALL was asked to wait for the sessions to end and none is left."
  (when (and *uninstall-pending* (zerop (session-count)))
    (uninstall)))
