//! `SimBackend`: a shared store simulated in the test's process, with its faults.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::base::clock::Clock;
use crate::model::key::{IntoKey, Key};
use crate::model::policy::Mode;
use crate::store::{
    Backend, Checked, Item, MemoryStore, MemoryTable, Op, Resilient, Statuses, Store, StoreError,
};

use super::book::Escrowed;
use super::clock::TokioClock;

/// The latency each way unless set: a store in the same data centre.
const DEFAULT_LATENCY: Duration = Duration::from_micros(200);

/// How long after a loss of state the instances notice it unless set: Redis's probe
/// looks once a second, so within half a second on average.
const DEFAULT_NOTICED_AFTER: Duration = Duration::from_millis(500);

/// A shared store (Redis, say) simulated in the test's process, on tokio's clock: each
/// call takes its time each way, and the test makes it fail, go silent, lose its state or
/// come back from an older snapshot at the instant it chooses.
///
/// It is a [`Backend`]: [`store`](Self::store) makes an instance's
/// [`Resilient`] store over it (the same timeout, breaker, failure policies, deny cache
/// and leases as a `RedisStore`), and every instance made from one `SimBackend` (or its
/// clones) shares its buckets. With tokio's clock paused (`#[tokio::test(start_paused =
/// true)]`) a test of seconds of traffic runs in milliseconds and gives the same figures
/// every time.
///
/// What a call does, on the backend's [`TokioClock`]:
///
/// 1. it travels [`latency`](SimBackendBuilder::latency) to the server;
/// 2. there, while [`black_hole`](Self::black_hole) is on, it never answers; while
///    [`outage`](Self::outage) is on, it fails (`connection refused`); otherwise the
///    server applies it to its buckets (a memory store's, so every algorithm a
///    `MemoryStore` keeps is kept);
/// 3. the answer travels `latency` back. A caller that gave up meanwhile (its timeout)
///    gets no answer, but the operation *was* applied: a late answer, as a real server's.
///
/// A charge-back sent again after its answer was lost is applied once: the server
/// remembers each [`Op::PenalizeOnce`] id per bucket for
/// [`PENALIZE_ONCE_FOR`](crate::store::PENALIZE_ONCE_FOR), as Redis's marker keys do
/// (lost with the buckets).
///
/// A [`wipe`](Self::wipe) (a restart without persistence) and a
/// [`restore`](Self::restore) (a restart from an older snapshot) are losses of state,
/// which the instances notice [`loss_noticed_after`](SimBackendBuilder::loss_noticed_after)
/// later (as a `RedisStore`'s probe does): their `Resilient` store then writes back what
/// it remembers of the keys it saw spent.
///
/// ```
/// use std::time::Duration;
/// use tollgate::testing::SimBackend;
/// use tollgate::{LimitSpec, Limiter, Quota};
///
/// #[tokio::main(flavor = "current_thread", start_paused = true)]
/// async fn main() {
///     let backend = SimBackend::builder()
///         .latency(Duration::from_millis(1))
///         .instances(2)
///         .build();
///     let spec = LimitSpec::new("api", Quota::per_hour(10));
///     let [a, b] = [backend.store(), backend.store()]
///         .map(|store| Limiter::builder(store).limit(spec.clone()).build().unwrap());
///
///     // Both instances spend one shared bucket.
///     for _ in 0..5 {
///         assert!(a.check("api", "alice", 1).await.unwrap().allowed());
///         assert!(b.check("api", "alice", 1).await.unwrap().allowed());
///     }
///     assert!(!a.check("api", "alice", 1).await.unwrap().allowed());
///     assert_eq!(backend.remaining("api", "alice", Quota::per_hour(10)), 0);
///     assert_eq!(backend.calls(), 11);
/// }
/// ```
#[derive(Clone)]
pub struct SimBackend {
    clock: TokioClock,
    state: Arc<Mutex<State>>,
}

/// The settings of a [`SimBackend`]: [`SimBackend::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct SimBackendBuilder {
    latency: Duration,
    instances: u64,
    noticed_after: Duration,
    clock: Option<TokioClock>,
}

