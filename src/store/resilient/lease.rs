//! Lease mode in a [`Resilient`](super::Resilient) store (see [`Lease`]): per table, the
//! tokens this instance holds for each key, taken from the backend in batches and spent
//! here without a call.
//!
//! A request's leased items are decided here when every one of them has its tokens (or
//! one is refused while this instance waits for tokens to come back, or to come due from a
//! reservation); otherwise the whole
//! request is checked in the backend as usual and a lease is taken for the next ones in
//! the background. The backend's bucket counts every token before it is spent; see
//! [`Lease`] for the bound this gives.

use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::algo::algorithm::Algorithm;
use crate::algo::gcra::{self, Params};
use crate::algo::quota::Quota;
use crate::algo::window;
use crate::base::clock::{Clock, SharedClock};
use crate::model::decision::{Outcome, Status};
use crate::model::key::Key;
use crate::model::lease::Lease;
use crate::model::policy::Mode;
use crate::store::{Backend, Item, Op, Statuses, StoreError};

/// Keys the leases of one store (all its tables) hold at most; past it, new keys are
/// checked in the backend for every request.
const MAX_LEASED_KEYS: usize = 100_000;
const SHARDS: usize = 16;
/// A lease holds about this much of the instance's traffic on the key.
const REFILL_TARGET_NS: u64 = 100_000_000;
/// The shortest time a rate is measured over: a key's first request asks for a tenth of
/// a lease's worth of its rate (one request per 10 ms), not a whole lease.
const MIN_ELAPSED_NS: u64 = 10_000_000;
/// How often the leases past their age are given back, and idle keys forgotten, for keys
/// that get no request.
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// A key that holds nothing is forgotten after this long without a request.
const IDLE_NS: u64 = 1_000_000_000;
/// Near exhaustion, a lease holds this many times the instance's usual batch.
const EXHAUSTED_BATCH: u64 = 4;
/// Near exhaustion, the most an instance stretches its wait for a batch.
const MAX_BACKOFF: u64 = 8;
/// Requests of one table waiting for a lease on its way, at most.
const MAX_WAITING: usize = 1_000;

/// A call to the backend about one key, made without borrowing the request's table.
pub(super) type RemoteCall = Pin<Box<dyn Future<Output = Result<Statuses, StoreError>> + Send>>;

/// The backend and a table of its own for one limit: what lease calls (taking, giving
/// back) need after the request that started them is gone.
pub(super) trait Remote: Send + Sync {
    fn call(
        &self,
        op: Op,
        key: &Key,
        quota: Quota,
        algorithm: Algorithm,
        cost: u32,
        max_wait: Duration,
    ) -> RemoteCall;
}

pub(super) struct Backed<B: Backend> {
    pub(super) backend: B,
    pub(super) table: B::Table,
}

impl<B: Backend> Remote for Backed<B> {
    fn call(
        &self,
        op: Op,
        key: &Key,
        quota: Quota,
        algorithm: Algorithm,
        cost: u32,
        max_wait: Duration,
    ) -> RemoteCall {
        let item = Item::new(&self.table, key.clone(), quota, cost)
            .algorithm(algorithm)
            .max_wait(max_wait);
        Box::pin(self.backend.apply(op, &[item]))
    }
}

/// What lease mode did, since the store was made (see
/// [`Resilient::lease_stats`](super::Resilient::lease_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Leased checks decided here, without a call: allowed from leased tokens.
    pub local_allowed: u64,
    /// Leased checks refused here, without a call, while this instance waits for the
    /// shared bucket to have a batch again.
    pub local_refused: u64,
    /// Leased checks that went to the backend (no tokens here yet).
    pub remote: u64,
    /// Calls that took a lease (granted or not).
    pub lease_calls: u64,
    /// Tokens taken in leases.
    pub leased_tokens: u64,
    /// Calls that gave unspent tokens back.
    pub return_calls: u64,
    /// Tokens given back.
    pub returned_tokens: u64,
}

/// What lease mode did, for the whole store: the lease calls and give-backs, and the
/// decisions of tables that are gone (those of live tables are counted in their shards).
#[derive(Default)]
pub(super) struct Counters {
    local_allowed: AtomicU64,
    local_refused: AtomicU64,
    remote: AtomicU64,
    lease_calls: AtomicU64,
    leased_tokens: AtomicU64,
    return_calls: AtomicU64,
    returned_tokens: AtomicU64,
}

impl Counters {
    /// The counts, with `live`: what the tables still in use decided.
    pub(super) fn snapshot(&self, live: Decisions) -> LeaseStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LeaseStats {
            local_allowed: get(&self.local_allowed) + live.local_allowed,
            local_refused: get(&self.local_refused) + live.local_refused,
            remote: get(&self.remote) + live.remote,
            lease_calls: get(&self.lease_calls),
            leased_tokens: get(&self.leased_tokens),
            return_calls: get(&self.return_calls),
            returned_tokens: get(&self.returned_tokens),
        }
    }

    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Keeps what a table that goes decided.
    fn absorb(&self, d: Decisions) {
        Self::add(&self.local_allowed, d.local_allowed);
        Self::add(&self.local_refused, d.local_refused);
        Self::add(&self.remote, d.remote);
    }
}

/// The lease of one key.
#[derive(Default)]
struct Slot {
    /// The quota the tokens were taken under; another quota starts afresh.
    salt: u64,
    /// That quota and the algorithm, to give the tokens back.
    held_as: Option<(Quota, Algorithm)>,
    /// Tokens taken and not spent (some perhaps not due yet: see `due`).
    tokens: u64,
    /// GCRA near exhaustion: leases are reservations, tokens the shared bucket gives as
    /// they come due. The last two reservations, older first; the tokens of each not due
    /// yet are the last of `tokens`, and none is spent before it is due.
    due: [Due; 2],
    /// Spend them before this instant (never after a fixed window ends).
    expires: u64,
    /// A fixed window: when the window the tokens were taken in ends (0: GCRA).
    window_end: u64,
    /// No lease before this instant: the key is refused here until then.
    refused_until: u64,
    /// A lease call is on its way.
    taking: bool,
    /// A lease call that timed out may still be answered until this instant (its lease's
    /// age from its send): no other lease is taken meanwhile, so that this instance never
    /// holds more than `L` when it comes (see [`LeaseTable::late`]).
    late_until: u64,
    /// The shared bucket's tokens after the last lease call, and when it was sent.
    shared_left: u64,
    shared_at: u64,
    /// Tokens asked for (spent or refused) since `since`: the instance's rate on the key.
    demand: u64,
    since: u64,
    /// Near exhaustion, the fewest tokens worth a call: this instance waits until they are
    /// back before it asks again.
    min_batch: u64,
    /// Below this many tokens, the next lease is taken while the last ones are spent.
    low_water: u64,
    /// The last lease call was refused, or given less than asked: the shared bucket is
    /// nearly empty, and requests wait for the next lease here instead of each asking.
    exhausted: bool,
    /// Near exhaustion, how many times longer than the refill of `min_batch` this instance
    /// waits before it asks again (doubled when a call finds other instances took the
    /// tokens, halved when one is granted whole): instances that share an empty bucket
    /// space their calls out instead of all asking at each refill.
    backoff: u64,
    /// The last request.
    used_at: u64,
    /// Moves each time the slot starts afresh (another quota): a lease call started
    /// before answers into a slot that is not the one it was taken for, and its tokens go
    /// back instead of adding to what the new slot takes (never more than `L` held).
    generation: u64,
    /// The requests waiting for the lease call on its way (`taking`), if any: woken when
    /// it is settled, and only they (see [`LeaseTable::wait`]).
    wake: Option<Arc<Wake>>,
}

/// Wakes the requests waiting for one lease call of one key: set once, when the call is
/// settled (or its slot starts afresh). A key's settled call wakes its own waiters, not
/// every waiter of the table; the memory is a pointer per key, and an allocation per lease
/// call that a request waits for.
#[derive(Default)]
struct Wake {
    settled: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Wake {
    fn settle(&self) {
        // Before the notification: a waiter that registers after it sees the flag (see
        // `LeaseTable::wait`).
        self.settled.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }
}

impl Slot {
    /// Lets go of the tokens held: what to give back, at the quota they were taken under
    /// (a give-back at another quota would return another amount of time). A fixed
    /// window's units are never given back: the backend would count a give-back in
    /// whatever window it lands in, and one that lands after its window ends would give
    /// the next window units it never counted. They expire with their window instead (at
    /// most `L` per instance unused in that window).
    fn release(&mut self, key: &Key) -> GiveBack {
        let tokens = std::mem::take(&mut self.tokens);
        self.due = [Due::default(); 2];
        let (quota, algorithm) = self.held_as?;
        (tokens > 0 && !algorithm.is_window()).then(|| (key.clone(), quota, algorithm, tokens))
    }
}

/// How a request asks its lease (see [`LeaseTable::decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asking {
    /// As it comes.
    Online,
    /// After waiting for a lease on its way.
    Waited,
    /// While the backend fails.
    Offline,
}

/// What the lease of a key says about one item of a request.
pub(super) enum Local {
    /// Its tokens are here and were taken (give them back with [`LeaseTable::undo`] if the
    /// request does not pass).
    Taken(Outcome),
    /// Refused here until tokens come back.
    Refused(Outcome),
    /// Ask the backend.
    Remote,
    /// A lease call for the key is on its way: wait for it (see
    /// [`LeaseTable::wait`]), then decide again.
    Wait,
}

/// What [`LeaseTable::decide`] answers: the item's decision, a lease to take in the
/// background, and tokens to give back.
pub(super) struct Decided {
    pub(super) local: Local,
    pub(super) take: Option<Take>,
    pub(super) give_back: GiveBack,
}

/// What a lease call for `asked` tokens answered (`None`: it failed), sent at `sent_at`
/// and answered at `answered_at`; `last`: no second call follows.
pub(super) struct Answer {
    pub(super) asked: u64,
    /// The generation of the slot the lease was taken for.
    pub(super) generation: u64,
    pub(super) sent_at: u64,
    pub(super) answered_at: u64,
    pub(super) outcome: Option<Outcome>,
    pub(super) last: bool,
}

/// A lease to take: this many tokens, as a reservation that may wait up to `max_wait`
/// for them (zero: only tokens the shared bucket has now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Take {
    pub(super) tokens: u64,
    pub(super) max_wait: Duration,
    /// The slot's generation when the lease was started.
    pub(super) generation: u64,
}

