//! The keys an instance granted on its own share while the backend could not be reached
//! ([`FailurePolicy::Share`](crate::FailurePolicy)): once the backend answers again, what
//! each key's share still lacks of a full share (its tokens spent and not yet refilled),
//! at most what was granted on it, is charged to the shared bucket (`Op::PenalizeOnce`,
//! sent again until answered; `Op::Penalize` to a backend that cannot apply a charge
//! once per id: `share.rs`, `repay`). The instances' shares together are one
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

/// A charge's id for [`Op::PenalizeOnce`](crate::store::Op::PenalizeOnce): unique in the
/// process (a random start, then one more each time), and across processes but by a
/// chance of about one in 2^64 per pair of charges of one bucket.
pub(super) fn charge_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let start = *START.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(u64::from(std::process::id()));
        h.finish()
    });
    start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// One key granted on its share: the limit's table and quota in the backend, and the
/// local table and share quota it was granted from.
pub(super) struct Debt {
    pub(super) remote: Arc<LeaseTable>,
    pub(super) key: Key,
    pub(super) quota: Quota,
    pub(super) local: MemoryTable,
    pub(super) share: Quota,
    /// The tokens the share held when the outage started (the rest of its bucket is room).
    pub(super) held: f64,
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
            d.held = debt.held;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algo::algorithm::Algorithm;
    use crate::base::clock::SharedClock;
    use crate::store::resilient::lease::{Remote, RemoteCall};
    use crate::store::{MemoryStore, Op, Store};

    /// A backend whose calls never answer: the debts are only noted and taken here.
    struct Never;

    impl Remote for Never {
        fn call(&self, _: Op, _: &Key, _: Quota, _: Algorithm, _: u32, _: Duration) -> RemoteCall {
            Box::pin(std::future::pending())
        }
    }

    fn remote() -> Arc<LeaseTable> {
        Arc::new(LeaseTable::new(
            Box::new(Never),
            Arc::default(),
            Arc::default(),
            SharedClock::default(),
            Duration::from_millis(50),
        ))
    }

    fn debt(remote: &Arc<LeaseTable>, key: &str, share: Quota, granted: u64) -> Debt {
        Debt {
            remote: remote.clone(),
            key: Key::from_part(key),
            quota: Quota::per_second(100),
            local: MemoryStore::new().table("api"),
            share,
            held: 1.0,
            granted,
        }
    }

    /// A key granted on its share twice is one debt: the grants add up, and the share is
    /// the one granted from last (the next charge is of what that share lacks).
    #[test]
    fn a_key_owed_twice_is_one_debt_with_both_grants_and_the_last_share() {
        let owed = Owed::default();
        let remote = remote();
        assert!(owed.add(debt(&remote, "k", Quota::per_second(10), 3)));
        assert!(owed.add(debt(&remote, "k", Quota::per_second(20), 4)));
        let debts = owed.take();
        assert_eq!(debts.len(), 1);
        assert_eq!(debts[0].granted, 7);
        assert_eq!(debts[0].share, Quota::per_second(20));
    }

    /// Taking empties the list: a second take finds nothing, and a key noted after it is
    /// taken again. Nothing noted: nothing taken.
    #[test]
    fn take_empties_the_list_and_finds_what_is_noted_after() {
        let owed = Owed::default();
        assert!(owed.take().is_empty());
        let remote = remote();
        assert!(owed.add(debt(&remote, "a", Quota::per_second(10), 1)));
        assert!(owed.add(debt(&remote, "b", Quota::per_second(10), 2)));
        let mut keys: Vec<u64> = owed.take().iter().map(|d| d.granted).collect();
        keys.sort_unstable();
        assert_eq!(keys, [1, 2]);
        assert!(owed.take().is_empty());
        assert!(owed.add(debt(&remote, "a", Quota::per_second(10), 5)));
        let again = owed.take();
        assert_eq!(again.len(), 1);
        assert_eq!(
            again[0].granted, 5,
            "a fresh debt, not added to the taken one"
        );
    }

    /// At `MAX_OWED_KEYS` keys a new key is not noted (`false`), a key already owed still
    /// is; and once taken the list has room again.
    #[test]
    fn a_full_list_refuses_new_keys_and_keeps_adding_to_owed_ones() {
        let owed = Owed::default();
        let remote = remote();
        for i in 0..MAX_OWED_KEYS {
            assert!(owed.add(debt(&remote, &i.to_string(), Quota::per_second(10), 1)));
        }
        assert!(!owed.add(debt(&remote, "new", Quota::per_second(10), 1)));
        assert!(owed.add(debt(&remote, "0", Quota::per_second(10), 1)));
        let debts = owed.take();
        assert_eq!(debts.len(), MAX_OWED_KEYS);
        assert_eq!(
            debts.iter().map(|d| d.granted).sum::<u64>(),
            MAX_OWED_KEYS as u64 + 1
        );
        assert!(owed.add(debt(&remote, "new", Quota::per_second(10), 1)));
    }
}
