//! Feature `rules`: `rules::Simulation` and `tollgate-rules simulate`: refusals of a small
//! log computed by hand, the same decisions as the layer on the same requests and clock,
//! malformed input counted with line numbers, the JSON output's shape.
#![cfg(feature = "rules")]

use std::collections::BTreeMap;
use std::io::{BufRead, Read};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::clock::FakeClock;
use tollgate::key::PeerAddr;
use tollgate::rules::{CombinedFields, Document, JsonFields, LogFormat, Report, Simulation};
use tollgate::store::MemoryStore;
use tower::{Layer, ServiceExt, service_fn};

/// A combined-format line at `secs` seconds after 2026-11-26 10:00:00 UTC.
fn line(ip: &str, secs: u32, method: &str, path: &str, status: u16) -> String {
    format!(
        "{ip} - - [26/Nov/2026:10:{:02}:{:02} +0000] \"{method} {path} HTTP/1.1\" {status} 12 \"-\" \"test\"\n",
        secs / 60,
        secs % 60
    )
}

fn run(rules: &str, log: &str) -> Report {
    let doc = Document::from_toml(rules).unwrap();
    Simulation::new(LogFormat::Combined)
        .run(&doc, log.as_bytes())
        .unwrap()
}

const RULES: &str = r#"
[[limits]]
name = "per-ip"
key = "peer_ip"
quota = "3/min"

[[limits]]
name = "login"
key = "peer_ip"
quota = "1/min"
routes = ["POST /login"]
"#;

/// GCRA by hand. per-ip, 3/min (one token every 20 s, a burst of 3): A's requests at 0, 1
/// and 2 s fill the bucket (its theoretical arrival time reaches 60 s); at 3 s the next
/// would end at 80 s, 77 s ahead, more than the 60 s the burst allows: refused (a refusal
/// takes nothing); at 25 s 80 - 25 = 55: allowed; at 26 s 100 - 26 = 74: refused.
/// login, 1/min on POST /login: C at 0 s (allowed), 30 s (120 - 30 = 90 > 60: refused),
/// 61 s (121 - 61 = 60: allowed). B's two requests and C's three stay under per-ip.
#[test]
fn refusals_of_a_small_log_by_hand() {
    let mut log = String::new();
    for (ip, t, method, path) in [
        ("192.0.2.1", 0, "GET", "/"),
        ("192.0.2.3", 0, "POST", "/login"),
        ("192.0.2.1", 1, "GET", "/a"),
        ("192.0.2.2", 1, "GET", "/"),
        ("192.0.2.1", 2, "GET", "/b"),
        ("192.0.2.1", 3, "GET", "/"),
        ("192.0.2.2", 20, "GET", "/"),
        ("192.0.2.1", 25, "GET", "/"),
        ("192.0.2.1", 26, "GET", "/"),
        ("192.0.2.3", 30, "POST", "/login"),
        ("192.0.2.3", 61, "POST", "/login"),
    ] {
        log.push_str(&line(ip, t, method, path, 200));
    }
    let report = run(RULES, &log);
    assert_eq!(
        (report.lines, report.bad_lines, report.late_lines),
        (11, 0, 0)
    );
    assert_eq!((report.requests, report.refused), (11, 3));
    let per_ip = &report.limits[0];
    assert_eq!(per_ip.name, "per-ip");
    assert_eq!(
        (per_ip.requests, per_ip.refused, per_ip.keys_refused),
        (11, 2, 1)
    );
    assert_eq!(per_ip.top_refused, vec![("@192.0.2.1".to_owned(), 2)]);
    let start = 1_795_687_200; // 2026-11-26T10:00:00Z
    assert_eq!(per_ip.per_minute, vec![(start, 2)]);
    let login = &report.limits[1];
    assert_eq!(
        (login.requests, login.refused, login.keys_refused),
        (3, 1, 1)
    );
    assert_eq!(login.top_refused, vec![("@192.0.2.3".to_owned(), 1)]);
    assert_eq!(login.per_minute, vec![(start, 1)]);
}

