//! [`Algorithm`]: how a limit counts.

use std::time::Duration;

use crate::algo::quota::Quota;
use crate::algo::window::{
    FIXED_WINDOW_MAX_LIMIT, SLIDING_LOG_MAX_LIMIT, SLIDING_WINDOW_MAX_LIMIT,
};

/// How a limit counts. Set with [`Limit::algorithm`](crate::Limit::algorithm); the default
/// is [`Algorithm::Gcra`].
///
/// For the window algorithms the limit's [`Quota`] reads as "`rate` per `period`": `rate`
/// is the window's limit `L` and `period` its length `W` (`Quota::per_minute(100)` is 100
/// per one-minute window). A burst means nothing to a window (a [`ConfigError`] if set to
/// anything but the rate), and the period must be a whole number of microseconds (both
/// stores then decide alike).
///
/// | algorithm | admits over any interval of length `d` | state per key | pick it for |
/// |---|---|---|---|
/// | [`Gcra`](Self::Gcra) (default) | `burst + d / T` | one number | smooth rates; the cheapest and exact |
/// | [`FixedWindow`](Self::FixedWindow) | `L` per window; up to `2L` across an aligned boundary | index + count | "N per calendar minute/day" quotas, billing, third-party budgets |
/// | [`SlidingWindow`](Self::SlidingWindow) | `L × (1 + d / W)` (an approximation) | index + two counts | familiar window semantics without the boundary spike |
/// | [`SlidingLog`](Self::SlidingLog) | `L` in every interval of length `W` (exact) | one timestamp per unit, `L ≤ 1,000` | logins, payments: "never more than L in any W" |
///
/// Every algorithm is cost-aware (a request of cost `c` passes iff `used + c ≤ L`), a
/// refused request consumes nothing, and limits of different algorithms can be mixed in
/// one request, all or nothing, in every store.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Limit, Quota};
///
/// // 1,000 per calendar day, days starting at midnight UTC+2.
/// let daily = Limit::new("daily", Quota::per_day(1_000))
///     .algorithm(Algorithm::fixed_window_at(Duration::from_secs(22 * 3600)));
/// // 100 per minute, each key's minute starting at its own second.
/// let spread = Limit::new("spread", Quota::per_minute(100)).algorithm(Algorithm::fixed_window_random());
/// // Never more than 5 logins in any 15 minutes.
/// let logins = Limit::new("logins", Quota::new(5, Duration::from_secs(900)).unwrap())
///     .algorithm(Algorithm::SlidingLog);
/// # let _ = (daily, spread, logins);
/// ```
///
/// [`ConfigError`]: crate::ConfigError
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// The generic cell rate algorithm: a token bucket of `burst` tokens refilled at
    /// `rate / period`.
    #[default]
    Gcra,
    /// At most `L` per window of length `W`, windows starting at `phase`. Each window
    /// boundary gives `L` back, capped at a full window (so debt from
    /// [`Limiter::penalize`](crate::Limiter::penalize) carries forward). Aligned windows
    /// admit up to `2L` within moments around a boundary: `L` at the end of one window
    /// and `L` at the start of the next.
    FixedWindow {
        /// Where the windows start.
        phase: Phase,
    },
    /// The two-counter approximation of a sliding window (windows aligned to the epoch):
    /// the weighted use `prev × (W − e) / W + cur` (with `e` the time into the current
    /// window) plus the cost must stay within `L`. At most `L × (1 + d / W)` over any
    /// interval `d`; `L` at most [`SLIDING_WINDOW_MAX_LIMIT`].
    SlidingWindow,
    /// Exact: the instants of the units admitted in the last `W` are kept, and a request
    /// passes iff they plus its cost are at most `L`. `L` at most
    /// [`SLIDING_LOG_MAX_LIMIT`].
    SlidingLog,
    /// At most `L` (the quota's rate) requests of a key in flight at once: a unit is taken
    /// when a request is admitted and given back ([`Op::Refund`](crate::store::Op)) when it
    /// ends — for the middleware, when its response body ends, fails or is dropped. Time
    /// gives nothing back. A refusal tells the client to retry after `retry_after`. Made
    /// by [`Limit::in_flight`](crate::Limit::in_flight) and
    /// [`LimitSpec::in_flight`](crate::LimitSpec::in_flight); the memory store keeps it.
    InFlight {
        /// The `Retry-After` of a refusal (a slot frees when a request ends, which no
        /// clock predicts).
        retry_after: Duration,
    },
}

/// Where the windows of a [`Algorithm::FixedWindow`] start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Windows start at the Unix epoch plus `offset` (taken modulo the window): every key
    /// shares the boundaries (a calendar minute or day; a time zone's midnight with an
    /// offset).
    Aligned {
        /// From the epoch to the start of a window.
        offset: Duration,
    },
    /// Each key's windows start at its own offset, a hash of the limit's name and the key
    /// modulo the window: the same in every instance and after restarts, and spread
    /// over the window, so clients do not all come back at the same instant.
    Random,
}

impl Algorithm {
    /// Fixed windows aligned to the epoch (calendar seconds, minutes, hours, UTC days).
    pub const fn fixed_window() -> Self {
        Algorithm::FixedWindow {
            phase: Phase::Aligned {
                offset: Duration::ZERO,
            },
        }
    }

    /// Fixed windows starting `offset` after the epoch (modulo the window).
    pub const fn fixed_window_at(offset: Duration) -> Self {
        Algorithm::FixedWindow {
            phase: Phase::Aligned { offset },
        }
    }

