//! The SQL source of rules: [`RulesBuilder::build_sql`] loads the `RateLimitRule` table
//! and [`SqlPoller`] reads it again every poll interval, reloading the rules when it
//! changed.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::file::DbFile;
use super::mapping::{custom_keys, rules_document_with_keys};
use super::options::{PlanSource, SqlSourceOptions};
use super::rules::row_error;
use super::{SqlPlanKeyRow, SqlPool, SqlRuleRow, fetch_plan_keys, fetch_rules};
use crate::base::error::ConfigError;
use crate::rules::{Document, Rules, RulesBuilder, Trigger, WeakRules};
use crate::store::Store;

/// A query that takes longer counts as a failed poll.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// A failed query that repeats the previous one's error is announced (`ERROR`, the
/// `on_reload` callback) at most this often; each one is counted.
const REPEAT_EVERY: Duration = Duration::from_secs(600);

/// Why [`RulesBuilder::build_sql`] could not load the first rules.
#[derive(Debug)]
#[non_exhaustive]
pub enum SqlRulesError {
    /// The `RateLimitRule` table could not be read.
    Query(sqlx::Error),
    /// The rows do not make valid rules, or hold a value that cannot be read (a `NULL`, a
    /// number out of range: the error names the row and the column), or the options are
    /// invalid.
    Rules(ConfigError),
}

impl fmt::Display for SqlRulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SqlRulesError::Query(e) => write!(f, "cannot read RateLimitRule: {e}"),
            SqlRulesError::Rules(e) => write!(f, "{e}"),
        }
    }
}

impl Error for SqlRulesError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            SqlRulesError::Query(e) => Some(e),
            SqlRulesError::Rules(e) => Some(e),
        }
    }
}

impl From<sqlx::Error> for SqlRulesError {
    fn from(e: sqlx::Error) -> Self {
        SqlRulesError::Query(e)
    }
}

impl From<ConfigError> for SqlRulesError {
    fn from(e: ConfigError) -> Self {
        SqlRulesError::Rules(e)
    }
}

/// The task that polls `RateLimitRule` for [`Rules`] (from [`RulesBuilder::build_sql`]).
///
/// It ends when the rules are dropped (the [`Rules`] and every layer and service made
/// from them: it holds none of them), or with [`stop`](Self::stop). Dropping this handle
/// does not stop it.
#[derive(Debug)]
pub struct SqlPoller {
    task: AbortHandle,
    wake: Arc<Notify>,
}

impl SqlPoller {
    /// Reads the table now instead of at the end of the interval (the interval then
    /// starts again): e.g. from an admin endpoint, after an edit of the table.
    pub fn poll_now(&self) {
        self.wake.notify_one();
    }

    /// Stops polling; the rules keep the last ones loaded.
    pub fn stop(&self) {
        self.task.abort();
    }

