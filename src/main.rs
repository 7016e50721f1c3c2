//! `swank-mcp`: an MCP stdio server for AI agents on one side, a swank/slynk client attached to a
//! live Common Lisp image on the other; plus one-shot `eval` and `status` commands for people
//! and scripts.
//!
//! See docs/design.md, "Layers".

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use swank_mcp::emacs::activity::ActivityFeed;
use swank_mcp::emacs::approval::EmacsApproval;
use swank_mcp::image::{ImageSettings, LaunchSettings};
use swank_mcp::mcp::audit::AuditLog;
use swank_mcp::mcp::ServeOptions;
use swank_mcp::pipeline::observe::Observer;
use swank_mcp::pipeline::{Ask, Call, Caller, ConfirmPolicy, Pipeline};
use swank_mcp::source::AllowedRoots;
use swank_mcp::swank::{ConnectOptions, Endpoint, Protocol};
use swank_mcp::tools::{Settings, ToolSelection, Toolbox};

/// How `swank-mcp eval`'s calls are named in the image's activity record, where an MCP client's
/// calls have the client's name.
const SHELL_CLIENT: &str = "swank-mcp eval";

/// The most output a section may keep: four sections of this size still fit one swank frame
/// (16 MiB) with room for the rest of the reply.
const MAX_OUTPUT_LIMIT: usize = 3 * 1024 * 1024;

#[derive(Parser, Debug)]
#[command(
    name = "swank-mcp",
    version,
    about = "MCP server that lets AI agents work inside your live Common Lisp image through swank (SLIME) or slynk (SLY)",
    long_about = None,
    after_help = "Without a command, serves MCP on stdin/stdout (the way MCP clients start it).\n\
                  Open a port in your image with (swank:create-server :port 4005 :dont-close t), or use --launch."
)]
struct Cli {
    /// Host of the swank/slynk server.
    #[arg(long, env = "SWANK_MCP_HOST", default_value = "127.0.0.1", global = true)]
    host: String,

    /// Port of the swank/slynk server.
    #[arg(long, env = "SWANK_MCP_PORT", default_value_t = 4005, global = true)]
    port: u16,

    /// Server dialect: swank (SLIME), slynk (SLY), or auto to detect it.
    #[arg(long, default_value = "auto", value_parser = parse_protocol, global = true)]
    protocol: Protocol,

    /// File whose first line is the server's secret (default: ~/.slime-secret or ~/.sly-secret when present).
    #[arg(long, global = true)]
    secret_file: Option<PathBuf>,

    /// Default time limit of an evaluation, e.g. 30s, 500ms, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_duration, global = true)]
    eval_timeout: Duration,

    /// How long an evaluation stopped in the debugger (evaluate-lisp with debug) waits for the
    /// debugger tool before it is aborted, and a thread at an agent's breakpoint before it goes
    /// on, e.g. 10m, 90s.
    #[arg(long, default_value = "10m", value_parser = parse_duration, global = true)]
    debug_timeout: Duration,

    /// Let an evaluation end an image that swank-mcp did not start ((sb-ext:exit), (uiop:quit));
    /// without it such a call fails with EXIT-REFUSED and the image keeps running.
    #[arg(long, global = true)]
    allow_exit: bool,

    /// Characters shown of each output section (its start and its end) and printed value; the image
    /// keeps up to 64 times this (and of a section, a quarter as many of its end) behind a handle
    /// that the inspect tool reads in slices.
    #[arg(long, default_value_t = 16000, value_parser = parse_max_output, global = true)]
    max_output: usize,

    /// How long to wait for the server to accept a connection.
    #[arg(long, default_value = "5s", value_parser = parse_duration, global = true)]
    connect_timeout: Duration,

    /// Register an image as NAME=HOST:PORT; repeatable. Tools then take an `image` argument naming one
    /// (default: the first); --host and --port are not used.
    #[arg(long = "connect", value_name = "NAME=HOST:PORT", value_parser = parse_connect, global = true)]
    connect: Vec<NamedEndpoint>,

    /// When nothing answers at host:port, start a private SBCL with swank there (stopped when swank-mcp exits).
    #[arg(long, global = true)]
    launch: bool,

    /// Directory whose files the source tools (edit-lisp-form, ...) may read and write; repeatable. Default: the working directory.
    #[arg(long = "root", value_name = "DIR", global = true)]
    roots: Vec<PathBuf>,

