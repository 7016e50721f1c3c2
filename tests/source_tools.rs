//! The three source tools end to end, on files in temporary directories.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use swank_mcp::source::{prepare_edit, AllowedRoots, EditError, EditRequest, Operation};
use swank_mcp::tools::{edit_lisp_form, lisp_check_parens, lisp_outline, ToolOutput};

use common::run_source_tool as run;

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/source").join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// A temporary directory with `root/` as the only allowed root and `outside/` beside it.
struct Project {
    dir: tempfile::TempDir,
    roots: AllowedRoots,
}

/// An mtime in the past, so that any rewrite would show.
const OLD: Duration = Duration::from_secs(1_000_000_000);

impl Project {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir(dir.path().join("root")).expect("mkdir root");
        fs::create_dir(dir.path().join("outside")).expect("mkdir outside");
        let roots = AllowedRoots::new(vec![dir.path().join("root")]).expect("roots");
        Project { dir, roots }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join("root").join(name)
    }

    /// Writes `root/{name}` with an old mtime and returns its absolute path as a string.
    fn file(&self, name: &str, content: impl AsRef<[u8]>) -> String {
        let path = self.path(name);
        fs::write(&path, content).expect("write");
        set_mtime(&path, SystemTime::UNIX_EPOCH + OLD);
        path.display().to_string()
    }

    fn read(&self, name: &str) -> String {
        String::from_utf8(fs::read(self.path(name)).expect("read")).expect("utf-8")
    }

    fn mtime(&self, name: &str) -> SystemTime {
        fs::metadata(self.path(name)).and_then(|m| m.modified()).expect("mtime")
    }

    fn edit(&self, arguments: Value) -> ToolOutput {
        run(&edit_lisp_form::TOOL, arguments, &self.roots)
    }

    /// Runs an edit that must succeed and returns the tool's text.
    fn edit_ok(&self, file: &str, form_type: &str, form_name: &str, operation: &str, content: &str) -> String {
        let output = self.edit(json!({
            "file_path": file, "form_type": form_type, "form_name": form_name,
            "operation": operation, "content": content,
        }));
        assert!(!output.is_error, "edit failed: {}", output.text);
        output.text
    }

    /// Runs an edit that must fail, checks the file kept its bytes and mtime, and returns the
    /// error text.
    fn edit_err(&self, name: &str, arguments: Value) -> String {
        let before = fs::read(self.path(name)).expect("read");
        let mtime = self.mtime(name);
        let output = self.edit(arguments);
        assert!(output.is_error, "edit should fail: {}", output.text);
        assert_eq!(fs::read(self.path(name)).expect("read"), before, "bytes changed");
        assert_eq!(self.mtime(name), mtime, "mtime changed");
        output.text
    }
}

fn set_mtime(path: &Path, time: SystemTime) {
    fs::File::options().write(true).open(path).and_then(|f| f.set_modified(time)).expect("set mtime");
}

#[test]
fn replace_changes_exactly_the_form() {
    let project = Project::new();
    let original = fixture("shapes.lisp");
    let file = project.file("shapes.lisp", &original);
    let old_form = "(defun scale (shape factor)\n  \"Return a copy of SHAPE scaled by FACTOR.\"\n  (etypecase shape\n    (circle (make-instance 'circle :radius (* factor (radius shape))))\n    (rectangle (make-instance 'rectangle\n                              :width (* factor (width shape))\n                              :height (* factor (height shape))))))";
    assert!(original.contains(old_form));
    let new_form = "(defun scale (shape factor)\n  (declare (ignore factor))\n  shape)";
    let text = project.edit_ok(&file, "defun", "scale", "replace", new_form);
    assert_eq!(project.read("shapes.lisp"), original.replacen(old_form, new_form, 1));

    let first_line = text.lines().next().unwrap_or_default();
    assert_eq!(first_line, "Replaced `defun scale` (lines 59-65) in shapes.lisp with 1 form, now at lines 59-61.");
    assert!(text.contains("\n--- a/shapes.lisp\n+++ b/shapes.lisp\n@@ -57,12 +57,8 @@\n"), "{text}");
    assert!(text.contains("\n+  (declare (ignore factor))\n"), "{text}");
}

#[test]
fn replace_keeps_the_comment_block_above() {
    let project = Project::new();
    let original = fixture("shapes.lisp");
    let file = project.file("shapes.lisp", &original);
    project.edit_ok(&file, "defmethod", "area ((shape circle))", "replace", "(defmethod area ((shape circle))\n  0)");
    let expected = original.replacen(
        ";; The area uses PI.\n(defmethod area ((shape circle))\n  (* pi (expt (radius shape) 2)))",
        ";; The area uses PI.\n(defmethod area ((shape circle))\n  0)",
        1,
    );
    assert_eq!(project.read("shapes.lisp"), expected);
}

#[test]
fn insert_before_goes_above_the_attached_comments_and_insert_after_below() {
    let project = Project::new();
    let original = fixture("shapes.lisp");
    let file = project.file("shapes.lisp", &original);
    let text = project.edit_ok(&file, "defmethod", "area (circle)", "insert_before", "(defun helper () 1)");
    assert!(
        text.starts_with(
            "Inserted 1 form before `defmethod area (circle)` (lines 30-31) in shapes.lisp, now at line 28."
        ),
        "{text}"
    );
    let expected = original.replacen(";; Circles are round.", "(defun helper () 1)\n\n;; Circles are round.", 1);
    assert_eq!(project.read("shapes.lisp"), expected);

    project.edit_ok(&file, "defmacro", "with-shape", "insert_after", "(defun a () 1)\n(defun b () 2)");
    assert_eq!(project.read("shapes.lisp"), format!("{expected}\n(defun a () 1)\n(defun b () 2)\n"));

    project.edit_ok(&file, "defmethod", "draw (circle t)", "insert_after", "(defun c () 3)");
    let expected = project.read("shapes.lisp");
    assert!(expected
        .contains("(radius shape))) ; the #\\( in a string\n\n(defun c () 3)\n\n(defmethod draw ((shape rectangle)"));
}

