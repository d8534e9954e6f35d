//! The mover: one per region (elected), moving unspent quota to where it is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::algo::quota::Quota;
use crate::model::key::Key;
use crate::observe::probe::RegionMetrics;
use crate::store::StoreError;

use super::escrow::{Demand, Escrow, Transfer, TransferId};
use super::split::{max_move, share};

/// How long a mover's lead lasts unless renewed: three intervals beyond its longest tick.
const LEAD_INTERVALS: u32 = 3;

/// The most calls to its own region's store one tick of a mover makes (the lead, the
/// outstanding transfer, the demand, a debit, a settle), each within an interval.
const LOCAL_CALLS: u32 = 5;

/// The settings of the movers of a set of regions: their interval, the link's delay each
/// way (which sizes a transfer, see [`max_move`]), the floor a region keeps.
#[derive(Clone, Debug)]
#[must_use]
pub struct MoverSettings {
    interval: Duration,
    link_delay: Duration,
    floor: f64,
}

impl Default for MoverSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            link_delay: Duration::from_millis(50),
            floor: 0.1,
        }
    }
}

impl MoverSettings {
    /// The defaults: a move every 100 ms at most, a link of 50 ms each way, a floor of
    /// a tenth of each region's burst.
    pub fn new() -> Self {
        Self::default()
    }

    /// How often a mover looks at the demand and moves (default 100 ms; at least 1 ms).
    pub fn interval(mut self, every: Duration) -> Self {
        self.interval = every.max(Duration::from_millis(1));
        self
    }

    /// The link's delay each way between two regions (default 50 ms): a transfer moves
    /// up to `⌈r · (interval + 2 × delay)⌉` tokens, and a call over the link is given up
    /// after `interval + 4 × delay`: two round trips (a look at a Redis region's demand is
    /// a `SCAN` and a script) and an interval.
    pub fn link_delay(mut self, one_way: Duration) -> Self {
        self.link_delay = one_way;
        self
    }

    /// The part of its burst a region keeps whatever the demand elsewhere (default 0.1;
    /// clamped to 0..=1).
    pub fn floor(mut self, part: f64) -> Self {
        self.floor = if part.is_nan() {
            0.0
        } else {
            part.clamp(0.0, 1.0)
        };
        self
    }

    /// The interval.
    pub fn every(&self) -> Duration {
        self.interval
    }

    /// The link's delay each way.
    pub fn delay(&self) -> Duration {
        self.link_delay
    }

    /// The most tokens one transfer of a limit of `quota` moves: [`max_move`].
    pub fn max_move(&self, quota: Quota) -> u64 {
        max_move(quota, self.interval, self.link_delay)
    }

    fn floor_of(&self, quota: Quota) -> u64 {
        (quota.burst_size() as f64 * self.floor).ceil() as u64
    }

    /// How long a call over the link may take: an interval and two round trips (a Redis
    /// region's demand is a `SCAN`, then a script). With one round trip only, a link whose
    /// round trip is longer than an interval (80 ms each way, every 100 ms) failed every
    /// look at a Redis region's demand: nothing moved, and the region read as unreachable.
    fn remote_timeout(&self) -> Duration {
        self.interval + self.link_delay * 4
    }

    /// How long a lead lasts unless renewed, for `n` regions: its holder renews it once a
    /// tick, and a tick waits on its own store's calls and on a call over the link to
    /// each other region and a credit at most, every one of which may time out in a
    /// partition; three intervals more. A lead shorter than that passed from mover to
    /// mover in every partition.
    fn lead_ttl(&self, n: usize) -> Duration {
        let remote = u32::try_from(n).unwrap_or(u32::MAX);
        self.interval * (LOCAL_CALLS + LEAD_INTERVALS) + self.remote_timeout() * remote
    }
}

/// What a mover did, as counters and gauges (read them with [`MoverStats::report`]).
#[derive(Debug, Default)]
pub struct MoverStats {
    moved: AtomicU64,
    transfers: AtomicU64,
    in_flight: AtomicU64,
    lag_ns: AtomicU64,
    unreachable: AtomicU64,
    failures: AtomicU64,
    held: AtomicU64,
    spent: AtomicU64,
    refused: AtomicU64,
    leading: AtomicU64,
}

