//! What a limit counts inside long-lived requests: [`Per`] (requests, messages or bytes),
//! [`Direction`], [`OverLimit`], and their settings on a [`LimitSpec`](crate::LimitSpec).

use std::time::Duration;

use crate::base::error::ConfigError;

/// What one token of a limit pays for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Per {
    /// A request, checked when it arrives (the default): the middleware's limits.
    #[default]
    Request,
    /// A message of a stream (a WebSocket message, a gRPC message, a server-sent event),
    /// charged as it passes through a [`Pacer`](crate::pace::Pacer).
    Message,
    /// A byte of a body or a stream ([`PacedBody`](crate::pace::PacedBody)); a token may
    /// stand for several ([`LimitSpec::unit`](crate::LimitSpec::unit)).
    Byte,
}

/// Which way the units a stream limit counts go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Direction {
    /// What the client sends (a request body, received messages): the default.
    #[default]
    In,
    /// What the server sends (a response body, sent messages, events).
    Out,
    /// Both, from one bucket.
    Both,
}

impl Direction {
    /// Whether units going in (from the client) are counted.
    pub const fn counts_in(self) -> bool {
        matches!(self, Self::In | Self::Both)
    }

    /// Whether units going out (to the client) are counted.
    pub const fn counts_out(self) -> bool {
        matches!(self, Self::Out | Self::Both)
    }
}

/// What a stream does with units that are over its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OverLimit {
    /// Backpressure: the units are reserved and the stream waits until they are due, at
    /// most `max_wait` per charge (a charge that would wait longer is refused, and takes
    /// nothing). The stream is not read meanwhile, so the peer's flow control slows it.
    ///
    /// Bounded like delay mode: while `max_waiters` streams of the limit wait on this
    /// instance (a layer and its reloads; counted with the requests of a limit of the same
    /// name in delay mode), a charge that would wait is refused instead, as past
    /// `max_wait`; one that the bucket covers at once still passes.
    Wait {
        /// The longest one charge may wait.
        max_wait: Duration,
        /// The most streams of the limit that wait at once ([`DEFAULT_MAX_WAITERS`] by
        /// default).
        max_waiters: usize,
    },
    /// The charge is refused at once: the stream ends the way its protocol says (a
    /// WebSocket close, a gRPC status, a body that fails).
    End,
}

/// How many streams of a limit may wait at once unless it says otherwise
/// ([`OverLimit::max_waiters`]).
pub const DEFAULT_MAX_WAITERS: usize = 10_000;

impl OverLimit {
    /// [`OverLimit::Wait`] for at most `max_wait` per charge, at most
    /// [`DEFAULT_MAX_WAITERS`] streams of the limit waiting at once.
    pub const fn wait(max_wait: Duration) -> Self {
        Self::Wait {
            max_wait,
            max_waiters: DEFAULT_MAX_WAITERS,
        }
    }

    /// At most `n` streams of the limit wait at once (with [`OverLimit::Wait`]; `End`
    /// waits for nothing and is returned as it is).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::pace::OverLimit;
    ///
    /// let over = OverLimit::wait(Duration::from_secs(5)).max_waiters(100);
    /// assert_eq!(over, OverLimit::Wait { max_wait: Duration::from_secs(5), max_waiters: 100 });
    /// assert_eq!(OverLimit::End.max_waiters(100), OverLimit::End);
    /// ```
    pub const fn max_waiters(self, n: usize) -> Self {
        match self {
            Self::Wait { max_wait, .. } => Self::Wait {
                max_wait,
                max_waiters: n,
            },
            Self::End => Self::End,
        }
    }
}

impl Default for OverLimit {
    /// Wait, at most 30 s per charge.
    fn default() -> Self {
        Self::wait(Duration::from_secs(30))
    }
}

/// A limit's stream settings (all at their defaults for a limit of requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Streaming {
    pub(crate) per: Per,
    pub(crate) direction: Option<Direction>,
    pub(crate) over_limit: Option<OverLimit>,
    /// Bytes that pass uncharged at the start of each body (`per = "byte"` only).
    pub(crate) rate_after: Option<u64>,
    /// Units per token (bytes per token for `Per::Byte`); `None`: 1.
    pub(crate) unit: Option<u32>,
}

