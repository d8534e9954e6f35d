//! [`Ban`]: bans that escalate. `after` refusals of a key within `within` ban the key for
//! `for`, multiplied by `escalate` for each repeat within `forget` of the previous ban's
//! end, capped at `max`. Refusals during a ban never count, and counting starts afresh
//! when a ban begins.

use std::time::Duration;

use crate::base::error::ConfigError;

/// The most repeats an escalation counts: `escalate^level` is computed in floating point
/// and capped at `max`, so a higher level could only say the same.
const MAX_LEVEL: u32 = 64;

/// How a limit bans the keys it keeps refusing (fail2ban with `bantime.increment`,
/// rack-attack's `Fail2Ban`).
///
/// `after` refusals of one key within `within` ban the key for `for_`; a ban that begins
/// within `forget` of the end of the key's previous ban is a repeat, and lasts
/// `for_ × escalate^repeats`, at most `max`. A banned request is refused before the store
/// is asked (403, or 429 with [`Limit::ban_status`](crate::Limit::ban_status)), with the
/// ban's remaining time as `Retry-After`, and never counts as a refusal: a ban ends when
/// it says, whatever the client does meanwhile. Counting starts afresh when a ban begins.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Ban;
///
/// // 3 refusals within a minute: 10 minutes, then 20, 40, ... at most a day; a key
/// // that behaves for a day after its last ban starts again at 10 minutes.
/// let ban = Ban::after(3)
///     .within(Duration::from_secs(60))
///     .for_(Duration::from_secs(600))
///     .escalate(2.0)
///     .max(Duration::from_secs(86_400))
///     .forget(Duration::from_secs(86_400));
/// assert_eq!(ban.length(0), Duration::from_secs(600));
/// assert_eq!(ban.length(2), Duration::from_secs(2_400));
/// assert_eq!(ban.length(20), Duration::from_secs(86_400));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ban {
    pub(crate) after: u32,
    pub(crate) within: Duration,
    pub(crate) for_: Duration,
    pub(crate) escalate: f64,
    pub(crate) max: Duration,
    pub(crate) forget: Duration,
}

// `escalate` is checked finite when the limit is built; a NaN is refused there.
impl Eq for Ban {}

impl Ban {
    /// A ban after `refusals` refusals within a minute, for 10 minutes, not escalating
    /// (`escalate` 1, `max` = `for`, `forget` a day).
    pub const fn after(refusals: u32) -> Self {
        Self {
            after: refusals,
            within: Duration::from_secs(60),
            for_: Duration::from_secs(600),
            escalate: 1.0,
            max: Duration::from_secs(600),
            forget: Duration::from_secs(86_400),
        }
    }

    /// The time within which `after` refusals ban the key (default a minute).
    pub const fn within(mut self, within: Duration) -> Self {
        self.within = within;
        self
    }

    /// The first ban's length (default 10 minutes). Raises `max` to it if `max` was
    /// shorter, so `Ban::after(3).for_(d)` bans for `d` each time.
    pub const fn for_(mut self, length: Duration) -> Self {
        self.for_ = length;
        if self.max.as_nanos() < length.as_nanos() {
            self.max = length;
        }
        self
    }

    /// Each repeat's ban is the previous one's length times `factor` (≥ 1; default 1).
    pub const fn escalate(mut self, factor: f64) -> Self {
        self.escalate = factor;
        self
    }

    /// The longest ban (default: `for`).
    pub const fn max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// How long after a ban ends a new ban still counts as a repeat (default a day).
    pub const fn forget(mut self, forget: Duration) -> Self {
        self.forget = forget;
        self
    }

    /// The refusals that ban.
    pub const fn refusals(&self) -> u32 {
        self.after
    }

    /// The length of a ban with `repeats` earlier bans within `forget`:
    /// `for × escalate^repeats`, at most `max`.
    pub fn length(&self, repeats: u32) -> Duration {
        let factor = self.escalate.powi(repeats.min(MAX_LEVEL) as i32);
        let nanos = self.for_.as_nanos() as f64 * factor;
        if !nanos.is_finite() || nanos >= self.max.as_nanos() as f64 {
            self.max
        } else {
            Duration::from_nanos(nanos as u64).min(self.max)
        }
    }

    /// Checks the settings; errors name the field as `ban.<field>`.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let err = |field: &str, reason: &'static str| {
            Err(ConfigError::new(format!("ban.{field}"), reason))
        };
        if self.after == 0 {
            return err(
                "after",
                "must be at least 1 (0 would ban every key before its first refusal)",
            );
        }
        if self.within.is_zero() {
            return err("within", "must be more than zero");
        }
        if self.for_.is_zero() {
            return err("for", "must be more than zero");
        }
        if !self.escalate.is_finite() || self.escalate < 1.0 {
            return err(
                "escalate",
                "must be a finite number of at least 1 (1: every ban is as long)",
            );
        }
        if self.max < self.for_ {
            return err("max", "must be at least `for`, the first ban's length");
        }
        // Redis keys expire in whole milliseconds; a century keeps every value exact.
        let century = Duration::from_secs(100 * 365 * 86_400);
        for (field, d) in [
            ("within", self.within),
            ("max", self.max),
            ("forget", self.forget),
        ] {
            if d > century {
                return err(field, "must be at most 100 years");
            }
        }
        if self.for_ < Duration::from_millis(1) {
            return err(
                "for",
                "must be at least 1 ms (Redis keeps bans in whole ms)",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_escalate_up_to_max() {
        let ban = Ban::after(3)
            .for_(Duration::from_secs(10))
            .escalate(2.0)
            .max(Duration::from_secs(100));
        let lengths: Vec<u64> = (0..6).map(|l| ban.length(l).as_secs()).collect();
        assert_eq!(lengths, [10, 20, 40, 80, 100, 100]);
        assert_eq!(ban.length(u32::MAX), Duration::from_secs(100));
        let flat = Ban::after(1).for_(Duration::from_secs(7));
        assert_eq!(flat.length(9), Duration::from_secs(7));
    }

    #[test]
    fn errors_name_the_field() {
        let field = |b: Ban| b.validate().unwrap_err().field().to_owned();
        assert_eq!(field(Ban::after(0)), "ban.after");
        assert_eq!(field(Ban::after(1).escalate(0.5)), "ban.escalate");
        assert_eq!(field(Ban::after(1).escalate(f64::NAN)), "ban.escalate");
        let short = Ban::after(1)
            .for_(Duration::from_secs(60))
            .max(Duration::from_secs(1));
        assert_eq!(field(short), "ban.max");
        assert_eq!(field(Ban::after(1).within(Duration::ZERO)), "ban.within");
        assert_eq!(field(Ban::after(1).for_(Duration::ZERO)), "ban.for");
        assert!(Ban::after(3).validate().is_ok());
    }
}
