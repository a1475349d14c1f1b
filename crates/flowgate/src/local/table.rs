//! A sharded, bounded hash map of cells: the storage behind keyed limiters and the memory store.
//!
//! Each shard is an open-addressing table (linear probing, backward-shift deletion, no
//! tombstones) behind a reader-writer lock with one reader lock per thread
//! ([`crossbeam_utils::sync::ShardedLock`]). A check on a key that exists takes the read side of
//! its own thread's lock — a cache line no other thread writes while there are at most eight
//! threads (see below) — probes, and updates the key's [`Cell`] atomically: threads checking
//! different keys, or the same key, never wait for each other, the only cache line shared
//! between them that a check writes is the key's own state, and nothing is allocated. A plain
//! reader-writer lock per shard (what this used to be) makes every check write the shard's lock
//! word, so with keys spread over all shards two cores keep taking each other's lock lines.
//!
//! Only inserting a new key, removal, sweeps, growth and eviction take the write side, which
//! takes every thread's read lock in turn: a writer runs with no reader inside its shard, so it
//! may move slots (growth, backward-shift deletion) and drop keys freely — no reader can be
//! comparing a key that is being moved or freed, nor compare-and-swap a cell that is being
//! copied elsewhere (the update would be lost). `tests/loom.rs` checks this protocol in a model
//! of the table; the unit tests below check the table against `std::collections::HashMap` and
//! run under Miri.
//!
//! `ShardedLock` has eight reader locks; a thread uses the one of its index (threads are
//! numbered from 0, and a finished thread's number is reused). With more than eight threads
//! checking at once, threads `i` and `i + 8` share a reader lock again and write its cache line
//! in turn — the old contention, between two threads instead of all of them.
//!
//! Slots hold the key and the cell side by side (16 bytes for a `u64` key and a GCRA cell), the
//! table's capacity is not a power of two (a key's home slot is `hash × capacity >> 64`), and
//! the load factor stays between 0.68 and 0.85, so a map of `u64` keys uses 19–24 bytes per
//! key (`benches/memory_per_key.rs` measures 19.3 at a million keys; governor's map: 35.7).
//!
//! The one `unsafe` in the crate is here: a vacant slot's key is `MaybeUninit` rather than an
//! `Option<K>`, because the option's tag would grow a `u64` slot from 16 to 24 bytes (≈ 29
//! bytes per key instead of ≈ 19). The invariant — a slot's key is initialised exactly when its
//! cell is occupied, and both change only through `&mut Table` — is stated where it is used.
//!
//! Memory is bounded: each shard holds at most `max_keys / shards` keys, and grows towards that
//! bound as keys arrive. A shard at its bound makes room by first dropping every idle key — one
//! whose state has returned to that of a key never seen, so forgetting it changes no decision.
//! Only if no key is idle (more than `max_keys` keys are active at once) does it evict the key
//! among a few sampled ones that is closest to idle; that key's next request is judged as if it
//! were new. Those evictions are counted. A shard below its bound grows rather than sweeping:
//! sweeping whenever a shard outgrew its slots dropped keys that went idle between two of their
//! requests (a client asking once a second under a limit of 100 per second is idle in between),
//! so their next request inserted them again under the write lock — with a million such keys
//! nearly every check was an insert. [`ShardedMap::sweep`] (`forget_idle`) returns the memory of
//! idle keys on demand.

#![allow(unsafe_code)]

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::PoisonError;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};

use super::cell::Cell;
use crate::clock::Nanos;

/// Most keys a shard holds before it grows: 85 % of its slots.
const MAX_LOAD_PERCENT: usize = 85;
/// How much a shard grows at a time: 25 %, so a grown table is still ≥ 68 % full.
const GROWTH_PERCENT: usize = 125;
/// Slots in a new shard.
const INITIAL_CAPACITY: usize = 8;
/// How many slots a full shard samples when it has to evict a key that is not idle.
const EVICTION_SAMPLE: usize = 8;
/// A map has no more shards than `max_keys / KEYS_PER_SHARD_AT_LEAST`: a shard's ~1 KiB of
/// reader locks is then at most ~2 bytes per key.
const KEYS_PER_SHARD_AT_LEAST: usize = 512;

