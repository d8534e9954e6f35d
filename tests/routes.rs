//! Features `rules` and `axum`: one meaning for a route pattern. The same rules decide the
//! same requests in an axum app (under `Router::route_layer`, under `Router::layer`, in a
//! router nested with `Router::nest`), in plain hyper (a `service_fn` behind the layer) and
//! in `tollgate-rules simulate`, over generated app routes, rule patterns and requests.
#![cfg(all(feature = "rules", feature = "axum"))]

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::any as any_method;
use http::{Method, Request, Response, StatusCode};
use proptest::prelude::*;
use support::{Lines, header, sf_names};
use tollgate::RateLimitLayer;
use tollgate::clock::FakeClock;
use tollgate::rules::{Document, LogFormat, Simulation};
use tollgate::store::MemoryStore;
use tower::{Layer, ServiceExt, service_fn};

/// One request: method and path.
type Req = (Method, String);

/// Per limit: (requests that met it, of which refused).
type Tallies = BTreeMap<String, (u64, u64)>;

/// A rules document: one limit per (method, pattern), each `1/hour` on one global bucket,
/// so that a limit's first request passes and every later one is refused: where each
/// request goes decides every count. Patterns get `prefix` in front (a nested router's).
fn rules(patterns: &[(Option<Method>, String)], prefix: &str) -> Document {
    let mut text = String::new();
    for (i, (method, pattern)) in patterns.iter().enumerate() {
        let route = match method {
            Some(m) => format!("{m} {prefix}{pattern}"),
            None => format!("{prefix}{pattern}"),
        };
        text.push_str(&format!(
            "[[limits]]\nname = \"r{i}\"\nquota = \"1/hour\"\nroutes = [{route:?}]\n\n"
        ));
    }
    Document::from_toml(&text).unwrap()
}

fn layer(doc: &Document) -> RateLimitLayer<MemoryStore<FakeClock>> {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    doc.layer(MemoryStore::with_clock(clock)).unwrap()
}

/// Where the layer sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    RouteLayer,
    RouterLayer,
    /// `Router::nest("/n", routes.route_layer(..))`: the app's paths under `/n`.
    Nested,
    /// A `service_fn` behind the layer, no router at all.
    Hyper,
}

/// The limit a response says the request met (its `RateLimit` field names it, passed or
/// refused: HEAD refusals have no body), and whether it was refused.
fn met(response: &Response<Body>) -> (Option<String>, bool) {
    let refused = response.status() == StatusCode::TOO_MANY_REQUESTS;
    assert!(
        refused || [StatusCode::OK, StatusCode::NOT_FOUND].contains(&response.status()),
        "{}",
        response.status()
    );
    let names = header(response.headers(), "ratelimit").map(|v| sf_names(&v));
    match names.as_deref() {
        None => {
            assert!(!refused, "a refusal names its limit");
            (None, false)
        }
        Some([one]) => (Some(one.clone()), refused),
        Some(more) => panic!("one limit per request, got {more:?}"),
    }
}

/// Sends `requests` through the layer placed at `place`, in order, on a fresh store; the
/// tallies per limit, and the requests the app routed (all but its 404s).
fn live_routed(
    app_routes: &[String],
    doc: &Document,
    place: Place,
    requests: &[Req],
) -> (Tallies, Vec<Req>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let layer = layer(doc);
        let routes = || {
            app_routes.iter().fold(Router::new(), |r, t| {
                r.route(t, any_method(|| async { "ok" }))
            })
        };
        let mut tallies = Tallies::new();
        let mut routed = Vec::new();
        for (method, path) in requests {
            let request = Request::builder()
                .method(method.clone())
                .uri(path.as_str())
                .body(Body::empty())
                .unwrap();
            let response = match place {
                Place::RouteLayer => routes().route_layer(layer.clone()).oneshot(request).await,
                Place::RouterLayer => routes().layer(layer.clone()).oneshot(request).await,
                Place::Nested => {
                    Router::new()
                        .nest("/n", routes().route_layer(layer.clone()))
                        .oneshot(request)
                        .await
                }
                Place::Hyper => {
                    let inner = service_fn(|_: Request<Body>| async {
                        Ok::<_, Infallible>(Response::new(Body::from("ok")))
                    });
                    layer
                        .clone()
                        .layer(inner)
                        .oneshot(request)
                        .await
                        .map(|r| r.map(Body::new))
                }
            }
            .unwrap();
            if response.status() != StatusCode::NOT_FOUND {
                routed.push((method.clone(), path.clone()));
            }
            if let (Some(name), refused) = met(&response) {
                let t = tallies.entry(name).or_default();
                t.0 += 1;
                t.1 += u64::from(refused);
            }
        }
        (tallies, routed)
    })
}

