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
//! | `Route` | the matched route and method (feature `axum`) |
//! | closures | `Fn(&Parts) -> Option<impl KeyPart>` |
//! | `(a, b)` | a composite key: both parts |
//! | `a.or(b)` | `a`, or `b` when the request has no `a` (`a` must be authenticated, see below) |
//!
//! A request for which an extractor finds nothing is not let through silently: by default it
//! is counted in one bucket shared by all such requests (see
//! [`MissingKey`](crate::MissingKey)).
//!
//! ```
//! use http::request::Parts;
//! use tollgate::key::{Extension, KeyBuilder, KeyExtractor, KeyPart, PeerIp};
//!
//! // The user id an authentication layer put in the extensions (so only after it checked
//! // the credentials), the client address for anonymous requests.
//! #[derive(Clone)]
//! struct UserId(u64);
//! impl KeyPart for UserId {
//!     fn write_key(&self, key: &mut KeyBuilder) { key.push_display(self.0) }
//! }
//! let per_user_or_ip = Extension::<UserId>::new().or(PeerIp::new());
//! // The same user id from a closure.
//! let per_user = |parts: &Parts| parts.extensions.get::<UserId>().map(|u| u.0);
//! # fn is_extractor(_: impl KeyExtractor) {}
//! # is_extractor(per_user_or_ip);
//! # is_extractor(per_user);
//! ```
//!
//! # `or` needs an authenticated first choice
//!
//! `a.or(b)` limits a request by `a` alone whenever `a` is present, so `b` binds only the
//! requests without an `a`. If clients choose `a` freely, they choose their bucket:
//! `Header::new("x-api-key").or(PeerIp::new())` lets a client escape its per-address limit
//! by sending a new made-up API key with each request. Use `or` only when `a` is checked
//! before the limit runs (an extension set by an authentication layer, as above), or use two
//! limits, which every request must pass:
//!
//! ```
//! use tollgate::{key::{Header, PeerIp}, Limit, MissingKey, Quota};
//!
//! let per_ip = Limit::new("per-ip", Quota::per_second(20)).key(PeerIp::new());
//! let per_key = Limit::new("per-key", Quota::per_second(5))
//!     .key(Header::new("x-api-key"))
//!     .on_missing_key(MissingKey::Skip); // anonymous requests: per-ip only
//! # let _ = (per_ip, per_key);
//! ```

mod forwarded;
mod ip;
#[cfg(feature = "rules")]
mod replayed;

use std::fmt;
use std::marker::PhantomData;

use http::HeaderName;
use http::request::Parts;

pub use crate::model::key::{IntoKey, Key, KeyBuilder, KeyPart};
pub(crate) use ip::peer_ip;
pub use ip::{ClientIp, PeerAddr, PeerIp, TrustedProxies};
#[cfg(feature = "rules")]
pub(crate) use replayed::Replaying;

use crate::base::error::ConfigError;

