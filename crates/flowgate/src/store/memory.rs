//! [`MemoryStore`]: the embedded store, kept in this process.

use std::future::{Future, ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::list::{self, KeyPage, ListError, ListKeys};
use super::names::Names;
use super::{Ask, BoxFuture, Store, StoreError};
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

std::thread_local! {
    /// Set when [`update`] inserts a key on this thread: the names directory reads (and
    /// clears) it after a check, so that a check on a key that exists passes nothing more to
    /// the table than it did without the directory. A flag left set by another store on this
    /// thread only makes a later check record a name again, which is harmless.
    static INSERTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Applies `f` to `key`'s state in `map`, inserting the key if `f` changed a fresh state, and
/// records when the state goes idle (and, in [`INSERTED`], that a key was inserted).
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
        |k: &Key| {
            INSERTED.set(true);
            *k
        },
    )
}

/// The embedded store: every limit's state in this process's memory.
///
/// Sharded and lock-free like [`KeyedRateLimiter`](crate::local::KeyedRateLimiter): a call on
/// a key that exists allocates nothing, and memory is bounded by `max_keys` per algorithm, with
/// idle keys dropped first. Decisions are exactly those of the Redis store for the same trace.
/// Counter names are kept as 128-bit keyed hashes, so a counter takes the same few dozen bytes
/// however long its name (`benches/memory_per_key.rs`); to list them
/// ([`ListKeys`]), turn on the names directory ([`MemoryStoreBuilder::list_keys`]).
#[derive(Debug)]
pub struct MemoryStore<C: Clock = MonotonicClock> {
    clock: C,
    /// Counter names to table keys.
    keys: KeyHasher,
    /// The names of the keys, when listing is on.
    names: Option<Names>,
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
    list_keys: bool,
}

