;;;; run-tests' suspects: after a red run, the definitions of the system most likely at fault,
;;;; ranked from what the image saw while the tests ran again with recording on.
;;;;
;;;; A red reply names tests and checks, never code; the image saw every call the tests made.
;;;; Only a red run pays for the recording: the failing tests (FiveAM's and RT's) are run again,
;;;; then as many passing ones as a few seconds allow, with every function of the system's own
;;;; code encapsulated to count its calls per test, and *MACROEXPAND-HOOK* bound to see the
;;;; system's macros expanded while a test runs (RT evaluates its forms then). The system's
;;;; functions that inlined its inline functions are recompiled for the reruns calling them
;;;; instead (CALL-WITHOUT-INLINING), so that each inline function counts its own calls. What the
;;;; compiler expanded before the run is read from the cross-reference data it keeps with each
;;;; function: a reached function, or a FiveAM test's own function, that expanded one of the
;;;; system's macros (or, not recompiled, inlined one of its functions) reached them too. A
;;;; definition scores by Ochiai's measure, ef / sqrt(F (ef + ep)): F failing tests, ef of them reached it, ep
;;;; passing ones did (what a test that failed by an error first called after it, reporting it,
;;;; not counted); of those that score alike, the function an error of a failing test was
;;;; signalled in comes first (it may be only the one that reports a wrong result, as a parser's
;;;; parse error does, so it does not outrank a better score).
;;;; For the first suspects, the arguments and value of the first call a failing test made.
;;;;
;;;; The system's own code is the source files of the systems defined beside it (in its .asd's
;;;; directory) that do not depend on a test framework themselves: those that do are its tests.
;;;; When every one of them does, code and tests share their files, and all of them count.
;;;;
;;;; The encapsulations are made in
;;;; the dynamic extent of one run-tests call and taken out when the reruns end; other threads'
;;;; calls go through them unrecorded.

