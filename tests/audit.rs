//! The violation audit log: the tracing sink's events, custom sinks and their batches, a
//! flood into a slow or stuck sink (bounded queue, exact drop counts, requests never
//! waiting), failing sinks, and (feature `audit-sql`) SQLite rows.

mod support;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use support::{Lines, get as req, send};
use tollgate::audit::{AuditLog, AuditStats, BoxError, TracingSink, Violation};
use tollgate::clock::FakeClock;
use tollgate::key::{Header, PeerAddr, PeerIp};
use tollgate::store::MemoryStore;
use tollgate::{Limit, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

fn store() -> MemoryStore<FakeClock> {
    MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)))
}

fn app<St: tollgate::store::Store>(layer: RateLimitLayer<St>) -> Router {
    Router::new()
        .route("/items/{id}", get(|| async { "ok" }))
        .route_layer(layer)
}

/// Waits until the writer has settled every accepted violation (or panics after 30 s).
async fn settled(log: &AuditLog) -> AuditStats {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = log.stats();
        if s.queued == 0 && s.written + s.failed == s.accepted {
            return s;
        }
        assert!(Instant::now() < deadline, "audit log never settled: {s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A sink that keeps every batch.
fn collecting() -> (Arc<Mutex<Vec<Vec<Violation>>>>, AuditLog) {
    let batches = Arc::new(Mutex::new(Vec::new()));
    let kept = batches.clone();
    let log = AuditLog::builder(move |batch: Vec<Violation>| {
        kept.lock().unwrap().push(batch);
        async { Ok::<(), BoxError>(()) }
    })
    .batch_size(4)
    .flush_interval(Duration::from_millis(5))
    .build()
    .unwrap();
    (batches, log)
}

#[tokio::test]
async fn the_tracing_sink_writes_one_event_per_refusal_with_every_field() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let audit = AuditLog::builder(TracingSink::new())
        .flush_interval(Duration::from_millis(5))
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(store())
        .limit(
            Limit::new("per-ip", Quota::per_minute(1))
                .key(PeerIp::new())
                .rule_id(42),
        )
        .audit(audit.clone())
        .build()
        .unwrap();
    let app = app(layer);
    assert_eq!(
        send(&app, req("/items/1", "203.0.113.7")).await.status(),
        StatusCode::OK
    );
    for id in 2..5 {
        let path = format!("/items/{id}");
        let status = send(&app, req(&path, "203.0.113.7")).await.status();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    }
    let stats = settled(&audit).await;
    assert_eq!((stats.accepted, stats.written, stats.dropped), (3, 3, 0));
    let events = lines.matching("rate limit violation");
    assert_eq!(events.len(), 3, "{events:#?}");
    for line in &events {
        for field in [
            "tollgate::audit",
            "limit=\"per-ip\"",
            "key=\"@203.0.113.7\"",
            "client=203.0.113.7",
            "route=\"/items/{id}\"",
            "tokens_left=0",
            "retry_after_ms=60000",
            "cost=1",
            "rule_id=42",
            "shadow=false",
            "at=\"20",
        ] {
            assert!(line.contains(field), "{field} missing from {line}");
        }
    }
}

/// Issue 42: a stream's refusals (a pacer over a limit of messages) are audited like
/// refused requests: the limit, the stream's key, route and client, its rule id.
#[tokio::test]
async fn a_streams_refusals_are_audited() {
    use tollgate::pace::{OverLimit, Per};
    use tollgate::{LimitSpec, Limiter};
    let (batches, audit) = collecting();
    let limiter = Limiter::builder(store())
        .limit(
            LimitSpec::new("ws-messages", Quota::per_minute(2))
                .per(Per::Message)
                .over_limit(OverLimit::End)
                .rule_id(7),
        )
        .build()
        .unwrap();
    let client: IpAddr = "203.0.113.7".parse().unwrap();
    let mut pacer = limiter
        .pacer("ws-messages", PeerIp::new().key(client))
        .unwrap()
        .audit(audit.clone(), "/ws", Some(client));
    pacer.charge(1).await.unwrap();
    pacer.charge(1).await.unwrap();
    assert!(pacer.charge(1).await.is_err());
    assert!(pacer.charge(1).await.is_err());
    let stats = settled(&audit).await;
    assert_eq!((stats.accepted, stats.written), (2, 2));
    let batches = batches.lock().unwrap();
    let all: Vec<&Violation> = batches.iter().flatten().collect();
    let v = all[0];
    assert_eq!(
        (v.limit, v.key.as_str(), v.client, v.route.as_str()),
        ("ws-messages", "@203.0.113.7", Some(client), "/ws")
    );
    assert_eq!(
        (v.cost, v.tokens_left, v.rule_id, v.shadow),
        (1, 0, Some(7), false)
    );
    assert_eq!(v.retry_after, Some(Duration::from_secs(30)));
}

/// Issue 42: a routed limit of bytes paces response bodies with pacers the layer makes;
/// their refusals are audited like a refused request's: the limit, the request's key,
/// route and client.
#[tokio::test]
async fn a_routed_limit_of_bytes_audits_the_bodies_it_ends() {
    use http_body_util::BodyExt;
    use tollgate::pace::{Direction, OverLimit, Per};
    let (batches, audit) = collecting();
    let layer = RateLimitLayer::builder(store())
        .route(
            "GET /files/{*path}",
            Limit::new("download", Quota::per_second(1_024).burst(1_024))
                .key(PeerIp::new())
                .per(Per::Byte)
                .direction(Direction::Out)
                .over_limit(OverLimit::End),
        )
        .audit(audit.clone())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/files/{*path}",
            get(|| async {
                let chunks = (0..4).map(|_| Ok::<_, Infallible>(Bytes::from(vec![7u8; 1_024])));
                axum::body::Body::from_stream(futures_util::stream::iter(chunks))
            }),
        )
        .route_layer(layer);
    let response = send(&app, req("/files/a.bin", "203.0.113.7")).await;
    assert_eq!(response.status(), StatusCode::OK);
    // The burst (1 KiB) passes, then the body ends with the refusal.
    assert!(response.into_body().collect().await.is_err());
    let stats = settled(&audit).await;
    assert_eq!((stats.accepted, stats.written), (1, 1));
    let batches = batches.lock().unwrap();
    let v = &batches[0][0];
    let client: IpAddr = "203.0.113.7".parse().unwrap();
    assert_eq!(
        (v.limit, v.key.as_str(), v.client, v.route.as_str()),
        ("download", "@203.0.113.7", Some(client), "/files/{*path}")
    );
}

