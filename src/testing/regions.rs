//! `SimRegions`: several simulated stores, one per region, a link between them with a
//! delay and partitions, and a mover per region.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::algo::quota::Quota;
use crate::model::key::IntoKey;
use crate::model::key::Key;
use crate::store::regions::{
    Demand, Escrow, EscrowFuture, Ledger, Mover, MoverReport, MoverSettings, MoverStats, Regional,
    Transfer, TransferId, bound, partition_bound, share,
};
use crate::store::{Op, Resilient};

use super::backend::{Call, SimBackend, State};
use super::book::LEDGER_TTL;
use super::clock::TokioClock;

fn demand(s: &mut State, now: u64, table: &str, quota: Quota) -> Vec<Demand> {
    if s.escrow.window == 0 {
        return Vec::new();
    }
    let window = now / s.escrow.window;
    let mut keys = Vec::new();
    s.escrow.book.retain(|(t, key), seen| {
        seen.roll(window);
        let idle = seen.before == (0, 0) && seen.now == (0, 0);
        if t == table && !idle && (seen.before != (0, 0) || seen.now.1 > 0) {
            keys.push((key.clone(), seen.before.0, seen.before.1 + seen.now.1));
        }
        !idle
    });
    keys.into_iter()
        .map(|(key, granted, refused)| {
            let look = s
                .live
                .apply(Op::Check, &[Call::gcra(table, key.clone(), quota, 0)]);
            let remaining = look[0].outcome().map_or(0, |o| o.remaining());
            Demand::new(key, granted, refused, remaining)
        })
        .collect()
}

impl Escrow for SimBackend {
    fn demand(&self, table: &str, quota: Quota) -> EscrowFuture<Vec<Demand>> {
        let table = table.to_owned();
        self.serve(move |s, now| demand(s, now, &table, quota))
    }

    fn debit(&self, transfer: &Transfer, quota: Quota, most: u64, keep: u64) -> EscrowFuture<u64> {
        let transfer = transfer.clone();
        self.serve(move |s, now| {
            let (table, key) = (transfer.table.as_str(), transfer.key.clone());
            let mut ledger = std::mem::replace(&mut s.escrow.ledger, Ledger::new(LEDGER_TTL));
            let taken = ledger.debit(&transfer, now, || {
                let look = s.apply(Op::Check, &[Call::gcra(table, key.clone(), quota, 0)]);
                let remaining = look[0].outcome().map_or(0, |o| o.remaining());
                let take = most.min(remaining.saturating_sub(keep));
                let take = u32::try_from(take).unwrap_or(u32::MAX);
                if take == 0 {
                    return 0;
                }
                let done = s.apply(Op::Check, &[Call::gcra(table, key, quota, take)]);
                if done[0].outcome().is_some_and(|o| o.is_allowed()) {
                    u64::from(take)
                } else {
                    0
                }
            });
            s.escrow.ledger = ledger;
            taken
        })
    }

    fn outstanding(&self) -> EscrowFuture<Option<(Transfer, u64)>> {
        self.serve(|s, now| s.escrow.ledger.outstanding(now))
    }

    fn settle(&self, id: TransferId) -> EscrowFuture<bool> {
        self.serve(move |s, _| s.escrow.ledger.settle(id))
    }

    fn credit(
        &self,
        id: TransferId,
        table: &str,
        key: &Key,
        quota: Quota,
        amount: u64,
    ) -> EscrowFuture<bool> {
        let (table, key) = (table.to_owned(), key.clone());
        self.serve(move |s, now| {
            let mut ledger = std::mem::replace(&mut s.escrow.ledger, Ledger::new(LEDGER_TTL));
            let applied = ledger.credit(id, now, || {
                let cost = u32::try_from(amount).unwrap_or(u32::MAX);
                s.apply(Op::Refund, &[Call::gcra(&table, key, quota, cost)]);
            });
            s.escrow.ledger = ledger;
            applied
        })
    }

