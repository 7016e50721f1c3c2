//! Every wait of a call is bounded by its time limit and ends at once when the client cancels:
//! connecting and loading the helper included, against a server that stops answering and an
//! image whose world lock another thread holds. A connection that stopped working is dropped and
//! the next call opens a new one; an image that exits during a call is reported as gone.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use swank_mcp::image::{ImageSettings, LaunchSettings};
use swank_mcp::source::AllowedRoots;
use swank_mcp::swank::{ConnectOptions, Connection, Endpoint, Form, Protocol, Sexp, Thread};
use swank_mcp::tools::{ToolOutput, Toolbox};

/// Seconds a call may run past its time limit while an interrupted evaluation unwinds, or while
/// connecting and loading the helper; the documented unwind grace.
const GRACE: u64 = 3;

fn toolbox(images: &[(&str, u16)]) -> Arc<Toolbox> {
    let settings = images
        .iter()
        .map(|(name, port)| ImageSettings { name: name.to_string(), ..common::image_settings(*port) })
        .collect();
    Arc::new(Toolbox::new(common::settings(), settings, AllowedRoots::new(Vec::new()).unwrap()))
}

async fn eval(toolbox: &Arc<Toolbox>, arguments: Value) -> ToolOutput {
    toolbox.call("evaluate-lisp", Some(arguments), CancellationToken::new()).await.unwrap()
}

/// Runs an evaluation in a task of its own; returns its cancellation and its output with the time
/// it took.
fn spawn_eval(
    toolbox: &Arc<Toolbox>,
    arguments: Value,
) -> (CancellationToken, tokio::task::JoinHandle<(ToolOutput, Duration)>) {
    let (toolbox, cancel) = (toolbox.clone(), CancellationToken::new());
    let token = cancel.clone();
    let call = tokio::spawn(async move {
        let started = Instant::now();
        let output = toolbox.call("evaluate-lisp", Some(arguments), token).await.unwrap();
        (output, started.elapsed())
    });
    (cancel, call)
}

async fn read_frame(socket: &mut (impl AsyncReadExt + Unpin)) -> Option<String> {
    let mut header = [0u8; 6];
    socket.read_exact(&mut header).await.ok()?;
    let length = usize::from_str_radix(std::str::from_utf8(&header).ok()?, 16).ok()?;
    let mut payload = vec![0u8; length];
    socket.read_exact(&mut payload).await.ok()?;
    String::from_utf8(payload).ok()
}

/// What Debian's swank 2.27 answered to the connection-info request, as recorded, for request `id`.
fn recorded_connection_info(id: &str) -> String {
    let transcript =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/transcripts/swank-2.27.jsonl")).unwrap();
    let answer = transcript
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|frame| frame["dir"] == "s2c")
        .expect("the transcript records the handshake");
    let payload = answer["payload"].as_str().unwrap();
    let without_id = payload.strip_suffix(" 1)").expect("the recorded handshake is request 1");
    format!("{without_id} {id})")
}

/// A swank 2.27 server as far as the handshake: it answers connection-info as the recorded
/// server did, then reads every request and never answers again, as a server whose threads died
/// does. Returns its port and how many connections it accepted.
async fn server_that_stalls_after_the_handshake() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let Some(request) = read_frame(&mut socket).await else { return };
                assert!(request.contains("swank:connection-info"), "{request}");
                let id = request.trim_end_matches(')').rsplit(' ').next().unwrap().to_string();
                let answer = recorded_connection_info(&id);
                let _ = socket.write_all(format!("{:06x}{answer}", answer.len()).as_bytes()).await;
                while read_frame(&mut socket).await.is_some() {}
            });
        }
    });
    (port, accepted)
}

