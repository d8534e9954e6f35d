//! Real concurrency: no over-grant under contention.

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

/// 64 tasks hammer one key through the middleware while the store's clock moves through
/// 3 s in steps of 50 ms: burst 10 at 10/s admits at most 10 + 3 × 10 = 40, and contention
/// must not cost more than a couple of tokens at the edges. The clock moves on only once
/// every task has sent requests at the current instant, so the contention does not depend
/// on how fast a loaded machine runs the tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_one_key_three_seconds() {
    use std::sync::atomic::AtomicBool;
    use tollgate::clock::FakeClock;
    const TASKS: usize = 64;
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let layer = RateLimitLayer::new(
        Quota::per_second(10).burst(10),
        PeerIp::new(),
        MemoryStore::with_clock(clock.clone()),
    );
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    let allowed = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Each task's count of requests, for the steps to wait on.
    let sent: Arc<Vec<AtomicUsize>> = Arc::new((0..TASKS).map(|_| AtomicUsize::new(0)).collect());
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (app, allowed, total) = (app.clone(), allowed.clone(), total.clone());
            let (stop, sent) = (stop.clone(), sent.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = send(&app, req("/", "203.0.113.1")).await;
                    total.fetch_add(1, Ordering::Relaxed);
                    sent[i].fetch_add(1, Ordering::Relaxed);
                    if r.status() == StatusCode::OK {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                    // A memory store answers at once: without a yield, the first tasks
                    // would keep the worker threads to themselves.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    // Every task sends at least one request at each instant, the last one included.
    let every_task_sent_again = || async {
        let before: Vec<usize> = sent.iter().map(|n| n.load(Ordering::Relaxed)).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while sent
            .iter()
            .zip(&before)
            .any(|(n, b)| n.load(Ordering::Relaxed) < b + 2)
        {
            assert!(Instant::now() < deadline, "the tasks stopped sending");
            tokio::task::yield_now().await;
        }
    };
    every_task_sent_again().await;
    for _ in 0..60 {
        clock.advance(Duration::from_millis(50));
        every_task_sent_again().await;
    }
    stop.store(true, Ordering::Relaxed);
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
