//! The window algorithms through the [`Limiter`] handle and the layer, on every store:
//! `MemoryStore` on a fake clock, a real Redis server and a real 3-master Redis Cluster
//! (with the same fake clock as caller time). Every case asserts exact numbers.
//!
//! Windows of one minute; the clock starts on a whole minute since the epoch, so window
//! boundaries fall at `START + 60 s × k` for aligned windows.

mod support;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::{header, send};
use tollgate::clock::FakeClock;
use tollgate::key::PeerIp;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, Limit, LimitDecision, Limiter, LimiterError, Quota, RateLimitLayer};

/// A whole minute since the epoch.
const START: Duration = Duration::from_secs(1_700_000_040);
const S: Duration = Duration::from_secs(1);
const US: Duration = Duration::from_micros(1);

/// The limits of every case: `fw` 5 per aligned minute, `sw` 6 per sliding minute, `sl`
/// 4 per minute exactly, `g` GCRA 6 per minute with a burst of 5.
fn limits() -> Vec<Limit> {
    vec![
        Limit::new("fw", Quota::per_minute(5)).algorithm(Algorithm::fixed_window()),
        Limit::new("sw", Quota::per_minute(6)).algorithm(Algorithm::SlidingWindow),
        Limit::new("sl", Quota::per_minute(4)).algorithm(Algorithm::SlidingLog),
        Limit::new("g", Quota::per_minute(6).burst(5)),
    ]
}

fn limiter<St: Store>(store: St) -> Limiter {
    limits()
        .into_iter()
        .fold(Limiter::builder(store), |b, l| b.limit(l.spec().clone()))
        .build()
        .unwrap()
}

async fn ok(
    d: impl std::future::Future<Output = Result<LimitDecision, LimiterError>>,
) -> LimitDecision {
    d.await.expect("a configured limit")
}

/// (allowed, units left, retry after, next after) of a decision.
fn state(d: &LimitDecision) -> (bool, Option<u64>, Option<Duration>, Option<Duration>) {
    (
        d.allowed(),
        d.remaining(),
        d.retry_after(),
        d.outcome().and_then(|o| o.next_after()),
    )
}

/// A fixed window admits its limit, refuses until the boundary (not a microsecond less),
/// then starts afresh; a cost above the limit never passes.
async fn fixed_window_refuses_until_the_boundary(l: &Limiter, clock: &FakeClock, key: &str) {
    clock.advance(10 * S);
    for left in (0..5).rev() {
        let d = ok(l.check("fw", key, 1)).await;
        assert_eq!(state(&d), (true, Some(left), None, Some(50 * S)));
    }
    let d = ok(l.check("fw", key, 1)).await;
    assert_eq!(state(&d), (false, Some(0), Some(50 * S), Some(50 * S)));
    assert!(
        ok(l.check("fw", key, 6))
            .await
            .outcome()
            .unwrap()
            .is_never()
    );
    clock.advance(50 * S - US);
    assert_eq!(ok(l.check("fw", key, 1)).await.retry_after(), Some(US));
    clock.advance(US);
    let d = ok(l.check("fw", key, 2)).await;
    assert_eq!(state(&d), (true, Some(3), None, Some(60 * S)));
}

/// A refund gives back up to the use of the current window; a refund of an absent key
/// creates nothing; reset clears.
async fn fixed_window_refund_gives_back_at_most_the_used_count(
    l: &Limiter,
    clock: &FakeClock,
    key: &str,
) {
    clock.advance(10 * S);
    ok(l.check("fw", key, 3)).await;
    let d = ok(l.refund("fw", key, 1)).await;
    assert_eq!(d.remaining(), Some(3));
    let d = ok(l.refund("fw", key, 5)).await;
    assert_eq!(state(&d), (true, Some(5), None, None));
    let other = format!("{key}-absent");
    assert_eq!(
        ok(l.refund("fw", other.as_str(), 2)).await.remaining(),
        Some(5)
    );
    ok(l.check("fw", key, 4)).await;
    assert_eq!(ok(l.reset("fw", key)).await.remaining(), Some(5));
    assert_eq!(ok(l.peek("fw", key)).await.remaining(), Some(5));
}

