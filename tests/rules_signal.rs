//! `SIGHUP` reloads of a hostile rules file never hold requests up. In a binary of its own:
//! a signal reaches every `Rules` of the process that listens for it.
#![cfg(all(unix, feature = "rules", feature = "axum"))]

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use support::{send, with_peer};
use tollgate::clock::FakeClock;
use tollgate::rules::Rules;
use tollgate::store::MemoryStore;

const TOML: &str = "[[limits]]\nname = \"a\"\nquota = \"1000/min\"\n";

/// A rules file replaced by a FIFO that nobody writes, then `SIGHUP`: the reload is refused
/// and counted, and requests keep being answered all along (on a runtime of one thread,
/// where a reload that blocked it would block them all).
#[test]
fn a_sighup_reload_of_a_fifo_never_holds_requests_up() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, TOML).unwrap();
    let store = MemoryStore::with_clock(FakeClock::at(Duration::from_secs(1_000)));
    let rules = runtime.block_on(async {
        Rules::builder(store)
            .file(&path)
            .watch(false)
            .build()
            .unwrap()
    });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(rules.layer());
    std::fs::remove_file(&path).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());

    // Requests on the runtime's only thread, until the reload has been refused (and a few
    // more); each answer is awaited here, on another thread, at most 5 s.
    let (answers, answered) = mpsc::channel();
    let status = rules.clone();
    let client = std::thread::spawn(move || {
        runtime.block_on(async {
            let mut after = 0;
            while after < 20 {
                let req = with_peer(Request::get("/").body(Body::empty()).unwrap(), "192.0.2.1");
                let response = send(&app, req).await;
                if answers.send(response.status()).is_err() {
                    return;
                }
                if status.status().failures > 0 {
                    after += 1;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match answered.recv_timeout(Duration::from_secs(5)) {
            Ok(status) => assert_eq!(status, StatusCode::OK),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("a request waited 5 s during the SIGHUP reload")
            }
        }
        assert!(Instant::now() < deadline, "the reload was never refused");
    }
    client.join().unwrap();
    let status = rules.status();
    assert_eq!((status.failures, status.healthy), (1, false));
    let error = status.last_error.unwrap();
    assert!(
        error.reason().contains("it is a FIFO, not a regular file"),
        "{error}"
    );
    assert_eq!(
        rules.document().limits[0].quota.as_deref(),
        Some("1000/min")
    );
}
