//! What the engine tells operators: refusal events, top offenders, metrics (feature
//! `metrics`). Built once per layer; the
//! engine calls its hooks from `finish` (metrics) and the refusal path (events,
//! offenders), so the request path pays only for what is configured.

use std::fmt;
use std::time::Duration;

use http::request::Parts;
use tracing::Level;

use crate::base::throttle::LogThrottle;
use crate::model::decision::Decision;
use crate::observe::offenders::{self, OffenderTracking, RefusedKey, TopRefused};
use crate::store::Item;
use crate::web::key::Key;

/// How refusals are logged: one `tracing` event per refused request (target
/// `tollgate::refused`; fields `limit`, `key` (or its hash), `retry_after_ms`, `route`,
/// and `suppressed`, the refusals of that limit left out since the previous line), at
/// most one per limit per interval, so that a flood never makes logging the bottleneck.
///
/// The default: `INFO`, at most one line per limit every 100 ms (10 a second).
///
/// ```
/// use std::time::Duration;
/// use tollgate::RefusalLog;
/// use tracing::Level;
///
/// let log = RefusalLog::new().level(Level::WARN).at_most_every(Duration::from_secs(1));
/// let every_refusal = RefusalLog::new().level(Level::DEBUG).at_most_every(Duration::ZERO);
/// let none = RefusalLog::off();
/// # let _ = (log, every_refusal, none);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalLog {
    level: Option<Level>,
    every: Duration,
}

impl Default for RefusalLog {
    fn default() -> Self {
        Self::new()
    }
}

impl RefusalLog {
    /// `INFO`, at most one line per limit every 100 ms.
    pub const fn new() -> Self {
        Self {
            level: Some(Level::INFO),
            every: Duration::from_millis(100),
        }
    }

    /// No refusal events.
    pub const fn off() -> Self {
        Self {
            level: None,
            every: Duration::from_millis(100),
        }
    }

    /// The level of the events.
    pub const fn level(mut self, level: Level) -> Self {
        self.level = Some(level);
        self
    }

    /// At most one line per limit per `interval` (`Duration::ZERO`: every refusal).
    pub const fn at_most_every(mut self, interval: Duration) -> Self {
        self.every = interval;
        self
    }
}

/// Everything a builder collects for the hooks.
#[derive(Clone)]
pub(crate) struct HookSettings {
    pub(crate) refusal_log: RefusalLog,
    /// `None`: the default (text keys hashed, addresses shown).
    pub(crate) redact_keys: Option<bool>,
    pub(crate) offenders: Option<OffenderTracking>,
    /// The audit log (audit/), if any.
    pub(crate) audit: Option<crate::audit::AuditLog>,
    /// The fraction of a bucket under which a decision counts as near the limit
    /// (metrics only).
    pub(crate) near_limit: f64,
    /// Told of every refusal with its limit and key (the rules' `simulate`).
    pub(crate) tap: Option<Tap>,
}

/// How a tapped refusal came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// An enforcing limit refused the request.
    Enforced,
    /// A shadow limit would have refused it.
    Shadow,
    /// The key was banned by the limit.
    Banned,
    /// Not a refusal of its own: the limit's refusal (tapped as `Enforced` too) began a
    /// ban of the key, at this repeat level (0: a first ban).
    BanBegan(u32),
}

