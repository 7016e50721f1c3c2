//! Calls in an image (docs/design.md, "The image"): a request to a helper function, sent with
//! this server's session and the call's token, on a worker thread or, for an evaluation that may
//! stop in the debugger, a thread of its own; and their supervision: a call that passes its time
//! limit or is cancelled has its evaluation interrupted through the helper and gets a grace to
//! unwind, and a connection that no longer answers is closed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::error::{CallError, CallLimits, Fate, ImageError, Step, UNWIND_GRACE};
use super::helper::{load_helper, Gate};
use super::request::Request;
use super::{call_tag, Entry, Image};
use crate::swank::{Connection, DebuggableRex, Form, RexError, RexEvent, Sexp, Thread};

/// How long a call whose evaluation ended without a value waits for the connection to close,
/// which is how an exiting image shows itself.
const EXIT_WINDOW: Duration = Duration::from_secs(1);

impl Image {
    fn new_token(&self) -> String {
        call_tag::token(&self.session, self.next_token.fetch_add(1, Ordering::Relaxed))
    }

    /// Calls `function` of the helper with `args` plus `:session` and `:token`, in a fresh
    /// worker thread. One time limit covers the whole call, connecting and loading the helper
    /// included. On timeout or cancellation the thread is interrupted through the helper and
    /// unwinds; a timed-out call still returns the helper's report (which names the limit and
    /// keeps the output so far).
    pub async fn call_helper(&self, request: Request, limits: &CallLimits) -> Result<Sexp, CallError> {
        let deadline = Instant::now() + limits.timeout;
        let live = self.connection_by(deadline, limits).await?;
        let token = self.new_token();
        let form = self.helper_form(request, &token);
        let mut reloaded = false;
        loop {
            not_cancelled(limits)?;
            live.workers.keep(&live.connection);
            let call = live.workers.rex(&live.connection, form.clone(), "COMMON-LISP-USER");
            let reply = self.supervise(&live.connection, &token, deadline, limits, call).await;
            let answer = HelperAnswer::of(reply.as_ref().map(Some));
            if !retry_after_reload(&live.connection, &self.gate(), answer, &mut reloaded, deadline, limits).await? {
                return reply;
            }
        }
    }

    /// [`Image::call_helper`] for a call whose thread may stop in the image's debugger and wait
    /// there for the debugger tool (evaluate-lisp with `debug`): returns when it does. The time
    /// limit is the caller's `deadline`, which goes on to cover describing where it stopped.
    pub async fn call_helper_debuggable(
        &self,
        request: Request,
        deadline: Instant,
        limits: &CallLimits,
    ) -> Result<Evaluation, CallError> {
        let connection = self.connection_by(deadline, limits).await?.connection;
        let token = self.new_token();
        let form = self.helper_form(request, &token);
        let mut reloaded = false;
        loop {
            not_cancelled(limits)?;
            let rex = connection.rex_debuggable(form.clone(), "COMMON-LISP-USER")?;
            let evaluating = Evaluating { connection: connection.clone(), token: token.clone(), rex };
            let evaluation = self.follow(evaluating, deadline, limits).await;
            let returned = evaluation.as_ref().map(|evaluation| match evaluation {
                Evaluation::Returned(reply) => Some(reply),
                Evaluation::Stopped { .. } => None,
            });
            if !retry_after_reload(
                &connection,
                &self.gate(),
                HelperAnswer::of(returned),
                &mut reloaded,
                deadline,
                limits,
            )
            .await?
            {
                return evaluation;
            }
        }
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
        request: Request,
        deadline: Instant,
        limits: &CallLimits,
    ) -> Result<Option<Sexp>, CallError> {
        let request = stopped.connection.rex(request.form(), "COMMON-LISP-USER", Thread::Id(thread));
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

    /// Calls `function` of the helper in `thread`, a thread of the image's own that waits in a
    /// server's debugger (the person's SLDB, or nobody's), as Emacs sends SLDB's requests to it:
    /// through the helper's `ATTACHED`, whose reply the image hands to this connection, when it
    /// still waits in stop number `stop` (a request it reads at a later stop does nothing). `None`
    /// when control left the debugger (a restart moved the thread on). The agent's code the
    /// request runs there (eval_in_frame, a restart's arguments) runs as this server's session's
    /// under a token of its own, exits allowed only with `allow_exit`; on timeout or
    /// cancellation that code is interrupted and the thread goes on waiting where it was.
    pub async fn call_in_attached_thread(
        &self,
        (thread, stop): (i64, u64),
        request: Request,
        allow_exit: bool,
        limits: &CallLimits,
    ) -> Result<Option<Sexp>, CallError> {
        let deadline = Instant::now() + limits.timeout;
        let connection = self.connection_by(deadline, limits).await.map(|live| live.connection)?;
        let token = self.new_token();
        let form = request.attached_form(&self.session, &token, allow_exit, stop);
        let request = connection.rex(form, "COMMON-LISP-USER", Thread::Id(thread));
        let call = async {
            match request.await {
                Err(RexError::Aborted { debugger: None, .. }) => Ok(None),
                reply => reply.map(Some),
            }
        };
        self.supervise(&connection, &token, deadline, limits, call).await
    }

    /// The form of `request`, made as this server's session, under `token`, in the helper revision
    /// this server loaded; printed, for it may be sent again (to a new thread when a worker has
    /// ended, and after a reload of the helper).
    fn helper_form(&self, request: Request, token: &str) -> Form {
        Form::printed(&request.key("session", self.session.as_str()).key("token", token).checked_form(self.gate()))
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
            reply = &mut call => return self.interpret_reply(connection, reply).await,
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
        let cancel = Request::new(Entry::CANCEL).arg(token).arg(Form::Keyword(kind)).arg(reason).form();
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
            (Ok(reply), Interruption::Timeout) => self.interpret_reply(connection, reply).await,
            (Err(_), Interruption::Timeout) => Err(CallError::Unresponsive {
                after: limits.timeout,
                report: stuck_report(connection, token.to_string()).await,
            }),
        }
    }

