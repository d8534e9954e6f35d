//! Stores: where bucket state lives.
//!
//! | store | state | failure |
//! |---|---|---|
//! | [`MemoryStore`] | in this process, lock-free per key, bounded, swept when idle | cannot fail |
//! | `RedisStore` (feature `redis`) | in Redis, shared by every instance, one atomic script per call | per-limit [`FailurePolicy`] |
//! | [`Resilient`]`<B>` | any [`Backend`] (a store that can fail) | per-limit [`FailurePolicy`] |
//!
//! # The contract
//!
//! A [`Store`] applies one [`Op`] to the buckets of one call's [`Item`]s and answers each
//! item's [`Status`]: the state of its bucket afterwards. For [`Op::Check`] the answer is
//! all or nothing: if any [`Mode::Enforce`] item is refused, nothing is consumed anywhere
//! and the other items report their unchanged state; otherwise every passing item consumes
//! its cost (shadow items too) and a shadow item that would refuse consumes nothing. The
//! other operations never refuse and apply to each item. A store that never fails (the
//! memory store) implements [`Store`] directly.
//!
//! A store that can fail (a network service) implements [`Backend`] instead: the same
//! operations, answering `Result`, and on an error having changed nothing. [`Resilient`]
//! turns any backend into a [`Store`] with what every remote store needs: a timeout per
//! call, a circuit breaker, each limit's [`FailurePolicy`] (a local fallback limiter,
//! fail open, or fail closed), a local cache of denials, and one log line per state
//! change. `RedisStore` is `Resilient<RedisBackend>`.
//!
//! [`FailurePolicy`]: crate::FailurePolicy

pub(crate) mod ban;
mod breaker;
mod memory;
#[cfg(feature = "redis")]
mod redis;
pub mod regions;
mod resilient;
mod rtt;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use smallvec::SmallVec;

pub(crate) use crate::model::decision::Status;
pub use ban::{BanCall, BanFuture, BanReply};
pub use memory::{DEFAULT_MAX_KEYS, MemoryStore, MemoryTable};
#[cfg(feature = "redis-tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
pub use redis::RedisTls;
#[cfg(feature = "redis-sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
pub use redis::SentinelOptions;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{
    IN_FLIGHT_DEADLINE, RedisBackend, RedisEscrow, RedisRegions, RedisStore, RedisTable,
};
pub use resilient::{LeaseStats, Resilient, ResilientTable};

use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::model::key::Key;
use crate::model::lease::Lease;
use crate::model::policy::{FailurePolicy, Mode};

/// What to do to the buckets of a call. Each is one atomic step per
/// bucket.
///
/// | operation | bucket afterwards |
/// |---|---|
/// | `Check` | `cost` tokens taken if they are all there (cost 0: a look that creates nothing); all or nothing over the items |
/// | `Refund` | `cost` tokens given back, never beyond a full bucket; an absent key stays absent |
/// | `Penalize` | `cost` tokens taken whatever is left: the bucket may go into debt, and the next request passes once the debt has refilled |
/// | `Block(d)` | a request of cost 1 is refused until `d` from now, whatever the tokens; then one token is there and the bucket refills from it |
/// | `Reset` | a full bucket, unblocked (the key is forgotten) |
/// | `Restore(d)` | GCRA: the bucket at least as spent as one that is full again in `d` (what a write-back after a state loss restores; it only ever moves a bucket forward); window limits: unchanged |
/// | `Debit { max_debt }` | a settled cost's excess: `cost` tokens taken whatever is left, but the bucket at most `max_debt` tokens below empty (the rest is forgiven; `u64::MAX`: no cap; [`gcra::debit`](crate::gcra::debit)); never moves a bucket back. GCRA; window limits: unchanged. Remote stores send it with the checks |
/// | `Credit` | a settled cost's overestimate: `Refund`, sent with the checks |
/// | `PenalizeOnce { id }` | `Penalize`, at most once per `id` and bucket for two minutes: sent again with the same `id` (its answer was lost), it changes nothing. Only to a backend whose [`Backend::penalizes_once`] is `true`; the memory store applies each call |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Take each item's cost, all or nothing.
    Check,
    /// Give each item's cost back.
    Refund,
    /// Take each item's cost, into debt if need be.
    Penalize,
    /// Refuse each item's key for this long.
    Block(Duration),
    /// Forget each item's key.
    Reset,
    /// Make each item's bucket at least as spent as one that is full again after this
    /// long (GCRA; window limits are unchanged).
    Restore(Duration),
    /// Take each item's cost, into debt of at most `max_debt` tokens (a settle that costs
    /// more than its estimate).
    Debit {
        /// The most tokens the bucket may owe afterwards (`u64::MAX`: no cap, the whole
        /// cost is taken).
        max_debt: u64,
    },
    /// Give each item's cost back, as [`Op::Refund`] (a settle that costs less than its
    /// estimate).
    Credit,
    /// Take each item's cost into debt, as [`Op::Penalize`], once per `id`: a call sent
    /// again with the same `id` within [`PENALIZE_ONCE_FOR`] of the first one applied
    /// changes nothing (it reports the bucket as it stands). What [`Resilient`] sends when
    /// it charges an outage's grants back, so that a charge whose answer was lost can be
    /// sent again without charging twice.
    PenalizeOnce {
        /// The charge's identity, unique per bucket (random, chosen by the sender).
        id: u64,
    },
}

