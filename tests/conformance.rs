//! One conformance suite, two stores: the same (time, key, cost) cases through
//! `MemoryStore` (fake clock) and `RedisStore` (the same fake clock as caller time), on a
//! real Redis server and on a real Redis Cluster. The decisions must be identical.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::aio::ConnectionLike;
use support::redis::RedisServer;
use tollgate::clock::FakeClock;
use tollgate::key::Key;
use tollgate::store::{Checked, Item, MemoryStore, RedisStore, Statuses, Store};
use tollgate::{Algorithm, Mode, Quota, Status};

/// One request of a case: advance the clock, then check these limits.
#[derive(Debug, Clone)]
struct Step {
    advance_us: u64,
    /// A reservation when non-zero: every limit of the step may wait this long (the
    /// sliding algorithms ignore it).
    max_wait_us: u64,
    /// (limit index, key, cost, enforcing)
    limits: Vec<(usize, u8, u32, bool)>,
}

/// Quotas whose emission interval is a whole number of microseconds, where both stores
/// compute with the same T (see ARCHITECTURE.md, "Units of time"), and window limits of
/// every algorithm (windows are whole microseconds).
///
/// Every duration of the suite (periods, clock steps, waits) is its value in the cases
/// times [`SCALE`]: the decisions are the same, and the keys' real-time expiry (`PX`, from
/// reset times on the fake clock) is seconds rather than milliseconds, so that a key
/// written on a loaded machine does not expire before the step makes it persistent.
fn limits() -> Vec<(Quota, Algorithm)> {
    let q = |n, ms: u64| Quota::new(n, Duration::from_millis(ms * SCALE)).unwrap();
    vec![
        (q(10, 1_000), Algorithm::Gcra),
        (q(4, 1_000).burst(3), Algorithm::Gcra),
        (q(120, 60_000).burst(5), Algorithm::Gcra),
        (q(3, 30).burst(7), Algorithm::Gcra),
        (q(5, 100), Algorithm::fixed_window()),
        (q(3, 50), Algorithm::fixed_window_random()),
        (
            q(4, 70),
            Algorithm::fixed_window_at(Duration::from_micros(12_345 * SCALE)),
        ),
        (q(6, 100), Algorithm::SlidingWindow),
        (q(4, 80), Algorithm::SlidingLog),
    ]
}

/// How much longer every duration of the suite is than written in its cases (see
/// [`limits`]).
const SCALE: u64 = 1_000;

/// How many limits [`limits`] has.
const LIMITS: usize = 9;

