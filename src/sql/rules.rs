//! [`SqlRuleRow`] and [`fetch_rules`]: the `RateLimitRule` table as it is.

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::SqlPool;
use crate::base::error::ConfigError;

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

/// Where a bad value of a row is reported: `RateLimitRule[rule_id=N].column`.
const ROW: &str = "RateLimitRule[rule_id=";

/// One row, each column decoded on its own: a value that does not decode (out of range, of
/// another type) or a `NULL` where the schema has `NOT NULL` is an error naming the row
/// and the column.
fn decode<'r, R>(row: &'r R) -> Result<SqlRuleRow, sqlx::Error>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    i32: Decode<'r, R::Database> + Type<R::Database>,
    f64: Decode<'r, R::Database> + Type<R::Database>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
{
    let rule_id: i64 = match row.try_get::<Option<i64>, _>("rule_id") {
        Ok(Some(id)) => id,
        Ok(None) => return Err(bad("RateLimitRule.rule_id".to_owned(), "is NULL".into())),
        Err(e) => return Err(renamed(e, "RateLimitRule.rule_id".to_owned())),
    };
    let at = |column: &str| format!("{ROW}{rule_id}].{column}");
    let optional = |column: &'static str| move |e: sqlx::Error| renamed(e, at(column));
    let required = |column: &'static str, why: &'static str| move || bad(at(column), why.into());
    Ok(SqlRuleRow {
        rule_id,
        key_pattern: row
            .try_get::<Option<String>, _>("key_pattern")
            .map_err(optional("key_pattern"))?
            .ok_or_else(required("key_pattern", "is NULL"))?,
        scope: row
            .try_get::<Option<String>, _>("scope")
            .map_err(optional("scope"))?
            .ok_or_else(required("scope", "is NULL"))?,
        rate_per_second: row
            .try_get::<Option<f64>, _>("rate_per_second")
            .map_err(optional("rate_per_second"))?
            .ok_or_else(required(
                "rate_per_second",
                "is NULL (SQLite stores a NaN as NULL): a positive number of tokens per second \
                 is needed",
            ))?,
        burst_capacity: row
            .try_get::<Option<i32>, _>("burst_capacity")
            .map_err(optional("burst_capacity"))?
            .ok_or_else(required("burst_capacity", "is NULL: at least 1 is needed"))?,
        plan: row
            .try_get::<Option<String>, _>("plan")
            .map_err(optional("plan"))?,
        is_active: row
            .try_get::<Option<bool>, _>("is_active")
            .map_err(optional("is_active"))?
            .ok_or_else(required("is_active", "is NULL: true or false is needed"))?,
        description: row
            .try_get::<Option<String>, _>("description")
            .map_err(optional("description"))?,
    })
}

/// A column that does not decode, named after the row.
fn renamed(e: sqlx::Error, index: String) -> sqlx::Error {
    match e {
        sqlx::Error::ColumnDecode { source, .. } => sqlx::Error::ColumnDecode { index, source },
        other => other,
    }
}

fn bad(index: String, why: String) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index,
        source: why.into(),
    }
}

/// The error of a value of a row that [`fetch_rules`] could not read, as a bad row (named
/// `RateLimitRule[rule_id=N].column`): refused like a row that does not map, not counted
/// as a failed query.
pub(crate) fn row_error(e: &sqlx::Error) -> Option<ConfigError> {
    match e {
        sqlx::Error::ColumnDecode { index, source }
            if index.starts_with("RateLimitRule") || index.starts_with("RateLimitPlanKey") =>
        {
            Some(ConfigError::new(index.clone(), source.to_string()))
        }
        _ => None,
    }
}

/// Every row of `RateLimitRule`, active and inactive, by `rule_id`.
///
/// A value that cannot be read (a `NULL` in a column the schema declares `NOT NULL`, a
/// number out of range such as a `burst_capacity` beyond `i32`, text in a number column)
/// is a [`sqlx::Error::ColumnDecode`] whose `index` names the row and the column:
/// `RateLimitRule[rule_id=4].burst_capacity`.
pub async fn fetch_rules(pool: &SqlPool) -> Result<Vec<SqlRuleRow>, sqlx::Error> {
    match pool {
        SqlPool::Sqlite(pool) => {
            let rows = sqlx::query(SELECT).fetch_all(pool).await?;
            rows.iter().map(decode).collect()
        }
        #[cfg(feature = "rules-postgres")]
        SqlPool::Postgres(pool) => {
            let rows = sqlx::query(SELECT).fetch_all(pool).await?;
            rows.iter().map(decode).collect()
        }
    }
}
