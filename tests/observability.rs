//! Observability: the metrics schema (feature `metrics`), label cardinality, refusal
//! events under a flood, and the top refused keys.

mod support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::{Lines, get as req, send};
use tollgate::clock::FakeClock;
use tollgate::key::PeerIp;
use tollgate::store::MemoryStore;
use tollgate::{Limit, OffenderTracking, Quota, RateLimitLayer, RefusalLog};

fn store() -> MemoryStore<FakeClock> {
    MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)))
}

fn app<St: tollgate::store::Store>(layer: RateLimitLayer<St>) -> Router {
    Router::new()
        .route("/items/{id}", get(|| async { "ok" }))
        .route_layer(layer)
}

#[tokio::test]
async fn a_flood_of_100k_refusals_writes_a_few_lines_with_the_fields() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let layer = RateLimitLayer::builder(store())
        .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
        .build()
        .unwrap();
    let app = app(layer);
    assert_eq!(
        send(&app, req("/items/1", "192.0.2.1")).await.status(),
        StatusCode::OK
    );
    let started = Instant::now();
    for _ in 0..100_000 {
        let r = send(&app, req("/items/1", "192.0.2.1")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let elapsed = started.elapsed();
    let logged = lines.matching("request refused");
    // At most one line per 100 ms (plus the first): a count, not 100k lines.
    let bound = 2 + elapsed.as_millis() as usize / 100;
    assert!(
        !logged.is_empty() && logged.len() <= bound,
        "{} lines in {elapsed:?}",
        logged.len()
    );
    let first = &logged[0];
    assert!(first.contains("tollgate::refused"), "{first}");
    assert!(first.contains("limit=\"per-ip\""), "{first}");
    assert!(first.contains("key=\"@192.0.2.1\""), "{first}");
    assert!(first.contains("retry_after_ms=60000"), "{first}");
    assert!(first.contains("route=\"/items/{id}\""), "{first}");
    assert!(first.contains("suppressed=0"), "{first}");
    // Every refusal is accounted for: printed, or counted in a later line.
    let suppressed: u64 = logged
        .iter()
        .map(|l| {
            let at = l.find("suppressed=").unwrap() + "suppressed=".len();
            l[at..].split(' ').next().unwrap().parse::<u64>().unwrap()
        })
        .sum();
    assert!(suppressed + logged.len() as u64 <= 100_000);
}

#[tokio::test]
async fn refusal_events_can_be_redacted_silenced_or_leveled() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let redacted = RateLimitLayer::builder(store())
        .limit(Limit::new("a", Quota::per_minute(1)).key(PeerIp::new()))
        .redact_keys(true)
        .build()
        .unwrap();
    let app1 = app(redacted);
    for _ in 0..2 {
        send(&app1, req("/items/1", "192.0.2.9")).await;
    }
    let logged = lines.matching("limit=\"a\"");
    assert_eq!(logged.len(), 1);
    assert!(!logged[0].contains("192.0.2.9"), "{}", logged[0]);
    assert!(logged[0].contains("key=\"#"), "{}", logged[0]);

    let quiet = RateLimitLayer::builder(store())
        .limit(Limit::new("b", Quota::per_minute(1)).key(PeerIp::new()))
        .refusal_log(RefusalLog::off())
        .build()
        .unwrap();
    let debug = RateLimitLayer::builder(store())
        .limit(Limit::new("c", Quota::per_minute(1)).key(PeerIp::new()))
        .refusal_log(RefusalLog::new().level(tracing::Level::DEBUG))
        .build()
        .unwrap();
    for layer in [quiet, debug] {
        let app = app(layer);
        for _ in 0..3 {
            send(&app, req("/items/1", "192.0.2.9")).await;
        }
    }
    assert!(lines.matching("limit=\"b\"").is_empty());
    assert!(
        lines.matching("limit=\"c\"").is_empty(),
        "DEBUG is below INFO"
    );
}

