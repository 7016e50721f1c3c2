//! `--read-only` holds by construction (issue 36.1): the tools it offers take no code, the image
//! runs only the helper's looks for such a server, and the hostile probe's payloads (constant
//! folding through every foldable higher-order function, in each place the compiler folds;
//! `lambda-with-lexenv`; names through package-local nicknames) run nothing, write nothing and
//! intern nothing, under `--read-only`, `--read-only --tools`, and, as calls of tools that are not
//! read-only, under `--confirm mutating` with nobody to ask.

mod common;

use std::path::Path;

use serde_json::{json, Value};

use common::{is_error, text, McpClient};

/// The tools `--read-only` offers, by their own declarations: those that take names, files or
/// nothing, in the order `tools/list` shows them.
fn read_only_tools() -> Vec<String> {
    swank_mcp::tools::every_definition()
        .filter(|definition| definition.read_only)
        .map(|definition| definition.name.to_string())
        .collect()
}

/// The functions SBCL folds at compile time that call the function they are given.
const FOLDING_CALLERS: [&str; 7] = ["some", "every", "notany", "mapc", "find-if", "count-if", "position-if"];

/// Lisp that creates `marker` when it runs, as a form inside a quoted list.
fn touch(marker: &Path) -> String {
    format!(
        "(with-open-file (s {:?} :direction :output :if-exists :supersede) (print :ran s))",
        marker.display().to_string()
    )
}

/// The probe's payloads: each would create the marker if any of it ran.
fn payloads(marker: &Path) -> Vec<String> {
    let touch = touch(marker);
    let mut payloads = Vec::new();
    for caller in FOLDING_CALLERS {
        let call = format!("({caller} 'eval '({touch}))");
        payloads.extend([
            format!("(dolist (x {call}) x)"),
            format!("(defun ro-defaults (&optional (a {call})) a)"),
            format!("(defstruct ro-struct (a {call}))"),
            format!("(make-array {call})"),
            format!("(loop repeat {call} do (print 1))"),
            format!("(symbol-macrolet ((q {call})) q)"),
        ]);
    }
    payloads.push(format!("(sb-c::lambda-with-lexenv (:macro ((m () {touch} nil))) () (m))"));
    payloads.push(format!("(format nil \"~/ro-test::ro-fresh-directive/\" {touch})"));
    payloads
}

fn tool_names(reply: &Value) -> Vec<String> {
    reply["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
}

/// The symbols of RO-TEST, for the checks that nothing was interned there.
const RO_TEST_SYMBOLS: &str =
    "(let ((n 0)) (do-symbols (s :ro-test) (when (eq (symbol-package s) (find-package :ro-test)) (incf n))) n)";

async fn prepare_package(toolbox: &std::sync::Arc<swank_mcp::tools::Toolbox>) {
    common::eval_ok(
        toolbox,
        "(defpackage :ro-target (:use :cl) (:export #:ro-exported)) \
         (defpackage :ro-test (:use :cl) (:local-nicknames (:ro-nick :ro-target))) \
         (defun ro-target:ro-exported () 1)",
    )
    .await;
}

#[tokio::test]
async fn read_only_offers_only_the_tools_that_take_no_code_and_the_probe_runs_nothing() {
    let port = common::shared_image_port();
    let toolbox = common::toolbox(port);
    prepare_package(&toolbox).await;
    let directory = tempfile::tempdir().unwrap();
    let marker = directory.path().join("ran");
    let before = common::eval_ok(&toolbox, RO_TEST_SYMBOLS).await;

    let mut client = McpClient::start(&["--port", &port.to_string(), "--read-only"]).await;
    client.initialize().await;
    assert_eq!(tool_names(&client.request("tools/list", json!({})).await), read_only_tools());
    for payload in payloads(&marker) {
        // The tools that take code are not there at all.
        for (tool, key) in [("compile-form", "code"), ("macroexpand-form", "form"), ("evaluate-lisp", "code")] {
            let reply = client.call_tool(tool, json!({key: payload, "package": "RO-TEST"})).await;
            assert_eq!(reply["error"]["code"], -32602, "{tool} is not offered under --read-only: {reply}");
        }
        // Those that are take names, which are parsed, never read.
        for (tool, arguments) in [
            ("describe-symbol", json!({"symbol": payload, "package": "RO-TEST"})),
            ("find-definition", json!({"symbol": payload, "package": "RO-TEST"})),
            ("class-info", json!({"class": payload, "package": "RO-TEST"})),
            ("xref", json!({"symbol": payload, "kind": "calls", "package": "RO-TEST"})),
            ("apropos-search", json!({"query": payload, "package": "RO-TEST"})),
        ] {
            let reply = client.call_tool(tool, arguments).await;
            assert!(!marker.exists(), "{tool} ran {payload}: {reply}");
        }
    }
    // A name that does not exist stays that way, through a local nickname too; one that does is
    // found through it.
    for name in ["ro-test::ro-fresh-name", "ro-nick::ro-fresh-name", "ro-nick:ro-fresh-name"] {
        let reply = client.call_tool("describe-symbol", json!({"symbol": name, "package": "RO-TEST"})).await;
        assert!(is_error(&reply) && text(&reply).contains("not found"), "{name}: {reply}");
    }
    let reply =
        client.call_tool("describe-symbol", json!({"symbol": "ro-nick:ro-exported", "package": "RO-TEST"})).await;
    assert!(!is_error(&reply) && text(&reply).contains("RO-EXPORTED"), "found through the local nickname: {reply}");
    assert!(!marker.exists());
    assert_eq!(common::eval_ok(&toolbox, RO_TEST_SYMBOLS).await, before, "a symbol was interned in RO-TEST");
    assert_eq!(
        common::without_handle(
            &common::eval_ok(
                &toolbox,
                "(list (find-symbol \"RO-FRESH-NAME\" :ro-target) (find-symbol \"RO-FRESH-DIRECTIVE\" :ro-test) \
                 (fboundp 'ro-test::ro-defaults))"
            )
            .await
        ),
        "=> (NIL NIL NIL)"
    );
}

#[tokio::test]
async fn read_only_with_tools_may_only_narrow_the_read_only_set() {
    let port = common::shared_image_port().to_string();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--port", &port, "--read-only", "--tools", "describe-symbol,compile-form,evaluate-lisp"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("--tools names compile-form, evaluate-lisp, which --read-only leaves out")
            && said.contains("xref"),
        "names what is refused and what may be chosen: {said}"
    );

    let mut client =
        McpClient::start(&["--port", &port, "--read-only", "--tools", "describe-symbol,lisp-status"]).await;
    client.initialize().await;
    assert_eq!(tool_names(&client.request("tools/list", json!({})).await), ["describe-symbol", "lisp-status"]);
    let reply = client.call_tool("lisp-status", json!({})).await;
    assert!(!is_error(&reply), "the image answers a read-only server's looks: {reply}");
}

