//! [`MemoryStore`]: bucket state in this process.

use std::collections::HashMap;
use std::fmt;
use std::future::Ready;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{
    Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};
use std::time::Duration;

use hashbrown::HashTable;
use smallvec::SmallVec;

use super::{Checked, Item, Op, Statuses, Store};
use crate::algo::gcra::{self, Params};
use crate::base::clock::{Clock, MonotonicClock};
use crate::model::decision::{Outcome, Status};
use crate::model::policy::Mode;
use crate::web::key::Key;

mod windows;

const SHARDS: usize = 64;
/// Shards are chosen by hash bits that hashbrown uses for neither the bucket index (low
/// bits) nor the control byte (top 7 bits).
const SHARD_SHIFT: u32 = 40;
/// The default [`MemoryStore::max_keys`]: at about 50 bytes per key, some 25 MB.
pub const DEFAULT_MAX_KEYS: usize = 500_000;
/// The default [`MemoryStore::idle_grace`].
const DEFAULT_IDLE_GRACE: Duration = Duration::from_secs(10);
/// The shortest time between two sweeps of one shard of one table.
const MIN_TICK_NS: u64 = 1_000_000;

/// Bucket state in this process's memory: the default store.
///
/// Clones share the same state.
///
/// # How it works
///
/// Each limit has a table of 64 shards; each shard is a `RwLock` over a hash table of
/// `(key, TAT)` entries, where the TAT is an `AtomicU64` updated by compare-and-swap under
/// the shard's *read* lock. So a request for a tracked key takes no exclusive lock, writes
/// nothing but its own bucket and allocates nothing; the write lock is taken only to insert
/// a new key or to sweep. Keys are compacted to 16 bytes (an IP address exactly; other keys
/// by a keyed 128-bit SipHash) and an entry is 24 bytes.
///
/// # Memory
///
/// The store is bounded: at most [`max_keys`](Self::max_keys) keys over all limits
/// (default [`DEFAULT_MAX_KEYS`], about 25 MB). A key whose bucket has been full again for
/// the [`idle_grace`](Self::idle_grace) (default 10 s) is worth nothing — a full bucket is
/// the same as no entry — and is dropped within one more grace period: by a background
/// task when the store is used inside a Tokio runtime, otherwise by requests, one shard at
/// a time (so no single request pays for more than one shard's sweep). Keys of clients that
/// come back within the grace period stay, even when their bucket refilled in between, so
/// the common case never re-inserts. Near the cap, sweeps drop every full bucket without
/// waiting for the grace, and come eight times as often.
///
/// At the cap, a new key is counted in one overflow bucket per limit (with the limit's
/// quota), shared by every key that arrives while the store is full: a constant-time check
/// that takes no exclusive lock, so a flood of new keys costs no more than a known key. A
/// key that gets its own bucket later starts no fuller than the overflow bucket is then, so
/// moving between the two never grants more than `burst + d / T` over any interval `d`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{clock::FakeClock, store::MemoryStore};
///
/// let clock = FakeClock::new();
/// let store = MemoryStore::with_clock(clock.clone())
///     .max_keys(1_000_000)
///     .idle_grace(Duration::from_secs(30));
/// assert_eq!(store.len(), 0);
/// assert_eq!(store.key_cap(), Some(1_000_000));
/// ```
pub struct MemoryStore<C: Clock = MonotonicClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    clock: C,
    /// Keys the 128-bit hash of non-address keys.
    secret: (u64, u64),
    hasher: foldhash::fast::RandomState,
    /// The tables by limit name, held by the engines that use them: a table no engine
    /// holds any more (its limit was removed by a reload) is dropped with its buckets.
    tables: Mutex<Tables>,
    /// Entries in all tables (shared with the tables, which take theirs back when dropped).
    len: Arc<AtomicUsize>,
    max_keys: AtomicUsize,
    /// How long a full bucket is kept (ns of the store's clock).
    grace_ns: AtomicU64,
    /// Whether new keys currently go to overflow buckets (logged when it changes).
    at_cap: AtomicBool,
    /// Whether a background task sweeps the tables (else requests do).
    background: AtomicBool,
    /// Whether tables report `tollgate_keys` (not the local stores of `Resilient`).
    #[cfg(feature = "metrics")]
    key_metrics: AtomicBool,
}

/// The tables of a store by name, not kept alive by the store.
struct Tables {
    by_name: HashMap<Box<str>, Weak<Table>>,
    /// The size at which names of dropped tables are next cleared out: amortized over the
    /// tables made, so making `n` tables costs `O(n)`.
    prune_at: usize,
}