fn live(app_routes: &[String], doc: &Document, place: Place, requests: &[Req]) -> Tallies {
    live_routed(app_routes, doc, place, requests).0
}

/// The same requests as access-log lines, replayed by `simulate`: its tallies per limit.
fn simulated(doc: &Document, requests: &[Req]) -> Tallies {
    let log: String = requests
        .iter()
        .map(|(method, path)| {
            format!(
                "192.0.2.1 - - [26/Nov/2026:10:00:00 +0000] \"{method} {path} HTTP/1.1\" 200 2 \"-\" \"t\"\n"
            )
        })
        .collect();
    let report = Simulation::new(LogFormat::Combined)
        .run(doc, log.as_bytes())
        .unwrap();
    assert_eq!(report.bad_lines, 0, "{:?}", report.bad);
    report
        .limits
        .iter()
        .filter(|l| l.requests > 0)
        .map(|l| (l.name.clone(), (l.requests, l.refused)))
        .collect()
}

/// Asserts that every place decides `requests` as `simulate` does. Under `route_layer`
/// only the requests the app routes reach the layer (a 404 never does), so the replay gets
/// those; under `Router::layer` and in hyper, every request.
fn agree(app_routes: &[String], patterns: &[(Option<Method>, String)], requests: &[Req]) {
    let doc = rules(patterns, "");
    let everything = simulated(&doc, requests);
    let (tallies, reached) = live_routed(app_routes, &doc, Place::RouteLayer, requests);
    assert_eq!(
        tallies,
        simulated(&doc, &reached),
        "route_layer; app {app_routes:?}, patterns {patterns:?}, requests {reached:?}"
    );
    assert_eq!(
        live(app_routes, &doc, Place::RouterLayer, requests),
        everything,
        "Router::layer; app {app_routes:?}, patterns {patterns:?}, requests {requests:?}"
    );
    assert_eq!(
        live(app_routes, &doc, Place::Hyper, requests),
        everything,
        "hyper; app {app_routes:?}, patterns {patterns:?}, requests {requests:?}"
    );
    // Nested under `/n`: the rules name the full paths, as the client sends them.
    let nested_doc = rules(patterns, "/n");
    let nested: Vec<Req> = requests
        .iter()
        .map(|(m, p)| (m.clone(), format!("/n{p}")))
        .collect();
    let (tallies, reached) = live_routed(app_routes, &nested_doc, Place::Nested, &nested);
    assert_eq!(
        tallies,
        simulated(&nested_doc, &reached),
        "nested; app {app_routes:?}, patterns {patterns:?}, requests {reached:?}"
    );
}

#[test]
fn a_wildcard_pattern_meets_the_routes_it_covers_under_route_layer() {
    // The issue's case: `/api/{*rest}` on an app whose route is `/api/items`.
    let app = ["/api/items".to_owned()];
    let patterns = [(None, "/api/{*rest}".to_owned())];
    let two = [
        (Method::GET, "/api/items".to_owned()),
        (Method::GET, "/api/items".to_owned()),
    ];
    let doc = rules(&patterns, "");
    let expected = Tallies::from([("r0".to_owned(), (2, 1))]);
    assert_eq!(live(&app, &doc, Place::RouteLayer, &two), expected);
    assert_eq!(live(&app, &doc, Place::RouterLayer, &two), expected);
    assert_eq!(simulated(&doc, &two), expected);
    agree(
        &app,
        &patterns,
        &[
            (Method::GET, "/api/items".to_owned()),
            (Method::POST, "/api/nope".to_owned()),
            (Method::GET, "/api/items".to_owned()),
            (Method::GET, "/api".to_owned()),
        ],
    );
}

