//! In-flight limits (`Limit::in_flight`): a request holds a unit from its admission until
//! its response body ends, fails or is dropped. Through the service (bodies driven by
//! hand), and over real TCP: a thousand connections on one key, some of them going away
//! mid-response, never put more than `n` in the handler, and lose no unit.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tollgate::key::Header;
use tollgate::store::MemoryStore;
use tollgate::{Algorithm, Limit, LimitSpec, Limiter, RateLimitLayer};
use tower::{Service, ServiceExt};

fn layer(n: u64) -> RateLimitLayer<MemoryStore> {
    RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::in_flight("inference", n).key(Header::new("x-key")))
        .build()
        .unwrap()
}

fn request(key: &str) -> Request<Body> {
    Request::get("/")
        .header("x-key", key)
        .body(Body::empty())
        .unwrap()
}

/// A service whose response bodies stream what the test sends on the channel it gets
/// back for each call, and end when the sender is dropped.
#[derive(Clone)]
struct Streams(mpsc::UnboundedSender<mpsc::Sender<Result<Bytes, Infallible>>>);

impl Service<Request<Body>> for Streams {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        let (tx, rx) = mpsc::channel(4);
        self.0.send(tx).unwrap();
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (chunk, rx))
        });
        std::future::ready(Ok(Response::new(Body::from_stream(stream))))
    }
}

#[tokio::test]
async fn a_streamed_response_holds_its_unit_until_its_body_ends() {
    let (tx, mut streams) = mpsc::unbounded_channel();
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer(1))
        .service(Streams(tx));

    let first = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        first.headers()["ratelimit-policy"],
        r#""inference";q=1;qu="concurrent-requests""#
    );
    assert_eq!(
        first.headers()["ratelimit"],
        r#""inference";r=0"#,
        "no window: no t"
    );
    let sender = streams.recv().await.unwrap();

    // The handler returned, but its body streams: the unit is still held.
    let refused = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    // Another key has its own units.
    let other = svc
        .ready()
        .await
        .unwrap()
        .call(request("other"))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    drop(other);

    sender.send(Ok(Bytes::from("token "))).await.unwrap();
    let mut body = first.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "token ");
    let still = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    assert_eq!(still.status(), StatusCode::TOO_MANY_REQUESTS, "mid-stream");

    drop(sender); // the stream ends
    assert!(body.frame().await.is_none());
    let next = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    assert_eq!(
        next.status(),
        StatusCode::OK,
        "the body ended: its unit is free"
    );
}

#[tokio::test]
async fn a_dropped_body_frees_its_unit() {
    let (tx, mut streams) = mpsc::unbounded_channel();
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer(1))
        .service(Streams(tx));
    let first = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    let _sender = streams.recv().await.unwrap();
    drop(first); // the client went away mid-response
    let next = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_failed_service_and_a_dropped_future_free_their_units() {
    let failing = tower::service_fn(|_: Request<Body>| async { Err::<Response<Body>, _>("boom") });
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer(1))
        .service(failing);
    for _ in 0..3 {
        assert!(svc.ready().await.unwrap().call(request("k")).await.is_err());
    }
    // A response future dropped before the service answered.
    let pending = tower::service_fn(|_: Request<Body>| {
        std::future::pending::<Result<Response<Body>, Infallible>>()
    });
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer(1))
        .service(pending);
    for _ in 0..3 {
        let future = svc.ready().await.unwrap().call(request("k"));
        drop(future);
    }
    let slow = svc.ready().await.unwrap().call(request("k"));
    let refused = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the pending one holds it"
    );
    drop(slow);
    let _again = svc.ready().await.unwrap().call(request("k"));
}

#[tokio::test]
async fn in_flight_and_a_rate_limit_are_all_or_nothing() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::in_flight("inflight", 2).key(Header::new("x-key")))
        .limit(Limit::new("rate", tollgate::Quota::per_minute(1)).key(Header::new("x-key")))
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::empty()))
        }));
    let ok = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    // The rate limit refuses the next one: it takes no in-flight unit either.
    let refused = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let look = limiter.peek("inflight", "k").await.unwrap();
    assert_eq!(
        look.outcome().unwrap().remaining(),
        1,
        "only the admitted request holds one"
    );
    drop(ok);
    let look = limiter.peek("inflight", "k").await.unwrap();
    assert_eq!(look.outcome().unwrap().remaining(), 2);
}

