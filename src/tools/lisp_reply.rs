//! The shapes the helper returns, shared by the image tools: captured text with the count of
//! characters cut in the image, error reports, failures, and source locations; and the one way
//! every tool decodes a reply.
//!
//! See docs/design.md, "The toolbox".

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::ToolError;
use crate::swank::{from_sexp, DecodeError, Sexp};

/// Decodes the helper's reply to `function` into the type its tool reads.
pub fn decode<T: DeserializeOwned>(function: &str, reply: &Sexp) -> Result<T, ToolError> {
    from_sexp(reply).map_err(|e| unexpected_reply(&format!("reply to {function}"), e))
}

/// The error for a reply that does not have the shape this server's helper gives it, which
/// happens when the image holds another revision of the helper: the client loads its own only
/// when it connects.
fn unexpected_reply(what: &str, error: DecodeError) -> ToolError {
    ToolError::new(format!(
        "The swank-mcp helper's {what} is not what this server expects ({error}). The image may hold the helper \
         of another swank-mcp version, loaded by another client since this server connected: restart this server \
         to load its own. If that does not help, this is a bug in swank-mcp; please report this message."
    ))
}

/// Text captured in the image, cut there to the output limit: `(text dropped)` in a reply, or
/// `(text dropped more offset handle tail lost)` when something was cut: `more` the handle of the
/// text the image kept (or nil when the call keeps no handles), `offset` where the characters
/// not shown begin in it, `handle` a printed value's own, `tail` the end shown of a log, and `lost`
/// the characters not shown that the image did not keep either.
#[derive(Debug, Clone, PartialEq)]
pub struct Captured {
    /// The start shown.
    pub text: String,
    /// Characters written but not shown.
    pub dropped: u64,
    /// The handle of the text kept, and the offset in it where the characters not shown begin.
    pub more: Option<(String, u64)>,
    /// For a printed value: the value's own handle (`@3`), which `inspect` takes.
    pub handle: Option<String>,
    /// For a log: its end, shown after the note (a run's verdict is there).
    pub tail: String,
    /// Of the characters not shown, those the image did not keep: `more` holds the others.
    pub lost: u64,
}

impl From<(String, u64)> for Captured {
    fn from((text, dropped): (String, u64)) -> Self {
        Captured { text, dropped, more: None, handle: None, tail: String::new(), lost: 0 }
    }
}

impl<'de> Deserialize<'de> for Captured {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Parts;
        impl<'de> serde::de::Visitor<'de> for Parts {
            type Value = Captured;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("(text dropped [more offset [handle [tail [lost]]]])")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Captured, A::Error> {
                use serde::de::Error;
                let text: String = seq.next_element()?.ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let dropped: u64 = seq.next_element()?.ok_or_else(|| A::Error::invalid_length(1, &self))?;
                let more: Option<String> = seq.next_element()?.flatten();
                let offset: u64 = seq.next_element()?.unwrap_or(0);
                let handle: Option<String> = seq.next_element()?.flatten();
                let tail: String = seq.next_element::<Option<String>>()?.flatten().unwrap_or_default();
                let lost: u64 = seq.next_element()?.unwrap_or(0);
                Ok(Captured { text, dropped, more: more.map(|more| (more, offset)), handle, tail, lost })
            }
        }
        deserializer.deserialize_seq(Parts)
    }
}

