//! `debugger`: acts on an evaluation stopped in the image's debugger (evaluate-lisp with
//! `debug: true`), or on any thread of the image waiting in a debugger (`attach`: the person's
//! SLDB, or nobody's), as SLDB does for a human: frames, locals, evaluation in a frame, restarts.
//!
//! The stopped thread waits in the swank or slynk server's own debugger loop, so each action is a
//! helper request sent to that thread: it runs inside the stopped evaluation, where the frames
//! are. An action that moves the agent's evaluation on (a restart, returning from or restarting a
//! frame, abort) is followed until the evaluation returns or stops again; one that moves an
//! attached thread on leaves it to run as the image's own.
//!
//! See docs/design.md, "The toolbox".

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use super::arguments::{Designator, NumberOrName};
use super::debugger_sessions::{
    frames_section, DebuggerSession, SessionUnavailable, StopReport, Stopped, FRAMES_SHOWN,
};
use super::arguments::{arguments, choices};
use super::evaluate_lisp::report_return_or_stop;
use super::find_definition::CurrentTexts;
use super::lisp_reply::{check_failure, decode, Captured, Location};
use super::xref::query_of_hit;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use crate::image::{CallLimits, Entry, Request};
use crate::source::AllowedRoots;
use crate::swank::{Form, Sexp};

/// A day, as evaluate-lisp's limit.
const MAX_TIMEOUT_MS: u64 = 86_400_000;

