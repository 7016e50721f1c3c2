//! The MCP server loop: JSON-RPC 2.0 dispatch, lifecycle, `tools/list`, `tools/call` and
//! cancellation. Hand-written, as rust-analyzer's `lsp-server` is for LSP: one reader loop that
//! owns dispatch and runs every tool call concurrently beside it, so that a slow evaluation never
//! delays a quick one; responses go out through an [`Outbox`].
//!
//! See docs/design.md, "One call".

use crate::sync::lock;
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
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use super::client_requests::ClientRequests;
use super::elicitation::{self, Elicitation, ELICITATION_SINCE};
use super::message::{Invalid, Line, Message, Notification, Request, RequestId};
use super::protocol::{server_info, Failure, INVALID_PARAMS, SUPPORTED_VERSIONS};
use super::rounds::{Answer, Round, Rounds};
use super::stateless::{self, MetaParams, RequestMeta, StatelessClient, CACHE_SCOPE, CACHE_TTL_MS, STATELESS_VERSION};
use super::tool_list::tool_list;
use super::transport::{Line as Received, LineCodec};
use crate::outbox::Outbox;
use crate::pipeline::observe::Observer;
use crate::pipeline::{Ask, Call, Caller, ConfirmPolicy, Pipeline};
use crate::tools::{Progress, ToolOutput, Toolbox};

/// Structured tool output (`structuredContent`) exists from this revision on.
const STRUCTURED_OUTPUT_SINCE: &str = "2025-06-18";
/// Generous for any real request (a big `content` for edit-lisp-form included), small enough
/// that a runaway client cannot make the server buffer without bound.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// How long tool calls still running at end of input get to unwind after being cancelled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INTERNAL_ERROR: i64 = -32603;
/// For a request other than `initialize` and `ping` before `initialize` was answered. The MCP
/// lifecycle (2025-11-25, basic/lifecycle, "Initialization") only says that the client SHOULD NOT
/// send one, and its schema names no error for it; so this is a code from JSON-RPC 2.0's range
/// for server errors, clear of the ones MCP and its SDKs give a meaning (-32000 connection closed
/// and -32001 request timeout in the SDKs, -32002 resource not found, and -32020 to -32099, which
/// revision 2026-07-28 reserves for the specification).
const NOT_INITIALIZED: i64 = -32003;

struct Server {
    /// Where every tool call goes.
    pipeline: Pipeline,
    /// Where messages go, each serialised and ending in a newline.
    outgoing: Arc<Outbox>,
    /// Cancellation tokens of running tool calls, by the JSON text of their request id.
    in_flight: Mutex<HashMap<String, CancellationToken>>,
    protocol_version: Mutex<String>,
    /// Set when `initialize` is answered, not on `notifications/initialized`: the specification
    /// lets clients send requests once they have the response, and several do so without
    /// waiting to send the notification first.
    initialized: AtomicBool,
    /// Requests of ours to the client waiting for its answers.
    requests: Arc<ClientRequests>,
    /// Send each result's facts as `structuredContent` too (see [`ServeOptions`]).
    structured_content: bool,
    /// `--name`: the agent's name, whatever its client says it is.
    name: Option<String>,
    /// The client as `initialize` described it: its name, and whether it can ask the human.
    caller: Mutex<Arc<Caller>>,
    /// The approval rounds of calls of revision 2026-07-28.
    rounds: Arc<Rounds>,
}

/// What a server does besides running tools: approvals (`--confirm`) and the observers of calls
/// (the image's activity record, the audit log), which `main.rs` chooses.
#[derive(Default)]
pub struct ServeOptions {
    /// Which calls wait for the human's approval.
    pub confirm: ConfirmPolicy,
    /// How the human is asked when the client cannot ask them (the image's Emacs).
    pub asks: Option<Arc<dyn Ask>>,
    /// What watches every call.
    pub observers: Vec<Box<dyn Observer>>,
    /// Send each result's facts as `structuredContent` too. Off unless asked for: a client may show
    /// the model that JSON in place of the reply's text (Claude Code does, anthropics/claude-code
    /// issue 79944), and the text is the whole reply: the notes on what was cut and where the rest
    /// is, the `[background]` section, why a call was refused.
    pub structured_content: bool,
    /// The name the agent goes by (`--name`), in place of its client's `clientInfo.name`.
    pub name: Option<String>,
}

