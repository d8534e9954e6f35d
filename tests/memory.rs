//! The memory store's bounds: idle keys evicted without any call from the user, a hard
//! cap, bytes per key, and no allocation on the path of an existing key.
//!
//! A counting global allocator measures the heap, so the tests of this file take turns.

#![allow(unsafe_code)] // the counting allocator

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use tollgate::Quota;
use tollgate::clock::FakeClock;
use tollgate::key::Key;
use tollgate::store::{Checked, Item, MemoryStore, MemoryTable, Statuses, Store};

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// Allocations made by this thread (other test threads allocate too).
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count_allocation() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        count_allocation();
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        count_allocation();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn check(store: &MemoryStore<FakeClock>, items: &[Item<'_, MemoryTable>]) -> Statuses {
    match store.check(items) {
        Checked::Ready(s) => s,
        Checked::Pending(_) => unreachable!(),
    }
}

fn ip(i: u32) -> Key {
    Key::from_part(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
}

/// 10/s, burst 10: an empty bucket refills in 1 s; one request is forgotten after 100 ms.
const QUOTA: Quota = Quota::per_second(10);

#[test]
fn without_a_runtime_idle_keys_are_swept_by_requests_one_shard_at_a_time() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let clock = FakeClock::at(Duration::from_secs(10));
    let grace = Duration::from_secs(1);
    let store = MemoryStore::with_clock(clock.clone()).idle_grace(grace);
    let table = store.table("per-ip");
    for i in 0..100_000 {
        check(&store, &[Item::new(&table, ip(i), QUOTA, 1)]);
    }
    assert_eq!(store.len(), 100_000);
    // Steady traffic from one other client (looking, not consuming), every 10 ms.
    let mut elapsed = Duration::ZERO;
    let mut worst_step = 0;
    while !store.is_empty() {
        // Full again after one refill time, kept for the grace, swept within another.
        assert!(
            elapsed <= QUOTA.refill_time() + 2 * grace + Duration::from_millis(100),
            "{} keys left after {elapsed:?}",
            store.len()
        );
        clock.advance(Duration::from_millis(10));
        elapsed += Duration::from_millis(10);
        let before = store.len();
        check(
            &store,
            &[Item::new(&table, Key::from_part("monitor"), QUOTA, 0)],
        );
        worst_step = worst_step.max(before - store.len());
    }
    // No request paid for more than one shard (1/64 of the keys, with hashing slack).
    assert!(
        worst_step <= 100_000 / 64 * 3 / 2,
        "one request swept {worst_step} keys"
    );
}

#[test]
fn idle_keys_are_swept_in_the_background_without_any_request() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::at(Duration::from_secs(10));
    // A grace of 64 ms (fake time) paces the sweeper at one shard per millisecond (real).
    let store = MemoryStore::with_clock(clock.clone()).idle_grace(Duration::from_millis(64));
    let table = store.table("per-ip");
    runtime.block_on(async {
        for i in 0..200_000 {
            check(&store, &[Item::new(&table, ip(i), QUOTA, 1)]);
        }
    });
    assert!(store.len() > 190_000);
    // Two refill periods of silence: no request at all.
    clock.advance(2 * QUOTA.refill_time());
    let waited = std::time::Instant::now();
    while !store.is_empty() {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "{} keys left without requests",
            store.len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(runtime);
}

#[test]
fn a_busy_store_stays_as_large_as_its_active_keys() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let clock = FakeClock::at(Duration::from_secs(10));
    let store = MemoryStore::with_clock(clock.clone()).idle_grace(Duration::from_secs(1));
    let table = store.table("per-ip");
    // 2,000 new clients per second, each seen once, for 20 s: 40,000 keys in all, but only
    // those seen within the last refill time and grace (~2,200) are worth keeping, and
    // sweeping lags by at most one grace period.
    let mut max_len = 0;
    for i in 0..40_000 {
        if i % 20 == 0 {
            clock.advance(Duration::from_millis(10));
        }
        check(&store, &[Item::new(&table, ip(i), QUOTA, 1)]);
        max_len = max_len.max(store.len());
    }
    assert!(max_len < 6_000, "the table grew to {max_len} keys");
}

