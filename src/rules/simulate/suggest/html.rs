//! What `suggest --html` writes: the distributions across keys of their peaks per window
//! as inline SVG histograms, the percentiles, the suggested quotas and the rules fragment,
//! in one self-contained page (the same style and guarantees as the `simulate` report: no
//! script, nothing loaded, every value escaped).

use std::fmt::Write;

use super::super::html::page;
use super::super::svg::{self, Bar, Chart, escape};
use super::pick::{Distribution, PERCENTILES};
use super::{Suggested, Window};

/// The most columns of a histogram.
const BINS: u64 = 30;

const COLORS: [&str; 3] = ["#2471a3", "#7d3c98", "#148f77"];

/// The histogram of `d`: at most [`BINS`] columns of equal width from its least value to
/// its largest, each the number of keys whose value falls in it.
pub(super) fn histogram(d: &Distribution) -> Vec<Bar> {
    let (Some(&low), Some(&high)) = (d.values().first(), d.values().last()) else {
        return Vec::new();
    };
    // At most BINS columns: (high - low) / width < BINS.
    let width = (high - low) / BINS + 1;
    let mut bars = Vec::new();
    let mut from = low;
    while from <= high {
        let to = from.saturating_add(width - 1).min(high);
        // Keys at most `to`, less those below `from`.
        let keys = d.at_most(to) - if from == 0 { 0 } else { d.at_most(from - 1) };
        let label = if from == to {
            from.to_string()
        } else {
            format!("{from}–{to}")
        };
        bars.push(
            Bar::new(label, keys as u64)
                .data("data-from", from)
                .data("data-to", to)
                .data("data-keys", keys),
        );
        if to == u64::MAX {
            break;
        }
        from = to + 1;
    }
    bars
}

impl Suggested {
    /// The suggestion as a self-contained HTML page: per window (1 s, 1 min, 1 h) the
    /// histogram of the keys' peaks with its percentiles, the quotas suggested (per route
    /// with `--route`) and the rules fragment. `title` says what was read.
    ///
    /// Its numbers are also in `data-*` attributes: each window's `<svg>` has
    /// `data-window`, `data-keys`, `data-p50`, `data-p90`, `data-p99`, `data-p99.9` and
    /// `data-max`; each column `data-from`, `data-to` and `data-keys`; each suggested
    /// limit's row `data-limit`, `data-rate` and `data-burst`.
    ///
    /// ```
    /// use tollgate::rules::LogFormat;
    /// use tollgate::rules::suggest::{SuggestKey, Suggestion};
    ///
    /// let line = "192.0.2.1 - - [10/Oct/2024:13:55:36 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n";
    /// let log = line.repeat(3);
    /// let suggested = Suggestion::new(LogFormat::Combined, SuggestKey::Ip)
    ///     .run(|| Ok::<_, std::io::Error>(log.as_bytes()))?;
    /// let page = suggested.to_html("access.log");
    /// assert!(page.contains(r#"data-window="1s" data-keys="1""#));
    /// assert!(!page.contains("<script"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_html(&self, title: &str) -> String {
        let mut out = page(
            "suggest",
            "Limits your clients would not have noticed",
            title,
        );
        let _ = writeln!(
            out,
            "<table class=\"summary\" data-lines=\"{}\" data-requests=\"{}\" data-keys=\"{}\" data-share=\"{}\">\
             <tr><td>lines</td><td class=\"n\">{}</td></tr>\
             <tr><td>bad lines</td><td class=\"n\">{}</td></tr>\
             <tr><td>requests with a key ({})</td><td class=\"n\">{}</td></tr>\
             <tr><td>keys</td><td class=\"n\">{}</td></tr>\
             <tr><td>share of keys never refused</td><td class=\"n\">{}%</td></tr></table>",
            self.lines,
            self.requests,
            self.keys,
            self.share,
            self.lines,
            self.bad_lines,
            escape(&self.key.rules_key()),
            self.requests,
            self.keys,
            self.share * 100.0,
        );
        for (i, (window, d)) in self.overall.iter().enumerate() {
            window_section(&mut out, *window, d, COLORS[i % COLORS.len()]);
        }
        self.suggested(&mut out);
        let _ = write!(
            out,
            "<h2>The rules</h2><pre>{}</pre>\n<p class=\"note\">Written by <code>tollgate-rules \
             suggest --html</code>.</p>\n</body></html>\n",
            // Line by line: `escape` makes control characters (newlines too) visible.
            self.rules()
                .lines()
                .map(escape)
                .collect::<Vec<_>>()
                .join("\n")
        );
        out
    }

    /// The table of suggested quotas, one row per limit.
    fn suggested(&self, out: &mut String) {
        out.push_str(
            "<h2>Suggested limits</h2><table><tr><th>route</th><th>window</th>\
             <th class=\"n\">quota</th><th class=\"n\">burst</th><th class=\"n\">keys</th>\
             <th class=\"n\">never refused</th></tr>",
        );
        for g in &self.groups {
            for w in &g.windows {
                let _ = write!(
                    out,
                    "<tr data-window=\"{}\" data-rate=\"{}\" data-burst=\"{}\"><td>{}</td><td>{}</td>\
                     <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                    w.window.label(),
                    w.rate,
                    w.burst,
                    escape(g.route.as_deref().unwrap_or("every route")),
                    w.window.label(),
                    escape(&w.quota()),
                    w.burst,
                    g.keys,
                    g.never_refused,
                );
            }
        }
        out.push_str("</table>\n");
    }
}

