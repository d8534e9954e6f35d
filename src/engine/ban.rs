//! Bans that escalate ([`Ban`]): per banning limit, a bounded, sharded table of the keys it
//! refused (their count within `within`), banned (until when) and banned before (the
//! repeat level, remembered for `forget` after the ban's end).
//!
//! On the memory store the table decides everything. On a store that shares bans (Redis,
//! [`Store::ban`]) the store counts and bans, and the table is this instance's cache of
//! the bans it learned: from its own refusals (the store answers "banned, N ms left"), and
//! from the bucket, which a shared ban blocks for its length, so that another instance's
//! first request of a banned key is refused by the store, which says the key is banned
//! and for how long ([`Item::bans`](crate::store::Item)): that request is refused as
//! banned, and the table learns the ban ([`Engine::banned_by_store`]). A cached ban
//! is asked about again at most once per [`RECHECK`] while its key keeps coming (in the
//! background; the request is refused at once), so a ban lifted elsewhere stays cached
//! here for at most [`RECHECK`] plus a round trip.
//!
//! A banned request is refused from the table before any store call, and never counts.

use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::base::clock::{Clock, SharedClock};
use crate::base::throttle::LogThrottle;
use crate::engine::Engine;
use crate::model::ban::Ban;
use crate::model::key::Key;
use crate::store::{BanCall, BanReply, Item, Op, Store};

/// Keys a banning limit remembers at most (counted, banned, or banned before), per
/// table: about 100 bytes each.
pub const DEFAULT_MAX_BAN_KEYS: usize = 100_000;

/// How often a cached ban of a shared store is asked about again while its key keeps
/// coming: a ban lifted in another instance is cached here for at most this long (plus a
/// round trip).
pub const RECHECK: Duration = Duration::from_secs(1);

/// The longest a call about a ban may take before it is given up.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

const SHARDS: usize = 16;

/// How often a full shard may be swept of expired entries.
const SWEEP_EVERY_NS: u64 = 1_000_000_000;

/// One key's state.
#[derive(Debug)]
struct Entry {
    /// Refusals counted since `since` (0: none).
    count: u32,
    since: u64,
    /// The ban's end (0: never banned here).
    until: u64,
    /// The repeat level of the last ban.
    level: u32,
    /// Whether the key was banned here (its level and end mean something).
    banned_before: bool,
    /// When a cached shared ban was last asked about (store clock, ns).
    checked: AtomicU64,
}

impl Entry {
    fn new() -> Self {
        Self {
            count: 0,
            since: 0,
            until: 0,
            level: 0,
            banned_before: false,
            checked: AtomicU64::new(0),
        }
    }

    /// Whether the entry still means something at `now`.
    fn live(&self, now: u64, ban: &Ban) -> bool {
        self.until > now
            || (self.count > 0 && now < self.since.saturating_add(nanos(ban.within)))
            || (self.banned_before && now < self.until.saturating_add(nanos(ban.forget)))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[derive(Default)]
struct Shard {
    map: RwLock<hashbrown::HashMap<Key, Entry, foldhash::fast::RandomState>>,
    swept: AtomicU64,
}

/// One banned key, as [`Limiter::bans`](crate::Limiter::bans) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BannedKey {
    /// The key.
    pub key: Key,
    /// The time its ban has left.
    pub remaining: Duration,
    /// The ban's repeat level (0: a first ban).
    pub level: u32,
}

/// A ban that began (for the log, the metrics, and the store's bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Began {
    pub(crate) length: Duration,
    pub(crate) level: u32,
}

/// One banning limit's table.
pub(crate) struct BanTable {
    pub(crate) ban: Ban,
    name: &'static str,
    clock: SharedClock,
    shards: Box<[Shard]>,
    per_shard: usize,
    /// The latest end of any ban in the table: a request after it looks nothing up.
    latest_end: AtomicU64,
    log: LogThrottle,
    pub(crate) metrics: crate::observe::probe::BanMetrics,
}

impl BanTable {
    pub(crate) fn new(name: &'static str, ban: Ban, clock: SharedClock, max_keys: usize) -> Self {
        Self {
            ban,
            name,
            clock,
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            per_shard: max_keys.div_ceil(SHARDS).max(1),
            latest_end: AtomicU64::new(0),
            log: LogThrottle::new(),
            metrics: crate::observe::probe::BanMetrics::new(name),
        }
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
    }