#[tokio::test]
async fn the_limiter_acquires_and_releases_units_beside_the_middleware() {
    let limiter = Limiter::builder(MemoryStore::new())
        .limit(
            LimitSpec::in_flight("jobs", 2)
                .algorithm(Algorithm::in_flight_retry_after(Duration::from_secs(5))),
        )
        .limit(LimitSpec::new("rate", tollgate::Quota::per_second(1)))
        .build()
        .unwrap();
    let a = limiter.acquire("jobs", "acme").await.unwrap();
    let b = limiter.acquire("jobs", "acme").await.unwrap();
    assert!(a.is_granted() && b.is_granted());
    let c = limiter.acquire("jobs", "acme").await.unwrap();
    assert!(!c.is_granted());
    assert_eq!(
        c.decision().outcome().unwrap().retry_after(),
        Some(Duration::from_secs(5))
    );
    drop(c); // a refused permit gives nothing back
    a.release();
    assert!(limiter.acquire("jobs", "acme").await.unwrap().is_granted());
    // (That permit was dropped at once: both units are free again but b's.)
    let look = limiter.peek("jobs", "acme").await.unwrap();
    assert_eq!(look.outcome().unwrap().remaining(), 1);
    drop(b);
    // Penalties, blocks and permits on the wrong kind of limit are refused.
    assert!(limiter.penalize("jobs", "acme", 1).await.is_err());
    assert!(limiter.acquire("rate", "acme").await.is_err());
}

/// Delay mode: requests over the limit wait for a unit of their key, in arrival order, at
/// most `max_waiters` of them; a freed unit goes to the longest-waiting one. (On tokio's
/// paused clock: a sleep ends only once every task waits, so b is in the queue before c
/// is sent.)
#[tokio::test(start_paused = true)]
async fn in_delay_mode_requests_wait_for_a_unit_in_arrival_order() {
    let (tx, mut streams) = mpsc::unbounded_channel();
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .limit(
            Limit::in_flight("inference", 1)
                .key(Header::new("x-key"))
                .delay(Duration::from_secs(60), 2),
        )
        .build()
        .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(Streams(tx));
    let send = |key: &'static str| {
        let mut svc = svc.clone();
        tokio::spawn(async move { svc.ready().await.unwrap().call(request(key)).await.unwrap() })
    };
    let a = send("k").await.unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    let a_stream = streams.recv().await.unwrap();
    let b = send("k");
    // b waits (its check found no unit) before c arrives: arrival order.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let c = send("k");
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A third waiter finds the queue full: a 429 at once.
    let d = send("k").await.unwrap();
    assert_eq!(d.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another key neither waits nor is held up.
    let other = send("other").await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    drop(streams.recv().await.unwrap());
    drop(other);
    assert!(!b.is_finished() && !c.is_finished(), "both wait");

    drop(a_stream); // a's body ends: its unit goes to b, the first to wait
    drop(a.into_body().collect().await.unwrap());
    let b = b.await.unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    let b_stream = streams.recv().await.unwrap();
    assert!(!c.is_finished(), "c waits for b's unit");
    drop(b_stream);
    drop(b.into_body().collect().await.unwrap());
    let c = c.await.unwrap();
    assert_eq!(c.status(), StatusCode::OK, "then c");
    drop(streams.recv().await.unwrap());
    drop(c);
}

/// A request that waited `max_wait` without a unit gets its 429.
#[tokio::test(start_paused = true)]
async fn a_request_that_waited_max_wait_is_refused() {
    let (tx, mut streams) = mpsc::unbounded_channel();
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::in_flight("inference", 1).delay(Duration::from_secs(2), 10))
        .build()
        .unwrap();
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(Streams(tx));
    let a = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    let _a_stream = streams.recv().await.unwrap();
    let start = tokio::time::Instant::now();
    let b = svc.ready().await.unwrap().call(request("k")).await.unwrap();
    assert_eq!(b.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(b.headers()["retry-after"], "1");
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(2),
        "refused at its max_wait"
    );
    drop(a);
}

