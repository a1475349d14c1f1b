//! The leaky bucket as a meter, in the continuous-state form of ITU-T I.371.
//!
//! The bucket holds a level `X` (here in nanoseconds of drain time: a unit adds `T`) and the
//! time it was last updated (`LCT`). It drains continuously at one unit per `T`. A request for
//! `cost` units is conforming if the drained level plus `cost·T` fits the capacity
//! `τ = burst × T`.
//!
//! I.371 shows this form and GCRA's "virtual scheduling" form take the same decisions; Flowgate
//! implements both independently and a property test checks that they agree on random traces.
//! To *delay* requests instead of denying them, use [`crate::local::Shaper`].

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::Quota;

use super::{Reserve, State};

/// Leaky bucket state: level and last update time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LeakyBucket {
    /// The level at `updated`, in nanoseconds of drain time (`units × T`).
    pub(crate) level: Nanos,
    /// When `level` was last computed.
    pub(crate) updated: Nanos,
}

impl LeakyBucket {
    #[inline]
    fn drained(&self, now: Nanos) -> Nanos {
        self.level.saturating_sub(now.saturating_sub(self.updated))
    }
}

impl State for LeakyBucket {
    #[inline]
    fn check(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        let interval = quota.interval_nanos();
        let capacity = quota.tolerance_nanos();
        let level = self.drained(now);
        let filled = level.saturating_add(cost.saturating_mul(interval));
        if filled > capacity {
            let free = capacity.saturating_sub(level);
            return Decision::deny(quota, quota.units_in(free), level, filled - capacity);
        }
        if cost > 0 {
            self.level = filled;
            self.updated = self.updated.max(now);
        }
        Decision::allow(quota, quota.units_in(capacity - filled), filled)
    }

    #[inline]
    fn refund(&mut self, quota: &Quota, units: u64, now: Nanos) {
        let level = self.drained(now);
        self.level = level.saturating_sub(units.saturating_mul(quota.interval_nanos()));
        self.updated = self.updated.max(now);
    }

    fn charge(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision {
        if cost > 0 {
            self.level = super::charged_span(self.drained(now), cost, quota);
            self.updated = self.updated.max(now);
        }
        self.check(quota, 0, now).charged()
    }

    #[inline]
    fn idle_at(&self, _quota: &Quota) -> Nanos {
        self.updated.saturating_add(self.level)
    }
}

impl Reserve for LeakyBucket {
    #[inline]
    fn reserve(
        &mut self,
        quota: &Quota,
        cost: u64,
        now: Nanos,
        max_wait: Nanos,
    ) -> Result<Nanos, Nanos> {
        let filled = self
            .drained(now)
            .saturating_add(cost.saturating_mul(quota.interval_nanos()));
        let wait = filled.saturating_sub(quota.tolerance_nanos());
        if wait > max_wait {
            return Err(wait);
        }
        self.level = filled;
        self.updated = self.updated.max(now);
        Ok(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_at_the_rate() {
        let q = Quota::per_second(2); // T = 500 ms, capacity 1 s
        let mut s = LeakyBucket::default();
        let t0 = 10_000_000_000;
        assert!(s.check(&q, 2, t0).allowed);
        assert!(!s.check(&q, 1, t0).allowed);
        let d = s.check(&q, 1, t0 + 500_000_000);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(s.idle_at(&q), t0 + 1_500_000_000);
    }
}
