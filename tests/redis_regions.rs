//! One limit across regions on real Redis servers, one per region, the link between them
//! through a proxy in this process that delays and black-holes: transfers applied once
//! (`lua/regions.lua`), the region's mover elected by a lock with a TTL, the quota moving to
//! the region that spends it, a transfer cut by a black hole landing once after it.
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
use tollgate::store::regions::{Escrow, MoverSettings, TransferId, share};
use tollgate::{LimitSpec, Limiter, Quota};

async fn store(url: &str) -> RedisStore {
    RedisStore::open(url)
        .unwrap()
        .timeout(Duration::from_secs(2))
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
    let q = Quota::per_hour(10);
    let k = Key::from_part("k");
    assert_eq!(escrow.debit(id(1), "api", &k, q, 4, 0).await.unwrap(), 4);
    assert_eq!(escrow.debit(id(1), "api", &k, q, 4, 0).await.unwrap(), 4);
    // 6 left, 5 kept: 1 taken.
    assert_eq!(escrow.debit(id(2), "api", &k, q, 4, 5).await.unwrap(), 1);
    assert_eq!(escrow.debit(id(3), "api", &k, q, 4, 5).await.unwrap(), 0);
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

#[tokio::test]
async fn the_quota_moves_to_the_region_spending_it_and_a_black_hole_delays_a_transfer_once() {
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
    let hole = |on| {
        us_from_eu.hole.store(on, Ordering::SeqCst);
        eu_from_us.hole.store(on, Ordering::SeqCst);
    };
    let start = Instant::now();
    while us_stats.report().in_flight == 0 && start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    hole(true);
    let before = us_stats.report();
    assert!(before.in_flight > 0, "{before:?}");
    assert!(
        until(Duration::from_secs(20), || us_stats.report().lag
            >= Duration::from_millis(500))
        .await
    );
    let during = us_stats.report();
    assert_eq!(during.in_flight, before.in_flight, "the same transfer");
    assert_eq!(during.transfers, before.transfers);
    assert_eq!(during.unreachable, 1, "a partition");
    hole(false);
    assert!(
        until(Duration::from_secs(20), || us_stats.report().transfers
            > during.transfers)
        .await
    );
    let after = us_stats.report();
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
