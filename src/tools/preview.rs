//! What the human approves under `--confirm` (docs/design.md, "One call"): a tool's own preview
//! of a call (an edit's diff, the code a load compiles), or the code or arguments of a tool that
//! has none; and the fingerprint of what the preview was made from, which the approved call
//! checks before it acts.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use serde_json::Value;

use super::{Arguments, ToolError};

/// What a call would do, as the human is shown it.
#[derive(Debug, Clone)]
pub struct Preview {
    /// The text shown.
    pub text: String,
    /// Of the file the text was made from, for a call that acts on one, with the file's name as
    /// messages give it.
    pub fingerprint: Option<(Fingerprint, String)>,
}

/// The fingerprint of some bytes: equal for equal bytes, and not forgeable by whoever cannot read
/// this process's memory (its keys are random per process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(u64, u64);

impl Fingerprint {
    /// The fingerprint of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self::of_all([bytes])
    }

    /// The fingerprint of several texts, such as the files an edit touches, in order.
    pub fn of_all<'a>(texts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        static KEYS: OnceLock<(std::hash::RandomState, std::hash::RandomState)> = OnceLock::new();
        let (first, second) = KEYS.get_or_init(|| (std::hash::RandomState::new(), std::hash::RandomState::new()));
        let (mut one, mut two) = (first.build_hasher(), second.build_hasher());
        for text in texts {
            for hasher in [&mut one, &mut two] {
                hasher.write_usize(text.len());
                hasher.write(text);
            }
        }
        Fingerprint(one.finish(), two.finish())
    }

    /// Refuses a call of `tool` whose `file` now reads `bytes`, unless they are what the approved
    /// preview was made from.
    pub(crate) fn check(approved: Option<Self>, tool: &str, file: &str, bytes: &[u8]) -> Result<(), ToolError> {
        Self::check_read(approved, tool, file, Self::of(bytes))
    }

    /// Refuses a call of `tool` whose `file` (or files) now read as `read` says, unless that is
    /// what the approved preview was made from.
    pub(crate) fn check_read(approved: Option<Self>, tool: &str, file: &str, read: Self) -> Result<(), ToolError> {
        match approved {
            Some(approved) if approved != read => Err(ToolError::new(format!(
                "{tool} was not run: {file} changed after the user approved the call, so it would not do what they \
                 were shown. Nothing was written or loaded; call it again to ask for approval of the file as it is \
                 now."
            ))),
            _ => Ok(()),
        }
    }
}

/// As 32 hexadecimal digits, for a fingerprint that travels through a client and back (MCP's
/// `requestState`).
impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.0, self.1)
    }
}

/// The preview of a call of a tool that offers none: its code, with the package and image it
/// would run in, or else its arguments.
pub(crate) fn of_arguments(args: &Arguments) -> Preview {
    let given = |name: &str| args.value(name).and_then(Value::as_str);
    let text = match given("code") {
        Some(code) => {
            let mut shown = format!("Code:\n{code}");
            for (name, label) in [("package", "Package"), ("image", "Image")] {
                if let Some(value) = given(name) {
                    shown.push_str(&format!("\n{label}: {value}"));
                }
            }
            shown
        }
        None => format!("Arguments: {}", serde_json::to_string_pretty(args.values()).unwrap_or_default()),
    };
    Preview { text, fingerprint: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_tells_bytes_apart_and_a_changed_file_is_refused() {
        assert_eq!(Fingerprint::of(b"(defun f () 1)"), Fingerprint::of(b"(defun f () 1)"));
        assert_ne!(Fingerprint::of(b"(defun f () 1)"), Fingerprint::of(b"(defun f () 2)"));
        let approved = Some(Fingerprint::of(b"old"));
        assert!(Fingerprint::check(approved, "load-file", "a.lisp", b"old").is_ok());
        assert!(Fingerprint::check(None, "load-file", "a.lisp", b"anything").is_ok());
        let refused = Fingerprint::check(approved, "load-file", "a.lisp", b"new").unwrap_err().0;
        assert!(refused.starts_with("load-file was not run: a.lisp changed after the user approved"), "{refused}");
    }
}
