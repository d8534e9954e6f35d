//! [`LimitSpec`]: what a limit is, whatever asks it: a name, a quota, how it counts, and
//! what it does when it is full or its store fails. The HTTP [`Limit`](crate::Limit) adds
//! the key, cost and charge rules of a request to one.

mod settle;

use crate::model::lease::Lease;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::base::error::ConfigError;
use crate::model::policy::{FailurePolicy, Mode, OnLimit};
use crate::model::stream::{Direction, OverLimit, Per, Streaming};

/// The longest limit name: it appears in headers and in Redis keys.
const MAX_NAME_LEN: usize = 64;

/// A limit without a request: what a [`Limiter`](crate::Limiter) built on its own
/// ([`Limiter::builder`](crate::Limiter::builder)) reaches by name, with keys and costs
/// given by the caller.
///
/// ```
/// use tollgate::{store::MemoryStore, Algorithm, LimitSpec, Limiter, Quota};
///
/// let limiter = Limiter::builder(MemoryStore::new())
///     .limit(LimitSpec::new("emails", Quota::per_hour(100)).algorithm(Algorithm::fixed_window()))
///     .limit(LimitSpec::new("exports", Quota::per_minute(2)).shadow())
///     .build()?;
/// assert_eq!(limiter.limits(), ["emails", "exports"]);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LimitSpec {
    pub(crate) name: Arc<str>,
    pub(crate) quota: Quota,
    pub(crate) mode: Mode,
    pub(crate) on_failure: FailurePolicy,
    pub(crate) algorithm: Algorithm,
    pub(crate) on_limit: OnLimit,
    /// Outstanding reserved tokens per key (GCRA): the debt a reservation may leave.
    pub(crate) max_reserved: Option<u32>,
    pub(crate) rule_id: Option<u64>,
    /// Lease mode (a remote store only): tokens taken in batches and spent locally.
    pub(crate) lease: Option<Lease>,
    /// Settled costs: the most tokens a settle may leave a key owing (default: the burst).
    pub(crate) max_debt: Option<u64>,
    /// Bans that escalate (`model/ban.rs`).
    pub(crate) ban: Option<crate::model::ban::Ban>,
    /// What a token pays for inside long-lived requests (`model/stream.rs`).
    pub(crate) stream: Streaming,
    /// Stripes of a hot key in the memory store (1: one bucket).
    pub(crate) stripes: u8,
}

impl LimitSpec {
    /// A limit called `name` with `quota`: GCRA, enforcing, falling back to memory when
    /// its store fails, refusing when full.
    pub fn new(name: impl AsRef<str>, quota: Quota) -> Self {
        Self {
            name: name.as_ref().into(),
            quota,
            mode: Mode::Enforce,
            on_failure: FailurePolicy::Share,
            algorithm: Algorithm::Gcra,
            on_limit: OnLimit::Reject,
            max_reserved: None,
            rule_id: None,
            lease: None,
            max_debt: None,
            ban: None,
            stream: Streaming::default(),
            stripes: 1,
        }
    }

    /// At most `n` in flight at once per key ([`Algorithm::InFlight`]): each
    /// [`Limiter::acquire`](crate::Limiter::acquire) takes a unit until its guard is dropped.
    ///
    /// # Panics
    ///
    /// If `n` is 0 or above 1,000,000.
    #[track_caller]
    pub fn in_flight(name: impl AsRef<str>, n: u64) -> Self {
        Self::new(name, Quota::per_second(n)).algorithm(Algorithm::in_flight())
    }

    /// How the limit counts: see [`Limit::algorithm`](crate::Limit::algorithm).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Reports without refusing: see [`Mode::Shadow`].
    pub fn shadow(self) -> Self {
        self.mode(Mode::Shadow)
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// What to do when the store fails. Default: [`FailurePolicy::Share`].
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_failure = policy;
        self
    }

