//! A request's own deadline: gRPC's `grpc-timeout`, which caps how long a request in
//! delay mode may wait (a call that would wait past its deadline is better refused at
//! once).

use std::time::Duration;

use http::HeaderValue;
use http::request::Parts;

/// The longest the request may wait: `max_wait`, or less if it carries a deadline.
#[inline]
pub(crate) fn max_wait_of(max_wait: Duration, parts: &Parts) -> Duration {
    match parts.headers.get("grpc-timeout").and_then(grpc_timeout) {
        Some(deadline) => max_wait.min(deadline),
        None => max_wait,
    }
}

/// A `grpc-timeout` value (gRPC over HTTP/2: up to 8 digits and a unit, `H M S m u n`).
fn grpc_timeout(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3_600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_deadline_caps_the_wait() {
        let max_wait = Duration::from_secs(2);
        let parts = |timeout: Option<&str>| {
            let mut b = http::Request::builder();
            if let Some(t) = timeout {
                b = b.header("grpc-timeout", t);
            }
            b.body(()).unwrap().into_parts().0
        };
        assert_eq!(max_wait_of(max_wait, &parts(None)), Duration::from_secs(2));
        assert_eq!(
            max_wait_of(max_wait, &parts(Some("500m"))),
            Duration::from_millis(500)
        );
        assert_eq!(
            max_wait_of(max_wait, &parts(Some("1H"))),
            Duration::from_secs(2)
        );
        assert_eq!(
            max_wait_of(max_wait, &parts(Some("3S"))),
            Duration::from_secs(2)
        );
        assert_eq!(
            max_wait_of(max_wait, &parts(Some("250000u"))),
            Duration::from_millis(250)
        );
        // Not a gRPC timeout: the limit's own wait.
        for bad in ["", "m", "10", "10x", "123456789S", "-5m", "1.5S"] {
            assert_eq!(
                max_wait_of(max_wait, &parts(Some(bad))),
                Duration::from_secs(2),
                "{bad:?}"
            );
        }
    }
}