impl Default for SimBackendBuilder {
    fn default() -> Self {
        Self {
            latency: DEFAULT_LATENCY,
            instances: 1,
            noticed_after: DEFAULT_NOTICED_AFTER,
            clock: None,
        }
    }
}

impl SimBackendBuilder {
    /// The time a call takes each way (default 200 µs): a round trip is twice this. A
    /// `Resilient` store's timeout is 50 ms unless set, so a latency of 25 ms or more
    /// makes every call late. Change it mid-test with [`SimBackend::set_latency`].
    pub fn latency(mut self, one_way: Duration) -> Self {
        self.latency = one_way;
        self
    }

    /// How many instances share the backend (default 1): what
    /// [`Backend::instances`] answers (a limit whose failure policy is
    /// [`Share`](crate::FailurePolicy::Share) spends `1/n` of its quota on each instance
    /// while the backend fails, for a key the instance knows no traffic of), and how many
    /// stores [`SimBackend::stores`] makes.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn instances(mut self, n: u64) -> Self {
        assert!(n > 0, "a backend has at least one instance");
        self.instances = n;
        self
    }

    /// How long after a [`wipe`](SimBackend::wipe) or a [`restore`](SimBackend::restore)
    /// the instances notice it (default 500 ms, a `RedisStore`'s probe on average).
    pub fn loss_noticed_after(mut self, d: Duration) -> Self {
        self.noticed_after = d;
        self
    }

    /// The clock the backend and its stores read (default: a [`TokioClock`] created by
    /// [`build`](Self::build)).
    pub fn clock(mut self, clock: TokioClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The backend, answering (no fault), its buckets empty. Call it inside the runtime
    /// (tokio's clock is read).
    pub fn build(self) -> SimBackend {
        let clock = self.clock.unwrap_or_default();
        SimBackend {
            state: Arc::new(Mutex::new(State {
                live: Buckets::new(&clock),
                snapshot: Some(Buckets::new(&clock)),
                frozen: false,
                latency: self.latency,
                failing: false,
                black_hole: false,
                losses: Vec::new(),
                noticed_after: u64::try_from(self.noticed_after.as_nanos()).unwrap_or(u64::MAX),
                instances: self.instances,
                calls: 0,
                escrow: Escrowed::new(),
            })),
            clock,
        }
    }
}

/// The server's state and the conditions of the network.
pub(super) struct State {
    pub(super) live: Buckets,
    /// A copy kept in step with `live` until frozen: the snapshot a restore brings back.
    snapshot: Option<Buckets>,
    frozen: bool,
    /// Each way.
    latency: Duration,
    failing: bool,
    black_hole: bool,
    /// When the server lost its state (wipes, restores), on the clock.
    losses: Vec<u64>,
    noticed_after: u64,
    instances: u64,
    calls: u64,
    /// What a region's mover keeps in this server (`regions.rs`): demand, transfers, lead.
    pub(super) escrow: Escrowed,
}

/// A server's buckets: a memory store and its tables (held, so the buckets live).
pub(super) struct Buckets {
    store: MemoryStore<TokioClock>,
    tables: HashMap<String, MemoryTable>,
    /// The [`Op::PenalizeOnce`] applied, by (table, key, id): until when each is
    /// remembered, on the clock (as Redis's marker keys, lost with the buckets).
    once: HashMap<(String, Key, u64), u64>,
    clock: TokioClock,
}

impl Buckets {
    fn new(clock: &TokioClock) -> Self {
        Self {
            store: MemoryStore::with_clock(*clock).unbounded(),
            tables: HashMap::new(),
            once: HashMap::new(),
            clock: *clock,
        }
    }

