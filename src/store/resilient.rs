//! [`Resilient`]: any [`Backend`] made a [`Store`] that never fails a request: a timeout
//! per call, a circuit breaker, each limit's failure policy with a local fallback limiter,
//! and a local cache of denials.

mod held;
mod lease;
mod owed;

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
use super::{Backend, Checked, Item, Op, Statuses, Store, StoreError};
use crate::algo::algorithm::Algorithm;
use crate::algo::gcra::{self, Params};
use crate::algo::quota::Quota;
use crate::base::clock::{Clock, SharedClock};
use crate::model::decision::{Outcome, Status};
use crate::model::key::Key;
use crate::model::policy::{FailurePolicy, Mode};
pub use lease::LeaseStats;
use lease::{Answer, Ask, Asking, Backed, Counters, GiveBack, LeaseTable, Local, Take};

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
    /// What `Share` granted locally while the backend could not be reached, charged to
    /// the shared buckets once it answers.
    owed: Arc<owed::Owed>,
    /// In-flight units the backend granted this instance, by key: where releases go.
    held: Arc<held::Held>,
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
                owed: Arc::default(),
                held: Arc::default(),
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

/// A key the backend left with nothing (refused, or granted its last token), remembered
/// to be written back if the backend loses its buckets: a GCRA bucket full again at
/// `until`, a fixed window full until `until` (its end), on the store's clock.
struct Refused {
    remote: Arc<LeaseTable>,
    key: Key,
    quota: Quota,
    algorithm: Algorithm,
    until: u64,
}

/// A pending answer for `others` (indices into `statuses`) merged into the statuses
/// already known.
fn pending_merged<F>(
    pending: Checked<F>,
    mut statuses: Statuses,
    others: SmallVec<[usize; 4]>,
) -> Checked<Pin<Box<dyn Future<Output = Statuses> + Send>>>
where
    F: Future<Output = Statuses> + Send + 'static,
{
    match pending {
        Checked::Ready(s) => {
            for (&i, s) in others.iter().zip(s) {
                statuses[i] = s;
            }
            Checked::Ready(statuses)
        }
        Checked::Pending(future) => Checked::Pending(Box::pin(async move {
            for (&i, s) in others.iter().zip(future.await) {
                statuses[i] = s;
            }
            statuses
        })),
    }
}

