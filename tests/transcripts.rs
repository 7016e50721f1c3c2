//! Replays wire transcripts recorded from real servers that Debian does not package (Slynk from
//! SLY, SLIME 2.32) and from Debian's SLIME 2.27, so that every `cargo test` checks the client
//! against them without running them.
//!
//! A transcript (`fixtures/transcripts/*.jsonl`) is one session of [`scenario`] as it crossed the
//! wire: a header line, then one line per frame (`{"dir":"c2s"|"s2c","payload":...}`) and, after
//! each step of the scenario, the result the client produced (`{"step":...,"result":...}`). The
//! replay is a fake server that plays the `s2c` frames in order, checks every frame the client
//! sends against the next recorded `c2s` one, and the scenario must produce the recorded results.
//!
//! Requests are compared after normalising what legitimately changes between runs: the request
//! ids (mapped from the recording to this run, and mapped back in the replies), the session name
//! and call tokens, and the helper's source text and digest. See `fixtures/README.md` for how to
//! re-record (the `record` test below, pointed at a real server).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::{FramedRead, FramedWrite};

use swank_mcp::image::ImageSettings;
use swank_mcp::source::AllowedRoots;
use swank_mcp::swank::codec::FrameCodec;
use swank_mcp::swank::{read, Dialect, Form, RexError, Sexp, Thread};
use swank_mcp::tools::Toolbox;

use swank_mcp::image::helper::{BOOTSTRAP_SOURCE, HELPER_SOURCE};
const FORMAT_VERSION: u32 = 1;

fn transcripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/transcripts")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Header {
    transcript: u32,
    /// `swank` or `slynk`, as the client detected it.
    server: String,
    /// The server's own version string (`connection-info`'s `:version`).
    version: String,
    lisp: String,
    /// Where the server's code came from, as the person recording described it.
    source: String,
    /// The secret the client sent first, when the server had a secret file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Dir {
    C2s,
    S2c,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Record {
    Frame { dir: Dir, payload: String },
    Step { step: String, result: String },
}

fn load(path: &Path) -> (Header, Vec<Record>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines().enumerate();
    let header: Header =
        serde_json::from_str(lines.next().expect("a header line").1).expect("the first line is the header");
    assert_eq!(header.transcript, FORMAT_VERSION, "{}: unknown transcript format", path.display());
    let records = lines
        .map(|(n, line)| serde_json::from_str(line).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), n + 1)))
        .collect();
    (header, records)
}

// ---------------------------------------------------------------------------------------------
// The scenario: what a session does, the same when recording and when replaying.

