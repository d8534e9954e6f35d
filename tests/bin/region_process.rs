//! The separate processes of `scripts/regions_stress.sh` (issue 43's table: one limit
//! across regions measured with a process per region and a proxy on the link).
//!
//! - `region_process proxy <listen-port> <to-port> <delay-ms> <hole-file> <count-file>`: a
//!   TCP proxy from a loopback port to another, every chunk forwarded `delay-ms` later in
//!   both directions; while `<hole-file>` exists nothing is forwarded (held until it is
//!   removed: a partition that heals). Writes the chunks it forwarded from its clients
//!   (about one per call over the link) to `<count-file>` once a second. Prints `ready`.
//! - `region_process region <local> <names> <urls> <rate> <burst> <interval-ms>
//!   <link-ms> <start-unix-ms> <seconds> <demand> <out-file>`: one region's instance
//!   and mover. `<names>` and `<urls>` are comma-separated, in the same order (the local
//!   region's Redis directly, the others' through their proxies). From `<start-unix-ms>`
//!   for `<seconds>`, checks the limit `api` (key `k`, `<rate>`/s with a burst of `<burst>`
//!   across all the regions) at the demand `<demand>`: `t:r,t:r,...`, requests a second
//!   at `t` seconds, linear in between, over 8 paced tasks (ticks missed are skipped).
//!   Writes to `<out-file>`: a line `slot <i> <granted> <refused> <fallback>` per 100 ms,
//!   `latency <p50-us> <p99-us> <max-us> <calls>`, and `mover <moved> <transfers>
//!   <failures>`.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tollgate::store::RedisStore;
use tollgate::store::regions::MoverSettings;
use tollgate::{LimitSpec, Limiter, Quota, Status};

const TASKS: usize = 8;
const SLOT: Duration = Duration::from_millis(100);

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match &args[1..] {
        [mode, listen, to, delay, hole, count] if mode == "proxy" => {
            proxy(
                listen.parse().expect("listen port"),
                to.parse().expect("to port"),
                Duration::from_millis(delay.parse().expect("delay")),
                hole.clone(),
                count.clone(),
            )
            .await
        }
        [
            mode,
            local,
            names,
            urls,
            rate,
            burst,
            interval,
            link,
            start,
            seconds,
            demand,
            out,
        ] if mode == "region" => {
            region(Region {
                local: local.clone(),
                names: names.split(',').map(str::to_owned).collect(),
                urls: urls.split(',').map(str::to_owned).collect(),
                quota: Quota::per_second(rate.parse().expect("rate"))
                    .burst(burst.parse().expect("burst")),
                interval: Duration::from_millis(interval.parse().expect("interval")),
                link: Duration::from_millis(link.parse().expect("link")),
                start: UNIX_EPOCH + Duration::from_millis(start.parse().expect("start")),
                seconds: seconds.parse().expect("seconds"),
                demand: demand
                    .split(',')
                    .map(|p| {
                        let (t, r) = p.split_once(':').expect("t:r");
                        (t.parse().expect("t"), r.parse().expect("r"))
                    })
                    .collect(),
                out: out.clone(),
            })
            .await
        }
        _ => {
            eprintln!("usage: see tests/bin/region_process.rs");
            std::process::exit(2);
        }
    }
}