    #[arg(long, global = true, help = read_only_help())]
    read_only: bool,

    /// Offer only these tools, comma-separated (for example evaluate-lisp,describe-symbol); with --read-only, only read-only ones.
    #[arg(long, value_delimiter = ',', value_name = "TOOL,...", global = true)]
    tools: Vec<String>,

    /// Tools whose calls wait for the user's approval before they run, comma-separated; `mutating` means every
    /// tool that is not read-only, but for calls that only look (a threads list). Asked through MCP elicitation when the client supports it; refused otherwise.
    #[arg(long, value_delimiter = ',', value_name = "TOOL,...", global = true)]
    confirm: Vec<String>,

    /// The name the agent goes by in the user's Emacs (activity buffer, approval prompts) and the audit log, in place
    /// of its MCP client's name (clientInfo): give each agent its own when several run the same client.
    #[arg(long, value_name = "NAME", global = true)]
    name: Option<String>,

    /// How long a call waits for the user's approval (--confirm) before it is refused.
    #[arg(long, default_value = "5m", value_parser = parse_duration, global = true)]
    confirm_timeout: Duration,

    /// Append one JSON line per tool call (time, client, tool, arguments, outcome, duration) to FILE.
    #[arg(long, value_name = "FILE", global = true)]
    audit_log: Option<PathBuf>,

    /// Size past which the audit log is renamed to FILE.1 and a new one started, e.g. 10M, 512K.
    #[arg(long, default_value = "10M", value_parser = parse_size, global = true)]
    audit_log_max_size: u64,

    /// Send each tool result's facts as JSON (structuredContent) beside its text, for clients that read
    /// them. Off by default: some clients then show the model only that JSON, without the text's notes.
    #[arg(long, global = true)]
    structured_content: bool,

    /// swank-loader.lisp to use with --launch (default: Debian's cl-swank, Quicklisp or ELPA installs).
    #[arg(long, global = true)]
    swank_loader: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve MCP on stdin/stdout (the default).
    Serve,
    /// Evaluate CODE in the image and print the result as evaluate-lisp does; exit code 1 on a Lisp error.
    Eval {
        /// Common Lisp code; `-` reads it from standard input.
        code: String,
        /// Package to evaluate in.
        #[arg(long)]
        package: Option<String>,
        /// Image to evaluate in, by its --connect name (default: the first).
        #[arg(long)]
        image: Option<String>,
    },
    /// Say what swank-mcp connects to and what answers there.
    Status,
    /// Take swank-mcp's helper out of the image: its encapsulations, hooks, threads, sessions and package.
    Uninstall {
        /// Only once the last session of a swank-mcp attached to the image has ended.
        #[arg(long)]
        when_sessions_end: bool,
    },
}

#[derive(Debug, Clone)]
struct NamedEndpoint {
    name: String,
    endpoint: Endpoint,
}

fn parse_connect(text: &str) -> Result<NamedEndpoint, String> {
    let usage = || format!("{text:?} is not NAME=HOST:PORT (for example work=127.0.0.1:4006)");
    let (name, address) = text.split_once('=').ok_or_else(usage)?;
    let (host, port) = address.rsplit_once(':').ok_or_else(usage)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("image name {name:?} must be letters, digits, - or _"));
    }
    let port = port.parse().map_err(|_| usage())?;
    if host.is_empty() {
        return Err(usage());
    }
    Ok(NamedEndpoint { name: name.to_string(), endpoint: Endpoint { host: host.to_string(), port } })
}

fn parse_protocol(text: &str) -> Result<Protocol, String> {
    text.parse()
}

/// Accepts `30s`, `500ms`, `2m`, `1h`, or a plain number of seconds.
/// A duration as humantime reads it (`30s`, `500ms`, `2m`, `1m 30s`), or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let duration = match text.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(text)
            .map_err(|e| format!("{text:?} is not a duration such as 30s, 500ms or 2m: {e}"))?,
    };
    // Past about four months the deadlines built from it overflow.
    if duration.is_zero() || duration > Duration::from_secs(10_000_000) {
        return Err(format!("{text:?} is out of range: give more than 0 and less than 115 days"));
    }
    Ok(duration)
}