/// A limit of bytes on a route paces the route's response bodies (or request bodies, or
/// both) live and refuses no request; the rehearsal agrees: the same refusals with it as
/// without it, none of them its own. (When the replayed requests' body type could not be
/// paced, a limit of bytes received answered each request of its route 500 in the
/// rehearsal: none of the route's refusals counted.)
#[test]
fn a_routed_limit_of_bytes_refuses_no_request_in_the_rehearsal() {
    let mut log = String::new();
    for t in 0..10 {
        log.push_str(&line("192.0.2.1", t * 7, "GET", "/files/big.iso", 200));
        log.push_str(&line("192.0.2.2", t * 7, "GET", "/files/small.txt", 200));
    }
    let without = run(RULES, &log);
    assert!(without.refused > 0, "per-ip refuses some: {without}");
    for direction in ["out", "in", "both"] {
        let paced = format!(
            "{RULES}\n[[limits]]\nname = \"download\"\nkey = \"peer_ip\"\nper = \"byte\"\n\
             quota = \"1KiB/s; burst=1KiB\"\ndirection = \"{direction}\"\n\
             routes = [\"GET /files/{{*path}}\"]\n"
        );
        let with = run(&paced, &log);
        assert_eq!(with.requests, 20);
        assert_eq!(with.refused, without.refused, "{direction}");
        let download = with.limits.iter().find(|l| l.name == "download").unwrap();
        assert_eq!(download.refused, 0, "{direction}");
    }
}

/// A line earlier than the one before it is replayed at the latest time: A's third
/// request, logged at 0 s after one at 30 s, is replayed at 30 s.
#[test]
fn late_lines_replay_at_the_latest_time() {
    let rules = "[[limits]]\nname = \"l\"\nkey = \"peer_ip\"\nquota = \"1/min\"\n";
    let log = [
        line("192.0.2.1", 0, "GET", "/", 200),
        line("192.0.2.1", 59, "GET", "/", 200),
        line("192.0.2.1", 0, "GET", "/", 200),
        line("192.0.2.1", 61, "GET", "/", 200),
    ]
    .concat();
    let report = run(rules, &log);
    assert_eq!(report.late_lines, 1);
    // 0 s allowed, 59 s refused, the late line at 59 s refused, 61 s allowed.
    assert_eq!(report.limits[0].refused, 2);
}

/// A deterministic pseudo-random log: `n` lines, five clients, one of them flooding,
/// some logins; times nondecreasing, in milliseconds.
/// A logged request: client, milliseconds from the first, method, path.
type Logged = (IpAddr, u64, &'static str, &'static str);

fn generated(n: usize) -> Vec<Logged> {
    let clients: Vec<IpAddr> = [
        "192.0.2.1",
        "192.0.2.2",
        "2001:db8::7",
        "198.51.100.9",
        "203.0.113.5",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut t = 0;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += x % 100;
            // The last client sends half the lines.
            let c = if x.is_multiple_of(2) {
                4
            } else {
                ((x >> 8) % 4) as usize
            };
            let (method, path) = if (x >> 16).is_multiple_of(7) {
                ("POST", "/login")
            } else {
                ("GET", "/items")
            };
            (clients[c], t, method, path)
        })
        .collect()
}

const SAME_RULES: &str = r#"
[[limits]]
name = "per-ip"
key = "peer_ip"
quota = "5/s; burst=8"

[[limits]]
name = "login"
key = "peer_ip"
quota = "10/min"
routes = ["POST /login"]
"#;

/// The refused requests of `requests` through `doc`'s layer (`Document::layer` and a
/// `tower` service), by client, on a fake clock set as the simulation sets its own: one
/// day from its origin at the first request.
fn through_the_layer(doc: &Document, requests: &[Logged]) -> BTreeMap<String, u64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let clock = FakeClock::new();
    let layer = doc.layer(MemoryStore::with_clock(clock.clone())).unwrap();
    let service = layer.layer(service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Full::<Bytes>::default()))
    }));
    let mut refused: BTreeMap<String, u64> = BTreeMap::new();
    runtime.block_on(async {
        for &(ip, ms, method, path) in requests {
            clock.set(Duration::from_secs(86_400) + Duration::from_millis(ms));
            let mut req = Request::builder()
                .method(method)
                .uri(path)
                .body(Full::default())
                .unwrap();
            req.extensions_mut()
                .insert(PeerAddr(SocketAddr::new(ip, 0)));
            let response = service.clone().oneshot(req).await.unwrap();
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                // The key as reports write it: `peer_ip` keys IPv6 clients by their /56.
                let key = match ip {
                    IpAddr::V4(v4) => format!("@{v4}"),
                    IpAddr::V6(v6) => {
                        let mut s = v6.segments();
                        s[3] &= 0xff00;
                        s[4..].fill(0);
                        format!("@[{}]/56", std::net::Ipv6Addr::from(s))
                    }
                };
                *refused.entry(key).or_default() += 1;
            }
        }
    });
    refused
}

