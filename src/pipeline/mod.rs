//! One call, however it comes: an MCP `tools/call`, or `swank-mcp eval` at a shell
//! (docs/design.md, "One call"). Every call goes the same way: its arguments are checked against
//! the tool's declaration, then, when `--confirm` names the tool, the human approves the tool's
//! own preview of it ([`approval`]); the observers ([`observe`]: the activity record, the audit
//! log) are told of it as it goes; and the tool runs. An invalid call is refused before anyone is
//! asked about it.

pub mod approval;
pub mod observe;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::image::call_tag;
use crate::tools::{Progress, ToolError, ToolOutput, Toolbox};
use approval::Approvals;
pub use approval::{Ask, Caller, ConfirmPolicy, Question, Verdict};
use observe::{CallStart, Ending, Observation, Observer};

/// The way every call goes, for one session of calls (an MCP session, or one `swank-mcp eval`):
/// the session's approvals and its observers.
pub struct Pipeline {
    toolbox: Arc<Toolbox>,
    approvals: Approvals,
    observers: Vec<Box<dyn Observer>>,
    /// The number of the next call, for its id.
    next_call: AtomicU64,
}

/// One call to make.
pub struct Call<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// Its `arguments`, as the caller sent them.
    pub arguments: Option<Value>,
    /// Who calls.
    pub caller: &'a Caller,
    /// Cancelled when the caller no longer wants the answer.
    pub cancel: CancellationToken,
    /// Where its progress reports go.
    pub progress: Progress,
}

impl Pipeline {
    /// Calls go to the tools `toolbox` offers, wait for approval as `confirm` says (asked of
    /// `asks` when the caller cannot ask the human itself), and are told to `observers`.
    pub fn new(
        toolbox: Arc<Toolbox>,
        confirm: ConfirmPolicy,
        asks: Option<Arc<dyn Ask>>,
        observers: Vec<Box<dyn Observer>>,
    ) -> Self {
        Self { toolbox, approvals: Approvals::new(confirm, asks), observers, next_call: AtomicU64::new(1) }
    }

    /// The tools calls go to.
    pub fn toolbox(&self) -> &Arc<Toolbox> {
        &self.toolbox
    }

    /// Makes `call`: its output, or `None` when there is no such tool. A cancelled call's output
    /// is for the records only: its caller no longer wants it.
    pub async fn call(&self, call: Call<'_>) -> Option<ToolOutput> {
        let Call { tool: name, arguments, caller, cancel, progress } = call;
        let toolbox = &self.toolbox;
        let image = toolbox.image_for(&arguments);
        let number = self.next_call.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-call-{number}", image.as_ref().map_or("", |image| image.session()));
        let start = |waiting| CallStart {
            id: &id,
            tool: name,
            arguments: &arguments,
            client: &caller.client,
            image: image.as_ref(),
            waiting,
        };
        let Some(tool) = toolbox.tool(name) else {
            end(self.begin(&start(false)), Ending::UnknownTool, &format!("Unknown tool: {name}"));
            return None;
        };
        let checked = toolbox.check_arguments(tool, &arguments);
        let looks_only = tool.looks_only(arguments.as_ref());
        let asks = checked.is_ok() && self.approvals.needed((name, looks_only), image.as_ref(), &cancel).await;
        let mut observations = self.begin(&start(asks));
        let (ending, output) = match checked {
            Err(error) => (Ending::Failed, ToolOutput::from(ToolError::from(error))),
            Ok(()) => {
                let args = Toolbox::accept_arguments(arguments);
                // The image names the threads of the call's evaluations after it, and the user
                // can cancel it by its id (from Emacs, while it waits or runs).
                call_tag::for_call(&id, name, async {
                    let approved = if asks {
                        self.approvals.obtain(toolbox, (tool, &args), image.as_ref(), caller, &cancel).await
                    } else {
                        Ok(None)
                    };
                    match approved {
                        Err(refused) => refused,
                        // Cancelled before it started (while it waited for approval, or before
                        // that): it never starts.
                        Ok(_) if cancel.is_cancelled() => (
                            Ending::Cancelled,
                            ToolOutput::error(format!("{name} was not run: the client cancelled the call.")),
                        ),
                        Ok(fingerprint) => {
                            if asks {
                                observations.iter_mut().for_each(|observation| observation.running());
                            }
                            let output = toolbox.run(tool, &args, cancel.clone(), progress, fingerprint).await;
                            (if output.is_error { Ending::Failed } else { Ending::Done }, output)
                        }
                    }
                })
                .await
            }
        };
        let ending = if cancel.is_cancelled() { Ending::Cancelled } else { ending };
        end(observations, ending, &output.text);
        Some(output)
    }

    fn begin(&self, start: &CallStart<'_>) -> Vec<Box<dyn Observation>> {
        self.observers.iter().map(|observer| observer.begin(start)).collect()
    }

    /// Returns once the observers have sent on what they were told, for a one-shot command that
    /// exits next.
    pub async fn finish(self) {
        for observer in self.observers {
            observer.finish().await;
        }
    }
}

fn end(observations: Vec<Box<dyn Observation>>, ending: Ending, text: &str) {
    for observation in observations {
        observation.end(ending, text);
    }
}
