//! find-definition's `text` and `system`: the definitions (top-level forms) whose text holds a
//! string, each with its place and the lines that hold it (or, with `source`, its whole text,
//! once), in one call where a shell agent greps and then reads the file around each line; and the
//! files of an ASDF system the image knows.
//!
//! The files are the system's, as the image lists its components (never loading an .asd file),
//! or the Lisp files under the roots. Each is searched in this process, and the top-level form
//! around each matching line is found in its syntax tree.
//!
//! See docs/design.md, "The toolbox".

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::{decode, plural};
use super::{Arguments, ToolContext, ToolError, ToolOutput, ToolResult, LARGE_FILE};
use crate::image::{Entry, Request};
use crate::source::{outline_page_of, AllowedRoots, Cst, PathError};

/// The file names searched under the roots.
const LISP_EXTENSIONS: [&str; 4] = ["lisp", "lsp", "cl", "asd"];
/// The most files a search under the roots reads: a root may be a whole home directory.
const MAX_FILES: usize = 10_000;
/// Matching lines shown per definition; the rest are counted.
const LINES_PER_MATCH: usize = 10;
/// Characters shown of a matching line.
const LINE_CHARS: usize = 200;
/// With `source`, a page ends after the definition that brings its text past this many
/// characters, as a lisp-outline page does.
const SOURCE_PAGE_CHARS: usize = 16_000;

/// The helper's answer to `system-files`.
#[derive(Debug, Deserialize)]
struct SystemFiles {
    system: String,
    directory: Option<String>,
    files: Vec<String>,
}

/// A definition whose text holds the string, or a matching line outside any.
#[derive(Debug, Clone, PartialEq)]
struct Hit {
    /// As a reply names it: relative to the first root when under it, else absolute.
    file: String,
    /// The form's first line, or the line's when it is outside any form.
    line: usize,
    /// `defun foo`, as lisp-outline describes the form; `None` outside any form.
    form: Option<String>,
    /// The matching lines, number and text.
    lines: Vec<(usize, String)>,
    /// With `source`: the whole form's text, when the lines are in one.
    source: Option<String>,
}

/// What find-definition asks of a search: `text`, `system` or both, and the page of hits.
pub(crate) struct Search {
    pub text: Option<String>,
    pub system: Option<String>,
    /// Each definition's whole text rather than its matching lines.
    pub source: bool,
    pub offset: usize,
    pub limit: usize,
}

/// find-definition with `text` or `system` (and no `symbol`).
pub(crate) async fn call(context: &ToolContext, args: &Arguments, asked: Search) -> ToolResult {
    let Search { text, system, source, offset, limit } = asked;
    if text.as_deref().is_some_and(|text| text.is_empty() || text.contains('\n')) {
        return Err(ToolError::new("Argument `text` must be one line, not empty: the lines that hold it are shown."));
    }
    let system = match system {
        Some(name) => {
            let reply = context.call_helper(args, Request::new(Entry::SYSTEM_FILES).arg(name)).await?;
            Some(decode::<SystemFiles>("system-files", &reply)?)
        }
        None => None,
    };
    let Some(text) = text else {
        // `system` alone: its files.
        return match system {
            Some(system) => Ok(list_files(&system, offset, limit)),
            None => Err(ToolError::new("Give `text` (the forms holding it) or `system` (its files).")),
        };
    };
    let shown = text.clone();
    let (hits, searched, unread) = context
        .on_files(move |roots| {
            let system_roots = match system.as_ref().and_then(|s| s.directory.as_ref()) {
                Some(directory) => {
                    Path::new(directory).canonicalize().ok().and_then(|d| AllowedRoots::exact(vec![d]).ok())
                }
                None => None,
            };
            let (files, where_) = match &system {
                Some(system) => (system.files.iter().map(PathBuf::from).collect(), format!("system {}", system.system)),
                None => (lisp_files(roots), "the roots".to_string()),
            };
            let (mut hits, mut unread) = (Vec::new(), 0);
            for path in &files {
                let read = match roots.read(path, Some((LARGE_FILE, ""))) {
                    Err(PathError::Outside { .. }) => match &system_roots {
                        // Outside the roots, a system's file is named whole: file_path takes it so.
                        Some(system_roots) => system_roots.read(path, Some((LARGE_FILE, ""))).map(|mut file| {
                            file.shown = file.path.display().to_string();
                            file
                        }),
                        None => continue,
                    },
                    read => read,
                };
                match read {
                    Ok(file) => hits.extend(search(&file.bytes, &text, &file.shown, source)),
                    Err(_) => unread += 1,
                }
            }
            Ok((hits, (files.len(), where_), unread))
        })
        .await?;
    Ok(render_hits(&shown, &hits, searched, unread, offset, limit))
}

