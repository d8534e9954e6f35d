//! Rules as data: every field of a document over a real router, every error with its
//! line and field, JSON, and reloads (file written, renamed over, link swapped, SIGHUP,
//! calls) that keep buckets, drop removed limits and leave requests in flight alone.
#![cfg(all(feature = "rules", feature = "axum"))]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{Request, StatusCode};
use support::{Lines, body_json, count, header, send, sf_names, sf_param, statuses, with_peer};
use tollgate::clock::FakeClock;
use tollgate::rules::{CostSpec, Document, Format, KeySpec, LeaseSpec, LimitRule, Rules};
use tollgate::store::MemoryStore;
use tollgate::{ConfigError, Limiter, LimiterError};

fn store() -> MemoryStore<FakeClock> {
    MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)))
}

/// Rules from `text`, no file.
fn from_text(text: &str) -> Rules<MemoryStore<FakeClock>> {
    Rules::builder(store()).text(text).build().unwrap()
}

/// Rules from a file, watched with a short debounce, without SIGHUP.
fn from_file(path: &Path) -> Rules<MemoryStore<FakeClock>> {
    Rules::builder(store())
        .file(path)
        .debounce(Duration::from_millis(30))
        .sighup(false)
        .build()
        .unwrap()
}

fn router<St: tollgate::store::Store>(rules: &Rules<St>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/api/search", get(|| async { "ok" }))
        .route("/login", post(|| async { "ok" }))
        .route_layer(rules.layer())
        .route("/health", get(|| async { "ok" }))
}

/// A request from `peer` with `headers`.
fn req(method: &str, uri: &str, peer: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    with_peer(b.body(Body::empty()).unwrap(), peer)
}

fn get_from(peer: &str) -> Request<Body> {
    req("GET", "/", peer, &[])
}

/// The error of rules built from `text` (TOML) read from a file called `rules.toml`.
fn error_of(text: &str, format: Format) -> ConfigError {
    let dir = tempfile::tempdir().unwrap();
    let name = match format {
        Format::Toml => "rules.toml",
        _ => "rules.json",
    };
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    Rules::builder(store())
        .file(&path)
        .watch(false)
        .sighup(false)
        .build()
        .unwrap_err()
}

/// Waits up to 5 s for `done`.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    // Generous: it costs time only when something is wrong (CI machines may be loaded).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn quota_of(rules: &Rules<MemoryStore<FakeClock>>, name: &str) -> Option<String> {
    let doc = rules.document();
    doc.limits
        .iter()
        .find(|l| l.name == name)
        .and_then(|l| l.quota.clone())
}

const ONE_LIMIT: &str = "[[limits]]\nname = \"a\"\nquota = \"3/min\"\n";

// ---------------------------------------------------------------------------------------
// The document: every field.

#[test]
fn the_example_file_reads_every_field() {
    let doc = Document::from_toml(include_str!("../examples/rules.toml")).unwrap();
    doc.check().unwrap();
    let s = &doc.settings;
    assert_eq!(s.headers.as_deref(), Some("draft-11"));
    assert_eq!(
        s.trusted_proxies.as_deref(),
        Some(&["127.0.0.1/32".to_owned(), "10.0.0.0/8".to_owned()][..])
    );
    assert_eq!(s.client_ip_header.as_deref(), Some("x-forwarded-for"));
    assert_eq!(s.deny.as_deref(), Some(&["192.0.2.0/24".to_owned()][..]));
    assert_eq!(s.shadow_headers, Some(false));
    let names: Vec<&str> = doc.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "per-ip", "login", "search", "per-key", "smooth", "global", "tokens", "monthly"
        ]
    );
    let [
        per_ip,
        login,
        search,
        per_key,
        smooth,
        global,
        tokens,
        monthly,
    ] = &doc.limits[..]
    else {
        unreachable!()
    };
    assert_eq!(per_ip.key, Some(KeySpec::one("client_ip")));
    assert_eq!(per_ip.algorithm.as_deref(), Some("gcra"));
    assert_eq!(per_ip.cost, Some(CostSpec::Fixed(1)));
    assert_eq!(per_ip.mode.as_deref(), Some("enforce"));
    assert_eq!(per_ip.on_missing_key.as_deref(), Some("shared"));
    assert_eq!(per_ip.on_store_failure.as_deref(), Some("share"));
    assert_eq!(per_ip.routes, None);
    assert_eq!(
        login.key,
        Some(KeySpec(vec!["client_ip".into(), "header:x-user".into()]))
    );
    assert_eq!(login.missing_key_status, Some(400));
    let ban = login.ban.as_ref().unwrap();
    assert_eq!((ban.after, ban.for_.as_deref()), (3, Some("10m")));
    assert_eq!(ban.escalate, Some(tollgate::rules::Factor(2.0)));
    assert_eq!(
        (
            ban.within.as_deref(),
            ban.max.as_deref(),
            ban.forget.as_deref()
        ),
        (Some("1m"), Some("1d"), Some("1d"))
    );
    assert_eq!(login.ban_status, Some(403));
    assert_eq!(
        login.routes.as_deref(),
        Some(&["POST /login".to_owned()][..])
    );
    assert_eq!(search.phase.as_deref(), Some("aligned"));
    assert_eq!(search.cost, Some(CostSpec::From("query:pages".into())));
    assert_eq!(search.default_cost, Some(2));
    let plans = per_key.plans.as_ref().unwrap();
    assert_eq!(
        (plans.by.as_deref(), plans.default.as_deref()),
        (Some("header:x-api-key"), Some("free"))
    );
    assert_eq!(plans.quotas.len(), 2);
    assert_eq!(plans.quotas["pro"], "100/s; burst=500");
    assert_eq!(plans.keys.len(), 2);
    assert_eq!(plans.keys["key-pro-1"], "pro");
    assert_eq!(smooth.on_limit.as_deref(), Some("delay"));
    assert_eq!(smooth.max_wait.as_deref(), Some("1s"));
    assert_eq!(smooth.max_waiters, Some(50));
    assert_eq!(smooth.max_reserved, Some(20));
    assert_eq!(global.lease, Some(LeaseSpec::Auto));
    assert_eq!(global.lease_max_age.as_deref(), Some("1s"));
    assert_eq!(tokens.settle.as_deref(), Some("header:x-usage-tokens"));
    assert_eq!(tokens.max_debt, Some(20_000));
    assert_eq!(monthly.algorithm.as_deref(), Some("calendar"));
    assert_eq!(monthly.quota.as_deref(), Some("10000/month"));
    assert_eq!(monthly.time_zone.as_deref(), Some("Europe/Berlin"));
    // The printed form names every limit.
    let printed = doc.to_string();
    for name in names {
        assert!(printed.contains(&format!("{name}: ")), "{printed}");
    }
}

#[test]
fn json_reads_the_same_names() {
    let toml = Document::from_toml(
        r#"
        [settings]
        headers = "draft-7"
        hops = 1
        [[limits]]
        name = "k"
        key = ["client_ip", "query:tenant"]
        quota = "10/s"
        cost = "header:x-cost"
        default_cost = 3
        routes = ["/api/search"]
        [limits.plans]
        from = "query:plan"
        default = "a"
        a = "5/s"
        "#,
    );
    let json = Document::from_json(
        r#"{
          "settings": {"headers": "draft-7", "hops": 1},
          "limits": [{
            "name": "k", "key": ["client_ip", "query:tenant"], "quota": "10/s",
            "cost": "header:x-cost", "default_cost": 3, "routes": ["/api/search"],
            "plans": {"from": "query:plan", "default": "a", "a": "5/s"}
          }]
        }"#,
    );
    assert_eq!(toml.unwrap(), json.unwrap());
}

