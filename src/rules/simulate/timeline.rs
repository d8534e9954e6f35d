//! When requests and refusals happened, in at most [`TIMELINE_BUCKETS`] buckets of equal width over
//! the log's span: the width grows (1 s, 5 s, 10 s, 30 s, 1 min, 5 min, ... 1 day, 1 week,
//! then doubling) as the log goes on, merging buckets, so memory is fixed however long
//! the log or however spread its times.

/// The most buckets a [`Timeline`] holds.
pub const TIMELINE_BUCKETS: usize = 60;

/// Bucket widths in seconds, each a multiple of the one before; past the last, doubling.
const WIDTHS: [i64; 15] = [
    1, 5, 10, 30, 60, 300, 600, 1_800, 3_600, 10_800, 21_600, 43_200, 86_400, 604_800, 1_209_600,
];

/// Requests and refusals per limit over time, in [`len`](Self::len) buckets of
/// [`width`](Self::width) seconds from [`start`](Self::start) (at most [`TIMELINE_BUCKETS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timeline {
    /// The first bucket's start, Unix seconds (a multiple of the width).
    pub start: i64,
    /// Each bucket's width in seconds.
    pub width: i64,
    /// Requests replayed per bucket.
    pub requests: Vec<u64>,
    /// Per limit (in the document's order), refusals per bucket; as long as `requests`.
    pub refused: Vec<Vec<u64>>,
}

impl Timeline {
    /// An empty timeline for `limits` limits.
    pub(crate) fn new(limits: usize) -> Self {
        Self {
            start: 0,
            width: WIDTHS[0],
            requests: Vec::new(),
            refused: vec![Vec::new(); limits],
        }
    }

    /// The number of buckets.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether no request was recorded.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// The start of bucket `i`, Unix seconds.
    pub fn bucket_start(&self, i: usize) -> i64 {
        self.start
            .saturating_add((i as i64).saturating_mul(self.width))
    }

    /// A request at Unix time `secs`: its bucket's index (times before the start count
    /// in the first bucket).
    pub(crate) fn request(&mut self, secs: i64) -> usize {
        if self.requests.is_empty() {
            self.start = secs.div_euclid(self.width) * self.width;
        }
        loop {
            let i = secs.saturating_sub(self.start).max(0) / self.width;
            if i < TIMELINE_BUCKETS as i64 {
                let i = i as usize;
                if i >= self.requests.len() {
                    self.requests.resize(i + 1, 0);
                    for r in &mut self.refused {
                        r.resize(i + 1, 0);
                    }
                }
                self.requests[i] += 1;
                return i;
            }
            self.widen();
        }
    }

    /// A refusal by limit `limit` in bucket `i` (as [`request`](Self::request) gave).
    pub(crate) fn refusal(&mut self, limit: usize, i: usize) {
        if let Some(n) = self.refused.get_mut(limit).and_then(|r| r.get_mut(i)) {
            *n += 1;
        }
    }

    /// The next width, buckets merged into it.
    fn widen(&mut self) {
        let width = match WIDTHS.iter().find(|&&w| w > self.width) {
            Some(&w) => w,
            None => self.width.saturating_mul(2),
        };
        let start = self.start.div_euclid(width) * width;
        let merge = |counts: &mut Vec<u64>| {
            let mut merged = Vec::with_capacity(TIMELINE_BUCKETS);
            for (i, &n) in counts.iter().enumerate() {
                let at = self.start + i as i64 * self.width;
                let j = ((at - start) / width) as usize;
                if j >= merged.len() {
                    merged.resize(j + 1, 0);
                }
                merged[j] += n;
            }
            *counts = merged;
        };
        merge(&mut self.requests);
        for r in &mut self.refused {
            merge(r);
        }
        self.start = start;
        self.width = width;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn widens_and_merges() {
        let mut t = Timeline::new(1);
        let i = t.request(1_000);
        t.refusal(0, i);
        assert_eq!((t.start, t.width, t.len()), (1_000, 1, 1));
        let i = t.request(1_059);
        t.refusal(0, i);
        // 1,000..1,059 needs 60 buckets of 1 s: 1,060 does not fit.
        assert_eq!((t.width, t.len()), (1, 60));
        t.request(1_060);
        assert_eq!((t.start, t.width), (1_000, 5));
        assert_eq!(t.requests[0], 1);
        assert_eq!(t.requests[11], 1);
        assert_eq!(t.refused[0].iter().sum::<u64>(), 2);
        // A day later: minutes or wider, still at most TIMELINE_BUCKETS.
        t.request(1_000 + 86_400);
        assert!(t.len() <= TIMELINE_BUCKETS);
        assert_eq!(t.requests.iter().sum::<u64>(), 4);
        assert_eq!(t.start % t.width, 0);
    }

    proptest! {
        /// However the times go, at most TIMELINE_BUCKETS buckets; every request and refusal in the
        /// bucket holding its time.
        #[test]
        fn bounded_and_exact(mut times in proptest::collection::vec(0i64..100_000_000, 1..300)) {
            times.sort_unstable();
            let mut t = Timeline::new(2);
            for &s in &times {
                let i = t.request(s);
                t.refusal((s % 2) as usize, i);
            }
            prop_assert!(t.len() <= TIMELINE_BUCKETS);
            prop_assert_eq!(t.requests.iter().sum::<u64>(), times.len() as u64);
            for &s in &times {
                let i = ((s - t.start) / t.width) as usize;
                prop_assert!(i < t.len());
            }
            let odd = times.iter().filter(|&&s| s % 2 == 1).count() as u64;
            prop_assert_eq!(t.refused[1].iter().sum::<u64>(), odd);
            // Each bucket's count is the number of times in it.
            for i in 0..t.len() {
                let (a, b) = (t.bucket_start(i), t.bucket_start(i + 1));
                let n = times.iter().filter(|&&s| s >= a && s < b).count() as u64;
                prop_assert_eq!(t.requests[i], n);
            }
        }
    }
}
