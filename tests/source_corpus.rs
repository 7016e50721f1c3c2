//! Round-trips real Common Lisp code that nobody on this project wrote: every source file of the
//! Debian Common Lisp packages installed on the machine (CI installs `cl-swank cl-alexandria
//! cl-ppcre`).

use std::path::{Path, PathBuf};

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

#[test]
fn every_installed_lisp_source_file_round_trips_byte_for_byte() {
    let mut files = Vec::new();
    lisp_files(Path::new(CORPUS), &mut files);
    assert!(
        files.len() >= MIN_FILES,
        "only {} Lisp files under {CORPUS}; install the corpus with `apt-get install cl-swank cl-alexandria cl-ppcre`",
        files.len()
    );
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
