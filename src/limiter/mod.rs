//! [`Limiter`]: the engine from code — peek, check, refund, penalize, block and reset the
//! buckets the middleware fills, from handlers, background jobs or other stacks.

pub(crate) mod estimate;
pub(crate) mod pace;
pub(crate) mod permit;
pub(crate) mod reservation;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::base::error::ConfigError;
use crate::engine::ban::BannedKey;
use crate::engine::delay::WaitCounts;
use crate::engine::{Engine, unique_names};
use crate::limiter::pace::Pacer;
use crate::limiter::permit::Permit;
use crate::limiter::reservation::Reservation;
use crate::model::decision::{Decision, LimitDecision};
use crate::model::key::{IntoKey, Key};
use crate::model::policy::Mode;
use crate::model::spec::LimitSpec;
use crate::model::stream::{OverLimit, Streaming};
use crate::observe::offenders::RefusedKey;
use crate::store::{Checked, Item, Op, Statuses, Store};

/// Why a [`Limiter`] call was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimiterError {
    /// No limit of this name is configured.
    UnknownLimit {
        /// The name asked for.
        limit: String,
        /// The names of the limits that are configured, sorted (what the message lists).
        known: Vec<&'static str>,
    },
    /// The operation means nothing to the limit's algorithm: a penalty or a block on a
    /// sliding window or sliding log, a block or a reservation on a calendar window (fixed
    /// windows and GCRA take every operation).
    Unsupported {
        /// The limit's name.
        limit: String,
        /// The operation (`"penalize"`, `"block"`).
        operation: &'static str,
    },
    /// The limit cannot settle costs ([`Limiter::admit`]): it counts with a window, or
    /// spends leases.
    CannotSettle {
        /// The limit's name.
        limit: String,
        /// Why.
        reason: &'static str,
    },
    /// The limit has no [`Ban`](crate::Ban): it bans nothing, so no ban can be set or
    /// lifted.
    NoBan {
        /// The limit's name.
        limit: String,
    },
}

impl fmt::Display for LimiterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimiterError::UnknownLimit { limit, known } => {
                write!(f, "no limit is called {limit:?}")?;
                if known.is_empty() {
                    return f.write_str(" (none is configured)");
                }
                f.write_str("; the limits are ")?;
                for (i, name) in known.iter().take(SHOWN_NAMES).enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{name:?}")?;
                }
                if known.len() > SHOWN_NAMES {
                    write!(f, " and {} more", known.len() - SHOWN_NAMES)?;
                }
                Ok(())
            }
            LimiterError::Unsupported { limit, operation } => write!(
                f,
                "the limit {limit:?} counts with a sliding window or log, or calendar windows, which have no {operation}"
            ),
            LimiterError::CannotSettle { limit, reason } => {
                write!(f, "the limit {limit:?} cannot settle costs: {reason}")
            }
            LimiterError::NoBan { limit } => {
                write!(f, "the limit {limit:?} has no ban (see `Limit::ban`)")
            }
        }
    }
}

impl std::error::Error for LimiterError {}

/// How many configured names an unknown-limit message lists.
const SHOWN_NAMES: usize = 10;

impl LimiterError {
    /// `limit` is not one of `known`.
    pub(crate) fn unknown(limit: &str, known: Vec<&'static str>) -> Self {
        LimiterError::UnknownLimit {
            limit: limit.to_owned(),
            known,
        }
    }
}

/// Whether a limit counting with `algorithm` can do what `over` says: waiting takes a
/// reservation, which sliding and calendar windows do not take.
pub(crate) fn can_wait(algorithm: Algorithm, over: OverLimit) -> bool {
    let reserves = !matches!(algorithm, Algorithm::SlidingWindow | Algorithm::SlidingLog)
        && !algorithm.is_calendar();
    reserves || over == OverLimit::End
}

/// The calls of one operation: (limit, key, cost).
pub(crate) type Calls<'a> = SmallVec<[(&'a str, Key, u32); 2]>;