#[tokio::test]
async fn the_limiter_reads_the_top_refused_keys() {
    let layer = RateLimitLayer::builder(store())
        .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
        .track_offenders(OffenderTracking::new().capacity(1_000))
        .refusal_log(RefusalLog::off())
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let app = app(layer);
    for (ip, n) in [("192.0.2.1", 51), ("192.0.2.2", 21), ("2001:db8::7", 6)] {
        for _ in 0..n {
            send(&app, req("/items/1", ip)).await;
        }
    }
    let top = limiter.top_refused("per-ip", 10).unwrap();
    let top: Vec<(String, u64, u64)> = top.into_iter().map(|e| (e.key, e.count, e.error)).collect();
    assert_eq!(
        top,
        vec![
            ("@192.0.2.1".to_owned(), 50, 0),
            ("@192.0.2.2".to_owned(), 20, 0),
            ("@[2001:db8::]/56".to_owned(), 5, 0),
        ]
    );
    assert_eq!(limiter.top_refused("per-ip", 1).unwrap().len(), 1);
    assert!(limiter.top_refused("nope", 1).is_err());
}

#[cfg(feature = "metrics")]
mod schema {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use std::collections::{BTreeMap, BTreeSet};
    use std::future::Ready;
    use tollgate::store::{Backend, Item, Op, Resilient, Statuses, StoreError};
    use tollgate::{FailurePolicy, Mode};

    type Series = BTreeMap<String, f64>;

