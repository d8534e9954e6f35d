//! The simulation kit (`tollgate::testing`, feature `testing`) used as a user would: a login
//! limit of 5 a minute across three instances that share one store, through a 2-second
//! outage of the store, with each failure policy; the same through the HTTP layer; and the
//! kit's faults one by one. The guide's chapter `testing` walks through the first test.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use tollgate::key::Header;
use tollgate::testing::SimBackend;
use tollgate::{FailurePolicy, Limit, LimitSpec, Limiter, Quota, RateLimitLayer};
use tower::ServiceExt;

const LOGIN: Quota = Quota::per_minute(5).burst(5);

/// Three instances behind a round-robin load balancer, the login limit on each.
fn fleet(backend: &SimBackend, policy: FailurePolicy) -> Vec<Limiter> {
    let login = LimitSpec::new("login", LOGIN).on_store_failure(policy);
    backend
        .stores()
        .into_iter()
        .map(|store| {
            Limiter::builder(store)
                .limit(login.clone())
                .build()
                .unwrap()
        })
        .collect()
}

/// What each user was granted, before, during and after the outage.
#[derive(Debug, Default, PartialEq, Eq)]
struct Granted {
    before: u32,
    during: u32,
    after: u32,
}

impl Granted {
    fn total(&self) -> u32 {
        self.before + self.during + self.after
    }
}

/// Ten seconds of two users trying to log in every 100 ms, round robin over the
/// instances; the store is down from 2 s to 4 s. `alice` starts at once, `bob` only when
/// the store is down. What each was granted.
async fn ten_seconds_with_an_outage(policy: FailurePolicy) -> (Granted, Granted) {
    let backend = SimBackend::builder().instances(3).build();
    let instances = fleet(&backend, policy);
    let (mut alice, mut bob) = (Granted::default(), Granted::default());
    let start = tokio::time::Instant::now();
    for i in 0..100u32 {
        tokio::time::sleep_until(start + Duration::from_millis(100) * i).await;
        match i {
            20 => backend.outage(true),
            40 => backend.outage(false),
            _ => {}
        }
        let instance = &instances[i as usize % 3];
        for (user, granted) in [("alice", &mut alice), ("bob", &mut bob)] {
            if user == "bob" && i < 20 {
                continue;
            }
            if instance.check("login", user, 1).await.unwrap().allowed() {
                match i {
                    0..20 => granted.before += 1,
                    20..40 => granted.during += 1,
                    _ => granted.after += 1,
                }
            }
        }
    }
    (alice, bob)
}

#[tokio::test(start_paused = true)]
async fn a_login_limit_shares_its_quota_across_instances_through_an_outage() {
    let (alice, bob) = ten_seconds_with_an_outage(FailurePolicy::Share).await;
    // Alice spent her burst before the outage: the instances saw her spent, so their
    // shares start spent, and nothing refills in 10 s (one login every 12 s).
    assert_eq!(alice.total(), 5, "{alice:?}");
    // Bob's first try comes while the store is down: each instance grants him its share
    // (5/3 of a token, never under one: one each), not a whole quota.
    assert_eq!(bob.during, 3, "{bob:?}");
    // Over the run, the instances charge the store with what their shares spent, so bob
    // stays within the limit plus at most one burst for the outage (guide/redis.md).
    assert!(bob.total() <= 2 * 5, "{bob:?}");
    // The figures guide/testing.md quotes: the first instance back spends what the store
    // shows before the two others (their breakers open until 5 s) charge their shares.
    assert_eq!(
        bob,
        Granted {
            before: 0,
            during: 3,
            after: 4
        }
    );
}

#[tokio::test(start_paused = true)]
async fn each_failure_policy_during_the_outage() {
    let mut during = Vec::new();
    for policy in [
        FailurePolicy::Share,
        FailurePolicy::Fallback,
        FailurePolicy::Allow,
        FailurePolicy::Deny,
    ] {
        let (alice, bob) = ten_seconds_with_an_outage(policy).await;
        assert_eq!(alice.before, 5, "{policy:?}: {alice:?}");
        during.push((alice.during, bob.during));
    }
    // Share: one quota across the instances (a share each). Fallback: a whole quota on
    // each instance. Allow: every try (20). Deny: none. A user refused before the outage
    // stays refused whatever the policy: each instance remembers a refusal until the
    // bucket would have refilled (the deny cache), without asking the store.
    assert_eq!(during, [(0, 3), (0, 15), (0, 20), (0, 0)]);
}