#[tokio::test]
async fn settings_headers_proxies_and_lists() {
    let rules = from_text(
        r#"
        [settings]
        headers = "draft-6"
        trusted_proxies = ["10.0.0.0/8"]
        allow = ["198.51.100.0/24"]
        deny = ["203.0.113.7"]
        [[limits]]
        name = "per-client"
        key = "client_ip"
        quota = "2/min"
        "#,
    );
    let app = router(&rules);
    // Behind the proxy, each client has its own bucket.
    let via =
        |client: &'static str| move || req("GET", "/", "10.0.0.1", &[("x-forwarded-for", client)]);
    let first = send(&app, via("192.0.2.1")()).await;
    assert_eq!(first.headers()["ratelimit-limit"], "2");
    assert_eq!(
        statuses(&app, 2, via("192.0.2.1")).await,
        [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]
    );
    assert_eq!(
        send(&app, via("192.0.2.2")()).await.status(),
        StatusCode::OK
    );
    // Allowed network: never limited, no fields; denied address: 403.
    let allowed = statuses(&app, 5, via("198.51.100.9")).await;
    assert_eq!(count(&allowed, StatusCode::OK), 5);
    assert_eq!(
        send(&app, via("203.0.113.7")()).await.status(),
        StatusCode::FORBIDDEN
    );

    // `hops` and RFC 7239 `Forwarded`; no fields at all with `none`.
    let rules = from_text(
        r#"
        [settings]
        headers = "none"
        hops = 1
        client_ip_header = "forwarded"
        [[limits]]
        name = "per-client"
        key = "client_ip"
        quota = "1/min"
        "#,
    );
    let app = router(&rules);
    let fwd = |client: &'static str| move || req("GET", "/", "10.9.9.9", &[("forwarded", client)]);
    let ok = send(&app, fwd("for=192.0.2.1")()).await;
    assert!(header(ok.headers(), "ratelimit").is_none());
    assert_eq!(
        send(&app, fwd("for=192.0.2.1")()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, fwd("for=192.0.2.2")()).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn keys_costs_modes_missing_keys_and_routes() {
    let rules = from_text(
        r#"
        [[limits]]
        name = "login"
        key = ["peer_ip", "header:x-user"]
        quota = "2/min"
        on_missing_key = "reject"
        missing_key_status = 401
        routes = ["POST /login"]

        [[limits]]
        name = "search"
        key = "query:tenant"
        quota = "10/min"
        cost = "query:pages"
        default_cost = 4
        on_missing_key = "skip"
        routes = ["GET /api/search"]

        [[limits]]
        name = "watch"
        quota = "1/min"
        mode = "shadow"
        on_store_failure = "deny"
        routes = ["/api/search"]
        "#,
    );
    let app = router(&rules);
    // A composite key: user per address; the route applies to POST only.
    let login =
        |user: &'static str| move || req("POST", "/login", "192.0.2.1", &[("x-user", user)]);
    assert_eq!(
        statuses(&app, 3, login("alice")).await,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(send(&app, login("bob")()).await.status(), StatusCode::OK);
    let no_user = req("POST", "/login", "192.0.2.1", &[]);
    let refused = send(&app, no_user).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    // A 401 carries a challenge (the default, none being configured) and names the header.
    assert_eq!(
        refused.headers()["www-authenticate"],
        "ApiKey",
        "{:?}",
        refused.headers()
    );
    let detail = body_json(refused).await["detail"].clone();
    assert!(
        detail
            .as_str()
            .unwrap()
            .contains("needs the `x-user` header"),
        "{detail}"
    );
    // `/` has no limit at all.
    assert_eq!(
        count(
            &statuses(&app, 5, || get_from("192.0.2.1")).await,
            StatusCode::OK
        ),
        5
    );

    // Cost from the query, default 4 without it; the shadow limit (1/min) never refuses.
    let search = |q: &'static str| move || req("GET", q, "192.0.2.1", &[]);
    let r = send(&app, search("/api/search?tenant=t&pages=5")()).await;
    assert_eq!(r.status(), StatusCode::OK);
    let fields = header(r.headers(), "ratelimit").unwrap();
    assert_eq!(sf_names(&fields), ["search"], "shadow limits are not shown");
    assert_eq!(sf_param(&fields, "search", "r"), Some(5));
    let r = send(&app, search("/api/search?tenant=t")()).await;
    assert_eq!(
        sf_param(&header(r.headers(), "ratelimit").unwrap(), "search", "r"),
        Some(1)
    );
    assert_eq!(
        send(&app, search("/api/search?tenant=t")()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // No tenant: the search limit is skipped.
    assert_eq!(
        send(&app, search("/api/search")()).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn plans_choose_the_quota_per_request() {
    let rules = from_text(
        r#"
        [[limits]]
        name = "per-key"
        key = "header:x-api-key"
        [limits.plans]
        from = "header:x-plan"
        default = "free"
        free = "2/min"
        pro = "5/min"
        "#,
    );
    let app = router(&rules);
    let call = |key: &'static str, plan: Option<&'static str>| {
        move || {
            let mut h = vec![("x-api-key", key)];
            h.extend(plan.map(|p| ("x-plan", p)));
            req("GET", "/", "192.0.2.1", &h)
        }
    };
    let pro = statuses(&app, 6, call("k1", Some("pro"))).await;
    assert_eq!(count(&pro, StatusCode::OK), 5);
    let r = send(&app, call("k2", Some("pro"))()).await;
    let policy = header(r.headers(), "ratelimit-policy").unwrap();
    assert_eq!(
        sf_names(&policy),
        ["per-key"],
        "plans share the limit's name"
    );
    assert_eq!(sf_param(&policy, "per-key", "q"), Some(5));
    // No plan, or one not in the table: the default plan.
    assert_eq!(
        count(&statuses(&app, 3, call("k3", None)).await, StatusCode::OK),
        2
    );
    assert_eq!(
        count(
            &statuses(&app, 3, call("k4", Some("gold"))).await,
            StatusCode::OK
        ),
        2
    );
}

#[tokio::test]
async fn plans_without_a_default_leave_other_plans_unlimited() {
    let rules = from_text(
        r#"
        [[limits]]
        name = "per-key"
        key = "header:x-api-key"
        on_missing_key = "skip"
        rule_id = 7
        [limits.plans]
        from = "header:x-plan"
        free = "2/min"
        "#,
    );
    assert_eq!(rules.document().limits[0].rule_id, Some(7));
    assert!(rules.document().to_string().contains("(no default)"));
    let app = router(&rules);
    let call = |plan: Option<&'static str>| {
        move || {
            let mut h = vec![("x-api-key", "k1")];
            h.extend(plan.map(|p| ("x-plan", p)));
            req("GET", "/", "192.0.2.1", &h)
        }
    };
    assert_eq!(
        count(&statuses(&app, 3, call(Some("free"))).await, StatusCode::OK),
        2
    );
    // The same key, another plan or none: not limited by this limit.
    assert_eq!(
        count(&statuses(&app, 5, call(Some("gold"))).await, StatusCode::OK),
        5
    );
    assert_eq!(
        count(&statuses(&app, 5, call(None)).await, StatusCode::OK),
        5
    );
}

/// Plans by API key: requests of `k-pro` get the pro quota, unknown keys the default;
/// a plan the client names in a header changes nothing.
const PLANS_BY_KEY: &str = r#"
[[limits]]
name = "per-key"
key = "header:x-api-key"
[limits.plans]
by = "header:x-api-key"
default = "free"
free = "2/min"
pro = "5/min"
[limits.plans.keys]
"k-pro" = "pro"
"k-free" = "free"
"#;

fn with_key(key: &'static str) -> impl Fn() -> Request<Body> {
    move || {
        req(
            "GET",
            "/",
            "192.0.2.1",
            &[("x-api-key", key), ("x-plan", "pro")],
        )
    }
}

#[tokio::test]
async fn plans_by_api_key_come_from_the_key_table_not_from_the_client() {
    let rules = from_text(PLANS_BY_KEY);
    let app = router(&rules);
    assert_eq!(
        count(&statuses(&app, 6, with_key("k-pro")).await, StatusCode::OK),
        5
    );
    let r = send(&app, with_key("k-pro")()).await;
    let policy = header(r.headers(), "ratelimit-policy").unwrap();
    assert_eq!(sf_param(&policy, "per-key", "q"), Some(5));
    // A listed free key, and a key not in the table, have the default plan, whatever
    // their `x-plan` says.
    for key in ["k-free", "k-unknown"] {
        assert_eq!(
            count(&statuses(&app, 4, with_key(key)).await, StatusCode::OK),
            2,
            "{key}"
        );
    }
}

#[tokio::test]
async fn the_key_table_is_reloaded_with_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, PLANS_BY_KEY).unwrap();
    let rules = Rules::builder(store())
        .file(&path)
        .watch(false)
        .sighup(false)
        .build()
        .unwrap();
    let app = router(&rules);
    assert_eq!(
        count(
            &statuses(&app, 3, with_key("k-unknown")).await,
            StatusCode::OK
        ),
        2
    );
    // `k-new` is added to the table as a pro key; `k-free` is dropped (the default plan).
    std::fs::write(
        &path,
        PLANS_BY_KEY.replace("\"k-free\" = \"free\"", "\"k-new\" = \"pro\""),
    )
    .unwrap();
    rules.reload_file().unwrap();
    assert_eq!(
        rules.document().limits[0].plans.as_ref().unwrap().keys["k-new"],
        "pro"
    );
    // A key of the old table would have had 2 requests; `k-new` has the pro plan's 5.
    assert_eq!(
        count(&statuses(&app, 6, with_key("k-new")).await, StatusCode::OK),
        5
    );
    // A table naming a plan that does not exist is refused whole; the old table stays.
    std::fs::write(
        &path,
        PLANS_BY_KEY.replace("\"k-free\" = \"free\"", "\"k-x\" = \"gold\""),
    )
    .unwrap();
    let err = rules.reload_file().unwrap_err();
    assert_eq!(
        (err.field(), err.line()),
        ("limits[0].plans.keys.k-x", Some(12))
    );
    assert_eq!(
        rules.document().limits[0].plans.as_ref().unwrap().keys["k-new"],
        "pro"
    );
}

#[tokio::test]
async fn plans_from_an_extension_set_by_authentication() {
    let rules = from_text(
        r#"
        [[limits]]
        name = "per-key"
        key = "header:x-api-key"
        on_missing_key = "skip"
        [limits.plans]
        from = "extension"
        free = "2/min"
        pro = "5/min"
        "#,
    );
    // The application's authentication: a known key's plan as an extension.
    async fn auth(
        mut request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        let plan = match request.headers().get("x-api-key").map(|k| k.as_bytes()) {
            Some(b"k-pro") => Some(tollgate::Plan::from_static("pro")),
            Some(b"k-free") => Some(tollgate::Plan::new(String::from("free"))),
            _ => None,
        };
        if let Some(plan) = plan {
            request.extensions_mut().insert(plan);
        }
        next.run(request).await
    }
    let app = router(&rules).route_layer(axum::middleware::from_fn(auth));
    assert_eq!(
        count(&statuses(&app, 6, with_key("k-pro")).await, StatusCode::OK),
        5
    );
    assert_eq!(
        count(&statuses(&app, 3, with_key("k-free")).await, StatusCode::OK),
        2
    );
    // No plan from the authentication (an `x-plan` header is not read): without a
    // default plan, the limit does not apply.
    assert_eq!(
        count(
            &statuses(&app, 6, with_key("k-other")).await,
            StatusCode::OK
        ),
        6
    );
}

#[tokio::test]
async fn a_missing_key_challenge_is_the_401s_www_authenticate() {
    let rules = from_text(
        r#"
        [[limits]]
        name = "per-key"
        key = ["header:x-tenant", "query:key"]
        quota = "2/min"
        on_missing_key = "reject"
        missing_key_challenge = 'ApiKey realm="api", param="key"'
        "#,
    );
    let refused = send(&router(&rules), get_from("192.0.2.1")).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        refused.headers()["www-authenticate"],
        r#"ApiKey realm="api", param="key""#
    );
    assert_eq!(
        body_json(refused).await["detail"],
        "This endpoint needs the `x-tenant` header and the `key` query parameter \
         (rate limit \"per-key\" counts requests by it)."
    );
}

#[tokio::test]
async fn algorithms_and_phases() {
    for (algorithm, phase) in [
        ("fixed_window", Some("aligned")),
        ("fixed_window", Some("random")),
        ("fixed_window", Some("90s")),
        ("sliding_window", None),
        ("sliding_log", None),
        ("gcra", None),
    ] {
        let phase = phase.map_or(String::new(), |p| format!("phase = \"{p}\"\n"));
        let rules = from_text(&format!(
            "[[limits]]\nname = \"w\"\nquota = \"3/min\"\nalgorithm = \"{algorithm}\"\n{phase}"
        ));
        let got = statuses(&router(&rules), 4, || get_from("192.0.2.1")).await;
        assert_eq!(count(&got, StatusCode::OK), 3, "{algorithm} {phase}");
    }
}

// ---------------------------------------------------------------------------------------
// Errors: file, line, field path.

#[test]
fn every_error_names_file_line_and_field() {
    let base = "[[limits]]\nname = \"a\"\nquota = \"1/s\"\n";
    // (text, line, field, part of the reason)
    let cases: &[(String, usize, &str, &str)] = &[
        (format!("{base}quotaa = 1\n"), 4, "limits[0].quotaa", "unknown field `quotaa`"),
        ("[settings]\nheader = \"none\"\n".into(), 2, "settings.header", "unknown field"),
        ("[[limits]]\nname = 7\n".into(), 2, "limits[0].name", "expected a string"),
        ("[[limits]]\nquota = \"1/s\"\n".into(), 1, "limits[0]", "missing field `name`"),
        (format!("{base}default_cost = -1\n"), 4, "limits[0].default_cost", "-1"),
        (format!("{base}cost = -3\n"), 4, "limits[0].cost", "-3"),
        (format!("{base}cost = 0\n"), 4, "limits[0].cost", "1..=4294967295"),
        (format!("{base}cost = 2\n"), 4, "limits[0].cost", "exceeds the burst of 1"),
        (format!("{base}cost = \"cookie:x\"\n"), 4, "limits[0].cost", "unknown value `cookie:x`"),
        (format!("{base}cost = \"header:bad name\"\n"), 4, "limits[0].cost", "not a header name"),
        (format!("{base}default_cost = 2\n"), 4, "limits[0].default_cost", "read from the request"),
        ("[[limits]]\nname = \"a\"\n\nquota = \"5/fortnight\"\n".into(), 4, "limits[0].quota", "unknown unit `fortnight`"),
        ("[[limits]]\nname = \"a\"\nquota = \"0/s\"\n".into(), 3, "limits[0].quota", "rate"),
        ("[[limits]]\nname = \"a\"\nquota = \"2/s; burst=0\"\n".into(), 3, "limits[0].quota", "burst"),
        ("[[limits]]\nname = \"a\"\n".into(), 1, "limits[0].quota", "missing"),
        (format!("{base}\n[[limits]]\nname = \"b\"\nquota = \"1/s\"\n\n[[limits]]\nname = \"a\"\nquota = \"1/s\"\n"), 10, "limits[2].name", "also the name of limits[0]"),
        ("[[limits]]\nname = \" a\"\nquota = \"1/s\"\n".into(), 2, "limits[0].name", "whitespace"),
        (format!("{base}key = \"cookie\"\n"), 4, "limits[0].key", "unknown value `cookie`"),
        (format!("{base}key = []\n"), 4, "limits[0].key", "empty"),
        (format!("{base}key = [\"peer_ip\",\n  \"query:\"]\n"), 5, "limits[0].key[1]", "names no query parameter"),
        (format!("{base}key = \"client_ip\"\n"), 4, "limits[0].key", "trusted_proxies"),
        (format!("{base}algorithm = \"leaky\"\n"), 4, "limits[0].algorithm", "unknown value `leaky`"),
        (format!("{base}phase = \"random\"\n"), 4, "limits[0].phase", "only a `fixed_window`"),
        (format!("{base}algorithm = \"fixed_window\"\nphase = \"soon\"\n"), 5, "limits[0].phase", "aligned"),
        ("[[limits]]\nname = \"a\"\nquota = \"5/s; burst=9\"\nalgorithm = \"sliding_log\"\n".into(), 3, "limits[0].quota", "burst"),
        (format!("{base}mode = \"loud\"\n"), 4, "limits[0].mode", "enforce, shadow"),
        (format!("{base}on_missing_key = \"drop\"\n"), 4, "limits[0].on_missing_key", "shared, skip, reject"),
        (format!("{base}on_missing_key = \"reject\"\nmissing_key_status = 503\n"), 5, "limits[0].missing_key_status", "4xx"),
        (format!("{base}missing_key_status = 401\n"), 4, "limits[0].missing_key_status", "reject"),
        (format!("{base}missing_key_challenge = \"Bearer\"\n"), 4, "limits[0].missing_key_challenge", "reject"),
        (format!("{base}on_missing_key = \"reject\"\nmissing_key_status = 403\nmissing_key_challenge = \"Bearer\"\n"), 6, "limits[0].missing_key_challenge", "401"),
        (format!("{base}on_missing_key = \"reject\"\nmissing_key_challenge = \"\"\n"), 5, "limits[0].missing_key_challenge", "WWW-Authenticate"),
        (format!("{base}on_store_failure = \"retry\"\n"), 4, "limits[0].on_store_failure", "share, fallback, allow, deny"),
        (format!("{base}on_limit = \"queue\"\n"), 4, "limits[0].on_limit", "reject, delay"),
        (format!("{base}on_limit = \"delay\"\n"), 1, "limits[0].max_wait", "missing"),
        (format!("{base}on_limit = \"delay\"\nmax_wait = \"soon\"\n"), 5, "limits[0].max_wait", "duration"),
        (format!("{base}max_wait = \"1s\"\n"), 4, "limits[0].max_wait", "only a limit with"),
        (format!("{base}on_limit = \"delay\"\nmax_wait = \"1s\"\nmax_waiters = 0\n"), 6, "limits[0].max_waiters", "at least 1"),
        (format!("{base}algorithm = \"sliding_window\"\non_limit = \"delay\"\nmax_wait = \"1s\"\n"), 5, "limits[0].on_limit", "sliding"),
        (format!("{base}algorithm = \"fixed_window\"\nmax_reserved = 3\n"), 5, "limits[0].max_reserved", "GCRA"),
        (format!("{base}striped = 0\n"), 4, "limits[0].striped", "must be 1 to 64, not 0"),
        (format!("{base}striped = 65\n"), 4, "limits[0].striped", "must be 1 to 64, not 65"),
        (format!("{base}striped = 300\n"), 4, "limits[0].striped", "invalid value"),
        (format!("{base}routes = []\n"), 4, "limits[0].routes", "empty"),
        ("[[limits]]\nname = \"a\"\nalgorithm = \"calendar\"\nquota = \"1/d\"\ntime_zone = \"Europe/Berlim\"\n".into(), 5, "limits[0].time_zone", "IANA"),
        (format!("{base}time_zone = \"UTC\"\n"), 4, "limits[0].time_zone", "only a limit with `algorithm = \"calendar\"`"),
        ("[[limits]]\nname = \"a\"\nquota = \"1/month\"\n".into(), 3, "limits[0].quota", "month has no fixed length"),
        ("[[limits]]\nname = \"a\"\nalgorithm = \"calendar\"\nquota = \"1/min\"\n".into(), 4, "limits[0].quota", "per hour, day, week or month"),
        (format!("{base}routes = [\"/ok\",\n  \"login\"]\n"), 5, "limits[0].routes[1]", "starting with `/`"),
        (format!("{base}routes = [\"P@ST /x\"]\n"), 4, "limits[0].routes[0]", "not a method"),
        (format!("{base}routes = [\"/users/{{id\"]\n"), 4, "limits[0].routes[0]", "valid name"),
        (format!("{base}routes = [\"/u/{{id}}\"]\n[[limits]]\nname = \"b\"\nquota = \"1/s\"\nroutes = [\"/u/{{name}}\"]\n"), 8, "limits[1].routes[0]", "conflict"),
        (format!("{base}[limits.plans]\nfrom = \"header:p\"\ndefault = \"x\"\nx = \"1/s\"\n"), 3, "limits[0].quota", "each plan has its quota"),
        ("[[limits]]\nname = \"a\"\n[limits.plans]\nfrom = \"cookie:p\"\ndefault = \"x\"\nx = \"1/s\"\n".into(), 4, "limits[0].plans.from", "header:<name>"),
        ("[[limits]]\nname = \"a\"\n[limits.plans]\nfrom = \"header:p\"\ndefault = \"y\"\nx = \"1/s\"\n".into(), 5, "limits[0].plans.default", "not a plan"),
        ("[[limits]]\nname = \"a\"\n[limits.plans]\nby = \"header:k\"\ndefault = \"x\"\nx = \"1/s\"\n[limits.plans.keys]\nk1 = \"x\"\nk2 = \"y\"\n".into(), 9, "limits[0].plans.keys.k2", "`y` is not a plan"),
        ("[[limits]]\nname = \"a\"\n[limits.plans]\nfrom = \"header:p\"\nby = \"header:k\"\nx = \"1/s\"\n".into(), 5, "limits[0].plans.by", "not both"),
        ("[[limits]]\nname = \"a\"\n[limits.plans]\nby = \"header:k\"\nx = \"1/s\"\nkeys = 3\n".into(), 6, "limits[0].plans.keys", "expected a map"),
        ("[[limits]]\nname = \"a\"\n[limits.plans]\nfrom = \"header:p\"\ndefault = \"x\"\nx = \"1/eon\"\n".into(), 6, "limits[0].plans.x", "unknown unit"),
        ("[[limits]]\nname = \"a\"\n[limits.plans]\nfrom = \"header:p\"\ndefault = \"x\"\nx = 1\n".into(), 6, "limits[0].plans.x", "expected a string"),
        ("[[limits]]\nname = \"a\"\non_missing_key = \"shared\"\n[limits.plans]\nfrom = \"header:p\"\nx = \"1/s\"\n".into(), 3, "limits[0].on_missing_key", "`on_missing_key = \"skip\"`"),
        ("[[limits]]\nname = \"a\"\nquota = \"1/s\"\nrule_id = -3\n".into(), 4, "limits[0].rule_id", "invalid value"),
        ("[[limits]]\nname = \"a\"\nquota = \"1/s\"\nrule_id = 9223372036854775808\n".into(), 4, "limits[0].rule_id", "i64::MAX"),
        ("[[limits]]\nname = \"a\"\nalgorithm = \"fixed_window\"\n[limits.plans]\nfrom = \"header:p\"\ndefault = \"x\"\nx = \"1/s\"\n".into(), 4, "limits[0].plans", "only `algorithm = \"gcra\"`"),
        ("[[limits]]\nname = \"a\"\ncost = 20\n[limits.plans]\nfrom = \"header:p\"\ndefault = \"x\"\nx = \"100/s\"\ny = \"1/s; burst=10\"\n".into(), 3, "limits[0].cost", "plan `y`"),
        (format!("[settings]\nheaders = \"draft-12\"\n{base}"), 2, "settings.headers", "draft-11"),
        (format!("[settings]\ntrusted_proxies = [\"10.0.0.0/8\", \"nope\"]\n{base}"), 2, "settings.trusted_proxies[1]", "neither"),
        (format!("[settings]\ntrusted_proxies = []\nhops = 1\n{base}"), 3, "settings.hops", "not both"),
        (format!("[settings]\nhops = 0\n{base}"), 2, "settings.hops", "at least 1"),
        (format!("[settings]\nclient_ip_header = \"forwarded\"\n{base}"), 2, "settings.client_ip_header", "needs"),
        (format!("[settings]\nhops = 1\nclient_ip_header = \"x-real-ip\"\n{base}"), 3, "settings.client_ip_header", "unknown value"),
        (format!("[settings]\ndeny = [\"10.0.0.0/8\", \"x\"]\n{base}"), 2, "settings.deny[1]", "neither"),
        ("[[limits]]\nname = \"a\"\nquota = \"1/s\"\nroutes = [\"/x\"\n".into(), 4, "", "invalid TOML"),
        // Limits inside long-lived requests (issue 42).
        (format!("{base}per = \"packet\"\n"), 4, "limits[0].per", "request, message, byte"),
        (format!("{base}direction = \"out\"\n"), 4, "limits[0].direction", "only a limit of messages or bytes"),
        (format!("{base}rate_after = \"1MiB\"\n"), 4, "limits[0].rate_after", "only a limit of messages or bytes"),
        ("[[limits]]\nname = \"s\"\nquota = \"10/s\"\nper = \"message\"\ndirection = \"up\"\n".into(), 5, "limits[0].direction", "in, out, both"),
        ("[[limits]]\nname = \"s\"\nquota = \"10/s\"\nper = \"message\"\nover_limit = \"drop\"\n".into(), 5, "limits[0].over_limit", "wait, end"),
        ("[[limits]]\nname = \"s\"\nquota = \"10/s\"\nper = \"message\"\nrate_after = \"1MiB\"\n".into(), 5, "limits[0].rate_after", "only a limit of bytes"),
        ("[[limits]]\nname = \"s\"\nquota = \"10/s\"\nper = \"message\"\nroutes = [\"/x\"]\n".into(), 5, "limits[0].routes", "charged by the streams"),
        ("[[limits]]\nname = \"s\"\nquota = \"10/s\"\nper = \"message\"\non_limit = \"delay\"\n".into(), 5, "limits[0].on_limit", "`over_limit` says"),
        ("[[limits]]\nname = \"s\"\nquota = \"10/s\"\nper = \"message\"\nover_limit = \"end\"\nmax_wait = \"1s\"\n".into(), 6, "limits[0].max_wait", "only a limit with `over_limit = \"wait\"`"),
        ("[[limits]]\nname = \"s\"\nquota = \"10/s\"\nper = \"message\"\nmax_wait = \"100us\"\n".into(), 5, "limits[0].max_wait", "at least 1ms"),
        ("[[limits]]\nname = \"s\"\nquota = \"10/s\"\nper = \"message\"\nover_limit = \"end\"\nmax_waiters = 3\n".into(), 6, "limits[0].max_waiters", "only a limit with `over_limit = \"wait\"` has waiters"),
        ("[[limits]]\nname = \"s\"\nquota = \"10/s\"\nper = \"message\"\nmax_waiters = 0\n".into(), 5, "limits[0].max_waiters", "at least 1"),
        ("[[limits]]\nname = \"b\"\nquota = \"1MiB/fortnight\"\nper = \"byte\"\n".into(), 3, "limits[0].quota", "period"),
        ("[[limits]]\nname = \"b\"\nquota = \"1MiB/s; burst=1B\"\nper = \"byte\"\n".into(), 3, "limits[0].quota", "burst: 1 bytes is less than one token"),
        ("[[limits]]\nname = \"b\"\nquota = \"1MiB/s; burst=256KiB\"\nper = \"byte\"\nrate_after = \"1 parsec\"\n".into(), 5, "limits[0].rate_after", "unknown unit `parsec`"),
        ("[[limits]]\nname = \"b\"\nquota = \"1MiB/s; burst=256KiB\"\nper = \"byte\"\nin_flight = 3\n".into(), 3, "limits[0].quota", "in flight"),
        // A limit of bytes given routes paces their bodies (either way, or both) with an
        // algorithm that waits.
        ("[[limits]]\nname = \"b\"\nquota = \"32KiB/s\"\nper = \"byte\"\ndirection = \"out\"\nalgorithm = \"sliding_window\"\nroutes = [\"/files/{*path}\"]\n".into(), 6, "limits[0].algorithm", "take no reservations"),
        // One limit across regions (issue 43).
        (format!("{base}[regions]\nlocal = \"ap\"\n[regions.stores]\neu = \"redis://eu\"\n"), 5, "regions.local", "not one of the regions"),
        (format!("{base}[regions]\nlocal = \"eu\"\ninterval = \"often\"\n[regions.stores]\neu = \"redis://eu\"\n"), 6, "regions.interval", "unit"),
        (format!("{base}[regions]\nlocal = \"eu\"\nfloor = 2.0\n[regions.stores]\neu = \"redis://eu\"\n"), 6, "regions.floor", "0 to 1"),
        ("[[limits]]\nname = \"a\"\nquota = \"1/s\"\n[regions]\nlocal = \"eu\"\n[regions.stores]\neu = \"redis://eu\"\nus = \"redis://us\"\n".into(), 3, "limits[0].quota", "split between 2 regions"),
    ];
    for (text, line, field, reason) in cases {
        let err = error_of(text, Format::Toml);
        let at = format!("{text}\n=> {err}");
        assert_eq!(err.line(), Some(*line), "{at}");
        assert_eq!(err.field(), *field, "{at}");
        assert!(err.reason().contains(reason), "{at}");
        assert!(err.file().unwrap().ends_with("rules.toml"), "{at}");
        let shown = err.to_string();
        let prefix = if field.is_empty() {
            format!("rules.toml:{line}: ")
        } else {
            format!("rules.toml:{line}: {field}: ")
        };
        assert!(shown.contains(&prefix), "{shown} lacks {prefix}");
    }
    // No limit at all, and no file: no line to name.
    let err = error_of("", Format::Toml);
    assert_eq!((err.field(), err.line()), ("limits", None));
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let err = Rules::builder(store()).file(&missing).build().unwrap_err();
    assert!(err.to_string().contains("nope.toml: cannot read"), "{err}");
}

#[test]
fn json_errors_name_line_and_field() {
    let cases: &[(&str, usize, &str, &str)] = &[
        (
            "{\"limits\": [\n  {\"name\": \"a\",\n   \"quotaa\": \"1/s\"}]}",
            3,
            "limits[0].quotaa",
            "unknown field",
        ),
        (
            "{\"limits\": [\n  {\"name\": \"a\", \"quota\": \"1/s\"},\n  {\"name\": \"b\",\n   \"quota\": \"1/x\"}]}",
            4,
            "limits[1].quota",
            "unknown unit",
        ),
        (
            "{\"limits\": [\n  {\"name\": \"a\",\n   \"quota\": \"1/s\",\n   \"mode\": \"loud\"}]}",
            4,
            "limits[0].mode",
            "unknown value",
        ),
        (
            "{\"limits\": [\n  {\"name\": \"a\",\n   \"quota\": \"1/s\",\n   \"cost\": true}]}",
            4,
            "limits[0].cost",
            "a whole number",
        ),
        (
            "{\"limits\": [\n  {\"name\": \"a\",\n   \"quota\": \"1/s\"}\n",
            4,
            "",
            "invalid JSON",
        ),
    ];
    for (text, line, field, reason) in cases {
        let err = error_of(text, Format::Json);
        let at = format!("{text}\n=> {err}");
        assert_eq!(err.line(), Some(*line), "{at}");
        assert_eq!(err.field(), *field, "{at}");
        assert!(err.reason().contains(reason), "{at}");
        assert!(
            err.to_string()
                .starts_with(&err.file().unwrap().to_string()),
            "{at}"
        );
    }
}

#[test]
fn documents_built_by_code_are_checked_alike() {
    let mut doc = Document::default();
    doc.limits.push(LimitRule {
        name: "a".into(),
        quota: Some("1/s".into()),
        ..LimitRule::default()
    });
    doc.check().unwrap();
    doc.limits.push(doc.limits[0].clone());
    let err = doc.check().unwrap_err();
    assert_eq!(
        (err.field(), err.line(), err.file()),
        ("limits[1].name", None, None)
    );
}

// ---------------------------------------------------------------------------------------
// Reloads.

/// `n` requests from one peer; how many passed.
async fn passes(app: &Router, n: usize) -> usize {
    count(
        &statuses(app, n, || get_from("192.0.2.1")).await,
        StatusCode::OK,
    )
}

#[tokio::test]
async fn reload_by_writing_the_file_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, ONE_LIMIT).unwrap();
    let rules = from_file(&path);
    std::fs::write(&path, ONE_LIMIT.replace("3/min", "7/min")).unwrap();
    eventually("the new quota", || {
        quota_of(&rules, "a").as_deref() == Some("7/min")
    })
    .await;
    assert_eq!(passes(&router(&rules), 8).await, 7);
    let status = rules.status();
    assert_eq!(
        (status.reloads, status.failures, status.healthy),
        (1, 0, true)
    );
}

#[tokio::test]
async fn reload_by_renaming_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, ONE_LIMIT).unwrap();
    let rules = from_file(&path);
    let tmp = dir.path().join(".rules.toml.swp");
    std::fs::write(&tmp, ONE_LIMIT.replace("3/min", "5/min")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    eventually("the new quota", || {
        quota_of(&rules, "a").as_deref() == Some("5/min")
    })
    .await;
    // And again: the watch survives the file being replaced.
    std::fs::write(&tmp, ONE_LIMIT.replace("3/min", "6/min")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    eventually("the newer quota", || {
        quota_of(&rules, "a").as_deref() == Some("6/min")
    })
    .await;
    assert_eq!(rules.status().reloads, 2);
}

#[cfg(unix)]
#[tokio::test]
async fn reload_by_swapping_a_kubernetes_style_link() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // rules.toml -> ..data/rules.toml, ..data -> ..v1 (what a ConfigMap volume holds)
    let version = |name: &str, quota: &str| {
        std::fs::create_dir(d.join(name)).unwrap();
        std::fs::write(
            d.join(name).join("rules.toml"),
            ONE_LIMIT.replace("3/min", quota),
        )
        .unwrap();
    };
    version("..v1", "3/min");
    symlink("..v1", d.join("..data")).unwrap();
    symlink("..data/rules.toml", d.join("rules.toml")).unwrap();
    let rules = from_file(&d.join("rules.toml"));
    assert_eq!(quota_of(&rules, "a").as_deref(), Some("3/min"));
    // The kubelet's update: a new version, a new link renamed over `..data`, the old one gone.
    version("..v2", "9/min");
    symlink("..v2", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    std::fs::remove_dir_all(d.join("..v1")).unwrap();
    eventually("the swapped rules", || {
        quota_of(&rules, "a").as_deref() == Some("9/min")
    })
    .await;
    assert_eq!(rules.status().failures, 0);
}

#[cfg(unix)]
#[tokio::test]
async fn reload_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, ONE_LIMIT).unwrap();
    let rules = Rules::builder(store())
        .file(&path)
        .watch(false)
        .build()
        .unwrap();
    std::fs::write(&path, ONE_LIMIT.replace("3/min", "4/min")).unwrap();
    // Not watched: nothing happens until the signal.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(quota_of(&rules, "a").as_deref(), Some("3/min"));
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    eventually("the signalled reload", || {
        quota_of(&rules, "a").as_deref() == Some("4/min")
    })
    .await;
}

