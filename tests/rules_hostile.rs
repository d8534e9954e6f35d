//! Rules files written to hurt: nested without end, endless (`/dev/zero`), too large, not
//! files at all (a FIFO), or turned into a link after the start. Each is refused with a
//! `ConfigError` while the running rules keep serving; none crashes, hangs or fills the
//! memory.
#![cfg(all(feature = "rules", feature = "axum"))]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
const TOML: &str = "[[limits]]\nname = \"a\"\nquota = \"3/min\"\n";

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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-rules-under-test"))
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

// --- What is read ------------------------------------------------------------------------

/// Runs `f` on a thread of its own and waits up to 10 s for it: a call that blocks fails
/// the test instead of hanging it.
fn within_10s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} blocked"))
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success());
}

#[cfg(unix)]
#[tokio::test]
async fn a_rules_file_linked_to_dev_zero_is_refused_not_read_until_memory_runs_out() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    symlink("/dev/zero", &path).unwrap();
    let err = within_10s("the first load", {
        let path = path.clone();
        move || unwatched(&path).build().unwrap_err()
    });
    assert_eq!(
        err.to_string(),
        format!(
            "{}: cannot read the rules: it is a device, not a regular file",
            path.display()
        )
    );
    // A link made after the start: refused at reload, the running rules stay.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, TOML).unwrap();
    let rules = unwatched(&path).build().unwrap();
    std::fs::remove_file(&path).unwrap();
    symlink("/dev/zero", &path).unwrap();
    let err = within_10s("the reload", {
        let rules = rules.clone();
        move || rules.reload_file().unwrap_err()
    });
    assert!(
        err.reason().contains("a device, not a regular file"),
        "{err}"
    );
    assert_eq!(rules.status().failures, 1);
    assert_eq!(quota(&rules).as_deref(), Some("3/min"));
    assert_eq!(passes(&router(&rules), 5).await, 3);
}

#[cfg(unix)]
#[tokio::test]
async fn a_fifo_rules_file_is_refused_without_waiting_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    mkfifo(&path);
    let err = within_10s("the first load", {
        let path = path.clone();
        move || unwatched(&path).build().unwrap_err()
    });
    assert!(
        err.reason().contains("it is a FIFO, not a regular file"),
        "{err}"
    );
    assert_eq!(err.file(), Some(path.display().to_string().as_str()));
    // A FIFO moved in after the start: refused at reload (by a call, and by the watcher),
    // the running rules stay.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, TOML).unwrap();
    let rules = unwatched(&path).build().unwrap();
    let watched = from_file(&path);
    std::fs::remove_file(&path).unwrap();
    mkfifo(&path);
    let err = within_10s("the reload", {
        let rules = rules.clone();
        move || rules.reload_file().unwrap_err()
    });
    assert!(err.reason().contains("it is a FIFO"), "{err}");
    eventually("the watcher's refusal", || watched.status().failures == 1).await;
    let status = watched.status();
    let error = status.last_error.unwrap();
    assert!(error.reason().contains("it is a FIFO"), "{error}");
    for rules in [rules, watched] {
        assert_eq!(quota(&rules).as_deref(), Some("3/min"));
        assert_eq!(passes(&router(&rules), 5).await, 3);
    }
}

#[tokio::test]
async fn a_rules_file_over_max_file_size_is_refused_and_one_at_the_cap_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, TOML).unwrap();
    let cap = TOML.len() as u64;
    let rules = unwatched(&path).max_file_size(cap).build().unwrap();
    assert_eq!(quota(&rules).as_deref(), Some("3/min"));
    let err = unwatched(&path).max_file_size(cap - 1).build().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: cannot read the rules: larger than {} bytes (`max_file_size`)",
            path.display(),
            cap - 1
        )
    );
    // One byte more at reload: refused, the running rules stay.
    std::fs::write(&path, TOML.replace("3/min", "4/min") + "#").unwrap();
    let err = rules.reload_file().unwrap_err();
    assert!(
        err.reason().contains(&format!("larger than {cap} bytes")),
        "{err}"
    );
    assert_eq!(quota(&rules).as_deref(), Some("3/min"));
    assert_eq!(passes(&router(&rules), 5).await, 3);
    // Back under the cap: read again.
    std::fs::write(&path, TOML.replace("3/min", "4/min")).unwrap();
    rules.reload_file().unwrap();
    assert_eq!(quota(&rules).as_deref(), Some("4/min"));
}

#[test]
fn a_rules_file_over_16_mib_is_refused_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    // Sparse: it costs no disk.
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(16 * 1024 * 1024 + 1).unwrap();
    let err = unwatched(&path).build().unwrap_err();
    assert!(
        err.reason()
            .contains("larger than 16777216 bytes (`max_file_size`)"),
        "{err}"
    );
}

// --- Links -------------------------------------------------------------------------------

#[cfg(unix)]
#[tokio::test]
async fn a_rules_file_turned_into_a_link_after_the_start_is_followed_by_the_watcher() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let (here, there) = (dir.path().join("app"), dir.path().join("shared"));
    std::fs::create_dir(&here).unwrap();
    std::fs::create_dir(&there).unwrap();
    let path = here.join("rules.toml");
    std::fs::write(&path, TOML).unwrap();
    let rules = from_file(&path);
    // The file becomes a link to a file in another directory, swapped in by a rename.
    let target = there.join("real.toml");
    std::fs::write(&target, TOML.replace("3/min", "5/min")).unwrap();
    symlink(&target, here.join("rules.toml.new")).unwrap();
    std::fs::rename(here.join("rules.toml.new"), &path).unwrap();
    eventually("the linked rules", || {
        quota(&rules).as_deref() == Some("5/min")
    })
    .await;
    // A change of the file it links to, in the other directory, reloads too.
    std::fs::write(&target, TOML.replace("3/min", "6/min")).unwrap();
    eventually("the changed target", || {
        quota(&rules).as_deref() == Some("6/min")
    })
    .await;
    let status = rules.status();
    assert_eq!((status.reloads, status.failures), (2, 0));
}

// --- Reloads at once ---------------------------------------------------------------------

#[tokio::test]
async fn reloads_of_the_file_asked_for_at_once_are_merged_and_end_on_its_last_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, TOML).unwrap();
    let rules = unwatched(&path).build().unwrap();
    let written = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (rules, written) = (rules.clone(), written.clone());
            std::thread::spawn(move || {
                let mut calls = 0;
                while !written.load(Ordering::Acquire) {
                    rules.reload_file().unwrap();
                    calls += 1;
                }
                // At least one call after the last write.
                rules.reload_file().unwrap();
                calls + 1
            })
        })
        .collect();
    for rate in 4..30 {
        let tmp = dir.path().join("rules.toml.new");
        std::fs::write(&tmp, TOML.replace("3/min", &format!("{rate}/min"))).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    written.store(true, Ordering::Release);
    let calls: u64 = callers.into_iter().map(|c| c.join().unwrap()).sum();
    // A merged call returns before the reload it joined reads the file once more.
    eventually("the last text", || {
        quota(&rules).as_deref() == Some("29/min")
    })
    .await;
    let status = rules.status();
    assert!(status.reloads <= calls, "{status:?}");
    assert_eq!((status.failures, status.healthy), (0, true));
}
