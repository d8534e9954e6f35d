//! [`PacedBody`]: a request or response body whose bytes are charged to a limit as they
//! pass (nginx's `limit_rate` and `limit_rate_after`, per key, in any store).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::limiter::pace::Pacer;

/// The error of a [`PacedBody`]: the inner body's, or the pacer's refusal
/// ([`PaceError`](crate::pace::PaceError)), boxed as hyper, axum and tonic take them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// A body whose bytes are charged to a limit, one piece at a time, before they pass:
    /// a download or upload paced to the limit's rate per key.
    ///
    /// Each data frame of the inner body is let through in pieces of at most the
    /// [`Pacer`]'s [`piece`](Pacer::piece) (the limit's burst, in bytes: with a
    /// [`unit`](Pacer::unit) of 1024 a token is a KiB), each once its bytes are charged; the first [`rate_after`](Self::rate_after) bytes pass uncharged. The body
    /// holds at most one frame of the inner body (the rest of the frame being paced):
    /// the inner body is not read while a piece waits, so a request body's sender is
    /// slowed by flow control, and a response body's producer by backpressure.
    ///
    /// With [`OverLimit::Wait`](crate::pace::OverLimit::Wait) a piece waits for its bytes
    /// (a wait longer than `max_wait` ends the body with an error); with
    /// [`OverLimit::End`](crate::pace::OverLimit::End) the body ends with an error as soon
    /// as a piece is over the limit. Trailers pass unchanged. Dropped early, it gives back
    /// what its pacer took and did not use.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http_body_util::BodyExt;
    /// use tollgate::pace::{OverLimit, PacedBody};
    /// use tollgate::{store::MemoryStore, LimitSpec, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// // 10,000 bytes per second, 100 at once.
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .limit(LimitSpec::new("download", Quota::per_second(10_000).burst(100)))
    ///     .build()?;
    /// let pacer = limiter
    ///     .pacer("download", "198.51.100.7")?
    ///     .over_limit(OverLimit::wait(Duration::from_secs(5)));
    /// let body = PacedBody::new(http_body_util::Full::new(bytes::Bytes::from(vec![7u8; 600])), pacer);
    /// let start = tokio::time::Instant::now();
    /// let bytes = body.collect().await?.to_bytes();
    /// assert_eq!(bytes.len(), 600);
    /// // 100 at once, then 500 at 10,000 a second.
    /// assert!(start.elapsed() >= Duration::from_millis(45));
    /// # Ok(()) }
    /// ```
    pub struct PacedBody<B> {
        #[pin]
        inner: B,
        pacer: Pacer,
        // The rest of the inner body's current data frame.
        held: Bytes,
        // Bytes that may still pass uncharged.
        free: u64,
        // The size of the piece being charged (0: none).
        charging: usize,
        // The inner body ended (or failed): nothing more is read from it.
        done: bool,
    }
}

impl<B: fmt::Debug> fmt::Debug for PacedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedBody")
            .field("inner", &self.inner)
            .field("pacer", &self.pacer)
            .field("held", &self.held.len())
            .field("free", &self.free)
            .finish()
    }
}

impl<B> PacedBody<B> {
    /// `inner`, its bytes charged through `pacer`, the first
    /// [`rate_after`](Pacer::rate_after) of them (the limit's) uncharged.
    pub fn new(inner: B, pacer: Pacer) -> Self {
        Self {
            inner,
            free: pacer.rate_after(),
            pacer,
            held: Bytes::new(),
            charging: 0,
            done: false,
        }
    }

    /// The first `bytes` bytes pass uncharged (nginx's `limit_rate_after`), whatever the
    /// limit's [`rate_after`](crate::LimitSpec::rate_after) says.
    pub fn rate_after(mut self, bytes: u64) -> Self {
        self.free = bytes;
        self
    }

    /// The pacer, to read what it holds.
    pub fn pacer(&self) -> &Pacer {
        &self.pacer
    }
}

