//! `evaluate-lisp`: evaluates code in the image's REPL session, per
//! `contracts/evaluate-lisp.md`.
//!
//! See docs/design.md, "The toolbox".

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::debugger_sessions::{stopped, DebuggerSession, Stopped};
use super::lisp_reply::{decode, group_thousands, Captured, ErrorReport};
use super::arguments::arguments;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use crate::image::{CallError, CallLimits, Entry, Evaluation, Image, Request};
use crate::swank::Sexp;

/// A day: longer than any evaluation anyone waits for through a chat, short enough to be sure
/// the number is a mistake when exceeded.
const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// Larger print limits than these print more than any reply shows.
const MAX_PRINT_LENGTH: u64 = 1_000_000;
const MAX_PRINT_LEVEL: u64 = 10_000;

/// Public for `swank-mcp eval`, whose one call is this tool's.
pub const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "evaluate-lisp",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Evaluate forms in your own REPL session; its package and *, ** persist.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        code: String => code(),
        package: Option<String>,
        timeout_ms: Option<u64> => at_least(1).at_most(MAX_TIMEOUT_MS),
        print_length: Option<u64> => at_most(MAX_PRINT_LENGTH),
        print_level: Option<u64> => at_most(MAX_PRINT_LEVEL),
        debug: bool,
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { code, package, timeout_ms, print_length, print_level, debug } = args.typed()?;
    let image = context.image(args)?;
    let limits = CallLimits {
        timeout: timeout_ms.map_or(context.settings.eval_timeout, Duration::from_millis),
        timeout_advice: "Pass a larger timeout_ms if it needs longer.",
        cancel: context.cancel.clone(),
    };
    // The optional keys are sent only when given (or, for the flags, when they differ from the
    // helper's default): a request without them is the same as before they existed.
    let allow_exit = context.exit_allowed(&image);
    let request = Request::new(Entry::EVALUATE)
        .arg(code)
        .key("package", package)
        .key("max-output", context.settings.max_output)
        .key_if("print-length", print_length)
        .key_if("print-level", print_level)
        .key_if("handles", (!context.settings.value_handles).then_some(false))
        .key_if("allow-exit", allow_exit.then_some(true));
    if debug {
        let request = request.key("debug", true).key("debug-timeout", context.settings.debug_timeout.as_secs().max(1));
        let deadline = tokio::time::Instant::now() + limits.timeout;
        let next = image.call_helper_debuggable(request, deadline, &limits).await;
        return report_return_or_stop(context, &image, None, next, &limits, deadline).await;
    }
    let reply = context.reporting(args, image.call_helper(request, &limits), None, "Evaluating").await?;
    Ok(EvaluationReply::decode(&reply)?.with_sessions(context, &image).into_output(context.settings.max_output))
}

/// What follows an action that moved the evaluation of debugger session `session` on, or an
/// evaluate-lisp call with `debug` (no session yet): the evaluation's final reply, or the report
/// of where it stopped, as the same session when it never left the debugger, else as a new one.
pub(crate) async fn report_return_or_stop(
    context: &ToolContext,
    image: &Arc<Image>,
    session: Option<u64>,
    next: Result<Evaluation, CallError>,
    limits: &CallLimits,
    deadline: Instant,
) -> ToolResult {
    let kept = match &next {
        Ok(Evaluation::Stopped { resumed: false, .. }) => session,
        _ => None,
    };
    let sessions = context.debugger_sessions();
    if let (Some(number), None) = (session, kept) {
        sessions.end(number);
    }
    match next {
        Ok(Evaluation::Returned(reply)) => {
            Ok(EvaluationReply::decode(&reply)?.with_sessions(context, image).into_output(context.settings.max_output))
        }
        Ok(Evaluation::Stopped { evaluation, thread, .. }) => {
            let number = kept.unwrap_or_else(|| sessions.next_number());
            stopped(context, image, (number, evaluation, thread), limits, deadline).await
        }
        Err(e) => Err(e.into()),
    }
}

/// After the restarts of an error the evaluation was unwound from.
const UNWOUND_RESTARTS_NOTE: &str =
    "\n(Not taken: the evaluation was unwound. To choose one, evaluate with debug: true.)";

/// The helper's answer to `evaluate`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct EvaluationReply {
    pub values: Vec<Captured>,
    pub stdout: Captured,
    pub stderr: Captured,
    pub warnings: Vec<String>,
    /// Warnings not shown: `warnings_rest` holds all but the last `warnings_lost` of them.
    pub warnings_dropped: u64,
    /// The handle of every warning kept, and the offset of the first not shown.
    pub warnings_rest: Option<(String, u64)>,
    pub warnings_lost: u64,
    pub package: String,
    pub notes: Vec<String>,
    pub error: Option<ErrorReport>,
    /// Calls of traced functions during the evaluation.
    pub trace: TraceEvents,
    /// What the session's agent threads printed, and their errors, since the last reply.
    pub background: Background,
}

