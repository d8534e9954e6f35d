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

use super::{Checked, Item, Op, Statuses, Store};
use crate::algo::gcra::{self, Params};
use crate::base::clock::{Clock, CpuClock};
use crate::model::decision::{Outcome, Status};
use crate::web::key::Key;

mod all;
mod bucket;
mod calendar;
mod inflight;
mod markers;
mod stripes;
mod sweep;
mod table;
mod windows;

use bucket::{max_wait_ns, params, report_params, update};
pub use table::MemoryTable;
use table::{Entry, Slot, Table, Tables, random_u64};

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
pub struct MemoryStore<C = CpuClock> {
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
    key_metrics: AtomicBool,
}

impl MemoryStore<CpuClock> {
    /// An empty store on the default clock ([`CpuClock`]), with the default key cap
    /// ([`DEFAULT_MAX_KEYS`]) and idle grace (10 s).
    pub fn new() -> Self {
        Self::with_clock(CpuClock::new())
    }
}

impl Default for MemoryStore<CpuClock> {
    fn default() -> Self {
        Self::new()
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
        self.inner.key_metrics.load(Ordering::Relaxed)
    }

    /// A store whose tables do not report `tollgate_keys` (the local stores of
    /// `Resilient`, whose tables carry the same limit names as the remote store's).
    pub(crate) fn without_key_metrics(self) -> Self {
        self.inner.key_metrics.store(false, Ordering::Relaxed);
        self
    }

    /// Where the item's bucket is: its key's entry, or (a striped key) this thread's
    /// stripe's.
    #[inline]
    fn slot(&self, item: &Item<'_, MemoryTable>) -> Slot {
        let key = self.plain_key(item);
        if item.stripes > 1 {
            let n = stripes::count(item);
            if n > 1 {
                return self.own_stripe(key, n);
            }
        }
        Slot {
            hash: self.inner.hasher.hash_one(key),
            key,
        }
    }

    /// The item's key compacted to 16 bytes.
    #[inline]
    fn plain_key(&self, item: &Item<'_, MemoryTable>) -> [u64; 2] {
        let k = item.key.compact(&self.inner.secret);
        [(k >> 64) as u64, k as u64]
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
        if let Some(keys) = &table.keys {
            keys.increment(1.0);
        }
        self.ensure_sweeper();
        Ok(r)
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
    fn ban_clock(&self) -> crate::base::clock::SharedClock {
        crate::base::clock::SharedClock::new(self.inner.clock.clone())
    }

    /// Every algorithm, in-flight limits too.
    fn supports(&self, _: &crate::algo::algorithm::Algorithm) -> Result<(), &'static str> {
        Ok(())
    }

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
        let op = match op {
            // In the process: each call is applied, and answered, exactly once.
            Op::PenalizeOnce { .. } => Op::Penalize,
            op => op,
        };
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
    use super::table::Shard;
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
