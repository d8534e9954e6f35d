//! When the backend does not answer: each limit's failure policy (`Allow`, `Deny`,
//! `Fallback`, `Share`: 1/N of the quota, starting spent for keys seen spent), and the
//! charge-back (`repay`) of what `Share` granted once the backend answers again (the
//! debts are kept in `owed.rs`).

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::{Part, Resilient, owed, refuses};
use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::base::clock::Clock;
use crate::model::decision::{Outcome, Status};
use crate::model::policy::{FailurePolicy, Mode};
use crate::store::memory::MemoryTable;
use crate::store::{Backend, Checked, Item, Op, Statuses, Store};

/// An in-flight limit's refusal when this instance could not learn in time whether a
/// unit is free: no unit left, retry after the limit's `retry_after`.
fn in_flight_refusal(p: &Part) -> Outcome {
    let retry_after = p.algorithm.retry_after().unwrap_or(Duration::from_secs(1));
    refused_for(
        u64::try_from(retry_after.as_micros())
            .unwrap_or(u64::MAX)
            .max(1),
    )
}

/// A local refusal with nothing left, to retry after `retry_us` microseconds.
fn refused_for(retry_us: u64) -> Outcome {
    Outcome::window(
        crate::algo::window::Report {
            verdict: crate::algo::gcra::Admission::Denied {
                retry_after: retry_us,
            },
            remaining: 0,
            reset_after: 0,
            next_after: None,
            wait: 0,
        },
        1_000,
    )
}

impl<B: Backend> Resilient<B> {
    /// The statuses of a call the backend did not answer: each item's policy. `owe`: the
    /// call surely changed nothing in the backend (it was not made, or failed with an
    /// error), so what `Share` grants here is charged to the shared bucket later.
    pub(super) fn on_failure(&self, op: Op, parts: &[Part], owe: bool) -> Statuses {
        self.on_failure_busy(op, parts, owe, false)
    }

