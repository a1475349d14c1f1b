//! [`Shaper`]: a leaky bucket that queues and delays requests instead of denying them.

use std::sync::Arc;
use std::time::Duration;

use super::RateLimiter;
use super::queue::WaitQueue;
use super::wait::ReserveError;
use crate::clock::{Clock, MonotonicClock};
use crate::quota::{Algorithm, InsufficientCapacity, Quota};

/// Why [`Shaper::until_n_ready`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// `max_queue` callers are already waiting.
    #[error("the queue is full ({max_queue} waiting)")]
    QueueFull {
        /// The configured queue length.
        max_queue: usize,
    },
    /// The caller would wait longer than `max_delay`.
    #[error("the delay would be {delay:?}, more than the maximum of {max_delay:?}")]
    DelayTooLong {
        /// How long the caller would have waited.
        delay: Duration,
        /// The configured maximum delay.
        max_delay: Duration,
    },
    /// The cost exceeds the burst: it can never be granted.
    #[error(transparent)]
    Capacity(#[from] InsufficientCapacity),
}

/// Spaces requests out to a steady rate: each caller waits for its turn, first come first
/// served, instead of being denied (like nginx's `limit_req` without `nodelay`). Up to `burst`
/// units pass at once after a quiet spell; beyond `max_queue` waiting callers or `max_delay`
/// of wait, callers get an error at once.
///
/// A caller that stops waiting (its future is dropped) gives its place back.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use flowgate::{clock::TokioClock, local::Shaper, Quota};
///
/// // 5 SMS per second, no burst, at most 10 waiting, nobody waits more than 2 s.
/// let shaper = Shaper::with_clock(
///     Quota::per_second(5).with_burst(1)?, 10, Duration::from_secs(2), TokioClock::new());
/// let start = tokio::time::Instant::now();
/// for _ in 0..5 {
///     shaper.until_ready().await?;
/// }
/// assert_eq!(start.elapsed(), Duration::from_millis(800));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Shaper<C: Clock = MonotonicClock> {
    /// The leaky bucket that hands out departure times.
    bucket: RateLimiter<C>,
    /// Longest a caller may be asked to wait.
    max_delay: Duration,
    /// Callers waiting now, at most `max_queue`.
    queue: Arc<WaitQueue>,
}

impl Shaper<MonotonicClock> {
    /// A shaper releasing `quota.limit()` units per period (bursts of `quota.burst()`).
    pub fn new(quota: Quota, max_queue: usize, max_delay: Duration) -> Self {
        Self::with_clock(quota, max_queue, max_delay, MonotonicClock::new())
    }
}

impl<C: Clock> Shaper<C> {
    /// Like [`Shaper::new`], with time from `clock`.
    pub fn with_clock(quota: Quota, max_queue: usize, max_delay: Duration, clock: C) -> Self {
        let quota = quota
            .with_algorithm(Algorithm::LeakyBucket)
            .unwrap_or(quota);
        Shaper {
            bucket: RateLimiter::with_clock(quota, clock),
            max_delay,
            queue: WaitQueue::new(max_queue),
        }
    }

    /// Callers waiting now.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Waits for this caller's turn to use one unit.
    pub async fn until_ready(&self) -> Result<(), ShapeError> {
        self.until_n_ready(1).await
    }

    /// Waits for this caller's turn to use `cost` units.
    pub async fn until_n_ready(&self, cost: u64) -> Result<(), ShapeError> {
        let reservation = self
            .bucket
            .reserve(cost, self.max_delay)
            .map_err(|e| match e {
                ReserveError::TooLong { wait, max } => ShapeError::DelayTooLong {
                    delay: wait,
                    max_delay: max,
                },
                ReserveError::Capacity(c) => ShapeError::Capacity(c),
                // The bucket is always a leaky bucket.
                ReserveError::NotABucket(_) => ShapeError::DelayTooLong {
                    delay: Duration::MAX,
                    max_delay: self.max_delay,
                },
            })?;
        if reservation.delay().is_zero() {
            reservation.commit();
            return Ok(());
        }
        // A full queue drops the reservation, which gives its units back; the place leaves
        // the queue however the wait ends (completed or cancelled).
        let _place = self.queue.join().map_err(|full| ShapeError::QueueFull {
            max_queue: full.max_queue,
        })?;
        reservation.wait().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::TokioClock;
    use std::sync::Arc;

    fn new_shaper(max_queue: usize, max_delay_ms: u64) -> Arc<Shaper<TokioClock>> {
        Arc::new(Shaper::with_clock(
            Quota::per_second(10).with_burst(1).unwrap(),
            max_queue,
            Duration::from_millis(max_delay_ms),
            TokioClock::new(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn releases_in_order_at_the_rate() {
        let shaper = new_shaper(100, 10_000);
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for i in 0..10u64 {
            let shaper = shaper.clone();
            tasks.push(tokio::spawn(async move {
                shaper.until_n_ready(1).await.unwrap();
                (i, start.elapsed())
            }));
            tokio::task::yield_now().await;
        }
        for (n, task) in tasks.into_iter().enumerate() {
            let (i, at) = task.await.unwrap();
            assert_eq!(i, n as u64);
            assert_eq!(at, Duration::from_millis(100 * n as u64));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rejects_beyond_max_delay_and_max_queue() {
        let shaper = new_shaper(2, 250);
        shaper.until_n_ready(1).await.unwrap(); // passes at once
        let a = tokio::spawn({
            let s = shaper.clone();
            async move { s.until_n_ready(1).await }
        });
        let b = tokio::spawn({
            let s = shaper.clone();
            async move { s.until_n_ready(1).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(shaper.queued(), 2);
        // A third waiter would wait 300 ms > 250 ms.
        assert!(matches!(
            shaper.until_n_ready(1).await,
            Err(ShapeError::DelayTooLong { .. })
        ));
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        assert_eq!(shaper.queued(), 0);

        let tight = new_shaper(1, 10_000);
        tight.until_n_ready(1).await.unwrap();
        let waiter = tokio::spawn({
            let s = tight.clone();
            async move { s.until_n_ready(1).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(
            tight.until_n_ready(1).await,
            Err(ShapeError::QueueFull { max_queue: 1 })
        );
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(tight.queued(), 0);
    }
}
