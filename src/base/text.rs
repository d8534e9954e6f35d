//! [`StackText`]: bytes written into a buffer on the stack, for the header values and
//! response bodies rendered on every request.
//!
//! A field value or a problem document is a few dozen to a few hundred bytes of pieces
//! appended one after the other. Written here, each piece is one bounds check and one
//! copy (a `SmallVec` pays a capacity check through its inline/heap tag and a `memmove`
//! of the empty tail per piece); the text is then copied once into its owner, at its exact
//! size. Text longer than the buffer moves to the heap and goes on there.

/// Bytes appended into `N` bytes on the stack, then on the heap past them.
pub(crate) struct StackText<const N: usize> {
    /// The bytes written, while they fit; `N + 1` once they moved to `heap`.
    len: usize,
    bytes: [u8; N],
    heap: Vec<u8>,
}

impl<const N: usize> StackText<N> {
    /// An empty text.
    #[inline]
    pub(crate) fn new() -> Self {
        Self {
            len: 0,
            bytes: [0; N],
            heap: Vec::new(),
        }
    }

    /// Appends `piece`.
    #[inline]
    pub(crate) fn push(&mut self, piece: &[u8]) {
        let end = self.len + piece.len();
        // Past `N` (or once on the heap, where `len` is `N + 1`) there is no such range.
        match self.bytes.get_mut(self.len..end) {
            Some(room) => {
                room.copy_from_slice(piece);
                self.len = end;
            }
            None => self.push_on_heap(piece),
        }
    }

    /// Appends one byte.
    #[inline]
    pub(crate) fn push_byte(&mut self, byte: u8) {
        self.push(&[byte]);
    }

    #[cold]
    fn push_on_heap(&mut self, piece: &[u8]) {
        if self.len <= N {
            self.heap.reserve(2 * N + piece.len());
            self.heap.extend_from_slice(&self.bytes[..self.len]);
            self.len = N + 1;
        }
        self.heap.extend_from_slice(piece);
    }

    /// The bytes written so far.
    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self.bytes.get(..self.len) {
            Some(bytes) => bytes,
            None => &self.heap,
        }
    }

    /// Whether nothing was written.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_appended_in_order_on_the_stack_and_past_it() {
        let mut text = StackText::<8>::new();
        assert!(text.is_empty());
        text.push(b"abc");
        text.push_byte(b'-');
        text.push(b"defg");
        assert_eq!(text.as_bytes(), b"abc-defg");
        // Past the 8 bytes: everything moves to the heap, in order.
        text.push(b"hij");
        text.push_byte(b'!');
        assert_eq!(text.as_bytes(), b"abc-defghij!");
        assert!(!text.is_empty());

        let mut long = StackText::<4>::new();
        long.push(b"longer than four");
        assert_eq!(long.as_bytes(), b"longer than four");
        long.push(b"");
        assert_eq!(long.as_bytes(), b"longer than four");
    }
}
