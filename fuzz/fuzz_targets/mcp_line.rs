//! The MCP stdin line reader on any bytes, in reads of any size, with a small line limit so that
//! over-long lines are common. Input layout: one byte of line limit, then as in
//! `swank_mcp_fuzz::split_reads`. However the stream is cut into reads, the lines must be the
//! ones the transport defines for the whole stream.

#![no_main]

use libfuzzer_sys::fuzz_target;
use swank_mcp::mcp::transport::{Line, LineCodec};
use swank_mcp_fuzz::{decode_in_reads, split_reads};

fuzz_target!(|data: &[u8]| {
    let Some((&max_length, data)) = data.split_first() else { return };
    let max_length = usize::from(max_length);
    let (read_sizes, stream) = split_reads(data);
    let (lines, result) = decode_in_reads(LineCodec::new(max_length), read_sizes, stream);
    if let Err(error) = result {
        panic!("reading lines from memory cannot fail: {error}");
    }
    assert_eq!(lines, lines_of(stream, max_length));
});

/// The lines of a whole stream: split at `\n`, the last one counting without it too; one `\r`
/// before a `\n` dropped; lines of only whitespace skipped; a line over the limit reported with
/// its length instead of its bytes.
fn lines_of(stream: &[u8], max_length: usize) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        let (line, terminated) = match rest.iter().position(|&b| b == b'\n') {
            Some(end) => (&rest[..end], true),
            None => (rest, false),
        };
        rest = &rest[line.len() + usize::from(terminated)..];
        if line.len() > max_length {
            lines.push(Line::TooLong(line.len()));
            continue;
        }
        let line = match line.strip_suffix(b"\r") {
            Some(without_cr) if terminated => without_cr,
            _ => line,
        };
        if !line.iter().all(u8::is_ascii_whitespace) {
            lines.push(Line::Message(line.to_vec()));
        }
    }
    lines
}
