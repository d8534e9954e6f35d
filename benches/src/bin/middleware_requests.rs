//! Sends a number of requests through one of the middleware benchmark's routers, for
//! counting what they cost with a tool outside the process (`scripts/middleware_count.sh`
//! runs it under valgrind's cachegrind and reports instructions per request).
//!
//!   cargo run -p tollgate-bench --release --bin middleware_requests -- <config> <requests>
//!
//! Configs, the routers of `benches/middleware.rs` (`GET /` answering "hello", the peer
//! address in `ConnectInfo`, requests dispatched as `axum::serve` does: the router given
//! its state once, then a clone of it and `oneshot` per request, on a current-thread
//! runtime):
//!
//! - `bare`, `noop_layer`: no limiter; an identity `route_layer`;
//! - `tollgate`: `RateLimitLayer` keyed by the peer IP, a quota that never runs out (the
//!   default options: the `Decision` extension, not the `Limiter`'s);
//! - `tollgate_no_extensions`: the same without the `Decision` and `Limiter` extensions;
//! - `tollgate_routes`: `tollgate` with a route table of six entries (`/` among them),
//!   the request's entry found by matching its path;
//! - `tower_governor`: its layer with headers, never running out;
//! - `tollgate_denied`, `tower_governor_denied`: one token a day, spent by a first request
//!   before the others (every other response is a 429);
//! - `tollgate_banned`: the `tollgate_denied` limit with a `Ban` after one refusal, for a
//!   day: a first request passes, a second is refused and bans, every other is a 403
//!   refused before the store (compare with `tollgate_denied`);
//! - `tollgate_denied_constant`: the same refusals answered by a constant 429 (empty body,
//!   no rate-limit fields): what a denial costs besides its problem body and fields.
//!
//! Every response's status is checked; a wrong one ends the run with an error. The
//! requests are built in batches of 1,024 outside the loop that sends them, as in the
//! criterion benchmark.

use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::Response;
use http::StatusCode;
use tollgate::headers::HeaderStyle;
use tollgate::key::PeerIp;
use tollgate::response::Rejection;
use tollgate::store::MemoryStore;
use tollgate::{Limit, Quota, RateLimitLayer};
use tollgate_bench::counted;
use tollgate_bench::routers::{bare, request, tollgate, tower_governor};
use tower::ServiceExt;

/// The router of `config`, and the status its measured responses must have.
fn router(config: &str) -> Option<(Router, StatusCode)> {
    let plenty = Quota::per_second(1_000_000).burst(1_000_000_000);
    let ok = StatusCode::OK;
    let refused = StatusCode::TOO_MANY_REQUESTS;
    Some(match config {
        "bare" => (bare(), ok),
        "noop_layer" => (bare().route_layer(tower::layer::util::Identity::new()), ok),
        "tollgate" => (
            bare().route_layer(RateLimitLayer::new(
                plenty,
                PeerIp::new(),
                MemoryStore::new(),
            )),
            ok,
        ),
        "tollgate_no_extensions" => {
            let layer = RateLimitLayer::builder(MemoryStore::new())
                .limit(Limit::new("default", plenty).key(PeerIp::new()))
                .decision_extension(false)
                .limiter_extension(false)
                .build()
                .expect("a valid layer");
            (bare().route_layer(layer), ok)
        }
        "tower_governor" => (tower_governor(Duration::from_nanos(1), u32::MAX), ok),
        "tollgate_denied" => (tollgate(Quota::per_day(1)), refused),
        "tollgate_denied_constant" => {
            // The floor of a denial: the decision, then a constant 429 (an empty body, no
            // rate-limit fields; the layer still adds `Retry-After` and `Cache-Control`).
            let layer = RateLimitLayer::builder(MemoryStore::new())
                .limit(Limit::new("default", Quota::per_day(1)).key(PeerIp::new()))
                .headers(HeaderStyle::None)
                .on_rejection(|_: &Rejection<'_>| {
                    let mut response = Response::new(Body::empty());
                    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    response
                })
                .build()
                .expect("a valid layer");
            (bare().route_layer(layer), refused)
        }
        "tollgate_banned" => (
            bare().route_layer(
                RateLimitLayer::builder(MemoryStore::new())
                    .limit(
                        Limit::new("per-ip", Quota::per_day(1))
                            .key(PeerIp::new())
                            .ban(tollgate::Ban::after(1).for_(Duration::from_secs(86_400))),
                    )
                    .build()
                    .unwrap(),
            ),
            StatusCode::FORBIDDEN,
        ),
        "tollgate_routes" => {
            // `tollgate` with a route table of six entries: the request's route found by
            // its path among them.
            let layer = ["POST /login", "/users/{id}", "/api/{*rest}", "GET /health"]
                .into_iter()
                .fold(RateLimitLayer::builder(MemoryStore::new()), |b, route| {
                    b.route(route, Limit::new(route, plenty).key(PeerIp::new()))
                })
                .route(
                    "/orders/{id}/items",
                    Limit::new("items", plenty).key(PeerIp::new()),
                )
                .route("/", Limit::new("default", plenty).key(PeerIp::new()))
                .build()
                .expect("a valid layer");
            (bare().route_layer(layer), ok)
        }
        "tower_governor_denied" => (tower_governor(Duration::from_secs(86_400), 1), refused),
        _ => return None,
    })
}

fn main() -> ExitCode {
    let (config, (app, expected), requests) =
        match counted::args("middleware_requests", "<config> <requests>", router) {
            Ok(args) => args,
            Err(code) => return code,
        };
    // As `axum::serve` runs a router: its state given, each route built once.
    let app = app.with_state(());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // The denied configs' one token goes first.
    if expected != StatusCode::OK {
        let first = rt.block_on(app.clone().oneshot(request())).unwrap();
        assert_eq!(
            first.status(),
            StatusCode::OK,
            "{config}: the first request"
        );
    }
    // The banned config's first refusal bans.
    if expected == StatusCode::FORBIDDEN {
        let second = rt.block_on(app.clone().oneshot(request())).unwrap();
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS, "{config}");
    }
    let mut batch = Vec::with_capacity(1024);
    let mut left = requests;
    let mut wrong = 0u64;
    while left > 0 {
        let n = left.min(1024);
        left -= n;
        batch.extend((0..n).map(|_| request()));
        wrong += rt.block_on(async {
            let mut wrong = 0;
            for request in batch.drain(..) {
                let response = app.clone().oneshot(request).await.unwrap();
                wrong += u64::from(response.status() != expected);
            }
            wrong
        });
    }
    if wrong > 0 {
        eprintln!("{config}: {wrong} of {requests} responses were not {expected}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
