//! In-flight limits in the memory store ([`Algorithm::InFlight`]): the entry's word is the
//! number of units a key's requests hold, taken by compare-and-swap under the shard's read
//! lock like a GCRA TAT and given back by [`Op::Refund`]. Time frees nothing: an entry
//! that holds units is never swept (it is worth something until they come back), and one
//! that holds none is worth nothing. A key that took its units from the table's overflow
//! entry (the store was at its key cap) gives them back there.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{MemoryStore, MemoryTable, Slot};
use crate::algo::algorithm::Algorithm;
use crate::algo::gcra::Admission;
use crate::algo::window::Report;
use crate::base::clock::Clock;
use crate::model::decision::{Outcome, Status};
use crate::store::{Item, Op};

/// Checks `cost` units against `used` of `limit`: the report (µs) and the new count, if
/// the request passes and takes something.
pub(super) fn decide(
    limit: u64,
    retry_after_us: u64,
    used: u64,
    cost: u64,
) -> (Report, Option<u64>) {
    let report = |verdict, remaining| Report {
        verdict,
        remaining,
        reset_after: 0,
        next_after: None,
        wait: 0,
    };
    if cost > limit {
        return (report(Admission::Never, limit.saturating_sub(used)), None);
    }
    match used.checked_add(cost).filter(|&n| n <= limit) {
        Some(n) => (
            report(Admission::Allowed, limit - n),
            (cost > 0).then_some(n),
        ),
        None => (
            report(
                Admission::Denied {
                    retry_after: retry_after_us,
                },
                limit.saturating_sub(used),
            ),
            None,
        ),
    }
}

fn retry_after_us(algorithm: Algorithm) -> u64 {
    algorithm
        .retry_after()
        .map_or(0, |d| d.as_micros().try_into().unwrap_or(u64::MAX))
}

