//! `run-tests`: a system's tests (ASDF's test-system) or one named FiveAM or Parachute suite or
//! FiveAM, Parachute or RT test, with the results read as data: counts of the outermost run, and
//! for each failure its test, form, reason, expected and actual values. A run no framework's
//! results were read from is judged by what its output says, and is never reported as passing
//! on no evidence. Progress reports while it runs.
//!
//! See docs/design.md, "The toolbox".

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::lisp_reply::{decode, group_thousands, Captured, ErrorReport};
use super::{
    package_argument, Annotations, Arguments, Param, Run, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput,
    ToolResult,
};
use crate::image::Request;

/// A test suite may load and compile its system first, as load-system does.
const TESTS_TIMEOUT: Duration = Duration::from_secs(600);

/// Failures described in a reply per framework, and kept behind a handle (the helper's
/// *MAX-TEST-FAILURES* and *MAX-KEPT-WARNINGS*).
const MAX_SHOWN_FAILURES: u64 = 50;
const MAX_KEPT_FAILURES: u64 = 10_000;

/// The arguments: the schema and the checks.
const ARGUMENTS: &[Param] = &[
    Param::text("system", "The system to test, or to load first, e.g. \"my-app/tests\".").required(),
    Param::text("suite", "A suite to run instead of the test-op, e.g. \"my-app-tests::all\"."),
    Param::text("test", "One test to run instead of the test-op."),
    Param::text("package", "Package to read suite or test in."),
];

fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "run-tests",
        title: "Run tests",
        description:
            "Run a system's tests (asdf:test-system), or, after loading it, one suite or test (FiveAM, Parachute; RT \
            tests too). Replies with the outermost run's counts, each failure's test, form, expected and actual \
            values, and the output; an error when a check failed, the build failed, or no counts were read and the \
            output does not say it passed. Limit 10 minutes.",
        arguments: ARGUMENTS,
        annotations: Annotations { read_only: false, destructive: false, idempotent: false, open_world: true },
    }
}

/// The tool, for the table in `tools/mod.rs`.
pub const TOOL: Tool =
    Tool { definition, run: Run::Image(|context, args| Box::pin(call(context, args))), preview: None };

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let system = args.required_str("system")?;
    let suite = args.optional_str("suite")?;
    let test = args.optional_str("test")?;
    if suite.is_some() && test.is_some() {
        return Err(ToolError::new("Give suite or test, not both."));
    }
    let request = Request::new("run-tests")
        .arg(system)
        .key("suite", suite)
        .key("test", test)
        .key("package", package_argument(args)?)
        .key("max-output", context.settings.max_output);
    let reply = context
        .call_helper_reporting(
            args,
            (
                request,
                context.settings.eval_timeout.max(TESTS_TIMEOUT),
                "Test runs may take 10 minutes, or --eval-timeout if that is longer: start swank-mcp with a larger \
                 --eval-timeout, or run a smaller suite.",
            ),
            "test-activity",
            &format!("Testing {system}"),
        )
        .await;
    let report = decode::<TestReport>("run-tests", &reply?)?;
    Ok(ToolOutput::new(report.render(context.settings.max_output), report.failed())
        .with_structured(report.structured()))
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Failure {
    kind: String,
    test: String,
    form: Option<String>,
    reason: Option<String>,
    expected: Option<String>,
    actual: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Results {
    framework: String,
    tests: u64,
    passed: u64,
    failed: u64,
    errors: u64,
    skipped: u64,
    failures: Vec<Failure>,
    /// When some were not shown: the handle of every failure kept, as text, and the offset of the
    /// first not shown.
    #[serde(skip_serializing)]
    failures_rest: Option<(String, u64)>,
    #[serde(rename(serialize = "failures_dropped"))]
    failures_dropped: u64,
}

/// The helper's answer to `run-tests`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct TestReport {
    system: String,
    ran: Option<String>,
    frameworks: Vec<String>,
    milliseconds: u64,
    results: Vec<Results>,
    compiler_errors: Vec<String>,
    stdout: Captured,
    run_error: Option<ErrorReport>,
}

/// What a test run's output says of it, for a run whose framework's results were not read.
#[derive(Debug, Clone, PartialEq)]
enum OutputVerdict {
    /// The line that reports failures.
    Failed(String),
    /// The line that reports that nothing failed.
    Passed(String),
    Unknown,
}