#[tokio::test]
async fn programmatic_reloads_from_text_file_and_document() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.json");
    std::fs::write(&path, r#"{"limits": [{"name": "a", "quota": "3/min"}]}"#).unwrap();
    let rules = Rules::builder(store())
        .file(&path)
        .watch(false)
        .sighup(false)
        .build()
        .unwrap();
    // JSON, from the file's name.
    rules
        .reload(r#"{"limits": [{"name": "a", "quota": "4/min"}]}"#)
        .unwrap();
    assert_eq!(quota_of(&rules, "a").as_deref(), Some("4/min"));
    std::fs::write(&path, r#"{"limits": [{"name": "a", "quota": "5/min"}]}"#).unwrap();
    rules.reload_file().unwrap();
    assert_eq!(quota_of(&rules, "a").as_deref(), Some("5/min"));
    let mut doc = (*rules.document()).clone();
    doc.limits[0].quota = Some("6/min".into());
    rules.reload_document(doc).unwrap();
    assert_eq!(quota_of(&rules, "a").as_deref(), Some("6/min"));
    assert_eq!(passes(&router(&rules), 7).await, 6);
    assert_eq!(rules.status().reloads, 3);
    // A document's errors have no line, a text's have one.
    let mut bad = (*rules.document()).clone();
    bad.limits[0].quota = Some("6/eon".into());
    let err = rules.reload_document(bad).unwrap_err();
    assert_eq!((err.field(), err.line()), ("limits[0].quota", None));
    let err = rules
        .reload("{\"limits\": [\n{\"name\": \"a\", \"quota\": \"6/eon\"}]}")
        .unwrap_err();
    assert_eq!((err.field(), err.line()), ("limits[0].quota", Some(2)));
    assert_eq!(rules.status().failures, 2);
}

#[tokio::test]
async fn an_invalid_file_is_refused_whole_and_the_old_rules_keep_serving() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, ONE_LIMIT).unwrap();
    let outcomes = Arc::new(AtomicUsize::new(0));
    let seen = outcomes.clone();
    let rules = Rules::builder(store())
        .file(&path)
        .debounce(Duration::from_millis(30))
        .sighup(false)
        .on_reload(move |outcome| {
            if outcome.is_err() {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        })
        .build()
        .unwrap();
    let app = router(&rules);
    assert_eq!(passes(&app, 2).await, 2);
    // A valid first limit and a broken second one: nothing of it is taken.
    let broken = ONE_LIMIT.replace("3/min", "100/min")
        + "\n[[limits]]\nname = \"b\"\nquota = \"1/min\"\nalgorithm = \"leaky\"\n";
    std::fs::write(&path, &broken).unwrap();
    eventually("the refused reload", || rules.status().failures == 1).await;
    let status = rules.status();
    assert!(!status.healthy);
    let err = status.last_error.unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "{}:8: limits[1].algorithm: unknown value `leaky`; expected one of: gcra, fixed_window, sliding_window, sliding_log, calendar",
            path.display()
        )
    );
    assert_eq!(outcomes.load(Ordering::SeqCst), 1);
    // The old rules still serve: one of the 3 left, then 429.
    assert_eq!(passes(&app, 3).await, 1);
    assert_eq!(rules.document().limits.len(), 1);

    // One ERROR line per refused reload, naming what is wrong.
    let lines = Lines::default();
    {
        let _guard = lines.capture();
        rules.reload_file().unwrap_err();
    }
    let errors = lines.matching("ERROR");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("limits[1].algorithm"), "{errors:?}");
    assert_eq!(rules.status().failures, 2);

    // Fixed: taken, healthy again; the last error stays readable.
    std::fs::write(&path, ONE_LIMIT.replace("3/min", "5/min")).unwrap();
    eventually("the fixed rules", || rules.status().healthy).await;
    let status = rules.status();
    assert_eq!((status.reloads, status.failures), (1, 2));
    assert!(status.last_error.is_some());
}

