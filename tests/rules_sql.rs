//! Rules from the `RateLimitRule` table (feature `rules-sql`): how rows map to limits
//! (every scope, plans, inactive rows, names, exact rates), bad rows refused whole, and
//! the poller over a real SQLite file and an axum router — changes picked up within a
//! poll, buckets kept, no reload without a change, failed queries counted and logged
//! once, violations written back with their rule id.
#![cfg(all(feature = "rules-sql", feature = "axum"))]

mod support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http::{Request, StatusCode};
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use support::{Lines, count, send, statuses, with_peer};
use tollgate::audit::AuditLog;
use tollgate::key::{KeyBuilder, KeyPart};
use tollgate::rules::{Document, Rules, Settings};
use tollgate::sql::{
    self, DEFAULT_PLAN, SqlPlanKeyRow, SqlPoller, SqlPool, SqlRuleRow, SqlRulesError,
    SqlSourceOptions, SqlViolationSink, UserKey, rules_document, rules_document_with_keys,
};
use tollgate::store::MemoryStore;

const POLL: Duration = Duration::from_millis(100);

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

/// How many of `n` requests made by `make` pass.
async fn passes(app: &Router, n: usize, make: impl Fn() -> Request<Body>) -> usize {
    count(&statuses(app, n, make).await, StatusCode::OK)
}

fn row(id: i64, pattern: &str, scope: &str, rate: f64, burst: i32) -> SqlRuleRow {
    SqlRuleRow::new(id, pattern, scope, rate, burst)
}

fn planned(id: i64, pattern: &str, rate: f64, burst: i32, plan: &str) -> SqlRuleRow {
    let mut r = row(id, pattern, "user", rate, burst);
    r.plan = Some(plan.into());
    r
}

fn map(rows: &[SqlRuleRow]) -> Document {
    rules_document(rows, &SqlSourceOptions::default()).unwrap()
}

fn rules_of(doc: Document) -> Rules<MemoryStore> {
    Rules::builder(MemoryStore::new())
        .document(doc)
        .build()
        .unwrap()
}

/// A SQLite file in `dir` with the tables, and `rows` (SQL `VALUES` tuples of
/// `rule_id, key_pattern, scope, rate_per_second, burst_capacity, plan`).
async fn database(dir: &tempfile::TempDir, rows: &str) -> sqlx::SqlitePool {
    database_at(&dir.path().join("tollgate.db"), rows).await
}

/// [`database`] at `path`.
async fn database_at(path: &std::path::Path, rows: &str) -> sqlx::SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    sql::migrate(&SqlPool::from(pool.clone())).await.unwrap();
    if !rows.is_empty() {
        exec(
            &pool,
            &format!(
                "INSERT INTO RateLimitRule (rule_id, key_pattern, scope, rate_per_second, \
                 burst_capacity, plan) VALUES {rows}"
            ),
        )
        .await;
    }
    pool
}

async fn exec(pool: &sqlx::SqlitePool, statement: &str) {
    sqlx::raw_sql(statement).execute(pool).await.unwrap();
}

/// Rules polled from `pool` every [`POLL`].
async fn polled(
    pool: &sqlx::SqlitePool,
    options: SqlSourceOptions,
) -> (Rules<MemoryStore>, SqlPoller) {
    Rules::builder(MemoryStore::new())
        .build_sql(pool.clone(), options.poll_every(POLL))
        .await
        .unwrap()
}

