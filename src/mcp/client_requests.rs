//! Requests this server sends to the client (`elicitation/create`, say), and the client's
//! responses routed back to whoever waits for them: a map of the requests pending, by the JSON
//! text of the id we gave each one. When the client's input ends, every pending request fails
//! at once instead of waiting for an answer that cannot come.
//!
//! See docs/design.md, "Layers".

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::message::{Reply, ReplyError};
use crate::outbox::Outbox;

/// Why a request to the client got no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestFailed {
    /// The client answered with a JSON-RPC error.
    #[error("the client answered with error {}: {}", .0.code, .0.message)]
    Error(ReplyError),
    /// The client's input ended (or the server is shutting down) before it answered.
    #[error("the client went away before it answered")]
    Closed,
    /// The request could not be written to the client.
    #[error("the request could not be sent to the client")]
    NotSent,
}

type Waiter = oneshot::Sender<Result<Box<RawValue>, RequestFailed>>;

/// The requests sent to the client that wait for its answer.
pub struct ClientRequests {
    outgoing: Arc<Outbox>,
    next_id: AtomicU64,
    /// `None` once the client's input has ended: nothing more can be answered.
    pending: Mutex<Option<HashMap<String, Waiter>>>,
}

impl ClientRequests {
    /// Requests go out through `outgoing`, the same outbox as the server's responses.
    pub fn new(outgoing: Arc<Outbox>) -> Self {
        Self { outgoing, next_id: AtomicU64::new(1), pending: Mutex::new(Some(HashMap::new())) }
    }

    /// Sends `method` with `params` and waits for the client's result. Dropping the future
    /// forgets the request and tells the client with `notifications/cancelled`.
    pub async fn request(&self, method: &str, params: Value) -> Result<Box<RawValue>, RequestFailed> {
        // Ours are strings, so that a client that mixes them up with its own (integer) ids
        // cannot be answered by mistake.
        let id = json!(format!("swank-mcp-{}", self.next_id.fetch_add(1, Ordering::Relaxed)));
        let key = id.to_string();
        let (sender, receiver) = oneshot::channel();
        match self.lock().as_mut() {
            Some(pending) => pending.insert(key.clone(), sender),
            None => return Err(RequestFailed::Closed),
        };
        let mut waiting = Waiting { requests: self, key, id: id.clone(), answered: false };
        let mut line = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .map_err(|_| RequestFailed::NotSent)?;
        line.push(b'\n');
        self.outgoing.send(line).map_err(|_| RequestFailed::NotSent)?;
        let outcome = receiver.await.unwrap_or(Err(RequestFailed::Closed));
        waiting.answered = true;
        outcome
    }

    /// Hands a client's response to the request it answers. A response to nothing pending (a
    /// late answer to a request given up on, or a stray one) is dropped.
    pub fn answer(&self, reply: Reply) {
        let Some(id) = reply.id else {
            tracing::debug!(error = ?reply.outcome.err(), "the client answered a request of ours with an error and a null id");
            return;
        };
        let key = id.0.to_string();
        let waiter = self.lock().as_mut().and_then(|pending| pending.remove(&key));
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(reply.outcome.map_err(RequestFailed::Error));
            }
            None => tracing::debug!(id = %key, "a response to no request pending"),
        }
    }

    /// Fails every pending request, and every later one, with [`RequestFailed::Closed`]: the
    /// client's input has ended.
    pub fn close(&self) {
        let pending = self.lock().take();
        for (_, waiter) in pending.into_iter().flatten() {
            let _ = waiter.send(Err(RequestFailed::Closed));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, Waiter>>> {
        lock(&self.pending)
    }
}

/// A request's entry in the pending map, removed however the wait ends; when it ends unanswered
/// (the caller was cancelled or timed out), the client is told to stop asking the user.
struct Waiting<'a> {
    requests: &'a ClientRequests,
    key: String,
    id: Value,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let removed = self.requests.lock().as_mut().and_then(|pending| pending.remove(&self.key));
        if removed.is_some() && !self.answered {
            let mut line = serde_json::to_vec(&json!({
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": self.id, "reason": "The tool call waiting for this answer ended."},
            }))
            .unwrap_or_default();
            line.push(b'\n');
            let _ = self.requests.outgoing.send(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncBufReadExt, BufReader};

    use super::*;
    use crate::mcp::message::{Message, RequestId};

    fn setup() -> (Arc<ClientRequests>, tokio::io::Lines<BufReader<tokio::io::DuplexStream>>) {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let outbox = Arc::new(Outbox::new(Box::new(ours)));
        (Arc::new(ClientRequests::new(outbox)), BufReader::new(theirs).lines())
    }

    fn reply(line: &str) -> Reply {
        match Message::parse(line.as_bytes()) {
            Ok(Message::Response(reply)) => reply,
            other => panic!("not a response: {other:?}"),
        }
    }

    #[tokio::test]
    async fn answers_reach_their_own_request_whatever_the_order() {
        let (requests, mut client) = setup();
        let first = tokio::spawn({
            let requests = requests.clone();
            async move { requests.request("elicitation/create", json!({"n": 1})).await }
        });
        let second = tokio::spawn({
            let requests = requests.clone();
            async move { requests.request("elicitation/create", json!({"n": 2})).await }
        });
        let mut ids = std::collections::HashMap::new();
        for _ in 0..2 {
            let sent: Value = serde_json::from_str(&client.next_line().await.unwrap().unwrap()).unwrap();
            ids.insert(sent["params"]["n"].as_i64().unwrap(), sent["id"].clone());
        }
        requests.answer(reply(&json!({"jsonrpc": "2.0", "id": ids[&2], "result": {"n": 2}}).to_string()));
        requests.answer(reply(
            &json!({"jsonrpc": "2.0", "id": ids[&1], "error": {"code": -1, "message": "no"}}).to_string(),
        ));
        assert_eq!(second.await.unwrap().unwrap().get(), r#"{"n":2}"#);
        assert_eq!(
            first.await.unwrap().unwrap_err(),
            RequestFailed::Error(ReplyError { code: -1, message: "no".into() })
        );
        // A stray answer changes nothing.
        requests.answer(Reply {
            id: Some(RequestId(json!("swank-mcp-99"))),
            outcome: Err(ReplyError { code: 0, message: String::new() }),
        });
    }

    #[tokio::test]
    async fn closing_fails_pending_and_later_requests() {
        let (requests, mut client) = setup();
        let pending = tokio::spawn({
            let requests = requests.clone();
            async move { requests.request("elicitation/create", json!({})).await }
        });
        client.next_line().await.unwrap().unwrap();
        requests.close();
        let failed = tokio::time::timeout(Duration::from_secs(5), pending).await.expect("fails at once");
        assert_eq!(failed.unwrap().unwrap_err(), RequestFailed::Closed);
        assert_eq!(requests.request("ping", json!({})).await.unwrap_err(), RequestFailed::Closed);
    }

    #[tokio::test]
    async fn a_request_given_up_on_is_cancelled_at_the_client() {
        let (requests, mut client) = setup();
        let given_up =
            tokio::time::timeout(Duration::from_millis(50), requests.request("elicitation/create", json!({})));
        assert!(given_up.await.is_err());
        let sent: Value = serde_json::from_str(&client.next_line().await.unwrap().unwrap()).unwrap();
        let cancelled: Value = serde_json::from_str(&client.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(cancelled["method"], "notifications/cancelled");
        assert_eq!(cancelled["params"]["requestId"], sent["id"]);
        assert!(requests.lock().as_ref().unwrap().is_empty());
    }
}
