//! `lisp-outline`: a compact map of a Lisp source file's top-level forms, one line each, read
//! from the source CST in this process; with `source`, each form's text under its line.
//!
//! See docs/design.md, "The toolbox".

use std::path::Path;

use serde_json::json;

use super::image_sources::read_seeing_images;
use super::{
    parse_permit, file_limit, Annotations, Arguments, Param, Run, Tool, ToolDefinition, ToolError, ToolOutput,
    ToolResult, LARGE_FILE_ARGUMENT,
};
use crate::source::{line_count, outline_page_of, AllowedRoots};

/// The arguments: the schema and the checks.
const ARGUMENTS: &[Param] = &[
    Param::text("file_path", "").required(),
    Param::integer("offset", 0, ""),
    Param::integer("limit", 1, "").at_most(MAX_ENTRIES).default_integer(MAX_ENTRIES),
    Param::flag("source", ""),
    LARGE_FILE_ARGUMENT,
];

/// The tool's `tools/list` entry: name, description, schemas and annotations.
pub fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "lisp-outline",
        description:
            "A Lisp file's forms, one a line: lines, operator and name as edit-lisp-form takes them.",
        arguments: ARGUMENTS,
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: false },
    }
}

/// The tool, for the table in `tools/mod.rs`.
pub const TOOL: Tool = Tool {
    definition,
    // Reads under the server's roots, or, for a file of an ASDF system the image knows, under that
    // system's directory (read only).
    run: Run::Source {
        source: run,
        call: |context, args| Box::pin(read_seeing_images(context, args, run)),
        image_argument: false,
    },
    preview: None,
    typed: super::Typed::of::<Args>(),
    looks_only: None,
};

/// The most outline entries one reply holds: 2,000 lines of about 40 characters.
pub const MAX_ENTRIES: u64 = 2_000;

/// With `source`, a page ends after the form that brings its text past this many bytes.
const SOURCE_PAGE_BYTES: usize = 16_000;

/// The arguments as the tool reads them.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    file_path: String,
    #[serde(default)]
    offset: u64,
    limit: Option<u64>,
    #[serde(default)]
    source: bool,
    #[serde(default)]
    large_file: bool,
}

fn run(args: &Arguments, roots: &AllowedRoots) -> ToolResult {
    let Args { file_path, offset, limit, source: with_source, large_file } = args.typed()?;
    let offset = offset as usize;
    let limit = limit.unwrap_or(MAX_ENTRIES) as usize;
    let file = roots.read(Path::new(&file_path), file_limit(large_file))?;
    let _permit = parse_permit(file.bytes.len());
    // No tree of the whole file: only the page's forms are parsed.
    let (total, mut entries) = outline_page_of(&file.bytes, offset, limit).map_err(|e| {
        ToolError::new(format!(
            "`{}` does not read as Lisp: {e}. Fix that first (`lisp-check-parens` shows where).",
            file.shown
        ))
    })?;
    if with_source {
        // A nested form's text is in its wrapper's; the page ends once its text is long enough.
        entries.retain(|entry| entry.depth == 0);
        let mut bytes = 0;
        let fits = entries
            .iter()
            .take_while(|entry| {
                let fits = bytes < SOURCE_PAGE_BYTES;
                bytes += entry.span.1 - entry.span.0;
                fits
            })
            .count();
        entries.truncate(fits.max(1));
    }
    let lines = line_count(&file.bytes);
    let plural = if total == 1 { "" } else { "s" };
    let mut text = format!("{}: {total} top-level form{plural}, {lines} lines\n", file.shown);
    let shown_to = offset.saturating_add(entries.iter().filter(|entry| entry.depth == 0).count());
    let next_offset = (shown_to < total).then_some(shown_to);
    if offset > 0 || next_offset.is_some() {
        if entries.is_empty() {
            text.push_str(&format!("(no forms from offset {offset}: the file has {total})\n"));
        } else {
            text.push_str(&format!("forms {} to {shown_to}:\n", offset + 1));
        }
    }
    let ranges: Vec<String> = entries
        .iter()
        .map(|e| {
            if e.lines.first == e.lines.last {
                e.lines.first.to_string()
            } else {
                format!("{}-{}", e.lines.first, e.lines.last)
            }
        })
        .collect();
    let width = ranges.iter().map(String::len).max().unwrap_or(0);
    for (entry, range) in entries.iter().zip(&ranges) {
        let conditions = if entry.conditions.is_empty() { String::new() } else { format!("{} ", entry.conditions) };
        let indent = "  ".repeat(entry.depth);
        text.push_str(&format!("{range:<width$}  {indent}{conditions}{}\n", entry.description));
        if with_source {
            text.push_str(&String::from_utf8_lossy(&file.bytes[entry.span.0..entry.span.1]));
            text.push('\n');
        }
    }
    if let Some(next) = next_offset {
        text.push_str(&format!("... {} more; use `offset: {next}` for the next page.\n", total - next));
    }
    let forms: Vec<_> = entries
        .iter()
        .map(|e| {
            json!({
                "first_line": e.lines.first,
                "last_line": e.lines.last,
                "depth": e.depth,
                "conditions": e.conditions,
                "operator": e.operator,
                "name": e.name,
            })
        })
        .collect();
    Ok(ToolOutput::success(text.trim_end().to_string()).with_structured(json!({
        "file": file.shown,
        "lines": lines,
        "total_forms": total,
        "offset": offset,
        "next_offset": next_offset,
        "forms": forms,
    })))
}
