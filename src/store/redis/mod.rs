//! [`RedisStore`]: bucket state in Redis.

mod admin;
mod ban;
mod batch;
mod coalesce;
mod command;
mod epoch;
mod held;
mod keys;
mod open;
mod regions;
mod reply;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
mod settle;
#[cfg(feature = "redis-tls")]
mod tls;
mod url;

pub use self::regions::{RedisEscrow, RedisRegions};
#[cfg(feature = "redis-sentinel")]
pub use self::sentinel::SentinelOptions;
#[cfg(feature = "redis-tls")]
pub use self::tls::RedisTls;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};

use redis::Script;
use redis::aio::ConnectionManager;
use smallvec::SmallVec;

use self::command::{
    Connection, GCRA, MAX_EXACT, OPS, REFUND, REPLY_WIDTH, WINDOW_REPLY_WIDTH, evalsha,
};
use self::keys::{Groups, push_grouped};
use self::reply::{Answer, Failure, parse_reply, window_report};
use super::resilient::{Resilient, ResilientTable};
use super::{Backend, Checked, Item, Op, Statuses, Store, StoreError};
use crate::algo::algorithm::{Algorithm, calendar_span, phase_us};
use crate::algo::gcra::{self, Params};
use crate::algo::quota::Quota;
use crate::algo::window;
use crate::base::clock::{Clock, SharedClock};
use crate::model::decision::{Outcome, Status};
use crate::model::key::Key;
use crate::model::policy::Mode;

/// Bucket state in Redis: limits shared by every instance (feature `redis`).
///
/// A `RedisStore` is a [`RedisBackend`] inside [`Resilient`], which adds what a remote store
/// needs: a timeout per call (default 50 ms), a circuit breaker, each limit's
/// [`FailurePolicy`](crate::FailurePolicy) with a local fallback limiter (the default), a
/// local cache of denials, and one log line per state change — see [`Resilient`] for each
/// of them and their settings. This page lists what is particular to Redis.
///
/// # How it works
///
/// One request is one `EVALSHA` of `lua/gcra.lua` carrying every limit's key: the script
/// checks all limits and writes all or none, in one round trip, atomically. Under
/// concurrency the checks that arrive while calls are in flight share one call, which
/// decides each on its own (see [`batch`](RedisStore::batch)). With Redis
/// Cluster, keys in different hash slots cannot share a script: they are grouped by slot,
/// one script per group runs concurrently, and when one group refused while another
/// consumed, `lua/refund.lua` gives back what the consuming groups took (a call that fails
/// in one group gives back the others' consumption too, so a failed call changed nothing).
/// The other operations of [`Op`] are one `EVALSHA` of `lua/ops.lua` per call (per slot).
///
/// Time is Redis `TIME` (one clock for all instances) unless the store is given a
/// [`caller_time`](RedisStore::caller_time) clock. Every written key expires when its
/// bucket is full again (`PX = reset_after`), so idle keys cost nothing.
///
/// [`open`](RedisStore::open) makes a store from a URL that starts whether Redis is up or
/// not: it connects on the first request and reconnects by itself, and until Redis answers
/// each limit follows its failure policy (by default, a local limiter with the same quota).
///
/// ```no_run
/// use tollgate::{key::PeerIp, store::RedisStore, Limit, Quota, RateLimitLayer};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::open("redis://127.0.0.1:6379/")?.prefix("myapp:rl:");
/// let layer = RateLimitLayer::builder(store)
///     .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// Configure the store before building layers with it: its tables take the prefix they
/// see then, and clones made earlier keep the earlier settings.
#[derive(Clone)]
pub struct RedisStore(Resilient<RedisBackend>);

/// How long an in-flight limit's units count in Redis without a renewal, by default: an
/// instance that dies frees its units this long after its last renewal (once a second).
pub const IN_FLIGHT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisStore").field(&self.0).finish()
    }
}

/// The Redis side of [`RedisStore`]: the scripts, the key layout, the connection.
#[derive(Clone)]
pub struct RedisBackend {
    conn: Connection,
    prefix: Arc<[u8]>,
    /// The caller's clock; `None` for Redis `TIME`.
    now: Option<SharedClock>,
    /// Whether Redis lost the buckets since this store started.
    epoch: Arc<epoch::Epoch>,
    /// The checks waiting for a call in flight to end.
    batcher: Arc<batch::Batcher>,
    /// How long an in-flight limit's units count without a renewal, µs.
    in_flight_deadline_us: u64,
    /// This store's instance name (the epoch's), whose in-flight units it counts.
    instance: Arc<str>,
    /// This store's name in the live set that counts the instances: the process's, unless
    /// set (see [`RedisStore::instance_name`]).
    live_as: Arc<str>,
    /// The in-flight units this store holds, renewed once a second.
    held: Arc<held::Held>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("cluster", &self.conn.is_cluster())
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("caller_time", &self.now.is_some())
            .field("batch", &self.batcher.max_requests())
            .finish()
    }
}

