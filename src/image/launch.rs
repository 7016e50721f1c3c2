//! Starts a private SBCL image with a swank server, for `--launch` and for the test suite.
//!
//! The image reads its start-up script from standard input and then waits on that same pipe:
//! when this process exits, however it exits, the pipe closes and the image quits. Nothing is
//! left running behind a crashed server.
//!
//! See docs/design.md, "The image".

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use super::{lock, ImageError, LaunchSettings};
use crate::swank::Endpoint;

const LAUNCH_SCRIPT: &str = include_str!("../lisp/launch.lisp");
/// The line launch.lisp prints once swank listens.
const PORT_MARKER: &str = "swank-mcp-port: ";
/// The line launch.lisp prints before swank-loader compiles swank (a first start).
const COMPILING_MARKER: &str = "swank-mcp-compiling";

/// The log file a private image's output goes to: `swank-mcp/launch.log` under the user's cache
/// directory (`~/.cache` on Linux).
pub fn log_path() -> Option<PathBuf> {
    dirs::cache_dir().map(|dir| dir.join("swank-mcp").join("launch.log"))
}

/// A log larger than this is moved to `launch.log.old` when the next image starts.
const LOG_ROTATE_BYTES: u64 = 4 * 1024 * 1024;

/// Opens the launch log for appending (several images may share it) with a header for this
/// start; `None` if it cannot be, and then the image's output goes to our stderr as before.
fn open_log(loader: &Path) -> Option<(PathBuf, std::fs::File)> {
    use std::io::Write;
    let path = log_path()?;
    std::fs::create_dir_all(path.parent()?).ok()?;
    if std::fs::metadata(&path).is_ok_and(|m| m.len() > LOG_ROTATE_BYTES) {
        let _ = std::fs::rename(&path, path.with_extension("log.old"));
    }
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).ok()?;
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    writeln!(file, "\n=== {now}: swank-mcp (pid {}) starts sbcl with {}", std::process::id(), loader.display()).ok()?;
    Some((path, file))
}

/// How long a first start may take: the first load compiles swank (tens of seconds on a small
/// machine); later starts load cached fasls in about a second.
pub const START_TIMEOUT: Duration = Duration::from_secs(300);

/// Why no image could be launched.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// `sbcl` could not be started (not installed or not on `PATH`).
    #[error("cannot run `sbcl` ({0}). Install SBCL first, for example: sudo apt-get install -y sbcl cl-swank")]
    NoSbcl(std::io::Error),
    /// No `swank-loader.lisp` was found; carries the paths looked at.
    #[error(
        "cannot find swank. Install it (sudo apt-get install -y cl-swank), or point --swank-loader at the \
         swank-loader.lisp of a SLIME checkout or Quicklisp/ELPA install. Looked in: {}",
        .0.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NoSwank(Vec<PathBuf>),
    /// The image ended before announcing its port; carries its exit status (or the pipe that was
    /// missing) and where its messages are, as text.
    #[error("the launched SBCL exited before its swank server started ({0}); {1}")]
    Exited(String, String),
    /// The image did not announce its port within [`START_TIMEOUT`]; carries where its messages are.
    #[error("the launched SBCL did not start swank within {0:?}; {1}")]
    Timeout(Duration, String),
    /// Talking to the image's standard input or output failed.
    #[error("launching SBCL failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A running private image. Dropping it closes the image's standard input, which stops it, and
/// kills the process in case it is stuck.
#[derive(Debug)]
pub struct LaunchedImage {
    /// The port its swank server listens on.
    pub port: u16,
    pub(crate) pid: Option<u32>,
    child: Child,
    _lifeline: ChildStdin,
}

impl LaunchedImage {
    /// How the process ended, once it has: "exit code 3", "signal 9".
    fn ended(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        Some(match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            (None, None) => status.to_string(),
        })
    }
}

