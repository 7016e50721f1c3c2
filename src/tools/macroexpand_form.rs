//! `macroexpand-form`: expands a macro form in the image, one step or fully, per
//! `contracts/macroexpand-form.md`.
//!
//! See docs/design.md, "The toolbox".

use serde::Deserialize;
use serde_json::json;

use super::lisp_reply::{decode, Captured};
use super::arguments::arguments;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use crate::image::{Entry, Request};
use crate::swank::Sexp;

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "macroexpand-form",
        arguments: Args::PARAMS,
        read_only: false,
        description: "What a macro form expands to: one step, or every macro in it with full.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        form: String => code(),
        full: bool,
        package: Option<String>,
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { form, full, package } = args.typed()?;
    let request = Request::new(Entry::EXPAND_FORM)
        .arg(form)
        .key("full", full)
        .key("package", package)
        .key("max-output", context.settings.max_output);
    let reply = context.call_helper(args, request).await?;
    render(&reply, context.settings.max_output)
}

/// The helper's answer to `expand-form` when it could read the form.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Expansion {
    form: String,
    expansion: Captured,
    /// Whether the form was a macro call (with `full`, whether it contained one).
    expanded: bool,
}

/// The helper's answer to `expand-form` when the form could not be read.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Unreadable {
    read_error: String,
}

/// The contract's text for the helper's reply: the expansion under an `Expansion of` header, or
/// the read error.
fn render(reply: &Sexp, max_output: usize) -> ToolResult {
    // Two shapes of reply, told apart by the key only the read failure has.
    if reply.plist_get("read-error").is_some() {
        let unreadable = decode::<Unreadable>("expand-form", reply)?;
        return Err(ToolError::new(format!("Error reading form: {}", unreadable.read_error)));
    }
    let Expansion { form, expansion, expanded } = decode("expand-form", reply)?;
    let mut text = format!("Expansion of {form}:\n\n{}", expansion.text);
    if let Some(note) = expansion.cut_note(max_output) {
        text.push('\n');
        text.push_str(&note);
    }
    if !expanded {
        text.push_str("\n\n(Form is not a macro call)");
    }
    Ok(ToolOutput::success(text)
        .with_structured(json!({"form": form, "expansion": expansion.text, "expanded": expanded})))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    fn text(reply: &str) -> ToolOutput {
        render(&read(reply).unwrap(), 65536).unwrap_or_else(ToolOutput::from)
    }

    #[test]
    fn expansions_and_non_macros_read_as_the_contract_shows() {
        assert_eq!(
            text("(:form \"(+ 1 2)\" :expansion (\"(+ 1 2)\" 0) :expanded nil)").text,
            "Expansion of (+ 1 2):\n\n(+ 1 2)\n\n(Form is not a macro call)"
        );
        assert_eq!(
            text("(:form \"(PUSH X L)\" :expansion (\"(setq l (cons x l))\" 0) :expanded t)").text,
            "Expansion of (PUSH X L):\n\n(setq l (cons x l))"
        );
        let failed = text("(:read-error \"end of file on #<STRING-INPUT-STREAM>\")");
        assert!(failed.is_error);
        assert_eq!(failed.text, "Error reading form: end of file on #<STRING-INPUT-STREAM>");
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let failed = text("(:form \"(+ 1 2)\" :expansion (\"(+ 1 2)\" 0))");
        assert!(
            failed.is_error
                && failed
                    .text
                    .contains("reply to expand-form is not what this server expects (the reply has no :expanded)"),
            "{}",
            failed.text
        );
        assert!(text("(:read-error nil)").text.contains("(:read-error: expected a string, found nil)"));
    }
}
