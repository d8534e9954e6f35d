//! [`PaceGuard`]: the pacers of a request's limits of bytes on its route (a rules file's
//! `per = "byte"` with `routes`), made when the request passes, keyed as the layer keys
//! it: those of bytes sent handed to its response body
//! ([`Follow::paced`](crate::service::Follow::paced)), those of bytes received wrapped
//! around its request body ([`paced_request`]) before the service reads it.

use std::any::{Any, TypeId};
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use http::HeaderMap;

use crate::audit::AuditLog;

use crate::limiter::Limiter;
use crate::limiter::pace::Pacer;
use crate::middleware::body::{AfterBody, Ending, Follow};
use crate::middleware::pace::PacedBody;
use crate::model::key::Key;
use crate::model::stream::Direction;
use crate::web::policy::Paces;

/// Which bodies the layer can pace over a service of `ReqBody` requests and `ResBody`
/// responses: its responses' (the response body type's [`Follow::PACES`]) and its
/// requests' ([`paces_requests`]).
#[inline]
pub(crate) fn paces<ReqBody: 'static, ResBody: Follow>() -> Paces {
    Paces {
        responses: ResBody::PACES,
        requests: paces_requests::<ReqBody>(),
    }
}

/// Whether the layer paces request bodies of type `B`: axum's (`axum::body::Body`) and,
/// with the `grpc` feature, tonic's. The layer keeps a request's body type, so it can
/// wrap only a body type that holds any body (its pacer's [`PacedBody`] inside one of its
/// own); over another, a route it would pace is refused (see `Policy::paced_keys`).
pub(crate) fn paces_requests<B: 'static>() -> bool {
    let t = TypeId::of::<B>();
    #[cfg(feature = "grpc")]
    if t == TypeId::of::<tonic::body::Body>() {
        return true;
    }
    t == TypeId::of::<axum_core::body::Body>()
}

/// `body` paced by each of `pacers` (one per limit of bytes received on its route), if
/// its type is one [`paces_requests`] names; as it is otherwise (the layer refused the
/// request before it could come here).
pub(crate) fn paced_request<B: 'static>(body: B, pacers: Vec<Pacer>) -> B {
    let mut slot = Some(body);
    let mut pacers = Some(pacers);
    if let Some(b) = (&mut slot as &mut dyn Any).downcast_mut::<Option<axum_core::body::Body>>()
        && let Some(p) = pacers.take()
    {
        wrap(b, p, axum_core::body::Body::new);
    }
    #[cfg(feature = "grpc")]
    if let Some(b) = (&mut slot as &mut dyn Any).downcast_mut::<Option<tonic::body::Body>>()
        && let Some(p) = pacers.take()
    {
        wrap(b, p, tonic::body::Body::new);
    }
    slot.expect("the body is put back")
}

/// The body in `slot` inside a [`PacedBody`] of each of `pacers`, made a `T` again by `new`.
fn wrap<T>(slot: &mut Option<T>, pacers: Vec<Pacer>, new: fn(PacedBody<T>) -> T) {
    if let Some(body) = slot.take() {
        *slot = Some(
            pacers
                .into_iter()
                .fold(body, |body, pacer| new(PacedBody::new(body, pacer))),
        );
    }
}

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
    /// The pacers of `keys` (the limits' names, units, directions and the request's keys),
    /// from `limiter`, each taking at least 64 KiB of tokens per store call (a Redis round
    /// trip per 64 KiB at most) and recording its refusals in `audit` (the log, the route,
    /// the client) if the layer has an audit log: those of bytes sent in a guard for the
    /// response body (`None` when there are none), those of bytes received for the
    /// request body. A limit of both directions gives one to each (siblings: one bucket,
    /// one charge under way per direction).
    pub(crate) fn pacers<'a>(
        limiter: impl FnOnce() -> Limiter,
        keys: impl ExactSizeIterator<Item = (&'a str, u32, Direction, Key)>,
        audit: Option<(AuditLog, &str, Option<IpAddr>)>,
    ) -> (Option<Box<dyn AfterBody>>, Vec<Pacer>) {
        if keys.len() == 0 {
            return (None, Vec::new());
        }
        let limiter = limiter();
        let (mut sent, mut received) = (Vec::new(), Vec::new());
        // The limits were checked when the layer was built (bytes, an algorithm a pacer
        // takes): each makes its pacer.
        for (name, unit, direction, key) in keys {
            let Ok(pacer) = limiter.pacer(name, key) else {
                continue;
            };
            let pacer = pacer.batch(BATCH / unit.max(1));
            let pacer = match &audit {
                Some((log, route, client)) => pacer.audit(log.clone(), route, *client),
                None => pacer,
            };
            match (direction.counts_in(), direction.counts_out()) {
                (true, true) => {
                    sent.push(pacer.sibling());
                    received.push(pacer);
                }
                (true, false) => received.push(pacer),
                _ => sent.push(pacer),
            }
        }
        let guard =
            (!sent.is_empty()).then(|| Box::new(PaceGuard(Mutex::new(sent))) as Box<dyn AfterBody>);
        (guard, received)
    }
}

/// The bytes a routed pacer takes per store call, at least (its burst at most).
const BATCH: u32 = 64 << 10;

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// axum's body (and tonic's, with `grpc`) is paced; hyper's and others are not.
    #[test]
    fn the_layer_paces_the_request_bodies_of_axum_and_tonic() {
        assert!(paces_requests::<axum_core::body::Body>());
        #[cfg(feature = "grpc")]
        assert!(paces_requests::<tonic::body::Body>());
        assert!(!paces_requests::<http_body_util::Full<bytes::Bytes>>());
        assert!(!paces_requests::<()>());
        let p = paces::<axum_core::body::Body, http_body_util::Full<bytes::Bytes>>();
        assert_eq!(
            p,
            Paces {
                responses: false,
                requests: true
            }
        );
    }

    /// An axum body is read through its pacer: 1,100 bytes of a limit of 1,000 a second
    /// with a burst of 100 take 1 s; another body type comes back as it was.
    #[tokio::test(start_paused = true)]
    async fn a_request_body_is_wrapped_in_its_pacers() {
        let limiter = crate::middleware::body::tests::pacing();
        let pacer = || limiter.pacer("bytes", "k").unwrap();
        let body = axum_core::body::Body::from(vec![1u8; 1_100]);
        let start = tokio::time::Instant::now();
        let paced = paced_request(body, vec![pacer()]);
        assert_eq!(paced.collect().await.unwrap().to_bytes().len(), 1_100);
        let elapsed = start.elapsed();
        assert!(
            elapsed >= std::time::Duration::from_secs(1)
                && elapsed < std::time::Duration::from_millis(1_050),
            "{elapsed:?}"
        );
        let plain = http_body_util::Full::new(bytes::Bytes::from_static(b"abc"));
        let same = paced_request(plain, vec![pacer()]);
        assert_eq!(&same.collect().await.unwrap().to_bytes()[..], b"abc");
    }
}
