//! GCRA in the memory store: one check, the other operations, and giving back what a
//! request took, all by compare-and-swap on the key's TAT under the shard's read lock.

use super::*;

impl<C: Clock> MemoryStore<C> {
    /// Checks a single limit: one lookup and one CAS loop.
    #[inline]
    pub(super) fn check_one(&self, item: &Item<'_, MemoryTable>, now: u64) -> Status {
        if item.algorithm.is_window() {
            return self.window_check_one(item, now);
        }
        if item.stripes > 1 {
            return self.check_one_striped(item, now);
        }
        let table = &*item.table.table;
        let params = report_params(item);
        let cost = u64::from(item.cost);
        let key = self.plain_key(item);
        let slot = Slot {
            hash: self.inner.hasher.hash_one(key),
            key,
        };
        let max_wait = max_wait_ns(item);
        let decide = |cur| gcra::decide_within(params, cur, now, cost, max_wait);
        let run = |tat: &AtomicU64| update(tat, decide).0;
        let decided = match self.with_existing(table, slot, run) {
            Some(d) => d,
            None => {
                // An absent key starts from `initial_tat`: insert only if the request
                // consumes.
                let d = decide(table.initial_tat());
                if d.new_tat.is_some() {
                    self.with_entry(table, slot, run)
                } else {
                    d
                }
            }
        };
        Status::Checked(Outcome::new(
            decided.verdict,
            decided.reset_after(now),
            params,
            1,
        ))
    }

    /// [`check_one`](Self::check_one) of an item that asks for stripes (kept out of the
    /// common path).
    #[inline(never)]
    fn check_one_striped(&self, item: &Item<'_, MemoryTable>, now: u64) -> Status {
        let decided = match stripes::count(item) {
            1 => {
                let table = &*item.table.table;
                let cost = u64::from(item.cost);
                let slot = self.slot(item);
                self.decide_at(table, slot, params(item), now, cost, max_wait_ns(item))
            }
            n => self.check_striped(item, n, now),
        };
        Status::Checked(Outcome::new(
            decided.verdict,
            decided.reset_after(now),
            report_params(item),
            1,
        ))
    }

    /// One GCRA check of the bucket at `slot`, by CAS; an absent key starts from
    /// `initial_tat` and is inserted only if the request consumes.
    #[inline]
    pub(super) fn decide_at(
        &self,
        table: &Table,
        slot: Slot,
        params: Params,
        now: u64,
        cost: u64,
        max_wait: u64,
    ) -> gcra::Decided {
        let decide = |cur| gcra::decide_within(params, cur, now, cost, max_wait);
        let run = |tat: &AtomicU64| update(tat, decide).0;
        match self.with_existing(table, slot, run) {
            Some(d) => d,
            None => {
                let d = decide(table.initial_tat());
                if d.new_tat.is_some() {
                    self.with_entry(table, slot, run)
                } else {
                    d
                }
            }
        }
    }

    /// Applies an operation other than a check to one bucket, in one
    /// compare-and-swap, and reports the bucket as it is afterwards.
    pub(super) fn update_one(&self, op: Op, item: &Item<'_, MemoryTable>, now: u64) -> Status {
        if item.algorithm.is_window() {
            return self.window_update_one(op, item, now);
        }
        let n = stripes::count(item);
        if n > 1 && matches!(op, Op::Block(_) | Op::Restore(_) | Op::Reset) {
            // The whole key: every stripe; reported as the last one stands.
            let key = self.plain_key(item);
            let mut status = None;
            for i in 0..n {
                status = Some(self.update_at(op, item, self.stripe_slot(key, i), now));
            }
            return status.expect("at least one stripe");
        }
        self.update_at(op, item, self.slot(item), now)
    }

