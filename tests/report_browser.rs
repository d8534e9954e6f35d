//! Feature `rules`: the `tollgate-rules simulate --html` report in a real browser. Headless
//! Chromium (the Debian package `chromium`; `scripts/test.sh` installs it) loads the
//! report of the example log and rules and dumps the DOM it built: the page must log
//! nothing to the console (no error, no blocked load, no script), and its charts' SVG
//! elements must carry the counts the `--json` output gives, limit by limit, key by key,
//! bucket by bucket. A limit named like markup stays text. The console check is shown to
//! catch a `console.error`, an uncaught exception and a blocked load on pages made to
//! fail. Chromium also takes the picture of the report: with `UPDATE_REPORT_PNG=1` it is
//! written to `docs/report.png`, the README's picture.
//!
//! Without Chromium the test says so and passes, unless `CI=true`: there it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one Chromium run may take before it is killed: generous, it costs time only
/// when something hangs.
const CHROMIUM_LIMIT: Duration = Duration::from_secs(180);

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Chromium's path, `None` outside CI when it is not installed.
fn chromium() -> Option<PathBuf> {
    let candidates = ["chromium", "chromium-browser"];
    let found = std::env::var_os("CHROMIUM").map(PathBuf::from).or_else(|| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .flat_map(|dir| candidates.map(|c| dir.join(c)))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "chromium is not installed, and CI=true: the browser check of the report cannot be \
             skipped in CI (scripts/test.sh installs the Debian package `chromium`)"
        );
        eprintln!(
            "SKIPPED report_browser: chromium is not installed (apt-get install chromium); \
             the report was not checked in a browser"
        );
    }
    found
}

/// What Chromium made of a page: the DOM (or the screenshot's path) and the console
/// messages it logged.
struct Rendered {
    dom: String,
    console: Vec<String>,
}

/// Loads `page` in headless Chromium: `--dump-dom` or, with `screenshot`, a picture.
fn render(chromium: &Path, page: &Path, screenshot: Option<(&Path, &str)>) -> Rendered {
    let profile = tempfile::tempdir().unwrap();
    let mut command = Command::new(chromium);
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--hide-scrollbars",
        "--mute-audio",
        "--enable-logging=stderr",
        "--v=0",
    ]);
    command.arg(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        None => command.arg("--dump-dom"),
        Some((png, size)) => command
            .arg(format!("--screenshot={}", png.display()))
            .arg(format!("--window-size={size}")),
    };
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    let out_dir = tempfile::tempdir().unwrap();
    let (stdout, stderr) = (out_dir.path().join("out"), out_dir.path().join("err"));
    let mut child = command
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let began = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if began.elapsed() > CHROMIUM_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish {url} in {CHROMIUM_LIMIT:?}: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = String::from_utf8_lossy(&std::fs::read(&stderr).unwrap()).into_owned();
    assert!(
        status.success(),
        "chromium failed on {url}: {status}\n{log}"
    );
    Rendered {
        dom: String::from_utf8(std::fs::read(&stdout).unwrap()).unwrap(),
        console: console_messages(&log),
    }
}

/// The console messages in Chromium's log (`[...:INFO:CONSOLE:12] "message", source: ...`):
/// errors, warnings, blocked loads and anything a script logs.
fn console_messages(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect()
}

/// One start tag of the DOM: its name and attributes (values unescaped).
#[derive(Debug)]
struct Tag {
    name: String,
    attrs: Vec<(String, String)>,
}

impl Tag {
    fn get(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, name: &str) -> u64 {
        self.get(name)
            .unwrap_or_else(|| panic!("{name} missing on {self:?}"))
            .parse()
            .unwrap_or_else(|e| panic!("{name} on {self:?}: {e}"))
    }
}

