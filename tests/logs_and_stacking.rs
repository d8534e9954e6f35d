//! What the middleware logs under a flood, and what a handler sees behind stacked layers.

mod support;

use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use http::StatusCode;
use support::{Lines, get as req, send};
use tollgate::clock::FakeClock;
use tollgate::key::PeerIp;
use tollgate::store::MemoryStore;
use tollgate::{Decision, Limit, Quota, RateLimitLayer};

fn store() -> MemoryStore<FakeClock> {
    MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)))
}

#[tokio::test]
async fn a_shadow_flood_logs_one_line_per_interval_not_one_per_request() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let layer = RateLimitLayer::builder(store())
        .limit(
            Limit::new("trial", Quota::per_minute(1))
                .key(PeerIp::new())
                .shadow(),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer);
    for _ in 0..20_000 {
        let r = send(&app, req("/", "192.0.2.7")).await;
        assert_eq!(r.status(), StatusCode::OK, "shadow limits never refuse");
    }
    let logged = lines.matching("shadow limit would refuse");
    assert_eq!(
        logged.len(),
        1,
        "{} lines: {:?}",
        logged.len(),
        &logged[..2.min(logged.len())]
    );
    assert!(logged[0].contains("limit=\"trial\"") || logged[0].contains("limit=trial"));
}

#[tokio::test]
async fn a_misconfigured_limit_logs_once_whatever_the_traffic_and_each_500_says_it() {
    let lines = Lines::default();
    let _guard = lines.capture();
    // PeerIp without connection info: every request is a 500 that names the fix.
    let layer = RateLimitLayer::new(Quota::per_second(10), PeerIp::new(), store());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer);
    let mut details = std::collections::HashSet::new();
    for i in 0..5_000 {
        let r = send(
            &app,
            http::Request::get("/")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        if i % 1_000 == 0 {
            let body = support::body_json(r).await;
            details.insert(body["detail"].as_str().unwrap().to_owned());
        }
    }
    let logged = lines.matching("tollgate cannot apply limit");
    assert_eq!(logged.len(), 1, "{logged:?}");
    // The log line and the body say the same: what is missing and the fix.
    assert_eq!(details.len(), 1, "{details:?}");
    let detail = details.into_iter().next().unwrap();
    assert!(
        detail.contains("into_make_service_with_connect_info"),
        "{detail}"
    );
    assert!(logged[0].contains(&detail), "{} / {detail}", logged[0]);
}

#[tokio::test]
async fn stacked_layers_give_the_handler_every_limit_in_one_decision() {
    let outer = RateLimitLayer::builder(store())
        .limit(Limit::new("global", Quota::per_second(100)))
        .build()
        .unwrap();
    let inner = RateLimitLayer::builder(store())
        .limit(Limit::new("per-ip", Quota::per_second(5)).key(PeerIp::new()))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<Decision>| async move {
                d.limits()
                    .map(|l| format!("{}={}", l.name(), l.remaining().unwrap()))
                    .collect::<Vec<_>>()
                    .join(",")
            }),
        )
        .route_layer(inner)
        .layer(outer);
    let r = send(&app, req("/", "192.0.2.8")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(support::body_text(r).await, "global=99,per-ip=4");
}

/// The log statement of
/// [`a_capture_gets_lines_of_a_statement_another_thread_reached_first_without_a_subscriber`]:
/// reached only by that test.
fn probe_statement() {
    tracing::warn!("probe statement reached");
}

/// Pins the flake that made CI miss the "is gone" lines of
/// `rules_sql::a_deleted_database_file_is_reported_not_read_silently_and_a_new_one_is_picked_up`:
/// `tracing` decides once per process whether a statement is wanted, asking the thread that
/// reaches it first. A thread without a subscriber, reaching it while this thread's capture
/// was the only subscriber alive, answered "never" for every thread. (Without the fix in
/// `Lines::capture`, this fails whenever no other test's capture is alive at that moment.)
#[test]
fn a_capture_gets_lines_of_a_statement_another_thread_reached_first_without_a_subscriber() {
    let lines = Lines::default();
    let _guard = lines.capture();
    std::thread::spawn(probe_statement).join().unwrap();
    probe_statement();
    assert_eq!(lines.matching("probe statement reached").len(), 1);
}
