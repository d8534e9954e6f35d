//! The [`Key`] type: one bucket's identity, its rendered (stored) form, and the masking
//! of the addresses it keeps.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Key material kept inline; longer material is replaced by its SHA-256 digest.
pub(super) const INLINE: usize = 64;

/// Bytes written as they are; every other byte is written as `%XX`. `:` (the component
/// separator), `@` (marks an address), `~` (marks a digest), `%` and the Redis hash-tag
/// braces `{` `}` are all escaped, so request input can neither choose a Redis Cluster
/// slot nor make two different keys render alike.
pub(super) fn is_plain(b: u8) -> bool {
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
    pub(super) repr: Repr,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum Repr {
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

    /// The single IP address (masked) this key was made of, if it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        match &self.repr {
            Repr::Ip { addr, .. } => Some(unmap(Ipv6Addr::from(*addr))),
            _ => None,
        }
    }

    /// The key whose rendered form (its [`Display`](fmt::Display), what Redis stores) is
    /// `rendered`: a digest from `~` and 64 hex digits, any other text of at most 64
    /// bytes as it is (an address too: it renders the same); `None` otherwise.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn from_rendered(rendered: &[u8]) -> Option<Self> {
        if rendered.len() == 65 && rendered[0] == b'~' {
            let mut d = [0u8; 32];
            for (i, pair) in rendered[1..].chunks(2).enumerate() {
                let hex = std::str::from_utf8(pair).ok()?;
                d[i] = u8::from_str_radix(hex, 16).ok()?;
            }
            return Some(Self {
                repr: Repr::Digest(d),
            });
        }
        if rendered.len() > INLINE || !rendered.is_ascii() {
            return None;
        }
        let mut buf = [0u8; INLINE];
        buf[..rendered.len()].copy_from_slice(rendered);
        Some(Self {
            repr: Repr::Text {
                len: rendered.len() as u8,
                buf,
            },
        })
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

/// An IPv4-mapped IPv6 address as the IPv4 address; any other address as it is.
fn unmap(v6: Ipv6Addr) -> IpAddr {
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Writes an address as a key renders it: `@a.b.c.d` or `@[v6]`, with `/prefix` when
/// masked.
pub(super) fn write_ip(f: &mut impl fmt::Write, addr: [u8; 16], prefix: u8) -> fmt::Result {
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

/// Masks `ip` to `prefix` bits and returns it as IPv6 bytes (IPv4 as `::ffff:a.b.c.d`,
/// whose prefix then counts 96 more bits).
#[inline]
pub(super) fn masked(ip: IpAddr, prefix: u8) -> ([u8; 16], u8) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendered_key_reads_back_as_the_key_it_renders() {
        let long = Key::from_part("x".repeat(100).as_str());
        for key in [Key::from_part("user%40example.com"), long] {
            let rendered = key.to_string();
            let back = Key::from_rendered(rendered.as_bytes()).unwrap();
            assert_eq!(back.to_string(), rendered);
        }
        assert_eq!(
            Key::from_rendered(b"~zz").map(|k| k.to_string()).as_deref(),
            Some("~zz")
        );
        let bad_hex = format!("~{}", "g".repeat(64));
        assert!(Key::from_rendered(bad_hex.as_bytes()).is_none());
        assert!(Key::from_rendered("é".as_bytes()).is_none());
        assert!(Key::from_rendered(&[b'a'; 65]).is_none());
    }
}