impl<B> Body for PacedBody<B>
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
            if !this.held.is_empty() {
                // A piece of the held frame: free bytes first, then charged ones.
                if *this.free > 0 {
                    let n = this
                        .held
                        .len()
                        .min(usize::try_from(*this.free).unwrap_or(usize::MAX));
                    *this.free -= n as u64;
                    return Poll::Ready(Some(Ok(Frame::data(this.held.split_to(n)))));
                }
                if *this.charging == 0 {
                    let piece = usize::try_from(this.pacer.piece()).unwrap_or(usize::MAX);
                    *this.charging = this.held.len().min(piece);
                }
                let n = *this.charging;
                let charged = ready!(this.pacer.poll_charge(cx, n as u64));
                *this.charging = 0;
                return match charged {
                    Ok(()) => Poll::Ready(Some(Ok(Frame::data(this.held.split_to(n))))),
                    Err(e) => {
                        // Refused: the body ends here, holding nothing.
                        *this.held = Bytes::new();
                        *this.done = true;
                        Poll::Ready(Some(Err(Box::new(e))))
                    }
                };
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
        self.held.is_empty() && (self.done || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.done {
            return SizeHint::with_exact(self.held.len() as u64);
        }
        let inner = self.inner.size_hint();
        held_hint(&inner, self.held.len())
    }
}

/// What a pacing body returns as it is: a frame, an error, or the end.
pub(crate) type Passed = Option<Result<Frame<Bytes>, BoxError>>;

/// The next frame of `inner` for a body that paces one data frame at a time: `None` when
/// it was data, now in `held` (empty before); else what the pacing body returns as it is:
/// a frame that is not data (trailers), the inner body's error or its end (both setting
/// `done`).
pub(crate) fn pull<B>(
    inner: Pin<&mut B>,
    cx: &mut Context<'_>,
    held: &mut Bytes,
    done: &mut bool,
) -> Poll<Option<Passed>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    Poll::Ready(match ready!(inner.poll_frame(cx)) {
        Some(Ok(frame)) => match frame.into_data() {
            Ok(data) => {
                *held = data;
                None
            }
            Err(frame) => Some(Some(Ok(frame))),
        },
        Some(Err(e)) => {
            *done = true;
            Some(Some(Err(e.into())))
        }
        None => {
            *done = true;
            Some(None)
        }
    })
}

