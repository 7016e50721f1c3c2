;;;; Breakpoints: the debugger tool's break, breakpoints and unbreak. A breakpoint encapsulates a
;;;; function (as TRACE does), so a call of it by name stops the calling thread, and that thread
;;;; only, when the breakpoint's thread and condition say so. The thread then waits in the server's
;;;; debugger on the connection of the agent that set it (never the person's: they did not ask
;;;; for it), where the debugger tool attaches to it; CONTINUE resumes the call. A breakpoint is its
;;;; session's: it goes when the session ends.
;;;;
;;;; The person sees them all the same: each breakpoint set or removed, and each thread that stops
;;;; at one and leaves it, is an event of the activity record (NOTE-EVENT, activity.lisp) that
;;;; their activity buffer shows, and Emacs removes every agent's breakpoint at once
;;;; (REMOVE-ALL-BREAKPOINTS).
;;;;
;;;; A thread stopped at a breakpoint waits for an agent, so it must never outlive the agent's
;;;; interest: when its breakpoint goes, for whatever reason (unbreak, Emacs, the session ending,
;;;; the agent's server killed and its connection closed, uninstall), every thread stopped at it
;;;; goes on at once (RELEASE-STOPS), by the CONTINUE restart its stop established.
;;;;
;;;; A breakpoint never stops the image's own machinery: functions of COMMON-LISP, of SBCL, of the
;;;; servers and of the helper are refused (the stop itself prints, takes locks and sends through
;;;; the server, so a breakpoint there stops swank's threads or recurses until the heap is gone);
;;;; a thread already at a stop, or testing a condition, never stops again until it goes on; and
;;;; the condition is the agent's code (CONDITION-HOLDS-P).

(in-package #:mcp-agent-helper)

(defclass breakpoint ()
  ((number :initarg :number :reader breakpoint-number)
   (function-name :initarg :function-name :reader breakpoint-function-name)
   (condition-text :initarg :condition-text :reader breakpoint-condition-text)
   (test :initarg :test :reader breakpoint-test
         :documentation "A function of the call's arguments, or NIL to stop at every call.")
   (thread :initarg :thread :reader breakpoint-thread
           :documentation "The only thread it stops, or NIL for every thread.")
   (stops-left :initarg :stops-left :accessor breakpoint-stops-left
               :documentation "How many more stops before it goes, or NIL for no limit.")
   (hits :initform 0 :accessor breakpoint-hits)
   (condition-errors :initform 0 :accessor breakpoint-condition-errors)
   (gone :initform nil :accessor breakpoint-gone
         :documentation "Why it was removed with its stops let go, once it was: a stop that comes
after that goes on at once.")
   (session :initarg :session :reader breakpoint-session)
   (debug-timeout :initarg :debug-timeout :reader breakpoint-debug-timeout
                  :documentation "Seconds a thread waits at it for the agent before it goes on.")
   (stop-frame :initarg :stop-frame :reader breakpoint-stop-frame
               :documentation "A function of (STOP . ARGUMENTS) that calls STOP in a frame named as
the function, with its parameters bound (STOP-FRAME-FUNCTION), or NIL.")))

(define-condition breakpoint-hit (simple-condition) ()
  (:documentation "What a thread stopped at a breakpoint waits in the debugger with."))

(defclass breakpoint-stop ()
  ((thread :initarg :thread :reader stop-thread)
   (breakpoint :initarg :breakpoint :reader stop-breakpoint)
   (continue :initarg :continue :reader stop-continue
             :documentation "The CONTINUE restart of the stop, which lets the thread go on.")
   (released :initform nil :accessor stop-released
             :documentation "Why the thread was let go without an agent's action, once it was."))
  (:documentation "A thread waiting at a breakpoint: one of *BREAKPOINT-STOPS*."))

(defvar *at-breakpoint* nil
  "True in a thread while it tests a breakpoint's condition or waits at a stop: a call it makes
meanwhile (the stop's own printing, the agent's eval_in_frame) never stops at a breakpoint.")

(defparameter *condition-time-limit* 0.5
  "Seconds the agent's condition (a breakpoint's, a trace's) may run in the thread it tests before
it counts as false.")

(defun release-stops (predicate why)
  "Lets every thread waiting at a breakpoint stop PREDICATE is true of go on, through its stop's
CONTINUE restart, as if an agent had continued it; WHY says why, in the activity record. Returns
how many were let go."
  (let ((released (sb-thread:with-mutex (*breakpoints-lock*)
                    (loop for stop in *breakpoint-stops*
                          when (and (null (stop-released stop)) (funcall predicate stop))
                            do (setf (stop-released stop) why)
                            and collect stop))))
    (dolist (stop released (length released))
      (let ((continue (stop-continue stop)))
        (ignore-errors
         (sb-thread:interrupt-thread
          (stop-thread stop)
          ;; Checked where it runs: the thread may have gone on meanwhile, and a restart no longer
          ;; active would put an error in the person's thread.
          (lambda ()
            (when (member continue (compute-restarts))
              (invoke-restart continue)))))))))

(defun refused-breakpoint-reason (name)
  "Why a breakpoint on the function NAME would stop the image's own machinery, or NIL."
  (let ((package (symbol-package (if (consp name) (second name) name))))
    (cond ((null package) nil)
          ((eq package (load-time-value (find-package '#:mcp-agent-helper)))
           "it is swank-mcp's own")
          ((server-package-p package)
           (format nil "it is the ~A server's, which serves every connection (the person's too)"
                   (package-name package)))
          ((or (eq package (load-time-value (find-package '#:common-lisp)))
               (eql 0 (search "SB-" (package-name package))))
           (format nil "it is ~A's, which the image's own machinery calls (printing, threads, locks, the ~
                        servers), and a stop there would stop or recurse in the stop itself; break on a ~
                        function of yours that calls it"
                   (package-name package))))))

(defun agent-debugger (session)
  "A function of a condition that enters the debugger on SESSION's connection with it, or, where
the server lacks the parts, the debugger as ever."
  (let* ((connection (session-connection session))
         (server (session-server session))
         (package (and server (server-package server)))
         (enter (and package connection
                     (or (gethash package *debugging-functions*)
                         (setf (gethash package *debugging-functions*) (server-debugging-function package))))))
    (if enter
        (lambda (condition) (funcall enter connection condition))
        #'invoke-debugger)))

(defun call-with-agent-stepping (session function arguments)
  "Calls FUNCTION with ARGUMENTS so that SBCL's stepper, if the agent turned it on at a breakpoint
(step_into and its kin), stops each step in the debugger of SESSION's connection, as swank's own
debugging environment routes steps to SLDB. Outside it a step would go to SBCL's terminal stepper."
  (destructuring-bind (&optional hook invoke-stepper find-stepped-frame stack-top-hint)
      (list (sbcl-symbol :*stepper-hook*)
            (sbcl-symbol :invoke-stepper)
            (sbcl-symbol :find-stepped-frame)
            (sbcl-symbol :*stack-top-hint*))
    (if (and hook invoke-stepper find-stepped-frame stack-top-hint
             (fboundp invoke-stepper) (fboundp find-stepped-frame))
        (let ((enter (agent-debugger session)))
          (progv (list hook)
              (list (lambda (condition)
                      (when (typep condition 'sb-ext:step-form-condition)
                        ;; A step the agent's action did not wait for is told in its next reply.
                        (ignore-errors
                         (record-background-error (session-background session) condition nil :waits "at a step"))
                        (progv (list stack-top-hint) (list (funcall find-stepped-frame))
                          (funcall enter condition)))))
            (handler-bind ((sb-ext:step-condition (lambda (condition) (funcall invoke-stepper condition))))
              (apply function arguments))))
        (apply function arguments))))

(defun stop-at-breakpoint (breakpoint arguments)
  "Stops the current thread at BREAKPOINT, called with ARGUMENTS, in the debugger of the agent's
connection; returns when the agent continues. Its session is told in its next reply."
  (let* ((session (breakpoint-session breakpoint))
         (thread sb-thread:*current-thread*)
         (call (format nil "~A called with ~A"
                       (qualified-name (breakpoint-function-name breakpoint)) (print-briefly arguments)))
         (condition (make-condition 'breakpoint-hit
                                    :format-control "Breakpoint ~D: ~A"
                                    :format-arguments (list (breakpoint-number breakpoint) call))))
    (ignore-errors
     (record-background-error (session-background session) condition nil
                              :waits (format nil "at breakpoint ~D" (breakpoint-number breakpoint))))
    (note-event :breakpoint-hit "Thread ~D ~S stopped at breakpoint ~D: ~A. It waits for the agent."
                (thread-number thread) (safe-princ (sb-thread:thread-name thread)) (breakpoint-number breakpoint)
                call)
    (let ((stop nil)
          (timer nil))
      ;; However it leaves (continued, its frame restarted, aborted, let go), the person sees it
      ;; run on.
      (unwind-protect
           (with-simple-restart (continue "Continue from breakpoint ~D." (breakpoint-number breakpoint))
             (setf stop (new 'breakpoint-stop :thread thread :breakpoint breakpoint
                                              :continue (find-restart 'continue)))
             (sb-thread:with-mutex (*breakpoints-lock*)
               (push stop *breakpoint-stops*))
             ;; Its breakpoint may have gone, or its session ended, before the stop was listed:
             ;; nothing would let it go then.
             (when (or (breakpoint-gone breakpoint) (session-ended-p session))
               (return-from stop-at-breakpoint))
             ;; An agent that never comes back leaves no thread waiting for good (--debug-timeout).
             ;; The timer is the helper's, not the agent's code (see MAKE-AGENT-TIMER).
             (let ((*agent-session* nil)
                   (waiting stop)
                   (seconds (breakpoint-debug-timeout breakpoint)))
               (setf timer (sb-ext:make-timer
                            (lambda ()
                              (release-stops (lambda (stop) (eq stop waiting))
                                             (format nil "it waited ~:D seconds for its agent (--debug-timeout)"
                                                     seconds)))
                            :thread t :name "swank-mcp breakpoint timeout"))
               (sb-ext:schedule-timer timer seconds))
             (funcall (agent-debugger session) condition))
        (when timer
          (sb-ext:unschedule-timer timer))
        (when stop
          (sb-thread:with-mutex (*breakpoints-lock*)
            (setf *breakpoint-stops* (remove stop *breakpoint-stops*))))
        (note-event :breakpoint-left "Thread ~D ~S left breakpoint ~D~@[: it was let go, as ~A~]."
                    (thread-number thread) (safe-princ (sb-thread:thread-name thread)) (breakpoint-number breakpoint)
                    (and stop (stop-released stop)))))))

(defun parameter-variables (lambda-list)
  "The variables a lambda list binds (its parameters', without defaults or supplied-p)."
  (loop for item in lambda-list
        unless (member item lambda-list-keywords)
          collect (let ((name (if (consp item) (first item) item)))
                    (if (consp name) (second name) name))))

(defun stop-frame-function (function-name)
  "A function of (STOP . ARGUMENTS) that calls STOP in a frame named FUNCTION-NAME whose locals are
the function's parameters bound to ARGUMENTS, as its own frame would hold them: the stop is before
the call, where the function has no frame yet, and a breakpoint is set to read the arguments (a
backtrace shows the call, eval_in_frame reads the parameters by name). NIL when SBCL does not know
the function's lambda list, or it does not compile."
  (let* ((lambda-list (ignore-errors (sb-introspect:function-lambda-list (fdefinition function-name))))
         (variables (and (listp lambda-list) (parameter-variables lambda-list)))
         (named-lambda (sbcl-symbol :named-lambda)))
    (when (and named-lambda (listp lambda-list) (every #'symbolp variables))
      (ignore-errors
       (let ((*error-output* (make-broadcast-stream)))
         (compile nil `(lambda (stop &rest arguments)
                         (apply (,named-lambda ,function-name ,lambda-list
                                  ;; Speed as high as debug: no step points, so that a
                                  ;; step from the stop goes into the function, not here.
                                  (declare (optimize (debug 2) (speed 2)) (ignorable ,@variables))
                                  (funcall stop)
                                  ;; Used after the stop, so that the frame keeps them for it.
                                  (list ,@variables))
                                arguments))))))))

(defun breakpoint-applies-p (breakpoint arguments)
  "Whether this call, with ARGUMENTS, stops at BREAKPOINT: in its thread (if it names one), not in
a tool call of swank-mcp's own (which has nobody to stop for), and when its condition holds."
  (and (or (null (breakpoint-thread breakpoint))
           (eq (breakpoint-thread breakpoint) sb-thread:*current-thread*))
       (not (in-call-p))
       (not (session-ended-p (breakpoint-session breakpoint)))
       (or (null (breakpoint-test breakpoint))
           (condition-holds-p breakpoint arguments))))

(defun condition-holds-p (breakpoint arguments)
  "Whether BREAKPOINT's condition holds for ARGUMENTS; one that fails counts as false, and is
counted."
  (let ((holds (run-condition (breakpoint-test breakpoint) (breakpoint-session breakpoint) arguments)))
    (when (eq holds :failed)
      (sb-thread:with-mutex (*breakpoints-lock*)
        (incf (breakpoint-condition-errors breakpoint))))
    (eq holds t)))

(defvar *condition-started* nil
  "While the agent's condition runs in this thread, the internal real time it began: the
watchdog (WATCH-CONDITIONS) reads it from each thread.")

(defvar *condition-tag* nil
  "While the agent's condition runs in this thread, its catch tag, which the watchdog throws to.")

(defun run-condition (test session arguments)
  "TEST, a condition of SESSION's agent (CONDITION-TEST), applied to a call's ARGUMENTS in the
thread making the call: T, NIL, or :FAILED. The condition is the agent's code running in somebody's
thread: it runs as the agent's (an exit is refused), within *CONDITION-TIME-LIMIT*, and whatever
it signals (an error, a warning, a stack exhaustion, a BREAK) or a limit it passes makes it
:FAILED, never seen by the thread's own handlers or debugger. The limit is kept by a watchdog
that reads each thread's *CONDITION-STARTED*, not by a timer of the call's own: a timer made and
scheduled for each call cost a breakpoint's function 2.5 us a call, against 0.07 us."
  (let ((tag (list 'condition)))
    (flet ((failed (&rest ignored)
             (declare (ignore ignored))
             (throw tag :failed)))
      (catch tag
        (let ((*condition-tag* tag)
              (*condition-started* (get-internal-real-time))
              (*agent-session* session)
              (*exit-allowed* nil)
              (*debugger-hook* #'failed)
              (sb-ext:*invoke-debugger-hook* #'failed))
          (handler-bind ((condition #'failed))
            (and (funcall test arguments) t)))))))

(defun ensure-condition-watchdog ()
  "Starts the watchdog that cuts an agent's condition running past *CONDITION-TIME-LIMIT*: every
tenth of a second it interrupts such a thread, which then leaves the condition as failed. Called
once a breakpoint or a trace has a condition; the watchdog stops itself once none has. The timer
is the helper's, not the agent's code (see MAKE-AGENT-TIMER)."
  (sb-thread:with-mutex (*breakpoints-lock*)
    (unless *condition-watchdog*
      (let ((*agent-session* nil))
        (setf *condition-watchdog*
              (sb-ext:make-timer #'watch-conditions :thread t :name "swank-mcp condition watchdog")))
      (sb-ext:schedule-timer *condition-watchdog* 0.1 :repeat-interval 0.1))))

(defun watch-conditions ()
  (let ((limit (* *condition-time-limit* internal-time-units-per-second))
        (now (get-internal-real-time)))
    (dolist (thread (sb-thread:list-all-threads))
      (let ((start (sb-thread:symbol-value-in-thread '*condition-started* thread nil))
            (tag (sb-thread:symbol-value-in-thread '*condition-tag* thread nil)))
        (when (and start tag (> (- now start) limit))
          (ignore-errors
           (sb-thread:interrupt-thread
            ;; Checked where it runs: the condition may have ended meanwhile, and a throw to a
            ;; tag that is gone would be an error in the person's thread.
            thread (lambda () (when (eq *condition-tag* tag) (throw tag :failed))))))))
    ;; Decided under the lock a new condition's ENSURE-CONDITION-WATCHDOG takes, after its
    ;; breakpoint or trace is in place: either this sees it, or that starts another watchdog.
    (sb-thread:with-mutex (*breakpoints-lock*)
      (unless (or (some #'breakpoint-test *breakpoints*) (some #'wide-trace-test *wide-traces*))
        (when *condition-watchdog*
          (sb-ext:unschedule-timer *condition-watchdog*)
          (setf *condition-watchdog* nil))))))

(defun breakpoint-wrapper (function-name)
  "The encapsulation of FUNCTION-NAME: each call asks its breakpoint, found afresh, so that an
UNBREAK under way never leaves a call stopping at a breakpoint that is gone."
  (lambda (original &rest arguments)
    (let ((breakpoint (and (not *at-breakpoint*)
                           (find function-name *breakpoints* :key #'breakpoint-function-name :test #'equal))))
      (if (and breakpoint
               (let ((*at-breakpoint* t))
                 (breakpoint-applies-p breakpoint arguments))
               (take-hit breakpoint))
          (progn
            (let ((*at-breakpoint* t)
                  (frame (breakpoint-stop-frame breakpoint)))
              (if frame
                  (apply frame (lambda () (stop-at-breakpoint breakpoint arguments)) arguments)
                  (stop-at-breakpoint breakpoint arguments)))
            (call-with-agent-stepping (breakpoint-session breakpoint) original arguments))
          (apply original arguments)))))

(defun take-hit (breakpoint)
  "Counts a stop at BREAKPOINT, when it is still there and has stops left (two threads may reach
its last one at once: one stops, the other runs on). Its last stop removes it."
  (let ((last (sb-thread:with-mutex (*breakpoints-lock*)
                (let ((left (breakpoint-stops-left breakpoint)))
                  (when (and (member breakpoint *breakpoints*) (or (null left) (plusp left)))
                    (incf (breakpoint-hits breakpoint))
                    (when left
                      (setf (breakpoint-stops-left breakpoint) (1- left)))
                    (if (eql left 1) :last :taken))))))
    (when (eq last :last)
      (remove-breakpoints (list breakpoint) "its last stop (hits) was taken" :release nil))
    last))

(defun condition-test (text function-name package)
  "A function of a call's arguments that evaluates TEXT, read in PACKAGE, with FUNCTION-NAME's
parameters bound by name to them."
  (let* ((lambda-list (sb-introspect:function-lambda-list (fdefinition function-name)))
         (forms (let ((*package* package)) (read-forms text package)))
         (variables (parameter-variables lambda-list)))
    (when (rest forms)
      (fail "The condition is one form; it reads as ~D." (length forms)))
    (compile nil `(lambda (arguments)
                    (destructuring-bind ,lambda-list arguments
                      (declare (ignorable ,@variables))
                      ,(first forms))))))

(defun breakpoint-text (breakpoint)
  "BREAKPOINT in a line of the activity record: its number, function, condition and thread."
  (destructuring-bind (&key number function condition thread &allow-other-keys) (breakpoint-plist breakpoint)
    (format nil "breakpoint ~D on ~A~@[ when ~A~]~:[, every thread~;, thread ~:*~A only~]"
            number function condition thread)))

(defun remove-breakpoints (breakpoints why &key (release t))
  "Takes BREAKPOINTS out, and each function's encapsulation with its last one, and, with RELEASE,
lets the threads stopped at them go on. Returns those that were still set (two removals can race),
which the activity record says WHY of, and how many threads were let go."
  (let ((removed (sb-thread:with-mutex (*breakpoints-lock*)
                   (let ((set (intersection breakpoints *breakpoints*)))
                     (when release
                       (dolist (breakpoint breakpoints)
                         (setf (breakpoint-gone breakpoint) why)))
                     (setf *breakpoints* (set-difference *breakpoints* breakpoints))
                     (dolist (breakpoint breakpoints set)
                       (let ((name (breakpoint-function-name breakpoint)))
                         (unless (find name *breakpoints* :key #'breakpoint-function-name :test #'equal)
                           (when (and (fboundp name)
                                      (sbcl-call :encapsulated-p name 'mcp-agent-breakpoint))
                             (sbcl-call :unencapsulate name 'mcp-agent-breakpoint)))))))))
    (dolist (breakpoint removed)
      (note-event :breakpoint-removed "Removed ~A: ~A." (breakpoint-text breakpoint) why))
    (values removed
            (if release
                (release-stops (lambda (stop) (member (stop-breakpoint stop) breakpoints)) why)
                0))))

(defun session-breakpoints (session)
  "SESSION's breakpoints, newest first."
  (remove session *breakpoints* :key #'breakpoint-session :test-not #'eq))

(defun forget-session-breakpoints (session)
  "Removes SESSION's breakpoints, and lets every thread stopped at one of them go on (also at one
its last stop removed already): it has ended."
  (let ((why "its agent's session ended"))
    (remove-breakpoints (session-breakpoints session) why :release nil)
    (release-stops (lambda (stop) (eq (breakpoint-session (stop-breakpoint stop)) session)) why)))

(defun breakpoint-plist (breakpoint)
  (list :number (breakpoint-number breakpoint)
        :function (qualified-name (breakpoint-function-name breakpoint))
        :condition (breakpoint-condition-text breakpoint)
        :thread (let ((thread (breakpoint-thread breakpoint)))
                  (and thread (format nil "~D ~S" (thread-number thread) (safe-princ (sb-thread:thread-name thread)))))
        :stops-left (breakpoint-stops-left breakpoint)
        :hits (breakpoint-hits breakpoint)
        :condition-errors (breakpoint-condition-errors breakpoint)))

(define-entry (set-breakpoint :caller :server) (function &key condition thread hits package
                                                          (debug-timeout *debug-timeout*) session token)
  "Sets a breakpoint on FUNCTION (a name as typed) for SESSION: CONDITION, code over the function's
parameters by name; THREAD, the only thread it stops; HITS, how many stops before it goes;
DEBUG-TIMEOUT, the seconds a stopped thread waits for the agent before it goes on. Returns the
breakpoint's plist."
  (run-tool
   token
   (lambda ()
     (let* ((session (find-session session))
            (lookup (tool-package package session))
            (name (find-existing-symbol function lookup))
            (target (and thread (find-thread thread))))
       (unless (and (fboundp name) (not (macro-function name)) (not (special-operator-p name)))
         (fail "~A is not a function; a breakpoint stops calls of a function." (qualified-name name)))
       (let ((refused (refused-breakpoint-reason name)))
         (when refused
           (fail "A breakpoint on ~A is refused: ~A." (qualified-name name) refused)))
       (let ((breakpoint (new 'breakpoint
                              :number (1+ (sb-ext:atomic-incf (car *breakpoint-counter*)))
                              :function-name name
                              :condition-text condition
                              ;; Read where the parameters' names are: the function's package,
                              ;; unless the call names one.
                              :test (and condition
                                         (condition-test condition name
                                                         (if package lookup (or (symbol-package name) lookup))))
                              :thread target
                              :stops-left hits
                              :debug-timeout debug-timeout
                              :stop-frame (stop-frame-function name)
                              :session session)))
         ;; Checked and set under one lock: of two agents breaking on one function at once, one
         ;; is refused; a function never has two breakpoints.
         (sb-thread:with-mutex (*breakpoints-lock*)
           (let ((existing (find name *breakpoints* :key #'breakpoint-function-name)))
             (when existing
               (fail "~A already has breakpoint ~D; unbreak it first." (qualified-name name)
                     (breakpoint-number existing))))
           (push breakpoint *breakpoints*)
           (unless (sbcl-call :encapsulated-p name 'mcp-agent-breakpoint)
             (sbcl-call :encapsulate name 'mcp-agent-breakpoint (breakpoint-wrapper name))))
         (when condition
           (ensure-condition-watchdog))
         (note-event :breakpoint-set "An agent set ~A: a call that stops waits for the agent, not in your debugger."
                     (breakpoint-text breakpoint))
         (breakpoint-plist breakpoint))))))

(define-entry (list-breakpoints :caller :server) (&key session token)
  "SESSION's breakpoints, oldest first: (:BREAKPOINTS plists)."
  (run-tool token
            (lambda ()
              (let ((session (find-session session)))
                (list :breakpoints (mapcar #'breakpoint-plist (reverse (session-breakpoints session))))))))

(define-entry (remove-breakpoint :caller :server) (&key number session token)
  "Removes SESSION's breakpoint NUMBER, or all of them when NUMBER is NIL, and lets the threads
stopped at them go on: (:REMOVED plists :RELEASED threads)."
  (run-tool token
            (lambda ()
              (let* ((session (find-session session))
                     (own (session-breakpoints session))
                     (chosen (if number
                                 (or (remove number own :key #'breakpoint-number :test-not #'eql)
                                     (fail "There is no breakpoint ~D of this session~:[~;; its breakpoints are ~
                                            ~{~D~^, ~}~]." number own (mapcar #'breakpoint-number own)))
                                 own)))
                (list :removed (mapcar #'breakpoint-plist chosen)
                      :released (nth-value 1 (remove-breakpoints chosen "the agent removed it")))))))

(define-entry (remove-all-breakpoints :caller :emacs) ()
  "For Emacs (swank-mcp-clear-breakpoints): removes every agent's breakpoint, whichever session set
it, so that no call of the image stops for an agent any more, and lets every thread waiting at one
go on. Returns the removed breakpoints' plists, oldest first."
  (mapcar #'breakpoint-plist
          (sort (remove-breakpoints *breakpoints* "cleared in Emacs") #'< :key #'breakpoint-number)))

;;; ------------------------------------------------------------------------------------------
;;; Recompiling a function so that it can be stepped

(defun in-package-spans (octets before)
  "The (start . end) of each top-level IN-PACKAGE form of OCTETS before byte BEFORE: a definition
kept alone is read in the package they make current, as in its file."
  (let ((spans '()) (i 0) (marker (map 'vector #'char-code "(in-package")))
    (loop
      (let ((start (skip-layout octets i)))
        (when (>= start before) (return (nreverse spans)))
        (let ((end (skip-form octets start)))
          (when (<= end start) (return (nreverse spans)))
          (when (and (<= (+ start (length marker)) (length octets))
                     (every (lambda (byte wanted) (= (logior byte 32) (logior wanted 32)))
                            (subseq octets start (+ start (length marker))) marker))
            (push (cons start end) spans))
          (setf i end))))))

(defun placeholder-ends (octets)
  "The last byte of each top-level form of OCTETS that the reader reads: a blanked-out form leaves
a 0 there, so that the compiler counts the forms as in the file (the debugger finds a frame's form
by that count) and the reader stops where it stops in the file (SBCL records a definition's
place as where the reader stood before its form)."
  (let ((ends '()) (i 0))
    (loop
      (let ((start (skip-layout octets i)))
        (when (>= start (length octets)) (return (nreverse ends)))
        (multiple-value-bind (after produced) (skip-form octets start)
          (when (<= after start) (return (nreverse ends)))
          (when produced
            (push (1- after) ends))
          (setf i after))))))

(defun definition-form-octets (function-name)
  "The octets of FUNCTION-NAME's file with everything but the top-level form that defines it
blanked out (newlines kept, so that the compiler's positions stay the file's, and each other form
read as a 0, so that its count of top-level forms does: PLACEHOLDER-ENDS), the file's name and
its write date; fails, saying why, for a function that has no file."
  (let* ((source (or (ignore-errors (sb-introspect:find-definition-source (fdefinition function-name)))
                     (fail "~A has no definition source SBCL can find." (qualified-name function-name))))
         (pathname (sb-introspect:definition-source-pathname source)))
    (unless pathname
      (fail "~A was defined at the REPL, with no source file to recompile it from: evaluate its definition again ~
             after (declaim (optimize (debug 3)))." (qualified-name function-name)))
    (let* ((file (source-pathname-text pathname))
           (octets (or (file-octets file) (fail "~A cannot be read." file)))
           (offset (sb-introspect:definition-source-character-offset source))
           (form-index (first (sb-introspect:definition-source-form-path source)))
           (start (or (form-start-in octets offset form-index)
                      (fail "SBCL recorded no place in ~A for ~A." file (qualified-name function-name))))
           (end (skip-form octets start))
           (kept (make-array (length octets) :element-type '(unsigned-byte 8)))
           (spans (cons (cons start end) (in-package-spans octets start)))
           (placeholders (make-array (length octets) :element-type 'bit :initial-element 0)))
      (dolist (end (placeholder-ends octets))
        (setf (sbit placeholders end) 1))
      (dotimes (i (length octets))
        (setf (aref kept i) (cond ((some (lambda (span) (<= (car span) i (1- (cdr span)))) spans) (aref octets i))
                                  ((= (aref octets i) 10) 10)
                                  ((= 1 (sbit placeholders i)) (char-code #\0))
                                  (t 32))))
      (values kept file (file-write-date file) (octet-line-and-column octets start)))))

(define-entry (recompile-for-stepping :caller :server) (function &key restore package session token (max-output 65536))
  "Recompiles the definition of FUNCTION from its file with (debug 3), which SBCL's stepper needs,
or, with RESTORE, with the file's own policy again. Returns the plist LOAD-SOURCE does, with :FILE
and :LINE of the definition."
  (let ((stdout (make-capture max-output))
        (*max-output* max-output)
        (*handles* (session-handles session))
        (*agent-session* (find-session session)))
    (let ((result (run-tool
                   token
                   (lambda ()
                     (let ((name (find-existing-symbol function (tool-package package session))))
                       (unless (and (fboundp name) (not (macro-function name)))
                         (fail "~A is not a function." (qualified-name name)))
                       (multiple-value-bind (octets file write-date line) (definition-form-octets name)
                         (let ((*compile-policy* (if restore nil '(optimize (debug 3)))))
                           (append (compile-and-load octets file write-date)
                                   (list :file file :line line))))))
                   :stdout stdout)))
      (if (getf result :failure)
          result
          (append result (list :stdout (capture-report stdout)))))))
