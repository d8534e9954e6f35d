//! The Redis store under the least ACL user the guide documents (`guide/managed_redis.md`,
//! read from the page itself), and on a server that refuses the admin commands managed
//! services rename or forbid. Real `redis-server` processes; `ACL LOG` says what Redis
//! denied.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use support::Lines;
use support::redis::RedisServer;
use tollgate::store::RedisStore;
use tollgate::{
    Algorithm, Ban, FailurePolicy, Lease, LimitDecision, LimitSpec, Limiter, LimiterError, Quota,
    Status,
};

const PASSWORD: &str = "acl-test-password";

/// The guide's `ACL SETUSER` line, as a user pastes it.
fn documented_rule() -> Vec<String> {
    let page = include_str!("../guide/managed_redis.md");
    let line = page
        .lines()
        .find(|l| l.starts_with("ACL SETUSER tollgate "))
        .expect("the guide documents an ACL SETUSER line");
    line.split_whitespace()
        .map(|w| match w {
            ">CHANGE-ME" => format!(">{PASSWORD}"),
            w => w.to_owned(),
        })
        .collect()
}

async fn admin(server: &RedisServer, args: &[String]) -> redis::Value {
    let mut conn = server.connection().await;
    let mut cmd = redis::cmd(&args[0]);
    for a in &args[1..] {
        cmd.arg(a);
    }
    cmd.query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// What `ACL LOG` holds: one `(reason, object)` per entry (the command, or the key).
async fn acl_log(server: &RedisServer) -> Vec<(String, String)> {
    let mut conn = server.connection().await;
    let entries: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut conn)
        .await
        .unwrap();
    entries
        .into_iter()
        .map(|entry| {
            let fields: Vec<redis::Value> = match entry {
                redis::Value::Array(f) => f,
                redis::Value::Map(m) => m.into_iter().flat_map(|(k, v)| [k, v]).collect(),
                other => panic!("ACL LOG entry {other:?}"),
            };
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|kv| redis::from_redis_value_ref::<String>(&kv[0]).unwrap() == name)
                    .map(|kv| redis::from_redis_value_ref::<String>(&kv[1]).unwrap())
                    .unwrap_or_default()
            };
            (field("reason"), field("object"))
        })
        .collect()
}

/// Whether a key matching `pattern` exists.
async fn exists(server: &RedisServer, pattern: &str) -> bool {
    let mut conn = server.connection().await;
    !redis::cmd("KEYS")
        .arg(pattern)
        .query_async::<Vec<String>>(&mut conn)
        .await
        .unwrap()
        .is_empty()
}

