//! [`Pacer`]: the units of one long-lived request (messages, bytes) charged to a limit one
//! by one, waiting for them or refusing them, and everything it holds given back when it
//! is dropped.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use crate::audit::{AuditLog, Queued, Violation, bounded_route};
use crate::engine::delay::Place;
use crate::limiter::{Limiter, LimiterError};
use crate::model::decision::LimitDecision;
use crate::model::key::Key;
use crate::model::stream::{Direction, OverLimit, Per, Streaming};

/// Why a [`Pacer`] refused a charge.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum PaceError {
    /// The units are over the limit ([`OverLimit::End`]), or would wait longer than
    /// `max_wait` ([`OverLimit::Wait`]): the limit's decision, whose
    /// [`retry_after`](LimitDecision::retry_after) says when they would pass.
    Refused(LimitDecision),
    /// The limit cannot be charged (unknown name, an algorithm that takes no
    /// reservations).
    Limiter(LimiterError),
}

impl PaceError {
    /// How long until the units would pass, if a wait helps.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Refused(d) => d.retry_after(),
            Self::Limiter(_) => None,
        }
    }
}

impl fmt::Display for PaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(d) => match d.retry_after() {
                Some(after) => write!(
                    f,
                    "over limit \"{}\": retry after {} ms",
                    d.name,
                    after.as_millis()
                ),
                None => write!(f, "over limit \"{}\"", d.name),
            },
            Self::Limiter(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PaceError {}

type Charging = Pin<Box<dyn Future<Output = Result<(), PaceError>> + Send>>;

/// The units of one stream (a WebSocket, a gRPC stream, a body) charged to one limit for
/// one key: made by [`Limiter::pacer`] once, when the stream starts, so the key is
/// computed once. It follows the limit's stream settings ([`LimitSpec::per`](crate::LimitSpec::per),
/// [`direction`](crate::LimitSpec::direction), [`over_limit`](crate::LimitSpec::over_limit),
/// [`rate_after`](crate::LimitSpec::rate_after), [`unit`](crate::LimitSpec::unit)), in code or in a
/// rules file.
///
/// Each [`charge`](Self::charge) of `n` units takes them from the key's bucket, in the
/// limit's own store (memory or Redis, shared with every other user of the limit):
/// at once if they are there; otherwise it waits until they are due
/// ([`OverLimit::Wait`], bounded by `max_wait`) or is refused ([`OverLimit::End`]).
///
/// A token of the limit may stand for several units ([`unit`](Self::unit)): a quota
/// counts at most one token per microsecond, so a limit of bytes counts in KiB (1 MiB/s is
/// `Quota::per_second(1024)` with `unit(1024)`). A charge takes whole tokens, rounded up;
/// the bytes a token paid for and the charge did not use pay for the next charge.
///
/// Tokens may be taken ahead in [`batch`](Self::batch)es: with a batch of 64 tokens of
/// 1 KiB, a charge of 1 byte takes 64 KiB from the bucket and the next 65,535 bytes pass
/// without asking the store (one store call per batch; with Redis, one round trip per
/// 64 KiB). What a pacer took and did not use is given back when it is dropped, as is a
/// reservation it was waiting for: a stream that ends or is cancelled holds nothing.
///
/// A charge larger than the limit's burst is taken in pieces of at most the burst, one
/// after the other (in [`OverLimit::End`] the second piece finds the bucket empty, so a
/// charge above the burst is refused there).
///
/// Memory per pacer: 240 bytes on 64-bit targets, 272 with feature `metrics` (the handle,
/// a shared reference; the key, held inline; the metric handles) and nothing on the heap
/// while idle; while a charge is under way, one boxed future. Nothing grows with the
/// stream's length: 10,000 idle streams hold 2.4 to 2.7 MB of pacers.
///
/// ```
/// use std::time::Duration;
/// use tollgate::pace::{OverLimit, Per};
/// use tollgate::{store::MemoryStore, LimitSpec, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::builder(MemoryStore::new())
///     .limit(LimitSpec::new("messages", Quota::per_second(10).burst(2)).per(Per::Message))
///     .build()?;
/// let mut pacer = limiter.pacer("messages", "alice")?.over_limit(OverLimit::End);
/// pacer.charge(1).await?;
/// pacer.charge(1).await?;
/// let refused = pacer.charge(1).await.unwrap_err(); // the burst is spent
/// assert!(refused.retry_after().is_some());
///
/// let mut waits = limiter.pacer("messages", "bob")?; // waits, by default
/// let start = tokio::time::Instant::now();
/// for _ in 0..4 {
///     waits.charge(1).await?; // two at once, then one every 100 ms
/// }
/// assert!(start.elapsed() >= Duration::from_millis(200));
/// # Ok(()) }
/// ```
pub struct Pacer {
    limiter: Limiter,
    limit: &'static str,
    key: Key,
    over: OverLimit,
    per: Per,
    direction: Direction,
    rate_after: u64,
    /// Units per token.
    unit: u64,
    /// The most tokens one store call takes: the limit's burst.
    burst: u64,
    /// Tokens taken per call when fewer are needed.
    batch: u64,
    /// Units paid for and not yet used.
    credit: u64,
    /// Units of the charge under way still to be paid for.
    owed: u64,
    /// The store call under way, with the tokens it takes.
    charging: Option<(Charging, u64)>,
    /// The units of the charge under way (for the metrics).
    asked: u64,
    /// `tollgate_stream_units_total` (feature `metrics`).
    metrics: crate::observe::probe::StreamMetrics,
    /// Where refusals are audited, if anywhere.
    audit: Option<Box<Audited>>,
    /// The limit's rule id, for the audit log.
    rule_id: Option<u64>,
    /// How many streams and requests of the limit wait ([`OverLimit::Wait`]'s
    /// `max_waiters` bounds it).
    waiting: Arc<AtomicUsize>,
}

/// Where a stream's refusals go: an audit log, and what to say of the stream.
#[derive(Clone)]
struct Audited {
    log: AuditLog,
    route: String,
    client: Option<IpAddr>,
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("limit", &self.limit)
            .field("key", &self.key)
            .field("over", &self.over)
            .field("unit", &self.unit)
            .field("batch", &self.batch)
            .field("credit", &self.credit)
            .field("charging", &self.charging.is_some())
            .finish()
    }
}