/// One slot: a key and its cell. `key` is initialised exactly when `cell.is_occupied()`.
struct Slot<K, V> {
    key: MaybeUninit<K>,
    cell: V,
}

/// One shard's open-addressing table.
struct Table<K, V: Cell> {
    slots: Box<[Slot<K, V>]>,
    /// Occupied slots.
    len: usize,
    /// The earliest time at which some key in this table may be idle; a sweep before then
    /// would find nothing.
    next_sweep: Nanos,
}

/// The home slot of `hash` in a table of `capacity` slots (Lemire's multiply-shift range map:
/// uses the hash's high bits; the shard index uses its low bits).
#[inline]
fn home(hash: u64, capacity: usize) -> usize {
    ((u128::from(hash) * capacity as u128) >> 64) as usize
}

impl<K, V: Cell> Table<K, V> {
    fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(2);
        Table {
            slots: (0..capacity)
                .map(|_| Slot {
                    key: MaybeUninit::uninit(),
                    cell: V::vacant(),
                })
                .collect(),
            len: 0,
            next_sweep: Nanos::MAX,
        }
    }

    #[inline]
    fn capacity(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    fn key(&self, index: usize) -> &K {
        debug_assert!(self.slots[index].cell.is_occupied());
        // SAFETY: the key of an occupied slot is initialised (the struct's invariant), and it
        // is only moved or dropped through `&mut self`.
        unsafe { self.slots[index].key.assume_init_ref() }
    }

    /// The slot holding `key`, if any. Terminates because at least one slot is always vacant.
    #[inline]
    fn find<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let capacity = self.capacity();
        let mut i = home(hash, capacity);
        loop {
            if !self.slots[i].cell.is_occupied() {
                return None;
            }
            if self.key(i).borrow() == key {
                return Some(i);
            }
            i += 1;
            if i == capacity {
                i = 0;
            }
        }
    }

    /// Puts a key known to be absent into the first vacant slot from its home.
    fn insert_new(&mut self, hash: u64, key: K, cell: V) -> usize {
        debug_assert!(self.len + 1 < self.capacity());
        let capacity = self.capacity();
        let mut i = home(hash, capacity);
        while self.slots[i].cell.is_occupied() {
            i += 1;
            if i == capacity {
                i = 0;
            }
        }
        self.slots[i] = Slot {
            key: MaybeUninit::new(key),
            cell,
        };
        self.len += 1;
        i
    }

    /// Empties slot `index` and shifts the rest of its probe run back, so lookups never need
    /// tombstones.
    fn remove(&mut self, index: usize, hash_of: &impl Fn(&K) -> u64) {
        let capacity = self.capacity();
        let slot = std::mem::replace(
            &mut self.slots[index],
            Slot {
                key: MaybeUninit::uninit(),
                cell: V::vacant(),
            },
        );
        debug_assert!(slot.cell.is_occupied());
        // SAFETY: the slot was occupied, so its key was initialised; it has been moved out of
        // the table, which now marks the slot vacant.
        drop(unsafe { slot.key.assume_init() });
        self.len -= 1;
        let mut hole = index;
        let mut j = index;
        loop {
            j = if j + 1 == capacity { 0 } else { j + 1 };
            if !self.slots[j].cell.is_occupied() {
                return;
            }
            let h = home(hash_of(self.key(j)), capacity);
            // The entry at `j` may move back to `hole` unless its home lies cyclically in
            // (hole, j] — then moving it would put it before its home.
            let stays = if hole <= j {
                hole < h && h <= j
            } else {
                hole < h || h <= j
            };
            if !stays {
                // Moves the occupied slot into the hole and leaves the vacant one at `j`.
                self.slots.swap(hole, j);
                hole = j;
            }
        }
    }

    /// Drops every key whose cell is idle at `now`; returns how many were dropped and records
    /// when the next one may become idle.
    fn sweep(
        &mut self,
        now: Nanos,
        idle_at: &impl Fn(&V) -> Nanos,
        hash_of: &impl Fn(&K) -> u64,
    ) -> usize {
        let before = self.len;
        let mut next = Nanos::MAX;
        let mut i = 0;
        while i < self.capacity() {
            if self.slots[i].cell.is_occupied() {
                let idle = idle_at(&self.slots[i].cell);
                if idle <= now {
                    // `remove` may shift a later entry into `i`: look at `i` again.
                    self.remove(i, hash_of);
                    continue;
                }
                next = next.min(idle);
            }
            i += 1;
        }
        self.next_sweep = next;
        before - self.len
    }

    /// Moves every entry into a table of `capacity` slots.
    fn resize(&mut self, capacity: usize, hash_of: &impl Fn(&K) -> u64) {
        let mut bigger = Table::with_capacity(capacity);
        bigger.next_sweep = self.next_sweep;
        for slot in std::mem::take(&mut self.slots).into_vec() {
            if slot.cell.is_occupied() {
                // SAFETY: occupied slots hold initialised keys; this one was moved out of the
                // old table, which is discarded without dropping keys again (`self.slots` now
                // holds an empty slice, and `Slot` itself never drops its key).
                let key = unsafe { slot.key.assume_init() };
                bigger.insert_new(hash_of(&key), key, slot.cell);
            }
        }
        *self = bigger;
    }
}

