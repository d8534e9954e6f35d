//! Property tests for the GCRA bounds, and the memory store against the pure algorithm.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::FakeClock;
use tollgate::gcra::{self, Admission, Params};
use tollgate::key::Key;
use tollgate::store::{Checked, Item, MemoryStore, Statuses, Store};
use tollgate::{Mode, Quota};

/// A request: wait `dt` units after the previous one, then ask for `cost`.
fn requests() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..400, 0u64..8), 1..200)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Over any interval `[a, b]`, the admitted cost is at most `burst + (b - a) / T`.
    #[test]
    fn admitted_cost_is_bounded_on_every_interval(
        t in 1u64..200, burst in 1u64..20, start in 0u64..1_000_000, reqs in requests(),
    ) {
        let p = Params::new(t, burst);
        let mut tat = 0;
        let mut now = start;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (dt, cost) in reqs {
            now += dt;
            let o = gcra::check(p, tat, now, cost);
            if o.verdict == Admission::Allowed && cost > 0 {
                tat = o.new_tat.unwrap();
                admitted.push((now, cost));
            }
        }
        for i in 0..admitted.len() {
            let mut sum = 0;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let d = admitted[j].0 - admitted[i].0;
                // sum <= burst + d / T, in integers: sum * T <= burst * T + d
                prop_assert!(
                    sum * t <= burst * t + d,
                    "{sum} admitted in {d} units with T={t}, burst={burst}"
                );
            }
        }
    }

    /// Reservations and checks mixed: the cost that starts over any
    /// interval `[a, b]` of start instants (`now + wait`) is at most `burst + (b - a) / T`,
    /// and no reservation waits longer than it allowed.
    #[test]
    fn reserved_starts_are_bounded_on_every_interval(
        t in 1u64..200, burst in 1u64..20, start in 0u64..1_000_000,
        reqs in prop::collection::vec((0u64..400, 0u64..8, prop_oneof![Just(0u64), 0u64..3_000]), 1..150),
    ) {
        let p = Params::new(t, burst);
        let mut tat = 0;
        let mut now = start;
        let mut started: Vec<(u64, u64)> = Vec::new();
        for (dt, cost, max_wait) in reqs {
            now += dt;
            let d = gcra::decide_within(p, tat, now, cost, max_wait);
            if d.verdict == Admission::Allowed && cost > 0 {
                let wait = d.wait(now, p);
                prop_assert!(wait <= max_wait);
                tat = d.new_tat.unwrap();
                started.push((now + wait, cost));
            }
        }
        started.sort();
        for i in 0..started.len() {
            let mut sum = 0;
            for j in i..started.len() {
                sum += started[j].1;
                let d = started[j].0 - started[i].0;
                prop_assert!(
                    sum * t <= burst * t + d,
                    "{sum} started in {d} units with T={t}, burst={burst}"
                );
            }
        }
    }

    /// A denial never writes; an admission never moves the TAT backwards and writes exactly
    /// `max(tat, now) + cost × T`.
    #[test]
    fn denials_never_write_and_tat_only_moves_forward(
        t in 1u64..1_000, burst in 1u64..50, tat in 0u64..100_000, now in 0u64..100_000, cost in 0u64..60,
    ) {
        let p = Params::new(t, burst);
        let o = gcra::check(p, tat, now, cost);
        match o.verdict {
            Admission::Allowed => {
                if cost == 0 {
                    prop_assert_eq!(o.new_tat, None, "a peek writes nothing");
                } else {
                    let new = o.new_tat.unwrap();
                    prop_assert!(new >= tat);
                    prop_assert_eq!(new, tat.max(now) + cost * t);
                }
            }
            Admission::Denied { retry_after } => {
                prop_assert_eq!(o.new_tat, None);
                prop_assert!(retry_after > 0);
                // After waiting exactly retry_after, the same request passes.
                prop_assert!(gcra::check(p, tat, now + retry_after, cost).verdict.is_allowed());
                prop_assert!(!gcra::check(p, tat, now + retry_after - 1, cost).verdict.is_allowed());
            }
            Admission::Never => {
                prop_assert_eq!(o.new_tat, None);
                prop_assert!(cost > burst);
            }
        }
        // What the client is told is consistent.
        prop_assert!(o.remaining <= burst);
        prop_assert_eq!(o.next_after.is_none(), o.remaining == burst);
        if let Some(next) = o.next_after {
            prop_assert!(next >= 1);
            let after = o.new_tat.unwrap_or(tat.max(now));
            // One more token exactly when promised.
            prop_assert_eq!(gcra::peek(p, after, now + next).remaining, o.remaining + 1);
            prop_assert_eq!(gcra::peek(p, after, now + next - 1).remaining, o.remaining);
        }
    }

    /// `remaining` tokens can really be taken, one more cannot.
    #[test]
    fn remaining_is_exact(t in 1u64..1_000, burst in 1u64..50, tat in 0u64..100_000, now in 0u64..100_000) {
        let p = Params::new(t, burst);
        let r = gcra::peek(p, tat, now).remaining;
        if r > 0 {
            prop_assert!(gcra::check(p, tat, now, r).verdict.is_allowed());
        }
        prop_assert!(!gcra::check(p, tat, now, r + 1).verdict.is_allowed());
    }
}