/// One limit's buckets in Redis: the key prefix of the limit.
pub struct RedisTable {
    prefix: Box<[u8]>,
    /// The limit name's stable hash (a random window phase mixes it with the key's).
    name_hash: u64,
}

impl fmt::Debug for RedisTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTable")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish()
    }
}

impl RedisBackend {
    fn with_connection(conn: Connection) -> Self {
        let connections = conn.connections();
        let epoch = Arc::<epoch::Epoch>::default();
        Self {
            conn,
            prefix: Arc::from(&b"tollgate:"[..]),
            now: None,
            instance: Arc::from(epoch.id()),
            live_as: Arc::from(epoch::process_name()),
            held: Arc::default(),
            epoch,
            batcher: Arc::new(batch::Batcher::new(batch::DEFAULT_MAX_BATCH, connections)),
            in_flight_deadline_us: IN_FLIGHT_DEADLINE.as_micros() as u64,
        }
    }
}

impl RedisStore {
    fn map(self, f: impl FnOnce(Resilient<RedisBackend>) -> Resilient<RedisBackend>) -> Self {
        Self(f(self.0))
    }

    /// The prefix of every key (default `"tollgate:"`). Keys are
    /// `{prefix}{limit}:{key}`. With Redis Cluster, a prefix holding a hash tag, e.g.
    /// `"{rl}:"`, puts every bucket in one slot: every request is then one atomic script
    /// again, at the price of one busy slot.
    pub fn prefix(self, prefix: impl AsRef<[u8]>) -> Self {
        let prefix: Arc<[u8]> = Arc::from(prefix.as_ref());
        self.map(|r| r.configure(|i| i.backend.prefix = prefix))
    }

    /// The name this store counts as in the live set of its prefix (default: one random
    /// name per process). During an outage [`FailurePolicy::Share`](crate::FailurePolicy)
    /// gives a key that no instance's traffic history covers `1/N` of its limit, `N` the
    /// instances that probed the prefix within the last 5 s; a process counts once per
    /// prefix, however many stores it makes on it (a store per layer, a reloaded rules
    /// set). Give each store its own name only where each one stands for an instance, as
    /// in a test that runs several "instances" in one process. Services that share a
    /// prefix are counted together: a service whose limits are its own should have its
    /// own prefix (see [`prefix`](Self::prefix)).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::store::RedisStore;
    ///
    /// // Two instances of one service, simulated in one test process.
    /// let a = RedisStore::open("redis://127.0.0.1/")?.instance_name("a");
    /// let b = RedisStore::open("redis://127.0.0.1/")?.instance_name("b");
    /// # Ok(()) }
    /// ```
    pub fn instance_name(self, name: impl AsRef<str>) -> Self {
        let name: Arc<str> = Arc::from(name.as_ref());
        self.map(|r| r.configure(|i| i.backend.live_as = name))
    }

    /// Takes the time from `clock` (nanoseconds since the Unix epoch, e.g.
    /// [`SystemClock`](crate::clock::SystemClock)) instead of Redis `TIME`; the breaker,
    /// the local fallback limiter and the deny cache then use the same clock. For tests, a
    /// [`FakeClock`](crate::clock::FakeClock) makes decisions deterministic.
    ///
    /// Every instance must use the same kind of clock, and their skew matters: a bucket's
    /// state is a time, so an instance whose clock runs `s` ahead of the others sees every
    /// bucket `s` fuller than it is and can grant up to `s / T` tokens more per key (`T`
    /// the emission interval), at most one burst; an instance running behind refuses
    /// requests that could pass, for up to the skew. With Redis `TIME` (the default) there
    /// is one clock and no skew.
    pub fn caller_time(self, clock: impl Clock) -> Self {
        let clock = SharedClock::new(clock);
        let caller = clock.clone();
        self.map(|r| r.configure(|i| i.backend.now = Some(caller)).clock(clock))
    }

