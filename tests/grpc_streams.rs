//! Messages of gRPC streams charged to limits (issue 42): a bidirectional echo method
//! behind `tollgate::grpc::StreamLimitLayer`, called by tonic's client over TCP (HTTP/2)
//! on tokio's paused clock (the store reads it too): the counts are exact and ten-second
//! floods take no real time. And a route's limit of bytes received pacing a streaming
//! call's request body through `RateLimitLayer`.
#![cfg(feature = "grpc")]

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use futures_util::{Stream, StreamExt, stream};
use http::uri::PathAndQuery;
use tokio::time::Instant;
use tollgate::clock::Clock;
use tollgate::grpc::StreamLimitLayer;
use tollgate::key::PeerIp;
use tollgate::pace::{OverLimit, Per};
use tollgate::store::MemoryStore;
use tollgate::{LimitSpec, Limiter, Quota};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic::transport::{Channel, Server};
use tonic::{Code, Status, Streaming};
use tonic_types::StatusExt;

/// Tokio's clock, paused in these tests.
#[derive(Clone)]
struct Tokio(Instant);

impl Clock for Tokio {
    fn now(&self) -> u64 {
        1_000_000_000_000 + self.0.elapsed().as_nanos() as u64
    }
}

/// Messages as raw bytes: no protobuf needed for an echo.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

type Echoes = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

/// `chat.Chat`: `Talk` and `Other`, both bidirectional echoes; the instants the app got
/// each message.
#[derive(Clone, Default)]
struct Chat {
    seen: Arc<Mutex<Vec<Instant>>>,
}

impl tonic::server::NamedService for Chat {
    const NAME: &'static str = "chat.Chat";
}

/// One call's handler: echoes what it reads (a read error, the limit's status, ends the
/// call with it).
#[derive(Clone)]
struct Talk(Arc<Mutex<Vec<Instant>>>);

impl tower::Service<tonic::Request<Streaming<Bytes>>> for Talk {
    type Response = tonic::Response<Echoes>;
    type Error = Status;
    type Future = std::future::Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let seen = self.0.clone();
        let echoes = request.into_inner().inspect(move |m| {
            if m.is_ok() {
                seen.lock().unwrap().push(Instant::now());
            }
        });
        std::future::ready(Ok(tonic::Response::new(Box::pin(echoes) as Echoes)))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Chat {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let talk = Talk(self.seen.clone());
        // gzip-compressed messages are taken too (the layer counts them as they are on
        // the wire).
        let mut grpc = tonic::server::Grpc::new(Raw).accept_compressed(CompressionEncoding::Gzip);
        Box::pin(async move { Ok(grpc.streaming(talk, req).await) })
    }
}

/// 10 messages a second, 5 at once, per client address, on `chat.Chat/Talk` only.
async fn serve(over: OverLimit) -> (SocketAddr, Chat) {
    serve_limit(
        LimitSpec::new("chat-messages", Quota::per_second(10).burst(5))
            .per(Per::Message)
            .over_limit(over),
    )
    .await
}

/// `Chat` behind `$layer` (any layer tonic's server takes) on a free port: its address
/// and the `Chat` (a macro: the layers' types differ, and the bounds tonic's server puts
/// on a layer are long).
macro_rules! serve_chat {
    ($layer:expr) => {{
        let layer = $layer;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let chat = Chat::default();
        let service = chat.clone();
        tokio::spawn(async move {
            Server::builder()
                .layer(layer)
                .add_service(service)
                .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
                .await
                .unwrap();
        });
        (addr, chat)
    }};
}

/// `spec` (named `chat-messages`) per client address, on `chat.Chat/Talk` only.
async fn serve_limit(spec: LimitSpec) -> (SocketAddr, Chat) {
    let limiter = Limiter::builder(MemoryStore::with_clock(Tokio(Instant::now())))
        .limit(spec)
        .build()
        .unwrap();
    let layer = StreamLimitLayer::new(limiter, "chat-messages", ["/chat.Chat/Talk"], |parts| {
        let peer = parts.extensions.get::<TcpConnectInfo>()?.remote_addr()?;
        Some(PeerIp::new().key(peer.ip()))
    });
    serve_chat!(layer)
}

