//! Messages of gRPC streams charged to limits (feature `grpc`): [`PacedMessages`], a body
//! whose length-prefixed gRPC messages are charged as they pass, and
//! [`StreamLimitLayer`], which puts it around the request (and response) bodies of the
//! streaming methods it names.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tonic::Code;
use tonic_types::{ErrorDetails, QuotaViolation, StatusExt};
use tower_layer::Layer;
use tower_service::Service;

use super::RATE_LIMIT_EXCEEDED;
use crate::base::round::ceil_ms;
use crate::limiter::Limiter;
use crate::limiter::pace::{PaceError, Pacer};
use crate::middleware::pace::{BoxError, held_hint, pull};
use crate::model::key::Key;
use crate::model::stream::Per;

/// Which end of a call a [`PacedMessages`] body is: a refusal ends a request body with an
/// error (the handler reads it as the call's status) and a response body with trailers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Request,
    Response,
}

/// Where the scan of length-prefixed messages is: in a message's 5-byte prefix (how many
/// of its bytes were seen, and the length so far), or in its payload (bytes left).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    Prefix { seen: u8, length: u32 },
    Payload { left: u64 },
}

impl Scan {
    const START: Self = Self::Prefix { seen: 0, length: 0 };
}

pin_project! {
    /// A gRPC body (request or response) whose messages are charged to a limit as they
    /// pass: one unit per message, or its length for a limit of bytes (the length on the
    /// wire: a compressed message counts its compressed bytes). Messages are found by
    /// their 5-byte prefix (compressed flag, length), across the body's frames however
    /// they are cut; each is charged when its prefix is complete, before any byte of its
    /// payload passes. It holds at most one frame of the inner body.
    ///
    /// Over the limit the pacer's [`OverLimit`](crate::pace::OverLimit) decides: `Wait`
    /// holds the message until it is due (the body is not read meanwhile: the peer's
    /// HTTP/2 flow control slows it); `End` (or a wait past `max_wait`) ends the call with
    /// `RESOURCE_EXHAUSTED`, `grpc-retry-pushback-ms` and the details a refused unary call
    /// gets (`RetryInfo`, `QuotaFailure`, `ErrorInfo`): a request body fails with that
    /// [`tonic::Status`] (the handler reading the stream gets it, and returns it as the
    /// call's status), a response body ends with it in its trailers.
    ///
    /// Usually put in place by [`StreamLimitLayer`].
    pub struct PacedMessages<B> {
        #[pin]
        inner: B,
        pacer: Pacer,
        end: End,
        // The rest of the inner body's current data frame.
        held: Bytes,
        scan: Scan,
        // The units of the message being charged (0: none).
        charging: u64,
        // The inner body ended, failed or was refused.
        done: bool,
    }
}

impl<B: fmt::Debug> fmt::Debug for PacedMessages<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedMessages")
            .field("inner", &self.inner)
            .field("pacer", &self.pacer)
            .field("held", &self.held.len())
            .field("scan", &self.scan)
            .finish()
    }
}

impl<B> PacedMessages<B> {
    /// A request body (what the client sends), its messages charged through `pacer`.
    pub fn request(inner: B, pacer: Pacer) -> Self {
        Self::new(inner, pacer, End::Request)
    }

    /// A response body (what the server sends), its messages charged through `pacer`.
    pub fn response(inner: B, pacer: Pacer) -> Self {
        Self::new(inner, pacer, End::Response)
    }

    fn new(inner: B, pacer: Pacer, end: End) -> Self {
        Self {
            inner,
            pacer,
            end,
            held: Bytes::new(),
            scan: Scan::START,
            charging: 0,
            done: false,
        }
    }
}

