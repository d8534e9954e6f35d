//! Different limits for different routes, two ways:
//!
//! - (a) **a layer per route**: build several layers and attach each where it belongs,
//!   with `MethodRouter::route_layer` (one method of one path) or `Router::route_layer`
//!   on a sub-router (all its routes);
//! - (b) **one layer with a route table**: `.route("POST /login", ..)`, `.route("/search", ..)`
//!   and `.route_default(..)`, matched against axum's `MatchedPath` (`/users/{id}`, not the
//!   raw URL) and the method.
//!
//! Limits with the same name in the same store share their buckets, whichever routes or
//! layers they are attached to: here `/reports/daily` and `/reports/monthly` share
//! `reports`, and `POST /login` and `POST /password-reset` share `auth`.
//!
//! Run it:
//!
//! ```text
//! cargo run -p tollgate --example per_route            # or PORT=8080 cargo run -p tollgate --example per_route
//! ```
//!
//! Every handler answers with the limits that applied to it and what is left of each.
//!
//! (a) `POST /items` allows 3 at once, and `GET /items` has a bucket of its own:
//!
//! ```text
//! for i in $(seq 4); do curl -s -o /dev/null -w '%{http_code} ' -X POST http://127.0.0.1:3000/items; done; echo
//! # 200 200 200 429
//! curl http://127.0.0.1:3000/items
//! # items-read=9
//! ```
//!
//! (a) the two report routes share one bucket of 4 per minute:
//!
//! ```text
//! for r in daily monthly daily monthly daily; do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/reports/$r; done; echo
//! # 200 200 200 200 429
//! ```
//!
//! (b) logins and password resets share the `auth` bucket of 5 per minute:
//!
//! ```text
//! for p in login login login password-reset password-reset password-reset; do curl -s -o /dev/null -w '%{http_code} ' -X POST http://127.0.0.1:3000/$p; done; echo
//! # 200 200 200 200 200 429
//! ```
//!
//! (b) the headers list every limit of the request, the layer-wide `per-ip` and the
//! route's own; a third search within a second gets a 429:
//!
//! ```text
//! curl -i http://127.0.0.1:3000/search
//! # ratelimit-policy: "per-ip";q=20;w=2, "search";q=2;w=1
//! # ratelimit: "per-ip";r=19;t=1, "search";r=1;t=1
//! ```
//!
//! `GET /` has no entry in the table, so it gets the `route_default` limit, `other`.

use std::net::SocketAddr;

use axum::{
    Extension, Router,
    routing::{get, post},
};
use tollgate::{
    ConfigError, Decision, Limit, Quota, RateLimitLayer, key::PeerIp, store::MemoryStore,
};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    // One store for both parts. Clones share their state, and buckets are found by limit
    // name: the names of the two parts are kept distinct so that they do not mix.
    let store = MemoryStore::new();
    let app = Router::new()
        .merge(layer_per_route(&store)?)
        .merge(route_table(&store)?);

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "try: for i in $(seq 4); do curl -s -o /dev/null -w '%{{http_code}} ' -X POST http://{addr}/items; done; echo"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// A layer with a single per-IP limit.
fn per_ip(
    store: &MemoryStore,
    name: &str,
    quota: Quota,
) -> Result<RateLimitLayer<MemoryStore>, ConfigError> {
    RateLimitLayer::builder(store.clone())
        .limit(Limit::new(name, quota).key(PeerIp::new()))
        .build()
}

/// (a) Each route gets its own layer.
fn layer_per_route(store: &MemoryStore) -> Result<Router, ConfigError> {
    let reads = per_ip(store, "items-read", Quota::per_second(5).burst(10))?;
    let writes = per_ip(store, "items-write", Quota::per_second(1).burst(3))?;
    let reports = per_ip(store, "reports", Quota::per_minute(4))?;

    // A layer on a sub-router applies to each of its routes, with one bucket per client
    // for all of them.
    let report_routes = Router::new()
        .route("/reports/daily", get(report))
        .route("/reports/monthly", get(report))
        .route_layer(reports);

    Ok(Router::new()
        // `MethodRouter::route_layer` limits just that method. Routing the same path twice
        // merges the methods, each keeping its own layer (chaining
        // `get(..).route_layer(a).post(..).route_layer(b)` would put `b` on GET as well).
        .route("/items", get(report).route_layer(reads))
        .route("/items", post(report).route_layer(writes))
        .merge(report_routes))
}

/// (b) One layer for all routes, with a table of per-route limits.
fn route_table(store: &MemoryStore) -> Result<Router, ConfigError> {
    let auth = Limit::new("auth", Quota::per_minute(5)).key(PeerIp::new());
    let limits = RateLimitLayer::builder(store.clone())
        // Checked on every request this layer sees, on top of the route's own limits.
        .limit(Limit::new("per-ip", Quota::per_second(10).burst(20)).key(PeerIp::new()))
        // Two entries, one name: a client has 5 attempts per minute over both routes.
        .route("POST /login", auth.clone())
        .route("POST /password-reset", auth)
        // Without a method, the entry applies to every method of the path.
        .route(
            "/search",
            Limit::new("search", Quota::per_second(2)).key(PeerIp::new()),
        )
        // Routes without an entry (here `GET /`).
        .route_default(Limit::new("other", Quota::per_second(5)).key(PeerIp::new()))
        .build()?;

    Ok(Router::new()
        .route("/", get(report))
        .route("/login", post(report))
        .route("/password-reset", post(report))
        .route("/search", get(report))
        // `route_layer`, not `layer`: the route table needs the matched path, which only
        // exists once the router has matched a route.
        .route_layer(limits))
}

/// Answers with the limits that applied and the tokens left in each, e.g. `per-ip=19 search=1`.
async fn report(Extension(decision): Extension<Decision>) -> String {
    let limits: Vec<String> = decision
        .limits()
        .map(|l| format!("{}={}", l.name(), l.remaining().unwrap_or(0)))
        .collect();
    limits.join(" ") + "\n"
}
