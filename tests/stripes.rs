//! Striped hot keys (`Limit::striped`, `Item::stripes`) in the memory store, with real
//! threads on a fake clock: the clock moves only between steps, while every thread waits
//! at a barrier, so no outcome depends on how fast the machine runs the threads.
//!
//! The bound under test (stated on `Limit::striped` and in `guide/hot_keys.md`): over any
//! interval `d`, a key split into `n` stripes grants at most `burst + d/T` tokens, the bound
//! of one bucket; and traffic under the limit is granted (at least 95 % of it here).

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::FakeClock;
use tollgate::key::Key;
use tollgate::store::{Checked, Item, MemoryStore, MemoryTable, Op, Store};
use tollgate::{Algorithm, LimitSpec, Limiter, Outcome, Quota};

/// A store on a fake clock at `secs` seconds, and its table `hot`.
fn hot(secs: u64) -> (FakeClock, MemoryStore<FakeClock>, MemoryTable) {
    let clock = FakeClock::at(Duration::from_secs(secs));
    let store = MemoryStore::with_clock(clock.clone());
    let table = store.table("hot");
    (clock, store, table)
}

/// Rates dividing 10^9, so that `T` (ns per token, rounded up by the quota) is exact.
const RATES: [u64; 6] = [100, 250, 400, 1_000, 2_000, 5_000];

/// A small deterministic generator per thread (no shared state between threads).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn cost(&mut self, max: u64) -> u32 {
        (1 + self.next() % max) as u32
    }
}

fn check(
    store: &MemoryStore<FakeClock>,
    table: &MemoryTable,
    quota: Quota,
    n: u8,
    cost: u32,
) -> bool {
    let item = Item::new(table, Key::from_part("hot"), quota, cost).stripes(n);
    let Checked::Ready(s) = store.check(&[item]) else {
        unreachable!("the memory store answers at once")
    };
    s[0].outcome().expect("checked").is_allowed()
}