#[test]
fn crlf_files_stay_crlf_and_the_bom_stays() {
    let project = Project::new();
    let original = format!("\u{feff}{}", fixture("shapes.lisp").replace('\n', "\r\n"));
    let file = project.file("crlf.lisp", &original);
    project.edit_ok(&file, "defvar", "*unit-circle*", "replace", "(defvar *unit-circle*\n  nil)");
    project.edit_ok(&file, "defvar", "*unit-circle*", "insert_before", "(defvar *zero*\n  0)\n");
    project.edit_ok(&file, "in-package", "#:shapes", "insert_before", "; first\n(defvar *first* 1)");
    let expected = original
        .replacen(
            "(defvar *unit-circle* (make-instance 'circle :radius 1))",
            "(defvar *zero*\r\n  0)\r\n\r\n(defvar *unit-circle*\r\n  nil)",
            1,
        )
        .replacen("(in-package #:shapes)", "; first\r\n(defvar *first* 1)\r\n\r\n(in-package #:shapes)", 1);
    let edited = project.read("crlf.lisp");
    assert_eq!(edited, expected);
    assert!(edited.starts_with('\u{feff}'));
    assert_eq!(edited.matches('\n').count(), edited.matches("\r\n").count(), "a bare LF slipped in");
}

#[test]
fn an_edit_that_changes_nothing_writes_nothing() {
    let project = Project::new();
    let file = project.file("a.lisp", "(defun f () 1)\n");
    let mtime = project.mtime("a.lisp");
    let text = project.edit_ok(&file, "defun", "f", "replace", "(defun f () 1)");
    assert_eq!(text, "Replaced `defun f` (line 1) in a.lisp with 1 form, now at line 1. The file already reads exactly so; nothing changed.");
    assert_eq!(project.mtime("a.lisp"), mtime);
}

#[test]
fn a_missing_final_newline_stays_missing() {
    let project = Project::new();
    let file = project.file("short.lisp", "(defun a () 1)\n\n(defun b () 2)");
    project.edit_ok(&file, "defun", "b", "insert_after", "(defun c () 3)\n");
    project.edit_ok(&file, "defun", "b", "replace", "(defun b () 22)");
    assert_eq!(project.read("short.lisp"), "(defun a () 1)\n\n(defun b () 22)\n\n(defun c () 3)");
}

#[test]
fn forms_behind_reader_conditionals_keep_their_conditional() {
    let project = Project::new();
    let original = fixture("shapes.lisp");
    let file = project.file("shapes.lisp", &original);
    let output = project.edit(json!({
        "file_path": file, "form_type": "defun", "form_name": "gc-shapes", "operation": "replace",
        "content": "(defun gc-shapes () (sb-ext:gc))", "index": 1,
    }));
    assert!(!output.is_error, "{}", output.text);
    assert!(output.text.starts_with("Replaced `#+sbcl defun gc-shapes` (lines 67-69)"), "{}", output.text);
    let expected = original.replacen(
        "#+sbcl\n(defun gc-shapes ()\n  (sb-ext:gc :full t))",
        "#+sbcl\n(defun gc-shapes () (sb-ext:gc))",
        1,
    );
    assert_eq!(project.read("shapes.lisp"), expected);

    let error = project.edit_err(
        "shapes.lisp",
        json!({"file_path": file, "form_type": "defun", "form_name": "gc-shapes", "operation": "replace",
               "content": "(defun gc-shapes ()) (defun more ())", "index": 2}),
    );
    assert!(error.contains("reader conditional `#-sbcl`, which applies to exactly one form"), "{error}");

    let reader = project.file("reader.lisp", fixture("reader.lisp"));
    let output = project.edit(json!({"file_path": reader, "form_type": "defun", "form_name": "platform",
                                     "operation": "replace", "content": "(defun platform () :x)", "index": 1}));
    let text = output.text;
    assert!(text.starts_with("Replaced `#+(and sbcl (not win32)) defun platform`"), "{text}");
    assert!(project.read("reader.lisp").contains(
        "#+(and sbcl (not win32))\n;; A comment between the conditional and its form.\n(defun platform () :x)\n"
    ));
}

#[test]
fn methods_are_found_by_specializers_qualifiers_eql_and_t() {
    let project = Project::new();
    let original = fixture("shapes.lisp");
    let file = project.file("shapes.lisp", &original);
    let cases = [
        ("area ((shape circle))", "defmethod area (circle)"),
        ("area (rectangle)", "defmethod area (rectangle)"),
        ("AREA ((x RECTANGLE))", "defmethod area (rectangle)"),
        ("area :around ((s shape))", "defmethod area :around (shape)"),
        ("draw (circle t)", "defmethod draw (circle t)"),
        ("draw (circle)", "defmethod draw (circle t)"),
        ("draw (rectangle t)", "defmethod draw (rectangle t)"),
        ("draw ((s rectangle) (stream t))", "defmethod draw (rectangle t)"),
        ("draw ((eql :origin) t)", "defmethod draw ((eql :origin) t)"),
        ("draw ((shape (eql :origin)) stream)", "defmethod draw ((eql :origin) t)"),
        ("print-object (circle t)", "defmethod print-object (circle t)"),
        ("(setf radius) :before (t circle)", "defmethod (setf radius) :before (t circle)"),
    ];
    for (form_name, described) in cases {
        let output = project.edit(json!({
            "file_path": file, "form_type": "defmethod", "form_name": form_name,
            "operation": "replace", "content": "(defmethod x ())", "dry_run": true,
        }));
        assert!(!output.is_error, "{form_name}: {}", output.text);
        assert!(output.text.contains(&format!("would replace `{described}`")), "{form_name}: {}", output.text);
    }
    assert_eq!(project.read("shapes.lisp"), original);
}

#[test]
fn names_in_every_spelling() {
    let project = Project::new();
    let shapes = project.file("shapes.lisp", fixture("shapes.lisp"));
    let package = project.file("package.lisp", fixture("package.lisp"));
    let system = project.file("shapes.asd", fixture("shapes.asd"));
    let cases = [
        (&shapes, "defun", "(setf shape-label)", "defun (setf shape-label)"),
        (&shapes, "defstruct", "point", "defstruct point"),
        (&shapes, "defstruct", "(point (:conc-name pt-))", "defstruct point"),
        (&shapes, "cl:defclass", "CIRCLE", "defclass circle"),
        (&package, "defpackage", "shapes", "defpackage #:shapes"),
        (&package, "defpackage", "#:shapes-test", "defpackage :shapes-test"),
        (&package, "defpackage", ":shapes-user", "defpackage \"SHAPES-USER\""),
        (&package, "define-condition", "shape-error", "define-condition shape-error"),
        (&system, "defsystem", "shapes", "asdf:defsystem \"shapes\""),
        (&system, "asdf:defsystem", "\"shapes/test\"", "defsystem #:shapes/test"),
    ];
    for (file, form_type, form_name, described) in cases {
        let output = project.edit(json!({
            "file_path": file, "form_type": form_type, "form_name": form_name,
            "operation": "replace", "content": "(x)", "dry_run": true,
        }));
        assert!(!output.is_error, "{form_type} {form_name}: {}", output.text);
        assert!(output.text.contains(&format!("would replace `{described}`")), "{form_name}: {}", output.text);
    }
}