    pub(super) fn apply(&mut self, op: Op, calls: &[Call]) -> Statuses {
        if let Op::PenalizeOnce { id } = op {
            // Per item: a charge seen is a look; a new one a penalty, remembered.
            let now = self.clock.now();
            let ttl = u64::try_from(crate::store::PENALIZE_ONCE_FOR.as_nanos()).unwrap_or(u64::MAX);
            self.once.retain(|_, until| *until > now);
            return calls
                .iter()
                .map(|c| {
                    let marker = (c.table.clone(), c.key.clone(), id);
                    let seen = match self.once.entry(marker) {
                        std::collections::hash_map::Entry::Occupied(_) => true,
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(now.saturating_add(ttl));
                            false
                        }
                    };
                    if seen {
                        let look = Call {
                            cost: 0,
                            ..c.clone()
                        };
                        self.apply(Op::Check, &[look]).swap_remove(0)
                    } else {
                        self.apply(Op::Penalize, std::slice::from_ref(c))
                            .swap_remove(0)
                    }
                })
                .collect();
        }
        for c in calls {
            if !self.tables.contains_key(&c.table) {
                let t = self.store.table(&c.table);
                self.tables.insert(c.table.clone(), t);
            }
        }
        let items: Vec<Item<'_, MemoryTable>> = calls
            .iter()
            .map(|c| {
                Item::new(&self.tables[&c.table], c.key.clone(), c.quota, c.cost)
                    .mode(c.mode)
                    .algorithm(c.algorithm)
                    .max_wait(c.max_wait)
            })
            .collect();
        match self.store.apply(op, &items) {
            Checked::Ready(s) => s,
            Checked::Pending(_) => unreachable!("a memory store answers at once"),
        }
    }
}

/// What one item of a call carries to the server.
#[derive(Clone)]
pub(super) struct Call {
    pub(super) table: String,
    pub(super) key: Key,
    pub(super) quota: Quota,
    pub(super) cost: u32,
    mode: Mode,
    algorithm: Algorithm,
    max_wait: Duration,
}

impl Call {
    /// A GCRA call of `cost` on `key` of `table` under `quota`.
    pub(super) fn gcra(table: &str, key: Key, quota: Quota, cost: u32) -> Self {
        Self {
            table: table.to_owned(),
            key,
            quota,
            cost,
            mode: Mode::Enforce,
            algorithm: Algorithm::Gcra,
            max_wait: Duration::ZERO,
        }
    }
}

impl State {
    /// Applies `op` to the live buckets, and to the snapshot while it follows them.
    pub(super) fn apply(&mut self, op: Op, calls: &[Call]) -> Statuses {
        if !self.frozen
            && let Some(snap) = &mut self.snapshot
        {
            snap.apply(op, calls);
        }
        self.live.apply(op, calls)
    }
}

