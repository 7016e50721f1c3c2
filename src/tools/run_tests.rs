//! `run-tests`: a system's tests (ASDF's test-system) or one named FiveAM or Parachute suite or
//! FiveAM, Parachute or RT test, with the results read as data: counts of distinct tests (a suite
//! the test-op runs twice is said once), and each failing test once, with its forms, expected and
//! actual values (variants of a test that failed alike, `FOO.INTERPRETED` and `FOO.COMPILED`, in
//! one text). Failing tests head the reply FAILED; only a build or test-op that signalled makes
//! the call an error. The run's output stays behind a handle; it comes into the reply only where it
//! holds what the counts cannot: for a run whose results no framework gave (judged by the lines
//! of its output that name failures), and before an error outside any test. Progress reports
//! while it runs.
//!
//! See docs/design.md, "The toolbox".

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::lisp_reply::{decode, group_thousands, plural, Captured, ErrorReport, Reloaded};
use super::arguments::arguments;
use super::{preview, Arguments, Preview, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use crate::image::{Entry, Request};

/// A test suite may load and compile its system first, as load-system does.
const TESTS_TIMEOUT: Duration = Duration::from_secs(600);

/// Failures kept behind a handle per framework (the helper's *MAX-KEPT-WARNINGS*).
const MAX_KEPT_FAILURES: u64 = 10_000;

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "run-tests",
        arguments: Args::PARAMS,
        read_only: false,
        description: "Run a system's tests, or one FiveAM or Parachute suite or test, or RT test.",
    },
    |context, args| Box::pin(call(context, args)),
)
.with_image_preview(|context, args| Box::pin(preview(context, args)));

arguments! {
    struct Args {
        system: String,
        suite: Option<String>,
        test: Option<String>,
        package: Option<String>,
    }
}

/// What the person approving a run is shown: its arguments, and what its test-op would load again
/// first, with the variables whose DEFPARAMETERs would set them again (their values may be the
/// person's, set at the REPL).
async fn preview(context: &ToolContext, args: &Arguments) -> Result<Preview, ToolError> {
    let Args { system, .. } = args.typed()?;
    let plan = context.call_helper(args, Request::new(Entry::TEST_RELOAD_PLAN).arg(system.as_str())).await?;
    let plan = decode::<ReloadPlan>("test-reload-plan", &plan)?;
    let mut shown = preview::of_arguments(args);
    if !plan.files.is_empty() {
        shown.text.push_str(&format!(
            "\n\nBefore its tests, ASDF will load again {} changed since loaded: {}.",
            if plan.files.len() == 1 { "1 file" } else { "these files" },
            plan.files.join(", ")
        ));
        if !plan.variables.is_empty() {
            shown.text.push_str(&format!(
                "\nTheir DEFPARAMETERs will set these variables again: {} (undo can put the values back).",
                plan.variables.join(", ")
            ));
        }
    }
    Ok(shown)
}

/// The helper's `test-reload-plan`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ReloadPlan {
    files: Vec<String>,
    variables: Vec<String>,
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { system, suite, test, package } = args.typed()?;
    if suite.is_some() && test.is_some() {
        return Err(ToolError::new("Give suite or test, not both."));
    }
    let request = Request::new(Entry::RUN_TESTS)
        .arg(system.as_str())
        .key("suite", suite)
        .key("test", test)
        .key("package", package)
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
            Entry::TEST_ACTIVITY,
            &format!("Testing {system}"),
        )
        .await;
    let report = decode::<TestReport>("run-tests", &reply?)?;
    Ok(ToolOutput::new(report.render(context.settings.max_output), report.is_error())
        .with_structured(report.structured()))
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct CheckFailure {
    /// Which run of the test (from 1) it failed in.
    run: u64,
    kind: String,
    form: Option<String>,
    reason: Option<String>,
    expected: Option<String>,
    actual: Option<String>,
}

/// A test that failed in at least one run.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct FailingTest {
    test: String,
    /// The test whose text this one's failures are in, for a variant that failed alike (the
    /// same body run interpreted and compiled: `FOO.INTERPRETED`, `FOO.COMPILED`).
    #[serde(rename(serialize = "same_as"))]
    same_as: Option<String>,
    kind: String,
    #[serde(rename(serialize = "failed_runs"))]
    failed_runs: Vec<u64>,
    /// As the reply shows it, naming the variants alike too (the helper writes it, the same text
    /// its handle keeps for the tests not shown); none for those variants.
    #[serde(skip_serializing)]
    text: Option<String>,
    failures: Vec<CheckFailure>,
}

