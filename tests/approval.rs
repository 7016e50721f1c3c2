//! `--confirm` over raw MCP against the binary and a real image: what a pending approval does
//! when the call is cancelled, when nobody answers in time, and when the client goes away; and
//! that an edit's approval shows its diff. Approvals in Emacs are answered here by a swank
//! connection that subscribes as `swank-mcp-approval-mode` does, with the form the Emacs package
//! itself prints. (tests/python/sdk_approval.py has a real client accepting and declining;
//! elisp-compat/swank-mcp-tests.el answers from a real SLIME and SLY.) And that the image's record,
//! which Emacs shows, has each call with its state and the text its caller received.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{is_error, text, McpClient};

async fn client(extra: &[&str]) -> McpClient {
    client_with(extra, json!({"elicitation": {}})).await
}

/// A client that cannot elicit: its approvals are asked in Emacs.
async fn client_with(extra: &[&str], capabilities: Value) -> McpClient {
    let port = common::shared_image_port().to_string();
    let mut args = vec!["--port", port.as_str()];
    args.extend_from_slice(extra);
    let mut client = McpClient::start(&args).await;
    let reply = client
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": capabilities, "clientInfo": {"name": "approval-tests", "version": "0"}}),
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

/// A client that declared only URL-mode elicitation is never sent a form (client/elicitation,
/// "Capabilities"), in either era: a call under `--confirm` is refused saying why, and the next
/// line the client reads is that reply, not an `elicitation/create` request.
#[tokio::test]
async fn a_client_that_elicits_only_urls_is_not_sent_a_form() {
    let mut client = client_with(&["--confirm", "evaluate-lisp"], json!({"elicitation": {"url": {}}})).await;
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(+ 1 2)"})).await;
    assert!(is_error(&reply) && text(&reply).contains("only URL-mode elicitation"), "{reply}");
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"url": {}}},
    });
    let reply = client
        .request("tools/call", json!({"name": "evaluate-lisp", "arguments": {"code": "(+ 1 2)"}, "_meta": meta}))
        .await;
    assert!(is_error(&reply) && text(&reply).contains("only URL-mode elicitation"), "{reply}");
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

/// The prompt says what approving does, not that it is a dry run (issue 38.4): the edit is
/// written, and with `load` compiled into the image.
#[tokio::test]
async fn an_edits_prompt_says_approving_writes_it_and_with_load_loads_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("said.lisp");
    std::fs::write(&file, "(defun said (r)\n  (* r r))\n").unwrap();
    let root = dir.path().to_str().unwrap();
    let mut client = client(&["--confirm", "edit-lisp-form", "--root", root]).await;
    for (id, load, approving) in [
        (
            8,
            true,
            "Approving writes this edit to the file and loads it into the image (load: true).\n\nWould replace \
             `defun said` (lines 1-2) in said.lisp with 1 form, at lines 1-2.",
        ),
        (
            9,
            false,
            "Approving writes this edit to the file; nothing is loaded into the image (load: false).\n\nWould \
             replace `defun said`",
        ),
    ] {
        let edit = json!({"file_path": file.to_str().unwrap(), "operation": "replace", "form_type": "defun",
                          "form_name": "said", "content": "(defun said (r)\n  (* 3 r r))", "load": load});
        send_call(&mut client, id, "edit-lisp-form", edit).await;
        let asked = elicitation(&mut client).await;
        let message = asked["params"]["message"].as_str().unwrap();
        assert!(message.contains(approving) && !message.contains("Dry run"), "{message}");
        client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "decline"}})).await;
        assert_eq!(client.receive().await["id"], id);
    }
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

/// The user's Emacs in approval mode, over a swank connection of its own to the shared image.
struct Emacs {
    wire: common::SwankWire,
    next_request: u32,
    /// Messages read while waiting for a reply, kept for `told`.
    unread: std::collections::VecDeque<String>,
}

impl Emacs {
    /// Connects and subscribes channel 1 to the image's approvals, with the form
    /// `swank-mcp-approval-mode` sends (printed by the package in a batch Emacs); `None`, and the
    /// test is skipped, without Emacs.
    async fn in_approval_mode() -> Option<Self> {
        Self::subscribed(":approvals").await
    }

