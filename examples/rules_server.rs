//! Limits from a rules file, or from the `RateLimitRule` table of a database, reloaded
//! while the server runs.
//!
//! ```text
//! cargo run -p tollgate --example rules_server --features rules    # RULES=path (default examples/rules.toml), PORT=3000
//! ```
//!
//! From SQLite instead (feature `rules-sql`): the file and the tables are created when
//! missing, an empty `RateLimitRule` gets demonstration rows (a global rule, one per
//! client address, `POST /login` for the whole app, a rule per API key with plans `free`
//! and `pro`, each key's plan in `RateLimitPlanKey`: the plan comes from the key, never
//! from the client), the tables are read every `RULES_POLL_SECS` (default 60), and
//! refusals are written to `RateLimitViolation` in the same database:
//!
//! ```text
//! RULES_DB=sqlite://rules.db RULES_POLL_SECS=5 cargo run -p tollgate --example rules_server --features rules-sql
//! curl -i -H 'x-api-key: key-free-1' http://127.0.0.1:3000/   # 4th in a second: 429
//! sqlite3 rules.db "UPDATE RateLimitRule SET burst_capacity = 20 WHERE plan = 'free'"   # next poll
//! sqlite3 rules.db "INSERT INTO RateLimitPlanKey (api_key, plan) VALUES ('key-pro-2', 'pro')"
//! sqlite3 rules.db "UPDATE RateLimitRule SET is_active = FALSE WHERE key_pattern = 'ip:{ip}'"
//! sqlite3 rules.db "SELECT rule_id, limit_name, ip_address, endpoint, requested_at FROM RateLimitViolation"
//! ```
//!
//! With `REDIS_URL` (feature `redis`), the limits are shared through Redis by every
//! instance that runs with the same URL; a limit with `lease = "auto"` in the file (as
//! `global` in `examples/rules.toml`) is spent from leases, without a call per request:
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 PORT=3000 cargo run -p tollgate --example rules_server --features rules,redis &
//! REDIS_URL=redis://127.0.0.1:6379 PORT=3001 cargo run -p tollgate --example rules_server --features rules,redis &
//! ```
//!
//! `LEASE_STATS=1` prints what lease mode decided once a second (`scripts/lease_stress.sh`
//! runs several such servers under floods and Redis faults).
//!
//! With feature `redis-tls`, a `rediss://` URL speaks TLS (the platform's root
//! certificates), and `REDIS_CA` (a PEM file) trusts that CA instead, `REDIS_CLIENT_CERT`
//! and `REDIS_CLIENT_KEY` (PEM files) present a client certificate (mutual TLS):
//!
//! ```text
//! REDIS_URL=rediss://app:secret@127.0.0.1:6380 REDIS_CA=ca.pem cargo run -p tollgate --example rules_server --features rules,redis-tls
//! ```
//!
//! Under Redis Sentinel (feature `redis-sentinel`), `REDIS_SENTINELS` lists the sentinels and
//! `REDIS_MASTER` names the master (default `mymaster`); failovers are followed:
//!
//! ```text
//! REDIS_SENTINELS=redis://127.0.0.1:26379,redis://127.0.0.1:26380 cargo run -p tollgate --example rules_server --features rules,redis-sentinel
//! ```
//!
//! It prints the rules at start, after each reload, and each refused reload (the running
//! rules stay). Try:
//!
//! ```text
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/; done; echo
//! # 200 200 200 200 200 200 200 200 200 200 429 429: per-ip's burst of 10 (one more 200 if it refilled meanwhile: 5/s)
//! sleep 2                                               # per-ip refills (5/s), so what follows meets its own limits
//! for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code} ' -X POST -H 'x-user: alice' http://127.0.0.1:3000/login; done; echo
//! # 200 200 200 200 200 429: login's 5 a minute for alice from this address
//! curl -i -X POST http://127.0.0.1:3000/login           # no x-user: 400 that names the header
//! curl -i 'http://127.0.0.1:3000/api/search?pages=3'    # search costs 3 of its 100 this minute: "search";r=97
//! curl -i http://127.0.0.1:3000/health                 # never limited
//! # Edit examples/rules.toml (say, per-ip to "1/s"): reloaded at once.
//! # Break it (quota = "1/fortnight"): the error is printed, the old rules keep serving.
//! kill -HUP <pid>                                       # reloads too (a file)
//! ```

use std::net::SocketAddr;

use axum::{
    Router,
    routing::{get, post},
};
use tollgate::ConfigError;
use tollgate::rules::{Document, Rules};
use tollgate::store::{MemoryStore, Store};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    #[cfg(feature = "redis-sentinel")]
    if let Ok(sentinels) = std::env::var("REDIS_SENTINELS") {
        let master = std::env::var("REDIS_MASTER").unwrap_or_else(|_| "mymaster".into());
        let store = tollgate::store::RedisStore::sentinel(sentinels.split(','), &master)?
            .prefix("tollgate-rules:");
        println!("limits shared through the master {master} of {sentinels}");
        return serve(store).await;
    }
    match std::env::var("REDIS_URL") {
        #[cfg(feature = "redis")]
        Ok(url) => {
            // Starts whether Redis is up or not (the failure policy answers meanwhile).
            let store = open(&url)?.prefix("tollgate-rules:");
            // The host only: the URL may hold a password.
            let host = url.rsplit('@').next().unwrap_or(&url);
            println!("limits shared through Redis at {host}");
            if std::env::var_os("LEASE_STATS").is_some() {
                // What lease mode decided, once a second (scripts/lease_stress.sh reads it).
                let store = store.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        let s = store.lease_stats();
                        println!(
                            "lease stats: local_allowed={} local_refused={} remote={} lease_calls={}",
                            s.local_allowed, s.local_refused, s.remote, s.lease_calls
                        );
                    }
                });
            }
            serve(store).await
        }
        #[cfg(not(feature = "redis"))]
        Ok(_) => Err("REDIS_URL needs the `redis` feature: --features rules,redis".into()),
        Err(_) => serve(MemoryStore::new()).await,
    }
}