/// The start tags of serialized HTML, in document order (text, comments and end tags
/// skipped; attribute values double-quoted, as Chromium writes them).
fn tags(html: &str) -> Vec<Tag> {
    let b = html.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = html[i..].find('<') {
        i += at + 1;
        if html[i..].starts_with("!--") {
            i += html[i..].find("-->").map_or(html.len() - i, |e| e + 3);
            continue;
        }
        if !b.get(i).is_some_and(u8::is_ascii_alphabetic) {
            continue;
        }
        let start = i;
        while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'>' && b[i] != b'/' {
            i += 1;
        }
        let mut tag = Tag {
            name: html[start..i].to_ascii_lowercase(),
            attrs: Vec::new(),
        };
        loop {
            while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b'/') {
                i += 1;
            }
            if i >= b.len() || b[i] == b'>' {
                break;
            }
            let name_start = i;
            while i < b.len() && !b"=> \t\n/".contains(&b[i]) {
                i += 1;
            }
            let name = html[name_start..i].to_ascii_lowercase();
            let mut value = String::new();
            if b.get(i) == Some(&b'=') && b.get(i + 1) == Some(&b'"') {
                let end = i + 2 + html[i + 2..].find('"').expect("unterminated attribute");
                value = unescape(&html[i + 2..end]);
                i = end + 1;
            }
            tag.attrs.push((name, value));
        }
        // The text of <style>, <script> and <title> is no markup.
        if matches!(tag.name.as_str(), "style" | "script") {
            let close = format!("</{}", tag.name);
            i += html[i..].find(&close).unwrap_or(html.len() - i);
        }
        out.push(tag);
    }
    out
}

fn unescape(value: &str) -> String {
    value
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// Runs `tollgate-rules simulate` with `args`.
fn simulate(args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-rules-under-test"))
        .current_dir(root())
        .arg("simulate")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The charts of the DOM: per `data-chart` svg, the limit it belongs to and its bars or
/// columns.
struct Chart<'a> {
    svg: &'a Tag,
    /// The `data-limit` of the `<section>` it is in, if any.
    section: Option<&'a str>,
    items: Vec<&'a Tag>,
}

fn charts(tags: &[Tag]) -> Vec<Chart<'_>> {
    let mut out: Vec<Chart<'_>> = Vec::new();
    let mut section = None;
    for tag in tags {
        match tag.name.as_str() {
            "section" => section = tag.get("data-limit"),
            "svg" => out.push(Chart {
                svg: tag,
                section,
                items: Vec::new(),
            }),
            "g" | "rect" if matches!(tag.get("class"), Some("bar" | "col")) => {
                out.last_mut()
                    .expect("a bar outside a chart")
                    .items
                    .push(tag);
            }
            _ => {}
        }
    }
    out
}