/// Runs the representative session through `toolbox` (the tools layer) and the connection under
/// it, checking what must hold for any server, and adds each step's result to `steps`.
async fn scenario(toolbox: &Arc<Toolbox>, steps: &Mutex<Vec<Record>>) {
    let step = |name: &str, result: String| {
        steps.lock().unwrap().push(Record::Step { step: name.into(), result });
    };
    let evaluate = |arguments: Value| {
        let toolbox = toolbox.clone();
        async move {
            toolbox.call("evaluate-lisp", Some(arguments), Default::default()).await.expect("evaluate-lisp exists")
        }
    };

    // Connect: identification, then the helper load.
    let connection = toolbox.images()[0].connection().await.expect("connects and loads the helper");
    let info = connection.info().clone();
    assert_eq!(info.lisp_type.as_deref(), Some("SBCL"));
    step(
        "connect",
        format!(
            "{} {} on {} {}",
            info.dialect.name(),
            info.version.as_deref().unwrap_or("?"),
            info.lisp_type.unwrap_or_default(),
            info.style.unwrap_or_default()
        ),
    );

    let output = evaluate(json!({"code": "(progn (format t \"hello from ~a~%\" (lisp-implementation-type)) (format *error-output* \"to stderr~%\") (values 42 :answer))"})).await;
    assert!(
        !output.is_error
            && output.text.contains("[stdout]\nhello from SBCL")
            && output.text.contains("=> 42\n=> :ANSWER"),
        "{}",
        output.text
    );
    step("evaluate with output", output.text);

    let output = evaluate(json!({"code": "(error \"boom ~a\" 7)"})).await;
    assert!(output.is_error && output.text.starts_with("[ERROR] SIMPLE-ERROR\nboom 7"), "{}", output.text);
    step("error", output.text);

    // A raw request outside the helper's trap enters the server's debugger; the client unwinds
    // the thread (throw-to-toplevel in the server's own package) and reports the condition.
    let raw = Form::call("cl", "error", [Form::string("raw ~a"), Form::Integer(7)]);
    let report = match connection.rex(raw, "COMMON-LISP-USER", Thread::New).await {
        Err(RexError::Aborted { debugger: Some(report), .. }) => report,
        other => panic!("expected an abort with a debugger report, got {other:?}"),
    };
    assert_eq!(report.condition, "raw 7");
    assert!(report.condition_type.contains("SIMPLE-ERROR") && !report.frames.is_empty(), "{report:?}");
    step(
        "debugger",
        format!(
            "{} {} ({} frames, first {:?})",
            report.condition,
            report.condition_type,
            report.frames.len(),
            report.frames[0]
        ),
    );

    // A timeout interrupts the evaluation through the helper and keeps its output.
    let output =
        evaluate(json!({"code": "(progn (format t \"before~%\") (finish-output) (sleep 10))", "timeout_ms": 500}))
            .await;
    assert!(
        output.is_error && output.text.starts_with("[ERROR] EVALUATION-TIMEOUT") && output.text.contains("before"),
        "{}",
        output.text
    );
    step("timeout", output.text);

    // With debug, an error stops in the server's debugger (its :debug event goes to the waiting
    // call, not to throw-to-toplevel); the debugger tool's requests run in the stopped thread, and
    // a restart invoked with an argument resumes the evaluation, whose value comes back.
    let stopped = evaluate(json!({
        "code": "(restart-case (error \"stop ~a\" 8) (use-value (v) :report \"Use a value\" (* v 2)))",
        "debug": true
    }))
    .await;
    assert!(
        stopped.text.starts_with("[DEBUGGER D") && stopped.text.contains("\n[Restarts]\n0: [USE-VALUE] Use a value"),
        "{}",
        stopped.text
    );
    let session = stopped.structured_value().unwrap()["debugger_session"].as_str().unwrap().to_string();
    // Session numbers count this process's sessions: the replay runs beside other tests.
    step("debugger stop", stopped.text.replace(&session, "D<n>"));
    let debugger = |arguments: Value| {
        let toolbox = toolbox.clone();
        async move { toolbox.call("debugger", Some(arguments), Default::default()).await.expect("debugger exists") }
    };
    let frames = debugger(json!({"session": session, "action": "backtrace", "end": 2})).await;
    assert!(!frames.is_error && frames.text.contains("[Backtrace]\n0: "), "{}", frames.text);
    step("debugger backtrace", frames.text.replace(&session, "D<n>"));
    let resumed =
        debugger(json!({"session": session, "action": "invoke_restart", "restart": 0, "arguments": ["21"]})).await;
    assert_eq!(resumed.text, "=> 42");
    step("debugger restart", resumed.text);

    let unreadable = Form::call("mcp-no-such-package", "f", []);
    let reply = connection.rex(unreadable, "COMMON-LISP-USER", Thread::New).await;
    let Err(RexError::ReaderError(message)) = &reply else { panic!("expected a reader error, got {reply:?}") };
    step("reader error", message.clone());

    // A thread that sends many events waits for a :ping to be answered; SLIME 2.28+ also makes
    // every write to a REPL stream wait for :write-done (2.27 writes without a thread id).
    // Slynk's REPL talks through channels instead.
    let events = format!(
        "(dotimes (i 120 :done) ({}::send-to-emacs (list :background-message (format nil \"message ~d\" i))))",
        info.dialect.package()
    );
    let code = match info.dialect {
        Dialect::Swank => format!(
            "(swank:swank-require :swank-repl)
             (let ((out (progn (swank-repl:create-repl nil) (swank::connection.user-output swank::*emacs-connection*))))
               (dotimes (i 3) (format out \"line ~d~%\" i) (finish-output out)))
             {}",
            events
        ),
        _ => events,
    };
    let output = evaluate(json!({"code": code, "timeout_ms": 20000})).await;
    assert!(!output.is_error && output.text.ends_with("=> :DONE"), "{}", output.text);
    step("ping and write-done", output.text);
}

// ---------------------------------------------------------------------------------------------
// Normalisation

/// What the client sends, with the parts that change between runs replaced by placeholders.
fn normalise(payload: &str, session: &str) -> String {
    fn walk(value: Sexp, session: &str) -> Sexp {
        match value {
            Sexp::String(s) if s == HELPER_SOURCE => Sexp::String("<helper-source>".into()),
            Sexp::String(s) if s == BOOTSTRAP_SOURCE => Sexp::String("<bootstrap-source>".into()),
            Sexp::String(s) if s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Sexp::String("<helper-digest>".into())
            }
            Sexp::String(s) => Sexp::String(s.replace(session, "<session>")),
            Sexp::List(items) => Sexp::List(items.into_iter().map(|item| walk(item, session)).collect()),
            other => other,
        }
    }
    // The first frame may be a secret, which need not read as a form.
    match read(payload) {
        Ok(value) => walk(value, session).to_string(),
        Err(_) => payload.to_string(),
    }
}

/// The requests that load the bootstrap and the helper, whatever their shape: how the client
/// guards and versions the load is its own business and changes with it; what the replay checks
/// is that each is sent where the recording sent it, and that the client copes with the server's
/// answer.
fn helper_load_as_placeholder(message: Sexp) -> Sexp {
    fn holds(value: &Sexp, placeholder: &str) -> bool {
        match value {
            Sexp::String(s) => s == placeholder,
            Sexp::List(items) => items.iter().any(|item| holds(item, placeholder)),
            _ => false,
        }
    }
    match message {
        Sexp::List(mut items) if rex_id(&Sexp::List(items.clone())).is_some() => {
            if holds(&items[1], "<bootstrap-source>") {
                items[1] = Sexp::String("<bootstrap-load>".into());
            } else if holds(&items[1], "<helper-source>") {
                items[1] = Sexp::String("<helper-load>".into());
            }
            Sexp::List(items)
        }
        other => other,
    }
}

/// The request id of `(:emacs-rex FORM PACKAGE THREAD ID)`.
fn rex_id(message: &Sexp) -> Option<i64> {
    match message.as_list()? {
        [head, _, _, _, Sexp::Integer(id)] if head.is_keyword("emacs-rex") => Some(*id),
        _ => None,
    }
}

fn without_rex_id(message: &Sexp) -> Sexp {
    match (rex_id(message), message) {
        (Some(_), Sexp::List(items)) => Sexp::List(items[..4].to_vec()),
        _ => message.clone(),
    }
}

/// Checks one frame the client sent against the recorded (normalised) one, learning the id
/// mapping from requests.
fn check_request(recorded: &str, live: &str, ids: &mut HashMap<i64, i64>) -> Result<(), String> {
    let (Ok(expected), Ok(got)) =
        (read(recorded).map(helper_load_as_placeholder), read(live).map(helper_load_as_placeholder))
    else {
        return if recorded == live { Ok(()) } else { Err(format!("expected {recorded}\n   got {live}")) };
    };
    if without_rex_id(&expected) != without_rex_id(&got) {
        return Err(format!("expected {recorded}\n   got {live}"));
    }
    if let (Some(from), Some(to)) = (rex_id(&expected), rex_id(&got)) {
        ids.insert(from, to);
    }
    Ok(())
}

/// A recorded server message with its request ids mapped to this run's; unchanged text when
/// nothing needs mapping, so the client reads exactly the bytes the real server sent.
fn map_reply(payload: &str, ids: &HashMap<i64, i64>) -> String {
    let Ok(Sexp::List(mut items)) = read(payload) else {
        return payload.to_string();
    };
    let map = |value: &mut Sexp| {
        if let Sexp::Integer(id) = value {
            *id = ids.get(id).copied().unwrap_or(*id);
        }
    };
    let before = items.clone();
    match items.first() {
        Some(head) if head.is_keyword("return") => items.last_mut().into_iter().for_each(map),
        Some(head) if head.is_keyword("invalid-rpc") => items.get_mut(1).into_iter().for_each(map),
        Some(head) if head.is_keyword("debug") => {
            if let Some(Sexp::List(pending)) = items.get_mut(6) {
                pending.iter_mut().for_each(map);
            }
        }
        _ => {}
    }
    if items == before {
        payload.to_string()
    } else {
        Sexp::List(items).to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Replay

fn toolbox_for(port: u16, secret: Option<String>) -> Arc<Toolbox> {
    let mut image: ImageSettings = common::image_settings(port);
    image.connect.secret = secret;
    Arc::new(Toolbox::new(common::settings(), vec![image], AllowedRoots::new(Vec::new()).unwrap()))
}

/// Plays `records` to the first client that connects; fails at the first frame that differs.
async fn fake_server(listener: TcpListener, records: Vec<Record>, session: String) -> Result<(), String> {
    let (socket, _) = listener.accept().await.map_err(|e| e.to_string())?;
    let (read_half, write_half) = socket.into_split();
    let mut incoming = FramedRead::new(read_half, FrameCodec::default());
    let mut outgoing = FramedWrite::new(write_half, FrameCodec::default());
    let mut ids = HashMap::new();
    for (n, record) in records.iter().enumerate() {
        let line = n + 2;
        match record {
            Record::Step { .. } => {}
            Record::Frame { dir: Dir::S2c, payload } => {
                outgoing
                    .send(map_reply(payload, &ids).as_str())
                    .await
                    .map_err(|e| format!("line {line}: cannot send: {e}"))?;
            }
            Record::Frame { dir: Dir::C2s, payload } => {
                let frame = match tokio::time::timeout(Duration::from_secs(15), incoming.next()).await {
                    Err(_) => {
                        return Err(format!("line {line}: the client sent nothing within 15 s; expected {payload}"))
                    }
                    Ok(None) => {
                        return Err(format!("line {line}: the client closed the connection; expected {payload}"))
                    }
                    Ok(Some(frame)) => frame.map_err(|e| format!("line {line}: {e}"))?,
                };
                check_request(payload, &normalise(&frame, &session), &mut ids)
                    .map_err(|e| format!("line {line}: {e}"))?;
            }
        }
    }
    Ok(())
}

async fn replay(name: &str) {
    let path = transcripts_dir().join(format!("{name}.jsonl"));
    let (header, records) = load(&path);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let toolbox = toolbox_for(listener.local_addr().unwrap().port(), header.secret.clone());
    let session = toolbox.images()[0].session().to_string();
    let server = tokio::spawn(fake_server(listener, records.clone(), session));
    let steps = Arc::new(Mutex::new(Vec::new()));
    let run = tokio::spawn({
        let (toolbox, steps) = (toolbox.clone(), steps.clone());
        async move { scenario(&toolbox, &steps).await }
    });
    let finished = tokio::time::timeout(Duration::from_secs(60), run).await;
    // A scenario that fails or hangs usually does so because the server saw something
    // unexpected: report the server's complaint first.
    match tokio::time::timeout(Duration::from_secs(20), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(mismatch))) => panic!("{}: {mismatch}", path.display()),
        Ok(Err(e)) => panic!("{}: the fake server panicked: {e}", path.display()),
        Err(_) => panic!("{}: the client stopped before the end of the transcript", path.display()),
    }
    match finished {
        Err(_) => panic!("{}: the scenario did not finish within 60 s", path.display()),
        Ok(Err(e)) => std::panic::resume_unwind(e.into_panic()),
        Ok(Ok(())) => {}
    }
    let expected: Vec<(String, String)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Step { step, result } => Some((step.clone(), result.clone())),
            Record::Frame { .. } => None,
        })
        .collect();
    let got: Vec<(String, String)> = std::mem::take(&mut *steps.lock().unwrap())
        .into_iter()
        .filter_map(|r| match r {
            Record::Step { step, result } => Some((step, result)),
            Record::Frame { .. } => None,
        })
        .collect();
    assert_eq!(got, expected, "{}: the client's results differ from the recorded ones", path.display());
}

