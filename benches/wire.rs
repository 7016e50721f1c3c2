//! The swank wire: frame decoding and s-expression reading, in MB/s, on messages shaped like the
//! ones the server sends (a long `:indentation-update`, evaluation replies with output).
//!
//! Run with `cargo bench --bench wire`.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use swank_mcp::swank::codec::FrameCodec;
use swank_mcp::swank::{read, Form};
use tokio_util::codec::{Decoder, Encoder};

/// A reply of the kind evaluate-lisp gets: nested plists, escaped strings, output with newlines.
fn evaluation_reply(i: usize) -> String {
    let output = "line of output with \\\"quotes\\\" and unicode λ\n".repeat(20);
    format!(
        "(:return (:ok (:values ((\"(1 2 3 #<FOO {{1001}}> |Mixed Case| pkg::sym)\" 0)) :error nil \
         :stdout (\"{output}\" 0) :stderr (\"\" 0) :warnings (\"STYLE-WARNING: x\") :warnings-dropped 0 \
         :package \"COMMON-LISP-USER\" :notes nil)) {i})"
    )
}

/// An `:indentation-update` like the one swank sends on the first request (about 40 KB).
fn indentation_update() -> String {
    let entries: Vec<String> = (0..600)
        .map(|i| format!("(\"define-thing-{i}\" {} (\"COMMON-LISP-USER\" \"SB-IMPL\" \"SB-VM\"))", i % 4))
        .collect();
    format!("(:indentation-update ({}))", entries.join(" "))
}

fn messages() -> Vec<String> {
    let mut messages: Vec<String> = (0..200).map(evaluation_reply).collect();
    messages.push(indentation_update());
    messages
}

fn wire(c: &mut Criterion) {
    let messages = messages();
    let mut stream = BytesMut::new();
    for message in &messages {
        FrameCodec::default().encode(message.as_str(), &mut stream).unwrap();
    }
    let total = stream.len() as u64;

    let mut group = c.benchmark_group("wire");
    group.throughput(Throughput::Bytes(total));
    group.bench_function("decode frames", |b| {
        b.iter(|| {
            let mut codec = FrameCodec::default();
            let mut buffer = stream.clone();
            let mut count = 0;
            while let Some(frame) = codec.decode(&mut buffer).unwrap() {
                count += black_box(frame).len();
            }
            count
        })
    });
    group.bench_function("read s-expressions", |b| {
        b.iter(|| messages.iter().map(|m| black_box(read(black_box(m)).unwrap())).collect::<Vec<_>>())
    });
    group.finish();

    let request =
        Form::call("mcp-agent-helper", "evaluate", [Form::string("(defun f (x) \"doc\" (* x x))\n".repeat(100))]);
    let mut group = c.benchmark_group("wire");
    group.throughput(Throughput::Bytes(request.to_wire().len() as u64));
    group.bench_function("print a request", |b| b.iter(|| black_box(&request).to_wire()));
    group.finish();
}

criterion_group!(benches, wire);
criterion_main!(benches);
