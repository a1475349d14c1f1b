//! A sharded, bounded hash map of cells: the storage behind keyed limiters and the memory store.
//!
//! Each shard is an open-addressing table (linear probing, backward-shift deletion, no
//! tombstones) behind a read-write lock. A check on a key that exists takes the shard's read
//! lock, probes, and updates the key's [`Cell`] atomically: threads checking different keys, or
//! the same key, never wait for each other, and nothing is allocated. Only inserting a new key
//! takes the write lock.
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
//! Memory is bounded: each shard holds at most `max_keys / shards` keys. To make room, a full
//! shard first drops every idle key — one whose state has returned to that of a key never
//! seen, so forgetting it changes no decision. Only if no key is idle (more than `max_keys`
//! keys are active at once) does it evict the key among a few sampled ones that is closest to
//! idle; that key's next request is judged as if it were new. Those evictions are counted.

#![allow(unsafe_code)]

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

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
struct Shard<K, V: Cell>(RwLock<Table<K, V>>);

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
        // Small maps get fewer shards, so the per-shard bound does not round `max_keys` up much.
        let shards = shards
            .min((max_keys / 64).max(1).next_power_of_two())
            .next_power_of_two();
        let keys_per_shard = max_keys.div_ceil(shards);
        let max_capacity = keys_per_shard * 100 / MAX_LOAD_PERCENT + 2;
        ShardedMap {
            shards: (0..shards)
                .map(|_| {
                    Shard(RwLock::new(Table::with_capacity(
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
    fn shard(&self, hash: u64) -> &RwLock<Table<K, V>> {
        &self.shards[hash as usize & self.mask].0
    }

    /// Applies `existing` to the key's cell under the shard's read lock. If the key is absent,
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
            .map(|shard| shard.0.write().sweep(now, &idle_at, &hash_of))
            .sum()
    }

    /// Size and eviction counts.
    pub(crate) fn stats(&self) -> TableStats {
        let mut stats = TableStats {
            evicted_active: self.evicted_active.load(Ordering::Relaxed),
            ..TableStats::default()
        };
        for shard in self.shards.iter() {
            let table = shard.0.read();
            stats.keys += table.len;
            stats.slots += table.capacity();
        }
        stats.bytes = stats.slots * std::mem::size_of::<Slot<K, V>>();
        stats
    }

    /// Makes room for one more key in a shard: grow if allowed, otherwise drop idle keys,
    /// otherwise evict the sampled key closest to idle.
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
                if now >= table.next_sweep {
                    table.sweep(now, idle_at, &hash_of);
                }
                if !fits(table) {
                    let grown = (table.capacity() * GROWTH_PERCENT / 100)
                        .max(table.capacity() + 4)
                        .min(self.max_capacity);
                    table.resize(grown, &hash_of);
                }
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
