//! The rate-limit middleware's overhead in an axum app, in process: the same one-route app
//! bare, behind Flowgate's `RateLimitLayer` (memory store, per-peer-IP GCRA) and behind
//! `tower_governor` (per-peer-IP GCRA), each request driven with `ServiceExt::oneshot`.
//!
//! ```text
//! cargo bench -p flowgate --features tower,axum --bench http_middleware
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use flowgate::Quota;
use flowgate::http::key::PeerIp;
use flowgate::http::{Limit, Limits, RateLimitLayer};
use flowgate::store::MemoryStore;
use http::Request;
use tower::ServiceExt;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

fn bare() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

fn flowgate_app(quota: Quota) -> Router {
    let policy = Limits::new().limit(Limit::new("per-ip", PeerIp::new(), quota));
    bare().layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap())
}

/// tower_governor with its rate-limit headers on (closest to Flowgate, which always sends
/// the IETF headers) or off (its default).
fn governor_app(per: Duration, burst: u32, headers: bool) -> Router {
    if headers {
        let config = GovernorConfigBuilder::default()
            .period(per)
            .burst_size(burst)
            .use_headers()
            .finish()
            .unwrap();
        bare().layer(GovernorLayer::new(config))
    } else {
        let config = GovernorConfigBuilder::default()
            .period(per)
            .burst_size(burst)
            .finish()
            .unwrap();
        bare().layer(GovernorLayer::new(config))
    }
}

/// Times `iters` requests from one client through `app` on a current-thread runtime.
fn run(rt: &tokio::runtime::Runtime, app: &Router, iters: u64, expect: u16) -> Duration {
    let peer: SocketAddr = "192.0.2.7:40000".parse().unwrap();
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let mut request = Request::get("/").body(Body::empty()).unwrap();
            request.extensions_mut().insert(ConnectInfo(peer));
            let response = app.clone().oneshot(request).await.unwrap();
            debug_assert_eq!(response.status().as_u16(), expect);
            std::hint::black_box(response);
        }
        start.elapsed()
    })
}

fn middleware(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Allowed: quotas no benchmark run can exhaust.
    let roomy = Quota::new(1_000_000_000, Duration::from_secs(1))
        .unwrap()
        .with_burst(1 << 40)
        .unwrap();
    let mut allowed = c.benchmark_group("http_middleware/allowed");
    let apps = [
        ("axum_bare", bare()),
        ("flowgate", flowgate_app(roomy)),
        (
            "tower_governor_headers",
            governor_app(Duration::from_nanos(1), u32::MAX, true),
        ),
        (
            "tower_governor_default",
            governor_app(Duration::from_nanos(1), u32::MAX, false),
        ),
    ];
    for (name, app) in &apps {
        allowed.bench_function(*name, |b| b.iter_custom(|n| run(&rt, app, n, 200)));
    }
    allowed.finish();

    // Denied: one request per hour, so every measured request gets a 429.
    let mut denied = c.benchmark_group("http_middleware/denied");
    let flowgate = flowgate_app(Quota::per_hour(1));
    let governor = governor_app(Duration::from_secs(3600), 1, true);
    run(&rt, &flowgate, 1, 200);
    run(&rt, &governor, 1, 200);
    denied.bench_function("flowgate", |b| {
        b.iter_custom(|n| run(&rt, &flowgate, n, 429))
    });
    denied.bench_function("tower_governor_headers", |b| {
        b.iter_custom(|n| run(&rt, &governor, n, 429))
    });
    denied.finish();
}

criterion_group!(benches, middleware);
criterion_main!(benches);
