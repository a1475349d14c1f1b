//! The same comparison as `http_middleware`, made robust to a noisy machine: the variants take
//! turns (round after round, 20 000 requests each), and each variant's median over the rounds
//! is reported with its overhead over the bare app.
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
use flowgate::http::{Limit, Policy, RateLimitLayer};
use flowgate::store::MemoryStore;
use http::Request;
use tower::ServiceExt;
use tower::layer::util::Identity;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

const PER_ROUND: u32 = 20_000;
const ROUNDS: usize = 25;

fn variants() -> Vec<(&'static str, Router)> {
    let bare = || Router::new().route("/", get(|| async { "hello" }));
    let roomy = Quota::new(1_000_000_000, Duration::from_secs(1))
        .unwrap()
        .with_burst(1 << 40)
        .unwrap();
    let policy = Policy::new().limit(Limit::new("per-ip", PeerIp::new(), roomy));
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
    vec![
        ("axum_bare", bare()),
        // What axum charges for any layer (it boxes and clones each layered route per
        // request): the floor under both middlewares.
        ("axum_noop_layer", bare().layer(Identity::new())),
        ("flowgate", flowgate),
        ("tower_governor_headers", governor_headers),
        ("tower_governor", governor),
    ]
}

async fn run(app: &Router, n: u32) -> Duration {
    let peer: SocketAddr = "192.0.2.7:40000".parse().unwrap();
    let start = Instant::now();
    for _ in 0..n {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        std::hint::black_box(response);
    }
    start.elapsed()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let variants = variants();
    // `cargo bench` passes its own flags (`--bench`); a variant's name selects one variant.
    let only = std::env::args().find_map(|a| variants.iter().find(|(n, _)| *n == a));
    if let Some((only, app)) = only {
        // One variant, a fixed number of requests: for profilers and instruction counters.
        let took = rt.block_on(run(app, 200_000));
        println!("{only}: 200000 requests in {took:?}");
        return;
    }
    let mut samples = vec![Vec::new(); variants.len()];
    rt.block_on(async {
        for (_, app) in &variants {
            run(app, PER_ROUND).await; // warm up
        }
        for _ in 0..ROUNDS {
            for (i, (_, app)) in variants.iter().enumerate() {
                let took = run(app, PER_ROUND).await;
                samples[i].push(took.as_nanos() as f64 / f64::from(PER_ROUND));
            }
        }
    });
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = samples.iter_mut().map(median).collect();
    println!("{ROUNDS} interleaved rounds of {PER_ROUND} requests; median ns per request:");
    for ((name, _), m) in variants.iter().zip(&medians) {
        println!(
            "  {name:<24} {m:>7.0} ns   overhead over bare {:>6.0} ns",
            m - medians[0]
        );
    }
}
