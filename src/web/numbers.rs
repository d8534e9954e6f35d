//! Header values of small integers without an allocation: `Retry-After`, the draft
//! styles' `RateLimit-Limit`/`-Remaining`/`-Reset` and `X-RateLimit-*` fields carry one
//! integer each, and `HeaderValue::from(u64)` allocates twice per value (a `BytesMut`, then
//! its freezing). The decimal forms of 0..10,000 are rendered once per process into one
//! string (38,890 bytes) that lives as long as the process; a value is a `Bytes` view of
//! it, whose clone and drop touch no shared state. A longer wait (hours) is kept in a memo
//! per thread, as it repeats for every client refused in the same second.

use std::cell::RefCell;
use std::sync::OnceLock;

use bytes::Bytes;
use http::HeaderValue;

use crate::base::memo::{Memo, MemoKey, memoized};

/// Integers below this come from the table.
const TABLE: u64 = 10_000;

/// Where `n`'s decimal form starts in the table, and its length.
fn place(n: u64) -> (usize, usize) {
    let n = n as usize;
    match n {
        0..10 => (n, 1),
        10..100 => (10 + (n - 10) * 2, 2),
        100..1_000 => (190 + (n - 100) * 3, 3),
        _ => (2_890 + (n - 1_000) * 4, 4),
    }
}

/// "0123456789101112…9999": every integer below [`TABLE`], one after the other.
fn table() -> &'static str {
    static DIGITS: OnceLock<String> = OnceLock::new();
    DIGITS.get_or_init(|| {
        let mut s = String::with_capacity(place(TABLE - 1).0 + 4);
        let mut buf = itoa::Buffer::new();
        for n in 0..TABLE {
            s.push_str(buf.format(n));
        }
        s
    })
}

thread_local! {
    /// This thread's recent waits of 10,000 s and more (see [`wait`]).
    static LONG_WAITS: RefCell<Memo<HeaderValue>> = const { RefCell::new(Memo::new()) };
}

/// A wait in seconds as a header value (`Retry-After`): as [`number`], and from 10,000 on
/// from the thread's memo, as a wait of hours is the same for every client refused in the
/// same second. (Not for numbers that change with each request, such as tokens left: each
/// would miss the memo and cost more than rendering.)
pub(crate) fn wait(secs: u64) -> HeaderValue {
    if secs < TABLE {
        return number(secs);
    }
    memoized(&LONG_WAITS, MemoKey::number(0, secs), || Some(number(secs)))
        .unwrap_or_else(|| number(secs))
}

/// `n` as a header value: from the table below 10,000, else rendered on the stack and
/// copied once.
pub(crate) fn number(n: u64) -> HeaderValue {
    if n >= TABLE {
        let mut digits = itoa::Buffer::new();
        return HeaderValue::from_bytes(digits.format(n).as_bytes())
            .unwrap_or_else(|_| HeaderValue::from(n));
    }
    let (start, len) = place(n);
    let digits = Bytes::from_static(&table().as_bytes()[start..start + len]);
    HeaderValue::from_maybe_shared(digits).unwrap_or_else(|_| HeaderValue::from(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_reads_as_itself() {
        // Twice each: the second time a large number comes from the thread's memo.
        for n in (0..10_100)
            .chain([u64::MAX, 123_456_789])
            .chain(10_000..10_100)
        {
            assert_eq!(number(n).to_str().unwrap(), n.to_string(), "{n}");
        }
        assert_eq!(table().len(), 38_890);
    }

    #[test]
    fn every_wait_reads_as_itself_from_the_memo_too() {
        // Twice each: the second time a long wait comes from the thread's memo.
        for _ in 0..2 {
            for secs in (9_990..10_200).chain([86_400, u64::MAX]) {
                assert_eq!(wait(secs).to_str().unwrap(), secs.to_string(), "{secs}");
            }
        }
    }
}