#[tokio::test]
async fn a_custom_sink_gets_batches_with_hashed_keys_routes_rule_ids_and_shadow_flags() {
    let (batches, audit) = collecting();
    let layer = two_limits(audit.clone());
    let app = app(layer);
    // "per-key" (burst 2) refuses from the third request on; the shadow "per-ip" (burst
    // 1) would refuse from the second on.
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let mut request = req("/items/9", "198.51.100.4");
        request
            .headers_mut()
            .insert("x-api-key", "secret-key-1".parse().unwrap());
        statuses.push(send(&app, request).await.status());
    }
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(refused, 8);
    let stats = settled(&audit).await;
    let batches = batches.lock().unwrap();
    assert!(batches.iter().all(|b| !b.is_empty() && b.len() <= 4));
    let all: Vec<&Violation> = batches.iter().flatten().collect();
    assert_eq!(all.len() as u64, stats.written);
    let enforced: Vec<_> = all.iter().filter(|v| !v.shadow).collect();
    let shadow: Vec<_> = all.iter().filter(|v| v.shadow).collect();
    assert_eq!(enforced.len(), 8);
    assert_eq!(shadow.len(), 9);
    for v in &enforced {
        assert_eq!(v.limit, "per-key");
        // A header key is often a credential: hashed, never in the clear.
        assert!(v.key.starts_with('#') && v.key.len() == 17, "{}", v.key);
        assert!(!v.key.contains("secret"));
        assert_eq!(v.client, Some("198.51.100.4".parse::<IpAddr>().unwrap()));
        assert_eq!(v.route, "/items/{id}");
        assert_eq!(v.rule_id, Some(7));
        assert_eq!(v.tokens_left, 0);
        assert_eq!(v.cost, 1);
        assert!(v.retry_after.is_some());
    }
    for v in &shadow {
        assert_eq!(v.limit, "per-ip");
        assert_eq!(v.key, "@198.51.100.4");
        assert_eq!(v.rule_id, None);
    }
    // Every violation of one batch is in time order.
    for b in batches.iter() {
        assert!(b.windows(2).all(|w| w[0].at <= w[1].at));
    }
}