/// The leases of the keys that hash to one shard, and what the decisions made from them
/// were (counted here, under the lock already held, rather than in a counter every
/// request of every key would write).
#[derive(Default)]
struct Shard {
    slots: HashMap<Key, Slot, foldhash::fast::RandomState>,
    counts: Decisions,
}

/// Checks decided by the leases of a shard, or a table.
#[derive(Default, Clone, Copy)]
pub(super) struct Decisions {
    local_allowed: u64,
    local_refused: u64,
    remote: u64,
}

impl Decisions {
    pub(super) fn add(&mut self, other: Decisions) {
        self.local_allowed += other.local_allowed;
        self.local_refused += other.local_refused;
        self.remote += other.remote;
    }
}

/// One limit's leases.
pub(super) struct LeaseTable {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    pub(super) remote: Box<dyn Remote>,
    /// Keys held by every table of the store.
    keys: Arc<AtomicUsize>,
    max_keys: usize,
    pub(super) counters: Arc<Counters>,
    /// The store's clock and call timeout, for giving back when the table is dropped.
    clock: SharedClock,
    timeout: Duration,
    /// Whether the background sweep runs (started with the first lease call).
    sweeping: std::sync::atomic::AtomicBool,
    /// Requests waiting for a lease on its way ([`Local::Wait`], [`LeaseTable::wait`]):
    /// at most `MAX_WAITING`; more ask the backend, as without a lease on its way.
    pub(super) waiting: AtomicUsize,
    /// Whether a key was ever leased here: answers of limits that never lease are not
    /// looked up (see [`LeaseTable::observe`]).
    used: AtomicBool,
    /// How long a lease call may take before it is late (nanoseconds; see
    /// [`patience`](Self::patience)).
    patience_ns: AtomicU64,
}

/// What an item needs from its lease.
#[derive(Clone, Copy)]
pub(super) struct Ask {
    pub(super) quota: Quota,
    pub(super) algorithm: Algorithm,
    pub(super) lease: Lease,
    pub(super) cost: u32,
}

/// Tokens to give back: `(key, quota, algorithm, tokens)` (GCRA only, see
/// [`Slot::release`]).
pub(super) type GiveBack = Option<(Key, Quota, Algorithm, u64)>;

