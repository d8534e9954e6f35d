//! [`Decision`]: what the limiter decided for one request, limit by limit.

use std::fmt;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algo::gcra;
use crate::algo::quota::Quota;
use crate::algo::window;
use crate::model::policy::Mode;

/// The state of one limit's bucket as one check left it, in the units clients are told.
///
/// It keeps the time until the bucket is full and the bucket's geometry; the whole tokens
/// left and the time to the next token are derived from them when asked for (they take a
/// division, which the allowed path of a store need not pay).
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    verdict: Code,
    retry_after_ns: u64,
    reset_after_ns: u64,
    /// GCRA: the emission interval, in nanoseconds. Window algorithms: the time to the
    /// next unit in nanoseconds, or `u64::MAX` for none.
    t_ns: u64,
    /// GCRA: the bucket's capacity. Window algorithms: the units left. A sliding
    /// window reported lazily: `limit << 32 | cur << 16 | prev`.
    burst: u64,
    kind: Kind,
    /// A denial by a shared ban (see [`Outcome::banned_for`]): `retry_after_ns` is the
    /// time the ban has left.
    banned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bucket,
    Window,
    /// An allowed sliding-window check whose units left and time to the next unit are
    /// derived when asked for (two divisions the store's allowed path need not pay):
    /// `t_ns` holds the window and `retry_after_ns` the time into it, in µs.
    Sliding,
}

/// Two outcomes are equal when they say the same: verdict, wait, time to full, units
/// left and time to the next unit (however each is stored).
impl PartialEq for Outcome {
    fn eq(&self, other: &Self) -> bool {
        self.verdict() == other.verdict()
            && self.reset_after_ns == other.reset_after_ns
            && self.report() == other.report()
            && self.wait() == other.wait()
    }
}

impl Eq for Outcome {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    Allowed,
    Denied,
    Never,
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
    /// The outcome of the pure algorithm ([`gcra`]), whose unit of time is `unit_ns`
    /// nanoseconds, for a bucket whose TAT after the request is `reset_after` units from
    /// now: what a [`Store`](crate::store::Store) answers for one item.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{gcra::{self, Params}, Outcome};
    ///
    /// // T = 100 ms, burst 10, in microseconds: a full bucket, one request of cost 1.
    /// let params = Params::new(100_000, 10);
    /// let d = gcra::check(params, 0, 5_000_000, 1);
    /// let o = Outcome::new(d.verdict, d.reset_after, params, 1_000);
    /// assert!(o.is_allowed());
    /// assert_eq!(o.remaining(), 9);
    /// assert_eq!(o.reset_after(), Duration::from_millis(100));
    /// ```
    #[inline]
    pub fn new(
        verdict: gcra::Admission,
        reset_after: u64,
        params: gcra::Params,
        unit_ns: u64,
    ) -> Self {
        let ns = |x: u64| x.saturating_mul(unit_ns);
        let (verdict, retry_after_ns) = match verdict {
            // Allowed beyond the bucket's depth: a reservation, which waits for the rest.
            gcra::Admission::Allowed => {
                (Code::Allowed, ns(reset_after.saturating_sub(params.tau())))
            }
            gcra::Admission::Denied { retry_after } => (Code::Denied, ns(retry_after)),
            gcra::Admission::Never => (Code::Never, 0),
        };
        Outcome {
            verdict,
            retry_after_ns,
            reset_after_ns: ns(reset_after),
            t_ns: ns(params.t()),
            burst: params.burst(),
            kind: Kind::Bucket,
            banned: false,
        }
    }

