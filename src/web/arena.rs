//! [`value`]: header values that change with every response (an allowed request's
//! `RateLimit`, with its tokens left) written into a buffer of [`CHUNK`] bytes per thread,
//! each value a `Bytes` view of its part of the buffer. A thread allocates once per chunk,
//! some forty values of `RateLimit`, instead of once per value; the bytes crate frees a
//! chunk when the last value in it is dropped.
//!
//! Bounded: a thread holds at most one chunk it writes into; a chunk that is full stays
//! alive only as long as a value in it, so responses still being written hold at most one
//! chunk each (a response held by a slow client keeps up to [`CHUNK`] bytes, where it
//! would have kept its value's few dozen). A value longer than a chunk is copied on its
//! own, as without the buffer. Values kept for long (a refusal's memoized `RateLimit`)
//! are copies of their own, never views into the buffer.

use std::cell::RefCell;

use bytes::BytesMut;
use http::HeaderValue;

/// The bytes of one buffer: room for about forty `RateLimit` values of one limit.
pub(crate) const CHUNK: usize = 1024;

thread_local! {
    /// The rest of this thread's current chunk.
    static BUFFER: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// `text` as a header value whose bytes are in this thread's buffer; `None` if `text` is
/// not a valid header value.
pub(crate) fn value(text: &[u8]) -> Option<HeaderValue> {
    let in_buffer = || {
        BUFFER
            .try_with(|buffer| {
                let mut buffer = buffer.try_borrow_mut().ok()?;
                if buffer.capacity() - buffer.len() < text.len() {
                    // The full chunk lives on in the values that view it.
                    *buffer = BytesMut::with_capacity(CHUNK);
                }
                buffer.extend_from_slice(text);
                Some(buffer.split().freeze())
            })
            .ok()
            .flatten()
    };
    match (text.len() <= CHUNK).then(in_buffer).flatten() {
        Some(bytes) => HeaderValue::from_maybe_shared(bytes).ok(),
        // Longer than a chunk, the thread exiting, or (never on the request path) the
        // buffer in use: a copy of its own.
        None => HeaderValue::from_bytes(text).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_written_across_chunks() {
        let texts: Vec<String> = (0..500)
            .map(|i| format!("\"per-ip\";r={i};t={}", i % 7))
            .collect();
        let values: Vec<HeaderValue> = texts.iter().map(|t| value(t.as_bytes()).unwrap()).collect();
        for (t, v) in texts.iter().zip(&values) {
            assert_eq!(v.as_bytes(), t.as_bytes());
        }
    }

    #[test]
    fn invalid_text_is_refused_in_a_chunk_or_not() {
        assert!(value(b"bad\nvalue").is_none());
        assert!(value(&[b'a'; CHUNK + 1]).is_some());
        let mut long = vec![b'a'; CHUNK + 1];
        long[10] = 0;
        assert!(value(&long).is_none());
        // The refused text left nothing behind: the next value reads as itself.
        assert_eq!(value(b"ok").unwrap().as_bytes(), b"ok");
    }

    #[test]
    fn values_of_one_chunk_share_it_side_by_side() {
        BUFFER.with(|b| *b.borrow_mut() = BytesMut::with_capacity(CHUNK));
        let a = value(b"abc").unwrap();
        let b = value(b"defg").unwrap();
        assert_eq!(b.as_bytes().as_ptr(), a.as_bytes()[3..].as_ptr());
        // A value that does not fit in the rest of the chunk starts a new one.
        let rest = CHUNK - 7;
        let fill = value(&vec![b'x'; rest]).unwrap();
        assert_eq!(fill.as_bytes().as_ptr(), b.as_bytes()[4..].as_ptr());
        let next = value(b"h").unwrap();
        let chunk = a.as_bytes().as_ptr() as usize..a.as_bytes().as_ptr() as usize + CHUNK;
        assert!(!chunk.contains(&(next.as_bytes().as_ptr() as usize)));
        assert_eq!(next.as_bytes(), b"h");
    }
}
