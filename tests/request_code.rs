//! No code from the request runs in compile-form or macroexpand-form (issue 16): every way a
//! request can hand the compiler code to run at compile or expansion time, tried against a real
//! image. Each attempt would create a file if its code ran; none may, and nothing may stay
//! defined. This is compile-form's contract, kept as far as swank-mcp can see the request's code;
//! what SBCL itself runs while it folds constants is why neither tool is read-only
//! (tests/read_only.rs).

mod common;

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use swank_mcp::tools::Toolbox;

/// Lisp that creates `marker` when it runs.
fn touch(marker: &Path) -> String {
    format!(
        "(with-open-file (s {:?} :direction :output :if-exists :supersede) (print :ran s))",
        marker.display().to_string()
    )
}

/// The attempts: a name and code that would create the marker at compile or expansion time.
fn attempts(marker: &Path) -> Vec<(&'static str, String)> {
    let touch = touch(marker);
    vec![
        ("macrolet", format!("(macrolet ((m () {touch} nil)) (m))")),
        ("defmacro then a use", format!("(defmacro rc-m () {touch} nil) (defun rc-uses-m () (rc-m))")),
        ("load-time-value in a macrolet definition", format!("(macrolet ((m () (load-time-value {touch}) 1)) 1)")),
        ("define-symbol-macro", format!("(define-symbol-macro rc-sm {touch}) (defun rc-uses-sm () rc-sm)")),
        ("define-compiler-macro", format!("(define-compiler-macro rc-cm (&whole w) {touch} w) (defun rc-cm () 1) (defun rc-uses-cm () (rc-cm))")),
        ("define-setf-expander", format!("(define-setf-expander rc-sx (x) {touch} (values nil nil nil x x)) (defun rc-uses-sx (y) (setf (rc-sx y) 1))")),
        ("defsetf with a body", format!("(defsetf rc-sy (x) (v) {touch} `(list ,x ,v)) (defun rc-uses-sy (y) (setf (rc-sy y) 1))")),
        ("deftype with a body", format!("(deftype rc-ty () {touch} 'integer) (defun rc-uses-ty (y) (declare (type rc-ty y)) y)")),
        ("eval-when :compile-toplevel", format!("(eval-when (:compile-toplevel :load-toplevel :execute) {touch})")),
        ("read-time evaluation", format!("(list #.{touch})")),
        ("symbol-macrolet with load-time-value", format!("(symbol-macrolet ((q (load-time-value {touch}))) q)")),
        ("an image macro wrapping request code in a macrolet", format!("(rc-image-macrolet {touch} nil)")),
        // What the compiler and MACROEXPAND-ALL's walker evaluate themselves (issue 29.1), alone
        // and nested.
        ("compiler-let", format!("(sb-cltl2:compiler-let ((*rc-x* (progn {touch} 1))) nil)")),
        ("compiler-let in a defun", format!("(defun rc-f2 () (sb-cltl2:compiler-let ((*rc-x* (progn {touch} 1))) nil))")),
        ("compiler-let in flet", format!("(flet ((g () (sb-cltl2:compiler-let ((*rc-x* (progn {touch} 1))) nil))) (g))")),
        ("compiler-let in locally", format!("(locally (declare (optimize speed)) (sb-cltl2:compiler-let ((*rc-x* (progn {touch} 1))) nil))")),
        ("compiler-let in a let body", format!("(let ((a 1)) a (sb-cltl2:compiler-let ((*rc-x* (progn {touch} 1))) a))")),
        ("compiler-let in labels in a macrolet body", format!("(macrolet ((m () 1)) (labels ((g () (sb-cltl2:compiler-let ((*rc-x* (progn {touch} 1))) (m)))) (g)))")),
        ("compiler-let in a circular vector", format!("(defun rc-f4 () (list #1=#((sb-cltl2:compiler-let ((*rc-x* (progn {touch} 1))) nil) #1#)))")),
        ("load-time-value beside a circular list", format!("(defun rc-f3 () (list (load-time-value (progn {touch} 1)) '#1=(a . #1#)))")),
        ("load-time-value beside a circular vector", format!("(defun rc-f5 () (list (load-time-value (progn {touch} 1)) #1=#(1 #1#)))")),
        ("load-time-value in flet", format!("(flet ((g () (load-time-value (progn {touch} 1)))) (g))")),
        ("load-time-value in locally", format!("(locally (declare (optimize speed)) (load-time-value (progn {touch} 1)))")),
        ("load-time-value in a let body", format!("(let ((a 1)) a (load-time-value (progn {touch} 1)))")),
        ("load-time-value in circular code", format!("(defun rc-f6 () #1=(progn (load-time-value (progn {touch} 1)) #1#))")),
        ("a macrolet in circular code", format!("(defun rc-f7 () #1=(progn (macrolet ((m () {touch} 1)) (m)) #1#))")),
        ("satisfies in muffle-conditions", "(defun rc-f8 (x) (declare (sb-ext:muffle-conditions (or (satisfies rc-writes-markers) style-warning))) (+ x \"a\"))".to_string()),
        ("satisfies in muffle-conditions in flet", "(flet ((g (x) (locally (declare (sb-ext:muffle-conditions (satisfies rc-writes-markers))) (+ x \"a\")))) (g 1))".to_string()),
        ("a structure-class defclass", format!("(defclass rc-sc () ((a :initform (load-time-value {touch}))) (:metaclass structure-class))")),
        ("a structure-class defclass in a let body", format!("(let () (defclass rc-sc2 () ((a :initform (load-time-value {touch}))) (:metaclass structure-class)))")),
    ]
}