(in-package #:mcp-agent-helper)

(defparameter *max-suspects* 5
  "Suspects a red reply names.")

(defparameter *suspects-with-calls* 3
  "The first suspects whose call a failing test made the reply shows.")

(defparameter *max-failing-reruns* 10)

(defparameter *passing-rerun-seconds* 15
  "How long the passing tests are run again for, after the failing ones: the more of them, the
sharper the ranking, and a large suite must not double the run's time.")

(defparameter *max-uninlined-functions* 200
  "The most functions a red run recompiles not to inline the system's inline functions (see
CALL-WITHOUT-INLINING), each in a few milliseconds; a system with more is recorded as compiled,
each inline function counted wherever its host is.")

(defparameter *test-frameworks-systems* '("fiveam" "rt" "sb-rt" "parachute")
  "The frameworks' systems: a system that depends on one is tests, not the code under test.")

(defvar *recording* nil
  "The TEST-RECORDING of the test this thread runs again, while suspects are looked for.")

(defclass test-recording ()
  ((failing :initarg :failing :reader recording-failing)
   (reached :initform (make-hash-table :test 'eq) :reader recording-reached
            :documentation "A definition's name -> how many times the test reached it.")
   (calls :initform (make-hash-table :test 'eq) :reader recording-calls
          :documentation "For a failing test: a function's name -> (arguments value), its first call.")
   (signalled :initform nil :accessor recording-signalled
              :documentation "(condition name arguments) of the last error signalled inside the system's
code: NAME the innermost of its functions the error came through, ARGUMENTS that call's, printed.")
   (first-calls :initform 0 :accessor recording-first-calls
                :documentation "For a failing test: how many of the system's functions it has called.")
   (signalled-after :initform nil :accessor recording-signalled-after
                    :documentation "For a failing test: how many of them it had called when the error of
SIGNALLED was.")))

;;; ------------------------------------------------------------------------------------------
;;; The system's own code

(defun dependency-name (dependency)
  "The system a DEPENDENCY of a DEFSYSTEM names: NAME, (:VERSION NAME v), (:FEATURE f NAME)."
  (cond ((or (stringp dependency) (symbolp dependency)) (string-downcase (string dependency)))
        ((and (consp dependency) (eq (first dependency) :feature)) (dependency-name (third dependency)))
        ((consp dependency) (dependency-name (second dependency)))))

(defun truename-text (pathname)
  (let ((truename (ignore-errors (probe-file pathname))))
    (and truename (sb-ext:native-namestring truename))))

(defun system-code-files (system)
  "The source files of SYSTEM's own code, a table of their true names: see the file's header."
  (let* ((directory-of (asdf-function "SYSTEM-SOURCE-DIRECTORY"))
         (directory (funcall directory-of system))
         (source-file (find-symbol "CL-SOURCE-FILE" '#:asdf))
         (parent (find-symbol "PARENT-COMPONENT" '#:asdf))
         (files (make-hash-table :test 'equal)))
    (labels ((walk (component)
               (cond ((typep component source-file)
                      (let ((file (truename-text (funcall (asdf-function "COMPONENT-PATHNAME") component))))
                        (when file (setf (gethash file files) t))))
                     ((typep component parent)
                      (mapc #'walk (funcall (asdf-function "COMPONENT-CHILDREN") component))))))
      (let* ((beside (loop for name in (funcall (asdf-function "REGISTERED-SYSTEMS"))
                           for other = (ignore-errors (funcall (asdf-function "FIND-SYSTEM") name nil))
                           when (and other (equal (ignore-errors (funcall directory-of other)) directory))
                             collect other))
             (code (remove-if (lambda (other)
                                (some (lambda (dependency)
                                        (member (dependency-name dependency) *test-frameworks-systems* :test #'string=))
                                      (ignore-errors (funcall (asdf-function "SYSTEM-DEPENDS-ON") other))))
                              beside)))
        ;; A system whose files hold its code and its tests depends on the framework itself.
        (mapc #'walk (or code beside))))
    files))

(defun definition-kind (symbol)
  "What SYMBOL names as an operator: :MACRO, :INLINE, :GENERIC, :FUNCTION, or NIL."
  (cond ((special-operator-p symbol) nil)
        ((macro-function symbol) :macro)
        ((not (fboundp symbol)) nil)
        ((eq (ignore-errors (sbcl-call :info :function :inlinep symbol)) 'inline) :inline)
        ((typep (fdefinition symbol) 'generic-function) :generic)
        (t :function)))

(defun system-definitions (files)
  "The operators defined in FILES (see SYSTEM-CODE-FILES): a table of each name -> its kind. Only
the packages outside SBCL are looked through."
  (let ((definitions (make-hash-table :test 'eq))
        (file-of-pathname (make-hash-table :test 'equal)))
    (dolist (package (list-all-packages))
      (unless (or (member (package-name package) '("COMMON-LISP" "KEYWORD" "MCP-AGENT-HELPER") :test #'string=)
                  (eql 0 (search "SB-" (package-name package))))
        (do-symbols (symbol package)
          (when (and (eq (symbol-package symbol) package) (fboundp symbol) (not (gethash symbol definitions)))
            (let* ((kind (definition-kind symbol))
                   (function (and kind (or (macro-function symbol) (fdefinition symbol))))
                   (source (and function (ignore-errors (sb-introspect:find-definition-source function))))
                   (pathname (and source (sb-introspect:definition-source-pathname source)))
                   (file (and pathname
                              (let ((text (source-pathname-text pathname)))
                                (multiple-value-bind (file known) (gethash text file-of-pathname)
                                  (if known file (setf (gethash text file-of-pathname) (truename-text text))))))))
              (when (and file (gethash file files))
                (setf (gethash symbol definitions) kind)))))))
    definitions))

;;; ------------------------------------------------------------------------------------------
;;; Recording

(defun recording-hook (name package)
  "The encapsulation of the function NAME: counts its calls in the test being run again, and in a
failing one keeps its first call and notes an error signalled inside it."
  (lambda (function &rest arguments)
    (let ((recording *recording*))
      (cond ((null recording) (apply function arguments))
            (t
             (incf (gethash name (recording-reached recording) 0))
             (if (not (recording-failing recording))
                 (apply function arguments)
                 (let* ((calls (recording-calls recording))
                        (first (not (nth-value 1 (gethash name calls)))))
                   (when first
                     ;; Printed now: the arguments may be changed by the call. The last element
                     ;; counts the functions called first so far, this one included.
                     (setf (gethash name calls)
                           (list (let ((*recording* nil))
                                   (print-briefly arguments :package package :length 6 :level 3 :limit 160))
                                 nil
                                 (incf (recording-first-calls recording)))))
                   (let ((values (handler-bind ((error (lambda (condition)
                                                         (unless (eq (car (recording-signalled recording)) condition)
                                                           (setf (recording-signalled-after recording)
                                                                 (recording-first-calls recording))
                                                           (setf (recording-signalled recording)
                                                                 (list condition name
                                                                       (let ((*recording* nil))
                                                                         (print-briefly arguments :package package
                                                                                                  :length 6 :level 3 :limit 160))))))))
                                   (multiple-value-list (apply function arguments)))))
                     (when first
                       (setf (second (gethash name calls))
                             (let ((*recording* nil))
                               (print-briefly (if (= (length values) 1) (first values) (cons 'values values))
                                              :package package :length 6 :level 3 :limit 160))))
                     (values-list values)))))))))

(defun call-recording (definitions package function)
  "Calls FUNCTION with the functions of DEFINITIONS encapsulated and the macroexpansions of its
macros noted, for the test reruns."
  (let ((wrapped '())
        (previous-hook *macroexpand-hook*))
    (unwind-protect
         (progn
           (maphash (lambda (name kind)
                      (when (and (member kind '(:function :inline :generic))
                                 (not (sbcl-call :encapsulated-p name 'record-suspect-calls))
                                 (ignore-errors
                                  (sbcl-call :encapsulate name 'record-suspect-calls (recording-hook name package))
                                  t))
                        (push name wrapped)))
                    definitions)
           (let ((*macroexpand-hook*
                   (lambda (expander form environment)
                     (let ((recording *recording*))
                       (when (and recording (consp form) (symbolp (first form))
                                  (eq (gethash (first form) definitions) :macro))
                         (incf (gethash (first form) (recording-reached recording) 0))))
                     (funcall previous-hook expander form environment))))
             (funcall function)))
      (dolist (name wrapped)
        (ignore-errors (sbcl-call :unencapsulate name 'record-suspect-calls))))))

;;; ------------------------------------------------------------------------------------------
;;; Calls the compiler inlined

(defun inlining-functions (definitions expansions)
  "The functions of DEFINITIONS into whose code the compiler inlined an inline function of
DEFINITIONS, inline ones among them (their own definitions inlined others too); EXPANSIONS caches
what each function's code expanded (see CACHED-EXPANSIONS)."
  (loop for name being the hash-keys of definitions using (hash-value kind)
        when (and (member kind '(:function :inline))
                  (some (lambda (expanded) (eq (gethash expanded definitions) :inline))
                        (cached-expansions (fdefinition name) definitions expansions)))
          collect name))

(defun call-without-inlining (definitions expansions function)
  "Calls FUNCTION with the functions of DEFINITIONS that inlined its inline functions recompiled
from their files calling them instead, so that the recording counts each inline function's own
calls: inlined, an inline function is reached wherever its host is, and every inline function
of a host ties with the others (split-sequence's vector and list paths). Returns the names
recompiled, whose own inlined functions are not to be counted as reached. Their compiled
functions are put back after, and the inline functions stay inline: the inline expansions SBCL
keeps are not touched by a definition compiled while the names are proclaimed NOTINLINE, which
lasts only for the compilation. Not journaled: undo is for the agent's own definitions.
EXPANSIONS caches what each function's code expanded (see CACHED-EXPANSIONS)."
  (let* ((inline-names (loop for name being the hash-keys of definitions using (hash-value kind)
                             when (eq kind :inline) collect name))
         (hosts (let ((found (and inline-names (inlining-functions definitions expansions))))
                  (and (<= (length found) *max-uninlined-functions*) found)))
         (replaced '()))
    ;; A library may lock its package (Alexandria does): these definitions are its own again.
    (flet ((as-the-library (function)
             (sb-ext:without-package-locks
               (let ((*agent-call* nil))
                 (funcall function)))))
      (unwind-protect
           (progn
             (when hosts
               (as-the-library
                (lambda ()
                  (unwind-protect
                       (progn
                         (proclaim `(notinline ,@inline-names))
                         (dolist (name hosts)
                           (let ((compiled (fdefinition name)))
                             (when (ignore-errors
                                    (multiple-value-bind (octets file write-date) (definition-form-octets name)
                                      (getf (handler-bind ((warning #'muffle-warning))
                                              (compile-and-load-recording octets file write-date))
                                            :loaded)))
                               (push (cons name compiled) replaced)))))
                    (proclaim `(inline ,@inline-names))))))
             (funcall function (mapcar #'car replaced)))
        (as-the-library
         (lambda ()
           (loop for (name . compiled) in replaced
                 do (setf (fdefinition name) compiled))))))))

(defun forget-calls-after-the-error (recording)
  "Takes out of a failing test's RECORDING the functions it first called after the error that
failed it was signalled: the framework then reports the error, and the system's functions that
print it (esrap's report of a parse error) are where the test went, not where it went wrong."
  (let ((after (recording-signalled-after recording)))
    (when after
      (maphash (lambda (name call)
                 (when (> (third call) after)
                   (remhash name (recording-reached recording))))
               (recording-calls recording)))))

(defun rerun-test (test failing)
  "Runs TEST, (framework name object form), again under a new TEST-RECORDING, and returns that."
  (destructuring-bind (framework name object form) test
    (declare (ignore form))
    (let ((recording (make-instance 'test-recording :failing failing))
          (*test-collection* nil)
          (*standard-output* (make-broadcast-stream))
          (*error-output* (make-broadcast-stream)))
      (let ((*recording* recording))
        (ecase framework
          (:fiveam (funcall (fiveam-symbol "RUN") name))
          (:rt (funcall (find-symbol "DO-ENTRY" (rt-package-of-entry object)) object (make-broadcast-stream)))))
      recording)))

;;; ------------------------------------------------------------------------------------------
;;; What was reached without a call

(defun code-functions (function)
  "The functions compiled with FUNCTION, its own among them: each keeps its cross-references."
  (let* ((simple (ignore-errors (sbcl-call :%fun-fun function)))
         (code (and simple (ignore-errors (sbcl-call :fun-code-header simple)))))
    (if code
        (loop for i below (sbcl-call :code-n-entries code) collect (sbcl-call :%code-entry-point code i))
        (and simple (list simple)))))

(defun expanded-into (function definitions)
  "The inline functions and macros of DEFINITIONS that the compiler inlined or expanded into
FUNCTION's code, from the cross-references it kept."
  (let ((names '()))
    (dolist (simple (code-functions function))
      (let ((xrefs (ignore-errors (sbcl-call :%simple-fun-xrefs simple))))
        (when xrefs
          (ignore-errors
           (sbcl-call :map-packed-xref-data
                      (lambda (kind name number)
                        (declare (ignore number))
                        (when (and (member kind '(:calls :macroexpands)) (symbolp name)
                                   (member (gethash name definitions) '(:inline :macro)))
                          (pushnew name names)))
                      xrefs)))))
    names))

(defun cached-expansions (function definitions expansions)
  "EXPANDED-INTO of FUNCTION, kept in the table EXPANSIONS: the functions whose inlining is looked
for before the reruns are those whose expansions are counted after them."
  (multiple-value-bind (names known) (gethash function expansions)
    (if known names (setf (gethash function expansions) (expanded-into function definitions)))))

(defun form-symbols (form)
  "The symbols FORM holds, each once. Tests' forms may hold circular lists (tests of functions on
them): each cons is walked once."
  (let ((symbols '())
        (seen (make-hash-table :test 'eq)))
    (labels ((walk (x)
               (cond ((symbolp x) (pushnew x symbols))
                     ((and (consp x) (not (gethash x seen)))
                      (setf (gethash x seen) t)
                      (walk (car x))
                      (walk (cdr x))))))
      (walk form))
    symbols))

(defun add-expanded (recording test definitions expansions uninlined)
  "Adds to RECORDING's reached definitions what was inlined or expanded into the functions it
reached, into TEST's own function, and into its form; EXPANSIONS caches each function's. Of the
functions UNINLINED (see CALL-WITHOUT-INLINING), only the macros: they ran calling the inline
functions, which counted themselves."
  (destructuring-bind (framework name object form) test
    (declare (ignore name))
    (let ((reached (recording-reached recording)))
      (flet ((expanded (function)
               (cached-expansions function definitions expansions)))
        (let ((more (append (loop for name being the hash-keys of reached
                                  when (member (gethash name definitions) '(:function :inline))
                                    append (if (member name uninlined)
                                               (remove-if-not (lambda (expanded) (eq (gethash expanded definitions) :macro))
                                                              (expanded (fdefinition name)))
                                               (expanded (fdefinition name))))
                            (and (eq framework :fiveam)
                                 (let ((lambda (ignore-errors (funcall (fiveam-symbol "TEST-LAMBDA") object))))
                                   (and (functionp lambda) (expanded lambda))))
                            (remove-if-not (lambda (name) (member (gethash name definitions) '(:inline :macro)))
                                           (form-symbols form)))))
          (dolist (name more)
            (unless (gethash name reached)
              (setf (gethash name reached) 0))))))))

;;; ------------------------------------------------------------------------------------------
;;; The tests, the ranking, the reply

(defun collected-tests (collection)
  "The tests COLLECTION's run ran, each once: ((framework name object form) . status), FiveAM's
and RT's, STATUS NIL when it passed, else :FAILED or :ERROR, the worst of its runs."
  (let ((tests '())
        (seen (make-hash-table :test 'equal)))
    (flet ((note (framework name object form failed)
             (let ((known (gethash (list framework name) seen)))
               (if known
                   (when (and failed (not (eq (cdr known) :error)))
                     (setf (cdr known) failed))
                   (push (setf (gethash (list framework name) seen)
                               (cons (list framework name object form) failed))
                         tests)))))
      (dolist (results (reverse (collection-fiveam-runs collection)))
        (dolist (result results)
          (let* ((test-case (slot-if-bound result "TEST-CASE"))
                 (name (and test-case (slot-if-bound test-case "NAME"))))
            (when (and name (symbolp name))
              (let ((kind (fiveam-result-kind result)))
                (note :fiveam name test-case
                      (and (member kind '(:failed :error)) (slot-if-bound result "TEST-EXPR"))
                      (find kind '(:failed :error))))))))
      (dolist (outcome (reverse (collection-rt-outcomes collection)))
        (destructuring-bind (&key name form failed compared entry &allow-other-keys) outcome
          (when entry
            ;; RT compares the values only when the test returned (see RT-REPORT).
            (note :rt name entry form (and failed (if compared :failed :error)))))))
    (reverse tests)))

(defun suspect-place (name kind directory)
  "(file line) of NAME's definition, FILE relative to DIRECTORY when it is under it."
  (let* ((source (ignore-errors (sb-introspect:find-definition-source
                                 (if (eq kind :macro) (macro-function name) (fdefinition name)))))
         (location (and source (ignore-errors (source-location source name))))
         (file (getf location :file)))
    (list (and file (let ((relative (enough-namestring file directory)))
                      (if (eql 0 (search "/" relative)) file relative)))
          (getf location :line))))

(defun line-operator (file line)
  "The text the form at the start of LINE of FILE begins with after its parenthesis (DEFUN,
MAKE-FLOAT-CONVERTERS), or NIL when the line does not begin a form."
  (let ((octets (file-octets file)))
    (when (and octets line)
      (let ((start (if (= line 1)
                       0
                       (loop with current = 1
                             for i from 0 below (length octets)
                             when (= (aref octets i) 10)
                               do (incf current)
                                  (when (= current line) (return (1+ i)))))))
        (when (and start (< (1+ start) (length octets)) (= (aref octets start) (char-code #\()))
          (sb-ext:octets-to-string octets :start (1+ start) :end (token-end octets (1+ start))
                                          :external-format :utf-8))))))

(defun defining-macro (name file line definitions)
  "The macro of DEFINITIONS whose call at LINE of FILE defined the function NAME, when its
definition is such a call (ieee-floats' (make-float-converters encode-float32 ...)) and not a
DEFUN: the source to read is the macro's."
  (let* ((operator (line-operator file line))
         (symbol (and operator (symbolp name)
                      (not (eql 0 (search "DEF" operator :test #'char-equal)))
                      (find-symbol (string-upcase operator) (symbol-package name)))))
    (and symbol (eq (gethash symbol definitions) :macro) symbol)))

(defun find-suspects (system collection package)
  "The suspects of COLLECTION's red run of SYSTEM, as run-tests replies with them: NIL when no
FiveAM or RT test failed, else (:WHY NIL :FAILING-RERUN n :PASSING-RERUN n :PASSING n :SUSPECTS (...)),
each suspect (:NAME :KIND :FILE :LINE :FAILING ef :PASSING ep :SIGNALLED :ARGUMENTS :VALUE), the
last two for the first *SUSPECTS-WITH-CALLS* that a failing test called: the call the error was
signalled in, which has no value, or else the first call."
  (let* ((tests (collected-tests collection))
         (failing (remove-if-not #'cdr tests))
         (passing (remove-if #'cdr tests)))
    (when failing
      (let* ((definitions (system-definitions (system-code-files system)))
             (expansions (make-hash-table :test 'eq))
             (signalled (make-hash-table :test 'eq))
             (failing-records '())
             (passing-records '())
             (uninlined '())
             (deadline (+ (get-internal-real-time) (* *passing-rerun-seconds* internal-time-units-per-second)))
             (*file-octets* (make-hash-table :test 'equal)))
        (call-without-inlining
         definitions expansions
         (lambda (recompiled)
           (setf uninlined recompiled)
           (call-recording
            definitions package
            (lambda ()
              (loop for (test . status) in failing
                    repeat *max-failing-reruns*
                    do (let ((recording (rerun-test test t)))
                         (when (eq status :error)
                           (forget-calls-after-the-error recording))
                         (when (and (eq status :error) (recording-signalled recording))
                           (destructuring-bind (condition name arguments) (recording-signalled recording)
                             (declare (ignore condition))
                             (setf (gethash name signalled) (list arguments))))
                         (push (cons test recording) failing-records)))
              (loop for (test) in passing
                    while (< (get-internal-real-time) deadline)
                    do (push (cons test (rerun-test test nil)) passing-records))))))
        (loop for (test . recording) in (append failing-records passing-records)
              do (add-expanded recording test definitions expansions uninlined))
        (let* ((scores (make-hash-table :test 'eq))
               (f (length failing-records))
               (named (make-hash-table :test 'eq)))
          (loop for ((nil nil nil form) . recording) in failing-records
                do (dolist (name (form-symbols form))
                     (setf (gethash name named) t))
                   (loop for name being the hash-keys of (recording-reached recording)
                         do (incf (car (or (gethash name scores) (setf (gethash name scores) (list 0 0)))))))
          (loop for (nil . recording) in passing-records
                do (loop for name being the hash-keys of (recording-reached recording)
                         for score = (gethash name scores)
                         when score do (incf (second score))))
          (let ((ranked (sort (loop for name being the hash-keys of scores using (hash-value (ef ep))
                                    collect (list name ef ep (/ ef (sqrt (* f (+ ef ep))))))
                              (lambda (a b)
                                (destructuring-bind (name-a ef-a ep-a score-a) a
                                  (declare (ignore ef-a))
                                  (destructuring-bind (name-b ef-b ep-b score-b) b
                                    (declare (ignore ef-b))
                                    (let ((signalled-a (gethash name-a signalled)) (signalled-b (gethash name-b signalled))
                                          (named-a (gethash name-a named)) (named-b (gethash name-b named)))
                                      (cond ((/= score-a score-b) (> score-a score-b))
                                            ((not (eq (not signalled-a) (not signalled-b))) signalled-a)
                                            ((not (eq (not named-a) (not named-b))) named-a)
                                            ((/= ep-a ep-b) (< ep-a ep-b))
                                            (t (string< (symbol-name name-a) (symbol-name name-b)))))))))))
            (list :why nil
                  :failing-rerun f
                  :passing-rerun (length passing-records)
                  :passing (length passing)
                  :suspects
                  (loop for (name ef ep) in ranked
                        for i from 0
                        repeat *max-suspects*
                        collect (let* ((kind (gethash name definitions))
                                       ;; The call an error came from says more than the first.
                                       (call (and (< i *suspects-with-calls*)
                                                  (or (gethash name signalled)
                                                      (loop for (nil . recording) in (reverse failing-records)
                                                            thereis (gethash name (recording-calls recording)))))))
                                  (destructuring-bind (file line)
                                      (suspect-place name kind (funcall (asdf-function "SYSTEM-SOURCE-DIRECTORY") system))
                                    (list :name (print-briefly name :package package)
                                          :kind (string-downcase (symbol-name kind))
                                          :file file :line line :failing ef :passing ep
                                          :defined-by (let* ((directory (funcall (asdf-function "SYSTEM-SOURCE-DIRECTORY") system))
                                                             (macro (and file (not (eq kind :macro))
                                                                         (defining-macro name (merge-pathnames file directory)
                                                                                         line definitions))))
                                                        (and macro
                                                             (destructuring-bind (macro-file macro-line)
                                                                 (suspect-place macro :macro directory)
                                                               (list :name (print-briefly macro :package package)
                                                                     :file macro-file :line macro-line))))
                                          :signalled (and (gethash name signalled) t)
                                          :arguments (first call) :value (second call))))))))))))

(defun suspects-or-why (system collection package)
  "FIND-SUSPECTS, or a reply whose :WHY says why not when looking for them failed: the run's results are the reply all
the same."
  (handler-case (find-suspects system collection package)
    (serious-condition (condition)
      (list :failing-rerun nil :passing-rerun nil :passing nil :suspects nil
            :why (format nil "looking for them failed: ~A" (condition-message condition))))))
