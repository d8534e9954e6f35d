//! Per-API-key limits whose quota depends on the customer's plan, and weighted requests.
//!
//! - An authentication middleware looks the `x-api-key` header up in a table of known
//!   keys and puts the key's [`Plan`] in the request extensions. A missing or unknown key
//!   gets `401` right there, before the rate limiter: made-up keys never get a bucket
//!   (a client inventing keys could otherwise get a fresh bucket per request, and fill
//!   the store).
//! - One limit, `per-key`, keyed by the API key, picks its quota from the plan with
//!   `quota_by`: free 10 per minute, pro 10/s with bursts of 50, enterprise 100/s with
//!   bursts of 500.
//! - A request costs what its `x-cost` header says (1 without it): a batch of 20 items
//!   takes 20 tokens.
//!
//! Run it:
//!
//! ```text
//! cargo run -p tollgate --example api_key_plans            # or PORT=8080 cargo run -p tollgate --example api_key_plans
//! ```
//!
//! The free plan allows 10 requests at once, then one every 6 s:
//!
//! ```text
//! for i in $(seq 11); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-api-key: free-key' http://127.0.0.1:3000/; done; echo
//! # 200 200 200 200 200 200 200 200 200 200 429
//! ```
//!
//! The pro plan's bucket holds 50; requests costing 20 take 20 tokens each:
//!
//! ```text
//! curl -i -H 'x-api-key: pro-key' -H 'x-cost: 20' http://127.0.0.1:3000/
//! # ratelimit-policy: "per-key";q=50;w=5
//! # ratelimit: "per-key";r=30;t=1
//! # plan Pro: this request cost 20, 30 left
//! for i in $(seq 3); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-api-key: pro-key' -H 'x-cost: 20' http://127.0.0.1:3000/; done; echo
//! # 200 429 429   (30 left: one more fits; then wait for the bucket to refill)
//! ```
//!
//! A request costing more than the bucket holds can never pass: `429` without
//! `Retry-After`, and the body says why.
//!
//! ```text
//! curl -i -H 'x-api-key: free-key' -H 'x-cost: 11' http://127.0.0.1:3000/
//! ```
//!
//! Keys are separate buckets, so the enterprise key is not affected by the others;
//! no key or an unknown key gets `401`:
//!
//! ```text
//! curl -i -H 'x-api-key: ent-key' http://127.0.0.1:3000/
//! # ratelimit-policy: "per-key";q=500;w=5
//! curl -i http://127.0.0.1:3000/
//! curl -i -H 'x-api-key: stolen-key' http://127.0.0.1:3000/
//! ```

use std::net::SocketAddr;

use axum::{
    Extension, Router,
    extract::Request,
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use tollgate::{
    Cost, Decision, Limit, MissingKey, Quota, RateLimitLayer, key::Header, store::MemoryStore,
};
use tracing_subscriber::EnvFilter;

/// A customer's plan, put in the request extensions by [`auth`].
#[derive(Debug, Clone, Copy)]
enum Plan {
    Free,
    Pro,
    Enterprise,
}

/// The known API keys. A real application would look them up in a database.
const API_KEYS: &[(&str, Plan)] = &[
    ("free-key", Plan::Free),
    ("pro-key", Plan::Pro),
    ("ent-key", Plan::Enterprise),
];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    let limits = RateLimitLayer::builder(MemoryStore::new())
        .limit(
            // The limit's own quota, used when `quota_by` returns `None`: the free plan.
            Limit::new("per-key", Quota::per_minute(10))
                // One bucket per API key.
                .key(Header::new("x-api-key"))
                .quota_by(|parts| match parts.extensions.get::<Plan>()? {
                    Plan::Free => None,
                    Plan::Pro => Some(Quota::per_second(10).burst(50)),
                    Plan::Enterprise => Some(Quota::per_second(100).burst(500)),
                })
                // `x-cost: 20` takes 20 tokens. Absent or invalid (0, -1, abc): 1.
                .cost(Cost::header("x-cost").default(1))
                // `auth` already refuses requests without a key; should the limit ever be
                // used without it, such requests get 401 too rather than sharing a bucket.
                .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .build()?;

    // axum runs the layers of the last `route_layer` first: `auth` sees the request
    // before the limiter, which then finds the `Plan` in the extensions.
    let app = Router::new()
        .route("/", get(handler))
        .route_layer(limits)
        .route_layer(middleware::from_fn(auth));

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!("try: curl -i -H 'x-api-key: pro-key' -H 'x-cost: 20' http://{addr}/");
    // The limits here need no client address, but connection info costs nothing and
    // lets a `PeerIp` limit be added later.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// Authentication: a known `x-api-key` puts its plan in the extensions; anything else is
/// a 401.
async fn auth(mut request: Request, next: Next) -> Response {
    let plan = request
        .headers()
        .get("x-api-key")
        .and_then(|key| API_KEYS.iter().find(|(known, _)| key == known))
        .map(|&(_, plan)| plan);
    match plan {
        Some(plan) => {
            request.extensions_mut().insert(plan);
            next.run(request).await
        }
        None => (StatusCode::UNAUTHORIZED, "missing or unknown x-api-key\n").into_response(),
    }
}

async fn handler(
    Extension(plan): Extension<Plan>,
    Extension(decision): Extension<Decision>,
) -> String {
    match decision.limit("per-key") {
        Some(limit) => format!(
            "plan {plan:?}: this request cost {}, {} left\n",
            limit.cost(),
            limit.remaining().unwrap_or(0)
        ),
        None => format!("plan {plan:?}\n"),
    }
}
