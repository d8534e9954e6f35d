//! The window algorithms in the memory store.
//!
//! A fixed window packs `(window index mod 2^32, used)` and a sliding window
//! `(window index mod 2^32, current count, previous count)` into the entry's `AtomicU64`,
//! updated by compare-and-swap under the shard's read lock like a GCRA TAT: same table,
//! same key cap, same overflow entry at the cap, no allocation. The index is kept modulo
//! 2^32 (an entry is swept long before 2^32 windows pass). A sliding log has variable
//! state (at most `L` timestamps): a per-table sharded map of logs under mutexes,
//! counted against the same key cap. Time is the store clock plus its
//! [`unix_origin`](crate::clock::Clock::unix_origin): windows are aligned to the Unix
//! epoch, as in Redis. Window arithmetic counts whole microseconds, as Redis does, so
//! both stores report the same waits (a window is a whole number of microseconds).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{MemoryStore, MemoryTable, SHARD_SHIFT, SHARDS, Slot, Table};
use crate::algo::algorithm::{Algorithm, calendar_max_us, calendar_tag, calendar_window, phase_us};
use crate::algo::window::{self, Geometry, Report};
use crate::base::clock::Clock;
use crate::model::decision::{Outcome, Status};
use crate::store::{Item, Op};

/// What the sweeper needs to know about the entries of a window table.
#[derive(Debug, Clone, Copy)]
pub(super) struct Spec {
    algorithm: Algorithm,
    /// µs.
    len: u64,
    limit: u64,
    /// The phase shared by every key (aligned windows), µs; `None` when it is per key.
    phase: Option<u64>,
    /// ns.
    unix_origin: u64,
}

impl Spec {
    /// Whether the table serves an in-flight limit.
    pub(super) fn in_flight(&self) -> bool {
        self.algorithm.is_in_flight()
    }

    /// The store-clock instant at which the state `word` is worth nothing (an empty
    /// window), at the latest.
    pub(super) fn expiry(&self, word: u64, now: u64) -> u64 {
        if self.algorithm.is_in_flight() {
            // Units held are worth keeping until they come back; none, nothing.
            return if word == 0 { 0 } else { u64::MAX };
        }
        let t = now.saturating_add(self.unix_origin) / 1_000;
        if self.algorithm.is_calendar() {
            // The index is the window's start in seconds: the window ends `len` after it
            // at the latest.
            let (start, _) = unpack_fixed(word);
            let secs = t / 1_000_000;
            let behind = (secs as u32).wrapping_sub(start) as i32;
            if behind < 0 {
                return u64::MAX;
            }
            let end = (secs - behind as u64)
                .saturating_mul(1_000_000)
                .saturating_add(self.len);
            return end.saturating_mul(1_000).saturating_sub(self.unix_origin);
        }
        // Without the key's phase, assume the latest one: windows end up to `len` later.
        let (phase, slack) = self.phase.map_or((0, self.len), |p| (p, 0));
        let g = Geometry::new(self.limit, self.len, phase);
        let idx = g.index(t);
        let (stored, windows) = match self.algorithm {
            Algorithm::FixedWindow { .. } => {
                let (i, used) = unpack_fixed(word);
                (i, used.div_ceil(self.limit.max(1)).max(1))
            }
            _ => (unpack_sliding(word).0, 2),
        };
        let behind = (idx as u32).wrapping_sub(stored) as i32;
        if behind < 0 {
            return u64::MAX; // written by a clock ahead of ours: keep
        }
        let end_index = (idx - behind as u64).saturating_add(windows);
        let end = end_index
            .saturating_mul(self.len)
            .saturating_add(phase)
            .saturating_add(slack);
        end.saturating_mul(1_000).saturating_sub(self.unix_origin)
    }
}

/// A sliding log: `(store instant, units)`, oldest first.
pub(super) type Log = VecDeque<(u64, u64)>;

/// One shard of a table's sliding logs.
#[repr(align(128))]
pub(super) struct LogShard(Mutex<HashMap<[u64; 2], Log, foldhash::fast::RandomState>>);