/// How long a backend remembers an [`Op::PenalizeOnce`] it applied (its id, per bucket):
/// a sender must not send the same one again later than this after the first send.
pub const PENALIZE_ONCE_FOR: Duration = Duration::from_secs(120);

/// Why a [`Backend`] could not answer: the message of the underlying error.
#[derive(Debug)]
pub struct StoreError(Box<dyn std::error::Error + Send + Sync>);

impl StoreError {
    /// Wraps any error (or message).
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(error.into())
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// One limit of one request, as the store sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Item<'a, T> {
    /// The limit's table, from [`Store::table`].
    pub table: &'a T,
    /// The bucket within the table.
    pub key: Key,
    /// The quota for this request.
    pub quota: Quota,
    /// Tokens this request takes (0: look without consuming).
    pub cost: u32,
    /// Whether the limit may refuse the request.
    pub mode: Mode,
    /// What to do if the store fails.
    pub on_failure: FailurePolicy,
    /// How the limit counts ([`Algorithm::Gcra`] unless set). A table serves one
    /// algorithm: the items of one table must all have the same.
    pub algorithm: Algorithm,
    /// A reservation when non-zero: in an [`Op::Check`], the item also
    /// passes when its tokens are there within this wait, taking them now; its outcome's
    /// [`wait`](crate::Outcome::wait) says when the request may proceed. GCRA and fixed
    /// windows only (the sliding algorithms ignore it). Zero: a check.
    pub max_wait: Duration,
    /// Lease mode: a store that asks a remote one ([`Resilient`]) may spend leased tokens
    /// locally (see [`Lease`]). Other stores ignore it.
    pub lease: Option<Lease>,
    /// The limit bans the keys it refuses too often ([`Limit::ban`](crate::Limit::ban)):
    /// a store that shares bans ([`Store::ban`]) says, in the outcome of a check it
    /// refuses, whether the key is banned and for how long (a ban begun by another
    /// instance blocks the bucket, so that instance's first refusal is the ban's). Other
    /// stores ignore it.
    pub bans: bool,
    /// Stripes for a hot key (GCRA only; 1: one bucket): see
    /// [`LimitSpec::striped`](crate::LimitSpec::striped). The memory store splits the key
    /// into this many buckets; other stores ignore it.
    pub stripes: u8,
}

impl<'a, T> Item<'a, T> {
    /// A check of `cost` tokens from the bucket `key` of `table`, enforcing, falling back
    /// to a local limiter if the store fails.
    ///
    /// For using a store without the middleware:
    ///
    /// ```
    /// use tollgate::{key::Key, store::{Checked, Item, MemoryStore, Store}, Quota};
    ///
    /// let store = MemoryStore::new();
    /// let logins = store.table("logins");
    /// let item = Item::new(&logins, Key::from_part("alice"), Quota::per_minute(5), 1);
    /// let Checked::Ready(statuses) = store.check(&[item]) else { unreachable!() };
    /// assert!(statuses[0].outcome().unwrap().is_allowed());
    /// assert_eq!(statuses[0].outcome().unwrap().remaining(), 4);
    /// ```
    pub fn new(table: &'a T, key: Key, quota: Quota, cost: u32) -> Self {
        Self {
            table,
            key,
            quota,
            cost,
            mode: Mode::Enforce,
            on_failure: FailurePolicy::Share,
            algorithm: Algorithm::Gcra,
            max_wait: Duration::ZERO,
            lease: None,
            bans: false,
            stripes: 1,
        }
    }

