//! Calendar periods against jiff, at random instants in random zones: each window contains its
//! instant, windows tile time without gaps or overlaps, and each starts at the first instant
//! of its local day, Monday, 1st or 1 January. Then the fixed window on a calendar, through a
//! store: the count starts again at each boundary and `reset_after` runs to it.

#![cfg(feature = "calendar")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flowgate::calendar::{Calendar, CalendarUnit};
use flowgate::clock::ManualClock;
use flowgate::store::{Ask, MemoryStore, Store};
use flowgate::{Algorithm, Quota, QuotaError};
use jiff::civil::{Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};
use proptest::prelude::*;

/// Zones with the awkward cases: daylight saving in both hemispheres, changes at midnight
/// (Havana, Santiago, Asuncion, Beirut), half-hour offsets and a half-hour DST (Lord Howe), a
/// skipped day (Apia, 30 December 2011), a zone east of UTC by 14 hours (Kiritimati).
const ZONES: &[&str] = &[
    "UTC",
    "Europe/Berlin",
    "Europe/London",
    "America/New_York",
    "America/Havana",
    "America/Santiago",
    "America/Asuncion",
    "Asia/Beirut",
    "Asia/Kolkata",
    "Asia/Tehran",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Pacific/Kiritimati",
    "America/St_Johns",
    "Africa/Casablanca",
];

fn unit() -> impl Strategy<Value = CalendarUnit> {
    prop::sample::select(CalendarUnit::ALL.to_vec())
}

/// Seconds from 1971 to 2200.
fn instant() -> impl Strategy<Value = i64> {
    31_536_000i64..7_258_118_400
}

/// Whether `date` is the first day of a period of `unit`.
fn is_first_day(unit: CalendarUnit, date: jiff::civil::Date) -> bool {
    match unit {
        CalendarUnit::Day => true,
        CalendarUnit::Week => date.weekday() == Weekday::Monday,
        CalendarUnit::Month => date.day() == 1,
        CalendarUnit::Year => date.day() == 1 && date.month() == 1,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn windows_contain_their_instant_tile_time_and_start_at_local_midnight(
        t in instant(),
        zone in prop::sample::select(ZONES),
        unit in unit(),
    ) {
        let calendar = Calendar::new(unit, zone).unwrap();
        let tz = TimeZone::get(zone).unwrap();
        let at = Timestamp::from_second(t).unwrap();
        let (start, end) = calendar.window(at);
        prop_assert!(start <= at && at < end, "{start} <= {at} < {end}");
        // Tiling: the window just before `start` ends there; the one at `end` starts there.
        let before = calendar.window(start - 1.second());
        prop_assert_eq!(before.1, start);
        prop_assert!(before.0 < start);
        let after = calendar.window(end);
        prop_assert_eq!(after.0, end);
        // The start is the first instant of a period's first local day.
        let local = start.to_zoned(tz.clone());
        prop_assert!(is_first_day(unit, local.date()), "{local} begins no {unit}");
        prop_assert!((start - 1.second()).to_zoned(tz.clone()).date() < local.date());
        // Where local midnight exists, the period starts exactly there.
        let midnight = tz.to_ambiguous_zoned(local.date().to_datetime(Time::midnight()));
        if let Ok(m) = midnight.unambiguous() {
            prop_assert_eq!(m.timestamp(), start);
        }
        // The period's length is its days' (within a day either way for skipped and
        // repeated days), and the end is again the first instant of a first day.
        let days = local.date().until(end.to_zoned(tz.clone()).date()).unwrap().get_days();
        let (min, max) = match unit {
            CalendarUnit::Day => (1, 1),
            CalendarUnit::Week => (7, 7),
            CalendarUnit::Month => (28, 31),
            CalendarUnit::Year => (365, 366),
        };
        prop_assert!((min..=max).contains(&days) || zone == "Pacific/Apia", "{days} days");
        prop_assert!(is_first_day(unit, end.to_zoned(tz).date()));
    }

    #[test]
    fn a_calendar_month_in_utc_starts_at_midnight_on_the_first(t in instant()) {
        let calendar = Calendar::utc(CalendarUnit::Month);
        let (start, _) = calendar.window(Timestamp::from_second(t).unwrap());
        let dt = start.to_zoned(TimeZone::UTC).datetime();
        prop_assert_eq!((dt.day(), dt.time()), (1, Time::midnight()));
    }
}

fn nanos(t: &str) -> u64 {
    t.parse::<Timestamp>().unwrap().as_nanosecond() as u64
}

#[tokio::test]
async fn a_monthly_quota_renews_on_the_first_and_resets_at_the_boundary() {
    let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
    let quota = Quota::per_calendar(10_000, month).unwrap();
    let clock = ManualClock::new(nanos("2028-02-17T12:00:00Z"));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let d = store
        .check(Ask::new("k", &quota).cost(10_000))
        .await
        .unwrap();
    assert!(d.allowed);
    // To local midnight on 1 March 2028 (23:00 UTC on 29 February): 12 days and 11 hours.
    assert_eq!(d.reset_after, Duration::from_secs(12 * 86_400 + 11 * 3_600));
    let d = store.check(Ask::new("k", &quota)).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after, d.reset_after);
    clock.set(nanos("2028-02-29T22:59:59Z"));
    assert!(!store.check(Ask::new("k", &quota)).await.unwrap().allowed);
    clock.set(nanos("2028-02-29T23:00:00Z"));
    let d = store.check(Ask::new("k", &quota)).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 9_999);
    // March in Berlin: 31 days less the hour lost to summer time.
    assert_eq!(d.reset_after, Duration::from_secs(31 * 86_400 - 3_600));
}

