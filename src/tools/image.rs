//! The Lisp images the tools work in: where each one is, its connection (made on first use and
//! remade after a loss), the helper loaded into it, and this server's REPL session there.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::launch::{self, LaunchedImage};
use crate::swank::{ConnectError, ConnectOptions, Connection, Endpoint, Form, RexError, Sexp, Thread};

/// The Lisp side of the tools as sent to the image: the helper's files in load order (the digest
/// covers them all). Public for the replay tests, which recognise it in recorded requests.
pub const HELPER_SOURCE: &str = concat!(
    include_str!("../lisp/helper.lisp"),
    include_str!("../lisp/introspection.lisp"),
    include_str!("../lisp/compile.lisp"),
    include_str!("../lisp/systems.lisp"),
);
/// The helper's package. It must not contain "swank": Slynk's reader rewrites such tokens.
pub const HELPER_PACKAGE: &str = "mcp-agent-helper";

/// Identifies this revision of the helper text; an image holding another revision reloads.
const HELPER_DIGEST: u64 = fnv1a(HELPER_SOURCE.as_bytes());

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// How long an interrupted evaluation may take to unwind and report before the call gives up on
/// it. Unwinding is immediate unless the thread is inside foreign code or WITHOUT-INTERRUPTS.
const UNWIND_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
pub struct LaunchSettings {
    pub swank_loader: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct ImageSettings {
    pub name: String,
    pub endpoint: Endpoint,
    pub connect: ConnectOptions,
    /// Start a private image when nothing answers at the endpoint.
    pub launch: Option<LaunchSettings>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ImageError {
    #[error(
        "No Lisp image is answering at {endpoint} ({detail}).\n\
         To attach to your running image, open a swank port in it, for example from the SLIME REPL:\n  \
         (swank:create-server :port {port} :dont-close t)\n\
         (with SLY: (slynk:create-server :port {port} :dont-close t)); from Emacs, M-x swank-mcp-start \
         (elisp-compat/swank-mcp.el) does it in one step. Or restart swank-mcp with --launch to start a \
         private SBCL image.",
        port = .endpoint.port
    )]
    Unreachable { endpoint: Endpoint, detail: String },
    #[error("{0}")]
    Connect(String),
    #[error("Could not start a Lisp image: {0}")]
    Launch(String),
    #[error("Could not load the swank-mcp helper into the image at {endpoint}: {detail}")]
    Helper { endpoint: Endpoint, detail: String },
}

/// Why a helper call did not produce a value.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Rex(#[from] RexError),
    #[error(
        "The evaluation was interrupted after {after:?} but did not unwind within {UNWIND_GRACE:?}; its thread may still be \
         running (it may be inside foreign code or WITHOUT-INTERRUPTS).\n{report}"
    )]
    Unresponsive { after: Duration, report: String },
    #[error("The call was cancelled.")]
    Cancelled,
}

/// The limits of one call: a time limit, what to tell the user when it is reached, and the
/// client's cancellation.
#[derive(Debug, Clone)]
pub struct CallLimits {
    pub timeout: Duration,
    /// How to give the call more time, which depends on the tool.
    pub timeout_advice: &'static str,
    pub cancel: CancellationToken,
}

pub struct Image {
    settings: ImageSettings,
    connection: Mutex<Option<Connection>>,
    launched: Mutex<Option<LaunchedImage>>,
    /// This server's REPL session in the image: its package and `*`, `**`, ... live there,
    /// apart from the user's own REPL.
    session: String,
    next_token: AtomicU64,
}

impl Image {
    pub fn new(settings: ImageSettings) -> Self {
        // Unique among the servers attached to one image: the pid and the start time tell
        // processes apart, the counter the images of one process (a clock may tick coarsely).
        static IMAGES_MADE: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let ordinal = IMAGES_MADE.fetch_add(1, Ordering::Relaxed);
        let session = format!("{}-{}-{:x}-{ordinal}", settings.name, std::process::id(), nanos);
        Self { settings, connection: Mutex::new(None), launched: Mutex::new(None), session, next_token: AtomicU64::new(1) }
    }

    pub fn name(&self) -> &str {
        &self.settings.name
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.settings.endpoint
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    /// The live connection, if one is open now; never connects.
    pub async fn current_connection(&self) -> Option<Connection> {
        self.connection.lock().await.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// The connection, made (and the helper loaded) on first use and after a loss. Concurrent
    /// callers wait for one attempt rather than each opening a connection.
    pub async fn connection(&self) -> Result<Connection, ImageError> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(connection.clone());
        }
        // Boxed: connecting and loading the helper is a big state machine that every call's
        // future would otherwise carry inline, while it only runs once per connection.
        let connection = Box::pin(async {
            let connection = self.connect().await?;
            load_helper(&connection).await?;
            Ok::<_, ImageError>(connection)
        })
        .await?;
        *slot = Some(connection.clone());
        Ok(connection)
    }

