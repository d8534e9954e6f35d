//! Delay mode of an in-flight limit: a request refused only because its key's units are
//! all held waits for one, in arrival order, instead of getting a 429 at once.
//!
//! A [`Queue`] per limit holds the waiting requests (at most `max_waiters`; one more is
//! refused at once), each with the hash of its key. A unit freed on this instance wakes
//! the longest-waiting request of its key, which checks again; a request also checks again
//! every [`POLL`] (units freed by another instance sharing the store wake no one here),
//! and gives up at its `max_wait`. A request that arrives while requests of its key wait
//! queues behind them without checking, so that arrival order holds on this instance.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::model::key::Key;

/// The hash a queue knows a key by.
pub(crate) fn key_hash(key: &Key) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x7175_6575_6500_0001).hash_one(key)
}

/// How often a waiting request checks again without being woken.
pub(crate) const POLL: Duration = Duration::from_millis(100);

struct Entry {
    id: u64,
    key: u64,
    notify: Arc<Notify>,
    /// Woken and not waiting again yet: the next wake goes to the next request.
    woken: bool,
}

/// The requests waiting for a unit of one in-flight limit, oldest first.
pub(crate) struct Queue {
    entries: Mutex<VecDeque<Entry>>,
    max: usize,
    /// How long a request waits at most.
    pub(crate) max_wait: Duration,
    next: AtomicU64,
}

impl Queue {
    pub(crate) fn new(max: usize, max_wait: Duration) -> Self {
        Self {
            entries: Mutex::new(VecDeque::new()),
            max,
            max_wait,
            next: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place at the back for a request of `key`; `None` when `max_waiters` wait.
    pub(crate) fn enter(self: &Arc<Self>, key: u64) -> Option<Ticket> {
        let mut entries = self.lock();
        if entries.len() >= self.max {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        entries.push_back(Entry {
            id,
            key,
            notify: notify.clone(),
            woken: false,
        });
        Some(Ticket {
            queue: self.clone(),
            id,
            key,
            notify,
        })
    }

    /// Whether requests of `key` wait.
    pub(crate) fn has_waiters(&self, key: u64) -> bool {
        self.lock().iter().any(|e| e.key == key)
    }

    /// A unit of `key` was freed: wakes the longest-waiting request of `key` that is not
    /// already woken.
    pub(crate) fn wake(&self, key: u64) {
        let mut entries = self.lock();
        if let Some(e) = entries.iter_mut().find(|e| e.key == key && !e.woken) {
            e.woken = true;
            e.notify.notify_one();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A request's place in a [`Queue`]: left when dropped (the request passed, gave up, or
/// went away); a wake it did not use goes to the next request of its key.
pub(crate) struct Ticket {
    queue: Arc<Queue>,
    id: u64,
    key: u64,
    notify: Arc<Notify>,
}

impl Ticket {
    /// What wakes this request.
    pub(crate) fn notifier(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    /// Waits until woken (a unit of the key was freed), or at most [`POLL`].
    #[cfg(test)]
    async fn woken_or_poll(&self) {
        let _ = tokio::time::timeout(POLL, self.notify.notified()).await;
    }

    /// Waits again (after a check that found no unit): the next wake may come here.
    pub(crate) fn rearm(&self) {
        let mut entries = self.queue.lock();
        if let Some(e) = entries.iter_mut().find(|e| e.id == self.id) {
            e.woken = false;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut entries = self.queue.lock();
        let Some(at) = entries.iter().position(|e| e.id == self.id) else {
            return;
        };
        let left = entries.remove(at).expect("found");
        drop(entries);
        if left.woken {
            // Woken for a unit it may not have taken (it gave up, or went away): the
            // next request of its key looks.
            self.queue.wake(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_known_again_and_another_key_does_not_queue_behind_it() {
        let (a, b) = (Key::from_part(1u32), Key::from_part(2u32));
        assert_eq!(key_hash(&a), key_hash(&Key::from_part(1u32)));
        let queue = Arc::new(Queue::new(8, Duration::from_secs(1)));
        let _waiting = queue.enter(key_hash(&a)).expect("room");
        assert!(queue.has_waiters(key_hash(&a)));
        assert!(
            !queue.has_waiters(key_hash(&b)),
            "a request of another key checks at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_reaches_the_requests_notifier() {
        let queue = Arc::new(Queue::new(2, Duration::from_secs(1)));
        let ticket = queue.enter(7).expect("room");
        let notifier = ticket.notifier();
        queue.wake(7);
        tokio::time::timeout(Duration::from_millis(1), notifier.notified())
            .await
            .expect("the wake reached the notifier the request waits on");
    }

    #[tokio::test(start_paused = true)]
    async fn wakes_go_to_the_oldest_request_of_the_key_one_each() {
        let q = Arc::new(Queue::new(3, Duration::from_secs(1)));
        let a = q.enter(1).unwrap();
        let b = q.enter(2).unwrap();
        let c = q.enter(1).unwrap();
        assert!(q.enter(1).is_none(), "at most max_waiters");
        assert!(q.has_waiters(1) && q.has_waiters(2) && !q.has_waiters(3));
        q.wake(1);
        q.wake(1);
        // a and c are both woken (a first), b is not.
        let start = tokio::time::Instant::now();
        a.woken_or_poll().await;
        c.woken_or_poll().await;
        assert_eq!(start.elapsed(), Duration::ZERO, "woken at once");
        b.woken_or_poll().await;
        assert_eq!(start.elapsed(), POLL, "b waited its poll");
        // a waits again; a wake for key 1 goes to a (c is still woken).
        a.rearm();
        drop(c);
        // c left woken: its wake passed to a.
        a.woken_or_poll().await;
        assert_eq!(start.elapsed(), POLL);
        drop((a, b));
        assert_eq!(q.len(), 0);
    }
}
