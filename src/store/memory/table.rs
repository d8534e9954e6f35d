//! The memory store's tables: one per limit name, 64 shards of `(key, TAT)` entries, the
//! overflow bucket, and what a table gives back to the store when it is dropped.

use super::*;

/// The tables of a store by name, not kept alive by the store.
pub(super) struct Tables {
    pub(super) by_name: HashMap<Box<str>, Weak<Table>>,
    /// The size at which names of dropped tables are next cleared out: amortized over the
    /// tables made, so making `n` tables costs `O(n)`.
    pub(super) prune_at: usize,
}

impl Tables {
    pub(super) fn live(&self) -> impl Iterator<Item = Arc<Table>> + '_ {
        self.by_name.values().filter_map(Weak::upgrade)
    }
}

/// One limit's buckets in a [`MemoryStore`] (see [`Store::table`]).
#[derive(Clone)]
pub struct MemoryTable {
    pub(super) table: Arc<Table>,
}

impl fmt::Debug for MemoryTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTable")
            .field("name", &self.table.name)
            .finish_non_exhaustive()
    }
}

pub(super) struct Table {
    pub(super) name: Box<str>,
    /// The store's count of entries, which this table's entries leave when it is dropped.
    pub(super) store_len: Arc<AtomicUsize>,
    /// The stable hash of the name (random window phases).
    pub(super) name_hash: u64,
    pub(super) shards: Box<[Shard]>,
    /// When requests next sweep a shard, if no background task does (store clock, ns).
    pub(super) next_sweep: AtomicU64,
    pub(super) cursor: AtomicUsize,
    /// The bucket shared by keys that arrive while the store is at its cap.
    pub(super) overflow: AtomicU64,
    /// `tollgate_keys{limit}`: moved on insertion and by sweeps, never per request.
    pub(super) keys: Option<crate::observe::probe::Gauge>,
    /// The index of the epoch-aligned window last seen by a window item (µs windows): a
    /// hint that saves the division of most checks, validated on each use.
    pub(super) aligned: AtomicU64,
    /// The calendar window last seen by a calendar item (`calendar.rs`), 0 before.
    pub(super) calendar: AtomicU64,
    /// The window algorithm this table serves, once a window item has used it (none for
    /// GCRA): what the sweeper needs to know when an entry's state is worthless.
    pub(super) spec: OnceLock<windows::Spec>,
    /// Sliding logs (variable state), sharded like the entries; made on first use.
    pub(super) logs: OnceLock<Box<[windows::LogShard]>>,
    /// The log shared by keys that arrive while the store is at its cap.
    pub(super) log_overflow: Mutex<windows::Log>,
}

/// A shard on its own cache lines, so that two threads on two shards do not contend.
#[repr(align(128))]
pub(super) struct Shard(RwLock<HashTable<Entry>>);

pub(super) struct Entry {
    pub(super) key: [u64; 2],
    pub(super) tat: AtomicU64,
}

impl Shard {
    pub(super) fn read(&self) -> RwLockReadGuard<'_, HashTable<Entry>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn write(&self) -> RwLockWriteGuard<'_, HashTable<Entry>> {
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
            if let Some(keys) = &self.keys {
                keys.decrement(entries as f64);
            }
        }
    }
}

impl Table {
    pub(super) fn new(name: &str, _key_metrics: bool, store_len: Arc<AtomicUsize>) -> Self {
        Self {
            keys: _key_metrics.then(|| crate::observe::probe::keys(name)),
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
            calendar: AtomicU64::new(0),
            spec: OnceLock::new(),
            logs: OnceLock::new(),
            log_overflow: Mutex::new(windows::Log::default()),
        }
    }

    pub(super) fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> SHARD_SHIFT) as usize % SHARDS]
    }

    /// The TAT an absent key starts from: the overflow bucket's, so that a key that spent
    /// from it while the store was full does not come back to a fuller bucket. (While the
    /// overflow bucket is full, this is the same as a full bucket.)
    /// An in-flight limit's key starts from nothing: the units in the overflow entry are
    /// other requests', given back there.
    pub(super) fn initial_tat(&self) -> u64 {
        if self.spec.get().is_some_and(|s| s.in_flight()) {
            return 0;
        }
        self.overflow.load(Ordering::Acquire)
    }
}

/// Where one request's bucket is: hashed once, used for every lookup.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    pub(super) hash: u64,
    pub(super) key: [u64; 2],
}

pub(super) fn random_u64(salt: u64) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.finish()
}
