//! Lease mode (`Lease`) on a `Resilient` store: several instances (stores) over one shared
//! backend, a fake clock, and tokio's paused time, so every run is the same. The bound is
//! checked over arbitrary arrival patterns, instance counts and lease sizes; the rest pins
//! what a user sees: the share of decisions made without a call, all or nothing with an
//! exact limit beside, tokens given back, configuration errors.

use std::future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::{Clock, FakeClock};
use tollgate::store::{
    Backend, Checked, Item, MemoryStore, MemoryTable, Op, Resilient, Statuses, Store, StoreError,
};
use tollgate::{Algorithm, Lease, LimitSpec, Limiter, Quota};

/// The shared store: a memory store on the fake clock, seen through the `Backend` trait,
/// counting calls.
#[derive(Clone)]
struct Shared {
    store: MemoryStore<FakeClock>,
    calls: Arc<AtomicUsize>,
    /// Every call fails while set.
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl Shared {
    fn new(clock: &FakeClock) -> Self {
        Self {
            store: MemoryStore::with_clock(clock.clone()),
            calls: Arc::default(),
            down: Arc::default(),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Backend for Shared {
    type Table = MemoryTable;
    type Future = future::Ready<Result<Statuses, StoreError>>;

    fn table(&self, name: &str) -> MemoryTable {
        self.store.table(name)
    }

    fn apply(&self, op: Op, items: &[Item<'_, MemoryTable>]) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return future::ready(Err(StoreError::new("down")));
        }
        let Checked::Ready(statuses) = self.store.apply(op, items) else {
            unreachable!("a memory store answers at once")
        };
        future::ready(Ok(statuses))
    }
}

/// `n` instances: a store each over `shared`, and a limiter with `spec` on it.
fn instances(
    n: usize,
    shared: &Shared,
    clock: &FakeClock,
    spec: &LimitSpec,
) -> Vec<(Resilient<Shared>, Limiter)> {
    (0..n)
        .map(|_| {
            let store = Resilient::new(shared.clone())
                .clock(clock.clone())
                .deny_cache(false);
            let limiter = Limiter::builder(store.clone())
                .limit(spec.clone())
                .build()
                .unwrap();
            (store, limiter)
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Lets the background lease calls run: each `yield_now` lets every ready task take a
/// step.
async fn settle(steps: usize) {
    for _ in 0..steps {
        tokio::task::yield_now().await;
    }
}

/// The largest number of grants in any interval, less what the exact limiter allows over
/// it: `max over a <= b of count[a, b] - (burst + (b - a)/T)`, in tokens (times `t`).
fn excess_over_exact(grants: &[u64], burst: u64, t: u64) -> i128 {
    let mut worst = i128::MIN;
    for i in 0..grants.len() {
        for j in i..grants.len() {
            let count = (j - i + 1) as i128;
            let d = i128::from(grants[j] - grants[i]);
            // count - burst - d/t, scaled by t to stay in integers.
            let excess = count * i128::from(t) - i128::from(burst) * i128::from(t) - d;
            worst = worst.max(excess);
        }
    }
    worst
}

/// One request: which instance, how long after the previous one, and how many steps the
/// background calls get before the next (0: they are still on their way).
#[derive(Debug, Clone)]
struct Arrival {
    instance: usize,
    after_us: u64,
    steps: usize,
}

fn arrivals(instances: usize) -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec(
        (
            0..instances,
            prop_oneof![Just(0u64), 0..2_000u64, 0..200_000u64],
            0..3usize,
        )
            .prop_map(|(instance, after_us, steps)| Arrival {
                instance,
                after_us,
                steps,
            }),
        1..300,
    )
}

/// Plays `script` on `n` instances leasing `spec` (one shared store, a fake clock): the
/// instant the run starts, and the instant of each grant.
fn grant_times(n: usize, spec: &LimitSpec, script: &[Arrival]) -> (u64, Vec<u64>) {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let start = clock.now();
    let shared = Shared::new(&clock);
    let fleet = instances(n, &shared, &clock, spec);
    let mut grants = Vec::new();
    runtime().block_on(async {
        for a in script {
            clock.advance(Duration::from_micros(a.after_us));
            let (_, limiter) = &fleet[a.instance % n];
            if limiter.check("api", "k", 1).await.unwrap().allowed() {
                grants.push(clock.now());
            }
            settle(a.steps).await;
        }
    });
    (start, grants)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        // The tests package has no lib.rs for proptest to store failures beside.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// GCRA: over any interval of length d, the instances grant at most
    /// `burst + d/T + N·L`, whatever the arrivals, the instance count, the lease size and
    /// whether the lease calls have landed.
    #[test]
    fn gcra_leases_grant_at_most_burst_plus_d_over_t_plus_n_leases(
        n in 1usize..=4,
        lease in 1u32..=20,
        rate in 1u64..=200,
        burst in 1u64..=40,
        script in arrivals(4),
    ) {
        let lease = lease.min(burst as u32);
        let quota = Quota::per_second(rate).burst(burst);
        let spec = LimitSpec::new("api", quota).lease(Lease::tokens(lease));
        let (_, grants) = grant_times(n, &spec, &script);
        let t = u64::try_from(quota.emission_interval().as_nanos()).unwrap();
        let bound = (n as i128) * i128::from(lease) * i128::from(t);
        let excess = excess_over_exact(&grants, burst, t);
        prop_assert!(excess <= bound, "excess {} tokens over the exact limiter, bound {} ({} instances x {})",
            excess as f64 / t as f64, n as u64 * u64::from(lease), n, lease);
    }

    /// GCRA from the start: however the instances lease (reservations near exhaustion
    /// included), no token is spent before the shared bucket gives it, so the grants up
    /// to any instant are at most what the exact limiter grants, `burst + d/T`, without
    /// the `N·L` that tokens taken before an interval add to it.
    #[test]
    fn leased_grants_never_run_ahead_of_the_shared_bucket(
        n in 1usize..=4,
        lease in 1u32..=20,
        rate in 1u64..=200,
        burst in 1u64..=40,
        script in arrivals(4),
    ) {
        let lease = lease.min(burst as u32);
        let quota = Quota::per_second(rate).burst(burst);
        let spec = LimitSpec::new("api", quota).lease(Lease::tokens(lease));
        let (start, grants) = grant_times(n, &spec, &script);
        let t = i128::try_from(quota.emission_interval().as_nanos()).unwrap();
        for (i, at) in grants.iter().enumerate() {
            let granted = i as i128 + 1;
            let d = i128::from(at - start);
            let excess = granted * t - i128::from(burst) * t - d;
            prop_assert!(excess <= 0, "{} granted {} ns after the start: {} tokens ahead of the bucket",
                granted, d, excess as f64 / t as f64);
        }
    }

    /// A fixed window: leased units are spent only in the window they were counted in, so
    /// no window ever grants more than its limit.
    #[test]
    fn fixed_window_leases_never_grant_more_than_the_limit_in_a_window(
        n in 1usize..=4,
        lease in 1u32..=10,
        limit in 1u64..=30,
        script in arrivals(4),
    ) {
        let lease = lease.min(limit as u32);
        let window = Duration::from_millis(100);
        let quota = Quota::new(limit, window).unwrap();
        let spec = LimitSpec::new("api", quota)
            .algorithm(Algorithm::fixed_window())
            .lease(Lease::tokens(lease));
        let (_, grants) = grant_times(n, &spec, &script);
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for at in grants {
            let w = at / u64::try_from(window.as_nanos()).unwrap();
            *per_window.entry(w).or_default() += 1;
        }
        for (w, granted) in per_window {
            prop_assert!(granted <= limit, "window {}: {} granted, limit {}", w, granted, limit);
        }
    }
}

/// A hot key shared by 4 instances under the limit: after the first lease, almost every
/// decision is made without a call.
#[test]
fn a_hot_key_under_the_limit_is_decided_locally_almost_always() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let shared = Shared::new(&clock);
    // 10,000/s; the instances send 8,000/s together, 2,000 each.
    let spec =
        LimitSpec::new("global", Quota::per_second(10_000).burst(10_000)).lease(Lease::auto());
    let fleet = instances(4, &shared, &clock, &spec);
    let decisions = 40_000;
    let mut allowed = 0;
    runtime().block_on(async {
        for i in 0..decisions {
            clock.advance(Duration::from_micros(125));
            let (_, limiter) = &fleet[i % 4];
            if limiter.check("global", "all", 1).await.unwrap().allowed() {
                allowed += 1;
            }
            settle(2).await;
        }
    });
    let stats: Vec<_> = fleet.iter().map(|(s, _)| s.lease_stats()).collect();
    let local: u64 = stats.iter().map(|s| s.local_allowed).sum();
    assert_eq!(allowed, decisions, "under the limit, every request passes");
    let calls = shared.calls();
    eprintln!(
        "under the limit: {local} of {decisions} decided locally, {calls} calls ({:.1} per 1,000)",
        calls as f64 * 1_000.0 / decisions as f64
    );
    assert!(
        local as f64 >= 0.99 * decisions as f64,
        "{local} of {decisions} decided locally: {stats:?}"
    );
    assert!(
        calls * 1_000 <= 10 * decisions,
        "{calls} calls for {decisions} decisions: {stats:?}"
    );
}

/// At 2× and 10× the limit, the instances grant what the exact limiter would over the
/// run, within 1% (the rest is held, due, at the end), and refusals cost no call: near
/// exhaustion leases are reservations, so no tokens wait in the bucket for a batch.
#[test]
fn over_the_limit_the_instances_grant_what_the_exact_limiter_would() {
    for load in [2u64, 10] {
        let clock = FakeClock::at(Duration::from_secs(1_000));
        let shared = Shared::new(&clock);
        let quota = Quota::per_second(1_000).burst(1_000);
        let lease = Lease::auto();
        let spec = LimitSpec::new("global", quota).lease(lease);
        let fleet = instances(4, &shared, &clock, &spec);
        let seconds = 10;
        let decisions = (seconds * 1_000 * load) as usize;
        let gap = Duration::from_nanos(1_000_000_000 / (1_000 * load));
        let mut allowed = 0u64;
        runtime().block_on(async {
            for i in 0..decisions {
                clock.advance(gap);
                let (_, limiter) = &fleet[i % 4];
                if limiter.check("global", "all", 1).await.unwrap().allowed() {
                    allowed += 1;
                }
                settle(2).await;
            }
        });
        let exact = quota.burst_size() + seconds * 1_000;
        let calls = shared.calls() as u64;
        let stats: Vec<_> = fleet.iter().map(|(s, _)| s.lease_stats()).collect();
        // Taken from the shared bucket and not spent when the run ends.
        let held: u64 = stats
            .iter()
            .map(|s| s.leased_tokens - s.local_allowed - s.returned_tokens)
            .sum();
        // Still in the shared bucket when the run stops (instances waiting for a batch).
        let table = shared.store.table("global");
        let item = Item::new(&table, tollgate::key::Key::from_part("all"), quota, 0);
        let Checked::Ready(s) = shared.store.apply(Op::Check, &[item]) else {
            unreachable!()
        };
        let peek = s[0].outcome().unwrap();
        let in_bucket = peek.remaining();
        // Reserved by the instances and not due yet: the bucket's debt, which the exact
        // limiter would not have granted by now either.
        let t = quota.emission_interval().as_nanos();
        let reserved = u64::try_from(peek.wait().as_nanos().div_ceil(t)).unwrap();
        // Every token the exact limiter would grant is granted, held (due) or still in
        // the bucket; the rest was lost (the bucket overflowed while the instances waited).
        let due_held = held.saturating_sub(reserved);
        let lost = exact.saturating_sub(allowed + due_held + in_bucket);
        eprintln!(
            "{load}x the limit: {allowed} granted (exact limiter {exact}; {held} held, {reserved} of them not due, and {in_bucket} in the bucket at the end, {lost} lost), {calls} calls for {decisions} decisions ({:.1} per 1,000)",
            calls as f64 * 1_000.0 / decisions as f64
        );
        assert!(
            allowed * 100 >= exact * 99,
            "{load}x: {allowed} granted, more than 1% under the exact limiter's {exact}"
        );
        assert!(
            allowed <= exact,
            "{load}x: {allowed} granted, exact limiter {exact}"
        );
        assert!(
            held <= 4 * lease_cap(&quota),
            "{load}x: {held} held, more than 4 leases"
        );
        assert!(
            lost * 100 <= exact,
            "{load}x: {lost} of {exact} tokens lost: {stats:#?}"
        );
        assert!(
            calls * 1_000 <= 10 * decisions as u64,
            "{load}x: {calls} calls for {decisions} decisions: {stats:#?}"
        );
    }
}

/// An eighth of the burst: `Lease::auto`'s cap.
fn lease_cap(quota: &Quota) -> u64 {
    (quota.burst_size() / 8).max(1)
}

/// A request with a leased limit and an exact one: the exact one refuses, so nothing is
/// taken from the lease either.
#[test]
fn a_refusal_by_an_exact_limit_beside_takes_nothing_from_the_lease() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let shared = Shared::new(&clock);
    let store = Resilient::new(shared.clone())
        .clock(clock.clone())
        .deny_cache(false);
    let limiter = Limiter::builder(store.clone())
        .limit(LimitSpec::new("leased", Quota::per_minute(100)).lease(Lease::tokens(10)))
        .limit(LimitSpec::new("exact", Quota::per_minute(1)))
        .build()
        .unwrap();
    runtime().block_on(async {
        // The first check goes to the backend and starts a lease of 10.
        assert!(limiter.check("leased", "k", 1).await.unwrap().allowed());
        settle(4).await;
        assert!(store.lease_stats().leased_tokens > 0);
        // Grow the lease: 10 quick requests.
        for _ in 0..10 {
            limiter.check("leased", "k", 1).await.unwrap();
            settle(4).await;
        }
        let before = store.lease_stats();
        assert!(before.leased_tokens > 1, "{before:?}");
        let held = before.leased_tokens - before.local_allowed;
        // Exhaust the exact limit, then ask for both: refused, nothing taken.
        assert!(limiter.check("exact", "k", 1).await.unwrap().allowed());
        let both = limiter
            .check_all([("leased", "k", 1), ("exact", "k", 1)])
            .await
            .unwrap();
        assert!(!both.allowed());
        let after = store.lease_stats();
        assert_eq!(
            after.leased_tokens - after.local_allowed,
            held,
            "the lease kept its tokens: {after:?}"
        );
    });
}

/// A request with two leased limits, one decided here from its lease and one costing more
/// than its lease may hold (so the backend decides it): the request is asked of the
/// backend as a whole, and the token taken here goes back to its lease, so the limit is
/// charged once, at the backend.
#[test]
fn a_request_one_lease_cannot_decide_is_asked_whole_and_the_other_lease_keeps_its_token() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let shared = Shared::new(&clock);
    let store = Resilient::new(shared.clone())
        .clock(clock.clone())
        .deny_cache(false);
    let quota = Quota::per_hour(100); // nothing refills during the test
    let limiter = Limiter::builder(store.clone())
        .limit(LimitSpec::new("leased", quota).lease(Lease::tokens(10)))
        .limit(LimitSpec::new("costly", quota).lease(Lease::tokens(10)))
        .build()
        .unwrap();
    let _kept = shared.store.table("leased");
    let shared_left = || {
        let table = shared.store.table("leased");
        let item = Item::new(&table, tollgate::key::Key::from_part("k"), quota, 0);
        let Checked::Ready(s) = shared.store.apply(Op::Check, &[item]) else {
            unreachable!()
        };
        s[0].outcome().unwrap().remaining()
    };
    runtime().block_on(async {
        for _ in 0..5 {
            assert!(limiter.check("leased", "k", 1).await.unwrap().allowed());
            settle(4).await;
        }
        let before = store.lease_stats();
        let held = before.leased_tokens - before.local_allowed;
        assert!(held > 0, "{before:?}");
        let left = shared_left();
        // 20 tokens: more than the costly limit's lease may hold (10).
        let both = limiter
            .check_all([("leased", "k", 1), ("costly", "k", 20)])
            .await
            .unwrap();
        assert!(both.allowed());
        settle(4).await;
        let after = store.lease_stats();
        assert_eq!(
            after.leased_tokens - after.local_allowed,
            held,
            "the lease kept its token: {after:?}"
        );
        assert_eq!(shared_left(), left - 1, "charged once, at the backend");
    });
}

/// Tokens not spent go back: when the lease is older than its age, and when the limiter
/// is dropped.
#[test]
fn unspent_tokens_go_back_when_the_lease_ages_and_when_the_limiter_is_dropped() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let shared = Shared::new(&clock);
    let quota = Quota::per_hour(100); // nothing refills during the test
    let spec =
        LimitSpec::new("api", quota).lease(Lease::tokens(20).max_age(Duration::from_secs(1)));
    let peek = |shared: &Shared| {
        let table = shared.store.table("api");
        let item = Item::new(&table, tollgate::key::Key::from_part("k"), quota, 0);
        let Checked::Ready(s) = shared.store.apply(Op::Check, &[item]) else {
            unreachable!()
        };
        s[0].outcome().unwrap().remaining()
    };
    // The memory store frees a table's buckets when its last handle goes: the test keeps
    // one, as Redis keeps its keys.
    let _kept = shared.store.table("api");
    runtime().block_on(async {
        let store = Resilient::new(shared.clone()).clock(clock.clone());
        let limiter = Limiter::builder(store.clone())
            .limit(spec.clone())
            .build()
            .unwrap();
        for _ in 0..5 {
            assert!(limiter.check("api", "k", 1).await.unwrap().allowed());
            settle(4).await;
        }
        let stats = store.lease_stats();
        let held = stats.leased_tokens - stats.local_allowed;
        assert!(held > 0, "{stats:?}");
        // The shared bucket counts what the instance holds.
        assert_eq!(peek(&shared), 100 - 5 - held);
        // Past the lease's age, the next request gives the rest back.
        clock.advance(Duration::from_secs(2));
        assert!(limiter.check("api", "k", 1).await.unwrap().allowed());
        settle(8).await;
        let stats = store.lease_stats();
        assert_eq!(stats.returned_tokens, held, "{stats:?}");

        // A second lease, given back when the limiter goes.
        for _ in 0..5 {
            limiter.check("api", "k", 1).await.unwrap();
            settle(4).await;
        }
        let stats = store.lease_stats();
        let spent = 5 + 1 + 5;
        let held = stats.leased_tokens - stats.local_allowed - stats.returned_tokens;
        assert_eq!(peek(&shared), 100 - spent - held, "{stats:?}");
        drop(limiter);
        settle(8).await;
        let stats = store.lease_stats();
        assert_eq!(
            peek(&shared),
            100 - spent,
            "every unspent token is back: {stats:?} held {held}"
        );
    });
}

/// A lease the limit cannot take is a configuration error naming the field.
#[test]
fn a_lease_the_limit_cannot_take_is_refused_at_build() {
    let store = Resilient::new(Shared::new(&FakeClock::default()));
    let err = Limiter::builder(store.clone())
        .limit(
            LimitSpec::new("logins", Quota::per_minute(5))
                .algorithm(Algorithm::SlidingLog)
                .lease(Lease::auto()),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), r#"limits["logins"].lease"#);
    let err = Limiter::builder(store)
        .limit(LimitSpec::new("api", Quota::per_second(10)).lease(Lease::tokens(11)))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), r#"limits["api"].lease.tokens"#);
    assert!(
        err.to_string().contains("larger than the burst (10)"),
        "{err}"
    );
}

/// A rules document leases with `lease = "auto"` or a number of tokens, and
/// `lease_max_age`; what cannot lease is an error naming the line and the field.
#[cfg(feature = "rules")]
#[test]
fn a_rules_document_leases_and_names_what_cannot() {
    use tollgate::rules::Document;

    let clock = FakeClock::at(Duration::from_secs(1_000));
    let shared = Shared::new(&clock);
    let store = Resilient::new(shared.clone()).clock(clock.clone());
    let doc = Document::from_toml(
        r#"
        [[limits]]
        name = "global"
        quota = "1000/s"
        lease = "auto"

        [[limits]]
        name = "daily"
        key = "header:x-api-key"
        quota = "10000/d"
        algorithm = "fixed_window"
        lease = 50
        lease_max_age = "500ms"
        "#,
    )
    .unwrap();
    assert!(doc.to_string().contains("leased (auto)"), "{doc}");
    assert!(doc.to_string().contains("leased (up to 50)"), "{doc}");
    let layer = doc.layer(store.clone()).unwrap();
    let limiter = layer.limiter();
    runtime().block_on(async {
        for _ in 0..20 {
            assert!(limiter.check("global", "all", 1).await.unwrap().allowed());
            settle(4).await;
        }
    });
    assert!(
        store.lease_stats().local_allowed > 0,
        "{:?}",
        store.lease_stats()
    );

    let refused = |text: &str| {
        Document::from_toml(text)
            .and_then(|d| d.layer(store.clone()).map(|_| ()))
            .unwrap_err()
    };
    let e = refused(
        "[[limits]]\nname = \"a\"\nquota = \"5/min\"\nalgorithm = \"sliding_log\"\nlease = \"auto\"\n",
    );
    assert_eq!(e.field(), "limits[0].lease", "{e}");
    let e = refused("[[limits]]\nname = \"a\"\nquota = \"5/min\"\nlease_max_age = \"1s\"\n");
    assert_eq!(e.field(), "limits[0].lease_max_age", "{e}");
    let e = refused("[[limits]]\nname = \"a\"\nquota = \"5/min\"\nlease = \"sometimes\"\n");
    assert!(e.to_string().contains("\"auto\" or a whole number"), "{e}");
    let e = refused("[[limits]]\nname = \"a\"\nquota = \"5/min\"\nlease = 6\n");
    assert!(e.to_string().contains("larger than the burst (5)"), "{e}");
}

/// While the backend fails, leased keys follow the failure policy (the local fallback)
/// like any other, even one this instance was waiting on for a lease: every request gets
/// a decision, and the fallback's.
#[test]
fn while_the_backend_fails_leased_keys_follow_the_failure_policy() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let shared = Shared::new(&clock);
    let spec = LimitSpec::new("global", Quota::per_second(100).burst(100)).lease(Lease::auto());
    // A breaker that never opens: the policy must answer from the first failed call on,
    // not only once the breaker skips the backend.
    let store = Resilient::new(shared.clone())
        .clock(clock.clone())
        .deny_cache(false)
        .breaker(u32::MAX, Duration::from_secs(1));
    let limiter = Limiter::builder(store.clone()).limit(spec).build().unwrap();
    let (store, limiter) = (&store, &limiter);
    runtime().block_on(async {
        // Exhaust the key: the instance ends up waiting for a batch.
        for _ in 0..400 {
            clock.advance(Duration::from_millis(1));
            limiter.check("global", "all", 1).await.unwrap();
            settle(2).await;
        }
        assert!(
            store.lease_stats().local_refused > 0,
            "{:?}",
            store.lease_stats()
        );
        shared.down.store(true, Ordering::SeqCst);
        let mut fallback = 0;
        for _ in 0..2_000 {
            clock.advance(Duration::from_millis(1));
            let d = limiter.check("global", "all", 1).await.unwrap();
            if matches!(d.status(), tollgate::Status::Fallback(_)) {
                fallback += 1;
            }
            settle(2).await;
        }
        assert!(
            fallback > 1_000,
            "{fallback} of 2,000 decided by the fallback"
        );
    });
}