/// A copy of a mover's [`MoverStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MoverReport {
    /// Tokens moved out of this region and credited elsewhere by this mover, in all: a
    /// transfer is counted by the mover whose credit is answered (a mover that took it
    /// over from a leader killed before its answer came counts it; one whose settle
    /// failed after its credit was answered, rarely, leaves it to be counted again).
    pub moved: u64,
    /// Transfers completed, in all (counted as `moved`).
    pub transfers: u64,
    /// Tokens debited here and not yet credited (0 or one transfer's), while this mover
    /// leads (0 while it does not: the region's store keeps the transfer).
    pub in_flight: u64,
    /// How long the transfer in flight has been on its way since this mover started it or
    /// took it over (zero without one).
    pub lag: Duration,
    /// The other regions the last look could not reach: a partition while above 0.
    pub unreachable: u64,
    /// Calls that failed or timed out, in all.
    pub failures: u64,
    /// The tokens this region's buckets with demand held at the last look.
    pub held: u64,
    /// Requests granted in this region over the last whole interval (keys with demand).
    pub spent: u64,
    /// Requests refused in this region lately (keys with demand).
    pub refused: u64,
    /// Whether this mover led its region at its last look.
    pub leading: bool,
}

impl MoverStats {
    /// The counters and gauges now.
    pub fn report(&self) -> MoverReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MoverReport {
            moved: get(&self.moved),
            transfers: get(&self.transfers),
            in_flight: get(&self.in_flight),
            lag: Duration::from_nanos(get(&self.lag_ns)),
            unreachable: get(&self.unreachable),
            failures: get(&self.failures),
            held: get(&self.held),
            spent: get(&self.spent),
            refused: get(&self.refused),
            leading: get(&self.leading) == 1,
        }
    }
}

/// How much a region wants more of a key: its refusals, and what it spent over the last
/// interval beyond what it holds now (a region's instances refuse from their deny cache
/// without asking their store, so a bucket spent as fast as it refills shows few
/// refusals; it shows grants and an empty bucket).
fn need(d: &Demand) -> u64 {
    d.refused + d.granted.saturating_sub(d.remaining)
}

/// A transfer debited (or being debited) and not yet credited: this mover's copy of its
/// region's outstanding transfer, which the region's store keeps.
#[derive(Clone, Debug)]
struct Pending {
    id: TransferId,
    table: String,
    key: Key,
    quota: Quota,
    to: usize,
    most: u64,
    keep: u64,
    /// The amount debited once the debit answered.
    debited: Option<u64>,
    since: tokio::time::Instant,
}

/// One region's mover: every interval, if it leads its region, it finishes its transfer
/// in flight (the same id until it is credited: a partition delays it, never doubles it),
/// else looks at the demand of every region for each limit and moves up to
/// [`max_move`] tokens of one key from this region, where it is not wanted, to the
/// region wanting it most (its refusals, and its grants over the last interval beyond
/// what its bucket holds now): a debit here first, then a credit there, under one
/// [`TransferId`]. It keeps this region's floor and the tokens its own demand spent over
/// the last interval, and credits no more than the destination's bucket lacks.
///
/// One transfer in flight at most, whatever the link does: the tokens out of every bucket
/// at once are at most `n ×` [`max_move`], the movers' term of [`bound`](super::bound).
pub struct Mover {
    index: usize,
    regions: Vec<Arc<dyn Escrow>>,
    limits: Vec<(String, Quota)>,
    settings: MoverSettings,
    holder: String,
    epoch: u64,
    seq: u64,
    pending: Option<Pending>,
    stats: Arc<MoverStats>,
    /// Registered at the first tick (labelled with the index) unless named before.
    metrics: Option<RegionMetrics>,
}

impl std::fmt::Debug for Mover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mover")
            .field("index", &self.index)
            .field("regions", &self.regions.len())
            .field("limits", &self.limits)
            .field("settings", &self.settings)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

impl Mover {
    /// The mover of region `index` of `regions` (each region's store as this mover
    /// reaches it: its own directly, the others over the link), for `limits` (each
    /// limit's name and global quota), named `holder` in its region's election and
    /// numbering its transfers from `epoch` (make it unique per mover's life: the time it
    /// started, or a random number).
    ///
    /// # Panics
    ///
    /// If `index` is not one of the regions.
    pub fn new(
        index: usize,
        regions: Vec<Arc<dyn Escrow>>,
        limits: Vec<(String, Quota)>,
        settings: MoverSettings,
        holder: impl Into<String>,
        epoch: u64,
    ) -> Self {
        assert!(
            index < regions.len(),
            "the mover's region is one of the regions"
        );
        Self {
            index,
            regions,
            limits,
            settings,
            holder: holder.into(),
            epoch,
            seq: 0,
            pending: None,
            stats: Arc::default(),
            metrics: None,
        }
    }

