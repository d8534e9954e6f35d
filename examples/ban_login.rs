//! Bans that escalate, on a login form: 5 attempts a minute per client address; 3
//! refusals within a minute ban the address for 10 seconds, 20 for a repeat within a
//! minute of the ban's end, then 40, at most 80. A banned address gets `403` with the
//! ban's remaining time as `Retry-After`, before the limiter's store is asked, and its
//! requests never count. `GET /bans` lists the bans, `DELETE /bans/{ip}` lifts one,
//! `PUT /bans/{ip}` bans an address for an hour by hand. Each ban is logged once.
//!
//! # Run it
//!
//! ```text
//! cargo run -p tollgate --example ban_login --features axum            # PORT=8080 to move it
//! cargo run -p tollgate --example ban_login --features axum,redis      # with REDIS_URL=redis://127.0.0.1/
//! ```
//!
//! # Try it
//!
//! ```text
//! for i in $(seq 1 9); do curl -s -o /dev/null -w '%{http_code} ' -X POST localhost:3000/login; done; echo
//! # 200 200 200 200 200 429 429 429 403: the fifth attempt was the last, three 429s banned
//! curl -si -X POST localhost:3000/login | grep -i -e '^HTTP' -e retry-after
//! # HTTP/1.1 403 Forbidden, retry-after: 10 (or less)
//! curl -s localhost:3000/bans                 # 127.0.0.1 banned for N ms, level 0
//! curl -s -X DELETE localhost:3000/bans/127.0.0.1
//! curl -s -X PUT localhost:3000/bans/192.0.2.1
//! ```
//!
//! With `REDIS_URL` set (and feature `redis`), several copies of the server on different
//! `PORT`s share their bans: a ban begun by one is refused by the others from their first
//! request of that address.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::{get, post, put};
use http::StatusCode;
use tollgate::key::PeerIp;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Ban, Limit, Limiter, Quota, RateLimitLayer};

fn login_limit() -> Limit {
    Limit::new("login", Quota::per_minute(5))
        .key(PeerIp::new())
        .ban(
            Ban::after(3)
                .within(Duration::from_secs(60))
                .for_(Duration::from_secs(10))
                .escalate(2.0)
                .max(Duration::from_secs(80))
                .forget(Duration::from_secs(60)),
        )
}

fn app(store: impl Store) -> Result<Router, tollgate::ConfigError> {
    let layer = RateLimitLayer::builder(store)
        .limit(login_limit())
        .build()?;
    // The handlers get the layer's limiter from the router's state: nothing per request.
    let limiter = layer.limiter();
    Ok(Router::new()
        .route("/login", post(|| async { "welcome\n" }).route_layer(layer))
        .route("/bans", get(list))
        .route("/bans/{ip}", put(ban).delete(lift))
        .with_state(limiter))
}

async fn list(State(limiter): State<Limiter>) -> String {
    let bans = limiter.bans("login").unwrap_or_default();
    if bans.is_empty() {
        return "no bans\n".into();
    }
    bans.iter()
        .map(|b| {
            format!(
                "{} banned for {} ms, level {}\n",
                b.key,
                b.remaining.as_millis(),
                b.level
            )
        })
        .collect()
}

async fn ban(State(limiter): State<Limiter>, Path(ip): Path<IpAddr>) -> StatusCode {
    let key = PeerIp::new().key(ip);
    match limiter.ban("login", key, Duration::from_secs(3600)) {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(_) => StatusCode::NOT_FOUND,
    }
}

async fn lift(State(limiter): State<Limiter>, Path(ip): Path<IpAddr>) -> StatusCode {
    match limiter.lift_ban("login", PeerIp::new().key(ip)) {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(_) => StatusCode::NOT_FOUND,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let app = match std::env::var("REDIS_URL") {
        #[cfg(feature = "redis")]
        Ok(url) => app(tollgate::store::RedisStore::open(&url)?)?,
        #[cfg(not(feature = "redis"))]
        Ok(_) => return Err("REDIS_URL needs the `redis` feature".into()),
        Err(_) => app(MemoryStore::new())?,
    };
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://127.0.0.1:{port}");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