    async fn connect(&self) -> Result<Connection, ImageError> {
        let endpoint = self.launched_endpoint().await.unwrap_or_else(|| self.settings.endpoint.clone());
        let unreachable = match Connection::connect(endpoint, &self.settings.connect).await {
            Ok(connection) => return Ok(connection),
            Err(ConnectError::Refused(endpoint, detail)) => ImageError::Unreachable { endpoint, detail },
            Err(ConnectError::Timeout(endpoint, after)) => {
                ImageError::Unreachable { endpoint, detail: format!("no answer within {after:?}") }
            }
            Err(e) => return Err(ImageError::Connect(e.to_string())),
        };
        if self.settings.launch.is_none() {
            return Err(unreachable);
        }
        let endpoint = self.launch().await?;
        Connection::connect(endpoint, &self.settings.connect).await.map_err(|e| ImageError::Connect(e.to_string()))
    }

    async fn launched_endpoint(&self) -> Option<Endpoint> {
        let launched = self.launched.lock().await;
        launched.as_ref().map(|image| Endpoint { host: self.settings.endpoint.host.clone(), port: image.port })
    }

    /// Starts the private image on the configured port (only reached when nothing answers
    /// there, so the port is free unless something else grabbed it meanwhile).
    async fn launch(&self) -> Result<Endpoint, ImageError> {
        let settings = self.settings.launch.as_ref().ok_or_else(|| ImageError::Launch("--launch is off".into()))?;
        let mut launched = self.launched.lock().await;
        let loader = launch::find_swank_loader(settings.swank_loader.as_deref()).map_err(|e| ImageError::Launch(e.to_string()))?;
        tracing::info!(loader = %loader.display(), endpoint = %self.settings.endpoint, "nothing answers; launching SBCL");
        let image = launch::launch(&loader, &self.settings.endpoint.host, self.settings.endpoint.port)
            .await
            .map_err(|e| ImageError::Launch(e.to_string()))?;
        let endpoint = Endpoint { host: self.settings.endpoint.host.clone(), port: image.port };
        *launched = Some(image);
        Ok(endpoint)
    }

    /// Whether this server started the image it talks to (and the pid of that process).
    pub async fn launched_pid(&self) -> Option<Option<u32>> {
        self.launched.lock().await.as_ref().map(|image| image.pid)
    }

    fn new_token(&self) -> String {
        format!("{}-{}", self.session, self.next_token.fetch_add(1, Ordering::Relaxed))
    }

    /// Calls `function` of the helper with `args` plus `:session` and `:token`, in a fresh
    /// worker thread. On timeout or cancellation the thread is interrupted through the helper
    /// and unwinds; a timed-out call still returns the helper's report (which names the limit
    /// and keeps the output so far).
    pub async fn call_helper(&self, function: &'static str, args: Vec<Form>, limits: &CallLimits) -> Result<Sexp, CallError> {
        let connection = self.connection().await?;
        let token = self.new_token();
        let session = [Form::Keyword("session"), Form::string(self.session.clone()), Form::Keyword("token"), Form::string(token.clone())];
        let form = Form::call(HELPER_PACKAGE, function, args.into_iter().chain(session));
        let call = connection.rex(form, "COMMON-LISP-USER", Thread::New);
        tokio::pin!(call);
        let interruption = tokio::select! {
            reply = &mut call => return Ok(reply?),
            _ = tokio::time::sleep(limits.timeout) => Interruption::Timeout,
            _ = limits.cancel.cancelled() => Interruption::Cancelled,
        };
        let (kind, reason) = match interruption {
            Interruption::Timeout => (
                "timeout",
                format!(
                    "Evaluation exceeded the time limit of {} ms and was interrupted. {}",
                    limits.timeout.as_millis(),
                    limits.timeout_advice
                ),
            ),
            Interruption::Cancelled => ("cancelled", "The client cancelled the call.".to_string()),
        };
        tracing::debug!(%token, kind, "interrupting an evaluation");
        let cancel = Form::call(HELPER_PACKAGE, "cancel", [Form::string(token.clone()), Form::Keyword(kind), Form::string(reason)]);
        let canceller = connection.clone();
        tokio::spawn(async move {
            if let Err(e) = canceller.rex(cancel, "COMMON-LISP-USER", Thread::New).await {
                tracing::warn!(error = %e, "could not interrupt the evaluation");
            }
        });
        match tokio::time::timeout(UNWIND_GRACE, call).await {
            Ok(_) if interruption == Interruption::Cancelled => Err(CallError::Cancelled),
            Ok(reply) => Ok(reply?),
            Err(_) if interruption == Interruption::Cancelled => Err(CallError::Cancelled),
            Err(_) => Err(CallError::Unresponsive { after: limits.timeout, report: stuck_report(&connection, token).await }),
        }
    }
}

