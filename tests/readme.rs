//! The README's and the guide's non-Rust blocks: every rules document (TOML with
//! `[[limits]]`) of `README.md` and of every chapter in `guide/` compiles into a layer as
//! `tollgate-rules check` would, every TOML block parses, and the JSON refusal body the
//! README shows is the one the quickstart's limits answer. (Their Rust blocks are doctests:
//! `ReadmeDoctests` in `src/lib.rs`, and the chapters' modules in `src/guide.rs`, which
//! every `guide/*.md` must have: checked here too.)
#![cfg(all(feature = "rules", feature = "axum"))]

mod support;

use std::path::Path;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::{body_json, get as req, send};
use tollgate::clock::FakeClock;
use tollgate::rules::Document;
use tollgate::store::MemoryStore;
use tollgate::{Limit, Quota, RateLimitLayer, key::PeerIp};

const README: &str = include_str!("../README.md");

/// The README's length at most: it is the front door, the rest is in the guide.
const README_MAX_LINES: usize = 300;

/// The README and every chapter of the guide (`guide/*.md`, read when the test runs, so a
/// new chapter is checked without a line here): (path from the repository root, text).
fn pages() -> Vec<(String, String)> {
    let mut out = vec![("README.md".to_owned(), README.to_owned())];
    out.extend(chapters());
    out
}

/// Every `guide/*.md`, sorted by name.
fn chapters() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guide");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .map(|path| {
            let name = format!("guide/{}", path.file_name().unwrap().to_string_lossy());
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, text)
        })
        .collect();
    out.sort();
    out
}

/// The fenced blocks of `text` whose info string is `lang` or starts with `lang,`, with
/// the line each starts on and its info string.
fn fenced(text: &str, lang: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut current {
            None if line.starts_with("```") => {
                let info = line.trim_start_matches('`').trim_end().to_owned();
                // Any other fence is followed too, so that its lines are not read as fences.
                current = Some((i + 1, info, String::new()));
            }
            Some(_) if line.starts_with("```") => {
                let (start, info, body) = current.take().unwrap();
                if info == lang || info.starts_with(&format!("{lang},")) {
                    out.push((start, info, body));
                }
            }
            Some((_, _, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "an unclosed ``` block");
    out
}

/// The blocks fenced as ```` ```lang ```` in every page: (page, line, text).
fn blocks(lang: &str) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    for (page, text) in pages() {
        for (line, _, body) in fenced(&text, lang) {
            out.push((page.clone(), line, body));
        }
    }
    out
}

#[test]
fn every_rules_document_of_the_readme_and_the_guide_compiles() {
    let documents: Vec<_> = blocks("toml")
        .into_iter()
        .filter(|(_, _, text)| text.contains("[[limits]]"))
        .collect();
    assert!(
        documents.len() >= 5,
        "the README and the guide show their rules documents: {documents:?}"
    );
    for (page, line, text) in documents {
        let doc = Document::from_toml(&text)
            .unwrap_or_else(|e| panic!("{page} line {line}: the rules document is refused: {e}"));
        doc.layer(MemoryStore::new())
            .unwrap_or_else(|e| panic!("{page} line {line}: the rules do not build: {e}"));
    }
}

#[test]
fn every_toml_block_of_the_readme_and_the_guide_parses() {
    for (page, line, text) in blocks("toml") {
        if let Err(e) = text.parse::<toml::Table>() {
            panic!("{page} line {line}: not TOML: {e}");
        }
    }
}

/// Every Rust block is a doctest that compiles: none is `ignore`d, and every chapter is
/// a module of `src/guide.rs` (`chapter!(name)` or `chapter!(name if ...)`), whose docs
/// the doctests read.
#[test]
fn every_rust_block_of_the_readme_and_the_guide_is_compiled() {
    let mut rust = 0;
    for (page, text) in pages() {
        for (line, info, _) in fenced(&text, "rust") {
            assert!(
                !info.contains("ignore"),
                "{page} line {line}: ```{info} is not compiled: use no_run, or fix it"
            );
            rust += 1;
        }
    }
    assert!(
        rust >= 21,
        "the README and the guide show {rust} Rust blocks"
    );

    let wiring = include_str!("../src/guide.rs");
    let chapters = chapters();
    assert!(!chapters.is_empty(), "guide/ has no chapter");
    for (page, _) in &chapters {
        let name = page.trim_start_matches("guide/").trim_end_matches(".md");
        let line = wiring.lines().find(|l| {
            l.starts_with(&format!("chapter!({name})"))
                || l.starts_with(&format!("chapter!({name} if "))
        });
        assert!(
            line.is_some(),
            "{page} is not a module of the guide: add `chapter!({name});` to src/guide.rs \
             (ARCHITECTURE.md, \"The guide\")"
        );
    }
    // And each module names a chapter that exists (include_str! would fail the build, but
    // only where the guide is compiled: cargo doc and the doctests).
    for line in wiring.lines().filter(|l| l.starts_with("chapter!(")) {
        let name: String = line["chapter!(".len()..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        assert!(
            chapters
                .iter()
                .any(|(page, _)| *page == format!("guide/{name}.md")),
            "src/guide.rs: `{line}` names no guide/{name}.md"
        );
    }
}

#[test]
fn the_readme_is_a_front_door() {
    let lines = README.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move sections into a guide chapter"
    );
}

#[tokio::test]
async fn the_refusal_body_of_the_readme_is_what_the_quickstart_answers() {
    let json = fenced(README, "json");
    assert_eq!(json.len(), 1, "one JSON block (the 429 body) is expected");
    let (line, _, text) = &json[0];
    let shown: serde_json::Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("README.md line {line}: not JSON: {e}"));

    // The README's limits, on a clock that does not move: ten pass, the eleventh is refused.
    let app = quickstart(&FakeClock::at(Duration::from_secs(1_000)));
    for _ in 0..10 {
        assert_eq!(
            send(&app, req("/", "192.0.2.1")).await.status(),
            StatusCode::OK
        );
    }
    let refused = send(&app, req("/", "192.0.2.1")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body_json(refused).await, shown, "README.md line {line}");
}

