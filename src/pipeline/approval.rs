//! `--confirm`: tool calls that wait for the human's yes before they run (docs/design.md, "One
//! call"). The human is asked through the caller when it can ask (an MCP client that elicits),
//! else in the image's Emacs when it is in `swank-mcp-approval-mode`; a call nobody can be asked
//! about is refused with an error that says how to approve otherwise. What the human is shown is
//! the tool's own preview, and the approved call carries the preview's fingerprint, so that it
//! refuses to run on a file that changed since.

use crate::sync::lock;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::observe::Ending;
use crate::emacs::approval::{self as emacs, EmacsVerdict};
use crate::image::Image;
use crate::tools::{Arguments, Fingerprint, Offered, Preview, ToolOutput, Toolbox};

/// Stands for every offered tool that is not read-only in `--confirm`.
pub const MUTATING: &str = "mutating";

/// The preview of a call shows at most this much (of an edit's diff, a loaded file); the rest is
/// counted.
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

/// A way to ask the human that the caller has of its own (an MCP client's elicitation).
pub trait Ask: Send + Sync {
    /// Asks whether `tool` may run, showing `shown`, waiting at most `limit` and until `cancel`.
    fn ask<'a>(
        &'a self,
        tool: &'a str,
        shown: &'a str,
        limit: Duration,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Verdict>;
}

/// Who makes a call: the name the records give it, and how its human can be asked.
pub struct Caller {
    /// The client's name (`clientInfo.name`, or `swank-mcp eval`), for the records and the
    /// approval prompt in Emacs.
    pub client: String,
    /// Its own way to ask the human; without one, the image's Emacs is asked.
    pub asks: Option<Arc<dyn Ask>>,
    /// Why the caller cannot ask the human itself, as the refusal of a call nobody could be asked
    /// about says it ("this MCP client cannot ask for it (...)").
    pub cannot_ask: String,
}

/// The error for a call that nobody can be asked about.
fn cannot_ask(tool: &str, caller: &Caller) -> ToolOutput {
    ToolOutput::error(format!(
        "{tool} was not run: this swank-mcp runs with --confirm, so {tool} needs the user's approval, and {}, nor \
         is the image's Emacs in swank-mcp-approval-mode. Nothing changed. To approve calls, the user can turn on \
         M-x swank-mcp-approval-mode in the Emacs attached to the image (elisp-compat/swank-mcp.el), or use an MCP \
         client that supports elicitation, or run swank-mcp without {tool} in --confirm.",
        caller.cannot_ask
    ))
}

pub(crate) fn unanswered(tool: &str, limit: Duration) -> ToolOutput {
    ToolOutput::error(format!(
        "{tool} was not run: the user did not answer the approval request within {} s (--confirm-timeout). Nothing \
         changed.",
        limit.as_secs()
    ))
}

/// The error for a call whose approval request ended when the user turned approval mode off.
fn turned_off(tool: &str) -> ToolOutput {
    ToolOutput::error(format!(
        "{tool} was not run: the user turned approval mode off in Emacs (swank-mcp-approval-mode) while it waited \
         for an answer, and no other Emacs watches the image. Nothing changed. Do not retry it unasked: tell the \
         user what you wanted to do."
    ))
}

/// The error for an approved call whose `files` changed while the human looked at its preview.
fn changed_before_the_answer(tool: &str, files: &str) -> ToolOutput {
    ToolOutput::error(format!(
        "{tool} was not run: {files} changed between the preview the user was shown and their answer, so it would \
         not do what they approved. Nothing was written or loaded; call it again to ask for approval of the file as \
         it is now."
    ))
}

pub(crate) fn declined(tool: &str) -> ToolOutput {
    ToolOutput::error(format!("{tool} was declined by the user; it did not run and nothing changed."))
}

/// `--confirm` and what the human allowed for the rest of the session.
pub(crate) struct Approvals {
    policy: ConfirmPolicy,
    /// Tools the human allowed for the rest of the session when the caller asked them.
    for_session: Mutex<HashSet<String>>,
    /// Tools the human allowed for the rest of the session in Emacs: the image keeps the
    /// allowance, which Emacs can revoke, so it is checked there before each call.
    in_emacs: Mutex<HashSet<String>>,
}

impl Approvals {
    pub fn new(policy: ConfirmPolicy) -> Self {
        Self { policy, for_session: Mutex::default(), in_emacs: Mutex::default() }
    }

    /// Whether a call of `tool` in `image` waits for the human's approval now: `--confirm` names
    /// it, and the human has not allowed it for the session (or has revoked that in Emacs).
    pub async fn needed(
        &self,
        toolbox: &Toolbox,
        tool: &str,
        image: Option<&Arc<Image>>,
        cancel: &CancellationToken,
    ) -> bool {
        if !self.policy.requires(tool) || lock(&self.for_session).contains(tool) {
            return false;
        }
        if !lock(&self.in_emacs).contains(tool) {
            return true;
        }
        let timeout = toolbox.eval_timeout();
        if let Some(image) = image {
            if emacs::still_allowed(image, tool, timeout, cancel.clone()).await {
                return false;
            }
        }
        lock(&self.in_emacs).remove(tool);
        true
    }