/// A crate-private observer of refusals with their keys: `(limit, key, how)`.
pub(crate) type Tap = std::sync::Arc<dyn Fn(&'static str, Option<&Key>, Refusal) + Send + Sync>;

// Derivable only without the `metrics` feature, whose field has another default.
#[allow(clippy::derivable_impls)]
impl Default for HookSettings {
    fn default() -> Self {
        Self {
            refusal_log: RefusalLog::new(),
            redact_keys: None,
            offenders: None,
            audit: None,
            near_limit: 0.2,
            tap: None,
        }
    }
}

/// One limit's share of the hooks.
pub(crate) struct LimitHooks {
    refusal_log: LogThrottle,
    offenders: Option<TopRefused>,
    /// When the next offender report may be logged (ms on the throttle clock).
    next_report: std::sync::atomic::AtomicU64,
    pub(crate) metrics: crate::observe::probe::LimitMetrics,
}

/// The compiled hooks of a layer or limiter.
pub(crate) struct Hooks {
    pub(crate) settings: HookSettings,
    /// By limit (bound) index.
    pub(crate) limits: Vec<LimitHooks>,
    /// Whether the refusal path needs the keys of the request's limits.
    pub(crate) wants_keys: bool,
    /// The audit log, with what it needs from the layer.
    pub(crate) audit: Option<crate::audit::Recorder>,
}

/// The keys of a request's limits, by plan index.
pub(crate) trait Keys {
    fn key(&self, i: usize) -> Option<&Key>;
}

impl<T> Keys for [Item<'_, T>] {
    fn key(&self, i: usize) -> Option<&Key> {
        self.get(i).map(|item| &item.key)
    }
}

impl Keys for [Key] {
    fn key(&self, i: usize) -> Option<&Key> {
        self.get(i)
    }
}

/// The wait of a refusal in logs: milliseconds, rounded up, or `never`.
struct WaitMs(Option<Duration>);

impl fmt::Display for WaitMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(wait) => write!(f, "{}", ceil_ms(wait)),
            None => f.write_str("never"),
        }
    }
}

pub(crate) use crate::base::round::ceil_ms;

pub(crate) use crate::base::event::{enabled_at, event_at};

