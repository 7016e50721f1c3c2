//! `--confirm`: tool calls that wait for the human's yes before they run, asked through MCP
//! elicitation (`elicitation/create`, protocol 2025-06-18 and later) when the client declared
//! that capability, else in the image's Emacs when it is in `swank-mcp-approval-mode`, and
//! refused with an error that says how to approve otherwise.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::client_requests::{ClientRequests, RequestFailed};
use crate::source::LoadPlan;
use crate::tools::image_approval::EmacsVerdict;
use crate::tools::{read_limit, ToolOutput, Toolbox};

/// Stands for every offered tool that is not read-only in `--confirm`.
pub const MUTATING: &str = "mutating";

/// The protocol revision that introduced elicitation.
pub const ELICITATION_SINCE: &str = "2025-06-18";

/// The preview of an edit shows at most this much of its diff; the rest is counted.
const MAX_SHOWN: usize = 20_000;

/// Which tool calls need the human's approval, and how long one waits for it.
#[derive(Debug, Clone, Default)]
pub struct ConfirmPolicy {
    tools: HashSet<String>,
    /// How long a call waits for the answer before it is refused.
    pub timeout: Duration,
}

impl ConfirmPolicy {
    /// The policy for `--confirm` naming `names` (tool names, or [`MUTATING`]) among the tools
    /// `toolbox` offers. An unknown name is an error that lists the offered tools.
    pub fn new(names: &[String], toolbox: &Toolbox, timeout: Duration) -> Result<Self, String> {
        let mut tools = HashSet::new();
        for name in names {
            if name == MUTATING {
                tools.extend(toolbox.definitions().filter(|d| !d.annotations.read_only).map(|d| d.name.to_string()));
            } else if toolbox.definitions().any(|d| d.name == name.as_str()) {
                tools.insert(name.clone());
            } else {
                let offered: Vec<&str> = toolbox.definitions().map(|d| d.name).collect();
                return Err(format!(
                    "--confirm names {name:?}, which is not a tool this server offers; give \"{MUTATING}\" or some of: {}",
                    offered.join(", ")
                ));
            }
        }
        Ok(Self { tools, timeout })
    }

    /// Whether calls of `tool` wait for approval.
    pub fn requires(&self, tool: &str) -> bool {
        self.tools.contains(tool)
    }
}

/// The human's answer to one approval request.
#[derive(Debug)]
pub enum Verdict {
    /// Run the call; `for_session` when the human allowed the tool for the rest of the session.
    Approved {
        /// Calls of this tool need no approval any more in this session.
        for_session: bool,
    },
    /// The human declined the call; the output says so.
    Declined(ToolOutput),
    /// Nobody answered within the time limit; the output says so.
    TimedOut(ToolOutput),
    /// Do not run the call: nobody could be asked, or asking failed; the output says why.
    Refused(ToolOutput),
    /// The client cancelled the call while it waited.
    Cancelled,
}

/// The error for a call that nobody can be asked about.
pub fn cannot_ask(tool: &str, version: &str) -> ToolOutput {
    let why = if version < ELICITATION_SINCE {
        format!("it speaks MCP {version}, and asking the user (elicitation) needs {ELICITATION_SINCE} or later")
    } else {
        "it did not declare the MCP elicitation capability in initialize".to_string()
    };
    ToolOutput::error(format!(
        "{tool} was not run: this swank-mcp runs with --confirm, so {tool} needs the user's approval, and this MCP \
         client cannot ask for it ({why}), nor is the image's Emacs in swank-mcp-approval-mode. Nothing changed. To \
         approve calls, the user can turn on M-x swank-mcp-approval-mode in the Emacs attached to the image \
         (elisp-compat/swank-mcp.el), or use an MCP client that supports elicitation, or restart swank-mcp \
         without {tool} in --confirm."
    ))
}

