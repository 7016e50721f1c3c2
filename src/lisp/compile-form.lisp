;;;; The compile-form tool: compiles code without defining anything, and reports what the compiler
;;;; says at line and column.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; compile-form

(defparameter *error-context-access*
  (let ((symbols (sbcl-symbols :find-error-context :compiler-error-context-original-source-path)))
    (and (= (length symbols) 2) (every #'fboundp symbols) symbols))
  "SBCL's accessors of the compiler's current source context, when this SBCL has them.")

(defun compiler-source-path ()
  "The path from the compiled lambda to the subform the compiler is reporting on, as indices
from the outside in, if the compiler knows it."
  (when *error-context-access*
    (ignore-errors
     (let ((context (funcall (first *error-context-access*) nil)))
       ;; SBCL keeps the path innermost first, starting with the top-level form's number.
       (and context (rest (reverse (funcall (second *error-context-access*) context))))))))

(defun subform-position (form path positions)
  "The start of the innermost list along PATH in FORM whose position the reader recorded."
  (let ((best (gethash form positions)))
    (dolist (index path best)
      (let ((tail form))
        (loop repeat index while (consp tail) do (setf tail (cdr tail)))
        (unless (consp tail) (return best))
        (setf form (car tail))
        (let ((position (and (consp form) (gethash form positions))))
          (when position (setf best position)))))))

(defun compiler-message (condition)
  "The condition's report without SBCL's \"See also:\" manual references."
  (let ((references (sbcl-symbol :*print-condition-references*)))
    (progv (and references (list references)) '(nil)
      (string-trim '(#\Space #\Newline) (condition-message condition)))))

(defun condition-names (condition)
  "The names a deferred warning (undefined function F) is about, from its format arguments."
  (and (typep condition 'simple-condition)
       (remove-if-not (lambda (x) (or (and (symbolp x) x) (and (consp x) (eq (first x) 'setf))))
                      (simple-condition-format-arguments condition))))

(defun tree-contains-p (tree name)
  "Whether the symbol NAME (or the symbol of a (SETF NAME) name) occurs in TREE."
  (let ((symbol (if (consp name) (second name) name)))
    (map-symbols (lambda (s) (when (eq s symbol) (return-from tree-contains-p t))) tree)
    nil))

;;; One compilation: the code, what the reader recorded of it, and what compiling it found so
;;; far. DEFCLASS, not DEFSTRUCT, so that reloading the helper redefines it harmlessly.
(defclass compilation ()
  ((code :initarg :code :reader compilation-code)
   (positions :initform (make-hash-table :test 'eq) :reader compilation-positions
              :documentation "List -> where it starts in the code, as the reader saw it.")
   (conditions :initform '() :accessor compilation-conditions
               :documentation "Plists (:SEVERITY :MESSAGE :FORM :LINE :COLUMN), newest first.")
   (compiled :initform '() :accessor compiled-entries
             :documentation "(form start prefix) of each form compiled, newest first.")
   (current :initform nil :accessor current-entry
            :documentation "The entry being compiled: a condition now is about it.")
   (last-condition :initform nil :accessor last-condition)
   (read-failure :initform nil :accessor read-failure-report)
   (macros :initform '() :accessor code-macros
           :documentation "MACROLET bindings for the code's DEFMACROs so far.")
   (specials :initform '() :accessor code-specials
             :documentation "The variables the code's DEFVARs and DEFPARAMETERs so far proclaim.")))

(defun condition-place (compilation condition)
  "The top-level form a condition is about, and where in the code."
  (let ((path (compiler-source-path))
        (entry (or (current-entry compilation)
                   ;; A deferred warning (undefined function) comes at the end of the unit: find
                   ;; the first form that mentions the name.
                   (let ((names (condition-names condition)))
                     (find-if (lambda (entry)
                                (some (lambda (name) (tree-contains-p (first entry) name)) names))
                              (reverse (compiled-entries compilation)))))))
    (when entry
      (destructuring-bind (form start prefix) entry
        (values form
                (if (and path (<= (length prefix) (length path))
                         (equal prefix (subseq path 0 (length prefix))))
                    (or (subform-position form (nthcdr (length prefix) path) (compilation-positions compilation))
                        start)
                    start))))))

(defun record-condition (compilation severity condition)
  (unless (eq condition (last-condition compilation))
    (setf (last-condition compilation) condition)
    (multiple-value-bind (form position) (condition-place compilation condition)
      (multiple-value-bind (line column) (and position (line-and-column (compilation-code compilation) position))
        (push (list :severity severity
                    :message (compiler-message condition)
                    :form (and form (print-form-briefly form))
                    :line line :column column)
              (compilation-conditions compilation))))))

(defun wrap-form (compilation form)
  "FORM as a lambda to compile, inside the code's earlier macros and special variables. Returns
the lambda and the path from it to FORM."
  (let ((body form) (prefix '()))
    (when (code-specials compilation)
      (setf body `(locally (declare (special ,@(code-specials compilation))) ,body))
      (push 2 prefix))
    (when (code-macros compilation)
      (setf body `(macrolet ,(code-macros compilation) ,body))
      (push 2 prefix))
    (values `(lambda () ,body) (cons 2 prefix))))

(defun note-effects (compilation form)
  "Takes from FORM what a file compiler would for the forms after it."
  (when (consp form)
    (case (first form)
      (in-package
       (let ((target (and (typep (second form) '(or string symbol character))
                          (find-package (string (second form))))))
         (if target
             (progn (setf *package* target) (note-package target))
             (let ((*package* *package*))
               (record-condition
                compilation "ERROR"
                (make-condition 'simple-error
                                :format-control "The package ~A does not exist: the forms after this IN-PACKAGE are read in ~A. (compile-form defines nothing, so a DEFPACKAGE in the same code does not create it.)"
                                :format-arguments (list (second form) (package-name *package*))))))))
      (defmacro
       (when (and (symbolp (second form)) (listp (third form)))
         (push (rest form) (code-macros compilation))))
      ((defvar defparameter)
       (when (symbolp (second form))
         (push (second form) (code-specials compilation)))))))

(defun compile-one-form (compilation form start)
  "Compiles FORM, read at START, recording what the compiler says about it."
  (multiple-value-bind (lambda prefix) (wrap-form compilation form)
    (setf (current-entry compilation)
          (list form (or (gethash form (compilation-positions compilation)) start) prefix))
    (handler-case (let ((neutral (neutralize lambda)))
                    (if (circular-code-p neutral)
                        (record-condition compilation "ERROR" (make-condition 'circular-code :form form))
                        (compile nil neutral)))
      ;; Errors the compiler did not turn into an ERROR condition itself, such as a package
      ;; lock violation.
      (error (e) (record-condition compilation "ERROR" e)))
    (note-effects compilation form)
    (push (current-entry compilation) (compiled-entries compilation))
    (setf (current-entry compilation) nil)))

(defun call-recording-conditions (compilation function)
  "Calls FUNCTION, recording every compiler condition it causes into COMPILATION."
  (let ((compiler-error (needed-internal :compiler-error))
        (encapsulated (needed-internal :encapsulated-condition)))
   (flet ((record (severity condition) (record-condition compilation severity condition)))
    (handler-bind ((condition
                     (lambda (c)
                       (when (typep c compiler-error)
                         (record "ERROR" (funcall encapsulated c)))))
                   (sb-ext:compiler-note
                     (lambda (c) (record "NOTE" c)))
                   (warning
                     (lambda (c)
                       (unless (muffled-by-sbcl-p c)
                         (record (if (typep c 'style-warning) "STYLE-WARNING" "WARNING") c)))))
      (funcall function)))))

(defun compilation-report (compilation)
  "The plist COMPILE-CODE describes, conditions in the order of the code."
  (let ((conditions (stable-sort (reverse (compilation-conditions compilation)) #'<
                                 :key (lambda (c) (+ (* 1000000 (or (getf c :line) 0)) (or (getf c :column) 0))))))
    (flet ((count-of (severity) (count severity conditions :key (lambda (c) (getf c :severity)) :test #'string=)))
      (list :forms-compiled (length (compiled-entries compilation))
            :warnings (count-of "WARNING")
            :errors (count-of "ERROR")
            :style-warnings (count-of "STYLE-WARNING")
            :notes (count-of "NOTE")
            :conditions conditions
            :read-error (read-failure-report compilation)))))

(defun refusal-recorder (compilation)
  "The *REFUSAL-RECORDER* of COMPILATION: each refused form is a warning, once (the compiler may
expand a form more than once), since the code may well be right but that part went unchecked."
  (let ((refused (make-hash-table :test 'eq)))
    (lambda (refusal form)
      (unless (gethash form refused)
        (setf (gethash form refused) t)
        (record-condition compilation "WARNING" refusal)))))

(defun compile-forms (code package)
  "Reads CODE in PACKAGE and compiles each form as (LAMBDA () FORM), in one compilation unit.
Earlier DEFMACROs and IN-PACKAGEs of the code apply to the forms after them, as in a file, but
only within the call. Returns the plist COMPILE-CODE describes."
  (let ((compilation (make-instance 'compilation :code code))
        (eof '#:eof))
    (running-no-request-code
      (leaving-image-unchanged (code package)
        (let ((*package* package)
              (*readtable* (position-recording-readtable (compilation-positions compilation)))
              (*refusal-recorder* (refusal-recorder compilation)))
          ;; Outside the unit, to see the warnings it defers to its end.
          (call-recording-conditions
           compilation
           (lambda ()
             (with-compilation-unit (:override t)
               (with-input-from-string (in code)
                 (loop
                   (let* ((start (skip-layout code (file-position in)))
                          (form (handler-case (read in nil eof)
                                  (error (e)
                                    (setf (read-failure-report compilation)
                                          (read-failure e code start (file-position in)))
                                    (return)))))
                     (when (eq form eof) (return))
                     (remember-form form)
                     (note-request-code form)
                     (compile-one-form compilation form start))))))))))
    (compilation-report compilation)))

(define-entry (compile-code :caller :server) (code &key package session token (max-output 65536))
  "Compiles CODE for the compile-form tool without running or defining anything. Returns a
plist: :FORMS-COMPILED; the counts :WARNINGS :ERRORS :STYLE-WARNINGS :NOTES; :CONDITIONS, each
(:SEVERITY :MESSAGE :FORM :LINE :COLUMN); :READ-ERROR, NIL or (:MESSAGE :LINE :COLUMN
:UNCLOSED); :STDOUT, what macros printed while expanding, as (text dropped)."
  (let ((stdout (make-capture max-output))
        (*max-output* max-output)
        (*handles* (session-handles session)))
    (let ((result (run-tool token
                            (lambda () (compile-forms code (tool-package package session)))
                            :stdout stdout)))
      (if (getf result :forms-compiled)
          (append result (list :stdout (capture-report stdout)))
          result))))
