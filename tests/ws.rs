//! WebSocket messages charged to limits (issue 42): `tollgate::ws::Limited` over axum's
//! `WebSocket`, against a real client (tokio-tungstenite) over TCP, on tokio's paused
//! clock (the store reads it too): the counts and close frames are exact and the floods
//! take no real time.
#![cfg(feature = "ws")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite;
use tollgate::clock::Clock;
use tollgate::key::PeerIp;
use tollgate::pace::{Direction, OverLimit, Per};
use tollgate::store::MemoryStore;
use tollgate::ws::{Close, Limited};
use tollgate::{LimitSpec, Limiter, Quota};

mod support;

/// Tokio's clock, paused in these tests.
#[derive(Clone)]
struct Tokio(Instant);

impl Clock for Tokio {
    fn now(&self) -> u64 {
        1_000_000_000_000 + self.0.elapsed().as_nanos() as u64
    }
}

/// What the server does with its socket.
#[derive(Clone, Copy)]
enum Role {
    /// Reads every message, noting when the app got it.
    Count,
    /// Sends this many text messages as fast as the socket takes them.
    Flood(usize),
    /// Feeds this many text messages (no flush between them), then closes the socket.
    Feed(usize),
}

#[derive(Clone)]
struct App {
    limiter: Limiter,
    role: Role,
    close: Close,
    reason: Option<&'static str>,
    /// When the app got (or sent) each message.
    seen: Arc<Mutex<Vec<Instant>>>,
    /// What the socket's stream ended with.
    ended: Arc<Mutex<Option<String>>>,
    /// The socket as `Debug` shows it, at the upgrade.
    shown: Arc<Mutex<Option<String>>>,
    /// A second limit the socket is charged to (`Limited::and`).
    and: Option<&'static str>,
}

async fn upgrade(
    upgrade: WebSocketUpgrade,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(app): State<App>,
) -> Response {
    // The key, computed once: at the upgrade.
    let pacer = app
        .limiter
        .pacer("ws", PeerIp::new().key(peer.ip()))
        .unwrap();
    upgrade.on_upgrade(move |socket| async move {
        let mut socket = Limited::new(socket, pacer).close_with(app.close);
        if let Some(limit) = app.and {
            let key = PeerIp::new().key(peer.ip());
            socket = socket.and(app.limiter.pacer(limit, key).unwrap());
        }
        if let Some(reason) = app.reason {
            socket = socket.reason(reason);
        }
        *app.shown.lock().unwrap() = Some(format!("{socket:?}"));
        match app.role {
            Role::Count => {
                while let Some(message) = socket.next().await {
                    match message {
                        Ok(Message::Text(_) | Message::Binary(_)) => {
                            app.seen.lock().unwrap().push(Instant::now());
                        }
                        Ok(_) => {}
                        Err(e) => {
                            *app.ended.lock().unwrap() = Some(format!("{e:?}"));
                        }
                    }
                }
            }
            Role::Feed(n) => {
                for i in 0..n {
                    socket
                        .feed(Message::Text(i.to_string().into()))
                        .await
                        .unwrap();
                    app.seen.lock().unwrap().push(Instant::now());
                }
                socket.close().await.unwrap();
            }
            Role::Flood(n) => {
                for i in 0..n {
                    if socket
                        .send(Message::Text(i.to_string().into()))
                        .await
                        .is_err()
                    {
                        break;
                    }
                    app.seen.lock().unwrap().push(Instant::now());
                }
            }
        }
    })
}

async fn serve(
    spec: LimitSpec,
    role: Role,
    close: Close,
    reason: Option<&'static str>,
) -> (SocketAddr, App) {
    serve_limits(vec![spec], None, role, close, reason).await
}

