//! No code from the request runs in compile-form or macroexpand-form (issue 16): every way a
//! request can hand the compiler code to run at compile or expansion time, tried against a real
//! image, through the real binary under `--read-only` and through the toolbox without it. Each
//! attempt would create a file if its code ran; none may, and nothing may stay defined.

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
    ]
}

/// Every symbol of the test package that names something: a function, macro, compiler macro,
/// type, setf expander or global symbol macro.
const DEFINED: &str = "(let ((found '())) \
     (do-symbols (s :rc-test) \
       (when (and (eq (symbol-package s) (find-package :rc-test)) \
                  (or (fboundp s) (compiler-macro-function s) (sb-int:info :type :kind s) \
                      (sb-int:info :setf :expander s) (eq (sb-int:info :variable :kind s) :macro))) \
         (push s found))) \
     (sort (mapcar #'symbol-name found) #'string<))";

/// A package for the attempts, with one macro of the image's own that puts its argument into a
/// MACROLET definition, as some library macros do.
async fn prepare(toolbox: &Arc<Toolbox>) {
    common::eval_ok(
        toolbox,
        "(defpackage :rc-test (:use :cl)) \
         (defmacro rc-test::rc-image-macrolet (&body body) `(macrolet ((rc-test::inner () ,@body)) (rc-test::inner)))",
    )
    .await;
}

#[tokio::test]
async fn under_read_only_no_request_code_runs_and_nothing_stays_defined() {
    let port = common::shared_image_port();
    let toolbox = common::toolbox(port);
    prepare(&toolbox).await;
    let directory = tempfile::tempdir().unwrap();
    let marker = directory.path().join("ran");
    let mut client = common::McpClient::start(&["--port", &port.to_string(), "--read-only"]).await;
    client.initialize().await;
    for (name, code) in attempts(&marker) {
        let reply = client.call_tool("compile-form", json!({"code": code, "package": "RC-TEST"})).await;
        let text = common::text(&reply);
        assert!(!marker.exists(), "compile-form ran the code of {name}: {text}");
        assert!(text.starts_with("Compilation"), "{name}: a compilation report, not a failure of the call: {text}");
        let reply =
            client.call_tool("macroexpand-form", json!({"form": code, "package": "RC-TEST", "full": true})).await;
        assert!(!marker.exists(), "macroexpand-form ran the code of {name}: {}", common::text(&reply));
        let reply = client.call_tool("macroexpand-form", json!({"form": code, "package": "RC-TEST"})).await;
        assert!(!marker.exists(), "macroexpand-form (one step) ran the code of {name}: {}", common::text(&reply));
    }
    assert_eq!(
        common::without_handle(&common::eval_ok(&toolbox, DEFINED).await),
        "=> (\"RC-IMAGE-MACROLET\")",
        "only the image's own macro is defined"
    );
}

#[tokio::test]
async fn refused_macros_are_named_with_the_reason_and_where_they_are_used() {
    let toolbox = common::toolbox(common::shared_image_port());
    prepare(&toolbox).await;
    let directory = tempfile::tempdir().unwrap();
    let marker = directory.path().join("ran");
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

#[tokio::test]
async fn without_read_only_compile_form_runs_nothing_and_leaves_nothing_defined() {
    let toolbox = common::toolbox(common::shared_image_port());
    prepare(&toolbox).await;
    let directory = tempfile::tempdir().unwrap();
    let marker = directory.path().join("ran");
    for (name, code) in attempts(&marker) {
        let output = common::call(&toolbox, "compile-form", json!({"code": code, "package": "RC-TEST"})).await;
        assert!(!marker.exists(), "compile-form ran the code of {name}: {}", output.text);
    }
    assert_eq!(common::without_handle(&common::eval_ok(&toolbox, DEFINED).await), "=> (\"RC-IMAGE-MACROLET\")");
}