impl Pacer {
    pub(crate) fn new(
        limiter: Limiter,
        limit: &'static str,
        key: Key,
        burst: u64,
        stream: Streaming,
        waiting: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            limiter,
            limit,
            key,
            over: stream.over_limit.unwrap_or_default(),
            per: stream.per,
            direction: stream.direction.unwrap_or_default(),
            rate_after: stream.rate_after.unwrap_or(0),
            unit: u64::from(stream.unit.unwrap_or(1).max(1)),
            burst: burst.clamp(1, u64::from(u32::MAX)),
            batch: 1,
            credit: 0,
            owed: 0,
            charging: None,
            asked: 0,
            metrics: crate::observe::probe::StreamMetrics::new(limit, per_label(stream.per)),
            audit: None,
            rule_id: None,
            waiting,
        }
    }

    pub(crate) fn with_rule_id(mut self, rule_id: Option<u64>) -> Self {
        self.rule_id = rule_id;
        self
    }

    /// A pacer of the same limit and key with the same settings, holding nothing: for the
    /// other direction of a stream (a WebSocket's sent messages, a body's other end), so
    /// that each direction has one charge under way at most.
    pub fn sibling(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            limit: self.limit,
            key: self.key.clone(),
            over: self.over,
            per: self.per,
            direction: self.direction,
            rate_after: self.rate_after,
            unit: self.unit,
            burst: self.burst,
            batch: self.batch,
            credit: 0,
            owed: 0,
            charging: None,
            asked: 0,
            metrics: crate::observe::probe::StreamMetrics::new(self.limit, per_label(self.per)),
            audit: self.audit.clone(),
            rule_id: self.rule_id,
            waiting: self.waiting.clone(),
        }
    }

    /// Records each refusal in `log` (a [`Violation`](crate::audit::Violation) of the
    /// limit, with the stream's key, `route`, say the WebSocket's path or the gRPC method,
    /// and `client`, its address if known), as the layer records refused requests.
    pub fn audit(mut self, log: AuditLog, route: &str, client: Option<IpAddr>) -> Self {
        self.audit = Some(Box::new(Audited {
            log,
            route: bounded_route(route),
            client,
        }));
        self
    }

    /// What this stream does over the limit, whatever the limit's settings say.
    pub fn over_limit(mut self, over: OverLimit) -> Self {
        self.over = over;
        self
    }

    /// Each token of the limit stands for `units` units (bytes per token, for a limit of
    /// bytes counted in KiB: 1024), whatever the limit's [`unit`](crate::LimitSpec::unit) says.
    /// 0 is taken as 1.
    pub fn unit(mut self, units: u32) -> Self {
        self.unit = u64::from(units.max(1));
        self
    }

    /// Takes tokens from the store `tokens` at a time at least (at most the limit's
    /// burst): fewer store calls, and a stream may run up to a batch ahead of its bucket
    /// (what it did not use is given back when the pacer is dropped). Default 1.
    pub fn batch(mut self, tokens: u32) -> Self {
        self.batch = u64::from(tokens.max(1)).min(self.burst);
        self
    }

    /// The limit this pacer charges.
    pub fn limit(&self) -> &'static str {
        self.limit
    }

    /// The key this pacer charges.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// What it does over the limit.
    pub fn over(&self) -> OverLimit {
        self.over
    }

    /// What the limit counts: messages or bytes (or requests, for a limit of requests
    /// charged from a stream).
    pub fn per(&self) -> Per {
        self.per
    }

    /// Which way the limit counts.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// The bytes a body lets through uncharged first ([`LimitSpec::rate_after`](crate::LimitSpec::rate_after)).
    pub fn rate_after(&self) -> u64 {
        self.rate_after
    }

    /// Units paid for and not yet used (what a whole token of it is worth goes back on
    /// drop).
    pub fn credit(&self) -> u64 {
        self.credit
    }

    /// The most units one store call pays for: the limit's burst, in units.
    pub fn piece(&self) -> u64 {
        self.burst.saturating_mul(self.unit)
    }

    /// Charges `units`: ready once they are paid for, or refused. A charge that returned
    /// `Pending` must be polled again with the same `units` (they are remembered; the
    /// argument of the later polls is ignored until it completes).
    pub fn poll_charge(&mut self, cx: &mut Context<'_>, units: u64) -> Poll<Result<(), PaceError>> {
        if self.owed == 0 && self.charging.is_none() {
            if units <= self.credit {
                self.credit -= units;
                self.metrics.record(true, units);
                return Poll::Ready(Ok(()));
            }
            self.asked = units;
            self.owed = units - self.credit;
            self.credit = 0;
        }
        loop {
            if let Some((charging, tokens)) = &mut self.charging {
                let paid = tokens.saturating_mul(self.unit);
                let result = std::task::ready!(charging.as_mut().poll(cx));
                self.charging = None;
                match result {
                    Ok(()) => {
                        let used = paid.min(self.owed);
                        self.owed -= used;
                        self.credit += paid - used;
                    }
                    Err(e) => {
                        self.owed = 0;
                        self.metrics.record(false, self.asked);
                        self.audited(&e);
                        return Poll::Ready(Err(e));
                    }
                }
            }
            if self.owed == 0 {
                self.metrics.record(true, self.asked);
                return Poll::Ready(Ok(()));
            }
            let tokens = self
                .owed
                .div_ceil(self.unit)
                .max(self.batch)
                .min(self.burst);
            self.charging = Some((self.start(tokens), tokens));
        }
    }

    /// Charges `units` (see [`poll_charge`](Self::poll_charge)); dropping the future
    /// before it is ready gives back what it took.
    pub async fn charge(&mut self, units: u64) -> Result<(), PaceError> {
        std::future::poll_fn(|cx| self.poll_charge(cx, units)).await
    }

    /// Records `refusal` in the audit log, if the pacer has one.
    fn audited(&self, refusal: &PaceError) {
        let (Some(audit), PaceError::Refused(decision)) = (&self.audit, refusal) else {
            return;
        };
        audit.log.record(|| Queued {
            violation: Violation {
                limit: self.limit,
                key: String::new(),
                client: audit.client,
                route: audit.route.clone(),
                tokens_left: decision.remaining().unwrap_or(0),
                retry_after: decision.retry_after(),
                cost: u32::try_from(self.asked).unwrap_or(u32::MAX),
                rule_id: self.rule_id,
                shadow: false,
                at: SystemTime::now(),
                banned: false,
            },
            key: Some(self.key.clone()),
            redact: None,
        });
    }

    /// One store call of `tokens` (at most `u32::MAX`, since the burst is).
    fn start(&self, tokens: u64) -> Charging {
        let units = u32::try_from(tokens).unwrap_or(u32::MAX);
        match self.over {
            OverLimit::End => self.check(units),
            OverLimit::Wait {
                max_wait,
                max_waiters,
            } => {
                if self.waiting.load(Ordering::Relaxed) >= max_waiters {
                    // Every waiter's place is taken: only what the bucket has now passes
                    // (delay mode's 429 when no place is left).
                    return self.check(units);
                }
                // A zero wait would be a plain check: wait at least a nanosecond.
                let max_wait = max_wait.max(Duration::from_nanos(1));
                let reserved = self
                    .limiter
                    .reserve(self.limit, self.key.clone(), units, max_wait);
                let waiting = self.waiting.clone();
                Box::pin(async move {
                    let reservation = reserved.await.map_err(PaceError::Limiter)?;
                    // A charge that waits holds a waiter's place until it is paid, refused
                    // or dropped (with its stream).
                    let place = if reservation.is_granted() && !reservation.wait_time().is_zero() {
                        let Some(place) = Place::take(&waiting, max_waiters) else {
                            // Streams raced for the last places: the tokens go back (the
                            // reservation dropped before its instant) and the charge is
                            // refused with its wait.
                            let refused = reservation.decision().limits().next().cloned();
                            return Err(match refused {
                                Some(limit) => PaceError::Refused(limit.refused_after_wait()),
                                None => unsupported(),
                            });
                        };
                        Some(place)
                    } else {
                        None
                    };
                    // Dropped while it waits: the reservation gives its tokens back.
                    let waited = reservation.wait().await;
                    drop(place);
                    waited
                        .map(drop)
                        .map_err(|d| match d.limits.into_iter().next() {
                            Some(limit) => PaceError::Refused(limit),
                            None => unsupported(),
                        })
                })
            }
        }
    }

    /// One check of `units` tokens: at once or refused.
    fn check(&self, units: u32) -> Charging {
        let checked = self.limiter.check(self.limit, self.key.clone(), units);
        Box::pin(async move {
            let decision = checked.await.map_err(PaceError::Limiter)?;
            if decision.allowed() {
                Ok(())
            } else {
                Err(PaceError::Refused(decision))
            }
        })
    }
}

