//! `undo`: the image's journal of the definitions agents' calls replaced (`lisp/undo.lisp`), and
//! putting replaced functions and macros back.

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::{decode, Location};
use super::{Annotations, Arguments, Run, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use crate::swank::Form;

/// Larger than any entry number an image reaches; keeps the numbers within Lisp fixnums.
const MAX_ENTRY: u64 = 1 << 40;

fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "undo",
        title: "Undo redefinitions",
        description: "Undo the global function, macro and setf function definitions that agents' tool calls \
            (evaluate-lisp, load-system) made in the image. The image keeps a journal (its last 500 entries, across \
            swank-mcp restarts) of each definition such a call replaced or added, with the previous definition and \
            where its source was. The user's own definitions from Emacs are not journaled. Without arguments: lists \
            the journal's newest 100 entries, numbered, oldest first. With `entries` (numbers) or `since` (a number, meaning that entry \
            and every later one): restores those entries, newest first, so that each function behaves as before and \
            find-definition points where it did; a name that was not defined before is made undefined again. \
            Methods and classes agents defined are listed but cannot be restored automatically; an entry is \
            restored at most once.",
        input_schema: json!({
            "type": "object",
            "properties": {
                "entries": {"type": "array", "items": {"type": "integer", "minimum": 1}, "description": "Numbers of the journal entries to restore."},
                "since": {"type": "integer", "minimum": 1, "description": "Restore this entry and every later one."}
            }
        }),
        output_schema: Some(json!({
            "type": "object",
            "required": ["entries", "restored", "skipped", "older"],
            "properties": {
                "entries": {
                    "type": "array",
                    "description": "The journal, oldest first.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "number": {"type": "integer"},
                            "time": {"type": "string"},
                            "kind": {"type": "string", "enum": ["function", "setf function", "macro", "method", "class"]},
                            "name": {"type": "string"},
                            "detail": {"type": ["string", "null"]},
                            "restorable": {"type": "boolean"},
                            "restored": {"type": "boolean"},
                            "previous": {"type": ["object", "null"], "description": "Where the replaced definition was (file, line, column, note); null when there was none."}
                        }
                    }
                },
                "older": {"type": "integer", "description": "Entries older than those listed (only the newest 100 are listed)."},
                "restored": {"type": "array", "items": {"type": "object", "properties": {"number": {"type": "integer"}, "name": {"type": "string"}, "kind": {"type": "string"}, "now": {"type": ["object", "null"]}}}},
                "skipped": {"type": "array", "items": {"type": "object", "properties": {"number": {"type": "integer"}, "name": {"type": "string"}, "kind": {"type": "string"}, "reason": {"type": "string"}}}}
            }
        })),
        annotations: Annotations { read_only: false, destructive: true, idempotent: false, open_world: true },
    }
}