impl MemoryStoreBuilder<MonotonicClock> {
    /// Uses `clock` instead of the default clock.
    pub fn clock<C: Clock>(self, clock: C) -> MemoryStoreBuilder<C> {
        MemoryStoreBuilder {
            clock,
            max_keys: self.max_keys,
            list_keys: self.list_keys,
        }
    }
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// The most keys held per algorithm (default [`DEFAULT_MAX_KEYS`](crate::DEFAULT_MAX_KEYS)).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Keeps the names of counters, so that they can be listed ([`ListKeys`]; default off):
    /// a name is recorded when its key is first inserted — a check on a key that exists does
    /// no more than without — and the directory holds at most as many names as one
    /// algorithm's table holds keys (see [`ListKeys`] for what a listing guarantees).
    pub fn list_keys(mut self, on: bool) -> Self {
        self.list_keys = on;
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore<C> {
        let shards = std::thread::available_parallelism().map_or(4, |n| n.get()) * 32;
        let n = self.max_keys;
        let gcra = ShardedMap::new(n, shards);
        MemoryStore {
            names: self.list_keys.then(|| Names::new(gcra.max_keys())),
            keys: KeyHasher::new(),
            lag: lag_of(&self.clock),
            clock: self.clock,
            maps: Maps {
                gcra,
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
            list_keys: false,
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
        let name = key;
        let key = self.keys.key(name);
        let decision = with_map!(self, quota, m => {
            decide(&self.clock, self.lag, |now| {
                update(m, &key, quota, now, |s| s.check(quota, cost, now))
            })
        });
        if let Some(names) = &self.names {
            names.inserted(name, quota);
        }
        Ok(decision)
    }

    /// Takes a charge ([`Ask::charge`]), at a precise reading of the clock. Apart from the
    /// check so that the check's hot path stays as small as it was (a charge is rare: once per
    /// response at most).
    #[cold]
    #[inline(never)]
    fn charge(&self, ask: Ask<'_>) -> Decision {
        let (quota, cost, now) = (ask.quota, ask.cost, self.clock.now());
        let key = self.keys.key(ask.key);
        let decision = with_map!(self, quota, m => {
            update(m, &key, quota, now, |s| s.charge(quota, cost, now))
        });
        if let Some(names) = &self.names {
            names.inserted(ask.key, quota);
        }
        decision
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
        if let Some(names) = &self.names {
            names.forget(ask.key, ask.quota.algorithm().index());
        }
    }

    /// The algorithms among `algorithms` (a bit per [`Algorithm::index`]) whose table holds `name`.
    fn held(&self, name: &str, algorithms: u8) -> u8 {
        let key = self.keys.key(name);
        let m = &self.maps;
        let present = |i: usize| match i {
            0 => m.gcra.contains(&key),
            1 => m.leaky.contains(&key),
            2 => m.fixed.contains(&key),
            3 => m.sliding.contains(&key),
            _ => m.log.contains(&key),
        };
        (0..5)
            .filter(|&i| algorithms & (1 << i) != 0 && present(i))
            .fold(0, |held, i| held | (1 << i))
    }

    /// Drops the names of keys that are gone (swept, evicted), and notes whether the
    /// directory names every key again.
    fn prune_names(&self) {
        if let Some(names) = &self.names {
            names.prune(list::MAX_PAGE, self.stats().keys, |name, algorithms| {
                self.held(name, algorithms)
            });
        }
    }

    /// The page of names of [`ListKeys::list_keys`], synchronously.
    fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<KeyPage, ListError> {
        let Some(names) = &self.names else {
            return Err(ListError::Unsupported(
                "the memory store keeps no names unless built with list_keys(true)",
            ));
        };
        let after = match cursor {
            None => {
                // A listing from the start prunes a directory that had to drop names first,
                // so that it may say it is complete again.
                if names.missing() {
                    self.prune_names();
                }
                None
            }
            Some(cursor) => Some(
                list::unhex(cursor)
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .ok_or(ListError::Cursor)?,
            ),
        };
        let (candidates, done) = names.page(prefix, after.as_deref(), list::clamp(limit));
        let mut keys = Vec::with_capacity(candidates.len());
        let mut stale = Vec::new();
        for (name, algorithms, recorded) in &candidates {
            let held = self.held(name, *algorithms);
            if held != 0 {
                keys.push(name.clone());
            }
            if held != *algorithms {
                stale.push((name.clone(), algorithms & !held, *recorded));
            }
        }
        names.drop_stale(&stale);
        let next = match candidates.last() {
            Some((last, _, _)) if !done => Some(list::hex(last.as_bytes())),
            _ => None,
        };
        Ok(KeyPage {
            keys,
            next,
            complete: !names.missing(),
        })
    }

    /// Drops every idle key now; returns how many.
    pub fn forget_idle(&self) -> usize {
        fn sweep<C: Cell>(map: &Map<C>, now: Nanos) -> usize {
            map.sweep(now, |t| t.idle_at.load(Ordering::Relaxed))
        }
        let (m, now) = (&self.maps, self.clock.now());
        let swept = sweep(&m.gcra, now)
            + sweep(&m.leaky, now)
            + sweep(&m.fixed, now)
            + sweep(&m.sliding, now)
            + sweep(&m.log, now);
        if swept > 0 {
            self.prune_names();
        }
        swept
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

impl Names {
    /// Records `name` (of `quota`'s algorithm) if the check just made inserted its key.
    #[inline]
    fn inserted(&self, name: &str, quota: &Quota) {
        if INSERTED.replace(false) {
            self.record(name, quota.algorithm().index());
        }
    }
}

/// Lists the names of the counters, with the names directory on
/// ([`MemoryStoreBuilder::list_keys`]); [`ListError::Unsupported`] otherwise. Names come in
/// order, each once; the cursor is the last name returned (hex-encoded); a name whose key
/// was swept or evicted is dropped from the directory when a page meets it. A page does at
/// most `limit` lookups — but the first page of a directory that had to drop names first
/// prunes the whole directory (bounded by `max_keys`), so that `complete` can be true again.
impl<C: Clock> ListKeys for MemoryStore<C> {
    fn list_keys<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<KeyPage, ListError>> {
        Box::pin(ready(self.list_page(prefix, cursor, limit)))
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
