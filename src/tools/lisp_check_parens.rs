//! `lisp-check-parens`: whether Lisp text reads as complete forms, and if not, where the first
//! problem is and which opener it belongs to. Runs in this process on the source CST.
//!
//! See docs/design.md, "The toolbox".

use std::path::Path;

use serde_json::{json, Value};

use super::arguments::arguments;
use super::{
    parse_permit, file_limit, Arguments, Run, Tool, ToolDefinition, ToolError, ToolOutput,
    ToolResult,
};
use crate::source::{line_count, AllowedRoots, Cst, ParseError};

/// Public: the tests and benchmarks run it on files alone, with no server.
pub const TOOL: Tool = Tool {
    definition: ToolDefinition {
        name: "lisp-check-parens",
        arguments: Args::PARAMS,
        read_only: true,
        description: "Whether Lisp source (file or code) reads as whole forms; if not, where a ) is likely missing.",
    },
    run: Run::Reading(run),
    preview: None,
    looks_only: None,
};

arguments! {
    struct Args {
        file_path: Option<String>,
        code: Option<String>,
        large_file: bool,
    }
}

fn run(args: &Arguments, roots: &AllowedRoots) -> ToolResult {
    let file;
    let Args { file_path, code, large_file } = args.typed()?;
    let (subject, bytes) = match (file_path, code.as_deref()) {
        (Some(_), Some(_)) => return Err(ToolError::new("Pass either `file_path` or `code`, not both.")),
        (None, None) => {
            return Err(ToolError::new("Pass `file_path` (a Lisp file to check) or `code` (Lisp text to check)."))
        }
        (Some(file_path), None) => {
            file = roots.read(Path::new(&file_path), file_limit(large_file))?;
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
