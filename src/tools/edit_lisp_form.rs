//! `edit-lisp-form`: replace one top-level form of a Lisp source file, or insert forms next to
//! it, on the concrete syntax tree (contract: `edit-lisp-form.ja.md`). Runs in this process; no
//! image is needed.

use std::path::Path;

use serde_json::{json, Value};

use super::{
    large_file_schema, read_limit, Annotations, Arguments, Run, Tool, ToolDefinition, ToolError, ToolOutput, ToolResult,
};
use crate::source::{prepare_edit, AllowedRoots, EditReport, EditRequest, Operation};

/// The tool's `tools/list` entry: name, description, schemas and annotations.
pub fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "edit-lisp-form",
        title: "Edit a Lisp definition",
        description:
            "Structurally edit one top-level form (defun, defmacro, defvar, defclass, defmethod, defpackage, ...) \
of a Common Lisp source file: replace it, or insert new forms just before or after it. The form is found by its \
operator and name, not by line numbers; only its bytes change, so comments, indentation and every other form stay \
exactly as they were, and `content` that does not read as complete Lisp forms is rejected without touching the file. \
Prefer this over rewriting whole files or text substitution whenever you change Lisp source. Run `lisp-outline` first \
to see the file's forms and their names. Returns a unified diff of the change; `dry_run` previews it without writing.",
        input_schema: json!({
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "The Lisp source file to edit: absolute, or relative to the server's first --root \
        directory (by default its working directory). It must lie under an allowed root."
                },
                "form_type": {
                    "type": "string",
                    "description": "The form's operator, e.g. \"defun\", \"defmacro\", \"defvar\", \"defclass\", \
        \"defmethod\", \"defpackage\", \"asdf:defsystem\". Case and package prefix do not matter."
                },
                "form_name": {
                    "type": "string",
                    "description": "The name the form defines: \"foo\", \"(setf foo)\", a package or system name as \
        \"my-pkg\", \":my-pkg\", \"#:my-pkg\" or \"\\\"MY-PKG\\\"\". For defmethod: \"name [qualifiers] (specializers)\", \
        e.g. \"draw ((s circle))\", \"draw (circle)\", \"area :around (shape)\", \"print-object (my-class t)\", \
        \"handle ((eql :quit))\"; a bare name matches all its methods. `lisp-outline` shows each form's name in this form."
                },
                "operation": {
                    "type": "string",
                    "enum": Operation::NAMES,
                    "description": "replace: swap the form for `content`. insert_before: put `content` above the \
        form and above the comment lines directly attached to it. insert_after: put `content` below the form. Inserted \
        forms are separated by one blank line."
                },
                "content": {
                    "type": "string",
                    "description": "Complete Lisp code: one or more whole top-level forms, with their own comments \
        if wanted. It is read before the file is touched; line endings are converted to the file's."
                },
                "index": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "When several forms match, which one: its 1-based position among the matches in \
        file order. The error for an ambiguous match lists them."
                },
                "dry_run": {
                    "type": "boolean",
                    "default": false,
                    "description": "Only return the diff; write nothing."
                },
                "large_file": large_file_schema()
            },
            "required": ["file_path", "form_type", "form_name", "operation", "content"],
            "additionalProperties": false
        }),
        output_schema: Some(json!({
            "type": "object",
            "properties": {
                "file": {"type": "string"},
                "operation": {"type": "string", "enum": Operation::NAMES},
                "target": {"type": "string", "description": "The form the edit was anchored on."},
                "target_lines": {"type": "array", "items": {"type": "integer"}, "description": "Its first and last line before the edit."},
                "new_lines": {"type": "array", "items": {"type": "integer"}, "description": "First and last line of the new form(s) after the edit."},
                "forms": {"type": "integer", "description": "How many forms `content` held."},
                "written": {"type": "boolean"},
                "diff": {"type": "string"}
            },
            "required": ["file", "operation", "target", "target_lines", "new_lines", "forms", "written", "diff"]
        })),
        annotations: Annotations { read_only: false, destructive: true, idempotent: false, open_world: false },
    }
}

/// The tool, for the table in `tools/mod.rs`.
pub const TOOL: Tool = Tool { definition, run: Run::Source(run) };

fn run(args: &Arguments, roots: &AllowedRoots) -> ToolResult {
    let file_path = args.required_str("file_path")?;
    let operation = args.required_str("operation")?;
    let operation = Operation::parse(operation).ok_or_else(|| {
        let names: Vec<String> = Operation::NAMES.iter().map(|name| format!("\"{name}\"")).collect();
        ToolError::new(format!("Argument `operation` must be one of {}; got \"{operation}\".", names.join(", ")))
    })?;
    let request = EditRequest {
        form_type: args.required_str("form_type")?,
        form_name: args.required_str("form_name")?,
        operation,
        content: args.required_str("content")?,
        index: match args.optional_u64("index", u64::from(u32::MAX))? {
            Some(0) => return Err(ToolError::new("Argument `index` is 1-based: use 1 for the first match.")),
            index => index.and_then(|i| usize::try_from(i).ok()),
        },
    };
    let dry_run = args.optional_bool("dry_run")?.unwrap_or(false);

    let prepared = prepare_edit(roots, Path::new(file_path), read_limit(args)?, &request)?;
    let shown = prepared.shown().to_string();
    let report = if dry_run { prepared.report().clone() } else { prepared.commit()? };
    let text = if report.diff.is_empty() {
        format!("{} The file already reads exactly so; nothing changed.", summary(&report, &shown, dry_run))
    } else {
        format!("{}\n\n{}", summary(&report, &shown, dry_run), report.diff)
    };
    Ok(ToolOutput::success(text).with_structured(structured(&report, &shown, dry_run)))
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
