//! A one-route axum server, bare or behind a rate-limit middleware, for load generators:
//!
//! ```text
//! cargo run --release -p flowgate --features tower,axum --example middleware_server -- flowgate 127.0.0.1:8090
//! wrk -t1 -c32 -d10s http://127.0.0.1:8090/
//! ```
//!
//! The first argument is `bare`, `flowgate` (memory store, per-peer-IP GCRA) or `governor`
//! (tower_governor, per-peer-IP, its headers on); limits are high enough to pass everything.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use flowgate::Quota;
use flowgate::http::key::PeerIp;
use flowgate::http::{Limit, Limits, RateLimitLayer};
use flowgate::store::MemoryStore;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let variant = args.next().unwrap_or_else(|| "flowgate".into());
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8090".into());
    let app = Router::new().route("/", get(|| async { "hello" }));
    let app = match variant.as_str() {
        "bare" => app,
        "flowgate" => {
            let quota = Quota::new(1_000_000_000, Duration::from_secs(1))
                .unwrap()
                .with_burst(1 << 40)
                .unwrap();
            let policy = Limits::new().limit(Limit::new("per-ip", PeerIp::new(), quota));
            app.layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap())
        }
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .period(Duration::from_nanos(1))
                .burst_size(u32::MAX)
                .use_headers()
                .finish()
                .unwrap();
            app.layer(GovernorLayer::new(config))
        }
        other => panic!("unknown variant {other}: bare, flowgate or governor"),
    };
    let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
    println!("{variant} on http://{}", listener.local_addr().unwrap());
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .unwrap();
}
