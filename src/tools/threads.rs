//! `threads`: the image's threads (what each waits for, which the agent started), a thread's
//! backtrace, and interrupting or aborting a thread.
//!
//! See docs/design.md, "The toolbox".

use serde::{Deserialize, Serialize};

use super::lisp_reply::decode;
use super::arguments::{arguments, choices, Designator};
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use crate::image::{Entry, Request};

choices! {
    /// What the call does: list the threads, or show, interrupt or abort one.
    enum Action {
        List = "list",
        Backtrace = "backtrace",
        Interrupt = "interrupt",
        Abort = "abort",
    }
}

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "threads",
        arguments: Args::PARAMS,
        read_only: false,
        description: "The image's threads; backtrace, interrupt (into its debugger) or abort one, with force if not \
            yours.",
    },
    |context, args| Box::pin(call(context, args)),
)
.with_looking_calls(lists_only);

/// Whether a call only lists the threads, changing nothing: `--confirm mutating` lets it run.
fn lists_only(arguments: Option<&serde_json::Value>) -> bool {
    arguments
        .and_then(|arguments| arguments.get("action"))
        .and_then(serde_json::Value::as_str)
        .is_none_or(|action| action == "list")
}

arguments! {
    struct Args {
        action: Option<Action>,
        thread: Option<Designator>,
        force: bool,
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { action, thread, force } = args.typed()?;
    let action = action.unwrap_or(Action::List).name();
    let thread = thread.map(Designator::into_text);
    if action != Action::List.name() && thread.is_none() {
        return Err(ToolError::new(format!(
            "The {action} action needs thread: a number or name from {{\"action\": \"list\"}}."
        )));
    }
    let request = Request::new(Entry::THREADS).key("action", action).key("thread", thread).key("force", force);
    let reply = decode::<ThreadsReply>("threads", &context.call_helper(args, request).await?)?;
    Ok(ToolOutput::success(reply.render()).with_structured(&reply))
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct ThreadEntry {
    number: u64,
    name: String,
    alive: bool,
    waiting: Option<String>,
    agent: bool,
    current: bool,
}

impl ThreadEntry {
    fn line(&self) -> String {
        let mut line = format!("{} {:?}", self.number, self.name);
        let mut facts = Vec::new();
        if !self.alive {
            facts.push("ended".to_string());
        }
        if self.agent {
            facts.push("yours".to_string());
        }
        if self.current {
            facts.push("this call".to_string());
        }
        if let Some(waiting) = &self.waiting {
            facts.push(waiting.clone());
        }
        if !facts.is_empty() {
            line.push_str(&format!(" ({})", facts.join(", ")));
        }
        line
    }
}

/// The helper's answer to `threads`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct ThreadsReply {
    action: String,
    threads: Vec<ThreadEntry>,
    thread: Option<ThreadEntry>,
    backtrace: Vec<String>,
    ended: bool,
}

impl ThreadsReply {
    fn render(&self) -> String {
        let backtrace = |lines: &[String]| {
            if lines.is_empty() {
                "Backtrace: (no frames of its own code)".to_string()
            } else {
                format!("Backtrace:\n  {}", lines.join("\n  "))
            }
        };
        let thread = self.thread.as_ref().map(ThreadEntry::line).unwrap_or_default();
        match self.action.as_str() {
            "list" => format!(
                "{} threads:\n{}",
                self.threads.len(),
                self.threads.iter().map(|t| format!("  {}", t.line())).collect::<Vec<_>>().join("\n")
            ),
            "backtrace" => format!("Thread {thread}\n{}", backtrace(&self.backtrace)),
            "interrupt" => {
                format!("Interrupted thread {thread} into the debugger. Where it was:\n{}", backtrace(&self.backtrace))
            }
            _ if self.ended => format!("Aborted thread {thread}: it has ended."),
            _ => format!(
                "Asked thread {thread} to end, but it is still running after 2 seconds (it may be inside \
                 WITHOUT-INTERRUPTS or a foreign call); list the threads again to see whether it ended."
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[test]
    fn a_list_shows_each_thread_on_a_line() {
        let reply = decode::<ThreadsReply>(
            "threads",
            &read(
                "(:action \"list\" :threads ((:number 1 :name \"main thread\" :alive t :waiting nil :agent nil :current nil) \
                 (:number 7 :name \"worker\" :alive t :waiting \"waits for the lock \\\"db\\\", held by thread \\\"main thread\\\"\" \
                 :agent t :current nil)) :thread nil :backtrace nil :ended nil)",
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            reply.render(),
            "2 threads:\n  1 \"main thread\"\n  7 \"worker\" (yours, waits for the lock \"db\", held by thread \"main thread\")"
        );
    }
}
