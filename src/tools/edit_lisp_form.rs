//! `edit-lisp-form`: replace, delete, patch or insert next to one definition of a Lisp source
//! file (at top level, or inside a top-level `progn`, `eval-when` and the like), on the concrete
//! syntax tree (contract: `edit-lisp-form.ja.md`), or several such edits at once, applied all or
//! none. The edits run in this process; with `load`, the new forms are then loaded into the
//! image as `load-form` loads them.
//!
//! See docs/design.md, "The toolbox".

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::decode;
use super::load_form::{load_plan, Loaded};
use super::arguments::{arguments, ArgumentType, Kind};
use super::{
    file_limit, Arguments, Fingerprint, Preview, Previewing, Run, Tool, ToolContext, ToolDefinition,
    ToolError, ToolOutput, ToolResult,
};
use crate::image::{Entry, Request};
use crate::source::{prepare_edits, AllowedRoots, EditReport, EditRequest, FileEdit, LoadPlan, Operation, RemovedForm};

fn unknown_operation(operation: &Value) -> String {
    let names: Vec<String> = Operation::NAMES.iter().map(|name| format!("\"{name}\"")).collect();
    format!("Argument `operation` must be one of {}; got {operation}.", names.join(", "))
}

/// Public: the tests and benchmarks run it on files alone, with no server; only `load` needs an
/// image.
pub const TOOL: Tool = Tool {
    definition: ToolDefinition {
        name: "edit-lisp-form",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Edit a definition of a Lisp file (content: whole forms; patch: old_text, once in it, to \
            new_text; edits: several, all or none). Use it rather than rewriting files; load: true compiles the change \
            into the image.",
    },
    run: Run::Source { source: run, call: |context, args| Box::pin(call(context, args)) },
    preview: Some(Previewing::Files(preview)),
    looks_only: None,
};

/// One edit as the call gives it.
struct EditArguments {
    file_path: String,
    form_type: String,
    form_name: String,
    operation: Operation,
    content: String,
    old_text: String,
    index: Option<usize>,
    /// Whether its new forms are compiled into the image (a delete's form taken out of it).
    load: bool,
}

arguments! {
    /// The arguments as the tool reads them: one edit's fields, or `edits`. Which of them the call
    /// must give depends on which it gives, and is checked by [`edit_arguments`].
    struct Args {
        file_path: Option<String>,
        form_type: Option<String>,
        form_name: Option<String>,
        operation: Option<Operation> => explained(unknown_operation),
        content: Option<String> => code(),
        old_text: Option<String>,
        new_text: Option<String> => code(),
        index: Option<u64> => at_least(1).explained(super::index_from_one),
        edits: Option<Vec<Edit>>,
        dry_run: bool,
        load: Option<bool>,
        large_file: bool,
    }
}

arguments! {
    /// An element of `edits`: one edit, whose target and operation it must give. Its file, form
    /// type and `load`, when it leaves them out, are the call's: several edits of one file say its
    /// name once, as an agent first writes them.
    #[derive(Clone)]
    struct Edit {
        file_path: Option<String>,
        form_type: Option<String>,
        form_name: Option<String> => required(),
        operation: Option<Operation> => required().explained(unknown_operation),
        content: Option<String> => code(),
        old_text: Option<String>,
        new_text: Option<String> => code(),
        index: Option<u64> => at_least(1).explained(super::index_from_one),
        load: Option<bool>,
    }
}

/// An edit's operation, by the name a call gives it.
impl ArgumentType for Operation {
    const KIND: Kind = Kind::OneOf(&Operation::NAMES);

    fn read(value: &Value) -> Option<Self> {
        Operation::parse(value.as_str()?)
    }
}

/// A string argument the edit must give.
fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, ToolError> {
    value.as_deref().ok_or_else(|| ToolError::new(format!("Missing required argument `{name}` (a string).")))
}