    fn lead(&self, holder: &str, ttl: Duration) -> EscrowFuture<bool> {
        let holder = holder.to_owned();
        let ttl = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
        self.serve(move |s, now| match &s.escrow.lead {
            Some((h, until)) if *h != holder && *until > now => false,
            _ => {
                s.escrow.lead = Some((holder, now.saturating_add(ttl)));
                true
            }
        })
    }
}

/// The link between the regions: its delay each way, whether it is cut.
struct Link {
    delay: Duration,
    partitioned: bool,
    calls: u64,
}

/// Another region's store as a mover reaches it: over the link.
struct Linked {
    to: SimBackend,
    link: Arc<Mutex<Link>>,
}

fn lock(link: &Mutex<Link>) -> MutexGuard<'_, Link> {
    link.lock().unwrap_or_else(|e| e.into_inner())
}

impl Linked {
    /// The call travels the link's delay; cut on arrival, it is lost (never applied);
    /// it travels back; cut then, the answer is lost (applied all the same).
    fn over<T: Send + 'static>(
        &self,
        call: impl FnOnce(&SimBackend) -> EscrowFuture<T> + Send + 'static,
    ) -> EscrowFuture<T> {
        let to = self.to.clone();
        let link = Arc::clone(&self.link);
        Box::pin(async move {
            let delay = {
                let mut l = lock(&link);
                l.calls += 1;
                l.delay
            };
            tokio::time::sleep(delay).await;
            if lock(&link).partitioned {
                std::future::pending::<()>().await;
            }
            let answer = call(&to).await;
            tokio::time::sleep(delay).await;
            if lock(&link).partitioned {
                std::future::pending::<()>().await;
            }
            answer
        })
    }
}

impl Escrow for Linked {
    fn demand(&self, table: &str, quota: Quota) -> EscrowFuture<Vec<Demand>> {
        let table = table.to_owned();
        self.over(move |to| to.demand(&table, quota))
    }

    fn debit(&self, transfer: &Transfer, quota: Quota, most: u64, keep: u64) -> EscrowFuture<u64> {
        let transfer = transfer.clone();
        self.over(move |to| to.debit(&transfer, quota, most, keep))
    }

    fn outstanding(&self) -> EscrowFuture<Option<(Transfer, u64)>> {
        self.over(|to| to.outstanding())
    }

    fn settle(&self, id: TransferId) -> EscrowFuture<bool> {
        self.over(move |to| to.settle(id))
    }

    fn credit(
        &self,
        id: TransferId,
        table: &str,
        key: &Key,
        quota: Quota,
        amount: u64,
    ) -> EscrowFuture<bool> {
        let (table, key) = (table.to_owned(), key.clone());
        self.over(move |to| to.credit(id, &table, &key, quota, amount))
    }
}

/// Regions simulated in the test's process: a [`SimBackend`] per region (its own store,
/// with its own faults), a link between them whose delay and partitions the test sets,
/// and the movers of each region (elected through their region's store) carrying unspent
/// quota where it is refused, as `tollgate::store::regions` describes. Instances of a
/// region are [`store`](Self::store)s: a [`Regional`] store (the region's part of each
/// quota) over a `Resilient` one on the region's backend.
///
/// ```
/// use std::time::Duration;
/// use tollgate::testing::SimRegions;
/// use tollgate::{LimitSpec, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let quota = Quota::per_second(100);
/// let regions = SimRegions::builder()
///     .region("eu")
///     .region("us")
///     .link_delay(Duration::from_millis(40))
///     .limit("api", quota)
///     .build();
/// let eu = Limiter::builder(regions.store("eu"))
///     .limit(LimitSpec::new("api", quota))
///     .build()
///     .unwrap();
///
/// // All the demand is in eu: its half first, then what the mover brings from us.
/// let mut granted = 0;
/// for _ in 0..2000 {
///     if eu.check("api", "k", 1).await.unwrap().allowed() {
///         granted += 1;
///     }
///     tokio::time::sleep(Duration::from_millis(5)).await; // 200 a second
/// }
/// // 10 s at 100 a second: far more than eu's own 50 a second.
/// assert!(granted > 850, "{granted}");
/// assert!(regions.report("us").moved > 0);
/// # }
/// ```
pub struct SimRegions {
    clock: TokioClock,
    names: Vec<String>,
    backends: Vec<SimBackend>,
    link: Arc<Mutex<Link>>,
    settings: MoverSettings,
    movers: Vec<Vec<(Arc<MoverStats>, tokio::task::JoinHandle<()>)>>,
}