/// A penalty is debt that each boundary pays `L` of; a block fills every window it
/// touches, so it ends at the boundary after its end.
async fn fixed_window_penalty_and_block(l: &Limiter, clock: &FakeClock, key: &str) {
    clock.advance(10 * S);
    // 12 used: one unit is back two boundaries later (12 − 5 − 5 = 2 ≤ 4).
    let d = ok(l.penalize("fw", key, 12)).await;
    assert_eq!(state(&d), (true, Some(0), None, Some(110 * S)));
    assert_eq!(ok(l.check("fw", key, 1)).await.retry_after(), Some(110 * S));
    assert_eq!(ok(l.reset("fw", key)).await.remaining(), Some(5));
    // Blocked for 70 s from second 10: windows [0, 60) and [60, 120) are full.
    ok(l.block("fw", key, 70 * S)).await;
    assert_eq!(ok(l.check("fw", key, 1)).await.retry_after(), Some(110 * S));
    clock.advance(110 * S);
    assert!(ok(l.check("fw", key, 1)).await.allowed());
}

/// A sliding window weighs the previous window by the part of it still inside the
/// sliding window; refund and reset work, penalties and blocks are refused.
async fn sliding_window_weighs_the_previous_window(l: &Limiter, clock: &FakeClock, key: &str) {
    for _ in 0..6 {
        assert!(ok(l.check("sw", key, 1)).await.allowed());
    }
    clock.advance(60 * S);
    // Weight 6 at the start of the next window: one unit fits when it is 5, 10 s in.
    let d = ok(l.check("sw", key, 1)).await;
    assert_eq!(state(&d), (false, Some(0), Some(10 * S), Some(10 * S)));
    clock.advance(10 * S - US);
    assert!(!ok(l.check("sw", key, 1)).await.allowed());
    clock.advance(US);
    assert!(ok(l.check("sw", key, 1)).await.allowed());
    assert_eq!(ok(l.refund("sw", key, 1)).await.remaining(), Some(1));
    assert_eq!(ok(l.reset("sw", key)).await.remaining(), Some(6));
    for unsupported in [
        l.penalize("sw", key, 1).await.unwrap_err(),
        l.block("sl", key, S).await.unwrap_err(),
    ] {
        assert!(
            matches!(unsupported, LimiterError::Unsupported { .. }),
            "{unsupported}"
        );
    }
}

/// A sliding log admits at most `L` in any minute: a unit comes back exactly one window
/// after it was admitted.
async fn sliding_log_is_exact(l: &Limiter, clock: &FakeClock, key: &str) {
    ok(l.check("sl", key, 2)).await;
    clock.advance(20 * S);
    ok(l.check("sl", key, 2)).await;
    clock.advance(S);
    let d = ok(l.check("sl", key, 1)).await;
    assert_eq!(state(&d), (false, Some(0), Some(39 * S), Some(39 * S)));
    // Three units wait for both entries.
    assert_eq!(ok(l.check("sl", key, 3)).await.retry_after(), Some(59 * S));
    clock.advance(39 * S);
    let d = ok(l.check("sl", key, 2)).await;
    assert_eq!(state(&d), (true, Some(0), None, Some(20 * S)));
    assert_eq!(ok(l.refund("sl", key, 1)).await.remaining(), Some(1));
    assert_eq!(ok(l.reset("sl", key)).await.remaining(), Some(4));
}