    /// [`on_failure`](Self::on_failure); `busy`: the call timed out (this instance or the
    /// backend is slow, or the backend is gone: a timeout cannot tell). An in-flight limit
    /// then refuses (its `retry_after`) instead of granting a local share: the call may
    /// have taken a unit in the backend, and a local grant beside the backend's count would
    /// let more than `n` run. Its share is for a backend known to fail: a call that failed
    /// with an error, or an open breaker.
    pub(super) fn on_failure_busy(
        &self,
        op: Op,
        parts: &[Part],
        owe: bool,
        busy: bool,
    ) -> Statuses {
        let busy_in_flight = |p: &Part| {
            busy && op == Op::Check
                && p.algorithm.is_in_flight()
                && matches!(p.policy, FailurePolicy::Share | FailurePolicy::Fallback)
        };
        let now = self.inner.clock.now();
        // `Share`: this instance's part of each limit, from the traffic it served.
        let shares: SmallVec<[Option<Portion>; 4]> = parts
            .iter()
            .map(|p| (p.policy == FailurePolicy::Share).then(|| self.portion(p, now)))
            .collect();
        let mut statuses: Statuses = parts
            .iter()
            .zip(&shares)
            .map(|(p, share)| match p.policy {
                _ if busy_in_flight(p) => Status::Checked(in_flight_refusal(p)),
                // Nothing of the limit is this instance's: refused (a share of nothing).
                FailurePolicy::Share if share.is_some_and(|s| s.quota.is_none()) => {
                    Status::Fallback(nothing_left(p))
                }
                FailurePolicy::Allow => Status::FailedOpen,
                FailurePolicy::Deny => Status::FailedClosed,
                _ => Status::Unchecked, // the fallback, below
            })
            .collect();
        let refused =
            op == Op::Check && statuses.iter().zip(parts).any(|(s, p)| refuses(s, p.mode));
        let fallback: SmallVec<[usize; 4]> = (0..parts.len())
            .filter(|&i| {
                statuses[i] == Status::Unchecked
                    && matches!(
                        parts[i].policy,
                        FailurePolicy::Fallback | FailurePolicy::Share
                    )
                    && !busy_in_flight(&parts[i])
            })
            .collect();
        if fallback.is_empty() || refused {
            // A refused check consumes nothing, not even locally.
            return statuses;
        }
        let items: SmallVec<[Item<'_, MemoryTable>; 4]> = fallback
            .iter()
            .map(|&i| {
                let p = &parts[i];
                let quota = shares[i].and_then(|s| s.quota).unwrap_or(p.quota);
                Item::new(&p.fallback, p.key.clone(), quota, p.cost)
                    .mode(p.mode)
                    .algorithm(p.algorithm)
                    .max_wait(p.max_wait)
            })
            .collect();
        if op == Op::Check {
            self.share_as_spent(&fallback, parts, &shares, &items, now);
        }
        let Checked::Ready(local) = self.inner.fallback.apply(op, &items) else {
            unreachable!("the memory store answers at once")
        };
        for (&i, s) in fallback.iter().zip(local) {
            statuses[i] = match s {
                Status::Checked(o) => Status::Fallback(o),
                other => other,
            };
        }
        let passed = !statuses.iter().zip(parts).any(|(s, p)| refuses(s, p.mode));
        if owe && op == Op::Check && passed {
            for (&i, item) in fallback.iter().zip(&items) {
                let p = &parts[i];
                let counted = p.policy == FailurePolicy::Share
                    && p.mode == Mode::Enforce
                    && p.algorithm == Algorithm::Gcra
                    && p.cost > 0;
                let debt = || owed::Debt {
                    remote: p.remote.clone(),
                    key: p.key.clone(),
                    quota: p.quota,
                    local: p.fallback.clone(),
                    share: item.quota,
                    held: shares[i].map_or(0.0, |s| s.held),
                    granted: u64::from(p.cost),
                };
                if counted && !self.inner.owed.add(debt()) {
                    self.inner.writeback_dropped.increment(1);
                }
            }
        }
        statuses
    }

    /// The backend answers: what the shares of the keys `Share` granted while it could not
    /// be reached still lack is charged to the shared buckets, in the background (see
    /// `owed`), at most [`REPAYING`] calls at once.
    ///
    /// To a backend that applies a charge once per id ([`Backend::penalizes_once`]: Redis,
    /// the simulated backend), each debt is an [`Op::PenalizeOnce`] of an id of its own,
    /// sent again with that id (a timeout, an error: perhaps applied, perhaps not) until
    /// one send is answered, the debt has passed (the share lacks nothing any more), or
    /// [`RESEND_FOR`] has passed (counted as dropped). To any other backend, an
    /// `Op::Penalize`: one the backend refused with an error changed nothing, and its debt
    /// goes back on the list for the next answer; one that timed out may have been applied,
    /// so it is not sent again (a `Penalize` is not idempotent) but followed to its answer,
    /// and counted as dropped if none comes.
    pub(super) fn repay(&self) {
        let debts = self.inner.owed.take();
        if debts.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to charge from: kept for an answer that has one.
            for d in debts {
                let _ = self.inner.owed.add(d);
            }
            return;
        };
        tracing::info!(
            keys = debts.len(),
            "tollgate: charging {} with what was granted on this instance's share while it failed",
            self.inner.backend.name()
        );
        let once = self.inner.backend.penalizes_once();
        let timeout = self.call_timeout();
        let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(REPAYING));
        for d in debts {
            let lacks = lacking(&self.inner.fallback, &d);
            if lacks == 0 {
                continue;
            }
            let cost = u32::try_from(lacks).unwrap_or(u32::MAX);
            let (owed, permits) = (self.inner.owed.clone(), permits.clone());
            let dropped = self.inner.writeback_dropped.clone();
            let (fallback, clock) = (self.inner.fallback.clone(), self.inner.clock.clone());
            runtime.spawn(async move {
                let Ok(_permit) = permits.acquire_owned().await else {
                    return;
                };
                if once {
                    if !charge_once(&d, cost, timeout, &fallback, &clock).await {
                        dropped.increment(1);
                    }
                    return;
                }
                let mut call = d.remote.remote.call(
                    Op::Penalize,
                    &d.key,
                    d.quota,
                    Algorithm::Gcra,
                    cost,
                    Duration::ZERO,
                );
                let answer = match tokio::time::timeout(timeout, &mut call).await {
                    Ok(answer) => Some(answer),
                    // Perhaps applied, perhaps not (a charge is not idempotent: it is not
                    // sent again blind): followed to its answer, as a late check is.
                    Err(_) => tokio::time::timeout(super::calls::LATE_FOR, call)
                        .await
                        .ok(),
                };
                match answer {
                    Some(Ok(_)) => {}
                    // Not applied: owed still (what refilled meanwhile is not charged).
                    Some(Err(_)) => {
                        if !owed.add(d) {
                            dropped.increment(1);
                        }
                    }
                    None => dropped.increment(1),
                }
            });
        }
    }

    /// What `Share` gives `p` now: its fraction of the key's traffic (frozen for the
    /// outage, see `traffic.rs`), or, for a key this instance knows nothing of, `1/N`
    /// (`N` the instances the backend counts; [`UNHEARD_INSTANCES`] while it has not
    /// counted them: this instance never reached it).
    fn portion(&self, p: &Part, now: u64) -> Portion {
        let inner = &*self.inner;
        let n = match inner.backend.instances() {
            0 => UNHEARD_INSTANCES,
            n => n,
        };
        let table = Arc::as_ptr(&p.remote) as usize;
        let mut fraction = inner
            .traffic
            .fraction_or(table, &p.key, p.quota, now, 1.0 / n as f64);
        if n == 1 && inner.backend.counts_instances() {
            // The only instance the backend counts: what it did not spend of the key,
            // nobody did (the bucket sat full). The whole limit, not its own rate, which a
            // key under the limit would meet exactly, refusing what comes a little early.
            fraction.f = 1.0;
        }
        let window = p.algorithm.is_window();
        let (quota, held) = share_of(p.quota, p.algorithm, fraction.f, n);
        let lacking = quota.map_or(0.0, |q| (q.burst_size() as f64 - held).max(0.0));
        // (A window's share starts whole: rounded down, it lacks nothing.)
        let full_at = quota.filter(|_| !window).map(|q| {
            // A float's `as` saturates: a huge wait is "never" (u64::MAX).
            let ns = (lacking * q.t_ns() as f64) as u64;
            fraction.since.saturating_add(ns)
        });
        Portion {
            quota,
            held,
            full_at,
        }
    }

    /// A key this instance saw spent (in the write-back list) starts its share as spent as
    /// the shared bucket was: a share is of what the limit has left, not a fresh burst on
    /// top of what the shared bucket gives back once it answers again (a fixed window seen
    /// spent stays spent until it ends). A share under one token starts spent by what it
    /// lacks. A restore or a block only ever moves the local bucket forward, so repeating
    /// it changes nothing.
    fn share_as_spent(
        &self,
        fallback: &[usize],
        parts: &[Part],
        shares: &[Option<Portion>],
        items: &[Item<'_, MemoryTable>],
        now: u64,
    ) {
        for (&i, item) in fallback.iter().zip(items) {
            let p = &parts[i];
            let Some(share) = shares[i] else { continue };
            let restorable = p.algorithm == Algorithm::Gcra || p.algorithm.is_fixed();
            if !restorable {
                continue;
            }
            let seen = {
                let list = self.inner.refused.lock().unwrap_or_else(|e| e.into_inner());
                list.until(&p.remote, &p.key)
            };
            let until = seen.into_iter().chain(share.full_at).max();
            if let Some(until) = until.filter(|&u| u > now) {
                let left = Duration::from_nanos(until - now);
                let op = if p.algorithm.is_window() {
                    Op::Block(left)
                } else {
                    Op::Restore(left)
                };
                let restore =
                    [Item::new(item.table, p.key.clone(), item.quota, 1).algorithm(p.algorithm)];
                let _ = self.inner.fallback.apply(op, &restore);
            }
        }
    }

    /// A timed-out check's late answer (`server`) against what the failure policy decided
    /// meanwhile (`local`): each `Share` item granted locally that the backend refused is
    /// owed (the backend never counted that grant). Whether any was.
    pub(super) fn owe_late(&self, parts: &[Part], local: &Statuses, server: &Statuses) -> bool {
        let now = self.inner.clock.now();
        let mut owed = false;
        for ((p, l), s) in parts.iter().zip(local).zip(server) {
            let granted_here = matches!(l, Status::Fallback(o) if o.is_allowed());
            let refused_there = matches!(s, Status::Checked(o) if !o.is_allowed());
            let counted = p.policy == FailurePolicy::Share
                && p.mode == Mode::Enforce
                && p.algorithm == Algorithm::Gcra
                && p.cost > 0;
            if !(granted_here && refused_there && counted) {
                continue;
            }
            let portion = self.portion(p, now);
            let Some(share) = portion.quota else {
                continue;
            };
            let debt = owed::Debt {
                remote: p.remote.clone(),
                key: p.key.clone(),
                quota: p.quota,
                local: p.fallback.clone(),
                share,
                held: portion.held,
                granted: u64::from(p.cost),
            };
            if self.inner.owed.add(debt) {
                owed = true;
            } else {
                self.inner.writeback_dropped.increment(1);
            }
        }
        owed
    }

    /// The traffic of the items a check's answer granted or refused (`Share` limits).
    pub(super) fn observe_traffic(&self, parts: &[Part], statuses: &Statuses, sent_at: u64) {
        let passed = !statuses.iter().zip(parts).any(|(s, p)| refuses(s, p.mode));
        let now = self.inner.clock.now();
        for (p, s) in parts.iter().zip(statuses) {
            if p.policy != FailurePolicy::Share {
                continue;
            }
            if let Status::Checked(o) = s {
                let granted = if passed && o.is_allowed() { p.cost } else { 0 };
                self.inner.traffic.observe(
                    Arc::as_ptr(&p.remote) as usize,
                    &p.key,
                    p.quota,
                    p.algorithm,
                    sent_at,
                    now,
                    granted,
                    o,
                );
            }
        }
    }
}