impl<K, V: Cell> Drop for Table<K, V> {
    fn drop(&mut self) {
        for slot in self.slots.iter_mut() {
            if slot.cell.is_occupied() {
                // SAFETY: occupied slots hold initialised keys, dropped exactly once here.
                unsafe { slot.key.assume_init_drop() };
            }
        }
    }
}

/// A shard, padded to its own cache lines so two shards' locks never share one.
#[repr(align(128))]
struct Shard<K, V: Cell>(ShardedLock<Table<K, V>>);

impl<K, V: Cell> Shard<K, V> {
    #[inline]
    fn read(&self) -> ShardedLockReadGuard<'_, Table<K, V>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> ShardedLockWriteGuard<'_, Table<K, V>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How full a keyed limiter or memory store is, and how often it had to evict active keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TableStats {
    /// Keys currently held.
    pub keys: usize,
    /// Slots allocated (each holds a key and its state).
    pub slots: usize,
    /// Bytes allocated for the slots.
    pub bytes: usize,
    /// Keys evicted while still active because more than `max_keys` keys were active at once.
    pub evicted_active: u64,
}

/// The sharded, bounded map. See the module docs.
pub(crate) struct ShardedMap<K, V: Cell> {
    shards: Box<[Shard<K, V>]>,
    hasher: foldhash::quality::RandomState,
    /// `shards.len() - 1`; the shard of a key is `hash & mask`.
    mask: usize,
    /// Most keys one shard holds.
    keys_per_shard: usize,
    /// Slots a shard never grows beyond.
    max_capacity: usize,
    evicted_active: AtomicU64,
}

impl<K: Hash + Eq, V: Cell> ShardedMap<K, V> {
    /// A map holding at most about `max_keys` keys in `shards` shards (a power of two).
    pub(crate) fn new(max_keys: usize, shards: usize) -> Self {
        let max_keys = max_keys.max(1);
        // Small maps get fewer shards: a shard's reader locks take ~1 KiB (eight cache-padded
        // locks) whatever it holds, and the per-shard bound should not round `max_keys` up much.
        // Readers never contend, whatever the shard count; only writers (new keys) do.
        let shards = shards
            .min(
                (max_keys / KEYS_PER_SHARD_AT_LEAST)
                    .max(1)
                    .next_power_of_two(),
            )
            .next_power_of_two();
        let keys_per_shard = max_keys.div_ceil(shards);
        let max_capacity = keys_per_shard * 100 / MAX_LOAD_PERCENT + 2;
        ShardedMap {
            shards: (0..shards)
                .map(|_| {
                    Shard(ShardedLock::new(Table::with_capacity(
                        INITIAL_CAPACITY.min(max_capacity),
                    )))
                })
                .collect(),
            hasher: foldhash::quality::RandomState::default(),
            mask: shards - 1,
            keys_per_shard,
            max_capacity,
            evicted_active: AtomicU64::new(0),
        }
    }

    #[inline]
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K, V> {
        &self.shards[hash as usize & self.mask]
    }