/// Asks the user's Emacs, through the image, whether `tool` may run with `arguments`, showing
/// `shown` (from [`what_it_does`]).
pub async fn ask_emacs(
    toolbox: &Arc<Toolbox>,
    (tool, client): (&str, &str),
    arguments: &Option<Value>,
    shown: String,
    version: &str,
    limit: Duration,
    cancel: &CancellationToken,
) -> Verdict {
    let started = std::time::Instant::now();
    match toolbox.ask_emacs(arguments, (tool, client), shown, limit, cancel.clone()).await {
        _ if cancel.is_cancelled() => Verdict::Cancelled,
        Ok(EmacsVerdict::Yes) => Verdict::Approved { for_session: false },
        Ok(EmacsVerdict::Always) => Verdict::Approved { for_session: true },
        Ok(EmacsVerdict::No) => Verdict::Declined(declined(tool)),
        Ok(EmacsVerdict::Unavailable) => Verdict::Refused(cannot_ask(tool, version)),
        Ok(EmacsVerdict::Timeout) => Verdict::TimedOut(unanswered(tool, limit)),
        Err(error) => {
            let output =
                ToolOutput::error(format!("{tool} was not run: asking for approval in Emacs failed. {}", error.0));
            // The image did not end the request by the limit: nobody answered in time.
            if started.elapsed() >= limit {
                Verdict::TimedOut(output)
            } else {
                Verdict::Refused(output)
            }
        }
    }
}

fn unanswered(tool: &str, limit: Duration) -> ToolOutput {
    ToolOutput::error(format!(
        "{tool} was not run: the user did not answer the approval request within {} s (--confirm-timeout). Nothing \
         changed.",
        limit.as_secs()
    ))
}

fn declined(tool: &str) -> ToolOutput {
    ToolOutput::error(format!("{tool} was declined by the user; it did not run and nothing changed."))
}

#[derive(Deserialize)]
struct ElicitResult {
    action: String,
    #[serde(default)]
    content: Option<Value>,
}

