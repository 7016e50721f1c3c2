//! Every tool that cuts text against a real image: each cut note names a handle and an offset,
//! and reading there with `inspect`, following each page's note, gives the rest to the end; the
//! start shown and the rest read put together are the whole text, which the image itself
//! computed and compares.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use swank_mcp::source::AllowedRoots;
use swank_mcp::tools::{Settings, ToolOutput, Toolbox};

/// Small, so that each tool's text is cut without printing megabytes.
const LIMIT: usize = 1000;

fn toolbox(port: u16, dir: &Path) -> Arc<Toolbox> {
    let settings = Settings { max_output: LIMIT, ..common::settings() };
    let roots = AllowedRoots::new(vec![dir.to_path_buf()]).unwrap();
    Arc::new(Toolbox::new(settings, vec![common::image_settings(port)], roots))
}

async fn call(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> ToolOutput {
    common::call_within(toolbox, tool, arguments, Duration::from_secs(120)).await
}

async fn eval_ok(toolbox: &Arc<Toolbox>, code: &str) -> String {
    let output = call(toolbox, "evaluate-lisp", json!({ "code": code })).await;
    assert!(!output.is_error, "{code}: {}", output.text);
    output.text
}

/// `text` as a Lisp string literal.
fn lisp_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A listing cut to its first entries in `section` of `reply`: its note starts with `note_start`
/// and names the handle that holds every entry from the offset of the first not shown, and what
/// is shown and what is read there are, in the image, the text of `cl-user::*cut-expected*`.
async fn check_listing_cut(toolbox: &Arc<Toolbox>, reply: &str, section: &str, note_start: &str) {
    let listing = &reply[reply.find(section).unwrap_or_else(|| panic!("no {section:?} in {reply}")) + section.len()..];
    let (shown, note) = listing.split_once("[... ").unwrap();
    let note = note.lines().next().unwrap();
    assert!(note.starts_with(note_start), "{note}");
    let (handle, offset) = note_target(note);
    assert_eq!(shown.chars().count(), offset, "{note}");
    let (pieces, lost) = read_to_end(toolbox, &handle, offset).await;
    assert_eq!((pieces.len(), lost), (1, 0));
    let whole = format!("{shown}{}", pieces[0]);
    let same = eval_ok(toolbox, &format!("(string= cl-user::*cut-expected* {})", lisp_string(&whole))).await;
    assert_eq!(same, "=> T", "the entries shown in {section:?} and those read are every entry");
}

/// The handle and offset a cut note names: `inspect @4 with offset 16000 for ...`.
fn note_target(note: &str) -> (String, usize) {
    let after = &note[note.rfind("inspect @").unwrap_or_else(|| panic!("no handle in {note}")) + "inspect ".len()..];
    let words: Vec<&str> = after.split(' ').collect();
    assert_eq!(&words[1..3], ["with", "offset"], "{note}");
    (words[0].to_string(), words[3].trim_end_matches([']', ';', '.']).parse().unwrap())
}

/// The start shown after `marker` in `reply`, and the handle and offset its cut note names.
fn cut_start(reply: &str, marker: &str) -> (String, String, usize) {
    let at = reply.find(marker).unwrap_or_else(|| panic!("no {marker:?} in {reply}")) + marker.len();
    let after = &reply[at..];
    let note_at = after.find("[... ").unwrap_or_else(|| panic!("no cut note after {marker:?} in {reply}"));
    let note = after[note_at..].lines().next().unwrap();
    let (handle, offset) = note_target(note);
    let start: String = after.chars().take(offset).collect();
    assert_eq!(
        after[..note_at].strip_suffix('\n').unwrap_or(&after[..note_at]),
        start.strip_suffix('\n').unwrap_or(&start),
        "the note's offset counts the characters shown: {note}"
    );
    (start, handle, offset)
}

/// Reads the text behind `handle` from `offset` on, page by page, following each page's note to
/// the end. Returns the pieces kept, split where characters were not kept, and how many were not.
async fn read_to_end(toolbox: &Arc<Toolbox>, handle: &str, mut offset: usize) -> (Vec<String>, u64) {
    let mut pieces = vec![String::new()];
    let mut lost = 0;
    loop {
        let output = call(toolbox, "inspect", json!({"handle": handle, "offset": offset})).await;
        assert!(!output.is_error, "{handle} at {offset}: {}", output.text);
        let (header, body) = output.text.split_once('\n').unwrap_or((&output.text, ""));
        assert!(header.starts_with(&format!("{handle} text of ")), "{header}");
        if let Some((page, note)) = body.rsplit_once("\n[... ") {
            pieces.last_mut().unwrap().push_str(page);
            let (next_handle, next) = note_target(note);
            assert_eq!(next_handle, handle, "{note}");
            assert_eq!(next, offset + page.chars().count(), "{note}");
            if let Some((count, _)) = note.split_once(" characters written here were not kept") {
                lost += count.replace(',', "").parse::<u64>().unwrap();
                pieces.push(String::new());
            }
            offset = next;
        } else {
            let page = match body.rsplit_once("\n[end of the kept text: the ") {
                Some((page, note)) => {
                    lost += note.split(' ').next().unwrap().replace(',', "").parse::<u64>().unwrap();
                    page
                }
                None => body,
            };
            pieces.last_mut().unwrap().push_str(page);
            return (pieces, lost);
        }
    }
}

/// Checks the cut text after `marker` in `output`: its note leads to the rest, and the start and
/// the rest are the text the image holds in CL-USER::*CUT-EXPECTED*.
async fn check_cut(toolbox: &Arc<Toolbox>, what: &str, output: &ToolOutput, marker: &str) {
    check_cut_against(toolbox, what, output, marker, "cl-user::*cut-expected*").await
}

/// As [`check_cut`], against the text the image holds in `variable`.
async fn check_cut_against(toolbox: &Arc<Toolbox>, what: &str, output: &ToolOutput, marker: &str, variable: &str) {
    let (start, handle, offset) = cut_start(&output.text, marker);
    let (pieces, lost) = read_to_end(toolbox, &handle, offset).await;
    assert_eq!((pieces.len(), lost), (1, 0), "{what}: all of it is kept");
    let whole = format!("{start}{}", pieces[0]);
    let same = eval_ok(toolbox, &format!("(string= {variable} {})", lisp_string(&whole))).await;
    assert_eq!(
        same,
        "=> T",
        "{what}: the start shown and the rest read are the whole text ({} characters)",
        whole.len()
    );
}

/// Checks a listing cut to its first lines, whose last line (starting with `marker`) names the
/// handle of every line: the names on the lines shown and on those read there are, sorted and
/// without their package, the lines of CL-USER::*CUT-EXPECTED*.
async fn check_listing(toolbox: &Arc<Toolbox>, what: &str, output: &ToolOutput, marker: &str) {
    assert!(!output.is_error, "{what}: {}", output.text);
    let note = output.text.lines().find(|line| line.starts_with(marker)).unwrap_or_else(|| panic!("{}", output.text));
    let (handle, offset) = note_target(note);
    let shown: Vec<&str> = output.text.lines().skip(1).take_while(|line| !line.starts_with(marker)).collect();
    let (pieces, lost) = read_to_end(toolbox, &handle, offset).await;
    assert_eq!((pieces.len(), lost), (1, 0), "{what}");
    let mut names: Vec<String> = shown
        .into_iter()
        .chain(pieces[0].lines())
        // Without the package: apropos qualifies names, xref writes them as seen from theirs.
        .map(|line| line.split_whitespace().next().unwrap().rsplit(':').next().unwrap().to_string())
        .collect();
    names.sort();
    let same = eval_ok(
        toolbox,
        &format!(
            "(string= (format nil \"~{{~A~^~%~}}\" (sort (uiop:split-string cl-user::*cut-expected* :separator '(#\\Newline)) #'string<)) {})",
            lisp_string(&names.join("\n"))
        ),
    )
    .await;
    assert_eq!(same, "=> T", "{what}: the lines shown and those read are every line\n{}", names.join("\n"));
}

/// Lisp that sets CL-USER::*CUT-EXPECTED* to `lines` lines about `what`.
fn expected_text(what: &str, lines: usize) -> String {
    format!(
        "(defparameter cl-user::*cut-expected* (with-output-to-string (s) (dotimes (i {lines}) \
         (format s \"~A line ~D of ~D~%\" {} i {lines}))))",
        lisp_string(what)
    )
}

#[tokio::test]
async fn every_cut_note_names_a_handle_whose_text_goes_on_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let image = common::private_image().await;
    let tb = toolbox(image.port, dir.path());

    // evaluate-lisp: stdout, stderr, a value, and the output of the agent's threads.
    eval_ok(&tb, &expected_text("stdout", 300)).await;
    let output = call(&tb, "evaluate-lisp", json!({"code": "(write-string cl-user::*cut-expected*) :done"})).await;
    assert!(output.text.ends_with("line 299 of 300\n\n=> :DONE"), "the end of a log is shown: {}", output.text);
    check_cut(&tb, "evaluate-lisp stdout", &output, "[stdout]\n").await;

    eval_ok(&tb, &expected_text("stderr", 300)).await;
    let output =
        call(&tb, "evaluate-lisp", json!({"code": "(write-string cl-user::*cut-expected* *error-output*) :done"}))
            .await;
    check_cut(&tb, "evaluate-lisp stderr", &output, "[stderr]\n").await;

    eval_ok(
        &tb,
        "(defparameter cl-user::*cut-value* (loop for i below 3000 collect (list i :item)))
         (defparameter cl-user::*cut-expected*
           (let ((*print-length* 5000) (*print-level* 10) (*print-circle* t) (*print-pretty* t) (*print-readably* nil))
             (prin1-to-string cl-user::*cut-value*)))",
    )
    .await;
    let output = call(&tb, "evaluate-lisp", json!({"code": "cl-user::*cut-value*", "print_length": 5000})).await;
    check_cut(&tb, "evaluate-lisp value", &output, "=> ").await;

    eval_ok(&tb, &expected_text("thread", 1500)).await;
    let output = call(
        &tb,
        "evaluate-lisp",
        json!({"code": "(sb-thread:join-thread (sb-thread:make-thread (lambda () (write-string cl-user::*cut-expected*) (finish-output)))) :done"}),
    )
    .await;
    check_cut(&tb, "evaluate-lisp background output", &output, "Output of your threads:\n").await;

    // evaluate-lisp's warnings past the 200 shown.
    eval_ok(
        &tb,
        "(defparameter cl-user::*cut-expected* (format nil \"~{WARNING: cut warning ~D~%~}\" (loop for i below 250 collect i)))",
    )
    .await;
    let output = call(&tb, "evaluate-lisp", json!({"code": "(dotimes (i 250) (warn \"cut warning ~D\" i))"})).await;
    check_listing_cut(
        &tb,
        &output.text,
        "[warnings]\n",
        "50 more warnings not shown: at most 200 per reply; inspect @",
    )
    .await;

    // evaluate-lisp's trace events past the 100 shown.
    eval_ok(
        &tb,
        "(defun cl-user::cut-traced (i) i)
         (defparameter cl-user::*cut-expected*
           (format nil \"~{0: (CUT-TRACED ~D)~%0: CUT-TRACED returned ~:*~D~%~}\" (loop for i below 150 collect i)))",
    )
    .await;
    let output = call(&tb, "trace", json!({"functions": ["cl-user::cut-traced"]})).await;
    assert!(!output.is_error, "{}", output.text);
    let output =
        call(&tb, "evaluate-lisp", json!({"code": "(dotimes (i 150) (cl-user::cut-traced i))", "package": "CL-USER"}))
            .await;
    check_listing_cut(
        &tb,
        &output.text,
        "[trace]\n",
        "200 more trace events not shown: at most 100 per reply; inspect @",
    )
    .await;
    call(&tb, "trace", json!({"untrace": true, "functions": ["cl-user::cut-traced"]})).await;

    // compile-form: what a macro prints while it is expanded.
    eval_ok(&tb, &expected_text("compile", 300)).await;
    // The compiler may expand a macro more than once: what it printed is recorded as it prints.
    eval_ok(
        &tb,
        "(defparameter cl-user::*cut-written* \"\")
         (defmacro cl-user::cut-noisy ()
           (write-string cl-user::*cut-expected*)
           (setf cl-user::*cut-written* (concatenate 'string cl-user::*cut-written* cl-user::*cut-expected*))
           nil)",
    )
    .await;
    let output = call(&tb, "compile-form", json!({"code": "(defun cl-user::cut-quiet () (cl-user::cut-noisy))"})).await;
    check_cut_against(&tb, "compile-form stdout", &output, "[stdout]\n", "cl-user::*cut-written*").await;

    // load-file and load-form: what loading prints.
    let file = dir.path().join("cut-demo.lisp");
    std::fs::write(
        &file,
        "(in-package :cl-user)\n(defun cut-demo-print () (write-string *cut-expected*) nil)\n(cut-demo-print)\n",
    )
    .unwrap();
    eval_ok(&tb, &expected_text("load-file", 300)).await;
    let output = call(&tb, "load-file", json!({"file_path": file.to_str().unwrap()})).await;
    check_cut(&tb, "load-file stdout", &output, "[stdout]\n").await;
    // load-file's compiler conditions past the 100 shown.
    let noisy = dir.path().join("cut-conditions.lisp");
    let source: String =
        (0..120).map(|i| format!("(defun cut-undefined-caller-{i} () (cut-undefined-{i}))\n")).collect();
    std::fs::write(&noisy, format!("(in-package :cl-user)\n{source}")).unwrap();
    let output = call(&tb, "load-file", json!({"file_path": noisy.to_str().unwrap()})).await;
    let note = output
        .text
        .lines()
        .find(|line| line.starts_with("[... 20 more compiler"))
        .unwrap_or_else(|| panic!("{}", output.text));
    let (handle, offset) = note_target(note);
    let (pieces, lost) = read_to_end(&tb, &handle, offset).await;
    assert_eq!((pieces.len(), lost), (1, 0));
    // Each undefined function is named once, on a line shown or on a line read.
    let numbers = |text: &str| -> Vec<u32> {
        text.split("::CUT-UNDEFINED-")
            .skip(1)
            .map(|after| after[..after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len())].parse().unwrap())
            .collect()
    };
    let rest = numbers(&pieces[0]);
    assert_eq!(rest.len(), 20, "{}", pieces[0]);
    let mut all = numbers(&output.text);
    all.extend(rest);
    all.sort();
    assert_eq!(all, (0..120).collect::<Vec<u32>>(), "{}", output.text);

    let form_file = dir.path().join("cut-form.lisp");
    std::fs::write(&form_file, "(in-package :cl-user)\n(defvar *cut-form-printed* (write-string *cut-expected*))\n")
        .unwrap();
    eval_ok(&tb, &expected_text("load-form", 300)).await;
    let output = call(
        &tb,
        "load-form",
        json!({"file_path": form_file.to_str().unwrap(), "form_type": "defvar", "form_name": "*cut-form-printed*"}),
    )
    .await;
    check_cut(&tb, "load-form stdout", &output, "[stdout]\n").await;

    // load-system and run-tests: what the system's loading and its test-op print.
    std::fs::write(
        dir.path().join("cut-demo.asd"),
        "(asdf:defsystem \"cut-demo\" :components ((:file \"cut-demo\"))
           :perform (asdf:test-op (o c) (write-string (symbol-value (uiop:find-symbol* :*cut-expected* :cl-user)))))\n",
    )
    .unwrap();
    eval_ok(
        &tb,
        &format!("(require :asdf) (asdf:load-asd {})", lisp_string(dir.path().join("cut-demo.asd").to_str().unwrap())),
    )
    .await;
    eval_ok(&tb, &expected_text("load-system", 300)).await;
    let output = call(&tb, "load-system", json!({"system": "cut-demo", "force": true})).await;
    check_cut(&tb, "load-system stdout", &output, "[stdout]\n").await;
    // load-system's warnings past the 50 shown.
    std::fs::write(
        dir.path().join("cut-warn.asd"),
        "(asdf:defsystem \"cut-warn\" :components ((:file \"cut-warn\")))\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("cut-warn.lisp"),
        "(eval-when (:compile-toplevel) (dotimes (i 60) (warn \"cut load warning ~D\" i)))\n",
    )
    .unwrap();
    eval_ok(&tb, &format!("(asdf:load-asd {})", lisp_string(dir.path().join("cut-warn.asd").to_str().unwrap()))).await;
    let output = call(&tb, "load-system", json!({"system": "cut-warn"})).await;
    let note = output.text.lines().find(|line| line.starts_with("[... ")).unwrap_or_else(|| panic!("{}", output.text));
    assert!(note.starts_with("[... 10 more warnings not shown: at most 50 per reply; inspect @"), "{note}");
    let (handle, offset) = note_target(note);
    let (pieces, lost) = read_to_end(&tb, &handle, offset).await;
    assert_eq!((pieces.len(), lost), (1, 0));
    let rest: Vec<&str> = pieces[0].lines().filter(|line| line.starts_with("WARNING: ")).collect();
    assert_eq!(rest.len(), 10, "{}", pieces[0]);
    for (i, line) in rest.iter().enumerate() {
        assert!(line.starts_with(&format!("WARNING: cut load warning {}", 50 + i)), "{line}");
    }

    // run-tests shows the last lines of a run whose results no framework gave, and names the
    // handle of all it printed.
    eval_ok(&tb, &expected_text("run-tests", 300)).await;
    let output = call(&tb, "run-tests", json!({"system": "cut-demo"})).await;
    assert!(output.text.contains("line 299 of 300"), "the end of the test run's output is shown: {}", output.text);
    let named =
        output.text.lines().find(|line| line.starts_with("Output: ")).unwrap_or_else(|| panic!("{}", output.text));
    let handle = named.split("inspect ").nth(1).and_then(|rest| rest.split(' ').next()).unwrap();
    let (pieces, lost) = read_to_end(&tb, handle, 0).await;
    assert_eq!((pieces.len(), lost), (1, 0));
    let same = eval_ok(&tb, &format!("(string= cl-user::*cut-expected* {})", lisp_string(&pieces[0]))).await;
    assert_eq!(same, "=> T", "the handle holds all the test run printed");

    // profile: what the profiled code prints.
    eval_ok(&tb, &expected_text("profile", 300)).await;
    let output = call(&tb, "profile", json!({"code": "(write-string cl-user::*cut-expected*)", "mode": "time"})).await;
    check_cut(&tb, "profile stdout", &output, "[stdout]\n").await;

    // macroexpand-form: a long expansion.
    eval_ok(
        &tb,
        "(defmacro cl-user::cut-long () `(progn ,@(loop for i below 300 collect `(print ,i))))
         (defparameter cl-user::*cut-expected*
           (let ((*print-case* :downcase) (*print-pretty* t) (*print-circle* nil) (*print-readably* nil)
                 (*print-length* nil) (*print-level* nil) (*print-lines* nil) (*print-right-margin* nil)
                 (*package* (find-package :cl-user)))
             (prin1-to-string (macroexpand-1 '(cl-user::cut-long)))))",
    )
    .await;
    let output = call(&tb, "macroexpand-form", json!({"form": "(cl-user::cut-long)", "package": "CL-USER"})).await;
    check_cut(&tb, "macroexpand-form expansion", &output, ":\n\n").await;

    // The debugger: the output so far when an evaluation stops, and eval_in_frame's.
    eval_ok(&tb, &expected_text("debugger", 300)).await;
    let output = call(
        &tb,
        "evaluate-lisp",
        json!({"code": "(write-string cl-user::*cut-expected*) (error \"stop here\")", "debug": true}),
    )
    .await;
    check_cut(&tb, "debugger stdout so far", &output, "[stdout]\n").await;
    let session = output.structured_value().unwrap()["debugger_session"].as_str().unwrap().to_string();
    eval_ok(&tb, &expected_text("eval_in_frame", 300)).await;
    let output = call(
        &tb,
        "debugger",
        json!({"session": session, "action": "eval_in_frame", "frame": 0, "code": "(write-string cl-user::*cut-expected*) 1"}),
    )
    .await;
    check_cut(&tb, "eval_in_frame stdout", &output, "[stdout]\n").await;
    call(&tb, "debugger", json!({"session": session, "action": "abort"})).await;

    // apropos-search and xref: the listing's lines past those shown.
    eval_ok(
        &tb,
        "(defun cl-user::cut-target () 1)
         (dotimes (i 130)
           (eval `(defun ,(intern (format nil \"CUT-CALLER-~D\" i) :cl-user) () (cl-user::cut-target))))
         (defparameter cl-user::*cut-expected*
           (format nil \"~{CUT-CALLER-~D~^~%~}\" (loop for i below 130 collect i)))",
    )
    .await;
    let output = call(&tb, "apropos-search", json!({"query": "cut-caller-"})).await;
    check_listing(&tb, "apropos-search", &output, "  ... and 80 more: ").await;
    let output = call(&tb, "xref", json!({"symbol": "cl-user::cut-target", "kind": "calls"})).await;
    check_listing(&tb, "xref", &output, "  ... and 30 more: ").await;

    // A frame's local whose printed value is cut.
    eval_ok(
        &tb,
        "(defun cl-user::cut-frame (big) (declare (optimize (debug 3))) (error \"stop ~D\" (length big)) big)
         (defparameter cl-user::*cut-value* (make-list 400 :initial-element 'cl-user::abcdef))
         (defparameter cl-user::*cut-expected*
           (let ((*print-length* 200) (*print-level* 10) (*print-circle* t) (*print-pretty* t) (*print-readably* nil))
             (prin1-to-string cl-user::*cut-value*)))",
    )
    .await;
    let output =
        call(&tb, "evaluate-lisp", json!({"code": "(cl-user::cut-frame cl-user::*cut-value*)", "debug": true})).await;
    let session = output.structured_value().unwrap()["debugger_session"].as_str().unwrap().to_string();
    let frame = output.structured_value().unwrap()["frames"]
        .as_array()
        .unwrap()
        .iter()
        .find(|frame| frame["call"].as_str().unwrap().starts_with("(CUT-FRAME "))
        .unwrap_or_else(|| panic!("no CUT-FRAME frame in {}", output.text))["frame"]
        .clone();
    let output = call(&tb, "debugger", json!({"session": session, "action": "frame", "frame": frame})).await;
    let local =
        &output.text[output.text.find("\nBIG = ").unwrap_or_else(|| panic!("{}", output.text)) + "\nBIG = ".len()..];
    let (start, note) = local.split_once(" ... [").unwrap_or_else(|| panic!("{local}"));
    let note = note.split_once(']').unwrap().0;
    let (handle, offset) = note_target(note);
    assert_eq!(start.chars().count(), offset, "{local}");
    let (pieces, lost) = read_to_end(&tb, &handle, offset).await;
    assert_eq!((pieces.len(), lost), (1, 0));
    let same =
        eval_ok(&tb, &format!("(string= cl-user::*cut-expected* {})", lisp_string(&format!("{start}{}", pieces[0]))))
            .await;
    assert_eq!(same, "=> T", "a local's printed value, read to its end");
    call(&tb, "debugger", json!({"session": session, "action": "abort"})).await;
    drop(image);
}
