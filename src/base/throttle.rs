//! [`LogThrottle`]: at most one log line per interval for events that clients can repeat at
//! will (shadow refusals); [`LogOnce`]: one line ever, for misconfigurations that every
//! request hits until the application is fixed.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Lets one event through per interval and counts the others, so that the next line can
/// say how many were left out. Costs one atomic load per event while closed, plus one
/// relaxed add for the count.
#[derive(Debug, Default)]
pub(crate) struct LogThrottle {
    /// When the next line may be written: milliseconds since [`START`] + 1 (0: at once).
    next: AtomicU64,
    /// Events left out since the last line.
    suppressed: AtomicU64,
}

static START: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Milliseconds on the throttles' clock (+ 1, so that 0 can mean "not yet").
pub(crate) fn now_ms() -> u64 {
    START.elapsed().as_millis() as u64 + 1
}

impl LogThrottle {
    pub(crate) const fn new() -> Self {
        Self {
            next: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` if a line may be written now (`n` events were left out since the last
    /// one), `None` if this event is only counted.
    pub(crate) fn permit(&self, every: Duration) -> Option<u64> {
        self.permit_at(now_ms(), every.as_millis() as u64)
    }

    fn permit_at(&self, now_ms: u64, every_ms: u64) -> Option<u64> {
        let next = self.next.load(Ordering::Relaxed);
        if now_ms >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now_ms + every_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// Lets the first event through and no other: a misconfiguration says all there is to say
/// in its first line, and the response of each request it hits says it again. One flag,
/// held by what is misconfigured (a layer's limit, its lists): one line per layer, and per
/// version of reloaded rules.
#[derive(Debug, Default)]
pub(crate) struct LogOnce(AtomicBool);

impl LogOnce {
    pub(crate) const fn new() -> Self {
        Self(AtomicBool::new(false))
    }

    /// Whether this is the first event (a load, and a swap only until the first).
    pub(crate) fn first(&self) -> bool {
        !self.0.load(Ordering::Relaxed) && !self.0.swap(true, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_means_once_across_threads() {
        let once = LogOnce::new();
        let firsts: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1_000).filter(|_| once.first()).count()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(firsts, 1);
    }

    #[test]
    fn one_line_per_interval_with_the_count_of_the_others() {
        let t = LogThrottle::new();
        assert_eq!(t.permit_at(1, 10_000), Some(0));
        for ms in 2..10_001 {
            assert_eq!(t.permit_at(ms, 10_000), None);
        }
        assert_eq!(t.permit_at(10_001, 10_000), Some(9_999));
        assert_eq!(t.permit_at(10_002, 10_000), None);
        assert_eq!(t.permit_at(50_000, 10_000), Some(1));
    }

    /// Threads racing the first line: one line, and every other event counted once, in the
    /// line (events counted before its winner took the count) or after it. Named after a
    /// bug in the test: it read the count after the line alone, and under load a thread
    /// that lost the race could count its event before the winner took the count (39,998).
    #[test]
    fn concurrent_events_write_one_line() {
        let t = LogThrottle::new();
        let lines: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..10_000)
                            .filter_map(|_| t.permit(Duration::from_secs(3_600)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0] + t.suppressed.load(Ordering::Relaxed), 39_999);
    }
}