    /// Every series as `name{label=value,...}` → value (histograms: their sample count).
    fn series(snapshotter: &metrics_util::debugging::Snapshotter) -> Series {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let mut labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                let name = format!("{}{{{}}}", key.name(), labels.join(","));
                let value = match value {
                    DebugValue::Counter(c) => c as f64,
                    DebugValue::Gauge(g) => g.into_inner(),
                    DebugValue::Histogram(h) => h.len() as f64,
                };
                (name, value)
            })
            .collect()
    }

    /// A backend that always fails.
    #[derive(Clone)]
    struct Down;

    impl Backend for Down {
        type Table = ();
        type Future = Ready<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::ready(Err(StoreError::new("down")))
        }
        fn name(&self) -> &'static str {
            "Test Store"
        }
    }

    /// A backend that refuses everything: one token every minute, none left.
    #[derive(Clone)]
    struct Refusing;

    impl Backend for Refusing {
        type Table = ();
        type Future = Ready<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, items: &[Item<'_, ()>]) -> Self::Future {
            let statuses = items
                .iter()
                .map(|i| {
                    // Every limit here is `Quota::per_minute(1)`: T = 60 s, burst 1.
                    let _ = i;
                    let params = tollgate::gcra::Params::new(60_000_000_000, 1);
                    tollgate::Status::Checked(tollgate::Outcome::new(
                        tollgate::gcra::Admission::Denied {
                            retry_after: 60_000_000_000,
                        },
                        60_000_000_000,
                        params,
                        1,
                    ))
                })
                .collect();
            std::future::ready(Ok(statuses))
        }
        fn name(&self) -> &'static str {
            "Refusing"
        }
    }

    /// A limit across regions: each region's mover reports the tokens moved out, held and
    /// spent, and the other regions out of reach while the link is cut.
    #[cfg(feature = "testing")]
    #[test]
    fn a_regions_mover_reports_its_quota_and_partitions() {
        use tollgate::testing::SimRegions;
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let quota = Quota::per_second(100);
        let (busy, during, after) = ::metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                let regions = SimRegions::builder()
                    .region("eu")
                    .region("us")
                    .link_delay(Duration::from_millis(20))
                    .limit("api", quota)
                    .build();
                let eu = tollgate::Limiter::builder(regions.store("eu"))
                    .limit(tollgate::LimitSpec::new("api", quota))
                    .build()
                    .unwrap();
                for _ in 0..400 {
                    eu.check("api", "k", 1).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let busy = series(&snapshotter);
                regions.partition(true);
                tokio::time::sleep(Duration::from_secs(1)).await;
                let during = series(&snapshotter);
                regions.partition(false);
                tokio::time::sleep(Duration::from_secs(1)).await;
                (busy, during, series(&snapshotter))
            })
        });
        let moved = during["tollgate_region_tokens_moved_total{region=us}"];
        assert!(moved > 0.0, "{during:?}");
        assert_eq!(during["tollgate_region_tokens_moved_total{region=eu}"], 0.0);
        assert_eq!(during["tollgate_region_unreachable{region=us}"], 1.0);
        assert_eq!(after["tollgate_region_unreachable{region=us}"], 0.0);
        assert!(
            busy["tollgate_region_tokens_spent{region=eu}"] > 0.0,
            "{busy:?}"
        );
        assert!(busy.contains_key("tollgate_region_tokens_held{region=eu}"));
        assert!(
            !busy.keys().any(|k| k.contains("region=0")),
            "named regions only"
        );
        assert!(during.contains_key("tollgate_region_mover_lag_seconds{region=us}"));
    }

    /// What happens to the charge-back sent when Redis answers after an outage.
    #[cfg(feature = "testing")]
    #[derive(Clone, Copy, PartialEq)]
    enum Charge {
        /// It is answered.
        Answered,
        /// It meets Redis failing again (for 2 s), then is answered at the next answer.
        Fails,
        /// It vanishes: a black hole from the moment Redis answered, for 90 s.
        Vanishes,
    }

    /// The simulated backend under another name, that cannot apply a charge once per id.
    #[cfg(feature = "testing")]
    #[derive(Clone)]
    struct NoIds(tollgate::testing::SimBackend);

    #[cfg(feature = "testing")]
    impl Backend for NoIds {
        type Table = String;
        type Future = <tollgate::testing::SimBackend as Backend>::Future;
        fn table(&self, name: &str) -> String {
            self.0.table(name)
        }
        fn apply(&self, op: Op, items: &[Item<'_, String>]) -> Self::Future {
            self.0.apply(op, items)
        }
        fn name(&self) -> &'static str {
            "no-ids"
        }
    }

    /// `tollgate_writeback_dropped_total` of `store` (over `backend`) after each of
    /// `charges`: an outage's share grants of a key (36 s a token: owed for minutes), then
    /// the charge-back as said.
    #[cfg(feature = "testing")]
    fn dropped_after<B: Backend + Clone>(
        backend: impl FnOnce() -> (tollgate::testing::SimBackend, Resilient<B>),
        name: &str,
        charges: &[Charge],
    ) -> Vec<f64> {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let quota = Quota::per_hour(100);
        let series_name = format!("tollgate_writeback_dropped_total{{store={name}}}");
        ::metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                let (sim, store) = backend();
                let limiter = tollgate::Limiter::builder(store)
                    .limit(tollgate::LimitSpec::new("api", quota))
                    .build()
                    .unwrap();
                let mut dropped = Vec::new();
                for &charge in charges {
                    for _ in 0..5 {
                        assert!(limiter.check("api", "k", 1).await.unwrap().allowed());
                    }
                    sim.outage(true);
                    for _ in 0..10 {
                        let d = limiter.check("api", "k", 1).await.unwrap();
                        assert!(d.allowed(), "granted on the share");
                    }
                    sim.outage(false);
                    // Past the breaker's cool-down: the next check reaches Redis, whose
                    // answer sends the charge-back (spawned, not yet running).
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    limiter.check("api", "k", 1).await.unwrap();
                    match charge {
                        Charge::Answered => {}
                        Charge::Fails => {
                            sim.outage(true);
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            sim.outage(false);
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            limiter.check("api", "k", 1).await.unwrap();
                        }
                        Charge::Vanishes => sim.black_hole(true),
                    }
                    tokio::time::sleep(Duration::from_secs(90)).await;
                    sim.black_hole(false);
                    let s = series(&snapshotter);
                    dropped.push(s.get(&series_name).copied().unwrap_or(0.0));
                }
                dropped
            })
        })
    }

    /// A charge-back is counted as dropped only when it is given up: one Redis answers, or
    /// that fails and is answered when sent again, counts nothing; one whose sends all
    /// vanish for over a minute counts its key once.
    #[cfg(feature = "testing")]
    #[test]
    fn a_charge_back_is_counted_as_dropped_only_when_given_up() {
        use tollgate::testing::SimBackend;
        let sim = || {
            let b = SimBackend::new();
            (b.clone(), b.store())
        };
        let runs = [Charge::Answered, Charge::Fails, Charge::Vanishes];
        assert_eq!(dropped_after(sim, "simulated", &runs), [0.0, 0.0, 1.0]);
        // To a backend without ids: one that fails goes back on the list (charged at the
        // next answer); one never answered is dropped once followed for 10 s.
        let no_ids = || {
            let b = SimBackend::new();
            (
                b.clone(),
                Resilient::new(NoIds(b.clone())).clock(*b.clock()),
            )
        };
        assert_eq!(dropped_after(no_ids, "no-ids", &runs), [0.0, 0.0, 1.0]);
    }

    /// Settled costs: one count per settle that took or gave back, and its tokens; an
    /// exact estimate and a dropped one settle nothing.
    #[test]
    fn settles_are_counted_with_their_tokens() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        ::metrics::with_local_recorder(&recorder, || {
            let limiter = tollgate::Limiter::builder(MemoryStore::with_clock(FakeClock::at(
                Duration::from_secs(1_000),
            )))
            .limit(tollgate::LimitSpec::new(
                "tokens",
                Quota::per_minute(1_000).burst(1_000),
            ))
            .build()
            .unwrap();
            rt.block_on(async {
                for (estimate, actual) in [(10, 25), (10, 4), (10, 10), (30, 31)] {
                    let e = limiter.admit("tokens", "k", estimate).await.unwrap();
                    e.settle(actual).await.unwrap();
                }
                drop(limiter.admit("tokens", "k", 7).await.unwrap());
            });
        });
        let s = series(&snapshotter);
        let get = |k: &str| s.get(k).copied();
        assert_eq!(
            get("tollgate_settles_total{limit=tokens,result=taken}"),
            Some(2.0)
        );
        assert_eq!(
            get("tollgate_settled_tokens_total{limit=tokens,result=taken}"),
            Some(16.0)
        );
        assert_eq!(
            get("tollgate_settles_total{limit=tokens,result=given_back}"),
            Some(1.0)
        );
        assert_eq!(
            get("tollgate_settled_tokens_total{limit=tokens,result=given_back}"),
            Some(6.0)
        );
    }

    #[tokio::test]
    async fn the_schema_counts_every_result() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let clock = FakeClock::at(Duration::from_secs(1_000));
        let (memory, failing, refusing) = ::metrics::with_local_recorder(&recorder, || {
            let memory = RateLimitLayer::builder(MemoryStore::with_clock(clock.clone()))
                .limit(Limit::new("enforced", Quota::per_minute(10)).key(PeerIp::new()))
                .limit(
                    Limit::new("trial", Quota::per_minute(1))
                        .key(PeerIp::new())
                        .mode(Mode::Shadow),
                )
                .refusal_log(RefusalLog::off())
                .build()
                .unwrap();
            let failing = RateLimitLayer::builder(Resilient::new(Down).clock(clock.clone()))
                .route(
                    "/fallback",
                    Limit::new("fb", Quota::per_minute(1))
                        .key(PeerIp::new())
                        .on_store_failure(FailurePolicy::Fallback),
                )
                .route(
                    "/open",
                    Limit::new("open", Quota::per_minute(1)).on_store_failure(FailurePolicy::Allow),
                )
                .route(
                    "/closed",
                    Limit::new("closed", Quota::per_minute(1))
                        .on_store_failure(FailurePolicy::Deny),
                )
                .refusal_log(RefusalLog::off())
                .build()
                .unwrap();
            let refusing = RateLimitLayer::builder(Resilient::new(Refusing).clock(clock.clone()))
                .limit(Limit::new("remote", Quota::per_minute(1)).key(PeerIp::new()))
                .refusal_log(RefusalLog::off())
                .build()
                .unwrap();
            (memory, failing, refusing)
        });
        let memory = app(memory);
        // 10 allowed (the last two near the limit: fewer than 2 of 10 left), then denied.
        // The shadow limit (burst 1) would refuse from the second on.
        for i in 0..12 {
            let r = send(&memory, req("/items/1", "192.0.2.1")).await;
            let expected = if i < 10 {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            assert_eq!(r.status(), expected, "request {i}");
        }
        send(&memory, req("/items/1", "192.0.2.2")).await;
        send(&memory, req("/items/1", "192.0.2.3")).await;

        let failing = Router::new()
            .route("/fallback", get(|| async { "ok" }))
            .route("/open", get(|| async { "ok" }))
            .route("/closed", get(|| async { "ok" }))
            .route_layer(failing);
        for (path, status) in [
            ("/fallback", StatusCode::OK),
            ("/fallback", StatusCode::TOO_MANY_REQUESTS),
            ("/open", StatusCode::OK),
            ("/closed", StatusCode::SERVICE_UNAVAILABLE),
        ] {
            assert_eq!(
                send(&failing, req(path, "192.0.2.1")).await.status(),
                status,
                "{path}"
            );
        }

        let refusing = app(refusing);
        for _ in 0..3 {
            let r = send(&refusing, req("/items/1", "192.0.2.1")).await;
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        }

        let s = series(&snapshotter);
        let expected: Series = [
            (
                "tollgate_requests_total{limit=enforced,result=allowed}",
                12.0,
            ),
            ("tollgate_requests_total{limit=enforced,result=denied}", 2.0),
            ("tollgate_requests_total{limit=trial,result=allowed}", 3.0),
            (
                "tollgate_requests_total{limit=trial,result=shadow_denied}",
                11.0,
            ),
            ("tollgate_near_limit_total{limit=enforced}", 2.0),
            ("tollgate_near_limit_total{limit=trial}", 3.0),
            ("tollgate_keys{limit=enforced}", 3.0),
            ("tollgate_keys{limit=trial}", 3.0),
            (
                "tollgate_requests_total{limit=fb,result=fallback_allowed}",
                1.0,
            ),
            (
                "tollgate_requests_total{limit=fb,result=fallback_denied}",
                1.0,
            ),
            (
                "tollgate_requests_total{limit=open,result=failed_open}",
                1.0,
            ),
            (
                "tollgate_requests_total{limit=closed,result=failed_closed}",
                1.0,
            ),
            ("tollgate_near_limit_total{limit=fb}", 1.0),
            // The third failure opens the breaker: the fourth request makes no call.
            (
                "tollgate_store_errors_total{kind=backend,store=test_store}",
                3.0,
            ),
            ("tollgate_store_duration_seconds{store=test_store}", 3.0),
            ("tollgate_breaker_open{store=test_store}", 1.0),
            ("tollgate_requests_total{limit=remote,result=denied}", 3.0),
            ("tollgate_deny_cache_hits_total{limit=remote}", 2.0),
            ("tollgate_store_duration_seconds{store=refusing}", 1.0),
            ("tollgate_breaker_open{store=refusing}", 0.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let nonzero: Series = s
            .into_iter()
            .filter(|(k, v)| *v != 0.0 || k.contains("breaker"))
            .collect();
        assert_eq!(nonzero, expected);
    }

    /// A backend that never answers.
    #[derive(Clone)]
    struct Silent;

    impl Backend for Silent {
        type Table = ();
        type Future = std::future::Pending<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::pending()
        }
        fn name(&self) -> &'static str {
            "Silent"
        }
    }

    /// A backend that answers, but with no status for the items it was sent.
    #[derive(Clone)]
    struct Short;

    impl Backend for Short {
        type Table = ();
        type Future = Ready<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::ready(Ok(Statuses::new()))
        }
        fn name(&self) -> &'static str {
            "Short"
        }
    }

    /// One check of a key through `store`, awaited.
    async fn check_once<B: Backend>(store: &Resilient<B>) {
        use tollgate::store::{Checked, Store};
        let table = store.table("api");
        let item = Item::new(
            &table,
            tollgate::key::Key::from_part("k"),
            Quota::per_second(1),
            1,
        );
        if let Checked::Pending(f) = store.apply(Op::Check, &[item]) {
            f.await;
        }
    }

    /// A failed call is counted by its kind: no answer within the timeout is `timeout`,
    /// an error `backend`, an answer of the wrong length `protocol`.
    #[tokio::test(start_paused = true)]
    async fn store_errors_are_counted_by_kind() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let (silent, down, short) = ::metrics::with_local_recorder(&recorder, || {
            (
                Resilient::new(Silent).timeout(Duration::from_millis(10)),
                Resilient::new(Down),
                Resilient::new(Short),
            )
        });
        check_once(&silent).await;
        check_once(&down).await;
        check_once(&short).await;
        let errors: Series = series(&snapshotter)
            .into_iter()
            .filter(|(k, v)| k.starts_with("tollgate_store_errors_total") && *v != 0.0)
            .collect();
        let expected: Series = [
            "tollgate_store_errors_total{kind=timeout,store=silent}",
            "tollgate_store_errors_total{kind=backend,store=test_store}",
            "tollgate_store_errors_total{kind=protocol,store=short}",
        ]
        .into_iter()
        .map(|k| (k.to_owned(), 1.0))
        .collect();
        assert_eq!(errors, expected);
    }

    /// Issue 42: the units of streams, passed and refused, per limit and what it counts
    /// (bytes, messages, or requests charged from a stream).
    #[tokio::test]
    async fn stream_units_are_counted_passed_and_refused() {
        use tollgate::pace::{OverLimit, Per};
        use tollgate::{LimitSpec, Limiter};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let clock = FakeClock::at(Duration::from_secs(1_000));
        let limiter = Limiter::builder(MemoryStore::with_clock(clock))
            .limit(
                LimitSpec::new("bytes", Quota::per_second(1_000).burst(100))
                    .per(Per::Byte)
                    .over_limit(OverLimit::End),
            )
            .limit(
                LimitSpec::new("messages", Quota::per_second(10).burst(5))
                    .per(Per::Message)
                    .over_limit(OverLimit::End),
            )
            .limit(LimitSpec::new("requests", Quota::per_second(10)))
            .build()
            .unwrap();
        let (mut pacer, mut messages, mut requests) =
            ::metrics::with_local_recorder(&recorder, || {
                (
                    limiter.pacer("bytes", "k").unwrap(),
                    limiter.pacer("messages", "k").unwrap(),
                    limiter.pacer("requests", "k").unwrap(),
                )
            });
        pacer.charge(60).await.unwrap();
        pacer.charge(40).await.unwrap();
        assert!(pacer.charge(30).await.is_err());
        messages.charge(2).await.unwrap();
        requests.charge(1).await.unwrap();
        let s = series(&snapshotter);
        // Each limit labelled with what it counts.
        assert_eq!(
            s["tollgate_stream_units_total{limit=messages,per=message,result=passed}"],
            2.0
        );
        assert_eq!(
            s["tollgate_stream_units_total{limit=requests,per=request,result=passed}"],
            1.0
        );
        assert_eq!(
            s["tollgate_stream_units_total{limit=bytes,per=byte,result=passed}"],
            100.0
        );
        assert_eq!(
            s["tollgate_stream_units_total{limit=bytes,per=byte,result=refused}"],
            30.0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_requests_are_counted_with_their_wait() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let clock = FakeClock::at(Duration::from_secs(1_000));
        let layer = ::metrics::with_local_recorder(&recorder, || {
            RateLimitLayer::builder(MemoryStore::with_clock(clock))
                .limit(
                    Limit::new("smooth", Quota::per_second(10).burst(1))
                        .key(PeerIp::new())
                        .delay(Duration::from_secs(1), 10),
                )
                .build()
                .unwrap()
        });
        let app = app(layer);
        for _ in 0..3 {
            assert_eq!(send(&app, req("/items/1", "192.0.2.1")).await.status(), 200);
        }
        let s = series(&snapshotter);
        assert_eq!(s["tollgate_delayed_total{limit=smooth}"], 2.0);
        assert_eq!(
            s["tollgate_delay_seconds{limit=smooth}"], 2.0,
            "two samples"
        );
        assert_eq!(
            s["tollgate_requests_total{limit=smooth,result=allowed}"],
            3.0
        );
    }

    #[tokio::test]
    async fn keys_leave_the_gauge_when_swept() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let clock = FakeClock::at(Duration::from_secs(1_000));
        let store = MemoryStore::with_clock(clock.clone()).idle_grace(Duration::from_secs(1));
        let layer = ::metrics::with_local_recorder(&recorder, || {
            RateLimitLayer::builder(store.clone())
                .limit(Limit::new("per-ip", Quota::per_second(10)).key(PeerIp::new()))
                .build()
                .unwrap()
        });
        let app = app(layer);
        for ip in ["192.0.2.1", "192.0.2.2", "192.0.2.3"] {
            send(&app, req("/items/1", ip)).await;
        }
        assert_eq!(series(&snapshotter)["tollgate_keys{limit=per-ip}"], 3.0);
        clock.advance(Duration::from_secs(10));
        assert_eq!(store.sweep(), 3);
        // The debugging recorder drains on each snapshot: this one shows the change.
        assert_eq!(series(&snapshotter)["tollgate_keys{limit=per-ip}"], -3.0);
    }

    #[tokio::test]
    async fn labels_stay_bounded_under_100k_distinct_keys() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let layer = ::metrics::with_local_recorder(&recorder, || {
            RateLimitLayer::builder(store())
                .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
                .limit(Limit::new(
                    "global",
                    Quota::per_second(1_000_000).burst(1_000_000),
                ))
                .track_offenders(OffenderTracking::new())
                .refusal_log(RefusalLog::off())
                .build()
                .unwrap()
        });
        let app = app(layer);
        for i in 0..100_000u32 {
            let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i / 2).to_string();
            send(&app, req(&format!("/items/{i}"), &ip)).await;
        }
        let s = series(&snapshotter);
        // 7 results + near-limit + keys, per limit: whatever the traffic.
        assert!(
            s.len() <= 2 * 9,
            "{} series: {:?}",
            s.len(),
            s.keys().collect::<Vec<_>>()
        );
        let values: BTreeSet<String> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .flat_map(|(k, ..)| {
                k.key()
                    .labels()
                    .map(|l| l.value().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        let allowed: BTreeSet<String> = ["per-ip", "global"]
            .into_iter()
            .chain(tollgate::metrics::RESULTS)
            .map(str::to_owned)
            .collect();
        assert!(values.is_subset(&allowed), "{values:?}");
        assert_eq!(
            s["tollgate_requests_total{limit=per-ip,result=allowed}"],
            50_000.0
        );
        assert_eq!(
            s["tollgate_requests_total{limit=per-ip,result=denied}"],
            50_000.0
        );
    }
    /// The audit log's metrics are its `AuditStats`: violations queued, written, lost with
    /// a failed batch (every other one here) and dropped by a full queue (2 places).
    #[tokio::test]
    async fn audit_metrics_are_the_audit_logs_stats() {
        use tollgate::audit::{AuditLog, BoxError, Violation};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let batches = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let sink = move |_: Vec<Violation>| {
            let n = batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                match n % 2 {
                    0 => Ok(()),
                    _ => Err::<(), BoxError>("down".into()),
                }
            }
        };
        let (log, layer) = ::metrics::with_local_recorder(&recorder, || {
            let log = AuditLog::builder(sink)
                .capacity(2)
                .batch_size(1)
                .build()
                .unwrap();
            let layer = RateLimitLayer::builder(store())
                .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
                .audit(log.clone())
                .refusal_log(RefusalLog::off())
                .build()
                .unwrap();
            (log, layer)
        });
        let app = app(layer);
        for round in 0..20 {
            for _ in 0..10 {
                send(&app, req("/items/1", "10.0.0.1")).await;
            }
            if round == 0 {
                assert!(log.stats().dropped > 0, "{:?}", log.stats());
            }
            tokio::task::yield_now().await;
        }
        // Until the queue is empty.
        let deadline = Instant::now() + Duration::from_secs(30);
        let stats = loop {
            let stats = log.stats();
            if stats.queued == 0 && stats.accepted == stats.written + stats.failed {
                break stats;
            }
            assert!(Instant::now() < deadline, "{stats:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(stats.accepted + stats.dropped, 199, "{stats:?}");
        assert!(stats.written > 0 && stats.failed > 0, "{stats:?}");
        let s = series(&snapshotter);
        assert_eq!(s["tollgate_audit_accepted_total{}"], stats.accepted as f64);
        assert_eq!(s["tollgate_audit_written_total{}"], stats.written as f64);
        assert_eq!(s["tollgate_audit_failed_total{}"], stats.failed as f64);
        assert_eq!(s["tollgate_audit_dropped_total{}"], stats.dropped as f64);
    }

    /// Reloads by result and whether the running rules are the newest: the counts of
    /// `Rules::status`.
    #[cfg(feature = "rules")]
    #[test]
    fn reload_metrics_are_the_rules_status() {
        use tollgate::rules::Rules;
        const RULES: &str = "[[limits]]\nname = \"a\"\nquota = \"1/s\"\n";
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let rules = ::metrics::with_local_recorder(&recorder, || {
            Rules::builder(MemoryStore::new())
                .text(RULES)
                .build()
                .unwrap()
        });
        assert_eq!(series(&snapshotter)["tollgate_rules_healthy{}"], 1.0);
        rules.reload(RULES).unwrap();
        rules.reload(RULES).unwrap();
        rules
            .reload("[[limits]]\nname = \"a\"\nquota = \"many\"\n")
            .unwrap_err();
        let status = rules.status();
        assert_eq!(
            (status.reloads, status.failures, status.healthy),
            (2, 1, false)
        );
        let s = series(&snapshotter);
        assert_eq!(s["tollgate_reloads_total{result=ok}"], 2.0);
        assert_eq!(s["tollgate_reloads_total{result=error}"], 1.0);
        assert_eq!(s["tollgate_rules_healthy{}"], 0.0);
        rules.reload(RULES).unwrap();
        assert_eq!(series(&snapshotter)["tollgate_rules_healthy{}"], 1.0);
    }
}
