//! Redis key layout: `{prefix}{limit}:{key}`.
//!
//! The limit name is percent-encoded so that it contains no `:` (two limits cannot
//! collide), and the key's rendering escapes `{`, `}`, `:` and anything not plain (see
//! [`Key`](crate::key::Key)), so request input can neither choose a Redis Cluster hash slot
//! nor grow a key beyond ~65 bytes. Only the operator's prefix may hold a hash tag, e.g.
//! `"{rl}:"` to keep every bucket in one slot.

use smallvec::SmallVec;

use crate::model::key::Key;

/// A Redis Cluster hash slot (without the `redis-cluster` feature, every key is in one).
#[cfg(feature = "redis-cluster")]
pub(crate) type Slot = redis::cluster_routing::Slot;
#[cfg(not(feature = "redis-cluster"))]
pub(crate) type Slot = u16;

/// The slot of a key (the part between the first `{` and the next `}`, if any).
#[cfg(feature = "redis-cluster")]
pub(crate) fn slot(key: &[u8]) -> Slot {
    redis::cluster_routing::Slot::for_key(key)
}
#[cfg(not(feature = "redis-cluster"))]
pub(crate) fn slot(_: &[u8]) -> Slot {
    0
}

/// Indices of a request's limits, grouped by the slot of their keys.
pub(crate) type Groups = SmallVec<[(Slot, SmallVec<[usize; 4]>); 2]>;

/// Adds limit `index`, whose key is `key`, to its slot's group.
pub(crate) fn push_grouped(groups: &mut Groups, key: &[u8], index: usize) {
    let slot = slot(key);
    match groups.iter_mut().find(|(s, _)| *s == slot) {
        Some((_, g)) => g.push(index),
        None => groups.push((slot, smallvec::smallvec![index])),
    }
}

/// `prefix` + the encoded `name` + `:`.
pub(crate) fn table_prefix(prefix: &[u8], name: &str) -> Box<[u8]> {
    let mut out = prefix.to_vec();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out.push(b':');
    out.into_boxed_slice()
}

/// A key of the bucket `bucket`'s own (`bucket` + `:` + `suffix`) in its hash slot, so
/// that a Redis Cluster runs a script of both on one node. A bucket key with a hash tag (an
/// operator's prefix such as `"{rl}:"`) keeps it as it is; one without is made the tag
/// (`{bucket}:suffix`), which Redis hashes as the bucket itself. A prefix with a stray `}`
/// and no tag cannot be made a tag: its `}` becomes `)`, and the key is in a slot of its
/// own (the same for every suffix of the bucket).
pub(crate) fn beside(bucket: &[u8], suffix: &[u8]) -> Vec<u8> {
    let tagged = bucket
        .iter()
        .position(|&b| b == b'{')
        .is_some_and(|open| bucket[open + 1..].iter().position(|&b| b == b'}') > Some(0));
    let mut out = Vec::with_capacity(bucket.len() + suffix.len() + 3);
    if tagged {
        out.extend_from_slice(bucket);
    } else {
        out.push(b'{');
        out.extend(bucket.iter().map(|&b| if b == b'}' { b')' } else { b }));
        out.push(b'}');
    }
    out.push(b':');
    out.extend_from_slice(suffix);
    out
}

/// The Redis key of one bucket.
pub(crate) fn bucket_key(table_prefix: &[u8], key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(table_prefix.len() + 24);
    out.extend_from_slice(table_prefix);
    key.render_into(&mut out);
    out
}

/// Ends a calendar limit's bucket key with its window's start in Unix seconds
/// (`…:1793487600`): each window has a key of its own, which expires at the window's end.
/// The key's rendering escapes `:`, so the suffix cannot collide with another key.
pub(crate) fn push_window(key: &mut Vec<u8>, start_secs: u64) {
    key.push(b':');
    key.extend_from_slice(itoa::Buffer::new().format(start_secs).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_escaping() {
        let p = table_prefix(b"tollgate:", "per-ip");
        assert_eq!(&*p, b"tollgate:per-ip:");
        let ip: std::net::IpAddr = "203.0.113.7".parse().unwrap();
        assert_eq!(
            bucket_key(&p, &Key::from_part(ip)),
            b"tollgate:per-ip:@203.0.113.7"
        );
        assert_eq!(&*table_prefix(b"x:", "a:b {c}"), b"x:a%3Ab%20%7Bc%7D:");
        // `a` + key `b:c` and `a:b` + key `c` differ.
        let one = bucket_key(&table_prefix(b"", "a"), &Key::from_part("b:c"));
        let two = bucket_key(&table_prefix(b"", "a:b"), &Key::from_part("c"));
        assert_ne!(one, two);
        let hostile = bucket_key(&p, &Key::from_part("{victim}"));
        assert!(!hostile.contains(&b'{') && !hostile.contains(&b'}'));
        let huge = bucket_key(&p, &Key::from_part("x".repeat(100_000)));
        assert!(huge.len() <= p.len() + 65);
    }
}
