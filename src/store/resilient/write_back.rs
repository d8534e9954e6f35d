//! The write-back list: the keys the backend left with nothing, one entry per (limit,
//! key), written back (blocked until they were spent to) when the backend loses its
//! buckets (its reset count moves).

use std::sync::Arc;
use std::time::Duration;

use super::lease::LeaseTable;
use super::{Part, Resilient};
use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;
use crate::base::clock::Clock;
use crate::model::decision::Outcome;
use crate::model::key::Key;
use crate::store::{Backend, Op};

/// Write-back calls in flight at once, at most.
const WRITING_BACK: usize = 64;

/// How long a write-back the backend did not apply is sent again (100 ms, then twice as
/// long each time, at most 5 s apart).
const RETRY_FOR_NS: u64 = 30_000_000_000;

/// Keys remembered for a write-back, at most.
const REMEMBERED_REFUSALS: usize = 10_000;

/// A key the backend left with nothing (refused, or granted its last token), remembered
/// to be written back if the backend loses its buckets: a GCRA bucket full again at
/// `until`, a fixed window full until `until` (its end), on the store's clock.
struct Refused {
    remote: Arc<LeaseTable>,
    key: Key,
    quota: Quota,
    algorithm: Algorithm,
    until: u64,
}

/// The keys to write back if the backend loses its buckets: one entry per (limit, key),
/// the most spent state seen, kept until that state has passed (a write-back does not
/// empty it, so a second loss restores again), at most [`REMEMBERED_REFUSALS`].
#[derive(Default)]
pub(super) struct WriteBack {
    keys: std::collections::HashMap<(usize, Key), Refused, foldhash::fast::RandomState>,
    /// When entries that have passed were last dropped (at most once a second when full,
    /// so a full list costs a lookup per new key, not a scan).
    purged_at: u64,
}

impl WriteBack {
    /// Remembers `r` at `now`: `false` if the list is full of live entries (`r` is
    /// dropped).
    fn remember(&mut self, r: Refused, now: u64) -> bool {
        let id = (Arc::as_ptr(&r.remote) as usize, r.key.clone());
        if let Some(known) = self.keys.get_mut(&id) {
            if r.until >= known.until {
                *known = r;
            }
            return true;
        }
        if self.keys.len() >= REMEMBERED_REFUSALS
            && now.saturating_sub(self.purged_at) >= 1_000_000_000
        {
            self.purged_at = now;
            self.keys.retain(|_, k| k.until > now);
        }
        if self.keys.len() >= REMEMBERED_REFUSALS {
            return false;
        }
        self.keys.insert(id, r);
        true
    }

    /// When the bucket of `key` (of the limit `remote` leases for) is full again, if
    /// remembered.
    pub(super) fn until(&self, remote: &Arc<LeaseTable>, key: &Key) -> Option<u64> {
        let id = (Arc::as_ptr(remote) as usize, key.clone());
        self.keys.get(&id).map(|k| k.until)
    }

    /// The entries still to restore at `now` (those that have passed are dropped).
    fn live(&mut self, now: u64) -> Vec<(Arc<LeaseTable>, Key, Quota, Algorithm, u64)> {
        self.keys.retain(|_, k| k.until > now);
        self.keys
            .values()
            .map(|k| {
                (
                    k.remote.clone(),
                    k.key.clone(),
                    k.quota,
                    k.algorithm,
                    k.until,
                )
            })
            .collect()
    }
}

impl<B: Backend> Resilient<B> {
    /// Remembers a key the backend refused with nothing left (GCRA, or a fixed window),
    /// until it could pass a request of cost 1: what a write-back restores if the backend
    /// loses its buckets.
    pub(super) fn remember_refusal(&self, part: &Part, sent_at: u64, o: &Outcome) {
        self.remember(
            &part.remote,
            &part.key,
            part.quota,
            part.algorithm,
            sent_at,
            o,
        );
    }

    /// [`remember_refusal`](Self::remember_refusal) for any refused call about `key`.
    pub(super) fn remember(
        &self,
        remote: &Arc<LeaseTable>,
        key: &Key,
        quota: Quota,
        algorithm: Algorithm,
        sent_at: u64,
        o: &Outcome,
    ) {
        // (a calendar window's block fills the window it is in: the same as a fixed one's)
        let restorable = algorithm == Algorithm::Gcra || algorithm.is_fixed();
        if !restorable || o.remaining() > 0 {
            return;
        }
        // Until the bucket is full again (GCRA), or the window ends: counted from the
        // send, so never later than the backend's own.
        let full = u64::try_from(o.reset_after().as_nanos()).unwrap_or(u64::MAX);
        let until = sent_at.saturating_add(full);
        let now = self.inner.clock.now();
        let kept = self
            .inner
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remember(
                Refused {
                    remote: remote.clone(),
                    key: key.clone(),
                    quota,
                    algorithm,
                    until,
                },
                now,
            );
        if !kept {
            self.inner.writeback_dropped.increment(1);
        }
    }

