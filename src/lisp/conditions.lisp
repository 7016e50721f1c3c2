;;;; Backtraces and conditions as text: what a failed call reports.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Backtraces

(defparameter *max-frames* 20)
(defparameter *max-frame-length* 400)

(defparameter *evaluator-functions*
  (append '(eval)
          (sbcl-symbols :simple-eval-in-lexenv)
          (sbcl-symbols :simple-eval-progn-body :%simple-eval :eval-in-lexenv :eval-progn-body))
  "Frames of the evaluator itself: they sit between the helper and the user's code and say
nothing the user wrote.")

(defparameter *interruption-functions*
  (append (sbcl-symbols :run-interruption :%interrupt-thread)
          (sbcl-symbols :invoke-interruption)
          (sbcl-symbols :sigurg-handler))
  "Frames of the interruption machinery, above the code a timeout or cancellation interrupted.")

(defun frame-function-symbol (name)
  "The symbol a frame's function name is about: the name itself, the function of (SETF F), or the
enclosing function of a local function such as (FLET F :IN PARENT) or (LAMBDA () :IN PARENT)."
  (cond ((symbolp name) name)
        ((and (consp name) (eq (first name) 'setf)) (second name))
        ((consp name)
         (let ((in (member :in name)))
           (cond ((and in (symbolp (second in))) (second in))
                 ((symbolp (second name)) (second name)))))))

(defun evaluator-frame-p (name)
  "True for a frame, named NAME, of the evaluator under the user's code (see *EVALUATOR-FUNCTIONS*)."
  (member (frame-function-symbol name) *evaluator-functions*))

(defun own-frame-p (name)
  "Frames of this helper (its capture streams' methods included) or of the swank/slynk server:
never the user's business."
  (let* ((symbol (frame-function-symbol name))
         (package (and symbol (symbol-package symbol))))
    (or (and (consp name) (eq (first name) :method) (member 'capture-stream (car (last name))))
        (and package
             (or (eq package (load-time-value (find-package '#:mcp-agent-helper)))
                 (server-package-p package))))))

(defparameter *implementation-packages*
  '("SB-INT" "SB-KERNEL" "SB-IMPL" "SB-C" "SB-PCL" "SB-VM" "SB-DI" "SB-FASL" "SB-FORMAT"
    "SB-PRETTY" "SB-LOOP" "SB-BIGNUM" "SB-REGALLOC")
  "SBCL's implementation packages: their exports are for SBCL itself, not for users.")

(defun implementation-internal-p (name)
  "True for frames of SBCL's own machinery under a failing call, such as
SB-KERNEL::INTEGER-/-INTEGER under (/ 1 0): functions of an implementation package, or internal
symbols of any other SB- package, and the runtime's own frames (named by strings)."
  (let* ((symbol (frame-function-symbol name))
         (package (and symbol (symbol-package symbol))))
    (or (stringp name)
        (and package
             (eql 0 (search "SB-" (package-name package)))
             (or (member (package-name package) *implementation-packages* :test #'string=)
                 (not (eq :external (nth-value 1 (find-symbol (symbol-name symbol) package)))))))))

(defun standard-function-name-p (name)
  (let ((symbol (frame-function-symbol name)))
    (and symbol (eq (symbol-package symbol) (load-time-value (find-package '#:common-lisp))))))

(defun frame-name-and-args (frame)
  (handler-case (sbcl-call :frame-call frame :replace-dynamic-extent-objects t)
    (error () (sbcl-call :frame-call frame))))

(defun frame-call-of (frame condition)
  "The name and arguments of FRAME's call. SBCL shows a call to an undefined function as
(\"undefined function\" ARGS...); the name the user called is in the condition."
  (multiple-value-bind (name args) (frame-name-and-args frame)
    (if (and (equal name "undefined function") (typep condition 'undefined-function))
        (values (cell-error-name condition) args)
        (values name args))))

(defun printed-or-type (object)
  (handler-case (prin1-to-string object)
    (error () (format nil "#<~A, whose printing failed>"
                      (or (ignore-errors (prin1-to-string (type-of object))) "object")))))

(defun print-frame (name args)
  (let ((*print-length* 10)
        (*print-level* 4)
        (*print-circle* t)
        (*print-pretty* nil)
        (*print-readably* nil))
    (let ((text (handler-case (prin1-to-string (if (listp args) (cons name args) (list name args)))
                  ;; An object whose PRINT-OBJECT fails, often the very error being reported, is
                  ;; named by its type so that the rest of the call still shows.
                  (error () (format nil "(~{~A~^ ~})"
                                    (mapcar #'printed-or-type (cons name (if (listp args) args (list args)))))))))
      (if (> (length text) *max-frame-length*)
          (concatenate 'string (subseq text 0 *max-frame-length*) " ...")
          text))))

(defun backtrace-lines (condition &key interrupted)
  "The user's part of the current stack, innermost first, as printed calls. Called from the
debugger hook or from an interruption, while the stack is still there. Stops at the helper's
own frames; drops the signalling machinery above the user's code and the evaluator below it."
  (handler-case
      (let ((frames '())
            (top (if interrupted
                     (sbcl-call :top-frame)
                     (let ((hint (needed-internal :*stack-top-hint*)))
                       (progv (list hint) (list (symbol-value hint))
                         (or (sbcl-call :resolve-stack-top-hint)
                             (sbcl-call :top-frame))))))
            (seen-user-frame nil)
            (reached-helper nil)
            ;; The implementation's frame nearest the user's code: the one that signalled, such
            ;; as SB-KERNEL::INTEGER-/-INTEGER under (/ 10 X), which a tail call may have left as
            ;; the only trace of the user's function that called it.
            (signalling nil))
        ;; Bounded walk: a control-stack-exhausted error has thousands of frames below, and
        ;; the hook runs on what is left of the stack.
        (loop for frame = top then (sbcl-call :frame-down frame)
              for walked from 0 below (+ *max-frames* 200)
              while (and frame (< (length frames) (+ *max-frames* 10)))
              do (multiple-value-bind (name args) (frame-call-of frame condition)
                   (cond ((own-frame-p name)
                          (when seen-user-frame
                            (setf reached-helper t)
                            (loop-finish)))
                         ((and interrupted (not seen-user-frame)
                               (member (frame-function-symbol name) *interruption-functions*))
                          ;; Everything above the interruption belongs to it: start afresh.
                          (setf frames '()))
                         ((and (not seen-user-frame) (implementation-internal-p name))
                          (setf signalling (cons name args)))
                         (t
                          ;; Below a standard function's own frame, (/ 1 0) say, the
                          ;; implementation's frame adds nothing.
                          (unless (or seen-user-frame (null signalling) (standard-function-name-p name))
                            (push signalling frames))
                          (setf seen-user-frame t)
                          (push (cons name args) frames)))))
        (when reached-helper
          (loop while (and frames (evaluator-frame-p (car (first frames))))
                do (pop frames)))
        (let ((calls (nreverse frames)))
          (loop for (name . args) in calls
                for i below *max-frames*
                collect (print-frame name args))))
    (error (e)
      (list (format nil "(backtrace unavailable: ~A)" (safe-princ e))))))

;;; ------------------------------------------------------------------------------------------
;;; Conditions as text

(defun safe-princ (object)
  (handler-case (let ((*print-pretty* nil) (*print-readably* nil)) (princ-to-string object))
    (error () (format nil "#<~A (unprintable)>" (ignore-errors (type-of object))))))

(defun condition-message (condition)
  "The condition's report on one logical line (SBCL's reports use pretty-printer directives
that would otherwise break a short message over several lines), unless that glues words together
(LAID-OUT-REPORT), cut to *MAX-OUTPUT*."
  (let ((stream (make-capture *max-output* :runaway :any :tail nil))
        (endless nil))
    (handler-case (let ((*print-pretty* nil) (*print-readably* nil)
                        (*print-length* 50) (*print-level* 5))
                    (princ condition stream))
      (output-limit-exceeded () (setf endless t))
      (error (e) (return-from condition-message
                   (format nil "(the condition's report itself failed: ~A)" (safe-princ e)))))
    (destructuring-bind (text dropped &optional more offset handle tail (lost 0)) (capture-report stream)
      (declare (ignore handle tail))
      (if (zerop dropped)
          (or (laid-out-report condition text) text)
          (format nil "~A~%[... ~:[~;more than ~]~:D more characters of this message not shown: the limit ~
                       is ~:D (--max-output)~:[~*~*~*~*~;; inspect ~A with offset ~D for ~
                       ~:[the rest~*~;the next ~:D~]~]~:[~;, where the report was stopped: it went on without ~
                       end~]~:[~;. The last ~:D were not kept~]]"
                  text endless dropped (capture-limit stream)
                  more more offset (or endless (plusp lost)) (- dropped lost)
                  endless (plusp lost) lost)))))

(defparameter *max-laid-out-report* 4000
  "The longest report CONDITION-MESSAGE prints a second time, with the pretty printer.")

(defun word-count (text)
  (loop with in-word = nil
        for char across text
        count (if (member char '(#\Space #\Tab #\Newline #\Return))
                  (setf in-word nil)
                  (and (not in-word) (setf in-word t)))))

(defun without-blank-lines (text)
  (with-output-to-string (out)
    (let ((lines (loop for start = 0 then (1+ end)
                       for end = (position #\Newline text :start start)
                       collect (string-right-trim '(#\Space #\Tab #\Return) (subseq text start end))
                       while end)))
      (format out "~{~A~^~%~}" (remove "" lines :test #'string=)))))

(defun laid-out-report (condition plain)
  "CONDITION's report as the pretty printer lays it out, without blank lines, when PLAIN, its
report printed without it, glued words together that the pretty printer's line breaks keep apart
(esrap's parse errors read `Expected:the character B`); NIL otherwise. SBCL's own reports, whose
breaks stand where a space does, stay on one line."
  (when (<= (length plain) *max-laid-out-report*)
    (let ((stream (make-capture (* 2 *max-laid-out-report*) :runaway :any :tail nil)))
      (handler-case (let ((*print-pretty* t) (*print-readably* nil) (*print-right-margin* most-positive-fixnum)
                          (*print-miser-width* nil) (*print-length* 50) (*print-level* 5))
                      (princ condition stream))
        (error () (return-from laid-out-report nil)))
      (destructuring-bind (pretty dropped &rest rest) (capture-report stream)
        (declare (ignore rest))
        (and (zerop dropped)
             (> (word-count pretty) (word-count plain))
             (without-blank-lines pretty))))))

(defun implementation-class-p (class)
  "Classes that are SBCL implementation details (SB-INT:SIMPLE-STYLE-WARNING,
SB-KERNEL::CONTROL-STACK-EXHAUSTED, ...), as opposed to standard and user classes and SBCL's
documented extensions in SB-EXT."
  (let* ((name (class-name class))
         (package (and (symbolp name) (symbol-package name))))
    (or (null package)
        (and (eql 0 (search "SB-" (package-name package)))
             (string/= (package-name package) "SB-EXT")))))

(defun standard-condition-name (condition)
  "The name to show for CONDITION's type: its own class name unless that is an implementation
detail, in which case the nearest superclass a Lisp programmer knows (usually from COMMON-LISP).
EXACT-CONDITION-NAME keeps the precise one for the structured result."
  (let* ((class (class-of condition))
         (precedence (or (ignore-errors (sb-mop:class-precedence-list class)) (list class)))
         ;; SIMPLE-CONDITION is the mixin that carries a format control; SB-INT:SIMPLE-STYLE-WARNING
         ;; is a STYLE-WARNING to the reader, not a SIMPLE-CONDITION.
         (shown (or (find-if (lambda (c)
                               (and (not (implementation-class-p c))
                                    (or (eq c class) (not (eq (class-name c) 'simple-condition)))))
                             precedence)
                    class))
         (*package* (find-package '#:common-lisp-user)))
    (prin1-to-string (class-name shown))))

(defun warning-category (warning)
  "Warnings are shown by category, as the compiler reports them: WARNING rather than the
SIMPLE-WARNING class that merely carries a format string."
  (let ((name (standard-condition-name warning)))
    (if (string= name "SIMPLE-WARNING") "WARNING" name)))

(defun exact-condition-name (condition)
  (let ((*package* (find-package '#:keyword)))
    (prin1-to-string (type-of condition))))

(defvar *tool-input* nil
  "The empty input stream a tool call reads from, to recognise its end of file in reports.")

(defun condition-report (kind condition backtrace &optional restarts)
  "The report of CONDITION: its type and message, BACKTRACE (printed frames) and RESTARTS (the
restart objects it offered, innermost first)."
  (let ((message (condition-message condition)))
    (when (and (typep condition 'end-of-file) *tool-input*
               (let ((stream (stream-error-stream condition)))
                 (or (eq stream *tool-input*)
                     (and (typep stream 'two-way-stream)
                          (eq (two-way-stream-input-stream stream) *tool-input*)))))
      (setf message (format nil "~A~%Interactive input is not available through MCP: *STANDARD-INPUT*, ~
                                 *QUERY-IO* and *DEBUG-IO* are at end of file. Pass data in the code instead."
                            message)))
    (list :kind kind
          :type (standard-condition-name condition)
          :class (exact-condition-name condition)
          :message (concatenate 'string message (unknown-name-hint condition))
          :backtrace backtrace
          :restarts (restart-reports restarts))))

(defvar *outer-restarts* '()
  "The restarts in force where the current evaluation began: the server's, not the code's.")

(defun evaluation-restarts (condition)
  "The restarts that the evaluated code, or SBCL on its behalf, offers for CONDITION, innermost
first: those a programmer chooses from in the debugger. The server's own (back to its top level)
are left out: the debugger tool's abort is the way out."
  (remove-if (lambda (restart) (member restart *outer-restarts*)) (compute-restarts condition)))

(defun restart-reports (restarts)
  "Each restart as (NAME REPORT), as SLDB lists them; NAME is \"\" for an anonymous restart."
  (loop for restart in restarts
        collect (list (let ((name (restart-name restart))) (if name (symbol-name name) ""))
                      (handler-case (let ((*print-pretty* nil) (*print-readably* nil)) (princ-to-string restart))
                        (error () "(its report failed)")))))
