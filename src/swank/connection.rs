//! One connection to a swank or slynk server, run as an actor.
//!
//! A reader task owns the socket's read half: it decodes frames, completes the waiting request
//! whose id a `:return` names, and answers every event the server sends so that no Lisp thread
//! ever waits on us (`:ping`, `:write-string` with a thread id, `:read-string`, `:y-or-n-p`, ...).
//! Callers write their frames themselves through an [`Outbox`], whose writer task takes over only
//! what the socket does not accept at once. Callers hold a cheap handle; many requests may be in
//! flight at once because every `:emacs-rex` asks for a fresh worker thread.
//!
//! When the socket closes, every pending request fails at once with a message naming the
//! endpoint, as helix's LSP transport does, rather than waiting for a reply that cannot come.
//!
//! See docs/design.md, "The swank client".

use crate::sync::lock;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{Encoder, FramedRead};
use tokio_util::sync::CancellationToken;

use super::codec::{FrameCodec, FrameError, MAX_PAYLOAD};
use super::dialect::{Dialect, Protocol, ServerInfo};
use super::reader::read;
use super::sexp::{Form, Sexp};
use crate::outbox::Outbox;

/// How long a handshake may go unanswered before [`Connection::connect`] tries a second
/// connection beside the first: far above the few milliseconds a live server takes, even a
/// loaded one.
const SECOND_CONNECTION_AFTER: Duration = Duration::from_secs(1);

/// How long a closing connection keeps trying to write what is still queued.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Where a swank or slynk server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// A host name or IP address; an IPv6 address goes without brackets (printing adds them).
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl Endpoint {
    /// Whether it is on this machine by its address: a loopback address, or `localhost`.
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost" || self.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// How [`Connection::connect`] opens a connection.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// How long the server may take to accept the TCP connection. The handshake after it gets as
    /// long, but at least 5 seconds.
    pub connect_timeout: Duration,
    /// Sent as the first frame when set: servers with a `~/.slime-secret` or `~/.sly-secret`
    /// drop connections that do not start with it.
    pub secret: Option<String>,
    /// Which dialect to speak; [`Protocol::Auto`] tells it from the server's answer.
    pub protocol: Protocol,
}

/// Why [`Connection::connect`] failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectError {
    /// The TCP connection could not be made (refused, or the host could not be resolved or
    /// reached); carries the endpoint and the system's error.
    #[error("nothing is listening at {0} ({1})")]
    Refused(Endpoint, String),
    /// The server did not accept the TCP connection within
    /// [`ConnectOptions::connect_timeout`]; carries the endpoint and that limit.
    #[error("timed out after {1:?} connecting to {0}")]
    Timeout(Endpoint, Duration),
    /// The server accepted the connection but answered the identification request with an error
    /// or not as a swank or slynk server, or did not answer in time (as a server with a secret
    /// file does when the secret is wrong or missing).
    #[error("{endpoint} accepted the connection but did not answer as a swank/slynk server: {reason}")]
    Handshake {
        /// Where the server is.
        endpoint: Endpoint,
        /// What went wrong, with a hint about secrets when one may be to blame.
        reason: String,
    },
    /// The server closed the connection before it answered: it refused this client (a wrong
    /// secret), or its process is on its way out.
    #[error("{endpoint} accepted the connection but closed it before answering as a swank/slynk server: {reason}")]
    Closed {
        /// Where the server is.
        endpoint: Endpoint,
        /// How the connection ended, with a hint about secrets.
        reason: String,
    },
}

/// The Lisp thread a request runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thread {
    /// A new worker thread (`t`): requests run in parallel.
    New,
    /// A thread the server named, for example one sitting in the debugger.
    Id(i64),
}

/// What a thread reported when it entered the debugger, kept so that the aborted request can
/// say why it was aborted.
#[derive(Debug, Clone, PartialEq)]
pub struct DebuggerReport {
    /// The server's id of the thread, as [`Thread::Id`] takes it.
    pub thread: i64,
    /// The condition's message, as the server printed it.
    pub condition: String,
    /// The `[Condition of type X]` line as the server printed it.
    pub condition_type: String,
    /// The backtrace's frames as the server printed them, innermost first; only as many as the
    /// server sends with the report.
    pub frames: Vec<String>,
}

