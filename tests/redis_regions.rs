//! One limit across regions on real Redis servers, one per region, the link between them
//! through a proxy in this process that delays and black-holes: transfers applied once
//! (`lua/regions.lua`), the region's mover elected by a lock with a TTL, the quota moving to
//! the region that spends it, a transfer cut by a black hole landing once after it, taken
//! over by the next mover when its leader is killed meanwhile.
//! The bound itself is proved on the simulated regions (`regions_world.rs`).
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::redis::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::key::Key;
use tollgate::store::RedisStore;
use tollgate::store::regions::{
    Escrow, MoverReport, MoverSettings, MoverStats, Transfer, TransferId, bound, share,
};
use tollgate::{LimitSpec, Limiter, Quota, Status};

async fn store(url: &str) -> RedisStore {
    RedisStore::open(url)
        .unwrap()
        .timeout(Duration::from_secs(2))
}

/// A region's own Redis: a second's timeout (the outage windows below count on it), so
/// that a slow answer on a loaded machine is still Redis's, not the failure policy's.
fn local(server: &RedisServer) -> RedisStore {
    RedisStore::open(&server.url())
        .unwrap()
        .timeout(Duration::from_secs(1))
}

/// A TCP proxy to `to`: each chunk forwarded `delay` later; held while the black hole is
/// on.
struct Proxy {
    port: u16,
    hole: Arc<AtomicBool>,
}

