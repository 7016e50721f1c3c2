//! The image's own threads (issue 37): an error in a thread the person runs goes to the person's
//! debugger, never to swank-mcp's, and the thread lives; the agent attaches to it where it waits,
//! reads a local, redefines the function and restarts the frame, and the same thread finishes the
//! same job while the person's debugger closes and their connection still answers. With no
//! person's connection the thread waits for the agent, who is told it stopped.
//!
//! The person is a raw swank client connected first, as SLIME is: it reads every message the
//! image sends it.

mod common;

use std::time::Duration;

use serde_json::{json, Value};

use common::{is_error, text, McpClient};

/// The person's Emacs: a swank connection of its own, opened before swank-mcp's.
struct Person {
    wire: common::SwankWire,
    next_request: u32,
    /// Messages read while waiting for something else.
    unread: std::collections::VecDeque<String>,
}

impl Person {
    async fn connect(port: u16) -> Self {
        Self { wire: common::SwankWire::connect(port).await, next_request: 1, unread: Default::default() }
    }

    async fn send(&mut self, message: &str) {
        self.wire.send(message).await;
    }

    /// The next message, answering swank's flow control on the way as Emacs does: a thread that
    /// has sent many messages asks for a pong before it sends more.
    async fn receive(&mut self) -> String {
        loop {
            let message = self.wire.receive().await;
            match message.strip_prefix("(:ping ") {
                Some(rest) => self.send(&format!("(:emacs-pong {rest}")).await,
                None => return message,
            }
        }
    }

