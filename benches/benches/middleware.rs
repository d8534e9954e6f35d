//! The middleware against a bare axum router and `tower_governor`, in the same run.
//!
//! One axum router with a single route, `GET /` answering `"hello"`, three ways:
//!
//! - `bare`: no limiter;
//! - `noop_layer`: an identity `route_layer`: what any layer on a route costs in axum
//!   (the route's service is boxed once more and cloned per request), the floor under
//!   every middleware;
//! - `tollgate`: [`RateLimitLayer`] on the route, keyed by [`PeerIp`], with the default
//!   headers (IETF `RateLimit` / `RateLimit-Policy`, and the problem-details body on 429);
//! - `tower_governor`: its `GovernorLayer` on the route, keyed by the peer IP, with
//!   `.use_headers()` so that it emits its `x-ratelimit-*` headers too.
//!
//! Every request is dispatched the way `axum::serve` does it: the router is given its
//! state once (`with_state(())`, which builds each route once instead of per request),
//! then each request gets a clone of it and `oneshot`, on a current-thread tokio runtime;
//! it carries the peer address as axum's
//! `ConnectInfo<SocketAddr>`, and its response is dropped. Requests are built before the
//! clock starts, in batches of 1024, and each batch runs inside one `block_on`.
//!
//! Paths, reported as `middleware/<path>/<impl>` with throughput in requests per second:
//!
//! - `allowed`: a quota that never runs out (every response must be 200);
//! - `denied`: a bucket of one token, spent before measuring, that refills once a day
//!   (every response must be 429). `bare` has no such path.
//! - `banned`: tollgate only, `refused` (the `denied` case again) beside `banned` (the
//!   same limit with a [`Ban`](tollgate::Ban) after one refusal, for a day: every
//!   response must be 403, refused before the store is asked).
//!
//! Every response's status is checked during the measurement; a wrong one fails the run.
//!
//! Run with `cargo bench -p tollgate-bench --bench middleware` (add e.g. `-- denied` to filter).

// `criterion_group!` defines an undocumented public function.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use axum::Router;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use http::StatusCode;
use tokio::runtime::Runtime;
use tollgate::key::PeerIp;
use tollgate::store::MemoryStore;
use tollgate::{Ban, Limit, Quota, RateLimitLayer};
use tollgate_bench::routers::{bare, request, tollgate, tower_governor};
use tower::ServiceExt;

/// Requests built ahead of one timed `block_on`.
const BATCH: u64 = 1024;

/// The rate-limit header each implementation must send.
fn header_of(name: &str) -> Option<&'static str> {
    match name {
        "tollgate" => Some("ratelimit"),
        "tower_governor" => Some("x-ratelimit-remaining"),
        _ => None,
    }
}

/// Sends one request; checks its status and that the limiter's header is there.
fn probe(rt: &Runtime, name: &str, app: &Router, expected: StatusCode) {
    let response = rt.block_on(app.clone().oneshot(request())).unwrap();
    assert_eq!(response.status(), expected, "{name}");
    if let Some(header) = header_of(name) {
        assert!(
            response.headers().contains_key(header),
            "{name}: no {header} header in {:?}",
            response.headers()
        );
    }
}

/// Runs `iters` requests through `app`, timing only their dispatch; panics if any
/// response is not `expected`.
fn timed(rt: &Runtime, app: &Router, expected: StatusCode, iters: u64) -> Duration {
    let mut elapsed = Duration::ZERO;
    let mut left = iters;
    let mut requests = Vec::with_capacity(BATCH as usize);
    while left > 0 {
        let n = left.min(BATCH);
        left -= n;
        requests.extend((0..n).map(|_| request()));
        let wrong = rt.block_on(async {
            let start = Instant::now();
            let mut wrong = 0u64;
            for request in requests.drain(..) {
                let response = app.clone().oneshot(request).await.unwrap();
                wrong += u64::from(response.status() != expected);
            }
            elapsed += start.elapsed();
            wrong
        });
        assert_eq!(wrong, 0, "{wrong} of {n} responses were not {expected}");
    }
    elapsed
}

fn bench(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
    name: &str,
    app: Router,
    expected: StatusCode,
) {
    let app = app.with_state(());
    group.bench_function(name, |b| {
        b.iter_custom(|iters| timed(rt, &app, expected, iters));
    });
}

fn middleware(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // Never runs out: tollgate refills a million tokens a second into a bucket of a
    // billion, tower_governor one token a nanosecond into a bucket of u32::MAX.
    let allowed: [(&str, Router); 4] = [
        ("bare", bare()),
        (
            "noop_layer",
            bare().route_layer(tower::layer::util::Identity::new()),
        ),
        (
            "tollgate",
            tollgate(Quota::per_second(1_000_000).burst(1_000_000_000)),
        ),
        (
            "tower_governor",
            tower_governor(Duration::from_nanos(1), u32::MAX),
        ),
    ];
    let mut group = c.benchmark_group("middleware/allowed");
    group.throughput(Throughput::Elements(1));
    for (name, app) in allowed {
        for _ in 0..3 {
            probe(&rt, name, &app, StatusCode::OK);
        }
        bench(&mut group, &rt, name, app, StatusCode::OK);
    }
    group.finish();

    // One token, then one a day.
    let denied: [(&str, Router); 2] = [
        ("tollgate", tollgate(Quota::per_day(1))),
        (
            "tower_governor",
            tower_governor(Duration::from_secs(86_400), 1),
        ),
    ];
    let mut group = c.benchmark_group("middleware/denied");
    group.throughput(Throughput::Elements(1));
    for (name, app) in denied {
        probe(&rt, name, &app, StatusCode::OK);
        for _ in 0..3 {
            probe(&rt, name, &app, StatusCode::TOO_MANY_REQUESTS);
        }
        bench(&mut group, &rt, name, app, StatusCode::TOO_MANY_REQUESTS);
    }
    group.finish();

    // A refusal beside a banned key's request, in the same run.
    let ban = Ban::after(1).for_(Duration::from_secs(86_400));
    let banning = bare().route_layer(
        RateLimitLayer::builder(MemoryStore::new())
            .limit(
                Limit::new("per-ip", Quota::per_day(1))
                    .key(PeerIp::new())
                    .ban(ban),
            )
            .build()
            .unwrap(),
    );
    let mut group = c.benchmark_group("middleware/banned");
    group.throughput(Throughput::Elements(1));
    // The floor under both: a layer that does nothing.
    let floor = bare().route_layer(tower::layer::util::Identity::new());
    bench(&mut group, &rt, "noop_layer", floor, StatusCode::OK);
    let refused = tollgate(Quota::per_day(1));
    probe(&rt, "tollgate", &refused, StatusCode::OK);
    probe(&rt, "tollgate", &refused, StatusCode::TOO_MANY_REQUESTS);
    bench(
        &mut group,
        &rt,
        "refused",
        refused,
        StatusCode::TOO_MANY_REQUESTS,
    );
    probe(&rt, "tollgate", &banning, StatusCode::OK);
    probe(&rt, "tollgate", &banning, StatusCode::TOO_MANY_REQUESTS);
    probe(&rt, "banned", &banning, StatusCode::FORBIDDEN);
    bench(&mut group, &rt, "banned", banning, StatusCode::FORBIDDEN);
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = middleware
}
criterion_main!(benches);
