//! Instructions and cache misses per check, for valgrind: a steady diagnostic on a machine
//! whose load and hardware counters cannot be relied on. Not a criterion benchmark: it runs a
//! fixed number of checks on a `ManualClock` (time stands still, so every key stays held and
//! every check is allowed) and prints wall-clock figures that are only indicative.
//!
//! ```text
//! cargo bench -p flowgate --bench check_cost --no-run      # prints the binary's path
//! crates/flowgate/benches/check_cost.sh target/release/deps/check_cost-<hash> keyed 1000000
//! crates/flowgate/benches/check_cost.sh target/release/deps/check_cost-<hash> store 1000000
//! ```
//!
//! `check_cost.sh` runs the binary under cachegrind with 10 and with 20 rounds over the keys
//! and divides the difference by 10 × N: the cost of a check on an existing key, with the
//! inserts and the set-up taken out. `MODE=keyed`: `KeyedRateLimiter<u64>::try_check_key`;
//! `MODE=store`: `MemoryStore::check_now` on `"user:<n>"` keys (with `NAMES=1`, on a store
//! that keeps its names for listing: `MemoryStoreBuilder::list_keys`); `N` keys, `R` rounds.
//!
//! With `T=1`, `T=2`, …, it instead runs the checks on that many threads and prints the
//! throughput and the CPU time per check (see `threads`).

#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::hint::black_box;
use std::time::Instant;

use flowgate::KeyedRateLimiter;
use flowgate::Quota;
use flowgate::clock::ManualClock;
use flowgate::store::{Ask, MemoryStore, Store};

#[inline(never)]
fn checks(l: &KeyedRateLimiter<u64, ManualClock>, keys: &[u64], rounds: usize) -> usize {
    let mut ok = 0;
    for _ in 0..rounds {
        for &k in keys {
            ok += usize::from(black_box(l.try_check_key(&k).is_ok()));
        }
    }
    ok
}

#[inline(never)]
fn store_checks(s: &MemoryStore<ManualClock>, q: &Quota, keys: &[String], rounds: usize) -> usize {
    let mut ok = 0;
    for _ in 0..rounds {
        for k in keys {
            let allowed = s.check_now(Ask::new(k, q)).unwrap().unwrap().allowed;
            ok += usize::from(black_box(allowed));
        }
    }
    ok
}

/// Runs `round` once to insert the keys, then `rounds` times; prints the time per insert and
/// per check, and what the table held.
fn measure(
    n: u64,
    rounds: usize,
    mut round: impl FnMut(usize) -> usize,
    stats: impl Fn() -> String,
) {
    let start = Instant::now();
    assert_eq!(round(1) as u64, n);
    let insert = start.elapsed().as_nanos() as f64 / n as f64;
    let start = Instant::now();
    assert_eq!(round(rounds) as u64, n * rounds as u64);
    let check = start.elapsed().as_nanos() as f64 / (n as f64 * rounds as f64);
    println!("insert {insert:.1} ns, check {check:.1} ns, {}", stats());
}

/// Nanoseconds this thread has spent on a CPU (`/proc/thread-self/schedstat`, Linux).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `T` threads each run `rounds` passes of `check` over the `n` keys, each from its own
/// offset (as the criterion benches do); prints the wall-clock throughput and the CPU time
/// per check. On a machine shared with other work the wall clock says little, but the CPU
/// time per check still shows what contention costs: it grows when the threads take each
/// other's cache lines while they run at the same time.
fn threads(t: usize, n: usize, rounds: usize, check: &(dyn Fn(usize) -> bool + Sync)) {
    let start = Instant::now();
    let cpu: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..t)
            .map(|i| {
                scope.spawn(move || {
                    let cpu = thread_cpu_ns();
                    let mut k = i * n / t;
                    let mut ok = 0usize;
                    for _ in 0..rounds * n / t {
                        ok += usize::from(check(k));
                        k += 1;
                        if k == n {
                            k = 0;
                        }
                    }
                    assert_eq!(ok, rounds * n / t);
                    thread_cpu_ns() - cpu
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let wall = start.elapsed().as_secs_f64();
    let checks = (rounds * n / t * t) as f64;
    println!(
        "{t} thread(s): {:.2} M checks/s wall, {:.1} ns CPU per check",
        checks / wall / 1e6,
        cpu as f64 / checks
    );
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().unwrap())
}

fn main() {
    let n = env("N", 1_000_000);
    let rounds = env("R", 1) as usize;
    let keys: Vec<u64> = (0..n)
        .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let quota = Quota::per_second(1000);
    let clock = ManualClock::new(1 << 60);
    let t = env("T", 0) as usize;
    if t > 0 {
        // `T=1`, `T=2`, …: the thread mode (see `threads`), after one round of inserts.
        let n = n as usize;
        if std::env::var("MODE").is_ok_and(|m| m == "store") {
            let keys: Vec<String> = keys.iter().map(|k| format!("user:{}", k >> 24)).collect();
            let store = MemoryStore::builder().clock(clock).build();
            store_checks(&store, &quota, &keys, 1);
            assert_eq!(store.stats().keys, n);
            threads(t, n, rounds, &|i| {
                let decision = store.check_now(Ask::new(&keys[i], &quota));
                decision.unwrap().unwrap().allowed
            });
        } else {
            let limiter = KeyedRateLimiter::<u64>::builder(quota).clock(clock).build();
            checks(&limiter, &keys, 1);
            assert_eq!(limiter.len(), n);
            threads(t, n, rounds, &|i| limiter.try_check_key(&keys[i]).is_ok());
        }
        return;
    }
    if std::env::var("MODE").is_ok_and(|m| m == "store") {
        let keys: Vec<String> = keys.iter().map(|k| format!("user:{}", k >> 24)).collect();
        let store = MemoryStore::builder()
            .clock(clock)
            .list_keys(std::env::var_os("NAMES").is_some())
            .build();
        measure(
            n,
            rounds,
            |r| store_checks(&store, &quota, &keys, r),
            || format!("{:?}", store.stats()),
        );
    } else {
        let limiter = KeyedRateLimiter::<u64>::builder(quota).clock(clock).build();
        measure(
            n,
            rounds,
            |r| checks(&limiter, &keys, r),
            || format!("{:?}", limiter.stats()),
        );
    }
}
