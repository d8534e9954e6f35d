//! How long a call to a backend may take, learned from the round trips observed: a
//! smoothed round trip and its variation (as TCP sizes its retransmission timeout,
//! RFC 6298), so a Redis 30 ms away is not taken for a failing one. The configured
//! timeout is the floor; the learned one never goes past [`CEILING`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The longest a learned timeout gets, however slow the round trips were.
const CEILING: Duration = Duration::from_secs(1);

/// The round trips of one store's calls.
#[derive(Debug, Default)]
pub(crate) struct RoundTrips {
    /// Smoothed round trip and its mean deviation, in nanoseconds (0: none seen yet).
    srtt: AtomicU64,
    rttvar: AtomicU64,
}

impl RoundTrips {
    /// Counts one answer that came `rtt_ns` after its call was sent.
    pub(crate) fn observe(&self, rtt_ns: u64) {
        // Racing updates may lose a sample; the estimate stays one of the recent ones.
        let srtt = self.srtt.load(Ordering::Relaxed);
        if srtt == 0 {
            self.srtt.store(rtt_ns.max(1), Ordering::Relaxed);
            self.rttvar.store(rtt_ns / 2, Ordering::Relaxed);
            return;
        }
        let var = self.rttvar.load(Ordering::Relaxed);
        let deviation = srtt.abs_diff(rtt_ns);
        self.rttvar
            .store(var - var / 4 + deviation / 4, Ordering::Relaxed);
        self.srtt
            .store((srtt - srtt / 8 + rtt_ns / 8).max(1), Ordering::Relaxed);
    }

    /// How long a call usually takes: the smoothed round trip (a call past it is slow,
    /// though not yet timed out); while nothing was seen, `floor`, or the round trip the
    /// backend measured on its own (`hint`) when that is longer; at most the timeout.
    pub(crate) fn usual(&self, floor: Duration, hint: Option<Duration>) -> Duration {
        let srtt = self.srtt.load(Ordering::Relaxed);
        let timeout = self.timeout(floor, hint);
        if srtt == 0 {
            return hint.map_or(floor, |h| h.max(floor)).min(timeout);
        }
        Duration::from_nanos(srtt).min(timeout)
    }

    /// How long the next call may take before the request follows its failure policy:
    /// `floor` (the configured timeout), or the smoothed round trip plus four deviations
    /// when that is longer, or three times `hint` (a round trip the backend measured on
    /// its own, e.g. Redis's probe: calls that all time out measure nothing), at most 1 s
    /// above the floor.
    pub(crate) fn timeout(&self, floor: Duration, hint: Option<Duration>) -> Duration {
        let srtt = self.srtt.load(Ordering::Relaxed);
        let var = self.rttvar.load(Ordering::Relaxed);
        let learned = Duration::from_nanos(srtt.saturating_add(var.saturating_mul(4)));
        let hinted = hint.unwrap_or_default().saturating_mul(3);
        floor.max(learned.max(hinted).min(CEILING))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_timeout_follows_the_round_trips_above_the_configured_floor() {
        let rtt = RoundTrips::default();
        let floor = Duration::from_millis(50);
        assert_eq!(rtt.timeout(floor, None), floor, "nothing seen: the floor");
        for _ in 0..50 {
            rtt.observe(MS);
        }
        assert_eq!(
            rtt.timeout(floor, None),
            floor,
            "fast round trips: the floor"
        );
        // A Redis 30 ms away each way.
        for i in 0..50 {
            rtt.observe(60 * MS + (i % 3) * MS);
        }
        let t = rtt.timeout(floor, None);
        assert!(
            t > Duration::from_millis(61) && t < Duration::from_millis(120),
            "{t:?}"
        );
        // Never past the ceiling.
        for _ in 0..50 {
            rtt.observe(5_000 * MS);
        }
        assert_eq!(rtt.timeout(floor, None), CEILING);
        // A round trip the backend measured itself (every call timed out): three of them.
        let fresh = RoundTrips::default();
        assert_eq!(
            fresh.timeout(floor, Some(Duration::from_millis(60))),
            Duration::from_millis(180)
        );
        assert_eq!(fresh.timeout(floor, Some(Duration::from_millis(5))), floor);
    }

    /// Before any answer, a call is usually as long as the floor, or as the round trip
    /// the backend measured on its own when that is longer (a far backend's first lease
    /// call is not thought late after the floor); then, the smoothed round trip.
    #[test]
    fn the_usual_round_trip_before_any_answer_is_the_backends_own_above_the_floor() {
        let rtt = RoundTrips::default();
        let floor = Duration::from_millis(50);
        assert_eq!(rtt.usual(floor, None), floor);
        assert_eq!(rtt.usual(floor, Some(Duration::from_millis(1))), floor);
        assert_eq!(
            rtt.usual(floor, Some(Duration::from_millis(200))),
            Duration::from_millis(200)
        );
        // Never past the timeout: at most 1 s.
        assert_eq!(
            rtt.usual(floor, Some(Duration::from_secs(5))),
            Duration::from_secs(1)
        );
        rtt.observe(20 * MS);
        assert_eq!(
            rtt.usual(floor, Some(Duration::from_millis(200))),
            Duration::from_millis(20)
        );
    }
}
