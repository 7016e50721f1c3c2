//! The `swank-mcp` binary end to end: JSON-RPC over its stdio, against a real image.

mod common;

use std::time::{Duration, Instant};

use common::{is_error, text, McpClient};
use serde_json::{json, Value};

#[tokio::test]
async fn initialize_negotiates_the_protocol_version_once() {
    for (asked, answered) in [
        ("2024-11-05", "2024-11-05"),
        ("2025-03-26", "2025-03-26"),
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("1999-01-01", "2025-11-25"),
        // Reached per request, never through the handshake.
        ("2026-07-28", "2025-11-25"),
    ] {
        let mut client = McpClient::for_port(common::dead_port()).await;
        let params = json!({"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}});
        let reply = client.request("initialize", params.clone()).await;
        let result = &reply["result"];
        assert_eq!(result["protocolVersion"], answered);
        assert_eq!(result["serverInfo"]["name"], "swank-mcp");
        assert!(result["capabilities"]["tools"].is_object());
        assert!(result["instructions"].as_str().unwrap().contains("evaluate-lisp"));
        assert_eq!(result.get("resultType"), None, "{reply}");
        // A second initialize would change the revision under the session: refused, and the
        // first one holds.
        let again = client.request("initialize", json!({"protocolVersion": "2024-11-05", "capabilities": {}})).await;
        assert_eq!(again["error"]["code"], -32600, "{again}");
        assert!(again["error"]["message"].as_str().unwrap().contains("Already initialized"), "{again}");
        assert_eq!(client.request("ping", json!({})).await["result"], json!({}));
    }
}

/// The `_meta` of a request of revision 2026-07-28, from a client with `capabilities`.
fn stateless_meta(capabilities: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "stateless-tests", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    })
}

/// Revision 2026-07-28 is served request by request, with no `initialize`, beside the handshake:
/// `server/discover`, `tools/list` with its cache hints, `tools/call` with `resultType`, and the
/// errors the revision names for a version it does not serve or a `_meta` without what it needs.
#[tokio::test]
async fn revision_2026_07_28_is_served_per_request_without_initialize() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    let meta = stateless_meta(json!({}));
    let discovered = client.request("server/discover", json!({"_meta": meta})).await;
    let result = &discovered["result"];
    assert_eq!(result["resultType"], "complete", "{discovered}");
    assert_eq!(result["supportedVersions"], json!(["2026-07-28"]));
    assert!(result["capabilities"]["tools"].is_object());
    assert!(result["instructions"].as_str().unwrap().contains("evaluate-lisp"));
    assert_eq!(result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "swank-mcp");
    assert!(result["ttlMs"].as_u64().unwrap() > 0 && result["cacheScope"] == "public", "{discovered}");

    let listed = client.request("tools/list", json!({"_meta": meta})).await;
    let result = &listed["result"];
    assert_eq!(result["resultType"], "complete", "{listed}");
    assert_eq!(result["tools"].as_array().unwrap().len(), 22);
    assert!(result["ttlMs"].as_u64().unwrap() > 0 && result["cacheScope"] == "public", "{listed}");
    assert_eq!(result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "swank-mcp");

    let called = client
        .request("tools/call", json!({"name": "lisp-check-parens", "arguments": {"code": "(a (b)"}, "_meta": meta}))
        .await;
    assert_eq!(called["result"]["resultType"], "complete", "{called}");
    assert_eq!(called["result"]["isError"], false, "{called}");
    assert!(text(&called).contains("missing"), "{called}");
    // A tool that runs in the image says that there is none, as under the handshake.
    let called =
        client.request("tools/call", json!({"name": "evaluate-lisp", "arguments": {"code": "1"}, "_meta": meta})).await;
    assert!(is_error(&called) && text(&called).contains("swank:create-server"), "{called}");

    // A revision not served: -32022 with the ones that are, the handshake's among them.
    let mut old = meta.clone();
    old["io.modelcontextprotocol/protocolVersion"] = json!("2025-11-25");
    let refused = client.request("tools/list", json!({"_meta": old})).await;
    assert_eq!(refused["error"]["code"], -32022, "{refused}");
    assert_eq!(refused["error"]["data"]["requested"], "2025-11-25");
    let supported = refused["error"]["data"]["supported"].as_array().unwrap();
    assert!(supported.contains(&json!("2026-07-28")) && supported.contains(&json!("2024-11-05")), "{refused}");
    // The required fields: -32602.
    let mut without_capabilities = meta.clone();
    without_capabilities.as_object_mut().unwrap().remove("io.modelcontextprotocol/clientCapabilities");
    let refused = client.request("tools/list", json!({"_meta": without_capabilities})).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_eq!(client.request("server/discover", json!({})).await["error"]["code"], -32602);
    // The revision has no ping; unknown methods are unknown in it too.
    assert_eq!(client.request("ping", json!({"_meta": meta})).await["error"]["code"], -32601);
    assert_eq!(client.request("resources/list", json!({"_meta": meta})).await["error"]["code"], -32601);

    // Requests of the handshake's revisions still wait for initialize, which the same process
    // then serves beside the stateless requests.
    assert_eq!(client.request("tools/list", json!({})).await["error"]["code"], -32003);
    client.initialize().await;
    let listed = client.request("tools/list", json!({})).await;
    assert_eq!(listed["result"].get("resultType"), None, "{listed}");
    assert_eq!(client.request("tools/list", json!({"_meta": meta})).await["result"]["resultType"], "complete");
}

