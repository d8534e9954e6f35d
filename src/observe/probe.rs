//! The metric handles the crate holds, whatever its features. With `metrics` they record
//! through the `metrics` facade (the schema is in [`crate::metrics`]); without it they are
//! zero-sized and every call compiles to nothing, so no struct of the crate carries a
//! field that exists only with the feature.

#[cfg(all(feature = "metrics", feature = "rules"))]
pub(crate) use crate::observe::metrics::ReloadMetrics;
#[cfg(feature = "metrics")]
pub(crate) use crate::observe::metrics::{
    AuditMetrics, BanMetrics, DelayMetrics, ErrorKind, LimitMetrics, RegionMetrics, SettleMetrics,
    StoreMetrics, StreamMetrics, deny_cache_hits, keys, writeback_dropped,
};
#[cfg(feature = "metrics")]
pub(crate) use ::metrics::{Counter, Gauge};

#[cfg(not(feature = "metrics"))]
pub(crate) use off::*;

/// The same handles, doing nothing.
#[cfg(not(feature = "metrics"))]
mod off {
    use std::time::Duration;

    use crate::model::decision::LimitDecision;

    /// A limit's decision metrics.
    #[derive(Clone, Debug)]
    pub(crate) struct LimitMetrics;

    impl LimitMetrics {
        #[inline(always)]
        pub(crate) fn new(_limit: &'static str) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn record(&self, _l: &LimitDecision, _near_fraction: f64) {}
    }

    /// A delay-mode limit's waits.
    #[derive(Clone, Debug)]
    pub(crate) struct DelayMetrics;

    impl DelayMetrics {
        #[inline(always)]
        pub(crate) fn new(_limit: &str) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn record(&self, _wait: Duration) {}
    }

    /// A region's mover's quota, lag and partitions.
    #[derive(Debug)]
    pub(crate) struct RegionMetrics;

    impl RegionMetrics {
        #[inline(always)]
        pub(crate) fn new(_region: &str) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn record(
            &self,
            _held: u64,
            _spent: u64,
            _moved: u64,
            _lag_s: f64,
            _unreachable: u64,
        ) {
        }
    }

    /// A settling limit's settles.
    #[derive(Debug)]
    pub(crate) struct SettleMetrics;

    impl SettleMetrics {
        #[inline(always)]
        pub(crate) fn new(_limit: &str) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn record(&self, _taken: bool, _tokens: u32) {}
    }

    /// A stream's units.
    #[derive(Debug)]
    pub(crate) struct StreamMetrics;

    impl StreamMetrics {
        #[inline(always)]
        pub(crate) fn new(_limit: &'static str, _per: &'static str) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn record(&self, _passed: bool, _units: u64) {}
    }

    /// A banning limit's bans.
    #[derive(Debug)]
    pub(crate) struct BanMetrics;

    impl BanMetrics {
        #[inline(always)]
        pub(crate) fn new(_limit: &str) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn began(&self) {}

        #[inline(always)]
        pub(crate) fn refused(&self) {}
    }

    /// Why a store call failed.
    pub(crate) enum ErrorKind {
        Timeout,
        Backend,
        Protocol,
    }

    /// A store's call metrics.
    #[derive(Clone, Debug)]
    pub(crate) struct StoreMetrics;

    impl StoreMetrics {
        #[inline(always)]
        pub(crate) fn new(_store: &str) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn duration(&self, _ns: u64) {}

        #[inline(always)]
        pub(crate) fn error(&self, kind: ErrorKind) {
            let (ErrorKind::Timeout | ErrorKind::Backend | ErrorKind::Protocol) = kind;
        }

        #[inline(always)]
        pub(crate) fn breaker(&self, _open: bool) {}
    }

    /// An audit log's counters.
    #[derive(Default, Debug)]
    pub(crate) struct AuditMetrics {
        pub(crate) accepted: Counter,
        pub(crate) written: Counter,
        pub(crate) failed: Counter,
        pub(crate) dropped: Counter,
    }

    /// Rules' reloads.
    #[cfg(feature = "rules")]
    #[derive(Default, Debug)]
    pub(crate) struct ReloadMetrics;

    #[cfg(feature = "rules")]
    impl ReloadMetrics {
        #[inline(always)]
        pub(crate) fn reloaded(&self, _ok: bool) {}

        #[inline(always)]
        pub(crate) fn healthy(&self, _healthy: bool) {}
    }

    /// A counter.
    #[derive(Clone, Debug, Default)]
    pub(crate) struct Counter;

    impl Counter {
        #[inline(always)]
        pub(crate) fn increment(&self, _n: u64) {}
    }

    /// A gauge.
    #[derive(Clone, Debug)]
    pub(crate) struct Gauge;

    impl Gauge {
        #[inline(always)]
        pub(crate) fn increment(&self, _n: f64) {}

        #[inline(always)]
        pub(crate) fn decrement(&self, _n: f64) {}
    }

    /// The deny cache's hits of a limit.
    #[inline(always)]
    pub(crate) fn deny_cache_hits(_limit: &str) -> Counter {
        Counter
    }

    /// Keys a remote store could not keep for its write-back.
    #[inline(always)]
    pub(crate) fn writeback_dropped(_store: &str) -> Counter {
        Counter
    }

    /// The keys a limit's memory table tracks.
    #[inline(always)]
    pub(crate) fn keys(_limit: &str) -> Gauge {
        Gauge
    }
}
