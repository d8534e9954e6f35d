//! Key extractors: which bucket a request belongs to.
//!
//! A [`KeyExtractor`] looks at the request head ([`http::request::Parts`]) and writes the
//! request's key into a [`KeyBuilder`]. The built-in extractors:
//!
//! | extractor | key |
//! |---|---|
//! | [`Global`] | one bucket for everything |
//! | [`PeerIp`] | the connection's peer address (axum `ConnectInfo` or [`PeerAddr`]), IPv6 grouped by prefix |
//! | [`ClientIp`] | the client address behind trusted proxies (`X-Forwarded-For` or `Forwarded`, walked from the right) |
//! | [`Header`] | a header's value, e.g. `x-api-key` |
//! | [`Query`] | a query parameter's value |
//! | [`Extension`] | a request extension, e.g. a user id set by an authentication layer |
//! | [`Route`] | the matched route and method (feature `axum`) |
//! | closures | `Fn(&Parts) -> Option<impl KeyPart>` |
//! | `(a, b)` | a composite key: both parts |
//! | `a.or(b)` | `a`, or `b` when the request has no `a` |
//!
//! A request for which an extractor finds nothing is not let through silently: by default it
//! is counted in one bucket shared by all such requests (see
//! [`MissingKey`](crate::MissingKey)).
//!
//! ```
//! use http::request::Parts;
//! use tollgate::key::{Header, KeyExtractor, PeerIp};
//!
//! // An API key when there is one, the client address otherwise.
//! let by_api_key_or_ip = Header::new("x-api-key").or(PeerIp::new());
//! // The user id an authentication layer put in the extensions, per route.
//! # #[derive(Clone)] struct UserId(u64);
//! let per_user = |parts: &Parts| parts.extensions.get::<UserId>().map(|u| u.0);
//! # fn is_extractor(_: impl KeyExtractor) {}
//! # is_extractor(by_api_key_or_ip);
//! # is_extractor(per_user);
//! ```

mod builder;
mod forwarded;
mod ip;

use std::fmt;
use std::marker::PhantomData;

use http::HeaderName;
use http::request::Parts;

pub use builder::{Key, KeyBuilder, KeyPart};
pub use ip::{ClientIp, PeerAddr, PeerIp, TrustedProxies};

use crate::error::ConfigError;

/// Why a request has no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The request does not carry what the extractor reads (no such header, no such
    /// extension, a forwarded address that does not parse). The limit's
    /// [`MissingKey`](crate::MissingKey) policy decides what happens.
    Missing,
    /// The application is set up so that this extractor can never work, e.g. [`PeerIp`]
    /// on a server that does not provide connection info. The request gets a 500 and the
    /// message, which names the fix, is logged.
    Misconfigured(&'static str),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Missing => f.write_str("the request carries no key for this limit"),
            KeyError::Misconfigured(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for KeyError {}

/// Finds the key of a request.
///
/// Implemented by the extractors of this module and by every closure
/// `Fn(&Parts) -> Option<K>` where `K:` [`KeyPart`] (returning `None` means
/// [`KeyError::Missing`]).
pub trait KeyExtractor: Send + Sync + 'static {
    /// Writes the key of the request described by `parts` into `key`.
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError>;

    /// This extractor, or `other` when this one finds no key.
    ///
    /// Misconfiguration is not masked: if this extractor reports
    /// [`KeyError::Misconfigured`], so does the chain.
    fn or<B: KeyExtractor>(self, other: B) -> Or<Self, B>
    where
        Self: Sized,
    {
        Or {
            first: self,
            second: other,
        }
    }
}

impl<F, K> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    K: KeyPart,
{
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        let part = self(parts).ok_or(KeyError::Missing)?;
        part.write_key(key);
        Ok(())
    }
}

/// One bucket for every request: a global limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract(&self, _: &Parts, _: &mut KeyBuilder) -> Result<(), KeyError> {
        Ok(())
    }
}