    /// The same item on another table (a store that wraps another one passes its items
    /// on with the inner store's table).
    pub(crate) fn on<'b, U>(&self, table: &'b U) -> Item<'b, U> {
        Item {
            table,
            key: self.key.clone(),
            quota: self.quota,
            cost: self.cost,
            mode: self.mode,
            on_failure: self.on_failure,
            algorithm: self.algorithm,
            max_wait: self.max_wait,
            lease: self.lease,
            bans: self.bans,
            stripes: self.stripes,
        }
    }

    /// Sets whether the item's limit bans (see [`Item::bans`](Item#structfield.bans)).
    pub fn bans(mut self, bans: bool) -> Self {
        self.bans = bans;
        self
    }

    /// Splits the item's key into `n` stripes in the memory store (see
    /// [`Item::stripes`](Item#structfield.stripes)).
    pub fn stripes(mut self, n: u8) -> Self {
        self.stripes = n;
        self
    }

    /// Sets the item's lease mode (see [`Item::lease`](Item#structfield.lease)).
    pub fn lease(mut self, lease: Option<Lease>) -> Self {
        self.lease = lease;
        self
    }

    /// Makes the check a reservation that may wait up to `max_wait` (see
    /// [`Item::max_wait`](Item#structfield.max_wait)).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Sets how the limit counts (see [`Algorithm`]; the quota's rate and period are a
    /// window's limit and length).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Sets whether the limit may refuse (see [`Mode`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets what happens if the store fails.
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_failure = policy;
        self
    }
}

/// One [`Status`] per item, in the items' order.
pub type Statuses = SmallVec<[Status; 4]>;

/// A store's answer: at once, or later.
// The statuses stay inline (no allocation for up to four limits); the value is taken
// apart right after it is returned.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Checked<F> {
    /// Decided synchronously (the memory store; or a local denial).
    Ready(Statuses),
    /// Decided when the future completes (a network round trip).
    Pending(F),
}

impl<F: Future<Output = Statuses> + Send + 'static> Checked<F> {
    /// Lets an operation nobody waits for (a give-back) finish: a pending one is spawned
    /// on the Tokio runtime; without a runtime it is dropped with a warning naming `what`
    /// (the tokens then return as the buckets refill).
    pub(crate) fn finish_in_background(self, what: &str) {
        let Checked::Pending(future) = self else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(future);
            }
            Err(_) => tracing::warn!(
                "tollgate: no Tokio runtime to give back {what}; the tokens return as the bucket refills"
            ),
        }
    }
}

/// Where bucket state lives, and how the operations of one call apply to it (see the
/// [module docs](self) for the contract).
pub trait Store: Clone + Send + Sync + 'static {
    /// A handle to one limit's buckets, made once when a layer or limiter is built.
    type Table: Send + Sync + 'static;
    /// The answer of a call that needs I/O.
    type Future: Future<Output = Statuses> + Send + 'static;

    /// The table of the limit called `name` (the same name gives the same buckets).
    fn table(&self, name: &str) -> Self::Table;

    /// Applies `op` to the bucket of each item; answers one [`Status`] per item, in order.
    fn apply(&self, op: Op, items: &[Item<'_, Self::Table>]) -> Checked<Self::Future>;

    /// [`Op::Check`]: one request against each of its limits, all or nothing.
    #[inline]
    fn check(&self, items: &[Item<'_, Self::Table>]) -> Checked<Self::Future> {
        self.apply(Op::Check, items)
    }

    /// Bans shared through the store (see [`BanCall`]): `None` (the default) when the
    /// store keeps none, and each layer's own ban table decides.
    fn ban(&self, table: &Self::Table, key: &Key, call: BanCall) -> Option<BanFuture> {
        let _ = (table, key, call);
        None
    }

    /// The clock bans are timed on (the store's own, so that a
    /// [`FakeClock`](crate::clock::FakeClock) moves both); default a
    /// [`CpuClock`](crate::clock::CpuClock).
    fn ban_clock(&self) -> crate::base::clock::SharedClock {
        crate::base::clock::SharedClock::default()
    }

    /// Whether the store keeps limits of `algorithm`; `Err` says why not, and a layer or
    /// limiter with such a limit is not built. By default every algorithm but
    /// [`Algorithm::InFlight`], whose units only a request's end gives back: a store that
    /// keeps them says so.
    fn supports(&self, algorithm: &Algorithm) -> Result<(), &'static str> {
        not_in_flight(algorithm)
    }
}

/// [`Store::supports`] and [`Backend::supports`] by default: everything but in-flight
/// limits.
fn not_in_flight(algorithm: &Algorithm) -> Result<(), &'static str> {
    match algorithm {
        Algorithm::InFlight { .. } => Err(
            "this store does not keep in-flight limits: use a MemoryStore for them (one instance's requests)",
        ),
        _ => Ok(()),
    }
}

