//! The image layer: the Lisp images the tools work in: where each one is, its connection (made on first use and
//! remade after a loss), the helper loaded into it, and this server's REPL session there.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::swank::{
    ConnectError, ConnectOptions, Connection, DebuggableRex, Endpoint, Form, RexError, RexEvent, Sexp, Thread,
};

pub mod call_tag;
pub mod helper;
pub mod launch;

use helper::{load_helper, start_worker, HELPER_PACKAGE};
use launch::Launcher;

/// How long an interrupted evaluation may take to unwind and report before the call gives up on
/// it. Unwinding is immediate unless the thread is inside foreign code or WITHOUT-INTERRUPTS, or
/// a cleanup form it unwinds through waits for a lock (SBCL's compiler, interrupted while it
/// waits for the world lock, waits for it again in its cleanup).
const UNWIND_GRACE: Duration = Duration::from_secs(3);

/// How long a call whose evaluation ended without a value waits for the connection to close,
/// which is how an exiting image shows itself.
const EXIT_WINDOW: Duration = Duration::from_secs(1);

/// How long [`Image::connection`] waits for the connection and the helper. It serves `swank-mcp
/// status`, which has no time limit of its own; a first helper load on a slow machine fits.
const STANDALONE_LIMIT: Duration = Duration::from_secs(30);

/// How --launch starts a private SBCL image when nothing answers at the endpoint.
#[derive(Debug, Clone)]
pub struct LaunchSettings {
    /// The `swank-loader.lisp` to load; `None` takes the first of
    /// [`launch::swank_loader_candidates`] that exists.
    pub swank_loader: Option<PathBuf>,
}

/// One image to work in, as configured on the command line.
#[derive(Debug, Clone)]
pub struct ImageSettings {
    /// What the tools' `image` argument calls it; also the start of its session's name.
    pub name: String,
    /// Where its swank or slynk server listens, and where --launch starts one.
    pub endpoint: Endpoint,
    /// How each connection to it is opened.
    pub connect: ConnectOptions,
    /// Start a private image when nothing answers at the endpoint.
    pub launch: Option<LaunchSettings>,
}

/// Why an image could not be made ready for calls: connecting to it, starting it (--launch) or
/// loading the helper into it failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ImageError {
    /// Nothing answered at the endpoint (the connection was refused or not accepted in time) and
    /// --launch is off.
    #[error(
        "No Lisp image is answering at {endpoint} ({detail}).\n\
         To attach to your running image, open a swank port in it, for example from the SLIME REPL:\n  \
         (swank:create-server :port {port} :dont-close t)\n\
         (with SLY: (slynk:create-server :port {port} :dont-close t)); from Emacs, M-x swank-mcp-start \
         (elisp-compat/swank-mcp.el) does it in one step. Or restart swank-mcp with --launch to start a \
         private SBCL image.",
        port = .endpoint.port
    )]
    Unreachable {
        /// Where the connection was tried.
        endpoint: Endpoint,
        /// The system's error, or how long the connection went unaccepted.
        detail: String,
    },
    /// Something answered but the connection failed (the handshake failed, or the server closed
    /// it), or connecting to the image --launch started failed; carries the [`ConnectError`]'s
    /// message.
    #[error("{0}")]
    Connect(String),
    /// --launch could not start an image (no `swank-loader.lisp` found, or SBCL failed to start
    /// swank); carries why.
    #[error("Could not start a Lisp image: {0}")]
    Launch(String),
    /// A request that checks or loads the helper failed, or the image answered it unexpectedly.
    #[error("Could not load the swank-mcp helper into the image at {endpoint}: {detail}")]
    Helper {
        /// Where the connection goes.
        endpoint: Endpoint,
        /// What failed.
        detail: String,
    },
}

/// What a connection attempt is doing, for the error of a call whose time limit passes before
/// the image is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Opening the TCP connection and identifying the server.
    Connecting,
    /// Starting a private SBCL (--launch) because nothing answered.
    Launching,
    /// Checking which helper revision the image holds, and loading this one if needed.
    LoadingHelper,
}

impl Step {
    fn explain(self, endpoint: &Endpoint, limit: Duration, advice: &str) -> String {
        let passed = format!("The time limit of {} ms (and {UNWIND_GRACE:?} of grace) passed", limit.as_millis());
        match self {
            Step::Connecting => format!(
                "{passed} while connecting to the Lisp image at {endpoint}; nothing was evaluated. The image has not \
                 completed swank's connection handshake: check that it runs and is not stopped (in a debugger, or \
                 suspended), then call again. {advice}"
            ),
            Step::Launching => format!(
                "{passed} while swank-mcp was starting a private SBCL image for {endpoint} (--launch); nothing was \
                 evaluated. The image goes on starting (its very first start compiles swank, which takes a minute \
                 or two): call again shortly."
            ),
            Step::LoadingHelper => format!(
                "{passed} while loading swank-mcp's helper into the Lisp image at {endpoint}; nothing was evaluated. \
                 The image has not answered the load: loading compiles code, which waits for SBCL's world lock, so \
                 another thread of the image is probably compiling or loading (a quickload, a compile-file) or \
                 holds sb-kernel::**world-lock**; or the image stopped answering. Call again once it is done; the \
                 next call starts the load afresh. {advice}"
            ),
        }
    }
}

