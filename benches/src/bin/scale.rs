//! Multi-core scaling of the in-memory store against `governor`, in one run.
//!
//! Measures rate-limit checks per second with 1, 2, 4, 8 and 16 threads (only those up to
//! the machine's available parallelism, plus that number itself if it is not in the list,
//! unless `--threads` says otherwise), for each case and each implementation, one cell after
//! the other in one process, and prints a table with the ratios of tollgate to governor.
//!
//! One check is one IPv4 address checked against one limit:
//!
//! - `tollgate`: a [`Key`] built from the address with [`Key::from_part`], one [`Item`], and
//!   [`MemoryStore::check`] (the default clock, [`CpuClock`]: the CPU's counter where the
//!   kernel uses it too), as `benches/benches/memory.rs` does;
//! - `tollgate-instant`: the same store on `std::time::Instant` ([`MonotonicClock`]);
//! - `tollgate-coarse`: the same store on the opt-in [`CoarseClock`] (a cached monotonic
//!   time refreshed every 100 µs by a thread: one atomic load per read);
//! - `tollgate-striped`: the `tollgate` store with every key split into 8 stripes
//!   ([`Item::stripes`], `Limit::striped(8)`): a hot key's threads write different
//!   buckets;
//! - `governor`: `DefaultKeyedRateLimiter<IpAddr>::check_key` (its DashMap store and its
//!   default TSC-based `quanta` clock);
//! - `governor-std`: the same limiter on `std::time::Instant` (governor's
//!   `MonotonicClock`): the same work as `tollgate-instant` on the same clock.
//!
//! Cases:
//!
//! - `hot_key`: every thread checks the same address;
//! - `many_keys`: 100,000 addresses, checked round-robin, each thread starting at its own
//!   offset (`t * 100,000 / threads`). The quota is one token a second with a bucket of
//!   three billion (95 years of tokens, near the most either limiter accepts): every
//!   bucket stays partly drained, so every key stays resident in both stores, and nothing
//!   is refused before a key has been checked three billion times, whatever the store
//!   does with full buckets. A fast quota would not do: a bucket refilled at a million a
//!   second is full again a microsecond after a check, whatever its size; with a million
//!   a second and a bucket of `u32::MAX`, the store of commit 21c99cf (which drops full
//!   buckets when a shard grows) held about 150 of the 100,000 keys at the end of a cell.
//!   `hot_key` uses the same quota, so a `hot_key` cell fails after three billion checks
//!   (over a minute at 40 M/s).
//! - `many_keys_refilled`: the same 100,000 addresses under a million tokens a second with
//!   a bucket of a million: every bucket is full again when its key comes back round, so
//!   nothing is refused. governor keeps every key; a store that drops full buckets (a
//!   full bucket is the same as no entry), as tollgate's did at commit 21c99cf, inserts
//!   the key again on most checks.
//!
//! The `tollgate keys` column shows how many keys tollgate's store holds at the end of
//! each cell: 100,000 when every key stayed resident.
//!
//! Method, per cell (case × threads × implementation): a fresh limiter; for the `many_keys*`
//! cases every key checked once beforehand, untimed; then the threads start together
//! behind a `Barrier` and check in a loop for `--warmup` seconds (not counted) and then
//! `--seconds` seconds, each counting its own checks, allowed and denied, in local counters
//! (phases are read from one shared flag every 1,024 checks). Checks per second is the
//! checks made in the measured phase over its wall time. The allowed path is what is
//! measured: a cell in which more than 1% of the checks were denied is marked `FAIL`, and
//! the run then ends with a non-zero exit status.
//!
//! Run it (about 55 s with the defaults on 16 cores):
//!
//! ```text
//! cargo run -p tollgate-bench --release --bin scale -- --seconds 2
//! cargo run -p tollgate-bench --release --bin scale -- --threads 1,2 --seconds 0.5 --cases hot_key,many_keys
//! cargo run -p tollgate-bench --release --bin scale -- --impls tollgate,governor --csv > scale.csv
//! ```
//!
//! Options: `--threads 1,2,4` (any counts, not capped), `--seconds S` (default 1.0),
//! `--warmup S` (default 0.2), `--cases a,b` and `--impls a,b` (filters, names as above),
//! `--csv`
//! (one line per cell on stdout instead of the table).
//!
//! To run it on another machine, build it here and copy the binary (it runs as is on
//! another x86-64 Linux machine with the same libc):
//!
//! ```text
//! cargo build -p tollgate-bench --release --bin scale
//! scp target/release/scale bighost: && ssh bighost ./scale --seconds 2
//! ```

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, RateLimiter};
use tollgate::Quota;
use tollgate::clock::{Clock, CoarseClock, CpuClock, MonotonicClock};
use tollgate::key::Key;
use tollgate::store::{Checked, Item, MemoryStore, MemoryTable, Store};