/// The same requests on the same clock through the layer and through the simulation:
/// the same refusals, client by client.
#[test]
fn same_decisions_as_the_layer() {
    let requests = generated(3_000);
    // The requests as JSON lines (Unix seconds with milliseconds: the combined format
    // has whole seconds only).
    let mut log = String::new();
    let t0 = 1_700_000_000_000u64;
    for &(ip, ms, method, path) in &requests {
        log.push_str(&format!(
            "{{\"remote_addr\":\"{ip}\",\"time\":{}.{:03},\"method\":\"{method}\",\"path\":\"{path}\",\"status\":200}}\n",
            (t0 + ms) / 1000,
            (t0 + ms) % 1000
        ));
    }
    let simulate = |doc: &Document| {
        Simulation::new(LogFormat::Json(JsonFields::default()))
            .top(100)
            .run(doc, log.as_bytes())
            .unwrap()
    };

    // Two limits: the refused requests.
    let doc = Document::from_toml(SAME_RULES).unwrap();
    let refused_by_layer: u64 = through_the_layer(&doc, &requests).values().sum();
    assert!(
        refused_by_layer > 100,
        "the flood is refused: {refused_by_layer}"
    );
    let report = simulate(&doc);
    assert_eq!(report.bad_lines, 0);
    assert_eq!(report.refused, refused_by_layer);
    assert!(report.limits.iter().all(|l| l.refused > 0), "{report}");

    // One limit, tight enough to refuse every client now and then: its refused keys are
    // the layer's 429s by client.
    let per_ip = Document::from_toml(
        "[[limits]]\nname = \"per-ip\"\nkey = \"peer_ip\"\nquota = \"2/s; burst=4\"\n",
    )
    .unwrap();
    let by_layer = through_the_layer(&per_ip, &requests);
    let report = simulate(&per_ip);
    let by_simulation: BTreeMap<String, u64> =
        report.limits[0].top_refused.iter().cloned().collect();
    assert!(by_layer.len() >= 2, "{by_layer:?}");
    assert_eq!(by_simulation, by_layer);
}

/// Header keys come from the JSON field map: one API key over four addresses.
#[test]
fn json_lines_with_header_keys() {
    let doc = Document::from_toml(
        "[[limits]]\nname = \"per-key\"\nkey = \"header:x-api-key\"\nquota = \"2/min\"\n",
    )
    .unwrap();
    let mut fields = JsonFields::default();
    fields.set("client=ip").unwrap();
    fields.set("time=ts").unwrap();
    fields.set("path=uri").unwrap();
    fields.header("x-api-key=key").unwrap();
    let log = (0..4)
        .map(|i| {
            format!(
                "{{\"ip\":\"192.0.2.{i}\",\"ts\":\"2026-11-26T10:00:0{i}Z\",\"method\":\"GET\",\"uri\":\"/\",\"status\":200,\"key\":\"k1\"}}\n"
            )
        })
        .collect::<String>();
    let report = Simulation::new(LogFormat::Json(fields))
        .run(&doc, log.as_bytes())
        .unwrap();
    // 2/min: a burst of 2, one token every 30 s; the requests at 2 s and 3 s are refused,
    // whatever their addresses.
    let l = &report.limits[0];
    assert_eq!((l.requests, l.refused, l.keys_refused), (4, 2, 1));
    assert_eq!(l.top_refused.len(), 1);
    assert_eq!(l.top_refused[0].1, 2);
}

