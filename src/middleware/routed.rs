//! [`PaceGuard`]: the pacers of a request's limits of bytes on its route (a rules file's
//! `per = "byte"` with `routes`), made when the request passes, keyed as the layer keys
//! it, and handed to its response body ([`Follow::paced`](crate::service::Follow::paced)).

use std::sync::{Mutex, PoisonError};

use http::HeaderMap;

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
    /// The pacers of `keys` (bound names and the request's keys), from `limiter`; `None`
    /// when there are none.
    pub(crate) fn boxed<'a>(
        limiter: impl FnOnce() -> Limiter,
        keys: impl ExactSizeIterator<Item = (&'a str, Key)>,
    ) -> Option<Box<dyn AfterBody>> {
        if keys.len() == 0 {
            return None;
        }
        let limiter = limiter();
        // The limits were checked when the layer was built (bytes, out, an algorithm a
        // pacer takes): a pacer is made for each.
        let pacers: Vec<Pacer> = keys
            .filter_map(|(name, key)| limiter.pacer(name, key).ok())
            .collect();
        (!pacers.is_empty()).then(|| Box::new(PaceGuard(Mutex::new(pacers))) as Box<dyn AfterBody>)
    }
}
