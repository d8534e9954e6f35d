//! Reservations through the `Limiter` handle: tokens taken now, work
//! started later; cancelled or dropped before their instant, the tokens go back once.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::clock::FakeClock;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, LimitSpec, Limiter, LimiterError, Quota, Reservation};

const T: Duration = Duration::from_millis(100);

fn limiter<St: Store>(store: St, limits: Vec<LimitSpec>) -> Limiter {
    limits
        .into_iter()
        .fold(Limiter::builder(store), |b, l| b.limit(l))
        .build()
        .unwrap()
}

/// 10 per second, a burst of 1: one token every 100 ms.
fn one_per_t() -> LimitSpec {
    LimitSpec::new("paced", Quota::per_second(10).burst(1))
}

/// The wait of a reservation's first limit.
fn first_wait(r: &Reservation) -> Duration {
    r.decision()
        .limits()
        .next()
        .unwrap()
        .outcome()
        .unwrap()
        .wait()
}

/// `n` reservations of `paced` made at once from `n` tasks: their waits, sorted. They keep
/// their tokens.
async fn concurrent_waits(l: &Limiter, n: usize) -> Vec<Duration> {
    let start = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (l, start) = (l.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let r = l.reserve("paced", "k", 1, Duration::from_secs(60)).await;
                let r = r.unwrap();
                assert!(r.is_granted());
                let wait = first_wait(&r);
                std::mem::forget(r);
                wait
            })
        })
        .collect();
    let mut waits = Vec::new();
    for t in tasks {
        waits.push(t.await.unwrap());
    }
    waits.sort();
    waits
}

async fn waits(l: &Limiter, n: usize, max_wait: Duration) -> Vec<Duration> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = l.reserve("paced", "k", 1, max_wait).await.unwrap();
        assert!(r.is_granted());
        out.push(first_wait(&r));
        std::mem::forget(r); // keep the tokens: this helper only reads the schedule
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_reservations_get_distinct_instants_spaced_by_t() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let l = limiter(MemoryStore::with_clock(clock), vec![one_per_t()]);
    let waits = concurrent_waits(&l, 64).await;
    // The store's clock stands still: every reservation got its own slot, T apart.
    let expected: Vec<Duration> = (0..64).map(|i| T * i).collect();
    assert_eq!(waits, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_the_real_clock_no_reservation_starts_early() {
    let t = Duration::from_millis(5);
    let l = limiter(
        MemoryStore::new(),
        vec![LimitSpec::new("paced", Quota::new(1, t).unwrap())],
    );
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move {
                let r = l.reserve("paced", "k", 1, Duration::from_secs(5)).await;
                let r = r.unwrap();
                let ready_at = r.ready_at();
                r.wait().await.expect("granted");
                let now = tokio::time::Instant::now();
                assert!(now >= ready_at, "woke before its instant");
                Instant::now()
            })
        })
        .collect();
    let mut started = Vec::new();
    for task in tasks {
        started.push(task.await.unwrap());
    }
    started.sort();
    // The k-th start comes no sooner than k emission intervals after the first request:
    // at most 1 + d/T starts in any [t0, t0 + d].
    for (k, s) in started.iter().enumerate() {
        assert!(
            s.duration_since(t0) >= t * k as u32,
            "start {k} after {:?}, before {:?}",
            s.duration_since(t0),
            t * k as u32
        );
    }
}

#[tokio::test]
async fn beyond_max_wait_a_reservation_is_refused_and_takes_nothing() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let l = limiter(MemoryStore::with_clock(clock), vec![one_per_t()]);
    assert_eq!(
        waits(&l, 4, Duration::from_millis(300)).await,
        [Duration::ZERO, T, 2 * T, 3 * T]
    );
    let r = l
        .reserve("paced", "k", 1, Duration::from_millis(399))
        .await
        .unwrap();
    assert!(!r.is_granted());
    assert_eq!(r.decision().retry_after(), Some(4 * T));
    assert!(!r.cancel(), "nothing to give back");
    // Nothing was taken: the next slot is still 4T away.
    assert_eq!(waits(&l, 1, Duration::from_secs(1)).await, [4 * T]);
    // A refused reservation's `wait` answers at once, with the decision.
    let r = l.reserve("paced", "k", 1, Duration::ZERO).await.unwrap();
    assert!(r.wait().await.is_err());
}

