//! The debugger for agents against real SBCL + swank: restarts shown on every error, evaluations
//! stopped in the debugger with `debug: true`, and the debugger tool's actions on them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use swank_mcp::source::AllowedRoots;
use swank_mcp::tools::{ToolOutput, Toolbox};

use common::{call, eval_ok};

/// Evaluates `code` with `debug: true` and returns the reply, which must be a stop.
async fn stop(toolbox: &Arc<Toolbox>, code: &str) -> (String, ToolOutput) {
    let output = call(toolbox, "evaluate-lisp", json!({"code": code, "debug": true})).await;
    assert!(output.text.starts_with("[DEBUGGER D"), "{code}: {}", output.text);
    assert!(output.is_error);
    let session = output.structured_value().unwrap()["debugger_session"].as_str().unwrap().to_string();
    (session, output)
}

async fn debugger(toolbox: &Arc<Toolbox>, arguments: Value) -> ToolOutput {
    call(toolbox, "debugger", arguments).await
}

/// The number of the first frame whose call starts with `call`, as the stop report lists it.
fn frame_of(output: &ToolOutput, call: &str) -> u64 {
    let frames = output.structured_value().unwrap()["frames"].clone();
    frames
        .as_array()
        .unwrap()
        .iter()
        .find(|frame| frame["call"].as_str().unwrap().starts_with(call))
        .unwrap_or_else(|| panic!("no frame {call} in {}", output.text))["frame"]
        .as_u64()
        .unwrap()
}

async fn thread_count(toolbox: &Arc<Toolbox>) -> usize {
    eval_ok(toolbox, "(length (sb-thread:list-all-threads))").await.trim_start_matches("=> ").parse().unwrap()
}