impl Default for SimBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl SimBackend {
    /// A backend with the default settings (one instance, 200 µs each way); see
    /// [`builder`](Self::builder). Call it inside the runtime.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// The settings: latency, instances, when a loss is noticed, the clock.
    pub fn builder() -> SimBackendBuilder {
        SimBackendBuilder::default()
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The clock the backend reads, and its stores.
    pub fn clock(&self) -> &TokioClock {
        &self.clock
    }

    /// One instance's store: a [`Resilient`] store over this backend with the defaults
    /// (50 ms timeout, a breaker of 3 failures and 1 s), on the backend's clock. Set
    /// others with `Resilient`'s own methods (`backend.store().timeout(..)`). Each call
    /// is a new instance (its own breaker, leases, fallback and deny cache); they all
    /// share the backend's buckets.
    pub fn store(&self) -> Resilient<Self> {
        Resilient::new(self.clone()).clock(self.clock)
    }

    /// One [`store`](Self::store) for each of the [`instances`](SimBackendBuilder::instances).
    ///
    /// ```
    /// use tollgate::testing::SimBackend;
    /// use tollgate::{LimitSpec, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let backend = SimBackend::builder().instances(3).build();
    /// let fleet: Vec<Limiter> = backend
    ///     .stores()
    ///     .into_iter()
    ///     .map(|store| {
    ///         Limiter::builder(store)
    ///             .limit(LimitSpec::new("api", Quota::per_hour(10)))
    ///             .build()
    ///             .unwrap()
    ///     })
    ///     .collect();
    /// assert_eq!(fleet.len(), 3);
    /// # }
    /// ```
    pub fn stores(&self) -> Vec<Resilient<Self>> {
        let n = self.state().instances;
        (0..n).map(|_| self.store()).collect()
    }

    /// Sets the latency each way from now on (calls on their way keep theirs).
    ///
    /// A call slower than the caller's timeout is a late answer: the caller gives up and
    /// decides on its failure policy, the server applies the operation all the same.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::testing::SimBackend;
    /// use tollgate::{LimitSpec, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let backend = SimBackend::new();
    /// let limiter = Limiter::builder(backend.store())
    ///     .limit(LimitSpec::new("api", Quota::per_hour(10)))
    ///     .build()
    ///     .unwrap();
    /// backend.set_latency(Duration::from_millis(40)); // 80 ms round trips, 50 ms timeout
    /// limiter.check("api", "k", 1).await.unwrap();
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// // Given up by the caller, applied on the server.
    /// assert_eq!(backend.remaining("api", "k", Quota::per_hour(10)), 9);
    /// # }
    /// ```
    pub fn set_latency(&self, one_way: Duration) {
        self.state().latency = one_way;
    }

    /// Sets how many instances the backend says share it ([`Backend::instances`]).
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn set_instances(&self, n: u64) {
        assert!(n > 0, "a backend has at least one instance");
        self.state().instances = n;
    }

    /// While on, every call that reaches the server fails (`connection refused`) after
    /// one way's latency, changing nothing: a server that is down. The instances apply
    /// each limit's [`FailurePolicy`](crate::FailurePolicy), and their breakers open after
    /// 3 failures.
    ///
    /// ```
    /// use tollgate::testing::SimBackend;
    /// use tollgate::{FailurePolicy, LimitSpec, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let backend = SimBackend::new();
    /// let spec = LimitSpec::new("api", Quota::per_hour(10)).on_store_failure(FailurePolicy::Deny);
    /// let limiter = Limiter::builder(backend.store()).limit(spec).build().unwrap();
    /// backend.outage(true);
    /// assert!(!limiter.check("api", "k", 1).await.unwrap().allowed());
    /// backend.outage(false);
    /// assert!(limiter.check("api", "k", 1).await.unwrap().allowed());
    /// # }
    /// ```
    pub fn outage(&self, on: bool) {
        self.state().failing = on;
    }

    /// While on, every call that reaches the server never answers: a network that drops
    /// packets, or a server that hangs. The callers' timeouts end the calls. Calls that
    /// reached the server before stay as they are (their answers come back).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::testing::SimBackend;
    /// use tollgate::{LimitSpec, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let backend = SimBackend::new();
    /// let limiter = Limiter::builder(backend.store().timeout(Duration::from_millis(20)))
    ///     .limit(LimitSpec::new("api", Quota::per_hour(10)))
    ///     .build()
    ///     .unwrap();
    /// backend.black_hole(true);
    /// let start = tokio::time::Instant::now();
    /// // Decided on this instance's share once the call timed out.
    /// assert!(limiter.check("api", "k", 1).await.unwrap().allowed());
    /// assert_eq!(start.elapsed(), Duration::from_millis(20));
    /// assert_eq!(backend.remaining("api", "k", Quota::per_hour(10)), 10);
    /// # }
    /// ```
    pub fn black_hole(&self, on: bool) {
        self.state().black_hole = on;
    }

    /// The server restarts empty (no persistence): every bucket is full again, and the
    /// snapshot is lost too. A loss of state, noticed by the instances
    /// [`loss_noticed_after`](SimBackendBuilder::loss_noticed_after) from now.
    ///
    /// ```
    /// use tollgate::testing::SimBackend;
    /// use tollgate::{LimitSpec, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let quota = Quota::per_hour(10);
    /// let backend = SimBackend::new();
    /// let limiter = Limiter::builder(backend.store())
    ///     .limit(LimitSpec::new("api", quota))
    ///     .build()
    ///     .unwrap();
    /// limiter.check("api", "k", 4).await.unwrap();
    /// backend.wipe();
    /// assert_eq!(backend.remaining("api", "k", quota), 10);
    /// # }
    /// ```
    pub fn wipe(&self) {
        let now = self.clock.now();
        let mut s = self.state();
        s.live = Buckets::new(&self.clock);
        s.snapshot = None;
        s.losses.push(now);
    }

    /// Takes the snapshot [`restore`](Self::restore) brings back: the server's buckets as
    /// they are now. Until then the snapshot follows the buckets (a restore brings back
    /// the state as it is); there is one snapshot in the backend's life, and later calls
    /// change nothing.
    pub fn snapshot(&self) {
        self.state().frozen = true;
    }

    /// The server restarts from its snapshot (see [`snapshot`](Self::snapshot)): what
    /// was spent since comes back. The snapshot is used up: after it (or a
    /// [`wipe`](Self::wipe)) a restore keeps the buckets as they are. A loss of state all
    /// the same, noticed by the instances
    /// [`loss_noticed_after`](SimBackendBuilder::loss_noticed_after) from now.
    ///
    /// ```
    /// use tollgate::testing::SimBackend;
    /// use tollgate::{LimitSpec, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let quota = Quota::per_hour(10);
    /// let backend = SimBackend::new();
    /// let limiter = Limiter::builder(backend.store())
    ///     .limit(LimitSpec::new("api", quota))
    ///     .build()
    ///     .unwrap();
    /// limiter.check("api", "k", 2).await.unwrap();
    /// backend.snapshot();
    /// limiter.check("api", "k", 3).await.unwrap();
    /// assert_eq!(backend.remaining("api", "k", quota), 5);
    /// backend.restore(); // the 3 spent since the snapshot come back
    /// assert_eq!(backend.remaining("api", "k", quota), 8);
    /// # }
    /// ```
    pub fn restore(&self) {
        let now = self.clock.now();
        let mut s = self.state();
        if let Some(snap) = s.snapshot.take() {
            s.live = snap;
        }
        s.losses.push(now);
    }

    /// The tokens the bucket `key` of limit `limit` has on the server now, under `quota`
    /// (GCRA), whatever the faults: what the instances would see if they asked. Call it
    /// inside the runtime (tokio's clock is read).
    pub fn remaining(&self, limit: &str, key: impl IntoKey, quota: Quota) -> u64 {
        let call = Call::gcra(limit, key.into_key(), quota, 0);
        let statuses = self.state().live.apply(Op::Check, &[call]);
        statuses[0].outcome().map_or(0, |o| o.remaining())
    }

    /// A call of a region's mover (`regions.rs`): the latency each way and the faults of
    /// any call, `f` applied on the server (at the clock's time) when it is reached.
    pub(super) fn serve<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut State, u64) -> T + Send + 'static,
    ) -> Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>> {
        let backend = self.clone();
        Box::pin(async move {
            let latency = backend.state().latency;
            tokio::time::sleep(latency).await;
            let (failing, hole) = {
                let s = backend.state();
                (s.failing, s.black_hole)
            };
            if hole {
                std::future::pending::<()>().await;
            }
            if failing {
                return Err(StoreError::new("connection refused"));
            }
            let answer = {
                let now = backend.clock.now();
                let mut s = backend.state();
                s.escrow.calls += 1;
                f(&mut s, now)
            };
            tokio::time::sleep(latency).await;
            Ok(answer)
        })
    }

    /// How many calls the instances made so far (each reaching the server or not).
    pub fn calls(&self) -> u64 {
        self.state().calls
    }
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state();
        f.debug_struct("SimBackend")
            .field("latency", &s.latency)
            .field("outage", &s.failing)
            .field("black_hole", &s.black_hole)
            .field("losses", &s.losses.len())
            .field("instances", &s.instances)
            .field("calls", &s.calls)
            .finish_non_exhaustive()
    }
}