#[test]
fn ambiguous_matches_are_listed_and_index_picks_one() {
    let project = Project::new();
    let original = fixture("shapes.lisp");
    let file = project.file("shapes.lisp", &original);
    let request = json!({"file_path": file, "form_type": "defmethod", "form_name": "draw",
                         "operation": "replace", "content": "(defmethod draw ((shape circle) s) s)"});
    let error = project.edit_err("shapes.lisp", request.clone());
    assert!(error.contains("`defmethod draw` matches 3 forms. Pass `index`"), "{error}");
    assert!(error.contains("\n  1. lines 40-41: defmethod draw (circle t)\n  2. lines 43-44: defmethod draw (rectangle t)\n  3. lines 46-47: defmethod draw ((eql :origin) t)"), "{error}");

    let mut with_index = request.clone();
    with_index["index"] = json!(4);
    let error = project.edit_err("shapes.lisp", with_index);
    assert!(error.contains("`index` 4 is out of range"), "{error}");

    let mut with_index = request;
    with_index["index"] = json!(1);
    let output = project.edit(with_index);
    assert!(!output.is_error, "{}", output.text);
    assert!(project.read("shapes.lisp").contains(
        "(defmethod draw ((shape circle) s) s) ; the #\\( in a string\n\n(defmethod draw ((shape rectangle)"
    ));
}

#[test]
fn misses_come_with_hints() {
    let project = Project::new();
    let file = project.file("shapes.lisp", fixture("shapes.lisp"));
    let attempt = |form_type: &str, form_name: &str| {
        project.edit_err(
            "shapes.lisp",
            json!({"file_path": file, "form_type": form_type, "form_name": form_name,
                   "operation": "replace", "content": "(x)"}),
        )
    };
    let error = attempt("defun", "scael");
    assert!(error.starts_with("No `defun scael` in this file."), "{error}");
    assert!(error.contains("Similar names:\n  lines 59-65: defun scale\n"), "{error}");

    let error = attempt("defun", "area");
    assert!(
        error.contains(
            "Same name, other operator:\n  lines 23-24: defgeneric area\n  lines 30-31: defmethod area (circle)\n"
        ),
        "{error}"
    );

    let error = attempt("defmethod", "area (square)");
    assert!(error.contains("These methods have that name"), "{error}");
    assert!(error.contains("lines 36-38: defmethod area :around (shape)"), "{error}");
    assert!(error.ends_with("The file was not touched."), "{error}");

    let error = attempt("defmethod", "print-objec (circle t)");
    assert!(error.contains("Similar names:\n  lines 49-51: defmethod print-object (circle t)\n"), "{error}");
}

#[test]
fn bad_content_leaves_the_file_alone() {
    let project = Project::new();
    let file = project.file("shapes.lisp", fixture("shapes.lisp"));
    let attempt = |content: &str| {
        project.edit_err(
            "shapes.lisp",
            json!({"file_path": file, "form_type": "defun", "form_name": "scale", "operation": "replace", "content": content}),
        )
    };
    let error = attempt("(defun scale (x)\n  (* x 2)))");
    assert!(error.starts_with("`content` is not valid Lisp (lines and columns count within `content`): unmatched close parenthesis at line 2, column 11"), "{error}");
    assert!(error.contains("The file was not touched."), "{error}");
    let error = attempt("(defun scale (x)\n  \"doc)");
    assert!(error.contains("end of file inside a string"), "{error}");
    assert!(error.contains("opened at line 2, column 3"), "{error}");
    let error = attempt("(defun scale (x)\n  (* x 2)");
    assert!(
        error.contains("missing `)` at line 2, column 10; it was opened at line 1, column 1: `(defun scale (x)`"),
        "{error}"
    );
    let error = attempt("  ; only a comment\n");
    assert!(error.contains("holds no form"), "{error}");
}

#[test]
fn content_that_would_run_into_its_neighbours_is_refused() {
    let project = Project::new();
    let file = project.file("line.lisp", "(defun f () 1) (defun g () 2)\n");
    let error = project.edit_err(
        "line.lisp",
        json!({"file_path": file, "form_type": "defun", "form_name": "f", "operation": "replace",
               "content": "(defun f () 1) ; the comment would swallow g"}),
    );
    assert!(
        error.starts_with("The edit would not read back as the intended forms (1 top-level forms instead of 2)"),
        "{error}"
    );
}

#[test]
fn a_file_that_does_not_read_is_not_edited() {
    let project = Project::new();
    let file = project.file("broken.lisp", "(defun a ()\n  (b)\n\n(defun c () 1)\n");
    let error = project.edit_err(
        "broken.lisp",
        json!({"file_path": file, "form_type": "defun", "form_name": "c", "operation": "replace", "content": "(x)"}),
    );
    assert!(error.starts_with("`broken.lisp` does not read as Lisp"), "{error}");
    assert!(error.contains("before line 4"), "{error}");
}

#[test]
fn dry_run_returns_the_diff_and_writes_nothing() {
    let project = Project::new();
    let original = fixture("shapes.lisp");
    let file = project.file("shapes.lisp", &original);
    let mtime = project.mtime("shapes.lisp");
    let output = project.edit(json!({
        "file_path": file, "form_type": "defvar", "form_name": "*unit-circle*", "operation": "replace",
        "content": "(defvar *unit-circle* nil)", "dry_run": true,
    }));
    assert!(!output.is_error, "{}", output.text);
    assert_eq!(
        output.text,
        "Dry run, nothing written: would replace `defvar *unit-circle*` (line 75) in shapes.lisp with 1 form, at line 75.\n\n\
--- a/shapes.lisp\n+++ b/shapes.lisp\n@@ -72,7 +72,7 @@\n (defun gc-shapes ()\n   nil)\n \n\
-(defvar *unit-circle* (make-instance 'circle :radius 1))\n+(defvar *unit-circle* nil)\n \n (defparameter *table* #(1 2 3))\n \n"
    );
    let structured = output.structured_value().expect("structured");
    assert_eq!(structured["written"], json!(false));
    assert_eq!(structured["new_lines"], json!([75, 75]));
    assert_eq!(project.read("shapes.lisp"), original);
    assert_eq!(project.mtime("shapes.lisp"), mtime);
}