    /// The backend lost its buckets (its reset count moved): blocks every remembered key
    /// until it was refused, in the background, 64 calls at a time, each sent again until
    /// applied (for 30 s at most: a block is idempotent). A block only moves a bucket's state
    /// forward, so keys that other instances wrote back, or that requests used since, lose
    /// nothing; an exhausted key stays exhausted.
    pub(super) fn write_back_after_reset(&self) {
        let inner = &*self.inner;
        let resets = inner.backend.resets();
        let seen = inner.seen_resets.load(std::sync::atomic::Ordering::Acquire);
        if resets == seen
            || inner
                .seen_resets
                .compare_exchange(
                    seen,
                    resets,
                    std::sync::atomic::Ordering::AcqRel,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now = inner.clock.now();
        let live = inner
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .live(now);
        tracing::info!(
            keys = live.len(),
            "tollgate: writing back the spent keys {} lost",
            inner.backend.name()
        );
        let timeout = self.call_timeout();
        let permits = Arc::new(tokio::sync::Semaphore::new(WRITING_BACK));
        for (remote, key, quota, algorithm, until) in live {
            let (clock, permits) = (inner.clock.clone(), permits.clone());
            runtime.spawn(async move {
                // A write-back only moves a bucket forward to an instant (`until`), so it
                // is sent again, as is, until applied, the state has passed, or
                // `RETRY_FOR` is over (a backend that fails again after its reset).
                let started = clock.now();
                let mut wait = Duration::from_millis(100);
                loop {
                    let now = clock.now();
                    if until <= now || now.saturating_sub(started) > RETRY_FOR_NS {
                        return;
                    }
                    let left = Duration::from_nanos(until - now);
                    // GCRA: the bucket as spent as it was (full again at `until`); a fixed
                    // window: full until its end.
                    let op = if algorithm.is_window() {
                        Op::Block(left)
                    } else {
                        Op::Restore(left)
                    };
                    let applied = {
                        let Ok(_permit) = permits.acquire().await else {
                            return;
                        };
                        let call =
                            remote
                                .remote
                                .call(op, &key, quota, algorithm, 1, Duration::ZERO);
                        matches!(tokio::time::timeout(timeout, call).await, Ok(Ok(_)))
                    };
                    if applied {
                        return;
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::resilient::tests::{Down, Tokio};
    use crate::store::{Item, StoreError};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A backend whose buckets were lost once (`resets` is 1) and that fails each call at
    /// once, or lets it hang (`hang`), noting what it is sent and when (its clock).
    #[derive(Clone)]
    struct Lost {
        sent: Arc<std::sync::Mutex<Vec<(Op, u64)>>>,
        clock: Tokio,
        hang: bool,
        resets: Arc<AtomicU64>,
    }

    impl Backend for Lost {
        type Table = ();
        type Future = std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<crate::store::Statuses, StoreError>> + Send,
            >,
        >;
        fn table(&self, _: &str) {}
        fn apply(&self, op: Op, _: &[Item<'_, ()>]) -> Self::Future {
            self.sent.lock().unwrap().push((op, self.clock.now()));
            if self.hang {
                Box::pin(std::future::pending())
            } else {
                Box::pin(std::future::ready(Err(StoreError::new("down"))))
            }
        }
        fn resets(&self) -> u64 {
            self.resets.load(Ordering::Relaxed)
        }
    }

    /// A key remembered spent until `until` (ns on the store's clock), written back after
    /// its backend's reset seen at 1 s; the sends, each with the instant it was sent.
    async fn write_back_to(hang: bool, timeout: Duration, until: u64) -> Vec<(Op, u64)> {
        let clock = Tokio::start();
        let backend = Lost {
            sent: Arc::default(),
            clock: clock.clone(),
            hang,
            resets: Arc::default(),
        };
        let store = Resilient::new(backend.clone())
            .clock(clock.clone())
            .timeout(timeout);
        let api = store.lease_table("api");
        assert!(
            store
                .inner
                .refused
                .lock()
                .unwrap()
                .remember(spent(&api, "k", until), 0)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        backend.resets.store(1, Ordering::Relaxed);
        store.write_back_after_reset();
        tokio::time::sleep(Duration::from_secs(200)).await;
        backend.sent.lock().unwrap().clone()
    }

    /// Issue 41: a write-back that meets a backend failing again after its reset is sent
    /// again, as is (the bucket spent until the same instant), after pauses doubling from
    /// 100 ms to 5 s, for 30 s: 11 sends.
    #[tokio::test(start_paused = true)]
    async fn a_write_back_is_sent_again_with_doubling_pauses_for_thirty_seconds() {
        const S: u64 = 1_000_000_000;
        let sent = write_back_to(false, Duration::from_millis(50), 100 * S).await;
        let at: Vec<u64> = sent.iter().map(|&(_, t)| t - S).collect();
        let ms = 1_000_000;
        assert_eq!(
            at,
            [
                0, 100, 300, 700, 1_500, 3_100, 6_300, 11_300, 16_300, 21_300, 26_300
            ]
            .map(|t| t * ms)
        );
        for &(op, t) in &sent {
            assert_eq!(op, Op::Restore(Duration::from_nanos(100 * S - t)), "at {t}");
        }
        // A state that passes first ends the sends then: spent until 5 s, the sends of
        // 1 s to 4.1 s go and the one due at 7.3 s does not.
        let sent = write_back_to(false, Duration::from_millis(50), 5 * S).await;
        assert_eq!(sent.len(), 6, "{sent:?}");
    }

    /// The 30 s are counted from the first send, and a send due exactly 30 s after it
    /// still goes: calls that hang for 370 ms each put the 11th send at 30 s to the
    /// nanosecond.
    #[tokio::test(start_paused = true)]
    async fn a_write_back_send_due_exactly_thirty_seconds_after_the_first_still_goes() {
        const S: u64 = 1_000_000_000;
        let sent = write_back_to(true, Duration::from_millis(370), 100 * S).await;
        assert_eq!(sent.len(), 11, "{sent:?}");
        assert_eq!(sent[10].1, 31 * S);
    }

    fn spent(table: &Arc<LeaseTable>, key: &str, until: u64) -> Refused {
        Refused {
            remote: table.clone(),
            key: Key::from_part(key),
            quota: Quota::per_second(10),
            algorithm: Algorithm::Gcra,
            until,
        }
    }

    /// Issue "shared limits under stress", item 8: one entry per key, the most spent
    /// state seen, kept through a write-back (a second loss restores it again) until it
    /// has passed.
    #[test]
    fn the_write_back_list_keeps_one_entry_per_key_the_most_spent_until_it_passes() {
        let store = Resilient::new(Down);
        let (api, other) = (store.lease_table("api"), store.lease_table("other"));
        let mut list = WriteBack::default();
        for until in [100, 50, 300, 200] {
            assert!(list.remember(spent(&api, "a", until), 0));
        }
        assert!(
            list.remember(spent(&other, "a", 10), 0),
            "another limit's key"
        );
        assert_eq!(list.keys.len(), 2);
        assert_eq!(list.until(&api, &Key::from_part("a")), Some(300));
        assert_eq!(list.live(20).len(), 1, "the other limit's entry has passed");
        assert_eq!(
            list.live(20).len(),
            1,
            "a write-back does not empty the list"
        );
        assert!(list.live(300).is_empty());
        assert_eq!(list.until(&api, &Key::from_part("a")), None);
    }

    /// The list is bounded: a new key finds no room while every entry is live; entries
    /// that have passed make room, looked for at most once a second.
    #[test]
    fn a_full_write_back_list_refuses_new_keys_and_makes_room_from_passed_entries() {
        let store = Resilient::new(Down);
        let api = store.lease_table("api");
        let mut list = WriteBack::default();
        for i in 0..REMEMBERED_REFUSALS {
            assert!(list.remember(spent(&api, &i.to_string(), 5_000_000_000), 0));
        }
        assert!(!list.remember(spent(&api, "new", 9_000_000_000), 1));
        // A known key still moves forward when the list is full.
        assert!(list.remember(spent(&api, "7", 6_000_000_000), 1));
        // Passed, and more than a second since the last look: room again.
        assert!(list.remember(spent(&api, "new", 9_000_000_000), 5_500_000_000));
        assert_eq!(list.keys.len(), 2);
    }

    /// An entry whose state passes at the very instant of the look has passed: a full
    /// list makes room from it, as `live` drops it.
    #[test]
    fn a_full_write_back_list_makes_room_from_an_entry_passing_at_that_instant() {
        let store = Resilient::new(Down);
        let api = store.lease_table("api");
        let mut list = WriteBack::default();
        for i in 0..REMEMBERED_REFUSALS {
            assert!(list.remember(spent(&api, &i.to_string(), 5_000_000_000), 0));
        }
        assert!(list.remember(spent(&api, "new", 9_000_000_000), 5_000_000_000));
        assert_eq!(list.keys.len(), 1);
    }

    /// A list with room is not scanned for passed entries (a scan is for a full list, so
    /// a new key costs a lookup): what has passed stays until the list fills, or until
    /// `live` reads it.
    #[test]
    fn a_write_back_list_with_room_is_not_scanned_for_passed_entries() {
        let store = Resilient::new(Down);
        let api = store.lease_table("api");
        let mut list = WriteBack::default();
        assert!(list.remember(spent(&api, "old", 1_000), 0));
        assert!(list.remember(spent(&api, "new", 9_000_000_000), 5_000_000_000));
        assert_eq!(list.keys.len(), 2, "the passed entry was not looked for");
        assert_eq!(list.live(5_000_000_000).len(), 1);
    }
}
