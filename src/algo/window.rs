//! The window algorithms as pure functions: fixed window, sliding window
//! (two counters) and sliding log.
//!
//! As in [`gcra`](crate::algo::gcra) the unit of time is the caller's (the memory store counts
//! nanoseconds, the Redis store microseconds, and `lua/gcra.lua` is these functions line
//! for line). A window of length `len` with `phase` (`< len`) numbers its windows
//! `i = floor((now − phase) / len)`; window `i` is `[phase + i·len, phase + (i+1)·len)`.
//! Integer arithmetic throughout, never rounding in the client's favour; a refused request
//! changes nothing; a cost of 0 is a look, always allowed.
//!
//! ```
//! use tollgate::window::{self, Geometry};
//! use tollgate::gcra::Admission;
//!
//! // 3 per window of 100 units.
//! let g = Geometry::new(3, 100, 0);
//! let (r, used) = window::fixed_check(g, 2, 40, 1); // 2 used, 40 units to the window's end
//! assert_eq!((r.verdict, used, r.remaining), (Admission::Allowed, Some(3), 0));
//! let (r, _) = window::fixed_check(g, 3, 40, 1);
//! assert_eq!(r.verdict, Admission::Denied { retry_after: 40 });
//! ```

use crate::algo::gcra::Admission;

/// The largest `limit` of a [`Algorithm::SlidingLog`](crate::Algorithm::SlidingLog): its state is one timestamp per
/// admitted request, so the limit bounds the memory (and the CPU of each check) per key.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 1_000;

/// The largest `limit` of a [`Algorithm::SlidingWindow`](crate::Algorithm::SlidingWindow): the memory store packs the
/// window's index and both counters into one 64-bit word updated by compare-and-swap.
pub const SLIDING_WINDOW_MAX_LIMIT: u64 = 65_535;

/// The largest `limit` of a [`Algorithm::FixedWindow`](crate::Algorithm::FixedWindow) (a 32-bit counter).
pub const FIXED_WINDOW_MAX_LIMIT: u64 = u32::MAX as u64;

/// What a window check tells the client, in the caller's unit of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Report {
    /// Whether the request passes.
    pub verdict: Admission,
    /// Whole units a request could still take now (after this one, if it passed).
    pub remaining: u64,
    /// Time until the whole limit is available again.
    pub reset_after: u64,
    /// Time until at least one more unit is available; `None` while nothing is used.
    pub next_after: Option<u64>,
    /// A fixed window in debt (after a reservation, or a penalty): the time until its use
    /// is back within the limit, which is when a reservation that left it there may
    /// proceed ([`fixed_reserved_wait`]). 0 otherwise.
    pub wait: u64,
}

/// A window limit in one unit of time: `limit` units per window of `len`, windows starting
/// at `phase` (taken modulo `len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Units admitted per window (`L`).
    pub limit: u64,
    /// The window's length (`W`), at least 1.
    pub len: u64,
    /// Where windows start, `< len`.
    pub phase: u64,
}

impl Geometry {
    /// `limit` per window of `len`, windows starting at `phase` (modulo `len`). `len` is
    /// clamped to at least 1.
    pub const fn new(limit: u64, len: u64, phase: u64) -> Self {
        let len = if len == 0 { 1 } else { len };
        Self {
            limit,
            len,
            phase: phase % len,
        }
    }

    /// The index of the window holding `now` (0 before the first phase).
    #[inline]
    pub const fn index(&self, now: u64) -> u64 {
        now.saturating_sub(self.phase) / self.len
    }

    /// Time from the start of the window holding `now` to `now`.
    #[inline]
    pub const fn elapsed(&self, now: u64) -> u64 {
        now.saturating_sub(self.phase) % self.len
    }

    /// Time from `now` to the end of its window (`> 0`).
    #[inline]
    pub const fn until_end(&self, now: u64) -> u64 {
        self.len - self.elapsed(now)
    }
}

/// The use of a fixed window `windows` windows after the one in which it was `used`: each
/// boundary gives `limit` back.
#[inline]
pub const fn fixed_carry(limit: u64, used: u64, windows: u64) -> u64 {
    used.saturating_sub(limit.saturating_mul(windows))
}

/// Checks a request of `cost` units against a fixed window whose use in the current window
/// is `used` (after [`fixed_carry`]), `until_end` before the window ends. Returns the
/// report and the use to store (`None`: unchanged).
#[inline(always)]
pub fn fixed_check(g: Geometry, used: u64, until_end: u64, cost: u64) -> (Report, Option<u64>) {
    fixed_check_within(g, used, until_end, cost, 0)
}

