//! The MCP server loop: JSON-RPC 2.0 dispatch, lifecycle, `tools/list`, `tools/call` and
//! cancellation. Hand-written, as rust-analyzer's `lsp-server` is for LSP: one reader loop that
//! owns dispatch, one writer task that owns stdout, and a task per tool call so that a slow
//! evaluation never delays a quick one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use super::transport::{Line, LineCodec};
use crate::tools::{Progress, Toolbox};

/// Newest first; an unknown requested version is answered with the newest.
pub const SUPPORTED_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// Structured tool output (`outputSchema`, `structuredContent`) exists from this revision on.
const STRUCTURED_OUTPUT_SINCE: &str = "2025-06-18";
/// Generous for any real request (a big `content` for edit-lisp-form included), small enough
/// that a runaway client cannot make the server buffer without bound.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// How long tool calls still running at end of input get to unwind after being cancelled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

const INSTRUCTIONS: &str = "\
swank-mcp attaches you to a live Common Lisp (SBCL) image through swank/slynk, usually the same image \
the user works in from Emacs. Definitions you make there are the user's definitions too.
- evaluate-lisp runs code in your own REPL session (its package and *, ** persist between calls; the \
user's REPL is not affected). Forms are evaluated one at a time. Errors return [ERROR] TYPE, the message \
and a backtrace; the image is never left in the debugger. Long evaluations are interrupted after \
timeout_ms. Interactive input is not available.
- compile-form checks code (warnings, type errors, undefined functions, with line and column) without \
running or defining anything; macroexpand-form shows what a macro generates.
- To find your way around code you did not write: describe-symbol, apropos-search, find-definition \
(file:line), xref (callers, callees, references, methods of a class), class-info. None of them changes \
the image.
- load-system loads an ASDF system; lisp-status says what you are attached to.
- Prefer small, incremental evaluations; inspect before you redefine, since the image may hold the \
user's state.";

pub struct Server {
    toolbox: Arc<Toolbox>,
    outgoing: mpsc::UnboundedSender<Value>,
    /// Cancellation tokens of running tool calls, by the JSON text of their request id.
    in_flight: Mutex<HashMap<String, CancellationToken>>,
    protocol_version: Mutex<String>,
}

/// Serves MCP on `input`/`output` until `input` ends.
pub async fn serve<R, W>(toolbox: Arc<Toolbox>, input: R, output: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (outgoing, outgoing_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_messages(output, outgoing_rx));
    let server = Arc::new(Server {
        toolbox,
        outgoing,
        in_flight: Mutex::new(HashMap::new()),
        protocol_version: Mutex::new(SUPPORTED_VERSIONS[0].to_string()),
    });
    let mut lines = FramedRead::new(input, LineCodec::new(MAX_LINE_BYTES));
    let mut calls = JoinSet::new();
    while let Some(line) = lines.next().await {
        while calls.try_join_next().is_some() {}
        match line? {
            Line::TooLong(length) => server.send(error_response(
                Value::Null,
                INVALID_REQUEST,
                &format!("Message of {length} bytes or more is over the limit of {MAX_LINE_BYTES} bytes; it was skipped."),
            )),
            Line::Message(bytes) => match serde_json::from_slice::<Value>(&bytes) {
                Err(e) => server.send(error_response(Value::Null, PARSE_ERROR, &format!("Parse error: {e}"))),
                Ok(Value::Array(batch)) if batch.is_empty() => {
                    server.send(error_response(Value::Null, INVALID_REQUEST, "Empty batch"))
                }
                Ok(Value::Array(batch)) => {
                    let server = server.clone();
                    calls.spawn(async move {
                        let replies: Vec<Value> = futures::future::join_all(batch.into_iter().map(|m| server.handle(m)))
                            .await
                            .into_iter()
                            .flatten()
                            .collect();
                        if !replies.is_empty() {
                            server.send(Value::Array(replies));
                        }
                    });
                }
                Ok(message) if is_tool_call(&message) => {
                    let server = server.clone();
                    calls.spawn(async move {
                        if let Some(reply) = server.handle(message).await {
                            server.send(reply);
                        }
                    });
                }
                Ok(message) => {
                    if let Some(reply) = server.handle(message).await {
                        server.send(reply);
                    }
                }
            },
        }
    }
    tracing::debug!("input closed; cancelling {} running call(s)", calls.len());
    for token in server.in_flight.lock().unwrap_or_else(|e| e.into_inner()).values() {
        token.cancel();
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { while calls.join_next().await.is_some() {} }).await;
    drop(server);
    writer.await.unwrap_or(Ok(()))
}

async fn write_messages<W: AsyncWrite + Unpin>(mut output: W, mut messages: mpsc::UnboundedReceiver<Value>) -> std::io::Result<()> {
    while let Some(message) = messages.recv().await {
        let mut line = serde_json::to_vec(&message).unwrap_or_default();
        line.push(b'\n');
        output.write_all(&line).await?;
        output.flush().await?;
    }
    Ok(())
}

fn is_tool_call(message: &Value) -> bool {
    message.get("method").and_then(Value::as_str) == Some("tools/call")
}

fn error_response(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn result_response(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

impl Server {
    fn send(&self, message: Value) {
        let _ = self.outgoing.send(message);
    }

    fn structured_output(&self) -> bool {
        self.protocol_version.lock().unwrap_or_else(|e| e.into_inner()).as_str() >= STRUCTURED_OUTPUT_SINCE
    }

    /// Handles one message; returns the response to send, if any.
    async fn handle(self: &Arc<Self>, message: Value) -> Option<Value> {
        let Value::Object(mut message) = message else {
            return Some(error_response(Value::Null, INVALID_REQUEST, "A JSON-RPC message must be an object"));
        };
        let id = message.get("id").cloned();
        if let Some(id) = &id {
            if !(id.is_string() || id.is_i64() || id.is_u64()) {
                return Some(error_response(Value::Null, INVALID_REQUEST, "The id must be a string or an integer"));
            }
        }
        if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return id.map(|id| error_response(id, INVALID_REQUEST, "Only JSON-RPC 2.0 is supported (\"jsonrpc\": \"2.0\")"));
        }
        let Some(method) = message.get("method").and_then(Value::as_str).map(str::to_owned) else {
            if message.contains_key("result") || message.contains_key("error") {
                // A response to a request of ours; this server sends none, so there is nothing
                // waiting for it.
                return None;
            }
            return Some(error_response(id.unwrap_or(Value::Null), INVALID_REQUEST, "Missing \"method\""));
        };
        let params = match message.remove("params") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(p @ Value::Object(_)) => p,
            Some(_) => {
                return id.map(|id| error_response(id, INVALID_PARAMS, "\"params\" must be an object"));
            }
        };
        match id {
            None => {
                self.notification(&method, &params);
                None
            }
            Some(id) => Some(match self.request(&id, &method, params).await {
                Ok(Some(result)) => result_response(id, result),
                // Cancelled: the client said it no longer wants an answer.
                Ok(None) => return None,
                Err((code, text)) => error_response(id, code, &text),
            }),
        }
    }

    fn notification(&self, method: &str, params: &Value) {
        match method {
            "notifications/cancelled" => {
                let Some(request) = params.get("requestId") else { return };
                let key = request.to_string();
                match self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
                    Some(token) => {
                        tracing::debug!(request = %key, "cancelling");
                        token.cancel();
                    }
                    None => tracing::debug!(request = %key, "cancellation for a request that is not running"),
                }
            }
            "notifications/initialized" => tracing::debug!("client initialized"),
            other => tracing::debug!(method = other, "notification ignored"),
        }
    }

    async fn request(self: &Arc<Self>, id: &Value, method: &str, params: Value) -> Result<Option<Value>, (i64, String)> {
        match method {
            "initialize" => Ok(Some(self.initialize(&params))),
            "ping" => Ok(Some(json!({}))),
            "tools/list" => {
                let structured = self.structured_output();
                let tools: Vec<Value> = self.toolbox.definitions().iter().map(|d| d.to_json(structured)).collect();
                Ok(Some(json!({ "tools": tools })))
            }
            "tools/call" => self.call_tool(id, params).await,
            other => Err((METHOD_NOT_FOUND, format!("Method not found: {other}"))),
        }
    }

    fn initialize(&self, params: &Value) -> Value {
        let requested = params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
        let version = SUPPORTED_VERSIONS.iter().find(|v| **v == requested).copied().unwrap_or(SUPPORTED_VERSIONS[0]);
        *self.protocol_version.lock().unwrap_or_else(|e| e.into_inner()) = version.to_string();
        let client = params.pointer("/clientInfo/name").and_then(Value::as_str).unwrap_or("unknown client");
        tracing::info!(client, requested, version, "initialize");
        json!({
            "protocolVersion": version,
            "capabilities": { "tools": { "listChanged": false } },
            "serverInfo": { "name": "swank-mcp", "title": "swank-mcp", "version": env!("CARGO_PKG_VERSION") },
            "instructions": INSTRUCTIONS,
        })
    }

    /// Progress reports for a call whose `_meta` carries a `progressToken` (a string or an
    /// integer), sent as `notifications/progress`; none otherwise.
    fn progress_for(&self, params: &Value) -> Progress {
        let Some(token) = params.pointer("/_meta/progressToken").filter(|t| t.is_string() || t.is_i64() || t.is_u64()).cloned() else {
            return Progress::none();
        };
        let outgoing = self.outgoing.clone();
        Progress::new(move |update| {
            let _ = outgoing.send(json!({
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": update.progress, "message": update.message},
            }));
        })
    }

    async fn call_tool(self: &Arc<Self>, id: &Value, mut params: Value) -> Result<Option<Value>, (i64, String)> {
        let Some(name) = params.get("name").and_then(Value::as_str).map(str::to_owned) else {
            return Err((INVALID_PARAMS, "tools/call needs a \"name\" string".into()));
        };
        let name = name.as_str();
        let key = id.to_string();
        let cancel = CancellationToken::new();
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), cancel.clone());
        let started = std::time::Instant::now();
        let progress = self.progress_for(&params);
        let arguments = params.as_object_mut().and_then(|params| params.remove("arguments"));
        let output = self.toolbox.call_with_progress(name, arguments, cancel.clone(), progress).await;
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        tracing::debug!(tool = name, elapsed = ?started.elapsed(), "tool call finished");
        let Some(output) = output else {
            return Err((INVALID_PARAMS, format!("Unknown tool: {name}")));
        };
        if cancel.is_cancelled() {
            return Ok(None);
        }
        let mut result = json!({
            "content": [{ "type": "text", "text": output.text }],
            "isError": output.is_error,
        });
        if let (true, Some(structured)) = (self.structured_output(), output.structured) {
            result["structuredContent"] = structured;
        }
        Ok(Some(result))
    }
}
