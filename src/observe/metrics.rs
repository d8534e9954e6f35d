//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`):
//! install any recorder (Prometheus, OpenTelemetry bridge, StatsD, ...) and tollgate's
//! layers report to it.
//!
//! # Schema
//!
//! Every label value comes from configuration (limit names, the store's name, a fixed
//! set of results and error kinds): never a key, a path or an address, so the number of
//! series is bounded by the configuration, whatever the traffic.
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `tollgate_requests_total` | counter | `limit`, `result` | one per limit of each request the middleware checked; `result` is `allowed`, `denied` (an enforcing limit refused), `shadow_denied` (a shadow limit would have refused), `fallback_allowed` / `fallback_denied` (the store failed and the local fallback limiter answered), `failed_open` / `failed_closed` (the store failed and the limit's policy let the request pass / refused it) |
//! | `tollgate_near_limit_total` | counter | `limit` | allowed requests that left fewer than the near-limit fraction (default 20 %) of the burst ([`RateLimitBuilder::near_limit_fraction`](crate::RateLimitBuilder::near_limit_fraction)) |
//! | `tollgate_store_duration_seconds` | histogram | `store` | time of each call to a remote store ([`Resilient`](crate::store::Resilient), e.g. `RedisStore`), timeouts included |
//! | `tollgate_store_errors_total` | counter | `store`, `kind` | failed calls: `kind` is `timeout`, `backend` (the store answered an error) or `protocol` (a wrong answer) |
//! | `tollgate_breaker_open` | gauge | `store` | 1 while the circuit breaker skips the store, else 0 |
//! | `tollgate_deny_cache_hits_total` | counter | `limit` | requests refused from the remote store's local deny cache, without a call |
//! | `tollgate_writeback_dropped_total` | counter | `store` | keys a remote store could not keep for its write-back after a state loss (the list holds one entry per key, up to 10,000): such a key starts full if the store loses its state; and charge-backs of an outage's share grants that could not be noted (over 10,000 keys) or were never answered (given up after a minute) |
//! | `tollgate_keys` | gauge | `limit` | keys the memory store tracks for the limit (updated on insertion and by the sweeper, never per request) |
//! | `tollgate_delayed_total` | counter | `limit` | requests of a limit in delay mode ([`Limit::delay`](crate::Limit::delay)) that waited for their tokens instead of being refused (also counted `allowed` above) |
//! | `tollgate_delay_seconds` | histogram | `limit` | the wait of each such request (the time it was to spend in the queue) |
//! | `tollgate_bans_total` | counter | `limit` | bans that began, by a limit's [`Ban`](crate::Ban) or by hand (one per ban, in the instance that began it) |
//! | `tollgate_banned_total` | counter | `limit` | requests refused because their key was banned, before any store call (not in `tollgate_requests_total`) |
//! | `tollgate_settles_total` | counter | `limit`, `result` | costs settled after their estimate ([`Limit::settle`](crate::Limit::settle), [`Limiter::admit`](crate::Limiter::admit)): `result` is `taken` (the actual cost was more) or `given_back` (less); an exact estimate settles nothing |
//! | `tollgate_settled_tokens_total` | counter | `limit`, `result` | the tokens those settles took or gave back (taken tokens count in full, even past the limit's `max_debt`, where the bucket forgives them) |
//! | `tollgate_stream_units_total` | counter | `limit`, `per`, `result` | the units of streams charged to a limit through a [`Pacer`](crate::pace::Pacer) (paced bodies and events, WebSockets, gRPC streams): `per` is `message`, `byte` or `request` (what the limit counts), `result` is `passed` (charged, after a wait or not) or `refused` (over the limit: the stream ended); registered once per stream |
//! | `tollgate_audit_accepted_total`, `tollgate_audit_written_total`, `tollgate_audit_failed_total`, `tollgate_audit_dropped_total` | counter | | violations an [`AuditLog`](crate::audit::AuditLog) queued, its sink wrote, lost with a failed batch, and dropped because the queue was full, the counters of [`AuditStats`](crate::audit::AuditStats) (summed over the process's audit logs): the queue holds `accepted − written − failed` |
//! | `tollgate_reloads_total` | counter | `result` | reloads of [`Rules`](crate::rules::Rules): `ok` (the rules were replaced) or `error` (refused: invalid or unreadable), as [`ReloadStatus`](crate::rules::ReloadStatus) counts them |
//! | `tollgate_rules_healthy` | gauge | | 1 while the running rules are the newest (the latest reload, or the first load, succeeded), 0 after a refused reload |
//!
//! `store` is the backend's name in lower case (`redis`). Requests refused before any
//! limit is checked (allow and deny lists, missing keys, misconfiguration) and checks made
//! through the [`Limiter`](crate::Limiter) handle are not counted.
//!
//! # Cost
//!
//! The handles are registered once, when a layer (or a store table) is built, and kept:
//! a request adds one to one counter per limit (an atomic add in the Prometheus
//! recorder), with no lookup by name. **Install the recorder before building layers and
//! stores**: handles registered while no recorder is installed stay no-ops.
//!
//! ```
//! use tollgate::{store::MemoryStore, Limit, Quota, RateLimitLayer};
//!
//! // e.g. metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
//! let layer = RateLimitLayer::builder(MemoryStore::new())
//!     .limit(Limit::new("global", Quota::per_second(100)))
//!     .near_limit_fraction(0.1)
//!     .build()?;
//! # let _ = layer;
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use ::metrics::{Counter, Gauge, Histogram, Unit};

use crate::model::decision::{LimitDecision, Status};
use crate::model::policy::Mode;

/// `tollgate_requests_total{limit, result}`.
pub const REQUESTS_TOTAL: &str = "tollgate_requests_total";
/// `tollgate_near_limit_total{limit}`.
pub const NEAR_LIMIT_TOTAL: &str = "tollgate_near_limit_total";
/// `tollgate_store_duration_seconds{store}`.
pub const STORE_DURATION_SECONDS: &str = "tollgate_store_duration_seconds";
/// `tollgate_store_errors_total{store, kind}`.
pub const STORE_ERRORS_TOTAL: &str = "tollgate_store_errors_total";
/// `tollgate_breaker_open{store}`.
pub const BREAKER_OPEN: &str = "tollgate_breaker_open";
/// `tollgate_deny_cache_hits_total{limit}`.
pub const DENY_CACHE_HITS_TOTAL: &str = "tollgate_deny_cache_hits_total";
/// `tollgate_keys{limit}`.
pub const KEYS: &str = "tollgate_keys";
/// `tollgate_writeback_dropped_total{store}`.
pub const WRITEBACK_DROPPED_TOTAL: &str = "tollgate_writeback_dropped_total";
/// `tollgate_delayed_total{limit}`.
pub const DELAYED_TOTAL: &str = "tollgate_delayed_total";
/// `tollgate_delay_seconds{limit}`.
pub const DELAY_SECONDS: &str = "tollgate_delay_seconds";

/// `tollgate_settles_total{limit, result}`.
pub const SETTLES_TOTAL: &str = "tollgate_settles_total";
/// `tollgate_settled_tokens_total{limit, result}`.
pub const SETTLED_TOKENS_TOTAL: &str = "tollgate_settled_tokens_total";
/// `tollgate_stream_units_total{limit, per, result}`.
pub const STREAM_UNITS_TOTAL: &str = "tollgate_stream_units_total";
/// `tollgate_bans_total{limit}`.
pub const BANS_TOTAL: &str = "tollgate_bans_total";
/// `tollgate_banned_total{limit}`.
pub const BANNED_TOTAL: &str = "tollgate_banned_total";

/// `tollgate_audit_accepted_total`.
pub const AUDIT_ACCEPTED_TOTAL: &str = "tollgate_audit_accepted_total";
/// `tollgate_audit_written_total`.
pub const AUDIT_WRITTEN_TOTAL: &str = "tollgate_audit_written_total";
/// `tollgate_audit_failed_total`.
pub const AUDIT_FAILED_TOTAL: &str = "tollgate_audit_failed_total";
/// `tollgate_audit_dropped_total`.
pub const AUDIT_DROPPED_TOTAL: &str = "tollgate_audit_dropped_total";
/// `tollgate_reloads_total{result}`.
pub const RELOADS_TOTAL: &str = "tollgate_reloads_total";
/// `tollgate_rules_healthy`.
pub const RULES_HEALTHY: &str = "tollgate_rules_healthy";

/// `tollgate_region_tokens_held{region}`.
pub const REGION_TOKENS_HELD: &str = "tollgate_region_tokens_held";
/// `tollgate_region_tokens_spent{region}`.
pub const REGION_TOKENS_SPENT: &str = "tollgate_region_tokens_spent";
/// `tollgate_region_tokens_moved_total{region}`.
pub const REGION_TOKENS_MOVED_TOTAL: &str = "tollgate_region_tokens_moved_total";
/// `tollgate_region_mover_lag_seconds{region}`.
pub const REGION_MOVER_LAG_SECONDS: &str = "tollgate_region_mover_lag_seconds";
/// `tollgate_region_unreachable{region}`.
pub const REGION_UNREACHABLE: &str = "tollgate_region_unreachable";

/// The values of `result` in `tollgate_requests_total`.
pub const RESULTS: [&str; 7] = [
    "allowed",
    "denied",
    "shadow_denied",
    "fallback_allowed",
    "fallback_denied",
    "failed_open",
    "failed_closed",
];

fn describe() {
    use std::sync::Once;
    // Once per recorder would be exact; once per process is what a recorder installed
    // at start-up needs.
    static DESCRIBED: Once = Once::new();
    DESCRIBED.call_once(|| {
        ::metrics::describe_counter!(
            REQUESTS_TOTAL,
            "Limits checked per request, by limit and result"
        );
        ::metrics::describe_counter!(
            NEAR_LIMIT_TOTAL,
            "Allowed requests that left less than the near-limit fraction of the burst"
        );
        ::metrics::describe_histogram!(
            STORE_DURATION_SECONDS,
            Unit::Seconds,
            "Duration of calls to a remote rate-limit store"
        );
        ::metrics::describe_counter!(STORE_ERRORS_TOTAL, "Failed calls to a remote store");
        ::metrics::describe_gauge!(BREAKER_OPEN, "1 while the store's circuit breaker is open");
        ::metrics::describe_counter!(
            DENY_CACHE_HITS_TOTAL,
            "Requests refused from the local deny cache"
        );
        ::metrics::describe_gauge!(KEYS, "Keys tracked by the memory store, per limit");
        ::metrics::describe_counter!(
            WRITEBACK_DROPPED_TOTAL,
            "Keys a remote store could not keep for a write-back after a state loss"
        );
        ::metrics::describe_counter!(
            DELAYED_TOTAL,
            "Requests that waited for their tokens (delay mode)"
        );
        ::metrics::describe_histogram!(
            DELAY_SECONDS,
            Unit::Seconds,
            "How long each delayed request was to wait for its tokens"
        );
        ::metrics::describe_counter!(
            SETTLES_TOTAL,
            "Costs settled after their estimate, taken or given back"
        );
        ::metrics::describe_counter!(SETTLED_TOKENS_TOTAL, "Tokens settles took or gave back");
        ::metrics::describe_counter!(
            STREAM_UNITS_TOTAL,
            "Messages or bytes of streams charged to a limit, passed or refused"
        );
        ::metrics::describe_counter!(BANS_TOTAL, "Bans that began, per limit");
        ::metrics::describe_counter!(
            BANNED_TOTAL,
            "Requests refused because their key was banned"
        );
    });
}

/// One limit's counters, registered when the layer is built.
pub(crate) struct LimitMetrics {
    results: [Counter; 7],
    near_limit: Counter,
}

impl LimitMetrics {
    pub(crate) fn new(limit: &'static str) -> Self {
        describe();
        Self {
            results: RESULTS.map(
                |result| ::metrics::counter!(REQUESTS_TOTAL, "limit" => limit, "result" => result),
            ),
            near_limit: ::metrics::counter!(NEAR_LIMIT_TOTAL, "limit" => limit),
        }
    }

    /// Counts one limit's part in a decision.
    #[inline]
    pub(crate) fn record(&self, l: &LimitDecision, near_fraction: f64) {
        let shadow = l.mode() == Mode::Shadow;
        let (result, outcome) = match l.status() {
            Status::Checked(o) if o.is_allowed() => (0, Some(o)),
            Status::Checked(_) if shadow => (2, None),
            Status::Checked(_) => (1, None),
            Status::Fallback(o) if o.is_allowed() => (3, Some(o)),
            Status::Fallback(_) if shadow => (2, None),
            Status::Fallback(_) => (4, None),
            Status::FailedOpen => (5, None),
            Status::FailedClosed => (6, None),
            // Not looked at (another limit was refused from the deny cache).
            Status::Unchecked => return,
        };
        self.results[result].increment(1);
        if let Some(o) = outcome
            && (o.remaining() as f64) < near_fraction * l.quota().burst_size() as f64
        {
            self.near_limit.increment(1);
        }
    }
}

/// A remote store's metrics, registered when the store is made.
#[derive(Clone)]
pub(crate) struct StoreMetrics {
    duration: Histogram,
    timeout: Counter,
    backend: Counter,
    protocol: Counter,
    breaker_open: Gauge,
}

/// What went wrong with a call.
#[derive(Clone, Copy)]
pub(crate) enum ErrorKind {
    Timeout,
    Backend,
    Protocol,
}

/// A store's name as a label: lower case, `_` for anything but letters and digits.
pub(crate) fn store_label(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

impl StoreMetrics {
    pub(crate) fn new(store: &str) -> Self {
        describe();
        let store = store_label(store);
        let error = |kind: &'static str| ::metrics::counter!(STORE_ERRORS_TOTAL, "store" => store.clone(), "kind" => kind);
        Self {
            duration: ::metrics::histogram!(STORE_DURATION_SECONDS, "store" => store.clone()),
            timeout: error("timeout"),
            backend: error("backend"),
            protocol: error("protocol"),
            breaker_open: ::metrics::gauge!(BREAKER_OPEN, "store" => store.clone()),
        }
    }

    pub(crate) fn duration(&self, ns: u64) {
        self.duration.record(ns as f64 / 1e9);
    }

    pub(crate) fn error(&self, kind: ErrorKind) {
        match kind {
            ErrorKind::Timeout => &self.timeout,
            ErrorKind::Backend => &self.backend,
            ErrorKind::Protocol => &self.protocol,
        }
        .increment(1);
    }

    pub(crate) fn breaker(&self, open: bool) {
        self.breaker_open.set(if open { 1.0 } else { 0.0 });
    }
}

/// `tollgate_deny_cache_hits_total{limit}`.
pub(crate) fn deny_cache_hits(limit: &str) -> Counter {
    describe();
    ::metrics::counter!(DENY_CACHE_HITS_TOTAL, "limit" => limit.to_owned())
}

/// `tollgate_writeback_dropped_total{store}`.
pub(crate) fn writeback_dropped(store: &str) -> Counter {
    describe();
    ::metrics::counter!(WRITEBACK_DROPPED_TOTAL, "store" => store.to_lowercase())
}

/// `tollgate_keys{limit}`.
pub(crate) fn keys(limit: &str) -> Gauge {
    describe();
    ::metrics::gauge!(KEYS, "limit" => limit.to_owned())
}

/// A delay-mode limit's `tollgate_delayed_total` and `tollgate_delay_seconds`.
pub(crate) struct DelayMetrics {
    delayed: Counter,
    wait: Histogram,
}

impl DelayMetrics {
    pub(crate) fn new(limit: &str) -> Self {
        describe();
        Self {
            delayed: ::metrics::counter!(DELAYED_TOTAL, "limit" => limit.to_owned()),
            wait: ::metrics::histogram!(DELAY_SECONDS, "limit" => limit.to_owned()),
        }
    }

    pub(crate) fn record(&self, wait: std::time::Duration) {
        self.delayed.increment(1);
        self.wait.record(wait.as_secs_f64());
    }
}

/// A settling limit's `tollgate_settles_total` and `tollgate_settled_tokens_total`
/// (registered at its first settle).
pub(crate) struct SettleMetrics {
    taken: Counter,
    taken_tokens: Counter,
    given_back: Counter,
    given_back_tokens: Counter,
}

impl SettleMetrics {
    pub(crate) fn new(limit: &str) -> Self {
        describe();
        let counter = |name: &'static str, result: &'static str| ::metrics::counter!(name, "limit" => limit.to_owned(), "result" => result);
        Self {
            taken: counter(SETTLES_TOTAL, "taken"),
            taken_tokens: counter(SETTLED_TOKENS_TOTAL, "taken"),
            given_back: counter(SETTLES_TOTAL, "given_back"),
            given_back_tokens: counter(SETTLED_TOKENS_TOTAL, "given_back"),
        }
    }

    /// A settle took (`taken`) or gave back `tokens`.
    pub(crate) fn record(&self, taken: bool, tokens: u32) {
        let (n, t) = match taken {
            true => (&self.taken, &self.taken_tokens),
            false => (&self.given_back, &self.given_back_tokens),
        };
        n.increment(1);
        t.increment(u64::from(tokens));
    }
}

/// A stream's `tollgate_stream_units_total{limit, per, result}` (registered when its
/// pacer is made: once per stream, never per unit).
pub(crate) struct StreamMetrics {
    passed: Counter,
    refused: Counter,
}

impl StreamMetrics {
    pub(crate) fn new(limit: &'static str, per: &'static str) -> Self {
        describe();
        let counter = |result: &'static str| ::metrics::counter!(STREAM_UNITS_TOTAL, "limit" => limit, "per" => per, "result" => result);
        Self {
            passed: counter("passed"),
            refused: counter("refused"),
        }
    }

    /// `units` passed (`true`) or were refused.
    pub(crate) fn record(&self, passed: bool, units: u64) {
        match passed {
            true => self.passed.increment(units),
            false => self.refused.increment(units),
        }
    }
}

/// A banning limit's `tollgate_bans_total` and `tollgate_banned_total`.
pub(crate) struct BanMetrics {
    bans: Counter,
    banned: Counter,
}

impl BanMetrics {
    pub(crate) fn new(limit: &str) -> Self {
        describe();
        Self {
            bans: ::metrics::counter!(BANS_TOTAL, "limit" => limit.to_owned()),
            banned: ::metrics::counter!(BANNED_TOTAL, "limit" => limit.to_owned()),
        }
    }

    /// A ban began.
    pub(crate) fn began(&self) {
        self.bans.increment(1);
    }

    /// A banned request was refused.
    pub(crate) fn refused(&self) {
        self.banned.increment(1);
    }
}

/// An audit log's counters (`tollgate_audit_*_total`), registered when the log is built.
pub(crate) struct AuditMetrics {
    pub(crate) accepted: Counter,
    pub(crate) written: Counter,
    pub(crate) failed: Counter,
    pub(crate) dropped: Counter,
}

impl Default for AuditMetrics {
    fn default() -> Self {
        ::metrics::describe_counter!(AUDIT_ACCEPTED_TOTAL, "Violations put in the audit queue");
        ::metrics::describe_counter!(AUDIT_WRITTEN_TOTAL, "Violations the audit sink wrote");
        ::metrics::describe_counter!(
            AUDIT_FAILED_TOTAL,
            "Violations lost with an audit batch whose write failed"
        );
        ::metrics::describe_counter!(
            AUDIT_DROPPED_TOTAL,
            "Violations dropped because the audit queue was full"
        );
        Self {
            accepted: ::metrics::counter!(AUDIT_ACCEPTED_TOTAL),
            written: ::metrics::counter!(AUDIT_WRITTEN_TOTAL),
            failed: ::metrics::counter!(AUDIT_FAILED_TOTAL),
            dropped: ::metrics::counter!(AUDIT_DROPPED_TOTAL),
        }
    }
}

/// Rules' reloads (`tollgate_reloads_total`, `tollgate_rules_healthy`), registered when
/// the rules are built.
#[cfg(feature = "rules")]
pub(crate) struct ReloadMetrics {
    ok: Counter,
    error: Counter,
    healthy: Gauge,
}

#[cfg(feature = "rules")]
impl Default for ReloadMetrics {
    fn default() -> Self {
        ::metrics::describe_counter!(RELOADS_TOTAL, "Reloads of the rules, by result");
        ::metrics::describe_gauge!(RULES_HEALTHY, "1 while the running rules are the newest");
        Self {
            ok: ::metrics::counter!(RELOADS_TOTAL, "result" => "ok"),
            error: ::metrics::counter!(RELOADS_TOTAL, "result" => "error"),
            healthy: ::metrics::gauge!(RULES_HEALTHY),
        }
    }
}

#[cfg(feature = "rules")]
impl ReloadMetrics {
    /// A reload replaced the rules (`true`) or was refused.
    pub(crate) fn reloaded(&self, ok: bool) {
        match ok {
            true => &self.ok,
            false => &self.error,
        }
        .increment(1);
        self.healthy(ok);
    }

    /// Whether the running rules are the newest.
    pub(crate) fn healthy(&self, healthy: bool) {
        self.healthy.set(if healthy { 1.0 } else { 0.0 });
    }
}

/// A region's mover (`store::regions::Mover`): the quota its region held, spent and moved
/// out, the age of its transfer in flight, the other regions it could not reach.
pub(crate) struct RegionMetrics {
    held: Gauge,
    spent: Gauge,
    moved: Counter,
    lag: Gauge,
    unreachable: Gauge,
}

impl RegionMetrics {
    pub(crate) fn new(region: &str) -> Self {
        ::metrics::describe_gauge!(
            REGION_TOKENS_HELD,
            "Tokens the region's buckets with demand held at the mover's last look"
        );
        ::metrics::describe_gauge!(
            REGION_TOKENS_SPENT,
            "Tokens the region spent over the mover's last interval (keys with demand)"
        );
        ::metrics::describe_counter!(
            REGION_TOKENS_MOVED_TOTAL,
            "Tokens the region's mover moved to other regions"
        );
        ::metrics::describe_gauge!(
            REGION_MOVER_LAG_SECONDS,
            "How long the mover's transfer in flight has been on its way (0: none)"
        );
        ::metrics::describe_gauge!(
            REGION_UNREACHABLE,
            "Other regions the mover could not reach lately: a partition while above 0"
        );
        let label = region.to_owned();
        let this = Self {
            held: ::metrics::gauge!(REGION_TOKENS_HELD, "region" => label.clone()),
            spent: ::metrics::gauge!(REGION_TOKENS_SPENT, "region" => label.clone()),
            moved: ::metrics::counter!(REGION_TOKENS_MOVED_TOTAL, "region" => label.clone()),
            lag: ::metrics::gauge!(REGION_MOVER_LAG_SECONDS, "region" => label.clone()),
            unreachable: ::metrics::gauge!(REGION_UNREACHABLE, "region" => label),
        };
        this.record(0, 0, 0, 0.0, 0);
        this
    }

    /// What the mover reports after a look.
    pub(crate) fn record(&self, held: u64, spent: u64, moved: u64, lag_s: f64, unreachable: u64) {
        self.held.set(held as f64);
        self.spent.set(spent as f64);
        self.moved.absolute(moved);
        self.lag.set(lag_s);
        self.unreachable.set(unreachable as f64);
    }
}
