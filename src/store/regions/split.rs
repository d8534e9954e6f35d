//! The split of one global quota between regions, and the bound it keeps.

use std::time::Duration;

use crate::algo::quota::Quota;

/// Region `index`'s part of `quota` split between `n` regions: the rate and the burst
/// each divided as evenly as whole tokens allow (the first `rate % n` regions get one
/// token more), so that the parts add up to the whole exactly: Σ rᵢ = r, Σ Bᵢ = B.
///
/// A quota smaller than one token per region cannot be split that way: each region then
/// gets at least one token of rate and of burst (the parts add up to at most `n − 1`
/// more than the whole), and [`check`] refuses such a limit in configuration.
///
/// ```
/// use tollgate::Quota;
/// use tollgate::store::regions::share;
///
/// let q = Quota::per_second(1000).burst(1001);
/// let parts: Vec<Quota> = (0..3).map(|i| share(q, i, 3)).collect();
/// assert_eq!(parts.iter().map(Quota::rate).sum::<u64>(), 1000);
/// assert_eq!(parts.iter().map(Quota::burst_size).sum::<u64>(), 1001);
/// assert_eq!(parts[0].burst_size(), 334);
/// ```
pub fn share(quota: Quota, index: usize, n: usize) -> Quota {
    if n <= 1 {
        return quota;
    }
    let part = |whole: u64| {
        let n = n as u64;
        let extra = u64::from((index as u64) < whole % n);
        (whole / n + extra).max(1)
    };
    Quota::new(part(quota.rate()), quota.period())
        .and_then(|q| q.try_burst(part(quota.burst_size())))
        .unwrap_or(quota)
}

/// Whether `quota` splits between `n` regions: at least one token of rate and of burst
/// for each; `Err` says why not.
pub fn check(quota: Quota, n: usize) -> Result<(), String> {
    let n64 = n as u64;
    if quota.rate() < n64 || quota.burst_size() < n64 {
        return Err(format!(
            "a limit split between {n} regions needs at least {n} tokens of rate and of burst (one per region); this one has rate {} and burst {}",
            quota.rate(),
            quota.burst_size()
        ));
    }
    Ok(())
}

/// The most tokens one transfer moves, `M = ⌈r · (Δ + 2d)⌉`: what the global quota
/// refills over one mover interval `Δ` and one round trip `2d` over the link. A mover
/// has one transfer in flight at most, so it can follow a demand of the whole rate `r`
/// whatever the link's delay, and the tokens out of every bucket at once (debited, not
/// yet credited) are at most `n · M`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
/// use tollgate::store::regions::max_move;
///
/// let q = Quota::per_second(1000);
/// // 100 ms interval, 80 ms each way: 1000 × 0.26 s.
/// assert_eq!(max_move(q, Duration::from_millis(100), Duration::from_millis(80)), 260);
/// ```
pub fn max_move(quota: Quota, interval: Duration, link_delay: Duration) -> u64 {
    let span = interval.as_nanos() + 2 * link_delay.as_nanos();
    let period = quota.period().as_nanos().max(1);
    let m = (u128::from(quota.rate()) * span).div_ceil(period);
    u64::try_from(m).unwrap_or(u64::MAX).max(1)
}

/// The most requests of cost 1 that `n` regions sharing `quota` grant together in any
/// window of length `window`, movers included:
///
/// ```text
/// bound(T) = B + ⌈r·T⌉ + n · (M + 1),   M = ⌈r · (Δ + 2d)⌉
/// ```
///
/// `B + ⌈r·T⌉` is what one global bucket grants over `T`; `n · M` the tokens the movers
/// may have in flight (one transfer each: debited at its source, which refills behind
/// it, not yet credited at its destination); `n` one token of rounding per region's
/// bucket. During a partition no credit lands, and a window that lies inside it grants at
/// most `B + ⌈r·T⌉ + n`: each region spends only what it holds. Leased tokens add the
/// lease bound of the instances (`instances × lease size`), as for one region.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
/// use tollgate::store::regions::bound;
///
/// let q = Quota::per_second(1000); // burst 1000
/// let m = 260; // 100 ms interval, 80 ms each way
/// // Over 10 s: 1000 + 10,000 + 2 × 261 = 11,522, i.e. 1.047 × one global bucket's.
/// assert_eq!(bound(q, 2, m, Duration::from_secs(10)), 11_522);
/// ```
pub fn bound(quota: Quota, n: usize, max_move: u64, window: Duration) -> u64 {
    let period = quota.period().as_nanos().max(1);
    let refill = (u128::from(quota.rate()) * window.as_nanos()).div_ceil(period);
    let refill = u64::try_from(refill).unwrap_or(u64::MAX);
    let n = n as u64;
    quota
        .burst_size()
        .saturating_add(refill)
        .saturating_add(n.saturating_mul(max_move.saturating_add(1)))
}

/// [`bound`] during a partition: `B + ⌈r·T⌉ + n`, the global bucket's own (and one token
/// of rounding per region).
pub fn partition_bound(quota: Quota, n: usize, window: Duration) -> u64 {
    bound(quota, n, 0, window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_region_keeps_the_whole_quota() {
        let q = Quota::per_minute(7).burst(3);
        assert_eq!(share(q, 0, 1), q);
        assert_eq!(share(q, 0, 0), q);
    }

    #[test]
    fn a_quota_below_one_token_per_region_gets_one_each_and_is_refused_in_configuration() {
        let q = Quota::per_minute(2).burst(2);
        assert_eq!(share(q, 2, 3).rate(), 1);
        assert_eq!(share(q, 2, 3).burst_size(), 1);
        assert!(check(q, 3).unwrap_err().contains("rate 2 and burst 2"));
        assert!(check(q, 2).is_ok());
        assert!(check(Quota::per_minute(5).burst(1), 2).is_err());
    }

    #[test]
    fn the_bound_adds_one_move_and_one_token_per_region() {
        let q = Quota::per_second(100).burst(50);
        assert_eq!(bound(q, 3, 10, Duration::from_millis(1500)), 50 + 150 + 33);
        assert_eq!(partition_bound(q, 3, Duration::from_millis(1)), 50 + 1 + 3);
        assert_eq!(max_move(q, Duration::ZERO, Duration::ZERO), 1);
        assert_eq!(
            max_move(
                Quota::per_minute(60),
                Duration::from_secs(2),
                Duration::from_millis(500)
            ),
            3
        );
    }

    proptest! {
        #[test]
        fn the_parts_add_up_to_the_whole(rate in 1u64..100_000, burst in 1u64..100_000, n in 1usize..8) {
            prop_assume!(rate >= n as u64 && burst >= n as u64);
            let q = Quota::new(rate, Duration::from_secs(60)).unwrap().burst(burst);
            let parts: Vec<Quota> = (0..n).map(|i| share(q, i, n)).collect();
            prop_assert_eq!(parts.iter().map(Quota::rate).sum::<u64>(), rate);
            prop_assert_eq!(parts.iter().map(Quota::burst_size).sum::<u64>(), burst);
            for p in &parts {
                prop_assert!(p.rate() >= rate / n as u64 && p.rate() <= rate / n as u64 + 1);
                prop_assert_eq!(p.period(), q.period());
            }
        }
    }
}
