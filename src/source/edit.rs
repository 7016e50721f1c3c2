//! `edit-lisp-form`'s engine: find one top-level form and replace it or insert new forms next to
//! it, changing no other byte of the file.
//!
//! See docs/design.md, "Source files".

use std::io;
use std::ops::Range;
use std::path::Path;

use super::cst::{line_start_before, Cst, LineIndex, LineRange, NodeKind, ParseError, BOM};
use super::diff::{compact_diff, unified_diff};
use super::files::{AllowedRoots, PathError, Snapshot, WriteError};
use super::find::find_target;
use super::forms::{definitions, Query, TopForm};
use super::lexer::is_whitespace;

/// What an edit does with its target form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// The new forms take the target's place; a reader conditional in front of it stays.
    Replace,
    /// The new forms go before the target and the comments attached to it, a blank line apart.
    InsertBefore,
    /// The new forms go after the target's line, a blank line apart.
    InsertAfter,
    /// The target goes, with its reader conditionals and the comment lines attached above it.
    Delete,
    /// The one occurrence of a text inside the target becomes another text.
    Patch,
}

impl Operation {
    const ALL: [Operation; 5] =
        [Operation::Replace, Operation::InsertBefore, Operation::InsertAfter, Operation::Delete, Operation::Patch];

    /// Each operation's name, in the order the tool's schema lists them.
    pub(crate) const NAMES: [&'static str; 5] = {
        let mut names = [""; 5];
        let mut i = 0;
        while i < Self::ALL.len() {
            names[i] = Self::ALL[i].name();
            i += 1;
        }
        names
    };

    /// The operation a call names.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|operation| operation.name() == name)
    }

    /// Its name, as a call gives it.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Operation::Replace => "replace",
            Operation::InsertBefore => "insert_before",
            Operation::InsertAfter => "insert_after",
            Operation::Delete => "delete",
            Operation::Patch => "patch",
        }
    }
}

/// An edit as `edit-lisp-form` takes it: which top-level form, and what to do there.
#[derive(Debug, Clone, Copy)]
pub struct EditRequest<'a> {
    /// The target's operator, e.g. `defun` or `defmethod`.
    pub form_type: &'a str,
    /// The name the target defines, as Lisp text: `foo`, `(setf foo)`, or for a method its name
    /// followed by qualifiers and specializers.
    pub form_name: &'a str,
    /// What to do at the target.
    pub operation: Operation,
    /// The new form(s) as Lisp source; surrounding blank space is dropped. Empty for a delete.
    /// For a patch, the text that takes `old_text`'s place, as it is.
    pub content: &'a str,
    /// For a patch, the text to replace, which must occur exactly once in the target; empty
    /// otherwise.
    pub old_text: &'a str,
    /// 1-based choice among several matching forms.
    pub index: Option<usize>,
}

/// Why an edit was refused or failed; the file is left as it was. Each message is written for
/// the model, and says what to do instead where there is something to do.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// `form_type` and `form_name` do not make a query; the message says why.
    #[error("{0}")]
    Query(String),
    /// `content` does not read as Lisp.
    #[error("`content` is not valid Lisp (lines and columns count within `content`): {0}. The file was not touched.")]
    ContentSyntax(Box<ParseError>),
    /// `content` holds no form.
    #[error("`content` holds no form, only whitespace or comments. The file was not touched.")]
    EmptyContent,
    /// A delete came with `content`.
    #[error("`delete` removes the form and takes no `content`; leave `content` out. The file was not touched.")]
    ContentWithDelete,
    /// `old_text` came with another operation than `patch`, or a patch without it.
    #[error("{0} The file was not touched.")]
    PatchArguments(&'static str),
    /// A patch's `old_text` occurs in the target never or more than once; the message says
    /// where.
    #[error("{0}\nThe file was not touched.")]
    Patch(String),
    /// The path cannot be used or the file could not be read.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The file does not read as Lisp, so it has no forms to find.
    #[error("`{path}` does not read as Lisp, so it cannot be edited structurally: {error}. Fix that first (`lisp-check-parens` shows where); the file was not touched.")]
    FileSyntax {
        /// The file as messages name it.
        path: String,
        /// Where and why it does not read.
        error: Box<ParseError>,
    },
    /// No form matches, or several do and `index` does not choose one; the message lists them.
    #[error("{0}\nThe file was not touched.")]
    Target(String),
    /// A replacement of several forms for a target under `#+`/`#-`, which would guard only the
    /// first of them.
    #[error("`{target}` stands behind the reader conditional `{condition}`, which applies to exactly one form, but `content` holds {forms}. Replace it with one form (wrap several in `progn`). The file was not touched.")]
    ConditionalTakesOneForm {
        /// The target as messages name it, e.g. `defun foo`.
        target: String,
        /// The conditional's text, e.g. `#+sbcl`.
        condition: String,
        /// How many forms `content` holds (at least two).
        forms: usize,
    },
    /// The edited text would not read as the expected forms (`content` would merge with the
    /// text around it); the message says how it reads instead.
    #[error("The edit would not read back as the intended forms ({0}), probably because `content` runs into the text around the form; nothing written.")]
    Verify(String),
    /// The file changed on disk between reading and writing.
    #[error("file changed while editing; nothing written. Read it again and retry.")]
    Changed,
    /// The file may not be replaced (read-only, or another user's); the message says why.
    #[error("{0}")]
    NotWritable(String),
    /// Writing the edited file failed; the original is left as it was.
    #[error("Cannot write `{path}`: {source}; nothing written.")]
    Write {
        /// The file as messages name it.
        path: String,
        /// Why writing failed.
        source: io::Error,
    },
}

