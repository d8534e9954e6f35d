//! The keys an instance granted on its own share while the backend could not be reached
//! ([`FailurePolicy::Share`](crate::FailurePolicy)): once the backend answers again, what
//! each key's share still lacks of a full share (its tokens spent and not yet refilled),
//! at most what was granted on it, is charged to the shared bucket (`Op::Penalize`). The instances' shares together are one
//! bucket refilling at the limit's rate, so the sum of what they lack is what the shared
//! bucket would lack had their grants gone through it: after the outage the shared bucket
//! is as spent as the shares were, instead of as full as it was. GCRA keys only: a fixed
//! window's units belong to the window they were granted in, which may be over.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::lease::LeaseTable;
use crate::algo::quota::Quota;
use crate::model::key::Key;
use crate::store::MemoryTable;

/// Keys owed at most; the grants of further keys are not charged (counted in
/// `tollgate_writeback_dropped_total`).
pub(super) const MAX_OWED_KEYS: usize = 10_000;

/// One key granted on its share: the limit's table and quota in the backend, and the
/// local table and share quota it was granted from.
pub(super) struct Debt {
    pub(super) remote: Arc<LeaseTable>,
    pub(super) key: Key,
    pub(super) quota: Quota,
    pub(super) local: MemoryTable,
    pub(super) share: Quota,
    /// The tokens granted on the share since the backend last answered: the most that is
    /// charged (what the backend never counted).
    pub(super) granted: u64,
}

/// The keys owed, by (limit, key).
#[derive(Default)]
pub(super) struct Owed {
    debts: std::sync::Mutex<HashMap<(usize, Key), Debt, foldhash::fast::RandomState>>,
    /// How many keys are owed: read on every answered call, so that nothing is locked
    /// while nothing is owed.
    count: AtomicUsize,
}

impl Owed {
    /// Notes `debt` (its share is the one granted from last): `false` if the list is full
    /// and the key is new (nothing noted).
    pub(super) fn add(&self, debt: Debt) -> bool {
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        let id = (Arc::as_ptr(&debt.remote) as usize, debt.key.clone());
        if let Some(d) = debts.get_mut(&id) {
            d.share = debt.share;
            d.granted = d.granted.saturating_add(debt.granted);
            return true;
        }
        if debts.len() >= MAX_OWED_KEYS {
            return false;
        }
        debts.insert(id, debt);
        self.count.store(debts.len(), Ordering::Release);
        true
    }

    /// Everything owed, emptied; nothing (and no lock) when nothing is.
    pub(super) fn take(&self) -> Vec<Debt> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        self.count.store(0, Ordering::Release);
        debts.drain().map(|(_, d)| d).collect()
    }
}
