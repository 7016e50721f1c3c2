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
    let older_rotated = dir.path().join("older.jsonl.1");
    std::fs::write(&older_rotated, "{}\n").unwrap();
    std::fs::set_permissions(&older_rotated, std::fs::Permissions::from_mode(0o644)).unwrap();
    let _client = logging_client(&older, &[]).await;
    assert_eq!((mode(&older), mode(&older_rotated)), (0o600, 0o600));
    assert_eq!(std::fs::read_to_string(&older).unwrap(), "{}\n", "what it held is kept");
    assert_eq!(std::fs::read_to_string(&older_rotated).unwrap(), "{}\n");
}

/// `swank-mcp eval` with `--audit-log log`, which opens the log as the server does: whether it
/// succeeded, and its stderr.
fn eval_logging_to(log: &Path) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--port", &common::shared_image_port().to_string(), "--audit-log", log.to_str().unwrap()])
        .args(["eval", "(+ 1 2)"])
        .output()
        .unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A file with `text` and mode `0644`: what a log must not be written into, nor made `0600`.
fn someone_elses_file(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// The log is opened without following a symbolic link (issue 36.3): the link's target would be
/// made `0600` and get every call's arguments. FILE.1 is checked as well.
#[test]
fn a_log_or_rotated_file_that_is_a_symlink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    someone_elses_file(&target, "theirs\n");
    let log = dir.path().join("audit.jsonl");
    std::os::unix::fs::symlink(&target, &log).unwrap();
    let (ok, stderr) = eval_logging_to(&log);
    assert!(!ok && stderr.contains("cannot open the audit log") && stderr.contains("is a symbolic link"), "{stderr}");
    assert_eq!((std::fs::read_to_string(&target).unwrap().as_str(), mode(&target)), ("theirs\n", 0o644));

    let log = dir.path().join("other.jsonl");
    std::os::unix::fs::symlink(&target, dir.path().join("other.jsonl.1")).unwrap();
    let (ok, stderr) = eval_logging_to(&log);
    assert!(!ok && stderr.contains("other.jsonl.1, the file the log is rotated to, is a symbolic link"), "{stderr}");
    assert_eq!((std::fs::read_to_string(&target).unwrap().as_str(), mode(&target)), ("theirs\n", 0o644));
    assert!(!log.exists(), "nothing is created before the checks pass");
}

/// Gives `path` to `nobody`; false (the test is skipped) when the tests do not run as root.
fn give_to_nobody(path: &Path) -> bool {
    const NOBODY: u32 = 65534;
    match std::os::unix::fs::chown(path, Some(NOBODY), None) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            common::skip(&format!("giving a file to another user needs root: {e}"));
            false
        }
        Err(e) => panic!("chown {}: {e}", path.display()),
    }
}

/// A log that belongs to another user is refused (issue 36.3): a server run as root wrote its
/// calls' arguments into it and made it `0600`. So is such a FILE.1, which rotation would replace.
#[test]
fn a_log_or_rotated_file_of_another_user_is_refused() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    someone_elses_file(&log, "theirs\n");
    if !give_to_nobody(&log) {
        return;
    }
    let (ok, stderr) = eval_logging_to(&log);
    assert!(!ok && stderr.contains("belongs to another user (uid 65534)"), "{stderr}");
    assert_eq!((std::fs::read_to_string(&log).unwrap().as_str(), mode(&log)), ("theirs\n", 0o644));

    let log = dir.path().join("other.jsonl");
    let rotated = dir.path().join("other.jsonl.1");
    someone_elses_file(&rotated, "theirs\n");
    give_to_nobody(&rotated);
    let (ok, stderr) = eval_logging_to(&log);
    assert!(
        !ok && stderr.contains("other.jsonl.1, the file the log is rotated to, belongs to another user"),
        "{stderr}"
    );
    let kept = std::fs::metadata(&rotated).unwrap();
    assert_eq!(
        (std::fs::read_to_string(&rotated).unwrap().as_str(), mode(&rotated), kept.uid()),
        ("theirs\n", 0o644, 65534)
    );
}

/// Two servers append to one log (issue 40). It is full: the first line rotates it. Each server
/// used to count only its own lines, so the second one rotated the log again, over FILE.1, and
/// the first file was lost; now each reads the file's real size under a lock, and the one that
/// did not rotate moves to the new file.
#[tokio::test]
async fn two_servers_sharing_a_log_rotate_it_once_and_keep_every_line() {
    const MAX: usize = 16 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    // Within 50 bytes of the limit, which any call's line passes.
    let mut seed = String::new();
    for i in 0.. {
        let line = format!("{{\"seed\":{i}}}\n");
        if seed.len() + line.len() > MAX - 50 {
            break;
        }
        seed.push_str(&line);
    }
    std::fs::write(&log, &seed).unwrap();
    let mut first = logging_client(&log, &["--audit-log-max-size", "16K"]).await;
    let mut second = logging_client(&log, &["--audit-log-max-size", "16K"]).await;
    async fn calls(client: &mut McpClient, server: &str) {
        for i in 0..12 {
            client
                .call_tool("lisp-check-parens", json!({"code": format!("({server} {i} \"{}\")", "x".repeat(100))}))
                .await;
        }
    }
    tokio::join!(calls(&mut first, "first"), calls(&mut second, "second"));

    let rotated = dir.path().join("audit.jsonl.1");
    assert_eq!(std::fs::read_to_string(&rotated).unwrap(), seed, "FILE.1 holds the full log, whole");
    let mut codes: Vec<String> =
        lines(&log).iter().map(|entry| entry["arguments"]["code"].as_str().unwrap().to_string()).collect();
    codes.sort();
    let mut expected: Vec<String> = ["first", "second"]
        .iter()
        .flat_map(|server| (0..12).map(move |i| format!("({server} {i} \"{}\")", "x".repeat(100))))
        .collect();
    expected.sort();
    assert_eq!(codes, expected, "each call's line, once");
    assert!(std::fs::metadata(&log).unwrap().len() <= MAX as u64);
}
