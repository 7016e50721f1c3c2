//! The shapes the helper returns, shared by the image tools: captured text with the count of
//! characters cut in the image, error reports, failures, and source locations.

use std::fmt;

use serde_json::{json, Value};

use super::ToolOutput;
use crate::swank::Sexp;

/// Text captured in the image, cut there to the output limit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Captured {
    pub text: String,
    /// Characters the image dropped past the limit.
    pub dropped: u64,
}

impl Captured {
    /// Reads `(text dropped)`.
    pub fn from_sexp(value: Option<&Sexp>) -> Self {
        let parts = value.and_then(Sexp::as_list).unwrap_or_default();
        Captured {
            text: parts.first().and_then(Sexp::as_str).unwrap_or_default().to_string(),
            dropped: parts.get(1).and_then(Sexp::as_i64).map_or(0, |n| n.max(0) as u64),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.dropped == 0
    }

    /// The note that says how much the image cut, if it cut anything.
    pub fn cut_note(&self, limit: usize) -> Option<String> {
        (self.dropped > 0).then(|| {
            format!(
                "[... {} more characters not shown: the limit is {} per section (--max-output)]",
                group_thousands(self.dropped),
                group_thousands(limit as u64)
            )
        })
    }
}

pub fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The strings of a list in a helper reply (`("a" "b")`); anything else counts as none.
pub fn string_list(value: Option<&Sexp>) -> Vec<String> {
    value
        .and_then(Sexp::as_list)
        .unwrap_or_default()
        .iter()
        .filter_map(|item| item.as_str().map(str::to_string))
        .collect()
}

/// An error the helper caught: a condition, a read failure, a timeout or a cancellation.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorReport {
    /// `error`, `debugger` (BREAK or INVOKE-DEBUGGER), `read`, `timeout` or `cancelled`.
    pub kind: String,
    /// The type name shown after `[ERROR]`.
    pub type_name: String,
    /// The condition's exact class, package-qualified, when there is a condition.
    pub condition_class: Option<String>,
    pub message: String,
    pub backtrace: Vec<String>,
}

impl ErrorReport {
    pub fn from_sexp(value: &Sexp) -> Option<Self> {
        if !value.is_true() {
            return None;
        }
        let kind = match value.plist_get("kind") {
            Some(Sexp::Keyword(k)) => k.to_ascii_lowercase(),
            _ => "error".into(),
        };
        Some(ErrorReport {
            kind,
            type_name: value.plist_str("type").unwrap_or("ERROR").to_string(),
            condition_class: value.plist_str("class").map(str::to_string),
            message: value.plist_str("message").unwrap_or_default().to_string(),
            backtrace: string_list(value.plist_get("backtrace")),
        })
    }

    /// The contract's error block: `[ERROR] TYPE`, the message, and a numbered `[Backtrace]`
    /// when there are frames to show.
    pub fn render(&self) -> String {
        let mut text = format!("[ERROR] {}\n{}", self.type_name, self.message.trim_end());
        if self.kind == "debugger" {
            text.push_str(
                "\n(The code entered the debugger; it was unwound, since a debugger cannot be driven through MCP.)",
            );
        }
        if !self.backtrace.is_empty() {
            text.push_str("\n\n[Backtrace]");
            for (i, frame) in self.backtrace.iter().enumerate() {
                text.push_str(&format!("\n{i}: {frame}"));
            }
        }
        text
    }

    pub fn to_json(&self) -> Value {
        json!({
            "kind": self.kind,
            "type": self.type_name,
            "condition_class": self.condition_class,
            "message": self.message,
            "backtrace": self.backtrace,
        })
    }
}

/// The output to return instead of a reply that reports a failure: `(:failure "message")`, a
/// problem the user can act on (no such package, symbol or class), shown as its message alone;
/// or `(:error report)`, a Lisp error, timeout or cancellation, shown as an `[ERROR]` block.
pub fn check_failure(reply: &Sexp) -> Result<(), ToolOutput> {
    if let Some(message) = reply.plist_str("failure") {
        return Err(ToolOutput::error(message));
    }
    match reply.plist_get("error").and_then(ErrorReport::from_sexp) {
        Some(report) => Err(ToolOutput::error(report.render())),
        None => Ok(()),
    }
}

/// The strings of a list (other elements are skipped); `nil` or a missing value is empty.
pub fn strings(value: Option<&Sexp>) -> Vec<String> {
    value.and_then(Sexp::as_list).unwrap_or_default().iter().filter_map(|s| s.as_str().map(str::to_string)).collect()
}

/// A non-negative integer of a plist, 0 when missing.
pub fn count(reply: &Sexp, key: &str) -> u64 {
    reply.plist_get(key).and_then(Sexp::as_i64).map_or(0, |n| n.max(0) as u64)
}

/// A plist value that may be a string or `nil`.
pub fn optional_string(reply: &Sexp, key: &str) -> Option<String> {
    reply.plist_str(key).map(str::to_string)
}

/// `"1 form"`, `"2 forms"`.
pub fn plural(n: u64, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// Where a definition is, as the helper's `source-location` gives it: a file with line and
/// column when they could be found, or no file and the reason (typed at the REPL, built into
/// SBCL).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Location {
    pub file: Option<String>,
    pub line: Option<u64>,
    pub column: Option<u64>,
    /// Why the line may be off or missing ("file not found", "the file changed ...").
    pub note: Option<String>,
    /// Why there is no file.
    pub origin: Option<String>,
}

