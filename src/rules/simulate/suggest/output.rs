//! What `suggest` prints: the rules fragment (`[[limits]]` blocks), the text report (a
//! rules file whose comments give the figures), and JSON.

use std::fmt::{self, Write as _};

use serde_json::{Value, json};

use super::pick::{Distribution, PERCENTILES};
use super::{GroupSuggestion, Suggested, Window};

impl GroupSuggestion {
    /// The name of the suggested limit for `window`: `suggest-1min`, or with a route
    /// `suggest-get-users-id-1min` (made unique by the caller's `index` when the route's
    /// name is taken).
    fn limit_name(&self, window: Window, index: usize) -> String {
        match &self.route {
            None => format!("suggest-{}", window.label()),
            Some(route) => {
                let mut slug = String::new();
                for c in route.chars() {
                    if c.is_ascii_alphanumeric() {
                        slug.push(c.to_ascii_lowercase());
                    } else if !slug.ends_with('-') {
                        slug.push('-');
                    }
                }
                let slug = slug.trim_matches('-');
                let slug: String = slug.chars().take(48).collect();
                format!(
                    "suggest-{}-{}-{}",
                    index + 1,
                    slug.trim_end_matches('-'),
                    window.label()
                )
            }
        }
    }
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn percentiles(d: &Distribution) -> Value {
    let mut map = serde_json::Map::new();
    for p in PERCENTILES {
        map.insert(format!("p{p}"), json!(d.percentile(p)));
    }
    map.insert("max".into(), json!(d.max()));
    Value::Object(map)
}

impl Suggested {
    /// The suggested limits as a rules-file fragment: per group (all keys, or each
    /// route), one `[[limits]]` block per window, `on_missing_key = "skip"` (requests
    /// without the key were not measured). Empty when the log had no requests with a key.
    pub fn rules(&self) -> String {
        let mut out = String::new();
        let key = quoted(&self.key.rules_key());
        for (i, g) in self.groups.iter().enumerate() {
            if g.keys == 0 {
                continue;
            }
            for w in &g.windows {
                let _ = writeln!(out, "[[limits]]");
                let _ = writeln!(out, "name = {}", quoted(&g.limit_name(w.window, i)));
                let _ = writeln!(out, "key = {key}");
                let _ = writeln!(out, "quota = {}", quoted(&w.quota()));
                let _ = writeln!(out, "on_missing_key = \"skip\"");
                if let Some(route) = &g.route {
                    let _ = writeln!(out, "routes = [{}]", quoted(route));
                }
                out.push('\n');
            }
        }
        out
    }

    /// The result as JSON:
    ///
    /// ```text
    /// {"lines": N, "bad_lines": N, "bad": [{"line": N, "reason": "..."}], "late_lines": N,
    ///  "requests": N, "without_key": N, "unrouted": N, "keys": N, "capped_requests": N,
    ///  "share": 0.999, "key": "peer_ip", "span": [FIRST, LAST] | null,
    ///  "overall": [{"window": "1s", "seconds": 1,
    ///               "peaks": {"p50": N, "p90": N, "p99": N, "p99.9": N, "max": N}}, ...],
    ///  "groups": [{"route": null | "GET /users/{id}", "keys": N, "requests": N,
    ///              "never_refused": N, "outliers": 0 | 1,
    ///              "windows": [{"window": "1s", "seconds": 1, "limit": "suggest-1s",
    ///                           "rate": N, "burst": N, "quota": "N/s; burst=N",
    ///                           "peaks": {...}, "bursts": {...}}, ...]}, ...],
    ///  "rules": "[[limits]]\n..."}
    /// ```
    ///
    /// `bursts` are the keys' least bursts at the suggested rate.
    pub fn to_json(&self) -> Value {
        let window_json =
            |w: Window| json!({"window": w.label(), "seconds": w.duration().as_secs()});
        let overall: Vec<Value> = self
            .overall
            .iter()
            .map(|(w, d)| {
                let mut v = window_json(*w);
                v["peaks"] = percentiles(d);
                v
            })
            .collect();
        let groups: Vec<Value> = self
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let windows: Vec<Value> = g
                    .windows
                    .iter()
                    .map(|w| {
                        let mut v = window_json(w.window);
                        v["limit"] = json!(g.limit_name(w.window, i));
                        v["rate"] = json!(w.rate);
                        v["burst"] = json!(w.burst);
                        v["quota"] = json!(w.quota());
                        v["peaks"] = percentiles(&w.peaks);
                        v["bursts"] = percentiles(&w.bursts);
                        v
                    })
                    .collect();
                json!({
                    "route": g.route,
                    "keys": g.keys,
                    "requests": g.requests,
                    "never_refused": g.never_refused,
                    "outliers": g.outliers,
                    "windows": windows,
                })
            })
            .collect();
        json!({
            "lines": self.lines,
            "bad_lines": self.bad_lines,
            "bad": self.bad.iter().map(|b| json!({"line": b.line, "reason": b.reason})).collect::<Vec<_>>(),
            "late_lines": self.late_lines,
            "requests": self.requests,
            "without_key": self.without_key,
            "unrouted": self.unrouted,
            "keys": self.keys,
            "capped_requests": self.capped_requests,
            "share": self.share,
            "key": self.key.rules_key(),
            "span": self.span.map(|(a, b)| vec![a, b]),
            "overall": overall,
            "groups": groups,
            "rules": self.rules(),
        })
    }
}

