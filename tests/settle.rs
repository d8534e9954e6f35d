//! Settled costs: admitted on an estimate, settled at the actual cost when the work (or
//! the response body) ends; into debt of at most `max_debt`, each estimate counted once,
//! nothing kept for estimates dropped unsettled.
//!
//! A counting global allocator measures the heap, so the tests of this file take turns.

#![allow(unsafe_code)]
// the counting allocator
// The lock only makes the tests of this file take turns (each on a runtime of its own).
#![allow(clippy::await_holding_lock)]

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use proptest::prelude::*;
use support::{send, with_peer};
use tollgate::clock::FakeClock;
use tollgate::key::Header;
use tollgate::store::MemoryStore;
use tollgate::{ActualCost, Cost, Limit, LimitSpec, Limiter, Quota, RateLimitLayer, Settle};

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The tests of this file one at a time (one measures the live bytes).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

const T_NS: u64 = 1_000_000; // 1,000 per second
const BURST: u64 = 50;
const MAX_DEBT: u64 = 20;

fn tokens() -> LimitSpec {
    LimitSpec::new("tokens", Quota::per_second(1_000).burst(BURST)).max_debt(MAX_DEBT)
}

/// The bucket as the issue states it, in ns: admission on the estimate; a settle takes
/// the excess into debt of at most `MAX_DEBT` tokens (the rest forgiven) or gives the
/// overestimate back, never beyond full. `tat` is `max(TAT, now)`'s TAT.
struct Model {
    tat: u64,
    /// (instant, time units the bucket counted: positive taken, negative given back).
    charges: Vec<(u64, i128)>,
}

impl Model {
    fn level(&self, now: u64) -> u64 {
        self.tat.max(now)
    }

    fn admit(&mut self, now: u64, estimate: u64) -> bool {
        let new = self.level(now) + estimate * T_NS;
        if new - now > BURST * T_NS {
            return false;
        }
        self.charges.push((now, i128::from(new - self.level(now))));
        self.tat = new;
        true
    }

    fn settle(&mut self, now: u64, estimate: u64, actual: u64) {
        let before = self.level(now);
        let after = if actual > estimate {
            let cap = now + (BURST + MAX_DEBT) * T_NS;
            (before + (actual - estimate) * T_NS).min(cap).max(self.tat)
        } else {
            before.saturating_sub((estimate - actual) * T_NS).max(now)
        };
        self.charges
            .push((now, i128::from(after) - i128::from(before)));
        self.tat = after;
    }
}

fn now_ns(clock: &FakeClock) -> u64 {
    clock.elapsed().as_nanos() as u64
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random estimates, actual costs (below, at and far above the estimate), waits and
    /// estimates dropped unsettled: the limiter decides and leaves every bucket as the
    /// model does (so no estimate is counted twice: a settle moves the bucket by the
    /// difference only), and over every interval of length `d` the bucket counts at most
    /// `burst + d/T + max_debt` tokens.
    #[test]
    fn settled_costs_stay_within_burst_rate_and_debt(
        steps in prop::collection::vec((0u64..40, 1u64..=30, 0u64..120, any::<bool>()), 1..120)
    ) {
        let _one = lock();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let clock = FakeClock::at(Duration::from_secs(1_000));
        let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
            .limit(tokens())
            .build()
            .unwrap();
        let mut model = Model { tat: 0, charges: Vec::new() };
        rt.block_on(async {
            for (wait_ms, estimate, actual, dropped) in steps {
                clock.advance(Duration::from_millis(wait_ms));
                let now = now_ns(&clock);
                let e = limiter.admit("tokens", "k", estimate as u32).await.unwrap();
                let admitted = model.admit(now, estimate);
                prop_assert_eq!(e.is_allowed(), admitted);
                // The work takes a while.
                clock.advance(Duration::from_millis(wait_ms / 2));
                let now = now_ns(&clock);
                if dropped || !admitted {
                    drop(e); // the estimate stands
                } else {
                    e.settle(actual as u32).await.unwrap();
                    model.settle(now, estimate, actual);
                }
                let look = limiter.peek("tokens", "k").await.unwrap();
                let reset = look.outcome().unwrap().reset_after().as_nanos() as u64;
                prop_assert_eq!(reset, model.level(now) - now);
            }
            Ok(())
        })?;
        let tau = BURST * T_NS;
        for i in 0..model.charges.len() {
            let mut sum = 0i128;
            for j in i..model.charges.len() {
                sum += model.charges[j].1;
                let d = model.charges[j].0 - model.charges[i].0;
                let bound = i128::from(d + tau + MAX_DEBT * T_NS);
                prop_assert!(sum <= bound, "{} > {} over [{}, {}]", sum, bound, i, j);
            }
        }
    }
}

