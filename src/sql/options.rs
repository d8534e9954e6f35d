//! [`SqlSourceOptions`] and [`UserKey`]: how `RateLimitRule` rows become limits, and how
//! often they are read.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::rules::Settings;
use crate::web::key::{Extension, KeyExtractor, KeyPart};

/// Where a `user` rule reads the user of a request.
///
/// ```
/// use tollgate::key::{KeyBuilder, KeyPart};
/// use tollgate::sql::UserKey;
///
/// // The default: the `x-user-id` header (set it in your gateway, never trust a client's).
/// let from_header = UserKey::header("x-user-id");
///
/// // The id an authentication layer put in the request's extensions.
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl KeyPart for UserId {
///     fn write_key(&self, key: &mut KeyBuilder) { key.push_display(self.0) }
/// }
/// let from_extension = UserKey::extension::<UserId>();
/// assert!(format!("{from_extension:?}").contains("UserId"));
/// # let _ = from_header;
/// ```
#[derive(Clone)]
pub struct UserKey(pub(crate) UserKeyRepr);

#[derive(Clone)]
pub(crate) enum UserKeyRepr {
    Header(String),
    Extension {
        key: Arc<dyn KeyExtractor>,
        type_name: &'static str,
    },
}

impl UserKey {
    /// The value of the header `name` (checked when the rows are mapped: an invalid name
    /// is a [`ConfigError`](crate::ConfigError) naming `user_header`).
    pub fn header(name: impl Into<String>) -> Self {
        Self(UserKeyRepr::Header(name.into()))
    }

    /// The request extension of type `T` (see [`key::Extension`](crate::key::Extension)).
    /// Documents name it `custom:user`.
    pub fn extension<T: KeyPart + Send + Sync + 'static>() -> Self {
        Self(UserKeyRepr::Extension {
            key: Arc::new(Extension::<T>::new()),
            type_name: std::any::type_name::<T>(),
        })
    }
}

impl fmt::Debug for UserKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            UserKeyRepr::Header(name) => write!(f, "UserKey::header({name:?})"),
            UserKeyRepr::Extension { type_name, .. } => {
                write!(f, "UserKey::extension::<{type_name}>()")
            }
        }
    }
}

/// How the SQL source maps and polls the `RateLimitRule` table: the poll interval
/// (default 60 s), the user key of `user` rules (default the `x-user-id` header), where a
/// request's plan comes from (default the `x-plan` header; better, from your
/// authentication: [`plan_from_extension`](Self::plan_from_extension), or by API key:
/// [`plan_by_key`](Self::plan_by_key)), and the document's [`Settings`] (trusted proxies
/// for `ip` rules, header style, allow and deny lists).
///
/// ```
/// use std::time::Duration;
/// use tollgate::rules::Settings;
/// use tollgate::sql::{SqlSourceOptions, UserKey};
///
/// let options = SqlSourceOptions::default()
///     .poll_every(Duration::from_secs(30))
///     .user_key(UserKey::header("x-account"))
///     .plan_header("x-tier")
///     .settings(Settings {
///         trusted_proxies: Some(vec!["10.0.0.0/8".into()]),
///         ..Settings::default()
///     });
/// assert_eq!(options.poll(), Duration::from_secs(30));
/// ```
#[derive(Debug, Clone)]
pub struct SqlSourceOptions {
    pub(crate) poll: Duration,
    pub(crate) user_key: UserKey,
    pub(crate) plan: PlanSource,
    pub(crate) settings: Settings,
}

/// Where rules with a `plan` find a request's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlanSource {
    /// The value of this header names the plan.
    Header(String),
    /// The request's [`Plan`](crate::Plan) extension.
    Extension,
    /// The value of this header is an API key, whose plan `RateLimitPlanKey` gives.
    ByKey(String),
}

impl Default for SqlSourceOptions {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(60),
            user_key: UserKey::header("x-user-id"),
            plan: PlanSource::Header("x-plan".into()),
            settings: Settings::default(),
        }
    }
}

impl SqlSourceOptions {
    /// How often the table is read (default 60 s). A zero interval is a
    /// [`ConfigError`](crate::ConfigError) when the source starts.
    pub fn poll_every(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// Where `user` rules read the user (default [`UserKey::header("x-user-id")`](UserKey::header)).
    pub fn user_key(mut self, key: UserKey) -> Self {
        self.user_key = key;
        self
    }

    /// The header naming a request's plan, for rules with a `plan` (default `x-plan`).
    /// Only trust a header your own gateway sets (and strips from clients): prefer
    /// [`plan_from_extension`](Self::plan_from_extension) or
    /// [`plan_by_key`](Self::plan_by_key).
    pub fn plan_header(mut self, name: impl Into<String>) -> Self {
        self.plan = PlanSource::Header(name.into());
        self
    }

    /// Rules with a `plan` read it from the request's [`Plan`](crate::Plan) extension,
    /// inserted by your authentication (`[limits.plans] from = "extension"`).
    pub fn plan_from_extension(mut self) -> Self {
        self.plan = PlanSource::Extension;
        self
    }

    /// Rules with a `plan` read the API key in the header `name` and find its plan in
    /// the `RateLimitPlanKey` table (its active rows, at most
    /// [`MAX_PLAN_KEYS`](crate::rules::MAX_PLAN_KEYS); polled with the rules): a key not
    /// listed, inactive, or of a plan the rules of a `key_pattern` do not name has that
    /// pattern's default plan (its row whose `plan` is `NULL`). The table is created by
    /// [`migrate`](crate::sql::migrate) (`migrations/*/0002_plan_keys.sql`).
    ///
    /// ```
    /// use tollgate::sql::{SqlPlanKeyRow, SqlRuleRow, SqlSourceOptions, rules_document_with_keys};
    ///
    /// let options = SqlSourceOptions::default().plan_by_key("x-api-key");
    /// let mut pro = SqlRuleRow::new(2, "user:{user_id}", "user", 100.0, 500);
    /// pro.plan = Some("pro".into());
    /// let rows = [SqlRuleRow::new(1, "user:{user_id}", "user", 1.0, 10), pro];
    /// let keys = [SqlPlanKeyRow::new("key-abc", "pro")];
    /// let doc = rules_document_with_keys(&rows, &keys, &options)?;
    /// let plans = doc.limits[0].plans.as_ref().unwrap();
    /// assert_eq!(plans.by.as_deref(), Some("header:x-api-key"));
    /// assert_eq!(plans.keys["key-abc"], "pro");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn plan_by_key(mut self, name: impl Into<String>) -> Self {
        self.plan = PlanSource::ByKey(name.into());
        self
    }

    /// The settings of the rules (`trusted_proxies` or `hops` make `ip` rules read the
    /// client's address behind proxies; without them `ip` is the peer's address).
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The poll interval.
    pub fn poll(&self) -> Duration {
        self.poll
    }
}