    /// Connects and subscribes channel 1 to `topic` (`:approvals` or `:activity`) with the
    /// package's form; `None` without Emacs.
    async fn subscribed(topic: &str) -> Option<Self> {
        if !common::have(common::Needed::Emacs) {
            return None;
        }
        let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("elisp-compat");
        let printed = std::process::Command::new("emacs")
            .args(["--batch", "-Q", "-L", package.to_str().unwrap(), "-l", "swank-mcp", "--eval"])
            .arg(format!(
                "(let ((print-escape-newlines t)) (princ (prin1-to-string (swank-mcp--subscribe-form swank-mcp--slime 1 \
                 {topic}))))"
            ))
            .output()
            .expect("emacs (emacs-nox) prints the subscription form");
        assert!(printed.status.success(), "{}", String::from_utf8_lossy(&printed.stderr));
        let form = String::from_utf8(printed.stdout).unwrap();
        let wire = common::SwankWire::connect(common::shared_image_port()).await;
        let mut emacs = Self { wire, next_request: 1, unread: Default::default() };
        assert_eq!(emacs.eval(&form).await, "(:ok t)");
        Some(emacs)
    }

    async fn send(&mut self, message: &str) {
        assert!(message.is_ascii(), "{message}");
        self.wire.send(message).await;
    }

    async fn receive(&mut self) -> String {
        self.wire.receive().await
    }

    /// Evaluates `form` as SLIME's `slime-eval` does; returns the `(:ok ...)` or `(:abort ...)`.
    async fn eval(&mut self, form: &str) -> String {
        let id = self.next_request;
        self.next_request += 1;
        self.send(&format!("(:emacs-rex {form} \"COMMON-LISP-USER\" t {id})")).await;
        let ending = format!(" {id})");
        loop {
            let message = self.receive().await;
            match message.strip_prefix("(:return ").and_then(|m| m.strip_suffix(&ending)) {
                Some(value) => return value.to_string(),
                None => self.unread.push_back(message),
            }
        }
    }