    /// Names the mover's region in its metrics (feature `metrics`: the `region` label of
    /// `tollgate_region_*`; its index unless named).
    pub fn region(mut self, name: &str) -> Self {
        self.metrics = Some(RegionMetrics::new(name));
        self
    }

    /// Its counters and gauges, shared (for metrics).
    pub fn stats(&self) -> Arc<MoverStats> {
        Arc::clone(&self.stats)
    }

    /// Ticks every interval, forever (spawn it; drop the task to stop it).
    pub async fn run(mut self) {
        let mut every = tokio::time::interval(self.settings.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.tick().await;
        }
    }

    /// One look and at most one transfer (what [`run`](Self::run) does each interval).
    pub async fn tick(&mut self) {
        let ttl = self.settings.lead_ttl(self.regions.len());
        let local = Arc::clone(&self.regions[self.index]);
        let leading = self
            .call(local.lead(&self.holder, ttl), self.settings.interval)
            .await
            .unwrap_or(false);
        self.stats
            .leading
            .store(u64::from(leading), Ordering::Relaxed);
        if !leading {
            // The region's store keeps its outstanding transfer: whoever leads finishes it.
            self.pending = None;
            self.stats.in_flight.store(0, Ordering::Relaxed);
            self.stats.lag_ns.store(0, Ordering::Relaxed);
            return;
        }
        if !self.finish().await {
            self.record();
            return;
        }
        let limits = self.limits.clone();
        for (table, global) in &limits {
            if self.move_one(table, *global).await {
                break;
            }
        }
        self.record();
    }

    fn record(&mut self) {
        let index = self.index;
        let metrics = self
            .metrics
            .get_or_insert_with(|| RegionMetrics::new(&index.to_string()));
        let r = self.stats.report();
        metrics.record(r.held, r.spent, r.moved, r.lag.as_secs_f64(), r.unreachable);
    }