#[tokio::test]
async fn an_invalid_cursor_is_invalid_params_in_every_revision() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    client.initialize().await;
    let reply = client.request("tools/list", json!({"cursor": "page-2"})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert!(reply["error"]["message"].as_str().unwrap().contains("cursor"), "{reply}");
    let reply = client.request("tools/list", json!({"cursor": "x", "_meta": stateless_meta(json!({}))})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
}

#[tokio::test]
async fn tools_are_listed_with_schemas_and_annotations_without_an_image() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    client.initialize().await;
    let reply = client.request("tools/list", json!({})).await;
    let tools = reply["result"]["tools"].as_array().unwrap();
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("{name} listed")).clone();
    let evaluate = tool("evaluate-lisp");
    assert_eq!(evaluate["inputSchema"]["required"], json!(["code"]));
    // A string takes no type, as the instructions say once; the others say theirs.
    assert_eq!(evaluate["inputSchema"]["properties"]["package"], json!({}));
    assert_eq!(evaluate["inputSchema"]["properties"]["debug"], json!({"type": "boolean"}));
    // The one hint is readOnlyHint, of a read-only tool: the others would each say a tool is safer
    // than a client assumes without them.
    assert_eq!(evaluate.get("annotations"), None);
    // No title: a client shows the name.
    assert_eq!(evaluate.get("title"), None);
    assert_eq!(tool("lisp-outline")["annotations"], json!({"readOnlyHint": true}));
    assert_eq!(tool("edit-lisp-form").get("annotations"), None);
    assert_eq!(tool("load-system").get("annotations"), None);
}

/// Every agent session carries the tool list and the instructions in its context before its first
/// call: the two stay within 8,000 bytes with every tool offered (the `result` of tools/list, as
/// compact JSON, and the instructions' text), and the workflow that ties the tools together, and
/// what the arguments of many tools have in common, are said once, in the instructions, rather
/// than in each description.
#[tokio::test]
async fn the_tool_list_and_the_instructions_are_at_most_8000_bytes_with_every_tool() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    let initialized = client.initialize().await;
    let reply = client.request("tools/list", json!({})).await;
    let tools = reply["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 22, "{reply}");
    let listed = serde_json::to_string(&reply["result"]).unwrap().len();
    let instructions = initialized["result"]["instructions"].as_str().unwrap();
    assert!(
        listed + instructions.len() <= 8_000,
        "tools/list is {listed} bytes and the instructions {}: {} in all",
        instructions.len(),
        listed + instructions.len()
    );
    for tool in tools {
        let description = tool["description"].as_str().unwrap();
        assert!(!description.is_empty() && tool.get("outputSchema").is_none(), "{tool}");
        assert!(tool["inputSchema"]["type"] == "object", "{tool}");
    }
    for step in ["run-tests", "debug: true", "inspect"] {
        assert!(instructions.contains(step), "{step} in {instructions}");
    }
    // What every file_path, package, symbol, form_type and form_name is, said once, and the type
    // that goes unsaid.
    for convention in [
        "Arguments of no type are strings",
        "file_path is absolute or relative to the first --root",
        "package defaults to your session's",
        "A symbol is name, pkg:name or pkg::name",
        "form_name as lisp-outline shows them",
    ] {
        assert!(instructions.contains(convention), "{convention} in {instructions}");
    }
    // The loop that fixes failing tests, in its order.
    let steps =
        ["run-tests", "find-definition with source: true", "operation \"patch\"", "load: true", "then run-tests again"];
    let places: Vec<Option<usize>> = steps.iter().map(|step| instructions.find(step)).collect();
    assert!(places.iter().all(Option::is_some) && places.windows(2).all(|pair| pair[0] < pair[1]), "{instructions}");
}

