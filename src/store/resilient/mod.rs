//! [`Resilient`]: any [`Backend`] made a [`Store`] that never fails a request: a timeout
//! per call, a circuit breaker, each limit's failure policy with a local fallback limiter,
//! and a local cache of denials.
//!
//! Here: the type, its settings, its tables and the [`Store`] impl. Each concern in its
//! own file: a call's timeout, the breaker glue and settling its answer (`calls.rs`); the
//! deny cache (`deny.rs`); the write-back list (`write_back.rs`); the failure policies,
//! shares and their charge-back (`share.rs`, the debts in `owed.rs`); in-flight units held
//! and released (`in_flight.rs`, the counts in `held.rs`); lease mode's glue (`leased.rs`,
//! its state in `lease.rs`).

mod calls;
mod deny;
mod held;
mod in_flight;
mod lease;
mod leased;
mod owed;
mod share;
mod traffic;
mod write_back;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use smallvec::SmallVec;

use super::breaker::{Breaker, Permit};
use super::memory::{DEFAULT_MAX_KEYS, MemoryStore, MemoryTable};
use super::rtt::RoundTrips;
use super::{Backend, Checked, Item, Op, Statuses, Store};
use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::base::clock::{Clock, SharedClock};
use crate::model::decision::Status;
use crate::model::key::Key;
use crate::model::policy::{FailurePolicy, Mode};
// `lease.rs` reads these as `super::`.
use deny::{cached_outcome, quota_salt};
pub use lease::LeaseStats;
use lease::{Counters, LeaseTable};
use write_back::WriteBack;

/// Keys the deny cache remembers at most.
const DENY_CACHE_MAX_KEYS: usize = 100_000;
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
const DEFAULT_BREAKER_FAILURES: u32 = 3;
const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(1);

/// A [`Backend`] (a store that can fail) made a [`Store`] whose every answer is a decision.
///
/// - **Timeout**: each call has one (default 50 ms); running out counts as a failure.
/// - **Breaker**: after 3 consecutive failures (default) the backend is skipped for a
///   cool-down (default 1 s), then one request probes it; success closes the breaker.
///   Opening and closing are logged once each (`WARN` / `INFO`), single failures at
///   `DEBUG`. While it is open a failing backend costs microseconds per request.
/// - **Failure policies**: when the backend fails, each limit's [`FailurePolicy`] decides:
///   `Fallback` (default) applies the same operation to a local [`MemoryStore`] with the
///   same quota (bounded like any memory store, see
///   [`fallback_max_keys`](Self::fallback_max_keys)), `Allow` lets the request pass,
///   `Deny` refuses it (503). A refused request consumes nothing anywhere.
/// - **Deny cache** (on by default, up to 100,000 keys): a key the backend refused is
///   refused locally, without a call, until it could pass a request of cost 1. The
///   deadline is counted from the moment the call was sent, so it is never later than the
///   backend's. After it, requests take their tokens from the deadline on, as the
///   backend's bucket would (GCRA), and only those that find tokens are sent: a key
///   refused far over its limit costs about one call per token it can be granted, not one
///   per request until the backend's next answer comes back. These claims follow only this
///   store's own requests, so the backend's bucket is never behind them and nothing it
///   would allow is refused locally. Tokens given back meanwhile (a refund or a reset on
///   another instance) can make the backend allow earlier: the key then waits at most
///   until the deadline. A reset or refund through *this* store updates the cache at once,
///   a block once the backend has applied it.
///
/// The breaker, the fallback and the deny cache run on one clock, by default the
/// [`CpuClock`](crate::clock::CpuClock); [`clock`](Self::clock) injects another (a
/// [`FakeClock`](crate::clock::FakeClock) in tests, which then need no sleeps).
///
/// ```
/// use std::time::Duration;
/// # use tollgate::store::{Backend, Item, Op, Statuses, StoreError};
/// # #[derive(Clone)] struct MyBackend;
/// # impl Backend for MyBackend {
/// #     type Table = ();
/// #     type Future = std::future::Ready<Result<Statuses, StoreError>>;
/// #     fn table(&self, _: &str) {}
/// #     fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
/// #         std::future::ready(Err(StoreError::new("down")))
/// #     }
/// # }
/// use tollgate::store::Resilient;
///
/// let store = Resilient::new(MyBackend)
///     .timeout(Duration::from_millis(20))
///     .breaker(5, Duration::from_secs(2));
/// # let _ = store;
/// ```
///
/// Configure the store before building layers or limiters with it: their tables are made
/// then, and clones made earlier keep the earlier settings.
///
/// [`FailurePolicy`]: crate::FailurePolicy
pub struct Resilient<B> {
    inner: Arc<Inner<B>>,
}