/// What an edit did, for the reply.
#[derive(Debug, Clone)]
pub struct EditReport {
    /// The file as messages name it.
    pub file: String,
    pub(crate) operation: Operation,
    /// How the target is named in messages, e.g. `#+sbcl defun foo`.
    pub target: String,
    /// The target's lines before the edit.
    pub target_lines: LineRange,
    /// The lines the new form(s) occupy after the edit; for a delete, the line where the form
    /// was.
    pub new_lines: LineRange,
    pub(crate) forms: usize,
    /// A unified diff of the file, old to new; empty when the edit changes nothing.
    pub diff: String,
    /// Where the new forms are in the new text (empty for a delete).
    pub new_span: Range<usize>,
    /// For a delete: the form removed, to remove its definition from the image too.
    pub removed: Option<RemovedForm>,
    /// The bytes of the old text the edit replaced, and how many took their place: what moves
    /// the forms after it.
    pub(crate) replaced: Range<usize>,
    pub(crate) inserted: usize,
    /// How many lines later edits of its batch moved its new lines down (up when negative):
    /// `new_lines` has them already, `diff` the lines as this edit left them.
    pub(crate) lines_moved: isize,
    /// Whether a later edit of its batch changed the text this edit wrote, so that the text it
    /// shows is not the file's in the end.
    pub(crate) changed_again: bool,
}

/// A deleted definition, as the image needs it to undo what loading it did.
#[derive(Debug, Clone)]
pub struct RemovedForm {
    /// The form's text, without the reader conditionals in front of it.
    pub text: String,
    /// The argument of the last `in-package` before it, as written, if any.
    pub package: Option<String>,
}

/// An edit computed but not yet written.
#[derive(Debug)]
pub struct PreparedEdit {
    snapshot: Snapshot,
    new_bytes: Vec<u8>,
    report: EditReport,
}

impl PreparedEdit {
    /// The file as messages name it: relative to its root when possible.
    pub fn shown(&self) -> &str {
        &self.snapshot.shown
    }

    /// What the edit will do, as the reply describes it.
    pub fn report(&self) -> &EditReport {
        &self.report
    }

    /// The file's real path, with no symbolic link in it.
    pub fn path(&self) -> &Path {
        &self.snapshot.path
    }

    /// The whole file as it will be written.
    pub fn new_text(&self) -> &[u8] {
        &self.new_bytes
    }

    /// Writes the edit atomically, unless the file changed since it was read. An edit that
    /// changes nothing writes nothing.
    pub fn commit(self) -> Result<EditReport, EditError> {
        if self.new_bytes == self.snapshot.bytes {
            return Ok(self.report);
        }
        self.snapshot.write_atomically(&self.new_bytes).map_err(|e| write_error(&self.snapshot, e))?;
        Ok(self.report)
    }
}

fn write_error(snapshot: &Snapshot, error: WriteError) -> EditError {
    match error {
        WriteError::Changed => EditError::Changed,
        WriteError::Refused(reason) => EditError::NotWritable(reason),
        WriteError::Io(source) => EditError::Write { path: snapshot.path.display().to_string(), source },
    }
}

/// One edit of several: the file, and what to do there.
#[derive(Debug, Clone, Copy)]
pub struct FileEdit<'a> {
    /// The file, as the call names it.
    pub path: &'a Path,
    /// What to do in it.
    pub request: EditRequest<'a>,
}

/// Why one of several edits was refused: which (from 0), and why. Nothing was written.
#[derive(Debug)]
pub struct BatchError {
    /// The edit refused, from 0.
    pub edit: usize,
    /// Why.
    pub error: EditError,
}

/// Several edits computed but not yet written: each file's new text, and each edit's report
/// with the file it is in.
#[derive(Debug)]
pub struct PreparedEdits {
    files: Vec<(Snapshot, Vec<u8>)>,
    reports: Vec<(usize, EditReport)>,
}