/// Limits of four algorithms in one call: refused by the sliding log, nothing is taken
/// from the others; then all four pass and each takes its cost.
async fn mixed_algorithms_are_all_or_nothing(l: &Limiter, clock: &FakeClock, key: &str) {
    clock.advance(S);
    ok(l.check("sl", key, 4)).await;
    let all = ["g", "fw", "sw", "sl"].map(|name| (name, key, 1));
    let d = l.check_all(all).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.violated().map(|v| v.name()).collect::<Vec<_>>(), ["sl"]);
    assert_eq!(d.retry_after(), Some(60 * S));
    let left: Vec<_> = d.limits().map(|l| l.remaining()).collect();
    assert_eq!(left, [Some(5), Some(5), Some(6), Some(0)]);
    ok(l.reset("sl", key)).await;
    let d = l.check_all(all).await.unwrap();
    assert!(d.allowed());
    let left: Vec<_> = d.limits().map(|l| l.remaining()).collect();
    assert_eq!(left, [Some(4), Some(4), Some(5), Some(3)]);
}

/// Pins a bug: a check whose clock reading fell in the window before the key's (a thread
/// that read the time just before a boundary and wrote after another had moved the key
/// on; a core, or an instance's caller time, a hair behind) wrote its window index back
/// over the newer one, so the newer window started over empty and granted its limit again.
async fn a_check_that_read_the_clock_before_a_window_boundary_does_not_rewind_the_window(
    l: &Limiter,
    clock: &FakeClock,
    key: &str,
) {
    for (limit, allowed) in [("fw", 5), ("sw", 6)] {
        clock.set(START + 70 * S); // 10 s into the second window
        for _ in 0..2 {
            assert!(ok(l.check(limit, key, 1)).await.allowed());
        }
        clock.set(START + 59 * S); // a reading taken in the first window
        assert!(ok(l.check(limit, key, 1)).await.allowed(), "{limit}");
        clock.set(START + 70 * S);
        let mut more = 0;
        while ok(l.check(limit, key, 1)).await.allowed() {
            more += 1;
        }
        assert_eq!(
            more,
            allowed - 3,
            "{limit}: the second window holds all three"
        );
    }
    // A lagging check is judged as if it came at the start of the key's window, never by
    // the older window's end: there a sliding window weighs the previous window as a
    // whole. 4 used in the first window, 1 in the second; 10 s into the second window
    // they weigh 4 × 50/60 + 1 = 4.33 of 6.
    let key = format!("{key}-weight");
    clock.set(START + 30 * S);
    for _ in 0..4 {
        assert!(ok(l.check("sw", key.as_str(), 1)).await.allowed());
    }
    clock.set(START + 70 * S);
    assert!(ok(l.check("sw", key.as_str(), 1)).await.allowed());
    // Read in the first window, 1 s before its end: there the first window would weigh
    // almost nothing; at the second window's start it weighs 4, and 4 + 1 + 2 > 6.
    clock.set(START + 59 * S);
    assert!(!ok(l.check("sw", key.as_str(), 2)).await.allowed());
    clock.set(START + 70 * S);
    assert!(
        ok(l.check("sw", key.as_str(), 1)).await.allowed(),
        "4.33 + 1 fits"
    );
    assert!(
        !ok(l.check("sw", key.as_str(), 1)).await.allowed(),
        "5.33 + 1 does not"
    );
}

macro_rules! cases {
    ($make:expr) => {
        cases!(@each $make;
            fixed_window_refuses_until_the_boundary,
            fixed_window_refund_gives_back_at_most_the_used_count,
            fixed_window_penalty_and_block,
            sliding_window_weighs_the_previous_window,
            sliding_log_is_exact,
            mixed_algorithms_are_all_or_nothing,
            a_check_that_read_the_clock_before_a_window_boundary_does_not_rewind_the_window,
        );
    };
    (@each $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let (limiter, clock) = $make;
                super::$case(&limiter, &clock, stringify!($case)).await;
            }
        )*
    };
}

mod memory {
    use super::*;

    fn make() -> (Limiter, FakeClock) {
        let clock = FakeClock::at(START);
        (limiter(MemoryStore::with_clock(clock.clone())), clock)
    }

    cases!(make());
}

#[cfg(feature = "redis")]
mod redis_harness {
    use std::sync::OnceLock;