impl EditArguments {
    /// The edit `edit` gives, taking the `file_path`, `form_type` and `load` it leaves out from
    /// `call` (the call's own arguments, which hold the edit when the call is the one edit).
    fn read(edit: &Edit, call: &Args) -> Result<Self, ToolError> {
        let inherited = |own: &Option<String>, call: &Option<String>, field| -> Result<String, ToolError> {
            Ok(match own {
                Some(text) => text.clone(),
                None => required(call, field)?.to_string(),
            })
        };
        let operation =
            edit.operation.ok_or_else(|| ToolError::new("Missing required argument `operation` (a string)."))?;
        let (content, old_text) = match operation {
            Operation::Patch => {
                if edit.content.is_some() {
                    return Err(ToolError::new(
                        "`patch` takes `old_text` and `new_text`, not `content`; `replace` takes `content`.",
                    ));
                }
                (required(&edit.new_text, "new_text")?, required(&edit.old_text, "old_text")?)
            }
            Operation::Delete => (edit.content.as_deref().unwrap_or_default(), ""),
            _ => (required(&edit.content, "content")?, ""),
        };
        if operation != Operation::Patch {
            for (field, given) in [("old_text", &edit.old_text), ("new_text", &edit.new_text)] {
                if given.is_some() {
                    return Err(ToolError::new(format!(
                        "`{field}` goes with `operation: \"patch\"`; `{}` takes `content`.",
                        operation.name()
                    )));
                }
            }
        }
        Ok(EditArguments {
            file_path: inherited(&edit.file_path, &call.file_path, "file_path")?,
            form_type: inherited(&edit.form_type, &call.form_type, "form_type")?,
            form_name: required(&edit.form_name, "form_name")?.to_string(),
            operation,
            content: content.to_string(),
            old_text: old_text.to_string(),
            index: edit.index.and_then(|i| usize::try_from(i).ok()),
            load: edit.load.or(call.load).unwrap_or(false),
        })
    }

    fn request(&self) -> FileEdit<'_> {
        FileEdit {
            path: Path::new(&self.file_path),
            request: EditRequest {
                form_type: &self.form_type,
                form_name: &self.form_name,
                operation: self.operation,
                content: &self.content,
                old_text: &self.old_text,
                index: self.index,
            },
        }
    }
}

/// The edits a call asks for: its `edits`, or itself.
fn edit_arguments(call: &Args) -> Result<Vec<EditArguments>, ToolError> {
    let Some(edits) = &call.edits else {
        let edit = Edit {
            file_path: call.file_path.clone(),
            form_type: call.form_type.clone(),
            form_name: call.form_name.clone(),
            operation: call.operation,
            content: call.content.clone(),
            old_text: call.old_text.clone(),
            new_text: call.new_text.clone(),
            index: call.index,
            load: call.load,
        };
        return Ok(vec![EditArguments::read(&edit, call)?]);
    };
    let single = [
        ("form_name", call.form_name.is_some()),
        ("operation", call.operation.is_some()),
        ("content", call.content.is_some()),
        ("old_text", call.old_text.is_some()),
        ("new_text", call.new_text.is_some()),
        ("index", call.index.is_some()),
    ];
    if let Some((field, _)) = single.iter().find(|(_, given)| *given) {
        return Err(ToolError::new(format!(
            "Give one edit's fields or `edits`, not both: `{field}` belongs in an element of `edits`."
        )));
    }
    if edits.is_empty() {
        return Err(ToolError::new("`edits` is empty: give at least one edit."));
    }
    edits
        .iter()
        .enumerate()
        .map(|(i, edit)| {
            EditArguments::read(edit, call)
                .map_err(|error| ToolError::new(format!("Edit {} of {}: {}", i + 1, edits.len(), error.0)))
        })
        .collect()
}

/// What the edits did, for the reply and for loading their forms.
struct Edited {
    /// The fingerprint of the files as they were read, and their names.
    read: (Fingerprint, String),
    reports: Vec<EditReport>,
    /// Whether each report's edit goes into the image, in the order of `reports`.
    load: Vec<bool>,
    /// Each file edited: its real path, its name in messages, its new text, and where in it the
    /// forms the edits wrote are.
    files: Vec<EditedFile>,
    text: String,
    structured: Value,
}

struct EditedFile {
    path: PathBuf,
    shown: String,
    text: Vec<u8>,
    spans: Vec<std::ops::Range<usize>>,
    /// When the file written was last modified, for the image to record (it never opens the file).
    modified: Option<SystemTime>,
}

/// How the edits are made: only shown (`said` as a dry run's reply or as the human approving them
/// is shown them), or written (and then only on the files as the human who `approved` them saw
/// them, if anyone did); with `for_load`, with what loading the forms of the edits that load
/// needs (each file's new text: a copy of the whole file).
struct Making {
    said: Said,
    for_load: bool,
    approved: Option<Fingerprint>,
}