impl Tables {
    fn live(&self) -> impl Iterator<Item = Arc<Table>> + '_ {
        self.by_name.values().filter_map(Weak::upgrade)
    }
}

/// One limit's buckets in a [`MemoryStore`] (see [`Store::table`]).
#[derive(Clone)]
pub struct MemoryTable {
    table: Arc<Table>,
}

impl fmt::Debug for MemoryTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTable")
            .field("name", &self.table.name)
            .finish_non_exhaustive()
    }
}

struct Table {
    name: Box<str>,
    /// The store's count of entries, which this table's entries leave when it is dropped.
    store_len: Arc<AtomicUsize>,
    /// The stable hash of the name (random window phases).
    name_hash: u64,
    shards: Box<[Shard]>,
    /// When requests next sweep a shard, if no background task does (store clock, ns).
    next_sweep: AtomicU64,
    cursor: AtomicUsize,
    /// The bucket shared by keys that arrive while the store is at its cap.
    overflow: AtomicU64,
    /// `tollgate_keys{limit}`: moved on insertion and by sweeps, never per request.
    #[cfg(feature = "metrics")]
    keys: Option<::metrics::Gauge>,
    /// The index of the epoch-aligned window last seen by a window item (µs windows): a
    /// hint that saves the division of most checks, validated on each use.
    aligned: AtomicU64,
    /// The window algorithm this table serves, once a window item has used it (none for
    /// GCRA): what the sweeper needs to know when an entry's state is worthless.
    spec: OnceLock<windows::Spec>,
    /// Sliding logs (variable state), sharded like the entries; made on first use.
    logs: OnceLock<Box<[windows::LogShard]>>,
    /// The log shared by keys that arrive while the store is at its cap.
    log_overflow: Mutex<windows::Log>,
}

/// A shard on its own cache lines, so that two threads on two shards do not contend.
#[repr(align(128))]
struct Shard(RwLock<HashTable<Entry>>);

struct Entry {
    key: [u64; 2],
    tat: AtomicU64,
}

impl Shard {
    fn read(&self) -> RwLockReadGuard<'_, HashTable<Entry>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashTable<Entry>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Table {
    /// The table's entries leave the store's count (and the key gauge) with it.
    fn drop(&mut self) {
        let mut entries: usize = self
            .shards
            .iter_mut()
            .map(|s| s.0.get_mut().unwrap_or_else(PoisonError::into_inner).len())
            .sum();
        if let Some(logs) = self.logs.get_mut() {
            entries += logs
                .iter_mut()
                .map(windows::LogShard::len_mut)
                .sum::<usize>();
        }
        if entries > 0 {
            self.store_len.fetch_sub(entries, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            if let Some(keys) = &self.keys {
                keys.decrement(entries as f64);
            }
        }
    }
}

impl Table {
    fn new(name: &str, _key_metrics: bool, store_len: Arc<AtomicUsize>) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            keys: _key_metrics.then(|| crate::observe::metrics::keys(name)),
            name: name.into(),
            store_len,
            name_hash: crate::algo::algorithm::name_hash(name),
            shards: (0..SHARDS)
                .map(|_| Shard(RwLock::new(HashTable::new())))
                .collect(),
            next_sweep: AtomicU64::new(0),
            cursor: AtomicUsize::new(0),
            overflow: AtomicU64::new(0),
            aligned: AtomicU64::new(0),
            spec: OnceLock::new(),
            logs: OnceLock::new(),
            log_overflow: Mutex::new(windows::Log::default()),
        }
    }

    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> SHARD_SHIFT) as usize % SHARDS]
    }

    /// The TAT an absent key starts from: the overflow bucket's, so that a key that spent
    /// from it while the store was full does not come back to a fuller bucket. (While the
    /// overflow bucket is full, this is the same as a full bucket.)
    fn initial_tat(&self) -> u64 {
        self.overflow.load(Ordering::Acquire)
    }
}

/// Where one request's bucket is: hashed once, used for every lookup.
#[derive(Clone, Copy)]
struct Slot {
    hash: u64,
    key: [u64; 2],
}

fn random_u64(salt: u64) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.finish()
}

impl MemoryStore<MonotonicClock> {
    /// An empty store on the monotonic clock, with the default key cap
    /// ([`DEFAULT_MAX_KEYS`]) and idle grace (10 s).
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new())
    }
}

impl Default for MemoryStore<MonotonicClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> Inner<C> {
    /// Whether the store is at (or within 1/16 of) its cap: sweeps then drop every full
    /// bucket, without waiting for the grace period.
    fn under_pressure(&self) -> bool {
        let max = self.max_keys.load(Ordering::Relaxed);
        self.len.load(Ordering::Relaxed) >= max - max / 16
    }

