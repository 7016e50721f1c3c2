//! The image layer (docs/design.md, "Layers"): the Lisp images the tools work in. Each one is
//! where it is configured, its connection ([`slot`]: made on first use and remade after a loss,
//! with the helper loaded into it), the calls made in it ([`calls`]: within a time limit and the
//! caller's cancellation, supervised), the worker threads it keeps for them (`workers.rs`), what
//! tells a restarted image from the one before (`identity.rs`), and this server's REPL session
//! there.

use crate::sync::lock;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::swank::{ConnectOptions, Connection, Endpoint};

pub mod call_tag;
pub mod calls;
pub mod entry;
pub mod error;
pub mod helper;
mod identity;
pub mod launch;
pub mod request;
pub mod slot;
mod workers;

pub use calls::{Evaluating, Evaluation};
pub use entry::Entry;
pub use error::{CallError, CallLimits, Fate, ImageError, Step};
pub use request::Request;

use error::UNWIND_GRACE;
use helper::Gate;
use identity::ImageIdentity;
use launch::Launcher;
use slot::Slot;

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
    /// Which image the last connection reached, to tell a restarted one.
    identity: Arc<std::sync::Mutex<ImageIdentity>>,
    /// Set for a server that promised `--read-only`, to its roots: its requests go through the
    /// helper's `LOOK`.
    looks_only: std::sync::OnceLock<Arc<[String]>>,
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
            identity: Arc::new(std::sync::Mutex::new(ImageIdentity::default())),
            looks_only: std::sync::OnceLock::new(),
        }
    }

    /// From now on, asks the image only what looks ([`Gate::Look`]): the image itself refuses
    /// every other entry of the helper, whichever tool asks, and reads source files only under
    /// `roots` and the directories of its ASDF systems. Set before the first call, by a server
    /// that promised `--read-only`, and never unset.
    pub fn look_only(&self, roots: Vec<String>) {
        let _ = self.looks_only.set(roots.into());
    }

    /// The way into the helper this server's requests take.
    pub(crate) fn gate(&self) -> Gate {
        match self.looks_only.get() {
            Some(roots) => Gate::Look(roots.clone()),
            None => Gate::Call,
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
            Slot::Ready(live) if !live.connection.is_closed() => Some(live.connection.clone()),
            _ => None,
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
        if let Err(error) = self.call_helper(Request::new(Entry::END_SESSION), &limits).await {
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
}
