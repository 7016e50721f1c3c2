//! The Emacs package `elisp-compat/swank-mcp.el` and its parts by concern (`swank-mcp-*.el`): they
//! byte-compile without a warning, checkdoc and package-lint find nothing, each file is under 800
//! lines, and its ERT suite passes in a real Emacs running a real SLIME session, including
//! the end-to-end test that drives this crate's binary against the port `swank-mcp-start` opens.

mod common;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn elisp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("elisp-compat")
}

/// The package's files: `swank-mcp.el`, then its parts, the ERT suite left out.
fn package_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(elisp_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("swank-mcp") && name.ends_with(".el") && name != "swank-mcp-tests.el")
        .collect();
    files.sort_by_key(|name| (name != "swank-mcp.el", name.clone()));
    files
}

#[test]
fn the_package_is_split_by_concern_into_files_under_800_lines() {
    let files = package_files();
    for part in ["swank-mcp.el", "swank-mcp-activity.el", "swank-mcp-undo.el", "swank-mcp-approval.el"] {
        assert!(files.iter().any(|file| file == part), "{part} is missing from {files:?}");
    }
    for file in &files {
        let lines = std::fs::read_to_string(elisp_dir().join(file)).unwrap().lines().count();
        assert!(lines < 800, "{file} has {lines} lines: split it further by concern");
    }
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
    let mut files = package_files();
    files.push("swank-mcp-tests.el".to_string());
    for file in &files {
        std::fs::copy(elisp_dir().join(file), dir.path().join(file)).unwrap();
    }
    let mut args = vec!["-Q", "-L", ".", "--eval", "(setq byte-compile-error-on-warn t)", "-f", "batch-byte-compile"];
    args.extend(files.iter().map(String::as_str));
    let output = emacs(dir.path(), &args, &[], Duration::from_secs(60));
    let said = transcript(&output);
    assert!(output.status.success() && !said.contains("Warning"), "{said}");
    for file in &files {
        assert!(dir.path().join(format!("{file}c")).is_file(), "{file} was not compiled: {said}");
    }

    for file in package_files() {
        let check = format!(
            "(progn (require 'checkdoc) (setq checkdoc-spellcheck-documentation-flag nil) (checkdoc-file {file:?}))"
        );
        let output = emacs(dir.path(), &["-Q", "--eval", &check], &[], Duration::from_secs(60));
        let said = transcript(&output);
        assert!(output.status.success() && !said.contains(&format!("{file}:")), "checkdoc: {said}");
    }
}

#[test]
fn the_package_is_package_lint_clean() {
    if !common::have(common::Needed::PackageLint) {
        return;
    }
    // Each part is checked as a file of the package whose main file is swank-mcp.el.
    let files = package_files();
    let mut args = vec![
        "-L",
        ".",
        "-l",
        "package-lint",
        "--eval",
        "(setq package-lint-main-file \"swank-mcp.el\")",
        "-f",
        "package-lint-batch-and-exit",
    ];
    args.extend(files.iter().map(String::as_str));
    let output = emacs(&elisp_dir(), &args, &[], Duration::from_secs(60));
    let said = transcript(&output);
    assert!(
        output.status.success() && !files.iter().any(|file| said.contains(&format!("{file}:"))),
        "package-lint: {said}"
    );
}

/// Installed as a package, only its autoloads are loaded at start-up: they must leave SLIME's keys
/// and hooks as they are, the commands merely known. Turning swank-mcp on is the person's act.
#[test]
fn the_packages_autoloads_bind_no_key_and_add_no_hook() {
    if !common::have(common::Needed::EmacsWithSlime) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for file in package_files() {
        std::fs::copy(elisp_dir().join(&file), dir.path().join(&file)).unwrap();
    }
    let check = r#"(progn
  (require 'slime)
  (let* ((hooks '(slime-mode-hook slime-connected-hook slime-net-process-close-hooks slime-before-compile-functions))
         (before (mapcar #'symbol-value hooks))
         (keys (copy-keymap slime-mode-map)))
    (make-directory-autoloads "." (expand-file-name "swank-mcp-autoloads.el"))
    (load (expand-file-name "swank-mcp-autoloads.el") nil t)
    (unless (fboundp 'swank-mcp-activity) (error "The autoloads do not know swank-mcp-activity"))
    (when (featurep 'swank-mcp) (error "Loading the autoloads loaded the package"))
    (unless (equal before (mapcar #'symbol-value hooks)) (error "The autoloads changed a hook: %S" hooks))
    (unless (equal keys slime-mode-map) (error "The autoloads changed slime-mode-map"))
    (princ "untouched")))"#;
    let output = emacs(dir.path(), &["--eval", check], &[], Duration::from_secs(60));
    let said = transcript(&output);
    assert!(output.status.success() && said.contains("untouched"), "{said}");
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
