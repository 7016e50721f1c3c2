;;;; compile-form and macroexpand-form: both read the user's code and neither may change the
;;;; image. Reading interns symbols and compiling a DEFUN notes the name as defined in SBCL's
;;;; global database, so both tools record what was there before and put it back afterwards.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; The parts of a form

(defun graph-node-p (x)
  "Whether X is a part of a form that holds other objects: a cons, or an array of element type
T (a vector literal, or an array a macro put in its expansion)."
  (or (consp x)
      (and (arrayp x) (eq (array-element-type x) t))))

(defun map-children (function node)
  "Calls FUNCTION on each object NODE (see GRAPH-NODE-P) holds."
  (if (consp node)
      (progn (funcall function (car node))
             (funcall function (cdr node)))
      (dotimes (i (array-total-size node))
        (funcall function (row-major-aref node i)))))

(defun graph-nodes (tree)
  "The conses and arrays reachable from TREE, each once, however shared or circular."
  (let ((seen (make-hash-table :test 'eq))
        (nodes '())
        (stack (list tree)))
    (loop while stack
          do (let ((x (pop stack)))
               (when (and (graph-node-p x) (not (gethash x seen)))
                 (setf (gethash x seen) t)
                 (push x nodes)
                 (map-children (lambda (child) (when (graph-node-p child) (push child stack))) x))))
    nodes))

(defun map-symbols (function object)
  "Calls FUNCTION on every symbol but NIL in OBJECT, a form: in its conses and arrays, however
shared or circular."
  (flet ((visit (x) (when (and x (symbolp x)) (funcall function x))))
    (visit object)
    (dolist (node (graph-nodes object))
      (map-children #'visit node))))

(defun list-elements (list)
  "The elements of LIST up to its end, a dotted tail or the first cons met again."
  (let ((seen (make-hash-table :test 'eq))
        (elements '()))
    (loop while (and (consp list) (not (gethash list seen)))
          do (setf (gethash list seen) t)
             (push (car list) elements)
             (setf list (cdr list)))
    (nreverse elements)))

(defvar *request-conses* nil
  "Per call: the conses of the forms read from the request (an EQ set). A local macro whose
definition holds one of them carries the request's code, even when an image macro wrote the
MACROLET around it.")

(defun rewrite-tree (tree target-p rebuild)
  "TREE with each cons for which TARGET-P is true replaced by a new cons that (FUNCALL REBUILD
CONS NEW REWRITTEN) fills in, REWRITTEN giving the rewritten version of any part of TREE. Only
the conses and arrays on a path to a replaced cons are copied, so that every cycle through one
goes through its replacement; the rest is TREE's own. Copies of the request's conses are the
request's too."
  (let* ((nodes (graph-nodes tree))
         (targets (remove-if-not (lambda (node) (and (consp node) (funcall target-p node))) nodes)))
    (if (null targets)
        tree
        (let ((targeted (make-hash-table :test 'eq))
              (parents (make-hash-table :test 'eq))
              (copies (make-hash-table :test 'eq)))
          (dolist (target targets)
            (setf (gethash target targeted) t))
          (dolist (node nodes)
            (map-children (lambda (child)
                            (when (graph-node-p child)
                              (push node (gethash child parents))))
                          node))
          (let ((pending targets))
            (loop while pending
                  do (let ((node (pop pending)))
                       (unless (gethash node copies)
                         (setf (gethash node copies)
                               (if (consp node) (cons nil nil) (make-array (array-dimensions node))))
                         (dolist (parent (gethash node parents))
                           (push parent pending))))))
          (flet ((rewritten (x) (or (gethash x copies) x)))
            (maphash (lambda (original copy)
                       (cond ((gethash original targeted)
                              (funcall rebuild original copy #'rewritten))
                             ((consp original)
                              (setf (car copy) (rewritten (car original))
                                    (cdr copy) (rewritten (cdr original))))
                             (t
                              (dotimes (i (array-total-size original))
                                (setf (row-major-aref copy i) (rewritten (row-major-aref original i))))))
                       (when (and *request-conses* (consp original) (gethash original *request-conses*))
                         (setf (gethash copy *request-conses*) t)))
                     copies)
            (rewritten tree))))))

;;; ------------------------------------------------------------------------------------------
;;; Leaving the image as it was

(defvar *symbol-snapshots* '()
  "Per call: (package . set of the symbols present in it before anything was read), for each
package reading may intern into.")

(defvar *info-snapshots* nil
  "Per call: symbol -> its global function information before anything was compiled.")

(defvar *forms-read* '()
  "Per call: the forms read from the user's code, and the expansions of the macros in them.")

(defvar *expansion-failed* nil
  "Per call: true once a macro's expander signalled an error. It may have interned names before
(DEFSTRUCT interns MAKE-X before it finds that its :INCLUDE names no structure), which no
expansion holds.")

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

(defun without-escapes (text)
  "TEXT without the characters that escape others in a token, | and \\."
  (remove-if (lambda (c) (find c "|\\")) text))

(defun qualified-packages (code)
  "The existing packages CODE names in pkg::name tokens (through the current package's local
nicknames too): reading those interns into them."
  (let ((packages '()) (start 0))
    (loop for colons = (search "::" code :start2 start)
          while colons
          do (let* ((token-start (1+ (or (position-if #'code-delimiter-p code :end colons :from-end t) -1)))
                    (package (and (< token-start colons)
                                  (find-package-loosely (without-escapes (subseq code token-start colons))))))
               (when package (push package packages))
               (setf start (+ colons 2))))
    packages))

(defparameter *symbol-info-access*
  (let ((symbols (append (sbcl-symbols :symbol-%info)
                         (sbcl-symbols :update-symbol-info :+nil-packed-infos+))))
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
  "Records FORM as read (or as a macro's expansion), and the global function information of its
symbols before it is compiled."
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
           (sbcl-call :info :type :kind symbol)
           (and (not (keywordp symbol))
                (or (boundp symbol)
                    (not (eq :unknown (sbcl-call :info :variable :kind symbol))))))))

(defun forget-new-symbols (code)
  "Uninterns the symbols that reading CODE and expanding its macros created, so that asking about
code never leaves names behind (a stray symbol can later clash with an imported one): those in
the forms read and their expansions, and those a read that failed part-way (or a feature
expression) interned: a symbol new in a package reading could intern into, whose name CODE
spells, or any such symbol once an expansion failed part-way. (Not every new symbol in every
call: another thread may be interning meanwhile.)"
  (flet ((forget (symbol)
           (let* ((home (symbol-package symbol))
                  (before (cdr (assoc home *symbol-snapshots*))))
             (when (and before (not (gethash symbol before)) (inert-symbol-p symbol))
               (unintern symbol home)))))
    (dolist (form *forms-read*)
      (map-symbols #'forget form))
    (let ((spelled (without-escapes code)))
      (loop for (package . before) in *symbol-snapshots*
            do (let ((new '()))
                 (with-package-iterator (next package :internal :external)
                   (loop (multiple-value-bind (more symbol) (next)
                           (unless more (return))
                           (unless (or (gethash symbol before) (not (eq (symbol-package symbol) package)))
                             (push symbol new)))))
                 (dolist (symbol new)
                   (when (or *expansion-failed* (search (symbol-name symbol) spelled :test #'char-equal))
                     (forget symbol))))))))

(defun call-leaving-image-unchanged (code package function)
  (sb-thread:with-recursive-lock (*unchanged-lock*)
    (let ((*symbol-snapshots* '())
          (*info-snapshots* (make-hash-table :test 'eq))
          (*forms-read* '())
          (*expansion-failed* nil))
      (note-package package)
      (note-package (find-package '#:keyword))
      (mapc #'note-package (let ((*package* package)) (qualified-packages code)))
      (unwind-protect (funcall function)
        (restore-function-info)
        (forget-new-symbols code)))))

(defmacro leaving-image-unchanged ((code package) &body body)
  "Runs BODY, which reads CODE in PACKAGE (calling REMEMBER-FORM on each form it reads) and may
compile it, then undoes what reading and compiling changed in the image."
  `(call-leaving-image-unchanged ,code ,package (lambda () ,@body)))

;;; ------------------------------------------------------------------------------------------
;;; Running none of the request's code
;;;
;;; What SBCL 2.2.9 evaluates while COMPILE compiles a lambda or MACROEXPAND-ALL walks a form
;;; (from its sources: compiler/ir1tran, ir1-translators, main, proclaim, constantp,
;;; code/typep, pcl/walk, pcl/defclass, contrib/sb-cltl2):
;;; - a macro's expander, as the compiler and the walker call it, and a MACROLET's definitions,
;;;   compiled as soon as the MACROLET is met;
;;; - LOAD-TIME-VALUE, which COMPILE evaluates at once (also when it compiles a MACROLET's
;;;   definition or a DEFMACRO's body that holds one);
;;; - SB-CLTL2:COMPILER-LET, whose bindings the compiler and the walker both evaluate;
;;; - the predicate of a SATISFIES type in a MUFFLE-CONDITIONS or UNMUFFLE-CONDITIONS
;;;   declaration, which the compiler calls on each condition it signals;
;;; - a DEFCLASS whose metaclass is a STRUCTURE-CLASS: the macro defines the class (and compiles
;;;   its slots' initforms) while it expands.
;;; Nothing else evaluates the request's code: a SATISFIES type elsewhere is only tried on a
;;; constant when its predicate is foldable (pure), constant folding calls only foldable
;;; functions, and EVAL-WHEN (:COMPILE-TOPLEVEL) acts only at top level, which nothing in a
;;; lambda given to COMPILE is, so DEFTYPE, DEFSETF, DEFINE-SETF-EXPANDER, DEFINE-COMPILER-MACRO,
;;; DEFINE-SYMBOL-MACRO, DEFCONSTANT, DEFGLOBAL, DEFSTRUCT, DECLAIM and the like define nothing
;;; while the code compiles. *READ-EVAL* is off while reading.
;;;
;;; The image's own macros may expand. Before the compiler or the walker sees any form, the
;;; request's or a macro's expansion (through *MACROEXPAND-HOOK*), NEUTRALIZE rewrites each of
;;; those wherever it is in it (its conses and arrays walked whole, however shared or
;;; circular): a MACROLET definition that holds the request's code (even one an image macro
;;; wrote around it) becomes a stub that never runs it; LOAD-TIME-VALUE becomes a function call,
;;; its form code to check; COMPILER-LET and such a DEFCLASS become macros that refuse them; a
;;; muffling declaration with a SATISFIES type in it is emptied. In compile-form a refused form
;;; is reported with a warning and compiled as a stand-in; in macroexpand-form it is an error.

(defvar *replacements* nil
  "Per call: each part NEUTRALIZE made that stands for a part of the form (a stub for a MACROLET
definition, an emptied declaration) -> that part, to show expansions as the user wrote them.")

(defparameter *stand-in-operators*
  '((load-time-value-at-run-time . load-time-value)
    (refused-compiler-let . sb-cltl2:compiler-let)
    (refused-defclass . defclass))
  "Operator NEUTRALIZE puts in place of another -> that other.")

(defvar *refusal-recorder* nil
  "In compile-form, a function of a REQUEST-CODE-REFUSED and the form refused that records the
refusal, the form then compiled as a stand-in (see UNEXPANDED-STAND-IN). In macroexpand-form,
NIL: a refusal is an error, as the expansion cannot go on.")

(define-condition request-code-refused (error)
  ((form :initarg :form :reader refused-form)))

(define-condition request-macro-refused (request-code-refused) ()
  (:report (lambda (condition stream)
             (let ((form (refused-form condition)))
               (format stream "~A was not expanded: ~S is a macro that this code itself defines ~
                               (with DEFMACRO or MACROLET), and compile-form and macroexpand-form ~
                               never run a macro from the request, since expanding it would run its ~
                               code in the image. Define the macro in the image first (evaluate-lisp ~
                               or load its file), then check the code that uses it."
                       (print-form-briefly form) (first form))))))

(define-condition compiler-let-refused (request-code-refused) ()
  (:report (lambda (condition stream)
             (format stream "~A was not compiled or expanded: SBCL evaluates the bindings of ~
                             SB-CLTL2:COMPILER-LET while it compiles or expands the form, and ~
                             compile-form and macroexpand-form never run the request's code."
                     (print-form-briefly (refused-form condition))))))

(define-condition structure-defclass-refused (request-code-refused) ()
  (:report (lambda (condition stream)
             (format stream "~A was not compiled or expanded: SBCL defines a class whose metaclass ~
                             is a STRUCTURE-CLASS while it expands its DEFCLASS, and compile-form ~
                             and macroexpand-form define nothing."
                     (print-form-briefly (refused-form condition))))))

(defun unexpanded-stand-in (form environment)
  "What compile-form compiles in place of FORM, a use of code it does not run: a call of unknown
result on the lexical variables and local functions FORM mentions, so that the compiler reports
none of them as unused and no code after FORM as unreachable, as it would not with FORM
expanded. Under a CAR, so that it is a place too (FORM may be one, in a SETF)."
  (let ((mentioned '()))
    (map-symbols (lambda (symbol)
                   (let ((reference
                           (cond ((eq (sb-cltl2:variable-information symbol environment) :lexical)
                                  symbol)
                                 ((multiple-value-bind (kind local) (sb-cltl2:function-information symbol environment)
                                    (and (eq kind :function) local))
                                  `(function ,symbol)))))
                     (when reference
                       (pushnew reference mentioned :test #'equal))))
                 (rest form))
    `(car (funcall (symbol-value ',(make-symbol "UNEXPANDED")) ,@(reverse mentioned)))))

(defun refuse (condition-type form environment &optional (shown form))
  "What a stub does with FORM, a use of code that must not run (SHOWN as the user wrote it): in
compile-form, record the refusal and give the stand-in; in macroexpand-form, signal it."
  (let ((refusal (make-condition condition-type :form shown)))
    (if *refusal-recorder*
        (progn (funcall *refusal-recorder* refusal form)
               (unexpanded-stand-in form environment))
        (error refusal))))

(defun refuse-request-macro (form environment)
  "The body of every stub of the request's macros."
  (refuse 'request-macro-refused form environment))

(defmacro refused-compiler-let (&whole form &environment environment &rest arguments)
  "What NEUTRALIZE puts in place of SB-CLTL2:COMPILER-LET."
  (declare (ignore arguments))
  (refuse 'compiler-let-refused form environment (cons 'sb-cltl2:compiler-let (rest form))))

(defmacro refused-defclass (&whole form &environment environment &rest arguments)
  "What NEUTRALIZE puts in place of a DEFCLASS whose metaclass is a STRUCTURE-CLASS."
  (declare (ignore arguments))
  (refuse 'structure-defclass-refused form environment (cons 'defclass (rest form))))

(defun load-time-value-at-run-time (form-value &optional read-only-p)
  "What NEUTRALIZE puts in place of LOAD-TIME-VALUE: a function, so that its form is compiled as
the code it is and nothing evaluates it while compiling."
  (declare (ignore read-only-p))
  form-value)

(defun note-request-code (form)
  "Records FORM's conses as the request's."
  (dolist (node (graph-nodes form))
    (when (consp node)
      (setf (gethash node *request-conses*) t))))

(defun holds-request-code-p (tree)
  (some (lambda (node) (gethash node *request-conses*)) (graph-nodes tree)))

(defun request-definition-p (definition)
  "Whether DEFINITION, a MACROLET binding (NAME LAMBDA-LIST . BODY), carries the request's code."
  (and (consp definition) (symbolp (car definition)) (holds-request-code-p definition)))

(defun structure-metaclass-p (options)
  "Whether the DEFCLASS OPTIONS name a metaclass that is a STRUCTURE-CLASS."
  (some (lambda (option)
          (and (consp option) (eq (car option) :metaclass) (consp (cdr option))
               (let ((metaclass (and (symbolp (cadr option)) (find-class (cadr option) nil))))
                 (and metaclass (subtypep metaclass 'structure-class)))))
        (list-elements options)))

(defun neutral-target-p (x)
  "Whether NEUTRALIZE replaces the cons X (see above)."
  (case (car x)
    (macrolet (and (consp (cdr x))
                   (some #'request-definition-p (list-elements (cadr x)))))
    ((load-time-value sb-cltl2:compiler-let) t)
    (defclass (let ((tail (cdr x)))
                (loop repeat 3 while (consp tail) do (setf tail (cdr tail)))
                (structure-metaclass-p tail)))
    ((sb-ext:muffle-conditions sb-ext:unmuffle-conditions)
     (map-symbols (lambda (symbol)
                    (when (eq symbol 'satisfies)
                      (return-from neutral-target-p t)))
                  (cdr x))
     nil)))

(defun stub-definition (definition)
  "A stub for DEFINITION, a MACROLET binding that carries the request's code."
  (let* ((form (make-symbol "FORM"))
         (environment (make-symbol "ENVIRONMENT"))
         (arguments (make-symbol "ARGUMENTS"))
         (stub `(,(car definition) (&whole ,form &environment ,environment &rest ,arguments)
                 (declare (ignore ,arguments))
                 (refuse-request-macro ,form ,environment))))
    (setf (gethash stub *replacements*) definition)
    stub))

(defun neutral-replacement (x new rewritten)
  "Fills NEW, the cons that replaces X in NEUTRALIZE's result."
  (case (car x)
    (macrolet
     (setf (car new) 'macrolet
           (cdr new) (cons (mapcar (lambda (definition)
                                     (if (request-definition-p definition)
                                         (stub-definition definition)
                                         (funcall rewritten definition)))
                                   (list-elements (cadr x)))
                           (funcall rewritten (cddr x)))))
    ((sb-ext:muffle-conditions sb-ext:unmuffle-conditions)
     (setf (car new) (car x)
           (cdr new) nil
           (gethash new *replacements*) x))
    (t
     (setf (car new) (car (rassoc (car x) *stand-in-operators*))
           (cdr new) (funcall rewritten (cdr x))))))

(defun neutralize (tree)
  "TREE with everything SBCL would evaluate while compiling or expanding it made inert (see
above)."
  (rewrite-tree tree #'neutral-target-p #'neutral-replacement))

(defun rearm (tree)
  "TREE, an expansion of neutralized code, as the user wrote it: stubs and emptied declarations
shown as what they replaced, stand-in operators as the operators they stand for."
  (rewrite-tree tree
                (lambda (x)
                  (or (nth-value 1 (gethash x *replacements*))
                      (assoc (car x) *stand-in-operators*)))
                (lambda (x new rewritten)
                  (multiple-value-bind (original replaced) (gethash x *replacements*)
                    (if replaced
                        (setf (car new) (car original)
                              (cdr new) (cdr original))
                        (setf (car new) (cdr (assoc (car x) *stand-in-operators*))
                              (cdr new) (funcall rewritten (cdr x))))))))

(define-condition circular-code (error)
  ((form :initarg :form :reader circular-form)
   (expansion-p :initarg :expansion-p :initform nil :reader circular-expansion-p))
  (:report (lambda (condition stream)
             (format stream "~A ~:[is~;expands into~] code that holds itself (a #1= ... #1# other ~
                             than in a quoted constant): compiling or expanding it would never end."
                     (print-form-briefly (circular-form condition)) (circular-expansion-p condition)))))

(defun circular-code-p (form)
  "True when FORM holds itself other than in a quoted constant: the compiler and the walker would
follow it until the stack runs out, which can take the image down."
  (let ((on-path (make-hash-table :test 'eq))
        (done (make-hash-table :test 'eq)))
    (labels ((walk (x)
               (when (and (consp x) (not (eq (car x) 'quote)))
                 (let ((chain '()))
                   (loop while (and (consp x) (not (gethash x done)))
                         do (when (gethash x on-path) (return-from circular-code-p t))
                            (setf (gethash x on-path) t)
                            (push x chain)
                            (walk (car x))
                            (setf x (cdr x)))
                   (dolist (cons chain)
                     (remhash cons on-path)
                     (setf (gethash cons done) t))))))
      (walk form)
      nil)))

(defun neutralizing-expansion-hook (expander form environment)
  "The macroexpand hook of compile-form and macroexpand-form: an image macro's expansion may hold
the request's code (or write a MACROLET around it), so every expansion is neutralized too. Its
symbols are remembered: DEFSTRUCT and the like intern names as they expand."
  (let ((expansion (neutralize (handler-bind ((error (lambda (condition)
                                                       (declare (ignore condition))
                                                       (setf *expansion-failed* t))))
                                 (funcall expander form environment)))))
    (when (circular-code-p expansion)
      (error 'circular-code :form form :expansion-p t))
    (remember-form expansion)
    expansion))

(defun call-running-no-request-code (function)
  (let ((*request-conses* (make-hash-table :test 'eq))
        (*replacements* (make-hash-table :test 'eq))
        (*macroexpand-hook* 'neutralizing-expansion-hook)
        (*read-eval* nil))
    (funcall function)))

(defmacro running-no-request-code (&body body)
  "Runs BODY, which reads the request's code (calling NOTE-REQUEST-CODE on each form it reads)
and NEUTRALIZEs it before compiling or expanding it."
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
