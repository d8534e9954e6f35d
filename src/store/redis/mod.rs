//! [`RedisStore`]: bucket state in Redis.

mod breaker;
mod keys;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;
use smallvec::SmallVec;

use self::breaker::{Breaker, Permit};
use self::keys::{Groups, push_grouped};
use super::memory::{MemoryStore, MemoryTable};
use super::{Checked, Item, Statuses, Store};
use crate::clock::{Clock, SharedClock};
use crate::decision::{Outcome, Status};
use crate::gcra::{self, Params};
use crate::key::Key;
use crate::limit::{FailurePolicy, Mode};
use crate::quota::Quota;

static GCRA: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/gcra.lua")));
static REFUND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/refund.lua")));

/// Integers per limit in a `gcra.lua` reply (after the leading `now`).
const REPLY_WIDTH: usize = 3;

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Connection {
    /// Sends `evalsha` (an `EVALSHA` of `script`); on NOSCRIPT (after a restart, a failover
    /// or `SCRIPT FLUSH`) loads the script (on every node of a cluster) and sends it again.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        evalsha: &redis::Cmd,
        script: &Script,
    ) -> redis::RedisResult<T> {
        match self {
            Connection::Single(c) => eval_on(&mut c.clone(), evalsha, script).await,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(c) => eval_on(&mut c.clone(), evalsha, script).await,
        }
    }

    fn is_cluster(&self) -> bool {
        !matches!(self, Connection::Single(_))
    }
}

async fn eval_on<T: redis::FromRedisValue>(
    conn: &mut impl redis::aio::ConnectionLike,
    evalsha: &redis::Cmd,
    script: &Script,
) -> redis::RedisResult<T> {
    match evalsha.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            evalsha.query_async(conn).await
        }
        result => result,
    }
}

/// The head of an `EVALSHA` of `script` with `keys` keys: the caller appends the keys,
/// then the script's arguments.
fn evalsha(script: &Script, keys: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys);
    cmd
}

/// Bucket state in Redis: limits shared by every instance (feature `redis`).
///
/// # How it works
///
/// One request is one `EVALSHA` of `lua/gcra.lua` carrying every limit's key: the script
/// checks all limits and writes all or none, in one round trip, atomically. With Redis
/// Cluster, keys in different hash slots cannot share a script: they are grouped by slot,
/// one script per group runs concurrently, and when one group refused while another
/// consumed, `lua/refund.lua` gives back what the consuming groups took.
///
/// Time is Redis `TIME` (one clock for all instances) unless the store is given a
/// [`caller_time`](RedisStore::caller_time) clock. Every written key expires when its
/// bucket is full again (`PX = reset_after`), so idle keys cost nothing.
///
/// Failures never become errors: each limit's [`FailurePolicy`] decides (by default a
/// local in-memory limiter with the same quota takes over). Each call has a timeout; after
/// repeated failures a breaker skips Redis for a cool-down and then lets one request probe
/// it, so a dead Redis costs microseconds per request and recovery is automatic.
///
/// A denied key is remembered locally until it could pass again (the deny cache): until
/// then its requests are refused without a round trip, which keeps Redis's load flat when
/// one client floods. The local deadline is counted from the moment the request was sent,
/// so it is never later than the one Redis computed. It can be later than the bucket's
/// real state when tokens come back meanwhile (a Redis Cluster request refused in another
/// slot gives back what it took, or another instance's request is refunded): the key then
/// waits at most until the remembered deadline. It never lets through what Redis would
/// refuse. Disable it with [`deny_cache(false)`](Self::deny_cache).
///
/// ```no_run
/// use tollgate::{key::PeerIp, store::RedisStore, Limit, Quota, RateLimitLayer};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let conn = redis::Client::open("redis://127.0.0.1:6379/")?.get_connection_manager().await?;
/// let store = RedisStore::new(conn).prefix("myapp:rl:");
/// let layer = RateLimitLayer::builder(store)
///     .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// Configure the store before building layers with it: its tables take the prefix they
/// see then, and clones made earlier keep the earlier settings.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    conn: Connection,
    prefix: Arc<[u8]>,
    /// The caller's time in microseconds since the Unix epoch; `None` for Redis `TIME`.
    now: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
    timeout: Duration,
    breaker: Arc<Breaker>,
    /// The clock of the local stores: the caller's clock with caller time, else monotonic.
    clock: SharedClock,
    fallback_max_keys: usize,
    fallback: MemoryStore<SharedClock>,
    deny_cache: Option<MemoryStore<SharedClock>>,
}