/// The Lisp files under each root, in name order, at most [`MAX_FILES`]; hidden directories and
/// symbolic links are not followed.
fn lisp_files(roots: &AllowedRoots) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut directories: Vec<PathBuf> = roots.paths().into_iter().map(Path::to_path_buf).collect();
    directories.reverse();
    while let Some(directory) = directories.pop() {
        let Ok(entries) = std::fs::read_dir(&directory) else { continue };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|entry| entry.file_name());
        let mut below = Vec::new();
        for entry in entries {
            let (Ok(kind), name) = (entry.file_type(), entry.file_name()) else { continue };
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            if kind.is_dir() {
                below.push(path);
            } else if kind.is_file()
                && path.extension().is_some_and(|e| LISP_EXTENSIONS.iter().any(|l| e.eq_ignore_ascii_case(l)))
            {
                files.push(path);
                if files.len() == MAX_FILES {
                    return files;
                }
            }
        }
        // Depth first, in name order.
        directories.extend(below.into_iter().rev());
    }
    files
}

/// The hits of `text` (ignoring ASCII case) in `bytes`, the file `shown`: one per top-level form
/// holding a matching line, with the form's text `with_source`, and one per matching line outside
/// any form (a comment between them).
fn search(bytes: &[u8], text: &str, shown: &str, with_source: bool) -> Vec<Hit> {
    let needle = text.as_bytes().to_ascii_lowercase();
    // No forms when the file does not read: its lines are still found.
    let spans = Cst::top_level_spans(bytes).unwrap_or_default();
    let mut hits: Vec<Hit> = Vec::new();
    let mut last_form = None;
    let mut start = 0;
    for (number, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let end = start + line.len();
        let holds =
            line.len() >= needle.len() && line.windows(needle.len()).any(|window| window.eq_ignore_ascii_case(&needle));
        if holds {
            let line_text = String::from_utf8_lossy(line).trim_end().chars().take(LINE_CHARS).collect();
            // The last form starting before the line's end; the line is in it if it ends after the
            // line's start.
            let form = match spans.partition_point(|&(s, _)| (s as usize) < end.max(start + 1)) {
                0 => None,
                i => Some(spans[i - 1]).filter(|&(_, e)| e as usize > start),
            };
            match (form, hits.last_mut()) {
                (Some(form), Some(hit)) if last_form == Some(form) => hit.lines.push((number + 1, line_text)),
                (Some((s, e)), _) => {
                    let (s, e) = (s as usize, e as usize);
                    hits.push(Hit {
                        file: shown.to_string(),
                        line: 1 + bytes[..s].iter().filter(|&&b| b == b'\n').count(),
                        form: Some(describe(&bytes[s..e])),
                        lines: vec![(number + 1, line_text)],
                        source: with_source.then(|| String::from_utf8_lossy(&bytes[s..e]).into_owned()),
                    });
                }
                (None, _) => hits.push(Hit {
                    file: shown.to_string(),
                    line: number + 1,
                    form: None,
                    lines: vec![(number + 1, line_text)],
                    source: None,
                }),
            }
            last_form = form;
        }
        start = end + 1;
    }
    hits
}

/// How lisp-outline describes the top-level form `form`: `#+sbcl defun foo`.
fn describe(form: &[u8]) -> String {
    match outline_page_of(form, 0, 1) {
        Ok((_, entries)) if !entries.is_empty() => {
            let entry = &entries[0];
            if entry.conditions.is_empty() {
                entry.description.clone()
            } else {
                format!("{} {}", entry.conditions, entry.description)
            }
        }
        _ => String::from_utf8_lossy(form).lines().next().unwrap_or_default().chars().take(60).collect(),
    }
}

