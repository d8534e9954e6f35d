//! Bytes per second shared across instances through Redis (issue 42): two stores (two
//! instances' connections) pace downloads of one key from one bucket. Redis keeps its own
//! time, so these run on the real clock and assert only what pacing guarantees whatever
//! the machine's speed: never faster than the shared rate, and one Redis call per batch.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use support::redis::RedisServer;
use tollgate::pace::{Direction, PacedBody, Per};
use tollgate::store::RedisStore;
use tollgate::{LimitSpec, Limiter, Quota};

const KIB: usize = 1024;

/// An instance: its own connection to `server`, the limit `download` (1 MiB/s, 256 KiB
/// at once, counted in KiB).
async fn instance(server: &RedisServer) -> Limiter {
    let store = RedisStore::new(server.client().get_connection_manager().await.unwrap())
        .timeout(Duration::from_secs(2));
    Limiter::builder(store)
        .limit(
            LimitSpec::new("download", Quota::per_second(1024).burst(256))
                .per(Per::Byte)
                .unit(1024)
                .direction(Direction::Out),
        )
        .build()
        .unwrap()
}

/// `mib` MiB in 16 KiB frames, paced for `key` through `limiter`, 64 KiB per store call.
async fn download(limiter: Limiter, key: &'static str, mib: usize) -> usize {
    let frames = (0..mib * 64).map(|_| {
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from(vec![1u8; 16 * KIB])))
    });
    let pacer = limiter.pacer("download", key).unwrap().batch(64);
    let body = PacedBody::new(StreamBody::new(futures_util::stream::iter(frames)), pacer);
    body.collect().await.unwrap().to_bytes().len()
}

/// `EVALSHA` calls so far.
async fn evalsha(server: &RedisServer) -> u64 {
    let mut c = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_keys_rate_through_redis() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let before = evalsha(&server).await;
    let start = Instant::now();
    let (x, y) = tokio::join!(
        tokio::spawn(download(a, "203.0.113.9", 1)),
        tokio::spawn(download(b, "203.0.113.9", 1))
    );
    let elapsed = start.elapsed();
    let total = x.unwrap() + y.unwrap();
    assert_eq!(total, 2 << 20);
    // Within `elapsed` the key's bucket let through at most its burst, its rate × elapsed
    // and what each instance took ahead (a batch each): so it took at least this long.
    let floor = (2048.0 - 256.0 - 2.0 * 64.0) / 1024.0;
    assert!(
        elapsed.as_secs_f64() >= floor,
        "2 MiB in {elapsed:?}: faster than the shared 1 MiB/s allows ({floor} s)"
    );
    // One call per 64 KiB batch (32 for 2 MiB), and a few reservations that waited.
    let calls = evalsha(&server).await - before;
    eprintln!("2 MiB through two instances in {elapsed:?}, {calls} EVALSHA calls");
    assert!(calls <= 32 + 4, "{calls} EVALSHA calls for 2 MiB");
}
