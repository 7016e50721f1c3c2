//! The exit guard against real images: whatever way the agent's code reaches an exit (a thread it
//! starts, directly, through bordeaux-threads or SBCL's internal functions, a thread such a thread
//! starts, a timer, an interruption of the main thread, a finalizer, an exit or after-GC hook,
//! whatever of these added the hook), an image swank-mcp did not start keeps running, and the
//! refusal comes back in the [background] section; the human's own exits still end the image. Every test that could end an image (when the guard fails, or on purpose)
//! has a throwaway image of its own.

mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use common::{call, eval_ok};
use swank_mcp::source::AllowedRoots;
use swank_mcp::swank::{ConnectOptions, Connection, Endpoint, Form, Protocol, Thread};
use swank_mcp::tools::{Settings, Toolbox};

const REFUSED: &str = "[ERROR] MCP-AGENT-HELPER::EXIT-REFUSED\n";

/// How many times a test asks the image again for something that happens after a reply (a timer,
/// a finalizer, an exit): each ask waits a little in the image, so this bounds the wait to some
/// tens of seconds however slow the machine.
const ASKS: usize = 300;

/// Evaluates `code` as the agent, then evaluates `poll` until a reply's [background] section holds
/// `expected`; returns that reply. Fails when the image stops answering on the way.
async fn refusal_in_background(toolbox: &Arc<Toolbox>, code: &str, poll: &str, expected: &str) -> String {
    let mut text = call(toolbox, "evaluate-lisp", json!({ "code": code })).await.text;
    let first = text.clone();
    for _ in 0..ASKS {
        assert!(!text.contains("lost the connection") && !text.contains("No Lisp image"), "{code}: {text}");
        if text.contains(expected) {
            let background = text.split("[background]\n").nth(1).unwrap_or_else(|| panic!("{code}: {text}"));
            assert!(background.contains(expected), "{code}: {text}");
            return text;
        }
        text = call(toolbox, "evaluate-lisp", json!({ "code": poll })).await.text;
    }
    panic!("{code}: no refusal {expected:?} in the background; the first reply: {first}; the last: {text}");
}

/// Runs each `(code, expected)` in the image `toolbox` is attached to and checks that the image
/// still runs afterwards.
async fn refuse_each(toolbox: &Arc<Toolbox>, poll: &str, cases: &[(&str, String)]) {
    for (code, expected) in cases {
        let reply = refusal_in_background(toolbox, code, poll, expected).await;
        assert_eq!(eval_ok(toolbox, "(+ 1 2)").await, "=> 3", "after {code}: {reply}");
    }
}

/// The report of a refused `exit` (its arguments as printed) that ended `thread`.
fn stopped(thread: &str, exit: &str) -> String {
    format!("Thread {thread:?} stopped: {REFUSED}{exit} was refused")
}

/// The report of a refused `exit` in code that interrupted `thread`, which went on.
fn went_on(thread: &str, exit: &str) -> String {
    format!("Thread {thread:?} was interrupted and went on: {REFUSED}{exit} was refused")
}

/// The human's own connection, as SLIME's: what it evaluates is no agent's call.
async fn user_connection(port: u16) -> Connection {
    let options = ConnectOptions { connect_timeout: Duration::from_secs(5), secret: None, protocol: Protocol::Auto };
    Connection::connect(Endpoint { host: "127.0.0.1".into(), port }, &options).await.unwrap()
}

/// Sends `code` (read in CL-USER) on the human's connection without waiting for a reply, which an
/// exit never sends.
fn user_send(connection: &Connection, code: &str) {
    let form = Form::call("cl", "eval", [Form::call("cl", "read-from-string", [Form::string(code)])]);
    let connection = connection.clone();
    tokio::spawn(async move { connection.rex(form, "COMMON-LISP-USER", Thread::New).await });
}

/// The process id of the image `toolbox` is attached to.
async fn image_pid(toolbox: &Arc<Toolbox>) -> u32 {
    let text = eval_ok(toolbox, "(sb-unix:unix-getpid)").await;
    text.strip_prefix("=> ").and_then(|pid| pid.parse().ok()).unwrap_or_else(|| panic!("a pid: {text}"))
}

