;;;; SBCL's internals that the helper uses, every one named here and nowhere else.
;;;;
;;;; The helper leans on SBCL functions and variables that SBCL does not promise to keep (the
;;;; debugger's frames, the compiler's contexts, encapsulation, the info database): a release may
;;;; rename or drop any of them. Each is listed once in *SBCL-INTERNALS*, under a keyword that is
;;;; its name, with what the helper needs it for; the other files reach it through SBCL-SYMBOL,
;;;; SBCL-SYMBOLS, NEEDED-INTERNAL and SBCL-CALL, which take that keyword (a keyword missing
;;;; from the table is a compile-time warning, and the helper compiles without warnings).
;;;; MISSING-INTERNALS says which of them this SBCL lacks; lisp-status shows that list, so an SBCL
;;;; upgrade that drops one is seen at once rather than when the one tool that needs it fails.
;;;;
;;;; Why by name: reading SB-IMPL::X interns X when it is gone, which SBCL's package lock forbids,
;;;; and SB-IMPL:X is a read error once X is no longer external; either way the whole helper would
;;;; fail to load. Found by name, a missing internal fails only the tool that needs it
;;;; (NEEDED-INTERNAL's FAIL) or makes the helper do without it (where SBCL-SYMBOL answers NIL).
;;;;
;;;; Not here, and why:
;;;; - SBCL's exported, documented interfaces, written with one colon where they are used:
;;;;   SB-EXT, SB-THREAD, SB-MOP, SB-GRAY, SB-INTROSPECT's exported functions, and the foreign
;;;;   function interface of SB-ALIEN and SB-SYS (calls.lisp, workers.lisp, launch.lisp, and
;;;;   SB-SYS:WITHOUT-GCING / WITHOUT-INTERRUPTS / WITH-LOCAL-INTERRUPTS in agent-threads.lisp).
;;;; - SB-SPROF's names (profile.lisp's SPROF-SYMBOL): a module loaded only when the profile tool
;;;;   first runs, so its names cannot be checked before.
;;;; - Package names the helper compares frames' and symbols' packages with (conditions.lisp),
;;;;   and bootstrap.lisp, which is sent on its own before the helper exists.

