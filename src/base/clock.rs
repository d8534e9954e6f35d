//! Clocks: where stores get the time from.
//!
//! [`CpuClock`] is the default: the CPU's time counter read directly (a few nanoseconds)
//! where the operating system itself trusts it for its monotonic clock, and
//! `std::time::Instant` everywhere else. [`MonotonicClock`] is `Instant` always.
//! [`FakeClock`] moves only when a test says so. [`SystemClock`] is the wall clock, for
//! stores shared between processes that are told the time by the caller (see the Redis
//! store). [`CoarseClock`] is a cached time refreshed by a thread of its own.
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

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
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

/// `std::time::Instant`, counted from the moment the clock was created: monotonic on every
/// platform Rust supports, at the price of a system call or a vDSO read per reading.
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

/// The default clock: the CPU's time counter (the TSC on x86-64, the system counter on
/// AArch64), calibrated to nanoseconds, where the kernel uses that counter for its own
/// monotonic clock; `std::time::Instant` everywhere else.
///
/// Reading the counter costs a few nanoseconds, against 20–40 for `Instant::now()` on
/// many virtual machines: on one thread it is a large part of a whole check. A raw counter
/// is not always a clock, though: some machines' cores disagree on it by seconds, and a
/// limiter that trusts it refuses requests at random when a thread moves between cores.
/// So the counter is used only where Linux itself reads it for `CLOCK_MONOTONIC` (its
/// current clock source is `tsc` on x86-64, `arch_sys_counter` on AArch64): the kernel has
/// then checked at boot that the cores agree, and switches away from a counter it finds
/// drifting. On other systems, or another clock source, `CpuClock` reads `Instant`.
///
/// Guarantees:
///
/// - **Monotonic on each thread.** A thread never reads a smaller counter than it read
///   before, whichever core it runs on (a per-thread high-water mark of the raw counter, no
///   shared write).
/// - **Between threads**, two reads are as ordered as the cores' counters are, which the
///   kernel has checked to within its tolerance. The stores already take a time older
///   than a bucket's last write in their stride (two threads read the clock, then race to
///   write one bucket); a time that is older only makes a check stricter, since a bucket's
///   state only moves forward.
/// - **Rate.** The counter is calibrated against the OS monotonic clock once per process
///   (at the first `CpuClock::new`: about half a millisecond measured, 200 ms at most, a
///   bound `quanta` sets on its calibration loop); the error measured on a
///   development VM is 1–2 parts per million, so over-grant from the clock's rate is about
///   one token in 500,000. Unlike `CLOCK_MONOTONIC`, the counter is not slewed by NTP.
///
/// ```
/// use tollgate::clock::{Clock, CpuClock};
///
/// let clock = CpuClock::new();
/// let a = clock.now();
/// std::thread::sleep(std::time::Duration::from_millis(2));
/// assert!(clock.now() >= a + 1_000_000);
/// ```
#[derive(Clone, Copy)]
pub struct CpuClock {
    counter: Option<&'static quanta::Clock>,
    /// The raw counter at creation.
    origin: u64,
    /// Read where the counter is not; its creation gives the wall-time origin either way.
    fallback: MonotonicClock,
}

thread_local! {
    /// The largest raw counter this thread has read: a thread that moves to a core whose
    /// counter lags reads this instead.
    static HIGH_WATER: Cell<u64> = const { Cell::new(0) };
}

/// The calibrated counter, or `None` where the kernel does not read it for its own
/// monotonic clock. Decided once per process.
fn trusted_counter() -> Option<&'static quanta::Clock> {
    static COUNTER: OnceLock<Option<quanta::Clock>> = OnceLock::new();
    COUNTER
        .get_or_init(|| kernel_reads_the_counter().then(quanta::Clock::new))
        .as_ref()
}

/// Whether Linux's current clock source is the CPU counter that `quanta` reads.
fn kernel_reads_the_counter() -> bool {
    let expected = if cfg!(target_arch = "x86_64") {
        "tsc"
    } else if cfg!(target_arch = "aarch64") {
        "arch_sys_counter"
    } else {
        return false;
    };
    if !cfg!(any(target_os = "linux", target_os = "android")) {
        return false;
    }
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|source| source.trim() == expected)
}

