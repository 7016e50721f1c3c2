//! `lisp-outline`: a compact map of a Lisp source file's top-level forms, one line each, read
//! from the source CST in this process.

use std::path::Path;

use serde_json::json;

use super::{
    large_file_schema, read_limit, Annotations, Arguments, Run, Tool, ToolDefinition, ToolError, ToolOutput, ToolResult,
};
use crate::source::{line_count, outline, AllowedRoots, Cst};

/// The tool's `tools/list` entry: name, description, schemas and annotations.
pub fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "lisp-outline",
        title: "Outline a Lisp file",
        description: "List the top-level forms of a Common Lisp source file, one line each: line range, reader \
conditional if any, operator and name (for methods with qualifiers and specializers). Much shorter than the file \
itself: read it before editing to find a definition, then pass its operator and name to `edit-lisp-form`.",
        input_schema: json!({
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "The Lisp source file: absolute, or relative to the server's first --root \
        directory (by default its working directory). It must lie under an allowed root."
                },
                "large_file": large_file_schema()
            },
            "required": ["file_path"],
            "additionalProperties": false
        }),
        output_schema: Some(json!({
            "type": "object",
            "properties": {
                "file": {"type": "string"},
                "lines": {"type": "integer"},
                "forms": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "first_line": {"type": "integer"},
                            "last_line": {"type": "integer"},
                            "conditions": {"type": "string", "description": "Reader conditionals in front, e.g. \"#+sbcl\"."},
                            "operator": {"type": ["string", "null"]},
                            "name": {"type": ["string", "null"], "description": "As `edit-lisp-form` takes it in `form_name`."}
                        },
                        "required": ["first_line", "last_line", "conditions", "operator", "name"]
                    }
                }
            },
            "required": ["file", "lines", "forms"]
        })),
        annotations: Annotations { read_only: true, destructive: false, idempotent: true, open_world: false },
    }
}

/// The tool, for the table in `tools/mod.rs`.
pub const TOOL: Tool = Tool { definition, run: Run::Source(run) };

fn run(args: &Arguments, roots: &AllowedRoots) -> ToolResult {
    let file = roots.read(Path::new(args.required_str("file_path")?), read_limit(args)?)?;
    let cst = Cst::parse(&file.bytes).map_err(|e| {
        ToolError::new(format!(
            "`{}` does not read as Lisp: {e}. Fix that first (`lisp-check-parens` shows where).",
            file.shown
        ))
    })?;
    let entries = outline(&cst);
    let lines = line_count(&file.bytes);
    let plural = if entries.len() == 1 { "" } else { "s" };
    let mut text = format!("{}: {} top-level form{plural}, {lines} lines\n", file.shown, entries.len());
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
        text.push_str(&format!("{range:<width$}  {conditions}{}\n", entry.description));
    }
    let forms: Vec<_> = entries
        .iter()
        .map(|e| {
            json!({
                "first_line": e.lines.first,
                "last_line": e.lines.last,
                "conditions": e.conditions,
                "operator": e.operator,
                "name": e.name,
            })
        })
        .collect();
    Ok(ToolOutput::success(text.trim_end().to_string())
        .with_structured(json!({"file": file.shown, "lines": lines, "forms": forms})))
}
