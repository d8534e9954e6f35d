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
        // (A window that began before the epoch, in the first hours of 1970 east of UTC,
        // starts at the epoch: no instant before it can be asked.)
        Window {
            start_us: start.max(0) as u64 * 1_000_000,
            end_us: end.max(1) as u64 * 1_000_000,
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

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    const ZONES: [&str; 8] = [
        "Europe/Berlin",
        "America/New_York",
        "Australia/Sydney",
        "America/Sao_Paulo",
        "Asia/Kolkata",
        "Pacific/Chatham",
        "Australia/Lord_Howe",
        "UTC",
    ];
    const PERIODS: [Period; 4] = [Period::Hour, Period::Day, Period::Week, Period::Month];

    fn zone(name: &str) -> Zone {
        Zone::get(name).unwrap()
    }

    /// µs since the epoch of a local civil time in `zone` (the earlier of a fold).
    fn at(zone: Zone, y: i16, m: i8, d: i8, h: i8, min: i8) -> u64 {
        let ts = zone
            .0
            .tz
            .to_ambiguous_timestamp(date(y, m, d).at(h, min, 0, 0))
            .compatible()
            .unwrap();
        ts.as_microsecond() as u64
    }

    fn local(zone: Zone, us: u64) -> DateTime {
        zone.0
            .tz
            .to_datetime(Timestamp::from_microsecond(us as i64).unwrap())
    }

    const H: u64 = 3_600;

    #[test]
    fn a_daylight_saving_day_is_one_day_of_23_or_25_hours() {
        for (name, spring, autumn) in [
            ("Europe/Berlin", (2026, 3, 29), (2026, 10, 25)),
            ("America/New_York", (2026, 3, 8), (2026, 11, 1)),
            ("Australia/Sydney", (2026, 10, 4), (2026, 4, 5)),
            ("America/Sao_Paulo", (2018, 11, 4), (2019, 2, 16)),
            ("Pacific/Chatham", (2026, 9, 27), (2026, 4, 5)),
        ] {
            let z = zone(name);
            let day = |(y, m, d): (i16, i8, i8)| Period::Day.window(z, at(z, y, m, d, 12, 0));
            assert_eq!(day(spring).len_secs(), 23 * H, "{name} spring");
            assert_eq!(day(autumn).len_secs(), 25 * H, "{name} autumn");
        }
        // Lord Howe moves its clocks by 30 minutes.
        let z = zone("Australia/Lord_Howe");
        let day = Period::Day.window(z, at(z, 2026, 10, 4, 12, 0));
        assert_eq!(day.len_secs(), 23 * H + 1_800);
    }

    #[test]
    fn a_day_whose_midnight_is_skipped_starts_where_the_gap_ends() {
        // São Paulo, 2018-11-04: 00:00 became 01:00.
        let z = zone("America/Sao_Paulo");
        let w = Period::Day.window(z, at(z, 2018, 11, 4, 12, 0));
        assert_eq!(local(z, w.start_us), date(2018, 11, 4).at(1, 0, 0, 0));
        assert_eq!(w.label(Period::Day, z), "2018-11-04");
        // The day before ends there.
        let before = Period::Day.window(z, w.start_us - 1);
        assert_eq!(before.end_us, w.start_us);
        assert_eq!(before.len_secs(), 24 * H);
    }

    #[test]
    fn weeks_start_on_monday_and_months_on_the_first() {
        let z = zone("Europe/Berlin");
        // Thursday 2026-11-26.
        let w = Period::Week.window(z, at(z, 2026, 11, 26, 15, 0));
        assert_eq!(local(z, w.start_us), date(2026, 11, 23).at(0, 0, 0, 0));
        assert_eq!(local(z, w.end_us), date(2026, 11, 30).at(0, 0, 0, 0));
        assert_eq!(w.label(Period::Week, z), "2026-W48");
        // The ISO week of 2027-01-01 (a Friday) is 2026's 53rd.
        let w = Period::Week.window(z, at(z, 2027, 1, 1, 0, 0));
        assert_eq!(w.label(Period::Week, z), "2026-W53");
        let m = Period::Month.window(z, at(z, 2026, 11, 26, 15, 0));
        assert_eq!(m.label(Period::Month, z), "2026-11");
        assert_eq!(m.len_secs(), 30 * 86_400);
        assert_eq!(m.id(), 1_793_487_600); // 2026-10-31T23:00:00Z
        let h = Period::Hour.window(z, at(z, 2026, 11, 26, 15, 42));
        assert_eq!(h.label(Period::Hour, z), "2026-11-26T15:00+01:00");
        assert_eq!(h.len_secs(), H);
    }

    #[test]
    fn every_month_length() {
        for name in ZONES {
            let z = zone(name);
            for y in 2023..=2029i16 {
                for m in 1..=12i8 {
                    let w = Period::Month.window(z, at(z, y, m, 15, 12, 0));
                    let days = i64::from(date(y, m, 1).days_in_month());
                    let secs = w.len_secs() as i64;
                    // Within the hour (or less) a daylight-saving change gives or takes.
                    assert!((secs - days * 86_400).abs() <= 3_600, "{name} {y}-{m}");
                    assert_eq!(w.label(Period::Month, z), format!("{y:04}-{m:02}"));
                    assert_eq!(local(z, w.start_us).date(), date(y, m, 1), "{name}");
                }
            }
            let feb = |y| Period::Month.window(z, at(z, y, 2, 10, 0, 0));
            assert_eq!(feb(2028).len_secs().div_ceil(86_400), 29, "{name} leap");
            assert_eq!(feb(2027).len_secs().div_ceil(86_400), 28, "{name}");
        }
    }

    #[test]
    fn half_hour_offset_changes_cut_the_hour() {
        // Lord Howe, 2026-04-05: 02:00 (+11) became 01:30 (+10:30).
        let z = zone("Australia/Lord_Howe");
        let change = at(z, 2026, 4, 5, 1, 0) + 3_600_000_000; // 02:00 +11
        let before = Period::Hour.window(z, change - 1);
        let after = Period::Hour.window(z, change);
        assert_eq!(before.end_us, change);
        assert_eq!(after.start_us, change);
        assert_eq!(after.len_secs(), 1_800); // 01:30 to 02:00 at +10:30
        assert_eq!(Period::Hour.window(z, after.end_us).len_secs(), H);
        // Kolkata's hours start at half past UTC hours.
        let k = zone("Asia/Kolkata");
        let h = Period::Hour.window(k, 1_800_000_000 * 1_000_000);
        assert_eq!(h.start_us / 1_000_000 % 3_600, 1_800);
    }

    #[test]
    fn zones_are_resolved_once_and_errors_name_the_field() {
        let a = zone("Europe/Berlin");
        let b = zone("europe/berlin");
        assert_eq!(a, b);
        assert_eq!(b.name(), "Europe/Berlin");
        assert_eq!(zone("UTC"), Zone::UTC);
        for bad in ["", "Nowhere/City", "Europe/Berlin\n", &"x".repeat(100)] {
            assert_eq!(Zone::get(bad).unwrap_err().field(), "time_zone", "{bad:?}");
        }
        let (z, p) = from_tag(tag(a, Period::Week));
        assert_eq!((z, p), (a, Period::Week));
    }

    #[test]
    fn the_first_instants_of_1970_east_of_utc_start_their_window_at_the_epoch() {
        // Berlin's first day of 1970 began at 23:00 UTC the day before.
        let w = Period::Day.window(zone("Europe/Berlin"), 0);
        assert_eq!(w.start_us, 0);
        assert_eq!(w.end_us, 23 * 3_600 * 1_000_000);
    }

    #[test]
    fn instants_beyond_the_rules_fall_back_to_nominal_windows() {
        let far = u64::MAX / 2;
        for p in PERIODS {
            let w = p.window(Zone::UTC, far);
            assert!(w.start_us <= far && far < w.end_us, "{p:?}");
            assert_eq!(w.len_secs(), p.nominal_secs());
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(400))]

        /// For any instant from 1970 to 2100, in each zone and unit: the window holds it;
        /// the windows before and after touch it; its start is the unit's first local
        /// instant; the next window is the next calendar unit (one window per unit, never
        /// two resets in one day); a day is 23 to 25 hours.
        #[test]
        fn windows_tile_the_calendar(
            // From 1971: the window before one that starts at the epoch cannot be asked.
            secs in 31_536_000u64..4_102_444_800,
            frac in 0u64..1_000_000,
            z in 0usize..ZONES.len(),
            p in 0usize..PERIODS.len(),
        ) {
            let (zone, period) = (zone(ZONES[z]), PERIODS[p]);
            let t = secs * 1_000_000 + frac;
            let w = period.window(zone, t);
            proptest::prop_assert!(w.start_us <= t && t < w.end_us, "{w:?} {t}");
            proptest::prop_assert_eq!(period.window(zone, w.start_us), w);
            proptest::prop_assert_eq!(period.window(zone, w.end_us - 1), w);
            let next = period.window(zone, w.end_us);
            proptest::prop_assert_eq!(next.start_us, w.end_us);
            let prev = period.window(zone, w.start_us - 1);
            proptest::prop_assert_eq!(prev.end_us, w.start_us);
            let first = local(zone, w.start_us);
            let (len, d) = (w.len_secs(), first.date());
            match period {
                Period::Hour => {
                    proptest::prop_assert!((15 * 60..=H).contains(&len), "{len}");
                    let changed = zone.0.tz.to_offset(Timestamp::from_microsecond(w.start_us as i64 - 1).unwrap())
                        != zone.0.tz.to_offset(Timestamp::from_microsecond(w.start_us as i64).unwrap());
                    proptest::prop_assert!(first.minute() == 0 && first.second() == 0 || changed, "{first}");
                }
                Period::Day => {
                    proptest::prop_assert!((23 * H..=25 * H).contains(&len), "{len} {first}");
                    proptest::prop_assert_eq!(local(zone, t).date(), d);
                    proptest::prop_assert_eq!(local(zone, next.start_us).date(), d.tomorrow().unwrap());
                }
                Period::Week => {
                    proptest::prop_assert_eq!(d.weekday(), jiff::civil::Weekday::Monday);
                    proptest::prop_assert!((7 * 24 * H - H..=7 * 24 * H + H).contains(&len));
                    proptest::prop_assert_eq!(local(zone, next.start_us).date(), d.checked_add(7.days()).unwrap());
                }
                Period::Month => {
                    proptest::prop_assert_eq!(d.day(), 1);
                    let lt = local(zone, t).date();
                    proptest::prop_assert_eq!((lt.year(), lt.month()), (d.year(), d.month()));
                    let days = u64::from(d.days_in_month() as u8);
                    proptest::prop_assert!(len.abs_diff(days * 86_400) <= H, "{len}");
                    proptest::prop_assert_eq!(local(zone, next.start_us).date(), d.checked_add(1.month()).unwrap());
                }
            }
            if period != Period::Hour {
                // Midnight, or the end of a gap that skipped it.
                let midnight = first.time() == Time::midnight();
                let gap = local(zone, w.start_us - 1).date() < d;
                proptest::prop_assert!(midnight || gap, "{first}");
            }
        }
    }
}
