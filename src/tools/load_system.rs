//! `load-system`: ASDF's `load-system` in the image, with its output and compiler warnings
//! captured and summarised, and progress reports while it runs.
//!
//! See docs/design.md, "The toolbox".

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::{decode, group_thousands, plural, Captured, ErrorReport, Reloaded};
use super::arguments::arguments;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult};
use crate::image::{Entry, Request};

/// Warnings of one load the helper keeps (its `*max-kept-warnings*`); the rest are counted.
const MAX_KEPT_WARNINGS: u64 = 10_000;

/// Compiling a large system for the first time takes minutes; the server's evaluation time limit
/// is meant for single evaluations.
const LOAD_TIMEOUT: Duration = Duration::from_secs(600);

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "load-system",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Load an ASDF system and its dependencies.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        system: String,
        force: bool,
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { system, force } = args.typed()?;
    let request = Request::new(Entry::LOAD_SYSTEM)
        .arg(system.as_str())
        .key("force", force).key("max-output", context.settings.max_output);
    let reply = context
        .call_helper_reporting(
            args,
            (
                request,
                context.settings.eval_timeout.max(LOAD_TIMEOUT),
                "Loads may take 10 minutes, or --eval-timeout if that is longer: start swank-mcp with a larger \
                 --eval-timeout, or load the system with evaluate-lisp and a larger timeout_ms.",
            ),
            Entry::LOAD_ACTIVITY,
            &format!("Loading {system}"),
        )
        .await;
    let report = decode::<LoadReport>("load-system", &reply?)?;
    Ok(LoadReport { forced: force, ..report }.into_output(context.settings.max_output))
}

/// The helper's answer to `load-system`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct LoadReport {
    pub system: String,
    /// Whether the call asked for `force`, which the reply does not repeat.
    #[serde(skip)]
    pub forced: bool,
    pub was_loaded: bool,
    pub milliseconds: u64,
    /// The compiler's errors (a form it could not compile, a file it could not read): ASDF's
    /// COMPILE-FILE-ERROR only says that there were some.
    pub errors: Vec<String>,
    pub error_count: u64,
    pub warnings: Vec<String>,
    /// When some were not shown: the handle of every warning kept, and the offset of the first
    /// not shown.
    pub warnings_rest: Option<(String, u64)>,
    pub warning_count: u64,
    pub style_warning_count: u64,
    pub note_count: u64,
    /// The files of loaded systems it loaded again, if any.
    pub reloaded: Option<Reloaded>,
    pub stdout: Captured,
    pub load_error: Option<ErrorReport>,
}

impl LoadReport {
    pub fn render(&self, max_output: usize) -> String {
        let seconds = self.milliseconds as f64 / 1000.0;
        let mut sections = Vec::new();
        // The compiler's own messages say why; ASDF's COMPILE-FILE-ERROR only says that.
        if !self.errors.is_empty() {
            let mut section = format!("[errors]\n{}", self.errors.join("\n"));
            let rest = self.error_count.saturating_sub(self.errors.len() as u64);
            if rest > 0 {
                section.push_str(&format!("\n[... {rest} more errors not shown]"));
            }
            sections.push(section);
        }
        if let Some(error) = &self.load_error {
            sections.push(error.render());
        }
        let verdict = match (&self.load_error, self.was_loaded, self.forced) {
            (Some(_), _, _) => format!(
                "Loading system {:?} failed after {seconds:.2} s; it was abandoned, and nothing waits in a debugger. \
                 Fix what the error and the compiler's messages say, then call load-system again.",
                self.system
            ),
            (None, false, _) => format!("Loaded system {:?} in {seconds:.2} s.", self.system),
            (None, true, true) => format!("Recompiled and reloaded system {:?} in {seconds:.2} s.", self.system),
            (None, true, false) => format!(
                "System {:?} was already loaded; ASDF reloaded what had changed, in {seconds:.2} s.",
                self.system
            ),
        };
        let errors = if self.error_count > 0 {
            format!("{}, ", plural(self.error_count, "error", "errors"))
        } else {
            String::new()
        };
        let reloaded = self.reloaded.as_ref().map(|reloaded| format!("\n{}", reloaded.render())).unwrap_or_default();
        sections.push(format!(
            "{verdict}\n{errors}{}, {}, {}.{reloaded}",
            plural(self.warning_count, "warning", "warnings"),
            plural(self.style_warning_count, "style-warning", "style-warnings"),
            plural(self.note_count, "compiler note", "compiler notes"),
        ));
        if !self.warnings.is_empty() {
            let mut section = format!("[warnings]\n{}", self.warnings.join("\n"));
            let shown = self.warnings.len() as u64;
            let rest = (self.warning_count + self.style_warning_count).saturating_sub(shown);
            match &self.warnings_rest {
                _ if rest == 0 => {}
                Some((handle, offset)) => {
                    let not_kept = (self.warning_count + self.style_warning_count).saturating_sub(MAX_KEPT_WARNINGS);
                    section.push_str(&format!(
                        "\n[... {} more warnings not shown: at most 50 per reply; inspect {handle} with offset {offset} for \
                         {}]",
                        group_thousands(rest),
                        if not_kept == 0 {
                            "them".to_string()
                        } else {
                            format!(
                                "the next {}; the last {} were not kept (at most 10,000 per load)",
                                group_thousands(rest - not_kept),
                                group_thousands(not_kept)
                            )
                        }
                    ));
                }
                None => section.push_str(&format!("\n[... {} more warnings not shown]", group_thousands(rest))),
            }
            sections.push(section);
        }
        sections.extend(self.stdout.section("[stdout]", max_output));
        sections.join("\n\n")
    }

