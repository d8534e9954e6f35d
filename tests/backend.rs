//! A [`Backend`] written outside the crate — a `HashMap` of TATs doing the arithmetic with
//! the public `tollgate::gcra` functions — made a store by [`Resilient`], which gives it
//! what every remote store gets: a timeout, a breaker, the failure policies with a local
//! fallback, and the deny cache. Everything runs on one fake clock; the only real wait is
//! the timeout of a backend that hangs.

mod support;

use std::collections::HashMap;
use std::future::{self, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::{get as req, header, send};
use tollgate::clock::{Clock, FakeClock};
use tollgate::gcra::{self, Params};
use tollgate::store::{Backend, Item, Op, Resilient, Statuses, StoreError};
use tollgate::{
    FailurePolicy, Limit, LimitDecision, LimitSpec, Limiter, Mode, Outcome, Overall, Quota,
    RateLimitLayer, Status,
};

/// Buckets in a map, keyed by `{limit}:{key}`; a switch makes every call fail, another
/// makes it hang; every call is counted.
#[derive(Clone)]
struct MapBackend {
    inner: Arc<MapState>,
}

struct MapState {
    clock: FakeClock,
    tats: Mutex<HashMap<String, u64>>,
    down: AtomicBool,
    hanging: AtomicBool,
    calls: AtomicUsize,
    /// While set, answers (decided when the call is made) wait for its permits: calls in
    /// flight.
    gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
}

impl MapBackend {
    fn new(clock: FakeClock) -> Self {
        Self {
            inner: Arc::new(MapState {
                clock,
                tats: Mutex::new(HashMap::new()),
                down: AtomicBool::new(false),
                hanging: AtomicBool::new(false),
                calls: AtomicUsize::new(0),
                gate: Mutex::new(None),
            }),
        }
    }

    fn calls(&self) -> usize {
        self.inner.calls.load(Ordering::SeqCst)
    }

    fn set_down(&self, down: bool) {
        self.inner.down.store(down, Ordering::SeqCst);
    }

    fn set_hanging(&self, hanging: bool) {
        self.inner.hanging.store(hanging, Ordering::SeqCst);
    }

    /// Holds every answer until [`open`](Self::open).
    fn hold(&self) {
        *self.inner.gate.lock().unwrap() = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    }

    fn open(&self) {
        if let Some(gate) = self.inner.gate.lock().unwrap().take() {
            gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
        }
    }

    fn holds(&self, bucket: &str) -> bool {
        self.inner.tats.lock().unwrap().contains_key(bucket)
    }

    /// Every `Op` on GCRA buckets, in nanoseconds of the fake clock.
    fn decide(&self, op: Op, items: &[Item<'_, String>]) -> Result<Statuses, StoreError> {
        let now = self.inner.clock.now();
        let mut tats = self.inner.tats.lock().unwrap();
        let bucket = |item: &Item<'_, String>| format!("{}{}", item.table, item.key);
        let params = |item: &Item<'_, String>| {
            let t = u64::try_from(item.quota.emission_interval().as_nanos()).unwrap();
            Params::new(t, item.quota.burst_size())
        };
        let state = |params: Params, tat: u64| {
            let o = gcra::peek(params, tat, now);
            Status::Checked(Outcome::new(o.verdict, o.reset_after, params, 1))
        };
        if op == Op::Check {
            let decided: Vec<gcra::Decided> = items
                .iter()
                .map(|i| {
                    let tat = tats.get(&bucket(i)).copied().unwrap_or(0);
                    gcra::decide(params(i), tat, now, u64::from(i.cost))
                })
                .collect();
            // All or nothing: an enforcing refusal writes nothing anywhere.
            let refused = items
                .iter()
                .zip(&decided)
                .any(|(i, d)| i.mode == Mode::Enforce && !d.verdict.is_allowed());
            return Ok(items
                .iter()
                .zip(decided)
                .map(|(i, d)| match d.new_tat {
                    Some(tat) if !refused => {
                        tats.insert(bucket(i), tat);
                        Status::Checked(Outcome::new(d.verdict, d.reset_after(now), params(i), 1))
                    }
                    Some(_) => state(params(i), tats.get(&bucket(i)).copied().unwrap_or(0)),
                    None => {
                        Status::Checked(Outcome::new(d.verdict, d.reset_after(now), params(i), 1))
                    }
                })
                .collect());
        }
        let mut statuses = Statuses::new();
        for i in items {
            let p = params(i);
            let cost = u64::from(i.cost) * p.t();
            let key = bucket(i);
            let tat = match op {
                Op::Refund => tats.get_mut(&key).map_or(0, |tat| {
                    *tat = tat.saturating_sub(cost).max(now);
                    *tat
                }),
                Op::Penalize => {
                    let tat = tats.entry(key).or_insert(0);
                    *tat = (*tat).max(now) + cost;
                    *tat
                }
                Op::Block(d) => {
                    let d = u64::try_from(d.as_nanos()).unwrap();
                    let tat = tats.entry(key).or_insert(0);
                    *tat = (*tat).max(now + d + p.tau() - p.t());
                    *tat
                }
                Op::Reset => {
                    tats.remove(&key);
                    0
                }
                other => return Err(StoreError::new(format!("unsupported: {other:?}"))),
            };
            statuses.push(state(p, tat));
        }
        Ok(statuses)
    }
}

impl Backend for MapBackend {
    type Table = String;
    type Future = Pin<Box<dyn Future<Output = Result<Statuses, StoreError>> + Send>>;

    fn table(&self, name: &str) -> String {
        format!("{name}:")
    }

    fn apply(&self, op: Op, items: &[Item<'_, String>]) -> Self::Future {
        self.inner.calls.fetch_add(1, Ordering::SeqCst);
        if self.inner.hanging.load(Ordering::SeqCst) {
            return Box::pin(future::pending());
        }
        if self.inner.down.load(Ordering::SeqCst) {
            return Box::pin(future::ready(Err(StoreError::new("down"))));
        }
        let answer = self.decide(op, items);
        match self.inner.gate.lock().unwrap().clone() {
            Some(gate) => Box::pin(async move {
                let _permit = gate.acquire().await;
                answer
            }),
            None => Box::pin(future::ready(answer)),
        }
    }

    fn name(&self) -> &'static str {
        "the map backend"
    }
}

/// 10 per second, burst 5: T = 100 ms.
const Q: Quota = Quota::per_second(10).burst(5);
const T: Duration = Duration::from_millis(100);
const BURST: u64 = 5;
const NS: Duration = Duration::from_nanos(1);
const COOL_DOWN: Duration = Duration::from_secs(1);

struct Setup {
    clock: FakeClock,
    backend: MapBackend,
    store: Resilient<MapBackend>,
}

fn setup() -> Setup {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let backend = MapBackend::new(clock.clone());
    let store = Resilient::new(backend.clone())
        .clock(clock.clone())
        .breaker(2, COOL_DOWN);
    Setup {
        clock,
        backend,
        store,
    }
}

impl Setup {
    /// A limiter with one limit, `api`, under `policy`.
    fn limiter(&self, policy: FailurePolicy) -> Limiter {
        Limiter::builder(self.store.clone())
            .limit(LimitSpec::new("api", Q).on_store_failure(policy))
            .build()
            .unwrap()
    }
}

async fn check(limiter: &Limiter, key: &str) -> LimitDecision {
    limiter.check("api", key, 1).await.unwrap()
}

/// (status kind, allowed, tokens left, retry after).
fn state(d: &LimitDecision) -> (&'static str, bool, Option<u64>, Option<Duration>) {
    let kind = match d.status() {
        Status::Checked(_) => "checked",
        Status::Fallback(_) => "fallback",
        Status::FailedOpen => "failed-open",
        Status::FailedClosed => "failed-closed",
        Status::Unchecked => "unchecked",
        _ => "other",
    };
    (kind, d.allowed(), d.remaining(), d.retry_after())
}

#[tokio::test]
async fn an_answering_backend_decides_every_operation() {
    let s = setup();
    let limiter = Limiter::builder(s.store.clone())
        .limit(LimitSpec::new("api", Q))
        .limit(LimitSpec::new("tenant", Quota::per_second(10).burst(2)))
        .build()
        .unwrap();
    for left in (0..BURST).rev() {
        assert_eq!(
            state(&check(&limiter, "alice").await),
            ("checked", true, Some(left), None)
        );
    }
    assert_eq!(
        state(&check(&limiter, "alice").await),
        ("checked", false, Some(0), Some(T))
    );
    assert_eq!(s.backend.calls(), 6);

    // All or nothing over two limits.
    let calls = [("api", "bob", 1), ("tenant", "acme", 1)];
    assert!(limiter.check_all(calls).await.unwrap().allowed());
    assert!(limiter.check_all(calls).await.unwrap().allowed());
    let d = limiter.check_all(calls).await.unwrap();
    assert_eq!(d.overall(), Overall::Limited);
    assert_eq!(
        state(d.limit("api").unwrap()),
        ("checked", true, Some(3), None)
    );
    assert_eq!(
        limiter.peek("api", "bob").await.unwrap().remaining(),
        Some(3)
    );

    // Refund: never beyond a full bucket; an absent key stays absent.
    let d = limiter.refund("api", "alice", 100).await.unwrap();
    assert_eq!(state(&d), ("checked", true, Some(BURST), None));
    let d = limiter.refund("api", "nobody", 1).await.unwrap();
    assert_eq!(state(&d), ("checked", true, Some(BURST), None));
    assert!(!s.backend.holds("api:nobody"));
    // Penalize: debt of 10 tokens beyond an empty bucket.
    let d = limiter.penalize("api", "carol", 15).await.unwrap();
    assert_eq!(d.outcome().unwrap().next_after(), Some(11 * T));
    assert_eq!(
        state(&check(&limiter, "carol").await),
        ("checked", false, Some(0), Some(11 * T))
    );
    // Block, then reset.
    let d = limiter.block("api", "dave", 3 * T).await.unwrap();
    assert_eq!(d.outcome().unwrap().next_after(), Some(3 * T));
    assert_eq!(
        state(&check(&limiter, "dave").await),
        ("checked", false, Some(0), Some(3 * T))
    );
    let d = limiter.reset("api", "dave").await.unwrap();
    assert_eq!(state(&d), ("checked", true, Some(BURST), None));
    assert!(!s.backend.holds("api:dave"));
    assert_eq!(
        state(&check(&limiter, "dave").await),
        ("checked", true, Some(4), None)
    );
}

#[tokio::test]
async fn fallback_decides_locally_with_the_same_quota_when_the_backend_fails() {
    let s = setup();
    let limiter = s.limiter(FailurePolicy::Fallback);
    s.backend.set_down(true);
    for left in (0..BURST).rev() {
        assert_eq!(
            state(&check(&limiter, "alice").await),
            ("fallback", true, Some(left), None)
        );
    }
    assert_eq!(
        state(&check(&limiter, "alice").await),
        ("fallback", false, Some(0), Some(T))
    );
    // The breaker opened after two failures: the other calls never reached the backend.
    assert_eq!(s.backend.calls(), 2);
    s.clock.advance(T);
    assert_eq!(
        state(&check(&limiter, "alice").await),
        ("fallback", true, Some(0), None)
    );
    // Other operations fall back too.
    let d = limiter.reset("api", "alice").await.unwrap();
    assert_eq!(state(&d), ("fallback", true, Some(BURST), None));
    assert_eq!(s.backend.calls(), 2);
}

#[tokio::test]
async fn allow_fails_open_when_the_backend_fails() {
    let s = setup();
    let limiter = s.limiter(FailurePolicy::Allow);
    s.backend.set_down(true);
    for _ in 0..2 * BURST {
        assert_eq!(
            state(&check(&limiter, "alice").await),
            ("failed-open", true, None, None)
        );
    }
    let d = limiter.check_all([("api", "alice", 1)]).await.unwrap();
    assert_eq!(d.overall(), Overall::Allowed);
}

#[tokio::test]
async fn deny_fails_closed_and_the_layer_answers_503() {
    let s = setup();
    let limiter = s.limiter(FailurePolicy::Deny);
    s.backend.set_down(true);
    assert_eq!(
        state(&check(&limiter, "alice").await),
        ("failed-closed", false, None, None)
    );
    let d = limiter.check_all([("api", "alice", 1)]).await.unwrap();
    assert_eq!(d.overall(), Overall::Unavailable);

    let layer = RateLimitLayer::builder(s.store.clone())
        .limit(Limit::new("api", Q).on_store_failure(FailurePolicy::Deny))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer);
    let response = send(&app, req("/", "192.0.2.1")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        header(response.headers(), "retry-after").as_deref(),
        Some("1")
    );
    // Back up: the breaker is open until the cool-down has passed, then the layer passes.
    s.backend.set_down(false);
    s.clock.advance(COOL_DOWN);
    assert_eq!(
        send(&app, req("/", "192.0.2.1")).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_breaker_opens_after_two_failures_and_a_successful_probe_closes_it() {
    let s = setup();
    let limiter = s.limiter(FailurePolicy::Fallback);
    s.backend.set_down(true);
    check(&limiter, "alice").await;
    assert_eq!((s.backend.calls(), s.store.is_unavailable()), (1, false));
    check(&limiter, "alice").await;
    assert_eq!((s.backend.calls(), s.store.is_unavailable()), (2, true));
    for _ in 0..5 {
        assert_eq!(state(&check(&limiter, "bob").await).0, "fallback");
    }
    assert_eq!(s.backend.calls(), 2, "an open breaker called the backend");
    // Not a nanosecond before the cool-down.
    s.clock.advance(COOL_DOWN - NS);
    check(&limiter, "bob").await;
    assert_eq!(s.backend.calls(), 2);
    // Then one probe; it fails: still open, the next probe a cool-down later.
    s.clock.advance(NS);
    assert_eq!(state(&check(&limiter, "bob").await).0, "fallback");
    check(&limiter, "bob").await;
    assert_eq!((s.backend.calls(), s.store.is_unavailable()), (3, true));
    // Back up: the next probe succeeds and closes the breaker.
    s.backend.set_down(false);
    s.clock.advance(COOL_DOWN);
    assert_eq!(state(&check(&limiter, "carol").await).0, "checked");
    assert_eq!((s.backend.calls(), s.store.is_unavailable()), (4, false));
    assert_eq!(
        state(&check(&limiter, "carol").await),
        ("checked", true, Some(3), None)
    );
    assert_eq!(s.backend.calls(), 5);
}

/// A store whose breaker opens after two failures, with a 20 ms timeout, and a limiter on
/// it.
fn breaking_after_two_timeouts() -> (FakeClock, MapBackend, Resilient<MapBackend>, Limiter) {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let backend = MapBackend::new(clock.clone());
    let store = Resilient::new(backend.clone())
        .clock(clock.clone())
        .breaker(2, COOL_DOWN)
        .timeout(Duration::from_millis(20));
    let limiter = Limiter::builder(store.clone())
        .limit(LimitSpec::new("api", Q))
        .build()
        .unwrap();
    (clock, backend, store, limiter)
}

/// A call that times out answers from the failure policy; the timeouts count against the
/// breaker once the backend has been silent for a second since it was first called (a busy
/// instance whose calls are answered late is not a failing backend, nor is one that is
/// still answering the first calls of a store made long before them:
/// `tests/lease_world.rs`).
#[tokio::test]
async fn a_hanging_backend_times_out_and_opens_the_breaker() {
    let (clock, backend, store, limiter) = breaking_after_two_timeouts();
    backend.set_hanging(true);
    // The store was made long before its first call: that call's timeout does not count.
    clock.advance(Duration::from_secs(5));
    let d = check(&limiter, "alice").await;
    assert_eq!(state(&d), ("fallback", true, Some(BURST - 1), None));
    assert!(!store.is_unavailable());
    // Not heard from for a second since (the local bucket is full again).
    clock.advance(Duration::from_secs(1));
    for calls in 2..=3 {
        let started = Instant::now();
        let d = check(&limiter, "alice").await;
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert_eq!(
            state(&d),
            ("fallback", true, Some(BURST + 1 - calls as u64), None)
        );
        assert_eq!(backend.calls(), calls);
    }
    assert!(store.is_unavailable());
    // Open: decided at once, without a call.
    let d = check(&limiter, "alice").await;
    assert_eq!(state(&d), ("fallback", true, Some(BURST - 3), None));
    assert_eq!(backend.calls(), 3);
}

/// Timeouts within a second of the backend's last answer are a slow side, not a failing
/// backend: the requests follow the policy, the breaker stays closed (issue: shared
/// limits under stress, item 1).
#[tokio::test]
async fn timeouts_while_the_backend_answered_lately_never_open_the_breaker() {
    let (clock, backend, store, limiter) = breaking_after_two_timeouts();
    assert_eq!(state(&check(&limiter, "alice").await).0, "checked");
    backend.set_hanging(true);
    for _ in 0..5 {
        clock.advance(Duration::from_millis(100));
        assert_eq!(state(&check(&limiter, "alice").await).0, "fallback");
    }
    assert!(!store.is_unavailable(), "heard from 500 ms ago");
    clock.advance(Duration::from_millis(500));
    assert_eq!(state(&check(&limiter, "alice").await).0, "fallback");
    assert_eq!(state(&check(&limiter, "alice").await).0, "fallback");
    assert!(store.is_unavailable(), "silent for a second");
}

#[tokio::test]
async fn the_deny_cache_keeps_a_refused_key_from_the_backend_until_its_wait() {
    let s = setup();
    let limiter = s.limiter(FailurePolicy::Fallback);
    for _ in 0..BURST {
        assert!(check(&limiter, "alice").await.allowed());
    }
    assert_eq!(
        state(&check(&limiter, "alice").await),
        ("checked", false, Some(0), Some(T))
    );
    assert_eq!(s.backend.calls(), 6);
    for _ in 0..3 {
        assert_eq!(
            state(&check(&limiter, "alice").await),
            ("checked", false, Some(0), Some(T))
        );
    }
    s.clock.advance(T - NS);
    assert_eq!(
        state(&check(&limiter, "alice").await),
        ("checked", false, Some(0), Some(NS))
    );
    assert_eq!(
        s.backend.calls(),
        6,
        "a remembered denial went to the backend"
    );
    // Another key is not affected.
    assert!(check(&limiter, "bob").await.allowed());
    assert_eq!(s.backend.calls(), 7);
    // The wait is over: the backend decides again.
    s.clock.advance(NS);
    assert_eq!(
        state(&check(&limiter, "alice").await),
        ("checked", true, Some(0), None)
    );
    // It took the one token there was: the next requests are refused here, for a T.
    assert_eq!(
        state(&check(&limiter, "alice").await),
        ("checked", false, Some(0), Some(T))
    );
    assert!(!check(&limiter, "alice").await.allowed());
    assert_eq!(s.backend.calls(), 8);
    // A reset through the same store forgets the denial at once.
    let d = limiter.reset("api", "alice").await.unwrap();
    assert_eq!(state(&d), ("checked", true, Some(BURST), None));
    assert_eq!(s.backend.calls(), 9);
    assert_eq!(
        state(&check(&limiter, "alice").await),
        ("checked", true, Some(4), None)
    );
    assert_eq!(s.backend.calls(), 10);
}

/// Pins a bug: once a remembered denial's wait was over, every request for the key went to
/// the backend until its next answer came back, so a key refused far over its limit cost
/// a call for each request of each round trip (291–391 calls per 1,000 decisions in the
/// lease benchmark, where a round trip is longer than T). Now each request claims its
/// token from the remembered instant, and only requests that find one are sent.
#[tokio::test]
async fn once_a_remembered_denial_is_over_only_requests_that_can_pass_are_sent() {
    let s = setup();
    let limiter = s.limiter(FailurePolicy::Fallback);
    for _ in 0..=BURST {
        check(&limiter, "alice").await;
    }
    assert_eq!(s.backend.calls(), 6, "the burst, and one refusal");
    // One token can exist: one call, while twenty requests arrive during it.
    s.clock.advance(T);
    s.backend.hold();
    assert_eq!(round(&limiter, &s.backend, 20).await, 1);
    assert_eq!(s.backend.calls(), 7);
    // Three tokens: three calls, and the backend grants all three (nothing it would
    // allow is refused here).
    s.clock.advance(3 * T);
    s.backend.hold();
    assert_eq!(round(&limiter, &s.backend, 20).await, 3);
    assert_eq!(s.backend.calls(), 10);
    // Long idle: the bucket is full again, and a whole burst passes.
    s.clock.advance(60 * T);
    s.backend.hold();
    assert_eq!(round(&limiter, &s.backend, 20).await, BURST as usize);
}

/// `n` concurrent checks of `alice` while the backend holds its answers, then the answers:
/// how many were allowed.
async fn round(limiter: &Limiter, backend: &MapBackend, n: usize) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { check(&limiter, "alice").await.allowed() })
        })
        .collect();
    // Every task makes its call (or is answered) before the answers come.
    for _ in 0..n {
        tokio::task::yield_now().await;
    }
    backend.open();
    let mut allowed = 0;
    for t in tasks {
        allowed += usize::from(t.await.unwrap());
    }
    allowed
}

