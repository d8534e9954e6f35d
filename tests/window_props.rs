//! Property tests for the window algorithms, each with its own bound,
//! through the memory store on a fake clock; and the boundary case users fear.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::FakeClock;
use tollgate::key::Key;
use tollgate::store::{Checked, Item, MemoryStore, MemoryTable, Statuses, Store};
use tollgate::{Algorithm, Outcome, Quota};

const EPOCH_US: u64 = 1_700_000_000_000_000;

/// A request: wait `dt` µs after the previous one, then ask for `cost`.
fn requests() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((prop_oneof![0u64..50, 0u64..400, Just(0)], 0u64..5), 1..250)
}

fn check(store: &MemoryStore<FakeClock>, item: Item<'_, MemoryTable>) -> Outcome {
    let Checked::Ready(s): Checked<_> = store.check(&[item]) else {
        unreachable!()
    };
    let s: Statuses = s;
    *s[0].outcome().unwrap()
}

/// Runs `reqs` against one key of a limit of `limit` per `len_us`: the admitted
/// `(instant µs since the epoch, cost)`, checking on the way that a refusal changes nothing
/// (and sweeping the store before every request, with no idle grace).
fn run(
    algorithm: Algorithm,
    limit: u64,
    len_us: u64,
    start: u64,
    reqs: &[(u64, u64)],
) -> Result<Vec<(u64, u64)>, TestCaseError> {
    let clock = FakeClock::at(Duration::from_micros(EPOCH_US + start));
    // No grace, and a sweep after every request: dropping state must change no decision.
    let store = MemoryStore::with_clock(clock.clone()).idle_grace(Duration::ZERO);
    let table = store.table("w");
    let quota = Quota::new(limit, Duration::from_micros(len_us)).unwrap();
    let item = |cost| Item::new(&table, Key::from_part("k"), quota, cost).algorithm(algorithm);
    let mut now = EPOCH_US + start;
    let mut admitted = Vec::new();
    for &(dt, cost) in reqs {
        now += dt;
        clock.advance(Duration::from_micros(dt));
        store.sweep();
        let before = check(&store, item(0));
        let o = check(&store, item(cost as u32));
        if o.is_allowed() {
            if cost > 0 {
                admitted.push((now, cost));
            }
            prop_assert!(o.remaining() <= before.remaining());
        } else {
            prop_assert_eq!(
                check(&store, item(0)),
                before,
                "a refusal changed the state"
            );
            prop_assert!(
                cost > before.remaining(),
                "refused {} with {} left",
                cost,
                before.remaining()
            );
            if let Some(wait) = o.retry_after() {
                prop_assert!(wait > Duration::ZERO);
            }
        }
    }
    Ok(admitted)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A fixed window (aligned, with any offset) never admits more than `limit` in one
    /// window.
    #[test]
    fn fixed_window_admits_at_most_the_limit_per_window(
        limit in 1u64..8, len_us in 8u64..500, offset in 0u64..1_000, start in 0u64..10_000,
        reqs in requests(),
    ) {
        let algorithm = Algorithm::fixed_window_at(Duration::from_micros(offset));
        let admitted = run(algorithm, limit, len_us, start, &reqs)?;
        let phase = offset % len_us;
        let mut per_window = std::collections::HashMap::new();
        for (t, cost) in admitted {
            *per_window.entry((t - phase) / len_us).or_insert(0) += cost;
        }
        for (w, n) in per_window {
            prop_assert!(n <= limit, "{} admitted in window {}", n, w);
        }
    }

    /// Reservations on an aligned fixed window, mixed with checks and
    /// with the store swept before every request: the units that start in any window
    /// (at `now + wait`) are at most `limit`, and no reservation waits longer than it
    /// allowed.
    #[test]
    fn fixed_window_reservations_start_at_most_the_limit_per_window(
        limit in 1u64..8, len_us in 8u64..500, offset in 0u64..1_000, start in 0u64..10_000,
        reqs in prop::collection::vec((0u64..400, 0u64..6, prop_oneof![Just(0u64), 0u64..2_000]), 1..120),
    ) {
        let algorithm = Algorithm::fixed_window_at(Duration::from_micros(offset));
        let clock = FakeClock::at(Duration::from_micros(EPOCH_US + start));
        let store = MemoryStore::with_clock(clock.clone()).idle_grace(Duration::ZERO);
        let table = store.table("w");
        let quota = Quota::new(limit, Duration::from_micros(len_us)).unwrap();
        let mut now = EPOCH_US + start;
        let mut per_window = std::collections::HashMap::new();
        for (dt, cost, max_wait) in reqs {
            now += dt;
            clock.advance(Duration::from_micros(dt));
            store.sweep();
            let item = Item::new(&table, Key::from_part("k"), quota, cost as u32)
                .algorithm(algorithm)
                .max_wait(Duration::from_micros(max_wait));
            let o = check(&store, item);
            if o.is_allowed() && cost > 0 {
                let wait = o.wait().as_micros() as u64;
                prop_assert!(wait <= max_wait, "waits {} > {}", wait, max_wait);
                let at = now + wait;
                let phase = offset % len_us;
                *per_window.entry((at - phase) / len_us).or_insert(0) += cost;
            }
        }
        for (w, n) in per_window {
            prop_assert!(n <= limit, "{} start in window {}", n, w);
        }
    }

    /// A random-phase fixed window admits at most `limit` per window of its own phase:
    /// some phase in `0..W` explains every admission.
    #[test]
    fn random_phase_fixed_window_admits_at_most_the_limit_per_window(
        limit in 1u64..6, len_us in 6u64..120, start in 0u64..10_000, reqs in requests(),
    ) {
        let admitted = run(Algorithm::fixed_window_random(), limit, len_us, start, &reqs)?;
        let fits = |phase: u64| {
            let mut per_window = std::collections::HashMap::new();
            admitted.iter().all(|&(t, cost)| {
                let n = per_window.entry((t - phase) / len_us).or_insert(0);
                *n += cost;
                *n <= limit
            })
        };
        prop_assert!((0..len_us).any(fits));
    }

    /// A sliding window never admits more than `limit × (1 + d / W)` over any interval of
    /// length `d`.
    #[test]
    fn sliding_window_admits_at_most_limit_times_one_plus_d_over_w(
        limit in 1u64..8, len_us in 8u64..500, start in 0u64..10_000, reqs in requests(),
    ) {
        let admitted = run(Algorithm::SlidingWindow, limit, len_us, start, &reqs)?;
        for i in 0..admitted.len() {
            let mut sum = 0;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let d = admitted[j].0 - admitted[i].0;
                // sum <= L (1 + d / W)  <=>  sum × W <= L × (W + d)
                prop_assert!(sum * len_us <= limit * (len_us + d), "{} admitted in {} µs", sum, d);
            }
        }
    }

    /// A sliding log never admits more than `limit` in any interval of length `W`.
    #[test]
    fn sliding_log_admits_at_most_the_limit_in_any_window(
        limit in 1u64..8, len_us in 8u64..500, start in 0u64..10_000, reqs in requests(),
    ) {
        let admitted = run(Algorithm::SlidingLog, limit, len_us, start, &reqs)?;
        for i in 0..admitted.len() {
            let mut sum = 0;
            for j in i..admitted.len() {
                if admitted[j].0 - admitted[i].0 >= len_us {
                    break;
                }
                sum += admitted[j].1;
                prop_assert!(sum <= limit, "{} admitted within {} µs", sum, len_us);
            }
        }
    }
}