    async fn call<T>(
        &self,
        future: super::escrow::EscrowFuture<T>,
        timeout: Duration,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(timeout, future).await {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
            Err(_) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                Err(StoreError::new("timed out"))
            }
        }
    }

    /// Carries the region's transfer in flight one step further; `true` once there is
    /// none. The region's store says which one is outstanding: this mover's, or one a
    /// previous leader left (taken over and finished under its id).
    async fn finish(&mut self) -> bool {
        let local = Arc::clone(&self.regions[self.index]);
        match self.call(local.outstanding(), self.settings.interval).await {
            Err(_) => return false,
            Ok(Some((t, amount))) => {
                if self.pending.as_ref().is_none_or(|p| p.id != t.id) {
                    self.pending = self.take_over(t, amount).await;
                }
            }
            // Settled (here, or by another leader meanwhile): nothing is out. A debit
            // whose answer was lost is sent again (applied once; or nothing, with another
            // transfer outstanding by then).
            Ok(None) => {
                if self.pending.as_ref().is_some_and(|p| p.debited.is_some()) {
                    self.pending = None;
                }
            }
        }
        self.carry().await
    }

    /// Carries this mover's pending transfer (if any) one step further: its debit if it
    /// has not answered, then its credit, then its settle; `true` once there is none.
    async fn carry(&mut self) -> bool {
        let local = Arc::clone(&self.regions[self.index]);
        let Some(mut p) = self.pending.take() else {
            self.stats.in_flight.store(0, Ordering::Relaxed);
            self.stats.lag_ns.store(0, Ordering::Relaxed);
            return true;
        };
        let lag = u64::try_from(p.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.lag_ns.store(lag, Ordering::Relaxed);
        if p.debited.is_none() {
            let to = u32::try_from(p.to).unwrap_or(u32::MAX);
            let transfer = Transfer::new(p.id, p.table.clone(), p.key.clone(), to);
            let debit = local.debit(&transfer, p.quota, p.most, p.keep);
            match self.call(debit, self.settings.interval).await {
                Ok(0) => {
                    self.stats.lag_ns.store(0, Ordering::Relaxed);
                    return true;
                }
                Ok(n) => p.debited = Some(n),
                Err(_) => {
                    self.pending = Some(p);
                    return false;
                }
            }
        }
        let amount = p.debited.unwrap_or(0);
        self.stats.in_flight.store(amount, Ordering::Relaxed);
        let n = self.regions.len();
        let global = self
            .limits
            .iter()
            .find(|(t, _)| *t == p.table)
            .map(|(_, q)| *q);
        let quota = global.map_or(p.quota, |g| share(g, p.to, n));
        let remote = Arc::clone(&self.regions[p.to]);
        let credit = remote.credit(p.id, &p.table, &p.key, quota, amount);
        match self.call(credit, self.settings.remote_timeout()).await {
            Ok(_) => {
                self.stats.moved.fetch_add(amount, Ordering::Relaxed);
                self.stats.transfers.fetch_add(1, Ordering::Relaxed);
                self.stats.in_flight.store(0, Ordering::Relaxed);
                self.stats.lag_ns.store(0, Ordering::Relaxed);
                // Not settled (an error, a timeout): the next tick finds it outstanding,
                // sends its credit again (applied once) and settles it.
                let _ = self.call(local.settle(p.id), self.settings.interval).await;
                true
            }
            Err(_) => {
                // Its destination is out of reach: a partition until a look says otherwise.
                self.stats.unreachable.fetch_max(1, Ordering::Relaxed);
                self.pending = Some(p);
                false
            }
        }
    }

    /// The outstanding transfer `t` of `amount` tokens a previous leader of this region
    /// left, as this mover's to finish; `None` (and settled, its tokens given up) if it
    /// names a region or a limit this mover does not have.
    async fn take_over(&self, t: Transfer, amount: u64) -> Option<Pending> {
        let n = self.regions.len();
        let to = usize::try_from(t.to)
            .ok()
            .filter(|&to| to < n && to != self.index);
        let global = self.limits.iter().find(|(name, _)| *name == t.table);
        let (Some(to), Some((_, global))) = (to, global) else {
            let local = Arc::clone(&self.regions[self.index]);
            let _ = self.call(local.settle(t.id), self.settings.interval).await;
            return None;
        };
        Some(Pending {
            id: t.id,
            table: t.table,
            key: t.key,
            quota: share(*global, self.index, n),
            to,
            most: amount,
            keep: 0,
            debited: Some(amount),
            since: tokio::time::Instant::now(),
        })
    }

    /// Looks at the demand of `table` everywhere; starts a transfer if one is due
    /// (`true`).
    async fn move_one(&mut self, table: &str, global: Quota) -> bool {
        let n = self.regions.len();
        let mine = share(global, self.index, n);
        let local = Arc::clone(&self.regions[self.index]);
        let Ok(here) = self
            .call(local.demand(table, mine), self.settings.interval)
            .await
        else {
            return false;
        };
        self.stats
            .held
            .store(here.iter().map(|d| d.remaining).sum(), Ordering::Relaxed);
        self.stats
            .spent
            .store(here.iter().map(|d| d.granted).sum(), Ordering::Relaxed);
        self.stats
            .refused
            .store(here.iter().map(|d| d.refused).sum(), Ordering::Relaxed);
        let mut unreachable = 0;
        // The key refused most elsewhere and not refused here.
        let mut best: Option<(usize, Demand)> = None;
        for j in (0..n).filter(|&j| j != self.index) {
            let remote = Arc::clone(&self.regions[j]);
            let theirs = share(global, j, n);
            let Ok(there) = self
                .call(remote.demand(table, theirs), self.settings.remote_timeout())
                .await
            else {
                unreachable += 1;
                continue;
            };
            for d in there {
                let wanted_here = here.iter().any(|h| h.key == d.key && need(h) > 0);
                let room = theirs.burst_size().saturating_sub(d.remaining);
                if need(&d) == 0 || wanted_here || room == 0 {
                    continue;
                }
                if best.as_ref().is_none_or(|(_, b)| need(&d) > need(b)) {
                    best = Some((j, d));
                }
            }
        }
        self.stats.unreachable.store(unreachable, Ordering::Relaxed);
        let Some((to, want)) = best else {
            return false;
        };
        let theirs = share(global, to, n);
        let spent_here = here
            .iter()
            .find(|h| h.key == want.key)
            .map_or(0, |h| h.granted);
        let keep = self.settings.floor_of(mine).saturating_add(spent_here);
        let room = theirs.burst_size().saturating_sub(want.remaining);
        let most = self.settings.max_move(global).min(room);
        self.seq += 1;
        self.pending = Some(Pending {
            id: TransferId {
                region: u32::try_from(self.index).unwrap_or(u32::MAX),
                epoch: self.epoch,
                seq: self.seq,
            },
            table: table.to_owned(),
            key: want.key,
            quota: mine,
            to,
            most,
            keep,
            debited: None,
            since: tokio::time::Instant::now(),
        });
        // Nothing was outstanding at this tick's start (its debit takes nothing if another
        // transfer is outstanding by now).
        self.carry().await;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_read_back_and_size_the_moves() {
        let s = MoverSettings::new()
            .interval(Duration::from_millis(250))
            .link_delay(Duration::from_millis(80))
            .floor(0.5);
        assert_eq!(s.every(), Duration::from_millis(250));
        assert_eq!(s.delay(), Duration::from_millis(80));
        // A call over the link: an interval and two round trips.
        assert_eq!(s.remote_timeout(), Duration::from_millis(570));
        // A lead: eight intervals and a call over the link per region.
        assert_eq!(s.lead_ttl(3), Duration::from_millis(250 * 8 + 570 * 3));
        assert_eq!(s.lead_ttl(1), Duration::from_millis(250 * 8 + 570));
        // ⌈100 · (0.25 + 0.16)⌉
        assert_eq!(s.max_move(Quota::per_second(100)), 41);
        assert_eq!(s.floor_of(Quota::per_second(10).burst(7)), 4);
        assert_eq!(MoverSettings::new().floor(f64::NAN).floor, 0.0);
        assert_eq!(MoverSettings::new().floor(3.0).floor, 1.0);
        assert_eq!(
            MoverSettings::new().interval(Duration::ZERO).every(),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn a_report_copies_the_stats() {
        let stats = MoverStats::default();
        assert!(!stats.report().leading);
        stats.leading.store(1, Ordering::Relaxed);
        stats.moved.store(5, Ordering::Relaxed);
        stats.lag_ns.store(2_000_000, Ordering::Relaxed);
        let r = stats.report();
        assert!(r.leading);
        assert_eq!((r.moved, r.lag), (5, Duration::from_millis(2)));
    }

    #[test]
    fn a_regions_need_is_its_refusals_and_what_it_spent_beyond_what_it_holds() {
        let key = Key::from_part("k");
        assert_eq!(need(&Demand::new(key.clone(), 10, 3, 4)), 9);
        assert_eq!(need(&Demand::new(key.clone(), 2, 0, 4)), 0);
        assert_eq!(need(&Demand::new(key, 0, 2, 0)), 2);
    }

    /// A transfer a previous leader left: finished if this mover has its limit and its
    /// destination; given up (settled, nothing credited) if not, so that it does not hold
    /// the region's transfers back for good.
    #[cfg(feature = "testing")]
    #[tokio::test(start_paused = true)]
    async fn a_transfer_left_for_a_limit_or_a_region_it_does_not_have_is_given_up() {
        use crate::testing::SimBackend;
        let (here, there) = (SimBackend::new(), SimBackend::new());
        let q = Quota::per_second(10);
        let id = |seq| TransferId {
            region: 0,
            epoch: 9,
            seq,
        };
        let mover = || {
            Mover::new(
                0,
                vec![
                    Arc::new(here.clone()) as Arc<dyn Escrow>,
                    Arc::new(there.clone()),
                ],
                vec![("api".to_owned(), q)],
                MoverSettings::new(),
                "m",
                1,
            )
        };
        let k = Key::from_part("k");
        for (seq, table, to) in [(1, "gone", 1), (2, "api", 2), (3, "api", 0)] {
            let left = Transfer::new(id(seq), table, k.clone(), to);
            assert_eq!(here.debit(&left, q, 2, 0).await.unwrap(), 2);
            let mut m = mover();
            m.tick().await;
            assert_eq!(here.outstanding().await.unwrap(), None, "{table} to {to}");
            assert_eq!(m.stats().report().moved, 0);
            assert!(
                there.credit(id(seq), "api", &k, q, 0).await.unwrap(),
                "not sent"
            );
        }
        let left = Transfer::new(id(4), "api", k.clone(), 1);
        assert_eq!(here.debit(&left, q, 2, 0).await.unwrap(), 2);
        let mut m = mover();
        m.tick().await;
        assert_eq!(here.outstanding().await.unwrap(), None);
        let r = m.stats().report();
        assert_eq!((r.moved, r.transfers, r.in_flight), (2, 1, 0));
        assert!(
            !there.credit(id(4), "api", &k, q, 2).await.unwrap(),
            "credited"
        );
    }
}