#[test]
fn a_parameter_pattern_and_a_static_pattern_decide_as_the_replay_does() {
    // The app has one route for every user; the rules single out `/users/me`.
    let app = ["/users/{id}".to_owned(), "/files/{*path}".to_owned()];
    let patterns = [
        (None, "/users/{name}".to_owned()),
        (Some(Method::GET), "/users/me".to_owned()),
        (Some(Method::POST), "/files/{*rest}".to_owned()),
    ];
    let requests: Vec<Req> = [
        (Method::GET, "/users/me"),
        (Method::GET, "/users/7"),
        (Method::HEAD, "/users/me"),
        (Method::POST, "/users/me"),
        (Method::POST, "/files/a/b"),
        (Method::GET, "/files/a"),
        (Method::POST, "/files/a"),
        (Method::GET, "/users/7"),
    ]
    .into_iter()
    .map(|(m, p)| (m, p.to_owned()))
    .collect();
    let doc = rules(&patterns, "");
    // r0: /users/7 twice; r1: GET and HEAD /users/me; r2: both POSTs. POST /users/me
    // meets none: the path chooses `/users/me` first, whose only entry is GET (axum's
    // router, too, answers it 405 rather than trying `/users/{id}`).
    let expected = Tallies::from([
        ("r0".to_owned(), (2, 1)),
        ("r1".to_owned(), (2, 1)),
        ("r2".to_owned(), (2, 1)),
    ]);
    assert_eq!(live(&app, &doc, Place::RouteLayer, &requests), expected);
    agree(&app, &patterns, &requests);
}

#[test]
fn patterns_that_meet_none_of_the_app_routes_are_logged_once_at_build() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let doc = Document::from_toml(
        r#"
        [settings]
        app_routes = ["/api/items", "/api/items/{id}", "GET /health"]

        [[limits]]
        name = "v1"
        quota = "1/s"
        routes = ["/v1/{*rest}", "POST /health", "/api/{*rest}"]
        "#,
    )
    .unwrap();
    let layer = layer(&doc);
    let logged = lines.matching("can meet none of the app's routes");
    assert_eq!(logged.len(), 2, "{logged:?}");
    assert!(logged[0].contains("`/v1/{*rest}`"), "{logged:?}");
    assert!(logged[1].contains("`POST /health`"), "{logged:?}");
    // Only logged: the entries still limit what they match (a 404 under Router::layer).
    let app = Router::new()
        .route("/api/items", any_method(|| async { "" }))
        .layer(layer);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let statuses: Vec<StatusCode> = runtime.block_on(async {
        let mut s = Vec::new();
        for _ in 0..2 {
            let r = Request::get("/v1/x").body(Body::empty()).unwrap();
            s.push(app.clone().oneshot(r).await.unwrap().status());
        }
        s
    });
    assert_eq!(
        statuses,
        [StatusCode::NOT_FOUND, StatusCode::TOO_MANY_REQUESTS]
    );

    // An app route that could match nothing is an error naming the document's field.
    let err = Document::from_toml(
        r#"
        [settings]
        app_routes = ["/ok", "/users/:id"]
        [[limits]]
        name = "a"
        quota = "1/s"
        routes = ["/ok"]
        "#,
    )
    .unwrap()
    .layer(MemoryStore::new())
    .map(|_| ())
    .unwrap_err();
    assert_eq!(err.field(), "settings.app_routes[1]", "{err}");
    assert!(err.reason().contains("{id}"), "{err}");

    // The check is bounded: more than 10,000 app routes are refused, not compared.
    let many: Vec<String> = (0..10_001).map(|i| format!("/r{i}")).collect();
    let err = tollgate::RateLimitLayer::builder(MemoryStore::new())
        .route(
            "/r1",
            tollgate::Limit::new("a", tollgate::Quota::per_second(1)),
        )
        .app_routes(many)
        .build()
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.field(), "app_routes", "{err}");
    assert!(err.reason().contains("10001 routes"), "{err}");
}

