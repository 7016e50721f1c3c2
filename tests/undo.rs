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
    let mut client = common::McpClient::start(&["--port", &port.to_string(), "--structured-content"]).await;
    client.initialize().await;
    client
}

/// An agent whose files may be under `root`.
async fn agent_in(port: u16, root: &std::path::Path) -> common::McpClient {
    let mut client = common::McpClient::start(&[
        "--port",
        &port.to_string(),
        "--root",
        root.to_str().unwrap(),
        "--structured-content",
    ])
    .await;
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

/// The numbers of the journal's entries whose name contains `fragment`, from a listing's structured reply.
fn numbers_named(journal: &Value, fragment: &str) -> Vec<u64> {
    journal["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"].as_str().unwrap().contains(fragment))
        .map(|e| e["number"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn the_tools_own_work_is_not_journaled() {
    let image = common::private_image().await;
    let mut client = agent(image.port).await;
    call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(defun undo-spin (n) (let ((s 0)) (dotimes (i n s) (incf s i))))"}),
    )
    .await;
    // profile REQUIREs SB-SPROF, macroexpand-form of a hash-table LOOP makes uninterned macros.
    let (profiled, _) = call_ok(&mut client, "profile", json!({"code": "(undo-spin 100000)"})).await;
    call_ok(
        &mut client,
        "macroexpand-form",
        json!({"form": "(loop for k being the hash-keys of (make-hash-table) collect k)", "full": true}),
    )
    .await;
    // So does an agent's own REQUIRE: a module is no definition of the agent's to undo.
    call_ok(&mut client, "evaluate-lisp", json!({"code": "(require :sb-rotate-byte)"})).await;
    let (listing, journal) = call_ok(&mut client, "undo", json!({})).await;
    let names: Vec<&str> = journal["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["COMMON-LISP-USER::UNDO-SPIN"], "{listing}");

    let (restored, _) = call_ok(&mut client, "undo", json!({"since": 1})).await;
    assert!(restored.contains("UNDO-SPIN: undefined again (it was new)"), "{restored}");
    call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(defun undo-spin (n) (let ((s 0)) (dotimes (i n s) (incf s i))))"}),
    )
    .await;
    let (again, _) = call_ok(&mut client, "profile", json!({"code": "(undo-spin 100000)"})).await;
    assert!(!again.contains("UNDEFINED-FUNCTION"), "profile works after undo: {again}\n(first run: {profiled})");
    let (fbound, _) = call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(and (fboundp 'sb-sprof:reset) (fboundp 'sb-rotate-byte:rotate-byte) :both-defined)"}),
    )
    .await;
    assert!(fbound.contains("=> :BOTH-DEFINED"), "{fbound}");
}

#[tokio::test]
async fn the_journal_is_listed_a_page_at_a_time() {
    let image = common::private_image().await;
    let mut client = agent(image.port).await;
    let definitions: String = (1..=45).map(|i| format!("(defun undo-page-{i} () {i})\n")).collect();
    call_ok(&mut client, "evaluate-lisp", json!({ "code": definitions })).await;

    let (first_page, journal) = call_ok(&mut client, "undo", json!({})).await;
    assert_eq!(numbers_named(&journal, "UNDO-PAGE-"), (26..=45).collect::<Vec<u64>>(), "{first_page}");
    assert!(first_page.contains("25 entries older: list them with before=26"), "{first_page}");
    assert!(first_page.len() < 3000, "{} characters: {first_page}", first_page.len());
    let (second_page, journal) = call_ok(&mut client, "undo", json!({"before": 26})).await;
    assert_eq!(numbers_named(&journal, "UNDO-PAGE-"), (6..=25).collect::<Vec<u64>>(), "{second_page}");
    assert!(second_page.contains("5 entries older: list them with before=6"), "{second_page}");
    assert!(second_page.contains("20 entries newer: list them without before"), "{second_page}");

    let (restored, journal) = call_ok(&mut client, "undo", json!({"since": 1})).await;
    assert_eq!(journal["restored_count"], 45, "{restored}");
    assert!(!restored.contains("Journal ("), "{restored}");
    assert!(restored.contains("and 20 more: 20, 19, 18,"), "{restored}");
    assert!(restored.len() < 4000, "{} characters: {restored}", restored.len());
    let (fbound, _) =
        call_ok(&mut client, "evaluate-lisp", json!({"code": "(list (fboundp 'undo-page-1) (fboundp 'undo-page-45))"}))
            .await;
    assert!(fbound.contains("=> (NIL NIL)"), "{fbound}");
}

#[tokio::test]
async fn undo_refuses_what_was_changed_since_unless_forced() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("greet.lisp");
    std::fs::write(&file, "(defun undo-greet (name)\n  (list :file name))\n").unwrap();
    let user = user_connection(image.port).await;
    user_eval(&user, &format!("(load (compile-file {:?}))", file.to_str().unwrap())).await;

    let mut client = agent(image.port).await;
    call_ok(&mut client, "evaluate-lisp", json!({"code": "(defun undo-greet (name) (list :agent name))"})).await;
    let (_, journal) = call_ok(&mut client, "undo", json!({})).await;
    let [agents_entry] = numbers_named(&journal, "UNDO-GREET")[..] else { panic!("{journal}") };
    // The human, at their REPL, redefines it after the agent did.
    user_eval(&user, "(defun undo-greet (name) (list :human name))").await;

    let (refused, structured) = call_ok(&mut client, "undo", json!({"entries": [agents_entry]})).await;
    assert!(
        refused.contains(
            "changed since: redefined after the agent's call, not by a journaled agent call (by the user at their REPL"
        ),
        "{refused}"
    );
    assert!(refused.contains("undo with force: true restores it anyway"), "{refused}");
    // Where it is now, in words: not "now defined at defined at the REPL".
    assert!(refused.contains("), now defined at the REPL, no source file;"), "{refused}");
    assert_eq!(structured["skipped"][0]["changed"], true, "{structured}");
    let (kept, _) = call_ok(&mut client, "evaluate-lisp", json!({"code": "(undo-greet 1)"})).await;
    assert!(kept.contains("(:HUMAN 1)"), "the human's definition stays: {kept}");

    let (forced, _) = call_ok(&mut client, "undo", json!({"entries": [agents_entry], "force": true})).await;
    let file_name = file.to_str().unwrap();
    assert!(forced.contains(&format!("UNDO-GREET: now defined at {file_name}:1:1")), "{forced}");
    let (back, _) = call_ok(&mut client, "evaluate-lisp", json!({"code": "(undo-greet 1)"})).await;
    assert!(back.contains("(:FILE 1)"), "{back}");

    // Another agent's later call is named, and undoing newest first passes through both.
    call_ok(&mut client, "evaluate-lisp", json!({"code": "(defun undo-greet (name) (list :first-agent name))"})).await;
    let mut other = agent(image.port).await;
    call_ok(&mut other, "evaluate-lisp", json!({"code": "(defun undo-greet (name) (list :second-agent name))"})).await;
    let (_, journal) = call_ok(&mut client, "undo", json!({})).await;
    let [_, first, second] = numbers_named(&journal, "UNDO-GREET")[..] else { panic!("{journal}") };
    let (refused, _) = call_ok(&mut client, "undo", json!({"entries": [first]})).await;
    assert!(refused.contains(&format!("journal entry {second} (a later agent call) redefined it")), "{refused}");
    let (both, _) = call_ok(&mut client, "undo", json!({"since": first})).await;
    assert!(both.contains("Restored 2 entries"), "{both}");
    let (back, _) = call_ok(&mut client, "evaluate-lisp", json!({"code": "(undo-greet 1)"})).await;
    assert!(back.contains("(:FILE 1)"), "{back}");
}