    /// The next message the image sends down channel 1 that starts with `kind` and holds
    /// `marker`. Every Emacs in approval mode is told of every approval, those of the tests
    /// running beside this one too.
    async fn told(&mut self, kind: &str, marker: &str) -> String {
        let prefix = format!("(:channel-send 1 ({kind} ");
        let within = Duration::from_secs(30);
        tokio::time::timeout(within, async {
            loop {
                let message = match self.unread.pop_front() {
                    Some(message) => message,
                    None => self.receive().await,
                };
                if message.starts_with(&prefix) && message.contains(marker) {
                    return message;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the image did not tell {kind} with {marker} within {within:?}"))
    }
}

/// The number after `:id ` in a message of the image.
fn approval_id(message: &str) -> u64 {
    let rest = &message[message.find(":id ").expect(message) + 4..];
    rest[..rest.find(' ').unwrap()].parse().unwrap()
}

#[tokio::test]
async fn an_approval_in_emacs_answered_after_two_seconds_runs() {
    let Some(mut emacs) = Emacs::in_approval_mode().await else { return };
    let mut client = client_with(&["--confirm", "evaluate-lisp", "--confirm-timeout", "30s"], json!({})).await;
    send_call(&mut client, 5, "evaluate-lisp", json!({"code": "(defparameter *answered-after-two-seconds* :ran)"}))
        .await;
    let asked = emacs.told(":approval", "*answered-after-two-seconds*").await;
    assert!(asked.contains(":client \"approval-tests\"") && asked.contains("*answered-after-two-seconds*"), "{asked}");
    // Past the one second after which every approval used to fail.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = approval_id(&asked);
    assert_eq!(emacs.eval(&format!("(mcp-agent-helper:answer-approval {id} :yes)")).await, "(:ok :taken)");
    let reply = client.receive().await;
    assert_eq!(reply["id"], 5, "{reply}");
    assert!(!is_error(&reply) && text(&reply) == "=> *ANSWERED-AFTER-TWO-SECONDS*", "{reply}");
    let ended = format!("(:channel-send 1 (:approval-ended :id {id} :verdict :yes))");
    assert_eq!(emacs.told(":approval-ended", &format!(":id {id} ")).await, ended);
}

#[tokio::test]
async fn an_answer_in_emacs_after_the_time_limit_is_told_the_request_ended() {
    let Some(mut emacs) = Emacs::in_approval_mode().await else { return };
    let mut client = client_with(&["--confirm", "evaluate-lisp", "--confirm-timeout", "2s"], json!({})).await;
    let started = Instant::now();
    send_call(&mut client, 6, "evaluate-lisp", json!({"code": "(defparameter *answered-too-late* :ran)"})).await;
    let id = approval_id(&emacs.told(":approval", "*answered-too-late*").await);
    let ended = format!("(:channel-send 1 (:approval-ended :id {id} :verdict :timeout))");
    assert_eq!(emacs.told(":approval-ended", &format!(":id {id} ")).await, ended);
    let reply = client.receive().await;
    assert!(is_error(&reply), "{reply}");
    assert!(text(&reply).contains("did not answer the approval request within 2 s (--confirm-timeout)"), "{reply}");
    assert!(started.elapsed() >= Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(emacs.eval(&format!("(mcp-agent-helper:answer-approval {id} :yes)")).await, "(:ok :ended)");
    let mut other = client_without_confirm().await;
    assert_eq!(eval(&mut other, "(boundp '*answered-too-late*)").await, "=> NIL");
}

/// An Emacs that subscribes while a call waits (approval mode turned on again, a reconnection) is
/// sent that call at once, and its answer is taken.
#[tokio::test]
async fn an_emacs_that_subscribes_while_a_call_waits_is_sent_it() {
    let Some(mut first) = Emacs::in_approval_mode().await else { return };
    let mut client = client_with(&["--confirm", "evaluate-lisp", "--confirm-timeout", "30s"], json!({})).await;
    send_call(&mut client, 7, "evaluate-lisp", json!({"code": "(defparameter *sent-to-a-later-emacs* :ran)"})).await;
    let id = approval_id(&first.told(":approval", "*sent-to-a-later-emacs*").await);
    let Some(mut later) = Emacs::in_approval_mode().await else { return };
    assert_eq!(approval_id(&later.told(":approval", "*sent-to-a-later-emacs*").await), id);
    assert_eq!(later.eval(&format!("(mcp-agent-helper:answer-approval {id} :no)")).await, "(:ok :taken)");
    let reply = client.receive().await;
    assert!(is_error(&reply) && text(&reply).contains("declined by the user"), "{reply}");
}

#[tokio::test]
async fn a_load_is_shown_as_the_code_it_compiles_not_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shapes.lisp");
    std::fs::write(&file, "(in-package :cl-user)\n\n(defun shown-area (r)\n  (* r r))\n\n(defun shown-other () 1)\n")
        .unwrap();
    let root = dir.path().to_str().unwrap();
    let mut client = client(&["--confirm", "load-form,load-file", "--root", root]).await;
    let path = file.to_str().unwrap();
    send_call(&mut client, 8, "load-form", json!({"file_path": path, "form_type": "defun", "form_name": "shown-area"}))
        .await;
    let asked = elicitation(&mut client).await;
    let message = asked["params"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "Compiles defun shown-area from shapes.lisp:3-4 into the image:\n(defun shown-area (r)\n  (* r r))\n"
        ),
        "{message}"
    );
    assert!(!message.contains("shown-other") && !message.contains("form_name"), "{message}");
    client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "decline"}})).await;
    assert!(is_error(&client.receive().await));
    send_call(&mut client, 9, "load-file", json!({"file_path": path})).await;
    let asked = elicitation(&mut client).await;
    let message = asked["params"]["message"].as_str().unwrap();
    assert!(
        message.contains("Compiles and loads the file shapes.lisp:\n(in-package :cl-user)\n")
            && message.contains("(defun shown-other () 1)"),
        "{message}"
    );
    client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "decline"}})).await;
    assert!(is_error(&client.receive().await));
}

