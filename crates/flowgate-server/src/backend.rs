//! Where the service counts: this process's memory (the embedded default), or a store shared by
//! several instances (Redis, Redis Cluster) behind the library's
//! [`FallbackStore`], which applies each rule's `fail` mode
//! (the mode travels with each request, [`Ask::fail`](flowgate::store::Ask::fail)).

use std::sync::Arc;
use std::time::Duration;

use flowgate::clock::{Clock, PreciseClock};
use flowgate::local::TableStats;
use flowgate::rlqs::Ledger;
use flowgate::store::{DynStore, FallbackStats, FallbackStore, MemoryStore, Store};
use flowgate::{FailMode, Quota};

/// The service's store: one [`DynStore`] that every request goes to, and — for a shared store
/// — the fallback wrapped around it, for health and metrics.
#[derive(Clone)]
pub struct Backend {
    /// What requests are checked in: the memory store, or the fallback store over a shared one.
    store: Arc<dyn DynStore>,
    /// The fallback store, when the counters are shared.
    shared: Option<Arc<FallbackStore<Arc<dyn DynStore>, PreciseClock>>>,
    /// The memory store's size and evictions, when the counters are in this process's memory
    /// store (for `/metrics`).
    memory: Option<Arc<dyn Fn() -> TableStats + Send + Sync>>,
    /// Where RLQS divisions are shared with other instances (the shared store's); `None`:
    /// this process only.
    quota_ledger: Option<Arc<dyn Ledger>>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("kind", &self.kind())
            .field("fallback", &self.fallback_stats())
            .finish()
    }
}

impl Default for Backend {
    /// The embedded in-memory store, on a precise clock: a decision in the service costs
    /// microseconds, so a time-stamp read per decision is noise, and the library's default
    /// clock would start a thread that wakes every millisecond (1.9 % of a pinned core while
    /// idle, preempting the worker on it).
    fn default() -> Self {
        Backend::memory(Arc::new(
            MemoryStore::builder().clock(PreciseClock::new()).build(),
        ))
    }
}

/// How a shared store falls back; see [`Backend::shared`].
#[derive(Debug, Clone, Copy)]
pub struct SharedOptions {
    /// The mode of rules that set no `fail` (default: [`FailMode::default()`], open).
    pub fail: FailMode,
    /// Service instances sharing the store: `fail: local` grants each `1 / instances` of a quota.
    pub instances: u64,
}

impl Default for SharedOptions {
    fn default() -> Self {
        SharedOptions {
            fail: FailMode::default(),
            instances: 1,
        }
    }
}

impl Backend {
    /// Counters in `store`, this process only (no fallback: the store is expected not to fail).
    pub fn local(store: Arc<dyn DynStore>) -> Self {
        Backend {
            store,
            shared: None,
            memory: None,
            quota_ledger: None,
        }
    }

    /// Counters in this process's memory store (bounded by its `max_keys` per algorithm),
    /// whose size and evictions `/metrics` reports.
    pub fn memory<C: Clock + 'static>(store: Arc<MemoryStore<C>>) -> Self {
        let stats = store.clone();
        Backend {
            store,
            shared: None,
            memory: Some(Arc::new(move || stats.stats())),
            quota_ledger: None,
        }
    }

    /// Counters in `store`, shared with other instances, behind a breaker and `options`.
    pub fn shared(store: Arc<dyn DynStore>, options: SharedOptions) -> Self {
        let fallback = Arc::new(
            FallbackStore::builder(store)
                .clock(PreciseClock::new())
                .fail(options.fail)
                .instances(options.instances.max(1))
                .build(),
        );
        Backend {
            store: fallback.clone(),
            shared: Some(fallback),
            memory: None,
            quota_ledger: None,
        }
    }

    /// The same backend, sharing RLQS divisions through `ledger` (the shared store's:
    /// [`RedisStore::quota_ledger`](flowgate::store::RedisStore::quota_ledger)).
    pub fn with_quota_ledger(mut self, ledger: Arc<dyn Ledger>) -> Self {
        self.quota_ledger = Some(ledger);
        self
    }

    /// Where RLQS divisions are shared, when they are.
    pub fn quota_ledger(&self) -> Option<Arc<dyn Ledger>> {
        self.quota_ledger.clone()
    }

    /// The store every request is checked in.
    pub fn store(&self) -> &(dyn DynStore + 'static) {
        &*self.store
    }

    /// Whether the store itself (not its fallback) answers within `timeout`: a zero-cost peek
    /// of a probe key.
    pub async fn reachable(&self, timeout: Duration) -> bool {
        let quota = Quota::per_second(1);
        let store: &(dyn DynStore + 'static) = match &self.shared {
            Some(fallback) => &**fallback.inner(),
            None => &*self.store,
        };
        matches!(
            tokio::time::timeout(timeout, store.peek("flowgate:readyz", &quota)).await,
            Ok(Ok(_))
        )
    }

    /// The memory store's size and evictions, for counters in memory ([`Backend::memory`]).
    pub fn memory_stats(&self) -> Option<TableStats> {
        self.memory.as_ref().map(|stats| stats())
    }

    /// The fallback's counts, for a shared store.
    pub fn fallback_stats(&self) -> Option<FallbackStats> {
        self.shared.as_ref().map(|f| f.stats())
    }

    /// A short name for logs and `/readyz`: `local` or `shared`.
    pub fn kind(&self) -> &'static str {
        match self.shared {
            None => "local",
            Some(_) => "shared",
        }
    }
}