/// The reply to a search: each hit as `file:line (defun foo)`, then its lines, a page of them.
fn render_hits(
    text: &str,
    hits: &[Hit],
    (searched, where_): (usize, String),
    unread: usize,
    offset: usize,
    limit: usize,
) -> ToolOutput {
    let files = {
        let mut files: Vec<&str> = hits.iter().map(|hit| hit.file.as_str()).collect();
        files.dedup();
        files.len()
    };
    let unread_note = if unread > 0 { format!(", {unread} not readable") } else { String::new() };
    let mut reply = format!(
        "{text:?} is in {} in {} (of {} searched in {where_}{unread_note})",
        plural(hits.len() as u64, "place", "places"),
        plural(files as u64, "file", "files"),
        searched,
    );
    // Whole hits, until a page of definitions' text passes its budget.
    let mut chars = 0;
    let page: Vec<&Hit> = hits
        .iter()
        .skip(offset)
        .take(limit)
        .take_while(|hit| {
            let fits = chars == 0 || chars < SOURCE_PAGE_CHARS;
            chars += hit.source.as_ref().map_or(0, |text| text.chars().count().max(1));
            fits
        })
        .collect();
    let shown_to = (offset + page.len()).min(hits.len());
    if offset > 0 || shown_to < hits.len() {
        reply.push_str(&format!(", {} to {shown_to}", offset + 1));
    }
    reply.push(if hits.is_empty() { '.' } else { ':' });
    for hit in &page {
        match &hit.form {
            Some(form) => reply.push_str(&format!("\n{}:{} ({form})", hit.file, hit.line)),
            None => reply.push_str(&format!("\n{}:{}", hit.file, hit.line)),
        }
        if let Some(source) = &hit.source {
            reply.push('\n');
            reply.push_str(source);
            continue;
        }
        for (number, line) in hit.lines.iter().take(LINES_PER_MATCH) {
            reply.push_str(&format!("\n  {number}: {line}"));
        }
        if hit.lines.len() > LINES_PER_MATCH {
            let more = hit.lines.len() - LINES_PER_MATCH;
            reply.push_str(&format!("\n  ... {more} more {}", if more == 1 { "line" } else { "lines" }));
        }
    }
    let next_offset = (shown_to < hits.len()).then_some(shown_to);
    if let Some(next) = next_offset {
        reply.push_str(&format!("\n... {} more; use `offset: {next}` for the next page.", hits.len() - next));
    }
    let matches: Vec<Value> = page
        .iter()
        .map(|hit| match &hit.source {
            Some(source) => json!({"file": hit.file, "line": hit.line, "form": hit.form, "source": source}),
            None => json!({"file": hit.file, "line": hit.line, "form": hit.form, "lines": hit.lines}),
        })
        .collect();
    ToolOutput::success(reply).with_structured(json!({
        "text": text, "total": hits.len(), "files_searched": searched, "offset": offset,
        "next_offset": next_offset, "matches": matches,
    }))
}