/// Keys the deny cache remembers at most.
const DENY_CACHE_MAX_KEYS: usize = 100_000;

impl Inner {
    fn fallback_store(&self) -> MemoryStore<SharedClock> {
        MemoryStore::with_clock(self.clock.clone()).max_keys(self.fallback_max_keys)
    }

    fn deny_cache_store(&self) -> MemoryStore<SharedClock> {
        MemoryStore::with_clock(self.clock.clone()).max_keys(DENY_CACHE_MAX_KEYS)
    }
}

/// One limit's buckets in a [`RedisStore`] (see [`Store::table`]).
pub struct RedisTable {
    prefix: Box<[u8]>,
    fallback: MemoryTable,
    deny: Option<MemoryTable>,
}

impl fmt::Debug for RedisTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTable")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("cluster", &self.inner.conn.is_cluster())
            .field("prefix", &String::from_utf8_lossy(&self.inner.prefix))
            .field("caller_time", &self.inner.now.is_some())
            .field("timeout", &self.inner.timeout)
            .field("deny_cache", &self.inner.deny_cache.is_some())
            .field("breaker_open", &self.inner.breaker.is_open())
            .finish()
    }
}

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
const DEFAULT_BREAKER_FAILURES: u32 = 3;
const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(1);

impl RedisStore {
    /// A store on one Redis server (or a primary with replicas behind one address),
    /// through an auto-reconnecting connection manager.
    pub fn new(conn: ConnectionManager) -> Self {
        Self::with_connection(Connection::Single(conn))
    }

    /// A store on a Redis Cluster (feature `redis-cluster`).
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn cluster(conn: redis::cluster_async::ClusterConnection) -> Self {
        Self::with_connection(Connection::Cluster(conn))
    }

    fn with_connection(conn: Connection) -> Self {
        let clock = SharedClock::default();
        Self {
            inner: Arc::new(Inner {
                conn,
                prefix: Arc::from(&b"tollgate:"[..]),
                now: None,
                timeout: DEFAULT_TIMEOUT,
                breaker: Arc::new(Breaker::new(DEFAULT_BREAKER_FAILURES, DEFAULT_COOL_DOWN)),
                fallback_max_keys: super::DEFAULT_MAX_KEYS,
                fallback: MemoryStore::with_clock(clock.clone()),
                deny_cache: Some(
                    MemoryStore::with_clock(clock.clone()).max_keys(DENY_CACHE_MAX_KEYS),
                ),
                clock,
            }),
        }
    }

    fn configure(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => f(inner),
            None => {
                let mut inner = (*self.inner).clone();
                f(&mut inner);
                self.inner = Arc::new(inner);
            }
        }
        self
    }

    /// The prefix of every key (default `"tollgate:"`). Keys are
    /// `{prefix}{limit}:{key}`. With Redis Cluster, a prefix holding a hash tag, e.g.
    /// `"{rl}:"`, puts every bucket in one slot: every request is then one atomic script
    /// again, at the price of one busy slot.
    pub fn prefix(self, prefix: impl AsRef<[u8]>) -> Self {
        let prefix = Arc::from(prefix.as_ref());
        self.configure(|i| i.prefix = prefix)
    }

    /// Takes the time from `clock` (nanoseconds since the Unix epoch, e.g.
    /// [`SystemClock`](crate::clock::SystemClock)) instead of Redis `TIME`; the local
    /// fallback limiter and the deny cache then use the same clock. For tests, a
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
        let micros = clock.clone();
        let now: Arc<dyn Fn() -> u64 + Send + Sync> = Arc::new(move || micros.now() / 1_000);
        self.configure(|i| {
            i.now = Some(now);
            i.clock = clock;
            i.fallback = i.fallback_store();
            i.deny_cache = i.deny_cache.is_some().then(|| i.deny_cache_store());
        })
    }

    /// How long one call may take before it counts as a failure (default 50 ms).
    pub fn timeout(self, timeout: Duration) -> Self {
        self.configure(|i| i.timeout = timeout)
    }

    /// After `failures` consecutive failures (default 3), skip Redis for `cool_down`
    /// (default 1 s), then let one request probe it.
    pub fn breaker(self, failures: u32, cool_down: Duration) -> Self {
        let breaker = Arc::new(Breaker::new(failures, cool_down));
        self.configure(|i| i.breaker = breaker)
    }

    /// Whether denials are remembered locally until they expire (default: yes, up to
    /// 100,000 keys).
    pub fn deny_cache(self, enabled: bool) -> Self {
        self.configure(|i| i.deny_cache = enabled.then(|| i.deny_cache_store()))
    }

    /// The key cap of the local limiter used by limits whose policy is
    /// [`FailurePolicy::Fallback`] while Redis fails (default
    /// [`DEFAULT_MAX_KEYS`](super::DEFAULT_MAX_KEYS), as any [`MemoryStore`]).
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn fallback_max_keys(self, n: usize) -> Self {
        assert!(n > 0, "fallback_max_keys must be at least 1");
        self.configure(|i| {
            i.fallback_max_keys = n;
            i.fallback = i.fallback_store();
        })
    }

    /// `true` while the breaker skips Redis.
    pub fn is_unavailable(&self) -> bool {
        self.inner.breaker.is_open()
    }
}