#[tokio::test]
async fn a_test_run_that_would_reload_changed_files_says_so_and_names_the_variables_they_set() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("approval-reload.asd"),
        "(asdf:defsystem \"approval-reload\" :components ((:file \"approval-reload\")))\n",
    )
    .unwrap();
    let source = dir.path().join("approval-reload.lisp");
    std::fs::write(
        &source,
        "(defpackage :approval-reload (:use :cl))\n(in-package :approval-reload)\n(defparameter *rate* 20)\n\
         (defun rate () *rate*)\n",
    )
    .unwrap();
    let mut client = client(&["--confirm", "run-tests"]).await;
    let asd = dir.path().join("approval-reload.asd");
    let loaded = eval(
        &mut client,
        &format!(
            "(progn (require :asdf) (asdf:load-asd {:?}) (asdf:load-system \"approval-reload\") \
             (setf (symbol-value (find-symbol \"*RATE*\" :approval-reload)) 25))",
            asd.display().to_string()
        ),
    )
    .await;
    assert!(loaded.contains("\n=> 25"), "{loaded}");
    // Dated past the load's compile, which counts whole seconds.
    std::fs::write(&source, std::fs::read_to_string(&source).unwrap().replace("*rate*)\n", "(* 1 *rate*))\n")).unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(2);
    std::fs::File::options().write(true).open(&source).and_then(|file| file.set_modified(later)).unwrap();
    send_call(&mut client, 11, "run-tests", json!({"system": "approval-reload"})).await;
    let asked = elicitation(&mut client).await;
    let message = asked["params"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "Before its tests, ASDF will load again 1 file changed since loaded: approval-reload: \
             approval-reload.lisp.\nTheir DEFPARAMETERs will set these variables again: APPROVAL-RELOAD::*RATE* (now \
             25) (undo can put the values back)."
        ),
        "{message}"
    );
    client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "decline"}})).await;
    assert!(is_error(&client.receive().await));
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
        "(let* ((r (find-if (lambda (p) (search {marker:?} (getf p :input)))
                            (let ((records (and (find-package \"MCP-AGENT-HELPER\")
                                                (find-symbol \"ACTIVITY-RECORDS\" \"MCP-AGENT-HELPER\"))))
                              (and records (funcall records)))))
                (text (and r (getf (funcall (find-symbol \"ACTIVITY-REPLY\" \"MCP-AGENT-HELPER\") (getf r :id))
                                   :text))))
           (if text
               (format nil \"~(~A~)|~A|~A\" (getf r :state) (getf r :client) text)
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
        // The reply's text and the call's last state come in notes of their own: wait for both.
        let settled = !found.is_empty() && !found.starts_with("waiting|") && !found.starts_with("running|");
        if settled || Instant::now() > deadline {
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

#[tokio::test]
async fn an_activity_buffer_is_told_each_state_of_a_call_and_asks_for_the_text_the_agent_received() {
    let Some(mut emacs) = Emacs::subscribed(":activity").await else { return };
    let mut client = client_with(&["--confirm", "evaluate-lisp", "--confirm-timeout", "30s"], json!({})).await;
    let Some(mut approver) = Emacs::in_approval_mode().await else { return };
    // It runs long enough to be seen running: the notes of a call that starts and ends within
    // one batch of the activity feed (5 ms) come as one, its end.
    let code = "(progn (sleep 0.3) (list :pushed-record-marker))";
    send_call(&mut client, 7, "evaluate-lisp", json!({ "code": code })).await;
    let waiting = emacs.told(":call", "pushed-record-marker").await;
    assert!(waiting.contains(":state :waiting") && waiting.contains(":client \"approval-tests\""), "{waiting}");
    let id = approval_id(&approver.told(":approval", "pushed-record-marker").await);
    assert_eq!(approver.eval(&format!("(mcp-agent-helper:answer-approval {id} :yes)")).await, "(:ok :taken)");
    let running = emacs.told(":call", "pushed-record-marker").await;
    assert!(running.contains(":state :running") && running.contains(":outcome nil"), "{running}");
    let reply = client.receive().await;
    let done = emacs.told(":call", "pushed-record-marker").await;
    // The first line of the reply comes with the call's end; the whole text, when asked for.
    assert!(done.contains(":state :done") && done.contains(":outcome \"=> (:PUSHED-RECORD-MARKER) @"), "{done}");
    let id = &done[done.find(":id ").unwrap() + 4..];
    let id = &id[..id.find(' ').unwrap()];
    let asked = emacs.eval(&format!("(mcp-agent-helper::activity-reply {id})")).await;
    assert_eq!(asked, format!("(:ok (:text {:?}))", text(&reply)));
}

#[tokio::test]
async fn a_shell_eval_is_in_the_images_record_too() {
    // An agent with a shell can run `swank-mcp eval`; the human's record shows it as well.
    let port = common::shared_image_port().to_string();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--port", &port, "eval", "(list :shell-record-marker)"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "=> (:SHELL-RECORD-MARKER)\n");
    assert_eq!(recorded("shell-record-marker").await, "done|swank-mcp eval|=> (:SHELL-RECORD-MARKER)");
}

#[tokio::test]
async fn an_invalid_call_is_refused_before_anyone_is_asked() {
    let mut client = client(&["--confirm", "evaluate-lisp"]).await;
    for (arguments, expected) in [
        (json!({}), "Missing required argument `code` (a string)."),
        (json!({"code": "(defparameter *asked-invalid* t)", "timeout": 5}), "did you mean `timeout_ms`?"),
    ] {
        // The next message is the call's answer, not an elicitation/create.
        let reply = client.call_tool("evaluate-lisp", arguments.clone()).await;
        assert!(is_error(&reply) && text(&reply).contains(expected), "{arguments}: {reply}");
    }
    let mut other = client_without_confirm().await;
    assert_eq!(eval(&mut other, "(boundp '*asked-invalid*)").await, "=> NIL");
}

/// Sends `tool` with `arguments` for approval, rewrites `file` with `changed` while the human
/// looks at the preview, then accepts: the call must refuse, saying so.
async fn approve_after_a_change(
    client: &mut McpClient,
    id: i64,
    (tool, arguments): (&str, Value),
    (file, changed): (&Path, &str),
) -> String {
    send_call(client, id, tool, arguments).await;
    let asked = elicitation(client).await;
    std::fs::write(file, changed).unwrap();
    client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}})).await;
    let reply = client.receive().await;
    assert_eq!(reply["id"], id, "{reply}");
    assert!(is_error(&reply), "{reply}");
    text(&reply).to_string()
}

#[tokio::test]
async fn a_file_changed_between_the_preview_and_the_approval_is_neither_written_nor_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bound.lisp");
    let path = file.to_str().unwrap();
    let root = dir.path().to_str().unwrap();
    let mut client = client(&["--confirm", "edit-lisp-form,load-form,load-file", "--root", root]).await;
    let mut other = client_without_confirm().await;

    std::fs::write(&file, "(defun cl-user::bound-edited () 1)\n").unwrap();
    let edit = json!({"file_path": path, "operation": "replace", "form_type": "defun", "form_name": "cl-user::bound-edited",
                      "content": "(defun cl-user::bound-edited () 2)", "load": true});
    let changed = "(defun cl-user::bound-edited () 3)\n";
    let said = approve_after_a_change(&mut client, 20, ("edit-lisp-form", edit), (&file, changed)).await;
    assert!(
        said.starts_with(
            "edit-lisp-form was not run: `bound.lisp` changed between the preview the user was shown and their answer"
        ),
        "{said}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), changed, "the edit was not written");
    assert_eq!(eval(&mut other, "(fboundp 'cl-user::bound-edited)").await, "=> NIL", "nor loaded");

    std::fs::write(&file, "(defun cl-user::bound-form () 1)\n").unwrap();
    let form = json!({"file_path": path, "form_type": "defun", "form_name": "cl-user::bound-form"});
    let said =
        approve_after_a_change(&mut client, 21, ("load-form", form), (&file, "(defun cl-user::bound-form () 2)\n"))
            .await;
    assert!(said.starts_with("load-form was not run: bound.lisp changed between the preview"), "{said}");
    assert_eq!(eval(&mut other, "(fboundp 'cl-user::bound-form)").await, "=> NIL");

    std::fs::write(&file, "(defun cl-user::bound-file () 1)\n").unwrap();
    let load = json!({"file_path": path});
    let said = approve_after_a_change(
        &mut client,
        22,
        ("load-file", load.clone()),
        (&file, "(defun cl-user::bound-file () 2)\n"),
    )
    .await;
    assert!(said.starts_with("load-file was not run: bound.lisp changed between the preview"), "{said}");
    assert_eq!(eval(&mut other, "(fboundp 'cl-user::bound-file)").await, "=> NIL");

    // Approved as shown, it runs.
    send_call(&mut client, 23, "load-file", load).await;
    let asked = elicitation(&mut client).await;
    client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}})).await;
    let reply = client.receive().await;
    assert!(!is_error(&reply), "{reply}");
    assert_eq!(eval(&mut other, "(cl-user::bound-file)").await, "=> 2");
}

