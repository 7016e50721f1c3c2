//! The source tools against an attacker who can write inside a root, and against files that are
//! not plain writable text: a directory swapped for a symlink to outside while tools run, FIFOs,
//! devices, read-only files, files of another user, and temporary files left by a killed server.
#![cfg(target_os = "linux")]

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use swank_mcp::source::AllowedRoots;
use swank_mcp::tools::{edit_lisp_form, lisp_check_parens, lisp_outline, ToolOutput};

use common::run_source_tool as run;

fn edit(roots: &AllowedRoots, file: &str, body: &str) -> ToolOutput {
    run(
        &edit_lisp_form::TOOL,
        json!({"file_path": file, "form_type": "defun", "form_name": "f", "operation": "replace",
               "content": format!("(defun f () {body})")}),
        roots,
    )
}

fn cstring(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("no NUL")
}

/// Names in `dir` that are temporary files of an edit.
fn temps(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".swank-mcp.tmp"))
        .collect()
}

/// A directory inside the root is exchanged with a symlink to a directory outside, and back, in
/// a tight loop, while edits and outlines of a file in it run. Nothing outside may be written
/// or read, and no temporary file may stay behind.
#[test]
fn a_directory_swapped_for_a_symlink_never_lets_a_tool_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    fs::create_dir_all(root.join("race")).expect("mkdir race");
    fs::create_dir(&outside).expect("mkdir outside");
    fs::write(root.join("race/b.lisp"), "(defun inside-marker () 0)\n\n(defun f () 0)\n").expect("write");
    let secret = "(defun outside-marker () 0)\n\n(defun f () :outside)\n\n(defun g () 0)\n";
    fs::write(outside.join("b.lisp"), secret).expect("write");
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    fs::File::options().write(true).open(outside.join("b.lisp")).and_then(|f| f.set_modified(old)).expect("mtime");
    std::os::unix::fs::symlink(&outside, root.join("swap")).expect("symlink");
    let roots = AllowedRoots::new(vec![root.clone()]).expect("roots");

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        let (a, b) = (cstring(&root.join("race")), cstring(&root.join("swap")));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: two NUL-terminated paths.
                let done = unsafe {
                    libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE)
                };
                assert_eq!(done, 0, "renameat2: {}", std::io::Error::last_os_error());
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let (mut edits_done, mut reads_done, mut outside_reads) = (0, 0, 0);
    let calls: usize = std::env::var("SWAP_RACE_CALLS").ok().and_then(|n| n.parse().ok()).unwrap_or(1000);
    for i in 0..calls {
        // Both the relative and the absolute spelling.
        let file = if i % 2 == 0 { "race/b.lisp".to_string() } else { root.join("race/b.lisp").display().to_string() };
        let output = edit(&roots, &file, &i.to_string());
        if !output.is_error {
            edits_done += 1;
        }
        let output = run(&lisp_outline::TOOL, json!({"file_path": file}), &roots);
        if output.text.contains("outside-marker") {
            outside_reads += 1;
        } else if !output.is_error {
            assert!(output.text.contains("inside-marker"), "{}", output.text);
            reads_done += 1;
        }
        let output = run(&lisp_check_parens::TOOL, json!({"file_path": file}), &roots);
        // Only the file outside has three forms.
        if output.text.contains("3 complete") {
            outside_reads += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("swapper");

    eprintln!(
        "{calls} calls of each tool during {} swaps: {edits_done} edits and {reads_done} outlines got through, \
         {outside_reads} outlines read outside",
        swaps.load(Ordering::Relaxed)
    );
    assert_eq!(outside_reads, 0, "outlines read the file outside the root");
    // Whichever way round the directories ended up, the real one is inside.
    let inside = if root.join("race").is_symlink() { root.join("swap") } else { root.join("race") };
    assert_eq!(fs::read_to_string(outside.join("b.lisp")).expect("read"), secret, "written outside the root");
    assert_eq!(fs::metadata(outside.join("b.lisp")).and_then(|m| m.modified()).expect("mtime"), old);
    assert_eq!(fs::read_dir(&outside).expect("ls").count(), 1, "a file appeared outside the root");
    assert_eq!(temps(&inside), Vec::<String>::new(), "temporary files left inside");
    assert!(fs::read_to_string(inside.join("b.lisp")).expect("read").contains("inside-marker"));
    assert!(swaps.load(Ordering::Relaxed) > 100, "the race did not run");
    assert!(edits_done > 0 && reads_done > 0, "nothing got through at all: {edits_done} edits, {reads_done} reads");
}

/// A root with a file `a.lisp` in it.
fn project() -> (tempfile::TempDir, PathBuf, AllowedRoots) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    fs::create_dir(&root).expect("mkdir");
    fs::write(root.join("a.lisp"), "(defun f () 1)\n").expect("write");
    let roots = AllowedRoots::new(vec![root.clone()]).expect("roots");
    (dir, root, roots)
}

