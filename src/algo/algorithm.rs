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
/// | `Calendar` (feature `calendar`) | `L` per local hour, day, ISO week or month of a time zone | index + count | plans: "10,000 a month, reset on the 1st" |
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
    /// At most `L` per calendar window: the local hour, day, ISO week (from Monday) or
    /// month of `zone`, the unit taken from the quota (`Quota::per_hour`, `per_day`,
    /// `per_week`, [`Quota::per_month`]; `"…/h"`, `"…/d"`, `"…/week"`, `"…/month"`).
    /// Each window starts with the whole limit, whatever the previous one used (no debt
    /// carries over: a penalty uses up at most what is left of the current window), and
    /// its boundaries follow the zone's rules: a day of 23 or 25 hours is one day (see
    /// [`calendar`](crate::calendar)). A refusal waits for the next boundary, and the
    /// `RateLimit` field's `t` is the time to it. It cannot reserve (no delay mode, no
    /// `Limiter::reserve`), block by duration, or lease.
    ///
    /// ```
    /// use tollgate::calendar::Zone;
    /// use tollgate::{Algorithm, Limit, Quota};
    ///
    /// let monthly = Limit::new("monthly", Quota::per_month(10_000))
    ///     .algorithm(Algorithm::calendar(Zone::get("Europe/Berlin").unwrap()));
    /// # let _ = monthly;
    /// ```
    #[cfg(feature = "calendar")]
    Calendar {
        /// The zone whose local calendar the windows follow.
        zone: crate::algo::calendar::Zone,
    },
    /// At most `L` (the quota's rate) requests of a key in flight at once: a unit is taken
    /// when a request is admitted and given back ([`Op::Refund`](crate::store::Op)) when it
    /// ends — for the middleware, when its response body ends, fails or is dropped. Time
    /// gives nothing back. A refusal tells the client to retry after `retry_after`. Made
    /// by [`Limit::in_flight`](crate::Limit::in_flight) and
    /// [`LimitSpec::in_flight`](crate::LimitSpec::in_flight); the memory store keeps it.
    InFlight {
        /// The `Retry-After` of a refusal, in milliseconds (a unit frees when a request
        /// ends, which no clock predicts); see [`Algorithm::in_flight_retry_after`].
        /// (Milliseconds in 32 bits keep every `Algorithm` in 16 bytes, which each
        /// request's items copy.)
        retry_after_ms: u32,
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

    /// Calendar windows in `zone` ([`Algorithm::Calendar`]).
    #[cfg(feature = "calendar")]
    pub const fn calendar(zone: crate::algo::calendar::Zone) -> Self {
        Algorithm::Calendar { zone }
    }

    /// `true` for [`Algorithm::Calendar`].
    pub(crate) const fn is_calendar(&self) -> bool {
        #[cfg(feature = "calendar")]
        if let Algorithm::Calendar { .. } = self {
            return true;
        }
        false
    }

    /// `true` for the algorithms kept as a fixed window's `(index, used)`: fixed windows
    /// and calendar windows.
    #[inline(always)]
    pub(crate) const fn is_fixed(&self) -> bool {
        matches!(self, Algorithm::FixedWindow { .. }) || self.is_calendar()
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
            retry_after_ms: 1_000,
        }
    }

    /// An in-flight limit whose refusals say to retry after `retry_after` (to the
    /// millisecond, at most about 49 days).
    pub fn in_flight_retry_after(retry_after: Duration) -> Self {
        Algorithm::InFlight {
            retry_after_ms: u32::try_from(retry_after.as_millis()).unwrap_or(u32::MAX),
        }
    }

    /// An in-flight limit's `Retry-After`; `None` for the other algorithms.
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Algorithm::InFlight { retry_after_ms } => {
                Some(Duration::from_millis(*retry_after_ms as u64))
            }
            _ => None,
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
            // A calendar window's nominal length (a month: 31 days), the quota's period.
            _ => {
                let secs = quota.period_ns().div_ceil(1_000_000_000);
                if secs == 0 { 1 } else { secs }
            }
        }
    }

    /// Checks the quota of a limit using this algorithm; the error is `(field, reason)`.
    pub(crate) fn validate(&self, quota: &Quota) -> Result<(), (&'static str, String)> {
        if quota.is_per_month() && !self.is_calendar() {
            return Err((
                "quota",
                "a month has no fixed length: a quota per `month` takes the calendar algorithm (algorithm = \"calendar\")".into(),
            ));
        }
        let max = match self {
            Algorithm::Gcra => return Ok(()),
            #[cfg(feature = "calendar")]
            Algorithm::Calendar { .. } => {
                if crate::algo::calendar::period_of(quota).is_none() {
                    return Err((
                        "quota",
                        format!(
                            "a calendar limit counts per hour, day, week or month (`/h`, `/d`, `/week`, `/month`), not per {:?}",
                            quota.period()
                        ),
                    ));
                }
                FIXED_WINDOW_MAX_LIMIT
            }
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

/// The calendar zone and unit of a calendar limit as a [`calendar::tag`] (12 bits); 0 for
/// any other limit (and always without the `calendar` feature).
///
/// [`calendar::tag`]: crate::algo::calendar
#[inline(always)]
pub(crate) fn calendar_tag(algorithm: Algorithm, quota: &Quota) -> u16 {
    #[cfg(feature = "calendar")]
    if let Algorithm::Calendar { zone } = algorithm {
        return crate::algo::calendar::period_of(quota)
            .map_or(0, |p| crate::algo::calendar::tag(zone, p));
    }
    let _ = (algorithm, quota);
    0
}

/// The calendar window `(start, end)`, µs since the Unix epoch, holding `unix_us` for the
/// limit whose [`calendar_tag`] is `tag` (not 0).
pub(crate) fn calendar_window(tag: u16, unix_us: u64) -> (u64, u64) {
    #[cfg(feature = "calendar")]
    {
        let (zone, period) = crate::algo::calendar::from_tag(tag);
        let w = period.window(zone, unix_us);
        (w.start_us, w.end_us)
    }
    #[cfg(not(feature = "calendar"))]
    {
        let _ = tag;
        (unix_us, unix_us + 1)
    }
}

/// The longest window of the limit whose [`calendar_tag`] is `tag`, µs.
pub(crate) fn calendar_max_us(tag: u16) -> u64 {
    #[cfg(feature = "calendar")]
    {
        crate::algo::calendar::period_of_tag(tag).max_secs() * 1_000_000
    }
    #[cfg(not(feature = "calendar"))]
    {
        let _ = tag;
        1
    }
}

/// The calendar window `(start, end)`, µs since the Unix epoch, of a calendar limit at
/// `unix_us`; `None` for any other limit.
#[inline]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn calendar_span(
    algorithm: Algorithm,
    quota: &Quota,
    unix_us: u64,
) -> Option<(u64, u64)> {
    #[cfg(feature = "calendar")]
    if let Algorithm::Calendar { zone } = algorithm {
        let w = crate::algo::calendar::period_of(quota)?.window(zone, unix_us);
        return Some((w.start_us, w.end_us));
    }
    let _ = (algorithm, quota, unix_us);
    None
}
