//! The evaluations stopped in an image's debugger that the debugger tool acts on, as sessions
//! `D<number>` (docs/design.md, "The toolbox"): the toolbox's registry of them, numbered by the
//! toolbox, and the report of where one stopped, which evaluate-lisp and the debugger tool both
//! give.

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use super::lisp_reply::{check_failure, decode, restarts_section, Captured, ErrorReport};
use super::{ToolContext, ToolError, ToolOutput, ToolResult};
use crate::image::{CallLimits, Entry, Evaluating, Image, Request};

/// Frames shown when an evaluation stops, and by the debugger's `backtrace` without `end`.
pub(crate) const FRAMES_SHOWN: u64 = 20;

/// A thread stopped in an image's debugger, kept for the debugger tool as session `D<number>`.
pub struct DebuggerSession {
    /// The session's number, unique in this toolbox.
    pub number: u64,
    /// The image it stopped in.
    pub image: Arc<Image>,
    /// The server's id of the thread waiting in the debugger.
    pub thread: i64,
    /// `TYPE: message` of the condition it stopped with, for lisp-status.
    pub condition: String,
    /// When it stopped.
    pub since: std::time::Instant,
    /// What stopped there.
    pub stopped: Stopped,
}

/// What a debugger session stopped.
pub enum Stopped {
    /// The agent's own evaluation (evaluate-lisp with `debug: true`), followed when the debugger
    /// tool moves it on.
    Evaluation(Evaluating),
    /// A thread of the image's own, waiting in the person's debugger (or nobody's), which the
    /// agent attached to. It is never aborted for the agent: a restart the agent invokes sends it
    /// on its way, as the person's choice would, and found again by its number when it stops again
    /// (a step, a breakpoint).
    Attached {
        /// Its number in the threads tool.
        listed: u64,
        /// The number of the stop it waits in (see the helper's STOP-NUMBER).
        stop: u64,
    },
}

impl Stopped {
    /// Whether it is known to have left the debugger, taking the evaluation's events that came
    /// meanwhile; an attached thread's fate is learned by acting on it.
    fn drain_events_and_check_ended(&mut self) -> bool {
        match self {
            Stopped::Evaluation(evaluation) => evaluation.drain_events_and_check_ended(),
            Stopped::Attached { .. } => false,
        }
    }
}

enum Slot {
    Waiting(DebuggerSession),
    /// A debugger call is acting on it.
    Busy(Arc<Image>),
}

/// Why [`DebuggerSessions::take`] gave no session.
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

/// The toolbox's debugger sessions, in every image.
#[derive(Default)]
pub struct DebuggerSessions {
    sessions: Mutex<HashMap<u64, Slot>>,
    last: AtomicU64,
    /// The stops of image threads the agent has been shown as sessions (by the image's address
    /// and the stop's number): a `[background]` notice of one is news to nobody.
    shown: Mutex<std::collections::HashSet<(usize, u64)>>,
}

