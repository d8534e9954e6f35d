//! [`KeyBuilder`]: writes the parts of a [`Key`], escaped and separated, hashing
//! material beyond 64 bytes as it is written.

use std::fmt::{self, Write as _};
use std::net::IpAddr;

use sha2::{Digest as _, Sha256};

use super::identity::{INLINE, Key, Repr, is_plain, masked, write_ip};

/// Collects the parts of a [`Key`]: what [`KeyExtractor`](crate::key::KeyExtractor)s and
/// [`KeyPart`](crate::key::KeyPart)s write into.
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
