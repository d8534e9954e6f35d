//! A password planted in every Redis URL (and, with `redis-tls`, a client key) never shows
//! in what an operator sees: log lines at every level, errors, `Debug` output and metric
//! names and labels. Real `redis-server` processes: a store that logs in, one whose
//! password is refused, one whose server is gone.
//!
//! One test in this binary: it captures the logs of its own thread (current-thread
//! runtime, so the stores' tasks log there too) at `TRACE`.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::redis::{RedisServer, reserve_port};
use support::{Lines, get as req, send};
use tollgate::key::PeerIp;
use tollgate::store::RedisStore;
use tollgate::{FailurePolicy, Limit, Quota, RateLimitLayer};

const PLANTED: &str = "planted-Pa55word-7f3c";

/// Everything shown, each with where it came from.
#[derive(Default)]
struct Shown(Vec<(String, String)>);

impl Shown {
    fn add(&mut self, what: impl Into<String>, text: impl Into<String>) {
        self.0.push((what.into(), text.into()));
    }

    fn error(&mut self, what: &str, err: &tollgate::ConfigError) {
        self.add(format!("{what} (Display)"), err.to_string());
        self.add(format!("{what} (Debug)"), format!("{err:?}"));
        assert!(err.to_string().contains("***"), "{what}: {err}");
    }

    /// Panics naming each place that shows `secret`.
    fn assert_without(&self, secret: &str) {
        let leaks: Vec<&(String, String)> =
            self.0.iter().filter(|(_, t)| t.contains(secret)).collect();
        assert!(leaks.is_empty(), "{secret:?} shown in: {leaks:#?}");
    }
}

fn layer(store: RedisStore, name: &str) -> RateLimitLayer<RedisStore> {
    RateLimitLayer::builder(store.timeout(Duration::from_secs(2)))
        .limit(
            Limit::new(name, Quota::per_minute(2))
                .key(PeerIp::new())
                .on_store_failure(FailurePolicy::Deny),
        )
        .build()
        .unwrap()
}

fn app(layer: RateLimitLayer<RedisStore>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer)
}

/// Installs a subscriber keeping every level for this thread.
fn capture(lines: &Lines) -> tracing::subscriber::DefaultGuard {
    let lines = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || lines.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    guard
}