#[test]
fn returning_clients_keep_their_entries_when_their_bucket_refilled() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let clock = FakeClock::at(Duration::from_secs(10));
    let store = MemoryStore::with_clock(clock.clone());
    let table = store.table("per-ip");
    // A million a second: every bucket is full again long before its key comes back.
    let quota = Quota::per_second(1_000_000).burst(1_000_000);
    let keys: Vec<Key> = (0..100_000).map(ip).collect();
    let round = |store: &MemoryStore<FakeClock>| {
        for key in &keys {
            clock.advance(Duration::from_micros(1));
            let s = check(store, &[Item::new(&table, key.clone(), quota, 1)]);
            assert!(s[0].outcome().unwrap().is_allowed());
        }
    };
    round(&store);
    round(&store);
    assert_eq!(store.len(), 100_000, "returning keys stay resident");
    // And coming back inserts nothing: no allocation, no entry made twice.
    let before = allocations();
    round(&store);
    assert_eq!(allocations() - before, 0);
    assert_eq!(store.len(), 100_000);
}

#[test]
fn the_store_is_bounded_by_default() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(10)));
    assert_eq!(store.key_cap(), Some(tollgate::store::DEFAULT_MAX_KEYS));
    assert_eq!(MemoryStore::new().key_cap(), Some(500_000));
    assert_eq!(MemoryStore::new().unbounded().key_cap(), None);
    // A client inventing API keys as fast as it can, against a long window: the store
    // stops at its cap, and so does its memory.
    let table = store.table("per-key");
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    for i in 0..600_000u32 {
        let key = Key::from_part(format!("invented-key-{i}"));
        check(&store, &[Item::new(&table, key, Quota::per_hour(100), 1)]);
    }
    assert_eq!(store.len(), 500_000);
    let bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;
    assert!(bytes < 40 << 20, "{} MB for 500,000 keys", bytes >> 20);
}

#[test]
fn a_key_leaving_the_overflow_bucket_gets_no_extra_burst() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let clock = FakeClock::at(Duration::from_secs(10));
    let store = MemoryStore::with_clock(clock.clone())
        .max_keys(1)
        .idle_grace(Duration::ZERO);
    let table = store.table("t");
    let quota = Quota::per_second(1).burst(3); // T = 1 s, burst 3
    let take = |k: &str| {
        let s = check(&store, &[Item::new(&table, Key::from_part(k), quota, 1)]);
        s[0].outcome().unwrap().is_allowed()
    };
    // `a` holds the only entry; `b` arrives at the cap and spends the overflow bucket.
    assert!(take("a"));
    let b_first: usize = (0..5).map(|_| take("b") as usize).sum();
    assert_eq!(b_first, 3);
    // 1.5 s later `a` is idle and swept: `b` gets an entry of its own.
    clock.advance(Duration::from_millis(1_500));
    store.sweep();
    assert_eq!(store.len(), 0);
    let b_second: usize = (0..5).map(|_| take("b") as usize).sum();
    assert_eq!(store.len(), 1);
    // Over those 1.5 s, at most burst + d / T = 3 + 1.
    assert!(
        b_first + b_second <= 4,
        "b was granted {} in 1.5 s",
        b_first + b_second
    );
}