/// The store at `url`, with `REDIS_CA`, `REDIS_CLIENT_CERT` and `REDIS_CLIENT_KEY` if set
/// (feature `redis-tls`).
#[cfg(feature = "redis")]
fn open(url: &str) -> Result<tollgate::store::RedisStore, ConfigError> {
    #[cfg(feature = "redis-tls")]
    if std::env::var_os("REDIS_CA").is_some() || std::env::var_os("REDIS_CLIENT_CERT").is_some() {
        let mut tls = tollgate::store::RedisTls::new();
        if let Some(ca) = std::env::var_os("REDIS_CA") {
            tls = tls.ca_file(ca)?;
        }
        if let (Some(cert), Some(key)) = (
            std::env::var_os("REDIS_CLIENT_CERT"),
            std::env::var_os("REDIS_CLIENT_KEY"),
        ) {
            tls = tls.client_files(cert, key)?;
        }
        return tollgate::store::RedisStore::open_tls(url, 1, &tls);
    }
    tollgate::store::RedisStore::open(url)
}

/// Serves the rules from `RULES_DB` or `RULES`, kept in `store`.
async fn serve<St: Store>(store: St) -> Result<(), Box<dyn std::error::Error>> {
    let (rules, source) = match std::env::var("RULES_DB") {
        Ok(url) => from_database(store, &url, print_reload).await?,
        Err(_) => {
            let path = std::env::var("RULES").unwrap_or_else(|_| "examples/rules.toml".into());
            // `.text(..)` or `.document(..)` are other sources; `rules.reload_document(doc)`
            // installs rules read from elsewhere.
            let rules = Rules::builder(store)
                .file(&path)
                .on_reload(print_reload)
                .build()?;
            (rules, path)
        }
    };

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
        "listening on http://{} (pid {}), rules from {source}",
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

/// Prints the rules at start and after each reload, and each refused reload.
fn print_reload(outcome: Result<&Document, &ConfigError>) {
    match outcome {
        Ok(doc) => println!("rules loaded:\n{doc}"),
        Err(e) => println!("rules refused, the running rules stay: {e}"),
    }
}

/// What `on_reload` is given.
type OnReload = fn(Result<&Document, &ConfigError>);

/// Rules polled from the `RateLimitRule` table of the SQLite database at `url`, which is
/// created (with demonstration rows) when missing; violations go to the same database.
#[cfg(feature = "rules-sql")]
async fn from_database<St: Store>(
    store: St,
    url: &str,
    on_reload: OnReload,
) -> Result<(Rules<St>, String), Box<dyn std::error::Error>> {
    use std::str::FromStr;
    use std::time::Duration;

    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    use tollgate::audit::AuditLog;
    use tollgate::sql::{self, SqlPool, SqlSourceOptions, SqlViolationSink, UserKey};

    let options = SqliteConnectOptions::from_str(url)?.create_if_missing(true);
    let pool = SqlitePoolOptions::new().connect_with(options).await?;
    let db = SqlPool::from(pool.clone());
    sql::migrate(&db).await?;
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM RateLimitRule")
        .fetch_one(&pool)
        .await?;
    if rows == 0 {
        sqlx::raw_sql(
            "INSERT INTO RateLimitRule (key_pattern, scope, rate_per_second, burst_capacity, plan, description) VALUES
                ('global', 'global', 100, 200, NULL, 'every request: 100/s, bursts of 200'),
                ('ip:{ip}', 'ip', 5, 10, NULL, 'per client address: 5/s, bursts of 10'),
                ('endpoint:POST /login', 'endpoint', 0.2, 3, NULL, 'logins, whole app: one every 5 s, bursts of 3'),
                ('user:{user_id}', 'user', 1, 3, 'free', 'per API key (x-api-key) on plan free'),
                ('user:{user_id}', 'user', 10, 20, 'pro', 'per API key on plan pro; keys of no plan: not limited');
             INSERT OR IGNORE INTO RateLimitPlanKey (api_key, plan) VALUES
                ('key-free-1', 'free'),
                ('key-pro-1', 'pro')",
        )
        .execute(&pool)
        .await?;
        println!("RateLimitRule was empty: inserted 5 demonstration rows and 2 API keys");
    }
    let poll: u64 = match std::env::var("RULES_POLL_SECS") {
        Ok(secs) => secs.parse()?,
        Err(_) => 60,
    };
    let audit = AuditLog::new(SqlViolationSink::new(db.clone()));
    let (rules, _poller) = Rules::builder(store)
        .on_reload(on_reload)
        .configure(move |builder| builder.audit(audit.clone()))
        .build_sql(
            db,
            SqlSourceOptions::default()
                .poll_every(Duration::from_secs(poll))
                // `user` rules count per API key; its plan is its row of RateLimitPlanKey.
                .user_key(UserKey::header("x-api-key"))
                .plan_by_key("x-api-key"),
        )
        .await?;
    // The poller runs until the rules are dropped (dropping its handle does not stop it).
    Ok((
        rules,
        format!("{url} (RateLimitRule and RateLimitPlanKey, read every {poll} s)"),
    ))
}

#[cfg(not(feature = "rules-sql"))]
async fn from_database<St: Store>(
    _store: St,
    _url: &str,
    _on_reload: OnReload,
) -> Result<(Rules<St>, String), Box<dyn std::error::Error>> {
    Err("RULES_DB needs the `rules-sql` feature: cargo run -p tollgate --example rules_server --features rules-sql".into())
}