#[test]
fn calendar_quotas_are_fixed_windows_and_keep_their_calendar() {
    let day = Calendar::utc(CalendarUnit::Day);
    let quota = Quota::per_calendar(10, day).unwrap();
    assert_eq!(
        quota.with_algorithm(Algorithm::Gcra),
        Err(QuotaError::CalendarNeedsFixedWindow {
            algorithm: Algorithm::Gcra
        })
    );
    let share = flowgate::store::local_share(&quota, 3);
    assert_eq!((share.limit(), share.calendar()), (3, Some(day)));
    assert_ne!(
        quota,
        Quota::new(10, Duration::from_secs(86_400))
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap()
    );
}

#[tokio::test]
async fn the_hybrid_store_shares_a_calendar_day_and_reports_its_boundary() {
    use flowgate::store::HybridStore;
    use std::sync::Arc;
    let day = Calendar::new(CalendarUnit::Day, "Europe/Berlin").unwrap();
    let quota = Quota::per_calendar(4, day).unwrap();
    // 22:00 UTC on 24 October 2026 is midnight in Berlin; that day has 25 hours.
    let clock = ManualClock::new(nanos("2026-10-25T20:00:00Z"));
    let memory = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let fleet: Vec<_> = (0..2)
        .map(|i| {
            HybridStore::builder(memory.clone())
                .instances(2)
                .instance(i)
                .build_manual()
        })
        .collect();
    let mut granted = 0;
    for _ in 0..3 {
        for store in &fleet {
            while store.check(Ask::new("k", &quota)).await.unwrap().allowed {
                granted += 1;
            }
            store.sync_now().await;
        }
    }
    // The hybrid store's bound: at most 2 × the limit with numbered instances.
    assert!((4..=8).contains(&granted), "{granted}");
    let d = fleet[0].check(Ask::new("k", &quota)).await.unwrap();
    assert!(!d.allowed);
    // To midnight in Berlin, 23:00 UTC.
    assert_eq!(d.reset_after, Duration::from_secs(3 * 3_600));
    // The next day, the shared count starts again.
    clock.set(nanos("2026-10-25T23:00:00Z"));
    let d = memory.check(Ask::new("k", &quota)).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.reset_after, Duration::from_secs(24 * 3_600));
}
