//! The source CST's speed: parse and reprint a 1 MB file, and one `edit-lisp-form` call end to
//! end (arguments, root check, read, parse, find, edit, re-read check, diff, atomic write with
//! fsync) on a 20,000-line file.
//!
//! Run with `cargo bench --bench cst`.

use std::cell::Cell;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;
use swank_mcp::source::{AllowedRoots, Cst};
use swank_mcp::tools::{edit_lisp_form, Run};

/// One chunk of typical library code, with every kind of node the reader knows about.
fn chunk(i: usize) -> String {
    format!(
        r#";;; Section {i}

;; Computes the {i}th value.
;; Returns a fixnum.
(defun compute-{i} (x &optional (y {i}) &key (z "default \"z\""))
  "Docstring for compute-{i}: (parens) inside a string."
  (declare (type fixnum x))
  (let ((chars (list #\( #\) #\Space #\a))
        (table #(1 2 3))
        (bits #*1011))
    (if (> x y)
        `(,x ,@(list y z) #'car)
        (cl:funcall 'identity |odd ) symbol| :key-{i}))))

#+sbcl
(defmethod render-{i} ((shape circle) (stream (eql :stdout)))
  #| block comment #| nested |# |#
  (format stream "~a" (sb-ext:posix-getenv "HOME")))

#-sbcl (defvar *fallback-{i}* #p"/tmp/x")

(defparameter *matrix-{i}* #2A((1 2) (3 4)))

"#
    )
}

/// Chunks until the text reaches `min_bytes` bytes or `min_lines` lines.
fn generated(min_bytes: usize, min_lines: usize) -> String {
    let mut text = String::new();
    let mut i = 0;
    while text.len() < min_bytes || text.lines().count() < min_lines {
        text.push_str(&chunk(i));
        i += 1;
    }
    text
}

fn parse_and_print(c: &mut Criterion) {
    let text = generated(1 << 20, 0);
    let bytes = text.as_bytes();
    let mut group = c.benchmark_group("cst");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("parse+print 1 MB", |b| {
        b.iter(|| {
            let cst = Cst::parse(black_box(bytes)).expect("generated code parses");
            black_box(cst.print())
        })
    });
    group.finish();
}

fn edit_end_to_end(c: &mut Criterion) {
    let text = generated(0, 20_000);
    let chunks = text.matches(";;; Section").count();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("big.lisp"), &text).expect("write");
    let roots = AllowedRoots::new(vec![dir.path().to_path_buf()]).expect("roots");
    // A function in the middle of the file, replaced by one of two bodies in turn so every
    // iteration really changes the file.
    let name = format!("compute-{}", chunks / 2);
    let bodies = [format!("(defun {name} (x)\n  (* x 2))"), format!("(defun {name} (x)\n  (* x 3))")];
    let turn = Cell::new(0);
    let Run::Source { source: edit, .. } = edit_lisp_form::TOOL.run else {
        panic!("edit-lisp-form works on files in this process")
    };
    let mut group = c.benchmark_group("edit-lisp-form");
    group.bench_function(format!("replace one defun in a {}-line file", text.lines().count()), |b| {
        b.iter(|| {
            turn.set(1 - turn.get());
            let args = edit_lisp_form::TOOL
                .arguments(json!({
                "file_path": "big.lisp", "form_type": "defun", "form_name": name,
                "operation": "replace", "content": bodies[turn.get()],
                }))
                .expect("arguments");
            black_box(edit(&args, &roots).expect("the edit applies"))
        })
    });
    group.finish();
}

criterion_group!(benches, parse_and_print, edit_end_to_end);
criterion_main!(benches);
