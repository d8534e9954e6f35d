//! The guards a passing request carries to its response: [`ChargeGuard`] gives back the
//! cost of limits that charge by outcome when the response does not count, and
//! [`DelayGuard`] holds a waiting request's places and tokens; [`HeldGuard`] holds an
//! in-flight limit's units until the response body ends. Each gives back at most
//! once, on its event or on drop (the client went away). Runtime state of the request
//! path, kept apart from the configuration they act on (`Charge`, delay mode's `Waiters`).

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use smallvec::SmallVec;

use crate::engine::delay::Delay;
use crate::engine::{ChargeKeys, Engine, Plan};
use crate::middleware::body::{AfterBody, Ending};
use crate::store::Store;
use crate::web::charge::Charge;
use crate::web::policy::Policy;

/// The charges of a request to settle when its response comes, if any.
pub(crate) type PendingCharge<St> = Option<Box<ChargeGuard<St>>>;

/// The costs a passing request took from limits that charge by outcome, given back when
/// the outcome does not count — at most once: when the response is settled, or on drop.
pub(crate) struct ChargeGuard<St: Store> {
    engine: Arc<Engine<St>>,
    plan: Plan,
    /// Plan index and key of each limit still to settle.
    pending: ChargeKeys,
    /// The charge rule of each of them, in the same order.
    rules: SmallVec<[Charge; 1]>,
}

impl<St: Store> ChargeGuard<St> {
    /// A guard for the `charged` limits (plan indices) of a request, if any.
    #[inline]
    pub(crate) fn new(
        engine: &Arc<Engine<St>>,
        policy: &Policy,
        plan: &Plan,
        keys: Option<Box<ChargeKeys>>,
        charged: &[usize],
    ) -> PendingCharge<St> {
        Self::pending(engine, policy, plan, *keys?, charged)
    }

    /// [`ChargeGuard::new`] for a request that kept keys.
    #[inline(never)]
    fn pending(
        engine: &Arc<Engine<St>>,
        policy: &Policy,
        plan: &Plan,
        keys: ChargeKeys,
        charged: &[usize],
    ) -> PendingCharge<St> {
        let pending: ChargeKeys = keys
            .into_iter()
            .filter(|(i, _)| charged.contains(i))
            .collect();
        (!pending.is_empty()).then(|| {
            let rules = pending
                .iter()
                .map(|(i, _)| policy.limits[plan[*i].bound].limit.charge.clone())
                .collect();
            Box::new(Self {
                engine: engine.clone(),
                plan: plan.clone(),
                pending,
                rules,
            })
        })
    }

    /// The response exists: gives back the cost of each limit it does not count for.
    pub(crate) fn settle(mut self: Box<Self>, status: StatusCode, headers: &HeaderMap) {
        let rules = std::mem::take(&mut self.rules);
        let refunds: ChargeKeys = std::mem::take(&mut self.pending)
            .into_iter()
            .zip(rules)
            .filter(|(_, charge)| !charge.counts(status, headers))
            .map(|(pending, _)| pending)
            .collect();
        if !refunds.is_empty() {
            self.engine.refund(&self.plan, &refunds);
        }
    }
}

impl<St: Store> Drop for ChargeGuard<St> {
    /// No response (the inner service failed, or the future was dropped): nothing counts.
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            self.engine.refund(&self.plan, &pending);
        }
    }
}

/// A waiting request's places and reservation: dropped before [`admit`](Self::admit),
/// it gives the tokens back; either way it frees the places once.
pub(crate) struct DelayGuard<St: Store> {
    engine: Arc<Engine<St>>,
    plan: Plan,
    places: SmallVec<[usize; 2]>,
    reserved: ChargeKeys,
}

impl<St: Store> DelayGuard<St> {
    pub(crate) fn new(engine: &Arc<Engine<St>>, plan: &Plan, delay: Delay) -> Self {
        Self {
            engine: engine.clone(),
            plan: plan.clone(),
            places: delay.places,
            reserved: delay.reserved,
        }
    }

    /// The instant has come: the request proceeds with its tokens, and waits no more.
    pub(crate) fn admit(mut self) {
        self.reserved.clear();
        // Drop frees the places.
    }
}

impl<St: Store> Drop for DelayGuard<St> {
    /// Frees the places; gone before its instant (the client went away), the request
    /// gives its tokens back.
    fn drop(&mut self) {
        self.engine
            .release(&self.plan, &self.places, &self.reserved);
    }
}

/// The units a passing request took from in-flight limits, given back once: when its
/// response body ends, fails or is dropped, or when the guard is dropped without a body
/// (the service failed, the response future was dropped).
pub(crate) struct HeldGuard<St: Store> {
    engine: Arc<Engine<St>>,
    plan: Plan,
    held: ChargeKeys,
}

impl<St: Store> HeldGuard<St> {
    /// A guard for the units `held` (plan indices and keys) of a request.
    pub(crate) fn boxed(
        engine: &Arc<Engine<St>>,
        plan: &Plan,
        held: ChargeKeys,
    ) -> Box<dyn AfterBody> {
        Box::new(Self {
            engine: engine.clone(),
            plan: plan.clone(),
            held,
        })
    }

    fn release(&mut self) {
        if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            self.engine.refund(&self.plan, &held);
            // Delay mode: the longest-waiting request of each key looks again.
            for (i, key) in &held {
                if let Some(q) = &self.engine.bounds[self.plan[*i].bound].queue {
                    q.wake(crate::engine::queue::key_hash(key));
                }
            }
        }
    }
}

impl<St: Store> AfterBody for HeldGuard<St> {
    fn trailers(&mut self, _: &HeaderMap) {}

    fn ended(&mut self, _: Ending) {
        self.release();
    }
}

impl<St: Store> Drop for HeldGuard<St> {
    fn drop(&mut self) {
        self.release();
    }
}
