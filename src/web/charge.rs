//! [`Charge`]: which responses a limit counts (charging by outcome).
//!
//! The cost is taken before the inner service runs, like any check, so that parallel
//! attempts cannot all slip through; it is given back when the response does not count,
//! when the inner service fails, or when the response future is dropped before the
//! response exists (the client went away). A refund happens at most once: the request's
//! `ChargeGuard` (`guard.rs`) does it.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, StatusCode};

/// A predicate on a response: whether it counts.
type Counts = Arc<dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync>;

/// Which responses a limit counts (see [`Limit::charge`](crate::Limit::charge)).
///
/// ```
/// use http::StatusCode;
/// use tollgate::{key::PeerIp, Charge, Limit, Quota};
///
/// // Failed logins: 5 per 15 minutes per client (a bucket of 5, one back every 3
/// // minutes); successful ones do not count.
/// let failures = Limit::new("login-failures", Quota::per_hour(20).burst(5))
///     .key(PeerIp::new())
///     .charge(Charge::when(|status, _headers| status == StatusCode::UNAUTHORIZED));
/// # let _ = failures;
/// ```
#[derive(Clone, Default)]
pub struct Charge(Option<Counts>);

impl Charge {
    /// Every request that passes counts (the default).
    pub const fn always() -> Self {
        Self(None)
    }

    /// Only responses for which `counts(status, headers)` is true count; the others are
    /// given back their cost.
    pub fn when<F>(counts: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    {
        Self(Some(Arc::new(counts)))
    }

    /// Only error responses (status 400 and above) count: the failed-attempt pattern.
    pub fn errors() -> Self {
        Self::when(|status, _| status.as_u16() >= 400)
    }

    /// Whether some outcomes are given back.
    pub(crate) fn is_conditional(&self) -> bool {
        self.0.is_some()
    }

    /// Whether a response counts.
    pub(crate) fn counts(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        self.0.as_ref().is_none_or(|f| f(status, headers))
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Charge::When(..)"
        } else {
            "Charge::Always"
        })
    }
}
