//! [`Reservation`]: tokens taken now for work that may start later.

use std::fmt;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::limiter::Limiter;
use crate::model::decision::Decision;
use crate::model::key::Key;
use crate::model::policy::Mode;

/// Tokens taken ahead of time by [`Limiter::reserve`]: whether they were granted, and the
/// instant the work may start.
///
/// A granted reservation holds its tokens from the moment it was made; dropping it, or
/// [`cancel`](Self::cancel)ling it, before its instant gives them back (exactly once,
/// never beyond a full bucket); from its instant on they are spent. [`wait`](Self::wait)
/// sleeps until the instant.
///
/// Cancelling gives the tokens back to the bucket: the next reservation is scheduled as
/// if the cancelled one had been the last made. Reservations already made keep their
/// instants (they are not moved up): cancelling one that others follow lets the next new
/// one start at the same time as the last of those.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{store::MemoryStore, LimitSpec, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::builder(MemoryStore::new())
///     .limit(LimitSpec::new("outbound", Quota::per_second(10).burst(1)))
///     .build()?;
/// let first = limiter.reserve("outbound", "api", 1, Duration::from_secs(1)).await?;
/// let second = limiter.reserve("outbound", "api", 1, Duration::from_secs(1)).await?;
/// assert!(first.is_granted() && second.is_granted());
/// assert!(second.wait_time() > Duration::from_millis(90)); // one token every 100 ms
/// first.wait().await.expect("granted"); // at once
/// second.wait().await.expect("granted"); // about 100 ms later
/// // Nothing within 10 ms: refused, with the time until it would be granted.
/// let late = limiter.reserve("outbound", "api", 1, Duration::from_millis(10)).await?;
/// assert!(!late.is_granted());
/// assert!(late.decision().retry_after().is_some());
/// # Ok(()) }
/// ```
#[must_use = "a reservation gives its tokens back when dropped before its instant"]
pub struct Reservation {
    decision: Decision,
    ready_at: Instant,
    /// What to give back if cancelled before `ready_at`; `None` once spent or refused.
    held: Option<Held>,
}

/// The handle and the calls (limit, key, cost) a granted reservation consumed from.
struct Held {
    limiter: Limiter,
    calls: SmallVec<[(&'static str, Key, u32); 2]>,
}

impl Reservation {
    /// The reservation a store answered: granted if every enforcing limit let it through;
    /// it may start after the longest wait of its limits.
    pub(crate) fn new(
        limiter: Limiter,
        decision: Decision,
        keys: SmallVec<[Key; 2]>,
        made_at: Instant,
    ) -> Self {
        let granted = decision.allowed();
        let wait = decision
            .limits()
            .filter(|l| l.cost() > 0 && l.mode() == Mode::Enforce)
            .filter_map(|l| l.outcome().map(|o| o.wait()))
            .max()
            .unwrap_or(Duration::ZERO);
        let calls: SmallVec<[(&'static str, Key, u32); 2]> = decision
            .limits()
            .zip(keys)
            .filter(|(l, _)| l.cost() > 0 && l.allowed() && l.outcome().is_some())
            .map(|(l, key)| (l.name, key, l.cost()))
            .collect();
        let held = (granted && !calls.is_empty()).then_some(Held { limiter, calls });
        Self {
            decision,
            ready_at: made_at + wait,
            held,
        }
    }

    /// Whether the tokens were taken: every enforcing limit had them within the wait.
    pub fn is_granted(&self) -> bool {
        self.decision.allowed()
    }

    /// The decision, limit by limit: for a refused reservation,
    /// [`retry_after`](Decision::retry_after) says when the same request would be granted
    /// as a check.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The instant the work may start (for a refused reservation, when it was made).
    pub fn ready_at(&self) -> Instant {
        self.ready_at
    }

    /// How long from now until the work may start (zero once the instant has passed).
    pub fn wait_time(&self) -> Duration {
        self.ready_at.saturating_duration_since(Instant::now())
    }

    /// Sleeps until the reservation's instant: `Ok` with the decision once the work may
    /// start, or at once `Err` with the decision if the reservation was refused. Dropping
    /// the future before the instant cancels the reservation (the tokens go back).
    pub async fn wait(mut self) -> Result<Decision, Decision> {
        if !self.is_granted() {
            return Err(self.take_decision());
        }
        tokio::time::sleep_until(self.ready_at).await;
        // The instant has come: the tokens are spent.
        self.held = None;
        Ok(self.take_decision())
    }

    fn take_decision(&mut self) -> Decision {
        Decision {
            limits: std::mem::take(&mut self.decision.limits),
        }
    }

    /// Gives the tokens back if the reservation's instant has not come (the work will not
    /// be done); answers whether they went back. After the instant it changes nothing.
    pub fn cancel(mut self) -> bool {
        self.give_back()
    }

    fn give_back(&mut self) -> bool {
        let Some(held) = self.held.take() else {
            return false;
        };
        if Instant::now() >= self.ready_at {
            return false;
        }
        match held.limiter.apply_refund(held.calls) {
            Some(checked) => checked.finish_in_background("a cancelled reservation"),
            None => return false,
        }
        true
    }
}

impl Drop for Reservation {
    /// Dropped before its instant: the tokens go back.
    fn drop(&mut self) {
        self.give_back();
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("granted", &self.is_granted())
            .field("wait", &self.wait_time())
            .field("held", &self.held.is_some())
            .field("decision", &self.decision)
            .finish()
    }
}