fn table_row(f: &mut fmt::Formatter<'_>, label: &str, d: &Distribution) -> fmt::Result {
    write!(f, "#   {label:<8}")?;
    for p in PERCENTILES {
        write!(f, " {:>8}", d.percentile(p))?;
    }
    writeln!(f, " {:>8}", d.max())
}

fn table_head(f: &mut fmt::Formatter<'_>, what: &str) -> fmt::Result {
    write!(f, "#   {what:<8}")?;
    for p in PERCENTILES {
        write!(f, " {:>8}", format!("p{p}"))?;
    }
    writeln!(f, " {:>8}", "max")
}

/// A rules file: the figures as comments, then the suggested limits.
impl fmt::Display for Suggested {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "# tollgate-rules suggest: {} lines, {} bad, {} requests from {} keys ({})",
            self.lines,
            self.bad_lines,
            self.requests,
            self.keys,
            self.key.rules_key()
        )?;
        for b in &self.bad {
            writeln!(f, "#   bad line {}: {}", b.line, b.reason)?;
        }
        if self.bad_lines > self.bad.len() as u64 {
            writeln!(
                f,
                "#   ... and {} more bad lines",
                self.bad_lines - self.bad.len() as u64
            )?;
        }
        if self.late_lines > 0 {
            writeln!(
                f,
                "# {} lines earlier than the line before them, counted at the latest time seen",
                self.late_lines
            )?;
        }
        if self.without_key > 0 {
            writeln!(
                f,
                "# {} requests without the key: the limits skip them",
                self.without_key
            )?;
        }
        if self.unrouted > 0 {
            writeln!(
                f,
                "# {} requests on none of the routes below: not limited",
                self.unrouted
            )?;
        }
        if self.capped_requests > 0 {
            writeln!(
                f,
                "# {} requests of keys beyond the key cap ({} keys measured): not measured",
                self.capped_requests, self.keys
            )?;
        }
        let share = self.share * 100.0;
        if self.groups.iter().all(|g| g.keys == 0) {
            return writeln!(f, "# no requests with a key: nothing to suggest");
        }
        if self.groups.len() > 1 || self.groups.iter().any(|g| g.route.is_some()) {
            writeln!(
                f,
                "#\n# peak requests per key and route in any window, all routes:"
            )?;
            table_head(f, "window")?;
            for (w, d) in &self.overall {
                table_row(f, w.label(), d)?;
            }
        }
        for (i, g) in self.groups.iter().enumerate() {
            if g.keys == 0 {
                continue;
            }
            writeln!(f, "#")?;
            if let Some(route) = &g.route {
                writeln!(f, "# {route}: {} requests from {} keys", g.requests, g.keys)?;
            }
            writeln!(f, "# peak requests per key in any window:")?;
            table_head(f, "window")?;
            for w in &g.windows {
                table_row(f, w.window.label(), &w.peaks)?;
            }
            writeln!(f, "# least burst per key at the suggested rate:")?;
            table_head(f, "rate")?;
            for w in &g.windows {
                table_row(f, &format!("{}/{}", w.rate, w.window.unit()), &w.bursts)?;
            }
            write!(
                f,
                "# these limits never refuse {} of the {} keys ({:.3} %; asked: {share} %",
                g.never_refused,
                g.keys,
                g.never_refused as f64 * 100.0 / g.keys as f64,
            )?;
            if g.outliers > 0 {
                write!(
                    f,
                    "; {} outlier left out: a peak more than {} times every other key's",
                    g.outliers,
                    super::OUTLIER_RATIO
                )?;
            }
            writeln!(f, ")\n")?;
            for w in &g.windows {
                writeln!(f, "[[limits]]")?;
                writeln!(f, "name = {}", quoted(&g.limit_name(w.window, i)))?;
                writeln!(f, "key = {}", quoted(&self.key.rules_key()))?;
                writeln!(f, "quota = {}", quoted(&w.quota()))?;
                writeln!(f, "on_missing_key = \"skip\"")?;
                if let Some(route) = &g.route {
                    writeln!(f, "routes = [{}]", quoted(route))?;
                }
                writeln!(f)?;
            }
        }
        Ok(())
    }
}