/// A banning limit through the middleware, whose refusals count towards a ban in Redis.
async fn refused_into_a_ban(store: RedisStore, server: &RedisServer) {
    use axum::Router;
    use axum::routing::get;
    use http::StatusCode;
    let layer = tollgate::RateLimitLayer::builder(store)
        .limit(
            tollgate::Limit::new("login", Quota::per_minute(1))
                .key(tollgate::key::PeerIp::new())
                .ban(Ban::after(2))
                .on_store_failure(FailurePolicy::Deny),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer);
    let request = || support::get("/", "192.0.2.9");
    let statuses = support::statuses(&app, 3, request).await;
    // Refused twice: banned (the second refusal's count, in the background).
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !exists(server, "{tollgate:login:*}:ban").await {
        assert!(
            Instant::now() < deadline,
            "two refusals never became a ban in Redis: {:?}",
            acl_log(server).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next request is refused as banned (403 by default).
    assert_eq!(
        support::statuses(&app, 1, request).await,
        [StatusCode::FORBIDDEN]
    );
}

async fn ok(d: impl Future<Output = Result<LimitDecision, LimiterError>>) -> LimitDecision {
    d.await.expect("a configured limit")
}

/// A decision Redis made (no failure policy stood in for it).
fn by_redis(d: &LimitDecision) -> &LimitDecision {
    assert!(matches!(d.status(), Status::Checked(_)), "{:?}", d.status());
    d
}

fn store(url: &str) -> RedisStore {
    RedisStore::open(url)
        .unwrap()
        .timeout(Duration::from_secs(2))
        .in_flight_deadline(Duration::from_secs(2))
}

/// Every kind of limit the store knows, failing closed.
fn limiter(store: RedisStore) -> Limiter {
    let deny = |s: LimitSpec| s.on_store_failure(FailurePolicy::Deny);
    let builder = Limiter::builder(store)
        .limit(deny(LimitSpec::new("gcra", Quota::per_minute(3))))
        .limit(deny(
            LimitSpec::new("fixed", Quota::per_minute(3)).algorithm(Algorithm::fixed_window()),
        ))
        .limit(deny(
            LimitSpec::new("sliding", Quota::per_minute(3)).algorithm(Algorithm::SlidingWindow),
        ))
        .limit(deny(
            LimitSpec::new("log", Quota::per_minute(3)).algorithm(Algorithm::SlidingLog),
        ))
        .limit(deny(
            LimitSpec::new("leased", Quota::per_minute(30)).lease(Lease::tokens(5)),
        ))
        .limit(deny(
            LimitSpec::new("login", Quota::per_minute(1)).ban(Ban::after(2)),
        ))
        .limit(deny(LimitSpec::in_flight("jobs", 2)));
    #[cfg(feature = "calendar")]
    let builder = builder.limit(deny(LimitSpec::new("daily", Quota::per_day(3)).algorithm(
        Algorithm::calendar(tollgate::calendar::Zone::get("Europe/Berlin").unwrap()),
    )));
    builder.build().unwrap()
}

/// Runs every feature of the store through two instances `a` and `b` sharing it.
async fn run_everything(a: &Limiter, b: &Limiter, server: &RedisServer) {
    // Each window algorithm and GCRA: 3 a minute between both instances.
    for name in ["gcra", "fixed", "sliding", "log"] {
        let mut allowed = 0;
        for i in 0..5 {
            let l = if i % 2 == 0 { a } else { b };
            if by_redis(&ok(l.check(name, "k", 1)).await).allowed() {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 3, "{name}");
        // The other operations, where the algorithm has them.
        for result in [
            a.refund(name, "k", 1).await,
            a.penalize(name, "k", 1).await,
            b.reset(name, "k").await,
        ] {
            match result {
                Ok(d) => drop(by_redis(&d)),
                Err(LimiterError::Unsupported { .. }) => {}
                Err(e) => panic!("{name}: {e}"),
            }
        }
        assert!(
            by_redis(&ok(a.check(name, "k", 1)).await).allowed(),
            "{name}"
        );
    }
    by_redis(&ok(a.block("gcra", "blocked", Duration::from_secs(60))).await);
    assert!(!by_redis(&ok(b.check("gcra", "blocked", 1)).await).allowed());

    // A reservation.
    let r = a
        .reserve("gcra", "reserved", 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(r.is_granted());

    // Leases: tokens taken from Redis five at a time.
    for _ in 0..12 {
        assert!(ok(a.check("leased", "k", 1)).await.allowed());
    }

    // Bans: set by hand on `a`, written to Redis (`ban.lua`), and then (a second call,
    // in the background too) the key's bucket blocked for `b`; lifted by `b`. `b` is
    // asked once both have landed: the ban key alone does not refuse `b` yet.
    assert!(ok(b.check("login", "mallory", 1)).await.allowed());
    a.ban("login", "eve", Duration::from_secs(60)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(exists(server, "{tollgate:login:eve}:ban").await
        && exists(server, "tollgate:login:eve").await)
    {
        assert!(
            Instant::now() < deadline,
            "the ban or the bucket's block never reached Redis: {:?}",
            acl_log(server).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!ok(b.check("login", "eve", 1)).await.allowed());
    b.lift_ban("login", "eve").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while exists(server, "{tollgate:login:eve}:ban").await {
        assert!(Instant::now() < deadline, "the ban was never lifted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // In-flight units, renewed once a second while held, released on drop.
    let p1 = a.acquire("jobs", "k").await.unwrap();
    let p2 = b.acquire("jobs", "k").await.unwrap();
    assert!(p1.is_granted() && p2.is_granted());
    assert!(!a.acquire("jobs", "k").await.unwrap().is_granted());
    tokio::time::sleep(Duration::from_millis(1_500)).await; // a renewal
    drop(p1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.acquire("jobs", "k").await.unwrap().is_granted() {
        assert!(Instant::now() < deadline, "the release never landed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(p2);

    #[cfg(feature = "calendar")]
    {
        for _ in 0..3 {
            assert!(by_redis(&ok(a.check("daily", "k", 1)).await).allowed());
        }
        assert!(!by_redis(&ok(b.check("daily", "k", 1)).await).allowed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_runs_under_the_documented_acl_user_and_redis_denies_nothing() {
    let server = RedisServer::start();
    let rule = documented_rule();
    admin(&server, &rule).await;
    admin(&server, &["ACL".into(), "LOG".into(), "RESET".into()]).await;
    // A command outside the rule is denied (and logged): the user is really restricted.
    let url = format!("redis://tollgate:{PASSWORD}@127.0.0.1:{}/", server.port());
    let mut user = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let denied: redis::RedisResult<String> = redis::cmd("GET")
        .arg("other:key")
        .query_async(&mut user)
        .await;
    assert!(denied.is_err(), "a key outside the prefix is denied");
    assert_eq!(acl_log(&server).await.len(), 1);
    admin(&server, &["ACL".into(), "LOG".into(), "RESET".into()]).await;

    // Two instances in one process: named apart, or the live set counts the process once.
    let (sa, sb) = (
        store(&url).instance_name("a"),
        store(&url).instance_name("b"),
    );
    let (a, b) = (limiter(sa.clone()), limiter(sb));
    run_everything(&a, &b, &server).await;
    refused_into_a_ban(store(&url), &server).await;

    // The probe ran (its heartbeat counts both instances), and after a loss of state
    // the write-back keeps an exhausted key exhausted.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = server.connection().await;
        let live: u64 = redis::cmd("ZCARD")
            .arg("tollgate:__instances")
            .query_async(&mut conn)
            .await
            .unwrap();
        if live == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{live} instances counted");
        let _ = ok(a.check("gcra", "probe", 1)).await;
        let _ = ok(b.check("gcra", "probe", 1)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..3 {
        assert!(ok(a.check("gcra", "spent", 1)).await.allowed());
    }
    assert!(!ok(a.check("gcra", "spent", 1)).await.allowed());
    admin(&server, &["FLUSHALL".into()]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = server.connection().await;
        let epoch: Option<String> = redis::cmd("GET")
            .arg("tollgate:__epoch")
            .query_async(&mut conn)
            .await
            .unwrap();
        let spent: Option<String> = redis::cmd("GET")
            .arg("tollgate:gcra:spent")
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        if epoch.is_some() && spent.is_some() {
            break; // the probe wrote its marker anew, and the key was written back
        }
        assert!(Instant::now() < deadline, "no write-back after FLUSHALL");
        let _ = ok(a.check("gcra", "other", 1)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!ok(b.check("gcra", "spent", 1)).await.allowed());

    let log = acl_log(&server).await;
    assert!(log.is_empty(), "Redis denied the documented user: {log:?}");
    assert!(!sa.is_unavailable());
}

#[tokio::test]
async fn refused_admin_commands_degrade_and_are_logged_once() {
    // CONFIG, CLIENT and SCRIPT renamed away, as services do; the user lacks INFO too.
    let server = RedisServer::start_with(
        ["CONFIG", "CLIENT", "SCRIPT"]
            .iter()
            .flat_map(|c| {
                [
                    "--rename-command".to_owned(),
                    (*c).to_owned(),
                    String::new(),
                ]
            })
            .collect(),
        None,
    );
    let rule: Vec<String> = documented_rule()
        .into_iter()
        .filter(|w| w != "+info" && w != "+script|load")
        .collect();
    admin(&server, &rule).await;
    admin(&server, &["ACL".into(), "LOG".into(), "RESET".into()]).await;
    let url = format!("redis://tollgate:{PASSWORD}@127.0.0.1:{}/", server.port());

    let lines = Lines::default();
    let _guard = lines.capture();
    let (sa, sb) = (store(&url), store(&url));
    let limit =
        || LimitSpec::new("gcra", Quota::per_minute(3)).on_store_failure(FailurePolicy::Deny);
    let a = Limiter::builder(sa.clone()).limit(limit()).build().unwrap();
    let b = Limiter::builder(sb).limit(limit()).build().unwrap();
    let mut allowed = 0;
    for i in 0..6 {
        let l = if i % 2 == 0 { &a } else { &b };
        if by_redis(&ok(l.check("gcra", "k", 1)).await).allowed() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 3, "decided in Redis, shared by both instances");

    // Several probes (once a second each): INFO is asked once per store, then no more.
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines.matching("refuses INFO").is_empty() {
        assert!(Instant::now() < deadline, "INFO's refusal never logged");
        let _ = ok(a.check("gcra", "p", 1)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..25 {
        by_redis(&ok(a.check("gcra", "q", 1)).await);
        by_redis(&ok(b.check("gcra", "q", 1)).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lines.matching("refuses INFO").len(), 1);
    assert_eq!(lines.matching("refuses SCRIPT LOAD").len(), 1);
    let log = acl_log(&server).await;
    let info = log.iter().filter(|(_, o)| o == "info").count();
    assert!(
        (1..=2).contains(&info),
        "INFO asked once per store: {log:?}"
    );
    assert!(
        log.iter().all(|(_, o)| o == "info"),
        "only INFO was refused by the ACL (SCRIPT is renamed away): {log:?}"
    );
    // No request failed because of an admin command.
    assert!(!sa.is_unavailable());
}

/// On Redis Cluster, the documented rule plus `+cluster|slots +ping` (what the guide says
/// to add: the cluster client pings the nodes it connects to) on every node: checks in
/// every slot range and the probe's markers per master (`CLUSTER SLOTS`), and no node
/// denies anything; then, every node's scripts flushed and `SCRIPT LOAD` taken from the
/// user, decisions go on by `EVAL`.
#[cfg(feature = "redis-cluster")]
#[tokio::test]
async fn a_cluster_store_runs_under_the_rule_with_cluster_slots_and_ping_and_scripts_lost_per_node_go_by_eval()
 {
    use support::redis::RedisCluster;

    let cluster = RedisCluster::start(3);
    let mut rule = documented_rule();
    rule.extend(["+cluster|slots".to_owned(), "+ping".to_owned()]);
    for node in cluster.nodes() {
        admin(node, &rule).await;
        admin(node, &["ACL".into(), "LOG".into(), "RESET".into()]).await;
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://tollgate:{PASSWORD}@127.0.0.1:{}/", n.port()))
        .collect();
    let open = async || {
        let client = redis::cluster::ClusterClient::new(urls.clone()).unwrap();
        RedisStore::cluster(client.get_async_connection().await.unwrap())
            .timeout(Duration::from_secs(2))
    };
    let spec =
        || LimitSpec::new("gcra", Quota::per_minute(3)).on_store_failure(FailurePolicy::Deny);
    let a = Limiter::builder(open().await)
        .limit(spec())
        .build()
        .unwrap();
    let b = Limiter::builder(open().await.deny_cache(false))
        .limit(spec())
        .build()
        .unwrap();
    for user in (0..12).map(|i| format!("user-{i}")) {
        let mut allowed = 0;
        for i in 0..5 {
            let l = if i % 2 == 0 { &a } else { &b };
            allowed +=
                usize::from(by_redis(&ok(l.check("gcra", user.as_str(), 1)).await).allowed());
        }
        assert_eq!(allowed, 3, "{user}");
    }
    // The probe reads its markers (CLUSTER SLOTS) at most once a second: let it run twice.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        by_redis(&ok(a.check("gcra", "probe", 1)).await);
        by_redis(&ok(b.check("gcra", "probe", 1)).await);
    }
    for node in cluster.nodes() {
        let log = acl_log(node).await;
        assert!(log.is_empty(), "node {} denied: {log:?}", node.port());
    }

    // Scripts are cached per node. Every node flushes them and the user loses
    // `SCRIPT LOAD`: each node's first call answers NOSCRIPT, the load is refused, and the
    // script goes by `EVAL` to the node of its keys; decisions stay Redis's.
    for node in cluster.nodes() {
        admin(
            node,
            &["ACL", "SETUSER", "tollgate", "-script|load"].map(String::from),
        )
        .await;
        admin(node, &["SCRIPT".into(), "FLUSH".into()]).await;
    }
    for user in (0..12).map(|i| format!("after-flush-{i}")) {
        assert!(by_redis(&ok(a.check("gcra", user.as_str(), 1)).await).allowed());
    }
    let mut refused = 0;
    for node in cluster.nodes() {
        let log = acl_log(node).await;
        assert!(
            log.iter().all(|(_, o)| o == "script|load"),
            "node {} denied: {log:?}",
            node.port()
        );
        refused += log.len();
    }
    assert!(refused > 0, "no node was asked to load a script");
}

/// Under Redis Sentinel: the master's ACL user and password from `SentinelOptions`, the
/// documented rule plus `+role` (the client asks the master its role) on the master, and
/// nothing denied.
#[cfg(feature = "redis-sentinel")]
#[tokio::test]
async fn a_sentinel_store_logs_in_to_the_master_under_the_documented_rule_with_role() {
    use tollgate::store::SentinelOptions;

    let master = RedisServer::start();
    let mut rule = documented_rule();
    rule.push("+role".to_owned());
    admin(&master, &rule).await;
    // Without a password for the default user, a store that did not log in would pass.
    admin(
        &master,
        &["ACL", "SETUSER", "default", "on", ">admin-only"].map(String::from),
    )
    .await;
    let sentinel = RedisServer::start_sentinel(&master);
    let mut log_reset = redis::cmd("ACL");
    log_reset.arg("LOG").arg("RESET");
    let admin_url = format!("redis://default:admin-only@127.0.0.1:{}/", master.port());
    let mut admin_conn = redis::Client::open(admin_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = log_reset.query_async(&mut admin_conn).await.unwrap();

    let sentinels = [format!("redis://127.0.0.1:{}", sentinel.port())];
    let open = || {
        RedisStore::sentinel_with(
            &sentinels,
            "mymaster",
            SentinelOptions::new().master_auth(Some("tollgate"), PASSWORD),
        )
        .unwrap()
        .timeout(Duration::from_secs(2))
    };
    let spec =
        || LimitSpec::new("gcra", Quota::per_minute(3)).on_store_failure(FailurePolicy::Deny);
    let a = Limiter::builder(open()).limit(spec()).build().unwrap();
    let b = Limiter::builder(open()).limit(spec()).build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok(a.check("gcra", "first", 1)).await.allowed() {
        assert!(Instant::now() < deadline, "never reached the master");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut allowed = 0;
    for i in 0..5 {
        let l = if i % 2 == 0 { &a } else { &b };
        allowed += usize::from(by_redis(&ok(l.check("gcra", "k", 1)).await).allowed());
    }
    assert_eq!(allowed, 3);
    // The probe (INFO, the marker, the heartbeat) runs at most once a second.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        by_redis(&ok(a.check("gcra", "probe", 1)).await);
    }
    let entries: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut admin_conn)
        .await
        .unwrap();
    assert!(entries.is_empty(), "the master denied: {entries:?}");
}
