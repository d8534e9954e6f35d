//! [`TracingSink`]: the audit log as `tracing` events.

use std::future;

use tracing::Level;

use super::{AuditSink, Violation, WriteFuture};
use crate::base::event::event_at;

/// Writes each violation as one `tracing` event, target `tollgate::audit`, message
/// `rate limit violation`, with the fields `limit`, `key`, `client` (when known), `route`,
/// `tokens_left`, `retry_after_ms` (when a wait can help), `cost`, `rule_id` (when the limit
/// has one), `shadow` and `at` (RFC 3339). Unlike refusal events
/// ([`RefusalLog`](crate::RefusalLog)) nothing is throttled: every refusal the queue took
/// is written, off the request path.
///
/// ```
/// use tollgate::audit::{AuditLog, TracingSink};
/// use tracing::Level;
///
/// let audit = AuditLog::new(TracingSink::new().level(Level::WARN));
/// # let _ = audit;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TracingSink {
    level: Level,
}

impl Default for TracingSink {
    fn default() -> Self {
        Self::new()
    }
}

impl TracingSink {
    /// Events at `INFO`.
    pub const fn new() -> Self {
        Self { level: Level::INFO }
    }

    /// Events at `level`.
    pub const fn level(mut self, level: Level) -> Self {
        self.level = level;
        self
    }
}

impl AuditSink for TracingSink {
    fn write(&self, batch: Vec<Violation>) -> WriteFuture<'_> {
        for v in &batch {
            let client = v.client.map(tracing::field::display);
            let retry_after_ms = v.retry_after.map(|w| crate::base::round::ceil_ms(w) as u64);
            let at = v.at_rfc3339();
            event_at!(
                self.level,
                "tollgate::audit",
                limit = v.limit,
                key = v.key.as_str(),
                client,
                route = v.route.as_str(),
                tokens_left = v.tokens_left,
                retry_after_ms,
                cost = v.cost,
                rule_id = v.rule_id,
                shadow = v.shadow,
                banned = v.banned,
                at = at.as_str(),
                "rate limit violation"
            );
        }
        Box::pin(future::ready(Ok(())))
    }
}
