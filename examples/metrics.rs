//! Metrics: the quickstart's two limits, reported through the `metrics` facade to a
//! Prometheus recorder, served as `GET /metrics` on the same port.
//!
//! ```text
//! cargo run -p tollgate --example metrics --features metrics        # or PORT=8080 ...
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/; done; echo
//! curl -s http://127.0.0.1:3000/metrics | grep '^tollgate_'
//! ```
//!
//! ```text
//! 200 200 200 200 200 200 200 200 200 200 429 429
//! tollgate_requests_total{limit="per-ip",result="allowed"} 10
//! tollgate_requests_total{limit="per-ip",result="denied"} 2
//! tollgate_requests_total{limit="global",result="allowed"} 12
//! tollgate_near_limit_total{limit="per-ip"} 2
//! tollgate_keys{limit="per-ip"} 1
//! ...
//! ```
//!
//! The recorder is installed **before** the layer is built: the layer registers its
//! counters once, at build time, and a request only adds to them.

use std::net::SocketAddr;

use axum::{Router, routing::get};
use metrics_exporter_prometheus::PrometheusBuilder;
use tollgate::{Limit, Quota, RateLimitLayer, key::PeerIp, store::MemoryStore};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    // 1. The recorder (no HTTP listener of its own: `/metrics` is a route of the app).
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    // 2. The quickstart's limits.
    let limits = RateLimitLayer::builder(MemoryStore::new())
        .limit(Limit::new("per-ip", Quota::per_minute(10)).key(PeerIp::new()))
        .limit(Limit::new("global", Quota::per_second(100).burst(200)))
        .build()?;

    // `/metrics` is above the route layer's routes: not limited.
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route_layer(limits)
        .route(
            "/metrics",
            get(move || {
                let prometheus = prometheus.clone();
                async move {
                    // Keeps the exporter's histograms tidy; cheap.
                    prometheus.run_upkeep();
                    prometheus.render()
                }
            }),
        );

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; metrics on http://{addr}/metrics");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