#[tokio::test]
async fn a_server_that_stops_answering_after_the_handshake_holds_a_call_no_longer_than_its_limit() {
    let (stalled_port, accepted) = server_that_stalls_after_the_handshake().await;
    let tb = toolbox(&[("stalled", stalled_port), ("live", common::shared_image_port())]);
    assert_eq!(eval(&tb, json!({"code": "(+ 1 2)", "image": "live"})).await.text, "=> 3");

    // The call ends at its own time limit (and the grace), saying where it was and what to do.
    let (_, stalled) = spawn_eval(&tb, json!({"code": "(+ 1 2)", "image": "stalled", "timeout_ms": 2000}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Meanwhile the other image answers at once.
    let started = Instant::now();
    assert_eq!(eval(&tb, json!({"code": "(+ 1 2)", "image": "live"})).await.text, "=> 3");
    assert!(started.elapsed() < Duration::from_secs(2), "the live image waited {:?}", started.elapsed());
    assert!(!stalled.is_finished(), "the stalled call ended before its time limit");
    let (output, elapsed) = stalled.await.unwrap();
    assert!(output.is_error, "{}", output.text);
    assert!(
        output.text.starts_with("The time limit of 2000 ms (and 3s of grace) passed while loading swank-mcp's helper into the Lisp image at")
            && output.text.contains("nothing was evaluated")
            && output.text.contains("Pass a larger timeout_ms"),
        "{}",
        output.text
    );
    assert!(
        elapsed >= Duration::from_millis(1900 + GRACE * 1000) && elapsed < Duration::from_secs(2 + GRACE + 5),
        "{elapsed:?}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // Two calls wait for the same new attempt, each within its own limits: one ends at its time
    // limit while the other waits on, and a cancellation ends the other at once.
    let (cancel, patient) = spawn_eval(&tb, json!({"code": "(+ 1 2)", "image": "stalled", "timeout_ms": 60000}));
    let (_, hasty) = spawn_eval(&tb, json!({"code": "(+ 1 2)", "image": "stalled", "timeout_ms": 1000}));
    let (output, elapsed) = hasty.await.unwrap();
    assert!(
        output.text.starts_with("The time limit of 1000 ms (and 3s of grace) passed while loading"),
        "{}",
        output.text
    );
    assert!(elapsed < Duration::from_secs(1 + GRACE + 5), "{elapsed:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!patient.is_finished());
    let cancelled = Instant::now();
    cancel.cancel();
    let (output, _) = patient.await.unwrap();
    assert_eq!(output.text, "The call was cancelled.");
    assert!(cancelled.elapsed() < Duration::from_secs(2), "cancelling took {:?}", cancelled.elapsed());
    // The abandoned attempt made way for a new connection each time, not a wait behind the old one.
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let (output, _) = spawn_eval(&tb, json!({"code": "1", "image": "stalled", "timeout_ms": 500})).1.await.unwrap();
    assert!(output.text.starts_with("The time limit of 500 ms (and 3s of grace) passed"), "{}", output.text);
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

/// A connection of the test's own to `port`, for requests that must not go through the helper.
async fn raw_connection(port: u16) -> Connection {
    let options = ConnectOptions { connect_timeout: Duration::from_secs(5), secret: None, protocol: Protocol::Auto };
    Connection::connect(Endpoint { host: "127.0.0.1".into(), port }, &options).await.unwrap()
}

/// Evaluates `code`, read in CL-USER, in a worker thread of `connection`.
async fn raw_eval(connection: &Connection, code: &str) -> Sexp {
    let form = Form::call("cl", "eval", [Form::call("cl", "read-from-string", [Form::string(code)])]);
    connection.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap()
}

/// Starts a thread that holds SBCL's world lock for up to 20 s, until `*release*` is set, and
/// waits until it has it. The code is compiled as one function before the lock is taken: with
/// the lock held, compiling the rest would wait for it.
async fn hold_the_world_lock(connection: &Connection) {
    raw_eval(connection, "(defparameter *release* nil)").await;
    raw_eval(
        connection,
        "(funcall (lambda ()
                    (let ((holder (sb-thread:make-thread
                                   (lambda () (sb-kernel::with-world-lock () (loop repeat 200 until *release* do (sleep 0.1))))
                                   :name \"world lock holder\")))
                      (loop until (eq (sb-thread:mutex-owner sb-kernel::**world-lock**) holder) do (sleep 0.01)))))",
    )
    .await;
}

/// Lets the holder go. A call of functions on constants is evaluated without the compiler, so
/// this answers while the lock is held.
async fn release_the_world_lock(connection: &Connection) {
    let release = Form::call(
        "cl",
        "set",
        [Form::call("cl", "find-symbol", [Form::string("*RELEASE*"), Form::string("COMMON-LISP-USER")]), Form::T],
    );
    connection.rex(release, "COMMON-LISP-USER", Thread::New).await.unwrap();
}

#[tokio::test]
async fn a_world_lock_held_elsewhere_holds_a_call_no_longer_than_its_limit() {
    let image = common::private_image().await;
    let setup = raw_connection(image.port).await;

    // No helper in the image yet: loading it compiles, which waits for the world lock.
    hold_the_world_lock(&setup).await;
    let tb = common::toolbox(image.port);
    let started = Instant::now();
    let output = eval(&tb, json!({"code": "(+ 1 2)", "timeout_ms": 2000})).await;
    assert!(
        output.is_error
            && output
                .text
                .starts_with("The time limit of 2000 ms (and 3s of grace) passed while loading swank-mcp's helper")
            && output.text.contains("world lock"),
        "{}",
        output.text
    );
    assert!(started.elapsed() < Duration::from_secs(2 + GRACE + 5), "{:?}", started.elapsed());
    let (cancel, call) = spawn_eval(&tb, json!({"code": "(+ 1 2)", "timeout_ms": 30000}));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancelled = Instant::now();
    cancel.cancel();
    assert_eq!(call.await.unwrap().0.text, "The call was cancelled.");
    assert!(cancelled.elapsed() < Duration::from_secs(2), "cancelling took {:?}", cancelled.elapsed());
    release_the_world_lock(&setup).await;
    assert_eq!(eval(&tb, json!({"code": "(+ 1 2)"})).await.text, "=> 3");

    // With the helper loaded, an evaluation that needs the lock is interrupted at its limit (or,
    // when its unwinding waits for the lock again, reported with who holds it).
    hold_the_world_lock(&setup).await;
    let started = Instant::now();
    let output = eval(&tb, json!({"code": "(sb-kernel::with-world-lock () :got-it)", "timeout_ms": 2000})).await;
    assert!(output.is_error, "{}", output.text);
    assert!(
        output.text.starts_with("[ERROR] EVALUATION-TIMEOUT")
            || output.text.contains("waits for the lock \"World Lock\", held by thread \"world lock holder\""),
        "{}",
        output.text
    );
    assert!(started.elapsed() < Duration::from_secs(2 + GRACE + GRACE + 2), "{:?}", started.elapsed());
    // A new connection meanwhile is ready or says why not, within its limit too.
    let started = Instant::now();
    let output = eval(&common::toolbox(image.port), json!({"code": "(+ 1 2)", "timeout_ms": 2000})).await;
    assert!(
        output.text == "=> 3"
            || output.text.starts_with("The time limit of 2000 ms (and 3s of grace) passed while loading"),
        "{}",
        output.text
    );
    assert!(started.elapsed() < Duration::from_secs(2 + GRACE + 5), "{:?}", started.elapsed());

    release_the_world_lock(&setup).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let holder = "(find \"world lock holder\" (sb-thread:list-all-threads) :key #'sb-thread:thread-name :test #'equal)";
    while eval(&tb, json!({ "code": holder })).await.text != "=> NIL" {
        assert!(Instant::now() < deadline, "the world lock holder did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(eval(&tb, json!({"code": "(sb-thread:mutex-owner sb-kernel::**world-lock**)"})).await.text, "=> NIL");
}

#[tokio::test]
async fn a_connection_that_stopped_answering_is_dropped_and_the_next_call_reconnects() {
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    let this_connection = "(sb-kernel:get-lisp-obj-address swank::*emacs-connection*)";
    // The session's state, which a connection lost and remade loses.
    let state = "(defpackage :reconnect-probe (:use :cl)) (in-package :reconnect-probe) (list 40 2)";
    eval(&tb, json!({ "code": state })).await;
    let first = eval(&tb, json!({ "code": this_connection })).await.text;
    // A request still running on the connection when it breaks.
    let (_, pending) = spawn_eval(&tb, json!({"code": "(sleep 20)"}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let output = eval(
        &tb,
        json!({"code": "(sb-thread:terminate-thread (swank::mconn.reader-thread swank::*emacs-connection*))"}),
    )
    .await;
    assert!(!output.is_error, "{}", output.text);

    // Nothing reads what is sent on the connection any more.
    let started = Instant::now();
    let output = eval(&tb, json!({"code": "(+ 1 1)", "timeout_ms": 500})).await;
    assert!(
        output.is_error && output.text.contains("did not unwind") && output.text.contains("swank-mcp closed it"),
        "{}",
        output.text
    );
    assert!(started.elapsed() < Duration::from_secs(1 + GRACE + 2), "{:?}", started.elapsed());
    // The pending request fails with it, at once, saying why.
    let (output, elapsed) =
        tokio::time::timeout(Duration::from_secs(2), pending).await.expect("the pending call ended").unwrap();
    assert!(output.is_error && output.text.contains("the image stopped answering on it"), "{}", output.text);
    assert!(elapsed < Duration::from_secs(15), "{elapsed:?}");

    // The next reply says the session starts afresh, and it does: the image is the same, the
    // session's package and values are gone.
    let second = eval(&tb, json!({ "code": this_connection })).await.text;
    let note = format!(
        "[notes]\nThe connection to 127.0.0.1:{} was lost and remade, so this server's session in the image starts \
         afresh: its package is CL-USER again, and its @handles, REPL values (*, **), traces and debugger sessions \
         are gone. What was defined or loaded in the image is still there.\n\n=> ",
        image.port
    );
    assert!(second.starts_with(&note) && second[note.len()..] != first[3..], "{first} then {second}");
    let package = eval(&tb, json!({"code": "(list (package-name *package*) (find-package :reconnect-probe))"})).await;
    assert!(package.text.starts_with("=> (\"COMMON-LISP-USER\" #<PACKAGE \"RECONNECT-PROBE\">)"), "{}", package.text);
    assert_eq!(eval(&tb, json!({"code": "(+ 2 2)"})).await.text, "=> 4", "the note is said once");
}

#[tokio::test]
async fn an_image_that_exits_during_a_call_is_reported_as_gone() {
    for exit in ["(sb-ext:exit)", "(sb-ext:exit :abort t)"] {
        let image = common::private_image().await;
        // The user's image: the exit is refused and the image goes on.
        let tb = common::toolbox(image.port);
        let refused = eval(&tb, json!({ "code": exit })).await;
        assert!(
            refused.is_error && refused.text.starts_with("[ERROR] MCP-AGENT-HELPER::EXIT-REFUSED\n(SB-EXT:EXIT"),
            "{exit}: {}",
            refused.text
        );
        assert_eq!(eval(&tb, json!({"code": "(+ 1 2)"})).await.text, "=> 3");
        let settings = swank_mcp::tools::Settings { allow_exit: true, ..common::settings() };
        let tb = Arc::new(Toolbox::new(
            settings,
            vec![common::image_settings(image.port)],
            AllowedRoots::new(Vec::new()).unwrap(),
        ));
        let output = eval(&tb, json!({ "code": exit })).await;
        assert!(
            output.is_error
                && output.text.starts_with(&format!(
                    "The call lost the connection to the Lisp image at 127.0.0.1:{}",
                    image.port
                ))
                && output.text.contains("The image exited")
                && output.text.contains("Start the image (or its swank server) again"),
            "{exit}: {}",
            output.text
        );
        let output = eval(&tb, json!({"code": "(+ 1 2)"})).await;
        assert!(output.is_error && output.text.starts_with("No Lisp image is answering"), "{exit}: {}", output.text);
    }
}

#[tokio::test]
async fn with_launch_an_image_that_exited_is_started_again() {
    let settings = ImageSettings {
        launch: Some(LaunchSettings { swank_loader: None }),
        ..common::image_settings(common::dead_port())
    };
    let tb = Arc::new(Toolbox::new(common::settings(), vec![settings], AllowedRoots::new(Vec::new()).unwrap()));
    let pid = "(sb-posix:getpid)";
    let first = eval(&tb, json!({ "code": pid })).await.text;
    assert!(first.starts_with("=> "), "{first}");
    let output = eval(&tb, json!({"code": "(sb-ext:exit :code 3)"})).await;
    assert!(
        output.text.contains("The call lost the connection")
            && output.text.contains("the private SBCL image swank-mcp had started ended (exit code 3)")
            && output.text.contains("The next call starts a new private SBCL image"),
        "{}",
        output.text
    );
    let second = eval(&tb, json!({ "code": pid })).await.text;
    let fresh = "[notes]\nThe private SBCL image swank-mcp had started ended (exit code 3); this call ran in a fresh \
                 image that swank-mcp started in its place. Everything defined or loaded in the earlier image is gone.\n\n=> ";
    assert!(second.starts_with(fresh) && second[fresh.len()..] != first[3..], "{first} then {second}");
    let third = eval(&tb, json!({ "code": pid })).await.text;
    assert_eq!(third, format!("=> {}", &second[fresh.len()..]), "the note is said once");
}

/// An image the server attaches to (not one it launched), restarted on the same port between two
/// calls: the reply after the reconnection says that this is another image and what was lost.
#[tokio::test]
async fn an_image_restarted_on_the_same_port_is_noticed() {
    let image = common::private_image().await;
    let port = image.port;
    let tb = common::toolbox(port);
    let pid = "(sb-posix:getpid)";
    let first = eval(
        &tb,
        json!({ "code": format!("(defpackage :restart-notice (:use :cl)) (in-package :restart-notice) {pid}") }),
    )
    .await
    .text;
    assert!(first.starts_with("=> "), "{first}");
    drop(image);
    let mut restarted = None;
    for _ in 0..50 {
        match swank_mcp::image::launch::launch(&common::swank_loader(), "127.0.0.1", port).await {
            Ok(image) => {
                restarted = Some(image);
                break;
            }
            // The old process may hold the port for a moment after it is killed.
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let _restarted = restarted.expect("a new image on the same port");
    let second = eval(&tb, json!({ "code": pid })).await.text;
    let note = "[notes]\nThe connection to 127.0.0.1:";
    assert!(second.starts_with(note), "{second}");
    assert!(second.contains(&format!("(pid {} before, ", &first[3..])), "{second}");
    assert!(
        second.contains(
            "it was restarted. Everything defined or loaded in the earlier image is gone, and so is this \
                         server's session there: its package is CL-USER again"
        ),
        "{second}"
    );
    let third = eval(&tb, json!({"code": "(package-name *package*)"})).await.text;
    assert!(third.starts_with("=> \"COMMON-LISP-USER\""), "the note is said once, and the package is CL-USER: {third}");
}

#[tokio::test]
async fn an_evaluation_unwound_past_the_helper_says_so_and_the_image_carries_on() {
    let tb = common::toolbox(common::shared_image_port());
    for code in ["(invoke-restart (find-restart 'abort))", "(sb-thread:abort-thread)"] {
        let output = eval(&tb, json!({ "code": code })).await;
        assert!(
            output.is_error && output.text.starts_with("The evaluation ended without a value"),
            "{code}: {}",
            output.text
        );
        assert_eq!(eval(&tb, json!({"code": "(+ 1 2)"})).await.text, "=> 3");
    }
}
