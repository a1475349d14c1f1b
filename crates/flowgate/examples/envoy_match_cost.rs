//! A loop of `envoy::check` calls for counting instructions under callgrind: one rule that
//! matches (key only, a trailing wildcard or a middle wildcard) with or without nine wildcard
//! rules on the same key that never match, 10,000 distinct values, the memory store, a fixed
//! window that never denies. BENCHMARKS.md ("Wildcards anywhere in a value") runs it with
//! 0 and 200,000 checks and divides the difference:
//!
//! ```text
//! cargo build --release -p flowgate --features envoy --example envoy_match_cost
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/envoy_match_cost trailing 200000
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use flowgate::envoy::{Descriptor, DomainSpec, Entry, LimitSpec, Rate, RuleSet, RuleSpec, check};
use flowgate::store::MemoryStore;
use flowgate::{Algorithm, Quota};

/// Runs a future that completes without waiting (the memory store never waits).
fn now<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(o) => o,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_else(|| "plain".into());
    let n: usize = args.next().map_or(200_000, |n| n.parse().expect("a count"));
    let quota = Quota::per_minute(1_000_000_000)
        .with_algorithm(Algorithm::FixedWindow)
        .unwrap();
    let limit = || LimitSpec::new(Rate::Limited(quota));
    let rule = match case.as_str() {
        "plain" | "key_only" => RuleSpec::new("user").with_limit(limit()),
        "trailing" => RuleSpec::new("user")
            .with_value("user-*")
            .with_limit(limit()),
        "middle" => RuleSpec::new("user")
            .with_value("user-*-x*")
            .with_limit(limit()),
        other => panic!("unknown case {other}: plain, key_only, trailing or middle"),
    };
    let mut rules = vec![rule];
    if case != "plain" {
        for i in 0..9 {
            rules.push(
                RuleSpec::new("user")
                    .with_value(format!("other{i}-*"))
                    .with_limit(limit()),
            );
        }
    }
    let rules = RuleSet::build(vec![DomainSpec::new("bench", rules)]).unwrap();
    let store = MemoryStore::new();
    let requests: Vec<[Descriptor; 1]> = (0..10_000)
        .map(|i| {
            [Descriptor::new(vec![Entry::new(
                "user",
                format!("user-{i}-x{i}"),
            )])]
        })
        .collect();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut allowed = 0usize;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let request = &requests[usize::try_from(x % 10_000).unwrap()];
        allowed += usize::from(now(check(&rules, &store, "bench", request, 1)).allowed);
    }
    assert_eq!(allowed, n);
    println!("{case}: {n} checks allowed");
}