    /// Shows the human the tool's preview of the call and waits for the answer: the fingerprint
    /// of what was shown, for the tool to check before it acts, when the call may run; when it
    /// may not, how the call ends and the output to return instead.
    pub async fn obtain(
        &self,
        toolbox: &Arc<Toolbox>,
        (tool, args): (&Offered, &Arguments),
        image: Option<&Arc<Image>>,
        caller: &Caller,
        cancel: &CancellationToken,
    ) -> Result<Option<Fingerprint>, (Ending, ToolOutput)> {
        let name = tool.name();
        let limit = self.policy.timeout;
        let preview = toolbox.preview(tool, args).await.map_err(|error| (Ending::Refused, error.into()))?;
        let shown = cut(preview.text);
        let checked = preview.fingerprint.is_some();
        let (verdict, asked_in, settle) = match (&caller.asks, image) {
            (Some(asks), _) => (asks.ask(name, &shown, limit, cancel).await, None, None),
            (None, Some(image)) => {
                let (verdict, settle) = ask_emacs(image, (name, caller), (shown, checked), limit, cancel).await;
                (verdict, Some(image), settle)
            }
            (None, None) => (Verdict::Refused(cannot_ask(name, caller)), None, None),
        };
        // Checked now, not only as the tool starts: the Emacs that approved waits to say whether
        // the call runs, and the agent is told the file changed before the answer, not after.
        let changed = match (&verdict, &preview.fingerprint) {
            (Verdict::Approved { .. }, Some((shown, files))) => match toolbox.preview(tool, args).await {
                Ok(Preview { fingerprint: Some((now, _)), .. }) if now == *shown => None,
                _ => Some(files.clone()),
            },
            _ => None,
        };
        if let (Some(image), Some(id)) = (asked_in, settle) {
            let refusal = changed.as_ref().map(|files| format!("{files} changed since the prompt was shown"));
            emacs::settle(image, id, refusal, toolbox.eval_timeout()).await;
        }
        if let Some(files) = changed {
            return Err((Ending::Refused, changed_before_the_answer(name, &files)));
        }
        match (verdict, asked_in) {
            (Verdict::Approved { for_session: true }, Some(image)) => {
                // Not kept when the image cannot keep it: the next call asks again.
                if emacs::allow_for_session(image, name, &caller.client, toolbox.eval_timeout()).await.is_ok() {
                    lock(&self.in_emacs).insert(name.to_string());
                }
            }
            (Verdict::Approved { for_session }, _) => {
                if for_session {
                    lock(&self.for_session).insert(name.to_string());
                }
            }
            (Verdict::Declined(output), _) => return Err((Ending::Declined, output)),
            (Verdict::TimedOut(output), _) => return Err((Ending::TimedOut, output)),
            (Verdict::Refused(output), _) => return Err((Ending::Refused, output)),
            (Verdict::Cancelled, _) => {
                let output = ToolOutput::error(format!("{name} was not run: the client cancelled the call."));
                return Err((Ending::Cancelled, output));
            }
        }
        Ok(preview.fingerprint.map(|(fingerprint, _)| fingerprint))
    }
}

/// Asks the user's Emacs, through `image`, whether `tool` may run for `caller`, showing `shown`;
/// with `checked`, also the number of the request, once approved, that must be settled
/// ([`emacs::settle`]) after the check.
async fn ask_emacs(
    image: &Image,
    (tool, caller): (&str, &Caller),
    (shown, checked): (String, bool),
    limit: Duration,
    cancel: &CancellationToken,
) -> (Verdict, Option<u64>) {
    let started = std::time::Instant::now();
    let answer = emacs::ask(image, (tool, &caller.client), (shown, checked), limit, cancel.clone()).await;
    let settle = match &answer {
        Ok(answer) if checked && matches!(answer.verdict, EmacsVerdict::Yes | EmacsVerdict::Always) => Some(answer.id),
        _ => None,
    };
    let verdict = match answer.map(|answer| answer.verdict) {
        _ if cancel.is_cancelled() => Verdict::Cancelled,
        Ok(EmacsVerdict::Yes) => Verdict::Approved { for_session: false },
        Ok(EmacsVerdict::Always) => Verdict::Approved { for_session: true },
        Ok(EmacsVerdict::No) => Verdict::Declined(declined(tool)),
        Ok(EmacsVerdict::Unavailable) => Verdict::Refused(cannot_ask(tool, caller)),
        Ok(EmacsVerdict::TurnedOff) => Verdict::Declined(turned_off(tool)),
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
    };
    (verdict, settle)
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
