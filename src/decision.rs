//! [`Decision`]: what the limiter decided for one request, limit by limit.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::gcra;
use crate::limit::Mode;
use crate::quota::Quota;

/// The state of one limit's bucket as one check left it, in the units clients are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub(crate) verdict: Verdict,
    pub(crate) remaining: u64,
    pub(crate) reset_after: Duration,
    pub(crate) next_after: Option<Duration>,
}

/// Whether one limit lets a request pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It passes.
    Allowed,
    /// Not now: the same request passes after `retry_after`.
    Denied {
        /// How long until this request would pass.
        retry_after: Duration,
    },
    /// The request costs more than the bucket holds; it can never pass.
    Never,
}

impl Outcome {
    /// Converts the pure algorithm's result, whose unit of time is `unit_ns` nanoseconds.
    pub(crate) fn from_gcra(o: &gcra::Outcome, unit_ns: u64) -> Self {
        let d = |x: u64| Duration::from_nanos(x.saturating_mul(unit_ns));
        Outcome {
            verdict: match o.verdict {
                gcra::Verdict::Allowed => Verdict::Allowed,
                gcra::Verdict::Denied { retry_after } => Verdict::Denied {
                    retry_after: d(retry_after),
                },
                gcra::Verdict::Never => Verdict::Never,
            },
            remaining: o.remaining,
            reset_after: d(o.reset_after),
            next_after: o.next_after.map(d),
        }
    }

    /// Whether the limit lets the request pass.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// `true` if the limit lets the request pass.
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allowed
    }

    /// Whole tokens left (after this request, if it passed and consumed).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the bucket is full again.
    pub fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// Time until one more token is available; `None` while the bucket is full.
    pub fn next_after(&self) -> Option<Duration> {
        self.next_after
    }
}

/// How one limit's check went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// The store answered.
    Checked(Outcome),
    /// The store failed and the limit's [`FailurePolicy::Fallback`](crate::FailurePolicy)
    /// answered from this instance's local limiter.
    Fallback(Outcome),
    /// The store failed and the limit's policy lets requests pass unchecked
    /// ([`FailurePolicy::Allow`](crate::FailurePolicy)).
    FailedOpen,
    /// The store failed and the limit's policy refuses requests
    /// ([`FailurePolicy::Deny`](crate::FailurePolicy)): a 503.
    FailedClosed,
    /// Not looked at: another limit refused the request first, from a denial remembered
    /// locally (the Redis store's deny cache). Nothing was consumed.
    Unchecked,
}

impl Status {
    /// The bucket's state, when some limiter answered.
    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Status::Checked(o) | Status::Fallback(o) => Some(o),
            Status::FailedOpen | Status::FailedClosed | Status::Unchecked => None,
        }
    }
}

/// One limit's part in a [`Decision`].
#[derive(Clone)]
pub struct LimitDecision {
    pub(crate) name: Arc<str>,
    pub(crate) quota: Quota,
    pub(crate) cost: u32,
    pub(crate) mode: Mode,
    pub(crate) status: Status,
}

impl LimitDecision {
    /// The limit's name, as in the `RateLimit` headers.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quota applied to this request (which may have been chosen per request).
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// What this request cost.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// Whether the limit enforces or only reports.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// How the check went.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// The bucket's state, when some limiter answered.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.status.outcome()
    }

    /// `true` unless this limit denied the request (a shadow limit's "would deny" counts
    /// as a denial here; see [`LimitDecision::mode`]).
    pub fn allowed(&self) -> bool {
        match &self.status {
            Status::Checked(o) | Status::Fallback(o) => o.is_allowed(),
            Status::FailedOpen | Status::Unchecked => true,
            Status::FailedClosed => false,
        }
    }

    /// Whole tokens left, if known.
    pub fn remaining(&self) -> Option<u64> {
        self.outcome().map(|o| o.remaining)
    }

    /// How long until this request would pass under this limit, if it denied it and a
    /// wait can help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.outcome()?.verdict {
            Verdict::Denied { retry_after } => Some(retry_after),
            _ => None,
        }
    }

    /// Whether this limit enforces and refused the request.
    pub(crate) fn denies(&self) -> bool {
        self.mode == Mode::Enforce && !self.allowed() && self.status != Status::FailedClosed
    }
}

impl fmt::Debug for LimitDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitDecision")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("cost", &self.cost)
            .field("mode", &self.mode)
            .field("status", &self.status)
            .finish()
    }
}

/// What the limiter decided for one request over all its limits.
///
/// The middleware puts it in the request's extensions, so handlers can read it (axum:
/// `Extension<Decision>`), and builds the response headers from it.
///
/// ```
/// use axum::{Extension, routing::get, Router};
/// use tollgate::Decision;
///
/// async fn handler(Extension(decision): Extension<Decision>) -> String {
///     let left = decision.limits().filter_map(|l| l.remaining()).min();
///     format!("you have {left:?} requests left")
/// }
/// # let _: Router = Router::new().route("/", get(handler));
/// ```
#[derive(Clone, Debug)]
pub struct Decision {
    pub(crate) limits: SmallVec<[LimitDecision; 4]>,
}

/// The overall result of a [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overall {
    /// Every enforcing limit let the request pass.
    Allowed,
    /// An enforcing limit refused it: a 429.
    Limited,
    /// No limit refused it, but a store failure under a
    /// [`FailurePolicy::Deny`](crate::FailurePolicy) limit does: a 503.
    Unavailable,
}

impl Decision {
    /// The decision over all limits: [`Overall::Limited`] if any enforcing limit denied,
    /// otherwise [`Overall::Unavailable`] if a failed store refuses, otherwise
    /// [`Overall::Allowed`].
    pub fn overall(&self) -> Overall {
        if self.limits.iter().any(LimitDecision::denies) {
            Overall::Limited
        } else if self
            .limits
            .iter()
            .any(|l| l.mode == Mode::Enforce && l.status == Status::FailedClosed)
        {
            Overall::Unavailable
        } else {
            Overall::Allowed
        }
    }

    /// `true` if the request passes.
    pub fn allowed(&self) -> bool {
        self.overall() == Overall::Allowed
    }

    /// Every limit that applied to the request, in configuration order.
    pub fn limits(&self) -> impl ExactSizeIterator<Item = &LimitDecision> {
        self.limits.iter()
    }

    /// The limit called `name`, if it applied to the request.
    pub fn limit(&self, name: &str) -> Option<&LimitDecision> {
        self.limits.iter().find(|l| &*l.name == name)
    }

    /// The enforcing limits that refused the request.
    pub fn violated(&self) -> impl Iterator<Item = &LimitDecision> {
        self.limits.iter().filter(|l| l.denies())
    }

    /// How long until the request would pass: the longest wait among the limits that
    /// refused it. `None` if it passed, or if some limit can never be satisfied.
    pub fn retry_after(&self) -> Option<Duration> {
        if self.never() {
            return None;
        }
        self.violated().filter_map(LimitDecision::retry_after).max()
    }

    /// `true` if an enforcing limit can never admit this request (its cost exceeds the
    /// bucket).
    pub fn never(&self) -> bool {
        self.violated()
            .any(|l| l.outcome().is_some_and(|o| o.verdict == Verdict::Never))
    }
}