    /// Time between two sweeps of one shard of a table: a whole table per grace period,
    /// and eight times as often under pressure (a pass over a million keys costs a few
    /// milliseconds, so that is well under 1% of a core even when nothing can be freed).
    fn tick_ns(&self) -> u64 {
        let per_pass = self.grace_ns.load(Ordering::Relaxed) / SHARDS as u64;
        let per_pass = if self.under_pressure() {
            per_pass / 8
        } else {
            per_pass
        };
        per_pass.max(MIN_TICK_NS)
    }

    /// Drops the entries of one shard whose bucket has been full for the grace period (or
    /// is full at all, under pressure). Returns how many.
    fn sweep_shard(&self, table: &Table, i: usize, now: u64) -> usize {
        let grace = if self.under_pressure() {
            0
        } else {
            self.grace_ns.load(Ordering::Relaxed)
        };
        let shard = &table.shards[i];
        let logs = table
            .logs
            .get()
            .map_or(0, |logs| self.sweep_logs(table, &logs[i], now, grace));
        let mut map = shard.write();
        let before = map.len();
        match table.spec.get() {
            // GCRA: the TAT is the instant the bucket is full again.
            None => map.retain(|e| e.tat.load(Ordering::Relaxed).saturating_add(grace) > now),
            Some(spec) => map.retain(|e| {
                spec.expiry(e.tat.load(Ordering::Relaxed), now)
                    .saturating_add(grace)
                    > now
            }),
        }
        let removed = before - map.len();
        let left = map.len();
        if map.capacity() > 64 && left * 4 < map.capacity() {
            let hasher = &self.hasher;
            map.shrink_to(left * 2, |e| hasher.hash_one(e.key));
        }
        drop(map);
        self.forget(table, removed + logs)
    }

    /// Counts `removed` entries of `table` out of the store; answers `removed`.
    fn forget(&self, _table: &Table, removed: usize) -> usize {
        if removed > 0 {
            #[cfg(feature = "metrics")]
            if let Some(keys) = &_table.keys {
                keys.decrement(removed as f64);
            }
            let len = self.len.fetch_sub(removed, Ordering::Relaxed) - removed;
            if len < self.max_keys.load(Ordering::Relaxed) / 10 * 9
                && self.at_cap.swap(false, Ordering::Relaxed)
            {
                tracing::info!(
                    keys = len,
                    "tollgate memory store is below its key cap again"
                );
            }
        }
        removed
    }

    /// Sweeps the next shard of `table`.
    fn sweep_next(&self, table: &Table, now: u64) -> usize {
        let i = table.cursor.fetch_add(1, Ordering::Relaxed) % SHARDS;
        self.sweep_shard(table, i, now)
    }

    /// The tables some engine still uses.
    fn tables(&self) -> Vec<Arc<Table>> {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .live()
            .collect()
    }

    fn log_at_cap(&self, table: &Table) {
        if !self.at_cap.load(Ordering::Relaxed) && !self.at_cap.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max_keys = self.max_keys.load(Ordering::Relaxed),
                limit = &*table.name,
                "tollgate memory store is at its key cap: new keys share an overflow bucket until idle keys expire"
            );
        }
    }
}

/// Sweeps the tables of a store in the background, one shard of each table per tick
/// (bounded work per step), until the store is dropped or the runtime shuts down.
async fn sweep_in_background<C: Clock>(store: Weak<Inner<C>>) {
    /// Marks the store as swept by requests again when the task ends.
    struct Running<C: Clock>(Weak<Inner<C>>);
    impl<C: Clock> Drop for Running<C> {
        fn drop(&mut self) {
            if let Some(inner) = self.0.upgrade() {
                inner.background.store(false, Ordering::Relaxed);
            }
        }
    }
    let _running = Running(store.clone());
    loop {
        let Some(tick) = store.upgrade().map(|i| i.tick_ns()) else {
            return;
        };
        tokio::time::sleep(Duration::from_nanos(tick)).await;
        let Some(inner) = store.upgrade() else {
            return;
        };
        let now = inner.clock.now();
        for table in inner.tables() {
            inner.sweep_next(&table, now);
        }
    }
}