/// A file rewritten in place (the same inode) just after the human approved loading it (issue
/// 36.2): the image compiles the bytes that were checked against what the human was shown, so it
/// loads the approved definition, or the call is refused, but never loads the new text. The
/// rewrite comes at delays that span the server's read and check of the file and the image's
/// compiling it, and the file is large enough for those to take a while.
#[tokio::test]
async fn a_file_rewritten_in_place_after_the_approval_never_loads_the_new_text() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rewritten.lisp");
    let path = file.to_str().unwrap();
    let root = dir.path().to_str().unwrap();
    let mut client = client(&["--confirm", "load-file", "--root", root]).await;
    let mut other = client_without_confirm().await;
    let padding = format!("#|{}|#\n", "x".repeat(2 << 20));
    let approved = format!("{padding}(defun cl-user::rewritten-in-place () :approved)\n");
    let unapproved = format!("{padding}(defun cl-user::rewritten-in-place () :unapproved)\n");
    let mut outcomes = Vec::new();
    for attempt in 0..20 {
        std::fs::write(&file, &approved).unwrap();
        eval(&mut other, "(fmakunbound 'cl-user::rewritten-in-place)").await;
        let id = 100 + attempt;
        send_call(&mut client, id, "load-file", json!({"file_path": path})).await;
        let asked = elicitation(&mut client).await;
        client.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}})).await;
        tokio::time::sleep(Duration::from_millis(attempt as u64 * 2)).await;
        let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap());
        let mut rewriting = std::fs::OpenOptions::new().write(true).truncate(true).open(&file).unwrap();
        rewriting.write_all(unapproved.as_bytes()).unwrap();
        drop(rewriting);
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap()), inode);
        let reply = client.receive().await;
        assert_eq!(reply["id"], id, "{reply}");
        let loaded =
            eval(&mut other, "(if (fboundp 'cl-user::rewritten-in-place) (cl-user::rewritten-in-place) :none)").await;
        let outcome = (is_error(&reply), loaded.as_str());
        assert!(
            matches!(outcome, (false, "=> :APPROVED") | (true, "=> :NONE")),
            "attempt {attempt}: {outcome:?}: {}",
            text(&reply)
        );
        if is_error(&reply) {
            // Found as the approval is checked, or as the load starts.
            let said = text(&reply);
            assert!(
                ["between the preview the user was shown and their answer", "after the user approved"]
                    .iter()
                    .any(|when| said.starts_with(&format!("load-file was not run: rewritten.lisp changed {when}"))),
                "{reply}"
            );
        }
        outcomes.push(is_error(&reply));
    }
    eval(&mut other, "(fmakunbound 'cl-user::rewritten-in-place)").await;
    eprintln!("refused after the rewrite: {outcomes:?}");
}

