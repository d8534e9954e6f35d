//! Header values of small integers without an allocation: `Retry-After`, the draft
//! styles' `RateLimit-Limit`/`-Remaining`/`-Reset` and `X-RateLimit-*` fields carry one
//! integer each, and `HeaderValue::from(u64)` allocates twice per value (a `BytesMut`, then
//! its freezing). The decimal forms of 0..10,000 are rendered once per process into one
//! string (38,890 bytes) that lives as long as the process; a value is a `Bytes` view of
//! it, whose clone and drop touch no shared state.

use std::sync::OnceLock;

use bytes::Bytes;
use http::HeaderValue;

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
        for n in (0..10_100).chain([u64::MAX, 123_456_789]) {
            assert_eq!(number(n).to_str().unwrap(), n.to_string(), "{n}");
        }
        assert_eq!(table().len(), 38_890);
    }
}
