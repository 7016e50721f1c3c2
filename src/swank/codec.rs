//! The swank frame: six lower-case hex digits giving the payload length in UTF-8 **bytes**, then
//! the payload, one printed s-expression. The same framing serves Slynk.
//!
//! See docs/design.md, "The swank client".

use bytes::{Buf, BufMut, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

const HEADER_LEN: usize = 6;
/// Six hex digits cannot say more; a larger payload has to be cut down before it is sent.
pub const MAX_PAYLOAD: usize = 0xFF_FFFF;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The six header bytes, which are not all hex digits (lossily decoded).
    #[error("bad frame header {0:?}: expected six hex digits")]
    BadHeader(String),
    /// A payload to send of this many bytes, over [`MAX_PAYLOAD`]; nothing was written.
    #[error("frame of {0} bytes is over the protocol's limit of {MAX_PAYLOAD} bytes")]
    TooLarge(usize),
    /// The stream ended inside a frame, after this many of its bytes (header included).
    #[error("connection closed in the middle of a frame ({0} bytes of it received)")]
    Truncated(usize),
    /// Reading or writing the socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Reads and writes swank frames: decodes a byte stream into payloads (invalid UTF-8 replaced,
/// not an error) and encodes a payload with its header.
#[derive(Debug, Default)]
pub struct FrameCodec {
    /// The length of the frame whose header has been consumed but whose payload is incomplete.
    pending_len: Option<usize>,
}

impl Decoder for FrameCodec {
    type Item = String;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<String>, FrameError> {
        let len = match self.pending_len {
            Some(len) => len,
            None => {
                if src.len() < HEADER_LEN {
                    return Ok(None);
                }
                let header = &src[..HEADER_LEN];
                let len = std::str::from_utf8(header)
                    .ok()
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|h| usize::from_str_radix(h, 16).ok())
                    .ok_or_else(|| FrameError::BadHeader(String::from_utf8_lossy(header).into_owned()))?;
                src.advance(HEADER_LEN);
                self.pending_len = Some(len);
                len
            }
        };
        if src.len() < len {
            src.reserve(len - src.len());
            return Ok(None);
        }
        self.pending_len = None;
        let payload = src.split_to(len);
        // The servers always encode UTF-8; a stray invalid byte should cost one character, not
        // the connection.
        Ok(Some(match String::from_utf8(payload.to_vec()) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<String>, FrameError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() && self.pending_len.is_none() => Ok(None),
            None => Err(FrameError::Truncated(src.len() + self.pending_len.map_or(0, |_| HEADER_LEN))),
        }
    }
}

impl Encoder<&str> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, payload: &str, dst: &mut BytesMut) -> Result<(), FrameError> {
        let len = payload.len();
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLarge(len));
        }
        dst.reserve(HEADER_LEN + len);
        dst.put_slice(format!("{len:06x}").as_bytes());
        dst.put_slice(payload.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(payload: &str) -> BytesMut {
        let mut buf = BytesMut::new();
        FrameCodec::default().encode(payload, &mut buf).unwrap();
        buf
    }

    #[test]
    fn header_counts_bytes_not_characters() {
        let buf = encode("(:x \"λ🎉\")");
        // 5 ASCII bytes, 2 for λ, 4 for 🎉, 2 more ASCII: 13 bytes from 9 characters.
        assert_eq!(&buf[..6], b"00000d");
    }

    #[test]
    fn partial_frames_wait_for_the_rest() {
        let whole = encode("(:return (:ok 3) 1)");
        let mut codec = FrameCodec::default();
        let mut buf = BytesMut::new();
        for (i, byte) in whole.iter().enumerate() {
            buf.put_u8(*byte);
            let frame = codec.decode(&mut buf).unwrap();
            assert_eq!(frame.is_some(), i == whole.len() - 1);
        }
    }

    #[test]
    fn bad_header_is_an_error() {
        let mut buf = BytesMut::from(&b"00zz00(x)"[..]);
        assert!(matches!(FrameCodec::default().decode(&mut buf), Err(FrameError::BadHeader(h)) if h == "00zz00"));
        let mut buf = BytesMut::from(&b"+00001x"[..]);
        assert!(FrameCodec::default().decode(&mut buf).is_err());
    }

    #[test]
    fn oversized_payload_is_refused() {
        let big = "x".repeat(MAX_PAYLOAD + 1);
        assert!(matches!(FrameCodec::default().encode(&big, &mut BytesMut::new()), Err(FrameError::TooLarge(_))));
    }

    #[test]
    fn eof_inside_a_frame_is_reported() {
        let mut codec = FrameCodec::default();
        let mut buf = BytesMut::from(&b"000010(:ret"[..]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        assert!(matches!(codec.decode_eof(&mut buf), Err(FrameError::Truncated(_))));
        let mut empty = BytesMut::new();
        assert!(FrameCodec::default().decode_eof(&mut empty).unwrap().is_none());
    }

    proptest! {
        #[test]
        fn frames_round_trip_in_any_chunking(payloads in proptest::collection::vec(any::<String>(), 1..5), chunk in 1usize..50) {
            let mut wire = BytesMut::new();
            for p in &payloads {
                wire.extend_from_slice(&encode(p));
            }
            let mut codec = FrameCodec::default();
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            for piece in wire.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some(frame) = codec.decode(&mut buf).unwrap() {
                    out.push(frame);
                }
            }
            prop_assert_eq!(out, payloads);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut codec = FrameCodec::default();
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(_)) = codec.decode(&mut buf) {}
            let _ = codec.decode_eof(&mut buf);
        }
    }
}
