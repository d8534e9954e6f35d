//! gRPC refusals (feature `grpc`): what a tonic (or any gRPC) client understands.
//!
//! An HTTP `429` from a middleware reaches gRPC clients as `UNAVAILABLE` (the gRPC
//! mapping of HTTP statuses), which many retry at once. So when a request's
//! `content-type` is `application/grpc…` (or the layer is told it serves gRPC, see
//! [`Grpc::always`]), a refusal is a *Trailers-Only* gRPC response: HTTP `200`, one header
//! block that ends the stream, with
//!
//! - `grpc-status`: `8` (`RESOURCE_EXHAUSTED`, configurable, e.g. `14`), or `14`
//!   (`UNAVAILABLE`) when a store failed under [`FailurePolicy::Deny`](crate::FailurePolicy);
//! - `grpc-message`: what the problem document's detail says;
//! - `grpc-retry-pushback-ms`: the wait in milliseconds, rounded up (gRFC A6: a client
//!   with a retry policy retries after exactly that delay); absent when the request's cost
//!   exceeds a bucket and it can never pass;
//! - `grpc-status-details-bin`: a `google.rpc.Status` (base64, standard alphabet, no
//!   padding, as gRPC writes binary metadata) carrying `google.rpc.RetryInfo` (the wait),
//!   one `google.rpc.QuotaFailure` violation per refusing limit (`subject` and `quota_id`:
//!   the limit's name, `quota_value`: its burst) and `google.rpc.ErrorInfo { reason:
//!   "RATE_LIMIT_EXCEEDED", domain }` (`RATE_LIMITER_UNAVAILABLE` for a store failure);
//! - the layer's rate-limit fields (`RateLimit`, `RateLimit-Policy`) as metadata.
//!
//! Allowed calls carry the rate-limit fields in their response headers (initial
//! metadata), as HTTP responses do. Read the details in a tonic client with
//! `tonic_types::StatusExt::get_error_details`.
//!
//! The response comes from the layer's [`OnRejection`]'s
//! [`on_grpc_rejection`](OnRejection::on_grpc_rejection), which must give an empty body:
//! [`DefaultOnRejection`](crate::response::DefaultOnRejection) does (for bodies made
//! `From<Bytes>`, such as axum's), and [`GrpcOnRejection`] does for any body with a
//! `Default` (tonic's own `tonic::body::Body`, for `tonic::transport::Server::layer`).
//!
//! [`PeerIp`](crate::key::PeerIp) reads the peer address tonic's server puts in each
//! request (`TcpConnectInfo`), so per-client limits work behind
//! `tonic::transport::Server::builder().layer(..)` as they do with axum.
//!
//! ```
//! use tollgate::{grpc::{Grpc, GrpcOnRejection}, key::PeerIp, store::MemoryStore, Limit, Quota, RateLimitLayer};
//!
//! let layer = RateLimitLayer::builder(MemoryStore::new())
//!     .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
//!     .grpc(Grpc::new().always(true).domain("example.com"))
//!     .on_rejection(GrpcOnRejection)
//!     .build()?;
//! # let _ = layer;
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

mod stream;

use std::borrow::Cow;
use std::collections::HashMap;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};
use tonic::Code;
use tonic_types::{ErrorDetails, QuotaViolation, StatusExt};

use crate::base::round::ceil_ms;
use crate::web::headers::Fields;
use crate::web::response::{OnRejection, Rejection};

pub use self::stream::{PacedMessages, StreamLimit, StreamLimitLayer};

/// `grpc-retry-pushback-ms` (gRFC A6).
pub const RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// The `ErrorInfo` reason of a refusal by a limit.
pub const RATE_LIMIT_EXCEEDED: &str = "RATE_LIMIT_EXCEEDED";
/// The `ErrorInfo` reason of a refusal because a store failed under `FailurePolicy::Deny`.
pub const RATE_LIMITER_UNAVAILABLE: &str = "RATE_LIMITER_UNAVAILABLE";

/// How a layer answers gRPC calls it refuses (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grpc {
    code: Code,
    always: bool,
    domain: Cow<'static, str>,
}

impl Default for Grpc {
    fn default() -> Self {
        Self::new()
    }
}

impl Grpc {
    /// `RESOURCE_EXHAUSTED` for requests whose `content-type` is `application/grpc…`;
    /// `ErrorInfo` domain `tollgate`.
    pub const fn new() -> Self {
        Self {
            code: Code::ResourceExhausted,
            always: false,
            domain: Cow::Borrowed("tollgate"),
        }
    }

    /// The status of a refusal by a limit (default `RESOURCE_EXHAUSTED`, 8; some prefer
    /// `UNAVAILABLE`, 14, which clients treat as transient).
    pub const fn code(mut self, code: Code) -> Self {
        self.code = code;
        self
    }