#[tokio::test]
async fn the_deny_cache_remembers_a_block_made_through_the_store() {
    let s = setup();
    let limiter = s.limiter(FailurePolicy::Fallback);
    limiter.block("api", "mallory", 3 * T).await.unwrap();
    assert_eq!(s.backend.calls(), 1);
    for _ in 0..3 {
        assert_eq!(
            state(&check(&limiter, "mallory").await),
            ("checked", false, Some(0), Some(3 * T))
        );
    }
    assert_eq!(s.backend.calls(), 1);
    s.clock.advance(3 * T);
    assert_eq!(
        state(&check(&limiter, "mallory").await),
        ("checked", true, Some(0), None)
    );
    assert_eq!(s.backend.calls(), 2);
}

#[tokio::test]
async fn a_block_the_backend_did_not_apply_is_not_remembered_by_the_deny_cache() {
    let s = setup();
    let limiter = s.limiter(FailurePolicy::Allow);
    s.backend.set_down(true);
    let d = limiter
        .block("api", "mallory", Duration::from_secs(3_600))
        .await
        .unwrap();
    assert_eq!(state(&d), ("failed-open", true, None, None));
    assert!(!s.backend.holds("api:mallory"));
    // The backend is back and holds no block: it decides, and lets the key pass.
    s.backend.set_down(false);
    let calls = s.backend.calls();
    assert_eq!(
        state(&check(&limiter, "mallory").await),
        ("checked", true, Some(BURST - 1), None)
    );
    assert_eq!(s.backend.calls(), calls + 1);
}