/// The quota of a share of `f` of `quota` under `algorithm` (`n` instances counted), and
/// the tokens it holds when the outage starts ([`held`]). GCRA: the share's burst is what
/// it holds rounded up (at least 2); it starts spent by the rest, from the outage's start,
/// so that the shares of a burst of B never hold more than B at first, and each has the
/// rest as room for traffic that comes a little before its token (a share of 1.99 tokens
/// rounded down to 1 refused half of a key's steady traffic when its rate came out a hair
/// under the traffic's). A fixed window: its limit times `f`, rounded down. A sliding
/// window or log: `1/N` (no traffic is followed).
fn share_of(quota: Quota, algorithm: Algorithm, f: f64, n: u64) -> (Option<Quota>, f64) {
    let window = algorithm.is_window();
    let mut share = if window && !algorithm.is_fixed() {
        Some(quota.share(n, true))
    } else {
        quota.portion(f, window)
    };
    let held = held(quota, f, n, window);
    if let Some(q) = share.filter(|q| !window && (q.burst_size() as f64) < held.ceil()) {
        share = q.try_burst(held.ceil() as u64).ok();
    }
    (share, held)
}

/// What a share whose local bucket is full again in `until_full` lacks of the `held`
/// tokens it held at the outage's start (see [`held`]; its burst beyond them is room,
/// never granted from), rounded up: what is charged back. At
/// most `granted`, what was granted on it: a share that started as spent as the shared
/// bucket lacks what the backend already counted too.
fn lacks(share: Quota, held: f64, until_full: Duration, granted: u64) -> u64 {
    let held = held.min(share.burst_size() as f64);
    let room = share.burst_size() as f64 - held;
    let missing = until_full.as_nanos() as f64 / share.t_ns().max(1) as f64;
    ((missing - room - 1e-6).ceil().max(0.0) as u64).min(granted)
}