impl<C: Clock> MemoryStore<C> {
    /// Looks at (`consume == false`) or takes `cost` units of an in-flight item; whether
    /// it took them.
    pub(super) fn in_flight_check(
        &self,
        item: &Item<'_, MemoryTable>,
        now: u64,
        cost: u64,
        consume: bool,
    ) -> (Report, bool) {
        // Records the table's spec for the sweeper (and new entries start from 0).
        let _ = self.ctx(item, now);
        let table = &*item.table.table;
        let slot = self.slot(item);
        let limit = item.quota.rate();
        let retry = retry_after_us(item.algorithm);
        let run = |word: &AtomicU64| {
            let mut cur = word.load(Ordering::Acquire);
            loop {
                let (r, new) = decide(limit, retry, cur, cost);
                let Some(new) = new.filter(|_| consume) else {
                    return (r, false);
                };
                match word.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return (r, true),
                    Err(actual) => cur = actual,
                }
            }
        };
        match self.with_existing(table, slot, run) {
            Some(x) => x,
            None => {
                let (r, new) = decide(limit, retry, 0, cost);
                if consume && new.is_some() {
                    self.with_entry(table, slot, run)
                } else {
                    (r, false)
                }
            }
        }
    }

    /// One in-flight item's check, as a status.
    pub(super) fn in_flight_check_one(&self, item: &Item<'_, MemoryTable>, now: u64) -> Status {
        let (r, _) = self.in_flight_check(item, now, u64::from(item.cost), true);
        Status::Checked(Outcome::window(r, 1_000))
    }

    /// Gives back `cost` units of the key: from its entry if it holds them, else from the
    /// overflow entry (units taken while the store was at its cap).
    pub(super) fn in_flight_release(&self, item: &Item<'_, MemoryTable>, slot: Slot, cost: u64) {
        let table = &*item.table.table;
        let take = |word: &AtomicU64| {
            let mut cur = word.load(Ordering::Acquire);
            loop {
                if cur < cost {
                    return false;
                }
                match word.compare_exchange_weak(
                    cur,
                    cur - cost,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return true,
                    Err(actual) => cur = actual,
                }
            }
        };
        if self.with_existing(table, slot, take) != Some(true) && !take(&table.overflow) {
            // Fewer than `cost` anywhere (a reset came between): nothing is held any more.
            let _ = self.with_existing(table, slot, |w| w.store(0, Ordering::Release));
        }
    }

    /// An operation other than a check on an in-flight item: a refund frees units, a
    /// reset frees them all; penalties and blocks mean nothing to it (the
    /// [`Limiter`](crate::Limiter) refuses them).
    pub(super) fn in_flight_update_one(
        &self,
        op: Op,
        item: &Item<'_, MemoryTable>,
        now: u64,
    ) -> Status {
        let slot = self.slot(item);
        match op {
            Op::Refund => self.in_flight_release(item, slot, u64::from(item.cost)),
            Op::Reset => {
                let _ =
                    self.with_existing(&item.table.table, slot, |w| w.store(0, Ordering::Release));
            }
            _ => {}
        }
        let (r, _) = self.in_flight_check(item, now, 0, false);
        Status::Checked(Outcome::window(r, 1_000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::quota::Quota;
    use crate::base::clock::FakeClock;
    use crate::store::Store;
    use crate::web::key::Key;

    /// A store on a clock that stays at 1 s (nothing in flight frees with time).
    fn store() -> MemoryStore<FakeClock> {
        MemoryStore::with_clock(FakeClock::at(std::time::Duration::from_secs(1)))
    }

    #[test]
    fn a_request_takes_units_while_they_fit() {
        let (r, new) = decide(3, 1_000_000, 2, 1);
        assert_eq!(
            (r.verdict, r.remaining, new),
            (Admission::Allowed, 0, Some(3))
        );
        let (r, new) = decide(3, 1_000_000, 3, 1);
        assert_eq!(
            r.verdict,
            Admission::Denied {
                retry_after: 1_000_000
            }
        );
        assert_eq!((r.remaining, new), (0, None));
        let (r, new) = decide(3, 1_000_000, 0, 4);
        assert_eq!((r.verdict, new), (Admission::Never, None));
        // A look takes nothing.
        assert_eq!(decide(3, 5, 1, 0).1, None);
        // No time in the report: nothing frees with time.
        assert_eq!((r.reset_after, r.next_after), (0, None));
        // A count past the limit (a quota lowered by a reload) refuses, reporting 0 left.
        assert_eq!(decide(3, 5, 7, 1).0.remaining, 0);
        assert_eq!(decide(u64::MAX, 5, u64::MAX, 1).1, None, "no overflow");
    }

    /// A cost of the whole limit fits when nothing is in flight (it is not "never"), and
    /// waits (a plain refusal) while anything is.
    #[test]
    fn a_cost_equal_to_the_limit_fits_an_empty_key() {
        let (r, new) = decide(3, 7, 0, 3);
        assert_eq!(
            (r.verdict, r.remaining, new),
            (Admission::Allowed, 0, Some(3))
        );
        let (r, new) = decide(3, 7, 1, 3);
        assert_eq!(
            (r.verdict, new),
            (Admission::Denied { retry_after: 7 }, None)
        );
    }

    /// A refusal's wait is the limit's configured `Retry-After`, in microseconds.
    #[test]
    fn the_retry_after_is_the_limits() {
        let two_and_a_half =
            Algorithm::in_flight_retry_after(std::time::Duration::from_millis(2_500));
        assert_eq!(retry_after_us(two_and_a_half), 2_500_000);
        assert_eq!(retry_after_us(Algorithm::in_flight()), 1_000_000);
        assert_eq!(retry_after_us(Algorithm::Gcra), 0, "not an in-flight limit");
    }

    /// Only a request that takes units keeps an entry: a look at a new key, and a new
    /// key's refusal, leave the store as it was (a flood of refused or looked-at keys
    /// costs no memory).
    #[test]
    fn only_a_taken_unit_makes_an_entry() {
        let store = store();
        let table = store.table("slots");
        let item = |key: u32, cost: u32| {
            Item::new(&table, Key::from_part(key), Quota::per_second(2), cost)
                .algorithm(Algorithm::in_flight())
        };
        // A look at a key with nothing in flight.
        let (r, took) = store.in_flight_check(&item(1, 1), 0, 1, false);
        assert_eq!((r.verdict, took), (Admission::Allowed, false));
        // A cost the limit can never hold.
        let (r, took) = store.in_flight_check(&item(2, 3), 0, 3, true);
        assert_eq!((r.verdict, took), (Admission::Never, false));
        assert_eq!(store.len(), 0, "nothing taken, nothing kept");
        let (_, took) = store.in_flight_check(&item(3, 1), 0, 1, true);
        assert!(took);
        assert_eq!(store.len(), 1);
    }

    /// A released unit can be taken again; a release of more than is held frees what
    /// is there and no more.
    #[test]
    fn a_released_unit_is_taken_again() {
        let store = store();
        let table = store.table("slots");
        let item = Item::new(&table, Key::from_part("k"), Quota::per_second(1), 1)
            .algorithm(Algorithm::in_flight());
        assert!(store.in_flight_check(&item, 0, 1, true).1);
        assert!(
            !store.in_flight_check(&item, 0, 1, true).1,
            "the one unit is held"
        );
        store.in_flight_release(&item, store.slot(&item), 1);
        assert!(
            store.in_flight_check(&item, 0, 1, true).1,
            "released, taken again"
        );
        store.in_flight_release(&item, store.slot(&item), 5);
        assert_eq!(store.in_flight_check(&item, 0, 0, false).0.remaining, 1);
        // Two held, one released: one is still held (the release takes from the key's
        // entry, and nothing else is reset).
        let two = Item::new(&table, Key::from_part("two"), Quota::per_second(2), 1)
            .algorithm(Algorithm::in_flight());
        assert!(store.in_flight_check(&two, 0, 2, true).1);
        store.in_flight_release(&two, store.slot(&two), 1);
        assert_eq!(store.in_flight_check(&two, 0, 0, false).0.remaining, 1);
    }

    /// A refund through the store's update frees the request's units; a reset frees all
    /// of the key's.
    #[test]
    fn a_refund_frees_units_and_a_reset_frees_all() {
        let store = store();
        let table = store.table("slots");
        let item = Item::new(&table, Key::from_part("k"), Quota::per_second(3), 1)
            .algorithm(Algorithm::in_flight());
        let left = |s: &Status| s.outcome().unwrap().remaining();
        assert!(store.in_flight_check(&item, 0, 3, true).1);
        assert_eq!(left(&store.in_flight_update_one(Op::Refund, &item, 0)), 1);
        assert_eq!(left(&store.in_flight_update_one(Op::Reset, &item, 0)), 3);
    }

    /// At the key cap, new keys' units are held in the table's overflow entry. A release
    /// of exactly what a key's own entry holds frees that entry, not the overflow's units
    /// (which belong to other keys' requests).
    #[test]
    fn a_release_of_all_a_key_holds_frees_its_entry_not_the_overflow() {
        let store = store().max_keys(1);
        let table = store.table("slots");
        let item = |key: &str| {
            Item::new(&table, Key::from_part(key), Quota::per_second(2), 1)
                .algorithm(Algorithm::in_flight())
        };
        let (a, b, c) = (item("a"), item("b"), item("c"));
        assert!(store.in_flight_check(&a, 0, 1, true).1, "a's own entry");
        assert_eq!(store.len(), 1, "the cap");
        assert!(store.in_flight_check(&b, 0, 1, true).1, "b in the overflow");
        assert!(store.in_flight_check(&c, 0, 1, true).1, "c in the overflow");
        assert!(
            !store.in_flight_check(&c, 0, 1, true).1,
            "the overflow is full"
        );
        store.in_flight_release(&a, store.slot(&a), 1);
        assert_eq!(
            store.in_flight_check(&a, 0, 0, false).0.remaining,
            2,
            "a holds nothing"
        );
        assert!(
            !store.in_flight_check(&b, 0, 1, true).1,
            "b's and c's units are still held"
        );
    }
}
