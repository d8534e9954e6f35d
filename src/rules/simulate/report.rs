//! What a replay found: per limit, the requests, the refusals, the refused keys (at most
//! `max_keys` of them) and when the refusals happened; as text and as JSON.

use std::collections::BTreeMap;
use std::fmt;

use super::timeline::Timeline;
use crate::model::key::Key;
use crate::observe::offenders;
use crate::web::hooks::Refusal;

/// A line of the log that was not replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// Its 1-based number.
    pub line: u64,
    /// What is wrong with it (`bad time`, `truncated request`, `longer than 65536 bytes`, ...).
    pub reason: &'static str,
}

/// One limit's part in a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitReport {
    /// The limit's name.
    pub name: String,
    /// The requests the limit was checked for (refused by a ban included).
    pub requests: u64,
    /// The requests it refused (for a shadow limit: would have refused); bans included.
    pub refused: u64,
    /// Refusals by a shadow limit (reported, never enforced), among `refused`.
    pub shadow_refused: u64,
    /// Refusals because the key was banned by this limit (before its bucket was asked),
    /// among `refused`.
    pub banned_refused: u64,
    /// Bans this limit began.
    pub bans: u64,
    /// The bans that began at each repeat level: `bans_by_level[0]` first bans,
    /// `[1]` first repeats, ...; empty without bans, at most [`MAX_BAN_LEVELS`] entries
    /// (the last counts that level and the ones above).
    pub bans_by_level: Vec<u64>,
    /// The distinct keys refused at least once (at most the report's key cap: see
    /// [`keys_capped`](Self::keys_capped)).
    pub keys_refused: u64,
    /// Whether more keys were refused than the cap held: their refusals are counted, the
    /// keys not.
    pub keys_capped: bool,
    /// The most refused keys, most first, as the refusal log writes them.
    pub top_refused: Vec<(String, u64)>,
    /// Refusals per minute (Unix time of the minute's start, in seconds), minutes without
    /// refusals left out: at most [`MAX_MINUTES`] minutes, the first ones with refusals
    /// (see [`per_minute_capped`](Self::per_minute_capped)).
    pub per_minute: Vec<(i64, u64)>,
    /// Whether refusals fell in more minutes than [`MAX_MINUTES`]: those of later minutes
    /// are counted in `refused` and the timeline, not here.
    pub per_minute_capped: bool,
}

/// The most repeat levels a [`LimitReport`] counts apart (levels 0 to 63; a ban's length
/// stops growing by then).
pub const MAX_BAN_LEVELS: usize = 64;

/// The most minutes with refusals a [`LimitReport`] lists one by one (31 days' worth): a
/// log of any length takes bounded memory.
pub const MAX_MINUTES: usize = 31 * 24 * 60;

impl LimitReport {
    /// The refused share of the requests, 0 to 1.
    pub fn refused_share(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.refused as f64 / self.requests as f64
        }
    }
}

/// The outcome of [`Simulation::run`](super::Simulation::run).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Lines read (bad ones included).
    pub lines: u64,
    /// Lines that could not be replayed.
    pub bad_lines: u64,
    /// The first of them (at most [`Simulation::max_bad`](super::Simulation::max_bad)).
    pub bad: Vec<BadLine>,
    /// Lines earlier than the line before them, replayed at the latest time seen.
    pub late_lines: u64,
    /// Requests replayed.
    pub requests: u64,
    /// Requests the rules answered with a refusal (429, or a ban's status).
    pub refused: u64,
    /// Requests whose line carried an actual usage (the log's usage field).
    pub with_usage: u64,
    /// Responses held for their logged duration (the log's duration field) because their
    /// end gives something back (an in-flight unit, a settled cost).
    pub held: u64,
    /// The most responses held at once.
    pub most_held: u64,
    /// Held responses let go before their end because
    /// [`max_held`](super::Simulation::max_held) were held: with any, in-flight limits
    /// refused fewer than they would have.
    pub released_early: u64,
    /// The Unix time (seconds) of the first and the last replayed request.
    pub span: Option<(i64, i64)>,
    /// Per limit, in the document's order.
    pub limits: Vec<LimitReport>,
    /// Requests and refusals per limit over the log's span, in at most
    /// [`TIMELINE_BUCKETS`](super::TIMELINE_BUCKETS) buckets.
    pub timeline: Timeline,
    /// Every refused key (of any limit) and its refusals, for [`Report::difference`].
    pub(crate) keys: BTreeMap<String, u64>,
}

/// The keys one replay refused and another did not: [`Report::difference`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Difference {
    /// Keys refused by the new rules, never by the old, with the new refusals; most
    /// first.
    pub newly_refused: Vec<(String, u64)>,
    /// Keys refused by the old rules, never by the new, with the old refusals; most first.
    pub no_longer_refused: Vec<(String, u64)>,
}

