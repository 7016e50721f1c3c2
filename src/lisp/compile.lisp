;;;; compile-form and macroexpand-form: both read the user's code and neither may change the
;;;; image. Reading interns symbols and compiling a DEFUN notes the name as defined in SBCL's
;;;; global database, so both tools record what was there before and put it back afterwards.
;;;;
;;;; Loaded after introspection.lisp, under the same rules.

(in-package #:mcp-agent-helper)

(eval-when (:compile-toplevel :load-toplevel :execute)
  (require :sb-cltl2))

;;; ------------------------------------------------------------------------------------------
;;; Leaving the image as it was

(defvar *symbol-snapshots* '()
  "Per call: (package . set of the symbols present in it before anything was read), for each
package reading may intern into.")

(defvar *info-snapshots* nil
  "Per call: symbol -> its global function information before anything was compiled.")

(defvar *forms-read* '()
  "Per call: the forms read from the user's code.")

(defun present-symbols (package)
  (let ((set (make-hash-table :test 'eq)))
    (with-package-iterator (next package :internal :external)
      (loop (multiple-value-bind (more symbol) (next)
              (unless more (return))
              (setf (gethash symbol set) t))))
    set))

(defun note-package (package)
  "Remembers PACKAGE's symbols before the code is read in it."
  (unless (assoc package *symbol-snapshots*)
    (push (cons package (present-symbols package)) *symbol-snapshots*)))

(defun code-delimiter-p (char)
  (or (member char '(#\Space #\Tab #\Newline #\Return #\Page))
      (find char "()'`,\";#")))

(defun qualified-packages (code)
  "The existing packages CODE names in pkg::name tokens: reading those interns into them."
  (let ((packages '()) (start 0))
    (loop for colons = (search "::" code :start2 start)
          while colons
          do (let* ((token-start (1+ (or (position-if #'code-delimiter-p code :end colons :from-end t) -1)))
                    (package (and (< token-start colons)
                                  (find-package-loosely (subseq code token-start colons)))))
               (when package (push package packages))
               (setf start (+ colons 2))))
    packages))

(defun map-symbols (function object)
  "Calls FUNCTION on every symbol in OBJECT, a form: conses (circular ones included) and vectors."
  (let ((seen (make-hash-table :test 'eq)))
    (labels ((walk (x)
               (loop
                 (typecase x
                   (symbol (when x (funcall function x)) (return))
                   (cons (when (gethash x seen) (return))
                         (setf (gethash x seen) t)
                         (walk (car x))
                         (setf x (cdr x)))
                   (simple-vector
                    (when (gethash x seen) (return))
                    (setf (gethash x seen) t)
                    (map nil #'walk x)
                    (return))
                   (t (return))))))
      (walk object))))

(defparameter *symbol-info-access*
  (let ((symbols (append (existing-symbols "SB-KERNEL" "SYMBOL-%INFO")
                         (existing-symbols "SB-INT" "UPDATE-SYMBOL-INFO" "+NIL-PACKED-INFOS+"))))
    (and (= (length symbols) 3)
         (fboundp (first symbols)) (fboundp (second symbols)) (boundp (third symbols))
         symbols))
  "SBCL's accessors of a symbol's global information (function kind, type, where defined), when
this SBCL has them; without them the information is not restored.")

(defun packed-info (symbol)
  (let ((info (funcall (first *symbol-info-access*) symbol)))
    ;; The cell holds the property list and the packed information: (plist . info), or the
    ;; information alone when there is no property list.
    (cond ((consp info) (cdr info))
          ((listp info) nil)
          (t info))))

(defun remember-form (form)
  "Records FORM as read, and the global function information of its symbols before it is
compiled."
  (push form *forms-read*)
  (when *symbol-info-access*
    (map-symbols (lambda (symbol)
                   (unless (nth-value 1 (gethash symbol *info-snapshots*))
                     (setf (gethash symbol *info-snapshots*)
                           (list (packed-info symbol) (fboundp symbol)))))
                 form)))

(defun restore-function-info ()
  "Puts back the information the compiler noted about the names in the code (a DEFUN marks its
name as defined; a call marks the callee's assumed type), unless the function was really
defined or undefined meanwhile, by someone else."
  (when *symbol-info-access*
    (destructuring-bind (get update empty) *symbol-info-access*
      (declare (ignore get))
      (maphash (lambda (symbol snapshot)
                 (destructuring-bind (info fbound) snapshot
                   (when (and (not (eq info (packed-info symbol)))
                              (eq fbound (fboundp symbol)))
                     (funcall update symbol (lambda (current)
                                              (declare (ignore current))
                                              (or info (symbol-value empty)))))))
               *info-snapshots*))))

(defun inert-symbol-p (symbol)
  "True when nothing refers to SYMBOL's definitions: it names nothing and has no properties. (A
keyword's value is itself, which says nothing.)"
  (not (or (fboundp symbol) (fboundp (list 'setf symbol)) (symbol-plist symbol) (find-class symbol nil)
           (internal-call "SB-INT" "INFO" :type :kind symbol)
           (and (not (keywordp symbol))
                (or (boundp symbol)
                    (not (eq :unknown (internal-call "SB-INT" "INFO" :variable :kind symbol))))))))

(defun forget-new-symbols ()
  "Uninterns the symbols that reading the code created, so that asking about code never leaves
names behind (a stray symbol can later clash with an imported one)."
  (dolist (form *forms-read*)
    (map-symbols (lambda (symbol)
                   (let* ((home (symbol-package symbol))
                          (before (cdr (assoc home *symbol-snapshots*))))
                     (when (and before (not (gethash symbol before)) (inert-symbol-p symbol))
                       (unintern symbol home))))
                 form)))

(defun call-leaving-image-unchanged (code package function)
  (let ((*symbol-snapshots* '())
        (*info-snapshots* (make-hash-table :test 'eq))
        (*forms-read* '()))
    (note-package package)
    (note-package (find-package '#:keyword))
    (mapc #'note-package (qualified-packages code))
    (unwind-protect (funcall function)
      (restore-function-info)
      (forget-new-symbols))))

(defmacro leaving-image-unchanged ((code package) &body body)
  "Runs BODY, which reads CODE in PACKAGE (calling REMEMBER-FORM on each form it reads) and may
compile it, then undoes what reading and compiling changed in the image."
  `(call-leaving-image-unchanged ,code ,package (lambda () ,@body)))

;;; ------------------------------------------------------------------------------------------
;;; Running none of the request's code
;;;
;;; Compiling with COMPILE runs no DEFUN, DEFTYPE or EVAL-WHEN body (none is at top level), and
;;; *READ-EVAL* is off while reading; what would still run is a macro's expander, since the
;;; compiler calls it. The image's own macros may expand, but an expander whose code came with
;;; the request (a MACROLET, or a DEFMACRO that later forms see as one) is replaced by a stub
;;; before anything compiles it: compiling the real one would already evaluate any
;;; LOAD-TIME-VALUE in it, and calling it would run the rest.

(defvar *request-conses* nil
  "Per call: the conses of the forms read from the request (an EQ set). A local macro whose
definition holds one of them carries the request's code, even when an image macro wrote the
MACROLET around it.")

(defvar *disarmed-definitions* nil
  "Per call: stub definition -> the request's definition it stands for, to show expansions as
the user wrote them.")

(defvar *refusal* nil
  "The REQUEST-MACRO-REFUSED just signalled, until the compiler's report of it is recorded.")

(define-condition request-macro-refused (error)
  ((form :initarg :form :reader refused-form))
  (:report (lambda (condition stream)
             (let ((form (refused-form condition)))
               (format stream "~A was not expanded: ~S is a macro that this code itself defines ~
                               (with DEFMACRO or MACROLET), and compile-form and macroexpand-form ~
                               never run a macro from the request, since expanding it would run its ~
                               code in the image. Define the macro in the image first (evaluate-lisp ~
                               or load its file), then check the code that uses it."
                       (print-form-briefly form) (first form))))))

(defun refuse-request-macro (form)
  "The body of every stub: says which macro call could not be expanded, and why."
  (error (setf *refusal* (make-condition 'request-macro-refused :form form))))

(defun note-request-code (form)
  "Records FORM's conses as the request's."
  (let ((seen *request-conses*))
    (labels ((walk (x)
               (loop while (and (consp x) (not (gethash x seen)))
                     do (setf (gethash x seen) t)
                        (walk (car x))
                        (setf x (cdr x)))))
      (walk form))))

(defun holds-request-code-p (tree)
  (let ((seen (make-hash-table :test 'eq)))
    (labels ((walk (x)
               (loop while (and (consp x) (not (gethash x seen)))
                     do (when (gethash x *request-conses*)
                          (return-from holds-request-code-p t))
                        (setf (gethash x seen) t)
                        (walk (car x))
                        (setf x (cdr x)))))
      (walk tree)
      nil)))

(defun stub-definition (definition)
  "DEFINITION, a MACROLET binding (NAME LAMBDA-LIST . BODY), or a stub for it when its code is
the request's."
  (if (and (consp definition) (symbolp (first definition)) (holds-request-code-p definition))
      (let* ((form (make-symbol "FORM"))
             (arguments (make-symbol "ARGUMENTS"))
             (stub `(,(first definition) (&whole ,form &rest ,arguments)
                     (declare (ignore ,arguments))
                     (refuse-request-macro ,form))))
        (setf (gethash stub *disarmed-definitions*) definition)
        stub)
      definition))

(defun map-sharing (function list)
  "LIST with FUNCTION applied to each element (a dotted tail included), sharing LIST's conses
where nothing changed. A cycle along the list is left as it is."
  (let ((items '()) (tail list) (spine (make-hash-table :test 'eq)))
    (loop while (and (consp tail) (not (gethash tail spine)))
          do (setf (gethash tail spine) t)
             (push (funcall function (car tail)) items)
             (setf tail (cdr tail)))
    (let* ((new-tail (if (consp tail) tail (funcall function tail)))
           (result new-tail))
      ;; Rebuild from the end, reusing each original cons whose element and rest are unchanged.
      (let ((originals '()))
        (loop for cons = list then (cdr cons)
              repeat (length items)
              do (push cons originals))
        (loop for item in items
              for original in originals
              do (setf result (if (and (eq item (car original)) (eq result (cdr original)))
                                  original
                                  (cons item result)))))
      result)))

(defun disarm (tree)
  "TREE with the request's local macro definitions replaced by stubs (see above)."
  (let ((done (make-hash-table :test 'eq)))
    (labels ((walk (x)
               (cond ((atom x) x)
                     ((nth-value 1 (gethash x done)) (gethash x done))
                     (t
                      ;; A cons met again (shared or circular) stands for itself meanwhile.
                      (setf (gethash x done) x)
                      (setf (gethash x done)
                            (if (and (eq (first x) 'macrolet) (consp (rest x)) (listp (second x)))
                                (let ((definitions (map-sharing #'stub-definition (second x)))
                                      (body (map-sharing #'walk (cddr x))))
                                  (if (and (eq definitions (second x)) (eq body (cddr x)))
                                      x
                                      (list* 'macrolet definitions body)))
                                (map-sharing #'walk x)))))))
      (walk tree))))

(defun rearm (tree)
  "TREE, an expansion of disarmed code, with the stubs shown as the definitions they replaced."
  (if (zerop (hash-table-count *disarmed-definitions*))
      tree
      (let ((done (make-hash-table :test 'eq)))
        (labels ((walk (x)
                   (cond ((atom x) x)
                         ((nth-value 1 (gethash x *disarmed-definitions*)) (gethash x *disarmed-definitions*))
                         ((nth-value 1 (gethash x done)) (gethash x done))
                         (t (setf (gethash x done) x)
                            (setf (gethash x done) (map-sharing #'walk x))))))
          (walk tree)))))

(defun disarming-expansion-hook (expander form environment)
  "The macroexpand hook of compile-form and macroexpand-form: an image macro's expansion may wrap
request code in a MACROLET of its own, so every expansion is disarmed too."
  (disarm (funcall expander form environment)))

(defun call-running-no-request-code (function)
  (let ((*request-conses* (make-hash-table :test 'eq))
        (*disarmed-definitions* (make-hash-table :test 'eq))
        (*refusal* nil)
        (*macroexpand-hook* 'disarming-expansion-hook)
        (*read-eval* nil))
    (funcall function)))

(defmacro running-no-request-code (&body body)
  "Runs BODY, which reads the request's code (calling NOTE-REQUEST-CODE on each form it reads)
and DISARMs it before compiling or expanding it."
  `(call-running-no-request-code (lambda () ,@body)))

;;; ------------------------------------------------------------------------------------------
;;; Reading the user's code

(defun position-recording-readtable (positions)
  "A copy of the current readtable whose ( also records in POSITIONS (an EQ table) where each
list starts in the code, so that conditions can be placed at the subform they are about."
  (let* ((readtable (copy-readtable *readtable*))
         (open (get-macro-character #\( readtable)))
    (set-macro-character #\(
                         (lambda (stream char)
                           (let* ((start (1- (file-position stream)))
                                  (list (funcall open stream char)))
                             (when (consp list)
                               (setf (gethash list positions) start))
                             list))
                         nil readtable)
    readtable))

(defun read-failure (condition code form-start stream-position)
  "Why and where the code could not be read: a plist (:MESSAGE :LINE :COLUMN :UNCLOSED). An
unclosed form is placed at its start; other errors where the reader stopped."
  (let* ((unclosed (typep condition 'end-of-file))
         (position (if unclosed
                       form-start
                       (max form-start (min (1- stream-position) (1- (length code)))))))
    (multiple-value-bind (line column) (line-and-column code (max 0 position))
      (list :message (if unclosed
                         ;; The contract's wording; SBCL would name a stream the user never saw.
                         "end of file on #<STRING-INPUT-STREAM>"
                         (if (typep condition 'reader-error)
                             (reader-error-text condition)
                             (condition-message condition)))
            :line line :column column :unclosed unclosed))))

;;; ------------------------------------------------------------------------------------------
;;; compile-form

(defparameter *error-context-access*
  (let ((symbols (existing-symbols "SB-C" "FIND-ERROR-CONTEXT" "COMPILER-ERROR-CONTEXT-ORIGINAL-SOURCE-PATH")))
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
  (let ((references (find-symbol "*PRINT-CONDITION-REFERENCES*" "SB-INT")))
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

(defun without-load-time-values (lambda)
  "LAMBDA, or, when any LOAD-TIME-VALUE is in its expansion, that expansion with each
(LOAD-TIME-VALUE FORM) turned into (PROGN FORM): COMPILE evaluates LOAD-TIME-VALUE forms at
once, and compile-form must run nothing. The expansion tolerates macros that fail (the compiler
reports those when it compiles LAMBDA itself). Returns the lambda to compile and the expansion,
whose symbols include those the macros interned."
  (let* ((found nil)
         (expansion (let ((*macroexpand-hook*
                            (lambda (expander form environment)
                              ;; A refusal here is only reported when the lambda is compiled.
                              (let ((*refusal* nil))
                                (handler-case (disarming-expansion-hook expander form environment)
                                  (error () '(progn)))))))
                      (handler-case (sb-cltl2:macroexpand-all lambda)
                        (error () lambda)))))
    (labels ((strip (x)
               (cond ((atom x) x)
                     ((eq (first x) 'load-time-value)
                      (setf found t)
                      (list 'progn (strip (second x))))
                     (t (let ((tail x) (out '()))
                          (loop while (consp tail)
                                do (push (strip (car tail)) out)
                                   (setf tail (cdr tail)))
                          (let ((result (nreverse out)))
                            (when tail (setf (cdr (last result)) tail))
                            result))))))
      (let ((stripped (if (circular-p expansion) expansion (strip expansion))))
        (values (if found stripped lambda) expansion)))))

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
    (handler-case (multiple-value-bind (compilable expansion) (without-load-time-values (disarm lambda))
                    ;; DEFSTRUCT and the like intern names as they expand.
                    (remember-form expansion)
                    (compile nil compilable))
      ;; Errors the compiler did not turn into an ERROR condition itself, such as a package
      ;; lock violation.
      (error (e) (record-condition compilation "ERROR" e)))
    (note-effects compilation form)
    (push (current-entry compilation) (compiled-entries compilation))
    (setf (current-entry compilation) nil)))

(defun call-recording-conditions (compilation function)
  "Calls FUNCTION, recording every compiler condition it causes into COMPILATION."
  (let ((compiler-error (sbcl-internal "SB-C" "COMPILER-ERROR"))
        (encapsulated (sbcl-internal "SB-INT" "ENCAPSULATED-CONDITION")))
   (flet ((record (severity condition) (record-condition compilation severity condition)))
    (handler-bind ((condition
                     (lambda (c)
                       (when (typep c compiler-error)
                         ;; A stub's refusal is a warning: the code may well be right, but its
                         ;; uses of the macro were not checked.
                         (if *refusal*
                             (record "WARNING" (shiftf *refusal* nil))
                             (record "ERROR" (funcall encapsulated c))))))
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

(defun compile-forms (code package)
  "Reads CODE in PACKAGE and compiles each form as (LAMBDA () FORM), in one compilation unit.
Earlier DEFMACROs and IN-PACKAGEs of the code apply to the forms after them, as in a file, but
only within the call. Returns the plist COMPILE-CODE describes."
  (let ((compilation (make-instance 'compilation :code code))
        (eof '#:eof))
    (running-no-request-code
      (leaving-image-unchanged (code package)
        (let ((*package* package)
              (*readtable* (position-recording-readtable (compilation-positions compilation))))
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

(defun compile-code (code &key package session token (max-output 65536))
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

;;; ------------------------------------------------------------------------------------------
;;; macroexpand-form

(defun circular-p (object)
  "True when OBJECT, a form, contains itself. (Shared structure is not circular.)"
  (let ((on-path (make-hash-table :test 'eq))
        (done (make-hash-table :test 'eq)))
    (labels ((walk (x)
               (let ((chain '()))
                 (loop while (and (consp x) (not (gethash x done)))
                       do (when (gethash x on-path) (return-from circular-p t))
                          (setf (gethash x on-path) t)
                          (push x chain)
                          (walk (car x))
                          (setf x (cdr x)))
                 (dolist (cons chain)
                   (remhash cons on-path)
                   (setf (gethash cons done) t)))))
      (walk object)
      nil)))

(defun read-single-form (text)
  "The one form in TEXT, or NIL and a message saying why it could not be read."
  (let ((eof '#:eof)
        (*read-eval* nil))
    (with-input-from-string (in text)
      (let* ((start (skip-layout text 0))
             (form (handler-case (read in nil eof)
                     (error (e)
                       (return-from read-single-form
                         (values nil (getf (read-failure e text start (file-position in)) :message)))))))
        (when (eq form eof)
          (return-from read-single-form (values nil "there is no form to expand")))
        (remember-form form)
        (let ((next (skip-layout text (file-position in))))
          (when (< next (length text))
            (multiple-value-bind (line column) (line-and-column text next)
              (return-from read-single-form
                (values nil (format nil "expected one form, but more follows at line ~D, column ~D"
                                    line column))))))
        form))))

(defun macro-error-report (condition)
  "The contract's [ERROR] TYPE block for a macro that signalled: the condition's exact type as
the user would type it, and its message; the macro's internals are no backtrace worth reading."
  (let ((report (condition-report :error condition nil)))
    (setf (getf report :type)
          (let ((*package* (find-package '#:common-lisp-user)))
            (prin1-to-string (type-of condition))))
    report))

(defun expansion-report (form full max-output)
  "The plist EXPAND-FORM returns for FORM, read."
  (multiple-value-bind (expansion expanded)
      (handler-case (let ((disarmed (disarm form)))
                      (if full
                          (let ((expansion (rearm (sb-cltl2:macroexpand-all disarmed))))
                            (values expansion (not (equal expansion form))))
                          (multiple-value-bind (expansion expanded) (macroexpand-1 disarmed)
                            (values (rearm expansion) expanded))))
        (error (e)
          (return-from expansion-report (list :error (macro-error-report e)))))
    (let ((output (make-capture max-output :tail nil)))
      (let ((*print-case* :downcase) (*print-pretty* t)
            (*print-circle* (circular-p expansion))
            (*print-readably* nil) (*print-length* nil) (*print-level* nil)
            (*print-lines* nil) (*print-right-margin* nil))
        (prin1 expansion output))
      (list :form (let ((*print-case* :upcase)) (print-form-briefly form))
            :expansion (capture-report output)
            :expanded (and expanded t)))))

(defun expand-form (text &key full package session token (max-output 65536))
  "Expands the form TEXT for the macroexpand-form tool: one step (MACROEXPAND-1), or every macro
anywhere in it when FULL. Returns (:FORM header-text :EXPANSION (text dropped) :EXPANDED bool),
(:READ-ERROR message), or (:ERROR report) when the macro signalled."
  (let ((*max-output* max-output)
        (*handles* (session-handles session)))
   (run-tool token
            (lambda ()
              (let ((package (tool-package package session)))
                (running-no-request-code
                  (leaving-image-unchanged (text package)
                    (let ((*package* package))
                      (multiple-value-bind (form read-error) (read-single-form text)
                        (if read-error
                            (list :read-error read-error)
                            (progn (note-request-code form)
                                   (expansion-report form full max-output))))))))))))
