//! [`Key`] and [`KeyBuilder`]: bounded, injective bucket identities.

use std::fmt::{self, Write as _};
use std::hash::Hasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sha2::{Digest as _, Sha256};
use siphasher::sip128::{Hasher128, SipHasher13};

/// Key material kept inline; longer material is replaced by its SHA-256 digest.
const INLINE: usize = 64;

/// Bytes written as they are; every other byte is written as `%XX`. `:` (the component
/// separator), `@` (marks an address), `~` (marks a digest), `%` and the Redis hash-tag
/// braces `{` `}` are all escaped, so request input can neither choose a Redis Cluster
/// slot nor make two different keys render alike.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/')
}

/// The identity of one bucket within a limit: what a [`KeyExtractor`](crate::key::KeyExtractor)
/// produced for one request.
///
/// A key is small and bounded whatever the request holds: a single IP address is kept
/// exactly (masked to its prefix); other material is kept as escaped text up to 64 bytes
/// and replaced by its SHA-256 digest beyond that. Its [`Display`](fmt::Display) form is the
/// one stored in Redis: `@203.0.113.7`, `@[2001:db8:ab00::]/56`, `user%40example.com`,
/// `GET:/users/{id}` escaped, or `~` followed by 64 hex digits for a digest.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    repr: Repr,
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    /// One address, masked; IPv4 kept as an IPv4-mapped IPv6 address.
    Ip { addr: [u8; 16], prefix: u8 },
    /// Escaped text of at most `INLINE` bytes.
    Text { len: u8, buf: [u8; INLINE] },
    /// SHA-256 of escaped text longer than `INLINE`.
    Digest([u8; 32]),
}

impl Key {
    /// The key shared by every request: the one a global limit uses.
    pub const fn global() -> Self {
        Key {
            repr: Repr::Text {
                len: 0,
                buf: [0; INLINE],
            },
        }
    }

    /// The bucket shared by the requests that have no key for a limit (see
    /// [`MissingKey::SharedBucket`](crate::MissingKey)). It renders as `~missing`, which no
    /// extracted key can equal: a raw `~` in key material is always escaped.
    pub fn missing() -> Self {
        let mut buf = [0; INLINE];
        buf[..8].copy_from_slice(b"~missing");
        Key {
            repr: Repr::Text { len: 8, buf },
        }
    }

    /// Builds a key from one part (see [`KeyPart`]).
    #[inline]
    pub fn from_part(part: impl KeyPart) -> Self {
        let mut b = KeyBuilder::new();
        part.write_key(&mut b);
        b.take()
    }

    /// The single IP address (masked) this key was made of, if it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        match &self.repr {
            Repr::Ip { addr, .. } => Some(unmap(Ipv6Addr::from(*addr))),
            _ => None,
        }
    }

    /// 16 bytes that identify the key within one table of a store, keyed by `secret` so
    /// that request input cannot aim at a collision. Addresses are kept exactly.
    #[inline]
    pub(crate) fn compact(&self, secret: &(u64, u64)) -> u128 {
        match &self.repr {
            Repr::Ip { addr, .. } => u128::from_be_bytes(*addr),
            Repr::Text { len, buf } => {
                let mut h = SipHasher13::new_with_keys(secret.0, secret.1);
                h.write(&buf[..*len as usize]);
                h.finish128().as_u128()
            }
            Repr::Digest(d) => {
                let mut first = [0; 16];
                first.copy_from_slice(&d[..16]);
                // A digest never equals a text key's SipHash output by construction
                // (different inputs to a PRF); xor-ing the secret keeps it unpredictable.
                u128::from_be_bytes(first) ^ ((secret.0 as u128) << 64 | secret.1 as u128)
            }
        }
    }

    /// A hash that is the same in every process: for Retry-After jitter, which should give
    /// one client the same offset whichever instance answers.
    pub(crate) fn stable_hash(&self) -> u64 {
        let mut h = SipHasher13::new_with_keys(0x746f_6c6c_6761_7465, 0x6a69_7474_6572_0001);
        match &self.repr {
            Repr::Ip { addr, prefix } => {
                h.write(addr);
                h.write_u8(*prefix);
            }
            Repr::Text { len, buf } => h.write(&buf[..*len as usize]),
            Repr::Digest(d) => h.write(d),
        }
        h.finish()
    }

    /// A cheap hash that is the same in every process and version of this crate (its
    /// definition is part of the stored format): the seed of a key's random window phase,
    /// computed on every check of such a limit. Not for adversarial use (it chooses a
    /// phase, nothing a collision could exploit).
    #[inline]
    pub(crate) fn phase_hash(&self) -> u64 {
        #[inline(always)]
        fn mix(h: u64, word: u64) -> u64 {
            let m = u128::from(h ^ word) * 0x9e37_79b9_7f4a_7c15;
            (m as u64) ^ ((m >> 64) as u64)
        }
        fn words(mut h: u64, bytes: &[u8]) -> u64 {
            let mut chunks = bytes.chunks_exact(8);
            for c in &mut chunks {
                h = mix(h, u64::from_le_bytes(c.try_into().expect("8 bytes")));
            }
            let mut last = [0u8; 8];
            last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
            mix(h, u64::from_le_bytes(last) ^ (bytes.len() as u64) << 56)
        }
        match &self.repr {
            Repr::Ip { addr, prefix } => {
                let hi = u64::from_le_bytes(addr[..8].try_into().expect("8 bytes"));
                let lo = u64::from_le_bytes(addr[8..].try_into().expect("8 bytes"));
                mix(mix(u64::from(*prefix), hi), lo)
            }
            Repr::Text { len, buf } => words(0x7465_7874, &buf[..*len as usize]),
            Repr::Digest(d) => words(0x6469_6765_7374, d),
        }
    }

    /// Appends the rendered form (the [`Display`](fmt::Display) form) to `out`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn render_into(&self, out: &mut Vec<u8>) {
        struct VecWriter<'a>(&'a mut Vec<u8>);
        impl fmt::Write for VecWriter<'_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                self.0.extend_from_slice(s.as_bytes());
                Ok(())
            }
        }
        let _ = write!(VecWriter(out), "{self}");
    }
}