/// Two limits: an enforcing header-keyed one with a rule id, a shadow per-address one.
fn two_limits(audit: AuditLog) -> RateLimitLayer<MemoryStore<FakeClock>> {
    RateLimitLayer::builder(store())
        .limit(
            Limit::new("per-key", Quota::per_minute(2))
                .key(Header::new("x-api-key"))
                .rule_id(7),
        )
        .limit(
            Limit::new("per-ip", Quota::per_minute(1))
                .key(PeerIp::new())
                .shadow(),
        )
        .audit(audit)
        .build()
        .unwrap()
}

/// A refused request straight through the layer's service (no router): the flood's unit.
fn flood_service(
    audit: Option<AuditLog>,
) -> impl Service<
    Request<()>,
    Response = Response<tollgate::service::ResponseBody<http_body_util::Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    let mut builder = RateLimitLayer::builder(store())
        .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
        .refusal_log(tollgate::RefusalLog::off());
    if let Some(audit) = audit {
        builder = builder.audit(audit);
    }
    builder.build().unwrap().layer(tower::service_fn(|_| async {
        Ok::<_, Infallible>(Response::new(http_body_util::Full::new(Bytes::new())))
    }))
}

fn flood_request(peer: SocketAddr) -> Request<()> {
    let mut request = Request::get("/items/1").body(()).unwrap();
    request.extensions_mut().insert(PeerAddr(peer));
    request
}

