//! Delay mode: a request over a limit in delay mode reserves its tokens
//! and waits for them instead of getting a 429.
//!
//! The engine asks the store for a reservation ([`Item::max_wait`](crate::store::Item))
//! only while the limit has room for one more waiter; a request the store lets through
//! with a wait takes a waiter's place ([`Waiters::enter`]) and carries a `DelayGuard` (`guard.rs`),
//! which frees the place when the request proceeds or goes away, and gives its tokens back
//! if it goes away before its instant — exactly once, whatever ends it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use smallvec::SmallVec;

use crate::model::key::Key;
use crate::model::policy::OnLimit;

/// How many requests wait, per limit name: shared by the limits of one name in a layer,
/// and by the successive versions of reloaded rules (a reload must not reset the count
/// while the old version's requests still wait).
#[derive(Clone, Default)]
pub(crate) struct WaitCounts(Arc<Mutex<HashMap<Box<str>, Arc<AtomicUsize>>>>);

impl WaitCounts {
    /// The count of the limit called `name`.
    pub(crate) fn of(&self, name: &str) -> Arc<AtomicUsize> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(name.into()).or_default().clone()
    }
}

impl std::fmt::Debug for WaitCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WaitCounts")
    }
}

/// The requests of one delay-mode limit that wait, in one layer.
pub(crate) struct Waiters {
    max_wait: Duration,
    max: usize,
    waiting: Arc<AtomicUsize>,
    /// `tollgate_delayed_total{limit}`, `tollgate_delay_seconds{limit}`.
    metrics: crate::observe::probe::DelayMetrics,
}

impl Waiters {
    /// The waiters of the limit `name` in delay mode, counted in `counts`; `None` in
    /// reject mode.
    pub(crate) fn new(on_limit: OnLimit, name: &str, counts: &WaitCounts) -> Option<Self> {
        match on_limit {
            OnLimit::Reject => None,
            OnLimit::Delay {
                max_wait,
                max_waiters,
            } => Some(Self {
                max_wait,
                max: max_waiters,
                waiting: counts.of(name),
                metrics: crate::observe::probe::DelayMetrics::new(name),
            }),
        }
    }

    /// The longest a request may wait: the limit's `max_wait`.
    #[inline]
    pub(crate) fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// A request took a place and waits `_wait` (feature `metrics`).
    #[inline]
    pub(crate) fn record(&self, _wait: Duration) {
        self.metrics.record(_wait);
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

/// A stream's place among the waiters of a limit ([`OverLimit::Wait`]'s `max_waiters`,
/// counted with the limit's waiting requests): left when dropped (the stream's charge was
/// paid, refused, or dropped with its stream).
///
/// [`OverLimit::Wait`]: crate::model::stream::OverLimit::Wait
pub(crate) struct Place(Arc<AtomicUsize>);

impl Place {
    /// A place among the `max` waiters counted in `waiting`; `None` if all are taken.
    pub(crate) fn take(waiting: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        if waiting.fetch_add(1, Ordering::AcqRel) < max {
            Some(Self(waiting.clone()))
        } else {
            waiting.fetch_sub(1, Ordering::AcqRel);
            None
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the engine decided for a request that waits: how long, the waiters' places it
/// took (bound indices), and the tokens it reserved (plan index and key of each limit that
/// consumed).
pub(crate) struct Delay {
    pub(crate) wait: Duration,
    pub(crate) places: SmallVec<[usize; 2]>,
    /// The same shape as the engine's `ChargeKeys`: plan index and key.
    pub(crate) reserved: SmallVec<[(usize, Key); 1]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_even_when_requests_race_for_the_last_one() {
        let w = Waiters::new(
            OnLimit::Delay {
                max_wait: Duration::from_secs(1),
                max_waiters: 3,
            },
            "l",
            &WaitCounts::default(),
        )
        .unwrap();
        let w = Arc::new(w);
        let entered: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..1_000).filter(|_| w.enter()).count()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(entered, 3, "three places, never more");
        // Streams' places count with the requests': none left.
        assert!(Place::take(&w.waiting, 3).is_none());
        assert_eq!(w.waiting(), 3, "a place refused takes nothing");
        assert_eq!(w.waiting(), 3);
        assert!(!w.has_room());
        w.leave();
        assert!(w.has_room());
        let place = Place::take(&w.waiting, 3).expect("the place a request left");
        assert!(
            !w.has_room(),
            "a stream's place is taken from the requests'"
        );
        drop(place);
        assert!(w.has_room(), "and given back when the stream stops waiting");
        assert!(w.enter());
    }
}
