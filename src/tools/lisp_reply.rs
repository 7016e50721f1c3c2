//! The shapes the helper returns, shared by the image tools: captured text with the count of
//! characters cut in the image, and error reports.

use serde_json::{json, Value};

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
    fn sections_drop_layout_whitespace_only() {
        assert_eq!(section_body("\nHELLO "), "HELLO");
        assert_eq!(section_body("  indented\n"), "  indented");
    }
}
