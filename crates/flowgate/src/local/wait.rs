//! Waiting for capacity instead of being denied: `until_ready` and reservations, for the direct
//! and the keyed limiter alike.
//!
//! | | direct ([`RateLimiter`]) | keyed ([`KeyedRateLimiter`]) |
//! |---|---|---|
//! | wait for one unit | `until_ready()` | `until_key_ready(key)` |
//! | wait for `n` units | `until_n_ready(n)` | `until_key_n_ready(key, n)` |
//! | … plus a random delay | `until_ready_with_jitter(max)`, `until_n_ready_with_jitter(n, max)` | `until_key_ready_with_jitter(key, max)`, `until_key_n_ready_with_jitter(key, n, max)` |
//! | take units ahead of time | `reserve(n, max_wait)` | `reserve_key(key, n, max_wait)` |
//!
//! Jitter spreads the callers that a denial sent to sleep for the same time, so they do not all
//! come back at the same instant (a thundering herd): each waits an extra uniformly random
//! delay below `max`.

use std::borrow::Borrow;
use std::cell::Cell as StdCell;
use std::convert::Infallible;
use std::hash::Hash;
use std::time::Duration;

use super::{KeyedRateLimiter, RateLimiter};
use crate::clock::{Clock, Nanos, nanos};
use crate::decision::Decision;
use crate::quota::{Algorithm, InsufficientCapacity};

/// Why [`RateLimiter::reserve`] or [`KeyedRateLimiter::reserve_key`] could not reserve.
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

/// Where a reservation's units came from: what it reads the time from and refunds to.
trait Holder: Send + Sync {
    /// The limiter's time now.
    fn now(&self) -> Nanos;
    /// Gives `units` back.
    fn give_back(&self, units: u64);
}

impl<C: Clock> Holder for RateLimiter<C> {
    fn now(&self) -> Nanos {
        self.clock().now()
    }
    fn give_back(&self, units: u64) {
        self.refund(units);
    }
}

/// A keyed limiter and the key whose units were reserved.
struct KeyHolder<'a, K, C: Clock> {
    limiter: &'a KeyedRateLimiter<K, C>,
    key: K,
}

impl<K: Hash + Eq + Send + Sync, C: Clock> Holder for KeyHolder<'_, K, C> {
    fn now(&self) -> Nanos {
        self.limiter.now()
    }
    fn give_back(&self, units: u64) {
        self.limiter.refund_key(&self.key, units);
    }
}

/// The limiter a reservation belongs to: borrowed (direct) or holding its key (keyed).
enum Source<'a> {
    Borrowed(&'a dyn Holder),
    Owned(Box<dyn Holder + 'a>),
}

impl Source<'_> {
    fn holder(&self) -> &dyn Holder {
        match self {
            Source::Borrowed(h) => *h,
            Source::Owned(h) => &**h,
        }
    }
}

/// Units taken ahead of time from a limiter: wait for [`delay`](Self::delay), then act.
/// Dropping or [`cancel`](Self::cancel)ling a reservation before it is [`wait`](Self::wait)ed
/// for or [`commit`](Self::commit)ted gives its units back.
///
/// Reservations are granted in order, so waiting on them is first-come, first-served.
#[must_use = "dropping a reservation gives its units back"]
pub struct Reservation<'a> {
    /// Where the units came from.
    source: Source<'a>,
    /// Units taken.
    units: u64,
    /// When they may be used, on the limiter's clock.
    ready_at: Nanos,
    /// Set once the units are spent; otherwise dropping refunds them.
    spent: bool,
}

impl std::fmt::Debug for Reservation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("units", &self.units)
            .field("ready_at", &self.ready_at)
            .field("spent", &self.spent)
            .finish()
    }
}

impl Reservation<'_> {
    /// How long until the units may be used (zero if they may be used now).
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.ready_at.saturating_sub(self.source.holder().now()))
    }

    /// Units reserved.
    pub fn units(&self) -> u64 {
        self.units
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

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.spent {
            self.source.holder().give_back(self.units);
        }
    }
}

/// The outcome of asking a bucket to reserve: the time the units are ready, or the wait that
/// was too long; `None` when the limiter is not a bucket.
type Reserved = Option<Result<Nanos, Nanos>>;

