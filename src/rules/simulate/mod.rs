//! Replaying an access log through rules before deploying them (`tollgate-rules
//! simulate`): the log's lines (`lines`, `parse`), the replay through the real layer
//! (`replay`) and what it found (`report`). See [`Simulation`].

mod answer;
mod held;
mod html;
mod lines;
mod parse;
mod replay;
mod report;
pub mod suggest;
pub(crate) mod svg;
mod timeline;
mod uris;

use std::fmt;
use std::io::BufRead;

pub use self::parse::{CombinedFields, JsonFields, LogFormat};
pub use self::report::{BadLine, Difference, LimitReport, MAX_BAN_LEVELS, MAX_MINUTES, Report};
pub use self::timeline::{TIMELINE_BUCKETS, Timeline};

use crate::base::error::ConfigError;
use crate::rules::document::Document;

/// The longest line read by default (64 KiB); longer ones are skipped as bad.
pub const DEFAULT_MAX_LINE: usize = 64 * 1024;

/// The most refused keys a limit's report remembers by default.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The most responses held at once for their logged duration by default (about 100
/// bytes each, with what their end gives back): past it, the one that ends first is let
/// go early ([`Report::released_early`]).
pub const DEFAULT_MAX_HELD: usize = 1_000_000;

/// A replay of an access log through rules before deploying them (`tollgate-rules
/// simulate`): what would these rules have refused, whom, and when? It holds the log's
/// format and the bounds; [`run`](Self::run) gives the [`Report`].
///
/// Each line of the log (nginx/Apache combined format, or JSON lines through a
/// [`JsonFields`] map) becomes a request — its method, path, headers, and the client's
/// address as the peer address — sent at the logged time through the layer the rules
/// build, the same code path a server runs, over a [`MemoryStore`](crate::store::MemoryStore)
/// on a [`FakeClock`](crate::clock::FakeClock) set to each line's time. The application
/// behind the layer answers with the logged status.
///
/// Lines are replayed in the order given; a line earlier than the one before it is
/// replayed at the latest time seen (counted in [`Report::late_lines`]). A line that
/// cannot be read (truncated, a bad date, binary, longer than
/// [`max_line`](Simulation::max_line)) is counted with its number and skipped: it never
/// ends the run, and an over-long line is never held in memory.
///
/// ```
/// use tollgate::rules::{Document, LogFormat, Simulation};
///
/// let doc = Document::from_toml(r#"
///     [[limits]]
///     name = "per-ip"
///     key = "peer_ip"
///     quota = "2/min"
/// "#)?;
/// let log = "\
/// 203.0.113.7 - - [10/Oct/2024:13:55:36 +0000] \"GET / HTTP/1.1\" 200 12 \"-\" \"curl\"
/// 203.0.113.7 - - [10/Oct/2024:13:55:37 +0000] \"GET / HTTP/1.1\" 200 12 \"-\" \"curl\"
/// 203.0.113.7 - - [10/Oct/2024:13:55:38 +0000] \"GET / HTTP/1.1\" 200 12 \"-\" \"curl\"
/// not a log line
/// ";
/// let report = Simulation::new(LogFormat::Combined).run(&doc, log.as_bytes())?;
/// assert_eq!((report.lines, report.bad_lines, report.bad[0].line), (4, 1, 4));
/// let limit = &report.limits[0];
/// assert_eq!((limit.requests, limit.refused, limit.keys_refused), (3, 1, 1));
/// assert_eq!(limit.top_refused[0], ("@203.0.113.7".to_owned(), 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Three kinds of limit need a field more than the combined format has (named with
/// [`JsonFields`], or by position after the user agent with [`CombinedFields`]):
///
/// - **Settled costs** (`settle`): a line's actual usage (`usage` field) is answered in
///   the header or trailer the limit's `settle` names, so the limit settles to it at the
///   response's end, as live. A line without it (or `-`) leaves the estimate (`cost`) as
///   the cost, as live when the application reports nothing.
/// - **In-flight limits** (`in_flight`): a line's duration in seconds (`duration` field,
///   nginx's `$request_time`) holds its response, and the unit it holds, until the
///   simulated clock passes the line's time plus the duration. At most
///   [`max_held`](Self::max_held) are held at once (the one ending first is let go early,
///   counted in [`Report::released_early`]). A line without it ends at once: without the
///   field, in-flight limits never refuse.
/// - **Bans** need no field: refusals by a ban and the bans that began, by repeat level,
///   are counted per limit ([`LimitReport::banned_refused`], [`LimitReport::bans_by_level`]).
///
/// Not simulated: delay mode waits for real (keep such logs short or switch the limit to
/// refusing); calendar quotas follow the wall clock, not the log's; the store is always
/// the memory store on one instance, so Redis (its failure policies, `Share`, lease
/// mode's local decisions, bans shared between instances) is not rehearsed, and a lease
/// decides as the memory store's bucket would; the application's own use of the
/// `Limiter` (`reserve`, `acquire`, `penalize`, bans by hand) is not in the log; the rules
/// are not reloaded during a replay. See the guide's "Limits of the rehearsal".
#[derive(Debug, Clone)]
pub struct Simulation {
    format: LogFormat,
    max_line: usize,
    max_held: usize,
    max_keys: usize,
    max_bad: usize,
    top: usize,
}

