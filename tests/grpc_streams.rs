//! Messages of gRPC streams charged to limits (issue 42): a bidirectional echo method
//! behind `tollgate::grpc::StreamLimitLayer`, called by tonic's client over TCP (HTTP/2)
//! on tokio's paused clock (the store reads it too): the counts are exact and ten-second
//! floods take no real time.
#![cfg(feature = "grpc")]

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
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
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
        Box::pin(async move { Ok(tonic::server::Grpc::new(Raw).streaming(talk, req).await) })
    }
}

/// 10 messages a second, 5 at once, per client address, on `chat.Chat/Talk` only.
async fn serve(over: OverLimit) -> (SocketAddr, Chat) {
    let limiter = Limiter::builder(MemoryStore::with_clock(Tokio(Instant::now())))
        .limit(
            LimitSpec::new("chat-messages", Quota::per_second(10).burst(5))
                .per(Per::Message)
                .over_limit(over),
        )
        .build()
        .unwrap();
    let layer = StreamLimitLayer::new(limiter, "chat-messages", ["/chat.Chat/Talk"], |parts| {
        let peer = parts.extensions.get::<TcpConnectInfo>()?.remote_addr()?;
        Some(PeerIp::new().key(peer.ip()))
    });
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
}

/// Calls `method` with 100 messages a second for `d`: the echoes' instants, and the
/// status the call ended with (`None`: it was still open at `d`, or ended OK).
async fn flood(
    addr: SocketAddr,
    method: &'static str,
    d: Duration,
) -> (Vec<Instant>, Option<Status>) {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.unwrap();
    let end = Instant::now() + d;
    let outbound = stream::unfold(0u64, move |i| async move {
        if Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        Some((Bytes::from(i.to_string()), i + 1))
    });
    let response = client
        .streaming(
            tonic::Request::new(outbound),
            PathAndQuery::from_static(method),
            Raw,
        )
        .await;
    let mut inbound = match response {
        Ok(response) => response.into_inner(),
        Err(status) => return (Vec::new(), Some(status)),
    };
    let mut echoes = Vec::new();
    loop {
        match tokio::time::timeout_at(end, inbound.next()).await {
            Ok(Some(Ok(_))) => echoes.push(Instant::now()),
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