    /// The most requests one script call decides (default 128; 0 counts as 1).
    ///
    /// A check goes to Redis at once, in a call of its own, while fewer than two calls are
    /// in flight to its node (with Redis Cluster: to its hash slot). The checks that
    /// arrive while two are in flight wait for one to end, then go together in one
    /// `EVALSHA` that decides each request on its own, one after the other, each all or
    /// nothing across its limits, exactly as separate calls in that order would. Redis
    /// then runs one script, one `TIME` and one `MGET` per batch instead of per request:
    /// under concurrency its time per decision of one limit drops by about 40% (less for
    /// requests of several limits, whose writes dominate); with little traffic nothing
    /// waits. A batch also stops at about 64 KiB of keys and arguments,
    /// and at most 4,096 checks wait per node (past that a check goes alone). A failed
    /// call fails every check of its batch, each following its limits' failure policy.
    ///
    /// `1` sends every check in a call of its own, as many in flight as there are
    /// requests.
    pub fn batch(self, max_requests: usize) -> Self {
        self.map(|r| {
            r.configure(|i| {
                let connections = i.backend.conn.connections();
                i.backend.batcher = Arc::new(batch::Batcher::new(max_requests, connections));
            })
        })
    }

    /// How long an in-flight limit's units count in Redis without a renewal (default
    /// [`IN_FLIGHT_DEADLINE`], 10 s; at least 2 s): each instance renews the units it holds
    /// once a second, so an instance that dies (or stalls) frees its units within this
    /// long of its last renewal, and one that stalls longer than this loses them early.
    pub fn in_flight_deadline(self, deadline: std::time::Duration) -> Self {
        let us = deadline.max(std::time::Duration::from_secs(2)).as_micros();
        self.map(|r| {
            r.configure(|i| {
                i.backend.in_flight_deadline_us = u64::try_from(us).unwrap_or(MAX_EXACT)
            })
        })
    }

    /// How long one call may take before it counts as a failure (default 50 ms).
    pub fn timeout(self, timeout: std::time::Duration) -> Self {
        self.map(|r| r.timeout(timeout))
    }

    /// After `failures` consecutive failures (default 3), skip Redis for `cool_down`
    /// (default 1 s), then let one request probe it.
    pub fn breaker(self, failures: u32, cool_down: std::time::Duration) -> Self {
        self.map(|r| r.breaker(failures, cool_down))
    }

    /// Whether denials are remembered locally until they expire (default: yes, up to
    /// 100,000 keys).
    pub fn deny_cache(self, enabled: bool) -> Self {
        self.map(|r| r.deny_cache(enabled))
    }

    /// The key cap of the local limiter used by limits whose policy is
    /// [`FailurePolicy::Share`](crate::FailurePolicy) or `Fallback` while Redis fails (default
    /// [`DEFAULT_MAX_KEYS`](super::DEFAULT_MAX_KEYS)).
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn fallback_max_keys(self, n: usize) -> Self {
        self.map(|r| r.fallback_max_keys(n))
    }

    /// Runs the breaker, the fallback limiter and the deny cache on `clock` without
    /// changing the time Redis decides with (see [`Resilient::clock`]).
    pub fn clock(self, clock: impl Clock) -> Self {
        self.map(|r| r.clock(clock))
    }

    /// The instances counted live on this store's prefix at its last probe (the most
    /// seen within 5 s; 0 until its first probe, which runs on its first call): what
    /// [`FailurePolicy::Share`](crate::FailurePolicy) divides a key no traffic history
    /// covers by (see [`instance_name`](Self::instance_name)).
    pub fn instances(&self) -> u64 {
        self.0.backend().instances()
    }

    /// What lease mode did so far (see [`Resilient::lease_stats`]).
    pub fn lease_stats(&self) -> super::LeaseStats {
        self.0.lease_stats()
    }

    /// `true` while the breaker skips Redis.
    pub fn is_unavailable(&self) -> bool {
        self.0.is_unavailable()
    }
}

impl Store for RedisStore {
    type Table = ResilientTable<RedisTable>;
    type Future = <Resilient<RedisBackend> as Store>::Future;

    fn table(&self, name: &str) -> Self::Table {
        self.0.table(name)
    }

    #[inline]
    fn apply(&self, op: Op, items: &[Item<'_, Self::Table>]) -> Checked<Self::Future> {
        self.0.apply(op, items)
    }

    fn supports(&self, algorithm: &Algorithm) -> Result<(), &'static str> {
        self.0.supports(algorithm)
    }

    fn ban(
        &self,
        table: &Self::Table,
        key: &Key,
        call: crate::store::BanCall,
    ) -> Option<crate::store::BanFuture> {
        self.0.ban(table, key, call)
    }

    fn ban_clock(&self) -> crate::base::clock::SharedClock {
        self.0.ban_clock()
    }
}

impl RedisBackend {
    /// The caller's wall time in µs: its clock's (with `caller_time`), else the system's.
    /// What a calendar limit's window is worked out from.
    fn wall_us(&self) -> u64 {
        match &self.now {
            Some(c) => c.now() / 1_000,
            None => crate::base::clock::SystemClock.now() / 1_000,
        }
    }

    /// `now` for the scripts: the caller's time in microseconds, or `""` for Redis `TIME`.
    fn now_arg(&self) -> String {
        self.now
            .as_ref()
            .map(|c| (c.now() / 1_000).to_string())
            .unwrap_or_default()
    }
}