/// The value of a request header, e.g. an API key. An absent or empty header is
/// [`KeyError::Missing`]; of repeated headers the first counts.
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
}

impl Header {
    /// The header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid lowercase header name (it is meant for literals; use
    /// [`Header::try_new`] for names from configuration).
    pub fn new(name: &'static str) -> Self {
        Self {
            name: HeaderName::from_static(name),
        }
    }

    /// The header `name`, or a [`ConfigError`] naming `header` if it is not a valid name.
    pub fn try_new(name: &str) -> Result<Self, ConfigError> {
        HeaderName::try_from(name)
            .map(|name| Self { name })
            .map_err(|_| ConfigError::new("header", format!("`{name}` is not a header name")))
    }

    /// An already validated name.
    pub fn from_name(name: HeaderName) -> Self {
        Self { name }
    }
}

impl KeyExtractor for Header {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        match parts.headers.get(&self.name) {
            Some(v) if !v.is_empty() => {
                key.push_bytes(v.as_bytes());
                Ok(())
            }
            _ => Err(KeyError::Missing),
        }
    }
}

/// The value of a query parameter (percent-decoded). Absent or empty is
/// [`KeyError::Missing`]; of repeated parameters the first counts.
#[derive(Debug, Clone)]
pub struct Query {
    name: Box<str>,
}

impl Query {
    /// The parameter `name`.
    pub fn new(name: impl Into<Box<str>>) -> Self {
        Self { name: name.into() }
    }
}

impl KeyExtractor for Query {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        match query_param(parts, &self.name) {
            Some(v) if !v.is_empty() => {
                key.push_str(&v);
                Ok(())
            }
            _ => Err(KeyError::Missing),
        }
    }
}

/// The first value of the query parameter `name`, percent-decoded.
pub(crate) fn query_param<'a>(parts: &'a Parts, name: &str) -> Option<std::borrow::Cow<'a, str>> {
    let query = parts.uri.query()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// A request extension of type `T`, e.g. the user id an authentication layer inserted.
/// Absent is [`KeyError::Missing`].
///
/// ```
/// use tollgate::key::{Extension, KeyBuilder, KeyPart};
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl KeyPart for UserId {
///     fn write_key(&self, key: &mut KeyBuilder) { key.push_display(self.0) }
/// }
/// let per_user = Extension::<UserId>::new();
/// # let _ = per_user;
/// ```
pub struct Extension<T> {
    _t: PhantomData<fn() -> T>,
}

impl<T> Extension<T> {
    /// Reads the extension of type `T`.
    pub const fn new() -> Self {
        Self { _t: PhantomData }
    }
}

impl<T> Default for Extension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for Extension<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Extension<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Extension<{}>", std::any::type_name::<T>())
    }
}

impl<T: KeyPart + Send + Sync + 'static> KeyExtractor for Extension<T> {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        let value = parts.extensions.get::<T>().ok_or(KeyError::Missing)?;
        value.write_key(key);
        Ok(())
    }
}

/// The matched route and the method, e.g. `GET /users/{id}`: one bucket per endpoint.
///
/// Reads axum's `MatchedPath`, which exists once the router has matched a route (so it
/// works in layers added with `Router::route_layer` or on a route, not with
/// `Router::layer`, where it is [`KeyError::Missing`]). Never the raw path: one bucket per
/// distinct URL would let a client make unbounded keys.
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug, Clone, Copy, Default)]
pub struct Route;

#[cfg(feature = "axum")]
impl KeyExtractor for Route {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        let path = parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .ok_or(KeyError::Missing)?;
        key.push_str(parts.method.as_str());
        key.push_str(path.as_str());
        Ok(())
    }
}

/// `first`, or `second` when `first` finds no key. Made by [`KeyExtractor::or`].
#[derive(Debug, Clone)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        match self.first.extract(parts, key) {
            Err(KeyError::Missing) => {
                key.clear();
                self.second.extract(parts, key)
            }
            other => other,
        }
    }
}