fn parse_size(text: &str) -> Result<u64, String> {
    let usage = || format!("{text:?} is not a size such as 10M, 512K or 1048576");
    let (digits, unit) = match text.trim().char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.trim().split_at(i),
        None => (text.trim(), ""),
    };
    let scale: u64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return Err(usage()),
    };
    let n: u64 = digits.parse().map_err(|_| usage())?;
    match n.checked_mul(scale) {
        Some(0) => Err("must be more than 0".into()),
        Some(size) => Ok(size),
        None => Err(usage()),
    }
}

fn parse_max_output(text: &str) -> Result<usize, String> {
    let n: usize = text.parse().map_err(|_| format!("{text:?} is not a number of characters"))?;
    if n == 0 || n > MAX_OUTPUT_LIMIT {
        return Err(format!("must be between 1 and {MAX_OUTPUT_LIMIT} (a swank frame holds at most 16 MiB)"));
    }
    Ok(n)
}

/// The secret to send first: `--secret-file`, or the dialect's usual file when it exists. Like
/// SLIME, only the first line counts.
fn read_secret(cli: &Cli) -> anyhow::Result<Option<String>> {
    let path = match &cli.secret_file {
        Some(path) => path.clone(),
        None => {
            let Some(home) = dirs::home_dir() else { return Ok(None) };
            let candidates: &[&str] = match cli.protocol {
                Protocol::Swank => &[".slime-secret"],
                Protocol::Slynk => &[".sly-secret"],
                Protocol::Auto => &[".slime-secret", ".sly-secret"],
            };
            // Not only regular files: a FIFO or directory there is refused below, where skipping it
            // would connect without the secret.
            let present: Vec<PathBuf> = candidates.iter().map(|name| home.join(name)).filter(|p| p.exists()).collect();
            // Which server answers is known only after the secret is sent, and a wrong secret
            // wedges the server's accept thread, so there is no second try: say which was chosen.
            if present.len() > 1 {
                tracing::warn!(
                    "both ~/.slime-secret and ~/.sly-secret exist; sending ~/.slime-secret \
                     (pass --protocol slynk or --secret-file for a SLY image)"
                );
            }
            match present.into_iter().next() {
                Some(path) => path,
                None => return Ok(None),
            }
        }
    };
    let text = read_secret_file(&path).with_context(|| format!("cannot read the secret file {}", path.display()))?;
    tracing::debug!(path = %path.display(), "using a secret file");
    Ok(Some(text.lines().next().unwrap_or_default().to_string()))
}

/// The most a secret file may hold. It holds one line: a larger file is not one (a device, a log
/// named by mistake), and reading it whole could take the server's memory.
const MAX_SECRET_FILE: u64 = 4096;

/// Reads a secret file, refusing what is not a small regular file. Links are followed: a dotfile
/// manager links ~/.slime-secret, and reading through a link writes nothing.
fn read_secret_file(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    // Checked before opening: opening a FIFO waits for a writer, and opening a device may act on it.
    check_secret_file(&std::fs::metadata(path)?)?;
    // A FIFO put there since the check opens at once with O_NONBLOCK, to be refused below, instead
    // of blocking the start. O_NONBLOCK changes nothing for a regular file.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    check_secret_file(&file.metadata()?)?;
    // Bounded again: the file may have grown since, or report no size (as /proc's files do).
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_FILE + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SECRET_FILE {
        bail!("it holds more than {MAX_SECRET_FILE} bytes; a secret file holds one line, the secret");
    }
    String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("it is not UTF-8 text"))
}

fn check_secret_file(metadata: &std::fs::Metadata) -> anyhow::Result<()> {
    if let Some(kind) = swank_mcp::source::not_regular(metadata) {
        bail!("it is {kind}, not a regular file; a secret file holds the secret on its first line");
    }
    if metadata.len() > MAX_SECRET_FILE {
        bail!(
            "it is {} bytes, more than the {MAX_SECRET_FILE} a secret file may hold (one line, the secret)",
            metadata.len()
        );
    }
    Ok(())
}