#[tokio::test]
async fn buckets_keep_their_state_and_take_the_new_quota() {
    let rules = from_text("[[limits]]\nname = \"a\"\nkey = \"peer_ip\"\nquota = \"3/min\"\n");
    let app = router(&rules);
    assert_eq!(passes(&app, 4).await, 3);
    // Same name, another limit beside it: still empty.
    rules
        .reload("[[limits]]\nname = \"a\"\nkey = \"peer_ip\"\nquota = \"3/min\"\n[[limits]]\nname = \"other\"\nquota = \"100/min\"\n")
        .unwrap();
    assert_eq!(passes(&app, 2).await, 0);
    // A new quota applies to the kept bucket: 10/min with a burst of 20. The bucket is
    // 60 s (three 20 s tokens) in debt of a 120 s capacity: (120 - 60) / 6 s = 10 tokens.
    rules
        .reload("[[limits]]\nname = \"a\"\nkey = \"peer_ip\"\nquota = \"10/min; burst=20\"\n")
        .unwrap();
    assert_eq!(passes(&app, 12).await, 10);
    // A renamed limit is a new one, with a full bucket.
    rules
        .reload("[[limits]]\nname = \"b\"\nkey = \"peer_ip\"\nquota = \"3/min\"\n")
        .unwrap();
    assert_eq!(passes(&app, 4).await, 3);
}