    /// Fixed windows with a start of their own per key ([`Phase::Random`]).
    pub const fn fixed_window_random() -> Self {
        Algorithm::FixedWindow {
            phase: Phase::Random,
        }
    }

    /// `true` for the window algorithms (and in-flight limits, which the stores keep
    /// beside them).
    pub const fn is_window(&self) -> bool {
        !matches!(self, Algorithm::Gcra)
    }

    /// An in-flight limit ([`Algorithm::InFlight`]) whose refusals say to retry after one
    /// second.
    pub const fn in_flight() -> Self {
        Algorithm::InFlight {
            retry_after: Duration::from_secs(1),
        }
    }

    /// `true` for [`Algorithm::InFlight`].
    pub const fn is_in_flight(&self) -> bool {
        matches!(self, Algorithm::InFlight { .. })
    }

    /// The window advertised as `w` in the headers: for GCRA the refill time, for the
    /// window algorithms the window; in whole seconds, rounded up, at least 1.
    /// 0 for an in-flight limit, which has no window (its policy says
    /// `qu="concurrent-requests"` instead).
    pub(crate) const fn window_secs(&self, quota: &Quota) -> u64 {
        match self {
            Algorithm::Gcra => quota.window_secs(),
            Algorithm::InFlight { .. } => 0,
            _ => {
                let secs = quota.period_ns().div_ceil(1_000_000_000);
                if secs == 0 { 1 } else { secs }
            }
        }
    }

    /// Checks the quota of a limit using this algorithm; the error is `(field, reason)`.
    pub(crate) fn validate(&self, quota: &Quota) -> Result<(), (&'static str, String)> {
        let max = match self {
            Algorithm::Gcra => return Ok(()),
            Algorithm::FixedWindow { phase } => {
                if let Phase::Aligned { offset } = phase
                    && !offset.subsec_nanos().is_multiple_of(1_000)
                {
                    return Err((
                        "algorithm",
                        "the offset of a fixed window must be a whole number of microseconds"
                            .into(),
                    ));
                }
                FIXED_WINDOW_MAX_LIMIT
            }
            Algorithm::SlidingWindow => SLIDING_WINDOW_MAX_LIMIT,
            Algorithm::SlidingLog => SLIDING_LOG_MAX_LIMIT,
            Algorithm::InFlight { .. } => IN_FLIGHT_MAX,
        };
        if quota.burst_size() != quota.rate() {
            return Err((
                "quota",
                format!(
                    "a window limit admits `rate` per `period`; a burst ({}) other than the rate ({}) means nothing to it",
                    quota.burst_size(),
                    quota.rate()
                ),
            ));
        }
        if quota.rate() > max {
            return Err((
                "quota",
                format!(
                    "{:?} takes a limit of at most {max} per window, not {}",
                    self,
                    quota.rate()
                ),
            ));
        }
        if !quota.period_ns().is_multiple_of(1_000) {
            return Err((
                "quota",
                "the window must be a whole number of microseconds".into(),
            ));
        }
        // The Redis script computes up to `2 × L × W` (µs) in doubles: exact below 2^53.
        if *self == Algorithm::SlidingWindow
            && u128::from(quota.rate()) * u128::from(quota.period_ns() / 1_000) >= 1 << 52
        {
            return Err((
                "quota",
                "a sliding window's limit times its length in microseconds must stay below 2^52 (a shorter window or a smaller limit)".into(),
            ));
        }
        Ok(())
    }
}

/// The most requests an in-flight limit lets be in flight per key.
pub(crate) const IN_FLIGHT_MAX: u64 = 1_000_000;

/// A stable hash of a limit's name, computed once per table: the seed of its keys'
/// random phases.
pub(crate) fn name_hash(name: &str) -> u64 {
    use std::hash::Hasher;
    let mut h =
        siphasher::sip::SipHasher13::new_with_keys(0x746f_6c6c_6761_7465, 0x7068_6173_6500_0001);
    h.write(name.as_bytes());
    h.finish()
}

/// The phase, in microseconds, of a window of `len_us` for the key whose stable phase
/// hash (`Key::phase_hash`) is `key` in the limit whose [`name_hash`] is `name`: the configured offset of an aligned fixed window, or for a
/// [`Phase::Random`] one a mix of the name's and the key's stable hashes — the same in
/// every process and store (the memory store uses it in microseconds too, so both stores
/// place a key's windows alike). 0 for the sliding algorithms.
#[inline]
pub(crate) fn phase_us(algorithm: Algorithm, name: u64, key: u64, len_us: u64) -> u64 {
    let len_us = len_us.max(1);
    match algorithm {
        Algorithm::FixedWindow {
            phase: Phase::Aligned { offset },
        } => {
            if offset.is_zero() {
                return 0;
            }
            let us = offset
                .as_secs()
                .wrapping_mul(1_000_000)
                .wrapping_add(u64::from(offset.subsec_micros()));
            us % len_us
        }
        Algorithm::FixedWindow {
            phase: Phase::Random,
        } => {
            // splitmix64's finalizer over the two hashes.
            let mut x = name ^ key.rotate_left(32);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            // Into 0..len_us by a multiplication (no division on the request path).
            ((u128::from(x ^ (x >> 31)) * u128::from(len_us)) >> 64) as u64
        }
        _ => 0,
    }
}