/// Serves MCP on `input`/`output` until `input` ends, asking and observing as `options` say.
pub async fn serve<R, W>(toolbox: Arc<Toolbox>, options: ServeOptions, input: R, output: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let outgoing = Arc::new(Outbox::new(Box::new(output)));
    let writer = tokio::spawn({
        let outgoing = outgoing.clone();
        async move { outgoing.run_writer().await }
    });
    let ServeOptions { confirm, asks, observers, structured_content, name } = options;
    let requests = Arc::new(ClientRequests::new(outgoing.clone()));
    let caller = Caller { client: "unknown client".to_string(), asks: None, cannot_ask: String::new() };
    let server = Arc::new(Server {
        pipeline: Pipeline::new(toolbox, confirm, asks, observers),
        requests,
        outgoing,
        in_flight: Mutex::new(HashMap::new()),
        protocol_version: Mutex::new(SUPPORTED_VERSIONS[0].to_string()),
        initialized: AtomicBool::new(false),
        structured_content,
        name,
        caller: Mutex::new(Arc::new(caller)),
        rounds: Arc::default(),
    });
    let mut lines = FramedRead::new(input, LineCodec::new(MAX_LINE_BYTES));
    // Calls run as futures inside this task rather than as tasks of their own, so that a call
    // that panics is caught here and still answered (see `answer_request`).
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
            Received::TooLong(length) => server.send(error_response(
                Value::Null,
                INVALID_REQUEST,
                &format!(
                    "Message of {length} bytes or more is over the limit of {MAX_LINE_BYTES} bytes; it was skipped."
                ),
            )),
            Received::Message(bytes) => server.dispatch(&bytes, &mut calls).await,
        }
    }
    tracing::debug!("input closed; cancelling {} running call(s)", calls.len());
    // Nothing can answer a request of ours any more.
    server.requests.close();
    for token in lock(&server.in_flight).values() {
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

impl Server {
    /// Answers one line. Tool calls and batches run among `calls`, beside the calls already
    /// running; anything else is answered before the next line is read, so that `initialize`,
    /// say, is done before a request that follows it.
    async fn dispatch(self: &Arc<Self>, bytes: &[u8], calls: &mut Calls) {
        match Line::parse(bytes) {
            Line::Single(message) if is_tool_call(&message) => {
                let (server, answer) = (self.clone(), self.admit(message));
                calls.push(Box::pin(async move {
                    if let Some(reply) = answer.await {
                        server.send(reply);
                    }
                }));
            }
            Line::Single(message) => {
                if let Some(reply) = self.admit(message).await {
                    self.send(reply);
                }
            }
            Line::Batch(messages) => {
                let server = self.clone();
                let answers: Vec<_> = messages.into_iter().map(|m| self.admit(m)).collect();
                calls.push(Box::pin(async move {
                    let replies = futures::future::join_all(answers).await;
                    let replies: Vec<Response> = replies.into_iter().flatten().collect();
                    if !replies.is_empty() {
                        server.send(replies);
                    }
                }));
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

fn is_tool_call(message: &Result<Message, Invalid>) -> bool {
    matches!(message, Ok(Message::Request(request)) if request.method == "tools/call")
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
    Error {
        code: i64,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<Value>,
    },
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
    /// Revision 2026-07-28's `resultType` and `_meta`, which earlier revisions do not have.
    #[serde(rename = "resultType", skip_serializing_if = "Option::is_none")]
    result_type: Option<&'static str>,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<Value>,
}

#[derive(Serialize)]
struct TextContent {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

impl CallToolResult {
    fn new(output: ToolOutput, with_structured_content: bool, stateless: bool) -> Self {
        CallToolResult {
            content: [TextContent { kind: "text", text: output.text }],
            is_error: output.is_error,
            structured_content: output.structured.filter(|_| with_structured_content),
            result_type: stateless.then_some("complete"),
            meta: stateless.then(stateless::result_meta),
        }
    }
}

fn error_response(id: Value, code: i64, message: &str) -> Response {
    Response { jsonrpc: "2.0", id, outcome: Outcome::Error { code, message: message.to_string(), data: None } }
}

/// The answer to a line that is not a message this server can take, if JSON-RPC gives it one.
fn invalid_response(invalid: Invalid) -> Option<Response> {
    match invalid {
        Invalid::Parse(message) => Some(error_response(Value::Null, PARSE_ERROR, &message)),
        // JSON-RPC 2.0 gives it the message's id when that can be read, and null otherwise.
        Invalid::Request { id, problem } => {
            Some(error_response(id.map_or(Value::Null, |id| id.0), INVALID_REQUEST, problem))
        }
        Invalid::PositionalParams { id } => Some(error_response(id.0, INVALID_PARAMS, "\"params\" must be an object")),
        Invalid::Unanswerable => None,
    }
}

fn result_response(id: Value, result: ResultBody) -> Response {
    Response { jsonrpc: "2.0", id, outcome: Outcome::Result(result) }
}

/// The response to request `id`, if it gets one.
fn respond(id: Value, outcome: Result<Option<ResultBody>, Failure>) -> Option<Response> {
    match outcome {
        Ok(Some(result)) => Some(result_response(id, result)),
        // Cancelled: the client said it no longer wants an answer.
        Ok(None) => None,
        Err(Failure { code, message, data }) => {
            Some(Response { jsonrpc: "2.0", id, outcome: Outcome::Error { code, message, data } })
        }
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
        lock(&self.protocol_version).as_str() >= STRUCTURED_OUTPUT_SINCE
    }

    /// Answers one message: the future gives the response, if it gets one. A tool call is
    /// registered for cancellation here, as its line is read, rather than when that future first
    /// runs: calls run beside the reader loop, which may read and handle the line cancelling the
    /// call before then, and a cancellation that finds no call is dropped.
    fn admit(self: &Arc<Self>, message: Result<Message, Invalid>) -> impl Future<Output = Option<Response>> + Send {
        let in_flight = match &message {
            Ok(Message::Request(request)) if request.method == "tools/call" => {
                Some(InFlight::register(self, &request.id))
            }
            _ => None,
        };
        let server = self.clone();
        async move { server.answer(message, in_flight).await }
    }

    /// The response to one message, if it gets one; `in_flight` is a tool call's registration.
    async fn answer(
        self: &Arc<Self>,
        message: Result<Message, Invalid>,
        in_flight: Option<InFlight>,
    ) -> Option<Response> {
        match message {
            Err(invalid) => invalid_response(invalid),
            Ok(Message::Response(reply)) => {
                self.requests.answer(reply);
                None
            }
            Ok(Message::Notification(notification)) => {
                self.notification(notification);
                None
            }
            Ok(Message::Request(request)) => self.answer_request(request, in_flight).await,
        }
    }

    /// Answers a request, with a panic (a bug) answered as an internal error instead of taking
    /// the server, and every other call running beside it, down.
    async fn answer_request(self: &Arc<Self>, request: Request, in_flight: Option<InFlight>) -> Option<Response> {
        let id = request.id.clone();
        match AssertUnwindSafe(self.request(request, in_flight)).catch_unwind().await {
            Ok(outcome) => respond(id.0, outcome),
            Err(_) => Some(error_response(
                id.0,
                INTERNAL_ERROR,
                "swank-mcp failed unexpectedly while handling this request (a bug; its stderr has the details). \
                 Other requests are not affected.",
            )),
        }
    }

    fn notification(&self, notification: Notification) {
        match notification.method.as_str() {
            // Honoured without `initialize` too: calls of revision 2026-07-28 come without one.
            "notifications/cancelled" => {
                let Ok(CancelledParams { request_id }) = notification.params.read() else { return };
                let key = request_id.to_string();
                match lock(&self.in_flight).get(&key) {
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

    async fn request(
        self: &Arc<Self>,
        request: Request,
        in_flight: Option<InFlight>,
    ) -> Result<Option<ResultBody>, Failure> {
        let method = request.method.as_str();
        let invalid = |e: serde_json::Error| Failure::new(INVALID_PARAMS, format!("Invalid {method} params: {e}"));
        match method {
            "initialize" => self.initialize(request.params.read().map_err(invalid)?).map(|r| Some(ResultBody::Json(r))),
            "ping" => {
                let MetaParams { meta } = request.params.read().map_err(invalid)?;
                if RequestMeta::is_stateless(&meta) {
                    return Err(Failure::new(
                        METHOD_NOT_FOUND,
                        format!("Method not found: ping is not part of MCP {STATELESS_VERSION}"),
                    ));
                }
                Ok(Some(ResultBody::Json(json!({}))))
            }
            "server/discover" => {
                let MetaParams { meta } = request.params.read().map_err(invalid)?;
                stateless::client_of(meta, method)?;
                Ok(Some(ResultBody::Json(self.discover())))
            }
            "tools/list" => {
                let params: ListParams = request.params.read().map_err(invalid)?;
                let client = self.client_of(params.meta, method)?;
                // Every tool is on the one page, so no cursor was ever given out.
                if params.cursor.is_some() {
                    return Err(Failure::new(
                        INVALID_PARAMS,
                        "Invalid cursor: this server lists every tool in one reply and gives out no cursor",
                    ));
                }
                let tools = tool_list(self.pipeline.toolbox());
                Ok(Some(ResultBody::Json(match client {
                    None => json!({ "tools": tools }),
                    Some(_) => json!({
                        "tools": tools,
                        "resultType": "complete",
                        "ttlMs": CACHE_TTL_MS,
                        "cacheScope": CACHE_SCOPE,
                        "_meta": stateless::result_meta(),
                    }),
                })))
            }
            "tools/call" => {
                let mut params: CallToolParams = request.params.read().map_err(|e| {
                    Failure::new(
                        INVALID_PARAMS,
                        format!("tools/call needs a \"name\" string and optional \"arguments\" object: {e}"),
                    )
                })?;
                let progress_token = params.meta.as_mut().and_then(|meta| meta.progress_token.take());
                let client = self.client_of(params.meta.take(), method)?;
                let in_flight = in_flight.unwrap_or_else(|| InFlight::register(self, &request.id));
                self.call_tool(in_flight, params, progress_token, client).await
            }
            other => Err(Failure::new(METHOD_NOT_FOUND, format!("Method not found: {other}"))),
        }
    }

    /// The client of a request to `method` as revision 2026-07-28 has it describe itself; `None`
    /// for a request of the handshake's revisions, served once `initialize` was answered.
    fn client_of(&self, meta: Option<RequestMeta>, method: &str) -> Result<Option<StatelessClient>, Failure> {
        if RequestMeta::is_stateless(&meta) {
            return stateless::client_of(meta, method).map(Some);
        }
        if !self.is_initialized() {
            return Err(Failure::new(
                NOT_INITIALIZED,
                format!(
                    "The server is not initialized: send initialize first, and {method} once it is answered (or \
                     give each request the _meta of MCP {STATELESS_VERSION})"
                ),
            ));
        }
        Ok(None)
    }

    fn initialize(&self, params: InitializeParams) -> Result<Value, Failure> {
        // Once per process: a second would change the revision and what the client can do under
        // the calls already made on the first one's terms.
        if self.is_initialized() {
            return Err(Failure::new(
                INVALID_REQUEST,
                "Already initialized: initialize is answered once per server process",
            ));
        }
        let requested = params.protocol_version.as_deref().unwrap_or_default();
        let version = SUPPORTED_VERSIONS.iter().find(|v| **v == requested).copied().unwrap_or(SUPPORTED_VERSIONS[0]);
        *lock(&self.protocol_version) = version.to_string();
        // The reader loop answers `initialize` before it reads another line, so nothing read
        // after this precedes the response.
        self.initialized.store(true, Ordering::Release);
        let client = self.name.clone().or(params.client_info.and_then(|info| info.name));
        let client = client.as_deref().unwrap_or("unknown client");
        let elicitation = params.capabilities.as_ref().and_then(|c| c.get("elicitation"));
        let asks = version >= ELICITATION_SINCE && elicitation::accepts_forms(elicitation);
        *lock(&self.caller) = Arc::new(Caller {
            client: client.to_string(),
            asks: asks.then(|| Arc::new(Elicitation(self.requests.clone())) as Arc<dyn Ask>),
            cannot_ask: elicitation::cannot_ask(version, elicitation, "initialize"),
        });
        tracing::info!(client, requested, version, asks, "initialize");
        Ok(json!({
            "protocolVersion": version,
            "capabilities": { "tools": { "listChanged": false } },
            "serverInfo": server_info(),
            "instructions": self.pipeline.toolbox().instructions(),
        }))
    }

    /// `server/discover`: what a client of revision 2026-07-28 may learn before its first call.
    fn discover(&self) -> Value {
        json!({
            "resultType": "complete",
            "supportedVersions": [STATELESS_VERSION],
            "capabilities": { "tools": { "listChanged": false } },
            "instructions": self.pipeline.toolbox().instructions(),
            "ttlMs": CACHE_TTL_MS,
            "cacheScope": CACHE_SCOPE,
            "_meta": stateless::result_meta(),
        })
    }

    /// Progress reports for a call whose `_meta` carries a `progressToken` (a string or an
    /// integer), sent as `notifications/progress`; none otherwise.
    fn progress_for(&self, token: Option<Value>) -> Progress {
        let Some(token) = token.filter(|token| token.is_string() || token.is_i64() || token.is_u64()) else {
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

    /// Runs a tool call: of the `initialize`d session's client, or of a `stateless` one.
    async fn call_tool(
        self: &Arc<Self>,
        in_flight: InFlight,
        params: CallToolParams,
        progress_token: Option<Value>,
        stateless: Option<StatelessClient>,
    ) -> Result<Option<ResultBody>, Failure> {
        let CallToolParams { name, arguments, input_responses, request_state, .. } = params;
        let cancel = in_flight.cancel.clone();
        let started = std::time::Instant::now();
        let (caller, round, structured_output) = match &stateless {
            None => (lock(&self.caller).clone(), None, self.structured_output()),
            Some(client) => {
                let answer = match request_state {
                    Some(state) => Some(self.rounds.open(&state).map_err(|why| Failure::new(INVALID_PARAMS, why))?),
                    None => None,
                };
                let answer = answer.map(|state| Answer::new(input_responses.as_ref(), state));
                let (caller, round) = self.stateless_caller(client, answer);
                (Arc::new(caller), round, true)
            }
        };
        let progress = self.progress_for(progress_token);
        let call = Call { tool: &name, arguments, caller: &caller, cancel: cancel.clone(), progress };
        let output = self.pipeline.call(call).await;
        drop(in_flight);
        tracing::debug!(tool = name, elapsed = ?started.elapsed(), "tool call finished");
        let Some(output) = output else {
            return Err(Failure::new(INVALID_PARAMS, format!("Unknown tool: {name}")));
        };
        if cancel.is_cancelled() {
            return Ok(None);
        }
        if let Some(mut asked) = round.and_then(|round| round.asked()) {
            asked["_meta"] = stateless::result_meta();
            return Ok(Some(ResultBody::Json(asked)));
        }
        let with_structured_content = self.structured_content && structured_output;
        Ok(Some(ResultBody::ToolCall(CallToolResult::new(output, with_structured_content, stateless.is_some()))))
    }

    /// The caller of one request of revision 2026-07-28, as its `_meta` describes it, with the
    /// `answer` it brings from the approval round before it; and that round, when its client asks
    /// the human (it declared form elicitation).
    fn stateless_caller(&self, client: &StatelessClient, answer: Option<Answer>) -> (Caller, Option<Arc<Round>>) {
        let elicitation = client.capabilities.get("elicitation");
        let round = elicitation::accepts_forms(elicitation).then(|| Arc::new(Round::new(self.rounds.clone(), answer)));
        let caller = Caller {
            client: self.name.clone().or_else(|| client.name.clone()).unwrap_or_else(|| "unknown client".to_string()),
            asks: round.clone().map(|round| round as Arc<dyn Ask>),
            cannot_ask: elicitation::cannot_ask(STATELESS_VERSION, elicitation, "the request's clientCapabilities"),
        };
        (caller, round)
    }
}

#[derive(Deserialize)]
struct InitializeParams {
    #[serde(rename = "protocolVersion", default)]
    protocol_version: Option<String>,
    #[serde(default)]
    capabilities: Option<Value>,
    #[serde(rename = "clientInfo", default)]
    client_info: Option<ClientInfo>,
}

#[derive(Deserialize)]
struct ClientInfo {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct ListParams {
    #[serde(default)]
    cursor: Option<Value>,
    #[serde(rename = "_meta", default)]
    meta: Option<RequestMeta>,
}

#[derive(Deserialize)]
struct CallToolParams {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(rename = "_meta", default)]
    meta: Option<RequestMeta>,
    /// The answers a retry of revision 2026-07-28 brings from the round before it.
    #[serde(rename = "inputResponses", default)]
    input_responses: Option<Value>,
    /// The state of that round, as the server sealed it.
    #[serde(rename = "requestState", default)]
    request_state: Option<String>,
}

#[derive(Deserialize)]
struct CancelledParams {
    #[serde(rename = "requestId")]
    request_id: Value,
}

/// A tool call's entry in [`Server::in_flight`], from when its line is read until it ends,
/// removed however it ends: with its output, refused, or by a panic.
struct InFlight {
    server: Arc<Server>,
    key: String,
    /// Cancelled by the client's `notifications/cancelled`.
    cancel: CancellationToken,
}

impl InFlight {
    fn register(server: &Arc<Server>, id: &RequestId) -> Self {
        let (key, cancel) = (id.0.to_string(), CancellationToken::new());
        lock(&server.in_flight).insert(key.clone(), cancel.clone());
        InFlight { server: server.clone(), key, cancel }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.server.in_flight).remove(&self.key);
    }
}