async fn proxy(to: u16, delay: Duration) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hole = Arc::new(AtomicBool::new(false));
    let h = Arc::clone(&hole);
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = TcpStream::connect(("127.0.0.1", to)).await else {
                continue;
            };
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            tokio::spawn(pipe(ri, wo, delay, Arc::clone(&h)));
            tokio::spawn(pipe(ro, wi, delay, Arc::clone(&h)));
        }
    });
    Proxy { port, hole }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    hole: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        tokio::time::sleep(delay).await;
        while hole.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A region's movers seen together: the leading one's report (the first's if none
/// leads), with the moves of all (a lead that changed hands took the transfer over).
fn region(movers: &[&Arc<MoverStats>]) -> MoverReport {
    let reports: Vec<MoverReport> = movers.iter().map(|s| s.report()).collect();
    let mut report = reports
        .iter()
        .find(|r| r.leading)
        .copied()
        .unwrap_or(reports[0]);
    report.moved = reports.iter().map(|r| r.moved).sum();
    report.transfers = reports.iter().map(|r| r.transfers).sum();
    report
}

/// Waits for `done` (polled every 10 ms) at most `within`.
async fn until(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

fn id(seq: u64) -> TransferId {
    TransferId {
        region: 0,
        epoch: 7,
        seq,
    }
}

#[tokio::test]
async fn transfers_apply_once_and_one_holder_leads() {
    let server = RedisServer::start();
    let store = store(&server.url()).await;
    let escrow = store.escrow();
    assert!(format!("{escrow:?}").starts_with("RedisEscrow { backend: "));
    let q = Quota::per_hour(10);
    let k = Key::from_part("k");
    let t = |seq| Transfer::new(id(seq), "api", Key::from_part("k"), 1);
    assert_eq!(escrow.outstanding().await.unwrap(), None);
    assert_eq!(escrow.debit(&t(1), q, 4, 0).await.unwrap(), 4);
    assert_eq!(escrow.debit(&t(1), q, 4, 0).await.unwrap(), 4);
    // The region's one transfer outstanding, as a mover that leads it next finds it; no
    // other is debited until it is settled (by its id).
    assert_eq!(escrow.outstanding().await.unwrap(), Some((t(1), 4)));
    // The records last a day (longer than any partition a mover retries through).
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for record in [
        "tollgate:regions:transfer:0-7-1:debit",
        "tollgate:regions:outstanding",
    ] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(record)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!((86_000_000..=86_400_000).contains(&ttl), "{record}: {ttl}");
    }
    assert_eq!(escrow.debit(&t(2), q, 4, 5).await.unwrap(), 0);
    assert!(!escrow.settle(id(2)).await.unwrap());
    assert!(escrow.settle(id(1)).await.unwrap());
    assert_eq!(escrow.outstanding().await.unwrap(), None);
    // 6 left, 5 kept: 1 taken.
    assert_eq!(escrow.debit(&t(2), q, 4, 5).await.unwrap(), 1);
    assert!(escrow.settle(id(2)).await.unwrap());
    assert_eq!(escrow.debit(&t(3), q, 4, 5).await.unwrap(), 0);
    assert_eq!(escrow.outstanding().await.unwrap(), None, "nothing taken");
    // A key of any bytes, a far epoch, another limit: read back as written.
    let odd = Transfer::new(
        TransferId {
            region: 1,
            epoch: u64::MAX,
            seq: 9,
        },
        "other",
        Key::from_part("a:b c\\n\u{e9}"),
        0,
    );
    assert_eq!(escrow.debit(&odd, q, 1, 0).await.unwrap(), 1);
    assert_eq!(escrow.outstanding().await.unwrap(), Some((odd.clone(), 1)));
    assert!(escrow.settle(odd.id).await.unwrap());
    let limiter = Limiter::builder(store.clone())
        .limit(LimitSpec::new("api", q))
        .build()
        .unwrap();
    assert_eq!(limiter.peek("api", "k").await.unwrap().remaining(), Some(5));
    assert!(escrow.credit(id(1), "api", &k, q, 3).await.unwrap());
    assert!(!escrow.credit(id(1), "api", &k, q, 3).await.unwrap());
    assert_eq!(limiter.peek("api", "k").await.unwrap().remaining(), Some(8));
    // A credit never fills beyond a full bucket.
    assert!(escrow.credit(id(4), "api", &k, q, 30).await.unwrap());
    assert_eq!(
        limiter.peek("api", "k").await.unwrap().remaining(),
        Some(10)
    );

    // The demand: the keys the look finds, their tokens, what they spent since.
    limiter.check("api", "k", 3).await.unwrap();
    let first = escrow.demand("api", q).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].key.clone(), first[0].remaining), (k.clone(), 7));
    limiter.check("api", "k", 2).await.unwrap();
    let second = escrow.demand("api", q).await.unwrap();
    assert_eq!((second[0].granted, second[0].remaining), (2, 5));

    let ttl = Duration::from_millis(300);
    assert!(escrow.lead("a", ttl).await.unwrap());
    assert!(!escrow.lead("b", ttl).await.unwrap());
    assert!(escrow.lead("a", ttl).await.unwrap());
}

#[tokio::test]
async fn the_regions_are_named_once_and_the_local_one_among_them() {
    let server = RedisServer::start();
    let s = store(&server.url()).await;
    let err = RedisStore::regions([("eu", s.clone()), ("eu", s.clone())], "eu").unwrap_err();
    assert_eq!(err.field(), "regions");
    let err = RedisStore::regions([("eu", s.clone()), ("us", s.clone())], "ap").unwrap_err();
    assert_eq!(err.field(), "regions.local");
    let none: [(&str, RedisStore); 0] = [];
    assert!(RedisStore::regions(none, "eu").is_err());
    let r = RedisStore::regions([("eu", s.clone()), ("us", s)], "us").unwrap();
    assert_eq!((r.local(), r.names().len()), ("us", 2));
}

