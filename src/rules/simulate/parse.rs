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
    /// "$http_referer" "$http_user_agent"` (anything after the status is ignored).
    Combined,
    /// One JSON object per line, its fields named by the map.
    Json(JsonFields),
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
        }
    }
}

const ROLES: &[&str] = &["client", "time", "method", "path", "status"];

impl JsonFields {
    /// Sets one role from `ROLE=FIELD`, with `ROLE` one of `client`, `time`, `method`,
    /// `path`, `status`.
    pub fn set(&mut self, spec: &str) -> Result<(), ConfigError> {
        let (role, field) = split(spec, "--field")?;
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
}

/// Parses one line; the error says what is wrong with it.
pub(crate) fn parse<'a>(format: &LogFormat, line: &'a [u8]) -> Result<Entry<'a>, &'static str> {
    match format {
        LogFormat::Combined => combined(line),
        LogFormat::Json(fields) => json(fields, line),
    }
}

fn combined(line: &[u8]) -> Result<Entry<'_>, &'static str> {
    let line = std::str::from_utf8(line).map_err(|_| "not UTF-8")?;
    // Byte searches (the line is UTF-8, and these delimiters are ASCII, so every index is
    // a character boundary).
    let find = |s: &str, b: u8| memchr::memchr(b, s.as_bytes());
    let space = find(line, b' ').ok_or("truncated")?;
    let (client, rest) = (&line[..space], &line[space + 1..]);
    let client: IpAddr = client.parse().map_err(|_| "bad client address")?;
    let open = find(rest, b'[').ok_or("no time")?;
    let rest = &rest[open + 1..];
    let close = find(rest, b']').ok_or("truncated time")?;
    let time_ns = clf_time(&rest[..close]).ok_or("bad time")?;
    let rest = rest[close + 1..].strip_prefix(" \"").ok_or("no request")?;
    let end = closing_quote(rest).ok_or("truncated request")?;
    let request = &rest[..end];
    let (method, path) = match find(request, b' ') {
        Some(i) => {
            let after = &request[i + 1..];
            (
                &request[..i],
                &after[..find(after, b' ').unwrap_or(after.len())],
            )
        }
        None => ("", ""),
    };
    // No space: no path (`method` is empty then too).
    if method.is_empty() || method == "-" {
        return Err("no request line");
    }
    let rest = &rest[end + 1..];
    let status = rest.strip_prefix(' ').ok_or("no status")?;
    let status = status.get(..3).ok_or("no status")?;
    let status = status_code(status).ok_or("bad status")?;
    Ok(Entry {
        time_ns,
        client,
        method: Cow::Borrowed(method),
        path: Cow::Borrowed(path),
        status,
        headers: Vec::new(),
    })
}

/// The closing `"` of a quoted field (`\"` escaped, as Apache writes it).
fn closing_quote(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
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

fn status_code(s: &str) -> Option<u16> {
    let n: u16 = s.parse().ok()?;
    (100..=999).contains(&n).then_some(n)
}

/// `10/Oct/2000:13:55:36 -0700` → Unix nanoseconds.
fn clf_time(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 26 || b[2] != b'/' || b[6] != b'/' || b[11] != b':' || b[20] != b' ' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        b[r].iter().try_fold(0i64, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
        })
    };
    let day = num(0..2)?;
    let month = match &s[3..6] {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
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
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .and_then(|n| status_code(&n.to_string()))
            .ok_or("bad status")?,
        Some(Value::String(s)) => status_code(&s).ok_or("bad status")?,
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
    Ok(Entry {
        time_ns,
        client,
        method: Cow::Owned(method),
        path: Cow::Owned(path),
        status,
        headers,
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

    const LINE: &str = r#"203.0.113.7 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif?a=1 HTTP/1.0" 200 2326 "http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)""#;

    #[test]
    fn combined_line() {
        let e = combined(LINE.as_bytes()).unwrap();
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
        assert_eq!(closing_quote(r#"GET /a HTTP/1.1" 200"#), Some(15));
        assert_eq!(closing_quote(r#"a\"b" c"#), Some(4));
        assert_eq!(closing_quote(r#"a\\" b"#), Some(3));
        assert_eq!(closing_quote(r#""#), None);
        assert_eq!(closing_quote(r#"no quote"#), None);
        assert_eq!(closing_quote(r#"escaped at the end\"#), None);
        assert_eq!(closing_quote(r#"escaped quote at the end\""#), None);
    }

    #[test]
    fn combined_errors() {
        let cut = &LINE[..LINE.find("HTTP").unwrap()];
        assert_eq!(combined(cut.as_bytes()).unwrap_err(), "truncated request");
        let bad_date = LINE.replace("10/Oct", "32/Oct");
        assert_eq!(combined(bad_date.as_bytes()).unwrap_err(), "bad time");
        let bad_month = LINE.replace("Oct", "Foo");
        assert_eq!(combined(bad_month.as_bytes()).unwrap_err(), "bad time");
        assert_eq!(combined(b"\xff\xfe\x00garbage").unwrap_err(), "not UTF-8");
        assert_eq!(combined(b"").unwrap_err(), "truncated");
        let no_request = LINE.replace("GET /apache_pb.gif?a=1 HTTP/1.0", "-");
        assert_eq!(
            combined(no_request.as_bytes()).unwrap_err(),
            "no request line"
        );
        let no_status = &LINE[..LINE.find(" 200").unwrap() + 2];
        assert_eq!(combined(no_status.as_bytes()).unwrap_err(), "no status");
    }

    #[test]
    fn dates() {
        assert_eq!(clf_time("01/Jan/1970:00:00:00 +0000"), Some(0));
        assert_eq!(
            clf_time("29/Feb/2024:00:00:00 +0100"),
            Some((1_709_164_800 - 3600) * 1_000_000_000)
        );
        assert_eq!(clf_time("29/Feb/2023:00:00:00 +0000"), None);
        assert_eq!(clf_time("01/Jan/1970:24:00:00 +0000"), None);
    }

    #[test]
    fn json_lines() {
        let mut fields = JsonFields::default();
        fields.set("client=ip").unwrap();
        fields.set("time=ts").unwrap();
        fields.header("x-api-key=key").unwrap();
        let f = LogFormat::Json(fields);
        let e = parse(
            &f,
            br#"{"ip":"::1","ts":"2024-01-01T00:00:01Z","method":"POST","path":"/a","status":201,"key":"k1"}"#,
        )
        .unwrap();
        assert_eq!(e.time_ns, 1_704_067_201 * 1_000_000_000);
        assert_eq!((&*e.method, &*e.path, e.status), ("POST", "/a", 201));
        assert_eq!(e.headers, vec![(0, "k1".to_owned())]);
        let e = parse(
            &f,
            br#"{"ip":"::1","ts":1.5,"method":"GET","path":"/","status":"404"}"#,
        )
        .unwrap();
        assert_eq!((e.time_ns, e.status), (1_500_000_000, 404));
        assert!(e.headers.is_empty());
        assert_eq!(parse(&f, b"{\"ip\":").unwrap_err(), "not a JSON object");
        assert_eq!(
            parse(
                &f,
                br#"{"ip":"::1","ts":"yesterday","method":"GET","path":"/","status":200}"#
            )
            .unwrap_err(),
            "bad time"
        );
    }
}