async fn check<S: Store>(store: &S, items: &[Item<'_, S::Table>]) -> Statuses {
    match store.check(items) {
        Checked::Ready(s) => s,
        Checked::Pending(f) => f.await,
    }
}

/// Runs `steps` through both stores and compares every status.
///
/// Redis expires keys (`PX`) in real time, from reset times computed on the fake clock: on
/// a loaded machine real time can run ahead of the fake clock between two steps, and a key
/// would expire before its bucket is full on the fake clock. So the keys a step wrote are
/// made persistent (`conn`): the suite compares decisions, and expiry has its own test
/// (`tests/redis.rs`).
async fn run_case<S: Store, C: ConnectionLike + Clone>(
    redis: &S,
    redis_clock: &FakeClock,
    steps: &[Step],
    prefix: &str,
    conn: &C,
) -> Result<(), String> {
    let clock = FakeClock::at(Duration::from_secs(1_700_000_000));
    redis_clock.set(Duration::from_secs(1_700_000_000));
    let memory = MemoryStore::with_clock(clock.clone());
    let limits = limits();
    let names: Vec<String> = (0..limits.len())
        .map(|i| format!("{prefix}-l{i}"))
        .collect();
    let mem_tables: Vec<_> = names.iter().map(|n| memory.table(n)).collect();
    let redis_tables: Vec<_> = names.iter().map(|n| redis.table(n)).collect();
    for (n, step) in steps.iter().enumerate() {
        clock.advance(Duration::from_micros(step.advance_us * SCALE));
        redis_clock.advance(Duration::from_micros(step.advance_us * SCALE));
        let max_wait = Duration::from_micros(step.max_wait_us * SCALE);
        let item = |(l, k, cost, enforce): (usize, u8, u32, bool)| {
            (
                Key::from_part(k),
                limits[l],
                cost,
                if enforce { Mode::Enforce } else { Mode::Shadow },
            )
        };
        let mem_items: Vec<_> = step
            .limits
            .iter()
            .map(|&x| {
                let (key, (q, a), c, m) = item(x);
                Item::new(&mem_tables[x.0], key, q, c)
                    .mode(m)
                    .algorithm(a)
                    .max_wait(max_wait)
            })
            .collect();
        let redis_items: Vec<_> = step
            .limits
            .iter()
            .map(|&x| {
                let (key, (q, a), c, m) = item(x);
                Item::new(&redis_tables[x.0], key, q, c)
                    .mode(m)
                    .algorithm(a)
                    .max_wait(max_wait)
            })
            .collect();
        let a = check(&memory, &mem_items).await;
        let b = check(redis, &redis_items).await;
        for &(l, k, _, _) in &step.limits {
            let key = format!("tollgate:{}:{}", names[l], Key::from_part(k));
            let _: i64 = redis::cmd("PERSIST")
                .arg(key)
                .query_async(&mut conn.clone())
                .await
                .map_err(|e| format!("PERSIST: {e}"))?;
        }
        if a != b {
            return Err(format!("step {n} {step:?}: memory {a:?} != redis {b:?}"));
        }
        for s in &b {
            if !matches!(s, Status::Checked(_)) {
                return Err(format!("step {n}: Redis did not answer: {s:?}"));
            }
        }
    }
    Ok(())
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let limit = (0usize..LIMITS, 0u8..3, 0u32..5, prop::bool::weighted(0.85));
    let limits = prop::collection::vec(limit, 1..4).prop_map(|mut v| {
        // One request names each limit at most once.
        v.sort_by_key(|l| l.0);
        v.dedup_by_key(|l| l.0);
        v
    });
    let max_wait = prop_oneof![6 => Just(0u64), 1 => 1u64..400_000];
    let step = (
        prop_oneof![0u64..5_000, 0u64..200_000, Just(0u64)],
        max_wait,
        limits,
    )
        .prop_map(|(advance_us, max_wait_us, limits)| Step {
            advance_us,
            max_wait_us,
            limits,
        });
    prop::collection::vec(step, 1..60)
}

/// Fixed cases first: the edges that random cases reach rarely.
fn fixed_cases() -> Vec<Vec<Step>> {
    let one = |advance_us, l, k, cost| Step {
        advance_us,
        max_wait_us: 0,
        limits: vec![(l, k, cost, true)],
    };
    let reserve = |advance_us, max_wait_us, l, k, cost| Step {
        advance_us,
        max_wait_us,
        limits: vec![(l, k, cost, true)],
    };
    vec![
        // A full burst, a denial, the exact moment of the next token.
        (0..12)
            .map(|_| one(0, 0, 0, 1))
            .chain([one(99_999, 0, 0, 1), one(1, 0, 0, 1)])
            .collect(),
        // Variable cost, cost above burst (never), peeks.
        vec![
            one(0, 1, 1, 2),
            one(0, 1, 1, 2),
            one(0, 1, 1, 4),
            one(0, 1, 1, 0),
            one(250_000, 1, 1, 1),
        ],
        // Several limits, one refusing: nothing consumed anywhere.
        vec![
            Step {
                advance_us: 0,
                max_wait_us: 0,
                limits: vec![(0, 0, 1, true), (1, 0, 3, true)],
            },
            Step {
                advance_us: 0,
                max_wait_us: 0,
                limits: vec![(0, 0, 1, true), (1, 0, 1, true)],
            },
            Step {
                advance_us: 0,
                max_wait_us: 0,
                limits: vec![(0, 0, 1, true), (1, 0, 1, true), (2, 0, 1, false)],
            },
        ],
        // Each window algorithm: the limit, a refusal, the moment it passes again; a cost
        // above the limit (never); a peek.
        (4..LIMITS)
            .flat_map(|l| {
                (0..7)
                    .map(move |_| one(0, l, 0, 1))
                    .chain([one(0, l, 0, 7), one(0, l, 0, 0)])
                    .chain((0..12).map(move |_| one(9_999, l, 0, 1)))
                    .chain([one(49_999, l, 0, 2), one(1, l, 0, 2), one(1, l, 1, 3)])
            })
            .collect(),
        // Mixed algorithms in one request, one refusing: nothing consumed anywhere.
        vec![
            Step {
                advance_us: 0,
                max_wait_us: 0,
                limits: vec![
                    (0, 0, 1, true),
                    (4, 0, 4, true),
                    (7, 0, 5, true),
                    (8, 0, 3, true),
                ],
            },
            Step {
                advance_us: 0,
                max_wait_us: 0,
                limits: vec![
                    (0, 0, 1, true),
                    (4, 0, 2, true),
                    (7, 0, 1, true),
                    (8, 0, 1, true),
                ],
            },
            Step {
                advance_us: 0,
                max_wait_us: 0,
                limits: vec![
                    (4, 0, 1, true),
                    (5, 0, 1, true),
                    (6, 0, 1, true),
                    (8, 0, 1, true),
                ],
            },
        ],
        // Reservations: GCRA into debt up to the wait, then refused; a fixed window into
        // the following windows; both together, all or nothing; the state they leave.
        (0..14)
            .map(|_| reserve(0, 350_000, 0, 0, 1))
            .chain([one(0, 0, 0, 1), one(0, 0, 0, 0), one(150_000, 0, 0, 1)])
            .chain((0..13).map(|_| reserve(0, 120_000, 4, 0, 1)))
            .chain([one(0, 4, 0, 0), one(100_000, 4, 0, 1), one(0, 4, 0, 1)])
            .chain([Step {
                advance_us: 0,
                max_wait_us: 250_000,
                limits: vec![(1, 1, 3, true), (4, 1, 3, true), (6, 1, 4, true)],
            }])
            .chain((0..4).map(|_| Step {
                advance_us: 10_000,
                max_wait_us: 300_000,
                limits: vec![(1, 1, 2, true), (4, 1, 3, true)],
            }))
            .collect(),
        // A shadow limit that would refuse does not stop the others.
        vec![
            Step {
                advance_us: 0,
                max_wait_us: 0,
                limits: vec![(1, 2, 3, false), (2, 2, 1, true)],
            },
            Step {
                advance_us: 0,
                max_wait_us: 0,
                limits: vec![(1, 2, 3, false), (2, 2, 1, true)],
            },
        ],
    ]
}

async fn suite<S: Store, C: ConnectionLike + Clone>(
    redis: &S,
    clock: &FakeClock,
    label: &str,
    conn: C,
) {
    for (i, case) in fixed_cases().iter().enumerate() {
        run_case(redis, clock, case, &format!("{label}-fixed{i}"), &conn)
            .await
            .unwrap();
    }
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let handle = tokio::runtime::Handle::current();
    let counter = std::sync::atomic::AtomicUsize::new(0);
    let result = tokio::task::block_in_place(|| {
        runner.run(&steps(), |steps| {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            handle
                .block_on(run_case(
                    redis,
                    clock,
                    &steps,
                    &format!("{label}-case{n}"),
                    &conn,
                ))
                .map_err(TestCaseError::fail)
        })
    });
    result.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_decide_alike() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    // A generous timeout: a call slowed by a loaded machine must not fall back locally.
    let store = RedisStore::new(server.client().get_connection_manager().await.unwrap())
        .caller_time(clock.clone())
        .timeout(Duration::from_secs(5))
        .deny_cache(false);
    suite(&store, &clock, "single", server.connection().await).await;
}

#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_cluster_decide_alike() {
    let cluster = support::redis::RedisCluster::start(3);
    let clock = FakeClock::new();
    let store = RedisStore::cluster(cluster.connection().await)
        .caller_time(clock.clone())
        .timeout(Duration::from_secs(5))
        .deny_cache(false);
    suite(&store, &clock, "cluster", cluster.connection().await).await;
}

