//! [`PacedEvents`]: a server-sent events body whose events are charged to a limit, one
//! unit per event, before they pass.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::limiter::pace::Pacer;
use crate::middleware::pace::{BoxError, held_hint, pull};

/// Where the scan of an event stream is (`text/event-stream`: lines ended by CRLF, LF or
/// CR; an empty line ends an event; a line starting with `:` is a comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scan {
    /// The next byte starts a line.
    line_start: bool,
    /// The last byte was a CR (a LF after it ends no further line).
    cr: bool,
    /// The event under way was charged.
    paid: bool,
}

impl Scan {
    const START: Self = Self {
        line_start: true,
        cr: false,
        paid: false,
    };

    /// How many bytes of `data` may pass before an event that is not charged yet starts
    /// (all of them if none does), the state moved past them.
    fn advance(&mut self, data: &[u8]) -> (usize, bool) {
        for (i, &b) in data.iter().enumerate() {
            if std::mem::take(&mut self.cr) && b == b'\n' {
                continue;
            }
            if self.line_start {
                match b {
                    // An empty line: the event ends (a comment-only block cost nothing).
                    b'\n' | b'\r' => {
                        self.paid = false;
                        self.cr = b == b'\r';
                        continue;
                    }
                    b':' => {}
                    // A field line of an event not yet charged: charge first.
                    _ if !self.paid => return (i, true),
                    _ => {}
                }
                self.line_start = false;
            } else if b == b'\n' || b == b'\r' {
                self.line_start = true;
                self.cr = b == b'\r';
            }
        }
        (data.len(), false)
    }
}

pin_project! {
    /// A server-sent events body (`text/event-stream`) whose events are charged to a limit
    /// of messages, one unit each, before their first field passes: a streaming API that
    /// must not send a client more than N events a second.
    ///
    /// Comments (`: keep-alive`) and the blank lines between events are not charged.
    /// Over the limit the pacer's [`OverLimit`](crate::pace::OverLimit) decides: `Wait`
    /// holds the event until it is due (the inner body is not read meanwhile, so its
    /// producer is slowed), `End` (or a wait past `max_wait`) ends the body with the
    /// [`PaceError`](crate::pace::PaceError). It holds at most one frame of the inner body.
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// use tollgate::pace::{PacedEvents, Per};
    /// use tollgate::{store::MemoryStore, LimitSpec, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .limit(LimitSpec::new("events", Quota::per_second(100).burst(2)).per(Per::Message))
    ///     .build()?;
    /// let pacer = limiter.pacer("events", "alice")?;
    /// let stream = "data: 1\n\n: keep-alive\n\ndata: 2\n\ndata: 3\n\n";
    /// let body = PacedEvents::new(http_body_util::Full::new(bytes::Bytes::from(stream)), pacer);
    /// let start = tokio::time::Instant::now();
    /// assert_eq!(body.collect().await?.to_bytes(), stream); // unchanged
    /// // Two at once, the third 10 ms later; the comment cost nothing.
    /// assert!(start.elapsed() >= std::time::Duration::from_millis(9));
    /// # Ok(()) }
    /// ```
    pub struct PacedEvents<B> {
        #[pin]
        inner: B,
        pacer: Pacer,
        // The rest of the inner body's current data frame.
        held: Bytes,
        scan: Scan,
        // An event is being charged.
        charging: bool,
        // The inner body ended (or failed, or the pacer refused).
        done: bool,
    }
}

impl<B: fmt::Debug> fmt::Debug for PacedEvents<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedEvents")
            .field("inner", &self.inner)
            .field("pacer", &self.pacer)
            .field("held", &self.held.len())
            .finish()
    }
}

impl<B> PacedEvents<B> {
    /// `inner`, each of its events charged through `pacer`.
    pub fn new(inner: B, pacer: Pacer) -> Self {
        Self {
            inner,
            pacer,
            held: Bytes::new(),
            scan: Scan::START,
            charging: false,
            done: false,
        }
    }
}

impl<B> Body for PacedEvents<B>
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
            if *this.charging {
                let charged = ready!(this.pacer.poll_charge(cx, 1));
                *this.charging = false;
                if let Err(e) = charged {
                    *this.held = Bytes::new();
                    *this.done = true;
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                this.scan.paid = true;
            }
            if !this.held.is_empty() {
                let (free, charge) = this.scan.advance(this.held);
                if free > 0 {
                    return Poll::Ready(Some(Ok(Frame::data(this.held.split_to(free)))));
                }
                *this.charging = charge;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The positions where a charge comes, feeding `text` in pieces of `step` bytes.
    fn charges(text: &str, step: usize) -> Vec<usize> {
        let mut scan = Scan::START;
        let bytes = text.as_bytes();
        let (mut at, mut out) = (0, Vec::new());
        while at < bytes.len() {
            let end = (at + step).min(bytes.len());
            let (free, charge) = scan.advance(&bytes[at..end]);
            at += free;
            if charge {
                out.push(at);
                scan.paid = true;
            }
        }
        out
    }

    /// A limiter of one limit of events, `events`, 10 a second.
    fn events_limiter() -> crate::Limiter {
        crate::Limiter::builder(crate::store::MemoryStore::new())
            .limit(crate::LimitSpec::new(
                "events",
                crate::Quota::per_second(10),
            ))
            .build()
            .unwrap()
    }

    #[test]
    fn each_event_is_charged_at_its_first_field_in_any_framing() {
        let text = "data: a\n\n: ping\n\nevent: x\ndata: b\r\n\r\ndata: c\r\rid: 4\ndata: d\n\n";
        let expected = vec![0, 17, 37, 46];
        for step in 1..=text.len() {
            assert_eq!(charges(text, step), expected, "in pieces of {step}");
        }
        assert_eq!(charges(": only a comment\n\n\n", 3), Vec::<usize>::new());
        // A CRLF split between frames ends one line, not two.
        assert_eq!(charges("data: a\r\ndata: b\r\n\r\n", 8), vec![0]);
    }

    #[test]
    fn its_debug_form_names_the_body_the_pacer_and_what_it_holds() {
        let limiter = events_limiter();
        let body = PacedEvents::new("inner body", limiter.pacer("events", "k").unwrap());
        let shown = format!("{body:?}");
        for part in ["PacedEvents", "\"inner body\"", "Pacer", "held: 0"] {
            assert!(shown.contains(part), "{part} not in {shown}");
        }
    }

    /// A paced events body has ended when its inner body has and it holds nothing (an
    /// empty one at once, one with an event once it is read); its size is the inner
    /// body's, then what it holds.
    #[tokio::test]
    async fn an_events_body_ends_with_its_inner_body_once_it_holds_nothing() {
        use http_body_util::BodyExt;
        let limiter = events_limiter();
        let pacer = || limiter.pacer("events", "k").unwrap();
        let empty = PacedEvents::new(http_body_util::Empty::<Bytes>::new(), pacer());
        assert!(empty.is_end_stream());
        let text = Bytes::from_static(b"data: a\n\n");
        let mut body = PacedEvents::new(http_body_util::Full::new(text), pacer());
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(9));
        let mut read = 0;
        while let Some(frame) = body.frame().await {
            read += frame.unwrap().into_data().unwrap().len();
        }
        assert_eq!(read, 9);
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
    }
}