/// [`serve`] with `specs` (the first, `ws`, the socket's), the socket charged to the
/// limit `and` too.
async fn serve_limits(
    specs: Vec<LimitSpec>,
    and: Option<&'static str>,
    role: Role,
    close: Close,
    reason: Option<&'static str>,
) -> (SocketAddr, App) {
    let mut limiter = Limiter::builder(MemoryStore::with_clock(Tokio(Instant::now())));
    for spec in specs {
        limiter = limiter.limit(spec);
    }
    let limiter = limiter.build().unwrap();
    let app = App {
        limiter,
        role,
        close,
        reason,
        seen: Arc::default(),
        ended: Arc::default(),
        shown: Arc::default(),
        and,
    };
    let router = Router::new()
        .route("/ws", get(upgrade))
        .with_state(app.clone());
    // No Nagle either way: with a paused clock, a small write held for a delayed ACK
    // (tens of real milliseconds) would be held for any span of virtual time.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    (addr, app)
}

/// 20 messages a second, 10 at once.
fn messages(over: OverLimit) -> LimitSpec {
    LimitSpec::new("ws", Quota::per_second(20).burst(10))
        .per(Per::Message)
        .over_limit(over)
}

/// Connects a client to `/ws` and reads what the server sends until `until`, each message
/// with the instant it came.
async fn receive_until(addr: SocketAddr, until: Instant) -> Vec<(tungstenite::Message, Instant)> {
    let (ws, _) =
        tokio_tungstenite::connect_async_with_config(format!("ws://{addr}/ws"), None, true)
            .await
            .unwrap();
    let (_tx, mut rx) = ws.split();
    let mut got = Vec::new();
    while let Ok(Some(Ok(message))) = tokio::time::timeout_at(until, rx.next()).await {
        got.push((message, Instant::now()));
    }
    got
}

