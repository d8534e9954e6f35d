//! [`Handles`]: the [`Limiter`] handles a layer puts in requests' extensions, one per
//! thread slot, so that putting one in a request writes a reference count that only the
//! threads of one slot share, never one that every core of the server writes on every
//! request.

use std::num::NonZero;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::limiter::{Applied, Calls, Handle, Limiter, LimiterError};
use crate::observe::offenders::RefusedKey;
use crate::store::Op;

/// The most slots (8 KiB of them).
const MAX_SLOTS: usize = 64;

/// Limiter handles on one target, one per thread slot, each made by the first request of
/// its slot that needs one. One `Handles` serves one target: the first one it is asked
/// for.
pub(crate) struct Handles {
    slots: Box<[Slot]>,
}

/// One slot's handle, in cache lines of its own (two: the adjacent-line prefetcher pairs
/// them).
#[repr(align(128))]
#[derive(Default)]
struct Slot(OnceLock<Limiter>);

/// A handle on the target, allocated once per slot: its reference count, which each
/// request's handle increments, sits in cache lines of its own.
#[repr(align(128))]
struct Proxy<H>(Arc<H>);

impl Handles {
    /// Twice as many slots as the machine runs threads at once (a power of two, at most
    /// 64).
    pub(crate) fn new() -> Self {
        // Asked once per process: on Linux the answer reads the cgroup's files.
        static SLOTS: OnceLock<usize> = OnceLock::new();
        let slots = *SLOTS.get_or_init(|| {
            let threads = std::thread::available_parallelism().map_or(8, NonZero::get);
            (threads * 2).next_power_of_two().min(MAX_SLOTS)
        });
        Self {
            slots: (0..slots).map(|_| Slot::default()).collect(),
        }
    }

    /// A handle on `target` for a request: a clone of the calling thread's slot's handle.
    pub(crate) fn limiter<H: Handle>(&self, target: &Arc<H>) -> Limiter {
        let slot = &self.slots[thread_index() & (self.slots.len() - 1)];
        slot.0
            .get_or_init(|| Limiter::from_handle(Arc::new(Proxy(target.clone()))))
            .clone()
    }
}

/// A number per thread, handed out in the order threads first ask.
fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

impl<H: Handle> Handle for Proxy<H> {
    fn apply(&self, op: Op, calls: Calls<'_>, max_wait: Duration) -> Result<Applied, LimiterError> {
        self.0.apply(op, calls, max_wait)
    }

    fn names(&self) -> Vec<&'static str> {
        self.0.names()
    }

    fn top_refused(&self, limit: &str, n: usize) -> Result<Vec<RefusedKey>, LimiterError> {
        self.0.top_refused(limit, n)
    }

    fn can_settle(&self, limit: &str) -> Result<(), LimiterError> {
        self.0.can_settle(limit)
    }

    fn bans(&self, limit: &str) -> Result<Vec<crate::engine::ban::BannedKey>, LimiterError> {
        self.0.bans(limit)
    }

    fn set_ban(
        &self,
        limit: &str,
        key: crate::model::key::Key,
        length: Option<Duration>,
    ) -> Result<(), LimiterError> {
        self.0.set_ban(limit, key, length)
    }

    fn algorithm(&self, limit: &str) -> Option<crate::algo::algorithm::Algorithm> {
        self.0.algorithm(limit)
    }

    fn paced(&self, limit: &str) -> Option<crate::limiter::Paced> {
        self.0.paced(limit)
    }

    fn key_for(
        &self,
        limit: &str,
        parts: &http::request::Parts,
    ) -> Option<Result<Option<crate::model::key::Key>, LimiterError>> {
        self.0.key_for(limit, parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target that only knows its name.
    struct Named;

    impl Handle for Named {
        fn apply(&self, _: Op, _: Calls<'_>, _: Duration) -> Result<Applied, LimiterError> {
            unreachable!("not called")
        }

        fn names(&self) -> Vec<&'static str> {
            vec!["per-key"]
        }

        fn algorithm(&self, _: &str) -> Option<crate::algo::algorithm::Algorithm> {
            None
        }

        fn paced(&self, _: &str) -> Option<crate::limiter::Paced> {
            None
        }

        fn top_refused(&self, _: &str, _: usize) -> Result<Vec<RefusedKey>, LimiterError> {
            Ok(Vec::new())
        }

        fn can_settle(&self, _: &str) -> Result<(), LimiterError> {
            Ok(())
        }
    }

    #[test]
    fn the_handles_of_many_requests_write_one_reference_count_per_thread() {
        let target = Arc::new(Named);
        let handles = Handles::new();
        // A thousand requests' handles on this thread: one proxy holds the target.
        let mine: Vec<Limiter> = (0..1_000).map(|_| handles.limiter(&target)).collect();
        assert_eq!(Arc::strong_count(&target), 2, "the owner and one proxy");
        // Three more threads: at most one proxy each.
        let theirs: Vec<Vec<Limiter>> = std::thread::scope(|s| {
            let spawned: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        (0..100)
                            .map(|_| handles.limiter(&target))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            spawned.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(
            Arc::strong_count(&target) <= 5,
            "{}",
            Arc::strong_count(&target)
        );
        assert_eq!(theirs.iter().map(Vec::len).sum::<usize>(), 300);
        // Each handle reaches the target.
        assert_eq!(mine[999].limits(), ["per-key"]);
        assert_eq!(theirs[2][0].limits(), ["per-key"]);
    }

    #[test]
    fn a_handle_keeps_its_target_alive_and_nothing_is_left_once_all_are_gone() {
        let target = Arc::new(Named);
        let weak = Arc::downgrade(&target);
        let handles = Handles::new();
        let limiter = handles.limiter(&target);
        drop((target, handles));
        assert!(weak.upgrade().is_some(), "the handle keeps the target");
        assert_eq!(limiter.limits(), ["per-key"]);
        drop(limiter);
        assert!(weak.upgrade().is_none(), "nothing else keeps it after that");
    }
}