/// Waits until the process `pid` has ended (it is gone, or a zombie its parent has not reaped).
/// Not by connecting: a connection swank accepts during an exit makes a thread, which waits for
/// the lock the exit holds and holds the exit up for its whole timeout.
async fn wait_until_gone(pid: u32) {
    for _ in 0..ASKS {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return,
            Ok(stat) if stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')) => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("the image (process {pid}) is still running");
}

#[tokio::test]
async fn exits_in_threads_the_agent_starts_are_refused() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    eval_ok(&toolbox, "(require :asdf) (asdf:load-system :bordeaux-threads)").await;
    let joined = |body: &str, name: &str| {
        format!("(sb-thread:join-thread (sb-thread:make-thread (lambda () {body}) :name {name:?}) :default nil)")
    };
    let cases = [
        (joined("(sb-ext:exit :code 11)", "exiter"), stopped("exiter", "(SB-EXT:EXIT :CODE 11)")),
        (joined("(sb-ext:exit :code 12 :abort t)", "aborter"), stopped("aborter", "(SB-EXT:EXIT :CODE 12 :ABORT T)")),
        (joined("(sb-ext:quit :unix-status 13)", "quitter"), stopped("quitter", "(SB-EXT:EXIT :CODE 13 :ABORT NIL)")),
        (joined("(uiop:quit 14)", "uiop quitter"), stopped("uiop quitter", "(SB-EXT:EXIT :CODE 14 :ABORT NIL)")),
        // A thread of a thread of the agent's, which ends before its child does.
        (
            joined(
                "(sb-thread:make-thread (lambda () (sleep 0.1) (sb-ext:exit :code 15)) :name \"grandchild\")",
                "child",
            ),
            stopped("grandchild", "(SB-EXT:EXIT :CODE 15)"),
        ),
        (
            "(bt:join-thread (bt:make-thread (lambda () (sb-ext:exit :code 16)) :name \"bt exiter\"))".to_string(),
            stopped("bt exiter", "(SB-EXT:EXIT :CODE 16)"),
        ),
        // SBCL's internal ways of starting a thread, which MAKE-THREAD itself goes through.
        (
            "(sb-thread::make-system-thread \"system exiter\" (lambda () (sb-ext:exit :code 19)) nil nil) :started"
                .to_string(),
            stopped("system exiter", "(SB-EXT:EXIT :CODE 19)"),
        ),
        (
            "(sb-thread::start-thread (sb-thread::%make-thread \"started exiter\" nil (sb-thread:make-semaphore))
                                      (lambda () (sb-ext:exit :code 20)) nil)
             :started"
                .to_string(),
            stopped("started exiter", "(SB-EXT:EXIT :CODE 20)"),
        ),
        // Not joined: the thread is still running when the reply goes; the next one reports it.
        (
            "(sb-thread:make-thread (lambda () (sleep 0.2) (uiop:quit 17 nil)) :name \"late quitter\") :started"
                .to_string(),
            stopped("late quitter", "(SB-EXT:EXIT :CODE 17 :ABORT T)"),
        ),
    ];
    let cases: Vec<(&str, String)> = cases.iter().map(|(code, expected)| (code.as_str(), expected.clone())).collect();
    refuse_each(&toolbox, "(sleep 0.05)", &cases).await;

    // The refusal is an error the thread can handle.
    let handled = eval_ok(
        &toolbox,
        "(sb-thread:join-thread
           (sb-thread:make-thread (lambda () (handler-case (sb-ext:exit :code 18)
                                               (error (e) (type-of e))))))",
    )
    .await;
    assert_eq!(handled, "=> MCP-AGENT-HELPER::EXIT-REFUSED");
}