/// Sends `n` requests from one client; returns the refusals and the largest queue seen.
async fn flood<S>(svc: &mut S, n: usize, audit: Option<&AuditLog>) -> (u64, u64)
where
    S: Service<
            Request<()>,
            Response = Response<tollgate::service::ResponseBody<http_body_util::Full<Bytes>>>,
            Error = Infallible,
        >,
{
    let peer: SocketAddr = "192.0.2.9:4000".parse().unwrap();
    let (mut refused, mut largest) = (0, 0);
    for i in 0..n {
        let response = svc.ready().await.unwrap().call(flood_request(peer)).await;
        if response.unwrap().status() == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
        if let (Some(log), 0) = (audit, i % 1_000) {
            largest = largest.max(log.stats().queued);
        }
    }
    (refused, largest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_into_a_slow_sink_stays_bounded_and_counts_every_drop() {
    const N: usize = 200_000;
    const CAPACITY: usize = 1_000;
    let delivered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = delivered.clone();
    // A slow sink: its first write lasts until the queue has overflowed (however fast or
    // slow the machine runs the flood), then 2 ms per batch of at most 100.
    let this_log = Arc::new(std::sync::OnceLock::<AuditLog>::new());
    let log = this_log.clone();
    let audit = AuditLog::builder(move |batch: Vec<Violation>| {
        let (seen, log) = (seen.clone(), log.clone());
        async move {
            while log.get().is_none_or(|log| log.stats().dropped == 0) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            seen.fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
            Ok::<(), BoxError>(())
        }
    })
    .capacity(CAPACITY)
    .batch_size(100)
    .flush_interval(Duration::from_millis(1))
    .write_timeout(Duration::from_secs(3_600))
    .build()
    .unwrap();
    this_log.set(audit.clone()).unwrap();
    let mut svc = flood_service(Some(audit.clone()));
    let (refused, largest) = flood(&mut svc, N, Some(&audit)).await;
    assert_eq!(refused, N as u64 - 1);
    let stats = settled(&audit).await;
    let delivered = delivered.load(std::sync::atomic::Ordering::Relaxed);
    // Exact accounting: every refusal was delivered or counted as dropped.
    assert_eq!(stats.written, delivered);
    assert_eq!(stats.failed, 0);
    assert_eq!(stats.accepted, delivered);
    assert_eq!(delivered + stats.dropped, refused, "{stats:?}");
    assert!(
        stats.dropped > 0,
        "the flood never filled the queue: {stats:?}"
    );
    // Bounded: the queue never held more than its capacity.
    assert!(largest <= CAPACITY as u64, "{largest}");
    assert!(stats.peak_queued <= CAPACITY as u64, "{stats:?}");
    assert!(stats.peak_queued > 0);
    assert_eq!(stats.capacity, CAPACITY as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_never_returns_does_not_slow_requests() {
    const N: usize = 50_000;
    const CAPACITY: usize = 500;
    const BATCH: usize = 50;
    let audit = AuditLog::builder(|_batch: Vec<Violation>| std::future::pending())
        .capacity(CAPACITY)
        .batch_size(BATCH)
        .flush_interval(Duration::from_millis(1))
        .write_timeout(Duration::from_secs(3_600))
        .build()
        .unwrap();
    // The same flood without an audit log, for comparison.
    let mut plain = flood_service(None);
    let started = Instant::now();
    flood(&mut plain, N, None).await;
    let without = started.elapsed();

    let mut svc = flood_service(Some(audit.clone()));
    let started = Instant::now();
    let run = flood(&mut svc, N, Some(&audit));
    let (refused, largest) = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("requests waited on a stuck sink");
    let with = started.elapsed();
    println!("{N} refusals: {without:?} without an audit log, {with:?} into a stuck sink");
    // Generous against a shared machine, but a request that waited on the sink even
    // once would never finish.
    assert!(
        with < without * 5 + Duration::from_secs(2),
        "{with:?} vs {without:?}"
    );
    let stats = audit.stats();
    assert_eq!(stats.written, 0);
    assert_eq!(stats.queued, CAPACITY as u64);
    assert!(largest <= CAPACITY as u64);
    // The writer holds one batch in the stuck write; the queue holds the rest.
    assert!(stats.accepted >= CAPACITY as u64 && stats.accepted <= (CAPACITY + BATCH) as u64);
    assert_eq!(stats.accepted + stats.dropped, refused);
    assert_eq!(stats.batches, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peak_queued_counts_what_waits_behind_a_stuck_write_not_zero() {
    const CAPACITY: usize = 10_000;
    // A sink that holds its first write until the gate closes.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let audit = AuditLog::builder(move |_batch: Vec<Violation>| {
        let held = held.clone();
        async move {
            let _ = held.acquire().await;
            Ok::<(), BoxError>(())
        }
    })
    .capacity(CAPACITY)
    .batch_size(1)
    .flush_interval(Duration::from_millis(1))
    .write_timeout(Duration::from_secs(3_600))
    .build()
    .unwrap();
    let mut svc = flood_service(Some(audit.clone()));
    // One request passes; the writer holds at most one refusal; the rest fill the queue.
    let (refused, _) = flood(&mut svc, CAPACITY + 100, None).await;
    assert_eq!(refused, CAPACITY as u64 + 99);
    let stats = audit.stats();
    // (One less if the writer took its one refusal only after the flood.)
    assert!(stats.queued >= CAPACITY as u64 - 1, "{stats:?}");
    assert_eq!(
        stats.peak_queued, CAPACITY as u64,
        "the queue was full: {stats:?}"
    );
    // Released, the queue drains; the peak stays.
    gate.close();
    let stats = settled(&audit).await;
    assert_eq!(stats.accepted + stats.dropped, refused);
    assert_eq!(stats.peak_queued, CAPACITY as u64, "{stats:?}");
}

#[tokio::test]
async fn failed_and_timed_out_writes_lose_their_batch_and_are_counted_and_logged() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let failing = AuditLog::builder(|_batch: Vec<Violation>| async {
        Err::<(), BoxError>("disk full".into())
    })
    .flush_interval(Duration::from_millis(1))
    .build()
    .unwrap();
    let slow = AuditLog::builder(|_batch: Vec<Violation>| async {
        tokio::time::sleep(Duration::from_secs(3_600)).await;
        Ok::<(), BoxError>(())
    })
    .flush_interval(Duration::from_millis(1))
    .write_timeout(Duration::from_millis(20))
    .build()
    .unwrap();
    for audit in [&failing, &slow] {
        let layer = RateLimitLayer::builder(store())
            .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
            .audit(audit.clone())
            .build()
            .unwrap();
        let app = app(layer);
        for _ in 0..6 {
            send(&app, req("/items/1", "192.0.2.77")).await;
        }
        let stats = settled(audit).await;
        assert_eq!((stats.accepted, stats.failed, stats.written), (5, 5, 0));
    }
    assert_eq!(lines.matching("disk full").len(), 1);
    assert_eq!(lines.matching("the write took more than 20ms").len(), 1);
}

#[tokio::test]
async fn a_sink_that_panics_loses_its_batch_not_the_writer() {
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = calls.clone();
    let audit = AuditLog::builder(move |_batch: Vec<Violation>| {
        let first = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0;
        async move {
            assert!(!first, "the first write panics");
            Ok::<(), BoxError>(())
        }
    })
    .batch_size(1)
    .flush_interval(Duration::ZERO)
    .build()
    .unwrap();
    let layer = RateLimitLayer::builder(store())
        .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
        .audit(audit.clone())
        .build()
        .unwrap();
    let app = app(layer);
    for _ in 0..4 {
        send(&app, req("/items/1", "192.0.2.78")).await;
    }
    let stats = settled(&audit).await;
    assert_eq!((stats.failed, stats.written, stats.batches), (1, 2, 3));
}

#[test]
fn bad_audit_settings_are_config_errors() {
    let sink = || TracingSink::new();
    let err = AuditLog::builder(sink()).capacity(0).build().unwrap_err();
    assert_eq!(err.field(), "audit.capacity");
    let err = AuditLog::builder(sink()).batch_size(0).build().unwrap_err();
    assert_eq!(err.field(), "audit.batch_size");
    let err = AuditLog::builder(sink())
        .write_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "audit.write_timeout");
    let err = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::new("x", Quota::per_second(1)).rule_id(u64::MAX))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "limits[\"x\"].rule_id");
}