    /// Whether the task still polls (not stopped, rules not dropped).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

impl<St: Store, R: Clone + Send + Sync + 'static> RulesBuilder<St, R> {
    /// Builds the rules from the `RateLimitRule` table (see
    /// [`rules_document`](super::rules_document) for how rows become limits; with
    /// [`plan_by_key`](SqlSourceOptions::plan_by_key), the `RateLimitPlanKey` table too) and
    /// starts a task on the current Tokio runtime that reads the tables every
    /// [`poll`](SqlSourceOptions::poll_every) interval.
    ///
    /// An error at start (the table cannot be read, a row is invalid) is returned. Later,
    /// the rules are reloaded only when the rows map to different rules (edits of
    /// descriptions, or of inactive rows, reload nothing); a limit whose `key_pattern` is
    /// unchanged keeps its buckets. A failed query or an invalid set of rows keeps the
    /// running rules, is counted in [`Rules::status`](crate::rules::Rules::status) and
    /// logged as an `ERROR` (target `tollgate::rules`; a query error that repeats at each
    /// poll is logged again at most every 10 minutes, a set of rows once). A query taking
    /// more than 30 s counts as failed. Any `file`, `text` or `document` given to the
    /// builder is replaced by the table.
    ///
    /// A SQLite pool opened on a file path is followed: at each poll the file at the path
    /// is compared with the one the pool opened (device and inode), since a pooled
    /// connection keeps reading a deleted or replaced file. A file deleted, moved away or
    /// unreadable (its mode lets no one read it, e.g. `chmod 000`) is a failed poll whose
    /// error names the path (the running rules stay); another file at the path (a new
    /// database, a restored backup) is opened with a new pool of the same options and read
    /// at once; a file that is not a database is then a failed query. The pool given is
    /// not closed (it may serve an audit sink too). PostgreSQL pools, in-memory databases
    /// and `file:` URIs are not followed.
    ///
    /// No active row (an empty table, every rule switched off) means no limits: requests
    /// pass (the settings' allow and deny lists still apply), with one `WARN` each time
    /// the table comes to that state (at start too). A failed or timed-out query is what
    /// keeps the last good rules.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    /// use tollgate::{rules::Rules, sql::{self, SqlPool, SqlSourceOptions}, store::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("tollgate.db");
    /// let options = SqliteConnectOptions::new().filename(&path).create_if_missing(true);
    /// let pool = SqlPool::from(SqlitePoolOptions::new().connect_with(options).await?);
    /// sql::migrate(&pool).await?;
    /// let SqlPool::Sqlite(db) = &pool else { unreachable!() };
    /// sqlx::query(
    ///     "INSERT INTO RateLimitRule (key_pattern, scope, rate_per_second, burst_capacity) \
    ///      VALUES ('ip', 'ip', 5, 10)",
    /// )
    /// .execute(db)
    /// .await?;
    ///
    /// let (rules, poller) = Rules::builder(MemoryStore::new())
    ///     .on_reload(|outcome| match outcome {
    ///         Ok(doc) => println!("rules:\n{doc}"),
    ///         Err(e) => eprintln!("rules refused: {e}"),
    ///     })
    ///     .build_sql(pool, SqlSourceOptions::default().poll_every(Duration::from_secs(60)))
    ///     .await?;
    /// assert_eq!(rules.document().limits[0].quota.as_deref(), Some("5/s; burst=10"));
    /// let layer = rules.layer(); // `Router::route_layer(layer)`
    /// assert!(poller.is_running());
    /// drop((rules, layer)); // the poller ends with the rules (and their layers)
    /// # while poller.is_running() { tokio::task::yield_now().await; }
    /// # Ok(()) }
    /// ```
    pub async fn build_sql(
        self,
        pool: impl Into<SqlPool>,
        options: SqlSourceOptions,
    ) -> Result<(Rules<St, R>, SqlPoller), SqlRulesError> {
        if options.poll.is_zero() {
            return Err(ConfigError::new("poll", "must be longer than zero").into());
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ConfigError::new(
                "poll",
                "polling the rules needs a Tokio runtime: call `build_sql` inside one",
            )
        })?;
        let pool = pool.into();
        let (rows, keys) = tokio::time::timeout(QUERY_TIMEOUT, fetch(&pool, &options))
            .await
            .map_err(|_| ConfigError::new("RateLimitRule", "the query timed out (30 s)"))?
            .map_err(|e| match row_error(&e) {
                Some(bad) => SqlRulesError::Rules(bad),
                None => SqlRulesError::Query(e),
            })?;
        // The file the pool has just read, if it reads one.
        let file = DbFile::of(&pool);
        // Mapping and compiling grow with the table: on a blocking thread.
        let (document, rules, options) = blocking(move || {
            let document = rules_document_with_keys(&rows, &keys, &options)?;
            let mut builder = self.document(document.clone());
            // The key parts the check registered (`custom:user`), for every version.
            for (name, key) in custom_keys(&options) {
                builder = builder.custom_key(&name, key);
            }
            let rules = builder.build()?;
            Ok::<_, SqlRulesError>((document, rules, options))
        })
        .await
        .map_err(|e| {
            ConfigError::new("RateLimitRule", format!("mapping the rows failed: {e}"))
        })??;
        if document.limits.is_empty() {
            warn_no_limits();
        }
        let wake = Arc::new(Notify::new());
        let poll = Poll {
            rules: rules.downgrade(),
            pool,
            file,
            options,
            wake: wake.clone(),
            last: Some(Attempt {
                outcome: Ok(document),
                accepted: true,
            }),
            query_failed: None,
        };
        let task = runtime.spawn(poll.run()).abort_handle();
        rules.own_task(task.clone());
        Ok((rules, SqlPoller { task, wake }))
    }
}

/// The rules a poll produced and whether they were installed.
struct Attempt {
    outcome: Result<Document, ConfigError>,
    accepted: bool,
}

/// The polling task's state.
struct Poll<St: Store, R> {
    rules: WeakRules<St, R>,
    pool: SqlPool,
    /// The database file of a SQLite pool opened on a path, followed at each poll.
    file: Option<DbFile>,
    options: SqlSourceOptions,
    wake: Arc<Notify>,
    /// The last rows that were acted on (installed or refused): the same again reload
    /// nothing.
    last: Option<Attempt>,
    /// The error of the failing queries since the last good one, and when it was last
    /// announced.
    query_failed: Option<(String, Instant)>,
}