impl Captured {
    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.dropped == 0
    }

    /// The section titled `title` (`[stdout]`, say) that shows this text, with the note of how
    /// much was cut and, for a log, its end after the note; none when there is nothing to show.
    /// A cut text is shown as it is, so that the note's offset counts the characters shown.
    pub fn section(&self, title: &str, limit: usize) -> Option<String> {
        match self.cut_note(limit) {
            None => {
                let body = section_body(&self.text);
                (!body.is_empty()).then(|| format!("{title}\n{body}"))
            }
            Some(note) => {
                let mut section = format!("{title}\n{}", self.text);
                if !self.text.ends_with('\n') {
                    section.push('\n');
                }
                section.push_str(&note);
                if !self.tail.trim_end().is_empty() {
                    section.push('\n');
                    section.push_str(self.tail.trim_end());
                }
                Some(section)
            }
        }
    }

    /// The text shown, for structured content: the start and, for a cut log, a marker and its
    /// end (the text reply's note says where the rest is).
    pub fn shown(&self) -> std::borrow::Cow<'_, str> {
        if self.tail.is_empty() {
            return self.text.as_str().into();
        }
        let separator = if self.text.ends_with('\n') { "" } else { "\n" };
        format!(
            "{}{separator}[... {} more characters not shown]\n{}",
            self.text,
            group_thousands(self.dropped),
            self.tail
        )
        .into()
    }

    /// This text as a printed value: `=> text`, its handle, and the note of how much was cut.
    pub fn value_line(&self, limit: usize) -> String {
        match (self.cut_note(limit), &self.handle) {
            // A cut string's rest is read through its own handle, which the note names.
            (Some(note), Some(handle)) if self.more.as_ref().map(|(more, _)| more) != Some(handle) => {
                format!("=> {}\n{}; the value is {handle}]", self.text, note.trim_end_matches(']'))
            }
            (Some(note), _) => format!("=> {}\n{note}", self.text),
            (None, Some(handle)) => format!("=> {} {handle}", self.text),
            (None, None) => format!("=> {}", self.text),
        }
    }

    /// The note that says how much the image cut, if it cut anything, where to read what it
    /// kept, and how much it did not keep.
    pub fn cut_note(&self, limit: usize) -> Option<String> {
        (self.dropped > 0).then(|| {
            let then = if self.tail.is_empty() {
                String::new()
            } else {
                format!(", then the last {}", group_thousands(self.tail.chars().count() as u64))
            };
            let head = format!(
                "[... {} more characters not shown{then}: the limit is {} per section (--max-output)",
                group_thousands(self.dropped),
                group_thousands(limit as u64)
            );
            let kept = self.dropped.saturating_sub(self.lost);
            match (&self.more, self.lost) {
                (Some((handle, offset)), 0) => format!("{head}; inspect {handle} with offset {offset} for the rest]"),
                (Some((handle, offset)), lost) if self.tail.is_empty() => format!(
                    "{head}; inspect {handle} with offset {offset} for the next {}. The printed text stopped being kept \
                     at {} characters: the last {} were not kept]",
                    group_thousands(kept),
                    group_thousands(offset + kept),
                    group_thousands(lost)
                ),
                (Some((handle, offset)), lost) => format!(
                    "{head}. The image kept {} of them and dropped the {} written in their middle (it keeps the start and \
                     the end of a long output); inspect {handle} with offset {offset} for the ones kept]",
                    group_thousands(kept),
                    group_thousands(lost)
                ),
                (None, _) => format!("{head}]"),
            }
        })
    }
}

/// `n` as replies write a count: with its thousands grouped (19,934,464).
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

/// What stopped the code an [`ErrorReport`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    Error,
    /// BREAK or INVOKE-DEBUGGER.
    Debugger,
    Read,
    Timeout,
    Cancelled,
    /// The debugger tool's `abort`.
    Aborted,
}

/// An error the helper caught: a condition, a read failure, a timeout or a cancellation.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ErrorReport {
    pub kind: ErrorKind,
    /// The type name shown after `[ERROR]`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// The condition's exact class, package-qualified, when there is a condition.
    pub class: Option<String>,
    pub message: String,
    pub backtrace: Vec<String>,
    /// The restarts the condition offered, innermost first.
    pub restarts: Vec<Restart>,
}

/// A restart as SLDB lists it: `(name report)`; the name is empty for an anonymous restart.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(from = "(String, String)")]
pub struct Restart {
    pub name: String,
    #[serde(rename = "description")]
    pub report: String,
}

impl From<(String, String)> for Restart {
    fn from((name, report): (String, String)) -> Self {
        Restart { name, report }
    }
}

impl fmt::Display for Restart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_empty() {
            write!(f, "{}", self.report)
        } else {
            write!(f, "[{}] {}", self.name, self.report)
        }
    }
}

