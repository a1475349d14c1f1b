//! The embedded memory store at a million keys, on one and two threads.
//!
//! `cargo bench -p flowgate --bench memory_store`
//!
//! `memory_store/1M/{1,2}-thread`: `Store::check_now` (what the HTTP layer and the
//! service call on their fast path) on 1,000,000 string keys (`"user:<n>"`, GCRA, a quota
//! high enough that every check is allowed), inserted first and then visited in a pre-shuffled
//! order; throughput in checks per second. Each thread walks the list from its own offset, as
//! in the keyed groups of `limiters.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // setup failures in a benchmark may panic

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flowgate::Quota;
use flowgate::store::{Ask, MemoryStore, Store};

/// `n` keys in a random order (xorshift-shuffled, fixed seed).
fn shuffled_keys(n: u64) -> Arc<Vec<String>> {
    let mut keys: Vec<String> = (0..n)
        .map(|k| format!("user:{}", k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 24))
        .collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..keys.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        keys.swap(i, (x % (i as u64 + 1)) as usize);
    }
    Arc::new(keys)
}

/// Times `iters` checks split over `threads` threads, each walking the key list from its own
/// offset; returns the wall time.
fn timed_checks(
    threads: usize,
    iters: u64,
    keys: &Arc<Vec<String>>,
    check: &(dyn Fn(&str) + Sync),
) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let keys = keys.clone();
            scope.spawn(move || {
                let len = keys.len();
                let mut i = t * len / threads;
                for _ in 0..per_thread {
                    check(&keys[i]);
                    i += 1;
                    if i == len {
                        i = 0;
                    }
                }
            });
        }
    });
    start.elapsed()
}

fn memory_store(c: &mut Criterion) {
    let n = 1_000_000u64;
    let mut group = c.benchmark_group("memory_store/1M");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(8));
    let keys = shuffled_keys(n);
    let store = MemoryStore::new();
    let quota = Quota::per_second(1000);
    // Insert every key first, so the bench measures checks on existing keys.
    for key in keys.iter() {
        assert!(
            store
                .check_now(Ask::new(key, &quota))
                .unwrap()
                .unwrap()
                .allowed
        );
    }
    let stats = store.stats();
    assert_eq!(stats.keys as u64, n, "{stats:?}");
    assert_eq!(stats.evicted_active, 0, "{stats:?}");
    for threads in [1usize, 2] {
        group.bench_function(
            BenchmarkId::new("check_now", format!("{threads}-thread")),
            |b| {
                b.iter_custom(|iters| {
                    timed_checks(threads, iters, &keys, &|k| {
                        black_box(store.check_now(Ask::new(k, &quota)).unwrap().is_ok());
                    })
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, memory_store);
criterion_main!(benches);
