//! Bytes of heap per key for a keyed limiter of `u64` keys, Flowgate against governor, measured
//! with a counting allocator: allocated bytes after checking N distinct keys, divided by N.
//! The quota (1 per hour) keeps every key active, so Flowgate cannot drop idle keys to save
//! memory: this is the cost of N live keys.
//!
//! `cargo bench -p flowgate --bench memory_per_key`

#![allow(clippy::unwrap_used, clippy::expect_used)] // setup failures in a benchmark may panic

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};

use flowgate::KeyedRateLimiter;
use flowgate::Quota;

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

#[allow(unsafe_code)]
// SAFETY: forwards every call to the system allocator; only keeps a running byte count.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn bytes_per_key(n: u64, fill: impl FnOnce(u64) -> Box<dyn std::any::Any>) -> f64 {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let limiter = fill(n);
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    drop(limiter);
    (after - before) as f64 / n as f64
}

#[allow(clippy::print_stdout)]
fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    // Start flowgate's clock thread first so its allocations are not counted.
    let _ = flowgate::clock::Clock::recent(&flowgate::clock::MonotonicClock::new());
    println!(
        "keys        flowgate B/key   governor B/key   memory store gcra B/key   memory store fixed_window B/key"
    );
    for n in [1_000u64, 100_000, 1_000_000, 4_000_000] {
        let flowgate = bytes_per_key(n, |n| {
            let l = KeyedRateLimiter::<u64>::builder(Quota::per_hour(1))
                .max_keys(2 * n as usize)
                .build();
            for k in 0..n {
                let _ = l.check_key(&k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            }
            assert_eq!(l.len() as u64, n);
            Box::new(l)
        });
        let governor = bytes_per_key(n, |n| {
            let l = governor::RateLimiter::keyed(governor::Quota::per_hour(NonZeroU32::MIN));
            for k in 0..n {
                let _ = l.check_key(&k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            }
            Box::new(l)
        });
        // The service's memory store, with counter names as the service writes them (~70
        // bytes: domain, descriptor, quota).
        let store = |algorithm| {
            move |n: u64| -> Box<dyn std::any::Any> {
                use flowgate::store::{Ask, MemoryStore, Store};
                let quota = Quota::per_hour(1).with_algorithm(algorithm).unwrap();
                let store = MemoryStore::builder().max_keys(2 * n as usize).build();
                let mut name = String::new();
                for k in 0..n {
                    name.clear();
                    use std::fmt::Write;
                    let _ = write!(name, "bench|api_key=key-{k}#{algorithm}:1:3600000000000:1");
                    let _ = store.check_now(Ask::new(&name, &quota));
                }
                assert_eq!(store.stats().keys as u64, n);
                Box::new(store)
            }
        };
        let gcra = bytes_per_key(n, store(flowgate::Algorithm::Gcra));
        let fixed = bytes_per_key(n, store(flowgate::Algorithm::FixedWindow));
        println!("{n:<11} {flowgate:>14.1} {governor:>16.1} {gcra:>25.1} {fixed:>33.1}");
    }
}
