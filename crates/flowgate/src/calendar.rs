//! Calendar periods: quotas that renew at local midnight on a day, an ISO week (Monday), a
//! month (the 1st) or a year (1 January), in UTC or a named IANA time zone.
//!
//! "10,000 calls per calendar month, renewed at 00:00 on the 1st" is a
//! [fixed window](crate::Algorithm::FixedWindow) whose windows are calendar periods instead of
//! multiples of a duration since the Unix epoch:
//!
//! ```
//! use flowgate::calendar::{Calendar, CalendarUnit};
//! use flowgate::{Algorithm, Quota};
//!
//! let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin")?;
//! let quota = Quota::per_calendar(10_000, month)?;
//! assert_eq!(quota.algorithm(), Algorithm::FixedWindow);
//!
//! // February 2028 in Berlin: 29 days, from local midnight on the 1st to local midnight on
//! // 1 March.
//! let t: jiff::Timestamp = "2028-02-14T12:00:00Z".parse()?;
//! let (start, end) = quota.calendar().unwrap().window(t);
//! assert_eq!(start.to_string(), "2028-01-31T23:00:00Z");
//! assert_eq!(end.to_string(), "2028-02-29T23:00:00Z");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **How windows are keyed.** A window is named by its start, in whole seconds since the Unix
//! epoch (a zone's offset is whole seconds, so every boundary is). The fixed window's state is
//! `(window, count)` as for a periodic window; only how `window` is derived from `now` differs:
//! the start of the calendar period containing `now`. Starts only grow with time, so a lagging
//! clock stays in the state's window exactly as it does for periodic windows. `reset_after` is
//! the time to the next boundary, and a window lasts exactly as long as its period does on the
//! wall clock of its zone: 23 or 25 hours for a day with a daylight-saving change, 28 to 31
//! days for a month.
//!
//! **Where boundaries are computed.** Always in Rust, from the bundled time-zone database, so
//! every host draws the same boundaries. The Redis scripts, which decide on the Redis server's
//! clock, are handed the boundaries of the previous, current and next period around the
//! client's clock and pick the one containing the server's time; a server clock more than a
//! whole period away from the client's is reported as an error rather than guessed at.
//!
//! Calendars are interned: building the same unit and zone twice gives the same `&'static`
//! calendar, so a [`Quota`](crate::Quota) stays `Copy` and a reloaded configuration does not
//! grow memory (at most 4 units × the zones in the database).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};
use portable_atomic::{AtomicU128, Ordering};

use crate::clock::Nanos;

/// The length of a calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From local midnight to the next local midnight (23, 24 or 25 hours).
    Day,
    /// From local midnight on a Monday to the next Monday (ISO 8601 weeks).
    Week,
    /// From local midnight on the 1st to the 1st of the next month (28 to 31 days).
    Month,
    /// From local midnight on 1 January to the next 1 January (365 or 366 days).
    Year,
}

impl CalendarUnit {
    /// Every unit, shortest first.
    pub const ALL: [CalendarUnit; 4] = [
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
        CalendarUnit::Year,
    ];

    /// The unit's name as written in configuration files: `"day"`, `"week"`, `"month"`, `"year"`.
    pub const fn name(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }

    /// A nominal length in seconds (1, 7, 30 or 365 days), used where one number must stand
    /// for the period (a quota's [`period`](crate::Quota::period), the `w` of
    /// `RateLimit-Policy`). Windows themselves are exact calendar periods.
    pub const fn nominal_seconds(self) -> u64 {
        match self {
            CalendarUnit::Day => 86_400,
            CalendarUnit::Week => 7 * 86_400,
            CalendarUnit::Month => 30 * 86_400,
            CalendarUnit::Year => 365 * 86_400,
        }
    }
}

impl fmt::Display for CalendarUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CalendarUnit {
    type Err = CalendarError;

    /// Parses a unit name, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CalendarUnit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| CalendarError::NoCalendarUnit(s.to_owned()))
    }
}

/// Why a [`Calendar`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CalendarError {
    /// The time zone is not in the IANA time-zone database.
    #[error("unknown time zone `{0}`; expected an IANA name such as `UTC` or `Europe/Berlin`")]
    UnknownTimeZone(String),
    /// The unit has no calendar meaning (only day, week, month and year do).
    #[error("`{0}` has no calendar period; calendar quotas are per day, week, month or year")]
    NoCalendarUnit(String),
}

