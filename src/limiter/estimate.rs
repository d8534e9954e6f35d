//! [`Estimate`]: tokens taken on an estimate, settled at the actual cost later.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::engine::settle::settle_op;
use crate::limiter::{Limiter, LimiterError, settle};
use crate::model::decision::LimitDecision;
use crate::model::key::{IntoKey, Key};
use crate::store::Op;

impl Limiter {
    /// Admits work whose cost is known only when it is done (the tokens of a model call):
    /// takes `estimate` tokens if they are there, as [`check`](Self::check) does, and
    /// answers an [`Estimate`] to [`settle`](Estimate::settle) at the actual cost.
    ///
    /// The limit must count with GCRA and spend no lease
    /// ([`LimiterError::CannotSettle`] otherwise, before anything is taken). A settle
    /// charges the whole usage, leaving the bucket in debt if need be (the next requests
    /// of the key wait until it is paid); the limit's
    /// [`max_debt`](crate::LimitSpec::max_debt), if set, caps that debt, and then over any
    /// interval of length `d` a key is charged at most `burst + rate·d + max_debt` tokens.
    /// Each estimate is counted once: settling moves the bucket by the difference only.
    ///
    /// ```
    /// use tollgate::{store::MemoryStore, LimitSpec, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .limit(LimitSpec::new("tokens", Quota::per_minute(1_000).burst(1_000)).max_debt(500))
    ///     .build()?;
    /// let call = limiter.admit("tokens", "alice", 300).await?; // max_tokens: 300
    /// assert!(call.is_allowed());
    /// // ... the model answers, using 120 tokens: 180 go back.
    /// let after = call.settle(120).await?.expect("settled");
    /// assert_eq!(after.remaining(), Some(880));
    /// // A call that used far more than its estimate leaves the key in debt (500 at most).
    /// let call = limiter.admit("tokens", "alice", 100).await?;
    /// call.settle(5_000).await?;
    /// let next = limiter.admit("tokens", "alice", 1).await?;
    /// assert!(!next.is_allowed()); // until 501 tokens have refilled
    /// # Ok(()) }
    /// ```
    pub fn admit(
        &self,
        limit: &str,
        key: impl IntoKey,
        estimate: u32,
    ) -> impl Future<Output = Result<Estimate, LimiterError>> + Send + 'static {
        let key = key.into_key();
        let ready = self.inner.can_settle(limit).map(|()| {
            let check = self.one(Op::Check, limit, key.clone(), estimate);
            (check, self.clone(), key)
        });
        async move {
            let (check, limiter, key) = ready?;
            let decision = check.await?;
            // What was taken (nothing if refused, or if the store failed open): a
            // settle moves the bucket by the difference from it.
            let held = matches!(decision.outcome(), Some(o) if o.is_allowed()).then(|| Held {
                limiter,
                limit: decision.name,
                key,
                estimate,
            });
            Ok(Estimate { decision, held })
        }
    }
}

/// Tokens taken on an estimate by [`Limiter::admit`], to be settled at the actual cost.
///
/// [`settle`](Self::settle) consumes it, so an estimate is settled at most once; dropping
/// it unsettled leaves the estimate as the cost (nothing is kept: dropping any number of
/// estimates holds no memory). A refused estimate took nothing, and settles nothing.
#[must_use = "an estimate stands as the cost unless settled"]
pub struct Estimate {
    decision: LimitDecision,
    /// What a settle needs; `None` when nothing was taken.
    held: Option<Held>,
}

struct Held {
    limiter: Limiter,
    limit: &'static str,
    key: Key,
    estimate: u32,
}

impl Estimate {
    /// Whether the estimate's tokens were there (a shadow limit never refuses).
    pub fn is_allowed(&self) -> bool {
        self.decision.allowed()
    }

    /// The admission's decision (its cost is the estimate; a refused one says when to
    /// retry).
    pub fn decision(&self) -> &LimitDecision {
        &self.decision
    }

    /// Settles at the `actual` cost: the tokens beyond the estimate are taken, into debt
    /// if need be (of at most the limit's `max_debt` if it has one: what goes beyond is
    /// forgiven), or those it
    /// overestimated given back (never beyond a full bucket). Answers the bucket's state
    /// afterwards, or `None` when there was nothing to settle (a refused estimate, or
    /// `actual` equal to the estimate).
    ///
    /// The operation is made when this is called on a store that answers at once (memory)
    /// and when the future is first polled on a remote one (Redis, where it rides in the
    /// same call as the checks waiting then): await it, or spawn it.
    pub fn settle(
        mut self,
        actual: u32,
    ) -> impl Future<Output = Result<Option<LimitDecision>, LimiterError>> + Send + 'static {
        let applied = self.held.take().and_then(|held| {
            let (op, cost) = settle_op(held.estimate, actual, 0)?;
            let calls = smallvec::smallvec![(held.limit, held.key, cost)];
            Some(held.limiter.inner.apply(op, calls, Duration::ZERO))
        });
        async move {
            match applied {
                None => Ok(None),
                Some(applied) => Ok(settle(applied?).await.limits.pop()),
            }
        }
    }
}

impl fmt::Debug for Estimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Estimate")
            .field("held", &self.held.as_ref().map(|h| h.estimate))
            .field("decision", &self.decision)
            .finish()
    }
}