    fn shard(&self, key: &Key) -> &Shard {
        &self.shards[(key.stable_hash() % SHARDS as u64) as usize]
    }

    /// The time `key`'s ban has left at `now`, and whether a cached shared ban is due to
    /// be asked about again (only one caller per [`RECHECK`] is told so).
    #[inline]
    pub(crate) fn banned(&self, key: &Key, now: u64) -> Option<(Duration, bool)> {
        if now >= self.latest_end.load(Ordering::Relaxed) {
            return None;
        }
        let map = self
            .shard(key)
            .map
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let entry = map.get(key)?;
        if entry.until <= now {
            return None;
        }
        let checked = entry.checked.load(Ordering::Relaxed);
        let recheck = now.saturating_sub(checked) >= nanos(RECHECK)
            && entry
                .checked
                .compare_exchange(checked, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        Some((Duration::from_nanos(entry.until - now), recheck))
    }

    /// Runs `f` on `key`'s entry (made if absent, unless the shard is full of live
    /// entries: then `None`, and nothing is remembered).
    fn with_entry<T>(&self, key: &Key, now: u64, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        let shard = self.shard(key);
        let mut map = shard.map.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(key) {
            return Some(f(entry));
        }
        if map.len() >= self.per_shard {
            // A full shard is swept at most once a second: a flood of new keys at the cap
            // costs a lookup each, not a scan each.
            let swept = shard.swept.load(Ordering::Relaxed);
            if now.saturating_sub(swept) < SWEEP_EVERY_NS && swept != 0 {
                return None;
            }
            shard.swept.store(now.max(1), Ordering::Relaxed);
            let ban = self.ban;
            map.retain(|_, e| e.live(now, &ban));
            if map.len() >= self.per_shard {
                return None;
            }
        }
        let mut entry = Entry::new();
        let out = f(&mut entry);
        map.insert(key.clone(), entry);
        Some(out)
    }

    fn extend_latest(&self, until: u64) {
        self.latest_end.fetch_max(until, Ordering::Relaxed);
    }

    /// A refusal of `key` at `now` (this table decides): counted unless the key is
    /// banned; the ban it begins, if any.
    pub(crate) fn offend(&self, key: &Key, now: u64) -> Option<Began> {
        let ban = self.ban;
        let began = self
            .with_entry(key, now, |e| {
                if e.until > now {
                    return None;
                }
                if e.count == 0 || now >= e.since.saturating_add(nanos(ban.within)) {
                    e.count = 0;
                    e.since = now;
                }
                e.count += 1;
                if e.count < ban.after {
                    return None;
                }
                let repeat = e.banned_before && now < e.until.saturating_add(nanos(ban.forget));
                let level = if repeat { e.level.saturating_add(1) } else { 0 };
                let length = ban.length(level);
                e.count = 0;
                e.level = level;
                e.banned_before = true;
                e.until = now.saturating_add(nanos(length));
                Some((Began { length, level }, e.until))
            })
            .flatten();
        began.map(|(b, until)| {
            self.extend_latest(until);
            b
        })
    }

    /// Bans `key` for `length` from `now` (by hand, or a shared ban learned); counting
    /// starts afresh; the level is `level` if given.
    pub(crate) fn set(&self, key: &Key, now: u64, length: Duration, level: Option<u32>) {
        let until = now.saturating_add(nanos(length));
        let set = self.with_entry(key, now, |e| {
            e.count = 0;
            e.until = until;
            e.banned_before = true;
            e.checked.store(now, Ordering::Relaxed);
            if let Some(level) = level {
                e.level = level;
            }
        });
        if set.is_some() {
            self.extend_latest(until);
        }
    }

    /// Forgets `key`: its ban, count and level.
    pub(crate) fn lift(&self, key: &Key) {
        let mut map = self
            .shard(key)
            .map
            .write()
            .unwrap_or_else(|e| e.into_inner());
        map.remove(key);
    }

    /// Ends `key`'s cached ban (the shared store says it has none), keeping its level.
    fn unban(&self, key: &Key, now: u64) {
        let mut map = self
            .shard(key)
            .map
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get_mut(key)
            && e.until > now
        {
            e.until = now;
        }
    }

    /// The keys banned at `now`, longest remaining first.
    pub(crate) fn list(&self, now: u64) -> Vec<BannedKey> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let map = shard.map.read().unwrap_or_else(|e| e.into_inner());
            out.extend(
                map.iter()
                    .filter(|(_, e)| e.until > now)
                    .map(|(k, e)| BannedKey {
                        key: k.clone(),
                        remaining: Duration::from_nanos(e.until - now),
                        level: e.level,
                    }),
            );
        }
        out.sort_by_key(|b| std::cmp::Reverse(b.remaining));
        out
    }

    /// Entries held (live or not yet swept).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.map.read().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// One log line per ban (at most 10 a second per limit, with the count of those left
    /// out), and the metric.
    pub(crate) fn began(&self, key: &Key, began: Began, by_hand: bool) {
        self.metrics.began();
        if let Some(suppressed) = self.log.permit(Duration::from_millis(100)) {
            let key = crate::observe::offenders::render(key, None);
            tracing::warn!(
                target: "tollgate::ban",
                limit = self.name,
                key,
                ban_ms = crate::base::round::ceil_ms(began.length),
                level = began.level,
                by_hand,
                suppressed,
                "key banned"
            );
        }
    }
}

