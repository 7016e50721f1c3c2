//! `xref`: who calls, references, binds, sets or macroexpands a name, what a function calls, and
//! which methods specialize on a class, from SBCL's cross-reference data.

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::{decode, labelled_locations_json, location_schema, plural, render_locations, Location};
use super::{Annotations, Arguments, Run, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult};
use crate::swank::Form;

const KINDS: [&str; 7] = ["calls", "callees", "references", "binds", "sets", "macroexpands", "specializes"];

fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "xref",
        title: "Cross-references",
        description: "Cross-references in the running image, each with its file and line: who calls a function \
            (calls), what it calls (callees), who references, binds or sets a variable, who uses a macro \
            (macroexpands), which methods specialize on a class (specializes). SBCL records these for compiled code; \
            calls that were inlined leave none.",
        input_schema: json!({
            "type": "object",
            "required": ["symbol", "kind"],
            "properties": {
                "symbol": {"type": "string", "description": "The symbol, as you would type it: name, pkg:name or pkg::name."},
                "kind": {"type": "string", "enum": KINDS, "description": "Which relation to list."},
                "package": {"type": "string", "description": "Package to look an unqualified name up in (default: the session's package, initially CL-USER)."}
            }
        }),
        output_schema: Some(json!({
            "type": "object",
            "required": ["symbol", "kind", "total", "hits"],
            "properties": {
                "symbol": {"type": "string"},
                "kind": {"type": "string"},
                "total": {"type": "integer", "description": "All hits; at most 100 are listed."},
                "hits": {"type": "array", "items": location_schema("name")}
            }
        })),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: true },
    }
}

/// The tool, for the table in `tools/mod.rs`.
pub const TOOL: Tool = Tool { definition, run: Run::Image(|context, args| Box::pin(call(context, args))) };

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let request = vec![
        Form::string(args.required_str("symbol")?),
        Form::string(args.required_str("kind")?),
        Form::Keyword("package"),
        super::package_argument(args)?,
    ];
    let found = decode::<References>("xref", &context.call_helper(args, "xref", request).await?)?;
    Ok(ToolOutput::success(found.render()).with_structured(found.structured()))
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct References {
    pub symbol: String,
    pub kind: String,
    pub total: u64,
    /// In file order.
    pub hits: Vec<Hit>,
    /// When some were not listed: the handle of every hit's line (name and file), and the offset
    /// of the first not listed.
    pub rest: Option<(String, u64)>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Hit {
    /// The function or method.
    pub name: String,
    pub source: Location,
}

impl References {
    fn labelled(&self) -> Vec<(&str, &Location)> {
        self.hits.iter().map(|hit| (hit.name.as_str(), &hit.source)).collect()
    }

    pub fn render(&self) -> String {
        let symbol = &self.symbol;
        let (title, singular, many) = match self.kind.as_str() {
            "calls" => (format!("Who calls {symbol}"), "function", "functions"),
            "callees" => (format!("What {symbol} calls"), "function", "functions"),
            "references" => (format!("Who references {symbol}"), "function", "functions"),
            "binds" => (format!("Who binds {symbol}"), "function", "functions"),
            "sets" => (format!("Who sets {symbol}"), "function", "functions"),
            "macroexpands" => (format!("Who uses the macro {symbol}"), "function", "functions"),
            _ => (format!("Methods specializing on {symbol}"), "method", "methods"),
        };
        if self.hits.is_empty() {
            return format!(
                "{title}: none recorded. (SBCL records cross-references when code is compiled; inlined calls and code \
                 compiled before SBCL kept them leave none.)"
            );
        }
        let mut text =
            format!("{title}: {}\n{}", plural(self.total, singular, many), render_locations(&self.labelled()));
        let rest = self.total.saturating_sub(self.hits.len() as u64);
        if rest > 0 {
            match &self.rest {
                Some((handle, offset)) => text.push_str(&format!(
                    "\n  ... and {rest} more: inspect {handle} with offset {offset} for them (names and files)"
                )),
                None => text.push_str(&format!("\n  ... and {rest} more")),
            }
        }
        text
    }

    pub fn structured(&self) -> Value {
        json!({"symbol": self.symbol, "kind": self.kind, "total": self.total, "hits": labelled_locations_json(&self.labelled(), "name")})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;
    use crate::tools::ToolError;

    const CALLS: &str = "(:symbol \"P::TARGET\" :kind \"calls\" :total 3 :hits \
         ((:name \"CALLER\" :source (:file \"/p.lisp\" :line 9 :column 1 :note nil :origin nil))) :rest nil)";

    fn found(reply: &str) -> Result<References, ToolError> {
        decode("xref", &read(reply).unwrap())
    }

    #[test]
    fn hits_are_listed_with_the_rest_counted() {
        assert_eq!(
            found(CALLS).unwrap().render(),
            "Who calls P::TARGET: 3 functions\n  CALLER  /p.lisp:9:1\n  ... and 2 more"
        );
        assert!(found(&CALLS.replace(":rest nil", ":rest (\"@7\" 16)"))
            .unwrap()
            .render()
            .ends_with("\n  ... and 2 more: inspect @7 with offset 16 for them (names and files)"));
        let none = found("(:symbol \"P::X\" :kind \"sets\" :total 0 :hits nil :rest nil)").unwrap();
        assert!(none.render().starts_with("Who sets P::X: none recorded."));
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let error = found(&CALLS.replace(":total 3 ", "")).unwrap_err();
        assert!(
            error.0.contains("reply to xref is not what this server expects (the reply has no :total)"),
            "{}",
            error.0
        );
        let error = found(&CALLS.replace(":name \"CALLER\" ", "")).unwrap_err();
        assert!(error.0.contains("(:hits 0: the reply has no :name)"), "{}", error.0);
    }
}