#[tokio::test]
async fn a_removed_limit_is_no_longer_checked() {
    let rules = from_text(
        "[[limits]]\nname = \"a\"\nquota = \"100/min\"\n[[limits]]\nname = \"b\"\nquota = \"1/min\"\n",
    );
    let app = router(&rules);
    let limiter = rules.limiter();
    assert_eq!(limiter.limits(), ["a", "b"]);
    assert_eq!(passes(&app, 3).await, 1);
    rules
        .reload("[[limits]]\nname = \"a\"\nquota = \"100/min\"\n")
        .unwrap();
    let r = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(sf_names(&header(r.headers(), "ratelimit").unwrap()), ["a"]);
    assert_eq!(passes(&app, 5).await, 5);
    // The handle follows the current rules.
    assert_eq!(limiter.limits(), ["a"]);
    assert!(matches!(
        limiter.check("b", "x", 1).await,
        Err(LimiterError::UnknownLimit { .. })
    ));
    // `/health` is outside the layer.
    let health = send(&app, req("GET", "/health", "192.0.2.1", &[])).await;
    assert!(header(health.headers(), "ratelimit").is_none());
}

#[tokio::test]
async fn requests_in_flight_finish_on_the_rules_they_started_with() {
    // The handle in a request's extensions (asked for) is the one of its rules.
    let rules = Rules::builder(store())
        .text("[[limits]]\nname = \"old\"\nquota = \"5/min\"\n")
        .configure(|b| b.limiter_extension(true))
        .build()
        .unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let (r, e) = (release.clone(), entered.clone());
    let app = Router::new()
        .route(
            "/",
            get(move |Extension(limiter): Extension<Limiter>| {
                let (r, e) = (r.clone(), e.clone());
                async move {
                    e.notify_one();
                    r.notified().await;
                    limiter.limits().join(",")
                }
            }),
        )
        .route_layer(rules.layer());
    let pending = tokio::spawn({
        let app = app.clone();
        async move { send(&app, get_from("192.0.2.1")).await }
    });
    entered.notified().await;
    rules
        .reload("[[limits]]\nname = \"new\"\nquota = \"5/min\"\n")
        .unwrap();
    release.notify_one();
    let response = pending.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        sf_names(&header(response.headers(), "ratelimit").unwrap()),
        ["old"]
    );
    assert_eq!(support::body_text(response).await, "old");
    // The next request runs on the new rules.
    let next = tokio::spawn({
        let app = app.clone();
        async move { send(&app, get_from("192.0.2.1")).await }
    });
    entered.notified().await;
    release.notify_one();
    let response = next.await.unwrap();
    assert_eq!(
        sf_names(&header(response.headers(), "ratelimit").unwrap()),
        ["new"]
    );
    assert_eq!(support::body_text(response).await, "new");
}