#[tokio::test]
async fn under_confirm_mutating_compile_and_expand_ask_first_and_with_nobody_to_ask_run_nothing() {
    let port = common::shared_image_port();
    let toolbox = common::toolbox(port);
    prepare_package(&toolbox).await;
    let directory = tempfile::tempdir().unwrap();
    let marker = directory.path().join("ran");
    // The client declares no elicitation and no Emacs answers in approval mode: a call that must
    // be approved is refused.
    let mut client = McpClient::start(&["--port", &port.to_string(), "--confirm", "mutating"]).await;
    client.initialize().await;
    for payload in payloads(&marker).into_iter().take(8) {
        for (tool, key) in [("compile-form", "code"), ("macroexpand-form", "form")] {
            let reply = client.call_tool(tool, json!({key: payload, "package": "RO-TEST"})).await;
            assert!(is_error(&reply) && text(&reply).contains("approv"), "{tool} must be approved first: {reply}");
        }
    }
    assert!(!marker.exists(), "a call that was never approved ran");
    // The read-only tools are not asked about.
    let reply = client.call_tool("describe-symbol", json!({"symbol": "car"})).await;
    assert!(!is_error(&reply), "{reply}");
}

/// The image's side of the promise: through LOOK only the helper's looks run, so a read-only
/// server could not run code even if one of its tools asked for an entry that evaluates.
#[tokio::test]
async fn the_image_runs_only_looks_for_a_read_only_server() {
    let toolbox = common::toolbox(common::shared_image_port());
    let directory = tempfile::tempdir().unwrap();
    let marker = directory.path().join("ran");
    let touch = touch(&marker);
    for (entry, argument) in [
        ("evaluate", touch.as_str()),
        ("compile-code", touch.as_str()),
        ("expand-form", touch.as_str()),
        ("threads", ""),
    ] {
        let code = format!(
            "(handler-case (mcp-agent-helper:look mcp-agent-helper::*version* {entry:?} () {argument:?}) \
               (error (e) (princ-to-string e)))"
        );
        let value = common::eval_ok(&toolbox, &code).await;
        assert!(
            value.contains(&format!("{entry} is refused: this swank-mcp server promised to change nothing")),
            "{entry}: {value}"
        );
    }
    assert!(!marker.exists(), "an entry that is not a look ran");
    let value = common::eval_ok(
        &toolbox,
        "(getf (mcp-agent-helper:look mcp-agent-helper::*version* \"describe-symbol\" () \"car\") :symbol)",
    )
    .await;
    assert_eq!(common::without_handle(&value), "=> \"COMMON-LISP:CAR\"", "{value}");
}

