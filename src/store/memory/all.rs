//! Several limits, all or nothing: every bucket is looked at first, and consumed only if
//! every enforcing limit passes; a race lost between the look and the consume gives back
//! what the request took. One protocol for every mix of algorithms.

use smallvec::SmallVec;

use super::windows::Undo;
use super::{Item, MemoryStore, MemoryTable, Slot, Statuses};
use crate::algo::gcra;
use crate::base::clock::Clock;
use crate::model::decision::{Outcome, Status};
use crate::model::policy::Mode;

impl<C: Clock> MemoryStore<C> {
    /// Several limits, of any algorithms, all or nothing: look at every one, and consume
    /// (in configuration order) only if every enforcing limit passes; a limit that refuses
    /// on the way (a concurrent request took the last tokens between the look and the
    /// consume) makes the request give back what the earlier ones took.
    pub(super) fn check_all(&self, items: &[Item<'_, MemoryTable>], now: u64) -> Statuses {
        let slots: SmallVec<[Slot; 4]> = items.iter().map(|i| self.slot(i)).collect();
        let looked: SmallVec<[Status; 4]> = items
            .iter()
            .zip(&slots)
            .map(|(item, &slot)| self.look(item, slot, now, u64::from(item.cost)))
            .collect();
        let refuses = |item: &Item<'_, MemoryTable>, s: &Status| {
            item.mode == Mode::Enforce && !s.outcome().is_some_and(Outcome::is_allowed)
        };
        if items.iter().zip(&looked).any(|(i, s)| refuses(i, s)) {
            return self.unchanged(items, &slots, &looked, now);
        }
        let mut statuses = Statuses::new();
        let mut taken: SmallVec<[(usize, Undo); 4]> = SmallVec::new();
        for (i, item) in items.iter().enumerate() {
            let cost = u64::from(item.cost);
            if cost == 0 || !looked[i].outcome().is_some_and(Outcome::is_allowed) {
                statuses.push(looked[i]);
                continue;
            }
            let (status, undo) = if item.algorithm.is_window() {
                let (r, undo) = self.window_check(item, now, cost, true);
                (Status::Checked(Outcome::window(r, 1_000)), undo)
            } else {
                let params = super::params(item);
                let max_wait = super::max_wait_ns(item);
                let (d, prev) = self.with_entry(&item.table.table, slots[i], |tat| {
                    super::update(tat, |cur| {
                        gcra::decide_within(params, cur, now, cost, max_wait)
                    })
                });
                let undo = d.new_tat.map(|written| Undo::Gcra { written, prev });
                let o = Outcome::new(d.verdict, d.reset_after(now), super::report_params(item), 1);
                (Status::Checked(o), undo)
            };
            match undo {
                Some(undo) => taken.push((i, undo)),
                None if item.mode == Mode::Enforce => {
                    for &(j, undo) in &taken {
                        self.undo(&items[j], slots[j], undo, now);
                    }
                    let mut looked = looked.clone();
                    looked[i] = status;
                    return self.unchanged(items, &slots, &looked, now);
                }
                None => {}
            }
            statuses.push(status);
        }
        statuses
    }

    /// One item's state as a check of `cost` would find it, changing nothing.
    pub(super) fn look(
        &self,
        item: &Item<'_, MemoryTable>,
        slot: Slot,
        now: u64,
        cost: u64,
    ) -> Status {
        if item.algorithm.is_window() {
            let (r, _) = self.window_check(item, now, cost, false);
            return Status::Checked(Outcome::window(r, 1_000));
        }
        let params = super::params(item);
        let tat = self.load(item, slot);
        let o = gcra::decide_within(params, tat, now, cost, super::max_wait_ns(item))
            .report(params, now);
        Status::Checked(Outcome::new(
            o.verdict,
            o.reset_after,
            super::report_params(item),
            1,
        ))
    }

    /// The statuses of a refused request: the refusing limits as checked, the others as
    /// they stand.
    fn unchanged(
        &self,
        items: &[Item<'_, MemoryTable>],
        slots: &[Slot],
        checked: &[Status],
        now: u64,
    ) -> Statuses {
        items
            .iter()
            .zip(slots)
            .zip(checked)
            .map(|((item, &slot), s)| {
                if s.outcome().is_some_and(Outcome::is_allowed) {
                    self.look(item, slot, now, 0)
                } else {
                    *s
                }
            })
            .collect()
    }
}
