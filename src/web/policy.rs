//! The HTTP policy of a layer: which limits a request meets (routes, allow and deny
//! lists), its key, quota and cost in each ([`Policy::prepare`]), and what its decision
//! means for the response: the rate-limit fields, the refusal, delay mode's wait
//! ([`Policy::finish`]). The engine below it holds the limits and the store.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use http::header::HeaderValue;
use http::request::Parts;
use smallvec::SmallVec;

use crate::base::throttle::{LogOnce, LogThrottle};
use crate::engine::delay::Delay;
use crate::engine::{ChargeKeys, Engine, Plan, Planned};
use crate::model::decision::{Decision, LimitDecision, Overall, Status};
use crate::model::key::{Key, KeyBuilder};
use crate::model::policy::{MissingKey, Mode};
use crate::store::{Item, Statuses, Store};
use crate::web::deadline::max_wait_of;
use crate::web::headers::{self, Fields, HeaderStyle, Report, RetryAfterFormat};
use crate::web::hooks::Hooks;
use crate::web::key::KeyError;
use crate::web::limit::Limit;
use crate::web::lists::{Listed, Lists};
use crate::web::response::{LISTS, Rejection};
use crate::web::routes::RouteTable;

/// How often a shadow limit's "would refuse" is logged (with the count since the last line).
pub(crate) const SHADOW_LOG_EVERY: Duration = Duration::from_secs(10);

/// A function told every decision (see
/// [`RateLimitBuilder::on_decision`](crate::RateLimitBuilder::on_decision)).
pub(crate) type Observer = Arc<dyn Fn(&Decision, &Parts) + Send + Sync>;

/// How a layer answers: the header style and the extensions it sets. Collected by the
/// builder and kept as they are.
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) style: HeaderStyle,
    pub(crate) shadow_headers: bool,
    pub(crate) retry_format: RetryAfterFormat,
    pub(crate) jitter: f64,
    pub(crate) unavailable_retry: Duration,
    pub(crate) decision_extension: bool,
    pub(crate) limiter_extension: bool,
    pub(crate) observer: Option<Observer>,
    /// Refusals get only what the rejection handler builds: no `Retry-After` or
    /// `Cache-Control` (the rules' `simulate`, which reads nothing but the status).
    pub(crate) bare_refusals: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            style: HeaderStyle::Ietf,
            shadow_headers: false,
            retry_format: RetryAfterFormat::Seconds,
            jitter: 0.0,
            unavailable_retry: Duration::from_secs(1),
            decision_extension: true,
            // Opt-in: handlers get the handle from the router's state for nothing.
            limiter_extension: false,
            observer: None,
            bare_refusals: false,
        }
    }
}

/// One limit's request rules (by the engine's bound index).
pub(crate) struct PolicyLimit {
    pub(crate) limit: Limit,
    /// The start of this limit's `RateLimit` member, `"name";r=`.
    pub(crate) ietf_prefix: Box<str>,
    /// The window its policy reports for its configured quota, in seconds.
    pub(crate) window_secs: u64,
    /// Misconfigurations hit by requests: logged once (each response names the fix).
    pub(crate) misconfigured_log: LogOnce,
    /// What a request must carry for the key ([`KeyExtractor::describe`]), for the
    /// refusal of one without it.
    ///
    /// [`KeyExtractor::describe`]: crate::key::KeyExtractor::describe
    pub(crate) needs: Option<Box<str>>,
    /// Shadow "would refuse"s: logged once per [`SHADOW_LOG_EVERY`], with a count.
    pub(crate) shadow_log: LogThrottle,
}

