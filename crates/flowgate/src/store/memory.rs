//! [`MemoryStore`]: the embedded store, kept in this process.

use std::future::{Future, ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Ask, Store, StoreError};
use crate::algorithm::State;
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::decision::Decision;
use crate::local::table::{ShardedMap, TableStats};
use crate::local::{
    Cell, DEFAULT_MAX_KEYS, FixedCell, GcraCell, LeakyCell, LogCell, SlidingCell, decide, lag_of,
};
use crate::quota::{Algorithm, Quota};

/// A cell that also remembers when its state goes idle. Keys in one store carry different
/// quotas, so the time cannot be recomputed from the state alone when making room.
struct Tracked<C> {
    cell: C,
    /// When the state becomes idle; only ever raised (a refund may make the key idle earlier,
    /// and keeping it a little longer is harmless).
    idle_at: AtomicU64,
}

impl<C: Cell> Cell for Tracked<C> {
    type State = C::State;

    fn vacant() -> Self {
        Tracked {
            cell: C::vacant(),
            idle_at: AtomicU64::new(0),
        }
    }
    fn occupied(state: Self::State) -> Self {
        Tracked {
            cell: C::occupied(state),
            idle_at: AtomicU64::new(Nanos::MAX),
        }
    }
    #[inline]
    fn is_occupied(&self) -> bool {
        self.cell.is_occupied()
    }
    #[inline]
    fn update<R>(&self, f: impl FnMut(&mut Self::State) -> R) -> R {
        self.cell.update(f)
    }
    fn load(&self) -> Self::State {
        self.cell.load()
    }
    fn idle_at(&self, _quota: &Quota) -> Nanos {
        self.idle_at.load(Ordering::Relaxed)
    }
}

/// A counter's key in the table: 128 bits of a keyed hash of its name — 16 bytes however long
/// the name (the service's counter names run to 60–100 bytes), with a random seed per store,
/// so no one can steer two names onto one counter. For a million counters the chance that
/// any two share one is about 10⁻²⁷.
type Key = [u64; 2];

/// Hashes counter names into [`Key`]s: two independently seeded 64-bit hashes.
struct KeyHasher(
    foldhash::quality::RandomState,
    foldhash::quality::RandomState,
);

impl KeyHasher {
    fn new() -> Self {
        KeyHasher(Default::default(), Default::default())
    }

    #[inline]
    fn key(&self, name: &str) -> Key {
        use std::hash::BuildHasher;
        [self.0.hash_one(name), self.1.hash_one(name)]
    }
}

type Map<C> = ShardedMap<Key, Tracked<C>>;

/// Applies `f` to `key`'s state in `map`, inserting the key if `f` changed a fresh state, and
/// records when the state goes idle.
fn update<C: Cell, R>(
    map: &Map<C>,
    key: &Key,
    quota: &Quota,
    now: Nanos,
    f: impl Fn(&mut C::State) -> R,
) -> R {
    map.update(
        key,
        now,
        |t| t.idle_at.load(Ordering::Relaxed),
        |t| {
            let (result, idle) = t.cell.update(|s| (f(s), s.idle_at(quota)));
            t.idle_at.fetch_max(idle, Ordering::Relaxed);
            result
        },
        || {
            let mut state = C::State::default();
            let result = f(&mut state);
            if state == C::State::default() {
                return (result, None);
            }
            let idle = state.idle_at(quota);
            let tracked = Tracked::<C>::occupied(state);
            tracked.idle_at.store(idle, Ordering::Relaxed);
            (result, Some(tracked))
        },
        |k: &Key| *k,
    )
}

/// The embedded store: every limit's state in this process's memory.
///
/// Sharded and lock-free like [`KeyedRateLimiter`](crate::local::KeyedRateLimiter): a call on
/// a key that exists allocates nothing, and memory is bounded by `max_keys` per algorithm, with
/// idle keys dropped first. Decisions are exactly those of the Redis store for the same trace.
/// Counter names are kept as 128-bit keyed hashes, so a counter takes the same few dozen bytes
/// however long its name (`benches/memory_per_key.rs`).
#[derive(Debug)]
pub struct MemoryStore<C: Clock = MonotonicClock> {
    clock: C,
    /// Counter names to table keys.
    keys: KeyHasher,
    /// The clock's lag, for re-checking denials on a precise reading.
    lag: Duration,
    maps: Maps,
}

struct Maps {
    gcra: Map<GcraCell>,
    leaky: Map<LeakyCell>,
    fixed: Map<FixedCell>,
    sliding: Map<SlidingCell>,
    log: Map<LogCell>,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher")
    }
}

impl std::fmt::Debug for Maps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maps").finish_non_exhaustive()
    }
}

/// Builds a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryStoreBuilder<C = MonotonicClock> {
    clock: C,
    max_keys: usize,
}