/// Checks by outcome, over every run.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Checks {
    passed: u64,
    failed: u64,
    errors: u64,
    skipped: u64,
}

impl Checks {
    fn total(&self) -> u64 {
        self.passed + self.failed + self.errors + self.skipped
    }
}

/// One framework's results, per distinct test.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Results {
    framework: String,
    /// Distinct tests.
    tests: u64,
    /// How many times the tests ran (the most any one did); `uniform` when each ran that often.
    runs: u64,
    uniform: bool,
    /// Tests by the worst of their runs.
    passed: u64,
    failed: u64,
    errors: u64,
    skipped: u64,
    #[serde(rename(serialize = "failed_every_run"))]
    failed_every_run: u64,
    checks: Checks,
    failing: Vec<FailingTest>,
    /// When some were not shown: the handle of every failing test's text, and the offset of the
    /// first not shown.
    #[serde(skip_serializing)]
    failing_rest: Option<(String, u64)>,
    #[serde(rename(serialize = "failing_dropped"))]
    failing_dropped: u64,
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
    /// The first of the build's compiler warnings, and how many there were.
    compiler_warnings: Vec<String>,
    compiler_warning_count: u64,
    reloaded: Option<Reloaded>,
    /// For a red run of FiveAM or RT tests: the definitions most likely at fault.
    suspects: Option<Suspects>,
    stdout: Captured,
    /// The handle of all the output kept, when there was output.
    output_handle: Option<String>,
    run_error: Option<ErrorReport>,
}

/// What the failing tests, run again with recording on, reached and the passing ones did not: the
/// helper's FIND-SUSPECTS, or why it could not say.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Suspects {
    #[serde(rename(serialize = "failing_rerun"))]
    failing_rerun: Option<u64>,
    #[serde(rename(serialize = "passing_rerun"))]
    passing_rerun: Option<u64>,
    passing: Option<u64>,
    #[serde(default)]
    suspects: Vec<Suspect>,
    why: Option<String>,
}

/// A definition of the system under test, ranked: `failing` and `passing` count the tests that
/// reached it; `signalled` when a failing test's error was signalled inside it; the arguments and
/// value of a failing test's first call of it, for the first few.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct Suspect {
    name: String,
    kind: String,
    file: Option<String>,
    line: Option<u64>,
    failing: u64,
    passing: u64,
    signalled: bool,
    arguments: Option<String>,
    value: Option<String>,
    /// The system's macro whose call defined this function (a converter a macro writes), whose
    /// source is the one to read.
    defined_by: Option<DefiningMacro>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
struct DefiningMacro {
    name: String,
    file: Option<String>,
    line: Option<u64>,
}

