//! A separate process for the in-flight tests (`tests/in_flight_redis.rs`): the way users
//! run a shared in-flight limit, one process per instance on one Redis.
//!
//! `in_flight_process hold <redis-url> <n> <key>`: takes `n` units of the in-flight limit
//! `jobs` for `key` (deadline 2 s, renewed once a second), prints `held <n>`, and holds
//! them until it is killed.

use std::io::Write;
use std::time::Duration;

use tollgate::store::RedisStore;
use tollgate::{LimitSpec, Limiter};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, mode, url, n, key] = &args[..] else {
        eprintln!("usage: in_flight_process hold <redis-url> <n> <key>");
        std::process::exit(2);
    };
    assert_eq!(mode, "hold", "the only mode");
    let n: u64 = n.parse().expect("n");
    let store = RedisStore::open(url)
        .expect("url")
        .in_flight_deadline(Duration::from_secs(2));
    let limiter = Limiter::builder(store)
        .limit(LimitSpec::in_flight("jobs", n))
        .build()
        .expect("limits");
    let mut permits = Vec::new();
    while permits.len() < n as usize {
        let permit = limiter
            .acquire("jobs", key.as_str())
            .await
            .expect("acquire");
        if permit.is_granted() {
            permits.push(permit);
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!("held {n}");
    std::io::stdout().flush().unwrap();
    std::future::pending::<()>().await;
}
