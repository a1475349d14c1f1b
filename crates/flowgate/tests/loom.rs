//! Model checking with loom.
//!
//! * The lock-free GCRA cell: every interleaving of the compare-and-swap loop (the very
//!   function `WordCell` uses, run on loom's atomics) grants exactly what a sequential run
//!   would, and loses no update.
//! * The keyed table's protocol (`src/local/table.rs`), in a model: readers update cells in
//!   place under their own thread's reader lock while a writer, holding every reader lock,
//!   inserts, grows the table or removes a key (moving slots back): no update is lost, no reader
//!   touches a slot while a writer moves it, and two threads inserting the same key store it
//!   once. A reader that skipped its lock is caught (the model has teeth).
#![allow(clippy::unwrap_used)]

use flowgate::Quota;
use flowgate::clock::Nanos;
use flowgate::local::__private::{MODEL_GCRA_FRESH, model_gcra_check};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

const NOW: Nanos = 1_700_006_400_000_000_000;
const MARK: u64 = MODEL_GCRA_FRESH;

fn acquire(word: &AtomicU64, quota: &Quota, cost: u64, now: Nanos) -> bool {
    model_gcra_check(
        word.load(Ordering::Acquire),
        |current, next| {
            word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
                .map(drop)
        },
        quota,
        cost,
        now,
    )
    .allowed
}

#[test]
fn three_threads_never_get_more_than_the_burst_and_lose_no_update() {
    // Bounding preemptions keeps the exploration to seconds; loom's documentation notes that
    // most concurrency bugs need only two or three preemptions to show.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let quota = Quota::per_hour(1).with_burst(2).unwrap();
        let word = Arc::new(AtomicU64::new(MARK));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let word = word.clone();
                thread::spawn(move || acquire(&word, &quota, 1, NOW))
            })
            .collect();
        let granted = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&g| g)
            .count() as u64;
        assert_eq!(granted, 2);
        let tat = word.load(Ordering::Acquire) & !MARK;
        assert_eq!(
            tat,
            NOW + granted * (quota.emission_interval().as_nanos() as u64)
        );
    });
}

#[test]
fn weighted_costs_at_different_times_match_a_sequential_order() {
    loom::model(|| {
        // 1 unit per second, burst 3: `a` takes 2 at t0, `b` takes 2 at t0 + 1 s. In that order
        // both fit; the other way round `a` finds 3 s of debt and is denied.
        let quota = Quota::per_second(1).with_burst(3).unwrap();
        let word = Arc::new(AtomicU64::new(MARK));
        let a = {
            let word = word.clone();
            thread::spawn(move || acquire(&word, &quota, 2, NOW))
        };
        let b = {
            let word = word.clone();
            thread::spawn(move || acquire(&word, &quota, 2, NOW + 1_000_000_000))
        };
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let tat = word.load(Ordering::Acquire) & !MARK;
        // Whatever the order, the result is one of the sequential outcomes.
        let second = 1_000_000_000;
        let a_then_b = (true, true, NOW + 4 * second); // b at +1 s: debt 1 s + 2 s = 3 s ≤ τ
        let b_then_a = (false, true, NOW + 3 * second); // a at t0 sees 3 s of debt ahead
        assert!(
            (a, b, tat) == a_then_b || (a, b, tat) == b_then_a,
            "a={a} b={b} tat={tat}"
        );
    });
}

/// A miniature of `ShardedMap`'s shard: the same reader-writer protocol and the same table
/// operations (linear probing, growth by moving every slot, backward-shift deletion), on loom's
/// primitives. Keys are `u64`s and a cell counts the updates it received.
#[allow(unsafe_code)] // loom's `UnsafeCell` hands out raw pointers; see the SAFETY notes
mod table_model {
    use loom::cell::UnsafeCell;
    use loom::sync::RwLock;
    use loom::sync::atomic::{AtomicU64, Ordering};

    /// The occupancy mark of a cell, as in `WordCell`: a vacant cell holds 0.
    const OCCUPIED: u64 = 1 << 63;

