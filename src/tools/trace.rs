//! `trace`: traces functions and methods with SBCL's TRACE, reporting the calls that happen
//! during this session's following evaluations in their `[trace]` section; or untraces them.
//!
//! See docs/design.md, "The toolbox".

use serde::{Deserialize, Serialize};

use super::lisp_reply::decode;
use super::arguments::{arguments, Designator};
use super::{
    Arguments, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult,
};
use crate::image::{Entry, Request};
use crate::swank::Form;

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "trace",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Trace functions, e.g. (setf f) or (method area :around (shape)), in your later evaluations, or \
            in threads (all or one; for one function, where condition holds).",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        functions: Vec<String>,
        untrace: bool,
        package: Option<String>,
        threads: Option<Designator>,
        condition: Option<String> => code(),
        max_calls: Option<u64> => at_least(1),
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { functions, untrace, package, threads, condition, max_calls } = args.typed()?;
    if functions.is_empty() && !untrace {
        return Err(super::ToolError::new(
            "Give the functions to trace, e.g. {\"functions\": [\"my-package::parse-line\"]}; to untrace \
             everything this session traces, pass {\"untrace\": true}.",
        ));
    }
    let request = Request::new(Entry::TRACE_FUNCTIONS)
        .arg(Form::list_of(functions))
        .key("untrace", untrace)
        .key("package", package)
        .key("threads", threads.map(Designator::into_text))
        .key_if("condition", condition)
        .key_if("max-calls", max_calls);
    let reply = decode::<TraceReply>("trace-functions", &context.call_helper(args, request).await?)?;
    Ok(ToolOutput::success(reply.render(untrace)).with_structured(&reply))
}

/// The helper's answer to `trace-functions`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct TraceReply {
    traced: Vec<String>,
    untraced: Vec<String>,
    #[serde(skip_serializing)]
    max_events: u64,
    #[serde(skip_serializing)]
    max_depth: u64,
    /// What the trace of other threads' calls records, when one was started.
    other_threads: Option<String>,
}

impl TraceReply {
    fn render(&self, untrace: bool) -> String {
        let mut lines = Vec::new();
        if untrace {
            lines.push(if self.untraced.is_empty() {
                "Nothing was traced.".to_string()
            } else {
                format!("Untraced {}.", self.untraced.join(", "))
            });
        }
        if self.traced.is_empty() {
            lines.push("This session traces nothing now.".to_string());
        } else {
            lines.push(format!("Tracing {}.", self.traced.join(", ")));
            lines.push(format!(
                "Their calls during your next evaluate-lisp calls appear in the [trace] section of each reply (at most \
                 {} events per reply, {} levels deep).",
                self.max_events, self.max_depth
            ));
            if let Some(other_threads) = &self.other_threads {
                lines.push(format!(
                    "Calls by other threads are recorded too ({other_threads}); each evaluate-lisp reply's [trace] \
                     section lists those made since the one before, the rest behind a handle."
                ));
            }
        }
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[test]
    fn a_trace_says_what_is_traced_and_where_calls_appear() {
        let reply = decode::<TraceReply>(
            "trace-functions",
            &read(
                "(:traced (\"FIB\" \"(METHOD AREA :AROUND (SHAPE))\") :untraced nil :max-events 100 :max-depth 8 \
                 :other-threads nil)",
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            reply.render(false),
            "Tracing FIB, (METHOD AREA :AROUND (SHAPE)).\nTheir calls during your next evaluate-lisp calls appear in \
             the [trace] section of each reply (at most 100 events per reply, 8 levels deep)."
        );
        let untraced = TraceReply {
            traced: vec![],
            untraced: vec!["FIB".into()],
            max_events: 100,
            max_depth: 8,
            other_threads: None,
        };
        assert_eq!(untraced.render(true), "Untraced FIB.\nThis session traces nothing now.");
    }
}