/// One window: its histogram and percentiles.
fn window_section(out: &mut String, window: Window, d: &Distribution, color: &'static str) {
    let _ = write!(
        out,
        "<section data-window=\"{w}\"><h2>Peak requests of a key in {w}</h2>",
        w = window.label()
    );
    let mut chart = Chart::new(
        format!("Keys by their peak requests in {}", window.label()),
        color,
    )
    .data("data-window", window.label())
    .data("data-keys", d.len());
    for p in PERCENTILES {
        chart = chart.data(percentile_attribute(p), d.percentile(p));
    }
    chart = chart.data("data-max", d.max());
    svg::columns(out, &chart, &histogram(d), 6);
    out.push_str("<table><tr>");
    for p in PERCENTILES {
        let _ = write!(out, "<th class=\"n\">p{p}</th>");
    }
    out.push_str("<th class=\"n\">max</th></tr><tr>");
    for p in PERCENTILES {
        let _ = write!(out, "<td class=\"n\">{}</td>", d.percentile(p));
    }
    let _ = writeln!(
        out,
        "<td class=\"n\">{}</td></tr></table></section>",
        d.max()
    );
}

/// The attribute of a percentile: `data-p50`, ..., `data-p99.9`.
fn percentile_attribute(p: f64) -> &'static str {
    match p {
        50.0 => "data-p50",
        90.0 => "data-p90",
        99.0 => "data-p99",
        _ => "data-p99.9",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_every_key_once() {
        let values: Vec<u64> = (0..1000u64).map(|i| i % 97 + i / 300).collect();
        let d = Distribution::new(values);
        let bars = histogram(&d);
        assert!(bars.len() as u64 <= BINS);
        assert_eq!(bars.iter().map(|b| b.value).sum::<u64>(), 1000);
        // Contiguous, from the least value to the largest.
        let range = |b: &Bar| {
            let get = |n| {
                b.data
                    .iter()
                    .find(|(k, _)| *k == n)
                    .unwrap()
                    .1
                    .parse::<u64>()
                    .unwrap()
            };
            (get("data-from"), get("data-to"))
        };
        assert_eq!(range(&bars[0]).0, 0);
        assert_eq!(range(bars.last().unwrap()).1, d.max());
        for pair in bars.windows(2) {
            assert_eq!(range(&pair[0]).1 + 1, range(&pair[1]).0);
        }
        // One value: one column.
        let one = histogram(&Distribution::new(vec![7, 7, 7]));
        assert_eq!((one.len(), one[0].value), (1, 3));
        assert!(histogram(&Distribution::new(Vec::new())).is_empty());
        // The largest values do not overflow.
        let top = histogram(&Distribution::new(vec![0, u64::MAX]));
        assert_eq!(top.iter().map(|b| b.value).sum::<u64>(), 2);
    }

    #[test]
    fn percentile_attributes_are_the_documented_ones() {
        let names: Vec<&str> = PERCENTILES
            .iter()
            .map(|&p| percentile_attribute(p))
            .collect();
        assert_eq!(names, ["data-p50", "data-p90", "data-p99", "data-p99.9"]);
    }
}