impl Backend for SimBackend {
    type Table = String;
    type Future = Pin<Box<dyn Future<Output = Result<Statuses, StoreError>> + Send>>;

    fn table(&self, name: &str) -> String {
        name.to_owned()
    }

    fn apply(&self, op: Op, items: &[Item<'_, String>]) -> Self::Future {
        let calls: Vec<Call> = items
            .iter()
            .map(|i| Call {
                table: i.table.clone(),
                key: i.key.clone(),
                quota: i.quota,
                cost: i.cost,
                mode: i.mode,
                algorithm: i.algorithm,
                max_wait: i.max_wait,
            })
            .collect();
        let backend = self.clone();
        Box::pin(async move {
            let latency = {
                let mut s = backend.state();
                s.calls += 1;
                s.latency
            };
            tokio::time::sleep(latency).await;
            let (failing, hole) = {
                let s = backend.state();
                (s.failing, s.black_hole)
            };
            if hole {
                std::future::pending::<()>().await;
            }
            if failing {
                return Err(StoreError::new("connection refused"));
            }
            let statuses = {
                let mut s = backend.state();
                let statuses = s.apply(op, &calls);
                if op == Op::Check {
                    let now = backend.clock.now();
                    let checks = calls.iter().zip(&statuses).map(|(c, st)| {
                        let allowed = st.outcome().is_some_and(|o| o.is_allowed());
                        (c.table.as_str(), &c.key, c.cost, allowed)
                    });
                    s.escrow.record(checks, now);
                }
                statuses
            };
            // The answer takes its time back, whether or not the caller still waits.
            tokio::time::sleep(latency).await;
            Ok(statuses)
        })
    }

    fn name(&self) -> &'static str {
        "simulated"
    }

