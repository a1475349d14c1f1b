//! The cost of `TopKeys::record`: what feeding every denied request of the service costs.
//!
//! `cargo bench -p flowgate --bench top_keys`
//!
//! * `top_keys/zipf/{1,2}-thread`: 1,024 counters; names like the service's counter names
//!   (~80 bytes) drawn from a Zipf (s = 1.1) over 100,000 keys, pre-generated into one
//!   buffer (no formatting or random draws inside the timed loop, and the names stay in
//!   cache as a caller's would); throughput in records per second.
//! * `top_keys/distinct/{1,2}-thread`: 16,384 names in turn, so each comes back only after
//!   16 × the counters have been replaced: every record replaces the smallest counter (a
//!   flood of unique keys), the worst case.

#![allow(clippy::unwrap_used, clippy::expect_used)] // setup failures in a benchmark may panic

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flowgate::top::TopKeys;

/// A counter name as the service builds them.
fn counter_name(key: u64) -> String {
    format!(
        "edge|remote_address=10.{}.{}.{}|path=/api/v1/items#sliding_window:100:60000000000:100",
        key >> 16 & 255,
        key >> 8 & 255,
        key & 255
    )
}

/// `n` names, Zipf-distributed over `keys` keys (`zipf`) or all distinct, as ranges of one
/// buffer.
fn names(n: usize, keys: usize, zipf: bool) -> Arc<Names> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut unit = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut cdf = Vec::with_capacity(keys);
    let mut sum = 0.0;
    for rank in 1..=keys {
        sum += 1.0 / (rank as f64).powf(1.1);
        cdf.push(sum);
    }
    let mut names = Names {
        bytes: Vec::new(),
        ranges: Vec::with_capacity(n),
    };
    for i in 0..n {
        let name = if zipf {
            let u = unit() * sum;
            counter_name(cdf.partition_point(|&c| c < u) as u64)
        } else {
            counter_name(i as u64)
        };
        let start = names.bytes.len();
        names.bytes.extend_from_slice(name.as_bytes());
        names.ranges.push((start, names.bytes.len()));
    }
    Arc::new(names)
}

/// Names packed in one buffer.
struct Names {
    bytes: Vec<u8>,
    ranges: Vec<(usize, usize)>,
}

impl Names {
    fn get(&self, i: usize) -> &[u8] {
        let (from, to) = self.ranges[i];
        &self.bytes[from..to]
    }
}

/// Runs `iters` records spread over `threads` threads, each walking its own part of `names`.
fn timed(threads: usize, iters: u64, names: &Arc<Names>, top: &TopKeys) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let names = names.clone();
            scope.spawn(move || {
                let len = names.ranges.len();
                let mut i = t * len / threads;
                for _ in 0..per_thread {
                    top.record(black_box(names.get(i)));
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

fn record(c: &mut Criterion) {
    let mut group = c.benchmark_group("top_keys");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(6));
    for (label, names) in [
        ("zipf", names(1 << 14, 100_000, true)),
        ("distinct", names(1 << 14, 0, false)),
    ] {
        for threads in [1usize, 2] {
            let top = TopKeys::new(1024);
            group.bench_function(BenchmarkId::new(label, format!("{threads}-thread")), |b| {
                b.iter_custom(|iters| timed(threads, iters, &names, &top))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, record);
criterion_main!(benches);
