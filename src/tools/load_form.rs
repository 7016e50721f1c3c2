//! `load-form`: compile one definition of a source file into the image, with its source location
//! (Emacs's C-c C-c). Also what `edit-lisp-form` with `load` and `load-file` share: the request
//! to the helper and how its report reads.
//!
//! See docs/design.md, "The toolbox".

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{json, Value};

use super::find_definition::CurrentTexts;
use super::lisp_reply::{decode, plural, Captured, CompilerCondition, Location};
use super::xref::query_of_hit;
use super::arguments::arguments;
use super::{
    file_limit, Arguments, Fingerprint, Preview, Tool, ToolContext, ToolDefinition, ToolError,
    ToolOutput, ToolResult,
};
use crate::image::{Entry, Request};
use crate::source::{top_level_form_at, AllowedRoots, LoadPlan, LoadTarget, PathError, SourceFile};
use crate::swank::codec::MAX_PAYLOAD;
use crate::swank::Form;

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "load-form",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Compile one definition of a file into the image, as C-c C-c does.",
    },
    |context, args| Box::pin(call(context, args)),
)
.with_preview(preview);

arguments! {
    struct Args {
        file_path: String,
        form_type: String,
        form_name: String,
        index: Option<u64> => at_least(1).explained(super::index_from_one),
        large_file: bool,
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let asked: Args = args.typed()?;
    let file = context.roots().read(Path::new(&asked.file_path), file_limit(asked.large_file))?;
    Fingerprint::check(context.approved, "load-form", &file.shown, &file.bytes)?;
    let plan = plan(&asked, &file)?;
    let loaded = load_plan(context, args, (&file.path, &file.shown), file.modified, &plan).await?;
    Ok(loaded.into_output(&file.shown, &plan))
}

/// The definition `asked` names in `file`, to load.
fn plan(asked: &Args, file: &SourceFile) -> Result<LoadPlan, ToolError> {
    let index = asked.index.and_then(|i| usize::try_from(i).ok());
    LoadPlan::for_query(&file.bytes, &file.shown, &asked.form_type, &asked.form_name, index).map_err(ToolError::new)
}

/// What the human approving the load is shown: the lines of the definition it compiles, with
/// where they are.
fn preview(args: &Arguments, roots: &AllowedRoots) -> Result<Preview, ToolError> {
    let refused = |error: ToolError| ToolError::new(format!("load-form was not run: {error}"));
    let asked: Args = args.typed()?;
    let file =
        roots.read(Path::new(&asked.file_path), file_limit(asked.large_file)).map_err(|e| refused(e.into()))?;
    let plan = plan(&asked, &file).map_err(refused)?;
    let Some(target) = plan.targets.first() else {
        return Err(refused(ToolError::new(format!("no such definition in {}.", file.shown))));
    };
    let text = String::from_utf8_lossy(&file.bytes);
    let lines: Vec<&str> =
        text.lines().skip(target.lines.first - 1).take(target.lines.last + 1 - target.lines.first).collect();
    Ok(Preview {
        text: format!(
            "Compiles {} from {}:{}-{} into the image:\n{}",
            target.described,
            file.shown,
            target.lines.first,
            target.lines.last,
            lines.join("\n")
        ),
        fingerprint: Some((Fingerprint::of(&file.bytes), file.shown.clone())),
    })
}

/// Sends `plan` to the image to compile and load, as the text of the file at `path` (`shown` in
/// messages) last modified at `modified`: the image never opens the path, which may lead
/// elsewhere by then, or to other text. Then recompiles the callers of what it redefined (see
/// [`recompile_callers`]).
pub(crate) async fn load_plan(
    context: &ToolContext,
    args: &Arguments,
    file: (&Path, &str),
    modified: Option<SystemTime>,
    plan: &LoadPlan,
) -> Result<LoadReport, ToolError> {
    let mut report = send_plan(context, args, file, modified, plan).await?;
    recompile_callers(context, args, &mut report).await;
    Ok(report)
}

/// [`load_plan`] without the callers.
async fn send_plan(
    context: &ToolContext,
    args: &Arguments,
    (path, shown): (&Path, &str),
    modified: Option<SystemTime>,
    plan: &LoadPlan,
) -> Result<LoadReport, ToolError> {
    let guards = plan
        .targets
        .iter()
        .flat_map(|target| {
            target.guards.iter().map(|(marker, feature)| {
                Form::list_of([format!("#{marker}{feature}"), marker.clone(), feature.clone()])
            })
        })
        .collect::<Vec<_>>();
    let request = Request::new(Entry::LOAD_SOURCE)
        .arg(path.display().to_string())
        .arg(octet_text(&plan.text, shown)?)
        .key("guards", Form::list_of(guards))
        .key("write-date", universal_time(modified))
        .key("max-output", context.settings.max_output);
    let reply = context.call_helper(args, request).await?;
    decode::<LoadReport>("load-source", &reply)
}

/// How many rounds of callers [`recompile_callers`] follows: a caller recompiled in one round
/// that is itself a macro or inline function leaves its own callers stale, recompiled in the
/// next.
const MAX_CALLER_ROUNDS: usize = 5;

/// Recompiles from its file each caller `report` lists, compiled with the old definition of a
/// macro or inline function the load replaced, as load-form compiles a definition: the image runs
/// the new expansion at once. A recompiled caller that is a macro or inline function itself (an
/// inline function inlined through another) had its own callers compiled with its old expansion:
/// those are recompiled after it, round by round, up to [`MAX_CALLER_ROUNDS`]; the reply names
/// any left running the old code. Sets `report.recompiled` to what was done.
pub(crate) async fn recompile_callers(context: &ToolContext, args: &Arguments, report: &mut LoadReport) {
    if report.callers.is_empty() {
        return;
    }
    let mut texts = CurrentTexts::new(context.roots());
    let mut outcomes: Vec<(StaleCaller, Result<String, String>)> = Vec::new();
    let mut round = report.callers.clone();
    for rounds in 1.. {
        let followed = recompile_round(context, args, &mut texts, round, &mut outcomes).await;
        // Each caller once, even when two expanders it inlines changed.
        let mut next: Vec<StaleCaller> = Vec::new();
        for caller in followed {
            let seen = outcomes.iter().map(|(done, _)| done).chain(&next).any(|done| done.name == caller.name);
            if !seen {
                next.push(caller);
            }
        }
        if rounds == MAX_CALLER_ROUNDS {
            let why = format!("inlined {MAX_CALLER_ROUNDS} callers deep, not followed further");
            outcomes.extend(next.into_iter().map(|caller| (caller, Err(why.clone()))));
            break;
        }
        if next.is_empty() {
            break;
        }
        round = next;
    }
    let mut expanders: Vec<&str> = Vec::new();
    for (caller, _) in &outcomes {
        if !expanders.contains(&caller.expander.as_str()) {
            expanders.push(&caller.expander);
        }
    }
    let mut lines = Vec::new();
    for expander in expanders {
        let of = |ok: bool| -> Vec<String> {
            outcomes
                .iter()
                .filter(|(caller, outcome)| caller.expander == expander && outcome.is_ok() == ok)
                .map(|(caller, outcome)| match outcome {
                    Ok(at) => format!("{} ({at})", caller.name),
                    Err(why) => format!("{} ({why})", caller.name),
                })
                .collect()
        };
        let (done, not_done) = (of(true), of(false));
        let mut line = format!(
            "Recompiled {} of {expander}, compiled with its old definition",
            plural(done.len() as u64, "caller", "callers")
        );
        if !done.is_empty() {
            line.push_str(&format!(": {}", done.join(", ")));
        }
        if !not_done.is_empty() {
            line.push_str(&format!("; not recompiled, still running the old one: {}", not_done.join(", ")));
        }
        line.push('.');
        lines.push(line);
    }
    report.recompiled = Some(lines.join("\n"));
}

/// Recompiles `callers` from their files, each file once, and adds how each went to `outcomes`.
/// Returns the callers those loads left stale in turn (of a caller that is a macro or an inline
/// function).
async fn recompile_round(
    context: &ToolContext,
    args: &Arguments,
    texts: &mut CurrentTexts<'_>,
    callers: Vec<StaleCaller>,
    outcomes: &mut Vec<(StaleCaller, Result<String, String>)>,
) -> Vec<StaleCaller> {
    // Each file once, all its callers in one load.
    let mut files: Vec<(String, Vec<StaleCaller>)> = Vec::new();
    for caller in callers {
        match caller.source.file.clone() {
            Some(file) => match files.iter_mut().find(|(f, _)| *f == file) {
                Some((_, callers)) => callers.push(caller),
                None => files.push((file, vec![caller])),
            },
            None => outcomes.push((caller, Err("no file".into()))),
        }
    }
    let mut followed = Vec::new();
    for (path, callers) in files {
        let file = match context.roots().read(Path::new(&path), Some((super::LARGE_FILE, ""))) {
            Ok(file) => file,
            Err(error) => {
                let why = match error {
                    PathError::Outside { .. } => "outside the roots".to_string(),
                    error => error.to_string(),
                };
                outcomes.extend(callers.into_iter().map(|caller| (caller, Err(why.clone()))));
                continue;
            }
        };
        texts.hold(&path, file.bytes.clone());
        let (mut spans, mut found) = (Vec::new(), Vec::new());
        for caller in callers {
            // A caller after the form a load's edit lengthened has moved from where SBCL
            // recorded it: it is looked for by its name, as xref looks for its hits.
            let mut source = caller.source.clone();
            let by_name = query_of_hit(&caller.name)
                .and_then(|(operators, form_name)| texts.relocate(&mut source, operators, &form_name));
            let at = source.line.zip(source.column);
            let span = by_name
                .or_else(|| at.and_then(|(line, column)| top_level_form_at(&file.bytes, line as usize, column as usize)));
            match span {
                Some((start, end)) => {
                    spans.push(start..end);
                    let at = format!("{}:{}", file.shown, source.line.unwrap_or_default());
                    found.push((caller, at));
                }
                None => outcomes.push((caller, Err(format!("no form at its place in {}", file.shown)))),
            }
        }
        let loaded = match LoadPlan::for_spans(&file.bytes, &spans) {
            Ok(plan) => match send_plan(context, args, (&file.path, &file.shown), file.modified, &plan).await {
                Ok(loaded) if loaded.loaded => {
                    followed.extend(loaded.callers);
                    Ok(())
                }
                Ok(loaded) => Err(format!("compiling it gave {}", loaded.counts())),
                Err(error) => Err(error.0),
            },
            Err(error) => Err(error),
        };
        outcomes.extend(found.into_iter().map(|(caller, at)| (caller, loaded.clone().map(|()| at))));
    }
    followed
}

/// Room in a request to the image for what it carries besides a file's text.
const REQUEST_ROOM: usize = 64 * 1024;

/// `bytes`, text to compile from the file `shown`, as the load entries of the helper take it:
/// one character per byte, of the byte's code (Latin-1), so that the image compiles exactly these
/// bytes whatever their encoding (TEXT-OCTETS in loading.lisp). The error says when they do not
/// fit in one swank message.
pub(crate) fn octet_text(bytes: &[u8], shown: &str) -> Result<String, ToolError> {
    // A byte over 127 takes two bytes of UTF-8 on the wire, and `"` and `\` take an escape.
    let wire = bytes.len() + bytes.iter().filter(|&&b| b >= 0x80 || b == b'"' || b == b'\\').count();
    if wire + REQUEST_ROOM > MAX_PAYLOAD {
        return Err(ToolError::new(format!(
            "Nothing was loaded: the text of {shown} takes {wire} bytes in a request to the image, over the {} that \
             one swank message carries with the rest of the request. Load it with load-system, or split the file.",
            MAX_PAYLOAD - REQUEST_ROOM
        )));
    }
    Ok(bytes.iter().map(|&b| char::from(b)).collect())
}

/// `time` as a Lisp universal time (whole seconds since 1900, as FILE-WRITE-DATE gives it), or
/// `nil`.
pub(crate) fn universal_time(time: Option<SystemTime>) -> Form {
    const UNIX_EPOCH_AS_UNIVERSAL_TIME: u64 = 2_208_988_800;
    time.and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .and_then(|since| i64::try_from(since.as_secs() + UNIX_EPOCH_AS_UNIVERSAL_TIME).ok())
        .map_or(Form::Nil, Form::Integer)
}

/// The helper's answer to `load-source` and `load-source-file`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct LoadReport {
    pub loaded: bool,
    pub warnings: u64,
    pub errors: u64,
    pub style_warnings: u64,
    pub notes: u64,
    pub conditions: Vec<CompilerCondition>,
    /// When some were not shown: the handle of every condition, one line each, and the offset of
    /// the first not shown.
    pub rest: Option<(String, u64)>,
    /// The guards, `(label marker feature)`, that keep a form out in this image.
    #[serde(default)]
    pub inactive: Vec<(String, String, String)>,
    /// For load-file: how many of the top-level forms and of the definitions the server counted
    /// the reader skipped (behind a reader conditional that does not hold).
    pub dropped: Option<(u64, u64)>,
    pub stdout: Captured,
    /// The functions compiled with an old definition of a macro or inline function this load
    /// replaced.
    pub callers: Vec<StaleCaller>,
    /// What [`recompile_callers`] did with them.
    #[serde(skip)]
    pub recompiled: Option<String>,
}

