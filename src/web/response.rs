//! The responses the limiter gives instead of calling the service, and how to replace them.
//!
//! Every outcome is a response, never an error: [`Rejection`] says why a request is
//! refused, and an [`OnRejection`] turns it into a response. The default,
//! [`DefaultOnRejection`], answers with an `application/problem+json` body (RFC 9457).
//! Whatever the response, the layer then adds its rate-limit fields, `Retry-After` (when a
//! wait helps) and `Cache-Control: no-store`:
//!
//! - in the IETF style ([`HeaderStyle::Ietf`](crate::headers::HeaderStyle)), `RateLimit` and
//!   `RateLimit-Policy` are lists, and the layer's members are *appended*: a response that
//!   already carries these fields (set by your [`OnRejection`]) ends up with both your
//!   members and the layer's, as separate field lines of one list. Leave these fields to
//!   the layer, or use [`HeaderStyle::None`](crate::headers::HeaderStyle) and write your own;
//! - in the other styles the fields hold one value, and each is set only if the response
//!   does not have it already;
//! - `Retry-After` and `Cache-Control` are set only if the response does not have them.
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

use std::cell::RefCell;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

use crate::base::memo::{Memo, MemoKey, memoized};
use crate::base::text::StackText;
use crate::model::decision::Decision;

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
        /// What the request lacks, in words for a client's developer (``the `x-api-key`
        /// header``), when the limit's key extractor says
        /// ([`KeyExtractor::describe`](crate::key::KeyExtractor::describe)).
        needs: Option<&'a str>,
        /// The `WWW-Authenticate` challenge of a 401 (see
        /// [`MissingKey`](crate::MissingKey)); the layer adds the field to the response
        /// unless it has one.
        challenge: Option<&'a str>,
    },
    /// The client is on the layer's deny list
    /// ([`RateLimitBuilder::deny_cidrs`](crate::RateLimitBuilder::deny_cidrs)): 403,
    /// before any limit is checked.
    Blocked {
        /// The status (403).
        status: StatusCode,
    },
    /// The request's key is banned by a limit's [`Ban`](crate::Ban): refused before the
    /// store is asked (403 or 429, see [`Limit::ban_status`](crate::Limit::ban_status)),
    /// with the ban's remaining time as `Retry-After`.
    Banned {
        /// The limit.
        limit: &'a str,
        /// The status (403 or 429).
        status: StatusCode,
        /// The time the ban has left.
        retry_after: Duration,
    },
    /// The application is set up so that a limit cannot work, e.g. peer addresses without
    /// connection info (500). The reason, naming the fix, is the problem document's
    /// `detail` and is logged (once per layer).
    Misconfigured {
        /// The limit.
        limit: &'a str,
        /// What is wrong and how to fix it.
        reason: &'static str,
    },
}

impl<'a> Rejection<'a> {
    /// The rejection of a request its decision refused: [`Unavailable`](Self::Unavailable)
    /// (retry after `wait`, else `unavailable_retry`) if a store failed under a denying
    /// policy, [`Limited`](Self::Limited) otherwise.
    pub(crate) fn refused(
        decision: &'a Decision,
        unavailable: bool,
        wait: Option<Duration>,
        unavailable_retry: Duration,
    ) -> Self {
        if unavailable {
            Rejection::Unavailable {
                decision,
                retry_after: wait.unwrap_or(unavailable_retry),
            }
        } else {
            Rejection::Limited {
                decision,
                retry_after: wait,
            }
        }
    }

    /// The names of the limits whose store failed under a denying policy.
    pub(crate) fn failed_closed(decision: &Decision) -> impl Iterator<Item = &str> {
        decision
            .limits()
            .filter(|l| *l.status() == crate::model::decision::Status::FailedClosed)
            .map(|l| l.name())
    }
}