#[tokio::test]
async fn a_refused_estimate_settles_nothing_and_windows_and_leases_cannot_settle() {
    let _one = lock();
    let limiter = Limiter::builder(MemoryStore::new())
        .limit(LimitSpec::new("tokens", Quota::per_hour(10).burst(10)))
        .limit(
            LimitSpec::new("win", Quota::per_hour(10))
                .algorithm(tollgate::Algorithm::fixed_window()),
        )
        .build()
        .unwrap();
    let big = limiter.admit("tokens", "k", 8).await.unwrap();
    assert!(big.is_allowed());
    let refused = limiter.admit("tokens", "k", 5).await.unwrap();
    assert!(!refused.is_allowed());
    assert!(refused.settle(0).await.unwrap().is_none(), "took nothing");
    assert_eq!(
        limiter.peek("tokens", "k").await.unwrap().remaining(),
        Some(2)
    );
    // Exact: nothing to do.
    let exact = limiter.admit("tokens", "j", 3).await.unwrap();
    assert!(exact.settle(3).await.unwrap().is_none());
    assert_eq!(
        limiter.peek("tokens", "j").await.unwrap().remaining(),
        Some(7)
    );
    let err = limiter.admit("win", "k", 1).await.unwrap_err();
    assert!(
        matches!(err, tollgate::LimiterError::CannotSettle { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("GCRA"), "{err}");
    drop(big);
}

#[tokio::test]
async fn memory_is_flat_after_100_000_estimates_dropped_unsettled() {
    let _one = lock();
    let limiter = Limiter::builder(MemoryStore::new())
        .limit(LimitSpec::new(
            "tokens",
            Quota::per_second(1_000_000).burst(1_000_000),
        ))
        .build()
        .unwrap();
    // Warm up (the key's entry, the runtime's buffers).
    for _ in 0..1_000 {
        drop(limiter.admit("tokens", "k", 1).await.unwrap());
    }
    // The least growth of three rounds: a leak grows every round, while a thread of the
    // test harness allocating meanwhile moves one round at most.
    let mut grown = i64::MAX;
    for _ in 0..3 {
        let before = LIVE_BYTES.load(Ordering::Relaxed) as i64;
        for _ in 0..100_000 {
            let e = limiter.admit("tokens", "k", 1).await.unwrap();
            drop(e);
        }
        grown = grown.min(LIVE_BYTES.load(Ordering::Relaxed) as i64 - before);
    }
    assert!(
        grown < 4_096,
        "{grown} bytes more after 100,000 dropped estimates"
    );
}

/// The handler streams three chunks and reports its usage in a trailer.
async fn streamed(headers: HeaderMap) -> Response<Body> {
    let used = headers
        .get("x-test-usage")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("0")
        .to_owned();
    let mut trailers = HeaderMap::new();
    trailers.insert("x-usage-tokens", HeaderValue::from_str(&used).unwrap());
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
        Ok(Frame::data(Bytes::from("a"))),
        Ok(Frame::data(Bytes::from("b"))),
        Ok(Frame::data(Bytes::from("c"))),
        Ok(Frame::trailers(trailers)),
    ];
    Response::new(Body::new(StreamBody::new(futures_util::stream::iter(
        frames,
    ))))
}

/// The handler answers with its usage in the response's extensions.
async fn reported() -> Response<Body> {
    let mut res = Response::new(Body::from("done"));
    res.extensions_mut().insert(ActualCost(2));
    res
}

fn app(limit: Limit, clock: FakeClock) -> (Router, Limiter) {
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(clock))
        .limit(limit)
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let router = Router::new()
        .route("/stream", get(streamed))
        .route("/reported", get(reported))
        .layer(layer);
    (router, limiter)
}