#[tokio::test]
async fn exits_in_timers_interruptions_and_finalizers_of_the_agent_are_refused() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    let cases = [
        // The timer interrupts the thread that made it, the agent's worker, after the reply.
        (
            "(sb-ext:schedule-timer (sb-ext:make-timer (lambda () (sb-ext:exit :code 21)) :name \"own\") 0.2) :scheduled",
            went_on("swank-mcp worker", "(SB-EXT:EXIT :CODE 21)"),
        ),
        (
            "(sb-ext:schedule-timer (sb-ext:make-timer (lambda () (sb-ext:exit :code 22)) :name \"new\" :thread t) 0.2)",
            stopped("Timer new", "(SB-EXT:EXIT :CODE 22)"),
        ),
        // Run in whichever thread takes the timer signal.
        (
            "(sb-ext:schedule-timer (sb-ext:make-timer (lambda () (sb-ext:exit :code 23 :abort t)) :thread nil) 0.2)",
            "went on: [ERROR] MCP-AGENT-HELPER::EXIT-REFUSED\n(SB-EXT:EXIT :CODE 23 :ABORT T) was refused".into(),
        ),
        (
            "(sb-thread:interrupt-thread (sb-thread:main-thread) (lambda () (sb-ext:exit :code 24)))",
            went_on("main thread", "(SB-EXT:EXIT :CODE 24)"),
        ),
        // TERMINATE-THREAD of the main thread makes it exit with code 1.
        ("(sb-thread:terminate-thread (sb-thread:main-thread))", went_on("main thread", "(SB-EXT:EXIT :CODE 1)")),
        // From a thread of the agent's, into the main thread.
        (
            "(sb-thread:join-thread (sb-thread:make-thread
               (lambda () (sb-thread:interrupt-thread (sb-thread:main-thread) (lambda () (uiop:quit 25))))))",
            went_on("main thread", "(SB-EXT:EXIT :CODE 25 :ABORT NIL)"),
        ),
    ];
    let cases: Vec<(&str, String)> = cases.iter().map(|(code, expected)| (*code, expected.clone())).collect();
    eval_ok(&toolbox, "(require :asdf)").await;
    refuse_each(&toolbox, "(sleep 0.05)", &cases).await;

    // A timer that interrupts the evaluation that made it is part of it: WITH-TIMEOUT's error
    // reaches the evaluation's handlers, or its reply; so does a refused exit.
    let handled = "(handler-case (sb-ext:with-timeout 0.2 (sleep 5) :done) (sb-ext:timeout () :timed-out))";
    assert_eq!(eval_ok(&toolbox, handled).await, "=> :TIMED-OUT");
    let unhandled = call(&toolbox, "evaluate-lisp", json!({"code": "(sb-ext:with-timeout 0.2 (sleep 5) :done)"})).await;
    assert!(unhandled.is_error && unhandled.text.starts_with("[ERROR] TIMEOUT\n"), "{}", unhandled.text);
    let own = "(sb-ext:schedule-timer (sb-ext:make-timer (lambda () (sb-ext:exit :code 27))) 0.1) (sleep 5) :slept";
    let refused = call(&toolbox, "evaluate-lisp", json!({ "code": own })).await;
    assert!(
        refused.is_error && refused.text.starts_with(&format!("{REFUSED}(SB-EXT:EXIT :CODE 27) was refused")),
        "{}",
        refused.text
    );

    // A finalizer runs in SBCL's finalizer thread after a collection finds its object unreachable.
    let finalizer = [(
        "(progn (sb-ext:finalize (make-array 1000) (lambda () (sb-ext:exit :code 26))) nil)",
        went_on("finalizer", "(SB-EXT:EXIT :CODE 26)"),
    )];
    refuse_each(&toolbox, "(sb-ext:gc :full t) (sleep 0.05)", &finalizer).await;
}

/// Code that load-file loads is the agent's too: a thread it starts cannot end the image.
#[tokio::test]
async fn exits_in_threads_of_loaded_code_are_refused() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("exiter.lisp");
    std::fs::write(
        &file,
        "(sb-thread:join-thread (sb-thread:make-thread (lambda () (sb-ext:exit :code 41)) :name \"loaded exiter\")
                               :default nil)\n",
    )
    .unwrap();
    let toolbox = Arc::new(Toolbox::new(
        common::settings(),
        vec![common::image_settings(image.port)],
        AllowedRoots::new(vec![dir.path().to_path_buf()]).unwrap(),
    ));
    let loaded = call(&toolbox, "load-file", json!({"file_path": file.display().to_string()})).await;
    assert!(!loaded.is_error, "{}", loaded.text);
    let expected = stopped("loaded exiter", "(SB-EXT:EXIT :CODE 41)");
    refuse_each(&toolbox, "(sleep 0.05)", &[("(+ 1 1)", expected)]).await;
}

