//! The MCP server loop: JSON-RPC 2.0 dispatch, lifecycle, `tools/list`, `tools/call` and
//! cancellation. Hand-written, as rust-analyzer's `lsp-server` is for LSP: one reader loop that
//! owns dispatch and runs every tool call concurrently beside it, so that a slow evaluation never
//! delays a quick one; responses go out through an [`Outbox`].

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::outbox::Outbox;
use super::transport::{Line, LineCodec};
use crate::tools::{Progress, Toolbox, ToolOutput};

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
const INTERNAL_ERROR: i64 = -32603;
/// For a request other than `initialize` and `ping` before `initialize` was answered. The MCP
/// lifecycle (2025-11-25, basic/lifecycle, "Initialization") only says that the client SHOULD NOT
/// send one, and its schema names no error for it; so this is a code from JSON-RPC 2.0's range
/// for server errors, clear of the ones MCP and its SDKs give a meaning (-32000 connection closed
/// and -32001 request timeout in the SDKs, -32002 resource not found, and -32020 to -32099, which
/// revision 2026-07-28 reserves for the specification).
const NOT_INITIALIZED: i64 = -32003;

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
    /// Where messages go, each serialised and ending in a newline.
    outgoing: Arc<Outbox>,
    /// Cancellation tokens of running tool calls, by the JSON text of their request id.
    in_flight: Mutex<HashMap<String, CancellationToken>>,
    protocol_version: Mutex<String>,
    /// Set when `initialize` is answered, not on `notifications/initialized`: the specification
    /// lets clients send requests once they have the response, and several do so without
    /// waiting to send the notification first.
    initialized: AtomicBool,
}

/// Serves MCP on `input`/`output` until `input` ends.
pub async fn serve<R, W>(toolbox: Arc<Toolbox>, input: R, output: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let outgoing = Arc::new(Outbox::new(Box::new(output)));
    let writer = tokio::spawn({
        let outgoing = outgoing.clone();
        async move { outgoing.run_writer().await }
    });
    let server = Arc::new(Server {
        toolbox,
        outgoing,
        in_flight: Mutex::new(HashMap::new()),
        protocol_version: Mutex::new(SUPPORTED_VERSIONS[0].to_string()),
        initialized: AtomicBool::new(false),
    });
    let mut lines = FramedRead::new(input, LineCodec::new(MAX_LINE_BYTES));
    // Calls run as futures inside this task rather than as tasks of their own, so that a call
    // that panics is caught here and still answered (see `handle_guarded`).
    let mut calls = Calls::new();
    loop {
        let line = tokio::select! {
            // A client that sends requests and does not read the responses would otherwise make
            // the outbox hold every response: reading waits until it catches up, which in turn
            // stops the client's writes once the pipe to us is full. Running calls go on.
            line = async {
                server.outgoing.room().await;
                lines.next().await
            } => line,
            Some(()) = calls.next(), if !calls.is_empty() => continue,
        };
        let Some(line) = line else { break };
        match line? {
            Line::TooLong(length) => server.send(error_response(
                Value::Null,
                INVALID_REQUEST,
                &format!("Message of {length} bytes or more is over the limit of {MAX_LINE_BYTES} bytes; it was skipped."),
            )),
            // Before `initialize`, tool calls take the general path, which refuses them.
            Line::Message(bytes) => match server.is_initialized().then(|| PlainToolCall::read(&bytes)).flatten() {
                Some(call) => server.answer_concurrently(&mut calls, Incoming::PlainToolCall(call)),
                None => server.dispatch_general(&bytes, &mut calls).await,
            },
        }
    }
    tracing::debug!("input closed; cancelling {} running call(s)", calls.len());
    for token in server.in_flight.lock().unwrap_or_else(|e| e.into_inner()).values() {
        token.cancel();
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { while calls.next().await.is_some() {} }).await;
    drop(calls);
    server.outgoing.close();
    drop(server);
    writer.await.unwrap_or(Ok(()))
}

/// Tool calls and batches in progress, run concurrently inside the server loop's task.
type Calls = FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send>>>;

/// One message as received: a `tools/call` request in the usual shape, read straight into its
/// parts, or any other JSON value, which [`Server::handle`] checks member by member.
enum Incoming {
    PlainToolCall(PlainToolCall),
    General(Value),
}

/// A `tools/call` request as clients send it, read without building a `serde_json::Value` for
/// its envelope (which cost more than the rest of the dispatch). Any other shape (another method,
/// a member of another type, a duplicate member) fails here and takes the general path, which
/// answers every case.
#[derive(Deserialize)]
struct PlainToolCall {
    // These two are checked while reading and hold nothing.
    #[serde(rename = "jsonrpc")]
    _version: JsonRpcVersion,
    #[serde(rename = "method")]
    _method: ToolsCall,
    id: RequestId,
    params: PlainToolCallParams,
}