/// The summary lines of FiveAM (`Fail: 1 (33%)`), Parachute (`Failed: 1`), RT (`2 out of 5
/// total tests failed`, `No tests failed.`) and the plain `N passed, N failed`: any that reports
/// a failure decides; else any that reports none.
fn verdict_in_output(text: &str) -> OutputVerdict {
    let mut passed = None;
    for line in text.lines().map(str::trim) {
        let failures = failures_reported(line);
        match failures {
            Some(0) => {
                passed.get_or_insert_with(|| line.to_string());
            }
            Some(_) => return OutputVerdict::Failed(line.to_string()),
            None if line == "No tests failed." => {
                passed.get_or_insert_with(|| line.to_string());
            }
            None => {}
        }
    }
    passed.map_or(OutputVerdict::Unknown, OutputVerdict::Passed)
}

/// The number of failures a summary line reports, if it is one.
fn failures_reported(line: &str) -> Option<u64> {
    let leading_number = |text: &str| -> Option<u64> {
        let digits: String = text.trim_start().chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    if let Some(rest) = line.strip_prefix("Fail:").or_else(|| line.strip_prefix("Failed:")) {
        return leading_number(rest);
    }
    if let Some((count, _)) = line.split_once(" out of ") {
        if line.contains(" total tests failed") {
            return leading_number(count);
        }
    }
    let (_, plain) = line.split_once(": ").unwrap_or(("", line));
    let (passed, failed) = plain.split_once(" passed, ")?;
    leading_number(passed)?;
    let failed = failed.strip_suffix(" failed").or_else(|| failed.split_once(" failed, ").map(|(n, _)| n))?;
    failed.parse().ok()
}

impl TestReport {
    /// Whether the call is an error: a check failed, the run failed, or no counts were read and
    /// the output does not say that the tests passed.
    fn failed(&self) -> bool {
        self.run_error.is_some()
            || self.results.iter().any(|r| r.failed + r.errors > 0)
            || (self.results.is_empty() && !matches!(verdict_in_output(&self.stdout.shown()), OutputVerdict::Passed(_)))
    }

    fn render(&self, max_output: usize) -> String {
        let mut sections = Vec::new();
        // The compiler's own messages say why a system could not be built; ASDF's error that
        // follows only says that it could not.
        if !self.compiler_errors.is_empty() {
            sections.push(format!("[compiler errors]\n{}", self.compiler_errors.join("\n")));
        }
        if let Some(error) = &self.run_error {
            sections.push(error.render());
        }
        let seconds = self.milliseconds as f64 / 1000.0;
        let mut summary = match &self.ran {
            Some(ran) => format!("Ran {ran} in {seconds:.2} s."),
            None => format!("No tests ran: building {:?} failed after {seconds:.2} s.", self.system),
        };
        for r in &self.results {
            summary.push_str(&format!(
                "\n{}: {} tests, {} checks: {} passed, {} failed, {} errors, {} skipped.",
                r.framework,
                r.tests,
                r.passed + r.failed + r.errors + r.skipped,
                r.passed,
                r.failed,
                r.errors,
                r.skipped
            ));
        }
        if self.results.is_empty() && self.ran.is_some() {
            let loaded = if self.frameworks.is_empty() {
                " (no test framework is loaded)".to_string()
            } else {
                format!(" (test frameworks loaded: {})", self.frameworks.join(", "))
            };
            let verdict = match verdict_in_output(&self.stdout.shown()) {
                _ if self.run_error.is_some() => "The run failed: see the error above.".to_string(),
                OutputVerdict::Failed(line) => format!("The output reports failures ({line:?}): the call is an error."),
                OutputVerdict::Passed(line) => format!("The output reports no failures ({line:?})."),
                OutputVerdict::Unknown => "Nothing in the output says whether the tests passed, so the call is an \
                    error: see [stdout]."
                    .to_string(),
            };
            summary.push_str(&format!(
                "\nNo FiveAM, Parachute or RT run could be read, so there are no counts{loaded}. {verdict}"
            ));
        }
        sections.push(summary);
        for results in &self.results {
            for failure in &results.failures {
                let mut block =
                    format!("[{}] {}", if failure.kind == "error" { "ERROR" } else { "FAIL" }, failure.test);
                if let Some(form) = &failure.form {
                    block.push_str(&format!("\n  Form: {form}"));
                }
                if let (Some(expected), Some(actual)) = (&failure.expected, &failure.actual) {
                    block.push_str(&format!("\n  Expected: {expected}\n  Actual: {actual}"));
                }
                if let Some(reason) = &failure.reason {
                    block.push_str(&format!("\n  Reason: {reason}"));
                }
                sections.push(block);
            }
            let dropped = results.failures_dropped;
            match &results.failures_rest {
                _ if dropped == 0 => {}
                Some((handle, offset)) => {
                    let not_kept = (dropped + MAX_SHOWN_FAILURES).saturating_sub(MAX_KEPT_FAILURES);
                    sections.push(format!(
                        "[... {} more failures not shown: at most 50 per framework; inspect {handle} with offset \
                         {offset} for {}]",
                        group_thousands(dropped),
                        if not_kept == 0 {
                            "them".to_string()
                        } else {
                            format!(
                                "the next {}; the last {} were not kept (at most 10,000 per framework)",
                                group_thousands(dropped - not_kept),
                                group_thousands(not_kept)
                            )
                        }
                    ));
                }
                None => sections.push(format!("[... {} more failures not shown]", group_thousands(dropped))),
            }
        }
        sections.extend(self.stdout.section("[stdout]", max_output));
        sections.join("\n\n")
    }

    fn structured(&self) -> serde_json::Value {
        json!({
            "system": self.system,
            "ran": self.ran,
            "frameworks": self.frameworks,
            "milliseconds": self.milliseconds,
            "results": self.results,
            "compiler_errors": self.compiler_errors,
            "verdict_from_output": match (self.results.is_empty(), verdict_in_output(&self.stdout.shown())) {
                (true, OutputVerdict::Failed(line) | OutputVerdict::Passed(line)) => Some(line),
                _ => None,
            },
            "stdout": self.stdout.shown(),
            "error": self.run_error.as_ref().map(ErrorReport::to_json),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[test]
    fn failures_show_expected_and_actual() {
        let report = decode::<TestReport>(
            "run-tests",
            &read(
                "(:system \"demo\" :ran \"FiveAM suite DEMO::ALL\" :frameworks (\"FiveAM\") :milliseconds 1200 \
                 :results ((:framework \"FiveAM\" :tests 2 :passed 1 :failed 1 :errors 0 :skipped 0 :failures \
                 ((:kind \"failure\" :test \"DEMO::ADDS\" :form \"(= 5 (ADD 2 3))\" :reason \"(ADD 2 3) evaluated to 6 which is not = to 5\" \
                 :expected \"5\" :actual \"6\")) :failures-rest nil :failures-dropped 0)) :compiler-errors () :stdout (\"\" 0) :run-error nil)",
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            report.render(100),
            "Ran FiveAM suite DEMO::ALL in 1.20 s.\nFiveAM: 2 tests, 2 checks: 1 passed, 1 failed, 0 errors, 0 skipped.\n\n\
             [FAIL] DEMO::ADDS\n  Form: (= 5 (ADD 2 3))\n  Expected: 5\n  Actual: 6\n  Reason: (ADD 2 3) evaluated to 6 which is \
             not = to 5"
        );
    }

    fn without_counts(stdout: &str) -> TestReport {
        decode::<TestReport>(
            "run-tests",
            &read(&format!(
                "(:system \"app\" :ran \"asdf:test-system \\\"app\\\"\" :frameworks (\"FiveAM\") :milliseconds 50 :results () \
                 :compiler-errors () :stdout (\"{}\" 0) :run-error nil)",
                stdout.replace('\\', "\\\\").replace('"', "\\\"")
            ))
            .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_run_without_counts_is_judged_by_its_output() {
        let failing = without_counts(" Did 3 checks.\n    Pass: 2 (66%)\n    Skip: 0 ( 0%)\n    Fail: 1 (33%)\n");
        assert!(failing.failed());
        assert!(
            failing.render(1000).contains(
                "No FiveAM, Parachute or RT run could be read, so there are no counts (test frameworks loaded: \
                 FiveAM). The output reports failures (\"Fail: 1 (33%)\"): the call is an error."
            ),
            "{}",
            failing.render(1000)
        );
        let passing = without_counts("Doing 5 pending tests of 5 tests total.\nNo tests failed.");
        assert!(!passing.failed());
        assert!(passing.render(1000).contains("The output reports no failures (\"No tests failed.\")."));
        let silent = without_counts("compiling...\n");
        assert!(silent.failed(), "a run that says nothing is not a pass");
        assert!(silent.render(1000).contains("Nothing in the output says whether the tests passed"));
    }

    #[test]
    fn summary_lines_of_each_framework_are_recognised() {
        assert_eq!(failures_reported("Fail: 0 ( 0%)"), Some(0));
        assert_eq!(failures_reported("Failed:     2"), Some(2));
        assert_eq!(failures_reported("2 out of 5 total tests failed: A, "), Some(2));
        assert_eq!(failures_reported("tests: 4 passed, 1 failed"), Some(1));
        assert_eq!(failures_reported("4 passed, 0 failed, 1 skipped"), Some(0));
        assert_eq!(failures_reported("Running test FAIL .."), None);
        assert_eq!(failures_reported("Failure Details:"), None);
        assert_eq!(
            verdict_in_output("Fail: 0 ( 0%)\n1 out of 3 total tests failed: X."),
            OutputVerdict::Failed("1 out of 3 total tests failed: X.".into())
        );
    }
}
