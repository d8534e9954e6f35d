//! The [`Limiter`] handle against every store, with one suite of cases written once:
//! `MemoryStore` on a fake clock, a real Redis server and a real 3-master Redis Cluster
//! (both with the same fake clock as caller time). Every case asserts exact numbers.
//!
//! The quota is 6 per minute with a burst of 5: `T` = 10 s, a whole number of microseconds,
//! so both stores compute with the same `T` (ARCHITECTURE.md, "Units of time"). A long `T`
//! also keeps Redis keys alive: they expire (`PX`) in real time when their bucket would be
//! full on the fake clock, so every key written here lives at least 10 real seconds.

mod support;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use http::{Request, StatusCode};
use support::{body_text, send, with_peer};
use tollgate::clock::FakeClock;
use tollgate::key::Header;
use tollgate::store::{MemoryStore, Store};
use tollgate::{
    Limit, LimitDecision, Limiter, LimiterError, Mode, Overall, Quota, RateLimitLayer, Status,
};

/// 6 per minute, burst 5: T = 10 s, tau = 50 s.
const Q: Quota = Quota::per_minute(6).burst(5);
const T: Duration = Duration::from_secs(10);
const BURST: u64 = 5;
const US: Duration = Duration::from_micros(1);
/// Where every fake clock starts: microseconds since the epoch, as Redis expects them.
const START: Duration = Duration::from_secs(1_700_000_000);

/// A store under test, and the fake clock it decides by.
trait Harness {
    type S: Store;

    /// The store (clones share its buckets).
    fn store(&self) -> Self::S;

    /// The clock every decision of the store is made on.
    fn clock(&self) -> &FakeClock;

    /// How many buckets hold state for `key` of `limit`: Redis, `EXISTS` of the bucket
    /// key `tollgate:{limit}:{key}`; memory, every key of this case's fresh store.
    async fn stored(&self, limit: &str, key: &str) -> u64;

    /// A limiter on the store with these limits.
    fn limiter(&self, limits: impl IntoIterator<Item = Limit>) -> Limiter {
        limits
            .into_iter()
            .fold(Limiter::builder(self.store()), |b, l| {
                b.limit(l.spec().clone())
            })
            .build()
            .unwrap()
    }

    fn advance(&self, d: Duration) {
        self.clock().advance(d);
    }
}

async fn ok(
    d: impl std::future::Future<Output = Result<LimitDecision, LimiterError>>,
) -> LimitDecision {
    d.await.expect("a configured limit")
}

/// (allowed, tokens left, retry after) of a decision.
fn state(d: &LimitDecision) -> (bool, Option<u64>, Option<Duration>) {
    (d.allowed(), d.remaining(), d.retry_after())
}

// ---------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------

/// `check` takes tokens down to the burst; the next is refused with the exact wait; a
/// refusal consumes nothing (one token a `T` later, not less).
async fn check_takes_tokens_and_a_refusal_takes_none<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("take", Q)]);
    for left in (0..BURST).rev() {
        let d = ok(limiter.check("take", "alice", 1)).await;
        assert_eq!(state(&d), (true, Some(left), None));
    }
    let refused = ok(limiter.check("take", "alice", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(T)));
    h.advance(T - US);
    let refused = ok(limiter.check("take", "alice", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(US)));
    h.advance(US);
    // The refusals took nothing: exactly the one token that refilled.
    let d = ok(limiter.check("take", "alice", 1)).await;
    assert_eq!(state(&d), (true, Some(0), None));
    let refused = ok(limiter.check("take", "alice", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(T)));
    // A cost above the burst can never pass, and takes nothing.
    let never = ok(limiter.check("take", "bob", 6)).await;
    assert!(never.outcome().unwrap().is_never());
    assert_eq!(state(&never), (false, Some(BURST), None));
    assert_eq!(
        ok(limiter.peek("take", "bob")).await.remaining(),
        Some(BURST)
    );
}

