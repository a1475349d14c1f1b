//! Exact admission counts under many threads: with no refill, N threads × M attempts against a
//! quota admit exactly its burst — for every algorithm, for the direct limiter, the keyed
//! limiter and the memory store.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};

use flowgate::clock::ManualClock;
use flowgate::local::{KeyedRateLimiter, RateLimiter};
use flowgate::store::{Ask, MemoryStore, Store};
use flowgate::{Algorithm, Quota};

const THREADS: usize = 8;
const ATTEMPTS: usize = 5_000;
const START: u64 = 1_700_006_400_000_000_000;

fn quota(algorithm: Algorithm, limit: u64) -> Quota {
    Quota::per_hour(limit).with_algorithm(algorithm).unwrap()
}

/// Runs `attempt(thread, i)` on every thread; returns how many attempts were granted.
fn hammer(attempt: impl Fn(usize, usize) -> bool + Sync) -> u64 {
    let granted = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (granted, attempt) = (&granted, &attempt);
            scope.spawn(move || {
                for i in 0..ATTEMPTS {
                    if attempt(thread, i) {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    granted.into_inner()
}

#[test]
fn direct_limiter_admits_exactly_the_burst() {
    for algorithm in Algorithm::ALL {
        let limiter = RateLimiter::with_clock(quota(algorithm, 1000), ManualClock::new(START));
        let granted = hammer(|_, _| limiter.check().allowed);
        assert_eq!(granted, 1000, "{algorithm}");
    }
}

#[test]
fn direct_limiter_with_weighted_costs_admits_exactly_the_burst() {
    for algorithm in Algorithm::ALL {
        let limiter = RateLimiter::with_clock(quota(algorithm, 999), ManualClock::new(START));
        // Costs 1, 2 and 3: every granted unit is counted.
        let units = AtomicU64::new(0);
        hammer(|thread, _| {
            let cost = 1 + (thread as u64 % 3);
            let granted = limiter.check_n(cost).unwrap().allowed;
            if granted {
                units.fetch_add(cost, Ordering::Relaxed);
            }
            granted
        });
        let units = units.into_inner();
        // Only units that fit are granted, and the last few requests may leave 1 or 2 unused.
        assert!((997..=999).contains(&units), "{algorithm}: {units}");
        assert_eq!(limiter.peek().remaining, 999 - units, "{algorithm}");
    }
}

#[test]
fn keyed_limiter_admits_exactly_the_burst_per_key() {
    for algorithm in Algorithm::ALL {
        let limiter = KeyedRateLimiter::<u64>::builder(quota(algorithm, 10))
            .clock(ManualClock::new(START))
            .build();
        // 64 keys, visited in a different order by each thread, ~625 attempts per key.
        let granted = hammer(|thread, i| {
            let key = ((i * 7 + thread * 13) % 64) as u64;
            limiter.check_key(&key).allowed
        });
        assert_eq!(granted, 64 * 10, "{algorithm}");
        assert_eq!(limiter.len(), 64);
    }
}

#[test]
fn memory_store_admits_exactly_the_burst_per_key() {
    for algorithm in Algorithm::ALL {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(START))
            .build();
        let q = quota(algorithm, 10);
        let keys: Vec<String> = (0..64).map(|k| format!("tenant:{k}")).collect();
        let granted = hammer(|thread, i| {
            let key = &keys[(i * 7 + thread * 13) % 64];
            store
                .check_now(Ask::new(key, &q))
                .expect("in memory")
                .unwrap()
                .allowed
        });
        assert_eq!(granted, 64 * 10, "{algorithm}");
    }
}
