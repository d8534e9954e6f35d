//! Calendar windows: the hour, day, ISO week (from Monday) or month holding an instant, in
//! an IANA time zone, as pure functions of the instant (feature `calendar`).
//!
//! A window is `[start, end)` in microseconds since the Unix epoch; its [`id`](Window::id)
//! is its start in Unix seconds (what the Redis keys of an
//! [`Algorithm::Calendar`](crate::Algorithm::Calendar) limit end with). The time-zone rules
//! are `jiff`'s (the system's database, else the copy bundled in), never hand-written
//! offsets, so a day of 23 or 25 hours at a daylight-saving change is one day, and a month
//! is 28 to 31 days.
//!
//! What starts a window, in the zone's local time:
//!
//! | period | starts at | length |
//! |---|---|---|
//! | [`Hour`](Period::Hour) | each `HH:00:00`, and each change of the zone's offset | one hour (less at an offset change of a fraction of an hour, e.g. Lord Howe's 30 minutes) |
//! | [`Day`](Period::Day) | the first instant of each date (midnight, or the end of a gap that skips it) | 23 to 25 hours around daylight-saving changes |
//! | [`Week`](Period::Week) | the first instant of each Monday | 7 days ± the changes within |
//! | [`Month`](Period::Month) | the first instant of each month's 1st | 28 to 31 days ± the changes within |
//!
//! Consecutive windows touch (one's end is the next one's start), each holds the instants
//! whose local date (or hour) it names, and a local date that repeats (a fold back past
//! midnight) stays in the window that already started: a key's count resets once per
//! calendar unit.
//!
//! ```
//! use tollgate::calendar::{Period, Zone};
//!
//! let berlin = Zone::get("Europe/Berlin").unwrap();
//! // 2026-03-29 10:00 UTC: Berlin's daylight-saving day (23 hours).
//! let at = 1_774_778_400 * 1_000_000;
//! let day = Period::Day.window(berlin, at);
//! assert_eq!(day.len_secs(), 23 * 3600);
//! assert_eq!(day.label(Period::Day, berlin), "2026-03-29");
//! let month = Period::Month.window(berlin, at);
//! assert_eq!(month.label(Period::Month, berlin), "2026-03");
//! assert_eq!(month.len_secs(), 31 * 86_400 - 3600);
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError};

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ToSpan};

use crate::base::error::ConfigError;

/// The calendar unit of an [`Algorithm::Calendar`](crate::Algorithm::Calendar) limit,
/// taken from its quota's period: `"…/h"`, `"…/d"`, `"…/week"` or `"…/month"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Period {
    /// Local clock hours.
    Hour,
    /// Local dates.
    Day,
    /// ISO weeks, Monday to Sunday.
    Week,
    /// Calendar months.
    Month,
}

/// One calendar window: `[start_us, end_us)`, microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// The first instant of the window.
    pub start_us: u64,
    /// The first instant of the next window.
    pub end_us: u64,
}

impl Window {
    /// The window's id: its start in Unix seconds (every boundary is a whole second).
    pub const fn id(&self) -> u64 {
        self.start_us / 1_000_000
    }

    /// Its length in seconds.
    pub const fn len_secs(&self) -> u64 {
        (self.end_us - self.start_us) / 1_000_000
    }

    /// Time from `now_us` to the window's end (at least 1 µs; `now_us` inside the window).
    pub const fn until_end(&self, now_us: u64) -> u64 {
        let left = self.end_us.saturating_sub(now_us);
        if left == 0 { 1 } else { left }
    }

    /// The window's name for people, in the zone's local calendar: `2026-11` (month),
    /// `2026-W48` (ISO week), `2026-11-26` (day), `2026-11-26T15:00+01:00` (hour).
    pub fn label(&self, period: Period, zone: Zone) -> String {
        let Ok(ts) = Timestamp::from_microsecond(self.start_us as i64) else {
            return self.id().to_string();
        };
        let z = ts.to_zoned(zone.0.tz.clone());
        match period {
            Period::Month => z.strftime("%Y-%m").to_string(),
            Period::Week => {
                let w = z.date().iso_week_date();
                format!("{:04}-W{:02}", w.year(), w.week())
            }
            Period::Day => z.strftime("%Y-%m-%d").to_string(),
            Period::Hour => z.strftime("%Y-%m-%dT%H:%M%:z").to_string(),
        }
    }
}

/// The calendar unit of a calendar limit's quota: exactly one hour, day, 7 days or a
/// month; `None` for any other period.
pub(crate) fn period_of(quota: &crate::algo::quota::Quota) -> Option<Period> {
    if quota.is_per_month() {
        return Some(Period::Month);
    }
    match quota.period_ns() {
        3_600_000_000_000 => Some(Period::Hour),
        86_400_000_000_000 => Some(Period::Day),
        604_800_000_000_000 => Some(Period::Week),
        _ => None,
    }
}