/// A shadow limit reports "would deny" but never refuses a call, and an enforcing limit
/// beside it still consumes.
async fn a_shadow_limit_never_refuses<H: Harness>(h: &H) {
    let shadow_q = Quota::per_minute(6).burst(2);
    let limiter = h.limiter([
        Limit::new("enforced", Q),
        Limit::new("watched", shadow_q).shadow(),
    ]);
    for n in 0..BURST {
        let d = limiter
            .check_all([("enforced", "alice", 1), ("watched", "alice", 1)])
            .await
            .unwrap();
        assert!(d.allowed(), "call {n}: {d:?}");
        assert_eq!(d.overall(), Overall::Allowed);
        let watched = d.limit("watched").unwrap();
        assert_eq!(watched.mode(), Mode::Shadow);
        assert_eq!(
            watched.allowed(),
            n < 2,
            "call {n}: would deny from the third"
        );
        assert_eq!(watched.remaining(), Some(1u64.saturating_sub(n)));
        assert_eq!(
            d.limit("enforced").unwrap().remaining(),
            Some(BURST - 1 - n)
        );
    }
    // Only the enforcing limit refuses.
    let d = limiter
        .check_all([("enforced", "alice", 1), ("watched", "alice", 1)])
        .await
        .unwrap();
    assert_eq!(d.overall(), Overall::Limited);
    let violated: Vec<&str> = d.violated().map(LimitDecision::name).collect();
    assert_eq!(violated, ["enforced"]);
    // Alone, a shadow limit lets every call pass, whatever its bucket says.
    for n in 0..4 {
        let d = limiter.check_all([("watched", "bob", 1)]).await.unwrap();
        assert!(d.allowed(), "call {n}");
        assert_eq!(d.limit("watched").unwrap().allowed(), n < 2);
    }
}

/// `peek` reports the bucket without consuming, and never creates a key.
async fn peek_reports_without_consuming_or_creating_a_key<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("peek", Q)]);
    assert_eq!(h.stored("peek", "alice").await, 0);
    for _ in 0..3 {
        let d = ok(limiter.peek("peek", "alice")).await;
        assert_eq!(state(&d), (true, Some(BURST), None));
        assert_eq!(d.cost(), 0);
        assert_eq!(d.outcome().unwrap().next_after(), None);
    }
    assert_eq!(h.stored("peek", "alice").await, 0, "a peek created the key");

    assert_eq!(
        ok(limiter.check("peek", "alice", 2)).await.remaining(),
        Some(3)
    );
    for _ in 0..3 {
        let d = ok(limiter.peek("peek", "alice")).await;
        assert_eq!(state(&d), (true, Some(3), None));
        assert_eq!(d.outcome().unwrap().next_after(), Some(T));
    }
    assert_eq!(h.stored("peek", "alice").await, 1);
    // An empty bucket: a peek still passes (it costs nothing) and tells when.
    assert_eq!(
        ok(limiter.check("peek", "alice", 3)).await.remaining(),
        Some(0)
    );
    let d = ok(limiter.peek("peek", "alice")).await;
    assert_eq!(state(&d), (true, Some(0), None));
    assert_eq!(d.outcome().unwrap().next_after(), Some(T));
    assert!(!ok(limiter.check("peek", "alice", 1)).await.allowed());
}