impl LeaseTable {
    pub(super) fn new(
        remote: Box<dyn Remote>,
        keys: Arc<AtomicUsize>,
        counters: Arc<Counters>,
        clock: SharedClock,
        timeout: Duration,
    ) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            remote,
            keys,
            max_keys: MAX_LEASED_KEYS,
            counters,
            clock,
            timeout,
            sweeping: std::sync::atomic::AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            patience_ns: AtomicU64::new(duration_ns(timeout)),
        }
    }

    /// How long a lease call may take before it is late: the call timeout of the last
    /// lease call sent (see [`decide`](Self::decide)).
    pub(super) fn patience(&self, timeout: Duration) {
        self.patience_ns
            .store(duration_ns(timeout), Ordering::Relaxed);
    }

    /// Starts the background sweep once (on the current Tokio runtime): every
    /// `SWEEP_EVERY`, tokens held past their lease's age go back and keys that hold
    /// nothing and were not used for a second are forgotten, whether or not the key gets
    /// requests. Stops when the table is dropped.
    pub(super) fn sweep_in_background(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Ordering::Release);
            return;
        };
        let table = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(table) = table.upgrade() else {
                    break;
                };
                let now = table.clock.now();
                table.sweep_idle(now);
            }
        });
    }

    /// Gives back the tokens of leases past their age, and forgets keys that hold nothing
    /// (see [`sweep_in_background`](Self::sweep_in_background)).
    pub(super) fn sweep_idle(&self, now: u64) {
        let mut back = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            for (key, slot) in shard.slots.iter_mut() {
                if slot.tokens > 0 && now >= slot.expires {
                    back.extend(slot.release(key));
                }
            }
            self.sweep(&mut shard.slots, now);
        }
        for (key, quota, algorithm, tokens) in back {
            self.give_back(&key, quota, algorithm, tokens);
        }
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        let i = (self.hasher.hash_one(key) as usize) % SHARDS;
        // A panic while a shard is held leaves its slots as they were: counts only.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an item is decided by its lease: an enforcing check of a positive cost,
    /// not a reservation, of an algorithm that can lease.
    pub(super) fn applies(
        item_mode: Mode,
        cost: u32,
        max_wait: Duration,
        algorithm: Algorithm,
    ) -> bool {
        item_mode == Mode::Enforce
            && cost > 0
            && max_wait.is_zero()
            && matches!(algorithm, Algorithm::Gcra | Algorithm::FixedWindow { .. })
    }

    /// Decides an item from the lease of `key` at `now`; also answers tokens to give back
    /// (a lease past its age, or taken under another quota).
    ///
    /// `mode`: [`Asking::Online`] as a request first asks; [`Asking::Waited`] once it waited
    /// for a lease on its way (no lease is started then: a lease that failed sends the
    /// request to the backend rather than start another and wait again); [`Asking::Offline`]
    /// while the backend fails (tokens held are spent, no lease is started, and an item
    /// without tokens goes to the backend, that is to its failure policy).
    pub(super) fn decide(&self, key: &Key, ask: Ask, now: u64, mode: Asking) -> Decided {
        let offline = mode == Asking::Offline;
        let may_take = mode == Asking::Online;
        let cost = u64::from(ask.cost);
        let cap = ask.lease.cap(&ask.quota);
        let mut shard = self.shard(key);
        let Shard { slots, counts } = &mut *shard;
        if cost > cap {
            // No lease can hold this request's tokens (an instance holds at most `L`,
            // whatever the cost): the backend decides it, whatever the key's lease says (a
            // refusal here would wait for a lease that never comes), and its answer tells
            // the lease whether the bucket has tokens again (see `observe`).
            counts.remote += 1;
            return Decided {
                local: Local::Remote,
                take: None,
                give_back: None,
            };
        }
        if !slots.contains_key(key) {
            if self.keys.load(Ordering::Relaxed) >= self.max_keys {
                self.sweep(slots, now);
                if self.keys.load(Ordering::Relaxed) >= self.max_keys {
                    counts.remote += 1;
                    return Decided {
                        local: Local::Remote,
                        take: None,
                        give_back: None,
                    };
                }
            }
            self.keys.fetch_add(1, Ordering::Relaxed);
            if !self.used.load(Ordering::Relaxed) {
                self.used.store(true, Ordering::Relaxed);
            }
            slots.insert(
                key.clone(),
                Slot {
                    since: now,
                    ..Slot::default()
                },
            );
        }
        let slot = slots.get_mut(key).expect("inserted above");
        if slot.held_as.is_none() {
            slot.held_as = Some((ask.quota, ask.algorithm));
        }
        let salt = super::quota_salt(&ask.quota);
        let mut give_back = None;
        if slot.salt != salt || (slot.tokens > 0 && now >= slot.expires) {
            give_back = slot.release(key);
            if slot.salt != salt {
                // Requests waiting for the old slot's lease decide again (its call's answer
                // goes back: see `settle`).
                if let Some(wake) = slot.wake.take() {
                    wake.settle();
                }
                *slot = Slot {
                    salt,
                    held_as: Some((ask.quota, ask.algorithm)),
                    since: now,
                    generation: slot.generation.wrapping_add(1),
                    ..Slot::default()
                };
            }
        }
        if slot.exhausted && !slot.taking && refilled(slot, &ask, now) {
            // Time enough for the bucket to be back, whatever it had at the last answer:
            // that answer no longer says it is nearly empty.
            slot.exhausted = false;
        }
        slot.used_at = now;
        slot.demand = slot.demand.saturating_add(cost);
        let mut take = None;
        let local = if slot.tokens < cost && cap.saturating_sub(slot.tokens) < cost {
            // Too few tokens here, and a lease of the rest would hold more than `L`: the
            // backend decides (no lease it could wait for is taken).
            counts.remote += 1;
            Local::Remote
        } else if slot.refused_until > now {
            counts.local_refused += 1;
            Local::Refused(refused(&ask, slot.refused_until - now))
        } else if slot.tokens >= cost {
            let t = ask.quota.t_ns().max(1);
            let pending = pending(slot, t, now);
            if slot.tokens - pending >= cost {
                slot.tokens -= cost;
                counts.local_allowed += 1;
                if !slot.taking && may_take && slot.tokens < slot.low_water {
                    take = start(slot, &ask, now);
                }
                Local::Taken(allowed(&ask, slot, pending, now))
            } else {
                // Reserved tokens not due yet: refused here until the first of them is.
                counts.local_refused += 1;
                let first_due = slot
                    .due
                    .iter()
                    .find_map(|d| d.first_pending(t, now))
                    .unwrap_or(now + t);
                Local::Refused(refused(&ask, first_due.saturating_sub(now).max(1)))
            }
        } else {
            if !slot.taking && may_take {
                take = start(slot, &ask, now);
            }
            // A lease call on its way for longer than a call may take is late (a slow
            // reply, perhaps lost): the requests do not wait for it, refused or not; they
            // ask the backend, which decides them exactly, and the late answer's tokens
            // are still spent here if it comes (see `late`).
            let patience = self.patience_ns.load(Ordering::Relaxed);
            let late = slot.taking && now.saturating_sub(slot.since) > patience;
            // Holding a request for a lease (refused near exhaustion, or waiting) moves it
            // to when the lease comes; a GCRA bucket absorbs that only if it is soon next
            // to the time the bucket takes to fill: a request held longer reaches the
            // bucket (if at all) after tokens it could have had were lost to a full bucket.
            // Such a request asks the backend now, which decides it exactly.
            let far = !ask.algorithm.is_window() && {
                let fill = ask.quota.burst_size().saturating_mul(ask.quota.t_ns());
                slot.since.saturating_add(patience).saturating_sub(now) > fill / 2
            };
            if late || (slot.taking && far) {
                counts.remote += 1;
                Local::Remote
            } else if slot.exhausted && !offline {
                // Near exhaustion: wait for the lease rather than ask for each request.
                counts.local_refused += 1;
                Local::Refused(refused(&ask, ask.quota.t_ns()))
            } else if slot.taking && !offline && self.waiting.load(Ordering::Relaxed) < MAX_WAITING
            {
                // A lease is on its way: its answer comes no later than this request's
                // own would (counted when the request is decided).
                Local::Wait
            } else {
                counts.remote += 1;
                Local::Remote
            }
        };
        Decided {
            local,
            take,
            give_back,
        }
    }

    /// Counts a check that waited for a lease in vain and goes to the backend.
    pub(super) fn count_remote(&self, key: &Key) {
        self.shard(key).counts.remote += 1;
    }

    /// Waits, until `deadline` at most, for the lease call of `key` on its way to be
    /// settled (at once if none is): only this key's settled calls wake the request, not
    /// every call of the table.
    pub(super) async fn wait(&self, key: &Key, deadline: tokio::time::Instant) {
        let wake = {
            let mut shard = self.shard(key);
            match shard.slots.get_mut(key) {
                Some(slot) if slot.taking => slot.wake.get_or_insert_with(Arc::default).clone(),
                _ => return,
            }
        };
        // Made before the flag is read: a settle after the read wakes it (`Notified`
        // counts the `notify_waiters` calls from its creation), and one before sets the
        // flag first.
        let notified = wake.notify.notified();
        if wake.settled.load(Ordering::SeqCst) {
            return;
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }

    /// What the backend answered a check of `key` (under `quota`) sent at `sent_at`: a
    /// request the lease did not decide. When it shows the bucket has a batch again, the
    /// key is no longer near exhaustion here (its next lease is not a reservation, and its
    /// requests are not refused while it is on its way).
    pub(super) fn observe(&self, key: &Key, quota: &Quota, sent_at: u64, o: &Outcome) {
        if !self.used.load(Ordering::Relaxed) {
            return;
        }
        let salt = super::quota_salt(quota);
        let mut shard = self.shard(key);
        let Some(slot) = shard
            .slots
            .get_mut(key)
            .filter(|s| s.salt == salt && s.shared_at <= sent_at)
        else {
            return;
        };
        slot.shared_left = o.remaining();
        slot.shared_at = sent_at;
        if o.remaining() >= slot.min_batch.max(1) {
            slot.exhausted = false;
            slot.refused_until = 0;
        }
    }

    /// Gives back tokens taken by [`decide`](Self::decide) for a request that did not
    /// pass.
    pub(super) fn undo(&self, key: &Key, cost: u32) {
        let mut shard = self.shard(key);
        if let Some(slot) = shard.slots.get_mut(key) {
            slot.tokens += u64::from(cost);
        }
        shard.counts.local_allowed = shard.counts.local_allowed.saturating_sub(1);
    }

    /// What a lease call answered, sent at `sent_at` for `asked` tokens. Answers the
    /// tokens to take in a second call (the bucket had fewer than asked, but enough to
    /// be worth it), and tokens to give back (the key's lease was reset meanwhile).
    pub(super) fn settle(&self, key: &Key, ask: Ask, call: Answer) -> (Option<u64>, GiveBack) {
        let Answer {
            asked,
            generation,
            sent_at,
            answered_at,
            outcome: answer,
            last,
        } = call;
        Counters::add(&self.counters.lease_calls, 1);
        let mut shard = self.shard(key);
        let salt = super::quota_salt(&ask.quota);
        let Some(slot) = shard
            .slots
            .get_mut(key)
            .filter(|s| s.salt == salt && s.generation == generation)
        else {
            let granted = answer.filter(Outcome::is_allowed);
            if granted.is_some() {
                Counters::add(&self.counters.leased_tokens, asked);
            }
            // A GCRA lease goes back; a fixed window's units stay spent (see `release`).
            return (
                None,
                granted
                    .filter(|_| !ask.algorithm.is_window())
                    .map(|_| (key.clone(), ask.quota, ask.algorithm, asked)),
            );
        };
        if answer.is_some_and(|o| o.is_allowed()) {
            Counters::add(&self.counters.leased_tokens, asked);
        }
        let again = Self::answered(slot, ask, asked, sent_at, answered_at, answer, last);
        // The call is settled (unless a second one follows): the requests waiting for it
        // decide again, and only they.
        let wake = if slot.taking { None } else { slot.wake.take() };
        drop(shard);
        if let Some(wake) = wake {
            wake.settle();
        }
        (again, None)
    }

    /// The lease call of `key` taken for `generation` and sent at `sent_at` timed out (and
    /// was settled as failed): it may still be answered, and no other lease is taken for
    /// the key until it is, or until its lease's age has passed (tokens that come later
    /// are past it, and go back).
    pub(super) fn timed_out(&self, key: &Key, ask: Ask, generation: u64, sent_at: u64) {
        let salt = super::quota_salt(&ask.quota);
        let mut shard = self.shard(key);
        if let Some(slot) = shard
            .slots
            .get_mut(key)
            .filter(|s| s.salt == salt && s.generation == generation)
        {
            slot.late_until = sent_at.saturating_add(duration_ns(ask.lease.age()));
        }
    }

    /// A lease call that timed out (settled as failed, its requests went on without it)
    /// was answered after all. Tokens the backend granted were counted there: they are
    /// held here as if the answer had come in time when the slot they were taken for is
    /// still the key's and takes no other lease meanwhile (or, tokens due now, whatever it
    /// takes), and given back otherwise (a fixed window's units stay spent, as in
    /// [`settle`](Self::settle)).
    pub(super) fn late(&self, key: &Key, ask: Ask, call: Answer) -> GiveBack {
        let salt = super::quota_salt(&ask.quota);
        let mut shard = self.shard(key);
        let Some(o) = call.outcome.filter(Outcome::is_allowed) else {
            // Refused there: nothing to hold, and the next lease may be taken.
            if let Some(slot) = shard
                .slots
                .get_mut(key)
                .filter(|s| s.salt == salt && s.generation == call.generation)
            {
                slot.late_until = 0;
            }
            return None;
        };
        Counters::add(&self.counters.leased_tokens, call.asked);
        let mut slot = shard
            .slots
            .get_mut(key)
            .filter(|s| s.salt == salt && s.generation == call.generation);
        if let Some(slot) = slot.as_deref_mut() {
            slot.late_until = 0;
        }
        match slot {
            Some(slot) if !slot.taking => {
                let Answer {
                    asked,
                    sent_at,
                    answered_at,
                    ..
                } = call;
                Self::answered(slot, ask, asked, sent_at, answered_at, Some(o), false);
                None
            }
            Some(slot) if o.wait().is_zero() && !ask.algorithm.is_window() => {
                slot.tokens += call.asked;
                let age = u64::try_from(ask.lease.age().as_nanos()).unwrap_or(u64::MAX);
                slot.expires = slot.expires.max(call.sent_at.saturating_add(age));
                None
            }
            _ => (!ask.algorithm.is_window())
                .then(|| (key.clone(), ask.quota, ask.algorithm, call.asked)),
        }
    }

    /// What a lease call's answer (`None`: it failed) does to the slot it was taken for;
    /// `Some`: the tokens to take in a second call (still `taking`).
    fn answered(
        slot: &mut Slot,
        ask: Ask,
        asked: u64,
        sent_at: u64,
        answered_at: u64,
        answer: Option<Outcome>,
        last: bool,
    ) -> Option<u64> {
        let Some(o) = answer else {
            // The call failed: the next requests go to the backend, and so to the failure
            // policy while it fails, rather than wait here for a lease that may not come.
            slot.taking = false;
            slot.exhausted = false;
            return None;
        };
        slot.shared_left = o.remaining();
        slot.shared_at = sent_at;
        if o.is_allowed() {
            slot.tokens += asked;
            slot.taking = false;
            // Granted less than first asked (the second call takes what was left), or
            // leaving less than a lease in the bucket: it is nearly empty.
            slot.exhausted = last || o.remaining() < asked;
            slot.backoff = (slot.backoff / 2).max(1);
            let age = u64::try_from(ask.lease.age().as_nanos()).unwrap_or(u64::MAX);
            slot.expires = sent_at.saturating_add(age);
            let wait = duration_ns(o.wait());
            if wait > 0 && !ask.algorithm.is_window() {
                // A reservation: its last token is due `wait` after the backend decided,
                // which was before the answer came (so never earlier than in the bucket).
                // Tokens still pending from the two before are counted as due just before
                // the later of them, which is no earlier than they are.
                let t = ask.quota.t_ns().max(1);
                let [older, newer] = slot.due;
                let before = older.pending(t, answered_at) + newer.pending(t, answered_at);
                let merged = Due {
                    at: newer.at.max(older.at),
                    batch: before,
                };
                let at = answered_at.saturating_add(wait);
                slot.due = [merged, Due { at, batch: asked }];
                slot.expires = at.saturating_add(age);
            }
            if ask.algorithm.is_window() {
                // Counted from the send: never after the backend's own end of the window.
                let end = sent_at.saturating_add(duration_ns(o.reset_after()));
                slot.window_end = end;
                slot.expires = slot.expires.min(end);
            }
            return None;
        }
        let left = o.remaining();
        let enough = if ask.algorithm.is_window() {
            1
        } else {
            slot.min_batch
        };
        if !last && left >= enough.max(1) && left < asked {
            return Some(left); // still `taking`
        }
        slot.taking = false;
        slot.exhausted = true;
        slot.backoff = (slot.backoff.max(1) * 2).min(MAX_BACKOFF);
        let wait = if ask.algorithm.is_window() {
            o.retry_after().map_or(0, duration_ns)
        } else {
            let t = ask.quota.t_ns();
            let next = o.next_after().map_or(t, duration_ns);
            let refill = next.saturating_add(
                enough
                    .saturating_sub(left)
                    .saturating_sub(1)
                    .saturating_mul(t),
            );
            // Never so long that the bucket could fill up meanwhile (tokens it cannot hold
            // are lost to every instance): at most three quarters of its depth.
            let most = ask.quota.burst_size().saturating_mul(t) / 4 * 3;
            refill.saturating_mul(slot.backoff).min(most.max(refill))
        };
        slot.refused_until = sent_at.saturating_add(wait);
        None
    }

    /// The checks this table's leases decided so far.
    pub(super) fn decisions(&self) -> Decisions {
        let mut all = Decisions::default();
        for shard in self.shards.iter() {
            all.add(shard.lock().unwrap_or_else(|e| e.into_inner()).counts);
        }
        all
    }

    /// Gives `tokens` of `key` back to the backend, in the background (never beyond a
    /// full bucket: a refund). Without a Tokio runtime they return as the bucket refills.
    pub(super) fn give_back(&self, key: &Key, quota: Quota, algorithm: Algorithm, tokens: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        Counters::add(&self.counters.return_calls, 1);
        Counters::add(&self.counters.returned_tokens, tokens);
        let cost = u32::try_from(tokens).unwrap_or(u32::MAX);
        let call = self
            .remote
            .call(Op::Refund, key, quota, algorithm, cost, Duration::ZERO);
        let timeout = self.timeout;
        runtime.spawn(async move {
            // A refund that fails leaves the tokens to come back as the bucket refills.
            let _ = tokio::time::timeout(timeout, call).await;
        });
    }

    /// Forgets the keys of `shard` that hold nothing: no tokens, no call on its way, no
    /// refusal running, unused for a second.
    fn sweep(&self, shard: &mut HashMap<Key, Slot, foldhash::fast::RandomState>, now: u64) {
        let before = shard.len();
        shard.retain(|_, s| {
            s.tokens > 0
                || s.taking
                || s.refused_until > now
                || now.saturating_sub(s.used_at) < IDLE_NS
        });
        self.keys.fetch_sub(before - shard.len(), Ordering::Relaxed);
    }
}