#[tokio::test]
async fn a_busy_directory_does_not_delay_the_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, ONE_LIMIT).unwrap();
    let rules = from_file(&path);
    // A log beside the rules, written more often than the quiet period.
    let log = dir.path().join("server.log");
    let writer = tokio::spawn(async move {
        for i in 0.. {
            std::fs::write(&log, format!("line {i}\n")).unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    std::fs::write(&path, ONE_LIMIT.replace("3/min", "8/min")).unwrap();
    eventually("the reload", || {
        quota_of(&rules, "a").as_deref() == Some("8/min")
    })
    .await;
    writer.abort();
}

#[test]
fn the_check_tool_prints_the_limits_or_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, ONE_LIMIT).unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        "{\"limits\": [\n{\"name\": \"a\", \"quota\": \"3/eon\"}]}",
    )
    .unwrap();
    let run = |args: &[&Path]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-rules-under-test"))
            .arg("check")
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[&good]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("a: 3/min per global"), "{stdout}");
    let out = run(&[&bad]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr.trim(),
        format!(
            "{}:2: limits[0].quota: period: unknown unit `eon`; use ms, s, min, h or d",
            bad.display()
        )
    );
    assert_eq!(run(&[]).status.code(), Some(2));
}

#[test]
fn the_check_tool_prints_every_kind_of_limit_and_its_settings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kinds.toml");
    std::fs::write(
        &path,
        r#"
        [[limits]]
        name = "login"
        key = "peer_ip"
        quota = "5/min"
        mode = "shadow"
        on_store_failure = "deny"
        routes = ["POST /login"]
        ban = { after = 3, for = "10m", escalate = 2, max = "1d" }

        [[limits]]
        name = "conns"
        key = "header:x-api-key"
        in_flight = 10

        [[limits]]
        name = "monthly"
        key = "header:x-api-key"
        algorithm = "calendar"
        quota = "10000/month"
        time_zone = "Europe/Berlin"

        [[limits]]
        name = "tokens"
        quota = "1000/min; burst=5000"
        cost = "header:x-estimate"
        settle = "header:x-usage"

        [[limits]]
        name = "leased"
        quota = "1000/s"
        lease = 50
        on_store_failure = "fallback"

        [[limits]]
        name = "smooth"
        quota = "10/s; burst=5"
        on_limit = "delay"
        max_wait = "1s"

        [[limits]]
        name = "per-key"
        key = "header:x-api-key"
        [limits.plans]
        by = "header:x-api-key"
        default = "free"
        free = "10/min"
        pro = "10/s; burst=50"
        [limits.plans.keys]
        "secret-key-1" = "pro"
        "#,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-rules-under-test"))
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    // A limit's lines: `name: ...` and the indented lines after it.
    let block = |name: &str| -> String {
        let lines: Vec<&str> = stdout.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.starts_with(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in:\n{stdout}"));
        let n = lines[start + 1..]
            .iter()
            .take_while(|l| l.starts_with("  "))
            .count();
        lines[start..=start + n].join("\n")
    };
    let expect = |name: &str, lines: &[&str]| {
        let got = block(name);
        for line in lines {
            assert!(
                got.lines().any(|l| l == *line),
                "no line {line:?} in:\n{got}"
            );
        }
    };
    expect(
        "login",
        &[
            "login: 5/min per peer_ip",
            "  kind: rate (gcra)",
            "  mode: shadow",
            "  ban: after 3 refusals within 1m, for 10m, escalating x2, at most 1d, forgotten after 1d; status 403",
            "  on store failure: deny",
            "  routes: POST /login",
        ],
    );
    expect(
        "conns",
        &[
            "conns: at most 10 in flight per header:x-api-key",
            "  kind: in-flight (retry after 1s)",
            "  mode: enforce",
            "  on store failure: share",
        ],
    );
    expect(
        "monthly",
        &[
            "monthly: 10000/month per header:x-api-key",
            "  kind: calendar (windows of month in Europe/Berlin)",
        ],
    );
    expect(
        "tokens",
        &[
            "  cost: from header:x-estimate (default 1)",
            "  settled from header:x-usage (debt up to the burst)",
        ],
    );
    expect(
        "leased",
        &[
            "  leased (up to 50), spent within 1s",
            "  on store failure: fallback",
        ],
    );
    expect("smooth", &["  on limit: delay up to 1s (100 waiters)"]);
    expect(
        "per-key",
        &[
            "per-key: a quota per plan per header:x-api-key",
            "  plans: by header:x-api-key, 1 key (default free): free = 10/min, pro = 10/s; burst=50",
            "  on limit: reject",
            "  missing key: shared",
        ],
    );
    // The table's keys are secrets: only their number is printed.
    assert!(!stdout.contains("secret-key-1"), "{stdout}");
    assert!(
        stdout.ends_with(&format!("{}: 7 limits, valid\n", path.display())),
        "{stdout}"
    );
}

