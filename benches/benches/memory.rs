//! The in-memory store against `governor`'s keyed (DashMap) limiter, in the same run.
//!
//! Each iteration is one rate-limit check of one IPv4 key: for `tollgate`, building the
//! [`Key`] from the address, then [`MemoryStore::check`] with one [`Item`]; for `governor`,
//! `DefaultKeyedRateLimiter<IpAddr>::check_key` (default features, so its `quanta` clock).
//! Both get the same quota, and every benchmark counts its allowed checks and fails if
//! more than 1% were denied: the allowed path is what is measured.
//!
//! Cases, reported as `memory/<case>/<impl>` with throughput in checks per second:
//!
//! - `hot_key`: one key, checked over and over;
//! - `many_keys`: 10,000 distinct keys, inserted before measuring, checked round-robin;
//! - `contended`: two threads checking the same 16 keys at once (wall time of both);
//! - `many_keys_idle`: the same 10,000 keys with a fast quota, so that each key's bucket
//!   is full again by the time it comes back round.
//!
//! `governor-std-clock` is governor's limiter on `std::time::Instant` (its
//! `MonotonicClock`) instead of its default TSC-based `quanta` clock, and
//! `tollgate-std-clock` tollgate's store on `Instant` (`clock::MonotonicClock`) instead of
//! its default `CpuClock` (the CPU's counter, read only where the kernel reads it for its
//! own monotonic clock): on a VM one `Instant::now()` costs about as much as a whole check,
//! so these two show the same work on the same clock.
//!
//! The first three use 100 tokens a second and a bucket of `u32::MAX` (governor's
//! largest): every bucket stays partly drained, so the keys stay in both stores, and no
//! check is denied. `many_keys_idle` uses a million a second with a bucket of a million:
//! governor keeps every key, while tollgate drops full buckets (it sweeps a shard before
//! growing it) and so inserts the key again on most checks.
//!
//! `memory/algorithm/<algorithm>` compares tollgate's algorithms on the `many_keys` set
//! (10,000 keys round-robin, every check allowed): `gcra` (the `many_keys` quota),
//! `fixed-window` and `fixed-window-random` (`u32::MAX` per day), `sliding-window` (65,535
//! per 65.535 s, its largest limit) and `sliding-log-100` (100 per 10 ms: each key's log
//! holds the checks of its last 10 ms, a few dozen entries). `gcra-reserve` and
//! `fixed-window-reserve` are the same checks as reservations that may wait 1 s (granted at
//! once: the path of `Limiter::reserve` and delay mode when there is room).
//!
//! Run with `cargo bench -p tollgate-bench --bench memory` (add e.g. `-- many_keys` to filter).

// `criterion_group!` defines an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use tollgate::clock::{Clock, CpuClock, MonotonicClock};
use tollgate::key::Key;
use tollgate::store::{Checked, Item, MemoryStore, MemoryTable, Store};
use tollgate::{Algorithm, Quota};

/// A deep bucket drained slowly: refilling it takes 1.4 years.
const RESIDENT: (u32, u32) = (100, u32::MAX);
/// Tollgate's fastest rate: a key checked once a millisecond has a full bucket each time.
const IDLE: (u32, u32) = (1_000_000, 1_000_000);
const MANY_KEYS: usize = 10_000;
const CONTENDED_KEYS: usize = 16;
const THREADS: u64 = 2;

/// A rate limiter under test: one check of one address.
trait Limiter: Sync {
    fn check(&self, ip: IpAddr) -> bool;
}

struct Tollgate<C = CpuClock> {
    store: MemoryStore<C>,
    table: MemoryTable,
    quota: Quota,
    algorithm: Algorithm,
    /// Non-zero: each check is a reservation that may wait this long.
    max_wait: Duration,
}

impl Tollgate {
    /// `rate` per second, bucket of `burst`.
    fn new((rate, burst): (u32, u32)) -> Self {
        Self::with(
            Quota::per_second(u64::from(rate)).burst(u64::from(burst)),
            Algorithm::Gcra,
        )
    }

    fn with(quota: Quota, algorithm: Algorithm) -> Self {
        Self::on(MemoryStore::new(), quota, algorithm)
    }
}

impl Tollgate<MonotonicClock> {
    /// On `std::time::Instant`.
    fn std_clock((rate, burst): (u32, u32)) -> Self {
        let quota = Quota::per_second(u64::from(rate)).burst(u64::from(burst));
        Self::on(
            MemoryStore::with_clock(MonotonicClock::new()),
            quota,
            Algorithm::Gcra,
        )
    }
}

impl<C: Clock> Tollgate<C> {
    fn on(store: MemoryStore<C>, quota: Quota, algorithm: Algorithm) -> Self {
        let table = store.table("per-ip");
        Self {
            store,
            table,
            quota,
            algorithm,
            max_wait: Duration::ZERO,
        }
    }