impl Difference {
    /// The difference as JSON: `{"newly_refused": [{"key", "refused"}],
    /// "no_longer_refused": [...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        let list = |keys: &[(String, u64)]| {
            keys.iter()
                .map(|(k, n)| serde_json::json!({"key": k, "refused": n}))
                .collect::<Vec<_>>()
        };
        serde_json::json!({
            "newly_refused": list(&self.newly_refused),
            "no_longer_refused": list(&self.no_longer_refused),
        })
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (title, keys) in [
            ("refused by the new rules only", &self.newly_refused),
            ("refused by the old rules only", &self.no_longer_refused),
        ] {
            writeln!(f, "{} keys {title}", keys.len())?;
            for (key, n) in keys.iter().take(20) {
                writeln!(f, "  {n:>8}  {key}")?;
            }
            if keys.len() > 20 {
                writeln!(f, "  ... and {} more", keys.len() - 20)?;
            }
        }
        Ok(())
    }
}

/// A limit's counts while the log is replayed.
pub(crate) struct Tally {
    pub(crate) name: String,
    pub(crate) requests: u64,
    pub(crate) refused: u64,
    pub(crate) shadow: u64,
    banned: u64,
    levels: Vec<u64>,
    keys: hashbrown::HashMap<Key, u64, foldhash::fast::RandomState>,
    capped: bool,
    minutes: BTreeMap<i64, u64>,
    minutes_capped: bool,
}

impl Tally {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            requests: 0,
            refused: 0,
            shadow: 0,
            banned: 0,
            levels: Vec::new(),
            keys: hashbrown::HashMap::default(),
            capped: false,
            minutes: BTreeMap::new(),
            minutes_capped: false,
        }
    }

    /// A refusal of `key` at Unix time `secs`.
    pub(crate) fn refusal(&mut self, key: Option<&Key>, secs: i64, how: Refusal, max_keys: usize) {
        self.refused += 1;
        self.shadow += u64::from(how == Refusal::Shadow);
        self.banned += u64::from(how == Refusal::Banned);
        let minute = secs.div_euclid(60) * 60;
        if let Some(n) = self.minutes.get_mut(&minute) {
            *n += 1;
        } else if self.minutes.len() < MAX_MINUTES {
            self.minutes.insert(minute, 1);
        } else {
            self.minutes_capped = true;
        }
        let Some(key) = key else { return };
        if let Some(n) = self.keys.get_mut(key) {
            *n += 1;
        } else if self.keys.len() < max_keys {
            self.keys.insert(key.clone(), 1);
        } else {
            self.capped = true;
        }
    }

    /// A ban that began at repeat `level`.
    pub(crate) fn ban_began(&mut self, level: u32) {
        let i = (level as usize).min(MAX_BAN_LEVELS - 1);
        if self.levels.len() <= i {
            self.levels.resize(i + 1, 0);
        }
        self.levels[i] += 1;
    }

    /// The limit's report; its refused keys added to `all`.
    pub(crate) fn finish(self, top: usize, all: &mut BTreeMap<String, u64>) -> LimitReport {
        for (k, &n) in &self.keys {
            *all.entry(offenders::render(k, Some(false))).or_default() += n;
        }
        let mut keys: Vec<(&Key, u64)> = self.keys.iter().map(|(k, &n)| (k, n)).collect();
        let rendered = |k: &Key| offenders::render(k, Some(false));
        keys.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| rendered(a.0).cmp(&rendered(b.0)))
        });
        LimitReport {
            name: self.name,
            requests: self.requests,
            refused: self.refused,
            shadow_refused: self.shadow,
            banned_refused: self.banned,
            bans: self.levels.iter().sum(),
            bans_by_level: self.levels,
            keys_refused: self.keys.len() as u64,
            keys_capped: self.capped,
            top_refused: keys
                .into_iter()
                .take(top)
                .map(|(k, n)| (rendered(k), n))
                .collect(),
            per_minute: self.minutes.into_iter().collect(),
            per_minute_capped: self.minutes_capped,
        }
    }
}