#[tokio::test]
async fn old_protocol_versions_get_no_structured_output() {
    let port = common::shared_image_port().to_string();
    let mut client = McpClient::start(&["--port", &port, "--structured-content"]).await;
    client
        .request(
            "initialize",
            json!({"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        )
        .await;
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(+ 1 2)"})).await;
    assert!(reply["result"].get("structuredContent").is_none());
}

#[tokio::test]
async fn evaluate_lisp_answers_per_contract() {
    let mut client = McpClient::for_port(common::shared_image_port()).await;
    client.initialize().await;
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(+ 1 2)"})).await;
    assert_eq!(reply["result"], json!({"content": [{"type": "text", "text": "=> 3"}], "isError": false}));
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(/ 1 0)"})).await;
    assert!(is_error(&reply));
    assert!(text(&reply).starts_with("[ERROR] DIVISION-BY-ZERO\n"));
}

/// A client may show the model a result's structuredContent in place of its text (Claude Code
/// does), and the text is the whole reply: the note on a cut section, the [background] section. So
/// the facts go as JSON only when asked for, and then beside the same text.
#[tokio::test]
async fn structured_content_is_sent_only_when_asked_for() {
    let code = "(progn (sb-thread:join-thread (sb-thread:make-thread (lambda () (error \"bg\"))) :default nil) \
                (dotimes (i 3000) (print i)))";
    let port = common::shared_image_port().to_string();
    for flags in [&[][..], &["--structured-content"][..]] {
        let mut client = McpClient::start(&[&["--port", port.as_str()][..], flags].concat()).await;
        client.initialize().await;
        let reply = client.call_tool("evaluate-lisp", json!({"code": code})).await;
        let text = text(&reply);
        assert!(text.contains("inspect @") && text.contains("[background]"), "{text}");
        let structured = reply["result"].get("structuredContent");
        assert_eq!(structured.is_some(), !flags.is_empty(), "{flags:?}: {reply}");
    }
}

/// Tool calls in the usual shape take a fast path that reads them without a `Value`; every other
/// spelling of the same call (escapes, duplicate or extra members, a progress token, null
/// arguments) must still get the same answer, and a malformed one the same error.
#[tokio::test]
async fn unusual_spellings_of_a_tool_call_get_the_same_answer() {
    let port = common::shared_image_port().to_string();
    let mut client = McpClient::start(&["--port", &port, "--structured-content"]).await;
    client.initialize().await;
    let spellings: [&[u8]; 5] = [
        br#"{"jsonrpc":"2.0","id":101,"method":"tools/call","params":{"name":"evaluate-lisp","arguments":{"code":"(+ 1 2)"}}}"#,
        br#"{"jsonrpc":"2.0","id":102,"method":"tools\/call","params":{"name":"evaluate-lisp","arguments":{"code":"(+ 1 2)"}}}"#,
        br#"{"id":103,"method":"ping","method":"tools/call","jsonrpc":"2.0","params":{"arguments":{"code":"(+ 1 2)"},"name":"evaluate-lisp","extra":[1]}}"#,
        br#"{"jsonrpc":"2.0","id":"104","method":"tools/call","params":{"name":"evaluate-lisp","arguments":{"code":"(+ 1 2)"},"_meta":{"progressToken":7}}}"#,
        br#"{"jsonrpc":"2.0","id":105,"method":"tools/call","params":{"name":"evaluate-lisp","arguments":{"code":"(+ 1 2)","package":null}}}"#,
    ];
    for (i, line) in spellings.iter().enumerate() {
        client.send_raw(line).await;
        let reply = client.receive().await;
        assert_eq!(reply["result"]["content"], json!([{"type": "text", "text": "=> 3"}]), "spelling {i}: {reply}");
        assert_eq!(reply["result"]["structuredContent"]["values"], json!(["3"]), "spelling {i}: {reply}");
    }
    client.send_raw(br#"{"jsonrpc":"2.0","id":106,"method":"tools/call","params":{"arguments":{"code":"1"}}}"#).await;
    assert_eq!(client.receive().await["error"]["code"], -32602);
    client
        .send_raw(
            br#"{"jsonrpc":"2.0","id":107,"method":"tools/call","params":{"name":"evaluate-lisp","arguments":null}}"#,
        )
        .await;
    let reply = client.receive().await;
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    assert!(text(&reply).contains("Missing required argument `code`"), "{reply}");
    client.send_raw(br#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"evaluate-lisp","arguments":{"code":"1"}}}"#).await;
    assert_eq!(client.receive().await["error"]["code"], -32600);
}

#[tokio::test]
async fn protocol_errors_get_the_right_codes_and_the_server_carries_on() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    client.initialize().await;
    client.send_raw(b"{not json").await;
    assert_eq!(client.receive().await["error"]["code"], -32700);
    client.send_raw(b"\xff\xfe garbage \x00").await;
    assert_eq!(client.receive().await["error"]["code"], -32700);
    client.send_raw(b"[]").await;
    assert_eq!(client.receive().await["error"]["code"], -32600);
    client.send_raw(b"42").await;
    assert_eq!(client.receive().await["error"]["code"], -32600);
    client.send(&json!({"jsonrpc": "2.0", "id": {"an": "object"}, "method": "ping"})).await;
    let reply = client.receive().await;
    assert_eq!((reply["error"]["code"].clone(), reply["id"].clone()), (json!(-32600), Value::Null));
    assert_eq!(client.request("no/such/method", json!({})).await["error"]["code"], -32601);
    assert_eq!(
        client.request("tools/call", json!({"name": "no-such-tool", "arguments": {}})).await["error"]["code"],
        -32602
    );
    assert_eq!(client.request("tools/call", json!({"arguments": {}})).await["error"]["code"], -32602);
    // Bad argument values are tool errors the model can act on, not protocol errors.
    let reply = client.call_tool("evaluate-lisp", json!({"code": ["not", "a", "string"]})).await;
    assert!(is_error(&reply));
    assert!(text(&reply).contains("Argument `code` must be a string"));
    // String ids are echoed as given.
    client.send(&json!({"jsonrpc": "2.0", "id": "abc", "method": "ping"})).await;
    assert_eq!(client.receive().await["id"], "abc");
    // Still serving.
    assert_eq!(client.request("ping", json!({})).await["result"], json!({}));
}

#[tokio::test]
async fn an_over_long_line_is_refused_and_skipped() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    let mut huge = br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":""#.to_vec();
    huge.extend(std::iter::repeat_n(b'a', 17 * 1024 * 1024));
    huge.extend_from_slice(b"\"}}");
    client.send_raw(&huge).await;
    let reply = client.receive().await;
    assert_eq!(reply["error"]["code"], -32600);
    assert!(reply["error"]["message"].as_str().unwrap().contains("over the limit"));
    assert_eq!(client.request("ping", json!({})).await["result"], json!({}));
}

#[tokio::test]
async fn batches_are_answered_as_batches() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    client
        .send(&json!([
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "nope"}
        ]))
        .await;
    let reply = client.receive().await;
    let replies = reply.as_array().expect("a batch answer");
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[0]["result"], json!({}));
    assert_eq!(replies[1]["error"]["code"], -32601);
}