#[cfg(unix)]
#[test]
fn permissions_are_kept_and_no_temporary_file_is_left() {
    use std::os::unix::fs::PermissionsExt;
    let project = Project::new();
    let file = project.file("shapes.lisp", fixture("shapes.lisp"));
    fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).expect("chmod");
    project.edit_ok(&file, "defvar", "*unit-circle*", "replace", "(defvar *unit-circle* nil)");
    let mode = fs::metadata(&file).expect("metadata").permissions().mode();
    assert_eq!(mode & 0o7777, 0o640);
    let entries: Vec<_> = fs::read_dir(project.path("")).expect("ls").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(entries, ["shapes.lisp"]);
}

#[test]
fn files_outside_the_roots_are_refused() {
    let project = Project::new();
    let outside = project.dir.path().join("outside/secret.lisp");
    fs::write(&outside, "(defun secret () 1)\n").expect("write");
    let request = |path: &Path| json!({"file_path": path, "form_type": "defun", "form_name": "secret", "operation": "replace", "content": "(x)"});
    for path in [outside.clone(), project.path("../outside/secret.lisp")] {
        let output = project.edit(request(&path));
        assert!(output.is_error);
        assert!(output.text.contains("is outside the allowed roots"), "{}", output.text);
        assert!(output.text.contains("--root"), "{}", output.text);
    }
    let output = run(&lisp_outline::TOOL, json!({"file_path": outside}), &project.roots);
    assert!(output.is_error && output.text.contains("outside the allowed roots"), "{}", output.text);
    let output = run(&lisp_check_parens::TOOL, json!({"file_path": outside}), &project.roots);
    assert!(output.is_error && output.text.contains("outside the allowed roots"), "{}", output.text);
    assert_eq!(fs::read_to_string(&outside).expect("read"), "(defun secret () 1)\n");
}

#[cfg(unix)]
#[test]
fn symlinks_are_resolved_before_the_check() {
    let project = Project::new();
    let outside = project.dir.path().join("outside/secret.lisp");
    fs::write(&outside, "(defun secret () 1)\n").expect("write");
    std::os::unix::fs::symlink(&outside, project.path("escape.lisp")).expect("symlink");
    let output = project.edit(json!({"file_path": "escape.lisp", "form_type": "defun", "form_name": "secret",
                                     "operation": "replace", "content": "(x)"}));
    assert!(output.is_error);
    assert!(output.text.contains("it resolves to"), "{}", output.text);
    assert_eq!(fs::read_to_string(&outside).expect("read"), "(defun secret () 1)\n");

    // A link that stays inside the roots edits its target and stays a link.
    project.file("real.lisp", "(defun f () 1)\n");
    std::os::unix::fs::symlink(project.path("real.lisp"), project.path("link.lisp")).expect("symlink");
    project.edit_ok("link.lisp", "defun", "f", "replace", "(defun f () 2)");
    assert_eq!(project.read("real.lisp"), "(defun f () 2)\n");
    assert!(fs::symlink_metadata(project.path("link.lisp")).expect("lstat").file_type().is_symlink());
}

#[test]
fn relative_paths_are_taken_from_the_first_root() {
    let project = Project::new();
    fs::create_dir(project.path("src")).expect("mkdir");
    project.file("src/a.lisp", "(defun f () 1)\n");
    let text = project.edit_ok("src/a.lisp", "defun", "f", "replace", "(defun f () 2)");
    assert!(text.contains("--- a/src/a.lisp\n+++ b/src/a.lisp\n"), "{text}");
    assert_eq!(project.read("src/a.lisp"), "(defun f () 2)\n");
}

#[test]
fn a_file_changed_between_read_and_write_is_not_overwritten() {
    let project = Project::new();
    let file = project.file("shapes.lisp", fixture("shapes.lisp"));
    let request = EditRequest {
        form_type: "defun",
        form_name: "scale",
        operation: Operation::Replace,
        content: "(defun scale (s f) s)",
        old_text: "",
        index: None,
    };
    let prepared = prepare_edit(&project.roots, Path::new(&file), None, &request).expect("prepared");
    // Same length and the same mtime: only the content comparison can notice.
    let meanwhile = fixture("shapes.lisp").replacen("circle", "CIRCLE", 1);
    fs::write(&file, &meanwhile).expect("write");
    set_mtime(Path::new(&file), SystemTime::UNIX_EPOCH + OLD);
    let error = prepared.commit().expect_err("must refuse");
    assert!(matches!(error, EditError::Changed));
    assert!(error.to_string().starts_with("file changed while editing; nothing written"));
    assert_eq!(project.read("shapes.lisp"), meanwhile);
    let entries = fs::read_dir(project.path("")).expect("ls").count();
    assert_eq!(entries, 1, "temporary file left behind");
}

#[test]
fn bad_arguments_are_explained() {
    let project = Project::new();
    let file = project.file("a.lisp", "(defun f () 1)\n");
    let base =
        json!({"file_path": file, "form_type": "defun", "form_name": "f", "operation": "replace", "content": "(x)"});
    let with = |key: &str, value: Value| {
        let mut request = base.clone();
        request[key] = value;
        project.edit(request)
    };
    let check = |output: ToolOutput, expected: &str| {
        assert!(output.is_error, "{}", output.text);
        assert!(output.text.contains(expected), "{}", output.text);
    };
    check(
        with("operation", json!("remove")),
        "must be one of \"replace\", \"insert_before\", \"insert_after\", \"delete\"",
    );
    check(with("operation", json!("delete")), "`delete` removes the form and takes no `content`");
    check(with("index", json!(0)), "`index` is 1-based");
    check(with("index", json!("2")), "Argument `index` must be an integer");
    check(with("dry_run", json!("yes")), "Argument `dry_run` must be true or false");
    check(with("form_type", json!("")), "`form_type` must be the operator symbol");
    check(with("form_name", json!("f (x)")), "only apply to `defmethod`");
    check(with("file_path", json!("")), "The file path is empty.");
    check(with("file_path", json!("missing.lisp")), "Cannot read `missing.lisp`");
    check(with("content", Value::Null), "Missing required argument `content`");
    assert_eq!(project.read("a.lisp"), "(defun f () 1)\n");
}