/// A limit as a stream charges it: interned name, quota, algorithm, stream settings, rule
/// id, and the count of its waiters (shared with its requests in delay mode).
pub(crate) type Paced = (
    &'static str,
    Quota,
    Algorithm,
    Streaming,
    Option<u64>,
    Arc<AtomicUsize>,
);

/// What one item was: limit name, quota, cost, mode.
type Meta = (&'static str, Quota, u32, Mode);

/// What each item was, and the store's answer (now or later).
pub(crate) struct Applied {
    meta: SmallVec<[Meta; 2]>,
    checked: Checked<Pin<Box<dyn Future<Output = Statuses> + Send>>>,
}

/// An engine reached by limit names, whatever its store.
pub(crate) trait Handle: Send + Sync + 'static {
    /// Applies `op` to the calls' buckets; a check with a non-zero `max_wait` is a
    /// reservation.
    fn apply(&self, op: Op, calls: Calls<'_>, max_wait: Duration) -> Result<Applied, LimiterError>;
    fn names(&self) -> Vec<&'static str>;
    fn top_refused(&self, limit: &str, n: usize) -> Result<Vec<RefusedKey>, LimiterError>;
    /// Whether `limit` can settle costs ([`Limiter::admit`]).
    fn can_settle(&self, limit: &str) -> Result<(), LimiterError>;
    /// How the limit called `limit` counts, if there is one.
    fn algorithm(&self, limit: &str) -> Option<Algorithm>;
    /// The limit called `limit`, if there is one, as a stream charges it: its interned
    /// name, quota, algorithm and stream settings.
    fn paced(&self, limit: &str) -> Option<Paced>;
    /// The key of the request `parts` for the limit called `limit`, by the limit's own
    /// key extractor: `None` when the handle has no extractors (a limiter of its own),
    /// `Some(Ok(None))` when the request has no key and the limit skips such requests.
    fn key_for(
        &self,
        limit: &str,
        parts: &http::request::Parts,
    ) -> Option<Result<Option<Key>, LimiterError>> {
        let _ = (limit, parts);
        None
    }
    /// The keys a banning limit has banned.
    fn bans(&self, limit: &str) -> Result<Vec<BannedKey>, LimiterError> {
        Err(LimiterError::NoBan {
            limit: limit.to_owned(),
        })
    }
    /// Bans `key` for `length` by hand; `None` lifts its ban.
    fn set_ban(&self, limit: &str, key: Key, length: Option<Duration>) -> Result<(), LimiterError> {
        let _ = (key, length);
        Err(LimiterError::NoBan {
            limit: limit.to_owned(),
        })
    }
}

impl<St: Store> Engine<St> {
    /// The index of banning limit `limit`.
    fn banning(&self, limit: &str) -> Result<usize, LimiterError> {
        let index = self
            .find(limit)
            .ok_or_else(|| LimiterError::unknown(limit, self.names()))?;
        match self.ban_table(index) {
            Some(_) => Ok(index),
            None => Err(LimiterError::NoBan {
                limit: limit.to_owned(),
            }),
        }
    }

    pub(crate) fn handle_bans(&self, limit: &str) -> Result<Vec<BannedKey>, LimiterError> {
        Ok(self.bans_of(self.banning(limit)?))
    }

    pub(crate) fn handle_set_ban(
        &self,
        limit: &str,
        key: Key,
        length: Option<Duration>,
    ) -> Result<(), LimiterError> {
        self.set_ban(self.banning(limit)?, key, length);
        Ok(())
    }
}

impl<St: Store> Handle for Engine<St> {
    fn algorithm(&self, limit: &str) -> Option<Algorithm> {
        self.find(limit).map(|i| self.bounds[i].spec.algorithm)
    }

    fn paced(&self, limit: &str) -> Option<Paced> {
        self.find(limit).map(|i| {
            let bound = &self.bounds[i];
            (
                bound.name,
                bound.spec.quota,
                bound.spec.algorithm,
                bound.spec.stream,
                bound.spec.rule_id,
                self.wait_count(bound.name),
            )
        })
    }

    fn apply(&self, op: Op, calls: Calls<'_>, max_wait: Duration) -> Result<Applied, LimiterError> {
        let reserve = op == Op::Check && !max_wait.is_zero();
        let mut op = op;
        let mut items: SmallVec<[Item<'_, St::Table>; 4]> = SmallVec::new();
        let mut meta = SmallVec::new();
        for (name, key, cost) in calls {
            let index = self
                .find(name)
                .ok_or_else(|| LimiterError::unknown(name, self.names()))?;
            let bound = &self.bounds[index];
            let limit = &bound.spec;
            if limit.algorithm.is_calendar() {
                // A calendar window carries no debt: a penalty uses up what is left of
                // it, but a block by duration or a reservation into a later window has
                // no meaning.
                let operation = match op {
                    Op::Block(_) => Some("block"),
                    Op::Check if reserve => Some("reserve"),
                    _ => None,
                };
                if let Some(operation) = operation {
                    return Err(LimiterError::Unsupported {
                        limit: name.to_owned(),
                        operation,
                    });
                }
            }
            if matches!(
                limit.algorithm,
                Algorithm::SlidingWindow | Algorithm::SlidingLog | Algorithm::InFlight { .. }
            ) {
                let operation = match op {
                    Op::Penalize => Some("penalize"),
                    Op::Block(_) => Some("block"),
                    Op::Check if reserve => Some("reserve"),
                    _ => None,
                };
                if let Some(operation) = operation {
                    return Err(LimiterError::Unsupported {
                        limit: name.to_owned(),
                        operation,
                    });
                }
            }
            if let Op::Debit { .. } | Op::Credit = op {
                // A settle (of one limit): that limit's own debt cap.
                self.can_settle(name)?;
                if let Op::Debit { .. } = op {
                    op = Op::Debit {
                        max_debt: limit.debt_cap(),
                    };
                }
                self.count_settle(index, matches!(op, Op::Debit { .. }), cost);
            }
            let mut item = self.item(index, key, limit.quota, cost);
            // A shadow limit never holds a request back: it is checked as usual.
            if reserve && limit.mode == Mode::Enforce {
                item = item.max_wait(limit.reservation_wait(&limit.quota, max_wait));
            }
            items.push(item);
            meta.push((bound.name, limit.quota, cost, limit.mode));
        }
        let checked = if items.is_empty() {
            Checked::Ready(Statuses::new())
        } else {
            match self.store.apply(op, &items) {
                Checked::Ready(s) => Checked::Ready(s),
                Checked::Pending(f) => Checked::Pending(Box::pin(f) as Pin<Box<_>>),
            }
        };
        Ok(Applied { meta, checked })
    }

    fn names(&self) -> Vec<&'static str> {
        Engine::names(self)
    }

    /// A limiter of its own tracks no offenders.
    fn top_refused(&self, limit: &str, _n: usize) -> Result<Vec<RefusedKey>, LimiterError> {
        self.find(limit)
            .ok_or_else(|| LimiterError::unknown(limit, self.names()))?;
        Ok(Vec::new())
    }

    fn can_settle(&self, limit: &str) -> Result<(), LimiterError> {
        let index = self
            .find(limit)
            .ok_or_else(|| LimiterError::unknown(limit, self.names()))?;
        self.bounds[index]
            .spec
            .settle_refusal()
            .map_err(|reason| LimiterError::CannotSettle {
                limit: limit.to_owned(),
                reason,
            })
    }

    fn bans(&self, limit: &str) -> Result<Vec<BannedKey>, LimiterError> {
        self.handle_bans(limit)
    }

    fn set_ban(&self, limit: &str, key: Key, length: Option<Duration>) -> Result<(), LimiterError> {
        self.handle_set_ban(limit, key, length)
    }
}

/// A cheap, clonable handle to a limiter's engine and store: the operations of the
/// middleware, and more, from code.
///
/// Made by [`RateLimitLayer::limiter`](crate::RateLimitLayer::limiter) (sharing the layer's
/// limits and store; give it to handlers through the router's state, or build the layer
/// with [`limiter_extension(true)`](crate::RateLimitBuilder::limiter_extension) to have it
/// in every request's extensions), or on its own by [`Limiter::builder`].
///
/// Limits are named as configured; the handle uses each limit's own quota, mode and
/// failure policy (a store failure is answered as in the middleware: a fallback decision,
/// [`Status::FailedOpen`](crate::Status::FailedOpen) or
/// [`Status::FailedClosed`](crate::Status::FailedClosed)). Keys are what the extractors
/// make: `limiter.reset("login", "alice")` reaches the bucket that
/// [`Header::new("x-user")`](crate::key::Header) fills for `x-user: alice`; for addresses
/// use [`PeerIp::key`](crate::key::PeerIp::key) to get the same prefix grouping. Every
/// method returns a `'static` future that can be spawned.
///
/// The failed-login pattern: take the failure token *before* trying the password, keep it
/// when the password is wrong, and reset the user's bucket on success. Taking it first is
/// one atomic step, so N parallel guesses with one failure left cannot all try a password.
/// A [`peek`](Self::peek) is no gate: a look of cost 0 always passes;
/// read its `remaining()`.
///
/// ```
/// use tollgate::{store::MemoryStore, LimitSpec, Limiter, LimiterError, Quota};
///
/// async fn login(limiter: &Limiter, user: &str, password_ok: bool) -> Result<u16, LimiterError> {
///     let charged = limiter.check("login-failures", user, 1).await?;
///     if !charged.allowed() {
///         return Ok(429); // too many failures: Retry-After from charged.retry_after()
///     }
///     if password_ok {
///         limiter.reset("login-failures", user).await?; // gives this token back too
///         Ok(200)
///     } else {
///         Ok(401) // the token stays taken
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // 5 failures per 15 minutes: a bucket of 5, one back every 3 minutes.
/// let limiter = Limiter::builder(MemoryStore::new())
///     .limit(LimitSpec::new("login-failures", Quota::per_hour(20).burst(5)))
///     .build()?;
/// for _ in 0..5 {
///     assert_eq!(login(&limiter, "alice", false).await?, 401);
/// }
/// assert_eq!(login(&limiter, "alice", true).await?, 429); // even the right password
/// assert_eq!(login(&limiter, "bob", true).await?, 200);
/// let look = limiter.peek("login-failures", "alice").await?;
/// assert!(look.allowed() && look.remaining() == Some(0)); // a look passes: no gate
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<dyn Handle>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("limits", &self.inner.names())
            .finish()
    }
}