/// Waits up to 30 s for `done`; the time it took.
async fn eventually(what: &str, done: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

// ---------------------------------------------------------------------------------------
// The mapping.

#[test]
fn rows_map_to_limits_of_every_scope() {
    let doc = map(&[
        row(1, "global", "global", 50_000.0, 100_000),
        row(2, "ip:{ip}", "ip", 5.0, 10),
        row(3, "user:{user_id}", "user", 0.5, 3),
        row(4, "endpoint:/api/search", "endpoint", 1000.0, 2000),
        row(5, "endpoint:POST /login", "endpoint", 2.5, 5),
        row(6, "ip:{ip}:endpoint:POST /login", "ip", 0.1, 1),
    ]);
    let shown: Vec<_> = doc
        .limits
        .iter()
        .map(|l| {
            (
                l.name.as_str(),
                l.key.as_ref().map(|k| k.0.join("+")),
                l.quota.as_deref().unwrap(),
                l.routes.clone(),
                l.on_missing_key.as_deref(),
                l.rule_id,
            )
        })
        .collect();
    let routes = |r: &str| Some(vec![r.to_owned()]);
    assert_eq!(
        shown,
        [
            ("global", None, "50000/s; burst=100000", None, None, Some(1)),
            (
                "ip:{ip}",
                Some("peer_ip".into()),
                "5/s; burst=10",
                None,
                None,
                Some(2)
            ),
            (
                "user:{user_id}",
                Some("header:x-user-id".into()),
                "1/2s; burst=3",
                None,
                Some("skip"),
                Some(3)
            ),
            (
                "endpoint:/api/search",
                None,
                "1000/s; burst=2000",
                routes("/api/search"),
                None,
                Some(4)
            ),
            (
                "endpoint:POST /login",
                None,
                "5/2s; burst=5",
                routes("POST /login"),
                None,
                Some(5)
            ),
            (
                "ip:{ip}:endpoint:POST /login",
                Some("peer_ip".into()),
                "1/10s; burst=1",
                routes("POST /login"),
                None,
                Some(6)
            ),
        ]
    );
    // Behind trusted proxies, `ip` is the client's address; the user header is the
    // options'.
    let options = SqlSourceOptions::default()
        .user_key(UserKey::header("x-account"))
        .settings(Settings {
            hops: Some(1),
            ..Settings::default()
        });
    let doc = rules_document(
        &[row(2, "ip", "ip", 5.0, 10), row(3, "u", "user", 1.0, 1)],
        &options,
    )
    .unwrap();
    assert_eq!(doc.settings.hops, Some(1));
    assert_eq!(doc.limits[0].key.as_ref().unwrap().0, ["client_ip"]);
    assert_eq!(doc.limits[1].key.as_ref().unwrap().0, ["header:x-account"]);
}

#[test]
fn rows_of_one_pattern_with_plans_are_one_limit_and_inactive_rows_are_left_out() {
    let mut inactive = row(9, "ip", "ip", 1.0, 1);
    inactive.is_active = false;
    let mut inactive_plan = planned(8, "user:{user_id}", 1000.0, 1000, "enterprise");
    inactive_plan.is_active = false;
    let doc = map(&[
        planned(2, "user:{user_id}", 100.0, 500, "pro"),
        planned(1, "user:{user_id}", 10.0, 50, "free"),
        row(3, "user:{user_id}", "user", 1.0, 5),
        inactive,
        inactive_plan,
        row(4, "global", "global", 100.0, 100),
    ]);
    assert_eq!(doc.limits.len(), 2, "{doc}");
    let user = &doc.limits[0];
    assert_eq!(user.name, "user:{user_id}");
    assert_eq!(user.quota, None);
    assert_eq!(user.rule_id, Some(3), "the NULL plan's row");
    let plans = user.plans.as_ref().unwrap();
    assert_eq!(plans.from.as_deref(), Some("header:x-plan"));
    assert_eq!(plans.default.as_deref(), Some(DEFAULT_PLAN));
    let quotas: Vec<_> = plans
        .quotas
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        quotas,
        [
            ("*", "1/s; burst=5"),
            ("free", "10/s; burst=50"),
            ("pro", "100/s; burst=500")
        ]
    );
    let ids: Vec<_> = plans
        .rule_ids
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(ids, [("free", 1), ("pro", 2)]);
    assert!(
        doc.to_string().contains("pro = 100/s; burst=500 (rule 2)"),
        "{doc}"
    );

    // Without a NULL row (rows for some plans only): other plans are not limited.
    let doc = map(&[
        planned(1, "user:{user_id}", 10.0, 50, "free"),
        planned(2, "user:{user_id}", 100.0, 500, "pro"),
    ]);
    let user = &doc.limits[0];
    assert_eq!(user.plans.as_ref().unwrap().default, None);
    assert_eq!(user.rule_id, None);
    assert_eq!(user.on_missing_key.as_deref(), Some("skip"));
    // The same rows in any order, or with other descriptions, are the same document.
    let mut described = planned(2, "user:{user_id}", 100.0, 500, "pro");
    described.description = Some("pro users".into());
    assert_eq!(
        doc,
        map(&[described, planned(1, "user:{user_id}", 10.0, 50, "free")])
    );
}

#[test]
fn bad_rows_are_errors_naming_the_row_and_the_column() {
    let ok = row(1, "global", "global", 10.0, 10);
    let two_nulls = vec![ok.clone(), row(5, "global", "global", 1.0, 1)];
    let mut blank_plan = planned(5, "u", 1.0, 1, "pro");
    blank_plan.plan = Some(" pro".into());
    let cases: Vec<(Vec<SqlRuleRow>, &str, &str)> = vec![
        (
            vec![ok.clone(), row(5, "ip", "ip", 0.0, 10)],
            "RateLimitRule[rule_id=5].rate_per_second",
            "positive",
        ),
        (
            vec![ok.clone(), row(5, "ip", "ip", -2.0, 10)],
            "RateLimitRule[rule_id=5].rate_per_second",
            "`-2`",
        ),
        (
            vec![ok.clone(), row(5, "ip", "ip", f64::NAN, 10)],
            "RateLimitRule[rule_id=5].rate_per_second",
            "NaN",
        ),
        (
            vec![ok.clone(), row(5, "ip", "ip", 2_000_000.0, 10)],
            "RateLimitRule[rule_id=5].rate_per_second",
            "microsecond",
        ),
        (
            vec![ok.clone(), row(5, "ip", "ip", 0.123_456_789_012_3, 10)],
            "RateLimitRule[rule_id=5].rate_per_second",
            "100 years",
        ),
        (
            vec![ok.clone(), row(5, "ip", "ip", 1.0, 0)],
            "RateLimitRule[rule_id=5].burst_capacity",
            "at least 1",
        ),
        (
            vec![ok.clone(), row(5, "ip", "country", 1.0, 1)],
            "RateLimitRule[rule_id=5].scope",
            "global, ip, user, endpoint",
        ),
        (
            vec![ok.clone(), row(5, "/api/search", "endpoint", 1.0, 1)],
            "RateLimitRule[rule_id=5].key_pattern",
            "endpoint:POST /login",
        ),
        (
            vec![
                ok.clone(),
                row(5, "endpoint:api/search", "endpoint", 1.0, 1),
            ],
            "RateLimitRule[rule_id=5].key_pattern",
            "starting with `/`",
        ),
        (
            vec![ok.clone(), row(5, "endpoint:P@ST /x", "endpoint", 1.0, 1)],
            "RateLimitRule[rule_id=5].key_pattern",
            "not a method",
        ),
        // Found by the rules' own check, named by the row.
        (
            vec![
                ok.clone(),
                row(5, "endpoint:/users/{id", "endpoint", 1.0, 1),
            ],
            "RateLimitRule[rule_id=5].key_pattern",
            "limits[1].routes[0]",
        ),
        (two_nulls, "RateLimitRule[rule_id=5].plan", "NULL, as row 1"),
        (
            vec![ok.clone(), planned(5, "global", 1.0, 1, "pro")],
            "RateLimitRule[rule_id=5].scope",
            "row 1",
        ),
        (
            vec![ok.clone(), blank_plan],
            "RateLimitRule[rule_id=5].plan",
            "printable ASCII",
        ),
        (
            vec![ok.clone(), planned(5, "u", 1.0, 1, "*")],
            "RateLimitRule[rule_id=5].plan",
            "NULL",
        ),
        (
            vec![ok.clone(), row(-5, "ip", "ip", 1.0, 1)],
            "RateLimitRule[rule_id=-5].rule_id",
            "negative",
        ),
    ];
    for (rows, field, reason) in cases {
        let err = rules_document(&rows, &SqlSourceOptions::default()).unwrap_err();
        assert_eq!(err.field(), field, "{err}");
        assert!(err.reason().contains(reason), "{err}");
    }
    let bad_header = SqlSourceOptions::default().plan_header("x plan");
    let err = rules_document(&[ok], &bad_header).unwrap_err();
    assert_eq!(err.field(), "plan_header");
}

