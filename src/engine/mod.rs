//! The engine: limits bound to their tables in a store, whatever asks them. It binds and
//! checks [`LimitSpec`]s, makes the store's items for a key, quota and cost, gives tokens
//! back ([`refund`](Engine::refund)), and counts the requests that wait in delay mode
//! ([`delay::Waiters`]). It knows nothing of HTTP: the HTTP policy (`web/policy.rs`) and
//! the [`Limiter`](crate::Limiter) handle both drive it.

pub(crate) mod ban;
pub(crate) mod delay;
pub(crate) mod queue;
pub(crate) mod settle;

use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::algo::quota::Quota;
use crate::base::error::ConfigError;
use crate::base::intern::intern;
use crate::engine::delay::{WaitCounts, Waiters};
use crate::model::key::Key;
use crate::model::spec::LimitSpec;
use crate::store::{Checked, Item, Op, Statuses, Store};

/// The most limits a layer, a limiter or a rules file takes unless told otherwise
/// ([`RateLimitBuilder::max_limits`](crate::RateLimitBuilder::max_limits)): building is
/// linear in the number of limits, and each one keeps a table in the store.
pub const DEFAULT_MAX_LIMITS: usize = 1_000;

/// One limit, bound to its table in the store.
pub(crate) struct Bound<St: Store> {
    pub(crate) spec: LimitSpec,
    /// The limit's name, interned: decisions carry it without touching a shared count.
    pub(crate) name: &'static str,
    pub(crate) table: St::Table,
    /// Delay mode: the requests that wait.
    pub(crate) waiters: Option<Waiters>,
    /// Bans that escalate (`ban.rs`).
    pub(crate) bans: Option<ban::Banning<St::Table>>,
    /// Delay mode of an in-flight limit: the requests waiting for a unit (`queue.rs`).
    pub(crate) queue: Option<Arc<queue::Queue>>,
    /// `tollgate_settles_total` and `tollgate_settled_tokens_total`, registered at the
    /// limit's first settle (most limits never settle).
    pub(crate) settles: std::sync::OnceLock<crate::observe::probe::SettleMetrics>,
}

/// The limits of a layer or a limiter, bound to their store.
pub(crate) struct Engine<St: Store> {
    pub(crate) store: St,
    pub(crate) bounds: Vec<Bound<St>>,
    /// The first limit of each name: what the handle reaches by name.
    by_name: HashMap<&'static str, usize>,
    /// How many requests wait per limit name (shared with earlier versions of reloaded
    /// rules).
    waits: WaitCounts,
}

/// What is remembered of each checked limit while the store answers.
#[derive(Clone, Copy)]
pub(crate) struct Planned {
    pub(crate) bound: usize,
    pub(crate) quota: Quota,
    pub(crate) cost: u32,
    /// For Retry-After jitter: a hash of the key that is the same in every process.
    pub(crate) key_hash: u64,
}

pub(crate) type Plan = SmallVec<[Planned; 4]>;

/// Keys kept past the store's answer (by index into the plan): the limits that charge
/// only some outcomes, and the reservations of requests that wait, which go back if the
/// request does not proceed.
pub(crate) type ChargeKeys = SmallVec<[(usize, Key); 1]>;

impl<St: Store> Engine<St> {
    /// An engine with no limit yet; delay-mode limits count their waiters in `waits`.
    pub(crate) fn new(store: St, waits: WaitCounts, capacity: usize) -> Self {
        Self {
            store,
            bounds: Vec::with_capacity(capacity),
            by_name: HashMap::with_capacity(capacity),
            waits,
        }
    }

