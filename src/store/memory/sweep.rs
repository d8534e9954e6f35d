//! Sweeping: dropping keys whose bucket has been full for the idle grace (all full
//! buckets near the cap), by a background task or, without a runtime, one shard per
//! request; the log line when the store reaches its key cap.

use super::*;

impl<C: Clock> Inner<C> {
    /// Whether the store is at (or within 1/16 of) its cap: sweeps then drop every full
    /// bucket, without waiting for the grace period.
    pub(super) fn under_pressure(&self) -> bool {
        let max = self.max_keys.load(Ordering::Relaxed);
        self.len.load(Ordering::Relaxed) >= max - max / 16
    }

    /// Time between two sweeps of one shard of a table: a whole table per grace period,
    /// and eight times as often under pressure (a pass over a million keys costs a few
    /// milliseconds, so that is well under 1% of a core even when nothing can be freed).
    pub(super) fn tick_ns(&self) -> u64 {
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
    pub(super) fn sweep_shard(&self, table: &Table, i: usize, now: u64) -> usize {
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
    pub(super) fn forget(&self, _table: &Table, removed: usize) -> usize {
        if removed > 0 {
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
    pub(super) fn sweep_next(&self, table: &Table, now: u64) -> usize {
        let i = table.cursor.fetch_add(1, Ordering::Relaxed) % SHARDS;
        self.sweep_shard(table, i, now)
    }

    /// The tables some engine still uses.
    pub(super) fn tables(&self) -> Vec<Arc<Table>> {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .live()
            .collect()
    }

    pub(super) fn log_at_cap(&self, table: &Table) {
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
    /// Starts the background sweeper if none runs and a Tokio runtime is at hand.
    pub(super) fn ensure_sweeper(&self) {
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
    pub(super) fn maybe_sweep(&self, table: &Table, now: u64) {
        let due_at = table.next_sweep.load(Ordering::Relaxed);
        if now < due_at {
            return;
        }
        self.sweep_due(table, now, due_at);
    }

    #[cold]
    pub(super) fn sweep_due(&self, table: &Table, now: u64, due_at: u64) {
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
}
