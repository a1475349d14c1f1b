//! Sliding log: the time stamp (and cost) of every grant in the last `period`.
//!
//! A request is granted if the costs logged in `(now − period, now]` plus its own fit within
//! `limit`. Exact: no window of length `period` ever holds more than `limit` units. Memory per
//! key is bounded: the log never holds more than `limit` entries, because every entry holds at
//! least one unit.

use std::collections::VecDeque;

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::Quota;

use super::State;

/// Sliding log state: grants still inside the window, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingLog {
    /// `(time, cost)` of each grant, oldest first.
    entries: VecDeque<(Nanos, u64)>,
    /// Sum of the costs in `entries`.
    total: u64,
}

impl SlidingLog {
    /// The logged grants, oldest first, as `(time, cost)`.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (Nanos, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// Units held by the log.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Drops grants that have left the window ending at `now`.
    fn expire(&mut self, period: Nanos, now: Nanos) {
        while let Some(&(t, cost)) = self.entries.front() {
            if t + period > now {
                break;
            }
            self.total -= cost;
            self.entries.pop_front();
        }
    }

    fn reset_after(&self, period: Nanos, now: Nanos) -> Nanos {
        self.entries
            .back()
            .map_or(0, |&(t, _)| (t + period).saturating_sub(now))
    }
}

impl State for SlidingLog {
    fn check(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        let period = quota.period_nanos();
        let limit = quota.limit();
        // A lagging `now` is treated as the newest grant's time: nothing expires early.
        let stamp = self.entries.back().map_or(now, |&(t, _)| t.max(now));
        // Forgetting expired grants is not a change of state: they no longer count.
        self.expire(period, stamp);
        if self.total.saturating_add(cost) > limit {
            let must_free = self.total.saturating_add(cost) - limit;
            let mut freed = 0;
            let mut retry = 0;
            for &(t, c) in &self.entries {
                freed += c;
                if freed >= must_free {
                    retry = (t + period).saturating_sub(now);
                    break;
                }
            }
            let reset = self.reset_after(period, now);
            return Decision::deny(quota, limit.saturating_sub(self.total), reset, retry);
        }
        if cost > 0 {
            self.entries.push_back((stamp, cost));
            self.total += cost;
        }
        Decision::allow(quota, limit - self.total, self.reset_after(period, now))
    }

    fn refund(&mut self, _quota: &Quota, mut units: u64, _now: Nanos) {
        while units > 0 {
            let Some(last) = self.entries.back_mut() else {
                break;
            };
            let back = units.min(last.1);
            last.1 -= back;
            self.total -= back;
            units -= back;
            if last.1 == 0 {
                self.entries.pop_back();
            }
        }
    }

    fn charge(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        let limit = quota.limit();
        if cost > 0 {
            let stamp = self.entries.back().map_or(now, |&(t, _)| t.max(now));
            self.expire(quota.period_nanos(), stamp);
            let units = cost.min(limit);
            self.entries.push_back((stamp, units));
            self.total += units;
            // Keep the newest `limit` units: the oldest leave first anyway.
            let mut excess = self.total.saturating_sub(limit);
            while excess > 0 {
                let Some(oldest) = self.entries.front_mut() else {
                    break;
                };
                let dropped = excess.min(oldest.1);
                oldest.1 -= dropped;
                self.total -= dropped;
                excess -= dropped;
                if oldest.1 == 0 {
                    self.entries.pop_front();
                }
            }
        }
        self.check(quota, 0, now).charged()
    }

    fn idle_at(&self, quota: &Quota) -> Nanos {
        self.entries
            .back()
            .map_or(0, |&(t, _)| t.saturating_add(quota.period_nanos()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use std::time::Duration;

    #[test]
    fn exact_window_and_retry_at_the_oldest_grant_expiry() {
        let q = Quota::new(3, Duration::from_secs(10))
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap();
        let mut s = SlidingLog::default();
        let s1 = 1_000_000_000;
        assert!(s.check(&q, 1, 100 * s1).allowed);
        assert!(s.check(&q, 2, 104 * s1).allowed);
        let d = s.check(&q, 1, 105 * s1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(5));
        assert_eq!(d.reset_after, Duration::from_secs(9));
        // At exactly 110 s the first grant leaves the window (t + period ≤ now).
        assert!(s.check(&q, 1, 110 * s1).allowed);
        assert_eq!(s.entries().len(), 2);
        s.refund(&q, 2, 110 * s1);
        assert_eq!(s.total(), 1);
    }
}