/// Runs `call`, which must come back within a few seconds.
fn quickly<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(call()));
    rx.recv_timeout(Duration::from_secs(10)).expect("the call blocked")
}

#[test]
fn fifos_devices_directories_and_sockets_are_refused_without_blocking() {
    let (_dir, root, roots) = project();
    let fifo = cstring(&root.join("pipe.lisp"));
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    fs::create_dir(root.join("dir.lisp")).expect("mkdir");
    let _socket = std::os::unix::net::UnixListener::bind(root.join("socket.lisp")).expect("bind");
    for (name, kind) in [("pipe.lisp", "a FIFO (named pipe)"), ("dir.lisp", "a directory"), ("socket.lisp", "a socket")]
    {
        for tool in [&lisp_outline::TOOL, &lisp_check_parens::TOOL] {
            let roots = roots.clone();
            let output = quickly(move || run(tool, json!({"file_path": name}), &roots));
            assert!(output.is_error, "{}", output.text);
            assert_eq!(
                output.text,
                format!("`{name}` is {kind}, not a regular file: the source tools only read and edit regular files.")
            );
        }
        let roots = roots.clone();
        let output = quickly(move || edit(&roots, name, "2"));
        assert!(output.is_error && output.text.contains("not a regular file"), "{}", output.text);
    }
    // /dev/zero, with /dev as a root, and a symlink to it from the project.
    let dev = AllowedRoots::new(vec![PathBuf::from("/dev"), root.clone()]).expect("roots");
    std::os::unix::fs::symlink("/dev/zero", root.join("zero.lisp")).expect("symlink");
    for file in ["/dev/zero", &root.join("zero.lisp").display().to_string()] {
        let (roots, path) = (dev.clone(), file.to_string());
        let output = quickly(move || run(&lisp_outline::TOOL, json!({"file_path": path}), &roots));
        assert_eq!(
            output.text,
            "`zero` is a character device, not a regular file: the source tools only read and edit regular files."
        );
        let (roots, file) = (dev.clone(), file.to_string());
        let output = quickly(move || edit(&roots, &file, "2"));
        assert!(output.is_error && output.text.contains("not a regular file"), "{}", output.text);
    }
    // A symlink to /dev/zero with only the project as root is outside it.
    let output = run(&lisp_outline::TOOL, json!({"file_path": "zero.lisp"}), &roots);
    assert!(output.text.contains("outside the allowed roots"), "{}", output.text);
    // Many FIFO calls leave no thread behind: each returns at once.
    let started = Instant::now();
    for _ in 0..200 {
        assert!(run(&lisp_outline::TOOL, json!({"file_path": "pipe.lisp"}), &roots).is_error);
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_read_only_file_is_not_replaced() {
    let (_dir, root, roots) = project();
    let file = root.join("a.lisp");
    fs::set_permissions(&file, fs::Permissions::from_mode(0o444)).expect("chmod");
    let before = fs::metadata(&file).expect("stat");
    let output = edit(&roots, "a.lisp", "2");
    assert!(output.is_error);
    assert_eq!(
        output.text,
        "`a.lisp` is read-only (mode r--r--r--): it is not replaced, as an editor would not without being forced. \
         Make it writable first if it should change. Nothing written."
    );
    let after = fs::metadata(&file).expect("stat");
    assert_eq!((after.ino(), after.mtime(), after.mode()), (before.ino(), before.mtime(), before.mode()));
    assert_eq!(fs::read_to_string(&file).expect("read"), "(defun f () 1)\n");
    assert_eq!(temps(&root), Vec::<String>::new());
    // A dry run still shows what the edit would be.
    let output = run(
        &edit_lisp_form::TOOL,
        json!({"file_path": "a.lisp", "form_type": "defun", "form_name": "f", "operation": "replace",
               "content": "(defun f () 2)", "dry_run": true}),
        &roots,
    );
    assert!(!output.is_error, "{}", output.text);
}

#[test]
fn a_file_of_another_user_is_not_replaced() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        common::skip("chown to another user needs root");
        return;
    }
    let (_dir, root, roots) = project();
    let file = root.join("a.lisp");
    std::os::unix::fs::chown(&file, Some(65534), Some(65534)).expect("chown");
    let output = edit(&roots, "a.lisp", "2");
    assert!(output.is_error);
    assert_eq!(
        output.text,
        "`a.lisp` belongs to another user (uid 65534; the server runs as uid 0): an edit would replace it with a file \
         the server's user owns, so it is refused. Nothing written."
    );
    let after = fs::metadata(&file).expect("stat");
    assert_eq!((after.uid(), after.gid()), (65534, 65534));
    assert_eq!(fs::read_to_string(&file).expect("read"), "(defun f () 1)\n");
    assert_eq!(temps(&root), Vec::<String>::new());
}

