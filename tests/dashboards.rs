//! The Grafana dashboard (`dashboards/tollgate.json`) and the Prometheus alerting rules
//! (`dashboards/alerts.yml`) against the metrics tollgate really exports:
//!
//! - `promtool check rules` accepts the rules;
//! - every metric name the dashboard and the rules use is in the schema
//!   (`src/observe/metrics.rs`), and the dashboard shows every metric of the schema;
//! - a real Prometheus (`/usr/bin/prometheus`, the Debian package, which
//!   `scripts/test.sh` installs) scrapes `tests/bin/metrics_server.rs` under traffic that
//!   drives each metric (refusals, a shadow limit, a Redis store where nothing listens so
//!   the breaker opens, a refused reload, an audit sink too slow for its queue, bans,
//!   delays, settles), and every panel's query, every variable's query and every alert's
//!   expression must return data through its HTTP API; the alerts this traffic crosses
//!   the thresholds of must become pending or firing.
//!
//! Without `prometheus` or `promtool` on the PATH the tests that need them say so and
//! pass, except in CI (`CI=true`), where they fail.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

const DASHBOARD: &str = "dashboards/tollgate.json";
const ALERTS: &str = "dashboards/alerts.yml";
const SCHEMA: &str = "src/observe/metrics.rs";
/// How long Prometheus has to show a query's data (generous: CI machines are loaded; it
/// costs time only when something is wrong).
const DEADLINE: Duration = Duration::from_secs(180);
/// What the dashboard's Grafana variables stand for in the queries sent to Prometheus.
const VARIABLES: [(&str, &str); 4] = [
    ("$__rate_interval", "10s"),
    ("$job", JOB),
    ("$limit", ".*"),
    ("$store", ".*"),
];
const JOB: &str = "tollgate";
/// The alerts the test's traffic crosses the thresholds of (their full expression
/// returns data): each must become pending (or firing, past its `for:`).
const CROSSED: [&str; 8] = [
    "TollgateHighRefusalShare",
    "TollgateShadowLimitWouldRefuse",
    "TollgateStoreErrors",
    "TollgateBreakerOpen",
    "TollgateAnsweringWithoutStore",
    "TollgateRulesReloadFailing",
    "TollgateAuditDropping",
    "TollgateAuditWritesFailing",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
        .to_path_buf()
}

fn read(path: &str) -> String {
    let path = root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The tool's path, or `None` (outside CI) when it is not installed.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let message = format!(
            "`{name}` not found: install the Debian package `prometheus` (scripts/test.sh does)"
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{message}");
        }
        eprintln!("skipped: {message}");
    }
    found
}

/// The metric names of the schema: the `pub const ...: &str = "tollgate_..."` lines.
fn schema() -> Vec<String> {
    let names: Vec<String> = read(SCHEMA)
        .lines()
        .filter(|l| l.starts_with("pub const ") && l.contains(": &str = \"tollgate_"))
        .map(|l| l.split('"').nth(1).expect("a quoted name").to_owned())
        .collect();
    assert!(names.len() >= 20, "the schema's names, parsed: {names:?}");
    names
}

/// Every `tollgate_...` word of `text`.
fn metric_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("tollgate_") {
        let word: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + word.len()..];
        words.push(word);
    }
    words
}

/// Every `expr` of the dashboard's panels, each panel checked to have at least one.
fn panel_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or("?").to_owned();
            if panel["type"] == "row" {
                walk(panel["panels"].as_array().map_or(&[], |p| p), out);
                continue;
            }
            let targets = panel["targets"].as_array().map_or(&[][..], |t| t);
            assert!(!targets.is_empty(), "panel {title:?} has no query");
            for target in targets {
                let expr = target["expr"].as_str().unwrap_or("");
                assert!(!expr.is_empty(), "panel {title:?}: a target without expr");
                out.push((title.clone(), expr.to_owned()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().expect("panels"), &mut out);
    out
}

/// The dashboard's query variables, as PromQL: `label_values(m, l)` is `count by (l) (m)`.
fn variable_queries(dashboard: &Value) -> Vec<(String, String)> {
    let vars = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    vars.iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let name = v["name"].as_str().expect("name").to_owned();
            let q = v["query"]["query"].as_str().expect("query");
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| panic!("variable {name}: not label_values(...): {q}"));
            let (metric, label) = inner.rsplit_once(',').expect("label_values(metric, label)");
            (
                format!("variable {name}"),
                format!("count by ({}) ({})", label.trim(), metric.trim()),
            )
        })
        .collect()
}

/// `query` with the dashboard's variables replaced by what they stand for here.
fn substitute(query: &str) -> String {
    let mut q = query.to_owned();
    for (var, value) in VARIABLES {
        q = q.replace(var, value);
    }
    assert!(!q.contains('$'), "a variable left in {q}");
    q
}

