//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::middleware::body::Follow;
use crate::middleware::future::ResponseFuture;
use crate::middleware::routed::paces;
use crate::middleware::source::Source;
use crate::store::Store;
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
    ReqBody: 'static,
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
        self.source.with_version(|version| {
            ResponseFuture::start(version, inner, req, None, paces::<ReqBody, ResBody>())
        })
    }
}