/// What one item of a call needs in Redis.
struct Part {
    redis_key: Vec<u8>,
    quota: Quota,
    cost: u32,
    mode: Mode,
    algorithm: Algorithm,
    /// A fixed window's phase, µs.
    phase_us: u64,
    /// How long a reservation may wait, µs (0: a check).
    max_wait_us: u64,
    /// A calendar limit's window `(start, end)`, µs since the epoch, worked out from the
    /// caller's clock; its key ends with the window's start in seconds.
    span: Option<(u64, u64)>,
    /// An in-flight limit's: how long units count without a renewal (µs), and the
    /// request's member (a check), the members to release or renew (comma-separated), or
    /// nothing (a release of units this store does not hold).
    held: Option<(u64, Arc<str>)>,
    /// A settle sent with the checks instead of a check (see `settle.rs`).
    settle: Option<settle::Settle>,
    /// A check of a limit that bans ([`Item::bans`]): its bucket key (without a calendar
    /// window), whose ban keys a refusal looks at (see [`RedisBackend::bans`]).
    ban: Option<Vec<u8>>,
}

impl Part {
    fn params(&self) -> Params {
        Params::new(self.quota.t_us(), self.quota.burst_size())
    }

    /// The script's first two arguments of this limit: `t` and `burst`, or a window's
    /// length and limit.
    fn shape(&self) -> (u64, u64) {
        if let Some((start, end)) = self.span {
            return (end - start, self.quota.rate());
        }
        if let Some((deadline_us, _)) = &self.held {
            return (*deadline_us, self.quota.rate());
        }
        if self.algorithm.is_window() {
            (self.quota.period_ns() / 1_000, self.quota.rate())
        } else {
            (self.quota.t_us(), self.quota.burst_size())
        }
    }

    /// The script's `kind` argument: "" for GCRA, `<code>:<phase>:<at>` for a window, or
    /// `<code>` when both are 0 (written without allocating).
    fn kind(&self, at: u64) -> SmallVec<[u8; 48]> {
        if let (Some(retry_after), Some((_, id))) = (self.algorithm.retry_after(), &self.held) {
            // `c:<retry µs>:<members>`.
            let mut out = SmallVec::new();
            out.extend_from_slice(b"c:");
            let retry = u64::try_from(retry_after.as_micros()).unwrap_or(u64::MAX);
            out.extend_from_slice(itoa::Buffer::new().format(retry.min(MAX_EXACT)).as_bytes());
            out.push(b':');
            out.extend_from_slice(id.as_bytes());
            return out;
        }
        let (code, phase) = match self.span {
            // A calendar window: `k:<start>:<at>`, its start in µs since the epoch.
            Some((start, _)) => (b'k', start),
            None => (self.code(), self.phase_us),
        };
        if code == 0 {
            return SmallVec::new();
        }
        let mut out = SmallVec::new();
        if phase == 0 && at == 0 {
            out.push(code);
            return out;
        }
        out.extend_from_slice(&[code, b':']);
        out.extend_from_slice(itoa::Buffer::new().format(phase).as_bytes());
        out.push(b':');
        out.extend_from_slice(itoa::Buffer::new().format(at).as_bytes());
        out
    }

    /// The script's code of a window algorithm (window.lua), 0 for GCRA.
    fn code(&self) -> u8 {
        match self.algorithm {
            Algorithm::Gcra => 0,
            Algorithm::FixedWindow { .. } => b'f',
            Algorithm::SlidingWindow => b's',
            _ => b'l',
        }
    }

    /// Appends this limit's five arguments of `gcra.lua` to `cmd`.
    fn push_args(&self, cmd: &mut redis::Cmd) {
        let (t, burst) = self.shape();
        cmd.arg(t).arg(burst).arg(self.cost);
        let enforce = u8::from(self.mode == Mode::Enforce);
        if let Some(settle) = self.settle {
            cmd.arg(settle.arg().as_slice());
        } else if self.max_wait_us == 0 {
            cmd.arg(enforce);
        } else {
            // A reservation: `<enforce>:<max_wait>`, the wait capped where Lua's doubles
            // stay exact.
            cmd.arg(format!("{enforce}:{}", self.max_wait_us.min(MAX_EXACT)));
        }
        cmd.arg(self.kind(0).as_slice());
    }

    fn width(&self) -> usize {
        if self.algorithm.is_window() {
            WINDOW_REPLY_WIDTH
        } else {
            REPLY_WIDTH
        }
    }
}

