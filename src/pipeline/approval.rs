//! `--confirm`: tool calls that wait for the human's yes before they run (docs/design.md, "One
//! call"). The human is asked through the caller when it can ask (an MCP client that elicits),
//! else the way the pipeline was given (the image's Emacs when it is in `swank-mcp-approval-mode`):
//! both are an [`Ask`], which `main.rs` hands over, and this module knows neither. A call nobody
//! can be asked about is refused with an error that says how to approve otherwise. What the human
//! is shown is the tool's own preview, and the approved call carries the preview's fingerprint, so
//! that it refuses to run on a file that changed since.

use crate::sync::lock;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::observe::Ending;
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
    /// The tools `--confirm` names.
    tools: HashSet<String>,
    /// The tools `mutating` stands for, whose calls that only look run unasked.
    mutating: HashSet<String>,
    /// How long a call waits for the answer before it is refused.
    pub timeout: Duration,
}

impl ConfirmPolicy {
    /// The policy for `--confirm` naming `names` (tool names, or [`MUTATING`]) among the tools
    /// `toolbox` offers. An unknown name is an error that lists the offered tools.
    pub fn new(names: &[String], toolbox: &Toolbox, timeout: Duration) -> Result<Self, String> {
        let (mut tools, mut mutating) = (HashSet::new(), HashSet::new());
        for name in names {
            if name == MUTATING {
                mutating.extend(toolbox.definitions().filter(|d| !d.read_only).map(|d| d.name.to_string()));
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
        Ok(Self { tools, mutating, timeout })
    }

    /// Whether a call of `tool` waits for approval; `looks_only` when it changes nothing (a list
    /// of `threads`), which only a tool named itself waits for.
    pub fn requires(&self, tool: &str, looks_only: bool) -> bool {
        self.tools.contains(tool) || (self.mutating.contains(tool) && !looks_only)
    }
}

/// The human's answer to one approval request.
#[derive(Debug)]
pub enum Verdict {
    /// Run the call; `for_session` when the human allowed the tool for the rest of the session.
    Approved {
        /// Calls of this tool need no approval any more in this session.
        for_session: bool,
        /// The number of the request whose asker waits to hear whether the approved call runs
        /// after all ([`Ask::settle`]), when the question was checked and the asker waits.
        settle: Option<u64>,
    },
    /// The human declined the call; the output says so.
    Declined(ToolOutput),
    /// Nobody answered within the time limit; the output says so.
    TimedOut(ToolOutput),
    /// Do not run the call: asking failed; the output says why.
    Refused(ToolOutput),
    /// Nobody can be asked this way (no Emacs in approval mode watches the image): the call is
    /// refused with what the user can do instead.
    NobodyToAsk,
    /// The client cancelled the call while it waited.
    Cancelled,
    /// The caller asks the human itself once this call has ended, and calls again with the answer.
    Deferred,
}

/// What the human is asked: whether one call may run.
#[derive(Clone, Copy)]
pub struct Question<'a> {
    /// The tool called.
    pub tool: &'a str,
    /// Who calls it ([`Caller::client`]).
    pub client: &'a str,
    /// What the human is shown: the tool's preview of the call.
    pub shown: &'a str,
    /// The call: the tool and its arguments, for an answer given between two requests to be
    /// checked against the call it comes back with.
    pub call: Fingerprint,
    /// What was shown, and the files it was made from, for the same check.
    pub preview: Fingerprint,
    /// The files the preview was made from, as messages name them.
    pub files: Option<&'a str>,
    /// An approval is checked before the call runs (the files it changes must still be as
    /// shown), and whoever approved may wait to hear the outcome ([`Ask::settle`]).
    pub checked: bool,
    /// The image the call works in, if it names one that exists (or the default).
    pub image: Option<&'a Arc<Image>>,
    /// How long to wait for the answer.
    pub limit: Duration,
    /// Cancelled when the caller no longer wants the call.
    pub cancel: &'a CancellationToken,
}

/// A way to ask the human whether a call may run: the caller's own ([`Caller::asks`], an MCP
/// client's elicitation), or the one the pipeline was given for callers without one (the user's
/// Emacs, through the image the call works in).
pub trait Ask: Send + Sync {
    /// Asks `question`, waiting at most its limit and until its cancellation.
    fn ask<'a>(&'a self, question: &'a Question<'a>) -> BoxFuture<'a, Verdict>;

    /// Tells whoever approved `question` as request `request` whether the call runs: `refusal`
    /// says why it does not. Asked only after an approval that names a request to settle.
    fn settle<'a>(&'a self, _question: &'a Question<'a>, _request: u64, _refusal: Option<String>) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// Keeps the human's allowance of the question's tool for the rest of the session where
    /// they can revoke it: false when it could not be kept, and the next call asks again. By
    /// default the pipeline alone keeps it, for good.
    fn allow_for_session<'a>(&'a self, _question: &'a Question<'a>) -> BoxFuture<'a, bool> {
        Box::pin(async { true })
    }

    /// Whether an allowance of `tool` given this way still holds for a call in `image`: the
    /// human may have revoked it where it is kept.
    fn still_allowed<'a>(
        &'a self,
        _tool: &'a str,
        _image: Option<&'a Arc<Image>>,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async { true })
    }
}

