//! Drives a `RedisStore` directly: decisions per second and latency percentiles.
//!
//! ```text
//! cargo run -p tollgate-bench --release --bin redis_bench --features redis -- \
//!     --url redis://127.0.0.1:6379 --tasks 64 --seconds 5 --limits 3 --algorithm gcra
//! ```
//!
//! `--algorithm` is `gcra` (default; 10^6 per second, burst 10^9), `fixed-window`
//! (2^32 − 1 per day), `sliding-window` (65,535 per 65.535 s) or `sliding-log` (1,000 per
//! 10 s: a key's log holds a few dozen entries at the usual rates).
//!
//! Each of `--tasks` tasks checks requests of `--limits` limits each (keys drawn from a pool
//! of `--keys` per limit, 10,000 by default; `--keys 1`: one hot key every request shares;
//! quotas so large every request passes, so every decision writes),
//! one after the other, for `--seconds`, on one thread (as `redis-benchmark` is one
//! event loop: on a small machine the client and Redis then compete for fewer cores). The
//! last line is
//! `decisions_per_sec=… p50_us=… p99_us=… script_us_per_decision=… redis_cpu_us_per_decision=…`,
//! one decision being one request over all its limits; the last two are Redis's own
//! accounting over the run (`CONFIG RESETSTAT` first): the scripts' time from
//! `INFO commandstats`, and the server's whole CPU time (`INFO cpu`, reading and answering
//! clients included), each per decision. `--batch N` (default 128, the store's default)
//! sets [`RedisStore::batch`]; `--batch 1` sends each check in a call of its own.
//! `--connections N` (default 1) opens the store with [`RedisStore::open_pool`], and
//! `--threads N` (default 1) runs the tasks on a multi-threaded runtime of N workers. `scripts/redis_compare.sh` runs it beside `redis-benchmark` on the same script.
//!
//! With the feature `redis-tls`, `--ca FILE` opens a `rediss://` URL with
//! [`RedisStore::open_tls`] trusting that CA, and `--admin-url URL` reads Redis's
//! statistics over another URL (the same server's plain port): `scripts/tls_compare.sh`
//! runs it over TLS and plain, in alternating rounds.

use std::time::{Duration, Instant};

use tollgate::key::Key;
use tollgate::store::{Checked, Item, RedisStore, Store};
use tollgate::{Algorithm, Quota, Status};