#[tokio::test]
async fn every_scope_limits_what_it_says() {
    let rules = rules_of(map(&[
        row(1, "global", "global", 0.01, 8),
        row(2, "ip", "ip", 0.01, 4),
        row(3, "user", "user", 0.01, 2),
        row(4, "endpoint:POST /login", "endpoint", 0.01, 1),
        row(5, "ip:{ip}:endpoint:GET /api/search", "ip", 0.01, 1),
    ]));
    let app = router(&rules);
    // user: per user; requests without a user are not limited by it.
    let as_user = |user: &'static str| move || req("GET", "/", "192.0.2.1", &[("x-user-id", user)]);
    assert_eq!(passes(&app, 3, as_user("alice")).await, 2);
    assert_eq!(passes(&app, 1, as_user("bob")).await, 1);
    // ip: per address (192.0.2.1 has spent 3 of its 4).
    assert_eq!(
        passes(&app, 2, || req("GET", "/", "192.0.2.1", &[])).await,
        1
    );
    // endpoint: one bucket for the route, whoever calls it.
    assert_eq!(
        passes(&app, 1, || req("POST", "/login", "192.0.2.2", &[])).await,
        1
    );
    assert_eq!(
        passes(&app, 1, || req("POST", "/login", "192.0.2.3", &[])).await,
        0
    );
    // ip on an endpoint: one bucket per client on that route.
    assert_eq!(
        passes(&app, 2, || req("GET", "/api/search", "192.0.2.5", &[])).await,
        1
    );
    assert_eq!(
        passes(&app, 1, || req("GET", "/api/search", "192.0.2.6", &[])).await,
        1
    );
    // global: 8 in all, 7 spent (refused requests spend nothing).
    assert_eq!(
        passes(&app, 4, || req("GET", "/", "192.0.2.4", &[])).await,
        1
    );
    assert_eq!(
        send(&app, req("GET", "/health", "192.0.2.4", &[]))
            .await
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn plans_choose_the_quota_and_requests_of_other_plans_get_the_null_row() {
    let app_of = |rows: &[SqlRuleRow]| router(&rules_of(map(rows)));
    let call = |user: &'static str, plan: Option<&'static str>| {
        move || {
            let mut h = vec![("x-user-id", user)];
            h.extend(plan.map(|p| ("x-plan", p)));
            req("GET", "/", "192.0.2.1", &h)
        }
    };
    let app = app_of(&[
        planned(1, "u", 0.01, 2, "free"),
        planned(2, "u", 0.01, 5, "pro"),
        row(3, "u", "user", 0.01, 1),
    ]);
    assert_eq!(passes(&app, 6, call("a", Some("pro"))).await, 5);
    assert_eq!(passes(&app, 3, call("b", Some("free"))).await, 2);
    assert_eq!(passes(&app, 2, call("c", None)).await, 1);
    assert_eq!(passes(&app, 2, call("d", Some("gold"))).await, 1);
    // Rows for some plans only, without a NULL row: other plans are not limited.
    let app = app_of(&[planned(1, "u", 0.01, 2, "free")]);
    assert_eq!(passes(&app, 3, call("a", Some("free"))).await, 2);
    assert_eq!(passes(&app, 4, call("a", Some("gold"))).await, 4);
    assert_eq!(passes(&app, 4, call("a", None)).await, 4);
}

#[derive(Clone)]
struct UserId(u64);

impl KeyPart for UserId {
    fn write_key(&self, key: &mut KeyBuilder) {
        key.push_display(self.0);
    }
}

#[tokio::test]
async fn the_user_key_can_be_a_request_extension() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "(1, 'user', 'user', 0.01, 2, NULL)").await;
    let (rules, _poller) = polled(
        &pool,
        SqlSourceOptions::default().user_key(UserKey::extension::<UserId>()),
    )
    .await;
    assert_eq!(
        rules.document().limits[0].key.as_ref().unwrap().0,
        ["custom:user"]
    );
    let app = router(&rules);
    let as_user = |id: u64| {
        move || {
            let mut r = req("GET", "/", "192.0.2.1", &[("x-user-id", "ignored")]);
            r.extensions_mut().insert(UserId(id));
            r
        }
    };
    assert_eq!(passes(&app, 3, as_user(1)).await, 2);
    assert_eq!(passes(&app, 1, as_user(2)).await, 1);
    assert_eq!(
        passes(&app, 3, || req("GET", "/", "192.0.2.1", &[])).await,
        3
    );
}

