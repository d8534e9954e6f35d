//! Charging by outcome: a limit that counts only some responses.
//!
//! The cost is taken before the inner service runs, like any check, so that parallel
//! attempts cannot all slip through; it is given back when the response does not count,
//! when the inner service fails, or when the response future is dropped before the
//! response exists (the client went away). A refund happens at most once.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, StatusCode};

use crate::engine::{ChargeKeys, Plan};
use crate::layer::Shared;
use crate::store::Store;

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

/// The charges of a request to settle when its response comes, if any.
pub(crate) type PendingCharge<St, R> = Option<Box<ChargeGuard<St, R>>>;

/// The costs a passing request took from limits that charge by outcome, given back when
/// the outcome does not count — at most once: when the response is settled, or on drop.
pub(crate) struct ChargeGuard<St: Store, R> {
    shared: Arc<Shared<St, R>>,
    plan: Plan,
    /// Plan index and key of each limit still to settle.
    pending: ChargeKeys,
}

impl<St: Store, R> ChargeGuard<St, R> {
    /// A guard for the `charged` limits (plan indices) of a request, if any.
    pub(crate) fn new(
        shared: &Arc<Shared<St, R>>,
        plan: &Plan,
        keys: Option<Box<ChargeKeys>>,
        charged: &[usize],
    ) -> PendingCharge<St, R> {
        let keys = keys?;
        let pending: ChargeKeys = keys
            .into_iter()
            .filter(|(i, _)| charged.contains(i))
            .collect();
        (!pending.is_empty()).then(|| {
            Box::new(Self {
                shared: shared.clone(),
                plan: plan.clone(),
                pending,
            })
        })
    }

    /// The response exists: gives back the cost of each limit it does not count for.
    pub(crate) fn settle(mut self: Box<Self>, status: StatusCode, headers: &HeaderMap) {
        let engine = &self.shared.engine;
        let refunds: ChargeKeys = std::mem::take(&mut self.pending)
            .into_iter()
            .filter(|(i, _)| {
                !engine.bounds[self.plan[*i].bound]
                    .limit
                    .charge
                    .counts(status, headers)
            })
            .collect();
        if !refunds.is_empty() {
            engine.refund(&self.plan, &refunds);
        }
    }
}

impl<St: Store, R> Drop for ChargeGuard<St, R> {
    /// No response (the inner service failed, or the future was dropped): nothing counts.
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            self.shared.engine.refund(&self.plan, &pending);
        }
    }
}