/// `check_all` is all or nothing: a refused call takes nothing from the other limits.
async fn check_all_is_all_or_nothing<H: Harness>(h: &H) {
    let limiter = h.limiter([
        Limit::new("per-user", Q),
        Limit::new("per-tenant", Quota::per_minute(6).burst(2)),
    ]);
    let calls = [("per-user", "alice", 1), ("per-tenant", "acme", 1)];
    assert!(limiter.check_all(calls).await.unwrap().allowed());
    assert!(limiter.check_all(calls).await.unwrap().allowed());
    let d = limiter.check_all(calls).await.unwrap();
    assert_eq!(d.overall(), Overall::Limited);
    assert_eq!(d.retry_after(), Some(T));
    let violated: Vec<&str> = d.violated().map(LimitDecision::name).collect();
    assert_eq!(violated, ["per-tenant"]);
    // The user's limit reports its bucket as it stands: nothing taken.
    let user = d.limit("per-user").unwrap();
    assert_eq!(state(user), (true, Some(3), None));
    assert_eq!(
        ok(limiter.peek("per-user", "alice")).await.remaining(),
        Some(3)
    );
    // The same the other way round: a token later the user's limit (4 left) refuses a cost
    // of 5, and the tenant keeps its refilled token.
    h.advance(T);
    let d = limiter
        .check_all([("per-user", "alice", 5), ("per-tenant", "acme", 1)])
        .await
        .unwrap();
    let violated: Vec<&str> = d.violated().map(LimitDecision::name).collect();
    assert_eq!(violated, ["per-user"]);
    assert_eq!(d.retry_after(), Some(T));
    assert_eq!(
        ok(limiter.peek("per-tenant", "acme")).await.remaining(),
        Some(1)
    );
    assert_eq!(
        ok(limiter.peek("per-user", "alice")).await.remaining(),
        Some(4)
    );
}

/// `refund` gives tokens back but never beyond a full bucket.
async fn refund_never_fills_beyond_a_full_bucket<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("refund", Q)]);
    assert_eq!(
        ok(limiter.check("refund", "alice", 2)).await.remaining(),
        Some(3)
    );
    let d = ok(limiter.refund("refund", "alice", 100)).await;
    assert_eq!(state(&d), (true, Some(BURST), None));
    for left in (0..BURST).rev() {
        let d = ok(limiter.check("refund", "alice", 1)).await;
        assert_eq!(state(&d), (true, Some(left), None), "refund overfilled");
    }
    assert!(!ok(limiter.check("refund", "alice", 1)).await.allowed());
    // A partial refund gives back exactly its cost.
    assert_eq!(
        ok(limiter.check("refund", "bob", 4)).await.remaining(),
        Some(1)
    );
    assert_eq!(
        ok(limiter.refund("refund", "bob", 1)).await.remaining(),
        Some(2)
    );
    assert_eq!(ok(limiter.peek("refund", "bob")).await.remaining(), Some(2));
}

/// `refund` of a key the store does not hold reports a full bucket and creates nothing.
async fn refund_of_an_absent_key_creates_nothing<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("refund-absent", Q)]);
    let d = ok(limiter.refund("refund-absent", "nobody", 3)).await;
    assert_eq!(state(&d), (true, Some(BURST), None));
    assert_eq!(h.stored("refund-absent", "nobody").await, 0);
    assert_eq!(
        ok(limiter.peek("refund-absent", "nobody"))
            .await
            .remaining(),
        Some(BURST)
    );
}

/// `penalize` takes the bucket into debt: after 3 × burst, nothing passes until the debt
/// has refilled, exactly then and not a microsecond earlier.
async fn penalize_debt_is_honoured_to_the_microsecond<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("penalize", Q)]);
    let d = ok(limiter.penalize("penalize", "alice", 3 * BURST as u32)).await;
    let o = *d.outcome().unwrap();
    assert_eq!(o.remaining(), 0);
    assert_eq!(o.reset_after(), 15 * T);
    // 10 tokens of debt, then the token a request needs.
    assert_eq!(o.next_after(), Some(11 * T));
    let refused = ok(limiter.check("penalize", "alice", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(11 * T)));
    // A look still passes a bucket in debt (a peek is always allowed),
    // takes nothing, and says when the next token comes.
    let look = ok(limiter.peek("penalize", "alice")).await;
    assert_eq!(state(&look), (true, Some(0), None));
    assert_eq!(look.outcome().unwrap().next_after(), Some(11 * T));
    h.advance(11 * T - US);
    let refused = ok(limiter.check("penalize", "alice", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(US)));
    h.advance(US);
    let d = ok(limiter.check("penalize", "alice", 1)).await;
    assert_eq!(state(&d), (true, Some(0), None));
    let refused = ok(limiter.check("penalize", "alice", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(T)));
}