fn toolbox(cli: &Cli) -> anyhow::Result<Arc<Toolbox>> {
    let endpoints = if cli.connect.is_empty() {
        vec![NamedEndpoint { name: "default".into(), endpoint: Endpoint { host: cli.host.clone(), port: cli.port } }]
    } else {
        cli.connect.clone()
    };
    if let Some(twice) = endpoints.iter().enumerate().find(|(i, e)| endpoints[..*i].iter().any(|o| o.name == e.name)) {
        bail!("--connect names the image {:?} twice", twice.1.name);
    }
    let connect =
        ConnectOptions { connect_timeout: cli.connect_timeout, secret: read_secret(cli)?, protocol: cli.protocol };
    let images = endpoints
        .into_iter()
        .map(|NamedEndpoint { name, endpoint }| {
            if !endpoint.is_loopback() {
                tracing::warn!(
                    %endpoint,
                    "swank traffic is not encrypted and lets the peer run any code; prefer an SSH tunnel \
                     (ssh -L 4005:localhost:4005 HOST) and a loopback address"
                );
            }
            ImageSettings {
                name,
                endpoint,
                connect: connect.clone(),
                launch: cli.launch.then(|| LaunchSettings { swank_loader: cli.swank_loader.clone() }),
            }
        })
        .collect();
    let settings = Settings {
        eval_timeout: cli.eval_timeout,
        max_output: cli.max_output,
        debug_timeout: cli.debug_timeout,
        allow_exit: cli.allow_exit,
        value_handles: !matches!(cli.command, Some(Command::Eval { .. })),
    };
    let roots = AllowedRoots::new(cli.roots.clone()).context("checking the --root directories")?;
    let selection = ToolSelection { only: cli.tools.clone(), read_only: cli.read_only };
    let toolbox = Toolbox::new(settings, images, roots).select(&selection).map_err(anyhow::Error::msg)?;
    Ok(Arc::new(toolbox))
}

/// `--confirm` (asked in the image's Emacs when the caller cannot ask), the image's activity
/// record `activity` and `--audit-log`, which the MCP server and `swank-mcp eval` both honour: the
/// one place the front ends are wired to the pipeline.
fn serve_options(cli: &Cli, toolbox: &Toolbox, activity: ActivityFeed) -> anyhow::Result<ServeOptions> {
    let confirm = ConfirmPolicy::new(&cli.confirm, toolbox, cli.confirm_timeout).map_err(anyhow::Error::msg)?;
    let mut observers: Vec<Box<dyn Observer>> = vec![Box::new(activity)];
    if let Some(path) = &cli.audit_log {
        let audit = AuditLog::open(path, cli.audit_log_max_size)
            .with_context(|| format!("cannot open the audit log {}", path.display()))?;
        observers.push(Box::new(Arc::new(audit)));
    }
    // Its requests around the question (settling it, keeping an allowance) are the server's own
    // evaluations in the image, with the default time limit.
    let asks: Arc<dyn Ask> = Arc::new(EmacsApproval::new(cli.eval_timeout));
    Ok(ServeOptions {
        confirm,
        asks: Some(asks),
        observers,
        structured_content: cli.structured_content,
        name: cli.name.clone(),
    })
}