/// Calls `method` with 100 messages a second for `d`: the echoes' instants, and the
/// status the call ended with (`None`: it was still open at `d`, or ended OK).
async fn flood(
    addr: SocketAddr,
    method: &'static str,
    d: Duration,
) -> (Vec<Instant>, Option<Status>) {
    let (echoes, status) =
        flood_with(addr, method, d, |i| Bytes::from(i.to_string()), false, None).await;
    (echoes.into_iter().map(|(at, _)| at).collect(), status)
}

/// [`flood`] with the messages `message(i)`, gzip-compressed by the client when
/// `gzip`, as `user` (its `x-user` metadata) if any: the echoes (instant and message) and
/// the status.
async fn flood_with(
    addr: SocketAddr,
    method: &'static str,
    d: Duration,
    message: fn(u64) -> Bytes,
    gzip: bool,
    user: Option<&'static str>,
) -> (Vec<(Instant, Bytes)>, Option<Status>) {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    if gzip {
        client = client.send_compressed(CompressionEncoding::Gzip);
    }
    client.ready().await.unwrap();
    let end = Instant::now() + d;
    let outbound = stream::unfold(0u64, move |i| async move {
        if Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        Some((message(i), i + 1))
    });
    let mut request = tonic::Request::new(outbound);
    if let Some(user) = user {
        request
            .metadata_mut()
            .insert("x-user", user.parse().unwrap());
    }
    let response = client
        .streaming(request, PathAndQuery::from_static(method), Raw)
        .await;
    let mut inbound = match response {
        Ok(response) => response.into_inner(),
        Err(status) => return (Vec::new(), Some(status)),
    };
    let mut echoes = Vec::new();
    loop {
        match tokio::time::timeout_at(end, inbound.next()).await {
            Ok(Some(Ok(echo))) => echoes.push((Instant::now(), echo)),
            Ok(Some(Err(status))) => return (echoes, Some(status)),
            Ok(None) | Err(_) => return (echoes, None),
        }
    }
}

fn within(at: &[Instant], start: Instant, secs: f64) -> usize {
    at.iter()
        .filter(|t| **t <= start + Duration::from_secs_f64(secs))
        .count()
}

/// The target, `end`: 10 msg/s burst 5, a client sending 100 msg/s for 10 s: at
/// most 5 + 10·d (+1) messages passed, and the stock tonic client sees
/// `RESOURCE_EXHAUSTED` with the pushback and the details.
#[tokio::test(start_paused = true)]
async fn end_closes_the_call_with_resource_exhausted_and_pushback() {
    let (addr, chat) = serve(OverLimit::End).await;
    let start = Instant::now();
    let (echoes, status) = flood(addr, "/chat.Chat/Talk", Duration::from_secs(10)).await;
    let status = status.expect("the call ended with a status");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("rate limit \"chat-messages\" exceeded; retry in "),
        "{}",
        status.message()
    );
    let pushback: u64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .expect("grpc-retry-pushback-ms")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=100).contains(&pushback), "{pushback}");
    let details = status.get_error_details();
    assert_eq!(
        details.quota_failure().unwrap().violations[0].subject,
        "chat-messages"
    );
    assert_eq!(details.error_info().unwrap().reason, "RATE_LIMIT_EXCEEDED");
    let seen = chat.seen.lock().unwrap().clone();
    let d = (*seen.last().unwrap() - start).as_secs_f64();
    assert!(
        seen.len() as f64 <= 5.0 + 10.0 * d + 1.0,
        "{} in {d} s",
        seen.len()
    );
    assert_eq!(seen.len(), 5, "the burst, then the status");
    assert_eq!(echoes.len(), 5);
}

/// `wait`: backpressure. The client sends 100 msg/s; the app gets them at the limit's pace
/// (at most 5 + 10·d + 1 within any d), and the call stays open.
#[tokio::test(start_paused = true)]
async fn wait_paces_the_stream_to_the_limit() {
    let (addr, chat) = serve(OverLimit::wait(Duration::from_secs(30))).await;
    let start = Instant::now();
    let (echoes, status) = flood(addr, "/chat.Chat/Talk", Duration::from_secs(10)).await;
    assert!(status.is_none(), "{status:?}");
    let seen = chat.seen.lock().unwrap().clone();
    for secs in [1.0, 5.0, 10.0] {
        let got = within(&seen, start, secs);
        let bound = 5 + (10.0 * secs) as usize + 1;
        assert!(got <= bound, "{got} within {secs} s");
        assert!(
            got + 2 >= bound,
            "paced, not stalled: {got} within {secs} s"
        );
    }
    assert!(within(&echoes, start, 10.0) <= 5 + 100 + 1);
}

