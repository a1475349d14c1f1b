//! [`KeyedRateLimiter`]: one quota per key, for millions of keys in bounded memory.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::table::{ShardedMap, TableStats};
use super::{
    Cell, FixedCell, GcraCell, LeakyCell, LogCell, SlidingCell, decide, lag_of, per_algorithm,
    try_decide,
};
use crate::algorithm::State;
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::decision::{Decision, Denied};
use crate::quota::{Algorithm, InsufficientCapacity, Quota};

/// Keys a [`KeyedRateLimiter`] or a [`MemoryStore`](crate::store::MemoryStore) (per
/// algorithm) holds by default before it makes room (see
/// [`KeyedRateLimiterBuilder::max_keys`]): 2²⁰, about a million.
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// The keyed limiter's map, with the cell type its algorithm needs.
enum AnyMap<K> {
    Gcra(ShardedMap<K, GcraCell>),
    Leaky(ShardedMap<K, LeakyCell>),
    Fixed(ShardedMap<K, FixedCell>),
    Sliding(ShardedMap<K, SlidingCell>),
    Log(ShardedMap<K, LogCell>),
}

/// A rate limiter with a separate allowance per key: per client IP, API key, user, route.
///
/// A check on a key already seen takes its own thread's reader lock of a shard, updates the
/// key's state with one compare-and-swap and allocates nothing; the key's state is the only
/// memory it writes that other threads use, so checks on different keys scale with cores.
/// Memory is bounded by [`max_keys`](KeyedRateLimiterBuilder::max_keys): a flood of new keys
/// pushes out keys whose allowance has fully recovered first (forgetting those changes no
/// decision), and only when more keys than that are active at once, the active key closest to
/// recovery. A `u64` key with GCRA costs 19–24 bytes.
///
/// ```
/// use flowgate::{KeyedRateLimiter, Quota};
///
/// let per_ip = KeyedRateLimiter::<std::net::IpAddr>::new(Quota::per_minute(2));
/// let a: std::net::IpAddr = "192.0.2.1".parse().unwrap();
/// let b: std::net::IpAddr = "192.0.2.2".parse().unwrap();
/// assert!(per_ip.check_key(&a).allowed);
/// assert!(per_ip.check_key(&a).allowed);
/// assert!(!per_ip.check_key(&a).allowed);
/// assert!(per_ip.check_key(&b).allowed);
/// ```
pub struct KeyedRateLimiter<K, C: Clock = MonotonicClock> {
    /// What each key is allowed.
    quota: Quota,
    /// Where time comes from.
    clock: C,
    /// The clock's lag as a `Duration`, for the re-check rule in `decide`.
    lag: Duration,
    /// The same lag in nanoseconds, for `try_decide`.
    lag_nanos: Nanos,
    /// Per-key states.
    map: AnyMap<K>,
}

/// Builds a [`KeyedRateLimiter`] with a bound on keys, a shard count or a clock.
#[derive(Debug)]
pub struct KeyedRateLimiterBuilder<K, C = MonotonicClock> {
    quota: Quota,
    clock: C,
    max_keys: usize,
    shards: usize,
    _key: std::marker::PhantomData<fn(K)>,
}

fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cores * 32).next_power_of_two().clamp(64, 1024)
}

impl<K> KeyedRateLimiterBuilder<K, MonotonicClock> {
    /// Uses `clock` instead of the default clock.
    pub fn clock<C: Clock>(self, clock: C) -> KeyedRateLimiterBuilder<K, C> {
        KeyedRateLimiterBuilder {
            quota: self.quota,
            clock,
            max_keys: self.max_keys,
            shards: self.shards,
            _key: std::marker::PhantomData,
        }
    }
}

impl<K: Hash + Eq, C: Clock> KeyedRateLimiterBuilder<K, C> {
    /// The most keys held at once (default [`DEFAULT_MAX_KEYS`]). Keys are spread over shards
    /// and each shard holds `max_keys / shards`.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// How many shards (rounded up to a power of two; default 32 per core, at least 64).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> KeyedRateLimiter<K, C> {
        let (max, shards) = (self.max_keys, self.shards);
        let map = match self.quota.algorithm() {
            Algorithm::Gcra => AnyMap::Gcra(ShardedMap::new(max, shards)),
            Algorithm::LeakyBucket => AnyMap::Leaky(ShardedMap::new(max, shards)),
            Algorithm::FixedWindow => AnyMap::Fixed(ShardedMap::new(max, shards)),
            Algorithm::SlidingWindow => AnyMap::Sliding(ShardedMap::new(max, shards)),
            Algorithm::SlidingLog => AnyMap::Log(ShardedMap::new(max, shards)),
        };
        KeyedRateLimiter {
            lag: lag_of(&self.clock),
            lag_nanos: self.clock.max_lag(),
            quota: self.quota,
            clock: self.clock,
            map,
        }
    }
}

