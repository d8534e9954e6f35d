//! Throughput of `tollgate-rules simulate`: lines replayed per second on one core.
//!
//! Generates an nginx/Apache combined-format log in memory (1,000,000 lines by default,
//! 100,000 clients, one line every millisecond of log time, a fifth of them `POST /login`,
//! the rest spread over 50 paths) and replays it through three limits (per client, logins
//! per client, and one global limit) with [`Simulation`], the code `tollgate-rules
//! simulate` runs. Prints lines, seconds and lines per second; the log is built before the
//! clock starts, so only the replay (parsing included) is timed.
//!
//! Built as `tollgate-rules` is installed (`--profile dist`: one codegen unit, fat LTO):
//!
//!   cargo run -p tollgate-bench --profile dist --features rules --bin simulate_bench -- [LINES] [CLIENTS]

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use tollgate::rules::{Document, LogFormat, Simulation};

const RULES: &str = r#"
[[limits]]
name = "per-ip"
key = "peer_ip"
quota = "60/min; burst=20"

[[limits]]
name = "login"
key = "peer_ip"
quota = "3/min"
routes = ["POST /login"]

[[limits]]
name = "global"
quota = "500/s; burst=1000"
"#;

/// A combined-format log of `lines` lines from `clients` clients.
fn log(lines: usize, clients: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(lines * 120);
    // A small linear congruential generator: the same log on every run.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let start = 1_795_687_200i64; // 2026-11-26T00:00:00Z
    for i in 0..lines {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let client = ((x >> 33) as u32) % clients;
        let secs = start + (i / 1000) as i64;
        let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
        let (method, path) = if (x >> 20).is_multiple_of(5) {
            ("POST", "/login".to_owned())
        } else {
            ("GET", format!("/items/{}", (x >> 40) % 50))
        };
        let status = if (x >> 12).is_multiple_of(10) {
            404
        } else {
            200
        };
        writeln!(
            out,
            "10.{}.{}.{} - - [26/Nov/2026:{h:02}:{m:02}:{s:02} +0000] \"{method} {path} HTTP/1.1\" {status} {} \"-\" \"Mozilla/5.0 (X11; Linux x86_64) Firefox/132.0\"",
            client >> 16,
            (client >> 8) & 255,
            client & 255,
            (x >> 50) % 5000,
        )
        .expect("writing to a Vec");
    }
    out
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let parse = |a: Option<String>, default: usize| match a {
        None => Some(default),
        Some(a) => a.parse().ok(),
    };
    let (Some(lines), Some(clients)) = (parse(args.next(), 1_000_000), parse(args.next(), 100_000))
    else {
        eprintln!("usage: simulate_bench [LINES] [CLIENTS]");
        return ExitCode::from(2);
    };
    let doc = Document::from_toml(RULES).expect("the rules are valid");
    let text = log(lines, clients.clamp(1, u32::MAX as usize) as u32);
    let started = Instant::now();
    let report = match Simulation::new(LogFormat::Combined).run(&doc, &text[..]) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(report.lines, lines as u64, "every line is counted");
    assert_eq!(report.bad_lines, 0, "the generated log has no bad line");
    let refused: u64 = report.limits.iter().map(|l| l.refused).sum();
    println!(
        "{lines} lines, {clients} clients, {} limits: {secs:.3} s, {:.0} lines/s ({refused} refusals)",
        report.limits.len(),
        lines as f64 / secs
    );
    ExitCode::SUCCESS
}