/// Every tool `--read-only` offers works there, in each of its kinds: the image runs what a
/// read-only server asks only when the entry is a look, so a read-only tool that came to call an
/// entry not defined `(:look t)` is refused here, and one added to the set without a call below
/// fails the coverage check.
#[tokio::test]
async fn every_read_only_tool_works_under_read_only_in_each_of_its_kinds() {
    let port = common::shared_image_port().to_string();
    let project = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/projects/tally");
    let file = project.join("tally.lisp").display().to_string();
    let root = project.display().to_string();
    let mut client = McpClient::start(&["--port", &port, "--read-only", "--root", &root]).await;
    client.initialize().await;
    let listed = client.request("tools/list", json!({})).await;
    let xref = listed["result"]["tools"].as_array().unwrap().iter().find(|tool| tool["name"] == "xref").unwrap();
    let kinds: Vec<&str> = xref["inputSchema"]["properties"]["kind"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(!kinds.is_empty(), "{xref}");
    let mut calls = vec![
        ("class-info", json!({"class": "standard-object"})),
        ("describe-symbol", json!({"symbol": "mapcar"})),
        ("apropos-search", json!({"query": "mapcar", "package": "CL"})),
        ("find-definition", json!({"symbol": "mcp-agent-helper:look"})),
        ("find-definition", json!({"text": "defun"})),
        ("lisp-status", json!({})),
        ("lisp-check-parens", json!({"code": "(a (b))"})),
        ("lisp-outline", json!({"file_path": file})),
    ];
    // Each kind asked of a symbol it fits: a variable for binds and sets, a macro for its
    // expansions, a class for its methods.
    calls.extend(kinds.iter().map(|kind| {
        let symbol = match *kind {
            "binds" | "sets" | "references" => "*print-length*",
            "macroexpands" => "with-open-file",
            "specializes" => "standard-object",
            _ => "mcp-agent-helper:look",
        };
        ("xref", json!({"symbol": symbol, "kind": kind}))
    }));
    let mut called: Vec<&str> = calls.iter().map(|(tool, _)| *tool).collect();
    called.sort();
    called.dedup();
    let mut offered = tool_names(&listed);
    offered.sort();
    assert_eq!(called, offered, "each tool --read-only offers is called here");
    for (tool, arguments) in calls {
        let reply = client.call_tool(tool, arguments.clone()).await;
        assert!(!is_error(&reply), "{tool} {arguments}: {reply}");
        assert!(!text(&reply).contains("promised to change nothing"), "{tool} {arguments}: {reply}");
    }
}

#[tokio::test]
async fn read_only_reads_no_source_file_outside_the_roots_and_never_waits_on_a_fifo() {
    let port = common::shared_image_port();
    let toolbox = common::toolbox(port);
    let outside = tempfile::tempdir().unwrap();
    let regular = outside.path().join("ro-outside.lisp");
    let piped = outside.path().join("ro-piped.lisp");
    std::fs::write(&regular, "\n\n(defun ro-outside-fn () :outside)\n").unwrap();
    std::fs::write(&piped, "\n\n(defun ro-piped-fn () :piped)\n").unwrap();
    for file in [&regular, &piped] {
        common::eval_ok(&toolbox, &format!("(load (compile-file {:?}))", file.display().to_string())).await;
    }
    // The definition's file is now a FIFO: opening it to read would wait for a writer.
    std::fs::remove_file(&piped).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&piped).status().unwrap().success());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/projects/tally").display().to_string();
    let mut client = McpClient::start(&["--port", &port.to_string(), "--read-only", "--root", &root]).await;
    client.initialize().await;
    let started = std::time::Instant::now();
    let found = client.call_tool("find-definition", json!({"symbol": "cl-user::ro-outside-fn"})).await;
    assert!(!is_error(&found), "{found}");
    assert!(
        text(&found)
            .contains("not read for its line: outside the server's roots and the image's ASDF systems' directories"),
        "{found}"
    );
    assert!(!text(&found).contains(":3:"), "no line without reading the file: {found}");
    let piped_found = client.call_tool("find-definition", json!({"symbol": "cl-user::ro-piped-fn"})).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "waited on the FIFO: {piped_found}");
    assert!(text(&piped_found).contains("not read for its line"), "{piped_found}");
    // Without --read-only the regular file is read for its line, the FIFO still not opened.
    let mut full = McpClient::start(&["--port", &port.to_string(), "--root", &root]).await;
    full.initialize().await;
    let found = full.call_tool("find-definition", json!({"symbol": "cl-user::ro-outside-fn"})).await;
    assert!(text(&found).contains(&format!("{}:3:1", regular.display())), "{found}");
    let piped_found = full.call_tool("find-definition", json!({"symbol": "cl-user::ro-piped-fn"})).await;
    assert!(text(&piped_found).contains("not a regular file, so not read for its line"), "{piped_found}");
}
