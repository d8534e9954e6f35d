//! An axum server for HTTP load tests: `GET /` answers `hello`, behind one of several
//! rate limiters, so that `wrk` can compare them (`scripts/http_compare.sh` does).
//!
//! ```text
//! cargo run -p tollgate-bench --release --bin http_bench_server -- --mode tollgate-allow --port 3000
//! cargo run -p tollgate-bench --release --bin http_bench_server --features redis -- \
//!     --mode tollgate-redis --port 3000 --redis-url redis://127.0.0.1:6379/
//! ```
//!
//! Modes (`--mode`), each on the route only (`route_layer`), keyed by the peer IP where
//! there is a key:
//!
//! - `plain`: the bare router, no limiter;
//! - `governor`: `tower_governor` with its `x-ratelimit-*` headers on (`.use_headers()`),
//!   one token a nanosecond into a bucket of `u32::MAX`: nothing is refused;
//! - `tollgate-allow`: tollgate's [`RateLimitLayer`] on a [`MemoryStore`] with the default
//!   headers, a million tokens a second into a bucket of a billion: nothing is refused;
//! - `tollgate-deny`: the same with one token a day, so every request after the first is
//!   refused (`429` with the problem-details body);
//! - `tollgate-redis` (feature `redis`): as `tollgate-allow` on a `RedisStore` at
//!   `--redis-url` (default `redis://127.0.0.1:6379/`), keys under
//!   `tollgate-http-bench:`, failing closed: a request Redis did not decide is a 503, not
//!   a decision of the local fallback.
//!
//! It serves on `127.0.0.1:--port` (default 3000) with axum's connection info, on tokio's
//! multi-threaded runtime, until killed. It prints `listening on …` once it accepts
//! connections.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tollgate::key::PeerIp;
use tollgate::store::MemoryStore;
use tollgate::{Quota, RateLimitLayer};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

/// A quota nothing in a benchmark runs out of.
const NEVER_REFUSED: Quota = Quota::per_second(1_000_000).burst(1_000_000_000);

const USAGE: &str = "usage: http_bench_server --mode plain|governor|tollgate-allow|tollgate-deny|tollgate-redis \
    [--port P] [--redis-url U]";

struct Args {
    mode: String,
    port: u16,
    redis_url: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        mode: String::new(),
        port: 3000,
        redis_url: "redis://127.0.0.1:6379/".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--mode" => args.mode = value,
            "--port" => args.port = value.parse().map_err(|e| format!("--port: {e}"))?,
            "--redis-url" => args.redis_url = value,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.mode.is_empty() {
        return Err("--mode is required".into());
    }
    Ok(args)
}

fn plain() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

/// The router for `args.mode`.
async fn app(args: &Args) -> Result<Router, Box<dyn std::error::Error>> {
    Ok(match args.mode.as_str() {
        "plain" => plain(),
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .period(Duration::from_nanos(1))
                .burst_size(u32::MAX)
                .use_headers()
                .finish()
                .ok_or("invalid tower_governor configuration")?;
            plain().route_layer(GovernorLayer::new(config))
        }
        "tollgate-allow" => plain().route_layer(RateLimitLayer::new(
            NEVER_REFUSED,
            PeerIp::new(),
            MemoryStore::new(),
        )),
        "tollgate-deny" => plain().route_layer(RateLimitLayer::new(
            Quota::per_day(1),
            PeerIp::new(),
            MemoryStore::new(),
        )),
        "tollgate-redis" => redis_app(&args.redis_url).await?,
        other => return Err(format!("unknown mode {other:?}\n{USAGE}").into()),
    })
}

#[cfg(feature = "redis")]
async fn redis_app(url: &str) -> Result<Router, Box<dyn std::error::Error>> {
    // Connect now, so that a server that is not there fails the start instead of
    // sending every request to the local fallback.
    let conn = redis::Client::open(url)?.get_connection_manager().await?;
    let store = tollgate::store::RedisStore::new(conn).prefix("tollgate-http-bench:");
    let layer = RateLimitLayer::builder(store)
        .limit(
            tollgate::Limit::new("per-ip", NEVER_REFUSED)
                .key(PeerIp::new())
                .on_store_failure(tollgate::FailurePolicy::Deny),
        )
        .build()?;
    Ok(plain().route_layer(layer))
}

#[cfg(not(feature = "redis"))]
async fn redis_app(_url: &str) -> Result<Router, Box<dyn std::error::Error>> {
    Err("mode tollgate-redis needs the `redis` feature: build with --features redis".into())
}

#[tokio::main]
async fn main() -> ExitCode {
    match serve().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http_bench_server: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().map_err(|e| format!("{e}\n{USAGE}"))?;
    let app = app(&args).await?;
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], args.port))).await?;
    println!(
        "listening on http://{} ({})",
        listener.local_addr()?,
        args.mode
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
