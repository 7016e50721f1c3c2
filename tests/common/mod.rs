//! Shared test support: real SBCL + swank images started on free ports, and an MCP client that
//! drives the real binary over stdio.
#![allow(dead_code)] // Each test binary uses its own part of this module.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use swank_mcp::image::launch::{self, LaunchedImage};
use swank_mcp::image::ImageSettings;
use swank_mcp::source::AllowedRoots;
use swank_mcp::swank::{ConnectOptions, Endpoint, Protocol};
use swank_mcp::tools::{Run, Settings, Tool, ToolError, ToolOutput, Toolbox};

pub fn swank_loader() -> PathBuf {
    launch::find_swank_loader(None).expect("swank is installed (apt-get install -y sbcl cl-swank)")
}

/// Starts a private image on a free port. It stops when the returned value is dropped.
pub async fn private_image() -> LaunchedImage {
    launch::launch(&swank_loader(), "127.0.0.1", 0).await.expect("sbcl with swank starts")
}

/// One image shared by every test of a test binary, for tests that do not kill or wedge it.
/// It runs under its own runtime on its own thread, which lives as long as the test process;
/// when the process exits the image's stdin closes and it exits too.
pub fn shared_image_port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let image = private_image().await;
                tx.send(image.port).unwrap();
                // Keep the image (and the runtime that drains its output) for the whole run.
                std::future::pending::<()>().await;
                drop(image);
            });
        });
        rx.recv().expect("the shared image started")
    })
}

/// ASDF is not thread-safe: two tests loading .asd files or systems into the shared image at once
/// can corrupt its tables ("failed AVER ... HASH-TABLE-SIZE" in PUTHASH). A test that uses the
/// shared image's ASDF holds this for its duration.
pub async fn shared_asdf_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

pub fn settings() -> Settings {
    Settings {
        eval_timeout: Duration::from_secs(30),
        max_output: 65536,
        debug_timeout: Duration::from_secs(600),
        allow_exit: false,
        value_handles: true,
    }
}

pub fn image_settings(port: u16) -> ImageSettings {
    ImageSettings {
        name: "default".into(),
        endpoint: Endpoint { host: "127.0.0.1".into(), port },
        connect: ConnectOptions { connect_timeout: Duration::from_secs(5), secret: None, protocol: Protocol::Auto },
        launch: None,
    }
}

pub fn toolbox(port: u16) -> Arc<Toolbox> {
    Arc::new(Toolbox::new(settings(), vec![image_settings(port)], AllowedRoots::new(Vec::new()).unwrap()))
}

/// A port nothing listens on.
pub fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The real `swank-mcp` binary speaking MCP over pipes.
pub struct McpClient {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    next_id: i64,
}

impl McpClient {
    pub async fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("swank-mcp starts");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        McpClient { child, stdin, stdout, next_id: 1 }
    }

    pub async fn for_port(port: u16) -> Self {
        Self::start(&["--port", &port.to_string()]).await
    }

    pub async fn send_raw(&mut self, line: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    pub async fn send(&mut self, message: &Value) {
        self.send_raw(serde_json::to_string(message).unwrap().as_bytes()).await;
    }

    /// The next line on stdout, which must be one JSON message.
    pub async fn receive(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.stdout.next_line())
            .await
            .expect("a message within 60 s")
            .unwrap()
            .expect("stdout open");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout carried a non-JSON line {line:?}: {e}"))
    }

    /// Sends the request `method` with `params`; returns its id.
    async fn send_request(&mut self, method: &str, params: Value) -> Value {
        let id = json!(self.next_id);
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        id
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params).await;
        let reply = self.receive().await;
        assert_eq!(reply["id"], id, "replies come in order here: {reply}");
        reply
    }

    pub async fn initialize(&mut self) -> Value {
        let reply = self
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "tests", "version": "0"}}),
            )
            .await;
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        reply
    }

    pub async fn call_tool(&mut self, name: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": arguments})).await
    }

    /// Calls `name` with a progress token, `token`: the reply, and the parameters of each progress
    /// notification that came before it.
    pub async fn call_tool_with_progress(&mut self, name: &str, arguments: Value, token: &str) -> (Value, Vec<Value>) {
        let id = self
            .send_request(
                "tools/call",
                json!({"name": name, "arguments": arguments, "_meta": {"progressToken": token}}),
            )
            .await;
        let mut progress = Vec::new();
        loop {
            let message = self.receive().await;
            if message["method"] == "notifications/progress" {
                progress.push(message["params"].clone());
            } else {
                assert_eq!(message["id"], id, "replies come in order here: {message}");
                return (message, progress);
            }
        }
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Stdout after stdin closed: must end with nothing more than JSON lines.
    pub async fn remaining_lines(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(Ok(Some(line))) = tokio::time::timeout(Duration::from_secs(10), self.stdout.next_line()).await {
            lines.push(line);
        }
        lines
    }
}

/// Runs a source tool as the server does, its arguments checked first, its failure as the output
/// the client gets.
pub fn run_source_tool(tool: &Tool, arguments: Value, roots: &AllowedRoots) -> ToolOutput {
    let (Run::Source { source: run, .. } | Run::Reading(run)) = tool.run else { panic!("a source tool") };
    tool.arguments(arguments)
        .map_err(ToolError::from)
        .and_then(|args| run(&args, roots))
        .unwrap_or_else(ToolOutput::from)
}

