//! Approval in MCP 2026-07-28, where a server sends the client no requests (basic/patterns/mrtr):
//! a call that waits for the human's yes ends with an `input_required` result that carries the
//! approval form and a `requestState`, and the client calls again with the human's answer and that
//! state. The state is sealed with the per-process key of the fingerprints ([`Fingerprint`]) and
//! names the call (tool and arguments) and what the human was shown (with the files it was made
//! from), so that an answer approves that call as shown and nothing else, once, within
//! `--confirm-timeout`.
//!
//! See docs/design.md, "One call".

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::elicitation::{approval_form, verdict_of};
use crate::pipeline::approval::{changed_before_the_answer, unanswered};
use crate::pipeline::{Ask, Question, Verdict};
use crate::tools::{Fingerprint, ToolOutput};

/// The key of the approval's answer in `inputRequests` and `inputResponses`.
const APPROVAL: &str = "approval";

/// What a `requestState` says, under its seal.
#[derive(Serialize, Deserialize)]
pub struct Sealed {
    /// [`Question::call`] of the call asked about.
    call: String,
    /// [`Question::preview`] of what the human was shown.
    preview: String,
    /// Milliseconds since this process's first round, after which the answer is too late.
    expires: u64,
    /// Tells the rounds apart, so that an answer is used once.
    round: u64,
}

/// The rounds of one server process: their numbers, and those whose answer was used.
#[derive(Default)]
pub struct Rounds {
    next: AtomicU64,
    /// The rounds answered, with when their state expires: one answered again is refused.
    used: Mutex<HashMap<u64, u64>>,
}

/// Milliseconds since the process's first use of this clock: a state is only ever read by the
/// process that sealed it, whose key dies with it.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

fn seal_of(payload: &str) -> String {
    Fingerprint::of_all([b"swank-mcp requestState".as_slice(), payload.as_bytes()]).to_string()
}

impl Rounds {
    /// The state a client brings back, if this process sealed it and nobody altered it.
    pub fn open(&self, state: &str) -> Result<Sealed, String> {
        let refused = || "requestState was not issued by this server process, or was altered".to_string();
        let (seal, payload) = state.split_once('.').ok_or_else(refused)?;
        let expected = seal_of(payload);
        // Compared in full whatever differs, so that the time taken tells nothing of the seal.
        let same =
            seal.len() == expected.len() && seal.bytes().zip(expected.bytes()).fold(0, |d, (a, b)| d | (a ^ b)) == 0;
        if !same {
            return Err(refused());
        }
        serde_json::from_str(payload).map_err(|_| refused())
    }

    fn seal(&self, question: &Question<'_>) -> String {
        let sealed = Sealed {
            call: question.call.to_string(),
            preview: question.preview.to_string(),
            expires: now_ms().saturating_add(question.limit.as_millis() as u64),
            round: self.next.fetch_add(1, Ordering::Relaxed),
        };
        let payload = serde_json::to_string(&sealed).unwrap_or_default();
        format!("{}.{payload}", seal_of(&payload))
    }

    /// Marks `round` answered: false when it already was.
    fn use_once(&self, sealed: &Sealed) -> bool {
        let now = now_ms();
        let mut used = lock(&self.used);
        // A state past its time is refused before it is looked up here.
        used.retain(|_, expires| *expires >= now);
        used.insert(sealed.round, sealed.expires).is_none()
    }
}

/// The answer a call brings back from the round before it.
pub struct Answer {
    /// The human's `ElicitResult`, if the client sent it.
    pub response: Option<Value>,
    /// The state of the round it answers.
    pub state: Sealed,
}

impl Answer {
    /// The answer in a call's `inputResponses` and its opened `requestState`.
    pub fn new(responses: Option<&Value>, state: Sealed) -> Self {
        Answer { response: responses.and_then(|responses| responses.get(APPROVAL)).cloned(), state }
    }
}

/// The asking of one `tools/call` request of revision 2026-07-28.
pub struct Round {
    rounds: Arc<Rounds>,
    answer: Option<Answer>,
    /// The `input_required` result, once the call ended to ask the human.
    asked: Mutex<Option<Value>>,
}

impl Round {
    /// A request that brings `answer`, if any, from the round before it.
    pub fn new(rounds: Arc<Rounds>, answer: Option<Answer>) -> Self {
        Round { rounds, answer, asked: Mutex::new(None) }
    }

    /// The `input_required` result to send in place of the call's output, when it ended so.
    pub fn asked(&self) -> Option<Value> {
        lock(&self.asked).take()
    }

    fn ask_again(&self, question: &Question<'_>) -> Verdict {
        *lock(&self.asked) = Some(json!({
            "resultType": "input_required",
            "inputRequests": {
                APPROVAL: { "method": "elicitation/create", "params": approval_form(question.tool, question.shown, false) }
            },
            "requestState": self.rounds.seal(question),
        }));
        Verdict::Deferred
    }
}

impl Ask for Round {
    fn ask<'a>(&'a self, question: &'a Question<'a>) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            let tool = question.tool;
            let Some(Answer { response, state }) = &self.answer else { return self.ask_again(question) };
            if state.call != question.call.to_string() {
                return Verdict::Refused(ToolOutput::error(format!(
                    "{tool} was not run: the approval this call brings (requestState) was given for another call. \
                     Nothing changed; call it without requestState to ask the user about this one."
                )));
            }
            if state.preview != question.preview.to_string() {
                let files = question.files.unwrap_or("what it acts on");
                return Verdict::Refused(changed_before_the_answer(tool, files));
            }
            if now_ms() > state.expires {
                return Verdict::TimedOut(unanswered(tool, question.limit));
            }
            // The spec's way with an answer missing: ask for it again.
            let Some(response) = response else { return self.ask_again(question) };
            if !self.rounds.use_once(state) {
                return Verdict::Refused(ToolOutput::error(format!(
                    "{tool} was not run: the user's answer this call brings was already used. Nothing changed; call \
                     it without requestState to ask the user again."
                )));
            }
            verdict_of(tool, &response.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_opens_only_as_it_was_sealed() {
        let rounds = Rounds::default();
        let payload =
            serde_json::to_string(&Sealed { call: "a".into(), preview: "b".into(), expires: 1, round: 0 }).unwrap();
        let state = format!("{}.{payload}", seal_of(&payload));
        assert_eq!(rounds.open(&state).unwrap().call, "a");
        let altered = state.replace("\"a\"", "\"c\"");
        assert!(rounds.open(&altered).is_err());
        assert!(rounds.open("no seal").is_err());
        assert!(rounds.open(&format!("{}.{{}}", seal_of("{}"))).is_err());
    }

    #[test]
    fn an_answer_is_used_once() {
        let rounds = Rounds::default();
        let sealed = Sealed { call: String::new(), preview: String::new(), expires: u64::MAX, round: 4 };
        assert!(rounds.use_once(&sealed));
        assert!(!rounds.use_once(&sealed));
    }
}