impl Simulation {
    /// A replay of logs in `format`, with lines of at most [`DEFAULT_MAX_LINE`] bytes, at
    /// most [`DEFAULT_MAX_KEYS`] refused keys remembered per limit, at most
    /// [`DEFAULT_MAX_HELD`] responses held for their duration, the first 100 bad lines
    /// listed and the top 10 refused keys reported.
    pub fn new(format: LogFormat) -> Self {
        Self {
            format,
            max_line: DEFAULT_MAX_LINE,
            max_held: DEFAULT_MAX_HELD,
            max_keys: DEFAULT_MAX_KEYS,
            max_bad: 100,
            top: 10,
        }
    }

    /// The longest line read, in bytes (at least 1); longer ones are bad lines.
    pub fn max_line(mut self, bytes: usize) -> Self {
        self.max_line = bytes.max(1);
        self
    }

    /// The most responses held at once for their logged duration (in-flight limits); past
    /// it, the one that ends first is let go early ([`Report::released_early`]).
    pub fn max_held(mut self, responses: usize) -> Self {
        self.max_held = responses;
        self
    }

    /// The most distinct refused keys remembered per limit; refusals beyond them are
    /// counted, their keys not ([`LimitReport::keys_capped`]).
    pub fn max_keys(mut self, keys: usize) -> Self {
        self.max_keys = keys;
        self
    }

    /// How many bad lines the report lists (all are counted).
    pub fn max_bad(mut self, lines: usize) -> Self {
        self.max_bad = lines;
        self
    }

    /// How many of the most refused keys each limit's report names.
    pub fn top(mut self, keys: usize) -> Self {
        self.top = keys;
        self
    }

    /// Replays `log` through the rules of `doc`, line by line. It blocks, on a Tokio
    /// runtime of its own: called from async code (inside a runtime), it refuses with
    /// [`SimulateError::InRuntime`]; use `tokio::task::spawn_blocking` there.
    pub fn run(&self, doc: &Document, log: impl BufRead) -> Result<Report, SimulateError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(SimulateError::InRuntime);
        }
        replay::run(self, doc, log)
    }
}

/// Why a replay could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum SimulateError {
    /// The rules are not valid.
    Rules(ConfigError),
    /// The log could not be read.
    Io(std::io::Error),
    /// [`Simulation::run`] was called inside a Tokio runtime.
    InRuntime,
}

impl From<ConfigError> for SimulateError {
    fn from(e: ConfigError) -> Self {
        Self::Rules(e)
    }
}

impl fmt::Display for SimulateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rules(e) => e.fmt(f),
            Self::Io(e) => write!(f, "reading the log: {e}"),
            Self::InRuntime => f.write_str(
                "a simulation blocks: run it outside async code (e.g. in spawn_blocking)",
            ),
        }
    }
}

impl std::error::Error for SimulateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Rules(e) => Some(e),
            Self::Io(e) => Some(e),
            Self::InRuntime => None,
        }
    }
}