impl Period {
    /// The unit's nominal length in seconds: 3,600, 86,400, 604,800, and for a month the
    /// longest, 31 days (2,678,400). What `RateLimit-Policy`'s `w` says of a calendar limit.
    pub const fn nominal_secs(self) -> u64 {
        match self {
            Period::Hour => 3_600,
            Period::Day => 86_400,
            Period::Week => 7 * 86_400,
            Period::Month => 31 * 86_400,
        }
    }

    /// The longest a window of this unit can be, in seconds (a day of 25 hours, a month of
    /// 31 days with an hour given back): a bound for sweeping.
    pub(crate) const fn max_secs(self) -> u64 {
        match self {
            Period::Hour => 3_600,
            _ => self.nominal_secs() + 3_600,
        }
    }

    /// The window holding the instant `unix_us` (microseconds since the Unix epoch) in
    /// `zone`. Total: an instant outside the range the time-zone rules cover (before
    /// 1970 cannot be asked; after the year 9999) falls back to windows of the nominal
    /// length aligned to the epoch.
    pub fn window(self, zone: Zone, unix_us: u64) -> Window {
        let secs = (unix_us / 1_000_000) as i64;
        let (start, end) = bounds(self, &zone.0.tz, secs).unwrap_or_else(|| {
            let n = self.nominal_secs() as i64;
            let start = secs - secs.rem_euclid(n);
            (start, start + n)
        });
        Window {
            start_us: start as u64 * 1_000_000,
            end_us: end as u64 * 1_000_000,
        }
    }
}

/// `(start, end)` in seconds of the window holding `secs`.
fn bounds(period: Period, tz: &TimeZone, secs: i64) -> Option<(i64, i64)> {
    let ts = Timestamp::from_second(secs).ok()?;
    if period == Period::Hour {
        return hour(tz, ts, secs);
    }
    let date = tz.to_datetime(ts).date();
    let mut first = first_of(period, date)?;
    // At most a few steps: a fold back past a boundary keeps the window already started.
    for _ in 0..4 {
        let next = next_of(period, first)?;
        let (start, end) = (start_of(tz, first)?, start_of(tz, next)?);
        if secs < start {
            first = prev_of(period, first)?;
        } else if secs >= end {
            first = next;
        } else {
            return Some((start, end));
        }
    }
    None
}

fn first_of(period: Period, date: Date) -> Option<Date> {
    match period {
        Period::Week => date
            .checked_sub(i64::from(date.weekday().to_monday_zero_offset()).days())
            .ok(),
        Period::Month => Some(date.first_of_month()),
        _ => Some(date),
    }
}

fn next_of(period: Period, first: Date) -> Option<Date> {
    match period {
        Period::Week => first.checked_add(7.days()).ok(),
        Period::Month => first.checked_add(1.month()).ok(),
        _ => first.tomorrow().ok(),
    }
}

fn prev_of(period: Period, first: Date) -> Option<Date> {
    match period {
        Period::Week => first.checked_sub(7.days()).ok(),
        Period::Month => first.checked_sub(1.month()).ok(),
        _ => first.yesterday().ok(),
    }
}

/// The first instant, in seconds, whose local date is `date`: midnight, the earlier one
/// if it happens twice, or the end of the gap that skips it.
fn start_of(tz: &TimeZone, date: Date) -> Option<i64> {
    let midnight = DateTime::from_parts(date, Time::midnight());
    let at = match tz.to_ambiguous_timestamp(midnight).offset() {
        AmbiguousOffset::Unambiguous { offset } | AmbiguousOffset::Fold { before: offset, .. } => {
            midnight.to_zoned(TimeZone::fixed(offset)).ok()?.timestamp()
        }
        // Midnight skipped: the date starts where the gap ends, a transition.
        AmbiguousOffset::Gap { before, .. } => {
            let naive = midnight.to_zoned(TimeZone::fixed(before)).ok()?.timestamp();
            tz.preceding(naive.checked_add(1.second()).ok()?)
                .next()
                .map_or(naive, |t| t.timestamp())
        }
    };
    Some(at.as_second())
}

/// The local clock hour holding `ts`, cut at the zone's changes of offset.
fn hour(tz: &TimeZone, ts: Timestamp, secs: i64) -> Option<(i64, i64)> {
    let offset = i64::from(tz.to_offset(ts).seconds());
    let mut start = secs - (secs + offset).rem_euclid(3_600);
    let mut end = start + 3_600;
    // A change of offset at or before `ts`, inside this hour, starts it.
    for t in tz.preceding(ts.checked_add(1.second()).ok()?) {
        let at = t.timestamp().as_second();
        if at <= start {
            break;
        }
        if changes_offset(tz, t.timestamp(), t.offset()) {
            start = at;
            break;
        }
    }
    for t in tz.following(ts) {
        let at = t.timestamp().as_second();
        if at >= end {
            break;
        }
        if changes_offset(tz, t.timestamp(), t.offset()) {
            end = at;
            break;
        }
    }
    Some((start, end))
}

