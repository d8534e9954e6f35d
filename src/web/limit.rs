//! [`Limit`]: one named policy.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::base::error::ConfigError;
use crate::model::policy::{FailurePolicy, MissingKey, Mode, OnLimit};
use crate::model::spec::LimitSpec;
#[cfg(feature = "rules-sql")]
pub(crate) use crate::model::spec::validate_name;
use crate::web::charge::Charge;
use crate::web::cost::Cost;
use crate::web::key::{Global, KeyExtractor};
use crate::web::settle::Settle;

/// A function choosing the quota per request (see [`Limit::quota_by`]).
pub(crate) type QuotaFn = Arc<dyn Fn(&Parts) -> Option<Quota> + Send + Sync>;

/// A function choosing the rule id of a refused request (a rules document's plans, each
/// from its own `RateLimitRule` row); `None`: the limit's own [`Limit::rule_id`].
pub(crate) type RuleIdFn = Arc<dyn Fn(&Parts) -> Option<u64> + Send + Sync>;

/// One named limit: a quota, a key extractor, a cost, a mode, and policies for missing
/// keys and store failures.
///
/// The name identifies the limit in headers (`RateLimit: "per-ip";r=4`), logs and store
/// keys: limits with the same name in the same store share their buckets (which is how
/// several routes, layers or app instances share one limit).
///
/// ```
/// use tollgate::{key::Header, Cost, Limit, MissingKey, Quota};
///
/// let per_key = Limit::new("per-key", Quota::per_second(20).burst(100))
///     .key(Header::new("x-api-key"))
///     .cost(Cost::header("x-cost").default(1))
///     // 401 with `WWW-Authenticate: ApiKey header="x-api-key"`, and a body that names
///     // the header.
///     .on_missing_key(MissingKey::Unauthorized(r#"ApiKey header="x-api-key""#));
/// # let _ = per_key;
/// ```
#[derive(Clone)]
pub struct Limit {
    /// What the limit is, whatever asks it.
    pub(crate) spec: LimitSpec,
    pub(crate) quota_fn: Option<QuotaFn>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) cost: Cost,
    pub(crate) missing: MissingKey,
    pub(crate) charge: Charge,
    /// The rule id per request (plans from SQL rows), asked only when a request is refused.
    pub(crate) rule_id_by: Option<RuleIdFn>,
    /// Settled costs: where the actual cost is found when the response ends.
    pub(crate) settle: Option<Settle>,
    /// The status of a banned key's requests (403 or 429).
    pub(crate) ban_status: http::StatusCode,
}

impl Limit {
    /// A limit called `name` with `quota`, one global bucket, cost 1, enforcing.
    pub fn new(name: impl AsRef<str>, quota: Quota) -> Self {
        Self {
            spec: LimitSpec::new(name, quota),
            quota_fn: None,
            key: Arc::new(Global),
            cost: Cost::fixed(1),
            missing: MissingKey::SharedBucket,
            charge: Charge::always(),
            rule_id_by: None,
            settle: None,
            ban_status: http::StatusCode::FORBIDDEN,
        }
    }

    /// At most `n` requests of a key in flight at once ([`Algorithm::InFlight`]): a request
    /// takes a unit when it is admitted and gives it back when its response body ends,
    /// fails or is dropped (the client went away), so a streamed response counts for as long
    /// as it streams. Refusals are 429s with `Retry-After: 1` (set another with
    /// `.algorithm(Algorithm::in_flight_retry_after(d))`). The header fields say
    /// `qu="concurrent-requests"` and how many are left, with no window.
    ///
    /// ```
    /// use tollgate::{key::Header, Limit};
    ///
    /// // At most 8 requests per API key in the handler (or streaming) at once.
    /// let inference = Limit::in_flight("inference", 8).key(Header::new("x-api-key"));
    /// # let _ = inference;
    /// ```
    ///
    /// # Panics
    ///
    /// If `n` is 0 or above 1,000,000 (rules files check it with a [`ConfigError`]).
    ///
    /// [`Algorithm::InFlight`]: crate::Algorithm::InFlight
    #[track_caller]
    pub fn in_flight(name: impl AsRef<str>, n: u64) -> Self {
        Self::new(name, Quota::per_second(n)).algorithm(Algorithm::in_flight())
    }