fn request(path: &str, estimate: u32, usage: Option<u32>) -> Request<Body> {
    let mut req = Request::get(path)
        .header("x-api-key", "alice")
        .header("x-max-tokens", estimate.to_string());
    if let Some(u) = usage {
        req = req.header("x-test-usage", u.to_string());
    }
    with_peer(req.body(Body::empty()).unwrap(), "10.0.0.1")
}

async fn remaining(limiter: &Limiter) -> u64 {
    limiter
        .peek("tokens", "alice")
        .await
        .unwrap()
        .remaining()
        .unwrap()
}

#[tokio::test]
async fn a_streamed_body_settles_at_its_end_from_its_trailer_and_a_dropped_one_keeps_its_estimate()
{
    let _one = lock();
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let limit = Limit::new("tokens", Quota::per_hour(100).burst(100))
        .key(Header::new("x-api-key"))
        .cost(Cost::header("x-max-tokens").default(1))
        .settle(Settle::trailer("x-usage-tokens"))
        .max_debt(30);
    let (router, limiter) = app(limit, clock);

    // Used 4 of an estimate of 20: until the body ends, the estimate is held.
    let res = send(&router, request("/stream", 20, Some(4))).await;
    assert!(res.status().is_success());
    assert_eq!(
        remaining(&limiter).await,
        80,
        "the estimate, while it streams"
    );
    let body = res.into_body().collect().await.unwrap();
    assert_eq!(body.trailers().unwrap()["x-usage-tokens"], "4");
    assert_eq!(remaining(&limiter).await, 96, "settled at 4");

    // Dropped before its end: the estimate stands, once.
    let res = send(&router, request("/stream", 10, Some(1))).await;
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "a");
    drop(body);
    assert_eq!(remaining(&limiter).await, 86);

    // Used far more than estimated: 96 - 1 (taken) ... into debt of at most 30.
    let res = send(&router, request("/stream", 1, Some(500))).await;
    res.into_body().collect().await.unwrap();
    let look = limiter.peek("tokens", "alice").await.unwrap();
    assert_eq!(look.remaining(), Some(0));
    // 30 tokens owed, then one more: 31 × 36 s.
    assert_eq!(
        look.outcome().unwrap().next_after(),
        Some(Duration::from_secs(31 * 36))
    );
    let res = send(&router, request("/stream", 1, Some(1))).await;
    assert_eq!(res.status(), http::StatusCode::TOO_MANY_REQUESTS);

    // No trailer (invalid value): the estimate stands.
    let clock2 = FakeClock::at(Duration::from_secs(1_000));
    let limit = Limit::new("tokens", Quota::per_hour(100).burst(100))
        .key(Header::new("x-api-key"))
        .cost(Cost::header("x-max-tokens").default(1))
        .settle(Settle::extension());
    let (router, limiter) = app(limit, clock2);
    let res = send(&router, request("/reported", 9, None)).await;
    res.into_body().collect().await.unwrap();
    assert_eq!(remaining(&limiter).await, 98, "the handler's ActualCost(2)");
    let res = send(&router, request("/stream", 5, None)).await; // no ActualCost: estimate
    res.into_body().collect().await.unwrap();
    assert_eq!(remaining(&limiter).await, 93);
}