/// Every symbol of the test package that names something: a function, macro, compiler macro,
/// type, setf expander or global symbol macro.
const DEFINED: &str = "(let ((found '())) \
     (do-symbols (s :rc-test) \
       (when (and (eq (symbol-package s) (find-package :rc-test)) \
                  (or (fboundp s) (compiler-macro-function s) (sb-int:info :type :kind s) (find-class s nil) \
                      (sb-int:info :setf :expander s) (eq (sb-int:info :variable :kind s) :macro))) \
         (push s found))) \
     (sort (mapcar #'symbol-name found) #'string<))";

/// A package for the attempts, with one macro of the image's own that puts its argument into a
/// MACROLET definition, as some library macros do, and a function of the image's that creates
/// `marker` (and the other tests' markers) when anything calls it.
async fn prepare(toolbox: &Arc<Toolbox>, marker: &Path) {
    common::eval_ok(
        toolbox,
        &format!(
            "(defpackage :rc-test (:use :cl)) \
             (defmacro rc-test::rc-image-macrolet (&body body) `(macrolet ((rc-test::inner () ,@body)) (rc-test::inner))) \
             (defvar rc-test::*markers* '()) \
             (pushnew {:?} rc-test::*markers* :test #'equal) \
             (defun rc-test::rc-writes-markers (x) \
               (dolist (marker rc-test::*markers* x) \
                 (with-open-file (s marker :direction :output :if-exists :supersede) (print :ran s))))",
            marker.display().to_string()
        ),
    )
    .await;
}

#[tokio::test]
async fn compile_and_expand_run_none_of_the_attempts_and_leave_nothing_defined() {
    let toolbox = common::toolbox(common::shared_image_port());
    let directory = tempfile::tempdir().unwrap();
    let marker = directory.path().join("ran");
    prepare(&toolbox, &marker).await;
    for (name, code) in attempts(&marker) {
        let output = common::call(&toolbox, "compile-form", json!({"code": code, "package": "RC-TEST"})).await;
        assert!(!marker.exists(), "compile-form ran the code of {name}: {}", output.text);
        assert!(
            output.text.starts_with("Compilation"),
            "{name}: a compilation report, not a failure of the call: {}",
            output.text
        );
        for full in [true, false] {
            let output =
                common::call(&toolbox, "macroexpand-form", json!({"form": code, "package": "RC-TEST", "full": full}))
                    .await;
            assert!(!marker.exists(), "macroexpand-form (full: {full}) ran the code of {name}: {}", output.text);
        }
    }
    assert_eq!(
        common::without_handle(&common::eval_ok(&toolbox, DEFINED).await),
        "=> (\"RC-IMAGE-MACROLET\" \"RC-WRITES-MARKERS\")",
        "only the image's own macro and function are defined"
    );
}