/// Computes `edits` in order, each on the text the ones before it left (several may edit one
/// file), writing nothing: any edit refused refuses them all. What can be checked without the
/// files (names, `content`) is checked before any is read.
pub fn prepare_edits(
    roots: &AllowedRoots,
    edits: &[FileEdit],
    limit: Option<(u64, &'static str)>,
) -> Result<PreparedEdits, BatchError> {
    let checked = edits
        .iter()
        .enumerate()
        .map(|(edit, e)| check_request(&e.request).map_err(|error| BatchError { edit, error }))
        .collect::<Result<Vec<_>, _>>()?;
    let mut files: Vec<(Snapshot, Vec<u8>)> = Vec::new();
    let mut reports: Vec<(usize, EditReport)> = Vec::new();
    for (edit, (file_edit, checked)) in edits.iter().zip(&checked).enumerate() {
        let refused = |error: EditError| BatchError { edit, error };
        let snapshot = roots.snapshot(file_edit.path, limit).map_err(|e| refused(e.into()))?;
        let file = match files.iter().position(|(opened, _)| opened.path == snapshot.path) {
            Some(file) => file,
            None => {
                let text = snapshot.bytes.clone();
                files.push((snapshot, text));
                files.len() - 1
            }
        };
        let (snapshot, text) = &files[file];
        let (new_text, report) = apply(text, &snapshot.shown, &file_edit.request, checked).map_err(refused)?;
        let written = &new_text[report.replaced.start..report.replaced.start + report.inserted];
        let lines_added = line_breaks(written) as isize - line_breaks(&text[report.replaced.clone()]) as isize;
        for (_, earlier) in reports.iter_mut().filter(|(earlier_file, _)| *earlier_file == file) {
            earlier.follow(&report, lines_added);
        }
        files[file].1 = new_text;
        reports.push((file, report));
    }
    Ok(PreparedEdits { files, reports })
}

impl PreparedEdits {
    /// Each file the edits touch, as it was read: its name in messages and its bytes.
    pub fn read_files(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.files.iter().map(|(snapshot, _)| (snapshot.shown.as_str(), snapshot.bytes.as_slice()))
    }

    /// Each edit's report, in the order of the edits, with its file's real path and whole new
    /// text.
    pub fn edits(&self) -> impl Iterator<Item = (&EditReport, &Path, &[u8])> {
        self.reports.iter().map(|(file, report)| {
            let (snapshot, text) = &self.files[*file];
            (report, snapshot.path.as_path(), text.as_slice())
        })
    }

    /// Writes every changed file, each atomically, unless one of them changed since it was read
    /// or cannot be written: then none is. (Each file is staged beside itself first; only when
    /// all are staged and still unchanged are they renamed into place.)
    /// The error names the file (as messages name it) that could not be written.
    pub fn commit(self) -> Result<Vec<EditReport>, (String, EditError)> {
        let changed: Vec<&(Snapshot, Vec<u8>)> =
            self.files.iter().filter(|(snapshot, text)| *text != snapshot.bytes).collect();
        let failed = |snapshot: &Snapshot, error: WriteError| (snapshot.shown.clone(), write_error(snapshot, error));
        let mut staged = Vec::with_capacity(changed.len());
        for (snapshot, text) in &changed {
            staged.push(snapshot.stage(text).map_err(|e| failed(snapshot, e))?);
        }
        for (stage, (snapshot, _)) in staged.iter().zip(&changed) {
            stage.check().map_err(|e| failed(snapshot, e))?;
        }
        for (stage, (snapshot, _)) in staged.into_iter().zip(&changed) {
            stage.commit().map_err(|e| failed(snapshot, e))?;
        }
        Ok(self.reports.into_iter().map(|(_, report)| report).collect())
    }
}

impl EditReport {
    /// Moves `new_span` and `new_lines` past a later edit of the same file, which added
    /// `lines_added` lines (fewer when negative): the text after that edit's place moves by what
    /// it changed in length; a form it edited inside grows or shrinks with it; one whose text it
    /// replaced is gone (the later edit has its own).
    fn follow(&mut self, later: &EditReport, lines_added: isize) {
        let (replaced, span) = (&later.replaced, &mut self.new_span);
        let moved = |at: usize| at + later.inserted - replaced.len();
        if span.end <= replaced.start {
        } else if span.start >= replaced.end {
            *span = moved(span.start)..moved(span.end);
            self.new_lines.first = self.new_lines.first.saturating_add_signed(lines_added);
            self.new_lines.last = self.new_lines.last.saturating_add_signed(lines_added);
            self.lines_moved += lines_added;
        } else if span.start <= replaced.start && replaced.end <= span.end {
            span.end = moved(span.end);
            self.new_lines.last = self.new_lines.last.saturating_add_signed(lines_added);
            self.changed_again = true;
        } else {
            // A delete wrote no text for a later edit to change again.
            self.changed_again |= span.start < span.end;
            *span = 0..0;
        }
    }
}

/// How many line breaks `text` holds.
fn line_breaks(text: &[u8]) -> usize {
    text.iter().filter(|&&b| b == b'\n').count()
}

/// Opens `path` beneath one of `roots`, reads it once and computes the edit. `content` is
/// checked before the file is even opened.
/// A file larger than `limit`'s bytes is refused with its advice.
pub fn prepare_edit(
    roots: &AllowedRoots,
    path: &Path,
    limit: Option<(u64, &'static str)>,
    request: &EditRequest,
) -> Result<PreparedEdit, EditError> {
    let checked = check_request(request)?;
    let snapshot = roots.snapshot(path, limit)?;
    let (new_bytes, report) = apply(&snapshot.bytes, &snapshot.shown, request, &checked)?;
    Ok(PreparedEdit { snapshot, new_bytes, report })
}

/// What is known of a request before any file is read.
struct Checked {
    query: Query,
    /// How many top-level forms `content` holds, and forms processed at top level in all.
    content_forms: usize,
    content_definitions: usize,
}

/// Checks what can be checked of `request` without its file: the form's name, and that
/// `content` reads (or, for a patch, that `old_text` is there).
fn check_request(request: &EditRequest) -> Result<Checked, EditError> {
    let query = Query::parse(request.form_type, request.form_name).map_err(EditError::Query)?;
    let (content_forms, content_definitions) = match request.operation {
        Operation::Patch if request.old_text.is_empty() => {
            return Err(EditError::PatchArguments(
                "`patch` needs `old_text`, the text to replace (it must occur once in the form), and `new_text`.",
            ))
        }
        Operation::Patch => (1, 0),
        _ if !request.old_text.is_empty() => {
            return Err(EditError::PatchArguments(
                "`old_text` and `new_text` go with `operation: \"patch\"`; the other operations take `content`.",
            ))
        }
        Operation::Delete if !request.content.trim().is_empty() => return Err(EditError::ContentWithDelete),
        Operation::Delete => (0, 0),
        _ => {
            let content = Cst::parse(request.content.as_bytes()).map_err(|e| EditError::ContentSyntax(Box::new(e)))?;
            (content.top_level_forms().count(), definitions(&content).len())
        }
    };
    if content_forms == 0 && request.operation != Operation::Delete {
        return Err(EditError::EmptyContent);
    }
    Ok(Checked { query, content_forms, content_definitions })
}

/// The edit `request` makes to `old`, the text of the file `shown_path`: the new text and the
/// report.
fn apply(
    old: &[u8],
    shown_path: &str,
    request: &EditRequest,
    checked: &Checked,
) -> Result<(Vec<u8>, EditReport), EditError> {
    let Checked { query, content_forms, content_definitions } = checked;
    let (content_forms, content_definitions) = (*content_forms, *content_definitions);
    let _permit = super::permit::parse_permit(old.len());
    let cst = Cst::parse(old).map_err(|e| EditError::FileSyntax { path: shown_path.into(), error: Box::new(e) })?;
    let lines = LineIndex::new(old);
    let forms = definitions(&cst);
    let wanted = format!("{} {}", request.form_type.trim(), request.form_name.trim());
    let target = find_target(&cst, &lines, &forms, query, &wanted, request.index).map_err(EditError::Target)?;
    let target_position = forms.iter().position(|f| f.item == target.item).unwrap_or_default();
    let target_name = format!("{}{}", target.conditions_shown(&cst), target.describe(&cst));
    let eol = line_ending(old);
    if request.operation == Operation::Patch {
        return patch(old, shown_path, &cst, &lines, target, target_name, request, eol);
    }

    if let (Operation::Replace, Some(&condition), 2..) = (request.operation, target.conditions.last(), content_forms) {
        let feature = cst.elements(condition).next().map_or(0..0, |f| cst.span(f));
        return Err(EditError::ConditionalTakesOneForm {
            target: target_name,
            condition: String::from_utf8_lossy(&old[cst.span(condition).start..feature.end]).into_owned(),
            forms: content_forms,
        });
    }

    let content = normalise_content(request.content, eol);
    let splice = plan(&cst, target, request.operation, &content, eol);
    let mut new_bytes = Vec::with_capacity(old.len() + splice.replacement.len());
    new_bytes.extend_from_slice(&old[..splice.range.start]);
    new_bytes.extend_from_slice(&splice.replacement);
    new_bytes.extend_from_slice(&old[splice.range.end..]);

    // The target and the forms nested in it go (except on insertion); `content`'s come. A
    // replaced form under a reader conditional leaves the conditional, but then `content` is one
    // form, so the count works out the same.
    let removes = matches!(request.operation, Operation::Replace | Operation::Delete);
    let top_level = forms.iter().filter(|f| f.ancestors.is_empty()).count();
    let expected_top_level = match (target.container, removes) {
        (Some(_), _) => top_level,
        (None, true) => top_level + content_forms - 1,
        (None, false) => top_level + content_forms,
    };
    let subtree = 1 + forms.iter().filter(|f| f.ancestors.contains(&target_position)).count();
    let expected_definitions = forms.len() + content_definitions - if removes { subtree } else { 0 };
    let nesting = forms.len() != top_level || content_definitions != content_forms;
    verify(&new_bytes, expected_top_level, nesting.then_some(expected_definitions))?;

    let new_start = splice.range.start + splice.content.start;
    let removed = (request.operation == Operation::Delete).then(|| RemovedForm {
        text: String::from_utf8_lossy(cst.text(target.form)).into_owned(),
        package: super::load::package_at(&cst, &forms, outermost_start(&cst, &forms, target)),
    });
    let report = EditReport {
        file: shown_path.to_string(),
        operation: request.operation,
        target: target_name,
        target_lines: lines.lines(cst.span(target.item)),
        new_lines: splice.content_lines(lines.line(splice.range.start)),
        forms: content_forms,
        diff: unified_diff(old, &new_bytes, shown_path),
        new_span: new_start..new_start + splice.content.len(),
        removed,
        replaced: splice.range.clone(),
        inserted: splice.replacement.len(),
        lines_moved: 0,
        changed_again: false,
    };
    Ok((new_bytes, report))
}

/// A patch: the one occurrence of `request.old_text` in the target form becomes
/// `request.content`, and the form must still read as one form.
#[allow(clippy::too_many_arguments)]
fn patch(
    old: &[u8],
    shown_path: &str,
    cst: &Cst,
    lines: &LineIndex,
    target: &TopForm,
    target_name: String,
    request: &EditRequest,
    eol: &str,
) -> Result<(Vec<u8>, EditReport), EditError> {
    // The texts take the file's line endings, as `content` does.
    let with_eol = |text: &str| text.replace("\r\n", "\n").replace('\n', eol).into_bytes();
    let (old_text, new_text) = (with_eol(request.old_text), with_eol(request.content));
    let form = cst.span(target.form);
    let target_lines = lines.lines(cst.span(target.item));
    let hits = occurrences(&old[form.clone()], &old_text);
    let at = match hits.as_slice() {
        [at] => form.start + at,
        [] => return Err(EditError::Patch(patch_missing(old, form, &old_text, lines, &target_name, target_lines))),
        many => {
            let places: Vec<String> = many
                .iter()
                .map(|&at| {
                    let start = form.start + at;
                    let line_start = old[..start].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                    format!(
                        "{}:{}",
                        lines.line(start),
                        String::from_utf8_lossy(&old[line_start..start]).chars().count() + 1
                    )
                })
                .collect();
            return Err(EditError::Patch(format!(
                "`old_text` occurs {} times in `{target_name}` ({target_lines}): at lines and columns {}. Give more of \
                 the text around the one to change, so that it occurs once.",
                many.len(),
                places.join(", ")
            )));
        }
    };
    let replaced = at..at + old_text.len();
    let mut new_bytes = Vec::with_capacity(old.len() + new_text.len());
    new_bytes.extend_from_slice(&old[..replaced.start]);
    new_bytes.extend_from_slice(&new_text);
    new_bytes.extend_from_slice(&old[replaced.end..]);
    let new_form = form.start..form.end + new_text.len() - old_text.len();
    // The form must still be one form, and the file hold as many as before.
    match Cst::check(&new_bytes[new_form.clone()]) {
        Ok(1) => {}
        Ok(n) => {
            return Err(EditError::Verify(format!("`{target_name}` would read as {n} forms instead of one")));
        }
        Err(e) => return Err(EditError::Verify(format!("`{target_name}` would not read: {e}"))),
    }
    verify(&new_bytes, cst.top_level_forms().count(), None)?;
    let new_lines = LineIndex::new(&new_bytes).lines(new_form.clone());
    let report = EditReport {
        file: shown_path.to_string(),
        operation: Operation::Patch,
        target: target_name,
        target_lines,
        new_lines,
        forms: 1,
        diff: compact_diff(old, &new_bytes),
        new_span: new_form,
        removed: None,
        replaced,
        inserted: new_text.len(),
        lines_moved: 0,
        changed_again: false,
    };
    Ok((new_bytes, report))
}

/// Where `needle` starts in `haystack`, each place (overlapping ones too).
fn occurrences(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return Vec::new();
    }
    haystack.windows(needle.len()).enumerate().filter(|(_, window)| *window == needle).map(|(at, _)| at).collect()
}

/// Why a patch's `old_text` was not found in the target `form` of `old`, with what comes
/// closest: the same text with other blank space inside the form, or the text elsewhere in the
/// file.
fn patch_missing(
    old: &[u8],
    form: Range<usize>,
    old_text: &[u8],
    lines: &LineIndex,
    target_name: &str,
    target_lines: LineRange,
) -> String {
    let mut text = format!("`old_text` does not occur in `{target_name}` ({target_lines}).");
    let squeezed = |bytes: &[u8]| -> (Vec<u8>, Vec<usize>) {
        // The text with each run of blank space made one space, and where each byte came from.
        let (mut out, mut from) = (Vec::new(), Vec::new());
        for (i, &b) in bytes.iter().enumerate() {
            if is_whitespace(b) {
                if out.last() != Some(&b' ') {
                    out.push(b' ');
                    from.push(i);
                }
            } else {
                out.push(b);
                from.push(i);
            }
        }
        (out, from)
    };
    let (wanted, _) = squeezed(old_text);
    let (inside, from) = squeezed(&old[form.clone()]);
    let trimmed = wanted.trim_ascii();
    if let Some(&at) = occurrences(&inside, trimmed).first() {
        text.push_str(&format!(
            " It does with other blank space (line breaks, indentation) at line {}: give `old_text` exactly as the \
             file has it (find-definition with source: true shows the form's text).",
            lines.line(form.start + from[at])
        ));
    } else if let Some(&at) = occurrences(old, old_text).first() {
        text.push_str(&format!(" It does at line {}, outside this form: name the form that holds it.", lines.line(at)));
    } else {
        text.push_str(" find-definition with source: true shows the form's text as the file has it.");
    }
    text
}

/// Where the top-level form holding `form` (or `form` itself, at top level) starts.
fn outermost_start(cst: &Cst, forms: &[TopForm], form: &TopForm) -> usize {
    let outermost = form.ancestors.first().map_or(form, |&a| &forms[a]);
    cst.span(outermost.item).start
}

/// The edited text must read, with the number of top-level forms the edit implies and, where
/// anything nests, of forms processed at top level (nested ones included): a `content` ending
/// in a token or a line comment could otherwise merge with the text after it, or a nested edit
/// spill out of its wrapper.
fn verify(new_bytes: &[u8], expected_forms: usize, expected_definitions: Option<usize>) -> Result<(), EditError> {
    let Some(expected_definitions) = expected_definitions else {
        // Only the count is needed: no second tree.
        let forms = Cst::check(new_bytes).map_err(|e| EditError::Verify(e.to_string()))?;
        return if forms == expected_forms {
            Ok(())
        } else {
            Err(EditError::Verify(format!("{forms} top-level forms instead of {expected_forms}")))
        };
    };
    let cst = Cst::parse(new_bytes).map_err(|e| EditError::Verify(e.to_string()))?;
    let forms = cst.top_level_forms().count();
    if forms != expected_forms {
        return Err(EditError::Verify(format!("{forms} top-level forms instead of {expected_forms}")));
    }
    let found = definitions(&cst).len();
    if found != expected_definitions {
        return Err(EditError::Verify(format!(
            "{found} forms processed at top level (nested ones included) instead of {expected_definitions}"
        )));
    }
    Ok(())
}

/// The file's line ending, judged by its first line break: `\r\n` or `\n`.
fn line_ending(text: &[u8]) -> &'static str {
    match text.iter().position(|&b| b == b'\n') {
        Some(i) if i > 0 && text[i - 1] == b'\r' => "\r\n",
        _ => "\n",
    }
}