macro_rules! tuple_extractors {
    ($($name:ident),+) => {
        /// A composite key: every part; missing if any part is missing.
        impl<$($name: KeyExtractor),+> KeyExtractor for ($($name,)+) {
            #[allow(non_snake_case)]
            fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
                let ($($name,)+) = self;
                $($name.extract(parts, key)?;)+
                Ok(())
            }
        }
    };
}
tuple_extractors!(A, B);
tuple_extractors!(A, B, C);
tuple_extractors!(A, B, C, D);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::Request;

    pub(crate) fn parts(req: Request<()>) -> Parts {
        req.into_parts().0
    }

    pub(crate) fn extract(e: &impl KeyExtractor, p: &Parts) -> Result<String, KeyError> {
        let mut b = KeyBuilder::new();
        e.extract(p, &mut b)?;
        Ok(b.finish().to_string())
    }

    #[test]
    fn header_query_extension_closure() {
        #[derive(Clone)]
        struct UserId(u64);
        impl KeyPart for UserId {
            fn write_key(&self, key: &mut KeyBuilder) {
                key.push_display(self.0);
            }
        }
        let mut req = Request::get("/x?key=a%20b&key=second&empty=")
            .header("x-api-key", "k1")
            .header("x-api-key", "k2")
            .header("x-empty", "")
            .body(())
            .unwrap();
        req.extensions_mut().insert(UserId(7));
        let p = parts(req);
        assert_eq!(extract(&Header::new("x-api-key"), &p).unwrap(), "k1");
        assert_eq!(extract(&Header::new("x-empty"), &p), Err(KeyError::Missing));
        assert_eq!(extract(&Header::new("x-none"), &p), Err(KeyError::Missing));
        assert_eq!(extract(&Query::new("key"), &p).unwrap(), "a%20b");
        assert_eq!(extract(&Query::new("empty"), &p), Err(KeyError::Missing));
        assert_eq!(extract(&Query::new("nope"), &p), Err(KeyError::Missing));
        assert_eq!(extract(&Extension::<UserId>::new(), &p).unwrap(), "7");
        assert_eq!(
            extract(&Extension::<String>::new(), &p),
            Err(KeyError::Missing)
        );
        let closure = |p: &Parts| p.extensions.get::<UserId>().map(|u| u.0 * 2);
        assert_eq!(extract(&closure, &p).unwrap(), "14");
        assert_eq!(extract(&Global, &p).unwrap(), "");
        assert!(Header::try_new("bad header").is_err());
    }

    #[test]
    fn or_falls_back_only_when_missing() {
        let p = parts(Request::get("/").header("x-b", "bee").body(()).unwrap());
        let chain = Header::new("x-a").or(Header::new("x-b"));
        assert_eq!(extract(&chain, &p).unwrap(), "bee");
        let misconfigured = |_: &Parts| -> Option<u8> { None };
        assert_eq!(extract(&misconfigured.or(Global), &p).unwrap(), "");
        let loud = PeerIp::new().or(Global);
        assert!(matches!(
            extract(&loud, &p),
            Err(KeyError::Misconfigured(_))
        ));
    }

    #[test]
    fn composites_need_every_part() {
        let p = parts(
            Request::get("/")
                .header("x-a", "1")
                .header("x-b", "2")
                .body(())
                .unwrap(),
        );
        let both = (Header::new("x-a"), Header::new("x-b"));
        assert_eq!(extract(&both, &p).unwrap(), "1:2");
        let one_missing = (Header::new("x-a"), Header::new("x-c"));
        assert_eq!(extract(&one_missing, &p), Err(KeyError::Missing));
    }

    #[cfg(feature = "axum")]
    #[test]
    fn route_needs_a_matched_path() {
        let p = parts(Request::get("/users/3").body(()).unwrap());
        assert_eq!(extract(&Route, &p), Err(KeyError::Missing));
    }
}
