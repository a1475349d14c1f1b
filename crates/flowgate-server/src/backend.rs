//! Where the service counts: this process's memory (the embedded default), or a store shared by
//! several instances (Redis, Redis Cluster) behind a circuit breaker and each rule's `fail` mode.

use std::sync::Arc;
use std::time::Duration;

use flowgate::FailMode;
use flowgate::policy::descriptor::{self, Descriptor, Verdict};
use flowgate::policy::rules::RuleSet;
use flowgate::store::{
    Acquire, DynStore, FallbackStats, FallbackStore, MemoryStore, Store, StoreError,
};
use flowgate::{Decision, Quota};

/// The service's store.
#[derive(Clone)]
pub enum Backend {
    /// Counters in this process only.
    Local(SharedStore),
    /// Counters in a store shared by several instances: while it is away (errors, timeouts, an
    /// open breaker), each rule's `fail` mode decides (default: the one given at start).
    Shared(Arc<FallbackStore<SharedStore>>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Local(_) => f.write_str("Backend::Local"),
            Backend::Shared(store) => f
                .debug_tuple("Backend::Shared")
                .field(&store.stats())
                .finish(),
        }
    }
}

impl Default for Backend {
    /// The embedded in-memory store.
    fn default() -> Self {
        Backend::Local(SharedStore(Arc::new(MemoryStore::new())))
    }
}

/// How a [`Backend::Shared`] store falls back; see [`Backend::shared`].
#[derive(Debug, Clone, Copy)]
pub struct SharedOptions {
    /// The mode of rules that set no `fail`.
    pub fail: FailMode,
    /// Service instances sharing the store: `fail: local` grants each `1 / instances` of a quota.
    pub instances: u64,
}

impl Default for SharedOptions {
    fn default() -> Self {
        SharedOptions {
            fail: FailMode::Open,
            instances: 1,
        }
    }
}

impl Backend {
    /// Counters in `store`, this process only (no fallback: the store is expected not to fail).
    pub fn local(store: Arc<dyn DynStore>) -> Self {
        Backend::Local(SharedStore(store))
    }

    /// Counters in `store`, shared with other instances, behind a breaker and `options`.
    pub fn shared(store: Arc<dyn DynStore>, options: SharedOptions) -> Self {
        Backend::Shared(Arc::new(
            FallbackStore::builder(SharedStore(store))
                .fail(options.fail)
                .instances(options.instances.max(1))
                .build(),
        ))
    }

    /// Checks `descriptors` against `rules` (see [`descriptor::check`]).
    pub async fn check<'r>(
        &self,
        rules: &'r RuleSet,
        domain: &str,
        descriptors: &[Descriptor],
        hits_addend: u64,
    ) -> Verdict<'r> {
        match self {
            Backend::Local(store) => {
                descriptor::check(rules, store, domain, descriptors, hits_addend).await
            }
            Backend::Shared(store) => {
                descriptor::check_with_fallback(rules, &**store, domain, descriptors, hits_addend)
                    .await
            }
        }
    }

    /// Whether the store itself (not its fallback) answers within `timeout`: a zero-cost peek
    /// of a probe key.
    pub async fn reachable(&self, timeout: Duration) -> bool {
        let Ok(quota) = Quota::per_second(1) else {
            return false;
        };
        let store = match self {
            Backend::Local(store) => store,
            Backend::Shared(store) => store.inner(),
        };
        matches!(
            tokio::time::timeout(timeout, store.peek("flowgate:readyz", &quota)).await,
            Ok(Ok(_))
        )
    }

    /// The fallback's counts, for a shared store.
    pub fn fallback_stats(&self) -> Option<FallbackStats> {
        match self {
            Backend::Local(_) => None,
            Backend::Shared(store) => Some(store.stats()),
        }
    }

    /// A short name for logs and `/readyz`: `local` or `shared`.
    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Local(_) => "local",
            Backend::Shared(_) => "shared",
        }
    }
}

/// `Arc<dyn DynStore>` as a [`Store`] of a named type, which keeps the futures of the API
/// handlers provably `Send` (rustc cannot prove it through the library's blanket
/// `Store for Arc<dyn DynStore>` inside `async` handlers).
#[derive(Clone)]
pub struct SharedStore(pub Arc<dyn DynStore>);

impl Store for SharedStore {
    async fn acquire(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, StoreError> {
        self.0.acquire_boxed(key, quota, cost).await
    }

    async fn acquire_many(&self, requests: &[Acquire<'_>]) -> Vec<Result<Decision, StoreError>> {
        self.0.acquire_many_boxed(requests).await
    }

    async fn refund(&self, key: &str, quota: &Quota, units: u64) -> Result<(), StoreError> {
        self.0.refund_boxed(key, quota, units).await
    }

    async fn reset(&self, key: &str, quota: &Quota) -> Result<(), StoreError> {
        self.0.reset_boxed(key, quota).await
    }
}
