//! The two overhead targets of issue 12, measured in one process (in-process, no
//! network): run it with `--release`.
//!
//! 1. The allowed path with the `metrics` feature on: a layer whose counters are no-ops
//!    (built before a recorder is installed: what an application without a recorder
//!    pays) against the same layer built after installing the Prometheus recorder (real
//!    counters: one atomic add per limit, plus the near-limit check).
//! 2. A 2-thread refusal flood (skewed keys): a layer without offender tracking against
//!    one with it (sharded Space-Saving, `try_lock`).
//!
//! Rounds of each variant alternate, and the median round is reported, so drift on a
//! shared machine hits both sides alike. Requests are built ahead of each timed batch.
//!
//! ```text
//! cargo run -p tollgate-bench --release --bin observability_bench --features metrics
//! ```

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate::key::{PeerAddr, PeerIp};
use tollgate::service::RateLimit;
use tollgate::store::MemoryStore;
use tollgate::{Limit, OffenderTracking, Quota, RateLimitLayer, RefusalLog};
use tower::Service;
use tower::layer::Layer;

type Inner =
    tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<Full<Bytes>>, Infallible>>>;
type Limited = RateLimit<Inner, MemoryStore, tollgate::response::DefaultOnRejection>;

fn ok(_: Request<()>) -> Ready<Result<Response<Full<Bytes>>, Infallible>> {
    ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
}

const BATCH: usize = 1024;

fn request(ip: u32) -> Request<()> {
    let mut r = Request::get("/").body(()).unwrap();
    r.extensions_mut().insert(PeerAddr(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + ip)),
        4000,
    )));
    r
}

/// Calls the service on each request (answered at once by the memory store).
fn run(service: &mut Limited, requests: Vec<Request<()>>, expected: u16) {
    let mut cx = Context::from_waker(Waker::noop());
    for r in requests {
        let Poll::Ready(Ok(())) = service.poll_ready(&mut cx) else {
            unreachable!()
        };
        let future = pin!(service.call(r));
        match future.poll(&mut cx) {
            Poll::Ready(Ok(response)) => {
                assert!(expected == 0 || response.status().as_u16() == expected)
            }
            _ => unreachable!("the memory store answers at once"),
        }
    }
}

/// ns per request over `batches` batches of one thread.
fn timed(
    service: &mut Limited,
    batches: usize,
    keys: &dyn Fn(usize) -> u32,
    expected: u16,
) -> Duration {
    let mut total = Duration::ZERO;
    for b in 0..batches {
        let requests: Vec<_> = (0..BATCH).map(|i| request(keys(b * BATCH + i))).collect();
        let start = Instant::now();
        run(service, requests, expected);
        total += start.elapsed();
    }
    total / (batches * BATCH) as u32
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn service(layer: &RateLimitLayer<MemoryStore>) -> Limited {
    layer.layer(tower::service_fn(ok as fn(_) -> _))
}

/// The quickstart's two limits, with quotas that never refuse in the bench.
fn allowing() -> RateLimitLayer<MemoryStore> {
    RateLimitLayer::builder(MemoryStore::new())
        .limit(
            Limit::new("per-ip", Quota::per_second(1_000_000).burst(100_000_000))
                .key(PeerIp::new()),
        )
        .limit(Limit::new(
            "global",
            Quota::per_second(1_000_000).burst(100_000_000),
        ))
        .build()
        .unwrap()
}

/// A limit every request of the flood is refused by (after each key's first).
fn refusing(track: bool) -> RateLimitLayer<MemoryStore> {
    let builder = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::new("per-ip", Quota::per_hour(1)).key(PeerIp::new()))
        .refusal_log(RefusalLog::off());
    let builder = if track {
        builder.track_offenders(OffenderTracking::new())
    } else {
        builder
    };
    builder.build().unwrap()
}

/// A skewed key: 1 000 addresses, Zipf-like (the k-th address about 1/k as often).
fn skewed(i: usize) -> u32 {
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    let u = (x % 1_000_000) as f64 / 1_000_000.0;
    // Density 1/x over [1, 1001): x = 1001^u.
    1_001f64.powf(u) as u32
}

/// Two threads refusing at once; ns per refusal (wall time / refusals per thread).
fn flood(layer: &RateLimitLayer<MemoryStore>, batches: usize) -> Duration {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let mut service = service(layer);
                s.spawn(move || timed(&mut service, batches, &|i| skewed(i * 2 + t), 429))
            })
            .collect();
        let per: Vec<Duration> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (per[0] + per[1]) / 2
    })
}

fn main() {
    let rounds = 15;
    let batches = 200; // 204,800 requests per round and variant

    // 1. Metrics on the allowed path.
    let without = allowing(); // built before the recorder: no-op counters
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let with = allowing(); // real counters
    let (mut a, mut b) = (service(&without), service(&with));
    timed(&mut a, 20, &|i| (i % 1_000) as u32, 200);
    timed(&mut b, 20, &|i| (i % 1_000) as u32, 200);
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        ra.push(timed(&mut a, batches, &|i| (i % 1_000) as u32, 200));
        rb.push(timed(&mut b, batches, &|i| (i % 1_000) as u32, 200));
    }
    let (ma, mb) = (median(ra), median(rb));
    let rendered = prometheus.render();
    assert!(rendered.contains("tollgate_requests_total{limit=\"per-ip\",result=\"allowed\"}"));

    // 2. Offender tracking under a 2-thread refusal flood.
    let (plain, tracked) = (refusing(false), refusing(true));
    for layer in [&plain, &tracked] {
        // Each key's first request passes: spend them before timing.
        run(&mut service(layer), (0..=1_000).map(request).collect(), 0);
    }
    flood(&plain, 20);
    flood(&tracked, 20);
    let (mut rc, mut rd) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        rc.push(flood(&plain, batches / 2));
        rd.push(flood(&tracked, batches / 2));
    }
    let (mc, md) = (median(rc), median(rd));
    let top = tracked.limiter().top_refused("per-ip", 3).unwrap();

    println!("| target | without | with | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| allowed path, 2 limits: no recorder (no-op counters) vs Prometheus recorder | {} ns | {} ns | {:.3}x |",
        ma.as_nanos(),
        mb.as_nanos(),
        mb.as_secs_f64() / ma.as_secs_f64()
    );
    println!(
        "| refusal, 2-thread flood, skewed keys: no tracking vs offender tracking | {} ns | {} ns | {:.3}x |",
        mc.as_nanos(),
        md.as_nanos(),
        md.as_secs_f64() / mc.as_secs_f64()
    );
    println!(
        "top refused: {}",
        top.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
}
