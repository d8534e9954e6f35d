//! A rule's stream settings: `per`, `direction`, `over_limit` (with `max_wait`),
//! `rate_after`, and a quota of bytes (`"1MiB/s; burst=256KiB"`), counted in tokens of a
//! power-of-two number of bytes (a quota counts at most one token a microsecond).

use std::time::Duration;

use crate::algo::quota::{Quota, parse_period};
use crate::base::error::ConfigError;
use crate::model::stream::{Direction, OverLimit, Per};
use crate::rules::document::LimitRule;
use crate::web::limit::Limit;

use super::keys::unknown;

/// The most bytes a token may stand for: 1 GiB.
const MAX_UNIT: u64 = 1 << 30;

/// What a token of the rule pays for (`per`).
pub(super) fn per(rule: &LimitRule) -> Result<Per, ConfigError> {
    match rule.per.as_deref() {
        None | Some("request") => Ok(Per::Request),
        Some("message") => Ok(Per::Message),
        Some("byte") => Ok(Per::Byte),
        Some(other) => Err(unknown("per", other, "request, message, byte")),
    }
}

/// `1024`, `"1KiB"`, `"1MiB"`, `"1.5MB"` as bytes; binary (`KiB`, `MiB`, `GiB`) and
/// decimal (`kB`/`KB`, `MB`, `GB`) units, `B` or none for bytes.
pub(super) fn size(text: &str, field: &str) -> Result<u64, ConfigError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    let scale: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(ConfigError::new(
                field.to_owned(),
                format!(
                    "unknown unit `{other}` in `{text}`; expected one of: B, KiB, MiB, GiB, kB, MB, GB"
                ),
            ));
        }
    };
    let bad = || {
        ConfigError::new(
            field.to_owned(),
            format!("expected a size such as `256KiB` or `1MiB`, found `{text}`"),
        )
    };
    let bytes = match number.split_once('.') {
        None => number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
            .ok_or_else(bad)?,
        Some((whole, fraction)) => {
            if whole.is_empty() || fraction.is_empty() || fraction.contains('.') {
                return Err(bad());
            }
            let value: f64 = number.parse().map_err(|_| bad())?;
            let bytes = value * scale as f64;
            if !(bytes.is_finite() && bytes < u64::MAX as f64) {
                return Err(bad());
            }
            bytes as u64
        }
    };
    if bytes == 0 {
        return Err(ConfigError::new(
            field.to_owned(),
            "must be at least 1 byte",
        ));
    }
    Ok(bytes)
}

/// A quota of bytes, `"<size>/<period>[; burst=<size>]"`: the quota in tokens, and the
/// bytes a token stands for (the smallest power of two that keeps a token at least a
/// microsecond apart). Rate and burst are rounded down to whole tokens: never more than
/// written.
pub(super) fn byte_quota(text: &str, field: &str) -> Result<(Quota, u32), ConfigError> {
    // Named as a quota's errors are: the field, and the part in the reason.
    byte_quota_parts(text).map_err(|e| {
        let reason = match e.field() {
            "" => e.reason().to_owned(),
            part => format!("{part}: {}", e.reason()),
        };
        ConfigError::new(field.to_owned(), reason)
    })
}

