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

    /// Nanoseconds from the Unix epoch to this clock's origin: `now() + unix_origin()` is
    /// wall time. Window limits aligned to the epoch (a fixed window per calendar minute
    /// or day) use it. Monotonic clocks read the wall clock once, when they are created;
    /// clocks that count from the epoch ([`SystemClock`]), and [`FakeClock`] (whose time
    /// *is* wall time, so tests place it where they want), answer 0, the default.
    fn unix_origin(&self) -> u64 {
        0
    }
}

/// Wall time now, in nanoseconds since the Unix epoch (0 before it).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// `std::time::Instant`, counted from the moment the clock was created.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: Instant,
    unix_origin: u64,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            unix_origin: unix_now(),
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

    fn unix_origin(&self) -> u64 {
        self.unix_origin
    }
}

/// A monotonic clock read from a cache that a background thread refreshes every
/// `resolution`: one relaxed atomic load per read instead of an `Instant::now()`, the
/// larger part of a single-threaded check on many machines. Opt-in; [`MonotonicClock`]
/// stays the default.
///
/// The cached time runs behind the real one by less than `resolution` (plus scheduling
/// delay if the thread is starved), never ahead. A request is decided as if it came at the
/// last refresh: its bucket has refilled a little less, so the long-run rate is exact and a
/// request is never admitted earlier than its time allows. Over an interval of real length
/// `d` at most `burst + (d + resolution) / T` tokens are granted (`T` the emission
/// interval): with `resolution` below `T` (the default 100 µs is below the `T` of any rate
/// up to 10,000 per second) that is at most one token more than an exact clock in one
/// interval, and never more over time.
///
/// The thread ends when the last clone of the clock is dropped.
///
/// ```
/// use std::time::Duration;
/// use tollgate::clock::{Clock, CoarseClock};
/// use tollgate::store::MemoryStore;
///
/// let store = MemoryStore::with_clock(CoarseClock::new(Duration::from_micros(100)));
/// let a = store.clock().now();
/// std::thread::sleep(Duration::from_millis(5));
/// assert!(store.clock().now() > a);
/// ```
#[derive(Clone)]
pub struct CoarseClock {
    inner: Arc<Coarse>,
}

struct Coarse {
    origin: Instant,
    unix_origin: u64,
    now: AtomicU64,
    resolution: Duration,
}

impl CoarseClock {
    /// A clock refreshed every `resolution` (at least 1 µs) by its own thread.
    ///
    /// # Panics
    ///
    /// If the thread cannot be spawned.
    pub fn new(resolution: Duration) -> Self {
        let resolution = resolution.max(Duration::from_micros(1));
        let inner = Arc::new(Coarse {
            origin: Instant::now(),
            unix_origin: unix_now(),
            now: AtomicU64::new(0),
            resolution,
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("tollgate-clock".into())
            .spawn(move || {
                while let Some(clock) = weak.upgrade() {
                    let elapsed = clock.origin.elapsed().as_nanos() as u64;
                    clock.now.fetch_max(elapsed, Ordering::Release);
                    let sleep = clock.resolution;
                    drop(clock);
                    std::thread::sleep(sleep);
                }
            })
            .expect("tollgate: cannot spawn the clock thread");
        Self { inner }
    }

    /// How often the time is refreshed.
    pub fn resolution(&self) -> Duration {
        self.inner.resolution
    }
}

impl Default for CoarseClock {
    /// Refreshed every 100 µs.
    fn default() -> Self {
        Self::new(Duration::from_micros(100))
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        self.inner.now.load(Ordering::Acquire)
    }

    fn unix_origin(&self) -> u64 {
        self.inner.unix_origin
    }
}

impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("resolution", &self.inner.resolution)
            .field("now", &self.now())
            .finish()
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
        unix_now()
    }
}

/// Any [`Clock`] behind one type, for stores that are given their clock at run time (the
/// Redis store's local fallback and deny cache follow its
/// `RedisStore::caller_time` clock through it).
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
pub struct SharedClock(Arc<dyn Fn() -> u64 + Send + Sync>, u64);

impl SharedClock {
    /// `clock`, type-erased.
    pub fn new(clock: impl Clock) -> Self {
        let unix_origin = clock.unix_origin();
        Self(Arc::new(move || clock.now()), unix_origin)
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

    fn unix_origin(&self) -> u64 {
        self.1
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
    fn coarse_clock_lags_but_never_leads_and_stops_with_its_last_clone() {
        let c = CoarseClock::new(Duration::from_micros(200));
        let reference = c.inner.origin;
        let mut last = 0;
        for _ in 0..50 {
            let now = c.now();
            assert!(now >= last, "monotonic");
            assert!(now <= reference.elapsed().as_nanos() as u64, "never ahead");
            last = now;
            std::thread::sleep(Duration::from_micros(300));
        }
        assert!(last > 0, "refreshed");
        let weak = Arc::downgrade(&c.inner);
        drop(c);
        // The thread holds a strong reference only while it writes (microseconds).
        let deadline = Instant::now() + Duration::from_secs(5);
        while weak.strong_count() > 0 {
            assert!(
                Instant::now() < deadline,
                "the clock outlived its last clone"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > 1_577_836_800 * 1_000_000_000);
    }
}