fn unmap(v6: Ipv6Addr) -> IpAddr {
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn write_ip(f: &mut impl fmt::Write, addr: [u8; 16], prefix: u8) -> fmt::Result {
    match unmap(Ipv6Addr::from(addr)) {
        IpAddr::V4(v4) => {
            write!(f, "@{v4}")?;
            let p = prefix.saturating_sub(96);
            if p < 32 { write!(f, "/{p}") } else { Ok(()) }
        }
        IpAddr::V6(v6) => {
            write!(f, "@[{v6}]")?;
            if prefix < 128 {
                write!(f, "/{prefix}")
            } else {
                Ok(())
            }
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Ip { addr, prefix } => write_ip(f, *addr, *prefix),
            Repr::Text { len, buf } => {
                // Only plain ASCII and `%XX` escapes are ever stored.
                f.write_str(std::str::from_utf8(&buf[..*len as usize]).unwrap_or_default())
            }
            Repr::Digest(d) => {
                f.write_char('~')?;
                d.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

/// Collects the parts of a [`Key`]: what [`KeyExtractor`](crate::key::KeyExtractor)s and
/// [`KeyPart`]s write into.
///
/// Parts are separated so that `("ab", "c")` and `("a", "bc")` are different keys. Nothing
/// here allocates; material beyond 64 bytes is hashed as it is written.
pub struct KeyBuilder {
    parts: u8,
    /// The first part, while it is a lone address (the fast path for IP keys).
    ip: Option<([u8; 16], u8)>,
    len: usize,
    buf: [u8; INLINE],
    overflow: Option<Sha256>,
}

impl fmt::Debug for KeyBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyBuilder")
            .field("parts", &self.parts)
            .field("hashed", &self.overflow.is_some())
            .finish()
    }
}

impl Default for KeyBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyBuilder {
    /// An empty builder: finishing it gives [`Key::global`].
    #[inline]
    pub const fn new() -> Self {
        Self {
            parts: 0,
            ip: None,
            len: 0,
            buf: [0; INLINE],
            overflow: None,
        }
    }

    /// Forgets everything written so far.
    pub fn clear(&mut self) {
        *self = Self::new();
    }

    /// The state of the builder now, to go back to with [`rollback`](Self::rollback).
    /// Copies a few bytes, and the digest state only once the key is long enough to be
    /// hashed; never allocates.
    #[inline]
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            parts: self.parts,
            ip: self.ip,
            len: self.len,
            overflow: self.overflow.clone(),
        }
    }

    /// Forgets what was written since `mark` was taken, keeping what was written before.
    #[inline]
    pub(crate) fn rollback(&mut self, mark: Mark) {
        // Writes only append, and once the digest has started they no longer touch `buf`:
        // `buf[..mark.len]` still holds what it held at the mark.
        self.parts = mark.parts;
        self.ip = mark.ip;
        self.len = mark.len;
        self.overflow = mark.overflow;
    }

    /// Adds an IP address, masked to `prefix` bits (IPv4 prefixes count IPv4 bits).
    /// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are treated as the IPv4 address.
    #[inline(always)]
    pub fn push_ip(&mut self, ip: IpAddr, prefix: u8) {
        let (addr, prefix) = masked(ip, prefix);
        if self.parts == 0 {
            self.parts = 1;
            self.ip = Some((addr, prefix));
        } else {
            self.flush_ip();
            self.begin_part();
            let _ = write_ip(&mut RawSink(self), addr, prefix);
        }
    }

    /// Adds bytes (any bytes: they are escaped).
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        self.flush_ip();
        self.begin_part();
        for &b in bytes {
            self.escape(b);
        }
    }

    /// Adds a string.
    pub fn push_str(&mut self, s: &str) {
        self.push_bytes(s.as_bytes());
    }

    /// Adds the `Display` form of a value, without allocating.
    pub fn push_display(&mut self, value: impl fmt::Display) {
        self.flush_ip();
        self.begin_part();
        let _ = write!(EscapeSink(self), "{value}");
    }

    /// The finished key.
    #[inline]
    pub fn finish(mut self) -> Key {
        self.take()
    }

    /// The finished key, leaving the builder empty: finishes in place, without moving the
    /// builder (it is large, for the digest state it may need).
    #[inline]
    pub(crate) fn take(&mut self) -> Key {
        let key = self.build();
        self.parts = 0;
        self.ip = None;
        self.len = 0;
        key
    }

    #[inline]
    fn build(&mut self) -> Key {
        if self.parts == 1
            && let Some((addr, prefix)) = self.ip
        {
            return Key {
                repr: Repr::Ip { addr, prefix },
            };
        }
        self.flush_ip();
        match self.overflow.take() {
            Some(h) => Key {
                repr: Repr::Digest(h.finalize().into()),
            },
            None => {
                // Only the written bytes: what lies beyond them (left by a rollback or an
                // earlier key) must not make equal keys compare unequal.
                let mut buf = [0; INLINE];
                buf[..self.len].copy_from_slice(&self.buf[..self.len]);
                Key {
                    repr: Repr::Text {
                        len: self.len as u8,
                        buf,
                    },
                }
            }
        }
    }

    fn flush_ip(&mut self) {
        if let Some((addr, prefix)) = self.ip.take() {
            // The lone address becomes the first text part.
            let _ = write_ip(&mut RawSink(self), addr, prefix);
        }
    }

    fn begin_part(&mut self) {
        if self.parts > 0 {
            self.raw(b':');
        }
        self.parts = self.parts.saturating_add(1);
    }

    fn escape(&mut self, b: u8) {
        if is_plain(b) {
            self.raw(b);
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            self.raw(b'%');
            self.raw(HEX[(b >> 4) as usize]);
            self.raw(HEX[(b & 0xf) as usize]);
        }
    }

    fn raw(&mut self, b: u8) {
        if let Some(h) = &mut self.overflow {
            h.update([b]);
        } else if self.len < INLINE {
            self.buf[self.len] = b;
            self.len += 1;
        } else {
            let mut h = Sha256::new();
            h.update(&self.buf[..self.len]);
            h.update([b]);
            self.overflow = Some(h);
        }
    }
}

