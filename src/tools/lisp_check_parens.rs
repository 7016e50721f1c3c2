//! `lisp-check-parens`: whether Lisp text reads as complete forms, and if not, where the first
//! problem is and which opener it belongs to. Runs in this process on the source CST.

use std::path::Path;

use serde_json::{json, Value};

use super::image_sources::read_seeing_images;
use super::{
    large_file_schema, parse_permit, read_limit, Annotations, Arguments, Run, Tool, ToolDefinition, ToolError,
    ToolOutput, ToolResult,
};
use crate::source::{line_count, AllowedRoots, Cst, ParseError};

/// The tool's `tools/list` entry: name, description, schemas and annotations.
pub fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "lisp-check-parens",
        title: "Check Lisp parentheses",
        description:
            "Check that Common Lisp source reads as complete forms: balanced parentheses, terminated strings, \
`|...|` symbols and `#|...|#` comments. Give either `file_path` or `code`. On a problem it reports the line and column \
where the reader failed and of the opener that was left open, with a hint where a missing `)` most likely belongs. Use \
it before compiling or loading hand-edited code, and to locate the damage when a file no longer reads.",
        input_schema: json!({
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "A Lisp source file to check: absolute, or relative to the server's first --root \
        directory (by default its working directory). It must lie under an allowed root, or in the directory of \
        an ASDF system the image knows (such files are only read, never written), as find-definition gives them."
                },
                "code": {
                    "type": "string",
                    "description": "Lisp text to check instead of a file; lines and columns then count within it."
                },
                "large_file": large_file_schema()
            },
            "additionalProperties": false
        }),
        output_schema: Some(json!({
            "type": "object",
            "properties": {
                "balanced": {"type": "boolean"},
                "forms": {"type": "integer", "description": "Top-level forms read (when balanced)."},
                "lines": {"type": "integer"},
                "problem": {
                    "type": "object",
                    "properties": {
                        "message": {"type": "string"},
                        "line": {"type": "integer"},
                        "column": {"type": "integer"},
                        "opener": {
                            "type": "object",
                            "properties": {
                                "line": {"type": "integer"},
                                "column": {"type": "integer"},
                                "text": {"type": "string"}
                            }
                        },
                        "hint": {"type": "string"}
                    }
                }
            },
            "required": ["balanced", "lines"]
        })),
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
};

fn run(args: &Arguments, roots: &AllowedRoots) -> ToolResult {
    let file;
    // Read before `file_path` and `code` are checked, so that a bad value is named even when the
    // call has neither.
    let limit = read_limit(args)?;
    let (subject, bytes) = match (args.optional_str("file_path")?, args.optional_str("code")?) {
        (Some(_), Some(_)) => return Err(ToolError::new("Pass either `file_path` or `code`, not both.")),
        (None, None) => {
            return Err(ToolError::new("Pass `file_path` (a Lisp file to check) or `code` (Lisp text to check)."))
        }
        (Some(file_path), None) => {
            file = roots.read(Path::new(file_path), limit)?;
            (format!("`{}`", file.shown), file.bytes.as_slice())
        }
        (None, Some(code)) => ("The code".to_string(), code.as_bytes()),
    };
    let lines = line_count(bytes);
    // No tree is kept: the check's memory is in proportion to the largest top-level form.
    let _permit = parse_permit(bytes.len());
    Ok(match Cst::check(bytes) {
        Ok(forms) => {
            let plural = if forms == 1 { "" } else { "s" };
            ToolOutput::success(format!(
                "Balanced: {subject} reads as {forms} complete top-level form{plural} ({lines} lines)."
            ))
            .with_structured(json!({"balanced": true, "forms": forms, "lines": lines}))
        }
        Err(error) => ToolOutput::success(format!("Not balanced: {subject}: {error}."))
            .with_structured(json!({"balanced": false, "lines": lines, "problem": problem(&error)})),
    })
}

fn problem(error: &ParseError) -> Value {
    let mut problem = json!({"message": error.message, "line": error.at.line, "column": error.at.column});
    if let Some(opener) = &error.opener {
        problem["opener"] = json!({"line": opener.at.line, "column": opener.at.column, "text": opener.excerpt});
    }
    if let Some(hint) = &error.hint {
        problem["hint"] = json!(hint);
    }
    problem
}
