//! `find-definition`: where each definition of a symbol is, as file:line:column.

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::{decode, labelled_locations_json, location_schema, plural, render_locations, Location};
use super::{
    symbol_request, Annotations, Arguments, Run, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult,
};
use crate::swank::Form;

fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "find-definition",
        title: "Find definitions",
        description: "Find where a symbol is defined in the running image: every definition (function, macro, generic \
            function and each method, variable, class, structure, condition, type, setf function, ...) with its file, \
            line and column, or \"defined at the REPL, no source file\" for definitions made by evaluation. Notes when \
            the file changed since it was compiled. Up to 2,000 definitions a reply; the last line gives the `offset` \
            of the next page.",
        input_schema: json!({
            "type": "object",
            "required": ["symbol"],
            "properties": {
                "symbol": {"type": "string", "description": "The symbol, as you would type it: name, pkg:name or pkg::name."},
                "package": {"type": "string", "description": "Package to look an unqualified name up in (default: the session's package, initially CL-USER)."},
                "offset": {"type": "integer", "minimum": 0, "default": 0, "description": "How many definitions to skip: a symbol with very many (a generic function's methods) comes in pages, and the reply's last line says which `offset` gives the next one."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_DEFINITIONS, "default": MAX_DEFINITIONS, "description": "At most this many definitions in the reply."}
            }
        }),
        output_schema: Some(json!({
            "type": "object",
            "required": ["symbol", "definitions"],
            "properties": {
                "symbol": {"type": "string"},
                "total": {"type": "integer", "description": "How many definitions the symbol has in all."},
                "offset": {"type": "integer", "description": "How many this page skipped."},
                "next_offset": {"type": ["integer", "null"], "description": "The `offset` of the next page, or null after the last."},
                "definitions": {"type": "array", "items": location_schema("kind")}
            }
        })),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: true },
    }
}

/// The tool, for the table in `tools/mod.rs`.
pub const TOOL: Tool = Tool { definition, run: Run::Image(|context, args| Box::pin(call(context, args))) };

/// The most definitions one reply holds.
pub const MAX_DEFINITIONS: u64 = 2_000;

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let offset = args.optional_u64("offset", i64::MAX as u64)?.unwrap_or(0);
    let limit = match args.optional_u64("limit", MAX_DEFINITIONS)? {
        Some(0) => return Err(ToolError::new(format!("Argument `limit` must be from 1 to {MAX_DEFINITIONS}."))),
        limit => limit.unwrap_or(MAX_DEFINITIONS),
    };
    let mut request = symbol_request(args)?;
    request.extend([
        Form::Keyword("offset"),
        Form::Integer(offset as i64),
        Form::Keyword("limit"),
        Form::Integer(limit as i64),
    ]);
    let reply = context.call_helper(args, "find-definition", request).await?;
    let found = decode::<Definitions>("find-definition", &reply)?;
    Ok(ToolOutput::success(found.render(offset)).with_structured(found.structured(offset)))
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Definitions {
    pub symbol: String,
    /// What the symbol names, for the case where SBCL recorded no definition of it.
    pub names: Vec<String>,
    /// How many definitions there are in all; `definitions` is the page asked for.
    pub total: u64,
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

    /// Where the next page starts, if there is one.
    fn next_offset(&self, offset: u64) -> Option<u64> {
        let shown_to = offset.saturating_add(self.definitions.len() as u64);
        (shown_to < self.total).then_some(shown_to)
    }

    pub fn render(&self, offset: u64) -> String {
        if self.total == 0 {
            return match self.names.as_slice() {
                [] => format!("{} has no definitions: it names nothing.", self.symbol),
                names => {
                    format!("{} names a {}, but SBCL recorded no source for it.", self.symbol, names.join(" and a "))
                }
            };
        }
        let count = plural(self.total, "definition", "definitions");
        let next = self.next_offset(offset);
        if self.definitions.is_empty() {
            return format!("{}: {count}; none from offset {offset}.", self.symbol);
        }
        let page = if offset > 0 || next.is_some() {
            format!(", {} to {}", offset + 1, offset + self.definitions.len() as u64)
        } else {
            String::new()
        };
        let mut text = format!("{}: {count}{page}\n{}", self.symbol, render_locations(&self.labelled()));
        if let Some(next) = next {
            text.push_str(&format!("\n... {} more; use `offset: {next}` for the next page.", self.total - next));
        }
        text
    }

    pub fn structured(&self, offset: u64) -> Value {
        json!({
            "symbol": self.symbol,
            "total": self.total,
            "offset": offset,
            "next_offset": self.next_offset(offset),
            "definitions": labelled_locations_json(&self.labelled(), "kind"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    const AREA: &str = "(:symbol \"S::AREA\" :names (\"generic function\") :total 2 :definitions \
         ((:kind \"generic function\" :source (:file \"/s.lisp\" :line 3 :column 1 :note nil :origin nil)) \
          (:kind \"method (CIRCLE)\" :source (:file nil :line nil :column nil :note nil :origin \"defined at the REPL, no source file\"))))";

    fn found(reply: &str) -> Result<Definitions, ToolError> {
        decode("find-definition", &read(reply).unwrap())
    }

    #[test]
    fn definitions_line_up() {
        assert_eq!(
            found(AREA).unwrap().render(0),
            "S::AREA: 2 definitions\n  generic function  /s.lisp:3:1\n  method (CIRCLE)   defined at the REPL, no source file"
        );
    }

    #[test]
    fn a_page_of_many_says_where_the_next_one_starts() {
        let entry = "(:kind \"method ((EQL 1))\" :source (:file \"/m.lisp\" :line 1 :column 1 :note nil :origin nil))";
        let reply = format!(
            "(:symbol \"S::M\" :names (\"generic function\") :total 400000 :definitions ({}))",
            vec![entry; 2000].join(" ")
        );
        let found = found(&reply).unwrap();
        let text = found.render(4000);
        assert!(text.starts_with("S::M: 400000 definitions, 4001 to 6000\n"), "{}", &text[..80]);
        assert!(
            text.ends_with("\n... 394000 more; use `offset: 6000` for the next page."),
            "{}",
            &text[text.len() - 80..]
        );
        assert_eq!(text.lines().count(), 2002);
        let structured = found.structured(4000);
        assert_eq!((structured["total"].as_u64(), structured["next_offset"].as_u64()), (Some(400000), Some(6000)));
        // The last page has no next one.
        let last = found.render(398000);
        assert!(!last.contains("more; use"), "{}", &last[last.len() - 80..]);
        assert_eq!(found.structured(398000)["next_offset"], serde_json::Value::Null);
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
