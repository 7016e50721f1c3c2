//! What the decoder targets share: a stream that arrives in reads of fuzzer-chosen sizes, fed to
//! a decoder the way `tokio_util::codec::FramedRead` feeds it.

use bytes::BytesMut;
use tokio_util::codec::Decoder;

/// Splits an input into read sizes and the stream. The first byte says how many of the bytes
/// after it (at most 15) are read sizes; a size of 0 is a read that brought nothing new. What the
/// listed reads leave of the stream arrives in one last read. So an input starting with a 0 byte
/// is its stream in a single read, which is how the seeds are written.
pub fn split_reads(data: &[u8]) -> (&[u8], &[u8]) {
    let Some((&count, rest)) = data.split_first() else {
        return (&[], &[]);
    };
    rest.split_at(usize::from(count % 16).min(rest.len()))
}

/// Feeds `stream` to `decoder` in reads of the given sizes and then ends it, calling `decode`
/// after every read and `decode_eof` at the end until each has nothing more to give, and
/// stopping at the first error as `FramedRead` does.
pub fn decode_in_reads<D: Decoder>(mut decoder: D, read_sizes: &[u8], stream: &[u8]) -> (Vec<D::Item>, Result<(), D::Error>) {
    let mut items = Vec::new();
    let mut buffer = BytesMut::new();
    let mut unread = stream;
    let everything_left = usize::MAX;
    for size in read_sizes.iter().map(|&size| usize::from(size)).chain([everything_left]) {
        let (read, rest) = unread.split_at(size.min(unread.len()));
        buffer.extend_from_slice(read);
        unread = rest;
        loop {
            match decoder.decode(&mut buffer) {
                Ok(Some(item)) => items.push(item),
                Ok(None) => break,
                Err(error) => return (items, Err(error)),
            }
        }
    }
    loop {
        match decoder.decode_eof(&mut buffer) {
            Ok(Some(item)) => items.push(item),
            Ok(None) => return (items, Ok(())),
            Err(error) => return (items, Err(error)),
        }
    }
}
