//! What streams cost in memory (issue 42), read from the process's resident set
//! (`/proc/self/statm`), so the allocator's overhead counts too:
//!
//! - `idle`: 10,000 idle paced bodies (a `PacedBody` around an empty body, its pacer made
//!   for its own key and never charged), held at once: the resident growth per stream;
//! - `downloads`: 100 paced downloads at once (each key 1 MiB/s, 256 KiB at once, batches of
//!   64 KiB), bodies of 64 KiB chunks made as they are read and dropped once read, for 2 s
//!   of real time: the most the resident set grew while they ran, against 100 × 2 chunks.
//!
//!   cargo run -p tollgate-bench --release --bin stream_memory
//!
//! Linux only (it reads `/proc`).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::{Body, Frame};
use tollgate::pace::{Direction, PacedBody, Per};
use tollgate::store::MemoryStore;
use tollgate::{LimitSpec, Limiter, Quota};

const KIB: usize = 1024;
const CHUNK: usize = 64 * KIB;

/// The resident set, in bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's second field");
    pages * 4096
}

/// A body of `n` chunks of 64 KiB, each made when it is read.
struct Chunks(u32);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.0 == 0 {
            return Poll::Ready(None);
        }
        self.0 -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![1u8; CHUNK])))))
    }
}

fn limiter() -> Limiter {
    Limiter::builder(MemoryStore::new())
        .limit(
            LimitSpec::new("download", Quota::per_second(1024).burst(256))
                .per(Per::Byte)
                .unit(1024)
                .direction(Direction::Out),
        )
        .build()
        .expect("limits")
}

fn idle(limiter: &Limiter) {
    const STREAMS: usize = 10_000;
    // The keys made first: a stream's key is the request's, not the stream's cost.
    let keys: Vec<String> = (0..STREAMS)
        .map(|i| format!("198.51.{}.{}", i / 256, i % 256))
        .collect();
    let before = rss();
    let mut streams = Vec::with_capacity(STREAMS);
    for key in &keys {
        let pacer = limiter.pacer("download", key.as_str()).expect("pacer");
        streams.push(PacedBody::new(Empty::<Bytes>::new(), pacer));
    }
    let grown = rss().saturating_sub(before);
    println!(
        "idle: {STREAMS} paced bodies, resident +{} KiB: {} bytes a stream (a PacedBody is {} bytes)",
        grown / KIB,
        grown / STREAMS,
        std::mem::size_of_val(&streams[0])
    );
    drop(streams);
}

async fn downloads(limiter: &Limiter) {
    const STREAMS: usize = 100;
    let before = rss();
    let mut tasks = Vec::new();
    for i in 0..STREAMS {
        let pacer = limiter
            .pacer("download", format!("203.0.113.{i}").as_str())
            .expect("pacer")
            .batch(64);
        // 64 KiB chunks made as they are read: 10 MiB each, more than 2 s lets through.
        let mut body = PacedBody::new(Chunks(160), pacer);
        tasks.push(tokio::spawn(async move {
            let mut read = 0;
            while let Some(Ok(frame)) = body.frame().await {
                read += frame.data_ref().map_or(0, Bytes::len);
            }
            read
        }));
    }
    let start = Instant::now();
    let mut most = 0;
    while start.elapsed() < Duration::from_secs(2) {
        most = most.max(rss().saturating_sub(before));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for task in &tasks {
        task.abort();
    }
    let limit = STREAMS * 2 * CHUNK;
    println!(
        "downloads: {STREAMS} paced at once for 2 s, resident grew at most {} KiB ({} KiB a stream); 100 x 2 chunks = {} KiB: {}",
        most / KIB,
        most / STREAMS / KIB,
        limit / KIB,
        if most < limit { "below" } else { "ABOVE" }
    );
}

#[tokio::main]
async fn main() {
    let limiter = limiter();
    idle(&limiter);
    downloads(&limiter).await;
}