impl<St: Store, R: Clone + Send + Sync + 'static> Poll<St, R> {
    async fn run(mut self) {
        loop {
            // Woken early by `poll_now`; the interval restarts after each poll.
            let _ = tokio::time::timeout(self.options.poll, self.wake.notified()).await;
            if self.rules.upgrade().is_none() {
                return;
            }
            // A deleted, unreadable or replaced database file: reported, or reopened.
            if let Some(file) = &mut self.file
                && let Err(reason) = file.follow(&mut self.pool, QUERY_TIMEOUT).await
            {
                let Some(rules) = self.rules.upgrade() else {
                    return;
                };
                self.failed(&rules, reason);
                continue;
            }
            let fetched =
                tokio::time::timeout(QUERY_TIMEOUT, fetch(&self.pool, &self.options)).await;
            let Some(rules) = self.rules.upgrade() else {
                return;
            };
            match fetched {
                Ok(Ok((rows, keys))) => {
                    // Mapping the rows and compiling the rules is CPU work that grows with
                    // the table: on a blocking thread, never on the runtime's workers.
                    let recovering = self.query_failed.take().is_some();
                    let (options, last) = (self.options.clone(), self.last.take());
                    let on = rules.clone();
                    let settled = blocking(move || {
                        let document = rules_document_with_keys(&rows, &keys, &options);
                        settle(&on, last, recovering, document)
                    })
                    .await;
                    match settled {
                        Ok(last) => self.last = last,
                        // It panicked (a bug): nothing was installed; try again next poll.
                        Err(e) => self.failed(&rules, format!("mapping the rows failed: {e}")),
                    }
                }
                Ok(Err(e)) => match row_error(&e) {
                    // A value that cannot be read: a bad row, refused as such.
                    Some(bad) => {
                        let recovering = self.query_failed.take().is_some();
                        self.last = settle(&rules, self.last.take(), recovering, Err(bad));
                    }
                    None => {
                        let from = self.file.as_ref().map(DbFile::describe).unwrap_or_default();
                        self.failed(&rules, format!("cannot read the rules{from}: {e}"));
                    }
                },
                Err(_) => self.failed(&rules, "the query timed out (30 s)".to_owned()),
            }
        }
    }

    /// A poll that could not read the table: counted every time, announced when the
    /// error changes and every 10 minutes while it repeats.
    fn failed(&mut self, rules: &Rules<St, R>, reason: String) {
        let now = Instant::now();
        let announce = match &self.query_failed {
            Some((previous, at)) => *previous != reason || now.duration_since(*at) >= REPEAT_EVERY,
            None => true,
        };
        if announce {
            self.query_failed = Some((reason.clone(), now));
        }
        rules.refuse(
            Trigger::Sql,
            ConfigError::new("RateLimitRule", reason),
            announce,
        );
    }
}

/// A poll that read the table, after `last`; `recovering`: the queries before it failed.
/// Installs or refuses the rules they map to, unless they are the last ones again.
/// Answers what is now the last attempt.
fn settle<St: Store, R: Clone + Send + Sync + 'static>(
    rules: &Rules<St, R>,
    last: Option<Attempt>,
    recovering: bool,
    outcome: Result<Document, ConfigError>,
) -> Option<Attempt> {
    if let Some(last) = &last
        && last.outcome == outcome
    {
        if recovering && last.accepted {
            rules.recovered(Trigger::Sql);
        }
        return Some(Attempt {
            outcome,
            accepted: last.accepted,
        });
    }
    let accepted = match &outcome {
        Ok(document) => {
            let installed = rules.install(Trigger::Sql, document.clone()).is_ok();
            // Rows that map to other rules than the last: a new state of the table.
            if installed && document.limits.is_empty() {
                warn_no_limits();
            }
            installed
        }
        Err(e) => {
            rules.refuse(Trigger::Sql, e.clone(), true);
            false
        }
    };
    Some(Attempt { outcome, accepted })
}

/// The rule rows and, where plans are read by key, the key rows (one query each; the
/// keys' bounded).
async fn fetch(
    pool: &SqlPool,
    options: &SqlSourceOptions,
) -> Result<(Vec<SqlRuleRow>, Vec<SqlPlanKeyRow>), sqlx::Error> {
    let rows = fetch_rules(pool).await?;
    let keys = match options.plan {
        PlanSource::ByKey(_) => fetch_plan_keys(pool).await?,
        PlanSource::Header(_) | PlanSource::Extension => Vec::new(),
    };
    Ok((rows, keys))
}

/// Runs `work` on the runtime's blocking threads, with the caller's `tracing` dispatcher
/// (the reload's log lines go where the caller's would).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    tokio::task::spawn_blocking(move || tracing::dispatcher::with_default(&dispatch, work)).await
}

/// The table has no active row: the rules limit nothing from now on.
fn warn_no_limits() {
    tracing::warn!(
        target: "tollgate::rules",
        "RateLimitRule has no active row: no limits from the table, every request passes"
    );
}