    use super::support::redis::RedisServer;
    use super::*;
    use tollgate::store::RedisStore;

    pub(crate) fn server() -> &'static RedisServer {
        static SERVER: OnceLock<RedisServer> = OnceLock::new();
        SERVER.get_or_init(RedisServer::start)
    }

    #[cfg(feature = "redis-cluster")]
    pub(crate) fn cluster() -> &'static super::support::redis::RedisCluster {
        static CLUSTER: OnceLock<super::support::redis::RedisCluster> = OnceLock::new();
        CLUSTER.get_or_init(|| super::support::redis::RedisCluster::start(3))
    }

    /// A store on its own connection with `clock` as caller time; a prefix per test
    /// process run, so that keys of an earlier run cannot meet this one.
    pub(crate) async fn single(clock: &FakeClock) -> RedisStore {
        let conn = server().client().get_connection_manager().await.unwrap();
        RedisStore::new(conn)
            .caller_time(clock.clone())
            .timeout(Duration::from_secs(5))
    }

    pub(crate) async fn make() -> (Limiter, FakeClock) {
        let clock = FakeClock::at(START);
        (limiter(single(&clock).await), clock)
    }

    #[cfg(feature = "redis-cluster")]
    pub(crate) async fn make_cluster() -> (Limiter, FakeClock) {
        let clock = FakeClock::at(START);
        let store = RedisStore::cluster(cluster().connection().await)
            .caller_time(clock.clone())
            .timeout(Duration::from_secs(5));
        (limiter(store), clock)
    }
}

#[cfg(feature = "redis")]
mod redis_server {
    use super::*;

    cases!(super::redis_harness::make().await);

    /// A random phase is a function of the limit's name and the key: two instances
    /// sharing Redis (and a memory store, which shares nothing) place a key's windows
    /// alike, and different keys get different windows.
    #[tokio::test]
    async fn fixed_window_phase_is_stable_across_two_redis_sharing_stores() {
        let clock = FakeClock::at(START);
        let build = |store| {
            Limiter::builder(store)
                .limit(
                    tollgate::LimitSpec::new("phase", Quota::per_minute(3))
                        .algorithm(Algorithm::fixed_window_random()),
                )
                .build()
                .unwrap()
        };
        let a = build(super::redis_harness::single(&clock).await);
        let b = build(super::redis_harness::single(&clock).await);
        let memory = Limiter::builder(MemoryStore::with_clock(clock.clone()))
            .limit(
                tollgate::LimitSpec::new("phase", Quota::per_minute(3))
                    .algorithm(Algorithm::fixed_window_random()),
            )
            .build()
            .unwrap();
        let mut waits = std::collections::BTreeSet::new();
        for k in 0..20 {
            let key = format!("client-{k}");
            for _ in 0..3 {
                assert!(ok(a.check("phase", key.as_str(), 1)).await.allowed());
                assert!(ok(memory.check("phase", key.as_str(), 1)).await.allowed());
            }
            let from_b = ok(b.check("phase", key.as_str(), 1)).await;
            let from_memory = ok(memory.check("phase", key.as_str(), 1)).await;
            assert!(!from_b.allowed());
            assert_eq!(from_b.retry_after(), from_memory.retry_after(), "{key}");
            waits.insert(from_b.retry_after().unwrap());
        }
        assert!(
            waits.len() >= 15,
            "phases spread over the minute: {waits:?}"
        );
    }
}

#[cfg(feature = "redis-cluster")]
mod redis_cluster {
    cases!(super::redis_harness::make_cluster().await);
}

