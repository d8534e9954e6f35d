//! Lease mode against one check per request, on one Redis: four instances (four
//! `RedisStore`s, each with its own connection and leases) in one process, side by side in
//! the same run.
//!
//! ```text
//! cargo run -p tollgate-bench --release --bin lease_bench --features redis -- \
//!     --url redis://127.0.0.1:6379 --tasks 64 --seconds 5
//! ```
//!
//! Scenarios, each run with `Lease::auto()` and without a lease (then with one call per
//! request: [`RedisStore::batch`]`(1)`):
//!
//! - `hot-under`: one key for every request, a quota no run reaches (10^6/s);
//! - `hot-over`: one key, 1,000/s with a burst of 1,000, far below what the tasks send:
//!   grants against the exact limiter's `burst + d/T` and the lease bound `+ N·L`;
//! - `hot-2x`, `hot-10x`: the same key and quota, the tasks together sending 2× and 10×
//!   the limit, paced (each task on its own interval);
//! - `keys-under`: 10,000 keys drawn at random, a quota no run reaches.
//!
//! Per run: decisions per second, Redis calls per 1,000 decisions (`EVALSHA` and `EVAL` in
//! `INFO commandstats` after `CONFIG RESETSTAT`, with the server's CPU time per decision),
//! the share of decisions made without a call, latency p50/p99, and grants: for the
//! scenarios over the limit, against `burst + d/T`, and with the tokens the instances hold
//! at the end (those due: taken from the bucket's past; the rest are reserved, due after
//! the run, which the exact limiter would not have granted in it either). Each task yields
//! after each decision, as a server's requests, each with its own I/O, would.
//! `scripts/lease_compare.sh` starts a throwaway Redis and runs it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate::store::RedisStore;
use tollgate::{Lease, LimitSpec, Limiter, Quota};

struct Args {
    url: String,
    tasks: usize,
    seconds: u64,
    /// Only this scenario, in lease mode, printing the grants of each second (for a run
    /// during which Redis is killed and restarted empty: `scripts/lease_compare.sh fault`).
    timeline: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: "redis://127.0.0.1:6379".into(),
        tasks: 64,
        seconds: 5,
        timeline: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => args.url = value()?,
            "--timeline" => args.timeline = Some(value()?),
            "--tasks" => args.tasks = value()?.parse().map_err(|e| format!("--tasks: {e}"))?,
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.tasks == 0 || args.seconds == 0 {
        return Err("--tasks and --seconds must be at least 1".into());
    }
    Ok(args)
}

#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    quota: Quota,
    keys: u64,
    /// What the tasks send together, in multiples of the limit (`None`: as fast as they
    /// can).
    load: Option<u32>,
}

struct Run {
    /// Grants in each second of the run: by Redis or a lease, and by the failure policy.
    per_second: Vec<(u64, u64)>,
    /// Decisions made by a failure policy (the fallback) rather than Redis or a lease.
    fallback: u64,
    decisions: u64,
    granted: u64,
    seconds: f64,
    commands: u64,
    usec: f64,
    local: u64,
    /// Tokens leased and neither spent nor given back when the run stopped.
    held: u64,
    /// Of those, the ones not due yet (reserved ahead: the bucket's debt at the end).
    reserved: u64,
    p50_us: f64,
    p99_us: f64,
}

