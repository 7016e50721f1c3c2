//! find-definition's text search and system listing on real code (Debian's Alexandria, a
//! fixture project), and the callers of a macro or inline function recompiled when a load
//! changes it, against a real SBCL + cl-swank image.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use swank_mcp::source::AllowedRoots;
use swank_mcp::tools::{ToolOutput, Toolbox};

const ALEXANDRIA: &str = "/usr/share/common-lisp/source/alexandria/";

async fn call(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> ToolOutput {
    common::call_within(toolbox, tool, arguments, Duration::from_secs(120)).await
}

async fn ok(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> String {
    let output = call(toolbox, tool, arguments).await;
    assert!(!output.is_error, "{}", output.text);
    output.text
}

fn toolbox(port: u16, root: &Path) -> Arc<Toolbox> {
    let roots = AllowedRoots::new(vec![root.to_path_buf()]).unwrap();
    Arc::new(Toolbox::new(common::settings(), vec![common::image_settings(port)], roots))
}

/// The 1-based numbers of the lines of `file` that hold `text`.
fn lines_holding(file: &str, text: &str) -> Vec<(usize, String)> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(text))
        .map(|(i, line)| (i + 1, line.to_string()))
        .collect()
}

#[tokio::test]
async fn a_systems_files_are_listed_and_searched_for_the_definitions_holding_a_text() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let tb = toolbox(image.port, dir.path());
    // Registered, not loaded: the look reads the system's components, never its .asd file.
    common::eval_ok(&tb, "(require :asdf) (asdf:find-system \"alexandria\")").await;

    let listed = ok(&tb, "find-definition", json!({"system": "alexandria"})).await;
    // The .asd file first, then the components in the system's order, relative to its directory.
    assert!(
        listed.starts_with(&format!("System alexandria: 25 files in {ALEXANDRIA}\n  alexandria.asd\n")),
        "{listed}"
    );
    for file in ["alexandria-1/package.lisp", "alexandria-1/lists.lisp", "alexandria-2/arrays.lisp"] {
        assert!(listed.contains(&format!("\n  {file}\n")), "{file} in {listed}");
    }

    let found = ok(&tb, "find-definition", json!({"text": "proper-list-length", "system": "alexandria"})).await;
    // The definition around each matching line, at the line where it starts, then the lines.
    let sequences = format!("{ALEXANDRIA}alexandria-1/sequences.lisp");
    let lines = lines_holding(&sequences, "proper-list-length");
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(
        found.contains(&format!("\n{sequences}:28 (defun rotate-tail-to-head)\n  31: {}\n", lines[0].1)),
        "{found}"
    );
    for (number, line) in &lines {
        assert!(found.contains(&format!("\n  {number}: {line}")), "{number} in {found}");
    }
    // The export in package.lisp, and the definition itself in a macrolet.
    assert!(found.contains("alexandria-1/package.lisp:"), "{found}");
    assert!(
        found.contains("alexandria-1/lists.lisp:192 (macrolet)\n  211:   (def proper-list-length (list)\n"),
        "{found}"
    );
    // At most ten lines a definition; the rest are counted.
    assert!(
        found.contains("(deftest proper-list-length.1)\n  719: ") && found.contains("\n  ... 1 more line\n"),
        "{found}"
    );
    // A page of one says where the next starts.
    let page =
        ok(&tb, "find-definition", json!({"text": "proper-list-length", "system": "alexandria", "limit": 1})).await;
    assert!(page.contains(", 1 to 1:\n") && page.ends_with("use `offset: 1` for the next page."), "{page}");

    let unknown = call(&tb, "find-definition", json!({"system": "no-such-system-here"})).await;
    assert!(
        unknown.is_error && unknown.text.contains("No system \"no-such-system-here\" is registered"),
        "{}",
        unknown.text
    );
    let both = call(&tb, "find-definition", json!({"symbol": "car", "text": "x"})).await;
    assert!(both.is_error, "{}", both.text);
}