/// Every transcript on disk has its replay test.
const TRANSCRIPTS: &[&str] = &["slynk-1.0.43", "swank-2.32", "swank-2.27"];

#[tokio::test]
async fn replays_slynk_1_0_43_with_a_secret() {
    replay("slynk-1.0.43").await;
}

#[tokio::test]
async fn replays_swank_2_32() {
    replay("swank-2.32").await;
}

#[tokio::test]
async fn replays_swank_2_27() {
    replay("swank-2.27").await;
}

#[test]
fn every_transcript_is_replayed() {
    let mut on_disk: Vec<String> = std::fs::read_dir(transcripts_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|name| name.strip_suffix(".jsonl").map(str::to_string))
        .collect();
    on_disk.sort();
    let mut known: Vec<String> = TRANSCRIPTS.iter().map(|s| s.to_string()).collect();
    known.sort();
    assert_eq!(on_disk, known);
}

#[test]
fn request_ids_are_mapped_both_ways() {
    let mut ids = HashMap::new();
    check_request("(:emacs-rex (cl:list) \"CL-USER\" t 4)", "(:emacs-rex (cl:list) \"CL-USER\" t 9)", &mut ids)
        .unwrap();
    assert_eq!(map_reply("(:return (:ok nil) 4)", &ids), "(:return (:ok nil) 9)");
    assert_eq!(
        map_reply("(:debug 3 1 (\"x\" \"y\" nil) nil nil (4))", &ids),
        "(:debug 3 1 (\"x\" \"y\" nil) nil nil (9))"
    );
    assert_eq!(map_reply("(:return (:ok nil) 5)", &ids), "(:return (:ok nil) 5)");
    assert!(check_request("(:emacs-rex (cl:list) \"CL-USER\" t 4)", "(:emacs-rex (cl:car) \"CL-USER\" t 4)", &mut ids)
        .is_err());
    assert!(check_request("(:emacs-pong 1 2)", "(:emacs-pong 1 3)", &mut ids).is_err());
}

