//! End-to-end cost of swank-mcp against the wire it wraps, measured in one run against one image:
//!
//! - `evaluate-lisp "(+ 1 2)"` through the real `swank-mcp` binary over stdio, against a raw
//!   `swank:eval-and-grab-output` round trip from a minimal blocking client, interleaved so both
//!   see the same machine state; p50 and p99 of each and their ratio.
//! - A 4 MB print through `evaluate-lisp` (just under the bound where the image stops runaway
//!   output): wall time, bytes of the response, and the server's peak resident memory (VmHWM).
//! - The first `evaluate-lisp` on a freshly started image: with the helper in the image's cache,
//!   compiling it into the cache, and loading it as source where there is no writable cache.
//! - The first comparison again from a Python client (`benches/overhead_client.py`: `os.write` and
//!   `os.read` on the server's pipes against `socket.sendall` and `recv` on raw swank).
//!
//! - With `--against REVISION`, the first comparison again for that revision of this repository,
//!   built in release mode from a temporary git worktree (into `target/overhead-baseline`, kept so
//!   that the next build is incremental) and run against an image of its own (its helper differs),
//!   interleaved call by call with this revision's: each one's ratio to raw swank on its image,
//!   and this revision's time over the baseline's, so that a regression shows as a ratio.
//!
//! Run: `cargo bench --bench overhead` (add `-- 2000` for more iterations, `-- --against 62956f0`
//! to compare with a previous revision).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// `code` as it goes between double quotes, in a Lisp string or a JSON one alike (the code the
/// bench sends has no control characters).
fn quoted_text(code: &str) -> String {
    code.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A minimal swank client: frames out, frames in, nothing else.
struct RawSwank {
    stream: TcpStream,
    next_id: u64,
    /// The helper's worker thread that [`RawSwank::helper_evaluate`] sends to, once started.
    worker: Option<String>,
}

impl RawSwank {
    fn connect(port: u16) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to swank");
        stream.set_nodelay(true).unwrap();
        RawSwank { stream, next_id: 1, worker: None }
    }

    fn send(&mut self, payload: &str) {
        let frame = format!("{:06x}{payload}", payload.len());
        self.stream.write_all(frame.as_bytes()).unwrap();
    }

    fn receive(&mut self) -> String {
        let mut header = [0u8; 6];
        self.stream.read_exact(&mut header).unwrap();
        let len = usize::from_str_radix(std::str::from_utf8(&header).unwrap(), 16).unwrap();
        let mut payload = vec![0u8; len];
        self.stream.read_exact(&mut payload).unwrap();
        String::from_utf8(payload).unwrap()
    }

    /// One `eval-and-grab-output` round trip; returns once its `:return` arrives.
    fn eval_and_grab_output(&mut self, code: &str) -> String {
        let escaped = quoted_text(code);
        self.rex(&format!("(swank:eval-and-grab-output \"{escaped}\")"))
    }

    /// The request evaluate-lisp makes, sent by this minimal client to a worker thread of the
    /// helper's, as evaluate-lisp sends it: the Lisp side of the tool's cost without the Rust side.
    /// The helper must be loaded (by a swank-mcp call) before the first.
    fn helper_evaluate(&mut self, code: &str) -> String {
        let escaped = quoted_text(code);
        let worker = match &self.worker {
            Some(worker) => worker.clone(),
            None => {
                let reply = self.rex_in("(mcp-agent-helper:start-worker)", "t");
                let id = reply.strip_prefix("(:return (:ok ").and_then(|rest| rest.split(')').next());
                let worker = id.filter(|id| id.parse::<i64>().is_ok()).expect("a worker thread id").to_string();
                self.worker = Some(worker.clone());
                worker
            }
        };
        let token = self.next_id;
        self.rex_in(
            &format!(
                "(mcp-agent-helper:evaluate \"{escaped}\" :package nil :max-output 65536 :session \"bench-raw\" :token \"bench-raw-{token}\")"
            ),
            &worker,
        )
    }

    fn rex(&mut self, form: &str) -> String {
        self.rex_in(form, "t")
    }

    /// Sends `form` to run in `thread`, `t` for a new one.
    fn rex_in(&mut self, form: &str, thread: &str) -> String {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&format!("(:emacs-rex {form} \"COMMON-LISP-USER\" {thread} {id})"));
        let suffix = format!(" {id})");
        loop {
            let message = self.receive();
            if message.starts_with("(:return") && message.ends_with(&suffix) {
                return message;
            }
        }
    }
}