/// A look `SCAN`s a limit's keys in batches until it has 10,000 (the most it reads): of
/// 12,000 keys it reads 10,000, each once; of 2,500, all of them.
#[tokio::test]
async fn a_look_reads_a_limits_keys_up_to_ten_thousand() {
    let server = RedisServer::start();
    let escrow = store(&server.url()).await.escrow();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let q = Quota::per_second(10);
    for (table, n, read) in [("wide", 12_000, 10_000), ("some", 2_500, 2_500)] {
        let mut pipe = redis::pipe();
        for i in 0..n {
            pipe.cmd("SET")
                .arg(format!("tollgate:{table}:k{i}"))
                .arg(1)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
        let keys = escrow.demand(table, q).await.unwrap();
        let distinct: std::collections::HashSet<_> = keys.iter().map(|d| d.key.clone()).collect();
        assert_eq!((keys.len(), distinct.len()), (read, read), "{table}");
    }
    // What it remembers of a look (each key's TAT) is kept per limit, the 10,000 keys it
    // read (another limit's keys beside them cleared it once): a key spent since shows
    // at least what it spent at the next look.
    let keys = escrow.demand("wide", q).await.unwrap();
    let spent = &keys[0].key;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let tat = secs * 1_000_000 + micros + 5 * 100_000;
    let () = redis::cmd("SET")
        .arg(format!("tollgate:wide:{spent}"))
        .arg(tat)
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = escrow.demand("wide", q).await.unwrap();
    let seen = again.iter().find(|d| d.key == *spent).unwrap();
    assert!(seen.granted >= 5, "{seen:?}");
}

#[tokio::test]
async fn the_quota_moves_to_the_region_spending_it_and_a_black_hole_delays_a_transfer_once_even_with_its_leader_killed()
 {
    let (eu, us) = (RedisServer::start(), RedisServer::start());
    let link = Duration::from_millis(30);
    // Each region reaches its own Redis directly, the other's through the link.
    let us_from_eu = proxy(us.port(), link).await;
    let eu_from_us = proxy(eu.port(), link).await;
    let quota = Quota::per_second(100);
    let at_eu = RedisStore::regions(
        [
            ("eu", store(&eu.url()).await),
            (
                "us",
                store(&format!("redis://127.0.0.1:{}", us_from_eu.port)).await,
            ),
        ],
        "eu",
    )
    .unwrap();
    let at_us = RedisStore::regions(
        [
            (
                "eu",
                store(&format!("redis://127.0.0.1:{}", eu_from_us.port)).await,
            ),
            ("us", store(&us.url()).await),
        ],
        "us",
    )
    .unwrap();
    let settings = MoverSettings::new()
        .interval(Duration::from_millis(100))
        .link_delay(link);
    let mover = at_us.mover([("api", quota)], settings.clone(), "us-1", 1);
    let us_stats = mover.stats();
    let us_mover = tokio::spawn(mover.run());
    // A second mover in us: elected out while the first holds the lead.
    let second = at_us.mover([("api", quota)], settings, "us-2", 2);
    let second_stats = second.stats();
    let second_mover = tokio::spawn(second.run());

    let eu_limiter = Limiter::builder(at_eu.store())
        .limit(LimitSpec::new("api", quota))
        .build()
        .unwrap();
    // eu spends at 200 a second (its part is 50 a second): us moves its tokens over.
    let spend = {
        let limiter = eu_limiter.clone();
        tokio::spawn(async move {
            let mut granted = 0u64;
            loop {
                if limiter.check("api", "k", 1).await.unwrap().allowed() {
                    granted += 1;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                if granted > 1_000_000 {
                    return;
                }
            }
        })
    };
    assert!(
        until(Duration::from_secs(20), || us_stats.report().moved >= 20).await,
        "{:?}",
        us_stats.report()
    );
    let leaders = [us_stats.report().leading, second_stats.report().leading];
    assert_eq!(leaders.iter().filter(|&&l| l).count(), 1, "{leaders:?}");

    // The link goes black while a credit is on its way: the transfer stays the same one,
    // its credit held in the link and sent again under its id, and lands once healed.
    let us = || region(&[&us_stats, &second_stats]);
    let hole = |on| {
        us_from_eu.hole.store(on, Ordering::SeqCst);
        eu_from_us.hole.store(on, Ordering::SeqCst);
    };
    // A credit whose answer left the link just before it went black still lands (and no
    // transfer starts while the other region is out of reach): heal, and catch the next.
    let mut caught = None;
    for _ in 0..5 {
        assert!(
            until(Duration::from_secs(20), || us().in_flight > 0).await,
            "{:?}",
            us()
        );
        hole(true);
        let before = us();
        if before.in_flight == 0 {
            hole(false);
            continue;
        }
        let held = |r: &MoverReport| r.lag >= Duration::from_millis(500);
        assert!(
            until(Duration::from_secs(20), || {
                let r = us();
                held(&r) || r.transfers > before.transfers
            })
            .await,
            "{:?}",
            us()
        );
        let during = us();
        if during.transfers == before.transfers && held(&during) {
            caught = Some((before, during));
            break;
        }
        hole(false);
    }
    let (before, during) = caught.expect("a transfer caught in the black hole");
    assert_eq!(during.in_flight, before.in_flight, "the same transfer");
    assert_eq!(during.transfers, before.transfers);
    assert_eq!(during.unreachable, 1, "a partition");
    // Its leader is killed while the credit is held: once its lead lapses the other mover
    // leads, takes the transfer over from the region's Redis and starts no other.
    let (killed, survivor) = if us_stats.report().leading {
        (&us_mover, &second_stats)
    } else {
        (&second_mover, &us_stats)
    };
    killed.abort();
    assert!(
        until(Duration::from_secs(20), || {
            let r = survivor.report();
            r.leading && r.in_flight == during.in_flight
        })
        .await,
        "{:?}",
        survivor.report()
    );
    assert_eq!(us().transfers, during.transfers, "none landed in the hole");
    hole(false);
    assert!(
        until(Duration::from_secs(20), || us().transfers
            > during.transfers)
        .await
    );
    let after = us();
    assert!(after.moved >= during.moved + during.in_flight);
    spend.abort();
    us_mover.abort();
    second_mover.abort();
    // us's bucket gave what it moved: its Redis holds less than its part.
    let us_local = Limiter::builder(at_us.store())
        .limit(LimitSpec::new("api", quota))
        .build()
        .unwrap();
    let part = share(quota, 1, 2).burst_size();
    assert!(
        us_local
            .peek("api", "k")
            .await
            .unwrap()
            .remaining()
            .unwrap()
            <= part
    );
}

/// One decision of a paced instance: when its answer came, granted or not, and whether
/// its region's Redis decided it (`Checked`) or its failure policy did (`Fallback`).
#[derive(Clone, Copy, Debug)]
struct Call {
    at: Instant,
    granted: bool,
    from_redis: bool,
    fallback: bool,
}

/// An instance checking `rate` times a second until `stop`; its calls, shared as they
/// come (for the conditions a test waits on).
fn pace(
    limiter: Limiter,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> (
    Arc<std::sync::Mutex<Vec<Call>>>,
    tokio::task::JoinHandle<()>,
) {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = Arc::clone(&calls);
    let task = tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1) / rate);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while !stop.load(Ordering::SeqCst) {
            every.tick().await;
            let d = limiter.check("api", "k", 1).await.unwrap();
            let call = Call {
                at: Instant::now(),
                granted: d.allowed(),
                from_redis: matches!(d.status(), Status::Checked(_)),
                fallback: matches!(d.status(), Status::Fallback(_)),
            };
            out.lock().unwrap().push(call);
        }
    });
    (calls, task)
}

