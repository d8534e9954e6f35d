//! How much of each key's traffic this instance serves, learnt while the backend answers:
//! what [`FailurePolicy::Share`](crate::FailurePolicy) gives a key while it does not.
//!
//! Every answer to a check says how far the shared bucket has moved: a GCRA bucket's TAT
//! (the send plus `reset_after`), a window's units used. Between two answers for a key,
//! the TAT moved by the tokens every instance spent, *plus* the time the bucket sat full
//! (GCRA: `tat' = max(tat, now) + cost·T`), so `ΔTAT / T` is never less than what all the
//! instances spent together; a window that ended between two answers counts as used to
//! the full. This instance knows what it spent itself (the costs the backend granted it).
//! Its fraction of the key is `mine / moved`, both sums decayed over a horizon of about
//! eight emission intervals (1 s to 60 s). The time since the last answer, beyond two of
//! this instance's own gaps between requests for the key (the wait for its next one),
//! counts as moved with nothing of this instance's: a key this instance stopped serving
//! fades, one it serves sparsely keeps its fraction between its requests.
//!
//! `moved` is never under what all the instances spent over the same answers, so the
//! fractions of the instances that serve a key add up to at most 1; a key served by one
//! instance at the limit gets the whole limit, one under the limit a fraction that is its
//! own rate's (its traffic, granted in full); a key spread over N instances about 1/N
//! each. A key this instance has no answer for is unknown (see `share.rs`).
//!
//! The fraction is frozen at the first failure (the outage's start) and thawed by the
//! next answer: it does not fade while the backend cannot say anything new.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::model::decision::Outcome;
use crate::model::key::Key;

/// Keys followed at most; further keys are unknown until some go stale.
const MAX_KEYS: usize = 100_000;
const SHARDS: usize = 16;

/// One key's traffic.
struct Record {
    /// The last answer, on the store's clock.
    at: u64,
    /// GCRA: the shared TAT then; a window: its end.
    mark: u64,
    /// A window: its units used then.
    used: u64,
    /// Decayed tokens: this instance's grants, and how far the shared bucket moved.
    mine: f64,
    moved: f64,
    /// The fraction given at the first failure since the last answer, and when.
    frozen: Option<(f64, u64)>,
    /// Whether `mark` and `used` come from an answer (not a key frozen unknown).
    seen: bool,
}

impl Record {
    /// A key's record at its first answer: `mark` and `used` as the answer gave them,
    /// nothing decayed yet.
    fn first(at: u64, mark: u64, used: u64) -> Self {
        Self {
            at,
            mark,
            used,
            mine: 0.0,
            moved: 0.0,
            frozen: None,
            seen: true,
        }
    }
}

/// The fraction of a key an instance serves, frozen at the outage's start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Fraction {
    pub(super) f: f64,
    /// When this outage started for the key (the store's clock).
    pub(super) since: u64,
}

/// One shard of the records, by (limit, key).
type Shard = HashMap<(usize, Key), Record, foldhash::fast::RandomState>;

/// Every key's traffic, by (limit, key).
pub(super) struct Traffic {
    shards: Vec<Mutex<Shard>>,
}