/// Runs `swank-mcp ARGS eval CODE`; its exit status and stdout.
async fn shell_eval(args: &[&str], code: &str) -> (bool, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(args)
        .args(["eval", code])
        .output()
        .await
        .unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned())
}

fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

#[tokio::test]
async fn a_shell_eval_under_confirm_is_approved_in_emacs_and_audited() {
    let Some(mut emacs) = Emacs::in_approval_mode().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let port = common::shared_image_port().to_string();
    let args = ["--port", &port, "--confirm", "mutating", "--audit-log", log.to_str().unwrap()];
    let shell = tokio::spawn({
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            shell_eval(&args, "(defparameter *shell-approved-marker* :ran)").await
        }
    });
    let asked = emacs.told(":approval", "*shell-approved-marker*").await;
    assert!(asked.contains(":client \"swank-mcp eval\""), "{asked}");
    let id = approval_id(&asked);
    assert_eq!(emacs.eval(&format!("(mcp-agent-helper:answer-approval {id} :yes)")).await, "(:ok :taken)");
    let (succeeded, printed) = shell.await.unwrap();
    assert!(succeeded, "{printed}");
    assert_eq!(printed, "=> *SHELL-APPROVED-MARKER*\n");
    let lines = audit_lines(&log);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        (&lines[0]["client"], &lines[0]["tool"], &lines[0]["outcome"], &lines[0]["summary"]),
        (&json!("swank-mcp eval"), &json!("evaluate-lisp"), &json!("ok"), &json!("=> *SHELL-APPROVED-MARKER*")),
    );
    assert_eq!(lines[0]["arguments"]["code"], "(defparameter *shell-approved-marker* :ran)");
}

