//! `find-definition`: where each definition of a symbol is, as file:line:column.

use serde_json::{json, Value};

use super::lisp_reply::{labelled_locations, labelled_locations_json, location_schema, plural, render_locations, strings, Location};
use super::{symbol_request, Annotations, Arguments, ToolContext, ToolDefinition, ToolOutput};
use crate::swank::Sexp;

pub fn definition() -> ToolDefinition {
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

pub async fn call(context: &ToolContext, args: &Arguments) -> ToolOutput {
    let request = match symbol_request(args) {
        Ok(request) => request,
        Err(e) => return e.into(),
    };
    match context.call_helper(args, "find-definition", request).await {
        Ok(reply) => {
            let found = Definitions::from_sexp(&reply);
            ToolOutput::success(found.render()).with_structured(found.structured())
        }
        Err(output) => output,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Definitions {
    pub symbol: String,
    /// What the symbol names, for the case where SBCL recorded no definition of it.
    pub names: Vec<String>,
    /// (kind, location).
    pub definitions: Vec<(String, Location)>,
}

impl Definitions {
    pub fn from_sexp(reply: &Sexp) -> Self {
        Definitions {
            symbol: reply.plist_str("symbol").unwrap_or_default().to_string(),
            names: strings(reply.plist_get("names")),
            definitions: labelled_locations(reply.plist_get("definitions"), "kind"),
        }
    }

    pub fn render(&self) -> String {
        if self.definitions.is_empty() {
            return match self.names.as_slice() {
                [] => format!("{} has no definitions: it names nothing.", self.symbol),
                names => format!("{} names a {}, but SBCL recorded no source for it.", self.symbol, names.join(" and a ")),
            };
        }
        format!(
            "{}: {}\n{}",
            self.symbol,
            plural(self.definitions.len() as u64, "definition", "definitions"),
            render_locations(&self.definitions)
        )
    }

    pub fn structured(&self) -> Value {
        json!({"symbol": self.symbol, "definitions": labelled_locations_json(&self.definitions, "kind")})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[test]
    fn definitions_line_up() {
        let found = Definitions::from_sexp(
            &read(
                "(:symbol \"S::AREA\" :names (\"generic function\") :definitions \
                 ((:kind \"generic function\" :file \"/s.lisp\" :line 3 :column 1) \
                  (:kind \"method (CIRCLE)\" :file nil :origin \"defined at the REPL, no source file\")))",
            )
            .unwrap(),
        );
        assert_eq!(
            found.render(),
            "S::AREA: 2 definitions\n  generic function  /s.lisp:3:1\n  method (CIRCLE)   defined at the REPL, no source file"
        );
    }
}
