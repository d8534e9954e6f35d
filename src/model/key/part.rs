//! [`KeyPart`] and [`IntoKey`]: the values that can be written into a [`Key`] (strings,
//! bytes, integers, addresses, tuples of these) and what names a bucket for the handle.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::builder::KeyBuilder;
use super::identity::Key;

impl Key {
    /// Builds a key from one part (see [`KeyPart`]).
    #[inline]
    pub fn from_part(part: impl KeyPart) -> Self {
        let mut b = KeyBuilder::new();
        part.write_key(&mut b);
        b.take()
    }
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
    #[inline]
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_ip(*self, 128);
    }
}

impl KeyPart for Ipv4Addr {
    #[inline]
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_ip(IpAddr::V4(*self), 32);
    }
}

impl KeyPart for Ipv6Addr {
    #[inline]
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