/// A method the layer does not name passes unchanged (unary calls too).
#[tokio::test(start_paused = true)]
async fn other_methods_are_not_charged() {
    let (addr, chat) = serve(OverLimit::End).await;
    let (echoes, status) = flood(addr, "/chat.Chat/Other", Duration::from_secs(1)).await;
    assert!(status.is_none(), "{status:?}");
    assert!(echoes.len() >= 95, "{}", echoes.len());
    assert_eq!(chat.seen.lock().unwrap().len(), echoes.len());
}

/// A message of 1,000 bytes: its number, then zeros (gzip makes it a few dozen bytes).
fn compressible(i: u64) -> Bytes {
    let mut m = format!("{i}:").into_bytes();
    m.resize(1000, 0);
    Bytes::from(m)
}

/// 10 s of [`compressible`] messages on `/chat.Chat/Talk`, gzip-compressed or not.
async fn flood_compressible(
    addr: SocketAddr,
    gzip: bool,
) -> (Vec<(Instant, Bytes)>, Option<Status>) {
    flood_with(
        addr,
        "/chat.Chat/Talk",
        Duration::from_secs(10),
        compressible,
        gzip,
        None,
    )
    .await
}

/// Messages the client compresses (tonic's, gzip: the compressed flag set) are found and
/// counted one by one like any others: `end` lets the burst of 5 pass, intact, then ends
/// the call.
#[tokio::test(start_paused = true)]
async fn compressed_messages_are_counted_one_by_one() {
    let (addr, chat) = serve(OverLimit::End).await;
    let (echoes, status) = flood_compressible(addr, true).await;
    let status = status.expect("the call ended with a status");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(chat.seen.lock().unwrap().len(), 5);
    let echoed: Vec<Bytes> = echoes.into_iter().map(|(_, m)| m).collect();
    assert_eq!(echoed, (0..5).map(compressible).collect::<Vec<_>>());
}

/// The smallest a gzip member can be: a 10-byte header and an 8-byte trailer.
const GZIP_MIN: u64 = 18;

/// 2,000 bytes a second, 2,000 at once, `end`: a limit of bytes per client address.
fn bytes_limit() -> LimitSpec {
    LimitSpec::new("chat-messages", Quota::per_second(2000).burst(2000))
        .per(Per::Byte)
        .over_limit(OverLimit::End)
}

/// A limit of bytes counts a message's length on the wire: compressed, a 1,000-byte
/// message is a few dozen bytes, so many more pass than the 2 that fit uncompressed, and
/// never more than the limit's bytes could hold at the smallest a gzip message can be.
#[tokio::test(start_paused = true)]
async fn a_limit_of_bytes_counts_compressed_messages_by_their_length_on_the_wire() {
    let (addr, chat) = serve_limit(bytes_limit()).await;
    let start = Instant::now();
    let (plain, status) = flood_compressible(addr, false).await;
    assert_eq!(status.expect("ended").code(), Code::ResourceExhausted);
    assert_eq!(plain.len(), 2, "2,000 bytes hold two uncompressed messages");

    let (addr, chat2) = serve_limit(bytes_limit()).await;
    let (gzipped, status) = flood_compressible(addr, true).await;
    let d = (Instant::now() - start).as_secs_f64();
    assert!(
        gzipped.len() >= 20,
        "compressed, many more pass: {}",
        gzipped.len()
    );
    let bound = ((2000.0 + 2000.0 * d) / GZIP_MIN as f64) as usize + 1;
    assert!(gzipped.len() <= bound, "{} > {bound}", gzipped.len());
    let echoed: Vec<Bytes> = gzipped.iter().map(|(_, m)| m.clone()).collect();
    let sent: Vec<Bytes> = (0..echoed.len() as u64).map(compressible).collect();
    assert_eq!(echoed, sent, "every message passed intact");
    // 100 a second of a few dozen bytes is more than 2,000 bytes a second: the call ends.
    assert_eq!(status.expect("ended").code(), Code::ResourceExhausted);
    assert_eq!(chat.seen.lock().unwrap().len(), 2);
    assert_eq!(chat2.seen.lock().unwrap().len(), gzipped.len());
}