#[test]
fn alerts_pass_promtool() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let out = Command::new(promtool)
        .arg("check")
        .arg("rules")
        .arg(root().join(ALERTS))
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool check rules:\n{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

/// No name drifts: the dashboard and the rules use only the schema's metrics (with the
/// exporter's `_bucket`, `_sum`, `_count` for histograms), and the dashboard shows all
/// of them.
#[test]
fn dashboard_and_alerts_use_the_schemas_names() {
    let schema = schema();
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard's JSON");
    let exprs: String = panel_queries(&dashboard)
        .into_iter()
        .chain(variable_queries(&dashboard))
        .map(|(_, e)| e + "\n")
        .collect();
    let alerts = read(ALERTS);
    let is = |word: &str, name: &str| {
        word == name
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| word.strip_suffix(s) == Some(name))
    };
    let known = |word: &str| schema.iter().any(|n| is(word, n));
    for (what, text) in [(DASHBOARD, &exprs), (ALERTS, &alerts)] {
        for word in metric_words(text) {
            assert!(known(&word), "{what} names `{word}`, not in {SCHEMA}");
        }
    }
    for name in &schema {
        assert!(
            metric_words(&exprs).iter().any(|w| is(w, name)),
            "{DASHBOARD} has no panel for `{name}`"
        );
    }
}

/// A child process killed (and waited for) when dropped, and by a `sh` watchdog if this
/// process dies without dropping it.
struct Spawned {
    child: Child,
    watchdog: Option<Child>,
}

