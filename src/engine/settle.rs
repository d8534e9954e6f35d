//! Settling a cost admitted on an estimate: the difference taken, into debt if need be (at
//! most the limit's `max_debt`, if it has one), or given back, once, as one store
//! operation.

use std::cmp::Ordering;

use crate::algo::quota::Quota;
use crate::engine::Engine;
use crate::model::key::Key;
use crate::store::{Checked, Op, Store};

/// What a settle does to a bucket: the operation and the tokens it moves; `None` when the
/// actual cost is the estimate (nothing to do).
#[inline]
pub(crate) fn settle_op(estimate: u32, actual: u32, max_debt: u64) -> Option<(Op, u32)> {
    match actual.cmp(&estimate) {
        Ordering::Equal => None,
        Ordering::Greater => Some((Op::Debit { max_debt }, actual - estimate)),
        Ordering::Less => Some((Op::Credit, estimate - actual)),
    }
}

impl<St: Store> Engine<St> {
    /// Settles limit `index`'s bucket `key`, admitted on `estimate` tokens under `quota`,
    /// at its `actual` cost: the store's answer, or `None` if there is nothing to settle.
    /// The caller makes sure it is called at most once per admission.
    pub(crate) fn settle(
        &self,
        index: usize,
        key: Key,
        quota: Quota,
        estimate: u32,
        actual: u32,
    ) -> Option<Checked<St::Future>> {
        let max_debt = self.bounds[index].spec.debt_cap();
        let (op, cost) = settle_op(estimate, actual, max_debt)?;
        self.count_settle(index, matches!(op, Op::Debit { .. }), cost);
        let item = self.item(index, key, quota, cost);
        Some(self.store.apply(op, &[item]))
    }

    /// Counts a settle of limit `index` that took (`taken`) or gave back `tokens`.
    pub(crate) fn count_settle(&self, index: usize, taken: bool, tokens: u32) {
        let bound = &self.bounds[index];
        bound
            .settles
            .get_or_init(|| crate::observe::probe::SettleMetrics::new(bound.name))
            .record(taken, tokens);
    }

    /// [`settle`](Self::settle), finished in the background when the store answers later
    /// (what the middleware does at a response's end, where nobody waits).
    pub(crate) fn settle_in_background(
        &self,
        index: usize,
        key: Key,
        quota: Quota,
        estimate: u32,
        actual: u32,
    ) {
        if let Some(checked) = self.settle(index, key, quota, estimate, actual) {
            checked.finish_in_background("a settled cost");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::delay::WaitCounts;
    use crate::store::MemoryStore;
    use crate::{LimitSpec, Status};

    #[test]
    fn the_difference_is_taken_or_given_back_and_nothing_when_exact() {
        assert_eq!(settle_op(5, 5, 9), None);
        assert_eq!(settle_op(5, 8, 9), Some((Op::Debit { max_debt: 9 }, 3)));
        assert_eq!(settle_op(5, 1, 9), Some((Op::Credit, 4)));
    }

    type Fake = MemoryStore<crate::clock::FakeClock>;

    fn remaining(checked: Checked<<Fake as Store>::Future>) -> u64 {
        let Checked::Ready(s) = checked else {
            unreachable!("memory answers at once")
        };
        match &s[0] {
            Status::Checked(o) => o.remaining(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_engine_settles_into_debt_up_to_its_cap() {
        let q = crate::Quota::per_hour(10).burst(10);
        let mut engine = Engine::new(
            MemoryStore::with_clock(crate::clock::FakeClock::new()),
            WaitCounts::default(),
            1,
        );
        let i = engine
            .bind(LimitSpec::new("tokens", q).max_debt(4))
            .unwrap();
        let key = Key::from_part("k");
        let admit = engine.item(i, key.clone(), q, 6);
        assert_eq!(remaining(engine.store.check(&[admit])), 4);
        // Used 3: 3 back.
        assert_eq!(
            remaining(engine.settle(i, key.clone(), q, 6, 3).unwrap()),
            7
        );
        // Used 30 on an estimate of 6: 24 more, but only 7 + 4 of debt are taken.
        assert_eq!(
            remaining(engine.settle(i, key.clone(), q, 6, 30).unwrap()),
            0
        );
        let look = engine.item(i, key.clone(), q, 0);
        let Checked::Ready(s) = engine.store.check(&[look]) else {
            unreachable!()
        };
        let o = s[0].outcome().unwrap();
        // 4 tokens of debt + 1 for the next request: 5 of 6 minutes each.
        assert_eq!(
            o.next_after(),
            Some(std::time::Duration::from_secs(5 * 360))
        );
        assert!(engine.settle(i, key, q, 6, 6).is_none());
    }

    /// Issue 45: without `max_debt` the debt was capped at the burst, so an estimate of 1
    /// that used 1,100 tokens of a 100-token bucket was charged 200 (the burst, then 100
    /// of debt) and the other 900 forgiven. By default the whole usage is charged now.
    #[test]
    fn an_estimate_of_1_that_used_1100_tokens_is_charged_in_full_by_default() {
        let q = crate::Quota::per_second(100).burst(100); // T = 10 ms
        let mut engine = Engine::new(
            MemoryStore::with_clock(crate::clock::FakeClock::new()),
            WaitCounts::default(),
            1,
        );
        let i = engine.bind(LimitSpec::new("tokens", q)).unwrap();
        let key = Key::from_part("k");
        let admit = engine.item(i, key.clone(), q, 1);
        assert_eq!(remaining(engine.store.check(&[admit])), 99);
        assert_eq!(
            remaining(engine.settle(i, key.clone(), q, 1, 1_100).unwrap()),
            0
        );
        let look = engine.item(i, key, q, 0);
        let Checked::Ready(s) = engine.store.check(&[look]) else {
            unreachable!()
        };
        let o = s[0].outcome().unwrap();
        // 1,100 tokens of 10 ms: full again in 11 s; the debt is the 1,000 beyond the
        // bucket, and the next request's token comes 10 ms after it is paid.
        assert_eq!(o.reset_after(), std::time::Duration::from_secs(11));
        assert_eq!(
            o.next_after(),
            Some(std::time::Duration::from_millis(10_010))
        );
    }
}