struct McpProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl McpProcess {
    fn start(port: u16) -> Self {
        Self::start_binary(Path::new(env!("CARGO_BIN_EXE_swank-mcp")), port)
    }

    fn start_binary(binary: &Path, port: u16) -> Self {
        Self::start_command(Command::new(binary).args(["--port", &port.to_string()]))
    }

    /// This bench itself as the [`relay`] to the image on `port`.
    fn start_relay(port: u16) -> Self {
        Self::start_command(
            Command::new(std::env::current_exe().expect("the bench's own path")).args(["--relay", &port.to_string()]),
        )
    }

    fn start_command(command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start swank-mcp");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut process = McpProcess { child, stdin, stdout, next_id: 1 };
        process.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}));
        process
    }

    /// Sends one request and returns (its response, the response's size on the wire).
    fn request(&mut self, method: &str, params: Value) -> (Value, usize) {
        let id = self.next_id;
        self.next_id += 1;
        let mut line =
            serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).unwrap();
        self.stdin.flush().unwrap();
        let mut response = String::new();
        self.stdout.read_line(&mut response).unwrap();
        (serde_json::from_str(&response).unwrap(), response.len())
    }

    fn evaluate(&mut self, code: &str) -> (Value, usize) {
        self.request("tools/call", json!({"name": "evaluate-lisp", "arguments": {"code": code}}))
    }

    /// One `evaluate-lisp` round trip as a minimal client makes it, like [`RawSwank`]'s: the
    /// request formatted in place, the response line read and returned unparsed (the caller
    /// checks it after the clock stops).
    fn evaluate_raw(&mut self, code: &str) -> String {
        let id = self.next_id;
        self.next_id += 1;
        let escaped = quoted_text(code);
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"evaluate-lisp\",\"arguments\":{{\"code\":\"{escaped}\"}}}}}}\n"
        );
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
        let mut response = String::new();
        self.stdout.read_line(&mut response).unwrap();
        response
    }

    /// Sends evaluations without waiting, then collects one response each; returns the time each
    /// response arrived after the first request was sent, by the index of its request.
    fn evaluate_concurrently(&mut self, codes: &[&str]) -> Vec<Duration> {
        let first_id = self.next_id;
        let started = Instant::now();
        for code in codes {
            let mut line = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                "params": {"name": "evaluate-lisp", "arguments": {"code": code}}}))
            .unwrap();
            line.push(b'\n');
            self.next_id += 1;
            self.stdin.write_all(&line).unwrap();
        }
        self.stdin.flush().unwrap();
        let mut arrivals = vec![Duration::ZERO; codes.len()];
        for _ in codes {
            let mut response = String::new();
            self.stdout.read_line(&mut response).unwrap();
            let reply: Value = serde_json::from_str(&response).unwrap();
            assert_eq!(reply["result"]["isError"], false, "{reply}");
            arrivals[(reply["id"].as_u64().unwrap() - first_id) as usize] = started.elapsed();
        }
        arrivals
    }

    /// User plus system CPU time the server process has used.
    fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let ticks: u64 = fields.get(11..13).map_or(0, |f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum());
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Duration::from_secs_f64(ticks as f64 / per_second)
    }

    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The first `evaluate-lisp` on a freshly started image, through the binary: connecting, loading
