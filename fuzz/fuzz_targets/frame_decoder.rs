//! Swank frames from a peer that may send anything, in reads of any size (input layout: see
//! `swank_mcp_fuzz::split_reads`). However the stream is cut into reads, the decoder must give
//! the frames, and the error that ends them, that the protocol defines for the whole stream.

#![no_main]

use libfuzzer_sys::fuzz_target;
use swank_mcp::swank::codec::{FrameCodec, FrameError, MAX_PAYLOAD};
use swank_mcp_fuzz::{decode_in_reads, split_reads};

const HEADER_LEN: usize = 6;

#[derive(Debug, PartialEq)]
enum End {
    Clean,
    BadHeader(String),
    Truncated(usize),
}

fuzz_target!(|data: &[u8]| {
    let (read_sizes, stream) = split_reads(data);
    let (frames, result) = decode_in_reads(FrameCodec::default(), read_sizes, stream);
    let end = match result {
        Ok(()) => End::Clean,
        Err(FrameError::BadHeader(header)) => End::BadHeader(header),
        Err(FrameError::Truncated(received)) => End::Truncated(received),
        Err(other) => panic!("decoding cannot fail with {other:?}"),
    };
    for frame in &frames {
        // One character per payload byte at most, invalid bytes included.
        assert!(frame.chars().count() <= MAX_PAYLOAD);
    }
    assert_eq!((frames, end), frames_of(stream));
});

/// The frames of a whole stream, read straight from the protocol's definition: six hex digits
/// of payload length in bytes, then the payload, decoded as UTF-8 with invalid bytes replaced.
fn frames_of(mut stream: &[u8]) -> (Vec<String>, End) {
    let mut frames = Vec::new();
    loop {
        if stream.is_empty() {
            return (frames, End::Clean);
        }
        let Some(header) = stream.get(..HEADER_LEN) else {
            return (frames, End::Truncated(stream.len()));
        };
        if !header.iter().all(u8::is_ascii_hexdigit) {
            return (frames, End::BadHeader(String::from_utf8_lossy(header).into_owned()));
        }
        let length = header.iter().fold(0, |length, &digit| length * 16 + hex_value(digit));
        let Some(payload) = stream.get(HEADER_LEN..HEADER_LEN + length) else {
            return (frames, End::Truncated(stream.len()));
        };
        frames.push(String::from_utf8_lossy(payload).into_owned());
        stream = &stream[HEADER_LEN + length..];
    }
}

fn hex_value(digit: u8) -> usize {
    usize::from(match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        _ => digit - b'A' + 10,
    })
}
