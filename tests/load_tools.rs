//! load-form, load-file and edit-lisp-form with `load`, against a real SBCL + cl-swank image and
//! a real ASDF project in a temporary directory: the image, the file and find-definition agree
//! after each edit.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use swank_mcp::image::launch::LaunchedImage;
use swank_mcp::source::AllowedRoots;
use swank_mcp::tools::{ToolOutput, Toolbox};

async fn call(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> ToolOutput {
    common::call_within(toolbox, tool, arguments, Duration::from_secs(120)).await
}

const APP: &str = "\
(in-package #:loadtest-app)

;; Says hello.
(defun greet (name)
  (format nil \"Hello, ~A\" name))

(defun helper () 1)

#+sbcl
(progn
  (defun sbcl-only () :old))

(eval-when (:compile-toplevel :load-toplevel :execute)
  (defun early () :old))

(defvar *counter* 0)
";

/// The project `loadtest-app` (package.lisp, app.lisp) in a temporary directory, loaded into a
/// private image by a toolbox whose root is that directory.
struct Project {
    tb: Arc<Toolbox>,
    /// The directory, canonical.
    path: PathBuf,
    _dir: tempfile::TempDir,
    _image: LaunchedImage,
}

impl Project {
    async fn loaded() -> Project {
        let image = common::private_image().await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().canonicalize().unwrap();
        std::fs::write(path.join("package.lisp"), "(defpackage #:loadtest-app (:use #:cl))\n").unwrap();
        std::fs::write(path.join("app.lisp"), APP).unwrap();
        let asd = path.join("loadtest-app.asd");
        std::fs::write(
            &asd,
            "(asdf:defsystem \"loadtest-app\" :serial t :components ((:file \"package\") (:file \"app\")))\n",
        )
        .unwrap();
        let tb = toolbox(image.port, &path);
        common::eval_ok(&tb, &format!("(require :asdf) (asdf:load-asd {:?})", asd.display().to_string())).await;
        ok(&tb, "load-system", json!({"system": "loadtest-app"})).await;
        Project { tb, path, _dir: dir, _image: image }
    }
}

fn toolbox(port: u16, dir: &Path) -> Arc<Toolbox> {
    let roots = AllowedRoots::new(vec![dir.to_path_buf()]).unwrap();
    Arc::new(Toolbox::new(common::settings(), vec![common::image_settings(port)], roots))
}

/// The text of `tool`'s reply to `arguments`, which must not be an error.
async fn ok(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> String {
    let output = call(toolbox, tool, arguments).await;
    assert!(!output.is_error, "{}", output.text);
    output.text
}

/// The value line of evaluating `code`, without the value's handle.
async fn eval(toolbox: &Arc<Toolbox>, code: &str) -> String {
    common::without_handle(&common::eval_ok(toolbox, code).await).to_string()
}

#[tokio::test]
async fn edits_with_load_change_the_image_and_find_definition_follows() {
    let project = Project::loaded().await;
    let tb = &project.tb;
    let app = project.path.join("app.lisp");
    let app_path = app.display().to_string();
    assert_eq!(eval(tb, "(loadtest-app::greet \"you\")").await, "=> \"Hello, you\"");

    // Edit with load: the image runs the new code at once, and find-definition points at the
    // edited file and the form's line, with no note that the file changed.
    let edited = ok(
        tb,
        "edit-lisp-form",
        json!({"file_path": app_path, "form_type": "defun", "form_name": "greet", "operation": "replace",
               "content": "(defun greet (name)\n  (format nil \"Hi there, ~A\" name))", "load": true}),
    )
    .await;
    assert!(
        edited.contains("Replaced `defun greet` (lines 4-5) in app.lisp with 1 form, now at lines 4-5."),
        "{}",
        edited
    );
    assert!(
        edited.contains("\n\nLoaded it into the image, read in package #:loadtest-app. 0 errors, 0 warnings."),
        "{}",
        edited
    );
    assert_eq!(eval(tb, "(loadtest-app::greet \"you\")").await, "=> \"Hi there, you\"");
    let found = call(tb, "find-definition", json!({"symbol": "loadtest-app::greet"})).await;
    assert!(found.text.contains(&format!("{app_path}:4:1")), "{}", found.text);
    assert!(!found.text.contains("changed"), "{}", found.text);

    // An insertion after it lands on its own lines, and so does its definition.
    ok(
        tb,
        "edit-lisp-form",
        json!({"file_path": app_path, "form_type": "defun", "form_name": "greet", "operation": "insert_after",
               "content": "(defvar *greeting* \"Hey\")\n\n(defun greet-2 (name)\n  (format nil \"~A, ~A\" *greeting* name))", "load": true}),
    ).await;
    assert_eq!(eval(tb, "(loadtest-app::greet-2 \"you\")").await, "=> \"Hey, you\"");
    let found = call(tb, "find-definition", json!({"symbol": "loadtest-app::greet-2"})).await;
    assert!(found.text.contains(&format!("{app_path}:9:1")), "{}", found.text);
    let found = call(tb, "find-definition", json!({"symbol": "loadtest-app::*greeting*"})).await;
    assert!(found.text.contains(&format!("{app_path}:7:1")), "{}", found.text);

    // A defun inside `#+sbcl (progn ...)` and one inside eval-when: found, replaced, loaded.
    let outline = call(tb, "lisp-outline", json!({"file_path": app_path})).await;
    assert!(outline.text.contains("  #+sbcl progn\n"), "{}", outline.text);
    assert!(outline.text.contains("    defun sbcl-only\n"), "{}", outline.text);
    assert!(outline.text.contains("  eval-when (:compile-toplevel :load-toplevel :execute)\n"), "{}", outline.text);
    assert!(outline.text.contains("    defun early\n"), "{}", outline.text);
    for name in ["sbcl-only", "early"] {
        ok(
            tb,
            "edit-lisp-form",
            json!({"file_path": app_path, "form_type": "defun", "form_name": name, "operation": "replace",
                   "content": format!("(defun {name} ()\n  :new)"), "load": true}),
        )
        .await;
        assert_eq!(eval(tb, &format!("(loadtest-app::{name})")).await, "=> :NEW");
    }
    let text = std::fs::read_to_string(&app).unwrap();
    assert!(text.contains("#+sbcl\n(progn\n  (defun sbcl-only ()\n    :new))\n"), "{text}");
    assert!(
        text.contains("(eval-when (:compile-toplevel :load-toplevel :execute)\n  (defun early ()\n    :new))\n"),
        "{text}"
    );
    // load-form finds the nested one too. SBCL records the wrapper's place for it; find-definition
    // points at the form itself, found in the file's text.

    ok(tb, "load-form", json!({"file_path": app_path, "form_type": "defun", "form_name": "sbcl-only"})).await;
    let found = call(tb, "find-definition", json!({"symbol": "loadtest-app::sbcl-only"})).await;
    let line = text.lines().position(|line| line == "  (defun sbcl-only ()").unwrap() + 1;
    assert!(found.text.contains(&format!("{app_path}:{line}:3")), "{}", found.text);
    assert!(!found.text.contains("changed"), "{}", found.text);

    // load-form after a change made outside: the image follows the file.
    std::fs::write(&app, text.replace("(defun helper () 1)", "(defun helper () 2)")).unwrap();
    ok(tb, "load-form", json!({"file_path": app_path, "form_type": "defun", "form_name": "helper"})).await;
    assert_eq!(eval(tb, "(loadtest-app::helper)").await, "=> 2");

    // Delete with load: the function is gone from the file and from the image; undo lists it.
    let deleted = ok(
        tb,
        "edit-lisp-form",
        json!({"file_path": app_path, "form_type": "defun", "form_name": "helper", "operation": "delete", "load": true}),
    ).await;
    assert!(deleted.contains("LOADTEST-APP::HELPER is no longer defined in the image"), "{}", deleted);
    assert_eq!(eval(tb, "(fboundp 'loadtest-app::helper)").await, "=> NIL");
    assert!(!std::fs::read_to_string(&app).unwrap().contains("helper"));
    // A variable is made unbound; a class cannot be removed, and the reply says so.
    let deleted = call(
        tb,
        "edit-lisp-form",
        json!({"file_path": app_path, "form_type": "defvar", "form_name": "*counter*", "operation": "delete", "load": true}),
    )
    .await;
    assert!(deleted.text.contains("*COUNTER* is now unbound in the image"), "{}", deleted.text);
    assert_eq!(eval(tb, "(boundp 'loadtest-app::*counter*)").await, "=> NIL");

    // A compile error loads nothing and says where.
    let broken = call(
        tb,
        "edit-lisp-form",
        json!({"file_path": app_path, "form_type": "defun", "form_name": "greet", "operation": "replace",
               "content": "(defun greet (name)\n  (let ((x 1 2)) (list x name)))", "load": true}),
    )
    .await;
    assert!(broken.is_error, "{}", broken.text);
    assert!(broken.text.contains("Not loaded: compiling `defun greet`"), "{}", broken.text);
    assert!(broken.text.contains("at: app.lisp:5:"), "{}", broken.text);
    assert_eq!(eval(tb, "(loadtest-app::greet \"you\")").await, "=> \"Hi there, you\"");

    // An edit without load moves greet down: find-definition finds it again in the current text.
    ok(
        tb,
        "edit-lisp-form",
        json!({"file_path": app_path, "form_type": "defun", "form_name": "greet", "operation": "insert_before",
               "content": "(defun zero ()\n  0)"}),
    )
    .await;
    let found = call(tb, "find-definition", json!({"symbol": "loadtest-app::greet"})).await;
    assert!(found.text.contains(&format!("{app_path}:7:1")), "{}", found.text);
    assert!(
        found.text.contains("(the file changed since this was compiled; found in its current text)"),
        "{}",
        found.text
    );
}

#[tokio::test]
async fn load_file_reports_each_warning_at_its_line() {
    let project = Project::loaded().await;
    let tb = &project.tb;
    let other = project.path.join("other.lisp");
    std::fs::write(
        &other,
        "(in-package #:loadtest-app)\n\n(defun uses-missing (x)\n  (list x\n        (missing-function x)))\n\n(defun unused-arg (y)\n  1)\n",
    )
    .unwrap();
    let loaded = ok(tb, "load-file", json!({"file_path": other.display().to_string()})).await;
    assert!(
        loaded.starts_with("Compiled and loaded other.lisp (3 top-level forms with 2 definitions, nested ones included). 0 errors, 0 warnings, 2 style-warnings."),
        "{}",
        loaded
    );
    assert!(loaded.contains("STYLE-WARNING: The variable Y is defined but never used."), "{}", loaded);
    assert!(loaded.contains("at: other.lisp:7:1"), "{}", loaded);
    assert!(loaded.contains("STYLE-WARNING: undefined function: LOADTEST-APP::MISSING-FUNCTION"), "{}", loaded);
    assert!(
        loaded.contains("in form: (LOADTEST-APP::MISSING-FUNCTION LOADTEST-APP::X)\n  at: other.lisp:5:9"),
        "{}",
        loaded
    );
    assert_eq!(eval(tb, "(loadtest-app::unused-arg 0)").await, "=> 1");
    let found = call(tb, "find-definition", json!({"symbol": "loadtest-app::unused-arg"})).await;
    assert!(found.text.contains(&format!("{}:7:1", other.display())), "{}", found.text);

    // A file outside the allowed roots is refused before the image is asked.
    let refused = call(tb, "load-file", json!({"file_path": "/etc/passwd"})).await;
    assert!(refused.is_error, "{}", refused.text);

    // The source tools may read (not write) the files of the ASDF systems the image knows.
    let lists = "/usr/share/common-lisp/source/alexandria/alexandria-1/lists.lisp";
    let before = call(tb, "lisp-outline", json!({"file_path": "/usr/share/common-lisp/source/slime/swank.asd"})).await;
    assert!(before.is_error, "{}", before.text);
    eval(tb, "(asdf:find-system \"alexandria\")").await;
    let outline = ok(tb, "lisp-outline", json!({"file_path": lists})).await;
    assert!(outline.contains("defun flatten"), "{}", outline);
    let checked = call(tb, "lisp-check-parens", json!({"file_path": lists})).await;
    assert!(checked.text.starts_with("Balanced: "), "{}", checked.text);
    let edit = call(
        tb,
        "edit-lisp-form",
        json!({"file_path": lists, "form_type": "defun", "form_name": "flatten", "operation": "delete"}),
    )
    .await;
    assert!(edit.is_error && edit.text.contains("outside the allowed roots"), "{}", edit.text);
}

#[tokio::test]
async fn a_batch_with_load_patches_deletes_and_loads_each_file_once() {
    let project = Project::loaded().await;
    let tb = &project.tb;
    let app = project.path.join("app.lisp");
    // The file, the form type and `load` said once, in the call, as an agent first writes a
    // batch; an edit that says `load: false` stays in the file only.
    let output = ok(
        tb,
        "edit-lisp-form",
        json!({"file_path": app, "form_type": "defun", "load": true, "edits": [
            {"form_name": "greet", "operation": "patch", "old_text": "Hello, ~A", "new_text": "Hi, ~A"},
            {"form_name": "helper", "operation": "delete"},
            {"form_name": "sbcl-only", "operation": "patch", "old_text": ":old", "new_text": ":new"},
            {"form_name": "early", "operation": "patch", "old_text": ":old", "new_text": ":new", "load": false},
        ]}),
    )
    .await;
    // The two changed forms of the one file are compiled in one load; the deleted one leaves.
    assert_eq!(output.matches("\nLoaded the ").count(), 1, "{}", output);
    assert!(output.contains("\nLoaded the 2 forms into the image"), "{}", output);
    assert!(output.contains("\nLOADTEST-APP::HELPER is no longer defined in the image"), "{}", output);
    assert_eq!(eval(tb, "(loadtest-app::greet \"you\")").await, "=> \"Hi, you\"");
    assert_eq!(eval(tb, "(loadtest-app::sbcl-only)").await, "=> :NEW");
    assert_eq!(eval(tb, "(fboundp 'loadtest-app::helper)").await, "=> NIL");
    assert_eq!(eval(tb, "(loadtest-app::early)").await, "=> :OLD");
    let text = std::fs::read_to_string(&app).unwrap();
    assert!(
        text.contains("\"Hi, ~A\"") && !text.contains("defun helper") && text.contains("(defun sbcl-only () :new)")
    );
    assert!(text.contains("(defun early () :new)"), "{text}");
}

/// load-file sends the image the bytes the server read, which it compiles from a private copy
/// (a file only its user may read, in a directory made for the call and removed after) under
/// the real file's name: the definitions' source locations name the real file, at their lines,
/// with nothing said of a change, and the copy is gone.
#[tokio::test]
async fn load_file_compiles_a_private_copy_under_the_real_name() {
    let port = common::shared_image_port();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let file = root.join("located.lisp");
    let text = r#"(in-package :cl-user)
(eval-when (:compile-toplevel) (require :sb-posix))
(eval-when (:compile-toplevel)
  (defparameter *located-copy*
    (list (namestring *compile-file-truename*)
          (logand #o777 (sb-posix:stat-mode (sb-posix:stat (directory-namestring *compile-file-truename*))))
          (logand #o777 (sb-posix:stat-mode (sb-posix:stat *compile-file-truename*))))))
;; Not ASCII: été, whose bytes reach the image as they are.
(defun located-function () "été")

(defmacro located-macro () 1)
"#;
    std::fs::write(&file, text).unwrap();
    let tb = toolbox(port, &root);
    let path = file.display().to_string();
    let loaded = ok(&tb, "load-file", json!({"file_path": path})).await;
    assert!(loaded.starts_with("Compiled and loaded located.lisp"), "{loaded}");
    assert_eq!(eval(&tb, "(length (located-function))").await, "=> 3");
    for (symbol, line) in [("located-function", 9), ("located-macro", 11)] {
        let found = ok(&tb, "find-definition", json!({"symbol": format!("cl-user::{symbol}")})).await;
        assert!(found.contains(&format!("{path}:{line}:1")), "{found}");
        assert!(!found.contains("changed since"), "{found}");
    }
    let recorded = eval(
        &tb,
        "(namestring (sb-introspect:definition-source-pathname \
           (first (sb-introspect:find-definition-sources-by-name 'located-function :function))))",
    )
    .await;
    assert_eq!(recorded, format!("=> {path:?}"));
    // Compiled from the private copy, which is gone.
    let copy = eval(
        &tb,
        &format!(
            "(destructuring-bind (name directory-mode file-mode) *located-copy* \
               (list (string= name {path:?}) directory-mode file-mode (probe-file (directory-namestring name))))"
        ),
    )
    .await;
    assert_eq!(copy, "=> (NIL 448 384 NIL)");
    eval(&tb, "(progn (fmakunbound 'located-function) (fmakunbound 'located-macro) (makunbound '*located-copy*))")
        .await;
}

/// Puts `root/sub` back as the directory it was, after a swap.
fn restore(root: &Path) {
    let sub = root.join("sub");
    if sub.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::remove_file(&sub).unwrap();
        std::fs::rename(root.join("sub.inside"), &sub).unwrap();
    }
}

/// A directory on a loaded file's path swapped for a symlink during the call must not make the
/// image load a file outside the roots (issue 29.3): the server reads the file beneath its root
/// and the image compiles the bytes it read, never opening the path itself. The swap comes at
/// delays that span the server's read of a file large enough to take a while and the image's
/// compiling it.
#[tokio::test]
async fn load_file_never_loads_a_file_outside_the_roots_through_a_swapped_directory() {
    let port = common::shared_image_port();
    let base = tempfile::tempdir().unwrap();
    let base = base.path().canonicalize().unwrap();
    let (root, outside) = (base.join("root"), base.join("outside"));
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    let padding = format!("#|{}|#\n", "x".repeat(8 << 20));
    std::fs::write(root.join("sub/race.lisp"), format!("{padding}(defun cl-user::load-race-inside () t)\n")).unwrap();
    std::fs::write(outside.join("sub/race.lisp"), format!("{padding}(defun cl-user::load-race-outside () t)\n"))
        .unwrap();
    let tb = toolbox(port, &root);
    let file = root.join("sub/race.lisp").display().to_string();
    let mut outcomes = Vec::new();
    for delay in (0..48).step_by(3) {
        restore(&root);
        let loading = {
            let (tb, file) = (tb.clone(), file.clone());
            tokio::spawn(async move { call(&tb, "load-file", json!({"file_path": file})).await })
        };
        tokio::time::sleep(Duration::from_millis(delay)).await;
        std::fs::rename(root.join("sub"), root.join("sub.inside")).unwrap();
        std::os::unix::fs::symlink(outside.join("sub"), root.join("sub")).unwrap();
        let output = loading.await.unwrap();
        assert_eq!(
            eval(&tb, "(fboundp 'cl-user::load-race-outside)").await,
            "=> NIL",
            "after a swap {delay} ms into the call, the image loaded the file outside the root: {}",
            output.text
        );
        // Loaded from inside, or refused by the server (the swap came first, or while it opened
        // the file).
        let outcome =
            ["Compiled and loaded sub/race.lisp", "is outside the allowed roots", "it was replaced while being opened"]
                .into_iter()
                .position(|said| output.text.contains(said));
        assert!(outcome.is_some(), "{delay} ms: {}", output.text);
        outcomes.push((delay, outcome));
    }
    restore(&root);
    eval(&tb, "(fmakunbound 'cl-user::load-race-inside)").await;
    eprintln!("(delay ms, outcome): {outcomes:?}");
}

/// Issue 49: an edit without load right after one with load, within the same second, leaves the
/// file with a date that differs from the one the image compiled, so find-definition says the file
/// changed since while the image runs the older code.
#[tokio::test]
async fn an_edit_without_load_in_the_second_of_a_load_is_seen_as_a_change() {
    let project = Project::loaded().await;
    let tb = &project.tb;
    let app_path = project.path.join("app.lisp").display().to_string();
    let edit = |greeting: &str, load: bool| {
        json!({"file_path": app_path, "form_type": "defun", "form_name": "greet", "operation": "replace",
               "content": format!("(defun greet (name)\n  (format nil \"{greeting}, ~A\" name))"), "load": load})
    };
    // Twice, in case the first pair straddles a second.
    for (loaded, written) in [("One", "Two"), ("Three", "Four")] {
        ok(tb, "edit-lisp-form", edit(loaded, true)).await;
        ok(tb, "edit-lisp-form", edit(written, false)).await;
        assert_eq!(eval(tb, "(loadtest-app::greet \"you\")").await, format!("=> \"{loaded}, you\""));
        let found = call(tb, "find-definition", json!({"symbol": "loadtest-app::greet"})).await;
        assert!(found.text.contains("the file changed since this was compiled"), "{}", found.text);
    }
}
