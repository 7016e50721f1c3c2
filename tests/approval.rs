//! `--confirm` over raw MCP against the binary and a real image: what a pending approval does
//! when the call is cancelled, when nobody answers in time, and when the client goes away; and
//! that an edit's approval shows its diff. (tests/python/sdk_approval.py has a real client
//! accepting and declining.)

mod common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{is_error, text, McpClient};

async fn client(extra: &[&str]) -> McpClient {
    let port = common::shared_image_port().to_string();
    let mut args = vec!["--port", port.as_str()];
    args.extend_from_slice(extra);
    let mut client = McpClient::start(&args).await;
    let reply = client
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {"elicitation": {}}, "clientInfo": {"name": "approval-tests", "version": "0"}}),
        )
        .await;
    assert!(reply["result"].is_object(), "{reply}");
    client.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    client
}

async fn send_call(client: &mut McpClient, id: i64, tool: &str, arguments: Value) {
    client.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})).await;
}

/// The server's `elicitation/create` request.
async fn elicitation(client: &mut McpClient) -> Value {
    let request = client.receive().await;
    assert_eq!(request["method"], "elicitation/create", "{request}");
    request
}

async fn eval(client: &mut McpClient, code: &str) -> String {
    let reply = client.call_tool("evaluate-lisp", json!({"code": code})).await;
    text(&reply).to_string()
}

#[tokio::test]
async fn a_cancelled_call_withdraws_its_approval_request_and_runs_nothing() {
    let mut client = client(&["--confirm", "evaluate-lisp"]).await;
    send_call(&mut client, 100, "evaluate-lisp", json!({"code": "(defparameter *cancelled-approval* t)"})).await;
    let asked = elicitation(&mut client).await;
    assert!(asked["params"]["message"].as_str().unwrap().contains("(defparameter *cancelled-approval* t)"), "{asked}");
    client.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 100}})).await;
    let withdrawn = client.receive().await;
    assert_eq!(withdrawn["method"], "notifications/cancelled", "{withdrawn}");
    assert_eq!(withdrawn["params"]["requestId"], asked["id"], "{withdrawn}");
    // An answer that comes after all is dropped, and the cancelled call gets no response.
    client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}})).await;
    let reply = client.request("ping", json!({})).await;
    assert_eq!(reply["result"], json!({}), "{reply}");
    let mut other = client_without_confirm().await;
    assert_eq!(eval(&mut other, "(boundp '*cancelled-approval*)").await, "=> NIL");
}

async fn client_without_confirm() -> McpClient {
    let mut client = McpClient::for_port(common::shared_image_port()).await;
    client.initialize().await;
    client
}

#[tokio::test]
async fn an_unanswered_approval_is_refused_at_the_time_limit() {
    let mut client = client(&["--confirm", "mutating", "--confirm-timeout", "1s"]).await;
    let started = Instant::now();
    send_call(&mut client, 7, "evaluate-lisp", json!({"code": "(defparameter *timed-out-approval* t)"})).await;
    let asked = elicitation(&mut client).await;
    // The withdrawn request is cancelled at the client, then the call is answered.
    let withdrawn = client.receive().await;
    assert_eq!(withdrawn["params"]["requestId"], asked["id"], "{withdrawn}");
    let reply = client.receive().await;
    assert_eq!(reply["id"], 7, "{reply}");
    assert!(is_error(&reply), "{reply}");
    assert!(text(&reply).contains("did not answer the approval request within 1 s (--confirm-timeout)"), "{reply}");
    assert!(started.elapsed() >= Duration::from_secs(1) && started.elapsed() < Duration::from_secs(10));
    // Read-only tools are not in `mutating`.
    let reply = client.call_tool("describe-symbol", json!({"symbol": "car"})).await;
    assert!(!is_error(&reply), "{reply}");
}