    /// Answer every refusal the gRPC way, whatever the request's `content-type` (for a
    /// layer in front of a gRPC server only).
    pub const fn always(mut self, always: bool) -> Self {
        self.always = always;
        self
    }

    /// The `ErrorInfo` domain (default `tollgate`): usually the service's name.
    pub fn domain(mut self, domain: impl Into<Cow<'static, str>>) -> Self {
        self.domain = domain.into();
        self
    }

    /// The `content-type` of the answer to this request, if it is answered the gRPC way.
    pub(crate) fn answer_type(&self, parts: &Parts) -> Option<HeaderValue> {
        let ct = parts
            .headers
            .get(CONTENT_TYPE)
            .map(HeaderValue::as_bytes)
            .unwrap_or_default();
        let grpc = ct.len() >= 16 && ct[..16].eq_ignore_ascii_case(b"application/grpc");
        if grpc && ct.len() >= 20 && ct[16..20].eq_ignore_ascii_case(b"-web") {
            return Some(HeaderValue::from_static("application/grpc-web"));
        }
        (grpc || self.always).then(|| HeaderValue::from_static("application/grpc"))
    }
}

/// Rejections with an empty body and the rejection's status, for any body type with a
/// `Default` (such as `tonic::body::Body`): gRPC calls get the layer's gRPC answer; other
/// requests get the status and the rate-limit fields without a body.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcOnRejection;

impl<B: Default> OnRejection<B> for GrpcOnRejection {
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<B> {
        let mut response = Response::new(B::default());
        *response.status_mut() = rejection.status();
        response
    }
}

/// The details of a refusal, as `tonic_types` builds them.
fn details(grpc: &Grpc, rejection: &Rejection<'_>) -> ErrorDetails {
    let mut details = ErrorDetails::new();
    if let Some(wait) = rejection.retry_after() {
        details.set_retry_info(Some(wait));
    }
    match rejection {
        Rejection::Limited { decision, .. } => {
            let violations: Vec<QuotaViolation> = decision
                .violated()
                .map(|l| {
                    let q = l.quota();
                    let mut v = QuotaViolation::new(
                        l.name(),
                        format!(
                            "rate limit \"{}\": burst {}, refilled over {} s",
                            l.name(),
                            q.burst_size(),
                            q.window_secs()
                        ),
                    );
                    v.quota_id = l.name().to_owned();
                    v.quota_value = i64::try_from(q.burst_size()).unwrap_or(i64::MAX);
                    v
                })
                .collect();
            details.set_quota_failure(violations);
            let limits: Vec<&str> = decision.violated().map(|l| l.name()).collect();
            details.set_error_info(
                RATE_LIMIT_EXCEEDED,
                grpc.domain.clone(),
                HashMap::from([("limits".to_owned(), limits.join(","))]),
            );
        }
        Rejection::Unavailable { decision, .. } => {
            let limits: Vec<&str> = Rejection::failed_closed(decision).collect();
            details.set_error_info(
                RATE_LIMITER_UNAVAILABLE,
                grpc.domain.clone(),
                HashMap::from([("limits".to_owned(), limits.join(","))]),
            );
        }
        _ => {}
    }
    details
}

/// The gRPC message of a refusal.
fn message(rejection: &Rejection<'_>) -> String {
    match rejection {
        Rejection::Limited {
            retry_after: Some(wait),
            ..
        } => format!("{rejection}; retry in {} ms", ceil_ms(*wait)),
        Rejection::Limited {
            retry_after: None, ..
        } => format!("{rejection}; the request's cost exceeds the limit's capacity"),
        _ => rejection.to_string(),
    }
}

/// The Trailers-Only answer to a refused gRPC call.
pub(crate) fn refuse<R: OnRejection<B>, B>(
    grpc: &Grpc,
    on_rejection: &R,
    content_type: HeaderValue,
    rejection: &Rejection<'_>,
    fields: Fields,
) -> Response<B> {
    let code = match rejection {
        Rejection::Unavailable { .. } => Code::Unavailable,
        _ => grpc.code,
    };
    let mut response = on_rejection.on_grpc_rejection(rejection);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.remove(CONTENT_LENGTH);
    headers.insert(CONTENT_TYPE, content_type);
    let status =
        tonic::Status::with_error_details(code, message(rejection), details(grpc, rejection));
    if let Err(e) = status.add_header(headers) {
        tracing::debug!(error = %e, "tollgate: cannot write the gRPC status");
    }
    if let Some(wait) = rejection.retry_after() {
        headers.insert(RETRY_PUSHBACK_MS, HeaderValue::from(ceil_ms(wait) as u64));
    }
    fields.apply(headers);
    response
}