/// `content` without surrounding blank space, with the file's line endings.
fn normalise_content(content: &str, eol: &str) -> Vec<u8> {
    let trimmed = content.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c'));
    trimmed.replace("\r\n", "\n").replace('\n', eol).into_bytes()
}

/// A change to the text: `range` becomes `replacement`, in which the new forms are `content`.
#[derive(Debug)]
struct Splice {
    range: Range<usize>,
    replacement: Vec<u8>,
    content: Range<usize>,
}

impl Splice {
    /// The lines `content` occupies after the edit, given the line the splice starts on.
    fn content_lines(&self, first_line: usize) -> LineRange {
        let breaks = |end: usize| self.replacement[..end].iter().filter(|&&b| b == b'\n').count();
        let last_byte = self.content.end.max(self.content.start + 1) - 1;
        LineRange { first: first_line + breaks(self.content.start), last: first_line + breaks(last_byte) }
    }
}

fn plan(cst: &Cst, target: &TopForm, operation: Operation, content: &[u8], eol: &str) -> Splice {
    let source = cst.source();
    // A nested form's new text is indented to its column; at top level it stays as given.
    let indent = match target.container {
        Some(_) => indentation(source, cst.span(target.item).start),
        None => Vec::new(),
    };
    let content = indent_lines(content, &indent);
    let content = content.as_slice();
    let at = match operation {
        // A patch is planned by `patch`; taken whole, it is a replacement of the form.
        Operation::Replace | Operation::Patch => {
            let range = cst.span(target.form);
            return Splice { range, replacement: content.to_vec(), content: 0..content.len() };
        }
        Operation::Delete => {
            return Splice { range: deleted_range(cst, target), replacement: Vec::new(), content: 0..0 }
        }
        Operation::InsertBefore => attached_comments_start(cst, target),
        Operation::InsertAfter => end_of_line_after(source, cst.span(target.item).end),
    };
    let (before, after) = source.split_at(at);
    if operation == Operation::InsertAfter && target.container.is_some() && !before.ends_with(b"\n") {
        // After the last form of a wrapper, before its closing parenthesis.
        let mut replacement = eol.repeat(2).into_bytes();
        replacement.extend_from_slice(&indent);
        let content_start = replacement.len();
        replacement.extend_from_slice(content);
        return Splice { range: at..at, content: content_start..replacement.len(), replacement };
    }
    let mut replacement = eol.repeat(breaks_needed_before(before)).into_bytes();
    replacement.extend_from_slice(&indent);
    let content_start = replacement.len();
    replacement.extend_from_slice(content);
    let content_end = replacement.len();
    let breaks_after = if after.is_empty() {
        // At the end of the file: keep whether it ended with a newline.
        usize::from(source.ends_with(b"\n"))
    } else {
        2usize.saturating_sub(leading_breaks(after))
    };
    replacement.extend(eol.repeat(breaks_after).bytes());
    Splice { range: at..at, replacement, content: content_start..content_end }
}