/// A [`KeyBuilder`]'s state at one moment (see [`KeyBuilder::mark`]).
pub(crate) struct Mark {
    parts: u8,
    ip: Option<([u8; 16], u8)>,
    len: usize,
    overflow: Option<Sha256>,
}

/// Writes characters as they are (for address text, which is plain by construction).
struct RawSink<'a>(&'a mut KeyBuilder);

impl fmt::Write for RawSink<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.bytes().for_each(|b| self.0.raw(b));
        Ok(())
    }
}

/// Writes characters escaped.
struct EscapeSink<'a>(&'a mut KeyBuilder);

impl fmt::Write for EscapeSink<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.bytes().for_each(|b| self.0.escape(b));
        Ok(())
    }
}

/// Masks `ip` to `prefix` bits and returns it as IPv6 bytes (IPv4 as `::ffff:a.b.c.d`,
/// whose prefix then counts 96 more bits).
#[inline]
pub(crate) fn masked(ip: IpAddr, prefix: u8) -> ([u8; 16], u8) {
    match ip {
        IpAddr::V4(v4) => masked_v4(v4, prefix),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => masked_v4(v4, prefix),
            None => {
                let prefix = prefix.min(128);
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                ((u128::from(v6) & mask).to_be_bytes(), prefix)
            }
        },
    }
}