/// `block` refuses until `now + d` whatever the tokens, then exactly one token is there.
async fn block_refuses_until_its_end_then_gives_one_token<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("block", Q)]);
    assert_eq!(
        ok(limiter.check("block", "alice", 1)).await.remaining(),
        Some(4)
    );
    let d = ok(limiter.block("block", "alice", 3 * T)).await;
    assert_eq!(d.remaining(), Some(0));
    assert_eq!(d.outcome().unwrap().next_after(), Some(3 * T));
    let refused = ok(limiter.check("block", "alice", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(3 * T)));
    h.advance(3 * T - US);
    let refused = ok(limiter.check("block", "alice", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(US)));
    h.advance(US);
    let d = ok(limiter.check("block", "alice", 1)).await;
    assert_eq!(state(&d), (true, Some(0), None));
    let refused = ok(limiter.check("block", "alice", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(T)));
    // A block never shortens a longer debt.
    ok(limiter.penalize("block", "bob", 10)).await;
    let d = ok(limiter.block("block", "bob", US)).await;
    assert_eq!(d.outcome().unwrap().reset_after(), 10 * T);
    // The bucket then refills from the one token.
    h.advance(4 * T);
    assert_eq!(
        ok(limiter.peek("block", "alice")).await.remaining(),
        Some(4)
    );
}

/// `reset` lifts a block and gives a full bucket.
async fn reset_lifts_a_block_and_fills_the_bucket<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("reset", Q)]);
    ok(limiter.block("reset", "alice", Duration::from_secs(3_600))).await;
    let refused = ok(limiter.check("reset", "alice", 1)).await;
    assert_eq!(
        state(&refused),
        (false, Some(0), Some(Duration::from_secs(3_600)))
    );
    let d = ok(limiter.reset("reset", "alice")).await;
    assert_eq!(state(&d), (true, Some(BURST), None));
    for left in (0..BURST).rev() {
        let d = ok(limiter.check("reset", "alice", 1)).await;
        assert_eq!(state(&d), (true, Some(left), None));
    }
    assert!(!ok(limiter.check("reset", "alice", 1)).await.allowed());
}

/// The layer and the handle share buckets: HTTP empties `x-user: alice`, the handle resets
/// it, HTTP passes again; handlers get the handle from the router's state.
async fn the_layer_and_the_handle_share_buckets<H: Harness>(h: &H) {
    let layer = RateLimitLayer::builder(h.store())
        .limit(Limit::new("login", Q).key(Header::new("x-user")))
        .build()
        .unwrap();
    let limiter = layer.limiter();
    // The handler reads the bucket through the handle from the router's state.
    let app = Router::new()
        .route(
            "/",
            get(|State(limiter): State<Limiter>| async move {
                let d = limiter.peek("login", "alice").await.unwrap();
                d.remaining().unwrap().to_string()
            }),
        )
        .with_state(limiter.clone())
        .route_layer(layer);
    let alice = || {
        with_peer(
            Request::get("/")
                .header("x-user", "alice")
                .body(Body::empty())
                .unwrap(),
            "192.0.2.1",
        )
    };
    for left in (0..BURST).rev() {
        let response = send(&app, alice()).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body_text(response).await, left.to_string());
    }
    assert_eq!(
        send(&app, alice()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        ok(limiter.peek("login", "alice")).await.remaining(),
        Some(0)
    );

    assert_eq!(
        ok(limiter.reset("login", "alice")).await.remaining(),
        Some(BURST)
    );
    let response = send(&app, alice()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body_text(response).await, "4");
    // And the other way: what the handle takes, HTTP no longer has.
    assert_eq!(
        ok(limiter.check("login", "alice", 4)).await.remaining(),
        Some(0)
    );
    assert_eq!(
        send(&app, alice()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(limiter.limits(), ["login"]);
}

/// An unknown limit is an error from every method, not a panic, and a call naming one
/// takes nothing from the others.
async fn an_unknown_limit_is_an_error<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("known", Q)]);
    let unknown = || {
        Err(LimiterError::UnknownLimit {
            limit: "nope".into(),
            known: vec!["known"],
        })
    };
    assert_eq!(
        limiter.check("nope", "alice", 1).await.map(|_| ()),
        unknown()
    );
    assert_eq!(limiter.peek("nope", "alice").await.map(|_| ()), unknown());
    assert_eq!(
        limiter.refund("nope", "alice", 1).await.map(|_| ()),
        unknown()
    );
    assert_eq!(
        limiter.penalize("nope", "alice", 1).await.map(|_| ()),
        unknown()
    );
    assert_eq!(
        limiter.block("nope", "alice", T).await.map(|_| ()),
        unknown()
    );
    assert_eq!(limiter.reset("nope", "alice").await.map(|_| ()), unknown());
    let all = limiter
        .check_all([("known", "alice", 1), ("nope", "alice", 1)])
        .await;
    assert_eq!(all.map(|_| ()), unknown());
    assert_eq!(
        ok(limiter.peek("known", "alice")).await.remaining(),
        Some(BURST)
    );
    assert_eq!(
        limiter
            .check("nope", "alice", 1)
            .await
            .unwrap_err()
            .to_string(),
        r#"no limit is called "nope"; the limits are "known""#
    );
}

