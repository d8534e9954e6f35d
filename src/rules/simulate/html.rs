//! The report as one self-contained HTML page (`tollgate-rules simulate --html`): inline
//! CSS and SVG charts (`svg`), no script, no font, nothing from the network (its
//! Content-Security-Policy forbids all of it). Every name and key is escaped.

use std::fmt::Write;

use super::report::{Difference, Report};
use super::svg::{self, Bar, Chart, escape};

/// The most keys each side of a difference draws.
const DIFFERENCE_BARS: usize = 20;

/// The most bad lines listed.
const BAD_LINES: usize = 20;

/// A colour per limit, in turn.
const COLORS: [&str; 6] = [
    "#c0392b", "#2471a3", "#7d3c98", "#b9770e", "#148f77", "#566573",
];

const STYLE: &str = "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;\
color:#222;max-width:700px;margin:24px auto;padding:0 16px}\
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 4px}\
h3{font-size:14px;margin:14px 0 2px;color:#555}.sub{color:#666;margin:0 0 16px}\
table{border-collapse:collapse;margin:8px 0}td,th{padding:2px 12px 2px 0;text-align:left}\
td.n,th.n{text-align:right}tr+tr td{border-top:1px solid #eee}\
svg{display:block;margin:4px 0}svg text{font:11px system-ui,sans-serif;fill:#333}\
svg text.empty{fill:#999}code{font-size:13px}.note{color:#666;font-size:13px}";

/// The start of a report page of `tollgate-rules <tool>`: the head (the style, a
/// Content-Security-Policy that loads nothing), the heading and the escaped `title`.
pub(super) fn page(tool: &str, heading: &str, title: &str) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>tollgate-rules {tool}: {t}</title><style>{STYLE}</style></head>\n<body>\
         <h1>{heading}</h1><p class=\"sub\">{t}</p>\n",
        t = escape(title),
    );
    out
}