#[test]
fn check_parens_reports_the_problem_and_its_opener() {
    let project = Project::new();
    let check = |arguments: Value| run(&lisp_check_parens::TOOL, arguments, &project.roots);

    let output = check(json!({"code": "(defun f (x)\n  (g x))\n(f 1)"}));
    assert!(!output.is_error);
    assert_eq!(output.text, "Balanced: The code reads as 2 complete top-level forms (3 lines).");

    let output = check(json!({"code": "(defun f (x)\n  (g x)\n\n(defun h ()\n  1)\n"}));
    assert!(!output.is_error, "an unbalanced text is a finding, not a failure");
    assert!(output.text.starts_with("Not balanced: The code: end of file: missing `)` at line 6, column 1; it was opened at line 1, column 1: `(defun f (x)`."), "{}", output.text);
    assert!(output.text.contains("the missing `)` probably belongs before line 4"), "{}", output.text);
    let structured = output.structured_value().expect("structured");
    assert_eq!(structured["balanced"], json!(false));
    assert_eq!(structured["problem"]["line"], json!(6));
    assert_eq!(structured["problem"]["opener"], json!({"line": 1, "column": 1, "text": "(defun f (x)"}));

    let output = check(json!({"code": "(a))"}));
    assert!(
        output.text.starts_with("Not balanced: The code: unmatched close parenthesis at line 1, column 4."),
        "{}",
        output.text
    );

    let file = project.file("reader.lisp", fixture("reader.lisp"));
    let output = check(json!({"file_path": file}));
    assert_eq!(output.text, "Balanced: `reader.lisp` reads as 9 complete top-level forms (30 lines).");

    assert!(check(json!({})).text.contains("Pass `file_path`"));
    assert!(check(json!({"code": "()", "file_path": "x"})).text.contains("not both"));
    assert!(check(json!({"file_path": "nope.lisp"})).is_error);
}

#[test]
fn outline_lists_the_forms() {
    let project = Project::new();
    project.file("shapes.asd", fixture("shapes.asd"));
    let output = run(&lisp_outline::TOOL, json!({"file_path": "shapes.asd"}), &project.roots);
    assert!(!output.is_error, "{}", output.text);
    assert_eq!(
        output.text,
        "shapes.asd: 2 top-level forms, 10 lines\n3-6   asdf:defsystem \"shapes\"\n8-10  defsystem #:shapes/test"
    );

    project.file("shapes.lisp", fixture("shapes.lisp"));
    let output = run(&lisp_outline::TOOL, json!({"file_path": "shapes.lisp"}), &project.roots);
    let lines: Vec<&str> = output.text.lines().collect();
    assert_eq!(lines[0], "shapes.lisp: 22 top-level forms, 81 lines");
    assert!(lines.contains(&"30-31  defmethod area (circle)"), "{}", output.text);
    assert!(lines.contains(&"53-54  defmethod (setf radius) :before (t circle)"), "{}", output.text);
    assert!(lines.contains(&"67-69  #+sbcl defun gc-shapes"), "{}", output.text);
    let structured = output.structured_value().expect("structured");
    assert_eq!(
        structured["forms"][10],
        json!({"first_line": 40, "last_line": 41, "depth": 0, "conditions": "", "operator": "defmethod", "name": "draw (circle t)"})
    );

    project.file("broken.lisp", "(a \"b)");
    let output = run(&lisp_outline::TOOL, json!({"file_path": "broken.lisp"}), &project.roots);
    assert!(output.is_error);
    assert!(output.text.contains("end of file inside a string"), "{}", output.text);
}

#[test]
fn definitions_describe_the_tools_honestly() {
    let edit = &edit_lisp_form::TOOL.definition;
    assert_eq!(edit.name, "edit-lisp-form");
    // As the contract asks: the model is told to prefer it to rewriting whole files.
    assert!(edit.description.contains("Use it rather than rewriting files"));
    // With `load`, it changes the image too.
    assert!(!edit.read_only);
    // One edit's fields, or `edits`: which are required depends on which the call gives.
    assert_eq!(edit.input_schema().get("required"), None);
    assert_eq!(edit.input_schema()["properties"]["edits"]["type"], json!("array"));
    assert!(edit.input_schema()["properties"]["operation"]["enum"].as_array().unwrap().contains(&json!("patch")));
    assert!(edit.description.contains("load: true compiles the change into the image"));
    assert_eq!(edit.input_schema()["properties"]["dry_run"]["type"], json!("boolean"));
    // Counted from 1, which the check enforces and the instructions say, not the schema.
    assert_eq!(edit.input_schema()["properties"]["index"], json!({"type": "integer"}));

    for definition in [&lisp_check_parens::TOOL.definition, &lisp_outline::TOOL.definition] {
        assert!(definition.read_only);
        let entry = swank_mcp::mcp::tool_list::entry(definition, definition.input_schema());
        assert_eq!(entry["annotations"]["readOnlyHint"], json!(true));
    }
}