/// The message of an unknown limit lists the configured names (ten of them at most), so a
/// typo shows its fix.
#[test]
fn an_unknown_limit_message_lists_the_configured_names() {
    let names: Vec<&'static str> = vec!["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"];
    let err = |known: &[&'static str]| {
        LimiterError::UnknownLimit {
            limit: "per-iq".into(),
            known: known.to_vec(),
        }
        .to_string()
    };
    assert_eq!(
        err(&["global", "per-ip"]),
        r#"no limit is called "per-iq"; the limits are "global", "per-ip""#
    );
    assert_eq!(
        err(&[]),
        r#"no limit is called "per-iq" (none is configured)"#
    );
    assert_eq!(
        err(&names),
        r#"no limit is called "per-iq"; the limits are "a", "b", "c", "d", "e", "f", "g", "h", "i", "j" and 2 more"#
    );
}

/// One `#[tokio::test]` per case, in a module per store, each on a fresh harness.
macro_rules! cases {
    ($make:expr) => {
        cases!(@each $make;
            check_takes_tokens_and_a_refusal_takes_none,
            a_shadow_limit_never_refuses,
            peek_reports_without_consuming_or_creating_a_key,
            check_all_is_all_or_nothing,
            refund_never_fills_beyond_a_full_bucket,
            refund_of_an_absent_key_creates_nothing,
            penalize_debt_is_honoured_to_the_microsecond,
            block_refuses_until_its_end_then_gives_one_token,
            reset_lifts_a_block_and_fills_the_bucket,
            the_layer_and_the_handle_share_buckets,
            an_unknown_limit_is_an_error,
            a_block_for_duration_max_blocks_for_good,
            the_failed_login_pattern_locks_out_after_the_burst,
        );
    };
    (@each $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let harness = $make;
                super::$case(&harness).await;
            }
        )*
    };
}

// ---------------------------------------------------------------------------------------
// The stores
// ---------------------------------------------------------------------------------------

/// A fresh `MemoryStore` on a fake clock.
struct Memory {
    clock: FakeClock,
    store: MemoryStore<FakeClock>,
}

impl Memory {
    fn new() -> Self {
        let clock = FakeClock::at(START);
        Self {
            store: MemoryStore::with_clock(clock.clone()),
            clock,
        }
    }
}

impl Harness for Memory {
    type S = MemoryStore<FakeClock>;

    fn store(&self) -> Self::S {
        self.store.clone()
    }

    fn clock(&self) -> &FakeClock {
        &self.clock
    }

    async fn stored(&self, _limit: &str, _key: &str) -> u64 {
        self.store.len() as u64
    }
}

mod memory {
    cases!(super::Memory::new());
}

#[cfg(feature = "redis")]
mod redis_harness {
    use std::sync::OnceLock;

    use super::support::redis::RedisServer;
    use super::*;
    use tollgate::key::Key;
    use tollgate::store::RedisStore;