/// [`byte_quota`], its errors naming the part (`rate`, `period`, `burst`).
fn byte_quota_parts(text: &str) -> Result<(Quota, u32), ConfigError> {
    let at = |sub: &str| sub.to_owned();
    let (rate_period, burst) = match text.split_once(';') {
        Some((rp, rest)) => {
            let rest = rest.trim();
            let value = rest
                .strip_prefix("burst")
                .map(str::trim_start)
                .and_then(|r| r.strip_prefix('='))
                .ok_or_else(|| {
                    ConfigError::new(
                        at("burst"),
                        format!("expected `burst=<size>` after `;`, found `{rest}`"),
                    )
                })?;
            (rp, Some(size(value, &at("burst"))?))
        }
        None => (text, None),
    };
    let (rate, period) = rate_period.split_once('/').ok_or_else(|| {
        ConfigError::new(
            "",
            format!(
                "expected `<size>/<period>`, e.g. `1MiB/s; burst=256KiB`, found `{}`",
                text.trim()
            ),
        )
    })?;
    let rate = size(rate, &at("rate"))?;
    let period = match period.trim() {
        "s" | "sec" | "second" => Duration::from_secs(1),
        "min" | "minute" => Duration::from_secs(60),
        "h" | "hour" => Duration::from_secs(3_600),
        other => parse_period(other)
            .map_err(|e| ConfigError::new(at("period"), e.reason().to_owned()))?,
    };
    let burst = burst.unwrap_or(rate);
    // Tokens at least a microsecond apart: period × unit / rate ≥ 1 µs.
    let period_ns = period.as_nanos();
    let mut unit: u64 = 1;
    while period_ns * u128::from(unit) < 1_000 * u128::from(rate) {
        unit *= 2;
        if unit > MAX_UNIT {
            return Err(ConfigError::new(
                at("rate"),
                "more than a GiB per microsecond is not supported",
            ));
        }
    }
    if burst < unit {
        return Err(ConfigError::new(
            at("burst"),
            format!(
                "{burst} bytes is less than one token of this rate ({unit} bytes): give a larger burst"
            ),
        ));
    }
    let quota = Quota::new(rate / unit, period).and_then(|q| q.try_burst(burst / unit))?;
    // At most 2^30: a u32.
    Ok((quota, unit as u32))
}