impl Rejection<'_> {
    /// The status of this rejection: 429, 503, the configured 4xx, or 500.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Limited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Rejection::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::MissingKey { status, .. }
            | Rejection::Blocked { status }
            | Rejection::Banned { status, .. } => *status,
            Rejection::Misconfigured { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// How long before trying again is useful, when a wait helps.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::Limited { retry_after, .. } => *retry_after,
            Rejection::Unavailable { retry_after, .. } | Rejection::Banned { retry_after, .. } => {
                Some(*retry_after)
            }
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

/// The `limit` of a [`Rejection::Misconfigured`] that comes from the allow and deny lists.
pub(crate) const LISTS: &str = "(allow and deny lists)";

/// Turns a [`Rejection`] into a response.
///
/// Implemented by [`DefaultOnRejection`] and by closures
/// `Fn(&Rejection<'_>) -> Response<B>`.
pub trait OnRejection<B>: Clone + Send + Sync + 'static {
    /// The response for `rejection`.
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<B>;

    /// The response for a refused gRPC call (feature `grpc`, see `tollgate::grpc`). The
    /// layer makes it a Trailers-Only gRPC answer (status `200`, `content-type`, the
    /// `grpc-*` fields), so its **body must be empty**. The default is
    /// [`on_rejection`](Self::on_rejection)'s response: a closure used in front of gRPC
    /// services should answer with an empty body. [`DefaultOnRejection`] answers with an
    /// empty body here.
    fn on_grpc_rejection(&self, rejection: &Rejection<'_>) -> Response<B> {
        self.on_rejection(rejection)
    }
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

    /// The problem document for `rejection`, as JSON text.
    pub fn problem(&self, rejection: &Rejection<'_>) -> String {
        let doc = self.write_problem(rejection);
        // Only whole UTF-8 strings are ever written.
        String::from_utf8_lossy(&doc).into_owned()
    }

    /// The problem document for `rejection`: for a 429 of one limit, the thread's copy
    /// from earlier refusals of that limit with the same wait in seconds ([`BODIES`]);
    /// otherwise written on the stack and copied once.
    fn write_problem(&self, rejection: &Rejection<'_>) -> Bytes {
        // A banned key's body names its limit only: rendered once per thread and limit.
        // (Only the crate makes a `Banned`, always with an interned name.)
        if let Rejection::Banned { limit, status, .. } = rejection {
            let key = MemoKey::interned(2, limit, status.as_u16().into());
            return memoized(&BODIES, key, || Some(self.render_problem(rejection)))
                .unwrap_or_default();
        }
        if let Rejection::Limited {
            decision,
            retry_after,
        } = rejection
        {
            let mut violated = decision.violated();
            if let (Some(l), None) = (violated.next(), violated.next())
                && !l.outcome().is_some_and(|o| o.is_never())
            {
                // The body depends on this one limit, the seconds to wait and the problem
                // types (this type's only option; a new option must join the key).
                let secs = retry_after.map_or(u64::MAX, crate::web::headers::ceil_secs);
                let key = MemoKey::new(u8::from(self.ietf_types), l.name, secs);
                return memoized(&BODIES, key, || Some(self.render_problem(rejection)))
                    .unwrap_or_default();
            }
        }
        self.render_problem(rejection)
    }

    /// The problem document for `rejection`, written on the stack and copied once.
    fn render_problem(&self, rejection: &Rejection<'_>) -> Bytes {
        let mut doc = Problem::new();
        match rejection {
            // Every 429 starts alike: its head and the opening of its detail are one piece.
            Rejection::Limited {
                decision,
                retry_after,
            } => {
                doc.push_str(limited_head(self.ietf_types));
                let never = decision.violated().find(|l| {
                    l.outcome()
                        .is_some_and(crate::model::decision::Outcome::is_never)
                });
                match (never, retry_after) {
                    (Some(l), _) => {
                        doc.text("A request costing ");
                        doc.integer(l.cost().into());
                        doc.text(" exceeds the capacity (");
                        doc.integer(l.quota().burst_size());
                        doc.text(") of limit ");
                        doc.quoted(l.name());
                        doc.text(": it can never be satisfied.");
                    }
                    (None, wait) => {
                        doc.text("Rate limit ");
                        for (i, l) in decision.violated().enumerate() {
                            if i > 0 {
                                doc.text(", ");
                            }
                            doc.quoted(l.name());
                        }
                        match wait {
                            Some(wait) => {
                                doc.text(" exceeded; retry in ");
                                doc.integer(crate::web::headers::ceil_secs(*wait));
                                doc.text(" s.");
                            }
                            None => doc.text(" exceeded."),
                        }
                    }
                }
                doc.close();
                doc.strings("violated-policies", decision.violated().map(|l| l.name()));
                return doc.finish();
            }
            _ => self.head(&mut doc, rejection),
        }
        match rejection {
            // Written above.
            Rejection::Limited { .. } => {}
            Rejection::Unavailable { decision, .. } => {
                doc.string(
                    "detail",
                    "The rate limiter cannot reach its store; try again shortly.",
                );
                doc.strings("violated-policies", Rejection::failed_closed(decision));
            }
            Rejection::MissingKey { limit, needs, .. } => {
                doc.key("detail");
                doc.open();
                match needs {
                    Some(needs) => {
                        doc.text("This endpoint needs ");
                        push_json_escaped(&mut doc.0, needs);
                        doc.text(" (rate limit ");
                        doc.quoted(limit);
                        doc.text(" counts requests by it).");
                    }
                    None => {
                        doc.text("This endpoint counts requests by a key (rate limit ");
                        doc.quoted(limit);
                        doc.text(") that the request does not carry, such as a credential.");
                    }
                }
                doc.close();
            }
            Rejection::Blocked { .. } => {
                doc.string("detail", "This client is not allowed to use this service.");
            }
            Rejection::Banned { limit, .. } => {
                doc.key("detail");
                doc.open();
                doc.text("This client is banned for a while by rate limit ");
                doc.quoted(limit);
                doc.text(" after repeated refusals.");
                doc.close();
            }
            Rejection::Misconfigured { limit, reason } => {
                doc.key("detail");
                doc.open();
                if *limit == LISTS {
                    doc.text("tollgate cannot apply its allow and deny lists: ");
                } else {
                    doc.text("tollgate cannot apply limit ");
                    doc.quoted(limit);
                    doc.text(": ");
                }
                push_json_escaped(&mut doc.0, reason);
                doc.close();
            }
        }
        doc.finish()
    }

    /// `type`, `title` and `status`.
    fn head(&self, doc: &mut Problem, rejection: &Rejection<'_>) {
        let status = rejection.status();
        let title: &'static str = status.canonical_reason().unwrap_or("Error");
        let (problem_type, title) = match rejection {
            Rejection::Limited { .. } if self.ietf_types => (QUOTA_EXCEEDED, "Quota Exceeded"),
            Rejection::Unavailable { .. } if self.ietf_types => {
                (REDUCED_CAPACITY, "Temporary Reduced Capacity")
            }
            _ => ("about:blank", title),
        };
        doc.string("type", problem_type);
        doc.string("title", title);
        doc.number("status", status.as_u16().into());
    }
}