    /// One server for the whole file (each case uses its own limit names); the support's
    /// watchdog stops it when the test process ends.
    pub(crate) fn server() -> &'static RedisServer {
        static SERVER: OnceLock<RedisServer> = OnceLock::new();
        SERVER.get_or_init(RedisServer::start)
    }

    #[cfg(feature = "redis-cluster")]
    pub(crate) fn cluster() -> &'static super::support::redis::RedisCluster {
        static CLUSTER: OnceLock<super::support::redis::RedisCluster> = OnceLock::new();
        CLUSTER.get_or_init(|| super::support::redis::RedisCluster::start(3))
    }

    #[derive(Clone)]
    pub(crate) enum Conn {
        Single(redis::aio::ConnectionManager),
        #[cfg(feature = "redis-cluster")]
        Cluster(redis::cluster_async::ClusterConnection),
    }

    /// A `RedisStore` on its own connection, deciding by a fake clock (caller time).
    pub(crate) struct Redis {
        pub(crate) clock: FakeClock,
        pub(crate) store: RedisStore,
        conn: Conn,
    }

    impl Redis {
        pub(crate) fn with(conn: Conn, clock: FakeClock) -> Self {
            let store = match &conn {
                Conn::Single(c) => RedisStore::new(c.clone()),
                #[cfg(feature = "redis-cluster")]
                Conn::Cluster(c) => RedisStore::cluster(c.clone()),
            }
            .caller_time(clock.clone())
            // A loaded machine must not turn a slow call into a local fallback decision.
            .timeout(std::time::Duration::from_secs(5));
            Self { clock, store, conn }
        }

        pub(crate) async fn single() -> Self {
            let conn = server().client().get_connection_manager().await.unwrap();
            Self::with(Conn::Single(conn), FakeClock::at(START))
        }

        #[cfg(feature = "redis-cluster")]
        pub(crate) async fn cluster() -> Self {
            let conn = cluster().connection().await;
            Self::with(Conn::Cluster(conn), FakeClock::at(START))
        }
    }

    impl Harness for Redis {
        type S = RedisStore;

        fn store(&self) -> RedisStore {
            self.store.clone()
        }

        fn clock(&self) -> &FakeClock {
            &self.clock
        }

        async fn stored(&self, limit: &str, key: &str) -> u64 {
            let name = format!("tollgate:{limit}:{}", Key::from_part(key));
            let mut exists = redis::cmd("EXISTS");
            exists.arg(&name);
            match &self.conn {
                Conn::Single(c) => exists.query_async(&mut c.clone()).await.unwrap(),
                #[cfg(feature = "redis-cluster")]
                Conn::Cluster(c) => exists.query_async(&mut c.clone()).await.unwrap(),
            }
        }
    }
}

#[cfg(feature = "redis")]
mod redis_server {
    cases!(super::redis_harness::Redis::single().await);

    /// `block` is state in Redis: blocked through one instance, refused by another.
    #[tokio::test]
    async fn a_block_holds_across_instances() {
        let a = super::redis_harness::Redis::single().await;
        let b = super::redis_harness::Redis::single().await;
        super::a_block_holds_across_instances(&a, &b).await;
    }
}

#[cfg(feature = "redis-cluster")]
mod redis_cluster {
    cases!(super::redis_harness::Redis::cluster().await);

    /// `block` is state in the cluster: blocked through one instance, refused by another.
    #[tokio::test]
    async fn a_block_holds_across_instances() {
        let a = super::redis_harness::Redis::cluster().await;
        let b = super::redis_harness::Redis::cluster().await;
        super::a_block_holds_across_instances(&a, &b).await;
    }
}

