//! A separate process for the in-flight tests (`tests/in_flight_redis.rs`): the way users
//! run a shared in-flight limit, one process per instance on one Redis.
//!
//! - `in_flight_process hold <redis-url> <n> <key>`: takes `n` units of the in-flight limit
//!   `jobs` for `key` (deadline 2 s, renewed once a second), prints `held <n>`, and holds
//!   them until it is killed.
//! - `in_flight_process serve <redis-url> <n>`: serves `GET /` behind the in-flight limit
//!   `inference` (`n` per `x-key`) on a free loopback port, which it prints
//!   (`port <p>`). Each response streams three chunks a millisecond apart. The handler
//!   counts the requests in it (or streaming) in Redis itself, with a synchronous call on
//!   entry and one when its stream ends or is dropped (before the layer frees the unit):
//!   `probe:active`, and the most seen, `probe:max`, across every process.

use std::convert::Infallible;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use bytes::Bytes;
use tollgate::key::Header;
use tollgate::store::RedisStore;
use tollgate::{Limit, LimitSpec, Limiter, RateLimitLayer};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match &args[1..] {
        [mode, url, n, key] if mode == "hold" => hold(url, n.parse().expect("n"), key).await,
        [mode, url, n] if mode == "serve" => serve(url, n.parse().expect("n")).await,
        _ => {
            eprintln!(
                "usage: in_flight_process hold <redis-url> <n> <key> | serve <redis-url> <n>"
            );
            std::process::exit(2);
        }
    }
}

async fn hold(url: &str, n: u64, key: &str) {
    let store = RedisStore::open(url)
        .expect("url")
        .in_flight_deadline(Duration::from_secs(2));
    let limiter = Limiter::builder(store)
        .limit(LimitSpec::in_flight("jobs", n))
        .build()
        .expect("limits");
    let mut permits = Vec::new();
    while permits.len() < n as usize {
        let permit = limiter.acquire("jobs", key).await.expect("acquire");
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

/// The probe's connection: synchronous, so that the count is down before the unit frees.
type Probe = Arc<Mutex<redis::Connection>>;

const ENTER: &str = "local v = redis.call('INCR', KEYS[1]) \
    if v > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], v) end \
    return v";

struct Leaving(Probe);

impl Drop for Leaving {
    fn drop(&mut self) {
        let mut c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let _: i64 = redis::cmd("DECR")
            .arg("probe:active")
            .query(&mut *c)
            .unwrap();
    }
}

async fn handler(State(probe): State<Probe>) -> Body {
    {
        let mut c = probe.lock().unwrap_or_else(|e| e.into_inner());
        let _: i64 = redis::cmd("EVAL")
            .arg(ENTER)
            .arg(2)
            .arg("probe:active")
            .arg("probe:max")
            .query(&mut *c)
            .unwrap();
    }
    let leaving = Leaving(probe);
    let stream = futures_util::stream::unfold((0, Some(leaving)), |(i, leaving)| async move {
        if i == 3 {
            drop(leaving);
            return None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        Some((
            Ok::<_, Infallible>(Bytes::from(vec![b'x'; 512])),
            (i + 1, leaving),
        ))
    });
    Body::from_stream(stream)
}

async fn serve(url: &str, n: u64) {
    let probe: Probe = Arc::new(Mutex::new(
        redis::Client::open(url).unwrap().get_connection().unwrap(),
    ));
    let store = RedisStore::open(url)
        .expect("url")
        .timeout(Duration::from_secs(1));
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::in_flight("inference", n).key(Header::new("x-key")))
        .build()
        .expect("limits");
    let app = Router::new()
        .route("/", get(handler))
        .with_state(probe)
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("port {}", listener.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    axum::serve(listener, app).await.unwrap();
}
