//! `describe-symbol`: everything a symbol names in the image (function, macro, generic function
//! and its methods, variable and its value, class, type), with call syntax, documentation and
//! source file.
//!
//! See docs/design.md, "The toolbox".

use serde::Deserialize;
use serde_json::{json, Value};

use super::find_definition::CurrentTexts;
use super::lisp_reply::{decode, Location};
use super::{
    Arguments, SymbolArguments, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult,
};

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "describe-symbol",
        arguments: SymbolArguments::PARAMS,
        read_only: true,
        description: "What a symbol names: syntax, documentation, value, source.",
    },
    |context, args| Box::pin(call(context, args)),
);

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let request = args.typed::<SymbolArguments>()?.request(crate::image::Entry::DESCRIBE_SYMBOL);
    let reply = context.call_helper(args, request).await?;
    let mut description = decode::<Description>("describe-symbol", &reply)?;
    // SBCL's record is where the form was when compiled: found in the file's current text as
    // find-definition finds it, so that the two tools name the same place.
    let description = context
        .on_files(move |roots| {
            let mut texts = CurrentTexts::new(roots);
            for entry in &mut description.entries {
                if let (Some(label), Some(source)) = (&entry.label, &mut entry.source) {
                    texts.relocate_labelled(source, label, &description.symbol);
                }
            }
            Ok(description)
        })
        .await?;
    Ok(ToolOutput::success(description.render()).with_structured(description.structured()))
}

/// One thing a symbol names.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Entry {
    /// "Function", "Generic function", "Variable", "Class", ...
    pub kind: String,
    /// Call syntax, value or expansion.
    pub summary: String,
    pub documentation: Option<String>,
    pub details: Vec<String>,
    /// The kind as find-definition labels it ("function", "structure"), to find the
    /// definition in its file's current text; none for a special operator.
    pub label: Option<String>,
    pub source: Option<Location>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Description {
    pub symbol: String,
    pub status: String,
    pub entries: Vec<Entry>,
}

impl Description {
    pub fn render(&self) -> String {
        let header = format!("{} ({})", self.symbol, self.status);
        if self.entries.is_empty() {
            return format!("{header} names nothing: no function, macro, variable, class or type.");
        }
        let mut sections = vec![header];
        for entry in &self.entries {
            let mut lines = vec![format!("{}: {}", entry.kind, entry.summary)];
            if let Some(documentation) = &entry.documentation {
                lines.extend(documentation.lines().map(|line| format!("  {line}").trim_end().to_string()));
            }
            lines.extend(entry.details.iter().map(|detail| format!("  {detail}")));
            if let Some(source) = &entry.source {
                lines.push(format!("  Source: {source}"));
            }
            sections.push(lines.join("\n"));
        }
        sections.join("\n\n")
    }

    pub fn structured(&self) -> Value {
        json!({
            "symbol": self.symbol,
            "status": self.status,
            "entries": self.entries.iter().map(|e| json!({
                "kind": e.kind, "summary": e.summary, "documentation": e.documentation, "details": e.details,
                "source": e.source.as_ref().map(Location::to_json),
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;
    use crate::tools::ToolError;

    const AREA: &str = "(:symbol \"SHAPES::AREA\" :status \"external in SHAPES\" :entries \
         ((:kind \"Generic function\" :summary \"(AREA SHAPE)\" :documentation \"The area.\" \
           :details (\"Methods (1):\" \"  (AREA (CIRCLE))\") :label \"generic function\" \
           :source (:file \"/src/shapes.lisp\" :line 8 :column 1 :note nil :made-by nil :origin nil))))";

    fn describe(reply: &str) -> Result<Description, ToolError> {
        decode("describe-symbol", &read(reply).unwrap())
    }

    #[test]
    fn entries_show_syntax_documentation_details_and_source() {
        assert_eq!(
            describe(AREA).unwrap().render(),
            "SHAPES::AREA (external in SHAPES)\n\nGeneric function: (AREA SHAPE)\n  The area.\n  Methods (1):\n    (AREA (CIRCLE))\n  Source: /src/shapes.lisp:8:1"
        );
        let nothing =
            describe("(:symbol \"CL-USER::X\" :status \"internal in COMMON-LISP-USER\" :entries nil)").unwrap();
        assert!(nothing.render().ends_with("names nothing: no function, macro, variable, class or type."));
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let error = describe(&AREA.replace(":details (\"Methods (1):\" \"  (AREA (CIRCLE))\") ", "")).unwrap_err();
        assert!(
            error.0.contains(
                "reply to describe-symbol is not what this server expects (:entries 0: the reply has no :details)"
            ),
            "{}",
            error.0
        );
        let error = describe(&AREA.replace(" :origin nil", "")).unwrap_err();
        assert!(error.0.contains("(:entries 0 :source: the reply has no :origin)"), "{}", error.0);
    }
}
