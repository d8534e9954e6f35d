//! Waits as whole units, rounded up: a positive wait is never shown as `0`.

use std::time::Duration;

/// Milliseconds, rounded up.
pub(crate) fn ceil_ms(wait: Duration) -> u128 {
    wait.as_nanos().div_ceil(1_000_000)
}

/// Seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_positive_wait_is_never_zero() {
        assert_eq!(ceil_ms(Duration::ZERO), 0);
        assert_eq!(ceil_ms(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_ms(Duration::from_millis(1_500)), 1_500);
        assert_eq!(ceil_ms(Duration::from_micros(1_500)), 2);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(2_000)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2_001)), 3);
    }
}
