//! Why a call in an image fails, and the limits it runs within: the leaf of the image layer,
//! which every part of it names and which names none of them.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::swank::{Endpoint, RexError};

/// How long an interrupted evaluation may take to unwind and report before the call gives up on
/// it. Unwinding is immediate unless the thread is inside foreign code or WITHOUT-INTERRUPTS, or
/// a cleanup form it unwinds through waits for a lock (SBCL's compiler, interrupted while it
/// waits for the world lock, waits for it again in its cleanup).
pub(crate) const UNWIND_GRACE: Duration = Duration::from_secs(3);

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
    /// The connection ended during the call from the image's side: the image exited, or only
    /// the connection was cut, as `fate` tells.
    #[error("{}", gone_message(.endpoint, .detail, *.fate, *.relaunch))]
    ImageGone {
        /// The image's configured endpoint.
        endpoint: Endpoint,
        /// How the connection ended.
        detail: String,
        /// What became of the image, as far as this machine can tell.
        fate: Fate,
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
    /// A thread of the image's own, attached to in its debugger, gave no answer within the time
    /// limit. It is not the agent's to interrupt, so it was left as it is.
    #[error(
        "The thread gave no answer within {after:?}. It is the image's own thread, so swank-mcp left it as it is: what \
         was asked may still be running in it. The threads tool shows what it is doing."
    )]
    Unanswered {
        /// The call's time limit.
        after: Duration,
    },
}

/// What became of an image whose connection ended from its side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Its process ended.
    Exited,
    /// Its process still ran once an exiting image would have ended: only the connection was cut.
    Runs {
        /// The image's process id, from the connection's info.
        pid: i64,
    },
    /// Nothing on this machine tells: the image is on another host, or its server reported no
    /// pid.
    Unknown,
}

fn gone_message(endpoint: &Endpoint, detail: &str, fate: Fate, relaunch: bool) -> String {
    let lost = format!("The call lost the connection to the Lisp image at {endpoint}: {detail}.");
    let again = if relaunch {
        "The next call starts a new private SBCL image (--launch)."
    } else {
        "Start the image (or its swank server) again; the next call reconnects."
    };
    match fate {
        Fate::Exited => format!(
            "{lost} The image exited (for example the code called (sb-ext:exit)) or crashed; what it held is gone. \
             {again}"
        ),
        Fate::Runs { pid } => format!(
            "{lost} Only the connection was cut: the image (pid {pid}) still runs, and what was defined or loaded in \
             it is still there. What this call was evaluating was cut off with the connection, or may still run. \
             The next call opens a new connection, where this server's session starts afresh."
        ),
        Fate::Unknown => format!(
            "{lost} The image exited (for example the code called (sb-ext:exit)), crashed, or its swank server or \
             only this connection was cut; it is not on this machine (or reported no pid), so swank-mcp cannot tell \
             which. If it still runs, the next call reconnects; if not, {}",
            if relaunch {
                "the next call starts a new private SBCL image (--launch)."
            } else {
                "start it (or its swank server) again."
            }
        ),
    }
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
    pub(crate) fn explain(self, endpoint: &Endpoint, limit: Duration, advice: &str) -> String {
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