/// Charge-back calls in flight at once, at most.
const REPAYING: usize = 64;

/// How long a charge of an id is sent again, at most, after its first send: well inside
/// [`PENALIZE_ONCE_FOR`](crate::store::PENALIZE_ONCE_FOR), the time the backend remembers
/// the id, so that a send arriving late is still recognised.
pub(super) const RESEND_FOR: Duration = Duration::from_secs(60);

/// The pause before the first send again; it doubles up to [`RESEND_PAUSE_MAX`].
const RESEND_PAUSE: Duration = Duration::from_millis(100);
const RESEND_PAUSE_MAX: Duration = Duration::from_secs(5);

/// What the share of `d` lacks now: the tokens spent on it and not refilled yet, at most
/// what was granted on it ([`lacks`]).
fn lacking(
    fallback: &crate::store::MemoryStore<crate::base::clock::SharedClock>,
    d: &owed::Debt,
) -> u64 {
    let look = [Item::new(&d.local, d.key.clone(), d.share, 0)];
    let Checked::Ready(s) = fallback.apply(Op::Check, &look) else {
        unreachable!("the memory store answers at once")
    };
    let until_full = s
        .first()
        .and_then(Status::outcome)
        .map_or(Duration::ZERO, Outcome::reset_after);
    lacks(d.share, d.held, until_full, d.granted)
}

/// Charges `cost` of `d` as one [`Op::PenalizeOnce`] of a new id, sent again with the
/// same id until a send is answered (`true`: applied, by it or by an earlier send the
/// backend recognised) or the debt has passed (`true`: nothing is owed any more); `false`
/// after [`RESEND_FOR`] without either. A send again charges what the share still lacks,
/// if less (the first send was not applied, or it was and the id makes this one nothing).
async fn charge_once(
    d: &owed::Debt,
    mut cost: u32,
    timeout: Duration,
    fallback: &crate::store::MemoryStore<crate::base::clock::SharedClock>,
    clock: &crate::base::clock::SharedClock,
) -> bool {
    let id = owed::charge_id();
    let started = clock.now();
    let mut pause = RESEND_PAUSE;
    loop {
        let call = d.remote.remote.call(
            Op::PenalizeOnce { id },
            &d.key,
            d.quota,
            Algorithm::Gcra,
            cost,
            Duration::ZERO,
        );
        if let Ok(Ok(_)) = tokio::time::timeout(timeout, call).await {
            return true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RESEND_PAUSE_MAX);
        if clock.now().saturating_sub(started) > RESEND_FOR.as_nanos() as u64 {
            // No key in the line: a key may be a client's credential (an API key).
            tracing::warn!("tollgate: a charge-back was not answered for {RESEND_FOR:?}; given up");
            return false;
        }
        match lacking(fallback, d) {
            0 => return true,
            lacks => cost = cost.min(u32::try_from(lacks).unwrap_or(u32::MAX)),
        }
    }
}

/// An instance whose backend has not counted the instances yet (it never reached it)
/// counts itself one of this many: it knows neither the traffic nor the instances, and
/// must not take a whole limit.
pub(super) const UNHEARD_INSTANCES: u64 = 4;

/// A GCRA share's burst is split as a whole token for each of the `N` counted instances
/// and the rest by fraction when the burst has at least this many tokens per instance:
/// reserving `N` tokens then costs at most a quarter of it.
const FLOOR_BURST_PER_INSTANCE: u64 = 4;

/// The tokens a share of `fraction` of `quota` holds when the outage starts, `n` the
/// instances counted: `f·B`; for a GCRA key that some of this instance's traffic went to
/// (`0 < f < 1`) under a burst of at least [`FLOOR_BURST_PER_INSTANCE`] tokens per
/// instance, `1 + f·(B − N)`. Either way the shares of the instances add up to at most
/// `B` (`Σf ≤ 1`, and at most `N` whole tokens), and the second keeps a key spread thinly
/// over many instances from refusing the first request of an outage on each: a share of
/// 0.2 tokens starts spent.
fn held(quota: Quota, f: f64, n: u64, window: bool) -> f64 {
    let b = quota.burst_size();
    let floor = !window && f > 0.0 && f < 1.0 && b >= FLOOR_BURST_PER_INSTANCE.saturating_mul(n);
    if floor {
        1.0 + f * (b - n) as f64
    } else {
        f.clamp(0.0, 1.0) * b as f64
    }
}

