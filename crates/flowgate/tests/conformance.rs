//! The conformance table on the memory store. Every other store runs the same table (see
//! `flowgate_testing::conformance`); a store passes only if it returns exactly the decisions the
//! table lists.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use flowgate::KeyedRateLimiter;
use flowgate::clock::ManualClock;
use flowgate::store::{Ask, MemoryStore, Store, StoreError};
use flowgate::{Decision, Quota};
use flowgate_testing::conformance::{DEFAULT_START, run_table, run_table_where, traces};

#[tokio::test]
async fn memory_store_passes_the_conformance_table() {
    let clock = ManualClock::new(DEFAULT_START);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    run_table(&store, &clock, "conformance:").await;
}

#[test]
fn the_table_covers_every_algorithm_and_the_required_cases() {
    let traces = traces();
    for algorithm in flowgate::Algorithm::ALL {
        assert!(
            traces
                .iter()
                .filter(|t| t.quota.algorithm() == algorithm)
                .count()
                >= 4,
            "{algorithm} has too few traces"
        );
    }
    let names: Vec<&str> = traces.iter().map(|t| t.name.as_str()).collect();
    for case in [
        "burst then refill",
        "weighted cost",
        "cost 0",
        "cost above burst",
        "long idle",
        "time not advancing",
        "boundary spike",
        "never exceeds its limit in any window",
        "refund",
        "charge past the limit",
        "29-day February",
        "spring daylight-saving change",
        "autumn daylight-saving change",
        "ISO weeks start on Monday",
    ] {
        assert!(
            names.iter().any(|n| n.contains(case)),
            "no trace covers {case:?}"
        );
    }
}

/// The in-process keyed limiters, seen as a store: one limiter per trace key, so the table also
/// checks the lock-free cells (GCRA's word, the 128-bit packings, the log's mutex).
struct KeyedLimiters {
    clock: ManualClock,
    limiters: std::sync::Mutex<
        std::collections::HashMap<String, std::sync::Arc<KeyedRateLimiter<String, ManualClock>>>,
    >,
}

impl KeyedLimiters {
    fn limiter(
        &self,
        key: &str,
        quota: &Quota,
    ) -> std::sync::Arc<KeyedRateLimiter<String, ManualClock>> {
        let mut limiters = self.limiters.lock().unwrap();
        let limiter = limiters.entry(key.to_owned()).or_insert_with(|| {
            std::sync::Arc::new(
                KeyedRateLimiter::builder(*quota)
                    .clock(self.clock.clone())
                    .build(),
            )
        });
        assert_eq!(limiter.quota(), quota, "a trace key is used with one quota");
        limiter.clone()
    }
}

impl Store for KeyedLimiters {
    async fn check(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
        Ok(self
            .limiter(ask.key, ask.quota)
            .check_key_n(ask.key, ask.cost)?)
    }
    async fn refund(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        self.limiter(ask.key, ask.quota)
            .refund_key(ask.key, ask.cost);
        Ok(())
    }
    async fn reset(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        self.limiter(ask.key, ask.quota).reset_key(ask.key);
        Ok(())
    }
}

#[tokio::test]
async fn keyed_in_process_limiters_pass_the_conformance_table() {
    let clock = ManualClock::new(DEFAULT_START);
    let store = KeyedLimiters {
        clock: clock.clone(),
        limiters: Default::default(),
    };
    // The in-process limiters take no charges (that is a store's verb).
    run_table_where(&store, &clock, "local:", |t| !t.charges()).await;
}

#[tokio::test]
async fn fallback_store_over_memory_passes_the_conformance_table() {
    let clock = ManualClock::new(DEFAULT_START);
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let store = flowgate::store::FallbackStore::builder(memory)
        .clock(clock.clone())
        .build();
    run_table(&store, &clock, "fallback:").await;
}
