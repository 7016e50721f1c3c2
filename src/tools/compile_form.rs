//! `compile-form`: compiles code in the image without running or defining anything, per
//! `contracts/compile-form.md`.
//!
//! See docs/design.md, "The toolbox".

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::{decode, plural, Captured, CompilerCondition};
use super::arguments::arguments;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult};
use crate::image::{Entry, Request};

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "compile-form",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Compile code without running or defining it: its warnings and errors.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        code: String => code(),
        package: Option<String>,
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { code, package } = args.typed()?;
    let request = Request::new(Entry::COMPILE_CODE)
        .arg(code)
        .key("package", package)
        .key("max-output", context.settings.max_output);
    let reply = context.call_helper(args, request).await?;
    Ok(decode::<CompileReport>("compile-code", &reply)?.into_output(context.settings.max_output))
}

/// Why the code could not be read, and where.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ReadError {
    pub message: String,
    pub line: i64,
    pub column: i64,
    /// The code ended inside this form (rather than the reader rejecting something in it).
    pub unclosed: bool,
}

/// The helper's answer to `compile-code`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct CompileReport {
    pub forms_compiled: u64,
    pub warnings: u64,
    pub errors: u64,
    pub style_warnings: u64,
    pub notes: u64,
    pub conditions: Vec<CompilerCondition>,
    pub read_error: Option<ReadError>,
    /// What macros printed while they were expanded.
    pub stdout: Captured,
}

impl CompileReport {
    /// Errors, the read error included.
    fn error_count(&self) -> u64 {
        self.errors + u64::from(self.read_error.is_some())
    }

    /// The contract's text: a verdict, the counts, one block per condition, and what was compiled.
    pub fn render(&self, max_output: usize) -> String {
        let errors = self.error_count();
        let verdict = if errors > 0 {
            "Compilation failed"
        } else if self.warnings + self.style_warnings > 0 {
            "Compilation successful (with warnings)"
        } else {
            "Compilation successful"
        };
        let mut counts = vec![verdict.to_string()];
        // A read error stops everything: the contract shows only the counts that say something.
        if self.read_error.is_none() || self.warnings > 0 {
            counts.push(format!("Warnings: {}", self.warnings));
        }
        counts.push(format!("Errors: {errors}"));
        if self.style_warnings > 0 {
            counts.push(format!("Style-warnings: {}", self.style_warnings));
        }
        if self.notes > 0 {
            counts.push(format!("Notes: {}", self.notes));
        }
        let mut sections = vec![counts.join("\n")];
        sections.extend(self.conditions.iter().map(render_condition));
        if let Some(read_error) = &self.read_error {
            let place = if read_error.unclosed { " (the form that is not closed starts here)" } else { "" };
            sections.push(format!(
                "ERROR: {}\n  Could not read form from code string\n  at: line {}, column {}{place}",
                read_error.message, read_error.line, read_error.column
            ));
        }
        sections.extend(self.stdout.section("[stdout]", max_output));
        let forms = plural(self.forms_compiled, "form", "forms");
        match (&self.read_error, self.errors) {
            (Some(_), _) if self.forms_compiled == 0 => {}
            (Some(_), _) => sections.push(format!("Compiled {forms} before the one that could not be read")),
            (None, 0) => sections.push(format!("Compiled {forms} successfully")),
            (None, _) => sections.push(format!("Compiled {forms}, with errors")),
        }
        sections.join("\n\n")
    }

    pub fn structured(&self) -> Value {
        json!({
            "success": self.error_count() == 0,
            "forms_compiled": self.forms_compiled,
            "warnings": self.warnings,
            "errors": self.error_count(),
            "style_warnings": self.style_warnings,
            "notes": self.notes,
            "conditions": self.conditions.iter().map(|c| json!({
                "severity": c.severity, "message": c.message, "form": c.form, "line": c.line, "column": c.column,
            })).collect::<Vec<_>>(),
            "read_error": self.read_error.as_ref().map(|r| json!({"message": r.message, "line": r.line, "column": r.column})),
        })
    }

    pub fn into_output(self, max_output: usize) -> ToolOutput {
        let text = self.render(max_output);
        let output = ToolOutput::new(text, self.error_count() > 0);
        output.with_structured(self.structured())
    }
}

fn render_condition(condition: &CompilerCondition) -> String {
    let at = match (condition.line, condition.column) {
        (Some(line), Some(column)) => Some(format!("line {line}, column {column}")),
        _ => None,
    };
    format!("{}\n  severity: {}", condition.render(at), condition.severity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::{from_sexp, read};

    fn render(reply: &str) -> String {
        from_sexp::<CompileReport>(&read(reply).unwrap()).unwrap().render(65536)
    }

    #[test]
    fn a_clean_compilation_reads_as_the_contract_shows() {
        assert_eq!(
            render("(:forms-compiled 1 :warnings 0 :errors 0 :style-warnings 0 :notes 0 :conditions nil :read-error nil :stdout (\"\" 0))"),
            "Compilation successful\nWarnings: 0\nErrors: 0\n\nCompiled 1 form successfully"
        );
    }

    #[test]
    fn a_read_error_reads_as_the_contract_shows_plus_where() {
        assert_eq!(
            render(
                "(:forms-compiled 0 :warnings 0 :errors 0 :style-warnings 0 :notes 0 :conditions nil \
                 :read-error (:message \"end of file on #<STRING-INPUT-STREAM>\" :line 1 :column 1 :unclosed t) :stdout (\"\" 0))"
            ),
            "Compilation failed\nErrors: 1\n\nERROR: end of file on #<STRING-INPUT-STREAM>\n  Could not read form from code string\n  at: line 1, column 1 (the form that is not closed starts here)"
        );
    }

    #[test]
    fn conditions_carry_form_place_and_severity() {
        let text = render(
            "(:forms-compiled 2 :warnings 1 :errors 0 :style-warnings 0 :notes 0 :conditions \
             ((:severity \"WARNING\" :message \"first\nsecond\" :form \"(DEFUN F () (G))\" :line 2 :column 12)) \
             :read-error nil :stdout (\"\" 0))",
        );
        assert_eq!(
            text,
            "Compilation successful (with warnings)\nWarnings: 1\nErrors: 0\n\nWARNING: first\n  second\n  in form: (DEFUN F () (G))\n  at: line 2, column 12\n  severity: WARNING\n\nCompiled 2 forms successfully"
        );
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let error = |reply: &str| decode::<CompileReport>("compile-code", &read(reply).unwrap()).unwrap_err().0;
        let text = error(
            "(:forms-compiled 1 :warnings 0 :errors 0 :style-warnings 0 :notes 0 :conditions nil :read-error nil)",
        );
        assert!(
            text.contains("reply to compile-code is not what this server expects (the reply has no :stdout)"),
            "{text}"
        );
        let text = error(
            "(:forms-compiled 1 :warnings 0 :errors 0 :style-warnings 0 :notes 0 :conditions ((:message \"m\" :form nil :line nil :column nil)) \
             :read-error (:message \"m\" :line 1 :column 1) :stdout (\"\" 0))",
        );
        assert!(text.contains("(:conditions 0: the reply has no :severity)"), "{text}");
        let text = error(
            "(:forms-compiled 0 :warnings 0 :errors 0 :style-warnings 0 :notes 0 :conditions nil \
             :read-error (:message \"m\" :line 1 :column 1) :stdout (\"\" 0))",
        );
        assert!(text.contains("(:read-error: the reply has no :unclosed)"), "{text}");
    }
}