/// The `[trace]` section's events, oldest first, how many more were not shown, the handle of the
/// events kept and the offset of the first not shown, and how many were not kept.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "(Vec<String>, u64, Option<(String, u64)>, u64)")]
pub(crate) struct TraceEvents {
    pub events: Vec<String>,
    pub dropped: u64,
    pub rest: Option<(String, u64)>,
    pub lost: u64,
}

impl From<(Vec<String>, u64, Option<(String, u64)>, u64)> for TraceEvents {
    fn from((events, dropped, rest, lost): (Vec<String>, u64, Option<(String, u64)>, u64)) -> Self {
        TraceEvents { events, dropped, rest, lost }
    }
}

impl TraceEvents {
    fn section(&self) -> Option<String> {
        if self.events.is_empty() && self.dropped == 0 {
            return None;
        }
        let mut section = format!("[trace]\n{}", self.events.join("\n"));
        if self.dropped > 0 {
            let kept = self.dropped.saturating_sub(self.lost);
            let rest = match (&self.rest, self.lost) {
                (Some((handle, offset)), 0) => format!("; inspect {handle} with offset {offset} for them"),
                (Some((handle, offset)), lost) => format!(
                    "; inspect {handle} with offset {offset} for {} of them; {} were only counted (deeper than 8 \
                     levels, or past 10,000 per evaluation)",
                    group_thousands(kept),
                    group_thousands(lost)
                ),
                (None, 0) => String::new(),
                (None, lost) => format!(
                    "; {} were only counted (deeper than 8 levels, or past 10,000 per evaluation)",
                    group_thousands(lost)
                ),
            };
            section.push_str(&format!(
                "\n[... {} more trace events not shown: at most 100 per reply{rest}]",
                group_thousands(self.dropped)
            ));
        }
        Some(section)
    }
}

/// Output and unhandled errors of the threads the session's evaluations started.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct Background {
    pub output: Captured,
    pub errors: Vec<BackgroundError>,
    pub errors_dropped: u64,
}

/// An unhandled error that ended one of the agent's threads (or a BREAK it went on from).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct BackgroundError {
    pub thread: String,
    #[serde(rename = "type")]
    pub type_name: String,
    pub message: String,
    pub backtrace: Vec<String>,
    /// The threads tool's interrupt: noted, and the thread went on.
    pub went_on: bool,
    /// A thread that stopped in a debugger and waits there (one of the image's own, or one at a
    /// breakpoint): where.
    pub waits: Option<String>,
    /// The server's id and the threads tool's number of the waiting thread, and the number of
    /// its stop.
    pub attach: Option<(i64, u64, u64)>,
    /// It stopped in a debugger, and has left that stop since.
    pub gone: bool,
    /// The number of the stop it waited in.
    pub stop: Option<u64>,
    /// The debugger session it was opened as.
    #[serde(skip)]
    pub session: Option<u64>,
}

impl Background {
    fn section(&self, max_output: usize) -> Option<String> {
        if self.output.is_empty() && self.errors.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        if let Some(output) = self.output.section("Output of your threads:", max_output) {
            parts.push(output);
        }
        for error in &self.errors {
            let what = match (&error.waits, error.went_on, error.gone) {
                (Some(_), _, _) => "of the image stopped",
                (None, _, true) => "of the image stopped, and has left that stop since",
                (None, true, false) => "was interrupted and went on",
                (None, false, false) => "stopped",
            };
            let mut part = format!("Thread {:?} {what}: [ERROR] {}\n{}", error.thread, error.type_name, error.message);
            match (&error.waits, error.session) {
                (Some(waits), Some(number)) => part.push_str(&format!(
                    "\nIt waits {waits} as debugger session D{number}: the debugger tool acts on it (frame, \
                     eval_in_frame, restart_frame after a fix, continue, invoke_restart)."
                )),
                (Some(waits), None) => part.push_str(&format!("\nIt waits {waits}.")),
                (None, _) => {}
            }
            if !error.backtrace.is_empty() {
                part.push_str(&format!("\nBacktrace:\n  {}", error.backtrace.join("\n  ")));
            }
            parts.push(part);
        }
        if self.errors_dropped > 0 {
            parts.push(format!(
                "[... {} more thread errors were counted, not kept: at most 10 between two replies]",
                group_thousands(self.errors_dropped)
            ));
        }
        Some(format!("[background]\n{}", parts.join("\n\n")))
    }
}

