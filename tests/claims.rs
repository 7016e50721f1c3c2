//! Issue 32: each count, location and statement a reply makes, checked against the image, the
//! file it is about or a shell's run of SBCL, on real code (Debian's cl-ppcre sources) and on
//! files written here.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use swank_mcp::source::AllowedRoots;
use swank_mcp::tools::{ToolOutput, Toolbox};

const PPCRE: &str = "/usr/share/common-lisp/source/cl-ppcre";

async fn call(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> ToolOutput {
    common::call_within(toolbox, tool, arguments, Duration::from_secs(300)).await
}

async fn ok(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> String {
    let output = call(toolbox, tool, arguments.clone()).await;
    assert!(!output.is_error, "{tool} {arguments}: {}", output.text);
    output.text
}

/// A toolbox on the shared image whose allowed root is `dir`.
fn toolbox_with_root(dir: &Path) -> Arc<Toolbox> {
    let roots = AllowedRoots::new(vec![dir.to_path_buf()]).unwrap();
    Arc::new(Toolbox::new(common::settings(), vec![common::image_settings(common::shared_image_port())], roots))
}

/// A fresh directory, canonical (the image names files by their true names).
fn directory() -> PathBuf {
    tempfile::tempdir().unwrap().keep().canonicalize().unwrap()
}

/// The shared image's toolbox, with cl-ppcre loaded into the image.
async fn with_ppcre() -> Arc<Toolbox> {
    static LOADED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let toolbox = common::toolbox(common::shared_image_port());
    LOADED
        .get_or_init(|| async {
            let _asdf = common::shared_asdf_turn().await;
            ok(&toolbox, "load-system", json!({"system": "cl-ppcre"})).await;
        })
        .await;
    toolbox
}

/// The 1-based line and column where `needle` first starts in `text`.
fn line_and_column(text: &str, needle: &str) -> (usize, usize) {
    let at = text.find(needle).unwrap_or_else(|| panic!("{needle:?} is in the text"));
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    (text[..at].matches('\n').count() + 1, text[line_start..at].chars().count() + 1)
}

/// The value an evaluation printed, without its handle.
async fn value(toolbox: &Arc<Toolbox>, code: &str) -> String {
    let text = common::eval_ok(toolbox, code).await;
    common::without_handle(text.lines().last().unwrap()).trim_start_matches("=> ").to_string()
}

/// Item 2: the classes named as the source of inherited slots are those that define them.
#[tokio::test]
async fn class_info_names_the_classes_whose_slots_are_inherited() {
    let toolbox = with_ppcre().await;
    let reply = ok(&toolbox, "class-info", json!({"class": "cl-ppcre:ppcre-syntax-error"})).await;
    // The image: the superclasses whose own slots the class has and does not define itself.
    let defining = value(
        &toolbox,
        "(let* ((class (find-class 'cl-ppcre:ppcre-syntax-error))
                (own (mapcar #'sb-mop:slot-definition-name (sb-mop:class-direct-slots class))))
           (format nil \"~{~A~^ and ~}\"
                   (loop for super in (rest (sb-mop:class-precedence-list class))
                         when (some (lambda (slot) (not (member (sb-mop:slot-definition-name slot) own)))
                                    (sb-mop:class-direct-slots super))
                           collect (class-name super))))",
    )
    .await;
    assert_eq!(defining, "\"SIMPLE-CONDITION\"");
    assert!(reply.contains("All Slots (inherited included): 4\n  (includes slots from SIMPLE-CONDITION)\n"), "{reply}");
    assert!(!reply.contains("PPCRE-ERROR)"), "{reply}");
}

/// Item 4: a definition behind a `#-` form, after a `#+` form the reader dropped, is at its own
/// line in every tool.
#[tokio::test]
async fn a_definition_after_a_dropped_conditional_is_at_its_line() {
    let toolbox = with_ppcre().await;
    let file = format!("{PPCRE}/util.lisp");
    let text = std::fs::read_to_string(&file).unwrap();
    // The file: #+:lispworks (dropped in SBCL), then #-:lispworks (defmacro with-unique-names ...).
    // Its place is the DEFMACRO's line, not the #- line above it (issue 38, item 9).
    let (line, column) = line_and_column(&text, "(defmacro with-unique-names");
    let (dropped, _) = line_and_column(&text, "#+:lispworks\n(eval-when");
    assert!(dropped < line - 1);
    let described = ok(&toolbox, "describe-symbol", json!({"symbol": "cl-ppcre::with-unique-names"})).await;
    assert!(described.contains(&format!("  Source: {file}:{line}:{column}")), "{described}");
    let found = ok(&toolbox, "find-definition", json!({"symbol": "cl-ppcre::with-unique-names"})).await;
    assert!(found.ends_with(&format!("macro  {file}:{line}:{column}")), "{found}");
    // SBCL's own record agrees: the form number counts only the forms read.
    let form_number = value(
        &toolbox,
        "(first (sb-introspect:definition-source-form-path
                 (first (sb-introspect:find-definition-sources-by-name 'cl-ppcre::with-unique-names :macro))))",
    )
    .await;
    let read_forms = std::process::Command::new("sbcl")
        .args(["--non-interactive", "--no-userinit", "--eval"])
        .arg(format!(
            "(with-open-file (in {file:?}) (let ((*package* (make-package :claims-reading :use '(:cl)))) \
             (loop for i from 0 for form = (read in nil in) until (eq form in) \
                   when (and (consp form) (eq (first form) 'defmacro) (string= (second form) \"WITH-UNIQUE-NAMES\")) \
                   do (format t \"~&FORM ~D~%\" i))))"
        ))
        .output()
        .expect("sbcl runs");
    let shell = String::from_utf8_lossy(&read_forms.stdout);
    assert!(shell.contains(&format!("FORM {form_number}\n")), "form {form_number}, the shell read: {shell}");
}

/// Item 3: a failed load tallies an undefined variable as the WARNING SBCL signals, not as a
/// style-warning.
#[tokio::test]
async fn a_failed_load_counts_warnings_as_sbcl_signals_them() {
    let _asdf = common::shared_asdf_turn().await;
    let toolbox = common::toolbox(common::shared_image_port());
    let dir = directory();
    let source = "(defun claims-uses-undefined-variable () (1+ *claims-no-such-variable*))\n\
                  (defun claims-uses-undefined-function () (claims-no-such-function))\n\
                  (defun claims-fails () (+ 1 \"two\"))\n";
    let file = dir.join("claims-tally.lisp");
    std::fs::write(&file, source).unwrap();
    let asd = dir.join("claims-tally.asd");
    std::fs::write(&asd, "(asdf:defsystem \"claims-tally\" :components ((:file \"claims-tally\")))\n").unwrap();
    common::eval_ok(&toolbox, &format!("(require :asdf) (asdf:load-asd {:?})", asd.display().to_string())).await;
    let reply = call(&toolbox, "load-system", json!({"system": "claims-tally"})).await;
    assert!(reply.is_error, "{}", reply.text);
    // A shell's SBCL compiling the same file: each warning's class.
    let shell = std::process::Command::new("sbcl")
        .args(["--non-interactive", "--no-userinit", "--eval"])
        .arg(format!(
            "(let ((warnings 0) (style-warnings 0)) \
               (handler-bind ((warning (lambda (w) (if (typep w 'style-warning) (incf style-warnings) (incf warnings))))) \
                 (compile-file {:?} :output-file {:?})) \
               (format t \"~&TALLY ~D ~D~%\" warnings style-warnings))",
            file.display().to_string(),
            dir.join("shell.fasl").display().to_string()
        ))
        .output()
        .expect("sbcl runs");
    let shell = String::from_utf8_lossy(&shell.stdout);
    let tally = shell.lines().find_map(|line| line.strip_prefix("TALLY ")).expect("the shell's tally");
    assert_eq!(tally, "2 1", "{shell}");
    assert!(reply.text.contains("2 warnings, 1 style-warning, "), "{}", reply.text);
    assert!(
        reply.text.contains("\nWARNING: undefined variable: COMMON-LISP-USER::*CLAIMS-NO-SUCH-VARIABLE*"),
        "{}",
        reply.text
    );
}

/// Item 5: find-definition says a file changed only when it did.
#[tokio::test]
async fn an_unchanged_file_is_not_said_to_have_changed() {
    let dir = directory();
    let toolbox = toolbox_with_root(&dir);
    let file = dir.join("claims-made.lisp");
    // The definition is made by a macro; a form of the same name is in the file, but dropped.
    let text = "(defmacro claims-define (name) `(defun ,name () 1))\n\n(claims-define claims-made-by-macro)\n\n\
                #+(or) (defun claims-made-by-macro () 2)\n";
    std::fs::write(&file, text).unwrap();
    common::eval_ok(&toolbox, &format!("(load (compile-file {:?}))", file.display().to_string())).await;
    let (line, column) = line_and_column(text, "(claims-define claims-made-by-macro)");
    let found = ok(&toolbox, "find-definition", json!({"symbol": "claims-made-by-macro"})).await;
    assert!(found.ends_with(&format!("function  {}:{line}:{column}", file.display())), "{found}");
    assert!(!found.contains("changed"), "{found}");
    // The file's write date is the one SBCL recorded.
    let dates = value(
        &toolbox,
        &format!(
            "(list (sb-introspect:definition-source-file-write-date
                    (sb-introspect:find-definition-source #'claims-made-by-macro))
                   (file-write-date {:?}))",
            file.display().to_string()
        ),
    )
    .await;
    let dates: Vec<&str> = dates.trim_matches(|c| c == '(' || c == ')').split(' ').collect();
    assert_eq!(dates[0], dates[1]);
}

/// Sets `file`'s modification time `seconds` after the epoch-relative time it has now, so that
/// SBCL's one-second write dates tell two versions apart.
fn age(file: &Path, seconds: u64) {
    let when = std::fs::metadata(file).unwrap().modified().unwrap() + Duration::from_secs(seconds);
    std::fs::File::options().write(true).open(file).unwrap().set_modified(when.max(SystemTime::now())).unwrap();
}

/// Item 6: undo's locations of a file that changed since it was compiled are where the
/// definitions are in its current text, as find-definition says.
#[tokio::test]
async fn undo_locations_are_found_in_the_current_text() {
    let dir = directory();
    let toolbox = toolbox_with_root(&dir);
    let file = dir.join("claims-undo.lisp");
    let first = "(defun claims-undo-a () :a)\n(defun claims-undo-b () :old)\n";
    std::fs::write(&file, first).unwrap();
    let load = format!("(load (compile-file {:?}))", file.display().to_string());
    common::eval_ok(&toolbox, &load).await;
    // The second version: three lines more above, and B changed.
    let second =
        ";;; Three lines\n;;; of commentary\n\n(defun claims-undo-a () :a)\n\n  (defun claims-undo-b () :new)\n";
    std::fs::write(&file, second).unwrap();
    age(&file, 5);
    common::eval_ok(&toolbox, &load).await;
    let listed = ok(&toolbox, "undo", json!({})).await;
    let entry = listed
        .lines()
        .rfind(|line| line.contains("function COMMON-LISP-USER::CLAIMS-UNDO-B: replaced"))
        .unwrap_or_else(|| panic!("an entry replacing B in {listed}"));
    let (line, column) = line_and_column(second, "(defun claims-undo-b");
    assert!(entry.contains(&format!("{}:{line}:{column}", file.display())), "{entry}");
    let number: u64 = entry.split_whitespace().next().unwrap().parse().unwrap();
    let restored = ok(&toolbox, "undo", json!({"entries": [number]})).await;
    let found = ok(&toolbox, "find-definition", json!({"symbol": "claims-undo-b"})).await;
    let place = format!("{}:{line}:{column}", file.display());
    assert!(restored.contains(&format!("now defined at {place}")), "{restored}");
    assert!(found.contains(&place), "{found}");
}

/// Item 7: the debugger's source column counts from 1, as the file's columns do.
/// Item 8: lisp-status names the stopped thread as the threads tool does; the threads tool says
/// it waits in the debugger, and its backtrace reaches the code that stopped, or says it is cut.
#[tokio::test]
async fn the_debugger_tools_name_the_same_thread_and_column() {
    let dir = directory();
    let toolbox = toolbox_with_root(&dir);
    let file = dir.join("claims-dbg.lisp");
    let text = "(defun claims-dbg (x)\n  (declare (optimize (debug 2)))\n  (list x\n        (claims-dbg-fail x)))\n\n\
                (defun claims-dbg-fail (x)\n  (error \"claims ~A\" x))\n";
    std::fs::write(&file, text).unwrap();
    common::eval_ok(&toolbox, &format!("(load (compile-file {:?}))", file.display().to_string())).await;
    let stopped = call(&toolbox, "evaluate-lisp", json!({"code": "(claims-dbg 7)", "debug": true})).await;
    assert!(stopped.text.starts_with("[DEBUGGER D"), "{}", stopped.text);
    let structured = stopped.structured_value().unwrap();
    let session = structured["debugger_session"].as_str().unwrap().to_string();
    let frame = structured["frames"]
        .as_array()
        .unwrap()
        .iter()
        .find(|frame| frame["call"].as_str().unwrap().starts_with("(CLAIMS-DBG 7)"))
        .unwrap_or_else(|| panic!("no frame of CLAIMS-DBG in {}", stopped.text))["frame"]
        .as_u64()
        .unwrap();
    let facts = ok(&toolbox, "debugger", json!({"session": session, "action": "frame", "frame": frame})).await;
    let (line, column) = line_and_column(text, "(claims-dbg-fail x)))");
    assert!(facts.contains(&format!("\nSource: {}:{line}:{column}\n", file.display())), "{facts}");

    let status = ok(&toolbox, "lisp-status", json!({})).await;
    let thread = status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("Debugger session {session}: thread ")))
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("{session} in {status}"))
        .to_string();
    let threads = ok(&toolbox, "threads", json!({})).await;
    let listed = threads
        .lines()
        .find(|line| line.trim_start().starts_with(&format!("{thread} ")))
        .unwrap_or_else(|| panic!("thread {thread} in {threads}"));
    assert!(listed.contains("waits in swank-mcp's debugger (SIMPLE-ERROR)"), "{listed}");
    // The image: that thread is the one the evaluation stopped in.
    let stopped_in = value(
        &toolbox,
        &format!(
            "(let ((thread (find {thread} (sb-thread:list-all-threads) :key #'mcp-agent-helper::thread-number)))
               (and thread (sb-thread:symbol-value-in-thread 'mcp-agent-helper::*parked* thread nil) t))"
        ),
    )
    .await;
    assert_eq!(stopped_in, "T");
    let backtrace = ok(&toolbox, "threads", json!({"action": "backtrace", "thread": thread})).await;
    assert!(backtrace.contains("\n  (CLAIMS-DBG-FAIL 7)\n  (CLAIMS-DBG 7)\n"), "{backtrace}");
    assert!(backtrace.contains("frames of swank-mcp's helper and the swank or slynk server)"), "{backtrace}");
    let aborted = call(&toolbox, "debugger", json!({"session": session, "action": "abort"})).await;
    assert!(aborted.text.starts_with("[ERROR] EVALUATION-ABORTED"), "{}", aborted.text);
}

/// Item 9: a note inside a definition that holds `#.` is placed at its subform.
#[tokio::test]
async fn load_file_places_notes_past_a_read_time_evaluation() {
    let dir = directory();
    let toolbox = toolbox_with_root(&dir);
    let file = dir.join("claims-sharpdot.lisp");
    let text = "(in-package #:cl-user)\n\n(defun claims-read-time (x)\n  (list #.(+ 1 2)\n        \
                (claims-read-time-missing x)))\n";
    std::fs::write(&file, text).unwrap();
    let loaded = ok(&toolbox, "load-file", json!({"file_path": file.display().to_string()})).await;
    let (line, column) = line_and_column(text, "(claims-read-time-missing x)");
    assert!(
        loaded.contains("STYLE-WARNING: undefined function: COMMON-LISP-USER::CLAIMS-READ-TIME-MISSING"),
        "{loaded}"
    );
    assert!(loaded.contains(&format!("at: claims-sharpdot.lisp:{line}:{column}")), "{loaded}");
    assert_eq!(value(&toolbox, "(defun claims-read-time-missing (x) x) (claims-read-time 0)").await, "(3 0)");
}

/// Item 10: the cpu profile shows the 15 rows it promises, the top of sb-sprof's own report.
#[tokio::test]
async fn the_profile_shows_the_rows_it_promises() {
    let toolbox = common::toolbox(common::shared_image_port());
    // Twenty functions that each take their share of the time.
    let mut code = String::from("(progn ");
    for i in 0..20 {
        code.push_str(&format!(
            "(defun claims-burn-{i} (n) (declare (optimize (speed 0) (debug 2))) \
             (let ((s 0)) (dotimes (i n s) (setf s (logxor s (* i {}))))))",
            i + 3
        ));
    }
    code.push(')');
    common::eval_ok(&toolbox, &code).await;
    let run: String = (0..20).map(|i| format!("(claims-burn-{i} 500000)")).collect::<Vec<_>>().join(" ");
    let reply = ok(&toolbox, "profile", json!({"code": format!("(dotimes (k 10) {run})")})).await;
    assert!(reply.contains("top functions by self samples"), "{reply}");
    let rows: Vec<&str> = reply
        .lines()
        .skip_while(|line| !line.trim_end().ends_with("Function"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .collect();
    // The image's own report of the same samples: how many functions have samples.
    let functions: usize = value(
        &toolbox,
        "(length (remove-if-not (lambda (line) (search \"CLAIMS-BURN-\" line))
           (uiop:split-string (with-output-to-string (out) (sb-sprof:report :type :flat :max 1000 :stream out))
                              :separator '(#\\Newline))))",
    )
    .await
    .parse()
    .unwrap();
    assert!(functions >= 15, "the profile sampled {functions} of the functions");
    assert_eq!(rows.len(), 15, "{reply}");
}

/// Item 11: inspecting a circular list counts its conses, each shown once.
#[tokio::test]
async fn inspect_counts_a_circular_lists_conses() {
    let toolbox = common::toolbox(common::shared_image_port());
    let reply =
        ok(&toolbox, "inspect", json!({"code": "(let ((list (list :a :b :c))) (setf (cdr (last list)) list) list)"}))
            .await;
    assert!(reply.contains("a circular list of 3 conses, the last one's cdr the first (element 0)"), "{reply}");
    assert!(reply.ends_with("Elements (3):\n  0 = :A\n  1 = :B\n  2 = :C"), "{reply}");
    let tail = ok(
        &toolbox,
        "inspect",
        json!({"code": "(let ((list (list 1 2 3 4 5))) (setf (cdr (last list)) (cddr list)) list)"}),
    )
    .await;
    assert!(tail.contains("a circular list of 5 conses, the last one's cdr the third (element 2)"), "{tail}");
}

/// From the Emacs side: the activity record's line for an evaluation with a warning is its value.
#[tokio::test]
async fn the_activity_line_of_an_evaluation_with_a_warning_is_its_value() {
    let port = common::shared_image_port();
    let mut client = common::McpClient::for_port(port).await;
    client.initialize().await;
    let code = "(defun claims-activity () (1+ *claims-activity-undefined*)) :claims-activity-value";
    let reply = client.call_tool("evaluate-lisp", json!({"code": code})).await;
    let text = common::text(&reply);
    assert!(text.starts_with("[warnings]\n"), "{text}");
    let last = text.lines().last().unwrap();
    let toolbox = common::toolbox(port);
    let mut outcome = String::new();
    for _ in 0..50 {
        outcome = value(
            &toolbox,
            "(let ((record (find-if (lambda (record) (search \"claims-activity-value\" (or (getf record :input) \"\")))
                                    (mcp-agent-helper::activity-records))))
               (and record (getf record :outcome)))",
        )
        .await;
        if outcome != "NIL" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(outcome, format!("{last:?}"));
}

/// From the Emacs side: undo does not call the agent's own evaluate-lisp definition the REPL's.
#[tokio::test]
async fn undo_names_an_agents_definition_as_the_agents() {
    let toolbox = common::toolbox(common::shared_image_port());
    common::eval_ok(&toolbox, "(defun claims-agent-made () 1)").await;
    common::eval_ok(&toolbox, "(defun claims-agent-made () 2)").await;
    let listed = ok(&toolbox, "undo", json!({})).await;
    let entry = listed
        .lines()
        .rfind(|line| line.contains("CLAIMS-AGENT-MADE: replaced"))
        .unwrap_or_else(|| panic!("an entry replacing CLAIMS-AGENT-MADE in {listed}"));
    assert!(entry.contains("(defined by an agent's tool call, no source file)"), "{entry}");
    let number: u64 = entry.split_whitespace().next().unwrap().parse().unwrap();
    let restored = ok(&toolbox, "undo", json!({"entries": [number]})).await;
    assert!(restored.contains("now defined by an agent's tool call, no source file"), "{restored}");
    assert_eq!(value(&toolbox, "(claims-agent-made)").await, "1");
}

/// Issue 38, item 9: describe-symbol places a definition behind a `#+` where find-definition
/// does: at its own line, not the `#+`'s, and after an edit above it, in the file's current text.
#[tokio::test]
async fn describe_symbol_places_definitions_as_find_definition_does() {
    let dir = directory();
    let toolbox = toolbox_with_root(&dir);
    let file = dir.join("claims-featured.lisp");
    let first = format!(
        "{};;; comment\n#+sbcl\n(defun claims-featured () 1)\n\n#+sbcl\n(defstruct claims-featured-struct a)\n",
        ";;; line\n".repeat(12)
    );
    std::fs::write(&file, &first).unwrap();
    common::eval_ok(&toolbox, &format!("(load (compile-file {:?}))", file.display().to_string())).await;
    let places = |text: &str| {
        [line_and_column(text, "(defun claims-featured"), line_and_column(text, "(defstruct claims-featured-struct")]
            .map(|(line, column)| format!("{}:{line}:{column}", file.display()))
    };
    let [function, structure] = places(&first);
    assert!(function.ends_with(":15:1"), "{function}");
    let described = ok(&toolbox, "describe-symbol", json!({"symbol": "claims-featured"})).await;
    assert!(described.lines().any(|line| line == format!("  Source: {function}")), "{described}");
    let found = ok(&toolbox, "find-definition", json!({"symbol": "claims-featured"})).await;
    assert!(found.ends_with(&format!("function  {function}")), "{found}");
    let described = ok(&toolbox, "describe-symbol", json!({"symbol": "claims-featured-struct"})).await;
    assert!(described.contains(&format!("  Source: {structure}")), "{described}");
    // Two lines inserted above, not compiled: both tools find the forms where they are now.
    let second = format!(";;; Two more\n;;; lines\n{first}");
    std::fs::write(&file, &second).unwrap();
    age(&file, 5);
    let [function, structure] = places(&second);
    let note = "(the file changed since this was compiled; found in its current text)";
    let described = ok(&toolbox, "describe-symbol", json!({"symbol": "claims-featured"})).await;
    assert!(described.contains(&format!("  Source: {function} {note}")), "{described}");
    let found = ok(&toolbox, "find-definition", json!({"symbol": "claims-featured"})).await;
    assert!(found.contains(&format!("function  {function}")), "{found}");
    // SBCL records a structure by its form's number, which comments above do not change, and no
    // write date: its file's, which its accessor was compiled with, says that it changed too
    // (issue 38, item 12b).
    let described = ok(&toolbox, "describe-symbol", json!({"symbol": "claims-featured-struct"})).await;
    assert!(described.lines().any(|line| line == format!("  Source: {structure} {note}")), "{described}");
    let found = ok(&toolbox, "find-definition", json!({"symbol": "claims-featured-struct"})).await;
    assert!(found.contains(&format!("structure  {structure} {note}")), "{found}");
}

/// Issue 38, item 11: load-file counts the forms SBCL compiled, not those its reader skipped
/// (behind `#+` conditionals that do not hold, nested ones too) nor comments.
#[tokio::test]
async fn load_file_counts_the_forms_sbcl_compiled() {
    let dir = directory();
    let toolbox = toolbox_with_root(&dir);
    let file = dir.join("claims-counted.lisp");
    let text = "#| a block comment |#\n;; a comment\n#+lispworks (defun claims-counted-lw () 1)\n\
                (progn (defun claims-counted-a () 1) #-sbcl (defun claims-counted-b () 2))\n\
                #+sbcl (defun claims-counted-c () 3)\n#+(or) (defvar *claims-counted-never* 4)\n";
    std::fs::write(&file, text).unwrap();
    let loaded = ok(&toolbox, "load-file", json!({"file_path": file.display().to_string()})).await;
    // A shell's SBCL reading the file: the forms its reader gives the compiler.
    let shell = std::process::Command::new("sbcl")
        .args(["--non-interactive", "--no-userinit", "--eval"])
        .arg(format!(
            "(with-open-file (in {:?}) (format t \"~&READ ~D~%\" (loop for form = (read in nil in) until (eq form in) count t)))",
            file.display().to_string()
        ))
        .output()
        .expect("sbcl runs");
    let shell = String::from_utf8_lossy(&shell.stdout);
    assert!(shell.contains("READ 2\n"), "{shell}");
    assert!(loaded.contains("(2 top-level forms with 2 definitions, nested ones included)"), "{loaded}");
    // The definitions counted are those the image has.
    assert_eq!(
        value(&toolbox, "(mapcar (lambda (s) (and (fboundp s) t)) '(claims-counted-lw claims-counted-a claims-counted-b claims-counted-c))")
            .await,
        "(NIL T NIL T)"
    );
}

/// Issue 38, item 12: class-info shows every initarg a slot takes, those another superclass
/// gives it too.
#[tokio::test]
async fn class_info_shows_the_initargs_of_every_superclass() {
    let toolbox = common::toolbox(common::shared_image_port());
    common::eval_ok(
        &toolbox,
        "(defclass claims-left () ((x :initarg :from-left))) \
         (defclass claims-right () ((x :initarg :from-right :initform 7))) \
         (defclass claims-both (claims-left claims-right) ()) \
         (defclass claims-own (claims-right) ((x :initarg :own)))",
    )
    .await;
    // The image: the initargs each class's slot takes, and that the inherited one works.
    assert_eq!(
        value(
            &toolbox,
            "(mapcar (lambda (c) (sb-mop:finalize-inheritance (find-class c))
                       (sb-mop:slot-definition-initargs (first (sb-mop:class-slots (find-class c)))))
                     '(claims-both claims-own))"
        )
        .await,
        "((:FROM-RIGHT :FROM-LEFT) (:FROM-RIGHT :OWN))"
    );
    assert_eq!(value(&toolbox, "(slot-value (make-instance 'claims-both :from-right 3) 'x)").await, "3");
    let both = ok(&toolbox, "class-info", json!({"class": "claims-both"})).await;
    assert!(
        both.contains("  X (from CLAIMS-LEFT)\n    Initarg: :FROM-RIGHT\n    Initarg: :FROM-LEFT\n    Initform: 7"),
        "{both}"
    );
    let own = ok(&toolbox, "class-info", json!({"class": "claims-own"})).await;
    assert!(own.contains("  X\n    Initarg: :FROM-RIGHT\n    Initarg: :OWN\n    Initform: 7"), "{own}");
}

/// Issue 38, item 15: a connection cut while the image runs on is not said to be an exit of the
/// image, and an exit still is.
#[tokio::test]
async fn a_cut_connection_is_told_from_an_exit_of_the_image() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    let pid = value(&toolbox, "(sb-unix:unix-getpid)").await;
    // The image shuts its side of this very connection down, as a dropped network would end it.
    let cut = "(let ((fd (sb-sys:fd-stream-fd (swank::connection.socket-io swank::*emacs-connection*))))
                 (sb-alien:alien-funcall
                  (sb-alien:extern-alien \"shutdown\" (function sb-alien:int sb-alien:int sb-alien:int)) fd 2)
                 (sleep 10))";
    let output = call(&toolbox, "evaluate-lisp", json!({"code": cut})).await;
    assert!(output.is_error, "{}", output.text);
    assert!(
        output.text.contains(&format!("Only the connection was cut: the image (pid {pid}) still runs")),
        "{}",
        output.text
    );
    assert!(!output.text.contains("exited"), "{}", output.text);
    // The image does run, and the next call reaches it.
    assert!(std::fs::metadata(format!("/proc/{pid}")).is_ok());
    assert_eq!(value(&toolbox, "(+ 1 2)").await, "3");
    // A real exit is still one.
    let settings = swank_mcp::tools::Settings { allow_exit: true, ..common::settings() };
    let exiting = Arc::new(Toolbox::new(
        settings,
        vec![common::image_settings(image.port)],
        AllowedRoots::new(Vec::new()).unwrap(),
    ));
    let output = call(&exiting, "evaluate-lisp", json!({"code": "(sb-ext:exit :code 3)"})).await;
    assert!(output.is_error && output.text.contains("The image exited (for example"), "{}", output.text);
    assert!(!output.text.contains("still runs"), "{}", output.text);
}

/// The profile's rows: (self, self %, total, total %, function).
fn profile_rows(reply: &str) -> Vec<(u64, f64, u64, f64, String)> {
    reply
        .lines()
        .skip_while(|line| !line.trim_end().ends_with("Function"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (
                fields[0].parse().unwrap(),
                fields[1].parse().unwrap(),
                fields[2].parse().unwrap(),
                fields[3].parse().unwrap(),
                fields[4..].join(" "),
            )
        })
        .collect()
}

/// Issue 38, item 10: the profile's figures are those of the code's own run, the same in its
/// header and in TIME's block, and its columns hold what they are labelled.
#[tokio::test]
async fn the_profiles_figures_are_the_codes_own() {
    // An image of its own: the bytes consed are counted for the whole image.
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    common::eval_ok(
        &toolbox,
        "(defun claims-no-alloc (n) (declare (fixnum n) (optimize speed (safety 0)))
           (let ((s 0)) (declare (fixnum s)) (dotimes (i n s) (setf s (logand (+ s (* i 7)) #xffff)))))
         (defun claims-alloc (n) (let ((l nil)) (dotimes (i n (length l)) (push (make-array 10) l))))
         (defun claims-deep (n) (if (zerop n) (claims-no-alloc 2000000) (1+ (claims-deep (1- n)))))",
    )
    .await;
    // The image: the code allocates nothing, and CLAIMS-ALLOC about 112 MB (to within the
    // allocation regions SBCL counts by, and what a collection during the run rounds).
    let consed =
        |call: &str| format!("(let ((before (sb-ext:get-bytes-consed))) {call} (- (sb-ext:get-bytes-consed) before))");
    assert_eq!(value(&toolbox, &consed("(claims-no-alloc 100000000)")).await, "0");
    let allocated: u64 = value(&toolbox, &consed("(claims-alloc 1000000)")).await.parse().unwrap();

    let cpu = call(&toolbox, "profile", json!({"code": "(claims-no-alloc 300000000)"})).await;
    assert!(cpu.text.starts_with("Ran in ") && cpu.text.contains(", consed 0 bytes,"), "{}", cpu.text);

    let alloc = call(&toolbox, "profile", json!({"code": "(claims-alloc 1000000)", "mode": "alloc"})).await;
    let bytes = alloc.structured_value().unwrap()["bytes"].as_u64().unwrap();
    assert!(bytes.abs_diff(allocated) * 100 < allocated, "the profile says {bytes}, the image {allocated}");

    let time = call(&toolbox, "profile", json!({"code": "(claims-alloc 1000000)", "mode": "time"})).await;
    let structured = time.structured_value().unwrap();
    let (ms, bytes) = (structured["milliseconds"].as_u64().unwrap(), structured["bytes"].as_u64().unwrap());
    assert!(time.text.contains(&format!("consed {} bytes", swank_mcp::tools::group_thousands(bytes))), "{}", time.text);
    assert!(
        time.text.contains(&format!("\n  {} bytes consed", swank_mcp::tools::group_thousands(bytes))),
        "{}",
        time.text
    );
    assert!(time.text.contains(&format!("\n  {}.{:03} seconds of real time", ms / 1000, ms % 1000)), "{}", time.text);
    assert!(bytes.abs_diff(allocated) * 100 < allocated, "TIME says {bytes}, the image {allocated}");

    // A recursive function is on every sample's stack many times over; its total is still the
    // samples it is in.
    let deep = call(&toolbox, "profile", json!({"code": "(dotimes (k 50) (claims-deep 30))"})).await;
    assert!(deep.text.contains("Total: those with it anywhere on the stack") && !deep.text.contains("Cumul"));
    let rows = profile_rows(&deep.text);
    let samples = deep.structured_value().unwrap()["samples"].as_u64().unwrap();
    let recursive = rows.iter().find(|row| row.4 == "CLAIMS-DEEP").unwrap_or_else(|| panic!("{}", deep.text));
    assert!(recursive.2 <= samples && recursive.3 <= 100.0, "{}", deep.text);
    assert!(rows.iter().all(|row| row.2 <= samples && row.3 <= 100.0 && row.0 <= row.2), "{}", deep.text);
}
