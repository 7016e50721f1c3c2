//! Handles and the inspect tool against a real image: walking into objects and hash tables,
//! reading cut output and a 2 MB string back in slices, the bound on handles, and their release
//! when the MCP session ends.

mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use swank_mcp::source::AllowedRoots;
use swank_mcp::tools::{group_thousands, Toolbox};

use common::{call, eval_ok, without_handle, McpClient};

/// A toolbox on `port` with the server's default output limit.
fn toolbox_with_default_limit(port: u16) -> Arc<Toolbox> {
    let settings = swank_mcp::tools::Settings { max_output: 16000, ..common::settings() };
    Arc::new(Toolbox::new(settings, vec![common::image_settings(port)], AllowedRoots::new(Vec::new()).unwrap()))
}

/// The handle at the end of the first line of `text` that contains `marker`.
fn handle_on_line(text: &str, marker: &str) -> String {
    let line = text.lines().find(|line| line.contains(marker)).unwrap_or_else(|| panic!("no {marker:?} in {text}"));
    let handle = line.rsplit(' ').next().unwrap();
    assert!(handle.starts_with('@'), "no handle at the end of {line:?}");
    handle.to_string()
}

async fn inspect(toolbox: &Arc<Toolbox>, arguments: serde_json::Value) -> String {
    let output = call(toolbox, "inspect", arguments.clone()).await;
    assert!(!output.is_error, "{arguments}: {}", output.text);
    output.text
}

/// The handle and offset a cut note names: `inspect @4 with offset 16000 for ...`.
fn note_target(text: &str) -> Option<(String, u64)> {
    let after = &text[text.rfind("inspect @")? + "inspect ".len()..];
    let mut words = after.split(' ');
    let handle = words.next()?.to_string();
    assert_eq!(words.next(), Some("with"), "{text}");
    assert_eq!(words.next(), Some("offset"), "{text}");
    let offset = words.next()?.trim_end_matches([']', ';']).parse().ok()?;
    Some((handle, offset))
}

/// Reads the text behind `handle` from `offset` to its end, slice by slice, following each
/// reply's note; returns it and how many slices it took.
async fn read_rest(toolbox: &Arc<Toolbox>, handle: &str, mut offset: u64) -> (String, usize) {
    let mut text = String::new();
    let mut slices = 0;
    loop {
        let reply = inspect(toolbox, json!({"handle": handle, "offset": offset})).await;
        slices += 1;
        let (header, body) = reply.split_once('\n').unwrap();
        assert!(header.starts_with(&format!("{handle} ")), "{header}");
        match body.rsplit_once("\n[... ") {
            Some((slice, note)) => {
                text.push_str(slice);
                let (next_handle, next) = note_target(note).unwrap();
                assert_eq!(next_handle, handle);
                assert_eq!(next, offset + slice.chars().count() as u64);
                offset = next;
            }
            None => {
                text.push_str(body);
                return (text, slices);
            }
        }
    }
}