/// Asks the human, through the client, whether `tool` may run, showing `shown` (from
/// [`what_it_does`]), waiting at most `limit` and until `cancel`.
pub async fn ask(
    requests: &ClientRequests,
    tool: &str,
    shown: &str,
    limit: Duration,
    cancel: &CancellationToken,
) -> Verdict {
    let params = json!({
        "message": format!("The agent asks to run {tool}.\n\n{shown}\n\nAllow it?"),
        "requestedSchema": {
            "type": "object",
            "properties": {
                "allow_for_session": {
                    "type": "boolean",
                    "title": format!("Allow {tool} for the rest of this session"),
                    "description": format!("Run later {tool} calls of this session without asking."),
                    "default": false
                }
            }
        }
    });
    let answer = tokio::select! {
        answer = requests.request("elicitation/create", params) => answer,
        _ = cancel.cancelled() => return Verdict::Cancelled,
        _ = tokio::time::sleep(limit) => return Verdict::TimedOut(unanswered(tool, limit)),
    };
    let not_run =
        |why: String| Verdict::Refused(ToolOutput::error(format!("{tool} was not run: {why} Nothing changed.")));
    let answer = match answer {
        Ok(answer) => answer,
        Err(RequestFailed::Error(error)) => {
            return not_run(format!("the client could not ask the user for approval ({}).", error.message))
        }
        Err(failed) => return not_run(format!("no approval: {failed}.")),
    };
    match serde_json::from_str::<ElicitResult>(answer.get()) {
        Ok(result) if result.action == "accept" => Verdict::Approved {
            for_session: result
                .content
                .as_ref()
                .and_then(|c| c.get("allow_for_session"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
        },
        Ok(result) if result.action == "decline" => Verdict::Declined(declined(tool)),
        Ok(result) if result.action == "cancel" => {
            not_run("the user dismissed the approval request without answering.".to_string())
        }
        _ => not_run(format!("the client's answer to the approval request was not understood: {}.", answer.get())),
    }
}

/// What the human is shown: the code of an evaluation, the diff an edit would make, the
/// definition `load-form` would compile or the file `load-file` would, or the arguments of any
/// other call. An edit or a load that cannot be made is refused here, unasked.
pub async fn what_it_does(
    toolbox: &Arc<Toolbox>,
    tool: &str,
    arguments: &Option<Value>,
    cancel: &CancellationToken,
) -> Result<String, ToolOutput> {
    let object = arguments.as_ref().and_then(Value::as_object);
    let argument = |name: &str| object.and_then(|o| o.get(name)).and_then(Value::as_str);
    if tool == "edit-lisp-form" {
        let mut preview = arguments.clone().unwrap_or_else(|| json!({}));
        if let Some(object) = preview.as_object_mut() {
            object.insert("dry_run".into(), Value::Bool(true));
        }
        return match toolbox.call(tool, Some(preview), cancel.clone()).await {
            Some(output) if output.is_error => Err(output),
            Some(output) => Ok(cut(output.text)),
            None => Err(ToolOutput::error(format!("Unknown tool: {tool}"))),
        };
    }
    if let (Some(file_path), "load-form" | "load-file") = (argument("file_path"), tool) {
        return loaded_text(toolbox, tool, file_path, arguments).map(cut);
    }
    let mut shown = match argument("code") {
        Some(code) => format!("Code:\n{code}"),
        None => format!(
            "Arguments: {}",
            serde_json::to_string_pretty(arguments.as_ref().unwrap_or(&json!({}))).unwrap_or_default()
        ),
    };
    for name in ["package", "image"] {
        if let (Some(value), Some(_)) = (argument(name), argument("code")) {
            shown.push_str(&format!("\n{}: {value}", if name == "package" { "Package" } else { "Image" }));
        }
    }
    Ok(cut(shown))
}

/// The text `load-form` or `load-file` would compile, read as the tool reads it: the whole file,
/// or the lines of the one definition with where they are.
fn loaded_text(
    toolbox: &Toolbox,
    tool: &str,
    file_path: &str,
    arguments: &Option<Value>,
) -> Result<String, ToolOutput> {
    let refused = |error: String| ToolOutput::error(format!("{tool} was not run: {error}"));
    let args = toolbox
        .arguments(tool, arguments.clone())
        .ok_or_else(|| refused(format!("{tool} is not offered.")))?
        .map_err(|e| refused(e.0))?;
    let file = toolbox
        .roots()
        .read(Path::new(file_path), read_limit(&args).map_err(|e| refused(e.0))?)
        .map_err(|e| refused(e.to_string()))?;
    let text = String::from_utf8_lossy(&file.bytes);
    if tool == "load-file" {
        return Ok(format!("Compiles and loads the file {}:\n{text}", file.shown));
    }
    let form_type = args.required_str("form_type").map_err(|e| refused(e.0))?;
    let form_name = args.required_str("form_name").map_err(|e| refused(e.0))?;
    let index = args.optional_u64("index").map_err(|e| refused(e.0))?;
    let index = index.and_then(|i| usize::try_from(i).ok());
    let plan = LoadPlan::for_query(&file.bytes, &file.shown, form_type, form_name, index).map_err(refused)?;
    let Some(target) = plan.targets.first() else {
        return Err(refused(format!("no {form_type} {form_name} in {}.", file.shown)));
    };
    let lines: Vec<&str> =
        text.lines().skip(target.lines.first - 1).take(target.lines.last + 1 - target.lines.first).collect();
    Ok(format!(
        "Compiles {} from {}:{}-{} into the image:\n{}",
        target.described,
        file.shown,
        target.lines.first,
        target.lines.last,
        lines.join("\n")
    ))
}

fn cut(mut text: String) -> String {
    if text.len() > MAX_SHOWN {
        let end = (0..=MAX_SHOWN).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        let dropped = text.len() - end;
        text.truncate(end);
        text.push_str(&format!("\n[... {dropped} more bytes not shown]"));
    }
    text
}