#[test]
fn the_cap_sends_new_keys_to_an_overflow_bucket_and_never_over_grants() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let clock = FakeClock::at(Duration::from_secs(10));
    let store = MemoryStore::with_clock(clock.clone()).max_keys(1_000);
    let table = store.table("per-ip");
    let mut admitted_beyond_cap = 0;
    for i in 0..2_000 {
        let s = check(&store, &[Item::new(&table, ip(i), QUOTA, 1)]);
        let allowed = s[0].outcome().unwrap().is_allowed();
        if i < 1_000 {
            assert!(allowed, "key {i} is tracked on its own");
        } else if allowed {
            admitted_beyond_cap += 1;
        }
    }
    assert_eq!(store.len(), 1_000);
    assert_eq!(
        admitted_beyond_cap, 10,
        "the 1,000 untracked keys shared one bucket of 10"
    );
    // Tracked keys keep their own buckets.
    let s = check(&store, &[Item::new(&table, ip(5), QUOTA, 1)]);
    assert_eq!(s[0].outcome().unwrap().remaining(), 8);
    // Once the tracked keys are idle, new keys are tracked again.
    clock.advance(Duration::from_secs(2));
    let s = check(&store, &[Item::new(&table, ip(50_000), QUOTA, 1)]);
    assert!(s[0].outcome().unwrap().is_allowed());
    assert!(store.len() < 1_000);
}

#[test]
fn bytes_per_tracked_ipv4_key() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let clock = FakeClock::at(Duration::from_secs(10));
    let store = MemoryStore::with_clock(clock.clone()).unbounded();
    let table = store.table("per-ip");
    let mut report = Vec::new();
    let mut worst = 0.0f64;
    let mut inserted = 0;
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    for n in [10_000u32, 100_000, 300_000, 1_000_000] {
        for i in inserted..n {
            check(&store, &[Item::new(&table, ip(i), Quota::per_hour(10), 1)]);
        }
        inserted = n;
        let bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;
        let per_key = bytes as f64 / f64::from(n);
        worst = worst.max(per_key);
        report.push(format!("{n} keys: {per_key:.1} B/key"));
    }
    println!(
        "memory store, bytes per tracked IPv4 key: {}",
        report.join(", ")
    );
    assert!(worst <= 64.0, "{}", report.join(", "));
}

#[test]
fn checking_an_existing_key_allocates_nothing() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let clock = FakeClock::at(Duration::from_secs(10));
    let store = MemoryStore::with_clock(clock.clone());
    let per_ip = store.table("per-ip");
    let per_key = store.table("per-key");
    let global = store.table("global");
    let quota = Quota::per_second(1_000);
    let ip_key = ip(7);
    let text_key = Key::from_part("an-api-key-of-some-length-0123456789");
    // Insert the keys first.
    check(&store, &[Item::new(&per_ip, ip_key.clone(), quota, 1)]);
    check(
        &store,
        &[
            Item::new(&per_key, text_key.clone(), quota, 1),
            Item::new(&global, Key::global(), quota, 1),
        ],
    );
    let before = allocations();
    for _ in 0..1_000 {
        clock.advance(Duration::from_micros(100));
        let one = [Item::new(&per_ip, ip_key.clone(), quota, 1)];
        assert!(check(&store, &one)[0].outcome().unwrap().is_allowed());
        let two = [
            Item::new(&per_key, text_key.clone(), quota, 1),
            Item::new(&global, Key::global(), quota, 1),
        ];
        assert!(check(&store, &two)[1].outcome().unwrap().is_allowed());
    }
    assert_eq!(allocations() - before, 0);
}

/// What a request through the layer allocates beyond the router's own, on a router run as
/// `axum::serve` runs it (its state given: each route built once, not per request), counted
/// as the median of 64 requests after 16 to warm up. An allowed request: the `Decision`
/// extension, a box, and nothing else (the `Limiter` extension, another box, only with
/// `.limiter_extension(true)`; handlers get the `Limiter` from the router's state): its
/// `RateLimit` value is written into the thread's buffer of values (one allocation per
/// some forty values), and axum boxes the service's `ResponseBody` as it boxes any
/// layer's body of its own type. A refusal:
/// no more than the bare router's handler makes for its own response (and axum's box of the
/// body); its problem body and
/// `RateLimit` value come from the thread's memo, nothing is allocated per number
/// (`Retry-After` comes from a table) and no key is rendered for a refusal log nobody
/// reads. Before this was pinned: 5 more than a no-op layer for an allowed request, 8 more
/// than the bare router for a refusal; before the memo, 4 more for a refusal; before the
/// buffer of values, one more for an allowed request; before the `Limiter` extension was
/// opt-in, one more for an allowed request with the default options (15, now 14).
mod http_path {
    use super::*;
    use std::net::SocketAddr;