/// The table's limit is gone (its layer or limiter was dropped, or reloaded rules removed
/// it): unspent tokens go back.
impl Drop for LeaseTable {
    fn drop(&mut self) {
        let mut held = 0;
        let mut back = Vec::new();
        // What the table decided stays in the store's counts.
        self.counters.absorb(self.decisions());
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            held += shard.slots.len();
            for (key, slot) in shard.slots.iter_mut() {
                back.extend(slot.release(key));
            }
        }
        self.keys.fetch_sub(held, Ordering::Relaxed);
        for (key, quota, algorithm, tokens) in back {
            self.give_back(&key, quota, algorithm, tokens);
        }
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether the bucket has had time to be back since `slot`'s last answer, whatever that
/// answer said: the time a GCRA bucket takes to fill from empty, or the end of the fixed
/// window the answer was in.
fn refilled(slot: &Slot, ask: &Ask, now: u64) -> bool {
    if ask.algorithm.is_window() {
        let end = slot.window_end.max(slot.refused_until);
        return end != 0 && now >= end;
    }
    let full = ask.quota.burst_size().saturating_mul(ask.quota.t_ns());
    slot.shared_at != 0 && now >= slot.shared_at.saturating_add(full)
}

/// Starts a lease call for `slot`: how many tokens to ask for, and whether as a
/// reservation. Near exhaustion a GCRA lease reserves the tokens the bucket will give
/// within the lease's age: instead of each instance waiting for a batch to be back (tokens
/// waiting in the bucket meanwhile, and several instances racing for each refill), the
/// instances queue in the bucket, and each spends its tokens as they come due.
fn start(slot: &mut Slot, ask: &Ask, now: u64) -> Option<Take> {
    if slot.late_until > now {
        return None;
    }
    let (want, min_batch) = want(slot, ask, now)?;
    slot.taking = true;
    slot.min_batch = min_batch;
    slot.low_water = want / 4;
    slot.demand = 0;
    slot.since = now;
    let max_wait = if slot.exhausted && !ask.algorithm.is_window() {
        ask.lease.age()
    } else {
        Duration::ZERO
    };
    Some(Take {
        tokens: want,
        max_wait,
        generation: slot.generation,
    })
}

/// Tokens reserved in one lease call: `batch` of them, due one per emission interval, the
/// last at `at`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Due {
    at: u64,
    batch: u64,
}

impl Due {
    /// How many are not due yet at `now` (`t`: the emission interval).
    fn pending(self, t: u64, now: u64) -> u64 {
        if self.at <= now {
            return 0;
        }
        self.batch.min((self.at - now).div_ceil(t))
    }

    /// When the first of those not due yet at `now` is due, if any.
    fn first_pending(self, t: u64, now: u64) -> Option<u64> {
        let n = self.pending(t, now);
        (n > 0).then(|| self.at - (n - 1) * t)
    }
}

/// How many of `slot`'s tokens are not due yet at `now` (`t`: the emission interval).
fn pending(slot: &Slot, t: u64, now: u64) -> u64 {
    slot.due
        .iter()
        .map(|d| d.pending(t, now))
        .sum::<u64>()
        .min(slot.tokens)
}

/// The lease to ask for, and the fewest tokens worth a call: about 100 ms of the
/// instance's demand on the key, at least the request's cost, at most the lease's cap less
/// what is held; when the shared bucket is likely to have less, what it likely has, but
/// never under half of that (near exhaustion, fewer tokens are not worth a call). `None`
/// when the cap less what is held is less than the request's cost: taking it would hold
/// more than `L`.
fn want(slot: &Slot, ask: &Ask, now: u64) -> Option<(u64, u64)> {
    let cost = u64::from(ask.cost);
    let cap = ask.lease.cap(&ask.quota).saturating_sub(slot.tokens);
    if cap < cost {
        return None;
    }
    let elapsed = now.saturating_sub(slot.since).max(MIN_ELAPSED_NS);
    let rate = u128::from(slot.demand) * u128::from(REFILL_TARGET_NS) / u128::from(elapsed);
    let mut want = u64::try_from(rate).unwrap_or(u64::MAX);
    if slot.exhausted {
        // The bucket is nearly empty and refills at its rate for every instance: fewer,
        // larger batches, each worth the wait.
        want = want.saturating_mul(EXHAUSTED_BATCH);
    }
    let mut want = want.clamp(cost, cap);
    let min_batch = if slot.exhausted {
        want
    } else {
        (want / 2).max(cost)
    };
    if slot.shared_at != 0 && !ask.algorithm.is_window() {
        let accrued = now.saturating_sub(slot.shared_at) / ask.quota.t_ns().max(1);
        let likely = slot
            .shared_left
            .saturating_add(accrued)
            .min(ask.quota.burst_size());
        want = want.min(likely.max(min_batch));
    }
    Some((want, min_batch))
}

/// A request allowed from the lease: what is left is the lease and what the shared bucket
/// had at the last call (with what came back since, for GCRA), at most a full bucket.
fn allowed(ask: &Ask, slot: &Slot, pending: u64, now: u64) -> Outcome {
    let depth = ask.quota.burst_size();
    if ask.algorithm.is_window() {
        let until_end = slot.window_end.saturating_sub(now);
        let remaining = slot.tokens.saturating_add(slot.shared_left).min(depth);
        return Outcome::window(
            window::Report {
                verdict: gcra::Admission::Allowed,
                remaining,
                reset_after: until_end,
                next_after: Some(until_end),
                wait: 0,
            },
            1,
        );
    }
    let t = ask.quota.t_ns();
    let accrued = now.saturating_sub(slot.shared_at) / t.max(1);
    let shared = slot.shared_left.saturating_add(accrued);
    let remaining = (slot.tokens - pending.min(slot.tokens))
        .saturating_add(shared)
        .min(depth);
    let params = Params::new(t, depth);
    Outcome::new(
        gcra::Admission::Allowed,
        (depth - remaining).saturating_mul(t),
        params,
        1,
    )
}

/// A request refused from the lease for `wait_ns`.
fn refused(ask: &Ask, wait_ns: u64) -> Outcome {
    if ask.algorithm.is_window() {
        return Outcome::window(
            window::Report {
                verdict: gcra::Admission::Denied {
                    retry_after: wait_ns.max(1),
                },
                remaining: 0,
                reset_after: wait_ns,
                next_after: Some(wait_ns),
                wait: 0,
            },
            1,
        );
    }
    super::cached_outcome(&ask.quota, ask.cost, wait_ns)
}

