//! A circuit breaker: after repeated failures, skip Redis for a cool-down, then let one
//! request probe it. State changes are logged once each, never per request.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Call Redis.
    Call,
    /// The breaker is open: do not call Redis; apply the failure policy at once.
    Skip,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    origin: Instant,
    threshold: u32,
    cool_down: Duration,
    /// Consecutive failures while closed.
    failures: AtomicU32,
    /// 0 while closed; otherwise when the next probe may go (ns since `origin`, + 1).
    open_until: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            origin: Instant::now(),
            threshold: threshold.max(1),
            cool_down,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64 + 1
    }

    pub(crate) fn permit(&self) -> Permit {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Permit::Call;
        }
        let now = self.now();
        if now < until {
            return Permit::Skip;
        }
        // Cool-down over: the request that claims the next window is the probe. If it
        // fails (or is dropped), the next probe comes one cool-down later.
        let next = now + self.cool_down.as_nanos() as u64;
        match self
            .open_until
            .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Permit::Call,
            Err(_) => Permit::Skip,
        }
    }

    pub(crate) fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 {
            tracing::info!("tollgate: Redis answers again; limits are shared again");
        }
    }

    pub(crate) fn failure(&self, error: &dyn std::fmt::Display) {
        if self.open_until.load(Ordering::Acquire) != 0 {
            return; // a failed probe: stays open
        }
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= self.threshold {
            let until = self.now() + self.cool_down.as_nanos() as u64;
            if self
                .open_until
                .compare_exchange(0, until, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                tracing::warn!(
                    failures,
                    cool_down = ?self.cool_down,
                    %error,
                    "tollgate: Redis is failing; limits follow their failure policy until it answers again"
                );
            }
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_probes_after_cool_down_and_closes_on_success() {
        let b = Breaker::new(3, Duration::from_millis(20));
        assert_eq!(b.permit(), Permit::Call);
        b.failure(&"boom");
        b.failure(&"boom");
        assert!(!b.is_open());
        b.failure(&"boom");
        assert!(b.is_open());
        assert_eq!(b.permit(), Permit::Skip);
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(b.permit(), Permit::Call, "one probe");
        assert_eq!(b.permit(), Permit::Skip, "only one");
        b.failure(&"still down");
        assert!(b.is_open());
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(b.permit(), Permit::Call);
        b.success();
        assert!(!b.is_open());
        assert_eq!(b.permit(), Permit::Call);
    }

    #[test]
    fn a_success_resets_the_count() {
        let b = Breaker::new(2, Duration::from_secs(1));
        b.failure(&"x");
        b.success();
        b.failure(&"x");
        assert!(!b.is_open());
    }
}