impl Report {
    /// The report as a self-contained HTML page: a summary, per limit its refusals over
    /// time and its most refused keys as inline SVG charts, the `difference` with older
    /// rules if given (see [`Report::difference`]), the first bad lines. `title` says what
    /// was replayed (e.g. the rules and the log's names).
    ///
    /// The page has no script and loads nothing; its numbers are also in `data-*`
    /// attributes: `data-limit`, `data-requests`, `data-refused`, `data-banned-refused`,
    /// `data-bans`, `data-bans-by-level` (counts by repeat level, comma-separated),
    /// `data-keys-refused` on each limit's `<section>`; `data-with-usage`, `data-held`,
    /// `data-most-held`, `data-released-early` on the summary table; `data-key` and `data-refused` on each refused key's bar,
    /// `data-start` and `data-refused` on each bucket of the refusals over time
    /// ([`Report::timeline`]).
    ///
    /// ```
    /// use tollgate::rules::{Document, LogFormat, Simulation};
    ///
    /// let doc = Document::from_toml("[[limits]]\nname = \"per-ip\"\nkey = \"peer_ip\"\nquota = \"1/min\"\n")?;
    /// let line = "192.0.2.1 - - [10/Oct/2024:13:55:36 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n";
    /// let report = Simulation::new(LogFormat::Combined).run(&doc, line.repeat(3).as_bytes())?;
    /// let html = report.to_html(None, "rules.toml on access.log");
    /// assert!(html.contains(r#"data-limit="per-ip" data-requests="3" data-refused="2""#));
    /// assert!(html.contains(r#"data-key="@192.0.2.1" data-refused="2""#));
    /// assert!(!html.contains("<script"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_html(&self, difference: Option<&Difference>, title: &str) -> String {
        let mut out = page("simulate", "What these rules would have refused", title);
        self.summary(&mut out);
        for i in 0..self.limits.len() {
            self.limit(&mut out, i, COLORS[i % COLORS.len()]);
        }
        if let Some(d) = difference {
            diff(&mut out, d);
        }
        self.bad_lines(&mut out);
        out.push_str(
            "<p class=\"note\">Written by <code>tollgate-rules simulate --html</code>: \
             the real engine on a simulated clock.</p>\n</body></html>\n",
        );
        out
    }

    fn summary(&self, out: &mut String) {
        let span = match self.span {
            Some((a, b)) => format!(
                "{} to {} UTC",
                clock(a, "%Y-%m-%d %H:%M:%S"),
                clock(b, "%Y-%m-%d %H:%M:%S")
            ),
            None => "no request".to_owned(),
        };
        let _ = writeln!(
            out,
            "<table class=\"summary\" data-lines=\"{}\" data-bad-lines=\"{}\" data-late-lines=\"{}\" \
             data-requests=\"{}\" data-refused=\"{}\" data-with-usage=\"{}\" data-held=\"{}\" \
             data-most-held=\"{}\" data-released-early=\"{}\"><tr><td>lines read</td><td class=\"n\">{}</td></tr>\
             <tr><td>bad lines</td><td class=\"n\">{}</td></tr>\
             <tr><td>late lines (replayed at the latest time seen)</td><td class=\"n\">{}</td></tr>\
             <tr><td>requests replayed</td><td class=\"n\">{}</td></tr>\
             <tr><td>requests refused</td><td class=\"n\">{}</td></tr>\
             {}<tr><td>time span</td><td class=\"n\">{}</td></tr></table>",
            self.lines,
            self.bad_lines,
            self.late_lines,
            self.requests,
            self.refused,
            self.with_usage,
            self.held,
            self.most_held,
            self.released_early,
            self.lines,
            self.bad_lines,
            self.late_lines,
            self.requests,
            self.refused,
            self.rehearsal_rows(),
            escape(&span),
        );
        out.push_str(
            "<table class=\"limits\"><tr><th>limit</th><th class=\"n\">requests</th>\
             <th class=\"n\">refused</th><th class=\"n\">share</th><th class=\"n\">keys refused</th></tr>",
        );
        for l in &self.limits {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1} %</td><td class=\"n\">{}{}</td></tr>",
                escape(&l.name),
                l.requests,
                l.refused,
                100.0 * l.refused_share(),
                if l.keys_capped { "≥ " } else { "" },
                l.keys_refused,
            );
        }
        out.push_str("</table>\n");
    }

    /// The summary's rows for the log's usage and duration fields, where they were read.
    fn rehearsal_rows(&self) -> String {
        let mut rows = String::new();
        if self.with_usage > 0 {
            let _ = write!(
                rows,
                "<tr><td>requests with an actual usage</td><td class=\"n\">{}</td></tr>",
                self.with_usage
            );
        }
        if self.held > 0 {
            let _ = write!(
                rows,
                "<tr><td>responses held for their duration</td><td class=\"n\">{}</td></tr>\
                 <tr><td>most held at once</td><td class=\"n\">{}</td></tr>",
                self.held, self.most_held
            );
        }
        if self.released_early > 0 {
            let _ = write!(
                rows,
                "<tr><td>let go early (more than the most held at once)</td><td class=\"n\">{}</td></tr>",
                self.released_early
            );
        }
        rows
    }

    /// Limit `i`'s section: numbers, refusals over time, the most refused keys.
    fn limit(&self, out: &mut String, i: usize, color: &'static str) {
        let l = &self.limits[i];
        let name = escape(&l.name);
        let _ = write!(
            out,
            "<section class=\"limit\" data-limit=\"{name}\" data-requests=\"{}\" data-refused=\"{}\" \
             data-shadow-refused=\"{}\" data-banned-refused=\"{}\" data-bans=\"{}\" \
             data-bans-by-level=\"{}\" data-keys-refused=\"{}\" data-keys-capped=\"{}\">\
             <h2>limit {name}</h2><p>{} requests, {} refused ({:.1} %){}, {}{} keys refused.</p>{}",
            l.requests,
            l.refused,
            l.shadow_refused,
            l.banned_refused,
            l.bans,
            l.bans_by_level
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            l.keys_refused,
            l.keys_capped,
            l.requests,
            l.refused,
            100.0 * l.refused_share(),
            if l.shadow_refused > 0 {
                format!(", {} of them by a shadow limit", l.shadow_refused)
            } else {
                String::new()
            },
            if l.keys_capped { "at least " } else { "" },
            l.keys_refused,
            if l.bans > 0 || l.banned_refused > 0 {
                format!(
                    "<p class=\"bans\">{}.</p>",
                    escape(&super::report::ban_line(l))
                )
            } else {
                String::new()
            },
        );
        let t = &self.timeline;
        if !t.is_empty() {
            let _ = write!(out, "<h3>refusals per {} (UTC)</h3>", duration(t.width));
            let format = if t.width >= 86_400 {
                "%m-%d"
            } else if t.width >= 60 {
                "%H:%M"
            } else {
                "%H:%M:%S"
            };
            let refused = t.refused.get(i).map(Vec::as_slice).unwrap_or(&[]);
            let columns: Vec<Bar> = (0..t.len())
                .map(|b| {
                    let start = t.bucket_start(b);
                    let n = refused.get(b).copied().unwrap_or(0);
                    Bar::new(clock(start, format), n)
                        .data("data-start", start)
                        .data("data-refused", n)
                })
                .collect();
            let chart = Chart::new(format!("{}: refusals over time", l.name), color)
                .data("data-limit", &l.name)
                .data("data-chart", "timeline")
                .data("data-width", t.width);
            svg::columns(out, &chart, &columns, 6);
        }
        out.push_str("<h3>most refused keys</h3>");
        let bars: Vec<Bar> = l
            .top_refused
            .iter()
            .map(|(key, n)| {
                Bar::new(key.as_str(), *n)
                    .data("data-key", key)
                    .data("data-refused", n)
            })
            .collect();
        let chart = Chart::new(format!("{}: most refused keys", l.name), color)
            .data("data-limit", &l.name)
            .data("data-chart", "top");
        svg::bars(out, &chart, &bars);
        out.push_str("</section>\n");
    }

    fn bad_lines(&self, out: &mut String) {
        if self.bad_lines == 0 {
            return;
        }
        let _ = write!(
            out,
            "<section class=\"bad\" data-bad-lines=\"{}\"><h2>bad lines</h2><ul>",
            self.bad_lines
        );
        for b in self.bad.iter().take(BAD_LINES) {
            let _ = write!(
                out,
                "<li data-line=\"{}\">line {}: {}</li>",
                b.line,
                b.line,
                escape(b.reason)
            );
        }
        let listed = self.bad.len().min(BAD_LINES) as u64;
        if self.bad_lines > listed {
            let _ = write!(out, "<li>... and {} more</li>", self.bad_lines - listed);
        }
        out.push_str("</ul></section>\n");
    }
}

