;;;; The evaluate-lisp tool: reads and evaluates the user's code form by form in the client's own
;;;; REPL session, capturing output, warnings and errors.

(in-package #:mcp-agent-helper)

(defparameter *max-warnings* 200
  "Warnings shown in a reply.")

(defparameter *max-kept-warnings* 10000
  "Warnings kept of one evaluation, the ones not shown behind a handle; the rest are counted.")

(defvar *frame-evaluation* nil
  "True while the debugger tool evaluates code in a frame of a parked evaluation, whose reply
has the warnings of that code: the parked evaluation does not record them as its own.")

(defparameter *default-print-length* 200)
(defparameter *default-print-level* 10)

(defun print-value (value limit &key (length *default-print-length*) (level *default-print-level*))
  "VALUE as the evaluate-lisp contract prints it, cut to LIMIT characters, with its handle (see
VALUE-HANDLE), as CAPTURE-REPORT's list. When the text is cut, the rest is behind a handle: a
string's own, or one of the printed text kept. A value that cannot be printed (the printer
signalled, or ran out of stack on a deep structure) is reported as such in place of its text,
with its handle, rather than failing the evaluation that made it."
  (let ((stream (make-capture limit :runaway nil :tail nil
                                    :keep (if (stringp value) limit (* *runaway-output-factor* (max limit 1024)))))
        (handle (value-handle value)))
    (handler-case
        (let ((*print-length* length)
              (*print-level* level)
              (*print-circle* t)
              (*print-pretty* t)
              (*print-readably* nil))
          (prin1 value stream))
      (serious-condition (condition)
        (return-from print-value
          (list (format nil "#<~A that could not be printed: ~A: ~A>" (safe-princ (type-of value))
                        (standard-condition-name condition) (condition-message condition))
                0 nil 0 handle))))
    (destructuring-bind (text dropped &optional more (offset 0) own-handle tail (lost 0)) (capture-report stream)
      (declare (ignore own-handle tail))
      (when (and (stringp value) (plusp dropped) handle)
        ;; A string's rest is read from the string itself, from the character after the last
        ;; one shown, and all of it is there.
        (setf more handle offset (printed-string-characters text) lost 0))
      ;; As short as it can be: most values are small and have no handle.
      (if (or handle more)
          (list text dropped more offset handle "" lost)
          (list text dropped)))))