/// The settings of [`SimRegions`]: [`SimRegions::builder`].
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct SimRegionsBuilder {
    names: Vec<String>,
    latency: Option<Duration>,
    link_delay: Option<Duration>,
    settings: Option<MoverSettings>,
    limits: Vec<(String, Quota)>,
    movers: usize,
    clock: Option<TokioClock>,
}

impl SimRegionsBuilder {
    /// Adds a region named `name` (in order: the first is index 0).
    pub fn region(mut self, name: impl Into<String>) -> Self {
        self.names.push(name.into());
        self
    }

    /// The latency each way between a region's instances and its store (default 200 µs).
    pub fn latency(mut self, one_way: Duration) -> Self {
        self.latency = Some(one_way);
        self
    }

    /// The link's delay each way between two regions (default 50 ms); the movers' setting
    /// too unless [`movers`](Self::movers) says otherwise.
    pub fn link_delay(mut self, one_way: Duration) -> Self {
        self.link_delay = Some(one_way);
        self
    }

    /// The movers' settings (default: [`MoverSettings::new`] with the link's delay).
    pub fn movers(mut self, settings: MoverSettings) -> Self {
        self.settings = Some(settings);
        self
    }

    /// How many movers each region runs (default 1): as many as its instances would,
    /// one of them leading at a time.
    pub fn movers_per_region(mut self, n: usize) -> Self {
        self.movers = n;
        self
    }

    /// A limit the movers move tokens of, by name and global quota.
    pub fn limit(mut self, name: impl Into<String>, quota: Quota) -> Self {
        self.limits.push((name.into(), quota));
        self
    }

    /// The clock (default: a [`TokioClock`] made by [`build`](Self::build)).
    pub fn clock(mut self, clock: TokioClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The regions, the link up, the movers started (spawned: call it inside the runtime).
    ///
    /// # Panics
    ///
    /// Without a region.
    pub fn build(self) -> SimRegions {
        assert!(!self.names.is_empty(), "regions need at least one region");
        let clock = self.clock.unwrap_or_default();
        let delay = self.link_delay.unwrap_or(Duration::from_millis(50));
        let settings = self
            .settings
            .unwrap_or_else(|| MoverSettings::new().link_delay(delay));
        let window = u64::try_from(settings.every().as_nanos()).unwrap_or(u64::MAX);
        let backends: Vec<SimBackend> = self
            .names
            .iter()
            .map(|_| {
                let b = SimBackend::builder().clock(clock);
                let b = match self.latency {
                    Some(l) => b.latency(l),
                    None => b,
                };
                let b = b.build();
                b.state().escrow.window = window;
                b
            })
            .collect();
        let link = Arc::new(Mutex::new(Link {
            delay,
            partitioned: false,
            calls: 0,
        }));
        let movers = (0..backends.len())
            .map(|i| {
                (0..self.movers.max(1))
                    .map(|m| {
                        let escrows: Vec<Arc<dyn Escrow>> = backends
                            .iter()
                            .enumerate()
                            .map(|(j, b)| -> Arc<dyn Escrow> {
                                if i == j {
                                    Arc::new(b.clone())
                                } else {
                                    Arc::new(Linked {
                                        to: b.clone(),
                                        link: Arc::clone(&link),
                                    })
                                }
                            })
                            .collect();
                        let mover = Mover::new(
                            i,
                            escrows,
                            self.limits.clone(),
                            settings.clone(),
                            format!("{}-{m}", self.names[i]),
                            (i as u64) << 32 | m as u64,
                        )
                        .region(&self.names[i]);
                        (mover.stats(), tokio::spawn(mover.run()))
                    })
                    .collect()
            })
            .collect();
        SimRegions {
            clock,
            names: self.names,
            backends,
            link,
            settings,
            movers,
        }
    }
}

impl SimRegions {
    /// The settings: regions, link, movers, limits.
    pub fn builder() -> SimRegionsBuilder {
        SimRegionsBuilder::default()
    }