/// Why a request ([`Connection::rex`]) produced no value.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RexError {
    /// The server aborted the request: its thread was unwound without a value.
    #[error("request aborted: {}", .debugger.as_ref().map_or(.reason.as_str(), |d| d.condition.as_str()))]
    Aborted {
        /// The reason the server gave, as it printed it.
        reason: String,
        /// What the thread reported when it entered the debugger, when that is why it was
        /// aborted (this client sends such threads back to their top level at once).
        debugger: Option<DebuggerReport>,
    },
    /// The server rejected the request as an invalid RPC; carries its reason.
    #[error("the server rejected the request: {0}")]
    InvalidRpc(String),
    /// The server could not read the request (for example it names a symbol that its package
    /// does not export); carries the reader's message.
    #[error("the server could not read the request: {0}")]
    ReaderError(String),
    /// The request, of the size in bytes it carries, is over [`MAX_PAYLOAD`]; nothing was sent.
    #[error("request of {0} bytes is over the protocol's limit of {MAX_PAYLOAD} bytes")]
    TooLarge(usize),
    /// The connection closed before the reply came, or was closed when the request was made.
    #[error("lost the connection to the Lisp image at {endpoint}: {reason}")]
    ConnectionLost {
        /// Where the server is.
        endpoint: Endpoint,
        /// How the connection ended.
        reason: String,
    },
}

type Reply = Result<Sexp, RexError>;

/// What happens to a request sent with [`Connection::rex_debuggable`].
#[derive(Debug)]
pub enum RexEvent {
    /// Its thread entered the server's debugger and waits there for requests sent to `thread`.
    Entered {
        /// The server's id of the thread, as [`Thread::Id`] takes it.
        thread: i64,
        /// The debugger's level: 1 for the first error, more for errors inside the debugger.
        level: i64,
    },
    /// Its thread left the debugger's `level` (a restart was invoked, or the thread unwound).
    Left {
        /// The level left.
        level: i64,
    },
    /// The request's reply: it is done.
    Returned(Reply),
}

/// Who waits for a request's reply.
enum Waiter {
    /// The caller of [`Connection::rex`]: the reply only; a debugger entry is unwound at once.
    Reply(oneshot::Sender<Reply>),
    /// The holder of a [`DebuggableRex`]: debugger entries and exits too.
    Debuggable(mpsc::UnboundedSender<RexEvent>),
}

impl Waiter {
    fn complete(self, reply: Reply) {
        match self {
            Waiter::Reply(sender) => {
                let _ = sender.send(reply);
            }
            Waiter::Debuggable(sender) => {
                let _ = sender.send(RexEvent::Returned(reply));
            }
        }
    }
}

/// A request whose thread may stop in the server's debugger and wait there, from
/// [`Connection::rex_debuggable`]. Dropping it stops listening; it does not touch the thread.
pub struct DebuggableRex {
    shared: Arc<Shared>,
    id: i64,
    events: mpsc::UnboundedReceiver<RexEvent>,
}

impl DebuggableRex {
    /// The next thing that happens to the request. After [`RexEvent::Returned`] there is nothing
    /// more; a lost connection is a `Returned` with its error.
    pub async fn next(&mut self) -> RexEvent {
        match self.events.recv().await {
            Some(event) => event,
            None => RexEvent::Returned(Err(self.shared.lost())),
        }
    }

    /// What has already happened to the request and not been taken yet, without waiting.
    pub fn try_next(&mut self) -> Option<RexEvent> {
        self.events.try_recv().ok()
    }
}

impl Drop for DebuggableRex {
    fn drop(&mut self) {
        self.shared.forget(self.id);
        // Only a debuggable request's threads are in this map.
        lock(&self.shared.debugging_threads).retain(|_, id| *id != self.id);
    }
}

/// A handle to a live connection. Clones share it; the connection closes when the last handle is
/// dropped or [`Connection::close_because`] is called.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
}

