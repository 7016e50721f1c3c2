//! The binary driven by a real MCP client: the official Python SDK (`pip install mcp`), with its
//! `ClientSession` (the `initialize` handshake) and its `mcp.Client` pinned to revision 2026-07-28
//! and in auto mode (which probes `server/discover`), against a real image. The checks themselves
//! are in `tests/python/sdk_e2e.py` and `tests/python/sdk_approval.py`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_python_sdk_talks_to_the_binary() {
    if !common::have(common::Needed::PythonSdk) {
        return;
    }
    let port = common::shared_image_port().to_string();
    run_script("sdk_e2e.py", &[env!("CARGO_BIN_EXE_swank-mcp"), &port]);
}

/// `--confirm` with the SDK answering `elicitation/create` (declining, then accepting), and the
/// audit log those calls leave.
#[test]
fn the_python_sdk_approves_and_declines_calls() {
    if !common::have(common::Needed::PythonSdk) {
        return;
    }
    let port = common::shared_image_port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    run_script("sdk_approval.py", &[env!("CARGO_BIN_EXE_swank-mcp"), &port, audit.to_str().unwrap()]);
}

/// Runs `tests/python/SCRIPT` with `args`; it must succeed.
fn run_script(script: &str, args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python").join(script);
    let mut child =
        Command::new("python3").arg(&script).args(args).stdin(Stdio::null()).spawn().expect("python3 starts");
    // The script bounds each client at 60 s; this bounds the interpreter itself.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(180) {
            let _ = child.kill();
            panic!("the SDK script did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "the SDK script failed ({status}); its output is above");
}
