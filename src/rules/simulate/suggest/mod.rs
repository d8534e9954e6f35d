//! `tollgate-rules suggest`: limits suggested from an access log. For each key (client
//! address or header value; with routes, key × route), its peak request count in any
//! 1 s, 1 min and 1 h window, their distribution across keys, and GCRA quotas that a
//! chosen share of the keys would never have met. See [`Suggestion`].

mod bucket;
mod events;
mod html;
mod output;
mod pick;
mod routes;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io::{self, BufRead};
use std::time::Duration;

pub use self::bucket::{min_burst, peak};
pub use self::events::SuggestKey;
pub use self::pick::{Distribution, OUTLIER_RATIO, PERCENTILES};

use self::bucket::{Interval, MinBurst};
use self::events::{Events, Grouping, Item};
use super::parse::LogFormat;
use super::report::BadLine;
use super::{DEFAULT_MAX_KEYS, DEFAULT_MAX_LINE, SimulateError};
use crate::algo::quota::Quota;
use crate::base::error::ConfigError;
use crate::model::key::Key;

/// The most routes `--route` suggests limits for by default (the routes with the most
/// requests).
pub const DEFAULT_MAX_ROUTES: usize = 20;

/// The windows whose peaks are measured, one suggested limit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Window {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
}

impl Window {
    /// The three, shortest first.
    pub const ALL: [Window; 3] = [Window::Second, Window::Minute, Window::Hour];

    /// Its length.
    pub const fn duration(self) -> Duration {
        match self {
            Self::Second => Duration::from_secs(1),
            Self::Minute => Duration::from_secs(60),
            Self::Hour => Duration::from_secs(3_600),
        }
    }

    /// `1s`, `1min`, `1h`.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Second => "1s",
            Self::Minute => "1min",
            Self::Hour => "1h",
        }
    }

    /// The unit of a quota per window: `s`, `min`, `h`.
    const fn unit(self) -> &'static str {
        match self {
            Self::Second => "s",
            Self::Minute => "min",
            Self::Hour => "h",
        }
    }

    const fn nanos(self) -> i64 {
        self.duration().as_secs() as i64 * 1_000_000_000
    }
}

