//! Top refused keys per limit: a bounded heavy-hitter summary (Space-Saving, Metwally,
//! Agrawal and El Abbadi, ICDT 2005), sharded so that it is not the contention point
//! under attack.
//!
//! Each limit that tracks offenders has [`SHARDS`] small summaries; a key always goes to
//! the same shard (by a hash of the key), so each shard is an exact Space-Saving summary of
//! its part of the stream and the shards never hold the same key: merging them is a union.
//! A refusal takes its shard's lock with `try_lock` and, if another thread holds it, is
//! not counted (a sample is dropped rather than a request made to wait): under a flood
//! the heavy hitters are the keys that keep coming, so they keep being counted.
//!
//! Under a flood even an uncontended lock is a cache line that two cores pass back and
//! forth for every refusal of the same hot key, so each thread samples: while it refuses
//! more than [`FLOOD_RATE`] requests a second, it counts one refusal in [`STRIDE`], with
//! weight [`STRIDE`] (weighted Space-Saving keeps its guarantees, in units of the
//! weight). Below that rate every refusal is counted exactly.
//!
//! Memory is fixed at build time: `capacity` counters per limit (each a [`Key`], two
//! counts and an index entry, about 100 bytes).

use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError, TryLockError};
use std::time::Duration;

use hashbrown::HashTable;

use crate::web::key::Key;

/// Shards per limit.
pub(crate) const SHARDS: usize = 8;
/// Refusals per second and thread above which a thread samples.
pub(crate) const FLOOD_RATE: u64 = 25_600;
/// Under a flood, one refusal in `STRIDE` is counted, with this weight.
pub(crate) const STRIDE: u32 = 16;
/// Refusals between two looks at the clock.
const WINDOW: u32 = 256;

thread_local! {
    /// This thread's refusals counted, its stride, and when its window started (ms).
    static SAMPLER: std::cell::Cell<(u32, u32, u64)> = const { std::cell::Cell::new((0, 1, 0)) };
}

/// The weight of this refusal in the summaries, or `None` if the thread's sampling leaves
/// it out. One clock read per [`WINDOW`] refusals.
pub(crate) fn sample() -> Option<u64> {
    SAMPLER.with(|s| {
        let (mut n, mut stride, mut start) = s.get();
        n = n.wrapping_add(1);
        if n % WINDOW == 0 {
            let now = crate::base::throttle::now_ms();
            let fast = now.saturating_sub(start) * FLOOD_RATE < u64::from(WINDOW) * 1_000;
            stride = if fast { STRIDE } else { 1 };
            start = now;
        }
        s.set((n, stride, start));
        (n % stride == 0).then_some(u64::from(stride))
    })
}

/// How a layer keeps its top refused keys (see
/// [`RateLimitBuilder::track_offenders`](crate::RateLimitBuilder::track_offenders)).
///
/// ```
/// use std::time::Duration;
/// use tollgate::OffenderTracking;
///
/// let tracking = OffenderTracking::new()
///     .capacity(1_000)
///     .report_every(Some(Duration::from_secs(60)));
/// # let _ = tracking;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffenderTracking {
    pub(crate) capacity: usize,
    pub(crate) report_every: Option<Duration>,
    pub(crate) report_top: usize,
}

impl Default for OffenderTracking {
    fn default() -> Self {
        Self::new()
    }
}

impl OffenderTracking {
    /// 1,000 counters per limit; a report of the top 10 every minute while refusals happen.
    pub const fn new() -> Self {
        Self {
            capacity: 1_000,
            report_every: Some(Duration::from_secs(60)),
            report_top: 10,
        }
    }

    /// Counters per limit (default 1,000, at least 8). A key refused more than
    /// `1 / capacity` of the time (within its shard's share of the stream) is always in the
    /// summary; its count is an upper bound, off by at most its `error`.
    pub const fn capacity(mut self, counters: usize) -> Self {
        self.capacity = if counters < SHARDS { SHARDS } else { counters };
        self
    }

    /// Logs the top keys of a limit (`INFO`, target `tollgate::offenders`) at most this
    /// often, on a refusal of that limit (default: every minute). `None`: never.
    pub const fn report_every(mut self, every: Option<Duration>) -> Self {
        self.report_every = every;
        self
    }

