//! [`Cost`]: how many tokens a request takes.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;

use crate::base::error::ConfigError;
use crate::web::key::query_param;

/// How many tokens a request costs: fixed, or read from the request with a default.
///
/// A value from a header or a query parameter must be a plain decimal integer from 1 to
/// 4294967295; anything else (absent, empty, negative, fractional, `+5`, `0`, too large,
/// not text) falls back to the default cost, never to a panic. Zero is refused from
/// request input because it would let a client skip the limit; a closure given to
/// [`Cost::from_fn`] may return 0 for a free request (a peek).
///
/// ```
/// use tollgate::Cost;
///
/// let fixed = Cost::fixed(5);
/// let weighted = Cost::header("x-request-weight").default(1);
/// let by_page_size = Cost::from_fn(|parts| {
///     parts.uri.query()?.strip_prefix("size=")?.parse::<u32>().ok().map(|n| n.div_ceil(100))
/// });
/// # let _ = (fixed, weighted, by_page_size);
/// ```
#[derive(Clone)]
pub struct Cost {
    source: Source,
    default: u32,
}

/// A cost computed by the application.
type CostFn = Arc<dyn Fn(&Parts) -> Option<u32> + Send + Sync>;

#[derive(Clone)]
enum Source {
    Fixed,
    Header(HeaderName),
    Query(Arc<str>),
    Fn(CostFn),
}

impl Cost {
    /// Every request costs `n`.
    pub const fn fixed(n: u32) -> Self {
        Self {
            source: Source::Fixed,
            default: n,
        }
    }

    /// The value of the header `name`, default 1.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid lowercase header name (use [`Cost::try_header`] for names
    /// from configuration).
    pub fn header(name: &'static str) -> Self {
        Self {
            source: Source::Header(HeaderName::from_static(name)),
            default: 1,
        }
    }

    /// The value of the header `name`, default 1, or a [`ConfigError`] naming `cost` if
    /// `name` is not a header name.
    pub fn try_header(name: &str) -> Result<Self, ConfigError> {
        let name = HeaderName::try_from(name)
            .map_err(|_| ConfigError::new("cost", format!("`{name}` is not a header name")))?;
        Ok(Self {
            source: Source::Header(name),
            default: 1,
        })
    }

    /// The value of the query parameter `name`, default 1.
    pub fn query(name: &str) -> Self {
        Self {
            source: Source::Query(name.into()),
            default: 1,
        }
    }

    /// Whatever `f` returns, or the default when it returns `None`. Unlike request input,
    /// `Some(0)` is honoured: the request is checked without consuming anything.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> Option<u32> + Send + Sync + 'static,
    {
        Self {
            source: Source::Fn(Arc::new(f)),
            default: 1,
        }
    }

    /// The cost used when the request's value is absent or invalid (for
    /// [`Cost::fixed`], the cost itself). Like a fixed cost, it must not exceed the limit's
    /// burst: such requests could never pass, and building the layer refuses it.
    pub const fn default(mut self, n: u32) -> Self {
        self.default = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.default == 0 {
            return Err(ConfigError::new(
                "cost",
                "must be at least 1 (a cost of 0 would never consume anything)",
            ));
        }
        Ok(())
    }

    /// Refuses a cost that requests could never pay from a bucket of `burst` tokens: a
    /// fixed cost above it, or a default above it (every request without a usable value
    /// would be refused forever).
    pub(crate) fn validate_for(&self, burst: u64) -> Result<(), ConfigError> {
        let n = self.default;
        if u64::from(n) <= burst {
            return Ok(());
        }
        let reason = match &self.source {
            Source::Fixed => {
                format!("{n} exceeds the burst of {burst}: no request could ever pass")
            }
            Source::Header(name) => format!(
                "the default {n} exceeds the burst of {burst}: no request without a valid \
                 `{name}` header could ever pass"
            ),
            Source::Query(name) => format!(
                "the default {n} exceeds the burst of {burst}: no request without a valid \
                 `{name}` query parameter could ever pass"
            ),
            Source::Fn(_) => format!(
                "the default {n} exceeds the burst of {burst}: no request for which the \
                 function returns `None` could ever pass"
            ),
        };
        Err(ConfigError::new("cost", reason))
    }

    /// The cost of this request.
    pub(crate) fn resolve(&self, parts: &Parts) -> u32 {
        let value = match &self.source {
            Source::Fixed => None,
            Source::Header(name) => parts
                .headers
                .get(name)
                .and_then(|v| parse_cost(v.as_bytes())),
            Source::Query(name) => query_param(parts, name).and_then(|v| parse_cost(v.as_bytes())),
            Source::Fn(f) => f(parts),
        };
        value.unwrap_or(self.default)
    }
}

impl From<u32> for Cost {
    fn from(n: u32) -> Self {
        Cost::fixed(n)
    }
}

impl Default for Cost {
    fn default() -> Self {
        Cost::fixed(1)
    }
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Cost");
        match &self.source {
            Source::Fixed => d.field("fixed", &self.default),
            Source::Header(h) => d.field("header", h).field("default", &self.default),
            Source::Query(q) => d.field("query", q).field("default", &self.default),
            Source::Fn(_) => d.field("fn", &"..").field("default", &self.default),
        };
        d.finish()
    }
}

/// A cost from request input: 1 to `u32::MAX` in plain decimal digits, surrounding
/// spaces and tabs allowed.
fn parse_cost(raw: &[u8]) -> Option<u32> {
    let digits = raw.trim_ascii();
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    u32::try_from(n).ok().filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(uri: &str, cost: Option<&[u8]>) -> Parts {
        let mut req = Request::get(uri).body(()).unwrap();
        if let Some(c) = cost {
            req.headers_mut()
                .insert("x-cost", http::HeaderValue::from_bytes(c).unwrap());
        }
        req.into_parts().0
    }

    #[test]
    fn bad_request_input_uses_the_default() {
        let cost = Cost::header("x-cost").default(3);
        assert_eq!(cost.resolve(&parts("/", Some(b"7"))), 7);
        assert_eq!(cost.resolve(&parts("/", Some(b" 12 "))), 12);
        assert_eq!(cost.resolve(&parts("/", Some(b"4294967295"))), u32::MAX);
        for bad in [
            &b""[..],
            b"abc",
            b"-1",
            b"+5",
            b"1.5",
            b"1e3",
            b"0",
            b"4294967296",
            b"99999999999999999999",
            b"\xff",
            b"1 2",
        ] {
            assert_eq!(cost.resolve(&parts("/", Some(bad))), 3, "{bad:?}");
        }
        assert_eq!(cost.resolve(&parts("/", None)), 3);
    }

    #[test]
    fn query_and_closure_and_fixed() {
        let q = Cost::query("weight");
        assert_eq!(q.resolve(&parts("/?a=1&weight=9", None)), 9);
        assert_eq!(q.resolve(&parts("/?weight=-9", None)), 1);
        assert_eq!(q.resolve(&parts("/", None)), 1);
        let f = Cost::from_fn(|p| (p.uri.path() == "/free").then_some(0)).default(2);
        assert_eq!(
            f.resolve(&parts("/free", None)),
            0,
            "a closure may ask for a peek"
        );
        assert_eq!(f.resolve(&parts("/paid", None)), 2);
        assert_eq!(Cost::fixed(4).resolve(&parts("/", Some(b"9"))), 4);
        assert!(Cost::fixed(0).validate().is_err());
        assert!(Cost::try_header("not a header").is_err());
    }
}