/// Suggesting limits from an access log (`tollgate-rules suggest`): for each key, its
/// peak request count in any 1 s, 1 min and 1 h window; their distribution across keys;
/// and per window a GCRA quota (`rate/window; burst=B`) that at least the chosen
/// [`share`](Self::share) of the keys would never have been refused by, the three
/// limits together, as [`simulate`](super::Simulation) replays them.
///
/// The log is read as [`Simulation`](super::Simulation) reads it: the same bad lines
/// (counted with their numbers), the same times (a late line at the latest time seen),
/// the same keys (`peer_ip`'s grouping of addresses, a header's first non-empty value).
///
/// How the quota is chosen: first the keys to cover, the share of them, over the three
/// windows together (a key's peak in a window is its most requests in any interval of
/// the window's length; the keys left out are, one by one, the one whose peak is the most
/// out of line in some window, relative to that window's peak at the share). The share
/// is rounded up to whole keys, except that the one key more rounding up takes in is left
/// out when it is an outlier: a peak more than [`OUTLIER_RATIO`] times every other covered
/// key's in some window ([`GroupSuggestion::outliers`]; 99.9 % of five keys, one a
/// flooder, covers the other four). Per window `W`,
/// the rate is the largest peak among them. The burst is exact for GCRA: a key whose
/// requests all pass at `T = W / rate` needs a bucket of
/// `max over i ≤ j of ⌈(j − i + 1) − (t_j − t_i) / T⌉` ([`min_burst`]; computed per key in
/// one pass, in both stores' units), and the burst is the largest of the covered keys'.
/// A peak of `P` per minute does not make `P/min; burst=P` safe: `T` is rounded up to the
/// nanosecond, so `7/min` refills 7 tokens in a hair over 60 s and refuses the 14th of 7
/// at 0 s and 7 at 60 s.
///
/// Memory: about 400 bytes per key (100,000 keys: 39 MB), at most
/// [`max_keys`](Self::max_keys) keys (requests of further keys are counted, not measured:
/// [`Suggested::capped_requests`]); the log's lines at most
/// [`max_line`](Self::max_line) bytes each. The peaks are exact in
/// that memory: the log is read by four readers at once, a leading one counting each
/// key's requests and, per window, one trailing it by the window's length counting the
/// requests that left it, so a key's count in the window ending now is the difference
/// of two counters. The bursts take a second pass, at the rates the first chose; with
/// routes, a first pass chooses the routes. So the log is read 5 times (6 with routes):
/// `run` takes a function that opens it.
///
/// ```
/// use tollgate::rules::{LogFormat, suggest::{Suggestion, SuggestKey, Window}};
///
/// let log = "\
/// 203.0.113.7 - - [10/Oct/2024:13:55:36 +0000] \"GET / HTTP/1.1\" 200 12 \"-\" \"curl\"
/// 203.0.113.7 - - [10/Oct/2024:13:55:36 +0000] \"GET / HTTP/1.1\" 200 12 \"-\" \"curl\"
/// 203.0.113.7 - - [10/Oct/2024:13:55:50 +0000] \"GET / HTTP/1.1\" 200 12 \"-\" \"curl\"
/// 198.51.100.1 - - [10/Oct/2024:13:55:51 +0000] \"GET / HTTP/1.1\" 200 12 \"-\" \"curl\"
/// ";
/// let s = Suggestion::new(LogFormat::Combined, SuggestKey::Ip)
///     .run(|| Ok(log.as_bytes()))?;
/// assert_eq!((s.requests, s.keys), (4, 2));
/// let minute = &s.groups[0].windows[1];
/// assert_eq!(minute.window, Window::Minute);
/// // 3/min refills a token every 20 s: 2 at 0 s and one at 14 s need a bucket of 3.
/// assert_eq!((minute.peaks.max(), minute.rate, minute.burst), (3, 3, 3));
/// assert!(s.rules().contains("quota = \"3/min; burst=3\""));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Suggestion {
    format: LogFormat,
    key: SuggestKey,
    routes: bool,
    share: f64,
    max_keys: usize,
    max_routes: usize,
    max_line: usize,
    max_bad: usize,
}

impl Suggestion {
    /// Limits per `key` for a log in `format`: 99.9 % of the keys never refused, no
    /// routes, at most [`DEFAULT_MAX_KEYS`] keys, lines of at most [`DEFAULT_MAX_LINE`]
    /// bytes, the first 100 bad lines listed.
    pub fn new(format: LogFormat, key: SuggestKey) -> Self {
        Self {
            format,
            key,
            routes: false,
            share: 0.999,
            max_keys: DEFAULT_MAX_KEYS,
            max_routes: DEFAULT_MAX_ROUTES,
            max_line: DEFAULT_MAX_LINE,
            max_bad: 100,
        }
    }

    /// Per key and route (`GET /users/{id}`: segments that look like ids grouped), one
    /// set of limits per route, for the [`max_routes`](Self::max_routes) routes with the
    /// most requests.
    pub fn routes(mut self, on: bool) -> Self {
        self.routes = on;
        self
    }

    /// The share of keys (0 to 1, default 0.999) that the suggestion never refuses.
    pub fn share(mut self, share: f64) -> Self {
        self.share = if share.is_nan() {
            1.0
        } else {
            share.clamp(0.0, 1.0)
        };
        self
    }

    /// The most keys measured (default [`DEFAULT_MAX_KEYS`]).
    pub fn max_keys(mut self, keys: usize) -> Self {
        self.max_keys = keys;
        self
    }

    /// The most routes given limits with [`routes`](Self::routes).
    pub fn max_routes(mut self, routes: usize) -> Self {
        self.max_routes = routes;
        self
    }

    /// The longest line read, in bytes (at least 1); longer ones are bad lines.
    pub fn max_line(mut self, bytes: usize) -> Self {
        self.max_line = bytes.max(1);
        self
    }

    /// How many bad lines the result lists (all are counted).
    pub fn max_bad(mut self, lines: usize) -> Self {
        self.max_bad = lines;
        self
    }

