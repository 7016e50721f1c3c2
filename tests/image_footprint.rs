//! What swank-mcp keeps and changes in the user's image, checked in the image itself: a session's
//! state lives in one object, made once however its first calls race and gone once it ends; the
//! footprint (encapsulations, hooks, threads, package) comes out with `swank-mcp uninstall` and
//! goes back in with the next call; two swank-mcp versions attached to one image never run each
//! other's helper; and, with SLY's sources at hand, a helper loaded through slynk in an image that
//! has swank too uses slynk's parts.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use common::McpClient;
use swank_mcp::image::helper::{Gate, Helper, HELPER_SOURCE};
use swank_mcp::image::Entry;
use swank_mcp::swank::{ConnectOptions, Connection, Endpoint, Form, Protocol, Thread};
use swank_mcp::tools::Toolbox;

/// A connection of the tests' own, which loads no helper.
async fn raw_connection(port: u16) -> Connection {
    let options = ConnectOptions { connect_timeout: Duration::from_secs(5), secret: None, protocol: Protocol::Auto };
    Connection::connect(Endpoint { host: "127.0.0.1".into(), port }, &options).await.expect("the image answers")
}

/// What SBCL answers to `code`, printed on one line from the COMMON-LISP package, asked over
/// `connection` without the helper.
async fn ask(connection: &Connection, code: &str) -> String {
    let printed = format!(
        "(let ((value {code})) (let ((*package* (find-package \"COMMON-LISP\")) (*print-pretty* nil)) (prin1-to-string value)))"
    );
    let form = Form::call("cl", "eval", [Form::call("cl", "read-from-string", [Form::string(printed)])]);
    let reply = connection.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap_or_else(|e| panic!("{code}: {e}"));
    reply.as_str().unwrap_or_else(|| panic!("{code}: {reply}")).to_string()
}

