//! The record of every tool call that the user's Emacs shows (`M-x swank-mcp-activity`,
//! elisp-compat/swank-mcp.el): this server tells the image each call's state as it changes
//! (waiting for approval, running, and how it ended, with the reply text the agent received), and
//! the image keeps the bounded record (`lisp/activity.lisp`). Only the server sees every call:
//! those the human declined, those that failed before reaching the image, and the text as the
//! agent gets it, after formatting.
//!
//! Notes go out in order on a task of their own, so that a call never waits for its record. A
//! call refused before it reached the image is recorded too, which connects to an image given by
//! `--port` or `--connect`; an image `--launch` would start is not started for a record.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::image::{CallLimits, Image};
use crate::swank::Form;
use crate::tools::Toolbox;

/// The reply text kept for Emacs; the rest is counted.
const MAX_RECORDED_CHARS: usize = 20_000;

/// The input shown for a call; the rest is counted.
const MAX_INPUT_CHARS: usize = 4_000;

/// How long the first note of a batch waits for others: a call that ends sooner is recorded by
/// one request, and the record is this much behind the calls.
const GATHER: Duration = Duration::from_millis(5);

/// How long the image may take to take one note.
const NOTE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a call is, as the record shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallState {
    /// Waiting for the human's approval (`--confirm`).
    Waiting,
    /// Running.
    Running,
    /// The human declined it.
    Declined,
    /// Nobody answered the approval request in time.
    TimedOut,
    /// The client cancelled it.
    Cancelled,
    /// It ended with an error (or could not be asked about).
    Failed,
    /// It succeeded.
    Done,
}

impl CallState {
    fn keyword(self) -> &'static str {
        match self {
            CallState::Waiting => "waiting",
            CallState::Running => "running",
            CallState::Declined => "declined",
            CallState::TimedOut => "timed-out",
            CallState::Cancelled => "cancelled",
            CallState::Failed => "failed",
            CallState::Done => "done",
        }
    }
}

struct Note {
    image: Arc<Image>,
    form: Vec<Form>,
}

/// The feed of one MCP session's calls, or of one `swank-mcp eval`, into the images' records.
pub struct ActivityFeed {
    notes: mpsc::UnboundedSender<Note>,
    sender: tokio::task::JoinHandle<()>,
    next_call: AtomicU64,
}

/// One call as the record shows it, from its start to its end.
pub struct RecordedCall {
    image: Option<Arc<Image>>,
    id: String,
    tool: String,
    input: String,
    package: Option<String>,
    client: String,
    started: std::time::Instant,
}

impl RecordedCall {
    /// Whether the image the call is recorded in has a live connection now.
    pub fn image_connected(&self) -> bool {
        self.image.as_ref().is_some_and(|image| image.current_connection().is_some())
    }

    /// Runs `work` as this call, so that the image knows which call its evaluations are for.
    pub async fn run<F: std::future::Future>(&self, work: F) -> F::Output {
        crate::image::call_tag::for_call(&self.id, &self.tool, work).await
    }
}

impl ActivityFeed {
    /// A feed whose notes a task of its own sends; call within the server's runtime. The notes
    /// that come within [`GATHER`] of the first, or while a batch is on its way, go together in
    /// one request per image: a quick call's start and end cost the image one request, and a
    /// busy agent's calls one request at a time.
    pub fn start() -> Self {
        let (notes, mut queue) = mpsc::unbounded_channel::<Note>();
        let sender = tokio::spawn(async move {
            while let Some(first) = queue.recv().await {
                tokio::time::sleep(GATHER).await;
                let mut batches: Vec<(Arc<Image>, Vec<Form>)> = Vec::new();
                let mut next = Some(first);
                while let Some(note) = next {
                    match batches.iter_mut().find(|(image, _)| Arc::ptr_eq(image, &note.image)) {
                        Some((_, forms)) => forms.push(Form::List(note.form)),
                        None => batches.push((note.image, vec![Form::List(note.form)])),
                    }
                    next = queue.try_recv().ok();
                }
                for (image, forms) in batches {
                    // An image this server would start is not started for a record.
                    if image.current_connection().is_none() && image.launches() {
                        continue;
                    }
                    let limits =
                        CallLimits { timeout: NOTE_TIMEOUT, timeout_advice: "", cancel: CancellationToken::new() };
                    let notes = vec![Form::call("cl", "quote", [Form::List(forms)])];
                    if let Err(error) = image.call_helper("note-activities", notes, &limits).await {
                        tracing::debug!(%error, "the activity record could not be updated");
                    }
                }
            }
        });
        Self { notes, sender, next_call: AtomicU64::new(1) }
    }

