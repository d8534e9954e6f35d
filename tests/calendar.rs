//! Calendar quotas (`Algorithm::Calendar`, feature `calendar`) through the [`Limiter`]
//! handle and the layer, on every store: `MemoryStore` on a fake clock, a real Redis server
//! and a real 3-master Redis Cluster (the same fake clock as caller time). Every case
//! asserts exact numbers: a window resets at the local boundary, not a microsecond
//! earlier, across a 23-hour day and a leap February.

mod support;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::{header, send};
use tollgate::calendar::Zone;
use tollgate::clock::FakeClock;
use tollgate::key::PeerIp;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, Limit, LimitDecision, Limiter, LimiterError, Quota, RateLimitLayer};

const S: Duration = Duration::from_secs(1);
const US: Duration = Duration::from_micros(1);
const H: Duration = Duration::from_secs(3_600);

/// 2026-03-29 00:30 in Berlin (+01:00): the day its clocks skip 02:00 to 03:00.
const BERLIN_DST_DAY: Duration = Duration::from_secs(1_774_740_600);
/// 2028-02-28 23:00 in New York: a leap year, a day before the 29th.
const NEW_YORK_FEB_28: Duration = Duration::from_secs(1_835_409_600);

fn zone(name: &str) -> Zone {
    Zone::get(name).unwrap()
}