/// The status of an item decided by its lease.
pub(super) fn status(local: &Local) -> Status {
    match local {
        Local::Taken(o) | Local::Refused(o) => Status::Checked(*o),
        Local::Remote | Local::Wait => Status::Unchecked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(quota: Quota, lease: Lease) -> Ask {
        Ask {
            quota,
            algorithm: Algorithm::Gcra,
            lease,
            cost: 1,
        }
    }

    /// A lease decides an enforcing check of a positive cost, not a reservation, of GCRA
    /// or a fixed window; nothing else.
    #[test]
    fn a_lease_decides_enforced_checks_of_a_cost_without_a_wait_only() {
        let (gcra, none) = (Algorithm::Gcra, Duration::ZERO);
        assert!(LeaseTable::applies(Mode::Enforce, 1, none, gcra));
        assert!(LeaseTable::applies(
            Mode::Enforce,
            1,
            none,
            Algorithm::fixed_window()
        ));
        assert!(!LeaseTable::applies(Mode::Shadow, 1, none, gcra));
        assert!(!LeaseTable::applies(Mode::Enforce, 0, none, gcra));
        let wait = Duration::from_millis(1);
        assert!(!LeaseTable::applies(Mode::Enforce, 1, wait, gcra));
        let sliding = Algorithm::SlidingWindow;
        assert!(!LeaseTable::applies(Mode::Enforce, 1, none, sliding));
    }

    /// A table holds at most `max_keys` keys: past them, a new key (none idle to sweep) is
    /// decided by the backend, counted so, and given no slot; within them it gets one.
    #[test]
    fn past_its_keys_bound_a_table_sends_new_keys_to_the_backend() {
        let mut t = table();
        t.max_keys = 2;
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let now = 1_000_000_000;
        let held = |t: &LeaseTable, key: &Key| t.shard(key).slots.contains_key(key);
        for k in ["a", "b"] {
            let key = Key::from_part(k);
            t.decide(&key, a, now, Asking::Online);
            assert!(held(&t, &key), "{k}");
        }
        let remote = t.decisions().remote;
        let c = Key::from_part("c");
        let d = t.decide(&c, a, now, Asking::Online);
        assert!(matches!(d.local, Local::Remote) && d.take.is_none());
        assert!(!held(&t, &c));
        assert_eq!(t.decisions().remote, remote + 1);
        assert_eq!(t.keys.load(Ordering::Relaxed), 2);
    }

    /// The store's lease counts are those of the tables gone plus those of the live ones,
    /// each count its own.
    #[test]
    fn the_lease_counts_add_the_tables_gone_to_the_live_ones() {
        let mut live = Decisions {
            local_allowed: 1,
            local_refused: 2,
            remote: 3,
        };
        live.add(Decisions {
            local_allowed: 10,
            local_refused: 20,
            remote: 30,
        });
        let counters = Counters::default();
        counters.absorb(Decisions {
            local_allowed: 100,
            local_refused: 200,
            remote: 300,
        });
        let s = counters.snapshot(live);
        assert_eq!(
            (s.local_allowed, s.local_refused, s.remote),
            (111, 222, 333)
        );
    }

    #[test]
    fn a_lease_is_sized_by_the_instances_rate_within_its_cap() {
        let a = ask(Quota::per_second(1_000).burst(1_000), Lease::tokens(100));
        // First request: nothing known but one request, counted over the shortest
        // measure (10 ms): a tenth of a lease, not a whole one.
        let mut slot = Slot {
            demand: 1,
            ..Slot::default()
        };
        assert_eq!(want(&slot, &a, 0), Some((10, 5)));
        // 10 requests in 10 ms: 100 per 100 ms.
        slot.demand = 10;
        assert_eq!(want(&slot, &a, 10_000_000), Some((100, 50)));
        // 5 in 50 ms: 10 per 100 ms.
        slot.demand = 5;
        assert_eq!(want(&slot, &a, 50_000_000), Some((10, 5)));
        // Never above the cap less what is held.
        slot.demand = 1_000;
        slot.tokens = 30;
        assert_eq!(want(&slot, &a, 1_000_000), Some((70, 35)));
        // No more than the shared bucket is likely to have (60 left 1 ms ago: 61 now)...
        slot.tokens = 0;
        slot.shared_left = 60;
        slot.shared_at = 9_000_000;
        assert_eq!(want(&slot, &a, 10_000_000), Some((61, 50)));
        // ...but never under half of what the rate asks for.
        slot.shared_left = 2;
        assert_eq!(want(&slot, &a, 10_000_000), Some((50, 50)));
    }

    #[test]
    fn with_cost_above_one_an_instance_never_holds_more_than_the_cap() {
        // Cap 10; 7 held: a request of cost 4 would need 11 held, so no lease is taken
        // (the request is checked in the backend as usual).
        let a = Ask {
            cost: 4,
            ..ask(Quota::per_second(1_000).burst(80), Lease::tokens(10))
        };
        let slot = Slot {
            demand: 1_000,
            tokens: 7,
            ..Slot::default()
        };
        assert_eq!(want(&slot, &a, 10_000_000), None);
        // 6 held: 4 fit, and no more.
        let slot = Slot { tokens: 6, ..slot };
        assert_eq!(want(&slot, &a, 10_000_000), Some((4, 4)));
    }

    #[test]
    fn near_exhaustion_a_gcra_lease_is_a_reservation_spent_as_its_tokens_come_due() {
        let a = ask(Quota::per_second(1_000).burst(1_000), Lease::tokens(100)); // T = 1 ms
        let mut slot = Slot {
            demand: 10,
            ..Slot::default()
        };
        // Not exhausted: only the tokens the bucket has now.
        assert_eq!(
            start(&mut slot, &a, 10_000_000).unwrap().max_wait,
            Duration::ZERO
        );
        // Exhausted: a reservation of up to the lease's age.
        slot.exhausted = true;
        assert_eq!(
            start(&mut slot, &a, 10_000_000).unwrap().max_wait,
            Duration::from_secs(1)
        );
        // ...but never for a fixed window, whose reserved units would count in a later
        // window.
        let window = Ask {
            algorithm: Algorithm::fixed_window(),
            ..a
        };
        assert_eq!(
            start(&mut slot, &window, 10_000_000).unwrap().max_wait,
            Duration::ZERO
        );

        // 10 tokens, the last due at 20 ms: the 10th at 20, the 1st at 11 ms.
        let t = 1_000_000;
        slot.tokens = 10;
        slot.due[1] = Due {
            at: 20_000_000,
            batch: 10,
        };
        assert_eq!(pending(&slot, t, 10_000_000), 10);
        assert_eq!(pending(&slot, t, 10_500_000), 10);
        assert_eq!(pending(&slot, t, 11_000_000), 9);
        assert_eq!(slot.due[1].first_pending(t, 11_000_000), Some(12_000_000));
        assert_eq!(pending(&slot, t, 19_999_999), 1);
        assert_eq!(pending(&slot, t, 20_000_000), 0);
        assert_eq!(slot.due[1].first_pending(t, 20_000_000), None);
        // Tokens held from before the reservation are due already.
        slot.tokens = 15;
        assert_eq!(pending(&slot, t, 10_000_000), 10);
        // An older reservation, 5 tokens due by 8 ms (others queued between): each counts
        // on its own schedule.
        slot.due[0] = Due {
            at: 8_000_000,
            batch: 5,
        };
        assert_eq!(pending(&slot, t, 5_000_000), 13);
        assert_eq!(pending(&slot, t, 8_000_000), 10);
        // Never more than are held (some were given back).
        slot.tokens = 4;
        assert_eq!(pending(&slot, t, 10_000_000), 4);
    }

    #[test]
    fn an_allowed_local_outcome_reports_the_lease_and_the_shared_tokens() {
        let a = ask(Quota::per_second(10), Lease::tokens(5)); // T = 100 ms, burst 10
        let slot = Slot {
            tokens: 3,
            shared_left: 2,
            shared_at: 1_000_000_000,
            ..Slot::default()
        };
        let o = allowed(&a, &slot, 0, 1_100_000_000);
        assert!(o.is_allowed());
        assert_eq!(o.wait(), Duration::ZERO);
        // 3 here, 2 + 1 (100 ms) there.
        assert_eq!(o.remaining(), 6);
        // Two of the 3 reserved, not due yet: only the one due counts here.
        let o = allowed(&a, &slot, 2, 1_100_000_000);
        assert_eq!(o.remaining(), 4);
        // Never fewer than none here, whatever is pending.
        let o = allowed(&a, &slot, 5, 1_100_000_000);
        assert_eq!(o.remaining(), 3);
    }

    /// A backend whose calls never answer: the tests settle lease calls themselves.
    struct Never;

    impl Remote for Never {
        fn call(&self, _: Op, _: &Key, _: Quota, _: Algorithm, _: u32, _: Duration) -> RemoteCall {
            Box::pin(std::future::pending())
        }
    }

    fn table() -> LeaseTable {
        LeaseTable::new(
            Box::new(Never),
            Arc::default(),
            Arc::default(),
            SharedClock::default(),
            Duration::from_millis(50),
        )
    }

    /// What a GCRA bucket of `quota` with `spent` tokens gone answers a check of `cost` at
    /// `now` (ns).
    fn answer(quota: Quota, spent: u64, cost: u64, now: u64) -> Outcome {
        let params = Params::new(quota.t_ns(), quota.burst_size());
        let r = gcra::check(params, now + spent * quota.t_ns(), now, cost);
        Outcome::new(r.verdict, r.reset_after, params, 1)
    }

    /// The answer to the lease call `take`: `outcome` (`None`: the call failed), sent at
    /// `sent_at`, answered at `answered_at`; `last`: no second call follows.
    fn reply(
        take: Take,
        sent_at: u64,
        answered_at: u64,
        outcome: Option<Outcome>,
        last: bool,
    ) -> Answer {
        Answer {
            asked: take.tokens,
            generation: take.generation,
            sent_at,
            answered_at,
            outcome,
            last,
        }
    }

    /// A fresh table whose key "k" has made its first request of `a` at `now`: the table,
    /// the key and the lease call that request started.
    fn first_lease(a: Ask, now: u64) -> (LeaseTable, Key, Take) {
        let t = table();
        let key = Key::from_part("k");
        let take = t
            .decide(&key, a, now, Asking::Online)
            .take
            .expect("a lease call");
        (t, key, take)
    }

    /// Settles the lease call `take` of `key`, sent at `sent_at`, with `outcome`.
    fn settle(t: &LeaseTable, key: &Key, a: Ask, take: Take, sent_at: u64, outcome: Outcome) {
        let call = reply(take, sent_at, sent_at, Some(outcome), true);
        assert_eq!(t.settle(key, a, call), (None, None));
    }

    fn slot<R>(t: &LeaseTable, key: &Key, f: impl FnOnce(&mut Slot) -> R) -> R {
        f(t.shard(key).slots.get_mut(key).expect("a slot"))
    }

    /// A key near exhaustion: its first lease call (at 1 s) found the bucket empty.
    fn exhausted(t: &LeaseTable, key: &Key, a: Ask) {
        let now = 1_000_000_000;
        let d = t.decide(key, a, now, Asking::Online);
        assert!(matches!(d.local, Local::Wait));
        let take = d.take.expect("a lease call");
        settle(
            t,
            key,
            a,
            take,
            now,
            answer(a.quota, a.quota.burst_size(), take.tokens, now),
        );
        assert!(slot(t, key, |s| s.exhausted && s.refused_until > now));
    }

    /// Spending a lease below its low-water mark (a quarter of it) asks for the next one
    /// before the tokens run out, once: no second call while that one is on its way.
    #[test]
    fn spending_a_lease_below_its_low_water_mark_takes_the_next_one_before_it_runs_out() {
        let t = table();
        let key = Key::from_part("k");
        let a = ask(Quota::per_second(1_000).burst(1_000), Lease::tokens(100));
        let now = 1_000_000_000;
        let d = t.decide(&key, a, now, Asking::Online);
        assert!(matches!(d.local, Local::Wait));
        let take = d.take.expect("a lease call");
        settle(&t, &key, a, take, now, answer(a.quota, 0, take.tokens, now));
        let (held, low_water) = slot(&t, &key, |s| (s.tokens, s.low_water));
        assert!(
            held > 1 && low_water > 0 && low_water < held,
            "{held} {low_water}"
        );
        let mut next = None;
        for i in 1..=held {
            let d = t.decide(&key, a, now, Asking::Online);
            assert!(
                matches!(d.local, Local::Taken(_)),
                "request {i} spends the lease"
            );
            if let Some(take) = d.take {
                assert!(next.is_none(), "request {i}: one call on its way at a time");
                next = Some((i, take));
            }
        }
        let (i, _) = next.expect("the next lease taken before the tokens ran out");
        assert_eq!(held - i, low_water - 1, "taken on going below the mark");
    }

    #[test]
    fn a_request_the_lease_cannot_hold_goes_to_the_backend_even_near_exhaustion() {
        let t = table();
        let key = Key::from_part("k");
        let a = ask(Quota::per_second(100).burst(100), Lease::auto()); // L = 12
        exhausted(&t, &key, a);
        let now = 1_001_000_000;
        let until = slot(&t, &key, |s| s.refused_until);
        match t.decide(&key, a, now, Asking::Online).local {
            // Refused until the lease's tokens are back: retry then.
            Local::Refused(o) => {
                assert_eq!(o.retry_after(), Some(Duration::from_nanos(until - now)));
            }
            _ => panic!("refused here near exhaustion"),
        }
        // Cost 20 > L: no lease could ever bring it, so the backend decides, at once.
        let costly = Ask { cost: 20, ..a };
        let remote = t.decisions().remote;
        for mode in [Asking::Online, Asking::Waited, Asking::Offline] {
            let d = t.decide(&key, costly, now, mode);
            assert!(matches!(d.local, Local::Remote) && d.take.is_none());
        }
        assert_eq!(t.decisions().remote, remote + 3, "each counted as remote");
        // Cost 12 = L: a lease can hold it, so it is the lease's, refused here like the rest.
        let whole = Ask { cost: 12, ..a };
        assert!(matches!(
            t.decide(&key, whole, now, Asking::Online).local,
            Local::Refused(_)
        ));
        // ...and it does not keep the key: the sweep forgets it after a second.
        let used_at = slot(&t, &key, |s| s.used_at);
        assert_eq!(used_at, 1_001_000_000);
        let other = Key::from_part("other");
        t.decide(&other, costly, now, Asking::Online);
        assert!(
            !t.shard(&other).slots.contains_key(&other),
            "a slot for nothing"
        );

        // Cost 8 with a cap of 10 and 7 held (3 not due yet): a lease of the rest would
        // hold 15, so the backend decides, though the key is refused here for a while
        // (before: refused here until the tokens held went back).
        let a = Ask {
            cost: 8,
            ..ask(Quota::per_second(1_000).burst(80), Lease::tokens(10))
        };
        let key = Key::from_part("held");
        // A bucket full in 80 ms: requests wait for a lease only if it usually comes
        // within 40 ms (see `far_leases_hold_no_request`).
        t.patience(Duration::from_millis(1));
        exhausted(&t, &key, a);
        let now = 2_000_000_000;
        slot(&t, &key, |s| {
            s.tokens = 7;
            s.expires = u64::MAX;
            s.refused_until = now + 1_000_000;
            s.due[1] = Due {
                at: now + 3_000_000,
                batch: 3,
            };
        });
        let remote = t.decisions().remote;
        let d = t.decide(&key, a, now, Asking::Online);
        assert!(matches!(d.local, Local::Remote) && d.take.is_none());
        assert_eq!(t.decisions().remote, remote + 1);
        // Cost 10 on a key holding nothing: a lease of it holds exactly the cap, so it is
        // taken, and the request waits for it.
        let whole = Ask { cost: 10, ..a };
        let d = t.decide(&Key::from_part("whole"), whole, now, Asking::Online);
        assert!(matches!(d.local, Local::Wait) && d.take.is_some());
        // Cost 8 with exactly 8 held (all due): spent from the lease, though a lease of
        // the rest could not hold another 8.
        let eight = Key::from_part("eight");
        exhausted(&t, &eight, a);
        slot(&t, &eight, |s| {
            s.tokens = 8;
            s.expires = u64::MAX;
            s.refused_until = 0;
            s.exhausted = false;
            s.due = [Due::default(); 2];
        });
        let d = t.decide(&eight, a, now, Asking::Online);
        assert!(matches!(d.local, Local::Taken(_)));
        // Cost 1 is still the lease's: refused here until then, then spent from it.
        let one = Ask { cost: 1, ..a };
        assert!(matches!(
            t.decide(&key, one, now, Asking::Online).local,
            Local::Refused(_)
        ));
        let later = now + 1_000_000;
        assert!(matches!(
            t.decide(&key, one, later, Asking::Online).local,
            Local::Taken(_)
        ));
    }

    #[test]
    fn near_exhaustion_ends_when_an_answer_shows_a_batch_or_the_bucket_had_time_to_refill() {
        let t = table();
        let key = Key::from_part("k");
        let quota = Quota::per_second(100).burst(100); // T = 10 ms: full in 1 s
        let a = ask(quota, Lease::auto());
        exhausted(&t, &key, a);
        let min_batch = slot(&t, &key, |s| s.min_batch);
        assert!(min_batch >= 1);
        // An answer sent before the lease call's says nothing new; one under another
        // quota neither; fewer than a batch left: still near exhaustion.
        t.observe(
            &key,
            &quota,
            999_000_000,
            &answer(quota, 0, 20, 999_000_000),
        );
        t.observe(
            &key,
            &Quota::per_second(10),
            1_100_000_000,
            &answer(quota, 0, 20, 0),
        );
        let few = answer(quota, 100 - min_batch - 20 + 1, 20, 1_100_000_000);
        assert_eq!(few.remaining(), min_batch - 1);
        t.observe(&key, &quota, 1_100_000_000, &few);
        assert!(slot(&t, &key, |s| s.exhausted && s.refused_until > 0));
        // A batch left after a request the backend decided: the lease asks again at once,
        // as a lease of what the bucket has, not a reservation, and nothing is refused.
        let back = answer(quota, 100 - min_batch - 20, 20, 1_200_000_000);
        assert_eq!(back.remaining(), min_batch);
        t.observe(&key, &quota, 1_200_000_000, &back);
        assert!(slot(&t, &key, |s| !s.exhausted && s.refused_until == 0));
        assert_eq!(slot(&t, &key, |s| s.shared_left), min_batch);
        let d = t.decide(&key, a, 1_200_100_000, Asking::Online);
        assert!(matches!(d.local, Local::Wait));
        assert_eq!(d.take.expect("a lease call").max_wait, Duration::ZERO);

        // Nothing heard: the time a refill of the whole bucket takes (1 s) after the
        // last answer.
        let key = Key::from_part("quiet");
        exhausted(&t, &key, a);
        let waited = |now| t.decide(&key, a, now, Asking::Waited).local;
        let refused = t.decisions().local_refused;
        assert!(matches!(waited(1_999_000_000), Local::Refused(_)));
        assert_eq!(t.decisions().local_refused, refused + 1, "counted");
        assert!(slot(&t, &key, |s| s.exhausted));
        assert!(matches!(waited(2_000_000_000), Local::Remote));
        assert!(slot(&t, &key, |s| !s.exhausted));
    }

    /// A request waits for a lease on its way only while fewer than `MAX_WAITING` wait for
    /// one: the next asks the backend, counted as the backend's. A check that waited for a
    /// lease in vain is counted as the backend's too.
    #[test]
    fn past_the_waiting_bound_a_request_asks_the_backend_counted_so() {
        let t = table();
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let key = Key::from_part("k");
        let now = 1_000_000_000;
        let d = t.decide(&key, a, now, Asking::Online);
        assert!(matches!(d.local, Local::Wait) && d.take.is_some());
        t.waiting.store(MAX_WAITING - 1, Ordering::Relaxed);
        assert!(matches!(
            t.decide(&key, a, now, Asking::Online).local,
            Local::Wait
        ));
        t.waiting.store(MAX_WAITING, Ordering::Relaxed);
        let remote = t.decisions().remote;
        let d = t.decide(&key, a, now, Asking::Online);
        assert!(matches!(d.local, Local::Remote) && d.take.is_none());
        assert_eq!(t.decisions().remote, remote + 1, "counted as the backend's");
        t.count_remote(&key);
        assert_eq!(t.decisions().remote, remote + 2, "a waited check, counted");
    }

    /// Undoing a request's decision gives its tokens back to the lease, whatever its cost,
    /// and takes it out of the local grants.
    #[test]
    fn an_undone_request_gives_its_tokens_back_to_the_lease() {
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let now = 1_000_000_000;
        let (t, key, take) = first_lease(a, now);
        settle(&t, &key, a, take, now, answer(a.quota, 0, take.tokens, now));
        let held = slot(&t, &key, |s| s.tokens);
        assert!(held >= 3, "{held}");
        let three = Ask { cost: 3, ..a };
        let allowed = t.decisions().local_allowed;
        let d = t.decide(&key, three, now, Asking::Online);
        assert!(matches!(d.local, Local::Taken(_)));
        assert_eq!(slot(&t, &key, |s| s.tokens), held - 3);
        assert_eq!(t.decisions().local_allowed, allowed + 1);
        t.undo(&key, 3);
        assert_eq!(slot(&t, &key, |s| s.tokens), held, "all 3 back");
        assert_eq!(t.decisions().local_allowed, allowed);
    }

    /// A lease granted in full leaves the key near exhaustion when the bucket is left with
    /// less than another such lease, not when it is left with exactly one.
    #[test]
    fn a_lease_leaving_less_than_another_lease_in_the_bucket_is_near_exhaustion() {
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let now = 1_000_000_000;
        let after = |spent_before: u64| {
            let (t, key, take) = first_lease(a, now);
            let outcome = answer(a.quota, spent_before, take.tokens, now);
            let call = reply(take, now, now, Some(outcome), false);
            assert_eq!(t.settle(&key, a, call), (None, None));
            (
                take.tokens,
                outcome.remaining(),
                slot(&t, &key, |s| s.exhausted),
            )
        };
        let n = after(0).0;
        assert!(n >= 1 && 2 * n <= 100, "{n}");
        assert_eq!(
            after(100 - 2 * n),
            (n, n, false),
            "exactly another lease left"
        );
        assert_eq!(
            after(100 - 2 * n + 1),
            (n, n - 1, true),
            "one token short of it"
        );
    }

    /// A lease granted at once (no reservation) lasts its age from the call's send, holds
    /// no tokens due later, and halves the key's backoff.
    #[test]
    fn a_lease_granted_at_once_lasts_from_its_send_and_halves_the_backoff() {
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let now = 1_000_000_000;
        let (t, key, take) = first_lease(a, now);
        slot(&t, &key, |s| s.backoff = 8);
        let outcome = answer(a.quota, 0, take.tokens, now);
        assert!(outcome.is_allowed() && outcome.wait().is_zero());
        let call = reply(take, now, now + 30_000_000, Some(outcome), false);
        assert_eq!(t.settle(&key, a, call), (None, None));
        let age = duration_ns(a.lease.age());
        slot(&t, &key, |s| {
            assert_eq!(s.backoff, 4);
            assert_eq!(s.expires, now + age, "from the send");
            assert_eq!(s.due, [Due::default(); 2], "nothing due later");
            assert_eq!(s.tokens, take.tokens);
        });
    }

    /// A lease the bucket cannot fill, but with at least a batch left, takes what is left
    /// in a second call (the key stays `taking`); the second call's answer, or fewer than
    /// a batch left, ends it near exhaustion.
    #[test]
    fn a_lease_the_bucket_cannot_fill_takes_what_is_left_in_a_second_call() {
        // A first request asks for 10 tokens (100 ms of its demand), worth a call at 5.
        let a = ask(Quota::per_second(100).burst(100), Lease::tokens(40));
        let now = 1_000_000_000;
        let partial = |left: u64, last: bool| {
            let (t, key, take) = first_lease(a, now);
            assert_eq!(take.tokens, 10);
            assert_eq!(slot(&t, &key, |s| s.min_batch), 5);
            let outcome = answer(a.quota, 100 - left, take.tokens, now);
            assert!(!outcome.is_allowed() && outcome.remaining() == left);
            let call = reply(take, now, now, Some(outcome), last);
            let again = t.settle(&key, a, call).0;
            let (taking, exhausted) = slot(&t, &key, |s| (s.taking, s.exhausted));
            (again, taking, exhausted)
        };
        assert_eq!(partial(5, false), (Some(5), true, false), "a batch left");
        assert_eq!(partial(9, false), (Some(9), true, false));
        assert_eq!(partial(5, true), (None, false, true), "the second call");
        assert_eq!(partial(4, false), (None, false, true), "under a batch");
    }

    /// A lease refused by an empty bucket refuses the key here until a batch is likely
    /// back, times a backoff that doubles with each refusal up to 8, and never for more
    /// than three quarters of the time the bucket takes to fill.
    #[test]
    fn a_refused_lease_backs_off_doubling_up_to_three_quarters_of_a_refill() {
        // 100/s with a burst of 20: full in 200 ms. A first request asks for 10 tokens,
        // worth a call at 5: a batch is back 50 ms after the bucket was empty.
        let a = ask(Quota::per_second(100).burst(20), Lease::tokens(20));
        let now = 1_000_000_000;
        let refused_after = |backoff: u64| {
            let (t, key, take) = first_lease(a, now);
            assert_eq!((take.tokens, slot(&t, &key, |s| s.min_batch)), (10, 5));
            slot(&t, &key, |s| s.backoff = backoff);
            let empty = answer(a.quota, 20, take.tokens, now);
            assert_eq!(empty.remaining(), 0);
            settle(&t, &key, a, take, now, empty);
            slot(&t, &key, |s| {
                (s.backoff, (s.refused_until - now) / 1_000_000)
            })
        };
        assert_eq!(refused_after(0), (2, 100), "50 ms, twice");
        assert_eq!(refused_after(1), (2, 100));
        assert_eq!(refused_after(2), (4, 150), "200 ms: at most 150 ms");
        assert_eq!(refused_after(8), (8, 150), "8 at most");
    }

    /// The sweep forgets a key only when it holds nothing: no tokens, no lease call on its
    /// way, no refusal running, and no use for a second.
    #[test]
    fn the_sweep_forgets_only_keys_that_hold_nothing() {
        let t = table();
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let at = 1_000_000_000;
        let now = at + 5_000_000_000;
        let keys = [
            "tokens",
            "taking",
            "refused",
            "used lately",
            "idle",
            "idle exactly a second",
            "refused until now",
        ];
        for name in keys {
            let key = Key::from_part(name);
            t.decide(&key, a, at, Asking::Online);
            slot(&t, &key, |s| {
                s.taking = false;
                s.expires = u64::MAX;
                match name {
                    "tokens" => s.tokens = 3,
                    "taking" => s.taking = true,
                    "refused" => s.refused_until = now + 1,
                    "used lately" => s.used_at = now - IDLE_NS + 1,
                    "idle exactly a second" => s.used_at = now - IDLE_NS,
                    "refused until now" => s.refused_until = now,
                    _ => {}
                }
            });
        }
        assert_eq!(t.keys.load(Ordering::Relaxed), keys.len());
        t.sweep_idle(now);
        let kept: Vec<&str> = keys
            .into_iter()
            .filter(|k| {
                let key = Key::from_part(*k);
                t.shard(&key).slots.contains_key(&key)
            })
            .collect();
        assert_eq!(kept, ["tokens", "taking", "refused", "used lately"]);
        assert_eq!(t.keys.load(Ordering::Relaxed), 4);
    }

    /// The store's tables count their keys together (the bound is the store's): a table
    /// dropped takes its keys out of the count, and leaves the other tables' in.
    #[test]
    fn a_dropped_table_takes_its_keys_out_of_the_stores_count() {
        let keys = Arc::new(AtomicUsize::new(0));
        let new = || {
            LeaseTable::new(
                Box::new(Never),
                keys.clone(),
                Arc::default(),
                SharedClock::default(),
                Duration::from_millis(50),
            )
        };
        let (t, other) = (new(), new());
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let now = 1_000_000_000;
        for k in ["a", "b", "c"] {
            t.decide(&Key::from_part(k), a, now, Asking::Online);
        }
        other.decide(&Key::from_part("d"), a, now, Asking::Online);
        assert_eq!(keys.load(Ordering::Relaxed), 4);
        drop(t);
        assert_eq!(keys.load(Ordering::Relaxed), 1, "the other table's key");
        drop(other);
        assert_eq!(keys.load(Ordering::Relaxed), 0);
    }

    /// A fixed window's bucket is back once the window of the last answer has ended (or
    /// the refusal, if it ends later); a GCRA bucket once it had time to fill after the
    /// last answer. A slot that heard no answer knows of neither.
    #[test]
    fn a_bucket_is_back_after_its_window_or_a_whole_refill() {
        let gcra = ask(Quota::per_second(10), Lease::auto()); // full in 1 s
        let window = Ask {
            algorithm: Algorithm::fixed_window(),
            ..gcra
        };
        let mut s = Slot::default();
        assert!(!refilled(&s, &window, 5));
        assert!(!refilled(&s, &gcra, u64::MAX));
        s.window_end = 100;
        assert!(!refilled(&s, &window, 99));
        assert!(refilled(&s, &window, 100));
        s.refused_until = 200;
        assert!(!refilled(&s, &window, 150));
        assert!(refilled(&s, &window, 200));
        s.shared_at = 1_000_000_000;
        assert!(!refilled(&s, &gcra, 1_999_999_999));
        assert!(refilled(&s, &gcra, 2_000_000_000));
    }

    /// Waiting for the lease of a key with no call on its way ends at once (a key unknown
    /// here, or whose call was settled): nothing would wake it before its deadline.
    #[test]
    fn waiting_on_a_key_with_no_lease_call_on_its_way_ends_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let a = ask(Quota::per_second(100).burst(100), Lease::auto());
            let now = 1_000_000_000;
            let (t, key, take) = first_lease(a, now);
            settle(&t, &key, a, take, now, answer(a.quota, 0, take.tokens, now));
            assert!(slot(&t, &key, |s| !s.taking));
            let start = tokio::time::Instant::now();
            let deadline = start + Duration::from_secs(1);
            t.wait(&key, deadline).await;
            t.wait(&Key::from_part("unknown"), deadline).await;
            assert_eq!(start.elapsed(), Duration::ZERO);
        });
    }

    /// Issue 41: a settled lease call wakes the requests waiting for its key, not every
    /// waiter of the table.
    #[test]
    fn a_settled_lease_call_wakes_the_waiters_of_its_key_only() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let t = Arc::new(table());
            let a = ask(Quota::per_second(100).burst(100), Lease::auto());
            let now = 1_000_000_000;
            let keys: Vec<Key> = (0..10).map(|i| Key::from_part(format!("k{i}"))).collect();
            let takes: Vec<Take> = keys
                .iter()
                .map(|k| {
                    let d = t.decide(k, a, now, Asking::Online);
                    assert!(matches!(d.local, Local::Wait));
                    d.take.expect("a lease call")
                })
                .collect();
            // A waiter per key, counting how often it is polled.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
            let waiters: Vec<(Arc<AtomicUsize>, tokio::task::JoinHandle<()>)> = keys
                .iter()
                .map(|k| {
                    let polls = Arc::new(AtomicUsize::new(0));
                    let (t, k, p) = (t.clone(), k.clone(), polls.clone());
                    let mut wait = Box::pin(async move { t.wait(&k, deadline).await });
                    let task = tokio::spawn(std::future::poll_fn(move |cx| {
                        p.fetch_add(1, Ordering::SeqCst);
                        wait.as_mut().poll(cx)
                    }));
                    (polls, task)
                })
                .collect();
            let settle_all = || async {
                for _ in 0..10 {
                    tokio::task::yield_now().await
                }
            };
            settle_all().await;
            assert!(waiters.iter().all(|(p, _)| p.load(Ordering::SeqCst) == 1));
            // Keys 1..10 get their leases: each of their waiters is woken once; the waiter
            // of key 0 is not polled again (before: once per settled call of the table).
            for (k, take) in keys.iter().zip(&takes).skip(1) {
                settle(&t, k, a, *take, now, answer(a.quota, 0, take.tokens, now));
                settle_all().await;
            }
            for (polls, task) in &waiters[1..] {
                assert!(task.is_finished());
                assert_eq!(polls.load(Ordering::SeqCst), 2);
            }
            assert!(!waiters[0].1.is_finished());
            assert_eq!(
                waiters[0].0.load(Ordering::SeqCst),
                1,
                "woken by other keys"
            );
            // Its own call wakes it; a wait after the call is settled returns at once.
            settle(&t, &keys[0], a, takes[0], now, answer(a.quota, 0, 1, now));
            settle_all().await;
            assert!(waiters[0].1.is_finished());
            assert_eq!(waiters[0].0.load(Ordering::SeqCst), 2);
            assert_eq!(
                tokio::time::Instant::now(),
                deadline - Duration::from_secs(1)
            );
            t.wait(&keys[0], deadline).await;
        });
    }

    /// Issue 41, item 5: a lease call that timed out (settled as failed) and is answered
    /// after all holds its tokens here, as if it had come in time; one whose slot started
    /// afresh meanwhile gives them back; a refusal holds nothing.
    #[test]
    fn a_late_lease_answer_is_spent_here_or_given_back() {
        let t = table();
        let key = Key::from_part("k");
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let now = 1_000_000_000;
        let d = t.decide(&key, a, now, Asking::Online);
        let take = d.take.expect("a lease call");
        let failed = reply(take, now, now + 100_000_000, None, false);
        assert_eq!(t.settle(&key, a, failed), (None, None));
        assert!(slot(&t, &key, |s| !s.taking && s.tokens == 0));
        let late = |outcome| reply(take, now, now + 300_000_000, Some(outcome), false);
        // Refused there: nothing held, nothing to give back.
        let refused = answer(a.quota, 100, take.tokens, now);
        assert!(!refused.is_allowed());
        assert_eq!(t.late(&key, a, late(refused)), None);
        assert_eq!(slot(&t, &key, |s| s.tokens), 0);
        // Granted there: held here, and spent by the next requests without a call.
        let granted = answer(a.quota, 0, take.tokens, now);
        assert_eq!(t.late(&key, a, late(granted)), None);
        assert_eq!(slot(&t, &key, |s| s.tokens), take.tokens);
        // As if it had come in time: what the shared bucket had is known again.
        assert_eq!(slot(&t, &key, |s| s.shared_left), granted.remaining());
        let next = t.decide(&key, a, now + 300_000_000, Asking::Online);
        assert!(matches!(next.local, Local::Taken(_)));
        // Another lease on its way meanwhile: tokens due now still add up, and the call on
        // its way is still awaited (not settled by this answer).
        slot(&t, &key, |s| {
            s.taking = true;
            s.shared_left = 0;
        });
        assert_eq!(t.late(&key, a, late(granted)), None);
        assert_eq!(slot(&t, &key, |s| s.tokens), 2 * take.tokens - 1);
        assert!(slot(&t, &key, |s| s.taking && s.shared_left == 0));
        // A fixed window's units, with a lease on its way, are neither held nor given
        // back: they stay spent in their window.
        let window = Ask {
            algorithm: Algorithm::fixed_window(),
            ..a
        };
        assert_eq!(t.late(&key, window, late(granted)), None);
        assert_eq!(slot(&t, &key, |s| s.tokens), 2 * take.tokens - 1);
        // The slot started afresh (another generation): the tokens go back, and a fixed
        // window's units are never given back.
        slot(&t, &key, |s| s.generation += 1);
        assert_eq!(
            t.late(&key, a, late(granted)),
            Some((key.clone(), a.quota, a.algorithm, take.tokens))
        );
        assert_eq!(t.late(&key, window, late(granted)), None);
    }

    /// Issue 41, item 5: near exhaustion a key's requests are refused while its lease call
    /// is on its way, but only for the usual round trip: past it, the call is slow, and
    /// they ask the backend instead (which decides them exactly), not refused for as long
    /// as a slow reply takes.
    #[test]
    fn a_lease_call_past_the_usual_round_trip_sends_the_requests_to_the_backend() {
        let t = table();
        t.patience(Duration::from_millis(20));
        let key = Key::from_part("k");
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        exhausted(&t, &key, a);
        let after = slot(&t, &key, |s| s.refused_until);
        // The next lease call starts once the refusal is over.
        let d = t.decide(&key, a, after, Asking::Online);
        assert!(d.take.is_some(), "a lease call");
        assert!(matches!(d.local, Local::Refused(_)));
        let d = t.decide(&key, a, after + 20_000_000, Asking::Online);
        assert!(
            matches!(d.local, Local::Refused(_)),
            "within the usual round trip"
        );
        let remote = t.decisions().remote;
        let d = t.decide(&key, a, after + 20_000_001, Asking::Online);
        assert!(matches!(d.local, Local::Remote), "past it");
        assert!(d.take.is_none(), "no second lease call");
        assert_eq!(t.decisions().remote, remote + 1, "counted as the backend's");
    }

    /// A request is held for a lease on its way (waiting, or refused near exhaustion) only
    /// if the lease usually comes within half the time its GCRA bucket takes to fill;
    /// further off, the request asks the backend now (held, it would reach the bucket
    /// after tokens it could have had were lost to a full bucket). A fixed window's
    /// requests wait as before: a window loses nothing to a delay inside it.
    #[test]
    fn far_leases_hold_no_request() {
        // 1,000/s with a burst of 100: full in 100 ms.
        let gcra = ask(Quota::per_second(1_000).burst(100), Lease::auto());
        let window = Ask {
            algorithm: Algorithm::fixed_window(),
            ..gcra
        };
        for (usual_ms, held) in [(10, true), (50, true), (51, false), (300, false)] {
            for a in [gcra, window] {
                let t = table();
                t.patience(Duration::from_millis(usual_ms));
                let key = Key::from_part("k");
                let now = 1_000_000_000;
                let d = t.decide(&key, a, now, Asking::Online);
                assert!(d.take.is_some(), "a lease call");
                let held = held || a.algorithm.is_window();
                assert_eq!(
                    matches!(d.local, Local::Wait),
                    held,
                    "{usual_ms} ms, {:?}",
                    a.algorithm
                );
                if !held {
                    assert!(matches!(d.local, Local::Remote));
                    // Once the lease is due within half the fill time, requests wait.
                    let soon = now + (usual_ms - 50) * 1_000_000;
                    let d = t.decide(&key, a, soon, Asking::Online);
                    assert!(matches!(d.local, Local::Wait), "{usual_ms} ms, soon");
                }
            }
            if usual_ms == 300 {
                // Near exhaustion too: not refused here while the lease is far.
                let t = table();
                let key = Key::from_part("k");
                exhausted(&t, &key, gcra);
                t.patience(Duration::from_millis(usual_ms));
                let after = slot(&t, &key, |s| s.refused_until);
                let d = t.decide(&key, gcra, after, Asking::Online);
                assert!(d.take.is_some(), "a lease call");
                assert!(matches!(d.local, Local::Remote), "far");
                let d = t.decide(&key, gcra, after + 250_000_000, Asking::Online);
                assert!(matches!(d.local, Local::Refused(_)), "soon");
            }
        }
    }

    /// A key's first request, whenever it comes, asks for a tenth of a lease's worth (its
    /// rate measured from that request, over the shortest measure), not one token (a slot
    /// measured from the clock's zero).
    #[test]
    fn a_keys_first_lease_is_measured_from_its_first_request() {
        let t = table();
        let key = Key::from_part("k");
        let a = ask(Quota::per_second(1_000).burst(1_000), Lease::tokens(100));
        let d = t.decide(&key, a, 5_000_000_000, Asking::Online);
        assert_eq!(d.take.map(|t| t.tokens), Some(10));
    }

    /// A key whose quota changed and changed back starts a new generation each time: a
    /// lease call taken under the first quota answers into no slot, and its tokens go back.
    #[test]
    fn a_lease_call_from_before_a_quota_change_and_back_goes_back() {
        let t = table();
        let key = Key::from_part("k");
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let b = ask(Quota::per_second(50).burst(100), Lease::auto());
        let now = 1_000_000_000;
        let take = t
            .decide(&key, a, now, Asking::Online)
            .take
            .expect("a lease call");
        let _ = t.decide(&key, b, now + 1, Asking::Online);
        let _ = t.decide(&key, a, now + 2, Asking::Online);
        let call = reply(
            take,
            now,
            now + 3,
            Some(answer(a.quota, 0, take.tokens, now)),
            true,
        );
        assert_eq!(
            t.settle(&key, a, call),
            (None, Some((key.clone(), a.quota, a.algorithm, take.tokens)))
        );
        assert_eq!(slot(&t, &key, |s| s.tokens), 0);
    }

    /// A slot started afresh for a changed quota holds its tokens at the new quota at once:
    /// a lease taken before the key's next request still goes back (at that quota) when
    /// the sweep lets it go.
    #[test]
    fn a_slot_started_for_a_new_quota_gives_its_lease_back_at_that_quota() {
        let t = table();
        let key = Key::from_part("k");
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let b = ask(Quota::per_second(50).burst(100), Lease::auto());
        let now = 1_000_000_000;
        t.decide(&key, a, now, Asking::Online)
            .take
            .expect("a lease call");
        let take = t
            .decide(&key, b, now + 1, Asking::Online)
            .take
            .expect("a lease call for the new quota");
        settle(
            &t,
            &key,
            b,
            take,
            now + 1,
            answer(b.quota, 0, take.tokens, now + 1),
        );
        assert_eq!(slot(&t, &key, |s| s.tokens), take.tokens);
        assert_eq!(
            slot(&t, &key, |s| s.release(&key)),
            Some((key.clone(), b.quota, b.algorithm, take.tokens))
        );
    }

    /// Issue 41, item 5: a lease call that timed out holds off the next lease of its own
    /// slot (same quota, same generation), until it answers or its lease's age has passed.
    #[test]
    fn a_timed_out_lease_call_holds_off_the_next_lease_of_its_slot_only() {
        let t = table();
        let key = Key::from_part("k");
        let a = ask(Quota::per_second(100).burst(100), Lease::auto());
        let now = 1_000_000_000;
        let take = t
            .decide(&key, a, now, Asking::Online)
            .take
            .expect("a lease call");
        t.timed_out(&key, a, take.generation + 1, now);
        assert_eq!(slot(&t, &key, |s| s.late_until), 0, "another generation's");
        let other = ask(Quota::per_second(50).burst(100), Lease::auto());
        t.timed_out(&key, other, take.generation, now);
        assert_eq!(slot(&t, &key, |s| s.late_until), 0, "another quota's");
        t.timed_out(&key, a, take.generation, now);
        assert_eq!(slot(&t, &key, |s| s.late_until), now + 1_000_000_000);
        let failed = reply(take, now, now + 100_000_000, None, false);
        assert_eq!(t.settle(&key, a, failed), (None, None));
        let d = t.decide(&key, a, now + 500_000_000, Asking::Online);
        assert!(d.take.is_none(), "held off while the late call may answer");
        assert!(matches!(d.local, Local::Remote));
        // Another generation's refusal says nothing of this call.
        let other = Answer {
            asked: take.tokens,
            generation: take.generation + 1,
            sent_at: now,
            answered_at: now + 600_000_000,
            outcome: Some(answer(a.quota, 100, take.tokens, now)),
            last: false,
        };
        assert_eq!(t.late(&key, a, other), None);
        assert_eq!(slot(&t, &key, |s| s.late_until), now + 1_000_000_000);
        // It answers, refused: nothing held, and the next lease may start.
        let refused = reply(
            take,
            now,
            now + 600_000_000,
            Some(answer(a.quota, 100, take.tokens, now)),
            false,
        );
        assert_eq!(t.late(&key, a, refused), None);
        assert_eq!(slot(&t, &key, |s| s.late_until), 0);
        let again = t
            .decide(&key, a, now + 600_000_000, Asking::Online)
            .take
            .expect("a lease call once the late one answered");
        // That one times out too, and never answers: held off for its lease's age.
        let sent = now + 600_000_000;
        t.timed_out(&key, a, again.generation, sent);
        slot(&t, &key, |s| s.taking = false);
        assert!(
            t.decide(&key, a, sent + 999_000_000, Asking::Online)
                .take
                .is_none()
        );
        let d = t.decide(&key, a, sent + 1_000_000_001, Asking::Online);
        assert!(d.take.is_some(), "its lease's age has passed");
    }
}
