//! [`Settle`]: where a request's actual cost is found when its response ends.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use http::{Extensions, HeaderMap, HeaderName, StatusCode};

use crate::base::error::ConfigError;

/// Where a limit finds a request's actual cost when its response ends (settled costs,
/// such as a model call's tokens): the limit admitted the request on its
/// [`Cost`](crate::Cost), the estimate, and the difference is taken (into debt of at most
/// [`LimitSpec::max_debt`](crate::LimitSpec::max_debt) tokens) or given back.
///
/// A value must be a plain decimal integer from 0 to 4294967295 (surrounding spaces
/// allowed); an absent or invalid one leaves the estimate as the cost.
///
/// | source | read |
/// |---|---|
/// | [`Settle::header`] | the response header, when the head comes |
/// | [`Settle::trailer`] | the trailer, when the body ends; or the header of that name in a response without a body (gRPC's Trailers-Only) |
/// | [`Settle::extension`] | an [`ActualCost`] the handler put in the response's extensions |
/// | [`Settle::from_fn`] | a function of the response's head |
///
/// ```
/// use tollgate::{ActualCost, Settle};
///
/// let from_header: Settle = "header:x-usage-tokens".parse()?;
/// let from_trailer = Settle::trailer("x-usage-tokens");
/// let from_handler = Settle::extension(); // response.extensions_mut().insert(ActualCost(812))
/// let by_status = Settle::from_fn(|status, _headers, _extensions| status.is_server_error().then_some(0));
/// # let _ = (from_header, from_trailer, from_handler, by_status, ActualCost(1));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Settle {
    source: Source,
}

/// A request's actual cost, put in the response's extensions by the handler: what
/// [`Settle::extension`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActualCost(pub u32);

/// An actual cost computed by the application from the response's head.
type SettleFn = Arc<dyn Fn(StatusCode, &HeaderMap, &Extensions) -> Option<u32> + Send + Sync>;

#[derive(Clone)]
enum Source {
    Header(HeaderName),
    Trailer(HeaderName),
    Extension,
    Fn(SettleFn),
}

impl Settle {
    /// The response header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid lowercase header name (use `"header:<name>".parse()` for
    /// names from configuration).
    pub fn header(name: &'static str) -> Self {
        Self {
            source: Source::Header(HeaderName::from_static(name)),
        }
    }

    /// The response trailer `name` (or, in a response without a body, such as gRPC's
    /// Trailers-Only, the header of that name).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid lowercase header name.
    pub fn trailer(name: &'static str) -> Self {
        Self {
            source: Source::Trailer(HeaderName::from_static(name)),
        }
    }

    /// An [`ActualCost`] in the response's extensions.
    pub fn extension() -> Self {
        Self {
            source: Source::Extension,
        }
    }

    /// Whatever `f` returns for the response's head (status, headers, extensions);
    /// `None` leaves the estimate.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap, &Extensions) -> Option<u32> + Send + Sync + 'static,
    {
        Self {
            source: Source::Fn(Arc::new(f)),
        }
    }

    /// Whether the value may come in the trailers (the settle waits for the body's end).
    pub fn reads_trailers(&self) -> bool {
        matches!(self.source, Source::Trailer(_))
    }