/// How many bytes of `data` pass before a message's payload whose units are not charged,
/// and the units to charge there (`None`: all of them pass), the scan moved past them.
fn advance(scan: &mut Scan, data: &[u8], per: Per) -> (usize, Option<u64>) {
    let mut at = 0;
    while at < data.len() {
        match scan {
            Scan::Prefix { seen, length } => {
                if *seen >= 1 {
                    *length = (*length << 8) | u32::from(data[at]);
                }
                *seen += 1;
                at += 1;
                if *seen == 5 {
                    let length = u64::from(*length);
                    *scan = Scan::Payload { left: length };
                    let units = match per {
                        Per::Byte => length,
                        _ => 1,
                    };
                    return (at, Some(units));
                }
            }
            Scan::Payload { left } => {
                let n = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(data.len() - at);
                *left -= n as u64;
                at += n;
                if *left == 0 {
                    *scan = Scan::START;
                }
            }
        }
    }
    (at, None)
}

/// The status that ends a call over the limit.
pub(crate) fn refused_status(refusal: &PaceError) -> tonic::Status {
    let mut details = ErrorDetails::new();
    let message = match refusal {
        PaceError::Refused(decision) => {
            if let Some(wait) = decision.retry_after() {
                details.set_retry_info(Some(wait));
            }
            let q = decision.quota();
            let mut violation = QuotaViolation::new(
                decision.name(),
                format!(
                    "rate limit \"{}\" on the messages of a stream: burst {}, refilled over {} s",
                    decision.name(),
                    q.burst_size(),
                    q.window_secs()
                ),
            );
            violation.quota_id = decision.name().to_owned();
            violation.quota_value = i64::try_from(q.burst_size()).unwrap_or(i64::MAX);
            details.set_quota_failure(vec![violation]);
            details.set_error_info(
                RATE_LIMIT_EXCEEDED,
                "tollgate",
                HashMap::from([("limits".to_owned(), decision.name().to_owned())]),
            );
            match decision.retry_after() {
                Some(wait) => format!(
                    "rate limit \"{}\" exceeded; retry in {} ms",
                    decision.name(),
                    ceil_ms(wait)
                ),
                None => format!(
                    "rate limit \"{}\" exceeded; the message exceeds the limit's capacity",
                    decision.name()
                ),
            }
        }
        PaceError::Limiter(e) => e.to_string(),
    };
    let mut status = tonic::Status::with_error_details(Code::ResourceExhausted, message, details);
    if let Some(wait) = refusal.retry_after()
        && let Ok(value) = tonic::metadata::MetadataValue::try_from(ceil_ms(wait).to_string())
    {
        status
            .metadata_mut()
            .insert("grpc-retry-pushback-ms", value);
    }
    status
}

impl<B> Body for PacedMessages<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if *this.charging > 0 {
                let charged = ready!(this.pacer.poll_charge(cx, *this.charging));
                *this.charging = 0;
                if let Err(refusal) = charged {
                    *this.held = Bytes::new();
                    *this.done = true;
                    let status = refused_status(&refusal);
                    return Poll::Ready(Some(match this.end {
                        End::Request => Err(Box::new(status)),
                        End::Response => {
                            let mut trailers = HeaderMap::new();
                            if let Err(e) = status.add_header(&mut trailers) {
                                tracing::debug!(error = %e, "tollgate: cannot write the gRPC status");
                            }
                            Ok(Frame::trailers(trailers))
                        }
                    }));
                }
            }
            if !this.held.is_empty() {
                let (free, charge) = advance(this.scan, this.held, this.pacer.per());
                if let Some(units) = charge {
                    // A message of 0 units (an empty one, by bytes) costs nothing.
                    *this.charging = units;
                }
                if free > 0 {
                    return Poll::Ready(Some(Ok(Frame::data(this.held.split_to(free)))));
                }
                continue;
            }
            if *this.done {
                return Poll::Ready(None);
            }
            if let Some(out) = ready!(pull(this.inner.as_mut(), cx, this.held, this.done)) {
                return Poll::Ready(out);
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.charging == 0 && (self.done || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let inner = if self.done {
            SizeHint::with_exact(0)
        } else {
            self.inner.size_hint()
        };
        held_hint(&inner, self.held.len())
    }
}

/// The key of a call's stream, from its request head (`None`: the call is not limited).
type KeyFn = dyn Fn(&Parts) -> Option<Key> + Send + Sync;