/// Why a helper call did not produce a value.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// Connecting to the image, starting it (--launch) or loading the helper failed; nothing was
    /// evaluated.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The request failed in a way the other variants do not cover: swank rejected it or could not
    /// read it, it was over the protocol's size limit, it was aborted with a debugger report, or
    /// swank-mcp itself had closed the connection.
    #[error(transparent)]
    Rex(#[from] RexError),
    /// The time limit passed before the image was ready to evaluate anything.
    #[error("{}", .step.explain(.endpoint, *.limit, .advice))]
    NotReady {
        /// Where the connection attempt was.
        step: Step,
        /// The image's configured endpoint.
        endpoint: Endpoint,
        /// The call's time limit.
        limit: Duration,
        /// How to give the call more time.
        advice: &'static str,
    },
    /// The time limit passed and the evaluation was interrupted, but it did not unwind within the
    /// grace; or the image did not answer even the interruption, and swank-mcp closed the
    /// connection.
    #[error(
        "The evaluation was interrupted after {after:?} but did not unwind within {UNWIND_GRACE:?}; its thread may still be \
         running (it may be inside foreign code or WITHOUT-INTERRUPTS, or wait for a lock while it unwinds).\n{report}"
    )]
    Unresponsive {
        /// The call's time limit.
        after: Duration,
        /// What the image said about where the thread waits, or why it could not say.
        report: String,
    },
    /// The connection ended during the call from the image's side: it exited, most likely.
    #[error(
        "The call lost the connection to the Lisp image at {endpoint}: {detail}. The image exited (for example the code \
         called (sb-ext:exit)), crashed, or its swank server was stopped; what it held is gone. {}",
        if *.relaunch {
            "The next call starts a new private SBCL image (--launch)."
        } else {
            "Start the image (or its swank server) again; the next call reconnects."
        }
    )]
    ImageGone {
        /// The image's configured endpoint.
        endpoint: Endpoint,
        /// How the connection ended.
        detail: String,
        /// Whether the next call starts a new image (--launch).
        relaunch: bool,
    },
    /// swank aborted the request without a debugger report: the evaluation's thread was unwound
    /// from outside the helper, which traps every error itself.
    #[error(
        "The evaluation ended without a value: its thread was unwound past swank-mcp's error handling, by ABORT or \
         another restart that leads out of the call, a THROW to a tag the code did not establish, \
         SB-THREAD:ABORT-THREAD, or an exit of the image still under way. Its output is lost."
    )]
    Unwound,
    /// The client cancelled the call through [`CallLimits::cancel`]; an evaluation already
    /// under way was interrupted.
    #[error("The call was cancelled.")]
    Cancelled,
}

/// The limits of one call: a time limit, what to tell the user when it is reached, and the
/// client's cancellation.
#[derive(Debug, Clone)]
pub struct CallLimits {
    /// The time limit of the whole call, connecting and loading the helper included. When it
    /// passes the evaluation is interrupted and gets a short grace to unwind.
    pub timeout: Duration,
    /// How to give the call more time, which depends on the tool.
    pub timeout_advice: &'static str,
    /// Cancelled when the client no longer wants the answer: the evaluation is interrupted and the
    /// call fails with [`CallError::Cancelled`].
    pub cancel: CancellationToken,
}

/// One configured Lisp image: its settings, its connection (made on first use and remade after a
/// loss), the private image --launch started, and this server's REPL session there.
pub struct Image {
    settings: Arc<ImageSettings>,
    connection: std::sync::Mutex<Slot>,
    /// Set with --launch.
    launcher: Option<Arc<Launcher>>,
    /// This server's REPL session in the image: its package and `*`, `**`, ... live there,
    /// apart from the user's own REPL.
    session: String,
    next_token: AtomicU64,
    next_attempt: AtomicU64,
    /// Evaluations stopped in the debugger, by session number.
    debugger_sessions: std::sync::Mutex<HashMap<u64, SessionSlot>>,
    /// Worker threads being started (see [`Image::keep_workers`]).
    worker_starts: Arc<AtomicUsize>,
    /// Which image the last connection reached, to tell a restarted one.
    identity: Arc<std::sync::Mutex<ImageIdentity>>,
}

