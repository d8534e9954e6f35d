//! Bans that escalate: through the axum layer on the memory store (fake clock), by hand
//! from the `Limiter`, no store call for a banned key, one log line per ban, rules files;
//! and shared by two instances on one real Redis.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use support::{Lines, body_json, header, send, with_peer};
use tollgate::clock::FakeClock;
use tollgate::key::PeerIp;
use tollgate::store::{BanCall, BanFuture, Checked, Item, MemoryStore, MemoryTable, Op, Store};
use tollgate::{Ban, Limit, LimiterError, Quota, RateLimitLayer};

fn login_ban() -> Ban {
    Ban::after(3)
        .within(Duration::from_secs(60))
        .for_(Duration::from_secs(10))
        .escalate(2.0)
        .max(Duration::from_secs(30))
        .forget(Duration::from_secs(100))
}

fn app<St: Store>(store: St, status: StatusCode) -> (Router, tollgate::Limiter) {
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("login", Quota::per_minute(2))
                .key(PeerIp::new())
                .ban(login_ban())
                .ban_status(status),
        )
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let router = Router::new()
        .route("/login", post(|| async { "ok" }))
        .route_layer(layer);
    (router, limiter)
}

fn login(peer: &str) -> http::Request<axum::body::Body> {
    with_peer(
        http::Request::post("/login")
            .body(axum::body::Body::empty())
            .unwrap(),
        peer,
    )
}

async fn status(app: &Router, peer: &str) -> StatusCode {
    send(app, login(peer)).await.status()
}

#[tokio::test]
async fn refusals_ban_escalate_and_banned_requests_never_count() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let (app, limiter) = app(
        MemoryStore::with_clock(clock.clone()),
        StatusCode::FORBIDDEN,
    );
    let ip = "192.0.2.1";
    assert_eq!(status(&app, ip).await, StatusCode::OK);
    assert_eq!(status(&app, ip).await, StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(status(&app, ip).await, StatusCode::TOO_MANY_REQUESTS);
    }
    // The third refusal began a 10 s ban.
    let banned = send(&app, login(ip)).await;
    assert_eq!(banned.status(), StatusCode::FORBIDDEN);
    assert_eq!(header(banned.headers(), "retry-after").unwrap(), "10");
    assert_eq!(
        header(banned.headers(), "cache-control").unwrap(),
        "no-store"
    );
    let body = body_json(banned).await;
    assert!(
        body["detail"].as_str().unwrap().contains("\"login\""),
        "{body}"
    );
    // Another client is not banned (its bucket is its own).
    assert_eq!(status(&app, "192.0.2.2").await, StatusCode::OK);
    // Banned requests never count: a flood does not lengthen the ban.
    clock.advance(Duration::from_secs(4));
    for _ in 0..1_000 {
        assert_eq!(status(&app, ip).await, StatusCode::FORBIDDEN);
    }
    let bans = limiter.bans("login").unwrap();
    assert_eq!(bans.len(), 1);
    assert_eq!(bans[0].remaining, Duration::from_secs(6));
    assert_eq!(bans[0].level, 0);
    let r = send(&app, login(ip)).await;
    assert_eq!(header(r.headers(), "retry-after").unwrap(), "6");
    // The ban ends exactly at 10 s.
    clock.advance(Duration::from_secs(6) - Duration::from_millis(1));
    assert_eq!(status(&app, ip).await, StatusCode::FORBIDDEN);
    clock.advance(Duration::from_millis(1));
    assert_ne!(status(&app, ip).await, StatusCode::FORBIDDEN);
    // Counting started afresh when the ban began: that refusal (or pass) was one; two
    // more refusals make a repeat within `forget`: 20 s.
    let mut refusals = 0;
    while limiter.bans("login").unwrap().is_empty() {
        if status(&app, ip).await == StatusCode::TOO_MANY_REQUESTS {
            refusals += 1;
        }
        assert!(refusals <= 3);
    }
    let bans = limiter.bans("login").unwrap();
    assert_eq!(
        (bans[0].remaining, bans[0].level),
        (Duration::from_secs(20), 1)
    );
    // Then 30 s (capped, not 40).
    clock.advance(Duration::from_secs(20));
    while limiter.bans("login").unwrap().is_empty() {
        status(&app, ip).await;
    }
    assert_eq!(
        limiter.bans("login").unwrap()[0].remaining,
        Duration::from_secs(30)
    );
    // Forgotten 100 s after the ban's end: 10 s again.
    clock.advance(Duration::from_secs(30 + 101));
    while limiter.bans("login").unwrap().is_empty() {
        status(&app, ip).await;
    }
    let bans = limiter.bans("login").unwrap();
    assert_eq!(
        (bans[0].remaining, bans[0].level),
        (Duration::from_secs(10), 0)
    );
}

