//! Rules files written to hurt: nested without end, endless (`/dev/zero`), too large, not
//! files at all (a FIFO), or turned into a link after the start. Each is refused with a
//! `ConfigError` while the running rules keep serving; none crashes, hangs or fills the
//! memory.
#![cfg(all(feature = "rules", feature = "axum"))]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use support::{count, statuses, with_peer};
use tollgate::clock::FakeClock;
use tollgate::rules::{Document, Rules};
use tollgate::store::MemoryStore;

fn store() -> MemoryStore<FakeClock> {
    MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)))
}

/// Rules from a file, watched with a short debounce, without SIGHUP.
fn from_file(path: &Path) -> Rules<MemoryStore<FakeClock>> {
    Rules::builder(store())
        .file(path)
        .debounce(Duration::from_millis(30))
        .sighup(false)
        .build()
        .unwrap()
}

/// Rules from a file, neither watched nor signalled.
fn unwatched(path: &Path) -> tollgate::rules::RulesBuilder<MemoryStore<FakeClock>> {
    Rules::builder(store())
        .file(path)
        .watch(false)
        .sighup(false)
}

fn router(rules: &Rules<MemoryStore<FakeClock>>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(rules.layer())
}

/// `n` requests from one peer; how many passed.
async fn passes(app: &Router, n: usize) -> usize {
    let make = || with_peer(Request::get("/").body(Body::empty()).unwrap(), "192.0.2.1");
    count(&statuses(app, n, make).await, StatusCode::OK)
}

/// Waits up to 10 s for `done`.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn quota(rules: &Rules<MemoryStore<FakeClock>>) -> Option<String> {
    rules.document().limits.first()?.quota.clone()
}

const JSON: &str = r#"{"limits": [{"name": "a", "quota": "3/min"}]}"#;

/// `{"limits": [[[[...]]]]}`, `depth` arrays deep.
fn nested_json(depth: usize) -> String {
    format!("{{\"limits\": {}{}}}", "[".repeat(depth), "]".repeat(depth))
}

// --- Nesting -----------------------------------------------------------------------------

#[tokio::test]
async fn a_deeply_nested_json_file_is_refused_not_a_stack_overflow() {
    let deep = nested_json(10_000);
    let refused = |e: &tollgate::ConfigError| {
        e.reason().contains("nested more than 128 levels deep") && e.line() == Some(1)
    };
    // Read as a document.
    let err = Document::from_json(&deep).unwrap_err();
    assert!(refused(&err), "{err}");
    // Read from a file at the start.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.json");
    std::fs::write(&path, &deep).unwrap();
    let err = unwatched(&path).build().unwrap_err();
    assert!(refused(&err), "{err}");
    assert!(
        err.to_string().starts_with(&path.display().to_string()),
        "{err}"
    );
    // Reloaded from text.
    std::fs::write(&path, JSON).unwrap();
    let rules = from_file(&path);
    let err = rules.reload(&deep).unwrap_err();
    assert!(refused(&err), "{err}");
    // Moved over the watched file, as in the report (the watcher runs on a thread of its
    // own, with a smaller stack than the main thread's).
    let tmp = dir.path().join("rules.json.new");
    std::fs::write(&tmp, &deep).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    eventually("the refused reload", || rules.status().failures == 2).await;
    let status = rules.status();
    assert!(refused(status.last_error.as_ref().unwrap()), "{status:?}");
    assert!(!status.healthy);
    // The running rules keep serving.
    assert_eq!(quota(&rules).as_deref(), Some("3/min"));
    assert_eq!(passes(&router(&rules), 5).await, 3);
}

#[test]
fn a_deeply_nested_toml_file_is_refused_too() {
    let deep = 10_000;
    let texts = [
        // Arrays and inline tables: `toml` stops them.
        format!("limits = {}{}\n", "[".repeat(deep), "]".repeat(deep)),
        format!("limits = {}{}\n", "{a = ".repeat(deep), "}".repeat(deep)),
        // Dotted keys and headers nest tables without brackets.
        format!("[limits.{}]\n", vec!["a"; deep].join(".")),
        format!("settings.{} = 1\n", vec!["a"; deep].join(".")),
    ];
    for text in texts {
        assert!(Document::from_toml(&text).is_err());
        assert!(Rules::builder(store()).text(text).build().is_err());
    }
}

#[test]
fn the_check_tool_refuses_a_file_nested_60k_deep_without_overflowing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.json");
    std::fs::write(&path, nested_json(60_000)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-rules"))
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!(
            "{}:1: invalid JSON: nested more than 128 levels deep",
            path.display()
        )
    );
}
