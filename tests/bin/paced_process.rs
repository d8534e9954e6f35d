//! A separate process for the shared pacing test (`tests/streams_redis.rs`): one instance
//! of a service that paces bytes per key through one Redis, as users run it, one process
//! per instance.
//!
//! `paced_process <redis-url> <wait|end> <key> <amount>` builds the limit `download`
//! (1 MiB/s, 256 KiB at once, counted in KiB; with `end`, leased: at most 128 KiB held
//! per instance) and paces through a pacer of `key` with batches of 64 KiB:
//!
//! - `wait`: a body of `<amount>` MiB in 16 KiB frames, through a `PacedBody`, to its end;
//! - `end`: 16 KiB charges for `<amount>` seconds, as fast as they pass (a refused charge
//!   sleeps for its `retry_after`, at most 50 ms, and tries again).
//!
//! It prints `passed <bytes> first_us <t> last_us <t>`: the bytes that passed, and the wall
//! clock (µs since the epoch) just before its first charge and when its last passed.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use bytes::Bytes;
use tollgate::pace::{Direction, OverLimit, PacedBody, Per};
use tollgate::store::RedisStore;
use tollgate::{Lease, LimitSpec, Limiter, Quota};

const KIB: usize = 1024;

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, mode, key, amount] = &args[..] else {
        eprintln!("usage: paced_process <redis-url> <wait|end> <key> <amount>");
        std::process::exit(2);
    };
    let amount: u64 = amount.parse().expect("amount");
    let store = RedisStore::open(url)
        .expect("url")
        .timeout(Duration::from_secs(2));
    let mut limit = LimitSpec::new("download", Quota::per_second(1024).burst(256))
        .per(Per::Byte)
        .unit(1024)
        .direction(Direction::Out);
    limit = match mode.as_str() {
        "wait" => limit.over_limit(OverLimit::wait(Duration::from_secs(30))),
        "end" => limit.over_limit(OverLimit::End).lease(Lease::tokens(128)),
        other => panic!("mode {other}: wait or end"),
    };
    let limiter = Limiter::builder(store)
        .limit(limit)
        .build()
        .expect("limits");
    let pacer = limiter
        .pacer("download", key.as_str())
        .expect("pacer")
        .batch(64);
    let first = now_us();
    let (passed, last) = if mode == "wait" {
        let frames =
            (0..amount * 64).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![1u8; 16 * KIB])));
        let body = PacedBody::new(Body::from_stream(futures_util::stream::iter(frames)), pacer);
        let bytes = axum::body::to_bytes(Body::new(body), usize::MAX)
            .await
            .expect("paced to its end");
        (bytes.len() as u64, now_us())
    } else {
        let mut pacer = pacer;
        let until = Instant::now() + Duration::from_secs(amount);
        let (mut passed, mut last) = (0, first);
        while Instant::now() < until {
            match pacer.charge(16 * KIB as u64).await {
                Ok(()) => {
                    passed += 16 * KIB as u64;
                    last = now_us();
                }
                Err(refused) => {
                    let wait = refused.retry_after().unwrap_or(Duration::from_millis(50));
                    tokio::time::sleep(wait.min(Duration::from_millis(50))).await;
                }
            }
        }
        (passed, last)
    };
    println!("passed {passed} first_us {first} last_us {last}");
    // The lease's unspent tokens go back as the limiter is dropped, before the exit.
    drop(limiter);
    tokio::time::sleep(Duration::from_millis(100)).await;
}