/// The tool, for the table in `tools/mod.rs`.
pub const TOOL: Tool = Tool { definition, run: Run::Image(|context, args| Box::pin(call(context, args))) };

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let entries = args.optional_u64_list("entries", MAX_ENTRY)?;
    let since = args.optional_u64("since", MAX_ENTRY)?;
    if entries.is_some() && since.is_some() {
        return Err(ToolError::new("Give either `entries` or `since`, not both."));
    }
    if entries.iter().flatten().chain(since.iter()).any(|n| *n == 0) {
        return Err(ToolError::new("Journal entries are numbered from 1; call undo without arguments to list them."));
    }
    let number = |n: u64| Form::Integer(n as i64);
    let request = vec![
        Form::Keyword("entries"),
        entries.map_or(Form::Nil, |numbers| Form::call("cl", "list", numbers.into_iter().map(number))),
        Form::Keyword("since"),
        since.map_or(Form::Nil, number),
    ];
    let reply = context.call_helper(args, "undo-journal", request).await?;
    let journal = decode::<Journal>("undo-journal", &reply)?;
    Ok(ToolOutput::success(journal.render()).with_structured(journal.structured()))
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Journal {
    entries: Vec<Entry>,
    restored: Vec<Restored>,
    skipped: Vec<Skipped>,
    /// How many entries the image keeps.
    limit: u64,
    /// Entries older than those listed, which the image keeps but does not list.
    older: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Entry {
    number: u64,
    time: String,
    /// "function", "setf function", "macro", "method" or "class".
    kind: String,
    name: String,
    /// A method's qualifiers and specializers; whether a class was new or redefined.
    detail: Option<String>,
    restorable: bool,
    restored: bool,
    /// Where the replaced definition was; `None` when there was none (or for methods and classes).
    previous: Option<Location>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Restored {
    number: u64,
    name: String,
    kind: String,
    /// Where the name's definition is now; `None` when it is undefined again.
    now: Option<Location>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Skipped {
    number: u64,
    name: String,
    kind: String,
    reason: String,
}

impl Entry {
    fn render(&self) -> String {
        let what = match &self.detail {
            Some(detail) => format!("{} {} {detail}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        };
        let before = if !self.restorable {
            "cannot be restored automatically".to_string()
        } else {
            match &self.previous {
                Some(location) => format!("replaced the definition at {location}"),
                None => "new: was not defined before".to_string(),
            }
        };
        let restored = if self.restored { " [restored]" } else { "" };
        format!("{:>4}  {}  {what}: {before}{restored}", self.number, self.time)
    }
}

impl Journal {
    fn render(&self) -> String {
        let mut sections = Vec::new();
        if !self.restored.is_empty() {
            let lines: Vec<String> = self
                .restored
                .iter()
                .map(|r| match &r.now {
                    Some(location) => format!("  {} {} {}: now defined at {location}", r.number, r.kind, r.name),
                    None => format!("  {} {} {}: undefined again (it was new)", r.number, r.kind, r.name),
                })
                .collect();
            sections.push(format!("Restored {}:\n{}", count(self.restored.len()), lines.join("\n")));
        }
        if !self.skipped.is_empty() {
            let lines: Vec<String> =
                self.skipped.iter().map(|s| format!("  {} {} {}: {}", s.number, s.kind, s.name, s.reason)).collect();
            sections.push(format!("Not restored:\n{}", lines.join("\n")));
        }
        if self.entries.is_empty() {
            sections.push(
                "The journal is empty: no agent's call has replaced a function, macro or setf function in this image \
                 since it started."
                    .to_string(),
            );
        } else {
            let lines: Vec<String> = self.entries.iter().map(Entry::render).collect();
            let older = match self.older {
                0 => String::new(),
                n => format!("; {} older not listed", count(n as usize)),
            };
            sections.push(format!(
                "Journal ({}, oldest first{older}; the image keeps the last {}). Restore with entries=[N, ...] or \
                 since=N:\n{}",
                count(self.entries.len()),
                self.limit,
                lines.join("\n")
            ));
        }
        sections.join("\n\n")
    }

    fn structured(&self) -> Value {
        let location = |l: &Option<Location>| l.as_ref().map(Location::to_json);
        json!({
            "older": self.older,
            "entries": self.entries.iter().map(|e| json!({
                "number": e.number, "time": e.time, "kind": e.kind, "name": e.name, "detail": e.detail,
                "restorable": e.restorable, "restored": e.restored, "previous": location(&e.previous),
            })).collect::<Vec<_>>(),
            "restored": self.restored.iter().map(|r| json!({
                "number": r.number, "name": r.name, "kind": r.kind, "now": location(&r.now),
            })).collect::<Vec<_>>(),
            "skipped": self.skipped.iter().map(|s| json!({
                "number": s.number, "name": s.name, "kind": s.kind, "reason": s.reason,
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

    const JOURNAL: &str = "(:entries ((:number 1 :time \"2026-11-23 12:00:00 UTC\" :kind \"function\" :name \"CL-USER::F\" \
         :detail nil :restorable t :restored t :previous (:file \"/src/f.lisp\" :line 3 :column 1 :note nil :origin nil)) \
        (:number 2 :time \"2026-11-23 12:00:01 UTC\" :kind \"method\" :name \"CL-USER::AREA\" :detail \"((CIRCLE))\" \
         :restorable nil :restored nil :previous nil)) \
        :restored ((:number 1 :name \"CL-USER::F\" :kind \"function\" :now (:file \"/src/f.lisp\" :line 3 :column 1 :note nil :origin nil))) \
        :skipped ((:number 2 :name \"CL-USER::AREA\" :kind \"method\" :reason \"methods cannot be restored automatically\")) \
        :limit 500 :older 0)";

    #[test]
    fn journal_renders_restorations_then_entries() {
        let journal: Journal = decode("undo-journal", &read(JOURNAL).unwrap()).unwrap();
        assert_eq!(
            journal.render(),
            "Restored 1 entry:\n  1 function CL-USER::F: now defined at /src/f.lisp:3:1\n\n\
             Not restored:\n  2 method CL-USER::AREA: methods cannot be restored automatically\n\n\
             Journal (2 entries, oldest first; the image keeps the last 500). Restore with entries=[N, ...] or since=N:\n\
             \x20  1  2026-11-23 12:00:00 UTC  function CL-USER::F: replaced the definition at /src/f.lisp:3:1 [restored]\n\
             \x20  2  2026-11-23 12:00:01 UTC  method CL-USER::AREA ((CIRCLE)): cannot be restored automatically"
        );
        assert_eq!(journal.structured()["restored"][0]["now"]["line"], 3);
    }
}
