//! Sliding-window counter: a fixed window's count plus the previous window's count weighted by
//! how much of the previous window still overlaps the sliding window `(now − period, now]`.
//!
//! With `e` the time elapsed in the current window, a request is granted if
//! `previous × (period − e) / period + current + cost ≤ limit`. Flowgate evaluates this in exact
//! integer arithmetic (both sides multiplied by `period`), so there is no rounding.
//!
//! The estimate assumes the previous window's requests were spread evenly. For steady traffic
//! the error is tiny; the worst case — the previous window's whole `limit` arriving at its very
//! end — lets just under 2 × `limit` through within one period (a property test checks both
//! the bound and that the worst case is reachable).

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::Quota;

use super::State;

/// The most a window's count can hold (charges stop there): the state is packed in 128 bits
/// with 32 for each count, and `Quota` caps this algorithm's limit at the same.
const MAX_COUNT: u64 = u32::MAX as u64;

/// Sliding-window state: the current window and the counts of it and the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindow {
    /// Index of the current window (its start divided by the period).
    pub(crate) window: u64,
    /// Units granted in the current window.
    pub(crate) current: u64,
    /// Units granted in the window before it.
    pub(crate) previous: u64,
}

impl SlidingWindow {
    /// The state as seen from `now`'s window (rolled forward if time has moved on), and how
    /// far into that window `now` is. A lagging `now` is treated as the window's start.
    #[inline]
    fn rolled(&self, period: Nanos, now: Nanos) -> (SlidingWindow, Nanos) {
        let now_window = now / period;
        if now_window <= self.window {
            let elapsed = now.saturating_sub(self.window * period);
            return (*self, elapsed);
        }
        let previous = if now_window == self.window + 1 {
            self.current
        } else {
            0
        };
        let state = SlidingWindow {
            window: now_window,
            current: 0,
            previous,
        };
        (state, now % period)
    }
}

impl State for SlidingWindow {
    fn check(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        let p = quota.period_nanos();
        let limit = quota.limit();
        let (state, elapsed) = self.rolled(p, now);
        // If `now` lags behind the state's window, everything below is relative to the
        // window's start; add the lag back to durations.
        let lag = (state.window * p).saturating_sub(now);
        let (p128, l128) = (u128::from(p), u128::from(limit));
        let weighted_previous = u128::from(state.previous) * u128::from(p - elapsed);
        let capacity = l128 * p128;
        let used = weighted_previous + u128::from(state.current) * p128;
        let wanted = used + u128::from(cost) * p128;
        if wanted > capacity {
            let remaining = (capacity.saturating_sub(used) / p128) as u64;
            let reset = lag + reset_after(&state, p, elapsed);
            let retry = lag + retry_after(&state, limit, p, elapsed, cost);
            return Decision::deny(quota, remaining, reset, retry);
        }
        let mut next = state;
        next.current += cost;
        if cost > 0 {
            *self = next;
        }
        let remaining = ((capacity - wanted) / p128) as u64;
        Decision::allow(quota, remaining, lag + reset_after(&next, p, elapsed))
    }

    fn refund(&mut self, quota: &Quota, units: u64, now: Nanos) {
        let p = quota.period_nanos();
        let (mut state, _) = self.rolled(p, now);
        if state.window == self.window {
            state.current = state.current.saturating_sub(units);
        } else {
            // The units were counted in what is now the previous window.
            state.previous = state.previous.saturating_sub(units);
        }
        *self = state;
    }

    fn charge(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        if cost > 0 {
            let (mut state, _) = self.rolled(quota.period_nanos(), now);
            state.current = super::charged_count(state.current, cost, MAX_COUNT);
            *self = state;
        }
        self.check(quota, 0, now).charged()
    }

    fn idle_at(&self, quota: &Quota) -> Nanos {
        let p = quota.period_nanos();
        if self.current > 0 {
            (self.window + 2).saturating_mul(p)
        } else if self.previous > 0 {
            (self.window + 1).saturating_mul(p)
        } else {
            0
        }
    }
}

/// Time until the estimate falls to zero.
fn reset_after(state: &SlidingWindow, p: Nanos, elapsed: Nanos) -> Nanos {
    if state.current > 0 {
        2 * p - elapsed
    } else if state.previous > 0 {
        p - elapsed
    } else {
        0
    }
}

/// Time until `cost` fits, assuming no other traffic. Only called when it does not fit now,
/// which implies `previous > 0` or `current + cost > limit`.
fn retry_after(state: &SlidingWindow, limit: u64, p: Nanos, elapsed: Nanos, cost: u64) -> Nanos {
    let p128 = u128::from(p);
    // Smallest elapsed time `e` in a window with counts (prev, cur) at which `cost` fits:
    // prev × (p − e) ≤ (limit − cur − cost) × p  ⇔  p − e ≤ ⌊(limit − cur − cost)·p / prev⌋.
    let fits_from = |prev: u64, cur: u64| -> Nanos {
        let room = u128::from(limit - cur - cost) * p128;
        match room.checked_div(u128::from(prev)) {
            None => 0,
            Some(k) => p - (k.min(p128) as Nanos),
        }
    };
    if state.current.saturating_add(cost) <= limit {
        // Wait for the previous window's weight to decay (at the latest: the next window).
        fits_from(state.previous, state.current).saturating_sub(elapsed)
    } else {
        // Wait for the next window, where this window's count becomes the previous one.
        (p - elapsed) + fits_from(state.current, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use std::time::Duration;

    fn quota(limit: u64, secs: u64) -> Quota {
        Quota::new(limit, Duration::from_secs(secs))
            .unwrap()
            .with_algorithm(Algorithm::SlidingWindow)
            .unwrap()
    }

    #[test]
    fn previous_window_weighs_in_proportionally() {
        let q = quota(10, 10);
        let mut s = SlidingWindow::default();
        let s10 = 10_000_000_000;
        assert!(s.check(&q, 10, s10 + 5_000_000_000).allowed); // window 1 full
        // 25% into window 2: previous weighs 7.5 → 2 units fit.
        let t = 2 * s10 + 2_500_000_000;
        let d = s.check(&q, 0, t);
        assert_eq!(d.remaining, 2);
        assert!(s.check(&q, 2, t).allowed);
        let d = s.check(&q, 1, t);
        assert!(!d.allowed);
        // prev × (p − e) ≤ (10 − 2 − 1)·p  ⇒  e ≥ 3 s: retry after 0.5 s.
        assert_eq!(d.retry_after, Duration::from_millis(500));
        assert!(s.check(&q, 1, t + 500_000_000).allowed);
    }

    #[test]
    fn retry_waits_into_next_window_when_current_is_full() {
        let q = quota(4, 1);
        let mut s = SlidingWindow::default();
        let t = 5_000_000_000;
        assert!(s.check(&q, 4, t).allowed);
        let d = s.check(&q, 2, t);
        // Next window: previous = 4 must weigh ≤ 2 ⇒ half-way into it.
        assert_eq!(d.retry_after, Duration::from_millis(1500));
        assert_eq!(d.reset_after, Duration::from_secs(2));
    }
}
