//! Settles ([`Op::Debit`], [`Op::Credit`]) sent with the checks: each is a request of its
//! own in a `gcra.lua` call, batched with the checks that wait for the same slot, so a
//! settle costs Redis what a check costs and never a call of its own while others are in
//! flight.
//!
//! A GCRA limit's settle is its `enforce` argument `d:<max_debt in µs>` (take, into debt
//! of at most that; a limit without `max_debt` sends 2^53 − 1, and the script keeps the
//! TAT at most that: no cap, and every value exact) or `c` (give back); it never refuses. A window limit is unchanged by a
//! settle: it is sent as a look (cost 0), which reports it as it stands.

use super::*;

/// A GCRA limit's settle, as `gcra.lua` reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Settle {
    /// Take `cost` tokens, into debt of at most this many µs.
    Debit(u64),
    /// Give `cost` tokens back.
    Credit,
}

impl Settle {
    /// The settle `op` makes of a limit counting with `algorithm`: `None` for a check or
    /// another operation, and for window limits (a settle leaves them unchanged).
    pub(super) fn of(op: Op, algorithm: Algorithm) -> Option<Self> {
        if algorithm.is_window() {
            return None;
        }
        match op {
            Op::Debit { .. } => Some(Settle::Debit(0)),
            Op::Credit => Some(Settle::Credit),
            _ => None,
        }
    }

    /// Completes a part for `op`: the debt cap in µs of its quota, and a window limit's
    /// cost set to 0 (a look).
    pub(super) fn look_at_windows(op: Op) -> impl Fn(Part) -> Part {
        move |mut part| {
            match (op, &mut part.settle) {
                (Op::Debit { max_debt }, Some(Settle::Debit(us))) => {
                    *us = max_debt.saturating_mul(part.quota.t_us()).min(MAX_EXACT);
                }
                (Op::Debit { .. } | Op::Credit, None) => part.cost = 0,
                _ => {}
            }
            part
        }
    }

    /// The `enforce` argument of `gcra.lua`.
    pub(super) fn arg(self) -> SmallVec<[u8; 24]> {
        let mut out = SmallVec::new();
        match self {
            Settle::Debit(us) => {
                out.extend_from_slice(b"d:");
                out.extend_from_slice(itoa::Buffer::new().format(us).as_bytes());
            }
            Settle::Credit => out.push(b'c'),
        }
        out
    }
}

impl RedisBackend {
    /// Applies a settle: one request per slot, sent with the checks (see the module docs).
    /// Each slot's settle stands on its own (a settle never refuses); a failed call fails
    /// the whole settle, whose items then follow their failure policy.
    pub(super) async fn settle(self, op: Op, parts: Arc<[Part]>) -> Result<Statuses, StoreError> {
        debug_assert!(matches!(op, Op::Debit { .. } | Op::Credit));
        let mut statuses = Statuses::from_elem(Status::Unchecked, parts.len());
        for (slot, group) in self.groups(&parts) {
            let answers = self
                .call(&parts, &group, slot)
                .await
                .map_err(StoreError::new)?;
            for (&i, a) in group.iter().zip(answers) {
                statuses[i] = Status::Checked(match a.window {
                    Some(after) => after,
                    None => Outcome::new(a.verdict, a.reset_after, parts[i].params(), 1_000),
                });
            }
        }
        Ok(statuses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settle_is_an_enforce_argument_and_leaves_windows_alone() {
        assert_eq!(Settle::Debit(1_500).arg().as_slice(), b"d:1500");
        assert_eq!(Settle::Credit.arg().as_slice(), b"c");
        let debit = Op::Debit { max_debt: 3 };
        assert_eq!(Settle::of(debit, Algorithm::Gcra), Some(Settle::Debit(0)));
        assert_eq!(
            Settle::of(Op::Credit, Algorithm::Gcra),
            Some(Settle::Credit)
        );
        assert_eq!(Settle::of(debit, Algorithm::fixed_window()), None);
        assert_eq!(Settle::of(Op::Check, Algorithm::Gcra), None);
        let part = |algorithm| Part {
            redis_key: b"k".to_vec(),
            quota: Quota::per_second(10), // T = 100,000 µs
            cost: 7,
            mode: Mode::Enforce,
            algorithm,
            phase_us: 0,
            max_wait_us: 0,
            span: None,
            held: None,
            settle: Settle::of(debit, algorithm),
            ban: None,
        };
        let gcra = Settle::look_at_windows(debit)(part(Algorithm::Gcra));
        assert_eq!((gcra.settle, gcra.cost), (Some(Settle::Debit(300_000)), 7));
        let window = Settle::look_at_windows(debit)(part(Algorithm::fixed_window()));
        assert_eq!((window.settle, window.cost), (None, 0), "a look");
        // No `max_debt` (the default): the largest debt the script holds exactly.
        let uncapped = Op::Debit { max_debt: u64::MAX };
        let gcra = Settle::look_at_windows(uncapped)(part(Algorithm::Gcra));
        assert_eq!(gcra.settle, Some(Settle::Debit(MAX_EXACT)));
    }
}
