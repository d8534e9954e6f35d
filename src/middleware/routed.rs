//! [`PaceGuard`]: the pacers of a request's limits of bytes on its route (a rules file's
//! `per = "byte"` with `routes`), made when the request passes, keyed as the layer keys
//! it, and handed to its response body ([`Follow::paced`](crate::service::Follow::paced)).

use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use http::HeaderMap;

use crate::audit::AuditLog;

use crate::limiter::Limiter;
use crate::limiter::pace::Pacer;
use crate::middleware::body::{AfterBody, Ending};
use crate::model::key::Key;

/// The pacers a response body takes when it comes; nothing else (the body's end is the
/// pacers' business: dropped with it, they give back what they took and did not use).
/// (In a mutex only to be `Sync` as a guard must: it is reached through `&mut`, never
/// locked.)
pub(crate) struct PaceGuard(Mutex<Vec<Pacer>>);

impl AfterBody for PaceGuard {
    fn trailers(&mut self, _trailers: &HeaderMap) {}

    fn ended(&mut self, _ending: Ending) {}

    fn take_pacers(&mut self) -> Vec<Pacer> {
        std::mem::take(self.0.get_mut().unwrap_or_else(PoisonError::into_inner))
    }
}

impl PaceGuard {
    /// The pacers of `keys` (the limits' names, units and the request's keys), from
    /// `limiter`, each taking at least 64 KiB of tokens per store call (a Redis round trip
    /// per 64 KiB at most) and recording its refusals in `audit` (the log, the route, the
    /// client) if the layer has an audit log; `None` when there are none.
    pub(crate) fn boxed<'a>(
        limiter: impl FnOnce() -> Limiter,
        keys: impl ExactSizeIterator<Item = (&'a str, u32, Key)>,
        audit: Option<(AuditLog, &str, Option<IpAddr>)>,
    ) -> Option<Box<dyn AfterBody>> {
        if keys.len() == 0 {
            return None;
        }
        let limiter = limiter();
        // The limits were checked when the layer was built (bytes, out, an algorithm a
        // pacer takes): each makes its pacer.
        let pacers: Vec<Pacer> = keys
            .filter_map(|(name, unit, key)| {
                let pacer = limiter.pacer(name, key).ok()?.batch(BATCH / unit.max(1));
                Some(match &audit {
                    Some((log, route, client)) => pacer.audit(log.clone(), route, *client),
                    None => pacer,
                })
            })
            .collect();
        (!pacers.is_empty()).then(|| Box::new(PaceGuard(Mutex::new(pacers))) as Box<dyn AfterBody>)
    }
}

/// The bytes a routed pacer takes per store call, at least (its burst at most).
const BATCH: u32 = 64 << 10;
