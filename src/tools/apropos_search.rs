//! `apropos-search`: the symbols whose names contain a string, with what each names.
//!
//! See docs/design.md, "The toolbox".

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::{decode, plural};
use super::arguments::arguments;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult};
use crate::image::{Entry, Request};

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "apropos-search",
        arguments: Args::PARAMS,
        read_only: true,
        description: "Symbols whose names contain query, and what each names.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        query: String,
        package: Option<String>,
        external_only: bool,
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { query, package, external_only } = args.typed()?;
    let request = Request::new(Entry::APROPOS_SEARCH)
        .arg(query.as_str())
        .key("package", package.as_deref())
        .key("external-only", external_only);
    let found = decode::<Matches>("apropos-search", &context.call_helper(args, request).await?)?;
    Ok(ToolOutput::success(found.render(&query, package.as_deref())).with_structured(found.structured()))
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Matches {
    pub total: u64,
    pub unnamed: u64,
    /// The first few of the `total`, best first.
    pub matches: Vec<Match>,
    /// When some were not listed: the handle of every match's line, and the offset of the first
    /// not listed.
    pub rest: Option<(String, u64)>,
}

/// `(symbol kind...)`: a qualified symbol and what it names.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "Vec<String>")]
struct Match {
    pub symbol: String,
    pub names: Vec<String>,
}

impl TryFrom<Vec<String>> for Match {
    type Error = String;

    fn try_from(mut parts: Vec<String>) -> Result<Self, String> {
        if parts.len() < 2 {
            return Err(format!("expected a symbol and what it names, found {parts:?}"));
        }
        let symbol = parts.remove(0);
        Ok(Match { symbol, names: parts })
    }
}

impl Matches {
    pub fn render(&self, query: &str, package: Option<&str>) -> String {
        let scope = package.map_or_else(|| " in any package".to_string(), |p| format!(" in {p}"));
        let nothing_else = match self.unnamed {
            0 => String::new(),
            1 => "\n(1 more matching symbol names nothing; it is not listed.)".to_string(),
            n => format!("\n({n} more matching symbols name nothing; they are not listed.)"),
        };
        if self.matches.is_empty() {
            return format!("No symbol that names something matches {query:?}{scope}.{nothing_else}");
        }
        let width = self.matches.iter().map(|m| m.symbol.chars().count()).max().unwrap_or(0);
        let mut text = format!("{} {query:?}{scope}:", plural(self.total, "symbol matches", "symbols match"));
        for Match { symbol, names } in &self.matches {
            text.push_str(&format!("\n  {symbol:<width$}  {}", names.join(", ")));
        }
        let rest = self.total.saturating_sub(self.matches.len() as u64);
        if rest > 0 {
            match &self.rest {
                Some((handle, offset)) => text.push_str(&format!(
                    "\n  ... and {rest} more: inspect {handle} with offset {offset} for them, or narrow the query, or pass \
                     package or external_only."
                )),
                None => text.push_str(&format!("\n  ... and {rest} more: narrow the query, or pass package or external_only.")),
            }
        }
        text.push_str(&nothing_else);
        text
    }

    pub fn structured(&self) -> Value {
        json!({
            "total": self.total,
            "unnamed": self.unnamed,
            "matches": self.matches.iter().map(|m| json!({"symbol": m.symbol, "names": m.names})).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;
    use crate::tools::ToolError;

    fn found(reply: &str) -> Result<Matches, ToolError> {
        decode("apropos-search", &read(reply).unwrap())
    }

    #[test]
    fn matches_are_aligned_and_the_rest_counted() {
        let found_flat =
            found("(:total 3 :unnamed 1 :matches ((\"ALEXANDRIA:FLATTEN\" \"function\") (\"MY:FLAT\" \"variable\" \"class\")) :rest nil)").unwrap();
        assert_eq!(
            found_flat.render("flat", None),
            "3 symbols match \"flat\" in any package:\n  ALEXANDRIA:FLATTEN  function\n  MY:FLAT             variable, class\n  \
             ... and 1 more: narrow the query, or pass package or external_only.\n(1 more matching symbol names nothing; it is not listed.)"
        );
        let kept = found("(:total 3 :unnamed 0 :matches ((\"MY:FLAT\" \"variable\")) :rest (\"@4\" 20))").unwrap();
        assert!(
            kept.render("flat", None).ends_with(
                "\n  ... and 2 more: inspect @4 with offset 20 for them, or narrow the query, or pass package or external_only."
            ),
            "{}",
            kept.render("flat", None)
        );
        let none = found("(:total 0 :unnamed 0 :matches nil :rest nil)").unwrap();
        assert_eq!(none.render("zzz", Some("CL")), "No symbol that names something matches \"zzz\" in CL.");
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let error = found("(:total 0 :matches nil :rest nil)").unwrap_err();
        assert!(
            error.0.contains("reply to apropos-search is not what this server expects (the reply has no :unnamed)"),
            "{}",
            error.0
        );
        let error = found("(:total 1 :unnamed 0 :matches ((\"CL:CAR\")) :rest nil)").unwrap_err();
        assert!(
            error.0.contains("(:matches 0: expected a symbol and what it names, found [\"CL:CAR\"])"),
            "{}",
            error.0
        );
    }
}