/// Makes the edits `args` ask for, all or none, as `making` says.
fn edit(args: &Arguments, roots: &AllowedRoots, making: Making) -> Result<Edited, ToolError> {
    let Making { said, for_load, approved } = making;
    let dry_run = said != Said::Done;
    let asked: Args = args.typed()?;
    let edits = edit_arguments(&asked)?;
    let requests: Vec<FileEdit> = edits.iter().map(EditArguments::request).collect();
    let prepared = prepare_edits(roots, &requests, file_limit(asked.large_file)).map_err(|refused| {
        if edits.len() == 1 {
            return ToolError::from(refused.error);
        }
        let edit = &edits[refused.edit];
        ToolError::new(format!(
            "Edit {} of {} (`{} {}` in {}) was refused: {}\nNo file was written: the edits are applied all or none.",
            refused.edit + 1,
            edits.len(),
            edit.form_type,
            edit.form_name,
            edit.file_path,
            refused.error
        ))
    })?;
    let read = Fingerprint::of_all(prepared.read_files().map(|(_, bytes)| bytes));
    let names: Vec<String> = prepared.read_files().map(|(shown, _)| format!("`{shown}`")).collect();
    let names = names.join(" or ");
    Fingerprint::check_read(approved, "edit-lisp-form", &names, read)?;
    let mut files: Vec<EditedFile> = Vec::new();
    if for_load {
        for ((report, path, text), _) in prepared.edits().zip(&edits).filter(|(_, edit)| edit.load) {
            let file = match files.iter_mut().position(|file| file.path == path) {
                Some(file) => file,
                None => {
                    files.push(EditedFile {
                        path: path.to_path_buf(),
                        shown: report.file.clone(),
                        text: Vec::new(),
                        spans: Vec::new(),
                        modified: None,
                    });
                    files.len() - 1
                }
            };
            // Every edit of a file comes with the text all of them leave.
            files[file].text = text.to_vec();
            if report.removed.is_none() && !report.new_span.is_empty() {
                files[file].spans.push(report.new_span.clone());
            }
        }
    }
    let reports = if dry_run {
        prepared.edits().map(|(report, ..)| report.clone()).collect()
    } else {
        prepared.commit().map_err(|(file, error)| match edits.len() {
            1 => ToolError::from(error),
            _ => ToolError::new(format!("Writing {file} failed: {error} No file was written.")),
        })?
    };
    for file in &mut files {
        file.modified = roots.open(&file.path).ok().and_then(|opened| opened.metadata.modified().ok());
    }
    let texts: Vec<String> = reports.iter().map(|report| edit_text(report, said)).collect();
    let structured = match reports.as_slice() {
        [report] => structured(report, dry_run),
        reports => json!({"edits": reports.iter().map(|report| structured(report, dry_run)).collect::<Vec<_>>()}),
    };
    let load = edits.iter().map(|edit| edit.load).collect();
    Ok(Edited { read: (read, names), text: texts.join("\n\n"), reports, load, files, structured })
}

/// What the human approving the edits is shown: what approving does (write them, and load them
/// into the image with `load`), then each edit with its diff.
fn preview(args: &Arguments, roots: &AllowedRoots) -> Result<Preview, ToolError> {
    let edited = edit(args, roots, Making { said: Said::Approval, for_load: false, approved: None })?;
    let asked: Args = args.typed()?;
    let edits = edit_arguments(&asked)?;
    let (this, it) = if edits.len() == 1 { ("this edit", "it") } else { ("these edits", "them") };
    let approving = if asked.dry_run {
        format!("Approving only shows {this} (dry_run: true): nothing is written.")
    } else if edits.iter().all(|edit| edit.load) {
        format!("Approving writes {this} to the file and loads {it} into the image (load: true).")
    } else if edits.iter().any(|edit| edit.load) {
        format!("Approving writes {this} to the files, and loads those with load: true into the image.")
    } else {
        format!("Approving writes {this} to the file; nothing is loaded into the image (load: false).")
    };
    Ok(Preview { text: format!("{approving}\n\n{}", edited.text), fingerprint: Some(edited.read) })
}

/// What one edit did (or would do), and its diff.
fn edit_text(report: &EditReport, said: Said) -> String {
    let summary = match (report.changed_again, report.operation) {
        (false, _) => summary(report, said),
        (true, Operation::Patch) => format!("{} (a later edit of this batch changed it again)", summary(report, said)),
        (true, _) => format!("{}; a later edit of this batch changed it again.", summary(report, said).trim_end_matches('.')),
    };
    if report.diff.is_empty() {
        let end = if report.operation == Operation::Patch { "." } else { "" };
        format!("{summary}{end} The file already reads exactly so; nothing changed.")
    } else if report.operation == Operation::Patch && said == Said::Done {
        format!("{summary}{}", patched_lines(&report.diff, report.lines_moved))
    } else if report.operation == Operation::Patch {
        format!("{summary}:\n{}", report.diff.trim_end())
    } else {
        format!("{summary}\n\n{}", report.diff)
    }
}

