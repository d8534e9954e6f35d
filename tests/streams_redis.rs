//! Bytes per second shared across instances through Redis (issue 42): two stores (two
//! instances' connections) in one process, and two processes (`tests/bin/paced_process.rs`),
//! pace downloads of one key from one bucket, waiting or ending with leases. Redis keeps its own
//! time, so these run on the real clock and assert only what pacing guarantees whatever
//! the machine's speed: never faster than the shared rate, and one Redis call per batch.
#![cfg(feature = "redis")]

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use support::redis::RedisServer;
use tollgate::pace::{Direction, PacedBody, Per};
use tollgate::store::RedisStore;
use tollgate::{LimitSpec, Limiter, Quota};

const KIB: usize = 1024;

/// An instance: its own connection to `server`, the limit `download` (1 MiB/s, 256 KiB
/// at once, counted in KiB).
async fn instance(server: &RedisServer) -> Limiter {
    let store = RedisStore::new(server.client().get_connection_manager().await.unwrap())
        .timeout(Duration::from_secs(2));
    Limiter::builder(store)
        .limit(
            LimitSpec::new("download", Quota::per_second(1024).burst(256))
                .per(Per::Byte)
                .unit(1024)
                .direction(Direction::Out),
        )
        .build()
        .unwrap()
}

/// `mib` MiB in 16 KiB frames, paced for `key` through `limiter`, 64 KiB per store call.
async fn download(limiter: Limiter, key: &'static str, mib: usize) -> usize {
    let frames = (0..mib * 64).map(|_| {
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from(vec![1u8; 16 * KIB])))
    });
    let pacer = limiter.pacer("download", key).unwrap().batch(64);
    let body = PacedBody::new(StreamBody::new(futures_util::stream::iter(frames)), pacer);
    body.collect().await.unwrap().to_bytes().len()
}