/// An in-flight limit's refusal when this instance could not learn in time whether a
/// unit is free: no unit left, retry after the limit's `retry_after`.
fn in_flight_refusal(p: &Part) -> Outcome {
    let retry_after = p.algorithm.retry_after().unwrap_or(Duration::from_secs(1));
    let retry_us = u64::try_from(retry_after.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    Outcome::window(
        crate::algo::window::Report {
            verdict: crate::algo::gcra::Admission::Denied {
                retry_after: retry_us,
            },
            remaining: 0,
            reset_after: 0,
            next_after: None,
            wait: 0,
        },
        1_000,
    )
}

/// A backend silent this long (no call answered) is failing: timeouts count against the
/// breaker from then on.
const QUIET_NS: u64 = 1_000_000_000;

/// Keys remembered for a write-back, at most.
const REMEMBERED_REFUSALS: usize = 10_000;

/// The keys to write back if the backend loses its buckets: one entry per (limit, key),
/// the most spent state seen, kept until that state has passed (a write-back does not
/// empty it, so a second loss restores again), at most [`REMEMBERED_REFUSALS`].
#[derive(Default)]
struct WriteBack {
    keys: std::collections::HashMap<(usize, Key), Refused, foldhash::fast::RandomState>,
    /// When entries that have passed were last dropped (at most once a second when full,
    /// so a full list costs a lookup per new key, not a scan).
    purged_at: u64,
}

impl WriteBack {
    /// Remembers `r` at `now`: `false` if the list is full of live entries (`r` is
    /// dropped).
    fn remember(&mut self, r: Refused, now: u64) -> bool {
        let id = (Arc::as_ptr(&r.remote) as usize, r.key.clone());
        if let Some(known) = self.keys.get_mut(&id) {
            if r.until >= known.until {
                *known = r;
            }
            return true;
        }
        if self.keys.len() >= REMEMBERED_REFUSALS
            && now.saturating_sub(self.purged_at) >= 1_000_000_000
        {
            self.purged_at = now;
            self.keys.retain(|_, k| k.until > now);
        }
        if self.keys.len() >= REMEMBERED_REFUSALS {
            return false;
        }
        self.keys.insert(id, r);
        true
    }

    /// When the bucket of `key` (of the limit `remote` leases for) is full again, if
    /// remembered.
    fn until(&self, remote: &Arc<LeaseTable>, key: &Key) -> Option<u64> {
        let id = (Arc::as_ptr(remote) as usize, key.clone());
        self.keys.get(&id).map(|k| k.until)
    }

    /// The entries still to restore at `now` (those that have passed are dropped).
    fn live(&mut self, now: u64) -> Vec<(Arc<LeaseTable>, Key, Quota, Algorithm, u64)> {
        self.keys.retain(|_, k| k.until > now);
        self.keys
            .values()
            .map(|k| {
                (
                    k.remote.clone(),
                    k.key.clone(),
                    k.quota,
                    k.algorithm,
                    k.until,
                )
            })
            .collect()
    }
}

/// A fingerprint of a quota: a denial remembered under one quota says nothing about
/// another (after a plan upgrade the key may pass at once).
fn quota_salt(q: &Quota) -> u64 {
    q.t_ns().wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ q.burst_size().rotate_left(29)
}

/// Salts a key's "tokens given back at" marker apart from its denial marker.
const GIVEN_BACK: u64 = 0x6a09_e667_f3bc_c909;

/// What a remembered denial tells the client: no token for `wait_ns`.
fn cached_outcome(quota: &Quota, cost: u32, wait_ns: u64) -> Outcome {
    let params = Params::new(quota.t_ns(), quota.burst_size());
    let verdict = if u64::from(cost) > quota.burst_size() {
        gcra::Admission::Never
    } else {
        gcra::Admission::Denied {
            retry_after: wait_ns + u64::from(cost - 1) * params.t(),
        }
    };
    // One token is free at TAT + T - tau, `wait_ns` from now: the TAT is this far off.
    let reset_after = (wait_ns + params.tau()).saturating_sub(params.t());
    Outcome::new(verdict, reset_after, params, 1)
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
    /// The statuses of a call refused by a remembered denial, without asking the backend.
    ///
    /// A remembered denial says when the key's next token can exist at the earliest. Once
    /// that instant has come, the requests that arrive before the backend's next answer
    /// would all be sent (one round trip is many requests on a hot key refused far over its
    /// limit); instead each request claims its tokens from the remembered instant, as the
    /// backend's bucket would take them, and only requests that find tokens are sent: a
    /// refused key costs the backend about one call per token it can grant. The claims only
    /// follow this instance's own requests, so the backend's bucket is never behind them,
    /// and nothing the backend would allow is refused here.
    fn cached_denial(&self, items: &[Item<'_, ResilientTable<B::Table>>]) -> Option<Statuses> {
        let cache = self.inner.deny_cache.as_ref()?;
        // A reservation may pass where a check is refused: the store decides. So it does
        // for a limit that bans: its refusal says whether the key is banned (`Item::bans`),
        // which another instance may have done since the denial was remembered (and each
        // of its refusals counts towards a ban in the store anyway).
        fn remembered<'a, T>(item: &'a Item<'_, ResilientTable<T>>) -> Option<&'a MemoryTable> {
            let speaks = item.mode == Mode::Enforce
                && item.cost > 0
                && item.max_wait.is_zero()
                && !item.bans;
            item.table.deny.as_ref().filter(|_| speaks)
        }
        let refuse = |at: usize, wait: u64| -> Statuses {
            items[at].table.deny_hits.increment(1);
            let mut statuses: Statuses = items.iter().map(|_| Status::Unchecked).collect();
            let item = &items[at];
            statuses[at] = Status::Checked(cached_outcome(&item.quota, item.cost, wait));
            statuses
        };
        // A live denial refuses the request: read only.
        let mut refused = false;
        let statuses = items
            .iter()
            .map(|item| {
                let table = remembered(item)?;
                let (until, now) = cache.marker(table, &item.key, quota_salt(&item.quota));
                if until <= now {
                    return None;
                }
                refused = true;
                item.table.deny_hits.increment(1);
                Some(Status::Checked(cached_outcome(
                    &item.quota,
                    item.cost,
                    until - now,
                )))
            })
            .map(|s| s.unwrap_or(Status::Unchecked))
            .collect();
        if refused {
            return Some(statuses);
        }
        // Otherwise the request claims its tokens; one it cannot have (a concurrent request
        // took them) refuses it, and the claims made for its other limits go back.
        let mut claimed: SmallVec<[(usize, u64); 4]> = SmallVec::new();
        for (i, item) in items.iter().enumerate() {
            let Some(table) = remembered(item) else {
                continue;
            };
            let t = u64::try_from(item.quota.emission_interval().as_nanos()).unwrap_or(u64::MAX);
            let step = t.saturating_mul(u64::from(item.cost));
            let tau = t.saturating_mul(item.quota.burst_size().saturating_sub(1));
            let salt = quota_salt(&item.quota);
            match cache.claim_marker(table, &item.key, salt, step, tau) {
                (Ok(true), _) => claimed.push((i, step)),
                (Ok(false), _) => {}
                (Err(until), now) => {
                    for &(j, step) in &claimed {
                        let item = &items[j];
                        let table = remembered(item).expect("claimed");
                        cache.unclaim_marker(table, &item.key, quota_salt(&item.quota), step);
                    }
                    return Some(refuse(i, until.saturating_sub(now)));
                }
            }
        }
        None
    }

    /// Keeps the deny cache true to an operation other than a check made through this
    /// store, before it is sent: tokens given back clear a remembered denial. (A block is
    /// remembered once the backend has applied it, see [`run`](Self::run).)
    fn update_deny_cache(&self, op: Op, items: &[Item<'_, ResilientTable<B::Table>>]) {
        let Some(cache) = &self.inner.deny_cache else {
            return;
        };
        if !matches!(op, Op::Refund | Op::Credit | Op::Reset) {
            return;
        }
        for item in items {
            if let Some(table) = &item.table.deny {
                self.given_back(cache, table, &item.key, quota_salt(&item.quota));
            }
        }
    }

    /// Remembers a block the backend applied: refused until `d` from `sent_at` (never
    /// later than the backend's own end of the block).
    fn remember_block(&self, part: &Part, sent_at: u64, d: Duration) {
        let (Some(cache), Some(table)) = (&self.inner.deny_cache, &part.deny) else {
            return;
        };
        if part.algorithm.is_window() {
            return; // window denials are not remembered (see `remember_denial`)
        }
        let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        cache.raise_marker(
            table,
            &part.key,
            quota_salt(&part.quota),
            sent_at.saturating_add(d),
        );
    }

    /// Tokens of `key` are being given back (when the refund or reset is issued, and again
    /// when the backend has applied it): forgets its remembered denial, and notes the time,
    /// so that a denial the backend decided before the tokens came back, but whose answer
    /// is processed after, is not remembered (see [`remember_denial`](Self::remember_denial)).
    fn given_back(
        &self,
        cache: &MemoryStore<SharedClock>,
        table: &MemoryTable,
        key: &Key,
        salt: u64,
    ) {
        cache.clear_marker(table, key, salt);
        // Kept for one timeout: an answer to a check sent before now comes within it, or
        // is dropped.
        let until = self.inner.clock.now().saturating_add(self.timeout_ns());
        cache.raise_marker(table, key, salt ^ GIVEN_BACK, until);
    }

    fn timeout_ns(&self) -> u64 {
        u64::try_from(self.inner.timeout.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Remembers that `part` cannot pass a request of cost 1 for the outcome's wait,
    /// counted from `sent_at` — unless tokens of the key were given back since `sent_at`:
    /// the backend may have decided before they came back.
    fn remember_denial(&self, part: &Part, sent_at: u64, o: &Outcome) {
        let (Some(cache), Some(table)) = (&self.inner.deny_cache, &part.deny) else {
            return;
        };
        if o.remaining() > 0 || part.algorithm.is_window() {
            // A smaller request could pass; or a window limit, whose denials are not
            // remembered (its wait depends on the cost and, for a sliding window, on
            // how the previous window's weight decays).
            return;
        }
        let salt = quota_salt(&part.quota);
        let (given_back_until, _) = cache.marker(table, &part.key, salt ^ GIVEN_BACK);
        if given_back_until != 0 && sent_at <= given_back_until.saturating_sub(self.timeout_ns()) {
            return;
        }
        if let Some(wait) = o.next_after() {
            let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            cache.raise_marker(table, &part.key, salt, sent_at.saturating_add(wait));
        }
    }

    /// Remembers a key the backend refused with nothing left (GCRA, or a fixed window),
    /// until it could pass a request of cost 1: what a write-back restores if the backend
    /// loses its buckets.
    fn remember_refusal(&self, part: &Part, sent_at: u64, o: &Outcome) {
        self.remember(
            &part.remote,
            &part.key,
            part.quota,
            part.algorithm,
            sent_at,
            o,
        );
    }

    /// [`remember_refusal`](Self::remember_refusal) for any refused call about `key`.
    fn remember(
        &self,
        remote: &Arc<LeaseTable>,
        key: &Key,
        quota: Quota,
        algorithm: Algorithm,
        sent_at: u64,
        o: &Outcome,
    ) {
        // (a calendar window's block fills the window it is in: the same as a fixed one's)
        let restorable = algorithm == Algorithm::Gcra || algorithm.is_fixed();
        if !restorable || o.remaining() > 0 {
            return;
        }
        // Until the bucket is full again (GCRA), or the window ends: counted from the
        // send, so never later than the backend's own.
        let full = u64::try_from(o.reset_after().as_nanos()).unwrap_or(u64::MAX);
        let until = sent_at.saturating_add(full);
        let now = self.inner.clock.now();
        let kept = self
            .inner
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remember(
                Refused {
                    remote: remote.clone(),
                    key: key.clone(),
                    quota,
                    algorithm,
                    until,
                },
                now,
            );
        if !kept {
            self.inner.writeback_dropped.increment(1);
        }
    }

    /// The backend lost its buckets (its reset count moved): blocks every remembered key
    /// until it was refused, in the background. A block only moves a bucket's state
    /// forward, so keys that other instances wrote back, or that requests used since, lose
    /// nothing; an exhausted key stays exhausted.
    fn write_back_after_reset(&self) {
        let inner = &*self.inner;
        let resets = inner.backend.resets();
        let seen = inner.seen_resets.load(std::sync::atomic::Ordering::Acquire);
        if resets == seen
            || inner
                .seen_resets
                .compare_exchange(
                    seen,
                    resets,
                    std::sync::atomic::Ordering::AcqRel,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now = inner.clock.now();
        let live = inner
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .live(now);
        tracing::info!(
            keys = live.len(),
            "tollgate: writing back the spent keys {} lost",
            inner.backend.name()
        );
        let timeout = self.call_timeout();
        for (remote, key, quota, algorithm, until) in live {
            let left = Duration::from_nanos(until - now);
            // GCRA: the bucket as spent as it was (full again at `until`); a fixed window:
            // full until its end.
            let op = if algorithm.is_window() {
                Op::Block(left)
            } else {
                Op::Restore(left)
            };
            let call = remote
                .remote
                .call(op, &key, quota, algorithm, 1, Duration::ZERO);
            runtime.spawn(async move {
                let _ = tokio::time::timeout(timeout, call).await;
            });
        }
    }

    /// The statuses of a call the backend did not answer: each item's policy. `owe`: the
    /// call surely changed nothing in the backend (it was not made, or failed with an
    /// error), so what `Share` grants here is charged to the shared bucket later.
    fn on_failure(&self, op: Op, parts: &[Part], owe: bool) -> Statuses {
        self.on_failure_busy(op, parts, owe, false)
    }

    /// [`on_failure`](Self::on_failure); `busy`: the call timed out (this instance or the
    /// backend is slow, or the backend is gone: a timeout cannot tell). An in-flight limit
    /// then refuses (its `retry_after`) instead of granting a local share: the call may
    /// have taken a unit in the backend, and a local grant beside the backend's count would
    /// let more than `n` run. Its share is for a backend known to fail: a call that failed
    /// with an error, or an open breaker.
    fn on_failure_busy(&self, op: Op, parts: &[Part], owe: bool, busy: bool) -> Statuses {
        let busy_in_flight = |p: &Part| {
            busy && op == Op::Check
                && p.algorithm.is_in_flight()
                && matches!(p.policy, FailurePolicy::Share | FailurePolicy::Fallback)
        };
        let mut statuses: Statuses = parts
            .iter()
            .map(|p| match p.policy {
                _ if busy_in_flight(p) => Status::Checked(in_flight_refusal(p)),
                FailurePolicy::Allow => Status::FailedOpen,
                FailurePolicy::Deny => Status::FailedClosed,
                _ => Status::Unchecked, // the fallback, below
            })
            .collect();
        let refused =
            op == Op::Check && statuses.iter().zip(parts).any(|(s, p)| refuses(s, p.mode));
        let fallback: SmallVec<[usize; 4]> = (0..parts.len())
            .filter(|&i| {
                matches!(
                    parts[i].policy,
                    FailurePolicy::Fallback | FailurePolicy::Share
                ) && !busy_in_flight(&parts[i])
            })
            .collect();
        if fallback.is_empty() || refused {
            // A refused check consumes nothing, not even locally.
            return statuses;
        }
        // This instance's share of a shared limit: 1/n of it, n the live instances.
        let instances = self.inner.backend.instances();
        let items: SmallVec<[Item<'_, MemoryTable>; 4]> = fallback
            .iter()
            .map(|&i| {
                let p = &parts[i];
                let quota = match p.policy {
                    FailurePolicy::Share => p.quota.share(instances, p.algorithm.is_window()),
                    _ => p.quota,
                };
                Item::new(&p.fallback, p.key.clone(), quota, p.cost)
                    .mode(p.mode)
                    .algorithm(p.algorithm)
                    .max_wait(p.max_wait)
            })
            .collect();
        if op == Op::Check {
            self.share_as_spent(&fallback, parts, &items);
        }
        let Checked::Ready(local) = self.inner.fallback.apply(op, &items) else {
            unreachable!("the memory store answers at once")
        };
        for (&i, s) in fallback.iter().zip(local) {
            statuses[i] = match s {
                Status::Checked(o) => Status::Fallback(o),
                other => other,
            };
        }
        let passed = !statuses.iter().zip(parts).any(|(s, p)| refuses(s, p.mode));
        if owe && op == Op::Check && passed {
            for (&i, item) in fallback.iter().zip(&items) {
                let p = &parts[i];
                let counted = p.policy == FailurePolicy::Share
                    && p.mode == Mode::Enforce
                    && p.algorithm == Algorithm::Gcra
                    && p.cost > 0;
                let debt = || owed::Debt {
                    remote: p.remote.clone(),
                    key: p.key.clone(),
                    quota: p.quota,
                    local: p.fallback.clone(),
                    share: item.quota,
                };
                if counted && !self.inner.owed.add(debt()) {
                    self.inner.writeback_dropped.increment(1);
                }
            }
        }
        statuses
    }

    /// The backend answers: what the shares of the keys `Share` granted while it could not
    /// be reached still lack is charged to the shared buckets (`Op::Penalize`), in the
    /// background (see `owed`).
    fn repay(&self) {
        let debts = self.inner.owed.take();
        if debts.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        tracing::info!(
            keys = debts.len(),
            "tollgate: charging {} with what was granted on this instance's share while it failed",
            self.inner.backend.name()
        );
        let timeout = self.call_timeout();
        for d in debts {
            // What the share lacks now: the tokens spent on it and not refilled yet.
            let look = [Item::new(&d.local, d.key.clone(), d.share, 0)];
            let Checked::Ready(s) = self.inner.fallback.apply(Op::Check, &look) else {
                unreachable!("the memory store answers at once")
            };
            let left = s
                .first()
                .and_then(Status::outcome)
                .map_or(0, Outcome::remaining);
            let lacks = d.share.burst_size().saturating_sub(left);
            if lacks == 0 {
                continue;
            }
            let cost = u32::try_from(lacks).unwrap_or(u32::MAX);
            let call = d.remote.remote.call(
                Op::Penalize,
                &d.key,
                d.quota,
                Algorithm::Gcra,
                cost,
                Duration::ZERO,
            );
            runtime.spawn(async move {
                let _ = tokio::time::timeout(timeout, call).await;
            });
        }
    }

    /// A key this instance saw spent (in the write-back list) starts its share as spent as
    /// the shared bucket was: a share is of what the limit has left, not a fresh burst on
    /// top of what the shared bucket gives back once it answers again. GCRA; a restore
    /// only ever moves the local bucket forward, so repeating it changes nothing.
    fn share_as_spent(&self, fallback: &[usize], parts: &[Part], items: &[Item<'_, MemoryTable>]) {
        let now = self.inner.clock.now();
        for (&i, item) in fallback.iter().zip(items) {
            let p = &parts[i];
            if p.policy != FailurePolicy::Share || p.algorithm.is_window() {
                continue;
            }
            let until = {
                let list = self.inner.refused.lock().unwrap_or_else(|e| e.into_inner());
                list.until(&p.remote, &p.key)
            };
            if let Some(until) = until.filter(|&u| u > now) {
                let restore = [Item::new(item.table, p.key.clone(), item.quota, 1)];
                let _ = self
                    .inner
                    .fallback
                    .apply(Op::Restore(Duration::from_nanos(until - now)), &restore);
            }
        }
    }

    async fn run<F>(self, op: Op, parts: SmallVec<[Part; 4]>, call: F) -> Statuses
    where
        F: Future<Output = Result<Statuses, StoreError>>,
    {
        let inner = &*self.inner;
        let sent_at = inner.clock.now();
        let timeout = self.call_timeout();
        let (result, late) = match tokio::time::timeout(timeout, call).await {
            Ok(result) => {
                if result.is_ok() {
                    self.answered(sent_at);
                }
                (result, false)
            }
            Err(_) => (
                Err(StoreError::new(format!("no answer within {timeout:?}"))),
                true,
            ),
        };
        {
            use crate::observe::probe::ErrorKind;
            let m = &inner.metrics;
            m.duration(inner.clock.now().saturating_sub(sent_at));
            match &result {
                Err(_) if late => m.error(ErrorKind::Timeout),
                Err(_) => m.error(ErrorKind::Backend),
                Ok(s) if s.len() != parts.len() => m.error(ErrorKind::Protocol),
                Ok(_) => {}
            }
        }
        let name = inner.backend.name();
        if matches!(op, Op::Refund | Op::Credit | Op::Reset)
            && let Some(cache) = &inner.deny_cache
        {
            // Applied (or not): checks sent until now may have been decided before it.
            for p in &parts {
                if let Some(table) = &p.deny {
                    self.given_back(cache, table, &p.key, quota_salt(&p.quota));
                }
            }
        }
        let statuses = self.settle(op, &parts, sent_at, result, late, name);
        inner.metrics.breaker(inner.breaker.is_open());
        statuses
    }

    /// A call sent at `sent_at` was answered now: a round trip observed, and the backend
    /// answers.
    fn answered(&self, sent_at: u64) {
        let inner = &*self.inner;
        let now = inner.clock.now();
        inner.rtt.observe(now.saturating_sub(sent_at));
        inner
            .answered_at
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the backend has been silent for `QUIET` (no call answered, nor since the
    /// store was made): only then does a timeout count against the breaker. A timeout
    /// while calls are answered is this side being slow (a busy instance, a queue of
    /// calls), not a backend that does not answer; and a store that has not heard from its
    /// backend yet gives it the time to answer a first call and its own probe (whose round
    /// trip sizes the timeout) before it calls it failing.
    fn silent(&self) -> bool {
        let inner = &*self.inner;
        let heard = inner.answered_at.load(std::sync::atomic::Ordering::Relaxed);
        inner.clock.now().saturating_sub(heard) >= QUIET_NS
    }

    /// How long the next call may take: the configured timeout, or what the round trips
    /// observed (and the backend's own, e.g. Redis's probe) say when that is longer.
    fn call_timeout(&self) -> Duration {
        let inner = &*self.inner;
        inner.rtt.timeout(inner.timeout, inner.backend.round_trip())
    }

    /// The statuses of a call's answer (`late`: it timed out; the request follows its
    /// policy, and the timeout counts against the breaker only if no call was answered
    /// since this one was sent).
    /// In-flight units the backend granted in a check that passed: counted here until
    /// released, so that a release goes where its units were taken.
    fn hold_granted(&self, parts: &[Part], statuses: &Statuses) {
        if !parts.iter().any(|p| p.algorithm.is_in_flight()) {
            return;
        }
        if parts.iter().zip(statuses).any(|(p, s)| refuses(s, p.mode)) {
            return; // refused: nothing was taken
        }
        for (p, s) in parts.iter().zip(statuses) {
            if p.algorithm.is_in_flight()
                && p.cost > 0
                && matches!(s, Status::Checked(o) if o.is_allowed())
            {
                self.inner.held.add(&p.remote, &p.key, p.cost);
            }
        }
    }

    /// Gives in-flight units back (and, in the same call, any other item's cost): units
    /// held in the backend go back there, in the background (a release lost with a
    /// failed call expires with the backend's deadline); units granted here while the
    /// backend failed go back to the local store.
    fn release(
        &self,
        items: &[Item<'_, ResilientTable<B::Table>>],
    ) -> Checked<<Self as Store>::Future> {
        let mut statuses = Statuses::from_elem(Status::Unchecked, items.len());
        let mut others: SmallVec<[usize; 4]> = SmallVec::new();
        for (i, item) in items.iter().enumerate() {
            if !item.algorithm.is_in_flight() {
                others.push(i);
                continue;
            }
            let table = &item.table;
            if self.inner.held.take(&table.leases, &item.key, item.cost) {
                let call = table.leases.remote.call(
                    Op::Refund,
                    &item.key,
                    item.quota,
                    item.algorithm,
                    item.cost,
                    Duration::ZERO,
                );
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let timeout = self.call_timeout();
                    runtime.spawn(async move {
                        let _ = tokio::time::timeout(timeout, call).await;
                    });
                }
            } else {
                let local = Item::new(&table.fallback, item.key.clone(), item.quota, item.cost)
                    .algorithm(item.algorithm);
                if let Checked::Ready(s) = self.inner.fallback.apply(Op::Refund, &[local]) {
                    statuses[i] = s[0];
                }
            }
        }
        if others.is_empty() {
            return Checked::Ready(statuses);
        }
        let rest: SmallVec<[Item<'_, ResilientTable<B::Table>>; 4]> = others
            .iter()
            .map(|&i| items[i].on(items[i].table))
            .collect();
        match self.apply(Op::Refund, &rest) {
            Checked::Ready(s) => {
                for (&i, s) in others.iter().zip(s) {
                    statuses[i] = s;
                }
                Checked::Ready(statuses)
            }
            // The other items' answer: the in-flight ones went their own way.
            pending => pending_merged(pending, statuses, others),
        }
    }

    fn settle(
        &self,
        op: Op,
        parts: &[Part],
        sent_at: u64,
        result: Result<Statuses, StoreError>,
        late: bool,
        name: &'static str,
    ) -> Statuses {
        let inner = &*self.inner;
        match result {
            Ok(statuses) if statuses.len() == parts.len() => {
                inner.breaker.success(name);
                self.repay();
                match op {
                    Op::Check => {
                        self.hold_granted(parts, &statuses);
                        for (p, s) in parts.iter().zip(&statuses) {
                            if let Status::Checked(o) = s
                                && p.mode == Mode::Enforce
                            {
                                if !o.is_allowed() {
                                    self.remember_denial(p, sent_at, o);
                                }
                                // Refused, or granted its last token: spent.
                                self.remember_refusal(p, sent_at, o);
                            }
                        }
                    }
                    // Only once applied: a block the backend did not make must not refuse
                    // a key the backend lets pass.
                    Op::Block(d) => {
                        for p in parts {
                            self.remember_block(p, sent_at, d);
                        }
                    }
                    _ => {}
                }
                statuses
            }
            Ok(statuses) => {
                let error = format!("{} statuses for {} items", statuses.len(), parts.len());
                tracing::debug!(%error, "tollgate: {name} answered wrongly");
                inner.breaker.failure(inner.clock.now(), name, &error);
                self.on_failure(op, parts, false)
            }
            Err(error) => {
                tracing::debug!(%error, "tollgate: {name} call failed");
                if !late || self.silent() {
                    inner.breaker.failure(inner.clock.now(), name, &error);
                }
                // A call that timed out may have been applied: nothing is owed for it.
                self.on_failure_busy(op, parts, !late, late)
            }
        }
    }
}

/// A leased item decided here: its table, key and cost (given back if the request does
/// not pass).
type Taken = SmallVec<[(Arc<LeaseTable>, Key, u32); 4]>;

impl<B: Backend> Resilient<B> {
    /// Lease mode: decides a check here when the leases of its leased items say so (all
    /// taken from leases, or one refused while this instance waits for tokens), asking
    /// the backend only for the other items. `None`: the check goes to the backend whole,
    /// and leases are taken meanwhile for the next requests.
    fn leased(
        &self,
        items: &[Item<'_, ResilientTable<B::Table>>],
    ) -> Option<Checked<<Self as Store>::Future>> {
        let inner = &*self.inner;
        // While the backend fails, tokens held are still spent (they were taken from the
        // shared bucket); once they are gone, every item follows its policy.
        let offline = inner.breaker.is_open();
        let now = inner.clock.now();
        let mut locals: SmallVec<[Option<Local>; 4]> = SmallVec::new();
        let (mut remote, mut refused) = (false, false);
        for item in items {
            let lease = item.lease.filter(|_| {
                LeaseTable::applies(item.mode, item.cost, item.max_wait, item.algorithm)
            });
            let Some(lease) = lease else {
                locals.push(None);
                continue;
            };
            let ask = Ask {
                quota: item.quota,
                algorithm: item.algorithm,
                lease,
                cost: item.cost,
            };
            let leases = &item.table.leases;
            let asking = if offline {
                Asking::Offline
            } else {
                Asking::Online
            };
            let decided = leases.decide(&item.key, ask, now, asking);
            self.give_back(leases, decided.give_back);
            if let Some(take) = decided.take {
                self.take_lease(leases, &item.key, ask, take);
            }
            match decided.local {
                Local::Remote | Local::Wait => remote = true,
                Local::Refused(_) => refused = true,
                Local::Taken(_) => {}
            }
            locals.push(Some(decided.local));
        }
        // The leased items decided here from their tokens.
        let taken = || {
            items
                .iter()
                .zip(&locals)
                .filter(|(_, l)| matches!(l, Some(Local::Taken(_))))
                .map(|(item, _)| item)
        };
        if refused || remote {
            for item in taken() {
                item.table.leases.undo(&item.key, item.cost);
            }
        }
        if refused {
            // Refused here: nothing is consumed, the other items are not asked.
            let statuses = locals
                .iter()
                .map(|l| match l {
                    Some(l @ Local::Refused(_)) => lease::status(l),
                    _ => Status::Unchecked,
                })
                .collect();
            return Some(Checked::Ready(statuses));
        }
        if let ([item], [Some(Local::Wait)]) = (items, &locals[..]) {
            // One leased limit whose lease is on its way: wait for it rather than call.
            let ask = Ask {
                quota: item.quota,
                algorithm: item.algorithm,
                lease: item.lease.unwrap_or_default(),
                cost: item.cost,
            };
            let part = self.part(item);
            return Some(Checked::Pending(Box::pin(
                self.clone().wait_for_lease(part, ask),
            )));
        }
        if remote {
            if locals.iter().any(|l| matches!(l, Some(Local::Wait))) {
                // Several items: no waiting, the request is asked as a whole.
                for (item, local) in items.iter().zip(&locals) {
                    if matches!(local, Some(Local::Wait)) {
                        item.table.leases.count_remote(&item.key);
                    }
                }
            }
            return None;
        }
        let mut statuses: Statuses = locals
            .iter()
            .map(|l| l.as_ref().map_or(Status::Unchecked, lease::status))
            .collect();
        let rest: SmallVec<[usize; 4]> =
            (0..items.len()).filter(|&i| locals[i].is_none()).collect();
        if rest.is_empty() {
            return Some(Checked::Ready(statuses));
        }
        // The other items, all or nothing with the leased ones: asked as usual. The leased
        // ones' tokens go back if they refuse, after this call: the tables are kept.
        let others: SmallVec<[Item<'_, ResilientTable<B::Table>>; 4]> = rest
            .iter()
            .map(|&i| items[i].on(items[i].table).lease(None))
            .collect();
        let taken: Taken = taken()
            .map(|item| (item.table.leases.clone(), item.key.clone(), item.cost))
            .collect();
        let modes: SmallVec<[Mode; 4]> = others.iter().map(|i| i.mode).collect();
        let merge = move |answered: Statuses, statuses: &mut Statuses| {
            let refused = answered.iter().zip(&modes).any(|(s, &m)| refuses(s, m));
            if refused {
                undo(&taken);
            }
            for (&i, s) in rest.iter().zip(answered) {
                statuses[i] = s;
            }
        };
        Some(match self.apply(Op::Check, &others) {
            Checked::Ready(answered) => {
                merge(answered, &mut statuses);
                Checked::Ready(statuses)
            }
            Checked::Pending(call) => Checked::Pending(Box::pin(async move {
                merge(call.await, &mut statuses);
                statuses
            })),
        })
    }

    /// Takes a lease of `want` tokens for `key` in the background (and, if the bucket
    /// had fewer but enough, what it had).
    fn take_lease(&self, leases: &Arc<LeaseTable>, key: &Key, ask: Ask, take: Take) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let now = self.inner.clock.now();
            let failed = Answer {
                asked: take.tokens,
                generation: take.generation,
                sent_at: now,
                answered_at: now,
                outcome: None,
                last: true,
            };
            leases.settle(key, ask, failed);
            return;
        };
        leases.sweep_in_background();
        let this = self.clone();
        let leases = leases.clone();
        let key = key.clone();
        runtime.spawn(async move {
            let inner = &*this.inner;
            let name = inner.backend.name();
            let mut asked = take.tokens;
            for attempt in 0..2 {
                let sent_at = inner.clock.now();
                let cost = u32::try_from(asked).unwrap_or(u32::MAX);
                let call = leases.remote.call(
                    Op::Check,
                    &key,
                    ask.quota,
                    ask.algorithm,
                    cost,
                    take.max_wait,
                );
                // No request waits for this call: it may take twice a request's timeout
                // (a late answer is still an answer, timed from the send).
                let timeout = this.call_timeout().saturating_mul(2);
                let answer = match tokio::time::timeout(timeout, call).await {
                    Ok(Ok(s)) if s.len() == 1 => {
                        this.answered(sent_at);
                        inner.breaker.success(name);
                        this.repay();
                        s[0].outcome().copied()
                    }
                    Ok(Ok(_)) => {
                        inner.breaker.failure(
                            inner.clock.now(),
                            name,
                            &"a wrong number of statuses",
                        );
                        None
                    }
                    Ok(Err(e)) => {
                        inner.breaker.failure(inner.clock.now(), name, &e);
                        None
                    }
                    Err(_) => {
                        if this.silent() {
                            inner
                                .breaker
                                .failure(inner.clock.now(), name, &"no answer in time");
                        }
                        None
                    }
                };
                if let Some(o) = &answer {
                    // A lease that left nothing (refused, the last tokens, or reserved:
                    // the bucket is spent until its tokens are due): written back if the
                    // backend loses it.
                    this.remember(&leases, &key, ask.quota, ask.algorithm, sent_at, o);
                }
                let settled = Answer {
                    asked,
                    generation: take.generation,
                    sent_at,
                    answered_at: inner.clock.now(),
                    outcome: answer,
                    last: attempt == 1,
                };
                let (again, give_back) = leases.settle(&key, ask, settled);
                // Requests waiting for this lease decide again.
                leases.notify.notify_waiters();
                this.give_back(&leases, give_back);
                match again {
                    Some(n) => asked = n,
                    None => break,
                }
            }
        });
    }

    /// Gives unspent leased tokens back to the backend, in the background.
    fn give_back(&self, leases: &Arc<LeaseTable>, give_back: GiveBack) {
        if let Some((key, quota, algorithm, tokens)) = give_back {
            leases.give_back(&key, quota, algorithm, tokens);
        }
    }
}

impl<B: Backend> Resilient<B> {
    /// The lease table of the limit called `name`: one per name in this store, shared by
    /// every limit, layer or reloaded rule set of that name, so that the tokens one
    /// instance holds for a key are counted once (at most `L`).
    fn lease_table(&self, name: &str) -> Arc<LeaseTable> {
        let inner = &*self.inner;
        let mut by_name = inner
            .lease_by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(live) = by_name.get(name).and_then(std::sync::Weak::upgrade) {
            return live;
        }
        by_name.retain(|_, t| t.strong_count() > 0);
        let remote = Backed {
            backend: inner.backend.clone(),
            table: inner.backend.table(name),
        };
        let leases = Arc::new(LeaseTable::new(
            Box::new(remote),
            inner.lease_keys.clone(),
            inner.lease_counters.clone(),
            inner.clock.clone(),
            inner.timeout,
        ));
        by_name.insert(name.to_owned(), Arc::downgrade(&leases));
        leases
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

    /// A request of one leased limit whose lease is on its way: waits until a lease call
    /// of the table is settled (at most a call's timeout, the time its own call would
    /// have taken), then decides again; asks the backend if the lease did not bring it a
    /// token.
    async fn wait_for_lease(self, part: Part, ask: Ask) -> Statuses {
        let leases = part.remote.clone();
        leases
            .waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + self.call_timeout();
        let decided = loop {
            let notified = leases.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let asking = if self.inner.breaker.is_open() {
                Asking::Offline
            } else {
                Asking::Waited
            };
            let decided = leases.decide(&part.key, ask, self.inner.clock.now(), asking);
            self.give_back(&leases, decided.give_back);
            if let Some(take) = decided.take {
                self.take_lease(&leases, &part.key, ask, take);
            }
            match decided.local {
                Local::Wait if tokio::time::Instant::now() < deadline => {
                    let _ = tokio::time::timeout_at(deadline, notified).await;
                }
                local => break local,
            }
        };
        leases
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        match decided {
            l @ (Local::Taken(_) | Local::Refused(_)) => {
                std::iter::once(lease::status(&l)).collect()
            }
            Local::Wait | Local::Remote => {
                if matches!(decided, Local::Wait) {
                    leases.count_remote(&part.key);
                }
                if self.inner.breaker.permit(self.inner.clock.now()) == Permit::Skip {
                    return self.on_failure(Op::Check, &[part], true);
                }
                let call = leases.remote.call(
                    Op::Check,
                    &part.key,
                    part.quota,
                    part.algorithm,
                    part.cost,
                    part.max_wait,
                );
                let mut parts = SmallVec::new();
                parts.push(part);
                self.run(Op::Check, parts, call).await
            }
        }
    }
}

/// Gives back the tokens leased items took for a request that does not pass.
fn undo(taken: &Taken) {
    for (leases, key, cost) in taken {
        leases.undo(key, *cost);
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
    use crate::model::decision::Verdict;

    /// A backend that is down: only its tables matter here.
    #[derive(Clone)]
    struct Down;

    impl Backend for Down {
        type Table = ();
        type Future = std::future::Ready<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::ready(Err(StoreError::new("down")))
        }
    }

    /// A backend that never answers: every call times out.
    #[derive(Clone)]
    struct Silent;

    impl Backend for Silent {
        type Table = ();
        type Future = std::future::Pending<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::pending()
        }
    }

    async fn in_flight_check<B: Backend>(store: &Resilient<B>) -> Status {
        let table = store.table("jobs");
        let item = Item::new(&table, Key::from_part("k"), Quota::per_second(4), 1)
            .algorithm(Algorithm::in_flight())
            .on_failure(FailurePolicy::Share);
        match store.apply(Op::Check, &[item]) {
            Checked::Ready(s) => s[0],
            Checked::Pending(f) => f.await[0],
        }
    }

    /// The two-process flood's bug: an in-flight check that timed out got the local share
    /// beside the units the backend counted (12 in flight for 8). It refuses now; a
    /// backend that fails with an error gets the share.
    #[tokio::test(start_paused = true)]
    async fn a_timed_out_in_flight_check_refuses_and_a_failed_one_gets_the_share() {
        let silent = Resilient::new(Silent).timeout(Duration::from_millis(10));
        let s = in_flight_check(&silent).await;
        assert!(matches!(s, Status::Checked(o) if !o.is_allowed()), "{s:?}");
        assert_eq!(
            s.outcome().and_then(|o| o.retry_after()),
            Some(Duration::from_secs(1))
        );
        let down = Resilient::new(Down);
        let s = in_flight_check(&down).await;
        assert!(matches!(s, Status::Fallback(o) if o.is_allowed()), "{s:?}");
    }

    fn spent(table: &Arc<LeaseTable>, key: &str, until: u64) -> Refused {
        Refused {
            remote: table.clone(),
            key: Key::from_part(key),
            quota: Quota::per_second(10),
            algorithm: Algorithm::Gcra,
            until,
        }
    }

    /// Issue "shared limits under stress", item 8: one entry per key, the most spent
    /// state seen, kept through a write-back (a second loss restores it again) until it
    /// has passed.
    #[test]
    fn the_write_back_list_keeps_one_entry_per_key_the_most_spent_until_it_passes() {
        let store = Resilient::new(Down);
        let (api, other) = (store.lease_table("api"), store.lease_table("other"));
        let mut list = WriteBack::default();
        for until in [100, 50, 300, 200] {
            assert!(list.remember(spent(&api, "a", until), 0));
        }
        assert!(
            list.remember(spent(&other, "a", 10), 0),
            "another limit's key"
        );
        assert_eq!(list.keys.len(), 2);
        assert_eq!(list.until(&api, &Key::from_part("a")), Some(300));
        assert_eq!(list.live(20).len(), 1, "the other limit's entry has passed");
        assert_eq!(
            list.live(20).len(),
            1,
            "a write-back does not empty the list"
        );
        assert!(list.live(300).is_empty());
        assert_eq!(list.until(&api, &Key::from_part("a")), None);
    }

    /// The list is bounded: a new key finds no room while every entry is live; entries
    /// that have passed make room, looked for at most once a second.
    #[test]
    fn a_full_write_back_list_refuses_new_keys_and_makes_room_from_passed_entries() {
        let store = Resilient::new(Down);
        let api = store.lease_table("api");
        let mut list = WriteBack::default();
        for i in 0..REMEMBERED_REFUSALS {
            assert!(list.remember(spent(&api, &i.to_string(), 5_000_000_000), 0));
        }
        assert!(!list.remember(spent(&api, "new", 9_000_000_000), 1));
        // A known key still moves forward when the list is full.
        assert!(list.remember(spent(&api, "7", 6_000_000_000), 1));
        // Passed, and more than a second since the last look: room again.
        assert!(list.remember(spent(&api, "new", 9_000_000_000), 5_500_000_000));
        assert_eq!(list.keys.len(), 2);
    }

    #[test]
    fn cached_denials_report_the_remembered_wait() {
        let q = Quota::per_second(10); // T = 100 ms, burst 10
        let o = cached_outcome(&q, 3, 40_000_000);
        assert_eq!(
            o.verdict(),
            Verdict::Denied {
                retry_after: Duration::from_millis(240)
            }
        );
        assert_eq!(o.next_after(), Some(Duration::from_millis(40)));
        assert_eq!(o.reset_after(), Duration::from_millis(940));
        assert_eq!(cached_outcome(&q, 11, 1).verdict(), Verdict::Never);
    }
}