impl RedisBackend {
    /// The calls of one request: one group on a single node, one per slot on a cluster.
    fn groups(&self, parts: &[Part]) -> Groups {
        let mut groups = Groups::new();
        if self.conn.is_cluster() {
            for (i, p) in parts.iter().enumerate() {
                push_grouped(&mut groups, &p.redis_key, i);
            }
        } else {
            groups.push((keys::slot(b""), (0..parts.len()).collect()));
        }
        groups
    }

    /// Asks Redis about the limits of one group (keys in `slot`): in a call of its own, or
    /// in a batch with the checks that arrived while calls were in flight.
    async fn call(
        &self,
        parts: &Arc<[Part]>,
        group: &[usize],
        slot: keys::Slot,
    ) -> Result<Vec<Answer>, Failure> {
        let request = batch::Request {
            parts: parts.clone(),
            group: group.into(),
        };
        let reply = match self.batcher.enter(self, slot, request) {
            batch::Turn::Own(request, turn) => {
                let reply = self.send(&[&request]).await;
                drop(turn);
                reply?.pop().ok_or(Failure::Reply(0))?
            }
            batch::Turn::Queued(rx) => rx.await.map_err(|_| Failure::Abandoned)??,
        };
        parse_reply(&reply, parts, group)
    }

    /// Gives back what the consuming groups took for a refused (or failed) request.
    ///
    /// Answers, for each window limit given back, its report afterwards: the state as it
    /// stands (`None` where the give-back failed).
    async fn refund(
        &self,
        parts: &[Part],
        answers: &[Option<Answer>],
        now: &str,
    ) -> SmallVec<[Option<window::Report>; 4]> {
        let mut reports = SmallVec::from_elem(None, parts.len());
        let mut groups = Groups::new();
        let mut windows = Groups::new();
        for (i, answer) in answers.iter().enumerate() {
            if answer.is_some_and(|a| a.written.is_some()) {
                let target = if parts[i].algorithm.is_window() {
                    &mut windows
                } else {
                    &mut groups
                };
                push_grouped(target, &parts[i].redis_key, i);
            }
        }
        for (_, group) in windows {
            let mut cmd = evalsha(&OPS, group.len());
            for &i in &group {
                cmd.arg(parts[i].redis_key.as_slice());
            }
            cmd.arg(now).arg("undo");
            for &i in &group {
                let (p, a) = (&parts[i], answers[i].expect("answered"));
                let (t, burst) = p.shape();
                cmd.arg(t)
                    .arg(burst)
                    .arg(a.undo)
                    .arg(p.kind(a.now).as_slice());
            }
            match self.conn.eval::<Vec<i64>>(&cmd, &OPS).await {
                Ok(reply)
                    if reply.len() == 1 + 3 * group.len() && reply.iter().all(|&v| v >= 0) =>
                {
                    for (&i, r) in group.iter().zip(reply[1..].chunks_exact(3)) {
                        reports[i] = Some(window_report(r, gcra::Admission::Allowed));
                    }
                }
                _ => tracing::warn!(
                    keys = group.len(),
                    "tollgate: could not give back units of a refused request; they return as the windows move on"
                ),
            }
        }
        for (_, group) in groups {
            let mut cmd = evalsha(&REFUND, group.len());
            for &i in &group {
                cmd.arg(parts[i].redis_key.as_slice());
            }
            cmd.arg(now);
            for &i in &group {
                let (p, a) = (&parts[i], answers[i].expect("answered"));
                cmd.arg(a.written.unwrap_or(0))
                    .arg(a.previous)
                    .arg(u64::from(p.cost).saturating_mul(p.quota.t_us()));
            }
            if self.conn.eval::<i64>(&cmd, &REFUND).await.is_err() {
                tracing::warn!(
                    keys = group.len(),
                    "tollgate: could not give back tokens of a refused request; they return as the buckets refill"
                );
            }
        }
        reports
    }