/// [`grant_times`] with a cost per request: `script`'s arrivals, the `i`th of cost
/// `costs[i % costs.len()]`; the instant and cost of each grant.
fn costed_grant_times(
    n: usize,
    spec: &LimitSpec,
    script: &[Arrival],
    costs: &[u32],
) -> (u64, Vec<(u64, u32)>) {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let start = clock.now();
    let shared = Shared::new(&clock);
    let fleet = instances(n, &shared, &clock, spec);
    let mut grants = Vec::new();
    runtime().block_on(async {
        for (i, a) in script.iter().enumerate() {
            clock.advance(Duration::from_micros(a.after_us));
            let (_, limiter) = &fleet[a.instance % n];
            let cost = costs[i % costs.len()];
            if limiter.check("api", "k", cost).await.unwrap().allowed() {
                grants.push((clock.now(), cost));
            }
            settle(a.steps).await;
        }
    });
    (start, grants)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Issue 41: with costs up to twice the lease's cap (requests the lease cannot hold go
    /// to the shared bucket), the tokens granted over any interval of length d stay within
    /// `burst + d/T + N·L`, and those granted up to any instant within `burst + d/T`.
    #[test]
    fn gcra_leases_with_costs_above_the_cap_keep_the_bound(
        n in 1usize..=4,
        lease in 1u32..=8,
        rate in 1u64..=200,
        burst in 2u64..=40,
        costs in prop::collection::vec(0u32..=16, 1..8),
        script in arrivals(4),
    ) {
        let lease = lease.min(burst as u32);
        let most = u64::from(lease * 2 + 1).min(burst);
        let costs: Vec<u32> = costs.iter().map(|&c| 1 + c % most as u32).collect();
        let quota = Quota::per_second(rate).burst(burst);
        let spec = LimitSpec::new("api", quota).lease(Lease::tokens(lease));
        let (start, grants) = costed_grant_times(n, &spec, &script, &costs);
        let t = i128::try_from(quota.emission_interval().as_nanos()).unwrap();
        let (burst, bound) = (i128::from(burst), (n as i128) * i128::from(lease) * t);
        let mut granted = 0i128;
        for (i, &(at, cost)) in grants.iter().enumerate() {
            granted += i128::from(cost);
            let ahead = granted * t - burst * t - i128::from(at - start);
            prop_assert!(ahead <= 0, "{} tokens granted {} ns after the start: {} ahead of the bucket",
                granted, at - start, ahead as f64 / t as f64);
            let mut tokens = 0i128;
            for &(from, c) in grants[..=i].iter().rev() {
                tokens += i128::from(c);
                let excess = tokens * t - burst * t - i128::from(at - from);
                prop_assert!(excess <= bound, "excess {} tokens over the exact limiter, bound {} ({} instances x {})",
                    excess as f64 / t as f64, n as u64 * u64::from(lease), n, lease);
            }
        }
    }
}