    use axum::Router;
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::routing::get;
    use http::{Request, StatusCode};
    use tollgate::key::PeerIp;
    use tollgate::{Limit, RateLimitBuilder, RateLimitLayer};
    use tower::ServiceExt;

    type Builder = RateLimitBuilder<MemoryStore<FakeClock>>;

    fn request() -> Request<Body> {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([203, 0, 113, 7], 41_000))));
        request
    }

    fn per_request(rt: &tokio::runtime::Runtime, app: &Router, expected: StatusCode) -> usize {
        // As `axum::serve` runs a router: its state given, each route built once.
        let app = app.clone().with_state(());
        let mut counts: Vec<usize> = (0..80)
            .map(|_| {
                let req = request();
                let before = allocations();
                let response = rt.block_on(app.clone().oneshot(req)).unwrap();
                assert_eq!(response.status(), expected);
                drop(response);
                allocations() - before
            })
            .skip(16)
            .collect();
        counts.sort_unstable();
        counts[counts.len() / 2]
    }

    #[test]
    fn a_request_through_the_layer_allocates_only_what_it_hands_on() {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let bare = Router::new().route("/", get(|| async { "hello" }));
        let noop = bare
            .clone()
            .route_layer(tower::layer::util::Identity::new());
        let clock = FakeClock::at(Duration::from_secs(10));
        let limited = |quota, options: fn(Builder) -> Builder| {
            let builder = RateLimitLayer::builder(MemoryStore::with_clock(clock.clone()))
                .limit(Limit::new("per-ip", quota).key(PeerIp::new()));
            bare.clone().route_layer(options(builder).build().unwrap())
        };
        let plenty = Quota::per_second(1_000_000).burst(1_000_000);
        let allowed = limited(plenty, |b| b);
        let allowed_limiter = limited(plenty, |b| b.limiter_extension(true));
        let allowed_bare = limited(plenty, |b| {
            b.decision_extension(false).limiter_extension(false)
        });
        let denied = limited(Quota::per_hour(1), |b| b);
        let _ = rt.block_on(denied.clone().oneshot(request()));
        let n_bare = per_request(&rt, &bare, StatusCode::OK);
        let n_noop = per_request(&rt, &noop, StatusCode::OK);
        let n_allowed = per_request(&rt, &allowed, StatusCode::OK);
        let n_allowed_limiter = per_request(&rt, &allowed_limiter, StatusCode::OK);
        let n_allowed_bare = per_request(&rt, &allowed_bare, StatusCode::OK);
        let n_denied = per_request(&rt, &denied, StatusCode::TOO_MANY_REQUESTS);
        println!(
            "allocations per request: bare router {n_bare}, no-op route_layer {n_noop}, \
             allowed {n_allowed} (with the Limiter extension {n_allowed_limiter}, without \
             either extension {n_allowed_bare}), denied {n_denied}"
        );
        // Nothing of its own: the `RateLimit` value is written into the thread's buffer,
        // and the response keeps axum's body type (`service::Follow`: a body of the
        // layer's own type would be boxed by axum, once per response).
        assert!(n_allowed_bare <= n_noop, "{n_allowed_bare} vs {n_noop}");
        // By default, the `Decision`'s box and nothing else: the `Limiter` comes from the
        // router's state.
        assert_eq!(n_allowed, n_allowed_bare + 1, "the Decision extension");
        // `.limiter_extension(true)`: one box more.
        assert_eq!(n_allowed_limiter, n_allowed + 1, "the Limiter extension");
        // The 429's header map and body, no more than the bare router's handler makes for
        // its own response.
        assert!(n_denied <= n_bare, "{n_denied} vs {n_bare}");
    }
}
