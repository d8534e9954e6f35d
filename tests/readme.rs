//! The README's non-Rust blocks: every rules document (TOML with `[[limits]]`) compiles
//! into a layer as `tollgate-rules check` would, every TOML block parses, and the JSON
//! refusal body it shows is the one the quickstart's limits answer. (Its Rust blocks are
//! doctests: `ReadmeDoctests` in `src/lib.rs`.)
#![cfg(all(feature = "rules", feature = "axum"))]

mod support;

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

/// The blocks fenced as ```` ```lang ````, with the line each starts on.
fn blocks(lang: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in README.lines().enumerate() {
        match &mut current {
            None if line.trim_end() == format!("```{lang}") => {
                current = Some((i + 1, String::new()))
            }
            Some(_) if line.starts_with("```") => out.push(current.take().unwrap()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "an unclosed ```{lang} block");
    out
}

#[test]
fn every_rules_document_of_the_readme_compiles() {
    let documents: Vec<_> = blocks("toml")
        .into_iter()
        .filter(|(_, text)| text.contains("[[limits]]"))
        .collect();
    assert!(!documents.is_empty(), "the README shows no rules document");
    for (line, text) in documents {
        let doc = Document::from_toml(&text).unwrap_or_else(|e| {
            panic!("README.md line {line}: the rules document is refused: {e}")
        });
        doc.layer(MemoryStore::new())
            .unwrap_or_else(|e| panic!("README.md line {line}: the rules do not build: {e}"));
    }
}

#[test]
fn every_toml_block_of_the_readme_parses() {
    for (line, text) in blocks("toml") {
        if let Err(e) = text.parse::<toml::Table>() {
            panic!("README.md line {line}: not TOML: {e}");
        }
    }
}

#[tokio::test]
async fn the_refusal_body_of_the_readme_is_what_the_quickstart_answers() {
    let json = blocks("json");
    assert_eq!(json.len(), 1, "one JSON block (the 429 body) is expected");
    let (line, text) = &json[0];
    let shown: serde_json::Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("README.md line {line}: not JSON: {e}"));

    // The README's limits, on a clock that does not move: ten pass, the eleventh is refused.
    let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)));
    let layer = RateLimitLayer::builder(store)
        .limit(Limit::new("per-ip", Quota::per_second(5).burst(10)).key(PeerIp::new()))
        .limit(Limit::new("global", Quota::per_second(100).burst(200)))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route_layer(layer);
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
