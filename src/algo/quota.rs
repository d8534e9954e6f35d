//! [`Quota`]: how many tokens per period, and how many at once.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::base::error::ConfigError;

const NANOS_PER_SEC: u64 = 1_000_000_000;
/// The longest time a bucket may take to refill: 100 years. Longer quotas are refused
/// because the Redis store keeps microseconds since the Unix epoch in Lua doubles, which
/// stay exact below 2^53 µs (285 years); 100 years keeps `now + tau` well inside that.
const MAX_SPAN_NS: u128 = 100 * 36_525 * 86_400 * NANOS_PER_SEC as u128 / 100;
/// The largest integer an RFC 9651 structured field can carry (`q=` in `RateLimit-Policy`).
const MAX_BURST: u64 = 999_999_999_999_999;

/// A rate and a bucket size: `rate` tokens per `period`, at most `burst` at once.
///
/// "N per period" always means N per period (as in `governor`), never "one every N".
/// The burst defaults to the rate: `Quota::per_second(10)` admits 10 requests at once
/// from a full bucket, then one every 100 ms. [`burst`](Quota::burst) changes the capacity
/// without changing the sustained rate.
///
/// This is a token bucket, computed as GCRA: over any interval of length `d`, at most
/// `burst + d / T` tokens are granted, where `T = period / rate` is the time one token takes
/// to come back. It is *not* a fixed window: `per_minute(60)` does not mean "at most 60 in
/// every clock minute" but "a full bucket of 60, refilled at one per second".
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let q = Quota::per_second(10).burst(50);
/// assert_eq!(q.emission_interval(), Duration::from_millis(100));
/// assert_eq!(q.burst_size(), 50);
/// assert_eq!(q.refill_time(), Duration::from_secs(5)); // an empty bucket is full again after 5 s
///
/// // The same, read from configuration:
/// let parsed: Quota = "10/s; burst=50".parse().unwrap();
/// assert_eq!(parsed, q);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    rate: u64,
    /// The period in nanoseconds (at most 100 years: fits in 62 bits), and in the top bit
    /// [`MONTH_FLAG`]: no field of its own, so that a quota stays five words.
    period_ns: u64,
    burst: u64,
    /// Emission interval in nanoseconds, rounded up.
    t_ns: u64,
    /// Emission interval in microseconds, rounded up (the Redis store's unit).
    t_us: u64,
}

/// The top bit of `period_ns`: per calendar month ([`Quota::per_month`]; the period is then
/// 31 days, nominally).
const MONTH_FLAG: u64 = 1 << 63;

/// The nominal period of [`Quota::per_month`]: the longest month, 31 days.
const MONTH: Duration = Duration::from_secs(31 * 86_400);

/// Why a quota is invalid, without allocating: usable from `const fn`.
type Invalid = (&'static str, &'static str);

const fn period_ns(period: Duration) -> u128 {
    period.as_nanos()
}

const fn div_ceil(a: u128, b: u128) -> u128 {
    a.div_ceil(b)
}

const fn check_rate(rate: u64, period: Duration) -> Result<(u64, u64), Invalid> {
    if rate == 0 {
        return Err(("rate", "must be at least 1"));
    }
    let p = period_ns(period);
    if p == 0 {
        return Err(("period", "must be longer than zero"));
    }
    if p > MAX_SPAN_NS {
        return Err(("period", "must not exceed 100 years"));
    }
    // One token per microsecond is the finest grain both stores can represent exactly.
    if p < rate as u128 * 1_000 {
        return Err((
            "rate",
            "more than one token per microsecond is not supported; count in larger units",
        ));
    }
    let t_ns = div_ceil(p, rate as u128);
    let t_us = div_ceil(p, rate as u128 * 1_000);
    Ok((t_ns as u64, t_us as u64))
}