    /// The outcome of a window algorithm ([`window`](crate::algo::window)), whose unit of time
    /// is `unit_ns` nanoseconds: what a store answers for an item of a window limit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{window::{self, Geometry}, Outcome};
    ///
    /// // 10 per second, in microseconds: 9 used, 250 ms before the window ends.
    /// let (r, _) = window::fixed_check(Geometry::new(10, 1_000_000, 0), 9, 250_000, 1);
    /// let o = Outcome::window(r, 1_000);
    /// assert!(o.is_allowed());
    /// assert_eq!(o.remaining(), 0);
    /// assert_eq!(o.next_after(), Some(Duration::from_millis(250)));
    /// ```
    #[inline(always)]
    pub fn window(report: window::Report, unit_ns: u64) -> Self {
        let ns = |x: u64| x.saturating_mul(unit_ns);
        let (verdict, retry_after_ns) = match report.verdict {
            gcra::Admission::Allowed => (Code::Allowed, ns(report.wait)),
            gcra::Admission::Denied { retry_after } => (Code::Denied, ns(retry_after)),
            gcra::Admission::Never => (Code::Never, 0),
        };
        Outcome {
            verdict,
            retry_after_ns,
            reset_after_ns: ns(report.reset_after),
            t_ns: report
                .next_after
                .map_or(u64::MAX, |n| ns(n).min(u64::MAX - 1)),
            burst: report.remaining,
            kind: Kind::Window,
            banned: false,
        }
    }

    /// An allowed sliding-window check in µs, reported lazily (see [`Kind::Sliding`]):
    /// `cur` and `prev` at most 65,535, `limit` too.
    #[inline(always)]
    pub(crate) fn sliding_allowed(g: window::Geometry, cur: u64, prev: u64, e: u64) -> Self {
        let reset_after = if cur > 0 {
            2 * g.len - e
        } else if prev > 0 {
            g.len - e
        } else {
            0
        };
        Outcome {
            verdict: Code::Allowed,
            retry_after_ns: e,
            reset_after_ns: reset_after.saturating_mul(1_000),
            t_ns: g.len,
            burst: g.limit << 32 | cur << 16 | prev,
            kind: Kind::Sliding,
            banned: false,
        }
    }

    /// This allowed reservation as a refusal: not now, the same request passes after
    /// its wait (delay mode when every waiter's place is taken).
    pub(crate) fn refused_after_wait(self) -> Self {
        Outcome {
            verdict: Code::Denied,
            ..self
        }
    }

    /// This denial as a shared ban's: the key is banned for `remaining` in a store that
    /// shares bans (another instance banned it, and the ban blocks its bucket), so the
    /// request is refused as banned, with the ban's time rather than the bucket's.
    #[cfg(any(test, feature = "redis"))]
    pub(crate) fn banned_for(self, remaining: Duration) -> Self {
        Outcome {
            verdict: Code::Denied,
            retry_after_ns: u64::try_from(remaining.as_nanos()).unwrap_or(u64::MAX),
            banned: true,
            ..self
        }
    }

    /// The time a shared ban has left, if this denial is one ([`Outcome::banned_for`]).
    #[inline]
    pub(crate) fn ban(&self) -> Option<Duration> {
        self.banned
            .then(|| Duration::from_nanos(self.retry_after_ns))
    }

    /// How long a request that passed waits before it may proceed: zero for a check,
    /// the time until its tokens are there for a reservation
    /// ([`Limiter::reserve`](crate::Limiter::reserve), delay mode). Also non-zero for a
    /// look (cost 0) at a bucket in debt: the time until the debt is paid.
    pub fn wait(&self) -> Duration {
        match (self.verdict, self.kind) {
            (Code::Allowed, Kind::Bucket | Kind::Window) => {
                Duration::from_nanos(self.retry_after_ns)
            }
            _ => Duration::ZERO,
        }
    }

    /// Whether the limit lets the request pass.
    pub fn verdict(&self) -> Verdict {
        match self.verdict {
            Code::Allowed => Verdict::Allowed,
            Code::Denied => Verdict::Denied {
                retry_after: Duration::from_nanos(self.retry_after_ns),
            },
            Code::Never => Verdict::Never,
        }
    }