async fn run(args: &Args, s: Scenario, lease: bool, round: u32) -> Run {
    let client = redis::Client::open(args.url.as_str()).expect("URL");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis");
    let mut limiters = Vec::new();
    let mut stores = Vec::new();
    let prefix = format!("lease-bench:{}:{}:{round}:", s.name, lease);
    for _ in 0..4 {
        let conn = client.get_connection_manager().await.expect("Redis");
        // Without a lease: one call per request (`batch(1)`), the exact limiter as
        // users of a per-request script know it.
        let store = RedisStore::new(conn)
            .batch(if lease { 128 } else { 1 })
            .prefix(&prefix)
            .timeout(Duration::from_secs(1));
        let mut spec = LimitSpec::new("limit", s.quota);
        if lease {
            spec = spec.lease(Lease::auto());
        }
        limiters.push(
            Limiter::builder(store.clone())
                .limit(spec)
                .build()
                .expect("limit"),
        );
        stores.push(store);
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .expect("CONFIG RESETSTAT");
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.tasks)
        .map(|i| {
            let limiter = limiters[i % 4].clone();
            let stop = stop.clone();
            let tasks = args.tasks;
            tokio::spawn(async move {
                // Paced: this task's share of `load` times the limit's rate.
                let mut pace = s.load.map(|load| {
                    let period = s.quota.emission_interval().as_nanos() as u64 * tasks as u64
                        / u64::from(load);
                    tokio::time::interval(Duration::from_nanos(period))
                });
                let mut latencies = Vec::with_capacity(1 << 16);
                let mut granted = 0u64;
                let mut per_second = vec![(0u64, 0u64); 1];
                let mut fallback = 0u64;
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64);
                while !stop.load(Ordering::Relaxed) {
                    if let Some(pace) = &mut pace {
                        pace.tick().await;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = x % s.keys;
                    let t = Instant::now();
                    let d = limiter.check("limit", key, 1).await.expect("a known limit");
                    latencies.push(u32::try_from(t.elapsed().as_nanos()).unwrap_or(u32::MAX));
                    granted += u64::from(d.allowed());
                    let by_policy = !matches!(d.status(), tollgate::Status::Checked(_));
                    if d.allowed() {
                        let second = start.elapsed().as_secs() as usize;
                        if per_second.len() <= second {
                            per_second.resize(second + 1, (0, 0));
                        }
                        if by_policy {
                            per_second[second].1 += 1;
                        } else {
                            per_second[second].0 += 1;
                        }
                    }
                    fallback += u64::from(by_policy);
                    tokio::task::yield_now().await;
                }
                (latencies, granted, per_second, fallback)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut granted = 0;
    let mut per_second: Vec<(u64, u64)> = Vec::new();
    let mut fallback = 0;
    for t in tasks {
        let (l, g, p, f) = t.await.expect("task");
        latencies.extend(l);
        granted += g;
        fallback += f;
        if per_second.len() < p.len() {
            per_second.resize(p.len(), (0, 0));
        }
        for (total, (shared, policy)) in per_second.iter_mut().zip(p) {
            total.0 += shared;
            total.1 += policy;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // What the instances hold, and the bucket's debt, as the run stops (before the
    // latencies are sorted: the debt shrinks by a token per interval).
    let held = stores
        .iter()
        .map(|s| {
            let st = s.lease_stats();
            st.leased_tokens - st.local_allowed - st.returned_tokens
        })
        .sum();
    // The bucket's debt: tokens reserved by leases and not due yet (a look takes nothing).
    let reserved = if s.keys == 1 {
        let look = limiters[0].peek("limit", 0u64).await;
        let t = s.quota.emission_interval().as_nanos();
        look.ok()
            .and_then(|d| d.outcome().map(|o| o.wait().as_nanos().div_ceil(t)))
            .map_or(0, |n| n as u64)
    } else {
        0
    };
    // A fresh connection: Redis may have been restarted meanwhile (`--timeline` runs).
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis");
    let (commands, usec) = tollgate_bench::redis_stats::scripts(&mut admin).await;
    latencies.sort_unstable();
    let pct = |p: f64| {
        let i = ((latencies.len() as f64 - 1.0) * p) as usize;
        f64::from(latencies[i]) / 1_000.0
    };
    let local = stores
        .iter()
        .map(|s| {
            let st = s.lease_stats();
            st.local_allowed + st.local_refused
        })
        .sum();
    Run {
        per_second,
        fallback,
        held,
        reserved,
        decisions: latencies.len() as u64,
        granted,
        seconds,
        commands,
        usec,
        local,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\nusage: lease_bench [--url URL] [--tasks N] [--seconds S]");
            std::process::exit(2);
        }
    };
    let scenarios = [
        Scenario {
            name: "hot-under",
            quota: Quota::per_second(1_000_000).burst(1_000_000),
            keys: 1,
            load: None,
        },
        Scenario {
            name: "hot-2x",
            quota: Quota::per_second(1_000).burst(1_000),
            keys: 1,
            load: Some(2),
        },
        Scenario {
            name: "hot-10x",
            quota: Quota::per_second(1_000).burst(1_000),
            keys: 1,
            load: Some(10),
        },
        Scenario {
            name: "hot-over",
            quota: Quota::per_second(1_000).burst(1_000),
            keys: 1,
            load: None,
        },
        Scenario {
            name: "keys-under",
            quota: Quota::per_second(1_000_000).burst(1_000_000),
            keys: 10_000,
            load: None,
        },
    ];
    if let Some(name) = &args.timeline {
        let Some(s) = scenarios.iter().find(|s| s.name == name) else {
            eprintln!("no scenario {name}");
            std::process::exit(2);
        };
        let r = run(&args, *s, true, 9).await;
        let rate = s.quota.rate() as f64 / s.quota.period().as_secs_f64();
        println!("second  shared  fallback");
        for (i, (shared, policy)) in r.per_second.iter().enumerate() {
            println!("{i:>6}  {shared:>6}  {policy:>8}");
        }
        println!(
            "{} decisions, {} granted over {:.1} s ({:.0}/s against a limit of {rate:.0}/s), {} by the failure policy; every decision was an answer",
            r.decisions,
            r.granted,
            r.seconds,
            r.granted as f64 / r.seconds,
            r.fallback
        );
        return;
    }
    println!(
        "{:<11} {:<6} {:>12} {:>14} {:>13} {:>8} {:>8} {:>8} {:>9}  grants",
        "scenario",
        "mode",
        "decisions/s",
        "calls/1000 dec",
        "redis us/dec",
        "local",
        "p50 us",
        "p99 us",
        "granted"
    );
    for s in scenarios {
        // Interleaved, twice: lease, exact, lease, exact.
        for round in 0..2 {
            for lease in [true, false] {
                let r = run(&args, s, lease, round).await;
                let grants = if s.name.starts_with("hot-") && s.name != "hot-under" {
                    let exact = 1_000.0 + r.seconds * 1_000.0;
                    let bound = exact + 4.0 * 125.0;
                    let due = r.held.saturating_sub(r.reserved);
                    format!(
                        "{:.3} of burst + d/T ({:.0}), {:.3} with the {} due tokens held at the end ({} more reserved); lease bound {:.0}",
                        r.granted as f64 / exact,
                        exact,
                        (r.granted + due) as f64 / exact,
                        due,
                        r.reserved,
                        bound
                    )
                } else {
                    String::new()
                };
                println!(
                    "{:<11} {:<6} {:>12.0} {:>14.2} {:>13.3} {:>7.1}% {:>8.1} {:>8.1} {:>9}  {}",
                    s.name,
                    if lease { "lease" } else { "exact" },
                    r.decisions as f64 / r.seconds,
                    r.commands as f64 * 1_000.0 / r.decisions.max(1) as f64,
                    r.usec / r.decisions.max(1) as f64,
                    r.local as f64 * 100.0 / r.decisions.max(1) as f64,
                    r.p50_us,
                    r.p99_us,
                    r.granted,
                    grants
                );
            }
        }
    }
}