impl Location {
    /// Reads the `:file :line :column :note :origin` keys of a plist.
    pub fn from_sexp(plist: &Sexp) -> Self {
        let number = |key| plist.plist_get(key).and_then(Sexp::as_i64).and_then(|n| u64::try_from(n).ok());
        Location {
            file: optional_string(plist, "file"),
            line: number("line"),
            column: number("column"),
            note: optional_string(plist, "note"),
            origin: optional_string(plist, "origin"),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"file": self.file, "line": self.line, "column": self.column, "note": self.note.as_ref().or(self.origin.as_ref())})
    }
}

impl fmt::Display for Location {
    /// `file:line:column (note)`, the form editors and terminals link to.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line, self.column) {
            (None, _, _) => f.write_str(self.origin.as_deref().unwrap_or("no source file")),
            (Some(file), Some(line), Some(column)) => write!(f, "{file}:{line}:{column}"),
            (Some(file), Some(line), None) => write!(f, "{file}:{line}"),
            (Some(file), None, _) => f.write_str(file),
        }?;
        match (&self.file, &self.note) {
            (Some(_), Some(note)) => write!(f, " ({note})"),
            _ => Ok(()),
        }
    }
}

/// A definition or cross-reference hit: `label` (its kind or its name) and where it is.
pub fn location_schema(label: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            label: {"type": "string"},
            "file": {"type": ["string", "null"], "description": "Null for definitions without a source file."},
            "line": {"type": ["integer", "null"]},
            "column": {"type": ["integer", "null"]},
            "note": {"type": ["string", "null"]}
        }
    })
}

/// Labelled locations, aligned in two columns: `label  file:line:column`.
pub fn render_locations(entries: &[(String, Location)]) -> String {
    let width = entries.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    let lines: Vec<String> = entries.iter().map(|(label, location)| format!("  {label:<width$}  {location}")).collect();
    lines.join("\n")
}

/// Reads a list of location plists, each labelled by `label_key`.
pub fn labelled_locations(list: Option<&Sexp>, label_key: &str) -> Vec<(String, Location)> {
    list.and_then(Sexp::as_list)
        .unwrap_or_default()
        .iter()
        .map(|entry| (entry.plist_str(label_key).unwrap_or_default().to_string(), Location::from_sexp(entry)))
        .collect()
}

/// Labelled locations as structured content: each location's fields plus `label_key`.
pub fn labelled_locations_json(entries: &[(String, Location)], label_key: &str) -> Vec<Value> {
    entries
        .iter()
        .map(|(label, location)| {
            let mut entry = location.to_json();
            entry[label_key] = json!(label);
            entry
        })
        .collect()
}

/// A section's text as the contract shows it: the stream's leading newlines (from `print`,
/// which starts with one) and trailing whitespace are layout, not content.
pub fn section_body(text: &str) -> &str {
    text.trim_start_matches(['\n', '\r']).trim_end()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(19_934_464), "19,934,464");
    }

    #[test]
    fn error_blocks_follow_the_contract() {
        let report = ErrorReport::from_sexp(
            &read("(:kind :error :type \"DIVISION-BY-ZERO\" :class \"COMMON-LISP:DIVISION-BY-ZERO\" :message \"arithmetic error DIVISION-BY-ZERO signalled\nOperation was (/ 1 0).\" :backtrace (\"(/ 1 0)\"))").unwrap(),
        )
        .unwrap();
        assert_eq!(
            report.render(),
            "[ERROR] DIVISION-BY-ZERO\narithmetic error DIVISION-BY-ZERO signalled\nOperation was (/ 1 0).\n\n[Backtrace]\n0: (/ 1 0)"
        );
        assert!(ErrorReport::from_sexp(&Sexp::Nil).is_none());
    }

    #[test]
    fn failures_become_error_outputs() {
        let failure = check_failure(&read("(:failure \"Class FOO not found in package CL-USER\")").unwrap()).unwrap_err();
        assert_eq!((failure.text.as_str(), failure.is_error), ("Class FOO not found in package CL-USER", true));
        let error = check_failure(&read("(:error (:kind :error :type \"TYPE-ERROR\" :message \"bad\" :backtrace nil))").unwrap()).unwrap_err();
        assert_eq!(error.text, "[ERROR] TYPE-ERROR\nbad");
        assert!(check_failure(&read("(:error nil :value 1)").unwrap()).is_ok());
    }

    #[test]
    fn locations_read_like_compiler_messages() {
        let location = |text: &str| Location::from_sexp(&read(text).unwrap()).to_string();
        assert_eq!(location("(:file \"/src/a.lisp\" :line 7 :column 1 :note nil)"), "/src/a.lisp:7:1");
        assert_eq!(location("(:file \"/src/a.lisp\" :line nil :note \"file not found\")"), "/src/a.lisp (file not found)");
        assert_eq!(location("(:file nil :origin \"defined at the REPL, no source file\")"), "defined at the REPL, no source file");
    }

    #[test]
    fn sections_drop_layout_whitespace_only() {
        assert_eq!(section_body("\nHELLO "), "HELLO");
        assert_eq!(section_body("  indented\n"), "  indented");
    }
}