/// the helper (from `cache`, when the image finds it there) and the evaluation. The image is told
/// its helper cache through the environment it inherits. It is started as `--launch` starts one,
/// which collects the garbage of loading swank before it serves; an image started otherwise may
/// make its first request pay for that collection (25-30 ms here).
fn first_call(runtime: &tokio::runtime::Runtime, loader: &std::path::Path, cache: &std::path::Path) -> Duration {
    std::env::set_var("SWANK_MCP_CACHE_DIR", cache);
    let image = runtime.block_on(swank_mcp::image::launch::launch(loader, "127.0.0.1", 0)).expect("launch sbcl");
    let mut mcp = McpProcess::start(image.port);
    let started = Instant::now();
    let (reply, _) = mcp.evaluate("(+ 1 2)");
    let elapsed = started.elapsed();
    assert_eq!(reply["result"]["content"][0]["text"], "=> 3", "{reply}");
    drop(mcp.stdin);
    let _ = mcp.child.wait();
    elapsed
}

/// The least that any MCP server in front of swank must do for a call, and nothing more: read the
/// request line and parse its JSON, send the helper's evaluate request that evaluate-lisp sends
/// (to a worker thread, as evaluate-lisp does), read frames until its `:return`, and write the reply's text back as a JSON-RPC response. A
/// blocking loop on one thread, with no tool layer, no typed reply and no concurrency. Its cost
/// over raw swank is the floor of the extra process hop on this machine, which the server's
/// ratio is read against.
fn relay(port: u16) {
    let mut swank = RawSwank::connect(port);
    let mut output = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let request: Value = serde_json::from_str(&line.expect("a request line")).expect("JSON");
        let result = match request["params"]["arguments"]["code"].as_str() {
            Some(code) => json!({"content": [{"type": "text", "text": swank.helper_evaluate(code)}]}),
            None => json!({}),
        };
        let mut response =
            serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": request["id"], "result": result})).unwrap();
        response.push(b'\n');
        output.write_all(&response).unwrap();
        output.flush().unwrap();
    }
}