impl DebuggerSessions {
    /// The number of a new session.
    pub fn next_number(&self) -> u64 {
        self.last.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Puts a stop in the table, waiting for the debugger tool: a new one, or one a call acted on
    /// and now releases.
    pub fn insert_waiting(&self, session: DebuggerSession) {
        if let Stopped::Attached { stop, .. } = session.stopped {
            let mut shown = lock(&self.shown);
            // Stop numbers only grow; the oldest are the ones no notice will name again.
            if shown.len() >= 10_000 {
                shown.clear();
            }
            shown.insert((Arc::as_ptr(&session.image) as usize, stop));
        }
        lock(&self.sessions).insert(session.number, Slot::Waiting(session));
    }

    /// Whether `image` has sessions of its own threads (attached), whose stops only the image
    /// knows to be still there.
    pub fn has_attached(&self, image: &Arc<Image>) -> bool {
        lock(&self.sessions).values().any(|slot| {
            matches!(slot, Slot::Waiting(DebuggerSession { image: its, stopped: Stopped::Attached { .. }, .. })
                if Arc::ptr_eq(its, image))
        })
    }

    /// Ends the sessions of `image`'s own threads whose stop is not among `waiting`, the stops
    /// its threads wait in now: the thread went on, or ended.
    pub fn end_attached_except(&self, image: &Arc<Image>, waiting: &[u64]) {
        lock(&self.sessions).retain(|_, slot| match slot {
            Slot::Waiting(DebuggerSession { image: its, stopped: Stopped::Attached { stop, .. }, .. })
                if Arc::ptr_eq(its, image) =>
            {
                waiting.contains(stop)
            }
            _ => true,
        });
    }

    /// Whether the agent has been shown stop number `stop` of `image`'s threads as a session.
    pub fn was_shown(&self, image: &Arc<Image>, stop: u64) -> bool {
        lock(&self.shown).contains(&(Arc::as_ptr(image) as usize, stop))
    }

    /// Takes session `number` for one debugger call, which must give it back with
    /// [`DebuggerSessions::keep`] or end it with [`DebuggerSessions::end`].
    pub fn take(&self, number: u64) -> Result<DebuggerSession, SessionUnavailable> {
        let mut sessions = lock(&self.sessions);
        match sessions.remove(&number) {
            Some(Slot::Waiting(mut session)) => {
                if session.stopped.drain_events_and_check_ended() {
                    return Err(SessionUnavailable::Unknown);
                }
                sessions.insert(number, Slot::Busy(session.image.clone()));
                Ok(session)
            }
            Some(busy @ Slot::Busy(_)) => {
                sessions.insert(number, busy);
                Err(SessionUnavailable::Busy)
            }
            None => Err(SessionUnavailable::Unknown),
        }
    }

    /// The session of `image`'s thread waiting in stop number `stop`, if one has it (the
    /// `[background]` notice of a stop and an `attach` to it share one), unless a call acts on it.
    pub fn with_stop(&self, image: &Arc<Image>, stop: u64) -> Option<u64> {
        lock(&self.sessions).iter().find_map(|(&number, slot)| match slot {
            Slot::Waiting(DebuggerSession {
                image: its, stopped: Stopped::Attached { stop: its_stop, .. }, ..
            }) if Arc::ptr_eq(its, image) && *its_stop == stop => Some(number),
            _ => None,
        })
    }

    /// Forgets session `number`: its evaluation has returned or was lost.
    pub fn end(&self, number: u64) {
        lock(&self.sessions).remove(&number);
    }

    /// The evaluations stopped in `image`'s debugger, oldest first; forgets those that have ended
    /// (an evaluation left waiting is aborted from the image's side after --debug-timeout).
    pub fn in_image(&self, image: &Arc<Image>) -> Vec<DebuggerSessionSummary> {
        let mut sessions = lock(&self.sessions);
        sessions.retain(|_, slot| match slot {
            Slot::Waiting(session) => !session.stopped.drain_events_and_check_ended(),
            Slot::Busy(_) => true,
        });
        let mut summaries: Vec<DebuggerSessionSummary> = sessions
            .iter()
            .filter_map(|(&number, slot)| match slot {
                Slot::Waiting(session) if Arc::ptr_eq(&session.image, image) => Some(DebuggerSessionSummary {
                    number,
                    thread: session.thread,
                    condition: session.condition.clone(),
                    age: session.since.elapsed(),
                    busy: false,
                }),
                Slot::Busy(busy) if Arc::ptr_eq(busy, image) => Some(DebuggerSessionSummary {
                    number,
                    thread: 0,
                    condition: String::new(),
                    age: Duration::ZERO,
                    busy: true,
                }),
                _ => None,
            })
            .collect();
        summaries.sort_by_key(|summary| summary.number);
        summaries
    }

    /// Aborts every evaluation of the agent's waiting in the debugger, for a server that exits:
    /// none is left waiting for a client that is gone. Waits a moment for each to unwind. The
    /// image's own threads it attached to stay where they wait, for the person.
    pub async fn abort_all(&self) {
        let sessions: Vec<(u64, i64, Evaluating)> = lock(&self.sessions)
            .drain()
            .filter_map(|(_, slot)| match slot {
                Slot::Waiting(DebuggerSession { number, thread, stopped: Stopped::Evaluation(evaluation), .. }) => {
                    Some((number, thread, evaluation))
                }
                _ => None,
            })
            .collect();
        for (number, thread, evaluation) in sessions {
            if !evaluation.abort(thread).await {
                tracing::warn!(session = number, "a debugger session did not unwind when aborted");
            }
        }
    }
}

/// Reports an evaluation stopped in `image`'s debugger as session `number`, and keeps it.
pub(crate) async fn stopped(
    context: &ToolContext,
    image: &Arc<Image>,
    (number, evaluation, thread): (u64, Evaluating, i64),
    limits: &CallLimits,
    deadline: Instant,
) -> ToolResult {
    let request = Request::new(Entry::DEBUGGER_REPORT).key("start", 0_u64).key("end", FRAMES_SHOWN);
    // The report is asked for within the call's grace, even when its time limit has passed.
    let deadline = deadline.max(Instant::now() + Duration::from_secs(5));
    let reply = image.call_in_debugger(&evaluation, thread, request, deadline, limits).await?;
    let Some(reply) = reply else {
        return Err(ToolError::new("The evaluation left the debugger before it could be described."));
    };
    check_failure(&reply)?;
    let report = decode::<StopReport>("debugger-report", &reply)?;
    let condition = format!("{}: {}", report.condition.type_name, first_line(&report.condition.message));
    context.debugger_sessions().insert_waiting(DebuggerSession {
        number,
        image: image.clone(),
        thread,
        condition,
        since: std::time::Instant::now(),
        stopped: Stopped::Evaluation(evaluation),
    });
    Ok(report.into_output(number, context.settings.max_output, context.settings.debug_timeout))
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// The helper's `debugger-report`: why the evaluation stopped, its frames and its output so far.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct StopReport {
    pub condition: ErrorReport,
    pub frames: Vec<(u64, String)>,
    /// Frames that run, or hold, a definition replaced since: a fix does not reach them.
    pub older: Vec<String>,
    stdout: Captured,
    stderr: Captured,
}

impl StopReport {
    /// The stop as SLDB shows it: the condition, its restarts and the frames.
    fn stop_sections(&self, number: u64) -> Vec<String> {
        let mut sections =
            vec![format!("[DEBUGGER D{number}] {}\n{}", self.condition.type_name, self.condition.message.trim_end())];
        if !self.condition.restarts.is_empty() {
            sections.push(restarts_section(&self.condition.restarts));
        }
        if !self.frames.is_empty() {
            sections.push(frames_section(&self.frames));
        }
        if !self.older.is_empty() {
            sections.push(format!("[Older definitions]\n{}", self.older.join("\n")));
        }
        sections
    }