impl Report {
    /// The keys this replay (the new rules) refused and `old` did not, and the reverse.
    /// Keys are compared as reports write them; a limit whose keys were capped
    /// ([`LimitReport::keys_capped`]) compares the keys it held.
    pub fn difference(&self, old: &Report) -> Difference {
        let only = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
            let mut keys: Vec<(String, u64)> = a
                .iter()
                .filter(|(k, _)| !b.contains_key(*k))
                .map(|(k, &n)| (k.clone(), n))
                .collect();
            keys.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
            keys
        };
        Difference {
            newly_refused: only(&self.keys, &old.keys),
            no_longer_refused: only(&old.keys, &self.keys),
        }
    }

    /// The report as JSON: `{"lines", "bad_lines", "bad": [{"line", "reason"}],
    /// "late_lines", "requests", "refused", "with_usage", "held", "most_held",
    /// "released_early", "limits": [{"name", "requests", "refused", "shadow_refused",
    /// "banned_refused", "bans", "bans_by_level": [N, ...], "keys_refused",
    /// "keys_capped", "top_refused": [{"key",
    /// "refused"}], "per_minute": [{"minute", "refused"}], "timeline": [N, ...]}],
    /// "timeline": {"start", "width", "requests": [N, ...]}}` (`minute`, `start`: Unix
    /// seconds; `width`: seconds; a limit's `timeline`: its refusals in the same buckets as
    /// the top-level `requests`).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        json!({
            "lines": self.lines,
            "bad_lines": self.bad_lines,
            "bad": self.bad.iter().map(|b| json!({"line": b.line, "reason": b.reason})).collect::<Vec<_>>(),
            "late_lines": self.late_lines,
            "requests": self.requests,
            "refused": self.refused,
            "with_usage": self.with_usage,
            "held": self.held,
            "most_held": self.most_held,
            "released_early": self.released_early,
            "timeline": json!({
                "start": self.timeline.start,
                "width": self.timeline.width,
                "requests": self.timeline.requests,
            }),
            "limits": self.limits.iter().enumerate().map(|(i, l)| json!({
                "name": l.name,
                "requests": l.requests,
                "refused": l.refused,
                "shadow_refused": l.shadow_refused,
                "banned_refused": l.banned_refused,
                "bans": l.bans,
                "bans_by_level": l.bans_by_level,
                "keys_refused": l.keys_refused,
                "keys_capped": l.keys_capped,
                "top_refused": l.top_refused.iter().map(|(k, n)| json!({"key": k, "refused": n})).collect::<Vec<_>>(),
                "per_minute": l.per_minute.iter().map(|(m, n)| json!({"minute": m, "refused": n})).collect::<Vec<_>>(),
                "per_minute_capped": l.per_minute_capped,
                "timeline": self.timeline.refused.get(i).cloned().unwrap_or_default(),
            })).collect::<Vec<_>>(),
        })
    }
}

/// The number of bars in a text histogram.
const BARS: i64 = 12;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} lines: {} requests replayed, {} refused; {} bad lines, {} late lines (replayed at the latest time seen)",
            self.lines, self.requests, self.refused, self.bad_lines, self.late_lines
        )?;
        for b in &self.bad {
            writeln!(f, "  line {}: {}", b.line, b.reason)?;
        }
        if (self.bad.len() as u64) < self.bad_lines {
            writeln!(
                f,
                "  ... and {} more",
                self.bad_lines - self.bad.len() as u64
            )?;
        }
        if self.with_usage > 0 {
            writeln!(f, "{} requests with an actual usage", self.with_usage)?;
        }
        if self.held > 0 {
            writeln!(
                f,
                "{} responses held for their duration, at most {} at once{}",
                self.held,
                self.most_held,
                if self.released_early > 0 {
                    format!(
                        "; {} let go early (more than the most held at once)",
                        self.released_early
                    )
                } else {
                    String::new()
                }
            )?;
        }
        for l in &self.limits {
            writeln!(f)?;
            let at_least = if l.keys_capped { "at least " } else { "" };
            writeln!(
                f,
                "limit {}: {} requests, {} refused ({:.1}%){}, {at_least}{} keys refused",
                l.name,
                l.requests,
                l.refused,
                100.0 * l.refused_share(),
                if l.shadow_refused > 0 {
                    format!(" of which {} by shadow", l.shadow_refused)
                } else {
                    String::new()
                },
                l.keys_refused,
            )?;
            if l.bans > 0 || l.banned_refused > 0 {
                writeln!(f, "  {}", ban_line(l))?;
            }
            for (key, n) in &l.top_refused {
                writeln!(f, "  {n:>8}  {key}")?;
            }
            if let Some((start, end)) = self.span
                && l.refused > 0
            {
                histogram(f, l, start, end)?;
            }
        }
        Ok(())
    }
}

/// `12 refused by a ban; 3 bans began: 2 first, 1 at level 1`.
pub(super) fn ban_line(l: &LimitReport) -> String {
    let levels: Vec<String> = l
        .bans_by_level
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(level, n)| match level {
            0 => format!("{n} first"),
            l if l == MAX_BAN_LEVELS - 1 => format!("{n} at level {l} or above"),
            l => format!("{n} at level {l}"),
        })
        .collect();
    let mut line = format!(
        "{} refused by a ban; {} bans began",
        l.banned_refused, l.bans
    );
    if !levels.is_empty() {
        line.push_str(": ");
        line.push_str(&levels.join(", "));
    }
    line
}

