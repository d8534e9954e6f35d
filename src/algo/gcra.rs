//! The generic cell rate algorithm, as a pure function.
//!
//! Per key the state is one number, the theoretical arrival time `TAT`. An absent key and a
//! key whose `TAT <= now` are the same thing, a full bucket, which is why stores may forget
//! such keys at any moment without changing a single decision.
//!
//! ```text
//! T   = period / rate            emission interval (time per token)
//! tau = burst * T                bucket depth, as time
//! request of cost c at time now:
//!   base    = max(TAT, now)       TAT never moves backwards
//!   new_tat = base + c * T
//!   allowed = new_tat - now <= tau
//!   if allowed: TAT := new_tat    a denial never consumes
//! ```
//!
//! This admits exactly `burst` requests at once from a full bucket, then one per `T`: a
//! token bucket of capacity `burst` refilled at `rate / period`. Over any interval of
//! length `d` at most `burst + d / T` cost units are admitted.
//!
//! The unit of time is the caller's: [`MemoryStore`](crate::store::MemoryStore) uses
//! nanoseconds, the Redis store microseconds (its Lua script is this function, line for
//! line; a parity test runs both over the same cases).
//!
//! ```
//! use tollgate::gcra::{check, Params, Admission};
//!
//! let p = Params::new(100, 3); // one token per 100 units, bucket of 3
//! let a = check(p, 0, 1_000, 1);
//! assert_eq!(a.verdict, Admission::Allowed);
//! assert_eq!((a.new_tat, a.remaining), (Some(1_100), 2));
//! let b = check(p, 1_100, 1_000, 3); // needs 3, has 2: wait for one more token
//! assert_eq!(b.verdict, Admission::Denied { retry_after: 100 });
//! assert_eq!(b.new_tat, None);
//! ```

/// The two numbers that define a quota, in one integer unit of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    t: u64,
    burst: u64,
}

impl Params {
    /// An emission interval `t` (time per token) and a bucket of `burst` tokens.
    ///
    /// Both are clamped to at least 1; `t * burst` saturates.
    pub const fn new(t: u64, burst: u64) -> Self {
        Self {
            t: if t == 0 { 1 } else { t },
            burst: if burst == 0 { 1 } else { burst },
        }
    }

    /// Time per token.
    pub const fn t(&self) -> u64 {
        self.t
    }

    /// Bucket capacity in tokens.
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// Bucket depth as time: `burst * t`.
    pub const fn tau(&self) -> u64 {
        self.burst.saturating_mul(self.t)
    }

    /// Tokens left, and time to the next token (`None` when full), for a bucket that is
    /// full again after `reset_after`: what every report tells the client.
    #[inline]
    pub(crate) fn left(&self, reset_after: u64) -> (u64, Option<u64>) {
        let (t, tau) = (self.t, self.tau());
        if reset_after > tau {
            // Only when the quota shrank since the TAT was written (a plan downgrade):
            // the bucket is more than empty, and the next token comes after the deficit.
            (0, Some((reset_after - tau).saturating_add(t)))
        } else {
            let slack = tau - reset_after;
            let remaining = slack / t;
            // (remaining + 1) * t - slack, without the overflow.
            (remaining, (remaining < self.burst).then(|| t - slack % t))
        }
    }
}

/// Whether a request passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Admission {
    /// The request passes (and consumes its cost, unless it was a peek).
    Allowed,
    /// Not now: a request of the same cost passes after `retry_after`.
    Denied {
        /// Time until this request would pass, `> 0`.
        retry_after: u64,
    },
    /// The cost exceeds the bucket capacity: this request can never pass.
    Never,
}

impl Admission {
    /// `true` for [`Admission::Allowed`].
    pub const fn is_allowed(&self) -> bool {
        matches!(self, Admission::Allowed)
    }
}

/// The result of one check: the verdict, the state to store, and what to tell the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Report {
    /// Whether the request passes.
    pub verdict: Admission,
    /// The TAT to store, when the check consumed tokens; `None` leaves the state unchanged.
    pub new_tat: Option<u64>,
    /// Whole tokens left after this request.
    pub remaining: u64,
    /// Time until the bucket is full again.
    pub reset_after: u64,
    /// Time until one more token is available; `None` while the bucket is full.
    pub next_after: Option<u64>,
}

/// Checks a request of `cost` tokens at time `now` against a bucket whose stored TAT is
/// `tat` (0, or anything `<= now`, for an absent key).
///
/// A cost of 0 is a peek: allowed, nothing written. A cost above the burst is
/// [`Admission::Never`]. Arithmetic saturates: no input panics.
pub fn check(params: Params, tat: u64, now: u64, cost: u64) -> Report {
    let d = decide(params, tat, now, cost);
    d.report(params, now)
}