/// Sends 1,000 messages a second for `d` (or until the socket fails); reads what the
/// server sends meanwhile. Answers the close frame the server sent, if any.
async fn flood(addr: SocketAddr, d: Duration) -> Option<tungstenite::protocol::CloseFrame> {
    let (ws, _) =
        tokio_tungstenite::connect_async_with_config(format!("ws://{addr}/ws"), None, true)
            .await
            .unwrap();
    let (mut tx, mut rx) = ws.split();
    let reader = tokio::spawn(async move {
        while let Some(Ok(message)) = rx.next().await {
            if let tungstenite::Message::Close(frame) = message {
                return frame;
            }
        }
        None
    });
    let end = Instant::now() + d;
    let mut i = 0u64;
    while Instant::now() < end {
        if tx
            .send(tungstenite::Message::text(i.to_string()))
            .await
            .is_err()
        {
            break;
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
        if reader.is_finished() {
            break;
        }
    }
    tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
}

fn received_within(app: &App, start: Instant, d: Duration) -> usize {
    let seen = app.seen.lock().unwrap();
    seen.iter().filter(|t| **t <= start + d).count()
}

/// The target: 20 msg/s, burst 10, a client flooding 1,000 msg/s, `end`: at most
/// 10 + 20·d (+1) received, then a close frame with the code and reason configured.
#[tokio::test(start_paused = true)]
async fn a_flood_over_the_limit_is_closed_with_1008_and_the_reason() {
    let (addr, app) = serve(
        messages(OverLimit::End),
        Role::Count,
        Close::PolicyViolation,
        None,
    )
    .await;
    let start = Instant::now();
    let frame = flood(addr, Duration::from_secs(2))
        .await
        .expect("a close frame");
    let received = app.seen.lock().unwrap().clone();
    let last = *received.last().unwrap();
    let d = (last - start).as_secs_f64();
    assert!(
        received.len() as f64 <= 10.0 + 20.0 * d + 1.0,
        "{} received in {d} s",
        received.len()
    );
    assert_eq!(received.len(), 10, "the burst, then the close");
    assert_eq!(u16::from(frame.code), 1008);
    assert!(
        frame
            .reason
            .as_str()
            .starts_with("rate limit \"ws\" exceeded; retry in "),
        "{}",
        frame.reason
    );
    let ended = app
        .ended
        .lock()
        .unwrap()
        .clone()
        .expect("the stream told the app");
    assert!(ended.contains("Refused"), "{ended}");
    // `Debug` shows the socket's pacers and how it closes, not its messages.
    let shown = app.shown.lock().unwrap().clone().expect("shown");
    assert!(
        shown.starts_with("Limited { incoming: Some(Pacer"),
        "{shown}"
    );
    assert!(
        shown.contains("close: PolicyViolation, closing: false"),
        "{shown}"
    );
}

/// 1013 (try again later) with a reason of the app's, over the limit of bytes: a
/// message's size is charged.
#[tokio::test(start_paused = true)]
async fn a_limit_of_bytes_closes_with_1013_and_the_apps_reason() {
    let bytes = LimitSpec::new("ws", Quota::per_second(100).burst(25))
        .per(Per::Byte)
        .over_limit(OverLimit::End);
    let (addr, app) = serve(bytes, Role::Count, Close::TryAgainLater, Some("slow down")).await;
    let start = Instant::now();
    let frame = flood(addr, Duration::from_secs(2))
        .await
        .expect("a close frame");
    assert_eq!(u16::from(frame.code), 1013);
    assert_eq!(frame.reason.as_str(), "slow down");
    // The client sent "0", "1", ...: the bytes the app got.
    let seen = app.seen.lock().unwrap().clone();
    let bytes: usize = (0..seen.len()).map(|i| i.to_string().len()).sum();
    let d = (*seen.last().unwrap() - start).as_secs_f64();
    assert!(bytes as f64 <= 25.0 + 100.0 * d, "{bytes} bytes in {d} s");
    assert!(bytes >= 24, "the burst passed: {bytes}");
}

/// A second limit given with `Limited::and` is charged too, in its direction: a limit of
/// 5 bytes received at once (or of both directions) closes a flood after 5 one-byte
/// messages, naming that limit, where the socket's own limit of messages would allow 10.
#[tokio::test(start_paused = true)]
async fn a_limit_added_with_and_is_charged_in_its_direction() {
    for direction in [Direction::In, Direction::Both] {
        let bytes = LimitSpec::new("ws-bytes", Quota::per_second(1).burst(5))
            .per(Per::Byte)
            .direction(direction)
            .over_limit(OverLimit::End);
        let (addr, app) = serve_limits(
            vec![messages(OverLimit::End), bytes],
            Some("ws-bytes"),
            Role::Count,
            Close::PolicyViolation,
            None,
        )
        .await;
        let frame = flood(addr, Duration::from_secs(1))
            .await
            .expect("a close frame");
        assert!(
            frame
                .reason
                .as_str()
                .starts_with("rate limit \"ws-bytes\" exceeded"),
            "{direction:?}: {}",
            frame.reason
        );
        assert_eq!(app.seen.lock().unwrap().len(), 5, "{direction:?}");
        let shown = app.shown.lock().unwrap().clone().expect("shown");
        // Both ways: the sibling pacer charges what the socket sends to the same limit.
        let out = match direction {
            Direction::Both => "outgoing: Some(Pacer { limit: \"ws-bytes\"",
            _ => "outgoing: None",
        };
        assert!(shown.contains(out), "{direction:?}: {shown}");
    }
}

/// Messages fed without a flush between them are each sent, in order, once their units
/// are paid for (the next waits for the one held), and closing sends the one still held
/// before the close frame: 15 messages at 20/s with 10 at once arrive whole, the last
/// ~0.25 s in, then the close.
#[tokio::test(start_paused = true)]
async fn fed_messages_are_each_sent_and_closing_sends_the_held_one_first() {
    let out = messages(OverLimit::wait(Duration::from_secs(5))).direction(Direction::Out);
    let (addr, _app) = serve(out, Role::Feed(15), Close::PolicyViolation, None).await;
    let start = Instant::now();
    let (mut texts, mut closed) = (Vec::new(), false);
    for (message, at) in receive_until(addr, start + Duration::from_secs(3)).await {
        match message {
            tungstenite::Message::Text(t) => texts.push((t.to_string(), at)),
            tungstenite::Message::Close(_) => closed = true,
            _ => {}
        }
    }
    let sent: Vec<String> = texts.iter().map(|(t, _)| t.clone()).collect();
    let expected: Vec<String> = (0..15).map(|i: u32| i.to_string()).collect();
    assert_eq!(sent, expected, "every message, in order");
    assert!(closed, "the close frame came after them");
    let last = (texts[14].1 - start).as_secs_f64();
    assert!((0.2..0.35).contains(&last), "paced: the last at {last} s");
}

/// `wait`: backpressure instead of a close. The app gets the messages at the limit's pace:
/// at most 10 + 20·d (+1) within any d, and the socket stays open.
#[tokio::test(start_paused = true)]
async fn waiting_paces_a_flood_to_the_limit() {
    let (addr, app) = serve(
        messages(OverLimit::wait(Duration::from_secs(5))),
        Role::Count,
        Close::PolicyViolation,
        None,
    )
    .await;
    let start = Instant::now();
    let frame = flood(addr, Duration::from_secs(2)).await;
    assert!(frame.is_none(), "no close: {frame:?}");
    for secs in [1, 2] {
        let d = Duration::from_secs(secs);
        let received = received_within(&app, start, d);
        let bound = 10 + 20 * secs as usize + 1;
        assert!(received <= bound, "{received} within {d:?}");
        assert!(
            received + 2 >= bound,
            "paced, not stalled: {received} within {d:?}"
        );
    }
    assert!(app.ended.lock().unwrap().is_none());
}

/// Sent messages are charged too (`direction = "out"`): a server flooding its client is
/// held to the limit.
#[tokio::test(start_paused = true)]
async fn sent_messages_are_paced_out() {
    let out = messages(OverLimit::wait(Duration::from_secs(5))).direction(Direction::Out);
    let (addr, app) = serve(out, Role::Flood(1_000), Close::PolicyViolation, None).await;
    let start = Instant::now();
    let got: Vec<Instant> = receive_until(addr, start + Duration::from_secs(3))
        .await
        .into_iter()
        .filter(|(message, _)| message.is_text())
        .map(|(_, at)| at)
        .collect();
    let within = |secs: u64| {
        got.iter()
            .filter(|t| **t <= start + Duration::from_secs(secs))
            .count()
    };
    for secs in [1, 2, 3] {
        let bound = 10 + 20 * secs as usize + 1;
        assert!(within(secs) <= bound, "{} within {secs} s", within(secs));
        assert!(
            within(secs) + 2 >= bound,
            "{} within {secs} s",
            within(secs)
        );
    }
    assert!(app.seen.lock().unwrap().len() <= 10 + 20 * 3 + 1);
}

/// The `ws_echo` example, run as its users run it (its binary, a real WebSocket client,
/// the real clock): a client flooding 100 messages gets back at most the burst of 10 plus
/// 20 a second of echoes, then a close with 1008 and the reason.
#[tokio::test]
async fn the_ws_echo_example_closes_a_flood_with_1008() {
    let example = support::example::start("ws_echo", "ws", &[]);
    let start = std::time::Instant::now();
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", example.addr))
        .await
        .unwrap();
    let (mut tx, mut rx) = ws.split();
    // Read while sending (as a client would): what came back, and the close frame.
    let reader = tokio::spawn(async move {
        let mut echoes = 0;
        while let Some(Ok(message)) = rx.next().await {
            match message {
                tungstenite::Message::Text(_) => echoes += 1,
                tungstenite::Message::Close(frame) => return (echoes, frame),
                _ => {}
            }
        }
        (echoes, None)
    });
    for i in 0..100 {
        if reader.is_finished()
            || tx
                .send(tungstenite::Message::text(i.to_string()))
                .await
                .is_err()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (echoes, close) = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .expect("the example closes the socket")
        .unwrap();
    let d = start.elapsed().as_secs_f64();
    let close = close.expect("a close frame");
    assert_eq!(u16::from(close.code), 1008);
    assert!(close.reason.contains("ws-messages"), "{}", close.reason);
    assert!(echoes >= 10, "the burst: {echoes}");
    assert!(
        echoes as f64 <= 10.0 + 20.0 * d + 1.0,
        "{echoes} echoes in {d} s"
    );
}