    fn into_output(self, number: u64, max_output: usize, debug_timeout: Duration) -> ToolOutput {
        let mut sections = self.stop_sections(number);
        sections.extend(self.stdout.section("[stdout]", max_output));
        sections.extend(self.stderr.section("[stderr]", max_output));
        let example = match self.condition.restarts.first() {
            Some(_) => format!("{{\"session\": \"D{number}\", \"action\": \"invoke_restart\", \"restart\": 0}}"),
            None => format!("{{\"session\": \"D{number}\", \"action\": \"abort\"}}"),
        };
        sections.push(format!(
            "The evaluation waits in the debugger as session D{number}; it is aborted if nothing is done within {}. \
             Act on it with the debugger tool, e.g. {example}.",
            humantime::format_duration(debug_timeout)
        ));
        let structured = json!({
            "values": [],
            "stdout": self.stdout.shown(),
            "stderr": self.stderr.text,
            "warnings": [],
            "package": "",
            "error": self.condition.to_json(),
            "debugger_session": format!("D{number}"),
            "frames": self.frames.iter().map(|(index, call)| json!({"frame": index, "call": call})).collect::<Vec<_>>(),
        });
        ToolOutput::error(sections.join("\n\n")).with_structured(structured)
    }
}

impl StopReport {
    /// The reply to an attach: the stop as the person's debugger shows it, and how to act on it.
    pub(crate) fn into_attached_output(self, number: u64, thread: &str, where_: &str) -> ToolOutput {
        let mut sections = self.stop_sections(number);
        sections.push(format!(
            "Thread {thread} waits in {where_}; attached as session D{number}. Act on it with the debugger tool as on \
             any session (frame, eval_in_frame, restart_frame after you redefine a function, invoke_restart, abort): \
             a restart sends the thread on, as the person's own choice in their debugger would."
        ));
        let structured = json!({
            "error": self.condition.to_json(),
            "debugger_session": format!("D{number}"),
            "frames": self.frames.iter().map(|(index, call)| json!({"frame": index, "call": call})).collect::<Vec<_>>(),
        });
        ToolOutput::success(sections.join("\n\n")).with_structured(structured)
    }
}

pub(crate) fn frames_section(frames: &[(u64, String)]) -> String {
    let mut text = String::from("[Backtrace]");
    for (index, call) in frames {
        text.push_str(&format!("\n{index}: {call}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[test]
    fn a_stop_report_lists_the_restarts_frames_and_how_to_go_on() {
        let reply = read(
            "(:condition (:kind :error :type \"SIMPLE-ERROR\" :class \":SIMPLE-ERROR\" :message \"disk full\" \
             :backtrace nil :restarts ((\"RETRY-WRITE\" \"Retry the write\") (\"\" \"Anonymous\"))) \
             :frames ((0 \"(ERROR \\\"disk full\\\")\") (1 \"(SAVE 3)\")) :older nil :stdout (\"saving\" 0) \
             :stderr (\"\" 0))",
        )
        .unwrap();
        let output =
            decode::<StopReport>("debugger-report", &reply).unwrap().into_output(4, 65536, Duration::from_secs(600));
        assert!(output.is_error);
        assert_eq!(
            output.text,
            "[DEBUGGER D4] SIMPLE-ERROR\ndisk full\n\n[Restarts]\n0: [RETRY-WRITE] Retry the write\n1: Anonymous\n\n\
             [Backtrace]\n0: (ERROR \"disk full\")\n1: (SAVE 3)\n\n[stdout]\nsaving\n\n\
             The evaluation waits in the debugger as session D4; it is aborted if nothing is done within 10m. Act on \
             it with the debugger tool, e.g. {\"session\": \"D4\", \"action\": \"invoke_restart\", \"restart\": 0}."
        );
        assert_eq!(output.structured_value().unwrap()["debugger_session"], "D4");
    }
}