/// The difference's section: two bar charts.
fn diff(out: &mut String, d: &Difference) {
    let _ = write!(
        out,
        "<section class=\"difference\" data-newly-refused=\"{}\" data-no-longer-refused=\"{}\">\
         <h2>against the old rules</h2>",
        d.newly_refused.len(),
        d.no_longer_refused.len()
    );
    for (title, side, keys, color) in [
        (
            "newly refused: refused by the new rules only",
            "newly-refused",
            &d.newly_refused,
            "#c0392b",
        ),
        (
            "no longer refused: refused by the old rules only",
            "no-longer-refused",
            &d.no_longer_refused,
            "#1e8449",
        ),
    ] {
        let _ = write!(out, "<h3>{} keys {title}</h3>", keys.len());
        let bars: Vec<Bar> = keys
            .iter()
            .take(DIFFERENCE_BARS)
            .map(|(key, n)| {
                Bar::new(key.as_str(), *n)
                    .data("data-key", key)
                    .data("data-refused", n)
            })
            .collect();
        svg::bars(
            out,
            &Chart::new(title, color).data("data-chart", side),
            &bars,
        );
        if keys.len() > DIFFERENCE_BARS {
            let _ = write!(
                out,
                "<p class=\"note\">... and {} more</p>",
                keys.len() - DIFFERENCE_BARS
            );
        }
    }
    out.push_str("</section>\n");
}

/// Unix seconds in `format`, UTC.
fn clock(secs: i64, format: &str) -> String {
    match jiff::Timestamp::from_second(secs) {
        Ok(t) => t.strftime(format).to_string(),
        Err(_) => secs.to_string(),
    }
}