/// Distinct addresses in the `many_keys*` cases.
const MANY_KEYS: usize = 100_000;
/// Checks between two reads of the phase flag.
const BATCH: u64 = 1024;
/// Thread counts run by default, up to the available parallelism.
const DEFAULT_THREADS: [usize; 5] = [1, 2, 4, 8, 16];

/// A quota as (tokens per second, bucket size).
type Rate = (u32, u32);
/// One token a second into a bucket of three billion: buckets stay drained, keys resident.
const RESIDENT: Rate = (1, 3_000_000_000);
/// A million a second into a bucket of a million: full again within a microsecond.
const REFILLED: Rate = (1_000_000, 1_000_000);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    HotKey,
    ManyKeys,
    ManyKeysRefilled,
}

impl Case {
    const ALL: [Case; 3] = [Case::HotKey, Case::ManyKeys, Case::ManyKeysRefilled];

    fn name(self) -> &'static str {
        match self {
            Case::HotKey => "hot_key",
            Case::ManyKeys => "many_keys",
            Case::ManyKeysRefilled => "many_keys_refilled",
        }
    }

    fn keys(self) -> usize {
        match self {
            Case::HotKey => 1,
            Case::ManyKeys | Case::ManyKeysRefilled => MANY_KEYS,
        }
    }

    fn rate(self) -> Rate {
        match self {
            Case::HotKey | Case::ManyKeys => RESIDENT,
            Case::ManyKeysRefilled => REFILLED,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Impl {
    Tollgate,
    TollgateInstant,
    TollgateCoarse,
    TollgateStriped,
    Governor,
    GovernorStd,
}

impl Impl {
    const ALL: [Impl; 6] = [
        Impl::Tollgate,
        Impl::TollgateInstant,
        Impl::TollgateCoarse,
        Impl::TollgateStriped,
        Impl::Governor,
        Impl::GovernorStd,
    ];

    fn name(self) -> &'static str {
        match self {
            Impl::Tollgate => "tollgate",
            Impl::TollgateInstant => "tollgate-instant",
            Impl::TollgateCoarse => "tollgate-coarse",
            Impl::TollgateStriped => "tollgate-striped",
            Impl::Governor => "governor",
            Impl::GovernorStd => "governor-std",
        }
    }
}

/// A rate limiter under test.
trait Limiter: Sync {
    /// One check of one address; `true` if allowed.
    fn check(&self, ip: IpAddr) -> bool;
    /// Keys the limiter holds.
    fn keys(&self) -> usize;
}

struct Tollgate<C: Clock> {
    store: MemoryStore<C>,
    table: MemoryTable,
    quota: Quota,
    /// Stripes per key (1: one bucket).
    stripes: u8,
}

impl<C: Clock> Tollgate<C> {
    fn new(store: MemoryStore<C>, (rate, burst): Rate) -> Self {
        let table = store.table("per-ip");
        Self {
            store,
            table,
            quota: Quota::per_second(u64::from(rate)).burst(u64::from(burst)),
            stripes: 1,
        }
    }

    fn striped(mut self, n: u8) -> Self {
        self.stripes = n;
        self
    }
}

impl<C: Clock> Limiter for Tollgate<C> {
    #[inline]
    fn check(&self, ip: IpAddr) -> bool {
        let item = Item::new(&self.table, Key::from_part(ip), self.quota, 1).stripes(self.stripes);
        match self.store.check(std::slice::from_ref(&item)) {
            Checked::Ready(statuses) => statuses[0].outcome().is_some_and(|o| o.is_allowed()),
            Checked::Pending(_) => unreachable!("the memory store answers at once"),
        }
    }

    fn keys(&self) -> usize {
        self.store.len()
    }
}

fn governor_quota((rate, burst): Rate) -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(rate).expect("a non-zero rate"))
        .allow_burst(NonZeroU32::new(burst).expect("a non-zero burst"))
}