#[derive(Deserialize)]
struct PlainToolCallParams {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default, rename = "_meta")]
    meta: Option<Map<String, Value>>,
}

impl PlainToolCall {
    fn read(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// `"jsonrpc": "2.0"` and nothing else.
struct JsonRpcVersion;

/// `"method": "tools/call"` and nothing else.
struct ToolsCall;

/// A request id as JSON-RPC allows it here: a string or an integer.
struct RequestId(Value);

impl<'de> Deserialize<'de> for JsonRpcVersion {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        exact_str(deserializer, "2.0").map(|()| JsonRpcVersion)
    }
}

impl<'de> Deserialize<'de> for ToolsCall {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        exact_str(deserializer, "tools/call").map(|()| ToolsCall)
    }
}

fn exact_str<'de, D: serde::Deserializer<'de>>(deserializer: D, expected: &'static str) -> Result<(), D::Error> {
    let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
    if text == expected {
        Ok(())
    } else {
        Err(serde::de::Error::invalid_value(serde::de::Unexpected::Str(&text), &expected))
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let id = Value::deserialize(deserializer)?;
        if is_valid_id(&id) {
            Ok(RequestId(id))
        } else {
            Err(serde::de::Error::custom("the id must be a string or an integer"))
        }
    }
}

fn is_valid_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

impl Server {
    /// Answers `message` from a future of `calls`, beside the calls already running.
    fn answer_concurrently(self: &Arc<Self>, calls: &mut Calls, message: Incoming) {
        let server = self.clone();
        calls.push(Box::pin(async move {
            if let Some(reply) = server.handle_guarded(message).await {
                server.send(reply);
            }
        }));
    }

    /// Answers a line that is not a plain tool call: a batch, another method, or a mistake.
    async fn dispatch_general(self: &Arc<Self>, bytes: &[u8], calls: &mut Calls) {
        match serde_json::from_slice::<Value>(bytes) {
            Err(e) => self.send(error_response(Value::Null, PARSE_ERROR, &format!("Parse error: {e}"))),
            Ok(Value::Array(batch)) if batch.is_empty() => self.send(error_response(Value::Null, INVALID_REQUEST, "Empty batch")),
            Ok(Value::Array(batch)) => {
                let server = self.clone();
                calls.push(Box::pin(async move {
                    let replies = futures::future::join_all(batch.into_iter().map(|m| server.handle_guarded(Incoming::General(m)))).await;
                    let replies: Vec<Response> = replies.into_iter().flatten().collect();
                    if !replies.is_empty() {
                        server.send(replies);
                    }
                }));
            }
            Ok(message) if is_tool_call(&message) => self.answer_concurrently(calls, Incoming::General(message)),
            Ok(message) => {
                if let Some(reply) = self.handle_guarded(Incoming::General(message)).await {
                    self.send(reply);
                }
            }
        }
    }
}

/// A message as one line of output.
fn to_line(message: &impl Serialize) -> Vec<u8> {
    // Serialising a response cannot fail: its maps have string keys and its numbers are finite.
    // Room for a typical response, which would otherwise be regrown several times.
    let mut line = Vec::with_capacity(512);
    if serde_json::to_writer(&mut line, message).is_err() {
        line.clear();
    }
    line.push(b'\n');
    line
}

fn is_tool_call(message: &Value) -> bool {
    message.get("method").and_then(Value::as_str) == Some("tools/call")
}

/// A JSON-RPC response. Written from these types rather than built as a `serde_json::Value`:
/// building, serialising and dropping the maps of every tool call's response was a measurable
/// part of the server's own cost per call.
#[derive(Serialize)]
struct Response {
    jsonrpc: &'static str,
    id: Value,
    #[serde(flatten)]
    outcome: Outcome,
}

#[derive(Serialize)]
enum Outcome {
    #[serde(rename = "result")]
    Result(ResultBody),
    #[serde(rename = "error")]
    Error { code: i64, message: String },
}

#[derive(Serialize)]
#[serde(untagged)]
enum ResultBody {
    Json(Value),
    ToolCall(CallToolResult),
}

/// The result of `tools/call`.
#[derive(Serialize)]
struct CallToolResult {
    content: [TextContent; 1],
    #[serde(rename = "isError")]
    is_error: bool,
    #[serde(rename = "structuredContent", skip_serializing_if = "Option::is_none")]
    structured_content: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Serialize)]