/// The `per-ip` limit of the quickstart, as the README, the crate's docs and
/// `examples/quickstart/` write it: the same line in all three (read here, not copied).
fn quickstart_per_ip() -> Quota {
    let example = include_str!("../examples/quickstart/examples/quickstart.rs");
    let crate_docs = include_str!("../src/lib.rs");
    let line = |text: &str, page: &str| -> String {
        let found: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(r#"Limit::new("per-ip", "#))
            .collect();
        assert_eq!(found.len(), 1, "{page}: one `per-ip` limit: {found:?}");
        let at = found[0].find("Quota::").unwrap();
        let end = found[0][at..].find(").key(").unwrap();
        found[0][at..at + end + 1].to_owned()
    };
    let shown = line(README, "README.md");
    assert_eq!(
        line(example, "quickstart.rs"),
        shown,
        "the quickstart runs what the README shows"
    );
    assert_eq!(
        line(crate_docs, "src/lib.rs"),
        shown,
        "the crate's docs show the README's"
    );
    parse_quota(&shown)
}

/// `Quota::per_second(5).burst(10)`, `Quota::per_minute(10)`, ... as a `Quota`.
fn parse_quota(code: &str) -> Quota {
    let number = |s: &str| -> u64 {
        s.trim_end_matches(')')
            .replace('_', "")
            .parse()
            .unwrap_or_else(|e| panic!("{code}: {e}"))
    };
    let mut calls = code.trim_start_matches("Quota::").split(").");
    let first = calls.next().unwrap();
    let (unit, rate) = first.split_once('(').unwrap();
    let rate = number(rate);
    let mut quota = match unit {
        "per_second" => Quota::per_second(rate),
        "per_minute" => Quota::per_minute(rate),
        "per_hour" => Quota::per_hour(rate),
        other => panic!("{code}: {other} is not read here"),
    };
    for call in calls {
        let burst = call
            .strip_prefix("burst(")
            .unwrap_or_else(|| panic!("{code}: {call}"));
        quota = quota.burst(number(burst));
    }
    quota
}

/// The quickstart's two limits on `clock`, on its route.
fn quickstart(clock: &FakeClock) -> Router {
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(clock.clone()))
        .limit(Limit::new("per-ip", quickstart_per_ip()).key(PeerIp::new()))
        .limit(Limit::new("global", Quota::per_second(100).burst(200)))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route_layer(layer)
}

/// Issue 45: the README promised ten `200`s then `429`s for `for i in $(seq 12); do curl
/// ...; done`, and a user got eleven: at 5/s a token came back every 200 ms, and a loop of
/// 12 curls takes longer than that. The quickstart's `per-ip` (read from the README) gives
/// back one request every 6 s: any loop of 12 requests over less than 6 s, however its
/// requests are spread (here: all at once, one every 100 ms, one every 500 ms, and 5.9 s
/// between the first and the last), gets exactly ten `200`s, then two `429`s; the
/// README's figure (6 s) is the one the quota gives: a twelfth request 6 s after the first
/// passes.
#[tokio::test]
async fn a_loop_of_12_requests_shows_exactly_ten_200s_then_429s() {
    assert_eq!(
        quickstart_per_ip().burst_size(),
        10,
        "the README promises ten 200s"
    );
    let shown = Duration::from_secs(6);
    let mut spreads: Vec<Vec<Duration>> = [0, 100, 500]
        .into_iter()
        .map(|ms| vec![Duration::from_millis(ms); 11])
        .collect();
    // Ten at once, then the 11th and the 12th 5.9 s after the first.
    let mut late = vec![Duration::ZERO; 11];
    late[9] = shown - Duration::from_millis(100);
    spreads.push(late);
    for gaps in spreads {
        let clock = FakeClock::at(Duration::from_secs(1_000));
        let app = quickstart(&clock);
        let mut codes = vec![send(&app, req("/", "192.0.2.1")).await.status().as_u16()];
        for gap in &gaps {
            clock.advance(*gap);
            codes.push(send(&app, req("/", "192.0.2.1")).await.status().as_u16());
        }
        let mut expected = vec![200; 10];
        expected.extend([429, 429]);
        assert_eq!(codes, expected, "gaps {gaps:?}");
    }
    // The figure is exact: 6 s after the first request of a full bucket, one more passes.
    assert!(
        README.contains("gives back one request every 6 s"),
        "the README says how fast a token comes back"
    );
    let clock = FakeClock::at(Duration::from_secs(1_000));
    let app = quickstart(&clock);
    for _ in 0..10 {
        assert_eq!(
            send(&app, req("/", "192.0.2.1")).await.status(),
            StatusCode::OK
        );
    }
    clock.advance(shown - Duration::from_nanos(1));
    assert_eq!(
        send(&app, req("/", "192.0.2.1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_nanos(1));
    assert_eq!(
        send(&app, req("/", "192.0.2.1")).await.status(),
        StatusCode::OK
    );
}