/// An exit hook the agent adds runs when the human exits; one that exits again would end the
/// image at once, before the human's own hooks. Its exit is refused, and the human's exit goes on.
/// An after-GC hook of the agent's cannot end the image when the human's thread collects.
#[tokio::test]
async fn hooks_the_agent_adds_cannot_end_the_image() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("human-hook-ran");
    let user = user_connection(image.port).await;
    let form = Form::call(
        "cl",
        "funcall",
        [
            Form::call(
                "cl",
                "eval",
                [Form::call(
                    "cl",
                    "read-from-string",
                    [Form::string(
                        "(lambda (path)
                           (push (lambda () (with-open-file (out path :direction :output)
                                              (write-string \"the human's hook ran\" out)))
                                 sb-ext:*exit-hooks*))",
                    )],
                )],
            ),
            Form::string(marker.to_str().unwrap()),
        ],
    );
    user.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap();
    let pid = image_pid(&toolbox).await;

    // Hooks pushed by the evaluation, and by a thread of the agent's.
    eval_ok(&toolbox, "(push (lambda () (sb-ext:exit :code 31 :abort t)) sb-ext:*exit-hooks*) :pushed").await;
    eval_ok(
        &toolbox,
        "(sb-thread:join-thread (sb-thread:make-thread
           (lambda () (push (lambda () (sb-ext:exit :code 32)) sb-ext:*exit-hooks*) :pushed)))",
    )
    .await;
    // Neither runs before the human exits.
    assert_eq!(eval_ok(&toolbox, "(+ 1 2)").await, "=> 3");
    assert!(!marker.exists());

    // An after-GC hook runs in whichever thread collects, here the human's.
    eval_ok(&toolbox, "(push (lambda () (sb-ext:exit :code 33)) sb-ext:*after-gc-hooks*) :pushed").await;
    user.rex(Form::call("sb-ext", "gc", [Form::Keyword("full"), Form::T]), "COMMON-LISP-USER", Thread::New)
        .await
        .unwrap();
    let expected = "went on: [ERROR] MCP-AGENT-HELPER::EXIT-REFUSED\n(SB-EXT:EXIT :CODE 33) was refused";
    refuse_each(&toolbox, "(sleep 0.05)", &[("(+ 1 1)", expected.to_string())]).await;
    eval_ok(&toolbox, "(setf sb-ext:*after-gc-hooks* nil)").await;

    user_send(&user, "(sb-ext:exit :code 5)");
    wait_until_gone(pid).await;
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "the human's hook ran");
}

/// The string `code` (read in CL-USER) returns on the human's connection. Fails when the image
/// ended.
async fn user_text(connection: &Connection, code: &str) -> String {
    let form = Form::call("cl", "eval", [Form::call("cl", "read-from-string", [Form::string(code)])]);
    let reply = connection
        .rex(form, "COMMON-LISP-USER", Thread::New)
        .await
        .unwrap_or_else(|e| panic!("the image ended at the human's {code}: {e}"));
    reply.as_str().unwrap_or_else(|| panic!("a string: {reply}")).to_string()
}

/// The human collects garbage on their own connection, as their code does when it allocates: the
/// after-GC hooks run in their thread, outside any code of the agent's. Returns what the hooks'
/// warnings printed.
async fn user_collects(connection: &Connection) -> String {
    user_text(connection, "(with-output-to-string (*error-output*) (sb-ext:gc :full t))").await
}

