//! One declaration per tool gives its schema and its checks: every tool refuses an argument its
//! schema does not name (naming the nearest one) before it does anything, and a declared bound is
//! enforced. Against the real binary and a live image.

mod common;

use std::path::Path;

use serde_json::{json, Value};

use common::{is_error, text, McpClient};

async fn agent(root: &Path) -> McpClient {
    let port = common::shared_image_port().to_string();
    let mut client = McpClient::start(&["--port", &port, "--root", root.to_str().unwrap()]).await;
    client.initialize().await;
    client
}

/// The printed value of `code`, evaluated through `client`.
async fn value(client: &mut McpClient, code: &str) -> String {
    let reply = client.call_tool("evaluate-lisp", json!({ "code": code })).await;
    assert!(!is_error(&reply), "{code}: {reply}");
    common::without_handle(text(&reply)).to_string()
}

/// `arguments` with `name` misspelled as `typo`: refused, naming `name`, and nothing done.
async fn refused(client: &mut McpClient, tool: &str, arguments: Value, typo: &str, name: &str) {
    let reply = client.call_tool(tool, arguments.clone()).await;
    assert!(is_error(&reply), "{tool} {arguments}: {reply}");
    let said = text(&reply);
    assert!(
        said.starts_with(&format!("Unknown argument `{typo}`: did you mean `{name}`? {tool} takes ")),
        "{tool} {arguments}: {said}"
    );
    assert!(said.ends_with("; the call was not run."), "{said}");
}

#[tokio::test]
async fn every_tool_refuses_an_argument_its_schema_does_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut client = agent(dir.path()).await;
    let tools = client.request("tools/list", json!({})).await;
    let tools = tools["result"]["tools"].as_array().unwrap().clone();
    assert_eq!(tools.len(), 22);
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        let schema = &tool["inputSchema"];
        let properties = schema["properties"].as_object().unwrap();
        let Some(first) = properties.keys().next() else {
            let reply = client.call_tool(name, json!({"verbose": true})).await;
            assert_eq!(
                text(&reply),
                format!("Unknown argument `verbose`. {name} takes no arguments; the call was not run.")
            );
            continue;
        };
        // The first argument with a letter doubled, as a hurried typist would.
        let typo = format!("{first}{}", first.chars().last().unwrap());
        refused(&mut client, name, json!({ typo.clone(): 1 }), &typo, first).await;
    }
}

#[tokio::test]
async fn a_misspelled_argument_to_a_writing_tool_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("probe.lisp");
    let source = "(defun cl-user::arguments-probe-loaded () 1)\n";
    std::fs::write(&file, source).unwrap();
    let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
    let path = file.to_str().unwrap();
    let mut client = agent(dir.path()).await;

    // edit-lisp-form with `dryrun` for `dry_run` used to write the file.
    let edit = json!({"file_path": path, "form_type": "defun", "form_name": "cl-user::arguments-probe-loaded",
                      "operation": "replace", "content": "(defun cl-user::arguments-probe-loaded () 2)",
                      "load": true, "dryrun": true});
    refused(&mut client, "edit-lisp-form", edit, "dryrun", "dry_run").await;
    let form = json!({"file_path": path, "form_type": "defun", "form_name": "cl-user::arguments-probe-loaded",
                      "indx": 1});
    refused(&mut client, "load-form", form, "indx", "index").await;
    refused(&mut client, "load-file", json!({"file_path": path, "large_files": true}), "large_files", "large_file")
        .await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), source, "the file is untouched");
    assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), modified);
    assert_eq!(value(&mut client, "(fboundp 'cl-user::arguments-probe-loaded)").await, "=> NIL", "nothing was loaded");

    let evaluation = json!({"code": "(defparameter cl-user::*arguments-probe* 1)", "pakage": "CL-USER"});
    refused(&mut client, "evaluate-lisp", evaluation, "pakage", "package").await;
    let profiled = json!({"code": "(defparameter cl-user::*arguments-probe* 2)", "mod": "time"});
    refused(&mut client, "profile", profiled, "mod", "mode").await;
    let inspected = json!({"code": "(defparameter cl-user::*arguments-probe* 3)", "ofset": 0});
    refused(&mut client, "inspect", inspected, "ofset", "offset").await;
    assert_eq!(value(&mut client, "(boundp 'cl-user::*arguments-probe*)").await, "=> NIL", "no code ran");

    value(&mut client, "(defun cl-user::arguments-probe-traced () 1)").await;
    let traced = json!({"functions": ["cl-user::arguments-probe-traced"], "untrace": false, "Package": "CL-USER"});
    refused(&mut client, "trace", traced, "Package", "package").await;
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(cl-user::arguments-probe-traced)"})).await;
    assert_eq!(text(&reply), "=> 1", "nothing is traced");

    let listing = client.call_tool("undo", json!({})).await;
    refused(&mut client, "undo", json!({"since": 1, "forse": true}), "forse", "force").await;
    assert_eq!(text(&client.call_tool("undo", json!({})).await), text(&listing), "nothing was undone");
}

#[tokio::test]
async fn a_declared_minimum_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let mut client = agent(dir.path()).await;
    let reply = client
        .call_tool("evaluate-lisp", json!({"code": "(defparameter cl-user::*minimum-probe* 1)", "timeout_ms": 0}))
        .await;
    assert_eq!(text(&reply), "Argument `timeout_ms` must be an integer from 1 to 86400000, got number 0.");
    assert_eq!(value(&mut client, "(boundp 'cl-user::*minimum-probe*)").await, "=> NIL");
    let reply = client.call_tool("find-definition", json!({"symbol": "car", "limit": 2001})).await;
    assert_eq!(text(&reply), "Argument `limit` must be an integer from 1 to 2000, got number 2001.");
    let reply = client.call_tool("threads", json!({"action": "interrupt", "thread": -1})).await;
    assert!(text(&reply).starts_with("Argument `thread` must be an integer of 0 or more or a name"), "{reply}");
    let reply = client.call_tool("xref", json!({"symbol": "car", "kind": "callers"})).await;
    assert_eq!(
        text(&reply),
        "Unknown xref kind \"callers\": use calls, callees, references, binds, sets, macroexpands, specializes."
    );
}