choices! {
    /// The action a call asks for: on a stop (attach to one, look at it, move it on) or on the
    /// breakpoints.
    enum ActionName {
        Attach = "attach",
        Backtrace = "backtrace",
        Frame = "frame",
        EvalInFrame = "eval_in_frame",
        InvokeRestart = "invoke_restart",
        Continue = "continue",
        StepInto = "step_into",
        StepOver = "step_over",
        StepOut = "step_out",
        ReturnFromFrame = "return_from_frame",
        RestartFrame = "restart_frame",
        Abort = "abort",
        Break = "break",
        Breakpoints = "breakpoints",
        Unbreak = "unbreak",
        RecompileDebug = "recompile_debug",
        RecompileRestore = "recompile_restore",
    }
}

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "debugger",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Act on a stop: session D1 (from debug: true) or a thread in any debugger, the user's SLDB too. \
            break: function's calls stop where condition holds.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    /// The arguments as the tool reads them: which of them an action needs, it checks.
    struct Args {
        session: Option<String>,
        action: ActionName,
        thread: Option<Designator>,
        function: Option<String>,
        condition: Option<String> => code(),
        hits: Option<u64> => at_least(1),
        breakpoint: Option<u64> => at_least(1),
        frame: Option<u64>,
        start: Option<u64>,
        end: Option<u64>,
        code: Option<String> => code(),
        restart: Option<Designator>,
        arguments: Vec<String>,
        timeout_ms: Option<u64> => at_least(1).at_most(MAX_TIMEOUT_MS),
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let asked: Args = args.typed()?;
    let timeout_ms = asked.timeout_ms;
    let limits = CallLimits {
        timeout: timeout_ms.map_or(context.settings.eval_timeout, Duration::from_millis),
        timeout_advice: "Pass a larger timeout_ms if it needs longer.",
        cancel: context.cancel.clone(),
    };
    let frame = || -> Result<u64, ToolError> {
        asked.frame.ok_or_else(|| ToolError::new("This action needs `frame`, a frame number as the backtrace shows it."))
    };
    let code = || -> Result<&str, ToolError> {
        asked.code.as_deref().ok_or_else(|| ToolError::new("Missing required argument `code` (a string)."))
    };
    let action = match asked.action {
        ActionName::Attach => return attach(context, args, &asked, &limits).await.map(|(_, report)| report),
        ActionName::Break => return set_breakpoint(context, args, &asked).await,
        ActionName::RecompileDebug => return recompile_for_stepping(context, args, &asked, false).await,
        ActionName::RecompileRestore => return recompile_for_stepping(context, args, &asked, true).await,
        ActionName::Breakpoints => {
            let reply = context.call_helper(args, Request::new(Entry::LIST_BREAKPOINTS)).await?;
            let listed = decode::<Breakpoints>("list-breakpoints", &reply)?.breakpoints;
            return Ok(ToolOutput::success(breakpoint_list(&listed, context.settings.max_output)));
        }
        ActionName::Unbreak => {
            let request = Request::new(Entry::REMOVE_BREAKPOINT).key("number", asked.breakpoint);
            let reply = context.call_helper(args, request).await?;
            let Removed { removed, released } = decode::<Removed>("remove-breakpoint", &reply)?;
            return Ok(ToolOutput::success(match (removed.as_slice(), released) {
                ([], _) => "There were no breakpoints to remove.".to_string(),
                (removed, released) => format!(
                    "Removed: {}.{}",
                    removed.iter().map(Breakpoint::line).collect::<Vec<_>>().join("; "),
                    match released {
                        0 => String::new(),
                        1 => " The thread waiting at it went on.".to_string(),
                        n => format!(" The {n} threads waiting at them went on."),
                    }
                ),
            }));
        }
        ActionName::Backtrace => {
            let start = asked.start.unwrap_or(0);
            let end = asked.end.unwrap_or(start.saturating_add(FRAMES_SHOWN));
            Action::Backtrace { start, end }
        }
        ActionName::Frame => Action::Frame { frame: frame()? },
        ActionName::EvalInFrame => Action::EvalInFrame { frame: frame()?, code: code()? },
        ActionName::InvokeRestart => Action::InvokeRestart {
            restart: asked.restart.as_ref().map(Designator::as_number_or_name).ok_or_else(|| {
                ToolError::new("invoke_restart needs `restart`, the restart's number as listed or its name.")
            })?,
            arguments: asked.arguments.iter().map(String::as_str).collect(),
        },
        ActionName::ReturnFromFrame => Action::ReturnFromFrame { frame: frame()?, code: code()? },
        ActionName::RestartFrame => Action::RestartFrame { frame: frame()? },
        ActionName::Abort => Action::Abort,
        ActionName::Continue => {
            Action::InvokeRestart { restart: NumberOrName::Name("CONTINUE"), arguments: Vec::new() }
        }
        ActionName::StepInto => Action::Step { kind: "into", frame: asked.frame.unwrap_or(0) },
        ActionName::StepOver => Action::Step { kind: "over", frame: asked.frame.unwrap_or(0) },
        ActionName::StepOut => Action::Step { kind: "out", frame: asked.frame.unwrap_or(0) },
    };
    let number = match (asked.session.as_deref(), &asked.thread) {
        (Some(session), _) => session_number(session)?,
        // A thread named instead of a session is attached to first, or found in the session
        // that already has its stop.
        (None, Some(_)) => attach(context, args, &asked, &limits).await?.0,
        (None, None) => {
            return Err(ToolError::new(
                "Name the stop to act on: `session` (\"D1\", as a reply or lisp-status gave it), or `thread` (a thread \
                 waiting in a debugger, by its number or name as the threads tool lists it).",
            ))
        }
    };
    let sessions = context.debugger_sessions();
    let session = sessions.take(number).map_err(|unavailable| unavailable_session(number, unavailable))?;
    let image = session.image.clone();
    let DebuggerSession { thread, condition, since, stopped, .. } = session;
    let wait_again = |stopped: Stopped| {
        sessions.insert_waiting(DebuggerSession { number, image: image.clone(), thread, condition: condition.clone(), since, stopped })
    };
    let mut evaluation = match stopped {
        Stopped::Evaluation(evaluation) => evaluation,
        Stopped::Attached { listed, stop } => {
            // A request sent to a thread that no longer waits in a debugger would wait in its
            // mailbox for the next stop: the stop is checked first, and the session ends with it.
            if let Err(gone) = still_waits(context, args, listed, stop).await {
                sessions.end(number);
                return Err(ToolError::new(format!("Debugger session D{number} has ended: {gone}")));
            }
            let allow_exit = context.exit_allowed(&image);
            // Which call a restart re-enters, read before the frame is gone.
            let restarted = match action {
                Action::RestartFrame { frame } => {
                    let request = Request::new(Entry::DEBUGGER_FRAME).arg(frame);
                    match image.call_in_attached_thread((thread, stop), request, allow_exit, &limits).await {
                        Ok(Some(reply)) => decode::<FrameFacts>("debugger-frame", &reply).ok().map(|facts| (frame, facts.call)),
                        _ => None,
                    }
                }
                _ => None,
            };
            return match image.call_in_attached_thread((thread, stop), action.request(), allow_exit, &limits).await {
                Ok(Some(reply)) => {
                    wait_again(Stopped::Attached { listed, stop });
                    if reply.is_keyword("other-helper") {
                        return Err(ToolError::new(
                            "Another swank-mcp loaded its own helper into the image meanwhile; call again.",
                        ));
                    }
                    check_failure(&reply)?;
                    action.render(number, &reply, context).await
                }
                Ok(None) => {
                    sessions.end(number);
                    let followed =
                        follow_attached(context, args, (number, listed, stop), action.stops_again_within(), &limits)
                            .await?;
                    Ok(match restarted {
                        Some((frame, call)) => ToolOutput::new(
                            format!("Frame {frame} was restarted: {call} was called again.\n{}", followed.text),
                            followed.is_error,
                        ),
                        None => followed,
                    })
                }
                Err(e) => {
                    wait_again(Stopped::Attached { listed, stop });
                    Err(e.into())
                }
            };
        }
    };
    let deadline = Instant::now() + limits.timeout;
    match image.call_in_debugger(&evaluation, thread, action.request(), deadline, &limits).await {
        Ok(Some(reply)) => {
            wait_again(Stopped::Evaluation(evaluation));
            check_failure(&reply)?;
            action.render(number, &reply, context).await
        }
        // Control left the debugger: the evaluation goes on from where the action sent it.
        Ok(None) => {
            let next = image.follow(evaluation, deadline, &limits).await;
            report_return_or_stop(context, &image, Some(number), next, &limits, deadline).await
        }
        Err(e) => {
            if evaluation.drain_events_and_check_ended() {
                sessions.end(number);
            } else {
                wait_again(Stopped::Evaluation(evaluation));
            }
            Err(e.into())
        }
    }
}

