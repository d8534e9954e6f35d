//! In-flight limits' units: counted when the backend grants them (see `held.rs`), and
//! released where they were taken (the backend, or the local store if the failure
//! policy granted them).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use smallvec::SmallVec;

use super::{Part, Resilient, ResilientTable, refuses};
use crate::model::decision::Status;
use crate::store::{Backend, Checked, Item, Op, Statuses, Store};

/// A pending answer for `others` (indices into `statuses`) merged into the statuses
/// already known.
fn pending_merged<F>(
    pending: Checked<F>,
    mut statuses: Statuses,
    others: SmallVec<[usize; 4]>,
) -> Checked<Pin<Box<dyn Future<Output = Statuses> + Send>>>
where
    F: Future<Output = Statuses> + Send + 'static,
{
    match pending {
        Checked::Ready(s) => {
            for (&i, s) in others.iter().zip(s) {
                statuses[i] = s;
            }
            Checked::Ready(statuses)
        }
        Checked::Pending(future) => Checked::Pending(Box::pin(async move {
            for (&i, s) in others.iter().zip(future.await) {
                statuses[i] = s;
            }
            statuses
        })),
    }
}

impl<B: Backend> Resilient<B> {
    /// In-flight units the backend granted in a check that passed: counted here until
    /// released, so that a release goes where its units were taken.
    pub(super) fn hold_granted(&self, parts: &[Part], statuses: &Statuses) {
        if !parts.iter().any(|p| p.algorithm.is_in_flight()) {
            return;
        }
        if parts.iter().zip(statuses).any(|(p, s)| refuses(s, p.mode)) {
            return; // refused: nothing was taken
        }
        for (p, s) in parts.iter().zip(statuses) {
            if p.algorithm.is_in_flight()
                && p.cost > 0
                && matches!(s, Status::Checked(o) if o.is_allowed())
            {
                self.inner.held.add(&p.remote, &p.key, p.cost);
            }
        }
    }

    /// Gives in-flight units back (and, in the same call, any other item's cost): units
    /// held in the backend go back there, in the background (a release lost with a
    /// failed call expires with the backend's deadline); units granted here while the
    /// backend failed go back to the local store.
    pub(super) fn release(
        &self,
        items: &[Item<'_, ResilientTable<B::Table>>],
    ) -> Checked<<Self as Store>::Future> {
        let mut statuses = Statuses::from_elem(Status::Unchecked, items.len());
        let mut others: SmallVec<[usize; 4]> = SmallVec::new();
        for (i, item) in items.iter().enumerate() {
            if !item.algorithm.is_in_flight() {
                others.push(i);
                continue;
            }
            let table = &item.table;
            if self.inner.held.take(&table.leases, &item.key, item.cost) {
                let call = table.leases.remote.call(
                    Op::Refund,
                    &item.key,
                    item.quota,
                    item.algorithm,
                    item.cost,
                    Duration::ZERO,
                );
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let timeout = self.call_timeout();
                    runtime.spawn(async move {
                        let _ = tokio::time::timeout(timeout, call).await;
                    });
                }
            } else {
                let local = Item::new(&table.fallback, item.key.clone(), item.quota, item.cost)
                    .algorithm(item.algorithm);
                if let Checked::Ready(s) = self.inner.fallback.apply(Op::Refund, &[local]) {
                    statuses[i] = s[0];
                }
            }
        }
        if others.is_empty() {
            return Checked::Ready(statuses);
        }
        let rest: SmallVec<[Item<'_, ResilientTable<B::Table>>; 4]> = others
            .iter()
            .map(|&i| items[i].on(items[i].table))
            .collect();
        match self.apply(Op::Refund, &rest) {
            Checked::Ready(s) => {
                for (&i, s) in others.iter().zip(s) {
                    statuses[i] = s;
                }
                Checked::Ready(statuses)
            }
            // The other items' answer: the in-flight ones went their own way.
            pending => pending_merged(pending, statuses, others),
        }
    }
}

#[cfg(test)]
#[cfg(feature = "testing")]
mod tests {
    use std::time::Duration;

    use crate::algo::algorithm::Algorithm;
    use crate::algo::quota::Quota;
    use crate::model::decision::Status;
    use crate::model::key::Key;
    use crate::store::resilient::{Resilient, ResilientTable};
    use crate::store::{Checked, Item, Op, Store};
    use crate::testing::SimBackend;

    /// An instance and its tables: the in-flight limit "jobs" (2 units), a rate limit.
    struct Instance {
        store: Resilient<SimBackend>,
        jobs: ResilientTable<String>,
        api: ResilientTable<String>,
    }

    impl Instance {
        fn new(store: Resilient<SimBackend>) -> Self {
            let (jobs, api) = (store.table("jobs"), store.table("api"));
            Instance { store, jobs, api }
        }

        /// The answer to `op` on "jobs" of key `k` at `cost`, with the rate limit's item
        /// beside it when `rate`.
        async fn jobs(&self, op: Op, cost: u32, rate: bool) -> Status {
            let mut items = vec![
                Item::new(&self.jobs, Key::from_part("k"), Quota::per_second(2), cost)
                    .algorithm(Algorithm::in_flight()),
            ];
            if rate {
                items.push(Item::new(
                    &self.api,
                    Key::from_part("k"),
                    Quota::per_second(100),
                    1,
                ));
            }
            let statuses = match self.store.apply(op, &items) {
                Checked::Ready(s) => s,
                Checked::Pending(f) => f.await,
            };
            statuses[0]
        }

        fn held(&self) -> usize {
            self.store.inner.held.len()
        }
    }

    fn allowed(s: Status) -> bool {
        matches!(s, Status::Checked(o) if o.is_allowed())
    }

    /// Units the shared store granted are counted as held here (those of the in-flight
    /// limit only, and only units taken), so that their release goes back to the shared
    /// store, where another instance can take them.
    #[tokio::test(start_paused = true)]
    async fn units_the_backend_granted_are_released_there_for_other_instances() {
        let backend = SimBackend::builder().instances(2).build();
        let mut stores = backend.stores().into_iter().map(Instance::new);
        let (a, b) = (stores.next().unwrap(), stores.next().unwrap());
        // A look (cost 0) takes nothing and holds nothing.
        assert!(allowed(a.jobs(Op::Check, 0, false).await));
        assert_eq!(a.held(), 0, "a look holds nothing");
        assert!(allowed(a.jobs(Op::Check, 2, true).await));
        assert_eq!(
            a.held(),
            1,
            "the in-flight limit's key, not the rate limit's"
        );
        assert!(
            !allowed(b.jobs(Op::Check, 1, false).await),
            "both units held"
        );
        // A refused check holds nothing.
        assert!(!allowed(a.jobs(Op::Check, 1, false).await));
        assert_eq!(a.held(), 1);
        a.jobs(Op::Refund, 2, false).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(a.held(), 0, "released: nothing held any more");
        assert!(
            allowed(b.jobs(Op::Check, 2, false).await),
            "the release reached the shared store"
        );
    }
}
