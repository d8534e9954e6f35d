//! The middleware in axum routers, with the in-memory store on a fake clock.

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{Request, Response, StatusCode};
use std::net::SocketAddr;
use support::{
    body_json, count, get as req, header, send, sf_names, sf_param, statuses, with_peer,
};
use tollgate::clock::FakeClock;
use tollgate::headers::{HeaderStyle, ResetFormat};
use tollgate::key::{Header, KeyExtractor, PeerIp};
use tollgate::response::Rejection;
use tollgate::store::MemoryStore;
use tollgate::{Cost, Decision, Limit, MissingKey, Quota, RateLimitLayer};

fn store() -> (FakeClock, MemoryStore<FakeClock>) {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    (clock.clone(), MemoryStore::with_clock(clock))
}

/// Two limits like the quickstart's, `per-ip` refilled faster (5/s, burst 10: a token every
/// 200 ms) so that a token coming back is seen; `global` 100/s burst 200.
fn quickstart(store: MemoryStore<FakeClock>) -> Router {
    let limits = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
        .limit(Limit::new("global", Quota::per_second(100).burst(200)))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route_layer(limits)
}

#[tokio::test]
async fn burst_then_429_with_standard_headers() {
    let (clock, store) = store();
    let app = quickstart(store);

    let first = send(&app, req("/", "192.0.2.1")).await;
    assert_eq!(first.status(), StatusCode::OK);
    let policy = header(first.headers(), "ratelimit-policy").unwrap();
    assert_eq!(policy, r#""per-ip";q=10;w=2, "global";q=200;w=2"#);
    assert_eq!(sf_names(&policy), ["per-ip", "global"]);
    let limit = header(first.headers(), "ratelimit").unwrap();
    assert_eq!(limit, r#""per-ip";r=9;t=1, "global";r=199;t=1"#);

    let rest = statuses(&app, 9, || req("/", "192.0.2.1")).await;
    assert_eq!(count(&rest, StatusCode::OK), 9);

    let limited = send(&app, req("/", "192.0.2.1")).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = limited.headers();
    assert_eq!(
        header(h, "retry-after").unwrap(),
        "1",
        "200 ms rounded up, never 0"
    );
    assert_eq!(header(h, "cache-control").unwrap(), "no-store");
    assert_eq!(
        header(h, "content-type").unwrap(),
        "application/problem+json"
    );
    assert_eq!(header(h, "ratelimit-policy").unwrap(), policy);
    let rl = header(h, "ratelimit").unwrap();
    assert_eq!(sf_param(&rl, "per-ip", "r"), Some(0));
    assert_eq!(sf_param(&rl, "per-ip", "t"), Some(1));
    assert_eq!(
        sf_param(&rl, "global", "r"),
        Some(190),
        "the refused request took nothing"
    );
    let body = body_json(limited).await;
    assert_eq!(body["status"], 429);
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["type"], "about:blank");
    assert_eq!(body["violated-policies"], serde_json::json!(["per-ip"]));
    assert!(body["detail"].as_str().unwrap().contains("per-ip"));

    // Another client is not affected.
    assert_eq!(
        send(&app, req("/", "192.0.2.2")).await.status(),
        StatusCode::OK
    );

    // A client that honours Retry-After gets through; one token per 200 ms.
    clock.advance(Duration::from_millis(200));
    assert_eq!(
        send(&app, req("/", "192.0.2.1")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, req("/", "192.0.2.1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(2));
    let back = statuses(&app, 11, || req("/", "192.0.2.1")).await;
    assert_eq!(
        count(&back, StatusCode::OK),
        10,
        "a full bucket again after the refill time"
    );
}

#[tokio::test]
async fn a_full_bucket_has_no_t_parameter() {
    let (clock, store) = store();
    // `/peek` costs 0 (through a closure): it reports the bucket without changing it.
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("peek", Quota::per_second(5))
                .cost(Cost::from_fn(|p| (p.uri.path() == "/peek").then_some(0))),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/peek", get(|| async { "" }))
        .route("/take", get(|| async { "" }))
        .route_layer(layer);
    let ratelimit = |r: Response<Body>| header(r.headers(), "ratelimit").unwrap();
    assert_eq!(
        ratelimit(send(&app, req("/peek", "192.0.2.1")).await),
        r#""peek";r=5"#,
        "full: no t"
    );
    assert_eq!(
        ratelimit(send(&app, req("/take", "192.0.2.1")).await),
        r#""peek";r=4;t=1"#,
        "one token short: t until it is back"
    );
    assert_eq!(
        ratelimit(send(&app, req("/peek", "192.0.2.1")).await),
        r#""peek";r=4;t=1"#
    );
    clock.advance(Duration::from_millis(200));
    assert_eq!(
        ratelimit(send(&app, req("/peek", "192.0.2.1")).await),
        r#""peek";r=5"#,
        "full again: no t"
    );
}

#[tokio::test]
async fn or_inside_a_composite_key_keeps_tenants_apart() {
    let (_, store) = store();
    let per_caller = (
        Header::new("x-tenant"),
        Header::new("x-api-key").or(Header::new("x-user")),
    );
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-caller", Quota::per_minute(1)).key(per_caller))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    let from = |tenant: &str| {
        let mut r = req("/", "192.0.2.1");
        r.headers_mut().insert("x-tenant", tenant.parse().unwrap());
        r.headers_mut()
            .insert("x-user", "same-user".parse().unwrap());
        r
    };
    assert_eq!(send(&app, from("t1")).await.status(), StatusCode::OK);
    assert_eq!(
        send(&app, from("t2")).await.status(),
        StatusCode::OK,
        "another tenant's user of the same name has a bucket of its own"
    );
    assert_eq!(
        send(&app, from("t1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_401_for_a_missing_key_carries_the_configured_challenge_whatever_the_body() {
    let layer = |on_rejection: bool| {
        let (_, store) = store();
        let builder = RateLimitLayer::builder(store).limit(
            Limit::new("per-key", Quota::per_minute(2))
                .key(|parts: &http::request::Parts| parts.extensions.get::<String>().cloned())
                .on_missing_key(MissingKey::Unauthorized(r#"Bearer realm="api""#)),
        );
        let app = Router::new().route("/", get(|| async { "" }));
        if on_rejection {
            // A response of one's own: the layer adds the challenge to it too.
            app.route_layer(
                builder
                    .on_rejection(|r: &Rejection<'_>| {
                        Response::builder()
                            .status(r.status())
                            .body(Body::from(r.to_string()))
                            .unwrap()
                    })
                    .build()
                    .unwrap(),
            )
        } else {
            app.route_layer(builder.build().unwrap())
        }
    };
    for custom in [false, true] {
        let r = send(&layer(custom), req("/", "192.0.2.1")).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            header(r.headers(), "www-authenticate").unwrap(),
            r#"Bearer realm="api""#,
            "custom response: {custom}"
        );
        if !custom {
            // A closure says nothing of what it reads: the body names the limit.
            assert_eq!(
                body_json(r).await["detail"],
                "This endpoint counts requests by a key (rate limit \"per-key\") that the \
                 request does not carry, such as a credential."
            );
        }
    }
    // Other statuses carry none.
    let (_, store) = store();
    let app = Router::new().route("/", get(|| async { "" })).route_layer(
        RateLimitLayer::builder(store)
            .limit(
                Limit::new("tenant", Quota::per_minute(2))
                    .key(Header::new("x-tenant"))
                    .on_missing_key(MissingKey::Reject(StatusCode::BAD_REQUEST)),
            )
            .build()
            .unwrap(),
    );
    let r = send(&app, req("/", "192.0.2.1")).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header(r.headers(), "www-authenticate"), None);
}

#[test]
fn a_challenge_that_is_no_header_value_is_a_config_error() {
    let (_, store) = store();
    let err = RateLimitLayer::builder(store)
        .limit(
            Limit::new("per-key", Quota::per_minute(2))
                .key(Header::new("x-api-key"))
                .on_missing_key(MissingKey::Unauthorized("Bearer\r\nX-Injected: 1")),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), r#"limits["per-key"].on_missing_key"#);
}

#[tokio::test]
async fn missing_connect_info_is_a_loud_500_not_a_bypass() {
    let (_, store) = store();
    let app = quickstart(store);
    let bare = Request::get("/").body(Body::empty()).unwrap();
    let r = send(&app, bare).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        header(r.headers(), "content-type").unwrap(),
        "application/problem+json"
    );
    // The body names what is missing and the fix, as axum's own `ConnectInfo` does.
    let detail = body_json(r).await["detail"].clone();
    let detail = detail.as_str().unwrap_or_default();
    assert!(
        detail.starts_with("tollgate cannot apply limit \"per-ip\": no peer address"),
        "{detail}"
    );
    assert!(
        detail.contains("into_make_service_with_connect_info::<SocketAddr>()"),
        "{detail}"
    );
}

#[tokio::test]
async fn mock_connect_info_works_for_router_layer_and_unmatched_routes_do_not_consume() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store.clone())
        .limit(Limit::new("per-ip", Quota::per_second(1).burst(2)).key(PeerIp::new()))
        .build()
        .unwrap();
    // route_layer: a 404 does not touch the limit.
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer.clone())
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 4], 1))));
    for _ in 0..5 {
        let r = send(&app, Request::get("/nope").body(Body::empty()).unwrap()).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert!(r.headers().get("ratelimit").is_none());
    }
    assert_eq!(store.len(), 0);
    let ok = statuses(&app, 3, || Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(
        ok,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );

    // Router::layer limits everything, 404s included.
    let (_, fresh) = self::store();
    let everything = RateLimitLayer::new(Quota::per_second(1), PeerIp::new(), fresh);
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .layer(everything)
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 4], 1))));
    let s = statuses(&app, 2, || {
        Request::get("/nope").body(Body::empty()).unwrap()
    })
    .await;
    assert_eq!(s, [StatusCode::NOT_FOUND, StatusCode::TOO_MANY_REQUESTS]);
}