    /// `true` if the limit lets the request pass.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.verdict == Code::Allowed
    }

    /// `true` if the request costs more than the bucket holds.
    pub fn is_never(&self) -> bool {
        self.verdict == Code::Never
    }

    /// Whole tokens left (after this request, if it passed and consumed).
    pub fn remaining(&self) -> u64 {
        self.report().0
    }

    /// Time until the bucket is full again.
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }

    /// Time until one more token is available; `None` while the bucket is full.
    pub fn next_after(&self) -> Option<Duration> {
        self.report().1.map(Duration::from_nanos)
    }

    /// How long until the request would pass, if this limit denied it and a wait helps.
    pub fn retry_after(&self) -> Option<Duration> {
        (self.verdict == Code::Denied).then(|| Duration::from_nanos(self.retry_after_ns))
    }

    /// [`remaining`](Self::remaining) and [`next_after`](Self::next_after), computed
    /// once.
    pub(crate) fn left(&self) -> (u64, Option<Duration>) {
        let (remaining, next) = self.report();
        (remaining, next.map(Duration::from_nanos))
    }

    /// Tokens left and nanoseconds to the next token, by the same formula as
    /// [`gcra::Decided::report`].
    fn report(&self) -> (u64, Option<u64>) {
        match self.kind {
            Kind::Window => return (self.burst, (self.t_ns != u64::MAX).then_some(self.t_ns)),
            Kind::Sliding => {
                let b = self.burst;
                let g = window::Geometry::new(b >> 32, self.t_ns, 0);
                let r =
                    window::sliding_report(g, (b >> 16) & 0xffff, b & 0xffff, self.retry_after_ns);
                return (r.remaining, r.next_after.map(|n| n.saturating_mul(1_000)));
            }
            Kind::Bucket => {}
        }
        gcra::Params::new(self.t_ns, self.burst).left(self.reset_after_ns)
    }
}

/// How one limit's check went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// The store answered.
    Checked(Outcome),
    /// The store failed and the limit's [`FailurePolicy::Share`](crate::FailurePolicy) or
    /// [`FailurePolicy::Fallback`](crate::FailurePolicy) answered from this instance's
    /// local limiter.
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
    pub(crate) name: &'static str,
    pub(crate) quota: Quota,
    pub(crate) cost: u32,
    pub(crate) mode: Mode,
    pub(crate) status: Status,
}

impl LimitDecision {
    /// The limit's name, as in the `RateLimit` headers.
    pub fn name(&self) -> &str {
        self.name
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
        self.outcome().map(Outcome::remaining)
    }

    /// How long until this request would pass under this limit, if it denied it and a
    /// wait can help.
    pub fn retry_after(&self) -> Option<Duration> {
        self.outcome()?.retry_after()
    }

    /// This limit's allowed reservation as a refusal, with its wait as the time to retry
    /// (a stream that found every waiter's place taken).
    pub(crate) fn refused_after_wait(mut self) -> Self {
        if let Status::Checked(o) | Status::Fallback(o) = &mut self.status
            && o.is_allowed()
        {
            *o = o.refused_after_wait();
        }
        self
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
/// `decision: Decision`, or `Extension<Decision>`), and builds the response headers from it.
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
    pub(crate) limits: SmallVec<[LimitDecision; 2]>,
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
        self.limits.iter().find(|l| l.name == name)
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
            .any(|l| l.outcome().is_some_and(Outcome::is_never))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared ban's denial (issue 45): the ban's time, not the bucket's, and said so.
    #[test]
    fn a_denial_as_a_bans_tells_the_bans_time() {
        let params = gcra::Params::new(30_000_000, 2); // 2/min in µs
        let bucket = Outcome::new(
            gcra::Admission::Denied {
                retry_after: 30_000_000,
            },
            60_000_000,
            params,
            1_000,
        );
        assert_eq!(bucket.ban(), None);
        let banned = bucket.banned_for(Duration::from_secs(10));
        assert_eq!(banned.ban(), Some(Duration::from_secs(10)));
        assert_eq!(banned.retry_after(), Some(Duration::from_secs(10)));
        assert!(!banned.is_allowed());
        assert_eq!(banned.reset_after(), bucket.reset_after());
    }
}