    /// Reads the log (each call of `open` opens it from its start) and suggests.
    pub fn run<R: BufRead>(
        &self,
        mut open: impl FnMut() -> io::Result<R>,
    ) -> Result<Suggested, SimulateError> {
        self.check()?;
        let io = SimulateError::Io;
        let chosen = if self.routes {
            Some(self.choose_routes(open().map_err(io)?)?)
        } else {
            None
        };
        let grouping = || match &chosen {
            Some(c) => Grouping::Table(&c.table),
            None => Grouping::All,
        };
        let events =
            |input: R| Events::new(input, self.max_line, &self.format, &self.key, grouping());
        let group_count = chosen.as_ref().map_or(1, |c| c.specs.len());
        let mut out = Suggested {
            lines: 0,
            bad_lines: 0,
            bad: Vec::new(),
            late_lines: 0,
            requests: 0,
            without_key: 0,
            unrouted: 0,
            keys: 0,
            capped_requests: 0,
            share: self.share,
            key: self.key.clone(),
            span: None,
            groups: Vec::new(),
            overall: Vec::new(),
        };
        // Pass 1: the peaks.
        let mut table = Table::default();
        let mut group_requests = vec![0u64; group_count + 1];
        let mut lead = events(open().map_err(io)?);
        let mut trails = Vec::with_capacity(3);
        for _ in Window::ALL {
            trails.push(Trail {
                events: events(open().map_err(io)?),
                pending: None,
            });
        }
        while let Some((number, item)) = lead.next_item().map_err(io)? {
            out.lines += 1;
            let (time, key, group) = match item {
                Item::Bad(reason) => {
                    out.bad_lines += 1;
                    if out.bad.len() < self.max_bad {
                        out.bad.push(BadLine {
                            line: number,
                            reason,
                        });
                    }
                    continue;
                }
                Item::Keyless => {
                    out.without_key += 1;
                    continue;
                }
                Item::Unrouted | Item::Candidate(..) => {
                    out.unrouted += 1;
                    continue;
                }
                Item::Request { time, key, group } => (time, key, group),
            };
            out.requests += 1;
            group_requests[group as usize] += 1;
            let secs = time.div_euclid(1_000_000_000);
            out.span = Some(out.span.map_or((secs, secs), |(s, _)| (s, secs)));
            for (w, trail) in trails.iter_mut().enumerate() {
                trail.advance(w, time - Window::ALL[w].nanos(), &mut table)?;
            }
            let Some(slot) = table.slot(group, key, self.max_keys) else {
                out.capped_requests += 1;
                continue;
            };
            slot.count += 1;
            for w in 0..3 {
                slot.peak[w] = slot.peak[w].max(slot.count - slot.trail[w]);
            }
        }
        out.late_lines = lead.late;
        drop((lead, trails));
        out.keys = table.slots.len() as u64;

        // The keys to cover, per group: the share, chosen over the three windows' peaks
        // together; the rates: per window, the largest peak among them.
        let mut by_group: Vec<Vec<usize>> = vec![Vec::new(); group_count + 1];
        for (i, s) in table.slots.iter().enumerate() {
            by_group[s.group as usize].push(i);
        }
        let mut rates = vec![[Interval::of(&Quota::per_second(1)); 3]; group_count + 1];
        let mut covered: Vec<Vec<usize>> = vec![Vec::new(); group_count + 1];
        let mut groups = Vec::with_capacity(group_count);
        for (g, members) in by_group.iter().enumerate().skip(1) {
            let peaks: Vec<[u64; 3]> = members.iter().map(|&i| table.slots[i].peak).collect();
            let (chosen_keys, outlier) = pick::choose(&peaks, self.share);
            covered[g] = chosen_keys;
            let top = pick::largest(&peaks, &covered[g]);
            let windows: Vec<WindowSuggestion> = Window::ALL
                .iter()
                .enumerate()
                .map(|(w, &window)| {
                    let max_rate = window.duration().as_micros() as u64;
                    let rate = top[w].clamp(1, max_rate);
                    let quota = Quota::new(rate, window.duration()).unwrap_or(Quota::per_second(1));
                    rates[g][w] = Interval::of(&quota);
                    WindowSuggestion {
                        window,
                        peaks: Distribution::new(peaks.iter().map(|k| k[w]).collect()),
                        bursts: Distribution::default(),
                        rate,
                        burst: 1,
                    }
                })
                .collect();
            groups.push(GroupSuggestion {
                route: chosen.as_ref().map(|c| c.specs[g - 1].clone()),
                keys: members.len() as u64,
                requests: group_requests[g],
                never_refused: 0,
                outliers: u64::from(outlier.is_some()),
                windows,
            });
        }

        // Pass 2: each key's least burst at its group's rates.
        let mut states = vec![[MinBurst::new(); 3]; table.slots.len()];
        let mut second = events(open().map_err(io)?);
        while let Some((time, key, group)) = second.next_request().map_err(io)? {
            if let Some(&i) = table.index.get(&(group, key)) {
                for (w, state) in states[i as usize].iter_mut().enumerate() {
                    state.push(time, rates[group as usize][w]);
                }
            }
        }
        for (g, members) in by_group.iter().enumerate().skip(1) {
            let group = &mut groups[g - 1];
            let needs: Vec<[u64; 3]> = members
                .iter()
                .map(|&i| {
                    let s = &states[i];
                    [0, 1, 2].map(|w| s[w].burst(rates[g][w]))
                })
                .collect();
            // The bursts: the least that covers the chosen keys at the rates.
            let bursts = pick::largest(&needs, &covered[g]);
            group.never_refused = needs
                .iter()
                .filter(|k| (0..3).all(|w| k[w] <= bursts[w]))
                .count() as u64;
            for (w, ws) in group.windows.iter_mut().enumerate() {
                ws.burst = bursts[w].max(1);
                ws.bursts = Distribution::new(needs.iter().map(|k| k[w]).collect());
            }
        }
        out.overall = Window::ALL
            .iter()
            .enumerate()
            .map(|(w, &window)| {
                (
                    window,
                    Distribution::new(table.slots.iter().map(|s| s.peak[w]).collect()),
                )
            })
            .collect();
        out.groups = groups;
        Ok(out)
    }