#[tokio::test]
async fn memory_is_flat_after_100_000_dropped_bodies() {
    let _one = lock();
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let limit = Limit::new("tokens", Quota::per_second(1_000_000).burst(1_000_000))
        .key(Header::new("x-api-key"))
        .cost(Cost::header("x-max-tokens").default(1))
        .settle(Settle::trailer("x-usage-tokens"));
    let (router, limiter) = app(limit, clock);
    let drop_one = || async {
        let res = send(&router, request("/stream", 1, Some(1))).await;
        drop(res);
    };
    for _ in 0..1_000 {
        drop_one().await;
    }
    // The least growth of three rounds (see above).
    let mut grown = i64::MAX;
    for _ in 0..3 {
        let before = LIVE_BYTES.load(Ordering::Relaxed) as i64;
        for _ in 0..100_000 {
            drop_one().await;
        }
        grown = grown.min(LIVE_BYTES.load(Ordering::Relaxed) as i64 - before);
    }
    assert!(
        grown < 16_384,
        "{grown} bytes more after 100,000 dropped bodies"
    );
    // Each dropped body left its estimate: 301,000 tokens.
    assert_eq!(remaining(&limiter).await, 1_000_000 - 301_000);
}

/// Through the `Limiter` handle on a real Redis, with the caller's fake clock: the same
/// buckets as the memory store step by step, and settles sent with concurrent checks
/// (batched in one `gcra.lua` call) counted exactly.
/// Issue 45: `max_debt` defaulted to the burst, so an estimate of 1 that used 1,100 tokens
/// of a 100-token bucket was charged 200 and the other 900 forgiven. Without `max_debt`
/// the whole usage is charged: the bucket owes 1,000 tokens (10 s at 100/s) and refuses
/// the key until they are paid, and 10 ms more for the next token. `limiter`'s limit
/// `tokens` is `100/s; burst=100` without `max_debt`, on `clock`.
async fn the_whole_usage_is_charged(limiter: &Limiter, clock: &FakeClock) {
    let call = limiter.admit("tokens", "k", 1).await.unwrap();
    assert!(call.is_allowed());
    let after = call.settle(1_100).await.unwrap().expect("settled");
    assert_eq!(after.remaining(), Some(0));
    let look = limiter.peek("tokens", "k").await.unwrap();
    let o = look.outcome().unwrap();
    assert_eq!(
        o.reset_after(),
        Duration::from_secs(11),
        "1,100 tokens of 10 ms"
    );
    assert_eq!(o.next_after(), Some(Duration::from_millis(10_010)));
    clock.advance(Duration::from_millis(10_009));
    assert!(!limiter.check("tokens", "k", 1).await.unwrap().allowed());
    clock.advance(Duration::from_millis(1));
    assert!(limiter.check("tokens", "k", 1).await.unwrap().allowed());
}

fn uncapped() -> LimitSpec {
    LimitSpec::new("tokens", Quota::per_second(100).burst(100))
}

