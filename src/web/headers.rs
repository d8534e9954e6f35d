//! Rate-limit response headers: IETF `RateLimit` / `RateLimit-Policy`, older drafts,
//! `X-RateLimit-*`, and `Retry-After`.
//!
//! The default, [`HeaderStyle::Ietf`], follows draft-ietf-httpapi-ratelimit-headers-11:
//! one list member per limit in both fields, on every response of a limited route.
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=10;w=2, "global";q=200;w=2
//! RateLimit: "per-ip";r=7;t=1, "global";r=180;t=1
//! ```
//!
//! For a limit with burst `b` and emission interval `T` (one token per `T`):
//!
//! | value | meaning |
//! |---|---|
//! | `q` | `b`, the bucket capacity |
//! | `w` | `ceil(b × T)` seconds, the time to refill an empty bucket (so `q / w` is the rate) |
//! | `r` | whole tokens left |
//! | `t` | seconds until one more token, rounded up; omitted while the bucket is full |
//! | `Retry-After` (429) | seconds until the request would pass, rounded up: never `0` for a positive wait |
//! | `reset` (draft-6/7, `X-RateLimit-Reset`) | seconds until the bucket is full again, rounded up |
//!
//! The older styles describe one limit only: the most constrained one (fewest tokens left;
//! on a 429 the most constrained of the limits that refused).

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue};

use crate::base::memo::{Memo, MemoKey, memoized};
use crate::base::text::StackText;
use crate::web::arena;
use crate::web::numbers::{self, number};

/// Which rate-limit fields responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` as structured-field lists, one member per limit
    /// (draft-ietf-httpapi-ratelimit-headers-08 to -11).
    #[default]
    Ietf,
    /// draft-07: `RateLimit: limit=…, remaining=…, reset=…` and `RateLimit-Policy: q;w=…`.
    Draft7,
    /// draft-06: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` and
    /// `RateLimit-Policy: q;w=…`.
    Draft6,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    Legacy(ResetFormat),
    /// The headers of `tower_governor` with `use_headers()`: `x-ratelimit-limit`,
    /// `x-ratelimit-remaining`, and on a 429 `x-ratelimit-after` (rounded up, unlike
    /// `tower_governor`, which can send `0`).
    Governor,
    /// No rate-limit fields. A 429 still carries `Retry-After`.
    None,
}

/// How `X-RateLimit-Reset` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResetFormat {
    /// Unix time in seconds, rounded up (GitHub, express-rate-limit).
    #[default]
    Epoch,
    /// Seconds from now, rounded up.
    Delta,
}

/// How `Retry-After` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetryAfterFormat {
    /// Whole seconds, rounded up: `Retry-After: 3`.
    #[default]
    Seconds,
    /// An HTTP date, the instant rounded up to the next second:
    /// `Retry-After: Tue, 14 Nov 2023 22:14:24 GMT`.
    HttpDate,
}

/// The largest integer a structured field can carry.
const SF_INT_MAX: u64 = 999_999_999_999_999;

static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static X_RATELIMIT_AFTER: HeaderName = HeaderName::from_static("x-ratelimit-after");

pub(crate) use crate::base::round::ceil_secs;

/// Appends an RFC 9651 string. Limit names are checked to be printable ASCII when the
/// layer is built; anything else is replaced by `?` rather than producing a bad field.
fn sf_string(out: &mut String, s: &str) {
    out.push('"');
    if s.bytes()
        .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
    {
        out.push_str(s);
        out.push('"');
        return;
    }
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

fn sf_int(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n.min(SF_INT_MAX)));
}

/// One member of `RateLimit-Policy`: a limit's name, its quota (`q`) and window (`w`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PolicyItem<'a> {
    pub(crate) name: &'a str,
    pub(crate) quota: u64,
    /// Seconds; 0 for an in-flight limit (`qu="concurrent-requests"`, no `w`).
    pub(crate) window: u64,
}