struct Shared {
    endpoint: Endpoint,
    outgoing: Arc<Outbox>,
    pending: Mutex<HashMap<i64, Waiter>>,
    /// Threads in the debugger on behalf of a [`DebuggableRex`], with its request id: where their
    /// `:debug-return` goes.
    debugging_threads: Mutex<HashMap<i64, i64>>,
    /// Debugger reports waiting for the `:return (:abort ...)` of the request they belong to.
    debugger_reports: Mutex<HashMap<i64, DebuggerReport>>,
    next_id: AtomicI64,
    closed: CancellationToken,
    close_reason: Mutex<Option<String>>,
    /// Whether this side closed it (set only when it was still open), as opposed to the server
    /// or a failed read or write.
    closed_by_client: AtomicBool,
    info: std::sync::OnceLock<ServerInfo>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

impl Connection {
    /// Connects, authenticates when a secret is given, and asks the server who it is.
    ///
    /// A handshake that has gone unanswered for `SECOND_CONNECTION_AFTER` gets a second
    /// connection beside it, and the first to answer is kept: Slynk (SLY 1.0.43) sometimes
    /// starts a connection's reader thread before it has recorded the control thread the reader
    /// hands every message to, and such a connection never answers anything. SLIME's swank sets
    /// that thread first. About 1 connection in 185 was born dead so on a loaded 2-core machine.
    /// The first connection keeps its whole time limit, so a server that is merely slow is
    /// answered by whichever connection it answers first, and the call fails only when the
    /// first one does.
    pub async fn connect(endpoint: Endpoint, options: &ConnectOptions) -> Result<Self, ConnectError> {
        let first = Self::connect_once(endpoint.clone(), options);
        tokio::pin!(first);
        tokio::select! {
            result = &mut first => return result,
            () = tokio::time::sleep(SECOND_CONNECTION_AFTER) => {}
        }
        tracing::debug!(%endpoint, "no answer to the handshake yet; a second connection is tried beside the first");
        let second = Self::connect_once(endpoint, options);
        tokio::pin!(second);
        // The connection that loses is dropped, which closes it.
        tokio::select! {
            result = &mut first => result,
            Ok(connection) = &mut second => Ok(connection),
        }
    }

    async fn connect_once(endpoint: Endpoint, options: &ConnectOptions) -> Result<Self, ConnectError> {
        let address = (endpoint.host.as_str(), endpoint.port);
        let stream = match tokio::time::timeout(options.connect_timeout, TcpStream::connect(address)).await {
            Err(_) => return Err(ConnectError::Timeout(endpoint, options.connect_timeout)),
            Ok(Err(e)) => return Err(ConnectError::Refused(endpoint, e.to_string())),
            Ok(Ok(stream)) => stream,
        };
        // Requests are small and latency-bound; Nagle would add a round trip's delay to each.
        let _ = stream.set_nodelay(true);
        let connection = Self::start(endpoint.clone(), stream);
        if let Some(secret) = &options.secret {
            // Never logged, at any level: logs get pasted into bug reports, and the secret lets
            // whoever has it run code in the image.
            connection.shared.write_payload(secret);
            tracing::debug!(bytes = secret.len(), "secret sent");
        }
        let handshake = async {
            let reply = connection.rex(Dialect::identification_request(), "COMMON-LISP-USER", Thread::New).await;
            reply.map_err(|e| e.to_string()).and_then(|value| ServerInfo::from_identification(&value, options.protocol))
        };
        // A wrong secret makes the server close the socket, and a non-swank peer may say
        // nothing at all: bound the wait either way.
        let info = match tokio::time::timeout(options.connect_timeout.max(Duration::from_secs(5)), handshake).await {
            Ok(Ok(info)) => info,
            Ok(Err(reason)) if connection.is_closed() && !connection.closed_by_client() => {
                return Err(ConnectError::Closed { endpoint, reason: handshake_hint(reason, options) })
            }
            Ok(Err(reason)) => {
                return Err(ConnectError::Handshake { endpoint, reason: handshake_hint(reason, options) })
            }
            // A server with a secret file that gets a wrong or missing secret neither answers
            // nor closes: its accept thread stops in the debugger with the socket open.
            Err(_) => {
                return Err(ConnectError::Handshake {
                    endpoint,
                    reason: format!(
                        "no answer to connection-info ({}); is this port really a swank or slynk server?",
                        secret_hint(options)
                    ),
                })
            }
        };
        tracing::info!(%endpoint, dialect = ?info.dialect, version = ?info.version, "connected");
        let _ = connection.shared.info.set(info);
        Ok(connection)
    }