thread_local! {
    /// The problem bodies of this thread's recent 429s of one limit, by limit, problem
    /// types and seconds to wait: a flood of refusals renders each body once per thread.
    static BODIES: RefCell<Memo<Bytes>> = const { RefCell::new(Memo::new()) };
}

/// What [`DefaultOnRejection::head`] writes for a 429, and the opening of its `detail`.
fn limited_head(ietf_types: bool) -> &'static str {
    if ietf_types {
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"detail":""#
    } else {
        r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":""#
    }
}

/// A JSON object written member by member into one buffer: the problem documents have a
/// fixed shape, and this is on the path of every refused request.
/// Written on the stack (a problem document is a few hundred bytes): the response body is
/// then one allocation of its exact size.
struct Problem(Text);

/// A problem document's bytes.
type Text = StackText<512>;

impl Problem {
    fn new() -> Self {
        Problem(Text::new())
    }

    fn push_str(&mut self, s: &str) {
        self.0.push(s.as_bytes());
    }

    fn key(&mut self, key: &'static str) {
        self.0.push(if self.0.is_empty() { b"{\"" } else { b",\"" });
        self.push_str(key);
        self.push_str("\":");
    }

    fn open(&mut self) {
        self.0.push_byte(b'"');
    }

    fn close(&mut self) {
        self.0.push_byte(b'"');
    }