#[tokio::test]
async fn methods_are_removed_or_put_back_and_a_class_gets_its_slots_back() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shapes.lisp");
    std::fs::write(
        &file,
        "(defclass undo-box ()\n  ((width :initarg :width :initform 1 :reader box-width)\n   (height :initarg :height :initform 2 :reader box-height)))\n\n\
         (defgeneric undo-describe (thing))\n\n(defmethod undo-describe ((thing undo-box))\n  (list :user-box (box-width thing)))\n",
    )
    .unwrap();
    let user = user_connection(image.port).await;
    user_eval(&user, &format!("(load (compile-file {:?}))", file.to_str().unwrap())).await;

    let mut client = agent(image.port).await;
    call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(defclass undo-box ()
                          ((width :initarg :width :initform 10 :reader box-width)
                           (depth :initarg :depth :initform 30 :reader box-depth)))
                        (defmethod undo-describe ((thing undo-box)) (list :agent-box (box-depth thing)))
                        (defmethod undo-describe ((thing integer)) (list :agent-integer thing))"}),
    )
    .await;
    let (during, _) = call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(list (undo-describe (make-instance 'undo-box)) (undo-describe 5))"}),
    )
    .await;
    assert!(during.contains("((:AGENT-BOX 30) (:AGENT-INTEGER 5))"), "{during}");
    let (listing, journal) = call_ok(&mut client, "undo", json!({})).await;
    let file_name = file.to_str().unwrap();
    assert!(
        listing.contains(&format!(
            "class COMMON-LISP-USER::UNDO-BOX (redefined): replaced the definition from {file_name}:1:1"
        )),
        "{listing}"
    );
    assert!(
        listing.contains(&format!(
            "method COMMON-LISP-USER::UNDO-DESCRIBE ((UNDO-BOX)): replaced the definition from {file_name}:7:1"
        )),
        "{listing}"
    );
    assert!(
        listing.contains("method COMMON-LISP-USER::UNDO-DESCRIBE ((INTEGER)): added: undo removes it"),
        "{listing}"
    );
    let first = journal["entries"][0]["number"].as_u64().unwrap();

    let (restored, _) = call_ok(&mut client, "undo", json!({"since": first})).await;
    assert!(restored.contains("Restored 3 entries"), "{restored}");
    assert!(restored.contains("((INTEGER)): removed (it was added)"), "{restored}");
    assert!(
        restored.contains(&format!("((UNDO-BOX)): the method it replaced is back, defined at {file_name}:7:1")),
        "{restored}"
    );
    assert!(
        restored.contains("class COMMON-LISP-USER::UNDO-BOX (redefined): its previous definition is back"),
        "{restored}"
    );

    // The image holds what the reply says: the user's slots, initforms and readers, the user's
    // method, and no method on integers.
    let (now, _) = call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(let ((box (make-instance 'undo-box)))
                          (list (mapcar #'sb-mop:slot-definition-name (sb-mop:class-slots (find-class 'undo-box)))
                                (box-width box) (box-height box)
                                (and (fboundp 'box-depth) (sb-mop:generic-function-methods #'box-depth))
                                (undo-describe box)
                                (length (sb-mop:generic-function-methods #'undo-describe))
                                (handler-case (undo-describe 5) (error (e) (type-of e)))))"}),
    )
    .await;
    let now = now.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(now.contains("((WIDTH HEIGHT) 1 2 NIL (:USER-BOX 1) 1 SB-PCL::NO-APPLICABLE-METHOD-ERROR)"), "{now}");
    let (found, _) = call_ok(&mut client, "find-definition", json!({"symbol": "undo-box"})).await;
    assert!(found.contains(&format!("{file_name}:1:1")), "{found}");

    // A method and a class the human redefined after the agent are refused, naming the change.
    call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(defmethod undo-describe ((thing string)) :agent-string)
                        (defclass undo-box () ((width :initarg :width :initform 100 :reader box-width)))"}),
    )
    .await;
    user_eval(&user, "(defmethod undo-describe ((thing string)) :human-string)").await;
    user_eval(&user, "(defclass undo-box () ((width :initform 7 :reader box-width) (human :initform 8)))").await;
    let (_, journal) = call_ok(&mut client, "undo", json!({})).await;
    let entries = journal["entries"].as_array().unwrap();
    let newest: Vec<u64> = entries[entries.len() - 2..].iter().map(|e| e["number"].as_u64().unwrap()).collect();
    let (refused, structured) = call_ok(&mut client, "undo", json!({"entries": newest})).await;
    assert_eq!(structured["restored_count"], 0, "{refused}");
    assert!(
        refused.contains("method COMMON-LISP-USER::UNDO-DESCRIBE: changed since: redefined after the agent's call"),
        "{refused}"
    );
    assert!(
        refused.contains("class COMMON-LISP-USER::UNDO-BOX: changed since: redefined after the agent's call"),
        "{refused}"
    );
    let (kept, _) = call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(list (undo-describe \"s\") (mapcar #'sb-mop:slot-definition-name (sb-mop:class-slots (find-class 'undo-box))))"}),
    )
    .await;
    assert!(kept.contains("(:HUMAN-STRING (WIDTH HUMAN))"), "{kept}");
}

#[tokio::test]
async fn an_edit_with_load_is_undone_in_the_image_and_the_reply_says_the_file_keeps_the_agents_text() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edit.lisp");
    let file_name = file.to_str().unwrap().to_string();
    std::fs::write(&file, "(defun undo-edited ()\n  :original)\n").unwrap();
    let user = user_connection(image.port).await;
    user_eval(&user, &format!("(load (compile-file {file_name:?}))")).await;

    let mut client = agent_in(image.port, dir.path()).await;
    call_ok(
        &mut client,
        "edit-lisp-form",
        json!({"file_path": file_name, "form_type": "defun", "form_name": "undo-edited", "operation": "replace",
               "content": "(defun undo-edited ()\n  :agent)", "load": true}),
    )
    .await;
    let (_, journal) = call_ok(&mut client, "undo", json!({})).await;
    let [entry] = numbers_named(&journal, "UNDO-EDITED")[..] else { panic!("{journal}") };
    let (restored, structured) = call_ok(&mut client, "undo", json!({"entries": [entry]})).await;
    assert!(
        restored.contains(&format!(
            "Undo changed the image only: the agent's versions came from files it leaves as they are: {file_name} \
             (entry {entry})."
        )),
        "{restored}"
    );
    assert_eq!(structured["restored"][0]["agent_file"]["file"], file_name.as_str(), "{structured}");
    let (behaviour, _) = call_ok(&mut client, "evaluate-lisp", json!({"code": "(undo-edited)"})).await;
    assert!(behaviour.contains("=> :ORIGINAL"), "{behaviour}");
    // What the reply says of the file is so: it holds the agent's text.
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "(defun undo-edited ()\n  :agent)\n");

    // A delete with load journals the removal: undo puts the definition back, from where it was.
    call_ok(
        &mut client,
        "edit-lisp-form",
        json!({"file_path": file_name, "form_type": "defun", "form_name": "undo-edited", "operation": "delete", "load": true}),
    )
    .await;
    let (listing, journal) = call_ok(&mut client, "undo", json!({})).await;
    let [_, removal] = numbers_named(&journal, "UNDO-EDITED")[..] else { panic!("{listing}") };
    // The file holds nothing now: no line of it is named.
    let gone = "no definition of `undo-edited` is in the file now";
    assert!(
        listing
            .contains(&format!("function COMMON-LISP-USER::UNDO-EDITED: replaced the definition from {file_name} (")),
        "{listing}"
    );
    assert!(listing.contains(gone), "{listing}");
    let (restored, _) = call_ok(&mut client, "undo", json!({"entries": [removal]})).await;
    assert!(restored.contains(&format!("UNDO-EDITED: now defined at {file_name} (")), "{restored}");
    assert!(restored.contains(gone), "{restored}");
    let (behaviour, _) = call_ok(&mut client, "evaluate-lisp", json!({"code": "(undo-edited)"})).await;
    assert!(behaviour.contains("=> :ORIGINAL"), "{behaviour}");
}

/// A deleted function that undo puts back is in no file now: undo says so, and names no line
/// where other text now stands (issue 49.4: it said "at 48:22", inside another form, of a
/// function that was at 51 before the agent's edits moved the text under SBCL's offset).
#[tokio::test]
async fn an_undone_deletion_names_no_line_the_file_no_longer_has_it_at() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gone.lisp");
    let file_name = file.to_str().unwrap().to_string();
    std::fs::write(
        &file,
        "(defun undo-gone-a ()\n  ;; first\n  ;; second\n  :a)\n\n(defun undo-gone-b ()\n  :b)\n\n\
         (defun undo-gone-c ()\n  :c)\n\n(defun undo-gone-d (x)\n  (list (list x\n              :d)\n        :dd))\n",
    )
    .unwrap();
    let user = user_connection(image.port).await;
    user_eval(&user, &format!("(load (compile-file {file_name:?}))")).await;
    let mut client = agent_in(image.port, dir.path()).await;
    call_ok(
        &mut client,
        "edit-lisp-form",
        json!({"file_path": file_name, "form_type": "defun", "edits": [
            {"form_name": "undo-gone-a", "operation": "patch", "old_text": "  ;; first\n  ;; second\n", "new_text": ""},
            {"form_name": "undo-gone-c", "operation": "delete", "load": true}]}),
    )
    .await;
    let (_, journal) = call_ok(&mut client, "undo", json!({})).await;
    let [removal] = numbers_named(&journal, "UNDO-GONE-C")[..] else { panic!("{journal}") };
    let (restored, structured) = call_ok(&mut client, "undo", json!({"entries": [removal]})).await;
    let (behaviour, _) = call_ok(&mut client, "evaluate-lisp", json!({"code": "(undo-gone-c)"})).await;
    assert!(behaviour.contains("=> :C"), "{behaviour}");
    let now = &structured["restored"][0]["now"];
    assert_eq!((&now["file"], &now["line"]), (&json!(file_name), &Value::Null), "{restored}");
    assert!(restored.contains(&format!("UNDO-GONE-C: now defined at {file_name} (")), "{restored}");
    assert!(restored.contains("no definition of `undo-gone-c` is in the file now"), "{restored}");
}

/// `count` macros and as many functions, each returning `version`, and one definition of
/// each kind that only `version` "agent" has.
fn definitions_file(count: usize, version: &str) -> String {
    let mut text = String::from("(in-package :cl-user)\n");
    for i in 1..=count {
        text.push_str(&format!("\n(defmacro undo-reload-macro-{i} (x)\n  `(list :{version} ,x))\n"));
        text.push_str(&format!("\n(defun undo-reload-function-{i} ()\n  :{version})\n"));
    }
    if version == "agent" {
        text.push_str("\n(defmacro undo-reload-new-macro (x)\n  x)\n\n(defun undo-reload-new-function ()\n  :new)\n");
    }
    text
}

/// The (kind, name) of the journal's entries numbered from `first` on, sorted.
fn entries_from(journal: &Value, first: u64) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> = journal["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["number"].as_u64().unwrap() >= first)
        .map(|e| (e["kind"].as_str().unwrap().to_string(), e["name"].as_str().unwrap().to_string()))
        .collect();
    entries.sort();
    entries
}

/// A file compiled and loaded over definitions the image has makes one entry per definition it
/// replaces: a macro is defined when its file compiles and again when the fasl loads, and the
/// entry has what the image held before the call (the user's) and what it holds after (the
/// fasl's). A definition new to the image is no replacement, even when its compilation defined
/// it first. Through load-file, and through ASDF as run-tests and load-system reload files.
#[tokio::test]
async fn a_file_loaded_over_existing_definitions_journals_each_of_them_once() {
    const COUNT: usize = 3;
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let dir_name = dir.path().to_str().unwrap().to_string();
    let file = dir.path().join("reload.lisp");
    let file_name = file.to_str().unwrap().to_string();
    std::fs::write(&file, definitions_file(COUNT, "user")).unwrap();
    std::fs::write(
        dir.path().join("undo-reload.asd"),
        "(asdf:defsystem \"undo-reload\" :components ((:file \"reload\")))\n",
    )
    .unwrap();
    let user = user_connection(image.port).await;
    user_eval(
        &user,
        &format!(
            "(progn (require :asdf) (asdf:load-asd {:?}) (asdf:load-system \"undo-reload\"))",
            format!("{dir_name}/undo-reload.asd")
        ),
    )
    .await;

    let port = image.port.to_string();
    let mut client = common::McpClient::start(&["--port", &port, "--root", &dir_name, "--structured-content"]).await;
    client.initialize().await;
    let mut replaced: Vec<(String, String)> = (1..=COUNT)
        .flat_map(|i| {
            [
                ("macro".to_string(), format!("COMMON-LISP-USER::UNDO-RELOAD-MACRO-{i}")),
                ("function".to_string(), format!("COMMON-LISP-USER::UNDO-RELOAD-FUNCTION-{i}")),
            ]
        })
        .collect();
    replaced.sort();
    let behaviour = "(list (undo-reload-macro-1 0) (undo-reload-function-1) (and (fboundp 'undo-reload-new-macro) t))";

    // load-file.
    std::fs::write(&file, definitions_file(COUNT, "agent")).unwrap();
    let (_, journal) = call_ok(&mut client, "undo", json!({})).await;
    assert!(journal["entries"].as_array().unwrap().is_empty(), "{journal}");
    call_ok(&mut client, "load-file", json!({"file_path": file_name})).await;
    let (listing, journal) = call_ok(&mut client, "undo", json!({})).await;
    assert_eq!(entries_from(&journal, 0), replaced, "{listing}");
    for i in 1..=COUNT {
        let line = 3 + (i - 1) * 6;
        assert!(
            listing.contains(&format!(
                "macro COMMON-LISP-USER::UNDO-RELOAD-MACRO-{i}: replaced the definition from {file_name}:{line}:1"
            )),
            "{listing}"
        );
    }
    let (now, _) = call_ok(&mut client, "evaluate-lisp", json!({ "code": behaviour })).await;
    assert!(now.contains("((:AGENT 0) :AGENT T)"), "{now}");
    let first = journal["entries"][0]["number"].as_u64().unwrap();
    let (restored, _) = call_ok(&mut client, "undo", json!({ "since": first })).await;
    // Each entry holds what the image has: none was changed since.
    assert!(restored.starts_with(&format!("Restored {} entries:", replaced.len())), "{restored}");
    let (now, _) = call_ok(&mut client, "evaluate-lisp", json!({ "code": behaviour })).await;
    assert!(now.contains("((:USER 0) :USER T)"), "{now}");

    // ASDF reloads the file it loaded for the user, which changed since. The definitions new to
    // the image are in it now, from the agent's load-file, and replaced in their turn.
    let later = std::time::SystemTime::now() + Duration::from_secs(2);
    std::fs::File::options().write(true).open(&file).and_then(|f| f.set_modified(later)).unwrap();
    let (loaded, _) = call_ok(&mut client, "load-system", json!({"system": "undo-reload"})).await;
    assert!(loaded.contains("ASDF reloaded 1 changed file of undo-reload (reload.lisp)"), "{loaded}");
    let (listing, journal) = call_ok(&mut client, "undo", json!({})).await;
    replaced.extend([
        ("function".to_string(), "COMMON-LISP-USER::UNDO-RELOAD-NEW-FUNCTION".to_string()),
        ("macro".to_string(), "COMMON-LISP-USER::UNDO-RELOAD-NEW-MACRO".to_string()),
    ]);
    replaced.sort();
    let next = first + COUNT as u64 * 2;
    assert_eq!(entries_from(&journal, next), replaced, "{listing}");
    assert!(loaded.contains(&format!("undo entries {next} to {}", next + replaced.len() as u64 - 1)), "{loaded}");
    let (restored, _) = call_ok(&mut client, "undo", json!({ "since": next })).await;
    assert!(restored.starts_with(&format!("Restored {} entries:", replaced.len())), "{restored}");
    let (now, _) = call_ok(&mut client, "evaluate-lisp", json!({ "code": behaviour })).await;
    assert!(now.contains("((:USER 0) :USER T)"), "{now}");
}

/// Every entry of the journal, oldest first, all pages.
async fn whole_journal(client: &mut common::McpClient) -> Vec<Value> {
    let (_, first) = call_ok(client, "undo", json!({})).await;
    let mut entries = first["entries"].as_array().unwrap().clone();
    while let Some(oldest) = entries.first().and_then(|entry| entry["number"].as_u64()).filter(|&n| n > 1) {
        let (_, page) = call_ok(client, "undo", json!({ "before": oldest })).await;
        let older = page["entries"].as_array().unwrap();
        if older.is_empty() {
            break;
        }
        entries.splice(0..0, older.iter().cloned());
    }
    entries
}

/// `file` with a line put before its text, written a few seconds later than SBCL recorded it.
fn change_later(file: &std::path::Path, first_line: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    std::fs::write(file, format!("{first_line}\n{text}")).unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(2);
    std::fs::File::options().write(true).open(file).and_then(|f| f.set_modified(later)).unwrap();
}

const RELOCATED: &str = "the file changed since this was compiled; found in its current text";

/// Alexandria's DEFINE-MODIFY-MACROs (APPENDF and 13 more) define macros that no `defmacro`
/// names: in a file that changed since it was compiled, undo finds each by its own form, where
/// it is now, rather than saying that no `defun appendf` is in the file.
#[tokio::test]
async fn macros_made_by_define_modify_macro_are_found_in_their_changed_files() {
    let debian = std::path::Path::new("/usr/share/common-lisp/source/alexandria");
    if !debian.join("alexandria.asd").is_file() {
        common::skip("Debian's Alexandria source is not installed (apt-get install cl-alexandria)");
        return;
    }
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("alexandria");
    let status = std::process::Command::new("cp").arg("-r").arg(debian).arg(&copy).status().unwrap();
    assert!(status.success());
    let user = user_connection(image.port).await;
    user_eval(
        &user,
        &format!(
            "(progn (require :asdf)
                    (asdf:initialize-source-registry '(:source-registry (:tree {:?}) :ignore-inherited-configuration))
                    (asdf:load-system \"alexandria\"))",
            copy.to_str().unwrap()
        ),
    )
    .await;

    // Each file that has them changes after it was compiled: a line comes first.
    let mut expected: Vec<(String, String, u64)> = Vec::new();
    let mut files: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(copy.join("alexandria-1")).unwrap() {
        let file = entry.unwrap().path();
        let text = std::fs::read_to_string(&file).unwrap();
        if !text.contains("(define-modify-macro ") {
            continue;
        }
        change_later(&file, ";;; Changed since it was compiled.");
        let text = std::fs::read_to_string(&file).unwrap();
        for (index, line) in text.lines().enumerate() {
            if let Some(rest) = line.strip_prefix("(define-modify-macro ") {
                let name = rest.split_whitespace().next().unwrap().to_uppercase();
                expected.push((name, file.to_str().unwrap().to_string(), index as u64 + 1));
            }
        }
        files.push(file.to_str().unwrap().to_string());
    }
    assert_eq!(expected.len(), 14, "{expected:?}");

    let port = image.port.to_string();
    let root = dir.path().to_str().unwrap();
    let mut client = common::McpClient::start(&["--port", &port, "--root", root, "--structured-content"]).await;
    client.initialize().await;
    let loads: Vec<String> = files.iter().map(|file| format!("(load {file:?})")).collect();
    call_ok(&mut client, "evaluate-lisp", json!({"code": format!("(progn {} :reloaded)", loads.join(" "))})).await;
    let entries = whole_journal(&mut client).await;
    for (name, file, line) in &expected {
        let entry = entries
            .iter()
            .find(|entry| entry["kind"] == "macro" && entry["name"].as_str().unwrap().ends_with(&format!(":{name}")))
            .unwrap_or_else(|| panic!("no entry for {name}: {entries:?}"));
        let previous = &entry["previous"];
        assert_eq!(previous["file"].as_str(), Some(file.as_str()), "{name}: {entry}");
        assert_eq!(previous["line"].as_u64(), Some(*line), "{name}: {entry}");
        assert_eq!(previous["note"].as_str(), Some(RELOCATED), "{name}: {entry}");
    }
}

/// SBCL records the write date of the file a function or macro came from, and none with a
/// method, a generic function or a class: whether their file changed since it was compiled is
/// judged by the date of the functions compiled with them, so that all of a file's definitions
/// say that it did.
#[tokio::test]
async fn every_definition_of_a_file_that_changed_since_it_was_compiled_says_so() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kinds.lisp");
    std::fs::write(
        &file,
        "(defpackage :undo-kinds (:use :cl))\n(in-package :undo-kinds)\n\n(defun area-of (x) x)\n\n\
         (defgeneric area (shape))\n\n(defmethod area ((shape integer)) (list :user shape))\n\n\
         (defclass shape () ((side :initarg :side)))\n",
    )
    .unwrap();
    let user = user_connection(image.port).await;
    user_eval(&user, &format!("(load (compile-file {:?}))", file.to_str().unwrap())).await;
    change_later(&file, ";;; Changed since it was compiled.\n");

    let port = image.port.to_string();
    let root = dir.path().to_str().unwrap();
    let mut client = common::McpClient::start(&["--port", &port, "--root", root, "--structured-content"]).await;
    client.initialize().await;
    call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(in-package :undo-kinds)
                        (defun area-of (x) (list :agent x))
                        (defmethod area ((shape integer)) (list :agent shape))
                        (defclass shape () ((side :initarg :side) (colour :initarg :colour)))"}),
    )
    .await;
    let entries = whole_journal(&mut client).await;
    let lines: Vec<(&str, u64, &str)> = entries
        .iter()
        .filter(|entry| entry["name"].as_str().unwrap().starts_with("UNDO-KINDS::"))
        .map(|entry| {
            let previous = &entry["previous"];
            (
                entry["kind"].as_str().unwrap(),
                previous["line"].as_u64().unwrap(),
                previous["note"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(lines, [("function", 6, RELOCATED), ("method", 10, RELOCATED), ("class", 12, RELOCATED)], "{entries:?}");
}

/// A definition the user compiled with C-c C-c in the buffer of its file (SLIME's
/// compile-string-for-emacs, which compiles the text alone) is placed at its line in the file,
/// from the buffer position SLIME gives, not at the file's first form.
#[tokio::test]
async fn a_definition_compiled_from_its_files_buffer_is_placed_at_its_line() {
    let image = common::private_image().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("buffer.lisp");
    let text = ";;;; The user's file, ünïcode and all\n\n(in-package :cl-user)\n\n;; → the one C-c C-c compiles\n\
                (defun undo-buffer-target (x)\n  (list :buffer x))\n";
    std::fs::write(&file, text).unwrap();
    let definition = "(defun undo-buffer-target (x)\n  (list :buffer x))";
    // Emacs's point: characters from 1.
    let position = text[..text.find(definition).unwrap()].chars().count() + 1;
    let file_name = file.to_str().unwrap();
    let user = user_connection(image.port).await;
    user_eval(
        &user,
        &format!(
            "(swank:compile-string-for-emacs {definition:?} \"buffer.lisp\" '((:position {position}) (:line 6 1)) \
             {file_name:?} nil)"
        ),
    )
    .await;

    let mut client = agent(image.port).await;
    let (found, _) = call_ok(&mut client, "find-definition", json!({"symbol": "undo-buffer-target"})).await;
    assert!(found.contains(&format!("function  {file_name}:6:1")) && !found.contains("changed"), "{found}");
    call_ok(&mut client, "evaluate-lisp", json!({"code": "(defun undo-buffer-target (x) (list :agent x))"})).await;
    let (listing, _) = call_ok(&mut client, "undo", json!({})).await;
    let replaced =
        format!("function COMMON-LISP-USER::UNDO-BUFFER-TARGET: replaced the definition from {file_name}:6:1");
    assert!(listing.lines().any(|line| line.ends_with(&format!("{replaced} (evaluate-lisp)"))), "{listing}");
}

#[tokio::test]
async fn undo_puts_definitions_back_in_a_locked_package() {
    let image = common::private_image().await;
    let user = user_connection(image.port).await;
    user_eval(&user, "(progn (require :asdf) (asdf:load-system \"alexandria\") (sb-ext:package-locked-p :alexandria))")
        .await;
    let mut client = agent(image.port).await;
    // In its own package a locked package's definitions are made as a system's load makes them.
    call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(defun flatten (tree) (list :agent tree)) (defmacro when-let (b &body body) (declare (ignore b)) `(list :agent-macro ,@body))", "package": "ALEXANDRIA"}),
    )
    .await;
    let (_, journal) = call_ok(&mut client, "undo", json!({})).await;
    let mut numbers = numbers_named(&journal, "ALEXANDRIA:FLATTEN");
    numbers.extend(numbers_named(&journal, "ALEXANDRIA:WHEN-LET"));
    assert_eq!(numbers.len(), 2, "{journal}");
    let (undone, structured) = call_ok(&mut client, "undo", json!({"entries": numbers})).await;
    assert!(undone.contains("Restored 2 entries"), "{undone}");
    assert!(!undone.contains("restart"), "no restart the agent cannot use: {undone}");
    assert_eq!(structured["restored"].as_array().unwrap().len(), 2, "{structured}");
    let (back, _) = call_ok(
        &mut client,
        "evaluate-lisp",
        json!({"code": "(list (alexandria:flatten '((1) 2)) (alexandria:when-let (x 1) x))"}),
    )
    .await;
    assert!(back.contains("((1 2) 1)"), "{back}");
}