/// A breakpoint as the helper describes it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Breakpoint {
    number: u64,
    function: String,
    condition: Option<String>,
    thread: Option<String>,
    stops_left: Option<u64>,
    hits: u64,
    condition_errors: u64,
}

impl Breakpoint {
    fn line(&self) -> String {
        let mut line = format!("Breakpoint {}: {}", self.number, self.function);
        if let Some(condition) = &self.condition {
            // The agent wrote it and has it; a long one would crowd out the rest of the list.
            const SHOWN: usize = 200;
            match condition.char_indices().nth(SHOWN) {
                Some((cut, _)) => line.push_str(&format!(" when {} ...", &condition[..cut])),
                None => line.push_str(&format!(" when {condition}")),
            }
        }
        line.push_str(&match &self.thread {
            Some(thread) => format!(", thread {thread} only"),
            None => ", every thread".to_string(),
        });
        line.push_str(&format!(", {} stop{}", self.hits, if self.hits == 1 { "" } else { "s" }));
        if let Some(left) = self.stops_left {
            line.push_str(&format!(", {left} more before it goes"));
        }
        match self.condition_errors {
            0 => {}
            1 => line.push_str(", its condition failed once (taken as false)"),
            n => line.push_str(&format!(", its condition failed {n} times (taken as false)")),
        }
        line
    }
}

/// The breakpoints a line each, within `max_output` characters (--max-output).
fn breakpoint_list(listed: &[Breakpoint], max_output: usize) -> String {
    if listed.is_empty() {
        return "No breakpoints.".to_string();
    }
    let mut text = String::new();
    for (shown, breakpoint) in listed.iter().enumerate() {
        let line = breakpoint.line();
        if !text.is_empty() && text.len() + line.len() > max_output {
            text.push_str(&format!(
                "\n[... {} more breakpoints not shown: the limit is {max_output} characters (--max-output)]",
                listed.len() - shown
            ));
            break;
        }
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&line);
    }
    text
}

#[derive(Debug, Deserialize)]
struct Breakpoints {
    breakpoints: Vec<Breakpoint>,
}

#[derive(Debug, Deserialize)]
struct Removed {
    removed: Vec<Breakpoint>,
    released: u64,
}