impl MemoryStoreBuilder<MonotonicClock> {
    /// Uses `clock` instead of the default clock.
    pub fn clock<C: Clock>(self, clock: C) -> MemoryStoreBuilder<C> {
        MemoryStoreBuilder {
            clock,
            max_keys: self.max_keys,
        }
    }
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// The most keys held per algorithm (default [`DEFAULT_MAX_KEYS`](crate::DEFAULT_MAX_KEYS)).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore<C> {
        let shards = std::thread::available_parallelism().map_or(4, |n| n.get()) * 32;
        let n = self.max_keys;
        MemoryStore {
            keys: KeyHasher::new(),
            lag: lag_of(&self.clock),
            clock: self.clock,
            maps: Maps {
                gcra: ShardedMap::new(n, shards),
                leaky: ShardedMap::new(n, shards),
                fixed: ShardedMap::new(n, shards),
                sliding: ShardedMap::new(n, shards),
                log: ShardedMap::new(n, shards),
            },
        }
    }
}

impl MemoryStore<MonotonicClock> {
    /// A store with the default bound on keys and the default clock.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder, to set the bound on keys or the clock.
    pub fn builder() -> MemoryStoreBuilder<MonotonicClock> {
        MemoryStoreBuilder {
            clock: MonotonicClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
        }
    }
}

impl Default for MemoryStore<MonotonicClock> {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `$body` with `$m` bound to the map for `$quota`'s algorithm.
macro_rules! with_map {
    ($self:expr, $quota:expr, $m:ident => $body:expr) => {
        match $quota.algorithm() {
            Algorithm::Gcra => {
                let $m = &$self.maps.gcra;
                $body
            }
            Algorithm::LeakyBucket => {
                let $m = &$self.maps.leaky;
                $body
            }
            Algorithm::FixedWindow => {
                let $m = &$self.maps.fixed;
                $body
            }
            Algorithm::SlidingWindow => {
                let $m = &$self.maps.sliding;
                $body
            }
            Algorithm::SlidingLog => {
                let $m = &$self.maps.log;
                $body
            }
        }
    };
}

impl<C: Clock> MemoryStore<C> {
    /// Decides `ask` right now. [`Store::check`] and [`Store::check_now`] call this.
    #[inline]
    pub(crate) fn answer(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
        if ask.charge {
            return Ok(self.charge(ask));
        }
        let Ask {
            key, quota, cost, ..
        } = ask;
        quota.check_cost(cost)?;
        let key = self.keys.key(key);
        Ok(with_map!(self, quota, m => {
            decide(&self.clock, self.lag, |now| {
                update(m, &key, quota, now, |s| s.check(quota, cost, now))
            })
        }))
    }

    /// Takes a charge ([`Ask::charge`]), at a precise reading of the clock. Apart from the
    /// check so that the check's hot path stays as small as it was (a charge is rare: once per
    /// response at most).
    #[cold]
    #[inline(never)]
    fn charge(&self, ask: Ask<'_>) -> Decision {
        let (quota, cost, now) = (ask.quota, ask.cost, self.clock.now());
        let key = self.keys.key(ask.key);
        with_map!(self, quota, m => {
            update(m, &key, quota, now, |s| s.charge(quota, cost, now))
        })
    }

    /// Gives back `ask.cost` units, synchronously.
    fn give_back(&self, ask: Ask<'_>) {
        let (quota, units) = (ask.quota, ask.cost);
        let now = self.clock.now();
        let key = self.keys.key(ask.key);
        with_map!(self, quota, m => {
            m.get(&key, |t| t.cell.update(|s| s.refund(quota, units, now)));
        });
    }

    /// Forgets `ask.key` for its quota's algorithm, synchronously.
    pub(crate) fn forget(&self, ask: Ask<'_>) {
        let key = self.keys.key(ask.key);
        with_map!(self, ask.quota, m => {
            m.remove(&key);
        });
    }

    /// Drops every idle key now; returns how many.
    pub fn forget_idle(&self) -> usize {
        fn sweep<C: Cell>(map: &Map<C>, now: Nanos) -> usize {
            map.sweep(now, |t| t.idle_at.load(Ordering::Relaxed))
        }
        let (m, now) = (&self.maps, self.clock.now());
        sweep(&m.gcra, now)
            + sweep(&m.leaky, now)
            + sweep(&m.fixed, now)
            + sweep(&m.sliding, now)
            + sweep(&m.log, now)
    }

    /// Keys held and memory used, summed over algorithms.
    pub fn stats(&self) -> TableStats {
        let m = &self.maps;
        [
            m.gcra.stats(),
            m.leaky.stats(),
            m.fixed.stats(),
            m.sliding.stats(),
            m.log.stats(),
        ]
        .into_iter()
        .fold(TableStats::default(), |a, b| TableStats {
            keys: a.keys + b.keys,
            slots: a.slots + b.slots,
            bytes: a.bytes + b.bytes,
            evicted_active: a.evicted_active + b.evicted_active,
        })
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn check(&self, ask: Ask<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        ready(self.answer(ask))
    }

    #[inline]
    fn check_now(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
        Some(self.answer(ask))
    }

    fn refund(&self, ask: Ask<'_>) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.give_back(ask);
        ready(Ok(()))
    }

    #[inline]
    fn refund_now(&self, ask: Ask<'_>) -> Option<Result<(), StoreError>> {
        self.give_back(ask);
        Some(Ok(()))
    }

    fn reset(&self, ask: Ask<'_>) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget(ask);
        ready(Ok(()))
    }

    /// The memory store is never away: every fail mode is trivially honoured.
    fn applies_fail_modes(&self) -> bool {
        true
    }
}