    struct Slot {
        /// Plain data, like the table's `MaybeUninit<K>`: loom reports any access to it that
        /// is not ordered with a writer's move.
        key: u64,
        /// `OCCUPIED | count`, updated by readers with compare-and-swap.
        cell: AtomicU64,
    }

    fn vacant() -> Slot {
        Slot {
            key: 0,
            cell: AtomicU64::new(0),
        }
    }

    pub(crate) struct Table {
        /// One reader lock per reading thread: `ShardedLock`'s per-thread reader locks. A
        /// reader takes its own; a writer takes all of them, in order.
        readers: Vec<RwLock<()>>,
        /// The slots, replaced wholesale when the table grows.
        slots: UnsafeCell<Vec<Slot>>,
        /// `false` models a broken reader that skips its lock.
        locked_reads: bool,
    }

    /// The slot holding `key`, probing from its home (`key % capacity`) to a vacant slot.
    fn find(slots: &[Slot], key: u64) -> Option<usize> {
        let mut i = key as usize % slots.len();
        loop {
            if slots[i].cell.load(Ordering::Relaxed) & OCCUPIED == 0 {
                return None;
            }
            if slots[i].key == key {
                return Some(i);
            }
            i = (i + 1) % slots.len();
        }
    }

    /// The reader's update: the compare-and-swap loop of `cas_update` on the cell.
    fn increment(cell: &AtomicU64) {
        let mut current = cell.load(Ordering::Acquire);
        loop {
            match cell.compare_exchange(current, current + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    fn insert_new(slots: &mut [Slot], key: u64, count: u64) {
        let mut i = key as usize % slots.len();
        while slots[i].cell.load(Ordering::Relaxed) & OCCUPIED != 0 {
            i = (i + 1) % slots.len();
        }
        slots[i] = Slot {
            key,
            cell: AtomicU64::new(OCCUPIED | count),
        };
    }

    impl Table {
        /// A table of `capacity` slots holding `keys` (count 0 each), read by `readers` threads.
        pub(crate) fn new(capacity: usize, keys: &[u64], readers: usize, locked: bool) -> Self {
            let mut slots: Vec<Slot> = (0..capacity).map(|_| vacant()).collect();
            for &key in keys {
                insert_new(&mut slots, key, 0);
            }
            Table {
                readers: (0..readers).map(|_| RwLock::new(())).collect(),
                slots: UnsafeCell::new(slots),
                locked_reads: locked,
            }
        }

        /// `ShardedMap::update`: under this thread's reader lock, find the key and update its
        /// cell; if absent, take the write side, look again, and insert it (growing the table
        /// when no more than one slot would be left vacant).
        pub(crate) fn add(&self, reader: usize, key: u64) {
            {
                let _read = self
                    .locked_reads
                    .then(|| self.readers[reader].read().unwrap());
                // SAFETY: shared access under a reader lock; writers hold every reader lock,
                // so none runs now (in the broken model loom reports the race instead).
                let done = self.slots.with(|slots| {
                    let slots = unsafe { &*slots };
                    find(slots, key).map(|i| increment(&slots[i].cell))
                });
                if done.is_some() {
                    return;
                }
            }
            self.write(|slots| match find(slots, key) {
                Some(i) => increment(&slots[i].cell),
                None => {
                    let len = slots
                        .iter()
                        .filter(|s| s.cell.load(Ordering::Relaxed) & OCCUPIED != 0)
                        .count();
                    if len + 2 > slots.len() {
                        grow(slots);
                    }
                    insert_new(slots, key, 1);
                }
            });
        }

        /// `Table::remove`: empties the key's slot and shifts the rest of its probe run back.
        pub(crate) fn remove(&self, key: u64) -> bool {
            self.write(|slots| {
                let Some(index) = find(slots, key) else {
                    return false;
                };
                let capacity = slots.len();
                slots[index] = vacant();
                let (mut hole, mut j) = (index, index);
                loop {
                    j = (j + 1) % capacity;
                    if slots[j].cell.load(Ordering::Relaxed) & OCCUPIED == 0 {
                        return true;
                    }
                    let h = slots[j].key as usize % capacity;
                    let stays = if hole <= j {
                        hole < h && h <= j
                    } else {
                        hole < h || h <= j
                    };
                    if !stays {
                        slots.swap(hole, j);
                        hole = j;
                    }
                }
            })
        }

        /// Grows the table by moving every slot into a bigger one, as `Table::resize` does.
        pub(crate) fn grow(&self) {
            self.write(grow);
        }

        /// Runs `f` on the slots with every reader lock held (`ShardedLock::write`).
        fn write<R>(&self, f: impl FnOnce(&mut Vec<Slot>) -> R) -> R {
            let _write: Vec<_> = self.readers.iter().map(|l| l.write().unwrap()).collect();
            // SAFETY: every reader lock is held, so no reader holds a reference into the
            // slots, and writers exclude each other through the same locks.
            self.slots.with_mut(|slots| f(unsafe { &mut *slots }))
        }

        /// The count of `key` (`None` if absent), once the threads are done.
        pub(crate) fn count(&self, key: u64) -> Option<u64> {
            self.write(|slots| {
                find(slots, key).map(|i| slots[i].cell.load(Ordering::Relaxed) & !OCCUPIED)
            })
        }

        /// How many slots hold `key` (exactly one, or none).
        pub(crate) fn copies(&self, key: u64) -> usize {
            self.write(|slots| {
                slots
                    .iter()
                    .filter(|s| s.cell.load(Ordering::Relaxed) & OCCUPIED != 0 && s.key == key)
                    .count()
            })
        }
    }

    fn grow(slots: &mut Vec<Slot>) {
        let mut bigger: Vec<Slot> = (0..slots.len() + 2).map(|_| vacant()).collect();
        for slot in slots.drain(..) {
            let cell = slot.cell.load(Ordering::Relaxed);
            if cell & OCCUPIED != 0 {
                insert_new(&mut bigger, slot.key, cell & !OCCUPIED);
            }
        }
        *slots = bigger;
    }
}

fn table_model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(preemptions);
    model.check(f);
}

#[test]
fn table_updates_are_not_lost_while_a_writer_grows_the_table() {
    table_model(3, || {
        // Capacity 4 holding 1 and 2: inserting 3 needs a bigger table, so the writer moves
        // every slot while the readers update key 1.
        let table = Arc::new(table_model::Table::new(4, &[1, 2], 2, true));
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let table = table.clone();
                thread::spawn(move || table.add(r, 1))
            })
            .collect();
        table.grow();
        table.add(0, 3);
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(table.count(1), Some(2));
        assert_eq!(table.count(2), Some(0));
        assert_eq!(table.count(3), Some(1));
    });
}