#[test]
fn a_route_that_can_never_match_is_refused_with_its_line_and_field_not_accepted() {
    let two = "[[limits]]\nname = \"a\"\nquota = \"1/s\"\n\n[[limits]]\nname = \"b\"\nquota = \"1/s\"\n\n";
    // (the third limit's routes, its line, field, part of the reason)
    let cases = [
        (
            "\"PSOT /a\"",
            12,
            "limits[2].routes[0]",
            "`PSOT` is not a method",
        ),
        (
            "\"/ok\",\n  \"post /b\"",
            13,
            "limits[2].routes[1]",
            "write `POST`",
        ),
        (
            "\"GET /users/:id\"",
            12,
            "limits[2].routes[0]",
            "axum 0.8 writes parameters in braces, `{id}`",
        ),
        ("\"/files/*rest\"", 12, "limits[2].routes[0]", "`{*rest}`"),
        ("\"/search?q=1\"", 12, "limits[2].routes[0]", "query"),
    ];
    for (routes, line, field, reason) in cases {
        let text = format!("{two}[[limits]]\nname = \"c\"\nquota = \"1/s\"\nroutes = [{routes}]\n");
        let err = error_of(&text, Format::Toml);
        let at = format!("{text}\n=> {err}");
        assert_eq!((err.field(), err.line()), (field, Some(line)), "{at}");
        assert!(err.reason().contains(reason), "{at}");
        let json = format!(
            "{{\"limits\": [{{\"name\": \"a\", \"quota\": \"1/s\"}},\n{{\"name\": \"b\", \"quota\": \"1/s\"}},\n{{\"name\": \"c\", \"quota\": \"1/s\",\n\"routes\": [{}]}}]}}",
            routes.replace('\n', "")
        );
        let err = error_of(&json, Format::Json);
        assert_eq!(err.field(), field, "{json}\n=> {err}");
        assert!(err.line().is_some(), "{json}\n=> {err}");
        assert!(err.reason().contains(reason), "{json}\n=> {err}");
    }
    // The check tool calls such a file invalid.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    std::fs::write(
        &path,
        "[[limits]]\nname = \"a\"\nquota = \"1/s\"\nroutes = [\"PSOT /a\"]\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-rules-under-test"))
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with(&format!(
            "{}:4: limits[0].routes[0]: `PSOT` is not a method",
            path.display()
        )),
        "{stderr}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_delay_limit_in_the_document_makes_requests_wait() {
    // One token every 100 ms; a request may wait up to 150 ms.
    let rules = from_text(
        "[[limits]]\nname = \"smooth\"\nkey = \"peer_ip\"\nquota = \"10/s; burst=1\"\n\
         on_limit = \"delay\"\nmax_wait = \"150ms\"\nmax_waiters = 5\n",
    );
    let app = router(&rules);
    let started = tokio::time::Instant::now();
    assert_eq!(
        send(&app, get_from("192.0.2.7")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "the burst passes at once"
    );
    // The store's clock stands still: the second waits one emission interval (100 ms,
    // within 150), the third would wait 200 ms: refused at once.
    assert_eq!(
        send(&app, get_from("192.0.2.7")).await.status(),
        StatusCode::OK
    );
    assert!(started.elapsed() >= Duration::from_millis(100));
    let at = tokio::time::Instant::now();
    let third = send(&app, get_from("192.0.2.7")).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(at.elapsed(), Duration::ZERO);
    assert!(
        rules
            .document()
            .to_string()
            .contains("delay up to 150ms (5 waiters)")
    );
}

