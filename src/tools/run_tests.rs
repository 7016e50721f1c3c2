//! `run-tests`: a system's tests (ASDF's test-system) or one named FiveAM or Parachute suite or
//! test, with the results read as data: counts, and for each failure its test, form, reason, expected and actual
//! values. Progress reports while it runs.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::lisp_reply::{decode, group_thousands, Captured, ErrorReport};
use super::{
    package_argument, Annotations, Arguments, Run, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult,
};
use crate::swank::Form;

/// A test suite may load and compile its system first, as load-system does.
const TESTS_TIMEOUT: Duration = Duration::from_secs(600);

fn definition() -> ToolDefinition {
    ToolDefinition {
        name: "run-tests",
        title: "Run tests",
        description: "Run tests in the image. With only system: loads it and runs asdf:test-system on it (its \
            test-op, which usually loads its test system and runs the suite). With suite or test: loads system, \
            then runs that FiveAM or Parachute suite or test (a symbol name, read in package or the session's \
            package). FiveAM's and Parachute's results are read as data: counts of checks passed, failed, errors \
            (a FiveAM check that signalled) and skipped, and for each failure (at most 50 per framework) its test, \
            form, reason, and for a comparison such as (is (= expected actual)) or (is = expected actual) the \
            expected and actual values. Other frameworks the image has loaded (Rove, lisp-unit2) are named, but \
            their results are only in the output. The call is an error when a check failed. The tests' output goes to [stdout], \
            not the image's terminal. Sends progress notifications (checks done, failures) when the call has a \
            progressToken. Time limit: 10 minutes, or --eval-timeout if longer.",
        input_schema: json!({
            "type": "object",
            "required": ["system"],
            "properties": {
                "system": {"type": "string", "description": "The ASDF system to test (or, with suite or test, to load first), e.g. \"my-app/tests\"."},
                "suite": {"type": "string", "description": "A FiveAM or Parachute suite to run instead of the system's test-op, e.g. \"my-app-tests::all\"."},
                "test": {"type": "string", "description": "A single FiveAM or Parachute test to run instead of the system's test-op."},
                "package": {"type": "string", "description": "Package to read suite or test in (default: the session's package)."}
            }
        }),
        output_schema: Some(json!({
            "type": "object",
            "required": ["system", "ran"],
            "properties": {
                "system": {"type": "string"},
                "ran": {"type": ["string", "null"], "description": "What was run: asdf:test-system or the FiveAM suite or test."},
                "frameworks": {"type": "array", "items": {"type": "string"}, "description": "Test frameworks loaded in the image."},
                "milliseconds": {"type": "integer"},
                "results": {
                    "type": "array",
                    "description": "One entry per framework whose run was seen (FiveAM, Parachute); empty when none was.",
                    "items": {
                    "type": "object",
                    "properties": {
                        "framework": {"type": "string"},
                        "tests": {"type": "integer"},
                        "passed": {"type": "integer"},
                        "failed": {"type": "integer"},
                        "errors": {"type": "integer"},
                        "skipped": {"type": "integer"},
                        "failures": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "kind": {"type": "string", "enum": ["failure", "error"]},
                                    "test": {"type": "string"},
                                    "form": {"type": ["string", "null"]},
                                    "reason": {"type": ["string", "null"]},
                                    "expected": {"type": ["string", "null"]},
                                    "actual": {"type": ["string", "null"]}
                                }
                            }
                        },
                        "failures_dropped": {"type": "integer"}
                    }
                    }
                },
                "stdout": {"type": "string"},
                "error": {"type": ["object", "null"]}
            }
        })),
        annotations: Annotations { read_only: false, destructive: false, idempotent: false, open_world: true },
    }
}

/// The tool, for the table in `tools/mod.rs`.
pub const TOOL: Tool = Tool { definition, run: Run::Image(|context, args| Box::pin(call(context, args))) };

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let system = args.required_str("system")?;
    let suite = args.optional_str("suite")?;
    let test = args.optional_str("test")?;
    if suite.is_some() && test.is_some() {
        return Err(ToolError::new("Give suite or test, not both."));
    }
    let request = vec![
        Form::string(system),
        Form::Keyword("suite"),
        suite.map_or(Form::Nil, Form::string),
        Form::Keyword("test"),
        test.map_or(Form::Nil, Form::string),
        Form::Keyword("package"),
        package_argument(args)?,
        Form::Keyword("max-output"),
        Form::Integer(context.settings.max_output as i64),
    ];
    let reply = context
        .call_helper_reporting(
            args,
            (
                "run-tests",
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
    let failed = report.error.is_some() || report.results.iter().any(|r| r.failed + r.errors > 0);
    Ok(ToolOutput::new(report.render(context.settings.max_output), failed).with_structured(report.structured()))
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
    stdout: Captured,
    error: Option<ErrorReport>,
}

impl TestReport {
    fn render(&self, max_output: usize) -> String {
        let mut sections = Vec::new();
        if let Some(error) = &self.error {
            sections.push(error.render());
        }
        let seconds = self.milliseconds as f64 / 1000.0;
        let ran = self.ran.as_deref().unwrap_or("nothing");
        let mut summary = format!("Ran {ran} in {seconds:.2} s.");
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
        if self.results.is_empty() {
            summary.push_str(&format!(
                "\nNo FiveAM or Parachute run was seen, so there are no counts{}; see [stdout] for the output.",
                if self.frameworks.is_empty() {
                    String::new()
                } else {
                    format!(" (test frameworks loaded: {})", self.frameworks.join(", "))
                }
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
            if results.failures_dropped > 0 {
                sections.push(format!("[... {} more failures not shown]", group_thousands(results.failures_dropped)));
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
            "stdout": self.stdout.shown(),
            "error": self.error.as_ref().map(ErrorReport::to_json),
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
                 :expected \"5\" :actual \"6\")) :failures-dropped 0)) :stdout (\"\" 0) :error nil)",
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
}
