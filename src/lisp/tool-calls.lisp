;;;; Reading the user's code and running a tool in a call: the tool streams, the debugger
;;;; trapped (or parked for the debugger tool), RUN-TOOL and FAIL.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Reading user code and running a tool in a call

(define-condition unreadable-code (error)
  ((cause :initarg :cause :reader unreadable-code-cause)
   (code :initarg :code :reader unreadable-code-code)
   (position :initarg :position :reader unreadable-code-position)
   (forms-done :initarg :forms-done :reader unreadable-code-forms-done))
  (:report (lambda (condition stream)
             (princ (getf (unreadable-code-report condition) :message) stream))))

(defun line-and-column (code position)
  "1-based line and column of POSITION in CODE."
  (let ((line-start (let ((newline (position #\Newline code :end position :from-end t)))
                      (if newline (1+ newline) 0))))
    (values (1+ (count #\Newline code :end position))
            (1+ (- position line-start)))))

(defun reader-error-text (condition)
  "The reader's complaint without SBCL's \"Stream: #<...>\" suffix, which names a stream the
user never saw; the position is given in the user's terms instead."
  (if (typep condition 'simple-condition)
      (handler-case (let ((*print-pretty* nil))
                      (apply #'format nil (simple-condition-format-control condition)
                             (simple-condition-format-arguments condition)))
        (error () (condition-message condition)))
      (condition-message condition)))

(defun unreadable-code-report (condition)
  "The code itself could not be read: say where, in the user's terms, without the reader's
internal frames."
  (let ((cause (unreadable-code-cause condition))
        (done (unreadable-code-forms-done condition)))
    (multiple-value-bind (line column)
        (line-and-column (unreadable-code-code condition) (unreadable-code-position condition))
      (list :kind :read
            :type (standard-condition-name cause)
            :class (exact-condition-name cause)
            :message (format nil "~A~@[~%~A~]"
                             (if (typep cause 'end-of-file)
                                 (format nil "The code ends inside a form: the form at line ~D, column ~D is not closed."
                                         line column)
                                 (format nil "~A~A (reading the form at line ~D, column ~D)"
                                         (reader-error-text cause) (unknown-name-hint cause) line column))
                             (case done
                               (0 nil)
                               (1 "The form before it was evaluated.")
                               (t (format nil "The ~D forms before it were evaluated." done))))
            :backtrace nil
            :restarts nil))))

(defun resolve-package (requested session)
  "The package to evaluate in: REQUESTED if given, else the session's. Returns the package (or
NIL when REQUESTED does not exist) and a note for the user, if any."
  (cond (requested (values (find-package-loosely requested) nil))
        ((find-package-loosely (session-package-name session)))
        (t (values (find-package '#:common-lisp-user)
                   (format nil "The session package ~A no longer exists; evaluating in COMMON-LISP-USER."
                           (session-package-name session))))))

(defvar *tool-output* nil
  "The current tool call's output captures, (stdout . stderr).")

(defmacro with-tool-streams ((stdout stderr) &body body)
  "Binds the standard streams for a tool call: output into the captures, and every input stream
at end of file, so that READ-LINE, Y-OR-N-P or a debugger prompt fail at once instead of waiting
for a user who cannot answer (or, in an Emacs-hosted image, stealing the user's REPL)."
  (let ((input (gensym "INPUT")) (null-output (gensym "NULL-OUTPUT")))
    `(let* ((,input (make-string-input-stream ""))
            (,null-output (make-broadcast-stream))
            (*tool-input* ,input)
            (*tool-output* (cons ,stdout ,stderr))
            (*standard-output* ,stdout)
            (*error-output* ,stderr)
            (*trace-output* ,stderr)
            (*standard-input* ,input)
            (*terminal-io* (make-two-way-stream ,input ,stdout))
            (*query-io* (make-two-way-stream ,input ,null-output))
            (*debug-io* (make-two-way-stream ,input ,null-output)))
       ,@body)))

(defvar *parked* nil
  "While an evaluation waits in the server's debugger for the agent: the PARKED it waits with.")

(defclass parked ()
  ((condition :initarg :condition :reader parked-condition)
   (restarts :initarg :restarts :reader parked-restarts)
   (package :initarg :package :reader parked-package)
   (stdout :initarg :stdout :reader parked-stdout)
   (stderr :initarg :stderr :reader parked-stderr)
   (image-thread :initarg :image-thread :initform nil :reader parked-image-thread-p
                 :documentation "True for a thread of the image's own, attached to: every frame
of its stack but the helper's and the servers' is the person's code.")))

(defparameter *debug-timeout* 600
  "Seconds a parked evaluation waits for the agent before it is aborted.")

(defun park (condition server-hook)
  "Enters the server's debugger (SLDB's protocol) with CONDITION, as an unhandled error in
SLIME's REPL does: the thread waits there for the debugger tool's requests, which run in this
dynamic extent and find the evaluation in *PARKED*. Returns only if the server's debugger does."
  (let* ((evaluation *evaluation*)
         (*parked* (make-instance 'parked :condition condition
                                          :restarts (evaluation-restarts condition)
                                          :package *package*
                                          :stdout (car *tool-output*)
                                          :stderr (cdr *tool-output*)))
         ;; Aborted from the image's side too, so that a server that dies (or a client that never
         ;; comes back) cannot leave the thread waiting forever. The timer is the helper's, not
         ;; the agent's code (see MAKE-AGENT-TIMER).
         (timer (and evaluation
                     (let ((*agent-session* nil))
                       (sb-ext:make-timer
                        (lambda ()
                          (interrupt-evaluation
                           evaluation :timeout
                           (format nil "The evaluation waited in the debugger for ~:D seconds without an action and ~
                                        was aborted (--debug-timeout)." *debug-timeout*)))
                        :thread t :name "swank-mcp debugger timeout")))))
    (when timer
      (sb-ext:schedule-timer timer *debug-timeout*))
    (unwind-protect (funcall server-hook condition server-hook)
      (when timer
        (sb-ext:unschedule-timer timer)))))

(defun call-trapping-debugger (function &key debug)
  "Calls FUNCTION. Anything that would enter the debugger (an unhandled error, BREAK,
INVOKE-DEBUGGER) is turned into a report, taken while the failing frames are still on the stack,
and unwound, so that no thread is left in a debugger nobody drives. With DEBUG, it enters the
server's debugger instead (see PARK), and is unwound only when that returns. Returns (:OK .
values) or the report, and as a second value the condition that failed."
  (let ((tag (list 'debugger))
        (server-hook (and debug (or *debugger-hook* sb-ext:*invoke-debugger-hook*)))
        (*outer-restarts* (compute-restarts)))
    (multiple-value-bind (outcome failed-condition)
           (catch tag
             (let* ((hook (lambda (condition hook)
                     (declare (ignore hook))
                     (cond
                       ((typep condition 'unreadable-code)
                        (throw tag (values (unreadable-code-report condition) condition)))
                       ((typep condition 'storage-condition)
                         ;; The stack (or heap) is nearly gone: SBCL leaves only a small margin
                         ;; below the guard page, and overrunning it kills the whole image.
                         ;; Only the frames' names are taken here (a walk that conses a little and
                         ;; uses no stack); they are printed once the stack has been unwound.
                         (throw tag (values condition (ignore-errors (stack-function-names)))))
                       (t
                        (when server-hook
                          (park condition server-hook))
                        (throw tag (values (condition-report (if (typep condition 'error) :error :debugger)
                                                             condition
                                                             (backtrace-lines condition)
                                                             (evaluation-restarts condition))
                                           condition))))))
                    (sb-ext:*invoke-debugger-hook* hook)
                    (*debugger-hook* hook))
               (cons :ok (multiple-value-list (funcall function)))))
      (if (typep outcome 'condition)
          (values (condition-report :error outcome (folded-backtrace failed-condition)) outcome)
          (values outcome failed-condition)))))

(defparameter *max-stack-walk* 200000
  "Frames walked after a stack exhaustion: more than a default control stack holds.")

(defun stack-function-names ()
  "The names of the functions of the current stack's frames, innermost first."
  (loop for frame = (sbcl-call :top-frame) then (sbcl-call :frame-down frame)
        repeat *max-stack-walk*
        while frame
        collect (sbcl-call :debug-fun-name (sbcl-call :frame-debug-fun frame))))

(defun folded-backtrace (names)
  "NAMES (innermost first, from STACK-FUNCTION-NAMES) as backtrace lines, the user's part only, each
run of one function folded into one line: FACT x 9,870."
  (let* ((trampoline (position-if #'stringp names :end (min 20 (length names)) :from-end t))
         ;; Above the runtime's signal trampoline is the error's own machinery.
         (below-signal (if trampoline (nthcdr (1+ trampoline) names) names))
         (user (member-if (lambda (name) (not (or (own-frame-p name) (implementation-internal-p name))))
                          below-signal))
         (user (subseq user 0 (position-if #'own-frame-p user)))
         (user (reverse (member-if-not #'evaluator-frame-p (reverse user))))
         (runs '()))
    (dolist (name user)
      (if (and runs (equal (car (first runs)) name))
          (incf (cdr (first runs)))
          (push (cons name 1) runs)))
    (loop for (name . count) in (nreverse runs)
          for i below *max-frames*
          collect (let ((text (handler-case (let ((*print-pretty* nil)) (prin1-to-string name))
                                (error () "(unprintable)"))))
                    (if (> count 1) (format nil "~A x ~:D" text count) text)))))

(defun muffled-by-sbcl-p (condition)
  "True for a warning SBCL itself never prints (SB-EXT:*MUFFLED-WARNINGS*), such as the
redefinition of a file's macros and functions by loading the fasl just compiled from it: its own
handler muffles them only after every handler of ours has seen them."
  (typep condition sb-ext:*muffled-warnings*))

(defun char-at (text i)
  "The character at I of TEXT, a string or a vector of UTF-8 octets (the scanner only looks at
ASCII), or NIL past the end."
  (when (< i (length text))
    (let ((element (aref text i)))
      (if (characterp element) element (code-char element)))))

(defun layout-char-p (c)
  (member c '(#\Space #\Tab #\Newline #\Return #\Page)))

(defun skip-block-comment (text i)
  "I is just after #|. Returns the position after the matching |#."
  (let ((depth 1) (end (length text)))
    (loop while (and (< i end) (plusp depth))
          do (let ((c (char-at text i)) (next (char-at text (1+ i))))
               (cond ((and (eql c #\|) (eql next #\#)) (decf depth) (incf i 2))
                     ((and (eql c #\#) (eql next #\|)) (incf depth) (incf i 2))
                     (t (incf i)))))
    (min i end)))

(defun skip-layout (text i)
  "The position of the next form in TEXT (a string or octets) from I, past whitespace and
comments."
  (let ((end (length text)))
    (loop
      (let ((c (char-at text i)))
        (cond ((null c) (return end))
              ((layout-char-p c) (incf i))
              ((eql c #\;)
               (loop do (incf i) until (member (char-at text i) '(nil #\Newline))))
              ((and (eql c #\#) (eql (char-at text (1+ i)) #\|))
               (setf i (skip-block-comment text (+ i 2))))
              (t (return i)))))))

;;; ------------------------------------------------------------------------------------------
;;; Running a tool

(define-condition tool-failure (error)
  ((message :initarg :message :reader tool-failure-message))
  (:report (lambda (condition stream) (princ (tool-failure-message condition) stream)))
  (:documentation "A failure the user can act on (no such package, no such class): reported as
its message alone, without a condition type or backtrace."))

(defun fail (control &rest arguments)
  (error 'tool-failure :message (apply #'format nil control arguments)))

(defun run-tool (token function &key (stdout (make-broadcast-stream)) (stderr (make-broadcast-stream)) turn)
  "Calls FUNCTION, which returns the tool's plist, registered under TOKEN (so that a timeout or a
cancellation interrupts it) with the tool streams bound to STDOUT and STDERR (by default output
goes nowhere: nothing a tool does prints in the user's image), and with TURN, (turn what), once it
has that turn (see CALL-WITH-TURN). Returns the plist, or (:FAILURE message) for a TOOL-FAILURE, or
(:ERROR report) for anything else that went wrong."
  ;; The tools that run the agent's code (load-file and the like) bind its session: hooks that
  ;; code adds are the agent's (see CALL-CLAIMING-HOOKS).
  (let ((outcome (call-claiming-hooks
                  (lambda ()
                    (call-registered
                     token
                     (lambda (evaluation)
                       (declare (ignore evaluation))
                       (with-tool-streams (stdout stderr)
                         (handler-case (call-trapping-debugger
                                        (if turn
                                            (lambda () (call-with-turn (first turn) (second turn) function))
                                            function))
                           (tool-failure (failure)
                             (list :failure (tool-failure-message failure)))))))))))
    (case (first outcome)
      (:ok (second outcome))
      (:failure outcome)
      ;; A condition report, or the report of a timeout or cancellation.
      (t (list :error outcome)))))

(defun tool-package (requested session)
  "The package a tool works in: REQUESTED when given, else the session's current package."
  (or (resolve-package requested (find-session session))
      (fail-missing-package requested)))

(defun package-display-name (package)
  "The shortest of PACKAGE's names (CL-USER rather than COMMON-LISP-USER), for messages."
  (reduce (lambda (a b) (if (< (length b) (length a)) b a))
          (package-nicknames package)
          :initial-value (package-name package)))