/// The places swank is installed by Debian's `cl-swank`, Quicklisp and Emacs package managers,
/// most specific first.
pub fn swank_loader_candidates() -> Vec<PathBuf> {
    let mut candidates = vec![PathBuf::from("/usr/share/common-lisp/source/slime/swank-loader.lisp")];
    if let Some(home) = dirs::home_dir() {
        for (dir, prefix) in [
            (home.join("quicklisp/dists/quicklisp/software"), "slime-"),
            (home.join(".emacs.d/elpa"), "slime-"),
            (home.join(".config/emacs/elpa"), "slime-"),
        ] {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
                .map(|entry| entry.path().join("swank-loader.lisp"))
                .collect();
            // Newest version last in lexical order; prefer it.
            found.sort();
            candidates.extend(found.into_iter().rev());
        }
    }
    candidates
}

/// The `swank-loader.lisp` to launch with: `explicit` if given (it must be a file), otherwise the
/// first of [`swank_loader_candidates`] that exists.
pub fn find_swank_loader(explicit: Option<&Path>) -> Result<PathBuf, LaunchError> {
    if let Some(path) = explicit {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(LaunchError::NoSwank(vec![path.to_path_buf()]))
        };
    }
    let candidates = swank_loader_candidates();
    candidates.iter().find(|p| p.is_file()).cloned().ok_or(LaunchError::NoSwank(candidates))
}

/// Starts `sbcl` with swank listening on `interface:port` (port 0 picks a free one) and waits
/// until the server is up. The image's output (swank's compile log on a first start, its
/// warnings, anything its threads print) goes to the log file [`log_path`], not to the terminal;
/// a failure to start names that file. On a first start, which compiles swank, one line on
/// stderr says that it takes a minute.
pub async fn launch(loader: &Path, interface: &str, port: u16) -> Result<LaunchedImage, LaunchError> {
    let log = open_log(loader);
    let (stderr, messages) = match &log {
        Some((path, file)) => (Stdio::from(file.try_clone()?), format!("its messages are in {}", path.display())),
        // The image's own diagnostics go where ours go; never to our stdout, which belongs to
        // the MCP protocol.
        None => (Stdio::inherit(), "its messages are on stderr above".to_string()),
    };
    let mut log_file = log.map(|(_, file)| file);
    let mut child = Command::new("sbcl")
        .arg("--noinform")
        .env("SWANK_MCP_LOADER", loader)
        .env("SWANK_MCP_PORT", port.to_string())
        .env("SWANK_MCP_INTERFACE", interface)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(LaunchError::NoSbcl)?;
    let exited = |what: &str| LaunchError::Exited(what.to_string(), messages.clone());
    let mut stdin = child.stdin.take().ok_or_else(|| exited("no stdin pipe"))?;
    stdin.write_all(LAUNCH_SCRIPT.as_bytes()).await?;
    stdin.flush().await?;
    let stdout = child.stdout.take().ok_or_else(|| exited("no stdout pipe"))?;
    let mut lines = BufReader::new(stdout).lines();
    let wait_for_port = async {
        while let Some(line) = lines.next_line().await? {
            // The REPL that reads the script may print its prompt on the same line.
            let announced = line.find(PORT_MARKER).and_then(|at| line[at + PORT_MARKER.len()..].trim().parse().ok());
            if let Some(port) = announced {
                return Ok(Some(port));
            }
            if line.contains(COMPILING_MARKER) {
                eprintln!("swank-mcp: compiling swank for this SBCL, once; this takes about a minute");
                continue;
            }
            log_line(&mut log_file, &line).await;
        }
        Ok::<_, std::io::Error>(None)
    };
    let port = match tokio::time::timeout(START_TIMEOUT, wait_for_port).await {
        Err(_) => return Err(LaunchError::Timeout(START_TIMEOUT, messages)),
        Ok(Err(e)) => return Err(e.into()),
        Ok(Ok(None)) => {
            let status = child.wait().await.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
            return Err(LaunchError::Exited(status, messages));
        }
        Ok(Ok(Some(port))) => port,
    };
    // Keep draining the image's stdout (the REPL prompt and any prints from its threads) into
    // the log, so that it can never block on a full pipe.
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            log_line(&mut log_file, &line).await;
        }
    });
    let pid = child.id();
    tracing::info!(port, ?pid, "launched a private SBCL image");
    Ok(LaunchedImage { port, pid, child, _lifeline: stdin })
}

