//! Shared helpers for the integration tests: requests through an axum router with a fake
//! peer address, header assertions, and (with the `redis` feature) throwaway Redis servers.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

pub mod example;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis-tls")]
pub mod tls;

/// A GET request from `peer`.
pub fn get(path: &str, peer: &str) -> Request<Body> {
    with_peer(Request::get(path).body(Body::empty()).unwrap(), peer)
}

/// Adds the connection info axum would add for a client at `peer`.
pub fn with_peer(mut req: Request<Body>, peer: &str) -> Request<Body> {
    let addr: SocketAddr = SocketAddr::new(peer.parse().unwrap(), 40_000);
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

/// Sends `req` through `app`.
pub async fn send(app: &Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

/// Sends `n` requests and returns their statuses.
pub async fn statuses(app: &Router, n: usize, make: impl Fn() -> Request<Body>) -> Vec<StatusCode> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(send(app, make()).await.status());
    }
    out
}

/// How many of `statuses` are `status`.
pub fn count(statuses: &[StatusCode], status: StatusCode) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

/// All values of a header, joined as one list (a split field is the same field).
pub fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ASCII header"))
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// The body as text.
pub async fn body_text(response: Response<Body>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The body as JSON.
pub async fn body_json(response: Response<Body>) -> serde_json::Value {
    serde_json::from_str(&body_text(response).await).unwrap()
}

/// Asserts that a `RateLimit` / `RateLimit-Policy` value is a valid structured-field list
/// and returns its members' names.
pub fn sf_names(value: &str) -> Vec<String> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value}: {e}"));
    list.iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => match &item.bare_item {
                sfv::BareItem::String(s) => s.as_str().to_owned(),
                other => panic!("policy name must be a string, got {other:?}"),
            },
            other => panic!("inner list in {value}: {other:?}"),
        })
        .collect()
}

/// The integer parameter `param` of the member `name` of a structured-field list.
pub fn sf_param(value: &str, name: &str, param: &str) -> Option<i64> {
    let list: sfv::List = sfv::Parser::new(value).parse().unwrap();
    list.iter().find_map(|entry| match entry {
        sfv::ListEntry::Item(item) => match &item.bare_item {
            sfv::BareItem::String(s) if s.as_str() == name => item
                .params
                .iter()
                .find(|(k, _)| k.as_str() == param)
                .and_then(|(_, v)| v.as_integer())
                .map(i64::from),
            _ => None,
        },
        _ => None,
    })
}

/// Log lines written while a test runs, through a subscriber for the current thread.
#[derive(Clone, Default)]
pub struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// Installs a subscriber at the default level (INFO) for the current thread.
    ///
    /// `tracing` caches whether a log statement is wanted once for the whole process, when
    /// some thread first reaches it, and asks that thread's subscriber. A sibling test
    /// running without a subscriber would pin the statement to "never", and this thread's
    /// capture would miss its lines (seen once in CI:
    /// `a_deleted_database_file_is_reported_not_read_silently_and_a_new_one_is_picked_up`
    /// captured none of its "is gone" lines). So the first capture of a test binary installs
    /// a global subscriber that keeps nothing but wants everything, and each capture has
    /// the cached answers asked again: a statement is then wanted wherever some subscriber
    /// wants it, and each thread's own subscriber decides what it keeps.
    pub fn capture(&self) -> tracing::subscriber::DefaultGuard {
        static ANCHOR: std::sync::Once = std::sync::Once::new();
        ANCHOR.call_once(|| {
            // Fails only if a global subscriber is already set, which then anchors too.
            let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
        });
        let lines = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || lines.clone())
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
        guard
    }

    /// The lines that contain `text`.
    pub fn matching(&self, text: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}