/// `1 s`, `5 min`, `3 h`, `1 day`, `14 days`.
fn duration(secs: i64) -> String {
    match secs {
        s if s % 86_400 == 0 && s > 86_400 => format!("{} days", s / 86_400),
        86_400 => "day".to_owned(),
        s if s % 3_600 == 0 && s > 3_600 => format!("{} h", s / 3_600),
        3_600 => "hour".to_owned(),
        s if s % 60 == 0 && s > 60 => format!("{} min", s / 60),
        60 => "minute".to_owned(),
        1 => "second".to_owned(),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::document::Document;
    use crate::rules::simulate::{LogFormat, Simulation};

    fn line(ip: &str, secs: u32) -> String {
        format!(
            "{ip} - - [10/Oct/2024:13:{:02}:{:02} +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n",
            secs / 60,
            secs % 60
        )
    }

    /// A limit name and a key from the log with markup and quotes come out escaped, in
    /// text and attributes alike; the page has no script and no external reference.
    #[test]
    fn hostile_names_and_keys_are_escaped() {
        let doc = Document::from_json(
            r#"{"limits": [{"name": "<script>alert('n')</script>\"", "key": "header:x-k", "quota": "1/min"}]}"#,
        )
        .unwrap();
        let key = "<script>alert(\"k\")</script>'";
        let log: String = (0..3)
            .map(|s| {
                serde_json::json!({"remote_addr": "192.0.2.1", "time": 1_700_000_000 + s,
                    "method": "GET", "path": "/", "status": 200, "k": key})
                .to_string()
                    + "\n"
            })
            .collect();
        let mut fields = super::super::JsonFields::default();
        fields.header("x-k=k").unwrap();
        let report = Simulation::new(LogFormat::Json(fields))
            .run(&doc, log.as_bytes())
            .unwrap();
        assert_eq!(report.limits[0].refused, 2);
        let d = report.difference(
            &Simulation::new(LogFormat::Combined)
                .run(&doc, &b""[..])
                .unwrap(),
        );
        let html = report.to_html(Some(&d), "<b>title</b>");
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<b>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(&#39;n&#39;)&lt;/script&gt;&quot;"));
        // Keys as the refusal log writes them (percent-encoded), escaped all the same.
        let key = &report.limits[0].top_refused[0].0;
        assert!(
            html.contains(&format!("data-key=\"{}\"", escape(key))),
            "{html}"
        );
        // The only address is the SVG namespace's.
        assert_eq!(
            html.matches("://").count(),
            html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
        );
        assert_eq!(html.matches("<svg").count(), html.matches("</svg>").count());
    }

    /// The timeline's buckets in the page add up to each limit's refusals.
    #[test]
    fn timeline_columns_carry_the_counts() {
        let doc = Document::from_toml(
            "[[limits]]\nname = \"a\"\nkey = \"peer_ip\"\nquota = \"1/min\"\n\
             [[limits]]\nname = \"b\"\nkey = \"peer_ip\"\nquota = \"100/min\"\n",
        )
        .unwrap();
        let log: String = (0..600).map(|s| line("192.0.2.7", s * 3)).collect();
        let report = Simulation::new(LogFormat::Combined)
            .run(&doc, log.as_bytes())
            .unwrap();
        let html = report.to_html(None, "t");
        let section = &html[html.find("data-limit=\"a\"").unwrap()..];
        let section = &section[..section.find("</section>").unwrap()];
        let sum: u64 = section
            .split("<rect class=\"col\"")
            .skip(1)
            .map(|c| {
                let at = c.find("data-refused=\"").unwrap() + 14;
                c[at..at + c[at..].find('"').unwrap()]
                    .parse::<u64>()
                    .unwrap()
            })
            .sum();
        assert_eq!(sum, report.limits[0].refused);
        assert_eq!(
            section.matches("<rect class=\"col\"").count(),
            report.timeline.len()
        );
    }

    #[test]
    fn durations() {
        let got: Vec<String> = [1, 5, 60, 300, 3_600, 10_800, 86_400, 1_209_600]
            .map(duration)
            .to_vec();
        assert_eq!(
            got,
            [
                "second", "5 s", "minute", "5 min", "hour", "3 h", "day", "14 days"
            ]
        );
    }
}