impl CpuClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let counter = trusted_counter();
        Self {
            counter,
            origin: counter.map_or(0, |c| c.raw()),
            fallback: MonotonicClock::new(),
        }
    }

    /// Whether this clock reads the CPU's counter (`false`: it reads `Instant`).
    pub fn reads_the_counter(&self) -> bool {
        self.counter.is_some()
    }
}

impl Default for CpuClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CpuClock {
    #[inline]
    fn now(&self) -> u64 {
        match self.counter {
            Some(counter) => {
                let raw = HIGH_WATER.with(|high| {
                    let raw = counter.raw().max(high.get());
                    high.set(raw);
                    raw
                });
                // 0 for a counter below the origin (read on another core just after it).
                counter.delta_as_nanos(self.origin, raw)
            }
            None => self.fallback.now(),
        }
    }

    fn unix_origin(&self) -> u64 {
        self.fallback.unix_origin()
    }
}

impl fmt::Debug for CpuClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuClock")
            .field("reads_the_counter", &self.reads_the_counter())
            .field("now", &self.now())
            .finish()
    }
}

/// A monotonic clock read from a cache that a background thread refreshes every
/// `resolution`: one relaxed atomic load per read instead of an `Instant::now()`, the
/// larger part of a single-threaded check on many machines. Opt-in; [`CpuClock`]
/// is the default.
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
/// // Its thread moves it on every 100 µs (later on a machine too busy to run it).
/// let start = std::time::Instant::now();
/// while store.clock().now() == a {
///     assert!(start.elapsed() < Duration::from_secs(10), "the clock's thread runs");
///     std::thread::sleep(Duration::from_millis(1));
/// }
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
    /// A [`CpuClock`].
    fn default() -> Self {
        Self::new(CpuClock::new())
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

    /// The calibrated counter measures what `Instant` measures: each of its intervals
    /// lies between the `Instant` readings taken just inside and just outside it (plus a
    /// microsecond and 0.1% for the calibration), however the threads are scheduled.
    #[test]
    fn cpu_clock_agrees_with_instant() {
        let clock = CpuClock::new();
        for _ in 0..5 {
            let outer_start = Instant::now();
            let start = clock.now();
            let inner_start = Instant::now();
            std::thread::sleep(Duration::from_millis(10));
            let inner_end = Instant::now();
            let end = clock.now();
            let outer_end = Instant::now();
            let measured = end - start;
            let inner = (inner_end - inner_start).as_nanos() as u64;
            let outer = (outer_end - outer_start).as_nanos() as u64;
            let slack = 1_000 + outer / 1_000;
            assert!(
                measured + slack >= inner && measured <= outer + slack,
                "{measured} ns outside [{inner}, {outer}] ns (counter: {})",
                clock.reads_the_counter()
            );
        }
    }

    /// One thread's readings never go backwards, across clocks (the high-water mark is
    /// kept on the raw counter, which all `CpuClock`s share), and threads read the same
    /// time base.
    #[test]
    fn cpu_clock_is_monotonic_on_each_thread_and_shared_between_threads() {
        let a = CpuClock::new();
        let b = CpuClock {
            origin: a.origin,
            ..CpuClock::new()
        };
        let mut last = 0;
        for i in 0..100_000 {
            let now = if i % 2 == 0 { a.now() } else { b.now() };
            assert!(now >= last, "{now} after {last}");
            last = now;
        }
        let before = a.now();
        let there = std::thread::spawn(move || a.now()).join().unwrap();
        // The spawned thread read after `before` in real time; the kernel keeps the
        // cores' counters within far less than a millisecond of each other.
        assert!(there + 1_000_000 >= before, "{there} vs {before}");
        assert!(a.unix_origin() > 1_577_836_800 * 1_000_000_000);
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
        // Refreshed by its thread (which a busy machine may run late).
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.now() == 0 {
            assert!(Instant::now() < deadline, "refreshed");
            std::thread::sleep(Duration::from_millis(1));
        }
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
