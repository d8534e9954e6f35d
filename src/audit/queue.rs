//! [`AuditLog`]: the bounded queue between the request path and the sink, and the writer
//! task that empties it in batches.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::violation::Queued;
use super::{AuditSink, Violation};
use crate::base::error::ConfigError;
use crate::base::throttle::LogThrottle;
use crate::observe::probe::AuditMetrics;

/// How often the "queue full" and "sink failed" warnings may be logged (with a count).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The audit log of a layer: every refusal, handed to an [`AuditSink`] in batches by a
/// background task, never making a request wait.
///
/// A refusal is put in a bounded queue with one non-blocking attempt (a
/// `tokio::sync::mpsc` permit, no lock, no await; the violation is only built when there
/// is room, and its key is rendered or hashed later, by the writer). When the queue is
/// full the violation is dropped and counted ([`AuditStats::dropped`]), with a warning
/// (target `tollgate::audit`) at most once every 10 s giving the total: a flood, or a slow
/// or stuck sink, costs requests nothing more than a failed attempt, and memory stays
/// bounded by `capacity + batch_size` violations (a few hundred bytes each).
///
/// The writer task runs on the Tokio runtime of the first refusal (or of
/// [`build`](AuditLogBuilder::build), if called within one; timers must be enabled). It
/// takes up to `batch_size` violations, waiting at most `flush_interval` after the first
/// one for the batch to fill, and writes them (one batch at a time). When every handle to
/// the log is dropped (layers and clones), it writes what is queued and ends. A clone of
/// the log is a handle to the same queue: give one to the layer, keep one for
/// [`stats`](Self::stats).
///
/// ```
/// use std::time::Duration;
/// use tollgate::audit::{AuditLog, TracingSink};
/// use tollgate::{key::PeerIp, store::MemoryStore, Limit, Quota, RateLimitLayer};
///
/// let audit = AuditLog::builder(TracingSink::new())
///     .capacity(10_000)
///     .batch_size(500)
///     .flush_interval(Duration::from_millis(200))
///     .build()?;
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .limit(Limit::new("per-ip", Quota::per_second(5)).key(PeerIp::new()))
///     .audit(audit.clone())
///     .build()?;
/// assert_eq!(audit.stats().dropped, 0);
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Inner {
    tx: mpsc::Sender<Queued>,
    /// The writer, until it is started.
    writer: Mutex<Option<Writer>>,
    started: AtomicBool,
    counters: Arc<Counters>,
    capacity: usize,
    full_log: LogThrottle,
}

/// What the writer task owns.
struct Writer {
    rx: mpsc::Receiver<Queued>,
    sink: Arc<dyn AuditSink>,
    batch_size: usize,
    flush_interval: Duration,
    write_timeout: Duration,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    dropped: AtomicU64,
    written: AtomicU64,
    failed: AtomicU64,
    batches: AtomicU64,
    peak_queued: AtomicU64,
    failed_log: LogThrottle,
    /// The same counts, as metrics (feature `metrics`).
    metrics: AuditMetrics,
}

/// The audit log's counters, read with [`AuditLog::stats`]. Once the queue is empty,
/// `accepted == written + failed`, and every refusal recorded is `accepted + dropped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AuditStats {
    /// Violations put in the queue.
    pub accepted: u64,
    /// Violations dropped because the queue was full (or its writer's runtime had shut
    /// down).
    pub dropped: u64,
    /// Violations the sink wrote.
    pub written: u64,
    /// Violations lost with a batch whose write failed, panicked or timed out.
    pub failed: u64,
    /// Batches handed to the sink.
    pub batches: u64,
    /// Violations in the queue now (never more than `capacity`).
    pub queued: u64,
    /// The most violations that waited in the queue at once (never more than `capacity`):
    /// a high-water mark kept as violations are queued, so it counts those waiting behind
    /// a slow or stuck write too.
    pub peak_queued: u64,
    /// The queue's bound.
    pub capacity: u64,
}

/// Settings of an [`AuditLog`], from [`AuditLog::builder`].
pub struct AuditLogBuilder {
    sink: Arc<dyn AuditSink>,
    capacity: usize,
    batch_size: usize,
    flush_interval: Duration,
    write_timeout: Duration,
}

impl fmt::Debug for AuditLogBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditLogBuilder")
            .field("capacity", &self.capacity)
            .field("batch_size", &self.batch_size)
            .field("flush_interval", &self.flush_interval)
            .field("write_timeout", &self.write_timeout)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditLog")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl AuditLogBuilder {
    /// The most violations waiting for the sink (default 10,000); more are dropped and
    /// counted. At least 1.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// The most violations in one write (default 500). At least 1.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// How long the writer waits for a batch to fill after its first violation (default
    /// 1 s): the longest a violation waits before its write starts, when the sink keeps up.
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval;
        self
    }

    /// How long one write may take before its batch is given up as failed (default 30 s).
    /// Not zero.
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.write_timeout = timeout;
        self
    }

    /// The log, with its queue; its writer starts now if this runs within a Tokio runtime,
    /// else with the first refusal.
    pub fn build(self) -> Result<AuditLog, ConfigError> {
        if self.capacity == 0 {
            return Err(ConfigError::new("audit.capacity", "must be at least 1"));
        }
        // tokio's bound on a channel's capacity.
        if self.capacity > usize::MAX >> 3 {
            return Err(ConfigError::new("audit.capacity", "is too large"));
        }
        if self.batch_size == 0 {
            return Err(ConfigError::new("audit.batch_size", "must be at least 1"));
        }
        if self.write_timeout.is_zero() {
            return Err(ConfigError::new("audit.write_timeout", "must not be zero"));
        }
        let (tx, rx) = mpsc::channel(self.capacity);
        let counters = Arc::new(Counters::default());
        let log = AuditLog {
            inner: Arc::new(Inner {
                tx,
                writer: Mutex::new(Some(Writer {
                    rx,
                    sink: self.sink,
                    batch_size: self.batch_size,
                    flush_interval: self.flush_interval,
                    write_timeout: self.write_timeout,
                    counters: counters.clone(),
                })),
                started: AtomicBool::new(false),
                counters,
                capacity: self.capacity,
                full_log: LogThrottle::new(),
            }),
        };
        log.start();
        Ok(log)
    }
}