/// The headers of a fixed window: `q` its limit, `w` its length, `r` what is left, `t`
/// the time to the boundary; `Retry-After` on a refusal.
#[tokio::test]
async fn fixed_window_headers_are_the_windows() {
    let clock = FakeClock::at(START + 45 * S);
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(clock.clone()))
        .limit(
            Limit::new("calls", Quota::per_minute(2))
                .key(PeerIp::new())
                .algorithm(Algorithm::fixed_window()),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer);
    let req = || support::get("/", "192.0.2.7");
    let r = send(&app, req()).await;
    assert_eq!(
        header(r.headers(), "ratelimit-policy").unwrap(),
        r#""calls";q=2;w=60"#
    );
    assert_eq!(
        header(r.headers(), "ratelimit").unwrap(),
        r#""calls";r=1;t=15"#
    );
    send(&app, req()).await;
    let r = send(&app, req()).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(r.headers(), "retry-after").unwrap(), "15");
    assert_eq!(
        header(r.headers(), "ratelimit").unwrap(),
        r#""calls";r=0;t=15"#
    );
}

/// Window limits are refused at build time when their quota cannot be a window.
#[test]
fn window_misconfigurations_are_config_errors() {
    let build = |limits: Vec<Limit>| {
        limits
            .into_iter()
            .fold(RateLimitLayer::builder(MemoryStore::new()), |b, l| {
                b.limit(l)
            })
            .build()
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let log = |n| Limit::new("log", Quota::per_hour(n)).algorithm(Algorithm::SlidingLog);
    assert_eq!(build(vec![log(1_000)]), Ok(()));
    let e = build(vec![log(1_001)]).unwrap_err();
    assert!(e.contains("at most 1000"), "{e}");
    let e = build(vec![
        Limit::new("w", Quota::per_minute(5).burst(10)).algorithm(Algorithm::fixed_window()),
    ])
    .unwrap_err();
    assert!(e.contains("burst"), "{e}");
    let e = build(vec![
        Limit::new("same", Quota::per_minute(5)).algorithm(Algorithm::fixed_window()),
        Limit::new("same", Quota::per_minute(5)).algorithm(Algorithm::SlidingLog),
    ])
    .unwrap_err();
    assert!(e.contains("count alike"), "{e}");
    let e = build(vec![
        Limit::new("dyn", Quota::per_minute(5))
            .algorithm(Algorithm::SlidingWindow)
            .quota_by(|_| None),
    ])
    .unwrap_err();
    assert!(e.contains("quota_by"), "{e}");
}

/// The memory store forgets a window key once its state is worth nothing (its window, or
/// for a sliding window the next one, or for a log its newest entry's window, is over),
/// after the idle grace (1 s here), and not before.
#[test]
fn the_memory_store_sweeps_window_state_once_it_is_worthless() {
    use tollgate::key::Key;
    use tollgate::store::{Checked, Item};
    // (algorithm, seconds after the checks at which the keys must still be there, and
    // at which they must be gone)
    let cases = [
        // The window [START, START + 60 s) ends 50 s after the checks; + the grace.
        (Algorithm::fixed_window(), 50, 51),
        // A sliding window weighs it until the end of the next window.
        (Algorithm::SlidingWindow, 110, 111),
        // A log entry counts for a minute.
        (Algorithm::SlidingLog, 60, 61),
        // A random phase: each key's window ends within the minute after the checks; the
        // sweeper, not knowing the key's phase, may keep it one window longer.
        (Algorithm::fixed_window_random(), 1, 121),
    ];
    for (algorithm, kept, gone) in cases {
        let clock = FakeClock::at(START + 10 * S);
        let store = MemoryStore::with_clock(clock.clone()).idle_grace(S);
        let table = store.table("swept");
        for k in 0..10 {
            let item =
                Item::new(&table, Key::from_part(k), Quota::per_minute(5), 1).algorithm(algorithm);
            let Checked::Ready(s) = store.check(&[item]) else {
                unreachable!()
            };
            assert!(s[0].outcome().unwrap().is_allowed());
        }
        assert_eq!(store.len(), 10);
        clock.advance(kept * S);
        assert_eq!(store.sweep(), 0, "{algorithm:?} after {kept} s");
        clock.set(START + 10 * S + gone * S);
        assert_eq!(store.sweep(), 10, "{algorithm:?} after {gone} s");
        assert_eq!(store.len(), 0);
    }
}