/// A reservation answered without its limit (never: one limit asked, one answered).
fn unsupported() -> PaceError {
    PaceError::Limiter(LimiterError::Unsupported {
        limit: String::new(),
        operation: "reserve",
    })
}

/// The `per` label of a limit's units.
fn per_label(per: Per) -> &'static str {
    match per {
        Per::Message => "message",
        Per::Byte => "byte",
        _ => "request",
    }
}

impl Drop for Pacer {
    /// Units taken ahead and not used go back (a charge under way gives back its own when
    /// its future is dropped, with this).
    fn drop(&mut self) {
        self.charging = None;
        let tokens = std::mem::take(&mut self.credit) / self.unit;
        if tokens == 0 {
            return;
        }
        let units = u32::try_from(tokens).unwrap_or(u32::MAX);
        let calls = smallvec::smallvec![(self.limit, self.key.clone(), units)];
        if let Some(checked) = self.limiter.apply_refund(calls) {
            checked.finish_in_background("a stream's unused units");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::algorithm::Algorithm;
    use crate::algo::quota::Quota;
    use crate::base::clock::Clock;
    use crate::model::spec::LimitSpec;
    use crate::store::MemoryStore;
    use tokio::time::Instant;

    /// Tokio's (paused) clock, so that the store and the waits read one time.
    #[derive(Clone)]
    struct Tokio(Instant);

    impl Clock for Tokio {
        fn now(&self) -> u64 {
            1_000_000_000_000 + self.0.elapsed().as_nanos() as u64
        }
    }

    fn limiter(quota: Quota) -> Limiter {
        Limiter::builder(MemoryStore::with_clock(Tokio(Instant::now())))
            .limit(LimitSpec::new("l", quota))
            .limit(
                LimitSpec::new("sliding", Quota::per_second(10))
                    .algorithm(Algorithm::SlidingWindow),
            )
            .build()
            .unwrap()
    }

    async fn left(limiter: &Limiter, key: &str) -> u64 {
        limiter.peek("l", key).await.unwrap().remaining().unwrap()
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn end_refuses_over_the_limit_and_passes_again_once_refilled() {
        let limiter = limiter(Quota::per_second(10).burst(3));
        let mut pacer = limiter.pacer("l", "k").unwrap().over_limit(OverLimit::End);
        for _ in 0..3 {
            pacer.charge(1).await.unwrap();
        }
        let refused = pacer.charge(1).await.unwrap_err();
        assert_eq!(refused.retry_after(), Some(Duration::from_millis(100)));
        assert!(
            refused.to_string().contains("over limit \"l\""),
            "{refused}"
        );
        assert_eq!(left(&limiter, "k").await, 0, "a refusal takes nothing");
        tokio::time::advance(Duration::from_millis(100)).await;
        pacer.charge(1).await.unwrap();
        assert!(pacer.charge(1).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn wait_paces_units_to_the_rate() {
        let limiter = limiter(Quota::per_second(10).burst(5));
        let mut pacer = limiter
            .pacer("l", "k")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND));
        let start = Instant::now();
        for _ in 0..25 {
            pacer.charge(1).await.unwrap();
        }
        // 5 at once, then 20 at 10 a second.
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_refuses_a_charge_beyond_max_wait_and_takes_nothing() {
        let limiter = limiter(Quota::per_second(10).burst(2));
        let mut pacer = limiter
            .pacer("l", "k")
            .unwrap()
            .over_limit(OverLimit::wait(Duration::from_millis(150)));
        pacer.charge(2).await.unwrap();
        pacer.charge(1).await.unwrap(); // 100 ms
        let start = Instant::now();
        // The next would be due in 200 ms: refused at once.
        let refused = pacer.charge(2).await.unwrap_err();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(matches!(refused, PaceError::Refused(_)));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(
            left(&limiter, "k").await,
            1,
            "the refused charge took nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_charge_dropped_while_it_waits_gives_its_units_back() {
        let limiter = limiter(Quota::per_second(10).burst(2));
        let mut pacer = limiter
            .pacer("l", "k")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND));
        pacer.charge(2).await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(50), pacer.charge(1)).await;
        assert!(waited.is_err(), "due in 100 ms");
        drop(pacer);
        tokio::time::advance(Duration::from_millis(50)).await;
        // 100 ms after the burst was spent: one token back, none still reserved.
        assert_eq!(left(&limiter, "k").await, 1);
        // A pacer dropped in the middle of a charge in pieces: the same.
        let mut pacer = limiter
            .pacer("l", "j")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND));
        let waited = tokio::time::timeout(Duration::from_millis(50), pacer.charge(5)).await;
        assert!(waited.is_err());
        drop(pacer);
        tokio::task::yield_now().await;
        // The first piece (2) was taken and given to the charge; the second was
        // reserved and went back: the bucket is where 2 units 50 ms ago leave it.
        assert_eq!(left(&limiter, "j").await, 0);
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(left(&limiter, "j").await, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_streams_are_bounded_by_max_waiters() {
        let limiter = limiter(Quota::per_second(10).burst(1));
        let over = OverLimit::wait(SECOND).max_waiters(2);
        let mut pacers: Vec<Pacer> = ["a", "b", "c"]
            .into_iter()
            .map(|k| limiter.pacer("l", k).unwrap().over_limit(over))
            .collect();
        for pacer in &mut pacers {
            pacer.charge(1).await.unwrap(); // the burst: at once, no place taken
        }
        assert_eq!(pacers[0].waiting.load(Ordering::Relaxed), 0);
        let mut third = pacers.pop().unwrap();
        let waiting: Vec<_> = pacers
            .into_iter()
            .map(|mut pacer| tokio::spawn(async move { pacer.charge(1).await.map(|()| pacer) }))
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(third.waiting.load(Ordering::Relaxed), 2, "two streams wait");
        // A third that would wait is refused at once, with its wait, and takes nothing.
        let start = Instant::now();
        let refused = third.charge(1).await.unwrap_err();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(matches!(refused, PaceError::Refused(_)));
        assert_eq!(refused.retry_after(), Some(Duration::from_millis(100)));
        for handle in waiting {
            let pacer = handle.await.unwrap().expect("paid after 100 ms");
            assert_eq!(pacer.waiting.load(Ordering::Relaxed), 0, "places left");
        }
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        assert_eq!(left(&limiter, "c").await, 1, "the refusal took nothing");
        // The places are free again: the third waits (one token now, one in 100 ms).
        third.charge(2).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        // One that covers its charge at once passes even while every place is taken.
        let full = third.waiting.clone();
        full.fetch_add(2, Ordering::Relaxed);
        tokio::time::advance(Duration::from_millis(100)).await;
        third.charge(1).await.unwrap();
        full.fetch_sub(2, Ordering::Relaxed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_finds_the_last_place_taken_gives_its_reservation_back() {
        let limiter = limiter(Quota::per_second(10).burst(1));
        let mut pacer = limiter
            .pacer("l", "k")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND).max_waiters(1));
        pacer.charge(1).await.unwrap();
        // Room when the reservation is asked for; taken (another stream, another
        // request of the limit) by the time it answers.
        let charging = pacer.start(1);
        let taken = Place::take(&pacer.waiting, 1).expect("the last place");
        let refused = charging.await.unwrap_err();
        assert_eq!(refused.retry_after(), Some(Duration::from_millis(100)));
        drop(taken);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(left(&limiter, "k").await, 1, "the reservation went back");
        // A place dropped with its stream while it waits is free again.
        let waited = tokio::time::timeout(Duration::from_millis(50), pacer.charge(2)).await;
        assert!(waited.is_err(), "the second token is due in 100 ms");
        assert_eq!(pacer.waiting.load(Ordering::Relaxed), 1);
        drop(pacer);
        let other = limiter
            .pacer("l", "j")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND).max_waiters(1));
        assert_eq!(other.waiting.load(Ordering::Relaxed), 0);
        // A charge the bucket covers at once needs no place, even when none is left.
        let charging = other.start(1);
        let taken = Place::take(&other.waiting, 1).expect("the last place");
        charging.await.expect("covered at once");
        drop(taken);
    }