/// The store's side of a banning limit: its table (to block and reset its buckets).
pub(crate) struct Banning<T> {
    pub(crate) table: Arc<BanTable>,
    pub(crate) bucket: Arc<T>,
}

impl<St: Store> Engine<St> {
    /// The ban table of limit `index`, if it bans.
    #[inline]
    pub(crate) fn ban_table(&self, index: usize) -> Option<&BanTable> {
        self.bounds[index].bans.as_ref().map(|b| &*b.table)
    }

    /// The time `key`'s ban has left in limit `index`, if it is banned (counted in the
    /// metrics; a cached shared ban is asked about again in the background when due).
    #[inline]
    pub(crate) fn banned(&self, index: usize, key: &Key) -> Option<Duration> {
        let bans = self.bounds[index].bans.as_ref()?;
        let table = &bans.table;
        let (remaining, recheck) = table.banned(key, table.now())?;
        table.metrics.refused();
        if recheck {
            self.ask(index, key.clone(), BanCall::Remaining);
        }
        Some(remaining)
    }

    /// A request the shared store refused because `key` is banned in limit `index` for
    /// `remaining` (a ban begun by another instance): this table learns the ban (the
    /// key's next requests are refused before the store; its level comes with the next
    /// re-check), and the banned request is counted in the metrics.
    pub(crate) fn banned_by_store(&self, index: usize, key: &Key, remaining: Duration) {
        let Some(bans) = &self.bounds[index].bans else {
            return;
        };
        let table = &bans.table;
        table.set(key, table.now(), remaining, None);
        table.metrics.refused();
    }

    /// A refusal of `key` by limit `index`: counted (here, or in the shared store). The
    /// ban it began, if this table decided (a shared store answers later).
    pub(crate) fn offended(&self, index: usize, key: &Key) -> Option<Began> {
        let bans = self.bounds[index].bans.as_ref()?;
        if self.ask(index, key.clone(), BanCall::Offend(bans.table.ban)) {
            return None;
        }
        let now = bans.table.now();
        let began = bans.table.offend(key, now)?;
        bans.table.began(key, began, false);
        Some(began)
    }

    /// Bans `key` in limit `index` for `length` by hand; `None` lifts its ban.
    pub(crate) fn set_ban(&self, index: usize, key: Key, length: Option<Duration>) -> bool {
        let Some(bans) = &self.bounds[index].bans else {
            return false;
        };
        let table = &bans.table;
        let now = table.now();
        match length {
            Some(length) => {
                table.set(&key, now, length, None);
                table.began(&key, Began { length, level: 0 }, true);
                self.ask(index, key, BanCall::Set(length));
            }
            None => {
                table.lift(&key);
                self.ask(index, key, BanCall::Lift);
            }
        }
        true
    }