/// What tells one process of an image from another on the same endpoint.
#[derive(Default)]
struct ImageIdentity {
    /// The pid the server reported on the last connection (`Some(None)` when it reports none);
    /// `None` before the first connection.
    pid: Option<Option<i64>>,
    /// Set when a connection reached another image than the one before, until the next reply
    /// says so.
    changed: Option<String>,
}

impl ImageIdentity {
    /// Records the image a new connection reached: its pid, and whether it already held a helper
    /// (an image restarted in place of the one before holds none, even with the same pid, as in
    /// a container).
    fn connected(&mut self, endpoint: &Endpoint, pid: Option<i64>, held_helper: bool) {
        let previous = self.pid.replace(pid);
        let Some(previous) = previous else { return };
        if previous == pid && held_helper {
            return;
        }
        let pids = match (previous, pid) {
            (Some(before), Some(now)) if before != now => format!(" (pid {before} before, {now} now)"),
            (_, Some(now)) => format!(" (pid {now})"),
            _ => String::new(),
        };
        self.changed = Some(format!(
            "[notes]\nThe connection to {endpoint} was remade, and the image there is not the one this server was \
             attached to before{pids}: it was restarted. Everything defined or loaded in the earlier image is gone, \
             and so is this server's session there: its package is CL-USER again, and its @handles and debugger \
             sessions no longer exist."
        ));
    }
}

/// Worker threads kept in the image per connection: each serves one call at a time, sparing it
/// the thread the server would spawn; calls beyond them run in new threads as before.
const MAX_WORKERS: usize = 4;

/// An evaluation stopped in an image's debugger, kept for the debugger tool as session `D<number>`.
pub struct DebuggerSession {
    /// The session's number, unique in this server.
    pub number: u64,
    /// The server's id of the thread waiting in the debugger.
    pub thread: i64,
    /// `TYPE: message` of the condition it stopped with, for lisp-status.
    pub condition: String,
    /// When it stopped.
    pub since: std::time::Instant,
    /// The evaluation, to follow when the debugger tool moves it on.
    pub evaluation: Evaluating,
}

enum SessionSlot {
    Waiting(DebuggerSession),
    /// A debugger call is acting on it.
    Busy,
}

/// Why [`Image::take_debugger_session`] gave no session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionUnavailable {
    /// No such session: it never existed, or its evaluation has ended.
    Unknown,
    /// Another debugger call is acting on it.
    Busy,
}

/// A stopped evaluation as lisp-status lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct DebuggerSessionSummary {
    /// `D<number>`'s number.
    pub number: u64,
    /// The server's id of the waiting thread.
    pub thread: i64,
    /// `TYPE: message`.
    pub condition: String,
    /// How long it has waited.
    pub age: Duration,
    /// Whether a debugger call is acting on it now.
    pub busy: bool,
}

/// The number of the next debugger session, unique among all images of this server.
pub fn next_debugger_session_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The image's connection. Its lock is only ever held for a moment, never across an await.
enum Slot {
    Idle,
    Connecting(Attempt),
    Ready(Connection),
}

/// Connecting and loading the helper, shared by the calls that wait for it. It runs only while
/// some call waits: when the last one gives up (its time limit passed, or it was cancelled) the
/// attempt is dropped with its connection, so a stalled server or a busy image never leaves a
/// wait behind, and the next call starts afresh.
struct Attempt {
    number: u64,
    result: Shared<BoxFuture<'static, Result<Connection, ImageError>>>,
    step: Arc<std::sync::Mutex<Step>>,
    waiters: usize,
}