    /// The actual cost the response's head gives, if any. For a trailer, the header of
    /// its name: what a response without a body (gRPC Trailers-Only) carries; the
    /// trailers, if they come, take precedence ([`from_trailers`](Self::from_trailers)).
    pub fn from_head(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Option<u32> {
        match &self.source {
            Source::Header(name) | Source::Trailer(name) => {
                headers.get(name).and_then(|v| parse(v.as_bytes()))
            }
            Source::Extension => extensions.get::<ActualCost>().map(|c| c.0),
            Source::Fn(f) => f(status, headers, extensions),
        }
    }

    /// The header or trailer the value is read from (`true`: a trailer); `None` for an
    /// extension or a function (what a replay cannot give).
    #[cfg(feature = "rules")]
    pub(crate) fn field(&self) -> Option<(&HeaderName, bool)> {
        match &self.source {
            Source::Header(name) => Some((name, false)),
            Source::Trailer(name) => Some((name, true)),
            Source::Extension | Source::Fn(_) => None,
        }
    }

    /// The actual cost the trailers give, if the value comes from a trailer.
    pub fn from_trailers(&self, trailers: &HeaderMap) -> Option<u32> {
        match &self.source {
            Source::Trailer(name) => trailers.get(name).and_then(|v| parse(v.as_bytes())),
            _ => None,
        }
    }
}

/// `"header:<name>"` or `"trailer:<name>"` (the rules files' `settle`); anything else is a
/// [`ConfigError`] naming `settle`.
impl FromStr for Settle {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let bad = |why: String| ConfigError::new("settle", why);
        let (kind, name) = s.split_once(':').ok_or_else(|| {
            bad(format!(
                "{s:?} is not a source: use \"header:<name>\" or \"trailer:<name>\""
            ))
        })?;
        let name = HeaderName::try_from(name.trim())
            .map_err(|_| bad(format!("`{}` is not a header name", name.trim())))?;
        let source = match kind.trim() {
            "header" => Source::Header(name),
            "trailer" => Source::Trailer(name),
            other => {
                return Err(bad(format!(
                    "unknown source `{other}`: use \"header:<name>\" or \"trailer:<name>\""
                )));
            }
        };
        Ok(Self { source })
    }
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Header(h) => write!(f, "Settle(header:{h})"),
            Source::Trailer(h) => write!(f, "Settle(trailer:{h})"),
            Source::Extension => f.write_str("Settle(extension)"),
            Source::Fn(_) => f.write_str("Settle(fn)"),
        }
    }
}

/// An actual cost from a response: 0 to `u32::MAX` in plain decimal digits, surrounding
/// spaces and tabs allowed.
fn parse(raw: &[u8]) -> Option<u32> {
    let digits = raw.trim_ascii();
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    u32::try_from(n).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Response};

    struct Head(http::response::Parts);

    impl Settle {
        fn at(&self, head: &Head) -> Option<u32> {
            self.from_head(head.0.status, &head.0.headers, &head.0.extensions)
        }
    }

    fn head(header: Option<&[u8]>, actual: Option<u32>) -> Head {
        let mut res = Response::builder().status(200).body(()).unwrap();
        if let Some(h) = header {
            res.headers_mut()
                .insert("x-usage", HeaderValue::from_bytes(h).unwrap());
        }
        if let Some(a) = actual {
            res.extensions_mut().insert(ActualCost(a));
        }
        Head(res.into_parts().0)
    }

    #[test]
    fn each_source_reads_its_place_and_bad_values_leave_the_estimate() {
        let header: Settle = "header:x-usage".parse().unwrap();
        assert_eq!(header.at(&head(Some(b" 812 "), None)), Some(812));
        assert_eq!(header.at(&head(Some(b"0"), None)), Some(0));
        for bad in [&b""[..], b"-1", b"1.5", b"4294967296", b"\xff", b"+3"] {
            assert_eq!(header.at(&head(Some(bad), None)), None, "{bad:?}");
        }
        assert_eq!(header.at(&head(None, Some(3))), None);
        assert!(!header.reads_trailers());
        let mut trailers = HeaderMap::new();
        trailers.insert("x-usage", HeaderValue::from_static("40"));
        assert_eq!(header.from_trailers(&trailers), None);

        let trailer: Settle = "trailer:x-usage".parse().unwrap();
        assert!(trailer.reads_trailers());
        assert_eq!(trailer.from_trailers(&trailers), Some(40));
        assert_eq!(trailer.from_trailers(&HeaderMap::new()), None);
        // Trailers-Only: the trailer's name in the head.
        assert_eq!(trailer.at(&head(Some(b"7"), None)), Some(7));

        assert_eq!(Settle::extension().at(&head(None, Some(9))), Some(9));
        let f = Settle::from_fn(|status, _, _| status.is_success().then_some(2));
        assert_eq!(f.at(&head(None, None)), Some(2));
    }

    #[test]
    fn a_bad_source_is_a_config_error_naming_settle() {
        for bad in ["x-usage", "cookie:x", "header:bad name", "header:"] {
            let err = bad.parse::<Settle>().unwrap_err();
            assert_eq!(err.field(), "settle", "{bad}");
        }
        assert_eq!(
            format!("{:?}", "trailer:grpc-usage".parse::<Settle>().unwrap()),
            "Settle(trailer:grpc-usage)"
        );
    }
}
