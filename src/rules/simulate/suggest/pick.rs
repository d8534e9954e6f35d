//! Choosing the suggestion from the per-key measures: the distribution of a measure across
//! keys, how many keys must never be refused, and the bursts of three windows chosen
//! together so that those keys pass all three.

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

/// The bursts of the windows, chosen together: each key ranked in each window by how
/// many keys need at most its burst there, scored by its worst rank; the `m` keys with
/// the best scores pass all windows with the largest burst each window's of them needs.
/// So at least `m` keys need no more than the chosen burst in every window.
pub(super) fn bursts<const W: usize>(needs: &[[u64; W]], m: usize) -> [u64; W] {
    let mut out = [1; W];
    if needs.is_empty() || m == 0 {
        return out;
    }
    let m = m.min(needs.len());
    let columns: Vec<Distribution> = (0..W)
        .map(|w| Distribution::new(needs.iter().map(|k| k[w]).collect()))
        .collect();
    let mut scored: Vec<(usize, usize)> = needs
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let worst = (0..W).map(|w| columns[w].at_most(k[w])).max().unwrap_or(0);
            (worst, i)
        })
        .collect();
    scored.select_nth_unstable(m - 1);
    for &(_, i) in &scored[..m] {
        for w in 0..W {
            out[w] = out[w].max(needs[i][w]);
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
    fn bursts_cover_m_keys_in_every_window() {
        // Keys good in one window and bad in another: the worst of each is left out.
        let needs = [[1, 9], [9, 1], [2, 2], [3, 3], [2, 1]];
        let b = bursts(&needs, 3);
        assert_eq!(b, [3, 3]);
        let covered = needs
            .iter()
            .filter(|k| k[0] <= b[0] && k[1] <= b[1])
            .count();
        assert!(covered >= 3);
        assert_eq!(bursts(&needs, 5), [9, 9]);
        assert_eq!(bursts::<2>(&[], 1), [1, 1]);
    }

    proptest::proptest! {
        /// Whatever the needs: at least `m` keys need no more than the chosen bursts.
        #[test]
        fn at_least_m_covered(
            needs in proptest::collection::vec(proptest::array::uniform3(0u64..20), 1..60),
            m in 1usize..60,
        ) {
            let m = m.min(needs.len());
            let b = bursts(&needs, m);
            let covered = needs.iter().filter(|k| (0..3).all(|w| k[w] <= b[w])).count();
            proptest::prop_assert!(covered >= m);
        }
    }
}
