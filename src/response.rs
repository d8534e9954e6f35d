//! The responses the limiter gives instead of calling the service, and how to replace them.
//!
//! Every outcome is a response, never an error: [`Rejection`] says why a request is
//! refused, and an [`OnRejection`] turns it into a response. The default,
//! [`DefaultOnRejection`], answers with an `application/problem+json` body (RFC 9457).
//! Whatever the response, the layer then adds what is missing of the rate-limit fields,
//! `Retry-After` (when a wait helps) and `Cache-Control: no-store`.
//!
//! ```
//! use axum::{body::Body, http::{Response, StatusCode}};
//! use tollgate::{response::Rejection, store::MemoryStore, key::PeerIp, Limit, Quota, RateLimitLayer};
//!
//! let layer = RateLimitLayer::builder(MemoryStore::new())
//!     .limit(Limit::new("per-ip", Quota::per_second(5)).key(PeerIp::new()))
//!     .on_rejection(|rejection: &Rejection<'_>| {
//!         let status = rejection.status();
//!         let text = match rejection.retry_after() {
//!             Some(wait) => format!("slow down, try again in {} ms", wait.as_millis()),
//!             None => status.canonical_reason().unwrap_or("refused").to_owned(),
//!         };
//!         Response::builder().status(status).body(Body::from(text)).unwrap()
//!     })
//!     .build()?;
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

use crate::decision::Decision;

/// Why a request is refused.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Rejection<'a> {
    /// An enforcing limit refused the request (429).
    Limited {
        /// The decision over all limits.
        decision: &'a Decision,
        /// How long until the request would pass (with jitter, if configured); `None` if
        /// its cost exceeds a bucket and it can never pass.
        retry_after: Option<Duration>,
    },
    /// A store failed under a [`FailurePolicy::Deny`](crate::FailurePolicy) limit (503).
    Unavailable {
        /// The decision over all limits.
        decision: &'a Decision,
        /// How long before trying again is useful.
        retry_after: Duration,
    },
    /// The request has no key for a limit whose policy is
    /// [`MissingKey::Reject`](crate::MissingKey).
    MissingKey {
        /// The limit.
        limit: &'a str,
        /// The status configured for this case.
        status: StatusCode,
    },
    /// The application is set up so that a limit cannot work, e.g. peer addresses without
    /// connection info (500). The reason, naming the fix, is logged.
    Misconfigured {
        /// The limit.
        limit: &'a str,
        /// What is wrong and how to fix it.
        reason: &'static str,
    },
}

impl Rejection<'_> {
    /// The status of this rejection: 429, 503, the configured 4xx, or 500.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Limited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Rejection::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::MissingKey { status, .. } => *status,
            Rejection::Misconfigured { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// How long before trying again is useful, when a wait helps.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::Limited { retry_after, .. } => *retry_after,
            Rejection::Unavailable { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The decision, for rejections made after checking the limits.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Rejection::Limited { decision, .. } | Rejection::Unavailable { decision, .. } => {
                Some(decision)
            }
            _ => None,
        }
    }
}

/// Turns a [`Rejection`] into a response.
///
/// Implemented by [`DefaultOnRejection`] and by closures
/// `Fn(&Rejection<'_>) -> Response<B>`.
pub trait OnRejection<B>: Clone + Send + Sync + 'static {
    /// The response for `rejection`.
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<B>;
}

impl<B, F> OnRejection<B> for F
where
    F: Fn(&Rejection<'_>) -> Response<B> + Clone + Send + Sync + 'static,
{
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<B> {
        self(rejection)
    }
}

/// Problem details (RFC 9457) for every rejection.
///
/// A 429 reads:
///
/// ```text
/// Content-Type: application/problem+json
///
/// {"type":"about:blank","title":"Too Many Requests","status":429,
///  "detail":"Rate limit \"per-ip\" exceeded; retry in 3 s.","violated-policies":["per-ip"]}
/// ```
///
/// With [`DefaultOnRejection::ietf_problem_types`], the problem types of the IETF draft
/// (`…#quota-exceeded`, `…#temporary-reduced-capacity`) are used instead of `about:blank`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultOnRejection {
    ietf_types: bool,
}

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
const REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