impl Spawned {
    fn new(mut command: Command) -> Self {
        let child = command.spawn().expect("spawn");
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(r#"read _ignored; kill -9 "$0" 2>/dev/null"#)
            .arg(child.id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        Spawned { child, watchdog }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

type Http = Client<HttpConnector, Empty<Bytes>>;

async fn get(http: &Http, url: &str, headers: &[(&str, &str)]) -> Result<(u16, String), String> {
    let mut req = http::Request::get(url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = http
        .request(req.body(Empty::new()).expect("request"))
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus of our own: a free loopback port, its data in a temporary directory.
struct Prometheus {
    _process: Spawned,
    base: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(binary: &Path, http: &Http, target_port: u16) -> Self {
        let mut failures = Vec::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let port = free_port();
            let config = dir.path().join("prometheus.yml");
            std::fs::write(
                &config,
                format!(
                    "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                     rule_files:\n  - {alerts}\n\
                     scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n",
                    alerts = root().join(ALERTS).display(),
                ),
            )
            .expect("write the configuration");
            let log = dir.path().join("prometheus.log");
            let log_file = std::fs::File::create(&log).expect("the log file");
            let mut command = Command::new(binary);
            command
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("log"))
                .stderr(log_file);
            let mut process = Spawned::new(command);
            let base = format!("http://127.0.0.1:{port}");
            let started = Instant::now();
            loop {
                if let Ok(Some(status)) = process.child.try_wait() {
                    failures.push(format!(
                        "prometheus exited ({status}):\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    ));
                    break;
                }
                if let Ok((200, _)) = get(http, &format!("{base}/-/ready"), &[]).await {
                    return Prometheus {
                        _process: process,
                        base,
                        log,
                        _dir: dir,
                    };
                }
                assert!(
                    started.elapsed() < DEADLINE,
                    "prometheus not ready after {DEADLINE:?}:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        panic!("could not start prometheus:\n{}", failures.join("\n\n"));
    }

    /// `GET /api/v1/<path>`'s `data`.
    async fn api(&self, http: &Http, path: &str) -> Value {
        let url = format!("{}/api/v1/{path}", self.base);
        let (status, body) = get(http, &url, &[]).await.unwrap_or_else(|e| panic!("{e}"));
        let json: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: {e}: {body}"));
        assert!(
            status == 200 && json["status"] == "success",
            "{url}: {status} {body}"
        );
        json["data"].clone()
    }

    /// Polls the instant query until it returns data (at least one series or sample);
    /// the result.
    async fn data(&self, http: &Http, what: &str, query: &str, deadline: Instant) -> Value {
        loop {
            let data = self
                .api(http, &format!("query?query={}", percent_encode(query)))
                .await;
            let result = &data["result"];
            if result.as_array().is_some_and(|r| !r.is_empty()) {
                return result.clone();
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
                panic!(
                    "{what}: no data from Prometheus for\n  {query}\n(log, latest first:)\n{tail}"
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// `lhs OP number` (Prometheus's formatting of a rule: spaces around the operator) into
/// `lhs`.
fn without_comparison(expr: &str) -> &str {
    let mut parts = expr.rsplitn(3, ' ');
    let (number, op, lhs) = (parts.next(), parts.next(), parts.next());
    match (number.map(str::parse::<f64>), op, lhs) {
        (Some(Ok(_)), Some(">" | "<" | ">=" | "<=" | "==" | "!="), Some(lhs)) => lhs,
        _ => panic!("an alert's expression is not `<expression> <comparison> <number>`: {expr}"),
    }
}

/// Sends requests to `path` with header `x-client` (the clients in turn), one every
/// `every`, until aborted.
fn traffic(http: &Http, base: &str, path: &'static str, clients: &[&str], every: Duration) {
    let http = http.clone();
    let url = format!("{base}{path}");
    let clients: Vec<String> = clients.iter().map(|c| (*c).to_owned()).collect();
    tokio::spawn(async move {
        for client in clients.iter().cycle() {
            let _ = get(&http, &url, &[("x-client", client)]).await;
            tokio::time::sleep(every).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_and_alert_returns_data_from_a_real_prometheus() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let http: Http = Client::builder(TokioExecutor::new()).build_http();

    // The server, with a Redis store where nothing listens.
    let dead_redis = format!("redis://127.0.0.1:{}/", free_port());
    let mut server = Command::new(env!("CARGO_BIN_EXE_metrics_server"));
    server
        .arg(&dead_redis)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut server = Spawned::new(server);
    let mut stdout = server.child.stdout.take().expect("stdout");
    let port: u16 = tokio::task::spawn_blocking(move || {
        let mut line = Vec::new();
        let mut byte = [0u8];
        while stdout.read(&mut byte).expect("read the server's port") == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let line = String::from_utf8(line).expect("utf-8");
        line.strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the server printed {line:?}, not its port"))
    })
    .await
    .expect("the server's port");
    let base = format!("http://127.0.0.1:{port}");

    // A valid reload, then a refused one: the rules are left unhealthy.
    assert_eq!(
        get(&http, &format!("{base}/admin/reload?ok"), &[])
            .await
            .unwrap()
            .0,
        200
    );
    assert_eq!(
        get(&http, &format!("{base}/admin/reload?bad"), &[])
            .await
            .unwrap()
            .0,
        422
    );

    // Traffic until the end of the test (the tasks end with the runtime).
    let ms = Duration::from_millis;
    traffic(&http, &base, "/api", &["busy"], ms(20)); // 5/s allowed: mostly refused
    traffic(&http, &base, "/api", &["calm-1", "calm-2"], ms(300)); // shadow-tight: some
    let users: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    traffic(&http, &base, "/login", &users, ms(30)); // refusals, bans, audit records
    traffic(&http, &base, "/slow", &["a"], ms(5)); // delay mode: waits
    traffic(&http, &base, "/slow", &["b"], ms(5));
    traffic(&http, &base, "/tokens", &["a"], ms(50)); // settles
    traffic(&http, &base, "/download", &["a"], ms(50)); // stream units: passed, refused
    traffic(&http, &base, "/remote", &["a", "b"], ms(20)); // store errors, breaker

    let prom = Prometheus::start(&prometheus, &http, port).await;
    let deadline = Instant::now() + DEADLINE;

    // The scrape is up.
    prom.data(
        &http,
        "the target",
        &format!("up{{job=\"{JOB}\"}} == 1"),
        deadline,
    )
    .await;

    // Every panel's and variable's query.
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard's JSON");
    let queries: Vec<(String, String)> = panel_queries(&dashboard)
        .into_iter()
        .chain(variable_queries(&dashboard))
        .collect();
    assert!(queries.len() >= 20, "{queries:?}");
    for (what, query) in &queries {
        prom.data(
            &http,
            &format!("panel {what:?}"),
            &substitute(query),
            deadline,
        )
        .await;
    }

    // Every rule, loaded and evaluated without an error.
    let in_file = read(ALERTS).matches("- alert: ").count();
    let rules = loop {
        let groups = prom.api(&http, "rules?type=alert").await["groups"].clone();
        let rules: Vec<Value> = groups
            .as_array()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        for rule in &rules {
            assert_ne!(rule["health"], "err", "rule failed: {rule}");
        }
        if rules.len() == in_file && rules.iter().all(|r| r["health"] == "ok") {
            break rules;
        }
        assert!(
            Instant::now() < deadline,
            "{in_file} rules in {ALERTS}, loaded and evaluated: {rules:?}"
        );
        tokio::time::sleep(ms(500)).await;
    };

    // Every alert's expression, without its comparison: it returns data whether or not
    // the alert fires, so a misspelt metric or label cannot hide behind a quiet alert.
    for rule in &rules {
        let name = rule["name"].as_str().expect("name");
        let expr = rule["query"].as_str().expect("query");
        assert!(
            rule["duration"].as_f64().is_some_and(|d| d > 0.0),
            "{name}: no `for:`"
        );
        assert!(
            rule["labels"]["severity"].is_string(),
            "{name}: no severity"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation].is_string(),
                "{name}: no {annotation}"
            );
        }
        prom.data(
            &http,
            &format!("alert {name}"),
            without_comparison(expr),
            deadline,
        )
        .await;
    }

    // The alerts whose thresholds this traffic crosses: their whole expression holds.
    loop {
        let alerts = prom.api(&http, "alerts").await["alerts"].clone();
        let active: Vec<&str> = alerts
            .as_array()
            .expect("alerts")
            .iter()
            .filter(|a| a["state"] == "pending" || a["state"] == "firing")
            .filter_map(|a| a["labels"]["alertname"].as_str())
            .collect();
        let missing: Vec<&str> = CROSSED
            .iter()
            .copied()
            .filter(|a| !active.contains(a))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alerts not pending or firing: {missing:?}; active: {active:?}"
        );
        tokio::time::sleep(ms(500)).await;
    }
    drop(prom);
    drop(server);
    let _ = std::io::stderr().flush();
}