(in-package #:mcp-agent-helper)

(eval-when (:compile-toplevel :load-toplevel :execute)
  (defparameter *sbcl-internals*
    '(;; Encapsulation: the footprint, breakpoints and run-tests wrap functions with it.
      (:encapsulate "SB-INT" :function "wraps a function (footprint, breakpoints, run-tests)")
      (:encapsulated-p "SB-INT" :function "tells whether a wrapper is in (footprint, breakpoints, run-tests)")
      (:unencapsulate "SB-INT" :function "takes a wrapper out (footprint, breakpoints, run-tests)")
      (:*setf-fdefinition-hook* "SB-INT" :variable "the journal's view of DEFUN (footprint)")
      ;; The functions footprint.lisp encapsulates that SBCL does not export.
      (:start-thread "SB-THREAD" :function "threads an agent's code starts (agent-threads.lisp)")
      (:run-expired-timers "SB-IMPL" :function "timers run as nobody's (agent-threads.lisp)")
      (:call-hooks "SB-INT" :function "hooks an agent put on SBCL's lists (agent-threads.lisp)")
      (:%defmacro "SB-C" :function "the undo journal's view of DEFMACRO")
      (:%defparameter "SB-IMPL" :function "the undo journal's view of DEFPARAMETER")
      (:load-defmethod "SB-PCL" :function "the undo journal's view of DEFMETHOD")
      (:load-defclass "SB-PCL" :function "the undo journal's view of DEFCLASS")
      (:source "SB-PCL" :symbol "the slot of a class that says where it was defined (undo)")
      (:*requiring* "SB-IMPL" :variable "tells a REQUIRE's definitions from the agent's (undo)")
      ;; The debugger's view of the stack.
      (:top-frame "SB-DI" :function "walks a stack: backtraces, thread stacks, output capture")
      (:frame-down "SB-DI" :function "walks a stack: backtraces, thread stacks, output capture")
      (:frame-debug-fun "SB-DI" :function "a frame's function: thread stacks, output capture")
      (:debug-fun-fun "SB-DI" :function "the code a frame runs, against its name's definition (debugger)")
      (:debug-fun-name "SB-DI" :function "a frame's function's name: thread stacks, the profile")
      (:named-lambda "SB-INT" :symbol "the frame a breakpoint stops in, named as its function (breakpoints)")
      (:*stepper-hook* "SB-EXT" :variable "sends an agent's steps to its debugger (breakpoints)")
      (:find-stepped-frame "SB-DI" :function "where a step stopped (breakpoints' stepping)")
      (:invoke-stepper "SB-IMPL" :function "runs the stepper for an agent (breakpoints' stepping)")
      (:frame-call "SB-DEBUG" :function "a frame as a printed call (backtraces)")
      (:*stack-top-hint* "SB-DEBUG" :variable "where the debugger's backtrace starts")
      (:resolve-stack-top-hint "SB-DEBUG" :function "where the debugger's backtrace starts")
      (:simple-eval-in-lexenv "SB-INT" :function "the evaluator's frames, left out of backtraces")
      (:simple-eval-progn-body "SB-IMPL" :function "the evaluator's frames, left out of backtraces")
      (:%simple-eval "SB-IMPL" :function "the evaluator's frames, left out of backtraces")
      (:eval-in-lexenv "SB-IMPL" :function "the evaluator's frames, left out of backtraces")
      (:eval-progn-body "SB-IMPL" :function "the evaluator's frames, left out of backtraces"
       :optional t)
      (:run-interruption "SB-THREAD" :function "an interruption's frames, left out of backtraces")
      (:%interrupt-thread "SB-THREAD" :function "an interruption's frames, left out of backtraces")
      (:invoke-interruption "SB-SYS" :function "an interruption's frames, left out of backtraces")
      (:sigurg-handler "SB-UNIX" :function "an interruption's frames, left out of backtraces")
      ;; Threads.
      (:*in-the-debugger* "SB-DEBUG" :symbol "whether a thread runs SBCL's own debugger (lisp-status)")
      (:thread-waiting-for "SB-THREAD" :function "what a thread waits on (the threads tool)")
      (:current-thread-sap "SB-THREAD" :function "re-arms a thread's stack guard page (calls.lisp)")
      (:thread-state-word-slot "SB-VM" :variable "where the stack guard flag is (calls.lisp)")
      (:n-word-bytes "SB-VM" :variable "where the stack guard flag is (calls.lisp)")
      ;; The compiler's conditions and contexts.
      (:compiler-error "SB-C" :class "a form the compiler could not process")
      (:encapsulated-condition "SB-INT" :function "the error inside a COMPILER-ERROR")
      (:input-error-in-compile-file "SB-C" :class "a read error in a compiled file (load-system)")
      (:input-error-in-compile-file-invoker "SB-C" :function "which function read the file (load-system)")
      (:stream-error-position-info "SB-INT" :function "where a read error is (load-system)")
      (:find-error-context "SB-C" :function "the form a compiler condition is about")
      (:compiler-error-context-original-source-path "SB-C" :function "a compiler condition's place")
      (:compiler-error-context-file-position "SB-C" :function "a compiler condition's place")
      (:compiler-error-context-original-source "SB-C" :function "a compiler condition's form")
      (:compiler-error-context-file-name "SB-C" :function "a compiler condition's file")
      (:*undefined-warnings* "SB-C" :symbol "the undefined names a compilation unit holds (bound in one)")
      (:undefined-warning-name "SB-C" :function "the undefined names a compilation unit holds")
      (:undefined-warning-kind "SB-C" :function "the undefined names a compilation unit holds")
      (:undefined-warning-warnings "SB-C" :function "the undefined names a compilation unit holds")
      (:*print-condition-references* "SB-INT" :variable "leaves the manual's references out of reports")
      ;; The info database.
      (:info "SB-INT" :function "what a name is (kind of variable, type, inline function)")
      (:symbol-%info "SB-KERNEL" :function "a symbol's global information, restored after a check")
      (:update-symbol-info "SB-INT" :function "a symbol's global information, restored after a check")
      (:+nil-packed-infos+ "SB-INT" :variable "a symbol's global information, restored after a check")
      (:featurep "SB-INT" :function "reads a feature expression (introspection, load-file)")
      (:native-file-kind "SB-IMPL" :function "reads only regular source files, never a FIFO (introspection)")
      ;; Objects.
      (:closurep "SB-KERNEL" :function "a closure's values (inspect)")
      (:get-closure-length "SB-KERNEL" :function "a closure's values (inspect)")
      (:%closure-index-ref "SB-KERNEL" :function "a closure's values (inspect)")
      (:%fun-name "SB-KERNEL" :function "a function's name (xref)")
      (:encapsulation-info "SB-IMPL" :symbol "what a wrapper (TRACE's, say) closes over: the function it wraps (xref)")
      (:encapsulation-info-definition "SB-IMPL" :function "the function a wrapper wraps (xref)")
      (:find-defstruct-description "SB-KERNEL" :function "a structure's slot accessors (class-info)")
      (:dd-slots "SB-KERNEL" :function "a structure's slot accessors (class-info)")
      (:dsd-name "SB-KERNEL" :function "a structure's slot accessors (class-info)")
      (:dsd-accessor-name "SB-KERNEL" :function "a structure's slot accessors (class-info)")
      (:dsd-read-only "SB-KERNEL" :function "a structure's slot accessors (class-info)")
      (:definition-source-description "SB-INTROSPECT" :function "a definition's kind (find-definition)")
      ;; What the compiler inlined and expanded into a function (run-tests' suspects).
      (:%fun-fun "SB-KERNEL" :function "a closure's compiled function (run-tests' suspects)")
      (:fun-code-header "SB-KERNEL" :function "the code a function was compiled in (run-tests' suspects)")
      (:code-n-entries "SB-KERNEL" :function "the functions compiled together (run-tests' suspects)")
      (:%code-entry-point "SB-KERNEL" :function "the functions compiled together (run-tests' suspects)")
      (:%simple-fun-xrefs "SB-KERNEL" :function "a function's cross-references (run-tests' suspects)")
      (:map-packed-xref-data "SB-C" :function "a function's cross-references (run-tests' suspects)")
      ;; The printer, the timing and the memory.
      (:*circularity-hash-table* "SB-IMPL" :variable "a *PRINT-CIRCLE* print under way (printing.lisp)")
      (:*circularity-counter* "SB-IMPL" :variable "a *PRINT-CIRCLE* print under way (printing.lisp)")
      (:call-with-timing "SB-IMPL" :function "TIME's measurements (profile-code)")
      (:print-time "SB-IMPL" :function "TIME's report (profile-code)")
      (:named-lambda "SB-INT" :macro "names the profiled form's function (profile-code)")
      (:dynamic-usage "SB-KERNEL" :function "the heap in use (lisp-status)"))
    "Every SBCL internal the helper uses: (name package kind why [:optional t]), NAME the keyword of
the symbol's name, KIND what it must be (:FUNCTION, :MACRO, :VARIABLE, :CLASS or :SYMBOL, which
need only exist). An optional one is named by other SBCL releases than 2.2.9, which lacks it; the
helper uses it where it exists.")

  (defun check-internal-name (name)
    "Warns, when a file is compiled, of a NAME that *SBCL-INTERNALS* does not list."
    (when (and (keywordp name) (not (assoc name *sbcl-internals*)))
      (warn "~S is not in *SBCL-INTERNALS* (sbcl.lisp): list it there, with why the helper needs it." name))))

(defun find-internal (name)
  "The symbol of the internal NAME (a keyword of *SBCL-INTERNALS*) in this SBCL, or NIL."
  (let* ((entry (assoc name *sbcl-internals*))
         (package (and entry (find-package (second entry)))))
    (and package (find-symbol (symbol-name name) package))))

(defparameter *found-internals* (make-hash-table :test 'eq :synchronized t)
  "Each internal's symbol in this SBCL (NIL when it lacks it), found when first asked for: the
tools ask often (every frame of a backtrace) and an image's SBCL never changes. Not at load, since
SB-INTROSPECT's module is required after this file (footprint.lisp).")

(defun sbcl-symbol (name)
  "The symbol of SBCL's internal NAME (a keyword listed in *SBCL-INTERNALS*), or NIL when this SBCL
lacks it: the caller does without."
  (multiple-value-bind (symbol found) (gethash name *found-internals*)
    (if found
        symbol
        (setf (gethash name *found-internals*) (find-internal name)))))

(define-compiler-macro sbcl-symbol (&whole form name)
  (check-internal-name name)
  form)

(defun sbcl-symbols (&rest names)
  "The symbols of the internals NAMES this SBCL has, in order, the missing ones left out."
  (remove nil (mapcar #'sbcl-symbol names)))

(define-compiler-macro sbcl-symbols (&whole form &rest names)
  (mapc #'check-internal-name names)
  form)

(defun needed-internal (name)
  "The symbol of SBCL's internal NAME, or a failure of the one tool that needs it when this SBCL
lacks it."
  (or (sbcl-symbol name)
      (fail "This SBCL (~A) has no ~A::~A, which this tool needs; swank-mcp is tested with SBCL 2.2.9."
            (lisp-implementation-version) (second (assoc name *sbcl-internals*)) (symbol-name name))))

(define-compiler-macro needed-internal (&whole form name)
  (check-internal-name name)
  form)

(defmacro sbcl-call (name &rest arguments)
  "Calls SBCL's internal function NAME (see NEEDED-INTERNAL)."
  (check-internal-name name)
  `(funcall (needed-internal ,name) ,@arguments))

(defun internal-present-p (entry)
  (destructuring-bind (name package kind why &key optional) entry
    (declare (ignore package why))
    (let ((symbol (sbcl-symbol name)))
      (or optional
          (and symbol
           (ecase kind
             (:function (and (fboundp symbol) (not (macro-function symbol))))
             (:macro (and (macro-function symbol) t))
             (:variable (boundp symbol))
             (:class (and (find-class symbol nil) t))
             (:symbol t)))))))

(defun missing-internals ()
  "SBCL's internals the helper names that this SBCL lacks (or has as something else), each as
\"PACKAGE::NAME (kind): why\": empty for the SBCL swank-mcp is tested with. lisp-status shows it."
  (loop for entry in *sbcl-internals*
        unless (internal-present-p entry)
          collect (destructuring-bind (name package kind why &key optional) entry
                    (declare (ignore optional))
                    (format nil "~A::~A (~(~A~)): ~A" package (symbol-name name) kind why))))
