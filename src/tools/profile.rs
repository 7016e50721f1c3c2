//! `profile`: runs code once under SBCL's statistical profiler (sb-sprof, CPU or allocation
//! mode) or under TIME, and reports where the time went.
//!
//! See docs/design.md, "The toolbox".

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::lisp_reply::{decode, group_thousands, Captured};
use super::arguments::{arguments, choices};
use super::{
    Arguments, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult,
};
use crate::image::{Entry, Request};

choices! {
    /// What the profiler counts: CPU samples, allocation samples, or TIME's totals.
    enum Mode {
        Cpu = "cpu",
        Alloc = "alloc",
        Time = "time",
    }
}
/// As evaluate-lisp's `timeout_ms`.
const MAX_TIMEOUT_MS: u64 = 86_400_000;

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "profile",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Run code once and say where its time or allocation went, or TIME it.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        code: String => code(),
        mode: Option<Mode>,
        package: Option<String>,
        timeout_ms: Option<u64> => at_least(1).at_most(MAX_TIMEOUT_MS),
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { code, mode, package, timeout_ms } = args.typed()?;
    let timeout = timeout_ms.map_or(context.settings.eval_timeout, Duration::from_millis);
    let request = Request::new(Entry::PROFILE_CODE)
        .arg(code)
        .key("mode", mode.unwrap_or(Mode::Cpu).name())
        .key("package", package)
        .key("max-output", context.settings.max_output);
    let reply =
        context.call_helper_within(args, request, timeout, "Pass a larger timeout_ms if it needs longer.").await?;
    let profile = decode::<Profile>("profile-code", &reply)?;
    Ok(ToolOutput::success(profile.render(context.settings.max_output)).with_structured(&profile))
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Row {
    name: String,
    /// `self` is a Rust keyword.
    #[serde(rename = "self")]
    own: u64,
    #[serde(rename(serialize = "self_percent"))]
    self_percent: String,
    cumulative: u64,
    #[serde(rename(serialize = "cumulative_percent"))]
    cumulative_percent: String,
}

/// The helper's answer to `profile-code`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Profile {
    mode: String,
    milliseconds: u64,
    bytes: u64,
    #[serde(rename(serialize = "gc_milliseconds"))]
    gc_milliseconds: u64,
    samples: u64,
    rows: Vec<Row>,
    #[serde(rename(serialize = "time_report"))]
    time_report: Option<String>,
    value: Option<String>,
    #[serde(skip_serializing)]
    stdout: Captured,
}

impl Profile {
    fn render(&self, max_output: usize) -> String {
        let mut sections = vec![format!(
            "Ran in {} ms, consed {} bytes, {} ms in GC.",
            group_thousands(self.milliseconds),
            group_thousands(self.bytes),
            group_thousands(self.gc_milliseconds)
        )];
        if let Some(report) = &self.time_report {
            sections.push(format!("[time]\n{}", report.trim_end()));
        } else if self.rows.is_empty() {
            sections.push(format!(
                "No samples were taken: the code ran too briefly for the profiler (profile a loop that runs it many \
                 times, or use mode \"time\"), or the profiler's timer signals went to other busy threads of the \
                 image ({} samples).",
                self.samples
            ));
        } else {
            let unit = if self.mode == "alloc" { "allocation samples" } else { "CPU samples" };
            let mut table = format!(
                "[profile] {} {unit}; top functions by self samples (Self: the samples in the function itself; \
                 Total: those with it anywhere on the stack):\n  {:>6} {:>6}  {:>6} {:>6}  Function",
                group_thousands(self.samples),
                "Self",
                "%",
                "Total",
                "%"
            );
            for row in &self.rows {
                table.push_str(&format!(
                    "\n  {:>6} {:>6}  {:>6} {:>6}  {}",
                    row.own, row.self_percent, row.cumulative, row.cumulative_percent, row.name
                ));
            }
            sections.push(table);
        }
        sections.extend(self.stdout.section("[stdout]", max_output));
        if let Some(value) = &self.value {
            sections.push(format!("=> {value}"));
        }
        sections.join("\n\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[test]
    fn a_cpu_profile_is_a_table() {
        let profile = decode::<Profile>(
            "profile-code",
            &read(
                "(:mode \"cpu\" :milliseconds 1364 :bytes 0 :gc-milliseconds 0 :samples 53 :rows \
                 ((:name \"SLOW-LOOP\" :self 53 :self-percent \"100.0\" :cumulative 53 :cumulative-percent \"100.0\")) \
                 :time-report nil :value \"50560\" :stdout (\"\" 0))",
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            profile.render(100),
            "Ran in 1,364 ms, consed 0 bytes, 0 ms in GC.\n\n[profile] 53 CPU samples; top functions by self \
             samples (Self: the samples in the function itself; Total: those with it anywhere on the stack):\n    \
             Self      %   Total      %  Function\n      53  100.0      53  100.0  SLOW-LOOP\n\n=> 50560"
        );
    }
}