fn changes_offset(tz: &TimeZone, at: Timestamp, offset: jiff::tz::Offset) -> bool {
    at.checked_sub(1.second())
        .is_ok_and(|before| tz.to_offset(before) != offset)
}

/// An IANA time zone, resolved once per name for the life of the process (each distinct
/// zone name is kept once: at most the few hundred names of the database). Compared by
/// its canonical name; cheap to copy.
#[derive(Clone, Copy)]
pub struct Zone(&'static ZoneData);

struct ZoneData {
    name: &'static str,
    tz: TimeZone,
    /// 1 + its place among the zones resolved (UTC is 1): names it in a [`tag`].
    index: u16,
}

static UTC: ZoneData = ZoneData {
    name: "UTC",
    tz: TimeZone::UTC,
    index: 1,
};

/// The zones resolved so far: by canonical name, and by index (from 2).
#[derive(Default)]
struct Registry {
    by_name: HashMap<String, &'static ZoneData>,
    all: Vec<&'static ZoneData>,
}

static ZONES: Mutex<Option<Registry>> = Mutex::new(None);

/// The most distinct zones a process resolves (the IANA database holds about 600).
const MAX_ZONES: usize = 1_000;

/// A calendar limit's zone and unit in 12 bits (never 0): `index << 2 | unit`.
pub(crate) fn tag(zone: Zone, period: Period) -> u16 {
    zone.0.index << 2
        | match period {
            Period::Hour => 0,
            Period::Day => 1,
            Period::Week => 2,
            Period::Month => 3,
        }
}

/// The unit of a [`tag`].
pub(crate) fn period_of_tag(tag: u16) -> Period {
    match tag & 3 {
        0 => Period::Hour,
        1 => Period::Day,
        2 => Period::Week,
        _ => Period::Month,
    }
}

/// The zone and unit of a [`tag`] (the zone from the registry: a lock).
pub(crate) fn from_tag(tag: u16) -> (Zone, Period) {
    let period = period_of_tag(tag);
    let index = usize::from(tag >> 2);
    let zone = if index <= 1 {
        Zone::UTC
    } else {
        ZONES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(|r| r.all.get(index - 2).copied())
            .map_or(Zone::UTC, Zone)
    };
    (zone, period)
}

impl Zone {
    /// Coordinated Universal Time (the default).
    pub const UTC: Zone = Zone(&UTC);

    /// The zone named `name` in the IANA database (`"Europe/Berlin"`, `"America/New_York"`,
    /// `"UTC"`); a [`ConfigError`] naming `time_zone` for a name it does not hold.
    ///
    /// ```
    /// use tollgate::calendar::Zone;
    ///
    /// assert_eq!(Zone::get("Asia/Kolkata").unwrap().name(), "Asia/Kolkata");
    /// assert_eq!(Zone::get("Mars/Olympus").unwrap_err().field(), "time_zone");
    /// ```
    pub fn get(name: &str) -> Result<Zone, ConfigError> {
        if name == "UTC" {
            return Ok(Zone::UTC);
        }
        let mut zones = ZONES.lock().unwrap_or_else(PoisonError::into_inner);
        let zones = zones.get_or_insert_with(Registry::default);
        if let Some(&z) = zones.by_name.get(name) {
            return Ok(Zone(z));
        }
        let unknown = || {
            ConfigError::new(
                "time_zone",
                format!(
                    "`{}` is not a time zone of the IANA database (e.g. `Europe/Berlin`, `UTC`)",
                    name.escape_debug()
                ),
            )
        };
        if name.len() > 64 {
            return Err(unknown());
        }
        let tz = TimeZone::get(name).map_err(|_| unknown())?;
        let canonical = tz.iana_name().unwrap_or(name).to_owned();
        if canonical == "UTC" {
            return Ok(Zone::UTC);
        }
        if let Some(&z) = zones.by_name.get(&canonical) {
            return Ok(Zone(z));
        }
        if zones.all.len() >= MAX_ZONES {
            return Err(ConfigError::new(
                "time_zone",
                format!("more than {MAX_ZONES} distinct time zones in one process"),
            ));
        }
        let data: &'static ZoneData = Box::leak(Box::new(ZoneData {
            name: Box::leak(canonical.clone().into_boxed_str()),
            tz,
            index: zones.all.len() as u16 + 2,
        }));
        // Only canonical names are kept: the database's other spellings (case, links) are
        // looked up again, so the map holds at most one entry per zone.
        zones.by_name.insert(canonical, data);
        zones.all.push(data);
        Ok(Zone(data))
    }

    /// The zone's IANA name.
    pub fn name(&self) -> &'static str {
        self.0.name
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Zone {}

impl Hash for Zone {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({:?})", self.0.name)
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name)
    }
}