/// [`fixed_check`] for a reservation: the request also passes when the
/// window `k` in which its units fit starts within `max_wait`; it takes them now (the use
/// goes beyond the limit: a debt the following windows inherit) and may proceed after
/// [`fixed_reserved_wait`]. Its units start together in window `k`, so what was left of
/// the windows before `k` counts as used too: the use becomes `max(used, L·k) + cost`. A
/// `max_wait` of 0 is a check.
///
/// ```
/// use tollgate::window::{self, Geometry};
/// use tollgate::gcra::Admission;
///
/// let g = Geometry::new(3, 100, 0); // 3 per window of 100
/// // Full, 40 before the window ends: the next window starts within 50.
/// let (r, used) = window::fixed_check_within(g, 3, 40, 1, 50);
/// assert_eq!((r.verdict, used), (Admission::Allowed, Some(4)));
/// assert_eq!(window::fixed_reserved_wait(g, 4, 40), 40);
/// // Three more would need the window after next, in 140: refused.
/// let (r, _) = window::fixed_check_within(g, 4, 40, 3, 50);
/// assert_eq!(r.verdict, Admission::Denied { retry_after: 140 });
/// // One used, three asked: they start together in the next window, which the
/// // two units left of this one cannot share.
/// let (r, used) = window::fixed_check_within(g, 1, 40, 3, 50);
/// assert_eq!((r.verdict, used), (Admission::Allowed, Some(6)));
/// ```
#[inline(always)]
pub fn fixed_check_within(
    g: Geometry,
    used: u64,
    until_end: u64,
    cost: u64,
    max_wait: u64,
) -> (Report, Option<u64>) {
    let (verdict, after, new) = if cost > g.limit {
        (Admission::Never, used, None)
    } else if cost == 0 || used.saturating_add(cost) <= g.limit {
        (
            Admission::Allowed,
            used + cost,
            (cost > 0).then_some(used + cost),
        )
    } else if let Some(after) = fixed_reservation(g, used, until_end, cost, max_wait) {
        (Admission::Allowed, after, Some(after))
    } else {
        let retry_after = fixed_wait(g, used, until_end, cost);
        (Admission::Denied { retry_after }, used, None)
    };
    (
        Report {
            verdict,
            ..fixed_report(g, after, until_end)
        },
        new,
    )
}

/// What a fixed window with `used` units in the current window reports (verdict: allowed).
#[inline(always)]
pub fn fixed_report(g: Geometry, used: u64, until_end: u64) -> Report {
    let remaining = g.limit.saturating_sub(used);
    if used == 0 {
        return Report {
            verdict: Admission::Allowed,
            remaining,
            reset_after: 0,
            next_after: None,
            wait: 0,
        };
    }
    if used <= g.limit {
        // No debt (the usual case): all of it, and more, at the window's end.
        return Report {
            verdict: Admission::Allowed,
            remaining,
            reset_after: until_end,
            next_after: Some(until_end),
            wait: 0,
        };
    }
    let windows = used.div_ceil(g.limit.max(1));
    Report {
        verdict: Admission::Allowed,
        remaining,
        reset_after: until_end.saturating_add((windows - 1).saturating_mul(g.len)),
        next_after: Some(fixed_wait(g, used, until_end, remaining + 1)),
        wait: fixed_reserved_wait(g, used, until_end),
    }
}

/// How long a reservation that left the fixed window's use at `used` (its own units
/// included), `until_end` before the current window ends, waits: 0 within the limit,
/// otherwise until the start of the first window `k` with `used − L·k ≤ L`.
pub fn fixed_reserved_wait(g: Geometry, used: u64, until_end: u64) -> u64 {
    let limit = g.limit.max(1);
    if used <= limit {
        return 0;
    }
    window_start(g, until_end, (used - limit).div_ceil(limit))
}

/// The largest use a fixed window stores (a reservation that would leave more is refused:
/// the stores keep the use in 32 bits).
pub const FIXED_MAX_USE: u64 = u32::MAX as u64;

/// The use after a reservation of `cost` units that do not fit now, if the first window
/// `k` where they fit starts within `max_wait` (and the use fits in 32 bits). The units
/// start together in window `k`, so what is left of the windows before it counts as used
/// (nothing else can start there before them): `max(used, L·k) + cost`.
#[inline]
fn fixed_reservation(
    g: Geometry,
    used: u64,
    until_end: u64,
    cost: u64,
    max_wait: u64,
) -> Option<u64> {
    if max_wait == 0 {
        return None;
    }
    let k = fixed_windows_to_fit(g, used, cost);
    let wait = window_start(g, until_end, k);
    let after = used.max(g.limit.saturating_mul(k)).saturating_add(cost);
    (wait <= max_wait && after <= FIXED_MAX_USE).then_some(after)
}

