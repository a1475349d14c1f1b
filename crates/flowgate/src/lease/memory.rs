//! [`MemoryLeases`]: leases held in this process.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::time::Duration;

use parking_lot::Mutex;

use super::{Acquired, LeaseId, Leases, Terms};
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::store::{BoxFuture, StoreError};

/// Locks the keys are spread over.
const SHARDS: usize = 64;

/// The default bound on keys holding leases ([`MemoryLeases::max_keys`]).
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// One key's leases: each id with its expiry. At most the key's limit long.
type Held = Vec<(LeaseId, Nanos)>;

/// The keys behind one lock, each with its leases.
type Shard = Mutex<HashMap<Box<str>, Held>>;

/// Leases in this process's memory: exact under any number of threads (each key's leases
/// change under one lock), on an injected [`Clock`]. Memory is bounded: at most
/// [`max_keys`](Self::max_keys) keys hold leases at once (a key whose leases all expired or
/// were released is dropped), each at most its limit; a new key beyond the bound is refused
/// with [`StoreError::Unavailable`] until others free up.
pub struct MemoryLeases<C: Clock = MonotonicClock> {
    clock: C,
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
    max_per_shard: usize,
}

impl<C: Clock> std::fmt::Debug for MemoryLeases<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: usize = self.shards.iter().map(|s| s.lock().len()).sum();
        f.debug_struct("MemoryLeases")
            .field("keys", &keys)
            .finish_non_exhaustive()
    }
}

impl MemoryLeases {
    /// Leases on the default clock.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::default())
    }
}

impl Default for MemoryLeases {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryLeases<C> {
    /// Leases on `clock`.
    pub fn with_clock(clock: C) -> Self {
        MemoryLeases {
            clock,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            max_per_shard: DEFAULT_MAX_KEYS.div_ceil(SHARDS),
        }
    }

    /// The same leases keeping at most about `max_keys` keys (rounded up to a multiple of 64:
    /// each of the 64 locks keeps its share).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_per_shard = max_keys.div_ceil(SHARDS).max(1);
        self
    }

    fn shard(&self, key: &str) -> &Shard {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    fn acquire_now(&self, key: &str, terms: &Terms) -> Result<Acquired, StoreError> {
        let now = self.clock.now();
        let mut shard = self.shard(key).lock();
        // A new key is copied into the table (an existing one allocates nothing), if there is
        // room once the keys whose leases all ended are dropped.
        if !shard.contains_key(key) {
            if shard.len() >= self.max_per_shard {
                shard.retain(|_, held| {
                    held.retain(|&(_, expiry)| expiry > now);
                    !held.is_empty()
                });
                if shard.len() >= self.max_per_shard {
                    return Err(StoreError::Unavailable(
                        "the lease table is full (max_keys)".into(),
                    ));
                }
            }
            shard.insert(key.into(), Held::new());
        }
        let Some(held) = shard.get_mut(key) else {
            unreachable!("inserted above");
        };
        held.retain(|&(_, expiry)| expiry > now);
        let count = held.len() as u64;
        if count < terms.limit() {
            let id = LeaseId::random();
            held.push((id, now + nanos(terms.ttl())));
            return Ok(Acquired::Granted {
                id,
                expires_in: terms.ttl(),
                held: count + 1,
            });
        }
        let earliest = held.iter().map(|&(_, e)| e).min().unwrap_or(now);
        Ok(Acquired::Full {
            held: count,
            retry_after: Duration::from_nanos(earliest - now),
        })
    }

    /// Runs `f` on `key`'s live leases (expired ones dropped first), dropping the key when
    /// none are left.
    fn with_held<R>(&self, key: &str, f: impl FnOnce(&mut Held, Nanos) -> R, none: R) -> R {
        let now = self.clock.now();
        let mut shard = self.shard(key).lock();
        let Some(held) = shard.get_mut(key) else {
            return none;
        };
        held.retain(|&(_, expiry)| expiry > now);
        let result = f(held, now);
        if held.is_empty() {
            shard.remove(key);
        }
        result
    }
}

/// A duration in nanoseconds (a lease lasts at most a day: no overflow).
fn nanos(d: Duration) -> Nanos {
    d.as_nanos() as Nanos
}

impl<C: Clock> Leases for MemoryLeases<C> {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        terms: &'a Terms,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        let answer = self.acquire_now(key, terms);
        Box::pin(std::future::ready(answer))
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        id: LeaseId,
        terms: &'a Terms,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let renewed = self.with_held(
            key,
            |held, now| match held.iter_mut().find(|(held_id, _)| *held_id == id) {
                Some((_, expiry)) => {
                    *expiry = now + nanos(terms.ttl());
                    true
                }
                None => false,
            },
            false,
        );
        Box::pin(std::future::ready(Ok(renewed)))
    }

    fn release<'a>(&'a self, key: &'a str, id: LeaseId) -> BoxFuture<'a, Result<bool, StoreError>> {
        let released = self.with_held(
            key,
            |held, _| {
                let before = held.len();
                held.retain(|(held_id, _)| *held_id != id);
                held.len() < before
            },
            false,
        );
        Box::pin(std::future::ready(Ok(released)))
    }

    fn held<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let count = self.with_held(key, |held, _| held.len() as u64, 0);
        Box::pin(std::future::ready(Ok(count)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn now_or_never<T>(f: BoxFuture<'_, T>) -> T {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = f;
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => unreachable!("memory leases answer at once"),
        }
    }

    #[test]
    fn the_table_is_bounded_and_frees_keys_whose_leases_ended() {
        let clock = ManualClock::new(0);
        let leases = MemoryLeases::with_clock(clock.clone()).max_keys(1);
        let terms = Terms::new(1, Duration::from_secs(1)).unwrap();
        // One key per shard: fill shards until one refuses a new key.
        let mut refused = None;
        for i in 0..1000 {
            let key = format!("k{i}");
            if now_or_never(leases.acquire(&key, &terms)).is_err() {
                refused = Some(key);
                break;
            }
        }
        let refused = refused.expect("some shard fills up");
        clock.advance(Duration::from_secs(1));
        assert!(matches!(
            now_or_never(leases.acquire(&refused, &terms)),
            Ok(Acquired::Granted { held: 1, .. })
        ));
    }

    #[test]
    fn renew_extends_only_a_live_lease() {
        let clock = ManualClock::new(0);
        let leases = MemoryLeases::with_clock(clock.clone());
        let terms = Terms::new(1, Duration::from_secs(10)).unwrap();
        let Ok(Acquired::Granted { id, .. }) = now_or_never(leases.acquire("k", &terms)) else {
            panic!("granted");
        };
        clock.advance(Duration::from_secs(9));
        assert_eq!(now_or_never(leases.renew("k", id, &terms)), Ok(true));
        clock.advance(Duration::from_secs(9));
        assert_eq!(now_or_never(leases.held("k")), Ok(1));
        clock.advance(Duration::from_secs(1));
        assert_eq!(now_or_never(leases.held("k")), Ok(0));
        assert_eq!(now_or_never(leases.renew("k", id, &terms)), Ok(false));
        assert_eq!(now_or_never(leases.release("k", id)), Ok(false));
    }
}