impl Limiter {
    /// A handle on `handle`: a layer's engine, or the live engine of reloaded rules.
    pub(crate) fn from_handle(handle: Arc<dyn Handle>) -> Self {
        Self { inner: handle }
    }

    /// A limiter of its own, without a layer: for background jobs, outbound calls, or
    /// anything that is not an HTTP request.
    pub fn builder<St: Store>(store: St) -> LimiterBuilder<St> {
        LimiterBuilder {
            store,
            limits: Vec::new(),
            max_limits: crate::DEFAULT_MAX_LIMITS,
        }
    }

    /// The names of the limits this handle reaches.
    pub fn limits(&self) -> Vec<&'static str> {
        self.inner.names()
    }

    /// The quota of the limit called `limit`, if this handle reaches one.
    pub fn quota(&self, limit: &str) -> Option<Quota> {
        self.inner.paced(limit).map(|(_, quota, ..)| quota)
    }

    /// A [`Pacer`] for the stream of the request `parts` (a WebSocket's upgrade, a
    /// streaming call), keyed by the limit's own key extractor as the layer keys its
    /// requests (`key = "peer_ip"` in a rules file): the key is computed once, here.
    /// `Ok(None)` when the request has no key and the limit skips such requests
    /// ([`MissingKey::Skip`](crate::MissingKey)); a request without a key under any other
    /// [`MissingKey`](crate::MissingKey) shares the bucket of keyless requests.
    ///
    /// Only a layer's handle ([`RateLimitLayer::limiter`](crate::RateLimitLayer::limiter),
    /// a rules' `limiter()`) knows the extractors: a limiter of its own answers
    /// [`LimiterError::Unsupported`] (use [`pacer`](Self::pacer) with a key there).
    pub fn pacer_for(
        &self,
        limit: &str,
        parts: &http::request::Parts,
    ) -> Result<Option<Pacer>, LimiterError> {
        let Some(key) = self.inner.key_for(limit, parts) else {
            return Err(LimiterError::Unsupported {
                limit: limit.to_owned(),
                operation: "pacer_for",
            });
        };
        match key? {
            Some(key) => self.pacer(limit, key).map(Some),
            None => Ok(None),
        }
    }

    /// A [`Pacer`] charging the units of one stream (messages, bytes) to `limit` for
    /// `key`, as the limit's [stream settings](LimitSpec::per) say (what it does over the
    /// limit, the units per token; [`Pacer::over_limit`] changes the first for this
    /// stream). Made once per stream (the key is computed once); it holds nothing until
    /// charged, and gives back on drop what it took and did not use.
    ///
    /// Any limit can be charged so, a limit of requests too. GCRA and fixed windows; with
    /// [`OverLimit::Wait`], a sliding window or log or a calendar window answers
    /// [`LimiterError::Unsupported`] (they take no reservations), as does an in-flight
    /// limit either way.
    pub fn pacer(&self, limit: &str, key: impl IntoKey) -> Result<Pacer, LimiterError> {
        let Some((name, quota, algorithm, stream, rule_id, waiting)) = self.inner.paced(limit)
        else {
            return Err(LimiterError::unknown(limit, self.inner.names()));
        };
        let over = stream.over_limit.unwrap_or_default();
        if algorithm.is_in_flight() || !can_wait(algorithm, over) {
            return Err(LimiterError::Unsupported {
                limit: limit.to_owned(),
                operation: "pace",
            });
        }
        Ok(Pacer::new(
            self.clone(),
            name,
            key.into_key(),
            quota.burst_size(),
            stream,
            waiting,
        )
        .with_rule_id(rule_id))
    }

    fn one(
        &self,
        op: Op,
        limit: &str,
        key: Key,
        cost: u32,
    ) -> impl Future<Output = Result<LimitDecision, LimiterError>> + Send + 'static {
        let applied = self
            .inner
            .apply(op, smallvec::smallvec![(limit, key, cost)], Duration::ZERO);
        async move {
            let mut decision = settle(applied?).await;
            Ok(decision.limits.remove(0))
        }
    }

    /// Takes `cost` tokens if they are there (a shadow limit never refuses): the limit's
    /// decision, as the middleware would make it.
    pub fn check(
        &self,
        limit: &str,
        key: impl IntoKey,
        cost: u32,
    ) -> impl Future<Output = Result<LimitDecision, LimiterError>> + Send + 'static {
        self.one(Op::Check, limit, key.into_key(), cost)
    }

    /// Takes a unit of the in-flight limit `limit` for `key` if one is free
    /// ([`LimitSpec::in_flight`]): the [`Permit`] holds it until it is dropped. Work that is
    /// not an HTTP request (a job, a stream, a call to another service) shares the limit
    /// with the requests the middleware admits. [`check`](Self::check) on an in-flight
    /// limit takes a unit too, which [`refund`](Self::refund) gives back.
    pub fn acquire(
        &self,
        limit: &str,
        key: impl IntoKey,
    ) -> impl Future<Output = Result<Permit, LimiterError>> + Send + 'static {
        let key = key.into_key();
        let limiter = self.clone();
        let unsupported = match self.inner.algorithm(limit) {
            Some(a) if !a.is_in_flight() => Some(LimiterError::Unsupported {
                limit: limit.to_owned(),
                operation: "acquire",
            }),
            _ => None,
        };
        let checked = self.one(Op::Check, limit, key.clone(), 1);
        async move {
            if let Some(e) = unsupported {
                return Err(e);
            }
            Ok(Permit::new(limiter, checked.await?, key))
        }
    }

    /// The bucket's state, without consuming and without creating the key: the tokens
    /// left and the time to the next one.
    ///
    /// A look (a request of cost 0) is always allowed, even on an empty
    /// bucket or one in debt after [`penalize`](Self::penalize) or [`block`](Self::block):
    /// whether one more request would pass is `remaining() > Some(0)`, and
    /// `next_after()` says when the next token comes. To admit a request, use
    /// [`check`](Self::check) rather than peek-then-check, which lets parallel callers
    /// all pass the look.
    pub fn peek(
        &self,
        limit: &str,
        key: impl IntoKey,
    ) -> impl Future<Output = Result<LimitDecision, LimiterError>> + Send + 'static {
        self.one(Op::Check, limit, key.into_key(), 0)
    }

    /// Several checks, all or nothing as in the middleware: if an enforcing limit
    /// refuses, nothing is taken from any of them.
    ///
    /// ```
    /// # use tollgate::{store::MemoryStore, LimitSpec, Limiter, Quota};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .limit(LimitSpec::new("per-user", Quota::per_minute(10)))
    ///     .limit(LimitSpec::new("per-tenant", Quota::per_minute(2)))
    ///     .build()?;
    /// let calls = [("per-user", "alice", 1), ("per-tenant", "acme", 1)];
    /// assert!(limiter.check_all(calls).await?.allowed());
    /// assert!(limiter.check_all(calls).await?.allowed());
    /// assert!(!limiter.check_all(calls).await?.allowed()); // the tenant is out
    /// // ... and the refused call took nothing from the user's bucket.
    /// assert_eq!(limiter.peek("per-user", "alice").await?.remaining(), Some(8));
    /// # Ok(()) }
    /// ```
    pub fn check_all<'a, K: IntoKey>(
        &self,
        calls: impl IntoIterator<Item = (&'a str, K, u32)>,
    ) -> impl Future<Output = Result<Decision, LimiterError>> + Send + 'static {
        let calls: Calls<'a> = calls
            .into_iter()
            .map(|(l, k, c)| (l, k.into_key(), c))
            .collect();
        let applied = self.inner.apply(Op::Check, calls, Duration::ZERO);
        async move { Ok(settle(applied?).await) }
    }

    /// Takes `cost` tokens now if they are there within `max_wait`, and answers when the
    /// work may start: a [`Reservation`], whose
    /// [`wait`](Reservation::wait) sleeps until then, and which gives the tokens back if
    /// dropped or cancelled before then. A reservation that would wait longer is refused
    /// and takes nothing; one that would leave more than the limit's
    /// [`max_reserved`](LimitSpec::max_reserved) tokens reserved too.
    ///
    /// Atomic in every store (in Redis, part of the same script as a check). GCRA and
    /// fixed windows (whose reservations take units of the following windows); a sliding
    /// window or log answers [`LimiterError::Unsupported`].
    pub fn reserve(
        &self,
        limit: &str,
        key: impl IntoKey,
        cost: u32,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Reservation, LimiterError>> + Send + 'static {
        self.reserve_all([(limit, key, cost)], max_wait)
    }

    /// Several reservations, all or nothing as [`check_all`](Self::check_all): every
    /// limit's tokens are taken or none; the work may start after the longest wait.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate::{store::MemoryStore, Algorithm, LimitSpec, Limiter, Quota};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .limit(LimitSpec::new("per-user", Quota::per_second(10)))
    ///     .limit(LimitSpec::new("per-day", Quota::per_day(1_000)).algorithm(Algorithm::fixed_window()))
    ///     .build()?;
    /// let calls = [("per-user", "alice", 1), ("per-day", "alice", 1)];
    /// let r = limiter.reserve_all(calls, Duration::from_secs(1)).await?;
    /// assert!(r.is_granted());
    /// # Ok(()) }
    /// ```
    pub fn reserve_all<'a, K: IntoKey>(
        &self,
        calls: impl IntoIterator<Item = (&'a str, K, u32)>,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Reservation, LimiterError>> + Send + 'static {
        let calls: Calls<'a> = calls
            .into_iter()
            .map(|(l, k, c)| (l, k.into_key(), c))
            .collect();
        let keys: SmallVec<[Key; 2]> = calls.iter().map(|(_, k, _)| k.clone()).collect();
        let applied = self.inner.apply(Op::Check, calls, max_wait);
        let limiter = self.clone();
        async move {
            let decision = settle(applied?).await;
            // The wait counts from the store's `now`, which came before its answer: timed
            // from the answer, the instant errs late, never early.
            let made_at = tokio::time::Instant::now();
            Ok(Reservation::new(limiter, decision, keys, made_at))
        }
    }

    /// Gives back what a reservation took (see [`Reservation::cancel`]); `None` if a
    /// limit is gone.
    pub(crate) fn apply_refund(
        &self,
        calls: SmallVec<[(&'static str, Key, u32); 2]>,
    ) -> Option<Checked<Pin<Box<dyn Future<Output = Statuses> + Send>>>> {
        let calls: Calls<'_> = calls.into_iter().collect();
        let applied = self.inner.apply(Op::Refund, calls, Duration::ZERO).ok()?;
        Some(applied.checked)
    }

    /// Gives `cost` tokens back, never beyond a full bucket (a key the store does not
    /// hold is already full, and stays absent).
    pub fn refund(
        &self,
        limit: &str,
        key: impl IntoKey,
        cost: u32,
    ) -> impl Future<Output = Result<LimitDecision, LimiterError>> + Send + 'static {
        self.one(Op::Refund, limit, key.into_key(), cost)
    }

    /// Takes `cost` tokens whatever is left: the bucket may go into debt, and the next
    /// request passes only once the debt has refilled.
    pub fn penalize(
        &self,
        limit: &str,
        key: impl IntoKey,
        cost: u32,
    ) -> impl Future<Output = Result<LimitDecision, LimiterError>> + Send + 'static {
        self.one(Op::Penalize, limit, key.into_key(), cost)
    }

    /// Refuses the key for `duration`, whatever its tokens; then one token is there and the
    /// bucket refills from it. [`reset`](Self::reset) lifts it.
    pub fn block(
        &self,
        limit: &str,
        key: impl IntoKey,
        duration: Duration,
    ) -> impl Future<Output = Result<LimitDecision, LimiterError>> + Send + 'static {
        self.one(Op::Block(duration), limit, key.into_key(), 0)
    }

    /// Makes the key a full bucket again, and unblocks it.
    pub fn reset(
        &self,
        limit: &str,
        key: impl IntoKey,
    ) -> impl Future<Output = Result<LimitDecision, LimiterError>> + Send + 'static {
        self.one(Op::Reset, limit, key.into_key(), 0)
    }

    /// The `n` keys the layer refused most often for `limit`, most refused first, from its
    /// bounded summary (see
    /// [`RateLimitBuilder::track_offenders`](crate::RateLimitBuilder::track_offenders);
    /// empty when the layer does not track offenders). Counts are upper bounds, off by at
    /// most each entry's `error`; keys are hashed if the layer redacts them.
    pub fn top_refused(&self, limit: &str, n: usize) -> Result<Vec<RefusedKey>, LimiterError> {
        self.inner.top_refused(limit, n)
    }

    /// The keys `limit` has banned (see [`Ban`](crate::Ban)), longest remaining first, as
    /// this instance knows them: on a shared store (Redis), the bans this instance began,
    /// set or learned from its own requests.
    pub fn bans(&self, limit: &str) -> Result<Vec<BannedKey>, LimiterError> {
        self.inner.bans(limit)
    }

    /// Bans `key` in `limit` for `length` from now, by hand (logged like a ban the limit
    /// begins; the key's repeat level is kept). On a shared store the ban is written there
    /// in the background (and blocks the key's bucket for its length, so that every
    /// instance learns it at the key's next request). An error if `limit` is unknown or
    /// has no [`Ban`](crate::Ban).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{store::MemoryStore, Ban, LimitSpec, Limiter, Quota};
    ///
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .limit(LimitSpec::new("login", Quota::per_minute(5)).ban(Ban::after(3)))
    ///     .build()?;
    /// limiter.ban("login", "mallory", Duration::from_secs(3600))?;
    /// assert_eq!(limiter.bans("login")?[0].level, 0);
    /// limiter.lift_ban("login", "mallory")?;
    /// assert!(limiter.bans("login")?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ban(
        &self,
        limit: &str,
        key: impl IntoKey,
        length: Duration,
    ) -> Result<(), LimiterError> {
        self.inner.set_ban(limit, key.into_key(), Some(length))
    }

    /// Lifts `key`'s ban in `limit` and forgets its refusals and repeat level (on a shared
    /// store, there too, and the key's bucket is reset: full). Other instances that cached
    /// the ban drop it within [`BAN_RECHECK`](crate::BAN_RECHECK) of their next request of
    /// that key. An error if `limit` is unknown or has no [`Ban`](crate::Ban).
    pub fn lift_ban(&self, limit: &str, key: impl IntoKey) -> Result<(), LimiterError> {
        self.inner.set_ban(limit, key.into_key(), None)
    }
}