    async fn check(self, parts: Arc<[Part]>) -> Result<Statuses, StoreError> {
        let groups = self.groups(&parts);
        let replies = match &groups[..] {
            // One node, or one slot: one call.
            [(slot, group)] => vec![self.call(&parts, group, *slot).await],
            many => {
                futures_util::future::join_all(
                    many.iter()
                        .map(|(slot, group)| self.call(&parts, group, *slot)),
                )
                .await
            }
        };
        let mut answers: SmallVec<[Option<Answer>; 4]> = SmallVec::from_elem(None, parts.len());
        let mut failure = None;
        for ((_, group), reply) in groups.iter().zip(replies) {
            match reply {
                Ok(a) => {
                    for (&i, answer) in group.iter().zip(a) {
                        answers[i] = Some(answer);
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        let refused = parts
            .iter()
            .zip(&answers)
            .any(|(p, a)| p.mode == Mode::Enforce && a.is_some_and(|a| !a.verdict.is_allowed()));
        let consumed = answers
            .iter()
            .any(|a| a.is_some_and(|a| a.written.is_some()));
        let mut given_back = SmallVec::new();
        if (failure.is_some() || refused) && consumed {
            // Another slot refused or failed: what this request took elsewhere goes back.
            given_back = self.refund(&parts, &answers, &self.now_arg()).await;
        }
        if let Some(e) = failure {
            return Err(StoreError::new(e));
        }
        if !refused {
            self.hold_granted(&parts, &answers);
        }
        let statuses = parts
            .iter()
            .zip(&answers)
            .enumerate()
            .map(|(i, (p, a))| {
                let a = a.expect("every group answered");
                if let Some(after) = a.window {
                    // Given back: the key as it stands (if the give-back answered).
                    return Status::Checked(match a.written {
                        Some(_) if refused => given_back
                            .get(i)
                            .copied()
                            .flatten()
                            .map_or(after, |r| Outcome::window(r, 1_000)),
                        _ => after,
                    });
                }
                let (verdict, reset_after) = match a.written {
                    // Report a limit whose consumption was given back as it stands.
                    Some(_) if refused => {
                        let peek = gcra::peek(p.params(), a.previous, a.now);
                        (peek.verdict, peek.reset_after)
                    }
                    _ => (a.verdict, a.reset_after),
                };
                Status::Checked(Outcome::new(verdict, reset_after, p.params(), 1_000))
            })
            .collect();
        Ok(match refused {
            true => self.bans(&parts, statuses).await,
            false => statuses,
        })
    }

    /// A refused request's limits that ban: whether their keys are banned. A ban begun by
    /// another instance blocks the key's bucket, so this instance's first request of the
    /// key is refused by the bucket; `lua/ban.lua` then says for how long the key is
    /// banned, and the outcome says so ([`Outcome::banned_for`]): the request is refused
    /// as banned, with the ban's time. One more call, only for a refusal by a limit that
    /// bans (those of a key this instance knows as banned never reach the store); a
    /// failed call leaves the refusal as it was.
    async fn bans(&self, parts: &[Part], mut statuses: Statuses) -> Statuses {
        for (p, status) in parts.iter().zip(statuses.iter_mut()) {
            let (Some(bucket), Status::Checked(o)) = (&p.ban, &*status) else {
                continue;
            };
            if p.mode != Mode::Enforce || o.retry_after().is_none() {
                continue;
            }
            if let Ok(reply) = self
                .ban_call_on(bucket, crate::store::BanCall::Remaining)
                .await
                && let Some(remaining) = reply.remaining
            {
                *status = Status::Checked(o.banned_for(remaining));
            }
        }
        statuses
    }

    /// Applies an operation other than a check: one `ops.lua` call per slot.
    async fn update(self, op: Op, parts: Arc<[Part]>) -> Result<Statuses, StoreError> {
        let now = self.now_arg();
        let name = match op {
            Op::Refund => "refund",
            Op::Penalize => "penalize",
            Op::Block(_) => "block",
            Op::Reset => "reset",
            Op::Restore(_) => "restore",
            Op::PenalizeOnce { .. } => "once",
            Op::Check | Op::Debit { .. } | Op::Credit => {
                unreachable!("checks and settles take the check path")
            }
        };
        let amount = |p: &Part| match op {
            Op::Block(d) | Op::Restore(d) => u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            _ => u64::from(p.cost),
        };
        let mut statuses = Statuses::from_elem(Status::Unchecked, parts.len());
        for (_, group) in self.groups(&parts) {
            let markers = match op {
                Op::PenalizeOnce { id } => self.once_markers(&parts, &group, id),
                _ => None,
            };
            let numkeys = group.len() + markers.as_ref().map_or(0, Vec::len);
            let mut cmd = evalsha(&OPS, numkeys);
            for &i in &group {
                cmd.arg(parts[i].redis_key.as_slice());
            }
            for m in markers.iter().flatten() {
                cmd.arg(m.as_slice());
            }
            let name = match (name, &markers) {
                // No marker can share the bucket's slot: charged as sent (see `once_markers`).
                ("once", None) => "penalize",
                (name, _) => name,
            };
            cmd.arg(now.as_str()).arg(name);
            for &i in &group {
                let p = &parts[i];
                let (t, burst) = p.shape();
                cmd.arg(t)
                    .arg(burst)
                    .arg(amount(p))
                    .arg(p.kind(0).as_slice());
            }
            let reply: Vec<i64> = self
                .conn
                .eval(&cmd, &OPS)
                .await
                .map_err(|e| StoreError::new(Failure::Redis(e)))?;
            let width = |i: usize| if parts[i].algorithm.is_window() { 3 } else { 1 };
            let expected = 1 + group.iter().map(|&i| width(i)).sum::<usize>();
            if reply.len() != expected || reply.iter().any(|&v| v < 0) {
                return Err(StoreError::new(Failure::Reply(reply.len())));
            }
            let redis_now = reply[0] as u64;
            let mut rest = &reply[1..];
            for &i in &group {
                let (r, tail) = rest.split_at(width(i));
                rest = tail;
                statuses[i] = if parts[i].algorithm.is_window() {
                    Status::Checked(Outcome::window(
                        window_report(r, gcra::Admission::Allowed),
                        1_000,
                    ))
                } else {
                    let params = parts[i].params();
                    let o = gcra::peek(params, r[0] as u64, redis_now);
                    Status::Checked(Outcome::new(o.verdict, o.reset_after, params, 1_000))
                };
            }
        }
        Ok(statuses)
    }
}

impl RedisBackend {
    /// The markers of an [`Op::PenalizeOnce`] of `id` on the buckets of `group`: one key
    /// per bucket, in its hash slot ([`keys::beside`]), whose presence says the charge was
    /// applied. `None` on a cluster when a bucket's marker would be in another slot (a
    /// prefix with a stray `}` and no hash tag): the charge is then a plain `penalize`, and
    /// a charge sent again may be applied twice.
    fn once_markers(&self, parts: &[Part], group: &[usize], id: u64) -> Option<Vec<Vec<u8>>> {
        let suffix = format!("once:{id:016x}");
        let markers: Vec<Vec<u8>> = group
            .iter()
            .map(|&i| keys::beside(&parts[i].redis_key, suffix.as_bytes()))
            .collect();
        let apart = self.conn.is_cluster()
            && group
                .iter()
                .zip(&markers)
                .any(|(&i, m)| keys::slot(m) != keys::slot(&parts[i].redis_key));
        (!apart).then_some(markers)
    }

    /// Remembers the in-flight members Redis admitted (the request passed), and starts
    /// their renewal.
    fn hold_granted(&self, parts: &[Part], answers: &[Option<Answer>]) {
        let mut any = false;
        for (p, a) in parts.iter().zip(answers) {
            if let (Some((_, member)), Some(a)) = (&p.held, a)
                && a.written.is_some()
            {
                self.held.add(&p.redis_key, member.clone(), p.cost);
                any = true;
            }
        }
        if any && self.held.start_renewing() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(self.clone().renew());
                }
                Err(_) => self.held.renewing_stopped(),
            }
        }
    }

    /// Once a second, while the store lives: moves every member held to now + the
    /// deadline, and adds them back after Redis lost its state. One `ops.lua` call per
    /// key, not waited for one after the other.
    async fn renew(self) {
        let held = Arc::downgrade(&self.held);
        // (`Backend::resets` also starts the epoch probe, at most once a second: this task
        // notices a lost state even when no request reaches Redis.)
        let mut resets = <Self as Backend>::resets(&self);
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(held) = held.upgrade() else {
                return;
            };
            if Arc::strong_count(&held) == 2 {
                // Only this task and the store it runs for: every other handle is gone.
                return;
            }
            let now_resets = <Self as Backend>::resets(&self);
            let restore = now_resets != resets;
            resets = now_resets;
            for (key, members) in held.snapshot() {
                let backend = self.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(
                        std::time::Duration::from_secs(2),
                        backend.hold(key, members, restore),
                    )
                    .await;
                });
            }
        }
    }

    /// One renewal: `ops.lua`'s "hold" of `members` in `key`.
    async fn hold(self, key: Vec<u8>, members: String, restore: bool) {
        let mut cmd = evalsha(&OPS, 1);
        cmd.arg(key.as_slice()).arg(self.now_arg()).arg("hold");
        let list = if restore {
            format!("+{members}")
        } else {
            members
        };
        cmd.arg(self.in_flight_deadline_us)
            .arg(1)
            .arg(0)
            .arg(format!("c:0:{list}"));
        let _: Result<Vec<i64>, _> = self.conn.eval(&cmd, &OPS).await;
    }

    /// Reads the epoch marker in the background, at most once a second (see
    /// [`epoch`]): at once on a call when due, and from the first call on, once a second
    /// on a timer of its own whether calls come or not, for as long as the store lives (an
    /// instance with little traffic is still counted live: a count made only on calls
    /// misses the quiet instances, and each of them takes a larger share of a key it knows
    /// no traffic of during an outage).
    fn probe_epoch(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.epoch.start_ticking() {
            let (conn, prefix) = (self.conn.clone(), self.prefix.clone());
            let (epoch, live_as) = (Arc::downgrade(&self.epoch), self.live_as.clone());
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(epoch::PROBE_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(epoch) = epoch.upgrade() else { return };
                    if epoch.due()
                        && let Err(error) = epoch.probe(&conn, &prefix, &live_as).await
                    {
                        tracing::debug!(%error, "tollgate: reading the Redis epoch marker failed");
                    }
                }
            });
        }
        if !self.epoch.due() {
            return;
        }
        let (conn, epoch, prefix) = (self.conn.clone(), self.epoch.clone(), self.prefix.clone());
        let live_as = self.live_as.clone();
        runtime.spawn(async move {
            if let Err(error) = epoch.probe(&conn, &prefix, &live_as).await {
                tracing::debug!(%error, "tollgate: reading the Redis epoch marker failed");
            }
        });
    }
}