#[tokio::test]
async fn an_estimate_of_1_that_used_1100_tokens_is_charged_in_full_by_default() {
    let _one = lock();
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let memory = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .limit(uncapped())
        .build()
        .unwrap();
    the_whole_usage_is_charged(&memory, &clock).await;
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use support::redis::RedisServer;
    use tollgate::store::RedisStore;

    async fn redis_limiter(server: &RedisServer, clock: FakeClock, spec: LimitSpec) -> Limiter {
        let store = RedisStore::new(server.client().get_connection_manager().await.unwrap())
            .timeout(Duration::from_secs(2))
            .deny_cache(false)
            .caller_time(clock);
        Limiter::builder(store).limit(spec).build().unwrap()
    }

    fn epoch_clock() -> FakeClock {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        FakeClock::at(Duration::from_secs(now.as_secs()))
    }

    /// Issue 45 on Redis: `gcra.lua` takes the whole usage without `max_debt`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_charges_an_1100_token_usage_on_an_estimate_of_1_in_full_by_default() {
        let _one = lock();
        let server = RedisServer::start();
        let clock = epoch_clock();
        let redis = redis_limiter(&server, clock.clone(), uncapped()).await;
        the_whole_usage_is_charged(&redis, &clock).await;
    }

    /// Without a debt cap, the largest usage at the slowest refill overflows nothing:
    /// `u32::MAX` tokens of one hour each. Memory saturates its TAT (`u64::MAX` ns);
    /// `gcra.lua` keeps it at 2^53 − 1 µs, an integer both sides read (a settled TAT past
    /// it would be a float Redis writes in exponent form).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_uncapped_debt_overflows_nothing() {
        let _one = lock();
        let server = RedisServer::start();
        let clock = epoch_clock();
        let spec = || LimitSpec::new("huge", Quota::per_hour(1));
        let redis = redis_limiter(&server, clock.clone(), spec()).await;
        let memory = Limiter::builder(MemoryStore::with_clock(clock.clone()))
            .limit(spec())
            .build()
            .unwrap();
        let century = Duration::from_secs(100 * 365 * 86_400);
        for limiter in [&redis, &memory] {
            let call = limiter.admit("huge", "k", 1).await.unwrap();
            call.settle(u32::MAX).await.unwrap().expect("settled");
            let look = limiter.peek("huge", "k").await.unwrap();
            assert!(look.outcome().unwrap().reset_after() > 2 * century);
            assert!(!limiter.check("huge", "k", 1).await.unwrap().allowed());
        }
        let mut conn = server.connection().await;
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg("*huge*")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        let tat: String = ::redis::cmd("GET")
            .arg(&keys[0])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(tat.parse::<u64>(), Ok((1 << 53) - 1), "{tat}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_settles_as_memory_does() {
        let _one = lock();
        let server = RedisServer::start();
        let clock = epoch_clock();
        let redis = redis_limiter(&server, clock.clone(), tokens()).await;
        let memory = Limiter::builder(MemoryStore::with_clock(clock.clone()))
            .limit(tokens())
            .build()
            .unwrap();
        // (wait ms, estimate, actual, settled?)
        let mut x = 7u64;
        for step in 0..300 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let (wait, estimate, actual, settled) = (
                (x >> 8) % 30,
                1 + (x >> 16) % 30,
                (x >> 24) % 120,
                !(x >> 40).is_multiple_of(4),
            );
            clock.advance(Duration::from_millis(wait));
            let r = redis.admit("tokens", "k", estimate as u32).await.unwrap();
            let m = memory.admit("tokens", "k", estimate as u32).await.unwrap();
            assert_eq!(r.is_allowed(), m.is_allowed(), "step {step}");
            if settled {
                r.settle(actual as u32).await.unwrap();
                m.settle(actual as u32).await.unwrap();
            }
            let look = |l: LimitDecision| l.outcome().unwrap().reset_after();
            let (rl, ml) = (
                redis.peek("tokens", "k").await.unwrap(),
                memory.peek("tokens", "k").await.unwrap(),
            );
            assert_eq!(look(rl), look(ml), "step {step}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_settles_ride_with_the_checks_and_count_exactly() {
        let _one = lock();
        let server = RedisServer::start();
        let clock = epoch_clock();
        let spec = LimitSpec::new("tokens", Quota::per_hour(100_000).burst(100_000));
        let limiter = redis_limiter(&server, clock, spec).await;
        let tasks: Vec<_> = (0..256u32)
            .map(|i| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let e = limiter.admit("tokens", "k", 10).await.unwrap();
                    assert!(e.is_allowed());
                    e.settle(i % 25).await.unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let used: u64 = (0..256u64).map(|i| i % 25).sum();
        let left = limiter.peek("tokens", "k").await.unwrap().remaining();
        assert_eq!(
            left,
            Some(100_000 - used),
            "each estimate counted once, then settled"
        );
    }

    use tollgate::LimitDecision;
}
