//! Delay mode over real TCP: requests over a limit wait for their
//! reserved tokens, in order, up to `max_wait` and `max_waiters`; a client that goes away
//! while it waits gives its tokens back; a waiting request holds no readied inner service.
//! Exact timings are asserted on tokio's paused clock; over real TCP, tests wait on
//! conditions (a bucket's debt) and order (answered while another still waits), never
//! on how many milliseconds a loaded machine takes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::key::Header;
use tollgate::store::MemoryStore;
use tollgate::{Limit, Limiter, Quota, RateLimitLayer};

/// Serves `app` on a free loopback port with peer addresses.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Sends `GET /` (with `x-key: key`) on a new connection and reads the status.
async fn status(addr: SocketAddr, key: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET / HTTP/1.1\r\nhost: t\r\nx-key: {key}\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    text.split(' ').nth(1).unwrap().parse().unwrap()
}

/// The time until `limit`'s bucket for `key` has a token again.
async fn debt(limiter: &Limiter, limit: &str, key: &str) -> Duration {
    let look = limiter.peek(limit, key).await.unwrap();
    look.outcome().unwrap().next_after().unwrap_or_default()
}

/// Waits until `limit`'s debt for `key` satisfies `done` (or panics after 30 s): a
/// condition to wait on, where a fixed sleep would guess how fast a loaded machine runs.
async fn until_debt(limiter: &Limiter, limit: &str, key: &str, done: impl Fn(Duration) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = debt(limiter, limit, key).await;
        if done(now) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{limit}/{key}: still {now:?} after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A layer of one limit on a memory store.
fn one_limit(limit: Limit) -> RateLimitLayer<MemoryStore> {
    RateLimitLayer::builder(MemoryStore::new())
        .limit(limit)
        .build()
        .unwrap()
}

fn app(layer: RateLimitLayer<MemoryStore>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

#[tokio::test(start_paused = true)]
async fn forty_requests_pass_five_at_once_then_one_per_t_and_the_rest_get_429_at_once() {
    use tollgate::clock::FakeClock;
    use tower::ServiceExt;
    // Waits run on tokio's clock, paused here (it jumps to the next due waiter when all
    // else is idle), and the store's clock stands still: every instant below is exact,
    // however loaded the machine.
    let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)));
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("smooth", Quota::per_second(10).burst(5))
                .key(Header::new("x-key"))
                .delay(Duration::from_secs(2), 100),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let t0 = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let req = http::Request::builder()
                    .uri("/")
                    .header("x-key", "a")
                    .body(axum::body::Body::empty())
                    .unwrap();
                let s = app.oneshot(req).await.unwrap().status().as_u16();
                (s, t0.elapsed())
            })
        })
        .collect();
    let mut passed = Vec::new();
    let mut refused = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (200, at) => passed.push(at),
            (429, at) => refused.push(at),
            (s, _) => panic!("status {s}"),
        }
    }
    passed.sort();
    // 5 at once, then one every 100 ms up to 2 s: 20 more; the rest is refused.
    assert!((25..=26).contains(&passed.len()), "{} passed", passed.len());
    let ms = Duration::from_millis;
    for at in &passed[..5] {
        assert_eq!(*at, Duration::ZERO, "the burst passes at once");
    }
    for (i, at) in passed[5..].iter().enumerate() {
        let due = ms(100) * (i as u32 + 1);
        assert_eq!(*at, due, "waiter {i} answered when due");
    }
    assert!(passed.last().unwrap() <= &ms(2_000));
    for at in &refused {
        assert_eq!(*at, Duration::ZERO, "over max_wait: refused at once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_waiters_bounds_the_queue() {
    // One token every 2 s: long enough for the waiters to take their places, and the
    // third request its answer, before the first waiter goes, on a loaded machine.
    const T: Duration = Duration::from_secs(2);
    let layer = one_limit(
        Limit::new("paced", Quota::new(1, T).unwrap())
            .key(Header::new("x-key"))
            .delay(Duration::from_secs(10), 2),
    );
    let limiter = layer.limiter();
    let addr = serve(app(layer)).await;
    let t0 = Instant::now();
    let first = status(addr, "a").await; // passes at once
    assert_eq!(first, 200);
    let waiting: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { (status(addr, "a").await, t0.elapsed()) }))
        .collect();
    // Both have reserved their tokens (three tokens' debt).
    until_debt(&limiter, "paced", "a", |d| d > 2 * T).await;
    // Two wait (T and 2T): a third is refused at once, though it would wait only 3T,
    // within the 10 s it may: answered while the first waiter still waits, where
    // waiting would put it after both.
    assert_eq!(status(addr, "a").await, 429);
    assert!(!waiting[0].is_finished(), "the third request waited");
    for w in waiting {
        let (s, after) = w.await.unwrap();
        assert_eq!(s, 200);
        assert!(after >= T - Duration::from_millis(50), "{after:?}");
    }
    // The places are free again: the next request waits instead of being refused.
    assert_eq!(status(addr, "a").await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_disconnects_while_waiting_gives_its_tokens_back() {
    // One token every 2 s: a second request waits about 2 s.
    let layer = one_limit(
        Limit::new("slow", Quota::new(1, Duration::from_secs(2)).unwrap())
            .key(Header::new("x-key"))
            .delay(Duration::from_secs(10), 10),
    );
    let limiter: Limiter = layer.limiter();
    let addr = serve(app(layer)).await;
    assert_eq!(status(addr, "k").await, 200);
    // The second request waits, holding its token (two tokens' debt); then its client
    // goes away.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: t\r\nx-key: k\r\n\r\n")
        .await
        .unwrap();
    until_debt(&limiter, "slow", "k", |d| d > Duration::from_secs(2)).await;
    drop(s);
    // Its reservation goes back: one token's debt is left, not two.
    until_debt(&limiter, "slow", "k", |d| d < Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_request_holds_no_readied_inner_service() {
    // The inner service admits one request at a time; a request waiting for its tokens
    // must not hold that place.
    let layer = one_limit(
        Limit::new("per-key", Quota::new(1, Duration::from_secs(2)).unwrap())
            .key(Header::new("x-key"))
            .delay(Duration::from_secs(5), 10),
    );
    let limiter = layer.limiter();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(tower::limit::ConcurrencyLimitLayer::new(1))
        .layer(layer);
    let addr = serve(app).await;
    assert_eq!(status(addr, "a").await, 200);
    let t0 = Instant::now();
    let waiter = tokio::spawn(async move { (status(addr, "a").await, t0.elapsed()) });
    // "a" waits, holding its token (two tokens' debt).
    until_debt(&limiter, "per-key", "a", |d| d > Duration::from_secs(2)).await;
    // Another key passes at once while "a" waits: blocked behind the waiting request,
    // it would be answered after it.
    assert_eq!(status(addr, "b").await, 200);
    assert!(!waiter.is_finished(), "blocked behind a waiting request");
    let (s, after) = waiter.await.unwrap();
    assert_eq!(s, 200);
    assert!(after >= Duration::from_millis(1_800), "{after:?}");
}

#[test]
fn delay_mode_is_checked_at_build() {
    let q = Quota::per_second(1);
    let b = |l: Limit| {
        RateLimitLayer::builder(MemoryStore::new())
            .limit(l)
            .build()
            .unwrap_err()
    };
    let e = b(Limit::new("a", q).delay(Duration::ZERO, 1));
    assert_eq!(e.field(), r#"limits["a"].on_limit.max_wait"#);
    let e = b(Limit::new("a", q).delay(Duration::from_secs(1), 0));
    assert_eq!(e.field(), r#"limits["a"].on_limit.max_waiters"#);
    let e = b(Limit::new("a", q)
        .algorithm(tollgate::Algorithm::SlidingWindow)
        .delay(Duration::from_secs(1), 1));
    assert_eq!(e.field(), r#"limits["a"].on_limit"#);
    let e = b(Limit::new("a", q).shadow().delay(Duration::from_secs(1), 1));
    assert_eq!(e.field(), r#"limits["a"].on_limit"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disconnected_waiter_of_a_limit_charged_by_outcome_is_given_back_once() {
    // Only 200s count; a bucket of 2, one token back every 2 s.
    let layer = one_limit(
        Limit::new(
            "ok-only",
            Quota::new(1, Duration::from_secs(2)).unwrap().burst(2),
        )
        .key(Header::new("x-key"))
        .charge(tollgate::Charge::when(|status, _| status == 200))
        .delay(Duration::from_secs(10), 10),
    );
    let limiter = layer.limiter();
    let addr = serve(app(layer)).await;
    assert_eq!(status(addr, "k").await, 200);
    assert_eq!(status(addr, "k").await, 200);
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: t\r\nx-key: k\r\n\r\n")
        .await
        .unwrap();
    // It waits, holding its token (two tokens' debt), before its client goes away.
    until_debt(&limiter, "ok-only", "k", |d| d > Duration::from_secs(2)).await;
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let look = limiter.peek("ok-only", "k").await.unwrap();
        let o = look.outcome().unwrap();
        let next = o.next_after().unwrap();
        if next < Duration::from_secs(2) {
            // Given back once: the bucket is empty again, not holding one more token.
            assert_eq!(o.remaining(), 0, "given back twice");
            break;
        }
        assert!(Instant::now() < deadline, "never given back ({next:?})");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_another_limit_refuses_takes_no_place_and_gives_back_nothing() {
    use tollgate::clock::FakeClock;
    use tower::ServiceExt;
    // `paced` delays (one token per 100 ms, two may wait); `strict` lets one request a
    // minute through per tenant. The store's clock stands still.
    let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)));
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("paced", Quota::per_second(10).burst(1))
                .key(Header::new("x-key"))
                .delay(Duration::from_secs(10), 2),
        )
        .limit(Limit::new("strict", Quota::per_minute(1)).key(Header::new("x-tenant")))
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let send = |key: &'static str, tenant: &'static str| {
        let app = app.clone();
        async move {
            let req = http::Request::builder()
                .uri("/")
                .header("x-key", key)
                .header("x-tenant", tenant)
                .body(axum::body::Body::empty())
                .unwrap();
            app.oneshot(req).await.unwrap().status().as_u16()
        }
    };
    assert_eq!(send("k", "t1").await, 200);
    // A second request of "k" waits (one place taken): `paced` is in debt.
    let waiter = tokio::spawn(send("k", "t2"));
    tokio::task::yield_now().await;
    // Twenty requests of "k" that `strict` refuses (tenant t1 is out): each finds
    // `paced` in debt as it looks, and must take no place and give back nothing.
    for _ in 0..20 {
        assert_eq!(send("k", "t1").await, 429);
    }
    let look = limiter.peek("paced", "k").await.unwrap();
    assert_eq!(
        look.outcome().unwrap().next_after(),
        Some(Duration::from_millis(200)),
        "two tokens taken, none given back"
    );
    // One place is still free: a request of another key that must wait, waits.
    assert_eq!(send("j", "t3").await, 200);
    assert_eq!(tokio::spawn(send("j", "t4")).await.unwrap(), 200);
    assert_eq!(waiter.await.unwrap(), 200);
}