impl LogShard {
    /// The keys of the shard, by its owner (a table being dropped).
    pub(super) fn len_mut(&mut self) -> usize {
        self.0
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[inline(always)]
fn unpack_fixed(word: u64) -> (u32, u64) {
    ((word >> 32) as u32, word & 0xffff_ffff)
}

#[inline(always)]
fn pack_fixed(index: u64, used: u64) -> u64 {
    (index as u32 as u64) << 32 | used.min(u64::from(u32::MAX))
}

#[inline(always)]
fn unpack_sliding(word: u64) -> (u32, u64, u64) {
    ((word >> 32) as u32, (word >> 16) & 0xffff, word & 0xffff)
}

#[inline(always)]
fn pack_sliding(index: u64, cur: u64, prev: u64) -> u64 {
    (index as u32 as u64) << 32 | cur.min(0xffff) << 16 | prev.min(0xffff)
}

/// Windows from the stored index to the current one (0 if the stored one is ahead).
#[inline(always)]
fn behind(index: u64, stored: u32) -> u64 {
    let k = (index as u32).wrapping_sub(stored) as i32;
    k.max(0) as u64
}

/// One window item at one instant.
#[derive(Clone, Copy)]
pub(super) struct Ctx {
    /// In µs.
    g: Geometry,
    /// Wall time, µs.
    t: u64,
    index: u64,
    /// Time into the current window, µs.
    e: u64,
    /// How long a reservation may wait, µs (0: a check).
    max_wait: u64,
    /// A calendar limit's zone and unit (`calendar_tag`), 0 for the other algorithms. A
    /// calendar window's `index` is its start in Unix seconds, `g` its length and phase.
    tag: u16,
}

impl Ctx {
    /// The calendar window `[start, end)` (µs) at `t`.
    #[inline]
    fn calendar(limit: u64, start: u64, end: u64, t: u64, tag: u16) -> Ctx {
        let len = (end - start).max(1);
        Ctx {
            g: Geometry {
                limit,
                len,
                phase: start % len,
            },
            t,
            index: start / 1_000_000,
            e: t.saturating_sub(start),
            max_wait: 0,
            tag,
        }
    }

    /// The state `word` brought to the current window: fixed `(used, 0)`, sliding
    /// `(cur, prev)`.
    #[inline(always)]
    fn current(&self, algorithm: Algorithm, word: u64) -> (u64, u64) {
        if algorithm.is_fixed() {
            let (i, used) = unpack_fixed(word);
            (
                window::fixed_carry(self.g.limit, used, behind(self.index, i)),
                0,
            )
        } else {
            let (i, cur, prev) = unpack_sliding(word);
            match behind(self.index, i) {
                0 => (cur, prev),
                1 => (0, cur),
                _ => (0, 0),
            }
        }
    }

    /// How many windows after this context's the state `word` was written (0 if not
    /// after; 0 is an absent key's state). Both layouts keep the index in the high half.
    #[inline(always)]
    fn ahead(&self, word: u64) -> u64 {
        match word {
            0 => 0,
            _ => behind(word >> 32, self.index as u32),
        }
    }

    /// This context, or, when `word` was written in a later window (by a check whose clock
    /// read later: a thread that raced this one, or a core a hair ahead), the start of that
    /// window. A check is never judged by a window older than the one the key holds, nor
    /// moves the key back to it (that would start the later one over, empty).
    #[inline(always)]
    fn at(&self, word: u64) -> Ctx {
        match self.ahead(word) {
            0 => *self,
            ahead if self.tag != 0 => {
                // A later calendar window: its own length.
                let start = (self.index + ahead) * 1_000_000;
                let (start, end) = calendar_window(self.tag, start);
                Ctx::calendar(self.g.limit, start, end, start, self.tag)
            }
            ahead => {
                let index = self.index + ahead;
                Ctx {
                    index,
                    e: 0,
                    t: index
                        .saturating_mul(self.g.len)
                        .saturating_add(self.g.phase),
                    ..*self
                }
            }
        }
    }

    /// The state `(a, b)` packed to replace `over`, in the later of this context's window
    /// and the one `over` was written in (see [`at`](Self::at)).
    #[inline(always)]
    fn pack(&self, algorithm: Algorithm, over: u64, a: u64, b: u64) -> u64 {
        let index = self.index + self.ahead(over);
        if algorithm.is_fixed() {
            pack_fixed(index, a)
        } else {
            pack_sliding(index, a, b)
        }
    }

    /// Checks `cost` against the packed state: the report and the word to store.
    #[inline(always)]
    fn decide(&self, algorithm: Algorithm, word: u64, cost: u64) -> (Report, Option<u64>) {
        let ctx = self.at(word);
        let (a, b) = ctx.current(algorithm, word);
        if algorithm.is_fixed() {
            let until_end = ctx.g.len - ctx.e;
            let (r, new) = window::fixed_check_within(ctx.g, a, until_end, cost, ctx.max_wait);
            (r, new.map(|used| ctx.pack(algorithm, word, used, 0)))
        } else {
            let (r, new) = window::sliding_check(ctx.g, a, b, ctx.e, cost);
            (r, new.map(|cur| ctx.pack(algorithm, word, cur, b)))
        }
    }
}

/// What undoes one consumption of a request refused by another of its limits.
#[derive(Clone, Copy)]
pub(super) enum Undo {
    Gcra { written: u64, prev: u64 },
    Packed { index: u64 },
    Log,
    InFlight,
}

/// Applies `f` to the packed word with compare-and-swap until it sticks; returns the
/// report and whether it wrote.
#[inline(always)]
fn update_packed(word: &AtomicU64, f: impl Fn(u64) -> (Report, Option<u64>)) -> (Report, bool) {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        let (r, new) = f(cur);
        let Some(new) = new else {
            return (r, false);
        };
        match word.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return (r, true),
            Err(actual) => cur = actual,
        }
    }
}

