//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use smallvec::SmallVec;
use tower_service::Service;

use crate::middleware::body::Follow;
use crate::middleware::future::ResponseFuture;
use crate::middleware::shared::{Version, insert_limiter, proceed};
use crate::middleware::source::Source;
use crate::store::{Checked, Item, Store};
use crate::web::headers::Fields;
use crate::web::policy::Early;
use crate::web::response::OnRejection;

/// The rate limiting middleware; made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// `poll_ready` only asks the inner service; the limits are checked in `call`. Its error
/// is the inner service's error: every outcome of the limiter is a response (429, 503,
/// 4xx or 500), never an error. Clones share all state.
pub struct RateLimit<S, St: Store, R> {
    pub(crate) inner: S,
    pub(crate) source: Source<St, R>,
}

impl<S, St: Store, R> RateLimit<S, St, R> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St: Store, R> Clone for RateLimit<S, St, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            source: self.source.clone(),
        }
    }
}

impl<S: fmt::Debug, St: Store, R> fmt::Debug for RateLimit<S, St, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, St, R, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, St, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
    R: OnRejection<ResBody> + Send + Sync + 'static,
    ResBody: Follow,
{
    type Response = Response<ResBody::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, St, R, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let inner = &mut self.inner;
        self.source
            .with_version(|version| call(version, inner, req))
    }
}

/// A request through the limits of `version` (the one current when it arrived) and then
/// `inner`.
fn call<S, St, R, ReqBody, ResBody>(
    version: &Arc<Version<St, R>>,
    inner: &mut S,
    req: Request<ReqBody>,
) -> ResponseFuture<S, St, R, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
    R: OnRejection<ResBody> + Send + Sync + 'static,
{
    let (mut parts, body) = req.into_parts();
    let shared = &version.shared;
    let engine = &*shared.engine;
    let mut items = SmallVec::<[Item<'_, St::Table>; 4]>::new();
    let prepared = match shared.policy.prepare(engine, &parts, &mut items) {
        Ok(prepared) => prepared,
        Err(Early::Pass) => {
            drop(items);
            insert_limiter(version, &mut parts);
            let future = inner.call(Request::from_parts(parts, body));
            return ResponseFuture::calling(future, Fields::default(), None, None);
        }
        Err(Early::Refuse(rejection)) => {
            return ResponseFuture::done(shared.early(&rejection));
        }
    };
    match engine.check(&items) {
        Checked::Ready(statuses) => {
            let next = proceed(version, prepared, statuses, &mut parts, &items[..]);
            drop(items);
            match next {
                Ok(passed) if passed.delay.is_none() => {
                    let future = inner.call(Request::from_parts(parts, body));
                    ResponseFuture::calling(future, passed.fields, passed.charge, passed.after)
                }
                // Delay mode: the readied service is let go (whatever its readiness holds,
                // a concurrency permit, goes back); the waiting request gets a clone, made
                // ready once its wait is over. The next call is made ready again, as every
                // call is.
                Ok(passed) => {
                    let clone = inner.clone();
                    let readied = mem::replace(inner, clone);
                    ResponseFuture::passed(passed, readied, parts, body)
                }
                Err(response) => ResponseFuture::done(response),
            }
        }
        Checked::Pending(check) => {
            let keys = shared.policy.hooks.keep_keys(&items);
            drop(items);
            // Take the service that was made ready; leave a clone for the next call.
            let clone = inner.clone();
            let service = mem::replace(inner, clone);
            ResponseFuture::checking(check, service, version.clone(), prepared, keys, parts, body)
        }
    }
}