/// A tower layer (for `tonic::transport::Server::builder().layer(..)`) that charges the
/// messages of the streaming methods it names to a limit of messages or bytes, per key:
/// each call's request body (the limit's direction `in`), response body (`out`) or both
/// are [`PacedMessages`]. Calls of other methods (unary ones) pass unchanged.
///
/// ```
/// use tollgate::grpc::StreamLimitLayer;
/// use tollgate::key::PeerIp;
/// use tollgate::pace::{OverLimit, Per};
/// use tollgate::{store::MemoryStore, LimitSpec, Limiter, Quota};
///
/// let limiter = Limiter::builder(MemoryStore::new())
///     .limit(
///         LimitSpec::new("chat-messages", Quota::per_second(10).burst(5))
///             .per(Per::Message)
///             .over_limit(OverLimit::End),
///     )
///     .build()?;
/// // Per client address, on one bidirectional method.
/// let layer = StreamLimitLayer::new(limiter, "chat-messages", ["/chat.Chat/Talk"], |parts| {
///     let peer = parts.extensions.get::<tonic::transport::server::TcpConnectInfo>()?.remote_addr()?;
///     Some(PeerIp::new().key(peer.ip()))
/// });
/// # let _ = layer;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct StreamLimitLayer {
    limiter: Limiter,
    limit: Arc<str>,
    methods: Arc<[Box<str>]>,
    key: Arc<KeyFn>,
}

impl fmt::Debug for StreamLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamLimitLayer")
            .field("limit", &self.limit)
            .field("methods", &self.methods)
            .finish_non_exhaustive()
    }
}

impl StreamLimitLayer {
    /// Charges the messages of `methods` (gRPC paths, `/package.Service/Method`) to
    /// `limit`, for the key `key` finds in each call's head.
    pub fn new<I, S, F>(limiter: Limiter, limit: &str, methods: I, key: F) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
        F: Fn(&Parts) -> Option<Key> + Send + Sync + 'static,
    {
        Self {
            limiter,
            limit: limit.into(),
            methods: methods.into_iter().map(|m| m.as_ref().into()).collect(),
            key: Arc::new(key),
        }
    }
}

impl<S> Layer<S> for StreamLimitLayer {
    type Service = StreamLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        StreamLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`StreamLimitLayer`].
#[derive(Clone, Debug)]
pub struct StreamLimit<S> {
    inner: S,
    layer: StreamLimitLayer,
}

impl<S> Service<Request<tonic::body::Body>> for StreamLimit<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
        let layer = &self.layer;
        let streaming = layer.methods.iter().any(|m| **m == *req.uri().path());
        let (parts, body) = req.into_parts();
        let pacer = streaming
            .then(|| (layer.key)(&parts))
            .flatten()
            .map(|key| layer.limiter.pacer(&layer.limit, key));
        let (incoming, outgoing) = match pacer {
            Some(Ok(pacer)) => {
                let direction = pacer.direction();
                match (direction.counts_in(), direction.counts_out()) {
                    (true, true) => {
                        let other = pacer.sibling();
                        (Some(pacer), Some(other))
                    }
                    (true, false) => (Some(pacer), None),
                    _ => (None, Some(pacer)),
                }
            }
            Some(Err(e)) => {
                // A misconfiguration (an unknown limit): the call passes, once logged.
                tracing::warn!(limit = %layer.limit, error = %e, "tollgate: a stream limit cannot be charged");
                (None, None)
            }
            None => (None, None),
        };
        let body = match incoming {
            Some(pacer) => tonic::body::Body::new(PacedMessages::request(body, pacer)),
            None => body,
        };
        let future = self.inner.call(Request::from_parts(parts, body));
        Box::pin(async move {
            let response = future.await?;
            Ok(match outgoing {
                Some(pacer) => response
                    .map(|body| tonic::body::Body::new(PacedMessages::response(body, pacer))),
                None => response,
            })
        })
    }
}