#[tokio::test]
async fn clones_across_routes_share_state() {
    let (_, store) = store();
    let layer = RateLimitLayer::new(Quota::per_minute(3), PeerIp::new(), store);
    // The same layer on two routes (MethodRouter::layer) and through Router::route_layer.
    let app = Router::new()
        .route("/a", get(|| async { "a" }).layer(layer.clone()))
        .route("/b", post(|| async { "b" }).layer(layer.clone()))
        .nest(
            "/c",
            Router::new()
                .route("/", get(|| async { "c" }))
                .route_layer(layer),
        );
    let ip = "203.0.113.50";
    assert_eq!(send(&app, req("/a", ip)).await.status(), StatusCode::OK);
    let post_b = with_peer(Request::post("/b").body(Body::empty()).unwrap(), ip);
    assert_eq!(send(&app, post_b).await.status(), StatusCode::OK);
    assert_eq!(send(&app, req("/c", ip)).await.status(), StatusCode::OK);
    for path in ["/a", "/c"] {
        assert_eq!(
            send(&app, req(path, ip)).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

#[tokio::test]
async fn the_decision_is_in_the_request_extensions() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<Decision>| async move {
                let l = d.limit("per-ip").unwrap();
                format!("{} {}", d.allowed(), l.remaining().unwrap())
            }),
        )
        .route_layer(layer);
    let r = send(&app, req("/", "192.0.2.9")).await;
    assert_eq!(support::body_text(r).await, "true 9");
}