/// Where a patch that was made left its lines, from its compact diff: `, line 251 now:` and the
/// line as it reads now, without its indentation. Not the lines it replaced, which the agent
/// quoted in `old_text`; a dry run or a preview shows the whole diff. Later edits of its batch
/// moved its lines by `lines_moved`, which the diff of the patch alone does not know.
fn patched_lines(diff: &str, lines_moved: isize) -> String {
    let mut out = String::new();
    for line in diff.lines() {
        if let Some(ranges) = line.strip_prefix("@@ -").and_then(|rest| rest.strip_suffix(" @@")) {
            let (old, new) = ranges.split_once(" +").unwrap_or((ranges, ranges));
            let span = |range: &str| -> (usize, usize) {
                let (first, count) = range.split_once(',').unwrap_or((range, "1"));
                (first.parse().unwrap_or(0), count.parse().unwrap_or(1))
            };
            let ((old_first, old_count), (new_first, new_count)) = (span(old), span(new));
            let (old_first, new_first) =
                (old_first.saturating_add_signed(lines_moved), new_first.saturating_add_signed(lines_moved));
            let lines = |first: usize, count: usize| match count {
                1 => format!("line {first}"),
                _ => format!("lines {first}-{}", first + count - 1),
            };
            // A patch's region can hold lines it left alone, which part it into several hunks.
            out.push_str(if out.is_empty() { ", " } else { "\n" });
            out.push_str(&match new_count {
                0 => format!("{} taken out.", lines(old_first, old_count)),
                _ => format!("{} now:", lines(new_first, new_count)),
            });
        } else if let Some(added) = line.strip_prefix('+') {
            out.push('\n');
            out.push_str(added.trim());
        }
    }
    out
}

/// The edits alone, as a source tool runs them (what the server runs when there is nothing to
/// load).
fn run(args: &Arguments, roots: &AllowedRoots) -> ToolResult {
    edit_alone(args, roots, None)
}

/// Whether the call compiles any of its edits into the image: some edit loads, and it is no dry run.
fn loads(args: &Arguments) -> Result<bool, ToolError> {
    let asked: Args = args.typed()?;
    Ok(!asked.dry_run && edit_arguments(&asked)?.iter().any(|edit| edit.load))
}

fn edit_alone(args: &Arguments, roots: &AllowedRoots, approved: Option<Fingerprint>) -> ToolResult {
    if loads(args)? {
        return Err(ToolError::new("`load: true` needs the image: call edit-lisp-form through the server."));
    }
    let said = if args.typed::<Args>()?.dry_run { Said::DryRun } else { Said::Done };
    let edited = edit(args, roots, Making { said, for_load: false, approved })?;
    Ok(ToolOutput::success(edited.text).with_structured(edited.structured))
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let (owned, approved) = (args.clone(), context.approved);
    if !loads(args)? {
        return context.on_files(move |roots| edit_alone(&owned, roots, approved)).await;
    }
    let making = Making { said: Said::Done, for_load: true, approved };
    let Edited { reports, load, files, text, mut structured, .. } =
        context.on_files(move |roots| edit(&owned, roots, making)).await?;
    let mut sections = vec![text];
    let mut loads = Vec::new();
    let mut failed = false;
    let loaded = reports.iter().zip(load).filter_map(|(report, load)| load.then_some(report));
    for removed in loaded.filter_map(|report| report.removed.as_ref()) {
        match unload(context, args, removed).await {
            Ok(note) => {
                loads.push(json!({ "note": note }));
                sections.push(note);
            }
            Err(error) => {
                sections.push(format!(
                    "The file was edited, but removing the definition from the image failed:\n{}",
                    error.0
                ));
                failed = true;
            }
        }
    }
    let one_file = reports.iter().all(|report| report.file == reports[0].file);
    for file in files.iter().filter(|file| !file.spans.is_empty()) {
        let plan = LoadPlan::for_spans(&file.text, &file.spans).map_err(ToolError::new)?;
        if plan.targets.is_empty() {
            sections.push(format!("Nothing to load from {}: the new text holds no form.", file.shown));
            continue;
        }
        match load_plan(context, args, (&file.path, &file.shown), file.modified, &plan).await {
            Ok(loaded) => {
                let (text, load_failed, load) = loaded.render(&file.shown, &plan, Loaded::Edited { one_file });
                sections.push(text);
                loads.push(load);
                failed |= load_failed;
            }
            Err(error) => {
                sections.push(format!(
                    "The file was edited, but loading the new forms into the image failed:\n{}",
                    error.0
                ));
                failed = true;
            }
        }
    }
    structured["load"] = match loads.as_slice() {
        [one] => one.clone(),
        _ => Value::Array(loads),
    };
    Ok(ToolOutput::new(sections.join("\n\n"), failed).with_structured(structured))
}

