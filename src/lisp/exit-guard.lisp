;;;; The exit guard: an agent's code cannot end the person's image, nor can what it hands to the
;;;; image to run later (timers, interruptions, finalizers, hooks). The encapsulations are
;;;; installed with the rest of the footprint (footprint.lisp).

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; An agent cannot end the user's image by accident
;;;
;;; SB-EXT:EXIT (which UIOP:QUIT, SB-EXT:QUIT, SB-THREAD:ABORT-THREAD of the main thread and
;;; SB-THREAD:TERMINATE-THREAD of it call) is encapsulated: in code an agent's tool call runs,
;;; directly or through what it starts, it signals EXIT-REFUSED unless the call allows exits (the
;;; server started the image, or runs with --allow-exit). A catch around the call could not stop an
;;; exit instead: from another thread SBCL takes the exit lock, unwinds that thread, runs the exit
;;; hooks and tells the main thread to exit. Code the agent hands to the image to run later, or in
;;; another thread (a thread, a timer, an interruption, a finalizer), is made to run as the agent's
;;; code wherever it runs, so that the guard knows it for the agent's. A function put on one of
;;; SBCL's hook lists is not handed to anything the helper sees: it is known for the agent's by
;;; when it appeared there (see CALL-CLAIMING-HOOKS), and SBCL runs it as the agent's code then.