impl EvaluationReply {
    /// The reply with each thread its background says waits in a debugger opened as a debugger
    /// session, which the reply then names: the stop the agent is told of is one it can act on.
    pub(crate) fn with_sessions(mut self, context: &ToolContext, image: &Arc<Image>) -> Self {
        let sessions = context.debugger_sessions();
        // A stop the agent has been shown as a session already (it attached, or a step it took
        // ended there) is one it knows of: each stop is told once.
        self.background.errors.retain(|error| error.stop.is_none_or(|stop| !sessions.was_shown(image, stop)));
        for error in &mut self.background.errors {
            let Some((thread, listed, stop)) = error.attach else { continue };
            let number = sessions.next_number();
            sessions.insert_waiting(DebuggerSession {
                number,
                image: image.clone(),
                thread,
                condition: format!("{}: {}", error.type_name, error.message.lines().next().unwrap_or_default()),
                since: std::time::Instant::now(),
                stopped: Stopped::Attached { listed, stop },
            });
            error.session = Some(number);
        }
        self
    }

    /// The helper's reply to `evaluate`.
    pub fn decode(reply: &Sexp) -> Result<Self, ToolError> {
        decode::<EvaluationReply>("evaluate", reply)
    }

    /// The contract's text: the error block first when there is one, then the `[stdout]`,
    /// `[stderr]` and `[warnings]` sections (each only when not empty), then the values.
    pub fn render(&self, max_output: usize) -> String {
        let mut sections = Vec::new();
        if let Some(error) = &self.error {
            let mut block = error.render();
            if !error.restarts.is_empty() {
                block.push_str(UNWOUND_RESTARTS_NOTE);
            }
            sections.push(block);
        }
        sections.extend(self.stdout.section("[stdout]", max_output));
        sections.extend(self.stderr.section("[stderr]", max_output));
        if !self.warnings.is_empty() {
            let mut section = format!("[warnings]\n{}", self.warnings.join("\n"));
            let dropped = group_thousands(self.warnings_dropped);
            match (&self.warnings_rest, self.warnings_lost) {
                _ if self.warnings_dropped == 0 => {}
                (Some((handle, offset)), 0) => section.push_str(&format!(
                    "\n[... {dropped} more warnings not shown: at most 200 per reply; inspect {handle} with offset {offset} \
                     for them]"
                )),
                (Some((handle, offset)), lost) => section.push_str(&format!(
                    "\n[... {dropped} more warnings not shown: at most 200 per reply; inspect {handle} with offset {offset} \
                     for the next {}; the last {} were not kept (at most 10,000 per evaluation)]",
                    group_thousands(self.warnings_dropped - lost),
                    group_thousands(lost)
                )),
                (None, _) => section.push_str(&format!("\n[... {dropped} more warnings not shown: at most 200 per reply]")),
            }
            sections.push(section);
        }
        sections.extend(self.trace.section());
        sections.extend(self.background.section(max_output));
        if !self.notes.is_empty() {
            sections.push(format!("[notes]\n{}", self.notes.join("\n")));
        }
        if self.error.is_none() {
            if self.values.is_empty() {
                sections.push("; No values".to_string());
            } else {
                let lines: Vec<String> = self.values.iter().map(|value| value.value_line(max_output)).collect();
                sections.push(lines.join("\n"));
            }
        }
        sections.join("\n\n")
    }

    /// The facts as the output schema describes them.
    pub fn structured(&self) -> impl Serialize + '_ {
        StructuredEvaluation {
            values: &self.values,
            handles: self.values.iter().map(|value| value.handle.as_deref()).collect(),
            stdout: self.stdout.shown(),
            stderr: self.stderr.shown(),
            warnings: &self.warnings,
            package: &self.package,
            error: self.error.as_ref().map(ErrorReport::to_json),
            trace: &self.trace.events,
            background_output: self.background.output.shown(),
            background_errors: &self.background.errors,
        }
    }

    pub fn into_output(self, max_output: usize) -> ToolOutput {
        let text = self.render(max_output);
        let output = ToolOutput::new(text, self.error.is_some());
        output.with_structured(self.structured())
    }
}

