//! Round-trips real Common Lisp code that nobody on this project wrote: every source file of the
//! Debian Common Lisp packages installed on the machine (CI installs `cl-swank cl-alexandria
//! cl-ppcre`).

use std::path::{Path, PathBuf};
use std::process::Command;

use swank_mcp::source::Cst;

const CORPUS: &str = "/usr/share/common-lisp/source";
const MIN_FILES: usize = 50;

fn lisp_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            lisp_files(&path, out);
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("lisp" | "asd" | "lsp" | "cl")) {
            out.push(path);
        }
    }
}

fn corpus() -> Vec<PathBuf> {
    let mut files = Vec::new();
    lisp_files(Path::new(CORPUS), &mut files);
    assert!(
        files.len() >= MIN_FILES,
        "only {} Lisp files under {CORPUS}; install the corpus with `apt-get install cl-swank cl-alexandria cl-ppcre`",
        files.len()
    );
    files.sort();
    files
}

#[test]
fn every_installed_lisp_source_file_round_trips_byte_for_byte() {
    let files = corpus();
    let mut failures = Vec::new();
    let mut bytes = 0;
    for file in &files {
        let source = std::fs::read(file).expect("readable");
        bytes += source.len();
        match Cst::parse(&source) {
            Ok(cst) if cst.print() == source => {}
            Ok(_) => failures.push(format!("{}: reprint differs", file.display())),
            Err(e) => failures.push(format!("{}: {e}", file.display())),
        }
    }
    assert!(failures.is_empty(), "{} of {} files failed:\n{}", failures.len(), files.len(), failures.join("\n"));
    eprintln!("{} files, {bytes} bytes round-tripped", files.len());
}

/// Reads every corpus file with SBCL's own reader (`*read-suppress*` on, Latin-1 so positions
/// are byte offsets) and prints where each top-level `read` ended.
const SBCL_SCRIPT: &str = r#"
(dolist (path (rest (member "--" sb-ext:*posix-argv* :test #'string=)))
  (with-open-file (s path :external-format :latin-1)
    (let ((*read-suppress* t) (eof '#:eof))
      (format t "~a" path)
      (loop (let ((form (handler-case (read s nil eof) (error () eof))))
              (when (eq form eof) (return))
              (format t " ~d" (file-position s))))
      (terpri))))
"#;

/// The tree's top-level boundaries are the reader's: wherever SBCL's `read` stops after a
/// top-level form, a top-level form of the tree ends (`read` also eats one whitespace character
/// after a token). Forms SBCL skips (`#-sbcl`) leave gaps, and the first form it cannot read
/// (an unknown package in a feature expression) ends the comparison for that file. Needs `sbcl`
/// on the PATH, as every test against an image does.
#[test]
fn top_level_boundaries_agree_with_sbcl() {
    let files = corpus();
    let script = std::env::temp_dir().join(format!("swank-mcp-ends-{}.lisp", std::process::id()));
    std::fs::write(&script, SBCL_SCRIPT).expect("write script");
    let output = Command::new("sbcl")
        .args(["--non-interactive", "--no-sysinit", "--no-userinit", "--load"])
        .arg(&script)
        .arg("--")
        .args(&files)
        .output()
        .expect("sbcl runs (install it with `apt-get install sbcl`)");
    let _ = std::fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with('/')) {
        let mut fields = line.split(' ');
        let Some(path) = fields.next() else { continue };
        let source = std::fs::read(path).expect("readable");
        let cst = Cst::parse(&source).expect("parses");
        let ends: Vec<usize> = cst.top_level_forms().map(|id| cst.span(id).end).collect();
        for end in fields.filter_map(|f| f.parse::<usize>().ok()) {
            checked += 1;
            if !ends.contains(&end) && !ends.contains(&end.saturating_sub(1)) {
                mismatches.push(format!("{path}: SBCL ended a form at byte {end}"));
            }
        }
    }
    assert!(checked > 1000, "SBCL reported only {checked} forms:\n{stdout}");
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    eprintln!("{checked} top-level forms agree with SBCL");
}

/// Every definition of every corpus file, top-level and nested (inside `progn`, `eval-when`,
/// `locally`, `macrolet`, `symbol-macrolet`, often behind `#+`), is found by its operator and
/// name, and replacing it or deleting it changes no byte outside it: the replacement touches only
/// the lines the outline gives for it, and a delete leaves every other definition in place.
/// Prints the figures: files, definitions, nested ones. Slow in a debug build: `cargo test
/// --release -- --ignored`.
#[test]
#[ignore = "slow: edits every definition of every installed Lisp file"]
fn every_definition_is_edited_losslessly() {
    use swank_mcp::source::{outline, prepare_edit, AllowedRoots, EditRequest, Operation};
    let files = corpus();
    let roots = AllowedRoots::new(vec![PathBuf::from(CORPUS)]).expect("corpus root");
    let marker = "(lossless-check-marker)";
    let (mut checked_files, mut definitions, mut nested, mut edits) = (0, 0, 0, 0);
    let mut failures = Vec::new();
    for file in &files {
        let source = std::fs::read(file).expect("readable");
        let Ok(cst) = Cst::parse(&source) else { continue };
        checked_files += 1;
        let entries = outline(&cst);
        let line_starts: Vec<usize> = std::iter::once(0)
            .chain(source.iter().enumerate().filter(|(_, &b)| b == b'\n').map(|(i, _)| i + 1))
            .collect();
        let mut seen: std::collections::HashMap<(String, String), usize> = std::collections::HashMap::new();
        for entry in &entries {
            let (Some(operator), Some(name)) = (&entry.operator, &entry.name) else { continue };
            let count = seen.entry((operator.to_lowercase(), name.to_lowercase())).or_insert(0);
            *count += 1;
            definitions += 1;
            nested += usize::from(entry.depth > 0);
            let index = Some(*count);
            for operation in [Operation::Replace, Operation::Delete] {
                let content = if operation == Operation::Delete { "" } else { marker };
                let request =
                    EditRequest { form_type: operator, form_name: name, operation, content, old_text: "", index };
                let prepared = match prepare_edit(&roots, file, None, &request) {
                    Ok(prepared) => prepared,
                    Err(e) => {
                        failures.push(format!("{}: {operator} {name} #{}: {e}", file.display(), count));
                        continue;
                    }
                };
                edits += 1;
                let new = prepared.new_text();
                let prefix = source.iter().zip(new).take_while(|(a, b)| a == b).count();
                let suffix = source.iter().rev().zip(new.iter().rev()).take_while(|(a, b)| a == b).count();
                let changed_end = source.len() - suffix.min(source.len() - prefix);
                let lines = prepared.report().target_lines;
                let first = line_starts[lines.first - 1];
                let last = line_starts.get(lines.last).copied().unwrap_or(source.len());
                let within = match operation {
                    Operation::Replace => first <= prefix && changed_end <= last,
                    _ => Cst::parse(new).is_ok_and(|after| outline(&after).len() < entries.len()),
                };
                if !within {
                    failures.push(format!(
                        "{}: {operator} {name} #{} ({}): bytes {prefix}..{changed_end} changed outside lines {}",
                        file.display(),
                        count,
                        operation_name(operation),
                        lines
                    ));
                }
            }
        }
    }
    eprintln!("{checked_files} files, {definitions} named definitions ({nested} nested in progn, eval-when, locally, macrolet or symbol-macrolet), {edits} edits");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

fn operation_name(operation: swank_mcp::source::Operation) -> &'static str {
    match operation {
        swank_mcp::source::Operation::Replace => "replace",
        _ => "delete",
    }
}
