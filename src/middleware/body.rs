//! [`ResponseBody`]: the body of a response that went through a
//! [`RateLimit`](crate::service::RateLimit) service. It streams the inner body unchanged and
//! tells the request's after-response guard (an in-flight slot to free, a cost to settle)
//! what happened to it: its trailers, then its end — complete, failed, or dropped before its
//! end (the client went away, a timeout). Responses without such a guard carry `None`: no
//! allocation, one branch per frame.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::limiter::pace::Pacer;
use crate::middleware::pace::PacedBody;

/// How a response body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Its last frame was read.
    Complete,
    /// The inner body returned an error.
    Failed,
    /// Dropped before its end (or the response was never sent).
    Dropped,
}

/// What a request holds until its response body ends. `ended` is called at most once, by
/// the body at its end or by its drop; a guard dropped without it (the service failed, the
/// response future was dropped) gives back what it holds in its own `Drop`.
pub(crate) trait AfterBody: Send + Sync + 'static {
    /// The response's head, once, when the service answers (before its body streams).
    fn head(
        &mut self,
        _status: http::StatusCode,
        _headers: &HeaderMap,
        _extensions: &http::Extensions,
    ) {
    }
    /// The response's trailers, as they pass.
    fn trailers(&mut self, trailers: &HeaderMap);
    /// The body ended (or was dropped).
    fn ended(&mut self, ending: Ending);
    /// The pacers of the limits of bytes that pace this response's body (taken once,
    /// when the response comes).
    fn take_pacers(&mut self) -> Vec<Pacer> {
        Vec::new()
    }
}

pin_project! {
    /// The response body of a rate-limited service: the inner body, streamed unchanged.
    ///
    /// Limits that hold something for as long as a response streams
    /// ([`Limit::in_flight`](crate::Limit::in_flight) slots) give it back when this body
    /// ends, fails or is dropped, not when the handler returns. For axum, hyper and tonic it
    /// is a body like any other (`http_body::Body` with the inner body's data and error).
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// use tollgate::service::ResponseBody;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let body = ResponseBody::new(http_body_util::Full::new(bytes::Bytes::from("hi")));
    /// assert_eq!(body.collect().await.unwrap().to_bytes(), "hi");
    /// # });
    /// ```
    pub struct ResponseBody<B> {
        // `None` once dropped: the inner body goes first, then the guard is told, so
        // whatever the body held (a stream's work) is over when its slot frees.
        #[pin]
        inner: Option<B>,
        after: Option<Box<dyn AfterBody>>,
    }

    impl<B> PinnedDrop for ResponseBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if let Some(mut after) = this.after.take() {
                this.inner.set(None);
                after.ended(Ending::Dropped);
            }
        }
    }
}

impl<B> ResponseBody<B> {
    /// `inner`, with nothing to give back at its end.
    pub fn new(inner: B) -> Self {
        Self {
            inner: Some(inner),
            after: None,
        }
    }

    /// Whether something is told of this body's end (an in-flight unit, a cost to
    /// settle): a body that holds nothing may be dropped at any time.
    #[cfg(feature = "rules")]
    pub(crate) fn follows(&self) -> bool {
        self.after.is_some()
    }

    /// `inner`, with `after` told of its end.
    pub(crate) fn with_after(inner: B, after: Option<Box<dyn AfterBody>>) -> Self {
        Self {
            inner: Some(inner),
            after,
        }
    }
}