    fn index(&self, region: &str) -> usize {
        self.names
            .iter()
            .position(|n| n == region)
            .unwrap_or_else(|| panic!("no region {region:?}: {:?}", self.names))
    }

    /// The clock every region reads.
    pub fn clock(&self) -> &TokioClock {
        &self.clock
    }

    /// The regions' names, in order.
    pub fn regions(&self) -> &[String] {
        &self.names
    }

    /// Region `region`'s store (to make it fail, go silent, lose its state...).
    ///
    /// # Panics
    ///
    /// If there is no such region.
    pub fn backend(&self, region: &str) -> &SimBackend {
        &self.backends[self.index(region)]
    }

    /// A new instance of `region`: its part of each quota, over its region's store.
    /// Its `Resilient` store runs without a deny cache: a mover's credit lands in the
    /// region's store, where a cached denial would not see it.
    ///
    /// # Panics
    ///
    /// If there is no such region.
    pub fn store(&self, region: &str) -> Regional<Resilient<SimBackend>> {
        let i = self.index(region);
        Regional::new(
            self.backends[i].store().deny_cache(false),
            i,
            self.names.len(),
        )
    }

    /// Cuts the link between every two regions (`true`) or heals it: a call over the link
    /// arriving while it is cut is lost, an answer coming back is lost.
    pub fn partition(&self, on: bool) {
        lock(&self.link).partitioned = on;
    }

    /// Sets the link's delay each way from now on (the movers' setting stays).
    pub fn set_link_delay(&self, one_way: Duration) {
        lock(&self.link).delay = one_way;
    }

    /// What the leading mover of `region` did (the first mover's if none leads).
    ///
    /// # Panics
    ///
    /// If there is no such region.
    pub fn report(&self, region: &str) -> MoverReport {
        let reports: Vec<MoverReport> = self.movers[self.index(region)]
            .iter()
            .map(|(s, _)| s.report())
            .collect();
        let moved = reports.iter().map(|r| r.moved).sum();
        let transfers = reports.iter().map(|r| r.transfers).sum();
        let mut report = reports
            .iter()
            .find(|r| r.leading)
            .or(reports.first())
            .copied()
            .unwrap_or_default();
        report.moved = moved;
        report.transfers = transfers;
        report
    }

    /// Kills the leading mover of `region` (its task aborted, as `kill -9` would: a
    /// transfer it had in flight stays outstanding in the region's store, for the mover
    /// that leads next); `false` if none leads.
    ///
    /// # Panics
    ///
    /// If there is no such region.
    pub fn kill_leader(&mut self, region: &str) -> bool {
        let i = self.index(region);
        let movers = &mut self.movers[i];
        let Some(at) = movers.iter().position(|(s, _)| s.report().leading) else {
            return false;
        };
        let (_, task) = movers.remove(at);
        task.abort();
        true
    }

    /// The tokens each region's bucket `key` of `limit` holds now under its part of
    /// `quota` (the global one), in the regions' order.
    pub fn held(&self, limit: &str, key: impl IntoKey, quota: Quota) -> Vec<u64> {
        let key = key.into_key();
        let n = self.names.len();
        self.backends
            .iter()
            .enumerate()
            .map(|(i, b)| b.remaining(limit, key.clone(), share(quota, i, n)))
            .collect()
    }

    /// Calls over the link so far (the movers' traffic between regions).
    pub fn link_calls(&self) -> u64 {
        lock(&self.link).calls
    }

    /// The movers' calls that reached a region's store so far (their own and the others').
    pub fn mover_calls(&self) -> u64 {
        self.backends.iter().map(|b| b.state().escrow.calls).sum()
    }

    /// [`bound`] for these regions and movers: the most a limit of `quota` grants over
    /// `window`, all regions together.
    pub fn bound(&self, quota: Quota, window: Duration) -> u64 {
        bound(
            quota,
            self.names.len(),
            self.settings.max_move(quota),
            window,
        )
    }

