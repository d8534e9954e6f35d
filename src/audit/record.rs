//! The request side of the audit log: a layer's [`Recorder`] turns a refusing limit of a
//! request into a [`Violation`], and the builder's [`audit`](crate::RateLimitBuilder::audit).

use std::time::SystemTime;

use http::request::Parts;

use super::violation::{Queued, bounded_route};
use super::{AuditLog, Violation};
use crate::model::decision::LimitDecision;
use crate::web::key::Key;
use crate::web::limit::RuleIdFn;
use crate::web::lists::Address;

/// A layer's audit log, with what it needs to describe a refusal.
pub(crate) struct Recorder {
    log: AuditLog,
    /// Where the client's address is read (the layer's `client_ip`, else the peer).
    address: Address,
    /// The key policy of refusal events (`redact_keys`).
    redact: Option<bool>,
    /// Each bound limit's rule id, and its choice per request.
    rule_ids: Box<[(Option<u64>, Option<RuleIdFn>)]>,
}

impl Recorder {
    pub(crate) fn new(
        log: AuditLog,
        address: Address,
        redact: Option<bool>,
        rule_ids: impl IntoIterator<Item = (Option<u64>, Option<RuleIdFn>)>,
    ) -> Self {
        Self {
            log,
            address,
            redact,
            rule_ids: rule_ids.into_iter().collect(),
        }
    }

    /// What the pacer of a stream this request starts (a routed limit of bytes) records
    /// its refusals with: the log, the request's route and client, as a refused request
    /// is recorded.
    pub(crate) fn for_stream<'p>(
        &self,
        parts: &'p Parts,
    ) -> (AuditLog, &'p str, Option<std::net::IpAddr>) {
        (
            self.log.clone(),
            crate::web::routes::logged_route(parts),
            self.address.client_ip(parts).ok(),
        )
    }

    /// Records that limit `bound` refused (or, `shadow`, would have refused) the request.
    pub(crate) fn record(
        &self,
        bound: usize,
        limit: &LimitDecision,
        key: Option<&Key>,
        parts: &Parts,
        shadow: bool,
    ) {
        self.log.record(|| Queued {
            violation: Violation {
                limit: limit.name,
                key: String::new(),
                client: self.address.client_ip(parts).ok(),
                route: bounded_route(crate::web::routes::logged_route(parts)),
                tokens_left: limit.remaining().unwrap_or(0),
                retry_after: limit.retry_after(),
                cost: limit.cost,
                rule_id: self.rule_id(bound, parts),
                shadow,
                at: SystemTime::now(),
                banned: false,
            },
            key: key.cloned(),
            redact: self.redact,
        });
    }

    /// Records that limit `bound` refused the request because its key was banned, for
    /// `remaining` more.
    pub(crate) fn record_banned(
        &self,
        bound: usize,
        limit: &'static str,
        key: &Key,
        parts: &Parts,
        remaining: std::time::Duration,
    ) {
        self.log.record(|| Queued {
            violation: Violation {
                limit,
                key: String::new(),
                client: self.address.client_ip(parts).ok(),
                route: bounded_route(crate::web::routes::logged_route(parts)),
                tokens_left: 0,
                retry_after: Some(remaining),
                cost: 0,
                rule_id: self.rule_id(bound, parts),
                shadow: false,
                at: SystemTime::now(),
                banned: true,
            },
            key: Some(key.clone()),
            redact: self.redact,
        });
    }

    /// The rule id of limit `bound` for this request: its choice per request (plans), else
    /// its own.
    fn rule_id(&self, bound: usize, parts: &Parts) -> Option<u64> {
        let (own, by) = self.rule_ids.get(bound)?;
        by.as_ref().and_then(|f| f(parts)).or(*own)
    }
}