/// A line of the image's standard output, to the log file if there is one, else to our log.
/// A line to a local file: short enough not to hold up the runtime.
async fn log_line(file: &mut Option<std::fs::File>, line: &str) {
    match file {
        Some(file) => {
            use std::io::Write;
            let _ = writeln!(file, "{line}");
        }
        None => tracing::debug!(target: "sbcl", "{line}"),
    }
}

/// The private image --launch starts. A start runs in a task of its own: a call whose time limit
/// passes while SBCL starts (its first start compiles swank for a minute) stops waiting, and the
/// start goes on for the next call.
pub(crate) struct Launcher {
    settings: LaunchSettings,
    host: String,
    port: u16,
    state: std::sync::Mutex<LaunchState>,
}

#[derive(Default)]
struct LaunchState {
    image: Option<LaunchedImage>,
    starting: Option<Shared<BoxFuture<'static, Result<Endpoint, ImageError>>>>,
    /// Set when an image replaced one that had ended, until the next reply says so.
    replaced: Option<String>,
}

impl Launcher {
    pub(crate) fn new(settings: LaunchSettings, host: String, port: u16) -> Self {
        Launcher { settings, host, port, state: std::sync::Mutex::new(LaunchState::default()) }
    }

    /// The pid of the image it started, when it has started one (`None` inside it when the
    /// process has no pid to report).
    pub(crate) fn pid(&self) -> Option<Option<u32>> {
        lock(&self.state).image.as_ref().map(|image| image.pid)
    }

    /// What the next reply must say when the image it started had ended and a new one was
    /// started in its place; taken once.
    pub(crate) fn take_replacement_note(&self) -> Option<String> {
        lock(&self.state).replaced.take()
    }

    /// How the image it started ended, waiting up to `within` for it to end: a call that lost its
    /// connection because the image exits says so with the exit code, not only the next reply.
    pub(crate) async fn ended_within(&self, within: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let ended = lock(&self.state).image.as_mut()?.ended();
            if ended.is_some() || tokio::time::Instant::now() >= deadline {
                return ended;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(crate) fn endpoint(&self) -> Option<Endpoint> {
        lock(&self.state).image.as_ref().map(|image| Endpoint { host: self.host.clone(), port: image.port })
    }

    /// Starts the private image on the configured port (only reached when nothing answers
    /// there, so the port is free unless something else grabbed it meanwhile), or waits for the
    /// start under way.
    pub(crate) async fn start(self: &Arc<Self>) -> Result<Endpoint, ImageError> {
        let starting = {
            let mut state = lock(&self.state);
            match &state.starting {
                Some(starting) => starting.clone(),
                None => {
                    let task = tokio::spawn(self.clone().run());
                    let starting = async move {
                        task.await.unwrap_or_else(|e| Err(ImageError::Launch(format!("the start failed: {e}"))))
                    }
                    .boxed()
                    .shared();
                    state.starting = Some(starting.clone());
                    starting
                }
            }
        };
        starting.await
    }

    async fn run(self: Arc<Self>) -> Result<Endpoint, ImageError> {
        let started = async {
            let loader = find_swank_loader(self.settings.swank_loader.as_deref()).map_err(|e| ImageError::Launch(e.to_string()))?;
            tracing::info!(loader = %loader.display(), host = %self.host, port = self.port, "nothing answers; launching SBCL");
            // The one line the terminal shows for a start (two on the first, which compiles swank).
            eprintln!("swank-mcp: starting a private SBCL image with swank on {}:{}", self.host, self.port);
            launch(&loader, &self.host, self.port).await.map_err(|e| ImageError::Launch(e.to_string()))
        }
        .await;
        let mut state = lock(&self.state);
        state.starting = None;
        let image = started?;
        let endpoint = Endpoint { host: self.host.clone(), port: image.port };
        if let Some(mut previous) = state.image.replace(image) {
            let ended = previous.ended().map_or_else(String::new, |how| format!(" ({how})"));
            state.replaced = Some(format!(
                "[notes]\nThe private SBCL image swank-mcp had started ended{ended}; this call ran in a fresh image \
                 that swank-mcp started in its place. Everything defined or loaded in the earlier image is gone."
            ));
        }
        Ok(endpoint)
    }
}
