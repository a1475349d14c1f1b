//! `TopKeys` against exact counts: the true top keys of a Zipf stream are found within the
//! documented error; memory stays fixed (no allocation at all) while 10 million distinct keys
//! go through; and a property test checks the Space-Saving bounds on small random streams.
#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;

use flowgate::top::{TopKey, TopKeys};
use proptest::prelude::*;

/// Counts this thread's allocations and live bytes while `COUNTING` is set.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn count(allocations: u64, bytes: i64) {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.with(|n| n.set(n.get() + allocations));
        LIVE.with(|n| n.set(n.get() + bytes));
    }
}

#[allow(unsafe_code)]
// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(1, layout.size() as i64);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(1, layout.size() as i64);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(0, -(layout.size() as i64));
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(1, new_size as i64 - layout.size() as i64);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// What `f` returns, and the allocations and net bytes it made on this thread.
fn measured<T>(f: impl FnOnce() -> T) -> (T, u64, i64) {
    ALLOCATIONS.with(|n| n.set(0));
    LIVE.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ALLOCATIONS.with(Cell::get), LIVE.with(Cell::get))
}

/// xorshift64*: a seeded stream of draws for the tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `key-<n>` written into `buf` without allocating.
fn name(buf: &mut [u8; 24], mut n: u64) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    i -= 4;
    buf[i..i + 4].copy_from_slice(b"key-");
    &buf[i..]
}

/// The largest shard floor: no key it does not report can have a true count above it.
fn floor(top: &TopKeys) -> u64 {
    top.floors().into_iter().max().unwrap_or(0)
}

#[test]
fn memory_is_fixed_and_nothing_is_allocated_at_ten_million_distinct_keys() {
    let (top, allocations, bytes) = measured(|| TopKeys::with_shards(1024, 16));
    assert!(allocations > 0);
    // Everything it holds was allocated when it was built, and it says how much.
    assert_eq!(
        bytes as usize + std::mem::size_of::<TopKeys>(),
        top.memory_bytes()
    );
    let memory = top.memory_bytes();
    assert!(memory < 256 * 1024, "{memory} bytes for 1,024 counters");

    const DISTINCT: u64 = 10_000_000;
    const HEAVY: u64 = 10;
    const HEAVY_EACH: u64 = DISTINCT / 50 / HEAVY;
    let mut buf = [0u8; 24];
    let ((), allocations, bytes) = measured(|| {
        for i in 0..DISTINCT {
            top.record(name(&mut buf, 1_000 + i));
            // Every 50th request is one of 10 heavy keys: 20,000 each.
            if i % 50 == 0 {
                top.record(name(&mut buf, i / 50 % HEAVY));
            }
        }
    });
    assert_eq!((allocations, bytes), (0, 0), "recording allocated");
    assert_eq!(top.memory_bytes(), memory);
    assert_eq!(top.total(), DISTINCT + DISTINCT / 50);

    // The heavy keys are found, within the bound.
    let bound = floor(&top);
    // About N / capacity (each shard: its N / 64), up to the spread between shards.
    assert!(bound <= 2 * top.total() / 1024, "floor {bound}");
    let found = top.top(HEAVY as usize);
    let mut names: Vec<&str> = found.iter().map(|k| k.key.as_str()).collect();
    names.sort_unstable();
    let expected: Vec<String> = (0..HEAVY).map(|k| format!("key-{k}")).collect();
    assert_eq!(
        names,
        expected.iter().map(String::as_str).collect::<Vec<_>>()
    );
    for k in &found {
        assert!(
            k.guaranteed() <= HEAVY_EACH && HEAVY_EACH <= k.count,
            "{k:?}"
        );
        assert!(k.error <= bound, "{k:?} > {bound}");
    }
}

