//! The engine: the compiled configuration (limits bound to their store tables, route
//! table, header plan, lists) and the flow from a request to a [`Decision`].
//!
//! It has two front doors: the tower middleware ([`RateLimit`](crate::RateLimit), keys
//! from requests) and the [`Limiter`](crate::Limiter) handle (keys from code). It builds
//! no responses: the middleware turns what it decides into responses.

pub(crate) mod build;
pub(crate) mod delay;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use http::header::HeaderValue;
use http::request::Parts;
use smallvec::SmallVec;

use crate::algo::quota::Quota;
use crate::base::error::ConfigError;
use crate::base::intern::intern;
use crate::base::throttle::LogThrottle;
use crate::engine::delay::{Delay, WaitCounts, Waiters};
use crate::model::decision::{Decision, LimitDecision, Overall, Status};
use crate::model::policy::{MissingKey, Mode};
use crate::store::{Checked, Item, Op, Statuses, Store};
use crate::web::headers::{self, Fields, HeaderStyle, Report, RetryAfterFormat};
use crate::web::key::{Key, KeyBuilder, KeyError};
use crate::web::limit::Limit;
use crate::web::lists::Lists;
use crate::web::response::Rejection;
use crate::web::routes::RouteTable;

/// How often a shadow limit's "would refuse" is logged (with the count since the last line).
pub(crate) const SHADOW_LOG_EVERY: Duration = Duration::from_secs(10);

/// One limit, bound to its table in the store.
pub(crate) struct Bound<St: Store> {
    pub(crate) limit: Limit,
    /// The limit's name, interned: decisions carry it without touching a shared count.
    pub(crate) name: &'static str,
    pub(crate) table: St::Table,
    /// The start of this limit's `RateLimit` member, `"name";r=`.
    pub(crate) ietf_prefix: Box<str>,
    /// Misconfigurations hit by requests: logged once a minute.
    pub(crate) misconfigured_log: LogThrottle,
    /// Shadow "would refuse"s: logged once per [`SHADOW_LOG_EVERY`], with a count.
    pub(crate) shadow_log: LogThrottle,
    /// Delay mode: the requests that wait.
    pub(crate) waiters: Option<Waiters>,
}

impl<St: Store> Bound<St> {
    /// The limit bound to its table; an error if its name cannot be interned (the
    /// process has interned [`INTERN_BUDGET`](crate::base::intern::INTERN_BUDGET) bytes of
    /// distinct names already).
    pub(crate) fn new(limit: Limit, store: &St, waits: &WaitCounts) -> Result<Self, ConfigError> {
        let Some(name) = intern(&limit.name) else {
            return Err(ConfigError::new(
                format!("limits[{:?}].name", &*limit.name),
                format!(
                    "this process has already kept {} MiB of distinct limit names (names live as long as the process): reuse names, or restart it to load more new ones",
                    crate::base::intern::INTERN_BUDGET >> 20
                ),
            ));
        };
        Ok(Self {
            name,
            ietf_prefix: headers::limit_prefix(&limit.name),
            table: store.table(&limit.name),
            misconfigured_log: LogThrottle::new(),
            shadow_log: LogThrottle::new(),
            waiters: Waiters::new(limit.on_limit, &limit.name, waits),
            limit,
        })
    }
}

/// The limits that apply to one kind of request.
pub(crate) struct Group {
    pub(crate) limits: SmallVec<[usize; 4]>,
    /// `RateLimit-Policy` for the usual case: every reported limit with its own quota.
    pub(crate) policy: Option<HeaderValue>,
    /// How many limits that usual case reports.
    pub(crate) reported: usize,
    /// Whether a limit of the group chooses its quota per request.
    pub(crate) dynamic_quota: bool,
    /// Whether a limit of the group is in shadow mode.
    pub(crate) shadow: bool,
    /// Whether a limit of the group charges only some outcomes.
    pub(crate) charged: bool,
    /// Whether a limit of the group is in delay mode.
    pub(crate) delayed: bool,
}