/// A response body type the layer answers with: the body as it is when nothing follows
/// it, or, for a request that holds something until its response ends (an in-flight
/// unit, a cost to settle), a [`ResponseBody`] that follows it to its end.
///
/// axum's body (whatever the features) and tonic's (feature `grpc`) stay what they are: a
/// followed one is boxed into them (`Body::new`), so the layer's responses have the inner
/// service's type and a request that holds nothing allocates nothing. Other bodies answer `ResponseBody<B>` (implemented for
/// `http_body_util`'s `Full`, `Empty`, `BoxBody` and `UnsyncBoxBody`). A body type of
/// your own takes three lines:
///
/// ```
/// use tollgate::service::{Follow, ResponseBody};
///
/// struct MyBody;
///
/// impl Follow for MyBody {
///     type Body = ResponseBody<MyBody>;
///     fn plain(self) -> Self::Body { ResponseBody::new(self) }
///     fn follow(body: ResponseBody<Self>) -> Self::Body { body }
/// }
/// ```
///
/// A limit of bytes sent given routes ([`Limit::per`](crate::Limit::per) `Per::Byte`,
/// `direction = "out"` or `"both"`) paces the response bodies of its routes: the layer
/// does so for bodies whose `Follow` says [`PACES`](Follow::PACES) (axum's and tonic's).
/// Over another body type a request such a limit would pace is answered `500` before the
/// service is called (and the misconfiguration logged): wrap that body in
/// [`PacedBody`](crate::pace::PacedBody) in the handler instead. (Request bodies are
/// paced likewise when they are axum's or tonic's, whatever this trait says.)
pub trait Follow: Sized {
    /// The body of the layer's responses.
    type Body;
    /// Whether [`paced`](Follow::paced) paces (`false` by default: the layer refuses
    /// to serve a route it would pace over this body type, rather than let its bytes
    /// through unpaced).
    const PACES: bool = false;
    /// The body, followed by nothing.
    fn plain(self) -> Self::Body;
    /// The body, followed to its end.
    fn follow(body: ResponseBody<Self>) -> Self::Body;
    /// The body, followed to its end, its bytes paced by each of `pacers` (one per limit
    /// of bytes on its route). Called only when [`PACES`](Follow::PACES) is `true`; the
    /// default, for bodies that do not pace, is [`follow`](Follow::follow).
    fn paced(body: ResponseBody<Self>, pacers: Vec<Pacer>) -> Self::Body {
        drop(pacers);
        Self::follow(body)
    }
}

/// `Self`'s `Follow` as `ResponseBody<Self>`.
macro_rules! follow_wrapped {
    ($($t:ty),* $(,)?) => {$(
        impl<D, E> Follow for $t {
            type Body = ResponseBody<$t>;
            fn plain(self) -> Self::Body {
                ResponseBody::new(self)
            }
            fn follow(body: ResponseBody<Self>) -> Self::Body {
                body
            }
        }
    )*};
}

follow_wrapped!(
    http_body_util::combinators::BoxBody<D, E>,
    http_body_util::combinators::UnsyncBoxBody<D, E>,
);

impl<D> Follow for http_body_util::Full<D> {
    type Body = ResponseBody<Self>;
    fn plain(self) -> Self::Body {
        ResponseBody::new(self)
    }
    fn follow(body: ResponseBody<Self>) -> Self::Body {
        body
    }
}

impl<D> Follow for http_body_util::Empty<D> {
    type Body = ResponseBody<Self>;
    fn plain(self) -> Self::Body {
        ResponseBody::new(self)
    }
    fn follow(body: ResponseBody<Self>) -> Self::Body {
        body
    }
}

/// axum's body (`axum::body::Body`), whether or not the `axum` feature is on.
impl Follow for axum_core::body::Body {
    type Body = Self;
    const PACES: bool = true;
    fn plain(self) -> Self {
        self
    }
    fn follow(body: ResponseBody<Self>) -> Self {
        axum_core::body::Body::new(body)
    }
    fn paced(body: ResponseBody<Self>, pacers: Vec<Pacer>) -> Self {
        pacers
            .into_iter()
            .fold(axum_core::body::Body::new(body), |body, pacer| {
                axum_core::body::Body::new(PacedBody::new(body, pacer))
            })
    }
}

#[cfg(feature = "grpc")]
impl Follow for tonic::body::Body {
    type Body = Self;
    const PACES: bool = true;
    fn plain(self) -> Self {
        self
    }
    fn follow(body: ResponseBody<Self>) -> Self {
        tonic::body::Body::new(body)
    }
    fn paced(body: ResponseBody<Self>, pacers: Vec<Pacer>) -> Self {
        pacers
            .into_iter()
            .fold(tonic::body::Body::new(body), |body, pacer| {
                tonic::body::Body::new(PacedBody::new(body, pacer))
            })
    }
}

impl<B: Default> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::new(B::default())
    }
}

impl<B: Body> Body for ResponseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let Some(mut inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(None);
        };
        let frame = ready!(inner.as_mut().poll_frame(cx));
        let Some(after) = this.after.as_mut() else {
            return Poll::Ready(frame);
        };
        let ending = match &frame {
            None => Some(Ending::Complete),
            Some(Err(_)) => Some(Ending::Failed),
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    after.trailers(trailers);
                }
                None
            }
        };
        let ending = ending.or_else(|| inner.is_end_stream().then_some(Ending::Complete));
        if let Some(ending) = ending
            && let Some(mut after) = this.after.take()
        {
            after.ended(ending);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(B::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), B::size_hint)
    }
}

