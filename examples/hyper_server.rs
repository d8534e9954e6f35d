//! The rate limiter on a plain hyper 1 server: no axum, just tower services.
//!
//! Same limits as the quickstart, on every request: `per-ip` 5 per second with bursts of
//! 10, and `global` 100 per second with bursts of 200. Without axum there is no
//! `ConnectInfo`, so the accept loop inserts [`PeerAddr`] into each request's extensions
//! for [`PeerIp`] to read.
//!
//! Run it:
//!
//! ```text
//! cargo run -p tollgate --example hyper_server            # or PORT=8080 cargo run -p tollgate --example hyper_server
//! ```
//!
//! Then send 12 requests in a row: the first 10 (the burst) get `200`, then `429` (an
//! 11th may pass if the loop is slow: a token comes back every 200 ms).
//!
//! ```text
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```
//!
//! And see the headers (once the bucket has refilled, a second or two later):
//!
//! ```text
//! curl -i http://127.0.0.1:3000/
//! # ratelimit-policy: "per-ip";q=10;w=2, "global";q=200;w=2
//! # ratelimit: "per-ip";r=9;t=1, "global";r=199;t=1
//! ```
//!
//! The server speaks HTTP/1.1 and HTTP/2 (`curl --http2-prior-knowledge` works too).

use std::convert::Infallible;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tollgate::key::{PeerAddr, PeerIp};
use tollgate::store::MemoryStore;
use tollgate::{Decision, Limit, Quota, RateLimitLayer};
use tower::ServiceBuilder;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    // Built once: clones of the layer share the limits and the store.
    let limits = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
        .limit(Limit::new("global", Quota::per_second(100).burst(200)))
        .build()?;

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "try: for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/; done"
    );

    loop {
        let (stream, remote) = listener.accept().await?;
        // One service stack per connection; only the (cheap) layer clone is new.
        let service = ServiceBuilder::new()
            // Outermost: tell `PeerIp` who the peer is.
            .map_request(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(PeerAddr(remote));
                request
            })
            .layer(limits.clone())
            .service_fn(hello);
        tokio::spawn(async move {
            // `auto` serves HTTP/1.1 and HTTP/2; `TowerToHyperService` adapts the tower
            // service to hyper's `Service` trait.
            let connection = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                .await;
            if let Err(error) = connection {
                tracing::debug!(%remote, error, "connection ended with an error");
            }
        });
    }
}

/// The handler. Its body type, `Full<Bytes>`, is also what the limiter's 429 responses are
/// made of (the default rejection needs a body that converts from `Bytes`).
async fn hello(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // The middleware leaves its `Decision` in the request extensions.
    let left = request
        .extensions()
        .get::<Decision>()
        .and_then(|decision| decision.limit("per-ip")?.remaining());
    let text = match left {
        Some(left) => format!("hello, you have {left} requests left\n"),
        None => "hello\n".to_owned(),
    };
    Ok(Response::new(Full::new(Bytes::from(text))))
}
