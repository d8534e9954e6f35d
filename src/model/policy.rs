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
    /// Such requests are refused with this status (a 4xx), e.g. 401 when an API key is
    /// required.
    Reject(StatusCode),
}

/// What a limit does when its store fails (Redis down, slow or unreachable).
///
/// With the in-memory store nothing fails and this has no effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Spend what this instance holds of the limit (its leased tokens), then check the
    /// request against a local in-memory limiter with this instance's *share* of the
    /// quota: the burst and the rate divided by the number of live instances that use the
    /// store (counted in the store, e.g. Redis; a store that cannot count them counts 1,
    /// and a share is never under one token). Together the instances spend about one
    /// quota, not one each, until the store is back (the default).
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