/// Sets a breakpoint on a function: a call that stops waits in the debugger on this server's
/// connection, for `attach` and `continue`.
async fn set_breakpoint(context: &ToolContext, args: &Arguments, asked: &Args) -> ToolResult {
    let function = asked
        .function
        .as_deref()
        .ok_or_else(|| ToolError::new("break needs `function`, the function whose calls stop."))?;
    let thread = asked.thread.clone().map(Designator::into_text);
    let request = Request::new(Entry::SET_BREAKPOINT)
        .arg(function)
        .key("condition", asked.condition.as_deref())
        .key("thread", thread)
        .key("hits", asked.hits)
        .key("package", None::<&str>)
        .key("debug-timeout", context.settings.debug_timeout.as_secs().max(1));
    let reply = context.call_helper(args, request).await?;
    let breakpoint = decode::<Breakpoint>("set-breakpoint", &reply)?;
    Ok(ToolOutput::success(format!(
        "{}. A call that stops waits in the debugger; the next evaluate-lisp reply and lisp-status say which \
         thread: attach to it, then {{\"action\": \"continue\"}} (or restart_frame after a fix). It goes with \
         unbreak or when this session ends.",
        breakpoint.line()
    )))
}

/// The helper's `recompile-for-stepping`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Recompiled {
    loaded: bool,
    errors: u64,
    file: String,
    line: u64,
}

/// Recompiles a function from its file with `(debug 3)`, which SBCL's stepper needs, or with the
/// file's own policy again (`restore`).
async fn recompile_for_stepping(context: &ToolContext, args: &Arguments, asked: &Args, restore: bool) -> ToolResult {
    let function = asked
        .function
        .as_deref()
        .ok_or_else(|| ToolError::new("This action needs `function`, the function to recompile."))?;
    let request = Request::new(Entry::RECOMPILE_FOR_STEPPING)
        .arg(function)
        .key("restore", restore)
        .key("max-output", context.settings.max_output);
    let reply = context.call_helper(args, request).await?;
    let done = decode::<Recompiled>("recompile-for-stepping", &reply)?;
    let place = format!("{}:{}", done.file, done.line);
    if !done.loaded {
        return Err(ToolError::new(format!(
            "Recompiling the definition at {place} failed ({} errors); the image keeps the one it had. load-form \
             reports the compiler's messages.",
            done.errors
        )));
    }
    Ok(ToolOutput::success(if restore {
        format!("Recompiled the definition at {place} with its file's own policy again: it runs as before the steps.")
    } else {
        format!(
            "Recompiled the definition at {place} with (debug 3): it can be stepped now (and runs slower). \
             {{\"action\": \"recompile_restore\", \"function\": {function:?}}} puts its file's own policy back."
        )
    }))
}

/// The helper's `attach-thread`: the thread found, and where it waits.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct AttachFacts {
    /// The server's id of the thread.
    thread: i64,
    /// The threads tool's number of it.
    number: u64,
    name: String,
    #[serde(rename = "where")]
    waits_in: String,
    /// The number of the stop it waits in, which an action that moved it on leaves behind.
    stop: u64,
}

/// Whether the thread the threads tool numbers `listed` still waits in stop number `stop`;
/// otherwise where it is instead.
async fn still_waits(context: &ToolContext, args: &Arguments, listed: u64, stop: u64) -> Result<(), String> {
    let request = Request::new(Entry::ATTACH_THREAD).arg(listed.to_string()).key("quietly", true);
    match context.call_helper(args, request).await {
        Ok(reply) => match decode::<AttachFacts>("attach-thread", &reply) {
            Ok(facts) if facts.stop == stop => Ok(()),
            Ok(facts) => Err(format!(
                "thread {listed} left that stop and now waits in another (stop {}): attach to it again.",
                facts.stop
            )),
            Err(e) => Err(e.0),
        },
        Err(e) => Err(e.0),
    }
}