#[tokio::test]
async fn a_handle_walks_two_levels_into_a_clos_object() {
    let toolbox = common::toolbox(common::shared_image_port());
    let text = eval_ok(
        &toolbox,
        "(defpackage :inspect-test (:use :cl)) (in-package :inspect-test)
         (defclass supplier () ((name :initarg :name) (cities :initarg :cities)))
         (defclass item () ((sku :initarg :sku) (supplier :initarg :supplier) (price :initarg :price)))
         (make-instance 'item :sku \"A-1\" :price 12
                        :supplier (make-instance 'supplier :name \"Acme\" :cities (list \"Oslo\" \"Lima\")))",
    )
    .await;
    assert!(text.starts_with("=> #<ITEM {"), "{text}");
    let item = handle_on_line(&text, "#<ITEM");

    let page = inspect(&toolbox, json!({"handle": item})).await;
    assert!(page.starts_with(&format!("{item} #<ITEM {{")), "{page}");
    assert!(page.contains("\nType: ITEM\n"), "{page}");
    assert!(page.contains("\nSlots (3):\n"), "{page}");
    assert!(page.contains("\n  PRICE = 12\n") || page.ends_with("\n  PRICE = 12"), "numbers get no handle: {page}");
    let supplier = handle_on_line(&page, "SUPPLIER = #<SUPPLIER");

    let page = inspect(&toolbox, json!({"handle": supplier})).await;
    assert!(page.contains("\n  NAME = \"Acme\" @"), "{page}");
    let cities = handle_on_line(&page, "CITIES = (\"Oslo\" \"Lima\")");
    let page = inspect(&toolbox, json!({"handle": cities})).await;
    assert!(page.contains("Elements (2):\n  0 = \"Oslo\" @"), "{page}");
    assert!(page.contains("\n  1 = \"Lima\" @"), "{page}");

    // The same object seen again keeps its handle.
    let again = inspect(&toolbox, json!({"handle": item})).await;
    assert_eq!(handle_on_line(&again, "SUPPLIER = #<SUPPLIER"), supplier);
}

#[tokio::test]
async fn a_handle_walks_two_levels_into_a_hash_table_and_pages_its_entries() {
    let toolbox = common::toolbox(common::shared_image_port());
    let text = eval_ok(
        &toolbox,
        "(let ((table (make-hash-table :test 'equal)))
           (setf (gethash \"stock\" table) (vector 10 20 30))
           (dotimes (i 60) (setf (gethash i table) (* i i)))
           table)",
    )
    .await;
    let table = handle_on_line(&text, "#<HASH-TABLE");
    let page = inspect(&toolbox, json!({"handle": table})).await;
    assert!(page.contains("Type: HASH-TABLE\nTest: EQUAL\nCount: 61"), "{page}");
    assert!(page.contains("Entries (key = value) (61, showing 0-49):"), "{page}");
    assert!(page.ends_with(&format!("[... 11 more; inspect {table} with offset 50 for the next]")), "{page}");
    let stock = handle_on_line(&page, "\"stock\" @");
    let key_line = page.lines().find(|line| line.contains("\"stock\" @")).unwrap();
    assert!(key_line.contains(" = #(10 20 30) @"), "a key that is an object has its own handle: {key_line}");

    let vector = inspect(&toolbox, json!({"handle": stock})).await;
    assert!(vector.contains("Length: 3"), "{vector}");
    assert!(vector.contains("Elements (3):\n  0 = 10\n  1 = 20\n  2 = 30"), "{vector}");

    let last = inspect(&toolbox, json!({"handle": table, "offset": 50})).await;
    assert!(last.contains("(61, showing 50-60):"), "{last}");
    assert!(last.contains("  59 = 3481"), "{last}");
}

#[tokio::test]
async fn a_two_megabyte_string_is_read_back_in_slices_through_its_handle() {
    let toolbox = toolbox_with_default_limit(common::shared_image_port());
    let code = "(let ((s (make-string 2000000)))
                  (dotimes (i 2000000 s) (setf (char s i) (code-char (+ 97 (mod (floor i 7) 26))))))";
    let text = eval_ok(&toolbox, code).await;
    let expected: String = (0..2_000_000u32).map(|i| char::from(b'a' + ((i / 7) % 26) as u8)).collect();
    let (shown, note) = text.split_once('\n').unwrap();
    assert_eq!(shown.chars().count(), "=> ".len() + 16000, "the value shows --max-output characters");
    assert!(note.starts_with("[... 1,984,002 more characters not shown: the limit is 16,000"), "{note}");
    let (handle, offset) = note_target(note).unwrap();
    assert_eq!(offset, 15999, "the printed text starts with a quote");
    assert_eq!(&shown[4..], &expected[..15999]);
    let (rest, slices) = read_rest(&toolbox, &handle, offset).await;
    assert_eq!(slices, 125);
    assert!(rest == expected[15999..], "the slices put together are the rest of the string");
}

#[tokio::test]
async fn cut_output_is_kept_behind_a_handle_and_read_back_whole() {
    let toolbox = toolbox_with_default_limit(common::shared_image_port());
    let text = eval_ok(&toolbox, "(dotimes (i 20000) (format t \"line ~D~%\" i))").await;
    let expected: String = (0..20000).map(|i| format!("line {i}\n")).collect();
    assert!(text.starts_with("[stdout]\nline 0\nline 1\n"), "{}", &text[..100]);
    let note = text.lines().find(|line| line.starts_with("[... ")).unwrap();
    assert!(
        note.contains(
            "more characters not shown, then the last 4,000: the limit is 16,000 per section (--max-output); inspect @"
        ),
        "{note}"
    );
    assert!(
        text.contains(&format!("{note}\n{}\n\n=> NIL", expected[expected.len() - 4000..].trim_end())),
        "the end is shown"
    );
    let (handle, offset) = note_target(note).unwrap();
    assert_eq!(offset, 12000);
    let (rest, _) = read_rest(&toolbox, &handle, offset).await;
    assert_eq!(rest, expected[12000..]);

    // A cut value's note names the handle of its whole printed text and the value's own.
    let text =
        eval_ok(&toolbox, "(loop for i below 5000 collect (list i (make-string 100 :initial-element #\\x)))").await;
    let note = text.lines().find(|line| line.starts_with("[... ")).unwrap();
    assert!(note.contains("; the value is @"), "{note}");
    let (printed, offset) = note_target(note).unwrap();
    let (rest, _) = read_rest(&toolbox, &printed, offset).await;
    assert!(
        rest.ends_with("\")\n ...)") && rest.contains("(199") && !rest.contains("(200"),
        "printed with *PRINT-LENGTH* 200: {rest}"
    );

    let output = call(
        &toolbox,
        "evaluate-lisp",
        json!({"code": "(loop for i below 5000 collect (list i (list (list (list i)))))", "print_length": 3, "print_level": 2}),
    )
    .await;
    assert!(output.text.starts_with("=> ((0 #) (1 #) (2 #) ...) @"), "{}", output.text);
}

#[tokio::test]
async fn inspect_explains_bad_handles_and_arguments() {
    let toolbox = common::toolbox(common::shared_image_port());
    let output = call(&toolbox, "inspect", json!({"handle": "@999999"})).await;
    assert!(output.is_error);
    assert!(
        output.text.starts_with("There is no handle @999999 yet in this session: the newest is @"),
        "{}",
        output.text
    );
    let output = call(&toolbox, "inspect", json!({"handle": "three"})).await;
    assert!(output.text.contains("\"three\" is not a handle"), "{}", output.text);
    let output = call(&toolbox, "inspect", json!({})).await;
    assert!(output.is_error && output.text.starts_with("Give `handle`"), "{}", output.text);
    let output = call(&toolbox, "inspect", json!({"code": "(/ 1 0)"})).await;
    assert!(output.is_error && output.text.contains("DIVISION-BY-ZERO"), "{}", output.text);
    let page = inspect(&toolbox, json!({"code": "#'mcp-agent-helper::handle-object"})).await;
    assert!(page.contains("Call: (MCP-AGENT-HELPER::HANDLE-OBJECT NAME)"), "{page}");
    assert!(page.contains("Source: "), "{page}");
}

#[tokio::test]
async fn the_bound_releases_the_oldest_handles_first() {
    let image = common::private_image().await;
    let toolbox = common::toolbox(image.port);
    eval_ok(&toolbox, "(setf mcp-agent-helper::*max-handles* 5)").await;
    let mut handles = Vec::new();
    for i in 0..8 {
        let text = eval_ok(&toolbox, &format!("(list {i})")).await;
        handles.push(handle_on_line(&text, &format!("({i})")));
    }
    assert_eq!(eval_ok(&toolbox, "(mcp-agent-helper:handle-count)").await, "=> 5");
    for old in &handles[..3] {
        let output = call(&toolbox, "inspect", json!({"handle": old})).await;
        assert!(output.is_error, "{old} should be released: {}", output.text);
        assert!(output.text.contains(&format!("Handle {old} was released")), "{}", output.text);
    }
    for kept in &handles[3..] {
        let page = inspect(&toolbox, json!({"handle": kept})).await;
        assert!(page.contains("Elements (1)"), "{page}");
    }

    // Kept text has a bound of its own: a second cut output of 50,000 characters releases the first.
    let toolbox = toolbox_with_default_limit(image.port);
    eval_ok(&toolbox, "(setf mcp-agent-helper::*max-kept-characters* 60000)").await;
    let mut cut = Vec::new();
    for _ in 0..2 {
        let text = eval_ok(&toolbox, "(write-string (make-string 50000 :initial-element #\\y))").await;
        let note = text.lines().find(|line| line.starts_with("[... ")).unwrap();
        cut.push(note_target(note).unwrap().0);
    }
    let output = call(&toolbox, "inspect", json!({"handle": cut[0], "offset": 16000})).await;
    assert!(output.text.contains("was released"), "{}", output.text);
    let page = inspect(&toolbox, json!({"handle": cut[1], "offset": 49990})).await;
    assert!(page.ends_with("characters 49990-49999:\nyyyyyyyyyy"), "{page}");
}

/// The handles every session of the image at `port` keeps, asked through a session of its own.
async fn handles_in_image(observer: &Arc<Toolbox>) -> u64 {
    let text = eval_ok(observer, "(mcp-agent-helper:handle-count)").await;
    text.trim_start_matches("=> ").parse().unwrap()
}

async fn handles_drop_to(observer: &Arc<Toolbox>, expected: u64) {
    for _ in 0..100 {
        if handles_in_image(observer).await == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the image still keeps {} handles", handles_in_image(observer).await);
}

#[tokio::test]
async fn handles_are_released_when_the_mcp_session_ends() {
    let image = common::private_image().await;
    let observer = common::toolbox(image.port);

    // The server exits when its client closes stdin: it ends its session in the image.
    let mut client = McpClient::for_port(image.port).await;
    client.initialize().await;
    for code in ["(list 1 2)", "(make-hash-table)", "(vector 1)"] {
        let reply = client.call_tool("evaluate-lisp", json!({ "code": code })).await;
        assert!(common::text(&reply).ends_with(" @1") || common::text(&reply).contains(" @"), "{reply}");
    }
    assert_eq!(handles_in_image(&observer).await, 3);
    client.close_stdin();
    let status = tokio::time::timeout(Duration::from_secs(20), client.child.wait()).await.unwrap().unwrap();
    assert!(status.success());
    handles_drop_to(&observer, 0).await;

    // A server killed outright cannot say so: its connection closing releases its handles.
    let mut client = McpClient::for_port(image.port).await;
    client.initialize().await;
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(list 1 2)"})).await;
    assert!(common::text(&reply).contains(" @1"), "{reply}");
    assert_eq!(handles_in_image(&observer).await, 1);
    client.child.kill().await.unwrap();
    handles_drop_to(&observer, 0).await;
}

#[tokio::test]
async fn a_cut_note_promises_only_what_the_image_kept() {
    let toolbox = toolbox_with_default_limit(common::shared_image_port());
    let output = call(
        &toolbox,
        "evaluate-lisp",
        json!({"code": "(loop for i below 1000000 collect i)", "print_length": 1000000}),
    )
    .await;
    assert!(!output.is_error, "{}", &output.text[..200]);
    let note = output.text.lines().find(|line| line.starts_with("[... ")).unwrap();
    // 6,888,890 digits, 999,999 spaces and lines' ends, 2 parentheses: the image keeps 1,024,000
    // characters of a printed value (64 x --max-output).
    let total = eval_ok(
        &toolbox,
        "(length (let ((*print-length* 1000000) (*print-level* 10) (*print-circle* t) (*print-pretty* t))
                   (prin1-to-string (loop for i below 1000000 collect i))))",
    )
    .await;
    let total: u64 = without_handle(&total).trim_start_matches("=> ").parse().unwrap();
    let not_kept = total - 1_024_000;
    assert!(
        note.starts_with(&format!(
            "[... {} more characters not shown: the limit is 16,000 per section (--max-output); inspect @",
            group_thousands(total - 16000)
        )),
        "{note}"
    );
    assert!(
        note.contains(&format!(
            " with offset 16000 for the next 1,008,000. The printed text stopped being kept at 1,024,000 characters: \
             the last {} were not kept; the value is @",
            group_thousands(not_kept)
        )),
        "{note}"
    );
    let (handle, _) = note_target(note).unwrap();
    let last = inspect(&toolbox, json!({"handle": handle, "offset": 1_023_000})).await;
    assert!(
        last.ends_with(&format!(
            "\n[end of the kept text: the {} characters written after it were not kept]",
            group_thousands(not_kept)
        )),
        "{}",
        &last[last.len() - 200..]
    );
    let past = inspect(&toolbox, json!({"handle": handle, "offset": 1_024_000})).await;
    assert!(past.contains("offset 1024000 is past the last, 1023999"), "{past}");
}
