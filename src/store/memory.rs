//! [`MemoryStore`]: bucket state in this process.

use std::collections::HashMap;
use std::fmt;
use std::future::Ready;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;
use smallvec::SmallVec;

use super::{Checked, Item, Statuses, Store};
use crate::clock::{Clock, MonotonicClock};
use crate::decision::{Outcome, Status};
use crate::gcra::{self, Params};
#[cfg(feature = "redis")]
use crate::key::Key;
use crate::limit::Mode;

const SHARDS: usize = 64;
/// Shards are chosen by hash bits that hashbrown uses for neither the bucket index (low
/// bits) nor the control byte (top 7 bits).
const SHARD_SHIFT: u32 = 40;
/// The shortest time between two sweeps of one table.
const MIN_SWEEP_INTERVAL_NS: u64 = 1_000_000;
/// The most shards one request sweeps, to bound its latency after an idle period.
const MAX_SWEEPS_PER_REQUEST: u64 = 8;

/// Bucket state in this process's memory: the default store.
///
/// Clones share the same state.
///
/// # How it works
///
/// Each limit has a table of 64 shards; each shard is a `RwLock` over a hash table of
/// `(key, TAT)` entries, where the TAT is an `AtomicU64` updated by compare-and-swap under
/// the shard's *read* lock. So a request for an existing key takes no exclusive lock and
/// allocates nothing; the write lock is taken only to insert a new key or to sweep. Keys
/// are compacted to 16 bytes (an IP address exactly; other keys by a keyed 128-bit
/// SipHash) and an entry is 24 bytes.
///
/// Eviction needs no thread: a key whose TAT is in the past is a full bucket, which is the
/// same as no entry, so it can be dropped at any time without changing a decision.
/// Requests drive the sweeping: each table sweeps one shard per `refill time / 64`, so a
/// key idle for one refill time is gone within another. A shard about to grow is swept
/// first, so a table stays about as large as the set of keys active within one refill
/// time. [`MemoryStore::max_keys`] adds a hard cap.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{clock::FakeClock, store::MemoryStore};
///
/// let clock = FakeClock::new();
/// let store = MemoryStore::with_clock(clock.clone()).max_keys(1_000_000);
/// assert_eq!(store.len(), 0);
/// ```
pub struct MemoryStore<C: Clock = MonotonicClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    clock: C,
    /// Keys the 128-bit hash of non-address keys.
    secret: (u64, u64),
    hasher: foldhash::fast::RandomState,
    tables: Mutex<HashMap<Box<str>, Arc<Table>>>,
    /// Entries in all tables.
    len: AtomicUsize,
    max_keys: AtomicUsize,
    /// Whether new keys currently go to overflow buckets (logged when it changes).
    at_cap: AtomicBool,
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
    shards: Box<[Shard]>,
    /// When the next shard is due for a sweep (store clock, ns).
    next_sweep: AtomicU64,
    cursor: AtomicUsize,
    /// The largest refill time seen, which paces the sweeping.
    max_tau: AtomicU64,
    /// The bucket shared by keys that arrive while the store is at its cap.
    overflow: AtomicU64,
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

impl Table {
    fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            shards: (0..SHARDS)
                .map(|_| Shard(RwLock::new(HashTable::new())))
                .collect(),
            next_sweep: AtomicU64::new(0),
            cursor: AtomicUsize::new(0),
            max_tau: AtomicU64::new(0),
            overflow: AtomicU64::new(0),
        }
    }

    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> SHARD_SHIFT) as usize % SHARDS]
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
    /// An empty store on the monotonic clock.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new())
    }
}

