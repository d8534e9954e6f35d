//! Limits from a rules file, reloaded while the server runs.
//!
//! ```text
//! cargo run --example rules_server --features rules    # RULES=path (default examples/rules.toml), PORT=3000
//! ```
//!
//! It prints the rules at start, after each reload, and each refused reload (the running
//! rules stay). Try:
//!
//! ```text
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/; done; echo
//! # 200 200 200 200 200 200 200 200 200 200 429 429
//! curl -i -X POST -H 'x-user: alice' http://127.0.0.1:3000/login
//! curl -i 'http://127.0.0.1:3000/api/search?pages=3'
//! curl -i http://127.0.0.1:3000/health                 # never limited
//! # Edit examples/rules.toml (say, per-ip to "1/s"): reloaded at once.
//! # Break it (quota = "1/fortnight"): the error is printed, the old rules keep serving.
//! kill -HUP <pid>                                       # reloads too
//! ```

use std::net::SocketAddr;

use axum::{
    Router,
    routing::{get, post},
};
use tollgate::{rules::Rules, store::MemoryStore};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    let path = std::env::var("RULES").unwrap_or_else(|_| "examples/rules.toml".into());
    // The source of rules is pluggable: `.text(..)` or `.document(..)` instead of `.file`,
    // and `rules.reload_document(doc)` for rules read from elsewhere (e.g. a database).
    let rules = Rules::builder(MemoryStore::new())
        .file(&path)
        .on_reload(|outcome| match outcome {
            Ok(doc) => println!("rules loaded:\n{doc}"),
            Err(e) => println!("rules refused, the running rules stay: {e}"),
        })
        .build()?;

    let app = Router::new()
        .route("/", get(ok))
        .route("/api/search", get(ok))
        .route("/login", post(ok))
        .route_layer(rules.layer())
        // Added after `route_layer`: outside the limits.
        .route("/health", get(ok));

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!(
        "listening on http://{} (pid {}), rules from {path}",
        listener.local_addr()?,
        std::process::id()
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

async fn ok() -> &'static str {
    "ok"
}