#[tokio::test]
async fn cancelling_or_dropping_gives_the_tokens_back_exactly_once() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let l = limiter(MemoryStore::with_clock(clock), vec![one_per_t()]);
    let max = Duration::from_secs(10);
    let first = l.reserve("paced", "k", 1, max).await.unwrap();
    let mut waiting = Vec::new();
    for _ in 0..7 {
        waiting.push(l.reserve("paced", "k", 1, max).await.unwrap());
    }
    assert_eq!(
        waiting[6]
            .decision()
            .limits()
            .next()
            .unwrap()
            .outcome()
            .unwrap()
            .wait(),
        7 * T
    );
    // The four last waiters give up: two cancel, two are dropped.
    let d = waiting.pop().unwrap();
    drop(d);
    let c = waiting.pop().unwrap();
    assert!(c.cancel(), "before its instant: given back");
    drop(waiting.pop());
    assert!(waiting.pop().unwrap().cancel());
    // Their four slots are free again, exactly: the next ones take 4T..7T, then 8T.
    assert_eq!(waits(&l, 5, max).await, [4 * T, 5 * T, 6 * T, 7 * T, 8 * T]);
    // The first one's instant has come (it waits 0): cancelling it changes nothing.
    assert!(!first.cancel());
    assert_eq!(waits(&l, 1, max).await, [9 * T]);
    drop(waiting);
}

#[tokio::test]
async fn a_waiting_future_dropped_before_its_instant_gives_the_tokens_back() {
    let l = limiter(MemoryStore::new(), vec![one_per_t()]);
    let max = Duration::from_secs(10);
    let _now = l.reserve("paced", "k", 1, max).await.unwrap();
    let later = l.reserve("paced", "k", 1, max).await.unwrap();
    assert!(later.wait_time() > Duration::from_millis(50));
    // The caller gives up after 10 ms (a timeout around the wait).
    let r = tokio::time::timeout(Duration::from_millis(10), later.wait()).await;
    assert!(r.is_err(), "still waiting after 10 ms");
    // Its token went back: the next reservation has the slot it had.
    let next = l.reserve("paced", "k", 1, max).await.unwrap();
    let wait = next.wait_time();
    assert!(
        wait <= T && wait > Duration::from_millis(50),
        "one T from the first, not two: {wait:?}"
    );
}

#[tokio::test]
async fn max_reserved_caps_the_tokens_reserved_ahead() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let l = limiter(
        MemoryStore::with_clock(clock),
        vec![one_per_t().max_reserved(3)],
    );
    let max = Duration::from_secs(3_600);
    // The burst, then three reserved ahead: 0, T, 2T, 3T.
    assert_eq!(waits(&l, 4, max).await, [Duration::ZERO, T, 2 * T, 3 * T]);
    let r = l.reserve("paced", "k", 1, max).await.unwrap();
    assert!(!r.is_granted(), "a fourth reserved token is over the cap");
    // A fixed window counts no reserved tokens: a configuration error.
    let err = Limiter::builder(MemoryStore::new())
        .limit(
            LimitSpec::new("w", Quota::per_second(5))
                .algorithm(Algorithm::fixed_window())
                .max_reserved(2),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), r#"limits["w"].max_reserved"#);
}

#[tokio::test]
async fn several_limits_are_reserved_all_or_nothing_and_wait_for_the_longest() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let l = limiter(
        MemoryStore::with_clock(clock),
        vec![
            one_per_t(),
            LimitSpec::new("slow", Quota::per_second(2).burst(1)), // one per 500 ms
        ],
    );
    let max = Duration::from_millis(600);
    let calls = |k| [("paced", k, 1), ("slow", k, 1)];
    let a = l.reserve_all(calls("k"), max).await.unwrap();
    let b = l.reserve_all(calls("k"), max).await.unwrap();
    assert!(a.is_granted() && b.is_granted());
    assert_eq!(
        b.decision()
            .limit("slow")
            .unwrap()
            .outcome()
            .unwrap()
            .wait(),
        5 * T
    );
    assert!(
        b.wait_time() > 4 * T,
        "the longest wait: {:?}",
        b.wait_time()
    );
    // The third would wait 1 s for "slow": refused, and "paced" keeps its token.
    let c = l.reserve_all(calls("k"), max).await.unwrap();
    assert!(!c.is_granted());
    let paced = l.peek("paced", "k").await.unwrap();
    assert_eq!(
        paced.outcome().unwrap().wait(),
        T,
        "only two taken from `paced`"
    );
    std::mem::forget((a, b));
}