/// The first window `k ≥ 1` from now with `used − L·k + need ≤ L`, when `need` units do
/// not fit now.
#[inline]
fn fixed_windows_to_fit(g: Geometry, used: u64, need: u64) -> u64 {
    let limit = g.limit.max(1);
    (used.saturating_add(need) - limit).div_ceil(limit).max(1)
}

/// Time until `need` units fit, when they do not now: the start of the first window `k`
/// with `used − L·k + need ≤ L`.
fn fixed_wait(g: Geometry, used: u64, until_end: u64, need: u64) -> u64 {
    window_start(g, until_end, fixed_windows_to_fit(g, used, need))
}

/// Time until the start of the `k`-th window from now (`k ≥ 1`), `until_end` before the
/// current one ends.
#[inline]
fn window_start(g: Geometry, until_end: u64, k: u64) -> u64 {
    until_end.saturating_add((k - 1).saturating_mul(g.len))
}

/// The use a fixed window needs so that a request of cost 1 is refused until `now + d`:
/// every window that `[now, now + d)` touches is full. The current use is raised to it
/// (never lowered); a block thus ends at a window boundary, at or after `now + d`.
pub fn fixed_block(g: Geometry, now: u64, d: u64) -> u64 {
    if d == 0 {
        return 0;
    }
    let last = g.index(now.saturating_add(d - 1));
    let windows = last - g.index(now) + 1;
    g.limit.saturating_mul(windows)
}

/// Whether `cost` more units fit a sliding window with counts `cur` (current window) and
/// `prev` (previous window), `e` into the current window: `prev·(W − e) + (cur + cost)·W
/// ≤ L·W`.
#[inline(always)]
pub fn sliding_fits(g: Geometry, cur: u64, prev: u64, e: u64, cost: u64) -> bool {
    let w = u128::from(g.len);
    u128::from(prev) * (w - u128::from(e)) + (u128::from(cur) + u128::from(cost)) * w
        <= u128::from(g.limit) * w
}

/// Checks a request of `cost` units against a sliding window: `cur` units in the current
/// window, `prev` in the one before, `e` (`< len`) into the current window. Returns the
/// report and the current window's count to store (`None`: unchanged).
#[inline(always)]
pub fn sliding_check(g: Geometry, cur: u64, prev: u64, e: u64, cost: u64) -> (Report, Option<u64>) {
    let (verdict, after, new) = if cost > g.limit {
        (Admission::Never, cur, None)
    } else if cost == 0 || sliding_fits(g, cur, prev, e, cost) {
        (
            Admission::Allowed,
            cur + cost,
            (cost > 0).then_some(cur + cost),
        )
    } else {
        let retry_after = sliding_wait(g, cur, prev, e, cost);
        (Admission::Denied { retry_after }, cur, None)
    };
    (
        Report {
            verdict,
            ..sliding_report(g, after, prev, e)
        },
        new,
    )
}

/// What a sliding window reports (verdict: allowed).
#[inline]
pub fn sliding_report(g: Geometry, cur: u64, prev: u64, e: u64) -> Report {
    let w = u128::from(g.len);
    let used = u128::from(prev) * (w - u128::from(e)) + u128::from(cur) * w;
    let remaining = div(
        (u128::from(g.limit) * w).saturating_sub(used),
        u128::from(g.len),
    ) as u64; // <= limit
    let reset_after = if cur > 0 {
        g.len - e + g.len
    } else if prev > 0 {
        g.len - e
    } else {
        0
    };
    let next_after = (remaining < g.limit && (cur > 0 || prev > 0))
        .then(|| sliding_wait(g, cur, prev, e, remaining + 1));
    Report {
        verdict: Admission::Allowed,
        remaining,
        reset_after,
        next_after,
        wait: 0,
    }
}

