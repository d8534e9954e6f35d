//! [`SqlViolationSink`]: the audit log into `RateLimitViolation`.

use super::SqlPool;
use crate::audit::{AuditSink, BoxError, Violation, WriteFuture};

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
                .map(|w| i64::try_from(crate::web::hooks::ceil_ms(w)).unwrap_or(i64::MAX)),
            key: v.key,
            route: v.route,
            limit: v.limit,
            shadow: v.shadow,
        }
    }
}

impl AuditSink for SqlViolationSink {
    fn write(&self, batch: Vec<Violation>) -> WriteFuture<'_> {
        Box::pin(async move {
            let rows: Vec<Values> = batch.into_iter().map(Values::from).collect();
            match &self.pool {
                SqlPool::Sqlite(pool) => write_sqlite(pool, rows).await,
                #[cfg(feature = "rules-postgres")]
                SqlPool::Postgres(pool) => write_postgres(pool, rows).await,
            }
        })
    }
}

async fn write_sqlite(pool: &sqlx::SqlitePool, rows: Vec<Values>) -> Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(INSERT);
        q.push_values(chunk, |mut b, v| {
            b.push_bind(v.key.as_str())
                .push_bind(v.ip.as_deref())
                .push_bind(v.route.as_str())
                .push_bind(v.at.as_str())
                .push_bind(v.tokens)
                .push_bind(v.rule_id)
                .push_bind(v.limit)
                .push_bind(v.cost)
                .push_bind(v.retry_after_ms)
                .push_bind(v.shadow);
        });
        q.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(feature = "rules-postgres")]
async fn write_postgres(pool: &sqlx::PgPool, rows: Vec<Values>) -> Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(INSERT);
        q.push_values(chunk, |mut b, v| {
            b.push_bind(v.key.as_str())
                .push("CAST(")
                .push_bind_unseparated(v.ip.as_deref())
                .push_unseparated(" AS INET)")
                .push_bind(v.route.as_str())
                .push("CAST(")
                .push_bind_unseparated(v.at.as_str())
                .push_unseparated(" AS TIMESTAMPTZ)")
                .push_bind(v.tokens)
                .push_bind(v.rule_id)
                .push_bind(v.limit)
                .push_bind(v.cost)
                .push_bind(v.retry_after_ms)
                .push_bind(v.shadow);
        });
        q.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}
