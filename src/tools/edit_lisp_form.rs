//! `edit-lisp-form`: replace, delete or insert next to one definition of a Lisp source file (at
//! top level, or inside a top-level `progn`, `eval-when` and the like), on the concrete syntax
//! tree (contract: `edit-lisp-form.ja.md`). The edit runs in this process; with `load`, the new
//! forms are then loaded into the image as `load-form` loads them.
//!
//! See docs/design.md, "The toolbox".

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::decode;
use super::load_form::load_plan;
use super::{
    read_limit, Annotations, Arguments, Fingerprint, Param, Preview, Run, Tool, ToolContext, ToolDefinition, ToolError,
    ToolOutput, ToolResult, FORM_INDEX, LARGE_FILE_ARGUMENT,
};
use crate::image::Request;
use crate::source::{prepare_edit, AllowedRoots, EditReport, EditRequest, LoadPlan, Operation, PreparedEdit};

/// The arguments: the schema and the checks.
const ARGUMENTS: &[Param] = &[
    Param::text("file_path", "Absolute, or relative to the first --root.").required(),
    Param::text("form_type", "The operator, e.g. \"defun\" (case and package prefix ignored).").required(),
    Param::text(
        "form_name",
        "As lisp-outline shows it: \"foo\", \"(setf foo)\"; a method as \"name [qualifiers] (specializers)\", e.g. \"area :around (shape)\"; a bare name matches all its methods.",
    )
    .required(),
    Param::one_of(
        "operation",
        &Operation::NAMES,
        "insert_before and insert_after put content beside the form and its attached comments; delete removes it with them.",
    )
    .required()
    .explained(unknown_operation),
    Param::text("content", "Whole top-level form(s); not for delete."),
    FORM_INDEX,
    Param::flag("dry_run", "Return the diff; write and load nothing."),
    Param::flag("load", "Compile the change into the image as load-form does (delete: remove the definition)."),
    LARGE_FILE_ARGUMENT,
];

fn unknown_operation(operation: &Value) -> String {
    let names: Vec<String> = Operation::NAMES.iter().map(|name| format!("\"{name}\"")).collect();
    format!("Argument `operation` must be one of {}; got {operation}.", names.join(", "))
}

/// The tool's `tools/list` entry: name, description, schemas and annotations.
pub fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "edit-lisp-form",
        title: "Edit a Lisp definition",
        description:
            "Structurally edit one definition (defun, defmacro, defclass, defmethod, ...) of a Lisp source file: \
            replace, delete, or insert forms beside it. Prefer it to rewriting files or text substitution: the form \
            is found by operator and name, only its text changes, and content that does not read is refused. Returns \
            the diff; load: true also compiles the change into the image.",
        arguments: ARGUMENTS,
        annotations: Annotations { read_only: false, destructive: true, idempotent: false, open_world: true },
    }
}

/// The tool, for the table in `tools/mod.rs`. Only `load` contacts an image.
pub const TOOL: Tool = Tool {
    definition,
    run: Run::Source { source: run, call: |context, args| Box::pin(call(context, args)), image_argument: true },
    preview: Some(preview),
};

/// What the edit left for the load: the file's real path and new text, and the edit's report.
struct Edited {
    shown: String,
    path: PathBuf,
    new_text: Vec<u8>,
    /// When the file written was last modified, for the image to record (it never opens the file).
    modified: Option<SystemTime>,
    report: EditReport,
}

/// The edit `args` ask for, computed on the file as it is now; nothing is written.
fn prepare(args: &Arguments, roots: &AllowedRoots) -> Result<PreparedEdit, ToolError> {
    let file_path = args.required_str("file_path")?;
    let operation = args.required_str("operation")?;
    let operation = Operation::parse(operation).ok_or_else(|| ToolError(unknown_operation(&operation.into())))?;
    let content = match (operation, args.optional_str("content")?) {
        (Operation::Delete, content) => content.unwrap_or_default(),
        (_, Some(content)) => content,
        (_, None) => args.required_str("content")?,
    };
    let request = EditRequest {
        form_type: args.required_str("form_type")?,
        form_name: args.required_str("form_name")?,
        operation,
        content,
        index: args.optional_u64("index")?.and_then(|i| usize::try_from(i).ok()),
    };
    Ok(prepare_edit(roots, Path::new(file_path), read_limit(args)?, &request)?)
}

/// Edits the file as `args` say, writing nothing for a dry run, and only if it still reads as it
/// did for the preview the human `approved`: what a load needs next (the new text only when
/// `for_load`: it is a copy of the whole file), the reply's text and its structured facts.
fn edit(
    args: &Arguments,
    roots: &AllowedRoots,
    for_load: bool,
    approved: Option<Fingerprint>,
) -> Result<(Edited, String, Value), ToolError> {
    let dry_run = args.flag("dry_run")?;
    let prepared = prepare(args, roots)?;
    Fingerprint::check(approved, "edit-lisp-form", &format!("`{}`", prepared.shown()), prepared.old_text())?;
    finish(prepared, roots, dry_run, for_load)
}

