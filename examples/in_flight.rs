//! In-flight limits: at most 2 requests per API key streaming at once.
//!
//! ```text
//! cargo run -p tollgate --example in_flight
//! curl -N -H 'x-api-key: k' localhost:3000/stream     # in two terminals: both stream
//! curl -i -H 'x-api-key: k' localhost:3000/stream     # a third: 429, Retry-After: 1
//! # Interrupt one stream (Ctrl-C): its unit comes back at once; the third passes.
//! curl -i -H 'x-api-key: other' localhost:3000/stream # another key has its own units
//! ```
//!
//! Each response streams a line a second for ten seconds: the unit is held until the body
//! ends or the client goes away, not until the handler returns.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use tollgate::key::Header;
use tollgate::store::MemoryStore;
use tollgate::{Limit, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::in_flight("streams", 2).key(Header::new("x-api-key")))
        .build()?;
    let app = Router::new().route("/stream", get(stream)).layer(layer);
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// Ten lines, one a second.
async fn stream() -> Body {
    let lines = futures_util::stream::unfold(0, |i| async move {
        if i == 10 {
            return None;
        }
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Some((Ok::<_, Infallible>(format!("line {i}\n")), i + 1))
    });
    Body::from_stream(lines)
}