    /// Sends `call` about `key` to the store, if it shares bans and a Tokio runtime runs;
    /// the reply updates this table (and a ban that began blocks the key's bucket for its
    /// length; a lift resets it). `false`: nothing was sent.
    fn ask(&self, index: usize, key: Key, call: BanCall) -> bool {
        let Some(bans) = &self.bounds[index].bans else {
            return false;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let Some(future) = self.store.ban(&bans.bucket, &key, call) else {
            return false;
        };
        let table = bans.table.clone();
        let bucket = bans.bucket.clone();
        let store = self.store.clone();
        let spec = &self.bounds[index].spec;
        let (quota, algorithm) = (spec.quota, spec.algorithm);
        runtime.spawn(async move {
            let reply = match tokio::time::timeout(CALL_TIMEOUT, future).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(error)) => {
                    tracing::debug!(limit = table.name, %error, "tollgate: a ban call failed");
                    if let BanCall::Offend(_) = call
                        && let Some(began) = table.offend(&key, table.now())
                    {
                        table.began(&key, began, false);
                    }
                    return;
                }
                Err(_) => return,
            };
            learn(&table, &key, call, reply);
            let op = match (call, reply) {
                (BanCall::Lift, _) => Some(Op::Reset),
                // Lifted elsewhere: a give-back of nothing clears what this instance's
                // store remembers of the blocked bucket (its deny cache).
                (
                    BanCall::Remaining,
                    BanReply {
                        remaining: None, ..
                    },
                ) => Some(Op::Refund),
                (
                    BanCall::Offend(_) | BanCall::Set(_),
                    BanReply {
                        remaining: Some(remaining),
                        began: true,
                        ..
                    },
                ) => Some(Op::Block(remaining)),
                _ => None,
            };
            if let Some(op) = op {
                let item = Item::new(&*bucket, key, quota, 0).algorithm(algorithm);
                match store.apply(op, std::slice::from_ref(&item)) {
                    crate::store::Checked::Ready(_) => {}
                    crate::store::Checked::Pending(f) => {
                        let _ = tokio::time::timeout(CALL_TIMEOUT, f).await;
                    }
                }
            }
        });
        true
    }

    /// The keys limit `index` has banned (as this instance knows them).
    pub(crate) fn bans_of(&self, index: usize) -> Vec<BannedKey> {
        match self.ban_table(index) {
            Some(table) => table.list(table.now()),
            None => Vec::new(),
        }
    }
}