/// Waits until the image's thread count is `expected` (swank's worker threads take a moment to
/// finish after they answer).
async fn settle_thread_count(toolbox: &Arc<Toolbox>, expected: usize) {
    let mut last = 0;
    for _ in 0..50 {
        last = thread_count(toolbox).await;
        if last == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the image has {last} threads, not {expected}");
}

const RESTART_CASE: &str = "(restart-case (error \"disk full on /dev/sda\")
  (retry-write () :report \"Retry the write\" :retried)
  (use-another-disk (disk) :report \"Use another disk\" (list :wrote-to disk)))";

#[tokio::test]
async fn restarts_are_listed_when_the_evaluation_is_unwound() {
    let toolbox = common::toolbox(common::shared_image_port());
    let output = call(&toolbox, "evaluate-lisp", json!({"code": RESTART_CASE})).await;
    assert!(output.is_error);
    assert!(
        output.text.contains(
            "[Restarts]\n0: [RETRY-WRITE] Retry the write\n1: [USE-ANOTHER-DISK] Use another disk\n(Not taken: the evaluation was unwound. To choose one, evaluate with debug: true.)"
        ),
        "{}",
        output.text
    );
    let restarts = &output.structured_value().unwrap()["error"]["restarts"];
    assert_eq!(restarts[0], json!({"name": "RETRY-WRITE", "description": "Retry the write"}));
}

#[tokio::test]
async fn a_restart_invoked_with_an_argument_resumes_the_evaluation() {
    let toolbox = common::toolbox(common::shared_image_port());
    let (session, output) = stop(&toolbox, &format!("(progn (princ \"saving\") {RESTART_CASE})")).await;
    assert!(output.text.contains("disk full on /dev/sda"), "{}", output.text);
    assert!(output.text.contains("\n\n[Restarts]\n0: [RETRY-WRITE] Retry the write\n1: [USE-ANOTHER-DISK]"));
    assert!(output.text.contains("\n\n[stdout]\nsaving"), "{}", output.text);
    let resumed = debugger(
        &toolbox,
        json!({"session": session, "action": "invoke_restart", "restart": "use-another-disk", "arguments": ["\"/dev/sdb\""]}),
    )
    .await;
    assert!(!resumed.is_error, "{}", resumed.text);
    // The value ends with its handle for inspect.
    assert!(resumed.text.starts_with("[stdout]\nsaving\n\n=> (:WROTE-TO \"/dev/sdb\") @"), "{}", resumed.text);
    let gone = debugger(&toolbox, json!({"session": session, "action": "backtrace"})).await;
    assert!(gone.text.starts_with(&format!("There is no debugger session {session}")), "{}", gone.text);
}

#[tokio::test]
async fn use_value_on_an_undefined_function_after_defining_it() {
    let toolbox = common::toolbox(common::shared_image_port());
    let (session, output) = stop(&toolbox, "(+ 1 (debugger-test-missing 2))").await;
    assert!(output.text.contains("[DEBUGGER D") && output.text.contains("UNDEFINED-FUNCTION"), "{}", output.text);
    assert!(output.text.contains("[USE-VALUE]"), "{}", output.text);
    eval_ok(&toolbox, "(defun debugger-test-missing (x) (* x 10))").await;
    let resumed = debugger(
        &toolbox,
        json!({"session": session, "action": "invoke_restart", "restart": "USE-VALUE", "arguments": ["#'debugger-test-missing"]}),
    )
    .await;
    assert_eq!(resumed.text, "=> 21");
}

#[tokio::test]
async fn a_frame_shows_its_locals_and_code_evaluated_in_it_sees_them() {
    let toolbox = common::toolbox(common::shared_image_port());
    eval_ok(
        &toolbox,
        "(defun debugger-test-scale (x) (declare (optimize (debug 2))) (let ((y (* x 2))) (error \"boom ~a\" y) y))",
    )
    .await;
    let (session, output) = stop(&toolbox, "(debugger-test-scale 21)").await;
    let frame = frame_of(&output, "(DEBUGGER-TEST-SCALE 21)");
    let facts = debugger(&toolbox, json!({"session": session, "action": "frame", "frame": frame})).await;
    assert!(!facts.is_error, "{}", facts.text);
    assert!(facts.text.starts_with(&format!("[Frame {frame}] (DEBUGGER-TEST-SCALE 21)")), "{}", facts.text);
    assert!(facts.text.contains("\nSource: no file (evaluated, not loaded from a file)\n"), "{}", facts.text);
    assert!(facts.text.contains("\n[Locals]\nX = 21"), "{}", facts.text);
    let value = debugger(
        &toolbox,
        json!({"session": session, "action": "eval_in_frame", "frame": frame, "code": "(princ :hi) (* x 3)"}),
    )
    .await;
    assert_eq!(value.text, format!("[stdout]\nHI\n\n=> 63\n\n(Session {session} still waits in the debugger.)"));
    let nested = debugger(
        &toolbox,
        json!({"session": session, "action": "eval_in_frame", "frame": frame, "code": "(error \"inner\")"}),
    )
    .await;
    assert!(nested.is_error && nested.text.starts_with("[ERROR] SIMPLE-ERROR\ninner"), "{}", nested.text);
    let still = debugger(&toolbox, json!({"session": session, "action": "backtrace", "start": 0, "end": 3})).await;
    assert!(
        still.text.starts_with(&format!("[DEBUGGER {session}] SIMPLE-ERROR\n\n[Backtrace]\n0: ")),
        "{}",
        still.text
    );
    let aborted = debugger(&toolbox, json!({"session": session, "action": "abort"})).await;
    assert!(aborted.text.starts_with("[ERROR] EVALUATION-ABORTED"), "{}", aborted.text);
}

#[tokio::test]
async fn return_from_frame_makes_the_outer_evaluation_return_the_value() {
    let toolbox = common::toolbox(common::shared_image_port());
    eval_ok(&toolbox, "(defun debugger-test-fails (x) (declare (optimize (debug 3))) (error \"failed on ~a\" x))")
        .await;
    let (session, output) = stop(&toolbox, "(+ 1 (debugger-test-fails 5))").await;
    let frame = frame_of(&output, "(DEBUGGER-TEST-FAILS 5)");
    let returned =
        debugger(&toolbox, json!({"session": session, "action": "return_from_frame", "frame": frame, "code": "41"}))
            .await;
    assert_eq!(returned.text, "=> 42");
}

#[tokio::test]
async fn restart_frame_calls_the_redefined_function_again() {
    let toolbox = common::toolbox(common::shared_image_port());
    eval_ok(&toolbox, "(defun debugger-test-flaky (n) (declare (optimize (debug 3))) (error \"not fixed: ~a\" n))")
        .await;
    let (session, output) = stop(&toolbox, "(list (debugger-test-flaky 7))").await;
    let frame = frame_of(&output, "(DEBUGGER-TEST-FLAKY 7)");
    eval_ok(&toolbox, "(defun debugger-test-flaky (n) (* n 6))").await;
    let restarted = debugger(&toolbox, json!({"session": session, "action": "restart_frame", "frame": frame})).await;
    assert!(restarted.text.starts_with("=> (42) @"), "{}", restarted.text);
}

#[tokio::test]
async fn a_second_error_after_a_restart_is_a_new_session() {
    let toolbox = common::toolbox(common::shared_image_port());
    let (first, _) =
        stop(&toolbox, "(progn (restart-case (error \"first\") (continue () :report \"Go on\")) (error \"second\"))")
            .await;
    let again = debugger(&toolbox, json!({"session": first, "action": "invoke_restart", "restart": 0})).await;
    assert!(again.text.starts_with("[DEBUGGER D") && again.text.contains("\nsecond"), "{}", again.text);
    let second = again.structured_value().unwrap()["debugger_session"].as_str().unwrap().to_string();
    assert_ne!(first, second);
    let listed = call(&toolbox, "lisp-status", json!({})).await;
    assert!(listed.text.contains(&format!("Debugger session {second}: thread ")), "{}", listed.text);
    assert!(listed.text.contains("SIMPLE-ERROR: second, waiting"), "{}", listed.text);
    debugger(&toolbox, json!({"session": second, "action": "abort"})).await;
}

#[tokio::test]
async fn abort_and_the_timeout_leave_no_thread_behind() {
    let image = common::private_image().await;
    let settings = swank_mcp::tools::Settings { debug_timeout: Duration::from_secs(2), ..common::settings() };
    let toolbox = Arc::new(Toolbox::new(
        settings,
        vec![common::image_settings(image.port)],
        AllowedRoots::new(Vec::new()).unwrap(),
    ));
    let before = thread_count(&toolbox).await;
    let (session, _) = stop(&toolbox, "(error \"left alone\")").await;
    let aborted = debugger(&toolbox, json!({"session": session, "action": "abort"})).await;
    assert!(aborted.text.starts_with("[ERROR] EVALUATION-ABORTED"), "{}", aborted.text);
    settle_thread_count(&toolbox, before).await;

    let (session, output) = stop(&toolbox, "(error \"forgotten\")").await;
    assert!(output.text.contains("it is aborted if nothing is done within 2s"), "{}", output.text);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let gone = debugger(&toolbox, json!({"session": session, "action": "backtrace"})).await;
    assert!(gone.text.starts_with(&format!("There is no debugger session {session}")), "{}", gone.text);
    settle_thread_count(&toolbox, before).await;
}

/// docs/tools.md's worked example: an error with restarts, the function fixed, the write retried.
#[tokio::test]
async fn the_readme_example_retries_after_the_fix() {
    let toolbox = common::toolbox(common::shared_image_port());
    eval_ok(
        &toolbox,
        "(defpackage :debugger-readme (:use :cl)) (in-package :debugger-readme)
         (defun write-block (n disk)
           (restart-case (error \"disk full on ~a\" disk)
             (retry-write () :report \"Retry the write\" (write-block n disk))
             (use-another-disk (other) :report \"Use another disk\" (write-block n other))))
         (defun save-report (n) (write-block n \"/dev/sda\") :saved)",
    )
    .await;
    let (session, output) = stop(&toolbox, "(save-report 3)").await;
    let expected = format!(
        "[DEBUGGER {session}] SIMPLE-ERROR\ndisk full on /dev/sda\n\n[Restarts]\n0: [RETRY-WRITE] Retry the write\n\
         1: [USE-ANOTHER-DISK] Use another disk\n\n[Backtrace]\n0: (WRITE-BLOCK 3 \"/dev/sda\")\n1: (SAVE-REPORT 3)\n\n\
         The evaluation waits in the debugger as session {session}; it is aborted if nothing is done within 10m. Act \
         on it with the debugger tool, e.g. {{\"session\": \"{session}\", \"action\": \"invoke_restart\", \"restart\": 0}}."
    );
    assert_eq!(output.text, expected);
    eval_ok(&toolbox, "(defun write-block (n disk) (declare (ignore disk)) n)").await;
    let retried =
        debugger(&toolbox, json!({"session": session, "action": "invoke_restart", "restart": "retry-write"})).await;
    assert_eq!(retried.text, "=> :SAVED");
    eval_ok(&toolbox, "(in-package :cl-user)").await;
}

/// The backtrace names where the error happened: the implementation's frame that signalled when a
/// tail call left no frame of the user's function that called it, and a runaway recursion's
/// frames folded rather than nothing.
#[tokio::test]
async fn the_backtrace_names_where_the_error_happened() {
    let toolbox = common::toolbox(common::shared_image_port());
    eval_ok(
        &toolbox,
        "(defun debugger-test-inner (x) (/ 10 x)) (defun debugger-test-outer (x) (1+ (debugger-test-inner x)))",
    )
    .await;
    let output = call(&toolbox, "evaluate-lisp", json!({"code": "(debugger-test-outer 0)"})).await;
    assert!(
        output.text.contains("[Backtrace]\n0: (SB-KERNEL::INTEGER-/-INTEGER 10 0)\n1: (DEBUGGER-TEST-OUTER 0)"),
        "{}",
        output.text
    );
    eval_ok(&toolbox, "(defun debugger-test-fact (n) (if (= n 0) 1 (* n (debugger-test-fact (1- n)))))").await;
    let output = call(&toolbox, "evaluate-lisp", json!({"code": "(debugger-test-fact 10000000)"})).await;
    assert!(output.text.starts_with("[ERROR] STORAGE-CONDITION"), "{}", output.text);
    let folded =
        output.text.split("[Backtrace]\n0: DEBUGGER-TEST-FACT x ").nth(1).unwrap_or_else(|| panic!("{}", output.text));
    let count: u64 = folded.split_whitespace().next().unwrap().replace(',', "").parse().unwrap();
    assert!(count > 1000, "{}", output.text);
}

/// An error the compiler finds in a form is flagged among the warnings, as an ERROR.
#[tokio::test]
async fn compile_time_errors_are_flagged() {
    let toolbox = common::toolbox(common::shared_image_port());
    let output =
        call(&toolbox, "evaluate-lisp", json!({"code": "(defun debugger-test-bad () (return-from nope 1))"})).await;
    assert!(output.text.contains("[warnings]\nERROR: return for unknown block: NOPE\n"), "{}", output.text);
    assert_eq!(output.text.matches("ERROR: return for unknown block").count(), 1, "{}", output.text);
}

/// An agent cannot end an image swank-mcp did not start, whichever way it asks.
#[tokio::test]
async fn exits_are_refused_in_the_users_image() {
    let toolbox = common::toolbox(common::shared_image_port());
    for code in ["(sb-ext:exit :code 3)", "(sb-ext:quit)", "(require :asdf) (uiop:quit 3)"] {
        let output = call(&toolbox, "evaluate-lisp", json!({ "code": code })).await;
        assert!(
            output.text.starts_with("[ERROR] MCP-AGENT-HELPER::EXIT-REFUSED\n(SB-EXT:EXIT"),
            "{code}: {}",
            output.text
        );
        assert!(output.text.contains("--allow-exit"), "{}", output.text);
    }
    assert_eq!(eval_ok(&toolbox, "(+ 1 2)").await, "=> 3");
}

/// Code evaluated in a frame is read in the frame's package, as SLIME reads it, and the locals are
/// named as seen from there; its warnings are in its own reply, not in the resumed evaluation's.
#[tokio::test]
async fn code_in_a_frame_is_read_in_its_package_and_keeps_its_warnings() {
    let toolbox = common::toolbox(common::shared_image_port());
    eval_ok(&toolbox, "(defpackage :debugger-test-inventory (:use :cl))").await;
    let defined = call(
        &toolbox,
        "evaluate-lisp",
        json!({"package": "debugger-test-inventory", "code": "(defun tally (table)
           (declare (optimize (debug 2)))
           (restart-case (error \"no stock in ~a\" table)
             (go-on () :report \"Go on\" :resumed)))"}),
    )
    .await;
    assert!(!defined.is_error, "{}", defined.text);
    let (session, output) = stop(&toolbox, "(debugger-test-inventory::tally (list :apples 3))").await;
    let frame = frame_of(&output, "(DEBUGGER-TEST-INVENTORY::TALLY");
    let facts = debugger(&toolbox, json!({"session": session, "action": "frame", "frame": frame})).await;
    assert!(facts.text.contains("\n[Locals]\nTABLE = (:APPLES 3)"), "{}", facts.text);
    let value = debugger(
        &toolbox,
        json!({"session": session, "action": "eval_in_frame", "frame": frame,
               "code": "(warn \"looked at ~a\" (first table)) (second table)"}),
    )
    .await;
    assert_eq!(
        value.text,
        format!("[warnings]\nWARNING: looked at APPLES\n\n=> 3\n\n(Session {session} still waits in the debugger.)")
    );
    let resumed = debugger(&toolbox, json!({"session": session, "action": "invoke_restart", "restart": "go-on"})).await;
    assert_eq!(resumed.text, "=> :RESUMED");
}

/// An error with no restart of the code's own: asking for one says there are none and what to do
/// instead, not "The restarts are:" followed by nothing.
#[tokio::test]
async fn a_missing_restart_when_there_are_none_says_so() {
    let toolbox = common::toolbox(common::shared_image_port());
    let (session, output) = stop(&toolbox, "(error \"no way on\")").await;
    assert!(!output.text.contains("[Restarts]"), "{}", output.text);
    let missing = debugger(&toolbox, json!({"session": session, "action": "invoke_restart", "restart": "retry"})).await;
    assert!(missing.is_error);
    assert!(missing.text.starts_with("There is no restart retry: this evaluation offers none"), "{}", missing.text);
    assert!(missing.text.contains("end the evaluation with the abort action"), "{}", missing.text);
    assert!(!missing.text.contains("The restarts are:"), "{}", missing.text);
    let aborted = debugger(&toolbox, json!({"session": session, "action": "abort"})).await;
    assert!(aborted.text.starts_with("[ERROR] EVALUATION-ABORTED"), "{}", aborted.text);
}

/// Code evaluated at top level has no function of its own: the frame that runs its form is the
/// evaluation's frame 0, so that the frame actions work on an error signalled there.
#[tokio::test]
async fn an_error_at_top_level_has_the_forms_frame() {
    let toolbox = common::toolbox(common::shared_image_port());
    let (session, output) = stop(&toolbox, "(let ((x 5)) (error \"top ~a\" x))").await;
    assert!(output.text.contains("[Backtrace]\n0: ((LAMBDA NIL))"), "{}", output.text);
    let frame = debugger(&toolbox, json!({"session": session, "action": "frame", "frame": 0})).await;
    assert!(!frame.is_error && frame.text.contains("(ERROR \"top ~a\" X)"), "{}", frame.text);
    let value =
        debugger(&toolbox, json!({"session": session, "action": "eval_in_frame", "frame": 0, "code": "(+ 1 2)"})).await;
    assert!(value.text.starts_with("=> 3"), "{}", value.text);
    debugger(&toolbox, json!({"session": session, "action": "abort"})).await;
}

/// The debugger's frames are the evaluation's: a frame number past them (the evaluator's,
/// swank-mcp's, the server's) is refused with the last one named, for looking and for acting;
/// a frame's source is its form, not the text after it in the file.
#[tokio::test]
async fn frames_past_the_evaluations_are_refused_and_a_frames_source_is_its_form() {
    let toolbox = common::toolbox(common::shared_image_port());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("frames.lisp");
    std::fs::write(
        &file,
        "(defun debugger-test-deep (x)\n  (declare (optimize (debug 2)))\n  (let ((y (* x 2)))\n    (error \"deep ~a\" y)\n    y))\n\n\
         (defun debugger-test-next (z)\n  (list z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z))\n",
    )
    .unwrap();
    eval_ok(&toolbox, &format!("(load (compile-file {:?}))", file.display().to_string())).await;
    let (session, output) = stop(&toolbox, "(debugger-test-deep 4)").await;
    let frame = frame_of(&output, "(DEBUGGER-TEST-DEEP 4)");
    let facts = debugger(&toolbox, json!({"session": session, "action": "frame", "frame": frame})).await;
    assert!(facts.text.contains(":4:5\n(error \"deep ~a\" y)\n\n[Locals]\n"), "{}", facts.text);
    assert!(!facts.text.contains("debugger-test-next"), "{}", facts.text);
    for action in ["frame", "eval_in_frame", "restart_frame", "return_from_frame"] {
        let past =
            debugger(&toolbox, json!({"session": session, "action": action, "frame": frame + 3, "code": "1"})).await;
        assert!(past.is_error, "{action}: {}", past.text);
        assert!(
            past.text.starts_with(&format!(
                "Frame {} is not one of the evaluation's: its frames are {frame} (the last, {frame}, is the outermost call",
                frame + 3
            )),
            "{action}: {}",
            past.text
        );
        assert!(!past.text.contains("TRUENAME") && !past.text.contains("MCP-AGENT-HELPER"), "{}", past.text);
    }
    let beyond =
        debugger(&toolbox, json!({"session": session, "action": "backtrace", "start": frame + 1, "end": 40})).await;
    assert!(beyond.text.contains("[Backtrace]\n(no frames in that range)"), "{}", beyond.text);
    let aborted = debugger(&toolbox, json!({"session": session, "action": "abort"})).await;
    assert!(aborted.text.starts_with("[ERROR] EVALUATION-ABORTED"), "{}", aborted.text);
}

/// Issue 49: recompiled for stepping, a function is still found where it is, in a file that did
/// not change, and its frame's source is its own form, not the file's form of the same index
/// among those kept for the compilation.
#[tokio::test]
async fn a_function_recompiled_for_stepping_keeps_true_locations() {
    let toolbox = common::toolbox(common::shared_image_port());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prices.lisp");
    std::fs::write(
        &file,
        "(in-package :cl-user)\n(defvar *debugger-test-currency* :eur)\n\n\
         (defun debugger-test-price (x)\n  (let ((y (* x 2)))\n    (error \"price ~a\" y)\n    y))\n",
    )
    .unwrap();
    eval_ok(&toolbox, &format!("(load (compile-file {:?}))", file.display().to_string())).await;
    let recompiled = debugger(&toolbox, json!({"action": "recompile_debug", "function": "debugger-test-price"})).await;
    assert!(!recompiled.is_error, "{}", recompiled.text);
    let found = call(&toolbox, "find-definition", json!({"symbol": "debugger-test-price"})).await;
    assert!(found.text.contains(&format!("{}:4:1", file.display())), "{}", found.text);
    assert!(!found.text.contains("changed since"), "the file did not change: {}", found.text);
    let variable = call(&toolbox, "find-definition", json!({"symbol": "*debugger-test-currency*"})).await;
    assert!(variable.text.contains(&format!("{}:2:1", file.display())), "{}", variable.text);
    assert!(!variable.text.contains("changed since"), "the file did not change: {}", variable.text);
    let (session, output) = stop(&toolbox, "(debugger-test-price 4)").await;
    let frame = frame_of(&output, "(DEBUGGER-TEST-PRICE 4)");
    let facts = debugger(&toolbox, json!({"session": session, "action": "frame", "frame": frame})).await;
    assert!(facts.text.contains("(error \"price ~a\" y)"), "{}", facts.text);
    assert!(!facts.text.contains("defvar"), "{}", facts.text);
    debugger(&toolbox, json!({"session": session, "action": "abort"})).await;
}

/// A frame of a function whose file gained lines above it since it was compiled: swank read the
/// frame's place against the file as it is now and showed the form now there, another function,
/// with no word of the change (issue 49.7). The frame action shows the function's own form, where
/// it is now, and says the file changed since.
#[tokio::test]
async fn a_frame_of_a_function_whose_file_changed_shows_its_own_form_where_it_is_now() {
    let dir = tempfile::tempdir().unwrap();
    let toolbox = Arc::new(Toolbox::new(
        common::settings(),
        vec![common::image_settings(common::shared_image_port())],
        AllowedRoots::new(vec![dir.path().to_path_buf()]).unwrap(),
    ));
    let path = dir.path().join("framed.lisp");
    let text = "(defpackage :framed (:use :cl))\n(in-package :framed)\n\n(defun helper (x)\n  (* x 2))\n\n\
                (defun fails (x)\n  (declare (optimize (debug 2)))\n  (let ((y (helper x)))\n    (error \"boom ~a\" y)\n    y))\n";
    std::fs::write(&path, text).unwrap();
    eval_ok(&toolbox, &format!("(load (compile-file {:?}))", path.display().to_string())).await;
    // SBCL's dates count seconds: the edit must come in a later one to be seen as a change.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    std::fs::write(
        &path,
        text.replace("(defun helper", "(defun added ()\n  ;; two\n  ;; three\n  0)\n\n(defun helper"),
    )
    .unwrap();
    let (session, output) = stop(&toolbox, "(framed::fails 21)").await;
    let frame = frame_of(&output, "(FRAMED::FAILS 21)");
    let facts = debugger(&toolbox, json!({"session": session, "action": "frame", "frame": frame})).await;
    debugger(&toolbox, json!({"session": session, "action": "abort"})).await;
    assert!(!facts.text.contains("(defun helper"), "{}", facts.text);
    let file = path.canonicalize().unwrap().display().to_string();
    assert!(
        facts.text.contains(&format!(
            "\nSource: {file}:12:1 (the file changed since this was compiled; found in its current text)\n(defun fails (x)\n"
        )),
        "{}",
        facts.text
    );
}