#[test]
fn a_patch_replaces_the_one_occurrence_inside_the_form() {
    let project = Project::new();
    let original = fixture("shapes.lisp");
    let file = project.file("shapes.lisp", &original);
    let output = project.edit(json!({
        "file_path": file, "form_type": "defmethod", "form_name": "area ((r rectangle))",
        "operation": "patch", "old_text": "(height r)", "new_text": "(height r) 2",
    }));
    assert!(!output.is_error, "{}", output.text);
    assert_eq!(
        project.read("shapes.lisp"),
        original.replacen("(* (width r) (height r))", "(* (width r) (height r) 2)", 1)
    );
    // The line as it now reads, unindented: not the one replaced, which the call quoted.
    assert_eq!(
        output.text,
        "Patched `defmethod area (rectangle)` in shapes.lisp, line 34 now:\n(* (width r) (height r) 2))"
    );
    // A dry run shows the diff, the line replaced too.
    let dry = project.edit(json!({
        "file_path": file, "form_type": "defmethod", "form_name": "area ((r rectangle))",
        "operation": "patch", "old_text": "(height r) 2", "new_text": "(height r) 3", "dry_run": true,
    }));
    assert_eq!(
        dry.text,
        "Dry run, nothing written: would patch `defmethod area (rectangle)` (lines 33-34) in shapes.lisp:\n@@ -34 +34 @@\n-  \
         (* (width r) (height r) 2))\n+  (* (width r) (height r) 3))"
    );
    // A patch that takes lines out says which.
    let output = project.edit(json!({
        "file_path": file, "form_type": "defmethod", "form_name": "area ((r rectangle))",
        "operation": "patch", "old_text": "\n  (* (width r) (height r) 2)", "new_text": " (* (width r) (height r) 2)",
    }));
    assert_eq!(output.text, "Patched `defmethod area (rectangle)` in shapes.lisp, line 33 now:\n(defmethod area ((r rectangle)) (* (width r) (height r) 2))");
    // The same text elsewhere in the file does not count: only the named form is searched.
    assert!(original.matches("(radius shape)").count() > 1);
    let output = project.edit(json!({
        "file_path": file, "form_type": "defmethod", "form_name": "area ((shape circle))",
        "operation": "patch", "old_text": "(radius shape)", "new_text": "(radius shape)", "dry_run": true,
    }));
    assert!(!output.is_error && output.text.contains("nothing changed"), "{}", output.text);
}

#[test]
fn a_patch_whose_old_text_occurs_twice_or_never_is_refused_where_it_says() {
    let project = Project::new();
    let file = project.file("shapes.lisp", fixture("shapes.lisp"));
    let twice = project.edit_err(
        "shapes.lisp",
        json!({"file_path": file, "form_type": "defun", "form_name": "scale", "operation": "patch",
               "old_text": "(* factor", "new_text": "(/ factor"}),
    );
    assert_eq!(
        twice,
        "`old_text` occurs 3 times in `defun scale` (lines 59-65): at lines and columns 62:44, 64:38, 65:39. Give more \
         of the text around the one to change, so that it occurs once.\nThe file was not touched."
    );
    let spaced = project.edit_err(
        "shapes.lisp",
        json!({"file_path": file, "form_type": "defun", "form_name": "scale", "operation": "patch",
               "old_text": "(etypecase shape (circle", "new_text": "(typecase shape (circle"}),
    );
    assert!(
        spaced.starts_with("`old_text` does not occur in `defun scale` (lines 59-65). It does with other blank space"),
        "{spaced}"
    );
    assert!(spaced.contains("at line 61"), "{spaced}");
    let elsewhere = project.edit_err(
        "shapes.lisp",
        json!({"file_path": file, "form_type": "defun", "form_name": "scale", "operation": "patch",
               "old_text": "(sb-ext:gc :full t)", "new_text": "(sb-ext:gc)"}),
    );
    assert!(elsewhere.contains("It does at line 69, outside this form"), "{elsewhere}");
    // The result must still read as the one form.
    let unbalanced = project.edit_err(
        "shapes.lisp",
        json!({"file_path": file, "form_type": "defun", "form_name": "scale", "operation": "patch",
               "old_text": "(etypecase shape", "new_text": "(etypecase (shape"}),
    );
    assert!(unbalanced.contains("`defun scale` would not read"), "{unbalanced}");
    let content = project.edit_err(
        "shapes.lisp",
        json!({"file_path": file, "form_type": "defun", "form_name": "scale", "operation": "patch",
               "old_text": "shape", "new_text": "s", "content": "(defun scale ())"}),
    );
    assert!(content.contains("`patch` takes `old_text` and `new_text`, not `content`"), "{content}");
}

#[test]
fn a_patch_in_a_crlf_file_keeps_its_line_endings() {
    let project = Project::new();
    let file = project.file("crlf.lisp", "(defun f (x)\r\n  (+ x\r\n     1))\r\n");
    let output = project.edit(json!({
        "file_path": file, "form_type": "defun", "form_name": "f", "operation": "patch",
        "old_text": "(+ x\n     1)", "new_text": "(+ x\n     2)",
    }));
    assert!(!output.is_error, "{}", output.text);
    assert_eq!(project.read("crlf.lisp"), "(defun f (x)\r\n  (+ x\r\n     2))\r\n");
}

#[test]
fn a_batch_is_applied_all_or_none() {
    let project = Project::new();
    let shapes = project.file("shapes.lisp", fixture("shapes.lisp"));
    let other = project.file("other.lisp", "(defun one () 1)\n\n(defun two () 2)\n");
    let patch = |file: &str, name: &str, old: &str, new: &str| json!({"file_path": file, "form_type": "defun", "form_name": name, "operation": "patch", "old_text": old, "new_text": new});
    // The second edit fails: neither file is written.
    let before = (project.read("shapes.lisp"), project.read("other.lisp"));
    let refused = project.edit_err(
        "other.lisp",
        json!({"edits": [patch(&other, "one", "1", "10"), patch(&shapes, "scale", "(* factor", "(/ factor"),
                         patch(&other, "two", "2", "20")]}),
    );
    assert!(
        refused.starts_with(&format!("Edit 2 of 3 (`defun scale` in {shapes}) was refused: `old_text` occurs 3 times")),
        "{refused}"
    );
    assert!(refused.ends_with("No file was written: the edits are applied all or none."), "{refused}");
    assert_eq!((project.read("shapes.lisp"), project.read("other.lisp")), before);
    // Each edit's fields are checked as a call's are, unknown ones refused.
    let unknown = project.edit_err(
        "other.lisp",
        json!({"edits": [patch(&other, "one", "1", "10"), {"file_path": other, "form_type": "defun", "form_name": "two",
                         "operation": "patch", "old": "2", "new_text": "20"}]}),
    );
    assert!(
        unknown.starts_with(
            "In element 2 of `edits`: Unknown argument `old`: did you mean `old_text`? each element of `edits` takes \
             `file_path`, `form_type`"
        ),
        "{unknown}"
    );
    let mixed = project.edit_err("other.lisp", json!({"edits": [patch(&other, "one", "1", "10")], "form_name": "two"}));
    assert!(mixed.contains("Give one edit's fields or `edits`, not both: `form_name`"), "{mixed}");
    let mixed = project.edit_err("other.lisp", json!({"edits": [patch(&other, "one", "1", "10")], "index": 1}));
    assert!(mixed.contains("`index` belongs in an element of `edits`"), "{mixed}");

    // Two edits of one file and one of another: all written, each edit on what the one before left.
    let output = project.edit(json!({"edits": [
        patch(&other, "one", "1", "10"),
        patch(&shapes, "scale", "\"Return a copy", "\"Return a new copy"),
        {"file_path": other, "form_type": "defun", "form_name": "two", "operation": "insert_after", "content": "(defun three () 3)"},
        patch(&other, "one", "10", "11"),
    ]}));
    assert!(!output.is_error, "{}", output.text);
    assert_eq!(project.read("other.lisp"), "(defun one () 11)\n\n(defun two () 2)\n\n(defun three () 3)\n");
    assert!(project.read("shapes.lisp").contains("\"Return a new copy of SHAPE"));
    assert!(
        output.text.starts_with(
            "Patched `defun one` in other.lisp (a later edit of this batch changed it again), line 1 now:\n\
             (defun one () 10)\n"
        ),
        "{}",
        output.text
    );
    assert_eq!(output.structured_value().unwrap()["edits"].as_array().map(Vec::len), Some(4));
}

