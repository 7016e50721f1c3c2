//! Peak memory of the source tools on a large file, in a process of its own (one test), so that
//! the peak resident set size belongs to this parse alone.
#![cfg(target_os = "linux")]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use swank_mcp::source::AllowedRoots;
use swank_mcp::tools::{edit_lisp_form, lisp_check_parens, lisp_outline};

use common::run_source_tool as run;

/// Counts the heap in use and its peak, to tell the parse's own allocations from the RSS.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = IN_USE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: as the caller promised.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller promised.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let now = IN_USE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size - layout.size();
            // A moving realloc holds both blocks for a moment.
            PEAK.fetch_max(now + layout.size(), Ordering::Relaxed);
        } else {
            IN_USE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: as the caller promised.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak resident set size since the last reset, in bytes.
fn peak_rss() -> u64 {
    let status = fs::read_to_string("/proc/self/status").expect("status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).expect("kB") * 1024
}

/// Resets the peak to the current resident set size.
fn reset_peak() -> bool {
    fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn current_rss() -> u64 {
    let status = fs::read_to_string("/proc/self/status").expect("status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).expect("kB") * 1024
}

#[test]
fn a_15_mb_parse_peaks_at_a_small_multiple_of_its_input() {
    let fixture =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/source/shapes.lisp")).expect("fixture");
    let mut code = String::new();
    while code.len() < 15_000_000 {
        code.push_str(&fixture);
        code.push('\n');
    }
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(dir.path().join("big.lisp"), &code).expect("write");
    let roots = AllowedRoots::new(vec![dir.path().to_path_buf()]).expect("roots");
    let input = code.len() as u64;
    let arguments = json!({"code": code});
    drop(code);
    let mut report = Vec::new();
    for (what, tool, arguments) in [
        ("lisp-check-parens file_path", &lisp_check_parens::TOOL, json!({"file_path": "big.lisp"})),
        ("lisp-outline file_path", &lisp_outline::TOOL, json!({"file_path": "big.lisp"})),
        ("lisp-check-parens code", &lisp_check_parens::TOOL, arguments),
        (
            "edit-lisp-form dry_run",
            &edit_lisp_form::TOOL,
            json!({"file_path": "big.lisp", "form_type": "defvar", "form_name": "*unit-circle*", "operation": "replace",
                   "content": "(defvar *unit-circle* nil)", "index": 1, "dry_run": true}),
        ),
    ] {
        if !reset_peak() {
            common::skip("cannot reset the peak RSS here (/proc/self/clear_refs)");
            return;
        }
        let before = current_rss();
        let heap_before = IN_USE.load(Ordering::Relaxed);
        PEAK.store(heap_before, Ordering::Relaxed);
        let output = run(tool, arguments, &roots);
        let heap = PEAK.load(Ordering::Relaxed) - heap_before;
        assert!(!output.is_error, "{}", output.text);
        let peak = peak_rss().saturating_sub(before);
        // The larger of the two: the RSS does not grow where the allocator reuses memory an
        // earlier step freed, and the heap counts capacity reserved but never touched (the tree
        // of edit-lisp-form reserves for dense code), which is not resident.
        let ratio = if what.starts_with("edit") { peak as f64 } else { heap.max(peak as usize) as f64 } / input as f64;
        report.push(format!(
            "{what}: {:.1} MB input, heap peak {:.1} MB, RSS peak {:.1} MB above the baseline ({ratio:.2}x)",
            input as f64 / 1e6,
            heap as f64 / 1e6,
            peak as f64 / 1e6
        ));
    }
    eprintln!("{}", report.join("\n"));
    // lisp-check-parens keeps no tree, and lisp-outline parses only the forms of its page: within
    // 4x their input (the file's bytes are 1x). edit-lisp-form needs the whole tree, about 24
    // bytes a node and a node per three bytes of code, for which 16x only guards against a
    // regression.
    for (line, bound) in report.iter().zip([4.0, 4.0, 4.0, 16.0]) {
        let ratio: f64 = line.rsplit('(').next().unwrap().trim_end_matches("x)").parse().unwrap();
        assert!(ratio <= bound, "{line}: more than {bound}x");
    }
}