/// Asks `code` until it answers `expected`, for what the image does just after a reply (a closed
/// connection's hooks, threads ending).
async fn settle(connection: &Connection, code: &str, expected: &str) {
    let mut answer = String::new();
    for _ in 0..100 {
        answer = ask(connection, code).await;
        if answer == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{code} answers {answer}, not {expected}");
}

/// Runs the `swank-mcp` binary on the image at `port`: whether it succeeded, and its stdout and
/// stderr.
async fn swank_mcp(port: u16, args: &[&str]) -> (bool, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--port", &port.to_string()])
        .args(args)
        .output()
        .await
        .expect("swank-mcp runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// The text of a successful evaluate-lisp of `code` through the binary.
async fn evaluate(client: &mut McpClient, code: &str) -> String {
    let reply = client.call_tool("evaluate-lisp", json!({ "code": code })).await;
    assert!(!common::is_error(&reply), "{code}: {reply}");
    common::text(&reply).to_string()
}

fn session_of(toolbox: &Arc<Toolbox>) -> String {
    toolbox.images()[0].session().to_string()
}

// ---------------------------------------------------------------------------------------------
// Sessions

#[tokio::test]
async fn two_first_calls_of_a_new_session_at_once_keep_both_calls_state() {
    let image = common::private_image().await;
    let observer = common::toolbox(image.port);
    // Making a session is made slow, the first one slower: two first calls that each made one
    // would both find none, and the first, finishing last, would put its own in place of the
    // second's.
    common::eval_ok(
        &observer,
        "(let ((made 0))
           (sb-int:encapsulate 'mcp-agent-helper::new 'slow-sessions
             (lambda (new class &rest initargs)
               (when (eq class 'mcp-agent-helper::session)
                 (sleep (if (= 1 (incf made)) 0.8 0.3)))
               (apply new class initargs))))",
    )
    .await;
    let toolbox = common::toolbox(image.port);
    let session = session_of(&toolbox);
    let first = common::call(&toolbox, "evaluate-lisp", json!({"code": "(list :first-call)"}));
    let second = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        common::call(
            &toolbox,
            "evaluate-lisp",
            json!({"code": "(defpackage :second-call (:use :cl)) (in-package :second-call)"}),
        )
        .await
    };
    let (first, second) = tokio::join!(first, second);
    assert!(!first.is_error && !second.is_error, "{}\n{}", first.text, second.text);
    common::eval_ok(&observer, "(sb-int:unencapsulate 'mcp-agent-helper::new 'slow-sessions)").await;
    // Both values got their handle in the one session, and the package the second moved to is
    // the session's.
    assert_eq!(common::eval_ok(&observer, &format!("(mcp-agent-helper:handle-count {session:?})")).await, "=> 2");
    assert_eq!(
        common::without_handle(&common::eval_ok(&toolbox, "(package-name *package*)").await),
        "=> \"SECOND-CALL\""
    );
}

/// Makes `session`'s state: a handle, a traced function called, an agent thread still running
/// (with output in the background buffer), a tool the user allowed in Emacs.
const SESSION_WORK: [&str; 4] = [
    "(defun footprint-traced (x) (list x))",
    "(footprint-traced 1)",
    "(sb-thread:make-thread (lambda () (princ \"from a thread\") (sleep 600)) :name \"footprint agent thread\")",
    "(mcp-agent-helper:allow-for-session \"load-file\" \"tests\"
       :session (mcp-agent-helper::session-name mcp-agent-helper::*agent-session*))",
];

/// What is left in the image of the session named `name`, as the image's own tables say: `(NIL 0
/// NIL 0 NIL)` when nothing.
fn leftovers(name: &str) -> String {
    format!(
        "(list (gethash {name:?} mcp-agent-helper::*sessions*)
               (mcp-agent-helper:handle-count {name:?})
               (member 'cl-user::footprint-traced (trace))
               (loop for session being the hash-values of mcp-agent-helper::*agent-threads*
                     count (equal (mcp-agent-helper::session-name session) {name:?}))
               (mcp-agent-helper:revoke-session-allowances))"
    )
}

#[tokio::test]
async fn nothing_of_a_session_remains_once_it_ends_or_its_connection_closes() {
    let image = common::private_image().await;
    let raw = raw_connection(image.port).await;

    // Ended by its server, as one that exits does.
    let toolbox = common::toolbox(image.port);
    let name = session_of(&toolbox);
    for (i, code) in SESSION_WORK.iter().enumerate() {
        if i == 1 {
            let traced = common::call(&toolbox, "trace", json!({"functions": ["footprint-traced"]})).await;
            assert!(!traced.is_error, "{}", traced.text);
        }
        common::eval_ok(&toolbox, code).await;
    }
    assert_ne!(ask(&raw, &leftovers(&name)).await, "(NIL 0 NIL 0 NIL)");
    toolbox.end_sessions().await;
    assert_eq!(ask(&raw, &leftovers(&name)).await, "(NIL 0 NIL 0 NIL)");

    // Ended when its client went away: the server's connection-closed hook.
    let mut client = McpClient::for_port(image.port).await;
    client.initialize().await;
    let name = evaluate(&mut client, "(mcp-agent-helper::session-name mcp-agent-helper::*agent-session*)").await;
    let name = common::without_handle(&name).trim_start_matches("=> ").trim_matches('"').to_string();
    for code in SESSION_WORK {
        evaluate(&mut client, code).await;
    }
    let traced = client.call_tool("trace", json!({"functions": ["footprint-traced"]})).await;
    assert!(!common::is_error(&traced), "{traced}");
    assert_ne!(ask(&raw, &leftovers(&name)).await, "(NIL 0 NIL 0 NIL)");
    client.child.kill().await.unwrap();
    settle(&raw, &leftovers(&name), "(NIL 0 NIL 0 NIL)").await;
}

// ---------------------------------------------------------------------------------------------
// Uninstalling

/// Defines, in CL-USER, what the footprint changes as it is before swank-mcp's first call, and
/// CHANGED-SINCE-START, which lists what differs from that. A function's SYMBOL-FUNCTION is what
/// its callers call: its encapsulation while it has one (FDEFINITION would look through it).
const RECORD_THE_IMAGE: &str = "(progn
  (defparameter *footprint-functions*
    (remove nil (list (find-symbol \"START-THREAD\" \"SB-THREAD\") 'sb-ext:exit 'sb-ext:make-timer
                      'sb-thread:interrupt-thread 'sb-ext:finalize (find-symbol \"RUN-EXPIRED-TIMERS\" \"SB-IMPL\")
                      (find-symbol \"CALL-HOOKS\" \"SB-INT\") (find-symbol \"%DEFMACRO\" \"SB-C\") (find-symbol \"LOAD-DEFMETHOD\" \"SB-PCL\")
                      (find-symbol \"LOAD-DEFCLASS\" \"SB-PCL\") (find-symbol \"DEFAULT-CONNECTION\" \"SWANK\")
                      (find-symbol \"INVOKE-SLIME-DEBUGGER\" \"SWANK\") (find-symbol \"DISPATCH-EVENT\" \"SWANK\")
                      (find-symbol \"CLOSE-CONNECTION%\" \"SWANK\"))))
  (defparameter *definitions-before* (mapcar #'symbol-function *footprint-functions*))
  (defparameter *hooks* (list 'sb-int:*setf-fdefinition-hook* (find-symbol \"*CONNECTION-CLOSED-HOOK*\" \"SWANK\")))
  (defparameter *hooks-before* (mapcar (lambda (hook) (copy-list (symbol-value hook))) *hooks*))
  (defun changed-since-start ()
    (append (loop for function in *footprint-functions*
                  for before in *definitions-before*
                  unless (eq (symbol-function function) before) collect function)
            (loop for hook in *hooks*
                  for before in *hooks-before*
                  unless (equal (symbol-value hook) before) collect hook)
            (and (find-package \"MCP-AGENT-HELPER\") '(:package))
            (and (find \"swank-mcp worker\" (sb-thread:list-all-threads) :key #'sb-thread:thread-name :test #'equal)
                 '(:workers))))
  (length *footprint-functions*))";

const EVERYTHING_INSTALLED: &str = "(SB-THREAD::START-THREAD SB-EXT:EXIT SB-EXT:MAKE-TIMER SB-THREAD:INTERRUPT-THREAD \
     SB-EXT:FINALIZE SB-IMPL::RUN-EXPIRED-TIMERS SB-INT:CALL-HOOKS SB-C::%DEFMACRO SB-PCL::LOAD-DEFMETHOD SB-PCL::LOAD-DEFCLASS \
     SWANK::DEFAULT-CONNECTION SWANK:INVOKE-SLIME-DEBUGGER SWANK::DISPATCH-EVENT SWANK::CLOSE-CONNECTION% \
     SB-INT:*SETF-FDEFINITION-HOOK* SWANK::*CONNECTION-CLOSED-HOOK* :PACKAGE)";

#[tokio::test]
async fn uninstall_takes_every_change_out_and_the_next_call_installs_again() {
    let image = common::private_image().await;
    let raw = raw_connection(image.port).await;
    assert_eq!(ask(&raw, RECORD_THE_IMAGE).await, "14", "this SBCL has every function the helper encapsulates");
    assert_eq!(ask(&raw, "(changed-since-start)").await, "NIL");

    let (ok, out) = swank_mcp(image.port, &["eval", "(+ 1 2)"]).await;
    assert!(ok && out.starts_with("=> 3"), "{out}");
    // The command's connection has closed, and its worker threads with it.
    settle(&raw, "(changed-since-start)", EVERYTHING_INSTALLED).await;

    let (ok, out) = swank_mcp(image.port, &["uninstall"]).await;
    assert!(ok, "{out}");
    for taken_out in [
        "the encapsulation of SB-THREAD::START-THREAD",
        "the encapsulation of SB-EXT:EXIT",
        "a function on SWANK::*CONNECTION-CLOSED-HOOK*",
        "The package MCP-AGENT-HELPER was deleted",
    ] {
        assert!(out.contains(taken_out), "{taken_out}: {out}");
    }
    assert_eq!(ask(&raw, "(changed-since-start)").await, "NIL");

    let (ok, out) = swank_mcp(image.port, &["eval", "(+ 1 2)"]).await;
    assert!(ok && out.starts_with("=> 3"), "{out}");
    settle(&raw, "(changed-since-start)", EVERYTHING_INSTALLED).await;

    // A server attached meanwhile loses its session and its worker threads, and its next call
    // installs the helper again.
    let toolbox = common::toolbox(image.port);
    common::eval_ok(&toolbox, "(list :attached)").await;
    assert!(swank_mcp(image.port, &["uninstall"]).await.0);
    assert_eq!(ask(&raw, "(changed-since-start)").await, "NIL");
    // Its connection was closed, so that the person's errors go to the person: the reply says
    // what it cannot tell apart, an uninstall from a restart in place.
    let again = common::eval_ok(&toolbox, "(+ 1 2)").await;
    assert!(
        again.ends_with("\n\n=> 3")
            && again.contains("holds no swank-mcp helper any more: its helper was uninstalled (swank-mcp uninstall), or it was restarted in place"),
        "{again}"
    );
    let with_its_worker = format!("{} :WORKERS)", EVERYTHING_INSTALLED.trim_end_matches(')'));
    settle(&raw, "(changed-since-start)", &with_its_worker).await;

    // A second uninstall finds it again; a third finds nothing to take out.
    assert!(swank_mcp(image.port, &["uninstall"]).await.0);
    let (ok, out) = swank_mcp(image.port, &["uninstall"]).await;
    assert!(ok && out.contains("holds no swank-mcp helper"), "{out}");
}

#[tokio::test]
async fn uninstall_waits_for_running_calls_and_on_request_for_the_last_session() {
    let image = common::private_image().await;
    let raw = raw_connection(image.port).await;
    let toolbox = common::toolbox(image.port);
    common::eval_ok(&toolbox, "(+ 1 2)").await;

    let running = {
        let toolbox = toolbox.clone();
        tokio::spawn(async move { common::eval_ok(&toolbox, "(sleep 3) :slept").await })
    };
    settle(&raw, "(car mcp-agent-helper::*calls-running*)", "1").await;
    let (ok, out) = swank_mcp(image.port, &["uninstall"]).await;
    assert!(!ok && out.contains("1 swank-mcp call is running in the image, so nothing was changed"), "{out}");
    assert_eq!(running.await.unwrap(), "=> :SLEPT");

    let mut client = McpClient::for_port(image.port).await;
    client.initialize().await;
    assert_eq!(common::text(&client.call_tool("evaluate-lisp", json!({"code": "(+ 1 2)"})).await), "=> 3");
    let (ok, out) = swank_mcp(image.port, &["uninstall", "--when-sessions-end"]).await;
    assert!(ok && out.contains("when the last of the 2 swank-mcp sessions attached to it ends"), "{out}");
    toolbox.end_sessions().await;
    assert_eq!(ask(&raw, "(and (find-package \"MCP-AGENT-HELPER\") t)").await, "T");
    // The last session ends with its server.
    client.close_stdin();
    client.child.wait().await.unwrap();
    settle(&raw, "(find-package \"MCP-AGENT-HELPER\")", "NIL").await;
}

// ---------------------------------------------------------------------------------------------
// Two swank-mcp versions

#[tokio::test]
async fn another_swank_mcp_versions_helper_is_replaced_between_its_calls_and_never_under_them() {
    let image = common::private_image().await;
    // Another version: a helper whose text differs, sent as that version's swank-mcp would.
    let other = Helper::other(format!("{HELPER_SOURCE}\n;; the helper of another swank-mcp version\n"), "9.9.9-other");
    let connection = raw_connection(image.port).await;
    assert!(!other.load(&connection).await.unwrap(), "a fresh image held no helper");
    let call = |code: &str, token: &str| {
        let form = other.call(
            Gate::Call,
            Entry::EVALUATE,
            [
                Form::string(code),
                Form::Keyword("session"),
                Form::string("other-version"),
                Form::Keyword("token"),
                Form::string(token),
            ],
        );
        connection.rex(form, "COMMON-LISP-USER", Thread::New)
    };

    // While a call of the other version runs, this one may not replace its helper.
    let long = call("(sleep 3) :done-under-its-own-helper", "other-1");
    let attach = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        swank_mcp(image.port, &["eval", "(+ 1 2)"]).await
    };
    let (long, (ok, out)) = tokio::join!(long, attach);
    assert!(long.unwrap().to_string().contains(":DONE-UNDER-ITS-OWN-HELPER"));
    assert!(!ok, "{out}");
    for part in [
        format!("it holds the helper of swank-mcp 9.9.9-other (revision {})", other.digest()),
        "which is running 1 call there now".to_string(),
        format!("this is swank-mcp {} (revision {})", env!("CARGO_PKG_VERSION"), Helper::current().digest()),
        "attach one swank-mcp version to this image".to_string(),
    ] {
        assert!(out.contains(&part), "{part}: {out}");
    }

    // Between its calls, it is replaced; the other version's next call then runs nothing.
    let (ok, out) = swank_mcp(image.port, &["eval", "(+ 1 2)"]).await;
    assert!(ok && out.starts_with("=> 3"), "{out}");
    assert!(call("(+ 1 2)", "other-2").await.unwrap().is_keyword("other-helper"));

    // The other version loads its own again between this one's calls; this one's next call
    // finds that out, loads its own and runs.
    let toolbox = common::toolbox(image.port);
    common::eval_ok(&toolbox, "(+ 1 2)").await;
    assert!(other.load(&connection).await.unwrap());
    assert_eq!(
        common::without_handle(&common::eval_ok(&toolbox, "mcp-agent-helper::*release*").await),
        format!("=> {:?}", env!("CARGO_PKG_VERSION"))
    );
    let reply = call("(+ 1 2)", "other-3").await.unwrap();
    assert!(reply.is_keyword("other-helper"), "{reply}");
}

// ---------------------------------------------------------------------------------------------
// swank and slynk in one image

/// An image with Debian's swank and SLY's slynk loaded, serving slynk on a free port; it ends
/// with the returned child.
async fn image_with_swank_and_slynk(sly: &str) -> (tokio::process::Child, u16) {
    const SCRIPT: &str = "(load (sb-ext:posix-getenv \"SWANK_MCP_LOADER\"))
(funcall (read-from-string \"swank-loader:init\"))
(load (merge-pathnames \"slynk/slynk-loader.lisp\" (sb-ext:posix-getenv \"SWANK_MCP_SLY_DIR\")))
(funcall (read-from-string \"slynk-loader:init\"))
(format t \"~&slynk-port: ~D~%\" (funcall (read-from-string \"slynk:create-server\") :port 0 :dont-close t))
(finish-output)
";
    let mut child = tokio::process::Command::new("sbcl")
        .arg("--noinform")
        .env("SWANK_MCP_LOADER", common::swank_loader())
        .env("SWANK_MCP_SLY_DIR", format!("{}/", sly.trim_end_matches('/')))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("sbcl starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(SCRIPT.as_bytes()).await.unwrap();
    // Kept open: the image reads its REPL from it.
    std::mem::forget(stdin);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port = tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(port) = line.split("slynk-port: ").nth(1) {
                return port.trim().parse().unwrap();
            }
        }
        panic!("the image ended before slynk listened");
    })
    .await
    .expect("swank and slynk load within 5 minutes");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, port)
}

/// SLY is not packaged in Debian: point `SWANK_MCP_SLY_DIR` at a SLY checkout and run
/// `cargo test --test image_footprint -- --ignored`.
#[tokio::test]
#[ignore = "needs a SLY checkout in SWANK_MCP_SLY_DIR"]
async fn through_slynk_in_an_image_that_has_swank_too_the_helper_uses_slynks_parts() {
    let sly = std::env::var("SWANK_MCP_SLY_DIR").expect("SWANK_MCP_SLY_DIR names a SLY checkout");
    let (_image, port) = image_with_swank_and_slynk(&sly).await;
    let toolbox = common::toolbox(port);
    assert_eq!(
        common::eval_ok(&toolbox, "(list (and (find-package :swank) t) (and (find-package :slynk) t))").await,
        "=> (T T) @1"
    );

    // Each call starts slynk's count of its messages afresh: a worker serving one call after
    // another counts only the current call's, as a thread spawned for it would.
    for _ in 0..6 {
        assert_eq!(
            common::eval_ok(&toolbox, "(symbol-value (find-symbol \"*SEND-COUNTER*\" \"SLYNK\"))").await,
            "=> 0"
        );
    }
    // Both servers end a closed connection's sessions.
    assert_eq!(
        common::eval_ok(
            &toolbox,
            "(list (and (member 'mcp-agent-helper::connection-closed (symbol-value (find-symbol \"*CONNECTION-CLOSED-HOOK*\" \"SLYNK\"))) t)
                   (and (member 'mcp-agent-helper::connection-closed (symbol-value (find-symbol \"*CONNECTION-CLOSED-HOOK*\" \"SWANK\"))) t))"
        )
        .await,
        "=> (T T) @2"
    );
    // The debugger tool walks slynk's debugger's stack, through slynk's backend.
    let stopped =
        common::call(&toolbox, "evaluate-lisp", json!({"code": "(error \"through slynk\")", "debug": true})).await;
    assert!(stopped.text.starts_with("[DEBUGGER D"), "{}", stopped.text);
    assert!(stopped.text.contains("(ERROR \"through slynk\")"), "{}", stopped.text);
    let session = stopped.structured_value().unwrap()["debugger_session"].as_str().unwrap().to_string();
    let backtrace = common::call(&toolbox, "debugger", json!({"session": session, "action": "backtrace"})).await;
    assert!(backtrace.text.contains("(ERROR \"through slynk\")"), "{}", backtrace.text);
    let aborted = common::call(&toolbox, "debugger", json!({"session": session, "action": "abort"})).await;
    assert!(aborted.text.starts_with("[ERROR] EVALUATION-ABORTED"), "{}", aborted.text);

    // Uninstalling takes the helper off both servers' hooks.
    toolbox.end_sessions().await;
    let (ok, out) = swank_mcp(port, &["uninstall"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("SLYNK::*CONNECTION-CLOSED-HOOK*") && out.contains("SWANK::*CONNECTION-CLOSED-HOOK*"),
        "{out}"
    );
}