/// The bucket's state at `now` without changing it: [`check`] with cost 0.
pub fn peek(params: Params, tat: u64, now: u64) -> Report {
    check(params, tat, now, 0)
}

/// The verdict alone, and the TAT the bucket has after the request: the part of [`check`]
/// that a store runs inside its compare-and-swap loop. [`Decided::report`] adds what the
/// client is told (it divides, so stores run it after the swap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decided {
    /// Whether the request passes.
    pub verdict: Admission,
    /// The TAT to store, when the check consumed tokens.
    pub new_tat: Option<u64>,
    /// The bucket's TAT after the request (unchanged unless it consumed).
    after: u64,
}

impl Decided {
    /// A decision made by other means than one bucket's check (a striped key's, which
    /// gathers its cost from several buckets): `after` is the TAT it reports.
    pub(crate) const fn made(verdict: Admission, new_tat: Option<u64>, after: u64) -> Self {
        Self {
            verdict,
            new_tat,
            after,
        }
    }
}

/// See [`Decided`].
#[inline]
pub fn decide(params: Params, tat: u64, now: u64, cost: u64) -> Decided {
    decide_within(params, tat, now, cost, 0)
}

/// [`decide`] for a reservation: the request also passes when its
/// tokens are there within `max_wait`, taking them now (the bucket goes into debt); it
/// may proceed after [`Decided::wait`]. A `max_wait` of 0 is a check.
///
/// ```
/// use tollgate::gcra::{decide_within, Params, Admission};
///
/// let p = Params::new(100, 2); // one token per 100 units, bucket of 2
/// let d = decide_within(p, 1_200, 1_000, 1, 150); // empty bucket: next token in 100
/// assert_eq!((d.verdict, d.wait(1_000, p)), (Admission::Allowed, 100));
/// let d = decide_within(p, 1_300, 1_000, 1, 150); // in 200: beyond the wait
/// assert_eq!(d.verdict, Admission::Denied { retry_after: 200 });
/// ```
#[inline]
pub fn decide_within(params: Params, tat: u64, now: u64, cost: u64, max_wait: u64) -> Decided {
    let base = tat.max(now);
    if cost > params.burst {
        return Decided {
            verdict: Admission::Never,
            new_tat: None,
            after: base,
        };
    }
    let new_tat = base.saturating_add(cost.saturating_mul(params.t));
    // A peek (cost 0) is always allowed and writes nothing, even on a bucket in debt;
    // what it reports says how far from a token the bucket is.
    if cost == 0 || new_tat - now <= params.tau().saturating_add(max_wait) {
        Decided {
            verdict: Admission::Allowed,
            new_tat: (cost > 0).then_some(new_tat),
            after: new_tat,
        }
    } else {
        Decided {
            verdict: Admission::Denied {
                retry_after: new_tat - now - params.tau(),
            },
            new_tat: None,
            after: base,
        }
    }
}

impl Decided {
    /// Time from `now` until the bucket is full again, after this request.
    #[inline]
    pub fn reset_after(&self, now: u64) -> u64 {
        self.after - now
    }

    /// How long a request that passed [`decide_within`] waits before it may proceed: the
    /// time until its last token is there (0 for one that passed at once).
    #[inline]
    pub fn wait(&self, now: u64, params: Params) -> u64 {
        match self.verdict {
            Admission::Allowed => (self.after - now).saturating_sub(params.tau()),
            _ => 0,
        }
    }

    /// Fills in what the client is told: tokens left, time to full, time to the next token.
    pub fn report(&self, params: Params, now: u64) -> Report {
        let reset_after = self.after - now; // after >= now: after = max(tat, now) [+ c*t]
        let (remaining, next_after) = params.left(reset_after);
        Report {
            verdict: self.verdict,
            new_tat: self.new_tat,
            remaining,
            reset_after,
            next_after,
        }
    }
}

/// How much of an earlier consumption to give back, so that refunding never grants more
/// than the bucket would have held had the consumption never happened.
///
/// A request that consumed `cost_time` (= cost × T) and left the TAT at `written_tat`
/// is refunded at `now`. If other requests touched the bucket in between, the exact
/// amount still reflected in the TAT is unknown; this returns a lower bound of it:
/// `min(cost_time, written_tat - now)` (zero once the written TAT is in the past). A
/// refund never over-grants; it may under-refund when the bucket refilled meanwhile.
pub fn refund_amount(cost_time: u64, written_tat: u64, now: u64) -> u64 {
    cost_time.min(written_tat.saturating_sub(now))
}