impl<K: Hash + Eq> KeyedRateLimiter<K, MonotonicClock> {
    /// A limiter giving each key `quota`, with the default bound on keys and the default clock.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder, to set the bound on keys, the shards or the clock.
    ///
    /// ```
    /// use flowgate::{clock::ManualClock, KeyedRateLimiter, Quota};
    /// let limiter = KeyedRateLimiter::<u64>::builder(Quota::per_second(10))
    ///     .clock(ManualClock::new(0))
    ///     .max_keys(100_000)
    ///     .build();
    /// assert!(limiter.check_key(&7).allowed);
    /// ```
    pub fn builder(quota: Quota) -> KeyedRateLimiterBuilder<K, MonotonicClock> {
        KeyedRateLimiterBuilder {
            quota,
            clock: MonotonicClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            shards: default_shards(),
            _key: std::marker::PhantomData,
        }
    }
}

/// Applies the transition `f` to `key`'s state in `map`; a key not yet held is judged on a
/// fresh state and stored only if `f` changed that state.
#[inline]
fn update_keyed<K, C, Q, R>(
    map: &ShardedMap<K, C>,
    key: &Q,
    quota: &Quota,
    now: Nanos,
    f: impl Fn(&mut C::State) -> R,
) -> R
where
    K: Hash + Eq + Borrow<Q>,
    C: Cell,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    map.update(
        key,
        now,
        |c| c.idle_at(quota),
        |c| c.update(&f),
        || {
            let mut state = C::State::default();
            let result = f(&mut state);
            let changed = state != C::State::default();
            (result, changed.then(|| C::occupied(state)))
        },
        Q::to_owned,
    )
}

impl<K: Hash + Eq, C: Clock> KeyedRateLimiter<K, C> {
    /// The quota each key gets.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Asks for one unit for `key` on the leanest path: `Ok(())` if granted, otherwise how
    /// long to wait. [`check_key`](Self::check_key) also reports `remaining` and `reset_after`.
    #[inline]
    pub fn try_check_key<Q>(&self, key: &Q) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match &self.map {
            AnyMap::Gcra(m) => try_decide(&self.clock, self.lag_nanos, |now| {
                update_keyed(m, key, &self.quota, now, |s| {
                    s.try_check(&self.quota, 1, now)
                })
            }),
            _ => {
                let decision = self.decide(key, 1);
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

    /// Asks for one unit for `key`.
    #[inline]
    pub fn check_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, 1)
    }

    /// Asks for `cost` units for `key`. `cost == 0` peeks. A cost larger than the burst is an
    /// error.
    #[inline]
    pub fn check_key_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.quota.check_cost(cost)?;
        Ok(self.decide(key, cost))
    }

    /// What a request for `key` would be told now, without taking anything (nor storing the
    /// key).
    pub fn peek_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, 0)
    }

    /// Gives `units` back to `key`.
    pub fn refund_key<Q>(&self, key: &Q, units: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.clock.now();
        let quota = &self.quota;
        per_algorithm!(AnyMap, &self.map, m => {
            m.get(key, |c| c.update(|s| s.refund(quota, units, now)));
        });
    }

    /// Forgets `key`: its next request sees the full quota.
    pub fn reset_key<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        per_algorithm!(AnyMap, &self.map, m => { m.remove(key); });
    }

    /// Drops every key whose allowance has fully recovered (forgetting them changes no
    /// decision) and returns how many. Full shards do this by themselves; call it to return
    /// memory after a burst of keys.
    pub fn forget_idle(&self) -> usize {
        let now = self.clock.now();
        let quota = &self.quota;
        per_algorithm!(AnyMap, &self.map, m => m.sweep(now, |c| c.idle_at(quota)))
    }

    /// Keys held, memory used and evictions of active keys.
    pub fn stats(&self) -> TableStats {
        per_algorithm!(AnyMap, &self.map, m => m.stats())
    }

    /// Keys currently held.
    pub fn len(&self) -> usize {
        self.stats().keys
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies `f` to `key`'s GCRA or leaky-bucket state (inserting the key if `f` changes a
    /// fresh state), for reservations.
    #[cfg(feature = "tokio")]
    pub(super) fn update_bucket_key<Q, R>(
        &self,
        key: &Q,
        f: impl Fn(&mut dyn crate::algorithm::Reserve, Nanos) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now();
        match &self.map {
            AnyMap::Gcra(m) => Some(update_keyed(m, key, &self.quota, now, |s| f(s, now))),
            AnyMap::Leaky(m) => Some(update_keyed(m, key, &self.quota, now, |s| f(s, now))),
            _ => None,
        }
    }

    /// The current time on the limiter's clock.
    #[cfg(feature = "tokio")]
    pub(super) fn now(&self) -> Nanos {
        self.clock.now()
    }

    #[inline]
    fn decide<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let quota = &self.quota;
        per_algorithm!(AnyMap, &self.map, m => {
            decide(&self.clock, self.lag, |now| {
                update_keyed(m, key, quota, now, |s| s.check(quota, cost, now))
            })
        })
    }
}