#[tokio::test]
async fn no_image_is_an_actionable_tool_error() {
    let port = common::dead_port();
    let mut client = McpClient::for_port(port).await;
    client.initialize().await;
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(+ 1 2)"})).await;
    assert!(is_error(&reply));
    assert!(text(&reply).contains(&format!("127.0.0.1:{port}")));
    assert!(text(&reply).contains("swank:create-server"));
}

#[tokio::test]
async fn tool_calls_run_concurrently() {
    let mut client = McpClient::for_port(common::shared_image_port()).await;
    client.initialize().await;
    client.send(&json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": {"name": "evaluate-lisp", "arguments": {"code": "(progn (sleep 2) :slow)"}}})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    client.send(&json!({"jsonrpc": "2.0", "id": "quick", "method": "tools/call", "params": {"name": "evaluate-lisp", "arguments": {"code": ":quick"}}})).await;
    let first = client.receive().await;
    assert_eq!(first["id"], "quick");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    let second = client.receive().await;
    assert_eq!((second["id"].clone(), text(&second).to_string()), (json!("slow"), "=> :SLOW".to_string()));
}

/// A long evaluation reports progress while the image works when the call asked for it with a
/// token, so that a client that resets its time limit on progress waits for it; a call without a
/// token gets none.
#[tokio::test]
async fn a_long_evaluation_reports_progress_when_asked() {
    let mut client = McpClient::for_port(common::shared_image_port()).await;
    client.initialize().await;
    let code = json!({"code": "(progn (sleep 2.5) :done)"});
    let (reply, progress) = client.call_tool_with_progress("evaluate-lisp", code, "long-eval").await;
    assert_eq!(text(&reply), "=> :DONE");
    assert!(progress.len() >= 2, "{progress:?}");
    for (i, update) in progress.iter().enumerate() {
        assert_eq!((&update["progressToken"], &update["progress"]), (&json!("long-eval"), &json!(i + 1)));
    }
    assert_eq!(progress[0]["message"], "Evaluating (1 s)");
    // The next message is the answer (McpClient checks).
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(progn (sleep 1.5) :quiet)"})).await;
    assert_eq!(text(&reply), "=> :QUIET");
}

#[tokio::test]
async fn cancellation_interrupts_the_call_and_sends_no_response() {
    let image = common::private_image().await;
    let mut client = McpClient::for_port(image.port).await;
    client.initialize().await;
    client.call_tool("evaluate-lisp", json!({"code": "(defvar *cancel-test-state* :idle)"})).await;
    client
        .send(&json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": "evaluate-lisp", "arguments": {"code": "(unwind-protect (progn (setf *cancel-test-state* :running) (sleep 60)) (setf *cancel-test-state* :unwound))"}}}))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 77, "reason": "test"}})).await;
    // The next answer is for the next request: none is sent for the cancelled one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reply = client.call_tool("evaluate-lisp", json!({"code": "*cancel-test-state*"})).await;
    assert_eq!(text(&reply), "=> :UNWOUND");
}

/// A `tools/call` line followed at once by the line cancelling it (issue 36.6): in one write,
/// so that the server reads the cancellation before it starts the call, or a few milliseconds
/// later, when the call's request is on its way to the image or waits there for a thread. The
/// evaluation must never start: none of them pushes its number. Some go one at a time, some in
/// storms of several calls and their cancellations at once.
#[tokio::test]
async fn a_cancellation_right_behind_its_call_stops_the_evaluation_from_starting() {
    let image = common::private_image().await;
    let mut client = McpClient::for_port(image.port).await;
    client.initialize().await;
    client.call_tool("evaluate-lisp", json!({"code": "(defvar cl-user::*cancel-race-ran* nil)"})).await;
    let call = |n: usize| {
        json!({"jsonrpc": "2.0", "id": format!("race-{n}"), "method": "tools/call", "params": {"name": "evaluate-lisp",
               "arguments": {"code": format!("(progn (sleep 3) (push {n} cl-user::*cancel-race-ran*))")}}})
    };
    let cancel = |n: usize| json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": format!("race-{n}")}});
    let lines = |messages: &[Value]| messages.iter().map(|m| format!("{m}\n")).collect::<String>();
    let mut next = 0;
    for round in 0..30 {
        let line = lines(&[call(next), cancel(next)]);
        match round % 3 {
            0 => client.send_raw(line.trim_end().as_bytes()).await,
            delay => {
                client.send(&call(next)).await;
                tokio::time::sleep(Duration::from_millis(delay as u64 * 3)).await;
                client.send(&cancel(next)).await;
            }
        }
        next += 1;
    }
    for storm in 0..4 {
        let numbers: Vec<usize> = (next..next + 8).collect();
        next += 8;
        let calls: Vec<Value> = numbers.iter().map(|&n| call(n)).collect();
        let cancels: Vec<Value> = numbers.iter().map(|&n| cancel(n)).collect();
        if storm % 2 == 0 {
            client.send_raw(lines(&[calls, cancels].concat()).trim_end().as_bytes()).await;
        } else {
            client.send_raw(lines(&calls).trim_end().as_bytes()).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
            client.send_raw(lines(&cancels).trim_end().as_bytes()).await;
        }
    }
    // Long enough for any evaluation that started to have pushed its number.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let checked = Instant::now();
    // No response comes for a cancelled call: the first is the check's.
    let reply = client.call_tool("evaluate-lisp", json!({"code": "cl-user::*cancel-race-ran*"})).await;
    assert_eq!(text(&reply), "=> NIL", "of {next} cancelled evaluations, these ran");
    assert!(checked.elapsed() < Duration::from_secs(2), "the server was slow to answer: {:?}", checked.elapsed());
}

#[tokio::test]
async fn the_server_exits_when_stdin_closes_and_stdout_carries_only_json() {
    let mut client = McpClient::for_port(common::shared_image_port()).await;
    client.initialize().await;
    let reply = client
        .call_tool(
            "evaluate-lisp",
            json!({"code": "(progn (print :to-stdout) (format *error-output* \"to stderr\") 1)"}),
        )
        .await;
    assert!(text(&reply).contains(":TO-STDOUT"));
    client.close_stdin();
    let rest = client.remaining_lines().await;
    assert!(rest.iter().all(|line| serde_json::from_str::<Value>(line).is_ok()), "{rest:?}");
    let status =
        tokio::time::timeout(Duration::from_secs(10), client.child.wait()).await.expect("exits within 10 s").unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn stdin_closing_mid_evaluation_interrupts_it_and_exits() {
    let image = common::private_image().await;
    let observer = common::toolbox(image.port);
    let threads = || async {
        let output = observer
            .call("evaluate-lisp", Some(json!({"code": "(length (sb-thread:list-all-threads))"})), Default::default())
            .await
            .unwrap();
        output.text.trim_start_matches("=> ").parse::<i64>().unwrap()
    };
    let baseline = threads().await;
    let mut client = McpClient::for_port(image.port).await;
    client.initialize().await;
    client.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "evaluate-lisp", "arguments": {"code": "(sleep 60)"}}})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(threads().await > baseline, "the evaluation and the client's connection have threads");
    let closed = Instant::now();
    client.close_stdin();
    tokio::time::timeout(Duration::from_secs(10), client.child.wait()).await.expect("exits").unwrap();
    assert!(closed.elapsed() < Duration::from_secs(6), "{:?}", closed.elapsed());
    // The sleeping thread was interrupted, and the client's connection threads ended with it.
    let mut now = threads().await;
    while now > baseline && closed.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = threads().await;
    }
    assert_eq!(now, baseline);
}