/// Evaluates `code` as the agent, then has the human collect garbage until a reply's [background]
/// section holds `expected`.
async fn refused_at_the_users_collections(toolbox: &Arc<Toolbox>, user: &Connection, code: &str, expected: &str) {
    let first = call(toolbox, "evaluate-lisp", json!({ "code": code })).await.text;
    assert!(!first.contains("[ERROR]"), "{code}: {first}");
    let mut text = String::new();
    for _ in 0..ASKS {
        user_collects(user).await;
        text = call(toolbox, "evaluate-lisp", json!({ "code": "(sleep 0.05)" })).await.text;
        assert!(!text.contains("lost the connection") && !text.contains("No Lisp image"), "{code}: {text}");
        if text.contains(expected) {
            let background = text.split("[background]\n").nth(1).unwrap_or_else(|| panic!("{code}: {text}"));
            assert!(background.contains(expected), "{code}: {text}");
            return;
        }
    }
    panic!("{code}: no refusal {expected:?} in the background; the first reply: {first}; the last: {text}");
}

/// An after-GC hook runs in whichever thread collects, the human's too, where nothing of the
/// agent's runs: a hook is the agent's when code of the agent's added it, however deep that code
/// ran (a timer, a finalizer, an interruption, another hook, a thread SBCL's internals started).
#[tokio::test]
async fn after_gc_hooks_that_code_of_the_agent_adds_cannot_end_the_image() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    let user = user_connection(image.port).await;
    let hook = |code: u32| format!("(push (lambda () (sb-ext:exit :code {code})) sb-ext:*after-gc-hooks*)");
    let cases = [
        (format!("(sb-ext:schedule-timer (sb-ext:make-timer (lambda () {}) :thread t) 0.05) :scheduled", hook(61)), 61),
        (format!("(progn (sb-ext:finalize (make-array 1000) (lambda () {})) nil)", hook(62)), 62),
        (
            format!(
                "(let ((pushed nil))
                   (push (lambda () (unless pushed (setf pushed t) {})) sb-ext:*after-gc-hooks*)
                   :pushed)",
                hook(63)
            ),
            63,
        ),
        (format!("(sb-thread:interrupt-thread (sb-thread:main-thread) (lambda () {}))", hook(64)), 64),
        (format!("(sb-thread::make-system-thread \"system pusher\" (lambda () {}) nil nil) :started", hook(65)), 65),
    ];
    for (code, exit) in &cases {
        let expected = format!("went on: {REFUSED}(SB-EXT:EXIT :CODE {exit}) was refused");
        refused_at_the_users_collections(&toolbox, &user, code, &expected).await;
        assert_eq!(eval_ok(&toolbox, "(setf sb-ext:*after-gc-hooks* nil)").await, "=> NIL");
    }

    // A hook added by a thread of the agent's that still runs, after the evaluation that started
    // it ended: its exit is refused, and the refusal is the warning SBCL prints for a failed hook.
    let code =
        format!("(sb-thread:make-thread (lambda () (sleep 0.2) {} (sleep 600)) :name \"pusher\") :started", hook(66));
    eval_ok(&toolbox, &code).await;
    let hooks = "(princ-to-string (length sb-ext:*after-gc-hooks*))";
    for _ in 0..ASKS {
        if user_text(&user, hooks).await == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let warnings = user_collects(&user).await;
    assert!(warnings.contains("(SB-EXT:EXIT :CODE 66) was refused"), "{warnings}");
    assert_eq!(eval_ok(&toolbox, "(+ 1 2)").await, "=> 3");
}

