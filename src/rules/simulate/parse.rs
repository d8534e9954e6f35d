//! Access-log lines → requests: the nginx/Apache combined format, and JSON lines read
//! through a field map.

use std::borrow::Cow;
use std::net::IpAddr;

use http::HeaderName;

use crate::base::error::ConfigError;

/// The format of an access log given to [`Simulation`](super::Simulation).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogFormat {
    /// The combined format of nginx and Apache:
    /// `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
    /// "$http_referer" "$http_user_agent"` (anything after the status is ignored, and
    /// need not be UTF-8).
    Combined,
    /// The combined format with fields appended after the user agent (nginx's
    /// `... "$http_user_agent" $request_time "$upstream_http_x_usage"`), some of them read
    /// by position: [`CombinedFields`].
    CombinedWith(CombinedFields),
    /// One JSON object per line, its fields named by the map.
    Json(JsonFields),
}

/// Which fields after the user agent of a combined-format line hold what, by position: 1
/// is the first field after the user agent. A field is quoted (`"..."`, `\"` escaped) or
/// runs to the next space; `-`, or a line with fewer fields, is a line without it.
///
/// ```
/// use tollgate::rules::{CombinedFields, LogFormat};
///
/// // log_format main '... "$http_user_agent" $request_time "$upstream_http_x_usage"';
/// let mut fields = CombinedFields::default();
/// fields.set("duration=1")?;
/// fields.set("usage=2")?;
/// assert_eq!((fields.duration, fields.usage), (Some(1), Some(2)));
/// assert!(fields.set("usage=0").is_err());
/// let format = LogFormat::CombinedWith(fields);
/// # let _ = format;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CombinedFields {
    /// The position of the request's actual usage (a settled limit's actual cost, see
    /// [`Simulation`](super::Simulation)).
    pub usage: Option<usize>,
    /// The position of the request's duration in seconds (nginx's `$request_time`, such as
    /// `0.250`): its response is held that long (in-flight limits).
    pub duration: Option<usize>,
}

/// The most fields after the user agent a position may name.
const MAX_POSITION: usize = 64;

impl CombinedFields {
    /// Sets one role from `ROLE=N`, `ROLE` one of `usage`, `duration`, and `N` the
    /// position after the user agent (1 to 64).
    pub fn set(&mut self, spec: &str) -> Result<(), ConfigError> {
        let (role, position) = split(spec, "--field")?;
        let slot = match role {
            "usage" => &mut self.usage,
            "duration" => &mut self.duration,
            _ => {
                return Err(ConfigError::new(
                    "--field",
                    format!(
                        "unknown role `{role}` for the combined format: expected usage or duration"
                    ),
                ));
            }
        };
        match position.parse::<usize>() {
            Ok(n @ 1..=MAX_POSITION) => *slot = Some(n),
            _ => {
                return Err(ConfigError::new(
                    "--field",
                    format!(
                        "`{spec}`: in the combined format, {role} is read by the position of a field after the user agent, 1 to {MAX_POSITION}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The furthest position read (0: none).
    fn last(&self) -> usize {
        self.usage.unwrap_or(0).max(self.duration.unwrap_or(0))
    }
}

/// Which fields of a JSON log line hold what: top-level field names.
///
/// ```
/// use tollgate::rules::JsonFields;
///
/// let mut fields = JsonFields::default();
/// fields.set("client=remote_ip")?;
/// fields.set("time=ts")?;
/// fields.header("x-api-key=api_key")?;
/// assert_eq!(fields.client, "remote_ip");
/// assert!(fields.set("colour=red").is_err());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JsonFields {
    /// The client's address (the request's peer address); default `remote_addr`.
    pub client: String,
    /// The request's time, RFC 3339 or Unix seconds (a number or a string of digits);
    /// default `time`.
    pub time: String,
    /// The method; default `method`.
    pub method: String,
    /// The path (and query); default `path`.
    pub path: String,
    /// The response's status, feeding each limit's `charge`; default `status`.
    pub status: String,
    /// Request headers and the fields they are read from (a line without the field has
    /// no such header).
    pub headers: Vec<(HeaderName, String)>,
    /// The request's actual usage, a string or a number (a settled limit's actual cost,
    /// see [`Simulation`](super::Simulation)); none by default.
    pub usage: Option<String>,
    /// The request's duration in seconds, a number or a string such as `"0.250"` (its
    /// response is held that long: in-flight limits); none by default.
    pub duration: Option<String>,
}

impl Default for JsonFields {
    fn default() -> Self {
        Self {
            client: "remote_addr".into(),
            time: "time".into(),
            method: "method".into(),
            path: "path".into(),
            status: "status".into(),
            headers: Vec::new(),
            usage: None,
            duration: None,
        }
    }
}

const ROLES: &[&str] = &[
    "client", "time", "method", "path", "status", "usage", "duration",
];

impl JsonFields {
    /// Sets one role from `ROLE=FIELD`, with `ROLE` one of `client`, `time`, `method`,
    /// `path`, `status`, `usage`, `duration`.
    pub fn set(&mut self, spec: &str) -> Result<(), ConfigError> {
        let (role, field) = split(spec, "--field")?;
        let optional = match role {
            "usage" => Some(&mut self.usage),
            "duration" => Some(&mut self.duration),
            _ => None,
        };
        if let Some(slot) = optional {
            *slot = Some(field.to_owned());
            return Ok(());
        }
        let slot = match role {
            "client" => &mut self.client,
            "time" => &mut self.time,
            "method" => &mut self.method,
            "path" => &mut self.path,
            "status" => &mut self.status,
            _ => {
                return Err(ConfigError::new(
                    "--field",
                    format!(
                        "unknown role `{role}`: expected one of {}",
                        ROLES.join(", ")
                    ),
                ));
            }
        };
        *slot = field.to_owned();
        Ok(())
    }

    /// Adds a header from `HEADER=FIELD`: the request gets header `HEADER` with the
    /// field's value (a string or a number).
    pub fn header(&mut self, spec: &str) -> Result<(), ConfigError> {
        let (name, field) = split(spec, "--header")?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ConfigError::new("--header", format!("`{name}` is not a header name")))?;
        self.headers.push((name, field.to_owned()));
        Ok(())
    }
}

fn split<'a>(spec: &'a str, flag: &'static str) -> Result<(&'a str, &'a str), ConfigError> {
    match spec.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a, b)),
        _ => Err(ConfigError::new(
            flag,
            format!("`{spec}`: expected NAME=FIELD"),
        )),
    }
}