    pub fn structured(&self) -> Value {
        json!({
            "system": self.system,
            "loaded": self.load_error.is_none(),
            "was_loaded": self.was_loaded,
            "milliseconds": self.milliseconds,
            "errors": self.errors,
            "error_count": self.error_count,
            "warnings": self.warnings,
            "warning_count": self.warning_count,
            "style_warning_count": self.style_warning_count,
            "note_count": self.note_count,
            "reloaded": self.reloaded.as_ref().map(Reloaded::to_json),
            "stdout": self.stdout.shown(),
            "error": self.load_error.as_ref().map(ErrorReport::to_json),
        })
    }

    pub fn into_output(self, max_output: usize) -> ToolOutput {
        let text = self.render(max_output);
        let output = ToolOutput::new(text, self.load_error.is_some());
        output.with_structured(self.structured())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;
    use crate::tools::ToolError;

    const ALEXANDRIA: &str =
        "(:system \"alexandria\" :was-loaded nil :milliseconds 2140 :errors () :error-count 0 :warnings (\"STYLE-WARNING: x\n  (in /a.lisp)\") \
         :warnings-rest nil :warning-count 0 :style-warning-count 1 :note-count 3 :reloaded nil :stdout (\"\" 0) :load-error nil)";

    fn report(reply: &str) -> Result<LoadReport, ToolError> {
        decode("load-system", &read(reply).unwrap())
    }

    #[test]
    fn a_load_is_summarised() {
        assert_eq!(
            report(ALEXANDRIA).unwrap().render(65536),
            "Loaded system \"alexandria\" in 2.14 s.\n0 warnings, 1 style-warning, 3 compiler notes.\n\n[warnings]\nSTYLE-WARNING: x\n  (in /a.lisp)"
        );
    }

    #[test]
    fn a_failed_load_leads_with_the_error() {
        let output = report(
            "(:system \"bad\" :was-loaded nil :milliseconds 10 :errors nil :error-count 0 :warnings nil :warnings-rest nil :warning-count 0 :style-warning-count 0 :note-count 0 \
             :reloaded nil :stdout (\"\" 0) :load-error (:kind :error :type \"ERROR\" :class \"COMMON-LISP:SIMPLE-ERROR\" :message \"boom\" :backtrace nil :restarts nil))",
        )
        .unwrap()
        .into_output(65536);
        assert!(output.is_error);
        assert!(
            output.text.starts_with("[ERROR] ERROR\nboom\n\nLoading system \"bad\" failed after 0.01 s; it was abandoned"),
            "{}",
            output.text
        );
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let error = report(&ALEXANDRIA.replace(" :load-error nil", "")).unwrap_err();
        assert!(
            error.0.contains("reply to load-system is not what this server expects (the reply has no :load-error)"),
            "{}",
            error.0
        );
    }
}