(define-condition exit-refused (error)
  ((arguments :initarg :arguments :reader exit-refused-arguments))
  (:report (lambda (condition stream)
             (format stream "(SB-EXT:EXIT~{ ~A~}) was refused: this image is not swank-mcp's to end (it did not ~
                             start it), and ending it would lose the state of whoever works in it. Start ~
                             swank-mcp with --allow-exit to let an evaluation end the image."
                     (let ((*package* (find-package '#:common-lisp)))
                       (mapcar #'prin1-to-string (exit-refused-arguments condition)))))))

(defvar *unowned-hook* nil
  "True while a hook of no known owner that may be the agent's runs (see HOOK-AS-OWNED): an exit in
it is refused.")

(defun refuse-agent-exit (exit &rest arguments)
  (if (and (or *agent-call* *agent-session* *unowned-hook*) (not *exit-allowed*))
      (error 'exit-refused :arguments arguments)
      (apply exit arguments)))

(defun agent-callback (function &key whole-thread (session *agent-session*) (exit-allowed *exit-allowed*)
                                     (owner (or *evaluation* sb-thread:*current-thread*)))
  "FUNCTION, which the agent's code of SESSION hands to the image to call later or elsewhere, as a
function that runs it as the agent's code (see CALL-AS-AGENT) in whatever thread calls it. An
exit it tries and does not handle, or an error it leaves to the debugger, is recorded in the
session's background and ends the call of FUNCTION, not the thread, unless WHOLE-THREAD (FUNCTION
is the thread's body): the code around it is not the agent's and must not see the agent's error.
Called inside the code that made it, OWNER (its evaluation, or its agent thread): a timer that
interrupts it, as WITH-TIMEOUT's does, FUNCTION runs as it is, and that code's handlers and
debugger see its errors."
  (let ((callback
          (lambda (&rest arguments)
            (if (and owner
                     (eq owner (or *evaluation* sb-thread:*current-thread*))
                     (eq *agent-session* session))
                (apply function arguments)
                (let ((tag (list 'agent-callback)))
                  (when whole-thread
                    (setf (gethash sb-thread:*current-thread* *agent-threads*) session))
                  (catch tag
                    (flet ((leave () (throw tag nil)))
                      (handler-bind ((exit-refused
                                       (lambda (condition)
                                         (record-background-error (session-background session) condition
                                                                  (backtrace-lines condition)
                                                                  :went-on (not whole-thread))
                                         (leave))))
                        (call-as-agent session exit-allowed function arguments #'leave)))))))))
    (setf (gethash callback *agent-callbacks*) t)
    callback))

(defparameter *hook-variables* '(sb-ext:*exit-hooks* sb-ext:*after-gc-hooks* sb-ext:*save-hooks*)
  "Lists of functions SBCL calls later in whichever thread, through SB-INT:CALL-HOOKS:
SB-EXT:*EXIT-HOOKS* when the human exits (where a hook that exits again would end the image at
once, with another code, before the human's own hooks and the flushing of output ran),
SB-EXT:*AFTER-GC-HOOKS* after any collection, SB-EXT:*SAVE-HOOKS* when the human saves the image
(where an exit would end it unsaved). SB-EXT:*INIT-HOOKS* is not among them: its functions run in
the new process a saved core starts, not in this image.")

(defmacro with-hook-lock (&body body)
  ;; Without collections: one in this thread while it holds the lock would run the hooks, and an
  ;; agent's hook takes the lock when it ends.
  `(sb-sys:without-gcing (sb-thread:with-mutex (*hook-lock*) ,@body)))

(defun claim-hooks (owner &optional (before '()))
  "Gives each function on the lists of *HOOK-VARIABLES* that has no owner and was not on them
when they held BEFORE (a CAR of an *AGENT-CODE-RUNS* entry) the owner OWNER makes of it."
  (loop for variable in *hook-variables*
        for old = (pop before)
        do (dolist (hook (symbol-value variable))
             (unless (or (gethash hook *hook-owners*) (member hook old))
               (setf (gethash hook *hook-owners*) (funcall owner hook))))))

(defun call-claiming-hooks (function)
  "Calls FUNCTION, which runs as the agent's code when *AGENT-SESSION* is bound. A function that
appears on a list of *HOOK-VARIABLES* while it runs becomes the agent's: SBCL runs it as the
agent's code (see CALL-OWNED-HOOKS), in whatever thread, however deep in the agent's hooks,
timers or threads it was added. Which thread added one cannot be known, so one the person adds
meanwhile is taken for the agent's too; what is added while no agent code runs is the person's."
  (let ((session *agent-session*)
        (exit-allowed *exit-allowed*))
    (if (null session)
        (funcall function)
        (let ((run nil))
          ;; Uninterrupted between the bookkeeping and the call: a run left in the list would
          ;; keep every later hook from being the person's.
          (sb-sys:without-interrupts
            (unwind-protect
                 (progn
                   (with-hook-lock
                     (unless *agent-code-runs*
                       (claim-hooks (constantly :person)))
                     (setf run (cons (mapcar #'symbol-value *hook-variables*) exit-allowed))
                     (setf *agent-code-runs* (cons run *agent-code-runs*)))
                   (sb-sys:with-local-interrupts (funcall function)))
              (when run
                (with-hook-lock
                  (claim-hooks (lambda (hook)
                                 (agent-callback hook :session session :exit-allowed exit-allowed :owner nil))
                               (car run))
                  (setf *agent-code-runs* (remove run *agent-code-runs*))))))))))

(defun hook-as-owned (hook)
  "What SBCL calls for HOOK: an agent's hook's AGENT-CALLBACK; HOOK itself when it is the
person's; or, while agent code that added it may still run, HOOK with exits refused."
  (let ((owner (gethash hook *hook-owners*)))
    (cond ((functionp owner) owner)
          ((and (null owner)
                (loop for (lists . exit-allowed) in *agent-code-runs*
                      thereis (and (not exit-allowed)
                                   (loop for variable in *hook-variables*
                                         for old in lists
                                         thereis (and (member hook (symbol-value variable))
                                                      (not (member hook old)))))))
           (lambda (&rest arguments)
             (let ((*unowned-hook* t)
                   (*exit-allowed* nil))
               (apply hook arguments))))
          (t hook))))

(defun call-owned-hooks (call-hooks kind hooks &rest options)
  "The encapsulation of SB-INT:CALL-HOOKS, by which SBCL runs the lists of *HOOK-VARIABLES*: each
hook runs as HOOK-AS-OWNED says. An exit is refused by what the thread runs when it exits, and a
collection runs the hooks in whichever thread allocated, the person's too: so a hook is known for
the agent's by when it was added."
  (apply call-hooks kind (mapcar #'hook-as-owned hooks) options))

(defun remove-agent-hooks ()
  "For UNINSTALL: takes the agents' functions off the lists of *HOOK-VARIABLES*, where without the
helper they would run as the person's code. Returns a line for each list changed."
  (loop for variable in *hook-variables*
        for removed = (loop (let* ((old (symbol-value variable))
                                   (new (remove-if (lambda (hook)
                                                     ;; A revision before *HOOK-OWNERS* put its
                                                     ;; AGENT-CALLBACKs on the lists themselves.
                                                     (or (functionp (gethash hook *hook-owners*))
                                                         (gethash hook *agent-callbacks*)))
                                                   old)))
                              (when (eq old (sb-ext:compare-and-swap (symbol-value variable) old new))
                                (return (- (length old) (length new))))))
        when (plusp removed)
          collect (format nil "~D function~:P an agent put on ~A" removed (qualified-name variable))))

(defun make-agent-timer (make-timer function &rest options &key thread &allow-other-keys)
  "The encapsulation of SB-EXT:MAKE-TIMER: the function of a timer the agent's code makes runs as
the agent's code, in the thread the timer interrupts or in a new one (THREAD T)."
  (if *agent-session*
      (apply make-timer (agent-callback function :whole-thread (eq thread t)) options)
      (apply make-timer function options)))

(defun interrupt-as-agent (interrupt-thread thread function)
  "The encapsulation of SB-THREAD:INTERRUPT-THREAD: an interruption the agent's code sends runs
as the agent's code in the thread it interrupts, the main thread included."
  (funcall interrupt-thread thread (if *agent-session* (agent-callback function) function)))

(defun finalize-as-agent (finalize object function &rest options)
  "The encapsulation of SB-EXT:FINALIZE: a finalizer the agent's code sets runs as the agent's
code in whatever thread runs finalizers."
  (apply finalize object (if *agent-session* (agent-callback function) function) options))

(defun run-timers-as-nobody (run-expired-timers &rest arguments)
  "The encapsulation of SBCL's SIGALRM handler's work: it runs in whichever thread took the
signal, an agent's evaluation among them, and the timers it runs (the human's too) must not pass
for that thread's code. An agent's timer carries its agent with it (see MAKE-AGENT-TIMER)."
  (let ((*agent-session* nil)
        (*agent-call* nil)
        (*exit-allowed* nil))
    (apply run-expired-timers arguments)))