/// Where T is not a whole number of microseconds, Redis rounds it up to the microsecond
/// and the memory store to the nanosecond: Redis is never more generous.
#[tokio::test]
async fn redis_is_never_more_generous_when_units_differ() {
    let server = RedisServer::start();
    let clock = FakeClock::at(Duration::from_secs(1_700_000_000));
    let redis = RedisStore::new(server.client().get_connection_manager().await.unwrap())
        .caller_time(clock.clone())
        .timeout(Duration::from_secs(5))
        .deny_cache(false);
    let memory = MemoryStore::with_clock(clock.clone());
    let q = Quota::per_second(3); // T = 333,333.33 µs
    let (rt, mt) = (redis.table("thirds"), memory.table("thirds"));
    let (mut redis_ok, mut memory_ok) = (0, 0);
    for _ in 0..3_000 {
        clock.advance(Duration::from_micros(111_111));
        let r = check(&redis, &[Item::new(&rt, Key::global(), q, 1)]).await;
        let m = check(&memory, &[Item::new(&mt, Key::global(), q, 1)]).await;
        redis_ok += usize::from(r[0].outcome().unwrap().is_allowed());
        memory_ok += usize::from(m[0].outcome().unwrap().is_allowed());
        assert!(redis_ok <= memory_ok);
    }
    assert!(memory_ok - redis_ok <= 1, "{memory_ok} vs {redis_ok}");
}
