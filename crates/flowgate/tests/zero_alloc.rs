//! Proof that a check allocates nothing once its key exists: a counting global allocator
//! counts the allocations made by this thread while checks run.
#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use flowgate::clock::ManualClock;
use flowgate::local::{KeyedRateLimiter, RateLimiter};
use flowgate::store::MemoryStore;
use flowgate::{Algorithm, Quota};

/// Counts allocations of the current thread while `COUNTING` is set.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

#[allow(unsafe_code)]
// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// How many allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get)
}

const START: u64 = 1_700_006_400_000_000_000;

fn quota(algorithm: Algorithm) -> Quota {
    Quota::per_second(50)
        .unwrap()
        .with_algorithm(algorithm)
        .unwrap()
}

#[test]
fn the_counter_counts() {
    assert_eq!(allocations(|| drop(vec![1u8; 16])), 1);
}

#[test]
fn direct_checks_allocate_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(START);
        let limiter = RateLimiter::with_clock(quota(algorithm), clock.clone());
        // Warm up: let the sliding log grow its buffer to its steady size.
        for _ in 0..200 {
            limiter.check();
            clock.advance(std::time::Duration::from_millis(7));
        }
        let n = allocations(|| {
            for _ in 0..10_000 {
                std::hint::black_box(limiter.check());
                clock.advance(std::time::Duration::from_millis(7));
            }
        });
        assert_eq!(n, 0, "{algorithm}");
    }
}

#[test]
fn keyed_checks_on_existing_keys_allocate_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(START);
        let limiter = KeyedRateLimiter::<u64>::builder(quota(algorithm))
            .clock(clock.clone())
            .build();
        for round in 0..200u64 {
            for key in 0..1000u64 {
                limiter.check_key(&key);
            }
            clock.advance(std::time::Duration::from_millis(7 + round % 3));
        }
        let n = allocations(|| {
            for i in 0..100_000u64 {
                std::hint::black_box(limiter.check_key(&(i % 1000)));
                if i % 1000 == 0 {
                    clock.advance(std::time::Duration::from_millis(7));
                }
            }
        });
        assert_eq!(n, 0, "{algorithm}");
    }
}

#[test]
fn memory_store_checks_on_existing_keys_allocate_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(START);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let keys: Vec<String> = (0..100).map(|k| format!("user:{k}")).collect();
        let q = quota(algorithm);
        for _ in 0..200 {
            for key in &keys {
                store.acquire_now(key, &q, 1).unwrap();
            }
            clock.advance(std::time::Duration::from_millis(7));
        }
        let n = allocations(|| {
            for i in 0..10_000 {
                std::hint::black_box(store.acquire_now(&keys[i % 100], &q, 1).unwrap());
                if i % 100 == 0 {
                    clock.advance(std::time::Duration::from_millis(7));
                }
            }
        });
        assert_eq!(n, 0, "{algorithm}");
    }
}