/// Writes `prepared`, unless `dry_run`.
fn finish(
    prepared: PreparedEdit,
    roots: &AllowedRoots,
    dry_run: bool,
    for_load: bool,
) -> Result<(Edited, String, Value), ToolError> {
    let shown = prepared.shown().to_string();
    let path = prepared.path().to_path_buf();
    let new_text = if for_load { prepared.new_text().to_vec() } else { Vec::new() };
    let report = if dry_run { prepared.report().clone() } else { prepared.commit()? };
    let modified = if for_load { roots.open(&path).ok().and_then(|file| file.metadata.modified().ok()) } else { None };
    let text = if report.diff.is_empty() {
        format!("{} The file already reads exactly so; nothing changed.", summary(&report, &shown, dry_run))
    } else {
        format!("{}\n\n{}", summary(&report, &shown, dry_run), report.diff)
    };
    let structured = structured(&report, &shown, dry_run);
    Ok((Edited { shown, path, new_text, modified, report }, text, structured))
}

/// What the human approving the edit is shown: its dry run, with the diff.
fn preview(args: &Arguments, roots: &AllowedRoots) -> Result<Preview, ToolError> {
    let prepared = prepare(args, roots)?;
    let fingerprint = Fingerprint::of(prepared.old_text());
    let (_, text, _) = finish(prepared, roots, true, false)?;
    Ok(Preview { text, fingerprint: Some(fingerprint) })
}

/// The edit alone, as a source tool runs it (what the server runs when there is nothing to
/// load).
fn run(args: &Arguments, roots: &AllowedRoots) -> ToolResult {
    edit_alone(args, roots, None)
}

fn edit_alone(args: &Arguments, roots: &AllowedRoots, approved: Option<Fingerprint>) -> ToolResult {
    if args.flag("load")? && !args.flag("dry_run")? {
        return Err(ToolError::new("`load: true` needs the image: call edit-lisp-form through the server."));
    }
    let (_, text, structured) = edit(args, roots, false, approved)?;
    Ok(ToolOutput::success(text).with_structured(structured))
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let load = args.flag("load")? && !args.flag("dry_run")?;
    let (owned, approved) = (args.clone(), context.approved);
    if !load {
        return context.on_files(move |roots| edit_alone(&owned, roots, approved)).await;
    }
    let (edited, text, mut structured) = context.on_files(move |roots| edit(&owned, roots, true, approved)).await?;
    let Edited { shown, path, new_text, modified, report } = edited;
    if let Some(removed) = &report.removed {
        let request =
            Request::new("unload-definition").arg(removed.text.as_str()).key("package", removed.package.as_deref());
        let reply = context.call_helper(args, request).await;
        let note = match reply.and_then(|reply| decode::<Unloaded>("unload-definition", &reply)) {
            Ok(unloaded) => unloaded.note,
            Err(error) => {
                return Ok(ToolOutput::error(format!(
                    "{text}\n\nThe file was edited, but removing the definition from the image failed:\n{}",
                    error.0
                ))
                .with_structured(structured))
            }
        };
        structured["load"] = json!({ "note": note });
        return Ok(ToolOutput::success(format!("{text}\n\n{note}")).with_structured(structured));
    }
    let plan = LoadPlan::for_span(&new_text, report.new_span.clone()).map_err(ToolError::new)?;
    if plan.targets.is_empty() {
        return Ok(ToolOutput::success(format!("{text}\n\nNothing to load: the new text holds no form."))
            .with_structured(structured));
    }
    let loaded = match load_plan(context, args, &path, modified, &plan).await {
        Ok(loaded) => loaded,
        Err(error) => {
            return Ok(ToolOutput::error(format!(
                "{text}\n\nThe file was edited, but loading the new forms into the image failed:\n{}",
                error.0
            ))
            .with_structured(structured))
        }
    };
    let (text, failed, load) = loaded.render(&shown, &plan, Some(text));
    structured["load"] = load;
    Ok(ToolOutput::new(text, failed).with_structured(structured))
}

/// The helper's answer to `unload-definition`.
#[derive(Deserialize)]
struct Unloaded {
    note: String,
}

/// One line saying what was (or would be) done, where.
fn summary(report: &EditReport, file: &str, dry_run: bool) -> String {
    let forms = match report.forms {
        1 => "1 form".to_string(),
        n => format!("{n} forms"),
    };
    let target = format!("`{}` ({})", report.target, report.target_lines);
    let (replace, insert, now) = if dry_run {
        ("Dry run, nothing written: would replace", "Dry run, nothing written: would insert", "")
    } else {
        ("Replaced", "Inserted", "now ")
    };
    let new_lines = report.new_lines;
    match report.operation {
        Operation::Replace => format!("{replace} {target} in {file} with {forms}, {now}at {new_lines}."),
        Operation::InsertBefore => format!("{insert} {forms} before {target} in {file}, {now}at {new_lines}."),
        Operation::InsertAfter => format!("{insert} {forms} after {target} in {file}, {now}at {new_lines}."),
        Operation::Delete if dry_run => format!("Dry run, nothing written: would delete {target} from {file}."),
        Operation::Delete => format!("Deleted {target} from {file}."),
    }
}

fn structured(report: &EditReport, file: &str, dry_run: bool) -> Value {
    json!({
        "file": file,
        "operation": report.operation.name(),
        "target": report.target,
        "target_lines": [report.target_lines.first, report.target_lines.last],
        "new_lines": [report.new_lines.first, report.new_lines.last],
        "forms": report.forms,
        "written": !dry_run && !report.diff.is_empty(),
        "diff": report.diff,
    })
}