/// [`masked`] for IPv4, in 32-bit arithmetic: the common case of every per-IP limit.
#[inline]
fn masked_v4(v4: Ipv4Addr, prefix: u8) -> ([u8; 16], u8) {
    let prefix = prefix.min(32);
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    // `::ffff:a.b.c.d` built in a register: one 16-byte store, no partial writes to
    // forward from.
    let mapped = (0xffff_u128 << 32) | u128::from(u32::from(v4) & mask);
    (mapped.to_be_bytes(), 96 + prefix)
}

/// What names a bucket for the [`Limiter`](crate::Limiter) handle: a [`Key`], or any
/// [`KeyPart`] (`&str`, `String`, bytes, an `IpAddr`, a number, ...), which becomes the
/// key the extractors would make of it.
pub trait IntoKey {
    /// The key.
    fn into_key(self) -> Key;
}

impl IntoKey for Key {
    fn into_key(self) -> Key {
        self
    }
}

impl IntoKey for &Key {
    fn into_key(self) -> Key {
        self.clone()
    }
}

impl<T: KeyPart> IntoKey for T {
    fn into_key(self) -> Key {
        Key::from_part(self)
    }
}

/// A value that can be (part of) a key: strings, bytes, integers, addresses, tuples of
/// these, and references to them.
///
/// Implement it for your own identifiers; most types just write their `Display` form:
///
/// ```
/// use tollgate::key::{KeyBuilder, KeyPart};
///
/// struct UserId(u64);
///
/// impl KeyPart for UserId {
///     fn write_key(&self, key: &mut KeyBuilder) {
///         key.push_display(self.0);
///     }
/// }
/// ```
pub trait KeyPart {
    /// Writes this value as one or more parts of `key`.
    fn write_key(&self, key: &mut KeyBuilder);
}

impl KeyPart for str {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_str(self);
    }
}

impl KeyPart for String {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_str(self);
    }
}

impl KeyPart for std::borrow::Cow<'_, str> {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_str(self);
    }
}

impl KeyPart for [u8] {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_bytes(self);
    }
}

impl KeyPart for Vec<u8> {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_bytes(self);
    }
}

impl KeyPart for bytes::Bytes {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_bytes(self);
    }
}

impl KeyPart for http::HeaderValue {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_bytes(self.as_bytes());
    }
}

impl KeyPart for http::Method {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_str(self.as_str());
    }
}

macro_rules! display_parts {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn write_key(&self, key: &mut KeyBuilder) {
                key.push_display(self);
            }
        }
    )*};
}
display_parts!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, bool, char
);

impl KeyPart for IpAddr {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_ip(*self, 128);
    }
}

impl KeyPart for Ipv4Addr {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_ip(IpAddr::V4(*self), 32);
    }
}