#[tokio::test]
async fn cli_eval_prints_the_text_and_sets_the_exit_code() {
    let port = common::shared_image_port().to_string();
    let run = |code: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
            .args(["--port", &port, "eval", code])
            .output()
            .unwrap()
    };
    let output = run("(floor 17 5)");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "=> 3\n=> 2\n");
    assert!(output.status.success());
    // No handle: the one-shot session ends before anyone could inspect it.
    let output = run("(list \"a\" 1)");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "=> (\"a\" 1)\n");
    let output = run("(car 42)");
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("[ERROR] TYPE-ERROR"));
    assert_eq!(output.status.code(), Some(1));
    let status =
        std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp")).args(["--port", &port, "status"]).output().unwrap();
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(said.contains("connected to SBCL") && said.contains("swank"), "{said}");
}

#[tokio::test]
async fn cli_eval_against_a_silent_server_fails_once_not_twice() {
    // Accepts connections and never answers. The call's failure is not followed by a second
    // wait for the activity record's sake.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let started = std::time::Instant::now();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--port", &port, "--connect-timeout", "1s", "eval", "(+ 1 2)"])
        .output()
        .await
        .unwrap();
    let elapsed = started.elapsed();
    let said = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("no answer to connection-info"), "{said}");
    // The handshake's 5 s, once.
    assert!(elapsed < Duration::from_secs(9), "{elapsed:?}");
}