/// What one limit of a request needs once the store answers.
struct Part {
    key: Key,
    redis_key: Vec<u8>,
    quota: Quota,
    cost: u32,
    mode: Mode,
    policy: FailurePolicy,
    fallback: MemoryTable,
    deny: Option<MemoryTable>,
}

impl Part {
    fn params(&self) -> Params {
        Params::new(self.quota.t_us(), self.quota.burst_size())
    }
}

/// One limit's answer from `gcra.lua`, in microseconds.
#[derive(Clone, Copy)]
struct Answer {
    verdict: gcra::Verdict,
    /// Until the bucket is full again, after this request.
    reset_after: u64,
    /// The TAT written, if the request consumed from this limit.
    written: Option<u64>,
    /// The TAT before the request.
    previous: u64,
    /// Redis's `now` for this call.
    now: u64,
}

#[derive(Debug)]
enum Failure {
    Timeout(Duration),
    Redis(redis::RedisError),
    Reply(usize),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Timeout(d) => write!(f, "no answer within {d:?}"),
            Failure::Redis(e) => write!(f, "{e}"),
            Failure::Reply(n) => write!(f, "unexpected reply of {n} integers"),
        }
    }
}

/// A fingerprint of a quota: a denial remembered under one quota says nothing about
/// another (after a plan upgrade the key may pass at once).
fn quota_salt(q: &Quota) -> u64 {
    q.t_us().wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ q.burst_size().rotate_left(29)
}