/// `EVALSHA` calls so far.
async fn evalsha(server: &RedisServer) -> u64 {
    let mut c = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_keys_rate_through_redis() {
    let server = RedisServer::start();
    let (a, b) = (instance(&server).await, instance(&server).await);
    let before = evalsha(&server).await;
    let start = Instant::now();
    let (x, y) = tokio::join!(
        tokio::spawn(download(a, "203.0.113.9", 1)),
        tokio::spawn(download(b, "203.0.113.9", 1))
    );
    let elapsed = start.elapsed();
    let total = x.unwrap() + y.unwrap();
    assert_eq!(total, 2 << 20);
    // Within `elapsed` the key's bucket let through at most its burst, its rate × elapsed
    // and what each instance took ahead (a batch each): so it took at least this long.
    let floor = (2048.0 - 256.0 - 2.0 * 64.0) / 1024.0;
    assert!(
        elapsed.as_secs_f64() >= floor,
        "2 MiB in {elapsed:?}: faster than the shared 1 MiB/s allows ({floor} s)"
    );
    // One call per 64 KiB batch (32 for 2 MiB), and a few reservations that waited.
    let calls = evalsha(&server).await - before;
    eprintln!("2 MiB through two instances in {elapsed:?}, {calls} EVALSHA calls");
    assert!(calls <= 32 + 4, "{calls} EVALSHA calls for 2 MiB");
}

/// The store's calls so far: `EVALSHA` that ran (a NOSCRIPT refusal, before the script is
/// loaded, is counted apart by Redis as failed). The live-set probe (an `EVAL` about once
/// a second per instance, the same with or without streams) is not a pacing call.
async fn script_calls(server: &RedisServer) -> u64 {
    let mut c = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    let field = |line: &str, name: &str| -> u64 {
        line.split([',', ':'])
            .find_map(|f| f.strip_prefix(name)?.parse().ok())
            .unwrap_or(0)
    };
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .map_or(0, |l| field(l, "calls=") - field(l, "failed_calls="))
}

/// What one `paced_process` reported: bytes passed, and the wall clock (µs) before its
/// first charge and when its last passed.
struct Paced {
    passed: u64,
    first_us: u128,
    last_us: u128,
}

/// Runs two `paced_process`es at once on `server`, both pacing `key`.
fn two_processes(server: &RedisServer, mode: &str, amount: &str) -> [Paced; 2] {
    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_paced_process"))
            .args([server.url().as_str(), mode, "203.0.113.9", amount])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let children = [spawn(), spawn()];
    children.map(|child| {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let words: Vec<&str> = text.split_whitespace().collect();
        match words[..] {
            ["passed", passed, "first_us", first, "last_us", last] => Paced {
                passed: passed.parse().unwrap(),
                first_us: first.parse().unwrap(),
                last_us: last.parse().unwrap(),
            },
            _ => panic!("unexpected output: {text}"),
        }
    })
}

/// The bytes two processes passed and the span (s) from the first one's first charge to the
/// last byte that passed: every byte passed within it.
fn total_and_span(runs: &[Paced; 2]) -> (u64, f64) {
    let first = runs.iter().map(|r| r.first_us).min().unwrap();
    let last = runs.iter().map(|r| r.last_us).max().unwrap();
    let total = runs.iter().map(|r| r.passed).sum();
    (total, (last - first) as f64 / 1e6)
}

/// Two processes (two instances, as deployed) download 1 MiB each for one key, waiting
/// for their bytes: together never faster than the key's 1 MiB/s, one script call per
/// 64 KiB batch. Real time (Redis keeps its own clock): the bound is asserted strictly,
/// the time only from below, which a slow machine cannot break.
#[test]
fn two_processes_waiting_share_one_keys_rate_through_redis() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let before = rt.block_on(script_calls(&server));
    let runs = two_processes(&server, "wait", "1");
    let calls = rt.block_on(script_calls(&server)) - before;
    let (total, span) = total_and_span(&runs);
    assert_eq!(total, 2 << 20, "every byte passed");
    // Within `span` the bucket let through at most its burst, its rate × span and a batch
    // taken ahead per process: so it took at least this long.
    let floor = (2048.0 - 256.0 - 2.0 * 64.0) / 1024.0;
    eprintln!("wait: 2 MiB through two processes in {span:.3} s, {calls} script calls");
    assert!(
        span >= floor,
        "2 MiB in {span} s: faster than 1 MiB/s allows ({floor} s)"
    );
    // 32 batches of 64 KiB (and a give-back per process of what its last batch did not
    // use: none here, 1 MiB is 16 whole batches).
    assert!(calls <= 32 + 2, "{calls} script calls for 2 MiB");
}

/// Two processes charge 16 KiB at a time for 3 s each, as fast as the key allows, ending
/// over the limit, with leases of at most 128 KiB: together at most the burst, the rate
/// over the span, and a lease and a batch per process (the lease term of the bound); and
/// fewer script calls than one per 64 KiB passed.
#[test]
fn two_processes_leasing_stay_within_the_lease_bound_through_redis() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let before = rt.block_on(script_calls(&server));
    let runs = two_processes(&server, "end", "3");
    let calls = rt.block_on(script_calls(&server)) - before;
    let (total, span) = total_and_span(&runs);
    let kib = total as f64 / 1024.0;
    // burst + rate × span + N·(lease + batch), in KiB.
    let bound = 256.0 + 1024.0 * span + 2.0 * (128.0 + 64.0);
    eprintln!(
        "end, leased: {kib:.0} KiB through two processes in {span:.3} s (bound {bound:.0} KiB), \
         {calls} script calls ({:.2} per 64 KiB)",
        calls as f64 / (kib / 64.0)
    );
    assert!(
        kib <= bound,
        "{kib} KiB in {span} s: over the bound {bound}"
    );
    assert!(total > 0, "some bytes passed");
    // Lease takes, the checks of a key with no lease on hand, and each process's give-back.
    assert!(
        calls as f64 <= kib / 64.0,
        "{calls} script calls for {kib} KiB: more than one per 64 KiB"
    );
}
