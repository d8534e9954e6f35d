//! [`SqlPlanKeyRow`] and [`fetch_plan_keys`]: the `RateLimitPlanKey` table, the plan of
//! each API key (for [`SqlSourceOptions::plan_by_key`](super::SqlSourceOptions::plan_by_key)).

use sqlx::Row;

use super::SqlPool;
use crate::rules::MAX_PLAN_KEYS;

/// One active row of `RateLimitPlanKey`: an API key and its plan.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlPlanKeyRow {
    /// `api_key`: the key as requests carry it.
    pub api_key: String,
    /// `plan`: the `plan` of `RateLimitRule` rows.
    pub plan: String,
}

impl SqlPlanKeyRow {
    /// A key and its plan.
    pub fn new(api_key: impl Into<String>, plan: impl Into<String>) -> Self {
        Self {
            api_key: api_key.into(),
            plan: plan.into(),
        }
    }
}

/// At most one more row than a document may hold: a larger table is refused when mapped,
/// never read whole.
fn select() -> String {
    format!(
        "SELECT api_key, plan FROM RateLimitPlanKey WHERE is_active ORDER BY api_key LIMIT {}",
        MAX_PLAN_KEYS + 1
    )
}

fn decode<R: Row>(row: &R) -> Result<SqlPlanKeyRow, sqlx::Error>
where
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    &'static str: sqlx::ColumnIndex<R>,
{
    let column = |name: &'static str| {
        row.try_get::<String, _>(name).map_err(|e| match e {
            sqlx::Error::ColumnDecode { source, .. } => sqlx::Error::ColumnDecode {
                index: format!("RateLimitPlanKey.{name}"),
                source,
            },
            other => other,
        })
    };
    Ok(SqlPlanKeyRow {
        api_key: column("api_key")?,
        plan: column("plan")?,
    })
}

/// The active rows of `RateLimitPlanKey`, by `api_key`: at most
/// [`MAX_PLAN_KEYS`](crate::rules::MAX_PLAN_KEYS) + 1 (more is refused when the rows are
/// mapped, with the table's size bounded in memory).
pub async fn fetch_plan_keys(pool: &SqlPool) -> Result<Vec<SqlPlanKeyRow>, sqlx::Error> {
    let select = select();
    match pool {
        SqlPool::Sqlite(pool) => {
            let rows = sqlx::query(&select).fetch_all(pool).await?;
            rows.iter().map(decode).collect()
        }
        #[cfg(feature = "rules-postgres")]
        SqlPool::Postgres(pool) => {
            let rows = sqlx::query(&select).fetch_all(pool).await?;
            rows.iter().map(decode).collect()
        }
    }
}
