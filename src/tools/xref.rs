//! `xref`: who calls, references, binds, sets or macroexpands a name, what a function calls, and
//! which methods specialize on a class, from SBCL's cross-reference data.
//!
//! See docs/design.md, "The toolbox".

use serde::Deserialize;
use serde_json::{json, Value};

use super::find_definition::{split_top_level, CurrentTexts};
use super::lisp_reply::{decode, labelled_locations_json, plural, render_locations, Location};
use super::arguments::{arguments, choices};
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult};
use crate::image::{Entry, Request};

choices! {
    /// Which cross-references the call asks for.
    enum Kind {
        Calls = "calls",
        Callees = "callees",
        References = "references",
        Binds = "binds",
        Sets = "sets",
        Macroexpands = "macroexpands",
        Specializes = "specializes",
    }
}

fn unknown_kind(kind: &serde_json::Value) -> String {
    format!("Unknown xref kind {kind}: use {}.", Kind::NAMES.join(", "))
}

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "xref",
        arguments: Args::PARAMS,
        read_only: true,
        description: "Who calls, references, binds, sets or macroexpands a symbol; its callees; methods specializing \
            on a class.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        symbol: String,
        kind: Kind => explained(unknown_kind),
        package: Option<String>,
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { symbol, kind, package } = args.typed()?;
    let request = Request::new(Entry::XREF).arg(symbol).arg(kind.name()).key("package", package);
    let mut found = decode::<References>("xref", &context.call_helper(args, request).await?)?;
    found = context
        .on_files(move |roots| {
            let mut texts = CurrentTexts::new(roots);
            for hit in &mut found.hits {
                if let Some((operators, form_name)) = query_of_hit(&hit.name) {
                    texts.relocate(&mut hit.source, operators, &form_name);
                }
            }
            Ok(found)
        })
        .await?;
    Ok(ToolOutput::success(found.render()).with_structured(found.structured()))
}

/// A symbol's name as `edit-lisp-form` takes it: without its package, in lower case.
pub(crate) fn bare_name(symbol: &str) -> String {
    symbol.rsplit(':').next().unwrap_or(symbol).trim_matches('|').to_lowercase()
}

/// The operators that may have made the function or method `name` (as a hit names it: `F`,
/// `PKG::F`, `(SETF F)`, `(METHOD F :AROUND (A B))` or `(METHOD F :AROUND A B)`, `(FLET G :IN
/// F)`), and its name as `edit-lisp-form` takes it: so that a hit, like a definition
/// find-definition gives, is found again in its file's current text. A local function is where
/// the definition it is in is.
pub(crate) fn query_of_hit(name: &str) -> Option<(&'static [&'static str], String)> {
    let Some(inner) = name.strip_prefix('(').and_then(|rest| rest.strip_suffix(')')) else {
        return Some((&["defun", "defgeneric", "defmacro"], bare_name(name)));
    };
    let parts = split_top_level(inner);
    let head = parts.first()?.as_str();
    match head {
        "SETF" => Some((&["defun", "defgeneric"], format!("(setf {})", bare_name(parts.get(1)?)))),
        "METHOD" | "SB-PCL::FAST-METHOD" | "SB-PCL::SLOW-METHOD" => {
            let method_name = bare_name(parts.get(1)?);
            let rest = &parts[2..];
            let qualifiers = rest.iter().take_while(|part| part.starts_with(':')).count();
            let specializers = match &rest[qualifiers..] {
                [list] if list.starts_with('(') => list.clone(),
                bare_specializers => format!("({})", bare_specializers.join(" ")),
            };
            let qualified: Vec<String> = rest[..qualifiers].iter().map(|q| q.to_lowercase()).collect();
            let form_name = if qualified.is_empty() {
                format!("{method_name} {}", specializers.to_lowercase())
            } else {
                format!("{method_name} {} {}", qualified.join(" "), specializers.to_lowercase())
            };
            Some((&["defmethod"], form_name))
        }
        _ => {
            let outer = parts.iter().position(|part| part == ":IN")?;
            let outer = parts.get(outer + 1)?;
            (!outer.starts_with('"')).then_some(())?;
            query_of_hit(outer)
        }
    }
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
         ((:name \"CALLER\" :source (:file \"/p.lisp\" :line 9 :column 1 :note nil :made-by nil :origin nil))) :rest nil)";

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
    fn a_hit_names_the_definition_to_find_again() {
        let query = |name: &str| query_of_hit(name).map(|(operators, form_name)| (operators[0], form_name));
        assert_eq!(query("CALLER-1"), Some(("defun", "caller-1".to_string())));
        assert_eq!(query("P::CALLER"), Some(("defun", "caller".to_string())));
        assert_eq!(query("(SETF P::SLOT)"), Some(("defun", "(setf slot)".to_string())));
        assert_eq!(query("(METHOD AREA :AROUND SHAPE)"), Some(("defmethod", "area :around (shape)".to_string())));
        assert_eq!(query("(METHOD AREA (SHAPE T))"), Some(("defmethod", "area (shape t)".to_string())));
        assert_eq!(query("(FLET HELP :IN P::OUTER)"), Some(("defun", "outer".to_string())));
        assert_eq!(query("(LAMBDA () :IN \"/x.lisp\")"), None);
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
