//! Settled costs: a token budget per API key, as model APIs sell it. A request is admitted
//! on its estimate (`x-max-tokens`), and its actual usage, known only when its streamed
//! answer ends, is settled from a trailer: the difference taken (into debt of at most
//! 200 tokens) or given back.
//!
//! `GET /complete?words=N` streams N words, one every 50 ms, and reports the tokens it
//! used (N) in the trailer `x-usage-tokens`; `/complete-header?words=N` answers at once
//! with the usage in the header of that name. The limit `tokens`: 1,000 per minute per
//! `x-api-key`, a burst of 1,000.
//!
//! # Run it
//!
//! ```text
//! cargo run -p tollgate --example token_budget          # PORT=8080 to move it
//! ```
//!
//! # Try it
//!
//! ```text
//! # An estimate of 500 that used 20: 480 go back when the stream ends.
//! curl -s --raw -H 'x-api-key: alice' -H 'x-max-tokens: 500' 'http://127.0.0.1:3000/complete?words=20'
//! curl -s -D- -o /dev/null -H 'x-api-key: alice' -H 'x-max-tokens: 1' 'http://127.0.0.1:3000/complete-header?words=0'
//! #   RateLimit: "tokens";r=979;... (about 1,000 - 20 - 1: the header is written on admission)
//! # An estimate of 1 that used 1,500 in a header: what is left, and 200 of debt, taken:
//! # the next requests get 429 until the debt has refilled.
//! curl -s -o /dev/null -H 'x-api-key: alice' -H 'x-max-tokens: 1' 'http://127.0.0.1:3000/complete-header?words=1500'
//! # A stream cut short (Ctrl-C, or curl -m 0.2): its estimate stands.
//! curl -s -m 0.2 -H 'x-api-key: alice' -H 'x-max-tokens: 50' 'http://127.0.0.1:3000/complete?words=100'
//! ```
//!
//! `DEMO=1` sends such requests itself and prints the tokens left after each.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Response, Uri};
use axum::routing::get;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tollgate::key::Header;
use tollgate::{Cost, Limit, Quota, RateLimitLayer, Settle};

/// `words=N` in the query (0 if absent).
fn words(uri: &Uri) -> u32 {
    uri.query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("words=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Streams `words` words, then the trailer `x-usage-tokens`.
async fn complete(uri: Uri) -> Response<Body> {
    let n = words(&uri);
    let words = futures_util::stream::iter(0..n)
        .then(|i| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, Infallible>(Frame::data(Bytes::from(format!("word{i} "))))
        })
        .chain(futures_util::stream::once(async move {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-usage-tokens", HeaderValue::from(n));
            Ok(Frame::trailers(trailers))
        }));
    Response::new(Body::new(StreamBody::new(words)))
}

/// Answers at once, its usage in the header.
async fn complete_header(uri: Uri) -> ([(&'static str, String); 1], &'static str) {
    ([("x-usage-tokens", words(&uri).to_string())], "done\n")
}

fn app() -> (Router, tollgate::Limiter) {
    let tokens = Limit::new("tokens", Quota::per_minute(1_000).burst(1_000))
        .key(Header::new("x-api-key"))
        .cost(Cost::header("x-max-tokens").default(1))
        // A trailer, or the header of that name in a response without a body.
        .settle(Settle::trailer("x-usage-tokens"))
        .max_debt(200);
    let layer = RateLimitLayer::builder(tollgate::store::MemoryStore::new())
        .limit(tokens)
        .build()
        .expect("a valid limit");
    let limiter = layer.limiter();
    let router = Router::new()
        .route("/complete", get(complete))
        .route("/complete-header", get(complete_header))
        .layer(layer);
    (router, limiter)
}

#[tokio::main]
async fn main() {
    let (router, limiter) = app();
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    if std::env::var_os("DEMO").is_some() {
        demo(router, limiter).await;
        return;
    }
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    println!("listening on http://{addr}");
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .expect("serve");
}

/// The requests of "Try it", through the router, with the tokens left after each.
async fn demo(router: Router, limiter: tollgate::Limiter) {
    use tower::ServiceExt;
    let send = |path: &str, estimate: u32| {
        axum::http::Request::get(path)
            .header("x-api-key", "alice")
            .header("x-max-tokens", estimate.to_string())
            .body(Body::empty())
            .unwrap()
    };
    let left = || async {
        limiter
            .peek("tokens", "alice")
            .await
            .unwrap()
            .remaining()
            .unwrap()
    };
    let res = router
        .clone()
        .oneshot(send("/complete?words=20", 500))
        .await
        .unwrap();
    println!(
        "streaming 20 words on an estimate of 500: {} left while it streams",
        left().await
    );
    res.into_body().collect().await.unwrap();
    println!("stream ended, 20 used: {} left", left().await);
    let res = router
        .clone()
        .oneshot(send("/complete?words=100", 50))
        .await;
    drop(res); // a client gone before the end: the estimate stands
    println!("a dropped stream: {} left", left().await);
    let res = router
        .clone()
        .oneshot(send("/complete-header?words=1500", 1))
        .await
        .unwrap();
    res.into_body().collect().await.unwrap();
    println!(
        "1,500 used on an estimate of 1: {} left (into debt of at most 200)",
        left().await
    );
    let res = router
        .clone()
        .oneshot(send("/complete-header?words=1", 1))
        .await
        .unwrap();
    println!("next request: {}", res.status());
}