    /// How many keys a report names (default 10).
    pub const fn report_top(mut self, n: usize) -> Self {
        self.report_top = n;
        self
    }
}

/// One entry of [`Limiter::top_refused`](crate::Limiter::top_refused).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RefusedKey {
    /// The key as the stores render it (`@203.0.113.7`, `@[2001:db8::]/56`, `user%3A42`), or, if
    /// the layer redacts keys, `#` and 16 hex digits of a hash that is the same in every
    /// process (pseudonymous: an address can be found by hashing candidates).
    pub key: String,
    /// Refusals counted for the key: an upper bound of the true count.
    pub count: u64,
    /// How much of `count` may belong to keys this one replaced in the summary: the true
    /// count is at least `count - error`.
    pub error: u64,
}

impl fmt::Display for RefusedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.count)
    }
}

/// The hash of a key in logs and summaries when keys are redacted.
pub(crate) fn redacted(key: &Key) -> String {
    format!("#{:016x}", key.stable_hash())
}

/// Renders a key for logs and summaries.
/// A key for logs: hashed when `redact` says so; by default (`None`) addresses are shown
/// and other keys, which may be credentials, are hashed.
pub(crate) fn render(key: &Key, redact: Option<bool>) -> String {
    if redact.unwrap_or(key.ip().is_none()) {
        redacted(key)
    } else {
        key.to_string()
    }
}

/// One limit's summary.
pub(crate) struct TopRefused {
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
}

/// A shard on its own cache lines.
#[repr(align(128))]
struct Shard(Mutex<Summary>);

impl TopRefused {
    pub(crate) fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard(Mutex::new(Summary::new(per_shard))))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// Counts `weight` refusals of `key`; dropped if another thread is counting in the
    /// same shard.
    pub(crate) fn record(&self, key: &Key, weight: u64) {
        let hash = self.hasher.hash_one(key);
        // High bits for the shard; the summary's table uses the low ones.
        let shard = &self.shards[(hash >> 58) as usize % SHARDS];
        let mut summary = match shard.0.try_lock() {
            Ok(s) => s,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        summary.offer(key, hash, weight);
    }

    /// The `n` keys with the highest counts, highest first.
    pub(crate) fn top(&self, n: usize) -> Vec<(Key, u64, u64)> {
        let mut all: Vec<(Key, u64, u64)> = Vec::new();
        for shard in self.shards.iter() {
            let s = shard.0.lock().unwrap_or_else(PoisonError::into_inner);
            all.extend(s.slots.iter().map(|x| (x.key.clone(), x.count, x.error)));
        }
        all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
        all.truncate(n);
        all
    }
}

struct Slot {
    key: Key,
    hash: u64,
    count: u64,
    error: u64,
}

/// Space-Saving with `capacity` counters: an indexed min-heap of counts (O(log k) per
/// update: counts only grow, so an update only sifts down) and a hash table from key to
/// slot.
struct Summary {
    capacity: usize,
    slots: Vec<Slot>,
    /// Slot indices, a min-heap by count.
    heap: Vec<u32>,
    /// Where each slot is in `heap`.
    pos: Vec<u32>,
    index: HashTable<u32>,
}