#[tokio::test]
async fn a_reload_keeps_counting_the_requests_that_wait() {
    // The store's clock stands still: the second request of a key waits (on the real
    // timer) for a token 2 s away; one may wait at a time.
    let text = |other: &str| {
        format!(
            "[[limits]]\nname = \"slow\"\nkey = \"peer_ip\"\nquota = \"1/2s\"\n\
             on_limit = \"delay\"\nmax_wait = \"5s\"\nmax_waiters = 1\n\
             [[limits]]\nname = \"other\"\nquota = \"{other}\"\n"
        )
    };
    let rules = from_text(&text("100/s"));
    let app = router(&rules);
    assert_eq!(
        send(&app, get_from("192.0.2.8")).await.status(),
        StatusCode::OK
    );
    let waiting = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, get_from("192.0.2.8")).await.status() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the second request waits");
    // New rules: the waiting request still holds the only place.
    rules.reload(&text("200/s")).unwrap();
    let third = send(&app, get_from("192.0.2.9")).await;
    assert_eq!(
        third.status(),
        StatusCode::OK,
        "another client does not wait"
    );
    let fourth = send(&app, get_from("192.0.2.8")).await;
    assert_eq!(
        fourth.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the place is taken, across the reload"
    );
    // Both answered while the second request still waits (for 2 s): neither waited.
    assert!(!waiting.is_finished(), "the third and fourth waited");
    waiting.abort();
}

/// Limits of messages and bytes (issue 42): bound in the rules' layer, charged by the
/// pacers of its limiter with the file's settings, never by a request.
#[tokio::test]
async fn stream_limits_are_charged_by_pacers_not_by_requests() {
    use tollgate::pace::{Direction, OverLimit, Per};
    let text = r#"
        [[limits]]
        name = "requests"
        key = "peer_ip"
        quota = "2/min"

        [[limits]]
        name = "download"
        key = "peer_ip"
        quota = "1MiB/s; burst=256KiB"
        per = "byte"
        direction = "out"
        rate_after = "1MiB"
        over_limit = "end"

        [[limits]]
        name = "chat"
        quota = "10/s; burst=5"
        per = "message"
        direction = "both"
        max_wait = "2s"
        max_waiters = 50
    "#;
    let rules = from_text(text);
    let app = router(&rules);
    let r = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        sf_names(&header(r.headers(), "ratelimit-policy").unwrap()),
        ["requests"]
    );
    let limiter = rules.limiter();
    let download = limiter.pacer("download", "k").unwrap();
    assert_eq!(
        (download.per(), download.direction(), download.over()),
        (Per::Byte, Direction::Out, OverLimit::End)
    );
    assert_eq!(
        (download.rate_after(), download.piece()),
        (1 << 20, 256 << 10)
    );
    let chat = limiter.pacer("chat", "k").unwrap();
    assert_eq!(
        (chat.per(), chat.direction(), chat.over()),
        (
            Per::Message,
            Direction::Both,
            OverLimit::wait(Duration::from_secs(2)).max_waiters(50)
        )
    );
    assert_eq!(chat.piece(), 5);
    // At an upgrade: the key by the limit's own extractor (`peer_ip`), computed once.
    let (parts, _) = get_from("192.0.2.1").into_parts();
    let keyed = limiter.pacer_for("download", &parts).unwrap().unwrap();
    assert_eq!(keyed.key().to_string(), "@192.0.2.1");
    let global = limiter.pacer_for("chat", &parts).unwrap().unwrap();
    assert_eq!(global.key(), &tollgate::key::Key::global());
    let own = Limiter::builder(store())
        .limit(tollgate::LimitSpec::new(
            "x",
            tollgate::Quota::per_second(1),
        ))
        .build()
        .unwrap();
    assert!(matches!(
        own.pacer_for("x", &parts),
        Err(LimiterError::Unsupported {
            operation: "pacer_for",
            ..
        })
    ));
    // `tollgate-rules check` and the reload log say what each counts.
    let shown = Document::from_toml(text).unwrap().to_string();
    for line in [
        "download: 1MiB/s; burst=256KiB per peer_ip",
        "  counts: each byte sent, the first 1MiB of each body free",
        "  over limit: end the stream",
        "  counts: each message received or sent",
        "  over limit: wait up to 2s (50 waiters)",
        "  charged by the streams that name it (`Limiter::pacer`)",
    ] {
        assert!(shown.lines().any(|l| l == line), "no {line:?} in:\n{shown}");
    }
}