/// One run: `threads` threads send, at each of `steps` instants `step_tokens` apart (in
/// tokens of the limit), requests of random costs (1 to `max_cost`) adding up to
/// `offered_per_step` tokens over all threads. Returns (tokens granted, tokens offered,
/// the span from the first instant to the last in ns).
#[allow(clippy::too_many_arguments)]
fn run(
    threads: u64,
    stripes: u8,
    rate: u64,
    burst: u64,
    max_cost: u64,
    step_tokens: u64,
    offered_per_step: u64,
    steps: u64,
    seed: u64,
) -> (u64, u64, u64) {
    let (clock, store, table) = hot(1_000);
    let quota = Quota::per_second(rate).burst(burst);
    let t = 1_000_000_000 / rate;
    let step = Duration::from_nanos(t * step_tokens);
    let barrier = Barrier::new(threads as usize + 1);
    let granted = AtomicU64::new(0);
    let offered = AtomicU64::new(0);
    std::thread::scope(|s| {
        for th in 0..threads {
            let (store, table, barrier, granted, offered) =
                (&store, &table, &barrier, &granted, &offered);
            s.spawn(move || {
                let mut rng = Rng(seed ^ (th + 1).wrapping_mul(0xA24B_AED4_963E_E407));
                // This thread's share of each step's tokens.
                let share = offered_per_step / threads + u64::from(th < offered_per_step % threads);
                for _ in 0..steps {
                    barrier.wait();
                    let mut left = share;
                    while left > 0 {
                        let cost = rng.cost(max_cost).min(left as u32);
                        left -= u64::from(cost);
                        offered.fetch_add(u64::from(cost), Ordering::Relaxed);
                        if check(store, table, quota, stripes, cost) {
                            granted.fetch_add(u64::from(cost), Ordering::Relaxed);
                        }
                    }
                    barrier.wait();
                }
            });
        }
        for i in 0..steps {
            if i > 0 {
                clock.advance(step);
            }
            barrier.wait(); // the threads send at this instant
            barrier.wait(); // and are done with it
        }
    });
    let span = (steps - 1) * t * step_tokens;
    (granted.into_inner(), offered.into_inner(), span)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Over the limit (2 to 4 times the rate) from 1 to 6 threads: never more than
    /// `burst + d/T`. Under it (at most 80 % of the rate): at least 95 % granted.
    #[test]
    fn a_striped_key_keeps_the_bound_of_one_bucket_under_real_threads(
        threads in 1u64..=6,
        stripes_log in 1u32..=3,
        rate_i in 0usize..RATES.len(),
        max_cost in 1u64..=3,
        burst_factor in 2u64..=6,
        over in any::<bool>(),
        load in 2u64..=4,
        steps in 10u64..=60,
        seed in any::<u64>(),
    ) {
        let stripes = 1u8 << stripes_log;
        let rate = RATES[rate_i];
        // Each stripe holds at least `burst_factor` of the largest cost.
        let burst = u64::from(stripes) * max_cost * burst_factor;
        // A step refills half the burst.
        let step_tokens = burst / 2;
        let offered_per_step = if over { step_tokens * load } else { step_tokens * 8 / 10 };
        let (granted, offered, span) = run(
            threads, stripes, rate, burst, max_cost, step_tokens, offered_per_step, steps, seed,
        );
        let t = 1_000_000_000 / rate;
        // The upper side: granted ≤ burst + span / T (as integers: × T).
        prop_assert!(
            u128::from(granted) * u128::from(t) <= u128::from(burst) * u128::from(t) + u128::from(span),
            "granted {granted} > burst {burst} + {span} ns / {t} ns"
        );
        if !over {
            // The lower side: traffic at 80 % of the rate, each step within the burst.
            prop_assert!(
                granted * 100 >= offered * 95,
                "granted {granted} of {offered} under the limit"
            );
        } else {
            // Over the limit the key is kept busy: it grants most of what the limit allows.
            let allowed = burst + span / t;
            prop_assert!(granted * 100 >= allowed * 90, "granted {granted} of {allowed} allowed");
        }
    }

    /// One thread, one random sequence of waits and costs (demand about the rate, where a
    /// bucket is most often neither full nor empty): the striped key grants what one bucket
    /// grants, within the bound: never more than `burst + d/T`, never a burst more than one
    /// bucket, and at least 90 % of one bucket's grants less a burst (a stripe that is
    /// full while this thread's own one is not loses its refill; one bucket loses it only
    /// when full).
    #[test]
    fn a_striped_key_grants_what_one_bucket_grants_single_threaded(
        stripes_log in 1u32..=3,
        rate_i in 0usize..RATES.len(),
        max_cost in 1u64..=3,
        burst_factor in 1u64..=6,
        ops in prop::collection::vec((0u64..=3_000, 1u32..=3), 1..400),
    ) {
        let stripes = 1u8 << stripes_log;
        let rate = RATES[rate_i];
        let burst = u64::from(stripes) * max_cost * burst_factor;
        let t = 1_000_000_000 / rate;
        let quota = Quota::per_second(rate).burst(burst);
        let mut totals = [0u64; 2];
        let mut span = 0;
        for (k, n) in [1u8, stripes].into_iter().enumerate() {
            let (clock, store, table) = hot(1_000);
            span = 0;
            for (i, &(wait_permille, cost)) in ops.iter().enumerate() {
                if i > 0 {
                    // Up to 3 tokens' time between requests.
                    let wait = t * wait_permille / 1_000;
                    clock.advance(Duration::from_nanos(wait));
                    span += wait;
                }
                let cost = cost.min(max_cost as u32);
                if check(&store, &table, quota, n, cost) {
                    totals[k] += u64::from(cost);
                }
            }
        }
        let [plain, striped] = totals;
        prop_assert!(
            u128::from(striped) * u128::from(t) <= u128::from(burst) * u128::from(t) + u128::from(span),
            "striped granted {striped} > burst {burst} + {span} ns / {t} ns"
        );
        prop_assert!(
            striped * 10 + burst * 10 >= plain * 9,
            "striped {striped}, one bucket {plain}"
        );
        prop_assert!(striped <= plain + burst, "striped {striped}, one bucket {plain}");
    }
}