const fn check_burst(burst: u64, t_ns: u64, t_us: u64) -> Result<(), Invalid> {
    if burst == 0 {
        return Err(("burst", "must be at least 1"));
    }
    if burst > MAX_BURST {
        return Err(("burst", "must not exceed 999999999999999"));
    }
    let tau_ns = burst as u128 * t_ns as u128;
    let tau_us_as_ns = burst as u128 * t_us as u128 * 1_000;
    if tau_ns > MAX_SPAN_NS || tau_us_as_ns > MAX_SPAN_NS {
        return Err((
            "burst",
            "an empty bucket would take more than 100 years to refill",
        ));
    }
    Ok(())
}

const fn build(rate: u64, period: Duration, burst: u64) -> Result<Quota, Invalid> {
    let (t_ns, t_us) = match check_rate(rate, period) {
        Ok(t) => t,
        Err(e) => return Err(e),
    };
    if let Err(e) = check_burst(burst, t_ns, t_us) {
        return Err(e);
    }
    Ok(Quota {
        rate,
        period_ns: period.as_nanos() as u64,
        burst,
        t_ns,
        t_us,
    })
}

/// Panics at the caller's call site (`#[track_caller]` up the chain), so the message points
/// at the user's `Quota::per_second(0)`, not inside tollgate.
#[track_caller]
const fn unwrap_const(q: Result<Quota, Invalid>) -> Quota {
    match q {
        Ok(q) => q,
        Err((_, reason)) => panic!("{}", reason),
    }
}

impl Quota {
    /// `rate` tokens per second, burst `rate`.
    ///
    /// # Panics
    ///
    /// If `rate` is 0 or above 1,000,000 (one token per microsecond). Use [`Quota::new`]
    /// for values that come from configuration: it returns a [`ConfigError`] instead.
    #[track_caller]
    pub const fn per_second(rate: u64) -> Self {
        unwrap_const(build(rate, Duration::from_secs(1), rate))
    }

    /// `rate` tokens per minute, burst `rate`.
    ///
    /// # Panics
    ///
    /// If `rate` is 0 or above 60,000,000.
    #[track_caller]
    pub const fn per_minute(rate: u64) -> Self {
        unwrap_const(build(rate, Duration::from_secs(60), rate))
    }

    /// `rate` tokens per hour, burst `rate`.
    ///
    /// # Panics
    ///
    /// If `rate` is 0 or above 3,600,000,000.
    #[track_caller]
    pub const fn per_hour(rate: u64) -> Self {
        unwrap_const(build(rate, Duration::from_secs(3_600), rate))
    }

    /// `rate` tokens per day, burst `rate`.
    ///
    /// # Panics
    ///
    /// If `rate` is 0 or above 86,400,000,000.
    #[track_caller]
    pub const fn per_day(rate: u64) -> Self {
        unwrap_const(build(rate, Duration::from_secs(86_400), rate))
    }

    /// `rate` per 7 days (a fixed length for every algorithm; a calendar limit counts per
    /// ISO week, Monday to Sunday, with it).
    ///
    /// # Panics
    ///
    /// If `rate` is 0 or above one per microsecond.
    #[track_caller]
    pub const fn per_week(rate: u64) -> Self {
        unwrap_const(build(rate, Duration::from_secs(7 * 86_400), rate))
    }

    /// `rate` per calendar month: only for an
    /// `Algorithm::Calendar` limit (feature `calendar`; a month has no fixed
    /// length; any other algorithm refuses it with a [`ConfigError`] naming `quota`). Its
    /// [`period`](Quota::period) reads as the longest month, 31 days.
    ///
    /// # Panics
    ///
    /// If `rate` is 0 or above one per microsecond.
    #[track_caller]
    pub const fn per_month(rate: u64) -> Self {
        unwrap_const(build(rate, MONTH, rate)).with_month(true)
    }

    /// `true` for a quota per calendar month ([`Quota::per_month`], `"…/month"`).
    pub const fn is_per_month(&self) -> bool {
        self.period_ns & MONTH_FLAG != 0
    }

    /// This quota, per calendar month or not.
    const fn with_month(mut self, month: bool) -> Self {
        self.period_ns = self.period_ns & !MONTH_FLAG | if month { MONTH_FLAG } else { 0 };
        self
    }

