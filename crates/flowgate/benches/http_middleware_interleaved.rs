//! The same comparison as `http_middleware`, made robust to a noisy machine: the variants take
//! turns (round after round, 10 000 requests each), and for each variant the report gives the
//! median time per request over the rounds, its fastest round (the least disturbed by other
//! work on the machine), and the median, over the rounds, of its overhead over the bare app
//! *in the same round* (paired, so that load that comes and goes between rounds cancels out).
//!
//! ```text
//! cargo bench -p flowgate --features tower,axum --bench http_middleware_interleaved
//! # one variant, 200 000 requests, for a profiler or an instruction counter (noise-free):
//! valgrind --tool=callgrind target/release/deps/http_middleware_interleaved-* flowgate
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use flowgate::Quota;
use flowgate::http::key::PeerIp;
use flowgate::http::{Limit, Limits, RateLimitLayer};
use flowgate::store::MemoryStore;
use http::Request;
use tower::ServiceExt;
use tower::layer::util::Identity;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

const PER_ROUND: u32 = 10_000;
const ROUNDS: usize = 51;

/// The apps, by name, with the status every request gets.
fn variants() -> Vec<(&'static str, Router, u16)> {
    let bare = || Router::new().route("/", get(|| async { "hello" }));
    let roomy = Quota::new(1_000_000_000, Duration::from_secs(1))
        .unwrap()
        .with_burst(1 << 40)
        .unwrap();
    let policy = Limits::new().limit(Limit::new("per-ip", PeerIp::new(), roomy));
    let flowgate = bare().layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap());
    let governor_headers = GovernorConfigBuilder::default()
        .period(Duration::from_nanos(1))
        .burst_size(u32::MAX)
        .use_headers()
        .finish()
        .unwrap();
    let governor_headers = bare().layer(GovernorLayer::new(governor_headers));
    let governor = GovernorConfigBuilder::default()
        .period(Duration::from_nanos(1))
        .burst_size(u32::MAX)
        .finish()
        .unwrap();
    let governor = bare().layer(GovernorLayer::new(governor));
    // Every request after the first is refused: one per hour.
    let policy = Limits::new().limit(Limit::new("per-ip", PeerIp::new(), Quota::per_hour(1)));
    let flowgate_denied = bare().layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap());
    let governor_denied = GovernorConfigBuilder::default()
        .period(Duration::from_secs(3600))
        .burst_size(1)
        .use_headers()
        .finish()
        .unwrap();
    let governor_denied = bare().layer(GovernorLayer::new(governor_denied));
    vec![
        ("axum_bare", bare(), 200),
        // What axum charges for any layer (it boxes and clones each layered route per
        // request): the floor under both middlewares.
        ("axum_noop_layer", bare().layer(Identity::new()), 200),
        ("flowgate", flowgate, 200),
        ("tower_governor_headers", governor_headers, 200),
        ("tower_governor", governor, 200),
        ("flowgate_denied", flowgate_denied, 429),
        ("tower_governor_headers_denied", governor_denied, 429),
    ]
}

async fn run(app: &Router, n: u32, status: u16) -> Duration {
    let peer: SocketAddr = "192.0.2.7:40000".parse().unwrap();
    let start = Instant::now();
    for _ in 0..n {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), status);
        std::hint::black_box(response);
    }
    start.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let variants = variants();
    // The first request of the denied variants passes; every later one is refused.
    rt.block_on(async {
        for (name, app, _) in &variants {
            if name.ends_with("_denied") {
                run(app, 1, 200).await;
            }
        }
    });
    // `cargo bench` passes its own flags (`--bench`); a variant's name selects one variant.
    let only = std::env::args().find_map(|a| variants.iter().find(|(n, ..)| *n == a));
    if let Some((only, app, status)) = only {
        // One variant, a fixed number of requests: for profilers and instruction counters.
        let took = rt.block_on(run(app, 200_000, *status));
        println!("{only}: 200000 requests in {took:?}");
        return;
    }
    // samples[variant][round]: ns per request.
    let mut samples = vec![Vec::new(); variants.len()];
    rt.block_on(async {
        for (_, app, status) in &variants {
            run(app, PER_ROUND, *status).await; // warm up
        }
        for _ in 0..ROUNDS {
            for (i, (_, app, status)) in variants.iter().enumerate() {
                let took = run(app, PER_ROUND, *status).await;
                samples[i].push(took.as_nanos() as f64 / f64::from(PER_ROUND));
            }
        }
    });
    println!("{ROUNDS} interleaved rounds of {PER_ROUND} requests; ns per request:");
    println!(
        "  {:<30} {:>8} {:>14} {:>24}",
        "app", "median", "fastest round", "median over bare, paired"
    );
    for (i, (name, ..)) in variants.iter().enumerate() {
        let overhead = samples[i]
            .iter()
            .zip(&samples[0])
            .map(|(v, b)| v - b)
            .collect();
        let fastest = samples[i].iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "  {name:<30} {:>8.0} {fastest:>14.0} {:>24.0}",
            median(samples[i].clone()),
            median(overhead)
        );
    }
}
