//! The same layer on a plain hyper 1 server through hyper-util's tower adapter, over a real
//! TCP connection: no axum anywhere on the server side.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tollgate::key::{PeerAddr, PeerIp};
use tollgate::store::MemoryStore;
use tollgate::{Limit, Quota, RateLimitLayer};
use tower::ServiceBuilder;

async fn hello(_: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

async fn serve(listener: TcpListener, limits: RateLimitLayer<MemoryStore>) {
    loop {
        let (stream, remote) = listener.accept().await.unwrap();
        let service = ServiceBuilder::new()
            .map_request(move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(PeerAddr(remote));
                req
            })
            .layer(limits.clone())
            .service_fn(hello);
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                .await;
        });
    }
}

#[tokio::test]
async fn a_plain_hyper_server_is_limited_and_gets_the_headers() {
    let limits = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::new("per-ip", Quota::per_minute(3)).key(PeerIp::new()))
        .build()
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, limits));

    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = client
            .request(
                Request::get(format!("http://{addr}/"))
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = r.status();
        let headers = r.headers().clone();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        seen.push(status);
        if status == StatusCode::OK {
            assert_eq!(&body[..], b"hello");
            assert_eq!(headers["ratelimit-policy"], r#""per-ip";q=3;w=60"#);
        } else {
            assert_eq!(headers["retry-after"], "20");
            assert_eq!(headers["content-type"], "application/problem+json");
            let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(problem["violated-policies"][0], "per-ip");
        }
    }
    assert_eq!(
        seen,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn plain_hyper_routes_match_templates_on_the_path() {
    let limits = RateLimitLayer::builder(MemoryStore::new())
        .route(
            "/users/{id}",
            Limit::new("users", Quota::per_minute(2)).key(PeerIp::new()),
        )
        .route_default(Limit::new("default", Quota::per_minute(100)).key(PeerIp::new()))
        .build()
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, limits));

    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let mut seen = Vec::new();
    for path in ["/users/7", "/users/8", "/users/7", "/elsewhere"] {
        let r = client
            .request(
                Request::get(format!("http://{addr}{path}"))
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        let policy = r.headers()["ratelimit-policy"].to_str().unwrap().to_owned();
        seen.push((path, r.status(), policy));
    }
    let users = r#""users";q=2;w=60"#;
    assert_eq!(
        seen,
        [
            ("/users/7", StatusCode::OK, users.to_owned()),
            ("/users/8", StatusCode::OK, users.to_owned()),
            ("/users/7", StatusCode::TOO_MANY_REQUESTS, users.to_owned()),
            (
                "/elsewhere",
                StatusCode::OK,
                r#""default";q=100;w=60"#.to_owned()
            ),
        ],
        "/users/7 and /users/8 share the route's limit"
    );
}