#[test]
fn normalising_hides_the_session_and_the_helper() {
    let load = Form::call(
        "cl",
        "list",
        [Form::string(HELPER_SOURCE), Form::string("0123456789abcdef"), Form::string("s-1-ff-3")],
    );
    assert_eq!(
        normalise(&load.to_wire(), "s-1-ff"),
        "(cl:list \"<helper-source>\" \"<helper-digest>\" \"<session>-3\")"
    );
    assert_eq!(normalise("not a form)", "s"), "not a form)");
}

// ---------------------------------------------------------------------------------------------
// Recording

/// Copies frames from `from` to `to`, logging each (normalised when the client sent it).
async fn pipe(
    from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    dir: Dir,
    log: Arc<Mutex<Vec<Record>>>,
    session: String,
) {
    let mut frames = FramedRead::new(from, FrameCodec::default());
    let mut sink = FramedWrite::new(to, FrameCodec::default());
    while let Some(Ok(frame)) = frames.next().await {
        let payload = if dir == Dir::C2s { normalise(&frame, &session) } else { frame.clone() };
        log.lock().unwrap().push(Record::Frame { dir, payload });
        if sink.send(frame.as_str()).await.is_err() {
            break;
        }
    }
}

/// Records a transcript from a real server. Ignored by default; see fixtures/README.md:
/// `SWANK_MCP_RECORD_PORT=4005 SWANK_MCP_RECORD_AS=swank-2.32 SWANK_MCP_RECORD_SOURCE='...'
/// cargo test --test transcripts record -- --ignored`, plus `SWANK_MCP_RECORD_SECRET` when the
/// server has a secret file.
#[tokio::test]
#[ignore = "needs a real server: see fixtures/README.md"]
async fn record() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("set {name} (see fixtures/README.md)"));
    let upstream: u16 = var("SWANK_MCP_RECORD_PORT").parse().expect("SWANK_MCP_RECORD_PORT is a port");
    let name = var("SWANK_MCP_RECORD_AS");
    let source = var("SWANK_MCP_RECORD_SOURCE");
    let secret = std::env::var("SWANK_MCP_RECORD_SECRET").ok();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let toolbox = toolbox_for(listener.local_addr().unwrap().port(), secret.clone());
    let session = toolbox.images()[0].session().to_string();
    let log = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn({
        let log = log.clone();
        async move {
            let (client, _) = listener.accept().await.unwrap();
            let server = TcpStream::connect(("127.0.0.1", upstream)).await.expect("the server to record answers");
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::join!(
                pipe(client_read, server_write, Dir::C2s, log.clone(), session.clone()),
                pipe(server_read, client_write, Dir::S2c, log, session),
            );
        }
    });
    tokio::time::timeout(Duration::from_secs(120), scenario(&toolbox, &log)).await.expect("the scenario finishes");
    let info = toolbox.images()[0].current_connection().expect("still connected").info().clone();
    // Late replies (the unwound debugger request, the cancel request) still arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let header = Header {
        transcript: FORMAT_VERSION,
        server: info.dialect.name().into(),
        version: info.version.unwrap_or_default(),
        lisp: format!("{} {}", info.lisp_type.unwrap_or_default(), info.lisp_version.unwrap_or_default()),
        source,
        secret,
    };
    let mut text = serde_json::to_string(&header).unwrap() + "\n";
    for record in log.lock().unwrap().iter() {
        text += &serde_json::to_string(record).unwrap();
        text.push('\n');
    }
    let path = transcripts_dir().join(format!("{name}.jsonl"));
    std::fs::create_dir_all(transcripts_dir()).unwrap();
    std::fs::write(&path, text).unwrap();
    eprintln!("wrote {}", path.display());
}
