//! [`ResponseFuture`]: the response of a [`RateLimit`](crate::service::RateLimit) service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use smallvec::SmallVec;
use tower_service::Service;

use crate::engine::queue::{self, Ticket};
use crate::middleware::body::{AfterBody, Follow, ResponseBody};
use crate::middleware::guard::{DelayGuard, PendingCharge};
use crate::middleware::routed::paces;
use crate::middleware::shared::{Passed, Version, insert_limiter, proceed};
use crate::store::Store;
use crate::store::{Checked, Item};
use crate::web::headers::Fields;
use crate::web::policy::{Early, QueueAt};
use crate::web::policy::{Paces, Prepared};
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
        // Delay mode of in-flight limits: the request's places, if it waits already.
        queued: Option<Queued>,
    }
}

pin_project! {
    /// Delay mode of in-flight limits: a request waiting for a unit of its key. Boxed, as
    /// [`Waiting`].
    struct InQueue<S, St, R, ReqBody>
    where
        St: Store,
    {
        #[pin]
        wait: Pin<Box<dyn Future<Output = ()> + Send>>,
        waited: bool,
        service: S,
        version: Arc<Version<St, R>>,
        request: Option<(Parts, ReqBody)>,
        queued: Option<Queued>,
    }
}

/// A request's places in the queues of its in-flight limits, and when it stops waiting.
pub(crate) struct Queued {
    tickets: SmallVec<[Ticket; 1]>,
    deadline: tokio::time::Instant,
    /// Past the deadline: the check is the last one, and refuses as usual.
    last: bool,
}

impl Queued {
    /// Places in the queues `at` (the shortest `max_wait` of them), or `None` if one is
    /// full.
    fn enter<St: Store>(engine: &crate::engine::Engine<St>, at: &QueueAt) -> Option<Self> {
        let mut tickets = SmallVec::new();
        let mut max_wait = std::time::Duration::MAX;
        for &(bound, key) in at {
            let q = engine.bounds[bound].queue.as_ref()?;
            tickets.push(q.enter(key)?);
            max_wait = max_wait.min(q.max_wait);
        }
        let now = tokio::time::Instant::now();
        Some(Self {
            tickets,
            deadline: now.checked_add(max_wait).unwrap_or(now),
            last: false,
        })
    }