/// A reader of `len` bytes of `x` without a newline, generated as read (nothing held).
struct Endless {
    left: u64,
    buf: Vec<u8>,
}

impl Read for Endless {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = out.len().min(self.left as usize);
        out[..n].fill(b'x');
        self.left -= n as u64;
        Ok(n)
    }
}

impl BufRead for Endless {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        let n = self.buf.len().min(self.left as usize);
        Ok(&self.buf[..n])
    }
    fn consume(&mut self, n: usize) {
        self.left -= n as u64;
    }
}

/// Truncated lines, bad dates, binary garbage, an empty line and an over-long line are
/// counted with their numbers; the good lines around them are replayed.
#[test]
fn malformed_lines_are_counted_with_their_numbers() {
    let good = line("192.0.2.1", 0, "GET", "/", 200);
    let mut log: Vec<u8> = Vec::new();
    log.extend_from_slice(good.as_bytes()); // 1
    log.extend_from_slice(&good.as_bytes()[..good.find("HTTP").unwrap()]); // 2: truncated
    log.push(b'\n');
    log.extend_from_slice(good.replace("26/Nov", "31/Nov").as_bytes()); // 3: bad date
    log.extend_from_slice(b"\x00\xff\x13\x37binary\x01\x02\n"); // 4: binary
    log.extend_from_slice(b"\n"); // 5: empty
    log.extend_from_slice(&vec![b'a'; 200_000]); // 6: over-long
    log.push(b'\n');
    log.extend_from_slice(good.replace("192.0.2.1", "999.0.0.1").as_bytes()); // 7
    log.extend_from_slice(good.as_bytes()); // 8
    // 9: no user agent, no newline at the end.
    log.extend_from_slice(&good.as_bytes()[..good.rfind(" \"-\"").unwrap()]);
    let doc = Document::from_toml(RULES).unwrap();
    let report = Simulation::new(LogFormat::Combined)
        .run(&doc, &log[..])
        .unwrap();
    assert_eq!((report.lines, report.bad_lines, report.requests), (9, 6, 3));
    let bad: Vec<(u64, &str)> = report.bad.iter().map(|b| (b.line, b.reason)).collect();
    assert_eq!(
        bad,
        vec![
            (2, "truncated request"),
            (3, "bad time"),
            (4, "not UTF-8"),
            (5, "empty line"),
            (6, "line too long"),
            (7, "bad client address"),
        ]
    );
    // Line 9 lost its user agent, not its status: it is replayed.
    assert_eq!(report.limits[0].requests, 3);
}

/// A 256 MiB line (read as it is generated) is skipped without being held, and the run
/// goes on.
#[test]
fn a_huge_line_is_skipped_unread() {
    let doc = Document::from_toml(RULES).unwrap();
    let huge = Endless {
        left: 256 << 20,
        buf: vec![b'x'; 1 << 16],
    };
    let tail = line("192.0.2.1", 0, "GET", "/", 200);
    let log = huge.chain(std::io::Cursor::new(format!("\n{tail}")));
    let report = Simulation::new(LogFormat::Combined)
        .run(&doc, std::io::BufReader::new(log))
        .unwrap();
    assert_eq!((report.lines, report.bad_lines, report.requests), (2, 1, 1));
    assert_eq!(
        (report.bad[0].line, report.bad[0].reason),
        (1, "line too long")
    );
}

/// Garbage of every byte never panics: random bytes are lines, good or bad, all counted.
#[test]
fn random_bytes_never_panic() {
    let doc = Document::from_toml(RULES).unwrap();
    let mut x: u32 = 7;
    let bytes: Vec<u8> = (0..200_000)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (x >> 16) as u8
        })
        .collect();
    let newlines = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
    for format in [
        LogFormat::Combined,
        appended(),
        LogFormat::Json(JsonFields::default()),
    ] {
        let report = Simulation::new(format).run(&doc, &bytes[..]).unwrap();
        assert!(report.lines >= newlines && report.lines <= newlines + 1);
        assert_eq!(report.bad_lines, report.lines);
    }
}

fn simulate_cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-rules-under-test"))
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