/// Opens a thread of the image waiting in a debugger as a session (the person's SLDB, SLIME's or
/// SLY's, or none), or finds the session that has its stop already: one session a stop, whoever
/// opened it. Returns its number and its report.
async fn attach(
    context: &ToolContext,
    args: &Arguments,
    asked: &Args,
    limits: &CallLimits,
) -> Result<(u64, ToolOutput), ToolError> {
    let thread = asked.thread.clone().map(Designator::into_text).ok_or_else(|| {
        ToolError::new(
            "attach needs `thread`, a thread waiting in a debugger by its number or name as the threads tool lists it.",
        )
    })?;
    let facts = context.call_helper(args, Request::new(Entry::ATTACH_THREAD).arg(thread)).await?;
    let facts = decode::<AttachFacts>("attach-thread", &facts)?;
    let sessions = context.debugger_sessions();
    let image = context.image(args)?;
    let number = sessions.with_stop(&image, facts.stop).unwrap_or_else(|| sessions.next_number());
    match keep_attached(context, image, number, &facts, limits).await? {
        Some(report) => Ok((number, report)),
        None => Err(ToolError::new("The thread left the debugger before it could be attached to.")),
    }
}

/// Describes the stop `facts` names, in a thread of the image's own, and keeps it as session
/// `number`: the reply to an attach, and to an action after which the thread stopped again. `None`
/// when the thread left the debugger before it could be described.
async fn keep_attached(
    context: &ToolContext,
    image: std::sync::Arc<crate::image::Image>,
    number: u64,
    facts: &AttachFacts,
    limits: &CallLimits,
) -> Result<Option<ToolOutput>, ToolError> {
    let request = Request::new(Entry::DEBUGGER_REPORT).key("start", 0_u64).key("end", FRAMES_SHOWN);
    let allow_exit = context.exit_allowed(&image);
    let Some(reply) = image.call_in_attached_thread((facts.thread, facts.stop), request, allow_exit, limits).await?
    else {
        return Ok(None);
    };
    check_failure(&reply)?;
    let report = decode::<StopReport>("debugger-report", &reply)?;
    let condition =
        format!("{}: {}", report.condition.type_name, report.condition.message.lines().next().unwrap_or_default());
    context.debugger_sessions().insert_waiting(DebuggerSession {
        number,
        image,
        thread: facts.thread,
        condition,
        since: std::time::Instant::now(),
        stopped: Stopped::Attached { listed: facts.number, stop: facts.stop },
    });
    let thread = format!("{} {:?}", facts.number, facts.name);
    Ok(Some(report.into_attached_output(number, &thread, &facts.waits_in)))
}

/// What became of a thread an action moved on from stop `left`, as the helper's
/// `await-thread-stop` tells it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Moved {
    stopped: Option<u64>,
    ended: bool,
}

/// After an action moved an attached thread on from stop `left`: the stop it reaches within
/// `within` (the next step, a breakpoint, an error), reported as the same session; or that it
/// ended (an ABORT of a thread ends it); or that it was still running then, and that a stop it
/// reaches later comes in the next reply.
async fn follow_attached(
    context: &ToolContext,
    args: &Arguments,
    (number, listed, left): (u64, u64, u64),
    (within, stepped): (Duration, bool),
    limits: &CallLimits,
) -> ToolResult {
    let request = Request::new(Entry::AWAIT_THREAD_STOP)
        .arg(listed.to_string())
        .arg(left)
        .arg(u64::try_from(within.as_millis()).unwrap_or(u64::MAX));
    let moved = decode::<Moved>("await-thread-stop", &context.call_helper(args, request).await?)?;
    if moved.stopped.is_some() {
        let facts = context.call_helper(args, Request::new(Entry::ATTACH_THREAD).arg(listed.to_string())).await?;
        let facts = decode::<AttachFacts>("attach-thread", &facts)?;
        if let Some(report) = keep_attached(context, context.image(args)?, number, &facts, limits).await? {
            return Ok(report);
        }
    }
    let step_hint = if stepped {
        " No step was reached: a step stops only in code compiled with (debug 3). {\"action\": \"recompile_debug\", \
         \"function\": ...} recompiles a function so (and recompile_restore puts it back); then stop at it again and \
         step."
    } else {
        ""
    };
    if moved.ended {
        return Ok(ToolOutput::success(format!(
            "The thread left the debugger and has ended (an ABORT of a thread ends it; a debugger of the person's \
             that showed it closed); session D{number} has ended.{step_hint}"
        )));
    }
    Ok(ToolOutput::success(format!(
        "The thread left the debugger and was still running {} ms later, as the image's own (a debugger of the \
         person's that showed it closed, as when they choose a restart); session D{number} has ended. If it stops \
         again (a step, a breakpoint, an error), the next reply says so.{step_hint}",
        within.as_millis(),
    )))
}

