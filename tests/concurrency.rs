//! Real concurrency and real time: no over-grant under contention.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::{get as req, send};
use tollgate::key::PeerIp;
use tollgate::store::{Item, MemoryStore, Store};
use tollgate::{Quota, RateLimitLayer};

/// 64 tasks hammer one key for 3 s through the middleware: burst 10 at 10/s admits at most
/// 10 + 3 × 10 = 40 (the seed article's bound), and contention must not cost more than a
/// couple of tokens at the edges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_one_key_three_seconds() {
    let layer = RateLimitLayer::new(
        Quota::per_second(10).burst(10),
        PeerIp::new(),
        MemoryStore::new(),
    );
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    let allowed = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_millis(2_990);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (app, allowed, total) = (app.clone(), allowed.clone(), total.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let r = send(&app, req("/", "203.0.113.1")).await;
                    total.fetch_add(1, Ordering::Relaxed);
                    if r.status() == StatusCode::OK {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let allowed = allowed.load(Ordering::Relaxed);
    let total = total.load(Ordering::Relaxed);
    assert!(
        total > 1_000,
        "the tasks really contended: {total} requests"
    );
    assert!(
        (38..=40).contains(&allowed),
        "admitted {allowed} of {total}"
    );
}

/// Two limits, contended from threads with OS-level preemption: all or nothing must hold
/// exactly. Every request takes one token from both a global bucket (40 tokens) and one of
/// four per-client buckets (15 each). No refill (per-day quotas), so the admitted count is
/// exactly the smaller total: no more (over-grant) and no less (a refused request that
/// kept a token it took).
#[test]
fn all_or_nothing_under_thread_contention() {
    let store = MemoryStore::new();
    let global = store.table("global");
    let per_client = store.table("per-client");
    let admitted = AtomicUsize::new(0);
    let per_client_admitted: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
    let global_quota = Quota::per_day(40);
    let client_quota = Quota::per_day(15);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (store, global, per_client, admitted, per_client_admitted) = (
                &store,
                &global,
                &per_client,
                &admitted,
                &per_client_admitted,
            );
            s.spawn(move || {
                for i in 0..2_000usize {
                    let client = (t + i) % 4;
                    let items = [
                        Item::new(
                            per_client,
                            tollgate::key::Key::from_part(client as u64),
                            client_quota,
                            1,
                        ),
                        Item::new(global, tollgate::key::Key::global(), global_quota, 1),
                    ];
                    let tollgate::store::Checked::Ready(statuses) = store.check(&items) else {
                        unreachable!()
                    };
                    if statuses.iter().all(|s| s.outcome().unwrap().is_allowed()) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                        per_client_admitted[client].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(
        admitted.load(Ordering::Relaxed),
        40,
        "exactly the global bucket"
    );
    for c in &per_client_admitted {
        assert!(c.load(Ordering::Relaxed) <= 15);
    }
    // And nothing was lost: the global bucket is empty, the clients' buckets hold the rest.
    let peek = |table, key, quota| {
        let item = Item::new(table, key, quota, 0);
        match store.check(std::slice::from_ref(&item)) {
            tollgate::store::Checked::Ready(s) => s[0].outcome().unwrap().remaining(),
            _ => unreachable!(),
        }
    };
    assert_eq!(peek(&global, tollgate::key::Key::global(), global_quota), 0);
    let left: u64 = (0..4u64)
        .map(|c| peek(&per_client, tollgate::key::Key::from_part(c), client_quota))
        .sum();
    assert_eq!(
        left,
        60 - 40,
        "the refused requests gave back every token they took"
    );
}
