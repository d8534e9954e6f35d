//! [`Violation`]: one refusal as the audit log records it, and its time in RFC 3339.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The most bytes of a route a violation keeps: a request path is client input, and the
/// audit log holds many violations (the SQL column is `VARCHAR(255)`).
pub const MAX_ROUTE_LEN: usize = 255;

/// One refusal by one limit, as the audit log records it.
///
/// A request refused by two limits gives two violations; a shadow limit that would have
/// refused gives one with [`shadow`](Self::shadow) set, whether or not the request was
/// refused by another limit. Every field is bounded: the key is at most ~65 bytes (or its
/// hash), the route at most [`MAX_ROUTE_LEN`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Violation {
    /// The limit's name.
    pub limit: &'static str,
    /// The bucket's key as logs show it: addresses in the clear (`@203.0.113.7`), every
    /// other key as `#` and 16 hex digits (the same hash in every process), unless
    /// [`redact_keys`](crate::RateLimitBuilder::redact_keys) says otherwise (the same
    /// policy as refusal events and offender summaries). `~missing` for the shared bucket
    /// of requests without a key.
    pub key: String,
    /// The client's address: the peer's, or the client behind trusted proxies when the
    /// layer has [`client_ip`](crate::RateLimitBuilder::client_ip); `None` when unknown.
    pub client: Option<IpAddr>,
    /// axum's matched route template, else the request path (cut to [`MAX_ROUTE_LEN`]
    /// bytes).
    pub route: String,
    /// Whole tokens left in the bucket when the request was refused.
    pub tokens_left: u64,
    /// How long until the request would pass, if a wait can help (`None`: the cost is more
    /// than the bucket holds).
    pub retry_after: Option<Duration>,
    /// What the request would have cost.
    pub cost: u32,
    /// The limit's [`rule_id`](crate::Limit::rule_id), if it has one.
    pub rule_id: Option<u64>,
    /// A shadow limit's "would refuse": the request was not refused by this limit.
    pub shadow: bool,
    /// When the request was refused (wall clock).
    pub at: SystemTime,
    /// The key was banned ([`Ban`](crate::Ban)): the request was refused before the
    /// store was asked, and [`retry_after`](Self::retry_after) is the time the ban had
    /// left. (The SQL sink has no column for it: such rows read as refusals.)
    pub banned: bool,
}

impl Violation {
    /// [`at`](Self::at) in RFC 3339, UTC, with microseconds: `2025-01-31T23:59:59.123456Z`
    /// (what the SQL sink writes, and what SQLite's and PostgreSQL's date functions read).
    pub fn at_rfc3339(&self) -> String {
        rfc3339(self.at)
    }
}

/// A violation as the request path queues it: the key not yet rendered (a `Key` is
/// inline, so this costs a copy, and the hashing or formatting happens in the writer).
pub(crate) struct Queued {
    pub(crate) violation: Violation,
    pub(crate) key: Option<crate::web::key::Key>,
    /// The layer's `redact_keys` (one log may serve several layers).
    pub(crate) redact: Option<bool>,
}

impl Queued {
    /// The violation with its key rendered as logs show it.
    pub(crate) fn into_violation(self) -> Violation {
        let mut v = self.violation;
        if let Some(key) = &self.key {
            v.key = crate::observe::offenders::render(key, self.redact);
        }
        v
    }
}

/// `route` cut to at most [`MAX_ROUTE_LEN`] bytes, on a character boundary.
pub(crate) fn bounded_route(route: &str) -> String {
    let mut end = route.len().min(MAX_ROUTE_LEN);
    while !route.is_char_boundary(end) {
        end -= 1;
    }
    route[..end].to_owned()
}

/// RFC 3339 in UTC with microseconds; times before 1970 are written as the epoch.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60,
        since.subsec_micros()
    )
}

/// The Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        let at = |secs: u64, micros: u32| {
            rfc3339(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros.into()))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(at(1_738_367_999, 123_456), "2025-01-31T23:59:59.123456Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z");
        // Every day of four centuries against httpdate's own calendar.
        for day in (0..146_097u64).step_by(7) {
            let t = UNIX_EPOCH + Duration::from_secs(day * 86_400 + 3_661);
            let http = httpdate::fmt_http_date(t);
            let ours = rfc3339(t);
            let (y, m, d) = (&ours[..4], &ours[5..7], &ours[8..10]);
            let months = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ];
            let month = months[m.parse::<usize>().unwrap() - 1];
            assert!(
                http.contains(&format!("{d} {month} {y} 01:01:01")),
                "{http} vs {ours}"
            );
        }
    }

    #[test]
    fn routes_are_cut_on_a_character_boundary() {
        assert_eq!(bounded_route("/users/{id}"), "/users/{id}");
        let long = format!("/{}", "é".repeat(200));
        let cut = bounded_route(&long);
        assert!(cut.len() <= MAX_ROUTE_LEN && cut.len() >= MAX_ROUTE_LEN - 1);
        assert!(long.starts_with(&cut));
    }
}