/// A Python interpreter with grpcio (gRPC's own client, on its C core: the Debian package
/// `python3-grpcio`, which `scripts/test.sh` installs); `None` outside CI when there is
/// none (the stock-client checks are then skipped, and say so).
fn grpcio_python() -> Option<String> {
    let candidates = std::env::var("GRPCIO_PYTHON")
        .into_iter()
        .chain(["/usr/bin/python3".to_owned(), "python3".to_owned()]);
    for python in candidates {
        let imports = std::process::Command::new(&python)
            .args(["-c", "import grpc"])
            .stderr(std::process::Stdio::null())
            .status();
        if imports.is_ok_and(|s| s.success()) {
            return Some(python);
        }
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "no python3 with grpcio, and CI=true: the stock gRPC client's checks cannot be \
         skipped in CI (scripts/test.sh installs the Debian package `python3-grpcio`)"
    );
    eprintln!("SKIPPED: no python3 with grpcio (apt-get install python3-grpcio)");
    None
}

/// One call of `tests/support/grpc_stock_client.py` to `addr`: `count` messages of `size`
/// bytes, gzip-compressed when `gzip`; what it printed.
async fn stock_call(
    python: String,
    addr: SocketAddr,
    count: u32,
    size: u32,
    gzip: bool,
) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/support/grpc_stock_client.py");
    let args = [
        script.to_owned(),
        addr.to_string(),
        count.to_string(),
        size.to_string(),
        (if gzip { "gzip" } else { "none" }).to_owned(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let call: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("stock client, {count} messages of {size} bytes, gzip {gzip}: {call}");
    call
}

/// The hex form of `s`, as the client prints binary metadata.
fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The black-box check: a stock gRPC client (grpcio) floods a bidirectional call
/// past 10 msg/s burst 5 (`end`), on the real clock: it sees `RESOURCE_EXHAUSTED`, the
/// message, `grpc-retry-pushback-ms` and the rich details in the trailers, after at most
/// 5 + 10·d + 1 echoes, every one intact.
#[tokio::test]
async fn a_stock_grpc_client_sees_resource_exhausted_with_pushback_and_details() {
    let Some(python) = grpcio_python() else {
        return;
    };
    let (addr, chat) = serve(OverLimit::End).await;
    let call = stock_call(python, addr, 1000, 16, false).await;
    assert_eq!(call["code"], "RESOURCE_EXHAUSTED", "{call}");
    let details = call["details"].as_str().unwrap();
    assert!(
        details.starts_with("rate limit \"chat-messages\" exceeded; retry in "),
        "{call}"
    );
    let pushback: u64 = call["trailing"]["grpc-retry-pushback-ms"]
        .as_str()
        .expect("grpc-retry-pushback-ms")
        .parse()
        .unwrap();
    assert!((1..=100).contains(&pushback), "{pushback}");
    let rich = call["trailing"]["grpc-status-details-bin"]
        .as_str()
        .expect("grpc-status-details-bin");
    assert!(rich.contains(&hex("RATE_LIMIT_EXCEEDED")), "{call}");
    assert!(rich.contains(&hex("chat-messages")), "{call}");
    let echoes = call["echoes"].as_u64().unwrap();
    let d = call["seconds"].as_f64().unwrap();
    assert!(echoes >= 5, "the burst passes: {call}");
    assert!(echoes as f64 <= 5.0 + 10.0 * d + 1.0, "{call}");
    assert_eq!(call["intact"], true, "{call}");
    assert_eq!(chat.seen.lock().unwrap().len() as u64, echoes);
}

/// The stock client compressing its messages (grpcio, gzip): a limit of bytes counts them
/// as they are on the wire (many more pass than the 2 of 1,000 bytes that fit
/// uncompressed, the same client sending them plain), each intact.
#[tokio::test]
async fn a_stock_grpc_client_compressing_is_charged_the_compressed_bytes() {
    let Some(python) = grpcio_python() else {
        return;
    };
    let (addr, _) = serve_limit(bytes_limit()).await;
    let plain = stock_call(python.clone(), addr, 300, 1000, false).await;
    assert_eq!(plain["code"], "RESOURCE_EXHAUSTED", "{plain}");
    let d = plain["seconds"].as_f64().unwrap();
    let echoes = plain["echoes"].as_u64().unwrap();
    assert!(
        echoes >= 2 && echoes as f64 <= 2.0 + 2.0 * d + 1.0,
        "{plain}"
    );

    let (addr, chat) = serve_limit(bytes_limit()).await;
    let gzipped = stock_call(python, addr, 300, 1000, true).await;
    let echoes = gzipped["echoes"].as_u64().unwrap();
    let d = gzipped["seconds"].as_f64().unwrap();
    assert!(echoes >= 20, "compressed, many more pass: {gzipped}");
    assert!(
        echoes as f64 <= (2000.0 + 2000.0 * d) / GZIP_MIN as f64 + 1.0,
        "{gzipped}"
    );
    assert_eq!(gzipped["intact"], true, "{gzipped}");
    assert_eq!(chat.seen.lock().unwrap().len() as u64, echoes);
}

/// A route's limit of bytes received (`direction = "in"`) on a gRPC method paces the
/// call's request body through `RateLimitLayer` over tonic's server: a client streaming
/// 64 KiB messages as fast as its sleeps let it (6.4 MiB/s) is read at 1 MiB/s after 256
/// KiB at once, so the app gets at most (256 KiB + 1 MiB/s · d) / 64 KiB messages (+1) by
/// `d`, and no fewer than two less (each message's 5-byte prefix, and the client's first
/// sleep), one every 62.5 ms once the burst is spent; another method is not paced.
#[tokio::test(start_paused = true)]
async fn a_routes_limit_of_bytes_received_paces_a_tonic_client_stream() {
    use tollgate::grpc::{Grpc, GrpcOnRejection};
    use tollgate::pace::Direction;
    use tollgate::{Limit, RateLimitLayer};
    const KIB: usize = 1024;
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(Tokio(Instant::now())))
        .route(
            "POST /chat.Chat/Talk",
            Limit::new("upload", Quota::per_second(1024).burst(256))
                .per(Per::Byte)
                .unit(1024)
                .direction(Direction::In),
        )
        .grpc(Grpc::new())
        .on_rejection(GrpcOnRejection)
        .build()
        .unwrap();
    let (addr, chat) = serve_chat!(layer);
    let message = |_| Bytes::from(vec![7u8; 64 * KIB]);
    let start = Instant::now();
    let (_, status) = flood_with(
        addr,
        "/chat.Chat/Talk",
        Duration::from_secs(2),
        message,
        false,
        None,
    )
    .await;
    assert!(status.is_none(), "{status:?}");
    let seen = chat.seen.lock().unwrap().clone();
    for secs in [0.5, 1.0, 2.0] {
        let got = within(&seen, start, secs);
        let bound = (256 + (1024.0 * secs) as usize) / 64;
        assert!(got <= bound + 1, "{got} messages within {secs} s");
        assert!(
            got + 2 >= bound,
            "paced, not stalled: {got} within {secs} s"
        );
    }
    let (first, last) = (seen[4], seen[seen.len() - 1]);
    let gap = (last - first).as_secs_f64() / (seen.len() - 5) as f64;
    assert!(
        (gap - 0.0625).abs() < 0.0625 * 0.02,
        "one message every {gap} s"
    );
    // The other method is read as fast as the client sends: about 100 messages a second.
    let start = Instant::now();
    let (echoes, status) = flood_with(
        addr,
        "/chat.Chat/Other",
        Duration::from_secs(1),
        message,
        false,
        None,
    )
    .await;
    assert!(status.is_none(), "{status:?}");
    assert!(
        within(
            &echoes.iter().map(|(at, _)| *at).collect::<Vec<_>>(),
            start,
            1.0
        ) >= 90
    );
}

/// The `grpc_chat` example, run as its users run it (its binary, tonic's client, the real
/// clock): a call as `alice` flooding 100 messages a second ends with
/// `RESOURCE_EXHAUSTED` and its pushback, after at most the burst of 5 plus 10 a second of
/// echoes.
#[tokio::test]
async fn the_grpc_chat_example_ends_a_flood_with_resource_exhausted() {
    let example = support::example::start("grpc_chat", "grpc", &[]);
    let start = Instant::now();
    let message = |i: u64| Bytes::from(i.to_string());
    let (echoes, status) = flood_with(
        example.addr,
        "/chat.Chat/Talk",
        Duration::from_secs(5),
        message,
        false,
        Some("alice"),
    )
    .await;
    let d = start.elapsed().as_secs_f64();
    let status = status.expect("the call ended");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_some());
    assert!(echoes.len() >= 5, "the burst: {}", echoes.len());
    assert!(
        echoes.len() as f64 <= 5.0 + 10.0 * d + 1.0,
        "{} echoes in {d} s",
        echoes.len()
    );
}
