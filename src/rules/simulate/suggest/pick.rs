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

/// How many of `n` keys make up `share` of them, rounded down (the same slack as
/// [`needed`]).
pub(super) fn needed_down(n: usize, share: f64) -> usize {
    let exact = share.clamp(0.0, 1.0) * n as f64;
    ((exact + 1e-6).floor().max(0.0) as usize).min(n)
}

/// A key is an outlier when its peak in some window is more than this many times the
/// largest peak of every other key covered: when the share does not come to a whole
/// number of keys, and the one key more that rounding it up would take in is an outlier,
/// the share rounds down rather than up, leaving it out
/// ([`GroupSuggestion::outliers`](super::GroupSuggestion::outliers)).
pub const OUTLIER_RATIO: u64 = 4;

/// The keys covered for `share` of the keys whose values are `values` (at least one), and
/// the outlier left out, if any: the share rounded up ([`cover`] of [`needed`]), except
/// when it does not come to a whole number of keys and the one key more that rounding up
/// takes in is an outlier ([`OUTLIER_RATIO`]): then the share rounded down, without it.
/// (With 5 keys, 99.9 % rounds up to all 5, flooder included; the flooder is the key the
/// fraction brought in.)
pub(super) fn choose<const W: usize>(
    values: &[[u64; W]],
    share: f64,
) -> (Vec<usize>, Option<usize>) {
    let n = values.len();
    let up = needed(n, share).max(1);
    let mut covered = cover(values, up);
    if needed_down(n, share) < up
        && let Some(at) = outlier(values, &covered)
    {
        let left_out = covered.remove(at);
        return (covered, Some(left_out));
    }
    (covered, None)
}

/// The place in `covered` (at least two keys) of the key whose value in some window is
/// more than [`OUTLIER_RATIO`] times the largest of the others' in that window (the one
/// most out of line, if several); `None` if no key is.
fn outlier<const W: usize>(values: &[[u64; W]], covered: &[usize]) -> Option<usize> {
    if covered.len() < 2 {
        return None;
    }
    // (its value, the others' largest, place): compared as ratios without division.
    let mut most: Option<(u64, u64, usize)> = None;
    let column = |w: usize| covered.iter().map(move |&i| values[i][w]);
    for w in 0..W {
        let (top, value) =
            column(w).enumerate().fold(
                (0, 0),
                |best, (at, v)| if v > best.1 { (at, v) } else { best },
            );
        let others = column(w)
            .enumerate()
            .filter(|&(at, _)| at != top)
            .map(|(_, v)| v)
            .max()
            .unwrap_or(0)
            .max(1);
        let out_of_line = u128::from(value) > u128::from(others) * u128::from(OUTLIER_RATIO);
        let more = most.is_none_or(|(v, o, _)| {
            u128::from(value) * u128::from(o) > u128::from(v) * u128::from(others)
        });
        if out_of_line && more {
            most = Some((value, others, top));
        }
    }
    most.map(|(_, _, at)| at)
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
    fn needed_down_rounds_down_with_slack() {
        assert_eq!(needed_down(5, 0.999), 4);
        assert_eq!(needed_down(2000, 0.999), 1998);
        assert_eq!(needed_down(10, 1.0), 10);
        assert_eq!(needed_down(10, 0.5), 5);
        assert_eq!(needed_down(1, 0.999), 0);
    }

    /// Issue 45: the example log's five keys (peaks per 1 s, 1 min, 1 h), one a flooder:
    /// 99.9 % of 5 keys rounded up to all 5, and the suggestion let the flooder through.
    #[test]
    fn a_share_of_few_keys_leaves_out_the_outlier_the_rounding_would_take_in() {
        let peaks = [
            [1, 11, 30],
            [1, 9, 28],
            [1, 6, 15],
            [6, 110, 110],
            [1, 7, 12],
        ];
        let (mut covered, out) = choose(&peaks, 0.999);
        covered.sort();
        assert_eq!((covered, out), (vec![0, 1, 2, 4], Some(3)));
        // Asked for every key, every key it is.
        assert_eq!(choose(&peaks, 1.0), (vec![0, 1, 2, 3, 4], None));
        // A whole number of keys: the share's, outlier or not (80 % of 5 is 4: the
        // flooder is left out by the share itself).
        assert_eq!(choose(&peaks, 0.8).1, None);
        assert_eq!(choose(&peaks, 0.8).0.len(), 4);
        // No outlier: the fraction rounds up, as before. (4 times the others' is not more.)
        let close = [[1, 11, 30], [1, 9, 28], [4, 44, 120], [1, 7, 12]];
        assert_eq!(choose(&close, 0.999), (vec![0, 1, 2, 3], None));
        // One key: nothing to compare it with.
        assert_eq!(choose(&[[50, 50, 50]], 0.999), (vec![0], None));
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