impl AuditLog {
    /// A log writing to `sink` with the default settings (capacity 10,000, batches of up
    /// to 500, flushed within 1 s, writes given up after 30 s).
    pub fn new(sink: impl AuditSink) -> Self {
        Self::builder(sink)
            .build()
            .expect("the default audit settings are valid")
    }

    /// A log writing to `sink`, with settings.
    pub fn builder(sink: impl AuditSink) -> AuditLogBuilder {
        AuditLogBuilder {
            sink: Arc::new(sink),
            capacity: 10_000,
            batch_size: 500,
            flush_interval: Duration::from_secs(1),
            write_timeout: Duration::from_secs(30),
        }
    }

    /// The counters: accepted, dropped, written, failed, queued.
    pub fn stats(&self) -> AuditStats {
        let c = &self.inner.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AuditStats {
            accepted: load(&c.accepted),
            dropped: load(&c.dropped),
            written: load(&c.written),
            failed: load(&c.failed),
            batches: load(&c.batches),
            queued: (self.inner.capacity - self.inner.tx.capacity()) as u64,
            peak_queued: load(&c.peak_queued),
            capacity: self.inner.capacity as u64,
        }
    }

    /// Queues the violation `make` builds, if there is room (it is not built otherwise);
    /// never waits.
    #[inline]
    pub(crate) fn record(&self, make: impl FnOnce() -> Queued) {
        let inner = &*self.inner;
        if !inner.started.load(Ordering::Relaxed) {
            self.start();
        }
        match inner.tx.try_reserve() {
            Ok(permit) => {
                permit.send(make());
                inner.counters.accepted.fetch_add(1, Ordering::Relaxed);
                inner.counters.metrics.accepted.increment(1);
                // The high-water mark, written only when it rises: a queue below its peak
                // costs one more load.
                let queued = (inner.capacity - inner.tx.capacity()) as u64;
                if queued > inner.counters.peak_queued.load(Ordering::Relaxed) {
                    inner
                        .counters
                        .peak_queued
                        .fetch_max(queued, Ordering::Relaxed);
                }
            }
            Err(_) => self.dropped(),
        }
    }

    #[cold]
    fn dropped(&self) {
        let inner = &*self.inner;
        let before = inner.counters.dropped.fetch_add(1, Ordering::Relaxed);
        inner.counters.metrics.dropped.increment(1);
        // The throttle reads the clock: asked on every 256th drop only (the first included),
        // so a full queue costs a request two atomic operations.
        if before.is_multiple_of(256) && inner.full_log.permit(WARN_EVERY).is_some() {
            tracing::warn!(
                target: "tollgate::audit",
                capacity = inner.capacity,
                dropped_total = before + 1,
                "audit queue full (or its writer stopped): violations dropped"
            );
        }
    }

    /// Starts the writer task on the current Tokio runtime, if there is one.
    #[cold]
    fn start(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut slot = self.inner.writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(writer) = slot.take() {
            runtime.spawn(writer.run());
            self.inner.started.store(true, Ordering::Relaxed);
        }
    }
}

impl Writer {
    async fn run(mut self) {
        let mut batch = Vec::with_capacity(self.batch_size);
        loop {
            if self.rx.recv_many(&mut batch, self.batch_size).await == 0 {
                return; // every sender is gone and the queue is empty
            }
            let deadline = tokio::time::Instant::now() + self.flush_interval;
            while batch.len() < self.batch_size {
                let more = self.batch_size - batch.len();
                match tokio::time::timeout_at(deadline, self.rx.recv_many(&mut batch, more)).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            // Keys are rendered (hashed) here, off the request path.
            let full: Vec<Violation> = batch.drain(..).map(Queued::into_violation).collect();
            self.write(full).await;
        }
    }

    /// One write, in its own task: a panicking sink loses its batch, not the writer.
    async fn write(&self, batch: Vec<Violation>) {
        let n = batch.len() as u64;
        let sink = self.sink.clone();
        let mut task = tokio::spawn(async move { sink.write(batch).await });
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        let failure = match tokio::time::timeout(self.write_timeout, &mut task).await {
            Ok(Ok(Ok(()))) => {
                self.counters.written.fetch_add(n, Ordering::Relaxed);
                self.counters.metrics.written.increment(n);
                return;
            }
            Ok(Ok(Err(error))) => error.to_string(),
            Ok(Err(join)) => format!("the sink panicked: {join}"),
            Err(_) => {
                task.abort();
                format!("the write took more than {:?}", self.write_timeout)
            }
        };
        self.counters.failed.fetch_add(n, Ordering::Relaxed);
        self.counters.metrics.failed.increment(n);
        if let Some(suppressed) = self.counters.failed_log.permit(WARN_EVERY) {
            tracing::warn!(
                target: "tollgate::audit",
                lost = n,
                failed_writes_since_last_line = suppressed,
                "audit sink failed, its batch is dropped: {failure}"
            );
        }
    }
}