#[test]
fn a_temporary_file_of_a_dead_server_is_removed_by_the_next_edit_there() {
    let (_dir, root, roots) = project();
    // A process that has exited: its pid is free (until reused, which is unlikely this soon).
    let mut child = std::process::Command::new("true").spawn().expect("spawn");
    let dead = child.id();
    child.wait().expect("wait");
    let stale = format!(".a.lisp.{dead}.3.swank-mcp.tmp");
    fs::write(root.join(&stale), "half a file").expect("write");
    // One of a live server (this one) stays: it may be an edit in progress.
    let live = format!(".other.lisp.{}.0.swank-mcp.tmp", std::process::id());
    fs::write(root.join(&live), "in progress").expect("write");
    let output = edit(&roots, "a.lisp", "2");
    assert!(!output.is_error, "{}", output.text);
    assert_eq!(temps(&root), vec![live]);
}

#[test]
fn a_failed_write_leaves_no_temporary_file() {
    let (_dir, root, roots) = project();
    // Content that reads as a form but makes the file not read back as intended is refused
    // before any write; a file that changed underneath is refused after the temporary file was
    // written. Both leave nothing.
    let output = edit(&roots, "a.lisp", "1 ;");
    assert!(output.is_error);
    assert_eq!(temps(&root), Vec::<String>::new());
    // A directory the server cannot write to (not for root, which ignores the bits).
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        fs::set_permissions(&root, fs::Permissions::from_mode(0o555)).expect("chmod");
        let output = edit(&roots, "a.lisp", "2");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).expect("chmod");
        assert!(output.is_error && output.text.contains("Cannot write"), "{}", output.text);
        assert_eq!(temps(&root), Vec::<String>::new());
    }
}

#[test]
fn symlinks_that_stay_inside_keep_working() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    fs::create_dir_all(one.join("src")).expect("mkdir");
    fs::create_dir(&two).expect("mkdir");
    fs::write(one.join("src/a.lisp"), "(defun f () 1)\n").expect("write");
    fs::write(two.join("b.lisp"), "(defun f () 1)\n").expect("write");
    // Relative and absolute links to a directory and to files, within a root and across roots.
    std::os::unix::fs::symlink("src", one.join("rel-dir")).expect("symlink");
    std::os::unix::fs::symlink(one.join("src"), one.join("abs-dir")).expect("symlink");
    std::os::unix::fs::symlink(one.join("src/a.lisp"), one.join("abs.lisp")).expect("symlink");
    std::os::unix::fs::symlink("../two/b.lisp", one.join("cross.lisp")).expect("symlink");
    let roots = AllowedRoots::new(vec![one.clone(), two.clone()]).expect("roots");
    for (i, file) in ["rel-dir/a.lisp", "abs-dir/a.lisp", "abs.lisp", "cross.lisp"].iter().enumerate() {
        let output = edit(&roots, file, &format!("{}", i + 10));
        assert!(!output.is_error, "{file}: {}", output.text);
        let output = run(&lisp_outline::TOOL, json!({"file_path": file}), &roots);
        assert!(!output.is_error, "{file}: {}", output.text);
    }
    assert_eq!(fs::read_to_string(one.join("src/a.lisp")).expect("read"), "(defun f () 12)\n");
    assert_eq!(fs::read_to_string(two.join("b.lisp")).expect("read"), "(defun f () 13)\n");
    assert!(one.join("abs.lisp").is_symlink() && one.join("cross.lisp").is_symlink());
}

