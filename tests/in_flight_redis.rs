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

/// On a Redis Cluster: each key's members live in its bucket's slot; two instances share
/// the units, renewals and releases reach the right node, and a request's in-flight and
/// rate limits in different slots are all or nothing.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_units_are_shared_on_a_cluster() {
    let cluster = support::redis::RedisCluster::start(3);
    let store = || async {
        RedisStore::cluster(cluster.connection().await)
            .timeout(Duration::from_secs(2))
            .in_flight_deadline(Duration::from_secs(2))
    };
    let limiter = |store: RedisStore| {
        Limiter::builder(store)
            .limit(LimitSpec::in_flight("jobs", 2))
            .limit(LimitSpec::new("rate", tollgate::Quota::per_minute(3)))
            .build()
            .unwrap()
    };
    let (a, b) = (limiter(store().await), limiter(store().await));
    // Keys in many slots: each holds its own units.
    for key in ["alpha", "beta", "gamma", "delta"] {
        let p1 = a.acquire("jobs", key).await.unwrap();
        let p2 = b.acquire("jobs", key).await.unwrap();
        assert!(p1.is_granted() && p2.is_granted(), "{key}");
        assert!(
            !a.acquire("jobs", key).await.unwrap().is_granted(),
            "{key}: 2 held"
        );
        drop(p2);
        until(
            Duration::from_secs(10),
            "the release on its node",
            async || a.acquire("jobs", key).await.unwrap().is_granted(),
        )
        .await;
        drop(p1);
    }
    // Renewed across the deadline on every node.
    let held: Vec<_> = {
        let mut v = Vec::new();
        for key in ["alpha", "beta"] {
            v.push(a.acquire("jobs", key).await.unwrap());
            v.push(a.acquire("jobs", key).await.unwrap());
        }
        v
    };
    assert!(held.iter().all(|p| p.is_granted()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    for key in ["alpha", "beta"] {
        assert!(
            !b.acquire("jobs", key).await.unwrap().is_granted(),
            "{key}: still held"
        );
    }
    drop(held);
    // All or nothing across slots: a rate limit spent on "k" refuses, and takes no unit.
    let calls = |key: &'static str| [("jobs", key, 1u32), ("rate", key, 1u32)];
    for _ in 0..3 {
        let d = a.check_all(calls("epsilon")).await.unwrap();
        assert!(d.allowed());
        // A check of an in-flight limit takes a unit: give it back.
        a.refund("jobs", "epsilon", 1).await.unwrap();
    }
    let refused = a.check_all(calls("epsilon")).await.unwrap();
    assert!(!refused.allowed(), "the rate limit is spent");
    let look = b.peek("jobs", "epsilon").await.unwrap();
    assert_eq!(
        look.outcome().unwrap().remaining(),
        2,
        "the refused request holds no unit"
    );
}

/// A server process (`in_flight_process serve`): its port, and the child (killed on drop).
struct Served(std::process::Child, u16);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(server: &RedisServer, n: u64) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_in_flight_process"))
        .args(["serve", &server.url(), &n.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .strip_prefix("port ")
        .expect("port")
        .parse()
        .unwrap();
    Served(child, port)
}

/// The issue-32 target, the way users run it. It found that a check timing out under the
/// flood granted the failure policy's local share beside the units Redis counted: 12 in
/// flight for a limit of 8. An in-flight check that times out now refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_connections_on_two_processes_never_exceed_n_and_lose_no_unit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const N: u64 = 8;
    const CLIENTS: usize = 1_000;
    const REQUESTS: usize = 10_000;
    let server = RedisServer::start();
    let (a, b) = (serve(&server, N), serve(&server, N));
    let ports = [a.1, b.1];
    // Instances that have run a while: each has heard from Redis once (a store that never
    // has treats a silent Redis as down, and its failure policy applies).
    for port in ports {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let req = "GET / HTTP/1.1\r\nhost: t\r\nx-key: warm-up\r\nconnection: close\r\n\r\n";
        s.write_all(req.as_bytes()).await.unwrap();
        let _ = s.read_to_end(&mut Vec::new()).await;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (next, counts) = (next.clone(), counts.clone());
        let port = ports[c % 2];
        clients.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= REQUESTS {
                    return;
                }
                let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                    continue;
                };
                let req = "GET / HTTP/1.1\r\nhost: t\r\nx-key: one\r\nconnection: close\r\n\r\n";
                if s.write_all(req.as_bytes()).await.is_err() {
                    continue;
                }
                let mut head = [0u8; 12];
                if s.read_exact(&mut head).await.is_err() {
                    continue;
                }
                match &head[9..12] {
                    b"200" => {
                        counts[0].fetch_add(1, Ordering::Relaxed);
                        if i % 10 < 3 {
                            counts[2].fetch_add(1, Ordering::Relaxed);
                            drop(s); // gone mid-response
                        } else {
                            let _ = s.read_to_end(&mut Vec::new()).await;
                        }
                    }
                    b"429" => {
                        counts[1].fetch_add(1, Ordering::Relaxed);
                        let _ = s.read_to_end(&mut Vec::new()).await;
                    }
                    other => panic!("unexpected status {:?}", String::from_utf8_lossy(other)),
                }
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let [ok, refused, cut] = [0, 1, 2].map(|i| counts[i].load(Ordering::Relaxed));
    assert!(
        ok >= N && refused > 0 && cut > 0,
        "{ok} admitted, {refused} refused, {cut} cut"
    );
    let mut redis = server.connection().await;
    let max: u64 = redis::AsyncCommands::get(&mut redis, "probe:max")
        .await
        .unwrap();
    assert!(
        max <= N,
        "{max} requests in flight at once across two processes, limit {N}"
    );
    // No unit lost: every member goes, released once the servers have seen every
    // connection end, or (a grant whose answer came too late for its request, which was
    // refused) expired with the deadline, 10 s.
    let waited = until(Duration::from_secs(20), "every unit released", async || {
        let left: u64 = redis::AsyncCommands::zcard(&mut redis, "tollgate:inference:one")
            .await
            .unwrap();
        let active: i64 = redis::AsyncCommands::get(&mut redis, "probe:active")
            .await
            .unwrap();
        left == 0 && active == 0
    })
    .await;
    eprintln!(
        "in-flight on two processes: {ok} admitted ({cut} cut mid-response), {refused} refused, at most {max} at once; all units back {waited:?} after the last client"
    );
}
