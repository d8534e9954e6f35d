//! Choosing the suggestion from the per-key measures: the distribution of a measure across
//! keys, how many keys must never be refused, and which: chosen over the three windows
//! together, so that those keys pass all three.

/// One measure across keys, sorted: what a chart of the distribution is drawn from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Distribution {
    sorted: Vec<u64>,
}

/// The percentiles the reports show: p50, p90, p99 and p99.9 (then the maximum).
pub const PERCENTILES: [f64; 4] = [50.0, 90.0, 99.0, 99.9];

impl Distribution {
    /// The distribution of `values` (sorted here).
    pub fn new(mut values: Vec<u64>) -> Self {
        values.sort_unstable();
        Self { sorted: values }
    }

    /// Every key's value, smallest first.
    pub fn values(&self) -> &[u64] {
        &self.sorted
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The `p`-th percentile (0 < p ≤ 100), nearest rank: the least value that at least
    /// `p` % of the keys do not exceed. 0 without keys.
    ///
    /// ```
    /// use tollgate::rules::suggest::Distribution;
    ///
    /// let d = Distribution::new((1..=1000).rev().collect());
    /// assert_eq!((d.percentile(50.0), d.percentile(99.9), d.max()), (500, 999, 1000));
    /// ```
    pub fn percentile(&self, p: f64) -> u64 {
        let n = self.sorted.len();
        if n == 0 {
            return 0;
        }
        let rank = needed(n, p / 100.0).clamp(1, n);
        self.sorted[rank - 1]
    }

    /// The largest value (0 without keys).
    pub fn max(&self) -> u64 {
        self.sorted.last().copied().unwrap_or(0)
    }

    /// How many keys have a value of at most `v`.
    pub fn at_most(&self, v: u64) -> usize {
        self.sorted.partition_point(|&x| x <= v)
    }
}

/// How many of `n` keys make up `share` (0 to 1) of them, rounded up; a hair of slack
/// so that 0.999 × 2000 is 1998, not 1999.
pub(super) fn needed(n: usize, share: f64) -> usize {
    let exact = share.clamp(0.0, 1.0) * n as f64;
    ((exact - 1e-6).ceil().max(0.0) as usize).min(n)
}

/// The `m` keys covered, chosen over all windows together, greedily: while more than `m`
/// are left, the key leaves whose value is the largest in some window relative to that
/// window's scale (its value at rank `m`), so that each window's largest value, which
/// becomes its quota, comes down where it is most out of line. Every window's largest
/// value among the keys left then covers all of them (indices into `values`).
pub(super) fn cover<const W: usize>(values: &[[u64; W]], m: usize) -> Vec<usize> {
    let n = values.len();
    let m = m.min(n);
    if m == 0 {
        return Vec::new();
    }
    // Per window, the keys by value, largest first.
    let orders: [Vec<usize>; W] = std::array::from_fn(|w| {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by_key(|&i| std::cmp::Reverse(values[i][w]));
        order
    });
    let scale: [f64; W] = std::array::from_fn(|w| values[orders[w][n - m]][w].max(1) as f64);
    let mut left = vec![true; n];
    let mut top = [0; W];
    for _ in m..n {
        let mut out: Option<(f64, usize)> = None;
        for w in 0..W {
            // At least m ≥ 1 keys are left: the cursor stops on one.
            while !left[orders[w][top[w]]] {
                top[w] += 1;
            }
            let i = orders[w][top[w]];
            let excess = values[i][w] as f64 / scale[w];
            if out.is_none_or(|(e, _)| excess > e) {
                out = Some((excess, i));
            }
        }
        if let Some((_, i)) = out {
            left[i] = false;
        }
    }
    (0..n).filter(|&i| left[i]).collect()
}

/// Per window, the largest value among the keys `chosen` (at least 1).
pub(super) fn largest<const W: usize>(values: &[[u64; W]], chosen: &[usize]) -> [u64; W] {
    let mut out = [1; W];
    for &i in chosen {
        for w in 0..W {
            out[w] = out[w].max(values[i][w]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needed_rounds_up_with_slack() {
        assert_eq!(needed(2000, 0.999), 1998);
        assert_eq!(needed(1000, 0.999), 999);
        assert_eq!(needed(10, 0.999), 10);
        assert_eq!(needed(10, 1.0), 10);
        assert_eq!(needed(10, 0.5), 5);
        assert_eq!(needed(0, 0.9), 0);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let d = Distribution::new(vec![5, 1, 3]);
        assert_eq!(d.values(), [1, 3, 5]);
        assert_eq!((d.percentile(50.0), d.percentile(90.0), d.max()), (3, 5, 5));
        assert_eq!(Distribution::default().percentile(50.0), 0);
    }

    #[test]
    fn cover_m_keys_in_every_window() {
        // Keys good in one window and bad in another: the worst of each is left out.
        let needs = [[1, 9], [9, 1], [2, 2], [3, 3], [2, 1]];
        let mut chosen = cover(&needs, 3);
        chosen.sort();
        assert_eq!(chosen, [2, 3, 4]);
        assert_eq!(largest(&needs, &chosen), [3, 3]);
        assert_eq!(largest(&needs, &cover(&needs, 5)), [9, 9]);
        assert!(cover::<2>(&[], 1).is_empty());
        assert_eq!(largest::<2>(&[], &[]), [1, 1]);
    }

    proptest::proptest! {
        /// Whatever the values: at least `m` keys have no more than the largest of the chosen.
        #[test]
        fn at_least_m_covered(
            needs in proptest::collection::vec(proptest::array::uniform3(0u64..20), 1..60),
            m in 1usize..60,
        ) {
            let m = m.min(needs.len());
            let b = largest(&needs, &cover(&needs, m));
            let covered = needs.iter().filter(|k| (0..3).all(|w| k[w] <= b[w])).count();
            proptest::prop_assert!(covered >= m);
        }
    }
}
