//! Asking the user's Emacs (`swank-mcp-approval-mode`, elisp-compat/swank-mcp.el) to approve a
//! call, through the image: the helper tells the Emacs connections in approval mode and holds the
//! request until one answers or `--confirm-timeout` passes (`lisp/activity.lisp`). And the
//! allowances for the rest of a session that the person gives there, which the image keeps so
//! that Emacs can revoke them.
//!
//! See docs/design.md, "Emacs".

use crate::image::Entry;
use std::time::Duration;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::image::{CallLimits, Image, Request};
use crate::tools::lisp_reply::{check_failure, decode};
use crate::tools::ToolError;

/// The user's answer in Emacs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EmacsVerdict {
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
pub struct Answer {
    /// What the user answered, or how the request ended without an answer.
    pub verdict: EmacsVerdict,
    /// The request's number in the image, which [`settle`] names.
    pub id: u64,
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
pub async fn ask(
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
pub async fn settle(image: &Image, id: u64, refusal: Option<String>, timeout: Duration) {
    let limits = CallLimits { timeout, timeout_advice: "", cancel: CancellationToken::new() };
    let _ = call(image, Request::new(Entry::SETTLE_APPROVAL).arg(id).arg(refusal), &limits).await;
}

#[derive(Deserialize)]
struct Allowance {
    allowed: bool,
}

/// Tells `image` that the user allowed `tool` in Emacs for the rest of this session, for the
/// agent's client `client`: kept there, where Emacs can revoke it.
pub async fn allow_for_session(image: &Image, tool: &str, client: &str, timeout: Duration) -> Result<(), ToolError> {
    let limits = CallLimits { timeout, timeout_advice: "", cancel: CancellationToken::new() };
    call(image, Request::new(Entry::ALLOW_FOR_SESSION).arg(tool).arg(client), &limits).await?;
    Ok(())
}

/// Whether `tool`, which the user allowed in Emacs for this session, still is: the user may have
/// revoked it (swank-mcp-revoke-session-allowances). Asking failed counts as revoked.
pub async fn still_allowed(image: &Image, tool: &str, timeout: Duration, cancel: CancellationToken) -> bool {
    let limits = CallLimits { timeout, timeout_advice: "", cancel };
    match call(image, Request::new(Entry::SESSION_ALLOWED_P).arg(tool), &limits).await {
        Ok(reply) => decode::<Allowance>("session-allowed-p", &reply).is_ok_and(|found| found.allowed),
        Err(_) => false,
    }
}