#[tokio::test]
async fn with_the_extensions_off_handlers_find_neither_and_the_limiter_comes_from_state() {
    use axum::extract::State;
    use tollgate::Limiter;
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
        .decision_extension(false)
        .limiter_extension(false)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(
                |State(limiter): State<Limiter>, req: Request<Body>| async move {
                    let ext = req.extensions();
                    let found = (
                        ext.get::<Decision>().is_some(),
                        ext.get::<Limiter>().is_some(),
                    );
                    // The state's handle reaches the layer's buckets: the request took one.
                    let key = PeerIp::new().key("192.0.2.9".parse().unwrap());
                    let left = limiter.peek("per-ip", key).await.unwrap().remaining();
                    format!("{found:?} {left:?}")
                },
            ),
        )
        .with_state(layer.limiter())
        .route_layer(layer);
    let r = send(&app, req("/", "192.0.2.9")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(support::body_text(r).await, "(false, false) Some(9)");
}

/// `Limiter` and `Decision` extract from the extensions the layer was asked to fill; one it
/// was not asked to fill is a 500 naming the builder option, not axum's bare "missing
/// request extension".
#[cfg(feature = "axum")]
#[tokio::test]
async fn an_extension_the_layer_was_not_asked_for_names_the_option_to_turn_on() {
    use tollgate::Limiter;
    let app = |options: fn(tollgate::RateLimitBuilder<_>) -> tollgate::RateLimitBuilder<_>| {
        let (_, store) = store();
        let builder = RateLimitLayer::builder(store)
            .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()));
        let layer = options(builder).build().unwrap();
        Router::new()
            .route(
                "/limiter",
                get(|limiter: Limiter| async move { limiter.limits().join(",") }),
            )
            .route(
                "/decision",
                get(|d: Decision| async move { d.limit("per-ip").unwrap().allowed().to_string() }),
            )
            .route(
                "/extension",
                get(|Extension(limiter): Extension<Limiter>| async move {
                    limiter.limits().join(",")
                }),
            )
            .route(
                "/optional",
                get(|l: Option<Limiter>, d: Option<Decision>| async move {
                    format!("{} {}", l.is_some(), d.is_some())
                }),
            )
            .route_layer(layer)
    };
    let get_text = |app: Router, path: &'static str| async move {
        let r = send(&app, req(path, "192.0.2.9")).await;
        (r.status(), support::body_text(r).await)
    };

    // Default options: the decision is there, the limiter is not.
    let defaults = app(|b| b);
    let (status, body) = get_text(defaults.clone(), "/limiter").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains(".limiter_extension(true)"), "{body}");
    assert!(body.contains("State<Limiter>"), "{body}");
    assert_eq!(
        get_text(defaults.clone(), "/decision").await,
        (StatusCode::OK, "true".into())
    );
    assert_eq!(
        get_text(defaults.clone(), "/optional").await,
        (StatusCode::OK, "false true".into())
    );

    // Asked for: both there, by the extractor and by `Extension`.
    let both = app(|b| b.limiter_extension(true));
    for path in ["/limiter", "/extension"] {
        assert_eq!(
            get_text(both.clone(), path).await,
            (StatusCode::OK, "per-ip".into())
        );
    }
    assert_eq!(
        get_text(both.clone(), "/optional").await,
        (StatusCode::OK, "true true".into())
    );

    // The decision turned off: its extractor names its option.
    let neither = app(|b| b.decision_extension(false));
    let (status, body) = get_text(neither.clone(), "/decision").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains(".decision_extension(true)"), "{body}");
    assert_eq!(
        get_text(neither, "/optional").await,
        (StatusCode::OK, "false false".into())
    );
}

