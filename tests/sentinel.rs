//! `RedisStore::sentinel` against real processes: a master, a replica and three sentinels
//! on loopback ports. The master is killed under load: every request gets a decision (the
//! failure policy while there is no master), and once the sentinels promote the replica
//! the store shares its limits through it.
#![cfg(feature = "redis-sentinel")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::redis::RedisServer;
use tollgate::store::RedisStore;
use tollgate::{LimitSpec, Limiter, Quota};

/// `SENTINEL get-master-addr-by-name mymaster`: the port the sentinel names.
async fn master_port(sentinel: &RedisServer) -> Option<u16> {
    let mut c = sentinel.connection().await;
    let addr: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg("mymaster")
        .query_async(&mut c)
        .await
        .ok()?;
    addr.and_then(|(_, port)| port.parse().ok())
}

/// Waits until `what` holds, polling every 100 ms for at most `limit`.
async fn eventually<F: std::future::Future<Output = bool>>(
    limit: Duration,
    what: &str,
    mut f: impl FnMut() -> F,
) {
    let deadline = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Keys under `pattern` on `server`.
async fn keys(server: &RedisServer, pattern: &str) -> usize {
    let mut c = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut c)
        .await
        .unwrap_or_default();
    keys.len()
}

/// A master, its replica in sync, three sentinels that know both, and a store through the
/// sentinels with a limiter whose keys stay in Redis for a day (so what the store wrote can
/// be counted on each node).
async fn topology() -> (RedisServer, RedisServer, Vec<RedisServer>, Limiter) {
    let master = RedisServer::start();
    let replica = RedisServer::start_replica(&master);
    let sentinels: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_sentinel(&master))
        .collect();
    eventually(Duration::from_secs(20), "the replica syncs", || async {
        let mut c = replica.connection().await;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut c)
            .await
            .unwrap_or_default();
        info.contains("master_link_status:up")
    })
    .await;
    eventually(
        Duration::from_secs(20),
        "the sentinels know the replica",
        || async {
            let mut c = sentinels[0].connection().await;
            let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                .arg("replicas")
                .arg("mymaster")
                .query_async(&mut c)
                .await
                .unwrap_or_default();
            !replicas.is_empty()
        },
    )
    .await;
    let urls: Vec<String> = sentinels.iter().map(RedisServer::url).collect();
    let store = RedisStore::sentinel(&urls, "mymaster")
        .unwrap()
        .prefix("s:")
        .timeout(Duration::from_millis(500))
        .breaker(2, Duration::from_millis(200));
    let limiter = Limiter::builder(store)
        .limit(LimitSpec::new("api", Quota::per_day(1_000)))
        .build()
        .unwrap();
    // Shared through the master (the first calls connect: they may fall back meanwhile).
    eventually(
        Duration::from_secs(10),
        "the store writes to the master",
        || async {
            limiter.check("api", "before", 1).await.unwrap();
            keys(&master, "s:api:*").await > 0
        },
    )
    .await;
    (master, replica, sentinels, limiter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_store_follows_a_failover_under_load() {
    let (mut master, replica, sentinels, limiter) = topology().await;

    // Load: requests on fresh keys until told to stop; every one must get a decision.
    let stop = Arc::new(AtomicBool::new(false));
    let decided = Arc::new(AtomicU64::new(0));
    let load = {
        let (limiter, stop, decided) = (limiter.clone(), stop.clone(), decided.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let d = limiter
                    .check("api", format!("k{n}").as_str(), 1)
                    .await
                    .unwrap();
                assert!(d.allowed(), "a fresh key always passes: {d:?}");
                decided.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };

    master.kill();
    let killed = Instant::now();
    eventually(
        Duration::from_secs(30),
        "the sentinels promote the replica",
        || async { master_port(&sentinels[0]).await == Some(replica.port()) },
    )
    .await;
    let promoted = Instant::now();
    let before = keys(&replica, "s:api:*").await;
    eventually(
        Duration::from_secs(20),
        "the store writes to the new master",
        || async { keys(&replica, "s:api:*").await > before },
    )
    .await;
    let sharing = promoted.elapsed();
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    eprintln!(
        "promoted {:.1} s after the kill; sharing again {:.2} s after the promotion; {} decisions, none failed",
        promoted.duration_since(killed).as_secs_f64(),
        sharing.as_secs_f64(),
        decided.load(Ordering::Relaxed)
    );
    assert!(limiter.check("api", "after", 1).await.unwrap().allowed());
}

/// A failover the sentinels announce while the old master still runs (`SENTINEL
/// FAILOVER`): the store leaves the demoted master once the sentinels name the new one,
/// within about its probe's second, rather than keep writing to it until a call fails
/// (issue: shared limits under stress, item 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_store_follows_an_announced_failover_within_its_probe() {
    let (master, replica, sentinels, limiter) = topology().await;
    let mut c = sentinels[0].connection().await;
    let _: () = redis::cmd("SENTINEL")
        .arg("failover")
        .arg("mymaster")
        .query_async(&mut c)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "the sentinels name the replica",
        || async { master_port(&sentinels[0]).await == Some(replica.port()) },
    )
    .await;
    let announced = Instant::now();
    let before = keys(&replica, "s:api:*").await;
    let mut n = 0u64;
    // The store follows at its next probe (once a second); the latency is printed below,
    // the bound loose enough for a loaded machine.
    eventually(
        Duration::from_secs(15),
        "the store writes to the new master",
        || {
            n += 1;
            let (limiter, replica) = (limiter.clone(), &replica);
            async move {
                let key = format!("after{n}");
                limiter.check("api", key.as_str(), 1).await.unwrap();
                keys(replica, "s:api:*").await > before
            }
        },
    )
    .await;
    eprintln!(
        "writing to the new master {:.2} s after the sentinels named it",
        announced.elapsed().as_secs_f64()
    );
    drop(master);
}