/// Reads `D1` (or `1`) as session number 1.
fn session_number(text: &str) -> Result<u64, ToolError> {
    let digits = text.trim().trim_start_matches(['D', 'd']);
    digits.parse().map_err(|_| {
        ToolError::new(format!(
            "`session` must be a debugger session id such as \"D1\", as evaluate-lisp returns it; got {text:?}."
        ))
    })
}

fn unavailable_session(number: u64, unavailable: SessionUnavailable) -> ToolError {
    ToolError::new(match unavailable {
        SessionUnavailable::Busy => {
            format!("Debugger session D{number} is busy with another debugger call; wait for it to finish.")
        }
        SessionUnavailable::Unknown => format!(
            "There is no debugger session D{number}: its evaluation has ended (a restart or abort moved it on, or it \
             waited longer than --debug-timeout), or it never existed. lisp-status lists the sessions waiting."
        ),
    })
}

/// One debugger action and its arguments.
enum Action<'a> {
    Backtrace { start: u64, end: u64 },
    Frame { frame: u64 },
    EvalInFrame { frame: u64, code: &'a str },
    InvokeRestart { restart: NumberOrName<'a>, arguments: Vec<&'a str> },
    ReturnFromFrame { frame: u64, code: &'a str },
    RestartFrame { frame: u64 },
    Abort,
    /// SLDB's s, x and o.
    Step { kind: &'static str, frame: u64 },
}

impl<'a> Action<'a> {
    /// The request of the helper function that does it in the stopped thread.
    fn request(&self) -> Request {
        match self {
            Action::Backtrace { start, end } => Request::new(Entry::DEBUGGER_REPORT).key("start", *start).key("end", *end),
            Action::Frame { frame } => Request::new(Entry::DEBUGGER_FRAME).arg(*frame),
            Action::EvalInFrame { frame, code } => Request::new(Entry::DEBUGGER_EVAL_IN_FRAME).arg(*code).arg(*frame),
            Action::InvokeRestart { restart, arguments } => Request::new(Entry::DEBUGGER_INVOKE_RESTART)
                .arg(match restart {
                    NumberOrName::Number(n) => Form::from(*n),
                    NumberOrName::Name(name) => Form::from(*name),
                })
                .arg(Form::list_of(arguments.iter().copied())),
            Action::ReturnFromFrame { frame, code } => {
                Request::new(Entry::DEBUGGER_RETURN_FROM_FRAME).arg(*frame).arg(*code)
            }
            Action::RestartFrame { frame } => Request::new(Entry::DEBUGGER_RESTART_FRAME).arg(*frame),
            Action::Abort => Request::new(Entry::DEBUGGER_ABORT),
            Action::Step { kind, frame } => Request::new(Entry::DEBUGGER_STEP).arg(*kind).arg(*frame),
        }
    }

    /// How long an attached thread this action moved on is waited for at its next stop (a step
    /// stops again at once where the code has step points; anything else only if it meets
    /// another breakpoint or error soon), and whether the action was a step.
    fn stops_again_within(&self) -> (Duration, bool) {
        match self {
            Action::Step { .. } => (Duration::from_secs(2), true),
            _ => (Duration::from_millis(300), false),
        }
    }

    /// The reply of an action that left the evaluation where it was.
    async fn render(&self, number: u64, reply: &Sexp, context: &ToolContext) -> ToolResult {
        let max_output = context.settings.max_output;
        let waiting = format!("(Session D{number} still waits in the debugger.)");
        match self {
            Action::Backtrace { .. } => {
                let report = decode::<StopReport>("debugger-report", reply)?;
                let mut frames = if report.frames.is_empty() {
                    "[Backtrace]\n(no frames in that range)".to_string()
                } else {
                    frames_section(&report.frames)
                };
                if !report.older.is_empty() {
                    frames.push_str(&format!("\n\n[Older definitions]\n{}", report.older.join("\n")));
                }
                Ok(ToolOutput::success(format!(
                    "[DEBUGGER D{number}] {}\n\n{frames}\n\n{waiting}",
                    report.condition.type_name
                )))
            }
            Action::Frame { frame } => {
                let facts = decode::<FrameFacts>("debugger-frame", reply)?;
                let (location, source) = match facts.definition {
                    // Swank read the frame's place against the file's text as it is now.
                    Some(definition) if definition.location.note.as_deref().is_some_and(|n| n.contains("changed")) => {
                        context.on_files(move |roots| Ok(definition.found_again(roots))).await?
                    }
                    _ => (facts.location, facts.source),
                };
                let mut text = format!("[Frame {frame}] {}\nSource: {location}", facts.call);
                if let Some(source) = source.filter(|source| !source.is_empty()) {
                    text.push_str(&format!("\n{source}"));
                }
                if facts.replaced {
                    text.push_str(&format!(
                        "\n(The frame runs the definition from before the function's last redefinition: the \
                         source shown is the file's text now, not the code it runs. restart_frame {frame} calls \
                         the current one.)"
                    ));
                }
                text.push_str("\n\n[Locals]");
                if facts.locals.is_empty() {
                    text.push_str("\n(none known: the frame's function may have been compiled with low debug)");
                }
                for (name, value) in &facts.locals {
                    text.push_str(&format!("\n{name} = {value}"));
                }
                Ok(ToolOutput::success(format!("{text}\n\n{waiting}")))
            }
            Action::EvalInFrame { .. } => {
                let result = decode::<FrameEvaluation>("debugger-eval-in-frame", reply)?;
                let mut sections: Vec<String> = result.stdout.section("[stdout]", max_output).into_iter().collect();
                if !result.warnings.is_empty() {
                    sections.push(format!("[warnings]\n{}", result.warnings.join("\n")));
                }
                sections.push(if result.values.is_empty() {
                    "; No values".to_string()
                } else {
                    result.values.iter().map(|value| value.value_line(max_output)).collect::<Vec<_>>().join("\n")
                });
                sections.push(waiting);
                Ok(ToolOutput::success(sections.join("\n\n")))
            }
            // These return only when they could not do what they were asked, which the helper
            // reports as a failure; a plain reply means the restart returned normally.
            Action::InvokeRestart { .. }
            | Action::ReturnFromFrame { .. }
            | Action::RestartFrame { .. }
            | Action::Step { .. } => {
                Ok(ToolOutput::success(format!("The restart returned without moving the evaluation on. {waiting}")))
            }
            Action::Abort => Ok(ToolOutput::error(format!("The evaluation could not be aborted. {waiting}"))),
        }
    }
}

/// The helper's `debugger-frame`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct FrameFacts {
    call: String,
    /// The frame runs a definition replaced since it was entered.
    replaced: bool,
    locals: Vec<(String, String)>,
    location: String,
    source: Option<String>,
    definition: Option<FrameDefinition>,
}

/// Where the code a frame runs was compiled from.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct FrameDefinition {
    /// The frame's function as xref's hits name it: what it is looked for by in the file.
    name: String,
    location: Location,
}