/// A request read from a log line.
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    /// Unix time in nanoseconds.
    pub(crate) time_ns: i64,
    pub(crate) client: IpAddr,
    pub(crate) method: Cow<'a, str>,
    pub(crate) path: Cow<'a, str>,
    pub(crate) status: u16,
    /// Header values by index into [`JsonFields::headers`].
    pub(crate) headers: Vec<(usize, String)>,
    /// The actual usage field's text, if the line has one (not `-`).
    pub(crate) usage: Option<Cow<'a, [u8]>>,
    /// The request's duration in nanoseconds, if the line has a readable one above 0.
    pub(crate) duration_ns: Option<u64>,
}

/// A reader of log lines: parses one line at a time, and remembers the last time field
/// of the combined format (a busy log writes the same second on many lines in a row, so
/// it is parsed once).
pub(crate) struct Parser<'f> {
    format: &'f LogFormat,
    last_time: LastTime,
}

/// An [`Entry`] with its trailing fields read.
fn with_trailing<'a>(mut entry: Entry<'a>, fields: &CombinedFields, rest: &'a [u8]) -> Entry<'a> {
    let mut read = [None; 2];
    trailing(rest, fields.last(), |position, value| {
        if Some(position) == fields.usage {
            read[0] = Some(value);
        }
        if Some(position) == fields.duration {
            read[1] = Some(value);
        }
    });
    entry.usage = read[0].map(Cow::Borrowed);
    entry.duration_ns = read[1].and_then(seconds_ns);
    entry
}

/// The fields after the user agent of a combined line, `rest` being what follows the
/// status: `f(position, value)` for positions 1 to `last` that are there and not `-`.
fn trailing<'a>(rest: &'a [u8], last: usize, mut f: impl FnMut(usize, &'a [u8])) {
    // Body bytes, referer, user agent: three fields to skip.
    let mut rest = rest;
    for position in 0..3 + last {
        rest = rest.trim_ascii_start();
        if rest.is_empty() {
            return;
        }
        let (value, after) = if let Some(quoted) = rest.strip_prefix(b"\"") {
            match closing_quote(quoted) {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => return,
            }
        } else {
            let end = memchr::memchr(b' ', rest).unwrap_or(rest.len());
            (&rest[..end], &rest[end..])
        };
        if position >= 3 && value != b"-" {
            f(position - 2, value);
        }
        rest = after;
    }
}

