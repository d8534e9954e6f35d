//! Shared limits in a world that is not instant: a simulated backend whose calls take time
//! each way, that can fail, go silent (a black hole), answer after the caller gave up
//! (the operation applied on the server all the same), lose its state (a wipe) or come
//! back from an older snapshot, while instances alternate quotas and costs. Time is
//! tokio's paused clock, which the backend, the stores and the requests all read, so every
//! run is the same and no test waits for real.
//!
//! The property tests check the bounds over all of these; the named tests pin each way the
//! bound broke before (issue "Shared limits that hold under stress").
//!
//! The simulated backend and the clock are the public kit of feature `testing`
//! (`tollgate::testing`); this file adds the runs, the faults as data and the bounds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::Clock;
use tollgate::store::Resilient;
use tollgate::testing::{SimBackend, TokioClock};
use tollgate::{Algorithm, FailurePolicy, Lease, LimitSpec, Limiter, Quota};

/// The shared backend of the instances.
type World = SimBackend;

/// A world of `instances`, on `clock`.
fn world(clock: &TokioClock, instances: u64) -> World {
    SimBackend::builder()
        .clock(*clock)
        .instances(instances)
        .build()
}

/// The tokens `key` of `table` has now (on `rt`'s clock), under `quota`.
fn remaining(
    rt: &tokio::runtime::Runtime,
    world: &World,
    table: &str,
    key: &str,
    quota: Quota,
) -> u64 {
    rt.block_on(async { world.remaining(table, key, quota) })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// One instance: a store over the world, and a limiter per spec (plans of one limit).
struct Instance {
    store: Resilient<World>,
    plans: Vec<Limiter>,
}

fn fleet(world: &World, n: usize, specs: &[LimitSpec]) -> Vec<Instance> {
    (0..n)
        .map(|_| {
            let store = world.store();
            let plans = specs
                .iter()
                .map(|spec| {
                    Limiter::builder(store.clone())
                        .limit(spec.clone())
                        .build()
                        .unwrap()
                })
                .collect();
            Instance { store, plans }
        })
        .collect()
}

/// Something that happens to the world at an instant of the run.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Each way, from now on.
    Latency(Duration),
    Failing(bool),
    BlackHole(bool),
    Wipe,
    Save,
    Restore,
}

/// A request: which instance, which plan, its cost, and how long after the previous one.
#[derive(Debug, Clone)]
struct Request {
    instance: usize,
    plan: usize,
    cost: u32,
    after: Duration,
}

/// Plays `requests` (each spawned, so they overlap with calls on their way) and `faults`
/// (at their instants from the start) on `fleet`; answers the tokens granted and the run's
/// length. The run ends `tail` after the last request.
fn play(
    rt: &tokio::runtime::Runtime,
    world: &World,
    fleet: &[Instance],
    requests: &[Request],
    faults: &[(Duration, Fault)],
    tail: Duration,
) -> (u64, Duration) {
    let (grants, d) = play_grants(rt, world, fleet, requests, faults, tail);
    (grants.iter().map(|&(_, cost)| u64::from(cost)).sum(), d)
}

/// [`play`], answering each grant: its instant on the world's clock, and its cost.
fn play_grants(
    rt: &tokio::runtime::Runtime,
    world: &World,
    fleet: &[Instance],
    requests: &[Request],
    faults: &[(Duration, Fault)],
    tail: Duration,
) -> (Vec<(u64, u32)>, Duration) {
    let granted = Arc::new(Mutex::new(Vec::new()));
    let start = rt.block_on(async { tokio::time::Instant::now() });
    let mut faults: Vec<(Duration, Fault)> = faults.to_vec();
    faults.sort_by_key(|f| f.0);
    let mut faults = faults.into_iter().peekable();
    let mut tasks = Vec::new();
    let apply = |f: Fault| match f {
        Fault::Latency(d) => world.set_latency(d),
        Fault::Failing(on) => world.outage(on),
        Fault::BlackHole(on) => world.black_hole(on),
        Fault::Wipe => world.wipe(),
        Fault::Save => world.snapshot(),
        Fault::Restore => world.restore(),
    };
    let d = rt.block_on(async {
        // Each request's instant from the start: tokio's timer ticks in milliseconds, so
        // requests less than a tick apart go together, at the rate the script says.
        let mut at = Duration::ZERO;
        for r in requests {
            at += r.after;
            while let Some(&(t, _)) = faults.peek()
                && t <= at
            {
                if start + t > tokio::time::Instant::now() {
                    tokio::time::sleep_until(start + t).await;
                }
                apply(faults.next().unwrap().1);
            }
            if start + at > tokio::time::Instant::now() {
                tokio::time::sleep_until(start + at).await;
            }
            let i = &fleet[r.instance % fleet.len()];
            let limiter = i.plans[r.plan % i.plans.len()].clone();
            let (granted, clock) = (granted.clone(), *world.clock());
            let cost = r.cost;
            tasks.push(tokio::spawn(async move {
                if limiter.check("api", "k", cost).await.unwrap().allowed() {
                    granted.lock().unwrap().push((clock.now(), cost));
                }
            }));
        }
        for (t, f) in faults {
            if start + t > tokio::time::Instant::now() {
                tokio::time::sleep_until(start + t).await;
            }
            apply(f);
        }
        let end = start.elapsed() + tail;
        for t in tasks {
            t.await.unwrap();
        }
        tokio::time::sleep_until(start + end).await;
        start.elapsed()
    });
    let grants = std::mem::take(&mut *granted.lock().unwrap());
    (grants, d)
}

/// `count` requests spread evenly over `seconds` across `n` instances, of `cost`.
fn even(count: usize, seconds: u64, n: usize, cost: u32) -> Vec<Request> {
    let gap = Duration::from_secs(seconds) / u32::try_from(count).unwrap();
    (0..count)
        .map(|i| Request {
            instance: i % n,
            plan: 0,
            cost,
            after: gap,
        })
        .collect()
}

/// The exact limiter's grants over `d`: `burst + d/T`.
fn exact(quota: Quota, d: Duration) -> u64 {
    quota.burst_size() + u64::try_from(d.as_nanos() / quota.emission_interval().as_nanos()).unwrap()
}