    /// [`partition_bound`]: the most it grants over a window inside a partition.
    pub fn partition_bound(&self, quota: Quota, window: Duration) -> u64 {
        partition_bound(quota, self.names.len(), window)
    }
}

impl Drop for SimRegions {
    fn drop(&mut self) {
        for (_, task) in self.movers.iter().flatten() {
            task.abort();
        }
    }
}

impl fmt::Debug for SimRegions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimRegions")
            .field("regions", &self.names)
            .field("settings", &self.settings)
            .field("partitioned", &lock(&self.link).partitioned)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Limiter;
    use crate::model::spec::LimitSpec;
    use crate::store::{Checked, Item, Store};

    const Q: Quota = Quota::per_second(10);

    fn id(seq: u64) -> TransferId {
        TransferId {
            region: 0,
            epoch: 1,
            seq,
        }
    }

    fn t(seq: u64) -> Transfer {
        Transfer::new(id(seq), "api", Key::from_part("k"), 1)
    }

    #[tokio::test(start_paused = true)]
    async fn a_debit_and_a_credit_sent_again_change_nothing_more() {
        let b = SimBackend::new();
        let k = Key::from_part("k");
        assert_eq!(b.debit(&t(1), Q, 4, 0).await.unwrap(), 4);
        assert_eq!(b.debit(&t(1), Q, 4, 0).await.unwrap(), 4);
        assert_eq!(b.remaining("api", "k", Q), 6);
        // Another transfer waits for the outstanding one to settle.
        assert_eq!(b.outstanding().await.unwrap(), Some((t(1), 4)));
        assert_eq!(b.debit(&t(2), Q, 4, 5).await.unwrap(), 0);
        assert!(b.settle(id(1)).await.unwrap());
        assert_eq!(b.outstanding().await.unwrap(), None);
        // Leaves `keep`: 6 held, 5 kept, 1 taken.
        assert_eq!(b.debit(&t(2), Q, 4, 5).await.unwrap(), 1);
        assert!(b.settle(id(2)).await.unwrap());
        assert_eq!(b.debit(&t(3), Q, 4, 5).await.unwrap(), 0);
        assert!(b.credit(id(1), "api", &k, Q, 3).await.unwrap());
        assert!(!b.credit(id(1), "api", &k, Q, 3).await.unwrap());
        assert_eq!(b.remaining("api", "k", Q), 8);
        assert_eq!(b.state().escrow.calls, 11);
    }

    /// What a region's store tells its movers of a limit: the keys of that limit alone
    /// that were granted over the last whole window or refused since it began, with the
    /// tokens they hold; a key granted only in the window under way is not wanted yet, a
    /// look (cost 0) is no demand, and a key idle for a whole window is forgotten.
    #[tokio::test(start_paused = true)]
    async fn the_demand_read_is_one_limits_keys_active_lately_and_forgets_idle_ones() {
        let b = SimBackend::new();
        let window = Duration::from_millis(100);
        b.state().escrow.window = window.as_nanos() as u64;
        let store = b.store();
        let (api, other) = (store.table("api"), store.table("other"));
        let q = Quota::per_hour(2);
        let checks = [
            (&api, "granted", 2, 1),
            (&api, "refused", 3, 1),
            (&api, "looked at", 3, 0),
            (&other, "x", 3, 1),
        ];
        for (table, key, n, cost) in checks {
            for _ in 0..n {
                let item = Item::new(table, Key::from_part(key), q, cost);
                if let Checked::Pending(f) = store.apply(Op::Check, &[item]) {
                    f.await;
                }
            }
        }
        let demand = |d: Vec<Demand>| {
            let mut d: Vec<_> = d
                .into_iter()
                .map(|d| (d.key.to_string(), d.granted, d.refused, d.remaining))
                .collect();
            d.sort();
            d
        };
        let now = demand(b.demand("api", q).await.unwrap());
        assert_eq!(now, [("refused".to_owned(), 0, 1, 0)]);
        tokio::time::sleep(window).await;
        let after = demand(b.demand("api", q).await.unwrap());
        assert_eq!(
            after,
            [
                ("granted".to_owned(), 2, 0, 0),
                ("refused".to_owned(), 2, 1, 0)
            ]
        );
        assert_eq!(b.state().escrow.book.len(), 3);
        tokio::time::sleep(2 * window).await;
        assert!(b.demand("api", q).await.unwrap().is_empty());
        assert_eq!(
            b.state().escrow.book.len(),
            0,
            "the idle keys are forgotten"
        );
    }