/// Settles a cost admitted on an estimate, when the actual cost is `cost` tokens more:
/// takes them whatever is left, but leaves the bucket at most `max_debt` tokens below
/// empty. Answers the new TAT.
///
/// An empty bucket's TAT is `now + tau`; `max_debt` tokens of debt push it
/// `max_debt * T` further. The part of `cost` beyond that is forgiven, so over any
/// interval of length `d` a key is charged at most `burst + d / T + max_debt` tokens;
/// `max_debt = u64::MAX` caps nothing (the arithmetic saturates). A
/// TAT already past the cap (a block) is left where it is: settling never moves a bucket
/// back.
///
/// ```
/// use tollgate::gcra::{debit, Params};
///
/// let p = Params::new(100, 10); // tau = 1_000
/// assert_eq!(debit(p, 0, 5_000, 3, 20), 5_300); // a full bucket: 3 tokens taken
/// assert_eq!(debit(p, 6_000, 5_000, 50, 20), 8_000); // empty: 20 of the 50 owed, no more
/// assert_eq!(debit(p, 9_000, 5_000, 1, 20), 9_000); // beyond the cap already: unchanged
/// ```
pub fn debit(params: Params, tat: u64, now: u64, cost: u64, max_debt: u64) -> u64 {
    let taken = tat.max(now).saturating_add(cost.saturating_mul(params.t));
    let cap = now
        .saturating_add(params.tau())
        .saturating_add(max_debt.saturating_mul(params.t));
    tat.max(taken.min(cap))
}

