//! In-flight units this store holds in Redis: one sorted-set member per admitted request
//! (`<instance>:<seq>:<units>`, see `lua/window.lua`), remembered by key until released.
//! A task renews them once a second (each member's score moved to now + the deadline, only
//! if it is still there, so a renewal never brings back a released member); after Redis
//! lost its state (the epoch probe's resets) it adds them back. A grant whose answer never
//! came is not remembered, and a release whose call failed is forgotten anyway: both
//! members expire with their deadline. Bounded by the requests in flight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use smallvec::SmallVec;

/// The members of one key, with their units.
type Members = SmallVec<[(Arc<str>, u32); 2]>;

#[derive(Default)]
pub(super) struct Held {
    seq: AtomicU64,
    map: Mutex<HashMap<Vec<u8>, Members>>,
    renewing: AtomicBool,
}

impl Held {
    /// A new member for a request of `units` from `instance`.
    pub(super) fn member(&self, instance: &str, units: u32) -> Arc<str> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        Arc::from(format!("{instance}:{seq}:{units}"))
    }

    /// Redis admitted `member` in `key`.
    pub(super) fn add(&self, key: &[u8], member: Arc<str>, units: u32) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(key.to_vec()).or_default().push((member, units));
    }

    /// A member of `key` of `units` (any, if none has exactly that many), forgotten: what
    /// a release removes. `None` if the key holds nothing here.
    pub(super) fn take(&self, key: &[u8], units: u32) -> Option<Arc<str>> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let members = map.get_mut(key)?;
        let at = members
            .iter()
            .position(|(_, u)| *u == units)
            .unwrap_or(members.len().checked_sub(1)?);
        let (member, _) = members.swap_remove(at);
        if members.is_empty() {
            map.remove(key);
        }
        Some(member)
    }

    /// Every key with its members, comma-separated: what a renewal sends.
    pub(super) fn snapshot(&self) -> Vec<(Vec<u8>, String)> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .map(|(key, members)| {
                let list: Vec<&str> = members.iter().map(|(m, _)| &**m).collect();
                (key.clone(), list.join(","))
            })
            .collect()
    }

    /// Whether the renewal task must be started (the first call answers `true`).
    pub(super) fn start_renewing(&self) -> bool {
        !self.renewing.swap(true, Ordering::AcqRel)
    }

    /// The renewal task could not start (no runtime): the next grant tries again.
    pub(super) fn renewing_stopped(&self) {
        self.renewing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_takes_a_member_of_its_units_and_nothing_outlives_them() {
        let held = Held::default();
        let a = held.member("i", 1);
        let b = held.member("i", 3);
        assert_ne!(a, b, "every request its own member");
        assert_eq!(&*b, "i:1:3");
        held.add(b"k", a.clone(), 1);
        held.add(b"k", b.clone(), 3);
        assert_eq!(held.snapshot(), [(b"k".to_vec(), "i:0:1,i:1:3".to_owned())]);
        assert_eq!(held.take(b"k", 3), Some(b));
        assert_eq!(held.take(b"other", 1), None, "nothing held there");
        assert_eq!(held.take(b"k", 2), Some(a), "no exact match: any");
        assert_eq!(held.take(b"k", 1), None);
        assert!(held.snapshot().is_empty());
        assert!(held.start_renewing() && !held.start_renewing());
        held.renewing_stopped();
        assert!(held.start_renewing());
    }
}