(defun printed-string-characters (printed)
  "How many characters of a string PRINTED, the start of its printed form, shows."
  (loop with i = 1
        with count = 0
        while (< i (length printed))
        do (if (char= (char printed i) #\\) (incf i 2) (incf i))
           (incf count)
        finally (return count)))

(defun read-and-evaluate (code on-form)
  "Reads CODE one form at a time, evaluating each before reading the next, so that a form may
change *PACKAGE* or define the reader macros the next one uses. Returns the last form's values."
  (let ((eof '#:eof)
        (values '())
        (forms-done 0))
    (with-input-from-string (in code)
      (loop
        (let* ((start (or (position-if-not (lambda (c) (member c '(#\Space #\Tab #\Newline #\Return #\Page)))
                                           code :start (file-position in))
                          (length code)))
               (form (handler-case (read in nil eof)
                       ((or reader-error end-of-file) (cause)
                         (error 'unreadable-code :cause cause :code code :position start
                                                 :forms-done forms-done)))))
          (when (eq form eof)
            (return))
          (setf - form)
          (setf values (multiple-value-list (eval form)))
          (incf forms-done)
          (funcall on-form form values))))
    values))

(defun evaluate-in-session (code session start-package max-output stdout stderr record-warning debug
                            print-length print-level)
  "Reads and evaluates CODE in START-PACKAGE with the session's REPL variables, printing the last
form's values; with DEBUG, an error enters the server's debugger (see PARK). Returns the outcome,
the package in force at the end, and the failed condition."
  (let ((final-package start-package))
    (multiple-value-bind (outcome failed-condition)
        (with-tool-streams (stdout stderr)
          (let ((*package* start-package))
            (progv *history-variables* (session-history session)
              (unwind-protect
                   (call-trapping-debugger
                    (lambda ()
                      (handler-bind ((warning record-warning)
                                     (condition (lambda (condition)
                                                  (when (compile-time-error-p condition)
                                                    (funcall record-warning condition)))))
                        (mapcar (lambda (value) (print-value value max-output :length print-length
                                                                                  :level print-level))
                                (read-and-evaluate code #'record-history))))
                    :debug debug)
                (setf final-package *package*)
                (setf (session-history session) (mapcar #'symbol-value *history-variables*))))))
      (values outcome final-package failed-condition))))

(define-entry (evaluate :caller :server) (code &key package session token (max-output 65536) debug (debug-timeout *debug-timeout*)
                           allow-exit (print-length *default-print-length*) (print-level *default-print-level*)
                           (handles t))
  "Evaluates CODE for the evaluate-lisp tool; with DEBUG, an error waits in the server's debugger
for DEBUG-TIMEOUT seconds at most; ALLOW-EXIT lets it end the image; values are printed with
PRINT-LENGTH and PRINT-LEVEL, and with HANDLES NIL get no handles. Returns a plist: :VALUES, a list of (text dropped [more offset
[handle]]), MORE the handle of the text cut from OFFSET on (or NIL) and HANDLE the value's own;
:STDOUT and :STDERR, as CAPTURE-REPORT gives them; :WARNINGS, the texts shown, :WARNINGS-DROPPED,
:WARNINGS-REST (see REST-LISTING) and :WARNINGS-LOST, how many were not kept;
:PACKAGE, the session's package afterwards; :NOTES; :ERROR, NIL or a report (:KIND :TYPE :CLASS
:MESSAGE :BACKTRACE)."
  (let* ((*max-output* max-output)
         (*handles* (and handles (session-handles session)))
         (*debug-timeout* debug-timeout)
         (*exit-allowed* allow-exit)
         (session (find-session session))
         (*agent-session* session)
         (*trace-log* (make-trace-log-for session))
         (stdout (make-capture max-output))
         (stderr (make-capture max-output))
         (warnings '())
         (warning-count 0))
    (flet ((record-warning (warning)
             (when (or *frame-evaluation*
                       (muffled-by-sbcl-p warning)
                       ;; SBCL signals a compile-time error again at each level of the compiler
                       ;; that passes it on: it is recorded once.
                       (member warning warnings :key #'car))
               (return-from record-warning))
             (incf warning-count)
             (when (<= warning-count *max-kept-warnings*)
               (push (cons warning (warning-text warning)) warnings))
             (let ((muffle (find-restart 'muffle-warning warning)))
               (when muffle (invoke-restart muffle)))))
      (multiple-value-bind (start-package note) (resolve-package package session)
        (multiple-value-bind (outcome final-package failed-condition)
            (if start-package
                (call-claiming-hooks
                 (lambda ()
                   (call-registered token
                                    (lambda (evaluation)
                                      (declare (ignore evaluation))
                                      (evaluate-in-session code session start-package max-output
                                                           stdout stderr #'record-warning debug
                                                           print-length print-level)))))
                (list :kind :error :type "PACKAGE-ERROR" :class "PACKAGE-ERROR"
                      :message (missing-package-message package)
                      :backtrace nil :restarts nil))
          (when (and final-package (not (eq final-package start-package)))
            (setf (session-package-name session) (package-name final-package)))
          (let ((succeeded (eq (first outcome) :ok))
                (texts (loop for (warning . text) in (reverse warnings)
                             unless (or (redundant-warning-p warning failed-condition)
                                        (defined-since-p warning))
                               collect text))
                (lost-warnings (max 0 (- warning-count *max-kept-warnings*))))
            (list :values (if succeeded (second outcome) nil)
                  :error (if succeeded nil outcome)
                  :stdout (capture-report stdout)
                  :stderr (capture-report stderr)
                  ;; The warnings shown, and how many more: the handle of every warning kept
                  ;; and the offset of the first not shown; and how many were not kept.
                  :warnings (subseq texts 0 (min (length texts) *max-warnings*))
                  :warnings-dropped (+ (max 0 (- (length texts) *max-warnings*)) lost-warnings)
                  :warnings-rest (rest-listing texts *max-warnings*)
                  :warnings-lost lost-warnings
                  :package (session-package-name session)
                  :notes (if note (list note) nil)
                  :trace (trace-report session)
                  :background (take-background session))))))))

(defun warning-text (warning)
  "WARNING as a reply's [warnings] line: its category and message."
  (format nil "~A: ~A"
          (if (compile-time-error-p warning) "ERROR" (warning-category warning))
          (condition-message warning)))

(defun compile-time-error-p (condition)
  "True for an error the compiler found in a form (SB-C:COMPILER-ERROR), such as a RETURN-FROM an
unknown block: SBCL reports it, compiles the form to signal it when run, and goes on."
  (let ((class (load-time-value (sbcl-symbol :compiler-error))))
    (and class (typep condition class))))

(defun defined-since-p (warning)
  "True for the compiler's \"undefined function: F\" style-warning when F is defined by the end
of the evaluation: by a later form of the same code, or while it waited in the debugger."
  (and (typep warning 'style-warning)
       (typep warning 'simple-condition)
       (let ((arguments (simple-condition-format-arguments warning)))
         (and (eq (first arguments) :function)
              (typep (second arguments) '(or symbol (cons (eql setf))))
              (fboundp (second arguments))))))

(defun redundant-warning-p (warning failure)
  "True for the compiler's \"undefined function: F\" style-warning when the call then failed
because F is undefined: the error already says so."
  (and (typep failure 'undefined-function)
       (typep warning 'style-warning)
       (typep warning 'simple-condition)
       (member (cell-error-name failure) (simple-condition-format-arguments warning) :test #'equal)))