fn count(calls: &std::sync::Mutex<Vec<Call>>, f: impl Fn(&Call) -> bool) -> usize {
    calls.lock().unwrap().iter().filter(|c| f(c)).count()
}

/// `⌈rate · window⌉ + burst` of `quota`: what one bucket of it grants over `window`.
fn one_bucket(quota: Quota, window: Duration) -> u64 {
    bound(quota, 1, 0, window) - 1
}

/// A region's Redis killed with SIGKILL under load, then restarted empty: the other region
/// keeps deciding from its own Redis alone, within its own part (plus the one transfer
/// that may have been on the link); the killed region's instance follows its failure
/// policy (`Share`: its part, from this instance's traffic); the whole run stays within
/// the regions' bound plus that region's outage term (`burst + rate · o` of its part);
/// once restarted, the region decides from Redis again and its mover leads and moves
/// tokens again. Every phase ends on a condition, none on a sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regions_redis_killed_and_restarted_empty() {
    let (eu, mut us) = (RedisServer::start(), RedisServer::start());
    let link = Duration::from_millis(30);
    let us_from_eu = proxy(us.port(), link).await;
    let eu_from_us = proxy(eu.port(), link).await;
    let quota = Quota::per_second(100);
    let at_eu = RedisStore::regions(
        [
            ("eu", local(&eu)),
            (
                "us",
                store(&format!("redis://127.0.0.1:{}", us_from_eu.port)).await,
            ),
        ],
        "eu",
    )
    .unwrap();
    let at_us = RedisStore::regions(
        [
            (
                "eu",
                store(&format!("redis://127.0.0.1:{}", eu_from_us.port)).await,
            ),
            ("us", local(&us)),
        ],
        "us",
    )
    .unwrap();
    let settings = MoverSettings::new()
        .interval(Duration::from_millis(100))
        .link_delay(link);
    let m = settings.max_move(quota);
    let eu_mover = at_eu.mover([("api", quota)], settings.clone(), "eu-1", 1);
    let us_mover = at_us.mover([("api", quota)], settings, "us-1", 2);
    let (eu_stats, us_stats) = (eu_mover.stats(), us_mover.stats());
    let movers = [tokio::spawn(eu_mover.run()), tokio::spawn(us_mover.run())];

    let stop = Arc::new(AtomicBool::new(false));
    let limiter = |regions: &tollgate::store::RedisRegions| {
        Limiter::builder(regions.store())
            .limit(LimitSpec::new("api", quota))
            .build()
            .unwrap()
    };
    let start = Instant::now();
    // eu asks 150 a second (its part is 50), us 20: us's mover moves its unspent tokens.
    let (eu_calls, eu_task) = pace(limiter(&at_eu), 150, Arc::clone(&stop));
    let (us_calls, us_task) = pace(limiter(&at_us), 20, Arc::clone(&stop));
    let wait = Duration::from_secs(30);
    assert!(
        until(wait, || us_stats.report().moved > 0
            && count(&us_calls, |c| c.from_redis) >= 20)
        .await,
        "{:?}",
        us_stats.report()
    );

    // kill -9 us's Redis.
    let pid = us.pid().unwrap();
    let killed = Instant::now();
    us.kill();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the server process is gone"
    );
    let before = count(&us_calls, |_| true);
    // us's instance follows its failure policy (20 decisions of it: about a second), us's
    // mover no longer leads (its lead is in the dead Redis), eu's finds us out of reach.
    assert!(
        until(wait, || count(&us_calls, |c| c.fallback) >= 20
            && !us_stats.report().leading
            && eu_stats.report().unreachable > 0)
        .await,
        "us {:?}, eu {:?}",
        us_stats.report(),
        eu_stats.report()
    );
    // Restarted empty, on the same port.
    us.restart();
    let restarted = Instant::now();
    let (us_moved, us_transfers) = (us_stats.report().moved, us_stats.report().transfers);
    // Recovered: us decides from its Redis again, its mover leads and lands a transfer,
    // eu's mover reaches us again.
    let checked = count(&us_calls, |c| c.from_redis);
    assert!(
        until(wait, || count(&us_calls, |c| c.from_redis) >= checked + 20
            && us_stats.report().transfers > us_transfers
            && us_stats.report().leading
            && eu_stats.report().unreachable == 0)
        .await,
        "us {:?}, eu {:?}",
        us_stats.report(),
        eu_stats.report()
    );
    stop.store(true, Ordering::SeqCst);
    eu_task.await.unwrap();
    us_task.await.unwrap();
    let end = Instant::now();
    for m in movers {
        m.abort();
    }
    let (eu_calls, us_calls) = (
        eu_calls.lock().unwrap().clone(),
        us_calls.lock().unwrap().clone(),
    );
    assert!(us_stats.report().moved > us_moved);

    // eu never asked anything of us's Redis for a decision.
    assert!(eu_calls.iter().all(|c| c.from_redis), "eu decided alone");
    let granted = |calls: &[Call], from: Instant, to: Instant| {
        calls
            .iter()
            .filter(|c| c.granted && c.at >= from && c.at <= to)
            .count() as u64
    };
    let (eu_part, us_part) = (share(quota, 0, 2), share(quota, 1, 2));
    // The outage: from the kill to the restart, as its decisions' answers saw it (a
    // decision answered after the restart may have been made before it: the window
    // reaches a second past it, the local stores' timeout being at most a second).
    let outage = restarted + Duration::from_secs(1) - killed;
    let eu_out = granted(&eu_calls, killed, restarted);
    assert!(eu_out > 0, "eu kept granting");
    assert!(
        eu_out <= one_bucket(eu_part, outage) + m + 1,
        "eu, {eu_out} in the outage of {outage:?}"
    );
    // us's failure policy: what it answered without Redis is its share of its part.
    let us_fallback: Vec<Call> = us_calls.iter().copied().filter(|c| c.fallback).collect();
    assert!(us_fallback.len() >= 20);
    assert!(us_calls[..before].iter().all(|c| !c.fallback));
    let us_out = us_fallback.iter().filter(|c| c.granted).count() as u64;
    assert!(
        us_out <= one_bucket(us_part, outage),
        "us, {us_out} in the outage of {outage:?}"
    );
    // The whole run: the regions' bound and us's outage term.
    let run = end - start;
    let total = granted(&eu_calls, start, end) + granted(&us_calls, start, end);
    let most = bound(quota, 2, m, run) + one_bucket(us_part, outage);
    assert!(total <= most, "{total} granted over {run:?}, bound {most}");
    eprintln!(
        "run {run:?}: {total} granted (bound {most}); outage {outage:?}: eu {eu_out}, us {us_out} \
         ({} decisions by the failure policy); us moved {} tokens",
        us_fallback.len(),
        us_stats.report().moved
    );
}