impl Backend for RedisBackend {
    type Table = RedisTable;
    type Future = Pin<Box<dyn Future<Output = Result<Statuses, StoreError>> + Send>>;

    fn table(&self, name: &str) -> RedisTable {
        RedisTable {
            prefix: keys::table_prefix(&self.prefix, name),
            name_hash: crate::algo::algorithm::name_hash(name),
        }
    }

    /// Every algorithm: in-flight units are held per instance under a deadline that the
    /// store renews (see [`RedisStore::in_flight_deadline`]).
    fn supports(&self, _: &Algorithm) -> Result<(), &'static str> {
        Ok(())
    }

    fn apply(&self, op: Op, items: &[Item<'_, RedisTable>]) -> Self::Future {
        let parts: Arc<[Part]> = items
            .iter()
            .map(|item| {
                let span = if item.algorithm.is_calendar() {
                    calendar_span(item.algorithm, &item.quota, self.wall_us())
                } else {
                    None
                };
                let mut redis_key = keys::bucket_key(&item.table.prefix, &item.key);
                if let Some((start, _)) = span {
                    keys::push_window(&mut redis_key, start / 1_000_000);
                }
                (item, span, redis_key)
            })
            .map(|(item, span, redis_key)| Part {
                redis_key,
                span,
                quota: item.quota,
                cost: item.cost,
                mode: item.mode,
                algorithm: item.algorithm,
                phase_us: phase_us(
                    item.algorithm,
                    item.table.name_hash,
                    item.key.phase_hash(),
                    item.quota.period_ns() / 1_000,
                ),
                max_wait_us: if span.is_some() {
                    0
                } else {
                    u64::try_from(item.max_wait.as_micros()).unwrap_or(u64::MAX)
                },
                held: item.algorithm.is_in_flight().then(|| {
                    let members = match op {
                        Op::Check if item.cost > 0 => self.held.member(&self.instance, item.cost),
                        Op::Refund => {
                            let key = keys::bucket_key(&item.table.prefix, &item.key);
                            self.held
                                .take(&key, item.cost)
                                .unwrap_or_else(|| Arc::from(""))
                        }
                        _ => Arc::from(""),
                    };
                    (self.in_flight_deadline_us, members)
                }),
                settle: settle::Settle::of(op, item.algorithm),
                ban: (item.bans && op == Op::Check)
                    .then(|| keys::bucket_key(&item.table.prefix, &item.key)),
            })
            .map(settle::Settle::look_at_windows(op))
            .collect();
        let backend = self.clone();
        match op {
            Op::Check => Box::pin(backend.check(parts)),
            Op::Debit { .. } | Op::Credit => Box::pin(backend.settle(op, parts)),
            other => Box::pin(backend.update(other, parts)),
        }
    }

    fn name(&self) -> &'static str {
        "Redis"
    }

    /// `ops.lua`'s "once": a marker key beside the bucket, for [`PENALIZE_ONCE_FOR`](crate::store::PENALIZE_ONCE_FOR).
    fn penalizes_once(&self) -> bool {
        true
    }

    /// Also reads the epoch marker, at most once a second: `Resilient` asks on every
    /// call, those it decides locally (leases, remembered denials) included, so a store
    /// whose traffic never reaches Redis still notices a reset.
    fn resets(&self) -> u64 {
        self.probe_epoch();
        self.epoch.resets()
    }

    /// The instances that probed the same prefix within the last 5 s (`{prefix}__instances`);
    /// 0 until this store's probe has counted them.
    fn instances(&self) -> u64 {
        self.epoch.instances()
    }

    fn counts_instances(&self) -> bool {
        true
    }

    /// The probe's last round trip (its heartbeat script, once a second).
    fn round_trip(&self) -> Option<std::time::Duration> {
        self.epoch.round_trip()
    }

    /// `lua/ban.lua` on the key's three ban keys (`ban.rs`).
    fn ban(
        &self,
        table: &RedisTable,
        key: &Key,
        call: crate::store::BanCall,
    ) -> Option<crate::store::BanFuture> {
        Some(self.ban_call(table, key, call))
    }
}