    /// What a request over the limit gets: see [`Limit::on_limit`](crate::Limit::on_limit).
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.on_limit = on_limit;
        self
    }

    /// Caps the tokens a key may have reserved ahead: see
    /// [`Limit::max_reserved`](crate::Limit::max_reserved).
    pub fn max_reserved(mut self, tokens: u32) -> Self {
        self.max_reserved = Some(tokens);
        self
    }

    /// Splits each key of this limit into `n` stripes in the memory store, so that one hot
    /// key (a global limit, a big tenant) scales with cores: see
    /// [`Limit::striped`](crate::Limit::striped). Other stores ignore it. `n` outside
    /// 1 to 64 is a [`ConfigError`](crate::ConfigError) at build time.
    pub fn striped(mut self, n: u8) -> Self {
        self.stripes = n;
        self
    }

    /// Spends the limit from leases: see [`Limit::lease`](crate::Limit::lease).
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Settled costs: caps how far below empty a settle may leave a key's bucket, in
    /// tokens; what a usage would take beyond it is forgiven. By default there is no cap:
    /// the whole usage is charged. See [`Limit::settle`](crate::Limit::settle) and
    /// [`Limiter::admit`](crate::Limiter::admit). GCRA without lease only.
    pub fn max_debt(mut self, tokens: u64) -> Self {
        self.max_debt = Some(tokens);
        self
    }

    /// Bans the keys it keeps refusing: see [`Limit::ban`](crate::Limit::ban).
    pub fn ban(mut self, ban: crate::model::ban::Ban) -> Self {
        self.ban = Some(ban);
        self
    }

    /// The id of the rule this limit comes from: see
    /// [`Limit::rule_id`](crate::Limit::rule_id).
    pub fn rule_id(mut self, id: u64) -> Self {
        self.rule_id = Some(id);
        self
    }

    /// What a token pays for: a request (the default), or a message or byte inside
    /// long-lived requests, charged by a [`Pacer`](crate::pace::Pacer)
    /// ([`Limiter::pacer`](crate::Limiter::pacer)). A limit of messages or bytes in a
    /// layer is not checked when requests arrive: the streams that name it charge it.
    pub fn per(mut self, per: Per) -> Self {
        self.stream.per = per;
        self
    }

    /// Which way a stream limit's units are counted (default [`Direction::In`]).
    pub fn direction(mut self, direction: Direction) -> Self {
        self.stream.direction = Some(direction);
        self
    }

    /// What a stream does over the limit (default: wait, at most 30 s per charge).
    pub fn over_limit(mut self, over: OverLimit) -> Self {
        self.stream.over_limit = Some(over);
        self
    }

    /// A limit of bytes: the first `bytes` of each body pass uncharged (nginx's
    /// `limit_rate_after`).
    pub fn rate_after(mut self, bytes: u64) -> Self {
        self.stream.rate_after = Some(bytes);
        self
    }

    /// A stream limit: each token stands for `units` units (bytes per token: a quota
    /// counts at most one token a microsecond, so 1 MiB/s is 1,024 tokens of 1,024 bytes).
    pub fn unit(mut self, units: u32) -> Self {
        self.stream.unit = Some(units);
        self
    }

    /// What a token pays for ([`per`](Self::per)).
    pub fn counts(&self) -> Per {
        self.stream.per
    }

    /// The limit's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limit's quota.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The longest a reservation of this limit may wait for a request with `quota`:
    /// `max_wait`, capped by [`max_reserved`](Self::max_reserved) tokens.
    #[inline]
    pub(crate) fn reservation_wait(&self, quota: &Quota, max_wait: Duration) -> Duration {
        match self.max_reserved {
            Some(tokens) => {
                let cap = u64::from(tokens).saturating_mul(quota.t_ns());
                max_wait.min(Duration::from_nanos(cap))
            }
            None => max_wait,
        }
    }

    /// Checks everything that can be checked before the first request. Errors name the
    /// field as `limits["<name>"].<field>`.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        validate_name(&self.name)?;
        let at = || format!("limits[{:?}]", &*self.name);
        if self.rule_id.is_some_and(|id| id > i64::MAX as u64) {
            return Err(ConfigError::new(
                "rule_id",
                "must be at most i64::MAX (9223372036854775807), the largest SQL BIGINT",
            )
            .within(at()));
        }
        self.algorithm
            .validate(&self.quota)
            .map_err(|(field, reason)| ConfigError::new(field, reason).within(at()))?;
        if !(1..=MAX_STRIPES).contains(&self.stripes) {
            return Err(ConfigError::new(
                "striped",
                format!("must be 1 to {MAX_STRIPES}, not {}", self.stripes),
            )
            .within(at()));
        }
        if self.algorithm.is_in_flight() && self.lease.is_some() {
            return Err(ConfigError::new(
                "lease",
                "an in-flight limit's units come back when requests end, not with time: they cannot be leased",
            )
            .within(at()));
        }
        if let Some(lease) = &self.lease {
            lease
                .validate(self.algorithm, &self.quota)
                .map_err(|e| e.within(at()))?;
        }
        if let Some(ban) = &self.ban {
            ban.validate().map_err(|e| e.within(at()))?;
        }
        self.validate_reservations().map_err(|e| e.within(at()))?;
        self.stream
            .validate(self.algorithm.is_in_flight())
            .map_err(|e| e.within(at()))?;
        if self.max_debt.is_some() {
            self.settle_refusal()
                .map_err(|reason| ConfigError::new("max_debt", reason).within(at()))?;
        }
        Ok(())
    }

    /// Delay mode and `max_reserved` need an algorithm that can reserve: GCRA, or a fixed
    /// window for delay mode.
    fn validate_reservations(&self) -> Result<(), ConfigError> {
        let sliding = matches!(
            self.algorithm,
            Algorithm::SlidingWindow | Algorithm::SlidingLog
        );
        if let Some(tokens) = self.max_reserved {
            if self.algorithm.is_window() {
                return Err(ConfigError::new(
                    "max_reserved",
                    "only a GCRA limit counts reserved tokens (a fixed window's reservations are bounded by their wait)",
                ));
            }
            if tokens == 0 {
                return Err(ConfigError::new(
                    "max_reserved",
                    "must be at least 1 (0 would refuse every reservation)",
                ));
            }
        }
        if let OnLimit::Delay {
            max_wait,
            max_waiters,
        } = self.on_limit
        {
            if sliding {
                return Err(ConfigError::new(
                    "on_limit",
                    "a sliding window or sliding log cannot reserve, so cannot delay: use GCRA or a fixed window",
                ));
            }
            if self.algorithm.is_calendar() {
                return Err(ConfigError::new(
                    "on_limit",
                    "a calendar limit cannot delay: its refusals wait for the next calendar boundary; use reject mode",
                ));
            }
            if self.mode == Mode::Shadow {
                return Err(ConfigError::new(
                    "on_limit",
                    "a shadow limit never refuses, so never delays",
                ));
            }
            if max_wait.is_zero() {
                return Err(ConfigError::new(
                    "on_limit.max_wait",
                    "must be more than zero (zero is reject mode)",
                ));
            }
            if max_waiters == 0 {
                return Err(ConfigError::new(
                    "on_limit.max_waiters",
                    "must be at least 1 (zero is reject mode)",
                ));
            }
        }
        Ok(())
    }

    /// The fields of the `Debug` output, shared with [`Limit`](crate::Limit)'s.
    pub(crate) fn debug_fields<'a, 'b>(
        &self,
        f: &'a mut fmt::DebugStruct<'a, 'b>,
    ) -> &'a mut fmt::DebugStruct<'a, 'b> {
        let f = f
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("mode", &self.mode)
            .field("on_failure", &self.on_failure)
            .field("algorithm", &self.algorithm)
            .field("on_limit", &self.on_limit)
            .field("max_reserved", &self.max_reserved)
            .field("rule_id", &self.rule_id)
            .field("max_debt", &self.max_debt)
            .field("ban", &self.ban);
        if self.stream.is_stream() {
            f.field("stream", &self.stream)
        } else {
            f
        }
    }
}

impl fmt::Debug for LimitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.debug_fields(&mut f.debug_struct("LimitSpec")).finish()
    }
}

/// A name must be printable ASCII (it is an RFC 9651 string in the headers) of 1 to 64
/// characters, without spaces at either end (a name that is only spaces, or that differs
/// from another by a trailing space, would be unreadable in headers and logs).
/// Stripes a key may be split into, at most ([`LimitSpec::striped`]).
const MAX_STRIPES: u8 = 64;

pub(crate) fn validate_name(name: &str) -> Result<(), ConfigError> {
    let field = || format!("limits[{name:?}].name");
    if name.is_empty() {
        return Err(ConfigError::new(field(), "must not be empty"));
    }
    if name.trim().is_empty() {
        return Err(ConfigError::new(field(), "must not be only whitespace"));
    }
    if name.trim() != name {
        return Err(ConfigError::new(
            field(),
            format!(
                "must not start or end with whitespace (did you mean {:?}?)",
                name.trim()
            ),
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(ConfigError::new(field(), "must be at most 64 characters"));
    }
    if !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(ConfigError::new(
            field(),
            "must be printable ASCII (no control characters, tabs or non-ASCII letters)",
        ));
    }
    Ok(())
}
