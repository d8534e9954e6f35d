//! Charts as inline SVG text, for the HTML reports of the rules tools: a horizontal bar
//! chart (the most refused keys, percentiles) and a column chart (counts over time, a
//! histogram). No script, no font, no link: the SVG draws as it is, inside an HTML page
//! or alone. Every text and attribute value is escaped with [`escape`]; the numbers a
//! test may compare go in `data-*` attributes the caller names.

use std::fmt::Write;

/// The width of every chart, in pixels.
pub(crate) const WIDTH: u32 = 640;

/// The most characters of a label drawn; the whole label is in the bar's `<title>`.
const LABEL_CHARS: usize = 34;

/// Text made safe for HTML and SVG, in text and in quoted attribute values: `&`, `<`,
/// `>`, `"` and `'` as entities, control characters as U+FFFD.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' => out.push(' '),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// `text` cut to `max` characters, with `…` when cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(max.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// ` name="value"` for each attribute, values escaped. Names are the caller's constants.
fn attributes(out: &mut String, data: &[(&'static str, String)]) {
    for (name, value) in data {
        let _ = write!(out, r#" {name}="{}""#, escape(value));
    }
}

/// One bar, or one column: its label, its value, and its `data-*` attributes.
#[derive(Debug, Clone)]
pub(crate) struct Bar {
    /// Drawn beside the bar (bars: cut to 34 characters) or under the column (every few
    /// columns); whole in the `<title>` tooltip.
    pub(crate) label: String,
    /// The length of the bar, the height of the column.
    pub(crate) value: u64,
    /// Attributes of the bar's element, e.g. `("data-refused", "12")`.
    pub(crate) data: Vec<(&'static str, String)>,
}

impl Bar {
    pub(crate) fn new(label: impl Into<String>, value: u64) -> Self {
        Self {
            label: label.into(),
            value,
            data: Vec::new(),
        }
    }

    /// With one more attribute of the bar's element.
    pub(crate) fn data(mut self, name: &'static str, value: impl ToString) -> Self {
        self.data.push((name, value.to_string()));
        self
    }
}

/// What a chart says about itself: its accessible name, its colour, the attributes of its
/// `<svg>` element (e.g. `("data-limit", name)`).
#[derive(Debug, Clone)]
pub(crate) struct Chart {
    pub(crate) title: String,
    pub(crate) color: &'static str,
    pub(crate) data: Vec<(&'static str, String)>,
}

impl Chart {
    pub(crate) fn new(title: impl Into<String>, color: &'static str) -> Self {
        Self {
            title: title.into(),
            color,
            data: Vec::new(),
        }
    }

    /// With one more attribute of the `<svg>` element.
    pub(crate) fn data(mut self, name: &'static str, value: impl ToString) -> Self {
        self.data.push((name, value.to_string()));
        self
    }

    fn open(&self, out: &mut String, class: &str, height: u32) {
        let _ = write!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart {class}" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{}""#,
            escape(&self.title)
        );
        attributes(out, &self.data);
        out.push('>');
        let _ = write!(out, "<title>{}</title>", escape(&self.title));
    }
}

/// A round number at least `n` (1, 2 or 5 times a power of ten), at least 1.
pub(crate) fn nice_ceiling(n: u64) -> u64 {
    let mut step = 1u64;
    loop {
        for m in [1, 2, 5] {
            let v = step.saturating_mul(m);
            if v >= n || v == u64::MAX {
                return v;
            }
        }
        step = step.saturating_mul(10);
    }
}

/// A horizontal bar chart, one row per bar in the order given: label on the left, bar,
/// value on the right. Each bar is a `<g class="bar">` carrying its attributes.
pub(crate) fn bars(out: &mut String, chart: &Chart, bars: &[Bar]) {
    const ROW: u32 = 22;
    const LABEL: u32 = 230;
    const SPACE: u32 = WIDTH - LABEL - 70;
    let height = ROW * bars.len().max(1) as u32 + 8;
    chart.open(out, "bars", height);
    let max = bars.iter().map(|b| b.value).max().unwrap_or(0).max(1);
    for (i, bar) in bars.iter().enumerate() {
        let y = 4 + ROW * i as u32;
        let length = (bar.value as f64 / max as f64 * f64::from(SPACE)).round();
        out.push_str(r#"<g class="bar""#);
        attributes(out, &bar.data);
        let _ = write!(
            out,
            r#"><title>{label}: {value}</title><text x="{lx}" y="{ty}" text-anchor="end" class="label">{short}</text><rect x="{LABEL}" y="{ry}" width="{length}" height="{h}" fill="{color}"/><text x="{vx}" y="{ty}" class="value">{value}</text></g>"#,
            label = escape(&bar.label),
            value = bar.value,
            lx = LABEL - 8,
            ty = y + 15,
            short = escape(&shorten(&bar.label, LABEL_CHARS)),
            ry = y + 3,
            h = ROW - 6,
            color = chart.color,
            vx = f64::from(LABEL) + length + 6.0,
        );
    }
    if bars.is_empty() {
        let _ = write!(out, r#"<text x="{LABEL}" y="19" class="empty">none</text>"#);
    }
    out.push_str("</svg>");
}

/// A column chart: one column per bar, left to right, on a y axis from 0 to a round
/// number; every few columns' labels under them (at most `labels` of them). For counts
/// over time (labels the bucket's start) or a histogram (labels the bucket's range).
/// Each column is a `<rect class="col">` carrying its attributes, empty ones included.
pub(crate) fn columns(out: &mut String, chart: &Chart, columns: &[Bar], labels: usize) {
    const HEIGHT: u32 = 150;
    const LEFT: f64 = 56.0;
    const TOP: f64 = 10.0;
    const BOTTOM: f64 = 26.0;
    let plot_w = f64::from(WIDTH) - LEFT - 10.0;
    let plot_h = f64::from(HEIGHT) - TOP - BOTTOM;
    chart.open(out, "columns", HEIGHT);
    let top = nice_ceiling(columns.iter().map(|c| c.value).max().unwrap_or(0));
    let base = TOP + plot_h;
    // The y axis: 0, half and the top, with grid lines.
    for (value, y) in [
        (Some(0), base),
        // Half the top, when a whole number.
        (top.is_multiple_of(2).then_some(top / 2), TOP + plot_h / 2.0),
        (Some(top), TOP),
    ] {
        let label = value.map(|v| v.to_string()).unwrap_or_default();
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{y}" x2="{x2}" y2="{y}" stroke="#ddd"/><text x="{tx}" y="{ty}" text-anchor="end" class="axis">{label}</text>"##,
            x2 = LEFT + plot_w,
            tx = LEFT - 6.0,
            ty = y + 4.0,
        );
    }
    let n = columns.len().max(1);
    let step = plot_w / n as f64;
    let every = n.div_ceil(labels.max(1));
    for (i, column) in columns.iter().enumerate() {
        let h = column.value as f64 / top as f64 * plot_h;
        let x = LEFT + step * i as f64;
        out.push_str(r#"<rect class="col""#);
        attributes(out, &column.data);
        let _ = write!(
            out,
            r#" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{color}"><title>{label}: {value}</title></rect>"#,
            y = base - h,
            w = (step - 1.0).max(1.0),
            color = chart.color,
            label = escape(&column.label),
            value = column.value,
        );
        if i % every == 0 {
            let _ = write!(
                out,
                r#"<text x="{x:.1}" y="{y}" class="axis">{}</text>"#,
                escape(&shorten(&column.label, 16)),
                y = f64::from(HEIGHT) - 8.0,
            );
        }
    }
    out.push_str("</svg>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape("<script>alert(\"x\")</script> & 'y'\u{0}"),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;\u{FFFD}"
        );
    }

    #[test]
    fn shortens_by_characters() {
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("abcd", 3), "ab…");
        assert_eq!(shorten("ééééé", 4), "ééé…");
    }

    #[test]
    fn round_ceilings() {
        let got: Vec<u64> = [0, 1, 3, 7, 10, 11, 51, 999, u64::MAX]
            .map(nice_ceiling)
            .to_vec();
        assert_eq!(got, [1, 1, 5, 10, 10, 20, 100, 1000, u64::MAX]);
    }

    /// Labels and attribute values are escaped; one element per bar, with its data.
    #[test]
    fn bars_escape_and_carry_data() {
        let mut out = String::new();
        let chart = Chart::new("top \"keys\"", "#c33").data("data-limit", "<l>");
        bars(
            &mut out,
            &chart,
            &[
                Bar::new("<script>x</script>", 5).data("data-key", "<script>\"'"),
                Bar::new("b", 2).data("data-key", "b"),
            ],
        );
        assert!(!out.contains("<script"), "{out}");
        assert!(out.contains(r#"data-limit="&lt;l&gt;""#), "{out}");
        assert!(
            out.contains(r#"data-key="&lt;script&gt;&quot;&#39;""#),
            "{out}"
        );
        assert_eq!(out.matches(r#"<g class="bar""#).count(), 2);
        assert!(out.starts_with("<svg") && out.ends_with("</svg>"));
    }

    /// Every column is drawn, empty ones too; heights in proportion to a round top.
    #[test]
    fn columns_draw_every_bucket() {
        let mut out = String::new();
        let cols: Vec<Bar> = (0..30)
            .map(|i| Bar::new(format!("t{i}"), i % 3).data("data-n", i % 3))
            .collect();
        columns(&mut out, &Chart::new("c", "#36c"), &cols, 6);
        assert_eq!(out.matches(r#"<rect class="col""#).count(), 30);
        // Labels under every 5th column: 6 of them.
        assert_eq!(out.matches(r#"class="axis">t"#).count(), 6);
        assert!(out.contains(r#"data-n="2" x="#), "{out}");
    }
}
