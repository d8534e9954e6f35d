//! [`Lease`]: how an instance spends a limit kept in a remote store without a call per
//! request.

use std::time::Duration;

use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::base::error::ConfigError;

/// How long a lease's tokens may wait to be spent, unless told otherwise.
pub(crate) const DEFAULT_LEASE_AGE: Duration = Duration::from_secs(1);

/// Lease mode: an instance takes a batch of tokens from the shared bucket in one call,
/// and spends them locally, with no call per request.
///
/// Only a limit kept in a remote store (a [`Resilient`](crate::store::Resilient) store,
/// such as `RedisStore`) leases; in a memory store every decision is local already.
///
/// - **Taking**: when a key has no leased tokens left, the request is checked in the store
///   as usual (or, when a lease for the key is already on its way and the request has no
///   other limit, waits for it: no longer than its own call would take), and a lease is
///   taken in the background: as many tokens as this instance
///   spends on the key in about 100 ms, at most [`tokens`](Self::tokens) (with
///   [`auto`](Self::auto): an eighth of the burst), and no more than the shared bucket
///   can give. A request costing more than a lease can hold (more than `L`, or more than
///   `L` less the tokens held) is checked in the store, as without a lease: an instance
///   never holds more than `L`, whatever the cost.
/// - **Near exhaustion** (the bucket had less than a lease): a GCRA lease becomes a
///   reservation of the tokens the bucket will give within [`max_age`](Self::max_age).
///   This instance spends them as they come due, one per emission interval, and refuses
///   the key locally until each is. The instances queue in the bucket rather than race for
///   each refill, so no tokens wait in the bucket while they wait for a batch, and a call
///   brings a whole lease. A fixed window's units cannot be reserved (they would count in
///   a later window): its instances take what is left, then refuse the key locally until
///   the next window. While leasing instances queue, a check of the same key without a
///   lease (in another deployment) finds the bucket spent, as it would behind
///   reservations. Near exhaustion ends when an answer of the store shows the bucket has
///   a batch again (a lease's, or a request's it decided), or after the time the bucket
///   takes to fill (a fixed window: when the window ends).
/// - **Spending**: a request whose leased limits all have their tokens here is decided
///   without a call; with other limits beside, only those are asked, all or nothing.
/// - **Giving back**: tokens not spent after [`max_age`](Self::max_age) go back to the
///   shared bucket (never beyond a full bucket), as do those of a layer that is dropped,
///   at the quota they were taken at. A fixed window's units never go back: a give-back
///   counts in whatever window it lands in, so they expire with their window instead.
///
/// # The bound
///
/// Every token spent was taken from the shared bucket first, which counts exactly: what
/// leasing adds is that tokens taken before an interval can be spent in it. Over any
/// interval of length `d`, the grants of a GCRA limit whose instances lease are at most
/// `burst + d/T + N·L`, where `N` is the number of instances that lease the key and `L`
/// the most tokens one may hold (the exact limiter's bound is `burst + d/T`). A fixed
/// window's leased units are counted in the window they were taken in and spent only
/// before it ends, so its bound stays exactly `L` per window. Tokens held by an instance
/// that stops receiving requests for a key are unavailable to the others for at most
/// `max_age` (or until the window ends).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Lease, Limit, Quota};
///
/// // A global limit shared by every instance, with a call to the store about once per
/// // 100 tokens spent on an instance.
/// let global = Limit::new("global", Quota::per_second(1_000).burst(2_000))
///     .lease(Lease::tokens(100).max_age(Duration::from_millis(500)));
/// # let _ = global;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    tokens: Option<u32>,
    max_age: Duration,
}

impl Lease {
    /// Leases sized by the instance's own rate on the key, at most an eighth of the burst
    /// (of the window's limit for a fixed window), spent within 1 s.
    pub const fn auto() -> Self {
        Self {
            tokens: None,
            max_age: DEFAULT_LEASE_AGE,
        }
    }

    /// Leases of at most `tokens`, spent within 1 s: `N × tokens` is the most the
    /// instances can grant beyond the exact limiter (see [the bound](Self#the-bound)).
    pub const fn tokens(tokens: u32) -> Self {
        Self {
            tokens: Some(tokens),
            max_age: DEFAULT_LEASE_AGE,
        }
    }

    /// How long leased tokens may wait to be spent before they go back (default 1 s).
    pub const fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// The most tokens a lease holds, if set ([`auto`](Self::auto): `None`).
    pub const fn max_tokens(&self) -> Option<u32> {
        self.tokens
    }

    /// How long leased tokens may wait to be spent.
    pub const fn age(&self) -> Duration {
        self.max_age
    }

    /// The most tokens one instance holds for a key of a limit with `quota`.
    pub(crate) fn cap(&self, quota: &Quota) -> u64 {
        let depth = quota.burst_size();
        match self.tokens {
            Some(tokens) => u64::from(tokens).min(depth),
            None => (depth / 8).clamp(1, u64::from(u32::MAX)),
        }
    }

    /// Checks the lease against the limit's algorithm and quota.
    pub(crate) fn validate(&self, algorithm: Algorithm, quota: &Quota) -> Result<(), ConfigError> {
        if algorithm.is_calendar() {
            return Err(ConfigError::new(
                "lease",
                "a calendar limit cannot lease: a lease taken near a boundary would spend units of one period in the next; use gcra or fixed_window",
            ));
        }
        if matches!(algorithm, Algorithm::SlidingWindow | Algorithm::SlidingLog) {
            return Err(ConfigError::new(
                "lease",
                "a sliding window or sliding log cannot lease: it counts each unit at the instant it is spent, which a lease taken earlier cannot know; use gcra or fixed_window",
            ));
        }
        if self.max_age.is_zero() {
            return Err(ConfigError::new("lease.max_age", "must be more than zero"));
        }
        match self.tokens {
            Some(0) => Err(ConfigError::new("lease.tokens", "must be at least 1")),
            Some(tokens) if u64::from(tokens) > quota.burst_size() => Err(ConfigError::new(
                "lease.tokens",
                format!(
                    "{tokens} is larger than the burst ({}): a lease is taken from the bucket whole",
                    quota.burst_size()
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl Default for Lease {
    fn default() -> Self {
        Self::auto()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_leases_an_eighth_of_the_burst_and_explicit_ones_what_they_say() {
        let q = Quota::per_second(100).burst(800);
        assert_eq!(Lease::auto().cap(&q), 100);
        assert_eq!(Lease::auto().cap(&Quota::per_second(3)), 1);
        assert_eq!(Lease::tokens(20).cap(&q), 20);
    }

    #[test]
    fn a_lease_the_limit_cannot_take_is_a_config_error_naming_the_field() {
        let q = Quota::per_second(10);
        let e = Lease::tokens(11).validate(Algorithm::Gcra, &q).unwrap_err();
        assert_eq!(e.field(), "lease.tokens");
        assert!(e.reason().contains("larger than the burst (10)"), "{e}");
        let e = Lease::auto()
            .validate(Algorithm::SlidingLog, &q)
            .unwrap_err();
        assert_eq!(e.field(), "lease");
        let e = Lease::tokens(0).validate(Algorithm::Gcra, &q).unwrap_err();
        assert_eq!(e.field(), "lease.tokens");
        let e = Lease::auto()
            .max_age(Duration::ZERO)
            .validate(Algorithm::Gcra, &q)
            .unwrap_err();
        assert_eq!(e.field(), "lease.max_age");
        assert!(
            Lease::tokens(10)
                .validate(Algorithm::fixed_window(), &q)
                .is_ok()
        );
    }
}
