//! Parsing `X-Forwarded-For` and RFC 7239 `Forwarded` entries. Nothing here panics or
//! allocates for ordinary headers; whatever does not parse is `None` (untrusted).

use std::net::{IpAddr, SocketAddr};

/// One `X-Forwarded-For` entry: an address, optionally with a port (`1.2.3.4:80`,
/// `[2001:db8::1]:80`).
pub(crate) fn parse_xff_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim_matches(|c| c == ' ' || c == '\t');
    parse_node(entry)
}

/// An address as proxies write it: bare, bracketed IPv6, with or without a port.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    // `[v6]` without a port.
    s.strip_prefix('[')?
        .strip_suffix(']')?
        .parse::<IpAddr>()
        .ok()
        .filter(IpAddr::is_ipv6)
}

/// Calls `f` with each element of a `Forwarded` field line, left to right, as the
/// address of its `for=` parameter (`None` when absent, `unknown`, obfuscated or
/// malformed). Commas and semicolons inside quoted strings do not split.
pub(crate) fn forwarded_elements(line: &str, mut f: impl FnMut(Option<IpAddr>)) {
    let bytes = line.as_bytes();
    let mut start = 0;
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if in_quotes {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_quotes = false;
            }
        } else if b == b'"' {
            in_quotes = true;
        } else if b == b',' {
            f(forwarded_for(&line[start..i]));
            start = i + 1;
        }
    }
    f(forwarded_for(&line[start..]));
}

/// The `for=` address of one `Forwarded` element (`for=192.0.2.60;proto=http`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    let mut result = None;
    let mut seen = false;
    for pair in split_unquoted(element, b';') {
        let (name, value) = pair.split_once('=')?;
        if name.trim().eq_ignore_ascii_case("for") {
            if seen {
                return None; // a parameter repeated within one element is malformed
            }
            seen = true;
            let value = value.trim();
            let value = match value.strip_prefix('"') {
                Some(rest) => rest.strip_suffix('"')?,
                None => value,
            };
            // `unknown` and obfuscated identifiers (`_hidden`) are not addresses.
            result = parse_node(value);
        }
    }
    result
}

fn split_unquoted(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut in_quotes = false;
        for (i, b) in s.bytes().enumerate() {
            match b {
                b'"' => in_quotes = !in_quotes,
                b if b == sep && !in_quotes => {
                    rest = Some(&s[i + 1..]);
                    return Some(&s[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn xff_entries() {
        assert_eq!(parse_xff_entry(" 203.0.113.7 "), ip("203.0.113.7"));
        assert_eq!(parse_xff_entry("203.0.113.7:8080"), ip("203.0.113.7"));
        assert_eq!(parse_xff_entry("2001:db8::1"), ip("2001:db8::1"));
        assert_eq!(parse_xff_entry("[2001:db8::1]"), ip("2001:db8::1"));
        assert_eq!(parse_xff_entry("[2001:db8::1]:443"), ip("2001:db8::1"));
        for bad in [
            "",
            "unknown",
            "1.2.3",
            "1.2.3.4.5",
            "[1.2.3.4]",
            "🦀",
            "1.2.3.4 5.6.7.8",
            "[::1",
        ] {
            assert_eq!(parse_xff_entry(bad), None, "{bad:?}");
        }
    }

    fn elements(line: &str) -> Vec<Option<IpAddr>> {
        let mut v = Vec::new();
        forwarded_elements(line, |e| v.push(e));
        v
    }

    #[test]
    fn forwarded_elements_rfc7239_examples() {
        assert_eq!(elements(r#"for="_gazonk""#), vec![None]);
        assert_eq!(
            elements(r#"For="[2001:db8:cafe::17]:4711""#),
            vec![ip("2001:db8:cafe::17")]
        );
        assert_eq!(
            elements("for=192.0.2.60;proto=http;by=203.0.113.43"),
            vec![ip("192.0.2.60")]
        );
        assert_eq!(
            elements("for=192.0.2.43, for=198.51.100.17"),
            vec![ip("192.0.2.43"), ip("198.51.100.17")]
        );
        assert_eq!(elements("for=unknown"), vec![None]);
        assert_eq!(
            elements(r#"for="192.0.2.43:47011""#),
            vec![ip("192.0.2.43")]
        );
    }

    #[test]
    fn forwarded_malformed_is_untrusted_not_a_panic() {
        assert_eq!(elements(r#"for="1.2.3.4, for=5.6.7.8"#), vec![None]);
        assert_eq!(elements("by=1.2.3.4"), vec![None]);
        assert_eq!(elements("for=1.2.3.4;for=5.6.7.8"), vec![None]);
        assert_eq!(elements(""), vec![None]);
        assert_eq!(
            elements(r#"for="a,b", for=1.2.3.4"#),
            vec![None, ip("1.2.3.4")]
        );
        assert_eq!(elements("for"), vec![None]);
        assert_eq!(elements(r#"for="\"#), vec![None]);
        assert_eq!(elements("for=[2001:db8::1]"), vec![ip("2001:db8::1")]);
    }
}