impl<C: Clock> MemoryStore<C> {
    /// An empty store on `clock` (e.g. a [`FakeClock`](crate::clock::FakeClock) in tests).
    pub fn with_clock(clock: C) -> Self {
        Self {
            inner: Arc::new(Inner {
                clock,
                secret: (random_u64(1), random_u64(2)),
                hasher: foldhash::fast::RandomState::default(),
                tables: Mutex::new(Tables {
                    by_name: HashMap::new(),
                    prune_at: 64,
                }),
                len: Arc::new(AtomicUsize::new(0)),
                max_keys: AtomicUsize::new(DEFAULT_MAX_KEYS),
                grace_ns: AtomicU64::new(DEFAULT_IDLE_GRACE.as_nanos() as u64),
                at_cap: AtomicBool::new(false),
                background: AtomicBool::new(false),
                #[cfg(feature = "metrics")]
                key_metrics: AtomicBool::new(true),
            }),
        }
    }

    /// Caps the number of keys tracked over all limits (default [`DEFAULT_MAX_KEYS`]).
    ///
    /// At the cap, a new key is counted in one overflow bucket per limit (with the limit's
    /// quota), shared by all keys that arrive while the store is full; tracked keys keep
    /// their own buckets, and sweeps drop full buckets without waiting for the grace
    /// period to make room. Nothing is granted beyond any quota: a key's own bucket starts
    /// no fuller than the overflow bucket it may have spent from. Under a flood of new keys
    /// the price is that new clients share a bucket until room is made. Entering and
    /// leaving this state is logged once each. An entry takes 24 bytes (about 50 with the
    /// hash tables' slack): a million keys take about 50 MB.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn max_keys(self, n: usize) -> Self {
        assert!(n > 0, "max_keys must be at least 1");
        self.inner.max_keys.store(n, Ordering::Relaxed);
        self
    }

    /// Removes the key cap: memory grows with the number of keys active within the grace
    /// period. Only for keys the application controls (never for keys a client chooses,
    /// such as an API-key header before authentication).
    pub fn unbounded(self) -> Self {
        self.inner.max_keys.store(usize::MAX, Ordering::Relaxed);
        self
    }

    /// How long a key whose bucket is full again is kept (default 10 s): a client that
    /// comes back within it finds its entry in place. It is then dropped within one more
    /// `grace`. A full bucket is the same as no entry, so this changes no decision, only
    /// memory and the cost of re-inserting returning keys.
    pub fn idle_grace(self, grace: Duration) -> Self {
        let ns = u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX);
        self.inner.grace_ns.store(ns, Ordering::Relaxed);
        self
    }

    /// The key cap, or `None` if [`unbounded`](Self::unbounded).
    pub fn key_cap(&self) -> Option<usize> {
        Some(self.inner.max_keys.load(Ordering::Relaxed)).filter(|&n| n != usize::MAX)
    }

    /// Number of tables (one per limit name) that the layers and limiters built on this
    /// store still use. A limit removed by a reload of rules takes its table, and its
    /// keys, with it once no request uses the old rules.
    pub fn table_count(&self) -> usize {
        self.inner
            .tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .live()
            .count()
    }

    /// Number of keys tracked, over all limits (including idle ones not swept yet).
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Relaxed)
    }

    /// `true` if no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// Sweeps every table now, one shard at a time, and returns how many keys were
    /// dropped. Never needed for correctness; for applications that want to reclaim memory
    /// at a moment of their choosing (the store sweeps by itself, see the type's docs).
    pub fn sweep(&self) -> usize {
        let inner = &*self.inner;
        let mut removed = 0;
        for table in inner.tables() {
            for i in 0..SHARDS {
                removed += inner.sweep_shard(&table, i, inner.clock.now());
            }
        }
        removed
    }

    /// Whether new tables report `tollgate_keys` (feature `metrics`).
    fn key_metrics(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.inner.key_metrics.load(Ordering::Relaxed);
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// A store whose tables do not report `tollgate_keys` (the local stores of
    /// `Resilient`, whose tables carry the same limit names as the remote store's).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn without_key_metrics(self) -> Self {
        #[cfg(feature = "metrics")]
        self.inner.key_metrics.store(false, Ordering::Relaxed);
        self
    }

    /// Starts the background sweeper if none runs and a Tokio runtime is at hand.
    fn ensure_sweeper(&self) {
        let inner = &self.inner;
        if inner.background.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if inner
            .background
            .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            runtime.spawn(sweep_in_background(Arc::downgrade(inner)));
        }
    }

    /// Without a background sweeper: sweeps one shard of `table` if one is due. The first
    /// request of a tick pays one shard's sweep; the others pay two atomic loads.
    #[inline]
    fn maybe_sweep(&self, table: &Table, now: u64) {
        let due_at = table.next_sweep.load(Ordering::Relaxed);
        if now < due_at {
            return;
        }
        self.sweep_due(table, now, due_at);
    }

    #[cold]
    fn sweep_due(&self, table: &Table, now: u64, due_at: u64) {
        let inner = &*self.inner;
        if table
            .next_sweep
            .compare_exchange(
                due_at,
                now.saturating_add(inner.tick_ns()),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return; // another request took this sweep
        }
        self.ensure_sweeper();
        if due_at != 0 {
            inner.sweep_next(table, now);
        }
    }

    #[inline]
    fn slot(&self, item: &Item<'_, MemoryTable>) -> Slot {
        let k = item.key.compact(&self.inner.secret);
        let key = [(k >> 64) as u64, k as u64];
        Slot {
            hash: self.inner.hasher.hash_one(key),
            key,
        }
    }

    /// Runs `f` on the TAT of an existing entry, under the shard's read lock.
    #[inline]
    fn with_existing<R>(
        &self,
        table: &Table,
        slot: Slot,
        f: impl FnOnce(&AtomicU64) -> R,
    ) -> Option<R> {
        let map = table.shard(slot.hash).read();
        map.find(slot.hash, |e| e.key == slot.key)
            .map(|e| f(&e.tat))
    }

    /// Runs `f` on the key's bucket: its entry, a new entry, or (at the cap) the table's
    /// overflow bucket.
    ///
    /// At the cap the overflow bucket is used under the same read lock as the lookup that
    /// found no entry: an entry cannot be inserted in between, so a key never spends from
    /// the overflow bucket while it has a bucket of its own.
    fn with_entry<R>(&self, table: &Table, slot: Slot, f: impl Fn(&AtomicU64) -> R) -> R {
        {
            let map = table.shard(slot.hash).read();
            if let Some(e) = map.find(slot.hash, |e| e.key == slot.key) {
                return f(&e.tat);
            }
            if self.at_or_over_cap() {
                self.inner.log_at_cap(table);
                return f(&table.overflow);
            }
        }
        match self.insert_with(table, slot, || table.initial_tat(), f) {
            Ok(r) => r,
            Err(f) => f(&table.overflow),
        }
    }

    #[inline]
    fn at_or_over_cap(&self) -> bool {
        let inner = &*self.inner;
        inner.len.load(Ordering::Relaxed) >= inner.max_keys.load(Ordering::Relaxed)
    }

    /// Runs `f` on the entry under the write lock, inserting it (starting from the TAT
    /// `initial` gives) if there is room; at the cap (still under the write lock, so the
    /// key cannot appear meanwhile), hands `f` back.
    fn insert_with<R, F: Fn(&AtomicU64) -> R>(
        &self,
        table: &Table,
        slot: Slot,
        initial: impl FnOnce() -> u64,
        f: F,
    ) -> Result<R, F> {
        let inner = &*self.inner;
        let mut map = table.shard(slot.hash).write();
        if let Some(e) = map.find(slot.hash, |e| e.key == slot.key) {
            return Ok(f(&e.tat));
        }
        let max = inner.max_keys.load(Ordering::Relaxed);
        if inner.len.fetch_add(1, Ordering::Relaxed) >= max {
            inner.len.fetch_sub(1, Ordering::Relaxed);
            return Err(f);
        }
        let hasher = &inner.hasher;
        let entry = map.insert_unique(
            slot.hash,
            Entry {
                key: slot.key,
                tat: AtomicU64::new(initial()),
            },
            |e| hasher.hash_one(e.key),
        );
        let r = f(&entry.get().tat);
        drop(map);
        #[cfg(feature = "metrics")]
        if let Some(keys) = &table.keys {
            keys.increment(1.0);
        }
        self.ensure_sweeper();
        Ok(r)
    }

    /// Checks a single limit: one lookup and one CAS loop.
    #[inline]
    fn check_one(&self, item: &Item<'_, MemoryTable>, now: u64) -> Status {
        if item.algorithm.is_window() {
            return self.window_check_one(item, now);
        }
        let table = &*item.table.table;
        let params = params(item);
        let cost = u64::from(item.cost);
        let slot = self.slot(item);
        let max_wait = max_wait_ns(item);
        let decide = |cur| gcra::decide_within(params, cur, now, cost, max_wait);
        let run = |tat: &AtomicU64| update(tat, decide).0;
        let decided = match self.with_existing(table, slot, run) {
            Some(d) => d,
            None => {
                // An absent key starts from `initial_tat`: insert only if the request
                // consumes.
                let d = decide(table.initial_tat());
                if d.new_tat.is_some() {
                    self.with_entry(table, slot, run)
                } else {
                    d
                }
            }
        };
        Status::Checked(Outcome::new(
            decided.verdict,
            decided.reset_after(now),
            params,
            1,
        ))
    }

    /// Applies an operation other than a check to one bucket, in one
    /// compare-and-swap, and reports the bucket as it is afterwards.
    fn update_one(&self, op: Op, item: &Item<'_, MemoryTable>, now: u64) -> Status {
        if item.algorithm.is_window() {
            return self.window_update_one(op, item, now);
        }
        let table = &*item.table.table;
        let params = params(item);
        let cost_time = u64::from(item.cost).saturating_mul(params.t());
        let slot = self.slot(item);
        let set = |tat: &AtomicU64, f: &dyn Fn(u64) -> u64| -> u64 {
            let mut cur = tat.load(Ordering::Acquire);
            loop {
                let new = f(cur);
                match tat.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return new,
                    Err(actual) => cur = actual,
                }
            }
        };
        let after = match op {
            Op::Refund => self
                .with_existing(table, slot, |tat| {
                    set(tat, &|cur| cur.saturating_sub(cost_time).max(now))
                })
                .unwrap_or_else(|| table.initial_tat()),
            Op::Penalize => self.with_entry(table, slot, |tat| {
                set(tat, &|cur| cur.max(now).saturating_add(cost_time))
            }),
            Op::Block(d) => {
                let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                // A cost-1 request passes when TAT + T - tau <= now + d.
                let until = now
                    .saturating_add(d)
                    .saturating_add(params.tau())
                    .saturating_sub(params.t());
                self.with_entry(table, slot, |tat| set(tat, &|cur| cur.max(until)))
            }
            Op::Reset => {
                self.with_existing(table, slot, |tat| tat.store(0, Ordering::Release));
                0
            }
            Op::Check => unreachable!("checks take the check path"),
        };
        let o = gcra::peek(params, after, now);
        Status::Checked(Outcome::new(o.verdict, o.reset_after, params, 1))
    }

    /// Checks several limits all or nothing: look at every bucket first, and consume only
    /// if all enforcing limits pass; a concurrent request that took the last token between
    /// the look and the consume makes this one give back what it took.
    fn check_all(&self, items: &[Item<'_, MemoryTable>], now: u64) -> Statuses {
        if items.iter().any(|i| i.algorithm.is_window()) {
            return self.check_mixed(items, now);
        }
        let slots: SmallVec<[Slot; 4]> = items.iter().map(|i| self.slot(i)).collect();
        // Look.
        let looked: SmallVec<[gcra::Outcome; 4]> = items
            .iter()
            .zip(&slots)
            .map(|(item, &slot)| {
                let (params, tat) = (params(item), self.load(item, slot));
                gcra::decide_within(params, tat, now, u64::from(item.cost), max_wait_ns(item))
                    .report(params, now)
            })
            .collect();
        // (A look reports in full: a refused request answers from it.)
        let refused = items
            .iter()
            .zip(&looked)
            .any(|(item, o)| item.mode == Mode::Enforce && !o.verdict.is_allowed());
        if refused {
            return self.report_unchanged(items, &slots, &looked, now);
        }
        // Consume, in configuration order.
        let mut statuses = Statuses::new();
        let mut taken: SmallVec<[(usize, u64, u64); 4]> = SmallVec::new();
        for (i, item) in items.iter().enumerate() {
            let params = params(item);
            let cost = u64::from(item.cost);
            if cost == 0 || !looked[i].verdict.is_allowed() {
                let o = &looked[i];
                statuses.push(Status::Checked(Outcome::new(
                    o.verdict,
                    o.reset_after,
                    params,
                    1,
                )));
                continue;
            }
            let max_wait = max_wait_ns(item);
            let (d, prev) = self.with_entry(&item.table.table, slots[i], |tat| {
                update(tat, |cur| {
                    gcra::decide_within(params, cur, now, cost, max_wait)
                })
            });
            if let Some(written) = d.new_tat {
                taken.push((i, written, prev));
            } else if item.mode == Mode::Enforce {
                // Lost a race for the last tokens: undo, and report the refusal.
                for &(j, written, prev) in &taken {
                    self.refund(&items[j], slots[j], written, prev, now);
                }
                let mut looked = looked.clone();
                looked[i] = d.report(params, now);
                return self.report_unchanged(items, &slots, &looked, now);
            }
            statuses.push(Status::Checked(Outcome::new(
                d.verdict,
                d.reset_after(now),
                params,
                1,
            )));
        }
        statuses
    }

    /// The statuses of a refused request: the refusing limits as checked, the others as
    /// they stand (nothing was consumed).
    fn report_unchanged(
        &self,
        items: &[Item<'_, MemoryTable>],
        slots: &[Slot],
        checked: &[gcra::Outcome],
        now: u64,
    ) -> Statuses {
        items
            .iter()
            .zip(slots)
            .zip(checked)
            .map(|((item, &slot), o)| {
                let o = if o.verdict.is_allowed() {
                    gcra::peek(params(item), self.load(item, slot), now)
                } else {
                    *o
                };
                Status::Checked(Outcome::new(o.verdict, o.reset_after, params(item), 1))
            })
            .collect()
    }

    /// The key's TAT as it stands (an absent key's is the one it would start from).
    fn load(&self, item: &Item<'_, MemoryTable>, slot: Slot) -> u64 {
        let table = &*item.table.table;
        self.with_existing(table, slot, |tat| tat.load(Ordering::Acquire))
            .unwrap_or_else(|| table.initial_tat())
    }

    /// Gives back what a request consumed: exactly, if nobody touched the bucket since;
    /// otherwise the part the TAT still holds (see [`gcra::refund_amount`]).
    fn refund(&self, item: &Item<'_, MemoryTable>, slot: Slot, written: u64, prev: u64, now: u64) {
        let cost_time = u64::from(item.cost).saturating_mul(item.quota.t_ns());
        let table = &*item.table.table;
        let give_back = |tat: &AtomicU64| {
            let mut cur = tat.load(Ordering::Acquire);
            loop {
                let target = if cur == written {
                    prev
                } else {
                    cur.saturating_sub(gcra::refund_amount(cost_time, written, now))
                };
                match tat.compare_exchange_weak(cur, target, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => break,
                    Err(actual) => cur = actual,
                }
            }
        };
        // A key without an entry consumed from the overflow bucket.
        if self.with_existing(table, slot, give_back).is_none() {
            give_back(&table.overflow);
        }
    }
}

/// Per-key timestamps that are forgotten once in the past: the deny cache of
/// [`Resilient`](super::Resilient) ("this key is refused until ...") kept in a memory
/// store's tables, which sweep them like full buckets.
impl<C: Clock> MemoryStore<C> {
    fn marker_slot(&self, key: &Key, salt: u64) -> Slot {
        let k = key.compact(&self.inner.secret);
        let key = [(k >> 64) as u64 ^ salt, k as u64];
        Slot {
            hash: self.inner.hasher.hash_one(key),
            key,
        }
    }

    /// The marker of `key` (0 if none), and the store's time.
    pub(crate) fn marker(&self, table: &MemoryTable, key: &Key, salt: u64) -> (u64, u64) {
        let now = self.inner.clock.now();
        let value = self
            .with_existing(&table.table, self.marker_slot(key, salt), |v| {
                v.load(Ordering::Acquire)
            })
            .unwrap_or(0);
        (value, now)
    }

    /// Raises the marker of `key` to `until` (store time). At the cap, nothing is kept.
    pub(crate) fn raise_marker(&self, table: &MemoryTable, key: &Key, salt: u64, until: u64) {
        let now = self.inner.clock.now();
        let table = &*table.table;
        if until <= now {
            return;
        }
        if !self.inner.background.load(Ordering::Relaxed) {
            self.maybe_sweep(table, now);
        }
        let slot = self.marker_slot(key, salt);
        let raise = |v: &AtomicU64| v.fetch_max(until, Ordering::AcqRel);
        if self.with_existing(table, slot, raise).is_none() && !self.at_or_over_cap() {
            let _ = self.insert_with(table, slot, || 0, raise);
        }
    }

    /// Forgets the marker of `key`.
    pub(crate) fn clear_marker(&self, table: &MemoryTable, key: &Key, salt: u64) {
        let slot = self.marker_slot(key, salt);
        self.with_existing(&table.table, slot, |v| v.store(0, Ordering::Release));
    }
}

fn params(item: &Item<'_, MemoryTable>) -> Params {
    Params::new(item.quota.t_ns(), item.quota.burst_size())
}

/// How long a reservation may wait, in ns (0: a check).
#[inline(always)]
fn max_wait_ns(item: &Item<'_, impl Sized>) -> u64 {
    u64::try_from(item.max_wait.as_nanos()).unwrap_or(u64::MAX)
}

/// Applies `f` to the TAT with compare-and-swap until it sticks; returns the decision and
/// the TAT it replaced.
#[inline]
fn update(tat: &AtomicU64, f: impl Fn(u64) -> gcra::Decided) -> (gcra::Decided, u64) {
    let mut cur = tat.load(Ordering::Acquire);
    loop {
        let o = f(cur);
        let Some(new) = o.new_tat else {
            return (o, cur);
        };
        match tat.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return (o, cur),
            Err(actual) => cur = actual,
        }
    }
}