    fn check(&self) -> Result<(), SimulateError> {
        let SuggestKey::Header(name) = &self.key else {
            return Ok(());
        };
        let mapped = match &self.format {
            LogFormat::Json(fields) => fields.headers.iter().any(|(h, _)| h == name),
            LogFormat::Combined | LogFormat::CombinedWith(_) => false,
        };
        if mapped {
            return Ok(());
        }
        Err(SimulateError::Rules(ConfigError::new(
            "--key",
            format!(
                "`header:{name}`: no log field becomes the header; map one with \
                 `--format json --header {name}=FIELD`"
            ),
        )))
    }

    fn choose_routes<R: BufRead>(&self, input: R) -> Result<routes::Chosen, SimulateError> {
        let mut events = Events::new(
            input,
            self.max_line,
            &self.format,
            &self.key,
            Grouping::Candidates,
        );
        let mut candidates: HashMap<(http::Method, String), u64> = HashMap::new();
        while let Some((_, item)) = events.next_item().map_err(SimulateError::Io)? {
            let Item::Candidate(method, Some(template)) = item else {
                continue;
            };
            let len = candidates.len();
            match candidates.entry((method, template)) {
                Entry::Occupied(mut e) => *e.get_mut() += 1,
                Entry::Vacant(e) => {
                    if len < routes::MAX_CANDIDATES {
                        e.insert(1);
                    }
                }
            }
        }
        Ok(routes::choose(candidates, self.max_routes))
    }
}

/// One key's measures.
struct Slot {
    group: u32,
    /// Its requests so far (the leading reader's count).
    count: u64,
    /// Per window, its requests the trailing reader has passed: out of the window.
    trail: [u64; 3],
    peak: [u64; 3],
}

/// The keys measured, at most `max_keys`.
#[derive(Default)]
struct Table {
    index: HashMap<(u32, Key), u32>,
    slots: Vec<Slot>,
}

