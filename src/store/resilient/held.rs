//! In-flight units this instance holds in the backend, by key: what the backend's check
//! granted and no release has given back yet. A release of units held here goes to the
//! backend; one of units not held here was granted locally (the failure policy's share
//! while the backend failed) and goes to the local store. (The backend keeps its own
//! deadlines and renewals: the Redis store's.) Entries exist only while units are held:
//! bounded by the requests in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::lease::LeaseTable;
use crate::model::key::Key;

/// The units held, by the limit's table (its address) and key. (The table's address is
/// stable: every table of a name on a store shares one `LeaseTable`, which lives while a
/// request holds it.)
#[derive(Default)]
pub(super) struct Held {
    map: Mutex<HashMap<(usize, Key), u64>>,
}

fn id(remote: &Arc<LeaseTable>) -> usize {
    Arc::as_ptr(remote) as usize
}

impl Held {
    /// The backend granted `cost` units of `key`.
    pub(super) fn add(&self, remote: &Arc<LeaseTable>, key: &Key, cost: u32) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        *map.entry((id(remote), key.clone())).or_default() += u64::from(cost);
    }

    /// Takes `cost` units of `key` off the table: `true` if they were held in the backend
    /// (the release goes there), `false` if not (they were granted locally).
    pub(super) fn take(&self, remote: &Arc<LeaseTable>, key: &Key, cost: u32) -> bool {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let k = (id(remote), key.clone());
        let Some(units) = map.get_mut(&k) else {
            return false;
        };
        if *units < u64::from(cost) {
            return false;
        }
        *units -= u64::from(cost);
        if *units == 0 {
            map.remove(&k);
        }
        true
    }

    /// Keys with units held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::key::IntoKey;
    use crate::store::resilient::Resilient;
    use crate::store::{Backend, Item, Op, Statuses, Store, StoreError};

    /// A backend that never answers: only its tables matter here.
    #[derive(Clone)]
    struct Never;

    impl Backend for Never {
        type Table = ();
        type Future = std::future::Pending<Result<Statuses, StoreError>>;
        fn table(&self, _: &str) {}
        fn apply(&self, _: Op, _: &[Item<'_, ()>]) -> Self::Future {
            std::future::pending()
        }
    }

    #[test]
    fn units_are_taken_back_only_where_they_were_held() {
        let held = Held::default();
        let store = Resilient::new(Never);
        let table = store.table("a").leases.clone();
        let other = store.table("b").leases.clone();
        held.add(&table, &"k".into_key(), 2);
        assert!(held.take(&table, &"k".into_key(), 1));
        assert!(!held.take(&other, &"k".into_key(), 1), "another limit's");
        assert!(!held.take(&table, &"j".into_key(), 1), "another key's");
        assert!(
            !held.take(&table, &"k".into_key(), 2),
            "more than held: local"
        );
        assert_eq!(held.len(), 1);
        assert!(held.take(&table, &"k".into_key(), 1));
        assert_eq!(held.len(), 0, "no entry outlives its units");
    }
}
