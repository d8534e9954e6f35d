//! A circuit breaker: after repeated failures, skip the backend for a cool-down, then let
//! one request probe it. State changes are logged once each, never per request. Time is
//! whatever clock the caller reads (nanoseconds), so tests move it by hand.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Call the backend.
    Call,
    /// The breaker is open: do not call; apply the failure policy at once.
    Skip,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cool_down: Duration,
    /// Consecutive failures while closed.
    failures: AtomicU32,
    /// 0 while closed; otherwise when the next probe may go (clock ns, + 1).
    open_until: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cool_down,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
        }
    }

    fn cool_down_ns(&self) -> u64 {
        u64::try_from(self.cool_down.as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn permit(&self, now: u64) -> Permit {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Permit::Call;
        }
        let now = now.saturating_add(1);
        if now < until {
            return Permit::Skip;
        }
        // Cool-down over: the request that claims the next window is the probe. If it
        // fails (or is dropped), the next probe comes one cool-down later.
        let next = now.saturating_add(self.cool_down_ns());
        match self
            .open_until
            .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Permit::Call,
            Err(_) => Permit::Skip,
        }
    }

    pub(crate) fn success(&self, store: &str) {
        self.failures.store(0, Ordering::Relaxed);
        if self.open_until.load(Ordering::Relaxed) != 0
            && self.open_until.swap(0, Ordering::AcqRel) != 0
        {
            tracing::info!("tollgate: {store} answers again; limits are shared again");
        }
    }

    pub(crate) fn failure(&self, now: u64, store: &str, error: &dyn fmt::Display) {
        if self.open_until.load(Ordering::Acquire) != 0 {
            return; // a failed probe: stays open
        }
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= self.threshold {
            let until = now.saturating_add(1).saturating_add(self.cool_down_ns());
            if self
                .open_until
                .compare_exchange(0, until, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                tracing::warn!(
                    failures,
                    cool_down = ?self.cool_down,
                    %error,
                    "tollgate: {store} is failing; limits follow their failure policy until it answers again"
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

    const MS: u64 = 1_000_000;

    #[test]
    fn opens_after_threshold_probes_after_cool_down_and_closes_on_success() {
        let b = Breaker::new(3, Duration::from_millis(20));
        assert_eq!(b.permit(0), Permit::Call);
        b.failure(0, "Redis", &"boom");
        b.failure(MS, "Redis", &"boom");
        assert!(!b.is_open());
        b.failure(2 * MS, "Redis", &"boom");
        assert!(b.is_open());
        assert_eq!(b.permit(3 * MS), Permit::Skip);
        assert_eq!(b.permit(21 * MS), Permit::Skip, "cool-down not over");
        assert_eq!(b.permit(23 * MS), Permit::Call, "one probe");
        assert_eq!(b.permit(23 * MS), Permit::Skip, "only one");
        b.failure(24 * MS, "Redis", &"still down");
        assert!(b.is_open());
        assert_eq!(b.permit(30 * MS), Permit::Skip);
        assert_eq!(b.permit(44 * MS), Permit::Call);
        b.success("Redis");
        assert!(!b.is_open());
        assert_eq!(b.permit(44 * MS), Permit::Call);
    }

    #[test]
    fn a_success_resets_the_count() {
        let b = Breaker::new(2, Duration::from_secs(1));
        b.failure(0, "Redis", &"x");
        b.success("Redis");
        b.failure(0, "Redis", &"x");
        assert!(!b.is_open());
    }
}
