//! [`Limited`]: axum's `WebSocket` with its messages charged to a limit (feature `ws`).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, close_code};
use futures_util::{Sink, Stream};

use crate::limiter::pace::{PaceError, Pacer};
use crate::model::stream::Per;

/// How a [`Limited`] socket closes over the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Close {
    /// 1008, policy violation (the default): the client broke the rules.
    #[default]
    PolicyViolation,
    /// 1013, try again later: the client may reconnect after a while.
    TryAgainLater,
}

impl Close {
    /// The close code.
    pub const fn code(self) -> u16 {
        match self {
            Self::PolicyViolation => close_code::POLICY,
            Self::TryAgainLater => close_code::AGAIN,
        }
    }
}

/// A close frame's reason holds at most 123 bytes (RFC 6455, 5.5).
const MAX_REASON: usize = 123;

/// axum's [`WebSocket`] with its messages charged to limits of messages or bytes: a
/// [`Stream`] and [`Sink`] of [`Message`]s like the socket itself.
///
/// Made at the upgrade, with the [`Pacer`]s of the limits it counts (made by
/// [`Limiter::pacer`](crate::Limiter::pacer) with the key of the request that upgraded:
/// the key is computed once). A pacer whose limit counts messages in
/// ([`Direction::In`](crate::pace::Direction::In), the default) charges each text or binary
/// message received; one that counts them out charges each sent; `Both` charges both
/// ways (a second pacer of the same limit and key: [`Pacer::sibling`]). A limit of bytes
/// ([`Per::Byte`]) charges a message's payload size; one of messages, 1. Pings, pongs and
/// close frames are not charged.
///
/// Over the limit, the limit's [`OverLimit`](crate::pace::OverLimit) decides:
/// - `Wait`: a received message is not handed on, and the socket not read further, until
///   its units are due (the client's sends slow down through TCP flow control); a sent
///   message waits in the sink (one at a time).
/// - `End`, or a wait longer than `max_wait`: the socket sends a close frame with the
///   [`Close`] code (1008 by default, or 1013) and a reason (`rate limit "<name>"
///   exceeded`, with the wait when one helps, unless [`reason`](Self::reason) gives
///   one); the stream yields the error ([`PaceError`] inside axum's error) once, then
///   ends; a send fails with it.
///
/// Dropped, it gives back what its pacers took and did not use.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::extract::ws::{Message, WebSocketUpgrade};
/// use axum::extract::{ConnectInfo, State};
/// use axum::response::Response;
/// use futures_util::{SinkExt, StreamExt};
/// use tollgate::key::PeerIp;
/// use tollgate::pace::Per;
/// use tollgate::ws::{Close, Limited};
/// use tollgate::Limiter;
///
/// // An echo server: 20 messages a second per client address (a limit `ws-messages`
/// // with `per(Per::Message)`), closed with 1013 over it.
/// async fn echo(
///     upgrade: WebSocketUpgrade,
///     ConnectInfo(peer): ConnectInfo<SocketAddr>,
///     State(limiter): State<Limiter>,
/// ) -> Response {
///     let pacer = limiter.pacer("ws-messages", PeerIp::new().key(peer.ip()));
///     upgrade.on_upgrade(move |socket| async move {
///         let Ok(pacer) = pacer else { return };
///         let mut socket = Limited::new(socket, pacer).close_with(Close::TryAgainLater);
///         while let Some(Ok(message)) = socket.next().await {
///             if matches!(message, Message::Text(_) | Message::Binary(_))
///                 && socket.send(message).await.is_err()
///             {
///                 break;
///             }
///         }
///     })
/// }
/// ```
pub struct Limited {
    socket: WebSocket,
    /// Charges received messages.
    incoming: Option<Pacer>,
    /// Charges sent messages.
    outgoing: Option<Pacer>,
    close: Close,
    reason: Option<Utf8Bytes>,
    /// A received message waiting for its units.
    received: Option<Message>,
    /// A message to send, waiting for its units.
    sending: Option<Message>,
    /// Over the limit: the close frame still to send, and the refusal.
    closing: Option<(Option<CloseFrame>, PaceError)>,
    /// The refusal, told to the stream once.
    told: bool,
}

impl fmt::Debug for Limited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limited")
            .field("incoming", &self.incoming)
            .field("outgoing", &self.outgoing)
            .field("close", &self.close)
            .field("closing", &self.closing.is_some())
            .finish_non_exhaustive()
    }
}

impl Limited {
    /// `socket`, its messages charged through `pacer` in the pacer's limit's direction
    /// (for `Both`, a sibling pacer charges the other way).
    pub fn new(socket: WebSocket, pacer: Pacer) -> Self {
        let direction = pacer.direction();
        let (incoming, outgoing) = match (direction.counts_in(), direction.counts_out()) {
            (true, true) => {
                let other = pacer.sibling();
                (Some(pacer), Some(other))
            }
            (true, false) => (Some(pacer), None),
            _ => (None, Some(pacer)),
        };
        Self {
            socket,
            incoming,
            outgoing,
            close: Close::default(),
            reason: None,
            received: None,
            sending: None,
            closing: None,
            told: false,
        }
    }

    /// Also charges `pacer` (another limit: per message and per byte, say), in its
    /// limit's direction; a second pacer for a direction replaces the first.
    pub fn and(mut self, pacer: Pacer) -> Self {
        let direction = pacer.direction();
        match (direction.counts_in(), direction.counts_out()) {
            (true, true) => {
                self.outgoing = Some(pacer.sibling());
                self.incoming = Some(pacer);
            }
            (true, false) => self.incoming = Some(pacer),
            _ => self.outgoing = Some(pacer),
        }
        self
    }