/// Calendar periods of one [`CalendarUnit`] in one time zone. See the [module docs](self).
pub struct Calendar {
    /// The length of a period.
    unit: CalendarUnit,
    /// The zone whose wall clock draws the boundaries.
    zone: TimeZone,
    /// The zone's IANA name (`UTC` for UTC), for configuration, keys and display.
    zone_name: Box<str>,
    /// The last window computed: its start (low 64 bits, seconds, at least 0) and end (high 64
    /// bits, seconds). Most checks fall in it, which saves a time-zone lookup per check.
    cached: AtomicU128,
}

impl Calendar {
    /// Periods of `unit` in the IANA time zone `time_zone` (`"UTC"`, `"Europe/Berlin"`, …).
    ///
    /// Returns the one interned calendar for this unit and zone.
    pub fn new(unit: CalendarUnit, time_zone: &str) -> Result<&'static Calendar, CalendarError> {
        let zone = TimeZone::get(time_zone)
            .map_err(|_| CalendarError::UnknownTimeZone(time_zone.to_owned()))?;
        let zone_name = zone.iana_name().unwrap_or(time_zone);
        Ok(intern(unit, zone_name, || zone.clone()))
    }

    /// Periods of `unit` in UTC.
    pub fn utc(unit: CalendarUnit) -> &'static Calendar {
        intern(unit, "UTC", || TimeZone::UTC)
    }

    /// The length of a period.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The time zone's IANA name.
    pub fn time_zone(&self) -> &str {
        &self.zone_name
    }

    /// The period containing `at`: its start (inclusive) and end (exclusive). Consecutive
    /// periods tile time: one's end is the next one's start.
    pub fn window(&self, at: Timestamp) -> (Timestamp, Timestamp) {
        let (start, end) = self.window_seconds(at.as_second());
        (second(start), second(end))
    }

    /// [`window`](Self::window) in seconds since the Unix epoch, for the instant `t` seconds
    /// after it (or the second containing it).
    fn window_seconds(&self, t: i64) -> (i64, i64) {
        let date = second(t).to_zoned(self.zone.clone()).date();
        let first = match self.unit {
            CalendarUnit::Day => date,
            CalendarUnit::Week => date
                .checked_sub(i64::from(date.weekday().to_monday_zero_offset()).days())
                .unwrap_or(date),
            CalendarUnit::Month => date.first_of_month(),
            CalendarUnit::Year => date.first_of_year(),
        };
        let next = match self.unit {
            CalendarUnit::Day => first.checked_add(1.day()),
            CalendarUnit::Week => first.checked_add(1.week()),
            CalendarUnit::Month => first.checked_add(1.month()),
            CalendarUnit::Year => first.checked_add(1.year()),
        };
        let start = self.midnight(first);
        let end = next.map_or(i64::MAX, |d| self.midnight(d));
        (start, end)
    }

    /// The first instant of `date` in the zone, in seconds: local midnight, or the end of
    /// the gap when a daylight-saving change skips midnight.
    fn midnight(&self, date: Date) -> i64 {
        date.to_datetime(Time::midnight())
            .to_zoned(self.zone.clone())
            .map_or(i64::MAX, |z| z.timestamp().as_second())
    }

    /// The window containing `now`: its key (its start in seconds, at least 0) and its end
    /// in nanoseconds.
    #[inline]
    pub(crate) fn bounds(&self, now: Nanos) -> (u64, Nanos) {
        let t = now / 1_000_000_000;
        let cached = self.cached.load(Ordering::Relaxed);
        let (start, end) = (cached as u64, (cached >> 64) as u64);
        if start <= t && t < end {
            return (start, end.saturating_mul(1_000_000_000));
        }
        let (start, end) = self.window_seconds(t as i64);
        let (start, end) = (start.max(0) as u64, end.max(1) as u64);
        self.cached.store(
            u128::from(start) | (u128::from(end) << 64),
            Ordering::Relaxed,
        );
        (start, end.saturating_mul(1_000_000_000))
    }

    /// The end, in nanoseconds, of the window whose key is `window` (see [`bounds`](Self::bounds)).
    #[inline]
    pub(crate) fn end_of(&self, window: u64) -> Nanos {
        self.bounds(window.saturating_mul(1_000_000_000)).1
    }

    /// The starts of the previous, current and next windows around `now` and the end of the
    /// next one, in seconds: what the Redis scripts need to find the window of their own clock.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn boundaries(&self, now: Nanos) -> [u64; 4] {
        let (start, end) = self.bounds(now);
        let before = self
            .bounds(start.saturating_sub(1).saturating_mul(1_000_000_000))
            .0;
        let after = self.bounds(end).1 / 1_000_000_000;
        [before, start, end / 1_000_000_000, after]
    }
}

