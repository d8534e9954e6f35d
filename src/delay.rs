//! Delay mode (design brief §13): a request over a limit in delay mode reserves its tokens
//! and waits for them instead of getting a 429.
//!
//! The engine asks the store for a reservation ([`Item::max_wait`](crate::store::Item))
//! only while the limit has room for one more waiter; a request the store lets through
//! with a wait takes a waiter's place ([`Waiters::enter`]) and carries a [`DelayGuard`],
//! which frees the place when the request proceeds or goes away, and gives its tokens back
//! if it goes away before its instant — exactly once, whatever ends it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use smallvec::SmallVec;

use crate::engine::{ChargeKeys, Plan};
use crate::layer::Shared;
use crate::limit::OnLimit;
use crate::store::Store;

/// The requests of one delay-mode limit that wait, in one layer.
pub(crate) struct Waiters {
    pub(crate) max_wait: Duration,
    max: usize,
    waiting: AtomicUsize,
}

impl Waiters {
    /// The waiters of a limit in delay mode; `None` in reject mode.
    pub(crate) fn new(on_limit: OnLimit) -> Option<Self> {
        match on_limit {
            OnLimit::Reject => None,
            OnLimit::Delay {
                max_wait,
                max_waiters,
            } => Some(Self {
                max_wait,
                max: max_waiters,
                waiting: AtomicUsize::new(0),
            }),
        }
    }

    /// Whether one more request may wait: read only, so that the requests of a limit in
    /// delay mode that do not wait write nothing shared.
    #[inline]
    pub(crate) fn has_room(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) < self.max
    }

    /// Takes a waiter's place; `false` if all are taken (requests that saw room at once
    /// raced for the last places).
    pub(crate) fn enter(&self) -> bool {
        if self.waiting.fetch_add(1, Ordering::AcqRel) < self.max {
            true
        } else {
            self.leave();
            false
        }
    }

    pub(crate) fn leave(&self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }

    /// How many requests wait now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// What the engine decided for a request that waits: how long, the waiters' places it
/// took (bound indices), and the tokens it reserved (plan index and key of each limit that
/// consumed).
pub(crate) struct Delay {
    pub(crate) wait: Duration,
    pub(crate) places: SmallVec<[usize; 2]>,
    pub(crate) reserved: ChargeKeys,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_even_when_requests_race_for_the_last_one() {
        let w = Waiters::new(OnLimit::Delay {
            max_wait: Duration::from_secs(1),
            max_waiters: 3,
        })
        .unwrap();
        let w = Arc::new(w);
        let entered: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..1_000).filter(|_| w.enter()).count()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(entered, 3, "three places, never more");
        assert_eq!(w.waiting(), 3);
        assert!(!w.has_room());
        w.leave();
        assert!(w.has_room());
        assert!(w.enter());
    }
}