    /// The close code over the limit (default [`Close::PolicyViolation`], 1008).
    pub fn close_with(mut self, close: Close) -> Self {
        self.close = close;
        self
    }

    /// The close frame's reason over the limit, at most 123 bytes (cut at a character
    /// boundary beyond).
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(Utf8Bytes::from(cut(reason.into())));
        self
    }

    /// The socket, to read what it is (its protocol).
    pub fn get_ref(&self) -> &WebSocket {
        &self.socket
    }

    /// The close frame for `refusal`.
    fn frame(&self, refusal: &PaceError) -> CloseFrame {
        let reason = self.reason.clone().unwrap_or_else(|| {
            let text = match refusal {
                PaceError::Refused(d) => match d.retry_after() {
                    Some(after) => format!(
                        "rate limit \"{}\" exceeded; retry in {} ms",
                        d.name,
                        after.as_millis().max(1)
                    ),
                    None => format!("rate limit \"{}\" exceeded", d.name),
                },
                PaceError::Limiter(_) => "rate limit unavailable".to_owned(),
            };
            Utf8Bytes::from(cut(text))
        });
        CloseFrame {
            code: self.close.code(),
            reason,
        }
    }

    /// Sends the close frame of a refusal, if not yet sent: ready once flushed (or the
    /// socket failed: it is closed either way).
    fn poll_closing(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some((frame, _)) = &mut self.closing else {
            return Poll::Ready(());
        };
        if frame.is_some() {
            if ready!(Pin::new(&mut self.socket).poll_ready(cx)).is_err() {
                return Poll::Ready(());
            }
            let frame = frame.take();
            if Pin::new(&mut self.socket)
                .start_send(Message::Close(frame))
                .is_err()
            {
                return Poll::Ready(());
            }
        }
        let _ = ready!(Pin::new(&mut self.socket).poll_flush(cx));
        Poll::Ready(())
    }

    fn refuse(&mut self, refusal: PaceError) {
        if self.closing.is_none() {
            let frame = self.frame(&refusal);
            self.closing = Some((Some(frame), refusal));
        }
        self.received = None;
        self.sending = None;
    }

    fn refusal(&self) -> axum::Error {
        let refusal = self.closing.as_ref().map(|(_, e)| e.clone());
        axum::Error::new(refusal.unwrap_or_else(|| {
            PaceError::Limiter(crate::limiter::LimiterError::Unsupported {
                limit: String::new(),
                operation: "send",
            })
        }))
    }

    /// Sends the message waiting for its units once they are paid for.
    fn poll_send_pending(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), axum::Error>> {
        if self.closing.is_some() {
            ready!(self.poll_closing(cx));
            return Poll::Ready(Err(self.refusal()));
        }
        let Some(message) = &self.sending else {
            return Poll::Ready(Ok(()));
        };
        if let Some(pacer) = &mut self.outgoing
            && let Some(units) = units(pacer, message)
            && let Err(refusal) = ready!(pacer.poll_charge(cx, units))
        {
            self.refuse(refusal);
            ready!(self.poll_closing(cx));
            return Poll::Ready(Err(self.refusal()));
        }
        ready!(Pin::new(&mut self.socket).poll_ready(cx))?;
        let message = self.sending.take().expect("checked above");
        Pin::new(&mut self.socket).start_send(message)?;
        Poll::Ready(Ok(()))
    }
}

/// The units `message` costs `pacer`: its payload's size for a limit of bytes, else 1;
/// `None` for a control frame.
fn units(pacer: &Pacer, message: &Message) -> Option<u64> {
    let size = match message {
        Message::Text(text) => text.as_str().len(),
        Message::Binary(bytes) => bytes.len(),
        Message::Ping(_) | Message::Pong(_) | Message::Close(_) => return None,
    };
    Some(match pacer.per() {
        Per::Byte => size as u64,
        _ => 1,
    })
}

/// `text` cut to a close frame's reason, at a character boundary.
fn cut(mut text: String) -> String {
    if text.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

impl Stream for Limited {
    type Item = Result<Message, axum::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.closing.is_some() {
                ready!(this.poll_closing(cx));
                if std::mem::replace(&mut this.told, true) {
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(Err(this.refusal())));
            }
            if let Some(message) = &this.received {
                if let Some(pacer) = &mut this.incoming
                    && let Some(units) = units(pacer, message)
                    && let Err(refusal) = ready!(pacer.poll_charge(cx, units))
                {
                    this.refuse(refusal);
                    continue;
                }
                return Poll::Ready(this.received.take().map(Ok));
            }
            match ready!(Pin::new(&mut this.socket).poll_next(cx)) {
                Some(Ok(message)) => this.received = Some(message),
                other => return Poll::Ready(other),
            }
        }
    }
}

impl Sink<Message> for Limited {
    type Error = axum::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let this = self.get_mut();
        ready!(this.poll_send_pending(cx))?;
        Pin::new(&mut this.socket).poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        let this = self.get_mut();
        if this.closing.is_some() {
            return Err(this.refusal());
        }
        // Held until its units are paid for (`poll_ready` came first: nothing is held).
        this.sending = Some(item);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let this = self.get_mut();
        ready!(this.poll_send_pending(cx))?;
        Pin::new(&mut this.socket).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let this = self.get_mut();
        // A message waiting for its units is sent first, as a flush would.
        ready!(this.poll_send_pending(cx))?;
        Pin::new(&mut this.socket).poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_cut_at_123_bytes_on_a_character_boundary() {
        assert_eq!(cut("short".into()), "short");
        let long = "é".repeat(100); // 200 bytes
        let cut = cut(long);
        assert_eq!(cut.len(), 122);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(Close::PolicyViolation.code(), 1008);
        assert_eq!(Close::TryAgainLater.code(), 1013);
        assert_eq!(Close::default(), Close::PolicyViolation);
    }
}
