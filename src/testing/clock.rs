//! `TokioClock`: the [`Clock`] of tokio's timer, which a test can pause.

use crate::base::clock::Clock;

/// Where a [`TokioClock`] starts: 1,000 s, so that no bucket's time is near zero (a GCRA
/// bucket whose time is 0 is full, whatever happened).
const START: u64 = 1_000_000_000_000;

/// Tokio's clock ([`tokio::time::Instant`]) as a [`Clock`]: paused in a test that asks
/// for it (`#[tokio::test(start_paused = true)]`, or a runtime built with
/// `start_paused(true)`), so that the stores, the requests and a
/// [`SimBackend`](super::SimBackend) all read one time that moves only when every task
/// waits, and a run is the same every time and waits for nothing real.
///
/// It reads 1,000 s when created and counts from there (its
/// [`unix_origin`](Clock::unix_origin) is 0, so windows aligned to the epoch are aligned
/// to its zero). Create it inside the runtime: outside one, tokio's clock is the real one.
/// Clones read the same time.
///
/// Pausing needs tokio's `test-util` feature in your dev-dependencies; without a paused
/// clock it is a monotonic clock like any other.
///
/// ```
/// use std::time::Duration;
/// use tollgate::clock::Clock;
/// use tollgate::testing::TokioClock;
///
/// #[tokio::main(flavor = "current_thread", start_paused = true)]
/// async fn main() {
///     let clock = TokioClock::new();
///     assert_eq!(clock.now(), 1_000_000_000_000);
///     tokio::time::sleep(Duration::from_secs(60)).await; // at once: the clock is paused
///     assert_eq!(clock.now(), 1_060_000_000_000);
///     tokio::time::sleep_until(clock.instant(1_090_000_000_000)).await;
///     assert_eq!(clock.now(), 1_090_000_000_000);
/// }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading 1,000 s now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }

    /// The tokio instant this clock reads as `nanos` (to sleep until one of its
    /// readings: `tokio::time::sleep_until(clock.instant(t))`); the clock's start for a
    /// reading before it.
    pub fn instant(&self, nanos: u64) -> tokio::time::Instant {
        self.origin + std::time::Duration::from_nanos(nanos.saturating_sub(START))
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        START.saturating_add(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}