/// What the image says of an evaluation that did not unwind: where its thread waits, and which
/// threads wait for locks held by whom. The question runs in a thread of its own and takes no
/// lock it could wait on, so it answers even when the image is deadlocked.
async fn stuck_report(connection: &Connection, token: String) -> String {
    let request = connection.rex(Form::call(HELPER_PACKAGE, "stuck-report", [Form::string(token)]), "COMMON-LISP-USER", Thread::New);
    let report = match tokio::time::timeout(UNWIND_GRACE, request).await {
        Ok(Ok(report)) => report.as_str().map(str::to_string),
        Ok(Err(e)) => Some(format!("Asking the image what the thread does failed: {e}")),
        Err(_) => None,
    };
    let report = report.unwrap_or_else(|| format!("The image did not say what the thread does within {UNWIND_GRACE:?} either."));
    tracing::warn!(%report, "an interrupted evaluation did not unwind");
    report
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interruption {
    Timeout,
    Cancelled,
}

/// Loads the helper unless the image already holds this revision. A connection to an image that
/// has it costs one small request; the source (some 200 KB) crosses the wire only when the image
/// lacks it. Besides saving the transfer, this keeps it out of swank's event history, which swank
/// dumps to the image's stderr (often the user's *inferior-lisp* buffer) when a connection breaks.
async fn load_helper(connection: &Connection) -> Result<(), ImageError> {
    let digest = format!("{HELPER_DIGEST:016x}");
    let started = std::time::Instant::now();
    let helper_error = |detail: String| ImageError::Helper { endpoint: connection.endpoint().clone(), detail };
    let version_symbol = || Form::call("cl", "find-symbol", [Form::string("*VERSION*"), Form::string("MCP-AGENT-HELPER")]);
    let current_version = || Form::call("cl", "ignore-errors", [Form::call("cl", "symbol-value", [version_symbol()])]);
    let is_current = |reply: &Sexp| reply.as_str() == Some(digest.as_str());
    let version = connection.rex(current_version(), "COMMON-LISP-USER", Thread::New).await.map_err(|e| helper_error(e.to_string()))?;
    if is_current(&version) {
        tracing::debug!(elapsed = ?started.elapsed(), "helper current");
        return Ok(());
    }
    let quiet = |symbol: &'static str, value: Form| Form::List(vec![Form::Symbol("cl", symbol), value]);
    let load = Form::call(
        "cl",
        "let",
        [
            Form::List(vec![
                quiet("*standard-output*", Form::call("cl", "make-broadcast-stream", [])),
                quiet("*error-output*", Form::call("cl", "make-broadcast-stream", [])),
                quiet("*load-verbose*", Form::Nil),
                quiet("*load-print*", Form::Nil),
                quiet("*package*", Form::call("cl", "find-package", [Form::string("COMMON-LISP-USER")])),
                // The standard readtable: the user's may have been changed by their libraries.
                quiet("*readtable*", Form::call("cl", "copy-readtable", [Form::Nil])),
            ]),
            Form::call("cl", "load", [Form::call("cl", "make-string-input-stream", [Form::string(HELPER_SOURCE)])]),
        ],
    );
    // Checked again under the lock: another connection may have loaded it meanwhile.
    let load_if_needed = Form::call(
        "cl",
        "if",
        [
            Form::call("cl", "equal", [current_version(), Form::string(digest.clone())]),
            Form::Keyword("current"),
            Form::call(
                "cl",
                "progn",
                [load, Form::call("cl", "setf", [Form::call("cl", "symbol-value", [version_symbol()]), Form::string(digest.clone())]), Form::Keyword("loaded")],
            ),
        ],
    );
    // Connections that arrive together (several servers, or a test suite) would each compile the
    // helper at once, holding SBCL's compiler lock in turn for seconds. A lock in the helper's
    // package makes the first one load it and the others find it current.
    let lock_symbol = || Form::call("cl", "intern", [Form::string("*LOAD-LOCK*"), Form::string("MCP-AGENT-HELPER")]);
    let request = Form::call(
        "cl",
        "progn",
        [
            Form::call(
                "cl",
                "or",
                [
                    Form::call("cl", "find-package", [Form::string("MCP-AGENT-HELPER")]),
                    // Another connection may create it meanwhile.
                    Form::call(
                        "cl",
                        "ignore-errors",
                        [Form::call(
                            "cl",
                            "make-package",
                            [Form::string("MCP-AGENT-HELPER"), Form::Keyword("use"), Form::call("cl", "list", [Form::string("COMMON-LISP")])],
                        )],
                    ),
                ],
            ),
            Form::call(
                "cl",
                "unless",
                [
                    Form::call("cl", "boundp", [lock_symbol()]),
                    Form::call(
                        "cl",
                        "setf",
                        [
                            Form::call("cl", "symbol-value", [lock_symbol()]),
                            Form::call("sb-thread", "make-mutex", [Form::Keyword("name"), Form::string("mcp-agent-helper load")]),
                        ],
                    ),
                ],
            ),
            Form::call("sb-thread", "with-mutex", [Form::List(vec![Form::call("cl", "symbol-value", [lock_symbol()])]), load_if_needed]),
        ],
    );
    let state = connection.rex(request, "COMMON-LISP-USER", Thread::New).await.map_err(|e| helper_error(e.to_string()))?;
    tracing::debug!(%state, elapsed = ?started.elapsed(), "helper ready");
    Ok(())
}