/// A request costing more than a stripe holds is gathered from several; one costing more
/// than all the stripes together hold when full (`n·⌊burst/n⌋`) never passes, while one
/// bucket passes it.
#[test]
fn costs_beyond_a_stripe_are_gathered_and_beyond_all_never_pass() {
    let (clock, store, table) = hot(1);
    let quota = Quota::per_second(100).burst(9);
    assert!(check(&store, &store.table("one bucket"), quota, 1, 9));
    let never = |cost| {
        let item = Item::new(&table, Key::from_part("hot"), quota, cost).stripes(2);
        let Checked::Ready(s) = store.check(&[item]) else {
            unreachable!()
        };
        s[0].outcome().unwrap().is_never()
    };
    assert!(never(9), "2 stripes of 4 tokens");
    assert!(!never(8));
    // The 8 tokens are gone: 5 more are refused until the stripes refill 5 between them.
    assert!(!check(&store, &table, quota, 2, 5));
    clock.advance(Duration::from_millis(40));
    assert!(!check(&store, &table, quota, 2, 5), "4 tokens refilled");
    clock.advance(Duration::from_millis(10));
    assert!(
        check(&store, &table, quota, 2, 5),
        "5 tokens refilled, 2 and 3"
    );
    assert!(!check(&store, &table, quota, 2, 1));
}

/// A key striped by a `LimitSpec` through the `Limiter`: the burst is kept exactly when the
/// stripes divide it, and a reset and a block reach every stripe.
#[tokio::test]
async fn the_limiter_stripes_a_limit_that_asks() {
    let clock = FakeClock::at(Duration::from_secs(1));
    let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .limit(LimitSpec::new("global", Quota::per_second(8).burst(8)).striped(4))
        .build()
        .unwrap();
    let burst = async || {
        let mut granted = 0;
        for _ in 0..20 {
            granted += u32::from(limiter.check("global", "all", 1).await.unwrap().allowed());
        }
        granted
    };
    assert_eq!(
        burst().await,
        8,
        "the whole burst, borrowed stripe by stripe"
    );
    // One second refills 8 tokens: 2 in each stripe.
    clock.advance(Duration::from_secs(1));
    assert_eq!(burst().await, 8, "full again after 1 s");
    limiter.reset("global", "all").await.unwrap();
    assert_eq!(burst().await, 8, "a reset fills every stripe");
    limiter.reset("global", "all").await.unwrap();
    limiter
        .block("global", "all", Duration::from_secs(10))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(5));
    assert_eq!(burst().await, 0, "a block holds every stripe");
    clock.advance(Duration::from_secs(6));
    assert_eq!(burst().await, 8, "and lets go of every stripe");
}

/// Lowered to the burst: 64 stripes of a burst of 3 are 3 stripes of one token.
#[test]
fn stripes_beyond_the_burst_are_lowered_to_it() {
    let (_clock, store, table) = hot(1);
    let quota = Quota::per_second(1).burst(3);
    let granted = (0..10)
        .filter(|_| check(&store, &table, quota, 64, 1))
        .count();
    assert_eq!(granted, 3);
}

/// Stripes outside 1 to 64 are a configuration error naming the limit and the field when
/// the limiter is built, not a panic.
#[test]
fn stripes_outside_one_to_sixty_four_are_a_config_error() {
    for n in [0u8, 65, 255] {
        let err = Limiter::builder(MemoryStore::new())
            .limit(LimitSpec::new("global", Quota::per_second(8)).striped(n))
            .build()
            .err()
            .unwrap_or_else(|| panic!("{n} stripes built"));
        let text = err.to_string();
        assert!(text.contains("striped"), "{text}");
        assert!(text.contains("global"), "{text}");
        assert!(text.contains(&format!("not {n}")), "{text}");
    }
    for n in [1u8, 64] {
        assert!(
            Limiter::builder(MemoryStore::new())
                .limit(LimitSpec::new("global", Quota::per_second(8)).striped(n))
                .build()
                .is_ok()
        );
    }
}