/// Poisoning only means another task panicked while holding the lock; the state stays usable.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Image {
    /// Nothing is connected or started until the first call.
    pub fn new(settings: ImageSettings) -> Self {
        // Unique among the servers attached to one image: the pid and the start time tell
        // processes apart, the counter the images of one process (a clock may tick coarsely).
        static IMAGES_MADE: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let ordinal = IMAGES_MADE.fetch_add(1, Ordering::Relaxed);
        let session = format!("{}-{}-{:x}-{ordinal}", settings.name, std::process::id(), nanos);
        let launcher = settings
            .launch
            .clone()
            .map(|launch| Arc::new(Launcher::new(launch, settings.endpoint.host.clone(), settings.endpoint.port)));
        Self {
            settings: Arc::new(settings),
            connection: std::sync::Mutex::new(Slot::Idle),
            launcher,
            session,
            next_token: AtomicU64::new(1),
            next_attempt: AtomicU64::new(1),
            debugger_sessions: std::sync::Mutex::new(HashMap::new()),
            worker_starts: Arc::new(AtomicUsize::new(0)),
            identity: Arc::new(std::sync::Mutex::new(ImageIdentity::default())),
        }
    }

    /// The name the tools' `image` argument selects it by.
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// The configured endpoint; an image --launch starts listens there too.
    pub fn endpoint(&self) -> &Endpoint {
        &self.settings.endpoint
    }

    /// The name of this server's REPL session in the image, which every helper call passes:
    /// unique among the servers attached to the image.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The live connection, if one is open now; never connects.
    pub fn current_connection(&self) -> Option<Connection> {
        match &*lock(&self.connection) {
            Slot::Ready(connection) if !connection.is_closed() => Some(connection.clone()),
            _ => None,
        }
    }

    /// The connection, made (and the helper loaded) if there is none, waiting at most
    /// [`STANDALONE_LIMIT`] and the grace: for callers with no time limit of their own.
    pub async fn connection(&self) -> Result<Connection, CallError> {
        let limits = CallLimits { timeout: STANDALONE_LIMIT, timeout_advice: "", cancel: CancellationToken::new() };
        self.connection_by(Instant::now() + STANDALONE_LIMIT, &limits).await
    }

    /// The connection, made (and the helper loaded) on first use and after a loss, unless the
    /// call is cancelled or its `deadline` and the unwind grace pass. Concurrent callers wait for
    /// one attempt rather than each opening a connection, each within its own limits.
    ///
    /// The grace is the one an interrupted evaluation gets to unwind. It lets a call with a small
    /// limit on a new connection go ahead (and be interrupted as soon as it starts) rather than
    /// fail for the helper's load, which takes a second or so.
    async fn connection_by(&self, deadline: Instant, limits: &CallLimits) -> Result<Connection, CallError> {
        let (number, result, step) = {
            let mut slot = lock(&self.connection);
            match &mut *slot {
                Slot::Ready(connection) if !connection.is_closed() => return Ok(connection.clone()),
                Slot::Connecting(attempt) => {
                    attempt.waiters += 1;
                    (attempt.number, attempt.result.clone(), attempt.step.clone())
                }
                _ => {
                    let attempt = self.attempt();
                    let waiting = (attempt.number, attempt.result.clone(), attempt.step.clone());
                    *slot = Slot::Connecting(attempt);
                    waiting
                }
            }
        };
        let _waiting = Waiting { image: self, attempt: number };
        let result = tokio::select! {
            result = result => result,
            _ = tokio::time::sleep_until(deadline + UNWIND_GRACE) => {
                let step = *lock(&step);
                tracing::debug!(image = %self.settings.name, ?step, "time limit passed before the image was ready");
                return Err(CallError::NotReady {
                    step,
                    endpoint: self.settings.endpoint.clone(),
                    limit: limits.timeout,
                    advice: limits.timeout_advice,
                });
            }
            _ = limits.cancel.cancelled() => return Err(CallError::Cancelled),
        };
        let mut slot = lock(&self.connection);
        if matches!(&*slot, Slot::Connecting(attempt) if attempt.number == number) {
            *slot = match &result {
                Ok(connection) => Slot::Ready(connection.clone()),
                Err(_) => Slot::Idle,
            };
        }
        Ok(result?)
    }

    /// A new connection attempt, which owns what it needs: it outlives the call that starts it
    /// when other calls wait for it too.
    fn attempt(&self) -> Attempt {
        let step = Arc::new(std::sync::Mutex::new(Step::Connecting));
        let (settings, launcher, progress) = (self.settings.clone(), self.launcher.clone(), step.clone());
        let identity = self.identity.clone();
        // Boxed: connecting and loading the helper is a big state machine that runs once per
        // connection.
        let result = async move {
            let connection = connect(&settings, launcher.as_ref(), &progress).await?;
            *lock(&progress) = Step::LoadingHelper;
            let held_helper = load_helper(&connection).await?;
            lock(&identity).connected(connection.endpoint(), connection.info().pid, held_helper);
            // The first worker before the first call, so that the requests of a connection that
            // makes one call at a time come in one order (the recorded transcripts rely on it).
            start_worker(&connection).await;
            Ok(connection)
        }
        .boxed()
        .shared();
        Attempt { number: self.next_attempt.fetch_add(1, Ordering::Relaxed), result, step, waiters: 1 }
    }

    /// Keeps a stopped evaluation for the debugger tool (releasing it if a call was acting on it).
    pub fn keep_debugger_session(&self, session: DebuggerSession) {
        lock(&self.debugger_sessions).insert(session.number, SessionSlot::Waiting(session));
    }

    /// Takes session `number` for one debugger call, which must give it back with
    /// [`Image::keep_debugger_session`] or end it with [`Image::end_debugger_session`].
    pub fn take_debugger_session(&self, number: u64) -> Result<DebuggerSession, SessionUnavailable> {
        let mut sessions = lock(&self.debugger_sessions);
        match sessions.insert(number, SessionSlot::Busy) {
            Some(SessionSlot::Waiting(mut session)) => {
                if session.evaluation.has_ended() {
                    sessions.remove(&number);
                    return Err(SessionUnavailable::Unknown);
                }
                Ok(session)
            }
            Some(SessionSlot::Busy) => Err(SessionUnavailable::Busy),
            None => {
                sessions.remove(&number);
                Err(SessionUnavailable::Unknown)
            }
        }
    }

    /// Forgets session `number`: its evaluation has returned or was lost.
    pub fn end_debugger_session(&self, number: u64) {
        lock(&self.debugger_sessions).remove(&number);
    }

    /// The evaluations stopped in the debugger, oldest first; forgets those that have ended (an
    /// evaluation left waiting is aborted from the image's side after --debug-timeout).
    pub fn debugger_sessions(&self) -> Vec<DebuggerSessionSummary> {
        let mut sessions = lock(&self.debugger_sessions);
        sessions.retain(|_, slot| match slot {
            SessionSlot::Waiting(session) => !session.evaluation.has_ended(),
            SessionSlot::Busy => true,
        });
        let mut summaries: Vec<DebuggerSessionSummary> = sessions
            .iter()
            .map(|(&number, slot)| match slot {
                SessionSlot::Waiting(session) => DebuggerSessionSummary {
                    number,
                    thread: session.thread,
                    condition: session.condition.clone(),
                    age: session.since.elapsed(),
                    busy: false,
                },
                SessionSlot::Busy => DebuggerSessionSummary {
                    number,
                    thread: 0,
                    condition: String::new(),
                    age: Duration::ZERO,
                    busy: true,
                },
            })
            .collect();
        summaries.sort_by_key(|summary| summary.number);
        summaries
    }

    /// Aborts every evaluation waiting in the debugger, for a server that exits: none is left
    /// waiting for a client that is gone. Waits a moment for each to unwind.
    pub async fn abort_debugger_sessions(&self) {
        let sessions: Vec<DebuggerSession> = lock(&self.debugger_sessions)
            .drain()
            .filter_map(|(_, slot)| match slot {
                SessionSlot::Waiting(session) => Some(session),
                SessionSlot::Busy => None,
            })
            .collect();
        for mut session in sessions {
            let abort = Form::call(HELPER_PACKAGE, "debugger-abort", []);
            let request = session.evaluation.connection.rex(abort, "COMMON-LISP-USER", Thread::Id(session.thread));
            let unwound = async {
                let _ = request.await;
                while !matches!(session.evaluation.rex.next().await, RexEvent::Returned(_)) {}
            };
            if tokio::time::timeout(UNWIND_GRACE, unwound).await.is_err() {
                tracing::warn!(session = session.number, "a debugger session did not unwind when aborted");
            }
        }
    }

    /// Ends this server's session in the image, for a server that exits: its REPL state and the
    /// handles it holds (which keep the objects they name alive) are released. Only over the
    /// connection that is open: an image this server is not connected to has nothing of it
    /// worth a reconnection (the image releases a closed connection's handles itself).
    pub async fn end_session(&self) {
        if self.current_connection().is_none() {
            return;
        }
        let limits = CallLimits { timeout: UNWIND_GRACE, timeout_advice: "", cancel: CancellationToken::new() };
        if let Err(error) = self.call_helper("end-session", Vec::new(), &limits).await {
            tracing::warn!(%error, "the session in the image could not be ended");
        }
    }

    /// When the image had ended and another runs in its place (one --launch started, or one
    /// restarted on the same endpoint by someone else), what the next reply must say of it; taken
    /// once.
    pub fn take_replacement_note(&self) -> Option<String> {
        let changed = lock(&self.identity).changed.take();
        self.launcher.as_ref().and_then(|launcher| launcher.take_replacement_note()).or(changed)
    }

    /// Whether this server starts the image it talks to (`--launch`), running or not yet.
    pub fn launches(&self) -> bool {
        self.launcher.is_some()
    }

    /// Whether this server started the image it talks to (and the pid of that process).
    pub fn launched_pid(&self) -> Option<Option<u32>> {
        self.launcher.as_ref().and_then(|launcher| launcher.pid())
    }

    fn new_token(&self) -> String {
        call_tag::token(&self.session, self.next_token.fetch_add(1, Ordering::Relaxed))
    }

    /// Calls `function` of the helper with `args` plus `:session` and `:token`, in a fresh
    /// worker thread. One time limit covers the whole call, connecting and loading the helper
    /// included. On timeout or cancellation the thread is interrupted through the helper and
    /// unwinds; a timed-out call still returns the helper's report (which names the limit and
    /// keeps the output so far).
    pub async fn call_helper(
        &self,
        function: &'static str,
        args: Vec<Form>,
        limits: &CallLimits,
    ) -> Result<Sexp, CallError> {
        let deadline = Instant::now() + limits.timeout;
        let connection = self.connection_by(deadline, limits).await?;
        let token = self.new_token();
        let form = self.helper_form(function, args, &token);
        self.keep_workers(&connection);
        let call = connection.rex_on_worker(form, "COMMON-LISP-USER");
        self.supervise(&connection, &token, deadline, limits, call).await
    }

    /// Starts one more worker thread in the background when none is idle, up to [`MAX_WORKERS`]:
    /// this call goes to a new thread, later ones to the worker.
    fn keep_workers(&self, connection: &Connection) {
        let starting = &self.worker_starts;
        if connection.has_idle_worker() || connection.worker_count() + starting.load(Ordering::Relaxed) >= MAX_WORKERS {
            return;
        }
        starting.fetch_add(1, Ordering::Relaxed);
        let (connection, starting) = (connection.clone(), starting.clone());
        tokio::spawn(async move {
            start_worker(&connection).await;
            starting.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// [`Image::call_helper`] for a call whose thread may stop in the image's debugger and wait
    /// there for the debugger tool (evaluate-lisp with `debug`): returns when it does. The time
    /// limit is the caller's `deadline`, which goes on to cover describing where it stopped.
    pub async fn call_helper_debuggable(
        &self,
        function: &'static str,
        args: Vec<Form>,
        deadline: Instant,
        limits: &CallLimits,
    ) -> Result<Evaluation, CallError> {
        let connection = self.connection_by(deadline, limits).await?;
        let token = self.new_token();
        let form = self.helper_form(function, args, &token);
        let rex = connection.rex_debuggable(form, "COMMON-LISP-USER")?;
        self.follow(Evaluating { connection, token, rex }, deadline, limits).await
    }

    /// Waits for what an evaluation does next, within `deadline`: it returns, or stops in the
    /// debugger. Interrupted on timeout or cancellation as [`Image::call_helper`] is.
    pub async fn follow(
        &self,
        mut evaluation: Evaluating,
        deadline: Instant,
        limits: &CallLimits,
    ) -> Result<Evaluation, CallError> {
        let rex = &mut evaluation.rex;
        let next = async {
            let mut resumed = false;
            loop {
                match rex.next().await {
                    RexEvent::Entered { thread, .. } => return Ok(Next::Stopped { thread, resumed }),
                    RexEvent::Left { .. } => resumed = true,
                    RexEvent::Returned(reply) => return reply.map(Next::Returned),
                }
            }
        };
        let next = self.supervise(&evaluation.connection, &evaluation.token, deadline, limits, next).await?;
        Ok(match next {
            Next::Returned(value) => Evaluation::Returned(value),
            Next::Stopped { thread, resumed } => Evaluation::Stopped { evaluation, thread, resumed },
        })
    }

    /// Calls `function` of the helper in `thread`, a thread stopped in the debugger by the
    /// evaluation `stopped`, within the call's limits; on timeout or cancellation that evaluation
    /// is interrupted (a request to a stopped thread runs inside it). `None` when control left
    /// the debugger instead of returning (a restart was invoked): follow the evaluation then.
    pub async fn call_in_debugger(
        &self,
        stopped: &Evaluating,
        thread: i64,
        function: &'static str,
        args: Vec<Form>,
        deadline: Instant,
        limits: &CallLimits,
    ) -> Result<Option<Sexp>, CallError> {
        let form = Form::call(HELPER_PACKAGE, function, args);
        let request = stopped.connection.rex(form, "COMMON-LISP-USER", Thread::Id(thread));
        let call = async {
            match request.await {
                // Unwound without entering the debugger itself: control went back into the
                // stopped evaluation.
                Err(RexError::Aborted { debugger: None, .. }) => Ok(None),
                reply => reply.map(Some),
            }
        };
        self.supervise(&stopped.connection, &stopped.token, deadline, limits, call).await
    }

    fn helper_form(&self, function: &'static str, args: Vec<Form>, token: &str) -> Form {
        let session = [
            Form::Keyword("session"),
            Form::string(self.session.clone()),
            Form::Keyword("token"),
            Form::string(token.to_string()),
        ];
        Form::call(HELPER_PACKAGE, function, args.into_iter().chain(session))
    }

    /// Waits for `call`, a request of the evaluation registered under `token`, until `deadline`
    /// or the client's cancellation; then interrupts the evaluation through the helper and gives
    /// it a grace to unwind and report.
    async fn supervise<T>(
        &self,
        connection: &Connection,
        token: &str,
        deadline: Instant,
        limits: &CallLimits,
        call: impl std::future::Future<Output = Result<T, RexError>>,
    ) -> Result<T, CallError> {
        tokio::pin!(call);
        let interruption = tokio::select! {
            reply = &mut call => return self.outcome(connection, reply).await,
            _ = tokio::time::sleep_until(deadline) => Interruption::Timeout,
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
        let cancel = Form::call(
            HELPER_PACKAGE,
            "cancel",
            [Form::string(token.to_string()), Form::Keyword(kind), Form::string(reason)],
        );
        let canceller = connection.clone();
        // A task of its own, so that the interruption goes out even if this call is dropped; its
        // answer, or the lack of one, tells whether the connection still works.
        let interrupting = tokio::spawn(async move {
            if let Err(e) = canceller.rex(cancel, "COMMON-LISP-USER", Thread::New).await {
                tracing::warn!(error = %e, "could not interrupt the evaluation");
            }
        });
        let reply = tokio::time::timeout(UNWIND_GRACE, call).await;
        if reply.is_err() && !interrupting.is_finished() {
            // Not even the interruption got an answer: swank's threads for this connection are
            // gone or a frame never ended. Every later request on it would wait the same way.
            connection.close_because(format!(
                "the image stopped answering on it (a request to interrupt an evaluation got no answer within \
                 {UNWIND_GRACE:?}), so swank-mcp closed it; an evaluation sent on it may still run in the image, \
                 and the next call opens a new connection"
            ));
            tracing::warn!(image = %self.settings.name, "the connection stopped answering; closed it");
            return Err(match interruption {
                Interruption::Cancelled => CallError::Cancelled,
                Interruption::Timeout => CallError::Unresponsive {
                    after: limits.timeout,
                    report: format!(
                        "The image did not answer on this connection within {UNWIND_GRACE:?} either, not even the \
                         request to interrupt the evaluation, so the connection no longer works (swank's threads \
                         for it may have died). swank-mcp closed it; the next call opens a new one."
                    ),
                },
            });
        }
        match (reply, interruption) {
            (_, Interruption::Cancelled) => Err(CallError::Cancelled),
            (Ok(reply), Interruption::Timeout) => self.outcome(connection, reply).await,
            (Err(_), Interruption::Timeout) => Err(CallError::Unresponsive {
                after: limits.timeout,
                report: stuck_report(connection, token.to_string()).await,
            }),
        }
    }

    /// What a helper call's reply means for the caller. The helper traps every error and
    /// debugger entry of its own, so a request that swank aborts without a debugger report had
    /// its thread unwound from outside: by SB-EXT:EXIT, or by an escape to swank's top level.
    async fn outcome<T>(&self, connection: &Connection, reply: Result<T, RexError>) -> Result<T, CallError> {
        match reply {
            Ok(value) => Ok(value),
            Err(RexError::ConnectionLost { reason, .. }) if !connection.closed_by_client() => {
                Err(self.gone(reason).await)
            }
            Err(RexError::Aborted { debugger: None, .. }) => Err(self.unwound_cause(connection).await),
            Err(e) => Err(e.into()),
        }
    }

    async fn gone(&self, detail: String) -> CallError {
        let ended = match &self.launcher {
            Some(launcher) => launcher.ended_within(EXIT_WINDOW).await,
            None => None,
        };
        let detail = match ended {
            Some(how) => format!("{detail}; the private SBCL image swank-mcp had started ended ({how})"),
            None => detail,
        };
        CallError::ImageGone { endpoint: self.settings.endpoint.clone(), detail, relaunch: self.launcher.is_some() }
    }

    /// Tells an exiting image from one that goes on: an exiting SBCL closes the connection
    /// within milliseconds. Nothing is asked of the image: a request needs a new thread, which an
    /// exiting SBCL never makes, and the swank thread waiting to make it would hold the exit up
    /// for a minute.
    async fn unwound_cause(&self, connection: &Connection) -> CallError {
        match tokio::time::timeout(EXIT_WINDOW, connection.closed()).await {
            Ok(()) if !connection.closed_by_client() => self.gone("the image closed it".into()).await,
            _ => CallError::Unwound,
        }
    }
}

/// A call waiting for a connection attempt. When the last one stops waiting before the attempt
/// is done, the attempt is abandoned.
struct Waiting<'a> {
    image: &'a Image,
    attempt: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut slot = lock(&self.image.connection);
        let Slot::Connecting(attempt) = &mut *slot else { return };
        if attempt.number != self.attempt {
            return;
        }
        attempt.waiters -= 1;
        if attempt.waiters == 0 {
            tracing::debug!(image = %self.image.settings.name, step = ?*lock(&attempt.step), "abandoning a connection attempt nobody waits for");
            let abandoned = std::mem::replace(&mut *slot, Slot::Idle);
            // Dropped outside the lock: dropping the attempt closes its connection.
            drop(slot);
            drop(abandoned);
        }
    }
}

/// Connects to the image at the configured endpoint, or to the private image started earlier,
/// starting one when nothing answers and --launch is on.
async fn connect(
    settings: &ImageSettings,
    launcher: Option<&Arc<Launcher>>,
    step: &std::sync::Mutex<Step>,
) -> Result<Connection, ImageError> {
    let endpoint = launcher.and_then(|launcher| launcher.endpoint()).unwrap_or_else(|| settings.endpoint.clone());
    let unreachable = match open(endpoint, &settings.connect).await {
        Ok(connection) => return Ok(connection),
        Err(ConnectError::Refused(endpoint, detail)) => ImageError::Unreachable { endpoint, detail },
        Err(ConnectError::Timeout(endpoint, after)) => {
            ImageError::Unreachable { endpoint, detail: format!("no answer within {after:?}") }
        }
        Err(e) => return Err(ImageError::Connect(e.to_string())),
    };
    let Some(launcher) = launcher else { return Err(unreachable) };
    *lock(step) = Step::Launching;
    let endpoint = launcher.start().await?;
    *lock(step) = Step::Connecting;
    open(endpoint, &settings.connect).await.map_err(|e| ImageError::Connect(e.to_string()))
}

/// How long to wait before connecting again to a server that closed the connection unanswered.
const EXITING_PAUSE: Duration = Duration::from_millis(500);

/// Opens a connection, once more after a pause when the server closes it without answering: an
/// exiting image (right after (sb-ext:exit), say) accepts connections into its listen backlog
/// and then resets them, and once it is gone its port refuses, which says that no image answers
/// (and lets --launch start one) where the reset alone looks like a server refusing this client.
async fn open(endpoint: Endpoint, options: &ConnectOptions) -> Result<Connection, ConnectError> {
    match Connection::connect(endpoint.clone(), options).await {
        Err(ConnectError::Closed { .. }) => {
            tokio::time::sleep(EXITING_PAUSE).await;
            Connection::connect(endpoint, options).await
        }
        connected => connected,
    }
}

/// What the image says of an evaluation that did not unwind: where its thread waits, and which
/// threads wait for locks held by whom. The question runs in a thread of its own and takes no
/// lock it could wait on, so it answers even when the image is deadlocked.
async fn stuck_report(connection: &Connection, token: String) -> String {
    let request = connection.rex(
        Form::call(HELPER_PACKAGE, "stuck-report", [Form::string(token)]),
        "COMMON-LISP-USER",
        Thread::New,
    );
    let report = match tokio::time::timeout(UNWIND_GRACE, request).await {
        Ok(Ok(report)) => report.as_str().map(str::to_string),
        Ok(Err(e)) => Some(format!("Asking the image what the thread does failed: {e}")),
        Err(_) => None,
    };
    let report =
        report.unwrap_or_else(|| format!("The image did not say what the thread does within {UNWIND_GRACE:?} either."));
    tracing::warn!(%report, "an interrupted evaluation did not unwind");
    report
}

/// An evaluation sent by [`Image::call_helper_debuggable`] and not yet returned: what it takes to
/// follow it and to interrupt it.
pub struct Evaluating {
    connection: Connection,
    /// The helper's token for it, which `cancel` takes.
    token: String,
    rex: DebuggableRex,
}

impl Evaluating {
    /// Whether it has returned (or its connection was lost) since it was last followed, taking
    /// what happened to it meanwhile: an evaluation stopped in the debugger is aborted from the
    /// image's side after --debug-timeout.
    pub fn has_ended(&mut self) -> bool {
        while let Some(event) = self.rex.try_next() {
            if matches!(event, RexEvent::Returned(_)) {
                return true;
            }
        }
        self.connection.is_closed()
    }
}

/// What a debuggable evaluation did.
pub enum Evaluation {
    /// It returned this reply.
    Returned(Sexp),
    /// Its thread stopped in the image's debugger and waits there.
    Stopped {
        /// The evaluation, to follow again once the debugger tool moves it on.
        evaluation: Evaluating,
        /// The server's id of the waiting thread, where requests to the debugger go.
        thread: i64,
        /// Whether it left the debugger since it was last followed, so that this is a new stop
        /// rather than the same one announced again.
        resumed: bool,
    },
}

enum Next {
    Returned(Sexp),
    Stopped { thread: i64, resumed: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interruption {
    Timeout,
    Cancelled,
}