#[test]
fn table_updates_are_not_lost_while_a_writer_removes_a_key_and_shifts_the_next_back() {
    table_model(3, || {
        // 5 and 9 share home slot 1 of 4: 9 sits in slot 2 and moves back to 1 when 5 goes.
        let table = Arc::new(table_model::Table::new(4, &[5, 9], 1, true));
        let reader = {
            let table = table.clone();
            thread::spawn(move || table.add(0, 9))
        };
        assert!(table.remove(5));
        reader.join().unwrap();
        assert_eq!(table.count(9), Some(1));
        assert_eq!(table.count(5), None);
    });
}

#[test]
fn table_inserts_a_key_two_threads_add_at_once_only_once() {
    table_model(3, || {
        let table = Arc::new(table_model::Table::new(4, &[], 2, true));
        let other = {
            let table = table.clone();
            thread::spawn(move || table.add(1, 7))
        };
        table.add(0, 7);
        other.join().unwrap();
        assert_eq!(table.count(7), Some(2));
        assert_eq!(table.copies(7), 1);
    });
}

/// The same model with a reader that does not take its lock: loom must find the interleaving
/// in which the reader touches slots while the writer moves them.
#[test]
#[should_panic(expected = "Causality violation")]
fn table_model_catches_a_reader_that_skips_its_lock() {
    table_model(2, || {
        let table = Arc::new(table_model::Table::new(4, &[1, 2], 1, false));
        let reader = {
            let table = table.clone();
            thread::spawn(move || table.add(0, 1))
        };
        table.grow();
        reader.join().unwrap();
        assert_eq!(table.count(1), Some(1));
    });
}