/// Written straight from the reply: this is every evaluation's structured content, and building
/// a `serde_json::Value` of it first cost as much as the rest of the formatting.
#[derive(Serialize)]
struct StructuredEvaluation<'a> {
    #[serde(serialize_with = "texts")]
    values: &'a [Captured],
    handles: Vec<Option<&'a str>>,
    stdout: std::borrow::Cow<'a, str>,
    stderr: std::borrow::Cow<'a, str>,
    warnings: &'a [String],
    package: &'a str,
    error: Option<Value>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    trace: &'a [String],
    #[serde(skip_serializing_if = "str::is_empty")]
    background_output: std::borrow::Cow<'a, str>,
    #[serde(skip_serializing_if = "<[BackgroundError]>::is_empty")]
    background_errors: &'a [BackgroundError],
}

fn texts<S: serde::Serializer>(values: &&[Captured], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(values.iter().map(|value| value.text.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::{from_sexp, read};

    fn render(reply: &str) -> String {
        from_sexp::<EvaluationReply>(&read(reply).unwrap()).unwrap().render(65536)
    }

    /// A reply with these values, stdout, stderr and warnings and nothing else to say.
    fn reply(values: &str, stdout: &str, stderr: &str, warnings: &str) -> String {
        format!(
            "(:values {values} :error nil :stdout {stdout} :stderr {stderr} :warnings {warnings} :warnings-dropped 0 :warnings-rest nil :warnings-lost 0 \
             :package \"COMMON-LISP-USER\" :notes nil :trace (nil 0 nil 0) \
             :background (:output (\"\" 0) :errors nil :errors-dropped 0))"
        )
    }

    #[test]
    fn contract_examples_render_verbatim() {
        let empty = "(\"\" 0)";
        assert_eq!(render(&reply("((\"3\" 0))", empty, empty, "nil")), "=> 3");
        assert_eq!(render(&reply("((\"42\" 0))", "(\"\nHELLO \" 0)", empty, "nil")), "[stdout]\nHELLO\n\n=> 42");
        assert_eq!(render(&reply("((\"3\" 0) (\"2\" 0))", empty, empty, "nil")), "=> 3\n=> 2");
        assert_eq!(
            render(&reply(
                "((\"FOO\" 0))",
                empty,
                empty,
                "(\"STYLE-WARNING: The variable X is defined but never used.\")"
            )),
            "[warnings]\nSTYLE-WARNING: The variable X is defined but never used.\n\n=> FOO"
        );
        assert_eq!(
            render(&reply("((\"42\" 0))", "(\"Output\n\" 0)", "(\"Error\n\" 0)", "nil")),
            "[stdout]\nOutput\n\n[stderr]\nError\n\n=> 42"
        );
    }

    #[test]
    fn cut_output_says_how_much_was_cut() {
        let text = render(&reply("((\"\\\"aaa\" 97))", "(\"aaaa\" 20000000)", "(\"\" 0)", "nil"));
        assert!(text.contains("[... 20,000,000 more characters not shown"), "{text}");
        assert!(text.contains("=> \"aaa\n[... 97 more characters"), "{text}");
    }

    #[test]
    fn errors_come_first_and_keep_earlier_output() {
        let text = render(
            "(:values nil :error (:kind :error :type \"SIMPLE-ERROR\" :class \"COMMON-LISP:SIMPLE-ERROR\" :message \"bad 2\" \
             :backtrace nil :restarts nil) :stdout (\"\n1 \" 0) :stderr (\"\" 0) :warnings nil :warnings-dropped 0 :warnings-rest nil :warnings-lost 0 \
             :package \"COMMON-LISP-USER\" :notes nil :trace (nil 0 nil 0) \
             :background (:output (\"\" 0) :errors nil :errors-dropped 0))",
        );
        assert_eq!(text, "[ERROR] SIMPLE-ERROR\nbad 2\n\n[stdout]\n1");
    }

    #[test]
    fn values_end_with_their_handles_and_cut_ones_name_where_the_rest_is() {
        let empty = "(\"\" 0)";
        assert_eq!(
            render(&reply("((\"#<ITEM {1001}>\" 0 nil 0 \"@3\") (\"2\" 0 nil 0 nil))", empty, empty, "nil")),
            "=> #<ITEM {1001}> @3\n=> 2"
        );
        assert_eq!(
            render(&reply("((\"(1 2\" 90 \"@5\" 4 \"@4\"))", "(\"ab\" 7 \"@6\" 2)", empty, "nil")),
            "[stdout]\nab\n[... 7 more characters not shown: the limit is 65,536 per section (--max-output); inspect @6 \
             with offset 2 for the rest]\n\n=> (1 2\n[... 90 more characters not shown: the limit is 65,536 per section \
             (--max-output); inspect @5 with offset 4 for the rest; the value is @4]"
        );
        assert_eq!(
            render(&reply("((\"\\\"abc\" 9 \"@4\" 3 \"@4\"))", empty, empty, "nil")),
            "=> \"abc\n[... 9 more characters not shown: the limit is 65,536 per section (--max-output); inspect @4 \
             with offset 3 for the rest]"
        );
    }

    #[test]
    fn a_cut_log_shows_its_end_and_notes_say_what_was_not_kept() {
        let empty = "(\"\" 0)";
        assert_eq!(
            render(&reply("nil", "(\"ab\" 7 \"@6\" 2 nil \"yz\" 0)", empty, "nil")),
            "[stdout]\nab\n[... 7 more characters not shown, then the last 2: the limit is 65,536 per section \
             (--max-output); inspect @6 with offset 2 for the rest]\nyz\n\n; No values"
        );
        assert_eq!(
            render(&reply("nil", "(\"ab\n\" 7000 \"@6\" 3 nil \"yz\" 6000)", empty, "nil")),
            "[stdout]\nab\n[... 7,000 more characters not shown, then the last 2: the limit is 65,536 per section \
             (--max-output). The image kept 1,000 of them and dropped the 6,000 written in their middle (it keeps the \
             start and the end of a long output); inspect @6 with offset 3 for the ones kept]\nyz\n\n; No values"
        );
        assert_eq!(
            render(&reply("((\"(1 2\" 9000 \"@5\" 4 \"@4\" \"\" 8000))", empty, empty, "nil")),
            "=> (1 2\n[... 9,000 more characters not shown: the limit is 65,536 per section (--max-output); inspect @5 \
             with offset 4 for the next 1,000. The printed text stopped being kept at 1,004 characters: the last 8,000 \
             were not kept; the value is @4]"
        );
    }

    #[test]
    fn trace_and_background_sections_come_before_the_values() {
        let full = reply("((\"1\" 0))", "(\"\" 0)", "(\"\" 0)", "nil").replace(
            ":trace (nil 0 nil 0) :background (:output (\"\" 0) :errors nil :errors-dropped 0)",
            ":trace ((\"0: (FIB 1)\" \"0: FIB returned 1\") 3 nil 3) :background (:output (\"working\" 0) \
             :errors ((:thread \"w\" :type \"SIMPLE-ERROR\" :message \"boom\" :backtrace (\"(F)\") :went-on nil :waits nil :gone nil :stop nil \
             :attach nil)) \
             :errors-dropped 0)",
        );
        let decoded = EvaluationReply::decode(&read(&full).unwrap()).unwrap();
        assert_eq!(
            decoded.render(100),
            "[trace]\n0: (FIB 1)\n0: FIB returned 1\n[... 3 more trace events not shown: at most 100 per reply; 3 were \
             only counted (deeper than 8 levels, or past 10,000 per evaluation)]\n\n[background]\nOutput of your threads:\nworking\n\nThread \"w\" stopped: [ERROR] SIMPLE-ERROR\nboom\n\
             Backtrace:\n  (F)\n\n=> 1"
        );
        let quiet =
            EvaluationReply::decode(&read(&reply("((\"1\" 0))", "(\"\" 0)", "(\"\" 0)", "nil")).unwrap()).unwrap();
        assert_eq!(quiet.render(100), "=> 1");
        let error = EvaluationReply::decode(&read(&full.replace(" :errors-dropped 0", "")).unwrap()).unwrap_err();
        assert!(error.0.contains("(:background: the reply has no :errors-dropped)"), "{}", error.0);
    }

    #[test]
    fn no_values_is_said() {
        assert_eq!(render(&reply("nil", "(\"\" 0)", "(\"\" 0)", "nil")), "; No values");
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let full = reply("nil", "(\"\" 0)", "(\"\" 0)", "nil");
        let error = decode::<EvaluationReply>(
            "evaluate",
            &read(&full.replace(":warnings-dropped 0 :warnings-rest nil :warnings-lost 0 ", "")).unwrap(),
        )
        .unwrap_err();
        assert!(
            error.0.contains("reply to evaluate is not what this server expects (the reply has no :warnings-dropped)"),
            "{}",
            error.0
        );
        let error =
            decode::<EvaluationReply>("evaluate", &read(&full.replace("(\"\" 0) :stderr", "(\"\") :stderr")).unwrap())
                .unwrap_err();
        assert!(
            error
                .0
                .contains("(:stdout: invalid length 1, expected (text dropped [more offset [handle [tail [lost]]]]))"),
            "{}",
            error.0
        );
    }
}
