//! A tonic chat (a bidirectional stream) with a per-user message limit (feature `grpc`).
//!
//! `chat.Chat/Talk` echoes every message it reads. `tollgate::grpc::StreamLimitLayer`
//! charges each message the client sends to the limit `chat-messages`: 10 a second per
//! user (the `x-user` metadata of the call), 5 at once. Over the limit the call ends with
//! `RESOURCE_EXHAUSTED`, `grpc-retry-pushback-ms` and the error details; `WAIT=1` makes it
//! wait instead (HTTP/2 flow control slows the client). The messages are raw bytes (no
//! protobuf needed for an echo).
//!
//! # Run it
//!
//! ```text
//! cargo run -p tollgate --example grpc_chat --features grpc     # PORT=50051 to move it
//! ```
//!
//! `DEMO=1` opens a call as `alice`, sends 20 messages as fast as it can and prints the
//! echoes and the status the call ended with.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use futures_util::{Stream, StreamExt};
use tollgate::grpc::StreamLimitLayer;
use tollgate::pace::{OverLimit, Per};
use tollgate::store::MemoryStore;
use tollgate::{LimitSpec, Limiter, Quota};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::server::TcpIncoming;
use tonic::{Status, Streaming};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let over = if std::env::var_os("WAIT").is_some() {
        OverLimit::wait(Duration::from_secs(10))
    } else {
        OverLimit::End
    };
    let limiter = Limiter::builder(MemoryStore::new())
        .limit(
            LimitSpec::new("chat-messages", Quota::per_second(10).burst(5))
                .per(Per::Message)
                .over_limit(over),
        )
        .build()?;
    // The key, once per call: its `x-user` metadata (from your authentication, in a real
    // service); calls without one are not limited here.
    let layer = StreamLimitLayer::new(limiter, "chat-messages", ["/chat.Chat/Talk"], |parts| {
        let user = parts.headers.get("x-user")?.to_str().ok()?;
        Some(tollgate::key::IntoKey::into_key(user))
    });
    let port = std::env::var("PORT").unwrap_or_else(|_| "50051".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr} (chat.Chat/Talk)");
    let server = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(Chat)
        .serve_with_incoming(TcpIncoming::from(listener));
    if std::env::var_os("DEMO").is_some() {
        tokio::spawn(server);
        return demo(addr).await;
    }
    server.await?;
    Ok(())
}

/// Messages as raw bytes.
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

/// The `chat.Chat` service.
#[derive(Clone, Copy)]
struct Chat;

impl tonic::server::NamedService for Chat {
    const NAME: &'static str = "chat.Chat";
}

/// `Talk`: every message read is echoed; a read that fails (the limit's
/// `RESOURCE_EXHAUSTED`) ends the call with its status.
#[derive(Clone, Copy)]
struct Talk;

impl tower::Service<tonic::Request<Streaming<Bytes>>> for Talk {
    type Response = tonic::Response<Echoes>;
    type Error = Status;
    type Future = std::future::Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let echoes: Echoes = Box::pin(request.into_inner());
        std::future::ready(Ok(tonic::Response::new(echoes)))
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
        Box::pin(async move {
            if req.uri().path() != "/chat.Chat/Talk" {
                return Ok(Status::unimplemented("chat.Chat has only Talk").into_http());
            }
            Ok(tonic::server::Grpc::new(Raw).streaming(Talk, req).await)
        })
    }
}

/// A call as `alice`: 20 messages at once, then the echoes and the final status.
async fn demo(addr: std::net::SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await?;
    let messages = futures_util::stream::iter((0..20).map(|i| Bytes::from(format!("hello {i}"))));
    let mut request = tonic::Request::new(messages);
    request.metadata_mut().insert("x-user", "alice".parse()?);
    let path = http::uri::PathAndQuery::from_static("/chat.Chat/Talk");
    let mut echoes = client.streaming(request, path, Raw).await?.into_inner();
    let mut count = 0;
    loop {
        match echoes.next().await {
            Some(Ok(_)) => count += 1,
            Some(Err(status)) => {
                let pushback = status
                    .metadata()
                    .get("grpc-retry-pushback-ms")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-");
                println!(
                    "{count} echoes, then {:?}: {} (grpc-retry-pushback-ms: {pushback})",
                    status.code(),
                    status.message()
                );
                return Ok(());
            }
            None => {
                println!("{count} echoes, then the call ended OK");
                return Ok(());
            }
        }
    }
}
