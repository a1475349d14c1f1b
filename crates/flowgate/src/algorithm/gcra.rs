//! GCRA, the generic cell rate algorithm: a token bucket stored as one time stamp.
//!
//! With `T = period / limit` (the emission interval) and `τ = burst × T` (the tolerance), the
//! state is the *theoretical arrival time* `tat`: the instant at which the bucket would be
//! full again. A request for `cost` units at `now` is granted if
//! `max(tat, now) + cost·T − now ≤ τ`, and then moves `tat` to `max(tat, now) + cost·T`.
//! In any interval of length `t` it grants at most `burst + t / T` units.

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::Quota;

use super::{Reserve, State};

/// GCRA state: the theoretical arrival time. `0` is a key never seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gcra {
    /// The instant the bucket is full again; at or before `now` means it is full.
    pub(crate) tat: Nanos,
}

impl Gcra {
    /// The lean form of [`State::check`]: grants `cost` units (`Ok`) or says how long until
    /// they would be granted (`Err`, in nanoseconds), computing nothing else. This is all the
    /// limiters' `try_check` needs.
    #[inline]
    pub(crate) fn try_check(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Result<(), Nanos> {
        let base = self.tat.max(now);
        let needed = (base - now).saturating_add(cost.saturating_mul(quota.interval_nanos()));
        if needed > quota.tolerance_nanos() {
            return Err(needed - quota.tolerance_nanos());
        }
        if cost > 0 {
            self.tat = now + needed;
        }
        Ok(())
    }
}

impl State for Gcra {
    #[inline]
    fn check(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        let interval = quota.interval_nanos();
        let tolerance = quota.tolerance_nanos();
        let base = self.tat.max(now);
        // Time already spoken for, ahead of now. It exceeds τ when a charge ran the key into
        // debt (or `now` went backwards).
        let pending = base - now;
        let needed = pending.saturating_add(cost.saturating_mul(interval));
        if needed > tolerance {
            let free = tolerance.saturating_sub(pending);
            return Decision::deny(quota, quota.units_in(free), pending, needed - tolerance);
        }
        if cost > 0 {
            self.tat = now + needed;
        }
        Decision::allow(quota, quota.units_in(tolerance - needed), needed)
    }

    #[inline]
    fn refund(&mut self, quota: &Quota, units: u64, now: Nanos) {
        if self.tat > now {
            let back = units.saturating_mul(quota.interval_nanos());
            self.tat = self.tat.saturating_sub(back).max(now);
        }
    }

    fn charge(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        if cost > 0 {
            let base = self.tat.max(now);
            self.tat = now.saturating_add(super::charged_span(base - now, cost, quota));
        }
        self.check(quota, 0, now).charged()
    }

    #[inline]
    fn idle_at(&self, _quota: &Quota) -> Nanos {
        self.tat
    }
}

impl Reserve for Gcra {
    #[inline]
    fn reserve(
        &mut self,
        quota: &Quota,
        cost: u64,
        now: Nanos,
        max_wait: Nanos,
    ) -> Result<Nanos, Nanos> {
        let tat = self
            .tat
            .max(now)
            .saturating_add(cost.saturating_mul(quota.interval_nanos()));
        let wait = (tat - now).saturating_sub(quota.tolerance_nanos());
        if wait > max_wait {
            return Err(wait);
        }
        self.tat = tat;
        Ok(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Nanos = 1_000_000;

    #[test]
    fn burst_then_one_per_interval() {
        let q = Quota::per_second(10); // T = 100 ms, τ = 1 s
        let mut s = Gcra::default();
        let now = 1_000 * MS;
        for left in (0..10).rev() {
            let d = s.check(&q, 1, now);
            assert!(d.allowed);
            assert_eq!(d.remaining, left);
        }
        let d = s.check(&q, 1, now);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(100));
        assert_eq!(d.reset_after, Duration::from_secs(1));
        assert!(s.check(&q, 1, now + 100 * MS).allowed);
    }

    #[test]
    fn refund_gives_units_back_but_never_beyond_full() {
        let q = Quota::per_second(10);
        let mut s = Gcra::default();
        let now = 5_000 * MS;
        let _ = s.check(&q, 4, now);
        s.refund(&q, 3, now);
        assert_eq!(s.check(&q, 0, now).remaining, 9);
        s.refund(&q, 100, now);
        assert_eq!(s.tat, now);
        assert_eq!(s.check(&q, 0, now).remaining, 10);
    }
}