    fn start(endpoint: Endpoint, stream: TcpStream) -> Self {
        let (read_half, write_half) = stream.into_split();
        let outgoing = Arc::new(Outbox::new(Box::new(write_half)));
        let shared = Arc::new(Shared {
            endpoint,
            outgoing: outgoing.clone(),
            pending: Mutex::new(HashMap::new()),
            debugging_threads: Mutex::new(HashMap::new()),
            debugger_reports: Mutex::new(HashMap::new()),
            next_id: AtomicI64::new(1),
            closed: CancellationToken::new(),
            close_reason: Mutex::new(None),
            closed_by_client: AtomicBool::new(false),
            info: std::sync::OnceLock::new(),
        });
        let closed = shared.closed.clone();
        tokio::spawn(write_loop(Arc::downgrade(&shared), outgoing, closed.clone()));
        tokio::spawn(read_loop(Arc::downgrade(&shared), FramedRead::new(read_half, FrameCodec::default()), closed));
        Self { shared }
    }

    /// Where the server is.
    pub fn endpoint(&self) -> &Endpoint {
        &self.shared.endpoint
    }

    /// What the server said of itself and its image in the handshake.
    pub fn info(&self) -> &ServerInfo {
        self.shared.info.get().expect("server info is set before the handle is returned")
    }

    /// The dialect spoken: [`ServerInfo::dialect`].
    pub fn dialect(&self) -> Dialect {
        self.info().dialect
    }

    /// Whether the connection has closed, from either side. It stays closed: every request on it
    /// fails with [`RexError::ConnectionLost`].
    pub fn is_closed(&self) -> bool {
        self.shared.closed.is_cancelled()
    }

    /// Closes the connection; every request still waiting on it fails at once with `reason`.
    pub fn close_because(&self, reason: String) {
        {
            let mut close_reason = lock(&self.shared.close_reason);
            if close_reason.is_none() {
                self.shared.closed_by_client.store(true, Ordering::Relaxed);
                *close_reason = Some(reason.clone());
            }
        }
        self.shared.fail(reason);
    }

    /// Whether swank-mcp closed the connection, rather than the server (or a failed read or write).
    pub fn closed_by_client(&self) -> bool {
        self.shared.closed_by_client.load(Ordering::Relaxed)
    }

    /// Resolves when the connection closes, whoever closes it.
    pub async fn closed(&self) {
        self.shared.closed.cancelled().await;
    }

    /// Requests now waiting for a reply, for status reports.
    pub fn pending_count(&self) -> usize {
        lock(&self.shared.pending).len()
    }

    /// Evaluates `form` with `*package*` named `package` in `thread` and waits for its value.
    /// Dropping the returned future forgets the request; its reply, if one comes, is discarded.
    pub async fn rex(&self, form: Form, package: &str, thread: Thread) -> Reply {
        let shared = &self.shared;
        let (reply_tx, reply_rx) = oneshot::channel();
        let id = shared.send_request(form, package, thread, Waiter::Reply(reply_tx))?;
        let _forget_on_drop = PendingGuard { shared, id };
        tracing::trace!(id, "request sent");
        // The reader drains every pending request when the connection ends, so this resolves.
        reply_rx.await.unwrap_or_else(|_| Err(shared.lost()))
    }

    /// Sends `form` to run in a new thread that, should it enter the server's debugger, waits
    /// there: the debugger entry is reported as a [`RexEvent`] instead of being unwound, and the
    /// thread takes requests sent to it with [`Thread::Id`] until a restart moves it on.
    pub fn rex_debuggable(&self, form: Form, package: &str) -> Result<DebuggableRex, RexError> {
        let (events_tx, events) = mpsc::unbounded_channel();
        let id = self.shared.send_request(form, package, Thread::New, Waiter::Debuggable(events_tx))?;
        Ok(DebuggableRex { shared: self.shared.clone(), id, events })
    }
}

struct PendingGuard<'a> {
    shared: &'a Shared,
    id: i64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.forget(self.id);
    }
}