    /// Regions with no limit, whose movers tick once an hour: only the test's own calls
    /// cross the link. Their stores answer at once.
    fn quiet(link_delay: Duration) -> SimRegions {
        SimRegions::builder()
            .region("eu")
            .region("us")
            .latency(Duration::ZERO)
            .link_delay(link_delay)
            .movers(MoverSettings::new().interval(Duration::from_secs(3600)))
            .build()
    }

    /// Regions eu and us with one limit, `api`, two movers each, 20 ms apart.
    fn two_movers_each(quota: Quota) -> SimRegions {
        SimRegions::builder()
            .region("eu")
            .region("us")
            .movers_per_region(2)
            .link_delay(Duration::from_millis(20))
            .limit("api", quota)
            .build()
    }

    /// A call over the link takes its delay each way (which the test may change), is
    /// counted, and reaches the other region's store once; cut before it arrives it is
    /// lost, cut after it, only its answer is.
    #[tokio::test(start_paused = true)]
    async fn a_call_over_the_link_takes_its_delay_each_way_and_a_cut_loses_it_or_its_answer() {
        let regions = quiet(Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(1)).await;
        let (links, calls) = (regions.link_calls(), regions.mover_calls());
        let us = Linked {
            to: regions.backend("us").clone(),
            link: Arc::clone(&regions.link),
        };
        let k = Key::from_part("k");
        let start = tokio::time::Instant::now();
        assert!(us.credit(id(1), "api", &k, Q, 1).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_millis(40));
        assert_eq!(regions.link_calls(), links + 1);
        assert_eq!(regions.mover_calls(), calls + 1);
        regions.set_link_delay(Duration::from_millis(5));
        let start = tokio::time::Instant::now();
        assert!(!us.credit(id(1), "api", &k, Q, 1).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_millis(10));
        assert_eq!(regions.link_calls(), links + 2);

        // Cut on its way there: never applied, never answered.
        let lost = tokio::spawn(us.credit(id(2), "api", &k, Q, 1));
        tokio::time::sleep(Duration::from_millis(3)).await;
        regions.partition(true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!lost.is_finished());
        regions.partition(false);
        assert!(
            regions
                .backend("us")
                .credit(id(2), "api", &k, Q, 1)
                .await
                .unwrap(),
            "the lost credit was not applied"
        );
        // Cut on its way back: applied, not answered.
        let unanswered = tokio::spawn(us.credit(id(3), "api", &k, Q, 1));
        tokio::time::sleep(Duration::from_millis(7)).await;
        regions.partition(true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!unanswered.is_finished());
        assert!(
            !regions
                .backend("us")
                .credit(id(3), "api", &k, Q, 1)
                .await
                .unwrap(),
            "the credit whose answer was lost was applied"
        );
        lost.abort();
        unanswered.abort();
    }

    /// A region is found by its name, in the order the regions were added: "eu" is the
    /// first, whose part of an odd quota is the larger one.
    #[tokio::test(start_paused = true)]
    async fn a_region_is_found_by_its_name() {
        let regions = quiet(Duration::from_millis(20));
        let q = Quota::per_second(101);
        assert_eq!(regions.held("api", "k", q), [51, 50]);
        let eu = Limiter::builder(regions.store("eu"))
            .limit(LimitSpec::new("api", q))
            .build()
            .unwrap();
        assert!(eu.check("api", "k", 1).await.unwrap().allowed());
        assert_eq!(regions.held("api", "k", q), [50, 50]);
        let eu_part = share(q, 0, 2);
        assert_eq!(regions.backend("eu").remaining("api", "k", eu_part), 50);
    }