impl Default for Traffic {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

/// The emission interval a key's tokens are counted in: GCRA's `T`, a window's length
/// over its limit.
fn interval_ns(quota: Quota) -> f64 {
    (quota.period_ns() as f64 / quota.rate().max(1) as f64).max(1.0)
}

/// The horizon the sums decay over.
fn horizon_ns(quota: Quota) -> f64 {
    (8.0 * interval_ns(quota)).clamp(1e9, 60e9)
}

impl Traffic {
    fn shard(&self, id: &(usize, Key)) -> std::sync::MutexGuard<'_, Shard> {
        use std::hash::BuildHasher;
        let h = foldhash::fast::FixedState::with_seed(7).hash_one(id);
        let i = (h as usize) % SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An answer for `key` of the limit `table` (sent at `sent_at`, read at `now`): the
    /// shared bucket as `o` says, `granted` the tokens it gave this instance.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn observe(
        &self,
        table: usize,
        key: &Key,
        quota: Quota,
        algorithm: Algorithm,
        sent_at: u64,
        now: u64,
        granted: u32,
        o: &Outcome,
    ) {
        let window = algorithm.is_window();
        if !(algorithm == Algorithm::Gcra || algorithm.is_fixed()) {
            return;
        }
        let end =
            sent_at.saturating_add(u64::try_from(o.reset_after().as_nanos()).unwrap_or(u64::MAX));
        let used = quota.rate().saturating_sub(o.remaining());
        let t = interval_ns(quota);
        let id = (table, key.clone());
        let mut shard = self.shard(&id);
        let Some(r) = shard.get_mut(&id) else {
            if shard.len() >= MAX_KEYS / SHARDS {
                let stale = |r: &Record| now.saturating_sub(r.at) as f64 > 4.0 * 60e9;
                shard.retain(|_, r| !stale(r));
                if shard.len() >= MAX_KEYS / SHARDS {
                    return;
                }
            }
            shard.insert(id, Record::first(now, end, used));
            return;
        };
        if !r.seen {
            *r = Record::first(now, end, used);
            return;
        }
        let moved = if window {
            let len = quota.period_ns();
            if end.abs_diff(r.mark) < len / 2 {
                used.saturating_sub(r.used) as f64
            } else {
                // A window ended since: count it used to the full.
                (used + quota.rate().saturating_sub(r.used)) as f64
            }
        } else {
            end.saturating_sub(r.mark) as f64 / t
        };
        let mine = f64::from(granted);
        let d = (-(now.saturating_sub(r.at) as f64) / horizon_ns(quota)).exp();
        r.mine = r.mine * d + mine;
        r.moved = r.moved * d + moved.max(mine);
        r.at = now;
        r.mark = end;
        r.used = used;
        r.frozen = None;
    }

    /// The fraction of `key` this instance serves, frozen from now until the next answer;
    /// for a key it knows nothing of (no answer yet that says how far the bucket moved, or
    /// none for a long time), `unknown`, frozen likewise.
    pub(super) fn fraction_or(
        &self,
        table: usize,
        key: &Key,
        quota: Quota,
        now: u64,
        unknown: f64,
    ) -> Fraction {
        let id = (table, key.clone());
        let mut shard = self.shard(&id);
        if let Some(r) = shard.get_mut(&id)
            && let Some(f) = fraction_of(r, quota, now)
        {
            return f;
        }
        if shard.len() < MAX_KEYS / SHARDS || shard.contains_key(&id) {
            shard.insert(
                id,
                Record {
                    at: now,
                    mark: 0,
                    used: 0,
                    mine: 0.0,
                    moved: 0.0,
                    frozen: Some((unknown, now)),
                    seen: false,
                },
            );
        }
        Fraction {
            f: unknown,
            since: now,
        }
    }
}