impl KeyPart for Ipv6Addr {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_ip(IpAddr::V6(*self), 128);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn write_key(&self, key: &mut KeyBuilder) {
        (**self).write_key(key);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn write_key(&self, key: &mut KeyBuilder) {
        (**self).write_key(key);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for std::sync::Arc<T> {
    fn write_key(&self, key: &mut KeyBuilder) {
        (**self).write_key(key);
    }
}

macro_rules! tuple_parts {
    ($($name:ident),+) => {
        impl<$($name: KeyPart),+> KeyPart for ($($name,)+) {
            #[allow(non_snake_case)]
            fn write_key(&self, key: &mut KeyBuilder) {
                let ($($name,)+) = self;
                $($name.write_key(key);)+
            }
        }
    };
}
tuple_parts!(A, B);
tuple_parts!(A, B, C);
tuple_parts!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;

    fn key(part: impl KeyPart) -> Key {
        Key::from_part(part)
    }

    /// The first implementation of [`masked`], all in 128-bit arithmetic: the reference.
    fn masked_reference(ip: IpAddr, prefix: u8) -> ([u8; 16], u8) {
        let (v6, prefix) = match ip {
            IpAddr::V4(v4) => (v4.to_ipv6_mapped(), 96 + prefix.min(32)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => (v4.to_ipv6_mapped(), 96 + prefix.min(32)),
                None => (v6, prefix.min(128)),
            },
        };
        let bits = u128::from(v6);
        let mask = if prefix == 0 {
            0
        } else {
            u128::MAX << (128 - prefix)
        };
        ((bits & mask).to_be_bytes(), prefix)
    }

    #[test]
    fn masking_matches_the_128_bit_reference_for_every_prefix() {
        let ips: [IpAddr; 6] = [
            "203.0.113.77".parse().unwrap(),
            "255.255.255.255".parse().unwrap(),
            "0.0.0.0".parse().unwrap(),
            "::ffff:198.51.100.9".parse().unwrap(),
            "2001:db8:abcd:12ff:ffff:ffff:ffff:fffe".parse().unwrap(),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap(),
        ];
        for ip in ips {
            for prefix in 0..=200u8 {
                assert_eq!(
                    masked(ip, prefix),
                    masked_reference(ip, prefix),
                    "{ip}/{prefix}"
                );
            }
        }
    }

    #[test]
    fn addresses_are_kept_exactly_and_masked() {
        let k = key("203.0.113.7".parse::<IpAddr>().unwrap());
        assert_eq!(k.to_string(), "@203.0.113.7");
        assert_eq!(k.ip(), Some("203.0.113.7".parse().unwrap()));
        let mut b = KeyBuilder::new();
        b.push_ip("2001:db8:ab12:cd34::1".parse().unwrap(), 56);
        assert_eq!(b.finish().to_string(), "@[2001:db8:ab12:cd00::]/56");
        let mut b = KeyBuilder::new();
        b.push_ip("198.51.100.77".parse().unwrap(), 24);
        assert_eq!(b.finish().to_string(), "@198.51.100.0/24");
    }

    #[test]
    fn ipv4_mapped_ipv6_is_folded_to_ipv4() {
        let mapped: IpAddr = "::ffff:203.0.113.7".parse().unwrap();
        let mut b = KeyBuilder::new();
        b.push_ip(mapped, 56); // the IPv6 prefix does not apply to an IPv4 client
        let k = b.finish();
        assert_eq!(k, key(IpAddr::from([203, 0, 113, 7])));
        assert_eq!(k.to_string(), "@203.0.113.7");
    }

    #[test]
    fn text_is_escaped_so_input_cannot_pick_a_slot_or_collide() {
        assert_eq!(key("{victim}").to_string(), "%7Bvictim%7D");
        assert_eq!(key("a:b").to_string(), "a%3Ab");
        assert_eq!(key(("a", "b")).to_string(), "a:b");
        assert_ne!(key(("ab", "c")), key(("a", "bc")));
        assert_ne!(key(("", "a")), key(("a", "")));
        assert_ne!(key(("a", "")), key("a"));
        assert_eq!(key(&b"\x00\xff"[..]).to_string(), "%00%FF");
        assert_eq!(key("user@example.com").to_string(), "user%40example.com");
        assert_eq!(key("~x").to_string(), "%7Ex");
    }

    #[test]
    fn an_address_inside_a_composite_stays_unambiguous() {
        let ip: IpAddr = "::1".parse().unwrap();
        let other: IpAddr = "::1:2".parse().unwrap();
        let composite = key((ip, 2u8));
        assert_eq!(composite.to_string(), "@[::1]:2");
        assert_ne!(composite.to_string(), key(other).to_string());
        assert_eq!(key((2u8, ip)).to_string(), "2:@[::1]");
    }

    #[test]
    fn long_or_binary_material_is_hashed_to_a_bounded_size() {
        let long = vec![b'x'; 10_000];
        let k = key(&long[..]);
        let s = k.to_string();
        assert_eq!(s.len(), 65);
        assert!(s.starts_with('~'));
        assert_eq!(key(&long[..]), k, "deterministic");
        let mut other = long.clone();
        other[9_999] = b'y';
        assert_ne!(key(&other[..]), k);
        // 64 bytes stay inline, 65 are hashed.
        assert_eq!(key("a".repeat(64)).to_string(), "a".repeat(64));
        assert!(key("a".repeat(65)).to_string().starts_with('~'));
        assert!(
            key("{".repeat(22)).to_string().starts_with('~'),
            "escaping counts"
        );
    }

    #[test]
    fn compact_form_keeps_addresses_and_separates_texts() {
        let secret = (1, 2);
        let a = key(IpAddr::from([10, 0, 0, 1])).compact(&secret);
        assert_eq!(a, u128::from(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped()));
        assert_ne!(key("a").compact(&secret), key("b").compact(&secret));
        assert_ne!(
            key("a").compact(&secret),
            key("a").compact(&(3, 4)),
            "keyed"
        );
        assert_eq!(Key::global().compact(&secret), key("").compact(&secret));
    }

    #[test]
    fn display_and_integers() {
        assert_eq!(key(42u64).to_string(), "42");
        assert_eq!(key(-1i32).to_string(), "-1");
        assert_eq!(
            key((http::Method::GET, "/users/{id}")).to_string(),
            "GET:/users/%7Bid%7D"
        );
    }
}
