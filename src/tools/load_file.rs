//! `load-file`: compile a whole source file and load it into the image (Emacs's C-c C-k), with
//! every compiler condition at file:line:column.
//!
//! See docs/design.md, "The toolbox".

use std::path::Path;

use serde_json::json;

use super::lisp_reply::{decode, plural};
use super::load_form::{octet_text, recompile_callers, universal_time, LoadReport};
use super::arguments::arguments;
use super::{
    file_limit, Arguments, Fingerprint, Preview, Tool, ToolContext, ToolDefinition, ToolError,
    ToolResult,
};
use crate::image::{Entry, Request};
use crate::source::{definition_count, AllowedRoots};
use crate::swank::Form;

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "load-file",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Compile and load a whole file, as C-c C-k does.",
    },
    |context, args| Box::pin(call(context, args)),
)
.with_preview(preview);

arguments! {
    struct Args {
        file_path: String,
        large_file: bool,
    }
}

/// What the human approving the load is shown: the file it compiles.
fn preview(args: &Arguments, roots: &AllowedRoots) -> Result<Preview, ToolError> {
    let Args { file_path, large_file } = args.typed()?;
    let file = roots
        .read(Path::new(&file_path), file_limit(large_file))
        .map_err(|error| ToolError::new(format!("load-file was not run: {error}")))?;
    Ok(Preview {
        text: format!("Compiles and loads the file {}:\n{}", file.shown, String::from_utf8_lossy(&file.bytes)),
        fingerprint: Some((Fingerprint::of(&file.bytes), file.shown.clone())),
    })
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { file_path, large_file } = args.typed()?;
    let file = context.roots().read(Path::new(&file_path), file_limit(large_file))?;
    Fingerprint::check(context.approved, "load-file", &file.shown, &file.bytes)?;
    // What the file holds, less what the image's reader skips (behind `#+` conditionals that do
    // not hold): the forms SBCL compiled.
    let counted = definition_count(&file.bytes);
    let guarded = |each: &[Vec<(String, String)>]| {
        Form::list_of(each.iter().filter(|guards| !guards.is_empty()).map(|guards| {
            Form::list_of(guards.iter().map(|(marker, feature)| Form::list_of([marker.clone(), feature.clone()])))
        }))
    };
    let guarded = counted.as_ref().map_or_else(
        || Form::list_of(Vec::<Form>::new()),
        |counted| Form::list_of([guarded(&counted.forms), guarded(&counted.definitions)]),
    );
    // The bytes read and checked here are what the image compiles: reading the file again, the
    // image could find other text there (rewritten in place since, or through a path that now
    // leads elsewhere).
    let request = Request::new(Entry::LOAD_SOURCE_FILE)
        .arg(file.path.display().to_string())
        .arg(octet_text(&file.bytes, &file.shown)?)
        .key("write-date", universal_time(file.modified))
        .key("guarded", guarded)
        .key("max-output", context.settings.max_output);
    let reply = context.call_helper(args, request).await?;
    let mut report = decode::<LoadReport>("load-source-file", &reply)?;
    recompile_callers(context, args, &mut report).await;
    let (dropped_forms, dropped_definitions) = report.dropped.unwrap_or_default();
    let compiled = counted.as_ref().map(|counted| {
        (
            (counted.forms.len() as u64).saturating_sub(dropped_forms),
            (counted.definitions.len() as u64).saturating_sub(dropped_definitions),
        )
    });
    let contents = match compiled {
        Some((forms, definitions)) => format!(
            " ({} with {}, nested ones included)",
            plural(forms, "top-level form", "top-level forms"),
            plural(definitions, "definition", "definitions")
        ),
        None => String::new(),
    };
    let verdict = if report.loaded {
        format!("Compiled and loaded {}{contents}. {}.", file.shown, report.counts())
    } else {
        format!(
            "Not loaded: compiling {}{contents} gave {}; the image keeps what it had. Fix the errors below and load again.",
            file.shown,
            report.counts()
        )
    };
    let mut sections = vec![verdict];
    sections.extend(report.recompiled.clone());
    sections.extend(report.condition_sections(&file.shown));
    if let Some(stdout) = report.stdout.section("[stdout]", context.settings.max_output) {
        sections.push(stdout);
    }
    let mut structured = report.structured(&file.shown, None);
    structured["definitions"] = json!(compiled.map(|(_, definitions)| definitions));
    Ok(super::ToolOutput::new(sections.join("\n\n"), !report.loaded).with_structured(structured))
}
