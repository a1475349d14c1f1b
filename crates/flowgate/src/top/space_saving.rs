//! One shard of [`TopKeys`](super::TopKeys): the Space-Saving algorithm (Metwally, Agrawal
//! and El Abbadi, "Efficient Computation of Frequent and Top-k Elements in Data Streams",
//! 2005) over a fixed number of counters, all allocated when the table is made.
//!
//! * `entries`: one slot per counter: the key's hash (its identity), count, error bound and
//!   the first [`MAX_KEY_LEN`] bytes of its name (for display).
//! * `heap`: entry numbers ordered as a binary min-heap on count, so the smallest counter —
//!   the one Space-Saving replaces — is at the root; each entry knows its heap position.
//! * `index`: an open-addressing table (linear probing, backward-shift deletion) from hash to
//!   entry number, twice the counters in size, so probes stay short.
//!
//! Recording a key that has a counter adds its weight and moves the counter down the heap
//! (O(log k)); a new key takes a free counter, or replaces the smallest with count
//! `min + weight` and error `min`. Nothing is allocated after construction.

use crate::top::MAX_KEY_LEN;

/// An empty index slot.
const EMPTY: u32 = u32::MAX;

/// One counter.
#[derive(Clone)]
pub(super) struct Entry {
    /// The key's 64-bit keyed hash: what identifies it.
    pub(super) hash: u64,
    /// Its count: at least its true count, at most `error` more.
    pub(super) count: u64,
    /// How much of `count` may belong to keys it replaced.
    pub(super) error: u64,
    /// Bytes of `name` in use.
    pub(super) len: u8,
    /// Whether the key was longer than `name`.
    pub(super) truncated: bool,
    /// The key's first bytes.
    pub(super) name: [u8; MAX_KEY_LEN],
    /// Its position in the heap.
    heap_pos: u32,
}

impl Entry {
    const EMPTY: Entry = Entry {
        hash: 0,
        count: 0,
        error: 0,
        len: 0,
        truncated: false,
        name: [0; MAX_KEY_LEN],
        heap_pos: 0,
    };

    fn set_name(&mut self, key: &[u8]) {
        let len = key.len().min(MAX_KEY_LEN);
        self.name[..len].copy_from_slice(&key[..len]);
        self.len = len as u8;
        self.truncated = key.len() > MAX_KEY_LEN;
    }
}

/// A Space-Saving summary with a fixed number of counters.
pub(super) struct Table {
    entries: Box<[Entry]>,
    /// Entry numbers; `heap[..used]` is a min-heap on count.
    heap: Box<[u32]>,
    /// Counters in use.
    used: usize,
    /// Hash → entry number, or [`EMPTY`]; the length is a power of two.
    index: Box<[u32]>,
    /// Sum of the weights recorded.
    pub(super) total: u64,
}

impl Table {
    /// A table of `counters` counters (at least 1).
    pub(super) fn new(counters: usize) -> Self {
        let counters = counters.clamp(1, (u32::MAX / 4) as usize);
        Table {
            entries: vec![Entry::EMPTY; counters].into_boxed_slice(),
            heap: (0..counters as u32).collect(),
            used: 0,
            index: vec![EMPTY; (2 * counters).next_power_of_two()].into_boxed_slice(),
            total: 0,
        }
    }