#[tokio::test]
async fn a_text_is_found_in_the_lisp_files_under_the_roots_without_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("src")).unwrap();
    std::fs::write(
        root.join("src/cells.lisp"),
        "(in-package :app)\n\n;; Where the column is computed.\n(defun cell-column (cell)\n  (let ((column (second cell)))\n    (1+ column)))\n",
    )
    .unwrap();
    std::fs::write(root.join("notes.txt"), "column\n").unwrap();
    let tb = toolbox(common::dead_port(), &root);
    let found = ok(&tb, "find-definition", json!({"text": "Column"})).await;
    assert_eq!(
        found,
        "\"Column\" is in 2 places in 1 file (of 1 searched in the roots):\nsrc/cells.lisp:3\n  3: ;; Where the column is \
         computed.\nsrc/cells.lisp:4 (defun cell-column)\n  4: (defun cell-column (cell)\n  5:   (let ((column (second \
         cell)))\n  6:     (1+ column)))"
    );
    // With source, each definition holding it comes whole, once, in place of its lines; a comment
    // keeps its line.
    let found = ok(&tb, "find-definition", json!({"text": "Column", "source": true})).await;
    assert_eq!(
        found,
        "\"Column\" is in 2 places in 1 file (of 1 searched in the roots):\nsrc/cells.lisp:3\n  3: ;; Where the column is \
         computed.\nsrc/cells.lisp:4 (defun cell-column)\n(defun cell-column (cell)\n  (let ((column (second cell)))\n    \
         (1+ column)))"
    );
}

const MACROS: &str = "\
(in-package #:callers-app)