    /// `rate` tokens per `period`, burst `rate`; a [`ConfigError`] naming `rate` or
    /// `period` if they are zero, finer than one token per microsecond, or longer than
    /// 100 years.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    ///
    /// let q = Quota::new(5, Duration::from_secs(30)).unwrap();
    /// assert_eq!(q.emission_interval(), Duration::from_secs(6));
    /// assert_eq!(Quota::new(5, Duration::ZERO).unwrap_err().field(), "period");
    /// ```
    pub fn new(rate: u64, period: Duration) -> Result<Self, ConfigError> {
        build(rate, period, rate).map_err(|(f, r)| ConfigError::new(f, r))
    }

    /// The same rate with a bucket of `burst` tokens.
    ///
    /// # Panics
    ///
    /// If `burst` is 0, or so large that an empty bucket would take more than 100 years
    /// to refill. [`Quota::try_burst`] returns a [`ConfigError`] instead.
    #[track_caller]
    pub const fn burst(self, burst: u64) -> Self {
        unwrap_const(build(self.rate, self.period(), burst)).with_month(self.is_per_month())
    }

    /// The same rate with a bucket of `burst` tokens, or a [`ConfigError`] naming `burst`.
    pub fn try_burst(self, burst: u64) -> Result<Self, ConfigError> {
        build(self.rate, self.period(), burst)
            .map(|q| q.with_month(self.is_per_month()))
            .map_err(|(f, r)| ConfigError::new(f, r))
    }

    /// Tokens granted per [`period`](Quota::period).
    pub const fn rate(&self) -> u64 {
        self.rate
    }

    /// The period over which [`rate`](Quota::rate) tokens are granted.
    pub const fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns & !MONTH_FLAG)
    }

    /// The bucket capacity: how many tokens a full bucket holds.
    pub const fn burst_size(&self) -> u64 {
        self.burst
    }

    /// `T = period / rate`, rounded up to the nanosecond: how long one token takes to come
    /// back. Rounding up means rounding can never grant more than the quota.
    pub const fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.t_ns)
    }

    /// `burst × T`: how long an empty bucket takes to be full again.
    pub const fn refill_time(&self) -> Duration {
        Duration::from_nanos(self.tau_ns())
    }

    /// The window advertised as `w` in `RateLimit-Policy`: the refill time in whole
    /// seconds, rounded up and at least 1, so that `q / w` is the sustained rate.
    pub const fn window_secs(&self) -> u64 {
        let secs = self.tau_ns().div_ceil(NANOS_PER_SEC);
        if secs == 0 { 1 } else { secs }
    }

    /// One of `n` equal shares of this quota: a burst of `burst / n` (at least 1) and a
    /// rate of `rate / n`, as a period `n` times longer (`window`: a window's limit of
    /// `rate / n`, at least 1, over the same window, whose length must not change). What
    /// one of `n` instances spends on its own while the store they share is out of reach.
    /// `n` of 0 or 1, or a share the quota cannot express: the quota itself.
    pub(crate) fn share(&self, n: u64, window: bool) -> Quota {
        if n <= 1 {
            return *self;
        }
        let burst = (self.burst / n).max(1);
        let shared = if window {
            build((self.rate / n).max(1), self.period(), burst)
                .map(|q| q.with_month(self.is_per_month()))
        } else {
            match self.period_ns().checked_mul(n) {
                Some(p) => build(self.rate, Duration::from_nanos(p), burst),
                None => return *self,
            }
        };
        shared.unwrap_or(*self)
    }

    /// A share `f` of this quota (`0 < f <= 1`): what one instance may spend on its own
    /// when it served that part of the limit's traffic. GCRA: the rate times `f` (a period
    /// `1/f` times longer) and a burst of `burst * f` rounded up, at least 2 (the caller
    /// starts the share spent by the part over `burst * f`, so it holds `burst * f` tokens
    /// at first, and the rest is room for traffic that comes a little before its token:
    /// what it spends over the outage is still at most `burst * f` plus its rate's);
    /// a window: a limit of
    /// `rate * f` rounded down over the same window. `None` when nothing is left (`f` of
    /// 0, a window's limit under 1, a period the quota cannot express).
    pub(crate) fn portion(&self, f: f64, window: bool) -> Option<Quota> {
        if f.is_nan() || f <= 0.0 {
            return None;
        }
        if f >= 1.0 {
            return Some(*self);
        }
        let part = |x: u64| (x as f64 * f).floor() as u64;
        if window {
            let limit = part(self.rate);
            if limit == 0 {
                return None;
            }
            let burst = part(self.burst).clamp(1, limit);
            return build(limit, self.period(), burst)
                .ok()
                .map(|q| q.with_month(self.is_per_month()));
        }
        let period = self.period_ns() as f64 / f;
        if period.is_nan() || period >= 1e18 {
            return None;
        }
        build(
            self.rate,
            Duration::from_nanos(period as u64),
            ((self.burst as f64 * f).ceil() as u64).clamp(2, self.burst.max(2)),
        )
        .ok()
    }

    /// The period in nanoseconds.
    pub(crate) const fn period_ns(&self) -> u64 {
        self.period_ns & !MONTH_FLAG
    }

    pub(crate) const fn t_ns(&self) -> u64 {
        self.t_ns
    }

    pub(crate) const fn tau_ns(&self) -> u64 {
        self.burst * self.t_ns
    }

    /// Emission interval in microseconds, rounded up: the Redis store's unit.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn t_us(&self) -> u64 {
        self.t_us
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Quota");
        d.field("rate", &self.rate);
        if self.is_per_month() {
            d.field("period", &"month");
        } else {
            d.field("period", &self.period());
        }
        d.field("burst", &self.burst).finish()
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_per_month() {
            return write!(f, "{}/month; burst={}", self.rate, self.burst);
        }
        write!(f, "{}/{:?}; burst={}", self.rate, self.period(), self.burst)
    }
}