/// The report of the example log and rules, against the example's old rules: every count in its SVG
/// is the JSON's, and the page logs nothing to the console.
#[test]
fn report_renders_with_the_json_counts() {
    let Some(chromium) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    // From the repository's root, so that the page names the files as the README does.
    let args = [
        "examples/simulate.toml",
        "--log",
        "examples/access.log",
        "--against",
        "examples/simulate_old.toml",
    ];
    let json: serde_json::Value =
        serde_json::from_slice(&simulate(&[&args[..], &["--json"]].concat())).unwrap();
    simulate(&[&args[..], &["--html", html.to_str().unwrap()]].concat());

    let began = Instant::now();
    let page = render(&chromium, &html, None);
    eprintln!(
        "report: {} bytes, rendered in {:?}",
        std::fs::metadata(&html).unwrap().len(),
        began.elapsed()
    );
    assert_eq!(page.console, Vec::<String>::new(), "console messages");
    let tags = tags(&page.dom);
    assert!(
        !tags.iter().any(|t| t.name == "script"),
        "a script in the page"
    );

    let summary = tags
        .iter()
        .find(|t| t.get("class") == Some("summary"))
        .unwrap();
    for (attr, field) in [
        ("data-lines", "lines"),
        ("data-bad-lines", "bad_lines"),
        ("data-requests", "requests"),
        ("data-refused", "refused"),
    ] {
        assert_eq!(summary.number(attr), json[field], "{field}");
    }

    let charts = charts(&tags);
    let limits = json["limits"].as_array().unwrap();
    assert!(limits.iter().any(|l| l["refused"].as_u64() > Some(0)));
    let timeline = &json["timeline"];
    let (start, width) = (
        timeline["start"].as_i64().unwrap(),
        timeline["width"].as_i64().unwrap(),
    );
    for limit in limits {
        let name = limit["name"].as_str().unwrap();
        let section = tags
            .iter()
            .find(|t| t.name == "section" && t.get("data-limit") == Some(name))
            .unwrap_or_else(|| panic!("no section for {name}"));
        for (attr, field) in [
            ("data-requests", "requests"),
            ("data-refused", "refused"),
            ("data-keys-refused", "keys_refused"),
            ("data-shadow-refused", "shadow_refused"),
        ] {
            assert_eq!(section.number(attr), limit[field], "{name}: {field}");
        }
        let chart = |kind: &str| {
            charts
                .iter()
                .find(|c| c.section == Some(name) && c.svg.get("data-chart") == Some(kind))
                .unwrap_or_else(|| panic!("no {kind} chart for {name}"))
        };
        // The most refused keys, in order.
        let top = chart("top");
        assert_eq!(top.svg.get("data-limit"), Some(name));
        let bars: Vec<(&str, u64)> = top
            .items
            .iter()
            .map(|b| (b.get("data-key").unwrap(), b.number("data-refused")))
            .collect();
        let expected: Vec<(&str, u64)> = limit["top_refused"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| (k["key"].as_str().unwrap(), k["refused"].as_u64().unwrap()))
            .collect();
        assert_eq!(bars, expected, "{name}: top keys");
        // Refusals over time: every bucket, its start and count.
        let columns = &chart("timeline").items;
        let counts: Vec<u64> = columns.iter().map(|c| c.number("data-refused")).collect();
        let expected: Vec<u64> = limit["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        assert_eq!(counts, expected, "{name}: timeline");
        assert_eq!(
            counts.iter().sum::<u64>(),
            limit["refused"].as_u64().unwrap()
        );
        for (i, c) in columns.iter().enumerate() {
            assert_eq!(
                c.get("data-start"),
                Some(&*(start + i as i64 * width).to_string())
            );
        }
    }

    // The difference with the old rules, both ways.
    for (kind, field) in [
        ("newly-refused", "newly_refused"),
        ("no-longer-refused", "no_longer_refused"),
    ] {
        let chart = charts
            .iter()
            .find(|c| c.svg.get("data-chart") == Some(kind))
            .unwrap();
        let bars: Vec<(&str, u64)> = chart
            .items
            .iter()
            .map(|b| (b.get("data-key").unwrap(), b.number("data-refused")))
            .collect();
        let expected: Vec<(&str, u64)> = json["against"][field]
            .as_array()
            .unwrap()
            .iter()
            .take(20)
            .map(|k| (k["key"].as_str().unwrap(), k["refused"].as_u64().unwrap()))
            .collect();
        assert_eq!(bars, expected, "{kind}");
    }
    for side in ["newly_refused", "no_longer_refused"] {
        let keys = &json["against"][side];
        assert!(!keys.as_array().unwrap().is_empty(), "{side}: {keys}");
    }

    // The picture: a PNG, and the README's when asked.
    let png = dir.path().join("report.png");
    let shot = render(&chromium, &html, Some((&png, "760,1300")));
    assert_eq!(shot.console, Vec::<String>::new());
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    if std::env::var_os("UPDATE_REPORT_PNG").is_some() {
        std::fs::write(root().join("docs/report.png"), bytes).unwrap();
    }
}

/// A limit named like markup, with quotes: text in the page, never an element; the
/// attribute carries the name as it is.
#[test]
fn hostile_names_stay_text() {
    let Some(chromium) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let name = r#"<script>alert("x")</script><img src=x onerror=alert(1)>'&"#;
    let rules = dir.path().join("rules.json");
    std::fs::write(
        &rules,
        serde_json::json!({"limits": [{"name": name, "key": "peer_ip", "quota": "30/min"}]})
            .to_string(),
    )
    .unwrap();
    let html = dir.path().join("report.html");
    simulate(&[
        rules.to_str().unwrap(),
        "--log",
        "examples/access.log",
        "--html",
        html.to_str().unwrap(),
    ]);
    let page = render(&chromium, &html, None);
    assert_eq!(page.console, Vec::<String>::new(), "console messages");
    let tags = tags(&page.dom);
    assert!(
        !tags
            .iter()
            .any(|t| matches!(t.name.as_str(), "script" | "img")),
        "markup from a name became an element"
    );
    let section = tags
        .iter()
        .find(|t| t.name == "section" && t.get("class") == Some("limit"))
        .unwrap();
    assert_eq!(section.get("data-limit"), Some(name));
    assert!(section.number("data-refused") > 0);
}

/// The console check catches what it must: a page's `console.error`, an uncaught
/// exception, a load the policy blocks. (The report has no script and loads nothing:
/// any of these there would be a bug.)
#[test]
fn console_errors_are_detected() {
    let Some(chromium) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let policy = r#"<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'">"#;
    for (what, body) in [
        (
            "console.error",
            "<script>console.error('deliberate error')</script>",
        ),
        ("an uncaught exception", "<script>null.x()</script>"),
        (
            "a blocked load",
            r#"<svg><image href="http://192.0.2.1/x.png"/></svg><img src="missing.png">"#,
        ),
    ] {
        let page = dir.path().join("bad.html");
        std::fs::write(
            &page,
            format!("<!DOCTYPE html><html><head>{policy}</head><body><p>x</p>{body}</body></html>"),
        )
        .unwrap();
        let rendered = render(&chromium, &page, None);
        assert!(!rendered.console.is_empty(), "{what} not detected");
        assert!(rendered.dom.contains("<p>x</p>"));
    }
}

/// The DOM reader: tags, attributes, entities, text of <style> skipped.
#[test]
fn tags_reads_attributes() {
    let tags = tags(
        r#"<!DOCTYPE html><html><head><style>a>b{}</style></head><!-- <x a="1"> --><body><svg data-chart="top"><g class="bar" data-key="&lt;a&gt; &quot;b&quot; &amp;c" data-refused="3"><title>t</title></g></svg></body></html>"#,
    );
    let names: Vec<&str> = tags.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["html", "head", "style", "body", "svg", "g", "title"]
    );
    let bar = &tags[5];
    assert_eq!(bar.get("data-key"), Some(r#"<a> "b" &c"#));
    assert_eq!(bar.number("data-refused"), 3);
    let charts = charts(&tags);
    assert_eq!(charts.len(), 1);
    assert_eq!(charts[0].items.len(), 1);
}

/// Runs `tollgate-rules suggest` with `args`.
fn suggest(args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-rules-under-test"))
        .current_dir(root())
        .arg("suggest")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The report of `suggest --html` on the example log: one histogram per window whose
/// columns count every key once, the percentiles and the suggested quotas of the JSON
/// output, and nothing on the console.
#[test]
fn suggest_report_renders_the_json_distributions() {
    let Some(chromium) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("suggest.html");
    let args = [
        "--log",
        "examples/access.log",
        "--key",
        "ip",
        "--share",
        "80",
    ];
    let json: serde_json::Value =
        serde_json::from_slice(&suggest(&[&args[..], &["--json"]].concat())).unwrap();
    suggest(&[&args[..], &["--html", html.to_str().unwrap()]].concat());

    let page = render(&chromium, &html, None);
    assert_eq!(page.console, Vec::<String>::new(), "console messages");
    let tags = tags(&page.dom);
    assert!(
        !tags.iter().any(|t| t.name == "script"),
        "a script in the page"
    );

    let keys = json["keys"].as_u64().unwrap();
    let charts = charts(&tags);
    let overall = json["overall"].as_array().unwrap();
    assert_eq!(charts.len(), overall.len(), "one histogram per window");
    for (chart, window) in charts.iter().zip(overall) {
        let label = window["window"].as_str().unwrap();
        assert_eq!(chart.svg.get("data-window"), Some(label));
        assert_eq!(chart.svg.get("data-keys"), Some(keys.to_string().as_str()));
        for (attr, field) in [
            ("data-p50", "p50"),
            ("data-p90", "p90"),
            ("data-p99", "p99"),
            ("data-p99.9", "p99.9"),
            ("data-max", "max"),
        ] {
            assert_eq!(
                chart.svg.get(attr),
                Some(window["peaks"][field].to_string().as_str()),
                "{label} {attr}"
            );
        }
        // Every key in one column, the columns contiguous up to the largest peak.
        let count = |t: &Tag, a: &str| t.get(a).unwrap().parse::<u64>().unwrap();
        let columns = &chart.items;
        assert!(!columns.is_empty(), "{label}: no columns");
        assert_eq!(
            columns.iter().map(|c| count(c, "data-keys")).sum::<u64>(),
            keys,
            "{label}"
        );
        for pair in columns.windows(2) {
            assert_eq!(count(pair[0], "data-to") + 1, count(pair[1], "data-from"));
        }
        assert_eq!(
            count(columns.last().unwrap(), "data-to"),
            window["peaks"]["max"].as_u64().unwrap()
        );
    }
    // The suggested quotas, row by row.
    let rows: Vec<&Tag> = tags
        .iter()
        .filter(|t| t.name == "tr" && t.get("data-rate").is_some())
        .collect();
    let windows: Vec<&serde_json::Value> = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["windows"].as_array().unwrap())
        .collect();
    assert_eq!(rows.len(), windows.len());
    for (row, w) in rows.iter().zip(windows) {
        assert_eq!(row.get("data-window"), w["window"].as_str());
        assert_eq!(row.get("data-rate"), Some(w["rate"].to_string().as_str()));
        assert_eq!(row.get("data-burst"), Some(w["burst"].to_string().as_str()));
    }
}