/// A duration in decimal seconds (`0.250`, `12`, `1.5`) in nanoseconds; `None` for
/// anything else, 0, or more than a year.
fn seconds_ns(text: &[u8]) -> Option<u64> {
    const YEAR_S: u64 = 366 * 86_400;
    let text = text.trim_ascii();
    let (whole, fraction) = match memchr::memchr(b'.', text) {
        Some(dot) => (&text[..dot], &text[dot + 1..]),
        None => (text, &b""[..]),
    };
    if (whole.is_empty() && fraction.is_empty())
        || whole.len() > 8
        || !whole.iter().chain(fraction).all(u8::is_ascii_digit)
    {
        return None;
    }
    let secs = whole.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    let mut ns = 0u64;
    let mut scale = 100_000_000u64;
    for d in fraction.iter().take(9) {
        ns += u64::from(d - b'0') * scale;
        scale /= 10;
    }
    let total = secs.checked_mul(1_000_000_000)? + ns;
    (total > 0 && secs <= YEAR_S).then_some(total)
}

impl<'f> Parser<'f> {
    pub(crate) fn new(format: &'f LogFormat) -> Self {
        Self {
            format,
            last_time: None,
        }
    }

    /// Parses one line; the error says what is wrong with it.
    pub(crate) fn parse<'a>(&mut self, line: &'a [u8]) -> Result<Entry<'a>, &'static str> {
        match self.format {
            LogFormat::Combined => combined(line, &mut self.last_time).map(|(entry, _)| entry),
            LogFormat::CombinedWith(fields) => combined(line, &mut self.last_time)
                .map(|(entry, rest)| with_trailing(entry, fields, rest)),
            LogFormat::Json(fields) => json(fields, line),
        }
    }
}

/// The length of a combined-format time field: `10/Oct/2000:13:55:36 -0700`.
const CLF_TIME_LEN: usize = 26;

/// The last combined-format time field read, and what it read as.
type LastTime = Option<([u8; CLF_TIME_LEN], Option<i64>)>;

/// A combined-format time field read through the memo of the last one.
fn remembered_time(field: &[u8], last: &mut LastTime) -> Option<i64> {
    let text: [u8; CLF_TIME_LEN] = field.try_into().ok()?;
    match last {
        Some((known, ns)) if *known == text => *ns,
        _ => {
            let ns = clf_time(field);
            *last = Some((text, ns));
            ns
        }
    }
}

/// A combined-format line, and what follows its status. Only the fields it reads must be
/// UTF-8 (anything after the status is ignored); a line that is not read, and is not
/// UTF-8 either, is called that. Inlined into each way of reading a line, so that the
/// plain format does not pay for what follows the status.
#[inline(always)]
fn combined<'a>(
    line: &'a [u8],
    last_time: &mut LastTime,
) -> Result<(Entry<'a>, &'a [u8]), &'static str> {
    combined_fields(line, last_time).map_err(|reason| match std::str::from_utf8(line) {
        Ok(_) => reason,
        Err(_) => "not UTF-8",
    })
}

fn combined_fields<'a>(
    line: &'a [u8],
    last_time: &mut LastTime,
) -> Result<(Entry<'a>, &'a [u8]), &'static str> {
    let find = |s: &[u8], b: u8| memchr::memchr(b, s);
    let (client, rest) = match dotted_quad(line) {
        Some((client, end)) => (IpAddr::V4(client), &line[end + 1..]),
        None => {
            let space = find(line, b' ').ok_or("truncated")?;
            let client = std::str::from_utf8(&line[..space]).map_err(|_| "not UTF-8")?;
            let client: IpAddr = client.parse().map_err(|_| "bad client address")?;
            (client, &line[space + 1..])
        }
    };
    let open = find(rest, b'[').ok_or("no time")?;
    let rest = &rest[open + 1..];
    // The field is of fixed width: its `]` is nearly always where it should be.
    let close = match rest.get(CLF_TIME_LEN) {
        Some(b']') => CLF_TIME_LEN,
        _ => find(rest, b']').ok_or("truncated time")?,
    };
    let time_ns = remembered_time(&rest[..close], last_time).ok_or("bad time")?;
    let rest = rest[close + 1..].strip_prefix(b" \"").ok_or("no request")?;
    let end = closing_quote(rest).ok_or("truncated request")?;
    // The request line is all that is kept: it is the one field that must be text.
    let request = std::str::from_utf8(&rest[..end]).map_err(|_| "not UTF-8")?;
    let (method, path) = match request.bytes().position(|c| c == b' ') {
        // The line is UTF-8 and a space is ASCII: every index is a character boundary.
        Some(i) => {
            let after = &request[i + 1..];
            (
                &request[..i],
                &after[..find(after.as_bytes(), b' ').unwrap_or(after.len())],
            )
        }
        None => ("", ""),
    };
    // No space: no path (`method` is empty then too).
    if method.is_empty() || method == "-" {
        return Err("no request line");
    }
    let rest = &rest[end + 1..];
    let status = rest.strip_prefix(b" ").ok_or("no status")?;
    let after = status.get(3..).unwrap_or_default();
    let status = status.get(..3).ok_or("no status")?;
    let status = three_digit_status(status).ok_or("bad status")?;
    Ok((
        Entry {
            time_ns,
            client,
            method: Cow::Borrowed(method),
            path: Cow::Borrowed(path),
            status,
            headers: Vec::new(),
            usage: None,
            duration_ns: None,
        },
        after,
    ))
}

