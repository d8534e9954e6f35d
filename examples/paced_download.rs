//! Downloads paced to 1 MiB/s per client address (nginx's `limit_rate`, per key), the
//! first MiB of each download at full speed (`limit_rate_after`).
//!
//! `GET /file?mib=N` streams N MiB (default 10) in 64 KiB chunks through a
//! [`PacedBody`]: its bytes are charged to the limit `download` (1 MiB/s, 256 KiB at once)
//! of the client's address as they pass, so two downloads from one address share the
//! rate, and a download is read from its source no faster than it is sent. The layer's
//! other limit, `per-ip`, counts requests as usual; `download` counts no request.
//!
//! # Run it
//!
//! ```text
//! cargo run -p tollgate --example paced_download                 # in memory; PORT=8080 to move it
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p tollgate --example paced_download --features redis
//! ```
//!
//! With Redis, every instance paces the same address from one bucket.
//!
//! # Try it
//!
//! ```text
//! curl -s -o /dev/null -w '%{size_download} bytes in %{time_total} s\n' 'http://127.0.0.1:3000/file?mib=10'
//! # 10485760 bytes in 8.75 s   (1 MiB free, 256 KiB of burst, 8.75 MiB at 1 MiB/s)
//! ```
//!
//! `DEMO=1` downloads 3 MiB itself and prints how long it took.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use tollgate::key::PeerIp;
use tollgate::pace::{Direction, OverLimit, PacedBody, Per};
use tollgate::store::{MemoryStore, Store};
use tollgate::{Limit, Limiter, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let app = match std::env::var("REDIS_URL").ok() {
        #[cfg(feature = "redis")]
        Some(url) => {
            let conn = redis::Client::open(url.as_str())?
                .get_connection_manager()
                .await?;
            println!("using RedisStore at {url}");
            app(tollgate::store::RedisStore::new(conn).prefix("paced-download:"))?
        }
        #[cfg(not(feature = "redis"))]
        Some(_) => {
            eprintln!(
                "REDIS_URL is set but this build has no `redis` feature \
                 (cargo run -p tollgate --example paced_download --features redis): using MemoryStore"
            );
            app(MemoryStore::new())?
        }
        None => app(MemoryStore::new())?,
    };
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    if std::env::var_os("DEMO").is_some() {
        tokio::spawn(async move { server.await });
        return demo(addr).await;
    }
    server.await?;
    Ok(())
}

/// The app: `per-ip` requests, `download` bytes.
fn app<St: Store>(store: St) -> Result<Router, tollgate::ConfigError> {
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_minute(60)).key(PeerIp::new()))
        .limit(
            // 1 MiB/s, 256 KiB at once, counted in KiB (a quota counts at most a token a
            // microsecond).
            Limit::new("download", Quota::per_second(1024).burst(256))
                .per(Per::Byte)
                .unit(1024)
                .direction(Direction::Out)
                .rate_after(1 << 20)
                .over_limit(OverLimit::wait(Duration::from_secs(30))),
        )
        .build()?;
    Ok(Router::new()
        .route("/file", get(file))
        .with_state(layer.limiter())
        .layer(layer))
}

/// N MiB of a generated file, paced per client address.
async fn file(
    State(limiter): State<Limiter>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    RawQuery(query): RawQuery,
) -> Result<Body, (StatusCode, String)> {
    let mib = query
        .and_then(|q| q.strip_prefix("mib=")?.parse::<usize>().ok())
        .unwrap_or(10)
        .min(1024);
    let chunks = (0..mib * 16).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 64 << 10])));
    let source = Body::from_stream(futures_util::stream::iter(chunks));
    let pacer = limiter
        .pacer("download", PeerIp::new().key(peer.ip()))
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        // One store call per 64 KiB.
        .batch(64);
    Ok(Body::new(PacedBody::new(source, pacer)))
}

/// Downloads 3 MiB and prints the time it took.
async fn demo(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let start = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /file?mib=3 HTTP/1.1\r\nhost: demo\r\nconnection: close\r\n\r\n")
        .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let elapsed = start.elapsed();
    println!(
        "{} bytes (with headers and chunk sizes) in {:.2} s: 1 MiB free, 256 KiB of burst, \
         1.75 MiB at 1 MiB/s",
        buf.len(),
        elapsed.as_secs_f64()
    );
    Ok(())
}