    /// Bytes the table holds (all of them allocated by [`new`](Self::new)).
    pub(super) fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.entries)
            + std::mem::size_of_val(&*self.heap)
            + std::mem::size_of_val(&*self.index)
    }

    /// Counters in all.
    pub(super) fn entries_capacity(&self) -> usize {
        self.entries.len()
    }

    /// The counters in use.
    pub(super) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.heap[..self.used]
            .iter()
            .map(|&e| &self.entries[e as usize])
    }

    /// The smallest count, when every counter is in use (the most any key without a counter
    /// can have had); 0 otherwise.
    pub(super) fn floor(&self) -> u64 {
        if self.used == self.entries.len() {
            self.entries[self.heap[0] as usize].count
        } else {
            0
        }
    }

    /// Forgets everything.
    pub(super) fn clear(&mut self) {
        self.index.fill(EMPTY);
        self.used = 0;
        self.total = 0;
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        (hash as usize) & (self.index.len() - 1)
    }

    /// The index slot holding `hash`, or the empty slot where it would go.
    #[inline]
    fn probe(&self, hash: u64) -> (usize, Option<u32>) {
        let mask = self.index.len() - 1;
        let mut i = self.home(hash);
        loop {
            let e = self.index[i];
            if e == EMPTY {
                return (i, None);
            }
            if self.entries[e as usize].hash == hash {
                return (i, Some(e));
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes the index slot `i` (backward-shift deletion: no tombstones).
    fn unindex(&mut self, mut i: usize) {
        let mask = self.index.len() - 1;
        loop {
            self.index[i] = EMPTY;
            let mut j = i;
            loop {
                j = (j + 1) & mask;
                let e = self.index[j];
                if e == EMPTY {
                    return;
                }
                let home = self.home(self.entries[e as usize].hash);
                // Move `e` back to `i` unless its home lies cyclically in (i, j].
                let stays = if i <= j {
                    i < home && home <= j
                } else {
                    i < home || home <= j
                };
                if !stays {
                    self.index[i] = e;
                    i = j;
                    break;
                }
            }
        }
    }

    /// Adds `weight` to the key with hash `hash` (named `key`).
    #[inline]
    pub(super) fn record(&mut self, hash: u64, key: &[u8], weight: u64) {
        self.total = self.total.saturating_add(weight);
        let (slot, found) = self.probe(hash);
        let e = match found {
            Some(e) => e,
            None if self.used < self.entries.len() => {
                let e = self.heap[self.used];
                let entry = &mut self.entries[e as usize];
                entry.hash = hash;
                entry.count = 0;
                entry.error = entry.count;
                entry.heap_pos = self.used as u32;
                entry.set_name(key);
                self.used += 1;
                self.index[slot] = e;
                // A new counter of 0 is the smallest: its place is the root's subtree
                // bottom; moving it up keeps the heap, and the weight below moves it down.
                self.sift_up(self.used - 1);
                e
            }
            None => {
                // Replace the smallest counter: its count becomes the new key's error.
                let e = self.heap[0];
                let old = self.entries[e as usize].hash;
                let (old_slot, _) = self.probe(old);
                self.unindex(old_slot);
                let (slot, _) = self.probe(hash);
                self.index[slot] = e;
                let entry = &mut self.entries[e as usize];
                entry.hash = hash;
                entry.error = entry.count;
                entry.set_name(key);
                e
            }
        };
        let entry = &mut self.entries[e as usize];
        entry.count = entry.count.saturating_add(weight);
        let pos = entry.heap_pos as usize;
        self.sift_down(pos);
    }

    fn count_at(&self, pos: usize) -> u64 {
        self.entries[self.heap[pos] as usize].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.entries[self.heap[a] as usize].heap_pos = a as u32;
        self.entries[self.heap[b] as usize].heap_pos = b as u32;
    }

    fn sift_up(&mut self, mut pos: usize) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.count_at(parent) <= self.count_at(pos) {
                break;
            }
            self.swap(parent, pos);
            pos = parent;
        }
    }

    fn sift_down(&mut self, mut pos: usize) {
        loop {
            let (left, right) = (2 * pos + 1, 2 * pos + 2);
            let mut smallest = pos;
            if left < self.used && self.count_at(left) < self.count_at(smallest) {
                smallest = left;
            }
            if right < self.used && self.count_at(right) < self.count_at(smallest) {
                smallest = right;
            }
            if smallest == pos {
                return;
            }
            self.swap(pos, smallest);
            pos = smallest;
        }
    }

    /// Checks the structure's invariants (tests).
    #[cfg(test)]
    pub(super) fn check(&self) {
        for pos in 1..self.used {
            assert!(
                self.count_at((pos - 1) / 2) <= self.count_at(pos),
                "heap order"
            );
        }
        for (pos, &e) in self.heap[..self.used].iter().enumerate() {
            let entry = &self.entries[e as usize];
            assert_eq!(entry.heap_pos as usize, pos);
            assert_eq!(self.probe(entry.hash).1, Some(e), "indexed");
        }
        let indexed = self.index.iter().filter(|&&e| e != EMPTY).count();
        assert_eq!(indexed, self.used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_smallest_counter_and_keeps_its_invariants() {
        let mut t = Table::new(3);
        for (hash, n) in [(10u64, 5u64), (11, 2), (12, 7)] {
            t.record(hash, b"k", n);
            t.check();
        }
        assert_eq!(t.floor(), 2);
        // A fourth key replaces 11 (count 2): count 2 + 1, error 2.
        t.record(13, b"new", 1);
        t.check();
        let e = t.entries().find(|e| e.hash == 13).unwrap();
        assert_eq!((e.count, e.error), (3, 2));
        assert!(t.entries().all(|e| e.hash != 11));
        assert_eq!(t.total, 15);
        // Hashes that collide in the index (same low bits) probe and delete correctly.
        let mut t = Table::new(4);
        let size = 8u64;
        for round in 0..50u64 {
            t.record(round * size + 3, b"x", 1 + round % 3);
            t.check();
        }
        t.clear();
        assert_eq!((t.entries().count(), t.total, t.floor()), (0, 0, 0));
    }

    #[test]
    fn long_names_are_truncated_for_display_only() {
        let mut t = Table::new(2);
        let long = [b'a'; MAX_KEY_LEN + 10];
        t.record(1, &long, 1);
        t.record(2, &long[..MAX_KEY_LEN + 5], 1);
        let names: Vec<(usize, bool)> =
            t.entries().map(|e| (e.len as usize, e.truncated)).collect();
        assert_eq!(names, [(MAX_KEY_LEN, true), (MAX_KEY_LEN, true)]);
        assert_eq!(t.entries().count(), 2, "distinct keys, distinct counters");
    }
}