/// Waits for the store and names each status.
async fn settle(applied: Applied) -> Decision {
    let statuses = match applied.checked {
        Checked::Ready(s) => s,
        Checked::Pending(f) => f.await,
    };
    let limits = applied
        .meta
        .into_iter()
        .zip(statuses)
        .map(|((name, quota, cost, mode), status)| LimitDecision {
            name,
            quota,
            cost,
            mode,
            status,
        })
        .collect();
    Decision { limits }
}

/// Builds a [`Limiter`] without a layer (see [`Limiter::builder`]).
pub struct LimiterBuilder<St> {
    store: St,
    limits: Vec<LimitSpec>,
    max_limits: usize,
}

impl<St: Store> fmt::Debug for LimiterBuilder<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<St: Store> LimiterBuilder<St> {
    /// A limit the handle reaches by its name; the caller gives keys and costs.
    pub fn limit(mut self, limit: LimitSpec) -> Self {
        self.limits.push(limit);
        self
    }

    /// The most limits the handle takes (default [`DEFAULT_MAX_LIMITS`](crate::DEFAULT_MAX_LIMITS));
    /// see [`RateLimitBuilder::max_limits`](crate::RateLimitBuilder::max_limits).
    pub fn max_limits(mut self, n: usize) -> Self {
        self.max_limits = n;
        self
    }

    /// Checks the limits (as a layer does; names must differ) and builds the handle.
    pub fn build(self) -> Result<Limiter, ConfigError> {
        let count = self.limits.len();
        if count == 0 {
            return Err(ConfigError::new("limits", "no limit is configured"));
        }
        if count > self.max_limits {
            return Err(ConfigError::new(
                "limits",
                format!(
                    "{count} limits, more than the {} a limiter takes (`max_limits`)",
                    self.max_limits
                ),
            ));
        }
        unique_names(self.limits.iter().map(|l| l.name()))?;
        let mut engine = Engine::new(self.store, WaitCounts::default(), count);
        for spec in self.limits {
            engine.bind(spec)?;
        }
        Ok(Limiter {
            inner: Arc::new(engine),
        })
    }
}