/// `grpc-retry-pushback-ms` as a header value (tests).
#[cfg(test)]
fn pushback(status: &tonic::Status) -> Option<http::HeaderValue> {
    let mut headers = HeaderMap::new();
    status.add_header(&mut headers).ok()?;
    headers.get(super::RETRY_PUSHBACK_MS).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(messages: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.push(0);
            out.extend_from_slice(&(m.len() as u32).to_be_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    /// The charges (at which byte, how many units) scanning `data` in pieces of `step`.
    fn charges(data: &[u8], step: usize, per: Per) -> Vec<(usize, u64)> {
        let mut scan = Scan::START;
        let (mut at, mut out) = (0, Vec::new());
        while at < data.len() {
            let end = (at + step).min(data.len());
            let mut piece = &data[at..end];
            while !piece.is_empty() {
                let (n, charge) = advance(&mut scan, piece, per);
                at += n;
                piece = &piece[n..];
                if let Some(units) = charge {
                    out.push((at, units));
                }
            }
        }
        out
    }

    #[test]
    fn messages_are_found_by_their_prefix_across_any_framing() {
        let data = framed(&[b"hello", b"", &[7; 300], b"x"]);
        for step in 1..=data.len() {
            assert_eq!(
                charges(&data, step, Per::Message),
                [(5, 1), (15, 1), (20, 1), (325, 1)],
                "in pieces of {step}"
            );
            assert_eq!(
                charges(&data, step, Per::Byte),
                [(5, 5), (15, 0), (20, 300), (325, 1)]
            );
        }
    }

    #[test]
    fn a_refusal_is_resource_exhausted_with_pushback_and_details() {
        use crate::{LimitSpec, Quota, store::MemoryStore};
        let limiter = Limiter::builder(MemoryStore::new())
            .limit(LimitSpec::new("m", Quota::per_second(10).burst(1)))
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let refusal = rt.block_on(async {
            let mut pacer = limiter
                .pacer("m", "k")
                .unwrap()
                .over_limit(crate::pace::OverLimit::End);
            pacer.charge(1).await.unwrap();
            pacer.charge(1).await.unwrap_err()
        });
        let status = refused_status(&refusal);
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            status
                .message()
                .starts_with("rate limit \"m\" exceeded; retry in ")
        );
        let pushback: u64 = pushback(&status)
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((90..=100).contains(&pushback), "{pushback}");
        let details = status.get_error_details();
        assert_eq!(details.quota_failure().unwrap().violations[0].subject, "m");
        assert_eq!(details.error_info().unwrap().reason, RATE_LIMIT_EXCEEDED);
        assert!(details.retry_info().unwrap().retry_delay.is_some());
    }

    /// A paced body has ended when its inner body has and it holds nothing: an empty one
    /// at once, one with a message once that message is read; its size is the inner
    /// body's.
    #[tokio::test]
    async fn a_paced_body_ends_with_its_inner_body_once_it_holds_nothing() {
        use crate::algo::quota::Quota;
        use crate::model::spec::LimitSpec;
        use http_body_util::BodyExt;
        let limiter = crate::limiter::Limiter::builder(crate::store::MemoryStore::new())
            .limit(LimitSpec::new("m", Quota::per_second(10)).per(Per::Message))
            .build()
            .unwrap();
        let pacer = || limiter.pacer("m", "k").unwrap();
        let empty = PacedMessages::request(http_body_util::Empty::<Bytes>::new(), pacer());
        assert!(empty.is_end_stream());
        let one = http_body_util::Full::new(Bytes::from(framed(&[b"hi"])));
        let mut body = PacedMessages::request(one, pacer());
        assert!(!body.is_end_stream());
        assert_eq!(
            body.size_hint().exact(),
            Some(7),
            "the inner body's, nothing held"
        );
        let mut read = 0;
        while let Some(frame) = body.frame().await {
            read += frame.unwrap().into_data().unwrap().len();
        }
        assert_eq!(read, 7);
        assert!(body.is_end_stream());
    }

    /// A limiter with `limit`: 10 messages a second, 1 at once, over the limit `End`, in
    /// `direction`.
    fn one_at_once(direction: crate::model::stream::Direction) -> Limiter {
        use crate::algo::quota::Quota;
        use crate::model::spec::LimitSpec;
        use crate::model::stream::OverLimit;
        Limiter::builder(crate::store::MemoryStore::new())
            .limit(
                LimitSpec::new("m", Quota::per_second(10).burst(1))
                    .per(Per::Message)
                    .direction(direction)
                    .over_limit(OverLimit::End),
            )
            .build()
            .unwrap()
    }

    /// A service not ready yet: the layer's service is not ready either.
    #[test]
    fn a_stream_limit_is_ready_when_its_service_is() {
        struct NotReady;
        impl Service<Request<tonic::body::Body>> for NotReady {
            type Response = Response<tonic::body::Body>;
            type Error = std::convert::Infallible;
            type Future = std::future::Pending<Result<Self::Response, Self::Error>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Pending
            }
            fn call(&mut self, _: Request<tonic::body::Body>) -> Self::Future {
                std::future::pending()
            }
        }
        let layer = StreamLimitLayer::new(
            one_at_once(crate::model::stream::Direction::In),
            "m",
            ["/chat.Chat/Talk"],
            |_| Some(Key::global()),
        );
        let shown = format!("{layer:?}");
        assert!(
            shown.starts_with("StreamLimitLayer { limit: \"m\", methods: [\"/chat.Chat/Talk\"]"),
            "{shown}"
        );
        let mut service = layer.layer(NotReady);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(service.poll_ready(&mut cx).is_pending());
    }

    /// A limit of both directions charges the call's request messages (and, from a sibling
    /// pacer of the same bucket, its response's): with one message at once, the second the
    /// client sends is refused where the handler reads it.
    #[tokio::test]
    async fn a_limit_of_both_directions_charges_the_request_messages_too() {
        use http_body_util::BodyExt;
        let layer = StreamLimitLayer::new(
            one_at_once(crate::model::stream::Direction::Both),
            "m",
            ["/chat.Chat/Talk"],
            |_| Some(Key::global()),
        );
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let read = seen.clone();
        let handler = tower::service_fn(move |req: Request<tonic::body::Body>| {
            let read = read.clone();
            async move {
                let mut body = req.into_body();
                while let Some(frame) = body.frame().await {
                    let n = match frame {
                        Ok(frame) => frame.into_data().map_or(0, |d| d.len()),
                        Err(status) if status.code() == Code::ResourceExhausted => 1_000,
                        Err(_) => 2_000,
                    };
                    read.lock().unwrap().push(n);
                }
                let empty = http_body_util::Empty::<Bytes>::new();
                Ok::<_, std::convert::Infallible>(Response::new(tonic::body::Body::new(empty)))
            }
        });
        let mut service = layer.layer(handler);
        let two = framed(&[b"a", b"b"]);
        let request = Request::post("/chat.Chat/Talk")
            .body(tonic::body::Body::new(http_body_util::Full::new(
                Bytes::from(two),
            )))
            .unwrap();
        service.call(request).await.unwrap();
        // The first message's prefix, then its byte with the second's prefix, then the
        // refusal of the second (1,000: RESOURCE_EXHAUSTED).
        assert_eq!(*seen.lock().unwrap(), [5, 6, 1_000]);
    }

    /// `Debug` shows the inner body, the pacer, how many bytes are held and the scan.
    #[tokio::test]
    async fn debug_shows_the_body_the_pacer_and_what_is_held() {
        let limiter = one_at_once(crate::model::stream::Direction::In);
        let inner = http_body_util::Empty::<Bytes>::new();
        let body = PacedMessages::request(inner, limiter.pacer("m", "k").unwrap());
        let shown = format!("{body:?}");
        assert!(shown.starts_with("PacedMessages { inner: Empty"), "{shown}");
        assert!(shown.contains("pacer: Pacer { limit: \"m\""), "{shown}");
        assert!(shown.contains("held: 0, scan: Prefix"), "{shown}");
    }
}