    /// What a helper call's reply means for the caller. The helper traps every error and
    /// debugger entry of its own, so a request that swank aborts without a debugger report had
    /// its thread unwound from outside: by SB-EXT:EXIT, or by an escape to swank's top level.
    async fn interpret_reply<T>(&self, connection: &Connection, reply: Result<T, RexError>) -> Result<T, CallError> {
        match reply {
            Ok(value) => Ok(value),
            Err(RexError::ConnectionLost { reason, .. }) if !connection.closed_by_client() => {
                Err(self.gone(connection, reason).await)
            }
            Err(RexError::Aborted { debugger: None, .. }) => Err(self.unwound_cause(connection).await),
            Err(e) => Err(e.into()),
        }
    }

    /// What a connection that ended from the image's side means: the image exited, or only the
    /// connection was cut. An exiting SBCL closes its connections before its process ends, so
    /// the process gets [`EXIT_WINDOW`] to end before it is said to run on.
    async fn gone(&self, connection: &Connection, detail: String) -> CallError {
        let endpoint = self.settings.endpoint.clone();
        let relaunch = self.launcher.is_some();
        let (detail, fate) = match &self.launcher {
            Some(launcher) => match launcher.ended_within(EXIT_WINDOW).await {
                Some(how) => {
                    (format!("{detail}; the private SBCL image swank-mcp had started ended ({how})"), Fate::Exited)
                }
                None => (detail, launcher.pid().flatten().map_or(Fate::Unknown, |pid| Fate::Runs { pid: pid.into() })),
            },
            // Only a process on this machine can be looked at, and the pid is the image's own
            // only there (an image in a container reports its namespace's pid).
            None => match connection.info().pid {
                Some(pid) if endpoint.is_loopback() => (detail, process_fate(pid).await),
                _ => (detail, Fate::Unknown),
            },
        };
        CallError::ImageGone { endpoint, detail, fate, relaunch }
    }

    /// Tells an exiting image from one that goes on: an exiting SBCL closes the connection
    /// within milliseconds. Nothing is asked of the image: a request needs a new thread, which an
    /// exiting SBCL never makes, and the swank thread waiting to make it would hold the exit up
    /// for a minute.
    async fn unwound_cause(&self, connection: &Connection) -> CallError {
        match tokio::time::timeout(EXIT_WINDOW, connection.closed()).await {
            Ok(()) if !connection.closed_by_client() => self.gone(connection, "the image closed it".into()).await,
            _ => CallError::Unwound,
        }
    }
}