fn handshake_hint(reason: String, options: &ConnectOptions) -> String {
    if reason.contains("lost the connection") {
        format!("{reason} ({})", secret_hint(options))
    } else {
        reason
    }
}

fn secret_hint(options: &ConnectOptions) -> &'static str {
    if options.secret.is_some() {
        "check that the secret matches the server's ~/.slime-secret or ~/.sly-secret"
    } else {
        "if the server has a ~/.slime-secret or ~/.sly-secret, pass --secret-file"
    }
}

impl Shared {
    /// Registers `waiter` under a fresh id and sends the request; returns the id.
    fn send_request(&self, form: Form, package: &str, thread: Thread, waiter: Waiter) -> Result<i64, RexError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let thread_form = match thread {
            Thread::New => Form::T,
            Thread::Id(tid) => Form::Integer(tid),
        };
        let message =
            Form::List(vec![Form::Keyword("emacs-rex"), form, Form::string(package), thread_form, Form::Integer(id)])
                .to_wire();
        if message.len() > MAX_PAYLOAD {
            return Err(RexError::TooLarge(message.len()));
        }
        lock(&self.pending).insert(id, waiter);
        if self.closed.is_cancelled() || !self.send_payload(&message) {
            lock(&self.pending).remove(&id);
            return Err(self.lost());
        }
        Ok(id)
    }

    /// Drops what is kept for request `id`, whose caller stopped waiting.
    fn forget(&self, id: i64) {
        lock(&self.pending).remove(&id);
        lock(&self.debugger_reports).remove(&id);
    }

    /// Where the events of request `id` go, if a [`DebuggableRex`] waits for it.
    fn debuggable_events(&self, id: i64) -> Option<mpsc::UnboundedSender<RexEvent>> {
        match lock(&self.pending).get(&id) {
            Some(Waiter::Debuggable(events)) => Some(events.clone()),
            _ => None,
        }
    }

    fn lost(&self) -> RexError {
        let reason = lock(&self.close_reason).clone().unwrap_or_else(|| "connection closed".into());
        RexError::ConnectionLost { endpoint: self.endpoint.clone(), reason }
    }

    /// Marks the connection dead and fails every waiting request with the reason.
    fn fail(&self, reason: String) {
        lock(&self.close_reason).get_or_insert(reason);
        self.closed.cancel();
        let pending: Vec<_> = lock(&self.pending).drain().collect();
        for (_, waiter) in pending {
            waiter.complete(Err(self.lost()));
        }
    }

    fn complete(&self, id: i64, reply: Reply) {
        let waiter = lock(&self.pending).remove(&id);
        match waiter {
            Some(waiter) => {
                // Only a debuggable request's threads are in this map: a plain reply, the
                // common case, takes no second lock.
                if matches!(waiter, Waiter::Debuggable(_)) {
                    lock(&self.debugging_threads).retain(|_, waiting| *waiting != id);
                }
                waiter.complete(reply);
            }
            None => tracing::debug!(id, "reply for a request nobody waits for"),
        }
    }

    fn send(&self, form: Form) {
        self.send_payload(&form.to_wire());
    }

    /// Frames `payload` and writes it, or queues it for [`write_loop`]. A failed write fails the
    /// connection; returns whether the payload went out or was queued.
    fn send_payload(&self, payload: &str) -> bool {
        tracing::trace!(message = %truncate_for_log(payload), "send");
        self.write_payload(payload)
    }

    /// [`Shared::send_payload`] without the log line, for the secret.
    fn write_payload(&self, payload: &str) -> bool {
        let mut frame = BytesMut::new();
        let sent = FrameCodec::default()
            .encode(payload, &mut frame)
            .map_err(std::io::Error::other)
            .and_then(|()| self.outgoing.send(frame.into()));
        if let Err(e) = &sent {
            self.fail(format!("write failed: {e}"));
        }
        sent.is_ok()
    }
}