    /// Returns once every note given so far has been sent (or has failed): a one-shot command
    /// that exits right after its call would otherwise take the call's end with it.
    pub async fn finish(self) {
        drop(self.notes);
        let _ = self.sender.await;
    }

    /// A call of `tool` with `arguments` starts (in `state`), for the client named `client`.
    pub fn begin(
        &self,
        toolbox: &Toolbox,
        tool: &str,
        arguments: &Option<Value>,
        client: &str,
        state: CallState,
    ) -> RecordedCall {
        let object = arguments.as_ref().and_then(Value::as_object);
        let argument = |name: &str| object.and_then(|o| o.get(name)).and_then(Value::as_str);
        let images = toolbox.images();
        let image = match argument("image") {
            Some(name) => images.iter().find(|image| image.name() == name).cloned(),
            None => images.first().cloned(),
        };
        let input = match argument("code") {
            Some(code) => code.to_string(),
            None => match object {
                Some(object) if !object.is_empty() => Value::Object(object.clone()).to_string(),
                _ => String::new(),
            },
        };
        let call = RecordedCall {
            id: format!(
                "{}-call-{}",
                image.as_ref().map_or("", |image| image.session()),
                self.next_call.fetch_add(1, Ordering::Relaxed)
            ),
            image,
            tool: tool.to_string(),
            input: bounded(input, MAX_INPUT_CHARS),
            package: argument("package").map(str::to_string),
            client: client.to_string(),
            started: std::time::Instant::now(),
        };
        self.note(&call, state, None);
        call
    }

    /// `call` is now in `state`.
    pub fn update(&self, call: &RecordedCall, state: CallState) {
        self.note(call, state, None);
    }

    /// `call` ended in `state` with `text`, the reply the agent receives.
    pub fn end(&self, call: &RecordedCall, state: CallState, text: &str) {
        self.note(call, state, Some(text));
    }

    fn note(&self, call: &RecordedCall, state: CallState, text: Option<&str>) {
        let Some(image) = call.image.clone() else { return };
        let mut form = vec![
            Form::string(call.id.clone()),
            Form::string(call.tool.clone()),
            Form::Keyword(state.keyword()),
            Form::Keyword("input"),
            Form::string(call.input.clone()),
            Form::Keyword("client"),
            Form::string(call.client.clone()),
        ];
        if let Some(package) = &call.package {
            form.extend([Form::Keyword("package"), Form::string(package.clone())]);
        }
        if let Some(text) = text {
            let milliseconds = i64::try_from(call.started.elapsed().as_millis()).unwrap_or(i64::MAX);
            form.extend([
                Form::Keyword("text"),
                Form::string(bounded(text.to_string(), MAX_RECORDED_CHARS)),
                Form::Keyword("milliseconds"),
                Form::Integer(milliseconds),
            ]);
        }
        // The receiver lives as long as the runtime; a send after it ended has nowhere to go.
        let _ = self.notes.send(Note { image, form });
    }
}

/// `text` cut to `limit` characters, saying how many more there were.
fn bounded(mut text: String, limit: usize) -> String {
    if let Some((cut, _)) = text.char_indices().nth(limit) {
        let more = text[cut..].chars().count();
        text.truncate(cut);
        text.push_str(&format!("\n[... {more} more characters not recorded]"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::bounded;

    #[test]
    fn a_long_text_is_cut_on_a_character_and_says_how_much_was_left_out() {
        assert_eq!(bounded("abc".into(), 3), "abc");
        assert_eq!(bounded("αβγδ".into(), 2), "αβ\n[... 2 more characters not recorded]");
    }
}
