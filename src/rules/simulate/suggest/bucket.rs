//! The two per-key measures of `suggest`, as pure functions over one key's request times
//! (nanoseconds, in order): its peak count in any window of a given length, and the
//! smallest GCRA burst that admits every request at a given rate. The streaming forms
//! ([`Peak`] counts with a trailing reader, [`MinBurst`]) hold a few words per key.

use crate::algo::quota::Quota;

/// The most requests in any interval `(t − len, t]` of `times` (sorted, nanoseconds).
/// Every interval of length `len`, half-open either way, holds at most this many.
///
/// ```
/// use tollgate::rules::suggest::peak;
///
/// let s = 1_000_000_000;
/// assert_eq!(peak(&[0, s / 2, s, 3 * s], s), 2); // (0, 1 s] holds two
/// assert_eq!(peak(&[], s), 0);
/// ```
pub fn peak(times: &[i64], len: i64) -> u64 {
    let mut peak = 0;
    let mut first = 0;
    for (i, &t) in times.iter().enumerate() {
        while times[first] <= t.saturating_sub(len) {
            first += 1;
        }
        peak = peak.max((i + 1 - first) as u64);
    }
    peak
}

/// The smallest burst with which a GCRA bucket of `rate` per `period`
/// ([`Quota`], as the memory and Redis stores run it) admits every request at `times`
/// (sorted, nanoseconds, cost 1): `max over i ≤ j of ⌈(j − i + 1) − (t_j − t_i) / T⌉`,
/// with `T` the quota's emission interval, in both stores' units (nanoseconds, and
/// microseconds with times truncated to them, as the Redis store counts). `None` if
/// `rate` per `period` is not a valid quota.
///
/// ```
/// use std::time::Duration;
/// use tollgate::rules::suggest::min_burst;
///
/// let s = 1_000_000_000;
/// let minute = Duration::from_secs(60);
/// // 3 at once, then one a second: 60/min (T = 1 s) needs a bucket of 3.
/// assert_eq!(min_burst(&[0, 0, 0, s, 2 * s], 60, minute), Some(3));
/// // 6/min (T = 10 s): the last two come too soon after the three.
/// assert_eq!(min_burst(&[0, 0, 0, s, 2 * s], 6, minute), Some(5));
/// ```
pub fn min_burst(times: &[i64], rate: u64, period: std::time::Duration) -> Option<u64> {
    let quota = Quota::new(rate, period).ok()?;
    let mut b = MinBurst::new();
    let t = Interval::of(&quota);
    for &at in times {
        b.push(at, t);
    }
    Some(b.burst(t))
}

/// A quota's emission interval in both stores' units.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Interval {
    ns: i64,
    us: i64,
}

impl Interval {
    pub(crate) fn of(quota: &Quota) -> Self {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        Self {
            ns: clamp(quota.t_ns()).max(1),
            us: clamp(quota.t_us()).max(1),
        }
    }
}

/// The streaming form of [`min_burst`]: a bucket that never refuses, and the most it
/// was ever over empty. GCRA admits a request at `t` iff `max(tat, t) + T − t ≤ B·T`,
/// so a key whose requests all pass has `tat` following
/// `tat ← max(tat, t) + T`, and needs `B ≥ (tat − t) / T` after each request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MinBurst {
    tat_ns: i64,
    need_ns: i64,
    tat_us: i64,
    need_us: i64,
}

impl MinBurst {
    pub(crate) const fn new() -> Self {
        Self {
            tat_ns: i64::MIN,
            need_ns: 0,
            tat_us: i64::MIN,
            need_us: 0,
        }
    }

    /// A request at `at` (nanoseconds; never earlier than the one before).
    #[inline]
    pub(crate) fn push(&mut self, at: i64, t: Interval) {
        self.tat_ns = self.tat_ns.max(at).saturating_add(t.ns);
        self.need_ns = self.need_ns.max(self.tat_ns.saturating_sub(at));
        let at = at.div_euclid(1_000);
        self.tat_us = self.tat_us.max(at).saturating_add(t.us);
        self.need_us = self.need_us.max(self.tat_us.saturating_sub(at));
    }

    /// The smallest burst that admitted every request pushed (0 for none).
    pub(crate) fn burst(&self, t: Interval) -> u64 {
        let b = |need: i64, t: i64| u64::try_from(need.max(0)).unwrap_or(0).div_ceil(t as u64);
        b(self.need_ns, t.ns).max(b(self.need_us, t.us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::gcra::{self, Params};
    use std::time::Duration;

    const S: i64 = 1_000_000_000;

    /// By brute force: the bucket of `burst` admits all of `times` (nanoseconds).
    fn admits(times: &[i64], quota: &Quota) -> bool {
        let p = Params::new(quota.t_ns(), quota.burst_size());
        let mut tat = 0;
        times.iter().all(|&t| {
            let now = (t + 100 * S) as u64;
            let r = gcra::check(p, tat, now, 1);
            tat = r.new_tat.unwrap_or(tat);
            r.verdict.is_allowed()
        })
    }

    #[test]
    fn peak_counts_half_open_windows() {
        assert_eq!(peak(&[0, S - 1, S, 2 * S - 1], S), 2);
        assert_eq!(peak(&[0, 1, S - 1, S], S), 3);
        assert_eq!(peak(&[5, 5, 5], 1), 3);
        assert_eq!(peak(&[0, S, 2 * S], S), 1);
    }

    #[test]
    fn min_burst_is_the_least_that_admits() {
        let times = [0, 0, 0, S, S, 2 * S, 60 * S, 60 * S, 61 * S];
        for rate in [1, 2, 5, 7, 60, 61, 600] {
            let b = min_burst(&times, rate, Duration::from_secs(60)).unwrap();
            let q = Quota::new(rate, Duration::from_secs(60)).unwrap();
            assert!(admits(&times, &q.burst(b)), "rate {rate} burst {b}");
            if b > 1 {
                assert!(!admits(&times, &q.burst(b - 1)), "rate {rate} burst {b}");
            }
        }
        assert_eq!(min_burst(&[], 1, Duration::from_secs(1)), Some(0));
        assert_eq!(min_burst(&[0], 0, Duration::from_secs(1)), None);
    }

    /// Rounding: 7/min has T = 8.571428572 s, so 7 at 0 s and 7 at 60 s need 8.
    #[test]
    fn rounded_interval_counts() {
        let mut times = vec![0; 7];
        times.extend([60 * S; 7]);
        assert_eq!(peak(&times, 60 * S), 7);
        assert_eq!(min_burst(&times, 7, Duration::from_secs(60)), Some(8));
    }

    proptest::proptest! {
        /// The streaming burst is the least that the real GCRA admits every request with.
        #[test]
        fn min_burst_matches_gcra(
            gaps in proptest::collection::vec(0i64..5_000, 1..40),
            rate in 1u64..50,
        ) {
            let times: Vec<i64> = gaps.iter().scan(0, |t, g| { *t += g * 1_000_000; Some(*t) }).collect();
            let period = Duration::from_secs(1);
            let b = min_burst(&times, rate, period).unwrap();
            let q = Quota::new(rate, period).unwrap();
            proptest::prop_assert!(admits(&times, &q.burst(b)));
            if b > 1 {
                proptest::prop_assert!(!admits(&times, &q.burst(b - 1)));
            }
        }
    }
}