/// The size hint of a pacing body: what the inner body has left (`inner`) and the `held`
/// bytes not yet passed.
pub(crate) fn held_hint(inner: &SizeHint, held: usize) -> SizeHint {
    let held = held as u64;
    let mut hint = SizeHint::new();
    hint.set_lower(inner.lower().saturating_add(held));
    if let Some(upper) = inner.upper() {
        hint.set_upper(upper.saturating_add(held));
    }
    hint
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http_body_util::BodyExt;
    use tokio::time::Instant;

    use super::*;
    use crate::algo::quota::Quota;
    use crate::base::clock::Clock;
    use crate::limiter::Limiter;
    use crate::model::spec::LimitSpec;
    use crate::model::stream::OverLimit;
    use crate::store::MemoryStore;

    /// Tokio's (paused) clock, so that the store and the waits read one time.
    #[derive(Clone)]
    struct Tokio(Instant);

    impl Clock for Tokio {
        fn now(&self) -> u64 {
            1_000_000_000_000 + self.0.elapsed().as_nanos() as u64
        }
    }

    fn limiter(quota: Quota) -> Limiter {
        Limiter::builder(MemoryStore::with_clock(Tokio(Instant::now())))
            .limit(LimitSpec::new("bytes", quota))
            .build()
            .unwrap()
    }

    /// A body of `chunks` frames of `size` bytes, then trailers, counting the frames
    /// taken from it.
    struct Chunks {
        left: usize,
        size: usize,
        taken: Arc<AtomicUsize>,
        trailers: bool,
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.left == 0 {
                if std::mem::take(&mut self.trailers) {
                    let mut t = http::HeaderMap::new();
                    t.insert("x-done", http::HeaderValue::from_static("yes"));
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                return Poll::Ready(None);
            }
            self.left -= 1;
            self.taken.fetch_add(1, Ordering::Relaxed);
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![1u8; self.size])))))
        }
    }

    fn chunks(n: usize, size: usize) -> (Chunks, Arc<AtomicUsize>) {
        let taken = Arc::new(AtomicUsize::new(0));
        let body = Chunks {
            left: n,
            size,
            taken: taken.clone(),
            trailers: true,
        };
        (body, taken)
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn bytes_pass_at_the_rate_in_pieces_of_at_most_the_burst_one_frame_held() {
        let limiter = limiter(Quota::per_second(10_000).burst(1_000));
        let pacer = limiter
            .pacer("bytes", "k")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND));
        let (inner, taken) = chunks(5, 4_000);
        let mut body = PacedBody::new(inner, pacer);
        let start = Instant::now();
        let mut total = 0;
        let mut frames = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap();
            let Some(data) = frame.data_ref() else {
                let trailers = frame.into_trailers().unwrap();
                assert_eq!(trailers["x-done"], "yes");
                continue;
            };
            assert!(data.len() <= 1_000, "a piece is at most the burst");
            total += data.len();
            frames += 1;
            // Never more than the frame being paced is read ahead.
            let read = taken.load(Ordering::Relaxed) * 4_000;
            assert!(read - total < 4_000, "{read} read, {total} passed");
        }
        assert_eq!((total, frames), (20_000, 20));
        // 1,000 at once, then 19,000 at 10,000 a second.
        assert_eq!(start.elapsed(), Duration::from_millis(1_900));
        assert!(body.is_end_stream());
    }

    #[tokio::test(start_paused = true)]
    async fn rate_after_lets_the_first_bytes_through_uncharged() {
        let limiter = limiter(Quota::per_second(10_000).burst(1_000));
        let pacer = limiter
            .pacer("bytes", "k")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND));
        let (inner, _) = chunks(3, 2_500);
        let body = PacedBody::new(inner, pacer).rate_after(5_000);
        let start = Instant::now();
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes.len(), 7_500);
        // 5,000 free, 1,000 of burst, 1,500 at 10,000 a second.
        assert_eq!(start.elapsed(), Duration::from_millis(150));
        let left = limiter.peek("bytes", "k").await.unwrap().remaining();
        assert_eq!(left, Some(0), "only the paced bytes were charged");
    }

    #[tokio::test(start_paused = true)]
    async fn end_fails_the_body_over_the_limit_and_reads_no_more() {
        let limiter = limiter(Quota::per_second(10_000).burst(1_000));
        let pacer = limiter
            .pacer("bytes", "k")
            .unwrap()
            .over_limit(OverLimit::End);
        let (inner, taken) = chunks(10, 600);
        let mut body = PacedBody::new(inner, pacer);
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().unwrap().len(), 600);
        let error = body.frame().await.unwrap().unwrap_err();
        let refused = error
            .downcast_ref::<crate::limiter::pace::PaceError>()
            .unwrap();
        assert!(refused.retry_after().is_some());
        assert!(body.frame().await.is_none(), "ended");
        assert!(body.is_end_stream());
        assert_eq!(taken.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_dropped_while_it_waits_holds_nothing() {
        let limiter = limiter(Quota::per_second(10_000).burst(1_000));
        let pacer = limiter
            .pacer("bytes", "k")
            .unwrap()
            .over_limit(OverLimit::wait(SECOND))
            .batch(1_000);
        let (inner, _) = chunks(1, 1_500);
        let mut body = PacedBody::new(inner, pacer);
        assert_eq!(
            body.frame()
                .await
                .unwrap()
                .unwrap()
                .data_ref()
                .unwrap()
                .len(),
            1_000
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(10), body.frame())
                .await
                .is_err()
        );
        drop(body);
        tokio::task::yield_now().await;
        // The waiting piece's reservation went back: 10 ms refilled 100.
        let left = limiter.peek("bytes", "k").await.unwrap().remaining();
        assert_eq!(left, Some(100));
    }

    #[test]
    fn size_hints_count_the_held_bytes() {
        let limiter = Limiter::builder(MemoryStore::new())
            .limit(LimitSpec::new("bytes", Quota::per_second(10)))
            .build()
            .unwrap();
        let pacer = limiter
            .pacer("bytes", "k")
            .unwrap()
            .over_limit(OverLimit::End);
        let mut body = PacedBody::new(http_body_util::Full::new(Bytes::from("abc")), pacer);
        assert_eq!(body.size_hint().exact(), Some(3));
        body.held = Bytes::from("de");
        assert_eq!(body.size_hint().exact(), Some(5));
        body.done = true;
        assert_eq!(body.size_hint().exact(), Some(2));
        assert!(!body.is_end_stream());
        assert_eq!(body.pacer().limit(), "bytes");
        assert!(format!("{body:?}").contains("held: 2"));
    }
}