/// A batch reports where each edit's lines are once all its edits are made (issue 49.2: an edit
/// said "line 102 now" where a later edit of the same batch had moved it to 100), and says when a
/// later edit changed a form again, whose text as the earlier edit left it is then not the file's.
#[test]
fn a_batch_reports_the_lines_its_edits_leave_in_the_end() {
    let project = Project::new();
    let file = project.file(
        "moved.lisp",
        "(defun gone ()
  0)

(defun kept (x)
  (+ x 1))

(defun last-one () 3)
",
    );
    let output = project.edit(json!({"file_path": file, "form_type": "defun", "edits": [
        {"form_name": "kept", "operation": "patch", "old_text": "(+ x 1)", "new_text": "(+ x 2)"},
        {"form_name": "last-one", "operation": "replace", "content": "(defun last-one ()\n  4)"},
        {"form_name": "gone", "operation": "delete"},
        {"form_name": "last-one", "operation": "insert_before", "content": "(defun before-last ()\n  ;; five\n  5)"},
        {"form_name": "last-one", "operation": "patch", "old_text": "4", "new_text": "6"},
    ]}));
    assert!(!output.is_error, "{}", output.text);
    let text = project.read("moved.lisp");
    assert_eq!(
        text,
        "(defun kept (x)\n  (+ x 2))\n\n(defun before-last ()\n  ;; five\n  5)\n\n(defun last-one ()\n  6)\n"
    );
    assert!(output.text.starts_with("Patched `defun kept` in moved.lisp, line 2 now:\n(+ x 2))\n"), "{}", output.text);
    assert!(
        output.text.contains(
            "Replaced `defun last-one` (line 7) in moved.lisp with 1 form, now at lines 8-9; a later edit of \
             this batch changed it again."
        ),
        "{}",
        output.text
    );
    assert!(
        output.text.contains("Inserted 1 form before `defun last-one` (lines 4-5) in moved.lisp, now at lines 4-6."),
        "{}",
        output.text
    );
    assert!(output.text.contains("Patched `defun last-one` in moved.lisp, line 9 now:\n6)"), "{}", output.text);
    let edits = output.structured_value().unwrap()["edits"].clone();
    assert_eq!(edits[0]["new_lines"], json!([1, 2]), "{edits}");
    assert_eq!(edits[1]["new_lines"], json!([8, 9]), "{edits}");
}

/// An agent's first batch names the file and the form type once, in the call, and each edit only
/// what differs: the call's `file_path`, `form_type` and `load` are each edit's unless it gives its
/// own.
#[test]
fn a_batch_takes_the_calls_file_form_type_and_load_as_each_edits() {
    let project = Project::new();
    let other = project.file("other.lisp", "(defun one () 1)\n\n(defun two () 2)\n\n(defvar *three* 3)\n");
    let shapes = project.file("shapes.lisp", fixture("shapes.lisp"));
    let output = project.edit(json!({"file_path": other, "form_type": "defun", "edits": [
        {"form_name": "one", "operation": "patch", "old_text": "1", "new_text": "10"},
        {"form_name": "two", "operation": "patch", "old_text": "2", "new_text": "20"},
        {"form_type": "defvar", "form_name": "*three*", "operation": "patch", "old_text": "3", "new_text": "30"},
        {"file_path": shapes, "form_name": "scale", "operation": "patch",
         "old_text": "\"Return a copy", "new_text": "\"Return a new copy"},
    ]}));
    assert!(!output.is_error, "{}", output.text);
    assert_eq!(project.read("other.lisp"), "(defun one () 10)\n\n(defun two () 20)\n\n(defvar *three* 30)\n");
    assert!(project.read("shapes.lisp").contains("\"Return a new copy of SHAPE"));

    // Neither the edit nor the call names the file: the refusal says which edit lacks what.
    let missing = project
        .edit_err("other.lisp", json!({"form_type": "defun", "edits": [{"form_name": "one", "operation": "delete"}]}));
    assert_eq!(missing, "Edit 1 of 1: Missing required argument `file_path` (a string).");

    // `load` too: an edit's own says whether it needs the image, which a run on files alone lacks.
    let patch = json!({"form_name": "one", "operation": "patch", "old_text": "10", "new_text": "11"});
    let mut loading = patch.clone();
    loading["load"] = json!(true);
    for arguments in [
        json!({"file_path": other, "form_type": "defun", "load": true, "edits": [patch.clone()]}),
        json!({"file_path": other, "form_type": "defun", "edits": [loading]}),
    ] {
        let refused = project.edit_err("other.lisp", arguments);
        assert!(refused.contains("`load: true` needs the image"), "{refused}");
    }
    let mut not_loading = patch;
    not_loading["load"] = json!(false);
    let output = project.edit(json!({"file_path": other, "form_type": "defun", "load": true, "edits": [not_loading]}));
    assert!(!output.is_error, "{}", output.text);
    assert!(project.read("other.lisp").starts_with("(defun one () 11)\n"));

    // The schema says what an edit must give itself.
    let schema = edit_lisp_form::TOOL.definition.input_schema();
    assert_eq!(schema["properties"]["edits"]["items"]["required"], json!(["form_name", "operation"]));
    assert!(edit_lisp_form::TOOL.definition.description.contains("edits: several, all or none"));
}