/// Turns a bucket's answer into a reservation from `source`.
fn reservation<'a>(
    reserved: Reserved,
    algorithm: Algorithm,
    cost: u64,
    max_wait: Duration,
    source: impl FnOnce() -> Source<'a>,
) -> Result<Reservation<'a>, ReserveError> {
    match reserved.ok_or(ReserveError::NotABucket(algorithm))? {
        Ok(ready_at) => Ok(Reservation {
            source: source(),
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

/// Checks with `check` until it grants, sleeping for each denial's `retry_after` plus up to
/// `jitter`.
async fn wait_for<E>(
    jitter: Duration,
    mut check: impl FnMut() -> Result<Decision, E>,
) -> Result<(), E> {
    loop {
        let decision = check()?;
        if decision.allowed {
            return Ok(());
        }
        tokio::time::sleep(decision.retry_after + random_below(jitter)).await;
    }
}

thread_local! {
    /// This thread's xorshift state for jitter (seeded from the state's address and the time,
    /// so threads differ); never 0.
    static JITTER: StdCell<u64> = const { StdCell::new(0) };
}

/// A uniformly distributed duration in `[0, max)` (zero when `max` is zero). Not for
/// cryptography: it only has to keep waiters from waking in step.
fn random_below(max: Duration) -> Duration {
    let max = nanos(max);
    if max == 0 {
        return Duration::ZERO;
    }
    let x = JITTER.with(|state| {
        let mut x = state.get();
        if x == 0 {
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            x = (seed ^ (state as *const _ as u64)) | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        x
    });
    Duration::from_nanos(((u128::from(x) * u128::from(max)) >> 64) as u64)
}

impl<C: Clock> RateLimiter<C> {
    /// Takes `cost` units now, to be used once they are available — unless that is more than
    /// `max_wait` away. GCRA and leaky bucket only.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use flowgate::{clock::TokioClock, Quota, RateLimiter};
    ///
    /// let limiter = RateLimiter::with_clock(Quota::per_second(10).with_burst(1)?, TokioClock::new());
    /// let first = limiter.reserve(1, Duration::from_secs(1))?;
    /// let second = limiter.reserve(1, Duration::from_secs(1))?;
    /// assert_eq!(first.delay(), Duration::ZERO);
    /// assert_eq!(second.delay(), Duration::from_millis(100));
    /// first.commit();
    /// second.wait().await;
    /// # Ok(()) }
    /// ```
    pub fn reserve(&self, cost: u64, max_wait: Duration) -> Result<Reservation<'_>, ReserveError> {
        let quota = *self.quota();
        quota.check_cost(cost)?;
        let max = nanos(max_wait);
        let reserved = self
            .update_bucket(|bucket, now| bucket.reserve(&quota, cost, now, max).map(|w| now + w));
        reservation(reserved, quota.algorithm(), cost, max_wait, || {
            Source::Borrowed(self)
        })
    }

    /// Waits until one unit is granted, and takes it.
    pub async fn until_ready(&self) {
        self.until_ready_with_jitter(Duration::ZERO).await
    }

    /// [`until_ready`](Self::until_ready), waiting up to `max_jitter` longer after each denial.
    pub async fn until_ready_with_jitter(&self, max_jitter: Duration) {
        // One unit always fits: a quota's burst is at least 1.
        let waited = wait_for(max_jitter, || Ok::<_, Infallible>(self.check())).await;
        match waited {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    /// Waits until `cost` units are granted, and takes them. A cost above the burst is an
    /// error at once rather than a wait forever.
    pub async fn until_n_ready(&self, cost: u64) -> Result<(), InsufficientCapacity> {
        self.until_n_ready_with_jitter(cost, Duration::ZERO).await
    }

    /// [`until_n_ready`](Self::until_n_ready), waiting up to `max_jitter` longer after each
    /// denial.
    pub async fn until_n_ready_with_jitter(
        &self,
        cost: u64,
        max_jitter: Duration,
    ) -> Result<(), InsufficientCapacity> {
        wait_for(max_jitter, || self.check_n(cost)).await
    }
}

impl<K: Hash + Eq + Send + Sync, C: Clock> KeyedRateLimiter<K, C> {
    /// Takes `cost` units of `key` now, to be used once they are available — unless that is
    /// more than `max_wait` away. GCRA and leaky bucket only. The reservation keeps a copy of
    /// the key, to give the units back if it is dropped unused.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use flowgate::{clock::TokioClock, KeyedRateLimiter, Quota};
    ///
    /// let per_user = KeyedRateLimiter::<String>::builder(Quota::per_second(2).with_burst(1)?)
    ///     .clock(TokioClock::new())
    ///     .build();
    /// per_user.reserve_key("ann", 1, Duration::ZERO)?.commit();
    /// let next = per_user.reserve_key("ann", 1, Duration::from_secs(1))?;
    /// assert_eq!(next.delay(), Duration::from_millis(500));
    /// assert_eq!(per_user.reserve_key("bob", 1, Duration::ZERO)?.delay(), Duration::ZERO);
    /// # Ok(()) }
    /// ```
    pub fn reserve_key<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation<'_>, ReserveError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let quota = *self.quota();
        quota.check_cost(cost)?;
        let max = nanos(max_wait);
        let reserved = self.update_bucket_key(key, |bucket, now| {
            bucket.reserve(&quota, cost, now, max).map(|w| now + w)
        });
        reservation(reserved, quota.algorithm(), cost, max_wait, || {
            Source::Owned(Box::new(KeyHolder {
                limiter: self,
                key: key.to_owned(),
            }))
        })
    }

    /// Waits until one unit is granted to `key`, and takes it.
    pub async fn until_key_ready<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.until_key_ready_with_jitter(key, Duration::ZERO).await
    }

    /// [`until_key_ready`](Self::until_key_ready), waiting up to `max_jitter` longer after
    /// each denial.
    pub async fn until_key_ready_with_jitter<Q>(&self, key: &Q, max_jitter: Duration)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // One unit always fits: a quota's burst is at least 1.
        let waited = wait_for(max_jitter, || Ok::<_, Infallible>(self.check_key(key))).await;
        match waited {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    /// Waits until `cost` units are granted to `key`, and takes them. A cost above the burst
    /// is an error at once.
    pub async fn until_key_n_ready<Q>(&self, key: &Q, cost: u64) -> Result<(), InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.until_key_n_ready_with_jitter(key, cost, Duration::ZERO)
            .await
    }

    /// [`until_key_n_ready`](Self::until_key_n_ready), waiting up to `max_jitter` longer
    /// after each denial.
    pub async fn until_key_n_ready_with_jitter<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_jitter: Duration,
    ) -> Result<(), InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        wait_for(max_jitter, || self.check_key_n(key, cost)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
    use crate::clock::TokioClock;

    #[tokio::test(start_paused = true)]
    async fn until_ready_paces_to_the_rate() {
        let limiter = RateLimiter::with_clock(Quota::per_second(10), TokioClock::new());
        let start = tokio::time::Instant::now();
        for _ in 0..30 {
            limiter.until_ready().await;
        }
        // 10 at once (the burst), then 20 more at 100 ms each.
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(limiter.until_n_ready(11).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_adds_a_bounded_random_delay() {
        let limiter = RateLimiter::with_clock(
            Quota::per_second(10).with_burst(1).unwrap(),
            TokioClock::new(),
        );
        let start = tokio::time::Instant::now();
        limiter.until_ready().await;
        let mut waits = Vec::new();
        for _ in 0..20 {
            let before = tokio::time::Instant::now();
            limiter
                .until_ready_with_jitter(Duration::from_millis(50))
                .await;
            waits.push(before.elapsed());
        }
        // Each wait is the 100 ms refill plus under 50 ms of jitter (tokio's timer rounds up
        // to the millisecond).
        for wait in &waits {
            assert!(
                *wait >= Duration::from_millis(100) && *wait <= Duration::from_millis(150),
                "{wait:?}"
            );
        }
        assert!(waits.windows(2).any(|w| w[0] != w[1]), "the delays vary");
        assert!(start.elapsed() >= Duration::from_secs(2));
        assert_eq!(random_below(Duration::ZERO), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn keyed_waits_are_per_key() {
        let limiter = KeyedRateLimiter::<u32>::builder(Quota::per_second(1))
            .clock(TokioClock::new())
            .build();
        let start = tokio::time::Instant::now();
        limiter.until_key_ready(&1).await;
        limiter.until_key_n_ready(&2, 1).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        limiter
            .until_key_ready_with_jitter(&1, Duration::from_millis(10))
            .await;
        assert!(start.elapsed() >= Duration::from_secs(1));
        // 1 s plus a jitter below 10 ms, rounded up to tokio's 1 ms timer resolution.
        assert!(start.elapsed() <= Duration::from_millis(1010));
        assert!(limiter.until_key_n_ready(&3, 2).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_reservations_give_their_units_back() {
        let limiter = RateLimiter::with_clock(
            Quota::per_second(10).with_burst(2).unwrap(),
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
                .with_algorithm(Algorithm::FixedWindow)
                .unwrap(),
            TokioClock::new(),
        );
        assert_eq!(
            window.reserve(1, Duration::ZERO).unwrap_err(),
            ReserveError::NotABucket(Algorithm::FixedWindow)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn keyed_reservations_are_per_key_and_refund_on_drop() {
        let limiter =
            KeyedRateLimiter::<String>::builder(Quota::per_second(10).with_burst(2).unwrap())
                .clock(TokioClock::new())
                .build();
        let a = limiter.reserve_key("a", 2, Duration::ZERO).unwrap();
        assert_eq!(limiter.peek_key("a").remaining, 0);
        assert_eq!(limiter.peek_key("b").remaining, 2);
        let later = limiter.reserve_key("a", 1, Duration::from_secs(1)).unwrap();
        assert_eq!(later.delay(), Duration::from_millis(100));
        assert_eq!(later.units(), 1);
        drop(later);
        drop(a);
        assert_eq!(limiter.peek_key("a").remaining, 2);
        limiter
            .reserve_key("a", 1, Duration::ZERO)
            .unwrap()
            .commit();
        assert_eq!(limiter.peek_key("a").remaining, 1);
        assert!(matches!(
            limiter.reserve_key("a", 3, Duration::ZERO),
            Err(ReserveError::Capacity(_))
        ));
    }
}