    #[tokio::test(start_paused = true)]
    async fn a_charge_above_the_burst_is_taken_in_pieces() {
        let limiter = limiter(Quota::per_second(1_000).burst(100));
        let mut pacer = limiter
            .pacer("l", "k")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND));
        assert_eq!(pacer.piece(), 100);
        let start = Instant::now();
        pacer.charge(350).await.unwrap();
        // 100 at once, then 250 at 1,000 a second.
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        let mut ends = limiter.pacer("l", "j").unwrap().over_limit(OverLimit::End);
        assert!(
            ends.charge(101).await.is_err(),
            "more than a burst: never at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn batches_call_the_store_once_per_batch_and_give_back_the_rest() {
        let limiter = limiter(Quota::per_second(1_000).burst(100));
        let mut pacer = limiter
            .pacer("l", "k")
            .unwrap()
            .over_limit(OverLimit::End)
            .batch(40);
        pacer.charge(1).await.unwrap();
        assert_eq!(pacer.credit(), 39);
        assert_eq!(left(&limiter, "k").await, 60, "a batch taken");
        for _ in 0..39 {
            pacer.charge(1).await.unwrap();
        }
        assert_eq!(left(&limiter, "k").await, 60, "no other store call");
        pacer.charge(5).await.unwrap();
        assert_eq!((pacer.credit(), left(&limiter, "k").await), (35, 20));
        drop(pacer);
        tokio::task::yield_now().await;
        assert_eq!(left(&limiter, "k").await, 55, "the unused 35 went back");
        // A batch is at most the burst.
        let pacer = limiter
            .pacer("l", "j")
            .unwrap()
            .over_limit(OverLimit::End)
            .batch(1_000);
        assert_eq!(pacer.batch, 100);
        // A charge beyond the credit pays for the rest only: 7 of a batch of 10 left, a
        // charge of 12 owes 5, and a new batch of 10 leaves 5.
        let mut pacer = limiter
            .pacer("l", "m")
            .unwrap()
            .over_limit(OverLimit::End)
            .batch(10);
        pacer.charge(3).await.unwrap();
        assert_eq!((pacer.credit(), left(&limiter, "m").await), (7, 90));
        pacer.charge(12).await.unwrap();
        assert_eq!((pacer.credit(), left(&limiter, "m").await), (5, 80));
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_may_stand_for_many_units_rounded_up_and_carried() {
        // 10 tokens a second of 1,000 units: 10,000 units a second, 2,000 at once.
        let limiter = limiter(Quota::per_second(10).burst(2));
        let mut pacer = limiter
            .pacer("l", "k")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND))
            .unit(1_000);
        assert_eq!(pacer.piece(), 2_000);
        pacer.charge(1).await.unwrap();
        assert_eq!((pacer.credit(), left(&limiter, "k").await), (999, 1));
        pacer.charge(999).await.unwrap();
        assert_eq!(
            (pacer.credit(), left(&limiter, "k").await),
            (0, 1),
            "paid already"
        );
        let start = Instant::now();
        pacer.charge(4_500).await.unwrap();
        // 5 tokens: 1 left, 4 at 10 a second.
        assert_eq!(start.elapsed(), Duration::from_millis(400));
        assert_eq!(pacer.credit(), 500);
        drop(pacer);
        tokio::task::yield_now().await;
        assert_eq!(
            left(&limiter, "k").await,
            0,
            "half a token is not given back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn limits_that_cannot_pace_are_named() {
        let limiter = Limiter::builder(MemoryStore::with_clock(Tokio(Instant::now())))
            .limit(
                LimitSpec::new("sliding", Quota::per_second(10))
                    .algorithm(Algorithm::SlidingWindow),
            )
            .limit(
                LimitSpec::new("ends", Quota::per_second(10))
                    .algorithm(Algorithm::SlidingWindow)
                    .per(Per::Message)
                    .direction(Direction::Both)
                    .over_limit(OverLimit::End),
            )
            .limit(LimitSpec::in_flight("held", 3))
            .build()
            .unwrap();
        let unknown = limiter.pacer("nope", "k").unwrap_err();
        assert!(matches!(unknown, LimiterError::UnknownLimit { .. }));
        for limit in ["sliding", "held"] {
            let e = limiter.pacer(limit, "k").unwrap_err();
            assert!(
                matches!(
                    e,
                    LimiterError::Unsupported {
                        operation: "pace",
                        ..
                    }
                ),
                "{limit}: {e}"
            );
        }
        // A sliding window can end a stream: it takes no reservation for that.
        let mut ends = limiter.pacer("ends", "k").unwrap();
        ends.charge(1).await.unwrap();
        assert_eq!(ends.limit(), "ends");
        assert_eq!(ends.over(), OverLimit::End);
        assert_eq!(
            (ends.per(), ends.direction(), ends.rate_after()),
            (Per::Message, Direction::Both, 0)
        );
        assert_eq!(ends.key(), &crate::model::key::IntoKey::into_key("k"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pacer_follows_its_limits_stream_settings() {
        let limiter = Limiter::builder(MemoryStore::with_clock(Tokio(Instant::now())))
            .limit(
                LimitSpec::new("bytes", Quota::per_second(1024).burst(64))
                    .per(Per::Byte)
                    .unit(1024)
                    .rate_after(4096)
                    .over_limit(OverLimit::End),
            )
            .build()
            .unwrap();
        let mut pacer = limiter.pacer("bytes", "k").unwrap();
        assert_eq!((pacer.piece(), pacer.rate_after()), (64 * 1024, 4096));
        assert_eq!(pacer.direction(), Direction::In);
        pacer.charge(64 * 1024).await.unwrap();
        assert!(pacer.charge(1).await.is_err(), "over_limit = end");
    }
}

#[cfg(test)]
mod size {
    /// What an idle stream holds: a pacer and nothing else until it charges.
    #[test]
    fn an_idle_pacer_is_small() {
        let size = std::mem::size_of::<super::Pacer>();
        eprintln!("Pacer: {size} bytes");
        assert!(size <= 272, "{size}");
    }
}