#[tokio::test]
async fn a_planted_password_is_in_no_log_error_debug_output_or_metric() {
    let lines = Lines::default();
    let _guard = capture(&lines);
    let mut shown = Shown::default();

    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("on")
        .arg(format!(">{PLANTED}"))
        .arg("~*")
        .arg("+@all")
        .query_async(&mut admin)
        .await
        .unwrap();
    let port = server.port();
    let url = format!("redis://app:{PLANTED}@127.0.0.1:{port}/");
    let wrong = format!("redis://app:{PLANTED}-wrong@127.0.0.1:{port}/");
    let gone = format!("redis://app:{PLANTED}@127.0.0.1:{}/", reserve_port());

    #[cfg(feature = "metrics")]
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    #[cfg(feature = "metrics")]
    let snapshotter = recorder.snapshotter();
    let build = || {
        (
            layer(RedisStore::open(&url).unwrap(), "ok"),
            layer(RedisStore::open_pool(&wrong, 2).unwrap(), "refused"),
            layer(RedisStore::open(&gone).unwrap(), "gone"),
        )
    };
    #[cfg(feature = "metrics")]
    let layers = ::metrics::with_local_recorder(&recorder, build);
    #[cfg(not(feature = "metrics"))]
    let layers = build();
    let (ok, refused, gone_layer) = layers;
    for (what, layer) in [("ok", &ok), ("refused", &refused), ("gone", &gone_layer)] {
        shown.add(format!("{what} layer (Debug)"), format!("{layer:?}"));
    }

    // Decisions by Redis through the user that logs in; refusals logged.
    let ok = app(ok);
    let deadline = Instant::now() + Duration::from_secs(10);
    while send(&ok, req("/", "192.0.2.1")).await.status() != StatusCode::OK {
        assert!(Instant::now() < deadline, "the user never logged in");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..3 {
        send(&ok, req("/", "192.0.2.1")).await;
    }
    assert_eq!(
        send(&ok, req("/", "192.0.2.1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // A refused password and a server that is gone: failures, the breaker, its logs.
    for app in [app(refused), app(gone_layer)] {
        for _ in 0..6 {
            assert_eq!(
                send(&app, req("/", "192.0.2.2")).await.status(),
                StatusCode::SERVICE_UNAVAILABLE
            );
        }
    }

    // Configuration errors name the URL, its password hidden.
    let bad = format!("redis://app:{PLANTED}@127.0.0.1:notaport/");
    shown.error("open, bad port", &RedisStore::open(&bad).unwrap_err());
    shown.error(
        "open_pool, bad scheme",
        &RedisStore::open_pool(&format!("http://app:{PLANTED}@127.0.0.1/"), 2).unwrap_err(),
    );
    shown.error(
        "open, password in the query",
        &RedisStore::open(&format!("redis+x://127.0.0.1/?password={PLANTED}")).unwrap_err(),
    );
    #[cfg(not(feature = "redis-tls"))]
    shown.error(
        "rediss without the feature",
        &RedisStore::open(&format!("rediss://app:{PLANTED}@127.0.0.1:6380/")).unwrap_err(),
    );
    #[cfg(feature = "redis-sentinel")]
    shown.error(
        "sentinel",
        &RedisStore::sentinel([bad.as_str()], "mymaster").unwrap_err(),
    );
    #[cfg(feature = "redis-tls")]
    let key_lines = tls(&mut shown).await;

    let store = RedisStore::open(&url).unwrap();
    shown.add("store (Debug)", format!("{store:?}"));
    shown.add("lease stats (Debug)", format!("{:?}", store.lease_stats()));

    #[cfg(feature = "metrics")]
    {
        let series: Vec<String> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, _)| format!("{:?}", key.key()))
            .collect();
        assert!(!series.is_empty(), "no metric recorded");
        for s in series {
            shown.add("metric", s);
        }
    }

    let logged = lines.matching("");
    assert!(
        logged.iter().any(|l| l.contains("WARN")),
        "the failures were logged: {logged:#?}"
    );
    for line in logged {
        shown.add("log line", line);
    }
    shown.assert_without(PLANTED);
    #[cfg(feature = "redis-tls")]
    for line in key_lines {
        shown.assert_without(&line);
    }
}

/// A client key's PEM body lines, none of which may be shown: a store over mutual TLS
/// whose certificate the server refuses (another CA), and one that logs in.
#[cfg(feature = "redis-tls")]
async fn tls(shown: &mut Shown) -> Vec<String> {
    use support::tls::{Pki, start_tls};
    use tollgate::store::RedisTls;

    let pki = Pki::new();
    let other = Pki::new();
    let (_server, port) = start_tls(&pki, true, &[]);
    let url = format!("rediss://127.0.0.1:{port}/");
    let good = RedisTls::new()
        .ca_pem(&pki.ca)
        .unwrap()
        .client_pem(&pki.client_cert, &pki.client_key)
        .unwrap();
    let foreign = RedisTls::new()
        .ca_pem(&pki.ca)
        .unwrap()
        .client_pem(&other.client_cert, &other.client_key)
        .unwrap();
    shown.add("RedisTls (Debug)", format!("{good:?}"));
    shown.add(
        "TlsCertificates (Debug)",
        format!("{:?}", good.certificates()),
    );
    let ok = app(layer(RedisStore::open_tls(&url, 1, &good).unwrap(), "tls"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while send(&ok, req("/", "192.0.2.3")).await.status() != StatusCode::OK {
        assert!(Instant::now() < deadline, "never connected over mutual TLS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = app(layer(
        RedisStore::open_tls(&url, 1, &foreign).unwrap(),
        "tls-refused",
    ));
    for _ in 0..4 {
        send(&refused, req("/", "192.0.2.4")).await;
    }
    shown.error(
        "open_tls with a redis:// URL",
        &RedisStore::open_tls(&format!("redis://app:{PLANTED}@127.0.0.1/"), 1, &good).unwrap_err(),
    );
    [&pki.client_key, &other.client_key]
        .iter()
        .flat_map(|pem| pem.lines())
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(str::to_owned)
        .collect()
}
