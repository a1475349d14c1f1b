//! Helpers shared by the integration tests. Each test binary uses part of them.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

pub mod conformance;
#[cfg(feature = "redis")]
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis;

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