#[tokio::test]
async fn ban_status_429_and_by_hand() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let (app, limiter) = app(
        MemoryStore::with_clock(clock.clone()),
        StatusCode::TOO_MANY_REQUESTS,
    );
    let peer = PeerIp::new().key("198.51.100.7".parse().unwrap());
    limiter
        .ban("login", peer.clone(), Duration::from_secs(3600))
        .unwrap();
    let r = send(&app, login("198.51.100.7")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(r.headers(), "retry-after").unwrap(), "3600");
    assert_eq!(limiter.bans("login").unwrap()[0].key, peer);
    limiter.lift_ban("login", peer).unwrap();
    assert_eq!(status(&app, "198.51.100.7").await, StatusCode::OK);
    assert!(matches!(
        limiter.ban("nope", "k", Duration::from_secs(1)),
        Err(LimiterError::UnknownLimit { .. })
    ));
    let plain = tollgate::Limiter::builder(MemoryStore::new())
        .limit(tollgate::LimitSpec::new("plain", Quota::per_second(1)))
        .build()
        .unwrap();
    assert!(matches!(
        plain.lift_ban("plain", "k"),
        Err(LimiterError::NoBan { .. })
    ));
}

#[test]
fn settings_errors_name_the_field() {
    let build = |limit: Limit| {
        RateLimitLayer::builder(MemoryStore::new())
            .limit(limit)
            .build()
            .unwrap_err()
            .field()
            .to_owned()
    };
    let l = || Limit::new("login", Quota::per_minute(5));
    assert_eq!(
        build(l().ban(Ban::after(0))),
        r#"limits["login"].ban.after"#
    );
    assert_eq!(
        build(l().ban(Ban::after(3).escalate(0.9))),
        r#"limits["login"].ban.escalate"#
    );
    assert_eq!(
        build(l().ban(Ban::after(3).max(Duration::from_secs(1)))),
        r#"limits["login"].ban.max"#
    );
    assert_eq!(
        build(l().ban(Ban::after(3)).ban_status(StatusCode::IM_A_TEAPOT)),
        r#"limits["login"].ban_status"#
    );
}

/// The memory store, counting the calls it gets.
#[derive(Clone)]
struct Counting(MemoryStore<FakeClock>, Arc<AtomicUsize>);

impl Store for Counting {
    type Table = MemoryTable;
    type Future = <MemoryStore<FakeClock> as Store>::Future;

    fn table(&self, name: &str) -> MemoryTable {
        self.0.table(name)
    }

    fn apply(&self, op: Op, items: &[Item<'_, MemoryTable>]) -> Checked<Self::Future> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.apply(op, items)
    }

    fn ban(
        &self,
        table: &MemoryTable,
        key: &tollgate::key::Key,
        call: BanCall,
    ) -> Option<BanFuture> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.ban(table, key, call)
    }

    fn ban_clock(&self) -> tollgate::clock::SharedClock {
        self.0.ban_clock()
    }
}

#[tokio::test]
async fn a_banned_request_makes_no_store_call_and_the_ban_is_logged_once() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let calls = Arc::new(AtomicUsize::new(0));
    let (app, _) = app(
        Counting(MemoryStore::with_clock(clock.clone()), calls.clone()),
        StatusCode::FORBIDDEN,
    );
    for _ in 0..5 {
        status(&app, "203.0.113.9").await;
    }
    assert_eq!(status(&app, "203.0.113.9").await, StatusCode::FORBIDDEN);
    let before = calls.load(Ordering::Relaxed);
    for _ in 0..10_000 {
        assert_eq!(status(&app, "203.0.113.9").await, StatusCode::FORBIDDEN);
    }
    assert_eq!(calls.load(Ordering::Relaxed), before);
    assert_eq!(
        lines.matching("key banned").len(),
        1,
        "{:?}",
        lines.matching("ban")
    );
    assert!(lines.matching("key banned")[0].contains("203.0.113.9"));
}

