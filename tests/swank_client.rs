//! The swank client against a real SBCL + cl-swank image.

mod common;

use std::time::{Duration, Instant};

use swank_mcp::swank::{ConnectOptions, Connection, Dialect, Endpoint, Form, Protocol, RexError, Sexp, Thread};

fn options() -> ConnectOptions {
    ConnectOptions { connect_timeout: Duration::from_secs(5), secret: None, protocol: Protocol::Auto }
}

async fn connect(port: u16) -> Connection {
    Connection::connect(Endpoint { host: "127.0.0.1".into(), port }, &options()).await.expect("connects")
}

async fn thread_count(connection: &Connection) -> i64 {
    let form = Form::call("cl", "length", [Form::call("sb-thread", "list-all-threads", [])]);
    connection.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap().as_i64().unwrap()
}

#[tokio::test]
async fn identifies_the_server() {
    let connection = connect(common::shared_image_port()).await;
    let info = connection.info();
    assert_eq!(info.dialect, Dialect::Swank);
    assert_eq!(info.lisp_type.as_deref(), Some("SBCL"));
    assert!(info.version.is_some());
    assert!(info.pid.is_some());
    assert_eq!(info.style.as_deref(), Some("spawn"));
}

#[tokio::test]
async fn evaluates_and_reads_the_reply() {
    let connection = connect(common::shared_image_port()).await;
    let reply = connection
        .rex(Form::call("cl", "+", [Form::Integer(1), Form::Integer(2)]), "COMMON-LISP-USER", Thread::New)
        .await;
    assert_eq!(reply.unwrap(), Sexp::Integer(3));
    let text = "λ \"quoted\" \\ back\nslash 🎉";
    let reply =
        connection.rex(Form::call("cl", "identity", [Form::string(text)]), "COMMON-LISP-USER", Thread::New).await;
    assert_eq!(reply.unwrap(), Sexp::String(text.into()));
}

#[tokio::test]
async fn requests_run_concurrently_and_replies_find_their_callers() {
    let connection = connect(common::shared_image_port()).await;
    let started = Instant::now();
    let calls = (0..8).map(|i| {
        let connection = connection.clone();
        async move {
            // Longer sleeps for earlier requests, so the replies come back in reverse order.
            let form = Form::call(
                "cl",
                "progn",
                [
                    Form::call("cl", "sleep", [Form::call("cl", "/", [Form::Integer(8 - i), Form::Integer(16)])]),
                    Form::Integer(i),
                ],
            );
            connection.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap()
        }
    });
    let replies = futures::future::join_all(calls).await;
    assert_eq!(replies, (0..8).map(Sexp::Integer).collect::<Vec<_>>());
    assert!(started.elapsed() < Duration::from_secs(3), "ran one after another: {:?}", started.elapsed());
}

#[tokio::test]
async fn a_thread_in_the_debugger_is_unwound_and_its_request_reports_why() {
    // Counts threads, so it needs an image no other test uses at the same time.
    let image = common::private_image().await;
    let connection = connect(image.port).await;
    let before = thread_count(&connection).await;
    let reply = connection
        .rex(Form::call("cl", "error", [Form::string("boom ~a"), Form::Integer(7)]), "COMMON-LISP-USER", Thread::New)
        .await;
    match reply {
        Err(RexError::Aborted { debugger: Some(report), .. }) => {
            assert_eq!(report.condition, "boom 7");
            assert!(report.condition_type.contains("SIMPLE-ERROR"), "{report:?}");
            assert!(!report.frames.is_empty());
        }
        other => panic!("expected an aborted request with a debugger report, got {other:?}"),
    }
    // The worker left the debugger: no thread is left behind. Each count is a request of its
    // own thread, whose predecessor may still be ending on a loaded machine: counted until one
    // sees the image as before, within a bound no quiet run comes near.
    let deadline = Instant::now() + Duration::from_secs(30);
    while thread_count(&connection).await > before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(thread_count(&connection).await <= before);
}

#[tokio::test]
async fn a_request_the_server_cannot_read_fails_alone() {
    let connection = connect(common::shared_image_port()).await;
    let reply = connection.rex(Form::call("swank", "no-such-function-here", []), "COMMON-LISP-USER", Thread::New).await;
    assert!(
        matches!(&reply, Err(RexError::ReaderError(message)) if message.contains("NO-SUCH-FUNCTION-HERE")),
        "{reply:?}"
    );
    // The connection is still good.
    let reply = connection
        .rex(Form::call("cl", "+", [Form::Integer(2), Form::Integer(2)]), "COMMON-LISP-USER", Thread::New)
        .await;
    assert_eq!(reply.unwrap(), Sexp::Integer(4));
}

