//! The SQL side. With feature `audit-sql` (SQLite only, nothing of the rules stack): the
//! schema of the `RateLimitRule` and `RateLimitViolation` tables, its migration
//! ([`migrate`]) and the audit sink [`SqlViolationSink`]. With `rules-sql` (which enables
//! `audit-sql` and `rules`), the rules side too: [`fetch_rules`], which reads the rule rows,
//! [`rules_document`], which maps them to a rules [`Document`](crate::rules::Document),
//! and [`RulesBuilder::build_sql`](crate::rules::RulesBuilder::build_sql), which serves
//! them and polls the table for changes ([`SqlPoller`]). PostgreSQL with
//! `rules-postgres`.
//!
//! The migration files ship with the crate (`migrations/sqlite/0001_tollgate.sql` and
//! `0002_plan_keys.sql`, the same in `migrations/postgres/`) for any migration tool;
//! [`migrate`] runs the right ones, creating what is missing (`CREATE … IF NOT EXISTS`: running it again changes
//! nothing). Queries are plain strings checked at run time: nothing needs a database at
//! build time.
//!
//! ```
//! use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
//! use tollgate::audit::AuditLog;
//! use tollgate::sql::{self, SqlPool, SqlViolationSink};
//! use tollgate::{key::PeerIp, store::MemoryStore, Limit, Quota, RateLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("tollgate.db");
//! let options = SqliteConnectOptions::new().filename(&path).create_if_missing(true);
//! let pool = SqlPool::from(SqlitePoolOptions::new().connect_with(options).await?);
//! sql::migrate(&pool).await?;
//!
//! let audit = AuditLog::new(SqlViolationSink::new(pool.clone()));
//! let layer = RateLimitLayer::builder(MemoryStore::new())
//!     .limit(Limit::new("per-ip", Quota::per_second(5)).key(PeerIp::new()).rule_id(1))
//!     .audit(audit)
//!     .build()?;
//! # #[cfg(feature = "rules-sql")]
//! assert!(sql::fetch_rules(&pool).await?.is_empty());
//! # let _ = layer;
//! # Ok(()) }
//! ```

// The audit sink and the schema (`audit-sql`).
mod sink;

pub use sink::SqlViolationSink;

// The rules read from the `RateLimitRule` table (`rules-sql`).
#[cfg(feature = "rules-sql")]
mod file;
#[cfg(feature = "rules-sql")]
mod mapping;
#[cfg(feature = "rules-sql")]
mod options;
#[cfg(feature = "rules-sql")]
mod plan_keys;
#[cfg(feature = "rules-sql")]
mod rules;
#[cfg(feature = "rules-sql")]
mod source;

#[cfg(feature = "rules-sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules-sql")))]
pub use mapping::{DEFAULT_PLAN, rules_document, rules_document_with_keys};
#[cfg(feature = "rules-sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules-sql")))]
pub use options::{SqlSourceOptions, UserKey};
#[cfg(feature = "rules-sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules-sql")))]
pub use plan_keys::{SqlPlanKeyRow, fetch_plan_keys};
#[cfg(feature = "rules-sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules-sql")))]
pub use rules::{SqlRuleRow, fetch_rules};
#[cfg(feature = "rules-sql")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules-sql")))]
pub use source::{SqlPoller, SqlRulesError};
/// The `sqlx` this module is built on (pools, options, errors).
pub use sqlx;

/// The SQLite migration: both tables and their indexes.
pub const SQLITE_MIGRATION: &str = include_str!("../../migrations/sqlite/0001_tollgate.sql");

/// The second SQLite migration: the `RateLimitPlanKey` table (the plan of each API key).
pub const SQLITE_PLAN_KEYS_MIGRATION: &str =
    include_str!("../../migrations/sqlite/0002_plan_keys.sql");

/// The PostgreSQL migration: both tables and their indexes.
#[cfg(feature = "rules-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules-postgres")))]
pub const POSTGRES_MIGRATION: &str = include_str!("../../migrations/postgres/0001_tollgate.sql");

/// The second PostgreSQL migration: the `RateLimitPlanKey` table (the plan of each API
/// key).
#[cfg(feature = "rules-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules-postgres")))]
pub const POSTGRES_PLAN_KEYS_MIGRATION: &str =
    include_str!("../../migrations/postgres/0002_plan_keys.sql");

/// A connection pool of a supported database.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SqlPool {
    /// SQLite (bundled with `sqlx`).
    Sqlite(sqlx::SqlitePool),
    /// PostgreSQL (feature `rules-postgres`).
    #[cfg(feature = "rules-postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rules-postgres")))]
    Postgres(sqlx::PgPool),
}

impl From<sqlx::SqlitePool> for SqlPool {
    fn from(pool: sqlx::SqlitePool) -> Self {
        SqlPool::Sqlite(pool)
    }
}

#[cfg(feature = "rules-postgres")]
impl From<sqlx::PgPool> for SqlPool {
    fn from(pool: sqlx::PgPool) -> Self {
        SqlPool::Postgres(pool)
    }
}

/// Creates the `RateLimitRule`, `RateLimitViolation` and `RateLimitPlanKey` tables and
/// their indexes where they are missing (the migrations of the pool's database, in order,
/// each in one batch of statements).
pub async fn migrate(pool: &SqlPool) -> Result<(), sqlx::Error> {
    match pool {
        SqlPool::Sqlite(pool) => {
            sqlx::raw_sql(SQLITE_MIGRATION).execute(pool).await?;
            sqlx::raw_sql(SQLITE_PLAN_KEYS_MIGRATION)
                .execute(pool)
                .await?;
        }
        #[cfg(feature = "rules-postgres")]
        SqlPool::Postgres(pool) => {
            sqlx::raw_sql(POSTGRES_MIGRATION).execute(pool).await?;
            sqlx::raw_sql(POSTGRES_PLAN_KEYS_MIGRATION)
                .execute(pool)
                .await?;
        }
    }
    Ok(())
}
