//! In-flight limits shared through Redis: units counted per instance under a deadline the
//! holder renews once a second. Real servers and separate processes: a holder killed with
//! `kill -9` frees its units within the deadline; a Redis restarted empty gets the held
//! units back with the next renewal; releases go where the units were taken.
#![cfg(feature = "redis")]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::redis::RedisServer;
use tollgate::store::RedisStore;
use tollgate::{LimitSpec, Limiter};

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::new(server.client().get_connection_manager().await.unwrap())
        .timeout(Duration::from_secs(2))
        .in_flight_deadline(Duration::from_secs(2))
}

async fn limiter(server: &RedisServer, n: u64) -> Limiter {
    Limiter::builder(store(server).await)
        .limit(LimitSpec::in_flight("jobs", n))
        .build()
        .unwrap()
}

/// Polls `cond` every 20 ms until it holds (or panics after `within`).
async fn until(within: Duration, what: &str, mut cond: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{what}: not after {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_n_units_and_releases_free_them() {
    let server = RedisServer::start();
    let (a, b) = (limiter(&server, 3).await, limiter(&server, 3).await);
    let p1 = a.acquire("jobs", "k").await.unwrap();
    let p2 = b.acquire("jobs", "k").await.unwrap();
    let p3 = a.acquire("jobs", "k").await.unwrap();
    assert!(p1.is_granted() && p2.is_granted() && p3.is_granted());
    let refused = b.acquire("jobs", "k").await.unwrap();
    assert!(!refused.is_granted(), "3 in flight across two instances");
    assert_eq!(
        refused.decision().outcome().unwrap().retry_after(),
        Some(Duration::from_secs(1))
    );
    assert_eq!(refused.decision().outcome().unwrap().remaining(), 0);
    drop(refused);
    drop(p2); // b's unit: released in the background
    until(Duration::from_secs(10), "b's release", async || {
        a.acquire("jobs", "k").await.unwrap().is_granted()
    })
    .await;
    // Held units survive their deadline: renewals keep them (2 s deadline, 3 s here).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let look = b.peek("jobs", "k").await.unwrap();
    assert_eq!(
        look.outcome().unwrap().remaining(),
        1,
        "p1 and p3 still held"
    );
    drop((p1, p3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_its_units_within_the_deadline() {
    let server = RedisServer::start();
    let mut holder = Command::new(env!("CARGO_BIN_EXE_in_flight_process"))
        .args(["hold", &server.url(), "4", "k"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 4");
    let here = limiter(&server, 4).await;
    // Renewed past its deadline: still held while the holder lives.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !here.acquire("jobs", "k").await.unwrap().is_granted(),
        "the holder's 4 units"
    );

    let killed = Command::new("kill")
        .args(["-9", &holder.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let _ = holder.wait();
    let after = until(
        Duration::from_secs(30),
        "units freed after kill -9",
        async || here.acquire("jobs", "k").await.unwrap().is_granted(),
    )
    .await;
    // The deadline (2 s) from the holder's last renewal, at most a second before the kill;
    // generous for a loaded machine, far below "never".
    assert!(
        after <= Duration::from_secs(2) + Duration::from_millis(1_500),
        "freed after {after:?}"
    );
    eprintln!("kill -9: the units came back {after:?} after the kill (deadline 2 s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_held_come_back_after_redis_restarts_empty() {
    let mut server = RedisServer::start();
    let a = limiter(&server, 2).await;
    let p1 = a.acquire("jobs", "k").await.unwrap();
    let p2 = a.acquire("jobs", "k").await.unwrap();
    assert!(p1.is_granted() && p2.is_granted());
    server.restart(); // empty: no persistence
    let b = limiter(&server, 2).await;
    // The next renewal writes a's units again.
    until(Duration::from_secs(30), "the renewal after the restart", async || {
        matches!(b.peek("jobs", "k").await, Ok(d) if d.outcome().is_some_and(|o| o.remaining() == 0))
    })
    .await;
    assert!(!b.acquire("jobs", "k").await.unwrap().is_granted());
    drop((p1, p2));
    until(Duration::from_secs(10), "the releases", async || {
        b.acquire("jobs", "k").await.unwrap().is_granted()
    })
    .await;
}