impl DefaultOnRejection {
    /// `about:blank` problems titled with the status text.
    pub const fn new() -> Self {
        Self { ietf_types: false }
    }

    /// The problem types of draft-ietf-httpapi-ratelimit-headers (not registered with IANA
    /// until the draft becomes an RFC).
    pub const fn ietf_problem_types() -> Self {
        Self { ietf_types: true }
    }

    /// The problem document for `rejection`.
    pub fn problem(&self, rejection: &Rejection<'_>) -> serde_json::Value {
        let status = rejection.status();
        let title = status.canonical_reason().unwrap_or("Error");
        let mut doc = serde_json::Map::new();
        let mut put = |k: &str, v: serde_json::Value| {
            doc.insert(k.to_owned(), v);
        };
        match rejection {
            Rejection::Limited {
                decision,
                retry_after,
            } => {
                let names: Vec<&str> = decision.violated().map(|l| l.name()).collect();
                if self.ietf_types {
                    put("type", QUOTA_EXCEEDED.into());
                    put("title", "Quota Exceeded".into());
                } else {
                    put("type", "about:blank".into());
                    put("title", title.into());
                }
                put("status", status.as_u16().into());
                let detail = match (
                    retry_after,
                    decision.violated().find(|l| {
                        l.outcome()
                            .is_some_and(|o| o.verdict() == crate::decision::Verdict::Never)
                    }),
                ) {
                    (_, Some(l)) => format!(
                        "A request costing {} exceeds the capacity ({}) of limit {:?}: it can never be satisfied.",
                        l.cost(),
                        l.quota().burst_size(),
                        l.name()
                    ),
                    (Some(wait), None) => format!(
                        "Rate limit {} exceeded; retry in {} s.",
                        quoted_list(&names),
                        crate::headers::ceil_secs(*wait)
                    ),
                    (None, None) => format!("Rate limit {} exceeded.", quoted_list(&names)),
                };
                put("detail", detail.into());
                put("violated-policies", names.into());
            }
            Rejection::Unavailable { decision, .. } => {
                let names: Vec<&str> = decision
                    .limits()
                    .filter(|l| *l.status() == crate::decision::Status::FailedClosed)
                    .map(|l| l.name())
                    .collect();
                put(
                    "type",
                    if self.ietf_types {
                        REDUCED_CAPACITY
                    } else {
                        "about:blank"
                    }
                    .into(),
                );
                put(
                    "title",
                    if self.ietf_types {
                        "Temporary Reduced Capacity"
                    } else {
                        title
                    }
                    .into(),
                );
                put("status", status.as_u16().into());
                put(
                    "detail",
                    "The rate limiter cannot reach its store; try again shortly.".into(),
                );
                put("violated-policies", names.into());
            }
            Rejection::MissingKey { limit, .. } => {
                put("type", "about:blank".into());
                put("title", title.into());
                put("status", status.as_u16().into());
                put(
                    "detail",
                    format!("The request lacks what limit {limit:?} is keyed by.").into(),
                );
            }
            Rejection::Misconfigured { .. } => {
                put("type", "about:blank".into());
                put("title", title.into());
                put("status", status.as_u16().into());
            }
        }
        serde_json::Value::Object(doc)
    }
}

fn quoted_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    quoted.join(", ")
}

impl<B: From<Bytes>> OnRejection<B> for DefaultOnRejection {
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<B> {
        let body = serde_json::to_vec(&self.problem(rejection)).unwrap_or_default();
        let mut response = Response::new(B::from(Bytes::from(body)));
        *response.status_mut() = rejection.status();
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

impl fmt::Display for Rejection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Limited { decision, .. } => {
                let names: Vec<&str> = decision.violated().map(|l| l.name()).collect();
                write!(f, "rate limit {} exceeded", quoted_list(&names))
            }
            Rejection::Unavailable { .. } => f.write_str("rate limit store unavailable"),
            Rejection::MissingKey { limit, .. } => write!(f, "no key for limit {limit:?}"),
            Rejection::Misconfigured { limit, reason } => write!(f, "limit {limit:?}: {reason}"),
        }
    }
}