impl Streaming {
    /// Checks the settings against each other: the stream settings need a stream limit,
    /// `rate_after` a limit of bytes; `max_wait` at least a millisecond.
    pub(crate) fn validate(&self, in_flight: bool) -> Result<(), ConfigError> {
        if self.per == Per::Request {
            let set = [
                ("direction", self.direction.is_some()),
                ("over_limit", self.over_limit.is_some()),
                ("rate_after", self.rate_after.is_some()),
                ("unit", self.unit.is_some()),
            ];
            if let Some((field, _)) = set.iter().find(|(_, set)| *set) {
                return Err(ConfigError::new(
                    *field,
                    "only a limit of messages or bytes (`per = \"message\"` or `\"byte\"`) counts inside a request",
                ));
            }
            return Ok(());
        }
        if in_flight {
            return Err(ConfigError::new(
                "per",
                "an in-flight limit counts requests at once, not messages or bytes",
            ));
        }
        if self.rate_after.is_some() && self.per != Per::Byte {
            return Err(ConfigError::new(
                "rate_after",
                "only a limit of bytes (`per = \"byte\"`) lets the first bytes through",
            ));
        }
        if self.unit == Some(0) {
            return Err(ConfigError::new("unit", "must be at least 1"));
        }
        if let Some(OverLimit::Wait {
            max_wait,
            max_waiters,
        }) = self.over_limit
        {
            if max_wait < Duration::from_millis(1) {
                return Err(ConfigError::new(
                    "max_wait",
                    "must be at least 1ms (use `over_limit = \"end\"` to refuse at once)",
                ));
            }
            if max_waiters == 0 {
                return Err(ConfigError::new(
                    "max_waiters",
                    "must be at least 1 (use `over_limit = \"end\"` to refuse at once)",
                ));
            }
        }
        Ok(())
    }

    /// Whether the limit counts inside requests rather than requests.
    pub(crate) fn is_stream(&self) -> bool {
        self.per != Per::Request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_settings_need_a_stream_limit() {
        let request = Streaming {
            direction: Some(Direction::Out),
            ..Streaming::default()
        };
        let e = request.validate(false).unwrap_err();
        assert_eq!(e.field(), "direction");
        let bytes = Streaming {
            per: Per::Message,
            rate_after: Some(1),
            ..Streaming::default()
        };
        assert_eq!(bytes.validate(false).unwrap_err().field(), "rate_after");
        let ok = Streaming {
            per: Per::Byte,
            rate_after: Some(1),
            unit: Some(1024),
            over_limit: Some(OverLimit::End),
            direction: Some(Direction::Both),
        };
        ok.validate(false).unwrap();
        assert_eq!(ok.validate(true).unwrap_err().field(), "per");
        let zero = Streaming {
            unit: Some(0),
            ..ok
        };
        assert_eq!(zero.validate(false).unwrap_err().field(), "unit");
        let instant = Streaming {
            over_limit: Some(OverLimit::wait(Duration::ZERO)),
            ..ok
        };
        assert_eq!(instant.validate(false).unwrap_err().field(), "max_wait");
        let nobody = Streaming {
            over_limit: Some(OverLimit::wait(Duration::from_secs(1)).max_waiters(0)),
            ..ok
        };
        assert_eq!(nobody.validate(false).unwrap_err().field(), "max_waiters");
        let one = Streaming {
            over_limit: Some(OverLimit::wait(Duration::from_millis(1)).max_waiters(1)),
            ..ok
        };
        one.validate(false).unwrap();
        assert!(ok.is_stream() && !Streaming::default().is_stream());
        assert!(Streaming::default().validate(false).is_ok());
    }

    #[test]
    fn directions_say_which_way_they_count() {
        assert!(Direction::In.counts_in() && !Direction::In.counts_out());
        assert!(!Direction::Out.counts_in() && Direction::Out.counts_out());
        assert!(Direction::Both.counts_in() && Direction::Both.counts_out());
        assert_eq!(
            OverLimit::default(),
            OverLimit::wait(Duration::from_secs(30))
        );
    }
}