/// One check of `cost` on the striped key `hot` (2 stripes) that may wait up to 1 ms (a
/// reservation, as delay mode makes): its outcome.
fn reserve(
    store: &MemoryStore<FakeClock>,
    table: &MemoryTable,
    quota: Quota,
    cost: u32,
) -> Outcome {
    let item = Item::new(table, Key::from_part("hot"), quota, cost)
        .stripes(2)
        .max_wait(Duration::from_millis(1));
    let Checked::Ready(s) = store.check(&[item]) else {
        unreachable!("the memory store answers at once")
    };
    *s[0].outcome().expect("checked")
}

/// A reservation on a striped key is never gathered from several stripes (a gathered cost
/// is a check, not a reservation): refused when no stripe can hold it within `max_wait`,
/// it says when the soonest stripe will, whichever stripe the thread checks first.
#[test]
fn a_striped_reservation_refused_waits_for_the_soonest_stripe() {
    let (clock, store, table) = hot(1);
    // 2 stripes of 2 tokens, one per 20 ms each.
    let quota = Quota::per_second(100).burst(4);
    assert!(
        reserve(&store, &table, quota, 2).is_allowed(),
        "this thread's stripe, emptied"
    );
    assert!(
        reserve(&store, &table, quota, 1).is_allowed(),
        "the other stripe, 1 token left"
    );
    // 2 tokens: this thread's stripe holds them in 40 ms, the other in 20 ms, and the two
    // hold 1 between them now: refused, retry in 20 ms (gathering them would say 10 ms;
    // the first stripe checked, 40 ms).
    let refused = reserve(&store, &table, quota, 2);
    assert!(!refused.is_allowed());
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(20)));
    clock.advance(Duration::from_millis(20));
    assert!(
        reserve(&store, &table, quota, 2).is_allowed(),
        "the other stripe, full"
    );
}