(defmacro scaled (x)
  `(* ,x 2))

(declaim (inline bump))
(defun bump (x)
  (+ x 1))
";

const USERS: &str = "\
(in-package #:callers-app)

(defun use-scaled (x)
  (scaled x))

(defun use-bump (x)
  (bump x))
";

#[tokio::test]
async fn a_macro_or_inline_function_loaded_anew_has_its_callers_recompiled_from_their_files() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("package.lisp"), "(defpackage #:callers-app (:use #:cl))\n").unwrap();
    std::fs::write(root.join("macros.lisp"), MACROS).unwrap();
    std::fs::write(root.join("users.lisp"), USERS).unwrap();
    let asd = root.join("callers-app.asd");
    std::fs::write(
        &asd,
        "(asdf:defsystem \"callers-app\" :serial t :components ((:file \"package\") (:file \"macros\") (:file \"users\")))\n",
    )
    .unwrap();
    let tb = toolbox(image.port, &root);
    common::eval_ok(&tb, &format!("(require :asdf) (asdf:load-asd {:?})", asd.display().to_string())).await;
    ok(&tb, "load-system", json!({"system": "callers-app"})).await;
    // A caller typed at the REPL has no file to be recompiled from.
    common::eval_ok(&tb, "(defun callers-app::repl-scaled (x) (callers-app::scaled x))").await;
    let value = |code: &'static str| {
        let tb = tb.clone();
        async move { common::without_handle(&common::eval_ok(&tb, code).await).to_string() }
    };
    assert_eq!(value("(callers-app::use-scaled 5)").await, "=> 10");

    let macros = root.join("macros.lisp").display().to_string();
    let edited = ok(
        &tb,
        "edit-lisp-form",
        json!({"file_path": macros, "form_type": "defmacro", "form_name": "scaled", "operation": "patch",
               "old_text": "(* ,x 2)", "new_text": "(* ,x 3)", "load": true}),
    )
    .await;
    assert!(
        edited.contains(
            "Recompiled 1 caller of CALLERS-APP::SCALED, compiled with its old definition: CALLERS-APP::USE-SCALED \
             (users.lisp:3); not recompiled, still running the old one: CALLERS-APP::REPL-SCALED (no file)."
        ),
        "{edited}"
    );
    assert_eq!(value("(callers-app::use-scaled 5)").await, "=> 15");
    assert_eq!(value("(callers-app::repl-scaled 5)").await, "=> 10");

    // An inline function, loaded by load-file after an edit that did not load it.
    assert_eq!(value("(callers-app::use-bump 1)").await, "=> 2");
    ok(
        &tb,
        "edit-lisp-form",
        json!({"file_path": macros, "form_type": "defun", "form_name": "bump", "operation": "patch",
               "old_text": "(+ x 1)", "new_text": "(+ x 10)"}),
    )
    .await;
    let loaded = ok(&tb, "load-file", json!({"file_path": macros})).await;
    assert!(
        loaded.contains(
            "Recompiled 1 caller of CALLERS-APP::BUMP, compiled with its old definition: CALLERS-APP::USE-BUMP \
             (users.lisp:6)."
        ),
        "{loaded}"
    );
    assert_eq!(value("(callers-app::use-bump 1)").await, "=> 11");
}

#[tokio::test]
async fn callers_later_in_the_edited_file_are_found_where_the_edit_moved_them() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let file = root.join("inlined.lisp");
    std::fs::write(
        &file,
        "(defpackage #:inlined-app (:use #:cl))\n(in-package #:inlined-app)\n\n\
         (declaim (inline near))\n(defun near (x y)\n  (< (abs (- x y)) 1))\n\n\
         (defun close-p (x y)\n  (near x y))\n",
    )
    .unwrap();
    let tb = toolbox(image.port, &root);
    let path = file.display().to_string();
    common::eval_ok(&tb, &format!("(load (compile-file {path:?}))")).await;
    // Lengthening NEAR moves CLOSE-P from where SBCL recorded it.
    let edited = ok(
        &tb,
        "edit-lisp-form",
        json!({"file_path": path, "form_type": "defun", "form_name": "near", "operation": "patch",
               "old_text": "1))", "new_text": "1/1000))", "load": true}),
    )
    .await;
    assert!(
        edited.contains("Recompiled 1 caller of INLINED-APP::NEAR, compiled with its old definition: INLINED-APP::CLOSE-P (inlined.lisp:8)."),
        "{edited}"
    );
    assert_eq!(common::without_handle(&common::eval_ok(&tb, "(inlined-app::close-p 1 1.5)").await), "=> NIL");
}

/// A caller of a caller, inlined through it (BASE inline, MIDDLE inline and calling it, TOP calling
/// MIDDLE), runs BASE's old body as much as MIDDLE does (issue 49.6): both are recompiled, each
/// after what it inlines, and the reply says so.
#[tokio::test]
async fn a_caller_inlining_a_caller_of_a_changed_inline_function_is_recompiled_too() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let file = root.join("deep.lisp");
    std::fs::write(
        &file,
        "(defpackage #:deep-app (:use #:cl))\n(in-package #:deep-app)\n\n\
         (declaim (inline base))\n(defun base (x)\n  (+ x 1))\n\n\
         (declaim (inline middle))\n(defun middle (x)\n  (* (base x) 2))\n\n\
         (defun top (x)\n  (middle x))\n",
    )
    .unwrap();
    let users = root.join("users.lisp");
    std::fs::write(&users, "(in-package #:deep-app)\n\n(defun outer (x)\n  (middle x))\n").unwrap();
    let tb = toolbox(image.port, &root);
    let path = file.display().to_string();
    common::eval_ok(&tb, &format!("(load (compile-file {path:?}))")).await;
    common::eval_ok(&tb, &format!("(load (compile-file {:?}))", users.display().to_string())).await;
    let value = |code: &'static str| {
        let tb = tb.clone();
        async move { common::without_handle(&common::eval_ok(&tb, code).await).to_string() }
    };
    assert_eq!(value("(list (deep-app::top 1) (deep-app::outer 1))").await, "=> (4 4)");
    let edited = ok(
        &tb,
        "edit-lisp-form",
        json!({"file_path": path, "form_type": "defun", "form_name": "base", "operation": "patch",
               "old_text": "(+ x 1)", "new_text": "(+ x 10)", "load": true}),
    )
    .await;
    assert_eq!(value("(list (deep-app::top 1) (deep-app::outer 1))").await, "=> (22 22)", "{edited}");
    assert!(
        edited.contains(
            "Recompiled 1 caller of DEEP-APP::BASE, compiled with its old definition: DEEP-APP::MIDDLE (deep.lisp:9).\n\
             Recompiled 2 callers of DEEP-APP::MIDDLE, compiled with its old definition: "
        ),
        "{edited}"
    );
    assert!(
        edited.contains("DEEP-APP::TOP (deep.lisp:12)") && edited.contains("DEEP-APP::OUTER (users.lisp:3)"),
        "{edited}"
    );
    assert!(!edited.contains("still running the old one"), "{edited}");
}