/// The blank space from the start of `at`'s line to `at`, if only blank space is there.
fn indentation(source: &[u8], at: usize) -> Vec<u8> {
    let line_start = source[..at].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let prefix = &source[line_start..at];
    if prefix.iter().all(|&b| b == b' ' || b == b'\t') {
        prefix.to_vec()
    } else {
        vec![b' '; prefix.len()]
    }
}

/// `content` with `indent` put in front of each line after the first that is not blank.
fn indent_lines(content: &[u8], indent: &[u8]) -> Vec<u8> {
    if indent.is_empty() {
        return content.to_vec();
    }
    let mut out = Vec::with_capacity(content.len() + indent.len() * 8);
    for (i, line) in content.split(|&b| b == b'\n').enumerate() {
        if i > 0 {
            out.push(b'\n');
            if !line.iter().all(|&b| b == b'\r' || b == b' ' || b == b'\t') {
                out.extend_from_slice(indent);
            }
        }
        out.extend_from_slice(line);
    }
    out
}

/// What a delete removes: the target with its reader conditionals, the comment lines attached
/// above it and the rest of its last line, and then as many blank lines as keep the blank-line
/// rhythm around it (one separation, not two). A form that shares its line with other code
/// goes alone, with the blank space before it; the last form of a wrapper takes the line break
/// before it, so the wrapper's closing parenthesis moves up to the form before.
fn deleted_range(cst: &Cst, target: &TopForm) -> Range<usize> {
    let source = cst.source();
    let item = cst.span(target.item);
    let start = attached_comments_start(cst, target);
    let end = end_of_line_after(source, item.end);
    let at_line_start = |i: usize| i == 0 || source[i - 1] == b'\n' || (i == BOM.len() && source.starts_with(BOM));
    if !at_line_start(start) {
        let spaces = source[..item.start].iter().rev().take_while(|&&b| b == b' ' || b == b'\t').count();
        return item.start - spaces..item.end;
    }
    if !at_line_start(end) && end != source.len() {
        let rest_of_line = &source[item.end..];
        let closes =
            rest_of_line.iter().take_while(|&&b| b != b'\n').all(|&b| matches!(b, b')' | b' ' | b'\t' | b'\r'));
        if closes && start > 0 {
            // Back to what stood before the target, so the closing parenthesis ends that line as
            // it did before the target was added; a line comment keeps its line break, or the
            // parenthesis would move into it.
            let siblings = target.container.map_or(cst.top_level(), |wrapper| cst.children(wrapper));
            let previous = siblings
                .iter()
                .rev()
                .find(|&&node| cst.span(node).end <= start && cst.kind(node) != NodeKind::Whitespace);
            if let Some(&node) = previous.filter(|&&node| cst.kind(node) != NodeKind::LineComment) {
                return cst.span(node).end..item.end;
            }
            let line_break = if start >= 2 && source[start - 2] == b'\r' { 2 } else { 1 };
            return start - line_break..item.end;
        }
        return start..item.end;
    }
    let blank_line = |line: &[u8]| line.iter().all(|&b| matches!(b, b' ' | b'\t' | b'\r'));
    // Blank lines directly below the removed lines.
    let mut blank_end = end;
    while blank_end < source.len() {
        let line_end = source[blank_end..].iter().position(|&b| b == b'\n').map_or(source.len(), |i| blank_end + i + 1);
        if !blank_line(source[blank_end..line_end].strip_suffix(b"\n").unwrap_or(&source[blank_end..line_end])) {
            break;
        }
        blank_end = line_end;
    }
    // Blank lines directly above them.
    let mut blank_start = start;
    while blank_start > 0 {
        let line_start = source[..blank_start - 1].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if !blank_line(&source[line_start..blank_start - 1]) {
            break;
        }
        blank_start = line_start;
    }
    let before = source[..blank_start].strip_prefix(BOM).unwrap_or(&source[..blank_start]);
    if blank_end == source.len() {
        // Nothing follows: the blank lines above would end the file.
        blank_start..source.len()
    } else if blank_start < start || before.is_empty() {
        // Blank lines above already separate what was before from what follows.
        start..blank_end
    } else {
        start..end
    }
}

