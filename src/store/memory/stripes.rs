//! Striped hot keys ([`Item::stripes`]): a GCRA key split into `n` buckets of
//! `⌊burst/n⌋` tokens refilled at `rate / n`, each an entry of its own (its own shard, its
//! own lock word and TAT), so that threads checking one key write different cache lines.
//! A thread checks its own stripe and borrows from the others when that one refuses.
//!
//! The bound: each stripe is a GCRA bucket that grants at most `⌊burst/n⌋ + d/(n·T)` over
//! any interval `d`, so the key grants at most `n·⌊burst/n⌋ + d/T ≤ burst + d/T`, the
//! bound of one bucket, whichever stripes the requests reach (and a refund or an undo goes
//! back to a stripe never beyond full, as in one bucket).

use std::cell::Cell;
use std::sync::atomic::AtomicU32;

use super::*;

/// The next thread's stripe index.
static NEXT_THREAD: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's stripe index, given out in turn at its first striped check.
    static THREAD: Cell<u32> = const { Cell::new(u32::MAX) };
}

/// This thread's stripe index (of any number of stripes: taken modulo it).
fn thread_index() -> u64 {
    THREAD.with(|t| {
        let mut i = t.get();
        if i == u32::MAX {
            i = NEXT_THREAD.fetch_add(1, Ordering::Relaxed) % (u32::MAX - 1);
            t.set(i);
        }
        u64::from(i)
    })
}

/// The stripes in effect for `item`: 1 for an unstriped key or a window algorithm,
/// else `item.stripes` lowered to the burst (every stripe holds at least one token).
#[inline]
pub(super) fn count(item: &Item<'_, MemoryTable>) -> u64 {
    if item.stripes <= 1 || item.algorithm.is_window() {
        return 1;
    }
    u64::from(item.stripes).min(item.quota.burst_size())
}

/// One stripe's bucket: `⌊burst/n⌋` tokens, one per `n·T`.
pub(super) fn stripe_params(item: &Item<'_, MemoryTable>, n: u64) -> Params {
    Params::new(
        item.quota.t_ns().saturating_mul(n),
        item.quota.burst_size() / n,
    )
}

impl<C: Clock> MemoryStore<C> {
    /// The compact key of stripe `i` (stripe 0 is the key itself): the key mixed with the
    /// store's secret, so that no client's key (an address is kept as it is) can be chosen
    /// to land on another key's stripe. Distinct for each `i`, the multipliers being odd.
    pub(super) fn stripe_key(&self, key: [u64; 2], i: u64) -> [u64; 2] {
        let (a, b) = self.inner.secret;
        [
            key[0] ^ (a | 1).wrapping_mul(i),
            key[1] ^ (b | 1).wrapping_mul(i),
        ]
    }

    /// The slot of stripe `i` of the key whose plain compact key is `key`.
    pub(super) fn stripe_slot(&self, key: [u64; 2], i: u64) -> Slot {
        let key = self.stripe_key(key, i);
        Slot {
            hash: self.inner.hasher.hash_one(key),
            key,
        }
    }

    /// The plain compact key and this thread's stripe of a striped item.
    pub(super) fn own_stripe(&self, key: [u64; 2], n: u64) -> Slot {
        self.stripe_slot(key, thread_index() % n)
    }

    /// A striped key's check: this thread's stripe first, then each other stripe in turn
    /// until one grants; when none holds the whole cost, the cost is gathered from several
    /// (a check, not a reservation); refused when all of them together do not hold it.
    pub(super) fn check_striped(
        &self,
        item: &Item<'_, MemoryTable>,
        n: u64,
        now: u64,
    ) -> gcra::Decided {
        let table = &*item.table.table;
        let params = stripe_params(item, n);
        let cost = u64::from(item.cost);
        let max_wait = max_wait_ns(item);
        let key = self.plain_key(item);
        let first = thread_index() % n;
        let mut best: Option<gcra::Decided> = None;
        for j in 0..n {
            let slot = self.stripe_slot(key, (first + j) % n);
            let d = self.decide_at(table, slot, params, now, cost, max_wait);
            if d.verdict.is_allowed() {
                return d;
            }
            if best.is_none_or(|b| d.reset_after(now) < b.reset_after(now)) {
                best = Some(d);
            }
        }
        let best = best.expect("at least one stripe");
        if max_wait > 0 || cost > n * params.burst() {
            return best;
        }
        self.gather(table, key, params, n, first, now, cost)
    }