/// A link whose round trip is longer than the movers' interval (80 ms each way, a move
/// every 100 ms): a look at the other region's demand is two round trips (a `SCAN`, then
/// the script), 320 ms, and still answers in time; the quota moves and the other region
/// does not read as out of reach.
#[tokio::test]
async fn a_link_slower_than_the_interval_still_moves_the_quota() {
    let (eu, us) = (RedisServer::start(), RedisServer::start());
    let link = Duration::from_millis(80);
    let eu_from_us = proxy(eu.port(), link).await;
    let quota = Quota::per_second(100);
    let at_eu = RedisStore::regions(
        [
            ("eu", store(&eu.url()).await),
            ("us", store(&us.url()).await),
        ],
        "eu",
    )
    .unwrap();
    let at_us = RedisStore::regions(
        [
            (
                "eu",
                store(&format!("redis://127.0.0.1:{}", eu_from_us.port)).await,
            ),
            ("us", store(&us.url()).await),
        ],
        "us",
    )
    .unwrap();
    let settings = MoverSettings::new()
        .interval(Duration::from_millis(100))
        .link_delay(link);
    let mover = at_us.mover([("api", quota)], settings, "us-1", 1);
    let stats = mover.stats();
    let task = tokio::spawn(mover.run());
    let eu_limiter = Limiter::builder(at_eu.store())
        .limit(LimitSpec::new("api", quota))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (_, spend) = pace(eu_limiter, 200, Arc::clone(&stop));
    assert!(
        until(Duration::from_secs(20), || stats.report().moved >= 20).await,
        "{:?}",
        stats.report()
    );
    assert_eq!(stats.report().unreachable, 0, "{:?}", stats.report());
    stop.store(true, Ordering::SeqCst);
    spend.await.unwrap();
    task.abort();
}