/// Removes a deleted definition from the image; the note says what happened to it.
async fn unload(context: &ToolContext, args: &Arguments, removed: &RemovedForm) -> Result<String, ToolError> {
    let request =
        Request::new(Entry::UNLOAD_DEFINITION).arg(removed.text.as_str()).key("package", removed.package.as_deref());
    let reply = context.call_helper(args, request).await?;
    Ok(decode::<Unloaded>("unload-definition", &reply)?.note)
}

/// The helper's answer to `unload-definition`.
#[derive(Deserialize)]
struct Unloaded {
    note: String,
}

/// How an edit's text speaks of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    /// Made: the file was written.
    Done,
    /// A dry run's reply: nothing was written.
    DryRun,
    /// The preview a human approves: what approving writes, which the preview's first line says.
    Approval,
}

/// One line saying what was (or would be) done, where.
fn summary(report: &EditReport, said: Said) -> String {
    let file = &report.file;
    let forms = match report.forms {
        1 => "1 form".to_string(),
        n => format!("{n} forms"),
    };
    let target = format!("`{}` ({})", report.target, report.target_lines);
    let (replace, insert, delete, patch, now) = match said {
        Said::Done => ("Replaced".into(), "Inserted".into(), "Deleted".into(), "Patched".into(), "now "),
        Said::DryRun | Said::Approval => {
            let would = if said == Said::DryRun { "Dry run, nothing written: would" } else { "Would" };
            let verb = |verb: &str| format!("{would} {verb}");
            (verb("replace"), verb("insert"), verb("delete"), verb("patch"), "")
        }
    };
    let new_lines = report.new_lines;
    match report.operation {
        Operation::Replace => format!("{replace} {target} in {file} with {forms}, {now}at {new_lines}."),
        Operation::InsertBefore => format!("{insert} {forms} before {target} in {file}, {now}at {new_lines}."),
        Operation::InsertAfter => format!("{insert} {forms} after {target} in {file}, {now}at {new_lines}."),
        Operation::Delete => format!("{delete} {target} from {file}."),
        Operation::Patch if said == Said::Done => format!("{patch} `{}` in {file}", report.target),
        Operation::Patch => format!("{patch} {target} in {file}"),
    }
}

fn structured(report: &EditReport, dry_run: bool) -> Value {
    json!({
        "file": report.file,
        "operation": report.operation.name(),
        "target": report.target,
        "target_lines": [report.target_lines.first, report.target_lines.last],
        "new_lines": [report.new_lines.first, report.new_lines.last],
        "forms": report.forms,
        "written": !dry_run && !report.diff.is_empty(),
        "diff": report.diff,
    })
}

#[cfg(test)]
mod tests {
    use super::patched_lines;

    fn patched_lines_alone(diff: &str) -> String {
        patched_lines(diff, 0)
    }

    #[test]
    fn a_made_patch_tells_the_lines_it_left_or_took_out() {
        assert_eq!(patched_lines_alone("@@ -251 +251 @@\n-  (string= a b))\n+  (string-equal a b))\n"), ", line 251 now:\n(string-equal a b))");
        assert_eq!(patched_lines_alone("@@ -7 +7,2 @@\n-(f)\n+(f\n+ x)\n"), ", lines 7-8 now:\n(f\nx)");
        assert_eq!(patched_lines_alone("@@ -5,2 +4,0 @@\n-  (a)\n-  (b)\n"), ", lines 5-6 taken out.");
        assert_eq!(
            patched_lines_alone("@@ -5 +5 @@\n-  (a 1)\n+  (a 2)\n@@ -7 +7 @@\n-  (c 1)\n+  (c 2)\n"),
            ", line 5 now:\n(a 2)\nline 7 now:\n(c 2)"
        );
        assert_eq!(
            patched_lines_alone("@@ -3 +3 @@\n-(g)\n\\ No newline at end of file\n+(h)\n\\ No newline at end of file\n"),
            ", line 3 now:\n(h)"
        );
        // Later edits of its batch took two lines out above it.
        assert_eq!(patched_lines("@@ -102 +102 @@\n-(a 1)\n+(a 2)\n", -2), ", line 100 now:\n(a 2)");
    }
}
