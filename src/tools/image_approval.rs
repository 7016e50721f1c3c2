//! Asking the user's Emacs (`swank-mcp-approval-mode`, elisp-compat/swank-mcp.el) to approve a
//! call, through the image: the helper holds the request until Emacs, which polls the image while
//! the mode is on, answers it (`lisp/activity.lisp`).

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
    /// No Emacs in approval mode watches the image.
    Unavailable,
}

#[derive(Deserialize)]
struct Reply {
    verdict: EmacsVerdict,
}

impl Toolbox {
    /// Asks the Emacs attached to the image `arguments` name whether `tool` may run as `text`
    /// describes, waiting at most `limit` and until `cancel`.
    pub async fn ask_emacs(
        self: &std::sync::Arc<Self>,
        arguments: &Option<Value>,
        tool: &str,
        text: String,
        limit: Duration,
        cancel: CancellationToken,
    ) -> Result<EmacsVerdict, ToolError> {
        let args = Arguments::from_value(arguments.clone().filter(Value::is_object))?;
        let context =
            ToolContext { toolbox: self.clone(), settings: self.settings.clone(), cancel, progress: Progress::none() };
        let advice = "The user did not answer the approval request in Emacs within --confirm-timeout; the call was \
                      not run and nothing changed.";
        let request = vec![Form::string(tool), Form::string(text)];
        let reply = context.call_helper_within(&args, "request-approval", request, limit, advice).await?;
        Ok(decode::<Reply>("request-approval", &reply)?.verdict)
    }
}
