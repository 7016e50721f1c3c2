//! Asking the human through the MCP client (`elicitation/create`, protocol 2025-06-18 and later),
//! for a client that declared the capability: the caller's own way to ask, which the
//! [`crate::pipeline`] takes before the image's Emacs.
//!
//! See docs/design.md, "One call".

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::client_requests::{ClientRequests, RequestFailed};
use crate::pipeline::approval::{declined, unanswered};
use crate::pipeline::{Ask, Question, Verdict};
use crate::tools::ToolOutput;

/// The protocol revision that introduced elicitation.
pub const ELICITATION_SINCE: &str = "2025-06-18";

/// Whether a client whose `elicitation` capability is `declared` may be sent a form, which an
/// approval is: one that declares the capability with `form`, or with no mode at all, which means
/// form; one that declares only `url` must not be sent one (client/elicitation, "Capabilities").
pub fn accepts_forms(declared: Option<&Value>) -> bool {
    match declared {
        Some(Value::Object(modes)) => modes.contains_key("form") || !modes.contains_key("url"),
        _ => false,
    }
}

/// Why a client of MCP `version`, whose `elicitation` capability (declared in `declared_in`) is
/// `declared`, cannot ask the human itself, as the refusal of a call nobody could be asked about
/// says it.
pub fn cannot_ask(version: &str, declared: Option<&Value>, declared_in: &str) -> String {
    let why = if version < ELICITATION_SINCE {
        format!("it speaks MCP {version}, and asking the user (elicitation) needs {ELICITATION_SINCE} or later")
    } else if declared.is_some_and(Value::is_object) {
        format!("it declared only URL-mode elicitation in {declared_in}, and an approval is a form")
    } else {
        format!("it did not declare the MCP elicitation capability in {declared_in}")
    };
    format!("this MCP client cannot ask for it ({why})")
}

/// The client's elicitation, through its requests.
pub struct Elicitation(pub Arc<ClientRequests>);

#[derive(Deserialize)]
struct ElicitResult {
    action: String,
    #[serde(default)]
    content: Option<Value>,
}

impl Ask for Elicitation {
    fn ask<'a>(&'a self, question: &'a Question<'a>) -> BoxFuture<'a, Verdict> {
        Box::pin(ask(&self.0, question.tool, question.shown, question.limit, question.cancel))
    }
}

/// Asks the human, through the client, whether `tool` may run, showing `shown`, waiting at most
/// `limit` and until `cancel`.
async fn ask(
    requests: &ClientRequests,
    tool: &str,
    shown: &str,
    limit: Duration,
    cancel: &CancellationToken,
) -> Verdict {
    let params = approval_form(tool, shown, true);
    let answer = tokio::select! {
        answer = requests.request("elicitation/create", params) => answer,
        _ = cancel.cancelled() => return Verdict::Cancelled,
        _ = tokio::time::sleep(limit) => return Verdict::TimedOut(unanswered(tool, limit)),
    };
    let not_run =
        |why: String| Verdict::Refused(ToolOutput::error(format!("{tool} was not run: {why} Nothing changed.")));
    match answer {
        Ok(answer) => verdict_of(tool, answer.get()),
        Err(RequestFailed::Error(error)) => {
            not_run(format!("the client could not ask the user for approval ({}).", error.message))
        }
        Err(failed) => not_run(format!("no approval: {failed}.")),
    }
}

/// The `elicitation/create` params that ask whether `tool` may run, showing `shown`; with a choice
/// to allow the tool for the rest of the session when there is one (`for_session`).
pub(super) fn approval_form(tool: &str, shown: &str, for_session: bool) -> Value {
    let mut properties = serde_json::Map::new();
    if for_session {
        properties.insert(
            "allow_for_session".to_string(),
            json!({
                "type": "boolean",
                "title": format!("Allow {tool} for the rest of this session"),
                "description": format!("Run later {tool} calls of this session without asking."),
                "default": false
            }),
        );
    }
    json!({
        "message": format!("The agent asks to run {tool}.\n\n{shown}\n\nAllow it?"),
        "requestedSchema": { "type": "object", "properties": properties },
    })
}

/// The verdict the client's `ElicitResult` (`answer`, JSON text) gives on a call of `tool`.
pub(super) fn verdict_of(tool: &str, answer: &str) -> Verdict {
    let not_run =
        |why: String| Verdict::Refused(ToolOutput::error(format!("{tool} was not run: {why} Nothing changed.")));
    match serde_json::from_str::<ElicitResult>(answer) {
        // Nobody waits to hear whether an approved call runs: the client's answer is all it asked.
        Ok(result) if result.action == "accept" => Verdict::Approved {
            settle: None,
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
        _ => not_run(format!("the client's answer to the approval request was not understood: {answer}.")),
    }
}