#[tokio::test]
async fn pending_requests_fail_at_once_when_the_image_dies() {
    let image = common::private_image().await;
    let port = image.port;
    let connection = connect(port).await;
    let pending = {
        let connection = connection.clone();
        tokio::spawn(async move {
            connection.rex(Form::call("cl", "sleep", [Form::Integer(30)]), "COMMON-LISP-USER", Thread::New).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    drop(image);
    let reply = pending.await.unwrap();
    assert!(killed.elapsed() < Duration::from_secs(2), "took {:?}", killed.elapsed());
    match reply {
        Err(RexError::ConnectionLost { endpoint, .. }) => assert_eq!(endpoint.port, port),
        other => panic!("expected a lost connection, got {other:?}"),
    }
    assert!(connection.is_closed());
    let message = connection.rex(Form::Nil, "COMMON-LISP-USER", Thread::New).await.unwrap_err().to_string();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
}

#[tokio::test]
async fn connecting_to_nothing_is_a_clear_error() {
    let port = common::dead_port();
    let error = Connection::connect(Endpoint { host: "127.0.0.1".into(), port }, &options()).await.err().unwrap();
    assert!(error.to_string().contains(&format!("127.0.0.1:{port}")), "{error}");
}

/// The global values a user's image must keep whatever swank-mcp loads or evaluates.
const IMAGE_STATE: &str = "(cl:list cl:*package* cl:*readtable* cl:*print-case* cl:*print-pretty* cl:*print-circle* \
     cl:*read-eval* cl:*print-length* cl:*debugger-hook* cl:*standard-output* cl:*error-output* \
     (cl:length cl:*features*) (cl:length (cl:list-all-packages)))";

async fn image_state(connection: &Connection) -> String {
    let form = Form::call(
        "cl",
        "prin1-to-string",
        [Form::call("cl", "eval", [Form::call("cl", "read-from-string", [Form::string(IMAGE_STATE)])])],
    );
    connection.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap().as_str().unwrap().to_string()
}

#[tokio::test]
async fn the_helper_changes_nothing_global_in_the_image() {
    let image = common::private_image().await;
    let connection = connect(image.port).await;
    let before = image_state(&connection).await;
    let toolbox = common::toolbox(image.port);
    for code in ["(+ 1 2)", "(in-package :cl-user)", "(error \"x\")", "(print 1)", "(warn \"w\")"] {
        toolbox.call("evaluate-lisp", Some(serde_json::json!({ "code": code })), Default::default()).await.unwrap();
    }
    let after = image_state(&connection).await;
    // One package more (the helper's own) and nothing else.
    let count = |state: &str| state.rsplit(' ').next().unwrap().trim_end_matches(')').parse::<i64>().unwrap();
    assert_eq!(count(&after), count(&before) + 1, "{before}\n{after}");
    let without_count = |state: &str| state.rsplit_once(' ').unwrap().0.to_string();
    assert_eq!(without_count(&after), without_count(&before));
}

#[tokio::test]
async fn the_helper_is_loaded_once_and_reloaded_when_its_version_differs() {
    let image = common::private_image().await;
    let connection = connect(image.port).await;
    let version = || {
        let connection = connection.clone();
        async move {
            let form = Form::call(
                "cl",
                "symbol-value",
                [Form::call("cl", "find-symbol", [Form::string("*VERSION*"), Form::string("MCP-AGENT-HELPER")])],
            );
            connection.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap()
        }
    };
    let eval = |port| async move {
        common::toolbox(port)
            .call("evaluate-lisp", Some(serde_json::json!({"code": "(+ 20 22)"})), Default::default())
            .await
            .unwrap()
            .text
    };
    assert_eq!(eval(image.port).await, "=> 42");
    let loaded = version().await;
    assert!(matches!(&loaded, Sexp::String(v) if v.len() == 16), "{loaded}");
    // A new connection with the same revision does not reload: a DEFPARAMETER of the helper keeps
    // the value set after loading.
    let max_frames = || {
        Form::call(
            "cl",
            "symbol-value",
            [Form::call("cl", "find-symbol", [Form::string("*MAX-FRAMES*"), Form::string("MCP-AGENT-HELPER")])],
        )
    };
    let set_max_frames = Form::call("cl", "setf", [max_frames(), Form::Integer(99)]);
    connection.rex(set_max_frames, "COMMON-LISP-USER", Thread::New).await.unwrap();
    assert_eq!(eval(image.port).await, "=> 42");
    assert_eq!(connection.rex(max_frames(), "COMMON-LISP-USER", Thread::New).await.unwrap(), Sexp::Integer(99));
    // Another revision in the image (as an older swank-mcp would leave) is replaced.
    let stale = Form::call(
        "cl",
        "setf",
        [
            Form::call(
                "cl",
                "symbol-value",
                [Form::call("cl", "find-symbol", [Form::string("*VERSION*"), Form::string("MCP-AGENT-HELPER")])],
            ),
            Form::string("stale"),
        ],
    );
    connection.rex(stale, "COMMON-LISP-USER", Thread::New).await.unwrap();
    assert_eq!(eval(image.port).await, "=> 42");
    assert_eq!(version().await, loaded);
    assert_eq!(connection.rex(max_frames(), "COMMON-LISP-USER", Thread::New).await.unwrap(), Sexp::Integer(20));
}