/// What `Share` gives one item.
#[derive(Debug, Clone, Copy)]
struct Portion {
    /// The share's quota; `None`: nothing (refused).
    quota: Option<Quota>,
    /// The tokens the share holds when the outage starts (see [`held`]); the rest of its
    /// bucket is room.
    held: f64,
    /// When the share holds the `held` tokens it starts with and the rest of its bucket is
    /// room (the store's clock; `since` when it lacks nothing); `None` without a share.
    full_at: Option<u64>,
}

/// A `Share` limit's refusal when none of the limit is this instance's: retry after one
/// emission interval.
fn nothing_left(p: &Part) -> Outcome {
    refused_for(
        u64::try_from(p.quota.emission_interval().as_micros())
            .unwrap_or(u64::MAX)
            .clamp(1, 1_000_000),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::quota::Quota;
    use crate::base::clock::SharedClock;
    use crate::model::key::Key;
    use crate::store::resilient::tests::{Down, Silent};

    /// The charge-back is what a share lacks of the `f·B` tokens it held, never its room:
    /// a third of 10/s with a burst of 6, holding 2 tokens in a bucket of 2; a third of 1/s
    /// with a burst of 1, holding 1/3 of a token in a bucket of 2.
    #[test]
    fn a_share_is_charged_what_it_lacks_of_what_it_held_never_its_room() {
        let ms = Duration::from_millis;
        let quota = Quota::per_second(10).burst(6);
        let share = quota.portion(1.0 / 3.0, false).unwrap();
        assert_eq!(share.burst_size(), 2);
        let h = held(quota, 1.0 / 3.0, 3, false);
        assert_eq!(h, 2.0);
        assert_eq!(lacks(share, h, Duration::ZERO, 5), 0);
        // One token short (10/3 a second: 300 ms a token); a hair more, two.
        assert_eq!(lacks(share, h, ms(300), 5), 1);
        assert_eq!(lacks(share, h, ms(301), 5), 2);
        assert_eq!(lacks(share, h, ms(600), 5), 2);
        // Never more than was granted on it.
        assert_eq!(lacks(share, h, ms(600), 1), 1);
        let quota = Quota::per_second(1);
        let share = quota.portion(1.0 / 3.0, false).unwrap();
        assert_eq!(share.burst_size(), 2);
        let h = held(quota, 1.0 / 3.0, 3, false);
        // Its bucket 5/3 tokens short (3 s a token): as it started, nothing owed.
        assert_eq!(lacks(share, h, ms(5_000), 3), 0);
        // A token granted since, a third refilled: one owed.
        assert_eq!(lacks(share, h, ms(7_000), 3), 1);
        assert_eq!(lacks(share, h, ms(3_000), 3), 0);
    }

    /// A burst of at least 4 tokens per counted instance gives each share a whole token
    /// and splits the rest by fraction (1,000/s with a burst of 100 on 8 instances: 0.2%
    /// of the key holds 1.18 tokens, not 0.2); under it, or for a window, `f·B`. The
    /// shares of the instances never add up to more than the burst.
    #[test]
    fn a_big_burst_gives_each_counted_instance_a_whole_token() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let quota = Quota::per_second(1_000).burst(100);
        assert!(close(held(quota, 0.002, 8, false), 1.0 + 0.002 * 92.0));
        assert!(close(held(quota, 0.5, 8, false), 1.0 + 46.0));
        // A whole limit, none of it, a window, a burst under 4 a head: `f·B`.
        assert!(close(held(quota, 1.0, 8, false), 100.0));
        assert!(close(held(quota, 0.0, 8, false), 0.0));
        assert!(close(held(quota, 0.002, 8, true), 0.2));
        assert!(close(held(quota, 0.002, 25, false), 1.0 + 0.002 * 75.0));
        assert!(close(held(quota, 0.002, 26, false), 0.2));
        let login = Quota::per_minute(12).burst(3);
        assert!(close(held(login, 0.1, 10, false), 0.3));
        // An unknown key, 1/N on each: `B/N` either way.
        assert!(close(held(quota, 1.0 / 8.0, 8, false), 12.5));
        // Eight instances whose fractions add up to one hold the burst between them.
        let fractions = [0.9, 0.05, 0.02, 0.01, 0.01, 0.005, 0.003, 0.002];
        let sum: f64 = fractions.iter().map(|&f| held(quota, f, 8, false)).sum();
        assert!(close(sum, 100.0), "{sum}");
    }

    /// A GCRA share's burst is what it holds rounded up: 0.1 of 10/s with a burst of 40 on
    /// 8 instances holds 1 + 0.1 × 32 = 4.2 tokens, in a bucket of 5 (4, rounded from
    /// `f·B`, would leave it no room). A fixed window's share is its limit times `f`
    /// rounded down, never more: 0.25 of 30 a minute is 7 (it holds 7.5, which a window
    /// cannot). A sliding window's is `1/N`.
    #[test]
    fn a_shares_burst_is_what_it_holds_rounded_up_but_a_windows_rounded_down() {
        let (share, held) = share_of(Quota::per_second(10).burst(40), Algorithm::Gcra, 0.1, 8);
        assert!((held - 4.2).abs() < 1e-9, "{held}");
        assert_eq!(share.map(|q| q.burst_size()), Some(5));
        let fixed = Algorithm::fixed_window();
        let (share, held) = share_of(Quota::per_minute(30), fixed, 0.25, 4);
        assert_eq!(held, 7.5);
        let share = share.expect("a share");
        assert_eq!((share.rate(), share.burst_size()), (7, 7));
        let sliding = Algorithm::SlidingWindow;
        let (share, _) = share_of(Quota::per_minute(30), sliding, 0.9, 3);
        assert_eq!(share.map(|q| q.rate()), Some(10));
    }

    /// What a scripted backend does with a charge: hang (never answer), fail, or answer.
    #[derive(Clone, Copy, Debug)]
    enum Reply {
        Hang,
        Fail,
        Answer,
    }

    /// A backend answering charges as its script says (then hanging), noting each one.
    #[derive(Default)]
    struct Scripted {
        replies: std::sync::Mutex<std::collections::VecDeque<Reply>>,
        sent: Arc<std::sync::Mutex<Vec<(Op, u32)>>>,
    }

    impl crate::store::resilient::lease::Remote for Scripted {
        fn call(
            &self,
            op: Op,
            _: &Key,
            _: Quota,
            _: Algorithm,
            cost: u32,
            _: Duration,
        ) -> crate::store::resilient::lease::RemoteCall {
            self.sent.lock().unwrap().push((op, cost));
            match self
                .replies
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Reply::Hang)
            {
                Reply::Hang => Box::pin(std::future::pending()),
                Reply::Fail => Box::pin(async { Err(crate::store::StoreError::new("down")) }),
                Reply::Answer => Box::pin(async { Ok(Statuses::new()) }),
            }
        }
    }

    /// A debt, the charges sent for it, and the fallback store and clock of its share.
    type ScriptedDebt = (
        owed::Debt,
        Arc<std::sync::Mutex<Vec<(Op, u32)>>>,
        crate::store::MemoryStore<SharedClock>,
        SharedClock,
    );

    /// A debt of `granted` tokens on a share of 10/s (burst 10) that held it all, its
    /// local bucket spent by `spent`, over a backend replying `replies`; the fallback
    /// store and clock `charge_once` reads.
    fn scripted_debt(replies: &[Reply], granted: u64, spent: u32) -> ScriptedDebt {
        let clock = SharedClock::new(crate::store::resilient::tests::Tokio::start());
        let fallback = crate::store::MemoryStore::with_clock(clock.clone());
        let scripted = Scripted {
            replies: std::sync::Mutex::new(replies.iter().copied().collect()),
            ..Scripted::default()
        };
        let sent = scripted.sent.clone();
        let remote = Arc::new(super::super::lease::LeaseTable::new(
            Box::new(scripted),
            Arc::default(),
            Arc::default(),
            clock.clone(),
            Duration::from_millis(50),
        ));
        let share = Quota::per_second(10).burst(10);
        let local = fallback.table("api");
        let item = [Item::new(&local, Key::from_part("k"), share, spent)];
        assert!(matches!(
            fallback.apply(Op::Penalize, &item),
            Checked::Ready(_)
        ));
        let debt = owed::Debt {
            remote,
            key: Key::from_part("k"),
            quota: Quota::per_second(100).burst(100),
            local,
            share,
            held: 10.0,
            granted,
        };
        (debt, sent, fallback, clock)
    }

    /// A charge that hangs, then fails, is sent again with the same id until one send is
    /// answered; each send again charges what the share still lacks (a token refilled
    /// meanwhile is not charged).
    #[tokio::test(start_paused = true)]
    async fn a_charge_is_sent_again_with_its_id_until_one_send_is_answered() {
        let replies = [Reply::Hang, Reply::Fail, Reply::Answer];
        let (debt, sent, fallback, clock) = scripted_debt(&replies, 8, 8);
        let timeout = Duration::from_millis(50);
        let start = tokio::time::Instant::now();
        assert!(charge_once(&debt, 8, timeout, &fallback, &clock).await);
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 3, "{sent:?}");
        let ids: Vec<u64> = sent
            .iter()
            .map(|(op, _)| match op {
                Op::PenalizeOnce { id } => *id,
                other => panic!("{other:?} sent"),
            })
            .collect();
        assert!(ids.iter().all(|&id| id == ids[0]), "{ids:?}");
        // 150 ms after the first send (a timeout of 50, a pause of 100), 1.5 of the 8
        // tokens have refilled (7 lacked: a part of a token is a token); 200 ms later (an
        // error at once, a pause of 200), 3.5.
        assert_eq!(sent.iter().map(|&(_, c)| c).collect::<Vec<_>>(), [8, 7, 5]);
        assert_eq!(start.elapsed(), Duration::from_millis(50 + 100 + 200));
        // The next debt is a new charge: a new id.
        let (debt, sent, fallback, clock) = scripted_debt(&[Reply::Answer], 8, 8);
        assert!(charge_once(&debt, 8, timeout, &fallback, &clock).await);
        assert!(!matches!(sent.lock().unwrap()[0].0, Op::PenalizeOnce { id } if id == ids[0]));
    }

    /// A charge never answered is sent again with pauses doubling up to 5 s, and given up
    /// (`false`: counted as dropped) after `RESEND_FOR`: 17 sends in a minute, not one a
    /// timeout.
    #[tokio::test(start_paused = true)]
    async fn a_charge_never_answered_is_given_up_after_a_minute() {
        // 1,000 tokens short at 10/s: the debt lasts 100 s.
        let (debt, sent, fallback, clock) = scripted_debt(&[], 1_000, 1_000);
        let start = tokio::time::Instant::now();
        let timeout = Duration::from_millis(50);
        assert!(!charge_once(&debt, 1_000, timeout, &fallback, &clock).await);
        let elapsed = start.elapsed();
        assert!(
            elapsed > RESEND_FOR && elapsed < RESEND_FOR + RESEND_PAUSE_MAX * 2,
            "{elapsed:?}"
        );
        assert_eq!(sent.lock().unwrap().len(), 17);
        // With 580 ms timeouts the 15th pause ends a minute after the first send, to the
        // nanosecond: not more than a minute yet, so a 16th send goes.
        let (debt, sent, fallback, clock) = scripted_debt(&[], 1_000, 1_000);
        let timeout = Duration::from_millis(580);
        assert!(!charge_once(&debt, 1_000, timeout, &fallback, &clock).await);
        assert_eq!(sent.lock().unwrap().len(), 16);
    }

    /// A charge whose debt has passed (its share refilled while the sends hung) is not sent
    /// again: nothing is owed any more.
    #[tokio::test(start_paused = true)]
    async fn a_charge_whose_debt_has_passed_is_not_sent_again() {
        // A token spent of a share of 10/s: refilled within the first pause.
        let (debt, sent, fallback, clock) = scripted_debt(&[], 1, 1);
        let timeout = Duration::from_millis(50);
        assert!(charge_once(&debt, 1, timeout, &fallback, &clock).await);
        assert_eq!(sent.lock().unwrap().len(), 1);
    }

    /// A backend that is down, having counted `.0` instances before it went.
    #[derive(Clone, Debug)]
    struct DownAmong(u64);

    impl Backend for DownAmong {
        type Table = ();
        type Future = std::future::Ready<Result<Statuses, crate::store::StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::ready(Err(crate::store::StoreError::new("down")))
        }
        fn instances(&self) -> u64 {
            self.0
        }
    }

    /// A limit in shadow mode whose share is nothing (a fixed window of 5 a minute on 10
    /// instances, a key this instance knows nothing of: half a unit, rounded down) reports
    /// the refusal it would make, as in enforce mode; it is not decided on the whole quota
    /// locally, which would report every request as allowed.
    #[tokio::test]
    async fn a_shadow_limit_with_no_share_reports_the_refusal_it_would_make() {
        let store = Resilient::new(DownAmong(10));
        let table = store.table("logins");
        for mode in [Mode::Enforce, Mode::Shadow] {
            let item = Item::new(&table, Key::from_part("k"), Quota::per_minute(5), 1)
                .algorithm(Algorithm::fixed_window())
                .mode(mode)
                .on_failure(FailurePolicy::Share);
            let s = match store.apply(Op::Check, &[item]) {
                Checked::Ready(s) => s[0],
                Checked::Pending(f) => f.await[0],
            };
            assert!(
                matches!(s, Status::Fallback(o) if !o.is_allowed()),
                "{mode:?}: {s:?}"
            );
        }
    }

    /// During an outage a look (cost 0) owes nothing: only a grant that spent the share is
    /// a debt (a look's would take a place in the bounded list of keys owed, and charge
    /// nothing).
    #[tokio::test]
    async fn a_look_during_an_outage_owes_nothing() {
        let store = Resilient::new(Down);
        let table = store.table("api");
        for cost in [0, 1] {
            let item = Item::new(&table, Key::from_part("k"), Quota::per_second(10), cost)
                .on_failure(FailurePolicy::Share);
            let s = match store.apply(Op::Check, &[item]) {
                Checked::Ready(s) => s[0],
                Checked::Pending(f) => f.await[0],
            };
            assert!(matches!(s, Status::Fallback(o) if o.is_allowed()), "{s:?}");
            let owed = store.inner.owed.take();
            assert_eq!(owed.len(), usize::from(cost > 0), "cost {cost}");
        }
    }

    /// A backend whose checks answer 100 ms late, refused, and whose other calls (the
    /// charges) answer at once; it notes each charge and its cost.
    #[derive(Clone, Default)]
    struct LateRefusing {
        charges: Arc<std::sync::Mutex<Vec<(Op, u32)>>>,
    }

    impl Backend for LateRefusing {
        type Table = ();
        type Future = std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<Statuses, crate::store::StoreError>> + Send,
            >,
        >;
        fn table(&self, _: &str) {}
        fn apply(&self, op: Op, items: &[Item<'_, ()>]) -> Self::Future {
            let refused: Statuses = items
                .iter()
                .map(|_| Status::Checked(refused_for(1_000_000)))
                .collect();
            if op == Op::Check {
                return Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok(refused)
                });
            }
            let cost = items.first().map_or(0, |i| i.cost);
            self.charges.lock().unwrap().push((op, cost));
            Box::pin(std::future::ready(Ok(refused)))
        }
    }

    /// A check that timed out (10 ms) and that `Share` granted locally, refused by the
    /// backend's late answer, is charged back as soon as that answer comes, without
    /// another call to bring it: the token granted beyond the limit's count. `Fallback`
    /// (each instance its own quota, by design) is never charged.
    #[tokio::test(start_paused = true)]
    async fn a_share_grant_the_late_answer_refused_is_charged_back_at_once() {
        for (policy, charged) in [(FailurePolicy::Share, 1), (FailurePolicy::Fallback, 0)] {
            let backend = LateRefusing::default();
            let store = Resilient::new(backend.clone()).timeout(Duration::from_millis(10));
            let table = store.table("api");
            let quota = Quota::per_second(1).burst(10);
            let item = Item::new(&table, Key::from_part("k"), quota, 1).on_failure(policy);
            let s = match store.apply(Op::Check, &[item]) {
                Checked::Ready(s) => s[0],
                Checked::Pending(f) => f.await[0],
            };
            assert!(matches!(s, Status::Fallback(o) if o.is_allowed()), "{s:?}");
            tokio::time::sleep(Duration::from_millis(300)).await;
            let charges = backend.charges.lock().unwrap().clone();
            let cost: u32 = charges.iter().map(|&(_, c)| c).sum();
            assert_eq!(cost, charged, "{policy:?}: {charges:?}");
        }
    }

    /// A backend answering each check of two items at once: the first allowed, its
    /// shared bucket a token further on each time (other instances spend it), the second
    /// refused; then failing, when told to.
    #[derive(Clone, Default)]
    struct OtherRefuses {
        failing: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Backend for OtherRefuses {
        type Table = ();
        type Future = std::future::Ready<Result<Statuses, crate::store::StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, items: &[Item<'_, ()>]) -> Self::Future {
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return std::future::ready(Err(crate::store::StoreError::new("down")));
            }
            let allowed = Outcome::window(
                crate::algo::window::Report {
                    verdict: crate::algo::gcra::Admission::Allowed,
                    remaining: 0,
                    // 10/s: the bucket's TAT one emission interval after the send.
                    reset_after: 100_000_000,
                    next_after: None,
                    wait: 0,
                },
                1,
            );
            let statuses = items
                .iter()
                .enumerate()
                .map(|(i, _)| match i {
                    0 => Status::Checked(allowed),
                    _ => Status::Checked(refused_for(1_000_000)),
                })
                .collect();
            std::future::ready(Ok(statuses))
        }
    }

    /// A limit's grant in an answer that another limit of the same request refused is
    /// not this instance's traffic (the request did not pass, and the backend took
    /// nothing): a key whose bucket others spend while this instance's requests are all
    /// refused by another limit has a fraction of 0, and its share in an outage is
    /// nothing.
    #[tokio::test(start_paused = true)]
    async fn a_grant_another_limit_refused_is_not_this_instances_traffic() {
        let backend = OtherRefuses::default();
        let store = Resilient::new(backend.clone());
        let (api, other) = (store.table("api"), store.table("other"));
        let quota = Quota::per_second(10);
        let check = async |items: &[Item<'_, _>]| match store.apply(Op::Check, items) {
            Checked::Ready(s) => s,
            Checked::Pending(f) => f.await,
        };
        for _ in 0..10 {
            let items = [
                Item::new(&api, Key::from_part("k"), quota, 1).on_failure(FailurePolicy::Share),
                Item::new(&other, Key::from_part("k"), quota, 1),
            ];
            let s = check(&items).await;
            assert!(matches!(s[1], Status::Checked(o) if !o.is_allowed()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        backend
            .failing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let item = Item::new(&api, Key::from_part("k"), quota, 1).on_failure(FailurePolicy::Share);
        let s = check(&[item]).await;
        assert!(
            matches!(s[0], Status::Fallback(o) if !o.is_allowed()),
            "{:?}",
            s[0]
        );
    }

    async fn in_flight_check<B: Backend>(store: &Resilient<B>) -> Status {
        let table = store.table("jobs");
        let item = Item::new(&table, Key::from_part("k"), Quota::per_second(4), 1)
            .algorithm(Algorithm::in_flight())
            .on_failure(FailurePolicy::Share);
        match store.apply(Op::Check, &[item]) {
            Checked::Ready(s) => s[0],
            Checked::Pending(f) => f.await[0],
        }
    }

    /// The two-process flood's bug: an in-flight check that timed out got the local share
    /// beside the units the backend counted (12 in flight for 8). It refuses now; a
    /// backend that fails with an error gets the share.
    #[tokio::test(start_paused = true)]
    async fn a_timed_out_in_flight_check_refuses_and_a_failed_one_gets_the_share() {
        let silent = Resilient::new(Silent).timeout(Duration::from_millis(10));
        let s = in_flight_check(&silent).await;
        assert!(matches!(s, Status::Checked(o) if !o.is_allowed()), "{s:?}");
        assert_eq!(
            s.outcome().and_then(|o| o.retry_after()),
            Some(Duration::from_secs(1))
        );
        let down = Resilient::new(Down);
        let s = in_flight_check(&down).await;
        assert!(matches!(s, Status::Fallback(o) if o.is_allowed()), "{s:?}");
    }
}