#[test]
fn plans_by_key_give_each_limit_the_keys_of_its_plans_and_bad_key_tables_are_refused() {
    let options = SqlSourceOptions::default()
        .user_key(UserKey::header("x-api-key"))
        .plan_by_key("x-api-key");
    let rows = [
        planned(1, "user", 0.01, 2, "free"),
        planned(2, "user", 0.01, 5, "pro"),
        row(3, "user", "user", 0.01, 1),
        planned(4, "search", 0.01, 9, "pro"),
    ];
    let keys = [
        SqlPlanKeyRow::new("k-free", "free"),
        SqlPlanKeyRow::new("k-pro", "pro"),
        SqlPlanKeyRow::new("k-gold", "gold"),
    ];
    let doc = rules_document_with_keys(&rows, &keys, &options).unwrap();
    let keys_of = |i: usize| {
        let plans = doc.limits[i].plans.as_ref().unwrap();
        assert_eq!(plans.by.as_deref(), Some("header:x-api-key"));
        assert_eq!(plans.from, None);
        plans
            .keys
            .iter()
            .map(|(k, p)| (k.as_str(), p.as_str()))
            .collect::<Vec<_>>()
    };
    // A key of a plan the limit has no row for has its default plan: not in its table.
    assert_eq!(keys_of(0), [("k-free", "free"), ("k-pro", "pro")]);
    assert_eq!(keys_of(1), [("k-pro", "pro")]);
    // Without keys: every key has the default plan.
    let doc = rules_document(&rows, &options).unwrap();
    assert!(doc.limits[0].plans.as_ref().unwrap().keys.is_empty());
    // Other options leave the keys out.
    let doc = rules_document_with_keys(&rows, &keys, &SqlSourceOptions::default()).unwrap();
    assert!(doc.limits[0].plans.as_ref().unwrap().keys.is_empty());

    let err = rules_document_with_keys(&rows, &[SqlPlanKeyRow::new("secret ", "pro")], &options)
        .unwrap_err();
    assert_eq!(err.field(), "RateLimitPlanKey.api_key");
    assert!(
        !err.to_string().contains("secret"),
        "the key is not shown: {err}"
    );
    let many: Vec<_> = (0..=tollgate::rules::MAX_PLAN_KEYS)
        .map(|i| SqlPlanKeyRow::new(format!("k{i}"), "pro"))
        .collect();
    let err = rules_document_with_keys(&rows, &many, &options).unwrap_err();
    assert_eq!(err.field(), "RateLimitPlanKey");
    assert!(err.reason().contains("at most 100000"), "{err}");
    let err = rules_document(&rows, &SqlSourceOptions::default().plan_by_key("x key")).unwrap_err();
    assert_eq!(err.field(), "plan_key_header");
}

#[tokio::test]
async fn plans_by_key_come_from_the_key_table_and_follow_its_changes() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(
        &dir,
        "(1, 'user', 'user', 0.01, 2, NULL), (2, 'user', 'user', 0.01, 5, 'pro')",
    )
    .await;
    exec(
        &pool,
        "INSERT INTO RateLimitPlanKey (api_key, plan) VALUES ('k-pro', 'pro'); \
         INSERT INTO RateLimitPlanKey (api_key, plan, is_active) VALUES ('k-off', 'pro', FALSE)",
    )
    .await;
    let (rules, poller) = polled(
        &pool,
        SqlSourceOptions::default()
            .user_key(UserKey::header("x-api-key"))
            .plan_by_key("x-api-key"),
    )
    .await;
    let app = router(&rules);
    // The client's `x-plan` is not read.
    let call = |key: &'static str| {
        move || {
            req(
                "GET",
                "/",
                "192.0.2.1",
                &[("x-api-key", key), ("x-plan", "pro")],
            )
        }
    };
    assert_eq!(passes(&app, 6, call("k-pro")).await, 5);
    assert_eq!(
        passes(&app, 3, call("k-off")).await,
        2,
        "inactive: the default plan"
    );
    assert_eq!(
        passes(&app, 3, call("k-new")).await,
        2,
        "not listed: the default plan"
    );
    // A key added to the table is picked up at the next poll.
    exec(
        &pool,
        "INSERT INTO RateLimitPlanKey (api_key, plan) VALUES ('k-new2', 'pro')",
    )
    .await;
    poller.poll_now();
    eventually("the new key", || rules.status().reloads == 1).await;
    assert_eq!(passes(&app, 6, call("k-new2")).await, 5);
    assert!(
        rules
            .document()
            .to_string()
            .contains("by header:x-api-key, 2 keys (default *)"),
        "{}",
        rules.document()
    );
}

#[tokio::test]
async fn plans_from_the_extension_of_the_applications_authentication() {
    let options = SqlSourceOptions::default()
        .user_key(UserKey::header("x-api-key"))
        .plan_from_extension();
    let doc = rules_document(
        &[
            row(1, "user", "user", 0.01, 2),
            planned(2, "user", 0.01, 5, "pro"),
        ],
        &options,
    )
    .unwrap();
    assert_eq!(
        doc.limits[0].plans.as_ref().unwrap().from.as_deref(),
        Some("extension")
    );
    let app = router(&rules_of(doc));
    let call = |key: &'static str, plan: Option<&'static str>| {
        move || {
            let mut r = req(
                "GET",
                "/",
                "192.0.2.1",
                &[("x-api-key", key), ("x-plan", "pro")],
            );
            if let Some(plan) = plan {
                r.extensions_mut().insert(tollgate::Plan::from_static(plan));
            }
            r
        }
    };
    assert_eq!(passes(&app, 6, call("a", Some("pro"))).await, 5);
    assert_eq!(
        passes(&app, 3, call("b", None)).await,
        2,
        "no extension: the NULL row"
    );
}

// ---------------------------------------------------------------------------------------
// The poller.

