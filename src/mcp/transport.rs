//! Newline-delimited JSON-RPC over stdio. Lines are raw bytes here: invalid UTF-8 and bad JSON
//! are the dispatcher's to answer with -32700, and an over-long line is skipped to its end and
//! reported, so one bad line never ends the session.
//!
//! See docs/design.md, "Layers".

use bytes::BytesMut;
use tokio_util::codec::Decoder;

/// What the reader yields for each line.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A line's bytes, without its `\n` (or `\r\n`); never only whitespace.
    Message(Vec<u8>),
    /// A line longer than the limit, discarded; carries its length so far.
    TooLong(usize),
}

/// Splits the input into [`Line`]s; a line over the limit is skipped to its end rather than
/// buffered.
#[derive(Debug)]
pub struct LineCodec {
    max_length: usize,
    /// Bytes of the current over-long line discarded so far; `Some` while skipping.
    discarding: Option<usize>,
    /// Where to resume looking for a newline in the buffer.
    scanned: usize,
}

impl LineCodec {
    /// A reader of lines of at most `max_length` bytes (not counting the newline).
    pub fn new(max_length: usize) -> Self {
        Self { max_length, discarding: None, scanned: 0 }
    }
}

impl Decoder for LineCodec {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        loop {
            let newline = buf[self.scanned..].iter().position(|b| *b == b'\n').map(|i| i + self.scanned);
            match (self.discarding, newline) {
                (Some(skipped), Some(end)) => {
                    let _ = buf.split_to(end + 1);
                    self.scanned = 0;
                    self.discarding = None;
                    return Ok(Some(Line::TooLong(skipped + end)));
                }
                (Some(skipped), None) => {
                    self.discarding = Some(skipped + buf.len());
                    buf.clear();
                    self.scanned = 0;
                    return Ok(None);
                }
                (None, Some(end)) if end > self.max_length => {
                    let _ = buf.split_to(end + 1);
                    self.scanned = 0;
                    return Ok(Some(Line::TooLong(end)));
                }
                (None, Some(end)) => {
                    let mut line = buf.split_to(end + 1);
                    line.truncate(end);
                    if line.last() == Some(&b'\r') {
                        line.truncate(end - 1);
                    }
                    self.scanned = 0;
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    return Ok(Some(Line::Message(line.to_vec())));
                }
                (None, None) if buf.len() > self.max_length => {
                    self.discarding = Some(buf.len());
                    buf.clear();
                    self.scanned = 0;
                    return Ok(None);
                }
                (None, None) => {
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        if let Some(line) = self.decode(buf)? {
            return Ok(Some(line));
        }
        // A last message without a newline still counts.
        if let Some(skipped) = self.discarding.take() {
            return Ok(Some(Line::TooLong(skipped)));
        }
        self.scanned = 0;
        if buf.iter().all(u8::is_ascii_whitespace) {
            buf.clear();
            return Ok(None);
        }
        Ok(Some(Line::Message(buf.split().to_vec())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize, chunk: usize) -> Vec<Line> {
        let mut codec = LineCodec::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            buf.extend_from_slice(piece);
            while let Some(line) = codec.decode(&mut buf).unwrap() {
                out.push(line);
            }
        }
        while let Some(line) = codec.decode_eof(&mut buf).unwrap() {
            out.push(line);
        }
        out
    }

    #[test]
    fn splits_lines_skipping_blank_ones_and_crlf() {
        for chunk in [1, 3, 100] {
            assert_eq!(
                lines(b"{\"a\":1}\r\n\n  \n{\"b\":2}\n{\"c\":3}", 100, chunk),
                vec![
                    Line::Message(b"{\"a\":1}".to_vec()),
                    Line::Message(b"{\"b\":2}".to_vec()),
                    Line::Message(b"{\"c\":3}".to_vec())
                ]
            );
        }
    }

    #[test]
    fn long_lines_are_skipped_and_reported_then_reading_goes_on() {
        let mut input = vec![b'x'; 50];
        input.extend_from_slice(b"\n{}\n");
        for chunk in [1, 7, 100] {
            let out = lines(&input, 10, chunk);
            assert!(matches!(out[0], Line::TooLong(n) if n >= 10), "{out:?}");
            assert_eq!(out[1], Line::Message(b"{}".to_vec()));
            assert_eq!(out.len(), 2);
        }
    }

    #[test]
    fn invalid_utf8_is_passed_on_for_the_dispatcher_to_reject() {
        assert_eq!(lines(b"\xff\xfe\n", 100, 1), vec![Line::Message(vec![0xff, 0xfe])]);
    }
}