fn check(
    store: &MemoryStore<FakeClock>,
    items: &[Item<'_, tollgate::store::MemoryTable>],
) -> Statuses {
    match store.check(items) {
        Checked::Ready(s) => s,
        Checked::Pending(_) => unreachable!("the memory store never waits"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The memory store makes exactly the decisions of the pure algorithm.
    #[test]
    fn memory_store_matches_the_algorithm(
        rate in 1u64..50, burst in 1u64..20, reqs in prop::collection::vec((0u64..300, 0u32..6, 0u8..3), 1..150),
    ) {
        let clock = FakeClock::at(Duration::from_secs(5));
        let store = MemoryStore::with_clock(clock.clone());
        let table = store.table("t");
        let quota = Quota::new(rate, Duration::from_secs(1)).unwrap().burst(burst);
        let p = Params::new(quota.emission_interval().as_nanos() as u64, burst);
        let mut tats = [0u64; 3];
        for (dt_ms, cost, key) in reqs {
            clock.advance(Duration::from_millis(dt_ms));
            let now = clock.elapsed().as_nanos() as u64;
            let expected = gcra::check(p, tats[key as usize], now, u64::from(cost));
            if let Some(new) = expected.new_tat {
                tats[key as usize] = new;
            }
            let got = check(&store, &[Item::new(&table, Key::from_part(key), quota, cost)]);
            let o = got[0].outcome().unwrap();
            prop_assert_eq!(o.is_allowed(), expected.verdict.is_allowed());
            prop_assert_eq!(o.remaining(), expected.remaining);
            prop_assert_eq!(o.reset_after(), Duration::from_nanos(expected.reset_after));
        }
    }

    /// Several limits: a request passes iff every enforcing limit would pass it alone, and a
    /// refused request leaves every bucket as it was.
    #[test]
    fn several_limits_are_all_or_nothing(
        bursts in prop::collection::vec(1u64..8, 2..4),
        shadow in prop::collection::vec(any::<bool>(), 4),
        reqs in prop::collection::vec((0u64..500, 1u32..4), 1..80),
    ) {
        let clock = FakeClock::at(Duration::from_secs(5));
        let store = MemoryStore::with_clock(clock.clone());
        let tables: Vec<_> = (0..bursts.len()).map(|i| store.table(&format!("l{i}"))).collect();
        let quotas: Vec<Quota> = bursts.iter().map(|&b| Quota::per_second(2).burst(b)).collect();
        let modes: Vec<Mode> = (0..bursts.len()).map(|i| if shadow[i] { Mode::Shadow } else { Mode::Enforce }).collect();
        let peek = |i: usize| {
            let item = Item::new(&tables[i], Key::global(), quotas[i], 0);
            check(&store, &[item])[0].outcome().unwrap().reset_after()
        };
        for (dt_ms, cost) in reqs {
            clock.advance(Duration::from_millis(dt_ms));
            let before: Vec<Duration> = (0..tables.len()).map(peek).collect();
            // Whether each limit alone would pass the request: whole tokens available now,
            // from what the bucket reports, against the cost.
            let alone: Vec<bool> = (0..tables.len())
                .map(|i| {
                    let t = quotas[i].emission_interval().as_nanos() as u64;
                    let tau = quotas[i].refill_time().as_nanos() as u64;
                    let available = (tau - before[i].as_nanos() as u64) / t;
                    u64::from(cost) <= available
                })
                .collect();
            let items: Vec<_> = (0..tables.len())
                .map(|i| Item::new(&tables[i], Key::global(), quotas[i], cost).mode(modes[i]))
                .collect();
            let statuses = check(&store, &items);
            let passes = (0..tables.len()).all(|i| modes[i] == Mode::Shadow || alone[i]);
            for (i, s) in statuses.iter().enumerate() {
                prop_assert_eq!(s.outcome().unwrap().is_allowed(), alone[i], "limit {}", i);
            }
            let after: Vec<Duration> = (0..tables.len()).map(peek).collect();
            for i in 0..tables.len() {
                let consumed = passes && alone[i];
                if consumed {
                    prop_assert!(after[i] > before[i], "limit {} should have consumed", i);
                } else {
                    prop_assert_eq!(after[i], before[i], "limit {} must be untouched", i);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With any key cap and any arrival pattern — keys moving between their own buckets and
    /// the overflow bucket as sweeps make and take room — no key is granted more than
    /// `burst + d / T` over any interval `d`.
    #[test]
    fn the_key_cap_never_grants_more_than_the_bound(
        cap in 1usize..4,
        burst in 1u64..6,
        grace_ms in 0u64..300,
        ops in prop::collection::vec((0u64..400, 0u8..6, 1u32..3, 0u8..8), 1..200),
    ) {
        let clock = FakeClock::at(Duration::from_secs(5));
        let store = MemoryStore::with_clock(clock.clone())
            .max_keys(cap)
            .idle_grace(Duration::from_millis(grace_ms));
        let table = store.table("t");
        let quota = Quota::per_second(10).burst(burst); // T = 100 ms
        let t = quota.emission_interval().as_nanos() as u64;
        let mut granted: Vec<Vec<(u64, u64)>> = vec![Vec::new(); 6];
        for (dt_ms, key, cost, sweep) in ops {
            clock.advance(Duration::from_millis(dt_ms));
            if sweep == 0 {
                store.sweep();
            }
            let s = check(&store, &[Item::new(&table, Key::from_part(key), quota, cost)]);
            if s[0].outcome().unwrap().is_allowed() {
                granted[key as usize].push((clock.now_ns(), u64::from(cost)));
            }
            prop_assert!(store.len() <= cap);
        }
        for (key, g) in granted.iter().enumerate() {
            for i in 0..g.len() {
                let mut sum = 0;
                for later in &g[i..] {
                    sum += later.1;
                    let d = later.0 - g[i].0;
                    prop_assert!(
                        sum * t <= burst * t + d,
                        "key {key}: {sum} granted in {d} ns with burst {burst}"
                    );
                }
            }
        }
    }
}

/// The fake clock's time in nanoseconds.
trait NowNs {
    fn now_ns(&self) -> u64;
}

impl NowNs for FakeClock {
    fn now_ns(&self) -> u64 {
        self.elapsed().as_nanos() as u64
    }
}