/// Writes what could not be written at once, until the connection closes.
async fn write_loop(shared: Weak<Shared>, outgoing: Arc<Outbox>, closed: CancellationToken) {
    let written = tokio::select! {
        written = outgoing.run_writer() => written,
        _ = closed.cancelled() => {
            // What is queued (answers to events) still goes out if the server reads it soon,
            // then the socket is shut down for writing.
            outgoing.close();
            tokio::time::timeout(CLOSE_GRACE, outgoing.run_writer()).await.unwrap_or(Ok(()))
        }
    };
    if let (Err(e), Some(shared)) = (written, shared.upgrade()) {
        shared.fail(format!("write failed: {e}"));
    }
}

async fn read_loop(
    shared: Weak<Shared>,
    mut frames: FramedRead<tokio::net::tcp::OwnedReadHalf, FrameCodec>,
    closed: CancellationToken,
) {
    let reason = loop {
        let frame = tokio::select! {
            frame = frames.next() => frame,
            _ = closed.cancelled() => break None,
        };
        let Some(shared) = shared.upgrade() else { break None };
        match frame {
            None => break Some("the server closed the connection".to_string()),
            // A reset is how a dying process's socket often ends: a close, not a protocol error.
            Some(Err(FrameError::Io(e))) if is_reset(&e) => {
                break Some(format!("the server closed the connection ({e})"))
            }
            Some(Err(e)) => break Some(format!("bad frame from the server: {e}")),
            Some(Ok(text)) => match read(&text) {
                Ok(message) => handle_message(&shared, message),
                // One unreadable message must not take the connection down; it is logged so
                // that a reader gap shows up in bug reports.
                Err(e) => {
                    tracing::warn!(error = %e, message = %truncate_for_log(&text), "unreadable message from the server")
                }
            },
        }
    };
    if let (Some(reason), Some(shared)) = (reason, shared.upgrade()) {
        tracing::info!(endpoint = %shared.endpoint, %reason, "connection closed");
        shared.fail(reason);
    }
}

fn is_reset(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    matches!(error.kind(), ConnectionReset | ConnectionAborted | BrokenPipe)
}