/// The same fleet behind the HTTP layer: a black hole (the store hangs) instead of
/// refused connections, ended by the stores' timeouts.
#[tokio::test(start_paused = true)]
async fn the_http_layer_through_a_silent_store() {
    let backend = SimBackend::builder().instances(3).build();
    let apps: Vec<Router> = backend
        .stores()
        .into_iter()
        .map(|store| {
            let limits = RateLimitLayer::builder(store)
                .limit(Limit::new("login", LOGIN).key(Header::new("x-user")))
                .build()
                .unwrap();
            Router::new()
                .route("/login", post(|| async { "welcome" }))
                .route_layer(limits)
        })
        .collect();
    let start = tokio::time::Instant::now();
    let mut statuses = Vec::new();
    for i in 0..40u32 {
        tokio::time::sleep_until(start + Duration::from_millis(100) * i).await;
        match i {
            10 => backend.black_hole(true),
            30 => backend.black_hole(false),
            _ => {}
        }
        let request = Request::post("/login")
            .header("x-user", if i < 10 { "alice" } else { "bob" })
            .body(Body::empty())
            .unwrap();
        let response = apps[i as usize % 3].clone().oneshot(request).await.unwrap();
        statuses.push(response.status());
    }
    let ok = |from: usize, to: usize| {
        statuses[from..to]
            .iter()
            .filter(|&&s| s == StatusCode::OK)
            .count()
    };
    assert_eq!(ok(0, 10), 5, "alice's burst: {statuses:?}");
    assert!(
        statuses[5..10]
            .iter()
            .all(|&s| s == StatusCode::TOO_MANY_REQUESTS)
    );
    // Bob while the store is silent: a share on each instance.
    assert_eq!(ok(10, 30), 3, "{statuses:?}");
    assert!(ok(10, 40) <= 2 * 5, "{statuses:?}");
}

/// Calls slower than the timeout are late answers, applied all the same: the breaker
/// stays closed and the shared bucket counts every grant.
#[tokio::test(start_paused = true)]
async fn late_answers_are_applied_and_never_open_the_breaker() {
    let backend = SimBackend::builder()
        .latency(Duration::from_millis(40)) // 80 ms round trips, against a 50 ms timeout
        .build();
    let store = backend.store();
    let limiter = Limiter::builder(store.clone())
        .limit(LimitSpec::new("login", LOGIN))
        .build()
        .unwrap();
    let mut granted = 0;
    for _ in 0..20 {
        if limiter.check("login", "alice", 1).await.unwrap().allowed() {
            granted += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!store.is_unavailable(), "the breaker opened");
    assert!(granted <= 5, "{granted} granted");
    assert_eq!(backend.remaining("login", "alice", LOGIN), 0);
    // Five grants and a refusal; the refusal is remembered until alice's bucket refills,
    // so her other tries never call the store.
    assert_eq!(backend.calls(), 6);
}

/// A wipe (the store restarts empty) and a restart from an older snapshot: the instance
/// notices and writes back what it saw spent, so the user does not get a fresh burst.
#[tokio::test(start_paused = true)]
async fn a_lost_state_is_written_back() {
    for restart in ["wipe", "snapshot"] {
        let backend = SimBackend::new();
        let limiter = Limiter::builder(backend.store())
            .limit(LimitSpec::new("login", LOGIN))
            .build()
            .unwrap();
        backend.snapshot(); // the snapshot a restore brings back: before any login
        for _ in 0..6 {
            limiter.check("login", "alice", 1).await.unwrap();
        }
        assert_eq!(backend.remaining("login", "alice", LOGIN), 0);
        match restart {
            "wipe" => backend.wipe(),
            _ => backend.restore(),
        }
        assert_eq!(backend.remaining("login", "alice", LOGIN), 5, "{restart}");
        // Alice is refused at once, remembered by the instance without a call.
        let again = limiter.check("login", "alice", 1).await.unwrap();
        assert!(!again.allowed(), "{restart}");
        // The loss is noticed within half a second, on the next call (any key's): the
        // instance writes alice back as it saw her, spent.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(limiter.check("login", "bob", 1).await.unwrap().allowed());
        assert_eq!(backend.remaining("login", "alice", LOGIN), 0, "{restart}");
    }
}
