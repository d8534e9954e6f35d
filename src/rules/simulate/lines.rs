//! Reading a log line by line with a bounded length: an over-long line is skipped to its
//! end without being held, whatever its size.

use std::io::{self, BufRead};

/// One line of the input, or why it is not there.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// The line's bytes, without its `\n` (or `\r\n`).
    Text(&'a [u8]),
    /// The line was longer than the cap; its bytes were read and dropped.
    TooLong,
}

/// A reader of lines of at most `cap` bytes.
pub(crate) struct Lines<R> {
    input: R,
    cap: usize,
    buf: Vec<u8>,
    /// The 1-based number of the line last returned.
    number: u64,
    /// Bytes of the input the last line was read from in place, consumed on the next
    /// call.
    pending: usize,
}

impl<R: BufRead> Lines<R> {
    pub(crate) fn new(input: R, cap: usize) -> Self {
        Self {
            input,
            cap,
            buf: Vec::new(),
            number: 0,
            pending: 0,
        }
    }

    /// The next line and its number; `None` at the end of the input.
    pub(crate) fn next_line(&mut self) -> io::Result<Option<(u64, Line<'_>)>> {
        self.input.consume(std::mem::take(&mut self.pending));
        // A whole line in the reader's buffer is read in place, not copied.
        let cap = self.cap;
        if let Some(end) = memchr(fill(&mut self.input)?).filter(|&end| end <= cap) {
            self.number += 1;
            self.pending = end + 1;
            let mut line = &self.input.fill_buf()?[..end];
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            return Ok(Some((self.number, Line::Text(line))));
        }
        self.buf.clear();
        let mut too_long = false;
        let mut read_any = false;
        loop {
            let chunk = fill(&mut self.input)?;
            if chunk.is_empty() {
                if !read_any {
                    return Ok(None);
                }
                break;
            }
            read_any = true;
            let (part, used, done) = match memchr(chunk) {
                Some(i) => (&chunk[..i], i + 1, true),
                None => (chunk, chunk.len(), false),
            };
            if !too_long {
                if self.buf.len() + part.len() > self.cap {
                    too_long = true;
                    self.buf.clear();
                } else {
                    self.buf.extend_from_slice(part);
                }
            }
            self.input.consume(used);
            if done {
                break;
            }
        }
        self.number += 1;
        if too_long {
            return Ok(Some((self.number, Line::TooLong)));
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        Ok(Some((self.number, Line::Text(&self.buf))))
    }
}

/// The reader's buffered bytes (empty at the end), read again after an interrupted read.
fn fill<R: BufRead>(input: &mut R) -> io::Result<&[u8]> {
    loop {
        match input.fill_buf() {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    // Asked again, a filled buffer is given as it is (the borrow checker cannot yet
    // return the first answer from inside the loop).
    input.fill_buf()
}

fn memchr(bytes: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8], cap: usize) -> Vec<(u64, Option<Vec<u8>>)> {
        all_through(input, cap, 4)
    }

    /// Every line of `input`, read through a buffer of `capacity` bytes.
    fn all_through(input: &[u8], cap: usize, capacity: usize) -> Vec<(u64, Option<Vec<u8>>)> {
        let mut lines = Lines::new(io::BufReader::with_capacity(capacity, input), cap);
        let mut out = Vec::new();
        while let Some((n, line)) = lines.next_line().unwrap() {
            out.push((
                n,
                match line {
                    Line::Text(t) => Some(t.to_vec()),
                    Line::TooLong => None,
                },
            ));
        }
        out
    }

    #[test]
    fn splits_lines_and_skips_long_ones() {
        let got = all(b"ab\r\n0123456789abc\nxyz", 8);
        assert_eq!(
            got,
            vec![
                (1, Some(b"ab".to_vec())),
                (2, None),
                (3, Some(b"xyz".to_vec()))
            ]
        );
        assert_eq!(all(b"", 8), vec![]);
        assert_eq!(all(b"\n\n", 8), vec![(1, Some(vec![])), (2, Some(vec![]))]);
        // The same through a buffer that holds them whole (read in place).
        assert_eq!(got, all_through(b"ab\r\n0123456789abc\nxyz", 8, 4096));
        assert_eq!(
            all_through(b"12345678\n123456789\n", 8, 4096),
            vec![(1, Some(b"12345678".to_vec())), (2, None)]
        );
    }

    /// A line whole in the reader's buffer is read there: nothing is copied.
    #[test]
    fn a_line_in_the_buffer_is_read_in_place() {
        let input = b"one\ntwo\r\nthree";
        let mut lines = Lines::new(io::BufReader::new(&input[..]), 64);
        assert_eq!(lines.next_line().unwrap(), Some((1, Line::Text(b"one"))));
        assert_eq!(lines.next_line().unwrap(), Some((2, Line::Text(b"two"))));
        assert_eq!(lines.buf.capacity(), 0, "nothing was copied");
        // The last line has no newline: it is gathered.
        assert_eq!(lines.next_line().unwrap(), Some((3, Line::Text(b"three"))));
        assert_eq!(lines.next_line().unwrap(), None);
    }

    /// A reader whose reads fail: first `interruptions` times with `Interrupted`, then
    /// for good with `error` (or, if `None`, it yields `data`).
    struct Failing {
        interruptions: usize,
        error: Option<io::ErrorKind>,
        data: &'static [u8],
    }

    impl io::Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            unreachable!("read through fill_buf")
        }
    }

    impl BufRead for Failing {
        fn fill_buf(&mut self) -> io::Result<&[u8]> {
            if self.interruptions > 0 {
                self.interruptions -= 1;
                return Err(io::ErrorKind::Interrupted.into());
            }
            match self.error {
                Some(kind) => Err(kind.into()),
                None => Ok(self.data),
            }
        }

        fn consume(&mut self, n: usize) {
            self.data = &self.data[n..];
        }
    }

    /// An interrupted read is tried again; any other failure ends the reading with it.
    #[test]
    fn interrupted_reads_are_retried_and_failures_returned() {
        let mut lines = Lines::new(
            Failing {
                interruptions: 3,
                error: None,
                data: b"a\nb",
            },
            64,
        );
        assert_eq!(lines.next_line().unwrap(), Some((1, Line::Text(b"a"))));
        assert_eq!(lines.next_line().unwrap(), Some((2, Line::Text(b"b"))));
        assert_eq!(lines.next_line().unwrap(), None);
        let mut lines = Lines::new(
            Failing {
                interruptions: 1,
                error: Some(io::ErrorKind::BrokenPipe),
                data: b"",
            },
            64,
        );
        assert_eq!(
            lines.next_line().unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    /// A line far over the cap never makes the buffer grow past it.
    #[test]
    fn long_line_is_not_held() {
        let huge = vec![b'x'; 1 << 20];
        let mut lines = Lines::new(io::BufReader::new(&huge[..]), 1024);
        assert_eq!(lines.next_line().unwrap().unwrap().1, Line::TooLong);
        assert!(lines.buf.capacity() <= 2048);
        assert!(lines.next_line().unwrap().is_none());
    }

    proptest::proptest! {
        /// Whatever the bytes and the cap: one line per newline (and one for a last
        /// unterminated piece), each either its exact text within the cap or too long, and
        /// the buffer never grows past the cap by more than a read's chunk.
        #[test]
        fn lines_are_bounded(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![3 => proptest::num::u8::ANY, 1 => proptest::strategy::Just(b'\n')],
                0..2000,
            ),
            cap in 1usize..64,
            capacity in proptest::prop_oneof![proptest::strategy::Just(16usize), proptest::strategy::Just(4096)],
        ) {
            let expected: Vec<&[u8]> = {
                let mut parts: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
                if bytes.last().is_none_or(|&b| b == b'\n') {
                    parts.pop();
                }
                parts
            };
            let mut lines = Lines::new(io::BufReader::with_capacity(capacity, &bytes[..]), cap);
            let mut n = 0;
            while let Some((number, line)) = lines.next_line().unwrap() {
                let want = expected[n];
                let want = want.strip_suffix(b"\r").unwrap_or(want);
                n += 1;
                proptest::prop_assert_eq!(number, n as u64);
                match line {
                    Line::Text(t) => {
                        proptest::prop_assert_eq!(t, want);
                        proptest::prop_assert!(expected[n - 1].len() <= cap);
                    }
                    Line::TooLong => proptest::prop_assert!(expected[n - 1].len() > cap),
                }
                proptest::prop_assert!(lines.buf.capacity() <= 2 * cap + 16);
            }
            proptest::prop_assert_eq!(n, expected.len());
        }
    }
}