/// `t` seconds after the epoch, clamped to what a [`Timestamp`] can hold.
fn second(t: i64) -> Timestamp {
    let t = t.clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
    Timestamp::from_second(t).unwrap_or(Timestamp::MAX)
}

/// The one calendar for `unit` and `zone_name`, made (and leaked, once) if need be.
fn intern(
    unit: CalendarUnit,
    zone_name: &str,
    zone: impl FnOnce() -> TimeZone,
) -> &'static Calendar {
    static ALL: OnceLock<Mutex<Vec<&'static Calendar>>> = OnceLock::new();
    let mut all = ALL
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(c) = all
        .iter()
        .find(|c| c.unit == unit && &*c.zone_name == zone_name)
    {
        return c;
    }
    let calendar: &'static Calendar = Box::leak(Box::new(Calendar {
        unit,
        zone: zone(),
        zone_name: zone_name.into(),
        cached: AtomicU128::new(0),
    }));
    all.push(calendar);
    calendar
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calendar")
            .field("unit", &self.unit)
            .field("time_zone", &self.zone_name)
            .finish()
    }
}

impl fmt::Display for Calendar {
    /// `month@Europe/Berlin`: the unit and the zone, as in counter keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.unit, self.zone_name)
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit && self.zone_name == other.zone_name
    }
}

impl Eq for Calendar {}

impl Hash for Calendar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.unit.hash(state);
        self.zone_name.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn berlin_days_around_daylight_saving_changes_are_23_and_25_hours() {
        let day = Calendar::new(CalendarUnit::Day, "Europe/Berlin").unwrap();
        let (s, e) = day.window(ts("2026-03-29T12:00:00Z"));
        assert_eq!(
            (s, e),
            (ts("2026-03-28T23:00:00Z"), ts("2026-03-29T22:00:00Z"))
        );
        let (s, e) = day.window(ts("2026-10-25T12:00:00Z"));
        assert_eq!(
            (s, e),
            (ts("2026-10-24T22:00:00Z"), ts("2026-10-25T23:00:00Z"))
        );
    }

    #[test]
    fn weeks_start_on_monday_and_years_on_the_first_of_january() {
        let week = Calendar::utc(CalendarUnit::Week);
        // 2026-12-02 is a Wednesday.
        let (s, e) = week.window(ts("2026-12-02T08:00:00Z"));
        assert_eq!(
            (s, e),
            (ts("2026-11-30T00:00:00Z"), ts("2026-12-07T00:00:00Z"))
        );
        let year = Calendar::new(CalendarUnit::Year, "America/New_York").unwrap();
        let (s, e) = year.window(ts("2028-06-01T00:00:00Z"));
        assert_eq!(
            (s, e),
            (ts("2028-01-01T05:00:00Z"), ts("2029-01-01T05:00:00Z"))
        );
    }

    #[test]
    fn calendars_are_interned_and_zones_checked() {
        let a = Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
        let b = Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
        assert!(std::ptr::eq(a, b));
        assert_eq!(a.to_string(), "month@Europe/Berlin");
        assert_eq!(
            Calendar::new(CalendarUnit::Day, "Mars/Olympus_Mons"),
            Err(CalendarError::UnknownTimeZone("Mars/Olympus_Mons".into()))
        );
        assert!("minute".parse::<CalendarUnit>().is_err());
        assert_eq!("MONTH".parse::<CalendarUnit>(), Ok(CalendarUnit::Month));
    }

    #[test]
    fn bounds_use_the_cache_and_agree_with_window() {
        let month = Calendar::new(CalendarUnit::Month, "Asia/Kolkata").unwrap();
        for t in [
            "2028-02-29T18:29:59Z",
            "2028-02-29T18:30:00Z",
            "2028-01-31T18:29:59Z",
        ] {
            let t = ts(t);
            let now = t.as_second() as u64 * 1_000_000_000 + 999_999_999;
            let (s, e) = month.window(t);
            for _ in 0..2 {
                assert_eq!(
                    month.bounds(now),
                    (s.as_second() as u64, e.as_second() as u64 * 1_000_000_000)
                );
            }
        }
        let b = month.boundaries(ts("2028-02-10T00:00:00Z").as_second() as u64 * 1_000_000_000);
        assert_eq!(
            b.map(|s| second(s as i64).to_string()),
            [
                "2027-12-31T18:30:00Z",
                "2028-01-31T18:30:00Z",
                "2028-02-29T18:30:00Z",
                "2028-03-31T18:30:00Z"
            ]
        );
    }
}