    /// What the layer does with a request over this limit: refuse it with a 429
    /// ([`OnLimit::Reject`], the default), or let it wait for its tokens
    /// ([`OnLimit::Delay`], nginx's `burst` + `delay`): see [`Limit::delay`].
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.spec = self.spec.on_limit(on_limit);
        self
    }

    /// Delay mode: a request over the limit whose tokens are there within `max_wait`
    /// waits for them instead of getting a 429, while fewer than `max_waiters` requests
    /// of this limit wait (in this layer, counted by limit name, and across reloads of
    /// [rules](crate#features)); then it proceeds. Beyond `max_wait`, or with
    /// `max_waiters` already waiting, it gets the usual 429 at once.
    ///
    /// The tokens are reserved when the request arrives, so waiting
    /// requests are admitted in the order they came, one per emission interval; a
    /// request that goes away while it waits (its response future dropped: the client
    /// disconnected, a timeout fired) gives its tokens back. A waiting request holds no
    /// readied inner service and no lock. GCRA and fixed windows only (a sliding window
    /// or log is a [`ConfigError`] at build); needs a Tokio runtime with its timer, as
    /// `axum::serve` has (without a runtime the request is refused as in reject mode).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{key::PeerIp, Limit, Quota};
    ///
    /// // 10 per second with a burst of 5; up to 100 requests wait up to 2 s each.
    /// let smooth = Limit::new("smooth", Quota::per_second(10).burst(5))
    ///     .key(PeerIp::new())
    ///     .delay(Duration::from_secs(2), 100);
    /// # let _ = smooth;
    /// ```
    pub fn delay(self, max_wait: Duration, max_waiters: usize) -> Self {
        self.on_limit(OnLimit::Delay {
            max_wait,
            max_waiters,
        })
    }

    /// Caps the tokens a key may have reserved ahead (what some token buckets call `maxReserved`): a
    /// reservation ([`Limiter::reserve`](crate::Limiter::reserve), or a request in delay
    /// mode) that would leave more than `tokens` reserved beyond an empty bucket is
    /// refused, whatever its `max_wait`. It is the same bound as a wait of `tokens × T`.
    /// GCRA only.
    pub fn max_reserved(mut self, tokens: u32) -> Self {
        self.spec = self.spec.max_reserved(tokens);
        self
    }

    /// What a token pays for: a request (the default), or a message or byte inside
    /// long-lived requests ([`LimitSpec::per`]): a limit of messages or bytes is bound in
    /// the layer (its [`limiter`](crate::RateLimitLayer::limiter) makes
    /// [`Pacer`](crate::pace::Pacer)s of it) but checked by no request. Only a limit of
    /// bytes takes a route: it paces the bodies of the route per key, with nothing in the
    /// handlers: the response bodies for bytes sent
    /// ([`Direction::Out`](crate::pace::Direction::Out)), the request bodies (uploads) for
    /// bytes received ([`Direction::In`](crate::pace::Direction::In), the default), both
    /// for [`Direction::Both`](crate::pace::Direction::Both). A route for a limit of
    /// messages is a [`ConfigError`](crate::ConfigError). The layer paces axum's and
    /// tonic's bodies; over another body type, a request it would pace is refused (`500`).
    ///
    /// ```
    /// use tollgate::pace::{Direction, Per};
    /// use tollgate::{key::PeerIp, store::MemoryStore, Limit, Quota, RateLimitLayer};
    ///
    /// // Downloads under /files at 1 MiB/s per client address, 256 KiB at once (a token
    /// // is a KiB).
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .route(
    ///         "GET /files/{*path}",
    ///         Limit::new("download", Quota::per_second(1024).burst(256))
    ///             .key(PeerIp::new())
    ///             .per(Per::Byte)
    ///             .unit(1024)
    ///             .direction(Direction::Out),
    ///     )
    ///     // Uploads to /upload at 256 KiB/s per client address.
    ///     .route(
    ///         "POST /upload",
    ///         Limit::new("upload", Quota::per_second(256).burst(64))
    ///             .key(PeerIp::new())
    ///             .per(Per::Byte)
    ///             .unit(1024)
    ///             .direction(Direction::In),
    ///     )
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn per(mut self, per: crate::pace::Per) -> Self {
        self.spec = self.spec.per(per);
        self
    }

    /// Which way a stream limit counts ([`LimitSpec::direction`]).
    pub fn direction(mut self, direction: crate::pace::Direction) -> Self {
        self.spec = self.spec.direction(direction);
        self
    }

    /// What a stream over the limit does ([`LimitSpec::over_limit`]).
    pub fn over_limit(mut self, over: crate::pace::OverLimit) -> Self {
        self.spec = self.spec.over_limit(over);
        self
    }

    /// A limit of bytes: the first `bytes` of each body uncharged
    /// ([`LimitSpec::rate_after`]).
    pub fn rate_after(mut self, bytes: u64) -> Self {
        self.spec = self.spec.rate_after(bytes);
        self
    }

    /// A stream limit: the units each token stands for ([`LimitSpec::unit`]).
    pub fn unit(mut self, units: u32) -> Self {
        self.spec = self.spec.unit(units);
        self
    }

    /// Spends the limit from leases when its store is remote (a
    /// [`Resilient`](crate::store::Resilient) store such as `RedisStore`): an instance takes
    /// tokens from the shared bucket in batches and decides most requests without a call.
    /// GCRA and fixed windows. See [`Lease`](crate::Lease) for how leases are sized and
    /// the bound on what they can grant beyond the exact limiter; a lease the limit cannot
    /// take is a [`ConfigError`](crate::ConfigError) at build time.
    pub fn lease(mut self, lease: crate::model::lease::Lease) -> Self {
        self.spec = self.spec.lease(lease);
        self
    }

    /// Splits each key of this limit into `n` stripes in the memory store (1 to 64; 1,
    /// the default, is one bucket per key), so that a hot key (a global limit, a big
    /// tenant, every client behind one NAT) scales with cores instead of every core
    /// writing one bucket. Each stripe is a bucket of `burst / n` tokens refilled at
    /// `rate / n`; a thread checks its own stripe and, when that one refuses, borrows from
    /// the others in turn, so a request is refused only when no stripe holds its cost.
    ///
    /// **The bound.** Over any interval `d`, a striped key grants at most
    /// `n·(⌊burst/n⌋ + d/(n·T)) ≤ burst + d/T` tokens, the same bound as one bucket (`T`
    /// the time per token); so a striped key is never more generous than its limit. It may
    /// be less: its burst is `n·⌊burst/n⌋` (at most `n − 1` tokens fewer), and a request
    /// costing more than `⌊burst/n⌋` can never pass (choose `n ≤ burst / largest cost`);
    /// `n` is lowered to the burst when it is larger. Headers report the stripe that
    /// answered, scaled to the key. GCRA only (window algorithms ignore it); stores other
    /// than the memory store ignore it. See the hot keys chapter ([`guide::hot_keys`](crate::guide::hot_keys)).
    ///
    /// ```
    /// use tollgate::{key::Global, Limit, Quota};
    ///
    /// let everyone = Limit::new("global", Quota::per_second(100_000))
    ///     .key(Global)
    ///     .striped(8);
    /// # let _ = everyone;
    /// ```
    ///
    /// `n` outside 1 to 64 is a [`ConfigError`](crate::ConfigError) when the layer or
    /// limiter is built (field `striped`).
    pub fn striped(mut self, n: u8) -> Self {
        self.spec = self.spec.striped(n);
        self
    }

    /// Bans the keys this limit keeps refusing (see [`Ban`](crate::Ban)): `after`
    /// refusals within `within` ban the key for `for`, longer for each repeat. A banned
    /// key's requests are refused before the store is asked, with the ban's remaining time
    /// as `Retry-After` (403 unless [`ban_status`](Self::ban_status) says 429), and never
    /// count. On a shared store (Redis) the bans are shared by every instance. The
    /// [`Limiter`](crate::Limiter) lists, sets and lifts them
    /// ([`bans`](crate::Limiter::bans), [`ban`](crate::Limiter::ban),
    /// [`lift_ban`](crate::Limiter::lift_ban)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{key::PeerIp, Ban, Limit, Quota};
    ///
    /// let login = Limit::new("login", Quota::per_minute(5))
    ///     .key(PeerIp::new())
    ///     .ban(Ban::after(3).within(Duration::from_secs(60)).for_(Duration::from_secs(600)))
    ///     .ban_status(http::StatusCode::TOO_MANY_REQUESTS);
    /// # let _ = login;
    /// ```
    pub fn ban(mut self, ban: crate::model::ban::Ban) -> Self {
        self.spec = self.spec.ban(ban);
        self
    }

    /// The status of a banned key's requests: 403 Forbidden (the default) or 429 Too Many
    /// Requests; any other is a [`ConfigError`](crate::ConfigError) at build time.
    pub fn ban_status(mut self, status: http::StatusCode) -> Self {
        self.ban_status = status;
        self
    }

    /// How the limit counts: [`Algorithm::Gcra`] (the default, a token bucket), or a
    /// fixed window, a sliding window or a sliding log, for which the quota's rate is the
    /// window's limit and its period the window's length (see [`Algorithm`]).
    ///
    /// ```
    /// use tollgate::{Algorithm, Limit, Quota};
    ///
    /// // 100 per calendar minute.
    /// let per_minute = Limit::new("api", Quota::per_minute(100)).algorithm(Algorithm::fixed_window());
    /// # let _ = per_minute;
    /// ```
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.spec = self.spec.algorithm(algorithm);
        self
    }

    /// The key extractor: what a bucket is (per IP, per API key, ...). Default: [`Global`].
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// Settled costs: the request is admitted on its [`cost`](Self::cost), an estimate,
    /// and when its response ends the actual cost is read from `settle` (a header, a
    /// trailer, the handler's [`ActualCost`](crate::ActualCost), a function) and the
    /// difference taken (all of it, into debt if need be, unless
    /// [`max_debt`](Self::max_debt) caps the debt), or given back. Absent or invalid, or a response body dropped before its end with no value
    /// known from its head: the estimate stands. GCRA without lease only (a
    /// [`ConfigError`] naming `settle` otherwise).
    ///
    /// ```
    /// use tollgate::{key::Header, Cost, Limit, Quota, Settle};
    ///
    /// let tokens = Limit::new("tokens", Quota::per_minute(60_000).burst(60_000))
    ///     .key(Header::new("x-api-key"))
    ///     .cost(Cost::header("x-max-tokens").default(1))
    ///     .settle(Settle::header("x-usage-tokens"))
    ///     .max_debt(20_000);
    /// # let _ = tokens;
    /// ```
    pub fn settle(mut self, settle: Settle) -> Self {
        self.settle = Some(settle);
        self
    }

    /// Caps how far below empty a settle may leave a key's bucket, in tokens (what goes
    /// beyond is forgiven); by default there is no cap, the whole usage is charged: see
    /// [`settle`](Self::settle).
    pub fn max_debt(mut self, tokens: u64) -> Self {
        self.spec = self.spec.max_debt(tokens);
        self
    }

    /// The cost of a request (default 1). A `u32` is a fixed cost.
    pub fn cost(mut self, cost: impl Into<Cost>) -> Self {
        self.cost = cost.into();
        self
    }

    /// Chooses the quota per request, e.g. by plan; `None` means the limit's own quota.
    ///
    /// The bucket of a key keeps its state when its quota changes (an upgrade takes effect
    /// at once; after a downgrade the client may have to wait for the smaller bucket to
    /// have room).
    ///
    /// Read the plan from what your authentication found (a [`Plan`](crate::Plan), or a
    /// type of your own, in the request's extensions), never only from a header the
    /// client sends: a client could name any plan.
    ///
    /// ```
    /// use tollgate::{Limit, Plan, Quota, key::Header};
    ///
    /// // Your authentication middleware, once it knows the key:
    /// // `request.extensions_mut().insert(Plan::from_static("pro"))`.
    /// let per_key = Limit::new("per-key", Quota::per_minute(60))
    ///     .key(Header::new("x-api-key"))
    ///     .quota_by(|parts| match Plan::of(parts)? {
    ///         "pro" => Some(Quota::per_second(10).burst(50)),
    ///         "enterprise" => Some(Quota::per_second(100).burst(500)),
    ///         _ => None, // free, or no plan: the limit's own quota
    ///     });
    /// # let _ = per_key;
    /// ```
    ///
    /// A type of your own works the same way:
    ///
    /// ```
    /// use tollgate::{Limit, Quota, key::Header};
    ///
    /// #[derive(Clone, Copy)]
    /// enum Tier { Free, Pro }
    ///
    /// let per_key = Limit::new("per-key", Quota::per_minute(60))
    ///     .key(Header::new("x-api-key"))
    ///     .quota_by(|parts| match parts.extensions.get::<Tier>()? {
    ///         Tier::Free => None,
    ///         Tier::Pro => Some(Quota::per_second(10).burst(50)),
    ///     });
    /// # let _ = per_key;
    /// ```
    pub fn quota_by<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<Quota> + Send + Sync + 'static,
    {
        self.quota_fn = Some(Arc::new(f));
        self
    }

    /// Reports without refusing: see [`Mode::Shadow`].
    pub fn shadow(mut self) -> Self {
        self.spec = self.spec.shadow();
        self
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.spec = self.spec.mode(mode);
        self
    }

    /// What to do with requests that have no key. Default: [`MissingKey::SharedBucket`].
    pub fn on_missing_key(mut self, policy: MissingKey) -> Self {
        self.missing = policy;
        self
    }

    /// What to do when the store fails. Default: [`FailurePolicy::Share`].
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.spec = self.spec.on_store_failure(policy);
        self
    }

    /// Which responses count (default: all, [`Charge::always`]). With
    /// [`Charge::when`] the cost is still taken before the service runs — so parallel
    /// attempts cannot all pass — and given back when the response does not count, when
    /// the service fails, or when the client goes away before the response.
    ///
    /// ```
    /// use tollgate::{key::PeerIp, Charge, Limit, Quota};
    ///
    /// // 3 failed logins a minute per client: only 401s count.
    /// let failed = Limit::new("login-basic", Quota::per_minute(3))
    ///     .key(PeerIp::new())
    ///     .charge(Charge::when(|status, _| status == 401));
    /// # let _ = failed;
    /// ```
    pub fn charge(mut self, charge: Charge) -> Self {
        self.charge = charge;
        self
    }

    /// The id of the rule this limit comes from (a `RateLimitRule.rule_id`, or any number
    /// the operator chooses), carried into the audit log's violations
    /// ([`Violation::rule_id`](crate::audit::Violation::rule_id)). At most `i64::MAX`, the
    /// largest SQL `BIGINT`.
    ///
    /// ```
    /// use tollgate::{Limit, Quota};
    ///
    /// let search = Limit::new("search", Quota::per_second(1_000).burst(2_000)).rule_id(3);
    /// assert!(format!("{search:?}").contains("rule_id: Some(3)"));
    /// ```
    pub fn rule_id(mut self, id: u64) -> Self {
        self.spec = self.spec.rule_id(id);
        self
    }

    /// The limit's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The limit's own quota (requests may get another one, see [`Limit::quota_by`]).
    pub fn quota(&self) -> Quota {
        self.spec.quota
    }

    /// What the limit is without its request rules: the definition a
    /// [`Limiter`](crate::Limiter) built on its own takes.
    pub fn spec(&self) -> &LimitSpec {
        &self.spec
    }

    /// The quota for one request.
    pub(crate) fn quota_for(&self, parts: &Parts) -> Quota {
        match &self.quota_fn {
            Some(f) => f(parts).unwrap_or(self.spec.quota),
            None => self.spec.quota,
        }
    }

    /// Checks everything that can be checked before the first request. Errors name the
    /// field as `limits["<name>"].<field>`.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.spec.validate()?;
        let at = || format!("limits[{:?}]", &*self.spec.name);
        self.cost.validate().map_err(|e| e.within(at()))?;
        if self.settle.is_some() {
            self.spec
                .settle_refusal()
                .map_err(|reason| ConfigError::new("settle", reason).within(at()))?;
        }
        if !matches!(self.ban_status.as_u16(), 403 | 429) {
            return Err(ConfigError::new(
                "ban_status",
                format!("must be 403 or 429, not {}", self.ban_status.as_u16()),
            )
            .within(at()));
        }
        if self.spec.algorithm.is_in_flight() && self.charge.is_conditional() {
            return Err(ConfigError::new(
                "charge",
                "an in-flight limit holds its units until the response ends, whatever its outcome: it takes no charge rule",
            )
            .within(at()));
        }
        if self.spec.algorithm.is_window() && self.quota_fn.is_some() {
            return Err(ConfigError::new(
                "quota_by",
                "a window limit takes one quota (its window's length is part of its state)",
            )
            .within(at()));
        }
        // With a quota chosen per request the burst is not known here.
        if self.quota_fn.is_none() {
            self.cost
                .validate_for(self.spec.quota.burst_size())
                .map_err(|e| e.within(at()))?;
        }
        if let MissingKey::Reject(status) = self.missing
            && !status.is_client_error()
        {
            return Err(ConfigError::new(
                "on_missing_key",
                format!("a request without a key is the client's error: use a 4xx, not {status}"),
            )
            .within(at()));
        }
        if let MissingKey::Unauthorized(challenge) = self.missing
            && (challenge.trim().is_empty() || http::HeaderValue::from_str(challenge).is_err())
        {
            return Err(ConfigError::new(
                "on_missing_key",
                format!(
                    "the challenge {challenge:?} is not a `WWW-Authenticate` value \
                     (e.g. `Bearer realm=\"api\"`)"
                ),
            )
            .within(at()));
        }
        Ok(())
    }
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.spec
            .debug_fields(&mut f.debug_struct("Limit"))
            .field("per_request_quota", &self.quota_fn.is_some())
            .field("cost", &self.cost)
            .field("missing", &self.missing)
            .field("charge", &self.charge)
            .field("rule_id_by", &self.rule_id_by.is_some())
            .field("settle", &self.settle)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn names_are_validated() {
        let q = Quota::per_second(1);
        assert!(Limit::new("per user", q).validate().is_ok());
        assert!(Limit::new(r#"a"b\c"#, q).validate().is_ok());
        for bad in ["", "café", "tab\there", "new\nline", &"x".repeat(65)] {
            let err = Limit::new(bad, q).validate().unwrap_err();
            assert!(err.field().ends_with(".name"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn blank_or_padded_names_are_config_errors() {
        let q = Quota::per_second(1);
        for (bad, reason) in [
            ("", "must not be empty"),
            (" ", "must not be only whitespace"),
            ("   ", "must not be only whitespace"),
            (" api", "must not start or end with whitespace"),
            ("api ", "must not start or end with whitespace"),
        ] {
            let err = Limit::new(bad, q).validate().unwrap_err();
            assert_eq!(err.field(), format!("limits[{bad:?}].name"), "as written");
            assert!(err.reason().starts_with(reason), "{bad:?}: {err}");
        }
        let err = Limit::new("api ", q).validate().unwrap_err();
        assert!(err.reason().contains(r#""api""#), "{err}");
    }

    #[test]
    fn a_default_cost_above_the_burst_is_a_config_error() {
        let q = Quota::per_second(10);
        for cost in [
            Cost::header("x-cost").default(20),
            Cost::query("weight").default(11),
            Cost::from_fn(|_| Some(1)).default(11),
        ] {
            let err = Limit::new("api", q).cost(cost).validate().unwrap_err();
            assert_eq!(err.field(), r#"limits["api"].cost"#);
            assert!(err.reason().contains("exceeds the burst of 10"), "{err}");
        }
        let err = Limit::new("api", q)
            .cost(Cost::header("x-cost").default(20))
            .validate()
            .unwrap_err();
        assert!(err.reason().contains("default 20"), "{err}");
        assert!(err.reason().contains("`x-cost`"), "{err}");
        // A default up to the burst is fine; so is a request value above it (that request
        // gets a 429 saying it can never pass).
        assert!(
            Limit::new("api", q)
                .cost(Cost::header("x-cost").default(10))
                .validate()
                .is_ok()
        );
        // With a quota per request, the burst that applies is not known at build time.
        assert!(
            Limit::new("api", q)
                .cost(Cost::header("x-cost").default(20))
                .quota_by(|_| Some(Quota::per_second(100)))
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn impossible_costs_and_bad_statuses_are_config_errors() {
        let q = Quota::per_second(10);
        let err = Limit::new("api", q).cost(11).validate().unwrap_err();
        assert_eq!(err.field(), r#"limits["api"].cost"#);
        let err = Limit::new("api", q).cost(0).validate().unwrap_err();
        assert_eq!(err.field(), r#"limits["api"].cost"#);
        let err = Limit::new("api", q)
            .on_missing_key(MissingKey::Reject(StatusCode::OK))
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), r#"limits["api"].on_missing_key"#);
        assert!(
            Limit::new("api", q)
                .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
                .validate()
                .is_ok()
        );
        for bad in ["", " ", "Bearer\nrealm=x"] {
            let err = Limit::new("api", q)
                .on_missing_key(MissingKey::Unauthorized(bad))
                .validate()
                .unwrap_err();
            assert_eq!(err.field(), r#"limits["api"].on_missing_key"#, "{bad:?}");
        }
    }
}
