//! run-tests against real SBCL + cl-swank images, each suite's counts compared with what the same
//! suite prints when `sbcl --non-interactive` runs it from a shell: FiveAM's own tests (which run
//! FiveAM inside tests), an `app` + `app/tests` project whose test-op is what loads FiveAM, RT
//! suites (Debian's alexandria-tests and a project of ours), a Parachute suite (opt-in: Parachute
//! is not in Debian); and the compiler's and reader's
//! messages at file:line:column when a system cannot be built. The projects are in
//! fixtures/projects/.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use swank_mcp::tools::{ToolOutput, Toolbox};

async fn call(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> ToolOutput {
    common::call_within(toolbox, tool, arguments, Duration::from_secs(300)).await
}

fn project(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/projects").join(path)
}

fn asd(path: &str) -> String {
    project(path).display().to_string()
}

/// What `sbcl --non-interactive` prints (stdout and stderr) after evaluating each of `forms`,
/// with ASDF required first.
async fn shell(forms: &[String]) -> String {
    let mut command = tokio::process::Command::new("sbcl");
    command.args(["--noinform", "--non-interactive", "--eval", "(require :asdf)"]);
    for form in forms {
        command.args(["--eval", form]);
    }
    let output = tokio::time::timeout(Duration::from_secs(300), command.kill_on_drop(true).output())
        .await
        .expect("sbcl finishes within 5 minutes")
        .expect("sbcl runs");
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// `(asdf:load-asd "ASD")` for each of `asds`, then `(asdf:test-system "SYSTEM")`, in a shell.
async fn shell_test_system(asds: &[&str], system: &str) -> String {
    let mut forms: Vec<String> = asds.iter().map(|asd| format!("(asdf:load-asd {asd:?})")).collect();
    forms.push(format!("(asdf:test-system {system:?})"));
    shell(&forms).await
}

async fn register(toolbox: &Arc<Toolbox>, asds: &[&str]) {
    let loads: Vec<String> = asds.iter().map(|asd| format!("(asdf:load-asd {asd:?})")).collect();
    common::eval_ok(toolbox, &format!("(require :asdf) {}", loads.join(" "))).await;
}

/// The number after `label` on the first line, from `from`, that starts with it (leading blanks
/// aside).
fn number_after(text: &str, label: &str) -> u64 {
    text.lines()
        .map(str::trim_start)
        .find_map(|line| line.strip_prefix(label))
        .and_then(|rest| rest.trim_start().split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no line starting {label:?} in:\n{text}"))
}

/// FiveAM's summary of its last `run!`: (checks, pass, skip, fail).
fn fiveam_summary(output: &str) -> (u64, u64, u64, u64) {
    let last = &output[output.rfind(" Did ").unwrap_or_else(|| panic!("no FiveAM summary in:\n{output}"))..];
    (number_after(last, "Did"), number_after(last, "Pass:"), number_after(last, "Skip:"), number_after(last, "Fail:"))
}

/// The one entry of `results` for `framework`, from a run-tests reply.
fn results_of(output: &ToolOutput, framework: &str) -> Value {
    let structured = output.structured_value().unwrap();
    let results = structured["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 1, "one framework's run: {}", output.text);
    assert_eq!(results[0]["framework"], framework, "{}", output.text);
    results[0].clone()
}

fn count(results: &Value, key: &str) -> u64 {
    results[key].as_u64().unwrap_or_else(|| panic!("no {key} in {results}"))
}

/// Compares run-tests' counts with FiveAM's own summary printed by the shell's run.
fn assert_fiveam_counts_match(output: &ToolOutput, shell_output: &str) {
    let (checks, pass, skip, fail) = fiveam_summary(shell_output);
    let results = results_of(output, "FiveAM");
    let counted =
        count(&results, "passed") + count(&results, "failed") + count(&results, "errors") + count(&results, "skipped");
    assert_eq!(
        (
            counted,
            count(&results, "passed"),
            count(&results, "skipped"),
            count(&results, "failed") + count(&results, "errors")
        ),
        (checks, pass, skip, fail),
        "the shell's run printed Did {checks} checks, Pass: {pass}, Skip: {skip}, Fail: {fail}; run-tests said:\n{}",
        output.text
    );
    assert_eq!(output.is_error, fail > 0, "{}", output.text);
    // The reply's own [stdout] says the same as the shell.
    assert_eq!(fiveam_summary(&output.text), (checks, pass, skip, fail), "{}", output.text);
}

#[tokio::test]
async fn fiveam_own_tests_count_only_the_outermost_run() {
    // FiveAM's tests run FiveAM inside tests, some of them failing on purpose.
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    let shell_output = shell(&["(asdf:test-system :fiveam)".to_string()]).await;
    let output = call(&tb, "run-tests", json!({"system": "fiveam"})).await;
    assert!(output.text.starts_with("Ran asdf:test-system \"fiveam\" in "), "{}", output.text);
    assert_fiveam_counts_match(&output, &shell_output);
    drop(image);
}

#[tokio::test]
async fn a_test_op_that_loads_fiveam_is_read_in_a_fresh_image() {
    // The usual layout: `inventory` and `inventory/tests`, which alone depends on FiveAM, so the
    // test-op is what loads it.
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    let inventory = asd("inventory/inventory.asd");
    register(&tb, &[&inventory]).await;
    assert_eq!(common::eval_ok(&tb, "(find-package :it.bese.fiveam)").await, "=> NIL", "FiveAM is not loaded yet");
    let shell_output = shell_test_system(&[&inventory], "inventory").await;
    let output = call(&tb, "run-tests", json!({"system": "inventory"})).await;
    assert_fiveam_counts_match(&output, &shell_output);
    assert!(output.is_error, "a check failed: {}", output.text);
    assert!(shell_output.contains("MISSING-ITEMS-COUNT-ZERO in ALL-TESTS"), "{shell_output}");
    assert!(
        output.text.contains(
            "[FAIL] INVENTORY-TESTS::MISSING-ITEMS-COUNT-ZERO\n  Form: (= 0 (INVENTORY:QUANTITY (INVENTORY:MAKE-STOCK) \
             \"washer\"))\n  Expected: 0\n  Actual: 1"
        ),
        "{}",
        output.text
    );
    drop(image);
}

/// RT's summary of each `do-tests` in a shell's output: the tests run, and the names of those that
/// failed, as RT prints them.
fn rt_summary(output: &str) -> (u64, Vec<String>) {
    let tests = output
        .lines()
        .filter_map(|line| line.strip_prefix("Doing "))
        .map(|rest| rest.split(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    let mut failed = Vec::new();
    let mut rest = output;
    while let Some(at) = rest.find(" total tests failed: ") {
        let names = &rest[at + " total tests failed: ".len()..];
        // The list ends with a full stop that no name character follows (names have dots).
        let end = names
            .char_indices()
            .find(|&(i, c)| {
                c == '.' && names[i + 1..].chars().next().is_none_or(|next| next.is_whitespace() || next == ';')
            })
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("no end to RT's list of failures in:\n{names}"));
        failed.extend(names[..end].split(',').map(str::trim).filter(|name| !name.is_empty()).map(String::from));
        rest = &names[end..];
    }
    assert!(tests > 0, "no RT run in:\n{output}");
    (tests, failed)
}

/// Compares run-tests' RT counts and failing tests with the shell's run.
fn assert_rt_matches(output: &ToolOutput, shell_output: &str) {
    let (tests, mut failed) = rt_summary(shell_output);
    let results = results_of(output, "RT");
    let mut reported: Vec<String> =
        results["failures"].as_array().unwrap().iter().map(|f| f["test"].as_str().unwrap().to_string()).collect();
    assert_eq!(
        (count(&results, "tests"), count(&results, "passed"), count(&results, "failed") + count(&results, "errors")),
        (tests, tests - failed.len() as u64, failed.len() as u64),
        "the shell's run did {tests} tests, {} failed; run-tests said:\n{}",
        failed.len(),
        output.text
    );
    failed.sort();
    reported.sort();
    assert_eq!(reported, failed, "{}", output.text);
    assert_eq!(output.is_error, !failed.is_empty(), "{}", output.text);
}

#[tokio::test]
async fn rt_suites_are_counted_as_the_shell_counts_them() {
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    // Debian's cl-alexandria ships Alexandria's RT tests; its test-op runs them twice.
    let shell_output = shell(&["(asdf:test-system :alexandria-tests)".to_string()]).await;
    let output = call(&tb, "run-tests", json!({"system": "alexandria-tests"})).await;
    assert_rt_matches(&output, &shell_output);
    assert!(output.text.contains("\nRT: "), "{}", output.text);

    drop(image);
}

#[tokio::test]
async fn an_rt_suite_with_failures_names_them_as_the_shell_does() {
    // RT's DO-TESTS runs every RT test the image has: an image of its own.
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    // A test whose values differ and one that signals.
    let ledger = asd("ledger-rt/ledger-rt.asd");
    register(&tb, &[&ledger]).await;
    let shell_output = shell_test_system(&[&ledger], "ledger-rt").await;
    let output = call(&tb, "run-tests", json!({"system": "ledger-rt"})).await;
    assert_rt_matches(&output, &shell_output);
    assert!(output.text.contains("RT: 5 tests, 5 checks: 3 passed, 1 failed, 1 errors, 0 skipped."), "{}", output.text);
    assert!(
        output.text.contains(
            "[FAIL] LEDGER-RT::BALANCE.DEBIT\n  Form: (LEDGER-RT::BALANCE '((:CREDIT 10) (:DEBIT 4)))\n  Expected: 6\n  Actual: 14"
        ),
        "{}",
        output.text
    );
    assert!(
        output.text.contains(
            "[ERROR] LEDGER-RT::BALANCE.BAD-ENTRY\n  Form: (LEDGER-RT::BALANCE '((:CREDIT \"ten\")))\n  Reason: The test \
             signalled #<TYPE-ERROR expected-type: NUMBER datum: \"ten\">."
        ),
        "{}",
        output.text
    );
    // One RT test by name; RT has no suites.
    let output =
        call(&tb, "run-tests", json!({"system": "ledger-rt", "test": "ledger-rt::balance.multiple-values"})).await;
    assert!(!output.is_error, "{}", output.text);
    assert!(
        output.text.starts_with("Ran RT test LEDGER-RT::BALANCE.MULTIPLE-VALUES in ")
            && output.text.contains("RT: 1 tests, 1 checks: 1 passed, 0 failed"),
        "{}",
        output.text
    );
    let output = call(&tb, "run-tests", json!({"system": "ledger-rt", "suite": "ledger-rt::balance.debit"})).await;
    assert!(output.is_error && output.text.contains("RT has no suites"), "{}", output.text);
    // RT's tests are near names too.
    let output = call(&tb, "run-tests", json!({"system": "ledger-rt", "test": "ledger-rt::balance.debits"})).await;
    assert!(output.text.contains("Did you mean LEDGER-RT::BALANCE.DEBIT"), "{}", output.text);
    drop(image);
}

#[tokio::test]
async fn a_suite_named_in_the_wrong_package_gets_near_names() {
    let _asdf = common::shared_asdf_turn().await;
    let tb = common::toolbox(common::shared_image_port());
    register(&tb, &[&asd("inventory/inventory.asd")]).await;
    call(&tb, "load-system", json!({"system": "inventory/tests"})).await;
    let output = call(&tb, "run-tests", json!({"system": "inventory/tests", "suite": "all-tests"})).await;
    assert!(output.is_error);
    assert_eq!(output.text, "Symbol ALL-TESTS not found in package CL-USER. Did you mean INVENTORY-TESTS::ALL-TESTS?");
    // A symbol that exists but names no test: the tests near it.
    let output = call(&tb, "run-tests", json!({"system": "inventory/tests", "suite": "inventory:quantity"})).await;
    assert!(output.is_error);
    assert!(output.text.starts_with("INVENTORY:QUANTITY names no test or suite of FiveAM"), "{}", output.text);
}

#[tokio::test]
async fn a_read_error_is_shown_at_its_line_with_the_readers_message() {
    let _asdf = common::shared_asdf_turn().await;
    let tb = common::toolbox(common::shared_image_port());
    let shelf = asd("shelf/shelf.asd");
    register(&tb, &[&shelf]).await;
    let tests_file = project("shelf/tests.lisp").display().to_string();
    // The shell says which line; so must every tool.
    let shell_output =
        shell(&[format!("(asdf:load-asd {shelf:?})"), "(asdf:load-system \"shelf/tests\")".into()]).await;
    assert!(shell_output.contains("The symbol \"FIND-ITEM\" is not external in the SHELF package."), "{shell_output}");
    let line = number_after(&shell_output[shell_output.find("Line:").unwrap()..], "Line:");
    let message = "ERROR: READ error during COMPILE-FILE: The symbol \"FIND-ITEM\" is not external in the SHELF \
                   package. SHELF::FIND-ITEM exists, but SHELF does not export it: export it, or write SHELF::FIND-ITEM.";
    // The column is where the symbol starts: (shelf:find-item on the line.
    let at = format!("  at: {tests_file}:{line}:23");

    let output = call(&tb, "load-system", json!({"system": "shelf/tests"})).await;
    assert!(output.is_error);
    assert!(output.text.starts_with(&format!("[errors]\n{message}\n{at}\n\n[ERROR] ")), "{}", output.text);
    assert!(output.text.contains("\n1 error, 0 warnings, "), "{}", output.text);
    assert_eq!(output.structured_value().unwrap()["error_count"], 1);

    let output = call(&tb, "run-tests", json!({"system": "shelf/tests"})).await;
    assert!(output.is_error);
    assert!(output.text.starts_with(&format!("[compiler errors]\n{message}\n{at}\n\n[ERROR] ")), "{}", output.text);
    assert!(
        output.text.ends_with("No tests ran: building \"shelf/tests\" failed after ")
            || output.text.contains("No tests ran: building \"shelf/tests\" failed after "),
        "{}",
        output.text
    );

    // load-file names the file relative to its root, with the line too.
    call(&tb, "load-system", json!({"system": "fiveam"})).await;
    let output = call(&tb, "load-file", json!({"file_path": tests_file})).await;
    assert!(output.is_error);
    assert!(
        output.text.contains(&format!("{message}\n  at: fixtures/projects/shelf/tests.lisp:{line}:23")),
        "{}",
        output.text
    );

    // A symbol typed at the REPL gets the same word on it.
    let output = call(&tb, "evaluate-lisp", json!({"code": "(shelf:find-item (shelf:make-shelf 1) 1)"})).await;
    assert!(
        output
            .text
            .contains("SHELF::FIND-ITEM exists, but SHELF does not export it: export it, or write SHELF::FIND-ITEM."),
        "{}",
        output.text
    );
}

/// Parachute's summary as its plain report prints it: (passed, failed, skipped).
fn parachute_summary(output: &str) -> (u64, u64, u64) {
    let last = &output[output.rfind("Passed:").unwrap_or_else(|| panic!("no Parachute summary in:\n{output}"))..];
    (number_after(last, "Passed:"), number_after(last, "Failed:"), number_after(last, "Skipped:"))
}

/// Parachute is not packaged in Debian: point `SWANK_MCP_PARACHUTE_DIR` at a directory holding
/// Parachute and what it depends on (documentation-utils, trivial-indent, form-fiddle,
/// trivial-custom-debugger) and run `cargo test --test run_tests -- --ignored`.
#[tokio::test]
#[ignore = "needs Parachute's sources in SWANK_MCP_PARACHUTE_DIR"]
async fn a_parachute_suite_is_counted_as_the_shell_counts_it() {
    let sources = std::env::var("SWANK_MCP_PARACHUTE_DIR").expect("SWANK_MCP_PARACHUTE_DIR names Parachute's sources");
    let registry =
        format!("(asdf:initialize-source-registry '(:source-registry (:tree {sources:?}) :inherit-configuration))");
    let orbit = asd("orbit/orbit.asd");
    let shell_output =
        shell(&[registry.clone(), format!("(asdf:load-asd {orbit:?})"), "(asdf:test-system \"orbit\")".into()]).await;
    let (passed, failed, skipped) = parachute_summary(&shell_output);

    // A fresh image, so that the test-op is what loads Parachute.
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    common::eval_ok(&tb, &format!("(require :asdf) {registry}")).await;
    register(&tb, &[&orbit]).await;
    let output = call(&tb, "run-tests", json!({"system": "orbit"})).await;
    let results = results_of(&output, "Parachute");
    assert_eq!(
        (count(&results, "passed"), count(&results, "failed") + count(&results, "errors"), count(&results, "skipped")),
        (passed, failed, skipped),
        "the shell's run printed Passed: {passed}, Failed: {failed}, Skipped: {skipped}; run-tests said:\n{}",
        output.text
    );
    assert_eq!(output.is_error, failed > 0, "{}", output.text);
    assert!(
        output.text.contains(
            "[FAIL] ORBIT-TESTS::APOAPSIDES\n  Form: (PARACHUTE:IS = 3/2 (ORBIT:APOAPSIS 1 1/2))\n  Expected: 3/2\n  \
             Actual: 1/2"
        ),
        "{}",
        output.text
    );
    // The reply's own [stdout] has Parachute's summary, as the shell's does.
    assert_eq!(parachute_summary(&output.text), (passed, failed, skipped), "{}", output.text);
    drop(image);
}