/// `--json` prints the documented shape; the example log and rules refuse the flood.
#[test]
fn cli_json_shape_on_the_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/");
    let rules = format!("{root}simulate.toml");
    let log = format!("{root}access.log");
    let out = simulate_cli(&[&rules, "--log", &log, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lines = std::fs::read_to_string(&log).unwrap().lines().count() as u64;
    assert_eq!(json["lines"], lines);
    assert_eq!(json["bad_lines"], 0);
    let limits = json["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2);
    for l in limits {
        for field in ["name", "requests", "refused", "keys_refused", "top_refused"] {
            assert!(l.get(field).is_some(), "{field} in {l}");
        }
        for top in l["top_refused"].as_array().unwrap() {
            assert!(top["key"].is_string() && top["refused"].is_u64(), "{top}");
        }
    }
    assert_eq!(limits[0]["name"], "per-ip");
    assert_eq!(limits[0]["requests"], lines);
    assert_eq!(limits[0]["top_refused"][0]["key"], "@203.0.113.7");

    // The text report, and the difference with laxer rules.
    let out = simulate_cli(&[&rules, "--log", &log]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("limit per-ip: "), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let lax = dir.path().join("lax.toml");
    std::fs::write(
        &lax,
        "[[limits]]\nname = \"per-ip\"\nkey = \"peer_ip\"\nquota = \"1000/min\"\n",
    )
    .unwrap();
    let out = simulate_cli(&[
        &rules,
        "--log",
        &log,
        "--json",
        "--against",
        lax.to_str().unwrap(),
    ]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let newly: Vec<&str> = json["against"]["newly_refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert!(newly.contains(&"@203.0.113.7"), "{newly:?}");
    assert_eq!(json["against"]["no_longer_refused"], serde_json::json!([]));
}

/// Bad command lines exit 2; bad rules 1 with the located error; a bad log line never.
#[test]
fn cli_errors() {
    assert_eq!(simulate_cli(&[]).status.code(), Some(2));
    assert_eq!(simulate_cli(&["r.toml"]).status.code(), Some(2));
    assert_eq!(
        simulate_cli(&["r.toml", "--log", "x", "--format", "csv"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        simulate_cli(&["r.toml", "--log", "x", "--field", "colour=red"])
            .status
            .code(),
        Some(2)
    );
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[limits]]\nname = \"a\"\nquota = \"5/fortnight\"\n",
    )
    .unwrap();
    let log = dir.path().join("access.log");
    std::fs::write(&log, "garbage\n").unwrap();
    let out = simulate_cli(&[rules.to_str().unwrap(), "--log", log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":3: limits[0].quota"));
    std::fs::write(&rules, "[[limits]]\nname = \"a\"\nquota = \"5/s\"\n").unwrap();
    let out = simulate_cli(&[rules.to_str().unwrap(), "--log", log.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("line 1: truncated"));
}

/// Inside a Tokio runtime a simulation refuses (it blocks) rather than panicking.
#[tokio::test(flavor = "current_thread")]
async fn refuses_inside_a_runtime() {
    let doc = Document::from_toml(RULES).unwrap();
    let err = Simulation::new(LogFormat::Combined)
        .run(&doc, &b""[..])
        .unwrap_err();
    assert!(
        matches!(err, tollgate::rules::SimulateError::InRuntime),
        "{err}"
    );
}

/// `--html` writes the page (whatever the browser: tests/report_browser.rs opens it); an
/// unwritable path is exit status 1. On a pipe nothing but the report is written: no
/// progress bar on standard error.
#[test]
fn cli_html_report() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/");
    let rules = format!("{root}simulate.toml");
    let log = format!("{root}access.log");
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let out = simulate_cli(&[
        &rules,
        "--log",
        &log,
        "--json",
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.ends_with("</html>\n"));
    for limit in json["limits"].as_array().unwrap() {
        let section = format!(
            r#"data-limit="{}" data-requests="{}" data-refused="{}""#,
            limit["name"].as_str().unwrap(),
            limit["requests"],
            limit["refused"]
        );
        assert!(html.contains(&section), "{section}");
    }
    let timeline = &json["timeline"];
    assert!(timeline["requests"].as_array().unwrap().len() <= 60);
    assert_eq!(
        timeline["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum::<u64>(),
        json["requests"].as_u64().unwrap()
    );
    let out = simulate_cli(&[
        &rules,
        "--log",
        &log,
        "--html",
        "/nonexistent/dir/report.html",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/dir/report.html"));
}

/// `tollgate-rules simulate ... | head -1`: a reader that goes away ends the output
/// quietly (exit 0), not in a "Broken pipe" panic.
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (rules, log) = (dir.path().join("rules.toml"), dir.path().join("access.log"));
    std::fs::write(
        &rules,
        "[[limits]]\nname = \"per-ip\"\nkey = \"peer_ip\"\nquota = \"1/min\"\n",
    )
    .unwrap();
    // 20,000 clients refused once each: a report far larger than a pipe's buffer.
    let mut text = Vec::new();
    for i in 0..20_000u32 {
        let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        for s in 0..2 {
            text.write_all(line(&ip, s, "GET", "/", 200).as_bytes())
                .unwrap();
        }
    }
    std::fs::write(&log, text).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-rules-under-test"))
        .args([
            "simulate",
            rules.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
        ])
        .args(["--top", "20000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("40000 lines"), "{first}");
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}

/// `line` with fields appended after the user agent, as an nginx `log_format` that ends
/// `... "$http_user_agent" $request_time "$upstream_http_x_usage"` writes them.
fn line_with(ip: &str, secs: u32, appended: &str) -> String {
    let mut l = line(ip, secs, "POST", "/v1/chat", 200);
    l.pop();
    l.push(' ');
    l.push_str(appended);
    l.push('\n');
    l
}

/// The combined format with the duration first and the usage second after the user agent.
fn appended() -> LogFormat {
    let mut fields = CombinedFields::default();
    fields.set("duration=1").unwrap();
    fields.set("usage=2").unwrap();
    LogFormat::CombinedWith(fields)
}

fn run_as(format: LogFormat, rules: &str, log: &str) -> Report {
    let doc = Document::from_toml(rules).unwrap();
    Simulation::new(format).run(&doc, log.as_bytes()).unwrap()
}

/// A token budget admitted on an estimate of 100 and settled to the logged usage when
/// the response ends (10 ms after each line). 1,000 tokens a minute (one every 60 ms), a
/// burst of 1,000; a line a second. Usage 400 each: 600 left after
/// the first, 216 after the second (17 came back), the third is admitted on its estimate
/// and settles into a debt of 167, the fourth and fifth find the bucket in debt (150,
/// 133): refused. On the estimate alone, five requests take 500: none refused. A line
/// whose usage is `-` keeps its estimate, as live when the application reports nothing.
#[test]
fn settled_costs_follow_the_usage_field() {
    for source in ["header:x-usage", "trailer:x-usage"] {
        let rules = format!(
            "[[limits]]\nname = \"tokens\"\nkey = \"peer_ip\"\nquota = \"1000/min; burst=1000\"\n\
             cost = 100\nsettle = \"{source}\"\n"
        );
        let mut log = String::new();
        for t in 0..5 {
            log.push_str(&line_with("192.0.2.1", t, "0.010 \"400\""));
        }
        let report = run_as(appended(), &rules, &log);
        assert_eq!(report.with_usage, 5, "{source}");
        assert_eq!(
            (report.limits[0].requests, report.limits[0].refused),
            (5, 2),
            "{source}"
        );
        // The same log read without the field: the estimate stands.
        let report = run_as(LogFormat::Combined, &rules, &log);
        assert_eq!((report.with_usage, report.limits[0].refused), (0, 0));
        // Lines without a usage (`-`, or no field at all) keep the estimate.
        let mut log = String::new();
        for _ in 0..5 {
            log.push_str(&line_with("192.0.2.1", 0, "0.010 -"));
        }
        log.push_str(&line("192.0.2.1", 0, "POST", "/v1/chat", 200));
        let report = run_as(appended(), &rules, &log);
        assert_eq!((report.with_usage, report.limits[0].refused), (0, 0));
        // A settle comes at the response's end: five requests in one second, each
        // lasting 10 ms, are all admitted on their estimate before the first settles.
        let mut log = String::new();
        for _ in 0..5 {
            log.push_str(&line_with("192.0.2.1", 0, "0.010 \"400\""));
        }
        let report = run_as(appended(), &rules, &log);
        assert_eq!((report.held, report.limits[0].refused), (5, 0));
    }
    // JSON lines: the usage field by name, a number or a string; without a duration each
    // response ends at once, so in one second the third settles into debt before the
    // fourth comes.
    let mut fields = JsonFields::default();
    fields.set("usage=tokens").unwrap();
    let mut log = String::new();
    for usage in ["400", "\"400\"", "400", "400", "400"] {
        log.push_str(&format!(
            "{{\"remote_addr\":\"192.0.2.1\",\"time\":1795687200,\"method\":\"POST\",\"path\":\"/\",\"status\":200,\"tokens\":{usage}}}\n"
        ));
    }
    let rules = "[[limits]]\nname = \"tokens\"\nkey = \"peer_ip\"\nquota = \"1000/min; burst=1000\"\n\
                 cost = 100\nsettle = \"header:x-usage\"\n";
    let report = run_as(LogFormat::Json(fields), rules, &log);
    assert_eq!((report.with_usage, report.limits[0].refused), (5, 2));
}

const IN_FLIGHT: &str = "[[limits]]\nname = \"streams\"\nkey = \"peer_ip\"\nin_flight = 2\n";

/// Two in flight per client. At 0 s and 1 s two requests of 5 s begin (ending at 5 s and
/// 6 s): the one at 2 s is refused. At 5 s the first has ended: one more is admitted
/// (ending at 6 s), and the next at 5 s is refused. At 6 s all have ended. Another
/// client is never refused. Without the duration every request ends at once: none
/// refused.
#[test]
fn in_flight_limits_hold_each_response_for_its_duration() {
    let mut log = String::new();
    for (ip, t, duration) in [
        ("192.0.2.1", 0, "5.000"),
        ("192.0.2.1", 1, "5.000"),
        ("192.0.2.2", 1, "5.000"),
        ("192.0.2.1", 2, "1.000"),
        ("192.0.2.2", 2, "0.250"),
        ("192.0.2.1", 5, "1.000"),
        ("192.0.2.1", 5, "1.000"),
        ("192.0.2.1", 6, "0.100"),
        ("192.0.2.1", 6, "0.100"),
    ] {
        log.push_str(&line_with(ip, t, &format!("{duration} \"-\"")));
    }
    let report = run_as(appended(), IN_FLIGHT, &log);
    let streams = &report.limits[0];
    assert_eq!((streams.requests, streams.refused), (9, 2));
    assert_eq!(streams.top_refused, [("@192.0.2.1".to_owned(), 2)]);
    assert_eq!(
        (report.held, report.most_held, report.released_early),
        (7, 4, 0)
    );
    assert!(
        report
            .to_string()
            .contains("7 responses held for their duration, at most 4 at once\n")
    );
    assert_eq!(report.to_json()["most_held"], 4);
    assert!(
        report
            .to_html(None, "streams")
            .contains(r#"data-held="7" data-most-held="4" data-released-early="0""#)
    );
    assert_eq!(
        run_as(LogFormat::Combined, IN_FLIGHT, &log).limits[0].refused,
        0
    );

    // Held at most one at a time: each hold past the first lets the one held go early
    // (but at 5 s and 6 s, where it had ended): A is never refused.
    let doc = Document::from_toml(IN_FLIGHT).unwrap();
    let capped = Simulation::new(appended())
        .max_held(1)
        .run(&doc, log.as_bytes())
        .unwrap();
    assert_eq!(capped.limits[0].refused, 0);
    assert_eq!((capped.most_held, capped.released_early), (1, 6));
    assert!(capped.to_string().contains("; 6 let go early"));

    // JSON lines: the duration by name, seconds as a number or a string.
    let mut fields = JsonFields::default();
    fields.set("duration=request_time").unwrap();
    let mut log = String::new();
    for (t, d) in [(0, "5"), (1, "\"5.0\""), (2, "1")] {
        log.push_str(&format!(
            "{{\"remote_addr\":\"192.0.2.1\",\"time\":{},\"method\":\"GET\",\"path\":\"/\",\"status\":200,\"request_time\":{d}}}\n",
            1_795_687_200 + t
        ));
    }
    let report = run_as(LogFormat::Json(fields), IN_FLIGHT, &log);
    assert_eq!(report.limits[0].refused, 1);
}

/// One request a minute, and 2 refusals within a minute ban for 10 s, doubled for a
/// repeat within an hour. A at 0 s is admitted; at 1 s and 2 s refused, which bans it
/// until 12 s (level 0); at 3 s and 4 s refused by the ban. At 13 s its bucket (full
/// until 60 s) refuses it again, at 14 s too: a repeat, level 1, 20 s; at 15 s refused
/// by the ban. The report says so in text, JSON and HTML.
#[test]
fn bans_are_reported_apart_with_their_levels() {
    let rules = "[[limits]]\nname = \"login\"\nkey = \"peer_ip\"\nquota = \"1/min\"\n\
                 ban = { after = 2, within = \"1m\", for = \"10s\", escalate = 2, max = \"1h\", forget = \"1h\" }\n";
    let mut log = String::new();
    for t in [0, 1, 2, 3, 4, 13, 14, 15] {
        log.push_str(&line("192.0.2.9", t, "POST", "/login", 200));
    }
    let report = run(rules, &log);
    let login = &report.limits[0];
    assert_eq!((login.requests, login.refused), (8, 7));
    assert_eq!((login.banned_refused, login.bans), (3, 2));
    assert_eq!(login.bans_by_level, [1, 1]);

    let text = report.to_string();
    assert!(
        text.contains("3 refused by a ban; 2 bans began: 1 first, 1 at level 1"),
        "{text}"
    );
    let json = report.to_json();
    let l = &json["limits"][0];
    assert_eq!(
        (&l["banned_refused"], &l["bans"], &l["bans_by_level"]),
        (
            &serde_json::json!(3),
            &serde_json::json!(2),
            &serde_json::json!([1, 1])
        )
    );
    let html = report.to_html(None, "bans");
    assert!(
        html.contains(r#"data-banned-refused="3" data-bans="2" data-bans-by-level="1,1""#),
        "{html}"
    );
    assert!(html.contains("3 refused by a ban; 2 bans began: 1 first, 1 at level 1."));

    // A limit without bans says nothing of them.
    let quiet = run(RULES, &log);
    assert_eq!(
        (quiet.limits[0].bans, quiet.limits[0].banned_refused),
        (0, 0)
    );
    assert!(quiet.limits[0].bans_by_level.is_empty());
    assert!(!quiet.to_string().contains("by a ban"));
}

/// The CLI reads the usage and the duration by position in the combined format, or by
/// name in JSON lines; a position that is not one is a bad command line.
#[test]
fn cli_reads_usage_and_duration_fields() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(&rules, IN_FLIGHT).unwrap();
    let log = dir.path().join("access.log");
    let mut text = String::new();
    for t in [0, 0, 0] {
        text.push_str(&line_with("192.0.2.1", t, "1.5 \"7\""));
    }
    std::fs::write(&log, text).unwrap();
    let (rules, log) = (rules.to_str().unwrap(), log.to_str().unwrap());
    let out = simulate_cli(&[
        rules,
        "--log",
        log,
        "--json",
        "--field",
        "duration=1",
        "--field",
        "usage=2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["bad_lines"], 0);
    assert_eq!(json["with_usage"], 3);
    assert_eq!(json["held"], 2);
    assert_eq!(json["limits"][0]["refused"], 1);
    let out = simulate_cli(&[rules, "--log", log, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&json["held"], &json["limits"][0]["refused"]),
        (&0.into(), &0.into())
    );
    for bad in ["duration=0", "usage=99", "speed=1"] {
        let out = simulate_cli(&[rules, "--log", log, "--format", "combined", "--field", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
    let help = simulate_cli(&["--help"]);
    let help = String::from_utf8(help.stdout).unwrap() + &String::from_utf8(help.stderr).unwrap();
    assert!(help.contains("--field duration=FIELD") && help.contains("--max-held"));
}