/// The stream settings of `rule` on `limit`; `unit` is the bytes a token stands for
/// (`per = "byte"`). Errors are relative to the entry.
pub(super) fn settings(
    rule: &LimitRule,
    per: Per,
    unit: Option<u32>,
    mut limit: Limit,
) -> Result<Limit, ConfigError> {
    if per == Per::Request {
        for (field, set) in [
            ("direction", rule.direction.is_some()),
            ("over_limit", rule.over_limit.is_some()),
            ("rate_after", rule.rate_after.is_some()),
        ] {
            if set {
                return Err(ConfigError::new(
                    field,
                    "only a limit of messages or bytes (`per = \"message\"` or `\"byte\"`) counts inside requests",
                ));
            }
        }
        return Ok(limit);
    }
    // What a limit of requests has and a stream limit does not (but a limit of bytes
    // may pace the response bodies of its routes).
    for (field, set) in [
        ("routes", rule.routes.is_some() && per != Per::Byte),
        ("plans", rule.plans.is_some()),
        ("cost", rule.cost.is_some()),
        ("settle", rule.settle.is_some()),
        ("ban", rule.ban.is_some()),
        ("on_limit", rule.on_limit.is_some()),
        ("in_flight", rule.in_flight.is_some()),
        ("on_missing_key", rule.on_missing_key.is_some()),
    ] {
        if set {
            return Err(ConfigError::new(
                field,
                "a limit of messages or bytes is charged by the streams that name it, not when \
                 requests arrive: it takes no `plans`, `cost`, `settle`, `ban`, `on_limit`, \
                 `in_flight` or `on_missing_key`, and only a limit of bytes takes `routes` \
                 (it paces their response bodies; `over_limit` says what a stream over it \
                 does)",
            ));
        }
    }
    limit = limit.per(per);
    limit = limit.direction(match rule.direction.as_deref() {
        None | Some("in") => Direction::In,
        Some("out") => Direction::Out,
        Some("both") => Direction::Both,
        Some(other) => return Err(unknown("direction", other, "in, out, both")),
    });
    let max_wait = match &rule.max_wait {
        None => None,
        Some(text) => Some(parse_period(text).map_err(|e| {
            ConfigError::new(
                "max_wait",
                format!("expected a duration such as `2s`: {}", e.reason()),
            )
        })?),
    };
    limit = limit.over_limit(match rule.over_limit.as_deref() {
        None | Some("wait") => {
            let over = max_wait.map_or_else(OverLimit::default, OverLimit::wait);
            match rule.max_waiters {
                Some(n) => over.max_waiters(n),
                None => over,
            }
        }
        Some("end") => {
            if max_wait.is_some() {
                return Err(ConfigError::new(
                    "max_wait",
                    "only a limit with `over_limit = \"wait\"` waits",
                ));
            }
            if rule.max_waiters.is_some() {
                return Err(ConfigError::new(
                    "max_waiters",
                    "only a limit with `over_limit = \"wait\"` has waiters",
                ));
            }
            OverLimit::End
        }
        Some(other) => return Err(unknown("over_limit", other, "wait, end")),
    });
    if let Some(text) = &rule.rate_after {
        if per != Per::Byte {
            return Err(ConfigError::new(
                "rate_after",
                "only a limit of bytes (`per = \"byte\"`) lets the first bytes through",
            ));
        }
        limit = limit.rate_after(size(text, "rate_after")?);
    }
    if let Some(unit) = unit {
        limit = limit.unit(unit);
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_binary_and_decimal_units() {
        assert_eq!(size("1024", "f").unwrap(), 1024);
        assert_eq!(size("1KiB", "f").unwrap(), 1024);
        assert_eq!(size("1 MiB", "f").unwrap(), 1 << 20);
        assert_eq!(size("2GiB", "f").unwrap(), 2 << 30);
        assert_eq!(size("1.5kB", "f").unwrap(), 1_500);
        assert_eq!(size("3MB", "f").unwrap(), 3_000_000);
        assert_eq!(size("7B", "f").unwrap(), 7);
        for bad in [
            "", "MiB", "1.", ".5KiB", "1..2KiB", "-1", "0", "0KiB", "1 parsec",
        ] {
            let e = size(bad, "f").unwrap_err();
            assert_eq!(e.field(), "f", "{bad}");
        }
        assert!(
            size("1 parsec", "f")
                .unwrap_err()
                .reason()
                .contains("unknown unit `parsec`")
        );
        assert!(size("99999999999999GiB", "f").is_err(), "overflow");
        // A fraction past u64::MAX bytes, or exactly 2^64, is refused, not saturated.
        assert!(size("20000000000.5GB", "f").is_err());
        assert!(size("18446744073709551616.0", "f").is_err());
        assert_eq!(size("1.5GiB", "f").unwrap(), 3 << 29);
    }

    #[test]
    fn a_byte_quota_counts_in_the_smallest_unit_that_keeps_a_microsecond() {
        let (q, unit) = byte_quota("1MiB/s; burst=256KiB", "quota").unwrap();
        // 1,048,576 bytes a second need tokens of 2 bytes at least: T = 1.9 µs.
        assert_eq!(unit, 2);
        assert_eq!((q.rate(), q.burst_size()), (524_288, 131_072));
        let (q, unit) = byte_quota("100KiB/min", "quota").unwrap();
        assert_eq!((unit, q.rate(), q.burst_size()), (1, 102_400, 102_400));
        assert_eq!(q.period(), Duration::from_secs(60));
        let (q, unit) = byte_quota("1GB/s; burst=10MB", "quota").unwrap();
        assert_eq!(unit, 1024);
        // Rounded down: never more than written.
        assert_eq!((q.rate(), q.burst_size()), (976_562, 9_765));
        // A million bytes a second: a byte is exactly a microsecond, so the unit is 1;
        // one more byte a second, 2.
        assert_eq!(byte_quota("1MB/s", "quota").unwrap().1, 1);
        assert_eq!(byte_quota("1000001/s", "quota").unwrap().1, 2);
        // A burst of exactly one token is enough.
        let (q, unit) = byte_quota("2000000/s; burst=2", "quota").unwrap();
        assert_eq!((unit, q.burst_size()), (2, 1));
        // The largest unit, 2^30 bytes (a GiB a microsecond), is taken; beyond, refused.
        assert_eq!(byte_quota("1000000GB/s", "quota").unwrap().1, 1 << 30);
        let e = byte_quota("2000000GB/s", "quota").unwrap_err();
        assert!(
            e.reason().contains("more than a GiB per microsecond"),
            "{e}"
        );
    }

    #[test]
    fn bad_byte_quotas_name_their_part() {
        let part = |text: &str| {
            let e = byte_quota(text, "quota").unwrap_err();
            assert_eq!(e.field(), "quota", "{text}");
            e.reason().split(':').next().unwrap().to_owned()
        };
        assert!(part("1MiB").starts_with("expected `<size>/<period>`"));
        assert_eq!(part("1MiB/s; rate=2"), "burst");
        assert_eq!(part("1MiB/s; burst=x"), "burst");
        assert_eq!(part("lots/s"), "rate");
        assert_eq!(part("1MiB/fortnight"), "period");
        assert_eq!(part("1GiB/s; burst=1"), "burst");
    }
}
