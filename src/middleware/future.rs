//! [`ResponseFuture`]: the response of a [`RateLimit`](crate::service::RateLimit) service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::middleware::body::{AfterBody, Follow, ResponseBody};
use crate::middleware::guard::{DelayGuard, PendingCharge};
use crate::middleware::shared::{Passed, Version, proceed};
use crate::store::Store;
use crate::web::headers::Fields;
use crate::web::policy::Prepared;
use crate::web::response::OnRejection;

type KeptKeys = smallvec::SmallVec<[crate::web::key::Key; 4]>;

pin_project! {
    /// The response future of [`RateLimit`](crate::service::RateLimit): waits for the store when it
    /// needs I/O, then for the service, and adds the rate-limit fields to its response.
    pub struct ResponseFuture<S, St, R, ReqBody>
    where
        S: Service<Request<ReqBody>>,
        St: Store,
    {
        #[pin]
        state: State<S, St, R, ReqBody>,
    }
}

pin_project! {
    /// A request waiting for the store. Boxed: only stores that do I/O need it, and the
    /// future of every request (which axum moves around) stays small.
    struct Waiting<S, St, R, ReqBody>
    where
        St: Store,
    {
        #[pin]
        check: St::Future,
        service: Option<S>,
        version: Arc<Version<St, R>>,
        prepared: Option<Prepared>,
        // The keys of the request's limits, if its refusal is logged or tracked.
        keys: KeptKeys,
        request: Option<(Parts, ReqBody)>,
    }
}

pin_project! {
    /// Delay mode: a request that waits for its reserved tokens. It holds a clone of the
    /// inner service that is not made ready until the wait is over, so no capacity of the
    /// inner service (a concurrency permit, a buffer slot) is held while it sleeps.
    /// Boxed, as [`Waiting`].
    struct Delayed<S, St, ReqBody>
    where
        St: Store,
    {
        #[pin]
        sleep: tokio::time::Sleep,
        service: S,
        request: Option<(Parts, ReqBody)>,
        fields: Fields,
        charge: PendingCharge<St>,
        // Gives the tokens back if the request goes away before its instant.
        guard: Option<DelayGuard<St>>,
        after: Option<Box<dyn AfterBody>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, St, R, ReqBody>
    where
        S: Service<Request<ReqBody>>,
        St: Store,
    {
        Checking {
            waiting: Pin<Box<Waiting<S, St, R, ReqBody>>>,
        },
        Delaying {
            delayed: Pin<Box<Delayed<S, St, ReqBody>>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            fields: Fields,
            // The costs to give back if the response does not count (or never comes).
            charge: PendingCharge<St>,
            // Held until the response body ends.
            after: Option<Box<dyn AfterBody>>,
        },
        Done {
            response: Option<S::Response>,
        },
    }
}

impl<S, St, R, ReqBody> ResponseFuture<S, St, R, ReqBody>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    pub(crate) fn done(response: S::Response) -> Self {
        Self {
            state: State::Done {
                response: Some(response),
            },
        }
    }

    pub(crate) fn calling(
        future: S::Future,
        fields: Fields,
        charge: PendingCharge<St>,
        after: Option<Box<dyn AfterBody>>,
    ) -> Self {
        Self {
            state: State::Calling {
                future,
                fields,
                charge,
                after,
            },
        }
    }

    /// A request that passed, on the `service` made ready for it: called now, or in
    /// delay mode after its wait.
    pub(crate) fn passed(passed: Passed<St>, mut service: S, parts: Parts, body: ReqBody) -> Self
    where
        S: Clone,
    {
        let Some((wait, guard)) = passed.delay else {
            let future = service.call(Request::from_parts(parts, body));
            return Self::calling(future, passed.fields, passed.charge, passed.after);
        };
        // Sleep without holding the readied service (whatever its readiness holds, a
        // concurrency permit, goes back now): a clone is made ready after the wait.
        let unready = service.clone();
        drop(service);
        Self {
            state: State::Delaying {
                delayed: Box::pin(Delayed {
                    sleep: tokio::time::sleep(wait),
                    service: unready,
                    request: Some((parts, body)),
                    fields: passed.fields,
                    charge: passed.charge,
                    guard: Some(*guard),
                    after: passed.after,
                }),
            },
        }
    }

    pub(crate) fn checking(
        check: St::Future,
        service: S,
        version: Arc<Version<St, R>>,
        prepared: Prepared,
        keys: KeptKeys,
        parts: Parts,
        body: ReqBody,
    ) -> Self {
        Self {
            state: State::Checking {
                waiting: Box::pin(Waiting {
                    check,
                    service: Some(service),
                    version,
                    prepared: Some(prepared),
                    keys,
                    request: Some((parts, body)),
                }),
            },
        }
    }
}

impl<S, St, R, ReqBody, ResBody> Future for ResponseFuture<S, St, R, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
    R: OnRejection<ResBody> + Send + Sync + 'static,
    ResBody: Follow,
{
    type Output = Result<Response<ResBody::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Checking { waiting } => {
                    let w = waiting.as_mut().project();
                    let statuses = ready!(w.check.poll(cx));
                    let (mut parts, body) = w
                        .request
                        .take()
                        .expect("ResponseFuture polled after completion");
                    let prepared = w.prepared.take().expect("prepared once");
                    match proceed(w.version, prepared, statuses, &mut parts, &w.keys[..]) {
                        Ok(passed) => {
                            let service = w.service.take().expect("service taken once");
                            let next = Self::passed(passed, service, parts, body);
                            state.set(next.state);
                        }
                        Err(response) => {
                            state.set(State::Done { response: None });
                            return Poll::Ready(Ok(response.map(Follow::plain)));
                        }
                    }
                }
                StateProj::Delaying { delayed } => {
                    let d = delayed.as_mut().project();
                    ready!(d.sleep.poll(cx));
                    if let Some(guard) = d.guard.take() {
                        // The instant has come: the tokens are this request's.
                        guard.admit();
                    }
                    ready!(d.service.poll_ready(cx))?;
                    let (parts, body) = d.request.take().expect("called once");
                    let future = d.service.call(Request::from_parts(parts, body));
                    let (fields, charge) = (std::mem::take(d.fields), d.charge.take());
                    let after = d.after.take();
                    state.set(State::Calling {
                        future,
                        fields,
                        charge,
                        after,
                    });
                }
                StateProj::Calling {
                    future,
                    fields,
                    charge,
                    after,
                } => {
                    // An error drops the charge guard, which gives the costs back.
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(charge) = charge.take() {
                        charge.settle(response.status(), response.headers());
                    }
                    std::mem::take(fields).apply(response.headers_mut());
                    let mut after = after.take();
                    if let Some(after) = after.as_mut() {
                        after.head(response.status(), response.headers(), response.extensions());
                    }
                    return Poll::Ready(Ok(response.map(|body| match after {
                        Some(after) => ResBody::follow(ResponseBody::with_after(body, Some(after))),
                        None => body.plain(),
                    })));
                }
                StateProj::Done { response } => {
                    return Poll::Ready(Ok(response
                        .take()
                        .expect("ResponseFuture polled after completion")
                        .map(Follow::plain)));
                }
            }
        }
    }
}

impl<S, St, R, ReqBody> fmt::Debug for ResponseFuture<S, St, R, ReqBody>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