/// The text of a tools/call result.
pub fn text(reply: &Value) -> &str {
    reply["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {reply}"))
}

pub fn is_error(reply: &Value) -> bool {
    reply["result"]["isError"].as_bool().unwrap_or_else(|| panic!("no isError in {reply}"))
}

/// Calls `tool` in process, as the server would, within `limit`.
pub async fn call_within(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value, limit: Duration) -> ToolOutput {
    let call = toolbox.call(tool, Some(arguments), tokio_util::sync::CancellationToken::new());
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| panic!("answers within {limit:?}"))
        .expect("the tool exists")
}

/// [`call_within`] a minute.
pub async fn call(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> ToolOutput {
    call_within(toolbox, tool, arguments, Duration::from_secs(60)).await
}

/// The text of a successful `evaluate-lisp` of `code`.
pub async fn eval_ok(toolbox: &Arc<Toolbox>, code: &str) -> String {
    let output = call(toolbox, "evaluate-lisp", json!({ "code": code })).await;
    assert!(!output.is_error, "{code}: {}", output.text);
    output.text
}

/// A value line without the handle that ends it (`=> (1 2) @3` is `=> (1 2)`), for tests about
/// the printed value alone.
pub fn without_handle(line: &str) -> &str {
    match line.rsplit_once(" @") {
        Some((value, handle)) if !handle.is_empty() && handle.bytes().all(|b| b.is_ascii_digit()) => value,
        _ => line,
    }
}

/// A program some tests need that a machine may lack.
#[derive(Debug, Clone, Copy)]
pub enum Needed {
    /// `emacs` (Debian's `emacs-nox`).
    Emacs,
    /// `emacs` with SLIME on its load path (Debian's `emacs-nox` and `slime`).
    EmacsWithSlime,
    /// Emacs with package-lint (Debian's `elpa-package-lint`).
    PackageLint,
    /// Python 3 with the MCP SDK (`pip install 'mcp>=2.3,<3'`).
    PythonSdk,
}

/// Whether `needed` is installed. When it is not, the test says so on stderr, where `cargo test`
/// shows it, and should return at once: it is skipped. With `SWANK_MCP_TEST_EVERYTHING` set (CI
/// sets it) a missing program fails the test instead, so that nothing is skipped there.
pub fn have(needed: Needed) -> bool {
    use std::io::Write as _;
    let (what, program, args, install): (&str, &str, &[&str], &str) = match needed {
        Needed::Emacs => {
            ("Emacs", "emacs", &["--batch", "-Q", "--eval", "(kill-emacs 0)"], "apt-get install -y emacs-nox")
        }
        Needed::EmacsWithSlime => (
            "Emacs with SLIME",
            "emacs",
            &["--batch", "--eval", "(progn (require 'slime) (kill-emacs 0))"],
            "apt-get install -y emacs-nox slime",
        ),
        Needed::PackageLint => (
            "Emacs with package-lint",
            "emacs",
            &["--batch", "--eval", "(progn (require 'package-lint) (kill-emacs 0))"],
            "apt-get install -y emacs-nox elpa-package-lint",
        ),
        Needed::PythonSdk => {
            ("Python 3 with the MCP SDK", "python3", &["-c", "import mcp"], "pip install 'mcp>=2.3,<3'")
        }
    };
    let present = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if present {
        return true;
    }
    let test = std::thread::current().name().unwrap_or("this test").to_string();
    let why = format!("{test} needs {what} ({install}, or bash .ci/deps)");
    assert!(std::env::var_os("SWANK_MCP_TEST_EVERYTHING").is_none(), "{why}");
    // Written past the test harness's capture of print!, so that the skip shows.
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
    false
}

/// Skips the calling test for `why` (the test returns at once), or, with
/// `SWANK_MCP_TEST_EVERYTHING` set (CI sets it), fails it: nothing is skipped there.
pub fn skip(why: &str) {
    use std::io::Write as _;
    assert!(std::env::var_os("SWANK_MCP_TEST_EVERYTHING").is_none(), "{why}");
    // Written past the test harness's capture of print!, so that the skip shows.
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
}

/// A swank connection read and written as raw frames (six hex digits of length, then the
/// message), as an Emacs is: the tests' stand-in for the person's SLIME.
pub struct SwankWire {
    stream: tokio::net::TcpStream,
}

impl SwankWire {
    pub async fn connect(port: u16) -> Self {
        Self { stream: tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap() }
    }

    pub async fn send(&mut self, message: &str) {
        use tokio::io::AsyncWriteExt as _;
        self.stream.write_all(format!("{:06x}{message}", message.len()).as_bytes()).await.unwrap();
    }

    pub async fn receive(&mut self) -> String {
        use tokio::io::AsyncReadExt as _;
        let mut header = [0u8; 6];
        self.stream.read_exact(&mut header).await.unwrap();
        let length = usize::from_str_radix(std::str::from_utf8(&header).unwrap(), 16).unwrap();
        let mut payload = vec![0u8; length];
        self.stream.read_exact(&mut payload).await.unwrap();
        String::from_utf8(payload).unwrap()
    }
}
