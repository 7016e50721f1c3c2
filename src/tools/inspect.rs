//! `inspect`: what SLIME's inspector shows of a value (its type, slots, elements, hash-table
//! entries, function and class facts), paged, each part with a handle to walk into; and the text
//! behind a handle (a string, or output a reply cut) read in slices.
//!
//! See docs/design.md, "The toolbox".

use serde::{Deserialize, Serialize};

use super::lisp_reply::{decode, group_thousands};
use super::arguments::arguments;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use crate::image::{Entry, Request};

/// Parts shown per page when the call gives no limit.
const DEFAULT_PARTS: u64 = 50;
const MAX_PARTS: u64 = 1000;

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "inspect",
        arguments: Args::PARAMS,
        read_only: false,
        description: "A value (handle or code) as SLIME's inspector shows it: its parts, each with a handle.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        handle: Option<String>,
        code: Option<String> => code(),
        package: Option<String>,
        offset: Option<u64>,
        limit: Option<u64> => at_least(1),
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { handle, code, package, offset, limit } = args.typed()?;
    let offset = offset.unwrap_or(0);
    let request = Request::new(Entry::INSPECT_VALUE);
    let request =
        match (handle, code) {
            (Some(handle), None) => request.key("handle", handle),
            (None, Some(code)) => request.key("code", code),
            (Some(_), Some(_)) => return Err(ToolError::new("Give either `handle` or `code`, not both.")),
            (None, None) => return Err(ToolError::new(
                "Give `handle` (such as \"@3\", from an earlier evaluate-lisp or inspect reply) or `code` to evaluate.",
            )),
        };
    let max_text = context.settings.max_output as u64;
    let request = request
        .key("package", package)
        .key("offset", offset)
        .key("limit", limit.unwrap_or(DEFAULT_PARTS).min(MAX_PARTS))
        .key("text-limit", limit.unwrap_or(max_text).min(max_text));
    let page = decode::<Page>("inspect-value", &context.call_helper(args, request).await?)?;
    Ok(ToolOutput::success(page.render()).with_structured(&page))
}

/// The helper's answer: one page of a value.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Page {
    /// Empty for a number, character or symbol, which gets no handle.
    handle: String,
    printed: String,
    #[serde(rename = "type")]
    type_name: String,
    facts: Vec<(String, String)>,
    section: String,
    parts: Vec<Part>,
    offset: u64,
    total: u64,
    /// For a text: the characters from `offset`.
    text: Option<String>,
    /// For a cut output's text: characters written that the image did not keep.
    lost: u64,
    /// Where in the text the characters not kept were: its end, or for a log the end of its
    /// start, where the end kept follows.
    gap: Option<u64>,
}

/// One part: its label, its value printed briefly, the value's handle, and the label's own handle
/// when the label is an object too (a hash table's key).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(from = "(String, String, Option<String>, Option<String>)")]
struct Part {
    label: String,
    value: String,
    handle: Option<String>,
    label_handle: Option<String>,
}

impl From<(String, String, Option<String>, Option<String>)> for Part {
    fn from((label, value, handle, label_handle): (String, String, Option<String>, Option<String>)) -> Self {
        Part { label, value, handle, label_handle }
    }
}

impl Page {
    fn render(&self) -> String {
        let name = if self.handle.is_empty() { String::new() } else { format!("{} ", self.handle) };
        match &self.text {
            Some(text) => self.render_text(&name, text),
            None => {
                let mut out = format!("{name}{}\nType: {}", self.printed, self.type_name);
                for (label, value) in &self.facts {
                    out.push_str(&format!("\n{label}: {value}"));
                }
                if self.total == 0 {
                    return out;
                }
                let end = self.offset + self.parts.len() as u64;
                out.push_str(&format!("\n\n{} ({}", self.section, group_thousands(self.total)));
                if self.offset >= self.total {
                    out.push_str(&format!("; offset {} is past the last, {})", self.offset, self.total - 1));
                    return out;
                }
                if self.offset > 0 || end < self.total {
                    out.push_str(&format!(", showing {}-{}", self.offset, end.saturating_sub(1)));
                }
                out.push_str("):");
                for part in &self.parts {
                    let label = match &part.label_handle {
                        Some(handle) => format!("{} {handle}", part.label),
                        None => part.label.clone(),
                    };
                    let handle = part.handle.as_deref().map(|h| format!(" {h}")).unwrap_or_default();
                    out.push_str(&format!("\n  {label} = {}{handle}", part.value));
                }
                if end < self.total {
                    out.push_str(&format!(
                        "\n[... {} more; inspect {} with offset {end} for the next]",
                        group_thousands(self.total - end),
                        self.handle_or_code()
                    ));
                }
                out
            }
        }
    }