    /// Constant text inside an open string (plain: nothing to escape).
    fn text(&mut self, s: &'static str) {
        self.push_str(s);
    }

    /// A name in quotes inside an open string: `\"name\"`.
    fn quoted(&mut self, name: &str) {
        self.push_str("\\\"");
        push_json_escaped(&mut self.0, name);
        self.push_str("\\\"");
    }

    fn integer(&mut self, n: u64) {
        self.push_str(itoa::Buffer::new().format(n));
    }

    /// A constant string member.
    fn string(&mut self, key: &'static str, value: &'static str) {
        self.key(key);
        self.open();
        self.text(value);
        self.close();
    }

    fn number(&mut self, key: &'static str, value: u64) {
        self.key(key);
        self.integer(value);
    }

    fn strings<'a>(&mut self, key: &'static str, values: impl Iterator<Item = &'a str>) {
        self.key(key);
        self.0.push_byte(b'[');
        for (i, v) in values.enumerate() {
            if i > 0 {
                self.0.push_byte(b',');
            }
            self.open();
            push_json_escaped(&mut self.0, v);
            self.close();
        }
        self.0.push_byte(b']');
    }

    /// The document, copied once at its exact size.
    fn finish(mut self) -> Bytes {
        self.0.push_byte(b'}');
        Bytes::copy_from_slice(self.0.as_bytes())
    }
}