/// The `[Restarts]` section: one numbered line per restart, as the debugger tool numbers them.
pub fn restarts_section(restarts: &[Restart]) -> String {
    let mut text = String::from("[Restarts]");
    for (i, restart) in restarts.iter().enumerate() {
        text.push_str(&format!("\n{i}: {restart}"));
    }
    text
}

impl ErrorReport {
    /// The contract's error block: `[ERROR] TYPE`, the message, a numbered `[Backtrace]` when
    /// there are frames to show, and the `[Restarts]` the condition offered.
    pub fn render(&self) -> String {
        let mut text = self.render_after_return();
        if !self.restarts.is_empty() {
            text.push_str("\n\n");
            text.push_str(&restarts_section(&self.restarts));
        }
        text
    }

    /// The block without `[Restarts]`, for a call that returned since: its restarts are gone,
    /// and a list of them would be read for nothing.
    pub fn render_after_return(&self) -> String {
        let mut text = format!("[ERROR] {}\n{}", self.type_name, self.message.trim_end());
        if self.kind == ErrorKind::Debugger {
            text.push_str("\n(The code entered the debugger; it was unwound.)");
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
            "condition_class": self.class,
            "message": self.message,
            "backtrace": self.backtrace,
            "restarts": self.restarts,
        })
    }
}

/// The output to return instead of a reply that reports a failure: `(:failure "message")`, a
/// problem the user can act on (no such package, symbol or class), shown as its message alone;
/// or `(:error report)`, a Lisp error, timeout or cancellation, shown as an `[ERROR]` block.
/// Any other reply is the tool's own, and `(:error nil ...)` is no failure.
pub fn check_failure(reply: &Sexp) -> Result<(), ToolError> {
    if reply.plist_get("failure").is_some() {
        let failure: Failure = from_sexp(reply).map_err(|e| unexpected_reply("failure report", e))?;
        return Err(ToolError::new(failure.failure));
    }
    if reply.plist_get("error").is_some_and(Sexp::is_true) {
        let failed: Failed = from_sexp(reply).map_err(|e| unexpected_reply("error report", e))?;
        return Err(ToolError::new(failed.error.render()));
    }
    Ok(())
}

#[derive(Deserialize)]
struct Failure {
    failure: String,
}

#[derive(Deserialize)]
struct Failed {
    error: ErrorReport,
}

/// `"1 form"`, `"2 forms"`.
pub fn plural(n: u64, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// Where a definition is, as the helper's `source-location` gives it: a file with line and
/// column when they could be found, or no file and the reason (typed at the REPL, built into
/// SBCL).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Location {
    pub file: Option<String>,
    pub line: Option<u64>,
    pub column: Option<u64>,
    /// Why the line may be off or missing ("file not found", "the file changed ...").
    pub note: Option<String>,
    /// The form that made the definition when it is not one of its own kind: a slot accessor's
    /// DEFCLASS.
    pub made_by: Option<MadeBy>,
    /// Why there is no file.
    pub origin: Option<String>,
}

/// The DEFCLASS that made a slot accessor, where SBCL records the accessor's source.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MadeBy {
    /// The class's name as `edit-lisp-form` takes it: the form to find in the file's text.
    pub class: String,
    /// What a reply says of it ("a slot accessor made by the DEFCLASS of ITEM").
    pub text: String,
}

impl Location {
    pub fn to_json(&self) -> Value {
        json!({"file": self.file, "line": self.line, "column": self.column, "note": self.remark().or(self.origin.clone())})
    }

    /// What the reply says beside a file's place: what made the definition, then the file's
    /// state ("the file changed since ...").
    pub fn remark(&self) -> Option<String> {
        match (&self.made_by, &self.note) {
            (Some(made_by), Some(note)) => Some(format!("{}; {note}", made_by.text)),
            (Some(made_by), None) => Some(made_by.text.clone()),
            (None, note) => note.clone(),
        }
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
        match (&self.file, self.remark()) {
            (Some(_), Some(remark)) => write!(f, " ({remark})"),
            _ => Ok(()),
        }
    }
}

