//! `find-definition`: where each definition of a symbol is, as file:line:column.

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::{decode, labelled_locations_json, location_schema, plural, render_locations, Location};
use super::{symbol_request, Annotations, Arguments, Run, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult};

fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "find-definition",
        title: "Find definitions",
        description: "Find where a symbol is defined in the running image: every definition (function, macro, generic \
            function and each method, variable, class, structure, condition, type, setf function, ...) with its file, \
            line and column, or \"defined at the REPL, no source file\" for definitions made by evaluation. Notes when \
            the file changed since it was compiled.",
        input_schema: json!({
            "type": "object",
            "required": ["symbol"],
            "properties": {
                "symbol": {"type": "string", "description": "The symbol, as you would type it: name, pkg:name or pkg::name."},
                "package": {"type": "string", "description": "Package to look an unqualified name up in (default: the session's package, initially CL-USER)."}
            }
        }),
        output_schema: Some(json!({
            "type": "object",
            "required": ["symbol", "definitions"],
            "properties": {
                "symbol": {"type": "string"},
                "definitions": {"type": "array", "items": location_schema("kind")}
            }
        })),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: true },
    }
}

/// The tool, for the table in `tools/mod.rs`.
pub const TOOL: Tool = Tool { definition, run: Run::Image(|context, args| Box::pin(call(context, args))) };

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let reply = context.call_helper(args, "find-definition", symbol_request(args)?).await?;
    let found = decode::<Definitions>("find-definition", &reply)?;
    Ok(ToolOutput::success(found.render()).with_structured(found.structured()))
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Definitions {
    pub symbol: String,
    /// What the symbol names, for the case where SBCL recorded no definition of it.
    pub names: Vec<String>,
    pub definitions: Vec<Definition>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Definition {
    /// "function", "method (CIRCLE)", ...
    pub kind: String,
    pub source: Location,
}

impl Definitions {
    fn labelled(&self) -> Vec<(&str, &Location)> {
        self.definitions.iter().map(|d| (d.kind.as_str(), &d.source)).collect()
    }

    pub fn render(&self) -> String {
        if self.definitions.is_empty() {
            return match self.names.as_slice() {
                [] => format!("{} has no definitions: it names nothing.", self.symbol),
                names => {
                    format!("{} names a {}, but SBCL recorded no source for it.", self.symbol, names.join(" and a "))
                }
            };
        }
        format!(
            "{}: {}\n{}",
            self.symbol,
            plural(self.definitions.len() as u64, "definition", "definitions"),
            render_locations(&self.labelled())
        )
    }

    pub fn structured(&self) -> Value {
        json!({"symbol": self.symbol, "definitions": labelled_locations_json(&self.labelled(), "kind")})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;
    use crate::tools::ToolError;

    const AREA: &str = "(:symbol \"S::AREA\" :names (\"generic function\") :definitions \
         ((:kind \"generic function\" :source (:file \"/s.lisp\" :line 3 :column 1 :note nil :origin nil)) \
          (:kind \"method (CIRCLE)\" :source (:file nil :line nil :column nil :note nil :origin \"defined at the REPL, no source file\"))))";

    fn found(reply: &str) -> Result<Definitions, ToolError> {
        decode("find-definition", &read(reply).unwrap())
    }

    #[test]
    fn definitions_line_up() {
        assert_eq!(
            found(AREA).unwrap().render(),
            "S::AREA: 2 definitions\n  generic function  /s.lisp:3:1\n  method (CIRCLE)   defined at the REPL, no source file"
        );
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let error = found(&AREA.replace(":names (\"generic function\") ", "")).unwrap_err();
        assert!(
            error.0.contains("reply to find-definition is not what this server expects (the reply has no :names)"),
            "{}",
            error.0
        );
        let error = found(&AREA.replace(":line 3 ", "")).unwrap_err();
        assert!(error.0.contains("(:definitions 0 :source: the reply has no :line)"), "{}", error.0);
    }
}