struct Governor(DefaultKeyedRateLimiter<IpAddr>);

impl Limiter for Governor {
    #[inline]
    fn check(&self, ip: IpAddr) -> bool {
        self.0.check_key(&ip).is_ok()
    }

    fn keys(&self) -> usize {
        self.0.len()
    }
}

/// governor's keyed DashMap limiter on `std::time::Instant`.
struct GovernorStd(
    RateLimiter<
        IpAddr,
        governor::state::keyed::DefaultKeyedStateStore<IpAddr>,
        governor::clock::MonotonicClock,
        governor::middleware::NoOpMiddleware<Instant>,
    >,
);

impl Limiter for GovernorStd {
    #[inline]
    fn check(&self, ip: IpAddr) -> bool {
        self.0.check_key(&ip).is_ok()
    }

    fn keys(&self) -> usize {
        self.0.len()
    }
}

struct Args {
    threads: Vec<usize>,
    seconds: f64,
    warmup: f64,
    cases: Vec<Case>,
    impls: Vec<Impl>,
    csv: bool,
}

const USAGE: &str = "usage: scale [--threads 1,2,4] [--seconds S] [--warmup S] \
    [--cases hot_key,many_keys,many_keys_refilled] [--impls tollgate,tollgate-instant,tollgate-coarse,tollgate-striped,governor,governor-std] \
    [--csv]";

fn parse_list<T: Copy>(
    flag: &str,
    value: &str,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<Vec<T>, String> {
    value
        .split(',')
        .map(|v| {
            all.iter().copied().find(|&x| name(x) == v).ok_or_else(|| {
                let known: Vec<_> = all.iter().map(|&x| name(x)).collect();
                format!("{flag}: unknown {v:?} (known: {})", known.join(", "))
            })
        })
        .collect()
}

fn parse_seconds(flag: &str, value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(format!(
            "{flag}: expected a number of seconds, got {value:?}"
        )),
    }
}

/// 1, 2, 4, 8, 16 up to `available`, and `available` itself if it is below 16 and not
/// one of them.
fn default_threads(available: usize) -> Vec<usize> {
    let mut threads: Vec<usize> = DEFAULT_THREADS
        .into_iter()
        .filter(|&n| n <= available)
        .collect();
    if available < 16 && !threads.contains(&available) {
        threads.push(available);
    }
    threads
}