/// Labelled locations, aligned in two columns: `label  file:line:column`.
pub fn render_locations(entries: &[(&str, &Location)]) -> String {
    let width = entries.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    let lines: Vec<String> = entries.iter().map(|(label, location)| format!("  {label:<width$}  {location}")).collect();
    lines.join("\n")
}

/// Labelled locations as structured content: each location's fields plus `label_key`.
pub fn labelled_locations_json(entries: &[(&str, &Location)], label_key: &str) -> Vec<Value> {
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

/// A compiler condition the helper reports (compile-form, load-form, load-file): its severity,
/// message, the form it is about and where, when the compiler knows.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct CompilerCondition {
    pub severity: String,
    pub message: String,
    pub form: Option<String>,
    pub line: Option<u64>,
    pub column: Option<u64>,
}

impl CompilerCondition {
    /// `SEVERITY: message` (its further lines indented), `in form:` when known, and `at:` with
    /// `at`, where the tool says it is.
    pub fn render(&self, at: Option<String>) -> String {
        let mut lines = self.message.lines();
        let mut text = format!("{}: {}", self.severity, lines.next().unwrap_or_default());
        for line in lines {
            text.push_str("\n  ");
            text.push_str(line);
        }
        if let Some(form) = &self.form {
            text.push_str(&format!("\n  in form: {form}"));
        }
        if let Some(at) = at {
            text.push_str(&format!("\n  at: {at}"));
        }
        text
    }
}

/// The files of loaded systems that a load (load-system, or the load a test-op makes first)
/// loaded again because they changed since they were loaded, or depend on one that did: their
/// definitions replaced the image's, among them any changed only in the image.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Reloaded {
    pub files: Vec<ReloadedFile>,
    /// The undo journal's entries the call made, first and last: what the files replaced.
    pub journal: Option<(u64, u64)>,
    /// The variables a DEFPARAMETER of the files set again, each `NAME (was VALUE)`: a value the
    /// person set at their REPL is their data, which undo puts back.
    pub reset: Vec<String>,
}

/// A file a load loaded again: (system, file relative to the system's directory, whether it was
/// compiled again, whether its source changed since it was loaded).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReloadedFile {
    pub system: String,
    pub file: String,
    pub recompiled: bool,
    pub changed: bool,
}

impl<'de> Deserialize<'de> for ReloadedFile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (system, file, recompiled, changed) = <(String, String, bool, bool)>::deserialize(deserializer)?;
        Ok(ReloadedFile { system, file, recompiled, changed })
    }
}

/// Changed files named in a reply; the others are counted.
const MAX_RELOADED_SHOWN: usize = 10;