/// A store that can fail, such as a network service; [`Resilient`] makes it a [`Store`].
///
/// `apply` has the contract of [`Store::apply`] and answers [`Status::Checked`] for every
/// item, or an error, in which case the call must have changed nothing (a backend that
/// changed some buckets before failing gives them back first). It copies what it needs
/// from the items before returning its future.
///
/// A backend in a few lines, with the pure algorithm ([`gcra`](crate::algo::gcra)) doing the
/// arithmetic, is in `tests/backend.rs`.
pub trait Backend: Clone + Send + Sync + 'static {
    /// A handle to one limit's buckets.
    type Table: Send + Sync + 'static;
    /// The answer of one call.
    type Future: Future<Output = Result<Statuses, StoreError>> + Send + 'static;

    /// The table of the limit called `name`.
    fn table(&self, name: &str) -> Self::Table;

    /// Applies `op` to the bucket of each item.
    fn apply(&self, op: Op, items: &[Item<'_, Self::Table>]) -> Self::Future;

    /// The backend's name in logs (`"Redis"`).
    fn name(&self) -> &'static str {
        "the store"
    }

    /// How many times the backend lost its buckets since it was made (a restart without
    /// persistence, a flush), as far as it can tell; `0` if it cannot. [`Resilient`] asks
    /// on every call (it must be cheap; a backend may start a check of its own from here);
    /// when the count moves, it writes back what it remembers of the keys it saw refused,
    /// so that an exhausted key does not get a full bucket back.
    fn resets(&self) -> u64 {
        0
    }

    /// How many instances share the backend's buckets, as far as it can tell (those that
    /// were live lately, counted in the backend); `1` if it cannot count them (the
    /// default), `0` if it can but has not yet (it never reached the backend). A limit
    /// whose policy is [`FailurePolicy::Share`] spends `1/n` of its quota locally while the
    /// backend fails, for keys this instance knows no traffic of (at most `1/4` while the
    /// count is 0). Asked when a call fails; it must be cheap (a remembered count).
    ///
    /// [`FailurePolicy::Share`]: crate::FailurePolicy
    fn instances(&self) -> u64 {
        1
    }

    /// Whether [`instances`](Self::instances) is a count the backend keeps (`false`, the
    /// default: the `1` it answers says nothing). When it counts one instance, that
    /// instance is the only one spending the backend's buckets: under
    /// [`FailurePolicy::Share`] a key it served keeps the whole limit (whatever it did
    /// not spend of it, nobody did).
    ///
    /// [`FailurePolicy::Share`]: crate::FailurePolicy
    fn counts_instances(&self) -> bool {
        false
    }

    /// Whether the backend applies [`Op::PenalizeOnce`] at most once per id and bucket
    /// (for [`PENALIZE_ONCE_FOR`]); `false` (the default): it is never sent one.
    /// [`Resilient`] charges an outage's grants back with it when `true`, and sends a
    /// charge whose answer did not come (a timeout, an error) again until one is answered;
    /// otherwise it sends [`Op::Penalize`] once and follows it to its answer (a charge
    /// that is never answered is counted in `tollgate_writeback_dropped_total`).
    fn penalizes_once(&self) -> bool {
        false
    }

    /// A round trip to the backend it measured on its own, lately (Redis: its probe,
    /// once a second), if any: [`Resilient`] sizes its timeout from it too, so a backend
    /// farther away than the configured timeout, whose every call would time out and so
    /// measure nothing, is still reached. It must be cheap.
    fn round_trip(&self) -> Option<Duration> {
        None
    }

    /// Bans shared through the backend: see [`Store::ban`]. `None` (the default): none.
    fn ban(&self, table: &Self::Table, key: &Key, call: BanCall) -> Option<BanFuture> {
        let _ = (table, key, call);
        None
    }

    /// Whether the backend keeps limits of `algorithm` (see [`Store::supports`]).
    fn supports(&self, algorithm: &Algorithm) -> Result<(), &'static str> {
        not_in_flight(algorithm)
    }
}
