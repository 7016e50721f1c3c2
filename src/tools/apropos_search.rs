//! `apropos-search`: the symbols whose names contain a string, with what each names.

use serde_json::{json, Value};

use super::lisp_reply::{count, plural};
use super::{Annotations, Arguments, ToolContext, ToolDefinition, ToolOutput};
use crate::swank::{Form, Sexp};

pub fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "apropos-search",
        title: "Find symbols by name",
        description: "Find the symbols whose names contain a string (case-insensitive), in every package or in one, \
            with what each names (function, macro, variable, class, ...). Exact and prefix matches come first, SBCL's \
            internals last; the list is capped and says how many more there are. Symbols that name nothing are \
            counted, not listed.",
        input_schema: json!({
            "type": "object",
            "required": ["query"],
            "properties": {
                "query": {"type": "string", "description": "Part of the symbol name, e.g. \"hash-table\"."},
                "package": {"type": "string", "description": "Only symbols accessible in this package (default: all packages)."},
                "external_only": {"type": "boolean", "description": "Only external symbols (default: false).", "default": false}
            }
        }),
        output_schema: Some(json!({
            "type": "object",
            "required": ["total", "unnamed", "matches"],
            "properties": {
                "total": {"type": "integer", "description": "Matching symbols that name something."},
                "unnamed": {"type": "integer", "description": "Matching symbols that name nothing (not listed)."},
                "matches": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"symbol": {"type": "string"}, "names": {"type": "array", "items": {"type": "string"}}}
                    }
                }
            }
        })),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: true },
    }
}

pub async fn call(context: &ToolContext, args: &Arguments) -> ToolOutput {
    let (query, package, external_only) = match (|| {
        Ok::<_, super::ArgumentError>((
            args.required_str("query")?,
            args.optional_str("package")?,
            args.optional_bool("external_only")?.unwrap_or(false),
        ))
    })() {
        Ok(parsed) => parsed,
        Err(e) => return e.into(),
    };
    let request = vec![
        Form::string(query),
        Form::Keyword("package"),
        package.map_or(Form::Nil, Form::string),
        Form::Keyword("external-only"),
        if external_only { Form::T } else { Form::Nil },
    ];
    match context.call_helper(args, "apropos-search", request).await {
        Ok(reply) => {
            let found = Matches::from_sexp(&reply);
            ToolOutput::success(found.render(query, package)).with_structured(found.structured())
        }
        Err(output) => output,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Matches {
    pub total: u64,
    pub unnamed: u64,
    /// (qualified symbol, what it names).
    pub shown: Vec<(String, Vec<String>)>,
}

impl Matches {
    pub fn from_sexp(reply: &Sexp) -> Self {
        Matches {
            total: count(reply, "total"),
            unnamed: count(reply, "unnamed"),
            shown: reply
                .plist_get("matches")
                .and_then(Sexp::as_list)
                .unwrap_or_default()
                .iter()
                .filter_map(|entry| {
                    let parts = entry.as_list()?;
                    let (symbol, kinds) = parts.split_first()?;
                    Some((symbol.as_str()?.to_string(), kinds.iter().filter_map(|k| k.as_str().map(str::to_string)).collect()))
                })
                .collect(),
        }
    }

    pub fn render(&self, query: &str, package: Option<&str>) -> String {
        let scope = package.map_or_else(|| " in any package".to_string(), |p| format!(" in {p}"));
        let nothing_else = match self.unnamed {
            0 => String::new(),
            1 => "\n(1 more matching symbol names nothing; it is not listed.)".to_string(),
            n => format!("\n({n} more matching symbols name nothing; they are not listed.)"),
        };
        if self.shown.is_empty() {
            return format!("No symbol that names something matches {query:?}{scope}.{nothing_else}");
        }
        let width = self.shown.iter().map(|(symbol, _)| symbol.chars().count()).max().unwrap_or(0);
        let mut text = format!("{} {query:?}{scope}:", plural(self.total, "symbol matches", "symbols match"));
        for (symbol, kinds) in &self.shown {
            text.push_str(&format!("\n  {symbol:<width$}  {}", kinds.join(", ")));
        }
        let rest = self.total.saturating_sub(self.shown.len() as u64);
        if rest > 0 {
            text.push_str(&format!("\n  ... and {rest} more: narrow the query, or pass package or external_only."));
        }
        text.push_str(&nothing_else);
        text
    }

    pub fn structured(&self) -> Value {
        json!({
            "total": self.total,
            "unnamed": self.unnamed,
            "matches": self.shown.iter().map(|(symbol, kinds)| json!({"symbol": symbol, "names": kinds})).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[test]
    fn matches_are_aligned_and_the_rest_counted() {
        let found = Matches::from_sexp(
            &read("(:total 3 :unnamed 1 :matches ((\"ALEXANDRIA:FLATTEN\" \"function\") (\"MY:FLAT\" \"variable\" \"class\")))").unwrap(),
        );
        assert_eq!(
            found.render("flat", None),
            "3 symbols match \"flat\" in any package:\n  ALEXANDRIA:FLATTEN  function\n  MY:FLAT             variable, class\n  \
             ... and 1 more: narrow the query, or pass package or external_only.\n(1 more matching symbol names nothing; it is not listed.)"
        );
        let none = Matches::from_sexp(&read("(:total 0 :unnamed 0 :matches nil)").unwrap());
        assert_eq!(none.render("zzz", Some("CL")), "No symbol that names something matches \"zzz\" in CL.");
    }
}