#[cfg(feature = "audit-sql")]
mod sql {
    use super::*;
    use sqlx::Row;
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    #[cfg(feature = "rules-sql")]
    use tollgate::sql::SqlRuleRow;
    use tollgate::sql::{self, SqlPool, SqlViolationSink};

    async fn sqlite(dir: &tempfile::TempDir) -> sqlx::SqlitePool {
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("tollgate.db"))
            .create_if_missing(true);
        SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap()
    }

    #[cfg(feature = "rules-sql")]
    #[tokio::test]
    async fn the_migration_creates_both_tables_once_and_rules_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let pool = sqlite(&dir).await;
        let db = SqlPool::from(pool.clone());
        sql::migrate(&db).await.unwrap();
        sqlx::raw_sql(
            "INSERT INTO RateLimitRule (key_pattern, scope, rate_per_second, burst_capacity, plan, is_active, description)
             VALUES ('user:{user_id}', 'user', 10, 50, 'free', TRUE, 'free users'),
                    ('user:{user_id}', 'user', 100, 500, 'pro', FALSE, NULL),
                    ('global', 'global', 50000.5, 100000, NULL, TRUE, NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        // Again: nothing changes, nothing is lost.
        sql::migrate(&db).await.unwrap();
        let rules = sql::fetch_rules(&db).await.unwrap();
        assert_eq!(rules.len(), 3);
        let expect = |rule_id, key: &str, scope: &str, rate, burst, plan: Option<&str>| {
            (
                rule_id,
                key.to_owned(),
                scope.to_owned(),
                rate,
                burst,
                plan.map(str::to_owned),
            )
        };
        let got: Vec<_> = rules
            .iter()
            .map(|r: &SqlRuleRow| {
                (
                    r.rule_id,
                    r.key_pattern.clone(),
                    r.scope.clone(),
                    r.rate_per_second,
                    r.burst_capacity,
                    r.plan.clone(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                expect(1, "user:{user_id}", "user", 10.0, 50, Some("free")),
                expect(2, "user:{user_id}", "user", 100.0, 500, Some("pro")),
                expect(3, "global", "global", 50_000.5, 100_000, None),
            ]
        );
        assert_eq!(
            rules.iter().map(|r| r.is_active).collect::<Vec<_>>(),
            [true, false, true]
        );
        assert_eq!(rules[0].description.as_deref(), Some("free users"));
        assert_eq!(rules[1].description, None);
        // The schema's unique (key_pattern, plan).
        let duplicate = sqlx::raw_sql(
            "INSERT INTO RateLimitRule (key_pattern, scope, rate_per_second, burst_capacity, plan)
             VALUES ('user:{user_id}', 'user', 1, 1, 'free')",
        )
        .execute(&pool)
        .await;
        assert!(duplicate.is_err());
    }

    #[tokio::test]
    async fn refusals_become_rows_with_the_right_columns() {
        let dir = tempfile::tempdir().unwrap();
        let pool = sqlite(&dir).await;
        let db = SqlPool::from(pool.clone());
        sql::migrate(&db).await.unwrap();
        let audit = AuditLog::builder(SqlViolationSink::new(db.clone()))
            .batch_size(3)
            .flush_interval(Duration::from_millis(5))
            .build()
            .unwrap();
        let layer = RateLimitLayer::builder(store())
            .limit(
                Limit::new("per-ip", Quota::per_minute(2))
                    .key(PeerIp::new())
                    .rule_id(11),
            )
            .limit(Limit::new("all", Quota::per_minute(1_000)).shadow())
            .audit(audit.clone())
            .build()
            .unwrap();
        let app = app(layer);
        let before = std::time::SystemTime::now();
        for i in 0..9 {
            send(&app, req(&format!("/items/{i}"), "2001:db8::5")).await;
        }
        let stats = settled(&audit).await;
        assert_eq!((stats.written, stats.failed), (7, 0));
        assert!(stats.batches >= 3);
        let rows = sqlx::query(
            "SELECT violation_id, bucket_key, user_id, ip_address, endpoint, requested_at,
                    julianday(requested_at) AS day, tokens_at_time, rule_id, limit_name, cost,
                    retry_after_ms, shadow
             FROM RateLimitViolation ORDER BY violation_id",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), 7);
        let since_epoch = before.duration_since(std::time::UNIX_EPOCH).unwrap();
        let day_before = 2_440_587.5 + since_epoch.as_secs_f64() / 86_400.0;
        for (n, row) in rows.iter().enumerate() {
            assert_eq!(row.get::<i64, _>("violation_id"), n as i64 + 1);
            assert_eq!(row.get::<String, _>("bucket_key"), "@[2001:db8::]/56");
            assert_eq!(row.get::<Option<i64>, _>("user_id"), None);
            assert_eq!(row.get::<String, _>("ip_address"), "2001:db8::5");
            assert_eq!(row.get::<String, _>("endpoint"), "/items/{id}");
            let at: String = row.get("requested_at");
            assert!(at.ends_with('Z') && at.len() == 27, "{at}");
            // SQLite's own date functions read the time, and it is now.
            let day: f64 = row.get("day");
            assert!(day >= day_before - 1e-6 && day < day_before + 0.01, "{day}");
            assert_eq!(row.get::<f64, _>("tokens_at_time"), 0.0);
            assert_eq!(row.get::<Option<i64>, _>("rule_id"), Some(11));
            assert_eq!(row.get::<String, _>("limit_name"), "per-ip");
            assert_eq!(row.get::<i64, _>("cost"), 1);
            let wait = row.get::<Option<i64>, _>("retry_after_ms").unwrap();
            assert!(wait > 0 && wait <= 30_000, "{wait}");
            assert!(!row.get::<bool, _>("shadow"));
        }
    }

    #[tokio::test]
    async fn a_batch_the_database_refuses_is_counted_as_failed() {
        let dir = tempfile::tempdir().unwrap();
        let pool = sqlite(&dir).await;
        // No migration: the table is missing.
        let audit = AuditLog::builder(SqlViolationSink::new(pool))
            .flush_interval(Duration::from_millis(1))
            .build()
            .unwrap();
        let layer = RateLimitLayer::builder(store())
            .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
            .audit(audit.clone())
            .build()
            .unwrap();
        let app = app(layer);
        for _ in 0..3 {
            send(&app, req("/items/1", "192.0.2.80")).await;
        }
        let stats = settled(&audit).await;
        assert_eq!((stats.failed, stats.written), (2, 0));
    }
}

/// PostgreSQL, against a server named by `TOLLGATE_TEST_POSTGRES` (e.g.
/// `postgres://postgres@127.0.0.1:5432/postgres`): `cargo test -p tollgate-tests --features rules-postgres
/// --test audit postgres -- --ignored`. Uses its own schema, dropped at the end.
#[cfg(feature = "rules-postgres")]
#[tokio::test]
#[ignore = "needs a PostgreSQL server: TOLLGATE_TEST_POSTGRES=postgres://…"]
async fn postgres_migration_rules_and_violation_rows() {
    use sqlx::Row;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use tollgate::sql::{self, SqlPool, SqlViolationSink};

    let url = std::env::var("TOLLGATE_TEST_POSTGRES")
        .expect("set TOLLGATE_TEST_POSTGRES to a PostgreSQL URL to run this test");
    let schema = format!("tollgate_test_{}", std::process::id());
    let admin = PgPoolOptions::new().connect(&url).await.unwrap();
    sqlx::raw_sql(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .unwrap();
    let options: PgConnectOptions = url.parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.options([("search_path", schema.as_str())]))
        .await
        .unwrap();
    let db = SqlPool::from(pool.clone());
    sql::migrate(&db).await.unwrap();
    sql::migrate(&db).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO RateLimitRule (key_pattern, scope, rate_per_second, burst_capacity, plan, is_active)
         VALUES ('user:{user_id}', 'user', 10, 50, 'free', TRUE), ('global', 'global', 0.5, 2, NULL, FALSE)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let rules = sql::fetch_rules(&db).await.unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(
        (rules[1].rate_per_second, rules[1].burst_capacity),
        (0.5, 2)
    );
    assert_eq!((rules[0].is_active, rules[1].is_active), (true, false));
    assert_eq!(rules[1].plan, None);

    let audit = AuditLog::builder(SqlViolationSink::new(db.clone()))
        .flush_interval(Duration::from_millis(5))
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(store())
        .limit(
            Limit::new("per-ip", Quota::per_minute(1))
                .key(PeerIp::new())
                .rule_id(1),
        )
        .audit(audit.clone())
        .build()
        .unwrap();
    let app = app(layer);
    for _ in 0..4 {
        send(&app, req("/items/3", "203.0.113.9")).await;
    }
    let stats = settled(&audit).await;
    assert_eq!((stats.written, stats.failed), (3, 0));
    let rows = sqlx::query(
        "SELECT bucket_key, host(ip_address) AS ip, endpoint, tokens_at_time, rule_id, limit_name,
                cost, retry_after_ms, shadow, now() - requested_at < interval '1 minute' AS recent
         FROM RateLimitViolation ORDER BY violation_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 3);
    for row in &rows {
        assert_eq!(row.get::<String, _>("bucket_key"), "@203.0.113.9");
        assert_eq!(row.get::<String, _>("ip"), "203.0.113.9");
        assert_eq!(row.get::<String, _>("endpoint"), "/items/{id}");
        assert_eq!(row.get::<f64, _>("tokens_at_time"), 0.0);
        assert_eq!(row.get::<Option<i64>, _>("rule_id"), Some(1));
        assert_eq!(row.get::<String, _>("limit_name"), "per-ip");
        assert_eq!(row.get::<i64, _>("cost"), 1);
        assert!(row.get::<Option<i64>, _>("retry_after_ms").unwrap() > 0);
        assert!(!row.get::<bool, _>("shadow"));
        assert!(row.get::<bool, _>("recent"));
    }
    drop(pool);
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&admin)
        .await
        .unwrap();
}
