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

    /// A request of `step` ns (its cost in emission intervals) against the marker of
    /// `key` read as the earliest instant at which a request of cost 1 passes (a shadow
    /// of the backend's bucket, with burst tolerance `tau` ns): `Err(until)` while that
    /// instant is ahead; otherwise the marker moves on by `step` from that instant (or from
    /// `now - tau`, if the bucket may have filled since), as the bucket's would, and `Ok`.
    /// A key without a marker is `Ok` and writes nothing. Returns the store's time too.
    pub(crate) fn claim_marker(
        &self,
        table: &MemoryTable,
        key: &Key,
        salt: u64,
        step: u64,
        tau: u64,
    ) -> (Result<bool, u64>, u64) {
        let now = self.inner.clock.now();
        let claim = |v: &AtomicU64| {
            let mut m = v.load(Ordering::Acquire);
            loop {
                if m > now {
                    return Err(m);
                }
                if m == 0 {
                    return Ok(false); // cleared: the backend decides, as without a cache
                }
                let from = m.max(now.saturating_sub(tau));
                match v.compare_exchange_weak(
                    m,
                    from.saturating_add(step),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Ok(true),
                    Err(actual) => m = actual,
                }
            }
        };
        let result = self
            .with_existing(&table.table, self.marker_slot(key, salt), claim)
            .unwrap_or(Ok(false));
        (result, now)
    }

    /// Takes back a claim of `step` ns made by [`claim_marker`](Self::claim_marker) for a
    /// request that was not sent after all.
    pub(crate) fn unclaim_marker(&self, table: &MemoryTable, key: &Key, salt: u64, step: u64) {
        let slot = self.marker_slot(key, salt);
        self.with_existing(&table.table, slot, |v| {
            let _ = v.fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| {
                Some(m.saturating_sub(step))
            });
        });
    }

    /// Forgets the marker of `key`.
    pub(crate) fn clear_marker(&self, table: &MemoryTable, key: &Key, salt: u64) {
        let slot = self.marker_slot(key, salt);
        self.with_existing(&table.table, slot, |v| v.store(0, Ordering::Release));
    }
}
