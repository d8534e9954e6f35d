//! Failed-login throttling, two ways: per user from the handler with the [`Limiter`]
//! handle, and per client address with the layer alone, charging only `401`s.
//!
//! Every user's password is `correct-horse`.
//!
//! - `POST /login` (form body `user=...&password=...`): limit `login-failures`, 5 failed
//!   attempts per user per 15 minutes (a bucket of 5 that gets one attempt back every
//!   3 minutes). A wrong password answers `401`; once 5 failures are counted, the next
//!   attempt for that user answers `429` with `Retry-After` (in whole seconds, rounded up)
//!   — even with the right password — until a token is back. A successful login (`200`)
//!   forgets the user's failures. Other users are not affected.
//! - `POST /login-basic` (same body, same password): the layer alone, per client IP
//!   (`PeerIp`), 3 per minute, and only `401` responses count
//!   (`Charge::when(|status, _| status == 401)`): successful logins are free.
//!
//! # Why the handler charges *before* it checks the password
//!
//! The obvious version — `peek` the bucket, try the password, `check` (take one token) on
//! failure — has a race: with one failure left, N concurrent wrong attempts all pass the
//! peek, all get a `401` (N guesses), and only the last one is refused by the bucket.
//! This handler takes the token first, with `check(limit, user, 1)`, which is one atomic
//! step in the store: of N concurrent attempts with one token left exactly one gets it and
//! may compare a password; the others are answered `429` without looking at the password.
//! Then:
//!
//! - wrong password: the token stays taken — that is the counted failure;
//! - right password: `reset(limit, user)` deletes the bucket, which gives back the token
//!   just taken and forgets the earlier failures. (To give back only this attempt's token
//!   and keep earlier failures, `refund(limit, user, 1)` would do that.)
//!
//! The price: while a wrong guess is being checked it holds a token, so a concurrent right
//! password may be refused with a `429` for a moment when the bucket is at its last token.
//! That errs on the side of refusing guesses, which is what a login throttle is for. The
//! layer's [`Charge::when`] on `/login-basic` works the same way (charge first, refund a
//! response that does not count).
//!
//! # Run it
//!
//! ```text
//! cargo run -p tollgate --example login_throttle                 # in memory; PORT=8080 to move it
//! ```
//!
//! Two instances sharing their counts through Redis (`RedisStore`):
//!
//! ```text
//! PORT=3000 REDIS_URL=redis://127.0.0.1:6379 cargo run -p tollgate --example login_throttle --features redis &
//! PORT=3001 REDIS_URL=redis://127.0.0.1:6379 cargo run -p tollgate --example login_throttle --features redis &
//! ```
//!
//! The log says which store is used.
//!
//! # Try it
//!
//! Six wrong passwords for alice (alternate the ports with two instances), then the right
//! one; bob is not affected:
//!
//! ```text
//! for i in $(seq 6); do
//!   curl -s -o /dev/null -w '%{http_code} ' -d 'user=alice&password=guess' http://127.0.0.1:3000/login
//! done; echo
//! # 401 401 401 401 401 429
//! curl -i -d 'user=alice&password=correct-horse' http://127.0.0.1:3000/login
//! # HTTP/1.1 429 Too Many Requests
//! # retry-after: 180
//! # content-type: application/problem+json
//! # cache-control: no-store
//! #
//! # {"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Rate limit \"login-failures\" exceeded; retry in 180 s.","violated-policies":["login-failures"]}
//! curl -i -d 'user=bob&password=correct-horse' http://127.0.0.1:3000/login
//! # HTTP/1.1 200 OK ... welcome, bob
//! ```
//!
//! The layer-only variant: three wrong passwords from one address, then the fourth is
//! refused; right passwords never count:
//!
//! ```text
//! for i in $(seq 4); do
//!   curl -s -o /dev/null -w '%{http_code} ' -d 'user=carol&password=guess' http://127.0.0.1:3000/login-basic
//! done; echo
//! # 401 401 401 429
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tollgate::key::PeerIp;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Charge, Limit, LimitDecision, LimitSpec, Limiter, Quota, RateLimitLayer};
use tracing_subscriber::EnvFilter;

