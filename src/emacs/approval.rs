//! Asking the user's Emacs (`swank-mcp-approval-mode`, elisp-compat/swank-mcp-approval.el) to approve a
//! call, through the image: the helper tells the Emacs connections in approval mode and holds the
//! request until one answers or `--confirm-timeout` passes (`lisp/activity.lisp`). And the
//! allowances for the rest of a session that the person gives there, which the image keeps so
//! that Emacs can revoke them. [`EmacsApproval`] is the pipeline's way to ask for callers that
//! cannot ask themselves, as an MCP client's elicitation is the caller's own.
//!
//! See docs/design.md, "Emacs".

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::image::{CallLimits, Entry, Image, Request};
use crate::pipeline::approval::{declined, unanswered};
use crate::pipeline::{Ask, Question, Verdict};
use crate::tools::lisp_reply::{check_failure, decode};
use crate::tools::{ToolError, ToolOutput};

/// The user's Emacs, asked through the image a call works in.
pub struct EmacsApproval {
    /// The time limit of the requests other than the question itself (settling a request, keeping
    /// and checking an allowance): `--eval-timeout`.
    timeout: Duration,
}

impl EmacsApproval {
    /// Asks in Emacs, with `timeout` for the requests around the question.
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl Ask for EmacsApproval {
    fn ask<'a>(&'a self, question: &'a Question<'a>) -> BoxFuture<'a, Verdict> {
        Box::pin(ask_in_emacs(question))
    }

    fn settle<'a>(&'a self, question: &'a Question<'a>, request: u64, refusal: Option<String>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(image) = question.image {
                settle(image, request, refusal, self.timeout).await;
            }
        })
    }

    fn allow_for_session<'a>(&'a self, question: &'a Question<'a>) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let Some(image) = question.image else { return false };
            allow_for_session(image, question.tool, question.client, self.timeout).await.is_ok()
        })
    }

    fn still_allowed<'a>(
        &'a self,
        tool: &'a str,
        image: Option<&'a Arc<Image>>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let Some(image) = image else { return false };
            still_allowed(image, tool, self.timeout, cancel.clone()).await
        })
    }
}