/// Time until `cost` (`≤ L`) units fit, when they do not now: later in this window as the
/// previous window's weight decays, or in the next one.
fn sliding_wait(g: Geometry, cur: u64, prev: u64, e: u64, cost: u64) -> u64 {
    let w = u128::from(g.len);
    let limit = u128::from(g.limit);
    let (cur, prev, cost) = (u128::from(cur), u128::from(prev), u128::from(cost));
    // This window, at e1 > e: prev·(W − e1) ≤ (L − cur − cost)·W.
    if cur + cost <= limit && prev > 0 {
        let slack = div((limit - cur - cost) * w, prev).min(w);
        let e1 = w - slack;
        if e1 < w {
            return (e1 as u64).saturating_sub(e).max(1);
        }
    }
    // The next window (prev := cur, cur := 0), at e2: cur·(W − e2) ≤ (L − cost)·W.
    let e2 = if cur == 0 {
        0 // nothing in this window: nothing weighs on the next
    } else {
        w - div((limit - cost.min(limit)) * w, cur).min(w)
    };
    (g.len - e) + e2 as u64
}

/// `a / b` (`b > 0`), in 64 bits when both fit (a 128-bit division is a library call).
#[inline]
fn div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a / b),
        _ => a / b,
    }
}

/// Checks a request of `cost` units against a sliding log whose `entries` — `(instant,
/// units)`, oldest first — are those still in the window (`instant + len > now`). The
/// caller appends `(now, cost)` when the verdict is allowed and `cost > 0`.
pub fn log_check<I>(g: Geometry, entries: I, now: u64, cost: u64) -> Report
where
    I: Iterator<Item = (u64, u64)> + Clone,
{
    // One pass: the units in the window, the oldest and the newest instant.
    let (mut used, mut oldest, mut newest) = (0u64, None, None);
    for (t, n) in entries.clone() {
        used += n;
        oldest.get_or_insert(t);
        newest = Some(t);
    }
    let (verdict, after, newest) = if cost > g.limit {
        (Admission::Never, used, newest)
    } else if cost == 0 || used + cost <= g.limit {
        let newest = if cost > 0 { Some(now) } else { newest };
        (Admission::Allowed, used + cost, newest)
    } else {
        // The oldest entries leave the window until `used + cost − L` units have gone.
        let mut free = used + cost - g.limit;
        let mut retry_after = 0;
        for (t, n) in entries {
            retry_after = (t + g.len).saturating_sub(now).max(1);
            free = free.saturating_sub(n);
            if free == 0 {
                break;
            }
        }
        (Admission::Denied { retry_after }, used, newest)
    };
    let remaining = g.limit.saturating_sub(after);
    let until = |t: Option<u64>| t.map_or(0, |t| (t + g.len).saturating_sub(now));
    let oldest = oldest.or(newest);
    Report {
        verdict,
        remaining,
        reset_after: if after == 0 { 0 } else { until(newest) },
        next_after: (after > 0).then(|| until(oldest).max(1)),
        wait: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_window_admits_the_limit_then_refuses_until_the_boundary() {
        let g = Geometry::new(3, 100, 0);
        let mut used = 0;
        for i in 0..3 {
            let (r, new) = fixed_check(g, used, 60, 1);
            assert_eq!(r.verdict, Admission::Allowed, "request {i}");
            assert_eq!(r.remaining, 2 - i);
            assert_eq!(r.next_after, Some(60));
            assert_eq!(r.reset_after, 60);
            used = new.unwrap();
        }
        let (r, new) = fixed_check(g, used, 60, 1);
        assert_eq!(r.verdict, Admission::Denied { retry_after: 60 });
        assert_eq!((new, r.remaining), (None, 0));
        // Cost-aware: 2 used, a cost of 2 does not fit, a cost of 1 does.
        assert_eq!(
            fixed_check(g, 2, 10, 2).0.verdict,
            Admission::Denied { retry_after: 10 }
        );
        assert_eq!(fixed_check(g, 2, 10, 1).0.verdict, Admission::Allowed);
        assert_eq!(fixed_check(g, 0, 10, 4).0.verdict, Admission::Never);
        // Nothing used: no `t`, no reset.
        let r = fixed_report(g, 0, 10);
        assert_eq!((r.remaining, r.reset_after, r.next_after), (3, 0, None));
    }

    #[test]
    fn fixed_window_debt_carries_over_boundaries() {
        let g = Geometry::new(3, 100, 0);
        // 7 used (a penalty): two boundaries to get one unit back.
        assert_eq!(fixed_carry(3, 7, 1), 4);
        assert_eq!(fixed_carry(3, 7, 2), 1);
        assert_eq!(fixed_carry(3, 7, 3), 0);
        let r = fixed_report(g, 7, 30);
        assert_eq!(
            (r.remaining, r.reset_after, r.next_after),
            (0, 230, Some(130))
        );
        assert_eq!(
            fixed_check(g, 7, 30, 3).0.verdict,
            Admission::Denied { retry_after: 230 }
        );
    }

    #[test]
    fn fixed_block_fills_every_window_it_touches() {
        let g = Geometry::new(5, 100, 20);
        // now = 150 is in window 1 ([120, 220)); blocked until 300 touches windows 1 and 2.
        assert_eq!(fixed_block(g, 150, 150), 10);
        assert_eq!(fixed_block(g, 150, 70), 5);
        assert_eq!(fixed_block(g, 150, 71), 10);
        assert_eq!(fixed_block(g, 150, 0), 0);
    }

    #[test]
    fn geometry_numbers_windows_from_the_phase() {
        let g = Geometry::new(1, 100, 130);
        assert_eq!(g.phase, 30);
        assert_eq!((g.index(129), g.elapsed(129), g.until_end(129)), (0, 99, 1));
        assert_eq!(
            (g.index(130), g.elapsed(130), g.until_end(130)),
            (1, 0, 100)
        );
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let g = Geometry::new(10, 100, 0);
        // 10 in the previous window, 25 into this one: weight 7.5, so 2 fit.
        let r = sliding_report(g, 0, 10, 25);
        assert_eq!(r.remaining, 2);
        assert_eq!(sliding_check(g, 0, 10, 25, 2).0.verdict, Admission::Allowed);
        // 3 fit when the weight is 7: at e = 30.
        assert_eq!(
            sliding_check(g, 0, 10, 25, 3).0.verdict,
            Admission::Denied { retry_after: 5 }
        );
        assert!(sliding_fits(g, 0, 10, 30, 3));
        assert!(!sliding_fits(g, 0, 10, 29, 3));
        // Current window full: the next one, where the weight of 10 decays.
        let (r, _) = sliding_check(g, 10, 0, 40, 1);
        assert_eq!(
            r.verdict,
            Admission::Denied {
                retry_after: 60 + 10
            }
        );
        assert!(sliding_fits(g, 0, 10, 10, 1));
        assert!(!sliding_fits(g, 0, 10, 9, 1));
        assert_eq!(r.reset_after, 60 + 100);
        assert_eq!(sliding_check(g, 0, 0, 0, 11).0.verdict, Admission::Never);
    }

    #[test]
    fn sliding_wait_is_the_first_instant_that_fits() {
        let g = Geometry::new(7, 97, 0);
        for cur in 0..=7 {
            for prev in 0..=7 {
                for e in 0..97 {
                    for cost in 1..=7 {
                        if sliding_fits(g, cur, prev, e, cost) {
                            continue;
                        }
                        let wait = sliding_wait(g, cur, prev, e, cost);
                        assert!(wait > 0);
                        // Walk the time: (cur, prev, e) at each instant until `wait`.
                        let at = |dt: u64| {
                            let t = e + dt;
                            match t / 97 {
                                0 => (cur, prev, t),
                                1 => (0, cur, t - 97),
                                _ => (0, 0, t % 97),
                            }
                        };
                        let (c, p, x) = at(wait);
                        assert!(sliding_fits(g, c, p, x, cost), "{cur} {prev} {e} {cost}");
                        let (c, p, x) = at(wait - 1);
                        assert!(!sliding_fits(g, c, p, x, cost), "{cur} {prev} {e} {cost}");
                    }
                }
            }
        }
    }

    #[test]
    fn sliding_log_is_exact() {
        let g = Geometry::new(3, 100, 0);
        let log = [(10, 1), (20, 2)];
        let r = log_check(g, log.iter().copied(), 50, 1);
        assert_eq!(r.verdict, Admission::Denied { retry_after: 60 });
        assert_eq!(
            (r.remaining, r.reset_after, r.next_after),
            (0, 70, Some(60))
        );
        // Cost 3 waits until both entries left.
        let r = log_check(g, log.iter().copied(), 50, 3);
        assert_eq!(r.verdict, Admission::Denied { retry_after: 70 });
        let r = log_check(g, log[1..].iter().copied(), 50, 1);
        assert_eq!(r.verdict, Admission::Allowed);
        assert_eq!(
            (r.remaining, r.reset_after, r.next_after),
            (0, 100, Some(70))
        );
        let r = log_check(g, [].into_iter(), 50, 0);
        assert_eq!((r.remaining, r.reset_after, r.next_after), (3, 0, None));
        assert_eq!(
            log_check(g, [].into_iter(), 50, 4).verdict,
            Admission::Never
        );
    }
}