/// Line breaks to add after `before` so that one blank line separates it from new text; none at
/// the start of the file.
fn breaks_needed_before(before: &[u8]) -> usize {
    let before = before.strip_prefix(BOM).unwrap_or(before);
    let blank = before.iter().rev().take_while(|&&b| is_whitespace(b)).count();
    if blank == before.len() {
        return 0;
    }
    let breaks = before[before.len() - blank..].iter().filter(|&&b| b == b'\n').count();
    2usize.saturating_sub(breaks)
}

fn leading_breaks(after: &[u8]) -> usize {
    after.iter().take_while(|&&b| is_whitespace(b)).filter(|&&b| b == b'\n').count()
}

/// Where an `insert_before` goes: the start of the comment lines directly above the target (no
/// blank line between), or of the target's own line, or the target itself when other code
/// shares its line.
fn attached_comments_start(cst: &Cst, target: &TopForm) -> usize {
    let source = cst.source();
    let siblings = match target.container {
        Some(wrapper) => cst.children(wrapper),
        None => cst.top_level(),
    };
    let mut start = cst.span(target.item).start;
    match line_start_before(source, start) {
        Some(line_start) => start = line_start,
        None => return start,
    }
    let mut i = target.top_index;
    // Each step takes one comment and the single line break after it.
    while i >= 2 {
        let (comment, gap) = (siblings[i - 2], siblings[i - 1]);
        let single_break = cst.text(gap).iter().filter(|&&b| b == b'\n').count() == 1;
        if !cst.kind(comment).is_comment() || cst.kind(gap) != NodeKind::Whitespace || !single_break {
            break;
        }
        match line_start_before(source, cst.span(comment).start) {
            Some(line_start) => start = line_start,
            None => break,
        }
        i -= 2;
    }
    start
}