#[test]
fn an_in_flight_limit_refuses_what_it_cannot_mean() {
    let build = |limit: Limit| {
        RateLimitLayer::builder(MemoryStore::new())
            .limit(limit)
            .build()
            .map(|_| ())
    };
    let charged = Limit::in_flight("x", 2).charge(tollgate::Charge::errors());
    assert_eq!(build(charged).unwrap_err().field(), "limits[\"x\"].charge");
}

/// Serves `app` on a free loopback port.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Counts the requests in the handler or streaming their body.
struct Active {
    now: AtomicUsize,
    max: AtomicUsize,
}

struct Leaving(Arc<Active>);

impl Drop for Leaving {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_connections_on_one_key_never_exceed_n_and_lose_no_unit() {
    const N: u64 = 8;
    const CLIENTS: usize = 1_000;
    const REQUESTS: usize = 10_000;
    let layer = layer(N);
    let limiter = layer.limiter();
    let active = Arc::new(Active {
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
    });
    let counted = active.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let active = counted.clone();
                async move {
                    let now = active.now.fetch_add(1, Ordering::SeqCst) + 1;
                    active.max.fetch_max(now, Ordering::SeqCst);
                    let leaving = Leaving(active);
                    // Three chunks with pauses: the work lasts as long as the body streams,
                    // and `leaving` goes when the stream ends or is dropped.
                    let stream = futures_util::stream::unfold(
                        (0, Some(leaving)),
                        |(i, leaving)| async move {
                            if i == 3 {
                                drop(leaving);
                                return None;
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            Some((
                                Ok::<_, Infallible>(Bytes::from(vec![b'x'; 512])),
                                (i + 1, leaving),
                            ))
                        },
                    );
                    Body::from_stream(stream)
                }
            }),
        )
        .layer(layer);
    let addr = serve(app).await;

    let next = Arc::new(AtomicUsize::new(0));
    let (ok, refused, cut) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (next, ok, refused, cut) = (next.clone(), ok.clone(), refused.clone(), cut.clone());
        clients.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= REQUESTS {
                    return;
                }
                let mut s = TcpStream::connect(addr).await.unwrap();
                let req = "GET / HTTP/1.1\r\nhost: t\r\nx-key: one\r\nconnection: close\r\n\r\n";
                s.write_all(req.as_bytes()).await.unwrap();
                let mut head = [0u8; 12];
                if s.read_exact(&mut head).await.is_err() {
                    continue;
                }
                match &head[9..12] {
                    b"200" => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        // 3 in 10 go away mid-response (`i` spreads them evenly).
                        if i % 10 < 3 {
                            cut.fetch_add(1, Ordering::Relaxed);
                            drop(s);
                        } else {
                            let mut rest = Vec::new();
                            let _ = s.read_to_end(&mut rest).await;
                        }
                    }
                    b"429" => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        let mut rest = Vec::new();
                        let _ = s.read_to_end(&mut rest).await;
                    }
                    other => panic!("unexpected status {:?}", String::from_utf8_lossy(other)),
                }
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let (ok, refused, cut) = (
        ok.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        cut.load(Ordering::Relaxed),
    );
    assert_eq!(ok + refused, REQUESTS as u64);
    assert!(ok >= N && refused > 0, "{ok} admitted, {refused} refused");
    assert!(cut > 0);
    let max = active.max.load(Ordering::SeqCst);
    assert!(
        max <= N as usize,
        "{max} requests in flight at once, limit {N}"
    );
    // Every unit comes back once the server has seen every connection end (a condition,
    // not a sleep).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = limiter
            .peek("inference", "one")
            .await
            .unwrap()
            .outcome()
            .unwrap()
            .remaining();
        if left == N && active.now.load(Ordering::SeqCst) == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} of {N} units free after 30 s: a unit was lost"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "in-flight flood: {ok} admitted ({cut} cut mid-response), {refused} refused, at most {max} at once"
    );
}