/// Item 1: a busy instance (or a far Redis) answers late, not never. Calls that take
/// longer than the timeout (80 ms round trips against 50 ms) never open the breaker, the
/// timeout grows to the round trips observed, and the grants stay inside the lease bound:
/// before, each late call counted as a failure, the breaker opened, and every instance
/// answered from a full local bucket.
#[test]
fn a_flooded_instance_whose_calls_answer_late_never_opens_the_breaker() {
    for lease in [Some(Lease::auto()), None] {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 4);
        let quota = Quota::per_second(1_000).burst(100);
        let mut spec = LimitSpec::new("api", quota);
        if let Some(l) = lease {
            spec = spec.lease(l);
        }
        let fleet = fleet(&world, 4, &[spec]);
        // Watch the breakers every millisecond of the run.
        let opened = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stores: Vec<Resilient<World>> = fleet.iter().map(|i| i.store.clone()).collect();
        let watch = opened.clone();
        rt.spawn(async move {
            loop {
                if stores.iter().any(Resilient::is_unavailable) {
                    watch.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        let requests = even(40_000, 5, 4, 1); // 8x the limit
        let faults = [(Duration::ZERO, Fault::Latency(Duration::from_millis(40)))];
        let (granted, d) = play(&rt, &world, &fleet, &requests, &faults, Duration::ZERO);
        let cap = if lease.is_some() { 12 } else { 0 };
        let bound = exact(quota, d) + 4 * cap;
        eprintln!("late answers, lease {lease:?}: {granted} granted over {d:?}, bound {bound}");
        assert!(
            !opened.load(std::sync::atomic::Ordering::SeqCst),
            "the breaker opened"
        );
        assert!(
            granted <= bound + bound / 100,
            "{granted} granted, bound {bound}"
        );
    }
}

/// Item 2: while the backend fails, each of N instances spends its share (1/N of the
/// burst and the rate), not a whole copy of the limit, and once it answers again charges
/// the shared bucket with what its shares lack: the N instances together grant one limit
/// over the run, not N over the outage.
#[test]
fn an_outage_spends_a_share_not_a_copy() {
    for (policy, lease) in [
        (FailurePolicy::Share, Some(Lease::auto())),
        (FailurePolicy::Share, None),
    ] {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 4);
        let quota = Quota::per_second(1_000).burst(100);
        let mut spec = LimitSpec::new("api", quota).on_store_failure(policy);
        if let Some(l) = lease {
            spec = spec.lease(l);
        }
        let fleet = fleet(&world, 4, &[spec]);
        let requests = even(48_000, 6, 4, 1); // 8x the limit
        let faults = [
            (Duration::from_secs(1), Fault::Failing(true)),
            (Duration::from_secs(4), Fault::Failing(false)),
        ];
        let (granted, d) = play(&rt, &world, &fleet, &requests, &faults, Duration::ZERO);
        // The exact limiter and the leases: the shares together are one bucket at the
        // limit's rate, and what they lack when Redis answers again is charged to it, so
        // the outage adds nothing but a rounding (1 %).
        let bound = exact(quota, d) + 4 * 12;
        eprintln!("{policy:?}, lease {lease:?}: {granted} granted over {d:?}, bound {bound}");
        assert!(
            granted <= bound + bound / 100,
            "{granted} granted, bound {bound}"
        );
        // Not starved either: each instance kept serving its share.
        assert!(granted * 100 >= exact(quota, d) * 95, "{granted} granted");
    }
}

/// Issue 41: only an enforced GCRA limit's outage grants are charged back when the
/// backend answers again. One instance (the whole limit its share), 100 an hour, 10
/// requests a second for 3 s, the backend failing from 1 s to 2 s: it counts 17 of the 30
/// requests, and 13 are granted on the share (the outage's 10, and 3 before the breaker
/// lets calls through again). Enforced, those 13 are charged (70 left); in shadow mode
/// (which refuses nothing and keeps no bound) and on a fixed window (never owed: a window
/// seen spent stays spent instead) they are not: 83 left, what the backend counted.
#[test]
fn only_an_enforced_gcra_limits_outage_grants_are_charged_back() {
    let quota = Quota::per_hour(100);
    for (what, spec, left) in [
        ("enforced", LimitSpec::new("api", quota), 70),
        ("shadow", LimitSpec::new("api", quota).shadow(), 83),
        (
            "fixed window",
            LimitSpec::new("api", quota).algorithm(Algorithm::fixed_window()),
            83,
        ),
    ] {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 1);
        let fleet = fleet(&world, 1, &[spec]);
        let faults = [
            (Duration::from_secs(1), Fault::Failing(true)),
            (Duration::from_secs(2), Fault::Failing(false)),
        ];
        let requests = even(30, 3, 1, 1);
        let (granted, _) = play(
            &rt,
            &world,
            &fleet,
            &requests,
            &faults,
            Duration::from_secs(1),
        );
        assert_eq!(granted, 30, "{what}");
        let limiter = &fleet[0].plans[0];
        let peek = rt.block_on(async { limiter.peek("api", "k").await.unwrap() });
        assert_eq!(peek.remaining(), Some(left), "{what}");
    }
}

/// Item 3: a client alternating plans (two quotas of one limit, one key: 19 requests on
/// `pro`, then one on `free`, in a loop) never refills a
/// leased bucket: tokens go back at the quota they were taken at. Before, they went back
/// at the new quota, and a refund clamped to a full bucket: every request passed.
#[test]
fn alternating_plans_never_refill_a_leased_bucket() {
    let rt = runtime();
    let clock = rt.block_on(async { TokioClock::new() });
    let world = world(&clock, 1);
    let free = Quota::per_second(10);
    let pro = Quota::per_second(100);
    let specs = [
        LimitSpec::new("api", pro).lease(Lease::auto()),
        LimitSpec::new("api", free).lease(Lease::auto()),
    ];
    let fleet = fleet(&world, 1, &specs);
    let requests: Vec<Request> = (0..9_000)
        .map(|i| Request {
            instance: 0,
            plan: usize::from(i % 20 == 19), // 19 pro, then free
            cost: 1,
            after: Duration::from_micros(333),
        })
        .collect();
    let (granted, d) = play(&rt, &world, &fleet, &requests, &[], Duration::ZERO);
    // The most generous plan, plus one lease of it.
    let bound = exact(pro, d) + 12;
    eprintln!("alternating plans: {granted} of 9000 granted over {d:?}, bound {bound}");
    assert!(granted <= bound, "{granted} granted, bound {bound}");
}

/// Item 6: leased tokens of a key that gets no more requests go back after the lease's
/// age, without a request to trigger it.
#[test]
fn idle_leases_go_back_after_max_age_without_a_request() {
    let rt = runtime();
    let clock = rt.block_on(async { TokioClock::new() });
    let world = world(&clock, 1);
    let quota = Quota::per_hour(100); // nothing refills during the test
    let spec =
        LimitSpec::new("api", quota).lease(Lease::tokens(20).max_age(Duration::from_secs(1)));
    let fleet = fleet(&world, 1, &[spec]);
    let requests = even(20, 1, 1, 1);
    let (granted, _) = play(&rt, &world, &fleet, &requests, &[], Duration::from_secs(3));
    let stats = fleet[0].store.lease_stats();
    assert!(
        stats.leased_tokens > stats.local_allowed,
        "a lease was held: {stats:?}"
    );
    assert_eq!(
        remaining(&rt, &world, "api", "k", quota),
        100 - granted,
        "every unspent token is back: {stats:?}"
    );
}

/// Item 9: a key refused before an outage longer than one interval is still written back
/// after the backend comes back empty (before, a refusal was remembered only until the key
/// could pass one request, and the bucket came back full).
#[test]
fn a_key_refused_before_a_long_outage_is_written_back() {
    let rt = runtime();
    let clock = rt.block_on(async { TokioClock::new() });
    let world = world(&clock, 1);
    let quota = Quota::per_minute(10).burst(5); // T = 6 s
    let spec = LimitSpec::new("api", quota);
    let fleet = fleet(&world, 1, &[spec]);
    // Refused steadily for 2 s, then the backend is silent for 8 s (longer than one
    // interval) and comes back empty at 11 s; one more request at 12 s.
    let mut requests = even(50, 2, 1, 1);
    requests.push(Request {
        instance: 0,
        plan: 0,
        cost: 1,
        after: Duration::from_secs(10),
    });
    let faults = [
        (Duration::from_secs(3), Fault::BlackHole(true)),
        (Duration::from_secs(11), Fault::Wipe),
        (Duration::from_secs(11), Fault::BlackHole(false)),
    ];
    let (granted, d) = play(
        &rt,
        &world,
        &fleet,
        &requests,
        &faults,
        Duration::from_secs(1),
    );
    // The burst, and the one request due at 12 s.
    assert_eq!(granted, 6, "the burst, then refusals");
    // At most what refilled since the key was spent (2 tokens in 13 s; the request at
    // 12 s may reach the empty bucket before the write-back, which then restores the
    // state as it was), not a fresh burst (4 left).
    let left = remaining(&rt, &world, "api", "k", quota);
    let refilled = d.as_secs() / 6;
    assert!(
        left <= refilled,
        "{left} left after {d:?}: the bucket came back full"
    );
}

/// Item 7: a restart from an older snapshot (the key was spent after the snapshot) is a
/// loss: the spent key is written back.
#[test]
fn a_restart_from_an_older_snapshot_writes_back_what_was_spent_since() {
    let rt = runtime();
    let clock = rt.block_on(async { TokioClock::new() });
    let world = world(&clock, 1);
    let quota = Quota::per_hour(5);
    let fleet = fleet(&world, 1, &[LimitSpec::new("api", quota)]);
    let mut requests = even(10, 1, 1, 1);
    // A request after the restart: the store notices the loss on its next call.
    requests.push(Request {
        instance: 0,
        plan: 0,
        cost: 1,
        after: Duration::from_secs(2),
    });
    let faults = [
        (Duration::ZERO, Fault::Save),
        (Duration::from_secs(2), Fault::Restore),
    ];
    let (granted, _) = play(
        &rt,
        &world,
        &fleet,
        &requests,
        &faults,
        Duration::from_secs(1),
    );
    assert!(granted <= 6, "{granted} granted");
    assert_eq!(
        remaining(&rt, &world, "api", "k", quota),
        0,
        "spent, as before the restart"
    );
}

/// Item 11: two limiters (or layers) naming the same limit on one store share its leases:
/// the instance holds at most one lease of the key, not one per limiter.
#[test]
fn two_limits_with_the_same_name_lease_one_key_once() {
    let rt = runtime();
    let clock = rt.block_on(async { TokioClock::new() });
    let world = world(&clock, 1);
    let quota = Quota::per_hour(1_000).burst(80); // a lease of at most 10
    let spec = LimitSpec::new("api", quota).lease(Lease::tokens(10));
    let fleet = fleet(&world, 1, &[spec.clone(), spec]);
    let requests: Vec<Request> = (0..40)
        .map(|i| Request {
            instance: 0,
            plan: i % 2,
            cost: 1,
            after: Duration::from_millis(1),
        })
        .collect();
    let (granted, _) = play(&rt, &world, &fleet, &requests, &[], Duration::ZERO);
    let taken = 80 - remaining(&rt, &world, "api", "k", quota);
    assert!(
        taken <= granted + 10,
        "{taken} taken from the bucket for {granted} granted: more than one lease held"
    );
}

/// A random run: instances, plans, costs, arrivals and faults.
#[derive(Debug, Clone)]
struct Run {
    n: usize,
    leased: bool,
    rate: u64,
    burst: u64,
    requests: Vec<Request>,
    faults: Vec<(Duration, Fault)>,
}

fn runs() -> impl Strategy<Value = Run> {
    (1usize..=4, any::<bool>(), 20u64..=400, 4u64..=80)
        .prop_flat_map(|(n, leased, rate, burst)| {
            let request = (0..n, 0..2usize, 1u32..=3, 0u64..3_000).prop_map(
                |(instance, plan, cost, after_us)| Request {
                    instance,
                    plan,
                    cost,
                    after: Duration::from_micros(after_us),
                },
            );
            let fault = (
                0u64..3_000,
                prop_oneof![
                    (0u64..40).prop_map(|ms| Fault::Latency(Duration::from_millis(ms))),
                    any::<bool>().prop_map(Fault::Failing),
                    any::<bool>().prop_map(Fault::BlackHole),
                    Just(Fault::Wipe),
                    Just(Fault::Save),
                    Just(Fault::Restore),
                ],
            )
                .prop_map(|(ms, f)| (Duration::from_millis(ms), f));
            (
                Just((n, leased, rate, burst)),
                prop::collection::vec(request, 1..400),
                prop::collection::vec(fault, 0..5),
            )
        })
        .prop_map(|((n, leased, rate, burst), requests, faults)| Run {
            n,
            leased,
            rate,
            burst,
            requests,
            faults,
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Over any run — answers that take time and come late, failures, black holes,
    /// wipes and older snapshots, two plans of one limit and costs up to 3 — the
    /// instances grant at most: the exact limiter of the more generous plan over the run
    /// and one burst for switching plans, plus `N·L` (leases), plus one burst for each loss of state and for each outage, plus
    /// the rate over each outage (and the 2 s after it, while the breaker cools down and
    /// late calls are given up) — where an outage is a time the backend fails, is silent,
    /// or answers slower than the timeout. Each instance spends its share of the limit
    /// (1/N), not a copy, while the backend cannot answer.
    #[test]
    fn shared_grants_stay_inside_the_bound_whatever_the_world_does(run in runs()) {
        let rt = runtime();
    let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, run.n as u64);
        let generous = Quota::per_second(run.rate * 2).burst(run.burst);
        let plain = Quota::per_second(run.rate).burst(run.burst);
        let lease = Lease::auto();
        let specs: Vec<LimitSpec> = [generous, plain]
            .iter()
            .map(|&q| {
                let s = LimitSpec::new("api", q);
                if run.leased { s.lease(lease) } else { s }
            })
            .collect();
        let fleet = fleet(&world, run.n, &specs);
        let (granted, d) = play(&rt, &world, &fleet, &run.requests, &run.faults, Duration::ZERO);
        // Time the backend could not answer in time, and the 2 s after each such spell.
        let mut outage = Duration::ZERO;
        let mut spells = 0u64;
        let mut faults = run.faults.clone();
        faults.sort_by_key(|f| f.0);
        let (mut slow, mut failing, mut hole) = (false, false, false);
        let mut since = Duration::ZERO;
        let mut losses = 0u64;
        for &(at, f) in faults.iter().chain(std::iter::once(&(d, Fault::Failing(false)))) {
            let was = slow || failing || hole;
            match f {
                Fault::Latency(l) => slow = l * 2 >= Duration::from_millis(50),
                Fault::Failing(on) => failing = on,
                Fault::BlackHole(on) => hole = on,
                Fault::Wipe | Fault::Restore => losses += 1,
                Fault::Save => {}
            }
            let is = slow || failing || hole;
            if !was && is {
                since = at;
                spells += 1;
            }
            if was && (!is || at >= d) {
                outage += at.saturating_sub(since) + Duration::from_secs(2);
            }
        }
        let cap = if run.leased { (run.burst / 8).max(1) } else { 0 };
        let rate = (run.rate * 2) as u128;
        let over_outage = u64::try_from(outage.as_nanos() * rate / 1_000_000_000).unwrap();
        // Two plans on one bucket: GCRA measures the bucket's depth in time, and the
        // plain plan's depth (burst x 2T) holds twice the generous plan's tokens, so a
        // switch between them can give up to one more burst (without leases too).
        let bound = exact(generous, d)
            + run.burst
            + run.n as u64 * cap
            + (losses + spells) * run.burst
            + over_outage
            // A request's cost may exceed what is left of a share by up to 2 tokens.
            + 2;
        prop_assert!(granted <= bound,
            "{} granted over {:?}, bound {} ({} lost, {} spells, {:?} out)",
            granted, d, bound, losses, spells, outage);
    }
}

/// Item 5, the case that broke: instance A lets its lease go (a plan switch) 5 ms before
/// the window ends, while the network is slow, so the give-back lands 25 ms into the next
/// window, after instance B spent the window's limit there; instance C, asking after it
/// landed, would be granted what came back. A fixed window's units are never given back.
#[test]
fn a_fixed_windows_give_back_never_lands_in_the_next_window() {
    let rt = runtime();
    let clock = rt.block_on(async { TokioClock::new() });
    let world = world(&clock, 3);
    let window = Duration::from_millis(100);
    let specs: Vec<LimitSpec> = [10, 9]
        .iter()
        .map(|&l| {
            LimitSpec::new("api", Quota::new(l, window).unwrap())
                .algorithm(Algorithm::fixed_window())
                .lease(Lease::tokens(5))
        })
        .collect();
    let fleet = fleet(&world, 3, &specs);
    // Align the run on a window: the clock counts from 1,000 s, windows from 0.
    let offset = rt.block_on(async {
        let ns = u64::try_from(window.as_nanos()).unwrap();
        Duration::from_nanos(ns - clock.now() % ns)
    });
    let at = |ms: f64| offset + Duration::from_secs_f64(ms / 1_000.0);
    let mut script = vec![(at(90.0), 0, 0), (at(95.0), 0, 1)];
    script.extend((0..40).map(|i| (at(100.5 + f64::from(i) * 0.5), 1, 0)));
    script.extend((0..40).map(|i| (at(130.0 + f64::from(i) * 0.5), 2, 0)));
    let faults = [
        (at(94.0), Fault::Latency(Duration::from_millis(30))),
        (at(96.0), Fault::Latency(Duration::from_micros(200))),
    ];
    let mut last = Duration::ZERO;
    let requests: Vec<Request> = script
        .iter()
        .map(|&(t, instance, plan)| {
            let r = Request {
                instance,
                plan,
                cost: 1,
                after: t - last,
            };
            last = t;
            r
        })
        .collect();
    let (grants, _) = play_grants(&rt, &world, &fleet, &requests, &faults, Duration::ZERO);
    let window_ns = u64::try_from(window.as_nanos()).unwrap();
    let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
    for (at, _) in grants {
        *per_window.entry(at / window_ns).or_default() += 1;
    }
    eprintln!("grants per window: {per_window:?}");
    for (w, granted) in per_window {
        assert!(granted <= 10, "window {w}: {granted} granted, limit 10");
    }
}

/// A flood of cost-1 requests for 1 s, then `count` requests of `cost` every 500 ms, then
/// one of cost 1, on one instance: answers how many of the costly ones were granted,
/// whether the last one was, and the shared bucket's tokens at the end.
fn costly_after_a_flood(
    quota: Quota,
    lease: Option<Lease>,
    cost: u32,
    count: usize,
) -> (usize, bool, u64) {
    let rt = runtime();
    let clock = rt.block_on(async { TokioClock::new() });
    let world = world(&clock, 1);
    let mut spec = LimitSpec::new("api", quota);
    if let Some(l) = lease {
        spec = spec.lease(l);
    }
    let fleet = fleet(&world, 1, &[spec]);
    // 20 times the limit for 1 s.
    let flood = usize::try_from(quota.burst_size().max(100) * 20).unwrap();
    let mut requests = even(flood, 1, 1, 1);
    let later = |cost| Request {
        instance: 0,
        plan: 0,
        cost,
        after: Duration::from_millis(500),
    };
    requests.extend((0..count).map(|_| later(cost)));
    requests.push(later(1));
    let start = rt.block_on(async { clock.now() });
    let (grants, _) = play_grants(&rt, &world, &fleet, &requests, &[], Duration::ZERO);
    let costly = grants.iter().filter(|&&(_, c)| c == cost).count();
    let last_at = start + 1_000_000_000 + (count as u64 + 1) * 500_000_000;
    let last = grants.iter().any(|&(at, c)| c == 1 && at >= last_at);
    (costly, last, remaining(&rt, &world, "api", "k", quota))
}

/// Issue 41: a request costing more than the lease's cap, on a key whose lease was near
/// exhaustion, was refused here for good: no lease could be taken for it (an instance holds
/// at most `L`), so nothing cleared the exhaustion, and each request kept the key. It goes to
/// the backend now, which decides it exactly, and its answers show the lease the bucket is
/// back: a request of cost 1 after them is granted, not refused while a reservation is on
/// its way. Before: 0 of 20 granted, the bucket full, and the last request refused; without
/// a lease, 20 of 20.
#[test]
fn a_request_costing_more_than_the_lease_cap_is_decided_by_the_backend() {
    let quota = Quota::per_second(100).burst(100); // L = 12
    // 40 tokens/s, well under the limit.
    let (unleased, _, _) = costly_after_a_flood(quota, None, 20, 20);
    let (leased, last, left) = costly_after_a_flood(quota, Some(Lease::auto()), 20, 20);
    eprintln!(
        "cost 20 above L = 12: {leased} of 20 granted (unleased {unleased}), {left} left, then cost 1 granted: {last}"
    );
    assert_eq!(unleased, 20);
    assert_eq!(leased, 20, "{left} of 100 left in the shared bucket");
    assert!(last, "a request of cost 1 refused with {left} of 100 left");
}

/// Issue 41, a small burst: `L` = 1 and requests of cost 2 (4 tokens/s against 10).
#[test]
fn a_small_bursts_lease_of_one_token_never_refuses_a_request_of_two() {
    let quota = Quota::per_second(10).burst(8); // L = 1
    let (unleased, _, _) = costly_after_a_flood(quota, None, 2, 20);
    let (leased, last, left) = costly_after_a_flood(quota, Some(Lease::auto()), 2, 20);
    eprintln!(
        "cost 2 above L = 1: {leased} of 20 granted (unleased {unleased}), {left} left, then cost 1 granted: {last}"
    );
    assert_eq!(unleased, 20);
    assert_eq!(leased, 20, "{left} of 8 left in the shared bucket");
    assert!(last, "a request of cost 1 refused with {left} of 8 left");
}

/// Wake-ups of requests waiting for a lease (issue 41), on a backend of their own whose
/// calls answer when the test says.
mod wakes {
    use std::collections::HashMap;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tollgate::key::Key;
    use tollgate::store::{
        Backend, Checked, Item, MemoryStore, MemoryTable, Op, Resilient, Statuses, Store,
        StoreError,
    };
    use tollgate::testing::TokioClock;
    use tollgate::{Algorithm, Lease, LimitSpec, Limiter, Mode, Quota};

    use super::runtime;

    /// A backend whose calls about a key answer only once the test opens that key's gate
    /// (a call each time), on a memory store.
    #[derive(Clone)]
    struct Gated {
        store: MemoryStore<TokioClock>,
        gates: Arc<Mutex<HashMap<Key, Arc<tokio::sync::Semaphore>>>>,
    }

    impl Gated {
        fn gate(&self, key: &Key) -> Arc<tokio::sync::Semaphore> {
            let mut gates = self.gates.lock().unwrap();
            let gate = gates.entry(key.clone());
            gate.or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(0)))
                .clone()
        }

        /// Lets the next call about `key` answer.
        fn open(&self, key: &str) {
            self.gate(&Key::from_part(key)).add_permits(1);
        }
    }

    impl Backend for Gated {
        type Table = MemoryTable;
        type Future = Pin<Box<dyn Future<Output = Result<Statuses, StoreError>> + Send>>;

        fn table(&self, name: &str) -> MemoryTable {
            self.store.table(name)
        }

        fn apply(&self, op: Op, items: &[Item<'_, MemoryTable>]) -> Self::Future {
            let owned: Vec<(MemoryTable, Key, Quota, u32, Mode, Algorithm, Duration)> = items
                .iter()
                .map(|i| {
                    let table = i.table.clone();
                    (
                        table,
                        i.key.clone(),
                        i.quota,
                        i.cost,
                        i.mode,
                        i.algorithm,
                        i.max_wait,
                    )
                })
                .collect();
            let gate = self.gate(&items[0].key);
            let store = self.store.clone();
            Box::pin(async move {
                gate.acquire().await.unwrap().forget();
                let items: Vec<Item<'_, MemoryTable>> = owned
                    .iter()
                    .map(|(t, k, q, c, m, a, w)| {
                        Item::new(t, k.clone(), *q, *c)
                            .mode(*m)
                            .algorithm(*a)
                            .max_wait(*w)
                    })
                    .collect();
                let Checked::Ready(s) = store.apply(op, &items) else {
                    unreachable!("a memory store answers at once")
                };
                Ok(s)
            })
        }
    }

    /// Issue 41: a settled lease call wakes the requests waiting for a lease of its key, not
    /// every waiting request of the limit. Ten keys' first requests each wait for their key's
    /// lease; nine of the calls answer: the request of the tenth key is not polled once. Before,
    /// each settled call woke every waiter of the table: it was polled 9 more times, deciding
    /// again each time.
    #[test]
    fn a_settled_lease_call_wakes_only_the_requests_waiting_for_its_key() {
        let rt = runtime();
        rt.block_on(async {
            let clock = TokioClock::new();
            let gated = Gated {
                store: MemoryStore::with_clock(clock).unbounded(),
                gates: Arc::default(),
            };
            let store = Resilient::new(gated.clone()).clock(clock);
            let spec =
                LimitSpec::new("api", Quota::per_second(100).burst(100)).lease(Lease::auto());
            let limiter = Limiter::builder(store.clone()).limit(spec).build().unwrap();
            let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
            // Each request counts its polls; the paused clock stands still while this task
            // yields, so only a wake-up polls a waiting request again.
            let requests: Vec<_> = keys
                .iter()
                .map(|k| {
                    let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                    let counted = polls.clone();
                    let mut check = Box::pin(limiter.check("api", k.clone(), 1));
                    let task = tokio::spawn(std::future::poll_fn(move |cx| {
                        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        check.as_mut().poll(cx)
                    }));
                    (polls, task)
                })
                .collect();
            let run = || async {
                for _ in 0..50 {
                    tokio::task::yield_now().await;
                }
            };
            let polls = |i: usize| requests[i].0.load(std::sync::atomic::Ordering::SeqCst);
            run().await;
            assert!((0..10).all(|i| polls(i) == 1 && !requests[i].1.is_finished()));
            for k in &keys[1..] {
                gated.open(k);
                run().await;
            }
            for (i, (_, task)) in requests.iter().enumerate().skip(1) {
                assert!(task.is_finished(), "key {i} still waits");
            }
            let woken = polls(0) - 1;
            eprintln!("a waiting request woken {woken} times by 9 other keys' lease calls");
            assert_eq!(woken, 0, "woken by other keys' lease calls");
            gated.open(&keys[0]);
            run().await;
            assert!(requests[0].1.is_finished());
            assert_eq!(polls(0), 2, "woken once, by its own key's lease call");
            let (_, task) = requests.into_iter().next().unwrap();
            assert!(task.await.unwrap().unwrap().allowed());
        });
    }
}

/// Issue 41, "Outage shares that follow the traffic": the share design's tests, in a
/// module of their own (their helpers are theirs).
mod issue_41_shares {
    use super::*;
    use tollgate::store::{Backend, Item, Op};

    /// The world as a backend that does not count its instances and answers `instances`:
    /// 0 is an instance that never reached it (Redis's probe before its first answer;
    /// before issue 41 it said 1), 1 a backend that cannot count (the trait's default).
    #[derive(Clone)]
    struct Uncounting {
        world: World,
        instances: u64,
    }

    impl Backend for Uncounting {
        type Table = String;
        type Future = <World as Backend>::Future;

        fn table(&self, name: &str) -> String {
            self.world.table(name)
        }

        fn apply(&self, op: Op, items: &[Item<'_, String>]) -> Self::Future {
            self.world.apply(op, items)
        }

        fn instances(&self) -> u64 {
            self.instances
        }
    }

    /// An instance over `Uncounting` (its `store` field is a placeholder: `play` reads the
    /// plans).
    fn uncounting_instance(world: &World, instances: u64, specs: &[LimitSpec]) -> Instance {
        let backend = Uncounting {
            world: world.clone(),
            instances,
        };
        let store = Resilient::new(backend).clock(*world.clock());
        let plans = specs
            .iter()
            .map(|spec| {
                Limiter::builder(store.clone())
                    .limit(spec.clone())
                    .build()
                    .unwrap()
            })
            .collect();
        Instance {
            store: world.store(),
            plans,
        }
    }

    /// An instance that never reached the world.
    fn unreached_instance(world: &World, specs: &[LimitSpec]) -> Instance {
        uncounting_instance(world, 0, specs)
    }

    /// `count` requests spread evenly over `from..from + seconds` on `instances`, in turn.
    fn spell(count: usize, seconds: f64, instances: &[usize]) -> Vec<(Duration, usize)> {
        let gap = seconds / count as f64;
        (0..count)
            .map(|i| {
                (
                    Duration::from_secs_f64(gap * i as f64),
                    instances[i % instances.len()],
                )
            })
            .collect()
    }

    /// Requests at their instants from the start (sorted), cost 1, plan 0.
    fn script(mut at: Vec<(Duration, usize)>) -> Vec<Request> {
        at.sort_by_key(|&(t, _)| t);
        let mut last = Duration::ZERO;
        at.into_iter()
            .map(|(t, instance)| {
                let r = Request {
                    instance,
                    plan: 0,
                    cost: 1,
                    after: t - last,
                };
                last = t;
                r
            })
            .collect()
    }

    /// `spell`, shifted to start at `from`.
    fn spell_at(
        from: f64,
        count: usize,
        seconds: f64,
        instances: &[usize],
    ) -> Vec<(Duration, usize)> {
        spell(count, seconds, instances)
            .into_iter()
            .map(|(t, i)| (t + Duration::from_secs_f64(from), i))
            .collect()
    }

    /// The grants within `from..to` (seconds from the run's start), `start` the world's
    /// clock at the start.
    fn granted_within(grants: &[(u64, u32)], start: u64, from: f64, to: f64) -> u64 {
        grants
            .iter()
            .filter(|&&(at, _)| {
                let s = (at - start) as f64 / 1e9;
                s >= from && s < to
            })
            .map(|&(_, c)| u64::from(c))
            .sum()
    }

    /// Issue 41, item 7: a key that stays on one instance (session affinity) keeps its
    /// traffic through an outage: that instance served all of it, so its share is the
    /// traffic it served, not 1/N. Before: 29 of 80 granted at N = 4.
    ///
    /// Leased too: the lease calls' answers are the instance's traffic on the key, as the
    /// checks' are (with nearly every request decided from the lease, the few checks that
    /// ask the backend would say the instance served almost none of it).
    #[test]
    fn a_key_served_by_one_instance_keeps_its_traffic_through_an_outage() {
        for lease in [None, Some(Lease::auto())] {
            let rt = runtime();
            let clock = rt.block_on(async { TokioClock::new() });
            let world = world(&clock, 4);
            let quota = Quota::per_second(10).burst(20);
            let mut spec = LimitSpec::new("api", quota);
            if let Some(lease) = lease {
                spec = spec.lease(lease);
            }
            let fleet = fleet(&world, 4, &[spec]);
            // 8/s on instance 0 for 20 s; Redis fails from 10 s to 20 s.
            let requests = script(spell(160, 20.0, &[0]));
            let faults = [
                (Duration::from_secs(10), Fault::Failing(true)),
                (Duration::from_secs(20), Fault::Failing(false)),
            ];
            let start = clock.now();
            let (grants, _) = play_grants(&rt, &world, &fleet, &requests, &faults, Duration::ZERO);
            let during = granted_within(&grants, start, 10.0, 20.0);
            eprintln!(
                "{lease:?}: one instance's key at 8/s of 10/s: {during} of 80 granted during the outage"
            );
            assert!(
                during >= 76,
                "{lease:?}: {during} of 80 granted during the outage"
            );
            assert!(during <= 80);
        }
    }

    /// Found across processes (`scripts/lease_stress.sh login-busy`): a general limit of
    /// 1,000/s with a burst of 100, its key spread thinly over 8 instances (16/s in all,
    /// 2/s each), refused the first request of a 3 s outage on every instance: 40 of 48
    /// granted. Each instance's fraction is its own rate (the bucket sat full), 0.2 tokens
    /// of the burst, so its share started spent. A burst of at least 4 tokens per counted
    /// instance now gives each of them one whole token and splits the rest by fraction,
    /// so the shares still add up to the burst.
    #[test]
    fn a_key_spread_thin_under_a_big_burst_keeps_its_first_requests_through_an_outage() {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 8);
        let quota = Quota::per_second(1_000).burst(100);
        let fleet = fleet(&world, 8, &[LimitSpec::new("api", quota)]);
        let all: Vec<usize> = (0..8).collect();
        // 16/s over the 8 in turn for 33 s; Redis fails from 30 s to 33 s.
        let requests = script(spell(16 * 33, 33.0, &all));
        let faults = [
            (Duration::from_secs(30), Fault::Failing(true)),
            (Duration::from_secs(33), Fault::Failing(false)),
        ];
        // The paused clock's now, read in its runtime.
        let start = rt.block_on(async { clock.now() });
        let (grants, _) = play_grants(&rt, &world, &fleet, &requests, &faults, Duration::ZERO);
        let before = granted_within(&grants, start, 0.0, 30.0);
        let during = granted_within(&grants, start, 30.0, 33.0);
        eprintln!("a key at 16/s of 1,000/s over 8 instances: {during} of 48 in the outage");
        assert_eq!(before, 480);
        assert_eq!(during, 48, "{during} of 48 granted during the outage");
    }

    /// A key at 3/s of 10/s (burst 1) on the only instance Redis counts, 9/s during a 10 s
    /// outage, still under the limit: the instance keeps the whole limit (nobody else spent
    /// what it left of the key), where its own rate, 3/s, would have refused two thirds.
    /// A backend that cannot count its instances (its 1 says nothing) keeps the key's
    /// fraction: were it one of several, each taking the whole limit would grant several.
    #[test]
    fn a_lone_counted_instance_keeps_the_whole_limit_for_its_keys() {
        let mut during = Vec::new();
        for counted in [true, false] {
            let rt = runtime();
            let clock = rt.block_on(async { TokioClock::new() });
            let world = world(&clock, 1);
            let quota = Quota::per_second(10).burst(1);
            let spec = LimitSpec::new("api", quota);
            let fleet = if counted {
                fleet(&world, 1, &[spec])
            } else {
                vec![uncounting_instance(&world, 1, &[spec])]
            };
            let mut at = spell(30, 10.0, &[0]);
            at.extend(spell_at(10.0, 90, 10.0, &[0]));
            let faults = [
                (Duration::from_secs(10), Fault::Failing(true)),
                (Duration::from_secs(20), Fault::Failing(false)),
            ];
            let start = clock.now();
            let (grants, _) =
                play_grants(&rt, &world, &fleet, &script(at), &faults, Duration::ZERO);
            // The last request before the outage at 9.67 s, the first of it at 10 s.
            assert_eq!(granted_within(&grants, start, 0.0, 9.9), 30);
            during.push(granted_within(&grants, start, 9.9, 20.0));
        }
        eprintln!(
            "9/s of 10/s on a lone instance in an outage, counted then not: {during:?} of 90"
        );
        assert!(during[0] >= 89, "counted: {} of 90 granted", during[0]);
        assert!(during[1] <= 32, "not counted: {} of 90 granted", during[1]);
    }

    /// Issue 41, item 2: two instances that start during an outage (never reached Redis,
    /// which counts them N = 1) take a share of an unknown key, not a whole quota each.
    /// Before: 12,296 granted against 6,102 for the exact limiter.
    #[test]
    fn instances_that_start_during_an_outage_take_no_whole_quota() {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 4);
        let quota = Quota::per_second(1_000).burst(100);
        let specs = [LimitSpec::new("api", quota)];
        let mut fleet = fleet(&world, 4, &specs);
        fleet.push(unreached_instance(&world, &specs));
        fleet.push(unreached_instance(&world, &specs));
        // 8x the limit: on the 4 for 1 s, on all 6 during the 3 s outage, on the 4 for 2 s.
        let mut at = spell(8_000, 1.0, &[0, 1, 2, 3]);
        at.extend(spell_at(1.0, 24_000, 3.0, &[0, 1, 2, 3, 4, 5]));
        at.extend(spell_at(4.0, 16_000, 2.0, &[0, 1, 2, 3]));
        let faults = [
            (Duration::from_secs(1), Fault::Failing(true)),
            (Duration::from_secs(4), Fault::Failing(false)),
        ];
        let (granted, d) = play(&rt, &world, &fleet, &script(at), &faults, Duration::ZERO);
        let bound = exact(quota, d) + quota.burst_size() + 3 * 1_000;
        eprintln!(
            "2 instances new in an outage: {granted} granted over {d:?}, exact {}, bound {bound}",
            exact(quota, d)
        );
        assert!(granted <= bound, "{granted} granted, bound {bound}");
        assert!(granted * 100 >= exact(quota, d) * 95, "{granted} granted");
    }

    /// Issue 41, item 3: the shares of a small burst never add up to more than the burst: a
    /// login limit of 12/min with a burst of 3 on 10 instances grants at most 3 (and what
    /// refills: nothing in 3 s) during a 3 s outage, and a fixed window of 5 at most 5 per
    /// window. Before: 10 (each instance's share was rounded up to one token), and 10 per
    /// window.
    #[test]
    fn the_shares_of_a_small_burst_add_up_to_the_burst() {
        for algorithm in [Algorithm::Gcra, Algorithm::fixed_window()] {
            let rt = runtime();
            let clock = rt.block_on(async { TokioClock::new() });
            let world = world(&clock, 10);
            let window = algorithm != Algorithm::Gcra;
            let quota = if window {
                Quota::per_second(5)
            } else {
                Quota::per_minute(12).burst(3)
            };
            let spec = LimitSpec::new("api", quota).algorithm(algorithm);
            let fleet = fleet(&world, 10, &[spec]);
            let all: Vec<usize> = (0..10).collect();
            // Under the limit on every instance for 60 s (one request each 6 s, or 3 a
            // second over a window of 5), then a flood on all 10 during a 3 s outage.
            let calm = if window { 180 } else { 10 };
            let mut at = spell(calm, 60.0, &all);
            at.extend(spell_at(61.0, 300, 3.0, &all));
            let faults = [
                (Duration::from_secs(61), Fault::Failing(true)),
                (Duration::from_secs(64), Fault::Failing(false)),
            ];
            let start = clock.now();
            let (grants, _) =
                play_grants(&rt, &world, &fleet, &script(at), &faults, Duration::ZERO);
            let calm_granted = granted_within(&grants, start, 0.0, 61.0);
            assert!(
                calm_granted * 100 >= calm as u64 * 95,
                "{calm_granted} of {calm} granted under the limit"
            );
            if window {
                let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
                for &(at, c) in &grants {
                    if at - start >= 61_000_000_000 {
                        *per_window.entry(at / 1_000_000_000).or_default() += u64::from(c);
                    }
                }
                eprintln!("a window of 5 on 10 instances, outage: {per_window:?}");
                for (w, n) in per_window {
                    assert!(n <= 5, "window {w}: {n} granted, limit 5");
                }
            } else {
                let during = granted_within(&grants, start, 61.0, 64.0);
                eprintln!("12/min burst 3 on 10 instances, 3 s outage: {during} granted");
                // The burst and what refills in 3 s (12/min: none), rounded down.
                assert!(during <= 3, "{during} granted, bound 3");
            }
        }
    }

    /// Issue 41, item 6: a fixed window seen spent stays spent through an outage (its share
    /// is blocked until the window ends, as a GCRA key's share starts as spent as the shared
    /// bucket). Before: an hourly window of 100, spent, then three 2 s outages: 200 granted.
    #[test]
    fn a_spent_window_stays_spent_through_outages() {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 4);
        let quota = Quota::per_hour(100);
        let spec = LimitSpec::new("api", quota).algorithm(Algorithm::fixed_window());
        let fleet = fleet(&world, 4, &[spec]);
        let requests = script(spell(240, 30.0, &[0, 1, 2, 3]));
        let mut faults = Vec::new();
        for s in [15, 20, 25] {
            faults.push((Duration::from_secs(s), Fault::Failing(true)));
            faults.push((Duration::from_secs(s + 2), Fault::Failing(false)));
        }
        // The run starts at 1,000 s: the hour's window runs until 3,600 s.
        let (granted, _) = play(&rt, &world, &fleet, &requests, &faults, Duration::ZERO);
        eprintln!("an hourly window of 100, spent, three outages: {granted} granted");
        assert!(
            granted <= 100 + 25,
            "{granted} granted, bound 100 and one share"
        );
        assert!(granted >= 100, "{granted} granted: the window's 100 first");
    }

    /// Issue 41, item 4: a key seen spent is charged once at recovery: its share started as
    /// spent as the shared bucket, so only what was granted on it is charged back, not what
    /// the share lacked of a full burst (which Redis had already counted). Before: a flood, a
    /// 2 s outage, then a client at half the limit: 150 of its 500 requests granted.
    #[test]
    fn a_key_seen_spent_is_charged_once_at_recovery() {
        flood_outage_then_half(
            "a flood, a 2 s outage, then half the limit",
            |world, quota| fleet(world, 4, &[LimitSpec::new("api", quota)]),
        );
    }

    /// 4 instances (`fleet`, over the world, of 100/s burst 1,000): a flood (8x) for 4 s,
    /// Redis failing from 2 s to 4 s; then a client at half the limit (50/s) for 10 s. Its
    /// 500 requests are granted (at least 475), and the run stays inside the exact
    /// limiter's grants, a burst and 2 s at the rate.
    fn flood_outage_then_half(what: &str, fleet: impl FnOnce(&World, Quota) -> Vec<Instance>) {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 4);
        let quota = Quota::per_second(100).burst(1_000);
        let fleet = fleet(&world, quota);
        let all = [0, 1, 2, 3];
        let mut at = spell(3_200, 4.0, &all);
        at.extend(spell_at(4.0, 500, 10.0, &all));
        let faults = [
            (Duration::from_secs(2), Fault::Failing(true)),
            (Duration::from_secs(4), Fault::Failing(false)),
        ];
        let start = clock.now();
        let (grants, d) = play_grants(&rt, &world, &fleet, &script(at), &faults, Duration::ZERO);
        let after = granted_within(&grants, start, 4.0, 15.0);
        let total: u64 = grants.iter().map(|&(_, c)| u64::from(c)).sum();
        let bound = exact(quota, d) + quota.burst_size() + 2 * 100;
        eprintln!("{what}: {after} of 500 granted after; {total} in all, bound {bound}");
        assert!(after >= 475, "{after} of 500 granted after the outage");
        assert!(total <= bound, "{total} granted, bound {bound}");
    }

    /// Issue 41, item 4: a charge-back that Redis refuses while it recovers (it answered one
    /// call, then failed again) is not lost: its debt goes back on the list and is charged at
    /// the next answer. A flood through a 2 s outage and a flap as Redis comes back: the run
    /// grants what the exact limiter would, and the outage's share grants are charged.
    #[test]
    fn a_charge_back_refused_while_redis_recovers_is_charged_again() {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 4);
        let quota = Quota::per_second(100).burst(1_000);
        let fleet = fleet(&world, 4, &[LimitSpec::new("api", quota)]);
        let requests = script(spell(6_400, 8.0, &[0, 1, 2, 3]));
        let ms = Duration::from_millis;
        // Redis flaps as it comes back (6 ms up, 6 ms down, for 0.4 s): charge-backs sent
        // after an answer (5 ms each way) may reach it down.
        let mut faults = vec![
            (ms(1_000), Fault::Latency(ms(5))),
            (ms(2_000), Fault::Failing(true)),
        ];
        faults.extend((0..=66).map(|i| (ms(4_000 + 6 * i), Fault::Failing(i % 2 == 1))));
        let (granted, d) = play(&rt, &world, &fleet, &requests, &faults, Duration::ZERO);
        // Without the retry, the charges that met Redis down were lost: 1,803 granted.
        let bound = exact(quota, d) + 2;
        eprintln!(
            "a flap as Redis recovers: {granted} granted over {d:?}, exact {}",
            exact(quota, d)
        );
        assert!(granted <= bound, "{granted} granted, bound {bound}");
    }

    /// The world as a Redis that recovers slow on writes: each charge-back (`Penalize`)
    /// is answered 300 ms late, applied when it arrives.
    #[derive(Clone)]
    struct SlowCharges(World);

    impl Backend for SlowCharges {
        type Table = String;
        type Future = <World as Backend>::Future;

        fn table(&self, name: &str) -> String {
            self.0.table(name)
        }

        fn apply(&self, op: Op, items: &[Item<'_, String>]) -> Self::Future {
            let call = self.0.apply(op, items);
            let slow = op == Op::Penalize;
            Box::pin(async move {
                if slow {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                call.await
            })
        }

        fn instances(&self) -> u64 {
            self.0.instances()
        }
    }

    /// Issue 41, item 4: a charge-back that times out (a Redis slow on its writes as it
    /// recovers) is not dropped: it is followed to its answer, and charged again if it
    /// failed. A flood through a 2 s outage on 4 instances grants what the exact limiter
    /// would. Before, the charges that timed out were given up (counted as dropped).
    #[test]
    fn a_charge_back_that_times_out_is_followed_to_its_answer() {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 4);
        let slow = SlowCharges(world.clone());
        let quota = Quota::per_second(100).burst(1_000);
        let fleet: Vec<Instance> = (0..4)
            .map(|_| Instance {
                store: world.store(),
                plans: vec![
                    Limiter::builder(Resilient::new(slow.clone()).clock(*world.clock()))
                        .limit(LimitSpec::new("api", quota))
                        .build()
                        .unwrap(),
                ],
            })
            .collect();
        let requests = script(spell(6_400, 8.0, &[0, 1, 2, 3]));
        let ms = Duration::from_millis;
        let faults = [
            (ms(2_000), Fault::Failing(true)),
            (ms(4_000), Fault::Failing(false)),
        ];
        let (granted, d) = play(&rt, &world, &fleet, &requests, &faults, ms(500));
        let bound = exact(quota, d) + 2;
        eprintln!(
            "charge-backs answered 300 ms late: {granted} granted over {d:?}, exact {}",
            exact(quota, d)
        );
        assert!(granted <= bound, "{granted} granted, bound {bound}");
    }

    /// Where a [`LostCharges`] world loses a charge-back.
    #[derive(Clone, Copy)]
    enum Lost {
        /// On the way there: it never reaches the server (a connection that died).
        There,
        /// On the way back: the server applies it, its answer never comes.
        Back,
    }

    /// The world as a Redis that loses the first `lost` charge-backs (`Penalize` or
    /// `PenalizeOnce`) sent to it, `where_` says how; every other call as the world does.
    #[derive(Clone)]
    struct LostCharges {
        world: World,
        lost: Arc<std::sync::atomic::AtomicUsize>,
        where_: Lost,
    }

    impl Backend for LostCharges {
        type Table = String;
        type Future = <World as Backend>::Future;

        fn table(&self, name: &str) -> String {
            self.world.table(name)
        }

        fn apply(&self, op: Op, items: &[Item<'_, String>]) -> Self::Future {
            use std::sync::atomic::Ordering;
            let charge = matches!(op, Op::Penalize | Op::PenalizeOnce { .. });
            let lose = charge
                && self
                    .lost
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
            if !lose {
                return self.world.apply(op, items);
            }
            match self.where_ {
                Lost::There => Box::pin(std::future::pending()),
                Lost::Back => {
                    let call = self.world.apply(op, items);
                    Box::pin(async move {
                        let _ = call.await;
                        std::future::pending().await
                    })
                }
            }
        }

        fn instances(&self) -> u64 {
            self.world.instances()
        }

        fn counts_instances(&self) -> bool {
            true
        }

        fn penalizes_once(&self) -> bool {
            self.world.penalizes_once()
        }
    }

    /// 4 instances over a `LostCharges` world losing the first `lost` charges.
    fn losing_fleet(world: &World, lost: usize, where_: Lost, quota: Quota) -> Vec<Instance> {
        let backend = LostCharges {
            world: world.clone(),
            lost: Arc::new(std::sync::atomic::AtomicUsize::new(lost)),
            where_,
        };
        (0..4)
            .map(|_| Instance {
                store: world.store(),
                plans: vec![
                    Limiter::builder(Resilient::new(backend.clone()).clock(*world.clock()))
                        .limit(LimitSpec::new("api", quota))
                        .build()
                        .unwrap(),
                ],
            })
            .collect()
    }

    /// Issue 41, item 4: a charge-back that never reaches Redis (a connection that died
    /// under it as Redis came back) is sent again, with its id, until it is answered. A
    /// flood through a 2 s outage on 4 instances whose 4 charges are all lost on the way:
    /// the run grants what the exact limiter would. Before, the lost charges were given up
    /// after 10 s (counted as dropped) and the outage's grants never charged: 2,003
    /// granted where the exact limiter grants 1,799.
    #[test]
    fn a_charge_back_lost_on_the_way_is_sent_again_until_answered() {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 4);
        let quota = Quota::per_second(100).burst(1_000);
        let fleet = losing_fleet(&world, 4, Lost::There, quota);
        let requests = script(spell(6_400, 8.0, &[0, 1, 2, 3]));
        let faults = [
            (Duration::from_secs(2), Fault::Failing(true)),
            (Duration::from_secs(4), Fault::Failing(false)),
        ];
        let (granted, d) = play(&rt, &world, &fleet, &requests, &faults, Duration::ZERO);
        let bound = exact(quota, d) + 2;
        eprintln!(
            "charge-backs lost on the way: {granted} granted over {d:?}, exact {}",
            exact(quota, d)
        );
        assert!(granted <= bound, "{granted} granted, bound {bound}");
    }

    /// Issue 41, item 4, the other side: a charge-back whose answer is lost was applied;
    /// sent again with its id, it is not applied twice. A flood through a 2 s outage, then
    /// a client at half the limit, every instance's first charge answered never: the
    /// client keeps its traffic (as in `a_key_seen_spent_is_charged_once_at_recovery`).
    /// Sent again without an id the backend knows (a plain `Penalize`), the charges are
    /// applied twice and the bucket owes the outage's grants again: 403 of 500.
    #[test]
    fn a_charge_back_sent_again_after_its_answer_was_lost_is_charged_once() {
        flood_outage_then_half("answers of charge-backs lost", |world, quota| {
            losing_fleet(world, 4, Lost::Back, quota)
        });
    }

    /// A run of the share property: instances that served a key before an outage, some that
    /// leave during it, some it is new to that join (counted by Redis, or never having
    /// reached it), the limit and the load.
    #[derive(Debug, Clone)]
    struct ShareRun {
        old: usize,
        leaving: usize,
        joining: usize,
        unreached: usize,
        rate: u64,
        burst: u64,
        /// Load in tenths of the limit's rate.
        load: u64,
        outage_ms: u64,
    }

    fn share_runs() -> impl Strategy<Value = ShareRun> {
        (
            1usize..=8,
            0usize..=2,
            0usize..=2,
            10u64..=200,
            1u64..=60,
            3u64..=80,
            500u64..=4_000,
        )
            .prop_flat_map(|(old, joining, unreached, rate, burst, load, outage_ms)| {
                (0..old).prop_map(move |leaving| ShareRun {
                    old,
                    leaving,
                    joining,
                    unreached,
                    rate,
                    burst,
                    load,
                    outage_ms,
                })
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 48,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Issue 41: whatever the instances (1 to 12, leaving and joining during the outage,
        /// joiners counted by Redis or never having reached it), the limit and the load, the
        /// run grants at most the exact limiter plus one burst and the rate over the outage,
        /// times `F = F_s + U/N + K/4` where that adds up to more than one (`F_s` the
        /// fractions of the instances that served the key and stay, `U` counted joiners, `K`
        /// unreached ones); and a key whose traffic stays on the instances that served it,
        /// under the limit, keeps 95 % of it, less at most the first request of the outage
        /// on each instance (a share under one token starts spent) where the burst is under
        /// 4 tokens per counted instance.
        #[test]
        fn outage_shares_stay_inside_one_limit_whoever_joins_or_leaves(run in share_runs()) {
            share_run(run)?;
        }
    }

    /// One run of `outage_shares_stay_inside_one_limit_whoever_joins_or_leaves`.
    fn share_run(run: ShareRun) -> Result<(), TestCaseError> {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let counted = run.old + run.joining;
        let world = world(&clock, counted as u64);
        let quota = Quota::per_second(run.rate).burst(run.burst);
        let specs = [LimitSpec::new("api", quota)];
        let mut fleet = fleet(&world, counted, &specs);
        for _ in 0..run.unreached {
            fleet.push(unreached_instance(&world, &specs));
        }
        let old: Vec<usize> = (0..run.old).collect();
        let staying: Vec<usize> = (run.leaving..run.old).collect();
        let during: Vec<usize> = staying
            .iter()
            .copied()
            .chain(run.old..run.old + run.joining + run.unreached)
            .collect();
        let o = run.outage_ms as f64 / 1_000.0;
        let per_s = (run.rate * run.load) as f64 / 10.0;
        let count = |s: f64| ((per_s * s) as usize).max(1);
        let mut at = spell(count(3.0), 3.0, &old);
        at.extend(spell_at(3.0, count(o), o, &during));
        // Briefly after: the bound holds as the outage ends, before the charge-back could
        // make up for it.
        at.extend(spell_at(3.0 + o, count(0.3), 0.3, &old));
        let sent = at.len() as u64;
        let ms = Duration::from_millis;
        let faults = [
            (ms(3_000), Fault::Failing(true)),
            (ms(3_000 + run.outage_ms), Fault::Failing(false)),
        ];
        let (granted, d) = play(&rt, &world, &fleet, &script(at), &faults, Duration::ZERO);
        // One limit over the outage times `F`, the shares' sum: the instances that served
        // the key and stay keep their fractions of it (the traffic went round them in
        // turn: 1/old each), the instances it is new to take 1/N each (N counted by
        // Redis), 1/4 each if they never reached it; one limit when that adds up to less.
        let staying = (run.old - run.leaving) as f64 / run.old as f64;
        let new =
            (staying + run.joining as f64 / counted as f64 + run.unreached as f64 / 4.0).max(1.0);
        let over_outage = run.burst as f64 + run.rate as f64 * run.outage_ms as f64 / 1_000.0;
        let bound = exact(quota, d) + (new * over_outage) as u64;
        prop_assert!(
            granted <= bound,
            "{} granted over {:?}, bound {} ({:?})",
            granted,
            d,
            bound,
            run
        );
        let stays = run.leaving == 0 && run.joining == 0 && run.unreached == 0;
        if stays && run.load <= 9 {
            // Less, on each instance, the first request of the outage that a share under
            // one token refuses (it starts spent by what it lacks): 1 of 11 requests when
            // 3 instances serve 3/s of 10/s with a burst of 1. A burst of 4 tokens per
            // counted instance or more gives each share a whole token: nothing less.
            let first = if run.burst >= 4 * counted as u64 {
                0
            } else {
                during.len() as u64
            };
            prop_assert!(
                (granted + first) * 100 >= sent * 95,
                "{} of {} granted under the limit ({:?})",
                granted,
                sent,
                run
            );
        }
        Ok(())
    }

    /// A case the property test found on 2026-11-28 (a fresh clone's CI run): 2 instances
    /// (one leaving), 2 joining and 1 never having reached Redis, 80/s with a burst of 58,
    /// a 720 ms outage: 501 granted. The bound the test (and the guide) stated was wrong:
    /// `exact + max(1, U/N + K/4)` limits over the outage, 494, left out the half of the
    /// key the staying instance keeps beside the joiners' quarters (`F` = 1/2 + 2/4 + 1/4
    /// = 1.25: 523).
    #[test]
    fn joiners_and_an_unreached_instance_over_a_short_outage_stay_inside_the_bound() {
        share_run(ShareRun {
            old: 2,
            leaving: 1,
            joining: 2,
            unreached: 1,
            rate: 80,
            burst: 58,
            load: 77,
            outage_ms: 720,
        })
        .unwrap();
    }

    /// A case the property test found on 2026-11-28 (a fresh clone's CI run): one instance
    /// serving a key at 0.3x of 49/s with a burst of 1 through a 2.3 s outage: 65 of 82
    /// granted.
    #[test]
    fn one_instance_at_a_third_of_a_burst_of_one_keeps_its_traffic_through_an_outage() {
        share_run(ShareRun {
            old: 1,
            leaving: 0,
            joining: 0,
            unreached: 0,
            rate: 49,
            burst: 1,
            load: 3,
            outage_ms: 2313,
        })
        .unwrap();
    }

    /// The bug the property found on 2026-11-28, over a grid of 480 deployments where each
    /// instance keeps its traffic (1 to 8 instances taking a key in turn, 10/s to 200/s,
    /// bursts of 1 to 20, 30 to 90 % of the limit, outages of 0.7 s and 2.3 s): a share was
    /// its traffic's rate, in whole tokens rounded down, so steady traffic whose rate came
    /// out a hair over the share's lost up to half its requests during the outage (151 of
    /// the 480 lost more than 5 %). Each share now has room for one early request, and a
    /// lone instance keeps the whole limit.
    #[test]
    fn small_shares_keep_steady_traffic_under_the_limit() {
        let mut losing = Vec::new();
        let mut runs = 0;
        for old in [1usize, 2, 3, 5, 8] {
            for rate in [10u64, 49, 137, 200] {
                for burst in [1u64, 2, 5, 20] {
                    for load in [3u64, 5, 9] {
                        for outage_ms in [700u64, 2_313] {
                            runs += 1;
                            let run = ShareRun {
                                old,
                                leaving: 0,
                                joining: 0,
                                unreached: 0,
                                rate,
                                burst,
                                load,
                                outage_ms,
                            };
                            if let Err(e) = share_run(run) {
                                losing.push(format!("{e}"));
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(runs, 480);
        assert!(
            losing.is_empty(),
            "{} of 480 runs failed: {losing:#?}",
            losing.len()
        );
    }

    /// The world with one reply in five 300 ms late (applied on the server at once).
    #[derive(Clone)]
    struct Slow {
        world: World,
        calls: Arc<std::sync::atomic::AtomicU64>,
    }

    impl Backend for Slow {
        type Table = String;
        type Future = <World as Backend>::Future;

        fn table(&self, name: &str) -> String {
            self.world.table(name)
        }

        fn apply(&self, op: Op, items: &[Item<'_, String>]) -> Self::Future {
            let call = self.world.apply(op, items);
            let n = self
                .calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Box::pin(async move {
                let answer = call.await;
                if n % 5 == 4 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                answer
            })
        }

        fn instances(&self) -> u64 {
            self.world.instances()
        }
    }

    /// Issue 41, item 5: one reply in five arrives 300 ms late. The late answer to a check
    /// that timed out is observed (the timeout grows to the round trips) and a local share
    /// grant the backend refused is charged back. Before, grants over the exact limiter:
    /// 0.88 at 1.2x the limit, 1.09 at 1.5x, 1.19 at 2x, 1.39 at 3x.
    #[test]
    fn late_replies_are_observed_and_charged_back() {
        let mut ratios = Vec::new();
        for (n, rate, burst, load) in [
            (2usize, 100u64, 20u64, 12u64),
            (2, 100, 20, 15),
            (2, 100, 20, 20),
            (2, 100, 20, 30),
            (4, 1_000, 100, 12),
            (4, 1_000, 100, 15),
            (4, 1_000, 100, 20),
            (4, 1_000, 100, 30),
        ] {
            let rt = runtime();
            let clock = rt.block_on(async { TokioClock::new() });
            let world = world(&clock, n as u64);
            let slow = Slow {
                world: world.clone(),
                calls: Arc::default(),
            };
            let quota = Quota::per_second(rate).burst(burst);
            let fleet: Vec<Instance> = (0..n)
                .map(|_| {
                    let store = Resilient::new(slow.clone()).clock(*world.clock());
                    let plans = vec![
                        Limiter::builder(store)
                            .limit(LimitSpec::new("api", quota))
                            .build()
                            .unwrap(),
                    ];
                    Instance {
                        store: world.store(),
                        plans,
                    }
                })
                .collect();
            let count = (rate * load / 10 * 5) as usize;
            let all: Vec<usize> = (0..n).collect();
            let requests = script(spell(count, 5.0, &all));
            let (granted, d) = play(&rt, &world, &fleet, &requests, &[], Duration::ZERO);
            // The run lasts until the last late answer; the traffic, 5 s.
            let bound = exact(quota, d);
            let ratio = granted as f64 / bound as f64;
            let served = granted as f64 / exact(quota, Duration::from_secs(5)) as f64;
            eprintln!(
                "one reply in five 300 ms late, {n} instances, {rate}/s, {load}/10 of the limit: {granted} granted, exact {bound}, {ratio:.2}"
            );
            ratios.push((n, load, ratio, served));
        }
        for (n, load, ratio, served) in ratios {
            let at = format!("{n} instances, {load}/10 of the limit");
            assert!(ratio <= 1.01, "{at}: {ratio:.2} of the exact limiter");
            assert!(
                served >= 0.95,
                "{at}: {served:.2} of the exact limiter over the traffic"
            );
        }
    }

    /// Issue 41, item 5 with leases: one reply in five 300 ms late, `Lease::auto()`. A lease
    /// call that times out is still followed, and its tokens are spent when it comes; a
    /// lease call slower than the usual round trip does not hold the key's requests
    /// (refused near exhaustion, or waiting): they ask the backend. The leased run keeps
    /// what the exact limiter grants over the traffic. Before: 0.79-0.85.
    #[test]
    fn leased_limits_keep_their_grants_when_replies_are_late() {
        let mut ratios = Vec::new();
        for (n, rate, burst, load) in [
            (2usize, 100u64, 20u64, 12u64),
            (2, 100, 20, 15),
            (2, 100, 20, 20),
            (2, 100, 20, 30),
            (4, 1_000, 100, 12),
            (4, 1_000, 100, 15),
            (4, 1_000, 100, 20),
            (4, 1_000, 100, 30),
        ] {
            let rt = runtime();
            let clock = rt.block_on(async { TokioClock::new() });
            let world = world(&clock, n as u64);
            let slow = Slow {
                world: world.clone(),
                calls: Arc::default(),
            };
            let quota = Quota::per_second(rate).burst(burst);
            let stores: Vec<_> = (0..n)
                .map(|_| Resilient::new(slow.clone()).clock(*world.clock()))
                .collect();
            let fleet: Vec<Instance> = (0..n)
                .map(|i| {
                    let store = stores[i].clone();
                    let plans = vec![
                        Limiter::builder(store)
                            .limit(LimitSpec::new("api", quota).lease(Lease::auto()))
                            .build()
                            .unwrap(),
                    ];
                    Instance {
                        store: world.store(),
                        plans,
                    }
                })
                .collect();
            let count = (rate * load / 10 * 5) as usize;
            let all: Vec<usize> = (0..n).collect();
            let requests = script(spell(count, 5.0, &all));
            let (granted, d) = play(&rt, &world, &fleet, &requests, &[], Duration::ZERO);
            // The leases did the work: most grants were decided from tokens held.
            let local: u64 = stores.iter().map(|s| s.lease_stats().local_allowed).sum();
            assert!(
                local * 4 >= granted,
                "{local} of {granted} granted from leases"
            );
            let bound = exact(quota, d);
            let ratio = granted as f64 / bound as f64;
            let served = granted as f64 / exact(quota, Duration::from_secs(5)) as f64;
            eprintln!(
                "leased, one reply in five 300 ms late, {n} instances, {rate}/s, {load}/10 of the limit: {granted} granted, exact {bound} over the run, {served:.2} of exact over the traffic"
            );
            ratios.push((n, load, ratio, served));
        }
        for (n, load, ratio, served) in ratios {
            let at = format!("{n} instances, {load}/10 of the limit");
            assert!(ratio <= 1.01, "{at}: {ratio:.2} of the exact limiter");
            assert!(
                served >= 0.95,
                "{at}: {served:.2} of the exact limiter over the traffic"
            );
        }
    }

    /// The world as one instance's Redis connection through a slow proxy sees it: one
    /// reply in `every` is held `hold` (applied on the server at once), and as on one TCP
    /// connection the replies come in order, so the replies behind a held one wait for it.
    #[derive(Clone)]
    struct InOrder {
        world: World,
        every: u64,
        hold: Duration,
        calls: Arc<std::sync::atomic::AtomicU64>,
        last: Arc<Mutex<Option<tokio::time::Instant>>>,
    }

    impl InOrder {
        fn new(world: &World, every: u64, hold: Duration) -> Self {
            InOrder {
                world: world.clone(),
                every,
                hold,
                calls: Arc::default(),
                last: Arc::default(),
            }
        }
    }

    impl Backend for InOrder {
        type Table = String;
        type Future = <World as Backend>::Future;

        fn table(&self, name: &str) -> String {
            self.world.table(name)
        }

        fn apply(&self, op: Op, items: &[Item<'_, String>]) -> Self::Future {
            let call = self.world.apply(op, items);
            let n = self
                .calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut due = tokio::time::Instant::now();
            if n % self.every == self.every - 1 {
                due += self.hold;
            }
            let due = {
                let mut last = self.last.lock().unwrap();
                let due = last.map_or(due, |l| l.max(due));
                *last = Some(due);
                due
            };
            Box::pin(async move {
                let answer = call.await;
                tokio::time::sleep_until(due).await;
                answer
            })
        }

        fn instances(&self) -> u64 {
            self.world.instances()
        }
    }

    /// Issue 41, item 5 as replies come on a connection (`lease_stress.sh slow`): one reply
    /// in five held 300 ms, in order (those behind it wait too, so every call takes up to
    /// 300 ms), leased or not, 1.2x to 3x the limit. Before, leased: 0.69, 0.91, 0.85 of
    /// the exact limiter over the traffic: requests held for a lease 300 ms away reached
    /// the bucket in bursts, after it had filled and lost tokens.
    #[test]
    fn replies_late_in_order_keep_the_grants_inside_the_bound() {
        let mut ratios = Vec::new();
        for lease in [None, Some(Lease::auto())] {
            for (n, rate, burst, load) in [
                (4usize, 1_000u64, 100u64, 12u64),
                (4, 1_000, 100, 20),
                (4, 1_000, 100, 30),
            ] {
                let rt = runtime();
                let clock = rt.block_on(async { TokioClock::new() });
                let world = world(&clock, n as u64);
                let quota = Quota::per_second(rate).burst(burst);
                let mut spec = LimitSpec::new("api", quota);
                if let Some(lease) = lease {
                    spec = spec.lease(lease);
                }
                let stores: Vec<_> = (0..n)
                    .map(|_| {
                        let slow = InOrder::new(&world, 5, Duration::from_millis(300));
                        Resilient::new(slow).clock(*world.clock())
                    })
                    .collect();
                let fleet: Vec<Instance> = stores
                    .iter()
                    .map(|store| {
                        let store = store.clone();
                        Instance {
                            store: world.store(),
                            plans: vec![
                                Limiter::builder(store).limit(spec.clone()).build().unwrap(),
                            ],
                        }
                    })
                    .collect();
                let count = (rate * load / 10 * 5) as usize;
                let all: Vec<usize> = (0..n).collect();
                let requests = script(spell(count, 5.0, &all));
                let (granted, d) = play(&rt, &world, &fleet, &requests, &[], Duration::ZERO);
                let bound = exact(quota, d);
                let served = granted as f64 / exact(quota, Duration::from_secs(5)) as f64;
                eprintln!(
                    "in order, one reply in five 300 ms late, {lease:?}, {n} instances, {load}/10 of the limit: {granted} granted, exact {bound} over the run, {served:.2} of exact over the traffic"
                );
                // Leased: the lease term, N·L (L = burst / 8), beside the exact limiter's.
                let lease_term = if lease.is_some() {
                    n as u64 * burst / 8
                } else {
                    0
                };
                let ratio = granted as f64 / (bound + lease_term) as f64;
                ratios.push((lease.is_some(), load, ratio, served));
            }
        }
        for (leased, load, ratio, served) in ratios {
            let at = format!("leased {leased}, {load}/10 of the limit");
            assert!(ratio <= 1.01, "{at}: {ratio:.2} of the bound");
            assert!(
                served >= 0.95,
                "{at}: {served:.2} of the exact limiter over the traffic"
            );
        }
    }

    /// The world as one instance's new Redis connection sees it: its first call opens the
    /// connection and loads the script (three round trips, 180 ms at 30 ms each way), and
    /// the calls sent meanwhile queue behind it; and Redis's own probe has not measured a
    /// round trip yet (it runs once a second, from the first call), so the first calls'
    /// timeout is the floor.
    #[derive(Clone)]
    struct Unprobed(World, Arc<Mutex<Option<tokio::time::Instant>>>);

    impl Backend for Unprobed {
        type Table = String;
        type Future = <World as Backend>::Future;

        fn table(&self, name: &str) -> String {
            self.0.table(name)
        }

        fn apply(&self, op: Op, items: &[Item<'_, String>]) -> Self::Future {
            let call = self.0.apply(op, items);
            let connected =
                *self.1.lock().unwrap().get_or_insert_with(|| {
                    tokio::time::Instant::now() + Duration::from_millis(180)
                });
            Box::pin(async move {
                tokio::time::sleep_until(connected).await;
                call.await
            })
        }

        fn instances(&self) -> u64 {
            self.0.instances()
        }
    }

    /// Issue 41, item 8: a Redis 30 ms away each way from the first request (a store that
    /// has learned no round trip yet, against a 50 ms timeout floor), 8 instances started
    /// 5 s before their load, paced at half the limit: nothing is refused, leased or not,
    /// and no breaker opens. Before, the first calls' timeouts counted against the breaker
    /// (the backend's silence was counted from the store's creation), which opened, and
    /// the share refused: 46 of 5,000 refused on 8 processes, all in the first second.
    #[test]
    fn a_far_redis_refuses_nothing_under_the_limit_from_the_start() {
        for lease in [Some(Lease::auto()), None] {
            let rt = runtime();
            let clock = rt.block_on(async { TokioClock::new() });
            let world = world(&clock, 8);
            world.set_latency(Duration::from_millis(30));
            let quota = Quota::per_second(1_000).burst(100);
            let mut spec = LimitSpec::new("api", quota);
            if let Some(lease) = lease {
                spec = spec.lease(lease);
            }
            let stores: Vec<_> = (0..8)
                .map(|_| {
                    let unprobed = Unprobed(world.clone(), Arc::default());
                    Resilient::new(unprobed).clock(*world.clock())
                })
                .collect();
            let fleet: Vec<Instance> = stores
                .iter()
                .map(|store| Instance {
                    store: world.store(),
                    plans: vec![
                        Limiter::builder(store.clone())
                            .limit(spec.clone())
                            .build()
                            .unwrap(),
                    ],
                })
                .collect();
            // Whether a store's breaker opened during the run, looked at every 5 ms.
            let opened = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let watch = {
                let (stores, opened) = (stores.clone(), opened.clone());
                rt.spawn(async move {
                    loop {
                        if stores.iter().any(|s| s.is_unavailable()) {
                            opened.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            };
            // The servers start a while before their load comes.
            rt.block_on(async { tokio::time::sleep(Duration::from_secs(5)).await });
            let requests = even(2_500, 5, 8, 1);
            let (granted, _) = play(&rt, &world, &fleet, &requests, &[], Duration::ZERO);
            assert_eq!(
                granted,
                2_500,
                "{lease:?}: {} of 2,500 refused at half the limit",
                2_500 - granted
            );
            watch.abort();
            assert!(
                !opened.load(std::sync::atomic::Ordering::Relaxed),
                "{lease:?}: a breaker opened on a Redis that answers every call"
            );
        }
    }

    /// Issue 41, item 4 (the write-back): a write-back after a reset that meets Redis
    /// failing again is sent again until applied (a block is idempotent). Before, it was
    /// sent once: Redis came back from the wipe with the spent key full.
    #[test]
    fn a_write_back_that_meets_redis_failing_is_sent_again() {
        let rt = runtime();
        let clock = rt.block_on(async { TokioClock::new() });
        let world = world(&clock, 1);
        let quota = Quota::per_hour(5);
        let fleet = fleet(&world, 1, &[LimitSpec::new("api", quota)]);
        // Spent in the first second; Redis is wiped at 2 s (noticed at 2.5 s) and fails
        // from 2.4 s to 3 s; a request at 2.6 s starts the write-back, one at 4 s asks.
        let mut at = spell(10, 1.0, &[0]);
        at.push((Duration::from_millis(2_600), 0));
        at.push((Duration::from_secs(4), 0));
        let ms = Duration::from_millis;
        let faults = [
            (ms(2_000), Fault::Wipe),
            (ms(2_400), Fault::Failing(true)),
            (ms(3_000), Fault::Failing(false)),
        ];
        let (granted, _) = play(
            &rt,
            &world,
            &fleet,
            &script(at),
            &faults,
            Duration::from_secs(1),
        );
        let left = remaining(&rt, &world, "api", "k", quota);
        eprintln!("a write-back meeting Redis failing: {granted} granted, {left} left");
        assert_eq!(granted, 5, "the hour's 5, then refusals");
        assert_eq!(left, 0, "spent, as before the wipe");
    }
}