impl<K, C: Clock> fmt::Debug for KeyedRateLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimiter")
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn limiter(quota: Quota, max_keys: usize) -> (KeyedRateLimiter<u64, ManualClock>, ManualClock) {
        let clock = ManualClock::new(1_000_000_000_000);
        let limiter = KeyedRateLimiter::builder(quota)
            .clock(clock.clone())
            .max_keys(max_keys)
            .build();
        (limiter, clock)
    }

    #[test]
    fn keys_are_independent_for_every_algorithm() {
        for algorithm in Algorithm::ALL {
            let quota = Quota::per_second(3).with_algorithm(algorithm).unwrap();
            let (limiter, _) = limiter(quota, 1000);
            for key in 0..50u64 {
                for _ in 0..2 {
                    assert!(limiter.check_key(&key).allowed, "{algorithm}");
                }
                assert_eq!(limiter.try_check_key(&key), Ok(()), "{algorithm}");
                assert!(!limiter.check_key(&key).allowed, "{algorithm}");
                assert!(limiter.try_check_key(&key).is_err(), "{algorithm}");
            }
            assert_eq!(limiter.len(), 50);
            limiter.reset_key(&7);
            assert!(limiter.check_key(&7).allowed);
            limiter.refund_key(&8, 1);
            assert!(limiter.check_key(&8).allowed);
            assert!(!limiter.check_key(&8).allowed);
        }
    }

    #[test]
    fn peeking_at_an_unknown_key_stores_nothing() {
        let (limiter, _) = limiter(Quota::per_second(3), 1000);
        assert_eq!(limiter.peek_key(&1).remaining, 3);
        assert!(limiter.is_empty());
    }

    #[test]
    fn a_flood_of_new_keys_stays_within_max_keys_and_keeps_active_keys_exact() {
        let (limiter, clock) = limiter(Quota::per_minute(2), 4096);
        // An active key: its allowance is used up.
        for _ in 0..2 {
            assert!(limiter.check_key(&u64::MAX).allowed);
        }
        // A million one-off keys, 10 µs apart: each is idle 30 s after its request.
        for key in 0..1_000_000u64 {
            let _ = limiter.check_key(&key);
            clock.advance(Duration::from_micros(10));
            if key % 100_000 == 0 {
                assert!(limiter.len() <= 4096 + 64, "len {}", limiter.len());
            }
        }
        let stats = limiter.stats();
        assert!(stats.keys <= 4096 + 64, "{stats:?}");
        assert!(stats.bytes < 200_000, "{stats:?}");
        // Over 10 s the flood keys went idle and were dropped first, except where a shard was
        // full of active ones. The exhausted key survived unless evicted, which is counted.
        if stats.evicted_active == 0 {
            assert!(!limiter.check_key(&u64::MAX).allowed);
        }
    }

    #[test]
    fn idle_keys_make_room_before_active_ones_are_evicted() {
        let (limiter, clock) = limiter(Quota::per_second(1), 64);
        for key in 0..64u64 {
            let _ = limiter.check_key(&key);
        }
        clock.advance(Duration::from_secs(2));
        for key in 1000..1064u64 {
            let _ = limiter.check_key(&key);
        }
        assert_eq!(limiter.stats().evicted_active, 0);
        assert_eq!(limiter.forget_idle(), 0);
        clock.advance(Duration::from_secs(2));
        assert_eq!(limiter.forget_idle(), 64);
        assert!(limiter.is_empty());
    }
}