/// Why a request has no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The request does not carry what the extractor reads (no such header, no such
    /// extension, a forwarded address that does not parse). The limit's
    /// [`MissingKey`](crate::MissingKey) policy decides what happens.
    Missing,
    /// The application is set up so that this extractor can never work, e.g. [`PeerIp`]
    /// on a server that does not provide connection info. The request gets a 500 whose
    /// problem document gives the message, which names the fix; it is logged once.
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

    /// What a request must carry for this extractor to find a key, in words for the
    /// developer of a client, such as ``the `x-api-key` header``: a request refused for
    /// lacking it ([`MissingKey::Reject`](crate::MissingKey)) is told so in the problem
    /// document. `None` (the default) when it is nothing a client sends as such (an
    /// extension set by your authentication layer, a closure): the refusal then names the
    /// limit only. An empty text: the request never lacks it ([`Global`], [`PeerIp`]), so
    /// a composite key is described by its other parts. Asked once, when the layer is
    /// built.
    fn describe(&self) -> Option<String> {
        None
    }

    /// This extractor, or `other` when this one finds no key.
    ///
    /// The request is then limited by this extractor's key alone: use it only when that
    /// key cannot be invented by the client (see [the module docs](crate::web::key#or-needs-an-authenticated-first-choice)).
    ///
    /// Inside a composite key only what this extractor wrote is undone before `other`
    /// runs: `(Header::new("x-tenant"), Header::new("x-api-key").or(Header::new("x-user")))`
    /// keeps the tenant in every key.
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

    fn describe(&self) -> Option<String> {
        Some(String::new())
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
    /// If `name` is not a valid header name (any case: it is kept lowercase). It is meant
    /// for literals, and the panic points at the call; use [`Header::try_new`] for names
    /// from configuration.
    #[track_caller]
    pub fn new(name: &'static str) -> Self {
        match Self::try_new(name) {
            Ok(header) => header,
            Err(e) => panic!(
                "Header::new({name:?}): {} (Header::try_new returns the error)",
                e.reason()
            ),
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

    fn describe(&self) -> Option<String> {
        Some(format!("the `{}` header", self.name))
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

    fn describe(&self) -> Option<String> {
        Some(format!("the `{}` query parameter", self.name))
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
/// Reads axum's `MatchedPath`, which axum 0.8 gives each request its router matched to a
/// route, under `Router::route_layer`, a route's own layer and `Router::layer` alike; a
/// request no route serves (a 404 under `Router::layer`), plain hyper and a replay in
/// `tollgate-rules simulate` have none: [`KeyError::Missing`]. Never the raw path: one
/// bucket per distinct URL would let a client make unbounded keys.
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug, Clone, Copy, Default)]
pub struct Route;

#[cfg(feature = "axum")]
impl KeyExtractor for Route {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        let path = crate::web::routes::matched_path(parts).ok_or(KeyError::Missing)?;
        key.push_str(parts.method.as_str());
        key.push_str(path);
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
        // `first` may write some parts before it finds one missing (a tuple); only those
        // are undone, not what the parts before this `or` wrote.
        let mark = key.mark();
        match self.first.extract(parts, key) {
            Err(KeyError::Missing) => {
                key.rollback(mark);
                self.second.extract(parts, key)
            }
            other => other,
        }
    }

    /// Both alternatives, when both are known: ``the `x-api-key` header or the `key` query
    /// parameter``.
    fn describe(&self) -> Option<String> {
        let (first, second) = (self.first.describe()?, self.second.describe()?);
        if first.is_empty() || second.is_empty() {
            // One of them is always there.
            return Some(String::new());
        }
        Some(format!("{first} or {second}"))
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

            /// Every part, when each is known (`and` between them).
            #[allow(non_snake_case)]
            fn describe(&self) -> Option<String> {
                let ($($name,)+) = self;
                describe_all([$($name.describe(),)+])
            }
        }
    };
}
/// The parts of a composite key that a request may lack, joined with `and`; `None` unless
/// each part is known (a part that cannot be described may be the one missing: naming only
/// the others would send the client's developer after what the request already has).
pub(crate) fn describe_all(parts: impl IntoIterator<Item = Option<String>>) -> Option<String> {
    let parts: Option<Vec<String>> = parts.into_iter().collect();
    let parts: Vec<String> = parts?.into_iter().filter(|p| !p.is_empty()).collect();
    Some(parts.join(" and "))
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
    fn descriptions_name_what_a_client_sends() {
        let h = Header::new;
        let d = |e: &dyn KeyExtractor| e.describe();
        assert_eq!(d(&h("x-api-key")).unwrap(), "the `x-api-key` header");
        assert_eq!(d(&Query::new("key")).unwrap(), "the `key` query parameter");
        assert_eq!(
            d(&h("x-a").or(Query::new("a"))).unwrap(),
            "the `x-a` header or the `a` query parameter"
        );
        assert_eq!(
            d(&(PeerIp::new(), h("x-user"), Global)).unwrap(),
            "the `x-user` header"
        );
        assert_eq!(
            d(&(h("x-a"), h("x-b"))).unwrap(),
            "the `x-a` header and the `x-b` header"
        );
        // Nothing a client sends as such: not named, alone or in a composite key.
        let closure = |_: &Parts| Some(1u8);
        assert_eq!(d(&closure), None);
        assert_eq!(d(&(h("x-a"), closure)), None);
        assert_eq!(d(&Extension::<u8>::new()), None);
        // Always there (or missing through no fault of the client).
        assert_eq!(d(&PeerIp::new()).unwrap(), "");
        let behind_proxies = ClientIp::x_forwarded_for(TrustedProxies::hops(1));
        assert_eq!(
            d(&(behind_proxies, h("x-user"))).unwrap(),
            "the `x-user` header"
        );
        assert_eq!(d(&h("x-a").or(Global)).unwrap(), "");
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
        let found_first = Header::new("x-b").or(Header::new("x-a"));
        assert_eq!(extract(&found_first, &p).unwrap(), "bee");
        let missing = |_: &Parts| -> Option<u8> { None };
        assert_eq!(extract(&missing.or(Global), &p).unwrap(), "");
        // Misconfiguration is reported, not replaced by the fallback.
        let loud = PeerIp::new().or(Global);
        assert!(matches!(
            extract(&loud, &p),
            Err(KeyError::Misconfigured(_))
        ));
        struct Broken;
        impl KeyExtractor for Broken {
            fn extract(&self, _: &Parts, _: &mut KeyBuilder) -> Result<(), KeyError> {
                Err(KeyError::Misconfigured("broken on purpose"))
            }
        }
        assert_eq!(
            extract(&Broken.or(Header::new("x-b")), &p),
            Err(KeyError::Misconfigured("broken on purpose"))
        );
    }

    fn h(name: &'static str) -> Header {
        Header::new(name)
    }

    /// A request with these headers.
    fn with_headers(headers: &[(&'static str, &str)]) -> Parts {
        let mut req = Request::get("/").body(()).unwrap();
        for &(name, value) in headers {
            req.headers_mut().insert(name, value.parse().unwrap());
        }
        parts(req)
    }

    fn key_of(e: &impl KeyExtractor, p: &Parts) -> Result<Key, KeyError> {
        let mut b = KeyBuilder::new();
        e.extract(p, &mut b)?;
        Ok(b.finish())
    }

    /// `with_or` builds exactly the key `plain` builds, for both tenants, and the two
    /// tenants' keys differ.
    #[track_caller]
    fn same_key_per_tenant(
        with_or: &impl KeyExtractor,
        plain: &impl KeyExtractor,
        t1: &str,
        t2: &str,
    ) {
        let user = "u-42";
        let p1 = with_headers(&[("x-tenant", t1), ("x-user", user), ("x-z", "z")]);
        let p2 = with_headers(&[("x-tenant", t2), ("x-user", user), ("x-z", "z")]);
        let (k1, k2) = (key_of(with_or, &p1).unwrap(), key_of(with_or, &p2).unwrap());
        assert_eq!(k1, key_of(plain, &p1).unwrap());
        assert_eq!(k1.to_string(), key_of(plain, &p1).unwrap().to_string());
        assert_eq!(k2, key_of(plain, &p2).unwrap());
        assert_ne!(k1, k2, "two tenants, one bucket");
    }

    #[test]
    fn or_inside_a_tuple_keeps_earlier_parts() {
        let (t, z, u) = (h("x-tenant"), h("x-z"), h("x-user"));
        let or = || h("x-api-key").or(h("x-user"));
        for (t1, t2) in [
            ("t1", "t2"),
            (&*"a".repeat(70), &*"b".repeat(70)),
            (&*"{".repeat(30), &*"}".repeat(30)),
        ] {
            // 2-tuples: the `or` first and last.
            same_key_per_tenant(&(t.clone(), or()), &(t.clone(), u.clone()), t1, t2);
            same_key_per_tenant(&(or(), t.clone()), &(u.clone(), t.clone()), t1, t2);
            // 3-tuples: first, middle, last.
            let plain = (t.clone(), u.clone(), z.clone());
            same_key_per_tenant(&(t.clone(), or(), z.clone()), &plain, t1, t2);
            let plain = (z.clone(), t.clone(), u.clone());
            same_key_per_tenant(&(z.clone(), t.clone(), or()), &plain, t1, t2);
            let plain = (u.clone(), z.clone(), t.clone());
            same_key_per_tenant(&(or(), z.clone(), t.clone()), &plain, t1, t2);
            // 4-tuples: second and last.
            let plain = (t.clone(), u.clone(), z.clone(), z.clone());
            same_key_per_tenant(&(t.clone(), or(), z.clone(), z.clone()), &plain, t1, t2);
            let plain = (z.clone(), t.clone(), z.clone(), u.clone());
            same_key_per_tenant(&(z.clone(), t.clone(), z.clone(), or()), &plain, t1, t2);
        }
    }

    #[test]
    fn nested_ors_undo_only_their_own_parts() {
        let (t, u) = (h("x-tenant"), h("x-user"));
        let plain = (t.clone(), u.clone());
        for (t1, t2) in [("t1", "t2"), (&*"a".repeat(80), &*"b".repeat(80))] {
            let left = h("x-a").or(h("x-b")).or(h("x-user"));
            same_key_per_tenant(&(t.clone(), left), &plain, t1, t2);
            let right = h("x-a").or(h("x-b").or(h("x-user")));
            same_key_per_tenant(&(t.clone(), right), &plain, t1, t2);
            // The first alternative is a tuple that writes a part, then finds one missing.
            let half_way = (h("x-tenant"), h("x-missing")).or(h("x-user"));
            same_key_per_tenant(&(t.clone(), half_way), &plain, t1, t2);
            let deeper = (h("x-tenant"), h("x-z"), h("x-missing"))
                .or((h("x-z"), h("x-missing")).or(h("x-user")));
            same_key_per_tenant(&(t.clone(), deeper), &plain, t1, t2);
        }
    }

    #[test]
    fn or_undoes_long_hashed_parts_and_addresses() {
        let long = "l".repeat(100);
        let p = with_headers(&[("x-tenant", "t1"), ("x-long", &long), ("x-user", "u")]);
        let plain = key_of(&(h("x-tenant"), h("x-user")), &p).unwrap();
        assert_eq!(plain.to_string(), "t1:u", "stays inline");
        // The first alternative pushes the key past 64 bytes (hashed), then fails.
        let spills = (h("x-long"), h("x-missing")).or(h("x-user"));
        assert_eq!(key_of(&(h("x-tenant"), spills), &p).unwrap(), plain);
        // Hashed before the `or`, and more hashed material undone.
        let plain = key_of(&(h("x-long"), h("x-user")), &p).unwrap();
        assert!(plain.to_string().starts_with('~'));
        let spills = (h("x-long"), h("x-missing")).or(h("x-user"));
        assert_eq!(key_of(&(h("x-long"), spills), &p).unwrap(), plain);
        // An address: the builder's fast path for a lone address, before and inside.
        let ip = |_: &Parts| Some(std::net::IpAddr::from([192, 0, 2, 1]));
        let alone = key_of(&ip, &p).unwrap();
        assert_eq!(alone.ip(), Some([192, 0, 2, 1].into()));
        let with_or = key_of(&(ip, h("x-missing").or(h("x-user"))), &p).unwrap();
        assert_eq!(with_or, key_of(&(ip, h("x-user")), &p).unwrap());
        assert_eq!(with_or.to_string(), "@192.0.2.1:u");
        let after_ip = (ip, (h("x-tenant"), h("x-missing")).or(h("x-user")));
        assert_eq!(key_of(&after_ip, &p).unwrap(), with_or);
        let undone_ip = (ip, h("x-missing")).or(h("x-user"));
        assert_eq!(
            key_of(&undone_ip, &p).unwrap(),
            key_of(&h("x-user"), &p).unwrap()
        );
        let ip_fallback = h("x-missing").or(ip);
        assert_eq!(
            key_of(&(ip_fallback), &p).unwrap(),
            alone,
            "still an address key"
        );
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