impl Summary {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            slots: Vec::with_capacity(capacity),
            heap: Vec::with_capacity(capacity),
            pos: Vec::with_capacity(capacity),
            index: HashTable::with_capacity(capacity),
        }
    }

    fn offer(&mut self, key: &Key, hash: u64, weight: u64) {
        let slots = &self.slots;
        if let Some(&i) = self.index.find(hash, |&i| slots[i as usize].key == *key) {
            self.slots[i as usize].count += weight;
            self.sift_down(self.pos[i as usize] as usize);
            return;
        }
        if self.slots.len() < self.capacity {
            let i = self.slots.len() as u32;
            self.slots.push(Slot {
                key: key.clone(),
                hash,
                count: weight,
                error: 0,
            });
            self.heap.push(i);
            self.pos.push(i);
            let slots = &self.slots;
            self.index
                .insert_unique(hash, i, |&j| slots[j as usize].hash);
            self.sift_up(self.heap.len() - 1);
            return;
        }
        // Replace the key with the smallest count.
        let i = self.heap[0];
        let old_hash = self.slots[i as usize].hash;
        if let Ok(entry) = self.index.find_entry(old_hash, |&j| j == i) {
            entry.remove();
        }
        let slot = &mut self.slots[i as usize];
        let min = slot.count;
        *slot = Slot {
            key: key.clone(),
            hash,
            count: min + weight,
            error: min,
        };
        let slots = &self.slots;
        self.index
            .insert_unique(hash, i, |&j| slots[j as usize].hash);
        self.sift_down(0);
    }

    fn count_at(&self, h: usize) -> u64 {
        self.slots[self.heap[h] as usize].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[self.heap[a] as usize] = a as u32;
        self.pos[self.heap[b] as usize] = b as u32;
    }

    fn sift_down(&mut self, mut h: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * h + 1, 2 * h + 2);
            let mut smallest = h;
            if l < n && self.count_at(l) < self.count_at(smallest) {
                smallest = l;
            }
            if r < n && self.count_at(r) < self.count_at(smallest) {
                smallest = r;
            }
            if smallest == h {
                return;
            }
            self.swap(h, smallest);
            h = smallest;
        }
    }

    fn sift_up(&mut self, mut h: usize) {
        while h > 0 {
            let parent = (h - 1) / 2;
            if self.count_at(parent) <= self.count_at(h) {
                return;
            }
            self.swap(h, parent);
            h = parent;
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn by_default_addresses_are_shown_and_other_keys_hashed() {
        let ip = Key::from_part("203.0.113.7".parse::<std::net::IpAddr>().unwrap());
        let api_key = Key::from_part("sk_live_secret");
        assert_eq!(render(&ip, None), "@203.0.113.7");
        let hidden = render(&api_key, None);
        assert!(
            hidden.starts_with('#') && !hidden.contains("secret"),
            "{hidden}"
        );
        assert_eq!(render(&api_key, Some(false)), "sk_live_secret");
        assert!(render(&ip, Some(true)).starts_with('#'));
    }

    use super::*;

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn finds_the_top_10_of_a_zipf_stream_with_1k_counters() {
        // Zipf(s = 1.1) over 100,000 keys, 1,000,000 refusals, by inverse CDF.
        let n = 100_000usize;
        let s = 1.1f64;
        let mut cdf = Vec::with_capacity(n);
        let mut total = 0.0;
        for rank in 1..=n {
            total += 1.0 / (rank as f64).powf(s);
            cdf.push(total);
        }
        let keys: Vec<Key> = (0..n)
            .map(|i| Key::from_part(format!("client-{i}")))
            .collect();
        let mut exact = vec![0u64; n];
        let top = TopRefused::new(1_000);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..1_000_000 {
            let u = rng.unit() * total;
            let rank = cdf.partition_point(|&c| c < u).min(n - 1);
            exact[rank] += 1;
            top.record(&keys[rank], 1);
        }
        let mut expected: Vec<usize> = (0..n).collect();
        expected.sort_by(|&a, &b| exact[b].cmp(&exact[a]));
        let expected: Vec<String> = expected[..10]
            .iter()
            .map(|&i| keys[i].to_string())
            .collect();
        let found = top.top(10);
        let found_keys: Vec<String> = found.iter().map(|(k, _, _)| k.to_string()).collect();
        assert_eq!(found_keys, expected);
        for (k, count, error) in &found {
            let i: usize = k.to_string()["client-".len()..].parse().unwrap();
            assert!(
                *count >= exact[i] && count - error <= exact[i],
                "{k}: {count} ± {error} vs {}",
                exact[i]
            );
        }
    }

    #[test]
    fn memory_is_fixed_whatever_the_number_of_keys() {
        let top = TopRefused::new(64);
        for i in 0..100_000 {
            top.record(&Key::from_part(i as u64), 1);
        }
        let all = top.top(usize::MAX);
        assert_eq!(all.len(), 64);
        let total: u64 = all.iter().map(|e| e.1).sum();
        assert_eq!(total, 100_000, "Space-Saving keeps the stream length");
    }
}
