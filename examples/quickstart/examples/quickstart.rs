//! Quickstart: rate limit an axum route per client IP and globally, in memory.
//!
//! `GET /` has two limits, checked together (a refused request consumes from neither):
//!
//! - `per-ip`: 10 requests per minute per client address, all 10 at once if they come
//!   at once (one comes back every 6 s);
//! - `global`: 100 requests per second over all clients, bursts of up to 200.
//!
//! Run it:
//!
//! ```text
//! cargo run --example quickstart            # or PORT=8080 cargo run --example quickstart
//! ```
//!
//! Then, in another terminal, send 12 requests in a row: the first 10 (the burst) get
//! `200`, the last two `429` (an 11th would pass only if the loop took more than 6 s: a
//! token comes back every 6 s; `tests/readme.rs` checks it).
//!
//! ```text
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```
//!
//! See the headers (right after the loop they come with a `429`; a minute later, with the
//! bucket full again, as here):
//!
//! ```text
//! curl -i http://127.0.0.1:3000/
//! ```
//!
//! ```text
//! HTTP/1.1 200 OK
//! ratelimit-policy: "per-ip";q=10;w=60, "global";q=200;w=2
//! ratelimit: "per-ip";r=9;t=6, "global";r=199;t=1
//!
//! hello, you have 9 requests left
//! ```
//!
//! A refused request gets `429 Too Many Requests` with `Retry-After`,
//! `Cache-Control: no-store` and an `application/problem+json` body.
//! Refusals are logged at `INFO` (target `tollgate::refused`), at most one line every
//! 100 ms with the count of the others.

use std::net::SocketAddr;

use axum::{Router, routing::get};
use tollgate::{Decision, Limit, Quota, RateLimitLayer, key::PeerIp, store::MemoryStore};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Logs, `info` unless RUST_LOG says otherwise.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    // Two limits, one layer. `build` checks the configuration (names, costs, quotas).
    let limits = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::new("per-ip", Quota::per_minute(10)).key(PeerIp::new()))
        // No `.key(..)`: one bucket shared by every request.
        .limit(Limit::new("global", Quota::per_second(100).burst(200)))
        .build()?;

    // `route_layer` limits the routes above it only; unknown paths get a plain 404
    // without touching any bucket.
    let app = Router::new().route("/", get(hello)).route_layer(limits);

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "try: for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/; done"
    );

    // `PeerIp` reads the client address from axum's `ConnectInfo`, so serve the app
    // with connection info.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// The middleware hands the handler its `Decision`: what each limit said. (The `Limiter`
/// handle, to check or reset buckets from a handler, comes from the router's state:
/// `Router::with_state(limits.limiter())` and `State<Limiter>`.)
async fn hello(decision: Decision) -> String {
    match decision.limit("per-ip").and_then(|l| l.remaining()) {
        Some(left) => format!("hello, you have {left} requests left\n"),
        None => "hello\n".to_owned(),
    }
}
