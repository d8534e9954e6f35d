//! The vocabulary of a limit's policies: whether it enforces ([`Mode`]), what a request
//! without a key gets ([`MissingKey`]), what a store failure does ([`FailurePolicy`]),
//! and what a refusal does ([`OnLimit`]). Plain enums that the stores, the engine, the
//! handle and the middleware all read; they import nothing of the crate.

use std::time::Duration;

use http::StatusCode;

/// Whether a limit enforces or only reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Requests over the limit get a 429.
    #[default]
    Enforce,
    /// The limit is checked and consumes like an enforcing one when the request proceeds,
    /// and a "would deny" is logged and reported in the [`Decision`](crate::Decision), but
    /// it never refuses a request. For trying a new limit on real traffic.
    Shadow,
}

/// What happens to a request for which the limit's key extractor finds no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// All such requests share one bucket of this limit (the default): nothing escapes the
    /// limit by leaving out a header.
    #[default]
    SharedBucket,
    /// The limit does not apply to such requests. Only for keys that are missing on purpose
    /// (e.g. a per-user limit on routes that also serve anonymous users, with another limit
    /// for those).
    Skip,
    /// Such requests are refused with this status (a 4xx): 400 when what is missing is not
    /// a credential (a tenant header), 401 or 403 when it is.
    ///
    /// A 401 must carry a `WWW-Authenticate` challenge (RFC 9110 §15.5.2) saying how to
    /// authenticate: `Reject(StatusCode::UNAUTHORIZED)` sends `WWW-Authenticate: ApiKey`,
    /// which tells a client only that a credential is wanted. Give your API's
    /// own with [`MissingKey::Unauthorized`]; or, where you would rather not name a scheme
    /// (the credential is checked by a layer before this one, which answers its own 401s),
    /// use 403.
    Reject(StatusCode),
    /// Such requests are refused with `401 Unauthorized` and this `WWW-Authenticate`
    /// challenge, e.g. `Bearer realm="api"` or `ApiKey header="x-api-key"`: how a client
    /// gets in. It must be a valid header value (checked when the layer is built).
    ///
    /// ```
    /// use tollgate::{key::Header, Limit, MissingKey, Quota};
    ///
    /// let per_key = Limit::new("per-key", Quota::per_second(5))
    ///     .key(Header::new("x-api-key"))
    ///     .on_missing_key(MissingKey::Unauthorized(r#"ApiKey header="x-api-key""#));
    /// # let _ = per_key;
    /// ```
    Unauthorized(&'static str),
}

/// The `WWW-Authenticate` challenge of a 401 configured without one
/// (`MissingKey::Reject(StatusCode::UNAUTHORIZED)`): a scheme and nothing else, since the
/// layer knows no more of how your clients authenticate.
pub(crate) const DEFAULT_CHALLENGE: &str = "ApiKey";

impl MissingKey {
    /// The status of a refusal under this policy, if it refuses.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            MissingKey::Reject(status) => Some(*status),
            MissingKey::Unauthorized(_) => Some(StatusCode::UNAUTHORIZED),
            MissingKey::SharedBucket | MissingKey::Skip => None,
        }
    }

    /// The `WWW-Authenticate` challenge of a refusal under this policy: the one given, or
    /// `ApiKey` for a plain 401; `None` for other statuses.
    pub fn challenge(&self) -> Option<&'static str> {
        match self {
            MissingKey::Unauthorized(challenge) => Some(challenge),
            MissingKey::Reject(StatusCode::UNAUTHORIZED) => Some(DEFAULT_CHALLENGE),
            _ => None,
        }
    }
}

/// What a limit does when its store fails (Redis down, slow or unreachable).
///
/// With the in-memory store nothing fails and this has no effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Spend what this instance holds of the limit (its leased tokens), then check the
    /// request against a local in-memory limiter with this instance's *share* of the
    /// quota, which follows the traffic it served (the default):
    ///
    /// - **A key it served** while the store answered gets the fraction `f` of the limit
    ///   that it spent itself: every answer says how far the shared bucket moved (a GCRA
    ///   bucket's TAT, a window's count), which is never less than what all the instances
    ///   spent together, so the fractions of the instances add up to at most 1. A key on
    ///   one instance (session affinity) gets its traffic whole (the whole limit at or
    ///   above it), a key spread over `N` instances about `1/N` each. An instance the
    ///   store counts as the only one (`Backend::counts_instances`) keeps the whole
    ///   limit for the keys it served: nobody else spent what it left.
    /// - **A key it knows no traffic of** gets `1/N`, `N` the live instances counted in
    ///   the store (a store that cannot count them counts 1); an instance that has not
    ///   counted them yet (it never reached the store: started during the outage) counts
    ///   4, never 1.
    ///
    /// A share of `f` is a rate of `f·rate` and holds `f·burst` tokens when the outage
    /// starts (its bucket holds `f·burst` rounded up, at least 2, and starts spent by the
    /// rest, which is room for traffic that comes a little before its token), so the shares
    /// of a burst of `B` never add up to more than `B`; a window's share is `f·limit` per
    /// window rounded down, and its shares never add up to more than its limit (a window
    /// share under one unit refuses). A key seen spent starts its share as spent (a fixed window: until it
    /// ends). A sliding window's or log's share is `1/N` of its limit whatever the
    /// traffic (their answers do not say how far the key moved: a log's units leave in
    /// lumps), so a key that stays on one of 4 instances keeps a quarter of such a limit
    /// through an outage; GCRA and fixed windows follow the traffic. The share is frozen
    /// when the store stops answering.
    ///
    /// The bound: over an outage of length `o`, the instances grant a key at most
    /// `F·(burst + rate·o)` beyond their leases, where `F` is the sum of their fractions:
    /// at most 1 for the instances that served the key before (or, for a key none served,
    /// the `N` instances counted, `1/N` each); each instance the key is new to adds `1/N`
    /// (`1/4` if it never reached the store). When the store answers again, what each
    /// share granted and has not refilled is charged to the shared bucket (at most the
    /// share's burst), so over a run the grants stay within the exact limiter plus one
    /// limit over the outage, `burst + rate·o` (or `F` of it when the shares' sum
    /// `F = F_s + U/N + K/4` is more than one: `F_s`, at most 1, the fractions of the
    /// instances that served the key and still do, `U` counted instances and `K`
    /// unreached ones the key is new to). See the guide's chapter on Redis.
    #[default]
    Share,
    /// Check the request against a local in-memory limiter with the whole quota: each
    /// instance keeps limiting on its own, with the full burst and rate, until the store
    /// is back (`N` instances grant up to `N` times the limit meanwhile).
    Fallback,
    /// Let the request pass unchecked (fail open).
    Allow,
    /// Refuse the request with 503 and a Retry-After (fail closed).
    Deny,
}

/// What the layer does with a request a limit refuses (see [`Limit::on_limit`](crate::Limit::on_limit)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLimit {
    /// A 429 with `Retry-After` (the default).
    #[default]
    Reject,
    /// The request waits for its tokens if they are there within `max_wait` and fewer
    /// than `max_waiters` requests of this limit wait; otherwise a 429 (see
    /// [`Limit::delay`](crate::Limit::delay)).
    Delay {
        /// The longest a request waits.
        max_wait: Duration,
        /// How many requests of this limit (by name) may wait at once, in one layer and
        /// its reloaded versions.
        max_waiters: usize,
    },
}