/// Whether the process `pid` ends within [`EXIT_WINDOW`]. A zombie (an exited child of the
/// process that started it, not yet reaped) has ended.
async fn process_fate(pid: i64) -> Fate {
    let deadline = Instant::now() + EXIT_WINDOW;
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        // The state is the field after the command's name, which is in parentheses and may hold
        // any character.
        let runs = state.is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|s| s != "Z" && s != "X")
        });
        if !runs {
            return Fate::Exited;
        }
        if Instant::now() >= deadline {
            return Fate::Runs { pid };
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Refuses to send a request for a call the client has cancelled. A cancellation that comes
/// after the request went out reaches the helper, which aborts the evaluation whether it
/// started or not (CANCEL in calls.lisp); one that comes before is enforced here, so that
/// nothing is sent at all (nor sent again after a reload of the helper).
fn not_cancelled(limits: &CallLimits) -> Result<(), CallError> {
    if limits.cancel.is_cancelled() {
        return Err(CallError::Cancelled);
    }
    Ok(())
}

/// What the image says of an evaluation that did not unwind: where its thread waits, and which
/// threads wait for locks held by whom. The question runs in a thread of its own and takes no
/// lock it could wait on, so it answers even when the image is deadlocked.
async fn stuck_report(connection: &Connection, token: String) -> String {
    let request = connection.rex(Request::new(Entry::STUCK_REPORT).arg(token).form(), "COMMON-LISP-USER", Thread::New);
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
    /// Whether it has returned (or its connection was lost) since it was last followed: takes the
    /// events that came meanwhile, which no one else then sees (an evaluation stopped in the
    /// debugger is aborted from the image's side after --debug-timeout).
    pub fn drain_events_and_check_ended(&mut self) -> bool {
        while let Some(event) = self.rex.try_next() {
            if matches!(event, RexEvent::Returned(_)) {
                return true;
            }
        }
        self.connection.is_closed()
    }

    /// Aborts it where it waits in the debugger, in `thread`, for a server that exits: none is
    /// left waiting for a client that is gone. Whether it unwound within a moment.
    pub async fn abort(self, thread: i64) -> bool {
        let Evaluating { connection, mut rex, .. } = self;
        let abort = Request::new(Entry::DEBUGGER_ABORT).form();
        let unwound = async {
            let _ = connection.rex(abort, "COMMON-LISP-USER", Thread::Id(thread)).await;
            while !matches!(rex.next().await, RexEvent::Returned(_)) {}
        };
        tokio::time::timeout(UNWIND_GRACE, unwound).await.is_ok()
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

/// What the image's answer to a [`Helper::call`] says of the revision it holds.
pub(crate) enum HelperAnswer {
    /// The call's own answer: the image holds this revision.
    Own,
    /// `:other-helper`: it holds another.
    OtherHelper,
    /// A reader error: it holds no helper (it was uninstalled) or one from before `CALL`. Every
    /// other part of the request reads in any image, the user's code being a string in it.
    Unreadable,
}

impl HelperAnswer {
    /// The answer of `reply`: a value (none for an evaluation stopped in the debugger) or an
    /// error.
    pub(crate) fn of(reply: Result<Option<&Sexp>, &CallError>) -> Self {
        match reply {
            Ok(Some(reply)) if reply.is_keyword("other-helper") => HelperAnswer::OtherHelper,
            Err(CallError::Rex(RexError::ReaderError(_))) => HelperAnswer::Unreadable,
            _ => HelperAnswer::Own,
        }
    }
}

/// What a call does with its reply, whose `answer` says what the image holds: `Ok(true)` when it
/// held another revision (or none) and now holds this swank-mcp's helper again, so that the call
/// must be sent again; `Ok(false)` when the reply is the call's own, or a reader error that this
/// revision's helper, loaded for the call, did not cure. Loads the helper within the call's
/// limits, once per call: `reloaded` says whether this call already did.
pub(crate) async fn retry_after_reload(
    connection: &Connection,
    gate: &Gate,
    answer: HelperAnswer,
    reloaded: &mut bool,
    deadline: Instant,
    limits: &CallLimits,
) -> Result<bool, CallError> {
    match answer {
        HelperAnswer::Own => return Ok(false),
        HelperAnswer::Unreadable if *reloaded => return Ok(false),
        HelperAnswer::OtherHelper | HelperAnswer::Unreadable => {}
    }
    let endpoint = connection.endpoint().clone();
    if std::mem::replace(reloaded, true) {
        return Err(ImageError::Helper {
            endpoint,
            detail: "another swank-mcp version attached to the image loaded its own helper again right after this \
                     one loaded its own, so the call could not run. Attach one swank-mcp version to this image."
                .to_string(),
        }
        .into());
    }
    tracing::info!(%endpoint, "the image holds another helper revision; loading this one again");
    tokio::select! {
        loaded = load_helper(connection, gate) => loaded.map(|_| true).map_err(CallError::from),
        _ = tokio::time::sleep_until(deadline + UNWIND_GRACE) => Err(CallError::NotReady {
            step: Step::LoadingHelper,
            endpoint,
            limit: limits.timeout,
            advice: limits.timeout_advice,
        }),
        _ = limits.cancel.cancelled() => Err(CallError::Cancelled),
    }
}