/// Runs `swank-mcp eval`'s one call as an agent's calls run: approved when `--confirm` names
/// evaluate-lisp (in the image's Emacs: a shell has no MCP client to ask through), recorded in the
/// image's activity record and in `--audit-log`.
async fn eval(cli: &Cli, toolbox: &Arc<Toolbox>, arguments: serde_json::Value) -> anyhow::Result<ExitCode> {
    let evaluate = swank_mcp::tools::evaluate_lisp::TOOL.definition.name;
    if !toolbox.definitions().any(|tool| tool.name == evaluate) {
        bail!("{evaluate} is not offered here (see --read-only and --tools)");
    }
    // Recorded as an agent's calls are: an agent with a shell may run this command, and the
    // human watching the image's activity buffer should see what it ran.
    let ServeOptions { confirm, asks, observers, .. } = serve_options(cli, toolbox, ActivityFeed::one_shot())?;
    let pipeline = Pipeline::new(toolbox.clone(), confirm, asks, observers);
    let caller = Caller {
        client: cli.name.clone().unwrap_or_else(|| SHELL_CLIENT.to_string()),
        asks: None,
        cannot_ask: "swank-mcp eval cannot ask for it (a shell has no MCP client to ask through)".to_string(),
    };
    let call = Call {
        tool: evaluate,
        arguments: Some(arguments),
        caller: &caller,
        cancel: CancellationToken::new(),
        progress: Default::default(),
    };
    let output = pipeline.call(call).await.with_context(|| format!("{evaluate} is not offered here"))?;
    pipeline.finish().await;
    // A one-shot session: nothing of it is of use once this command has printed.
    toolbox.end_sessions().await;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", output.text)?;
    Ok(if output.is_error { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Keeps a timer due within [`ARMED_PERIOD`] for as long as the server runs. Every tool call waits
/// on a deadline (30 s by default); when it is the earliest timer, registering it makes tokio's
/// time driver wake its own thread (an eventfd write and one more `epoll_wait`, on the path of
/// every call) to shorten the current sleep. With this timer always earlier, a call's deadline
/// never is, at the price of a wakeup every ten seconds.
async fn keep_time_driver_armed() {
    const ARMED_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);
    loop {
        tokio::time::sleep(ARMED_PERIOD).await;
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let toolbox = toolbox(&cli)?;
    match &cli.command {
        None | Some(Command::Serve) => {
            let stdin = swank_mcp::mcp::stdio::stdin()?;
            let stdout = swank_mcp::mcp::stdio::stdout()?;
            // A task of its own rather than the future `block_on` drives: the runtime polls that
            // one only after a trip through its I/O driver, a system call on the path of every
            // response.
            let options = serve_options(&cli, &toolbox, ActivityFeed::start())?;
            tokio::spawn(keep_time_driver_armed());
            let serving = tokio::spawn(swank_mcp::mcp::serve(toolbox.clone(), options, stdin, stdout));
            let served = serving.await.context("the MCP server failed");
            toolbox.abort_debugger_sessions().await;
            toolbox.end_sessions().await;
            served?.context("serving MCP on stdio")?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Eval { code, package, image }) => {
            let code = if code == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading code from standard input")?
            } else {
                code.clone()
            };
            let mut arguments = serde_json::json!({ "code": code });
            if let Some(package) = package {
                arguments["package"] = package.as_str().into();
            }
            if let Some(image) = image {
                arguments["image"] = image.as_str().into();
            }
            eval(&cli, &toolbox, arguments).await
        }
        Some(Command::Status) => status(&toolbox).await,
        Some(Command::Uninstall { when_sessions_end }) => {
            for image in toolbox.images() {
                let done = swank_mcp::image::helper::uninstall(image, *when_sessions_end).await?;
                println!("{}: {done}", image.name());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn status(toolbox: &Toolbox) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for image in toolbox.images() {
        match image.connection().await {
            Ok(connection) => {
                let info = connection.info();
                println!(
                    "{}: connected to {} at {} ({} {}), {} {} on {}{}",
                    image.name(),
                    info.lisp_type.as_deref().unwrap_or("Lisp"),
                    connection.endpoint(),
                    info.lisp_version.as_deref().unwrap_or("?"),
                    info.pid.map(|p| format!("pid {p}")).unwrap_or_default(),
                    connection.dialect().name(),
                    info.version.as_deref().unwrap_or("?"),
                    info.style.as_deref().map(|s| format!(":{s} style")).unwrap_or_default(),
                    match image.launched_pid() {
                        Some(_) => ", launched by swank-mcp for this command",
                        None => "",
                    }
                );
            }
            Err(e) => {
                failed = true;
                println!("{}: {e}", image.name());
            }
        }
    }
    if failed {
        bail!("no image answered");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--read-only`'s help, naming the tools it leaves out as their declarations say: a list written
/// by hand fell behind the tools.
fn read_only_help() -> String {
    let left_out: Vec<&str> = swank_mcp::tools::every_definition()
        .filter(|definition| !definition.read_only)
        .map(|definition| definition.name)
        .collect();
    format!(
        "Offer only the tools that take no Lisp code and change neither the image nor files (no {}); the image then \
         runs only the helper's entries that look",
        left_out.join(", ")
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to stderr: stdout belongs to the MCP protocol.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
                .unwrap_or_else(|_| "swank_mcp=warn,swank-mcp=warn".into()),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("swank-mcp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("swank-mcp: {error}");
            for cause in error.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_takes_name_host_and_port() {
        let named = parse_connect("work=127.0.0.1:4006").unwrap();
        assert_eq!(
            (named.name.as_str(), named.endpoint.host.as_str(), named.endpoint.port),
            ("work", "127.0.0.1", 4006)
        );
        assert_eq!(parse_connect("v6=[::1]:4005").unwrap().endpoint.host, "::1");
        for bad in ["work", "work=host", "=h:1", "a b=h:1", "w=h:port", "w=:4005"] {
            assert!(parse_connect(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("10M").unwrap(), 10 << 20);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["0", "10X", "M", "-1", "99999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(45));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("10 parsecs").is_err());
    }
}