/// An IPv4 address in dotted-quad form at the start of `b` and ended by a space, and
/// where that space is; `None` for anything else (IPv6, an error), which the standard
/// parser then reads. Accepts exactly what it accepts: 1 to 3 digits an octet, at most
/// 255, no leading zero.
fn dotted_quad(b: &[u8]) -> Option<(std::net::Ipv4Addr, usize)> {
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (n, octet) in octets.iter_mut().enumerate() {
        let start = i;
        let mut value: u16 = 0;
        while let Some(&c) = b.get(i)
            && c.is_ascii_digit()
            && i - start < 3
        {
            value = value * 10 + u16::from(c - b'0');
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || (digits > 1 && b[start] == b'0') {
            return None;
        }
        *octet = u8::try_from(value).ok()?;
        let end = if n == 3 { b' ' } else { b'.' };
        if b.get(i) != Some(&end) {
            return None;
        }
        if n < 3 {
            i += 1;
        }
    }
    Some((std::net::Ipv4Addr::from(octets), i))
}

/// A status of three ASCII digits, 100 to 999.
fn three_digit_status(s: &[u8]) -> Option<u16> {
    if s.len() != 3 {
        return None;
    }
    let mut n = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(c - b'0');
    }
    status_code(n)
}

/// The closing `"` of a quoted field (`\"` escaped, as Apache writes it).
fn closing_quote(bytes: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        // An escape at the very end leaves `i` past it: no closing quote.
        i += memchr::memchr2(b'"', b'\\', bytes.get(i..)?)?;
        if bytes[i] == b'"' {
            return Some(i);
        }
        i += 2;
    }
}

/// A response status: 100 to 999.
fn status_code(n: u64) -> Option<u16> {
    u16::try_from(n).ok().filter(|n| (100..=999).contains(n))
}

