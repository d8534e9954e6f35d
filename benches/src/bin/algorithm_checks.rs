//! Runs a number of memory-store checks with one algorithm, for counting what they cost
//! with a tool outside the process (`scripts/algorithm_count.sh` runs it under valgrind's
//! cachegrind and reports instructions per check).
//!
//!   cargo run -p tollgate-bench --release --bin algorithm_checks -- <algorithm> <checks>
//!
//! The checks are those of the memory benchmark's `memory/algorithm` group: 10,000 keys
//! (addresses), inserted before the counted checks and then checked round-robin, every
//! check allowed, with the same quotas (`gcra`, `fixed-window`, `fixed-window-random`,
//! `sliding-window`, `sliding-log-100`). The store reads a [`FakeClock`] that moves 50 ns
//! after each check, about the pace of the criterion benchmark on the development VM, so
//! that a sliding log holds the same few dozen entries and two runs do the same work.
//!
//! A check that is not allowed ends the run with an error: the refused path is not the
//! one measured.

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::time::Duration;

use tollgate::clock::FakeClock;
use tollgate::key::Key;
use tollgate::store::{Checked, Item, MemoryStore, Store};
use tollgate::{Algorithm, Quota};
use tollgate_bench::counted;

const KEYS: u32 = 10_000;
const STEP: Duration = Duration::from_nanos(50);

/// The quota and algorithm of `name`, as in `benches/memory.rs`.
fn limit(name: &str) -> Option<(Quota, Algorithm)> {
    let q = |n, d: Duration| Quota::new(n, d).expect("a valid quota");
    let day = Duration::from_secs(86_400);
    Some(match name {
        "gcra" => (
            Quota::per_second(100).burst(u64::from(u32::MAX)),
            Algorithm::Gcra,
        ),
        "fixed-window" => (q(u64::from(u32::MAX), day), Algorithm::fixed_window()),
        "fixed-window-random" => (
            q(u64::from(u32::MAX), day),
            Algorithm::fixed_window_random(),
        ),
        "sliding-window" => (
            q(65_535, Duration::from_millis(65_535)),
            Algorithm::SlidingWindow,
        ),
        "sliding-log-100" => (q(100, Duration::from_millis(10)), Algorithm::SlidingLog),
        _ => return None,
    })
}

fn main() -> ExitCode {
    let (name, (quota, algorithm), checks) =
        match counted::args("algorithm_checks", "<algorithm> <checks>", limit) {
            Ok(args) => args,
            Err(code) => return code,
        };
    let clock = FakeClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let table = store.table("per-ip");
    let addresses: Vec<IpAddr> = (0..KEYS)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
        .collect();
    let check = |ip: IpAddr| {
        let item = Item::new(&table, Key::from_part(ip), quota, 1).algorithm(algorithm);
        let allowed = match store.check(std::slice::from_ref(&item)) {
            Checked::Ready(statuses) => statuses[0].outcome().is_some_and(|o| o.is_allowed()),
            Checked::Pending(_) => false,
        };
        clock.advance(STEP);
        allowed
    };
    // Every key is in the table before the counted checks.
    for &ip in &addresses {
        if !check(ip) {
            eprintln!("{name}: a first check was refused");
            return ExitCode::FAILURE;
        }
    }
    for (n, &ip) in addresses.iter().cycle().take(checks as usize).enumerate() {
        if !std::hint::black_box(check(ip)) {
            eprintln!("{name}: check {n} was refused");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
