//! A tonic gRPC server behind tollgate: `grpc.health.v1.Health` (SERVING) and a small
//! `tollgate.example.Echo/Say` service, limited per peer IP to 5 calls per second, bursts
//! of 10. Refusals are real gRPC answers: `RESOURCE_EXHAUSTED`, `grpc-retry-pushback-ms`,
//! and `RetryInfo`, `QuotaFailure` and `ErrorInfo` in `grpc-status-details-bin`.
//!
//! ```text
//! cargo run -p tollgate --example grpc_server --features grpc          # 127.0.0.1:50051, or PORT=...
//! cargo run -p tollgate --example grpc_client --features grpc          # 15 Health/Check calls
//! ```
//!
//! With grpcurl (the server has no reflection: give it the proto, or use the client):
//!
//! ```text
//! for i in $(seq 15); do grpcurl -plaintext -import-path . -proto health.proto \
//!     127.0.0.1:50051 grpc.health.v1.Health/Check; done
//! ```

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::pin::Pin;
use std::task::{Context, Poll};

use tollgate::grpc::{Grpc, GrpcOnRejection};
use tollgate::{Limit, Quota, RateLimitLayer, key::PeerIp, store::MemoryStore};
use tonic::body::Body;
use tonic::transport::Server;
use tracing_subscriber::EnvFilter;

/// `tollgate.example.EchoRequest { string text = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
struct EchoRequest {
    #[prost(string, tag = "1")]
    text: String,
}

/// `tollgate.example.EchoReply { string text = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
struct EchoReply {
    #[prost(string, tag = "1")]
    text: String,
}

/// `service Echo { rpc Say(EchoRequest) returns (EchoReply); }`, written by hand (what
/// tonic-build would generate), so the example needs no `protoc`.
#[derive(Clone, Default)]
struct EchoServer;

impl tonic::server::NamedService for EchoServer {
    const NAME: &'static str = "tollgate.example.Echo";
}

struct Say;

impl tonic::server::UnaryService<EchoRequest> for Say {
    type Response = EchoReply;
    type Future = Ready<Result<tonic::Response<EchoReply>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<EchoRequest>) -> Self::Future {
        let text = request.into_inner().text;
        ready(Ok(tonic::Response::new(EchoReply {
            text: format!("echo: {text}"),
        })))
    }
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl tower::Service<http::Request<Body>> for EchoServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        match request.uri().path() {
            "/tollgate.example.Echo/Say" => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.unary(Say, request).await)
            }),
            _ => Box::pin(async { Ok(tonic::Status::unimplemented("no such method").into_http()) }),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status(
            "tollgate.example.Echo",
            tonic_health::ServingStatus::Serving,
        )
        .await;

    // `PeerIp` reads the peer address tonic's server puts in each request.
    let limits = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::new("per-peer", Quota::per_second(5).burst(10)).key(PeerIp::new()))
        // Every refusal of this layer answers the gRPC way (the content-type says so anyway).
        .grpc(Grpc::new().always(true).domain("tollgate.example"))
        // tonic's body type has no `From<Bytes>`: empty-bodied rejections.
        .on_rejection(GrpcOnRejection)
        .build()?;

    let port = std::env::var("PORT").unwrap_or_else(|_| "50051".into());
    let addr = format!("127.0.0.1:{port}").parse()?;
    println!("gRPC on {addr}: grpc.health.v1.Health, tollgate.example.Echo");
    Server::builder()
        .layer(limits)
        .add_service(health)
        .add_service(EchoServer)
        .serve(addr)
        .await?;
    Ok(())
}