impl<B: Clone> Clone for Resilient<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

#[derive(Clone)]
pub(super) struct Inner<B> {
    pub(super) backend: B,
    /// The clock of the breaker and the local stores.
    pub(super) clock: SharedClock,
    timeout: Duration,
    breaker: Arc<Breaker>,
    fallback_max_keys: usize,
    fallback: MemoryStore<SharedClock>,
    deny_cache: Option<MemoryStore<SharedClock>>,
    metrics: crate::observe::probe::StoreMetrics,
    /// Keys the leases of every table hold, and what lease mode did.
    lease_keys: Arc<AtomicUsize>,
    lease_counters: Arc<Counters>,
    /// The lease table of each limit name: limits (or layers) with the same name share
    /// one, so an instance holds at most `L` of a key however many tables name it (and
    /// [`lease_stats`](Resilient::lease_stats) reads them).
    lease_by_name:
        Arc<std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<LeaseTable>>>>,
    /// The backend's reset count this store has answered, and the keys it would write
    /// back at the next.
    seen_resets: Arc<std::sync::atomic::AtomicU64>,
    refused: Arc<std::sync::Mutex<WriteBack>>,
    /// `tollgate_writeback_dropped_total{store}`.
    writeback_dropped: crate::observe::probe::Counter,
    /// The round trips of the calls answered, which size each call's timeout.
    rtt: Arc<RoundTrips>,
    /// When a call was last answered (the store's clock): a timeout after it is a busy
    /// client, not a backend that does not answer.
    answered_at: Arc<std::sync::atomic::AtomicU64>,
    /// Whether a call was sent yet: the backend's silence is counted from the first one,
    /// not from the store's creation (a server may start long before its first request).
    called: Arc<std::sync::atomic::AtomicBool>,
    /// What `Share` granted locally while the backend could not be reached, charged to
    /// the shared buckets once it answers.
    owed: Arc<owed::Owed>,
    /// In-flight units the backend granted this instance, by key: where releases go.
    held: Arc<held::Held>,
    /// How much of each key's traffic this instance served while the backend answered:
    /// its share while it does not.
    traffic: Arc<traffic::Traffic>,
}

impl<B> Inner<B> {
    fn fallback_store(&self) -> MemoryStore<SharedClock> {
        MemoryStore::with_clock(self.clock.clone())
            .without_key_metrics()
            .max_keys(self.fallback_max_keys)
    }

    fn deny_cache_store(&self) -> MemoryStore<SharedClock> {
        MemoryStore::with_clock(self.clock.clone())
            .without_key_metrics()
            .max_keys(DENY_CACHE_MAX_KEYS)
    }
}

/// One limit's buckets in a [`Resilient`] store: the backend's table, and the local ones.
pub struct ResilientTable<T> {
    inner: T,
    fallback: MemoryTable,
    deny: Option<MemoryTable>,
    /// `tollgate_deny_cache_hits_total{limit}`.
    deny_hits: crate::observe::probe::Counter,
    /// The tokens this instance holds for the limit's keys (lease mode).
    leases: Arc<LeaseTable>,
}

