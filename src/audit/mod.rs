//! The violation audit log: every refusal of a layer, written to a sink in batches by a
//! background task, never making a request wait.
//!
//! Refusal events ([`RefusalLog`](crate::RefusalLog)) are throttled so that a flood does
//! not flood the logs; the audit log is the other side: a record of *every* refusal —
//! limit, key, client address, route, tokens left, the limit's
//! [`rule_id`](crate::Limit::rule_id), time — for abuse review, billing disputes or a
//! `RateLimitViolation` table. It is bounded: a full queue drops violations and counts
//! them ([`AuditStats::dropped`]), so the request path never waits on the sink and memory
//! never grows with the flood.
//!
//! - [`AuditLog`]: the queue, its writer task and counters; given to a layer with
//!   [`RateLimitBuilder::audit`](crate::RateLimitBuilder::audit).
//! - [`AuditSink`]: where batches go — [`TracingSink`] (one `tracing` event per
//!   violation), `SqlViolationSink` (feature `audit-sql`: SQLite, or PostgreSQL with
//!   `rules-postgres`), or your own (closures are sinks).
//! - [`Violation`]: one refusal by one limit.
//!
//! What is recorded: each enforcing limit that refuses a request (a request refused by
//! two limits gives two violations), and each shadow limit that would have refused one,
//! with [`Violation::shadow`] set (the request may have been let through). Keys follow
//! the layer's [`redact_keys`](crate::RateLimitBuilder::redact_keys) policy, like refusal
//! events: addresses in the clear, other keys (often credentials) hashed, by default.
//! Not recorded: requests refused before any limit is checked (deny lists, missing keys
//! under `Reject`, misconfigurations), store failures under `Deny` (no limit was
//! violated), and the [`Limiter`](crate::Limiter) handle's refusals (its caller has the
//! answer, and there is no request to describe).
//!
//! ```
//! use tollgate::audit::{AuditLog, BoxError, Violation};
//! use tollgate::{key::PeerIp, store::MemoryStore, Limit, Quota, RateLimitLayer};
//!
//! // A sink of your own: here, a closure sending batches to a channel.
//! let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<Violation>>();
//! let audit = AuditLog::new(move |batch: Vec<Violation>| {
//!     let sent = tx.send(batch).map_err(|e| Box::new(e) as BoxError);
//!     async move { sent }
//! });
//! let layer = RateLimitLayer::builder(MemoryStore::new())
//!     .limit(Limit::new("per-ip", Quota::per_second(5)).key(PeerIp::new()).rule_id(7))
//!     .audit(audit.clone())
//!     .build()?;
//! # let _ = (layer, rx.try_recv());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod queue;
mod record;
mod sink;
mod trace;
mod violation;

pub use queue::{AuditLog, AuditLogBuilder, AuditStats};
pub(crate) use record::Recorder;
pub use sink::{AuditSink, BoxError, WriteFuture};
pub use trace::TracingSink;
pub use violation::{MAX_ROUTE_LEN, Violation};
pub(crate) use violation::{Queued, bounded_route};
