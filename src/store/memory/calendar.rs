//! Calendar windows in the memory store: the window of a check, from the table's hint.
//!
//! Working out a calendar window takes the time-zone rules (a few hundred nanoseconds);
//! the table keeps the last window it saw in one word, `start (minutes) << 28 | length
//! (minutes) << 12 | tag`, so a check reads it with one relaxed load and two comparisons.
//! The tag (the zone and the unit) makes a hint of another calendar limit under the same
//! name worthless; a window whose boundaries are not whole minutes (historic local mean
//! times) is worked out every time.

use std::sync::atomic::Ordering;

use super::Table;
use crate::algo::algorithm::calendar_window;

const MINUTE_US: u64 = 60_000_000;

/// The calendar window `(start, end)` in µs holding `t` (µs since the epoch) for the
/// limit whose calendar tag is `tag`.
#[inline]
pub(super) fn window(table: &Table, tag: u16, t: u64) -> (u64, u64) {
    let hint = table.calendar.load(Ordering::Relaxed);
    if hint & 0xfff == u64::from(tag) {
        let start = (hint >> 28) * MINUTE_US;
        let len = ((hint >> 12) & 0xffff) * MINUTE_US;
        if t >= start && t - start < len {
            return (start, start + len);
        }
    }
    let (start, end) = calendar_window(tag, t);
    let (s, l) = (start / MINUTE_US, (end - start) / MINUTE_US);
    if start % MINUTE_US == 0 && (end - start) % MINUTE_US == 0 && s < 1 << 36 && l < 1 << 16 {
        table
            .calendar
            .store(s << 28 | l << 12 | u64::from(tag), Ordering::Relaxed);
    }
    (start, end)
}