/// `RateLimit-Policy` (draft-11); `None` for no members (the field is then omitted).
pub(crate) fn ietf_policy<'a>(items: impl IntoIterator<Item = PolicyItem<'a>>) -> Option<String> {
    let mut out = String::new();
    for (i, p) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        sf_string(&mut out, p.name);
        out.push_str(";q=");
        sf_int(&mut out, p.quota);
        if p.window == 0 {
            // An in-flight limit: a count of concurrent requests, over no window.
            out.push_str(";qu=\"concurrent-requests\"");
        } else {
            out.push_str(";w=");
            sf_int(&mut out, p.window);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// `Retry-After` for a wait of `wait`; `now` is only read for an HTTP date.
pub(crate) fn retry_after(
    wait: Duration,
    format: RetryAfterFormat,
    now: impl FnOnce() -> SystemTime,
) -> HeaderValue {
    match format {
        RetryAfterFormat::Seconds => numbers::wait(ceil_secs(wait)),
        RetryAfterFormat::HttpDate => {
            let at = now().duration_since(UNIX_EPOCH).unwrap_or_default() + wait;
            let at = UNIX_EPOCH + Duration::from_secs(ceil_secs(at));
            HeaderValue::try_from(httpdate::fmt_http_date(at))
                .unwrap_or(HeaderValue::from_static("0"))
        }
    }
}

/// What the headers say about one limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Report<'a> {
    /// The limit's name (interned: a memo key, see [`ietf_limit_of`]).
    pub(crate) name: &'static str,
    /// `"name";r=`, rendered once per limit by [`limit_prefix`].
    pub(crate) prefix: &'a str,
    pub(crate) burst: u64,
    pub(crate) window: u64,
    pub(crate) remaining: u64,
    pub(crate) next_after: Option<Duration>,
    pub(crate) reset_after: Duration,
    pub(crate) violated: bool,
}

impl Report<'_> {
    fn policy(&self) -> PolicyItem<'_> {
        PolicyItem {
            name: self.name,
            quota: self.burst,
            window: self.window,
        }
    }
}

/// `"name";r=`: the start of a limit's member of `RateLimit`, rendered once per limit.
pub(crate) fn limit_prefix(name: &str) -> Box<str> {
    let mut out = String::new();
    sf_string(&mut out, name);
    out.push_str(";r=");
    out.into()
}

thread_local! {
    /// This thread's recent `RateLimit` values of one spent limit (`"name";r=0;t=N`), by
    /// limit and `N`: every refused client of a limit told the same wait gets the same
    /// value, rendered once per thread.
    static SPENT: RefCell<Memo<HeaderValue>> = const { RefCell::new(Memo::new()) };
}

/// `RateLimit` (draft-11) for `reports`, from the pre-rendered prefixes; `None` for no
/// members. One spent limit's value comes from the thread's memo ([`SPENT`]); any other
/// is written on the stack and copied once into the value.
fn ietf_limit_of(reports: &[Report<'_>]) -> Option<HeaderValue> {
    if let [r] = reports
        && r.remaining == 0
    {
        let t = r
            .next_after
            .map_or(u64::MAX, |t| ceil_secs(t).min(SF_INT_MAX));
        let key = MemoKey::new(0, r.name, t);
        // Kept by the memo, maybe for long: a copy of its own, not a view that would keep
        // a whole chunk of the thread's buffer of values alive with it.
        return memoized(&SPENT, key, || {
            render_limit(reports, |text| HeaderValue::from_bytes(text).ok())
        });
    }
    render_limit(reports, arena::value)
}

/// `RateLimit` for `reports`, written on the stack and then made a value by `make` (a copy
/// of its own, or a view into the thread's buffer of values, [`arena`](crate::web::arena)).
fn render_limit(
    reports: &[Report<'_>],
    make: impl FnOnce(&[u8]) -> Option<HeaderValue>,
) -> Option<HeaderValue> {
    if reports.is_empty() {
        return None;
    }
    let mut out = StackText::<128>::new();
    let mut digits = itoa::Buffer::new();
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            out.push(b", ");
        }
        out.push(r.prefix.as_bytes());
        out.push(digits.format(r.remaining.min(SF_INT_MAX)).as_bytes());
        if let Some(t) = r.next_after {
            out.push(b";t=");
            out.push(digits.format(ceil_secs(t).min(SF_INT_MAX)).as_bytes());
        }
    }
    make(out.as_bytes())
}

/// The most limits the rate-limit fields of one response describe. A request under more
/// limits gets the members of the most restrictive ones: those that refuse it first, then
/// those with the fewest tokens left (ties: the longer reset), in configuration order. A
/// response's fields stay a few hundred bytes however many limits apply.
pub const MAX_MEMBERS: usize = 8;