#[tokio::test]
async fn errors_at_start_are_returned() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "").await;
    let start =
        || Rules::builder(MemoryStore::new()).build_sql(pool.clone(), SqlSourceOptions::default());
    exec(&pool, "INSERT INTO RateLimitRule (rule_id, key_pattern, scope, rate_per_second, burst_capacity) VALUES (4, 'ip', 'ip', 0, 1)").await;
    match start().await.unwrap_err() {
        SqlRulesError::Rules(e) => {
            assert_eq!(e.field(), "RateLimitRule[rule_id=4].rate_per_second", "{e}")
        }
        e => panic!("{e}"),
    }
    exec(&pool, "DROP TABLE RateLimitRule").await;
    let err = start().await.unwrap_err();
    assert!(matches!(err, SqlRulesError::Query(_)), "{err}");
    assert!(err.to_string().contains("no such table"), "{err}");
    let zero = Rules::builder(MemoryStore::new())
        .build_sql(
            pool.clone(),
            SqlSourceOptions::default().poll_every(Duration::ZERO),
        )
        .await;
    assert!(matches!(zero, Err(SqlRulesError::Rules(e)) if e.field() == "poll"));
}

/// A `RateLimitRule` table as an application may have made it: the columns, without
/// `NOT NULL` (so `NULL`s, and NaNs, which SQLite stores as `NULL`, can be written).
async fn loose_table(dir: &tempfile::TempDir) -> sqlx::SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("loose.db"))
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new()
        .connect_with(options)
        .await
        .unwrap();
    exec(
        &pool,
        "CREATE TABLE RateLimitRule (rule_id INTEGER PRIMARY KEY, key_pattern VARCHAR(128), \
         scope VARCHAR(32), rate_per_second REAL, burst_capacity INTEGER, plan VARCHAR(32), \
         is_active BOOLEAN DEFAULT TRUE, description TEXT)",
    )
    .await;
    pool
}

#[tokio::test]
async fn a_bad_value_in_any_column_is_named_after_that_column_not_another() {
    let dir = tempfile::tempdir().unwrap();
    let pool = loose_table(&dir).await;
    // (the change to row 1, the column it must name, words of the reason)
    let cases: &[(&str, &str, &str)] = &[
        ("rule_id = -5", "rule_id", "negative"),
        ("key_pattern = ''", "key_pattern", "empty"),
        ("key_pattern = NULL", "key_pattern", "NULL"),
        ("key_pattern = x'00ff'", "key_pattern", "BLOB"),
        ("scope = 'country'", "scope", "global, ip, user, endpoint"),
        ("scope = NULL", "scope", "NULL"),
        ("rate_per_second = 0", "rate_per_second", "positive"),
        ("rate_per_second = -1", "rate_per_second", "`-1`"),
        ("rate_per_second = 1e400", "rate_per_second", "`inf`"),
        ("rate_per_second = NULL", "rate_per_second", "NULL"),
        ("rate_per_second = 'fast'", "rate_per_second", "TEXT"),
        ("rate_per_second = 1e7", "rate_per_second", "microsecond"),
        ("burst_capacity = 0", "burst_capacity", "at least 1"),
        ("burst_capacity = -5", "burst_capacity", "`-5`"),
        (
            "burst_capacity = 3000000000",
            "burst_capacity",
            "out of range",
        ),
        (
            "burst_capacity = -3000000000",
            "burst_capacity",
            "out of range",
        ),
        ("burst_capacity = 1.5", "burst_capacity", "REAL"),
        ("burst_capacity = NULL", "burst_capacity", "NULL"),
        (
            "rate_per_second = 0.3, burst_capacity = 2000000000",
            "burst_capacity",
            "100 years",
        ),
        ("plan = ' pro'", "plan", "printable ASCII"),
        ("plan = '*'", "plan", "NULL"),
        ("plan = x'00'", "plan", "BLOB"),
        ("is_active = 'maybe'", "is_active", "TEXT"),
        ("is_active = NULL", "is_active", "NULL"),
        ("description = x'ff'", "description", "BLOB"),
    ];
    let start =
        || Rules::builder(MemoryStore::new()).build_sql(pool.clone(), SqlSourceOptions::default());
    let reset = "DELETE FROM RateLimitRule; INSERT INTO RateLimitRule (rule_id, key_pattern, \
                 scope, rate_per_second, burst_capacity, plan, is_active, description) VALUES \
                 (1, 'ip', 'ip', 1, 1, NULL, TRUE, 'ok'), (2, 'global', 'global', 10, 10, NULL, TRUE, NULL)";
    let expect = |err: SqlRulesError, column: &str, reason: &str, case: &str| match err {
        SqlRulesError::Rules(e) => {
            let id = if column == "rule_id" { "-5" } else { "1" };
            assert_eq!(
                e.field(),
                format!("RateLimitRule[rule_id={id}].{column}"),
                "{case}: {e}"
            );
            assert!(e.reason().contains(reason), "{case}: {e}");
        }
        e => panic!("{case}: not an error of the row: {e}"),
    };
    for (change, column, reason) in cases {
        exec(&pool, reset).await;
        exec(
            &pool,
            &format!("UPDATE RateLimitRule SET {change} WHERE rule_id = 1"),
        )
        .await;
        expect(start().await.unwrap_err(), column, reason, change);
    }
    // A NaN: stored as NULL by SQLite, and said so.
    exec(&pool, reset).await;
    sqlx::query("UPDATE RateLimitRule SET rate_per_second = ? WHERE rule_id = 1")
        .bind(f64::NAN)
        .execute(&pool)
        .await
        .unwrap();
    expect(start().await.unwrap_err(), "rate_per_second", "NaN", "NaN");

    // While polling: a bad row refused as such (once), not a failed query.
    exec(&pool, reset).await;
    let (rules, _poller) = polled(&pool, SqlSourceOptions::default()).await;
    exec(
        &pool,
        "UPDATE RateLimitRule SET burst_capacity = 3000000000 WHERE rule_id = 2",
    )
    .await;
    eventually("the bad row refused", || rules.status().failures == 1).await;
    tokio::time::sleep(POLL * 3).await;
    let status = rules.status();
    assert_eq!(status.failures, 1, "refused once: {status:?}");
    assert_eq!(
        status.last_error.unwrap().field(),
        "RateLimitRule[rule_id=2].burst_capacity"
    );
}