#[tokio::test]
async fn launch_starts_a_private_image_and_stops_it_on_exit() {
    let port = common::dead_port().to_string();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--launch", "--port", &port, "eval", "(sb-posix:getpid)"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    let pid: i32 = text.trim().trim_start_matches("=> ").parse().unwrap();
    // The image exits with us.
    let gone = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(gone, "the launched image {pid} outlived swank-mcp");
}

#[tokio::test]
async fn launch_without_sbcl_or_swank_says_what_to_install() {
    let port = common::dead_port().to_string();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--launch", "--port", &port, "--swank-loader", "/nonexistent/swank-loader.lisp", "eval", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1));
    assert!(text.contains("cannot find swank") && text.contains("apt-get install -y cl-swank"), "{text}");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--launch", "--port", &port, "eval", "1"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("cannot run `sbcl`") && text.contains("apt-get install -y sbcl"), "{text}");
}

#[tokio::test]
async fn image_tools_are_listed_with_honest_annotations() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    client.initialize().await;
    let reply = client.request("tools/list", json!({})).await;
    let tools = reply["result"]["tools"].as_array().unwrap();
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("{name} listed")).clone();
    for name in ["class-info", "describe-symbol", "apropos-search", "find-definition", "xref", "lisp-status"] {
        assert_eq!(tool(name)["annotations"], json!({"readOnlyHint": true}), "{name}");
    }
    assert_eq!(tool("load-system")["annotations"].get("readOnlyHint"), None, "not read-only, the default");
    // They take code, which SBCL's compiler and macroexpander may run (constant folding).
    for name in ["compile-form", "macroexpand-form"] {
        assert_eq!(tool(name).get("annotations"), None, "{name} is not read-only");
    }
    assert_eq!(tool("compile-form")["inputSchema"]["required"], json!(["code"]));
    assert_eq!(tool("class-info")["inputSchema"]["required"], json!(["class"]));
    assert_eq!(tool("macroexpand-form")["inputSchema"]["properties"]["full"]["type"], "boolean");
    assert_eq!(tool("xref")["inputSchema"]["properties"]["kind"]["enum"].as_array().unwrap().len(), 7);
    // Without an image the tools say how to get one.
    let reply = client.call_tool("class-info", json!({"class": "integer"})).await;
    assert!(is_error(&reply) && text(&reply).contains("swank:create-server"), "{reply}");
}

#[tokio::test]
async fn read_only_and_tools_choose_what_is_offered() {
    let port = common::shared_image_port().to_string();
    let names = |reply: &Value| -> Vec<String> {
        reply["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
    };
    let mut client = McpClient::start(&["--port", &port, "--read-only"]).await;
    client.initialize().await;
    let offered = names(&client.request("tools/list", json!({})).await);
    for hidden in ["evaluate-lisp", "load-system", "edit-lisp-form"] {
        assert!(!offered.iter().any(|n| n == hidden), "{hidden} offered: {offered:?}");
    }
    assert!(
        offered.iter().any(|n| n == "describe-symbol") && offered.iter().any(|n| n == "lisp-outline"),
        "{offered:?}"
    );
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(defvar *read-only-test* 1)"})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");

    let mut client = McpClient::start(&["--port", &port, "--tools", "evaluate-lisp,lisp-status"]).await;
    client.initialize().await;
    assert_eq!(names(&client.request("tools/list", json!({})).await), ["evaluate-lisp", "lisp-status"]);
    assert_eq!(text(&client.call_tool("evaluate-lisp", json!({"code": "(+ 1 2)"})).await), "=> 3");

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--tools", "evaluate-lisp,no-such-tool"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && said.contains("no-such-tool") && said.contains("lisp-outline"), "{said}");
}