impl Hooks {
    pub(crate) fn new(
        settings: HookSettings,
        names: &[&'static str],
        audit: Option<crate::audit::Recorder>,
    ) -> Self {
        let limits = names
            .iter()
            .map(|&_name| LimitHooks {
                refusal_log: LogThrottle::new(),
                offenders: settings.offenders.map(|o| TopRefused::new(o.capacity)),
                next_report: std::sync::atomic::AtomicU64::new(0),
                metrics: crate::observe::probe::LimitMetrics::new(_name),
            })
            .collect();
        Self {
            wants_keys: settings.offenders.is_some()
                || settings.refusal_log.level.is_some()
                || settings.tap.is_some()
                || audit.is_some(),
            settings,
            limits,
            audit,
        }
    }

    /// Copies the keys a pending store's request may need when it is refused (into the
    /// request's existing state: no allocation of its own).
    pub(crate) fn keep_keys<T>(&self, items: &[Item<'_, T>]) -> smallvec::SmallVec<[Key; 4]> {
        if self.wants_keys {
            items.iter().map(|i| i.key.clone()).collect()
        } else {
            smallvec::SmallVec::new()
        }
    }

    /// Every decision of the middleware (recorded with feature `metrics`).
    #[inline]
    /// `bounds`: the bound index of each of the decision's limits, in order.
    pub(crate) fn decided(&self, bounds: impl IntoIterator<Item = usize>, decision: &Decision) {
        for (l, bound) in decision.limits().zip(bounds) {
            self.limits[bound]
                .metrics
                .record(l, self.settings.near_limit);
        }
    }

    /// A request refused by its limits (not a store failure): the event, the offenders.
    pub(crate) fn refused(
        &self,
        bounds: impl IntoIterator<Item = usize>,
        decision: &Decision,
        wait: Option<Duration>,
        parts: &Parts,
        keys: &(impl Keys + ?Sized),
    ) {
        if !self.wants_keys {
            return;
        }
        let redact = self.settings.redact_keys;
        // The limit that imposes the wait is the one the event names.
        let mut worst: Option<(usize, usize, u128)> = None;
        // One sampling decision per request, whatever its number of refusing limits.
        let mut sampled: Option<Option<u64>> = None;
        for (i, (l, bound)) in decision.limits().zip(bounds).enumerate() {
            if !l.denies() {
                continue;
            }
            if let Some(audit) = &self.audit {
                audit.record(bound, l, keys.key(i), parts, false);
            }
            if let Some(tap) = &self.settings.tap {
                tap(l.name, keys.key(i), Refusal::Enforced);
            }
            let hooks = &self.limits[bound];
            if let (Some(top), Some(key)) = (&hooks.offenders, keys.key(i))
                && let Some(weight) = *sampled.get_or_insert_with(offenders::sample)
            {
                top.record(key, weight);
                // Reports ride on counted refusals: no clock read for the others.
                self.maybe_report(hooks, l.name());
            }
            // Never (a cost beyond the bucket) counts as the longest wait.
            let w = l.retry_after().map_or(u128::MAX, |w| w.as_nanos());
            if worst.is_none_or(|(_, _, longest)| w > longest) {
                worst = Some((i, bound, w));
            }
        }
        let (Some(level), Some((i, bound, _))) = (self.settings.refusal_log.level, worst) else {
            return;
        };
        // Nobody listens: no line to throttle, no key to render.
        if !enabled_at!(level, "tollgate::refused") {
            return;
        }
        let Some(suppressed) = self.limits[bound]
            .refusal_log
            .permit(self.settings.refusal_log.every)
        else {
            return;
        };
        let limit = decision.limits().nth(i).map_or("", |l| l.name());
        let key = keys.key(i).map(|k| offenders::render(k, redact));
        let key = key.as_deref().unwrap_or("");
        let route = crate::web::routes::logged_route(parts);
        let retry_after_ms = WaitMs(wait);
        event_at!(
            level,
            "tollgate::refused",
            limit,
            key,
            %retry_after_ms,
            route,
            suppressed,
            "request refused"
        );
    }

    /// A request refused because its key was banned by limit `bound`: the audit log (the
    /// ban itself is logged once, when it begins, by the engine).
    #[inline]
    pub(crate) fn banned(
        &self,
        bound: usize,
        limit: &'static str,
        key: &Key,
        parts: &Parts,
        remaining: Duration,
    ) {
        if let Some(audit) = &self.audit {
            audit.record_banned(bound, limit, key, parts, remaining);
        }
        if let Some(tap) = &self.settings.tap {
            tap(limit, Some(key), Refusal::Banned);
        }
    }

    /// A refusal by limit `limit` began a ban of `key` at repeat `level` (the engine logs
    /// it): told to the tap.
    #[inline]
    pub(crate) fn ban_began(&self, limit: &'static str, key: &Key, level: u32) {
        if let Some(tap) = &self.settings.tap {
            tap(limit, Some(key), Refusal::BanBegan(level));
        }
    }

    /// A shadow limit would have refused the request (plan index `i`): the audit log.
    #[inline]
    pub(crate) fn shadow_refused(
        &self,
        i: usize,
        bound: usize,
        limit: &crate::model::decision::LimitDecision,
        parts: &Parts,
        keys: &(impl Keys + ?Sized),
    ) {
        if let Some(tap) = &self.settings.tap {
            tap(limit.name, keys.key(i), Refusal::Shadow);
        }
        // A store failure is no violation: only a bucket's answer counts.
        if let Some(audit) = &self.audit
            && limit.outcome().is_some()
        {
            audit.record(bound, limit, keys.key(i), parts, true);
        }
    }

    /// Logs the limit's top offenders if a report is due.
    fn maybe_report(&self, hooks: &LimitHooks, limit: &str) {
        use std::sync::atomic::Ordering;
        let (Some(tracking), Some(top)) = (self.settings.offenders, &hooks.offenders) else {
            return;
        };
        let Some(every) = tracking.report_every else {
            return;
        };
        let now = crate::base::throttle::now_ms();
        let next = hooks.next_report.load(Ordering::Relaxed);
        if next == 0 {
            // The first refusal starts the period: the first report covers a full one.
            let _ = hooks.next_report.compare_exchange(
                0,
                now + every.as_millis() as u64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return;
        }
        if now < next
            || hooks
                .next_report
                .compare_exchange(
                    next,
                    now + every.as_millis() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let entries = self.top(top, tracking.report_top);
        let top = entries
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        tracing::info!(target: "tollgate::offenders", limit, %top, "top refused keys");
    }

    fn top(&self, top: &TopRefused, n: usize) -> Vec<RefusedKey> {
        top.top(n)
            .into_iter()
            .map(|(key, count, error)| RefusedKey {
                key: offenders::render(&key, self.settings.redact_keys),
                count,
                error,
            })
            .collect()
    }

    /// The top refused keys of limit `index` (empty if the layer does not track them).
    pub(crate) fn top_refused(&self, index: usize, n: usize) -> Vec<RefusedKey> {
        match &self.limits[index].offenders {
            Some(top) => self.top(top, n),
            None => Vec::new(),
        }
    }
}