#[test]
fn the_check_tool_warns_of_a_pattern_that_meets_none_of_the_app_routes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(
        &path,
        r#"
[settings]
app_routes = ["/api/items", "POST /login"]

[[limits]]
name = "api"
quota = "10/s"
routes = ["/api/{*rest}", "GET /login", "/v1/{*rest}"]
"#,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-rules-under-test"))
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let warnings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert_eq!(warnings.len(), 2, "{stdout}");
    assert!(warnings[0].contains("`GET /login`"), "{stdout}");
    assert!(warnings[1].contains("`/v1/{*rest}`"), "{stdout}");
    assert!(stdout.trim_end().ends_with("1 limits, valid"), "{stdout}");
}

/// A template from a few segments: literals, `{a}`/`{b}` parameters, a trailing `{*rest}`.
fn template() -> impl Strategy<Value = String> {
    let seg = prop_oneof![
        4 => prop::sample::select(vec!["api", "items", "users", "me"]).prop_map(str::to_owned),
        1 => Just("{p}".to_owned()),
    ];
    (prop::collection::vec(seg, 0..3), any::<bool>()).prop_map(|(segs, rest)| {
        let mut t = String::new();
        let mut params = 0;
        for s in segs {
            t.push('/');
            if s == "{p}" {
                // Distinct names: axum refuses a template that repeats one.
                t.push_str(["{a}", "{b}", "{c}"][params]);
                params += 1;
            } else {
                t.push_str(&s);
            }
        }
        if rest || t.is_empty() {
            t.push_str(if rest { "/{*rest}" } else { "/" });
        }
        t
    })
}

/// A set of templates axum takes together (no two conflict).
fn table(max: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(template(), 1..max).prop_map(|all| {
        let mut router = matchit::Router::new();
        let mut kept = Vec::new();
        for t in all {
            if !kept.contains(&t) && router.insert(t.as_str(), ()).is_ok() {
                kept.push(t);
            }
        }
        kept
    })
}

fn method() -> impl Strategy<Value = Method> {
    prop::sample::select(vec![Method::GET, Method::POST, Method::HEAD])
}

/// A request path: a few segments from the templates' words and others.
fn path() -> impl Strategy<Value = String> {
    let seg = prop::sample::select(vec!["api", "items", "users", "me", "7", "x", ""]);
    prop::collection::vec(seg, 1..5)
        .prop_map(|segs| segs.iter().map(|s| format!("/{s}")).collect::<String>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Over generated app routes, rule patterns (with and without methods) and requests,
    /// every place of the layer decides as the replay does.
    #[test]
    fn every_place_decides_as_simulate_does(
        app in table(5),
        patterns in table(5).prop_flat_map(|ts| {
            let n = ts.len();
            (Just(ts), prop::collection::vec(prop::option::of(method()), n))
        }),
        requests in prop::collection::vec((method(), path()), 1..24),
    ) {
        let (templates, methods) = patterns;
        let patterns: Vec<(Option<Method>, String)> =
            methods.into_iter().zip(templates).collect();
        // Requests for the app's own routes, too, so that `route_layer` sees some.
        let mut requests = requests;
        for (i, t) in app.iter().enumerate() {
            let path = t.replace("{*rest}", "x/y").replace("{a}", "me").replace("{b}", "7")
                .replace("{c}", "x");
            requests.push((if i % 2 == 0 { Method::GET } else { Method::POST }, path.clone()));
            requests.push((Method::GET, path));
        }
        agree(&app, &patterns, &requests);
    }
}
