//! Asking the user's Emacs (`swank-mcp-approval-mode`, elisp-compat/swank-mcp.el) to approve a
//! call, through the image: the helper tells the Emacs connections in approval mode and holds the
//! request until one answers or `--confirm-timeout` passes (`lisp/activity.lisp`).

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::lisp_reply::decode;
use super::{Arguments, Progress, ToolContext, ToolError, Toolbox};
use crate::swank::Form;

/// The user's answer in Emacs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
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
}

/// How long past `--confirm-timeout` the server waits for the image's own end of the request.
const IMAGE_MARGIN: Duration = Duration::from_secs(10);

#[derive(Deserialize)]
struct Reply {
    verdict: EmacsVerdict,
}

impl Toolbox {
    /// Asks the Emacs attached to the image `arguments` name whether `tool`, called by the MCP
    /// client named `client`, may run as `text` describes, waiting at most `limit` and until
    /// `cancel`.
    pub async fn ask_emacs(
        self: &std::sync::Arc<Self>,
        arguments: &Option<Value>,
        (tool, client): (&str, &str),
        text: String,
        limit: Duration,
        cancel: CancellationToken,
    ) -> Result<EmacsVerdict, ToolError> {
        let args = image_arguments(arguments);
        let context =
            ToolContext { toolbox: self.clone(), settings: self.settings.clone(), cancel, progress: Progress::none() };
        let advice = "The image did not end the approval request at --confirm-timeout; the call was not run and \
                      nothing changed.";
        let limit_ms = i64::try_from(limit.as_millis()).unwrap_or(i64::MAX);
        let request = vec![
            Form::string(tool),
            Form::string(text),
            Form::Keyword("client"),
            Form::string(client),
            Form::Keyword("timeout-ms"),
            Form::Integer(limit_ms),
        ];
        // The image ends the wait itself at `limit`, so that an answer is taken or refused in one
        // place (an answer after that is told "already ended"); this margin only guards against
        // an image that stopped answering.
        let reply =
            context.call_helper_within(&args, "request-approval", request, limit + IMAGE_MARGIN, advice).await?;
        Ok(decode::<Reply>("request-approval", &reply)?.verdict)
    }
}

#[derive(Deserialize)]
struct Allowance {
    allowed: bool,
}

impl Toolbox {
    /// Tells the image `arguments` name that the user allowed `tool` in Emacs for the rest of this
    /// session, for the agent's client `client`: kept there, where Emacs can revoke it.
    pub async fn allow_in_emacs(
        self: &std::sync::Arc<Self>,
        arguments: &Option<Value>,
        tool: &str,
        client: &str,
    ) -> Result<(), ToolError> {
        let args = image_arguments(arguments);
        let context = ToolContext {
            toolbox: self.clone(),
            settings: self.settings.clone(),
            cancel: CancellationToken::new(),
            progress: Progress::none(),
        };
        let request = vec![Form::string(tool), Form::string(client)];
        context.call_helper(&args, "allow-for-session", request).await?;
        Ok(())
    }

    /// Whether `tool`, which the user allowed in Emacs for this session, still is: the user may
    /// have revoked it (swank-mcp-revoke-session-allowances). Asking failed counts as revoked.
    pub async fn still_allowed_in_emacs(
        self: &std::sync::Arc<Self>,
        arguments: &Option<Value>,
        tool: &str,
        cancel: CancellationToken,
    ) -> bool {
        let args = image_arguments(arguments);
        let context =
            ToolContext { toolbox: self.clone(), settings: self.settings.clone(), cancel, progress: Progress::none() };
        match context.call_helper(&args, "session-allowed-p", vec![Form::string(tool)]).await {
            Ok(reply) => decode::<Allowance>("session-allowed-p", &reply).is_ok_and(|found| found.allowed),
            Err(_) => false,
        }
    }
}

/// The call's `image` argument alone, which names the image to ask.
fn image_arguments(arguments: &Option<Value>) -> Arguments {
    match arguments.as_ref().and_then(|arguments| arguments.get("image")).and_then(Value::as_str) {
        Some(image) => Arguments::for_image(image),
        None => Arguments::default(),
    }
}
