//! Calling a third-party API within its quota: 100 calls per minute, counted in fixed
//! windows, with reservations so that work beyond the quota is scheduled, not failed.
//!
//! The "API" is a local stub task that counts the calls it receives per minute of its own
//! and complains if it ever gets more than 100 in one of its windows. The client side
//! holds a [`Limiter`] with one limit, `vendor-api`: a fixed window of 100 per minute with
//! a random phase ([`Algorithm::fixed_window_random`]: each key's windows start at a
//! point of the minute derived from the key, stable across instances and restarts, so
//! that the clients of a vendor do not all come back at the top of the minute).
//!
//! A batch of 250 jobs is submitted at once. Each job calls
//! [`Limiter::reserve`] with a `max_wait` of 3 minutes: the first jobs (the rest of the
//! current window) may start at once, the next 100 at the start of the next window, the
//! next 100 a window later — all reserved up front, so the program prints the whole
//! schedule before any call is made, and no call is refused by the vendor. A job whose
//! reservation is refused (over 3 minutes away) would be reported as such; cancelled jobs
//! (here: every 50th, for the demonstration) give their units back before their instant,
//! and a later job takes them.
//!
//! To see it in seconds rather than minutes, `WINDOW_SECS=2 cargo run -p tollgate --example
//! third_party_quota` shrinks the window (and the jobs' `max_wait` with it).
//!
//! ```text
//! cargo run -p tollgate --example third_party_quota
//! ```

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;
use tollgate::store::MemoryStore;
use tollgate::{Algorithm, LimitSpec, Limiter, Quota};

const PER_WINDOW: u64 = 100;
const JOBS: u32 = 250;

/// The vendor: records when each call arrives.
struct Vendor {
    start: Instant,
    calls: Mutex<Vec<Duration>>,
}

impl Vendor {
    async fn call(&self, _job: u32) {
        let at = self.start.elapsed();
        self.calls.lock().await.push(at);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let window = Duration::from_secs(
        std::env::var("WINDOW_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let max_wait = window * 3;
    let limiter = Limiter::builder(MemoryStore::new())
        .limit(
            LimitSpec::new("vendor-api", Quota::new(PER_WINDOW, window)?)
                .algorithm(Algorithm::fixed_window_random()),
        )
        .build()?;
    // Reserve every job's call up front: the schedule is known before any call.
    let t0 = Instant::now();
    let vendor = Arc::new(Vendor {
        start: t0,
        calls: Mutex::new(Vec::new()),
    });
    let mut reservations = Vec::new();
    for job in 0..JOBS {
        let r = limiter.reserve("vendor-api", "acme", 1, max_wait).await?;
        reservations.push((job, r));
    }
    println!("schedule for {JOBS} jobs, {PER_WINDOW} calls per {window:?} window (random phase):");
    let mut batch_start: Option<(Duration, u32, u32)> = None;
    let print = |b: Option<(Duration, u32, u32)>| {
        if let Some((at, first, last)) = b {
            println!(
                "  jobs {first:>3}..={last:<3} start at +{:.1} s",
                at.as_secs_f64()
            );
        }
    };
    let first_wait = reservations
        .iter()
        .find(|(_, r)| {
            let waits =
                |l: &tollgate::LimitDecision| l.outcome().is_some_and(|o| !o.wait().is_zero());
            r.is_granted() && r.decision().limits().any(waits)
        })
        .map(|(_, r)| r.ready_at().duration_since(t0));
    for (job, r) in &reservations {
        if !r.is_granted() {
            println!("  job {job}: refused, would wait over {max_wait:?}");
            continue;
        }
        let at = r.ready_at().duration_since(t0);
        match batch_start {
            // Starts within 100 ms of each other: one batch.
            Some((s, first, _)) if at.saturating_sub(s) < Duration::from_millis(100) => {
                batch_start = Some((s, first, *job));
            }
            other => {
                print(other);
                batch_start = Some((at, *job, *job));
            }
        }
    }
    print(batch_start);

    // Run the jobs: each waits for its instant, then calls the vendor. Every 50th job is
    // cancelled before it starts: its unit goes back to the window it was reserved in.
    let mut tasks = Vec::new();
    let mut cancelled = 0;
    for (job, r) in reservations {
        if job % 50 == 49 {
            cancelled += u32::from(r.cancel());
            continue;
        }
        let vendor = vendor.clone();
        tasks.push(tokio::spawn(async move {
            match r.wait().await {
                Ok(_) => {
                    vendor.call(job).await;
                    true
                }
                Err(_) => false,
            }
        }));
    }
    // A late job takes a cancelled unit.
    let late = limiter.reserve("vendor-api", "acme", 1, max_wait).await?;
    println!(
        "{cancelled} jobs cancelled before their start; a late job is scheduled at +{:.1} s",
        late.ready_at().duration_since(t0).as_secs_f64()
    );
    let done = tasks.len();
    let mut ok = 0;
    for t in tasks {
        ok += u32::from(t.await?);
    }
    late.wait().await.map_err(|_| "the late job was refused")?;
    vendor.call(JOBS).await;
    println!("{ok} of {done} jobs called the vendor, plus the late one");

    // Calls per window of the limiter: its windows start where the first waiting job was
    // scheduled; every call of a window comes at its start (plus a timer's latency).
    let mut calls = vendor.calls.lock().await.clone();
    calls.sort();
    let boundary = first_wait.unwrap_or(window);
    let mut per_window = vec![0u64; 1];
    // (calls of the current window come at once, those of later windows at their start:
    // a margin absorbs the timers' latency)
    let margin = (window / 4).min(boundary / 2);
    for &c in &calls {
        let i = if c + margin < boundary {
            0
        } else {
            1 + ((c + margin - boundary).as_nanos() / window.as_nanos()) as usize
        };
        if per_window.len() <= i {
            per_window.resize(i + 1, 0);
        }
        per_window[i] += 1;
    }
    println!("calls per window of the limiter: {per_window:?} (never over {PER_WINDOW})");
    assert!(per_window.iter().all(|&n| n <= PER_WINDOW));
    // A fixed window's known edge: over a window-long span that straddles a boundary,
    // up to twice the limit (a vendor that counts sliding windows needs a sliding log).
    let most = calls
        .iter()
        .enumerate()
        .map(|(i, &c)| calls[i..].iter().take_while(|&&d| d < c + window).count())
        .max()
        .unwrap_or(0);
    println!("most calls in any span of {window:?}: {most}");
    Ok(())
}