fn parse_args(available: usize) -> Result<Args, String> {
    let mut args = Args {
        threads: default_threads(available),
        seconds: 1.0,
        warmup: 0.2,
        cases: Case::ALL.to_vec(),
        impls: Impl::ALL.to_vec(),
        csv: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--csv" {
            args.csv = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--threads" => {
                args.threads = value
                    .split(',')
                    .map(|v| match v.parse::<usize>() {
                        Ok(n) if n > 0 => Ok(n),
                        _ => Err(format!("--threads: expected counts above 0, got {v:?}")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--seconds" => args.seconds = parse_seconds(&flag, &value)?,
            "--warmup" => args.warmup = parse_seconds(&flag, &value)?,
            "--cases" => args.cases = parse_list(&flag, &value, &Case::ALL, Case::name)?,
            "--impls" => args.impls = parse_list(&flag, &value, &Impl::ALL, Impl::name)?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.seconds <= 0.0 {
        return Err("--seconds must be above 0".into());
    }
    Ok(args)
}

/// What one cell measured.
#[derive(Clone, Copy, Debug)]
struct Cell {
    /// Checks in the measured phase.
    measured: u64,
    /// Wall time of the measured phase.
    elapsed: Duration,
    /// All checks, warm-up included, and how many of them were allowed.
    checks: u64,
    allowed: u64,
    /// Keys in the limiter at the end.
    keys: usize,
}

impl Cell {
    fn per_second(&self) -> f64 {
        self.measured as f64 / self.elapsed.as_secs_f64()
    }

    /// More than 1% of the checks were denied.
    fn failed(&self) -> bool {
        self.allowed * 100 < self.checks * 99
    }
}

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// What one thread counted: checks at the start of the measured phase, checks at the
/// end, allowed checks.
fn worker(limiter: &impl Limiter, keys: &[IpAddr], start: usize, phase: &AtomicU8) -> [u64; 3] {
    let mut i = start;
    let mut checks = 0u64;
    let mut allowed = 0u64;
    let mut measure_from = None;
    loop {
        for _ in 0..BATCH {
            allowed += u64::from(black_box(limiter.check(black_box(keys[i]))));
            i += 1;
            if i == keys.len() {
                i = 0;
            }
        }
        checks += BATCH;
        match phase.load(Ordering::Relaxed) {
            WARMUP => {}
            MEASURE => {
                measure_from.get_or_insert(checks);
            }
            _ => return [measure_from.unwrap_or(checks), checks, allowed],
        }
    }
}

/// Runs one cell on `limiter`.
fn measure(limiter: impl Limiter, keys: &[IpAddr], threads: usize, args: &Args) -> Cell {
    // Insert every key before measuring (the refilled case drops them again at once in
    // tollgate's store, which is what it measures).
    for &ip in keys {
        limiter.check(ip);
    }
    let barrier = Barrier::new(threads + 1);
    let phase = AtomicU8::new(WARMUP);
    let (counts, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (limiter, barrier, phase) = (&limiter, &barrier, &phase);
                let start = t * keys.len() / threads;
                s.spawn(move || {
                    barrier.wait();
                    worker(limiter, keys, start, phase)
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_secs_f64(args.warmup));
        phase.store(MEASURE, Ordering::Relaxed);
        let from = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(args.seconds));
        phase.store(STOP, Ordering::Relaxed);
        let elapsed = from.elapsed();
        let counts: Vec<[u64; 3]> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (counts, elapsed)
    });
    Cell {
        measured: counts.iter().map(|c| c[1] - c[0]).sum(),
        elapsed,
        checks: counts.iter().map(|c| c[1]).sum(),
        allowed: counts.iter().map(|c| c[2]).sum(),
        keys: limiter.keys(),
    }
}

/// A fresh limiter of `which` for `case`, measured.
fn run_cell(which: Impl, case: Case, keys: &[IpAddr], threads: usize, args: &Args) -> Cell {
    let rate = case.rate();
    match which {
        Impl::Tollgate => {
            let store: MemoryStore<CpuClock> = MemoryStore::new();
            measure(Tollgate::new(store, rate), keys, threads, args)
        }
        Impl::TollgateInstant => measure(
            Tollgate::new(MemoryStore::with_clock(MonotonicClock::new()), rate),
            keys,
            threads,
            args,
        ),
        Impl::TollgateCoarse => measure(
            Tollgate::new(MemoryStore::with_clock(CoarseClock::default()), rate),
            keys,
            threads,
            args,
        ),
        Impl::TollgateStriped => {
            let store: MemoryStore<CpuClock> = MemoryStore::new();
            measure(Tollgate::new(store, rate).striped(8), keys, threads, args)
        }
        Impl::Governor => measure(
            Governor(RateLimiter::keyed(governor_quota(rate))),
            keys,
            threads,
            args,
        ),
        Impl::GovernorStd => measure(
            GovernorStd(RateLimiter::dashmap_with_clock(
                governor_quota(rate),
                governor::clock::MonotonicClock,
            )),
            keys,
            threads,
            args,
        ),
    }
}

/// `n` distinct IPv4 addresses.
fn addresses(n: usize) -> Vec<IpAddr> {
    (0..n as u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
        .collect()
}

fn main() -> ExitCode {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let args = match parse_args(available) {
        Ok(args) => args,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };

    let threads: Vec<String> = args.threads.iter().map(usize::to_string).collect();
    let header = format!(
        "available parallelism: {available}; threads: {}; {} s per cell after {} s of warm-up",
        threads.join(", "),
        args.seconds,
        args.warmup
    );
    let names: Vec<&str> = args.impls.iter().map(|i| i.name()).collect();
    if args.csv {
        eprintln!("{header}");
        println!("case,threads,impl,checks_per_sec,measured_checks,seconds,checks,allowed,keys");
    } else {
        println!("{header}");
        println!(
            "checks per second, millions (M/s); `tollgate keys`: keys in its store at the end\n"
        );
        print!("{:<20} {:>7}", "case", "threads");
        for name in &names {
            print!(" {name:>12}");
        }
        print!(
            " {:>17} {:>21} {:>16} {:>17}",
            "tollgate/governor", "instant/governor-std", "coarse/governor", "striped/governor"
        );
        println!(" {:>14}", "tollgate keys");
    }

    let mut failures = Vec::new();
    for &case in &args.cases {
        let keys = addresses(case.keys());
        for &n in &args.threads {
            let cells: Vec<(Impl, Cell)> = args
                .impls
                .iter()
                .map(|&which| (which, run_cell(which, case, &keys, n, &args)))
                .collect();
            for (which, cell) in &cells {
                if cell.failed() {
                    failures.push(format!(
                        "FAIL {}/{n}/{}: only {} of {} checks allowed: the denied path was measured",
                        case.name(),
                        which.name(),
                        cell.allowed,
                        cell.checks
                    ));
                }
            }
            if args.csv {
                for (which, c) in &cells {
                    println!(
                        "{},{n},{},{:.0},{},{:.6},{},{},{}",
                        case.name(),
                        which.name(),
                        c.per_second(),
                        c.measured,
                        c.elapsed.as_secs_f64(),
                        c.checks,
                        c.allowed,
                        c.keys
                    );
                }
                continue;
            }
            let of = |which: Impl| cells.iter().find(|c| c.0 == which).map(|c| c.1);
            print!("{:<20} {n:>7}", case.name());
            for (_, cell) in &cells {
                let mark = if cell.failed() { " FAIL" } else { "" };
                print!(" {:>12}", format!("{:.1}{mark}", cell.per_second() / 1e6));
            }
            let tollgate = of(Impl::Tollgate);
            let pairs = [
                (Impl::Tollgate, Impl::Governor, 17),
                (Impl::TollgateInstant, Impl::GovernorStd, 21),
                (Impl::TollgateCoarse, Impl::Governor, 16),
                (Impl::TollgateStriped, Impl::Governor, 17),
            ];
            for (ours, theirs, width) in pairs {
                let ratio = match (of(ours), of(theirs)) {
                    (Some(t), Some(o)) => format!("{:.2}", t.per_second() / o.per_second()),
                    _ => "-".into(),
                };
                print!(" {ratio:>width$}");
            }
            let keys = tollgate.map_or("-".into(), |t| t.keys.to_string());
            println!(" {keys:>14}");
        }
    }

    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            eprintln!("{f}");
        }
        ExitCode::FAILURE
    }
}
