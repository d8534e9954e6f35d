//! The deny-cache markers `Resilient` keeps in a memory store: a per-key "refused until"
//! instant, in the same tables as the buckets.

use super::*;

/// Per-key timestamps that are forgotten once in the past: the deny cache of
/// [`Resilient`](super::Resilient) ("this key is refused until ...") kept in a memory
/// store's tables, which sweep them like full buckets.
impl<C: Clock> MemoryStore<C> {
    pub(super) fn marker_slot(&self, key: &Key, salt: u64) -> Slot {
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