/// `10/Oct/2000:13:55:36 -0700` → Unix nanoseconds.
fn clf_time(b: &[u8]) -> Option<i64> {
    if b.len() != 26 || b[2] != b'/' || b[6] != b'/' || b[11] != b':' || b[20] != b' ' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        b[r].iter().try_fold(0i64, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
        })
    };
    let day = num(0..2)?;
    let month = match &b[3..6] {
        b"Jan" => 1,
        b"Feb" => 2,
        b"Mar" => 3,
        b"Apr" => 4,
        b"May" => 5,
        b"Jun" => 6,
        b"Jul" => 7,
        b"Aug" => 8,
        b"Sep" => 9,
        b"Oct" => 10,
        b"Nov" => 11,
        b"Dec" => 12,
        _ => return None,
    };
    let year = num(7..11)?;
    let (h, m, sec) = (num(12..14)?, num(15..17)?, num(18..20)?);
    if b[14] != b':' || b[17] != b':' || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    if day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let sign = match b[21] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let (zh, zm) = (num(22..24)?, num(24..26)?);
    if zm > 59 {
        return None;
    }
    let offset = sign * (zh * 3600 + zm * 60);
    let secs = days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + sec - offset;
    secs.checked_mul(1_000_000_000)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn json<'a>(fields: &JsonFields, line: &'a [u8]) -> Result<Entry<'a>, &'static str> {
    use serde_json::Value;
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(line) else {
        return Err("not a JSON object");
    };
    let mut take = |name: &str| obj.remove(name);
    let client = match take(&fields.client) {
        Some(Value::String(s)) => s.parse::<IpAddr>().map_err(|_| "bad client address")?,
        _ => return Err("no client address"),
    };
    let time_ns = match take(&fields.time) {
        Some(Value::Number(n)) => unix_ns(n.as_f64()).ok_or("bad time")?,
        Some(Value::String(s)) => json_time(&s).ok_or("bad time")?,
        _ => return Err("no time"),
    };
    let method = match take(&fields.method) {
        Some(Value::String(s)) if !s.is_empty() => s,
        _ => return Err("no method"),
    };
    let path = match take(&fields.path) {
        Some(Value::String(s)) if !s.is_empty() => s,
        _ => return Err("no path"),
    };
    let status = match take(&fields.status) {
        Some(Value::Number(n)) => n.as_u64().and_then(status_code).ok_or("bad status")?,
        Some(Value::String(s)) => s.parse().ok().and_then(status_code).ok_or("bad status")?,
        _ => return Err("no status"),
    };
    let mut headers = Vec::new();
    for (i, (_, field)) in fields.headers.iter().enumerate() {
        match obj.get(field) {
            Some(Value::String(s)) => headers.push((i, s.clone())),
            Some(Value::Number(n)) => headers.push((i, n.to_string())),
            _ => {}
        }
    }
    let usage = fields
        .usage
        .as_ref()
        .and_then(|field| match obj.get(field) {
            Some(Value::String(s)) if s != "-" => Some(s.clone().into_bytes()),
            Some(Value::Number(n)) => Some(n.to_string().into_bytes()),
            _ => None,
        })
        .map(Cow::Owned);
    let duration_ns = fields
        .duration
        .as_ref()
        .and_then(|field| match obj.get(field) {
            Some(Value::String(s)) => seconds_ns(s.as_bytes()),
            Some(Value::Number(n)) => unix_ns(n.as_f64())
                .and_then(|ns| u64::try_from(ns).ok())
                .filter(|&ns| ns > 0 && ns <= 366 * 86_400 * 1_000_000_000),
            _ => None,
        });
    Ok(Entry {
        time_ns,
        client,
        method: Cow::Owned(method),
        path: Cow::Owned(path),
        status,
        headers,
        usage,
        duration_ns,
    })
}

fn unix_ns(secs: Option<f64>) -> Option<i64> {
    let ns = secs? * 1e9;
    (ns.is_finite() && ns.abs() < 9.0e18).then_some(ns as i64)
}

