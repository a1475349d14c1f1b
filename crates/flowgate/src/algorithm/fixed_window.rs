//! Fixed window: at most `limit` units in each window `[k·period, (k+1)·period)`.
//!
//! Windows are aligned to the Unix epoch, so "per minute" means per wall-clock minute on every
//! instance and every store. Cheap and simple, but a client can take `limit` at the end of one
//! window and `limit` again at the start of the next: up to 2 × `limit` within one period.
//!
//! A calendar quota (feature `calendar`) has calendar periods for windows: `window` is then the
//! period's start in seconds since the epoch (see [`crate::calendar`]), which grows with time
//! just as an index does, and a window ends at the next calendar boundary.

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::Quota;

use super::State;

/// Fixed window state: which window, and how much of it is used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    /// The window's index: its start divided by the period (for a calendar quota, its start
    /// in seconds).
    pub(crate) window: u64,
    /// Units granted in that window.
    pub(crate) count: u64,
}

/// The key of the window containing `now` under `quota`.
#[inline]
fn window_of(quota: &Quota, now: Nanos) -> u64 {
    match quota.window_calendar() {
        None => now / quota.period_nanos(),
        Some(calendar) => calendar.bounds(now).0,
    }
}

/// When the window with key `window` ends under `quota`.
#[inline]
fn end_of(quota: &Quota, window: u64) -> Nanos {
    match quota.window_calendar() {
        None => (window + 1).saturating_mul(quota.period_nanos()),
        Some(calendar) => calendar.end_of(window),
    }
}

impl FixedWindow {
    /// The window to count in at `now` — the current one, or the state's if `now` lags
    /// behind it — and when it ends.
    #[inline]
    fn current(&self, quota: &Quota, now: Nanos) -> (u64, Nanos) {
        let (window, end) = match quota.window_calendar() {
            None => {
                let window = now / quota.period_nanos();
                (window, end_of(quota, window))
            }
            Some(calendar) => calendar.bounds(now),
        };
        if window >= self.window {
            (window, end)
        } else {
            (self.window, end_of(quota, self.window))
        }
    }
}

impl State for FixedWindow {
    #[inline]
    fn check(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        let limit = quota.limit();
        // A lagging `now` may fall in an earlier window than the state's: stay in the state's.
        let (window, window_end) = self.current(quota, now);
        let count = if window == self.window { self.count } else { 0 };
        let until_end = window_end.saturating_sub(now);
        if count.saturating_add(cost) > limit {
            return Decision::deny(quota, limit.saturating_sub(count), until_end, until_end);
        }
        let count = count + cost;
        if cost > 0 {
            *self = FixedWindow { window, count };
        }
        let reset = if count == 0 { 0 } else { until_end };
        Decision::allow(quota, limit - count, reset)
    }

    #[inline]
    fn refund(&mut self, quota: &Quota, units: u64, now: Nanos) {
        if self.window >= window_of(quota, now) {
            self.count = self.count.saturating_sub(units);
        }
    }

    fn charge(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        if cost > 0 {
            let (window, _) = self.current(quota, now);
            let count = if window == self.window { self.count } else { 0 };
            *self = FixedWindow {
                window,
                count: super::charged_count(
                    count,
                    cost,
                    quota.limit().saturating_add(super::MAX_CHARGE),
                ),
            };
        }
        self.check(quota, 0, now).charged()
    }

    #[inline]
    fn idle_at(&self, quota: &Quota) -> Nanos {
        if self.count == 0 {
            0
        } else {
            end_of(quota, self.window)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary_lets_two_windows_worth_through_back_to_back() {
        let q = Quota::per_second(5)
            .with_algorithm(crate::Algorithm::FixedWindow)
            .unwrap();
        let mut s = FixedWindow::default();
        let end_of_window = 7_999_000_000;
        for _ in 0..5 {
            assert!(s.check(&q, 1, end_of_window).allowed);
        }
        assert!(!s.check(&q, 1, end_of_window).allowed);
        for _ in 0..5 {
            assert!(s.check(&q, 1, end_of_window + 1_000_000).allowed);
        }
    }
}