/// Sets the packed word to `f(word)` with compare-and-swap.
fn set_packed(word: &AtomicU64, f: impl Fn(u64) -> u64) {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        match word.compare_exchange_weak(cur, f(cur), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

/// Drops the entries of a log that left the window `(now − len, now]`.
fn trim(log: &mut Log, len: u64, now: u64) {
    while log
        .front()
        .is_some_and(|&(t, _)| t.saturating_add(len) <= now)
    {
        log.pop_front();
    }
}

/// Checks `cost` against a log (trimmed), appending it if it passes and `consume`.
fn log_decide(log: &mut Log, g: Geometry, now: u64, cost: u64, consume: bool) -> Report {
    trim(log, g.len, now);
    let r = window::log_check(g, log.iter().copied(), now, cost);
    if consume && cost > 0 && r.verdict.is_allowed() {
        match log.back_mut() {
            Some((t, n)) if *t == now => *n += cost,
            _ => log.push_back((now, cost)),
        }
    }
    r
}

/// Takes up to `cost` units out of a log, newest first, among those at `at` if given.
fn log_remove(log: &mut Log, mut cost: u64, at: Option<u64>) {
    for (t, n) in log.iter_mut().rev() {
        if cost == 0 {
            break;
        }
        if at.is_some_and(|at| *t != at) {
            continue;
        }
        let take = cost.min(*n);
        *n -= take;
        cost -= take;
    }
    log.retain(|&(_, n)| n > 0);
}

impl<C: Clock> super::Inner<C> {
    /// Drops the logs of one shard whose newest entry left the window `grace` ago.
    pub(super) fn sweep_logs(
        &self,
        table: &Table,
        shard: &LogShard,
        now: u64,
        grace: u64,
    ) -> usize {
        let Some(spec) = table.spec.get() else {
            return 0;
        };
        let mut map = shard.0.lock().unwrap_or_else(PoisonError::into_inner);
        let before = map.len();
        // Entries are in µs of the store's clock; `now` and `grace` in ns.
        map.retain(|_, log| {
            log.back().is_some_and(|&(t, _)| {
                t.saturating_add(spec.len)
                    .saturating_mul(1_000)
                    .saturating_add(grace)
                    > now
            })
        });
        before - map.len()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// The window geometry of `item` at store time `now` (ns), in µs.
    #[inline]
    pub(super) fn ctx(&self, item: &Item<'_, MemoryTable>, now: u64) -> Ctx {
        let table = &*item.table.table;
        let unix_origin = self.inner.clock.unix_origin();
        let tag = calendar_tag(item.algorithm, &item.quota);
        if tag != 0 {
            let t = now.saturating_add(unix_origin) / 1_000;
            let (start, end) = super::calendar::window(table, tag, t);
            table.spec.get_or_init(|| Spec {
                algorithm: item.algorithm,
                len: calendar_max_us(tag),
                limit: item.quota.rate(),
                phase: None,
                unix_origin,
            });
            return Ctx::calendar(item.quota.rate(), start, end, t, tag);
        }
        let len_us = (item.quota.period_ns() / 1_000).max(1);
        let phase = phase_us(
            item.algorithm,
            table.name_hash,
            item.key.phase_hash(),
            len_us,
        );
        table.spec.get_or_init(|| Spec {
            algorithm: item.algorithm,
            len: len_us,
            limit: item.quota.rate(),
            phase: matches!(
                item.algorithm,
                Algorithm::FixedWindow {
                    phase: crate::Phase::Aligned { .. }
                } | Algorithm::SlidingWindow
            )
            .then_some(phase),
            unix_origin,
        });
        let g = Geometry {
            limit: item.quota.rate(),
            len: len_us,
            phase, // < len_us
        };
        let t = now.saturating_add(unix_origin) / 1_000;
        // The aligned window holding `t`, from the table's hint when it still holds (no
        // division), and from it the window of this key's phase.
        let mut aligned = table.aligned.load(Ordering::Relaxed);
        let mut r = t.wrapping_sub(aligned.wrapping_mul(len_us));
        if r >= len_us {
            aligned = t / len_us;
            r = t - aligned * len_us;
            table.aligned.store(aligned, Ordering::Relaxed);
        }
        let (index, e) = if r >= phase {
            (aligned, r - phase)
        } else if aligned > 0 {
            (aligned - 1, r + len_us - phase)
        } else {
            (0, 0) // before the first phase
        };
        Ctx {
            g,
            t,
            index,
            e,
            max_wait: (item.max_wait.as_micros()).try_into().unwrap_or(u64::MAX),
            tag: 0,
        }
    }

    fn log_shard<'t>(&self, table: &'t Table, slot: Slot) -> &'t LogShard {
        let shards = table.logs.get_or_init(|| {
            (0..SHARDS)
                .map(|_| LogShard(Mutex::new(HashMap::with_hasher(Default::default()))))
                .collect()
        });
        &shards[(slot.hash >> SHARD_SHIFT) as usize % SHARDS]
    }

    /// Runs `f` on the key's log: its own; a new one if `create` (or, at the cap, the
    /// table's shared one); `None` if absent and not `create`.
    fn with_log<R>(
        &self,
        table: &Table,
        slot: Slot,
        create: bool,
        f: impl FnOnce(&mut Log) -> R,
    ) -> Option<R> {
        let mut map = self
            .log_shard(table, slot)
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(log) = map.get_mut(&slot.key) {
            return Some(f(log));
        }
        if !create {
            return None;
        }
        let inner = &*self.inner;
        let max = inner.max_keys.load(Ordering::Relaxed);
        if inner.len.fetch_add(1, Ordering::Relaxed) >= max {
            inner.len.fetch_sub(1, Ordering::Relaxed);
            inner.log_at_cap(table);
            let mut shared = table
                .log_overflow
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            return Some(f(&mut shared));
        }
        let r = f(map.entry(slot.key).or_default());
        drop(map);
        if let Some(keys) = &table.keys {
            keys.increment(1.0);
        }
        self.ensure_sweeper();
        Some(r)
    }

    /// Looks at (`consume == false`) or checks one window item.
    pub(super) fn window_check(
        &self,
        item: &Item<'_, MemoryTable>,
        now: u64,
        cost: u64,
        consume: bool,
    ) -> (Report, Option<Undo>) {
        if item.algorithm.is_in_flight() {
            let (r, took) = self.in_flight_check(item, now, cost, consume);
            return (r, took.then_some(Undo::InFlight));
        }
        let table = &*item.table.table;
        let ctx = self.ctx(item, now);
        let slot = self.slot(item);
        let algorithm = item.algorithm;
        if algorithm == Algorithm::SlidingLog {
            let g = Geometry::new(ctx.g.limit, ctx.g.len, 0);
            let now = now / 1_000;
            let run = |log: &mut Log| log_decide(log, g, now, cost, consume);
            let r = match self.with_log(table, slot, false, run) {
                Some(r) => r,
                None => {
                    let r = log_decide(&mut Log::new(), g, now, cost, false);
                    if consume && cost > 0 && r.verdict.is_allowed() {
                        self.with_log(table, slot, true, run).expect("created")
                    } else {
                        r
                    }
                }
            };
            let wrote = consume && cost > 0 && r.verdict.is_allowed();
            return (r, wrote.then_some(Undo::Log));
        }
        let run = |word: &AtomicU64| {
            if consume {
                update_packed(word, |w| ctx.decide(algorithm, w, cost))
            } else {
                (
                    ctx.decide(algorithm, word.load(Ordering::Acquire), cost).0,
                    false,
                )
            }
        };
        let (r, wrote) = match self.with_existing(table, slot, run) {
            Some(x) => x,
            None => {
                // An absent key is an empty window: insert only if the request consumes.
                let (r, new) = ctx.decide(algorithm, 0, cost);
                if consume && new.is_some() {
                    self.with_entry(table, slot, run)
                } else {
                    (r, false)
                }
            }
        };
        (r, wrote.then_some(Undo::Packed { index: ctx.index }))
    }

    /// Checks one window item (a request of one limit): for fixed and sliding windows one
    /// lookup and one compare-and-swap loop, as for GCRA.
    #[inline]
    pub(super) fn window_check_one(&self, item: &Item<'_, MemoryTable>, now: u64) -> Status {
        let cost = u64::from(item.cost);
        let algorithm = item.algorithm;
        if algorithm.is_in_flight() {
            return self.in_flight_check_one(item, now);
        }
        if algorithm == Algorithm::SlidingLog {
            let (r, _) = self.window_check(item, now, cost, true);
            return Status::Checked(Outcome::window(r, 1_000));
        }
        let table = &*item.table.table;
        let ctx = self.ctx(item, now);
        let slot = self.slot(item);
        if algorithm == Algorithm::SlidingWindow {
            return self.sliding_check_one(table, slot, &ctx, cost);
        }
        let run = |word: &AtomicU64| update_packed(word, |w| ctx.decide(algorithm, w, cost)).0;
        let r = match self.with_existing(table, slot, run) {
            Some(r) => r,
            None => {
                let (r, new) = ctx.decide(algorithm, 0, cost);
                if new.is_some() {
                    self.with_entry(table, slot, run)
                } else {
                    r
                }
            }
        };
        Status::Checked(Outcome::window(r, 1_000))
    }

    /// A sliding window's check: the compare-and-swap loop decides with the formula alone,
    /// and an allowed check is reported lazily ([`Outcome`] derives the units left and the
    /// time to the next unit when asked for).
    #[inline(always)]
    fn sliding_check_one(&self, table: &Table, slot: Slot, ctx: &Ctx, cost: u64) -> Status {
        let algorithm = Algorithm::SlidingWindow;
        let g = ctx.g;
        let passes = |cur: u64, prev: u64, e: u64| {
            cost <= g.limit && (cost == 0 || window::sliding_fits(g, cur, prev, e, cost))
        };
        // Ok: (cur, prev) after the request and the time into its window; Err: the word
        // that refused it.
        let run = |word: &AtomicU64| -> Result<(u64, u64, u64), u64> {
            let mut w = word.load(Ordering::Acquire);
            loop {
                let at = ctx.at(w);
                let (cur, prev) = at.current(algorithm, w);
                if !passes(cur, prev, at.e) {
                    return Err(w);
                }
                if cost == 0 {
                    return Ok((cur, prev, at.e));
                }
                let new = at.pack(algorithm, w, cur + cost, prev);
                match word.compare_exchange_weak(w, new, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Ok((cur + cost, prev, at.e)),
                    Err(actual) => w = actual,
                }
            }
        };
        let result = match self.with_existing(table, slot, run) {
            Some(r) => r,
            None if cost > 0 && passes(0, 0, ctx.e) => self.with_entry(table, slot, run),
            None if passes(0, 0, ctx.e) => Ok((0, 0, ctx.e)),
            None => Err(0),
        };
        match result {
            Ok((cur, prev, e)) => Status::Checked(Outcome::sliding_allowed(g, cur, prev, e)),
            Err(w) => Status::Checked(Outcome::window(ctx.decide(algorithm, w, cost).0, 1_000)),
        }
    }

    /// Gives back what `item` consumed at `now` (its check is `undo`).
    pub(super) fn undo(&self, item: &Item<'_, MemoryTable>, slot: Slot, undo: Undo, now: u64) {
        let table = &*item.table.table;
        let cost = u64::from(item.cost);
        match undo {
            Undo::Gcra { written, prev } => self.refund(item, slot, written, prev, now),
            Undo::InFlight => self.in_flight_release(item, slot, cost),
            Undo::Log => {
                let at = now / 1_000;
                let _ = self.with_log(table, slot, false, |log| log_remove(log, cost, Some(at)));
            }
            Undo::Packed { index } => {
                let ctx = self.ctx(item, now);
                let algorithm = item.algorithm;
                let give_back = |word: &AtomicU64| {
                    set_packed(word, |w| {
                        let (a, b) = ctx.current(algorithm, w);
                        match (algorithm, ctx.index.saturating_sub(index)) {
                            // (A reservation that skipped what was left of the window
                            // gives back its cost; the skipped units stay used until the
                            // window ends: this undo follows only a race lost between
                            // the look and the consume, and errs on the side of refusing.)
                            (alg, _) if alg.is_fixed() => {
                                ctx.pack(algorithm, w, a.saturating_sub(cost), 0)
                            }
                            (_, 0) => ctx.pack(algorithm, w, a.saturating_sub(cost), b),
                            (_, 1) => ctx.pack(algorithm, w, a, b.saturating_sub(cost)),
                            _ => w,
                        }
                    })
                };
                if self.with_existing(table, slot, give_back).is_none() {
                    give_back(&table.overflow);
                }
            }
        }
    }

    /// An operation other than a check on one window item (see [`Algorithm`] for what
    /// each means to each window). Penalties and blocks apply to fixed windows only; on
    /// the sliding algorithms they change nothing (the [`Limiter`](crate::Limiter)
    /// refuses them with an error).
    pub(super) fn window_update_one(
        &self,
        op: Op,
        item: &Item<'_, MemoryTable>,
        now: u64,
    ) -> Status {
        if item.algorithm.is_in_flight() {
            return self.in_flight_update_one(op, item, now);
        }
        let table = &*item.table.table;
        let slot = self.slot(item);
        let ctx = self.ctx(item, now);
        let algorithm = item.algorithm;
        let cost = u64::from(item.cost);
        if algorithm == Algorithm::SlidingLog {
            match op {
                Op::Refund => {
                    let _ = self.with_log(table, slot, false, |log| log_remove(log, cost, None));
                }
                Op::Reset => {
                    let mut map = self
                        .log_shard(table, slot)
                        .0
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if map.remove(&slot.key).is_some() {
                        drop(map);
                        self.inner.forget(table, 1);
                    }
                }
                _ => {}
            }
        } else {
            let fixed = algorithm.is_fixed();
            // A calendar window carries no debt: at most its whole limit is used.
            let cap = if ctx.tag != 0 { ctx.g.limit } else { u64::MAX };
            let f = |w: u64| -> u64 {
                let ctx = ctx.at(w);
                let (a, b) = ctx.current(algorithm, w);
                match op {
                    Op::Refund => ctx.pack(algorithm, w, a.saturating_sub(cost), b),
                    Op::Penalize | Op::PenalizeOnce { .. } if fixed => {
                        ctx.pack(algorithm, w, a.saturating_add(cost).min(cap.max(a)), 0)
                    }
                    Op::Block(d) if fixed => {
                        let d = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                        let full = window::fixed_block(ctx.g, ctx.t, d).min(cap);
                        ctx.pack(algorithm, w, a.max(full), 0)
                    }
                    Op::Reset => 0,
                    _ => w,
                }
            };
            let set = |word: &AtomicU64| set_packed(word, f);
            match op {
                Op::Penalize | Op::PenalizeOnce { .. } | Op::Block(_) if fixed => {
                    self.with_entry(table, slot, set)
                }
                Op::Refund | Op::Reset => self.with_existing(table, slot, set).unwrap_or(()),
                _ => {}
            }
        }
        self.look(item, slot, now, 0)
    }
}