fn truncate_for_log(text: &str) -> &str {
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Dispatches one server message. Every event that makes a Lisp thread wait gets an answer here;
/// the rest are informational.
fn handle_message(shared: &Shared, message: Sexp) {
    // Replies are taken apart by value: their payload goes to the caller without a copy.
    let message = match message {
        Sexp::List(items) if items.first().is_some_and(|head| head.is_keyword("return")) => {
            return handle_return(shared, items)
        }
        other => other,
    };
    let Some(items) = message.as_list() else {
        tracing::warn!(%message, "message is not a list");
        return;
    };
    let Some((head, args)) = items.split_first() else { return };
    let Sexp::Keyword(kind) = head else {
        tracing::warn!(%message, "message does not start with a keyword");
        return;
    };
    let answer = |form: Form| shared.send(form);
    let int = |i: usize| args.get(i).and_then(Sexp::as_i64);
    match kind.as_ref() {
        "DEBUG" => handle_debug(shared, args),
        "PING" => {
            if let (Some(thread), Some(tag)) = (int(0), int(1)) {
                answer(Form::List(vec![Form::Keyword("emacs-pong"), Form::Integer(thread), Form::Integer(tag)]));
            }
        }
        "WRITE-STRING" => {
            // Output that no tool captured (for example from a thread the user started).
            if let Some(text) = args.first().and_then(Sexp::as_str) {
                tracing::debug!(output = %truncate_for_log(text), "image output outside any tool call");
            }
            // SLIME 2.28+ makes the writer wait for this acknowledgement.
            if let Some(thread) = int(2) {
                answer(Form::List(vec![Form::Keyword("write-done"), Form::Integer(thread)]));
            }
        }
        "READ-STRING" => {
            // An empty string reads as end of file, so the reading thread gets an error instead
            // of waiting for a keyboard that does not exist.
            if let (Some(thread), Some(tag)) = (int(0), int(1)) {
                answer(Form::List(vec![
                    Form::Keyword("emacs-return-string"),
                    Form::Integer(thread),
                    Form::Integer(tag),
                    Form::string(""),
                ]));
            }
        }
        // `nil` is what Emacs answers when the user presses C-g.
        "Y-OR-N-P" | "READ-FROM-MINIBUFFER" => {
            if let (Some(thread), Some(tag)) = (int(0), int(1)) {
                answer(Form::List(vec![
                    Form::Keyword("emacs-return"),
                    Form::Integer(thread),
                    Form::Integer(tag),
                    Form::Nil,
                ]));
            }
        }
        // SLIME 2.32's `inspect-in-emacs :wait t` waits for Emacs to close the inspector.
        "INSPECT" => {
            if let (Some(thread), Some(tag)) = (int(1), int(2)) {
                answer(Form::List(vec![
                    Form::Keyword("emacs-return"),
                    Form::Integer(thread),
                    Form::Integer(tag),
                    Form::Nil,
                ]));
            }
        }
        "EVAL" | "ED-RPC" => {
            if let (Some(thread), Some(tag)) = (int(0), int(1)) {
                let refusal = Form::List(vec![
                    Form::Keyword("error"),
                    Form::string("swank-mcp"),
                    Form::string("there is no Emacs on this connection to evaluate in"),
                ]);
                answer(Form::List(vec![
                    Form::Keyword("emacs-return"),
                    Form::Integer(thread),
                    Form::Integer(tag),
                    refusal,
                ]));
            }
        }
        "INVALID-RPC" => {
            let reason = args.get(1).and_then(Sexp::as_str).unwrap_or("invalid RPC").to_string();
            match int(0) {
                Some(id) => shared.complete(id, Err(RexError::InvalidRpc(reason))),
                None => tracing::warn!(%reason, "invalid RPC without a request id"),
            }
        }
        "READER-ERROR" => {
            // Carries the packet instead of an id: recover the id from the packet's last element.
            let packet = args.first().and_then(Sexp::as_str).unwrap_or_default();
            let reason = args.get(1).and_then(Sexp::as_str).unwrap_or("reader error").to_string();
            match request_id_of_packet(packet) {
                Some(id) => shared.complete(id, Err(RexError::ReaderError(reason))),
                None => tracing::warn!(%reason, packet = %truncate_for_log(packet), "server could not read a message"),
            }
        }
        "DEBUG-RETURN" => {
            if let (Some(thread), Some(level)) = (int(0), int(1)) {
                let id = lock(&shared.debugging_threads).get(&thread).copied();
                if let Some(events) = id.and_then(|id| shared.debuggable_events(id)) {
                    let _ = events.send(RexEvent::Left { level });
                }
            }
        }
        "DEBUG-ACTIVATE" | "DEBUG-CONDITION" | "NEW-FEATURES" | "INDENTATION-UPDATE" | "NEW-PACKAGE"
        | "BACKGROUND-MESSAGE" | "PRESENTATION-START" | "PRESENTATION-END" | "CHANNEL-SEND" | "ED" | "EVAL-NO-WAIT"
        | "ED-RPC-NO-WAIT" | "READ-ABORTED" | "TEST-DELAY" | "INVALID-CHANNEL" | "NEW-REPL-OUTPUT" | "WRITE-IMAGE" => {
            tracing::trace!(event = %kind, "informational event");
        }
        other => tracing::debug!(event = %other, "unknown event ignored"),
    }
}

/// `(:return (:ok VALUE) ID)` or `(:return (:abort REASON) ID)`.
fn handle_return(shared: &Shared, items: Vec<Sexp>) {
    let mut args = items.into_iter().skip(1);
    let (Some(result), Some(id)) = (args.next(), args.next().and_then(|id| id.as_i64())) else {
        tracing::warn!("malformed :return");
        return;
    };
    let reply = match result {
        Sexp::List(parts) if parts.first().is_some_and(|k| k.is_keyword("ok")) => {
            Ok(parts.into_iter().nth(1).unwrap_or(Sexp::Nil))
        }
        result => {
            let parts = result.as_list().unwrap_or_default();
            let reason =
                parts.get(1).map(|r| r.as_str().map_or_else(|| r.to_string(), str::to_string)).unwrap_or_default();
            let debugger = lock(&shared.debugger_reports).remove(&id);
            Err(RexError::Aborted { reason, debugger })
        }
    };
    shared.complete(id, reply);
}

/// `(:debug THREAD LEVEL (MESSAGE TYPE EXTRAS) RESTARTS FRAMES PENDING-IDS)`: a thread entered the
/// debugger. When the innermost request it runs is a [`DebuggableRex`]'s, that one is told and the
/// thread waits. When it runs none of this connection's requests, it is a thread of the image's
/// own whose debugger came here because no other connection was there to take it: it is not
/// this client's to end, so it waits too, for someone to attach to it. Otherwise it is one of this
/// client's requests with nobody to drive the debugger, so the condition is recorded for the
/// request and the thread is sent back to its top level at once; its request then returns
/// `:abort` and carries the report.
fn handle_debug(shared: &Shared, args: &[Sexp]) {
    let Some(thread) = args.first().and_then(Sexp::as_i64) else { return };
    let level = args.get(1).and_then(Sexp::as_i64).unwrap_or(1);
    // Innermost first, as swank keeps its pending continuations.
    let waiting: Vec<i64> =
        args.get(5).and_then(Sexp::as_list).unwrap_or_default().iter().filter_map(Sexp::as_i64).collect();
    if waiting.is_empty() {
        tracing::debug!(thread, level, "a thread of the image entered the debugger; it waits there");
        return;
    }
    if let Some((id, events)) = waiting.first().and_then(|&id| Some((id, shared.debuggable_events(id)?))) {
        tracing::debug!(thread, level, id, "thread entered the debugger; it waits there");
        lock(&shared.debugging_threads).insert(thread, id);
        let _ = events.send(RexEvent::Entered { thread, level });
        return;
    }
    let condition = args.get(2).and_then(Sexp::as_list).unwrap_or_default();
    let text_at = |i: usize| condition.get(i).and_then(Sexp::as_str).unwrap_or_default().to_string();
    let frames = args
        .get(4)
        .and_then(Sexp::as_list)
        .unwrap_or_default()
        .iter()
        .filter_map(|frame| frame.as_list()?.get(1)?.as_str().map(str::to_string))
        .collect();
    let report =
        DebuggerReport { thread, condition: text_at(0), condition_type: text_at(1).trim().to_string(), frames };
    tracing::debug!(thread, condition = %report.condition, "thread entered the debugger; unwinding it");
    {
        let mut reports = lock(&shared.debugger_reports);
        for id in waiting {
            reports.entry(id).or_insert_with(|| report.clone());
        }
    }
    let dialect = shared.info.get().map_or(Dialect::Swank, |info| info.dialect);
    // A thread already in the debugger below this level waits there for a DebuggableRex: only
    // this level is left. Otherwise the whole request is unwound.
    let unwind = if level > 1 { dialect.debugger_abort_function() } else { "throw-to-toplevel" };
    // The reply to this request is itself an :abort that nobody waits for.
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    shared.send(Form::List(vec![
        Form::Keyword("emacs-rex"),
        Form::call(dialect.package(), unwind, []),
        Form::string("COMMON-LISP-USER"),
        Form::Integer(thread),
        Form::Integer(id),
    ]));
}

/// The request id is the last element of `(:emacs-rex FORM PACKAGE THREAD ID)`; the packet as a
/// whole may not be readable (that is why it came back), so only its tail is parsed.
fn request_id_of_packet(packet: &str) -> Option<i64> {
    let body = packet.trim_end().strip_suffix(')')?;
    let digits_start = body.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if !body.trim_start().starts_with("(:emacs-rex") {
        return None;
    }
    body[digits_start..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_id_is_recovered_from_an_unreadable_packet() {
        assert_eq!(request_id_of_packet("(:emacs-rex (foo:bar) \"COMMON-LISP-USER\" t 5)"), Some(5));
        assert_eq!(request_id_of_packet("(:emacs-rex (foo:bar \"x)\") \"CL-USER\" 3 1234)"), Some(1234));
        assert_eq!(request_id_of_packet("(:emacs-pong 1 2)"), None);
        assert_eq!(request_id_of_packet("garbage"), None);
    }
}
