//! [`SqlViolationSink`]: the audit log into `RateLimitViolation`.

use super::SqlPool;
use crate::audit::{AuditSink, Violation, WriteFuture};
use crate::base::round::ceil_ms;

/// Rows per `INSERT` statement: 10 parameters a row stays far below SQLite's 32,766 and
/// PostgreSQL's 65,535.
const ROWS_PER_STATEMENT: usize = 1_000;

const INSERT: &str = "INSERT INTO RateLimitViolation (bucket_key, ip_address, endpoint, \
     requested_at, tokens_at_time, rule_id, limit_name, cost, retry_after_ms, shadow) ";

/// Writes each batch of the audit log into `RateLimitViolation` (created by
/// [`migrate`](super::migrate)): one transaction, multi-row `INSERT`s of up to 1,000 rows.
/// A batch that fails is rolled back and lost whole (the audit log counts it and logs
/// why; see [`AuditSink`]).
///
/// Columns: `bucket_key` ← [`Violation::key`], `ip_address` ← `client`, `endpoint` ←
/// `route`, `requested_at` ← `at` (RFC 3339 text in SQLite, `TIMESTAMPTZ` in
/// PostgreSQL), `tokens_at_time` ← `tokens_left`, `rule_id`, `limit_name`, `cost`,
/// `retry_after_ms` (rounded up), `shadow`; `violation_id` is the database's, `user_id`
/// is left `NULL` for the application. See the [module docs](super) for an example.
#[derive(Debug, Clone)]
pub struct SqlViolationSink {
    pool: SqlPool,
}

impl SqlViolationSink {
    /// A sink writing through `pool`.
    pub fn new(pool: impl Into<SqlPool>) -> Self {
        Self { pool: pool.into() }
    }
}

/// One violation as bound values.
struct Values {
    key: String,
    ip: Option<String>,
    route: String,
    at: String,
    tokens: f64,
    rule_id: Option<i64>,
    limit: &'static str,
    cost: i64,
    retry_after_ms: Option<i64>,
    shadow: bool,
}

impl From<Violation> for Values {
    fn from(v: Violation) -> Self {
        Values {
            at: v.at_rfc3339(),
            ip: v.client.map(|ip| ip.to_string()),
            tokens: v.tokens_left as f64,
            // Limit::rule_id is validated to fit.
            rule_id: v.rule_id.and_then(|id| i64::try_from(id).ok()),
            cost: i64::from(v.cost),
            retry_after_ms: v
                .retry_after
                .map(|w| i64::try_from(ceil_ms(w)).unwrap_or(i64::MAX)),
            key: v.key,
            route: v.route,
            limit: v.limit,
            shadow: v.shadow,
        }
    }
}

/// The SQL types a database needs the text values cast to: SQLite stores the address and
/// the time as text, PostgreSQL's columns are `INET` and `TIMESTAMPTZ`.
#[derive(Clone, Copy)]
struct Casts {
    ip: Option<&'static str>,
    at: Option<&'static str>,
}

impl Casts {
    const NONE: Casts = Casts { ip: None, at: None };
    #[cfg(feature = "rules-postgres")]
    const POSTGRES: Casts = Casts {
        ip: Some("INET"),
        at: Some("TIMESTAMPTZ"),
    };
}

/// Writes `rows` into `pool` (of database `db`) in one transaction of multi-row
/// `INSERT`s, the values cast as `casts` says; `?` returns the error from the enclosing
/// async block. One body for every database, as a macro: a function generic over the
/// database cannot borrow a fresh `QueryBuilder` per statement (sqlx's arguments type is
/// a projection there, so its lifetime cannot be shortened to the borrow).
macro_rules! insert {
    ($pool:expr, $rows:expr, $db:ty, $casts:expr) => {{
        let casts: Casts = $casts;
        let mut tx = $pool.begin().await?;
        for chunk in $rows.chunks(ROWS_PER_STATEMENT) {
            let mut q = sqlx::QueryBuilder::<$db>::new(INSERT);
            q.push_values(chunk, |mut b, v: &Values| {
                b.push_bind(v.key.as_str());
                bind_cast(&mut b, v.ip.as_deref(), casts.ip);
                b.push_bind(v.route.as_str());
                bind_cast(&mut b, v.at.as_str(), casts.at);
                b.push_bind(v.tokens)
                    .push_bind(v.rule_id)
                    .push_bind(v.limit)
                    .push_bind(v.cost)
                    .push_bind(v.retry_after_ms)
                    .push_bind(v.shadow);
            });
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
    }};
}

impl AuditSink for SqlViolationSink {
    fn write(&self, batch: Vec<Violation>) -> WriteFuture<'_> {
        Box::pin(async move {
            let rows: Vec<Values> = batch.into_iter().map(Values::from).collect();
            match &self.pool {
                SqlPool::Sqlite(pool) => insert!(pool, &rows, sqlx::Sqlite, Casts::NONE),
                #[cfg(feature = "rules-postgres")]
                SqlPool::Postgres(pool) => insert!(pool, &rows, sqlx::Postgres, Casts::POSTGRES),
            }
            Ok(())
        })
    }
}

/// Binds `value` as the next column, as `CAST(value AS cast)` when the database needs it.
fn bind_cast<'args, DB, T>(
    b: &mut sqlx::query_builder::Separated<'_, 'args, DB, &'static str>,
    value: T,
    cast: Option<&str>,
) where
    DB: sqlx::Database,
    T: 'args + sqlx::Encode<'args, DB> + sqlx::Type<DB>,
{
    match cast {
        None => {
            b.push_bind(value);
        }
        Some(ty) => {
            b.push("CAST(")
                .push_bind_unseparated(value)
                .push_unseparated(format_args!(" AS {ty})"));
        }
    }
}