#[tokio::test]
async fn changes_apply_within_a_poll_and_unchanged_buckets_keep_their_state() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(
        &dir,
        "(1, 'ip', 'ip', 0.01, 3, NULL), (2, 'global', 'global', 0.01, 100, NULL), \
         (3, 'user', 'user', 0.01, 2, 'pro'), (4, 'user', 'user', 0.01, 1, NULL)",
    )
    .await;
    let (rules, _poller) = polled(&pool, SqlSourceOptions::default()).await;
    let app = router(&rules);
    let from_a = || req("GET", "/", "192.0.2.1", &[]);
    assert_eq!(passes(&app, 2, from_a).await, 2, "ip: 1 of 3 left");

    // Rows that map to the same rules (a description, an inactive row) reload nothing.
    exec(
        &pool,
        "UPDATE RateLimitRule SET description = 'edited' WHERE rule_id = 1",
    )
    .await;
    exec(&pool, "INSERT INTO RateLimitRule (key_pattern, scope, rate_per_second, burst_capacity, is_active) VALUES ('x', 'ip', 1, 1, FALSE)").await;
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(rules.status().reloads, 0);

    // A plan's quota changes: picked up at the next poll; the unchanged `ip` limit keeps
    // its bucket (1 left), the changed plan's bucket keeps its state under the new quota.
    // (From two addresses: each `ip` bucket has 3.)
    let alice_pro = |peer: &'static str| {
        move || {
            req(
                "GET",
                "/",
                peer,
                &[("x-user-id", "alice"), ("x-plan", "pro")],
            )
        }
    };
    assert_eq!(passes(&app, 3, alice_pro("192.0.2.9")).await, 2);
    let changed = Instant::now();
    exec(
        &pool,
        "UPDATE RateLimitRule SET burst_capacity = 4 WHERE rule_id = 3",
    )
    .await;
    let latency = eventually("the new plan quota", || rules.status().reloads == 1).await;
    eprintln!("poll-to-effect latency (poll {POLL:?}): {latency:?}");
    assert!(
        changed.elapsed() < POLL * 2 + Duration::from_secs(3),
        "{:?}",
        changed.elapsed()
    );
    assert_eq!(
        passes(&app, 3, alice_pro("192.0.2.10")).await,
        2,
        "2 more under burst 4"
    );
    assert_eq!(passes(&app, 2, from_a).await, 1, "ip kept its bucket");

    // A rule flipped to inactive is no longer enforced.
    exec(
        &pool,
        "UPDATE RateLimitRule SET is_active = FALSE WHERE rule_id = 1",
    )
    .await;
    eventually("the ip rule gone", || rules.status().reloads == 2).await;
    assert_eq!(passes(&app, 5, from_a).await, 5);
    assert!(rules.status().healthy);
    assert_eq!(rules.status().failures, 0);
}

#[tokio::test]
async fn bad_rows_are_refused_whole_and_the_running_rules_stay() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let dir = tempfile::tempdir().unwrap();
    let pool = database(
        &dir,
        "(1, 'ip', 'ip', 0.01, 2, NULL), (2, 'global', 'global', 0.01, 100, NULL)",
    )
    .await;
    let (rules, _poller) = polled(&pool, SqlSourceOptions::default()).await;
    let app = router(&rules);
    let before = rules.document();
    let bad = [
        (
            "UPDATE RateLimitRule SET rate_per_second = 0 WHERE rule_id = 2",
            "RateLimitRule[rule_id=2].rate_per_second",
        ),
        (
            "UPDATE RateLimitRule SET rate_per_second = -1 WHERE rule_id = 2",
            "RateLimitRule[rule_id=2].rate_per_second",
        ),
        (
            "UPDATE RateLimitRule SET burst_capacity = 0 WHERE rule_id = 2",
            "RateLimitRule[rule_id=2].burst_capacity",
        ),
        (
            "UPDATE RateLimitRule SET scope = 'tenant' WHERE rule_id = 2",
            "RateLimitRule[rule_id=2].scope",
        ),
        (
            "UPDATE RateLimitRule SET key_pattern = 'endpoint:login', scope = 'endpoint' WHERE rule_id = 2",
            "RateLimitRule[rule_id=2].key_pattern",
        ),
    ];
    for (i, (statement, field)) in bad.iter().enumerate() {
        // A good change in the same set is refused with it.
        exec(
            &pool,
            &format!("BEGIN; UPDATE RateLimitRule SET burst_capacity = 50 WHERE rule_id = 1; {statement}; COMMIT;"),
        )
        .await;
        eventually(field, || rules.status().failures == i as u64 + 1).await;
        let status = rules.status();
        assert_eq!(status.last_error.as_ref().unwrap().field(), *field);
        assert!(!status.healthy);
        assert_eq!(rules.document(), before, "the running rules stay");
        // Put row 2 back and the ip quota as it was.
        exec(
            &pool,
            "BEGIN; UPDATE RateLimitRule SET key_pattern = 'global', scope = 'global', \
             rate_per_second = 0.01, burst_capacity = 100 WHERE rule_id = 2; \
             UPDATE RateLimitRule SET burst_capacity = 2 WHERE rule_id = 1; COMMIT;",
        )
        .await;
        eventually("healthy again", || rules.status().healthy).await;
    }
    // Still the first rules: the ip limit allows 2; every bad set was logged once.
    assert_eq!(
        passes(&app, 3, || req("GET", "/", "192.0.2.1", &[])).await,
        2
    );
    assert_eq!(rules.status().failures, bad.len() as u64);
    assert_eq!(lines.matching("rules not reloaded").len(), bad.len());
}

