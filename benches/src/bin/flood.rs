//! The memory store and the middleware under floods, for the figures of `ARCHITECTURE.md`:
//!
//! 1. a 10 s flood of new keys (a client inventing API keys) against a default
//!    `MemoryStore` with a one-hour quota: keys tracked and resident memory at the end;
//! 2. at a cap of 1,000,000 keys (filled first): the mean and worst cost of a check of a
//!    new key, beside a known key's;
//! 3. a 2 s flood of one client through an axum router with a shadow limit: the log lines
//!    written at the default level (INFO).
//!
//! ```text
//! cargo run -p tollgate-bench --release --bin flood
//! ```
//!
//! Linux only for the resident memory (read from `/proc/self/statm`).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::Request;
use tollgate::key::{Key, PeerIp};
use tollgate::store::{Checked, Item, MemoryStore, MemoryTable, Store};
use tollgate::{Limit, Quota, RateLimitLayer};
use tower::ServiceExt;

fn rss_mb() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0 / 1e6
}

fn check(store: &MemoryStore, table: &MemoryTable, key: Key, quota: Quota) -> bool {
    match store.check(&[Item::new(table, key, quota, 1)]) {
        Checked::Ready(s) => s[0].outcome().is_some_and(|o| o.is_allowed()),
        Checked::Pending(_) => unreachable!(),
    }
}

async fn key_flood() {
    let store = MemoryStore::new();
    let table = store.table("per-key");
    let quota = Quota::per_hour(100);
    let before = rss_mb();
    let start = Instant::now();
    let mut n: u64 = 0;
    while start.elapsed() < Duration::from_secs(10) {
        for _ in 0..1_000 {
            check(&store, &table, Key::from_part(n), quota);
            n += 1;
        }
        // Let the runtime's tasks (a background sweeper, if any) run.
        tokio::task::yield_now().await;
    }
    println!(
        "new-key flood, 10 s, default store: {n} new keys sent, {} tracked, resident memory {:.1} MB -> {:.1} MB",
        store.len(),
        before,
        rss_mb()
    );
}

fn at_the_cap() {
    let store = MemoryStore::new().max_keys(1_000_000);
    let table = store.table("per-key");
    let quota = Quota::per_hour(100);
    for i in 0..1_000_000u64 {
        check(&store, &table, Key::from_part(i), quota);
    }
    let measure = |label: &str, keys: &mut dyn Iterator<Item = u64>| {
        let mut worst = Duration::ZERO;
        let mut n = 0u32;
        let start = Instant::now();
        for k in keys {
            let t = Instant::now();
            check(&store, &table, Key::from_part(k), quota);
            worst = worst.max(t.elapsed());
            n += 1;
        }
        let mean = start.elapsed() / n;
        println!(
            "at a 1,000,000-key cap, {label}: mean {mean:?} per check, worst {worst:?} ({n} checks)"
        );
    };
    measure("known keys", &mut (0..200_000u64));
    measure("new keys  ", &mut (10_000_000..10_200_000u64));
    println!("  keys tracked: {}", store.len());
}

/// Counts the lines a subscriber writes.
#[derive(Clone, Default)]
struct Lines(Arc<AtomicU64>);

impl io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.fetch_add(
            buf.iter().filter(|&&b| b == b'\n').count() as u64,
            Ordering::Relaxed,
        );
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

async fn shadow_flood() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .limit(
            Limit::new("trial", Quota::per_minute(10))
                .key(PeerIp::new())
                .shadow(),
        )
        .build()
        .expect("valid limits");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer);
    let peer: SocketAddr = "192.0.2.7:40000".parse().expect("address");
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(2) {
        let mut req = Request::get("/").body(Body::empty()).expect("request");
        req.extensions_mut().insert(ConnectInfo(peer));
        let _ = app.clone().oneshot(req).await;
        n += 1;
    }
    println!(
        "shadow flood, 2 s, one client: {n} requests, {} log lines",
        lines.0.load(Ordering::Relaxed)
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    key_flood().await;
    at_the_cap();
    shadow_flood().await;
}