/// Appends `s` escaped for a JSON string (RFC 8259: quote, backslash and control
/// characters).
fn push_json_escaped(out: &mut Text, s: &str) {
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push(s.as_bytes());
        return;
    }
    for c in s.chars() {
        match c {
            '"' => out.push(b"\\\""),
            '\\' => out.push(b"\\\\"),
            c if (c as u32) < 0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push(b"\\u00");
                out.push_byte(HEX[(c as usize >> 4) & 0xf]);
                out.push_byte(HEX[c as usize & 0xf]);
            }
            c => out.push(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
}

impl<B: From<Bytes>> OnRejection<B> for DefaultOnRejection {
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<B> {
        let body = self.write_problem(rejection);
        let mut response = Response::new(B::from(body));
        *response.status_mut() = rejection.status();
        // Room for what the layer adds: the rate-limit fields, Retry-After, Cache-Control.
        *response.headers_mut() = http::HeaderMap::with_capacity(6);
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }

    fn on_grpc_rejection(&self, rejection: &Rejection<'_>) -> Response<B> {
        let mut response = Response::new(B::from(Bytes::new()));
        *response.status_mut() = rejection.status();
        *response.headers_mut() = http::HeaderMap::with_capacity(8);
        response
    }
}

impl fmt::Display for Rejection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Limited { decision, .. } => {
                f.write_str("rate limit")?;
                for (i, l) in decision.violated().enumerate() {
                    write!(f, "{}{:?}", if i == 0 { " " } else { ", " }, l.name())?;
                }
                f.write_str(" exceeded")
            }
            Rejection::Unavailable { .. } => f.write_str("rate limit store unavailable"),
            Rejection::MissingKey {
                limit,
                needs: Some(needs),
                ..
            } => write!(f, "no key for limit {limit:?}: the request lacks {needs}"),
            Rejection::MissingKey { limit, .. } => write!(f, "no key for limit {limit:?}"),
            Rejection::Blocked { .. } => f.write_str("client on the deny list"),
            Rejection::Banned { limit, .. } => write!(f, "key banned by limit {limit:?}"),
            Rejection::Misconfigured { limit, reason } if *limit == LISTS => {
                write!(f, "allow and deny lists: {reason}")
            }
            Rejection::Misconfigured { limit, reason } => write!(f, "limit {limit:?}: {reason}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::gcra::Admission;
    use crate::algo::quota::Quota;
    use crate::model::decision::{LimitDecision, Outcome, Status};
    use crate::model::policy::Mode;

    fn denied(name: &'static str, verdict: Admission) -> Decision {
        Decision {
            limits: smallvec::smallvec![LimitDecision {
                name,
                quota: Quota::per_minute(10),
                cost: 12,
                mode: Mode::Enforce,
                status: Status::Checked(Outcome::new(
                    verdict,
                    60_000_000,
                    crate::algo::gcra::Params::new(6_000_000, 10),
                    1_000
                )),
            }],
        }
    }

    fn limited(d: &Decision, wait: Option<Duration>) -> Rejection<'_> {
        Rejection::Limited {
            decision: d,
            retry_after: wait,
        }
    }

    #[test]
    fn the_429_problem_has_the_generic_shape() {
        let d = denied(
            "default",
            Admission::Denied {
                retry_after: 2_500_000,
            },
        );
        let body =
            DefaultOnRejection::new().problem(&limited(&d, Some(Duration::from_millis(2_500))));
        assert_eq!(
            body,
            r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Rate limit \"default\" exceeded; retry in 3 s.","violated-policies":["default"]}"#
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], 429);
    }

    #[test]
    fn a_refusal_body_comes_from_the_memo_only_for_its_own_limit_wait_and_types() {
        // Each body, asked for twice in a row on one thread (the second a memo hit),
        // must read as one rendered afresh: a hit never answers for another limit,
        // another number of seconds, or the other problem types.
        let blank = DefaultOnRejection::new();
        let ietf = DefaultOnRejection::ietf_problem_types();
        let secs = |s: u64| Admission::Denied {
            retry_after: s * 1_000_000,
        };
        let cases = [
            (
                blank,
                denied("memo-a", secs(1)),
                Some(Duration::from_millis(900)),
            ),
            (
                blank,
                denied("memo-a", secs(3)),
                Some(Duration::from_millis(2_100)),
            ),
            (
                ietf,
                denied("memo-a", secs(3)),
                Some(Duration::from_millis(2_100)),
            ),
            (
                blank,
                denied("memo-b", secs(3)),
                Some(Duration::from_millis(2_100)),
            ),
            (blank, denied("memo-b", secs(3)), None),
        ];
        let mut seen = Vec::new();
        for (on, d, wait) in &cases {
            let rejection = limited(d, *wait);
            let fresh = String::from_utf8(on.render_problem(&rejection).to_vec()).unwrap();
            assert_eq!(on.problem(&rejection), fresh);
            assert_eq!(on.problem(&rejection), fresh, "a memo hit");
            seen.push(fresh);
        }
        assert!(
            seen[0].contains(r#"\"memo-a\" exceeded; retry in 1 s."#),
            "{}",
            seen[0]
        );
        assert!(seen[1].contains("retry in 3 s."), "{}", seen[1]);
        assert!(seen[2].contains("quota-exceeded"), "{}", seen[2]);
        assert!(seen[3].contains(r#"\"memo-b\""#), "{}", seen[3]);
        assert!(seen[4].contains(r#"\"memo-b\" exceeded.""#), "{}", seen[4]);
        // All different: each case's key is its own.
        for (i, a) in seen.iter().enumerate() {
            for b in &seen[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn the_head_of_a_429_is_the_one_every_problem_has() {
        let d = denied("default", Admission::Denied { retry_after: 1 });
        for on in [
            DefaultOnRejection::new(),
            DefaultOnRejection::ietf_problem_types(),
        ] {
            let mut doc = Problem::new();
            on.head(&mut doc, &limited(&d, None));
            doc.key("detail");
            doc.open();
            assert_eq!(
                doc.0.as_bytes(),
                limited_head(on.ietf_types).as_bytes(),
                "ietf types: {}",
                on.ietf_types
            );
        }
    }

    #[test]
    fn the_draft_problem_types_on_request() {
        let d = denied(
            "default",
            Admission::Denied {
                retry_after: 1_000_000,
            },
        );
        let body = DefaultOnRejection::ietf_problem_types()
            .problem(&limited(&d, Some(Duration::from_secs(1))));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["type"],
            "https://iana.org/assignments/http-problem-types#quota-exceeded"
        );
        assert_eq!(v["title"], "Quota Exceeded");
        assert_eq!(v["violated-policies"], serde_json::json!(["default"]));
    }

    #[test]
    fn names_are_escaped_and_never_costs_are_explained() {
        let name = r#"odd "name" \ here"#;
        let d = denied(name, Admission::Never);
        let body = DefaultOnRejection::new().problem(&limited(&d, None));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["violated-policies"][0], name);
        let detail = v["detail"].as_str().unwrap();
        assert!(
            detail.contains("costing 12 exceeds the capacity (10)"),
            "{detail}"
        );
        assert!(detail.contains("never be satisfied"));
    }

    #[test]
    fn a_missing_key_names_what_the_client_must_send() {
        let detail = |needs| {
            let body = DefaultOnRejection::new().problem(&Rejection::MissingKey {
                limit: "per-key",
                status: StatusCode::UNAUTHORIZED,
                needs,
                challenge: Some("ApiKey"),
            });
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            v["detail"].as_str().unwrap().to_owned()
        };
        assert_eq!(
            detail(Some("the `x-api-key` header")),
            r#"This endpoint needs the `x-api-key` header (rate limit "per-key" counts requests by it)."#
        );
        assert_eq!(
            detail(None),
            r#"This endpoint counts requests by a key (rate limit "per-key") that the request does not carry, such as a credential."#
        );
    }

    #[test]
    fn a_misconfiguration_names_the_fix_in_the_body() {
        let body = DefaultOnRejection::new().problem(&Rejection::Misconfigured {
            limit: "per-ip",
            reason: "no peer address on the request: serve the app \"so\"",
        });
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["detail"],
            r#"tollgate cannot apply limit "per-ip": no peer address on the request: serve the app "so""#
        );
        let body = DefaultOnRejection::new().problem(&Rejection::Misconfigured {
            limit: LISTS,
            reason: "why",
        });
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["detail"],
            "tollgate cannot apply its allow and deny lists: why"
        );
    }

    #[test]
    fn every_rejection_is_valid_json_with_its_status() {
        let d = denied(
            "x",
            Admission::Denied {
                retry_after: 1_000_000,
            },
        );
        let cases = [
            limited(&d, Some(Duration::from_secs(1))),
            Rejection::Unavailable {
                decision: &d,
                retry_after: Duration::from_secs(1),
            },
            Rejection::MissingKey {
                limit: "k\"ey",
                status: StatusCode::UNAUTHORIZED,
                needs: None,
                challenge: None,
            },
            Rejection::MissingKey {
                limit: "k",
                status: StatusCode::BAD_REQUEST,
                needs: Some("the `x-\"odd\"` header"),
                challenge: None,
            },
            Rejection::Misconfigured {
                limit: "k",
                reason: "why",
            },
        ];
        for r in cases {
            let v: serde_json::Value =
                serde_json::from_str(&DefaultOnRejection::new().problem(&r)).unwrap();
            assert_eq!(v["status"], r.status().as_u16());
            assert_eq!(v["title"], r.status().canonical_reason().unwrap());
        }
    }
}