impl Default for MemoryStore<MonotonicClock> {
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
                tables: Mutex::new(HashMap::new()),
                len: AtomicUsize::new(0),
                max_keys: AtomicUsize::new(usize::MAX),
                at_cap: AtomicBool::new(false),
            }),
        }
    }

    /// Caps the number of keys tracked over all limits.
    ///
    /// At the cap, a new key first makes its shard drop its idle keys; if the store is still
    /// full, the request is counted in one overflow bucket per limit (with the limit's
    /// quota), shared by all keys that arrive while the store is full. Keys already tracked
    /// keep their own buckets, so nothing is granted beyond any quota: under a flood of new
    /// keys, new clients share a bucket until idle keys are swept. Entering and leaving this
    /// state is logged once each. Choose a cap well above the number of keys active within
    /// one refill time; at 24 bytes of entry per key (about 50 bytes with the hash table's
    /// slack) a million keys take about 50 MB.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn max_keys(self, n: usize) -> Self {
        assert!(n > 0, "max_keys must be at least 1");
        self.inner.max_keys.store(n, Ordering::Relaxed);
        self
    }

    /// Number of keys tracked, over all limits (including some idle ones not swept yet).
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

    /// Runs `f` on the TAT of the entry, inserting it if needed (or on the overflow bucket
    /// when the store is at its cap).
    fn with_entry<R>(&self, table: &Table, slot: Slot, now: u64, f: impl Fn(&AtomicU64) -> R) -> R {
        if let Some(r) = self.with_existing(table, slot, &f) {
            return r;
        }
        self.with_new_entry(table, slot, now, f)
    }

    /// [`with_entry`](Self::with_entry) for a key just found absent: straight to the write
    /// lock.
    fn with_new_entry<R>(
        &self,
        table: &Table,
        slot: Slot,
        now: u64,
        f: impl Fn(&AtomicU64) -> R,
    ) -> R {
        match self.insert_with(table, slot, now, true, f) {
            Ok(r) => r,
            Err(f) => f(&table.overflow),
        }
    }

    /// Runs `f` on the entry under the write lock, inserting it if there is room; at the
    /// cap, hands `f` back (when `may_overflow`, after logging the state change).
    fn insert_with<R, F: Fn(&AtomicU64) -> R>(
        &self,
        table: &Table,
        slot: Slot,
        now: u64,
        may_overflow: bool,
        f: F,
    ) -> Result<R, F> {
        let mut map = table.shard(slot.hash).write();
        if let Some(e) = map.find(slot.hash, |e| e.key == slot.key) {
            return Ok(f(&e.tat));
        }
        let inner = &*self.inner;
        let max = inner.max_keys.load(Ordering::Relaxed);
        if inner.len.load(Ordering::Relaxed) >= max || map.len() == map.capacity() {
            // Make room before growing: idle keys are full buckets, the same as no entry.
            self.sweep_shard(&mut map, now);
        }
        if inner.len.load(Ordering::Relaxed) >= max {
            if may_overflow && !inner.at_cap.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    max_keys = max,
                    limit = &*table.name,
                    "tollgate memory store is at its key cap: new keys share an overflow bucket until idle keys expire"
                );
            }
            return Err(f);
        }
        let hasher = &inner.hasher;
        let entry = map.insert_unique(
            slot.hash,
            Entry {
                key: slot.key,
                tat: AtomicU64::new(0),
            },
            |e| hasher.hash_one(e.key),
        );
        inner.len.fetch_add(1, Ordering::Relaxed);
        Ok(f(&entry.get().tat))
    }

    /// Drops the entries of a shard whose bucket is full again.
    fn sweep_shard(&self, map: &mut HashTable<Entry>, now: u64) {
        let before = map.len();
        map.retain(|e| e.tat.load(Ordering::Relaxed) > now);
        let removed = before - map.len();
        if removed > 0 {
            let inner = &*self.inner;
            let len = inner.len.fetch_sub(removed, Ordering::Relaxed) - removed;
            if len < inner.max_keys.load(Ordering::Relaxed) / 10 * 9
                && inner.at_cap.swap(false, Ordering::Relaxed)
            {
                tracing::info!(
                    keys = len,
                    "tollgate memory store is below its key cap again"
                );
            }
        }
        if map.capacity() > 64 && map.len() * 4 < map.capacity() {
            let hasher = &self.inner.hasher;
            map.shrink_to(map.len() * 2, |e| hasher.hash_one(e.key));
        }
    }

    /// Sweeps the shards that are due, if this table is due: one shard per
    /// `max_tau / 64`, so a whole table per refill time.
    fn maybe_sweep(&self, table: &Table, now: u64) {
        let due_at = table.next_sweep.load(Ordering::Relaxed);
        if now < due_at {
            return;
        }
        let interval =
            (table.max_tau.load(Ordering::Relaxed) / SHARDS as u64).max(MIN_SWEEP_INTERVAL_NS);
        if table
            .next_sweep
            .compare_exchange(due_at, now + interval, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return; // another request took this sweep
        }
        let overdue = if due_at == 0 {
            0
        } else {
            (now - due_at) / interval
        };
        for _ in 0..(1 + overdue).min(MAX_SWEEPS_PER_REQUEST) {
            let i = table.cursor.fetch_add(1, Ordering::Relaxed) % SHARDS;
            self.sweep_shard(&mut table.shards[i].write(), now);
        }
    }

    /// Checks a single limit: one lookup and one CAS loop.
    #[inline]
    fn check_one(&self, item: &Item<'_, MemoryTable>, now: u64) -> Status {
        let table = &*item.table.table;
        let params = params(item);
        let cost = u64::from(item.cost);
        let slot = self.slot(item);
        let run = |tat: &AtomicU64| update(tat, |cur| gcra::decide(params, cur, now, cost)).0;
        let decided = match self.with_existing(table, slot, run) {
            Some(d) => d,
            None => {
                // An absent key is a full bucket: insert only if the request consumes.
                let d = gcra::decide(params, 0, now, cost);
                if d.new_tat.is_some() {
                    self.with_new_entry(table, slot, now, run)
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

    /// Checks several limits all or nothing: look at every bucket first, and consume only
    /// if all enforcing limits pass; a concurrent request that took the last token between
    /// the look and the consume makes this one give back what it took.
    fn check_all(&self, items: &[Item<'_, MemoryTable>], now: u64) -> Statuses {
        let slots: SmallVec<[Slot; 4]> = items.iter().map(|i| self.slot(i)).collect();
        // Look.
        let looked: SmallVec<[gcra::Outcome; 4]> = items
            .iter()
            .zip(&slots)
            .map(|(item, &slot)| {
                let tat = self.load(item, slot);
                gcra::check(params(item), tat, now, u64::from(item.cost))
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
            let (d, prev) = self.with_entry(&item.table.table, slots[i], now, |tat| {
                update(tat, |cur| gcra::decide(params, cur, now, cost))
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

    fn load(&self, item: &Item<'_, MemoryTable>, slot: Slot) -> u64 {
        self.with_existing(&item.table.table, slot, |tat| tat.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    /// Gives back what a request consumed: exactly, if nobody touched the bucket since;
    /// otherwise the part the TAT still holds (see [`gcra::refund_amount`]).
    fn refund(&self, item: &Item<'_, MemoryTable>, slot: Slot, written: u64, prev: u64, now: u64) {
        let cost_time = u64::from(item.cost).saturating_mul(item.quota.t_ns());
        self.with_existing(&item.table.table, slot, |tat| {
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
        });
    }
}

/// Per-key timestamps that are forgotten once in the past: the Redis store's deny cache
/// ("this key is refused until ...") kept in a memory store's tables, which sweep them like
/// full buckets.
#[cfg(feature = "redis")]
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
        table.max_tau.fetch_max(until - now, Ordering::Relaxed);
        self.maybe_sweep(table, now);
        let slot = self.marker_slot(key, salt);
        let _ = self.insert_with(table, slot, now, false, |v| {
            v.fetch_max(until, Ordering::AcqRel)
        });
    }
}

fn params(item: &Item<'_, MemoryTable>) -> Params {
    Params::new(item.quota.t_ns(), item.quota.burst_size())
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
            .field("max_keys", &self.inner.max_keys.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    type Table = MemoryTable;
    type Future = Ready<Statuses>;

    fn table(&self, name: &str) -> MemoryTable {
        let mut tables = self
            .inner
            .tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let table = tables
            .entry(name.into())
            .or_insert_with(|| Arc::new(Table::new(name)))
            .clone();
        MemoryTable { table }
    }

    #[inline]
    fn check(&self, items: &[Item<'_, MemoryTable>]) -> Checked<Self::Future> {
        let now = self.inner.clock.now();
        for item in items {
            let table = &*item.table.table;
            if item.quota.tau_ns() > table.max_tau.load(Ordering::Relaxed) {
                table
                    .max_tau
                    .fetch_max(item.quota.tau_ns(), Ordering::Relaxed);
            }
            self.maybe_sweep(table, now);
        }
        Checked::Ready(match items {
            [] => Statuses::new(),
            [one] => smallvec::smallvec![self.check_one(one, now)],
            many => self.check_all(many, now),
        })
    }
}