impl PolicyLimit {
    pub(crate) fn new(limit: Limit) -> Self {
        Self {
            ietf_prefix: headers::limit_prefix(&limit.spec.name),
            window_secs: limit.spec.algorithm.window_secs(&limit.spec.quota),
            misconfigured_log: LogOnce::new(),
            needs: match limit.missing {
                MissingKey::Reject(_) | MissingKey::Unauthorized(_) => limit
                    .key
                    .describe()
                    .filter(|needs| !needs.is_empty())
                    .map(String::into_boxed_str),
                _ => None,
            },
            shadow_log: LogThrottle::new(),
            limit,
        }
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
    /// Whether a limit of the group holds its units until the response ends (in flight).
    pub(crate) held: bool,
    /// Whether an in-flight limit of the group is in delay mode (its requests queue).
    pub(crate) queued: bool,
    /// Whether a limit of the group is in delay mode.
    pub(crate) delayed: bool,
    /// Whether a limit of the group settles its cost when the response ends.
    pub(crate) settled: bool,
    /// Whether a limit of the group bans the keys it refuses too often.
    pub(crate) banned: bool,
    /// The limits of bytes that pace the group's response bodies (bound indices).
    pub(crate) paced: SmallVec<[usize; 1]>,
}

/// A layer's HTTP policy over its engine.
pub(crate) struct Policy {
    /// By the engine's bound index.
    pub(crate) limits: Vec<PolicyLimit>,
    /// Group 0 applies to requests that match no route entry.
    pub(crate) groups: Vec<Group>,
    pub(crate) routes: RouteTable,
    pub(crate) lists: Option<Lists>,
    pub(crate) options: Options,
    /// Refusal events, offenders, metrics, the audit log.
    pub(crate) hooks: Hooks,
}

/// The queues a request waits in: (bound index, key hash).
pub(crate) type QueueAt = SmallVec<[(usize, u64); 1]>;

/// The limits of bytes that pace a response body: bound index, the request's key.
pub(crate) type PacedKeys = SmallVec<[(usize, Key); 1]>;

/// Which bodies the layer can pace over the service it wraps (a route's limits of bytes
/// sent pace responses, those of bytes received pace requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Paces {
    pub(crate) responses: bool,
    pub(crate) requests: bool,
}

/// A request, prepared for the store.
pub(crate) struct Prepared {
    pub(crate) group: usize,
    pub(crate) plan: Plan,
    pub(crate) charge_keys: Option<Box<ChargeKeys>>,
    /// The plan indices and keys of the limits that settle their cost when the response
    /// ends.
    pub(crate) settle_keys: Option<Box<ChargeKeys>>,
    /// The limits of bytes that pace its response body, with its keys (bound indices).
    pub(crate) paced: Option<Box<PacedKeys>>,
}

impl Prepared {
    /// Nothing planned yet: [`Policy::prepare`] fills it in place (it is large, and a
    /// request's path moves nothing it need not).
    #[inline]
    pub(crate) fn empty() -> Self {
        Self {
            group: 0,
            plan: Plan::new(),
            charge_keys: None,
            settle_keys: None,
            paced: None,
        }
    }
}

/// Why a request does not go to the store.
pub(crate) enum Early<'a> {
    /// No limit applies (a safelisted client): the service is called as it is.
    Pass,
    /// The request is answered at once.
    Refuse(Rejection<'a>),
}

/// What the policy decided for a request that went to the store.
// Taken apart right after it is returned: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Next {
    /// Call the service, then add these fields to its response. `charged`: the plan
    /// indices of limits that charge only some outcomes and took their cost.
    Proceed {
        fields: Fields,
        charged: SmallVec<[usize; 1]>,
        /// Delay mode: the request waits this long for its reserved tokens first.
        /// (Boxed: delay mode is rare, and `Next` is moved on every request.)
        delay: Option<Box<Delay>>,
    },
    /// An enforcing limit refused (429), or a store failed under `Deny` (503).
    Refuse {
        decision: Decision,
        unavailable: bool,
        wait: Option<Duration>,
        fields: Fields,
    },
}

impl Policy {
    /// The key of the request `parts` for the bound limit `index`, by its extractor, as a
    /// stream's pacer takes it (`Limiter::pacer_for`): `None` when the request has no key
    /// and the limit skips such requests; the shared bucket of keyless requests otherwise.
    pub(crate) fn key_for(
        &self,
        index: usize,
        parts: &Parts,
    ) -> Result<Option<Key>, crate::limiter::LimiterError> {
        self.stream_key(index, parts)
            .map_err(|reason| crate::limiter::LimiterError::Unsupported {
                limit: format!("{} ({reason})", self.limits[index].limit.spec.name),
                operation: "key",
            })
    }