    /// Applies `existing` to the key's cell under the shard's read side (this thread's reader
    /// lock). If the key is absent,
    /// `absent` decides instead and may return a cell to insert (`None` when the decision left
    /// the state as it was for a new key, e.g. a peek: nothing is stored).
    ///
    /// If another thread inserts the key between the two, `existing` is applied to that cell and
    /// `absent`'s result is discarded, so both closures must be free of side effects.
    /// `to_owned` makes the key to store from the borrowed one.
    #[inline]
    pub(crate) fn update<Q, R>(
        &self,
        key: &Q,
        now: Nanos,
        idle_at: impl Fn(&V) -> Nanos,
        mut existing: impl FnMut(&V) -> R,
        absent: impl FnOnce() -> (R, Option<V>),
        to_owned: impl FnOnce(&Q) -> K,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        {
            let table = shard.read();
            if let Some(i) = table.find(hash, key) {
                return existing(&table.slots[i].cell);
            }
        }
        let (result, cell) = absent();
        let Some(cell) = cell else {
            return result;
        };
        let mut table = shard.write();
        if let Some(i) = table.find(hash, key) {
            return existing(&table.slots[i].cell);
        }
        let idle = idle_at(&cell);
        self.make_room(&mut table, hash, now, &idle_at);
        table.insert_new(hash, to_owned(key), cell);
        table.next_sweep = table.next_sweep.min(idle);
        result
    }

    /// Applies `f` to the key's cell if the key is present.
    pub(crate) fn get<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let table = self.shard(hash).read();
        table.find(hash, key).map(|i| f(&table.slots[i].cell))
    }