#[tokio::test]
async fn a_shell_eval_under_confirm_that_nobody_can_approve_is_refused_and_audited() {
    // An image of its own: no Emacs in approval mode watches it.
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let port = image.port.to_string();
    let confirmed = ["--port", &port, "--confirm", "evaluate-lisp", "--audit-log", log.to_str().unwrap()];
    let (succeeded, printed) = shell_eval(&confirmed, "(defparameter *shell-refused-marker* :ran)").await;
    assert!(!succeeded, "{printed}");
    assert!(
        printed.starts_with("evaluate-lisp was not run: this swank-mcp runs with --confirm")
            && printed.contains("swank-mcp eval cannot ask for it")
            && printed.contains("swank-mcp-approval-mode"),
        "{printed}"
    );
    let lines = audit_lines(&log);
    assert_eq!((lines.len(), &lines[0]["outcome"]), (1, &json!("not_approved")), "{lines:?}");
    let (_, unbound) = shell_eval(&["--port", &port], "(boundp '*shell-refused-marker*)").await;
    assert_eq!(unbound, "=> NIL\n");
}

#[tokio::test]
async fn the_images_record_keeps_its_newest_calls_and_finds_only_those_by_id() {
    // A private image: the bound is lowered for one evaluation, and nobody else's calls may land
    // in the record meanwhile.
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    let code = r#"(let ((mcp-agent-helper::*activity-limit* 3))
  (mcp-agent-helper:note-activities
   (loop for i below 5
         collect (list :id (format nil "bounded-~D" i) :tool "evaluate-lisp" :state :done :input "x" :text "t")))
  (sb-thread:with-mutex (mcp-agent-helper::*activity-lock*)
    (list (mapcar #'mcp-agent-helper::record-id mcp-agent-helper::*activity*)
          (hash-table-count mcp-agent-helper::*activity-by-id*)
          (loop for i below 5
                collect (and (mcp-agent-helper::find-activity (format nil "bounded-~D" i)) t)))))"#;
    assert_eq!(
        common::without_handle(&common::eval_ok(&toolbox, code).await),
        r#"=> (("bounded-4" "bounded-3" "bounded-2") 3 (NIL NIL T T T))"#
    );
}

/// `--confirm mutating` stands for the tools that change something; a `threads` call that only
/// lists changes nothing and runs unasked (issue 49: it waited for approval), while one that acts
/// on a thread still asks, as does every call of a tool `--confirm` names.
#[tokio::test]
async fn a_threads_list_runs_unasked_under_confirm_mutating() {
    let mut mutating = client(&["--confirm", "mutating"]).await;
    let listed = mutating.call_tool("threads", json!({})).await;
    assert!(!is_error(&listed) && text(&listed).contains("main thread"), "{listed}");
    let listed = mutating.call_tool("threads", json!({"action": "list"})).await;
    assert!(!is_error(&listed), "{listed}");
    send_call(&mut mutating, 50, "threads", json!({"action": "backtrace", "thread": "main thread"})).await;
    elicitation(&mut mutating).await;
    let mut named = client(&["--confirm", "threads"]).await;
    send_call(&mut named, 51, "threads", json!({})).await;
    elicitation(&mut named).await;
}