impl<C: Clock> Clone for MemoryStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Clock> fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.len())
            .field("max_keys", &self.key_cap())
            .field(
                "idle_grace",
                &Duration::from_nanos(self.inner.grace_ns.load(Ordering::Relaxed)),
            )
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    type Table = MemoryTable;
    type Future = Ready<Statuses>;

    /// The table of `name`: the one the engines using it hold (a reload that keeps a
    /// limit's name keeps its buckets), or a new one. The store itself does not keep it:
    /// once no engine uses a name, its table and buckets are dropped.
    fn table(&self, name: &str) -> MemoryTable {
        let mut tables = self
            .inner
            .tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(table) = tables.by_name.get(name).and_then(Weak::upgrade) {
            return MemoryTable { table };
        }
        if tables.by_name.len() >= tables.prune_at {
            tables.by_name.retain(|_, t| t.strong_count() > 0);
            tables.prune_at = (tables.by_name.len() * 2).max(64);
        }
        let table = Arc::new(Table::new(name, self.key_metrics(), self.inner.len.clone()));
        tables.by_name.insert(name.into(), Arc::downgrade(&table));
        MemoryTable { table }
    }

    fn apply(&self, op: Op, items: &[Item<'_, MemoryTable>]) -> Checked<Self::Future> {
        if op == Op::Check {
            return self.check(items);
        }
        let now = self.inner.clock.now();
        Checked::Ready(items.iter().map(|i| self.update_one(op, i, now)).collect())
    }

    #[inline]
    fn check(&self, items: &[Item<'_, MemoryTable>]) -> Checked<Self::Future> {
        let now = self.inner.clock.now();
        if !self.inner.background.load(Ordering::Relaxed) {
            for item in items {
                self.maybe_sweep(&item.table.table, now);
            }
        }
        Checked::Ready(match items {
            [] => Statuses::new(),
            [one] => smallvec::smallvec![self.check_one(one, now)],
            many => self.check_all(many, now),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::algo::quota::Quota;
    use crate::base::clock::FakeClock;
    use crate::web::key::Key;

    fn check(store: &MemoryStore<FakeClock>, table: &MemoryTable, key: Key) -> bool {
        let Checked::Ready(s) = store.check(&[Item::new(table, key, Quota::per_hour(10), 1)])
        else {
            unreachable!()
        };
        s[0].outcome().unwrap().is_allowed()
    }

    #[test]
    fn new_keys_at_the_cap_take_no_exclusive_lock() {
        let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1))).max_keys(1_000);
        let table = store.table("t");
        for i in 0..1_000u32 {
            assert!(check(&store, &table, Key::from_part(i)));
        }
        assert_eq!(store.len(), 1_000);
        // Hold every shard's read lock: a request that wanted a write lock (to insert, or to
        // scan the shard for room) would block until the end of the test.
        let guards: Vec<_> = table.table.shards.iter().map(Shard::read).collect();
        let (done, finished) = mpsc::channel();
        let (s, t) = (store.clone(), table.clone());
        std::thread::spawn(move || {
            let allowed = (0..10_000u32)
                .filter(|i| check(&s, &t, Key::from_part(1_000_000 + i)))
                .count();
            let _ = done.send(allowed);
        });
        let allowed = finished
            .recv_timeout(Duration::from_secs(30))
            .expect("new keys at the cap waited for a shard's write lock");
        drop(guards);
        // The 10,000 new keys shared one overflow bucket of 10.
        assert_eq!(allowed, 10);
        assert_eq!(store.len(), 1_000);
    }

    #[test]
    fn an_absent_key_reads_as_the_overflow_bucket_while_that_is_not_full() {
        let clock = FakeClock::at(Duration::from_secs(1));
        let store = MemoryStore::with_clock(clock.clone()).max_keys(1);
        let table = store.table("t");
        assert!(check(&store, &table, Key::from_part("a")));
        // At the cap: `b` drains the overflow bucket.
        for _ in 0..10 {
            assert!(check(&store, &table, Key::from_part("b")));
        }
        assert!(!check(&store, &table, Key::from_part("b")));
        // Room again: `c` gets an entry, but starts from the drained overflow bucket.
        store.sweep();
        clock.advance(Duration::from_secs(360 * 3 + 1));
        store.sweep();
        assert_eq!(store.len(), 0);
        let allowed = (0..10)
            .filter(|_| check(&store, &table, Key::from_part("c")))
            .count();
        assert_eq!(allowed, 3, "3 tokens refilled in 3 refill intervals");
    }
}