/// Settles a cost admitted on an estimate, when the actual cost is `cost` tokens less:
/// gives them back, never beyond a full bucket (a refund). Answers the new TAT.
///
/// ```
/// use tollgate::gcra::{credit, Params};
///
/// let p = Params::new(100, 10);
/// assert_eq!(credit(p, 5_800, 5_000, 3), 5_500);
/// assert_eq!(credit(p, 5_200, 5_000, 3), 5_000); // full, no fuller
/// ```
pub fn credit(params: Params, tat: u64, now: u64, cost: u64) -> u64 {
    tat.saturating_sub(cost.saturating_mul(params.t)).max(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params::new(100, 10); // T = 100, burst 10, tau = 1000

    #[test]
    fn a_peek_is_allowed_even_on_a_bucket_in_debt() {
        // Three tokens of debt beyond an empty bucket: TAT = now + tau + 3T.
        let now = 10_000;
        let tat = now + P.tau() + 300;
        let o = check(P, tat, now, 0);
        assert_eq!(o.verdict, Admission::Allowed);
        assert_eq!(o.new_tat, None, "a peek writes nothing");
        assert_eq!(o.remaining, 0);
        assert_eq!(o.next_after, Some(400), "the debt, then one token");
        assert_eq!(
            check(P, tat, now, 1).verdict,
            Admission::Denied { retry_after: 400 }
        );
    }

    #[test]
    fn full_bucket_admits_burst_then_one_per_t() {
        let mut tat = 0;
        let now = 5_000;
        for i in 0..10 {
            let o = check(P, tat, now, 1);
            assert_eq!(o.verdict, Admission::Allowed, "request {i}");
            assert_eq!(o.remaining, 9 - i);
            tat = o.new_tat.unwrap();
        }
        let o = check(P, tat, now, 1);
        assert_eq!(o.verdict, Admission::Denied { retry_after: 100 });
        assert_eq!(o.remaining, 0);
        assert_eq!(o.next_after, Some(100));
        assert_eq!(o.reset_after, 1_000);
        // One token back after T.
        let o = check(P, tat, now + 100, 1);
        assert!(o.verdict.is_allowed());
        assert_eq!(
            check(P, o.new_tat.unwrap(), now + 100, 1).verdict,
            Admission::Denied { retry_after: 100 }
        );
    }

    #[test]
    fn peek_reports_without_writing() {
        let o = peek(P, 0, 1_000);
        assert_eq!(o.verdict, Admission::Allowed);
        assert_eq!(o.new_tat, None);
        assert_eq!(o.remaining, 10);
        assert_eq!(o.next_after, None, "no `t` while the bucket is full");
        assert_eq!(o.reset_after, 0);
    }

    #[test]
    fn variable_cost_and_partial_tokens() {
        // 350 units of time used: 6.5 tokens left, reported as 6.
        let o = peek(P, 1_350, 1_000);
        assert_eq!(o.remaining, 6);
        assert_eq!(o.next_after, Some(50), "half a token until the 7th");
        let o = check(P, 1_350, 1_000, 7);
        assert_eq!(o.verdict, Admission::Denied { retry_after: 50 });
        let o = check(P, 1_350, 1_000, 6);
        assert_eq!(o.verdict, Admission::Allowed);
        assert_eq!(o.new_tat, Some(1_950));
        assert_eq!(o.remaining, 0);
        assert_eq!(o.next_after, Some(50));
    }

    #[test]
    fn cost_above_burst_is_never() {
        let o = check(P, 0, 1_000, 11);
        assert_eq!(o.verdict, Admission::Never);
        assert_eq!(o.new_tat, None);
        assert_eq!(o.remaining, 10);
        // Exactly the burst passes from a full bucket.
        assert!(check(P, 0, 1_000, 10).verdict.is_allowed());
    }

    #[test]
    fn tat_in_the_past_is_a_full_bucket() {
        assert_eq!(check(P, 0, 1_000, 1), check(P, 999, 1_000, 1));
        assert_eq!(check(P, 0, 1_000, 1), check(P, 1_000, 1_000, 1));
    }

    #[test]
    fn stale_clock_never_moves_tat_backwards() {
        // A caller whose clock is behind the one that wrote the TAT.
        let o = check(P, 2_000, 1_500, 1);
        assert_eq!(o.new_tat, Some(2_100));
    }

    #[test]
    fn shrunken_quota_reports_empty_bucket_with_deficit() {
        // A TAT written under a bigger bucket, read under a bucket of tau = 1000.
        let o = peek(P, 3_000, 1_000);
        assert_eq!(o.remaining, 0);
        assert_eq!(o.reset_after, 2_000);
        assert_eq!(o.next_after, Some(1_100));
        assert_eq!(
            check(P, 3_000, 1_000, 1).verdict,
            Admission::Denied { retry_after: 1_100 }
        );
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let p = Params::new(u64::MAX, u64::MAX);
        let _ = check(p, u64::MAX, u64::MAX, u64::MAX);
        let _ = check(p, 0, 0, 1);
        let _ = check(Params::new(0, 0), u64::MAX, 0, u64::MAX);
        let _ = check(P, u64::MAX, 0, 1);
    }

    #[test]
    fn a_reservation_takes_tokens_within_the_wait_and_no_further() {
        // Full bucket of 10: the first 10 pass at once, the next ones wait one T each.
        let now = 5_000;
        let mut tat = 0;
        for i in 0..14u64 {
            let d = decide_within(P, tat, now, 1, 400);
            assert_eq!(d.verdict, Admission::Allowed, "request {i}");
            assert_eq!(d.wait(now, P), i.saturating_sub(9) * 100, "request {i}");
            tat = d.new_tat.unwrap();
        }
        // The 15th would wait 500 > 400: refused, nothing taken, and told the plain wait.
        let d = decide_within(P, tat, now, 1, 400);
        assert_eq!(d.verdict, Admission::Denied { retry_after: 500 });
        assert_eq!(d.new_tat, None);
        // A reservation never exceeds the bucket's capacity per request.
        assert_eq!(
            decide_within(P, 0, now, 11, u64::MAX).verdict,
            Admission::Never
        );
        // Without a wait it is a check.
        assert_eq!(decide_within(P, tat, now, 1, 0), decide(P, tat, now, 1));
    }

    #[test]
    fn refund_is_bounded_by_what_the_tat_still_holds() {
        assert_eq!(refund_amount(100, 1_100, 1_000), 100);
        assert_eq!(refund_amount(100, 1_050, 1_000), 50);
        assert_eq!(refund_amount(100, 900, 1_000), 0);
    }

    #[test]
    fn a_debit_takes_into_debt_up_to_the_cap_and_never_moves_back() {
        let now = 10_000;
        // Full bucket: the tokens are taken as a check would take them.
        assert_eq!(debit(P, 0, now, 4, 5), now + 400);
        // Empty bucket (TAT = now + tau): into debt, up to 5 tokens.
        let empty = now + P.tau();
        assert_eq!(debit(P, empty, now, 2, 5), empty + 200);
        assert_eq!(debit(P, empty, now, 9, 5), empty + 500);
        // No debt allowed: only what the bucket holds is taken.
        assert_eq!(debit(P, now + 700, now, 9, 0), empty);
        // A block beyond the cap stays.
        assert_eq!(debit(P, empty + 9_999, now, 1, 5), empty + 9_999);
        // A TAT in the past is a full bucket.
        assert_eq!(debit(P, 5, now, 1, 5), now + 100);
        let _ = debit(
            Params::new(u64::MAX, u64::MAX),
            u64::MAX,
            u64::MAX,
            u64::MAX,
            u64::MAX,
        );
    }

    #[test]
    fn a_credit_gives_back_never_beyond_full() {
        let now = 10_000;
        assert_eq!(credit(P, now + 900, now, 4), now + 500);
        assert_eq!(credit(P, now + 300, now, 4), now);
        assert_eq!(credit(P, 0, now, 4), now);
    }
}
