//! `Regional`: a store whose limits are this region's part of each quota.

use smallvec::SmallVec;

use crate::algo::algorithm::Algorithm;
use crate::base::clock::SharedClock;
use crate::model::key::Key;
use crate::store::ban::{BanCall, BanFuture};
use crate::store::{Checked, Item, Op, Store};

use super::split::share;

/// A store of one region among `n`: each item's quota replaced by the region's part of
/// it ([`share`]) before the inner store (the region's own, a `RedisStore` say) sees it.
/// The region's instances use it as any store; [`Mover`](super::Mover)s move tokens
/// between the regions' buckets. GCRA limits only (a window's count does not move).
///
/// Make the inner `Resilient` store (a `RedisStore`) without its deny cache
/// (`.deny_cache(false)`): a mover's credit lands in the region's store, where a cached
/// denial does not see it, and the instances would refuse locally while their bucket
/// holds the tokens moved in (a region's hot key then passes at its own part's rate).
///
/// ```
/// use tollgate::store::regions::Regional;
/// use tollgate::store::MemoryStore;
/// use tollgate::{LimitSpec, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Region 0 of 2: half of 10 an hour.
/// let store = Regional::new(MemoryStore::new(), 0, 2);
/// let limiter = Limiter::builder(store)
///     .limit(LimitSpec::new("api", Quota::per_hour(10)))
///     .build()
///     .unwrap();
/// let mut granted = 0;
/// for _ in 0..10 {
///     if limiter.check("api", "k", 1).await.unwrap().allowed() {
///         granted += 1;
///     }
/// }
/// assert_eq!(granted, 5);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Regional<S> {
    inner: S,
    index: usize,
    regions: usize,
}

impl<S> Regional<S> {
    /// Region `index` of `regions` over its own store `inner`.
    ///
    /// # Panics
    ///
    /// If `index` is not below `regions`.
    pub fn new(inner: S, index: usize, regions: usize) -> Self {
        assert!(index < regions, "region {index} is not one of {regions}");
        Self {
            inner,
            index,
            regions,
        }
    }

    /// The region's own store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// This region's index.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl<S: Store> Store for Regional<S> {
    type Table = S::Table;
    type Future = S::Future;

    fn table(&self, name: &str) -> S::Table {
        self.inner.table(name)
    }

    fn apply(&self, op: Op, items: &[Item<'_, S::Table>]) -> Checked<S::Future> {
        let parts: SmallVec<[Item<'_, S::Table>; 4]> = items
            .iter()
            .map(|i| {
                let mut part = i.on(i.table);
                part.quota = share(i.quota, self.index, self.regions);
                part
            })
            .collect();
        self.inner.apply(op, &parts)
    }

    fn ban(&self, table: &S::Table, key: &Key, call: BanCall) -> Option<BanFuture> {
        self.inner.ban(table, key, call)
    }

    fn ban_clock(&self) -> SharedClock {
        self.inner.ban_clock()
    }

    fn supports(&self, algorithm: &Algorithm) -> Result<(), &'static str> {
        match algorithm {
            Algorithm::Gcra => self.inner.supports(algorithm),
            _ => Err(
                "a limit across regions is a GCRA limit (tokens move between regions; a window's count does not)",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::quota::Quota;
    use crate::store::MemoryStore;

    #[test]
    fn each_region_spends_its_part() {
        let q = Quota::per_hour(10).burst(7);
        for (index, part) in [(0, 4), (1, 3)] {
            let store = Regional::new(MemoryStore::new(), index, 2);
            assert_eq!(store.index(), index);
            let table = store.table("api");
            let item = Item::new(&table, Key::from_part("k"), q, 1);
            let mut granted = 0;
            for _ in 0..10 {
                let Checked::Ready(s) = store.check(std::slice::from_ref(&item)) else {
                    unreachable!()
                };
                granted += u32::from(s[0].outcome().unwrap().is_allowed());
            }
            assert_eq!(granted, part);
        }
    }

    #[test]
    fn only_gcra_limits_split() {
        let store = Regional::new(MemoryStore::new(), 1, 3);
        assert!(store.supports(&Algorithm::Gcra).is_ok());
        assert!(store.supports(&Algorithm::SlidingWindow).is_err());
        let _ = store.inner();
    }

    /// A store that shares bans, as Redis does: it answers each ban call, and keeps what
    /// it was asked.
    #[derive(Clone, Default)]
    struct Banning(MemoryStore, std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl Store for Banning {
        type Table = <MemoryStore as Store>::Table;
        type Future = <MemoryStore as Store>::Future;

        fn table(&self, name: &str) -> Self::Table {
            self.0.table(name)
        }

        fn apply(&self, op: Op, items: &[Item<'_, Self::Table>]) -> Checked<Self::Future> {
            self.0.apply(op, items)
        }

        fn ban(&self, _table: &Self::Table, key: &Key, call: BanCall) -> Option<BanFuture> {
            self.1.lock().unwrap().push(format!("{key} {call:?}"));
            Some(Box::pin(async {
                Ok(crate::store::ban::BanReply::new(None, false, 0))
            }))
        }
    }

    /// Bans are the region's own store's: a limit that bans across regions shares its
    /// bans through the local region (what it cannot share, it keeps locally, as ever).
    #[test]
    fn bans_go_to_the_regions_own_store() {
        let inner = Banning::default();
        let store = Regional::new(inner.clone(), 0, 2);
        let table = store.table("login");
        let key = Key::from_part("mallory");
        let asked = store.ban(&table, &key, BanCall::Lift);
        assert!(
            asked.is_some(),
            "the ban call reached a store that shares bans"
        );
        assert_eq!(inner.1.lock().unwrap().len(), 1);
        // A store that keeps bans locally (memory) says so through the region too.
        let local = Regional::new(MemoryStore::new(), 0, 2);
        let table = local.table("login");
        assert!(local.ban(&table, &key, BanCall::Lift).is_none());
    }

    #[test]
    #[should_panic(expected = "region 2 is not one of 2")]
    fn the_index_is_one_of_the_regions() {
        let _ = Regional::new(MemoryStore::new(), 2, 2);
    }
}
