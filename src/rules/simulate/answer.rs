//! The application behind the replay's layer: it answers each request with the logged
//! status and, for a line with an actual usage, carries that usage where the rules'
//! settled limits read it (a response header, or a trailer at the body's end).

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tower_service::Service;

use crate::middleware::body::{Follow, ResponseBody};
use crate::rules::document::Document;
use crate::web::response::Rejection;
use crate::web::settle::Settle;

/// A line's actual usage, carried in its request's extensions to the [`Answer`] (only for
/// lines that have one, and only when a limit settles).
#[derive(Clone)]
pub(super) struct Usage(pub(super) HeaderValue);

/// Where the rules' settled limits read an actual cost: response headers, trailers.
#[derive(Default)]
pub(super) struct Places {
    headers: Vec<HeaderName>,
    trailers: Vec<HeaderName>,
}

impl Places {
    /// The places of `doc`'s settled limits (each name once). A `settle` that does not
    /// parse leaves no place: the rules do not compile then anyway.
    pub(super) fn of(doc: &Document) -> Self {
        let mut places = Self::default();
        for source in doc.limits.iter().filter_map(|l| l.settle.as_deref()) {
            let Some((name, trailer)) = source
                .parse::<Settle>()
                .ok()
                .and_then(|s| s.field().map(|(n, t)| (n.clone(), t)))
            else {
                continue;
            };
            let list = if trailer {
                &mut places.trailers
            } else {
                &mut places.headers
            };
            if !list.contains(&name) {
                list.push(name);
            }
        }
        places
    }

    /// Whether any limit settles (else a line's usage is not carried at all).
    pub(super) fn any(&self) -> bool {
        !(self.headers.is_empty() && self.trailers.is_empty())
    }
}

/// The application behind the layer: answers every request with the logged status, and
/// a request carrying a [`Usage`] with it in each settled limit's header and trailer.
#[derive(Clone)]
pub(super) struct Answer {
    pub(super) status: Arc<AtomicU16>,
    pub(super) places: Arc<Places>,
}

impl<B> Service<Request<B>> for Answer {
    type Response = Response<Replayed>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let mut response = Response::new(Replayed::default());
        *response.status_mut() =
            StatusCode::from_u16(self.status.load(Ordering::Relaxed)).unwrap_or(StatusCode::OK);
        if let Some(Usage(value)) = request.extensions_mut().remove::<Usage>() {
            for name in &self.places.headers {
                response.headers_mut().insert(name.clone(), value.clone());
            }
            if !self.places.trailers.is_empty() {
                let mut trailers = HeaderMap::with_capacity(self.places.trailers.len());
                for name in &self.places.trailers {
                    trailers.insert(name.clone(), value.clone());
                }
                response.body_mut().trailers = Some(Box::new(trailers));
            }
        }
        ready(Ok(response))
    }
}

/// The refusals' answers: their status, without a body (nobody reads it).
pub(super) type Silent = fn(&Rejection<'_>) -> Response<Replayed>;

pub(super) fn silent(rejection: &Rejection<'_>) -> Response<Replayed> {
    let mut response = Response::new(Replayed::default());
    *response.status_mut() = rejection.status();
    response
}

/// A replayed response's body: no data, and the trailers of a line's usage, if any.
#[derive(Default, Debug)]
pub(super) struct Replayed {
    trailers: Option<Box<HeaderMap>>,
}

impl Body for Replayed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(*t))))
    }

    fn is_end_stream(&self) -> bool {
        self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(0)
    }
}

/// A replayed response has no bytes: a limit of bytes on its route paces nothing and
/// refuses no request (as live, where it slows the body and never refuses the request),
/// so its pacers are dropped unused.
impl Follow for Replayed {
    type Body = ResponseBody<Self>;
    const PACES: bool = true;
    fn plain(self) -> Self::Body {
        ResponseBody::new(self)
    }
    fn follow(body: ResponseBody<Self>) -> Self::Body {
        body
    }
}

/// Ends a replayed response's body: its frames read (the trailers told to the settled
/// limits, if it has any), then dropped, which gives back what it held.
#[inline]
pub(super) fn end(mut body: ResponseBody<Replayed>, cx: &mut Context<'_>) {
    while !body.is_end_stream() {
        match Pin::new(&mut body).poll_frame(cx) {
            Poll::Ready(Some(_)) => {}
            // A replayed body never waits.
            Poll::Ready(None) | Poll::Pending => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_places_of_settled_limits_are_each_named_once() {
        let doc = Document::from_toml(
            r#"
            [[limits]]
            name = "a"
            quota = "10/min"
            settle = "header:x-usage"
            [[limits]]
            name = "b"
            quota = "10/min"
            settle = "header:x-usage"
            [[limits]]
            name = "c"
            quota = "10/min"
            settle = "trailer:grpc-usage"
            [[limits]]
            name = "d"
            quota = "10/min"
            "#,
        )
        .unwrap();
        let places = Places::of(&doc);
        assert_eq!(places.headers, ["x-usage"]);
        assert_eq!(places.trailers, ["grpc-usage"]);
        assert!(places.any());
        assert!(!Places::default().any());
    }

    #[test]
    fn a_usage_is_answered_in_each_header_and_trailer() {
        let mut answer = Answer {
            status: Arc::new(AtomicU16::new(201)),
            places: Arc::new(Places {
                headers: vec![HeaderName::from_static("x-usage")],
                trailers: vec![HeaderName::from_static("grpc-usage")],
            }),
        };
        let mut request = Request::new(());
        request
            .extensions_mut()
            .insert(Usage(HeaderValue::from_static("812")));
        let Ok(response) = answer.call(request).into_inner();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["x-usage"], "812");
        let mut body = response.into_body();
        assert!(!body.is_end_stream());
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) else {
            panic!("a trailers frame")
        };
        assert_eq!(frame.trailers_ref().unwrap()["grpc-usage"], "812");
        assert!(body.is_end_stream());
        // Without a usage: the status alone, and a body that has ended.
        let Ok(plain) = answer.call(Request::new(())).into_inner();
        assert!(plain.headers().is_empty() && plain.body().is_end_stream());
    }
}
