//! What streams cost in memory (issue 42), read from the process's resident set
//! (`/proc/self/statm`), so the allocator's overhead counts too:
//!
//! - `idle`: 10,000 idle paced bodies (a `PacedBody` around an empty body, its pacer made
//!   for its own key and never charged), held at once: the resident growth per stream;
//! - `downloads`: 100 paced downloads at once (each key 1 MiB/s, 256 KiB at once, batches of
//!   64 KiB), bodies of 64 KiB chunks made as they are read and dropped once read, for 2 s
//!   of real time: the most the resident set grew while they ran, against 100 × 2 chunks.
//!
//! Each figure is given twice: the resident set, and the live heap (the bytes allocated and
//! not yet freed, counted by the `cap` crate's allocator around the system's; for the
//! downloads, the most that was live at any instant, which they measure first). The
//! difference is the allocator's: glibc keeps an arena per thread, and a chunk made on
//! one worker thread and freed on another goes back to its own arena, so with the
//! readers' tasks moving between the runtime's threads freed chunks wait in several (run
//! it with `MALLOC_ARENA_MAX=1` to see the resident set with one arena).
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

/// The system's allocator, counting the bytes live and the most that ever were.
#[global_allocator]
static HEAP: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

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
    let heap = HEAP.allocated();
    let mut streams = Vec::with_capacity(STREAMS);
    for key in &keys {
        let pacer = limiter.pacer("download", key.as_str()).expect("pacer");
        streams.push(PacedBody::new(Empty::<Bytes>::new(), pacer));
    }
    let grown = rss().saturating_sub(before);
    let live = HEAP.allocated().saturating_sub(heap);
    println!(
        "idle: {STREAMS} paced bodies, resident +{} KiB: {} bytes a stream; live heap +{} KiB: {} bytes a stream (a PacedBody is {} bytes)",
        grown / KIB,
        grown / STREAMS,
        live / KIB,
        live / STREAMS,
        std::mem::size_of_val(&streams[0])
    );
    drop(streams);
}

async fn downloads(limiter: &Limiter) {
    const STREAMS: usize = 100;
    let before = rss();
    // The most ever live, from here on (measured first, so that nothing before it was
    // larger than what the downloads hold).
    let heap = HEAP.allocated();
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
    let live = HEAP.max_allocated().saturating_sub(heap);
    for task in &tasks {
        task.abort();
    }
    // Gone (their bodies dropped) before the idle streams are measured.
    for task in tasks {
        let _ = task.await;
    }
    let limit = STREAMS * 2 * CHUNK;
    let verdict = |bytes: usize| if bytes < limit { "below" } else { "ABOVE" };
    println!(
        "downloads: {STREAMS} paced at once for 2 s, 100 x 2 chunks = {} KiB; resident grew at most {} KiB ({} KiB a stream): {}; live heap grew at most {} KiB ({} KiB a stream): {}",
        limit / KIB,
        most / KIB,
        most / STREAMS / KIB,
        verdict(most),
        live / KIB,
        live / STREAMS / KIB,
        verdict(live),
    );
}

#[tokio::main]
async fn main() {
    let limiter = limiter();
    downloads(&limiter).await;
    idle(&limiter);
}