/// A window limit is never striped: its count is one, whichever threads check it (8 new
/// threads, on several stripes' slots were it striped, 2 checks each: 5 granted in all).
#[test]
fn a_window_limit_asking_for_stripes_keeps_one_count() {
    let (_clock, store, table) = hot(1);
    let quota = Quota::per_second(5);
    let granted = AtomicU64::new(0);
    on_new_threads(|_| {
        for _ in 0..2 {
            let item = Item::new(&table, Key::from_part("window"), quota, 1)
                .stripes(4)
                .algorithm(Algorithm::fixed_window());
            let Checked::Ready(s) = store.check(&[item]) else {
                unreachable!()
            };
            if s[0].outcome().unwrap().is_allowed() {
                granted.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    assert_eq!(granted.into_inner(), 5);
}

/// Applies `op` to the key `key` of `quota` in `n` stripes, reserving (up to 1 ms) when
/// `wait`: whether it was allowed.
fn apply(
    store: &MemoryStore<FakeClock>,
    table: &MemoryTable,
    op: Op,
    (key, quota, n): (&str, Quota, u8),
    cost: u32,
    wait: bool,
) -> bool {
    let mut item = Item::new(table, Key::from_part(key), quota, cost).stripes(n);
    if wait {
        item = item.max_wait(Duration::from_millis(1));
    }
    let Checked::Ready(s) = store.apply(op, &[item]) else {
        unreachable!("the memory store answers at once")
    };
    s[0].outcome().expect("applied").is_allowed()
}

/// Runs `f` on 8 new threads one after the other (threads are given stripes in turn, so
/// they cover several stripes and indices past the stripe count), each with its own key.
fn on_new_threads(f: impl Fn(&str) + Sync) {
    std::thread::scope(|s| {
        for t in 0..8 {
            let f = &f;
            s.spawn(move || f(&format!("thread {t}"))).join().unwrap();
        }
    });
}

/// A penalty lands on the thread's own stripe, one of the key's: the key grants that much
/// less, on whichever thread (2 stripes of 4: a penalty of 8 leaves the other 4).
#[test]
fn a_penalty_on_a_striped_key_lands_on_one_of_its_stripes() {
    let (_clock, store, table) = hot(1);
    let quota = Quota::per_second(1).burst(8);
    on_new_threads(|key| {
        assert!(apply(
            &store,
            &table,
            Op::Penalize,
            (key, quota, 2),
            8,
            false
        ));
        let granted = (0..10)
            .filter(|_| apply(&store, &table, Op::Check, (key, quota, 2), 1, false))
            .count();
        assert_eq!(granted, 4, "{key}");
    });
}

/// A check takes from the thread's own stripe first, the one its penalties land on: after
/// a check of 1 and a penalty of 1 on 2 stripes of 2, the other stripe is whole and a
/// reservation of 2 (never gathered) passes there.
#[test]
fn a_check_starts_at_the_threads_own_stripe() {
    let (_clock, store, table) = hot(1);
    let quota = Quota::per_second(1).burst(4);
    on_new_threads(|key| {
        assert!(apply(&store, &table, Op::Check, (key, quota, 2), 1, false));
        assert!(apply(
            &store,
            &table,
            Op::Penalize,
            (key, quota, 2),
            1,
            false
        ));
        assert!(
            apply(&store, &table, Op::Check, (key, quota, 2), 2, true),
            "{key}: the other stripe holds 2"
        );
    });
}

/// Reservations (never gathered) reach every stripe in turn: 4 stripes of 1 token grant 4
/// reservations of 1 to one thread, then refuse.
#[test]
fn a_threads_reservations_reach_every_stripe() {
    let (_clock, store, table) = hot(1);
    let quota = Quota::per_second(1).burst(4);
    on_new_threads(|key| {
        let granted = (0..6)
            .filter(|_| apply(&store, &table, Op::Check, (key, quota, 4), 1, true))
            .count();
        assert_eq!(granted, 4, "{key}");
    });
}

/// A cost gathered from several stripes reports when the key is full again as one bucket
/// would: 3 tokens of 2 stripes of 2 (one per 20 ms each), 30 ms.
#[test]
fn a_gathered_cost_reports_the_keys_reset_as_one_bucket() {
    let (_clock, store, table) = hot(1);
    let quota = Quota::per_second(100).burst(4);
    on_new_threads(|key| {
        let item = Item::new(&table, Key::from_part(key), quota, 3).stripes(2);
        let Checked::Ready(s) = store.check(&[item]) else {
            unreachable!()
        };
        let outcome = s[0].outcome().unwrap();
        assert!(outcome.is_allowed(), "{key}");
        assert_eq!(outcome.reset_after(), Duration::from_millis(30), "{key}");
    });
}

/// A gather that fails gives each stripe back what it took from that stripe: the key
/// still holds what it held (3 of 4), so a cost of 3 passes after a cost of 4 was refused.
#[test]
fn a_failed_gather_gives_each_stripe_back_its_own() {
    let (_clock, store, table) = hot(1);
    let quota = Quota::per_second(1).burst(4);
    on_new_threads(|key| {
        let stripes = (key, quota, 2);
        assert!(apply(&store, &table, Op::Check, stripes, 1, false));
        assert!(
            !apply(&store, &table, Op::Check, stripes, 4, false),
            "{key}"
        );
        assert!(apply(&store, &table, Op::Check, stripes, 3, false), "{key}");
        assert!(
            !apply(&store, &table, Op::Check, stripes, 1, false),
            "{key}"
        );
    });
}