/// A file of 400,000 forms: the outline comes in pages of at most 2,000 entries, each page says
/// where the next starts, and every page is reachable.
#[test]
fn the_outline_of_a_huge_file_is_paged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut code = String::with_capacity(10_000_000);
    for i in 0..400_000 {
        code.push_str(&format!("(defun f{i} () {i})\n"));
    }
    fs::write(dir.path().join("huge.lisp"), &code).expect("write");
    let roots = AllowedRoots::new(vec![dir.path().to_path_buf()]).expect("roots");
    let started = Instant::now();
    let output = run(&lisp_outline::TOOL, json!({"file_path": "huge.lisp"}), &roots);
    assert!(!output.is_error, "{}", output.text);
    eprintln!("first page: {} bytes in {:?}", output.text.len(), started.elapsed());
    // A page ends after the form that brings it past about 16,000 characters, whatever the forms' count.
    let structured = output.structured_value().expect("structured");
    let shown = structured["forms"].as_array().map_or(0, Vec::len);
    let lines: Vec<&str> = output.text.lines().collect();
    assert_eq!(lines.len(), shown + 3);
    assert!((15_000..16_200).contains(&output.text.chars().count()), "{} characters", output.text.chars().count());
    assert_eq!(lines[0], "huge.lisp: 400000 top-level forms, 400000 lines");
    assert_eq!(lines[1], format!("forms 1 to {shown}:"));
    assert_eq!(lines[2], format!("{:<w$}  defun f0", 1, w = shown.to_string().len()));
    assert_eq!(lines[shown + 2], format!("... {} more; use `offset: {shown}` for the next page.", 400_000 - shown));
    assert_eq!(
        (structured["total_forms"].as_u64(), structured["next_offset"].as_u64()),
        (Some(400_000), Some(shown as u64))
    );

    let output = run(&lisp_outline::TOOL, json!({"file_path": "huge.lisp", "offset": shown}), &roots);
    let lines: Vec<&str> = output.text.lines().collect();
    assert!(lines[1].starts_with(&format!("forms {} to ", shown + 1)), "{}", lines[1]);
    assert!(lines[2].starts_with(&format!("{} ", shown + 1)) && lines[2].ends_with(&format!(" defun f{shown}")));
    let output = run(&lisp_outline::TOOL, json!({"file_path": "huge.lisp", "offset": 399_990, "limit": 50}), &roots);
    let lines: Vec<&str> = output.text.lines().collect();
    assert_eq!(lines.len(), 12, "{}", output.text);
    assert_eq!(lines[11], "400000  defun f399999");
    assert_eq!(output.structured_value().expect("structured")["next_offset"], Value::Null);
    let output = run(&lisp_outline::TOOL, json!({"file_path": "huge.lisp", "offset": 500_000}), &roots);
    assert!(output.text.contains("(no forms from offset 500000: the file has 400000)"), "{}", output.text);
    let output = run(&lisp_outline::TOOL, json!({"file_path": "huge.lisp", "limit": 2001}), &roots);
    assert!(output.is_error && output.text.contains("`limit`"), "{}", output.text);
}

/// Files over 64 MiB are refused with their size unless `large_file` is passed.
#[test]
fn a_file_over_the_size_bound_is_read_only_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = fs::File::create(dir.path().join("big.lisp")).expect("create");
    // Sparse: 65 MiB of NUL bytes costs no disk.
    file.set_len(65 * 1024 * 1024).expect("truncate");
    let roots = AllowedRoots::new(vec![dir.path().to_path_buf()]).expect("roots");
    for tool in [&lisp_outline::TOOL, &lisp_check_parens::TOOL] {
        let output = run(tool, json!({"file_path": "big.lisp"}), &roots);
        assert!(output.is_error);
        assert_eq!(
            output.text,
            "`big.lisp` is 68.2 MB, more than the 67.1 MB read without asking. Pass `large_file: true` to read it \
             anyway; that takes time and memory in proportion to its size."
        );
    }
    let output = edit(&roots, "big.lisp", "2");
    assert!(output.is_error && output.text.contains("`large_file: true`"), "{}", output.text);
    // Asked: it is read (NUL bytes are symbol constituents: one token).
    let output = run(&lisp_check_parens::TOOL, json!({"file_path": "big.lisp", "large_file": true}), &roots);
    assert!(!output.is_error, "{}", output.text);
}