impl<B: fmt::Debug> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("inner", &self.inner)
            .field("following", &self.after.is_some())
            .finish()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};

    use super::*;

    #[derive(Default, Clone)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl AfterBody for Seen {
        fn trailers(&mut self, trailers: &HeaderMap) {
            let value = trailers
                .get("x-usage")
                .map(|v| v.to_str().unwrap().to_owned());
            self.0.lock().unwrap().push(format!("trailers {value:?}"));
        }
        fn ended(&mut self, ending: Ending) {
            self.0.lock().unwrap().push(format!("{ending:?}"));
        }
    }

    fn followed<B>(inner: B, seen: &Seen) -> ResponseBody<B> {
        ResponseBody::with_after(inner, Some(Box::new(seen.clone())))
    }

    /// `Follow` for `http_body_util::Empty` keeps what follows the body: it ends when
    /// the body is read, not when the response is built.
    #[tokio::test]
    async fn an_empty_body_is_followed_to_its_end() {
        let seen = Seen::default();
        let body = <http_body_util::Empty<Bytes> as Follow>::follow(followed(
            http_body_util::Empty::new(),
            &seen,
        ));
        assert!(seen.0.lock().unwrap().is_empty(), "nothing ended yet");
        body.collect().await.unwrap();
        assert_eq!(*seen.0.lock().unwrap(), ["Complete"]);
    }

    /// axum's body stays axum's: as it is when nothing follows it, boxed with what
    /// follows it otherwise; its bytes unchanged either way.
    #[tokio::test]
    async fn an_axum_body_keeps_its_bytes_and_is_followed_to_its_end() {
        use axum_core::body::Body as AxumBody;
        let plain = Follow::plain(AxumBody::from("plain"));
        assert_eq!(plain.collect().await.unwrap().to_bytes(), "plain");
        let seen = Seen::default();
        let body = <AxumBody as Follow>::follow(followed(AxumBody::from("followed"), &seen));
        assert!(seen.0.lock().unwrap().is_empty(), "nothing ended yet");
        assert_eq!(body.collect().await.unwrap().to_bytes(), "followed");
        assert_eq!(*seen.0.lock().unwrap(), ["Complete"]);
    }

    /// tonic's body too (feature `grpc`).
    #[cfg(feature = "grpc")]
    #[tokio::test]
    async fn a_tonic_body_keeps_its_bytes_and_is_followed_to_its_end() {
        use tonic::body::Body as TonicBody;
        let plain = Follow::plain(TonicBody::new(Full::new(Bytes::from("plain"))));
        assert_eq!(plain.collect().await.unwrap().to_bytes(), "plain");
        let seen = Seen::default();
        let inner = TonicBody::new(Full::new(Bytes::from("followed")));
        let body = <TonicBody as Follow>::follow(followed(inner, &seen));
        assert!(seen.0.lock().unwrap().is_empty(), "nothing ended yet");
        assert_eq!(body.collect().await.unwrap().to_bytes(), "followed");
        assert_eq!(*seen.0.lock().unwrap(), ["Complete"]);
    }

    /// Tokio's (paused) clock, for the store of paced bodies.
    #[derive(Clone)]
    struct Tokio(tokio::time::Instant);

    impl crate::base::clock::Clock for Tokio {
        fn now(&self) -> u64 {
            1_000_000_000_000 + self.0.elapsed().as_nanos() as u64
        }
    }

    /// `bytes`: 1,000 a second, 100 at once; `slow`: 500 a second, 100 at once.
    pub(crate) fn pacing() -> crate::limiter::Limiter {
        use crate::algo::quota::Quota;
        use crate::model::spec::LimitSpec;
        crate::limiter::Limiter::builder(crate::store::MemoryStore::with_clock(Tokio(
            tokio::time::Instant::now(),
        )))
        .limit(LimitSpec::new("bytes", Quota::per_second(1_000).burst(100)))
        .limit(LimitSpec::new("slow", Quota::per_second(500).burst(100)))
        .build()
        .unwrap()
    }

    /// axum's body paced (a routed limit of bytes): its bytes at the pacer's rate, and
    /// still followed to its end.
    #[tokio::test(start_paused = true)]
    async fn an_axum_body_is_paced_and_followed_to_its_end() {
        use axum_core::body::Body as AxumBody;
        const { assert!(<AxumBody as Follow>::PACES) };
        let limiter = pacing();
        let seen = Seen::default();
        let start = tokio::time::Instant::now();
        let body = <AxumBody as Follow>::paced(
            followed(AxumBody::from(vec![1u8; 600]), &seen),
            vec![limiter.pacer("bytes", "a").unwrap()],
        );
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 600);
        // 100 at once, 500 at 1,000 a second.
        let elapsed = start.elapsed();
        assert!((500..=520).contains(&elapsed.as_millis()), "{elapsed:?}");
        assert_eq!(*seen.0.lock().unwrap(), ["Complete"]);
    }

    /// tonic's body paced by two limits at once: the slower one sets the pace.
    #[cfg(feature = "grpc")]
    #[tokio::test(start_paused = true)]
    async fn a_tonic_body_is_paced_by_each_of_its_pacers() {
        use tonic::body::Body as TonicBody;
        const { assert!(<TonicBody as Follow>::PACES) };
        let limiter = pacing();
        let seen = Seen::default();
        let start = tokio::time::Instant::now();
        let inner = TonicBody::new(Full::new(Bytes::from(vec![1u8; 600])));
        let body = <TonicBody as Follow>::paced(
            followed(inner, &seen),
            vec![
                limiter.pacer("bytes", "a").unwrap(),
                limiter.pacer("slow", "a").unwrap(),
            ],
        );
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 600);
        // 100 at once, 500 at 500 a second.
        let elapsed = start.elapsed();
        assert!(
            (1_000..=1_040).contains(&elapsed.as_millis()),
            "{elapsed:?}"
        );
        assert_eq!(*seen.0.lock().unwrap(), ["Complete"]);
    }

    /// Bodies that do not say they pace are not paced by the layer (it refuses their
    /// routes instead): the default `paced` only follows.
    #[test]
    fn a_body_that_does_not_pace_says_so() {
        const { assert!(!<Full<Bytes> as Follow>::PACES) };
        const { assert!(!<http_body_util::Empty<Bytes> as Follow>::PACES) };
    }

    #[test]
    fn the_debug_form_says_whether_the_body_is_followed() {
        let plain = ResponseBody::new(http_body_util::Empty::<Bytes>::new());
        assert_eq!(
            format!("{plain:?}"),
            "ResponseBody { inner: Some(Empty), following: false }"
        );
        let body = followed(http_body_util::Empty::<Bytes>::new(), &Seen::default());
        assert!(format!("{body:?}").ends_with("following: true }"));
    }

    /// A followed body ends where its inner body does (hyper reads no further).
    #[tokio::test]
    async fn a_body_ends_where_its_inner_body_does() {
        let empty = ResponseBody::new(http_body_util::Empty::<Bytes>::new());
        assert!(empty.is_end_stream());
        let mut full = followed(Full::new(Bytes::from("x")), &Seen::default());
        assert!(!full.is_end_stream());
        full.frame().await.unwrap().unwrap();
        assert!(full.is_end_stream());
    }

    #[tokio::test]
    async fn a_complete_body_ends_once_with_its_trailers_first() {
        let seen = Seen::default();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-usage", "42".parse().unwrap());
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
            Ok(Frame::data(Bytes::from("a"))),
            Ok(Frame::data(Bytes::from("b"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = followed(StreamBody::new(futures_util::stream::iter(frames)), &seen);
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["x-usage"], "42");
        assert_eq!(
            *seen.0.lock().unwrap(),
            ["trailers Some(\"42\")", "Complete"]
        );
    }

    #[tokio::test]
    async fn a_body_that_knows_its_end_ends_on_its_last_frame() {
        let seen = Seen::default();
        let mut body = followed(Full::new(Bytes::from("x")), &seen);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "x");
        // Ended with the last frame, before anyone polls past it.
        assert_eq!(*seen.0.lock().unwrap(), ["Complete"]);
        drop(body);
        assert_eq!(*seen.0.lock().unwrap(), ["Complete"]);
    }

    #[tokio::test]
    async fn a_failing_body_ends_failed() {
        let seen = Seen::default();
        let frames: Vec<Result<Frame<Bytes>, &'static str>> =
            vec![Ok(Frame::data(Bytes::from("a"))), Err("reset")];
        let mut body = followed(StreamBody::new(futures_util::stream::iter(frames)), &seen);
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.unwrap().is_err());
        drop(body);
        assert_eq!(*seen.0.lock().unwrap(), ["Failed"]);
    }

    #[test]
    fn a_body_dropped_midway_ends_dropped() {
        let seen = Seen::default();
        let body = followed(Full::new(Bytes::from("never read")), &seen);
        drop(body);
        assert_eq!(*seen.0.lock().unwrap(), ["Dropped"]);
    }

    #[test]
    fn a_body_without_a_guard_is_the_inner_body() {
        let body = ResponseBody::new(Full::new(Bytes::from("abc")));
        assert_eq!(body.size_hint().exact(), Some(3));
        assert!(!body.is_end_stream());
    }
}