    fn resets(&self) -> u64 {
        let now = self.clock.now();
        let s = self.state();
        s.losses
            .iter()
            .filter(|&&at| at.saturating_add(s.noticed_after) <= now)
            .count() as u64
    }

    fn instances(&self) -> u64 {
        self.state().instances
    }

    fn counts_instances(&self) -> bool {
        true
    }

    /// As Redis: each id applied once per bucket, for two minutes.
    fn penalizes_once(&self) -> bool {
        true
    }

    /// What a `RedisStore`'s own probe measures: the round trip as it stands.
    fn round_trip(&self) -> Option<Duration> {
        Some(self.state().latency * 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Quota = Quota::per_hour(10);

    #[tokio::test(start_paused = true)]
    async fn a_loss_is_reported_once_it_is_noticed() {
        let backend = SimBackend::builder()
            .loss_noticed_after(Duration::from_millis(300))
            .build();
        assert_eq!(backend.resets(), 0);
        backend.wipe();
        tokio::time::sleep(Duration::from_millis(299)).await;
        assert_eq!(backend.resets(), 0);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(backend.resets(), 1);
        backend.restore(); // no snapshot after a wipe: the buckets stay, a loss all the same
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(backend.resets(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_take_their_latency_each_way_and_fail_or_hang_as_told() {
        let backend = SimBackend::builder()
            .latency(Duration::from_millis(5))
            .build();
        let table = backend.table("api");
        let item = |cost| Item::new(&table, Key::from_part("k"), Q, cost);
        let start = tokio::time::Instant::now();
        let statuses = backend.apply(Op::Check, &[item(2)]).await.unwrap();
        assert!(statuses[0].outcome().unwrap().is_allowed());
        assert_eq!(start.elapsed(), Duration::from_millis(10));
        assert_eq!(backend.remaining("api", "k", Q), 8);

        backend.outage(true);
        assert!(backend.apply(Op::Check, &[item(1)]).await.is_err());
        assert_eq!(
            backend.remaining("api", "k", Q),
            8,
            "a failed call changes nothing"
        );
        backend.outage(false);

        backend.black_hole(true);
        let hung =
            tokio::time::timeout(Duration::from_secs(5), backend.apply(Op::Check, &[item(1)]));
        assert!(hung.await.is_err());
        assert_eq!(backend.remaining("api", "k", Q), 8);
        backend.black_hole(false);
        assert_eq!(backend.calls(), 3);
        assert_eq!(backend.round_trip(), Some(Duration::from_millis(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_given_up_on_the_way_back_is_applied() {
        let backend = SimBackend::builder()
            .latency(Duration::from_millis(30))
            .build();
        let table = backend.table("api");
        let call = backend.apply(Op::Check, &[Item::new(&table, Key::from_part("k"), Q, 3)]);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), call)
                .await
                .is_err()
        );
        assert_eq!(backend.remaining("api", "k", Q), 7);
    }

    /// A charge with an id is applied once per bucket: sent again (its answer lost), it
    /// changes nothing; another id, or another key, is another charge; after two minutes,
    /// or a wipe, the id is forgotten, as Redis's marker keys are.
    #[tokio::test(start_paused = true)]
    async fn a_charge_with_an_id_is_applied_once_per_bucket() {
        let backend = SimBackend::new();
        let table = backend.table("api");
        let item = |key: &str, cost| Item::new(&table, Key::from_part(key), Q, cost);
        let once = |id| Op::PenalizeOnce { id };
        backend.apply(once(7), &[item("k", 2)]).await.unwrap();
        let again = backend.apply(once(7), &[item("k", 2)]).await.unwrap();
        assert_eq!(
            again[0].outcome().unwrap().remaining(),
            8,
            "reported as it stands"
        );
        assert_eq!(backend.remaining("api", "k", Q), 8);
        backend.apply(once(8), &[item("k", 3)]).await.unwrap();
        backend.apply(once(7), &[item("j", 1)]).await.unwrap();
        assert_eq!(backend.remaining("api", "k", Q), 5);
        assert_eq!(backend.remaining("api", "j", Q), 9);
        tokio::time::sleep(crate::store::PENALIZE_ONCE_FOR - Duration::from_secs(1)).await;
        let left = backend.remaining("api", "k", Q);
        backend.apply(once(7), &[item("k", 2)]).await.unwrap();
        assert_eq!(
            backend.remaining("api", "k", Q),
            left,
            "remembered for two minutes"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let left = backend.remaining("api", "k", Q);
        backend.apply(once(7), &[item("k", 2)]).await.unwrap();
        assert_eq!(backend.remaining("api", "k", Q), left - 2, "then forgotten");
        backend.wipe();
        backend.apply(once(7), &[item("k", 2)]).await.unwrap();
        assert_eq!(
            backend.remaining("api", "k", Q),
            8,
            "a wipe forgets the ids"
        );
        assert!(backend.penalizes_once());
    }

    /// An id is remembered for two minutes from when it was applied, to the millisecond: a
    /// send arriving a millisecond before the end is seen, one arriving at the end is a new
    /// charge.
    #[tokio::test(start_paused = true)]
    async fn a_charge_id_is_remembered_for_exactly_two_minutes() {
        let ms = Duration::from_millis;
        // The send again arrives 1 ms before the end (seen), or at the end (a new charge).
        for (before_end, left) in [(ms(1), 9), (ms(0), 8)] {
            let backend = SimBackend::builder().latency(ms(1)).build();
            let table = backend.table("api");
            let charge = || {
                let item = Item::new(&table, Key::from_part("k"), Q, 1);
                backend.apply(Op::PenalizeOnce { id: 3 }, &[item])
            };
            let start = tokio::time::Instant::now();
            charge().await.unwrap(); // applied at 1 ms: remembered until 1 ms + 2 min
            let end = start + ms(1) + crate::store::PENALIZE_ONCE_FOR;
            tokio::time::sleep_until(end - ms(1) - before_end).await;
            charge().await.unwrap();
            assert_eq!(
                backend.remaining("api", "k", Q),
                left,
                "{before_end:?} before the end"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_snapshot_follows_the_buckets_until_taken() {
        let backend = SimBackend::new();
        let table = backend.table("api");
        let item = |cost| Item::new(&table, Key::from_part("k"), Q, cost);
        backend.apply(Op::Check, &[item(2)]).await.unwrap();
        backend.restore(); // no snapshot taken: it followed, nothing changes
        assert_eq!(backend.remaining("api", "k", Q), 8);

        let backend = SimBackend::new();
        let table = backend.table("api");
        let item = |cost| Item::new(&table, Key::from_part("k"), Q, cost);
        backend.apply(Op::Check, &[item(2)]).await.unwrap();
        backend.snapshot();
        backend.apply(Op::Check, &[item(5)]).await.unwrap();
        assert_eq!(backend.remaining("api", "k", Q), 3);
        backend.restore();
        assert_eq!(backend.remaining("api", "k", Q), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn stores_are_one_per_instance_and_debug_names_the_faults() {
        let backend = SimBackend::builder().instances(4).build();
        assert_eq!(backend.stores().len(), 4);
        assert_eq!(backend.instances(), 4);
        backend.set_instances(2);
        assert_eq!(backend.instances(), 2);
        backend.outage(true);
        let debug = format!("{backend:?}");
        assert!(debug.contains("outage: true"), "{debug}");
    }
}