/// The reply to `system` alone: its files, relative to its directory, a page of them.
fn list_files(system: &SystemFiles, offset: usize, limit: usize) -> ToolOutput {
    let directory = system.directory.as_deref().unwrap_or_default();
    let total = system.files.len();
    let mut reply = format!("System {}: {} in {directory}", system.system, plural(total as u64, "file", "files"));
    let shown_to = (offset + limit).min(total);
    if offset > 0 || shown_to < total {
        reply.push_str(&format!(", {} to {shown_to}", offset + 1));
    }
    let page: Vec<&str> =
        system.files.iter().skip(offset).take(limit).map(|file| file.strip_prefix(directory).unwrap_or(file)).collect();
    for file in &page {
        reply.push_str(&format!("\n  {file}"));
    }
    let next_offset = (shown_to < total).then_some(shown_to);
    if let Some(next) = next_offset {
        reply.push_str(&format!("\n... {} more; use `offset: {next}` for the next page.", total - next));
    }
    ToolOutput::success(reply).with_structured(json!({
        "system": system.system, "directory": directory, "total": total, "offset": offset,
        "next_offset": next_offset, "files": page,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "\
(in-package :app)

;; The column of a cell.
(defun cell-column (cell)
  (let ((column (second cell)))
    (1+ column)))

#+sbcl
(defvar *column-width* 8)
";

    #[test]
    fn each_form_holding_the_text_comes_once_with_its_matching_lines() {
        let hits = search(SOURCE.as_bytes(), "COLUMN", "a.lisp", false);
        let shown: Vec<_> = hits.iter().map(|h| (h.line, h.form.clone(), h.lines.len())).collect();
        assert_eq!(
            shown,
            [
                (3, None, 1),
                (4, Some("defun cell-column".to_string()), 3),
                (8, Some("#+sbcl defvar *column-width*".to_string()), 1)
            ]
        );
        assert_eq!(hits[1].lines[1], (5, "  (let ((column (second cell)))".to_string()));
        let output = render_hits("column", &hits, (1, "the roots".into()), 0, 1, 1);
        assert_eq!(
            output.text,
            "\"column\" is in 3 places in 1 file (of 1 searched in the roots), 2 to 2:\na.lisp:4 (defun cell-column)\n  \
             4: (defun cell-column (cell)\n  5:   (let ((column (second cell)))\n  6:     (1+ column)))\n... 1 more; use \
             `offset: 2` for the next page."
        );
    }

    #[test]
    fn with_source_each_form_holding_the_text_comes_whole_once() {
        let hits = search(SOURCE.as_bytes(), "column", "a.lisp", true);
        let output = render_hits("column", &hits, (1, "the roots".into()), 0, 0, 50);
        assert_eq!(
            output.text,
            "\"column\" is in 3 places in 1 file (of 1 searched in the roots):\na.lisp:3\n  3: ;; The column of a cell.\n\
             a.lisp:4 (defun cell-column)\n(defun cell-column (cell)\n  (let ((column (second cell)))\n    (1+ column)))\n\
             a.lisp:8 (#+sbcl defvar *column-width*)\n#+sbcl\n(defvar *column-width* 8)"
        );
        let matches = output.structured_value().unwrap()["matches"].clone();
        assert_eq!(
            matches[1]["source"],
            "(defun cell-column (cell)\n  (let ((column (second cell)))\n    (1+ column)))"
        );
        assert!(matches[1].get("lines").is_none() && matches[0]["lines"][0][0] == 3);
    }

    #[test]
    fn with_source_a_page_ends_after_the_form_that_passes_its_budget() {
        let long = format!("(defun long-one ()\n  \"{}\")\n", "x".repeat(SOURCE_PAGE_CHARS / 2));
        let file = long.repeat(5);
        let hits = search(file.as_bytes(), "long-one", "l.lisp", true);
        assert_eq!(hits.len(), 5);
        let output = render_hits("long-one", &hits, (1, "the roots".into()), 0, 0, 50);
        let next = output.structured_value().unwrap()["next_offset"].clone();
        // The second passes the budget, and ends the page.
        assert_eq!((output.text.matches("\n(defun long-one ()").count(), next), (2, json!(2)));
        assert!(output.text.ends_with("... 3 more; use `offset: 2` for the next page."), "{}", output.text);
        // Without source, the lines, a whole page of them.
        let hits = search(file.as_bytes(), "long-one", "l.lisp", false);
        assert_eq!(render_hits("long-one", &hits, (1, "the roots".into()), 0, 0, 50).text.matches("\n  1:").count(), 1);
    }

    #[test]
    fn a_file_that_does_not_read_still_has_its_lines_found() {
        let hits = search(b"(defun broken (x)\n  (column x)\n", "column", "b.lisp", false);
        assert_eq!(hits.len(), 1);
        assert_eq!((hits[0].form.as_deref(), hits[0].lines[0].0), (None, 2));
    }

    #[test]
    fn a_system_lists_its_files_from_its_directory() {
        let system = SystemFiles {
            system: "app".into(),
            directory: Some("/src/app/".into()),
            files: vec!["/src/app/app.asd".into(), "/src/app/a.lisp".into(), "/src/app/b.lisp".into()],
        };
        assert_eq!(list_files(&system, 0, 50).text, "System app: 3 files in /src/app/\n  app.asd\n  a.lisp\n  b.lisp");
        assert_eq!(
            list_files(&system, 1, 1).text,
            "System app: 3 files in /src/app/, 2 to 2\n  a.lisp\n... 1 more; use `offset: 2` for the next page."
        );
    }
}
