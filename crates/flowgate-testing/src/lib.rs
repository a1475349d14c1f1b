//! Helpers shared by the workspace's tests: real `redis-server` processes and Redis Clusters,
//! the conformance table, a fault-injecting TCP proxy, a Flowgate server on loopback with HTTP,
//! gRPC and WebSocket clients, upstreams for the gateways, certificates, headless Chromium.
//! A dev-dependency of the crates whose tests use them; each feature brings one group (and its
//! dependencies) so a crate's tests build only what they use.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "chromium")]
pub mod chromium;
pub mod conformance;
#[cfg(feature = "pki")]
pub mod pki;
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod upstream;
#[cfg(feature = "server")]
pub mod ws;

/// How much later than a store's timeout a call may return in the fault tests (`faults.rs`,
/// `partition.rs`): 5 ms, or `FLOWGATE_FAULT_SLACK_MS` on a machine too loaded to schedule
/// timers that precisely. The slowest call is printed.
pub fn fault_slack() -> std::time::Duration {
    std::time::Duration::from_millis(
        std::env::var("FLOWGATE_FAULT_SLACK_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5),
    )
}