impl Suspects {
    fn render(&self) -> String {
        if let Some(why) = &self.why {
            return format!("[suspects] none: {why}");
        }
        let failing = self.failing_rerun.unwrap_or(0);
        let (rerun, passing) = (self.passing_rerun.unwrap_or(0), self.passing.unwrap_or(0));
        // The noun follows the passing count it stands beside: "1 failing and 59 passing tests".
        let tests = if passing == 1 { "test" } else { "tests" };
        let passing_text = if rerun == passing {
            format!("{passing} passing {tests}")
        } else {
            format!("{rerun} of {passing} passing {tests} (as many as 15 s allowed)")
        };
        let mut text = format!(
            "[suspects] likeliest first, from {failing} failing and {passing_text} run again recording calls:"
        );
        if self.suspects.is_empty() {
            text.push_str("
none: the failing tests reached none of the system's own definitions");
        }
        for (i, suspect) in self.suspects.iter().enumerate() {
            let place = match (&suspect.file, suspect.line) {
                (Some(file), Some(line)) => format!("{file}:{line}"),
                (Some(file), None) => file.clone(),
                _ => "no source file".to_string(),
            };
            // A plain function is the usual case, and goes unsaid.
            let how = match suspect.kind.as_str() {
                "macro" => "macro; ",
                "inline" => "inline function; ",
                "generic" => "generic function; ",
                _ => "",
            };
            text.push_str(&format!(
                "\n{}. {} {place} ({how}{} of {failing} failing, {} passing{})",
                i + 1,
                suspect.name,
                suspect.failing,
                suspect.passing,
                if suspect.signalled { "; the error came from it" } else { "" }
            ));
            if let Some(macro_) = &suspect.defined_by {
                let place = match (&macro_.file, macro_.line) {
                    (Some(file), Some(line)) => format!(" {file}:{line}"),
                    _ => String::new(),
                };
                text.push_str(&format!("\n   defined there by the macro {}{place}", macro_.name));
            }
            if let Some(arguments) = &suspect.arguments {
                text.push_str(&format!("\n   called with {arguments}"));
                match &suspect.value {
                    Some(value) => text.push_str(&format!(", returned {value}")),
                    None if suspect.signalled => text.push_str(", signalled the test's error"),
                    None => text.push_str(", did not return"),
                }
            }
        }
        text
    }
}

/// Lines of output quoted from a run whose results were not read: those that name failures, or
/// the last ones (more of them before an error than after a run that returned).
const MAX_QUOTED_LINES: usize = 20;
const LAST_LINES: usize = 10;
const VERDICT_LINES: usize = 3;
const MAX_QUOTED_LINE: usize = 300;

/// The number of failures a summary line of FiveAM (`Fail: 1 (33%)`), Parachute (`Failed: 1`),
/// RT (`2 out of 5 total tests failed`) or a plain `N passed, N failed` reports, if it is one.
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

/// Whether a line of a run's output names failures or errors: a summary line that reports some;
/// a word such as `fail`, `failed`, `failures` or `errors` with a count other than zero next to
/// it; or such a word with no count and no word of passing on the line (`Test FOO failed`,
/// `Unexpected failures: FOO, BAR`). Not `0 failures`, `Failures: 0`, `no errors`, `Unexpected
/// failures: none`, `error-handling   PASS`.
fn names_failures(line: &str) -> bool {
    let line = line.trim();
    if let Some(count) = failures_reported(line) {
        return count > 0;
    }
    let words: Vec<String> = lowercase_words(line).collect();
    let failing = |word: &str| word.starts_with("fail") || word.starts_with("error");
    let zero = |word: &str| matches!(word, "0" | "no" | "none" | "nil" | "zero");
    let number = |word: &str| word.chars().all(|c| c.is_ascii_digit());
    let passing = words.iter().any(|w| matches!(w.as_str(), "pass" | "passed" | "passes" | "ok" | "success"));
    let mut unqualified = false;
    for (i, _) in words.iter().enumerate().filter(|(_, w)| failing(w)) {
        // A count or "no" just before (`3 failures`, `no unexpected failures`) or just after
        // (`Failures: 2`, `failed: none`).
        let before = words[i.saturating_sub(2)..i].iter().rev().find(|w| zero(w) || number(w));
        let after = words.get(i + 1).filter(|w| zero(w) || number(w));
        match before.or(after) {
            Some(count) if zero(count) => {}
            Some(_) => return true,
            None => unqualified |= !passing,
        }
    }
    // Nothing after the colon of `Unexpected failures:` says nothing failed either.
    unqualified && !line.ends_with(':')
}

/// Whether a line of a run's output reads as its verdict: it speaks of passing, of tests or
/// checks counted, of failures, or of the run's end (`5 checks. Unexpected failures: none`, `All 57
/// tests passed`, `OK`), not only values (`"#x10/-5"   T   SINGLE-FLOAT`).
fn reads_as_a_verdict(line: &str) -> bool {
    const VERDICT_WORDS: &[&str] = &[
        "pass", "passed", "passes", "passing", "ok", "success", "successful", "succeeded", "test", "tests", "check",
        "checks", "assertions", "total", "summary", "results", "done", "finished", "ran", "all", "fail", "failed",
        "failures", "errors",
    ];
    lowercase_words(line).any(|word| VERDICT_WORDS.contains(&word.as_str()))
}

/// `line` as one line, or as two where a harness printed its verdict with no line break after
/// the last row of its table: parse-number's `... SINGLE-FLOATUnexpected failures: #o10.` is the
/// row and `Unexpected failures: #o10.`. The verdict starts at a capitalised word written onto
/// the end of another (an upper-case letter or digit, a quote or a bracket just before it).
fn split_glued_verdict(line: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    let glued = chars.windows(3).find_map(|window| {
        let [(_, before), (start, capital), (_, next)] = window else { return None };
        let glued_onto = before.is_ascii_uppercase() || before.is_ascii_digit() || "\"')]".contains(*before);
        (glued_onto && capital.is_ascii_uppercase() && next.is_ascii_lowercase()).then_some(*start)
    });
    match glued {
        Some(start) if names_failures(&line[start..]) || reads_as_a_verdict(&line[start..]) => {
            vec![&line[..start], &line[start..]]
        }
        _ => vec![line],
    }
}

/// The words of a line of output, letters and digits, in lower case.
fn lowercase_words(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split(|c: char| !c.is_alphanumeric()).filter(|word| !word.is_empty()).map(str::to_lowercase)
}

impl Results {
    /// `RT: 249 tests, run twice by the test-op: 3 failed in both runs, 246 passed.`
    fn summary(&self, by_test_op: bool) -> String {
        let checks = match self.framework.as_str() {
            "RT" => String::new(),
            _ => {
                let per_run =
                    if self.uniform && self.runs > 1 { self.checks.total() / self.runs } else { self.checks.total() };
                format!(" ({})", plural(per_run, "check", "checks"))
            }
        };
        let runs = match (self.runs, self.uniform) {
            (0 | 1, _) => String::new(),
            (2, true) => ", run twice".to_string(),
            (n, true) => format!(", run {n} times"),
            (n, false) => format!(", some run up to {n} times"),
        };
        let by = if by_test_op && self.runs > 1 { " by the test-op" } else { "" };
        let failing = self.failed + self.errors;
        let mut outcome = Vec::new();
        if failing == 0 {
            outcome.push(if self.tests == 1 { "passed".to_string() } else { "all passed".to_string() });
        } else {
            let mut failed = format!("{failing} failed");
            if self.runs > 1 {
                let every = if self.runs == 2 { "both runs".to_string() } else { format!("all {} runs", self.runs) };
                if self.failed_every_run == failing {
                    failed.push_str(&format!(" in {every}"));
                } else {
                    failed.push_str(&format!(" ({} of them in {every})", self.failed_every_run));
                }
            }
            if self.errors > 0 {
                failed.push_str(&format!(" ({} by signalling an error)", self.errors));
            }
            outcome.push(failed);
            if self.passed > 0 {
                outcome.push(format!("{} passed", self.passed));
            }
        }
        if self.skipped > 0 {
            outcome.push(format!("{} skipped", self.skipped));
        }
        format!(
            "{}: {}{checks}{runs}{by}: {}.",
            self.framework,
            plural(self.tests, "test", "tests"),
            outcome.join(", ")
        )
    }
}

impl TestReport {
    /// Whether the call is an error: the build or the run signalled. Tests that fail are what
    /// the tool reports, not its failure: such a reply is headed FAILED instead.
    fn is_error(&self) -> bool {
        self.run_error.is_some() || self.ran.is_none()
    }