impl RedisStore {
    /// The statuses of a request refused by a remembered denial, without a round trip.
    fn cached_denial(&self, items: &[Item<'_, RedisTable>]) -> Option<Statuses> {
        let cache = self.inner.deny_cache.as_ref()?;
        let mut refused = false;
        let statuses = items
            .iter()
            .map(|item| {
                let table = item.table.deny.as_ref()?;
                if item.mode != Mode::Enforce || item.cost == 0 {
                    return None;
                }
                let (until, now) = cache.marker(table, &item.key, quota_salt(&item.quota));
                if until <= now {
                    return None;
                }
                refused = true;
                Some(Status::Checked(cached_outcome(
                    &item.quota,
                    item.cost,
                    until - now,
                )))
            })
            .map(|s| s.unwrap_or(Status::Unchecked))
            .collect();
        refused.then_some(statuses)
    }

    /// Remembers that `part` cannot pass a request of cost 1 for `wait_us` from `sent_at`.
    fn remember_denial(&self, part: &Part, sent_at: u64, answer: &Answer) {
        let (Some(cache), Some(table)) = (&self.inner.deny_cache, &part.deny) else {
            return;
        };
        let p = part.params();
        // The TAT is `now + reset_after`; one token is free at `TAT + T - tau`.
        let wait_us = (answer.reset_after + p.t()).saturating_sub(p.tau());
        if wait_us > 0 {
            // From the moment the request was sent: Redis's answer can only be later.
            let until = sent_at.saturating_add(wait_us.saturating_mul(1_000));
            cache.raise_marker(table, &part.key, quota_salt(&part.quota), until);
        }
    }

    fn local_now(&self) -> u64 {
        match &self.inner.deny_cache {
            Some(c) => c.clock().now(),
            None => 0,
        }
    }

    /// Asks Redis about the limits of one group (keys in one slot).
    async fn call(
        &self,
        parts: &[Part],
        group: &[usize],
        now: &str,
    ) -> Result<Vec<Answer>, Failure> {
        let mut cmd = evalsha(&GCRA, group.len());
        for &i in group {
            cmd.arg(parts[i].redis_key.as_slice());
        }
        cmd.arg(now);
        for &i in group {
            let p = &parts[i];
            cmd.arg(p.quota.t_us())
                .arg(p.quota.burst_size())
                .arg(p.cost)
                .arg(u8::from(p.mode == Mode::Enforce));
        }
        let reply: Vec<i64> =
            tokio::time::timeout(self.inner.timeout, self.inner.conn.eval(&cmd, &GCRA))
                .await
                .map_err(|_| Failure::Timeout(self.inner.timeout))?
                .map_err(Failure::Redis)?;
        parse_reply(&reply, parts, group)
    }

    /// Gives back what the consuming groups took for a refused request.
    async fn refund(&self, parts: &[Part], answers: &[Option<Answer>], now: &str) {
        let mut groups = Groups::new();
        for (i, answer) in answers.iter().enumerate() {
            if answer.is_some_and(|a| a.written.is_some()) {
                push_grouped(&mut groups, &parts[i].redis_key, i);
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
            let result = tokio::time::timeout(
                self.inner.timeout,
                self.inner.conn.eval::<i64>(&cmd, &REFUND),
            )
            .await;
            if !matches!(result, Ok(Ok(_))) {
                tracing::warn!(
                    keys = group.len(),
                    "tollgate: could not give back tokens of a refused request; they return as the buckets refill"
                );
            }
        }
    }

    /// Decides the request from Redis's answers (`None`: that limit's call failed).
    /// Returns the statuses and whether Redis writes must be undone.
    fn settle(&self, parts: &[Part], answers: &[Option<Answer>]) -> (Statuses, bool) {
        let mut statuses: Statuses = parts
            .iter()
            .zip(answers)
            .map(|(p, a)| match (a, p.policy) {
                (Some(a), _) => {
                    Status::Checked(Outcome::new(a.verdict, a.reset_after, p.params(), 1_000))
                }
                (None, FailurePolicy::Allow) => Status::FailedOpen,
                (None, FailurePolicy::Deny) => Status::FailedClosed,
                (None, _) => Status::Unchecked, // fallback, decided below
            })
            .collect();
        let refuses = |s: &Status, p: &Part| {
            p.mode == Mode::Enforce
                && match s {
                    Status::Checked(o) | Status::Fallback(o) => !o.is_allowed(),
                    Status::FailedClosed => true,
                    _ => false,
                }
        };
        let mut refused = statuses.iter().zip(parts).any(|(s, p)| refuses(s, p));
        let fallback: SmallVec<[usize; 4]> = (0..parts.len())
            .filter(|&i| answers[i].is_none() && parts[i].policy == FailurePolicy::Fallback)
            .collect();
        if !fallback.is_empty() && !refused {
            let items: SmallVec<[Item<'_, MemoryTable>; 4]> = fallback
                .iter()
                .map(|&i| {
                    let p = &parts[i];
                    Item::new(&p.fallback, p.key.clone(), p.quota, p.cost).mode(p.mode)
                })
                .collect();
            let Checked::Ready(local) = self.inner.fallback.check(&items) else {
                unreachable!("the memory store answers at once")
            };
            for (&i, s) in fallback.iter().zip(local) {
                statuses[i] = match s {
                    Status::Checked(o) => Status::Fallback(o),
                    other => other,
                };
            }
            refused = statuses.iter().zip(parts).any(|(s, p)| refuses(s, p));
        }
        let undo = refused
            && answers
                .iter()
                .any(|a| a.is_some_and(|a| a.written.is_some()));
        if undo {
            // Report the consuming limits as they stand without this request.
            for (i, answer) in answers.iter().enumerate() {
                if let Some(a) = answer
                    && a.written.is_some()
                {
                    let peek = gcra::peek(parts[i].params(), a.previous, a.now);
                    statuses[i] = Status::Checked(Outcome::new(
                        peek.verdict,
                        peek.reset_after,
                        parts[i].params(),
                        1_000,
                    ));
                }
            }
        }
        (statuses, undo)
    }

    async fn run(self, parts: SmallVec<[Part; 4]>) -> Statuses {
        let sent_at = self.local_now();
        let now = self
            .inner
            .now
            .as_ref()
            .map(|f| f().to_string())
            .unwrap_or_default();
        let mut groups = Groups::new();
        if self.inner.conn.is_cluster() {
            for (i, p) in parts.iter().enumerate() {
                push_grouped(&mut groups, &p.redis_key, i);
            }
        } else {
            groups.push((keys::slot(b""), (0..parts.len()).collect()));
        }
        let replies = match &groups[..] {
            // One node, or one slot: one call.
            [(_, group)] => vec![self.call(&parts, group, &now).await],
            many => {
                futures_util::future::join_all(
                    many.iter().map(|(_, group)| self.call(&parts, group, &now)),
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
        match &failure {
            Some(e) => {
                tracing::debug!(error = %e, "tollgate: Redis call failed");
                self.inner.breaker.failure(e);
            }
            None => self.inner.breaker.success(),
        }
        for (p, a) in parts.iter().zip(&answers) {
            if let Some(a) = a
                && p.mode == Mode::Enforce
                && matches!(a.verdict, gcra::Verdict::Denied { .. })
            {
                self.remember_denial(p, sent_at, a);
            }
        }
        let (statuses, undo) = self.settle(&parts, &answers);
        if undo {
            self.refund(&parts, &answers, &now).await;
        }
        statuses
    }
}

/// Reads `gcra.lua`'s reply for the limits `group` of `parts`: the verdicts and times to
/// full, from which everything else follows (the script writes `now + reset_after` for each
/// consuming limit of a request no enforcing limit refused).
fn parse_reply(reply: &[i64], parts: &[Part], group: &[usize]) -> Result<Vec<Answer>, Failure> {
    let malformed = || Failure::Reply(reply.len());
    let (&now, rest) = reply.split_first().ok_or_else(malformed)?;
    if rest.len() != group.len() * REPLY_WIDTH || reply.iter().any(|&v| v < 0) {
        return Err(malformed());
    }
    let now = now as u64;
    let refused = group
        .iter()
        .zip(rest.chunks_exact(REPLY_WIDTH))
        .any(|(&i, r)| parts[i].mode == Mode::Enforce && r[0] != 0);
    group
        .iter()
        .zip(rest.chunks_exact(REPLY_WIDTH))
        .map(|(&i, r)| {
            let p = &parts[i];
            let params = p.params();
            let cost = u64::from(p.cost);
            let reset_after = r[1] as u64;
            let verdict = match r[0] {
                0 => gcra::Verdict::Allowed,
                1 => gcra::Verdict::Denied {
                    // `after` is the TAT as it stands: `reset_after + cost * T` takes the
                    // request, beyond `tau` by the wait.
                    retry_after: (reset_after + cost * params.t())
                        .checked_sub(params.tau())
                        .filter(|&w| w > 0)
                        .ok_or_else(malformed)?,
                },
                2 => gcra::Verdict::Never,
                _ => return Err(malformed()),
            };
            let written =
                (verdict.is_allowed() && cost > 0 && !refused).then_some(now + reset_after);
            Ok(Answer {
                verdict,
                reset_after,
                written,
                previous: r[2] as u64,
                now,
            })
        })
        .collect()
}

/// What a remembered denial tells the client: no token for `wait_ns` (local time).
fn cached_outcome(quota: &Quota, cost: u32, wait_ns: u64) -> Outcome {
    let params = Params::new(quota.t_us() * 1_000, quota.burst_size());
    let verdict = if u64::from(cost) > quota.burst_size() {
        gcra::Verdict::Never
    } else {
        gcra::Verdict::Denied {
            retry_after: wait_ns + u64::from(cost - 1) * params.t(),
        }
    };
    // One token is free at TAT + T - tau, `wait_ns` from now: the TAT is this far off.
    let reset_after = wait_ns + params.tau() - params.t();
    Outcome::new(verdict, reset_after, params, 1)
}

impl Store for RedisStore {
    type Table = RedisTable;
    type Future = Pin<Box<dyn Future<Output = Statuses> + Send>>;

    fn table(&self, name: &str) -> RedisTable {
        RedisTable {
            prefix: keys::table_prefix(&self.inner.prefix, name),
            fallback: self.inner.fallback.table(name),
            deny: self.inner.deny_cache.as_ref().map(|c| c.table(name)),
        }
    }

    fn check(&self, items: &[Item<'_, RedisTable>]) -> Checked<Self::Future> {
        if items.is_empty() {
            return Checked::Ready(Statuses::new());
        }
        if let Some(statuses) = self.cached_denial(items) {
            return Checked::Ready(statuses);
        }
        let parts: SmallVec<[Part; 4]> = items
            .iter()
            .map(|item| Part {
                key: item.key.clone(),
                redis_key: keys::bucket_key(&item.table.prefix, &item.key),
                quota: item.quota,
                cost: item.cost,
                mode: item.mode,
                policy: item.on_failure,
                fallback: item.table.fallback.clone(),
                deny: item.table.deny.clone(),
            })
            .collect();
        if self.inner.breaker.permit() == Permit::Skip {
            let none: SmallVec<[Option<Answer>; 4]> = SmallVec::from_elem(None, parts.len());
            return Checked::Ready(self.settle(&parts, &none).0);
        }
        Checked::Pending(Box::pin(self.clone().run(parts)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Verdict;

    #[test]
    fn replies_are_validated() {
        let table = MemoryStore::new().table("t");
        // T = 100 ms, burst 10, cost 2; and a shadow limit of cost 1.
        let part = |cost, mode| Part {
            key: Key::global(),
            redis_key: b"t:".to_vec(),
            quota: Quota::per_second(10),
            cost,
            mode,
            policy: FailurePolicy::Fallback,
            fallback: table.clone(),
            deny: None,
        };
        let parts = [part(2, Mode::Enforce), part(1, Mode::Shadow)];
        let now = 1_700_000_000_000_000i64;
        for bad in [
            &[][..],
            &[now, 0, 200_000][..],
            &[now, 0, 200_000, 0, 0, 100_000][..],
            &[now, 0, -1, 0, 0, 100_000, 0][..],
            &[now, 3, 200_000, 0, 0, 100_000, 0][..],
            // a denial whose wait would be zero
            &[now, 1, 800_000, 0, 0, 100_000, 0][..],
        ] {
            assert!(parse_reply(bad, &parts, &[0, 1]).is_err(), "{bad:?}");
        }
        // Both pass: both consumed, written at now + reset_after.
        let a = parse_reply(&[now, 0, 200_000, 0, 0, 100_000, 0], &parts, &[0, 1]).unwrap();
        assert_eq!(a[0].verdict, gcra::Verdict::Allowed);
        assert_eq!(a[0].written, Some(now as u64 + 200_000));
        assert_eq!(a[1].written, Some(now as u64 + 100_000));
        // The enforcing limit refuses (900 ms to full, cost 2 needs 1.1 s): nothing written,
        // and the wait is what the request lacks.
        let d = parse_reply(&[now, 1, 900_000, 5, 0, 100_000, 0], &parts, &[0, 1]).unwrap();
        assert_eq!(
            d[0].verdict,
            gcra::Verdict::Denied {
                retry_after: 100_000
            }
        );
        assert_eq!(d[0].previous, 5);
        assert_eq!((d[0].written, d[1].written), (None, None));
        // A shadow limit's refusal does not stop the others.
        let s = parse_reply(&[now, 0, 200_000, 0, 1, 1_000_000, 0], &parts, &[0, 1]).unwrap();
        assert_eq!(s[0].written, Some(now as u64 + 200_000));
    }

    #[test]
    fn cached_denials_report_the_remembered_wait() {
        let q = Quota::per_second(10); // T = 100 ms, burst 10
        let o = cached_outcome(&q, 3, 40_000_000);
        assert_eq!(
            o.verdict(),
            Verdict::Denied {
                retry_after: Duration::from_millis(240)
            }
        );
        assert_eq!(o.next_after(), Some(Duration::from_millis(40)));
        assert_eq!(o.reset_after(), Duration::from_millis(940));
        assert_eq!(cached_outcome(&q, 11, 1).verdict(), Verdict::Never);
    }
}