#[tokio::test]
async fn requests_before_initialize_are_refused() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    client.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    client.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})).await;
    let reply = client.request("tools/list", json!({})).await;
    assert_eq!(reply["error"]["code"], -32003, "{reply}");
    assert!(reply["error"]["message"].as_str().unwrap().contains("send initialize first"), "{reply}");
    // The shape the fast path reads is refused too.
    client.send_raw(br#"{"jsonrpc":"2.0","id":"early","method":"tools/call","params":{"name":"evaluate-lisp","arguments":{"code":"1"}}}"#).await;
    let reply = client.receive().await;
    assert_eq!((reply["id"].clone(), reply["error"]["code"].clone()), (json!("early"), json!(-32003)), "{reply}");
    assert_eq!(client.request("ping", json!({})).await["result"], json!({}));
    // Unknown methods are -32601 whatever the state.
    assert_eq!(client.request("no/such/method", json!({})).await["error"]["code"], -32601);
    // A client that sends its next request without waiting for the initialize response, or
    // sending notifications/initialized, is served.
    client
        .send_raw(
            concat!(
                r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
                "\n",
                r#"{"jsonrpc":"2.0","id":"list","method":"tools/list"}"#
            )
            .as_bytes(),
        )
        .await;
    let initialized = client.receive().await;
    assert_eq!(
        (initialized["id"].clone(), initialized["result"]["protocolVersion"].clone()),
        (json!("init"), json!("2025-06-18"))
    );
    let listed = client.receive().await;
    assert_eq!(listed["id"], "list");
    assert!(!listed["result"]["tools"].as_array().unwrap().is_empty(), "{listed}");
}