#[tokio::test]
async fn several_limits_are_all_or_nothing() {
    let (_, store) = store();
    // A generous per-ip limit and a tight per-key limit.
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_minute(100)).key(PeerIp::new()))
        .limit(Limit::new("per-key", Quota::per_minute(2)).key(Header::new("x-api-key")))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    let with_key = || {
        let mut r = req("/", "192.0.2.7");
        r.headers_mut().insert("x-api-key", "k".parse().unwrap());
        r
    };
    let s = statuses(&app, 10, with_key).await;
    assert_eq!(count(&s, StatusCode::OK), 2);
    // The 8 refused requests consumed nothing from per-ip: 98 left, not 90.
    let r = send(&app, req("/", "192.0.2.7")).await; // no key: the shared missing-key bucket
    let rl = header(r.headers(), "ratelimit").unwrap();
    assert_eq!(sf_param(&rl, "per-ip", "r"), Some(97));
}

#[tokio::test]
async fn shadow_limits_report_but_never_refuse() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("trial", Quota::per_minute(2))
                .key(PeerIp::new())
                .shadow(),
        )
        .limit(Limit::new("real", Quota::per_minute(100)).key(PeerIp::new()))
        .build()
        .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let app = Router::new()
        .route(
            "/",
            get(move |Extension(d): Extension<Decision>| {
                let seen = seen2.clone();
                async move {
                    seen.lock()
                        .unwrap()
                        .push(d.limit("trial").unwrap().allowed());
                }
            }),
        )
        .route_layer(layer);
    let s = statuses(&app, 5, || req("/", "192.0.2.3")).await;
    assert_eq!(count(&s, StatusCode::OK), 5);
    assert_eq!(*seen.lock().unwrap(), [true, true, false, false, false]);
    // Shadow limits stay out of the headers by default.
    let r = send(&app, req("/", "192.0.2.3")).await;
    assert_eq!(
        sf_names(&header(r.headers(), "ratelimit").unwrap()),
        ["real"]
    );
}