#[tokio::test]
async fn the_server_exits_promptly_when_input_ends_during_an_approval() {
    let mut client = client(&["--confirm", "evaluate-lisp"]).await;
    send_call(&mut client, 1, "evaluate-lisp", json!({"code": "(+ 1 2)"})).await;
    elicitation(&mut client).await;
    let started = Instant::now();
    client.close_stdin();
    let status = tokio::time::timeout(Duration::from_secs(10), client.child.wait()).await.expect("exits").unwrap();
    assert!(status.success(), "{status}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[tokio::test]
async fn an_edit_is_shown_as_its_diff_and_a_declined_one_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("area.lisp");
    std::fs::write(&file, "(defun area (r)\n  (* r r))\n").unwrap();
    let root = dir.path().to_str().unwrap();
    let mut client = client(&["--confirm", "edit-lisp-form", "--root", root]).await;
    let edit = json!({"file_path": file.to_str().unwrap(), "operation": "replace", "form_type": "defun", "form_name": "area",
                      "content": "(defun area (r)\n  (* pi r r))"});
    send_call(&mut client, 3, "edit-lisp-form", edit).await;
    let asked = elicitation(&mut client).await;
    let message = asked["params"]["message"].as_str().unwrap();
    assert!(message.contains("-  (* r r))") && message.contains("+  (* pi r r))"), "{message}");
    client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "decline"}})).await;
    let reply = client.receive().await;
    assert!(is_error(&reply) && text(&reply).contains("declined by the user"), "{reply}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "(defun area (r)\n  (* r r))\n");
}

#[tokio::test]
async fn an_unknown_confirm_name_stops_the_server_with_the_list() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--confirm", "evaluate-lips"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("--confirm names \"evaluate-lips\"") && said.contains("evaluate-lisp"), "{said}");
}

/// How the image's activity record (which the user's Emacs shows) has the call whose input
/// contains `marker`: `state|client|text`, once the call's end has been noted.
async fn recorded(marker: &str) -> String {
    let options = swank_mcp::swank::ConnectOptions {
        connect_timeout: Duration::from_secs(5),
        secret: None,
        protocol: swank_mcp::swank::Protocol::Auto,
    };
    let endpoint = swank_mcp::swank::Endpoint { host: "127.0.0.1".into(), port: common::shared_image_port() };
    let user = swank_mcp::swank::Connection::connect(endpoint, &options).await.unwrap();
    let code = format!(
        "(let ((r (find-if (lambda (p) (search {marker:?} (getf p :input)))
                           (let ((since (and (find-package \"MCP-AGENT-HELPER\")
                                             (find-symbol \"ACTIVITY-SINCE\" \"MCP-AGENT-HELPER\"))))
                             (and since (second (funcall since 0)))))))
           (if (and r (getf r :text))
               (format nil \"~(~A~)|~A|~A\" (getf r :state) (getf r :client) (getf r :text))
               \"\"))"
    );
    let form = swank_mcp::swank::Form::call(
        "cl",
        "eval",
        [swank_mcp::swank::Form::call("cl", "read-from-string", [swank_mcp::swank::Form::string(code)])],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = user.rex(form.clone(), "COMMON-LISP-USER", swank_mcp::swank::Thread::New).await.unwrap();
        let found = found.as_str().unwrap_or_default().to_string();
        if !found.is_empty() || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_images_record_has_declined_timed_out_and_done_calls_with_the_text_the_agent_received() {
    let mut client = client(&["--confirm", "evaluate-lisp", "--confirm-timeout", "1s"]).await;
    send_call(&mut client, 2, "evaluate-lisp", json!({"code": "(list :record-declined-marker)"})).await;
    let asked = elicitation(&mut client).await;
    client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "decline"}})).await;
    let declined = client.receive().await;
    assert_eq!(recorded("record-declined-marker").await, format!("declined|approval-tests|{}", text(&declined)));

    send_call(&mut client, 3, "evaluate-lisp", json!({"code": "(list :record-timed-out-marker)"})).await;
    elicitation(&mut client).await;
    let withdrawn = client.receive().await;
    assert_eq!(withdrawn["method"], "notifications/cancelled", "{withdrawn}");
    let timed_out = client.receive().await;
    assert_eq!(recorded("record-timed-out-marker").await, format!("timed-out|approval-tests|{}", text(&timed_out)));

    send_call(&mut client, 4, "evaluate-lisp", json!({"code": "(progn (princ :record-output) :record-done-marker)"}))
        .await;
    let asked = elicitation(&mut client).await;
    client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}})).await;
    let done = client.receive().await;
    assert!(text(&done).contains("RECORD-OUTPUT"), "{done}");
    assert_eq!(recorded("record-done-marker").await, format!("done|approval-tests|{}", text(&done)));
}