/// Keeps the [`MAX_MEMBERS`] most restrictive of `reports`, in their order.
pub(crate) fn keep_most_restrictive<'a, const N: usize>(
    reports: &mut smallvec::SmallVec<[Report<'a>; N]>,
) {
    if reports.len() <= MAX_MEMBERS {
        return;
    }
    let mut order: Vec<usize> = (0..reports.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&reports[a], &reports[b]);
        b.violated
            .cmp(&a.violated)
            .then(a.remaining.cmp(&b.remaining))
            .then(b.reset_after.cmp(&a.reset_after))
    });
    let mut keep = vec![false; reports.len()];
    for &i in &order[..MAX_MEMBERS] {
        keep[i] = true;
    }
    let mut i = 0;
    reports.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

/// The limit the single-limit styles describe: among the refusing limits if any, the one
/// with the fewest tokens left, ties broken by the longer reset.
fn most_constrained<'r, 'a>(reports: &'r [Report<'a>]) -> Option<&'r Report<'a>> {
    let any_violated = reports.iter().any(|r| r.violated);
    reports
        .iter()
        .filter(|r| r.violated || !any_violated)
        .min_by(|a, b| {
            a.remaining
                .cmp(&b.remaining)
                .then(b.reset_after.cmp(&a.reset_after))
        })
}

