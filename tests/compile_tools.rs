//! compile-form and macroexpand-form against a real SBCL + cl-swank image: every example of their
//! contracts, and the promise that neither runs, defines or interns anything.

mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use swank_mcp::tools::{ToolOutput, Toolbox};

async fn compile(toolbox: &Arc<Toolbox>, code: &str) -> ToolOutput {
    common::call(toolbox, "compile-form", json!({ "code": code })).await
}

async fn expand(toolbox: &Arc<Toolbox>, arguments: Value) -> ToolOutput {
    common::call(toolbox, "macroexpand-form", arguments).await
}

/// Gensym counters differ from run to run: `#:g113` reads `#:g`.
fn without_gensym_counters(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '#' && chars.peek() == Some(&':') {
            out.push(chars.next().unwrap_or(':'));
            let mut name = String::new();
            while let Some(&next) = chars.peek() {
                if next.is_alphanumeric() || next == '-' {
                    name.push(next);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push_str(name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('-'));
        }
    }
    out
}

#[tokio::test]
async fn compile_form_contract_examples() {
    let tb = common::toolbox(common::shared_image_port());
    // SBCL's CL-USER uses SB-ALIEN, which exports DOUBLE: defining it there violates a package
    // lock, so the contract's first example fails in SBCL. In a package of its own it compiles.
    let output = compile(&tb, "(defun double (x) (* x 2))").await;
    assert!(output.is_error);
    assert_eq!(
        output.text,
        "Compilation failed\nWarnings: 0\nErrors: 1\n\n\
         ERROR: Lock on package SB-ALIEN violated when proclaiming DOUBLE as a function while in package COMMON-LISP-USER.\n  \
         in form: (DEFUN DOUBLE (X) (* X 2))\n  at: line 1, column 1\n  severity: ERROR\n\nCompiled 1 form, with errors"
    );
    common::eval_ok(&tb, "(defpackage :compile-test-plain (:use :cl))").await;
    let output = common::call(
        &tb,
        "compile-form",
        json!({"code": "(defun double (x) (* x 2))", "package": "COMPILE-TEST-PLAIN"}),
    )
    .await;
    assert!(!output.is_error);
    assert_eq!(output.text, "Compilation successful\nWarnings: 0\nErrors: 0\n\nCompiled 1 form successfully");

    // UNDEFINED-FUNCTION is a COMMON-LISP symbol, so SBCL gives a full WARNING saying so.
    let output = compile(&tb, "(defun uses-undefined () (undefined-function 42))").await;
    assert!(!output.is_error);
    assert_eq!(
        output.text,
        "Compilation successful (with warnings)\nWarnings: 1\nErrors: 0\n\n\
         WARNING: The function UNDEFINED-FUNCTION is undefined, and its name is reserved by ANSI CL so that even if it were \
         defined later, the code doing so would not be portable.\n  \
         in form: (DEFUN USES-UNDEFINED () (UNDEFINED-FUNCTION 42))\n  at: line 1, column 26\n  severity: WARNING\n\n\
         Compiled 1 form successfully"
    );

    // SBCL reports a constant of the wrong type, and the code it makes unreachable.
    let output = compile(&tb, "(defun bad-call () (+ 1 \"two\"))").await;
    assert_eq!(
        output.text,
        "Compilation successful (with warnings)\nWarnings: 1\nErrors: 0\nNotes: 1\n\n\
         NOTE: deleting unreachable code\n  in form: (DEFUN BAD-CALL () (+ 1 \"two\"))\n  at: line 1, column 20\n  severity: NOTE\n\n\
         WARNING: Constant \"two\" conflicts with its asserted type NUMBER.\n  in form: (DEFUN BAD-CALL () (+ 1 \"two\"))\n  \
         at: line 1, column 20\n  severity: WARNING\n\nCompiled 1 form successfully"
    );
    let output = compile(&tb, "(defun bad-add (x) (+ x \"string\"))").await;
    assert!(
        output.text.contains("WARNING: Constant \"string\" conflicts with its asserted type NUMBER."),
        "{}",
        output.text
    );

    let output = compile(&tb, "(defun incomplete (x)").await;
    assert!(output.is_error);
    assert_eq!(
        output.text,
        "Compilation failed\nErrors: 1\n\nERROR: end of file on #<STRING-INPUT-STREAM>\n  Could not read form from code string\n  \
         at: line 1, column 1 (the form that is not closed starts here)"
    );

    // The contract's general example: an undefined function is a deferred STYLE-WARNING in SBCL.
    let output = compile(&tb, "(defun my-func () (nonexistent-func))").await;
    assert_eq!(
        output.text,
        "Compilation successful (with warnings)\nWarnings: 0\nErrors: 0\nStyle-warnings: 1\n\n\
         STYLE-WARNING: undefined function: COMMON-LISP-USER::NONEXISTENT-FUNC\n  in form: (DEFUN MY-FUNC () (NONEXISTENT-FUNC))\n  \
         at: line 1, column 19\n  severity: STYLE-WARNING\n\nCompiled 1 form successfully"
    );
    let structured = output.structured_value().unwrap();
    assert_eq!(structured["style_warnings"], 1);
    assert_eq!(structured["conditions"][0]["line"], 1);
    assert_eq!(structured["conditions"][0]["column"], 19);
}

#[tokio::test]
async fn compiling_runs_defines_and_interns_nothing() {
    let tb = common::toolbox(common::shared_image_port());
    common::eval_ok(&tb, "(defpackage :compile-test-state (:use :cl))").await;
    let count = "(let ((n 0)) (do-symbols (s :compile-test-state) (when (eq (symbol-package s) (find-package :compile-test-state)) (incf n))) n)";
    let before = common::eval_ok(&tb, count).await;
    let code = "(defun test () (print 'executed))\n\
                (defvar *compile-test-v* (print 1))\n\
                (defmacro compile-test-m (x) `(list ,x))\n\
                (defclass compile-test-class () ((slot :accessor compile-test-slot)))\n\
                (defstruct compile-test-struct a)\n\
                (defpackage :compile-test-never)\n\
                (defun compile-test-ltv () (load-time-value (progn (print :ltv) 1)))\n\
                (print :toplevel)";
    let output = common::call(&tb, "compile-form", json!({"code": code, "package": "COMPILE-TEST-STATE"})).await;
    assert!(!output.is_error, "{}", output.text);
    // Nothing printed, in the image or in the result: load-time-value was compiled as code, not run.
    assert!(
        !output.text.contains("[stdout]") && !output.text.contains("EXECUTED") && !output.text.contains(":LTV"),
        "{}",
        output.text
    );
    assert!(output.text.ends_with("Compiled 8 forms successfully"), "{}", output.text);
    let state = common::eval_ok(
        &tb,
        "(list (find-package \"COMPILE-TEST-NEVER\") (find-class (find-symbol \"COMPILE-TEST-CLASS\" :compile-test-state) nil) \
         (find-symbol \"TEST\" :compile-test-state) (find-symbol \"*COMPILE-TEST-V*\" :compile-test-state) \
         (find-symbol \"COMPILE-TEST-LTV\" :compile-test-state) (find-symbol \"COMPILE-TEST-NEVER\" :keyword))",
    )
    .await;
    assert!(state.starts_with("=> (NIL NIL NIL NIL NIL NIL) @"), "{state}");
    assert_eq!(common::eval_ok(&tb, count).await, before, "no symbol was left interned");
    // #. cannot run code either.
    let output = compile(&tb, "(list #.(progn (print :read-eval) 1))").await;
    assert!(output.is_error);
    assert!(output.text.contains("ERROR: can't read #. while *READ-EVAL* is NIL\n  Could not read form from code string\n  at: line 1, column 36"), "{}", output.text);
}

#[tokio::test]
async fn compiling_a_defun_does_not_make_its_name_defined() {
    let tb = common::toolbox(common::shared_image_port());
    // A function the user really has keeps its definition and its signature.
    common::eval_ok(&tb, "(defun compile-test-existing (a) a)").await;
    let output = compile(&tb, "(defun compile-test-existing (a b) (list a b))").await;
    assert!(!output.is_error, "{}", output.text);
    let output = compile(&tb, "(defun compile-test-user () (compile-test-existing 1))").await;
    assert_eq!(output.text, "Compilation successful\nWarnings: 0\nErrors: 0\n\nCompiled 1 form successfully");
    assert_eq!(common::eval_ok(&tb, "(compile-test-existing 7)").await, "=> 7");
    // A function compile-form compiled is still undefined for the next check.
    compile(&tb, "(defun compile-test-phantom () 1)").await;
    let output = compile(&tb, "(defun compile-test-caller () (compile-test-phantom))").await;
    assert!(
        output.text.contains("STYLE-WARNING: undefined function: COMMON-LISP-USER::COMPILE-TEST-PHANTOM"),
        "{}",
        output.text
    );
}

#[tokio::test]
async fn earlier_forms_shape_later_ones_as_in_a_file() {
    let tb = common::toolbox(common::shared_image_port());
    common::eval_ok(&tb, "(defpackage :compile-test-other (:use :cl))").await;
    // A macro defined earlier in the code is known to later forms, though never run (its uses
    // get a warning that says why); a function defined earlier is known to later calls;
    // IN-PACKAGE switches the package the rest is read in.
    let code = "(defmacro compile-test-twice (x) `(progn ,x ,x))\n\
                (defun compile-test-a () (compile-test-twice (compile-test-b)))\n\
                (defun compile-test-b () 1)\n\
                (in-package :compile-test-other)\n\
                (defun where () (compile-test-a))";
    let output = compile(&tb, code).await;
    assert_eq!(
        output.text,
        "Compilation successful (with warnings)\nWarnings: 1\nErrors: 0\nStyle-warnings: 1\n\n\
         WARNING: (COMPILE-TEST-TWICE (COMPILE-TEST-B)) was not expanded: COMPILE-TEST-TWICE is a macro that this code itself \
         defines (with DEFMACRO or MACROLET), and compile-form and macroexpand-form never run a macro from the request, since \
         expanding it would run its code in the image. Define the macro in the image first (evaluate-lisp or load its file), \
         then check the code that uses it.\n  in form: (DEFUN COMPILE-TEST-A () (COMPILE-TEST-TWICE (COMPILE-TEST-B)))\n  \
         at: line 2, column 26\n  severity: WARNING\n\n\
         STYLE-WARNING: undefined function: COMPILE-TEST-OTHER::COMPILE-TEST-A\n  in form: (DEFUN WHERE () (COMPILE-TEST-A))\n  \
         at: line 5, column 17\n  severity: STYLE-WARNING\n\nCompiled 5 forms successfully"
    );
    let output = compile(&tb, "(in-package :compile-test-no-such-package)\n(foo)").await;
    assert!(output.is_error);
    assert!(output.text.contains("ERROR: The package COMPILE-TEST-NO-SUCH-PACKAGE does not exist"), "{}", output.text);
}

#[tokio::test]
async fn conditions_are_placed_at_their_subform() {
    let tb = common::toolbox(common::shared_image_port());
    let code = "(defun compile-test-f1 () 1)\n\n(defun compile-test-f2 ()\n  (let ((x 1 2))\n    x))\n(defun compile-test-f3 (a)\n  (let ((unused 1)) a))";
    let output = compile(&tb, code).await;
    assert!(output.is_error);
    assert_eq!(
        output.text,
        "Compilation failed\nWarnings: 0\nErrors: 1\nStyle-warnings: 1\n\n\
         ERROR: The LET binding spec (X 1 2) is malformed.\n  in form: (DEFUN COMPILE-TEST-F2 () (LET ((X 1 2)) X))\n  \
         at: line 4, column 9\n  severity: ERROR\n\n\
         STYLE-WARNING: The variable UNUSED is defined but never used.\n  in form: (DEFUN COMPILE-TEST-F3 (A) (LET ((UNUSED 1)) A))\n  \
         at: line 7, column 9\n  severity: STYLE-WARNING\n\nCompiled 3 forms, with errors"
    );
    // A macro that fails while expanding is a compile error, not a tool failure.
    let output = compile(&tb, "(defun compile-test-loop () (loop for))").await;
    assert!(output.text.contains("ERROR: during macroexpansion of (LOOP FOR)."), "{}", output.text);
    assert!(output.text.contains("at: line 1, column 29"), "{}", output.text);
}

#[tokio::test]
async fn compile_form_rejects_unknown_packages_and_bad_arguments() {
    let tb = common::toolbox(common::shared_image_port());
    let output = common::call(&tb, "compile-form", json!({"code": "1", "package": "COMPILE-TEST-NOPE"})).await;
    assert!(output.is_error);
    assert_eq!(output.text, "The package \"COMPILE-TEST-NOPE\" does not exist.");
    let output = common::call(&tb, "compile-form", json!({})).await;
    assert!(output.is_error && output.text.contains("Missing required argument `code`"), "{}", output.text);
    let output = compile(&tb, "(compile-test-nope::f)").await;
    assert!(output.text.contains("Package COMPILE-TEST-NOPE does not exist."), "{}", output.text);
}

#[tokio::test]
async fn macroexpand_form_contract_examples() {
    let tb = common::toolbox(common::shared_image_port());
    // SBCL 2.2.9's DEFUN expansion differs in detail from the contract's.
    let output = expand(&tb, json!({"form": "(defun foo (x) (1+ x))"})).await;
    assert!(!output.is_error);
    assert_eq!(
        output.text,
        "Expansion of (DEFUN FOO (X) (1+ X)):\n\n(progn\n (eval-when (:compile-toplevel) (sb-c:%compiler-defun 'foo t nil nil))\n \
         (sb-impl::%defun 'foo\n                  (sb-int:named-lambda foo\n                      (x)\n                    (block foo (1+ x)))))"
    );
    // SBCL's PUSH binds the item first, so that it is evaluated before the place.
    let output = expand(&tb, json!({"form": "(push item list)", "full": true})).await;
    assert_eq!(
        output.text,
        "Expansion of (PUSH ITEM LIST):\n\n(let* ((#:item item))\n  (setq list (cons #:item list)))"
    );
    let output = expand(&tb, json!({"form": "(loop for i from 1 to 10 collect (* i i))"})).await;
    let text = without_gensym_counters(&output.text);
    assert!(
        text.starts_with(
            "Expansion of (LOOP FOR I FROM 1 TO 10 COLLECT (* I I)):\n\n(block nil\n  (let ((i 1))\n    (declare (ignorable i)\n             (type (and real number) i))\n    \
             (sb-loop::with-loop-list-collection-head (#:loop-list-head\n"
        ),
        "{text}"
    );
    let output = expand(&tb, json!({"form": "(with-open-file (s \"test.txt\") (read s))"})).await;
    assert_eq!(
        without_gensym_counters(&output.text),
        "Expansion of (WITH-OPEN-FILE (S \"test.txt\") (READ S)):\n\n(let ((s (open \"test.txt\")) (#:g t))\n  \
         (unwind-protect (multiple-value-prog1 (progn (read s)) (setq #:g nil))\n    (when s (close s :abort #:g))))"
    );
    let output = expand(&tb, json!({"form": "(+ 1 2)"})).await;
    assert!(!output.is_error);
    assert_eq!(output.text, "Expansion of (+ 1 2):\n\n(+ 1 2)\n\n(Form is not a macro call)");
    let output = expand(&tb, json!({"form": "(defun"})).await;
    assert!(output.is_error);
    assert_eq!(output.text, "Error reading form: end of file on #<STRING-INPUT-STREAM>");
    let output = expand(&tb, json!({"form": "(loop for)"})).await;
    assert!(output.is_error);
    assert_eq!(output.text, "[ERROR] SB-INT:SIMPLE-PROGRAM-ERROR\nLOOP source code ran out when another token was expected.\ncurrent LOOP context: FOR.");
}

#[tokio::test]
async fn full_expansion_leaves_no_macro_call_anywhere() {
    let tb = common::toolbox(common::shared_image_port());
    let form = "(let ((acc '())) (dolist (x '(1 2 3)) (when (oddp x) (push x acc))) (unless acc (incf (car acc))) acc)";
    let one_step = expand(&tb, json!({"form": form})).await;
    // LET is a special operator: one step expands nothing.
    assert!(one_step.text.ends_with("\n\n(Form is not a macro call)"), "{}", one_step.text);
    let full = expand(&tb, json!({"form": form, "full": true})).await;
    assert!(!full.is_error);
    let expansion = full.structured_value().unwrap()["expansion"].as_str().unwrap().to_string();
    for macro_name in ["(dolist", "(when", "(push", "(unless", "(incf"] {
        assert!(!expansion.contains(macro_name), "{macro_name} left in {expansion}");
    }
    assert!(expansion.contains("(if (oddp x)"), "{expansion}");
    // What the expansion keeps from evaluating is shown as written: LOAD-TIME-VALUE, and
    // COMPILER-LET where one step leaves it in place.
    let output = expand(&tb, json!({"form": "(flet ((g () (load-time-value (when t 1)))) (g))", "full": true})).await;
    let shown = "(flet ((g ()\n         (load-time-value\n          (if t\n              1))))\n  (g))";
    assert!(output.text.ends_with(shown), "{}", output.text);
    let output = expand(&tb, json!({"form": "(when t (sb-cltl2:compiler-let ((x 1)) x))"})).await;
    assert!(output.text.ends_with("(if t\n    (sb-cltl2:compiler-let ((x 1)) x))"), "{}", output.text);
    // A symbol macro is a macro call too.
    common::eval_ok(&tb, "(define-symbol-macro macroexpand-test-sm (car *macroexpand-test-list*))").await;
    assert_eq!(
        expand(&tb, json!({"form": "macroexpand-test-sm"})).await.text,
        "Expansion of MACROEXPAND-TEST-SM:\n\n(car *macroexpand-test-list*)"
    );
}

#[tokio::test]
async fn macroexpand_form_reads_in_the_given_package_and_interns_nothing() {
    let tb = common::toolbox(common::shared_image_port());
    common::eval_ok(&tb, "(defpackage :macroexpand-test-pkg (:use :cl)) (in-package :macroexpand-test-pkg) (defmacro local-twice (x) `(list ,x ,x)) (in-package :cl-user)").await;
    let output = expand(
        &tb,
        json!({"form": "(local-twice (macroexpand-test-fresh-symbol))", "package": "macroexpand-test-pkg"}),
    )
    .await;
    assert_eq!(
        output.text,
        "Expansion of (LOCAL-TWICE (MACROEXPAND-TEST-FRESH-SYMBOL)):\n\n(list (macroexpand-test-fresh-symbol) (macroexpand-test-fresh-symbol))"
    );
    assert_eq!(
        common::eval_ok(&tb, "(find-symbol \"MACROEXPAND-TEST-FRESH-SYMBOL\" :macroexpand-test-pkg)").await,
        "=> NIL\n=> NIL"
    );
    let output = expand(&tb, json!({"form": "(when a b) (extra)"})).await;
    assert!(output.is_error);
    assert_eq!(output.text, "Error reading form: expected one form, but more follows at line 1, column 12");
    let output = expand(&tb, json!({"form": "#.(print :read-eval)"})).await;
    assert_eq!(output.text, "Error reading form: can't read #. while *READ-EVAL* is NIL");
    let output = expand(&tb, json!({"form": "(x)", "package": "MACROEXPAND-TEST-NOPE"})).await;
    assert_eq!(output.text, "The package \"MACROEXPAND-TEST-NOPE\" does not exist.");
}

#[tokio::test]
async fn a_timeout_interrupts_compilation_and_still_leaves_nothing_behind() {
    let port = common::shared_image_port();
    let settings = swank_mcp::tools::Settings { eval_timeout: Duration::from_millis(500), ..common::settings() };
    let roots = swank_mcp::source::AllowedRoots::new(Vec::new()).unwrap();
    let impatient = Arc::new(Toolbox::new(settings, vec![common::image_settings(port)], roots));
    let started = std::time::Instant::now();
    // The image's own macro runs while the form compiles, and takes too long. (A macro of the
    // code itself would never run.)
    common::eval_ok(&common::toolbox(port), "(defmacro compile-test-slow () (sleep 10) 1)").await;
    let output = compile(&impatient, "(defun compile-test-waits () (compile-test-slow))").await;
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(output.is_error);
    assert!(
        output.text.starts_with(
            "[ERROR] EVALUATION-TIMEOUT\nEvaluation exceeded the time limit of 500 ms and was interrupted. \
             Start swank-mcp with a larger --eval-timeout if this needs longer."
        ),
        "{}",
        output.text
    );
    let tb = common::toolbox(port);
    assert_eq!(common::eval_ok(&tb, "(find-symbol \"COMPILE-TEST-WAITS\")").await, "=> NIL\n=> NIL");
}

/// The warnings of compiling `code` as a file in a fresh `sbcl --non-interactive`, as a shell
/// would: each message, in order.
fn compile_file_warnings(code: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("code.lisp");
    std::fs::write(&file, code).unwrap();
    let script = format!(
        "(handler-bind ((warning (lambda (w) (format t \"~&WARNING-MESSAGE: ~A~%\" w)))) \
         (compile-file {:?} :output-file {:?}))",
        file.display().to_string(),
        dir.path().join("code.fasl").display().to_string()
    );
    let output = std::process::Command::new("sbcl")
        .args(["--non-interactive", "--no-sysinit", "--no-userinit", "--eval", &script])
        .output()
        .expect("sbcl runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("WARNING-MESSAGE: ").map(str::to_string))
        .collect()
}

/// A use of a macro the code itself defines is not expanded (its expander never runs), but what
/// it mentions counts as used: compile-form warns about what a shell's compile-file of the same
/// text warns about, and nothing else but the refusal (issue 32.1).
#[tokio::test]
async fn an_unexpanded_macro_use_warns_only_as_compile_file_does() {
    let tb = common::toolbox(common::shared_image_port());
    let code = "(defpackage :compile-test-twice (:use :cl))\n(in-package :compile-test-twice)\n\
                (defmacro twice (x) `(progn ,x ,x))\n\
                (defun use-twice (s) (twice (print s)))\n\
                (defun use-local (s) (flet ((show (x) (print x))) (twice (show s)) (values)))\n\
                (defun not-used (s) (twice 1))\n";
    common::eval_ok(&tb, "(defpackage :compile-test-twice (:use :cl))").await;
    let output = common::call(&tb, "compile-form", json!({"code": code, "package": "COMPILE-TEST-TWICE"})).await;
    let structured = output.structured_value().unwrap();
    let conditions = structured["conditions"].as_array().unwrap();
    let (refused, others): (Vec<&str>, Vec<&str>) = conditions
        .iter()
        .map(|c| c["message"].as_str().unwrap())
        .partition(|message| message.contains("was not expanded: TWICE is a macro that this code itself defines"));
    assert_eq!(refused.len(), 3, "{}", output.text);
    assert_eq!(others, compile_file_warnings(code), "{}", output.text);
    assert_eq!(others, ["The variable S is defined but never used."], "only NOT-USED's S: {}", output.text);
}
