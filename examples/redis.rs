//! The quickstart's limits, shared by every instance through Redis.
//!
//! Run two instances against one Redis (default `redis://127.0.0.1:6379`, or `$REDIS_URL`):
//!
//! ```text
//! PORT=3000 cargo run -p tollgate --example redis --features redis &
//! PORT=3001 cargo run -p tollgate --example redis --features redis &
//! ```
//!
//! Then spend one client's burst of 10 across both (the second instance sees what the
//! first one counted):
//!
//! ```text
//! for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/; done
//! for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3001/; done
//! # 200 200 200 200 200 200 200 200 200 200 429 429
//! ```
//!
//! Stop Redis and the instances keep limiting, each on its own (the default failure
//! policy: a local limiter with the same quota); start it again and they share again.
//!
//! With `LEASE=1`, the `global` limit is spent from leases: each instance takes tokens
//! from Redis in batches and decides most requests without a call (`tollgate::Lease`):
//!
//! ```text
//! LEASE=1 PORT=3000 cargo run -p tollgate --example redis --features redis
//! ```

use std::net::SocketAddr;

use axum::routing::get;
use axum::{Extension, Router};
use tollgate::key::PeerIp;
use tollgate::store::RedisStore;
use tollgate::{Decision, Lease, Limit, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();

    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // The app starts even if Redis is down: the store connects on the first request and
    // reconnects by itself; until then the limits fall back to local limiting.
    let store = RedisStore::open(&url)?.prefix("tollgate-example:");

    let mut global = Limit::new("global", Quota::per_second(100).burst(200));
    if std::env::var("LEASE").is_ok_and(|v| v == "1") {
        global = global.lease(Lease::auto());
        println!("the global limit is leased (LEASE=1)");
    }
    let limits = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
        .limit(global)
        .build()?;

    let app = Router::new().route("/", get(hello)).route_layer(limits);

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    // The host only: the URL may hold a password.
    let host = url.rsplit('@').next().unwrap_or(&url);
    println!("listening on http://{addr}, limits shared through Redis at {host}");
    println!(
        "try: for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/; done"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

async fn hello(Extension(decision): Extension<Decision>) -> String {
    let left = decision.limit("per-ip").and_then(|l| l.remaining());
    format!("hello; {left:?} requests left in your burst\n")
}