    /// Each check a reservation that may wait `max_wait`.
    fn reserving(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }
}

impl<C: Clock> Limiter for Tollgate<C> {
    #[inline]
    fn check(&self, ip: IpAddr) -> bool {
        let item = Item::new(&self.table, Key::from_part(ip), self.quota, 1)
            .algorithm(self.algorithm)
            .max_wait(self.max_wait);
        match self.store.check(std::slice::from_ref(&item)) {
            Checked::Ready(statuses) => statuses[0].outcome().is_some_and(|o| o.is_allowed()),
            Checked::Pending(_) => unreachable!("the memory store answers at once"),
        }
    }
}

struct Governor(DefaultKeyedRateLimiter<IpAddr>);

fn governor_quota((rate, burst): (u32, u32)) -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(rate).unwrap())
        .allow_burst(NonZeroU32::new(burst).unwrap())
}

impl Governor {
    /// `rate` per second, bucket of `burst`.
    fn new(quota: (u32, u32)) -> Self {
        Self(RateLimiter::keyed(governor_quota(quota)))
    }
}

impl Limiter for Governor {
    #[inline]
    fn check(&self, ip: IpAddr) -> bool {
        self.0.check_key(&ip).is_ok()
    }
}

/// governor's keyed DashMap limiter on `std::time::Instant` (its `MonotonicClock`), the
/// clock tollgate uses, instead of its default TSC-based `quanta` clock: the same work
/// with the same clock.
struct GovernorStdClock(
    RateLimiter<
        IpAddr,
        governor::state::keyed::DefaultKeyedStateStore<IpAddr>,
        governor::clock::MonotonicClock,
        governor::middleware::NoOpMiddleware<std::time::Instant>,
    >,
);

impl GovernorStdClock {
    fn new(quota: (u32, u32)) -> Self {
        Self(RateLimiter::dashmap_with_clock(
            governor_quota(quota),
            governor::clock::MonotonicClock,
        ))
    }
}

impl Limiter for GovernorStdClock {
    #[inline]
    fn check(&self, ip: IpAddr) -> bool {
        self.0.check_key(&ip).is_ok()
    }
}

/// `n` distinct IPv4 addresses.
fn addresses(n: usize) -> Vec<IpAddr> {
    (0..n as u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
        .collect()
}

/// Checks and allowed checks over one benchmark, to fail loudly if the denied path
/// was measured instead of the allowed one.
#[derive(Default)]
struct Tally {
    checks: AtomicU64,
    allowed: AtomicU64,
}

impl Tally {
    fn add(&self, checks: u64, allowed: u64) {
        self.checks.fetch_add(checks, Ordering::Relaxed);
        self.allowed.fetch_add(allowed, Ordering::Relaxed);
    }

    fn assert_mostly_allowed(&self, id: &str) {
        let checks = self.checks.load(Ordering::Relaxed);
        let allowed = self.allowed.load(Ordering::Relaxed);
        if checks == 0 {
            return; // filtered out
        }
        assert!(
            allowed * 100 >= checks * 99,
            "{id}: only {allowed} of {checks} checks were allowed; the quota is too small"
        );
        eprintln!("{id}: {allowed} of {checks} checks allowed");
    }
}

/// Checks `keys` round-robin, `iters` times in all, starting at `start`; returns how many
/// were allowed.
#[inline(never)]
fn run(limiter: &impl Limiter, keys: &[IpAddr], start: usize, iters: u64) -> u64 {
    let mut allowed = 0;
    let mut i = start;
    for _ in 0..iters {
        allowed += u64::from(limiter.check(black_box(keys[i])));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    allowed
}

/// One thread checking `keys` round-robin.
fn bench_single(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    case: &str,
    name: &str,
    limiter: &impl Limiter,
    keys: &[IpAddr],
) {
    // Insert every key before measuring.
    assert_eq!(run(limiter, keys, 0, keys.len() as u64), keys.len() as u64);
    let tally = Tally::default();
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let allowed = run(limiter, keys, 0, iters);
            let elapsed = start.elapsed();
            tally.add(iters, allowed);
            elapsed
        });
    });
    tally.assert_mostly_allowed(&format!("memory/{case}/{name}"));
}