#[tokio::test]
async fn deactivating_the_last_active_rule_lifts_the_limit_instead_of_keeping_it() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "(1, 'ip', 'ip', 0.01, 1, NULL)").await;
    let (rules, _poller) = polled(&pool, SqlSourceOptions::default()).await;
    let app = router(&rules);
    let from_a = || req("GET", "/", "192.0.2.1", &[]);
    assert_eq!(passes(&app, 3, from_a).await, 1);

    // Every rule switched off: no limits, a valid state, announced once.
    exec(&pool, "UPDATE RateLimitRule SET is_active = 0").await;
    eventually("the rules without limits", || rules.status().reloads == 1).await;
    assert!(rules.document().limits.is_empty());
    assert_eq!(passes(&app, 5, from_a).await, 5, "requests pass");
    let status = rules.status();
    assert!(status.healthy, "{status:?}");
    assert_eq!(status.failures, 0);
    tokio::time::sleep(POLL * 3).await;
    let warned = lines.matching("no active row");
    assert_eq!(warned.len(), 1, "one WARN per transition: {warned:?}");
    assert!(warned[0].contains("WARN"), "{warned:?}");
    assert_eq!(
        rules.status().reloads,
        1,
        "nothing to reload while it stays so"
    );

    // Switched on again: enforced again, and a new WARN next time. While no rules used
    // the limit its table went, buckets and all: the client starts from a full bucket.
    exec(&pool, "UPDATE RateLimitRule SET is_active = 1").await;
    eventually("the rule back", || rules.status().reloads == 2).await;
    assert_eq!(passes(&app, 3, from_a).await, 1);
    assert_eq!(
        passes(&app, 3, || req("GET", "/", "192.0.2.2", &[])).await,
        1
    );
    exec(&pool, "DELETE FROM RateLimitRule").await;
    eventually("no rule again", || rules.status().reloads == 3).await;
    assert_eq!(passes(&app, 3, from_a).await, 3);
    assert_eq!(lines.matching("no active row").len(), 2);
}

#[tokio::test]
async fn a_table_without_an_active_row_at_start_limits_nothing_instead_of_failing() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "").await;
    exec(&pool, "INSERT INTO RateLimitRule (rule_id, key_pattern, scope, rate_per_second, burst_capacity, is_active) VALUES (1, 'ip', 'ip', 0.01, 1, FALSE)").await;
    let (rules, _poller) = polled(&pool, SqlSourceOptions::default()).await;
    assert!(rules.document().limits.is_empty());
    assert!(rules.status().healthy);
    let app = router(&rules);
    assert_eq!(
        passes(&app, 3, || req("GET", "/", "192.0.2.1", &[])).await,
        3
    );
    assert_eq!(lines.matching("no active row").len(), 1);
    // The first active row is picked up at the next poll.
    exec(&pool, "UPDATE RateLimitRule SET is_active = 1").await;
    eventually("the rule", || rules.status().reloads == 1).await;
    assert_eq!(
        passes(&app, 3, || req("GET", "/", "192.0.2.1", &[])).await,
        1
    );
}

#[test]
fn only_rules_built_by_code_may_have_no_limits_an_empty_file_is_still_refused() {
    let err = Rules::builder(MemoryStore::new())
        .text("")
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "limits", "{err}");
    assert!(Document::default().check().is_err());
    let rules = rules_of(Document::default());
    assert!(rules.document().limits.is_empty());
    assert_eq!(
        rules.reload("").unwrap_err().field(),
        "limits",
        "rules text stays refused"
    );
    rules
        .reload_document(map(&[row(1, "ip", "ip", 1.0, 1)]))
        .unwrap();
    rules.reload_document(Document::default()).unwrap();
    assert_eq!(rules.status().reloads, 2);
}

#[tokio::test]
async fn a_failing_query_is_counted_each_poll_logged_once_and_recovered_from() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "(1, 'ip', 'ip', 0.01, 2, NULL)").await;
    let (rules, _poller) = polled(&pool, SqlSourceOptions::default()).await;
    exec(&pool, "ALTER TABLE RateLimitRule RENAME TO Away").await;
    eventually("three failed polls", || rules.status().failures >= 3).await;
    let errors = lines.matching("rules not reloaded");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("ERROR") && errors[0].contains("no such table"),
        "{errors:?}"
    );
    assert_eq!(
        rules.document().limits[0].name,
        "ip",
        "the running rules stay"
    );
    // Readable again, with the same rows: healthy, and no reload.
    exec(&pool, "ALTER TABLE Away RENAME TO RateLimitRule").await;
    eventually("healthy", || rules.status().healthy).await;
    assert_eq!(rules.status().reloads, 0);
    assert_eq!(lines.matching("rules readable again").len(), 1);
}

/// The rules' file in `dir` (see [`database`]).
fn db_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("tollgate.db")
}

/// Waits for a refused poll whose error contains `text`; the error.
async fn refused_with(rules: &Rules<MemoryStore>, text: &str) -> tollgate::ConfigError {
    eventually(text, || {
        let status = rules.status();
        !status.healthy && status.last_error.is_some_and(|e| e.reason().contains(text))
    })
    .await;
    rules.status().last_error.unwrap()
}