/// A function compiled with an older definition of a macro or inline function (its expander).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct StaleCaller {
    pub expander: String,
    pub name: String,
    pub source: Location,
}

impl LoadReport {
    /// `0 warnings, 1 style-warning`: the counts that say something, warnings and errors always.
    pub fn counts(&self) -> String {
        let mut counts = vec![plural(self.errors, "error", "errors"), plural(self.warnings, "warning", "warnings")];
        if self.style_warnings > 0 {
            counts.push(plural(self.style_warnings, "style-warning", "style-warnings"));
        }
        if self.notes > 0 {
            counts.push(plural(self.notes, "compiler note", "compiler notes"));
        }
        counts.join(", ")
    }

    /// One block per condition, placed at `file`:line:column.
    pub fn condition_sections(&self, file: &str) -> Vec<String> {
        let mut sections: Vec<String> = self
            .conditions
            .iter()
            .map(|condition| {
                condition.render(Some(match (condition.line, condition.column) {
                    (Some(line), Some(column)) => format!("{file}:{line}:{column}"),
                    _ => file.to_string(),
                }))
            })
            .collect();
        let total = self.warnings + self.errors + self.style_warnings + self.notes;
        let shown = self.conditions.len() as u64;
        if total > shown {
            sections.push(match &self.rest {
                Some((handle, offset)) => format!(
                    "[... {} more compiler conditions not shown: at most 100 per reply; inspect {handle} with offset \
                     {offset} for them]",
                    total - shown
                ),
                None => format!("[... {} more compiler conditions not shown]", total - shown),
            });
        }
        sections
    }

