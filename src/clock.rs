//! Clocks: where stores get the time from.
//!
//! [`MonotonicClock`] (`std::time::Instant`) is the default: monotonic on every platform Rust
//! supports, unlike a raw TSC read, which can disagree between cores. [`FakeClock`] moves
//! only when a test says so. [`SystemClock`] is the wall clock, for stores shared between
//! processes that are told the time by the caller (see the Redis store).
//!
//! ```
//! use std::time::Duration;
//! use tollgate::clock::{Clock, FakeClock};
//!
//! let clock = FakeClock::new();
//! let other = clock.clone(); // clones share one time
//! clock.advance(Duration::from_millis(250));
//! assert_eq!(other.now(), 250_000_000);
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time in nanoseconds.
///
/// `now()` must not go backwards for one clock value and its clones, except for
/// [`SystemClock`], whose steps the algorithm tolerates (a TAT never moves backwards).
pub trait Clock: Clone + Send + Sync + 'static {
    /// Nanoseconds since the clock's own origin.
    fn now(&self) -> u64;
}

/// `std::time::Instant`, counted from the moment the clock was created.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        // u64 nanoseconds last 584 years from the origin.
        self.origin.elapsed().as_nanos() as u64
    }
}

/// The wall clock: nanoseconds since the Unix epoch.
///
/// Several processes agree on it (within their clock skew), which a [`MonotonicClock`]
/// cannot offer. Steps backwards are harmless to the algorithm: a bucket's TAT only moves
/// forward.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

/// Any [`Clock`] behind one type, for stores that are given their clock at run time (the
/// Redis store's local fallback and deny cache follow its
/// [`caller_time`](crate::store::RedisStore::caller_time) clock through it).
///
/// ```
/// use tollgate::clock::{Clock, FakeClock, SharedClock};
///
/// let fake = FakeClock::new();
/// let shared = SharedClock::new(fake.clone());
/// fake.advance(std::time::Duration::from_nanos(5));
/// assert_eq!(shared.now(), 5);
/// ```
#[derive(Clone)]
pub struct SharedClock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl SharedClock {
    /// `clock`, type-erased.
    pub fn new(clock: impl Clock) -> Self {
        Self(Arc::new(move || clock.now()))
    }
}

impl Default for SharedClock {
    /// A [`MonotonicClock`].
    fn default() -> Self {
        Self::new(MonotonicClock::new())
    }
}

impl Clock for SharedClock {
    #[inline]
    fn now(&self) -> u64 {
        (self.0)()
    }
}

impl fmt::Debug for SharedClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedClock").field(&self.now()).finish()
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// For deterministic tests: a [`MemoryStore`](crate::store::MemoryStore) built
/// [`with_clock`](crate::store::MemoryStore::with_clock) sees exactly the time the test
/// sets.
#[derive(Clone, Default)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock at `t` after its origin.
    pub fn at(t: Duration) -> Self {
        let clock = Self::new();
        clock.set(t);
        clock
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.nanos.fetch_add(d.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Sets the clock to `t` after its origin (backwards too, to test regressions).
    pub fn set(&self, t: Duration) {
        self.nanos.store(t.as_nanos() as u64, Ordering::SeqCst);
    }

    /// The time since the origin.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now())
    }
}

impl Clock for FakeClock {
    fn now(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for FakeClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FakeClock").field(&self.elapsed()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let c = MonotonicClock::new();
        let a = c.now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(c.now() >= a + 1_000_000);
    }

    #[test]
    fn fake_clock_is_shared_and_settable() {
        let c = FakeClock::at(Duration::from_secs(2));
        let d = c.clone();
        d.advance(Duration::from_millis(1));
        assert_eq!(c.now(), 2_001_000_000);
        c.set(Duration::from_secs(1));
        assert_eq!(d.elapsed(), Duration::from_secs(1));
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > 1_577_836_800 * 1_000_000_000);
    }
}