/// A record's fraction at `now`, frozen; `None` if it says nothing (yet, or any more).
fn fraction_of(r: &mut Record, quota: Quota, now: u64) -> Option<Fraction> {
    {
        if let Some((f, since)) = r.frozen {
            return Some(Fraction { f, since });
        }
        let h = horizon_ns(quota);
        let idle = now.saturating_sub(r.at) as f64;
        if r.moved <= 0.0 || idle > 4.0 * h {
            return None;
        }
        // This instance's own requests for the key come about every `h / mine` (`mine` is
        // its decayed count over the horizon): the time since its last answer is the wait
        // for its next request, not a sign it stopped serving the key, until it is longer
        // than two of those gaps. Only the time beyond fades the key, counted as moved with
        // nothing of this instance's, decayed like every other movement.
        let gap = if r.mine > 0.0 {
            h / r.mine
        } else {
            f64::INFINITY
        };
        let quiet = (idle - 2.0 * gap).max(0.0);
        let d = (-quiet / h).exp();
        let during = h / interval_ns(quota) * (1.0 - d);
        let f = (r.mine * d / (r.moved * d + during)).clamp(0.0, 1.0);
        r.frozen = Some((f, now));
        Some(Fraction { f, since: now })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::gcra::Admission;
    use crate::algo::window::Report;

    const T: u64 = 100_000_000; // 10/s

    /// A key's traffic is counted over 8 emission intervals, at least a second and at
    /// most a minute.
    #[test]
    fn the_horizon_is_eight_intervals_between_a_second_and_a_minute() {
        assert_eq!(horizon_ns(Quota::per_second(1)), 8e9);
        assert_eq!(horizon_ns(Quota::per_second(4)), 2e9);
        assert_eq!(horizon_ns(Quota::per_second(1_000)), 1e9);
        assert_eq!(horizon_ns(Quota::per_minute(1)), 60e9);
    }

    /// An answer whose bucket is full again `reset_after` ns after the send.
    fn answer(reset_after: u64) -> Outcome {
        window_answer(0, reset_after)
    }

    /// A fixed window's answer: `remaining` units left, the window ending `reset_after`
    /// ns after the send.
    fn window_answer(remaining: u64, reset_after: u64) -> Outcome {
        Outcome::window(
            Report {
                verdict: Admission::Allowed,
                remaining,
                reset_after,
                next_after: None,
                wait: 0,
            },
            1,
        )
    }

    /// The records are bounded (100,000 keys, in 16 shards): a new key whose shard is full
    /// takes the room of records idle for more than 4 minutes; while none is that old,
    /// it is not recorded (its fraction is then the unknown key's). A key only asked for
    /// its fraction (an unknown key in an outage) takes no room in a full shard.
    #[test]
    fn a_full_shard_makes_room_from_records_idle_over_four_minutes_only() {
        let traffic = Traffic::default();
        let q = Quota::per_second(10);
        let observe = |key: &Key, now: u64| {
            traffic.observe(0, key, q, Algorithm::Gcra, now, now, 1, &answer(T));
        };
        let cap = MAX_KEYS / SHARDS;
        let (mut full, mut i) = (0, 0);
        while full < SHARDS {
            let key = Key::from_part(format!("k{i}"));
            i += 1;
            let len = traffic.shard(&(0, key.clone())).len();
            if len < cap {
                observe(&key, 0);
                full += usize::from(len + 1 == cap);
            }
        }
        let new = Key::from_part("new");
        let held = |t: &Traffic| t.shard(&(0, new.clone())).contains_key(&(0, new.clone()));
        let unknown = traffic.fraction_or(0, &new, q, 0, 0.5);
        assert_eq!(unknown.f, 0.5);
        assert!(
            !held(&traffic),
            "an unknown key is not recorded past the cap"
        );
        assert_eq!(traffic.shard(&(0, new.clone())).len(), cap);
        let four_minutes = 240_000_000_000;
        observe(&new, four_minutes);
        assert!(
            !held(&traffic),
            "no record was idle for more than 4 minutes"
        );
        observe(&new, four_minutes + 1);
        assert!(held(&traffic));
        assert_eq!(
            traffic.shard(&(0, new.clone())).len(),
            1,
            "the idle ones went"
        );
    }

    /// A fixed window's answers give its end as the send plus the reset the server saw, so
    /// the ends of one window differ by the round trip's jitter: they are one window, and
    /// the key moved by the grants alone (all this instance's here: its fraction is 1).
    #[test]
    fn answers_of_one_window_a_few_ms_apart_are_one_window() {
        let traffic = Traffic::default();
        let q = Quota::per_minute(100);
        let key = Key::from_part("k");
        let s = 1_000_000_000;
        let mut now = 0;
        for i in 0..10u64 {
            now = (1 + i) * s;
            // The window ends at 60 s, read 0 or 3 ms late.
            let reset_after = 60 * s - now + (i % 2) * 3_000_000;
            let o = window_answer(90 - i, reset_after);
            traffic.observe(0, &key, q, Algorithm::fixed_window(), now, now, 1, &o);
        }
        let f = traffic.fraction_or(0, &key, q, now, 0.5).f;
        assert!(f > 0.99, "{f}");
    }

    /// A window that ended between two answers is counted used to the full: the key moved
    /// by what the old window had left and what the new one has used (here 90 + 5, one of
    /// them this instance's).
    #[test]
    fn a_window_ended_between_two_answers_counts_as_used_to_the_full() {
        let traffic = Traffic::default();
        let q = Quota::per_minute(100);
        let key = Key::from_part("k");
        let s = 1_000_000_000;
        let fixed = Algorithm::fixed_window();
        // 10 used of the window ending at 60 s; then 5 of the next one, ending at 120 s.
        let (first, next) = (window_answer(90, s), window_answer(95, 59 * s));
        traffic.observe(0, &key, q, fixed, 59 * s, 59 * s, 1, &first);
        traffic.observe(0, &key, q, fixed, 61 * s, 61 * s, 1, &next);
        let f = traffic.fraction_or(0, &key, q, 61 * s, 0.5).f;
        assert!((f - 1.0 / 95.0).abs() < 1e-9, "{f}");
    }

    /// Grants at the limit's rate (a GCRA bucket's TAT one `T` ahead of each), every
    /// `every`-th of them this instance's: its fraction is `1/every`.
    fn fraction_at_rate(every: u64) -> f64 {
        let traffic = Traffic::default();
        let quota = Quota::per_second(10);
        let key = Key::from_part("k");
        let mut last = 0;
        for k in 1..=200u64 {
            if k % every == 0 {
                let at = k * T;
                traffic.observe(1, &key, quota, Algorithm::Gcra, at, at, 1, &answer(T));
                last = at;
            }
        }
        traffic.fraction_or(1, &key, quota, last, 0.5).f
    }

    #[test]
    fn a_key_served_alone_is_all_this_instances_and_shared_by_two_half() {
        assert!((fraction_at_rate(1) - 1.0).abs() < 1e-9);
        assert!((fraction_at_rate(2) - 0.5).abs() < 1e-9);
        assert!((fraction_at_rate(4) - 0.25).abs() < 1e-9);
    }

    /// Under the limit (the bucket full between grants): the fraction is the traffic's
    /// part of the rate, which grants that traffic whole.
    #[test]
    fn a_key_under_the_limit_gets_its_own_rate() {
        let traffic = Traffic::default();
        let quota = Quota::per_second(10);
        let key = Key::from_part("k");
        // 5/s alone: each grant finds the bucket full, its TAT one T after it.
        let mut at = 0;
        for _ in 0..100 {
            at += 2 * T;
            traffic.observe(1, &key, quota, Algorithm::Gcra, at, at, 1, &answer(T));
        }
        let f = traffic.fraction_or(1, &key, quota, at, 0.5).f;
        assert!((f - 0.5).abs() < 1e-9, "{f}");
    }

    /// 1/s on one of seven instances of a 14/s key under its limit, with the one-second
    /// horizon: its fraction, asked one of its own gaps after its last answer (an outage
    /// starting just before its next request), is its rate's, 1/14. It was 0.024 when
    /// the wait for the next request counted as the key fading: the share refused every
    /// request of a 1.7 s outage on all seven instances (23 of 34 granted, under the
    /// limit; `lease_world`'s share property found it).
    #[test]
    fn a_sparse_key_keeps_its_fraction_between_its_own_requests() {
        let traffic = Traffic::default();
        let quota = Quota::per_second(14);
        let t = 1_000_000_000 / 14;
        let key = Key::from_part("k");
        let mut at = 0;
        for _ in 0..10 {
            at += 1_000_000_000;
            // The bucket sat full since the last grant: its TAT one `T` after this one.
            traffic.observe(1, &key, quota, Algorithm::Gcra, at, at, 1, &answer(t));
        }
        let f = traffic.fraction_or(1, &key, quota, at + 999_000_000, 0.5).f;
        assert!((f - 1.0 / 14.0).abs() < 1e-3, "{f}");
    }

    /// A copy of the record of `key` in table `table` without its frozen fraction: what
    /// `fraction_of` computes afresh (asking freezes the fraction).
    fn thawed(traffic: &Traffic, table: usize, key: &Key) -> Record {
        let shard = traffic.shard(&(table, key.clone()));
        let r = shard.get(&(table, key.clone())).unwrap();
        Record { frozen: None, ..*r }
    }

    /// A key this instance stopped serving fades: asked long after its last answer (more
    /// than two of its gaps, within the four horizons it is remembered), its fraction is
    /// a small part of what it was, and less the longer it has been quiet.
    #[test]
    fn a_key_this_instance_stopped_serving_fades() {
        let traffic = Traffic::default();
        let quota = Quota::per_second(10);
        let key = Key::from_part("k");
        let mut at = 0;
        for _ in 0..100 {
            at += T;
            traffic.observe(1, &key, quota, Algorithm::Gcra, at, at, 1, &answer(T));
        }
        let fraction = |since: u64| {
            // A fresh copy of the record: asking freezes the fraction.
            let mut r = thawed(&traffic, 1, &key);
            fraction_of(&mut r, quota, at + since).unwrap().f
        };
        // Within two of its gaps (about 0.19 s): the whole key still.
        assert!((fraction(T * 3 / 2) - 1.0).abs() < 1e-9);
        let (one, three) = (fraction(12 * T), fraction(32 * T));
        // One horizon (1 s) of quiet beyond the two gaps: e⁻¹ of it; three: e⁻³.
        assert!((one - (-1f64).exp()).abs() < 0.01, "{one}");
        assert!((three - (-3f64).exp()).abs() < 0.01, "{three}");
    }

    /// A key quiet for more than four horizons is forgotten: the value given for an
    /// unknown key, not a faded fraction (up to the four, a faded one; at exactly four,
    /// still faded, 1 ns later, forgotten).
    #[test]
    fn a_key_quiet_for_four_horizons_is_unknown_again() {
        let traffic = Traffic::default();
        let quota = Quota::per_second(10);
        let key = Key::from_part("k");
        let mut at = 0;
        for _ in 0..20 {
            at += T;
            traffic.observe(1, &key, quota, Algorithm::Gcra, at, at, 1, &answer(T));
        }
        // The horizon is 1 s (eight intervals of 0.1 s, at least 1 s).
        let mut r = thawed(&traffic, 1, &key);
        let faded = fraction_of(&mut r, quota, at + 3_900_000_000).unwrap().f;
        assert!(faded > 0.0 && faded < 0.1, "{faded}");
        let mut r = thawed(&traffic, 1, &key);
        let four = fraction_of(&mut r, quota, at + 4_000_000_000).expect("remembered");
        assert!(four.f > 0.0 && four.f < faded, "{four:?}");
        let after = traffic.fraction_or(1, &key, quota, at + 4_000_000_001, 0.3);
        assert_eq!(after.f, 0.3);
    }

    /// An unknown key gets the value given, frozen like a known key's until an answer.
    #[test]
    fn an_unknown_key_gets_the_unknown_share_frozen_until_an_answer() {
        let traffic = Traffic::default();
        let quota = Quota::per_second(10);
        let key = Key::from_part("k");
        let f = traffic.fraction_or(1, &key, quota, 5, 0.25);
        assert_eq!(f, Fraction { f: 0.25, since: 5 });
        assert_eq!(traffic.fraction_or(1, &key, quota, 9 * T, 0.5), f);
        // An answer thaws it: the key is known from its next one.
        traffic.observe(
            1,
            &key,
            quota,
            Algorithm::Gcra,
            10 * T,
            10 * T,
            1,
            &answer(T),
        );
        traffic.observe(
            1,
            &key,
            quota,
            Algorithm::Gcra,
            11 * T,
            11 * T,
            1,
            &answer(T),
        );
        let known = traffic.fraction_or(1, &key, quota, 11 * T, 0.5);
        assert_eq!(known.since, 11 * T);
        assert!((known.f - 1.0).abs() < 1e-9, "{known:?}");
    }
}