/// `revision` of this repository's swank-mcp, built in release mode from a temporary git
/// worktree into `target/overhead-baseline`; the binary is copied into `into`, and the worktree
/// removed.
fn build_revision(revision: &str, into: &Path) -> PathBuf {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let git = |args: &[&str]| {
        let output = Command::new("git").arg("-C").arg(repository).args(args).output().expect("run git");
        assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().trim().to_string()
    };
    let commit = git(&["rev-parse", "--verify", &format!("{revision}^{{commit}}")]);
    let worktree = into.join(format!("swank-mcp-{commit}"));
    git(&["worktree", "add", "--detach", &worktree.to_string_lossy(), &commit]);
    let target = repository.join("target").join("overhead-baseline");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = Command::new(cargo)
        .args(["build", "--release", "--bin", "swank-mcp", "--manifest-path"])
        .arg(worktree.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status();
    let binary = into.join(format!("swank-mcp-{}", &commit[..12]));
    let copied = built.is_ok_and(|status| status.success())
        && std::fs::copy(target.join("release").join("swank-mcp"), &binary).is_ok();
    git(&["worktree", "remove", "--force", &worktree.to_string_lossy()]);
    assert!(copied, "could not build swank-mcp at {revision} ({commit})");
    println!("baseline: {revision} ({}), built in {}", &commit[..12], target.display());
    binary
}

/// A previous revision measured beside this one: its binary, talking to an image of its own.
struct Baseline {
    revision: String,
    raw: RawSwank,
    mcp: McpProcess,
    binary: PathBuf,
    port: u16,
}

/// The start of the helper's reply to `(+ 1 2)` as the relay's JSON response carries it.
const RELAYED_THREE: &str = r#"(:return (:ok (:values ((\"3\" 0))"#;

fn main() {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("--relay") {
        return relay(args.next().and_then(|port| port.parse().ok()).expect("--relay PORT"));
    }
    // `cargo bench` passes `--bench`; a bare number sets the iteration count.
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let against = arguments.iter().position(|a| a == "--against").map(|i| {
        arguments.get(i + 1).cloned().expect("--against REVISION (a commit, tag or branch of this repository)")
    });
    let iterations: usize =
        arguments.iter().filter(|a| Some(*a) != against.as_ref()).find_map(|a| a.parse().ok()).unwrap_or(500);
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let baseline_binary = against.as_deref().map(|revision| build_revision(revision, scratch.path()));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let loader =
        swank_mcp::image::launch::find_swank_loader(None).expect("swank installed (apt-get install sbcl cl-swank)");

    let cache = tempfile::tempdir().expect("a temporary directory");
    let uncached = first_call(&runtime, &loader, cache.path());
    let cached = first_call(&runtime, &loader, cache.path());
    let source = first_call(&runtime, &loader, std::path::Path::new("/proc/swank-mcp-cannot-write-here"));
    println!(
        "first call on a fresh image: {:.0} ms with the helper in its cache, {:.0} ms compiling it into the cache, \
              {:.0} ms loading it as source (no writable cache)",
        cached.as_secs_f64() * 1e3,
        uncached.as_secs_f64() * 1e3,
        source.as_secs_f64() * 1e3
    );
    std::env::remove_var("SWANK_MCP_CACHE_DIR");

    let image = runtime.block_on(swank_mcp::image::launch::launch(&loader, "127.0.0.1", 0)).expect("launch sbcl");
    let port = image.port;

    let mut raw = RawSwank::connect(port);
    let mut mcp = McpProcess::start(port);
    let mut relay = McpProcess::start_relay(port);
    let baseline_image = baseline_binary
        .as_ref()
        .map(|_| runtime.block_on(swank_mcp::image::launch::launch(&loader, "127.0.0.1", 0)).expect("launch sbcl"));
    let mut baseline = baseline_binary.zip(baseline_image.as_ref()).map(|(binary, image)| Baseline {
        revision: against.clone().unwrap_or_default(),
        raw: RawSwank::connect(image.port),
        mcp: McpProcess::start_binary(&binary, image.port),
        binary,
        port: image.port,
    });
    // Warm up both paths (the first MCP call connects and loads the helper).
    for _ in 0..50 {
        raw.eval_and_grab_output("(+ 1 2)");
        let (reply, _) = mcp.evaluate("(+ 1 2)");
        assert_eq!(reply["result"]["content"][0]["text"], "=> 3", "{reply}");
        let response = relay.evaluate_raw("(+ 1 2)");
        assert!(response.contains(RELAYED_THREE), "{response}");
        if let Some(baseline) = &mut baseline {
            baseline.raw.eval_and_grab_output("(+ 1 2)");
            let (reply, _) = baseline.mcp.evaluate("(+ 1 2)");
            assert_eq!(reply["result"]["content"][0]["text"], "=> 3", "{reply}");
        }
    }
    // The same tool in process, without the stdio hops, to split the overhead.
    let toolbox = std::sync::Arc::new(swank_mcp::tools::Toolbox::new(
        swank_mcp::tools::Settings {
            eval_timeout: Duration::from_secs(30),
            max_output: 65536,
            debug_timeout: Duration::from_secs(600),
            allow_exit: false,
            value_handles: true,
        },
        vec![swank_mcp::image::ImageSettings {
            name: "default".into(),
            endpoint: swank_mcp::swank::Endpoint { host: "127.0.0.1".into(), port },
            connect: swank_mcp::swank::ConnectOptions {
                connect_timeout: Duration::from_secs(5),
                secret: None,
                protocol: swank_mcp::swank::Protocol::Auto,
            },
            launch: None,
        }],
        swank_mcp::source::AllowedRoots::new(Vec::new()).unwrap(),
    ));
    let in_process = |code: &str| {
        runtime.block_on(toolbox.call("evaluate-lisp", Some(json!({"code": code})), Default::default())).unwrap()
    };
    in_process("(+ 1 2)");
    raw.helper_evaluate("(+ 1 2)");
    let mut raw_times = Vec::with_capacity(iterations);
    let mut mcp_times = Vec::with_capacity(iterations);
    let mut tool_times = Vec::with_capacity(iterations);
    let mut helper_times = Vec::with_capacity(iterations);
    let mut relay_times = Vec::with_capacity(iterations);
    let mut baseline_raw_times = Vec::with_capacity(iterations);
    let mut baseline_times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        raw.eval_and_grab_output("(+ 1 2)");
        raw_times.push(started.elapsed());
        let started = Instant::now();
        let reply = raw.helper_evaluate("(+ 1 2)");
        helper_times.push(started.elapsed());
        assert!(reply.starts_with("(:return (:ok (:values ((\"3\" 0))"), "{reply}");
        let started = Instant::now();
        let response = mcp.evaluate_raw("(+ 1 2)");
        mcp_times.push(started.elapsed());
        let reply: Value = serde_json::from_str(&response).unwrap();
        assert_eq!(reply["result"]["content"][0]["text"], "=> 3", "{reply}");
        let started = Instant::now();
        in_process("(+ 1 2)");
        tool_times.push(started.elapsed());
        let started = Instant::now();
        let response = relay.evaluate_raw("(+ 1 2)");
        relay_times.push(started.elapsed());
        assert!(response.contains(RELAYED_THREE), "{response}");
        if let Some(baseline) = &mut baseline {
            let started = Instant::now();
            baseline.raw.eval_and_grab_output("(+ 1 2)");
            baseline_raw_times.push(started.elapsed());
            let started = Instant::now();
            let response = baseline.mcp.evaluate_raw("(+ 1 2)");
            baseline_times.push(started.elapsed());
            let reply: Value = serde_json::from_str(&response).unwrap();
            assert_eq!(reply["result"]["content"][0]["text"], "=> 3", "{reply}");
        }
    }
    drop(relay);
    relay_times.sort();
    tool_times.sort();
    helper_times.sort();
    raw_times.sort();
    mcp_times.sort();
    let (raw50, raw99) = (percentile(&raw_times, 0.5), percentile(&raw_times, 0.99));
    let (mcp50, mcp99) = (percentile(&mcp_times, 0.5), percentile(&mcp_times, 0.99));
    println!("round trip of (+ 1 2), {iterations} interleaved iterations against one SBCL {port}:");
    println!("  raw swank:eval-and-grab-output   p50 {:8.1} µs   p99 {:8.1} µs", micros(raw50), micros(raw99));
    println!(
        "  raw mcp-agent-helper:evaluate    p50 {:8.1} µs   p99 {:8.1} µs",
        micros(percentile(&helper_times, 0.5)),
        micros(percentile(&helper_times, 0.99))
    );
    println!(
        "  evaluate-lisp tool in process    p50 {:8.1} µs   p99 {:8.1} µs",
        micros(percentile(&tool_times, 0.5)),
        micros(percentile(&tool_times, 0.99))
    );
    println!("  evaluate-lisp through swank-mcp  p50 {:8.1} µs   p99 {:8.1} µs", micros(mcp50), micros(mcp99));
    println!(
        "  ratio                            p50 {:8.2}x     p99 {:8.2}x",
        micros(mcp50) / micros(raw50),
        micros(mcp99) / micros(raw99)
    );
    let (relay50, relay99) = (percentile(&relay_times, 0.5), percentile(&relay_times, 0.99));
    println!(
        "  floor: a minimal relay process   p50 {:8.1} µs   p99 {:8.1} µs   ratio p50 {:.2}x",
        micros(relay50),
        micros(relay99),
        micros(relay50) / micros(raw50)
    );
    if let Some(baseline) = &baseline {
        baseline_raw_times.sort();
        baseline_times.sort();
        let (base_raw50, base_raw99) = (percentile(&baseline_raw_times, 0.5), percentile(&baseline_raw_times, 0.99));
        let (base50, base99) = (percentile(&baseline_times, 0.5), percentile(&baseline_times, 0.99));
        println!("  baseline {} on an image of its own, interleaved with the above:", baseline.revision);
        println!(
            "    raw swank:eval-and-grab-output p50 {:8.1} µs   p99 {:8.1} µs",
            micros(base_raw50),
            micros(base_raw99)
        );
        println!("    evaluate-lisp through swank-mcp p50 {:8.1} µs   p99 {:8.1} µs", micros(base50), micros(base99));
        println!(
            "    ratio                          p50 {:8.2}x     p99 {:8.2}x",
            micros(base50) / micros(base_raw50),
            micros(base99) / micros(base_raw99)
        );
        println!(
            "  this revision / the baseline     p50 {:8.2}x     p99 {:8.2}x",
            micros(mcp50) / micros(base50),
            micros(mcp99) / micros(base99)
        );
    }

    let cpu_before = mcp.cpu_time();
    let started = Instant::now();
    for _ in 0..iterations {
        mcp.evaluate("(+ 1 2)");
    }
    let elapsed = started.elapsed();
    let cpu = mcp.cpu_time().saturating_sub(cpu_before);
    println!(
        "throughput: {:.0} sequential calls/s; server CPU {:.1} µs per call",
        iterations as f64 / elapsed.as_secs_f64(),
        micros(cpu) / iterations as f64
    );

    let arrivals = mcp.evaluate_concurrently(&["(sleep 0.5)"; 16]);
    println!(
        "16 concurrent (sleep 0.5): all answered after {:.0} ms",
        arrivals.iter().max().unwrap().as_secs_f64() * 1e3
    );
    let idle = {
        let started = Instant::now();
        mcp.evaluate(":quick");
        started.elapsed()
    };
    let arrivals = mcp.evaluate_concurrently(&["(sleep 2)", ":quick"]);
    println!(
        "a quick call while a 2 s one runs: {:.1} ms (idle: {:.1} ms)",
        arrivals[1].as_secs_f64() * 1e3,
        idle.as_secs_f64() * 1e3
    );

    let rss_before = mcp.peak_rss_kib();
    let started = Instant::now();
    let (reply, bytes) = mcp.evaluate("(dotimes (i 400000) (write-string \"0123456789\"))");
    let elapsed = started.elapsed();
    assert!(reply["result"]["content"][0]["text"].as_str().unwrap().contains("more characters not shown"));
    println!(
        "4 MB print: {:.0} ms, response {} bytes, server peak RSS {:.1} MiB (before: {:.1} MiB)",
        elapsed.as_secs_f64() * 1e3,
        bytes,
        mcp.peak_rss_kib() as f64 / 1024.0,
        rss_before as f64 / 1024.0
    );

    let started = Instant::now();
    let (reply, bytes) = mcp.evaluate("(make-string 5000000 :initial-element #\\x)");
    let elapsed = started.elapsed();
    assert!(reply["result"]["content"][0]["text"].as_str().unwrap().contains("more characters not shown"));
    println!(
        "5 MB value:  {:.0} ms, response {} bytes, server peak RSS {:.1} MiB",
        elapsed.as_secs_f64() * 1e3,
        bytes,
        mcp.peak_rss_kib() as f64 / 1024.0
    );
    drop(mcp.stdin);
    let _ = mcp.child.wait();

    // The same comparison from a Python client, which pays its interpreter's cost on both paths
    // alike: a ratio that only this client sees would point at the client, not the server.
    println!("the same round trips from a Python client (benches/overhead_client.py), {iterations} interleaved:");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/overhead_client.py");
    // The baseline's server is closed first: the Python client starts its own.
    let baseline = baseline.map(|mut baseline| {
        drop(baseline.mcp.stdin);
        let _ = baseline.mcp.child.wait();
        (baseline.binary, baseline.port)
    });
    let mut python = Command::new("python3");
    python.args([
        script,
        "--port",
        &port.to_string(),
        "--server",
        env!("CARGO_BIN_EXE_swank-mcp"),
        "--calls",
        &iterations.to_string(),
        "--relay",
        &std::env::current_exe().expect("the bench's own path").to_string_lossy(),
    ]);
    if let Some((binary, port)) = &baseline {
        python.arg("--baseline-server").arg(binary).args(["--baseline-port", &port.to_string()]);
    }
    let python = python.status();
    if !python.is_ok_and(|status| status.success()) {
        println!("  (not measured: python3 could not run {script})");
    }
    drop(image);
    drop(baseline_image);
}