    /// The bounds are those of these regions (two) and their movers' setting.
    #[tokio::test(start_paused = true)]
    async fn the_bounds_are_those_of_these_regions_and_movers() {
        let regions = quiet(Duration::from_millis(20));
        let q = Quota::per_second(100).burst(50);
        let second = Duration::from_secs(1);
        // B + r·T + one token per region.
        assert_eq!(regions.partition_bound(q, second), 50 + 100 + 2);
        // And one move per region: r · (Δ + 2d) = 100 × 3,600.1 s (the movers' settings
        // were given: their delay is the default 50 ms, not the link's).
        let m = 360_010;
        assert_eq!(regions.bound(q, second), 50 + 100 + 2 * (m + 1));
    }

    /// Regions dropped stop their movers: their stores see no more calls.
    #[tokio::test(start_paused = true)]
    async fn dropped_regions_stop_their_movers() {
        let regions = SimRegions::builder()
            .region("eu")
            .region("us")
            .limit("api", Q)
            .build();
        let eu = regions.backend("eu").clone();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let calls = eu.state().escrow.calls;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            eu.state().escrow.calls > calls,
            "the movers call while they run"
        );
        drop(regions);
        tokio::task::yield_now().await;
        let calls = eu.state().escrow.calls;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(eu.state().escrow.calls, calls);
    }

    /// The instances reach their region's store the latency away each way, and every
    /// region reads the clock given.
    #[tokio::test(start_paused = true)]
    async fn the_builder_sets_the_latency_and_the_clock() {
        let clock = TokioClock::new();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let regions = SimRegions::builder()
            .region("eu")
            .region("us")
            .latency(Duration::from_millis(10))
            .clock(clock)
            .build();
        // Made 5 s ago: it reads 1,005 s where a new one reads 1,000 s.
        let now = crate::base::clock::Clock::now(regions.clock());
        assert_eq!(now, 1_005_000_000_000);
        let eu = Limiter::builder(regions.store("eu"))
            .limit(LimitSpec::new("api", Q))
            .build()
            .unwrap();
        let start = tokio::time::Instant::now();
        assert!(eu.check("api", "k", 1).await.unwrap().allowed());
        assert_eq!(start.elapsed(), Duration::from_millis(20));
    }

    #[tokio::test(start_paused = true)]
    async fn one_mover_leads_a_region_until_its_lead_lapses() {
        // A store answering at once: the lead lapses `ttl` after it was last taken.
        let b = SimBackend::builder().latency(Duration::ZERO).build();
        let ttl = Duration::from_millis(300);
        assert!(b.lead("a", ttl).await.unwrap());
        assert!(!b.lead("b", ttl).await.unwrap());
        assert!(b.lead("a", ttl).await.unwrap());
        tokio::time::sleep(ttl - Duration::from_millis(1)).await;
        assert!(!b.lead("b", ttl).await.unwrap(), "until it lapses");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(b.lead("b", ttl).await.unwrap());

        let regions = SimRegions::builder()
            .region("eu")
            .region("us")
            .movers_per_region(3)
            .limit("api", Q)
            .build();
        tokio::time::sleep(Duration::from_secs(1)).await;
        for movers in &regions.movers {
            let leading = movers.iter().filter(|(s, _)| s.report().leading).count();
            assert_eq!(leading, 1);
        }
        assert!(regions.report("eu").leading);
        assert_eq!(regions.regions(), ["eu", "us"]);
    }

    /// eu spends its part of `quota` of key "k" and asks for more; as soon as us's mover
    /// has debited a transfer to eu, the link is cut.
    async fn cut_mid_transfer(regions: &SimRegions, quota: Quota) {
        let eu = Limiter::builder(regions.store("eu"))
            .limit(LimitSpec::new("api", quota))
            .build()
            .unwrap();
        for _ in 0..60 {
            eu.check("api", "k", 1).await.unwrap();
        }
        for _ in 0..400 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            eu.check("api", "k", 1).await.unwrap();
            if regions.report("us").in_flight > 0 {
                regions.partition(true);
                return;
            }
        }
        panic!("no transfer was on its way");
    }

    #[tokio::test(start_paused = true)]
    async fn a_transfer_cut_by_a_partition_lands_once_after_it() {
        let quota = Quota::per_second(100);
        let regions = SimRegions::builder()
            .region("eu")
            .region("us")
            .link_delay(Duration::from_millis(20))
            .limit("api", quota)
            .build();
        cut_mid_transfer(&regions, quota).await;
        let in_flight = regions.report("us").in_flight;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let during = regions.report("us");
        assert_eq!(
            during.in_flight, in_flight,
            "the same transfer, not another"
        );
        assert!(during.lag >= Duration::from_secs(1));
        assert_eq!(during.unreachable, 1, "a partition");
        assert!(during.failures > 0);
        let moved = during.moved;
        regions.partition(false);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = regions.report("us");
        assert!(after.moved >= moved + in_flight);
        assert_eq!(after.lag, Duration::ZERO);
        assert_eq!(after.unreachable, 0);
        assert!(regions.link_calls() > 0 && regions.mover_calls() > 0);
        assert!(format!("{regions:?}").contains("partitioned: false"));
    }

    /// The bug: a mover that lost its region's lead mid-transfer (killed, stopped, or only
    /// slow to renew through a partition) took its transfer with it. The debited tokens
    /// never reached their destination, and the next leader started transfers of its
    /// own while that one could still land: two transfers out of one region, beyond the
    /// bound's one per region.
    #[tokio::test(start_paused = true)]
    async fn a_leader_killed_mid_transfer_leaves_it_to_the_next_one_which_lands_it_once() {
        let quota = Quota::per_second(100);
        let mut regions = two_movers_each(quota);
        cut_mid_transfer(&regions, quota).await;
        let us = regions.backend("us").clone();
        let (transfer, amount) = us.outstanding().await.unwrap().expect("outstanding");
        assert_eq!(regions.report("us").in_flight, amount);
        let moved = regions.report("us").moved;

        assert!(regions.kill_leader("us"));
        assert!(
            !regions.kill_leader("us"),
            "none leads until its lead lapses"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        let next = regions.report("us");
        assert!(next.leading, "the other mover leads");
        assert_eq!(next.in_flight, amount, "it took the transfer over");
        assert_eq!(next.unreachable, 1, "through the partition");
        // And started no other: the region's store holds the same one.
        assert_eq!(
            us.outstanding().await.unwrap(),
            Some((transfer.clone(), amount))
        );

        regions.partition(false);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = regions.report("us");
        assert!(after.moved >= moved + amount, "{after:?}");
        assert_ne!(
            us.outstanding().await.unwrap().map(|(t, _)| t.id),
            Some(transfer.id),
            "settled"
        );
        // Its credit landed in eu: sent again, it is not applied again.
        let eu_store = regions.backend("eu").clone();
        let key = Key::from_part("k");
        assert!(
            !eu_store
                .credit(transfer.id, "api", &key, share(quota, 0, 2), amount)
                .await
                .unwrap()
        );
    }

    /// A region's movers number their transfers apart: the mover that leads after its
    /// leader was killed lands transfers of its own, each credited once in eu (under an
    /// id the killed one did not use).
    #[tokio::test(start_paused = true)]
    async fn the_next_leader_numbers_its_transfers_apart_from_the_killed_ones() {
        let quota = Quota::per_second(100);
        let mut regions = two_movers_each(quota);
        let eu = Limiter::builder(regions.store("eu"))
            .limit(LimitSpec::new("api", quota))
            .build()
            .unwrap();
        // eu asks for 200 a second, twice its half.
        let spend = async |seconds: u64| {
            for _ in 0..seconds * 200 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                eu.check("api", "k", 1).await.unwrap();
            }
        };
        spend(2).await;
        let before = regions.report("us").transfers;
        assert!(before > 0);
        assert!(regions.kill_leader("us"));
        spend(5).await;
        let after = regions.report("us");
        assert!(after.leading && after.transfers > 0, "{after:?}");
        let credited = regions.backend("eu").state().escrow.ledger.len() as u64;
        assert_eq!(credited, before + after.transfers);
    }
}