/// `daily` 3 per Berlin day, `monthly` 2 per New York month, `hourly` 2 per Kolkata hour.
fn limits() -> Vec<Limit> {
    vec![
        Limit::new("daily", Quota::per_day(3))
            .algorithm(Algorithm::calendar(zone("Europe/Berlin"))),
        Limit::new("monthly", Quota::per_month(2))
            .algorithm(Algorithm::calendar(zone("America/New_York"))),
        Limit::new("hourly", Quota::per_hour(2))
            .algorithm(Algorithm::calendar(zone("Asia/Kolkata"))),
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

/// (allowed, units left, retry after, reset after) of a decision.
fn state(d: &LimitDecision) -> (bool, Option<u64>, Option<Duration>, Option<Duration>) {
    (
        d.allowed(),
        d.remaining(),
        d.retry_after(),
        d.outcome().map(|o| o.reset_after()),
    )
}

/// A 23-hour day: the quota comes back at the next local midnight, 22.5 h after 00:30,
/// not a microsecond earlier; the next day is 24 hours.
async fn a_day_resets_at_local_midnight_on_a_23_hour_day(
    l: &Limiter,
    clock: &FakeClock,
    key: &str,
) {
    let to_midnight = Duration::from_secs(81_000);
    for left in (0..3).rev() {
        let d = ok(l.check("daily", key, 1)).await;
        assert_eq!(state(&d), (true, Some(left), None, Some(to_midnight)));
    }
    let d = ok(l.check("daily", key, 1)).await;
    assert_eq!(
        state(&d),
        (false, Some(0), Some(to_midnight), Some(to_midnight))
    );
    clock.advance(to_midnight - US);
    assert_eq!(ok(l.check("daily", key, 1)).await.retry_after(), Some(US));
    clock.advance(US);
    let d = ok(l.check("daily", key, 1)).await;
    assert_eq!(state(&d), (true, Some(2), None, Some(24 * H)));
}

/// February 2028 has 29 days: the month ends 25 hours after the 28th's 23:00; March
/// (31 days less the hour of its daylight-saving change) follows.
async fn a_month_resets_on_the_first_after_a_leap_february(
    l: &Limiter,
    clock: &FakeClock,
    key: &str,
) {
    clock.set(NEW_YORK_FEB_28);
    assert!(ok(l.check("monthly", key, 2)).await.allowed());
    let d = ok(l.check("monthly", key, 1)).await;
    assert_eq!(state(&d), (false, Some(0), Some(25 * H), Some(25 * H)));
    clock.advance(24 * H);
    assert_eq!(ok(l.check("monthly", key, 1)).await.retry_after(), Some(H));
    clock.advance(H);
    let d = ok(l.check("monthly", key, 1)).await;
    let march = Duration::from_secs(31 * 86_400) - H;
    assert_eq!(state(&d), (true, Some(1), None, Some(march)));
}

/// Refund, penalize (at most the window's limit: no debt carries over), reset; block and
/// reserve are refused.
async fn operations_on_a_calendar_window(l: &Limiter, clock: &FakeClock, key: &str) {
    let _ = clock;
    let to_midnight = Duration::from_secs(81_000);
    ok(l.check("daily", key, 2)).await;
    assert_eq!(ok(l.refund("daily", key, 1)).await.remaining(), Some(2));
    let d = ok(l.penalize("daily", key, 100)).await;
    assert_eq!(state(&d), (true, Some(0), None, Some(to_midnight)));
    assert_eq!(
        ok(l.check("daily", key, 1)).await.retry_after(),
        Some(to_midnight)
    );
    assert_eq!(ok(l.reset("daily", key)).await.remaining(), Some(3));
    let unsupported = l.block("daily", key, 10 * S).await.unwrap_err();
    assert!(
        matches!(
            unsupported,
            LimiterError::Unsupported {
                operation: "block",
                ..
            }
        ),
        "{unsupported}"
    );
    let r = l.reserve("daily", key, 1, 10 * S).await.unwrap_err();
    assert!(
        matches!(
            r,
            LimiterError::Unsupported {
                operation: "reserve",
                ..
            }
        ),
        "{r}"
    );
}

/// Kolkata (+05:30) hours start at half past the UTC hour.
async fn an_hour_in_a_half_hour_zone(l: &Limiter, clock: &FakeClock, key: &str) {
    // 00:30 UTC is 06:00 in Kolkata.
    clock.set(BERLIN_DST_DAY + H);
    assert!(ok(l.check("hourly", key, 2)).await.allowed());
    assert_eq!(ok(l.check("hourly", key, 1)).await.retry_after(), Some(H));
    clock.advance(H - US);
    assert!(!ok(l.check("hourly", key, 1)).await.allowed());
    clock.advance(US);
    assert!(ok(l.check("hourly", key, 2)).await.allowed());
}

/// A calendar limit mixed with a refusing one takes nothing: all or nothing.
async fn mixed_with_a_refusal_takes_nothing(l: &Limiter, clock: &FakeClock, key: &str) {
    let _ = clock;
    assert!(ok(l.check("monthly", key, 2)).await.allowed());
    let d = l
        .check_all([("daily", key, 1), ("monthly", key, 1)])
        .await
        .unwrap();
    assert!(!d.allowed());
    assert_eq!(ok(l.peek("daily", key)).await.remaining(), Some(3));
}

macro_rules! cases {
    ($make:expr) => {
        cases!(@each $make;
            a_day_resets_at_local_midnight_on_a_23_hour_day,
            a_month_resets_on_the_first_after_a_leap_february,
            operations_on_a_calendar_window,
            an_hour_in_a_half_hour_zone,
            mixed_with_a_refusal_takes_nothing,
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
        let clock = FakeClock::at(BERLIN_DST_DAY);
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

    pub(crate) async fn single(clock: &FakeClock, prefix: &str) -> RedisStore {
        let conn = server().client().get_connection_manager().await.unwrap();
        RedisStore::new(conn)
            .prefix(prefix)
            .caller_time(clock.clone())
            .timeout(Duration::from_secs(5))
    }

    pub(crate) async fn make() -> (Limiter, FakeClock) {
        let clock = FakeClock::at(BERLIN_DST_DAY);
        (limiter(single(&clock, "cal:").await), clock)
    }

    #[cfg(feature = "redis-cluster")]
    pub(crate) async fn make_cluster() -> (Limiter, FakeClock) {
        let clock = FakeClock::at(BERLIN_DST_DAY);
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

    /// The key names its window (its start in Unix seconds) and expires at the window's
    /// end: a write that comes late lands in its own window's key, never the next one's.
    #[tokio::test]
    async fn keys_name_the_window_and_expire_at_its_end() {
        let clock = FakeClock::at(BERLIN_DST_DAY);
        let l = limiter(super::redis_harness::single(&clock, "calkeys:").await);
        ok(l.check("daily", "k", 1)).await;
        let mut conn = super::redis_harness::server().connection().await;
        // The Berlin day 2026-03-29 starts at 2026-03-28T23:00:00Z and ends 23 h later.
        let (start, end) = (1_774_738_800u64, 1_774_821_600u64);
        let key = format!("calkeys:daily:k:{start}");
        // Expires at the window's end on the caller's (fake) clock: 22.5 h from now.
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let left = (end - BERLIN_DST_DAY.as_secs()) as i64 * 1_000;
        assert!((left - 1_000..=left).contains(&ttl), "{ttl}");
        let value: String = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(value, "0:1");
        // A check whose clock read the last microsecond of the day lands in that day: it
        // spends the day's last 2 units, and the window ends 1 µs later. (Told by the
        // decision, not by reading the key: its TTL is then under a millisecond, so Redis
        // may drop it before any `GET` arrives on a busy machine.)
        clock.set(Duration::from_secs(end) - US);
        let d = ok(l.check("daily", "k", 2)).await;
        assert_eq!(state(&d), (true, Some(0), None, Some(US)));
        clock.advance(US);
        let d = ok(l.check("daily", "k", 1)).await;
        assert_eq!((d.allowed(), d.remaining()), (true, Some(2)), "a new day");
        let next: String = redis::cmd("GET")
            .arg(format!("calkeys:daily:k:{end}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(next, "0:1");
    }

    /// With Redis `TIME` (no caller time) the window comes from the system clock: the key
    /// names the current UTC month and lives until its end.
    #[tokio::test]
    async fn with_redis_time_the_key_lives_until_the_month_ends() {
        use tollgate::calendar::Period;
        use tollgate::store::RedisStore;
        let conn = super::redis_harness::server()
            .client()
            .get_connection_manager()
            .await
            .unwrap();
        // A generous timeout: a slow first call (the script loaded) is still Redis's, and
        // writes the key read below.
        let store = RedisStore::new(conn)
            .prefix("caltime:")
            .timeout(Duration::from_secs(5));
        let l = Limiter::builder(store)
            .limit(
                tollgate::LimitSpec::new("m", Quota::per_month(3))
                    .algorithm(Algorithm::calendar(Zone::UTC)),
            )
            .build()
            .unwrap();
        let now_us = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64
        };
        let mut conn = super::redis_harness::server().connection().await;
        loop {
            let before = Period::Month.window(Zone::UTC, now_us());
            let d = ok(l.check("m", "k", 1)).await;
            let after = now_us();
            if Period::Month.window(Zone::UTC, after) != before {
                continue; // the month turned during the check: again, in the new one
            }
            assert!(d.allowed());
            let key = format!("caltime:m:k:{}", before.id());
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            let left = ((before.end_us - after) / 1_000) as i64;
            // Redis's clock and ours agree within a few seconds on one machine.
            assert!(
                (left - 5_000..=left + 5_000).contains(&ttl),
                "{ttl} vs {left}"
            );
            let reset = d.outcome().unwrap().reset_after().as_micros() as i64;
            assert!((reset - (before.end_us - after) as i64).abs() < 5_000_000);
            break;
        }
    }

    /// Two stores sharing Redis share the window; the memory store decides alike.
    #[tokio::test]
    async fn two_instances_share_a_window_and_match_memory() {
        let clock = FakeClock::at(BERLIN_DST_DAY);
        let a = limiter(super::redis_harness::single(&clock, "calshare:").await);
        let b = limiter(super::redis_harness::single(&clock, "calshare:").await);
        let memory = limiter(MemoryStore::with_clock(clock.clone()));
        for i in 0..3 {
            let l = if i % 2 == 0 { &a } else { &b };
            assert!(ok(l.check("daily", "k", 1)).await.allowed());
            assert!(ok(memory.check("daily", "k", 1)).await.allowed());
        }
        let from_b = ok(b.check("daily", "k", 1)).await;
        let from_memory = ok(memory.check("daily", "k", 1)).await;
        assert_eq!(state(&from_b), state(&from_memory));
        assert!(!from_b.allowed());
    }
}

#[cfg(feature = "redis-cluster")]
mod redis_cluster {
    cases!(super::redis_harness::make_cluster().await);
}

/// The headers: `t` the seconds to the local boundary, `w` the unit's nominal length (a
/// month: 31 days), `Retry-After` the time to the boundary.
#[tokio::test]
async fn headers_say_the_time_to_the_boundary() {
    let clock = FakeClock::at(NEW_YORK_FEB_28);
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(clock.clone()))
        .limit(
            Limit::new("monthly", Quota::per_month(2))
                .key(PeerIp::new())
                .algorithm(Algorithm::calendar(zone("America/New_York"))),
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
        r#""monthly";q=2;w=2678400"#
    );
    assert_eq!(
        header(r.headers(), "ratelimit").unwrap(),
        r#""monthly";r=1;t=90000"#
    );
    send(&app, req()).await;
    let r = send(&app, req()).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(r.headers(), "retry-after").unwrap(), "90000");
}

/// Calendar limits are refused at build time where they cannot work, with the field.
#[test]
fn calendar_misconfigurations_are_config_errors() {
    let build = |limit: Limit| {
        RateLimitLayer::builder(MemoryStore::new())
            .limit(limit)
            .build()
            .map(|_| ())
            .map_err(|e| (e.field().to_owned(), e.to_string()))
    };
    let berlin = Algorithm::calendar(zone("Europe/Berlin"));
    // A month has no fixed length: only a calendar limit counts per month.
    let (field, e) = build(Limit::new("m", Quota::per_month(5))).unwrap_err();
    assert_eq!(field, r#"limits["m"].quota"#, "{e}");
    assert!(e.contains("calendar"), "{e}");
    let (field, e) =
        build(Limit::new("m", Quota::per_month(5)).algorithm(Algorithm::fixed_window()))
            .unwrap_err();
    assert_eq!(field, r#"limits["m"].quota"#, "{e}");
    // A calendar limit counts per h, d, week or month.
    let (field, e) = build(Limit::new("c", Quota::per_minute(5)).algorithm(berlin)).unwrap_err();
    assert_eq!(field, r#"limits["c"].quota"#, "{e}");
    let (field, _) =
        build(Limit::new("c", Quota::per_day(5).burst(6)).algorithm(berlin)).unwrap_err();
    assert_eq!(field, r#"limits["c"].quota"#);
    let (field, _) = build(
        Limit::new("c", Quota::per_day(5))
            .algorithm(berlin)
            .delay(Duration::from_secs(1), 10),
    )
    .unwrap_err();
    assert_eq!(field, r#"limits["c"].on_limit"#);
    let (field, _) = build(
        Limit::new("c", Quota::per_day(5))
            .algorithm(berlin)
            .lease(tollgate::Lease::tokens(2)),
    )
    .unwrap_err();
    assert_eq!(field, r#"limits["c"].lease"#);
    for ok in [
        Quota::per_hour(5),
        Quota::per_day(5),
        Quota::per_week(5),
        Quota::per_month(5),
        "5/week".parse().unwrap(),
        "5/month".parse().unwrap(),
    ] {
        assert_eq!(build(Limit::new("c", ok).algorithm(berlin)), Ok(()), "{ok}");
    }
    // A week is 7 days for the other algorithms.
    assert_eq!(build(Limit::new("g", Quota::per_week(7))), Ok(()));
    assert_eq!("5/2month".parse::<Quota>().unwrap_err().field(), "period");
    assert_eq!(
        Zone::get("Europe/Nowhere").unwrap_err().field(),
        "time_zone"
    );
}

/// The memory store forgets a calendar key after its window (here 22.5 h after the
/// checks), by the time the longest window of its unit could have ended (a day: 25 h from
/// its start) plus the idle grace, and not before the window ends.
#[test]
fn the_memory_store_sweeps_calendar_state_after_its_window() {
    use tollgate::key::Key;
    use tollgate::store::{Checked, Item};
    let clock = FakeClock::at(BERLIN_DST_DAY);
    let store = MemoryStore::with_clock(clock.clone()).idle_grace(S);
    let table = store.table("swept");
    let berlin = Algorithm::calendar(zone("Europe/Berlin"));
    for k in 0..10 {
        let item = Item::new(&table, Key::from_part(k), Quota::per_day(5), 1).algorithm(berlin);
        let Checked::Ready(s) = store.check(&[item]) else {
            unreachable!()
        };
        assert!(s[0].outcome().unwrap().is_allowed());
    }
    assert_eq!(store.len(), 10);
    clock.advance(Duration::from_secs(81_000));
    assert_eq!(store.sweep(), 0, "at the window's end");
    // The window started at 23:00 UTC, half an hour before the checks: 25 h from there.
    clock.set(BERLIN_DST_DAY + 25 * H - H / 2);
    assert_eq!(store.sweep(), 0);
    clock.advance(S);
    assert_eq!(store.sweep(), 10);
    assert_eq!(store.len(), 0);
}
