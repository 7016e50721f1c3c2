//! The undo journal against a real image: an agent (the binary, over MCP) redefines what the user
//! loaded from a file; after the server restarts, `undo` still lists it and puts the user's
//! definitions back, behaviour and source location both.

mod common;

use std::time::Duration;

use serde_json::{json, Value};

use swank_mcp::swank::{ConnectOptions, Connection, Endpoint, Form, Protocol, Sexp, Thread};

/// The user's own connection, as SLIME's: what it evaluates is no agent's call.
async fn user_connection(port: u16) -> Connection {
    let options = ConnectOptions { connect_timeout: Duration::from_secs(5), secret: None, protocol: Protocol::Auto };
    Connection::connect(Endpoint { host: "127.0.0.1".into(), port }, &options).await.unwrap()
}

async fn user_eval(connection: &Connection, code: &str) -> Sexp {
    let form = Form::call("cl", "eval", [Form::call("cl", "read-from-string", [Form::string(code)])]);
    connection.rex(form, "COMMON-LISP-USER", Thread::New).await.unwrap()
}

async fn agent(port: u16) -> common::McpClient {
    let mut client = common::McpClient::for_port(port).await;
    client.initialize().await;
    client
}

async fn call_ok(client: &mut common::McpClient, tool: &str, arguments: Value) -> (String, Value) {
    let reply = client.call_tool(tool, arguments.clone()).await;
    assert!(!common::is_error(&reply), "{tool} {arguments}: {reply}");
    (common::text(&reply).to_string(), reply["result"]["structuredContent"].clone())
}