#[cfg(feature = "rules")]
#[test]
fn the_issues_login_rule_is_accepted() {
    let doc = tollgate::rules::Document::from_toml(
        r#"
        [settings]
        hops = 1

        [[limits]]
        name = "login"
        key = "client_ip"
        routes = ["POST /login"]
        quota = "5/min"
        ban = { after = 3, within = "1m", for = "10m", escalate = 2, max = "1d", forget = "1d" }
        ban_status = 403                     # 403 (default) or 429
        "#,
    )
    .unwrap();
    doc.check().unwrap();
    let bad = tollgate::rules::Document::from_toml(
        "[[limits]]\nname = \"login\"\nkey = \"peer_ip\"\nquota = \"5/min\"\nban = { after = 3, for = \"10m\", escalate = 0.5 }\n",
    )
    .unwrap();
    let err = bad.check().unwrap_err();
    assert_eq!(err.field(), "limits[0].ban.escalate");
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use support::redis::RedisServer;
    use tollgate::audit::{AuditLog, Violation};
    use tollgate::store::RedisStore;

    async fn store(server: &RedisServer, clock: &FakeClock) -> RedisStore {
        RedisStore::new(server.client().get_connection_manager().await.unwrap())
            .timeout(Duration::from_secs(2))
            .clock(clock.clone())
    }

    /// Waits (a condition, not a time) for the background ban calls to land.
    async fn until(mut f: impl FnMut() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not met in 5 s");
    }

    async fn evalsha_calls(server: &RedisServer) -> u64 {
        let mut conn = server.connection().await;
        let info: String = ::redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        info.lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|r| r.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }

    /// Issue 45: a key banned on instance A got, on instance B's first request, an
    /// ordinary 429 with its bucket's wait (here 30 s: two requests of a 2/min bucket),
    /// not the ban's (10 s); the ban showed only from B's next request. B's first refusal
    /// is now the ban's: the ban's status (403), its remaining time as `Retry-After`, its
    /// problem body, and B knows the ban at once (later requests are refused before the
    /// store).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_banned_on_one_instance_is_answered_as_banned_by_the_others_first_refusal() {
        let server = RedisServer::start();
        let clock_a = FakeClock::at(Duration::from_secs(1_000));
        let clock_b = FakeClock::at(Duration::from_secs(1_000));
        let (a, limiter_a) = app(store(&server, &clock_a).await, StatusCode::FORBIDDEN);
        // B records its refusals in an audit log: the first is a banned request's.
        let violations = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = violations.clone();
        let audit = AuditLog::builder(move |batch: Vec<Violation>| {
            kept.lock().unwrap().extend(batch);
            async { Ok::<(), tollgate::audit::BoxError>(()) }
        })
        .flush_interval(Duration::from_millis(5))
        .build()
        .unwrap();
        let layer = RateLimitLayer::builder(store(&server, &clock_b).await)
            .limit(
                Limit::new("login", Quota::per_minute(2))
                    .key(PeerIp::new())
                    .ban(login_ban()),
            )
            .audit(audit)
            .build()
            .unwrap();
        let limiter_b = layer.limiter();
        let b = Router::new()
            .route("/login", post(|| async { "ok" }))
            .route_layer(layer);
        let ip = "192.0.2.51";
        assert_eq!(status(&a, ip).await, StatusCode::OK);
        assert_eq!(status(&a, ip).await, StatusCode::OK);
        for _ in 0..3 {
            assert_eq!(status(&a, ip).await, StatusCode::TOO_MANY_REQUESTS);
        }
        // The third refusal began the ban, in Redis (A learns it in the background).
        until(|| !limiter_a.bans("login").unwrap().is_empty()).await;
        assert!(limiter_b.bans("login").unwrap().is_empty());

        let first = send(&b, login(ip)).await;
        assert_eq!(first.status(), StatusCode::FORBIDDEN, "the ban's status");
        // The ban's 10 s (counted down since it began, in whole seconds rounded up), not
        // the bucket's 30 s.
        let retry: u64 = header(first.headers(), "retry-after")
            .unwrap()
            .parse()
            .unwrap();
        assert!((8..=10).contains(&retry), "{retry}: the ban's time");
        assert!(first.headers().get("ratelimit").is_none());
        let body = body_json(first).await;
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("banned for a while by rate limit \"login\""),
            "{body}"
        );
        until(|| !violations.lock().unwrap().is_empty()).await;
        {
            let seen = violations.lock().unwrap();
            assert_eq!(seen.len(), 1);
            assert!(seen[0].banned, "{:?}", seen[0]);
            assert_eq!(seen[0].limit, "login");
        }
        // B knows the ban now: no wait for a background call.
        let bans = limiter_b.bans("login").unwrap();
        assert_eq!(bans.len(), 1);
        assert!(bans[0].remaining > Duration::from_secs(9), "{bans:?}");
        // And refuses the next requests itself, without a store call.
        let calls = evalsha_calls(&server).await;
        for _ in 0..100 {
            assert_eq!(status(&b, ip).await, StatusCode::FORBIDDEN);
        }
        assert!(evalsha_calls(&server).await - calls <= 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_instances_share_a_ban() {
        let server = RedisServer::start();
        let clock_a = FakeClock::at(Duration::from_secs(1_000));
        let clock_b = FakeClock::at(Duration::from_secs(1_000));
        let (a, limiter_a) = app(store(&server, &clock_a).await, StatusCode::FORBIDDEN);
        let (b, limiter_b) = app(store(&server, &clock_b).await, StatusCode::FORBIDDEN);
        let ip = "192.0.2.50";
        assert_eq!(status(&a, ip).await, StatusCode::OK);
        assert_eq!(status(&b, ip).await, StatusCode::OK);
        // Refusals on both instances count in Redis: 2 on A, 1 on B.
        assert_eq!(status(&a, ip).await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(status(&a, ip).await, StatusCode::TOO_MANY_REQUESTS);
        let mut conn = server.connection().await;
        let counted = || async {
            let mut c = server.connection().await;
            ::redis::cmd("GET")
                .arg("{tollgate:login:@192.0.2.50}:n")
                .query_async::<Option<u32>>(&mut c)
                .await
                .unwrap()
        };
        for _ in 0..500 {
            if counted().await == Some(2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let before = std::time::Instant::now();
        assert_eq!(status(&b, ip).await, StatusCode::TOO_MANY_REQUESTS);
        until(|| !limiter_b.bans("login").unwrap().is_empty()).await;
        // Ban time as configured: Redis's own TTL, and what B tells clients, less the
        // time since the refusal that began it (as little as the machine allows).
        let pttl: i64 = ::redis::cmd("PTTL")
            .arg("{tollgate:login:@192.0.2.50}:ban")
            .query_async(&mut conn)
            .await
            .unwrap();
        let left = limiter_b.bans("login").unwrap()[0].remaining;
        let since = before.elapsed();
        let least = Duration::from_secs(10) - since - Duration::from_millis(5);
        assert!(
            pttl <= 10_000 && pttl as u128 >= least.as_millis(),
            "{pttl} ms, {since:?} after"
        );
        assert!(
            left >= least && left <= Duration::from_secs(10),
            "{left:?}, {since:?} after"
        );
        // B refuses locally: no Redis call for 1,000 banned requests.
        let calls = evalsha_calls(&server).await;
        for _ in 0..1_000 {
            assert_eq!(status(&b, ip).await, StatusCode::FORBIDDEN);
        }
        // (Each store's probe may run its heartbeat script meanwhile: once a second.)
        let more = evalsha_calls(&server).await - calls;
        assert!(more <= 4, "{more} calls for 1,000 banned requests");
        // A learns the ban at its first request, refused as banned: the bucket is
        // blocked for the ban, and Redis says the key is banned.
        assert_eq!(status(&a, ip).await, StatusCode::FORBIDDEN);
        assert!(!limiter_a.bans("login").unwrap().is_empty());
        assert_eq!(status(&a, ip).await, StatusCode::FORBIDDEN);
        // Lifted on A: in Redis at once, and on B at its first request after the
        // re-check interval.
        limiter_a
            .lift_ban("login", PeerIp::new().key(ip.parse().unwrap()))
            .unwrap();
        let redis = &server;
        let exists = |key: &'static str| async move {
            let mut c = redis.connection().await;
            ::redis::cmd("EXISTS")
                .arg(key)
                .query_async::<u32>(&mut c)
                .await
                .unwrap()
        };
        // The lift deletes the ban, and then (a second call, in the background too) the
        // bucket, which B's requests find full once it has landed.
        for key in [
            "{tollgate:login:@192.0.2.50}:ban",
            "tollgate:login:@192.0.2.50",
        ] {
            for _ in 0..1_000 {
                if exists(key).await == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(exists(key).await, 0, "{key}");
        }
        until(|| limiter_a.bans("login").unwrap().is_empty()).await;
        assert_eq!(status(&b, ip).await, StatusCode::FORBIDDEN);
        clock_b.advance(tollgate::BAN_RECHECK);
        assert_eq!(status(&b, ip).await, StatusCode::FORBIDDEN);
        until(|| limiter_b.bans("login").unwrap().is_empty()).await;
        assert_eq!(status(&b, ip).await, StatusCode::OK);
    }
}