impl<T: fmt::Debug> fmt::Debug for ResilientTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilientTable")
            .field("backend", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<B: fmt::Debug> fmt::Debug for Resilient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resilient")
            .field("backend", &self.inner.backend)
            .field("timeout", &self.inner.timeout)
            .field("deny_cache", &self.inner.deny_cache.is_some())
            .field("breaker_open", &self.inner.breaker.is_open())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Resilient<B> {
    /// `backend` with the default timeout (50 ms), breaker (3 failures, 1 s cool-down),
    /// fallback store and deny cache, on the default clock ([`CpuClock`](crate::clock::CpuClock)).
    pub fn new(backend: B) -> Self {
        let clock = SharedClock::default();
        Self {
            inner: Arc::new(Inner {
                timeout: DEFAULT_TIMEOUT,
                breaker: Arc::new(Breaker::new(DEFAULT_BREAKER_FAILURES, DEFAULT_COOL_DOWN)),
                fallback_max_keys: DEFAULT_MAX_KEYS,
                fallback: MemoryStore::with_clock(clock.clone()).without_key_metrics(),
                deny_cache: Some(
                    MemoryStore::with_clock(clock.clone())
                        .without_key_metrics()
                        .max_keys(DENY_CACHE_MAX_KEYS),
                ),
                metrics: crate::observe::probe::StoreMetrics::new(backend.name()),
                lease_keys: Arc::default(),
                lease_counters: Arc::default(),
                lease_by_name: Arc::default(),
                seen_resets: Arc::default(),
                refused: Arc::default(),
                writeback_dropped: crate::observe::probe::writeback_dropped(backend.name()),
                rtt: Arc::default(),
                answered_at: Arc::new(std::sync::atomic::AtomicU64::new(clock.now())),
                called: Arc::default(),
                owed: Arc::default(),
                held: Arc::default(),
                traffic: Arc::default(),
                backend,
                clock,
            }),
        }
    }

    pub(super) fn configure(mut self, f: impl FnOnce(&mut Inner<B>)) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => f(inner),
            None => {
                let mut inner = (*self.inner).clone();
                f(&mut inner);
                self.inner = Arc::new(inner);
            }
        }
        self
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// Runs the breaker, the fallback limiter and the deny cache on `clock` (default: the
    /// [`CpuClock`](crate::clock::CpuClock)).
    pub fn clock(self, clock: impl Clock) -> Self {
        let clock = SharedClock::new(clock);
        self.configure(|i| {
            i.answered_at = Arc::new(std::sync::atomic::AtomicU64::new(clock.now()));
            i.clock = clock;
            i.fallback = i.fallback_store();
            i.deny_cache = i.deny_cache.is_some().then(|| i.deny_cache_store());
        })
    }

    /// How long one call may take before it counts as a failure (default 50 ms).
    pub fn timeout(self, timeout: Duration) -> Self {
        self.configure(|i| i.timeout = timeout)
    }

    /// After `failures` consecutive failures (default 3), skip the backend for `cool_down`
    /// (default 1 s), then let one request probe it.
    pub fn breaker(self, failures: u32, cool_down: Duration) -> Self {
        let breaker = Arc::new(Breaker::new(failures, cool_down));
        self.configure(|i| i.breaker = breaker)
    }

    /// Whether denials are remembered locally until they expire (default: yes, up to
    /// 100,000 keys).
    pub fn deny_cache(self, enabled: bool) -> Self {
        self.configure(|i| i.deny_cache = enabled.then(|| i.deny_cache_store()))
    }

    /// The key cap of the local limiter used by limits whose policy is
    /// [`FailurePolicy::Fallback`] while the backend fails (default
    /// [`DEFAULT_MAX_KEYS`](super::DEFAULT_MAX_KEYS), as any [`MemoryStore`]).
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn fallback_max_keys(self, n: usize) -> Self {
        assert!(n > 0, "fallback_max_keys must be at least 1");
        self.configure(|i| {
            i.fallback_max_keys = n;
            i.fallback = i.fallback_store();
        })
    }

    /// `true` while the breaker skips the backend.
    pub fn is_unavailable(&self) -> bool {
        self.inner.breaker.is_open()
    }

    /// What lease mode did so far (limits with a [`Lease`](crate::Lease)): checks decided
    /// here without a call, leases taken and tokens given back.
    pub fn lease_stats(&self) -> LeaseStats {
        let tables = self
            .inner
            .lease_by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Held until the counts are read: a table dropped meanwhile would be counted twice
        // (its decisions move into the store's counts when it goes).
        let live: Vec<Arc<LeaseTable>> = tables
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        drop(tables);
        let mut decided = lease::Decisions::default();
        for table in &live {
            decided.add(table.decisions());
        }
        self.inner.lease_counters.snapshot(decided)
    }
}

/// What one item of a call needs once the backend answers.
struct Part {
    key: Key,
    quota: Quota,
    cost: u32,
    mode: Mode,
    policy: FailurePolicy,
    algorithm: Algorithm,
    max_wait: Duration,
    fallback: MemoryTable,
    deny: Option<MemoryTable>,
    /// The limit's table for calls made later (a write-back after a reset).
    remote: Arc<LeaseTable>,
}