impl Reloaded {
    /// One sentence: the files ASDF loaded again because they changed (named, by system), how
    /// many more of each system it rebuilt because they depend on those (a dependency's change
    /// rebuilds a whole framework, which is not the agent's change), and where undo has what they
    /// replaced.
    pub fn render(&self) -> String {
        let (changed, others): (Vec<&ReloadedFile>, Vec<&ReloadedFile>) = self.files.iter().partition(|f| f.changed);
        // Without a changed file (a forced load), every file reloaded is named.
        let (named, others) = if changed.is_empty() { (others, Vec::new()) } else { (changed, others) };
        let mut systems: Vec<(&str, Vec<&str>)> = Vec::new();
        for file in named.iter().take(MAX_RELOADED_SHOWN) {
            match systems.iter_mut().find(|(system, _)| *system == file.system) {
                Some((_, files)) => files.push(&file.file),
                None => systems.push((&file.system, vec![&file.file])),
            }
        }
        let mut list = match systems.as_slice() {
            [(system, files)] => format!("of {system} ({}", files.join(", ")),
            _ => format!(
                "({}",
                systems
                    .iter()
                    .map(|(system, files)| format!("{system}: {}", files.join(", ")))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        };
        if named.len() > MAX_RELOADED_SHOWN {
            list.push_str(&format!(", {} more", named.len() - MAX_RELOADED_SHOWN));
        }
        let changed = if named.iter().any(|f| f.changed) { "changed " } else { "" };
        let files = if named.len() == 1 { "file" } else { "files" };
        let mut text = format!("ASDF reloaded {} {changed}{files} {list})", named.len());
        if !others.is_empty() {
            let mut counts: Vec<(&str, u64)> = Vec::new();
            for file in &others {
                match counts.iter_mut().find(|(system, _)| *system == file.system) {
                    Some((_, count)) => *count += 1,
                    None => counts.push((&file.system, 1)),
                }
            }
            let counts: Vec<String> = counts
                .iter()
                .enumerate()
                .map(|(i, (system, count))| match i {
                    0 => format!("{} of {system}", plural(*count, "file", "files")),
                    _ => format!("{count} of {system}"),
                })
                .collect();
            let counts = match counts.split_last() {
                Some((last, [])) => last.clone(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => String::new(),
            };
            let verb = if others.iter().all(|f| f.recompiled) { "rebuilt" } else { "reloaded" };
            let depend = if others.len() == 1 { "it depends" } else { "they depend" };
            text.push_str(&format!("; {verb} {counts} because a file {depend} on changed"));
        }
        match self.journal {
            Some((first, last)) if first == last => {
                text.push_str(&format!("; undo entry {first} has what it replaced"))
            }
            Some((first, last)) => text.push_str(&format!("; undo entries {first} to {last} have what they replaced")),
            None => {}
        }
        if !self.reset.is_empty() {
            let variables = if self.reset.len() == 1 { "variable" } else { "variables" };
            text.push_str(&format!(
                "; its DEFPARAMETERs set {} {variables} again: {}",
                self.reset.len(),
                self.reset.join(", ")
            ));
        }
        text.push('.');
        text
    }

    pub fn to_json(&self) -> Value {
        json!({
            "files": self.files,
            "journal_entries": self.journal.map(|(first, last)| [first, last]),
            "variables_reset": self.reset,
        })
    }
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
        let report: ErrorReport = from_sexp(
            &read("(:kind :error :type \"DIVISION-BY-ZERO\" :class \"COMMON-LISP:DIVISION-BY-ZERO\" :message \"arithmetic error DIVISION-BY-ZERO signalled\nOperation was (/ 1 0).\" :backtrace (\"(/ 1 0)\") :restarts ((\"ABORT\" \"Give up\")))").unwrap(),
        )
        .unwrap();
        assert_eq!(
            report.render(),
            "[ERROR] DIVISION-BY-ZERO\narithmetic error DIVISION-BY-ZERO signalled\nOperation was (/ 1 0).\n\n[Backtrace]\n0: (/ 1 0)\n\n[Restarts]\n0: [ABORT] Give up"
        );
        assert_eq!(report.to_json()["kind"], "error");
        assert_eq!(from_sexp::<Option<ErrorReport>>(&Sexp::Nil), Ok(None));
    }

    #[test]
    fn failures_become_error_outputs() {
        let failure =
            check_failure(&read("(:failure \"Class FOO not found in package CL-USER\")").unwrap()).unwrap_err();
        assert_eq!(failure.0, "Class FOO not found in package CL-USER");
        let error = check_failure(
            &read(
                "(:error (:kind :error :type \"TYPE-ERROR\" :class nil :message \"bad\" :backtrace nil :restarts nil))",
            )
            .unwrap(),
        )
        .unwrap_err();
        assert_eq!(error.0, "[ERROR] TYPE-ERROR\nbad");
        assert!(check_failure(&read("(:error nil :value 1)").unwrap()).is_ok());
    }

    #[test]
    fn a_reply_of_another_shape_is_an_error_that_names_the_key() {
        let error = check_failure(
            &read("(:error (:kind :error :type \"TYPE-ERROR\" :class nil :backtrace nil :restarts nil))").unwrap(),
        )
        .unwrap_err();
        assert!(
            error.0.contains("error report is not what this server expects (:error: the reply has no :message)"),
            "{error}"
        );
        let error = check_failure(&read("(:failure nil)").unwrap()).unwrap_err();
        assert!(error.0.contains("(:failure: expected a string, found nil)"), "{error}");
        let error = decode::<Location>(
            "find-definition",
            &read("(:file nil :line nil :column nil :note nil :made-by nil)").unwrap(),
        )
        .unwrap_err();
        assert!(error.0.starts_with("The swank-mcp helper's reply to find-definition is not what this server expects (the reply has no :origin)."), "{error}");
        let kind = from_sexp::<ErrorReport>(
            &read("(:kind :warning :type \"X\" :class nil :message \"m\" :backtrace nil :restarts nil)").unwrap(),
        )
        .unwrap_err();
        assert!(kind.to_string().starts_with(":kind: unknown variant `warning`"), "{kind}");
    }

    #[test]
    fn locations_read_like_compiler_messages() {
        let location = |text: &str| from_sexp::<Location>(&read(text).unwrap()).unwrap().to_string();
        assert_eq!(
            location("(:file \"/src/a.lisp\" :line 7 :column 1 :note nil :made-by nil :origin nil)"),
            "/src/a.lisp:7:1"
        );
        assert_eq!(
            location("(:file \"/src/a.lisp\" :line nil :column nil :note \"file not found\" :made-by nil :origin nil)"),
            "/src/a.lisp (file not found)"
        );
        assert_eq!(
            location("(:file nil :line nil :column nil :note nil :made-by nil :origin \"defined at the REPL, no source file\")"),
            "defined at the REPL, no source file"
        );
        let accessor = "(:file \"/src/a.lisp\" :line 5 :column 1 :note NOTE \
                        :made-by (:class \"item\" :text \"a slot accessor made by the DEFCLASS of ITEM\") :origin nil)";
        assert_eq!(
            location(&accessor.replace("NOTE", "nil")),
            "/src/a.lisp:5:1 (a slot accessor made by the DEFCLASS of ITEM)"
        );
        assert_eq!(
            location(&accessor.replace("NOTE", "\"file not found\"")),
            "/src/a.lisp:5:1 (a slot accessor made by the DEFCLASS of ITEM; file not found)"
        );
    }

    #[test]
    fn reloaded_files_are_named_by_system() {
        let reloaded: Reloaded = from_sexp(
            &read("(:files ((\"app\" \"src/a.lisp\" t t) (\"app\" \"src/c.lisp\" t nil) (\"app\" \"src/b.lisp\" t t)) :journal (4 9) :reset nil)")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            reloaded.render(),
            "ASDF reloaded 2 changed files of app (src/a.lisp, src/b.lisp); rebuilt 1 file of app because a file \
             it depends on changed; undo entries 4 to 9 have what they replaced."
        );
        let forced: Reloaded = from_sexp(
            &read("(:files ((\"app\" \"a.lisp\" t nil) (\"app/tests\" \"tests.lisp\" nil nil)) :journal (7 7) :reset nil)")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            forced.render(),
            "ASDF reloaded 2 files (app: a.lisp; app/tests: tests.lisp); undo entry 7 has what it replaced."
        );
        // A change to a file FiveAM depends on rebuilds FiveAM: its files are counted apart from
        // the agent's.
        let mut files = "(\"app\" \"a.lisp\" t t) (\"app\" \"b.lisp\" t t) (\"app\" \"c.lisp\" t nil)".to_string();
        for i in 0..10 {
            files.push_str(&format!(" (\"fiveam\" \"src/f{i}.lisp\" t nil)"));
        }
        let rebuilt: Reloaded =
            from_sexp(&read(&format!("(:files ({files}) :journal nil :reset nil)")).unwrap()).unwrap();
        assert_eq!(
            rebuilt.render(),
            "ASDF reloaded 2 changed files of app (a.lisp, b.lisp); rebuilt 1 file of app and 10 of fiveam because \
             a file they depend on changed."
        );
    }

    #[test]
    fn sections_drop_layout_whitespace_only() {
        assert_eq!(section_body("\nHELLO "), "HELLO");
        assert_eq!(section_body("  indented\n"), "  indented");
    }
}
