//! gRPC refusals (feature `grpc`), seen by a stock tonic client over TCP.
#![cfg(feature = "grpc")]

use std::future::Ready;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tollgate::clock::FakeClock;
use tollgate::grpc::{Grpc, GrpcOnRejection};
use tollgate::key::PeerIp;
use tollgate::store::{Backend, Item, MemoryStore, Op, Resilient, Statuses, StoreError};
use tollgate::{FailurePolicy, Limit, Quota, RateLimitLayer};
use tonic::Code;
use tonic::transport::{Channel, Server, server::TcpIncoming};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

/// A tonic server (Health, SERVING) behind `layer`, on a free port.
async fn serve<St: tollgate::store::Store>(
    layer: RateLimitLayer<St, GrpcOnRejection>,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tokio::spawn(async move {
        let _keep = reporter;
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

#[tokio::test]
async fn a_tonic_client_decodes_the_code_the_pushback_and_every_detail() {
    // A frozen clock: the waits are exact.
    let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)));
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
        .grpc(Grpc::new())
        .on_rejection(GrpcOnRejection)
        .build()
        .unwrap();
    let mut health = client(serve(layer).await).await;
    for i in 0..10 {
        let response = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("call {i}: {e:?}"));
        assert_eq!(response.get_ref().status, 1, "SERVING");
        // Allowed calls carry the rate-limit fields as initial metadata.
        let left = 9 - i;
        let fields = response
            .metadata()
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap();
        assert!(
            fields.starts_with(&format!("\"per-ip\";r={left};t=")),
            "call {i}: {fields}"
        );
        assert_eq!(
            response.metadata().get("ratelimit-policy").unwrap(),
            "\"per-ip\";q=10;w=2"
        );
    }
    for _ in 0..5 {
        let status = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "rate limit \"per-ip\" exceeded; retry in 200 ms"
        );
        let md = status.metadata();
        assert_eq!(md.get("grpc-retry-pushback-ms").unwrap(), "200");
        assert_eq!(md.get("ratelimit").unwrap(), "\"per-ip\";r=0;t=1");
        let details = status.get_error_details();
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_millis(200))
        );
        let violations = &details.quota_failure().unwrap().violations;
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].subject, "per-ip");
        assert_eq!(violations[0].quota_id, "per-ip");
        assert_eq!(violations[0].quota_value, 10);
        assert_eq!(
            violations[0].description,
            "rate limit \"per-ip\": burst 10, refilled over 2 s"
        );
        let info = details.error_info().unwrap();
        assert_eq!(info.reason, "RATE_LIMIT_EXCEEDED");
        assert_eq!(info.domain, "tollgate");
        assert_eq!(info.metadata["limits"], "per-ip");
    }
}

#[tokio::test]
async fn the_code_is_configurable_and_a_cost_that_never_fits_has_no_pushback() {
    let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)));
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("tiny", Quota::per_second(1).burst(2))
                .cost(tollgate::Cost::header("x-cost").default(1)),
        )
        .grpc(Grpc::new().code(Code::Unavailable).domain("example.com"))
        .on_rejection(GrpcOnRejection)
        .build()
        .unwrap();
    let mut health = client(serve(layer).await).await;
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    request
        .metadata_mut()
        .insert("x-cost", "3".parse().unwrap());
    let status = health.check(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_none());
    let details = status.get_error_details();
    assert!(details.retry_info().is_none());
    assert_eq!(details.error_info().unwrap().domain, "example.com");
    assert_eq!(
        details.quota_failure().unwrap().violations[0].quota_id,
        "tiny"
    );
}

#[derive(Clone)]
struct Down;

impl Backend for Down {
    type Table = ();
    type Future = Ready<Result<Statuses, StoreError>>;
    fn table(&self, _: &str) {}
    fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
        std::future::ready(Err(StoreError::new("down")))
    }
}

#[tokio::test]
async fn a_store_failure_under_deny_answers_unavailable() {
    let layer = RateLimitLayer::builder(Resilient::new(Down))
        .limit(Limit::new("shared", Quota::per_second(5)).on_store_failure(FailurePolicy::Deny))
        .unavailable_retry_after(Duration::from_millis(1_500))
        .grpc(Grpc::new())
        .on_rejection(GrpcOnRejection)
        .build()
        .unwrap();
    let mut health = client(serve(layer).await).await;
    let status = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "rate limit store unavailable");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "1500"
    );
    let details = status.get_error_details();
    assert_eq!(
        details.retry_info().unwrap().retry_delay,
        Some(Duration::from_millis(1_500))
    );
    assert!(details.quota_failure().is_none());
    let info = details.error_info().unwrap();
    assert_eq!(info.reason, "RATE_LIMITER_UNAVAILABLE");
    assert_eq!(info.metadata["limits"], "shared");
}