struct Args {
    url: String,
    tasks: usize,
    seconds: u64,
    limits: usize,
    prefix: String,
    algorithm: String,
    batch: usize,
    connections: usize,
    threads: usize,
    /// The pool of keys per limit (1: one hot key every request shares).
    keys: usize,
    /// The CA of a `rediss://` URL (feature `redis-tls`).
    ca: Option<String>,
    /// Where Redis's statistics are read (default: `url`).
    admin_url: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: "redis://127.0.0.1:6379".into(),
        tasks: 64,
        seconds: 5,
        limits: 1,
        prefix: "tollgate-bench:".into(),
        algorithm: "gcra".into(),
        batch: 128,
        connections: 1,
        threads: 1,
        keys: 10_000,
        ca: None,
        admin_url: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => args.url = value()?,
            "--tasks" => args.tasks = value()?.parse().map_err(|e| format!("--tasks: {e}"))?,
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            "--limits" => args.limits = value()?.parse().map_err(|e| format!("--limits: {e}"))?,
            "--prefix" => args.prefix = value()?,
            "--algorithm" => args.algorithm = value()?,
            "--batch" => args.batch = value()?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--connections" => {
                args.connections = value()?
                    .parse()
                    .map_err(|e| format!("--connections: {e}"))?
            }
            "--threads" => {
                args.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?
            }
            "--keys" => args.keys = value()?.parse().map_err(|e| format!("--keys: {e}"))?,
            "--ca" => args.ca = Some(value()?),
            "--admin-url" => args.admin_url = Some(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.tasks == 0
        || args.limits == 0
        || args.seconds == 0
        || args.connections == 0
        || args.threads == 0
        || args.keys == 0
    {
        return Err(
            "--tasks, --limits, --seconds, --connections, --threads and --keys must be at least 1"
                .into(),
        );
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().map_err(|e| {
        format!("{e}\nusage: redis_bench --url URL --tasks N --seconds S --limits L [--prefix P] [--algorithm A] [--batch N] [--connections N] [--threads N] [--keys N] [--ca FILE] [--admin-url URL]")
    })?;
    let runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(bench(args))
}

async fn bench(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let client = redis::Client::open(args.admin_url.as_deref().unwrap_or(&args.url))?;
    let mut admin = client.get_multiplexed_async_connection().await?;
    let store = match &args.ca {
        None => RedisStore::open_pool(&args.url, args.connections)?,
        #[cfg(feature = "redis-tls")]
        Some(ca) => {
            let tls = tollgate::store::RedisTls::new().ca_file(ca)?;
            RedisStore::open_tls(&args.url, args.connections, &tls)?
        }
        #[cfg(not(feature = "redis-tls"))]
        Some(_) => return Err("--ca needs the feature redis-tls".into()),
    };
    let store = store
        .batch(args.batch)
        .prefix(args.prefix.as_str())
        .deny_cache(false)
        .timeout(Duration::from_secs(2));
    let tables: Vec<_> = (0..args.limits)
        .map(|i| store.table(&format!("l{i}")))
        .collect();
    let tables = std::sync::Arc::new(tables);
    let q = |n, secs| Quota::new(n, Duration::from_millis(secs)).expect("a valid quota");
    let (quota, algorithm) = match args.algorithm.as_str() {
        "gcra" => (
            Quota::per_second(1_000_000).burst(1_000_000_000),
            Algorithm::Gcra,
        ),
        "fixed-window" => (
            q(u64::from(u32::MAX), 86_400_000),
            Algorithm::fixed_window(),
        ),
        "sliding-window" => (q(65_535, 65_535), Algorithm::SlidingWindow),
        "sliding-log" => (q(1_000, 10_000), Algorithm::SlidingLog),
        other => return Err(format!("unknown --algorithm {other}").into()),
    };

    // Warm up: load the script, open the connection.
    let warm = Item::new(&tables[0], Key::global(), quota, 0).algorithm(algorithm);
    if let Checked::Pending(f) = store.check(std::slice::from_ref(&warm)) {
        f.await;
    }

    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut admin)
        .await?;
    let cpu_before = tollgate_bench::redis_stats::cpu_us(&mut admin).await;
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let handles: Vec<_> = (0..args.tasks)
        .map(|task| {
            let (store, tables) = (store.clone(), tables.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(200_000);
                let mut failures = 0u64;
                let keys = args.keys;
                let mut n = task * 7_919;
                while Instant::now() < deadline {
                    n += 1;
                    let items: Vec<_> = tables
                        .iter()
                        .enumerate()
                        .map(|(i, t)| {
                            Item::new(t, Key::from_part(((n + i * 31) % keys) as u32), quota, 1)
                                .algorithm(algorithm)
                        })
                        .collect();
                    let t0 = Instant::now();
                    let statuses = match store.check(&items) {
                        Checked::Ready(s) => s,
                        Checked::Pending(f) => f.await,
                    };
                    latencies.push(t0.elapsed().as_micros() as u32);
                    if !statuses
                        .iter()
                        .all(|s| matches!(s, Status::Checked(o) if o.is_allowed()))
                    {
                        failures += 1;
                    }
                }
                (latencies, failures)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut failures = 0;
    for h in handles {
        let (l, f) = h.await?;
        latencies.extend(l);
        failures += f;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = tollgate_bench::redis_stats::cpu_us(&mut admin).await - cpu_before;
    let (calls, script_us) = tollgate_bench::redis_stats::scripts(&mut admin).await;
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "host={} tasks={} limits={} algorithm={} batch={} connections={} threads={} seconds={:.2} decisions={} not_allowed={failures} script_calls={calls}",
        // The host only: the URL may hold a password.
        args.url.rsplit('@').next().unwrap_or(&args.url),
        args.tasks,
        args.limits,
        args.algorithm,
        args.batch,
        args.connections,
        args.threads,
        elapsed,
        latencies.len()
    );
    let decisions = latencies.len().max(1) as f64;
    println!(
        "decisions_per_sec={:.0} p50_us={} p99_us={} script_us_per_decision={:.2} redis_cpu_us_per_decision={:.2}",
        latencies.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        script_us / decisions,
        cpu / decisions,
    );
    Ok(())
}