    /// Whether the key is present.
    pub(crate) fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key, |_| ()).is_some()
    }

    /// The most keys the map holds (`max_keys` rounded up to whole shards).
    pub(crate) fn max_keys(&self) -> usize {
        self.keys_per_shard * self.shards.len()
    }

    /// Forgets a key. Returns whether it was present.
    pub(crate) fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let mut table = self.shard(hash).write();
        match table.find(hash, key) {
            Some(i) => {
                table.remove(i, &|k: &K| self.hash(k));
                true
            }
            None => false,
        }
    }

    /// Drops every idle key now (full shards also do this by themselves when they need room).
    pub(crate) fn sweep(&self, now: Nanos, idle_at: impl Fn(&V) -> Nanos) -> usize {
        let hash_of = |k: &K| self.hash(k);
        self.shards
            .iter()
            .map(|shard| shard.write().sweep(now, &idle_at, &hash_of))
            .sum()
    }

    /// Size and eviction counts.
    pub(crate) fn stats(&self) -> TableStats {
        let mut stats = TableStats {
            evicted_active: self.evicted_active.load(Ordering::Relaxed),
            ..TableStats::default()
        };
        for shard in self.shards.iter() {
            let table = shard.read();
            stats.keys += table.len;
            stats.slots += table.capacity();
        }
        stats.bytes = stats.slots * std::mem::size_of::<Slot<K, V>>();
        stats
    }

    /// Makes room for one more key in a shard: grow while below the shard's bound; at the
    /// bound, drop idle keys, or else evict the sampled key closest to idle.
    fn make_room(
        &self,
        table: &mut Table<K, V>,
        hash: u64,
        now: Nanos,
        idle_at: &impl Fn(&V) -> Nanos,
    ) {
        let hash_of = |k: &K| self.hash(k);
        let fits = |t: &Table<K, V>| (t.len + 1) * 100 <= t.capacity() * MAX_LOAD_PERCENT;
        if table.len < self.keys_per_shard {
            if !fits(table) {
                let grown = (table.capacity() * GROWTH_PERCENT / 100)
                    .max(table.capacity() + 4)
                    .min(self.max_capacity);
                table.resize(grown, &hash_of);
            }
            // Guard against rounding: there must always be a vacant slot after inserting.
            if table.len + 2 > table.capacity() {
                let grown = table.capacity() + 2;
                table.resize(grown, &hash_of);
            }
            return;
        }
        if now >= table.next_sweep && table.sweep(now, idle_at, &hash_of) > 0 {
            return;
        }
        // Every key is active: evict the one closest to idle among a few from a
        // pseudo-random place (the new key's home).
        let capacity = table.capacity();
        let mut i = home(hash, capacity);
        let mut victim = None;
        let mut seen = 0;
        while seen < EVICTION_SAMPLE {
            if table.slots[i].cell.is_occupied() {
                let idle = idle_at(&table.slots[i].cell);
                if victim.is_none_or(|(_, best)| idle < best) {
                    victim = Some((i, idle));
                }
                seen += 1;
            }
            i = if i + 1 == capacity { 0 } else { i + 1 };
        }
        if let Some((i, _)) = victim {
            table.remove(i, &hash_of);
            self.evicted_active.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
impl<K: Hash + Eq + Clone, V: Cell> ShardedMap<K, V> {
    /// Every key and its state, after checking each shard's invariants: `len` counts the
    /// occupied slots, a vacant slot remains, and every key is found from its home slot (no
    /// probe run is broken by a removal or a move).
    fn entries(&self) -> Vec<(K, V::State)> {
        let mut entries = Vec::new();
        for shard in self.shards.iter() {
            let table = shard.read();
            let occupied: Vec<usize> = (0..table.capacity())
                .filter(|&i| table.slots[i].cell.is_occupied())
                .collect();
            assert_eq!(occupied.len(), table.len);
            assert!(table.len < table.capacity(), "no vacant slot left");
            assert!(table.len <= self.keys_per_shard);
            for i in occupied {
                let key = table.key(i);
                let hash = self.hash(key);
                assert!(
                    std::ptr::eq(self.shard(hash), shard),
                    "key in the wrong shard"
                );
                assert_eq!(
                    table.find(hash, key),
                    Some(i),
                    "key not found from its home"
                );
                entries.push((key.clone(), table.slots[i].cell.load()));
            }
        }
        entries
    }

    /// The shard index of `key`.
    fn shard_of(&self, key: &K) -> usize {
        self.hash(key) as usize & self.mask
    }
}

#[cfg(test)]
mod tests {
    //! The table against `std::collections::HashMap` (a model-based property test), and threads
    //! updating cells while another inserts, grows, removes and sweeps. All of it also runs under
    //! Miri (`cargo +nightly miri test -p flowgate --lib local::table`) with fewer cases.
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::Gcra;
    use crate::local::GcraCell;

    /// A key is idle once its time stamp is not after `now` (as a GCRA state is).
    fn idle_at(cell: &GcraCell) -> Nanos {
        cell.load().tat
    }

    /// Adds `delta` to the key's stamp, inserting it at `now + delta` if absent (nothing is
    /// stored when `delta` is 0, as for a peek). Returns the stamp after the update.
    fn add(map: &ShardedMap<u64, GcraCell>, key: u64, delta: u64, now: Nanos) -> u64 {
        map.update(
            &key,
            now,
            idle_at,
            |c| {
                c.update(|s| {
                    s.tat += delta;
                    s.tat
                })
            },
            || {
                let tat = now + delta;
                (tat, (delta > 0).then(|| GcraCell::occupied(Gcra { tat })))
            },
            |k| *k,
        )
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Update or insert one key.
        Add(u64, u64),
        /// Insert (or update) a run of keys: makes shards grow, or reach their bound.
        Fill(u64, u8),
        Get(u64),
        Remove(u64),
        /// Let time pass.
        Advance(u64),
        /// Drop every idle key.
        Sweep,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..300u64, 0..4u64).prop_map(|(k, d)| Op::Add(k, d)),
            1 => (0..2000u64, 1..=255u8).prop_map(|(k, n)| Op::Fill(k, n)),
            2 => (0..300u64).prop_map(Op::Get),
            2 => (0..300u64).prop_map(Op::Remove),
            1 => (0..6u64).prop_map(Op::Advance),
            1 => Just(Op::Sweep),
        ]
    }

    /// The state the map must be in, and how many active keys it has evicted.
    struct Model {
        keys: HashMap<u64, u64>,
        evicted: u64,
    }

    impl Model {
        /// Applies `add` to the map and the model. A key inserted into a shard at its bound
        /// may drop keys of that shard: all its idle ones, or else exactly one active one
        /// (counted as evicted); the model follows whichever the map did, after checking it
        /// was one of those two.
        fn add(&mut self, map: &ShardedMap<u64, GcraCell>, key: u64, delta: u64, now: Nanos) {
            let got = add(map, key, delta, now);
            let expected = match self.keys.get_mut(&key) {
                Some(tat) => {
                    *tat += delta;
                    *tat
                }
                None => now + delta,
            };
            assert_eq!(got, expected, "add({key}, {delta})");
            if delta == 0 || self.keys.contains_key(&key) {
                return;
            }
            self.keys.insert(key, expected);
            if map.stats().keys == self.keys.len() {
                // Nothing was dropped (the full comparison after each step checks the rest).
                return;
            }
            let present: HashMap<u64, u64> =
                map.entries().into_iter().map(|(k, s)| (k, s.tat)).collect();
            let dropped: Vec<u64> = self
                .keys
                .keys()
                .copied()
                .filter(|k| !present.contains_key(k))
                .collect();
            let shard = map.shard_of(&key);
            assert!(!dropped.contains(&key), "the new key was dropped");
            assert!(
                dropped.iter().all(|k| map.shard_of(k) == shard),
                "{dropped:?}"
            );
            if !dropped.is_empty() {
                let idle_in_shard: Vec<u64> = self
                    .keys
                    .iter()
                    .filter(|&(k, &tat)| *k != key && map.shard_of(k) == shard && tat <= now)
                    .map(|(k, _)| *k)
                    .collect();
                if idle_in_shard.is_empty() {
                    assert_eq!(dropped.len(), 1, "evicted more than one active key");
                    self.evicted += 1;
                } else {
                    let mut dropped = dropped.clone();
                    let mut idle = idle_in_shard;
                    dropped.sort_unstable();
                    idle.sort_unstable();
                    assert_eq!(dropped, idle, "a sweep drops exactly the idle keys");
                }
            }
            for k in dropped {
                self.keys.remove(&k);
            }
        }
    }

    /// Runs `ops` on a map of at most `max_keys` keys in `shards` shards and on the model,
    /// comparing them after every step.
    fn run(max_keys: usize, shards: usize, ops: &[Op]) {
        let map = ShardedMap::<u64, GcraCell>::new(max_keys, shards);
        let mut model = Model {
            keys: HashMap::new(),
            evicted: 0,
        };
        let mut now: Nanos = 100;
        for op in ops {
            match *op {
                Op::Add(k, d) => model.add(&map, k, d, now),
                Op::Fill(start, n) => {
                    for k in start..start + u64::from(n) {
                        model.add(&map, k, 1, now);
                    }
                }
                Op::Get(k) => {
                    assert_eq!(map.get(&k, |c| c.load().tat), model.keys.get(&k).copied());
                }
                Op::Remove(k) => assert_eq!(map.remove(&k), model.keys.remove(&k).is_some()),
                Op::Advance(dt) => now += dt,
                Op::Sweep => {
                    let before = model.keys.len();
                    model.keys.retain(|_, &mut tat| tat > now);
                    assert_eq!(map.sweep(now, idle_at), before - model.keys.len());
                }
            }
            let mut entries: Vec<(u64, u64)> =
                map.entries().into_iter().map(|(k, s)| (k, s.tat)).collect();
            entries.sort_unstable();
            let mut expected: Vec<(u64, u64)> = model.keys.iter().map(|(&k, &t)| (k, t)).collect();
            expected.sort_unstable();
            assert_eq!(entries, expected, "after {op:?}");
            let stats = map.stats();
            assert_eq!(stats.keys, model.keys.len());
            assert_eq!(stats.evicted_active, model.evicted);
        }
    }

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: if cfg!(miri) { 3 } else { 256 },
            // Miri runs without file system access; elsewhere failures are kept in
            // `proptest-regressions/` as usual.
            failure_persistence: if cfg!(miri) {
                None
            } else {
                ProptestConfig::default().failure_persistence
            },
            ..ProptestConfig::default()
        }
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(op(), 1..if cfg!(miri) { 12 } else { 120 })
    }

    proptest! {
        #![proptest_config(config())]

        /// One shard with room for 16 keys: the bound is reached all the time, so sweeps
        /// and evictions of active keys are exercised.
        #[test]
        fn one_small_shard_matches_a_hash_map(ops in ops()) {
            run(16, 64, &ops);
        }

        /// Two shards of 512 keys: growth from 8 slots to the bound, then eviction.
        #[test]
        fn two_shards_match_a_hash_map(ops in ops()) {
            run(1024, 4, &ops);
        }

        /// Room for every key: growth and backward-shift deletion without eviction.
        #[test]
        fn a_map_that_never_fills_matches_a_hash_map(ops in ops()) {
            run(100_000, 2, &ops);
        }
    }

    #[test]
    fn small_maps_get_fewer_shards() {
        let shards = |max_keys, shards| {
            ShardedMap::<u64, GcraCell>::new(max_keys, shards)
                .shards
                .len()
        };
        assert_eq!(shards(16, 64), 1);
        assert_eq!(shards(1024, 4), 2);
        assert_eq!(shards(2000, 64), 4);
        assert_eq!(shards(1 << 20, 64), 64);
    }

    #[test]
    fn growth_keeps_every_key_and_stays_within_24_bytes_per_key() {
        let n = if cfg!(miri) { 300 } else { 20_000 };
        let map = ShardedMap::<u64, GcraCell>::new(2 * n as usize, 8);
        for k in 0..n {
            add(&map, k, 1, 0);
        }
        let stats = map.stats();
        assert_eq!(stats.keys, n as usize);
        assert!(stats.bytes <= 24 * n as usize + 8 * 64, "{stats:?}");
        for k in 0..n {
            assert_eq!(map.get(&k, |c| c.load().tat), Some(1));
        }
        assert_eq!(map.entries().len(), n as usize);
    }

    #[test]
    fn a_shard_below_its_bound_grows_instead_of_dropping_idle_keys() {
        let map = ShardedMap::<u64, GcraCell>::new(1000, 1);
        for k in 0..500 {
            add(&map, k, 1, 0);
        }
        // Every key is idle at t = 10, but the shard holds fewer than 1000: nothing is dropped.
        for k in 500..900 {
            add(&map, k, 1, 10);
        }
        assert_eq!(map.stats().keys, 900);
        assert_eq!(map.sweep(10, idle_at), 500);
    }

    #[test]
    fn string_keys_are_dropped_once_when_removed_swept_evicted_or_with_the_map() {
        // Under Miri this also checks that no key is leaked, dropped twice or read after free.
        let map = ShardedMap::<Box<str>, GcraCell>::new(8, 1);
        let put = |k: &str, tat: u64, now: u64| {
            map.update(
                k,
                now,
                idle_at,
                |c| c.update(|s| s.tat = tat),
                || ((), Some(GcraCell::occupied(Gcra { tat }))),
                |k: &str| Box::from(k),
            );
        };
        for i in 0..8 {
            put(&format!("key-{i}"), 5 + i, 0);
        }
        assert!(map.remove("key-3"));
        assert_eq!(map.sweep(6, idle_at), 2);
        for i in 20..40 {
            put(&format!("key-{i}"), 100, 50);
        }
        assert!(map.stats().evicted_active > 0);
        assert_eq!(map.get("key-39", |c| c.load().tat), Some(100));
    }

    /// Threads update keys that exist while another thread inserts keys (growing the shards),
    /// removes some (shifting others back) and sweeps: no update is lost, which it would be if
    /// an update landed in a slot that a writer was moving. Under Miri this also checks the
    /// readers and the writer for data races.
    #[test]
    fn updates_are_not_lost_while_a_writer_inserts_grows_removes_and_sweeps() {
        let (hot, updates, inserts) = if cfg!(miri) {
            (4u64, 30u64, 60u64)
        } else {
            (64, 20_000, 200_000)
        };
        let map = ShardedMap::<u64, GcraCell>::new(1 << 20, 4);
        // Hot keys: stamps far in the future, so no sweep drops them.
        for k in 0..hot {
            add(&map, k, 1 << 40, 0);
        }
        std::thread::scope(|scope| {
            for t in 0..2u64 {
                let map = &map;
                scope.spawn(move || {
                    for i in 0..updates {
                        add(map, (i + t) % hot, 1, 0);
                    }
                });
            }
            let map = &map;
            scope.spawn(move || {
                for k in 0..inserts {
                    // Cold keys, idle from t = 2 on.
                    add(map, 1_000_000 + k, 2, 0);
                    if k % 3 == 0 {
                        map.remove(&(1_000_000 + k / 2));
                    }
                    if k % 1000 == 999 {
                        map.sweep(1, idle_at);
                    }
                }
                map.sweep(2, idle_at);
            });
        });
        let total: u64 = (0..hot)
            .map(|k| map.get(&k, |c| c.load().tat).unwrap() - (1 << 40))
            .sum();
        assert_eq!(total, 2 * updates);
        assert_eq!(map.stats().keys, hot as usize);
        assert_eq!(map.entries().len(), hot as usize);
    }
}
