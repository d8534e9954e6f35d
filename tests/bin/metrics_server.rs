//! The server `tests/dashboards.rs` scrapes: every metric of tollgate's schema, served
//! as `GET /metrics` by the Prometheus exporter, behind limits that traffic can drive into
//! each state.
//!
//! `metrics_server <dead-redis-url>` binds a free loopback port, prints `port <p>`, and
//! serves until it is killed:
//!
//! - `GET /api` (header `x-client`): rules (`Rules`, memory store) with `per-client`
//!   (5/s, burst 10: refuses a busy client), `global` and the shadow limit `shadow-tight`
//!   (would refuse most). `GET /admin/reload?ok` and `?bad` reload them with valid and
//!   invalid text (`tollgate_reloads_total`, `tollgate_rules_healthy`).
//! - `GET /login` (header `x-client`): `login`, 2/min, bans a client after 2 refusals;
//!   its refusals go to an audit log whose sink is slow and fails every other batch, with
//!   a queue of 4 (`tollgate_audit_*`: written, failed and dropped).
//! - `GET /slow`: `smooth`, delay mode (the request waits for its token).
//! - `GET /tokens`: `tokens`, cost 10 settled from the response's `x-usage-tokens`,
//!   alternately 3 and 25 (given back, taken).
//! - `GET /download` (header `x-client`): 600 bytes paced by `download`, 1,000 bytes a
//!   second per client, ending the body over it (`tollgate_stream_units_total`, passed
//!   and refused).
//! - `GET /remote` (header `x-client`): `remote-open` (fails open) and `remote-fallback`
//!   (the local fallback answers) on a `RedisStore` at the given URL, where nothing
//!   listens: store errors, and the breaker opens (and probes the store each second).
//!
//! The recorder renders histograms with buckets (`_bucket`, `_sum`, `_count`), as the
//! dashboard's quantile panels need.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tollgate::audit::{AuditLog, BoxError, Violation};
use tollgate::key::Header;
use tollgate::pace::{OverLimit, PacedBody, Per};
use tollgate::rules::Rules;
use tollgate::store::regions::MoverSettings;
use tollgate::store::{MemoryStore, RedisStore};
use tollgate::{
    Ban, Cost, FailurePolicy, Limit, LimitSpec, Limiter, Quota, RateLimitLayer, Settle,
};

const RULES: &str = r#"
[[limits]]
name = "per-client"
key = "header:x-client"
quota = "5/s; burst=10"

[[limits]]
name = "shadow-tight"
key = "header:x-client"
quota = "1/s; burst=1"
mode = "shadow"

[[limits]]
name = "global"
quota = "1000/s"
"#;

#[derive(Clone)]
struct App {
    prometheus: PrometheusHandle,
    rules: Rules<MemoryStore>,
    usage: Arc<AtomicU64>,
    bytes: Limiter,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url = std::env::args()
        .nth(1)
        .ok_or("usage: metrics_server <dead-redis-url>")?;