#[tokio::test]
async fn a_lone_shadow_limit_stays_out_of_the_headers_unless_asked_for() {
    // One limit takes a path of its own through the rendering of the fields.
    for show in [false, true] {
        let (_, store) = store();
        let layer = RateLimitLayer::builder(store)
            .limit(
                Limit::new("trial", Quota::per_minute(2))
                    .key(PeerIp::new())
                    .shadow(),
            )
            .shadow_headers(show)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "" }))
            .route_layer(layer);
        let s = statuses(&app, 3, || req("/", "192.0.2.3")).await;
        assert_eq!(count(&s, StatusCode::OK), 3);
        let r = send(&app, req("/", "192.0.2.3")).await;
        assert_eq!(r.status(), StatusCode::OK);
        let (rl, policy) = (
            header(r.headers(), "ratelimit"),
            header(r.headers(), "ratelimit-policy"),
        );
        if show {
            assert_eq!(sf_param(&rl.unwrap(), "trial", "r"), Some(0));
            assert_eq!(sf_names(&policy.unwrap()), ["trial"]);
        } else {
            assert_eq!((rl, policy), (None, None));
        }
    }
}

#[tokio::test]
async fn cost_from_a_header_and_costs_that_can_never_pass() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("tokens", Quota::per_minute(10))
                .key(PeerIp::new())
                .cost(Cost::header("x-cost").default(1)),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    let with_cost = |c: &str| {
        let mut r = req("/", "192.0.2.5");
        r.headers_mut().insert("x-cost", c.parse().unwrap());
        r
    };
    let r = send(&app, with_cost("4")).await;
    assert_eq!(
        sf_param(&header(r.headers(), "ratelimit").unwrap(), "tokens", "r"),
        Some(6)
    );
    for bad in ["-1", "abc", "1.5", "0", "99999999999"] {
        let r = send(&app, with_cost(bad)).await;
        assert_eq!(r.status(), StatusCode::OK, "{bad} costs the default 1");
    }
    let r = send(&app, with_cost("11")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.headers().get("retry-after").is_none(),
        "waiting does not help"
    );
    let body = body_json(r).await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("can never be satisfied"),
        "{body}"
    );
}

#[derive(Clone, Copy)]
enum Plan {
    Free,
    Pro,
}

#[tokio::test]
async fn quota_per_plan_without_one_layer_per_plan() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("per-key", Quota::per_minute(2))
                .key(Header::new("x-api-key"))
                .quota_by(|parts| match parts.extensions.get::<Plan>()? {
                    Plan::Free => None,
                    Plan::Pro => Some(Quota::per_minute(5)),
                }),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    let call = |key: &'static str, plan: Plan| {
        let mut r = req("/", "192.0.2.1");
        r.headers_mut().insert("x-api-key", key.parse().unwrap());
        r.extensions_mut().insert(plan);
        r
    };
    let free = statuses(&app, 6, || call("free-user", Plan::Free)).await;
    let pro = statuses(&app, 6, || call("pro-user", Plan::Pro)).await;
    assert_eq!(count(&free, StatusCode::OK), 2);
    assert_eq!(count(&pro, StatusCode::OK), 5);
    let r = send(&app, call("pro-user", Plan::Pro)).await;
    assert_eq!(
        header(r.headers(), "ratelimit-policy").unwrap(),
        r#""per-key";q=5;w=60"#
    );
}

