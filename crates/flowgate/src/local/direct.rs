//! [`RateLimiter`]: one quota for the whole process.

use std::fmt;
use std::time::Duration;

use super::{
    Cell, FixedCell, GcraCell, LeakyCell, LogCell, SlidingCell, cell, decide, lag_of,
    per_algorithm, try_decide,
};
use crate::algorithm::State;
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::decision::{Decision, Denied};
use crate::quota::{Algorithm, InsufficientCapacity, Quota};

/// The one cell of a direct limiter, of the type its algorithm needs.
pub(super) enum AnyCell {
    Gcra(GcraCell),
    Leaky(LeakyCell),
    Fixed(FixedCell),
    Sliding(SlidingCell),
    Log(LogCell),
}

impl AnyCell {
    fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Gcra => AnyCell::Gcra(Cell::occupied(Default::default())),
            Algorithm::LeakyBucket => AnyCell::Leaky(Cell::occupied(Default::default())),
            Algorithm::FixedWindow => AnyCell::Fixed(Cell::occupied(Default::default())),
            Algorithm::SlidingWindow => AnyCell::Sliding(Cell::occupied(Default::default())),
            Algorithm::SlidingLog => AnyCell::Log(Cell::occupied(Default::default())),
        }
    }
}

/// A rate limiter for one thing: every call draws on the same quota.
///
/// Checks are lock-free for every algorithm but the sliding log, never allocate, and read the
/// clock's cheap [`recent`](Clock::recent) time (see [`crate::clock`]).
///
/// ```
/// use flowgate::{Quota, RateLimiter};
///
/// let limiter = RateLimiter::new(Quota::per_second(50).with_burst(5)?);
/// let granted = (0..10).filter(|_| limiter.check().allowed).count();
/// assert_eq!(granted, 5);
/// # Ok::<(), flowgate::QuotaError>(())
/// ```
pub struct RateLimiter<C: Clock = MonotonicClock> {
    /// What the limiter allows.
    quota: Quota,
    /// Where time comes from.
    clock: C,
    /// The clock's lag as a `Duration`, for the re-check rule in `decide`.
    lag: Duration,
    /// The same lag in nanoseconds, for `try_decide`.
    lag_nanos: Nanos,
    /// The state.
    cell: AnyCell,
}

impl RateLimiter<MonotonicClock> {
    /// A limiter enforcing `quota` on the default clock.
    pub fn new(quota: Quota) -> Self {
        Self::with_clock(quota, MonotonicClock::new())
    }
}