#[tokio::test]
async fn a_fixed_window_reserves_units_of_the_following_windows() {
    // 3 per second, windows aligned on the second; the clock at the start of a window.
    let clock = FakeClock::at(Duration::from_secs(1_700_000_000));
    let store = MemoryStore::with_clock(clock);
    let l = limiter(
        store,
        vec![LimitSpec::new("w", Quota::per_second(3)).algorithm(Algorithm::fixed_window())],
    );
    let max = Duration::from_millis(2_000);
    let mut got = Vec::new();
    for _ in 0..9 {
        let r = l.reserve("w", "k", 1, max).await.unwrap();
        assert!(r.is_granted());
        got.push(first_wait(&r));
        std::mem::forget(r);
    }
    let s = Duration::from_secs(1);
    assert_eq!(
        got,
        [
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
            s,
            s,
            s,
            2 * s,
            2 * s,
            2 * s
        ]
    );
    // The window after next is full too: a tenth would start in 3 s.
    let r = l.reserve("w", "k", 1, max).await.unwrap();
    assert!(!r.is_granted());
    assert_eq!(r.decision().retry_after(), Some(3 * s));
}

#[tokio::test]
async fn sliding_limits_cannot_reserve() {
    let l = limiter(
        MemoryStore::new(),
        vec![
            LimitSpec::new("sw", Quota::per_second(3)).algorithm(Algorithm::SlidingWindow),
            LimitSpec::new("log", Quota::per_second(3)).algorithm(Algorithm::SlidingLog),
        ],
    );
    for name in ["sw", "log"] {
        let err = l
            .reserve(name, "k", 1, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                LimiterError::Unsupported {
                    operation: "reserve",
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[cfg(feature = "redis")]
mod redis_store {
    use super::*;

    use crate::support::redis::RedisServer;
    use tollgate::store::RedisStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn redis_reservations_are_atomic_and_cancellations_give_back() {
        let server = RedisServer::start();
        let clock = FakeClock::at(Duration::from_secs(1_700_000_000));
        let conn = server.client().get_connection_manager().await.unwrap();
        // A generous timeout: 64 reservations at once on a loaded machine must all be
        // Redis's (a call past the 50 ms default is decided by the failure policy).
        let store = RedisStore::new(conn)
            .caller_time(clock.clone())
            .timeout(Duration::from_secs(5));
        let l = limiter(store, vec![one_per_t()]);
        let got = concurrent_waits(&l, 64).await;
        assert_eq!(got, (0..64).map(|i| T * i).collect::<Vec<_>>());
        // The last slot given back comes back to the next reservation.
        let r = l
            .reserve("paced", "k", 1, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(first_wait(&r), 64 * T);
        assert!(r.cancel());
        // The refund is spawned (Redis answers later): wait for it to land.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = l
                .reserve("paced", "k", 1, Duration::from_secs(60))
                .await
                .unwrap();
            let wait = first_wait(&r);
            std::mem::forget(r);
            if wait == 64 * T {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the cancelled slot never came back"
            );
            // Not yet given back: this one took slot 65; give it back too and retry.
            let back = l.refund("paced", "k", 1).await.unwrap();
            assert!(back.allowed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_shadow_limit_never_holds_a_reservation_back() {
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let l = limiter(
        MemoryStore::with_clock(clock),
        vec![
            one_per_t(),
            LimitSpec::new("trial", Quota::per_minute(1)).shadow(),
        ],
    );
    let max = Duration::from_secs(60);
    let calls = |k| [("paced", k, 1), ("trial", k, 1)];
    let a = l.reserve_all(calls("k"), max).await.unwrap();
    assert_eq!(a.wait_time(), Duration::ZERO);
    // "trial" is over (a shadow limit reports it), "paced" has a token in T: that is
    // the wait, not trial's minute.
    let b = l.reserve_all(calls("k"), max).await.unwrap();
    assert!(b.is_granted());
    assert!(!b.decision().limit("trial").unwrap().allowed());
    assert!(
        b.wait_time() <= T && b.wait_time() > T / 2,
        "{:?}",
        b.wait_time()
    );
    std::mem::forget((a, b));
}