#[tokio::test]
async fn route_table_in_one_layer() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("global", Quota::per_second(1_000)))
        .route(
            "POST /login",
            Limit::new("login", Quota::per_minute(2)).key(PeerIp::new()),
        )
        .route(
            "/users/{id}",
            Limit::new("users", Quota::per_minute(3)).key(PeerIp::new()),
        )
        .route_default(Limit::new("default", Quota::per_minute(4)).key(PeerIp::new()))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/login", post(|| async { "" }).get(|| async { "form" }))
        .route("/users/{id}", get(|| async { "" }))
        .route("/other", get(|| async { "" }))
        .route_layer(layer);
    let ip = "192.0.2.77";
    let login = || with_peer(Request::post("/login").body(Body::empty()).unwrap(), ip);
    assert_eq!(count(&statuses(&app, 5, login).await, StatusCode::OK), 2);
    // Different ids, one route: one bucket.
    let mut users = Vec::new();
    for id in 0..5 {
        users.push(send(&app, req(&format!("/users/{id}"), ip)).await.status());
    }
    assert_eq!(count(&users, StatusCode::OK), 3);
    // GET /login has no entry: the default limits.
    let r = send(&app, req("/login", ip)).await;
    assert_eq!(
        sf_names(&header(r.headers(), "ratelimit").unwrap()),
        ["global", "default"]
    );
    let r = send(&app, req("/users/9", ip)).await;
    assert_eq!(
        sf_names(&header(r.headers(), "ratelimit").unwrap()),
        ["global", "users"]
    );
}

#[tokio::test]
async fn route_table_under_router_layer_matches_templates_on_the_path() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .route(
            "/users/{id}",
            Limit::new("users", Quota::per_minute(3)).key(PeerIp::new()),
        )
        .route_default(Limit::new("default", Quota::per_minute(100)).key(PeerIp::new()))
        .build()
        .unwrap();
    // Router::layer runs before routing: no MatchedPath, the raw path is matched.
    let app = Router::new()
        .route("/users/{id}", get(|| async { "" }))
        .route("/other", get(|| async { "" }))
        .layer(layer);
    let ip = "192.0.2.78";
    let mut seen = Vec::new();
    for path in ["/users/7", "/users/8", "/users/7", "/users/8"] {
        let r = send(&app, req(path, ip)).await;
        assert_eq!(
            sf_names(&header(r.headers(), "ratelimit").unwrap()),
            ["users"],
            "{path}"
        );
        seen.push(r.status());
    }
    assert_eq!(
        seen,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "/users/7 and /users/8 share the route's limit"
    );
    let r = send(&app, req("/other", ip)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        sf_names(&header(r.headers(), "ratelimit").unwrap()),
        ["default"]
    );
}