impl<C: Clock> RateLimiter<C> {
    /// A limiter enforcing `quota` with time from `clock`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use flowgate::{clock::ManualClock, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new(0);
    /// let limiter = RateLimiter::with_clock(Quota::per_second(1), clock.clone());
    /// assert!(limiter.check().allowed);
    /// assert!(!limiter.check().allowed);
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.check().allowed);
    /// ```
    pub fn with_clock(quota: Quota, clock: C) -> Self {
        RateLimiter {
            lag: lag_of(&clock),
            lag_nanos: clock.max_lag(),
            cell: AnyCell::new(quota.algorithm()),
            quota,
            clock,
        }
    }

    /// The quota this limiter enforces.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Asks for one unit on the leanest path: `Ok(())` if granted, otherwise how long to wait
    /// (what governor's `check` answers). [`check`](Self::check) takes the same unit and also
    /// reports `remaining` and `reset_after` (for headers); this is what to call in a hot loop.
    #[inline]
    pub fn try_check(&self) -> Result<(), Denied> {
        match &self.cell {
            AnyCell::Gcra(c) => try_decide(&self.clock, self.lag_nanos, |now| {
                c.update(|s| s.try_check(&self.quota, 1, now))
            }),
            _ => {
                let decision = self.decide_other(1);
                if decision.allowed {
                    Ok(())
                } else {
                    Err(Denied {
                        retry_after: decision.retry_after,
                    })
                }
            }
        }
    }

    /// Asks for one unit.
    #[inline]
    pub fn check(&self) -> Decision {
        // One unit always fits: a quota's burst is at least 1.
        self.decide(1)
    }

    /// Asks for `cost` units at once. `cost == 0` peeks without taking anything. A cost larger
    /// than the quota's burst can never be granted and is an error.
    #[inline]
    pub fn check_n(&self, cost: u64) -> Result<Decision, InsufficientCapacity> {
        self.quota.check_cost(cost)?;
        Ok(self.decide(cost))
    }

    /// What a request would be told now, without taking anything.
    pub fn peek(&self) -> Decision {
        self.decide(0)
    }

    /// Gives back `units` taken earlier, e.g. for work that turned out not to happen.
    pub fn refund(&self, units: u64) {
        let now = self.clock.now();
        let quota = &self.quota;
        per_algorithm!(AnyCell, &self.cell, c => c.update(|s| s.refund(quota, units, now)));
    }

    /// Restores the full quota, as if the limiter were new.
    pub fn reset(&self) {
        per_algorithm!(AnyCell, &self.cell, c => c.update(|s| *s = Default::default()));
    }

    #[inline]
    fn decide(&self, cost: u64) -> Decision {
        // GCRA, the common choice, gets a path of its own small enough to inline into callers.
        match &self.cell {
            AnyCell::Gcra(c) => decide(&self.clock, self.lag, |now| {
                cell::check(c, &self.quota, cost, now)
            }),
            _ => self.decide_other(cost),
        }
    }

    #[inline(never)]
    fn decide_other(&self, cost: u64) -> Decision {
        let quota = &self.quota;
        per_algorithm!(AnyCell, &self.cell, c => {
            decide(&self.clock, self.lag, |now| cell::check(c, quota, cost, now))
        })
    }

    /// Applies `f` to the GCRA or leaky-bucket state, for reservations.
    #[cfg(feature = "tokio")]
    pub(super) fn update_bucket<R>(
        &self,
        f: impl Fn(&mut dyn crate::algorithm::Reserve, Nanos) -> R,
    ) -> Option<R> {
        let now = self.clock.now();
        match &self.cell {
            AnyCell::Gcra(c) => Some(c.update(|s| f(s, now))),
            AnyCell::Leaky(c) => Some(c.update(|s| f(s, now))),
            _ => None,
        }
    }
}

impl<C: Clock> fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn every_algorithm_admits_its_burst_then_denies_then_recovers() {
        for algorithm in Algorithm::ALL {
            let quota = Quota::per_second(4).with_algorithm(algorithm).unwrap();
            let clock = ManualClock::new(10_000_000_000);
            let limiter = RateLimiter::with_clock(quota, clock.clone());
            for _ in 0..3 {
                assert!(limiter.check().allowed, "{algorithm}");
            }
            assert_eq!(limiter.try_check(), Ok(()), "{algorithm}");
            let denied = limiter.check();
            assert!(!denied.allowed, "{algorithm}");
            assert_eq!(
                limiter.try_check().unwrap_err().retry_after,
                denied.retry_after,
                "{algorithm}"
            );
            assert_eq!(limiter.peek().remaining, 0, "{algorithm}");
            clock.advance(Duration::from_secs(2));
            assert!(limiter.check().allowed, "{algorithm}");
            limiter.reset();
            assert_eq!(limiter.peek().remaining, 4, "{algorithm}");
            assert!(limiter.check_n(5).is_err());
            assert!(limiter.check_n(4).unwrap().allowed);
            limiter.refund(2);
            assert_eq!(limiter.peek().remaining, 2, "{algorithm}");
        }
    }

    #[test]
    fn a_denial_within_the_clock_lag_is_rechecked_on_a_precise_reading() {
        /// A clock whose cheap reading stays where it started (the worst lag allowed).
        struct Stuck(ManualClock, Nanos);
        impl Clock for Stuck {
            fn now(&self) -> Nanos {
                self.0.now()
            }
            fn recent(&self) -> Nanos {
                self.1
            }
            fn max_lag(&self) -> Nanos {
                1_000_000_000
            }
        }
        let start = 100_000_000_000;
        let clock = ManualClock::new(start);
        let limiter = RateLimiter::with_clock(Quota::per_second(10), Stuck(clock.clone(), start));
        for _ in 0..10 {
            assert!(limiter.check().allowed);
        }
        // On the stuck reading the bucket is empty; the re-check on the precise reading sees
        // 100 ms of refill.
        assert!(!limiter.check().allowed);
        clock.advance(Duration::from_millis(100));
        assert!(limiter.check().allowed);
        assert!(!limiter.check().allowed);
    }
}