impl Table {
    /// The key's slot, made if there is room.
    fn slot(&mut self, group: u32, key: Key, max_keys: usize) -> Option<&mut Slot> {
        let next = self.slots.len();
        let i = match self.index.entry((group, key)) {
            Entry::Occupied(e) => *e.get() as usize,
            Entry::Vacant(e) if next < max_keys.min(u32::MAX as usize) => {
                e.insert(next as u32);
                self.slots.push(Slot {
                    group,
                    count: 0,
                    trail: [0; 3],
                    peak: [0; 3],
                });
                next
            }
            Entry::Vacant(_) => return None,
        };
        Some(&mut self.slots[i])
    }
}

/// A reader of the log trailing the leading one by a window's length.
struct Trail<'a, R> {
    events: Events<'a, R>,
    pending: Option<(i64, Key, u32)>,
}

impl<R: BufRead> Trail<'_, R> {
    /// Passes the requests at or before `until`: each leaves its key's window `w`.
    fn advance(&mut self, w: usize, until: i64, table: &mut Table) -> Result<(), SimulateError> {
        loop {
            if self.pending.is_none() {
                self.pending = self.events.next_request().map_err(SimulateError::Io)?;
            }
            match self.pending.take() {
                Some((time, key, group)) if time <= until => {
                    if let Some(&i) = table.index.get(&(group, key)) {
                        table.slots[i as usize].trail[w] += 1;
                    }
                }
                other => {
                    self.pending = other;
                    return Ok(());
                }
            }
        }
    }
}

/// One window's part of a [`GroupSuggestion`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowSuggestion {
    /// The window.
    pub window: Window,
    /// Each key's peak: the most requests it sent in any interval of the window's length.
    pub peaks: Distribution,
    /// Each key's least burst at [`rate`](Self::rate) (0 for a key without requests).
    pub bursts: Distribution,
    /// The suggested rate per window: the peak the share of keys does not exceed.
    pub rate: u64,
    /// The suggested burst.
    pub burst: u64,
}

impl WindowSuggestion {
    /// The quota as a rules file writes it: `12/min; burst=5`.
    pub fn quota(&self) -> String {
        format!("{}/{}; burst={}", self.rate, self.window.unit(), self.burst)
    }
}

/// The suggestion for one group of keys: all of them, or one route's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupSuggestion {
    /// The route (`GET /users/{id}`), with [`Suggestion::routes`].
    pub route: Option<String>,
    /// The keys measured.
    pub keys: u64,
    /// Their requests (those of keys beyond the cap included).
    pub requests: u64,
    /// The keys the three suggested limits would never have refused: at least the share
    /// (rounded up), less the [`outliers`](Self::outliers).
    pub never_refused: u64,
    /// Keys left out beyond the share (0 or 1): when the share does not come to a whole
    /// number of keys (99.9 % of 5), the one key more that rounding up would take in, if
    /// its peak in some window is more than [`OUTLIER_RATIO`] times every other covered
    /// key's (a flooder among few keys).
    pub outliers: u64,
    /// Per window (1 s, 1 min, 1 h): distributions and the suggested quota.
    pub windows: Vec<WindowSuggestion>,
}

/// The outcome of [`Suggestion::run`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Suggested {
    /// Lines read (bad ones included).
    pub lines: u64,
    /// Lines that could not be read as requests.
    pub bad_lines: u64,
    /// The first of them.
    pub bad: Vec<BadLine>,
    /// Lines earlier than the line before them, counted at the latest time seen.
    pub late_lines: u64,
    /// Requests with a key (and, with routes, on a chosen route).
    pub requests: u64,
    /// Requests without the key: the suggested limits skip them (`on_missing_key = "skip"`).
    pub without_key: u64,
    /// With routes: requests on none of the chosen routes.
    pub unrouted: u64,
    /// Keys measured (key × route with routes).
    pub keys: u64,
    /// Requests of keys beyond [`Suggestion::max_keys`], not measured.
    pub capped_requests: u64,
    /// The share of keys never refused that was asked for.
    pub share: f64,
    /// What a key is.
    pub key: SuggestKey,
    /// The Unix time (seconds) of the first and the last request.
    pub span: Option<(i64, i64)>,
    /// One group without routes; one per chosen route with them.
    pub groups: Vec<GroupSuggestion>,
    /// Per window, every key's peak, all groups together.
    pub overall: Vec<(Window, Distribution)>,
}
