//! In-process limiters against governor, side by side in one run.
//!
//! `cargo bench -p flowgate --bench limiters`
//!
//! * `direct/allowed`, `direct/rejected`: one limiter, one check per iteration. Flowgate's
//!   `try_check` returns what governor's `check` returns (granted, or the wait); its `check`
//!   also computes `remaining` and `reset_after` (a full `Decision`), shown for comparison.
//! * `keyed/{1k,1M}/{1,2}-thread`: checks on random `u64` keys drawn from a pre-shuffled list
//!   (no random-number generation inside the timed loop), throughput in checks per second;
//!   Flowgate's `try_check_key` against governor's `check_key`.
//!
//! Both libraries run with their default clocks; governor also with its `QuantaUpkeepClock`,
//! the closest thing it has to Flowgate's cheap `recent()` reading.

#![allow(clippy::unwrap_used, clippy::expect_used)] // setup failures in a benchmark may panic

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flowgate::Quota;
use flowgate::local::{KeyedRateLimiter, RateLimiter};

fn gov_quota(per_second: u32) -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN))
}

fn direct(c: &mut Criterion) {
    let mut group = c.benchmark_group("direct");
    group.throughput(Throughput::Elements(1));

    // Allowed: a quota far above what one thread can ask for.
    let fg = RateLimiter::new(Quota::per_second(1_000_000_000));
    group.bench_function("allowed/flowgate-try_check", |b| {
        b.iter(|| black_box(fg.try_check().is_ok()))
    });
    group.bench_function("allowed/flowgate-check", |b| {
        b.iter(|| black_box(fg.check().allowed))
    });
    let gov = governor::RateLimiter::direct(gov_quota(u32::MAX));
    group.bench_function("allowed/governor", |b| {
        b.iter(|| black_box(gov.check().is_ok()))
    });
    let upkeep = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
        .expect("upkeep thread");
    let gov_upkeep = governor::RateLimiter::direct_with_clock(gov_quota(u32::MAX), upkeep.clone());
    group.bench_function("allowed/governor-upkeep-clock", |b| {
        b.iter(|| black_box(gov_upkeep.check().is_ok()))
    });

    // Rejected: one unit per hour, already taken.
    let fg = RateLimiter::new(Quota::per_hour(1));
    let _ = fg.check();
    group.bench_function("rejected/flowgate-try_check", |b| {
        b.iter(|| black_box(fg.try_check().is_ok()))
    });
    group.bench_function("rejected/flowgate-check", |b| {
        b.iter(|| black_box(fg.check().allowed))
    });
    let gov = governor::RateLimiter::direct(governor::Quota::per_hour(NonZeroU32::MIN));
    let _ = gov.check();
    group.bench_function("rejected/governor", |b| {
        b.iter(|| black_box(gov.check().is_ok()))
    });
    let gov_upkeep = governor::RateLimiter::direct_with_clock(
        governor::Quota::per_hour(NonZeroU32::MIN),
        upkeep,
    );
    let _ = gov_upkeep.check();
    group.bench_function("rejected/governor-upkeep-clock", |b| {
        b.iter(|| black_box(gov_upkeep.check().is_ok()))
    });
    group.finish();
}

/// `n` keys in a random order (xorshift-shuffled, fixed seed): the order the benches visit.
fn shuffled_keys(n: u64) -> Arc<Vec<u64>> {
    let mut keys: Vec<u64> = (0..n)
        .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15))
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
    keys: &Arc<Vec<u64>>,
    check: &(dyn Fn(u64) + Sync),
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
                    check(keys[i]);
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

fn keyed(c: &mut Criterion) {
    for (label, n) in [("1k", 1_000u64), ("1M", 1_000_000u64)] {
        let mut group = c.benchmark_group(format!("keyed/{label}"));
        group.throughput(Throughput::Elements(1));
        group.sample_size(20);
        group.measurement_time(Duration::from_secs(8));
        let keys = shuffled_keys(n);

        let fg = KeyedRateLimiter::<u64>::new(Quota::per_second(1000));
        let gov = governor::RateLimiter::keyed(gov_quota(1000));
        // Insert every key first, so the benches measure checks on existing keys.
        for &k in keys.iter() {
            let _ = fg.check_key(&k);
            let _ = gov.check_key(&k);
        }
        // Every key must still be held, or the benches would time inserts.
        assert_eq!(fg.len() as u64, n, "{:?}", fg.stats());
        for threads in [1usize, 2] {
            group.bench_function(
                BenchmarkId::new("flowgate", format!("{threads}-thread")),
                |b| {
                    b.iter_custom(|iters| {
                        timed_checks(threads, iters, &keys, &|k| {
                            black_box(fg.try_check_key(&k).is_ok());
                        })
                    })
                },
            );
            group.bench_function(
                BenchmarkId::new("governor", format!("{threads}-thread")),
                |b| {
                    b.iter_custom(|iters| {
                        timed_checks(threads, iters, &keys, &|k| {
                            black_box(gov.check_key(&k).is_ok());
                        })
                    })
                },
            );
        }
        group.finish();
    }
}

criterion_group!(benches, direct, keyed);
criterion_main!(benches);
