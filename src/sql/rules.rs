//! [`SqlRuleRow`] and [`fetch_rules`]: the `RateLimitRule` table as it is.

use sqlx::Row;

use super::SqlPool;

/// One row of `RateLimitRule`, as stored (the columns of the schema, in SQL's types).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SqlRuleRow {
    /// `rule_id`: the id a limit built from this row carries
    /// ([`Limit::rule_id`](crate::Limit::rule_id)).
    pub rule_id: i64,
    /// `key_pattern`, e.g. `user:{user_id}`.
    pub key_pattern: String,
    /// `scope`: `user`, `endpoint`, `global`, `ip`, ….
    pub scope: String,
    /// `rate_per_second`: tokens added per second.
    pub rate_per_second: f64,
    /// `burst_capacity`: the most tokens in the bucket.
    pub burst_capacity: i32,
    /// `plan`: `None` applies to every plan.
    pub plan: Option<String>,
    /// `is_active`.
    pub is_active: bool,
    /// `description`.
    pub description: Option<String>,
}

impl SqlRuleRow {
    /// An active row without a plan or a description.
    ///
    /// ```
    /// use tollgate::sql::SqlRuleRow;
    ///
    /// let mut pro = SqlRuleRow::new(2, "user:{user_id}", "user", 100.0, 500);
    /// pro.plan = Some("pro".into());
    /// assert!(pro.is_active);
    /// ```
    pub fn new(
        rule_id: i64,
        key_pattern: impl Into<String>,
        scope: impl Into<String>,
        rate_per_second: f64,
        burst_capacity: i32,
    ) -> Self {
        Self {
            rule_id,
            key_pattern: key_pattern.into(),
            scope: scope.into(),
            rate_per_second,
            burst_capacity,
            plan: None,
            is_active: true,
            description: None,
        }
    }
}

const SELECT: &str = "SELECT rule_id, key_pattern, scope, rate_per_second, burst_capacity, \
     plan, is_active, description FROM RateLimitRule ORDER BY rule_id";

macro_rules! decode {
    ($row:expr) => {{
        let row = $row;
        Ok::<_, sqlx::Error>(SqlRuleRow {
            rule_id: row.try_get("rule_id")?,
            key_pattern: row.try_get("key_pattern")?,
            scope: row.try_get("scope")?,
            rate_per_second: row.try_get("rate_per_second")?,
            burst_capacity: row.try_get("burst_capacity")?,
            plan: row.try_get("plan")?,
            is_active: row.try_get("is_active")?,
            description: row.try_get("description")?,
        })
    }};
}

/// Every row of `RateLimitRule`, active and inactive, by `rule_id`.
pub async fn fetch_rules(pool: &SqlPool) -> Result<Vec<SqlRuleRow>, sqlx::Error> {
    match pool {
        SqlPool::Sqlite(pool) => {
            let rows = sqlx::query(SELECT).fetch_all(pool).await?;
            rows.iter().map(|row| decode!(row)).collect()
        }
        #[cfg(feature = "rules-postgres")]
        SqlPool::Postgres(pool) => {
            let rows = sqlx::query(SELECT).fetch_all(pool).await?;
            rows.iter().map(|row| decode!(row)).collect()
        }
    }
}
