//! One limit across two regions: each region decides from its own Redis, the regions' movers
//! carry unspent quota between them, and the bound holds through a partition.
//!
//! The example starts two `redis-server` processes on free loopback ports ("eu" and "us",
//! no persistence, in temporary directories) and a TCP proxy for each direction of the
//! link between them (30 ms each way; it can black-hole the link). Each region reaches
//! its own Redis directly and the other's through the proxy only. One limit, 100 a second
//! with a burst of 100, is split between the regions (50 / 50); eu's demand is 150 a
//! second and us's 20, so us's mover moves what us does not spend to eu.
//!
//! Three phases: the link up; the link black-holed (a partition, 3 s): each region spends
//! what it holds, and no request waits on the link; the link healed: the transfer cut by
//! the partition lands once and the quota follows the demand again. For each phase and for
//! the whole run the example prints the grants against the bound of
//! `tollgate::store::regions` (`bound`, `partition_bound`), and fails if one is exceeded.
//!
//! ```text
//! cargo run -p tollgate --example regions --features redis
//! ```
//!
//! It needs `redis-server` on the `PATH` (`scripts/test.sh` installs it). `cargo test
//! --features redis` runs it too (`test = true`, no harness: its `main` is the test).

use std::net::{TcpListener as StdListener, TcpStream as StdStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tollgate::store::RedisStore;
use tollgate::store::regions::{MoverSettings, MoverStats, bound, partition_bound};
use tollgate::{LimitSpec, Limiter, Quota, Status};

type Error = Box<dyn std::error::Error>;

/// The link's delay each way.
const LINK: Duration = Duration::from_millis(30);
/// How long the partition lasts.
const PARTITION: Duration = Duration::from_secs(3);
/// The demand of each region, requests a second.
const DEMAND: [(&str, u64); 2] = [("eu", 150), ("us", 20)];

/// A `redis-server` of this example: killed when dropped.
struct Redis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Redis {
    /// Starts one on a free loopback port and waits until it answers.
    fn start() -> Result<Redis, Error> {
        for _ in 0..5 {
            let port = StdListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let dir = tempfile::tempdir()?;
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("redis-server: {e} (is it installed?)"))?;
            let mut redis = Redis {
                child,
                port,
                _dir: dir,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if redis.child.try_wait()?.is_some() {
                    break; // the port was taken meanwhile: another one
                }
                if StdStream::connect(("127.0.0.1", port)).is_ok() {
                    return Ok(redis);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err("redis-server did not start".into())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One direction of the link: a TCP proxy to a region's Redis, each chunk forwarded
/// `LINK` later; while the black hole is on, nothing is forwarded (held until it ends, as
/// TCP retransmits through a partition that heals).
struct Link {
    port: u16,
    hole: Arc<AtomicBool>,
}

impl Link {
    async fn to(port: u16) -> Result<Link, Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let hole = Arc::new(AtomicBool::new(false));
        let link = Link {
            port: listener.local_addr()?.port(),
            hole: Arc::clone(&hole),
        };
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", port)).await else {
                    continue;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::spawn(pipe(ri, wo, Arc::clone(&hole)));
                tokio::spawn(pipe(ro, wi, Arc::clone(&hole)));
            }
        });
        Ok(link)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, hole: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        tokio::time::sleep(LINK).await;
        while hole.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// One decision: when its answer came, whether it was granted, how long it took, and
/// whether the region's own Redis decided it (not a failure policy).
#[derive(Clone, Copy)]
struct Call {
    at: Instant,
    granted: bool,
    took: Duration,
    from_redis: bool,
}

/// A region's instance: `rate` checks a second until `stop`.
async fn demand(limiter: Limiter, rate: u64, stop: Arc<AtomicBool>) -> Vec<Call> {
    let mut every = tokio::time::interval(Duration::from_secs(1) / rate as u32);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut calls = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        every.tick().await;
        let start = Instant::now();
        let decision = limiter.check("api", "customer-1", 1).await;
        let took = start.elapsed();
        let (granted, from_redis) = match &decision {
            Ok(d) => (d.allowed(), matches!(d.status(), Status::Checked(_))),
            Err(_) => (false, false),
        };
        calls.push(Call {
            at: Instant::now(),
            granted,
            took,
            from_redis,
        });
    }
    calls
}

/// Waits for `done`, checked every 10 ms, at most 20 s.
async fn until(what: &str, mut done: impl FnMut() -> bool) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("gave up waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

fn p99(calls: &[&Call]) -> Duration {
    let mut took: Vec<Duration> = calls.iter().map(|c| c.took).collect();
    took.sort();
    took.get((took.len() * 99 / 100).min(took.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let quota = Quota::per_second(100);
    let settings = MoverSettings::new()
        .interval(Duration::from_millis(100))
        .link_delay(LINK);
    let m = settings.max_move(quota);

    let (eu, us) = (Redis::start()?, Redis::start()?);
    // eu reaches us's Redis through one proxy, us reaches eu's through the other.
    let (to_us, to_eu) = (Link::to(us.port).await?, Link::to(eu.port).await?);
    let partition = |on: bool| {
        to_us.hole.store(on, Ordering::SeqCst);
        to_eu.hole.store(on, Ordering::SeqCst);
    };
    let open = |url: &str| -> Result<RedisStore, Error> {
        Ok(RedisStore::open(url)?
            .prefix("regions-example:")
            .timeout(Duration::from_millis(500)))
    };
    let local = |port: u16| format!("redis://127.0.0.1:{port}");
    let at_eu = RedisStore::regions(
        [("eu", open(&local(eu.port))?), ("us", open(&to_us.url())?)],
        "eu",
    )?;
    let at_us = RedisStore::regions(
        [("eu", open(&to_eu.url())?), ("us", open(&local(us.port))?)],
        "us",
    )?;
    println!(
        "eu's Redis on port {}, us's on {}; the link delays {} ms each way",
        eu.port,
        us.port,
        LINK.as_millis()
    );

    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let mut stats: Vec<Arc<MoverStats>> = Vec::new();
    let mut tasks = Vec::new();
    for (i, regions) in [&at_eu, &at_us].into_iter().enumerate() {
        let mover = regions.mover(
            [("api", quota)],
            settings.clone(),
            format!("{}-1", regions.local()),
            epoch + i as u64,
        );
        stats.push(mover.stats());
        tasks.push(tokio::spawn(mover.run()));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut load = Vec::new();
    for ((_, rate), regions) in DEMAND.into_iter().zip([&at_eu, &at_us]) {
        let limiter = Limiter::builder(regions.store())
            .limit(LimitSpec::new("api", quota))
            .build()?;
        load.push(tokio::spawn(demand(limiter, rate, Arc::clone(&stop))));
    }

    // The link up: us's mover moves what us does not spend to eu.
    until("us's mover to move tokens to eu", || {
        stats[1].report().moved > 0
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The partition. Its window starts once both movers found the other region out of
    // reach: whatever was on the link before it has landed or is held.
    partition(true);
    until("both movers to see the partition", || {
        stats.iter().all(|s| s.report().unreachable > 0)
    })
    .await?;
    let cut = Instant::now();
    tokio::time::sleep(PARTITION).await;
    let healed = Instant::now();
    partition(false);

    // Healed: the movers reach each other again and transfers land.
    let transfers = stats[1].report().transfers;
    until("us's mover to land a transfer after the partition", || {
        stats[1].report().transfers > transfers && stats[1].report().unreachable == 0
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let mut calls: Vec<(usize, Call)> = Vec::new();
    for (i, task) in load.into_iter().enumerate() {
        calls.extend(task.await?.into_iter().map(|c| (i, c)));
    }
    let end = Instant::now();
    for task in tasks {
        task.abort();
    }

    // A call answered at `at` was decided at most its own duration earlier: a window
    // `[from, to]` of answers is a window of decisions longer by the slowest call.
    let slowest = calls.iter().map(|(_, c)| c.took).max().unwrap_or_default();
    let mut ok = true;
    println!(
        "\n{:<10} {:>7} {:>9} {:>9} {:>7} {:>7} {:>11} {:>10}",
        "phase", "length", "eu grants", "us grants", "total", "bound", "one bucket", "p99 (eu)"
    );
    let phases = [
        ("linked", start, cut, false),
        ("partition", cut, healed, true),
        ("healed", healed, end, false),
        ("whole run", start, end, false),
    ];
    for (name, from, to, cut_off) in phases {
        let inside: Vec<&(usize, Call)> = calls
            .iter()
            .filter(|(_, c)| c.at >= from && c.at <= to)
            .collect();
        let granted = |region: usize| {
            inside
                .iter()
                .filter(|(i, c)| *i == region && c.granted)
                .count() as u64
        };
        let window = (to - from) + slowest;
        let most = if cut_off {
            partition_bound(quota, 2, window)
        } else {
            bound(quota, 2, m, window)
        };
        let eu_calls: Vec<&Call> = inside
            .iter()
            .filter(|(i, _)| *i == 0)
            .map(|(_, c)| c)
            .collect();
        let total = granted(0) + granted(1);
        println!(
            "{name:<10} {:>6.1}s {:>9} {:>9} {:>7} {:>7} {:>11} {:>8.1}ms",
            (to - from).as_secs_f64(),
            granted(0),
            granted(1),
            total,
            most,
            // What one global bucket could grant at most over the window.
            bound(quota, 1, 0, window) - 1,
            p99(&eu_calls).as_secs_f64() * 1e3
        );
        if total > most {
            println!("  over the bound!");
            ok = false;
        }
    }
    let not_redis = calls.iter().filter(|(_, c)| !c.from_redis).count();
    let report = stats[1].report();
    println!(
        "\nus's mover moved {} tokens in {} transfers; {} calls failed (the partition)",
        report.moved, report.transfers, report.failures
    );
    println!(
        "every decision from its region's own Redis: {} (of {} calls, {} were not)",
        not_redis == 0,
        calls.len(),
        not_redis
    );
    if not_redis > 0 {
        ok = false;
    }
    if !ok {
        return Err("the regions exceeded their bound, or a request waited on the link".into());
    }
    println!("the bound held in every phase");
    Ok(())
}