    fn render_text(&self, name: &str, text: &str) -> String {
        let total = group_thousands(self.total);
        let kind = if self.type_name == "TEXT" { "text" } else { "string" };
        if self.offset >= self.total && self.total > 0 {
            return format!(
                "{name}{kind} of {total} characters; offset {} is past the last, {}",
                self.offset,
                self.total - 1
            );
        }
        let end = self.offset + text.chars().count() as u64;
        let mut out = format!(
            "{name}{kind} of {total} characters, characters {}-{}:\n{text}",
            self.offset,
            end.saturating_sub(1)
        );
        if end < self.total && self.lost > 0 && self.gap == Some(end) {
            out.push_str(&format!(
                "\n[... {} characters written here were not kept: the image keeps the start and the end of a long \
                 output. The end kept is {} characters; inspect {} with offset {end} for the next]",
                group_thousands(self.lost),
                group_thousands(self.total - end),
                self.handle_or_code()
            ));
        } else if end < self.total {
            out.push_str(&format!(
                "\n[... {} more characters; inspect {} with offset {end} for the next]",
                group_thousands(self.total - end),
                self.handle_or_code()
            ));
        } else if self.lost > 0 && self.gap.is_none_or(|gap| gap >= self.total) {
            out.push_str(&format!(
                "\n[end of the kept text: the {} characters written after it were not kept]",
                group_thousands(self.lost)
            ));
        }
        out
    }

    fn handle_or_code(&self) -> &str {
        if self.handle.is_empty() {
            "the same code"
        } else {
            &self.handle
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::{from_sexp, read};

    fn page(reply: &str) -> Page {
        from_sexp::<Page>(&read(reply).unwrap()).unwrap()
    }

    #[test]
    fn parts_are_listed_with_their_handles_and_the_next_page_is_named() {
        let text = page(
            "(:handle \"@3\" :printed \"#<HASH-TABLE :TEST EQL :COUNT 3>\" :type \"HASH-TABLE\" \
             :facts ((\"Test\" \"EQL\")) :section \"Entries (key = value)\" \
             :parts ((\":A\" \"(1 2)\" \"@4\" nil) (\"\\\"k\\\"\" \"3\" nil \"@5\")) :offset 0 :total 3 :text nil :lost 0 :gap nil)",
        )
        .render();
        assert_eq!(
            text,
            "@3 #<HASH-TABLE :TEST EQL :COUNT 3>\nType: HASH-TABLE\nTest: EQL\n\nEntries (key = value) (3, showing 0-1):\n  \
             :A = (1 2) @4\n  \"k\" @5 = 3\n[... 1 more; inspect @3 with offset 2 for the next]"
        );
    }

    #[test]
    fn an_offset_past_the_end_says_so() {
        let text = page(
            "(:handle \"@3\" :printed \"(1 2)\" :type \"CONS\" :facts nil :section \"Elements\" :parts nil \
             :offset 5 :total 2 :text nil :lost 0 :gap nil)",
        )
        .render();
        assert_eq!(text, "@3 (1 2)\nType: CONS\n\nElements (2; offset 5 is past the last, 1)");
    }

    #[test]
    fn a_text_slice_says_where_it_is_and_what_follows() {
        let text = page(
            "(:handle \"@7\" :printed \"cut output\" :type \"TEXT\" :facts nil :section \"Text\" :parts nil \
             :offset 10 :total 30 :text \"abcde\" :lost 0 :gap nil)",
        )
        .render();
        assert_eq!(
            text,
            "@7 text of 30 characters, characters 10-14:\nabcde\n[... 15 more characters; inspect @7 with offset 15 for the next]"
        );
        let end = page(
            "(:handle \"@7\" :printed \"cut output\" :type \"TEXT\" :facts nil :section \"Text\" :parts nil \
             :offset 25 :total 30 :text \"abcde\" :lost 1000 :gap 30)",
        )
        .render();
        assert!(end.ends_with("[end of the kept text: the 1,000 characters written after it were not kept]"), "{end}");
        let gap = page(
            "(:handle \"@7\" :printed \"cut output\" :type \"TEXT\" :facts nil :section \"Text\" :parts nil \
             :offset 10 :total 30 :text \"abcde\" :lost 1000 :gap 15)",
        )
        .render();
        assert!(
            gap.ends_with(
                "abcde\n[... 1,000 characters written here were not kept: the image keeps the start and the end of a \
                 long output. The end kept is 15 characters; inspect @7 with offset 15 for the next]"
            ),
            "{gap}"
        );
        let end = page(
            "(:handle \"@7\" :printed \"cut output\" :type \"TEXT\" :facts nil :section \"Text\" :parts nil \
             :offset 25 :total 30 :text \"abcde\" :lost 1000 :gap 15)",
        )
        .render();
        assert!(end.ends_with("characters 25-29:\nabcde"), "the end of a log's text is its end: {end}");
    }
}