/// The demo password of every user.
const PASSWORD: &str = "correct-horse";
/// The per-user limit the `/login` handler uses through the handle.
const FAILURES: &str = "login-failures";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    let app = match std::env::var("REDIS_URL").ok() {
        #[cfg(feature = "redis")]
        Some(url) => {
            let conn = redis::Client::open(url.as_str())?
                .get_connection_manager()
                .await?;
            let store = tollgate::store::RedisStore::new(conn).prefix("login-throttle:");
            // The host only: the URL may hold a password.
            let host = url.rsplit('@').next().unwrap_or(&url);
            tracing::info!(
                %host,
                "using RedisStore: every instance on this Redis shares the counts"
            );
            app(store)?
        }
        #[cfg(not(feature = "redis"))]
        Some(_) => {
            tracing::warn!(
                "REDIS_URL is set but this build has no `redis` feature \
                 (cargo run -p tollgate --example login_throttle --features redis): using MemoryStore"
            );
            app(MemoryStore::new())?
        }
        None => {
            tracing::info!(
                "using MemoryStore: counts are kept in this process (set REDIS_URL to share them)"
            );
            app(MemoryStore::new())?
        }
    };

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!("try: curl -i -d 'user=alice&password=guess' http://{addr}/login");
    // `PeerIp` (for /login-basic) reads the client address from axum's `ConnectInfo`.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// Both routes on one store (two limits, two sets of buckets).
fn app<St: Store>(store: St) -> Result<Router, tollgate::ConfigError> {
    // 5 per 15 minutes, burst 5: five failures at once, then one more every 3 minutes.
    let failures = Quota::new(5, Duration::from_secs(15 * 60))?;
    let limiter = Limiter::builder(store.clone())
        .limit(LimitSpec::new(FAILURES, failures))
        .build()?;

    // The layer-only variant: per client address, only 401s count.
    let basic = RateLimitLayer::builder(store)
        .limit(
            Limit::new("login-basic", Quota::per_minute(3))
                .key(PeerIp::new())
                .charge(Charge::when(|status, _| status == StatusCode::UNAUTHORIZED)),
        )
        .build()?;

    Ok(Router::new()
        .route("/login", post(login))
        .with_state(limiter)
        .merge(
            Router::new()
                .route("/login-basic", post(login_basic))
                .route_layer(basic),
        ))
}

/// `POST /login`: charge one failure first, then compare the password (see the module
/// docs for why).
async fn login(
    State(limiter): State<Limiter>,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let Some(user) = form.get("user").filter(|u| !u.is_empty()) else {
        return (StatusCode::BAD_REQUEST, "the form needs a `user`\n").into_response();
    };
    let password = form.get("password").map_or("", String::as_str);

    // One atomic step: take a failure token if there is one left.
    let charged = match limiter.check(FAILURES, user.as_str(), 1).await {
        Ok(decision) => decision,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    };
    if !charged.allowed() {
        return too_many_failures(&charged);
    }

    if password == PASSWORD {
        // Forget the failures, including the token this attempt took.
        if let Err(e) = limiter.reset(FAILURES, user.as_str()).await {
            tracing::error!("reset {user}: {e}");
        }
        (StatusCode::OK, format!("welcome, {user}\n")).into_response()
    } else {
        // The token stays taken: this failure counts.
        let left = charged.remaining().unwrap_or(0);
        tracing::info!(user, left, "failed login");
        (
            StatusCode::UNAUTHORIZED,
            format!("wrong password for {user}; attempts left: {left}\n"),
        )
            .into_response()
    }
}

/// The refusal, in the layer's style: `429` with `Retry-After` (whole seconds, rounded up),
/// `Cache-Control: no-store` and a problem-details body. A refusal without a wait is the
/// store failing under a `Deny` policy: `503`.
fn too_many_failures(decision: &LimitDecision) -> Response {
    let Some(wait) = decision.retry_after() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "try again shortly\n").into_response();
    };
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    // The members in the layer's order (`DefaultOnRejection`).
    let name = serde_json::to_string(decision.name()).expect("a string");
    let body = format!(
        r#"{{"type":"about:blank","title":"Too Many Requests","status":429,"detail":{detail},"violated-policies":[{name}]}}"#,
        detail = serde_json::to_string(&format!(
            "Rate limit \"{}\" exceeded; retry in {secs} s.",
            decision.name()
        ))
        .expect("a string"),
    );
    let mut response = (StatusCode::TOO_MANY_REQUESTS, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `POST /login-basic`: just the password check; the layer counts the `401`s.
async fn login_basic(Form(form): Form<HashMap<String, String>>) -> Response {
    let user = form.get("user").map_or("", String::as_str);
    if !user.is_empty() && form.get("password").is_some_and(|p| p == PASSWORD) {
        (StatusCode::OK, format!("welcome, {user}\n")).into_response()
    } else {
        (StatusCode::UNAUTHORIZED, "wrong user or password\n").into_response()
    }
}