impl FrameDefinition {
    /// Its place and text in the file's current text, found by its name as xref's hits are; the
    /// file alone, saying so, when it is not there.
    fn found_again(self, roots: &AllowedRoots) -> (String, Option<String>) {
        let mut texts = CurrentTexts::new(roots);
        let mut location = self.location;
        let span = query_of_hit(&self.name)
            .and_then(|(operators, form_name)| texts.relocate(&mut location, operators, &form_name));
        let text = span.and_then(|span| texts.text_of(&location, Some(span)));
        (location.to_string(), text)
    }
}

/// The helper's `debugger-eval-in-frame`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct FrameEvaluation {
    values: Vec<Captured>,
    stdout: Captured,
    warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::image::helper::{HELPER_PACKAGE, HELPER_SOURCE};
    use crate::swank::read;

    /// The entries the helper defines `:attached` (`(define-entry (NAME ... :attached HOW) ...)`),
    /// each with HOW: `t`, or `:agent-code` for one that evaluates the agent's code.
    fn attached_entries() -> BTreeMap<String, String> {
        HELPER_SOURCE
            .match_indices("(define-entry (")
            .filter_map(|(at, opener)| {
                let rest = &HELPER_SOURCE[at + opener.len()..];
                let options = &rest[..rest.find(')')?];
                let name = options.split_whitespace().next()?;
                let how = options.split(":attached ").nth(1)?.split_whitespace().next()?;
                Some((name.to_string(), how.to_string()))
            })
            .collect()
    }

    /// The helper's `:attached` option on its entries is the one statement of what a thread
    /// waiting in a debugger of its own may run: each action this tool sends to a stopped thread
    /// is such an entry, `:agent-code` exactly when the action carries the agent's code, and each
    /// such entry is an action's.
    #[test]
    fn the_actions_sent_to_a_stopped_thread_are_the_entries_the_helper_defines_attached() {
        let attached = attached_entries();
        assert!(attached.len() > 5, "{attached:?}");
        let code = "(list 'agent-code)";
        // Every kind of action on a stop, those that carry the agent's code given some.
        let actions = [
            Action::Backtrace { start: 0, end: 20 },
            Action::Frame { frame: 0 },
            Action::EvalInFrame { frame: 0, code },
            Action::InvokeRestart { restart: NumberOrName::Number(0), arguments: vec![code] },
            Action::ReturnFromFrame { frame: 0, code },
            Action::RestartFrame { frame: 0 },
            Action::Abort,
            Action::Step { kind: "into", frame: 0 },
        ];
        let mut sent = BTreeMap::new();
        for action in &actions {
            // No wildcard: a new kind of action fails to compile here until it is in `actions`.
            let name = match action {
                Action::Backtrace { .. } => "backtrace",
                Action::Frame { .. } => "frame",
                Action::EvalInFrame { .. } => "eval_in_frame",
                Action::InvokeRestart { .. } => "invoke_restart",
                Action::ReturnFromFrame { .. } => "return_from_frame",
                Action::RestartFrame { .. } => "restart_frame",
                Action::Abort => "abort",
                Action::Step { .. } => "step",
            };
            let wire = action.request().form().to_wire();
            let entry = wire
                .strip_prefix(&format!("({HELPER_PACKAGE}:"))
                .and_then(|rest| rest.split([' ', ')']).next())
                .unwrap_or_else(|| panic!("{name}'s request calls no entry of the helper: {wire}"))
                .to_string();
            assert!(
                attached.contains_key(&entry),
                "{name} sends {entry} to a stopped thread, which the helper does not define :attached"
            );
            // An entry carries the agent's code when any action sends code through it (continue
            // is invoke_restart without arguments).
            *sent.entry(entry).or_insert(false) |= wire.contains(&Form::string(code).to_wire());
        }
        let unsent: Vec<&String> = attached.keys().filter(|entry| !sent.contains_key(*entry)).collect();
        assert!(unsent.is_empty(), "defined :attached, but no action of the debugger tool sends them: {unsent:?}");
        for (entry, carries_code) in sent {
            let how = &attached[&entry];
            assert_eq!(how == ":agent-code", carries_code, "{entry}: the helper says :attached {how}");
        }
    }

    #[test]
    fn session_ids_are_read_with_or_without_the_d() {
        assert_eq!(session_number("D12").unwrap(), 12);
        assert_eq!(session_number("3").unwrap(), 3);
        assert!(session_number("X1").unwrap_err().0.contains("such as \"D1\""));
    }

    #[test]
    fn the_breakpoint_list_stays_within_the_output_limit() {
        let breakpoint = |number| Breakpoint {
            number,
            function: "SHOP::PRICE".to_string(),
            condition: Some("x".repeat(100_000)),
            thread: None,
            stops_left: None,
            hits: 1,
            condition_errors: 1,
        };
        let listed: Vec<_> = (1..=1000).map(breakpoint).collect();
        let text = breakpoint_list(&listed, 4096);
        assert!(text.len() < 4096 + 200, "{}", text.len());
        assert!(text.starts_with("Breakpoint 1: SHOP::PRICE when xxx"), "{text}");
        assert!(text.contains(" ..., every thread, 1 stop, its condition failed once (taken as false)\n"), "{text}");
        assert!(text.ends_with("more breakpoints not shown: the limit is 4096 characters (--max-output)]"), "{text}");
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let reply = read("(:call \"(F)\" :replaced nil :locals nil :location \"x.lisp:1:1\")").unwrap();
        let error = decode::<FrameFacts>("debugger-frame", &reply).unwrap_err();
        assert!(error.0.contains("(the reply has no :source)"), "{}", error.0);
    }
}