/// Parses `"<rate>/<period>[; burst=<n>]"`, the form used in configuration files.
///
/// The period is a unit (`ns`, `us` or `µs`, `ms`, `s`, `sec`, `second`, `m`, `min`,
/// `minute`, `h`, `hour`, `d`, `day`, `w`, `week` (7 days), plurals allowed) optionally preceded by a positive
/// decimal number: `"100/min"`, `"5/30s"`, `"2/1.5h"`, `"10/s; burst=20"`. Numbers are ASCII
/// digits. `"…/month"` is a quota per calendar month ([`Quota::per_month`]), for
/// calendar limits only. Whitespace around the parts is ignored. Errors name the part that is wrong
/// (`rate`, `period` or `burst`) and quote it as written. The [`Display`](fmt::Display)
/// form parses back to the same quota.
impl FromStr for Quota {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (rate_period, burst) = match s.split_once(';') {
            Some((rp, rest)) => {
                let rest = rest.trim();
                let value = rest
                    .strip_prefix("burst")
                    .map(str::trim_start)
                    .and_then(|r| r.strip_prefix('='))
                    .ok_or_else(|| {
                        ConfigError::new(
                            "burst",
                            format!("expected `burst=<n>` after `;`, found `{rest}`"),
                        )
                    })?;
                (rp, Some(parse_u64(value, "burst")?))
            }
            None => (s, None),
        };
        let (rate, period) = rate_period.split_once('/').ok_or_else(|| {
            ConfigError::new(
                "rate",
                format!(
                    "expected `<rate>/<period>`, e.g. `100/min`, found `{}`",
                    s.trim()
                ),
            )
        })?;
        let rate = parse_u64(rate, "rate")?;
        let quota = match period.trim() {
            "month" | "months" | "1month" => Quota::new(rate, MONTH).map(|q| q.with_month(true))?,
            period => Quota::new(rate, parse_period(period)?)?,
        };
        match burst {
            Some(b) => quota.try_burst(b),
            None => Ok(quota),
        }
    }
}

fn parse_u64(s: &str, field: &'static str) -> Result<u64, ConfigError> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConfigError::new(
            field,
            format!("`{s}` is not a whole number in ASCII digits"),
        ));
    }
    s.parse()
        .map_err(|_| ConfigError::new(field, format!("`{s}` is too large")))
}

