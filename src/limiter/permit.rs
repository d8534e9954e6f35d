//! [`Permit`]: a unit of an in-flight limit held by work that is not an HTTP request.

use std::fmt;

use smallvec::SmallVec;

use crate::limiter::Limiter;
use crate::model::decision::LimitDecision;
use crate::model::key::Key;

/// What [`Limiter::acquire`] answers: whether the key had a free unit of the in-flight
/// limit, and while the permit lives, that unit. Dropping it (or
/// [`release`](Self::release)) gives the unit back, exactly once.
///
/// ```
/// use tollgate::{store::MemoryStore, LimitSpec, Limiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::builder(MemoryStore::new())
///     .limit(LimitSpec::in_flight("exports", 2))
///     .build()?;
/// let a = limiter.acquire("exports", "acme").await?;
/// let b = limiter.acquire("exports", "acme").await?;
/// assert!(a.is_granted() && b.is_granted());
/// // Two exports of acme run: a third waits for one of them.
/// let c = limiter.acquire("exports", "acme").await?;
/// assert!(!c.is_granted());
/// drop(a);
/// assert!(limiter.acquire("exports", "acme").await?.is_granted());
/// # Ok(()) }
/// ```
#[must_use = "a permit gives its unit back when dropped"]
pub struct Permit {
    decision: LimitDecision,
    held: Option<Held>,
}

struct Held {
    limiter: Limiter,
    calls: SmallVec<[(&'static str, Key, u32); 2]>,
}

impl Permit {
    pub(crate) fn new(limiter: Limiter, decision: LimitDecision, key: Key) -> Self {
        let took = decision.cost() > 0 && decision.allowed() && decision.outcome().is_some();
        let held = took.then(|| Held {
            limiter,
            calls: smallvec::smallvec![(decision.name, key, decision.cost())],
        });
        Self { decision, held }
    }

    /// Whether the unit was free (a shadow limit always grants).
    pub fn is_granted(&self) -> bool {
        self.decision.allowed()
    }

    /// The limit's decision: the units left, and for a refusal the limit's `retry_after`.
    pub fn decision(&self) -> &LimitDecision {
        &self.decision
    }

    /// Gives the unit back now (as dropping the permit does).
    pub fn release(mut self) {
        self.give_back();
    }

    fn give_back(&mut self) {
        if let Some(held) = self.held.take()
            && let Some(checked) = held.limiter.apply_refund(held.calls)
        {
            checked.finish_in_background("an in-flight unit");
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("granted", &self.is_granted())
            .field("held", &self.held.is_some())
            .field("decision", &self.decision)
            .finish()
    }
}
