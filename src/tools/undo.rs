//! `undo`: the image's journal of the definitions agents' calls replaced (`lisp/undo.lisp`), and
//! putting replaced functions and macros back.
//!
//! See docs/design.md, "The toolbox".

use serde::Deserialize;
use serde_json::{json, Value};

use super::find_definition::CurrentTexts;
use super::lisp_reply::{decode, Location};
use super::xref::{bare_name, query_of_hit};
use super::arguments::arguments;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use crate::image::Request;
use crate::source::AllowedRoots;
use crate::swank::Form;

fn numbered_from_one(_: &serde_json::Value) -> String {
    "Journal entries are numbered from 1; call undo without arguments to list them.".to_string()
}

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "undo",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Undo what agents' calls defined or replaced: no arguments lists the journal; entries or since \
            restores.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        entries: Option<Vec<u64>> => at_least(1).explained(numbered_from_one),
        since: Option<u64> => at_least(1).explained(numbered_from_one),
        force: bool,
        before: Option<u64> => at_least(1).explained(numbered_from_one),
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { entries, since, force, before } = args.typed()?;
    // An empty list restores nothing: it counts as absent, the listing.
    let entries = entries.filter(|entries| !entries.is_empty());
    if entries.is_some() && since.is_some() {
        return Err(ToolError::new("Give either `entries` or `since`, not both."));
    }
    if before.is_some() && (entries.is_some() || since.is_some()) {
        return Err(ToolError::new(
            "`before` pages the listing; restoring with `entries` or `since` lists nothing, so give one or the other.",
        ));
    }
    let request = Request::new(crate::image::Entry::UNDO_JOURNAL)
        .key("entries", entries.map(Form::list_of))
        .key("since", since)
        .key("force", force)
        .key("before", before)
        .key("page-size", PAGE_SIZE);
    let reply = context.call_helper(args, request).await?;
    let mut journal = decode::<Journal>("undo-journal", &reply)?;
    journal = context
        .on_files(move |roots| {
            journal.relocate_changed(roots);
            Ok(journal)
        })
        .await?;
    Ok(ToolOutput::success(journal.render()).with_structured(journal.structured()))
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Journal {
    /// Whether this reply lists the journal (no restoration was asked for).
    listed: bool,
    /// One page of the journal, oldest first; empty when restoring.
    entries: Vec<Entry>,
    restored: Vec<Restored>,
    skipped: Vec<Skipped>,
    /// How many entries the image keeps.
    limit: u64,
    /// Entries older than the page.
    older: u64,
    /// Entries newer than the page.
    newer: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Entry {
    number: u64,
    time: String,
    /// "function", "setf function", "macro", "method", "class" or "variable".
    kind: String,
    name: String,
    /// A method's qualifiers and specializers; whether a class was new or redefined.
    detail: Option<String>,
    /// The tool whose call made the change, and the file it was loading when not the agent's
    /// own text: `run-tests, loading list.fasl` is ASDF's reload, not an edit.
    cause: Option<String>,
    restorable: bool,
    restored: bool,
    /// Where the replaced definition was; `None` when there was none.
    previous: Option<Location>,
    /// For an entry undo cannot restore: what a person can do instead.
    note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Restored {
    number: u64,
    name: String,
    kind: String,
    detail: Option<String>,
    /// Where the name's definition is now; `None` when it is undefined again.
    now: Option<Location>,
    /// The file the agent's definition was compiled from, which undo does not change.
    agent_file: Option<Location>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Skipped {
    number: u64,
    name: String,
    kind: String,
    reason: String,
    /// Whether the entry was refused because its definition changed since (so `force` restores it).
    changed: bool,
}

/// Entries listed per page: a page stays a few kilobytes.
const PAGE_SIZE: u64 = 20;

/// Restored or skipped entries shown one per line; the rest are counted by number.
const SHOWN_LINES: usize = 25;

/// Files named in the note on the files the agent's restored versions came from.
const SHOWN_FILES: usize = 10;

fn what(kind: &str, name: &str, detail: &Option<String>) -> String {
    match detail {
        Some(detail) => format!("{kind} {name} {detail}"),
        None => format!("{kind} {name}"),
    }
}

/// What a replaced definition's location says: a file position, or why there is no file.
fn replaced_text(location: &Location) -> String {
    match &location.file {
        Some(_) => format!("replaced the definition from {location}"),
        None => format!("replaced a definition with no source file ({location})"),
    }
}

/// Where a definition was made: `defined at file:line`, or the origin of one without a file,
/// which says it already (`defined at the REPL, no source file`).
fn made(location: &Location) -> String {
    match &location.file {
        Some(_) => format!("defined at {location}"),
        None => location.to_string(),
    }
}

impl Journal {
    /// Finds each location in a file that changed since it was compiled again in the file's
    /// current text, as find-definition does: SBCL's offset would be read against text that is
    /// no longer there.
    fn relocate_changed(&mut self, roots: &AllowedRoots) {
        let mut texts = CurrentTexts::new(roots);
        for entry in &mut self.entries {
            if let (Some(location), Some((operators, form_name))) =
                (&mut entry.previous, definition_query(&entry.kind, &entry.name, &entry.detail))
            {
                texts.relocate(location, operators, &form_name);
            }
        }
        for restored in &mut self.restored {
            if let (Some(location), Some((operators, form_name))) =
                (&mut restored.now, definition_query(&restored.kind, &restored.name, &restored.detail))
            {
                texts.relocate(location, operators, &form_name);
            }
        }
    }
}

/// The operators that may have made an entry's definition, and its name as `edit-lisp-form`
/// takes it, as xref's hits are looked up.
fn definition_query(kind: &str, name: &str, detail: &Option<String>) -> Option<(&'static [&'static str], String)> {
    match (kind, detail) {
        ("method", Some(detail)) => {
            let signature = detail.strip_prefix('(').and_then(|rest| rest.strip_suffix(')'))?;
            query_of_hit(&format!("(METHOD {name} {signature})"))
        }
        ("class", _) => Some((&["defclass", "define-condition", "defstruct"], bare_name(name))),
        _ => query_of_hit(name),
    }
}

impl Entry {
    fn render(&self) -> String {
        let what = what(&self.kind, &self.name, &self.detail);
        let before = match (&self.previous, self.kind.as_str()) {
            (Some(location), _) => replaced_text(location),
            (None, "method") => "added: undo removes it".to_string(),
            (None, "variable") => "set again by a DEFPARAMETER: undo puts that value back".to_string(),
            (None, "class") => "new".to_string(),
            (None, _) => "new: was not defined before".to_string(),
        };
        let state = if self.restored {
            " [restored]".to_string()
        } else {
            match &self.note {
                Some(note) if !self.restorable => format!(" [cannot be restored: {note}]"),
                _ => String::new(),
            }
        };
        let cause = self.cause.as_ref().map(|cause| format!(" ({cause})")).unwrap_or_default();
        format!("{:>4}  {}  {what}: {before}{state}{cause}", self.number, self.time)
    }
}

impl Restored {
    fn render(&self) -> String {
        let what = what(&self.kind, &self.name, &self.detail);
        let result = match (&self.now, self.kind.as_str()) {
            (Some(location), "method") => format!("the method it replaced is back, {}", made(location)),
            (None, "method") => "removed (it was added)".to_string(),
            (_, "variable") => "its value is back".to_string(),
            (Some(location), "class") => format!("its previous definition is back, {}", made(location)),
            (Some(location), _) => format!("now {}", made(location)),
            (None, _) => "undefined again (it was new)".to_string(),
        };
        format!("  {} {what}: {result}", self.number)
    }
}

impl Skipped {
    fn render(&self) -> String {
        let force = if self.changed { "; undo with force: true restores it anyway" } else { "" };
        format!("  {} {} {}: {}{force}", self.number, self.kind, self.name, self.reason)
    }
}

/// At most `SHOWN_LINES` lines, then the numbers of the rest.
fn bounded_lines<T>(items: &[T], render: impl Fn(&T) -> String, number: impl Fn(&T) -> u64) -> String {
    let mut lines: Vec<String> = items.iter().take(SHOWN_LINES).map(render).collect();
    if items.len() > SHOWN_LINES {
        let rest: Vec<String> = items[SHOWN_LINES..].iter().map(|item| number(item).to_string()).collect();
        lines.push(format!("  and {} more: {}", rest.len(), rest.join(", ")));
    }
    lines.join("\n")
}

impl Journal {
    fn render(&self) -> String {
        let mut sections = Vec::new();
        if !self.restored.is_empty() {
            sections.push(format!(
                "Restored {}:\n{}",
                count(self.restored.len()),
                bounded_lines(&self.restored, Restored::render, |r| r.number)
            ));
            if let Some(note) = self.agent_files_note() {
                sections.push(note);
            }
        }
        if !self.skipped.is_empty() {
            sections.push(format!(
                "Not restored ({}):\n{}",
                count(self.skipped.len()),
                bounded_lines(&self.skipped, Skipped::render, |s| s.number)
            ));
        }
        if !self.listed {
            if sections.is_empty() {
                sections.push("Nothing to restore: no entry from that number on.".to_string());
            }
        } else if self.entries.is_empty() {
            sections.push(
                "The journal is empty: no agent's call has defined a function, macro, method or class in this image \
                 since it started."
                    .to_string(),
            );
        } else {
            let lines: Vec<String> = self.entries.iter().map(Entry::render).collect();
            let mut around = Vec::new();
            if self.older > 0 {
                around.push(format!(
                    "{} older: list them with before={}",
                    count(self.older as usize),
                    self.entries[0].number
                ));
            }
            if self.newer > 0 {
                around.push(format!("{} newer: list them without before", count(self.newer as usize)));
            }
            let around = if around.is_empty() { String::new() } else { format!("; {}", around.join("; ")) };
            sections.push(format!(
                "Journal ({}, oldest first{around}; the image keeps the last {}). Restore with entries=[N, ...] or \
                 since=N:\n{}",
                count(self.entries.len()),
                self.limit,
                lines.join("\n")
            ));
        }
        sections.join("\n\n")
    }

    /// Undo changes the image only: which files hold the versions it took out of the image.
    fn agent_files_note(&self) -> Option<String> {
        let mut files: Vec<(&str, Vec<String>)> = Vec::new();
        for restored in &self.restored {
            let Some(file) = restored.agent_file.as_ref().and_then(|location| location.file.as_deref()) else {
                continue;
            };
            match files.iter_mut().find(|(known, _)| *known == file) {
                Some((_, numbers)) => numbers.push(restored.number.to_string()),
                None => files.push((file, vec![restored.number.to_string()])),
            }
        }
        if files.is_empty() {
            return None;
        }
        let mut named: Vec<String> = files
            .iter()
            .take(SHOWN_FILES)
            .map(|(file, numbers)| {
                format!("{file} ({} {})", if numbers.len() == 1 { "entry" } else { "entries" }, numbers.join(", "))
            })
            .collect();
        if files.len() > SHOWN_FILES {
            named.push(format!("{} more files", files.len() - SHOWN_FILES));
        }
        Some(format!(
            "Undo changed the image only: the agent's versions came from files it leaves as they are: {}.",
            named.join("; ")
        ))
    }

    fn structured(&self) -> Value {
        let location = |l: &Option<Location>| l.as_ref().map(Location::to_json);
        json!({
            "older": self.older,
            "newer": self.newer,
            "entries": self.entries.iter().map(|e| json!({
                "number": e.number, "time": e.time, "kind": e.kind, "name": e.name, "detail": e.detail, "cause": e.cause,
                "restorable": e.restorable, "restored": e.restored, "previous": location(&e.previous), "note": e.note,
            })).collect::<Vec<_>>(),
            "restored_count": self.restored.len(),
            "skipped_count": self.skipped.len(),
            "restored": self.restored.iter().take(SHOWN_LINES).map(|r| json!({
                "number": r.number, "name": r.name, "kind": r.kind, "detail": r.detail, "now": location(&r.now),
                "agent_file": location(&r.agent_file),
            })).collect::<Vec<_>>(),
            "skipped": self.skipped.iter().take(SHOWN_LINES).map(|s| json!({
                "number": s.number, "name": s.name, "kind": s.kind, "reason": s.reason, "changed": s.changed,
            })).collect::<Vec<_>>(),
        })
    }
}

fn count(n: usize) -> String {
    super::lisp_reply::plural(n as u64, "entry", "entries")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    const LISTING: &str = "(:listed t :entries ((:number 1 :time \"2026-11-23 12:00:00 UTC\" :kind \"function\" :name \"CL-USER::F\" \
         :detail nil :cause \"edit-lisp-form\" :restorable t :restored t :previous (:file \"/src/f.lisp\" :line 3 :column 1 :note nil :made-by nil :origin nil) :note nil) \
        (:number 2 :time \"2026-11-23 12:00:01 UTC\" :kind \"function\" :name \"CL-USER::G\" :detail nil \
         :cause \"run-tests, loading g.fasl\" :restorable t :restored nil \
         :previous (:file nil :line nil :column nil :note nil :made-by nil :origin \"defined at the REPL, no source file\") :note nil) \
        (:number 3 :time \"2026-11-23 12:00:02 UTC\" :kind \"class\" :name \"CL-USER::SHAPE\" :detail \"(new)\" :cause nil \
         :restorable nil :restored nil :previous nil :note \"the class was new\")) \
        :restored nil :skipped nil :limit 500 :older 7 :newer 2)";

    const RESTORATION: &str = "(:listed nil :entries nil \
        :restored ((:number 1 :name \"CL-USER::F\" :kind \"function\" :detail nil \
          :now (:file \"/src/f.lisp\" :line 3 :column 1 :note nil :made-by nil :origin nil) \
          :agent-file (:file \"/src/g.lisp\" :line 9 :column 1 :note nil :made-by nil :origin nil))) \
        :skipped ((:number 2 :name \"CL-USER::G\" :kind \"function\" :reason \"changed since: redefined\" :changed t)) \
        :limit 500 :older 0 :newer 0)";

    #[test]
    fn a_listing_is_a_page_that_says_where_the_others_are() {
        let journal: Journal = decode("undo-journal", &read(LISTING).unwrap()).unwrap();
        assert_eq!(
            journal.render(),
            "Journal (3 entries, oldest first; 7 entries older: list them with before=1; 2 entries newer: list them \
             without before; the image keeps the last 500). Restore with entries=[N, ...] or since=N:\n\
             \x20  1  2026-11-23 12:00:00 UTC  function CL-USER::F: replaced the definition from /src/f.lisp:3:1 [restored] \
             (edit-lisp-form)\n\
             \x20  2  2026-11-23 12:00:01 UTC  function CL-USER::G: replaced a definition with no source file (defined at \
             the REPL, no source file) (run-tests, loading g.fasl)\n\
             \x20  3  2026-11-23 12:00:02 UTC  class CL-USER::SHAPE (new): new [cannot be restored: the class was new]"
        );
    }

    #[test]
    fn a_restoration_answers_with_what_was_restored_only() {
        let journal: Journal = decode("undo-journal", &read(RESTORATION).unwrap()).unwrap();
        assert_eq!(
            journal.render(),
            "Restored 1 entry:\n  1 function CL-USER::F: now defined at /src/f.lisp:3:1\n\n\
             Undo changed the image only: the agent's versions came from files it leaves as they are: /src/g.lisp (entry \
             1).\n\n\
             Not restored (1 entry):\n  2 function CL-USER::G: changed since: redefined; undo with force: true restores \
             it anyway"
        );
        assert_eq!(journal.structured()["restored"][0]["now"]["line"], 3);
    }

    #[test]
    fn long_restorations_are_cut_to_numbers() {
        let restored: Vec<Restored> = (1..=100)
            .map(|number| Restored {
                number,
                name: format!("CL-USER::F{number}"),
                kind: "function".into(),
                detail: None,
                now: None,
                agent_file: None,
            })
            .collect();
        let journal =
            Journal { listed: false, entries: vec![], restored, skipped: vec![], limit: 500, older: 0, newer: 0 };
        let text = journal.render();
        assert_eq!(text.lines().count(), 1 + SHOWN_LINES + 1, "{text}");
        let rest: Vec<String> = (26..=100).map(|n| n.to_string()).collect();
        assert!(text.ends_with(&format!("and 75 more: {}", rest.join(", "))), "{text}");
        assert_eq!(journal.structured()["restored"].as_array().unwrap().len(), SHOWN_LINES);
        assert_eq!(journal.structured()["restored_count"], 100);
    }
}
