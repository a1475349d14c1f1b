//! Waiting for capacity instead of being denied: `until_ready` and reservations.

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

use super::{KeyedRateLimiter, RateLimiter};
use crate::clock::{Clock, Nanos, nanos};
use crate::decision::Decision;
use crate::quota::{Algorithm, InsufficientCapacity};

/// Why [`RateLimiter::reserve`] could not reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// Only the bucket algorithms (GCRA, leaky bucket) can grant units ahead of time.
    #[error("reservations need gcra or leaky_bucket, not {0}")]
    NotABucket(Algorithm),
    /// The units would only be available after longer than the caller is willing to wait.
    #[error("the wait would be {wait:?}, more than the maximum of {max:?}")]
    TooLong {
        /// How long the caller would have had to wait.
        wait: Duration,
        /// The most the caller was willing to wait.
        max: Duration,
    },
    /// The cost exceeds the burst: it can never be granted.
    #[error(transparent)]
    Capacity(#[from] InsufficientCapacity),
}

/// Units taken ahead of time from a [`RateLimiter`]: wait for [`ready_at`](Self::delay), then
/// act. Dropping or [`cancel`](Self::cancel)ling a reservation before it is
/// [`wait`](Self::wait)ed for or [`commit`](Self::commit)ted gives its units back.
///
/// Reservations are granted in order, so waiting on them is first-come, first-served.
#[must_use = "dropping a reservation gives its units back"]
#[derive(Debug)]
pub struct Reservation<'a, C: Clock> {
    limiter: &'a RateLimiter<C>,
    /// Units taken.
    units: u64,
    /// When they may be used, on the limiter's clock.
    ready_at: Nanos,
    /// Set once the units are spent; otherwise dropping refunds them.
    spent: bool,
}

impl<C: Clock> Reservation<'_, C> {
    /// How long until the units may be used (zero if they may be used now).
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.ready_at.saturating_sub(self.limiter.now()))
    }

    /// Waits until the units may be used; they are then spent.
    pub async fn wait(mut self) {
        let delay = self.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.spent = true;
    }

    /// Spends the units without waiting (the caller takes care of timing).
    pub fn commit(mut self) {
        self.spent = true;
    }

    /// Gives the units back.
    pub fn cancel(self) {}
}

impl<C: Clock> Drop for Reservation<'_, C> {
    fn drop(&mut self) {
        if !self.spent {
            self.limiter.refund(self.units);
        }
    }
}

impl<C: Clock> RateLimiter<C> {
    /// Takes `cost` units now, to be used once they are available — unless that is more than
    /// `max_wait` away. GCRA and leaky bucket only.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use flowgate::{clock::TokioClock, local::RateLimiter, Quota};
    ///
    /// let limiter = RateLimiter::with_clock(Quota::per_second(10)?.with_burst(1)?, TokioClock::new());
    /// let first = limiter.reserve(1, Duration::from_secs(1))?;
    /// let second = limiter.reserve(1, Duration::from_secs(1))?;
    /// assert_eq!(first.delay(), Duration::ZERO);
    /// assert_eq!(second.delay(), Duration::from_millis(100));
    /// first.commit();
    /// second.wait().await;
    /// # Ok(()) }
    /// ```
    pub fn reserve(
        &self,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation<'_, C>, ReserveError> {
        let quota = *self.quota();
        quota.check_cost(cost)?;
        let max = nanos(max_wait);
        let taken = self
            .update_bucket(|bucket, now| bucket.reserve(&quota, cost, now, max).map(|w| now + w))
            .ok_or(ReserveError::NotABucket(quota.algorithm()))?;
        match taken {
            Ok(ready_at) => Ok(Reservation {
                limiter: self,
                units: cost,
                ready_at,
                spent: false,
            }),
            Err(wait) => Err(ReserveError::TooLong {
                wait: Duration::from_nanos(wait),
                max: max_wait,
            }),
        }
    }

    /// Waits until one unit is granted, and takes it.
    pub async fn until_ready(&self) -> Decision {
        loop {
            let decision = self.check();
            if decision.allowed {
                return decision;
            }
            tokio::time::sleep(decision.retry_after).await;
        }
    }

    /// Waits until `cost` units are granted, and takes them. A cost above the burst is an
    /// error at once rather than a wait forever.
    pub async fn until_n_ready(&self, cost: u64) -> Result<Decision, InsufficientCapacity> {
        loop {
            let decision = self.check_n(cost)?;
            if decision.allowed {
                return Ok(decision);
            }
            tokio::time::sleep(decision.retry_after).await;
        }
    }
}

impl<K: Hash + Eq, C: Clock> KeyedRateLimiter<K, C> {
    /// Waits until `cost` units are granted to `key`, and takes them.
    pub async fn until_key_ready<Q>(
        &self,
        key: &Q,
        cost: u64,
    ) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        loop {
            let decision = self.check_key_n(key, cost)?;
            if decision.allowed {
                return Ok(decision);
            }
            tokio::time::sleep(decision.retry_after).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
    use crate::clock::TokioClock;

    #[tokio::test(start_paused = true)]
    async fn until_ready_paces_to_the_rate() {
        let limiter = RateLimiter::with_clock(Quota::per_second(10).unwrap(), TokioClock::new());
        let start = tokio::time::Instant::now();
        for _ in 0..30 {
            limiter.until_ready().await;
        }
        // 10 at once (the burst), then 20 more at 100 ms each.
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(limiter.until_n_ready(11).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn keyed_waits_are_per_key() {
        let limiter = KeyedRateLimiter::<u32>::builder(Quota::per_second(1).unwrap())
            .clock(TokioClock::new())
            .build();
        let start = tokio::time::Instant::now();
        limiter.until_key_ready(&1, 1).await.unwrap();
        limiter.until_key_ready(&2, 1).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        limiter.until_key_ready(&1, 1).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_reservations_give_their_units_back() {
        let limiter = RateLimiter::with_clock(
            Quota::per_second(10).unwrap().with_burst(2).unwrap(),
            TokioClock::new(),
        );
        let a = limiter.reserve(2, Duration::ZERO).unwrap();
        assert!(matches!(
            limiter.reserve(1, Duration::from_millis(50)),
            Err(ReserveError::TooLong { .. })
        ));
        drop(a);
        assert_eq!(limiter.peek().remaining, 2);
        let b = limiter.reserve(2, Duration::ZERO).unwrap();
        let c = limiter.reserve(1, Duration::from_millis(100)).unwrap();
        assert_eq!(c.delay(), Duration::from_millis(100));
        b.commit();
        c.cancel();
        assert_eq!(limiter.peek().remaining, 0);
        let window = RateLimiter::with_clock(
            Quota::per_second(1)
                .unwrap()
                .with_algorithm(Algorithm::FixedWindow)
                .unwrap(),
            TokioClock::new(),
        );
        assert_eq!(
            window.reserve(1, Duration::ZERO).unwrap_err(),
            ReserveError::NotABucket(Algorithm::FixedWindow)
        );
    }
}