    // The recorder first: layers and stores register their handles when built.
    let buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ];
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)?
        .install_recorder()?;

    let rules = Rules::builder(MemoryStore::new()).text(RULES).build()?;

    let writes = Arc::new(AtomicU64::new(0));
    let sink = move |_batch: Vec<Violation>| {
        let n = writes.fetch_add(1, Ordering::Relaxed);
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            match n % 2 {
                0 => Ok(()),
                _ => Err::<(), BoxError>("the audit database is down".into()),
            }
        }
    };
    let audit = AuditLog::builder(sink)
        .capacity(4)
        .batch_size(2)
        .flush_interval(Duration::from_millis(50))
        .build()?;
    let login = RateLimitLayer::builder(MemoryStore::new())
        .limit(
            Limit::new("login", Quota::per_minute(2))
                .key(Header::new("x-client"))
                .ban(
                    Ban::after(2)
                        .within(Duration::from_secs(60))
                        .for_(Duration::from_secs(600)),
                ),
        )
        .audit(audit)
        .build()?;

    let smooth = RateLimitLayer::builder(MemoryStore::new())
        .limit(
            Limit::new("smooth", Quota::per_second(20).burst(1)).delay(Duration::from_secs(1), 64),
        )
        .build()?;

    let tokens = RateLimitLayer::builder(MemoryStore::new())
        .limit(
            Limit::new("tokens", Quota::per_second(1000).burst(1000))
                .cost(Cost::from(10))
                .settle(Settle::header("x-usage-tokens")),
        )
        .build()?;

    let store = RedisStore::open(&redis_url)?
        .timeout(Duration::from_millis(100))
        // A short cool-down: the breaker lets a request probe the store every second, so
        // errors keep coming while it is open.
        .breaker(3, Duration::from_secs(1));
    // A limit across two regions whose stores are nowhere: the region metrics are there.
    let mover = RedisStore::regions([("eu", store.clone()), ("us", store.clone())], "eu")?.mover(
        [("remote-open", Quota::per_second(100))],
        MoverSettings::new(),
        "metrics-server",
        1,
    );
    tokio::spawn(mover.run());
    let remote = RateLimitLayer::builder(store)
        .limit(
            Limit::new("remote-open", Quota::per_second(100))
                .key(Header::new("x-client"))
                .on_store_failure(FailurePolicy::Allow),
        )
        .limit(
            Limit::new("remote-fallback", Quota::per_second(2).burst(2))
                .key(Header::new("x-client"))
                .on_store_failure(FailurePolicy::Fallback),
        )
        .build()?;

    let bytes = Limiter::builder(MemoryStore::new())
        .limit(
            LimitSpec::new("download", Quota::per_second(1000).burst(1000))
                .per(Per::Byte)
                .over_limit(OverLimit::End),
        )
        .build()?;

    let app = App {
        prometheus,
        rules: rules.clone(),
        usage: Arc::new(AtomicU64::new(0)),
        bytes,
    };
    let router = Router::new()
        .merge(
            Router::new()
                .route("/api", get(|| async { "api\n" }))
                .route_layer(rules.layer()),
        )
        .merge(
            Router::new()
                .route("/login", get(|| async { "welcome\n" }))
                .route_layer(login),
        )
        .merge(
            Router::new()
                .route("/slow", get(|| async { "smooth\n" }))
                .route_layer(smooth),
        )
        .merge(
            Router::new()
                .route("/tokens", get(tokens_handler))
                .route_layer(tokens),
        )
        .merge(
            Router::new()
                .route("/remote", get(|| async { "remote\n" }))
                .route_layer(remote),
        )
        .route("/download", get(download))
        .route("/admin/reload", get(reload))
        .route("/metrics", get(metrics))
        .with_state(app);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("port {}", listener.local_addr()?.port());
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// Alternately uses 3 and 25 tokens of the 10 estimated.
async fn tokens_handler(State(app): State<App>) -> ([(&'static str, String); 1], &'static str) {
    let n = app.usage.fetch_add(1, Ordering::Relaxed);
    let used = if n % 2 == 0 { 3 } else { 25 };
    ([("x-usage-tokens", used.to_string())], "tokens\n")
}

/// 600 bytes paced per client (`x-client`).
async fn download(State(app): State<App>, headers: axum::http::HeaderMap) -> axum::body::Body {
    let client = headers
        .get("x-client")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    let body = axum::body::Body::from(vec![b'x'; 600]);
    match app.bytes.pacer("download", client) {
        Ok(pacer) => axum::body::Body::new(PacedBody::new(body, pacer)),
        Err(_) => body,
    }
}

/// `?ok` reloads the same rules, `?bad` an invalid text.
async fn reload(State(app): State<App>, RawQuery(query): RawQuery) -> (StatusCode, String) {
    let text = match query.as_deref() {
        Some("ok") => RULES,
        _ => "[[limits]]\nname = \"broken\"\nquota = \"many\"\n",
    };
    match app.rules.reload(text) {
        Ok(()) => (StatusCode::OK, "reloaded\n".into()),
        Err(e) => (StatusCode::UNPROCESSABLE_ENTITY, format!("{e}\n")),
    }
}

async fn metrics(State(app): State<App>) -> String {
    app.prometheus.run_upkeep();
    app.prometheus.render()
}