#[test]
fn the_outline_gives_each_forms_text_with_source() {
    let project = Project::new();
    let file = project.file("shapes.lisp", fixture("shapes.lisp"));
    let output =
        run(&lisp_outline::TOOL, json!({"file_path": file, "source": true, "offset": 17, "limit": 2}), &project.roots);
    assert!(!output.is_error, "{}", output.text);
    assert_eq!(
        output.text,
        "shapes.lisp: 22 top-level forms, 81 lines\nforms 18 to 19:\n67-69  #+sbcl defun gc-shapes\n#+sbcl\n(defun gc-shapes ()\n  \
         (sb-ext:gc :full t))\n71-73  #-sbcl defun gc-shapes\n#-sbcl\n(defun gc-shapes ()\n  nil)\n... 3 more; use `offset: 19` for \
         the next page."
    );
    // A wrapper's text holds its nested forms, which are not repeated; the next offset counts
    // top-level forms.
    let wrapped = project.file("wrapped.lisp", "(progn\n  (defun a () 1)\n  (defun b () 2))\n\n(defun c () 3)\n");
    let output = run(&lisp_outline::TOOL, json!({"file_path": wrapped, "limit": 1}), &project.roots);
    assert!(output.text.ends_with("... 1 more; use `offset: 1` for the next page."), "{}", output.text);
    let output = run(&lisp_outline::TOOL, json!({"file_path": wrapped, "source": true, "limit": 1}), &project.roots);
    assert_eq!(
        output.text,
        "wrapped.lisp: 2 top-level forms, 5 lines\nforms 1 to 1:\n1-3  progn\n(progn\n  (defun a () 1)\n  (defun b () 2))\n... 1 \
         more; use `offset: 1` for the next page."
    );
}

#[test]
fn the_outline_gives_the_whole_form_holding_a_line() {
    let project = Project::new();
    let file = project.file("shapes.lisp", fixture("shapes.lisp"));
    let at = |line: u64| run(&lisp_outline::TOOL, json!({"file_path": file, "line": line}), &project.roots);
    // Any line of a form gives all of it, its reader conditional too, and nothing more.
    for line in [67, 68, 69] {
        let output = at(line);
        assert!(!output.is_error, "{}", output.text);
        assert_eq!(
            output.text,
            format!(
                "shapes.lisp: 22 top-level forms, 81 lines\nform 18, holding line {line}:\n67-69  #+sbcl defun gc-shapes\n\
                 #+sbcl\n(defun gc-shapes ()\n  (sb-ext:gc :full t))"
            )
        );
    }
    let structured = at(68).structured_value().unwrap();
    assert_eq!((structured["offset"].clone(), structured["next_offset"].clone()), (json!(17), Value::Null));
    // A line between forms, or past the end, is refused naming where the forms are.
    let between = at(70);
    assert!(between.is_error, "{}", between.text);
    assert_eq!(
        between.text,
        "Line 70 of `shapes.lisp` is in no top-level form (a comment or blank line); the nearest are at lines 67-69 and \
         lines 71-73."
    );
    let past = at(500);
    assert_eq!((past.is_error, past.text.as_str()), (true, "`shapes.lisp` has 81 lines; line 500 is past its end."));
    let both = run(&lisp_outline::TOOL, json!({"file_path": file, "line": 3, "offset": 1}), &project.roots);
    assert!(both.is_error && both.text.contains("not both"), "{}", both.text);
}

#[test]
fn an_outline_page_ends_after_the_form_that_passes_its_character_budget() {
    let project = Project::new();
    // Ten forms of 5,000 characters: a page holds four (the fourth passes 16,000), whatever `limit`.
    let body = "x".repeat(5_000);
    let code: String = (0..10).map(|i| format!("(defun big-{i} ()\n  \"{body}\")\n\n")).collect();
    let file = project.file("big.lisp", &code);
    let page = |arguments: Value| {
        let output = run(&lisp_outline::TOOL, arguments, &project.roots);
        assert!(!output.is_error, "{}", output.text);
        output.structured_value().unwrap()["next_offset"].clone()
    };
    assert_eq!(page(json!({"file_path": file, "source": true})), json!(4));
    assert_eq!(page(json!({"file_path": file, "source": true, "offset": 8})), Value::Null);
    assert_eq!(page(json!({"file_path": file, "source": true, "limit": 2})), json!(2));
    // Without source, ten outline lines are far below it; a thousand long ones are not, though
    // `limit` would take them all.
    assert_eq!(page(json!({"file_path": file})), Value::Null);
    let name = "a-function-whose-name-says-rather-more-than-it-needs-to";
    let code: String = (0..1_000).map(|i| format!("(defun {name}-{i:04} () nil)\n")).collect();
    let file = project.file("long-names.lisp", &code);
    let output = run(&lisp_outline::TOOL, json!({"file_path": file}), &project.roots);
    let next = output.structured_value().unwrap()["next_offset"].as_u64().expect("a next page");
    assert!((200..300).contains(&next), "{next} forms on the first page");
    assert!((15_000..16_200).contains(&output.text.chars().count()), "{}", output.text.chars().count());
}

#[test]
fn escaped_names_are_told_apart_as_sbcls_reader_tells_them() {
    // The contract compares names with string-equal; SBCL reads `|foo|` as another symbol than
    // `foo`, and `|FOO|` as the same one.
    let project = Project::new();
    let file = project.file("escaped.lisp", "(defun |foo| () 1)\n\n(defun foo () 2)\n");
    for (form_name, line) in [("foo", "line 3"), ("|FOO|", "line 3"), ("|foo|", "line 1")] {
        let output = project.edit(json!({
            "file_path": file, "form_type": "defun", "form_name": form_name,
            "operation": "replace", "content": "(x)", "dry_run": true,
        }));
        assert!(!output.is_error && output.text.contains(&format!("({line})")), "{form_name}: {}", output.text);
    }
}

#[test]
fn a_patch_over_lines_it_leaves_alone_tells_each_changed_line() {
    let project = Project::new();
    let file = project.file("m.lisp", "(defun f ()\n  (list (a 1)\n        (b)\n        (c 1)))\n");
    let output = project.edit(json!({
        "file_path": file, "form_type": "defun", "form_name": "f", "operation": "patch",
        "old_text": "(a 1)\n        (b)\n        (c 1)", "new_text": "(a 2)\n        (b)\n        (c 2)",
    }));
    assert_eq!(output.text, "Patched `defun f` in m.lisp, line 2 now:\n(list (a 2)\nline 4 now:\n(c 2)))");
}
