//! Delay mode: requests over the limit wait for their turn instead of getting a 429
//! (nginx's `burst` + `delay`), up to a bound.
//!
//! `GET /` has one limit, `smooth`: 10 per second per client address with a burst of 5, in
//! delay mode with `max_wait` 2 s and `max_waiters` 100 ([`Limit::delay`]). From one
//! client, 40 concurrent requests get:
//!
//! - 5 answers at once (the burst);
//! - then one answer about every 100 ms: each waiting request reserved its token when it
//!   came, so they are answered in the order they came, one per emission interval;
//! - those that would have to wait more than 2 s (about the 26th on): `429` at once, with
//!   `Retry-After`.
//!
//! A client that goes away while it waits (Ctrl-C on curl) gives its token back. A
//! waiting request holds no readied inner service and no lock; at most 100 wait at once,
//! the rest get `429` at once.
//!
//! # Run it
//!
//! ```text
//! cargo run -p tollgate --example delay_queue                    # in memory; PORT=8080 to move it
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p tollgate --example delay_queue --features redis
//! ```
//!
//! # Try it
//!
//! ```text
//! seq 40 | xargs -P 40 -I{} curl -s -o /dev/null -w '%{http_code} %{time_total}\n' http://127.0.0.1:3000/ | sort -k2 -n
//! # 200 0.002  (x5)
//! # 429 0.003  (x15, at once)
//! # 200 0.101
//! # 200 0.201
//! # ...
//! # 200 2.001
//! ```
//!
//! `DEMO=1` sends those 40 requests itself and prints when each was answered.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use tollgate::key::PeerIp;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Limit, Quota, RateLimitLayer};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    let app = match std::env::var("REDIS_URL").ok() {
        #[cfg(feature = "redis")]
        Some(url) => {
            let conn = redis::Client::open(url.as_str())?
                .get_connection_manager()
                .await?;
            // The host only: the URL may hold a password.
            let host = url.rsplit('@').next().unwrap_or(&url);
            tracing::info!(%host, "using RedisStore");
            app(tollgate::store::RedisStore::new(conn).prefix("delay-queue:"))?
        }
        #[cfg(not(feature = "redis"))]
        Some(_) => {
            tracing::warn!(
                "REDIS_URL is set but this build has no `redis` feature \
                 (cargo run -p tollgate --example delay_queue --features redis): using MemoryStore"
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
        demo(addr).await?;
        return Ok(());
    }
    server.await?;
    Ok(())
}

fn app<St: Store>(store: St) -> Result<Router, tollgate::ConfigError> {
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("smooth", Quota::per_second(10).burst(5))
                .key(PeerIp::new())
                .delay(Duration::from_secs(2), 100),
        )
        .build()?;
    Ok(Router::new()
        .route("/", get(|| async { "ok\n" }))
        .layer(layer))
}

/// 40 concurrent requests from this process; prints each answer's status and time.
async fn demo(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            tokio::spawn(async move {
                let mut s = tokio::net::TcpStream::connect(addr).await?;
                s.write_all(b"GET / HTTP/1.1\r\nhost: demo\r\nconnection: close\r\n\r\n")
                    .await?;
                let mut buf = Vec::new();
                s.read_to_end(&mut buf).await?;
                let text = String::from_utf8_lossy(&buf).into_owned();
                let status = text.split(' ').nth(1).unwrap_or("?").to_owned();
                Ok::<_, std::io::Error>((t0.elapsed(), status))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await??);
    }
    answers.sort();
    for (at, status) in &answers {
        println!("{status} after {:>5} ms", at.as_millis());
    }
    let ok = answers.iter().filter(|(_, s)| s == "200").count();
    println!("{ok} answered 200, {} answered 429", answers.len() - ok);
    Ok(())
}
