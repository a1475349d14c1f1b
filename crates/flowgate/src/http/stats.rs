//! [`RateLimitStats`]: what the layer decided, counted.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the layer's outcomes, shared by every clone of a layer and its services; read
/// them with [`snapshot`](Self::snapshot) (e.g. from a metrics endpoint).
#[derive(Debug, Default)]
pub struct RateLimitStats {
    pub(crate) allowed: AtomicU64,
    pub(crate) limited: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) fail_open: AtomicU64,
    pub(crate) fail_local: AtomicU64,
    pub(crate) unavailable: AtomicU64,
    pub(crate) store_errors: AtomicU64,
}

/// The counters at one moment. Every request lands in exactly one of `allowed`, `limited`,
/// `rejected`, `unavailable` and `store_errors`; `fail_open` and `fail_local` count the allowed
/// requests that a fail mode let through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests passed to the inner service.
    pub allowed: u64,
    /// Requests answered 429.
    pub limited: u64,
    /// Requests whose key could not be extracted (4xx).
    pub rejected: u64,
    /// Allowed requests that a store failure let through unchecked (fail open).
    pub fail_open: u64,
    /// Allowed requests decided by a local fallback limiter instead of the store.
    pub fail_local: u64,
    /// Requests answered 503 because the store was unavailable (fail closed).
    pub unavailable: u64,
    /// Requests answered 500 because the store failed in a way retrying cannot fix.
    pub store_errors: u64,
}

impl RateLimitStats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            allowed: get(&self.allowed),
            limited: get(&self.limited),
            rejected: get(&self.rejected),
            fail_open: get(&self.fail_open),
            fail_local: get(&self.fail_local),
            unavailable: get(&self.unavailable),
            store_errors: get(&self.store_errors),
        }
    }
}

/// Adds one to `counter`.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