#[tokio::test]
async fn refused_macros_are_named_with_the_reason_and_where_they_are_used() {
    let toolbox = common::toolbox(common::shared_image_port());
    let directory = tempfile::tempdir().unwrap();
    let marker = directory.path().join("ran");
    prepare(&toolbox, &marker).await;
    let code = format!("(defun rc-f (x)\n  (macrolet ((twice (y) {} `(list ,y ,y)))\n    (twice x)))", touch(&marker));
    let output = common::call(&toolbox, "compile-form", json!({"code": code, "package": "RC-TEST"})).await;
    assert!(!marker.exists());
    assert!(!output.is_error, "the code may be right; only the macro's uses went unchecked: {}", output.text);
    assert!(
        output.text.contains(
            "WARNING: (TWICE X) was not expanded: TWICE is a macro that this code itself defines (with DEFMACRO or MACROLET), \
             and compile-form and macroexpand-form never run a macro from the request"
        ),
        "{}",
        output.text
    );
    assert!(output.text.contains("at: line 3, column 5"), "placed at the use: {}", output.text);
    // Fully expanded, the use is an error (nothing to show), and the definitions the user wrote
    // are shown as written when nothing uses them.
    let output = common::call(
        &toolbox,
        "macroexpand-form",
        json!({"form": "(macrolet ((twice (y) `(list ,y ,y))) (twice 1))", "full": true}),
    )
    .await;
    assert!(output.is_error);
    assert!(
        output.text.contains("(TWICE 1) was not expanded: TWICE is a macro that this code itself defines"),
        "{}",
        output.text
    );
    let output = common::call(
        &toolbox,
        "macroexpand-form",
        json!({"form": "(macrolet ((twice (y) `(list ,y ,y))) (push 1 z))", "full": true}),
    )
    .await;
    assert!(!output.is_error, "{}", output.text);
    assert!(output.text.contains("(macrolet ((twice (y)\n"), "{}", output.text);
    assert!(output.text.contains("(setq z (cons 1 z))"), "{}", output.text);
    // The image's own macros still expand, local macros they write included.
    let output =
        common::call(&toolbox, "macroexpand-form", json!({"form": "(rc-image-macrolet 1 2)", "package": "RC-TEST"}))
            .await;
    assert!(!output.is_error, "{}", output.text);
    assert!(output.text.contains("(macrolet ((inner ()\n"), "{}", output.text);
}

/// Reading the request interns nothing, however reading or compiling ends (issue 29.2): a read
/// error after a symbol was read, an unclosed form, a feature expression, escaped names, a macro
/// whose expansion fails after interning names, and every attempt above. In a package of its
/// own, which no other test reads in.
#[tokio::test]
async fn reading_and_compiling_intern_nothing_even_when_they_fail() {
    let toolbox = common::toolbox(common::shared_image_port());
    let directory = tempfile::tempdir().unwrap();
    let marker = directory.path().join("ran");
    common::eval_ok(&toolbox, "(defpackage :rc-intern (:use :cl))").await;
    let count =
        "(let ((n 0)) (do-symbols (s :rc-intern) (when (eq (symbol-package s) (find-package :rc-intern)) (incf n))) n)";
    let before = common::eval_ok(&toolbox, count).await;
    let failing = [
        ("compile-form", "code", "(defun f () (list cl-user::swank-mcp-leak-1 #.(+ 1 2)))"),
        ("compile-form", "code", "(defun rc-leak-2 () (list rc-leak-3"),
        (
            "compile-form",
            "code",
            "(list #+swank-mcp-leak-feature-4 rc-leak-5 (defstruct (rc-leak-6 (:include rc-leak-7))))",
        ),
        ("macroexpand-form", "form", "(when cl-user::swank-mcp-leak-8 #.(+ 1 2))"),
        ("macroexpand-form", "form", "(when rc-leak-9 (list rc-leak-10"),
        ("macroexpand-form", "form", "(rc-leak-11 #:rc-leak-12 |rc-leak 13| rc-l\\eak-14"),
    ];
    for (tool, key, code) in failing {
        let output = common::call(&toolbox, tool, json!({key: code, "package": "RC-INTERN"})).await;
        assert!(output.is_error, "{tool} {code}: {}", output.text);
    }
    for (name, code) in attempts(&marker) {
        common::call(&toolbox, "compile-form", json!({"code": code, "package": "RC-INTERN"})).await;
        for full in [true, false] {
            common::call(&toolbox, "macroexpand-form", json!({"form": code, "package": "RC-INTERN", "full": full}))
                .await;
        }
        assert!(!marker.exists(), "the code of {name} ran");
    }
    assert_eq!(common::eval_ok(&toolbox, count).await, before, "a symbol was left interned in RC-INTERN");
    assert_eq!(
        common::without_handle(
            &common::eval_ok(
                &toolbox,
                "(list (find-symbol \"SWANK-MCP-LEAK-1\" :cl-user) (find-symbol \"SWANK-MCP-LEAK-8\" :cl-user) \
                 (find-symbol \"SWANK-MCP-LEAK-FEATURE-4\" :keyword))"
            )
            .await
        ),
        "=> (NIL NIL NIL)"
    );
}