    /// Checks `spec` and binds it to its table: its index. Limits of one name share a
    /// table, so they must count alike. An error, too, if the name cannot be interned
    /// (the process has interned [`INTERN_BUDGET`](crate::base::intern::INTERN_BUDGET)
    /// bytes of distinct names already).
    pub(crate) fn bind(&mut self, spec: LimitSpec) -> Result<usize, ConfigError> {
        spec.validate()?;
        if let Err(reason) = self.store.supports(&spec.algorithm) {
            let field = if spec.algorithm.is_in_flight() {
                "in_flight"
            } else {
                "algorithm"
            };
            return Err(
                ConfigError::new(field, reason).within(format!("limits[{:?}]", &*spec.name))
            );
        }
        if let Some(&first) = self.by_name.get(&*spec.name) {
            let other = self.bounds[first].spec.algorithm;
            if other != spec.algorithm {
                return Err(ConfigError::new(
                    "algorithm",
                    format!(
                        "{:?} here, {:?} in another limit of the same name: limits that share buckets must count alike",
                        spec.algorithm, other
                    ),
                )
                .within(format!("limits[{:?}]", &*spec.name)));
            }
        }
        let Some(name) = intern(&spec.name) else {
            return Err(ConfigError::new(
                format!("limits[{:?}].name", &*spec.name),
                format!(
                    "this process has already kept {} MiB of distinct limit names (names live as long as the process): reuse names, or restart it to load more new ones",
                    crate::base::intern::INTERN_BUDGET >> 20
                ),
            ));
        };
        let bans = spec.ban.map(|b| ban::Banning {
            table: std::sync::Arc::new(ban::BanTable::new(
                name,
                b,
                self.store.ban_clock(),
                ban::DEFAULT_MAX_BAN_KEYS,
            )),
            bucket: std::sync::Arc::new(self.store.table(&spec.name)),
        });
        self.bounds.push(Bound {
            name,
            bans,
            table: self.store.table(&spec.name),
            // An in-flight limit's requests wait for a unit in its queue, not for an
            // instant.
            waiters: match spec.algorithm.is_in_flight() {
                true => None,
                false => Waiters::new(spec.on_limit, &spec.name, &self.waits),
            },
            queue: match spec.on_limit {
                crate::model::policy::OnLimit::Delay {
                    max_wait,
                    max_waiters,
                } if spec.algorithm.is_in_flight() => {
                    Some(Arc::new(queue::Queue::new(max_waiters, max_wait)))
                }
                _ => None,
            },
            settles: std::sync::OnceLock::new(),
            spec,
        });
        let index = self.bounds.len() - 1;
        self.by_name.entry(name).or_insert(index);
        Ok(index)
    }

    /// How many requests and streams of the limit called `name` wait (delay mode, and
    /// streams that wait for their units).
    pub(crate) fn wait_count(&self, name: &str) -> Arc<std::sync::atomic::AtomicUsize> {
        self.waits.of(name)
    }

    /// The store's item for `key` in limit `index`, with `quota` and `cost`.
    #[inline]
    pub(crate) fn item(
        &self,
        index: usize,
        key: Key,
        quota: Quota,
        cost: u32,
    ) -> Item<'_, St::Table> {
        let bound = &self.bounds[index];
        Item::new(&bound.table, key, quota, cost)
            .mode(bound.spec.mode)
            .on_failure(bound.spec.on_failure)
            .algorithm(bound.spec.algorithm)
            .lease(bound.spec.lease)
            .stripes(bound.spec.stripes)
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

    /// Gives back the cost of the limits `refunds` (plan indices and keys) of a request
    /// whose outcome does not count, whose response never came, or that will not proceed
    /// after reserving.
    pub(crate) fn refund(&self, plan: &[Planned], refunds: &[(usize, Key)]) {
        let items: SmallVec<[Item<'_, St::Table>; 2]> = refunds
            .iter()
            .map(|(i, key)| {
                let p = &plan[*i];
                self.item(p.bound, key.clone(), p.quota, p.cost)
            })
            .collect();
        self.store
            .apply(Op::Refund, &items)
            .finish_in_background("the cost of a request");
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

    /// The index of the limit called `name`.
    pub(crate) fn find(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The names of the limits, sorted.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.by_name.keys().copied().collect();
        names.sort();
        names
    }
}

/// The first name seen twice is an error.
pub(crate) fn unique_names<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(ConfigError::new(
                format!("limits[{name:?}].name"),
                "is used by two limits of the same request",
            ));
        }
    }
    Ok(())
}