    /// The facts every loading tool's structured reply has.
    pub fn structured(&self, file: &str, plan: Option<&LoadPlan>) -> Value {
        json!({
            "file": file,
            "loaded": self.loaded,
            "forms": plan.map_or_else(Vec::new, |plan| plan.targets.iter().map(|t| json!({
                "form": t.described, "first_line": t.lines.first, "last_line": t.lines.last,
            })).collect()),
            "package": plan.and_then(|plan| plan.package.clone()),
            "warnings": self.warnings,
            "errors": self.errors,
            "style_warnings": self.style_warnings,
            "notes": self.notes,
            "conditions": self.conditions.iter().map(|c| json!({
                "severity": c.severity, "message": c.message, "form": c.form, "line": c.line, "column": c.column,
            })).collect::<Vec<_>>(),
            "not_read": self.inactive.iter().map(|(label, ..)| label.clone()).collect::<Vec<_>>(),
            "callers": self.recompiled,
        })
    }

    /// The reply of `load-form`.
    pub fn into_output(self, file: &str, plan: &LoadPlan) -> ToolOutput {
        let (text, failed, structured) = self.render(file, plan, Loaded::Named);
        ToolOutput::new(text, failed).with_structured(structured)
    }

    /// The text of [`LoadReport::into_output`], whether it is an error, and its structured facts.
    pub fn render(self, file: &str, plan: &LoadPlan, loaded: Loaded) -> (String, bool, Value) {
        let forms: Vec<String> = plan.targets.iter().map(|t| describe(t, file)).collect();
        let package = plan.package.as_deref().map(|p| format!(", read in package {p}")).unwrap_or_default();
        let verdict = if !self.inactive.is_empty() {
            let guards: Vec<&str> = self.inactive.iter().map(|(label, ..)| label.as_str()).collect();
            format!(
                "Not loaded: the reader conditional {} keeps {} out in this image, so compiling read nothing there.",
                guards.join(" and "),
                forms.join(", ")
            )
        } else if self.loaded {
            let what = match (loaded, forms.len()) {
                (Loaded::Named, _) => forms.join(", "),
                (Loaded::Edited { one_file: true }, 1) => "it".to_string(),
                (Loaded::Edited { one_file: true }, n) => format!("the {n} forms"),
                (Loaded::Edited { one_file: false }, 1) => format!("the form of {file}"),
                (Loaded::Edited { one_file: false }, n) => format!("the {n} forms of {file}"),
            };
            format!("Loaded {what} into the image{package}. {}.", self.counts())
        } else {
            format!(
                "Not loaded: compiling {} gave {}; the image keeps what it had. Fix the errors below and load again.",
                forms.join(", "),
                self.counts()
            )
        };
        let failed = !self.loaded || !self.inactive.is_empty();
        let mut sections = vec![verdict];
        sections.extend(self.recompiled.clone());
        sections.extend(self.condition_sections(file));
        if let Some(stdout) = self.stdout.section("[stdout]", usize::MAX) {
            sections.push(stdout);
        }
        let structured = self.structured(file, Some(plan));
        (sections.join("\n\n"), failed, structured)
    }
}