    /// [`update_one`](Self::update_one) on the bucket at `slot`.
    fn update_at(&self, op: Op, item: &Item<'_, MemoryTable>, slot: Slot, now: u64) -> Status {
        let table = &*item.table.table;
        let params = params(item);
        let cost_time = u64::from(item.cost).saturating_mul(params.t());
        let set = |tat: &AtomicU64, f: &dyn Fn(u64) -> u64| -> u64 {
            let mut cur = tat.load(Ordering::Acquire);
            loop {
                let new = f(cur);
                match tat.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return new,
                    Err(actual) => cur = actual,
                }
            }
        };
        let after = match op {
            Op::Refund | Op::Credit => self
                .with_existing(table, slot, |tat| {
                    set(tat, &|cur| cur.saturating_sub(cost_time).max(now))
                })
                .unwrap_or_else(|| table.initial_tat()),
            Op::Penalize | Op::PenalizeOnce { .. } => self.with_entry(table, slot, |tat| {
                set(tat, &|cur| cur.max(now).saturating_add(cost_time))
            }),
            Op::Debit { max_debt } => {
                let cost = u64::from(item.cost);
                self.with_entry(table, slot, |tat| {
                    set(tat, &|cur| gcra::debit(params, cur, now, cost, max_debt))
                })
            }
            Op::Block(d) => {
                let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                // A cost-1 request passes when TAT + T - tau <= now + d.
                let until = now
                    .saturating_add(d)
                    .saturating_add(params.tau())
                    .saturating_sub(params.t());
                self.with_entry(table, slot, |tat| set(tat, &|cur| cur.max(until)))
            }
            Op::Restore(d) => {
                let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                // Full again at now + d: the TAT.
                let full_at = now.saturating_add(d);
                self.with_entry(table, slot, |tat| set(tat, &|cur| cur.max(full_at)))
            }
            Op::Reset => {
                self.with_existing(table, slot, |tat| tat.store(0, Ordering::Release));
                0
            }
            Op::Check => unreachable!("checks take the check path"),
        };
        let o = gcra::peek(params, after, now);
        Status::Checked(Outcome::new(
            o.verdict,
            o.reset_after,
            report_params(item),
            1,
        ))
    }

    /// The key's TAT as it stands (an absent key's is the one it would start from).
    pub(super) fn load(&self, item: &Item<'_, MemoryTable>, slot: Slot) -> u64 {
        let table = &*item.table.table;
        self.with_existing(table, slot, |tat| tat.load(Ordering::Acquire))
            .unwrap_or_else(|| table.initial_tat())
    }

    /// Gives back what a request consumed: exactly, if nobody touched the bucket since;
    /// otherwise the part the TAT still holds (see [`gcra::refund_amount`]).
    pub(super) fn refund(
        &self,
        item: &Item<'_, MemoryTable>,
        slot: Slot,
        written: u64,
        prev: u64,
        now: u64,
    ) {
        let cost_time = u64::from(item.cost).saturating_mul(params(item).t());
        let table = &*item.table.table;
        let give_back = |tat: &AtomicU64| {
            let mut cur = tat.load(Ordering::Acquire);
            loop {
                let target = if cur == written {
                    prev
                } else {
                    cur.saturating_sub(gcra::refund_amount(cost_time, written, now))
                };
                match tat.compare_exchange_weak(cur, target, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => break,
                    Err(actual) => cur = actual,
                }
            }
        };
        // A key without an entry consumed from the overflow bucket.
        if self.with_existing(table, slot, give_back).is_none() {
            give_back(&table.overflow);
        }
    }
}

/// The bucket a GCRA item's slot holds: the limit's, or one stripe's (`stripes.rs`).
#[inline]
pub(super) fn params(item: &Item<'_, MemoryTable>) -> Params {
    if item.stripes > 1 {
        let n = stripes::count(item);
        if n > 1 {
            return stripes::stripe_params(item, n);
        }
    }
    report_params(item)
}

/// The limit's bucket, which outcomes report (a stripe's state scaled to the key: a
/// stripe `n` times slower holding `1/n` of the tokens is full again at the same time).
#[inline]
pub(super) fn report_params(item: &Item<'_, MemoryTable>) -> Params {
    Params::new(item.quota.t_ns(), item.quota.burst_size())
}

/// How long a reservation may wait, in ns (0: a check).
#[inline(always)]
pub(super) fn max_wait_ns(item: &Item<'_, impl Sized>) -> u64 {
    u64::try_from(item.max_wait.as_nanos()).unwrap_or(u64::MAX)
}

/// Applies `f` to the TAT with compare-and-swap until it sticks; returns the decision and
/// the TAT it replaced.
#[inline]
pub(super) fn update(tat: &AtomicU64, f: impl Fn(u64) -> gcra::Decided) -> (gcra::Decided, u64) {
    let mut cur = tat.load(Ordering::Acquire);
    loop {
        let o = f(cur);
        let Some(new) = o.new_tat else {
            return (o, cur);
        };
        match tat.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return (o, cur),
            Err(actual) => cur = actual,
        }
    }
}