async fn proxy(listen: u16, to: u16, delay: Duration, hole: String, count: String) {
    let listener = TcpListener::bind(("127.0.0.1", listen))
        .await
        .expect("bind");
    let forwarded = Arc::new(AtomicU64::new(0));
    let on = Arc::new(AtomicBool::new(false));
    {
        let (on, forwarded) = (Arc::clone(&on), Arc::clone(&forwarded));
        tokio::spawn(async move {
            let mut last = Instant::now();
            loop {
                on.store(std::path::Path::new(&hole).exists(), Ordering::SeqCst);
                if last.elapsed() >= Duration::from_secs(1) {
                    last = Instant::now();
                    let _ = std::fs::write(&count, forwarded.load(Ordering::Relaxed).to_string());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    while let Ok((inbound, _)) = listener.accept().await {
        let Ok(outbound) = TcpStream::connect(("127.0.0.1", to)).await else {
            continue;
        };
        let (ri, wi) = inbound.into_split();
        let (ro, wo) = outbound.into_split();
        tokio::spawn(pipe(
            ri,
            wo,
            delay,
            Arc::clone(&on),
            Some(Arc::clone(&forwarded)),
        ));
        tokio::spawn(pipe(ro, wi, delay, Arc::clone(&on), None));
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    hole: Arc<AtomicBool>,
    count: Option<Arc<AtomicU64>>,
) {
    // Chunks stamped when read, written when due: a delay, not a limit on throughput.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    while let Some((due, chunk)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        while hole.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&chunk).await.is_err() {
            return;
        }
        if let Some(c) = &count {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Region {
    local: String,
    names: Vec<String>,
    urls: Vec<String>,
    quota: Quota,
    interval: Duration,
    link: Duration,
    start: SystemTime,
    seconds: u64,
    demand: Vec<(f64, f64)>,
    out: String,
}

/// The demand at `t` seconds: linear between the points.
fn rate_at(demand: &[(f64, f64)], t: f64) -> f64 {
    let mut last = demand.first().map_or(0.0, |p| p.1);
    for w in demand.windows(2) {
        let ((t0, r0), (t1, r1)) = (w[0], w[1]);
        if t < t0 {
            return last;
        }
        if t <= t1 {
            return r0 + (r1 - r0) * (t - t0) / (t1 - t0).max(1e-9);
        }
        last = r1;
    }
    last
}

async fn region(r: Region) {
    let stores: Vec<(String, RedisStore)> = r
        .names
        .iter()
        .zip(&r.urls)
        .map(|(n, u)| {
            let store = RedisStore::open(u).expect("url");
            // The others' stores are reached over the link: their calls wait for it.
            let store = if *n == r.local {
                store
            } else {
                store.timeout(Duration::from_secs(2))
            };
            (n.clone(), store)
        })
        .collect();
    let regions = RedisStore::regions(stores, &r.local).expect("regions");
    let settings = MoverSettings::new().interval(r.interval).link_delay(r.link);
    let epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    let mover = regions.mover(
        [("api", r.quota)],
        settings,
        format!("{}-{}", r.local, std::process::id()),
        epoch,
    );
    let stats = mover.stats();
    let limiter = Limiter::builder(regions.store())
        .limit(LimitSpec::new("api", r.quota))
        .build()
        .expect("limits");

    let wait = r
        .start
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(wait).await;
    let start = Instant::now();
    let mover = tokio::spawn(mover.run());
    let slots = (r.seconds as usize) * 10 + 1;
    let counts: Arc<Vec<[AtomicU64; 3]>> =
        Arc::new((0..slots).map(|_| Default::default()).collect());
    let demand = Arc::new(r.demand);
    let end = start + Duration::from_secs(r.seconds);
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (limiter, counts, demand) = (limiter.clone(), Arc::clone(&counts), Arc::clone(&demand));
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            let mut next = Instant::now();
            loop {
                let now = Instant::now();
                if now >= end {
                    return took;
                }
                let rate = rate_at(&demand, (now - start).as_secs_f64()) / TASKS as f64;
                if rate <= 0.0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    next = Instant::now();
                    continue;
                }
                next += Duration::from_secs_f64(1.0 / rate);
                if next < now - Duration::from_millis(100) {
                    next = now; // behind: the ticks missed are skipped
                }
                tokio::time::sleep_until(next).await;
                let sent = Instant::now();
                let d = limiter.check("api", "k", 1).await.expect("check");
                took.push(sent.elapsed().as_micros() as u64);
                let slot = ((sent - start).as_millis() / SLOT.as_millis()) as usize;
                let Some(c) = counts.get(slot) else { continue };
                let i = usize::from(!d.allowed());
                c[i].fetch_add(1, Ordering::Relaxed);
                if matches!(d.status(), Status::Fallback(_)) {
                    c[2].fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let mut took = Vec::new();
    for t in tasks {
        took.extend(t.await.expect("task"));
    }
    mover.abort();
    took.sort_unstable();
    let at = |q: f64| {
        took.get(((took.len() as f64 * q) as usize).min(took.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let mut out = String::new();
    for (i, c) in counts.iter().enumerate() {
        let [g, d, f] = c.each_ref().map(|a| a.load(Ordering::Relaxed));
        out.push_str(&format!("slot {i} {g} {d} {f}\n"));
    }
    out.push_str(&format!(
        "latency {} {} {} {}\n",
        at(0.5),
        at(0.99),
        took.last().copied().unwrap_or(0),
        took.len()
    ));
    let s = stats.report();
    out.push_str(&format!(
        "mover {} {} {}\n",
        s.moved, s.transfers, s.failures
    ));
    std::fs::write(&r.out, out).expect("write out");
}