struct TextContent {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

impl CallToolResult {
    fn new(output: ToolOutput, with_structured_content: bool) -> Self {
        CallToolResult {
            content: [TextContent { kind: "text", text: output.text }],
            is_error: output.is_error,
            structured_content: output.structured.filter(|_| with_structured_content),
        }
    }
}

fn error_response(id: Value, code: i64, message: &str) -> Response {
    Response { jsonrpc: "2.0", id, outcome: Outcome::Error { code, message: message.to_string() } }
}

/// The answer to a message that is not valid JSON-RPC: JSON-RPC 2.0 gives it the message's id
/// when that can be read, and null otherwise.
fn invalid_request(id: Option<&Value>, message: &str) -> Response {
    let id = id.filter(|id| is_valid_id(id)).cloned().unwrap_or(Value::Null);
    error_response(id, INVALID_REQUEST, message)
}

const JSON_RPC_2_ONLY: &str = "Only JSON-RPC 2.0 is supported: every message needs \"jsonrpc\": \"2.0\"";

/// Checks a message with a `result` or an `error` and no `method` against JSON-RPC's response.
fn check_response(message: &Map<String, Value>) -> Result<(), &'static str> {
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(JSON_RPC_2_ONLY);
    }
    let id = message.get("id");
    match (message.get("result"), message.get("error")) {
        (Some(_), Some(_)) => Err("A response has a \"result\" or an \"error\", not both"),
        (Some(_), None) if id.is_some_and(is_valid_id) => Ok(()),
        // An error answering a message whose id could not be read has a null id.
        (None, Some(error)) if id.is_some_and(|id| id.is_null() || is_valid_id(id)) => {
            if error.get("code").is_some_and(Value::is_i64) && error.get("message").is_some_and(Value::is_string) {
                Ok(())
            } else {
                Err("An error response's \"error\" needs an integer \"code\" and a string \"message\"")
            }
        }
        _ => Err("A response needs the id of the request it answers, a string or an integer"),
    }
}

fn result_response(id: Value, result: ResultBody) -> Response {
    Response { jsonrpc: "2.0", id, outcome: Outcome::Result(result) }
}

/// The response to request `id`, if it gets one.
fn respond(id: Value, outcome: Result<Option<ResultBody>, (i64, String)>) -> Option<Response> {
    match outcome {
        Ok(Some(result)) => Some(result_response(id, result)),
        // Cancelled: the client said it no longer wants an answer.
        Ok(None) => None,
        Err((code, text)) => Some(error_response(id, code, &text)),
    }
}

impl Server {
    fn send(&self, message: impl Serialize) {
        // A failed stdout ends the server when its input ends; there is no one left to tell.
        let _ = self.outgoing.send(to_line(&message));
    }

    fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::Acquire)
    }

    fn structured_output(&self) -> bool {
        self.protocol_version.lock().unwrap_or_else(|e| e.into_inner()).as_str() >= STRUCTURED_OUTPUT_SINCE
    }

    /// [`Server::handle`], with a panic (a bug) answered as an internal error instead of taking
    /// the server, and every other call running beside it, down.
    async fn handle_guarded(self: &Arc<Self>, message: Incoming) -> Option<Response> {
        let id = match &message {
            Incoming::PlainToolCall(call) => Some(call.id.0.clone()),
            Incoming::General(message) => message.get("id").filter(|id| is_valid_id(id)).cloned(),
        };
        let handled = async {
            match message {
                Incoming::PlainToolCall(call) => {
                    let PlainToolCallParams { name, arguments, meta } = call.params;
                    let progress_token = meta.and_then(|mut meta| meta.remove("progressToken"));
                    let outcome = self.call_tool(&call.id.0, &name, arguments, progress_token).await;
                    respond(call.id.0, outcome)
                }
                Incoming::General(message) => self.handle(message).await,
            }
        };
        match AssertUnwindSafe(handled).catch_unwind().await {
            Ok(reply) => reply,
            Err(_) => {
                let id = id?;
                Some(error_response(
                    id,
                    INTERNAL_ERROR,
                    "swank-mcp failed unexpectedly while handling this request (a bug; its stderr has the details). \
                     Other requests are not affected.",
                ))
            }
        }
    }

    /// Handles one message; returns the response to send, if any.
    async fn handle(self: &Arc<Self>, message: Value) -> Option<Response> {
        let Value::Object(mut message) = message else {
            return Some(error_response(Value::Null, INVALID_REQUEST, "A JSON-RPC message must be an object"));
        };
        if !message.contains_key("method") && (message.contains_key("result") || message.contains_key("error")) {
            // A response to a request of ours; this server sends none, so nothing waits for it.
            // A malformed one is answered as any other invalid message is.
            return check_response(&message).err().map(|problem| invalid_request(message.get("id"), problem));
        }
        let id = message.get("id").cloned();
        if id.as_ref().is_some_and(|id| !is_valid_id(id)) {
            return Some(invalid_request(None, "The id must be a string or an integer"));
        }
        if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Some(invalid_request(id.as_ref(), JSON_RPC_2_ONLY));
        }
        let method = match message.get("method") {
            Some(Value::String(method)) => method.clone(),
            Some(_) => return Some(invalid_request(id.as_ref(), "\"method\" must be a string")),
            None => return Some(invalid_request(id.as_ref(), "Missing \"method\": requests and notifications need one")),
        };
        let params = match message.remove("params") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(p @ Value::Object(_)) => p,
            // Valid JSON-RPC, but every MCP method takes its parameters by name.
            Some(Value::Array(_)) => {
                return id.map(|id| error_response(id, INVALID_PARAMS, "\"params\" must be an object"));
            }
            Some(_) => return Some(invalid_request(id.as_ref(), "\"params\" must be an object")),
        };
        match id {
            None => {
                self.notification(&method, &params);
                None
            }
            Some(id) => {
                let outcome = self.request(&id, &method, params).await;
                respond(id, outcome)
            }
        }
    }

    fn notification(&self, method: &str, params: &Value) {
        if !self.is_initialized() {
            tracing::debug!(method, "notification before initialize ignored");
            return;
        }
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

    async fn request(self: &Arc<Self>, id: &Value, method: &str, params: Value) -> Result<Option<ResultBody>, (i64, String)> {
        match method {
            "initialize" => Ok(Some(ResultBody::Json(self.initialize(&params)))),
            "ping" => Ok(Some(ResultBody::Json(json!({})))),
            // Unknown methods get -32601 before `initialize` as after: clients that probe
            // `server/discover` first take it as the sign to fall back to `initialize`.
            "tools/list" | "tools/call" if !self.is_initialized() => Err((
                NOT_INITIALIZED,
                format!("The server is not initialized: send initialize first, and {method} once it is answered"),
            )),
            "tools/list" => {
                let structured = self.structured_output();
                let tools: Vec<Value> = self.toolbox.definitions().iter().map(|d| d.to_json(structured)).collect();
                Ok(Some(ResultBody::Json(json!({ "tools": tools }))))
            }
            "tools/call" => {
                let mut params = params;
                let Some(name) = params.get("name").and_then(Value::as_str).map(str::to_owned) else {
                    return Err((INVALID_PARAMS, "tools/call needs a \"name\" string".into()));
                };
                let progress_token = params.get_mut("_meta").and_then(|meta| meta.get_mut("progressToken")).map(Value::take);
                let arguments = params.as_object_mut().and_then(|params| params.remove("arguments"));
                self.call_tool(id, &name, arguments, progress_token).await
            }
            other => Err((METHOD_NOT_FOUND, format!("Method not found: {other}"))),
        }
    }

    fn initialize(&self, params: &Value) -> Value {
        let requested = params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
        let version = SUPPORTED_VERSIONS.iter().find(|v| **v == requested).copied().unwrap_or(SUPPORTED_VERSIONS[0]);
        *self.protocol_version.lock().unwrap_or_else(|e| e.into_inner()) = version.to_string();
        // The reader loop answers `initialize` before it reads another line, so nothing read
        // after this precedes the response.
        self.initialized.store(true, Ordering::Release);
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
    fn progress_for(&self, token: Option<Value>) -> Progress {
        let Some(token) = token.filter(is_valid_id) else {
            return Progress::none();
        };
        let outgoing = self.outgoing.clone();
        Progress::new(move |update| {
            let _ = outgoing.send(to_line(&json!({
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": update.progress, "message": update.message},
            })));
        })
    }

    async fn call_tool(
        self: &Arc<Self>,
        id: &Value,
        name: &str,
        arguments: Option<Value>,
        progress_token: Option<Value>,
    ) -> Result<Option<ResultBody>, (i64, String)> {
        let cancel = CancellationToken::new();
        let in_flight = InFlight::register(self, id, cancel.clone());
        let started = std::time::Instant::now();
        let progress = self.progress_for(progress_token);
        let output = self.toolbox.call_with_progress(name, arguments, cancel.clone(), progress).await;
        drop(in_flight);
        tracing::debug!(tool = name, elapsed = ?started.elapsed(), "tool call finished");
        let Some(output) = output else {
            return Err((INVALID_PARAMS, format!("Unknown tool: {name}")));
        };
        if cancel.is_cancelled() {
            return Ok(None);
        }
        Ok(Some(ResultBody::ToolCall(CallToolResult::new(output, self.structured_output()))))
    }
}

/// A running call's entry in [`Server::in_flight`], removed however the call ends: with its
/// output, or by a panic.
struct InFlight<'a> {
    server: &'a Server,
    key: String,
}

impl<'a> InFlight<'a> {
    fn register(server: &'a Server, id: &Value, cancel: CancellationToken) -> Self {
        let key = id.to_string();
        server.in_flight.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), cancel);
        InFlight { server, key }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.server.in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}
