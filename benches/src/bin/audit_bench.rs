//! The audit log's two figures (issue 11), in one process: run it with `--release`.
//!
//! 1. What recording costs a refused request: a refusal flood (one client, memory store)
//!    through a layer without an audit log, with one whose sink keeps up (a violation
//!    built and queued per refusal; the writer on another thread), and with one whose
//!    sink never returns (the queue full: every refusal is a failed attempt and a count).
//!    Rounds alternate; the median round is reported.
//! 2. Sustained violations per second into SQLite (`SqlViolationSink`, a file in a temp
//!    directory): 200,000 refusals queued (capacity 200,000, so none is dropped), timed
//!    until the last row is committed; default journal, then WAL with
//!    `synchronous = NORMAL`.
//!
//! ```text
//! cargo run -p tollgate-bench --release --bin audit_bench --features audit-sql
//! ```

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tollgate::audit::{AuditLog, BoxError, Violation};
use tollgate::key::{PeerAddr, PeerIp};
use tollgate::service::RateLimit;
use tollgate::sql::{self, SqlPool, SqlViolationSink};
use tollgate::store::MemoryStore;
use tollgate::{Limit, Quota, RateLimitLayer, RefusalLog};
use tower::Service;
use tower::layer::Layer;

type Inner =
    tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<Full<Bytes>>, Infallible>>>;
type Limited = RateLimit<Inner, MemoryStore, tollgate::response::DefaultOnRejection>;

fn ok(_: Request<()>) -> Ready<Result<Response<Full<Bytes>>, Infallible>> {
    ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
}

const BATCH: usize = 1024;

fn request() -> Request<()> {
    let mut r = Request::get("/items/1").body(()).unwrap();
    r.extensions_mut().insert(PeerAddr(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        4000,
    )));
    r
}

fn service(audit: Option<AuditLog>) -> Limited {
    let mut builder = RateLimitLayer::builder(MemoryStore::new())
        .limit(
            Limit::new("per-ip", Quota::per_hour(1))
                .key(PeerIp::new())
                .rule_id(1),
        )
        .refusal_log(RefusalLog::off());
    if let Some(audit) = audit {
        builder = builder.audit(audit);
    }
    builder
        .build()
        .unwrap()
        .layer(tower::service_fn(ok as fn(_) -> _))
}

/// Sends `requests` (answered at once by the memory store), returns the refusals.
fn run(service: &mut Limited, requests: Vec<Request<()>>) -> usize {
    let mut cx = Context::from_waker(Waker::noop());
    let mut refused = 0;
    for r in requests {
        let Poll::Ready(Ok(())) = service.poll_ready(&mut cx) else {
            unreachable!()
        };
        let future = pin!(service.call(r));
        let Poll::Ready(Ok(response)) = future.poll(&mut cx) else {
            unreachable!("the memory store answers at once")
        };
        refused += usize::from(response.status() == 429);
    }
    refused
}

/// ns per refused request for each variant: the median of `rounds` alternating rounds.
fn overhead(rounds: usize, per_round: usize) {
    let keeping_up = AuditLog::builder(|batch: Vec<Violation>| {
        std::hint::black_box(batch);
        async { Ok::<(), BoxError>(()) }
    })
    .capacity(100_000)
    .batch_size(1_000)
    .flush_interval(Duration::from_millis(10))
    .build()
    .unwrap();
    let stuck = AuditLog::builder(|_: Vec<Violation>| std::future::pending())
        .capacity(10_000)
        .build()
        .unwrap();
    let mut variants = [
        ("no audit log", service(None), Vec::new(), None),
        (
            "audit, sink keeping up",
            service(Some(keeping_up.clone())),
            Vec::new(),
            Some(keeping_up),
        ),
        (
            "audit, queue full (stuck sink)",
            service(Some(stuck.clone())),
            Vec::new(),
            Some(stuck),
        ),
    ];
    for (_, svc, _, _) in &mut variants {
        run(svc, vec![request()]); // the one allowed request
    }
    for _ in 0..rounds {
        for (_, svc, times, _) in &mut variants {
            let mut elapsed = Duration::ZERO;
            for _ in 0..per_round / BATCH {
                let requests: Vec<_> = (0..BATCH).map(|_| request()).collect();
                let started = Instant::now();
                assert_eq!(run(svc, requests), BATCH);
                elapsed += started.elapsed();
            }
            times.push(elapsed.as_nanos() as f64 / per_round as f64);
        }
    }
    println!("refused request, median of {rounds} rounds of {per_round}:");
    for (name, _, times, audit) in &mut variants {
        times.sort_by(f64::total_cmp);
        let stats = audit
            .as_ref()
            .map(|a| format!("  {:?}", a.stats()))
            .unwrap_or_default();
        println!("  {name:32} {:7.0} ns{stats}", times[times.len() / 2]);
    }
}

/// Violations per second written into a SQLite file.
async fn sqlite_throughput(wal: bool, n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut options = SqliteConnectOptions::new()
        .filename(dir.path().join("audit.db"))
        .create_if_missing(true);
    if wal {
        options = options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
    }
    let pool = SqlPool::from(
        SqlitePoolOptions::new()
            .connect_with(options)
            .await
            .unwrap(),
    );
    sql::migrate(&pool).await.unwrap();
    for batch_size in [100, 1_000] {
        let audit = AuditLog::builder(SqlViolationSink::new(pool.clone()))
            .capacity(n)
            .batch_size(batch_size)
            .flush_interval(Duration::from_millis(50))
            .build()
            .unwrap();
        let mut svc = service(Some(audit.clone()));
        run(&mut svc, vec![request()]);
        let started = Instant::now();
        for _ in 0..n / BATCH {
            run(&mut svc, (0..BATCH).map(|_| request()).collect());
        }
        let queued_in = started.elapsed();
        let total = (n / BATCH * BATCH) as u64;
        while audit.stats().written + audit.stats().failed < total {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed();
        let stats = audit.stats();
        println!(
            "  {:28} batches of {batch_size:5}: {total} rows in {elapsed:.2?} = {:8.0} rows/s (queued in {queued_in:.2?}; dropped {}, failed {})",
            if wal {
                "WAL, synchronous=NORMAL"
            } else {
                "default journal"
            },
            total as f64 / elapsed.as_secs_f64(),
            stats.dropped,
            stats.failed,
        );
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The audit writers start on this runtime; requests are polled on this thread.
    let _guard = runtime.enter();
    overhead(11, 100 * BATCH);
    println!("sustained writes into SQLite:");
    runtime.block_on(sqlite_throughput(false, 200 * BATCH));
    runtime.block_on(sqlite_throughput(true, 200 * BATCH));
}