    /// What the request waits for now: a wake of its first queue, or a poll.
    fn wait(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let notify = self.tickets.first().map(Ticket::notifier);
        let deadline = self.deadline;
        Box::pin(async move {
            let until = deadline.min(tokio::time::Instant::now() + queue::POLL);
            match notify {
                Some(n) => {
                    let _ = tokio::time::timeout_at(until, n.notified()).await;
                }
                None => tokio::time::sleep_until(until).await,
            }
        })
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
        Queueing {
            queued: Pin<Box<InQueue<S, St, R, ReqBody>>>,
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

impl<S, St, R, ReqBody, ResBody> ResponseFuture<S, St, R, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
    R: OnRejection<ResBody> + Send + Sync + 'static,
    ReqBody: 'static,
{
    /// A request through the limits of `version` (the one current when it arrived) and
    /// then `inner` (made ready). `queued`: its places in the queues of in-flight limits
    /// in delay mode, when it checks again after waiting there.
    pub(crate) fn start(
        version: &Arc<Version<St, R>>,
        inner: &mut S,
        req: Request<ReqBody>,
        queued: Option<Queued>,
        paces: Paces,
    ) -> Self {
        let (mut parts, body) = req.into_parts();
        let shared = &version.shared;
        let engine = &*shared.engine;
        let mut items = SmallVec::<[Item<'_, St::Table>; 4]>::new();
        let mut prepared = Prepared::empty();
        match shared
            .policy
            .prepare(engine, &parts, &mut items, &mut prepared, paces)
        {
            Ok(()) => {}
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
        // Requests of its key wait already: behind them, without a check.
        let queues = shared.policy.queues(&prepared);
        if queues
            && queued.is_none()
            && let Some(at) = shared.policy.waiting_ahead(engine, &prepared)
            && let Some(places) = Queued::enter(engine, &at)
        {
            drop(items);
            return Self::queue(version, inner, parts, body, places);
        }
        match engine.check(&items) {
            Checked::Ready(statuses) => {
                if queues && let Some(places) = Self::requeue(version, &prepared, &statuses, queued)
                {
                    drop(items);
                    return Self::queue(version, inner, parts, body, places);
                }
                let next = proceed(version, &mut prepared, statuses, &mut parts, &items[..]);
                drop(items);
                match next {
                    Ok(mut passed) if passed.delay.is_none() => {
                        let body = passed.pace(body);
                        let future = inner.call(Request::from_parts(parts, body));
                        ResponseFuture::calling(future, passed.fields, passed.charge, passed.after)
                    }
                    // Delay mode: the readied service is let go (whatever its readiness
                    // holds, a concurrency permit, goes back); the waiting request gets a
                    // clone, made ready once its wait is over. The next call is made ready
                    // again, as every call is.
                    Ok(passed) => {
                        let clone = inner.clone();
                        let readied = std::mem::replace(inner, clone);
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
                let service = std::mem::replace(inner, clone);
                ResponseFuture::checking(
                    check,
                    service,
                    version.clone(),
                    prepared,
                    keys,
                    (parts, body),
                    queued,
                )
            }
        }
    }

    /// Whether a request the store refused waits (again) in the queues of its in-flight
    /// limits: its places (those it has, or new ones), unless a limit that does not queue
    /// refused it, a queue is full, or its wait is over.
    fn requeue(
        version: &Version<St, R>,
        prepared: &Prepared,
        statuses: &crate::store::Statuses,
        queued: Option<Queued>,
    ) -> Option<Queued> {
        let engine = &*version.shared.engine;
        let at = version
            .shared
            .policy
            .queue_for(engine, prepared, statuses)?;
        match queued {
            Some(q) if q.last => None,
            Some(q) => {
                for t in &q.tickets {
                    t.rearm();
                }
                Some(q)
            }
            None => Queued::enter(engine, &at),
        }
    }

    /// The request waits in its queues, without the readied service (a clone is made ready
    /// when it checks again).
    fn queue(
        version: &Arc<Version<St, R>>,
        inner: &mut S,
        parts: Parts,
        body: ReqBody,
        places: Queued,
    ) -> Self {
        let unready = inner.clone();
        Self {
            state: State::Queueing {
                queued: Box::pin(InQueue {
                    wait: places.wait(),
                    waited: false,
                    service: unready,
                    version: version.clone(),
                    request: Some((parts, body)),
                    queued: Some(places),
                }),
            },
        }
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

    #[inline(always)]
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
    pub(crate) fn passed(
        mut passed: Passed<St>,
        mut service: S,
        parts: Parts,
        body: ReqBody,
    ) -> Self
    where
        S: Clone,
        ReqBody: 'static,
    {
        let body = passed.pace(body);
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
        (parts, body): (Parts, ReqBody),
        queued: Option<Queued>,
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
                    queued,
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
    ReqBody: 'static,
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
                    let mut prepared = w.prepared.take().expect("prepared once");
                    if w.version.shared.policy.queues(&prepared)
                        && let Some(places) =
                            Self::requeue(w.version, &prepared, &statuses, w.queued.take())
                    {
                        let mut service = w.service.take().expect("service taken once");
                        let next = Self::queue(w.version, &mut service, parts, body, places);
                        state.set(next.state);
                        continue;
                    }
                    match proceed(w.version, &mut prepared, statuses, &mut parts, &w.keys[..]) {
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
                StateProj::Queueing { queued } => {
                    let q = queued.as_mut().project();
                    if !*q.waited {
                        ready!(q.wait.poll(cx));
                        *q.waited = true;
                    }
                    ready!(q.service.poll_ready(cx))?;
                    let mut places = q.queued.take().expect("checked once per wait");
                    places.last = tokio::time::Instant::now() >= places.deadline;
                    let (parts, body) = q.request.take().expect("checked once per wait");
                    let version = q.version.clone();
                    let next = Self::start(
                        &version,
                        q.service,
                        Request::from_parts(parts, body),
                        Some(places),
                        paces::<ReqBody, ResBody>(),
                    );
                    state.set(next.state);
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
                    let mut pacers = Vec::new();
                    if let Some(after) = after.as_mut() {
                        after.head(response.status(), response.headers(), response.extensions());
                        pacers = after.take_pacers();
                    }
                    return Poll::Ready(Ok(response.map(|body| match after {
                        Some(after) if !pacers.is_empty() => {
                            ResBody::paced(ResponseBody::with_after(body, Some(after)), pacers)
                        }
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