fn json_time(s: &str) -> Option<i64> {
    if !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
        return unix_ns(s.parse().ok());
    }
    let t: jiff::Timestamp = s.parse().ok()?;
    i64::try_from(t.as_nanosecond()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One combined-format line, read with nothing remembered.
    fn one(line: &[u8]) -> Result<Entry<'_>, &'static str> {
        combined(line, &mut None).map(|(entry, _)| entry)
    }

    const LINE: &str = r#"203.0.113.7 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif?a=1 HTTP/1.0" 200 2326 "http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)""#;

    #[test]
    fn combined_line() {
        let e = one(LINE.as_bytes()).unwrap();
        assert_eq!(e.client, "203.0.113.7".parse::<IpAddr>().unwrap());
        // 2000-10-10T20:55:36Z
        assert_eq!(e.time_ns, 971_211_336 * 1_000_000_000);
        assert_eq!(
            (&*e.method, &*e.path, e.status),
            ("GET", "/apache_pb.gif?a=1", 200)
        );
    }

    #[test]
    fn a_quoted_field_ends_at_its_first_unescaped_quote() {
        assert_eq!(closing_quote(br#"GET /a HTTP/1.1" 200"#), Some(15));
        assert_eq!(closing_quote(br#"a\"b" c"#), Some(4));
        assert_eq!(closing_quote(br#"a\\" b"#), Some(3));
        assert_eq!(closing_quote(br#""#), None);
        assert_eq!(closing_quote(br#"no quote"#), None);
        assert_eq!(closing_quote(br#"escaped at the end\"#), None);
        assert_eq!(closing_quote(br#"escaped quote at the end\""#), None);
    }

    #[test]
    fn combined_errors() {
        let cut = &LINE[..LINE.find("HTTP").unwrap()];
        assert_eq!(one(cut.as_bytes()).unwrap_err(), "truncated request");
        let bad_date = LINE.replace("10/Oct", "32/Oct");
        assert_eq!(one(bad_date.as_bytes()).unwrap_err(), "bad time");
        let bad_month = LINE.replace("Oct", "Foo");
        assert_eq!(one(bad_month.as_bytes()).unwrap_err(), "bad time");
        assert_eq!(one(b"\xff\xfe\x00garbage").unwrap_err(), "not UTF-8");
        assert_eq!(one(b"").unwrap_err(), "truncated");
        let no_request = LINE.replace("GET /apache_pb.gif?a=1 HTTP/1.0", "-");
        assert_eq!(one(no_request.as_bytes()).unwrap_err(), "no request line");
        let no_status = &LINE[..LINE.find(" 200").unwrap() + 2];
        assert_eq!(one(no_status.as_bytes()).unwrap_err(), "no status");
    }

    /// The fast IPv4 reading accepts exactly what the standard parser does, and leaves
    /// everything else (IPv6 included) to it.
    #[test]
    fn a_dotted_quad_reads_as_the_standard_parser_reads_it() {
        let fields = [
            "0.0.0.0",
            "1.2.3.4",
            "255.255.255.255",
            "256.1.1.1",
            "01.2.3.4",
            "1.2.3.04",
            "1.2.3",
            "1.2.3.4.5",
            "1..3.4",
            "1.2.3.4x",
            "1234.1.1.1",
            "999.1.1.1",
            ".1.2.3",
            "1.2.3.",
            "::1",
            "2001:db8::1",
            "::ffff:1.2.3.4",
            "",
            "a.b.c.d",
            "10.0.0.100",
        ];
        for field in fields {
            let line = format!("{field} - - [rest");
            let std = field.parse::<std::net::Ipv4Addr>().ok();
            assert_eq!(
                dotted_quad(line.as_bytes()).map(|(ip, end)| (ip, &line[end..])),
                std.map(|ip| (ip, " - - [rest")),
                "{field:?}"
            );
            // Whatever the fast reading leaves, the line reads as the standard parser says.
            let whole = LINE.replacen("203.0.113.7", field, 1);
            match (one(whole.as_bytes()), field.parse::<IpAddr>()) {
                (Ok(e), Ok(ip)) => assert_eq!(e.client, ip, "{field:?}"),
                (Err(reason), Err(_)) => {
                    assert!(
                        ["bad client address", "truncated"].contains(&reason),
                        "{field:?}"
                    );
                }
                (got, want) => panic!("{field:?}: {got:?}, expected {want:?}"),
            }
        }
        // Ended by anything but a space, it is not a client field.
        assert_eq!(dotted_quad(b"1.2.3.4"), None);
        assert_eq!(dotted_quad(b"1.2.3.4\t"), None);
    }

    /// The time field of the line before is remembered with what it read as: the same text
    /// reads the same, a new text is read afresh, a bad one stays bad.
    #[test]
    fn the_last_time_field_is_read_once() {
        let mut last = None;
        let t = "10/Oct/2000:13:55:36 -0700";
        let ns = 971_211_336 * 1_000_000_000;
        assert_eq!(remembered_time(t.as_bytes(), &mut last), Some(ns));
        assert_eq!(last, Some((*b"10/Oct/2000:13:55:36 -0700", Some(ns))));
        assert_eq!(remembered_time(t.as_bytes(), &mut last), Some(ns));
        let next = "10/Oct/2000:13:55:37 -0700";
        assert_eq!(
            remembered_time(next.as_bytes(), &mut last),
            Some(ns + 1_000_000_000)
        );
        let bad = "31/Nov/2000:13:55:37 -0700";
        assert_eq!(remembered_time(bad.as_bytes(), &mut last), None);
        assert_eq!(remembered_time(bad.as_bytes(), &mut last), None);
        assert_eq!(remembered_time(t.as_bytes(), &mut last), Some(ns));
        // What the memo holds is what the same text reads as: it is not parsed again.
        let mut planted = Some((*b"10/Oct/2000:13:55:36 -0700", Some(42)));
        assert_eq!(remembered_time(t.as_bytes(), &mut planted), Some(42));
        // A field of another length is bad, and leaves the memo alone.
        assert_eq!(remembered_time(b"10/Oct/2000:13:55:36", &mut last), None);
        assert_eq!(last, Some((*b"10/Oct/2000:13:55:36 -0700", Some(ns))));
        // Lines in a row: each keeps its own time.
        let mut parser = Parser::new(&LogFormat::Combined);
        let times: Vec<i64> = [t, t, next, t]
            .iter()
            .map(|t| {
                parser
                    .parse(LINE.replace("10/Oct/2000:13:55:36 -0700", t).as_bytes())
                    .unwrap()
                    .time_ns
            })
            .collect();
        assert_eq!(times, [ns, ns, ns + 1_000_000_000, ns]);
    }

    #[test]
    fn a_status_is_three_digits_from_100() {
        assert_eq!(three_digit_status(b"200"), Some(200));
        assert_eq!(three_digit_status(b"100"), Some(100));
        assert_eq!(three_digit_status(b"999"), Some(999));
        for bad in [&b"099"[..], b"20", b"2000", b"+20", b"2 0", b"", b"abc"] {
            assert_eq!(three_digit_status(bad), None, "{bad:?}");
        }
        let bad = LINE.replace("\" 200 ", "\" 2x0 ");
        assert_eq!(one(bad.as_bytes()).unwrap_err(), "bad status");
    }

    /// Only the fields read must be text: bytes that are not UTF-8 after the status (or
    /// in the ignored user field) do not make the line bad; in the request line they do,
    /// and so does garbage that cannot be read at all.
    #[test]
    fn only_the_fields_read_must_be_utf8() {
        let mut line = LINE.as_bytes().to_vec();
        line.extend_from_slice(b" \xff\xfe");
        assert_eq!(one(&line).unwrap().status, 200);
        let user = LINE.replacen("frank", "fr\u{e9}nk", 1).into_bytes();
        let mut latin1 = user.clone();
        let at = latin1.iter().position(|&c| c == 0xc3).unwrap();
        latin1.splice(at..at + 2, [0xe9]);
        assert_eq!(one(&latin1).unwrap().path, "/apache_pb.gif?a=1");
        let mut path = LINE.as_bytes().to_vec();
        let at = LINE.find("gif").unwrap();
        path[at] = 0xff;
        assert_eq!(one(&path).unwrap_err(), "not UTF-8");
        // A path of valid UTF-8 is kept as it is.
        let accented = LINE.replacen("apache", "caf\u{e9}", 1);
        assert_eq!(
            one(accented.as_bytes()).unwrap().path,
            "/caf\u{e9}_pb.gif?a=1"
        );
    }

    #[test]
    fn dates() {
        assert_eq!(clf_time(b"01/Jan/1970:00:00:00 +0000"), Some(0));
        assert_eq!(
            clf_time(b"29/Feb/2024:00:00:00 +0100"),
            Some((1_709_164_800 - 3600) * 1_000_000_000)
        );
        assert_eq!(clf_time(b"29/Feb/2023:00:00:00 +0000"), None);
        assert_eq!(clf_time(b"01/Jan/1970:24:00:00 +0000"), None);
    }

    #[test]
    fn json_lines() {
        let mut fields = JsonFields::default();
        fields.set("client=ip").unwrap();
        fields.set("time=ts").unwrap();
        fields.header("x-api-key=key").unwrap();
        let f = LogFormat::Json(fields);
        let mut parser = Parser::new(&f);
        let mut parse = |line| parser.parse(line);
        let e = parse(
            br#"{"ip":"::1","ts":"2024-01-01T00:00:01Z","method":"POST","path":"/a","status":201,"key":"k1"}"#,
        )
        .unwrap();
        assert_eq!(e.time_ns, 1_704_067_201 * 1_000_000_000);
        assert_eq!((&*e.method, &*e.path, e.status), ("POST", "/a", 201));
        assert_eq!(e.headers, vec![(0, "k1".to_owned())]);
        let e =
            parse(br#"{"ip":"::1","ts":1.5,"method":"GET","path":"/","status":"404"}"#).unwrap();
        assert_eq!((e.time_ns, e.status), (1_500_000_000, 404));
        assert!(e.headers.is_empty());
        assert_eq!(parse(b"{\"ip\":").unwrap_err(), "not a JSON object");
        assert_eq!(
            parse(br#"{"ip":"::1","ts":"yesterday","method":"GET","path":"/","status":200}"#)
                .unwrap_err(),
            "bad time"
        );
    }

    /// Fields after the user agent, by position: quoted or bare, `-` or missing is none;
    /// the plain combined format reads none of them.
    #[test]
    fn fields_after_the_user_agent_are_read_by_position() {
        let mut fields = CombinedFields::default();
        fields.set("duration=1").unwrap();
        fields.set("usage=3").unwrap();
        let f = LogFormat::CombinedWith(fields);
        let mut parser = Parser::new(&f);
        let line = format!(r#"{LINE} 0.250 "upstream" "8\"12" tail"#);
        let e = parser.parse(line.as_bytes()).unwrap();
        assert_eq!(e.duration_ns, Some(250_000_000));
        assert_eq!(e.usage.as_deref(), Some(&br#"8\"12"#[..]));
        let line = format!("{LINE} 1.5 - 812");
        let e = parser.parse(line.as_bytes()).unwrap();
        assert_eq!(
            (e.duration_ns, e.usage.as_deref()),
            (Some(1_500_000_000), Some(&b"812"[..]))
        );
        let line = format!("{LINE} - x -");
        let e = parser.parse(line.as_bytes()).unwrap();
        assert_eq!((e.duration_ns, e.usage), (None, None));
        // Fewer fields, an unclosed quote: what is not there is not read.
        let line = format!("{LINE} 2");
        let e = parser.parse(line.as_bytes()).unwrap();
        assert_eq!((e.duration_ns, e.usage), (Some(2_000_000_000), None));
        let line = format!("{LINE} 2 x \"40");
        let e = parser.parse(line.as_bytes()).unwrap();
        assert_eq!(e.usage, None);
        let e = parser.parse(LINE.as_bytes()).unwrap();
        assert_eq!((e.duration_ns, e.usage), (None, None));
        let mut plain = Parser::new(&LogFormat::Combined);
        let line = format!("{LINE} 1.5 - 812");
        let e = plain.parse(line.as_bytes()).unwrap();
        assert_eq!((e.duration_ns, e.usage), (None, None));
        // Whatever follows the status, reading it never panics.
        let mut x: u32 = 11;
        for _ in 0..2_000 {
            let tail: Vec<u8> = (0..(x % 40))
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    b" \"-0.1x"[(x >> 16) as usize % 7]
                })
                .collect();
            let mut line = LINE.as_bytes()[..LINE.find(" 2326").unwrap() + 5].to_vec();
            line.extend_from_slice(&tail);
            let _ = parser.parse(&line);
            x = x.wrapping_add(1);
        }
        // Positions are 1 to 64, and only usage and duration.
        let mut fields = CombinedFields::default();
        for bad in ["usage=0", "usage=65", "usage=x", "status=1", "usage"] {
            assert_eq!(fields.set(bad).unwrap_err().field(), "--field", "{bad}");
        }
    }

    #[test]
    fn durations_are_decimal_seconds() {
        assert_eq!(seconds_ns(b"0.250"), Some(250_000_000));
        assert_eq!(seconds_ns(b"12"), Some(12_000_000_000));
        assert_eq!(seconds_ns(b".5"), Some(500_000_000));
        assert_eq!(seconds_ns(b"3."), Some(3_000_000_000));
        assert_eq!(seconds_ns(b"0.0000000019"), Some(1));
        assert_eq!(seconds_ns(b" 1.000 "), Some(1_000_000_000));
        for bad in [
            &b""[..],
            b".",
            b"0",
            b"0.000",
            b"-1",
            b"1e3",
            b"1.2.3",
            b"abc",
            b"99999999",
            b"123456789",
        ] {
            assert_eq!(seconds_ns(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn json_usage_and_duration_fields() {
        let mut fields = JsonFields::default();
        fields.set("usage=tokens").unwrap();
        fields.set("duration=rt").unwrap();
        let f = LogFormat::Json(fields);
        let mut parser = Parser::new(&f);
        let base = r#"{"remote_addr":"::1","time":1,"method":"GET","path":"/","status":200"#;
        let line = format!(r#"{base},"tokens":812,"rt":0.25}}"#);
        let e = parser.parse(line.as_bytes()).unwrap();
        assert_eq!(
            (e.usage.as_deref(), e.duration_ns),
            (Some(&b"812"[..]), Some(250_000_000))
        );
        let line = format!(r#"{base},"tokens":"9","rt":"1.5"}}"#);
        let e = parser.parse(line.as_bytes()).unwrap();
        assert_eq!(
            (e.usage.as_deref(), e.duration_ns),
            (Some(&b"9"[..]), Some(1_500_000_000))
        );
        let line = format!(r#"{base},"tokens":"-","rt":-1}}"#);
        let e = parser.parse(line.as_bytes()).unwrap();
        assert_eq!((e.usage, e.duration_ns), (None, None));
        let line = format!("{base}}}");
        let e = parser.parse(line.as_bytes()).unwrap();
        assert_eq!((e.usage, e.duration_ns), (None, None));
    }
}