/// What a shared store's reply tells this instance's table.
fn learn(table: &BanTable, key: &Key, call: BanCall, reply: BanReply) {
    let now = table.now();
    match (call, reply.remaining) {
        (BanCall::Lift, _) => table.lift(key),
        (_, Some(remaining)) => {
            table.set(key, now, remaining, Some(reply.level));
            if reply.began && matches!(call, BanCall::Offend(_)) {
                table.began(
                    key,
                    Began {
                        length: remaining,
                        level: reply.level,
                    },
                    false,
                );
            }
        }
        (BanCall::Remaining, None) => table.unban(key, now),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::FakeClock;

    const S: u64 = 1_000_000_000;

    fn table(ban: Ban, max_keys: usize) -> (BanTable, FakeClock) {
        let clock = FakeClock::new();
        (
            BanTable::new("t", ban, SharedClock::new(clock.clone()), max_keys),
            clock,
        )
    }

    fn ban() -> Ban {
        Ban::after(3)
            .within(Duration::from_secs(60))
            .for_(Duration::from_secs(10))
            .escalate(2.0)
            .max(Duration::from_secs(35))
            .forget(Duration::from_secs(100))
    }

    #[test]
    fn third_refusal_bans_and_repeats_escalate() {
        let (t, _) = table(ban(), 1_000);
        let k = Key::from_part("k");
        assert_eq!(t.offend(&k, S), None);
        assert_eq!(t.offend(&k, 2 * S), None);
        let b = t.offend(&k, 3 * S).unwrap();
        assert_eq!((b.length, b.level), (Duration::from_secs(10), 0));
        assert_eq!(t.banned(&k, 4 * S).unwrap().0, Duration::from_secs(9));
        // Refusals during the ban never count.
        for i in 0..10 {
            assert_eq!(t.offend(&k, 5 * S + i), None);
        }
        assert!(t.banned(&k, 13 * S).is_none());
        // Counting started afresh: three more refusals, a repeat: 20 s.
        assert_eq!(t.offend(&k, 14 * S), None);
        assert_eq!(t.offend(&k, 15 * S), None);
        assert_eq!(
            t.offend(&k, 16 * S).unwrap().length,
            Duration::from_secs(20)
        );
        // Then 35 (capped, not 40).
        for i in 0..3 {
            t.offend(&k, 40 * S + i);
        }
        assert!(t.banned(&k, 40 * S + 3).is_some());
        assert_eq!(t.list(40 * S + 2)[0].remaining, Duration::from_secs(35));
        // Forgotten 100 s after the ban's end: a first ban again.
        let end = 40 * S + 2 + 35 * S;
        for i in 0..2 {
            assert_eq!(t.offend(&k, end + 101 * S + i), None);
        }
        let b = t.offend(&k, end + 101 * S + 2).unwrap();
        assert_eq!((b.length, b.level), (Duration::from_secs(10), 0));
    }

    #[test]
    fn refusals_outside_within_start_a_new_count() {
        let (t, _) = table(ban(), 1_000);
        let k = Key::from_part("k");
        t.offend(&k, S);
        t.offend(&k, 2 * S);
        assert_eq!(t.offend(&k, 62 * S), None);
        assert_eq!(t.offend(&k, 63 * S), None);
        assert!(t.offend(&k, 64 * S).is_some());
    }

    #[test]
    fn bounded_and_bans_kept_at_the_cap() {
        let ban = Ban::after(1)
            .for_(Duration::from_secs(10))
            .forget(Duration::from_secs(5));
        let (t, _) = table(ban, 64);
        let banned = Key::from_part("first");
        t.offend(&banned, S).unwrap();
        for i in 0..10_000u32 {
            t.offend(&Key::from_part(i.to_string()), S + u64::from(i));
        }
        assert!(t.len() <= 64);
        assert!(t.banned(&banned, 2 * S).is_some());
        // Once expired, the cap makes room (one sweep per shard per second).
        t.offend(&Key::from_part("late"), 100 * S);
        assert!(t.banned(&Key::from_part("late"), 100 * S + 1).is_some());
    }

    #[test]
    fn set_lift_and_recheck_once_per_interval() {
        let (t, _) = table(ban(), 1_000);
        let k = Key::from_part("k");
        t.set(&k, S, Duration::from_secs(5), None);
        assert_eq!(t.banned(&k, S).unwrap(), (Duration::from_secs(5), false));
        assert!(t.banned(&k, 2 * S).unwrap().1);
        assert!(!t.banned(&k, 2 * S + 1).unwrap().1);
        t.lift(&k);
        assert!(t.banned(&k, 2 * S).is_none());
        assert!(t.list(2 * S).is_empty());
    }

    /// The semantics written the plain way, one key: what each refusal does.
    struct Model {
        count: u32,
        since: u64,
        until: u64,
        level: Option<u32>,
    }

    impl Model {
        fn offend(&mut self, ban: &Ban, now: u64) -> Option<(Duration, u32)> {
            if now < self.until {
                return None;
            }
            if self.count == 0 || now - self.since >= nanos(ban.within) {
                self.count = 0;
                self.since = now;
            }
            self.count += 1;
            if self.count < ban.after {
                return None;
            }
            let level = match self.level {
                Some(l) if now < self.until + nanos(ban.forget) => l + 1,
                _ => 0,
            };
            let length = ban.length(level);
            self.count = 0;
            self.level = Some(level);
            self.until = now + nanos(length);
            Some((length, level))
        }
    }

    proptest::proptest! {
        /// Any refusals at any times: bans begin exactly when the model says, last
        /// `min(for × escalate^repeats, max)`, refusals during a ban never count, and the
        /// count starts afresh after each ban.
        #[test]
        fn escalation_matches_the_model(
            after in 1u32..5,
            within_s in 1u64..30,
            for_s in 1u64..20,
            escalate in 1u32..4,
            max_factor in 1u64..10,
            forget_s in 0u64..60,
            gaps in proptest::collection::vec(0u64..20_000, 1..300),
        ) {
            let ban = Ban::after(after)
                .within(Duration::from_secs(within_s))
                .for_(Duration::from_secs(for_s))
                .escalate(f64::from(escalate))
                .max(Duration::from_secs(for_s * max_factor))
                .forget(Duration::from_secs(forget_s));
            let (t, _) = table(ban, 1_000);
            let k = Key::from_part("k");
            let mut model = Model { count: 0, since: 0, until: 0, level: None };
            let mut now = S;
            for gap in gaps {
                now += gap * 1_000_000; // up to 20 s between refusals
                let banned_before = t.banned(&k, now).map(|(d, _)| d);
                let expected = model.offend(&ban, now);
                let got = t.offend(&k, now).map(|b| (b.length, b.level));
                proptest::prop_assert_eq!(got, expected);
                if let Some((length, level)) = got {
                    proptest::prop_assert!(banned_before.is_none());
                    proptest::prop_assert!(length <= ban.max && length >= ban.for_);
                    proptest::prop_assert_eq!(length, ban.length(level));
                    proptest::prop_assert_eq!(t.banned(&k, now).unwrap().0, length);
                }
            }
        }
    }
}
