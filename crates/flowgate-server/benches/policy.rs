//! Policy evaluation in-process: descriptors → rule → limit → decision on the in-memory store,
//! against limitador (the Kuadrant limiter) for the same limit with one variable.
//!
//! Both sides get pre-built inputs (limitador's own benchmark pre-builds its `Context` the same
//! way), 10,000 distinct values drawn at random, and a limit high enough that nothing is denied.
//!
//! `cargo bench -p flowgate-server --bench policy`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use flowgate::envoy::{Descriptor, Entry, check};
use flowgate::envoy::{DomainSpec, LimitSpec, Rate, RuleSet, RuleSpec};
use flowgate::store::{Ask, MemoryStore, Store};
use flowgate::{Algorithm, Quota};

/// Distinct values: `FLOWGATE_BENCH_KEYS`, default 10,000.
fn keys() -> usize {
    std::env::var("FLOWGATE_BENCH_KEYS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(10_000)
}
const LIMIT: u64 = 1_000_000_000;

/// Runs a future that completes without waiting (the memory store never waits).
fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

/// A xorshift sequence of indices, the same for every contender.
fn indices() -> Vec<usize> {
    let keys = keys() as u64;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..1 << 16)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % keys) as usize
        })
        .collect()
}

fn flowgate(c: &mut Criterion, algorithm: Algorithm) {
    let quota = Quota::per_minute(LIMIT).with_algorithm(algorithm).unwrap();
    let rules = RuleSet::build(vec![DomainSpec::new(
        "bench",
        vec![RuleSpec::new("user").with_limit(LimitSpec::new(Rate::Limited(quota)))],
    )])
    .unwrap();
    let store = MemoryStore::new();
    let requests: Vec<[Descriptor; 1]> = (0..keys())
        .map(|i| {
            [Descriptor::new(vec![Entry::new(
                "user",
                format!("user-{i}"),
            )])]
        })
        .collect();
    let order = indices();
    let mut next = 0;
    c.bench_function(&format!("policy/flowgate/{algorithm}"), |b| {
        b.iter(|| {
            next = (next + 1) & (order.len() - 1);
            let verdict = now(check(&rules, &store, "bench", &requests[order[next]], 1));
            assert!(verdict.allowed);
            black_box(verdict.allowed)
        })
    });
}

/// The memory store alone, with the counter keys built in advance: what the policy layer adds
/// is the difference to `policy/flowgate/fixed_window`.
fn store_only(c: &mut Criterion) {
    let quota = Quota::per_minute(LIMIT)
        .with_algorithm(Algorithm::FixedWindow)
        .unwrap();
    let store = MemoryStore::new();
    let keys: Vec<String> = (0..keys())
        .map(|i| {
            flowgate::envoy::counter_key(
                "bench",
                &[Entry::new("user", format!("user-{i}"))],
                &quota,
            )
        })
        .collect();
    let order = indices();
    let mut next = 0;
    c.bench_function("policy/memory_store_only/fixed_window", |b| {
        b.iter(|| {
            next = (next + 1) & (order.len() - 1);
            black_box(
                store
                    .check_now(Ask::new(&keys[order[next]], &quota))
                    .expect("in memory")
                    .unwrap()
                    .allowed,
            )
        })
    });
}

fn limitador(c: &mut Criterion) {
    use limitador::RateLimiter;
    use limitador::limit::{Context as LimitadorContext, Limit};

    let limiter = RateLimiter::new(keys() as u64 * 2);
    let variable = "user".try_into().unwrap();
    limiter.add_limit(Limit::new("bench", LIMIT, 60, vec![], vec![variable]));
    let namespace = "bench".into();
    let contexts: Vec<LimitadorContext<'_>> = (0..keys())
        .map(|i| HashMap::from([("user".to_owned(), format!("user-{i}"))]).into())
        .collect();
    let order = indices();
    let mut next = 0;
    c.bench_function("policy/limitador/fixed_window", |b| {
        b.iter(|| {
            next = (next + 1) & (order.len() - 1);
            let result = limiter
                .check_rate_limited_and_update(&namespace, &contexts[order[next]], 1)
                .unwrap();
            assert!(!result.limited);
            black_box(result.limited)
        })
    });
}

fn policy(c: &mut Criterion) {
    flowgate(c, Algorithm::FixedWindow);
    flowgate(c, Algorithm::SlidingWindow);
    flowgate(c, Algorithm::Gcra);
    store_only(c);
    limitador(c);
}

criterion_group!(benches, policy);
criterion_main!(benches);
