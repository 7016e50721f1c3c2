//! `lisp-outline`: a compact map of a Lisp source file's top-level forms, one line each, read
//! from the source CST in this process; with `source`, each form's text under its line.
//!
//! See docs/design.md, "The toolbox".

use std::path::Path;

use serde_json::json;

use super::arguments::arguments;
use super::{
    parse_permit, file_limit, Arguments, Run, Tool, ToolDefinition, ToolError, ToolOutput,
    ToolResult,
};
use crate::source::{line_count, outline_page_of, AllowedRoots, Cst, OutlineEntry, ParseError};

/// Public: the tests and benchmarks run it on files alone, with no server.
pub const TOOL: Tool = Tool {
    definition: ToolDefinition {
        name: "lisp-outline",
        arguments: Args::PARAMS,
        read_only: true,
        description: "A Lisp file's forms, one a line (lines, operator, name as edit-lisp-form takes them); source: \
            true adds their text; line: the form holding it, whole.",
    },
    run: Run::Reading(run),
    preview: None,
    looks_only: None,
};

/// The most forms one page holds, and the most `limit` takes.
pub const MAX_ENTRIES: u64 = 2_000;

/// A page ends after the form that brings its text past this many characters: about 4,000 tokens,
/// 400 forms of outline or a few screens of source, whatever the forms' length.
const PAGE_CHARS: usize = 16_000;

arguments! {
    struct Args {
        file_path: String,
        offset: Option<u64>,
        limit: Option<u64> => at_least(1).at_most(MAX_ENTRIES),
        line: Option<u64> => at_least(1),
        source: bool,
        large_file: bool,
    }
}

fn run(args: &Arguments, roots: &AllowedRoots) -> ToolResult {
    let Args { file_path, offset, limit, line, source: with_source, large_file } = args.typed()?;
    if line.is_some() && (offset.is_some() || limit.is_some()) {
        return Err(ToolError::new(
            "Give `line` (the whole form at that line) or `offset` and `limit` (a page of forms), not both.",
        ));
    }
    let file = roots.read(Path::new(&file_path), file_limit(large_file))?;
    let _permit = parse_permit(file.bytes.len());
    let unreadable = |e: ParseError| {
        ToolError::new(format!(
            "`{}` does not read as Lisp: {e}. Fix that first (`lisp-check-parens` shows where).",
            file.shown
        ))
    };
    let lines = line_count(&file.bytes);
    let (offset, limit, with_source) = match line {
        Some(line) => (form_at_line(&file.bytes, line as usize, lines, &file.shown).map_err(|e| match e {
            AtLine::Unreadable(e) => unreadable(e),
            AtLine::Nowhere(why) => ToolError::new(why),
        })?, 1, true),
        None => (offset.unwrap_or(0) as usize, limit.unwrap_or(MAX_ENTRIES) as usize, with_source),
    };
    // No tree of the whole file: only the page's forms are parsed.
    let (total, mut entries) = outline_page_of(&file.bytes, offset, limit).map_err(unreadable)?;
    if with_source {
        // A nested form's text is in its wrapper's.
        entries.retain(|entry| entry.depth == 0);
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
    let piece = |entry: &OutlineEntry, range: &str, width: usize| {
        let conditions = if entry.conditions.is_empty() { String::new() } else { format!("{} ", entry.conditions) };
        let indent = "  ".repeat(entry.depth);
        let mut piece = format!("{range:<width$}  {indent}{conditions}{}\n", entry.description);
        if with_source {
            piece.push_str(&String::from_utf8_lossy(&file.bytes[entry.span.0..entry.span.1]));
            piece.push('\n');
        }
        piece
    };
    // Whole forms, until the page's text passes its budget (measured at the widest line numbers
    // of the candidates, then written at those of the forms shown).
    let widest = ranges.iter().map(String::len).max().unwrap_or(0);
    let (mut chars, mut shown, mut listed) = (0, 0, 0);
    for (entry, range) in entries.iter().zip(&ranges) {
        if entry.depth == 0 {
            if shown > 0 && chars >= PAGE_CHARS {
                break;
            }
            shown += 1;
        }
        chars += piece(entry, range, widest).chars().count();
        listed += 1;
    }
    let width = ranges[..listed].iter().map(String::len).max().unwrap_or(0);
    let body: String = entries[..listed].iter().zip(&ranges).map(|(entry, range)| piece(entry, range, width)).collect();
    let plural = if total == 1 { "" } else { "s" };
    let mut text = format!("{}: {total} top-level form{plural}, {lines} lines\n", file.shown);
    let shown_to = offset.saturating_add(shown);
    let next_offset = (line.is_none() && shown_to < total).then_some(shown_to);
    match line {
        Some(line) => text.push_str(&format!("form {shown_to}, holding line {line}:\n")),
        None if offset > 0 || next_offset.is_some() => {
            if shown == 0 {
                text.push_str(&format!("(no forms from offset {offset}: the file has {total})\n"));
            } else {
                text.push_str(&format!("forms {} to {shown_to}:\n", offset + 1));
            }
        }
        None => {}
    }
    text.push_str(&body);
    if let Some(next) = next_offset {
        text.push_str(&format!("... {} more; use `offset: {next}` for the next page.\n", total - next));
    }
    let forms: Vec<_> = entries[..listed]
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

/// Why no form holds a line.
enum AtLine {
    Unreadable(ParseError),
    /// The refusal, naming the nearest forms.
    Nowhere(String),
}

/// The index (from 0) of the top-level form of `bytes`, `lines` long and `shown` so in replies,
/// whose lines hold `line`.
fn form_at_line(bytes: &[u8], line: usize, lines: usize, shown: &str) -> Result<usize, AtLine> {
    if line > lines {
        return Err(AtLine::Nowhere(format!("`{shown}` has {lines} lines; line {line} is past its end.")));
    }
    let spans = Cst::top_level_spans(bytes).map_err(AtLine::Unreadable)?;
    let mut line_starts = vec![0];
    line_starts.extend(bytes.iter().enumerate().filter(|(_, &b)| b == b'\n').map(|(i, _)| i + 1));
    let line_of = |offset: usize| line_starts.partition_point(|&start| start <= offset);
    let ranges: Vec<(usize, usize)> =
        spans.iter().map(|&(start, end)| (line_of(start as usize), line_of((end as usize).saturating_sub(1)))).collect();
    if let Some(index) = ranges.iter().position(|&(first, last)| first <= line && line <= last) {
        return Ok(index);
    }
    let before = ranges.iter().rev().find(|&&(_, last)| last < line);
    let after = ranges.iter().find(|&&(first, _)| first > line);
    let near: Vec<String> = [before, after]
        .into_iter()
        .flatten()
        .map(|&(first, last)| if first == last { format!("line {first}") } else { format!("lines {first}-{last}") })
        .collect();
    Err(AtLine::Nowhere(match near.as_slice() {
        [] => format!("`{shown}` has no top-level forms; line {line} is in none."),
        near => format!(
            "Line {line} of `{shown}` is in no top-level form (a comment or blank line); the nearest are at {}.",
            near.join(" and ")
        ),
    }))
}