/// Where an `insert_after` goes: after the line break that ends the target's last line (past a
/// trailing `;` comment), or right after the target when other code follows on its line.
fn end_of_line_after(source: &[u8], end: usize) -> usize {
    let rest = &source[end..];
    let mut i = rest.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    if rest.get(i) == Some(&b';') {
        i += rest[i..].iter().take_while(|&&b| b != b'\n').count();
    }
    match &rest[i..] {
        [] => source.len(),
        [b'\n', ..] => end + i + 1,
        [b'\r', b'\n', ..] => end + i + 2,
        _ => end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies an edit to an in-memory text and returns the result.
    fn edit(source: &str, form_type: &str, form_name: &str, operation: Operation, content: &str) -> String {
        let cst = Cst::parse(source.as_bytes()).expect("parses");
        let forms = definitions(&cst);
        let lines = LineIndex::new(source.as_bytes());
        let query = Query::parse(form_type, form_name).expect("query");
        let target = find_target(&cst, &lines, &forms, &query, form_name, None).expect("target");
        let eol = line_ending(source.as_bytes());
        let content = normalise_content(content, eol);
        let splice = plan(&cst, target, operation, &content, eol);
        let mut out = source.as_bytes().to_vec();
        out.splice(splice.range, splice.replacement);
        String::from_utf8(out).expect("utf-8")
    }

    const FILE: &str = "\
(in-package :app)

;;; Section header

;; Adds one.
;; Really.
(defun inc (x)
  (1+ x)) ; trailing

(defun dec (x) (1- x))
";

    #[test]
    fn replace_swaps_only_the_form() {
        let out = edit(FILE, "defun", "inc", Operation::Replace, "\n(defun inc (x)\n  (+ x 1))\n\n");
        assert_eq!(out, FILE.replace("(defun inc (x)\n  (1+ x))", "(defun inc (x)\n  (+ x 1))"));
    }

    #[test]
    fn insert_before_goes_above_the_attached_comments() {
        let out = edit(FILE, "defun", "inc", Operation::InsertBefore, "(defvar *step* 1)");
        assert_eq!(out, FILE.replace(";; Adds one.", "(defvar *step* 1)\n\n;; Adds one."));
        let out = edit(FILE, "defun", "dec", Operation::InsertBefore, "(defvar *step* 1)");
        assert_eq!(out, FILE.replace("(defun dec", "(defvar *step* 1)\n\n(defun dec"));
    }

    #[test]
    fn block_comments_directly_above_are_attached_too() {
        let source = "(a)\n\n#| About f.\n   More. |#\n;; And this.\n(defun f ())\n";
        let out = edit(source, "defun", "f", Operation::InsertBefore, "(g)");
        assert_eq!(out, "(a)\n\n(g)\n\n#| About f.\n   More. |#\n;; And this.\n(defun f ())\n");
        // A comment that ends a line of code belongs to that code, not to the form below.
        let source = "(a) ; about a\n(defun f ())\n";
        let out = edit(source, "defun", "f", Operation::InsertBefore, "(g)");
        assert_eq!(out, "(a) ; about a\n\n(g)\n\n(defun f ())\n");
    }

    #[test]
    fn insert_after_goes_below_a_trailing_comment() {
        let out = edit(FILE, "defun", "inc", Operation::InsertAfter, "(defvar *step* 1)");
        assert_eq!(out, FILE.replace("; trailing\n", "; trailing\n\n(defvar *step* 1)\n"));
        let out = edit(FILE, "defun", "dec", Operation::InsertAfter, "(defvar *step* 1)");
        assert_eq!(out, format!("{FILE}\n(defvar *step* 1)\n"));
    }

    #[test]
    fn no_trailing_newline_stays_that_way() {
        let out = edit("(a)\n(defun f ())", "defun", "f", Operation::InsertAfter, "(g)\n");
        assert_eq!(out, "(a)\n(defun f ())\n\n(g)");
        let out = edit("(defun f ())", "defun", "f", Operation::InsertBefore, "(g)");
        assert_eq!(out, "(g)\n\n(defun f ())");
    }

    #[test]
    fn crlf_files_get_crlf() {
        let source = "(a)\r\n\r\n(defun f ()\r\n  1)\r\n";
        let out = edit(source, "defun", "f", Operation::InsertAfter, "(defun g ()\n  2)");
        assert_eq!(out, "(a)\r\n\r\n(defun f ()\r\n  1)\r\n\r\n(defun g ()\r\n  2)\r\n");
        let out = edit(source, "defun", "f", Operation::Replace, "(defun f ()\n  3)");
        assert_eq!(out, "(a)\r\n\r\n(defun f ()\r\n  3)\r\n");
        let out = edit("(defun f ()\n  1)\n", "defun", "f", Operation::Replace, "(defun f ()\r\n  3)");
        assert_eq!(out, "(defun f ()\n  3)\n");
    }

    #[test]
    fn the_bom_stays_first() {
        let out = edit("\u{feff}(defun f ())\n", "defun", "f", Operation::InsertBefore, "(g)");
        assert_eq!(out, "\u{feff}(g)\n\n(defun f ())\n");
    }

    #[test]
    fn reader_conditionals_stay_with_their_form() {
        let source = "#+sbcl\n(defun f () 1)\n";
        assert_eq!(edit(source, "defun", "f", Operation::Replace, "(defun f () 2)"), "#+sbcl\n(defun f () 2)\n");
        assert_eq!(edit(source, "defun", "f", Operation::InsertBefore, "(g)"), "(g)\n\n#+sbcl\n(defun f () 1)\n");
        assert_eq!(edit(source, "defun", "f", Operation::InsertAfter, "(g)"), "#+sbcl\n(defun f () 1)\n\n(g)\n");
    }

    #[test]
    fn forms_sharing_a_line() {
        let out = edit("(a) (defun f ()) (b)\n", "defun", "f", Operation::InsertAfter, "(g)");
        assert_eq!(out, "(a) (defun f ())\n\n(g)\n\n (b)\n");
        let out = edit("(a) (defun f ())\n", "defun", "f", Operation::InsertBefore, "(g)");
        assert_eq!(out, "(a) \n\n(g)\n\n(defun f ())\n");
    }

    #[test]
    fn verify_catches_content_running_into_its_neighbours() {
        assert!(verify(b"(a) foo(b)", 3, None).is_ok());
        assert!(matches!(verify(b"(a) foobar", 3, None), Err(EditError::Verify(_))));
        assert!(verify(b"(progn (a) (b))", 1, Some(3)).is_ok());
        assert!(matches!(verify(b"(progn (a)) (b)", 2, Some(4)), Err(EditError::Verify(_))));
    }

    #[test]
    fn nested_definitions_are_edited_in_place_and_indented() {
        let source = "#+sbcl\n(progn\n  ;; f\n  (defun f ()\n    1)\n  (defun g () 2))\n";
        let out = edit(source, "defun", "f", Operation::Replace, "(defun f ()\n  3)");
        assert_eq!(out, "#+sbcl\n(progn\n  ;; f\n  (defun f ()\n    3)\n  (defun g () 2))\n");
        let out = edit(source, "defun", "f", Operation::InsertBefore, "(defun e ()\n  0)");
        assert_eq!(
            out,
            "#+sbcl\n(progn\n\n  (defun e ()\n    0)\n\n  ;; f\n  (defun f ()\n    1)\n  (defun g () 2))\n"
        );
        let out = edit(source, "defun", "g", Operation::InsertAfter, "(defun h () 4)");
        assert_eq!(out, "#+sbcl\n(progn\n  ;; f\n  (defun f ()\n    1)\n  (defun g () 2)\n\n  (defun h () 4))\n");
        let eval_when = "(eval-when (:compile-toplevel :load-toplevel :execute)\n  (defun f () 1))\n";
        let out = edit(eval_when, "defun", "f", Operation::Replace, "(defun f () 2)");
        assert_eq!(out, "(eval-when (:compile-toplevel :load-toplevel :execute)\n  (defun f () 2))\n");
    }

    #[test]
    fn delete_keeps_the_blank_line_rhythm() {
        // Between two forms: one blank line stays.
        let out = edit(FILE, "defun", "inc", Operation::Delete, "");
        assert_eq!(out, "(in-package :app)\n\n;;; Section header\n\n(defun dec (x) (1- x))\n");
        // At the end: the blank lines above go too.
        let out = edit(FILE, "defun", "dec", Operation::Delete, "");
        assert_eq!(out, "(in-package :app)\n\n;;; Section header\n\n;; Adds one.\n;; Really.\n(defun inc (x)\n  (1+ x)) ; trivial\n".replace("trivial", "trailing"));
        // At the start, and a reader conditional goes with its form.
        let out = edit("#+sbcl\n(defun f ())\n\n(defun g ())\n", "defun", "f", Operation::Delete, "");
        assert_eq!(out, "(defun g ())\n");
        // Sharing a line.
        let out = edit("(a) (defun f ()) (b)\n", "defun", "f", Operation::Delete, "");
        assert_eq!(out, "(a) (b)\n");
        // The last form of a wrapper: its closing parenthesis moves up.
        let out = edit("(progn\n  (defun f ())\n  ;; g\n  (defun g ()))\n", "defun", "g", Operation::Delete, "");
        assert_eq!(out, "(progn\n  (defun f ()))\n");
        let out = edit("(progn\n  (defun f ())\n  (defun g ()))\n", "defun", "f", Operation::Delete, "");
        assert_eq!(out, "(progn\n  (defun g ()))\n");
    }

    #[test]
    fn deleting_what_insert_after_added_to_a_wrapper_restores_it() {
        for wrapper in [
            "(progn\n  (defun a ()\n    1))\n",
            "(eval-when (:compile-toplevel :load-toplevel :execute)\n  (defun a () 1))\n",
            "#+sbcl\n(progn\n  (defun a () 1))\r\n",
            "(progn\n  (defun a () 1)   )\n",
        ] {
            let added = edit(wrapper, "defun", "a", Operation::InsertAfter, "(defun b ()\n  2)");
            assert!(added.contains("(defun b ()"), "{added}");
            assert_eq!(edit(&added, "defun", "b", Operation::Delete, ""), wrapper);
        }
        // A line comment before the form keeps its line break, or the parenthesis would be in it.
        let out = edit("(progn\n  (a) ; note\n\n  (defun b ()))\n", "defun", "b", Operation::Delete, "");
        assert_eq!(out, "(progn\n  (a) ; note\n)\n");
        let out = edit("(progn\n  (defun b ()))\n", "defun", "b", Operation::Delete, "");
        assert_eq!(out, "(progn)\n");
    }
}