    /// Evaluates `code` in `package` as SLIME's `C-x C-e` does; returns the `(:ok ...)` or
    /// `(:abort ...)` of the reply.
    async fn eval(&mut self, code: &str, package: &str) -> String {
        let id = self.next_request;
        self.next_request += 1;
        let quoted = code.replace('\\', "\\\\").replace('"', "\\\"");
        self.send(&format!("(:emacs-rex (swank:interactive-eval \"{quoted}\") \"{package}\" t {id})")).await;
        let ending = format!(" {id})");
        let within = Duration::from_secs(30);
        tokio::time::timeout(within, async {
            loop {
                let message = self.receive().await;
                match message.strip_prefix("(:return ").and_then(|m| m.strip_suffix(&ending)) {
                    Some(value) => return value.to_string(),
                    None => self.unread.push_back(message),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no reply to {code} within {within:?}"))
    }

    /// The next message that starts with `prefix`, read or still to come.
    async fn told(&mut self, prefix: &str) -> String {
        if let Some(at) = self.unread.iter().position(|message| message.starts_with(prefix)) {
            return self.unread.remove(at).unwrap();
        }
        let within = Duration::from_secs(30);
        tokio::time::timeout(within, async {
            loop {
                let message = self.receive().await;
                if message.starts_with(prefix) {
                    return message;
                }
                self.unread.push_back(message);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the person's connection was not told {prefix} within {within:?}"))
    }
}

/// An invoicing service's piece: a worker that prices a job, and a job whose quantity came as text.
const SHOP: &str = "(progn \
     (declaim (optimize (debug 2))) \
     (defvar *done* '()) \
     (defun price (qty) (* qty 10)) \
     (defun work (job) (push (price job) *done*)) \
     t)";

/// Defines the service in the image, as the person would from their REPL.
async fn define_shop(person: &mut Person) {
    assert_eq!(
        person.eval("(defpackage :shop (:use :cl))", "COMMON-LISP-USER").await,
        "(:ok \"=> #<PACKAGE \\\"SHOP\\\">\")"
    );
    assert_eq!(person.eval(SHOP, "SHOP").await, "(:ok \"=> T\")");
}

/// A private image with the shop defined by the person, connected first, and an agent's server
/// attached after them, initialized.
async fn shop_and_agent() -> (swank_mcp::image::launch::LaunchedImage, Person, McpClient) {
    let image = common::private_image().await;
    let mut person = Person::connect(image.port).await;
    define_shop(&mut person).await;
    let mut agent = McpClient::start(&["--port", &image.port.to_string()]).await;
    agent.initialize().await;
    (image, person, agent)
}

/// The number of the backtrace line that calls `function`: "3: (SHOP::PRICE \"3\")" gives 3.
fn frame_of(backtrace: &str, function: &str) -> u64 {
    backtrace
        .lines()
        .find_map(|line| {
            let (number, call) = line.split_once(": ")?;
            call.starts_with(&format!("({function} ")).then(|| number.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no frame of {function} in {backtrace}"))
}

/// The session a debugger reply names: "[DEBUGGER D3] ..." gives "D3".
fn session_of(reply: &str) -> String {
    let start = reply.find("[DEBUGGER D").unwrap_or_else(|| panic!("no session in {reply}")) + "[DEBUGGER ".len();
    reply[start..].split(']').next().unwrap().to_string()
}

/// The session a reply's `[background]` opened: "... as debugger session D3: ..." gives "D3".
fn named_session(reply: &str) -> String {
    let start = reply.find("as debugger session D").unwrap_or_else(|| panic!("no session in {reply}"))
        + "as debugger session ".len();
    reply[start..].split(':').next().unwrap().to_string()
}

/// Waits until the thread named `name` waits in a debugger (the person's SLDB, or swank-mcp's
/// at a breakpoint), as the threads tool sees it, or fails after 10 s.
async fn until_waits(agent: &mut McpClient, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let threads = tool(agent, "threads", json!({})).await;
        let line = threads.lines().find(|line| line.contains(&format!("{name:?}"))).unwrap_or_default();
        if line.contains("waits in the SLIME debugger") || line.contains("waits in the SLY debugger") {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{name} did not stop: {threads}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn tool(agent: &mut McpClient, name: &str, arguments: Value) -> String {
    let reply = agent.call_tool(name, arguments).await;
    assert!(!is_error(&reply), "{name}: {reply}");
    text(&reply).to_string()
}

#[tokio::test]
async fn an_error_in_the_persons_thread_reaches_their_debugger_and_the_agent_restarts_its_frame() {
    let image = common::private_image().await;
    let mut person = Person::connect(image.port).await;
    define_shop(&mut person).await;
    // swank-mcp attaches after the person's Emacs, so swank would take it for the default.
    let mut agent = McpClient::start(&["--port", &image.port.to_string()]).await;
    agent.initialize().await;
    assert_eq!(tool(&mut agent, "evaluate-lisp", json!({"code": "(+ 1 2)"})).await, "=> 3");

    person.eval("(sb-thread:make-thread (lambda () (work \"3\")) :name \"shop-worker\")", "SHOP").await;
    let debug = person.told("(:debug ").await;
    assert!(debug.contains("shop-worker") && debug.contains("is not of type"), "the person's SLDB opens: {debug}");

    let threads = tool(&mut agent, "threads", json!({})).await;
    let listed = threads.lines().find(|line| line.contains("shop-worker")).unwrap_or_else(|| panic!("{threads}"));
    assert!(listed.contains("waits in the SLIME debugger") && listed.contains("TYPE-ERROR"), "{listed}");

    let status = tool(&mut agent, "lisp-status", json!({})).await;
    assert!(
        status.contains("Stopped thread") && status.contains("\"shop-worker\" waits in the SLIME debugger"),
        "{status}"
    );

    let attached = tool(&mut agent, "debugger", json!({"action": "attach", "thread": "shop-worker"})).await;
    assert!(attached.contains("waits in the person's Emacs debugger"), "{attached}");
    let session = session_of(&attached);
    let frame = frame_of(&attached, "SHOP::PRICE");
    let locals = tool(&mut agent, "debugger", json!({"session": session, "action": "frame", "frame": frame})).await;
    assert!(locals.contains("QTY = \"3\""), "{locals}");
    let value = tool(
        &mut agent,
        "debugger",
        json!({"session": session, "action": "eval_in_frame", "frame": frame, "code": "(length qty)"}),
    )
    .await;
    assert!(value.starts_with("=> 1"), "{value}");

    tool(
        &mut agent,
        "evaluate-lisp",
        json!({"code": "(defun price (qty) (* (if (stringp qty) (parse-integer qty) qty) 10))", "package": "SHOP"}),
    )
    .await;
    let resumed =
        tool(&mut agent, "debugger", json!({"session": session, "action": "restart_frame", "frame": frame})).await;
    assert!(
        resumed.starts_with(&format!("Frame {frame} was restarted: (SHOP::PRICE \"3\") was called again.\n"))
            && resumed.contains("left the debugger"),
        "{resumed}"
    );

    // The person's SLDB closes as when they pick a restart, the same thread finished the same job,
    // and their connection still answers.
    let closed = person.told("(:debug-return ").await;
    assert!(closed.starts_with("(:debug-return "), "{closed}");
    assert_eq!(person.eval("*done*", "SHOP").await, "(:ok \"=> (30)\")");
    let reply = agent.call_tool("debugger", json!({"session": session, "action": "backtrace"})).await;
    assert!(is_error(&reply) && text(&reply).contains("no debugger session"), "the session ended: {reply}");
    assert!(
        !person.unread.iter().any(|message| message.starts_with("(:return ")),
        "the person's Emacs got no reply it did not ask for: {:?}",
        person.unread
    );
}

/// ATTACHED runs, in a thread waiting in a debugger, only the entries the helper defines
/// `:attached` (the debugger's actions), and only where a thread waits.
#[tokio::test]
async fn an_attached_thread_runs_only_the_debugger_actions() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    let attached = |entry: &str| {
        format!("(mcp-agent-helper:attached mcp-agent-helper::*version* {entry:?} \"s\" \"t\" nil 1 \"(+ 1 2)\")")
    };
    assert_eq!(
        common::without_handle(&common::eval_ok(&toolbox, &attached("evaluate")).await),
        "=> (:FAILURE \"evaluate is not a debugger action.\")"
    );
    assert_eq!(
        common::without_handle(&common::eval_ok(&toolbox, &attached("debugger-eval-in-frame")).await),
        "=> (:FAILURE \"This thread no longer waits in a debugger.\")"
    );
}

#[tokio::test]
async fn with_nobody_elses_connection_the_thread_waits_and_the_agent_is_told() {
    let image = common::private_image().await;
    let mut agent = McpClient::start(&["--port", &image.port.to_string()]).await;
    agent.initialize().await;
    assert_eq!(tool(&mut agent, "evaluate-lisp", json!({"code": "(+ 1 2)"})).await, "=> 3");
    // A thread of the image's own, started by a connection that has gone before it fails.
    {
        let mut person = Person::connect(image.port).await;
        define_shop(&mut person).await;
        person.eval("(sb-thread:make-thread (lambda () (sleep 1) (work \"4\")) :name \"lone-worker\")", "SHOP").await;
    }
    until_waits(&mut agent, "lone-worker").await;
    let reply = tool(&mut agent, "evaluate-lisp", json!({"code": "(+ 1 1)"})).await;
    assert!(
        reply.contains("[background]")
            && reply.contains("Thread \"lone-worker\" of the image stopped")
            && reply.contains("It waits in no one's debugger (no Emacs is connected) as debugger session D"),
        "{reply}"
    );
    let threads = tool(&mut agent, "threads", json!({})).await;
    assert!(threads.contains("lone-worker"), "swank-mcp did not end the thread: {threads}");

    // The reply's session is one the debugger acts on.
    let session = named_session(&reply);
    let backtrace = tool(&mut agent, "debugger", json!({"session": session, "action": "backtrace"})).await;
    let frame = frame_of(&backtrace, "SHOP::PRICE");
    tool(
        &mut agent,
        "evaluate-lisp",
        json!({"code": "(defun price (qty) (* (if (stringp qty) (parse-integer qty) qty) 10))", "package": "SHOP"}),
    )
    .await;
    tool(&mut agent, "debugger", json!({"session": session, "action": "restart_frame", "frame": frame})).await;
    assert_eq!(
        common::without_handle(
            &tool(
                &mut agent,
                "evaluate-lisp",
                json!({"code": "(loop repeat 200 until shop::*done* do (sleep 0.05) finally (return shop::*done*))"})
            )
            .await
        ),
        "=> (40)"
    );
}

#[tokio::test]
async fn a_conditional_breakpoint_stops_only_the_call_it_holds_for_and_goes_with_its_session() {
    let (_image, mut person, mut agent) = shop_and_agent().await;
    let set =
        tool(&mut agent, "debugger", json!({"action": "break", "function": "shop::price", "condition": "(> qty 5)"}))
            .await;
    assert!(set.starts_with("Breakpoint 1: SHOP::PRICE when (> qty 5), every thread"), "{set}");

    person.eval("(progn (defvar *low* nil) (defvar *high* nil))", "SHOP").await;
    person.eval("(sb-thread:make-thread (lambda () (setf *low* (price 3))) :name \"low\")", "SHOP").await;
    person.eval("(sb-thread:make-thread (lambda () (setf *high* (price 7))) :name \"high\")", "SHOP").await;
    until_waits(&mut agent, "high").await;
    until_person_sees(&mut person, "*low*", "(:ok \"=> 30", "the call whose condition is false went on").await;
    // The call whose condition is false went on; the other waits for the agent, not the person.
    assert_eq!(person.eval("(list *low* *high*)", "SHOP").await, "(:ok \"=> (30 NIL)\")");
    assert!(!person.unread.iter().any(|message| message.starts_with("(:debug ")), "{:?}", person.unread);
    let reply = tool(&mut agent, "evaluate-lisp", json!({"code": "1"})).await;
    assert!(
        reply.contains("Breakpoint 1: SHOP::PRICE called with (7)")
            && reply.contains("It waits at breakpoint 1 as debugger session D"),
        "{reply}"
    );
    let status = tool(&mut agent, "lisp-status", json!({})).await;
    assert!(status.contains("Debugger session D") && status.contains("BREAKPOINT-HIT"), "{status}");

    let session = named_session(&reply);
    let backtrace = tool(&mut agent, "debugger", json!({"session": session, "action": "backtrace"})).await;
    assert!(backtrace.contains("[DEBUGGER"), "{backtrace}");
    let resumed = tool(&mut agent, "debugger", json!({"session": session, "action": "continue"})).await;
    assert!(resumed.contains("left the debugger"), "{resumed}");
    until_person_sees(&mut person, "*high*", "(:ok \"=> 70 ", "the call went on").await;

    let listed = tool(&mut agent, "debugger", json!({"action": "breakpoints"})).await;
    assert!(listed.contains("Breakpoint 1: SHOP::PRICE") && listed.contains("1 stop"), "{listed}");
    // A session that ends leaves no breakpoint behind.
    drop(agent);
    let encapsulated = "(sb-int:encapsulated-p 'price 'mcp-agent-helper::mcp-agent-breakpoint)";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while person.eval(encapsulated, "SHOP").await != "(:ok \"=> NIL\")" {
        assert!(std::time::Instant::now() < deadline, "the breakpoint outlived its session");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(person.eval("(price 9)", "SHOP").await.starts_with("(:ok \"=> 90 "), "no stop without the breakpoint");
}

#[tokio::test]
async fn a_thread_stopped_at_a_breakpoint_is_stepped_into_and_over_then_continued() {
    let image = common::private_image().await;
    let mut person = Person::connect(image.port).await;
    define_shop(&mut person).await;
    person
        .eval(
            "(progn (defvar *stepped* nil) \
               (defun total (a b) (declare (optimize (debug 3))) (let ((s (+ a b))) (* (price s) 2))) t)",
            "SHOP",
        )
        .await;
    let mut agent = McpClient::start(&["--port", &image.port.to_string()]).await;
    agent.initialize().await;
    tool(&mut agent, "debugger", json!({"action": "break", "function": "shop::total", "hits": 1})).await;
    person.eval("(sb-thread:make-thread (lambda () (setf *stepped* (total 1 2))) :name \"stepper\")", "SHOP").await;
    until_waits(&mut agent, "stepper").await;
    let attached = tool(&mut agent, "debugger", json!({"action": "attach", "thread": "stepper"})).await;
    let session = session_of(&attached);
    let first = tool(&mut agent, "debugger", json!({"session": session, "action": "step_into"})).await;
    assert!(first.contains("STEP-FORM-CONDITION") && first.contains("(+ A B)"), "the first step: {first}");
    assert_eq!(session_of(&first), session, "the same session goes on");
    let second = tool(&mut agent, "debugger", json!({"session": session, "action": "step_over"})).await;
    assert!(
        second.contains("STEP-FORM-CONDITION") && second.contains("PRICE"),
        "the next call, stepped over: {second}"
    );
    let done = tool(&mut agent, "debugger", json!({"session": session, "action": "continue"})).await;
    assert!(done.contains("left the debugger"), "{done}");
    until_person_sees(&mut person, "*stepped*", "(:ok \"=> 60 ", "the stepped call finished").await;
}

#[tokio::test]
async fn a_trace_of_every_thread_summarises_other_threads_calls_in_the_next_reply() {
    let (_image, mut person, mut agent) = shop_and_agent().await;
    let traced =
        tool(&mut agent, "trace", json!({"functions": ["shop::price"], "threads": "all", "max_calls": 3})).await;
    assert!(traced.contains("Calls by other threads are recorded too (every thread: SHOP::PRICE"), "{traced}");
    person
        .eval(
            "(sb-thread:join-thread (sb-thread:make-thread (lambda () (dotimes (i 5) (price i))) :name \"pricer\"))",
            "SHOP",
        )
        .await;
    let reply = tool(&mut agent, "evaluate-lisp", json!({"code": "1"})).await;
    assert!(reply.contains("Calls by other threads since the last reply:"), "{reply}");
    for i in 0..3 {
        assert!(reply.contains(&format!("[pricer] 0: (SHOP::PRICE {i})")), "call {i}: {reply}");
        assert!(reply.contains(&format!("[pricer] 0: SHOP::PRICE returned {}", i * 10)), "return {i}: {reply}");
    }
    assert!(!reply.contains("(SHOP::PRICE 3)"), "max_calls holds: {reply}");
    assert!(reply.contains("reached its max_calls"), "{reply}");
    let next = tool(&mut agent, "evaluate-lisp", json!({"code": "2"})).await;
    assert_eq!(next, "=> 2", "taken once");

    // A probe that does not stop: only the calls the condition holds for are recorded, with their
    // arguments and values; a condition that fails is passed over, the thread untouched.
    let watched = tool(
        &mut agent,
        "trace",
        json!({"functions": ["shop::price"], "threads": "all", "condition": "(and (oddp qty) (> qty 4))"}),
    )
    .await;
    assert!(watched.contains("SHOP::PRICE when (and (oddp qty) (> qty 4))"), "{watched}");
    person
        .eval(
            "(sb-thread:join-thread (sb-thread:make-thread (lambda () (dotimes (i 9) (price i)) (price 2.5)) \
               :name \"watched\") :default :ended)",
            "SHOP",
        )
        .await;
    let reply = tool(&mut agent, "evaluate-lisp", json!({"code": "3"})).await;
    for i in [5, 7] {
        assert!(reply.contains(&format!("[watched] 0: (SHOP::PRICE {i})")), "call {i}: {reply}");
        assert!(reply.contains(&format!("[watched] 0: SHOP::PRICE returned {}", i * 10)), "return {i}: {reply}");
    }
    for i in [1, 3, 4, 6, 8] {
        assert!(!reply.contains(&format!("(SHOP::PRICE {i})")), "call {i} was not asked for: {reply}");
    }
    let refused = agent
        .call_tool("trace", json!({"functions": ["shop::price", "shop::work"], "threads": "all", "condition": "t"}))
        .await;
    assert!(is_error(&refused) && text(&refused).contains("A condition watches one function"), "{refused}");
}

#[tokio::test]
async fn code_without_step_points_is_recompiled_for_stepping_and_put_back() {
    let image = common::private_image().await;
    let mut person = Person::connect(image.port).await;
    define_shop(&mut person).await;
    let directory = tempfile::tempdir().unwrap();
    let file = directory.path().join("tally.lisp");
    std::fs::write(&file, "(in-package :shop)\n\n(defun tally (a b)\n  (let ((s (+ a b)))\n    (* s 3)))\n").unwrap();
    let loaded = person.eval(&format!("(load (compile-file {:?}))", file.display().to_string()), "SHOP").await;
    assert!(loaded.starts_with("(:ok \"=> T"), "{loaded}");
    let mut agent = McpClient::start(&["--port", &image.port.to_string()]).await;
    agent.initialize().await;

    // Compiled at the default (debug 1): the step finds no step point and says how to get one.
    let stopped_at = |name: &'static str| format!("(sb-thread:make-thread (lambda () (tally 1 2)) :name \"{name}\")");
    tool(&mut agent, "debugger", json!({"action": "break", "function": "shop::tally", "hits": 1})).await;
    person.eval(&stopped_at("tally-1"), "SHOP").await;
    until_waits(&mut agent, "tally-1").await;
    let session = named_session(&tool(&mut agent, "evaluate-lisp", json!({"code": "1"})).await);
    let stepped = tool(&mut agent, "debugger", json!({"session": session, "action": "step_into"})).await;
    assert!(stepped.contains("No step was reached") && stepped.contains("recompile_debug"), "{stepped}");

    let recompiled =
        tool(&mut agent, "debugger", json!({"action": "recompile_debug", "function": "shop::tally"})).await;
    assert!(recompiled.contains(&format!("{}:3 with (debug 3)", file.display())), "{recompiled}");
    tool(&mut agent, "debugger", json!({"action": "break", "function": "shop::tally", "hits": 1})).await;
    person.eval(&stopped_at("tally-2"), "SHOP").await;
    until_waits(&mut agent, "tally-2").await;
    let session = named_session(&tool(&mut agent, "evaluate-lisp", json!({"code": "2"})).await);
    let stepped = tool(&mut agent, "debugger", json!({"session": session, "action": "step_into"})).await;
    assert!(stepped.contains("STEP-FORM-CONDITION") && stepped.contains("(+ A B)"), "{stepped}");
    tool(&mut agent, "debugger", json!({"session": session, "action": "continue"})).await;

    let restored =
        tool(&mut agent, "debugger", json!({"action": "recompile_restore", "function": "shop::tally"})).await;
    assert!(restored.contains("its file's own policy again"), "{restored}");
    assert!(person.eval("(tally 2 3)", "SHOP").await.starts_with("(:ok \"=> 15 "), "it still computes");
}

/// Issue 38.13: swank's sentinel thread, stopped in a debugger by an error closing a dead client's
/// socket (swank 2.27's flush of it fails as a broken pipe), never serves again; lisp-status says
/// so, with what to do. swank-mcp's own clients no longer cause it (its encapsulation of
/// CLOSE-CONNECTION% closes without the flush), so the test makes the close fail where the flush
/// did, after the server stopped serving the connection and before it forgot it.
#[tokio::test]
async fn a_sentinel_stuck_in_a_debugger_is_reported_by_lisp_status_with_what_to_do() {
    let image = common::private_image().await;
    let mut agent = McpClient::start(&["--port", &image.port.to_string()]).await;
    agent.initialize().await;
    let healthy = tool(&mut agent, "lisp-status", json!({})).await;
    assert!(!healthy.contains("sentinel"), "{healthy}");
    {
        let mut person = Person::connect(image.port).await;
        let broken_close = "(sb-int:encapsulate 'swank::close-connection% 'test-broken-pipe \
             (lambda (close connection &rest arguments) \
               (declare (ignore close arguments)) \
               (let ((*debugger-hook* nil)) \
                 (swank::stop-serving-requests connection) \
                 (error 'stream-error :stream (swank::connection.socket-io connection)))))";
        let encapsulated = person.eval(broken_close, "CL-USER").await;
        assert!(encapsulated.starts_with("(:ok \"=> #<FUNCTION"), "{encapsulated}");
    }
    until_waits(&mut agent, "Swank Sentinel").await;
    let status = tool(&mut agent, "lisp-status", json!({})).await;
    assert!(
        status.contains("Stuck server sentinel ")
            && status.contains("\"Swank Sentinel\" waits in the SLIME debugger, level 1 (STREAM-ERROR")
            && status.contains(
                "every new connection leaks two threads. Attach to it with the debugger tool and invoke ABORT"
            )
            && status.contains("docs/servers.md"),
        "{status}"
    );
}

/// Waits until the person's `form` reads `expected`, or fails naming `what` after 10 s.
async fn until_person_sees(person: &mut Person, form: &str, expected: &str, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = person.eval(form, "SHOP").await;
        if seen.starts_with(expected) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {form} is {seen}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_threads_stop_ends_when_its_breakpoint_goes_however_it_goes() {
    let image = common::private_image().await;
    let mut person = Person::connect(image.port).await;
    define_shop(&mut person).await;
    person.eval("(defvar *priced* '())", "SHOP").await;
    let start_worker = "(sb-thread:make-thread (lambda () (push (price 5) *priced*)) :name \"pricer\")";
    let mut agent = McpClient::start(&["--port", &image.port.to_string()]).await;
    agent.initialize().await;

    // unbreak: the thread waiting at the breakpoint goes on at once, and the reply says so.
    tool(&mut agent, "debugger", json!({"action": "break", "function": "shop::price"})).await;
    person.eval(start_worker, "SHOP").await;
    until_waits(&mut agent, "pricer").await;
    let reply = tool(&mut agent, "evaluate-lisp", json!({"code": "1"})).await;
    assert!(reply.contains("It waits at breakpoint 1"), "{reply}");
    assert_eq!(person.eval("*priced*", "SHOP").await, "(:ok \"=> NIL\")");
    let removed = tool(&mut agent, "debugger", json!({"action": "unbreak"})).await;
    assert!(removed.ends_with("The thread waiting at it went on."), "{removed}");
    until_person_sees(&mut person, "*priced*", "(:ok \"=> (50)", "the thread went on after unbreak").await;

    // swank-mcp killed while a thread waits at its breakpoint: the connection closes, its
    // session ends, and the thread goes on.
    tool(&mut agent, "debugger", json!({"action": "break", "function": "shop::price"})).await;
    person.eval(start_worker, "SHOP").await;
    until_waits(&mut agent, "pricer").await;
    let reply = tool(&mut agent, "evaluate-lisp", json!({"code": "1"})).await;
    assert!(reply.contains("It waits at breakpoint 2"), "{reply}");
    agent.child.kill().await.unwrap();
    until_person_sees(&mut person, "*priced*", "(:ok \"=> (50 50)", "the thread went on after the agent was killed")
        .await;
    assert_eq!(
        person.eval("(sb-int:encapsulated-p 'price 'mcp-agent-helper::mcp-agent-breakpoint)", "SHOP").await,
        "(:ok \"=> NIL\")"
    );

    // An agent that never comes back to a stop: the thread goes on after --debug-timeout.
    let mut agent = McpClient::start(&["--port", &image.port.to_string(), "--debug-timeout", "1s"]).await;
    agent.initialize().await;
    tool(&mut agent, "debugger", json!({"action": "break", "function": "shop::price"})).await;
    person.eval(start_worker, "SHOP").await;
    until_person_sees(&mut person, "*priced*", "(:ok \"=> (50 50 50)", "the thread went on after --debug-timeout")
        .await;
    let listed = tool(&mut agent, "debugger", json!({"action": "breakpoints"})).await;
    assert!(listed.contains("1 stop"), "{listed}");
}

#[tokio::test]
async fn a_stop_shows_the_functions_call_and_the_agents_code_there_is_the_agents() {
    let image = common::private_image().await;
    let mut person = Person::connect(image.port).await;
    define_shop(&mut person).await;
    // Compiled with the default policy, as most code is.
    person.eval("(progn (declaim (optimize (debug 1))) (defun tax (amount rate) (* amount rate)))", "SHOP").await;
    let mut agent = McpClient::start(&["--port", &image.port.to_string()]).await;
    agent.initialize().await;
    tool(&mut agent, "debugger", json!({"action": "break", "function": "shop::tax"})).await;
    person.eval("(sb-thread:make-thread (lambda () (tax 200 3)) :name \"taxer\")", "SHOP").await;
    until_waits(&mut agent, "taxer").await;
    // The notice of the stop and an attach to it are one session.
    let notice = tool(&mut agent, "evaluate-lisp", json!({"code": "1"})).await;
    let attached = tool(&mut agent, "debugger", json!({"action": "attach", "thread": "taxer"})).await;
    let session = session_of(&attached);
    assert_eq!(named_session(&notice), session, "{notice}");
    // The function's call is in the backtrace, its parameters are locals of its frame.
    let frame = frame_of(&attached, "SHOP::TAX");
    let read = tool(
        &mut agent,
        "debugger",
        json!({"session": session, "action": "eval_in_frame", "frame": frame, "code": "(list amount rate)"}),
    )
    .await;
    assert!(read.starts_with("=> (200 3)"), "{read}");

    // An exit is refused in the person's thread as anywhere else, and the image lives.
    let exit = agent
        .call_tool(
            "debugger",
            json!({"session": session, "action": "eval_in_frame", "frame": frame, "code": "(sb-ext:exit :abort t)"}),
        )
        .await;
    assert!(text(&exit).contains("EXIT-REFUSED"), "{exit}");
    // Code that never returns is cut at the call's time limit; the thread still waits there.
    let endless = agent
        .call_tool(
            "debugger",
            json!({"session": session, "action": "eval_in_frame", "frame": frame, "code": "(loop)", "timeout_ms": 500}),
        )
        .await;
    assert!(
        is_error(&endless) && text(&endless).contains("The thread still waits in its debugger, where it was."),
        "{endless}"
    );
    let again = tool(
        &mut agent,
        "debugger",
        json!({"session": session, "action": "eval_in_frame", "frame": frame, "code": "(* amount rate)"}),
    )
    .await;
    assert!(again.starts_with("=> 600"), "{again}");
    // A thread is named instead of a session: the action finds the session of its stop.
    let by_thread = tool(
        &mut agent,
        "debugger",
        json!({"thread": "taxer", "action": "eval_in_frame", "frame": frame, "code": "amount"}),
    )
    .await;
    assert!(
        by_thread.starts_with("=> 200") && by_thread.contains(&format!("Session {session} still waits")),
        "{by_thread}"
    );
    tool(&mut agent, "debugger", json!({"session": session, "action": "continue"})).await;
    // The stop is gone, and so is its session: an action for it does nothing, at once.
    let started = std::time::Instant::now();
    let stale = agent.call_tool("debugger", json!({"session": session, "action": "backtrace"})).await;
    assert!(is_error(&stale) && started.elapsed() < Duration::from_secs(5), "{stale}");
    assert!(person.eval("(+ 40 2)", "SHOP").await.starts_with("(:ok \"=> 42"), "the person's image lives");
}

#[tokio::test]
async fn a_breakpoints_condition_is_the_agents_code_and_the_images_machinery_never_stops() {
    let (_image, mut person, mut agent) = shop_and_agent().await;
    for function in ["format", "print-object", "sb-thread:make-thread", "sb-thread:grab-mutex", "swank::send"] {
        let refused = agent.call_tool("debugger", json!({"action": "break", "function": function})).await;
        assert!(is_error(&refused) && text(&refused).contains("is refused"), "{function}: {refused}");
    }
    // Conditions that exit, never return, warn or exhaust the stack are false, counted, and
    // reach neither the person's thread nor their debugger.
    for (condition, qty) in [
        ("(progn (sb-ext:exit :abort t) t)", 1),
        ("(loop)", 2),
        ("(progn (warn \"odd ~A\" qty) t)", 3),
        ("(labels ((deep (n) (1+ (deep n)))) (deep qty))", 4),
    ] {
        tool(&mut agent, "debugger", json!({"action": "break", "function": "shop::price", "condition": condition}))
            .await;
        let call = format!("(sb-thread:join-thread (sb-thread:make-thread (lambda () (price {qty}))))");
        let priced = person.eval(&call, "SHOP").await;
        assert!(priced.starts_with(&format!("(:ok \"=> {}", qty * 10)), "{condition}: {priced}");
        let listed = tool(&mut agent, "debugger", json!({"action": "breakpoints"})).await;
        assert!(listed.contains("its condition failed once (taken as false)"), "{condition}: {listed}");
        tool(&mut agent, "debugger", json!({"action": "unbreak"})).await;
    }
    assert!(!person.unread.iter().any(|message| message.starts_with("(:debug ")), "{:?}", person.unread);
}

#[tokio::test]
async fn replies_go_to_whoever_asked_when_the_person_and_the_agent_use_one_request_id() {
    let (_image, mut person, mut agent) = shop_and_agent().await;
    person.eval("(sb-thread:make-thread (lambda () (work \"9\")) :name \"shared-worker\")", "SHOP").await;
    let debug = person.told("(:debug ").await;
    let thread: u64 = debug["(:debug ".len()..].split(' ').next().unwrap().parse().unwrap();
    let attached = tool(&mut agent, "debugger", json!({"action": "attach", "thread": "shared-worker"})).await;
    let session = session_of(&attached);
    let frame = frame_of(&attached, "SHOP::PRICE");

    // Before each of the agent's evaluations in a frame of the thread, the person's SLDB asks
    // the same thread for its restarts with every id the agent's requests may carry; their
    // requests of one id then wait in the thread's mailbox together.
    const IDS: u32 = 90;
    for n in 0..8 {
        for id in 1..=IDS {
            person.send(&format!("(:emacs-rex (swank:debugger-info-for-emacs 0 1) \"SHOP\" {thread} {id})")).await;
        }
        let code = format!("(list :agent {n} qty)");
        let agent_asks = agent.call_tool(
            "debugger",
            json!({"session": session, "action": "eval_in_frame", "frame": frame, "code": code}),
        );
        // Read as they come, as Emacs does: the thread sends every reply through the person's
        // connection, the agent's too.
        let person_reads = async {
            let mut answered = std::collections::BTreeSet::new();
            while answered.len() < IDS as usize {
                let message = person.told("(:return ").await;
                let id: u32 = message.trim_end_matches(')').rsplit(' ').next().unwrap().parse().unwrap();
                assert!(message.starts_with("(:return (:ok ((\"The value"), "the person's reply {id}: {message}");
                assert!(answered.insert(id), "a second reply for {id}");
            }
        };
        let (answer, ()) = tokio::join!(agent_asks, person_reads);
        assert!(text(&answer).starts_with(&format!("=> (:AGENT {n} \"9\")")), "the agent's reply {n}: {answer}");
    }
}

#[tokio::test]
async fn an_abort_that_ends_the_persons_thread_says_so_and_a_stop_is_told_once() {
    let (_image, mut person, mut agent) = shop_and_agent().await;
    assert_eq!(tool(&mut agent, "evaluate-lisp", json!({"code": "(+ 1 2)"})).await, "=> 3");
    person.eval("(sb-thread:make-thread (lambda () (work \"5\")) :name \"doomed-worker\")", "SHOP").await;
    person.told("(:debug ").await;
    // Acted on by its name, with no attach first.
    let frames = tool(&mut agent, "debugger", json!({"thread": "doomed-worker", "action": "backtrace"})).await;
    assert!(frames.contains("SHOP::PRICE"), "{frames}");
    let aborted = tool(&mut agent, "debugger", json!({"thread": "doomed-worker", "action": "abort"})).await;
    assert!(aborted.contains("has ended (an ABORT of a thread ends it"), "{aborted}");
    // The stop the agent acted on is not told again, nor as waiting.
    let reply = tool(&mut agent, "evaluate-lisp", json!({"code": "(+ 2 2)"})).await;
    assert_eq!(reply, "=> 4");

    // A stop the person ends in their own SLDB is no session any more.
    person.eval("(sb-thread:make-thread (lambda () (work \"6\")) :name \"second-worker\")", "SHOP").await;
    let debug = person.told("(:debug ").await;
    let thread: u64 = debug["(:debug ".len()..].split(' ').next().unwrap().parse().unwrap();
    let reply = tool(&mut agent, "evaluate-lisp", json!({"code": "(+ 3 3)"})).await;
    let session = named_session(&reply);
    let status = tool(&mut agent, "lisp-status", json!({})).await;
    assert!(status.contains(&format!("Debugger session {session}")), "{status}");
    person.send(&format!("(:emacs-rex (swank:sldb-abort) \"SHOP\" {thread} 900)")).await;
    person.told("(:debug-return ").await;
    // The debug-return is sent while the thread unwinds out of its debugger: it may still read as
    // waiting there for a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = tool(&mut agent, "lisp-status", json!({})).await;
        if !status.contains(&format!("Debugger session {session}")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn after_a_fix_the_frames_that_still_run_or_hold_the_old_definition_are_named() {
    let image = common::private_image().await;
    let mut person = Person::connect(image.port).await;
    define_shop(&mut person).await;
    person
        .eval(
            "(progn (defun line-total (line) (* (first line) (second line))) \
               (defun invoice-total (lines fn) (let ((sum 0)) (dolist (line lines sum) (incf sum (funcall fn line))))) \
               t)",
            "SHOP",
        )
        .await;
    let mut agent = McpClient::start(&["--port", &image.port.to_string()]).await;
    agent.initialize().await;
    person
        .eval(
            "(sb-thread:make-thread (lambda () (invoice-total '((2 3) (1 \"4\")) #'line-total)) :name \"invoicer\")",
            "SHOP",
        )
        .await;
    person.told("(:debug ").await;
    let attached = tool(&mut agent, "debugger", json!({"action": "attach", "thread": "invoicer"})).await;
    assert!(!attached.contains("[Older definitions]"), "nothing is replaced yet: {attached}");
    tool(
        &mut agent,
        "evaluate-lisp",
        json!({"code": "(defun line-total (line) (* (first line) (let ((n (second line))) (if (stringp n) (parse-integer n) n))))",
               "package": "SHOP"}),
    )
    .await;
    let frames = tool(&mut agent, "debugger", json!({"thread": "invoicer", "action": "backtrace"})).await;
    let line_total = frame_of(&frames, "SHOP::LINE-TOTAL");
    let invoice_total = frame_of(&frames, "SHOP::INVOICE-TOTAL");
    assert!(
        frames.contains(&format!(
            "[Older definitions]\nFrame {line_total} runs the definition of SHOP::LINE-TOTAL from before its last \
             redefinition: restart_frame {line_total} calls the current one."
        )) && frames.contains(&format!(
            "Frame {invoice_total} holds the definition of SHOP::LINE-TOTAL from before its last redefinition in FN: \
             it calls the old code"
        )),
        "{frames}"
    );
    // The frame's source is the file's text now, which is not what it runs: said.
    let frame =
        tool(&mut agent, "debugger", json!({"thread": "invoicer", "action": "frame", "frame": line_total})).await;
    assert!(frame.contains("(The frame runs the definition from before the function's last redefinition"), "{frame}");
}

#[tokio::test]
async fn after_uninstall_the_persons_errors_go_to_the_person() {
    let (_image, mut person, mut agent) = shop_and_agent().await;
    assert_eq!(tool(&mut agent, "evaluate-lisp", json!({"code": "(+ 1 2)"})).await, "=> 3");
    // Once the image has the note of the call's end, the agent's server has nothing more to send,
    // and will not connect again on its own after its connection closes.
    until_person_sees(
        &mut person,
        "(if (find-if (lambda (record) (member (mcp-agent-helper::record-state record) '(:waiting :running))) \
                      mcp-agent-helper::*activity*) :running :idle)",
        "(:ok \"=> :IDLE",
        "the agent's call to be recorded as ended",
    )
    .await;
    // The person uninstalls from their REPL; refused while a call of the agent's server runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let uninstalled = person.eval("(getf (mcp-agent-helper:uninstall) :sessions)", "SHOP").await;
        if uninstalled.starts_with("(:ok \"=> 1") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{uninstalled}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The agent's server is still running, its connection closed: without the helper, swank
    // would take it for the newest, and the person's error would go there. Its server may connect
    // again at once, for a note of its last call still on its way: it then loads the helper
    // again and installs its footprint, which sends the person's errors to the person as before
    // the uninstall.
    until_person_sees(
        &mut person,
        "(let ((helper (find-package :mcp-agent-helper))) \
           (if (or (= (length swank::*connections*) 1) \
                   (and helper (symbol-value (find-symbol \"*FOOTPRINT-INSTALLED*\" helper)))) \
               :settled :closing))",
        "(:ok \"=> :SETTLED",
        "the agents' connections to close",
    )
    .await;
    person.eval("(sb-thread:make-thread (lambda () (work \"7\")) :name \"after-uninstall\")", "SHOP").await;
    let debug = person.told("(:debug ").await;
    assert!(debug.contains("after-uninstall") || debug.contains("is not of type"), "{debug}");
    // The agent's next call connects again, and installs the helper again.
    assert_eq!(tool(&mut agent, "evaluate-lisp", json!({"code": "(+ 2 2)"})).await.lines().last().unwrap(), "=> 4");
}
