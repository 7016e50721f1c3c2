//! run-tests (with Debian's cl-fiveam), trace, profile, threads and the [background] section of
//! evaluate-lisp against a real SBCL + cl-swank image.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use common::{is_error, text, McpClient};
use swank_mcp::tools::{group_thousands, ToolOutput, Toolbox};

async fn call(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> ToolOutput {
    common::call_within(toolbox, tool, arguments, Duration::from_secs(300)).await
}

fn shared() -> Arc<Toolbox> {
    common::toolbox(common::shared_image_port())
}

const DEMO_ASD: &str = "(asdf:defsystem \"obs-demo\" :depends-on (\"fiveam\") :components ((:file \"obs-demo\")) \
    :perform (asdf:test-op (o c) (uiop:symbol-call :fiveam :run! (uiop:find-symbol* :demo-suite :obs-demo))))\n";

const DEMO_SOURCE: &str = "(defpackage :obs-demo (:use :cl :fiveam))
(in-package :obs-demo)
(def-suite demo-suite)
(in-suite demo-suite)
(defun add (a b) (+ a b 1))
(test adds-small (is (= 2 (* 1 2))))
(test adds-wrong (is (= 5 (add 2 3))))
(def-suite slow-suite)
(test (slow-check :suite slow-suite) (is (= 1 1)) (sleep 2.5) (is (= 2 2)))
";

async fn demo_system(toolbox: &Arc<Toolbox>, dir: &Path) {
    std::fs::write(dir.join("obs-demo.asd"), DEMO_ASD).unwrap();
    std::fs::write(dir.join("obs-demo.lisp"), DEMO_SOURCE).unwrap();
    common::eval_ok(
        toolbox,
        &format!("(require :asdf) (asdf:load-asd {:?})", dir.join("obs-demo.asd").display().to_string()),
    )
    .await;
}

#[tokio::test]
async fn a_fiveam_suite_reports_the_passing_and_the_failing_test() {
    let _asdf = common::shared_asdf_turn().await;
    let dir = tempfile::tempdir().unwrap();
    let tb = shared();
    demo_system(&tb, dir.path()).await;
    let output = call(&tb, "run-tests", json!({"system": "obs-demo", "suite": "obs-demo::demo-suite"})).await;
    assert!(!output.is_error, "failing tests are the run's answer, not the call's error: {}", output.text);
    assert!(output.text.starts_with("FAILED: ran FiveAM suite OBS-DEMO::DEMO-SUITE in "), "{}", output.text);
    assert!(output.text.contains("\nFiveAM: 2 tests (2 checks): 1 failed, 1 passed.\n"), "{}", output.text);
    // The failure, then the function it calls, whose file holds the tests too, as the suspect.
    assert!(
        output.text.ends_with(
            "\n\n[FAIL] OBS-DEMO::ADDS-WRONG\n  Form: (= 5 (ADD 2 3))\n  Expected: 5\n  Actual: 6\n\n[suspects] likeliest \
             first, from 1 failing and 1 passing test run again recording calls:\n1. OBS-DEMO::ADD obs-demo.lisp:5 (1 of 1 \
             failing, 0 passing)\n   called with (2 3), returned 6"
        ),
        "{}",
        output.text
    );
    assert!(!output.text.contains("ADDS-SMALL\n"), "only failures are listed: {}", output.text);
    // FiveAM's own progress report went behind a handle, not the image's terminal.
    let structured = output.structured_value().unwrap();
    let handle = structured["output"]["handle"].as_str().unwrap();
    let kept = call(&tb, "inspect", json!({"handle": handle})).await;
    assert!(kept.text.contains("Running test suite DEMO-SUITE"), "{}", kept.text);
    assert_eq!(structured["results"][0]["failing"][0]["failures"][0]["actual"], json!("6"));
    assert_eq!(structured["results"][0]["passed"], json!(1));

    // The system's own test-op: the FiveAM run inside it is recognised.
    let output = call(&tb, "run-tests", json!({"system": "obs-demo"})).await;
    assert!(output.text.starts_with("FAILED: ran asdf:test-system \"obs-demo\" in "), "{}", output.text);
    assert!(output.text.contains("1 failed, 1 passed."), "{}", output.text);
    assert!(output.text.contains("Expected: 5\n  Actual: 6"), "{}", output.text);

    let output = call(&tb, "run-tests", json!({"system": "obs-demo", "test": "obs-demo::adds-small"})).await;
    assert!(!output.is_error, "{}", output.text);
    assert!(output.text.contains("\nFiveAM: 1 test (1 check): passed."), "{}", output.text);

    let output = call(&tb, "run-tests", json!({"system": "obs-demo", "suite": "obs-demo::no-such-suite"})).await;
    assert!(output.is_error);
    assert!(output.text.contains("NO-SUCH-SUITE not found in package OBS-DEMO"), "{}", output.text);
    let output = call(&tb, "run-tests", json!({"system": "no-such-system-obs"})).await;
    assert!(output.text.starts_with("System \"no-such-system-obs\" was not found."), "{}", output.text);
}

#[tokio::test]
async fn traced_calls_appear_in_the_next_evaluation_until_untraced() {
    let tb = shared();
    common::eval_ok(&tb, "(defun obs-fib (n) (if (< n 2) n (+ (obs-fib (- n 1)) (obs-fib (- n 2)))))").await;
    let output = call(&tb, "trace", json!({"functions": ["obs-fib"]})).await;
    assert!(!output.is_error, "{}", output.text);
    assert!(output.text.starts_with("Tracing OBS-FIB."), "{}", output.text);
    let traced = common::eval_ok(&tb, "(obs-fib 2)").await;
    assert_eq!(
        traced,
        "[trace]\n0: (OBS-FIB 2)\n  1: (OBS-FIB 1)\n  1: OBS-FIB returned 1\n  1: (OBS-FIB 0)\n  1: OBS-FIB returned 0\n\
         0: OBS-FIB returned 1\n\n=> 1"
    );
    // Bounded: a deep recursion shows 100 events and counts the rest.
    let deep = common::eval_ok(&tb, "(obs-fib 12)").await;
    assert_eq!(deep.lines().filter(|line| line.contains("OBS-FIB")).count(), 100, "{deep}");
    assert!(deep.contains("more trace events not shown: at most 100 per reply; inspect @"), "{deep}");
    assert!(deep.contains(" were only counted (deeper than 8 levels, or past 10,000 per evaluation)]"), "{deep}");

    let output = call(&tb, "trace", json!({"untrace": true, "functions": ["obs-fib"]})).await;
    assert_eq!(output.text, "Untraced OBS-FIB.\nThis session traces nothing now.");
    assert_eq!(common::eval_ok(&tb, "(obs-fib 2)").await, "=> 1");

    // Methods by qualifiers and specializers; a method that does not exist is refused with the list.
    common::eval_ok(
        &tb,
        "(defgeneric obs-area (s)) (defmethod obs-area ((s integer)) (* s s)) \
         (defmethod obs-area :around ((s integer)) (1+ (call-next-method)))",
    )
    .await;
    let output = call(&tb, "trace", json!({"functions": ["(method obs-area :around (integer))"]})).await;
    assert!(!output.is_error, "{}", output.text);
    let traced = common::eval_ok(&tb, "(obs-area 3)").await;
    assert!(traced.starts_with("[trace]\n0: ((METHOD OBS-AREA :AROUND (INTEGER)) 3)\n"), "{traced}");
    let output = call(&tb, "trace", json!({"functions": ["(method obs-area (string))"]})).await;
    assert!(output.is_error);
    assert!(
        output.text.contains("OBS-AREA has no method \"(method obs-area (string))\". Its methods: "),
        "{}",
        output.text
    );
    let output = call(&tb, "trace", json!({"untrace": true, "functions": ["obs-area"]})).await;
    assert!(output.is_error);
    assert_eq!(output.text, "OBS-AREA is not traced by this session; it traces (METHOD OBS-AREA :AROUND (INTEGER)).");
    let output = call(&tb, "trace", json!({"untrace": true})).await;
    assert!(output.text.contains("Untraced (METHOD OBS-AREA :AROUND (INTEGER))"), "{}", output.text);
    assert_eq!(common::eval_ok(&tb, "(obs-area 3)").await, "=> 10");

    let output = call(&tb, "trace", json!({"functions": ["obs-no-such-function"]})).await;
    assert!(output.is_error);
    assert!(output.text.contains("OBS-NO-SUCH-FUNCTION not found"), "{}", output.text);
}

#[tokio::test]
async fn traces_end_with_the_session() {
    let port = common::shared_image_port();
    let tb = common::toolbox(port);
    common::eval_ok(&tb, "(defun obs-session-traced (x) x)").await;
    let mut client = McpClient::for_port(port).await;
    client.initialize().await;
    let reply = client.call_tool("trace", json!({"functions": ["obs-session-traced"]})).await;
    assert!(!is_error(&reply), "{}", text(&reply));
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(obs-session-traced 7)"})).await;
    assert!(text(&reply).starts_with("[trace]\n0: (OBS-SESSION-TRACED 7)"), "{}", text(&reply));
    assert_eq!(
        common::eval_ok(&tb, "(and (member 'obs-session-traced (trace)) t)").await,
        "=> T",
        "traced in the image while the session lasts"
    );
    client.close_stdin();
    let status = tokio::time::timeout(Duration::from_secs(30), client.child.wait()).await.unwrap().unwrap();
    assert!(status.success());
    assert_eq!(common::eval_ok(&tb, "(and (member 'obs-session-traced (trace)) t)").await, "=> NIL");
}

#[tokio::test]
async fn the_profile_of_a_slow_function_names_it_at_the_top() {
    let tb = shared();
    common::eval_ok(
        &tb,
        "(defun obs-slow-loop (n) (declare (fixnum n) (optimize speed (safety 0))) \
         (let ((s 0)) (declare (fixnum s)) (dotimes (i n s) (setf s (logand (+ s (* i 7)) #xffff)))))",
    )
    .await;
    let output = call(&tb, "profile", json!({"code": "(obs-slow-loop 400000000)"})).await;
    assert!(!output.is_error, "{}", output.text);
    let first_row = output.text.lines().skip_while(|line| !line.contains("Function")).nth(1).unwrap_or_default();
    assert!(first_row.ends_with("OBS-SLOW-LOOP"), "{}", output.text);
    assert!(!output.text.contains("MCP-AGENT-HELPER"), "{}", output.text);
    assert!(output.text.starts_with("Ran in "), "{}", output.text);
    let structured = output.structured_value().unwrap();
    assert!(structured["samples"].as_u64().unwrap() > 10, "{}", output.text);

    let output = call(&tb, "profile", json!({"code": "(obs-slow-loop 1000)", "mode": "time"})).await;
    assert!(output.text.contains("[time]\nEvaluation took:"), "{}", output.text);
    let output = call(&tb, "profile", json!({"code": "(obs-slow-loop 1000)", "mode": "fast"})).await;
    assert!(output.is_error);
    assert_eq!(output.text, "Unknown mode \"fast\": use one of cpu, alloc, time.");
}

#[tokio::test]
async fn a_thread_the_agent_started_is_listed_and_aborted() {
    let tb = shared();
    common::eval_ok(
        &tb,
        "(defvar *obs-lock* (sb-thread:make-mutex :name \"obs lock\")) \
         (sb-thread:make-thread (lambda () (loop (sleep 0.05))) :name \"obs-agent-sleeper\")",
    )
    .await;
    // Past its start, which SBCL spends in its own machinery: a thread just made may still wait
    // there for a lock (PCL's "GF lock"), which the list rightly says, and a backtrace there has
    // no frame of the code's own.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let list = call(&tb, "threads", json!({})).await;
    assert!(!list.is_error, "{}", list.text);
    let line = list.text.lines().find(|line| line.contains("\"obs-agent-sleeper\"")).unwrap_or_default();
    assert!(line.ends_with("\"obs-agent-sleeper\" (yours)"), "{}", list.text);
    assert!(list.text.contains("(this call)"), "{}", list.text);

    let backtrace = call(&tb, "threads", json!({"action": "backtrace", "thread": "obs-agent-sleeper"})).await;
    assert!(backtrace.text.contains("Backtrace:\n"), "{}", backtrace.text);
    assert!(backtrace.text.contains("SLEEP") || backtrace.text.contains("NANOSLEEP"), "{}", backtrace.text);

    let aborted = call(&tb, "threads", json!({"action": "abort", "thread": "obs-agent-sleeper"})).await;
    assert!(!aborted.is_error, "{}", aborted.text);
    assert!(aborted.text.ends_with("\"obs-agent-sleeper\" (ended, yours): it has ended."), "{}", aborted.text);
    let list = call(&tb, "threads", json!({})).await;
    assert!(!list.text.contains("\"obs-agent-sleeper\""), "{}", list.text);

    // A thread the user started is not the agent's to stop without force; a lock's waiter says who holds it.
    // The holder is made as the user's own code would make it, outside the agent's evaluations.
    common::eval_ok(
        &tb,
        "(defvar *obs-user-thread* \
           (let ((ready (sb-thread:make-semaphore)) (mcp-agent-helper::*agent-session* nil)) \
             (prog1 (sb-thread:make-thread (lambda () (sb-thread:with-mutex (*obs-lock*) (sb-thread:signal-semaphore ready) (sleep 600))) :name \"obs-holder\") \
               (sb-thread:wait-on-semaphore ready))))",
    )
    .await;
    let list = call(&tb, "threads", json!({})).await;
    let holder = list.text.lines().find(|line| line.contains("\"obs-holder\"")).unwrap_or_default().to_string();
    let number: u64 = holder.split_whitespace().next().unwrap().parse().unwrap();
    common::eval_ok(
        &tb,
        "(sb-thread:make-thread (lambda () (sb-thread:with-mutex (*obs-lock*))) :name \"obs-waiter\")",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let list = call(&tb, "threads", json!({})).await;
    assert!(
        list.text.contains("\"obs-waiter\" (yours, waits for the lock \"obs lock\", held by thread \"obs-holder\")"),
        "{}",
        list.text
    );
    let main_thread = list.text.lines().find(|line| line.contains("\"main thread\"")).unwrap_or_default().to_string();
    let main_number: u64 = main_thread.split_whitespace().next().unwrap().parse().unwrap();
    let refused = call(&tb, "threads", json!({"action": "abort", "thread": main_number})).await;
    assert!(refused.is_error);
    assert!(refused.text.contains("\"main thread\" was not started by this agent"), "{}", refused.text);
    let forced = call(&tb, "threads", json!({"action": "abort", "thread": number, "force": true})).await;
    assert!(forced.text.ends_with("it has ended."), "{}", forced.text);
}

#[tokio::test]
async fn an_agent_threads_error_and_output_appear_in_the_next_reply() {
    // A toolbox of its own: the background belongs to its session.
    let tb = shared();
    let first = common::eval_ok(
        &tb,
        "(sb-thread:join-thread (sb-thread:make-thread (lambda () (format t \"working~%\") (error \"obs thread failed: ~D\" 42)) \
          :name \"obs-failing\") :default :ended)",
    )
    .await;
    // The thread ended within this evaluation, so this very reply carries it.
    assert!(first.starts_with("[background]\nOutput of your threads:\nworking\n\nThread \"obs-failing\" stopped: [ERROR] SIMPLE-ERROR\nobs thread failed: 42"), "{first}");
    // Aborted rather than returned: JOIN-THREAD gives its default and says why.
    assert!(first.ends_with("=> :ENDED\n=> :ABORT"), "{first}");
    // Taken once.
    assert_eq!(common::eval_ok(&tb, "1").await, "=> 1");

    // Made by a thread the agent made: the agent's too.
    common::eval_ok(
        &tb,
        "(sb-thread:make-thread (lambda () (sb-thread:make-thread (lambda () (sleep 0.2) (princ \"later\") \
         (/ 1 (length \"\"))) :name \"obs-later\")))",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let next = common::eval_ok(&tb, "2").await;
    assert!(
        next.starts_with(
            "[background]\nOutput of your threads:\nlater\n\nThread \"obs-later\" stopped: [ERROR] DIVISION-BY-ZERO"
        ),
        "{next}"
    );
}

#[tokio::test]
async fn a_long_suite_sends_progress_notifications() {
    // An image of its own: FiveAM's run state is global, so two suites must not run at once in one image.
    let image = common::private_image().await;
    let port = image.port;
    let dir = tempfile::tempdir().unwrap();
    demo_system(&common::toolbox(port), dir.path()).await;
    let mut client = McpClient::for_port(port).await;
    client.initialize().await;
    let (reply, progress) = client
        .call_tool_with_progress(
            "run-tests",
            json!({"system": "obs-demo", "suite": "obs-demo::slow-suite"}),
            "slow-tests",
        )
        .await;
    assert!(!is_error(&reply), "{}", text(&reply));
    assert!(text(&reply).contains("\nFiveAM: 1 test (2 checks): passed."), "{}", text(&reply));
    assert!(!progress.is_empty(), "no progress before the result");
    assert_eq!(progress[0]["progressToken"], "slow-tests");
    let messages: Vec<&str> = progress.iter().filter_map(|update| update["message"].as_str()).collect();
    assert!(messages[0].starts_with("Testing obs-demo (1 s)"), "{messages:?}");
    // The suite sleeps 2.5 s after its first check: the counts show it meanwhile.
    assert!(
        messages.iter().any(|message| message.starts_with("Testing obs-demo (") && message.ends_with("s): 1 check done, 0 failed")),
        "{messages:?}"
    );
    drop(image);
}

#[tokio::test]
async fn an_interrupted_agent_thread_is_noted_and_goes_on() {
    let tb = shared();
    common::eval_ok(
        &tb,
        "(defvar *obs-ticks* 0) \
         (sb-thread:make-thread (lambda () (loop (incf *obs-ticks*) (sleep 0.05))) :name \"obs-ticker\")",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let interrupted = call(&tb, "threads", json!({"action": "interrupt", "thread": "obs-ticker"})).await;
    assert!(!interrupted.is_error, "{}", interrupted.text);
    assert!(
        interrupted.text.starts_with("Interrupted thread ") && interrupted.text.contains("Where it was:\nBacktrace:\n"),
        "{}",
        interrupted.text
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = common::eval_ok(&tb, "(let ((before *obs-ticks*)) (sleep 0.3) (> *obs-ticks* before))").await;
    assert!(
        next.starts_with(
            "[background]\nThread \"obs-ticker\" was interrupted and went on: [ERROR] \
             MCP-AGENT-HELPER::THREADS-TOOL-INTERRUPT\nInterrupted by the swank-mcp threads tool (action interrupt).\n\
             Backtrace:\n  (SB-UNIX:NANOSLEEP"
        ),
        "{next}"
    );
    assert!(next.ends_with("=> T"), "the thread goes on: {next}");
    let aborted = call(&tb, "threads", json!({"action": "abort", "thread": "obs-ticker"})).await;
    assert!(aborted.text.ends_with("it has ended."), "{}", aborted.text);
}

/// Parachute is not packaged in Debian: point `SWANK_MCP_PARACHUTE_DIR` at a directory holding
/// checkouts of parachute, documentation-utils, trivial-indent, form-fiddle and
/// trivial-custom-debugger, and run `cargo test --test observe_tools -- --ignored`.
#[tokio::test]
#[ignore = "needs Parachute and its dependencies in SWANK_MCP_PARACHUTE_DIR"]
async fn a_parachute_suite_reports_its_failures() {
    let deps = std::env::var("SWANK_MCP_PARACHUTE_DIR").expect("SWANK_MCP_PARACHUTE_DIR names the checkouts");
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("obs-para.asd"),
        "(asdf:defsystem \"obs-para\" :depends-on (\"parachute\") :components ((:file \"obs-para\")) \
         :perform (asdf:test-op (o c) (uiop:symbol-call :parachute :test :obs-para)))\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("obs-para.lisp"),
        "(defpackage :obs-para (:use :cl :parachute)) (in-package :obs-para)\n\
         (defun add (a b) (+ a b 1))\n(define-test adds-ok (is = 2 (* 1 2)))\n(define-test adds-bad (is = 5 (add 2 3)))\n",
    )
    .unwrap();
    common::eval_ok(
        &tb,
        &format!(
            "(require :asdf) (dolist (d (directory (concatenate 'string {:?} \"/*/\"))) (push d asdf:*central-registry*)) \
             (asdf:load-asd {:?})",
            deps,
            dir.path().join("obs-para.asd").display().to_string()
        ),
    )
    .await;
    let output = call(&tb, "run-tests", json!({"system": "obs-para"})).await;
    assert!(output.is_error, "{}", output.text);
    assert!(output.text.contains("\nParachute: 2 tests (2 checks): 1 failed, 1 passed.\n"), "{}", output.text);
    assert!(
        output.text.contains("[FAIL] OBS-PARA::ADDS-BAD\n  Form: (IS = 5 (ADD 2 3))\n  Expected: 5\n  Actual: 6"),
        "{}",
        output.text
    );
    let output = call(&tb, "run-tests", json!({"system": "obs-para", "test": "obs-para::adds-ok"})).await;
    assert!(!output.is_error, "{}", output.text);
    assert!(output.text.starts_with("PASSED: ran Parachute test OBS-PARA::ADDS-OK in "), "{}", output.text);
    drop(image);
}

/// A traced function that PRINT-OBJECT calls is traced while the value is printed: its trace
/// lines and the value are each printed on their own, with no #1= / #1# from the other's printing.
#[tokio::test]
async fn tracing_what_print_object_calls_leaves_both_prints_whole() {
    let tb = shared();
    common::eval_ok(
        &tb,
        "(defclass obs-item () ((name :initarg :name :reader obs-item-name) (qty :initarg :qty :reader obs-item-qty)))
         (defmethod print-object ((item obs-item) stream)
           (print-unreadable-object (item stream :type t)
             (format stream \"~a x~a\" (obs-item-name item) (obs-item-qty item))))",
    )
    .await;
    let output = call(&tb, "trace", json!({"functions": ["obs-item-qty"]})).await;
    assert!(!output.is_error, "{}", output.text);
    let traced = common::eval_ok(&tb, "(list (make-instance 'obs-item :name \"a\" :qty 2))").await;
    call(&tb, "trace", json!({"untrace": true, "functions": ["obs-item-qty"]})).await;
    assert!(!traced.contains("#1"), "{traced}");
    assert!(traced.contains("0: (OBS-ITEM-QTY #<OBS-ITEM a x2>)\n0: OBS-ITEM-QTY returned 2"), "{traced}");
    assert!(traced.contains("\n\n=> (#<OBS-ITEM a x2>) @"), "{traced}");
}

/// An allocation profile names the user's functions that allocate, not SBCL's allocation
/// trampoline on top of every sample.
#[tokio::test]
async fn an_allocation_profile_names_the_users_functions() {
    let tb = shared();
    common::eval_ok(
        &tb,
        "(defun obs-alloc-lists (n) (loop repeat n collect (make-list 10)))
         (defun obs-alloc-strings (n) (loop repeat n collect (make-string 100)))
         (defun obs-alloc-churn () (loop repeat 100 do (obs-alloc-lists 1000) (obs-alloc-strings 300)) :done)",
    )
    .await;
    let output = call(&tb, "profile", json!({"code": "(obs-alloc-churn)", "mode": "alloc"})).await;
    assert!(!output.is_error, "{}", output.text);
    assert!(!output.text.contains("ALLOC-TRAMP"), "{}", output.text);
    assert!(!output.text.contains("MCP-AGENT-HELPER"), "{}", output.text);
    let rows: Vec<&str> = output.text.lines().skip_while(|line| !line.contains("Function")).skip(1).collect();
    let first = rows.first().copied().unwrap_or_default();
    assert!(first.ends_with("OBS-ALLOC-LISTS") || first.ends_with("OBS-ALLOC-STRINGS"), "{}", output.text);
    let churn = rows.iter().find(|row| row.ends_with("OBS-ALLOC-CHURN")).unwrap_or_else(|| panic!("{}", output.text));
    // Its cumulative share is all but the odd sample SBCL's profiler takes in a collection the
    // allocation set off, whose stack is the collector's (99.9 in a loaded run).
    let cumulative: f64 = churn
        .trim_end_matches("OBS-ALLOC-CHURN")
        .split_whitespace()
        .last()
        .and_then(|share| share.parse().ok())
        .unwrap_or_else(|| panic!("{}", output.text));
    assert!(cumulative >= 99.0, "{}", output.text);
    assert!(output.text.ends_with("=> :DONE"), "{}", output.text);
}

#[tokio::test]
async fn a_long_test_run_keeps_its_output_behind_a_handle() {
    let _asdf = common::shared_asdf_turn().await;
    let dir = tempfile::tempdir().unwrap();
    let tb = shared();
    std::fs::write(
        dir.path().join("obs-noisy.asd"),
        "(asdf:defsystem \"obs-noisy\" :depends-on (\"fiveam\") :components ((:file \"obs-noisy\")) \
         :perform (asdf:test-op (o c) (uiop:symbol-call :fiveam :run! (uiop:find-symbol* :noisy-suite :obs-noisy))))\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("obs-noisy.lisp"),
        "(defpackage :obs-noisy (:use :cl :fiveam))
(in-package :obs-noisy)
(def-suite noisy-suite)
(in-suite noisy-suite)
(test chatty (dotimes (i 3000) (format t \"progress line ~D of a chatty test~%\" i)) (is (= 1 1)))
",
    )
    .unwrap();
    common::eval_ok(
        &tb,
        &format!("(require :asdf) (asdf:load-asd {:?})", dir.path().join("obs-noisy.asd").display().to_string()),
    )
    .await;
    let output = call(&tb, "run-tests", json!({"system": "obs-noisy"})).await;
    assert!(!output.is_error, "{}", output.text);
    // A green run is two lines whatever the tests print; what they printed is behind the handle
    // the second line names, to its end.
    assert!(output.text.len() <= 400, "{}", output.text);
    let structured = output.structured_value().unwrap();
    let (handle, characters) =
        (structured["output"]["handle"].as_str().unwrap(), structured["output"]["characters"].as_u64().unwrap());
    assert!(
        output.text.ends_with(&format!(
            "\nOutput: {} characters; inspect {handle} to read them.",
            group_thousands(characters)
        )),
        "{}",
        output.text
    );
    let end = call(&tb, "inspect", json!({"handle": handle, "offset": characters - 500})).await;
    assert!(end.text.contains("progress line 2999 of a chatty test"), "the end of the output is kept: {}", end.text);
    assert!(end.text.contains("Did 1 check"), "FiveAM's verdict, at the end, is kept: {}", end.text);
}

/// A check that fails in a loop shows its form once and the first failures' values, with the
/// handle of every failure; failing tests past those a reply describes are behind a handle too,
/// which reading from the note's offset gives to the last.
#[tokio::test]
async fn failures_past_those_described_are_behind_a_handle() {
    let _asdf = common::shared_asdf_turn().await;
    let dir = tempfile::tempdir().unwrap();
    let tb = shared();
    std::fs::write(
        dir.path().join("obs-failing.asd"),
        "(asdf:defsystem \"obs-failing\" :depends-on (\"fiveam\") :components ((:file \"obs-failing\")))\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("obs-failing.lisp"),
        "(defpackage :obs-failing (:use :cl :fiveam))
(in-package :obs-failing)
(def-suite failing-suite)
(in-suite failing-suite)
(test many-failures (dotimes (i 60) (is (= i (+ i 1000)))))
(macrolet ((many () `(progn ,@(loop for i below 55 collect `(test ,(intern (format nil \"FAILS-~2,'0D\" i)) (is (= ,i ,(1+ i))))))))
  (many))
",
    )
    .unwrap();
    common::eval_ok(
        &tb,
        &format!("(require :asdf) (asdf:load-asd {:?})", dir.path().join("obs-failing.asd").display().to_string()),
    )
    .await;
    let output = call(&tb, "run-tests", json!({"system": "obs-failing", "suite": "obs-failing::failing-suite"})).await;
    assert!(output.text.starts_with("FAILED: "), "{}", output.text);
    assert!(output.text.contains("\nFiveAM: 56 tests (115 checks): 56 failed.\n"), "{}", output.text);
    // The failing tests a red reply describes fit in its budget with the suspects.
    let shown = output.text.matches("[FAIL] ").count();
    assert!((1..56).contains(&shown), "{}", output.text);
    assert!(output.text.len() <= 4_000, "{} characters:\n{}", output.text.len(), output.text);

    // The loop: its form once, 20 failures' values, the handle of all 60.
    let looping = output.text.split("\n\n").find(|block| block.contains("MANY-FAILURES")).unwrap();
    assert!(
        looping.starts_with(
            "[FAIL] OBS-FAILING::MANY-FAILURES\n  Form: (= I (+ I 1000)) (60 failures)\n  Expected: 0  Actual: 1000\n"
        ),
        "{looping}"
    );
    assert_eq!(looping.matches("  Expected: ").count(), 20, "{looping}");
    let all = looping.lines().last().unwrap();
    let handle = all
        .strip_prefix("  [every failure of this test: inspect ")
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or_else(|| panic!("{looping}"));
    assert!(looping.contains("\n  ... 40 more\n"), "{looping}");
    let every = call(&tb, "inspect", json!({"handle": handle})).await;
    let mut seen = std::collections::BTreeSet::new();
    for line in every.text.lines().filter_map(|line| line.trim().strip_prefix("Expected: ")) {
        // Each failure's own values: the check compared i with i + 1000.
        let (expected, actual) = line.split_once("  Actual: ").unwrap();
        let expected: u64 = expected.parse().unwrap();
        assert_eq!(actual.parse::<u64>().unwrap(), expected + 1000, "{line}");
        seen.insert(expected);
    }
    assert_eq!(seen, (0..60).collect(), "every failure is described once: {}", every.text);

    // The failing tests past those are behind a handle that the note names.
    let note = output
        .text
        .lines()
        .find(|line| line.starts_with(&format!("[... {} more failing tests not shown; inspect @", 56 - shown)))
        .unwrap_or_else(|| panic!("{}", output.text));
    let after = &note[note.find("inspect @").unwrap() + "inspect ".len()..];
    let mut words = after.split(' ');
    let handle = words.next().unwrap();
    let offset: u64 = words.nth(2).unwrap().parse().unwrap();
    let rest = call(&tb, "inspect", json!({"handle": handle, "offset": offset})).await;
    assert!(!rest.is_error, "{}", rest.text);
    assert_eq!(rest.text.matches("[FAIL] ").count(), 56 - shown, "{}", rest.text);
    assert!(!rest.text.contains("more characters"), "the rest is read to its end: {}", rest.text);
}

#[tokio::test]
async fn a_test_with_many_failing_checks_shows_a_few_and_the_handle_of_all() {
    let _asdf = common::shared_asdf_turn().await;
    let dir = tempfile::tempdir().unwrap();
    let tb = shared();
    std::fs::write(
        dir.path().join("obs-checks.asd"),
        "(asdf:defsystem \"obs-checks\" :depends-on (\"fiveam\") :components ((:file \"obs-checks\")))\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("obs-checks.lisp"),
        "(defpackage :obs-checks (:use :cl :fiveam))
(in-package :obs-checks)
(def-suite checks-suite)
(in-suite checks-suite)
(test five-checks (is (= 1 2)) (is (= 3 4)) (is (= 5 6)) (is (= 7 8)) (is (= 9 10)))
",
    )
    .unwrap();
    common::eval_ok(
        &tb,
        &format!("(require :asdf) (asdf:load-asd {:?})", dir.path().join("obs-checks.asd").display().to_string()),
    )
    .await;
    let output = call(&tb, "run-tests", json!({"system": "obs-checks", "suite": "obs-checks::checks-suite"})).await;
    assert!(output.text.contains("\nFiveAM: 1 test (5 checks): 1 failed.\n"), "{}", output.text);
    let block = output.text.split("\n\n").find(|block| block.starts_with("[FAIL] OBS-CHECKS::FIVE-CHECKS")).unwrap();
    let handle = block
        .strip_prefix(
            "[FAIL] OBS-CHECKS::FIVE-CHECKS\n  Form: (= 1 2)\n  Expected: 1\n  Actual: 2\n  Form: (= 3 4)\n  Expected: 3\n  \
             Actual: 4\n  Form: (= 5 6)\n  Expected: 5\n  Actual: 6\n  ... 2 more failed checks\n  [every failure of this \
             test: inspect ",
        )
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or_else(|| panic!("{block}"));
    let every = call(&tb, "inspect", json!({"handle": handle})).await;
    assert_eq!(every.text.matches("  Form: ").count(), 5, "{}", every.text);
    assert!(every.text.contains("  Form: (= 9 10)\n  Expected: 9\n  Actual: 10"), "{}", every.text);
}
