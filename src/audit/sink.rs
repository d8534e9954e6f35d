//! [`AuditSink`]: where the audit log's batches go.

use std::future::Future;
use std::pin::Pin;

use super::Violation;

/// An error from a sink.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future of one batch write.
pub type WriteFuture<'a> = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>>;

/// Writes batches of violations somewhere: logs ([`TracingSink`](super::TracingSink)), a
/// database (`SqlViolationSink`, feature `audit-sql`), a queue, a file.
///
/// The audit log's writer task calls [`write`](Self::write) with one batch at a time and
/// waits for it before taking the next, so a sink needs no locking of its own. A write
/// must not block its thread (it runs on the Tokio runtime: use async I/O, or
/// `spawn_blocking`). Failures are not retried: a write that returns an error, panics or
/// outlasts the log's [`write_timeout`](super::AuditLogBuilder::write_timeout) loses its
/// batch, whose violations are counted in [`AuditStats::failed`](super::AuditStats::failed)
/// and logged (target `tollgate::audit`, at most once every 10 s with a count). A sink
/// that wants retries does them inside `write`, bounded, within the timeout.
///
/// Closures `Fn(Vec<Violation>) -> impl Future<Output = Result<(), BoxError>>` are sinks:
///
/// ```
/// use tollgate::audit::{AuditLog, BoxError, Violation};
///
/// let log = AuditLog::new(|batch: Vec<Violation>| async move {
///     for v in &batch {
///         println!("{} refused {} on {}", v.limit, v.key, v.route);
///     }
///     Ok::<(), BoxError>(())
/// });
/// # let _ = log;
/// ```
pub trait AuditSink: Send + Sync + 'static {
    /// Writes one batch (never empty).
    fn write(&self, batch: Vec<Violation>) -> WriteFuture<'_>;
}

impl<F, Fut> AuditSink for F
where
    F: Fn(Vec<Violation>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    fn write(&self, batch: Vec<Violation>) -> WriteFuture<'_> {
        Box::pin(self(batch))
    }
}