    /// Takes `cost` tokens' time from the stripes together, from `first` on, each giving
    /// what it holds; if they do not hold it all, gives back what it took (never making a
    /// stripe fuller than it would have been without this request) and refuses, saying
    /// when the stripes, refilling side by side, would hold it.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        table: &Table,
        key: [u64; 2],
        params: Params,
        n: u64,
        first: u64,
        now: u64,
        cost: u64,
    ) -> gcra::Decided {
        let tau = params.tau();
        let mut needed = cost.saturating_mul(params.t());
        // What each stripe gave (at most 64 stripes), and how far from full they are after.
        let mut taken = [0u64; 64];
        let mut owed = 0u64;
        for j in 0..n {
            let slot = self.stripe_slot(key, (first + j) % n);
            let (x, after) = self.with_entry(table, slot, |tat| take(tat, now, tau, needed));
            taken[j as usize] = x;
            needed -= x;
            owed = owed.saturating_add(after - now);
        }
        if needed == 0 {
            let after = now + owed / n;
            return gcra::Decided::made(gcra::Admission::Allowed, Some(after), after);
        }
        for j in 0..n {
            let x = taken[j as usize];
            if x > 0 {
                let slot = self.stripe_slot(key, (first + j) % n);
                self.with_entry(table, slot, |tat| give(tat, x));
            }
        }
        gcra::Decided::made(
            gcra::Admission::Denied {
                retry_after: needed.div_ceil(n),
            },
            None,
            now + tau,
        )
    }
}

/// Takes up to `needed` ns of a stripe's tokens, as much as it holds at `now`: what it
/// took, and the stripe's TAT after (at least `now`).
fn take(tat: &AtomicU64, now: u64, tau: u64, needed: u64) -> (u64, u64) {
    let mut cur = tat.load(Ordering::Acquire);
    loop {
        let base = cur.max(now);
        let x = now.saturating_add(tau).saturating_sub(base).min(needed);
        if x == 0 {
            return (0, base);
        }
        match tat.compare_exchange_weak(cur, base + x, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return (x, base + x),
            Err(actual) => cur = actual,
        }
    }
}

/// Gives back `x` ns taken by [`take`]: the TAT holds them still (only this request's take
/// added them, and a TAT never moves back otherwise but by a refund or reset, which may
/// have given them already: then less, never below 0).
fn give(tat: &AtomicU64, x: u64) {
    let mut cur = tat.load(Ordering::Acquire);
    loop {
        match tat.compare_exchange_weak(
            cur,
            cur.saturating_sub(x),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::thread_index;
    use crate::store::MemoryStore;

    /// A thread keeps its stripe index, and threads get theirs in turn: different ones,
    /// so that threads checking one hot key write different stripes.
    #[test]
    fn each_thread_keeps_its_stripe_and_threads_get_different_ones() {
        let mine = thread_index();
        assert_eq!(thread_index(), mine);
        let mut all: Vec<u64> = (0..4)
            .map(|_| std::thread::spawn(thread_index).join().unwrap())
            .collect();
        all.push(mine);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 5, "{all:?}");
    }

    /// A key's stripes are distinct keys, stripe 0 the key itself, whatever the key's bits
    /// (all clear, all set, mixed); each half of a stripe's key differs from the key's, and
    /// where it lands depends on the store's secret: of three stores, no two put a stripe's
    /// half at the same place, so no client can choose a key that lands on another key's
    /// stripe.
    #[test]
    fn stripe_keys_are_distinct_and_follow_the_stores_secret() {
        let stores = [MemoryStore::new(), MemoryStore::new(), MemoryStore::new()];
        let one = &stores[0];
        for key in [
            [0, 0],
            [u64::MAX, u64::MAX],
            [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210],
            [1, u64::MAX - 1],
        ] {
            let mut stripes: Vec<[u64; 2]> = (0..64).map(|i| one.stripe_key(key, i)).collect();
            assert_eq!(stripes[0], key);
            for i in 1..64 {
                let halves = stores.each_ref().map(|s| s.stripe_key(key, i));
                for h in 0..2 {
                    assert_ne!(halves[0][h], key[h], "{key:?} {i} {h}");
                    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
                        assert_ne!(halves[a][h], halves[b][h], "{key:?} {i} {h}");
                    }
                }
            }
            stripes.sort_unstable();
            stripes.dedup();
            assert_eq!(stripes.len(), 64, "{key:?}");
        }
    }
}