/// Two stores on two connections to the same Redis: a block through `a` refuses through
/// `b`, and a reset through `a` gives `b` a full bucket.
#[cfg(feature = "redis")]
async fn a_block_holds_across_instances<H: Harness>(a: &H, b: &H) {
    assert_eq!(a.clock().elapsed(), b.clock().elapsed());
    let one = a.limiter([Limit::new("shared-block", Q)]);
    let two = b.limiter([Limit::new("shared-block", Q)]);
    assert_eq!(
        ok(two.check("shared-block", "mallory", 1))
            .await
            .remaining(),
        Some(4)
    );
    ok(one.block("shared-block", "mallory", 6 * T)).await;
    assert_eq!(a.stored("shared-block", "mallory").await, 1);
    let refused = ok(two.check("shared-block", "mallory", 1)).await;
    assert_eq!(state(&refused), (false, Some(0), Some(6 * T)));
    ok(one.reset("shared-block", "mallory")).await;
    assert_eq!(b.stored("shared-block", "mallory").await, 0);
    assert_eq!(
        ok(two.peek("shared-block", "mallory")).await.remaining(),
        Some(BURST)
    );
    // After the block's end (both clocks), `two` passes again.
    a.advance(6 * T);
    b.advance(6 * T);
    assert_eq!(
        ok(two.check("shared-block", "mallory", 1))
            .await
            .remaining(),
        Some(4)
    );
}

/// A block for `Duration::MAX` ("for good") is answered by the store itself, and the key
/// stays readable. (Redis once wrote such a TAT beyond 2^53 µs: the reply overflowed, the
/// block fell back to the local limiter, and every later call on the key failed over.)
async fn a_block_for_duration_max_blocks_for_good<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("forever", Q)]);
    let century = Duration::from_secs(100 * 365 * 86_400);
    let d = ok(limiter.block("forever", "mallory", Duration::MAX)).await;
    assert!(matches!(d.status(), Status::Checked(_)), "{d:?}");
    assert_eq!(d.remaining(), Some(0));
    assert!(d.outcome().unwrap().next_after().unwrap() > century);
    // A fresh limiter on the same store (no remembered denial) asks the store.
    let other = h.limiter([Limit::new("forever", Q)]);
    let look = ok(other.peek("forever", "mallory")).await;
    assert!(matches!(look.status(), Status::Checked(_)), "{look:?}");
    assert_eq!(look.remaining(), Some(0));
    h.advance(century);
    let refused = ok(other.check("forever", "mallory", 1)).await;
    assert!(
        matches!(refused.status(), Status::Checked(_)),
        "{refused:?}"
    );
    assert!(!refused.allowed());
    assert!(refused.retry_after().unwrap() > century);
    // A reset still lifts it.
    ok(limiter.reset("forever", "mallory")).await;
    assert_eq!(
        ok(other.check("forever", "mallory", 1)).await.remaining(),
        Some(BURST - 1)
    );
}

/// The failed-login pattern of `Limiter`'s docs locks a user out after `burst` failures.
/// (Its look once tested `peek(..).allowed()`, which is `true` at an empty bucket — a peek
/// costs nothing — so it never refused an attempt.)
async fn the_failed_login_pattern_locks_out_after_the_burst<H: Harness>(h: &H) {
    let limiter = h.limiter([Limit::new("login-failures", Q)]);
    let attempt = async |password_ok: bool| -> Option<bool> {
        let look = ok(limiter.peek("login-failures", "alice")).await;
        if look.remaining() == Some(0) || !look.allowed() {
            return None;
        }
        if password_ok {
            ok(limiter.reset("login-failures", "alice")).await;
        } else {
            ok(limiter.check("login-failures", "alice", 1)).await;
        }
        Some(password_ok)
    };
    for _ in 0..BURST {
        assert_eq!(attempt(false).await, Some(false));
    }
    // The empty bucket's look passes (cost 0) with no token left.
    let look = ok(limiter.peek("login-failures", "alice")).await;
    assert_eq!(state(&look), (true, Some(0), None));
    assert_eq!(attempt(true).await, None);
    h.advance(T);
    assert_eq!(attempt(true).await, Some(true));
    assert_eq!(attempt(false).await, Some(false));
    assert_eq!(
        ok(limiter.peek("login-failures", "alice"))
            .await
            .remaining(),
        Some(BURST - 1)
    );
}