#[tokio::test]
async fn a_deleted_database_file_is_reported_not_read_silently_and_a_new_one_is_picked_up() {
    let lines = Lines::default();
    let _guard = lines.capture();
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "(1, 'ip', 'ip', 0.01, 1, NULL)").await;
    let (rules, _poller) = polled(&pool, SqlSourceOptions::default()).await;
    let app = router(&rules);
    let before = rules.document();

    std::fs::remove_file(db_file(&dir)).unwrap();
    let path = db_file(&dir).display().to_string();
    let err = refused_with(&rules, "is gone").await;
    assert_eq!(err.field(), "RateLimitRule", "{err}");
    assert!(err.reason().contains(&path), "names the file: {err}");
    eventually("more refused polls", || rules.status().failures >= 3).await;
    assert_eq!(lines.matching("is gone").len(), 1, "logged once");
    assert_eq!(rules.document(), before, "the running rules stay");
    assert_eq!(
        passes(&app, 3, || req("GET", "/", "192.0.2.1", &[])).await,
        1
    );

    // A new database at the same path (made aside, then moved there whole): read within
    // a poll.
    let aside = dir.path().join("new.db");
    database_at(&aside, "(1, 'ip', 'ip', 0.01, 3, NULL)")
        .await
        .close()
        .await;
    std::fs::rename(&aside, db_file(&dir)).unwrap();
    eventually("the new database's rules", || rules.status().reloads == 1).await;
    assert_eq!(
        rules.document().limits[0].quota.as_deref(),
        Some("1/100s; burst=3")
    );
    assert!(rules.status().healthy);
    // And its later edits.
    let fresh = database_at(&db_file(&dir), "").await;
    exec(&fresh, "UPDATE RateLimitRule SET burst_capacity = 4").await;
    eventually("an edit of the new database", || {
        rules.status().reloads == 2
    })
    .await;
}

#[tokio::test]
async fn a_database_file_replaced_by_a_non_database_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "(1, 'ip', 'ip', 0.01, 1, NULL)").await;
    let (rules, _poller) = polled(&pool, SqlSourceOptions::default()).await;
    let before = rules.document();
    let other = dir.path().join("other");
    std::fs::write(
        &other,
        "rules? no: a text file of ~100 bytes, not a SQLite database.\n".repeat(20),
    )
    .unwrap();
    std::fs::rename(&other, db_file(&dir)).unwrap();
    let err = refused_with(&rules, "not a database").await;
    assert!(
        err.reason().contains(&db_file(&dir).display().to_string()),
        "{err}"
    );
    assert_eq!(rules.document(), before, "the running rules stay");
}

#[tokio::test]
async fn a_database_file_of_mode_000_is_reported_even_to_root() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "(1, 'ip', 'ip', 0.01, 1, NULL)").await;
    let (rules, _poller) = polled(&pool, SqlSourceOptions::default()).await;
    let file = db_file(&dir);
    // Root may read a file of mode 000 anyway; the source refuses it all the same (its
    // owner has taken it away), so this holds for every user.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).unwrap();
    let err = refused_with(&rules, "lets no one read it").await;
    assert!(err.reason().contains(&file.display().to_string()), "{err}");
    assert_eq!(
        rules.document().limits[0].name,
        "ip",
        "the running rules stay"
    );
    // Readable again, the same rows: healthy without a reload.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    eventually("healthy again", || rules.status().healthy).await;
    assert_eq!(rules.status().reloads, 0);
}

#[tokio::test]
async fn the_poller_stops_with_the_rules_or_its_handle_and_polls_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "(1, 'ip', 'ip', 1, 2, NULL)").await;
    let (rules, poller) = Rules::builder(MemoryStore::new())
        .build_sql(
            pool.clone(),
            SqlSourceOptions::default().poll_every(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    exec(
        &pool,
        "UPDATE RateLimitRule SET burst_capacity = 3 WHERE rule_id = 1",
    )
    .await;
    poller.poll_now();
    let latency = eventually("a reload on demand", || rules.status().reloads == 1).await;
    eprintln!("poll_now to reloaded rules (query, mapping, check, compile): {latency:?}");
    assert_eq!(
        rules.document().limits[0].quota.as_deref(),
        Some("1/s; burst=3")
    );
    drop(rules);
    eventually("the poller ended with the rules", || !poller.is_running()).await;

    let (rules, poller) = polled(&pool, SqlSourceOptions::default()).await;
    poller.stop();
    eventually("the poller stopped", || !poller.is_running()).await;
    exec(
        &pool,
        "UPDATE RateLimitRule SET burst_capacity = 4 WHERE rule_id = 1",
    )
    .await;
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(
        rules.document().limits[0].quota.as_deref(),
        Some("1/s; burst=3")
    );
}

#[tokio::test]
async fn violations_are_written_back_with_the_rule_id_of_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(
        &dir,
        "(10, 'user', 'user', 0.01, 1, NULL), (11, 'user', 'user', 0.01, 2, 'pro'), \
         (12, 'endpoint:POST /login', 'endpoint', 0.01, 1, NULL)",
    )
    .await;
    let audit = AuditLog::builder(SqlViolationSink::new(pool.clone()))
        .flush_interval(Duration::from_millis(5))
        .build()
        .unwrap();
    let log = audit.clone();
    let (rules, _poller) = Rules::builder(MemoryStore::new())
        .configure(move |b| b.audit(log.clone()))
        .build_sql(pool.clone(), SqlSourceOptions::default().poll_every(POLL))
        .await
        .unwrap();
    let app = router(&rules);
    let call = |plan: &'static str| {
        move || {
            req(
                "GET",
                "/",
                "192.0.2.1",
                &[("x-user-id", "alice"), ("x-plan", plan)],
            )
        }
    };
    assert_eq!(passes(&app, 3, call("pro")).await, 2);
    // Bob's plan has no row: the NULL row's quota, and its rule id.
    let bob = || {
        req(
            "GET",
            "/",
            "192.0.2.1",
            &[("x-user-id", "bob"), ("x-plan", "basic")],
        )
    };
    assert_eq!(passes(&app, 2, bob).await, 1);
    assert_eq!(
        passes(&app, 2, || req("POST", "/login", "192.0.2.2", &[])).await,
        1
    );
    let rows = || async {
        sqlx::query("SELECT rule_id, limit_name FROM RateLimitViolation ORDER BY violation_id")
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get::<i64, _>(0), r.get::<String, _>(1)))
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = rows().await;
    while got.len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        got = rows().await;
    }
    assert_eq!(
        got,
        [
            (11, "user".to_owned()),
            (10, "user".to_owned()),
            (12, "endpoint:POST /login".to_owned())
        ]
    );
}
