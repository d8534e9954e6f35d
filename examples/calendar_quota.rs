//! Calendar quotas: a plan's allowance per calendar month and per day, reset at midnight
//! in the customer's time zone (feature `calendar`).
//!
//! - `monthly`: 5 requests per API key and calendar month, reset at midnight on the 1st.
//! - `daily`: 3 requests per API key and calendar day (a day of 23 or 25 hours at a
//!   daylight-saving change is one day).
//!
//! Both count in the zone `TIME_ZONE` names (an IANA name, default `Europe/Berlin`). The
//! small numbers are there to see a refusal within a few requests.
//!
//! Run it:
//!
//! ```text
//! cargo run -p tollgate --example calendar_quota --features calendar,axum
//! TIME_ZONE=America/New_York PORT=8080 cargo run -p tollgate --example calendar_quota --features calendar,axum
//! ```
//!
//! Three requests pass, the fourth waits for the next local midnight:
//!
//! ```text
//! for i in $(seq 4); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-api-key: k1' http://127.0.0.1:3000/; done; echo
//! # 200 200 200 429
//! curl -i -H 'x-api-key: k1' http://127.0.0.1:3000/
//! # HTTP/1.1 429 Too Many Requests
//! # ratelimit-policy: "monthly";q=5;w=2678400, "daily";q=3;w=86400
//! # ratelimit: "monthly";r=2;t=371607, "daily";r=0;t=26007   (t: seconds to the boundary)
//! # retry-after: 26007                                         (local midnight)
//! ```
//!
//! `GET /window` names the windows that hold now, and when they end:
//!
//! ```text
//! curl -s http://127.0.0.1:3000/window
//! # month 2026-11 ends in 371606 s; day 2026-11-26 ends in 26006 s (Europe/Berlin)
//! ```
//!
//! Another key has its own allowance; no key gets `401`:
//!
//! ```text
//! curl -i -H 'x-api-key: k2' http://127.0.0.1:3000/
//! curl -i http://127.0.0.1:3000/
//! ```

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::{Extension, Router, http::StatusCode, routing::get};
use tollgate::calendar::{Period, Zone};
use tollgate::store::MemoryStore;
use tollgate::{Algorithm, Decision, Limit, MissingKey, Quota, RateLimitLayer, key::Header};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    // An unknown name is a `ConfigError` naming `time_zone`.
    let zone = Zone::get(&std::env::var("TIME_ZONE").unwrap_or_else(|_| "Europe/Berlin".into()))?;
    let per_key = |limit: Limit| {
        limit
            .key(Header::new("x-api-key"))
            .algorithm(Algorithm::calendar(zone))
            .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
    };
    let limits = RateLimitLayer::builder(MemoryStore::new())
        .limit(per_key(Limit::new("monthly", Quota::per_month(5))))
        .limit(per_key(Limit::new("daily", Quota::per_day(3))))
        .build()?;

    let app = Router::new()
        .route("/", get(handler))
        .route_layer(limits)
        .route("/window", get(move || window(zone)));

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}, counting in {zone}");
    println!("try: curl -i -H 'x-api-key: k1' http://{addr}/");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// What is left of each allowance.
async fn handler(Extension(decision): Extension<Decision>) -> String {
    decision
        .limits()
        .map(|l| format!("{}: {} left\n", l.name(), l.remaining().unwrap_or(0)))
        .collect()
}

/// The month and day windows holding now, from the pure functions of `tollgate::calendar`.
async fn window(zone: Zone) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let (month, day) = (
        Period::Month.window(zone, now),
        Period::Day.window(zone, now),
    );
    format!(
        "month {} ends in {} s; day {} ends in {} s ({zone})\n",
        month.label(Period::Month, zone),
        month.until_end(now) / 1_000_000,
        day.label(Period::Day, zone),
        day.until_end(now) / 1_000_000,
    )
}