#[tokio::test]
async fn invalid_messages_get_invalid_request_and_the_server_carries_on() {
    let mut client = McpClient::for_port(common::dead_port()).await;
    client.send_raw(b"{}").await;
    let reply = client.receive().await;
    assert_eq!(
        (reply["error"]["code"].clone(), reply["id"].clone()),
        (json!(-32600), Value::Null),
        "before initialize: {reply}"
    );
    client.initialize().await;
    let invalid: [(&[u8], Value); 14] = [
        (b"{}", Value::Null),
        (br#"{"id":7,"method":"ping"}"#, json!(7)),
        (br#"{"jsonrpc":"1.0","id":"x","method":"ping"}"#, json!("x")),
        (br#"{"jsonrpc":2.0,"id":11,"method":"ping"}"#, json!(11)),
        (br#"{"method":"notifications/initialized"}"#, Value::Null),
        (br#"{"jsonrpc":"2.0"}"#, Value::Null),
        (br#"{"jsonrpc":"2.0","id":8}"#, json!(8)),
        (br#"{"jsonrpc":"2.0","id":9,"method":42}"#, json!(9)),
        (br#"{"jsonrpc":"2.0","id":10,"method":"ping","params":3}"#, json!(10)),
        (br#"{"jsonrpc":"2.0","method":"notifications/initialized","params":"x"}"#, Value::Null),
        (br#"{"jsonrpc":"2.0","id":{"no":1},"method":"ping"}"#, Value::Null),
        (br#"{"jsonrpc":"2.0","result":{}}"#, Value::Null),
        (br#"{"jsonrpc":"2.0","id":12,"result":{},"error":{"code":1,"message":"x"}}"#, json!(12)),
        (br#"{"jsonrpc":"2.0","id":13,"error":"oops"}"#, json!(13)),
    ];
    for (line, id) in invalid {
        client.send_raw(line).await;
        let reply = client.receive().await;
        let shown = String::from_utf8_lossy(line);
        assert_eq!((reply["error"]["code"].clone(), reply["id"].clone()), (json!(-32600), id), "{shown}: {reply}");
        assert_eq!(reply["jsonrpc"], "2.0", "{shown}: {reply}");
    }
    // Well-formed responses get no answer (this server sends no requests), nor do valid
    // notifications with positional params: the next answer is the ping's.
    client.send_raw(br#"{"jsonrpc":"2.0","id":14,"result":{}}"#).await;
    client.send_raw(br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#).await;
    client.send_raw(br#"{"jsonrpc":"2.0","method":"notifications/initialized","params":[]}"#).await;
    assert_eq!(client.request("ping", json!({})).await["result"], json!({}));
    client.send_raw(br#"[{}, {"jsonrpc":"2.0","id":20,"method":"ping"}]"#).await;
    let replies = client.receive().await;
    assert_eq!(replies[0]["error"]["code"], -32600, "{replies}");
    assert_eq!((replies[1]["id"].clone(), replies[1]["result"].clone()), (json!(20), json!({})), "{replies}");
    assert_eq!(client.request("ping", json!({})).await["result"], json!({}));
}

/// A client that sends requests without reading the responses: the server stops reading once
/// its queue of unread responses is full, so its memory stays bounded however many requests come
/// (300 000 pings grew it to 167 MB before), and once the client reads, every response arrives,
/// in order.
#[test]
fn a_client_that_stops_reading_stalls_the_server_instead_of_growing_it() {
    use std::io::{BufRead, BufReader, BufWriter, Write};
    use std::process::Stdio;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    const PINGS: usize = 300_000;
    const RSS_LIMIT_KIB: u64 = 64 * 1024;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--port", &common::dead_port().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("swank-mcp starts");
    let pid = child.id();
    let rss_kib = move || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("VmRSS: 0 kB");
        line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    let written = Arc::new(AtomicUsize::new(0));
    let writer = std::thread::spawn({
        let mut stdin = BufWriter::new(child.stdin.take().unwrap());
        let written = written.clone();
        // Ends by closing stdin, after which the server answers what it has read and exits.
        move || {
            for id in 1..=PINGS {
                writeln!(stdin, r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#)
                    .expect("the server reads its stdin");
                written.store(id, Ordering::Relaxed);
            }
        }
    });
    let started = Instant::now();
    let mut peak = 0;
    let mut progress = (0, Instant::now());
    let stalled_at = loop {
        peak = peak.max(rss_kib());
        let now = written.load(Ordering::Relaxed);
        if writer.is_finished() {
            break None;
        }
        if now != progress.0 {
            progress = (now, Instant::now());
        } else if progress.1.elapsed() > Duration::from_millis(500) {
            break Some(now);
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the writer neither finished nor stalled");
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut peak = 0;
        let mut received = 0usize;
        for line in BufReader::new(stdout).lines() {
            let reply: Value = serde_json::from_str(&line.unwrap()).unwrap();
            received += 1;
            assert_eq!(
                (reply["id"].clone(), reply["result"].clone()),
                (json!(received), json!({})),
                "responses in order"
            );
            if received % 10_000 == 0 {
                peak = peak.max(rss_kib());
            }
        }
        (received, peak)
    });
    while !reader.is_finished() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("not every response arrived within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (received, peak_while_reading) = reader.join().unwrap();
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
    let peak = peak.max(peak_while_reading);
    eprintln!(
        "peak VmRSS {peak} KiB; the writer stalled after {stalled_at:?} of {PINGS} pings; {:?} in all",
        started.elapsed()
    );
    assert_eq!(received, PINGS);
    assert!(stalled_at.is_some(), "the server read all {PINGS} pings while no response was read");
    assert!(peak < RSS_LIMIT_KIB, "peak VmRSS {peak} KiB");
}

#[test]
fn a_file_on_stdin_is_refused_with_what_to_do_instead() {
    let directory = tempfile::tempdir().unwrap();
    let requests = directory.path().join("requests.jsonl");
    std::fs::write(&requests, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--port", &common::dead_port().to_string()])
        .stdin(std::fs::File::open(&requests).unwrap())
        .output()
        .expect("swank-mcp runs");
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "nothing but protocol messages on stdout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "standard input is a file: swank-mcp speaks MCP with the client that starts it, over pipes. Configure it in \
             an MCP client (see the README), pipe requests in (`cat requests.jsonl | swank-mcp`)"
        ),
        "{stderr}"
    );
}

/// On a warm cache (the shared image has compiled swank by now), `--launch eval` prints the
/// value and at most one line on stderr: swank's warnings and banner go to the launch log. A
/// start that fails names that log.
#[tokio::test]
async fn launch_is_quiet_and_names_its_log_when_it_fails() {
    common::shared_image_port();
    let port = common::dead_port().to_string();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--launch", "--port", &port, "eval", "(+ 1 2)"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout, "=> 3\n");
    assert!(stderr.lines().count() <= 1, "stderr:\n{stderr}");
    assert!(!stderr.contains("EMACS-INSPECT") && !stderr.contains("Swank started"), "stderr:\n{stderr}");
    let log = swank_mcp::image::launch::log_path().expect("a cache directory");
    let logged = std::fs::read_to_string(&log).expect("the launch log");
    assert!(logged.contains("Swank started at port"), "{}", log.display());

    let dir = tempfile::tempdir().unwrap();
    let loader = dir.path().join("swank-loader.lisp");
    std::fs::write(&loader, "(error \"this loader is broken\")\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--launch", "--port", &port, "--swank-loader", loader.to_str().unwrap(), "eval", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1));
    assert!(text.contains(&format!("its messages are in {}", log.display())), "{text}");
    let logged = std::fs::read_to_string(&log).expect("the launch log");
    assert!(logged.contains("this loader is broken"), "{}", log.display());
}