/// A function told every decision (see
/// [`RateLimitBuilder::on_decision`](crate::RateLimitBuilder::on_decision)).
pub(crate) type Observer = Arc<dyn Fn(&Decision, &Parts) + Send + Sync>;

/// Everything the front doors share: the store, the limits, and how requests map to them.
pub(crate) struct Engine<St: Store> {
    pub(crate) store: St,
    pub(crate) bounds: Vec<Bound<St>>,
    /// The first limit of each name: what the handle reaches by name.
    pub(crate) by_name: HashMap<&'static str, usize>,
    /// Group 0 applies to requests that match no route entry.
    pub(crate) groups: Vec<Group>,
    pub(crate) routes: RouteTable,
    pub(crate) lists: Option<Lists>,
    pub(crate) style: HeaderStyle,
    pub(crate) shadow_headers: bool,
    pub(crate) retry_format: RetryAfterFormat,
    pub(crate) jitter: f64,
    pub(crate) unavailable_retry: Duration,
    pub(crate) decision_extension: bool,
    pub(crate) limiter_extension: bool,
    pub(crate) observer: Option<Observer>,
    /// Refusal events, offenders, metrics, gRPC settings (observe.rs).
    pub(crate) hooks: crate::web::hooks::Hooks,
}

/// What is remembered of each checked limit while the store answers.
#[derive(Clone, Copy)]
pub(crate) struct Planned {
    pub(crate) bound: usize,
    pub(crate) quota: Quota,
    pub(crate) cost: u32,
    /// For Retry-After jitter: a hash of the key that is the same in every process.
    key_hash: u64,
}

pub(crate) type Plan = SmallVec<[Planned; 4]>;

/// The keys of the limits that charge only some outcomes (by index into the plan): kept
/// until the response says whether to give their cost back.
pub(crate) type ChargeKeys = SmallVec<[(usize, Key); 1]>;

/// A request, prepared for the store.
pub(crate) struct Prepared {
    pub(crate) group: usize,
    pub(crate) plan: Plan,
    pub(crate) charge_keys: Option<Box<ChargeKeys>>,
}

/// Why a request does not go to the store.
pub(crate) enum Early<'a> {
    /// No limit applies (a safelisted client): the service is called as it is.
    Pass,
    /// The request is answered at once.
    Refuse(Rejection<'a>),
}

/// What the engine decided for a request that went to the store.
// Taken apart right after it is returned: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Next {
    /// Call the service, then add these fields to its response. `charged`: the plan
    /// indices of limits that charge only some outcomes and took their cost.
    Proceed {
        fields: Fields,
        charged: SmallVec<[usize; 1]>,
        /// Delay mode: the request waits this long for its reserved tokens first.
        delay: Option<Delay>,
    },
    /// An enforcing limit refused (429), or a store failed under `Deny` (503).
    Refuse {
        decision: Decision,
        unavailable: bool,
        wait: Option<Duration>,
        fields: Fields,
    },
}