/// `<count><unit>`: the unit is everything after the last ASCII digit or `.`, so that it is
/// reported exactly as written whatever it is made of.
pub(crate) fn parse_period(s: &str) -> Result<Duration, ConfigError> {
    let err = |reason: String| ConfigError::new("period", reason);
    // Digits and `.` are one byte each: `i + 1` is a character boundary.
    let split = s
        .rfind(|c: char| c.is_ascii_digit() || c == '.')
        .map_or(0, |i| i + 1);
    let (count, unit) = (s[..split].trim(), s[split..].trim());
    if unit.is_empty() {
        return Err(err(format!(
            "`{s}` needs a unit such as `s` or `min` after the number"
        )));
    }
    let unit_ns: u128 = match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000_000,
        "h" | "hour" | "hours" => 3_600_000_000_000,
        "d" | "day" | "days" => 86_400_000_000_000,
        "w" | "week" | "weeks" => 604_800_000_000_000,
        "month" | "months" | "mo" => {
            return Err(err(format!(
                "`{s}`: a quota counts one calendar month at a time (`/month`), not a multiple"
            )));
        }
        _ if unit.contains(char::is_numeric) => {
            return Err(err(format!(
                "`{unit}` is not a unit; write numbers in ASCII digits"
            )));
        }
        _ => {
            return Err(err(format!(
                "unknown unit `{unit}`; use ms, s, min, h or d"
            )));
        }
    };
    let ns = if count.is_empty() {
        Some(unit_ns)
    } else {
        let not_a_number = || err(format!("`{count}` is not a positive decimal number"));
        let (int, frac) = count.split_once('.').unwrap_or((count, ""));
        let frac = frac.trim_end_matches('0');
        if !count.bytes().any(|b| b.is_ascii_digit())
            || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
        {
            return Err(not_a_number());
        }
        if frac.len() > 18 {
            return Err(err(format!(
                "`{count}` has more decimals than a period can use"
            )));
        }
        // `count × unit`, exactly, rounded up to the nanosecond.
        let scale = 10u128.pow(frac.len() as u32);
        int.bytes()
            .chain(frac.bytes())
            .try_fold(0u128, |n, d| {
                n.checked_mul(10)?.checked_add(u128::from(d - b'0'))
            })
            .and_then(|mantissa| mantissa.checked_mul(unit_ns))
            .map(|scaled| scaled.div_ceil(scale))
    };
    match ns.map(u64::try_from) {
        Some(Ok(0)) => Err(err(format!("`{s}` must be longer than zero"))),
        Some(Ok(ns)) => Ok(Duration::from_nanos(ns)),
        _ => Err(err(format!("`{s}` must not exceed 100 years"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_means_n_per_second() {
        let q = Quota::per_second(4000);
        assert_eq!(q.emission_interval(), Duration::from_micros(250));
        assert_eq!(q.burst_size(), 4000);
        assert_eq!(q.refill_time(), Duration::from_secs(1));
        assert_eq!(q.window_secs(), 1);
    }

    #[test]
    fn emission_interval_rounds_up() {
        let q = Quota::per_second(3);
        assert_eq!(q.t_ns(), 333_333_334);
        assert_eq!(q.t_us(), 333_334);
        assert_eq!(q.tau_ns(), 1_000_000_002);
        assert_eq!(q.window_secs(), 2, "w is rounded up, never down");
    }

    #[test]
    fn errors_name_the_field() {
        let day = Duration::from_secs(86_400);
        assert_eq!(Quota::new(0, day).unwrap_err().field(), "rate");
        assert_eq!(Quota::new(1, Duration::ZERO).unwrap_err().field(), "period");
        assert_eq!(
            Quota::new(1, Duration::from_secs(u64::MAX))
                .unwrap_err()
                .field(),
            "period"
        );
        assert_eq!(
            Quota::new(2_000_000, Duration::from_secs(1))
                .unwrap_err()
                .field(),
            "rate"
        );
        let q = Quota::per_second(1);
        assert_eq!(q.try_burst(0).unwrap_err().field(), "burst");
        assert_eq!(q.try_burst(MAX_BURST + 1).unwrap_err().field(), "burst");
        // 10^12 tokens at one per second take ~31,700 years to refill.
        assert_eq!(q.try_burst(1_000_000_000_000).unwrap_err().field(), "burst");
        assert!(q.try_burst(3_000_000_000).is_ok(), "95 years is fine");
    }

    #[test]
    #[should_panic(expected = "must be at least 1")]
    fn const_constructor_panics_on_zero() {
        let _ = Quota::per_second(0);
    }

    #[test]
    #[should_panic(expected = "must be at least 1")]
    fn const_burst_panics_on_zero() {
        let _ = Quota::per_second(1).burst(0);
    }

    #[test]
    fn const_construction_is_evaluated_at_compile_time() {
        const Q: Quota = Quota::per_minute(60).burst(120);
        assert_eq!(Q.emission_interval(), Duration::from_secs(1));
        assert_eq!(Q.window_secs(), 120);
    }

    #[test]
    fn parses_configuration_strings() {
        assert_eq!("100/min".parse::<Quota>().unwrap(), Quota::per_minute(100));
        assert_eq!(" 10 / s ".parse::<Quota>().unwrap(), Quota::per_second(10));
        assert_eq!(
            "5/30s; burst=20".parse::<Quota>().unwrap(),
            Quota::new(5, Duration::from_secs(30)).unwrap().burst(20)
        );
        assert_eq!(
            "2/1.5h".parse::<Quota>().unwrap(),
            Quota::new(2, Duration::from_secs(5_400)).unwrap()
        );
        assert_eq!(
            "1/250ms".parse::<Quota>().unwrap(),
            Quota::new(1, Duration::from_millis(250)).unwrap()
        );
        for (input, field) in [
            ("", "rate"),
            ("10", "rate"),
            ("-1/s", "rate"),
            ("1.5/s", "rate"),
            ("0/s", "rate"),
            ("99999999999999999999/s", "rate"),
            ("10/NaNs", "period"),
            ("10/-1s", "period"),
            ("10/0s", "period"),
            ("10/infs", "period"),
            ("10/1e300s", "period"),
            ("10/fortnight", "period"),
            ("10/5", "period"),
            ("10/s; burst=0", "burst"),
            ("10/s; burst=-3", "burst"),
            ("10/s; burst", "burst"),
            ("10/s; size=3", "burst"),
        ] {
            let err = input.parse::<Quota>().unwrap_err();
            assert_eq!(err.field(), field, "{input:?}: {err}");
        }
    }

    #[test]
    fn display_round_trips_through_debug_friendly_form() {
        let day = Duration::from_secs(86_400);
        for q in [
            Quota::per_second(10).burst(20),
            Quota::per_minute(100),
            Quota::per_day(1),
            Quota::new(2, Duration::from_secs(5_400)).unwrap(),
            Quota::new(1, Duration::from_millis(250)).unwrap().burst(3),
            Quota::new(1, Duration::from_micros(10)).unwrap(),
            Quota::new(3, Duration::from_nanos(1_000_000_001)).unwrap(),
            Quota::new(1, 36_500 * day).unwrap(),
            Quota::per_second(1_000_000),
        ] {
            let shown = q.to_string();
            assert_eq!(shown.parse::<Quota>(), Ok(q), "{shown}");
        }
        assert_eq!(
            Quota::per_second(10).burst(20).to_string(),
            "10/1s; burst=20"
        );
        assert_eq!(
            Quota::new(1, Duration::from_micros(1_500))
                .unwrap()
                .to_string(),
            "1/1.5ms; burst=1"
        );
    }

    /// The bug a random case of `an_unknown_unit_is_quoted_as_written` found (a
    /// cargo-mutants run, 2026-11-29): the property took every unit it drew for an unknown
    /// one, and drew `ns`. `5/ns` names a known unit; it is refused for its rate, which no
    /// quota can hold, not for its unit.
    #[test]
    fn a_known_unit_too_fast_is_a_rate_error_not_an_unknown_unit() {
        for input in ["5/ns", "5/ ns ", "5/us", "5/\u{b5}s"] {
            let e = input.parse::<Quota>().unwrap_err();
            assert_eq!(e.field(), "rate", "{input}: {e}");
        }
        assert!(parse_period("1ns").is_ok());
        assert!(parse_period("1nsec").is_err());
    }

    proptest::proptest! {
        #[test]
        fn every_displayed_quota_parses_back(
            rate in 1u64..=1_000_000,
            period_ns in 1_000u64..=3_000_000_000_000_000_000,
            burst in 1u64..=1_000_000,
        ) {
            let Ok(q) = Quota::new(rate, Duration::from_nanos(period_ns))
                .and_then(|q| q.try_burst(burst))
            else {
                return Ok(());
            };
            let shown = q.to_string();
            proptest::prop_assert_eq!(shown.parse::<Quota>(), Ok(q), "{}", shown);
        }

        #[test]
        fn any_input_is_an_answer_not_a_panic(input in "\\PC{0,12}(/\\PC{0,12}(;\\PC{0,12})?)?") {
            if let Err(e) = input.parse::<Quota>() {
                proptest::prop_assert!(["rate", "period", "burst"].contains(&e.field()), "{}", e);
            }
        }

        #[test]
        fn an_unknown_unit_is_quoted_as_written(unit in "[^0-9./;]{1,8}") {
            let trimmed = unit.trim();
            proptest::prop_assume!(!trimmed.is_empty());
            // A known unit, however it is padded, is no unknown unit (`5/ns` is too fast a
            // rate: see `a_known_unit_too_fast_is_a_rate_error_not_an_unknown_unit`).
            proptest::prop_assume!(parse_period(&format!("1{unit}")).is_err());
            if let Err(e) = format!("5/{unit}").parse::<Quota>() {
                proptest::prop_assert_eq!(e.field(), "period");
                proptest::prop_assert!(e.reason().contains(&format!("`{trimmed}`")), "{}", e);
            }
        }
    }

    #[test]
    fn odd_characters_are_reported_as_written() {
        for (input, field, quoted) in [
            ("100/\u{ff4d}in", "period", "`\u{ff4d}in`"), // full-width m
            (
                "100/\u{ff4d}\u{ff49}\u{ff4e}",
                "period",
                "`\u{ff4d}\u{ff49}\u{ff4e}`",
            ),
            (
                "\u{ff11}\u{ff10}\u{ff10}/min",
                "rate",
                "`\u{ff11}\u{ff10}\u{ff10}`",
            ), // full-width 100
            ("100/\u{ff11}min", "period", "`\u{ff11}min`"),
            ("100/1\u{ff4d}in", "period", "`\u{ff4d}in`"),
            ("5/s\u{301}", "period", "`s\u{301}`"), // s and a combining acute
            ("5/\u{301}s", "period", "`\u{301}s`"),
            ("5/\u{1f40c}", "period", "`\u{1f40c}`"), // a snail
            ("5/1\u{1f40c}", "period", "`\u{1f40c}`"),
            ("\u{1f40c}/s", "rate", "`\u{1f40c}`"),
            ("5/s;burst=\u{663}", "burst", "`\u{663}`"), // Arabic-Indic 3
            ("5/\u{663}s", "period", "`\u{663}s`"),
            ("5/s; burst=\u{ff13}", "burst", "`\u{ff13}`"),
            ("5/s; bürst=3", "burst", "`bürst=3`"),
            ("5/1.5.5s", "period", "`1.5.5`"),
            ("5/-1s", "period", "`-1`"),
            ("5/1e3s", "period", "`1e3`"),
            ("5\u{a0}s", "rate", "`5\u{a0}s`"),
        ] {
            let err = input.parse::<Quota>().unwrap_err();
            assert_eq!(err.field(), field, "{input:?}: {err}");
            assert!(err.reason().contains(quoted), "{input:?}: {err}");
        }
        // Whitespace around a part is ignored, even before the unit.
        assert_eq!("5/ s".parse::<Quota>(), Ok(Quota::per_second(5)));
        assert_eq!(
            "5 / 1 s ; burst = 7".parse::<Quota>(),
            Ok(Quota::per_second(5).burst(7))
        );
        assert_eq!(
            "1/1µs".parse::<Quota>().unwrap().period(),
            Duration::from_micros(1)
        );
    }
    #[test]
    fn weeks_are_seven_days_and_months_are_calendar_months() {
        let w: Quota = "7/week".parse().unwrap();
        assert_eq!(w, Quota::per_week(7));
        assert_eq!(w.period(), Duration::from_secs(7 * 86_400));
        assert!(!w.is_per_month());
        assert_eq!("14/2w".parse::<Quota>().unwrap().period(), 2 * w.period());
        let m: Quota = "10000/month".parse().unwrap();
        assert_eq!(m, Quota::per_month(10_000));
        assert!(m.is_per_month());
        assert_eq!(m.period(), Duration::from_secs(31 * 86_400));
        // 31 days written out is not a calendar month.
        assert!(!"10000/31d".parse::<Quota>().unwrap().is_per_month());
        assert_ne!("10000/31d".parse::<Quota>().unwrap(), m);
        assert_eq!(m.to_string(), "10000/month; burst=10000");
        assert_eq!(m.to_string().parse::<Quota>().unwrap(), m);
        assert!(format!("{m:?}").contains("\"month\""));
        // A burst and a share keep the month.
        assert!(m.burst(5).is_per_month() && m.try_burst(5).unwrap().is_per_month());
        assert!(m.share(4, true).is_per_month());
        assert_eq!(m.share(4, true).rate(), 2_500);
        for bad in ["1/2month", "1/0.5month", "1/mo"] {
            assert_eq!(bad.parse::<Quota>().unwrap_err().field(), "period", "{bad}");
        }
    }

    #[test]
    fn a_share_is_an_nth_of_the_burst_and_the_rate() {
        let q = Quota::per_second(1_000).burst(100);
        let s = q.share(4, false);
        assert_eq!(s.burst_size(), 25);
        assert_eq!(s.emission_interval(), Duration::from_millis(4));
        assert_eq!(q.share(1, false), q);
        assert_eq!(q.share(0, false), q);
        // Never under one token.
        assert_eq!(Quota::per_second(3).share(10, false).burst_size(), 1);
        // A window keeps its length: a tenth of its limit in the same window.
        let w = Quota::new(100, Duration::from_secs(60)).unwrap();
        let s = w.share(10, true);
        assert_eq!(
            (s.rate(), s.period(), s.burst_size()),
            (10, Duration::from_secs(60), 10)
        );
    }

    #[test]
    fn a_portion_has_its_rate_and_room_beyond_its_burst() {
        let q = Quota::per_second(137).burst(20);
        // 1.996 tokens: a bucket of 2 (rounded down to 1 it had no room).
        let p = q.portion(0.0998, false).unwrap();
        assert_eq!(p.burst_size(), 2);
        assert_eq!(p.rate(), 137);
        assert_eq!(p.period_ns(), (1e9 / 0.0998) as u64);
        // 5.2 tokens: 6; under one token: 2; a burst of 1: 2 as well.
        assert_eq!(q.portion(0.26, false).unwrap().burst_size(), 6);
        assert_eq!(q.portion(0.01, false).unwrap().burst_size(), 2);
        let one = Quota::per_second(5).burst(1);
        assert_eq!(one.portion(0.5, false).unwrap().burst_size(), 2);
        // Never over the quota's burst when that is 2 or more; the whole of it at 1.
        assert_eq!(q.portion(0.999, false).unwrap().burst_size(), 20);
        assert_eq!(q.portion(1.0, false), Some(q));
        assert_eq!(q.portion(0.0, false), None);
        // A window: its limit times f, rounded down, over the same window.
        let w = Quota::new(100, Duration::from_secs(60)).unwrap();
        let s = w.portion(0.257, true).unwrap();
        assert_eq!((s.rate(), s.period()), (25, Duration::from_secs(60)));
    }
}
