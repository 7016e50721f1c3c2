//! The Emacs package `elisp-compat/swank-mcp.el`: it byte-compiles without a warning, checkdoc
//! finds nothing, and its ERT suite passes in a real Emacs running a real SLIME session, including
//! the end-to-end test that drives this crate's binary against the port `swank-mcp-start` opens.

mod common;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn elisp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("elisp-compat")
}

/// Runs `emacs --batch ARGS` in `dir`, killing it after `limit`.
fn emacs(dir: &Path, args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Output {
    let mut child = Command::new("emacs")
        .current_dir(dir)
        .arg("--batch")
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("emacs runs (common::have checked)");
    // Both pipes are drained on threads so that a chatty Emacs can never block on them.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "emacs {args:?} did not finish within {limit:?}:\n{}",
                String::from_utf8_lossy(&stderr.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

fn transcript(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn the_package_byte_compiles_without_warnings_and_passes_checkdoc() {
    if !common::have(common::Needed::Emacs) {
        return;
    }
    // Compiled in a copy, without SLIME or SLY on the load path (-Q), so that the package cannot
    // depend on either at compile time and no .elc lands in the source tree.
    let dir = tempfile::tempdir().unwrap();
    for file in ["swank-mcp.el", "swank-mcp-tests.el"] {
        std::fs::copy(elisp_dir().join(file), dir.path().join(file)).unwrap();
    }
    let output = emacs(
        dir.path(),
        &[
            "-Q",
            "-L",
            ".",
            "--eval",
            "(setq byte-compile-error-on-warn t)",
            "-f",
            "batch-byte-compile",
            "swank-mcp.el",
            "swank-mcp-tests.el",
        ],
        &[],
        Duration::from_secs(60),
    );
    let said = transcript(&output);
    assert!(output.status.success() && !said.contains("Warning"), "{said}");
    assert!(dir.path().join("swank-mcp.elc").is_file());

    let check = "(progn (require 'checkdoc) (setq checkdoc-spellcheck-documentation-flag nil) (checkdoc-file \"swank-mcp.el\"))";
    let output = emacs(dir.path(), &["-Q", "--eval", check], &[], Duration::from_secs(60));
    let said = transcript(&output);
    assert!(output.status.success() && !said.contains("swank-mcp.el:"), "checkdoc: {said}");
}

#[test]
fn the_package_is_package_lint_clean() {
    if !common::have(common::Needed::PackageLint) {
        return;
    }
    let output = emacs(
        &elisp_dir(),
        &["-l", "package-lint", "-f", "package-lint-batch-and-exit", "swank-mcp.el"],
        &[],
        Duration::from_secs(60),
    );
    let said = transcript(&output);
    assert!(output.status.success() && !said.contains("swank-mcp.el:"), "package-lint: {said}");
}

/// The ERT suite in a real Emacs (with Debian's site start-up, which puts SLIME on the load path).
fn run_ert(backend: &[(&str, &str)]) {
    let program = env!("CARGO_BIN_EXE_swank-mcp");
    let mut envs = vec![("SWANK_MCP_BIN", program)];
    envs.extend_from_slice(backend);
    let dir = elisp_dir();
    let dir_arg = dir.to_str().unwrap();
    let tests = dir.join("swank-mcp-tests.el");
    // The first SLIME start compiles swank and its contribs into the fasl cache (a minute or two).
    let output = emacs(
        &dir,
        &["-L", dir_arg, "-l", tests.to_str().unwrap(), "-f", "ert-run-tests-batch-and-exit"],
        &envs,
        Duration::from_secs(600),
    );
    let said = transcript(&output);
    assert!(output.status.success(), "the ERT suite failed:\n{said}");
    assert!(said.contains("0 unexpected") && !said.contains("skipped"), "{said}");
}

#[test]
fn ert_suite_passes_with_a_real_slime_session() {
    if !common::have(common::Needed::EmacsWithSlime) {
        return;
    }
    run_ert(&[]);
}

/// SLY is not packaged in Debian: point `SWANK_MCP_SLY_DIR` at a SLY checkout and run
/// `cargo test --test emacs -- --ignored`.
#[test]
#[ignore = "needs a SLY checkout in SWANK_MCP_SLY_DIR"]
fn ert_suite_passes_with_a_real_sly_session() {
    let sly = std::env::var("SWANK_MCP_SLY_DIR").expect("SWANK_MCP_SLY_DIR names a SLY checkout");
    run_ert(&[("SWANK_MCP_TEST_BACKEND", "sly"), ("SWANK_MCP_SLY_DIR", &sly)]);
}