#[tokio::test]
async fn missing_keys_share_a_bucket_by_default_or_are_rejected_or_skipped() {
    let (_, store) = store();
    let shared = RateLimitLayer::builder(store.clone())
        .limit(Limit::new("per-key", Quota::per_minute(2)).key(Header::new("x-api-key")))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(shared);
    // Leaving the header out does not escape the limit.
    let s = statuses(&app, 4, || req("/", "192.0.2.1")).await;
    assert_eq!(count(&s, StatusCode::OK), 2);

    let reject = RateLimitLayer::builder(store.clone())
        .limit(
            Limit::new("required", Quota::per_minute(2))
                .key(Header::new("x-api-key"))
                .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(reject);
    let r = send(&app, req("/", "192.0.2.1")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // RFC 9110: a 401 carries a challenge; none was configured, so the default one.
    assert_eq!(header(r.headers(), "www-authenticate").unwrap(), "ApiKey");
    let body = body_json(r).await;
    assert_eq!(body["status"], 401);
    assert_eq!(
        body["detail"],
        "This endpoint needs the `x-api-key` header (rate limit \"required\" counts requests by it)."
    );

    let skip = RateLimitLayer::builder(store)
        .limit(
            Limit::new("optional", Quota::per_minute(1))
                .key(Header::new("x-user"))
                .on_missing_key(MissingKey::Skip),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(skip);
    let s = statuses(&app, 3, || req("/", "192.0.2.1")).await;
    assert_eq!(count(&s, StatusCode::OK), 3);
}

#[tokio::test]
async fn the_429_response_is_replaceable_and_still_gets_the_headers() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
        .on_rejection(|rejection: &Rejection<'_>| {
            let ms = rejection.retry_after().map_or(0, |d| d.as_millis());
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header("content-type", "text/plain")
                .body(Body::from(format!("wait {ms} ms")))
                .unwrap()
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    send(&app, req("/", "192.0.2.1")).await;
    let r = send(&app, req("/", "192.0.2.1")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(r.headers(), "retry-after").unwrap(), "60");
    assert!(r.headers().get("ratelimit").is_some());
    assert_eq!(support::body_text(r).await, "wait 60000 ms");
}

#[tokio::test]
async fn a_rejection_with_its_own_fields_gets_the_layers_appended_as_documented() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
        .on_rejection(|_: &Rejection<'_>| {
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header("ratelimit", r#""mine";r=0"#)
                .header("retry-after", "5")
                .header("cache-control", "private")
                .body(Body::empty())
                .unwrap()
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    send(&app, req("/", "192.0.2.1")).await;
    let r = send(&app, req("/", "192.0.2.1")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = r.headers();
    // IETF fields are lists: the layer's members are appended to the response's own.
    assert_eq!(h.get_all("ratelimit").iter().count(), 2);
    assert_eq!(
        sf_names(&header(h, "ratelimit").unwrap()),
        ["mine", "per-ip"]
    );
    // Single-valued fields the response already has are left alone.
    assert_eq!(header(h, "retry-after").unwrap(), "5");
    assert_eq!(header(h, "cache-control").unwrap(), "private");
}

#[tokio::test]
async fn retry_after_jitter_is_deterministic_per_client_and_never_shorter() {
    let (_, store) = store();
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_minute(1)).key(PeerIp::new()))
        .retry_after_jitter(0.5)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    let mut waits = Vec::new();
    for i in 1..=20 {
        let ip = format!("192.0.2.{i}");
        send(&app, req("/", &ip)).await;
        let a = send(&app, req("/", &ip)).await;
        let b = send(&app, req("/", &ip)).await;
        let a: u64 = header(a.headers(), "retry-after").unwrap().parse().unwrap();
        let b: u64 = header(b.headers(), "retry-after").unwrap().parse().unwrap();
        assert_eq!(a, b, "same client, same offset");
        assert!((60..=90).contains(&a), "{a}");
        waits.push(a);
    }
    waits.sort_unstable();
    waits.dedup();
    assert!(waits.len() > 5, "clients are spread: {waits:?}");
}

#[tokio::test]
async fn every_header_style_through_the_layer() {
    let app_with = |style: HeaderStyle| {
        let (_, store) = store();
        let layer = RateLimitLayer::builder(store)
            .limit(Limit::new("burst", Quota::per_second(10)).key(PeerIp::new()))
            .limit(Limit::new("daily", Quota::per_day(1000)).key(PeerIp::new()))
            .headers(style)
            .build()
            .unwrap();
        Router::new()
            .route("/", get(|| async { "" }))
            .route_layer(layer)
    };
    let r = send(&app_with(HeaderStyle::Draft7), req("/", "192.0.2.1")).await;
    assert_eq!(
        header(r.headers(), "ratelimit-policy").unwrap(),
        "10;w=1, 1000;w=86400"
    );
    assert_eq!(
        header(r.headers(), "ratelimit").unwrap(),
        "limit=10, remaining=9, reset=1"
    );

    let r = send(&app_with(HeaderStyle::Draft6), req("/", "192.0.2.1")).await;
    assert_eq!(header(r.headers(), "ratelimit-limit").unwrap(), "10");
    assert_eq!(header(r.headers(), "ratelimit-remaining").unwrap(), "9");
    assert_eq!(header(r.headers(), "ratelimit-reset").unwrap(), "1");

    let r = send(
        &app_with(HeaderStyle::Legacy(ResetFormat::Delta)),
        req("/", "192.0.2.1"),
    )
    .await;
    assert_eq!(header(r.headers(), "x-ratelimit-limit").unwrap(), "10");
    assert_eq!(header(r.headers(), "x-ratelimit-remaining").unwrap(), "9");
    assert_eq!(header(r.headers(), "x-ratelimit-reset").unwrap(), "1");

    let r = send(
        &app_with(HeaderStyle::Legacy(ResetFormat::Epoch)),
        req("/", "192.0.2.1"),
    )
    .await;
    let epoch: u64 = header(r.headers(), "x-ratelimit-reset")
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!((now..=now + 2).contains(&epoch), "{epoch} vs {now}");

    let app = app_with(HeaderStyle::Governor);
    let s = statuses(&app, 10, || req("/", "192.0.2.1")).await;
    assert_eq!(count(&s, StatusCode::OK), 10);
    let r = send(&app, req("/", "192.0.2.1")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(r.headers(), "x-ratelimit-after").unwrap(), "1");
    assert_eq!(header(r.headers(), "x-ratelimit-remaining").unwrap(), "0");
    assert_eq!(header(r.headers(), "retry-after").unwrap(), "1");

    let app = app_with(HeaderStyle::None);
    let r = send(&app, req("/", "192.0.2.1")).await;
    assert!(
        r.headers().get("ratelimit").is_none() && r.headers().get("ratelimit-policy").is_none()
    );
}

#[tokio::test]
async fn every_decision_reaches_the_observer() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (_, store) = store();
    let (allowed, denied, shadow) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (a, d, s) = (allowed.clone(), denied.clone(), shadow.clone());
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_minute(3)).key(PeerIp::new()))
        .limit(
            Limit::new("trial", Quota::per_minute(1))
                .key(PeerIp::new())
                .shadow(),
        )
        .on_decision(move |decision, parts| {
            assert_eq!(parts.uri.path(), "/");
            let counter = if decision.allowed() { &a } else { &d };
            counter.fetch_add(1, Ordering::Relaxed);
            if decision.limit("trial").is_some_and(|l| !l.allowed()) {
                s.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(layer);
    statuses(&app, 5, || req("/", "192.0.2.1")).await;
    assert_eq!(allowed.load(Ordering::Relaxed), 3);
    assert_eq!(denied.load(Ordering::Relaxed), 2);
    // The shadow limit (1 a minute) would have refused requests 2 to 5, including the two
    // that per-ip did refuse.
    assert_eq!(shadow.load(Ordering::Relaxed), 4);
}

#[tokio::test]
async fn stacked_layers_append_one_list() {
    let (_, store) = store();
    let outer = RateLimitLayer::builder(store.clone())
        .limit(Limit::new("outer", Quota::per_second(10)))
        .build()
        .unwrap();
    let inner = RateLimitLayer::builder(store)
        .limit(Limit::new("inner", Quota::per_second(5)).key(PeerIp::new()))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "" }))
        .route_layer(inner)
        .route_layer(outer);
    let r = send(&app, req("/", "192.0.2.1")).await;
    let policy = header(r.headers(), "ratelimit-policy").unwrap();
    let mut names = sf_names(&policy);
    names.sort();
    assert_eq!(names, ["inner", "outer"]);
}

#[tokio::test]
async fn poll_ready_is_never_pending_because_of_the_limit() {
    use tower::{Service, ServiceExt};
    let (_, store) = store();
    let layer = RateLimitLayer::new(Quota::per_minute(1), PeerIp::new(), store);
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
        });
    for expected in [
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let ready = futures_ready(svc.ready())
            .expect("ready at once, limited or not")
            .unwrap();
        let r = ready.call(req("/", "192.0.2.1")).await.unwrap();
        assert_eq!(r.status(), expected);
    }

    fn futures_ready<F: std::future::Future>(f: F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