/// Refusals over the log's span in at most [`BARS`] buckets of whole minutes.
fn histogram(f: &mut fmt::Formatter<'_>, l: &LimitReport, start: i64, end: i64) -> fmt::Result {
    let first = start.div_euclid(60) * 60;
    let minutes = (end - first) / 60 + 1;
    let width = ((minutes + BARS - 1) / BARS).max(1) * 60;
    let n = ((end - first) / width + 1) as usize;
    let mut buckets = vec![0u64; n];
    for &(m, c) in &l.per_minute {
        let i = ((m - first) / width).clamp(0, n as i64 - 1) as usize;
        buckets[i] += c;
    }
    let max = buckets.iter().copied().max().unwrap_or(0).max(1);
    writeln!(f, "  refusals per {} min (UTC):", width / 60)?;
    for (i, &c) in buckets.iter().enumerate() {
        let at = first + i as i64 * width;
        let bar = "#".repeat(((c * 40).div_ceil(max)) as usize);
        let line = format!("  {} {c:>8} {bar}", clock_time(at));
        writeln!(f, "{}", line.trim_end())?;
    }
    Ok(())
}

/// `2024-01-31 13:05` of Unix seconds.
fn clock_time(secs: i64) -> String {
    match jiff::Timestamp::from_second(secs) {
        Ok(t) => t.strftime("%Y-%m-%d %H:%M").to_string(),
        Err(_) => secs.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At most `max_keys` keys are held; the refusals of the others are counted.
    #[test]
    fn refused_keys_are_capped() {
        let mut tally = Tally::new("l");
        for i in 0..100u32 {
            tally.refusal(
                Some(&Key::from_part(i)),
                60 * i64::from(i % 3),
                Refusal::Enforced,
                10,
            );
        }
        tally.refusal(Some(&Key::from_part(0u32)), 0, Refusal::Shadow, 10);
        let mut all = BTreeMap::new();
        let report = tally.finish(3, &mut all);
        assert_eq!((report.refused, report.shadow_refused), (101, 1));
        assert_eq!((report.keys_refused, report.keys_capped), (10, true));
        assert_eq!(all.len(), 10);
        assert_eq!(report.top_refused.len(), 3);
        assert_eq!(report.top_refused[0].1, 2);
        assert_eq!(report.per_minute, vec![(0, 35), (60, 33), (120, 33)]);
    }

    /// A log that refuses in more minutes than `MAX_MINUTES` lists the first ones and
    /// says so; every refusal is still counted.
    #[test]
    fn minutes_with_refusals_are_capped() {
        let mut tally = Tally::new("l");
        let n = MAX_MINUTES as i64 + 5;
        for m in 0..n {
            tally.refusal(None, m * 60, Refusal::Enforced, 10);
        }
        // A minute already listed still counts past the cap.
        tally.refusal(None, 0, Refusal::Enforced, 10);
        let report = tally.finish(3, &mut BTreeMap::new());
        assert_eq!(report.refused, n as u64 + 1);
        assert_eq!(report.per_minute.len(), MAX_MINUTES);
        assert!(report.per_minute_capped);
        assert_eq!(report.per_minute[0], (0, 2));
        assert_eq!(
            report.per_minute.last().unwrap().0,
            (MAX_MINUTES as i64 - 1) * 60
        );
    }

    /// Bans are counted by repeat level, the levels at the top together; refusals by a
    /// ban apart from the others.
    #[test]
    fn bans_are_counted_by_level() {
        let mut tally = Tally::new("l");
        for level in [0, 0, 1, 200, 63] {
            tally.ban_began(level);
        }
        tally.refusal(None, 0, Refusal::Banned, 10);
        tally.refusal(None, 0, Refusal::Enforced, 10);
        let report = tally.finish(3, &mut BTreeMap::new());
        assert_eq!(
            (report.refused, report.banned_refused, report.bans),
            (2, 1, 5)
        );
        assert_eq!(report.bans_by_level.len(), MAX_BAN_LEVELS);
        assert_eq!(report.bans_by_level[..2], [2, 1]);
        assert_eq!(report.bans_by_level[MAX_BAN_LEVELS - 1], 2);
        assert_eq!(
            ban_line(&report),
            "1 refused by a ban; 5 bans began: 2 first, 1 at level 1, 2 at level 63 or above"
        );
        let quiet = Tally::new("q").finish(3, &mut BTreeMap::new());
        assert!(quiet.bans_by_level.is_empty());
        assert_eq!(ban_line(&quiet), "0 refused by a ban; 0 bans began");
    }
}