/// Who makes a call: the name the records give it, and how its human can be asked.
pub struct Caller {
    /// The client's name (`clientInfo.name`, or `swank-mcp eval`), for the records and the
    /// approval prompt in Emacs.
    pub client: String,
    /// Its own way to ask the human; without one, the pipeline's is asked (the image's Emacs).
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

/// The error for an approved call whose `files` changed while the human looked at its preview.
pub(crate) fn changed_before_the_answer(tool: &str, files: &str) -> ToolOutput {
    ToolOutput::error(format!(
        "{tool} was not run: {files} changed between the preview the user was shown and their answer, so it would \
         not do what they approved. Nothing was written or loaded; call it again to ask for approval of the file as \
         it is now."
    ))
}

pub(crate) fn declined(tool: &str) -> ToolOutput {
    ToolOutput::error(format!("{tool} was declined by the user; it did not run and nothing changed."))
}

/// `--confirm`, the way to ask for callers without one, and what the human allowed for the rest
/// of the session.
pub(crate) struct Approvals {
    policy: ConfirmPolicy,
    /// Asked when the caller cannot ask the human itself.
    fallback: Option<Arc<dyn Ask>>,
    /// The tools the human allowed for the rest of the session, each with the way they were asked,
    /// which says whether the allowance still holds before each call.
    for_session: Mutex<HashMap<String, Arc<dyn Ask>>>,
}

impl Approvals {
    pub fn new(policy: ConfirmPolicy, fallback: Option<Arc<dyn Ask>>) -> Self {
        Self { policy, fallback, for_session: Mutex::default() }
    }

    /// Whether a call of `tool` in `image` waits for the human's approval now: `--confirm` names
    /// it (or `mutating`, and the call does more than look), and the human has not allowed it for
    /// the session (or has revoked that).
    pub async fn needed(
        &self,
        (tool, looks_only): (&str, bool),
        image: Option<&Arc<Image>>,
        cancel: &CancellationToken,
    ) -> bool {
        if !self.policy.requires(tool, looks_only) {
            return false;
        }
        let Some(asked) = lock(&self.for_session).get(tool).cloned() else { return true };
        if asked.still_allowed(tool, image, cancel).await {
            return false;
        }
        lock(&self.for_session).remove(tool);
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
        let preview = toolbox.preview(tool, args).await.map_err(|error| (Ending::Refused, error.into()))?;
        let shown = cut(preview.text);
        let arguments = serde_json::to_vec(args.values()).unwrap_or_default();
        let file = preview.fingerprint.as_ref().map(|(fingerprint, _)| fingerprint.to_string()).unwrap_or_default();
        let question = Question {
            tool: name,
            client: &caller.client,
            shown: &shown,
            call: Fingerprint::of_all([name.as_bytes(), &arguments]),
            preview: Fingerprint::of_all([shown.as_bytes(), file.as_bytes()]),
            files: preview.fingerprint.as_ref().map(|(_, files)| files.as_str()),
            checked: preview.fingerprint.is_some(),
            image,
            limit: self.policy.timeout,
            cancel,
        };
        let asks = caller.asks.as_ref().or(self.fallback.as_ref());
        let verdict = match asks {
            Some(asks) => asks.ask(&question).await,
            None => Verdict::NobodyToAsk,
        };
        // Checked now, not only as the tool starts: whoever approved may wait to say whether the
        // call runs, and the agent is told the file changed before the answer, not after.
        let changed = match (&verdict, &preview.fingerprint) {
            (Verdict::Approved { .. }, Some((shown, files))) => match toolbox.preview(tool, args).await {
                Ok(Preview { fingerprint: Some((now, _)), .. }) if now == *shown => None,
                _ => Some(files.clone()),
            },
            _ => None,
        };
        if let (Some(asks), Verdict::Approved { settle: Some(request), .. }) = (asks, &verdict) {
            let refusal = changed.as_ref().map(|files| format!("{files} changed since the prompt was shown"));
            asks.settle(&question, *request, refusal).await;
        }
        if let Some(files) = changed {
            return Err((Ending::Refused, changed_before_the_answer(name, &files)));
        }
        match verdict {
            Verdict::Approved { for_session, .. } => {
                // Not kept when it cannot be kept where the human can revoke it: the next call
                // asks again.
                if let (true, Some(asks)) = (for_session, asks) {
                    if asks.allow_for_session(&question).await {
                        lock(&self.for_session).insert(name.to_string(), asks.clone());
                    }
                }
                Ok(preview.fingerprint.map(|(fingerprint, _)| fingerprint))
            }
            Verdict::Declined(output) => Err((Ending::Declined, output)),
            Verdict::TimedOut(output) => Err((Ending::TimedOut, output)),
            Verdict::Refused(output) => Err((Ending::Refused, output)),
            Verdict::NobodyToAsk => Err((Ending::Refused, cannot_ask(name, caller))),
            Verdict::Cancelled => {
                let output = ToolOutput::error(format!("{name} was not run: the client cancelled the call."));
                Err((Ending::Cancelled, output))
            }
            Verdict::Deferred => {
                let output = ToolOutput::error(format!(
                    "{name} was not run yet: the MCP client asks the user, and calls it again with their answer."
                ));
                Err((Ending::Deferred, output))
            }
        }
    }
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