/// Requests of cost 1 every microsecond from 5 µs before an aligned boundary to 5 µs after
/// it (a minute window, 10 per window): how many pass.
fn around_a_boundary(algorithm: Algorithm) -> u64 {
    let boundary = 1_700_000_040_000_000u64; // a whole minute since the epoch
    assert_eq!(boundary % 60_000_000, 0);
    // The previous window was quiet until 5 µs before its end.
    let clock = FakeClock::at(Duration::from_micros(boundary - 5));
    let store = MemoryStore::with_clock(clock.clone());
    let table = store.table("edge");
    let quota = Quota::per_minute(10);
    let mut admitted = 0;
    for _ in 0..10 {
        for _ in 0..10 {
            let item = Item::new(&table, Key::from_part("k"), quota, 1).algorithm(algorithm);
            admitted += u64::from(check(&store, item).is_allowed());
        }
        clock.advance(Duration::from_micros(1));
    }
    admitted
}

/// The documented weakness of aligned fixed windows: twice the limit within 10 µs around
/// a boundary. The other window algorithms never do it.
#[test]
fn twice_the_limit_around_an_aligned_boundary_happens_only_with_fixed_windows() {
    assert_eq!(around_a_boundary(Algorithm::fixed_window()), 20);
    assert_eq!(around_a_boundary(Algorithm::SlidingWindow), 10);
    assert_eq!(around_a_boundary(Algorithm::SlidingLog), 10);
    assert_eq!(around_a_boundary(Algorithm::Gcra), 10);
}