    /// [`Policy::key_for`], its error the extractor's reason.
    fn stream_key(&self, index: usize, parts: &Parts) -> Result<Option<Key>, &'static str> {
        let limit = &self.limits[index].limit;
        let mut builder = KeyBuilder::new();
        match limit.key.extract(parts, &mut builder) {
            Ok(()) => Ok(Some(builder.take())),
            Err(KeyError::Missing) => match limit.missing {
                MissingKey::Skip => Ok(None),
                _ => Ok(Some(Key::missing())),
            },
            Err(KeyError::Misconfigured(reason)) => Err(reason),
        }
    }

    /// The limits of bytes that pace the request or response body of a request of
    /// `group`, each with the request's key by its extractor (a limit that skips keyless
    /// requests paces none of them). `paces`: which of the service's body types can be
    /// paced; when one a limit would pace cannot, or an extractor is misconfigured, the
    /// request is refused (500, logged once per limit) rather than its bytes let through
    /// unpaced.
    pub(crate) fn paced_keys(
        &self,
        group: usize,
        parts: &Parts,
        paces: Paces,
    ) -> Result<PacedKeys, Early<'_>> {
        let mut keys = SmallVec::new();
        for &index in &self.groups[group].paced {
            let rules = &self.limits[index];
            let direction = rules.limit.spec.stream.direction.unwrap_or_default();
            let unpaced = if direction.counts_out() && !paces.responses {
                Some(
                    "the service's response body type cannot be paced by the layer (axum's and \
                     tonic's can; see `Follow::PACES`): wrap the body in `PacedBody` in the \
                     handler, and give the limit no route",
                )
            } else if direction.counts_in() && !paces.requests {
                Some(
                    "the service's request body type cannot be paced by the layer (axum's and \
                     tonic's can): wrap the body in `PacedBody` in the handler, and give the \
                     limit no route",
                )
            } else {
                None
            };
            if let Some(reason) = unpaced {
                log_misconfiguration(rules, reason);
                return Err(Early::Refuse(Rejection::Misconfigured {
                    limit: &rules.limit.spec.name,
                    reason,
                }));
            }
            match self.stream_key(index, parts) {
                Ok(Some(key)) => keys.push((index, key)),
                Ok(None) => {}
                Err(reason) => {
                    log_misconfiguration(rules, reason);
                    return Err(Early::Refuse(Rejection::Misconfigured {
                        limit: &rules.limit.spec.name,
                        reason,
                    }));
                }
            }
        }
        Ok(keys)
    }

    /// Extracts each limit's key, quota and cost into `items` and the plan.
    pub(crate) fn prepare<'a, St: Store>(
        &'a self,
        engine: &'a Engine<St>,
        parts: &Parts,
        items: &mut SmallVec<[Item<'a, St::Table>; 4]>,
        prepared: &mut Prepared,
        paces: Paces,
    ) -> Result<(), Early<'a>> {
        if let Some(lists) = &self.lists {
            match lists.classify(parts) {
                Ok(Listed::No) => {}
                Ok(Listed::Allowed) => return Err(Early::Pass),
                Ok(Listed::Denied) => {
                    return Err(Early::Refuse(Rejection::Blocked {
                        status: StatusCode::FORBIDDEN,
                    }));
                }
                Err(reason) => {
                    lists.log_misconfiguration(reason);
                    return Err(Early::Refuse(Rejection::Misconfigured {
                        limit: LISTS,
                        reason,
                    }));
                }
            }
        }
        let group = self.routes.group_for(parts);
        let g = &self.groups[group];
        prepared.group = group;
        for &index in &g.limits {
            let rules = &self.limits[index];
            let limit = &rules.limit;
            let mut builder = KeyBuilder::new();
            let key = match limit.key.extract(parts, &mut builder) {
                Ok(()) => builder.take(),
                Err(KeyError::Missing) => match limit.missing {
                    MissingKey::SharedBucket => Key::missing(),
                    MissingKey::Skip => continue,
                    MissingKey::Reject(_) | MissingKey::Unauthorized(_) => {
                        return Err(Early::Refuse(Rejection::MissingKey {
                            limit: &limit.spec.name,
                            status: limit.missing.status().unwrap_or(StatusCode::BAD_REQUEST),
                            needs: rules.needs.as_deref(),
                            challenge: limit.missing.challenge(),
                        }));
                    }
                },
                Err(KeyError::Misconfigured(reason)) => {
                    log_misconfiguration(rules, reason);
                    return Err(Early::Refuse(Rejection::Misconfigured {
                        limit: &limit.spec.name,
                        reason,
                    }));
                }
            };
            // A banned key is refused here, before the store (`engine/ban.rs`).
            if g.banned
                && let Some(retry_after) = engine.banned(index, &key)
            {
                let name = engine.bounds[index].name;
                self.hooks.banned(index, name, &key, parts, retry_after);
                return Err(Early::Refuse(Rejection::Banned {
                    limit: name,
                    status: limit.ban_status,
                    retry_after,
                }));
            }
            let quota = limit.quota_for(parts);
            let cost = limit.cost.resolve(parts);
            let key_hash = if self.options.jitter > 0.0 {
                key.stable_hash()
            } else {
                0
            };
            // Delay mode keeps every key: a request that goes away while it waits gives
            // its reservation back.
            if g.delayed
                || (g.charged && limit.charge.is_conditional())
                || (g.held && limit.spec.algorithm.is_in_flight())
            {
                prepared
                    .charge_keys
                    .get_or_insert_with(Default::default)
                    .push((prepared.plan.len(), key.clone()));
            }
            if g.settled && limit.settle.is_some() {
                prepared
                    .settle_keys
                    .get_or_insert_with(Default::default)
                    .push((prepared.plan.len(), key.clone()));
            }
            prepared.plan.push(Planned {
                bound: index,
                quota,
                cost,
                key_hash,
            });
            let mut item = engine.item(index, key, quota, cost);
            if g.banned && engine.bounds[index].bans.is_some() {
                // A store that shares bans says whether a key it refuses is banned.
                item = item.bans(true);
            }
            if let Some(w) = &engine.bounds[index].waiters
                && w.has_room()
                && tokio::runtime::Handle::try_current().is_ok()
            {
                let wait = max_wait_of(w.max_wait(), parts);
                item = item.max_wait(limit.spec.reservation_wait(&quota, wait));
            }
            items.push(item);
        }
        // Keyed before the store is asked: a request refused for them takes nothing.
        if !g.paced.is_empty() {
            prepared.paced = Some(Box::new(self.paced_keys(group, parts, paces)?));
        }
        Ok(())
    }

    /// The in-flight limits (plan indices and keys) whose units a request took, if it
    /// passes: those the store let through with a cost (read before `finish` takes the
    /// statuses; `None` for a group without in-flight limits).
    #[inline]
    pub(crate) fn held(&self, prepared: &Prepared, statuses: &Statuses) -> Option<ChargeKeys> {
        if !self.groups[prepared.group].held {
            return None;
        }
        self.held_units(prepared, statuses)
    }

    /// [`Policy::held`] for a group with in-flight limits.
    #[inline(never)]
    fn held_units(&self, prepared: &Prepared, statuses: &Statuses) -> Option<ChargeKeys> {
        let keys = prepared.charge_keys.as_deref()?;
        let held: ChargeKeys = keys
            .iter()
            .filter(|(i, _)| {
                let p = &prepared.plan[*i];
                let took = statuses
                    .get(*i)
                    .and_then(|s| s.outcome())
                    .is_some_and(|o| o.is_allowed());
                took && p.cost > 0 && self.limits[p.bound].limit.spec.algorithm.is_in_flight()
            })
            .cloned()
            .collect();
        (!held.is_empty()).then_some(held)
    }

    /// Whether a request of this group may wait in the queue of an in-flight limit.
    #[inline]
    pub(crate) fn queues(&self, prepared: &Prepared) -> bool {
        self.groups[prepared.group].queued
    }

    /// Delay mode of in-flight limits: the queues (bound index and key hash) a request
    /// the store refused waits in, if only in-flight limits in delay mode refused it;
    /// `None` otherwise (it is refused as usual).
    pub(crate) fn queue_for<St: Store>(
        &self,
        engine: &Engine<St>,
        prepared: &Prepared,
        statuses: &Statuses,
    ) -> Option<QueueAt> {
        if !self.groups[prepared.group].held {
            return None;
        }
        let keys = prepared.charge_keys.as_deref()?;
        let mut at = QueueAt::new();
        for (i, (p, s)) in prepared.plan.iter().zip(statuses).enumerate() {
            let bound = &engine.bounds[p.bound];
            let refused =
                bound.spec.mode == Mode::Enforce && s.outcome().is_some_and(|o| !o.is_allowed());
            if !refused {
                continue;
            }
            let queued =
                bound.queue.is_some() && s.outcome().is_some_and(|o| o.retry_after().is_some());
            let key = keys.iter().find(|(j, _)| *j == i).map(|(_, k)| k);
            match (queued, key) {
                (true, Some(key)) => at.push((p.bound, crate::engine::queue::key_hash(key))),
                _ => return None, // refused by a limit that does not queue
            }
        }
        (!at.is_empty()).then_some(at)
    }

    /// Delay mode of in-flight limits: the queues a request must wait in behind the
    /// requests of its key already waiting there (arrival order), before any check.
    pub(crate) fn waiting_ahead<St: Store>(
        &self,
        engine: &Engine<St>,
        prepared: &Prepared,
    ) -> Option<QueueAt> {
        if !self.groups[prepared.group].held {
            return None;
        }
        let keys = prepared.charge_keys.as_deref()?;
        let mut at = QueueAt::new();
        for (i, key) in keys.iter() {
            let bound = prepared.plan[*i].bound;
            if let Some(q) = &engine.bounds[bound].queue {
                let hash = crate::engine::queue::key_hash(key);
                if q.has_waiters(hash) {
                    at.push((bound, hash));
                }
            }
        }
        (!at.is_empty()).then_some(at)
    }

    /// A request the store refused as banned: a key banned in the shared store (by
    /// another instance, whose ban blocks the bucket) that this instance did not know
    /// of ([`Outcome::banned_for`](crate::Outcome)). The first enforcing limit whose
    /// outcome is a ban refuses it as [`Rejection::Banned`], with the ban's time, as a
    /// ban known here refuses before the store; the limit's ban table learns the ban, so
    /// the key's next requests are refused before the store. `None`: no limit's outcome
    /// is a ban (the store shares none, or the key is not banned).
    pub(crate) fn banned_by_store<St: Store>(
        &self,
        engine: &Engine<St>,
        prepared: &Prepared,
        statuses: &Statuses,
        parts: &Parts,
        keys: &(impl crate::web::hooks::Keys + ?Sized),
    ) -> Option<Rejection<'static>> {
        if !self.groups[prepared.group].banned {
            return None;
        }
        for (i, (p, s)) in prepared.plan.iter().zip(statuses).enumerate() {
            let bound = &engine.bounds[p.bound];
            let Some(remaining) = s.outcome().and_then(|o| o.ban()) else {
                continue;
            };
            if bound.spec.mode != Mode::Enforce {
                continue;
            }
            if let Some(key) = keys.key(i) {
                engine.banned_by_store(p.bound, key, remaining);
                self.hooks
                    .banned(p.bound, bound.name, key, parts, remaining);
            }
            return Some(Rejection::Banned {
                limit: bound.name,
                status: self.limits[p.bound].limit.ban_status,
                retry_after: remaining,
            });
        }
        None
    }

    /// Builds the decision from the store's answer and decides what happens to the request.
    pub(crate) fn finish<St: Store>(
        &self,
        engine: &Engine<St>,
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
                let bound = &engine.bounds[p.bound];
                LimitDecision {
                    name: bound.name,
                    quota: p.quota,
                    cost: p.cost,
                    mode: bound.spec.mode,
                    status,
                }
            })
            .collect();
        let mut decision = Decision { limits };
        let g = &self.groups[prepared.group];
        // Only a request its limits let through waits: a refused one took nothing (its
        // limits report the state they looked at, which may be in debt).
        let delay = if g.delayed && decision.overall() == Overall::Allowed {
            self.delay(engine, prepared, &mut decision).map(Box::new)
        } else {
            None
        };
        if g.shadow {
            for (i, (l, p)) in decision.limits().zip(plan).enumerate() {
                if l.mode() == Mode::Shadow && !l.allowed() {
                    log_shadow_refusal(&self.limits[p.bound], parts);
                    self.hooks.shadow_refused(i, p.bound, l, parts, keys);
                }
            }
        }
        self.hooks.decided(plan.iter().map(|p| p.bound), &decision);
        if let Some(observer) = &self.options.observer {
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
        if self.options.style != HeaderStyle::None {
            self.render(g, plan, &decision, wait, &mut fields);
        }
        match overall {
            Overall::Allowed => {
                let mut charged = SmallVec::new();
                if prepared.charge_keys.is_some() {
                    for (i, (l, p)) in decision.limits().zip(plan).enumerate() {
                        let consumed = p.cost > 0 && l.allowed() && l.outcome().is_some();
                        if consumed && self.limits[p.bound].limit.charge.is_conditional() {
                            charged.push(i);
                        }
                    }
                }
                if self.options.decision_extension {
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
                wait: Some(self.options.unavailable_retry),
                fields,
            },
        }
    }

    /// Delay mode: whether a request the store let through must wait for its reserved
    /// tokens, and the waiters' places it takes. A request that finds every place taken
    /// (it raced others for the last ones) gives its tokens back and is refused: the
    /// limits whose places were taken report a denial with the wait.
    fn delay<St: Store>(
        &self,
        engine: &Engine<St>,
        prepared: &Prepared,
        decision: &mut Decision,
    ) -> Option<Delay> {
        let waits = |(l, p): (&LimitDecision, &Planned)| {
            let waits = p.cost > 0 && engine.bounds[p.bound].waiters.is_some();
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
                let w = engine.bounds[p.bound].waiters.as_ref().expect("delay mode");
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
                    let conditional = self.limits[p.bound].limit.charge.is_conditional();
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
                engine.bounds[b]
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
        engine.release(&prepared.plan, &places, &consumed(true));
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

    /// The rate-limit fields of a decision.
    fn render(
        &self,
        g: &Group,
        plan: &[Planned],
        decision: &Decision,
        wait: Option<Duration>,
        fields: &mut Fields,
    ) {
        let report = |(l, p): (&LimitDecision, &Planned)| {
            if l.mode() != Mode::Enforce && !self.options.shadow_headers {
                return None;
            }
            let o = l.outcome()?;
            let limit = &self.limits[p.bound];
            let spec = &limit.limit.spec;
            let (remaining, next_after) = o.left();
            Some(Report {
                name: l.name,
                prefix: &limit.ietf_prefix,
                burst: l.quota.burst_size(),
                // A division: done again only for a quota chosen per request.
                window: if l.quota == spec.quota {
                    limit.window_secs
                } else {
                    spec.algorithm.window_secs(&l.quota)
                },
                remaining,
                next_after,
                reset_after: o.reset_after(),
                violated: l.denies(),
            })
        };
        // One limit, the usual case: its report on the stack, no list gathered.
        let one;
        let mut many: SmallVec<[Report<'_>; 4]>;
        let reports: &[Report<'_>] = if let ([l], [p]) = (&decision.limits[..], plan) {
            one = report((l, p));
            one.as_slice()
        } else {
            many = decision.limits().zip(plan).filter_map(report).collect();
            headers::keep_most_restrictive(&mut many);
            &many
        };
        let usual = reports.len() == g.reported
            && (!g.dynamic_quota
                || decision
                    .limits()
                    .zip(plan)
                    .all(|(l, p)| l.quota == self.limits[p.bound].limit.spec.quota));
        let policy = if usual { g.policy.as_ref() } else { None };
        headers::rate_limit_fields(
            self.options.style,
            reports,
            policy,
            SystemTime::now,
            wait,
            fields,
        );
    }

    /// The wait, lengthened by up to `jitter` of itself, by an amount fixed per client key.
    fn jittered(&self, plan: &[Planned], decision: &Decision, wait: Duration) -> Duration {
        if self.options.jitter <= 0.0 {
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
        wait + wait.mul_f64(self.options.jitter * fraction)
    }
}

/// Logs a misconfiguration at most once a minute per limit.
/// Logs a limit's misconfiguration once: the line is the 500's `detail`
/// ([`Rejection::Misconfigured`]), which every request it hits carries.
fn log_misconfiguration(rules: &PolicyLimit, reason: &str) {
    if rules.misconfigured_log.first() {
        let name = &*rules.limit.spec.name;
        tracing::error!(
            limit = name,
            "tollgate cannot apply limit {name:?}: {reason} (logged once; until this is \
             fixed, each request under this limit gets a 500 that says so)"
        );
    }
}

/// Logs that a shadow limit would have refused a request: the first time, then once per
/// [`SHADOW_LOG_EVERY`] per limit with the number of refusals in between, whatever the
/// flood.
fn log_shadow_refusal(rules: &PolicyLimit, parts: &Parts) {
    if let Some(suppressed) = rules.shadow_log.permit(SHADOW_LOG_EVERY) {
        tracing::info!(
            limit = &*rules.limit.spec.name,
            method = %parts.method,
            path = parts.uri.path(),
            more_since_last_line = suppressed,
            "shadow limit would refuse this request"
        );
    }
}