/// Two threads on the same keys; the time from the first thread's start to the last
/// thread's end.
fn bench_contended(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    limiter: &impl Limiter,
    keys: &[IpAddr],
) {
    assert_eq!(run(limiter, keys, 0, keys.len() as u64), keys.len() as u64);
    let tally = Tally::default();
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let per_thread = iters.div_ceil(THREADS);
            let barrier = Barrier::new(THREADS as usize);
            let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let barrier = &barrier;
                        let tally = &tally;
                        // The threads start half the key set apart.
                        let offset = t as usize * keys.len() / THREADS as usize;
                        s.spawn(move || {
                            barrier.wait();
                            let start = Instant::now();
                            let allowed = run(limiter, keys, offset, per_thread);
                            let end = Instant::now();
                            tally.add(per_thread, allowed);
                            (start, end)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let start = spans.iter().map(|s| s.0).min().unwrap();
            let end = spans.iter().map(|s| s.1).max().unwrap();
            // Scale to exactly `iters` checks when `iters` is odd.
            (end - start).mul_f64(iters as f64 / (per_thread * THREADS) as f64)
        });
    });
    tally.assert_mostly_allowed(&format!("memory/contended/{name}"));
}

fn memory(c: &mut Criterion) {
    let one = addresses(1);
    let many = addresses(MANY_KEYS);
    let few = addresses(CONTENDED_KEYS);

    // Fresh limiters per case, so that one case's keys do not weigh on another's.
    for (case, keys) in [("hot_key", &one), ("many_keys", &many)] {
        let mut group = c.benchmark_group(format!("memory/{case}"));
        group.throughput(Throughput::Elements(1));
        bench_single(&mut group, case, "tollgate", &Tollgate::new(RESIDENT), keys);
        bench_single(&mut group, case, "governor", &Governor::new(RESIDENT), keys);
        bench_single(
            &mut group,
            case,
            "tollgate-std-clock",
            &Tollgate::std_clock(RESIDENT),
            keys,
        );
        bench_single(
            &mut group,
            case,
            "governor-std-clock",
            &GovernorStdClock::new(RESIDENT),
            keys,
        );
        group.finish();
    }

    let mut group = c.benchmark_group("memory/contended");
    group.throughput(Throughput::Elements(1));
    bench_contended(&mut group, "tollgate", &Tollgate::new(RESIDENT), &few);
    bench_contended(&mut group, "governor", &Governor::new(RESIDENT), &few);
    bench_contended(
        &mut group,
        "governor-std-clock",
        &GovernorStdClock::new(RESIDENT),
        &few,
    );
    group.finish();

    let mut group = c.benchmark_group("memory/algorithm");
    group.throughput(Throughput::Elements(1));
    let q = |n, d: Duration| Quota::new(n, d).unwrap();
    let day = Duration::from_secs(86_400);
    for (name, quota, algorithm) in [
        (
            "gcra",
            Quota::per_second(u64::from(RESIDENT.0)).burst(u64::from(RESIDENT.1)),
            Algorithm::Gcra,
        ),
        (
            "fixed-window",
            q(u64::from(u32::MAX), day),
            Algorithm::fixed_window(),
        ),
        (
            "fixed-window-random",
            q(u64::from(u32::MAX), day),
            Algorithm::fixed_window_random(),
        ),
        (
            "sliding-window",
            q(65_535, Duration::from_millis(65_535)),
            Algorithm::SlidingWindow,
        ),
        (
            "sliding-log-100",
            q(100, Duration::from_millis(10)),
            Algorithm::SlidingLog,
        ),
    ] {
        let limiter = Tollgate::with(quota, algorithm);
        bench_single(&mut group, "algorithm", name, &limiter, &many);
    }
    // A calendar day in Berlin: the fixed window's path plus the table's window hint.
    #[cfg(feature = "calendar")]
    {
        let berlin = tollgate::calendar::Zone::get("Europe/Berlin").unwrap();
        let limiter = Tollgate::with(
            Quota::per_day(u64::from(u32::MAX)),
            Algorithm::calendar(berlin),
        );
        bench_single(&mut group, "algorithm", "calendar-day", &limiter, &many);
    }
    // The same checks as reservations (granted at once: the buckets have room), the
    // path `Limiter::reserve` and delay mode take.
    for (name, quota, algorithm) in [
        (
            "gcra-reserve",
            Quota::per_second(u64::from(RESIDENT.0)).burst(u64::from(RESIDENT.1)),
            Algorithm::Gcra,
        ),
        (
            "fixed-window-reserve",
            q(u64::from(u32::MAX), day),
            Algorithm::fixed_window(),
        ),
    ] {
        let limiter = Tollgate::with(quota, algorithm).reserving(Duration::from_secs(1));
        bench_single(&mut group, "algorithm", name, &limiter, &many);
    }
    group.finish();

    let case = "many_keys_idle";
    let mut group = c.benchmark_group(format!("memory/{case}"));
    group.throughput(Throughput::Elements(1));
    bench_single(&mut group, case, "tollgate", &Tollgate::new(IDLE), &many);
    bench_single(&mut group, case, "governor", &Governor::new(IDLE), &many);
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = memory
}
criterion_main!(benches);