#[tokio::test]
async fn http_and_grpc_routes_of_one_app_share_one_budget() {
    use axum::routing::get;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)));
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_minute(4)).key(PeerIp::new()))
        .grpc(Grpc::new())
        .build()
        .unwrap();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let app = axum::Router::new()
        .route("/hello", get(|| async { "hello" }))
        .merge(tonic::service::Routes::new(health).into_axum_router())
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _keep = reporter;
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let get_hello = || {
        let http = http.clone();
        async move {
            let r = http
                .get(format!("http://{addr}/hello").parse().unwrap())
                .await
                .unwrap();
            let status = r.status();
            let ct = r
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned());
            let _ = r.into_body().collect().await;
            (status.as_u16(), ct)
        }
    };
    let mut health = client(addr).await;
    let check = |h: &mut HealthClient<Channel>| {
        let mut h = h.clone();
        async move {
            h.check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|_| ())
            .map_err(|s| s.code())
        }
    };
    // Four tokens for the client, whichever protocol spends them.
    assert_eq!(get_hello().await.0, 200);
    assert_eq!(check(&mut health).await, Ok(()));
    assert_eq!(get_hello().await.0, 200);
    assert_eq!(check(&mut health).await, Ok(()));
    assert_eq!(check(&mut health).await, Err(Code::ResourceExhausted));
    assert_eq!(
        get_hello().await,
        (429, Some("application/problem+json".to_owned()))
    );
}

/// The `grpc` feature is additive: enabling it (here, for this test binary) changes
/// nothing for a layer whose builder did not ask for gRPC answers; a refused gRPC call
/// gets the usual HTTP 429.
#[tokio::test]
async fn a_layer_answers_grpc_calls_the_grpc_way_only_if_its_builder_asked() {
    use tower::{Service, ServiceExt};

    let request = || {
        http::Request::builder()
            .uri("/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    for (asked, status, content_type) in [
        (false, 429, "application/problem+json"),
        (true, 200, "application/grpc"),
    ] {
        let mut builder = RateLimitLayer::builder(MemoryStore::new())
            .limit(Limit::new("one", Quota::per_minute(1)));
        if asked {
            builder = builder.grpc(Grpc::new());
        }
        let layer = builder.build().unwrap();
        let mut svc = tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
            });
        let first = svc.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(first.status(), 200);
        let refused = svc.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(refused.status(), status, "asked for gRPC answers: {asked}");
        assert_eq!(refused.headers()["content-type"], content_type);
        assert_eq!(refused.headers().contains_key("grpc-status"), asked);
    }
}

/// A gRPC service that answers every unary call with one `HealthCheckResponse { status:
/// SERVING }` message and reports what the call used in its trailers (`grpc-status: 0`,
/// `x-usage-tokens: used`), as a model API reports the tokens a streamed answer used.
async fn serve_with_usage(
    layer: RateLimitLayer<MemoryStore<FakeClock>, GrpcOnRejection>,
    used: u32,
) -> SocketAddr {
    use bytes::Bytes;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;
    use tower::{Layer, service_fn};

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = service_fn(move |_: http::Request<hyper::body::Incoming>| async move {
        // One gRPC message frame: uncompressed, length 2, field 1 (status) = 1 (SERVING).
        let message = Bytes::from_static(&[0, 0, 0, 0, 2, 0x08, 0x01]);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        trailers.insert("x-usage-tokens", http::HeaderValue::from(used));
        let frames = futures_util::stream::iter([
            Ok::<_, std::convert::Infallible>(Frame::data(message)),
            Ok(Frame::trailers(trailers)),
        ]);
        let response = http::Response::builder()
            .header("content-type", "application/grpc")
            .body(tonic::body::Body::new(StreamBody::new(frames)))
            .unwrap();
        Ok::<_, std::convert::Infallible>(response)
    });
    let service = layer.layer(app);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Settled costs over gRPC: a stock tonic client calls a service that reports its usage
/// in a trailer; each call is admitted on its estimate (1) and settled at 30 when its
/// response ends, so the budget shrinks by 30 a call and the call that would overdraw it
/// past the debt is refused with RESOURCE_EXHAUSTED.
#[tokio::test]
async fn grpc_calls_settle_their_cost_from_a_trailer() {
    // A frozen clock: nothing refills between calls.
    let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)));
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("tokens", Quota::per_hour(100).burst(100))
                .key(tollgate::key::Header::new("x-api-key"))
                .settle(tollgate::Settle::trailer("x-usage-tokens"))
                .max_debt(20),
        )
        .grpc(Grpc::new())
        .on_rejection(GrpcOnRejection)
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let mut health = client(serve_with_usage(layer, 30).await).await;
    let call = || {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request
            .metadata_mut()
            .insert("x-api-key", "alice".parse().unwrap());
        request
    };
    // What the bucket holds once the server has seen the end of a call's body (the
    // settle happens there, not when the client has read it): waited for, not assumed.
    let settled_at = |left: u64| {
        let limiter = limiter.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let look = limiter.peek("tokens", "alice").await.unwrap();
                if look.remaining() == Some(left) {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never settled at {left}: {:?}",
                    look.remaining()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    for i in 0..3u64 {
        let response = health
            .check(call())
            .await
            .unwrap_or_else(|e| panic!("call {i}: {e:?}"));
        assert_eq!(response.get_ref().status, 1, "SERVING");
        // Admitted on the estimate of 1, after the 30 each earlier call settled at.
        let fields = response
            .metadata()
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap();
        let left = 100 - 30 * i - 1;
        assert!(
            fields.starts_with(&format!("\"tokens\";r={left};")),
            "call {i}: {fields}"
        );
        settled_at(100 - 30 * (i + 1)).await;
    }
    // 10 left: the estimate fits, and the call settles 20 into debt (the most allowed).
    health.check(call()).await.unwrap();
    settled_at(0).await;
    let refused = health.check(call()).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let look = limiter.peek("tokens", "alice").await.unwrap();
    assert_eq!(look.remaining(), Some(0));
}