/// Whether an item refuses the call, given its status.
fn refuses(status: &Status, mode: Mode) -> bool {
    mode == Mode::Enforce
        && match status {
            Status::Checked(o) | Status::Fallback(o) => !o.is_allowed(),
            Status::FailedClosed => true,
            _ => false,
        }
}

impl<B: Backend> Resilient<B> {
    /// What an item needs once the backend answers, owned.
    fn part(&self, item: &Item<'_, ResilientTable<B::Table>>) -> Part {
        Part {
            key: item.key.clone(),
            quota: item.quota,
            cost: item.cost,
            mode: item.mode,
            policy: item.on_failure,
            algorithm: item.algorithm,
            max_wait: item.max_wait,
            fallback: item.table.fallback.clone(),
            deny: item.table.deny.clone(),
            remote: item.table.leases.clone(),
        }
    }
}

impl<B: Backend> Store for Resilient<B> {
    type Table = ResilientTable<B::Table>;
    type Future = Pin<Box<dyn Future<Output = Statuses> + Send>>;

    fn supports(&self, algorithm: &crate::algo::algorithm::Algorithm) -> Result<(), &'static str> {
        self.inner.backend.supports(algorithm)
    }

    fn table(&self, name: &str) -> Self::Table {
        let inner = &*self.inner;
        ResilientTable {
            inner: inner.backend.table(name),
            fallback: inner.fallback.table(name),
            deny: inner.deny_cache.as_ref().map(|c| c.table(name)),
            deny_hits: crate::observe::probe::deny_cache_hits(name),
            leases: self.lease_table(name),
        }
    }

    /// The backend's shared bans (not while the breaker is open: the engine's own table
    /// decides meanwhile).
    fn ban(
        &self,
        table: &Self::Table,
        key: &Key,
        call: crate::store::BanCall,
    ) -> Option<crate::store::BanFuture> {
        if self.is_unavailable() {
            return None;
        }
        self.inner.backend.ban(&table.inner, key, call)
    }

    fn ban_clock(&self) -> SharedClock {
        self.inner.clock.clone()
    }

    fn apply(&self, op: Op, items: &[Item<'_, Self::Table>]) -> Checked<Self::Future> {
        if items.is_empty() {
            return Checked::Ready(Statuses::new());
        }
        let op = match op {
            // A backend that does not know the op is sent it as what it does.
            Op::PenalizeOnce { .. } if !self.inner.backend.penalizes_once() => Op::Penalize,
            op => op,
        };
        if op == Op::Refund && items.iter().any(|i| i.algorithm.is_in_flight()) {
            return self.release(items);
        }
        self.write_back_after_reset();
        if op == Op::Check
            && items.iter().any(|i| i.lease.is_some())
            && let Some(answer) = self.leased(items)
        {
            return answer;
        }
        if op == Op::Check {
            if let Some(statuses) = self.cached_denial(items) {
                return Checked::Ready(statuses);
            }
        } else {
            self.update_deny_cache(op, items);
        }
        let parts: SmallVec<[Part; 4]> = items.iter().map(|item| self.part(item)).collect();
        if self.inner.breaker.permit(self.inner.clock.now()) == Permit::Skip {
            return Checked::Ready(self.on_failure(op, &parts, true));
        }
        let backend_items: SmallVec<[Item<'_, B::Table>; 4]> = items
            .iter()
            .map(|item| item.on(&item.table.inner).lease(None))
            .collect();
        let call = self.inner.backend.apply(op, &backend_items);
        Checked::Pending(Box::pin(self.clone().run(op, parts, call)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    /// A backend that is down: only its tables matter here.
    #[derive(Clone, Debug)]
    pub(super) struct Down;

    impl Backend for Down {
        type Table = ();
        type Future = std::future::Ready<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::ready(Err(StoreError::new("down")))
        }
    }

    /// A backend that notes the operations it is sent, and fails them.
    #[derive(Clone, Default)]
    struct Noting {
        ops: Arc<std::sync::Mutex<Vec<Op>>>,
        once: bool,
    }

    impl Backend for Noting {
        type Table = ();
        type Future = std::future::Ready<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, op: Op, _: &[Item<'_, ()>]) -> Self::Future {
            self.ops.lock().unwrap().push(op);
            std::future::ready(Err(StoreError::new("noted")))
        }
        fn penalizes_once(&self) -> bool {
            self.once
        }
    }

    /// `Op::PenalizeOnce` reaches a backend that applies a charge once per id as it is; one
    /// that cannot is sent an `Op::Penalize` (never an operation it does not know).
    #[tokio::test]
    async fn a_charge_with_an_id_reaches_only_a_backend_that_knows_ids() {
        for once in [true, false] {
            let backend = Noting {
                once,
                ..Noting::default()
            };
            let store = Resilient::new(backend.clone());
            let table = store.table("api");
            let item = Item::new(
                &table,
                crate::model::key::Key::from_part("k"),
                crate::algo::quota::Quota::per_second(1),
                1,
            );
            if let Checked::Pending(f) = store.apply(Op::PenalizeOnce { id: 9 }, &[item]) {
                f.await;
            }
            let sent = backend.ops.lock().unwrap().clone();
            let expected = if once {
                Op::PenalizeOnce { id: 9 }
            } else {
                Op::Penalize
            };
            assert_eq!(sent, [expected], "penalizes_once: {once}");
        }
    }

    /// A check refused by one of its limits spends nothing of the others, also when the
    /// refusal is a limit that fails closed while the backend is down: the limit that
    /// falls back keeps its one token.
    #[tokio::test]
    async fn a_check_refused_by_a_limit_failing_closed_spends_nothing_locally() {
        let store = Resilient::new(Down);
        let (closed, open) = (store.table("closed"), store.table("open"));
        let item = |table, policy| {
            Item::new(table, Key::from_part("k"), Quota::per_hour(1), 1).on_failure(policy)
        };
        let check = |items: &[Item<'_, ResilientTable<()>>]| match store.apply(Op::Check, items) {
            Checked::Ready(s) => {
                Box::pin(std::future::ready(s)) as Pin<Box<dyn Future<Output = _>>>
            }
            Checked::Pending(f) => f,
        };
        let both = check(&[
            item(&closed, FailurePolicy::Deny),
            item(&open, FailurePolicy::Fallback),
        ])
        .await;
        assert_eq!(both[0], Status::FailedClosed);
        let alone = check(&[item(&open, FailurePolicy::Fallback)]).await;
        assert!(
            matches!(alone[0], Status::Fallback(o) if o.is_allowed()),
            "the refused check spent the fallback's token: {alone:?}"
        );
    }

    /// The store keeps the limits its backend keeps: a backend that cannot hold in-flight
    /// units makes an in-flight limit a configuration error, not a limit never enforced.
    #[test]
    fn the_store_keeps_only_what_its_backend_keeps() {
        let store = Resilient::new(Down);
        assert!(store.supports(&Algorithm::in_flight()).is_err());
        assert!(store.supports(&Algorithm::Gcra).is_ok());
    }

    /// What the store prints: its backend, timeout, deny cache and breaker; a table, its
    /// backend's table.
    #[test]
    fn debug_shows_the_backend_the_timeout_and_the_breaker() {
        let store = Resilient::new(Down);
        let table = format!("{:?}", store.table("api"));
        assert!(table.starts_with("ResilientTable { backend: ()"), "{table}");
        let shown = format!("{store:?}");
        for part in [
            "Resilient",
            "backend: Down",
            "timeout: 50ms",
            "breaker_open: false",
        ] {
            assert!(shown.contains(part), "{part} in {shown}");
        }
    }

    /// tokio's clock, as the store's: it moves with the paused time, from 0 at `start`.
    #[derive(Clone)]
    pub(super) struct Tokio(tokio::time::Instant);

    impl Tokio {
        pub(super) fn start() -> Self {
            Tokio(tokio::time::Instant::now())
        }
    }

    impl crate::base::clock::Clock for Tokio {
        fn now(&self) -> u64 {
            self.0.elapsed().as_nanos() as u64
        }
    }

    /// A backend that never answers: every call times out.
    #[derive(Clone)]
    pub(super) struct Silent;

    impl Backend for Silent {
        type Table = ();
        type Future = std::future::Pending<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::pending()
        }
    }
}