/// Asks the Emacs attached to the question's image; with a checked question, an approval names
/// the request to settle once it is known whether the call runs.
async fn ask_in_emacs(question: &Question<'_>) -> Verdict {
    let Question { tool, client, shown, checked, image, limit, cancel, .. } = *question;
    let Some(image) = image else { return Verdict::NobodyToAsk };
    let started = Instant::now();
    let answer = ask(image, (tool, client), (shown.to_string(), checked), limit, cancel.clone()).await;
    let approved = |for_session, id| Verdict::Approved { for_session, settle: checked.then_some(id) };
    match answer {
        _ if cancel.is_cancelled() => Verdict::Cancelled,
        Ok(Answer { verdict: EmacsVerdict::Yes, id }) => approved(false, id),
        Ok(Answer { verdict: EmacsVerdict::Always, id }) => approved(true, id),
        Ok(Answer { verdict: EmacsVerdict::No, .. }) => Verdict::Declined(declined(tool)),
        Ok(Answer { verdict: EmacsVerdict::Unavailable, .. }) => Verdict::NobodyToAsk,
        Ok(Answer { verdict: EmacsVerdict::TurnedOff, .. }) => Verdict::Declined(turned_off(tool)),
        Ok(Answer { verdict: EmacsVerdict::Timeout, .. }) => Verdict::TimedOut(unanswered(tool, limit)),
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

/// The error for a call whose approval request ended when the user turned approval mode off.
fn turned_off(tool: &str) -> ToolOutput {
    ToolOutput::error(format!(
        "{tool} was not run: the user turned approval mode off in Emacs (swank-mcp-approval-mode) while it waited \
         for an answer, and no other Emacs watches the image. Nothing changed. Do not retry it unasked: tell the \
         user what you wanted to do."
    ))
}

/// The user's answer in Emacs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum EmacsVerdict {
    /// Run the call.
    Yes,
    /// Do not run it.
    No,
    /// Run it, and later calls of the tool in this session unasked.
    Always,
    /// Nobody answered within the time limit.
    Timeout,
    /// No Emacs in approval mode watches the image.
    Unavailable,
    /// The last Emacs in approval mode turned it off while the call waited.
    TurnedOff,
}

/// How long past `--confirm-timeout` the server waits for the image's own end of the request.
const IMAGE_MARGIN: Duration = Duration::from_secs(10);

#[derive(Deserialize)]
struct Reply {
    verdict: EmacsVerdict,
    id: u64,
}

/// The Emacs answer to one approval request.
#[derive(Debug, Clone, Copy)]
struct Answer {
    /// What the user answered, or how the request ended without an answer.
    verdict: EmacsVerdict,
    /// The request's number in the image, which [`settle`] names.
    id: u64,
}

/// Makes `request` of the helper in `image` and checks the reply.
async fn call(image: &Image, request: Request, limits: &CallLimits) -> Result<crate::swank::Sexp, ToolError> {
    let reply = image.call_helper(request, limits).await?;
    check_failure(&reply)?;
    Ok(reply)
}

/// Asks the Emacs attached to `image` whether `tool`, called by the client named `client`, may
/// run as `text` describes, waiting at most `limit` and until `cancel`. With `checked`, a yes is
/// checked before the call runs, and the outcome must be told to Emacs ([`settle`]).
async fn ask(
    image: &Image,
    (tool, client): (&str, &str),
    (text, checked): (String, bool),
    limit: Duration,
    cancel: CancellationToken,
) -> Result<Answer, ToolError> {
    let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
    let request = Request::new(Entry::REQUEST_APPROVAL)
        .arg(tool)
        .arg(text)
        .key("client", client)
        .key("timeout-ms", limit_ms)
        .key("checked", checked);
    // The image ends the wait itself at `limit`, so that an answer is taken or refused in one
    // place (an answer after that is told "already ended"); this margin only guards against
    // an image that stopped answering.
    let limits = CallLimits {
        timeout: limit + IMAGE_MARGIN,
        timeout_advice: "The image did not end the approval request at --confirm-timeout; the call was not run and \
                         nothing changed.",
        cancel,
    };
    let reply = call(image, request, &limits).await?;
    let Reply { verdict, id } = decode("request-approval", &reply)?;
    Ok(Answer { verdict, id })
}

/// Tells the Emacs that approved request `id` of `image` whether the call runs: `refusal` says
/// why it does not. Failing to tell changes nothing for the call: that Emacs stops waiting after a
/// while and says it runs.
async fn settle(image: &Image, id: u64, refusal: Option<String>, timeout: Duration) {
    let limits = CallLimits { timeout, timeout_advice: "", cancel: CancellationToken::new() };
    let _ = call(image, Request::new(Entry::SETTLE_APPROVAL).arg(id).arg(refusal), &limits).await;
}

#[derive(Deserialize)]
struct Allowance {
    allowed: bool,
}

/// Tells `image` that the user allowed `tool` in Emacs for the rest of this session, for the
/// agent's client `client`: kept there, where Emacs can revoke it.
async fn allow_for_session(image: &Image, tool: &str, client: &str, timeout: Duration) -> Result<(), ToolError> {
    let limits = CallLimits { timeout, timeout_advice: "", cancel: CancellationToken::new() };
    call(image, Request::new(Entry::ALLOW_FOR_SESSION).arg(tool).arg(client), &limits).await?;
    Ok(())
}

/// Whether `tool`, which the user allowed in Emacs for this session, still is: the user may have
/// revoked it (swank-mcp-revoke-session-allowances). Asking failed counts as revoked.
async fn still_allowed(image: &Image, tool: &str, timeout: Duration, cancel: CancellationToken) -> bool {
    let limits = CallLimits { timeout, timeout_advice: "", cancel };
    match call(image, Request::new(Entry::SESSION_ALLOWED_P).arg(tool), &limits).await {
        Ok(reply) => decode::<Allowance>("session-allowed-p", &reply).is_ok_and(|found| found.allowed),
        Err(_) => false,
    }
}