#[tokio::test]
async fn undo_restores_the_users_definitions_after_the_server_restarts() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shapes.lisp");
    std::fs::write(
        &file,
        ";;; The user's file\n\n(defun undo-target (x)\n  (list :original x))\n\n(defmacro undo-macro (x)\n  `(list :original-macro ,x))\n\n(defun (setf undo-place) (value x)\n  (list :original-setf value x))\n",
    )
    .unwrap();
    let user = user_connection(image.port).await;
    user_eval(&user, &format!("(load (compile-file {:?}))", file.to_str().unwrap())).await;

    let mut first = agent(image.port).await;
    let (listing, _) = call_ok(&mut first, "undo", json!({})).await;
    assert!(listing.contains("The journal is empty"), "loading the user's file journals nothing: {listing}");
    call_ok(
        &mut first,
        "evaluate-lisp",
        json!({"code": "(defun undo-target (x) (list :agent x))
                       (defmacro undo-macro (x) `(list :agent-macro ,x))
                       (defun (setf undo-place) (value x) (list :agent-setf value x))
                       (defun undo-new-helper () :new)
                       (defgeneric undo-area (shape))
                       (defmethod undo-area ((shape integer)) shape)
                       (defclass undo-shape () ())"}),
    )
    .await;
    let (behaviour, _) =
        call_ok(&mut first, "evaluate-lisp", json!({"code": "(list (undo-target 1) (undo-macro 2))"})).await;
    assert!(behaviour.contains("(:AGENT 1) (:AGENT-MACRO 2)"), "{behaviour}");
    // The user's own redefinition, from their REPL, is theirs: not journaled.
    user_eval(&user, "(defun undo-users-own () :user)").await;
    user_eval(&user, "(defun undo-users-own () :user-again)").await;
    drop(first);

    let mut second = agent(image.port).await;
    let (listing, journal) = call_ok(&mut second, "undo", json!({})).await;
    let entries = journal["entries"].as_array().unwrap();
    let names: Vec<(&str, &str)> =
        entries.iter().map(|e| (e["kind"].as_str().unwrap(), e["name"].as_str().unwrap())).collect();
    assert_eq!(
        names,
        [
            ("function", "COMMON-LISP-USER::UNDO-TARGET"),
            ("macro", "COMMON-LISP-USER::UNDO-MACRO"),
            ("setf function", "(SETF COMMON-LISP-USER::UNDO-PLACE)"),
            ("function", "COMMON-LISP-USER::UNDO-NEW-HELPER"),
            ("method", "COMMON-LISP-USER::UNDO-AREA"),
            ("class", "COMMON-LISP-USER::UNDO-SHAPE"),
        ],
        "{listing}"
    );
    let file_name = file.to_str().unwrap();
    assert!(
        listing
            .contains(&format!("function COMMON-LISP-USER::UNDO-TARGET: replaced the definition from {file_name}:3:1")),
        "{listing}"
    );
    assert!(
        listing.contains(&format!("macro COMMON-LISP-USER::UNDO-MACRO: replaced the definition from {file_name}:6:1")),
        "{listing}"
    );
    assert!(listing.contains("UNDO-NEW-HELPER: new: was not defined before"), "{listing}");
    assert!(listing.contains("method COMMON-LISP-USER::UNDO-AREA ((INTEGER)): added: undo removes it"), "{listing}");
    assert!(!listing.contains("UNDO-USERS-OWN"), "{listing}");

    let first_number = entries[0]["number"].as_u64().unwrap();
    let (restored, _) = call_ok(&mut second, "undo", json!({"since": first_number})).await;
    assert!(
        restored.contains(&format!("function COMMON-LISP-USER::UNDO-TARGET: now defined at {file_name}:3:1")),
        "{restored}"
    );
    assert!(restored.contains("UNDO-NEW-HELPER: undefined again (it was new)"), "{restored}");
    assert!(restored.contains("method COMMON-LISP-USER::UNDO-AREA ((INTEGER)): removed (it was added)"), "{restored}");
    assert!(restored.contains("class COMMON-LISP-USER::UNDO-SHAPE: the class was new"), "{restored}");
    // The reply is the restoration only, not the journal again.
    assert!(!restored.contains("Journal ("), "{restored}");
    let (behaviour, _) = call_ok(
        &mut second,
        "evaluate-lisp",
        json!({"code": "(list (undo-target 1) (undo-macro 2) (setf (undo-place 3) 4) (fboundp 'undo-new-helper)
                                (sb-mop:generic-function-methods #'undo-area))"}),
    )
    .await;
    assert!(behaviour.contains("((:ORIGINAL 1) (:ORIGINAL-MACRO 2) (:ORIGINAL-SETF 4 3) NIL NIL)"), "{behaviour}");
    let (found, _) = call_ok(&mut second, "find-definition", json!({"symbol": "undo-target"})).await;
    assert!(found.contains(&format!("function  {file_name}:3:1")), "{found}");
    let (found, _) = call_ok(&mut second, "find-definition", json!({"symbol": "undo-macro"})).await;
    assert!(found.contains(&format!("macro  {file_name}:6:1")), "{found}");

    // Restoring is journaled as nothing, and an entry is restored once.
    let (again, journal) = call_ok(&mut second, "undo", json!({"entries": [first_number]})).await;
    assert!(again.contains("already restored"), "{again}");
    assert_eq!(journal["entries"].as_array().unwrap().len(), 0, "{again}");
    let (_, journal) = call_ok(&mut second, "undo", json!({})).await;
    assert_eq!(journal["entries"].as_array().unwrap().len(), 6, "{journal}");
}

#[tokio::test]
async fn bad_undo_arguments_are_refused_with_what_to_do() {
    let mut client = agent(common::shared_image_port()).await;
    for (arguments, expected) in [
        (json!({"entries": [999999]}), "There is no journal entry 999999; call undo without arguments"),
        (json!({"entries": [1], "since": 1}), "Give either `entries` or `since`, not both."),
        (json!({"since": 0}), "Journal entries are numbered from 1"),
        (json!({"entries": "3"}), "Argument `entries` must be a list of integers"),
    ] {
        let reply = client.call_tool("undo", arguments.clone()).await;
        assert!(common::is_error(&reply), "{arguments}: {reply}");
        assert!(common::text(&reply).contains(expected), "{arguments}: {}", common::text(&reply));
    }
}