/// `q;w=w` members for the draft-6/7 policy field. Those drafts forbid two policies with
/// the same `q`: only the most constrained of them is kept.
fn draft_policy(reports: &[Report<'_>]) -> Option<String> {
    let mut out = String::new();
    for (i, r) in reports.iter().enumerate() {
        let shadowed = reports.iter().enumerate().any(|(j, other)| {
            j != i
                && other.burst == r.burst
                && (other.remaining, std::cmp::Reverse(other.reset_after), j)
                    < (r.remaining, std::cmp::Reverse(r.reset_after), i)
        });
        if shadowed {
            continue;
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        sf_int(&mut out, r.burst);
        out.push_str(";w=");
        sf_int(&mut out, r.window.max(1));
    }
    (!out.is_empty()).then_some(out)
}

fn value(s: String) -> Option<HeaderValue> {
    HeaderValue::try_from(s).ok()
}

/// Header fields of a response, gathered before they are added to it.
#[derive(Debug, Default)]
pub(crate) struct Fields {
    // Two inline: the IETF style's two fields (the older styles' third and fourth spill).
    items: smallvec::SmallVec<[(&'static HeaderName, HeaderValue); 2]>,
    /// IETF fields are lists: stacked layers append members to one list. The older styles
    /// are single-valued: set only if no inner layer set them.
    append: bool,
}

impl Fields {
    fn push(&mut self, item: (&'static HeaderName, HeaderValue)) {
        self.items.push(item);
    }

    /// Adds the fields to a response's headers.
    pub(crate) fn apply(self, headers: &mut http::HeaderMap) {
        // Headers off, or nothing to say: the map is not touched.
        if self.items.is_empty() {
            return;
        }
        headers.reserve(self.items.len());
        for (name, value) in self.items {
            if self.append {
                headers.append(name.clone(), value);
            } else if let http::header::Entry::Vacant(slot) = headers.entry(name.clone()) {
                slot.insert(value);
            }
        }
    }

    #[cfg(test)]
    fn into_pairs(self) -> Vec<(HeaderName, HeaderValue)> {
        self.items
            .into_iter()
            .map(|(n, v)| (n.clone(), v))
            .collect()
    }
}

/// The rate-limit fields for `reports`. `policy` is a pre-rendered `RateLimit-Policy`
/// (IETF style) for when the reports match the configuration; `now` is only read for an
/// epoch reset; `limited_wait` is the `Retry-After` wait of a 429, for
/// `x-ratelimit-after`.
pub(crate) fn rate_limit_fields(
    style: HeaderStyle,
    reports: &[Report<'_>],
    policy: Option<&HeaderValue>,
    now: impl FnOnce() -> SystemTime,
    limited_wait: Option<Duration>,
    out: &mut Fields,
) {
    out.append = style == HeaderStyle::Ietf;
    if reports.is_empty() {
        return;
    }
    match style {
        HeaderStyle::Ietf => {
            let policy = match policy {
                Some(p) => Some(p.clone()),
                None => ietf_policy(reports.iter().map(Report::policy)).and_then(value),
            };
            if let Some(p) = policy {
                out.push((&RATELIMIT_POLICY, p));
            }
            if let Some(l) = ietf_limit_of(reports) {
                out.push((&RATELIMIT, l));
            }
        }
        HeaderStyle::Draft7 | HeaderStyle::Draft6 => {
            if let Some(p) = draft_policy(reports).and_then(value) {
                out.push((&RATELIMIT_POLICY, p));
            }
            let Some(r) = most_constrained(reports) else {
                return;
            };
            let reset = ceil_secs(r.reset_after);
            if style == HeaderStyle::Draft7 {
                let mut text = StackText::<96>::new();
                let mut digits = itoa::Buffer::new();
                text.push(b"limit=");
                text.push(digits.format(r.burst.min(SF_INT_MAX)).as_bytes());
                text.push(b", remaining=");
                text.push(digits.format(r.remaining.min(SF_INT_MAX)).as_bytes());
                text.push(b", reset=");
                text.push(digits.format(reset.min(SF_INT_MAX)).as_bytes());
                if let Some(v) = arena::value(text.as_bytes()) {
                    out.push((&RATELIMIT, v));
                }
            } else {
                out.push((&RATELIMIT_LIMIT, number(r.burst.min(SF_INT_MAX))));
                out.push((&RATELIMIT_REMAINING, number(r.remaining.min(SF_INT_MAX))));
                out.push((&RATELIMIT_RESET, number(reset.min(SF_INT_MAX))));
            }
        }
        HeaderStyle::Legacy(format) => {
            let Some(r) = most_constrained(reports) else {
                return;
            };
            let reset = match format {
                ResetFormat::Delta => ceil_secs(r.reset_after),
                ResetFormat::Epoch => {
                    ceil_secs(now().duration_since(UNIX_EPOCH).unwrap_or_default() + r.reset_after)
                }
            };
            out.push((&X_RATELIMIT_LIMIT, number(r.burst)));
            out.push((&X_RATELIMIT_REMAINING, number(r.remaining)));
            out.push((&X_RATELIMIT_RESET, number(reset)));
        }
        HeaderStyle::Governor => {
            let Some(r) = most_constrained(reports) else {
                return;
            };
            if let Some(wait) = limited_wait {
                out.push((&X_RATELIMIT_AFTER, number(ceil_secs(wait))));
            }
            out.push((&X_RATELIMIT_LIMIT, number(r.burst)));
            out.push((&X_RATELIMIT_REMAINING, number(r.remaining)));
        }
        HeaderStyle::None => {}
    }
}

/// The pre-rendered IETF policy field for a fixed list of limits.
///
/// The value is `'static` (interned: one copy per distinct value the process has built):
/// cloning it per response touches no shared reference count, which a shared `Bytes`
/// would on every core. `None` when the process's budget of interned strings is spent:
/// the field is then rendered per response.
pub(crate) fn static_policy<'a>(
    items: impl IntoIterator<Item = (&'a str, u64, u64)>,
) -> Option<HeaderValue> {
    let text = ietf_policy(items.into_iter().map(|(name, quota, window)| PolicyItem {
        name,
        quota,
        window,
    }))?;
    // Only visible ASCII and spaces are rendered; check like `HeaderValue::try_from`.
    HeaderValue::try_from(text.as_str()).ok()?;
    // Past the process's budget of interned strings: rendered per response instead.
    crate::base::intern::intern(&text).map(HeaderValue::from_static)
}

#[cfg(test)]
mod tests {
    //! Test vectors for every style (the drafts' examples and their edge cases), and `sfv`
    //! as the parser of record.
    use super::*;

    fn s(d: f64) -> Duration {
        Duration::from_millis((d * 1000.0).round() as u64)
    }

    const NOW: u64 = 1_700_000_000;

    /// Exactly `secs` after the epoch (to the millisecond, as the vectors are written).
    fn at(secs: f64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis((secs * 1000.0).round() as u64)
    }

    fn report(name: &'static str, q: u64, w: u64, r: u64, d: f64) -> Report<'static> {
        Report {
            name,
            prefix: Box::leak(limit_prefix(name)),
            burst: q,
            window: w,
            remaining: r,
            next_after: Some(s(d)),
            reset_after: s(d),
            violated: false,
        }
    }

    fn fields(
        style: HeaderStyle,
        reports: &[Report<'_>],
        now: SystemTime,
        wait: Option<Duration>,
    ) -> Vec<(String, String)> {
        let mut out = Fields::default();
        rate_limit_fields(style, reports, None, || now, wait, &mut out);
        out.into_pairs()
            .into_iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned()))
            .collect()
    }

    fn get(fields: &[(String, String)], name: &str) -> Option<String> {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    /// Parses as an sfv List and serializes back: canonical output must survive unchanged.
    fn assert_sf_list(v: &str) {
        let list = sfv::Parser::new(v)
            .parse::<sfv::List>()
            .unwrap_or_else(|e| panic!("{v}: {e}"));
        use sfv::FieldType;
        assert_eq!(list.serialize().as_deref(), Some(v), "not canonical");
    }

    fn ietf(reports: &[Report<'_>]) -> (String, String) {
        let f = fields(HeaderStyle::Ietf, reports, at(NOW as f64), None);
        let p = get(&f, "ratelimit-policy").unwrap();
        let l = get(&f, "ratelimit").unwrap();
        assert_sf_list(&p);
        assert_sf_list(&l);
        (p, l)
    }

    #[test]
    fn a_spent_limits_value_comes_from_the_memo_only_for_its_own_limit_and_wait() {
        // Each value, asked for twice in a row on one thread (the second a memo hit),
        // must read as one rendered afresh.
        let full = Report {
            next_after: None,
            ..report("spent-b", 10, 60, 0, 0.0)
        };
        let cases = [
            (report("spent-a", 10, 60, 0, 1.2), r#""spent-a";r=0;t=2"#),
            (report("spent-a", 10, 60, 0, 3.0), r#""spent-a";r=0;t=3"#),
            (report("spent-b", 10, 60, 0, 3.0), r#""spent-b";r=0;t=3"#),
            (full, r#""spent-b";r=0"#),
            // Not spent: rendered, never memoized.
            (report("spent-b", 10, 60, 4, 3.0), r#""spent-b";r=4;t=3"#),
        ];
        for (r, expected) in &cases {
            for _ in 0..2 {
                assert_eq!(ietf(std::slice::from_ref(r)).1, *expected);
            }
        }
        // Two members: rendered whole, not from one member's memo.
        let two = [
            report("spent-a", 10, 60, 0, 3.0),
            report("spent-b", 10, 60, 0, 3.0),
        ];
        assert_eq!(ietf(&two).1, r#""spent-a";r=0;t=3, "spent-b";r=0;t=3"#);
    }

    #[test]
    fn a_memoized_value_owns_its_bytes_and_keeps_no_chunk_of_the_buffer_alive() {
        // A fresh test thread: its buffer of values starts empty. Had the spent value been
        // written into the buffer, the next value there would start right after it.
        let spent = ietf_limit_of(&[report("owned", 10, 60, 0, 2.0)]).unwrap();
        let next = arena::value(b"probe").unwrap();
        let end = spent.as_bytes().as_ptr_range().end;
        assert_ne!(next.as_bytes().as_ptr(), end);
        // An allowed request's value is a view into the buffer: the next one follows it.
        let allowed = ietf_limit_of(&[report("owned", 10, 60, 4, 2.0)]).unwrap();
        let after = arena::value(b"probe").unwrap();
        assert_eq!(
            after.as_bytes().as_ptr(),
            allowed.as_bytes().as_ptr_range().end
        );
    }

    #[test]
    fn i1_to_i5_rounding_of_t() {
        assert_eq!(
            ietf(&[report("default", 100, 60, 99, 60.0)]),
            (
                r#""default";q=100;w=60"#.into(),
                r#""default";r=99;t=60"#.into()
            )
        );
        assert_eq!(
            ietf(&[report("default", 100, 60, 99, 59.2)]).1,
            r#""default";r=99;t=60"#
        );
        assert_eq!(
            ietf(&[report("default", 100, 60, 99, 59.0)]).1,
            r#""default";r=99;t=59"#
        );
        assert_eq!(
            ietf(&[report("default", 100, 60, 99, 0.2)]).1,
            r#""default";r=99;t=1"#
        );
        assert_eq!(
            ietf(&[report("default", 100, 60, 100, 0.0)]).1,
            r#""default";r=100;t=0"#
        );
        let full = Report {
            next_after: None,
            ..report("default", 100, 60, 100, 0.0)
        };
        assert_eq!(
            ietf(&[full]).1,
            r#""default";r=100"#,
            "no t while the bucket is full"
        );
    }

    #[test]
    fn i6_i8_rejections() {
        let mut r = report("default", 100, 60, 0, 12.3);
        r.violated = true;
        let (p, l) = ietf(&[r]);
        assert_eq!(p, r#""default";q=100;w=60"#);
        assert_eq!(l, r#""default";r=0;t=13"#);
        assert_eq!(
            retry_after(s(12.3), RetryAfterFormat::Seconds, || at(0.0)),
            "13"
        );
        let mut burst = report("burst", 10, 1, 0, 0.4);
        burst.violated = true;
        let daily = report("daily", 1000, 86_400, 950, 3600.0);
        assert_eq!(
            ietf(&[burst, daily]).1,
            r#""burst";r=0;t=1, "daily";r=950;t=3600"#
        );
    }

    #[test]
    fn i7_two_policies() {
        let (p, l) = ietf(&[
            report("burst", 10, 1, 9, 0.4),
            report("daily", 1000, 86_400, 950, 3600.0),
        ]);
        assert_eq!(p, r#""burst";q=10;w=1, "daily";q=1000;w=86400"#);
        assert_eq!(l, r#""burst";r=9;t=1, "daily";r=950;t=3600"#);
    }

    // I9 to I15 (`pk`, `qu`) are not emitted: no limit has a partition key or a unit other
    // than requests.

    #[test]
    fn i16_to_i22_names_integers_and_edges() {
        let pol = |name: &str, q: u64, w: u64| {
            ietf_policy([PolicyItem {
                name,
                quota: q,
                window: w,
            }])
            .unwrap()
        };
        assert_eq!(pol(r#"a"b\c"#, 1, 1), r#""a\"b\\c";q=1;w=1"#);
        assert_eq!(pol("per user", 5, 60), r#""per user";q=5;w=60"#);
        assert_eq!(
            pol("x", 999_999_999_999_999, 1),
            r#""x";q=999999999999999;w=1"#
        );
        assert_eq!(
            pol("x", 1_000_000_000_000_000, 1),
            r#""x";q=999999999999999;w=1"#,
            "clamped"
        );
        assert_eq!(ietf_policy([]), None, "I21: no field for no policies");
        assert!(ietf_limit_of(&[]).is_none());
        // I22: w is never 0. A window of 0 is an in-flight limit's (a time limit's is at
        // least 1 s): a count of concurrent requests (I11), with no window.
        assert_eq!(pol("x", 5, 0), r#""x";q=5;qu="concurrent-requests""#);
        assert_sf_list(&pol("x", 5, 0));
        for v in [pol(r#"a"b\c"#, 1, 1), pol("per user", 5, 60)] {
            assert_sf_list(&v);
        }
        // I18: names outside %x20-7E are refused when the layer is built (see limit.rs);
        // the renderer never emits them raw.
        assert_eq!(pol("café", 1, 1), r#""caf?";q=1;w=1"#);
    }

    #[test]
    fn express_draft8_equivalence() {
        let p = ietf_policy([PolicyItem {
            name: "5-in-2hrs",
            quota: 5,
            window: 7200,
        }])
        .unwrap();
        assert_eq!(p, r#""5-in-2hrs";q=5;w=7200"#);
        let express: sfv::List = sfv::Parser::new(r#""5-in-2hrs"; q=5; w=7200"#)
            .parse()
            .unwrap();
        let ours: sfv::List = sfv::Parser::new(&p).parse().unwrap();
        assert_eq!(express, ours);
    }

    #[test]
    fn draft7_and_draft6() {
        let one = [report("default", 100, 60, 99, 60.0)];
        let f = fields(HeaderStyle::Draft7, &one, at(0.0), None);
        assert_eq!(get(&f, "ratelimit-policy").unwrap(), "100;w=60");
        assert_eq!(
            get(&f, "ratelimit").unwrap(),
            "limit=100, remaining=99, reset=60"
        );
        sfv::Parser::new(&get(&f, "ratelimit").unwrap())
            .parse::<sfv::Dictionary>()
            .unwrap();
        let two = [
            report("burst", 10, 1, 9, 0.4),
            report("daily", 1000, 86_400, 950, 3600.0),
        ];
        let f = fields(HeaderStyle::Draft7, &two, at(0.0), None);
        assert_eq!(get(&f, "ratelimit-policy").unwrap(), "10;w=1, 1000;w=86400");
        assert_eq!(
            get(&f, "ratelimit").unwrap(),
            "limit=10, remaining=9, reset=1"
        );
        let f = fields(HeaderStyle::Draft6, &one, at(0.0), None);
        assert_eq!(
            f,
            vec![
                ("ratelimit-policy".into(), "100;w=60".into()),
                ("ratelimit-limit".into(), "100".into()),
                ("ratelimit-remaining".into(), "99".into()),
                ("ratelimit-reset".into(), "60".into()),
            ]
        );
        let f = fields(HeaderStyle::Draft6, &two, at(0.0), None);
        assert_eq!(get(&f, "ratelimit-policy").unwrap(), "10;w=1, 1000;w=86400");
        assert_eq!(get(&f, "ratelimit-limit").unwrap(), "10");
        let mut rej = report("default", 100, 60, 0, 12.3);
        rej.violated = true;
        let f = fields(HeaderStyle::Draft6, &[rej], at(0.0), Some(s(12.3)));
        assert_eq!(get(&f, "ratelimit-remaining").unwrap(), "0");
        assert_eq!(get(&f, "ratelimit-reset").unwrap(), "13");
        // D6-4: the same limit twice is invalid in these drafts: keep the lowest r.
        let dup = [report("a", 10, 1, 5, 1.0), report("b", 10, 60, 2, 30.0)];
        let f = fields(HeaderStyle::Draft6, &dup, at(0.0), None);
        assert_eq!(get(&f, "ratelimit-policy").unwrap(), "10;w=60");
        assert_eq!(get(&f, "ratelimit-remaining").unwrap(), "2");
        for v in ["10;w=60", "100;w=60", "10;w=1, 1000;w=86400"] {
            assert_sf_list(v);
        }
    }

    #[test]
    fn legacy_epoch_and_delta() {
        let r = |d| [report("default", 100, 60, 99, d)];
        let epoch = HeaderStyle::Legacy(ResetFormat::Epoch);
        let delta = HeaderStyle::Legacy(ResetFormat::Delta);
        // L-1
        let f = fields(epoch, &r(60.0), at(1_700_000_000.0), None);
        assert_eq!(get(&f, "x-ratelimit-limit").unwrap(), "100");
        assert_eq!(get(&f, "x-ratelimit-remaining").unwrap(), "99");
        assert_eq!(get(&f, "x-ratelimit-reset").unwrap(), "1700000060");
        assert_eq!(
            get(
                &fields(delta, &r(60.0), at(1_700_000_000.0), None),
                "x-ratelimit-reset"
            )
            .unwrap(),
            "60"
        );
        // L-2: now .400, window end at 060.000
        assert_eq!(
            get(
                &fields(epoch, &r(59.6), at(1_700_000_000.4), None),
                "x-ratelimit-reset"
            )
            .unwrap(),
            "1700000060"
        );
        assert_eq!(
            get(
                &fields(delta, &r(59.6), at(1_700_000_000.4), None),
                "x-ratelimit-reset"
            )
            .unwrap(),
            "60"
        );
        // L-3: window end at 059.300
        assert_eq!(
            get(
                &fields(epoch, &r(59.3), at(1_700_000_000.0), None),
                "x-ratelimit-reset"
            )
            .unwrap(),
            "1700000060"
        );
        // L-4
        let mut rej = report("default", 100, 60, 0, 12.3);
        rej.violated = true;
        let f = fields(epoch, &[rej], at(1_700_000_047.7), None);
        assert_eq!(get(&f, "x-ratelimit-remaining").unwrap(), "0");
        assert_eq!(get(&f, "x-ratelimit-reset").unwrap(), "1700000060");
        assert_eq!(
            retry_after(s(12.3), RetryAfterFormat::Seconds, || at(0.0)),
            "13"
        );
    }

    #[test]
    fn governor_compatible() {
        let f = fields(
            HeaderStyle::Governor,
            &[report("default", 100, 1, 42, 0.01)],
            at(0.0),
            None,
        );
        assert_eq!(
            f,
            vec![
                ("x-ratelimit-limit".into(), "100".into()),
                ("x-ratelimit-remaining".into(), "42".into()),
            ]
        );
        let mut rej = report("default", 100, 1, 0, 0.2);
        rej.violated = true;
        let f = fields(HeaderStyle::Governor, &[rej], at(0.0), Some(s(0.2)));
        assert_eq!(
            get(&f, "x-ratelimit-after").unwrap(),
            "1",
            "G-2: rounded up, never 0"
        );
        assert_eq!(get(&f, "x-ratelimit-remaining").unwrap(), "0");
    }

    #[test]
    fn none_style_and_empty_reports() {
        assert!(
            fields(
                HeaderStyle::None,
                &[report("d", 1, 1, 1, 1.0)],
                at(0.0),
                None
            )
            .is_empty()
        );
        assert!(fields(HeaderStyle::Ietf, &[], at(0.0), None).is_empty());
    }

    #[test]
    fn retry_after_vectors() {
        let secs = |d: f64| {
            retry_after(s(d), RetryAfterFormat::Seconds, || at(0.0))
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(secs(12.3), "13"); // R1
        assert_eq!(secs(0.001), "1"); // R3
        assert_eq!(secs(0.0), "0"); // R4
        let date = |d: f64, now: f64| {
            retry_after(s(d), RetryAfterFormat::HttpDate, || at(now))
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(date(2.5, 1_700_000_061.25), "Tue, 14 Nov 2023 22:14:24 GMT"); // R2
        assert_eq!(date(5.0, 1_565_000_000.0), "Mon, 05 Aug 2019 10:13:25 GMT"); // R5
        // R6: never fractions, signs, units or epochs.
        for d in [0.001, 0.5, 1.5, 2.0, 12.3, 86_399.999] {
            let v = secs(d);
            assert!(
                v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty(),
                "{v}"
            );
        }
    }

    /// `RateLimit` written the plain way, member by member: what the request path's
    /// renderer, which works from pre-rendered prefixes, must produce.
    fn reference_limit(reports: &[Report<'_>]) -> Option<String> {
        let mut out = String::new();
        for (i, r) in reports.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            sf_string(&mut out, r.name);
            out.push_str(";r=");
            sf_int(&mut out, r.remaining);
            if let Some(t) = r.next_after {
                out.push_str(";t=");
                sf_int(&mut out, ceil_secs(t));
            }
        }
        (!out.is_empty()).then_some(out)
    }

    #[test]
    fn the_request_path_renderer_matches_the_reference() {
        for name in ["a", "per user", r#"q"uote"#, r"back\slash"] {
            for (r, t) in [
                (0, None),
                (7, Some(0.2)),
                (999_999_999_999_999u64, Some(1e9)),
                (5, Some(0.0)),
            ] {
                let mut rep = report(name, 10, 1, r, 1.0);
                rep.next_after = t.map(s);
                let other = report("second", 20, 2, 3, 1.5);
                let ours = ietf_limit_of(&[rep, other]).map(|t| t.to_str().unwrap().to_owned());
                assert_eq!(ours, reference_limit(&[rep, other]));
            }
        }
    }

    #[test]
    fn sfv_parses_every_ietf_field_we_emit() {
        let names = [
            "a",
            "per-ip",
            "per user",
            r#"q"uote"#,
            r"back\slash",
            "x.y_z-1",
        ];
        for name in names {
            for (r, d) in [(0, 0.0), (1, 0.5), (999_999_999_999_999u64, 1e9)] {
                let (p, l) = ietf(&[report(name, 10, 1, r, d), report("second", 20, 2, 3, 1.0)]);
                let list: sfv::List = sfv::Parser::new(&l).parse().unwrap();
                assert_eq!(list.len(), 2);
                assert!(p.contains(";q=10;w=1"));
            }
        }
    }
}