    /// Whether the run failed without an error: a test failed, or no results were read and the
    /// output names failures.
    fn failed(&self) -> bool {
        !self.is_error()
            && (self.tests_failed()
                || (self.results.is_empty() && !self.failure_lines().is_empty()))
    }

    /// Whether a framework's results have a test that failed or signalled.
    fn tests_failed(&self) -> bool {
        self.results.iter().any(|results| results.failed + results.errors > 0)
    }

    /// The run's one word: error, failed or passed.
    fn verdict(&self) -> &'static str {
        match (self.is_error(), self.failed()) {
            (true, _) => "error",
            (false, true) => "failed",
            (false, false) => "passed",
        }
    }

    /// The output's lines as the reply has them: its start, and for a cut output its end; a
    /// verdict printed without a line break after a table's last row is a line of its own.
    fn output_lines(&self) -> impl Iterator<Item = &str> {
        self.stdout.text.lines().chain(self.stdout.tail.lines()).flat_map(split_glued_verdict)
    }

    /// The lines of the output that name failures or errors, each once, in order.
    fn failure_lines(&self) -> Vec<&str> {
        let mut lines: Vec<&str> = Vec::new();
        for line in self.output_lines().map(str::trim).filter(|line| names_failures(line)) {
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
        lines
    }

    /// The output's last `count` lines that are not blank, for a run whose results the summary
    /// cannot give.
    fn last_lines(&self, count: usize) -> Vec<&str> {
        let lines: Vec<&str> = self.output_lines().filter(|line| !line.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(count)..].to_vec()
    }

    /// Every character the run wrote.
    fn output_characters(&self) -> u64 {
        (self.stdout.text.chars().count() + self.stdout.tail.chars().count()) as u64 + self.stdout.dropped
    }

    fn render(&self, max_output: usize) -> String {
        let mut sections = Vec::new();
        // The compiler's own messages say why a system could not be built; ASDF's error that
        // follows only says that it could not.
        if !self.compiler_errors.is_empty() {
            sections.push(format!("[compiler errors]\n{}", self.compiler_errors.join("\n")));
        }
        if let Some(error) = &self.run_error {
            sections.push(error.render_after_return());
        }
        let seconds = self.milliseconds as f64 / 1000.0;
        let mut summary = match &self.ran {
            Some(ran) if self.failed() => format!("FAILED: ran {ran} in {seconds:.2} s."),
            // Said only where a framework's results say it: a run without them is told by its output.
            Some(ran) if !self.is_error() && !self.results.is_empty() => {
                format!("PASSED: ran {ran} in {seconds:.2} s.")
            }
            Some(ran) => format!("Ran {ran} in {seconds:.2} s."),
            None => format!("No tests ran: building {:?} failed after {seconds:.2} s.", self.system),
        };
        let by_test_op = self.ran.as_deref().is_some_and(|ran| ran.starts_with("asdf:test-system"));
        for results in &self.results {
            summary.push_str(&format!("\n{}", results.summary(by_test_op)));
        }
        let failure_lines = if self.results.is_empty() { self.failure_lines() } else { Vec::new() };
        if self.ran.is_some() {
            // How the run ended, said plainly: without any framework's results, whether it
            // returned is all that is known besides its output, and no framework is guessed at.
            let run = if by_test_op { "the test-op" } else { "the run" };
            let ended = match (&self.run_error, failure_lines.len()) {
                (Some(error), _) => format!("{run} signalled {} (above)", error.type_name),
                (None, _) if !self.results.is_empty() => String::new(),
                (None, 0) if self.output_characters() == 0 => format!("{run} returned and printed nothing"),
                (None, 0) => format!("{run} returned, and its output names no failures"),
                (None, _) => format!("{run} returned, and its output names failures (below)"),
            };
            if self.results.is_empty() {
                summary.push_str(&format!("\nNo test framework's results were read: {ended}."));
            } else if !ended.is_empty() {
                summary.push_str(&format!("\n{}{}.", ended[..1].to_uppercase(), &ended[1..]));
            }
        }
        if let Some(reloaded) = &self.reloaded {
            summary.push_str(&format!("\nBefore the tests, {}", reloaded.render()));
        }
        let characters = self.output_characters();
        match &self.output_handle {
            Some(handle) if characters > 0 => summary.push_str(&format!(
                "\nOutput: {} characters; inspect {handle} to read them.",
                group_thousands(characters)
            )),
            _ => {}
        }
        sections.push(summary);
        for results in &self.results {
            sections.extend(results.failing.iter().filter_map(|failing| failing.text.clone()));
            let dropped = results.failing_dropped;
            match &results.failing_rest {
                _ if dropped == 0 => {}
                Some((handle, offset)) => {
                    let shown = results.failing.len() as u64;
                    let not_kept = (dropped + shown).saturating_sub(MAX_KEPT_FAILURES);
                    sections.push(format!(
                        "[... {} more failing test{} not shown; inspect {handle} with offset {offset} for {}]",
                        group_thousands(dropped),
                        if dropped == 1 { "" } else { "s" },
                        if not_kept == 0 {
                            "them".to_string()
                        } else {
                            format!(
                                "the next {}; the last {} were not kept (at most 10,000 failures per framework)",
                                group_thousands(dropped - not_kept),
                                group_thousands(not_kept)
                            )
                        }
                    ));
                }
                None => sections.push(format!("[... {} more failing tests not shown]", group_thousands(dropped))),
            }
        }
        sections.extend(self.suspects.as_ref().map(Suspects::render));
        if !self.compiler_warnings.is_empty() {
            let mut section = format!(
                "[compiler warnings] {} building the system\n{}",
                plural(self.compiler_warning_count, "warning", "warnings"),
                self.compiler_warnings.join("\n")
            );
            let rest = self.compiler_warning_count.saturating_sub(self.compiler_warnings.len() as u64);
            if rest > 0 {
                section
                    .push_str(&format!("\n[... {} more not shown: load-system lists them all]", group_thousands(rest)));
            }
            sections.push(section);
        }
        // The output holds what the summary cannot: how a run without results went, and what
        // came before an error outside any test. An error that follows failing tests is the
        // framework's verdict on them, which the failures above already say.
        if self.results.is_empty() || (self.run_error.is_some() && !self.tests_failed()) {
            if self.output_handle.is_none() {
                sections.extend(self.stdout.section("[stdout]", max_output));
            } else {
                if !failure_lines.is_empty() {
                    let shown: Vec<String> =
                        failure_lines.iter().take(MAX_QUOTED_LINES).map(|line| one_line(line)).collect();
                    let mut section = format!("[output: lines that name failures or errors]\n{}", shown.join("\n"));
                    if failure_lines.len() > MAX_QUOTED_LINES {
                        section
                            .push_str(&format!("\n[... {} more such lines]", failure_lines.len() - MAX_QUOTED_LINES));
                    }
                    sections.push(section);
                }
                // Quoted lines that name failures say what the end would; a run that returned
                // naming none ends with its verdict, which a harness prints last, if its last
                // lines read as one (not the rows of a table of results).
                let last: Vec<&str> = match (failure_lines.is_empty(), &self.run_error) {
                    (false, _) => Vec::new(),
                    (true, Some(_)) => self.last_lines(LAST_LINES),
                    (true, None) => {
                        self.last_lines(VERDICT_LINES).into_iter().filter(|line| reads_as_a_verdict(line)).collect()
                    }
                };
                let last: Vec<String> = last.iter().map(|line| one_line(line)).collect();
                if !last.is_empty() {
                    sections.push(format!("[output: last lines]\n{}", last.join("\n")));
                }
            }
        }
        sections.join("\n\n")
    }

    fn structured(&self) -> serde_json::Value {
        json!({
            "system": self.system,
            "ran": self.ran,
            "outcome": self.verdict(),
            "frameworks": self.frameworks,
            "milliseconds": self.milliseconds,
            "results": self.results,
            "compiler_errors": self.compiler_errors,
            "compiler_warnings": self.compiler_warnings,
            "compiler_warning_count": self.compiler_warning_count,
            "reloaded": self.reloaded.as_ref().map(Reloaded::to_json),
            "suspects": self.suspects,
            "output": {"characters": self.output_characters(), "handle": self.output_handle},
            "failure_lines": if self.results.is_empty() { self.failure_lines() } else { Vec::new() },
            "error": self.run_error.as_ref().map(ErrorReport::to_json),
        })
    }
}

/// A line of output as quoted: cut to [`MAX_QUOTED_LINE`] characters.
fn one_line(line: &str) -> String {
    let line = line.trim_end();
    match line.char_indices().nth(MAX_QUOTED_LINE) {
        Some((cut, _)) => format!("{} ...", &line[..cut]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_glued_to_a_tables_last_row_is_a_line_of_its_own() {
        let row = "         \"#x10/-5\"                          T                                SINGLE-FLOAT";
        assert_eq!(
            split_glued_verdict(&format!("{row}Unexpected failures: #o10, #o-101/75.")),
            [row, "Unexpected failures: #o10, #o-101/75."]
        );
        for line in [row, "Ran 5 tests. OK", "ALEXANDRIA-TESTS::IOTA.1 Failed", "\"Hello\" => Hello"] {
            assert_eq!(split_glued_verdict(line), [line]);
        }
    }

    #[test]
    fn a_verdict_is_told_from_the_rows_of_a_table() {
        for verdict in ["5 checks. Unexpected failures: none", "All 57 tests passed.", "OK", "Done.", "first  pass  \"ab\""] {
            assert!(reads_as_a_verdict(verdict), "{verdict}");
        }
        for row in ["\"#x10/-5\"        T        SINGLE-FLOAT", "(1 2 3) => 6", ""] {
            assert!(!reads_as_a_verdict(row), "{row}");
        }
    }
    use crate::swank::read;

    const RT_TWICE: &str =
        "(:framework \"RT\" :tests 249 :runs 2 :uniform t :passed 246 :failed 3 :errors 0 :skipped 0 \
         :failed-every-run 3 :checks (:passed 492 :failed 6 :errors 0 :skipped 0) :failing ((:test \"A-T::IOTA.1\" :same-as nil \
         :kind \"failure\" :failed-runs (1 2) :text \"[FAIL] A-T::IOTA.1\n  Form: (IOTA 3)\n  Expected: (0 1 2)\n  \
         Actual: (0 1 2 3)\" :failures ((:run 1 :kind \"failure\" :form \"(IOTA 3)\" :reason nil :expected \"(0 1 2)\" \
         :actual \"(0 1 2 3)\")))) :failing-rest nil :failing-dropped 0)";

    fn report(results: &str, stdout: &str, handle: &str) -> TestReport {
        decode::<TestReport>(
            "run-tests",
            &read(&format!(
                "(:system \"app\" :ran \"asdf:test-system \\\"app\\\"\" :frameworks (\"RT\") :milliseconds 660 \
                 :results ({results}) :compiler-errors () :compiler-warnings () :compiler-warning-count 0 \
                 :reloaded nil :suspects nil :stdout (\"{}\" 0) :output-handle {handle} :run-error nil)",
                stdout.replace('\\', "\\\\").replace('"', "\\\"")
            ))
            .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_suite_run_twice_is_counted_once_and_its_output_stays_behind_a_handle() {
        let red = report(RT_TWICE, "Doing 249 pending tests of 249 tests total.\n", "\"@3\"");
        assert!(red.failed() && !red.is_error());
        assert_eq!(
            red.render(16000),
            "FAILED: ran asdf:test-system \"app\" in 0.66 s.\nRT: 249 tests, run twice by the test-op: 3 failed in both runs, \
             246 passed.\nOutput: 44 characters; inspect @3 to read them.\n\n[FAIL] A-T::IOTA.1\n  Form: (IOTA 3)\n  \
             Expected: (0 1 2)\n  Actual: (0 1 2 3)"
        );
        let green = RT_TWICE
            .replace(":passed 246 :failed 3", ":passed 249 :failed 0")
            .replace(":failed-every-run 3", ":failed-every-run 0");
        let green = green.split(" :failing (").next().unwrap().to_string()
            + " :failing () :failing-rest nil :failing-dropped 0)";
        let green = report(&green, "Doing 249 pending tests of 249 tests total.\n", "\"@3\"");
        assert!(!green.failed());
        assert_eq!(
            green.render(16000),
            "PASSED: ran asdf:test-system \"app\" in 0.66 s.\nRT: 249 tests, run twice by the test-op: all passed.\nOutput: 44 \
             characters; inspect @3 to read them."
        );
    }

    #[test]
    fn a_failure_in_some_runs_only_is_told_apart() {
        let results = RT_TWICE.replace(":failed-every-run 3", ":failed-every-run 2");
        let text = report(&results, "", "nil").render(16000);
        assert!(
            text.contains("RT: 249 tests, run twice by the test-op: 3 failed (2 of them in both runs), 246 passed."),
            "{text}"
        );
        let fiveam = "(:framework \"FiveAM\" :tests 3 :runs 1 :uniform t :passed 1 :failed 1 :errors 1 :skipped 0 \
             :failed-every-run 2 :checks (:passed 4 :failed 2 :errors 1 :skipped 1) :failing () :failing-rest nil :failing-dropped 0)";
        let text = report(fiveam, "", "nil").render(16000);
        assert!(
            text.ends_with("\nFiveAM: 3 tests (8 checks): 2 failed (1 by signalling an error), 1 passed."),
            "{text}"
        );
    }

    #[test]
    fn a_run_without_results_is_judged_by_the_lines_that_name_failures() {
        let table = "Test            Result\nparse-empty     pass\nparse-number    FAIL (expected 3, got 4)\n\
                     error-handling  pass\n3 tests. Unexpected failures: PARSE-NUMBER\n";
        let failing = report("", table, "\"@2\"");
        assert!(failing.failed() && !failing.is_error());
        let text = failing.render(16000);
        assert_eq!(
            text,
            "FAILED: ran asdf:test-system \"app\" in 0.66 s.\nNo test framework's results were read: the test-op \
                 returned, and its output names failures (below).\nOutput: 149 characters; inspect @2 to read them.\n\n[output: lines that name failures or \
                 errors]\nparse-number    FAIL (expected 3, got 4)\n3 tests. Unexpected failures: PARSE-NUMBER"
        );
        let passing =
            report("", &table.replace("FAIL (expected 3, got 4)", "pass").replace("PARSE-NUMBER", "none"), "\"@2\"");
        assert!(!passing.failed(), "{}", passing.render(16000));
        // A run that returned naming no failures ends with the harness's verdict.
        assert!(passing.render(16000).ends_with(
            "\n\n[output: last lines]\nparse-number    pass\nerror-handling  pass\n3 tests. Unexpected failures: none"
        ));
        assert!(passing.render(16000).contains(
            "\nNo test framework's results were read: the test-op returned, and its output names no failures.\n"
        ));
        let silent = report("", "", "nil");
        assert!(!silent.failed());
        assert!(silent.render(16000).contains("the test-op returned and printed nothing."), "{}", silent.render(16000));
    }

    #[test]
    fn lines_that_name_failures() {
        for line in [
            "Fail: 1 (33%)",
            "Failed:     2",
            "2 out of 5 total tests failed: A, B.",
            "tests: 4 passed, 1 failed",
            "Test PARSE-NUMBER failed",
            "FAIL: parse-number",
            "Unexpected failures: PARSE-NUMBER, PARSE-LIST",
            "3 errors",
            "got an unexpected error: division by zero",
            "Some tests failed.",
        ] {
            assert!(names_failures(line), "{line}");
        }
        for line in [
            "Fail: 0 ( 0%)",
            "4 passed, 0 failed, 1 skipped",
            "No tests failed.",
            "Unexpected failures: none",
            "Unexpected failures:",
            "0 failures, 0 errors",
            "Failures: 0  Errors: 0",
            "error-handling    PASS",
            "Running test FOO .. ok",
            "Did 3 checks.",
        ] {
            assert!(!names_failures(line), "{line}");
        }
    }

    #[test]
    fn suspects_say_how_many_tests_ran_again_and_each_ones_kind_and_call() {
        let suspect = |name: &str, kind: &str, arguments: Option<&str>, value: Option<&str>, signalled: bool| Suspect {
            name: name.into(),
            kind: kind.into(),
            file: Some("app.lisp".into()),
            line: Some(7),
            failing: 2,
            passing: 1,
            signalled,
            arguments: arguments.map(Into::into),
            value: value.map(Into::into),
            defined_by: None,
        };
        let suspects = Suspects {
            failing_rerun: Some(2),
            passing_rerun: Some(40),
            passing: Some(90),
            suspects: vec![
                suspect("APP::PARSE", "function", Some("(\"1x\")"), None, true),
                suspect("APP:WITH-ROW", "macro", None, None, false),
                suspect("APP::STEP", "inline", Some("(3)"), None, false),
                Suspect {
                    defined_by: Some(DefiningMacro {
                        name: "APP::DEFINE-CONVERTER".into(),
                        file: Some("app.lisp".into()),
                        line: Some(2),
                    }),
                    ..suspect("APP::ENCODE", "function", None, None, false)
                },
            ],
            why: None,
        };
        assert_eq!(
            suspects.render(),
            "[suspects] likeliest first, from 2 failing and 40 of 90 passing tests (as many as 15 s allowed) run \
             again recording calls:\n1. APP::PARSE app.lisp:7 (2 of 2 failing, 1 passing; the error came from it)\n   \
             called with (\"1x\"), signalled the test's error\n2. APP:WITH-ROW app.lisp:7 (macro; 2 of 2 failing, 1 \
             passing)\n3. APP::STEP app.lisp:7 (inline function; 2 of 2 failing, 1 passing)\n   called with (3), did \
             not return\n4. APP::ENCODE app.lisp:7 (2 of 2 failing, 1 passing)\n   defined there by the macro \
             APP::DEFINE-CONVERTER app.lisp:2"
        );
        let none = Suspects { passing_rerun: Some(1), passing: Some(1), suspects: vec![], ..suspects };
        assert_eq!(
            none.render(),
            "[suspects] likeliest first, from 2 failing and 1 passing test run again recording calls:\nnone: the \
             failing tests reached none of the system's own definitions"
        );
    }
}