#[test]
fn finds_the_true_top_keys_of_a_zipf_stream_within_the_bound() {
    // Zipf (s = 1.1) over a million keys, by inverse CDF.
    const KEYS: usize = 1_000_000;
    const DRAWS: usize = 2_000_000;
    let mut cdf = Vec::with_capacity(KEYS);
    let mut sum = 0.0;
    for rank in 1..=KEYS {
        sum += 1.0 / (rank as f64).powf(1.1);
        cdf.push(sum);
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let top = TopKeys::with_shards(1024, 8);
    let mut exact: HashMap<u32, u64> = HashMap::new();
    let mut buf = [0u8; 24];
    for _ in 0..DRAWS {
        let u = rng.unit() * sum;
        let key = cdf.partition_point(|&c| c < u) as u32;
        *exact.entry(key).or_default() += 1;
        top.record(name(&mut buf, u64::from(key)));
    }
    let bound = floor(&top);
    // About N / capacity: the documented bound, up to the spread between shards.
    assert!(bound <= 2 * DRAWS as u64 / 1024, "floor {bound}");
    let true_count = |k: &TopKey| exact[&k.key[4..].parse::<u32>().unwrap()];
    let reported = top.top(top.capacity());
    for k in &reported {
        let t = true_count(k);
        assert!(k.guaranteed() <= t && t <= k.count, "{k:?}: true {t}");
        assert!(k.error <= bound, "{k:?}");
    }
    // Every key above the bound is reported...
    let names: std::collections::HashSet<&str> = reported.iter().map(|k| k.key.as_str()).collect();
    let mut heavy = 0;
    for (&key, &c) in &exact {
        if c > bound {
            heavy += 1;
            assert!(
                names.contains(format!("key-{key}").as_str()),
                "missed key-{key} ({c})"
            );
        }
    }
    assert!(heavy >= 50, "only {heavy} keys above the bound");
    // ...and the top 20 are the true top 20, in order.
    let mut by_count: Vec<(u32, u64)> = exact.into_iter().collect();
    by_count.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let truth: Vec<String> = by_count[..20]
        .iter()
        .map(|(k, _)| format!("key-{k}"))
        .collect();
    let got: Vec<String> = top.top(20).into_iter().map(|k| k.key).collect();
    assert_eq!(got, truth);
}

proptest! {
    /// Against exact counts on small streams, with few counters: every reported count
    /// brackets the true count within its error, the error is at most the shard's smallest
    /// counter, that floor is at most N / counters (one shard), and every key whose true
    /// count exceeds it is reported.
    #[test]
    fn space_saving_bounds_hold_on_small_streams(
        stream in prop::collection::vec((0u8..40, 1u64..6), 0..400),
        counters in 1usize..12,
        shards in prop::sample::select(vec![1usize, 2, 4]),
    ) {
        let top = TopKeys::with_shards(counters * shards, shards);
        let mut exact: HashMap<String, u64> = HashMap::new();
        for &(key, weight) in &stream {
            let key = format!("k{key}");
            top.record_n(&key, weight);
            *exact.entry(key).or_default() += weight;
        }
        let total: u64 = exact.values().sum();
        prop_assert_eq!(top.total(), total);
        let bound = floor(&top);
        if shards == 1 {
            prop_assert!(bound <= total / counters as u64, "floor {} > {} / {}", bound, total, counters);
        }
        let reported = top.top(usize::MAX);
        prop_assert!(reported.len() <= counters * shards);
        for k in &reported {
            let t = exact[&k.key];
            prop_assert!(k.guaranteed() <= t && t <= k.count, "{:?}: true {}", k, t);
            prop_assert!(k.error <= bound);
        }
        for (key, &c) in &exact {
            if c > bound {
                prop_assert!(reported.iter().any(|k| &k.key == key), "missed {} ({} > {})", key, c, bound);
            }
        }
        // One shard: the counts add up to the total once every counter is in use.
        if shards == 1 && exact.len() >= counters {
            prop_assert_eq!(reported.iter().map(|k| k.count).sum::<u64>(), total);
        }
    }
}

#[test]
fn many_threads_record_at_once_without_losing_counts() {
    let top = TopKeys::with_shards(256, 8);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let top = &top;
            s.spawn(move || {
                let mut buf = [0u8; 24];
                for i in 0..50_000u64 {
                    top.record(name(&mut buf, i % 100));
                    top.record_n(name(&mut buf, 1_000 + t), 2);
                }
            });
        }
    });
    assert_eq!(top.total(), 4 * 50_000 * 3);
    // 100 keys fit in 256 counters: every count is exact.
    for k in top.top(usize::MAX) {
        assert_eq!(k.error, 0);
        let expected = if k.key.starts_with("key-1") && k.key.len() == 8 {
            100_000
        } else {
            2_000
        };
        assert_eq!(k.count, expected, "{k:?}");
    }
}
