//! The guards a passing request carries to its response: [`ChargeGuard`] gives back the
//! cost of limits that charge by outcome when the response does not count, and
//! [`DelayGuard`] holds a waiting request's places and tokens. Each gives back at most
//! once, on its event or on drop (the client went away). Runtime state of the request
//! path, kept apart from the configuration they act on (`Charge`, delay mode's `Waiters`).

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use smallvec::SmallVec;

use crate::engine::delay::Delay;
use crate::engine::{ChargeKeys, Plan};
use crate::middleware::layer::Shared;
use crate::store::Store;

/// The charges of a request to settle when its response comes, if any.
pub(crate) type PendingCharge<St, R> = Option<Box<ChargeGuard<St, R>>>;

/// The costs a passing request took from limits that charge by outcome, given back when
/// the outcome does not count — at most once: when the response is settled, or on drop.
pub(crate) struct ChargeGuard<St: Store, R> {
    shared: Arc<Shared<St, R>>,
    plan: Plan,
    /// Plan index and key of each limit still to settle.
    pending: ChargeKeys,
}

impl<St: Store, R> ChargeGuard<St, R> {
    /// A guard for the `charged` limits (plan indices) of a request, if any.
    pub(crate) fn new(
        shared: &Arc<Shared<St, R>>,
        plan: &Plan,
        keys: Option<Box<ChargeKeys>>,
        charged: &[usize],
    ) -> PendingCharge<St, R> {
        let keys = keys?;
        let pending: ChargeKeys = keys
            .into_iter()
            .filter(|(i, _)| charged.contains(i))
            .collect();
        (!pending.is_empty()).then(|| {
            Box::new(Self {
                shared: shared.clone(),
                plan: plan.clone(),
                pending,
            })
        })
    }

    /// The response exists: gives back the cost of each limit it does not count for.
    pub(crate) fn settle(mut self: Box<Self>, status: StatusCode, headers: &HeaderMap) {
        let engine = &self.shared.engine;
        let refunds: ChargeKeys = std::mem::take(&mut self.pending)
            .into_iter()
            .filter(|(i, _)| {
                !engine.bounds[self.plan[*i].bound]
                    .limit
                    .charge
                    .counts(status, headers)
            })
            .collect();
        if !refunds.is_empty() {
            engine.refund(&self.plan, &refunds);
        }
    }
}

impl<St: Store, R> Drop for ChargeGuard<St, R> {
    /// No response (the inner service failed, or the future was dropped): nothing counts.
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            self.shared.engine.refund(&self.plan, &pending);
        }
    }
}

/// A waiting request's places and reservation: dropped before [`admit`](Self::admit),
/// it gives the tokens back; either way it frees the places once.
pub(crate) struct DelayGuard<St: Store, R> {
    shared: Arc<Shared<St, R>>,
    plan: Plan,
    places: SmallVec<[usize; 2]>,
    reserved: ChargeKeys,
}

impl<St: Store, R> DelayGuard<St, R> {
    pub(crate) fn new(shared: &Arc<Shared<St, R>>, plan: &Plan, delay: Delay) -> Self {
        Self {
            shared: shared.clone(),
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

impl<St: Store, R> Drop for DelayGuard<St, R> {
    /// Frees the places; gone before its instant (the client went away), the request
    /// gives its tokens back.
    fn drop(&mut self) {
        self.shared
            .engine
            .release(&self.plan, &self.places, &self.reserved);
    }
}