/// Hooks that hooks and timers of the agent's add run as the agent's at the human's exit: their
/// exits are refused, and the human's own exit hook runs.
#[tokio::test]
async fn exit_hooks_that_code_of_the_agent_adds_cannot_end_the_image_first() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("human-hook-ran");
    let user = user_connection(image.port).await;
    // The human's hook collects garbage, which runs the after-GC hooks there are by then.
    let human_hook = format!(
        "(push (lambda () (sb-ext:gc :full t)
                          (with-open-file (out {:?} :direction :output) (write-string \"the human's hook ran\" out)))
               sb-ext:*exit-hooks*)",
        marker.to_str().unwrap()
    );
    let form = Form::call("cl", "eval", [Form::call("cl", "read-from-string", [Form::string(human_hook)])]);
    user.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap();
    let pid = image_pid(&toolbox).await;

    // Exit hooks run first to last, and these are pushed after the human's.
    eval_ok(
        &toolbox,
        "(push (lambda () (push (lambda () (sb-ext:exit :code 67 :abort t)) sb-ext:*after-gc-hooks*)) sb-ext:*exit-hooks*)
         (let ((done (sb-thread:make-semaphore)))
           (sb-ext:schedule-timer
            (sb-ext:make-timer (lambda () (push (lambda () (sb-ext:exit :code 68 :abort t)) sb-ext:*exit-hooks*)
                                          (sb-thread:signal-semaphore done))
                               :thread t)
            0.05)
           (sb-thread:wait-on-semaphore done))",
    )
    .await;
    user_send(&user, "(sb-ext:exit :code 5)");
    wait_until_gone(pid).await;
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "the human's hook ran");
}

/// Uninstalling the helper takes the agent's hooks out with its guard, and leaves the human's.
#[tokio::test]
async fn uninstall_takes_the_agents_hooks_out() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    let user = user_connection(image.port).await;
    let human_hook = "(progn (defvar *human-collections* 0)
                             (push (lambda () (incf *human-collections*)) sb-ext:*after-gc-hooks*))";
    let form = Form::call("cl", "eval", [Form::call("cl", "read-from-string", [Form::string(human_hook)])]);
    user.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap();
    let expected = format!("went on: {REFUSED}(SB-EXT:EXIT :CODE 71) was refused");
    let code = "(push (lambda () (sb-ext:exit :code 71)) sb-ext:*after-gc-hooks*) :pushed";
    refused_at_the_users_collections(&toolbox, &user, code, &expected).await;

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--port", &image.port.to_string(), "uninstall"])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("1 function an agent put on SB-EXT:*AFTER-GC-HOOKS*"), "{text}");

    user_collects(&user).await;
    // Only the human's hook is left, and it ran.
    let left = "(format nil \"~D ~A\" (length sb-ext:*after-gc-hooks*) (plusp *human-collections*))";
    assert_eq!(user_text(&user, left).await, "1 T");
}

#[tokio::test]
async fn an_exit_in_a_thread_the_human_starts_ends_the_image() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    // The helper, and with it the guard, is in the image.
    eval_ok(&toolbox, "(sb-thread:make-thread (lambda () (sleep 600)) :name \"agent sleeper\") :started").await;
    let pid = image_pid(&toolbox).await;
    let user = user_connection(image.port).await;
    user_send(&user, "(sb-thread:make-thread (lambda () (sb-ext:exit :code 7)) :name \"human exiter\")");
    wait_until_gone(pid).await;
    let output = call(&toolbox, "evaluate-lisp", json!({"code": "(+ 1 2)"})).await;
    assert!(
        output.is_error
            && (output.text.starts_with("No Lisp image is answering") || output.text.contains("The image exited")),
        "{}",
        output.text
    );
}

#[tokio::test]
async fn an_exit_in_a_timer_the_human_schedules_ends_the_image() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    let pid = image_pid(&toolbox).await;
    let user = user_connection(image.port).await;
    user_send(
        &user,
        "(sb-ext:schedule-timer (sb-ext:make-timer (lambda () (sb-ext:exit :code 8 :abort t)) :thread t) 0.1)",
    );
    wait_until_gone(pid).await;
}

#[tokio::test]
async fn with_allow_exit_a_thread_of_the_agent_ends_the_image() {
    let image = common::private_image().await;
    let settings = Settings { allow_exit: true, ..common::settings() };
    let toolbox = Arc::new(Toolbox::new(
        settings,
        vec![common::image_settings(image.port)],
        AllowedRoots::new(Vec::new()).unwrap(),
    ));
    let pid = image_pid(&toolbox).await;
    eval_ok(
        &toolbox,
        "(sb-thread:make-thread (lambda () (sleep 0.2) (sb-ext:exit :code 9)) :name \"exiter\") :started",
    )
    .await;
    wait_until_gone(pid).await;
}
