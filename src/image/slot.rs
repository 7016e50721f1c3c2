//! An image's connection (docs/design.md, "The image"): made on first use, with the helper loaded
//! into it and its first worker started, by one attempt that the calls waiting for it share (each
//! within its own time limit and cancellation), and remade after a loss.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::{CallError, CallLimits, ImageError, Step, UNWIND_GRACE};
use super::helper::{load_helper, Gate};
use super::identity::Reached;
use super::launch::Launcher;
use super::request::Request;
use super::workers::Workers;
use super::{lock, Entry, Image, ImageSettings};
use crate::swank::{ConnectError, ConnectOptions, Connection, Endpoint, Thread};

/// How long [`Image::connection`] waits for the connection and the helper. It serves `swank-mcp
/// status`, which has no time limit of its own; a first helper load on a slow machine fits.
const STANDALONE_LIMIT: Duration = Duration::from_secs(30);

/// The image's connection. Its lock is only ever held for a moment, never across an await.
pub(super) enum Slot {
    Idle,
    Connecting(Attempt),
    Ready(Live),
}

/// A connection ready for calls, with the worker threads it keeps in the image.
#[derive(Clone)]
pub(super) struct Live {
    pub connection: Connection,
    pub workers: Arc<Workers>,
}

/// Connecting and loading the helper, shared by the calls that wait for it. It runs only while
/// some call waits: when the last one gives up (its time limit passed, or it was cancelled) the
/// attempt is dropped with its connection, so a stalled server or a busy image never leaves a
/// wait behind, and the next call starts afresh.
pub(super) struct Attempt {
    number: u64,
    result: Shared<BoxFuture<'static, Result<Live, ImageError>>>,
    step: Arc<std::sync::Mutex<Step>>,
    waiters: usize,
}

impl Image {
    /// The connection, made (and the helper loaded) if there is none, waiting at most
    /// `STANDALONE_LIMIT` and the grace: for callers with no time limit of their own.
    pub async fn connection(&self) -> Result<Connection, CallError> {
        let limits = CallLimits { timeout: STANDALONE_LIMIT, timeout_advice: "", cancel: CancellationToken::new() };
        Ok(self.connection_by(Instant::now() + STANDALONE_LIMIT, &limits).await?.connection)
    }

    /// The connection, made (and the helper loaded) on first use and after a loss, unless the
    /// call is cancelled or its `deadline` and the unwind grace pass. Concurrent callers wait for
    /// one attempt rather than each opening a connection, each within its own limits.
    ///
    /// The grace is the one an interrupted evaluation gets to unwind. It lets a call with a small
    /// limit on a new connection go ahead (and be interrupted as soon as it starts) rather than
    /// fail for the helper's load, which takes a second or so.
    pub(super) async fn connection_by(&self, deadline: Instant, limits: &CallLimits) -> Result<Live, CallError> {
        let (number, result, step) = {
            let mut slot = lock(&self.connection);
            match &mut *slot {
                Slot::Ready(live) if !live.connection.is_closed() => return Ok(live.clone()),
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
                Ok(live) => Slot::Ready(live.clone()),
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
        let (identity, session, gate) = (self.identity.clone(), self.session.clone(), self.gate());
        // Boxed: connecting and loading the helper is a big state machine that runs once per
        // connection.
        let result = async move {
            let connection = connect(&settings, launcher.as_ref(), &progress).await?;
            *lock(&progress) = Step::LoadingHelper;
            let held_helper = load_helper(&connection, &gate).await?;
            let reached = lock(&identity).connected(connection.endpoint(), connection.info().pid, held_helper);
            if reached == Reached::Same {
                end_earlier_session(&connection, &session, gate).await;
            }
            // The first worker before the first call, so that the requests of a connection that
            // makes one call at a time come in one order (the recorded transcripts rely on it).
            let workers = Arc::new(Workers::default());
            workers.start(&connection).await;
            Ok(Live { connection, workers })
        }
        .boxed()
        .shared();
        Attempt { number: self.next_attempt.fetch_add(1, Ordering::Relaxed), result, step, waiters: 1 }
    }
}

/// Ends what is left of this server's session in the image after its connection was lost, as the
/// image itself does when it sees the connection closed (it may see that only later), so that the
/// session certainly starts afresh, as the next reply says.
async fn end_earlier_session(connection: &Connection, session: &str, gate: Gate) {
    let request =
        Request::new(Entry::END_SESSION).key("session", session).key("token", format!("{session}-reconnected"));
    let ended = connection.rex(request.checked_form(gate), "COMMON-LISP-USER", Thread::New);
    match tokio::time::timeout(UNWIND_GRACE, ended).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => tracing::debug!(%error, "the session of the lost connection could not be ended"),
        Err(_) => tracing::debug!("ending the session of the lost connection took too long"),
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