/// `` `defun foo` (src/a.lisp, lines 3-5) ``
/// How a successful load names the forms it compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    /// Each by its kind, name, file and lines: nothing above says which they are.
    Named,
    /// As the forms the edits just named, with their lines, in the same reply.
    Edited {
        /// Whether the edits changed one file, which then needs no naming.
        one_file: bool,
    },
}

fn describe(target: &LoadTarget, file: &str) -> String {
    format!("`{}` ({file}, {})", target.described, target.lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[test]
    fn a_report_places_conditions_in_the_file() {
        let report = decode::<LoadReport>(
            "load-source",
            &read(
                "(:loaded t :warnings 0 :errors 0 :style-warnings 1 :notes 0 :conditions \
                 ((:severity \"STYLE-WARNING\" :message \"undefined function: APP::G\" :form \"(G 1)\" :line 8 :column 17)) \
                 :rest nil :inactive nil :dropped nil :stdout (\"\" 0) :callers nil)",
            )
            .unwrap(),
        )
        .unwrap();
        let plan =
            LoadPlan::for_query(b"(in-package :app)\n(defun f ()\n  (g 1))\n", "a.lisp", "defun", "f", None).unwrap();
        let output = report.into_output("a.lisp", &plan);
        assert!(!output.is_error);
        assert_eq!(
            output.text,
            "Loaded `defun f` (a.lisp, lines 2-3) into the image, read in package :app. 0 errors, 0 warnings, 1 style-warning.\n\n\
             STYLE-WARNING: undefined function: APP::G\n  in form: (G 1)\n  at: a.lisp:8:17"
        );
    }

    #[test]
    fn each_byte_goes_as_the_character_of_its_code_within_one_message() {
        let bytes = [b'(', 0xC3, 0xA9, 0xFF, 0, b'"', b'\\', b')'];
        let text = octet_text(&bytes, "a.lisp").unwrap();
        assert_eq!(text.chars().map(u32::from).collect::<Vec<_>>(), bytes.map(u32::from));
        // Half a message of bytes over 127 takes a whole one.
        let refused = octet_text(&vec![0x80; MAX_PAYLOAD / 2], "a.lisp").unwrap_err();
        assert!(refused.0.starts_with("Nothing was loaded: the text of a.lisp takes 16777214 bytes"), "{}", refused.0);
    }
}
