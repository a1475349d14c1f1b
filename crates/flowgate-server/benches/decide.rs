//! What a decision costs through the service (`Service::decide`: rule lookup, store, metrics
//! and the dashboard's top denied keys), denied and allowed, for a callgrind instruction
//! count: every decision here is in memory, so the loop never waits.
//!
//! ```sh
//! cargo bench -p flowgate-server --bench decide --no-run
//! valgrind --tool=callgrind --toggle-collect='decide::run*' target/release/deps/decide-* denied
//! ```
//!
//! `denied`: 10,000 addresses, each already over its limit (1 per hour), so every decision is
//! a denial that `TopKeys` records. `allowed`: the same addresses under a limit nothing
//! reaches. Instructions ÷ `FLOWGATE_BENCH_N` (default 200,000) is the figure.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    clippy::print_stdout
)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use flowgate::envoy::{Descriptor, Entry};
use flowgate_server::api::Service;
use flowgate_server::backend::Backend;
use flowgate_server::metrics::Api;

const KEYS: usize = 10_000;

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

#[inline(never)]
fn run(service: &Service, requests: &[[Descriptor; 1]], n: usize) -> usize {
    let active = service.active();
    let mut denied = 0;
    for i in 0..n {
        let request = &requests[i % requests.len()];
        let verdict = now(service.decide(&active, Api::Check, "bench", request, 1));
        denied += usize::from(!black_box(verdict).allowed);
    }
    denied
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "denied".into());
    let limit = if mode == "allowed" { 1_000_000_000 } else { 1 };
    let n: usize = std::env::var("FLOWGATE_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200_000);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bench.yaml");
    std::fs::write(
        &file,
        format!(
            "domain: bench\ndescriptors:\n  - key: remote_address\n    rate_limit: {{unit: hour, requests_per_unit: {limit}, algorithm: fixed_window}}\n"
        ),
    )
    .unwrap();
    let policy = flowgate_server::config::load(&[file]).unwrap();
    let service = Service::new(policy, Backend::default());
    let requests: Vec<[Descriptor; 1]> = (0..KEYS)
        .map(|i| {
            [Descriptor::new(vec![Entry::new(
                "remote_address",
                format!("10.0.{}.{}", i / 256, i % 256),
            )])]
        })
        .collect();
    // Warm up: every key exists (and, when denied, is over its limit).
    run(&service, &requests, KEYS * 2);
    let denied = run(&service, &requests, n);
    println!("{mode}: {n} decisions, {denied} denied");
}