impl<St: Store> Engine<St> {
    /// Extracts each limit's key, quota and cost into `items` and the plan.
    pub(crate) fn prepare<'a>(
        &'a self,
        parts: &Parts,
        items: &mut SmallVec<[Item<'a, St::Table>; 4]>,
    ) -> Result<Prepared, Early<'a>> {
        if let Some(lists) = &self.lists {
            match lists.classify(parts) {
                Ok(crate::web::lists::Listed::No) => {}
                Ok(crate::web::lists::Listed::Allowed) => return Err(Early::Pass),
                Ok(crate::web::lists::Listed::Denied) => {
                    return Err(Early::Refuse(Rejection::Blocked {
                        status: StatusCode::FORBIDDEN,
                    }));
                }
                Err(reason) => {
                    lists.log_misconfiguration(reason);
                    return Err(Early::Refuse(Rejection::Misconfigured {
                        limit: "(allow and deny lists)",
                        reason,
                    }));
                }
            }
        }
        let group = self.routes.group_for(parts);
        let g = &self.groups[group];
        let mut prepared = Prepared {
            group,
            plan: Plan::new(),
            charge_keys: None,
        };
        for &index in &g.limits {
            let bound = &self.bounds[index];
            let limit = &bound.limit;
            let mut builder = KeyBuilder::new();
            let key = match limit.key.extract(parts, &mut builder) {
                Ok(()) => builder.take(),
                Err(KeyError::Missing) => match limit.missing {
                    MissingKey::SharedBucket => Key::missing(),
                    MissingKey::Skip => continue,
                    MissingKey::Reject(status) => {
                        return Err(Early::Refuse(Rejection::MissingKey {
                            limit: &limit.name,
                            status,
                        }));
                    }
                },
                Err(KeyError::Misconfigured(reason)) => {
                    log_misconfiguration(bound, reason);
                    return Err(Early::Refuse(Rejection::Misconfigured {
                        limit: &limit.name,
                        reason,
                    }));
                }
            };
            let quota = limit.quota_for(parts);
            let cost = limit.cost.resolve(parts);
            let key_hash = if self.jitter > 0.0 {
                key.stable_hash()
            } else {
                0
            };
            // Delay mode keeps every key: a request that goes away while it waits gives
            // its reservation back.
            if g.delayed || (g.charged && limit.charge.is_conditional()) {
                prepared
                    .charge_keys
                    .get_or_insert_with(Default::default)
                    .push((prepared.plan.len(), key.clone()));
            }
            prepared.plan.push(Planned {
                bound: index,
                quota,
                cost,
                key_hash,
            });
            let mut item = Item::new(&bound.table, key, quota, cost)
                .mode(limit.mode)
                .on_failure(limit.on_failure)
                .algorithm(limit.algorithm);
            if let Some(w) = &bound.waiters
                && w.has_room()
                && tokio::runtime::Handle::try_current().is_ok()
            {
                item = item.max_wait(limit.reservation_wait(&quota, w.max_wait(parts)));
            }
            items.push(item);
        }
        Ok(prepared)
    }

    /// Asks the store; a request no limit applies to (skipped keys, a route without
    /// limits) never reaches it.
    #[inline]
    pub(crate) fn check(&self, items: &[Item<'_, St::Table>]) -> Checked<St::Future> {
        if items.is_empty() {
            Checked::Ready(Statuses::new())
        } else {
            self.store.check(items)
        }
    }

    /// Builds the decision from the store's answer and decides what happens to the request.
    pub(crate) fn finish(
        &self,
        prepared: &Prepared,
        statuses: Statuses,
        parts: &mut Parts,
        keys: &(impl crate::web::hooks::Keys + ?Sized),
    ) -> Next {
        let plan = &prepared.plan;
        let limits = plan
            .iter()
            .zip(statuses)
            .map(|(p, status)| {
                let bound = &self.bounds[p.bound];
                let limit = &bound.limit;
                LimitDecision {
                    name: bound.name,
                    quota: p.quota,
                    cost: p.cost,
                    mode: limit.mode,
                    status,
                }
            })
            .collect();
        let mut decision = Decision { limits };
        let g = &self.groups[prepared.group];
        // Only a request its limits let through waits: a refused one took nothing (its
        // limits report the state they looked at, which may be in debt).
        let delay = if g.delayed && decision.overall() == Overall::Allowed {
            self.delay(prepared, &mut decision)
        } else {
            None
        };
        if g.shadow {
            for (i, (l, p)) in decision.limits().zip(plan).enumerate() {
                if l.mode() == Mode::Shadow && !l.allowed() {
                    log_shadow_refusal(&self.bounds[p.bound], parts);
                    self.hooks.shadow_refused(i, p.bound, l, parts, keys);
                }
            }
        }
        #[cfg(feature = "metrics")]
        self.hooks.decided(plan.iter().map(|p| p.bound), &decision);
        if let Some(observer) = &self.observer {
            observer(&decision, parts);
        }
        let overall = decision.overall();
        let mut fields = Fields::default();
        let wait = match overall {
            Overall::Limited => decision
                .retry_after()
                .map(|w| self.jittered(plan, &decision, w)),
            _ => None,
        };
        if self.style != HeaderStyle::None {
            self.render(g, plan, &decision, wait, &mut fields);
        }
        match overall {
            Overall::Allowed => {
                let mut charged = SmallVec::new();
                if prepared.charge_keys.is_some() {
                    for (i, (l, p)) in decision.limits().zip(plan).enumerate() {
                        let consumed = p.cost > 0 && l.allowed() && l.outcome().is_some();
                        if consumed && self.bounds[p.bound].limit.charge.is_conditional() {
                            charged.push(i);
                        }
                    }
                }
                if self.decision_extension {
                    // Stacked layers: the handler sees every layer's limits in one decision.
                    match parts.extensions.get_mut::<Decision>() {
                        Some(outer) => outer.limits.extend(decision.limits),
                        None => {
                            parts.extensions.insert(decision);
                        }
                    }
                }
                Next::Proceed {
                    fields,
                    charged,
                    delay,
                }
            }
            // Logged by the refusal path (observe.rs), throttled.
            Overall::Limited => Next::Refuse {
                decision,
                unavailable: false,
                wait,
                fields,
            },
            Overall::Unavailable => Next::Refuse {
                decision,
                unavailable: true,
                wait: Some(self.unavailable_retry),
                fields,
            },
        }
    }

    /// Delay mode: whether a request the store let through must wait for its reserved
    /// tokens, and the waiters' places it takes. A request that finds every place taken
    /// (it raced others for the last ones) gives its tokens back and is refused: the
    /// limits whose places were taken report a denial with the wait.
    fn delay(&self, prepared: &Prepared, decision: &mut Decision) -> Option<Delay> {
        let waits = |(l, p): (&LimitDecision, &Planned)| {
            let waits = p.cost > 0 && self.bounds[p.bound].waiters.is_some();
            let wait = l.outcome().filter(|o| o.is_allowed()).map(|o| o.wait());
            wait.filter(|w| waits && !w.is_zero())
        };
        let wait = decision
            .limits()
            .zip(&prepared.plan)
            .filter_map(waits)
            .max()?;
        let mut places: SmallVec<[usize; 2]> = SmallVec::new();
        let mut full = false;
        for (l, p) in decision.limits().zip(&prepared.plan) {
            if waits((l, p)).is_some() {
                let w = self.bounds[p.bound].waiters.as_ref().expect("delay mode");
                if w.enter() {
                    places.push(p.bound);
                } else {
                    full = true;
                }
            }
        }
        // What the request took: every consuming limit (`by_outcome`: also those that
        // charge by outcome, which the charge guard gives back if the request goes away
        // while it waits — the delay guard must not give them back twice).
        let consumed = |by_outcome: bool| -> ChargeKeys {
            let Some(keys) = prepared.charge_keys.as_deref() else {
                return ChargeKeys::new();
            };
            keys.iter()
                .filter(|(i, _)| {
                    let l = &decision.limits[*i];
                    let p = &prepared.plan[*i];
                    let conditional = self.bounds[p.bound].limit.charge.is_conditional();
                    p.cost > 0
                        && l.allowed()
                        && l.outcome().is_some()
                        && (by_outcome || !conditional)
                })
                .cloned()
                .collect()
        };
        if !full {
            for &b in &places {
                self.bounds[b]
                    .waiters
                    .as_ref()
                    .expect("delay mode")
                    .record(wait);
            }
            return Some(Delay {
                wait,
                places,
                reserved: consumed(false),
            });
        }
        // Every place was taken (requests raced for the last ones): no charge guard will
        // exist, so everything the request took goes back here.
        self.release(&prepared.plan, &places, &consumed(true));
        for l in decision.limits.iter_mut() {
            if let Status::Checked(o) | Status::Fallback(o) = &mut l.status
                && o.is_allowed()
                && !o.wait().is_zero()
                && l.mode == Mode::Enforce
            {
                *o = o.refused_after_wait();
            }
        }
        None
    }

    /// Frees the waiters' places `places` (bound indices), and gives back the tokens
    /// `reserved` (plan indices and keys) of a request that will not proceed.
    pub(crate) fn release(&self, plan: &[Planned], places: &[usize], reserved: &[(usize, Key)]) {
        for &i in places {
            if let Some(w) = &self.bounds[i].waiters {
                w.leave();
            }
        }
        if !reserved.is_empty() {
            self.refund(plan, reserved);
        }
    }

    /// The rate-limit fields of a decision.
    fn render(
        &self,
        g: &Group,
        plan: &[Planned],
        decision: &Decision,
        wait: Option<Duration>,
        fields: &mut Fields,
    ) {
        let mut reports: SmallVec<[Report<'_>; 4]> = decision
            .limits()
            .zip(plan)
            .filter(|(l, _)| l.mode() == Mode::Enforce || self.shadow_headers)
            .filter_map(|(l, p)| {
                let o = l.outcome()?;
                Some(Report {
                    name: l.name(),
                    prefix: &self.bounds[p.bound].ietf_prefix,
                    burst: l.quota.burst_size(),
                    window: self.bounds[p.bound].limit.algorithm.window_secs(&l.quota),
                    remaining: o.remaining(),
                    next_after: o.next_after(),
                    reset_after: o.reset_after(),
                    violated: l.denies(),
                })
            })
            .collect();
        headers::keep_most_restrictive(&mut reports);
        let usual = reports.len() == g.reported
            && (!g.dynamic_quota
                || decision
                    .limits()
                    .zip(plan)
                    .all(|(l, p)| l.quota == self.bounds[p.bound].limit.quota));
        let policy = if usual { g.policy.as_ref() } else { None };
        headers::rate_limit_fields(self.style, &reports, policy, SystemTime::now, wait, fields);
    }

    /// The wait, lengthened by up to `jitter` of itself, by an amount fixed per client key.
    fn jittered(&self, plan: &[Planned], decision: &Decision, wait: Duration) -> Duration {
        if self.jitter <= 0.0 {
            return wait;
        }
        // Seeded by the key of the limit that imposes the wait.
        let hash = decision
            .limits()
            .zip(plan)
            .filter(|(l, _)| l.denies())
            .max_by_key(|(l, _)| l.retry_after())
            .map_or(0, |(_, p)| p.key_hash);
        let fraction = (hash >> 11) as f64 / (1u64 << 53) as f64;
        wait + wait.mul_f64(self.jitter * fraction)
    }

    /// Gives back the cost of the charged limits `which` (plan indices) of a request whose
    /// outcome does not count, or whose response never came.
    pub(crate) fn refund(&self, plan: &[Planned], refunds: &[(usize, Key)]) {
        let items: SmallVec<[Item<'_, St::Table>; 2]> = refunds
            .iter()
            .map(|(i, key)| {
                let p = &plan[*i];
                let limit = &self.bounds[p.bound].limit;
                Item::new(&self.bounds[p.bound].table, key.clone(), p.quota, p.cost)
                    .mode(limit.mode)
                    .on_failure(limit.on_failure)
                    .algorithm(limit.algorithm)
            })
            .collect();
        self.store
            .apply(Op::Refund, &items)
            .finish_in_background("the cost of a request");
    }

    /// The index of the limit called `name`.
    pub(crate) fn find(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}

/// Logs a misconfiguration at most once a minute per limit.
fn log_misconfiguration<St: Store>(bound: &Bound<St>, reason: &str) {
    if let Some(suppressed) = bound.misconfigured_log.permit(Duration::from_secs(60)) {
        tracing::error!(
            limit = &*bound.limit.name,
            suppressed,
            "tollgate cannot apply this limit: {reason}"
        );
    }
}

/// Logs that a shadow limit would have refused a request: the first time, then once per
/// [`SHADOW_LOG_EVERY`] per limit with the number of refusals in between, whatever the
/// flood.
fn log_shadow_refusal<St: Store>(bound: &Bound<St>, parts: &Parts) {
    if let Some(suppressed) = bound.shadow_log.permit(SHADOW_LOG_EVERY) {
        tracing::info!(
            limit = &*bound.limit.name,
            method = %parts.method,
            path = parts.uri.path(),
            more_since_last_line = suppressed,
            "shadow limit would refuse this request"
        );
    }
}
