//! `--audit-log`: the binary writes one JSON line per tool call, flushed when the call ends (read
//! here while the server still runs), that `jq` reads; and rotates the file past its size.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use common::McpClient;

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

/// A server, initialized, logging to `log` with `more` arguments.
async fn logging_client(log: &Path, more: &[&str]) -> McpClient {
    let port = common::shared_image_port().to_string();
    let mut client = McpClient::start(&[&["--port", &port, "--audit-log", log.to_str().unwrap()], more].concat()).await;
    client.initialize().await;
    client
}

/// Twelve calls of more than 100 characters of arguments each: past a log's size of 1K.
async fn call_twelve_times(client: &mut McpClient) {
    for i in 0..12 {
        client.call_tool("lisp-check-parens", json!({"code": format!("(list {i} \"{}\")", "x".repeat(100))})).await;
    }
}

#[tokio::test]
async fn each_call_is_a_json_line_as_soon_as_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let mut client = logging_client(&log, &[]).await;
    client.call_tool("evaluate-lisp", json!({"code": "(+ 40 2)"})).await;
    let entries = lines(&log);
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    assert_eq!(
        (&entry["client"], &entry["tool"], &entry["arguments"], &entry["outcome"], &entry["summary"]),
        (&json!("tests"), &json!("evaluate-lisp"), &json!({"code": "(+ 40 2)"}), &json!("ok"), &json!("=> 42")),
        "{entry}"
    );
    assert!(entry["duration_ms"].is_u64() && entry["time"].as_str().unwrap().ends_with('Z'), "{entry}");
    client.call_tool("evaluate-lisp", json!({"code": "(car 1)"})).await;
    client.call_tool("no-such-tool", json!({})).await;
    let jq = Command::new("jq").args(["-r", ".outcome"]).arg(&log).output().expect("jq runs (apt-get install jq)");
    assert!(jq.status.success(), "{}", String::from_utf8_lossy(&jq.stderr));
    assert_eq!(String::from_utf8_lossy(&jq.stdout), "ok\nerror\nunknown_tool\n");
}

#[tokio::test]
async fn the_log_is_rotated_past_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let mut client = logging_client(&log, &["--audit-log-max-size", "1K"]).await;
    call_twelve_times(&mut client).await;
    let current = lines(&log);
    let rotated = lines(&dir.path().join("audit.jsonl.1"));
    assert!(!current.is_empty() && !rotated.is_empty(), "{current:?} {rotated:?}");
    assert!(std::fs::metadata(&log).unwrap().len() <= 1024);
    assert_eq!(current.last().unwrap()["arguments"]["code"].as_str().unwrap().split(' ').nth(1), Some("11"));
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The log holds every call's arguments: it and its rotated file are readable by their owner
/// alone, and a log an older swank-mcp left open to others is closed to them (issue 29.4).
#[tokio::test]
async fn the_log_and_its_rotated_file_are_readable_by_their_owner_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let mut client = logging_client(&log, &["--audit-log-max-size", "1K"]).await;
    assert_eq!(mode(&log), 0o600);
    call_twelve_times(&mut client).await;
    assert_eq!((mode(&log), mode(&dir.path().join("audit.jsonl.1"))), (0o600, 0o600));

    let older = dir.path().join("older.jsonl");
    std::fs::write(&older, "{}\n").unwrap();
    std::fs::set_permissions(&older, std::fs::Permissions::from_mode(0o664)).unwrap();
    let _client = logging_client(&older, &[]).await;
    assert_eq!(mode(&older), 0o600);
    assert_eq!(std::fs::read_to_string(&older).unwrap(), "{}\n", "what it held is kept");
}
