//! Where limits are kept when several tasks, processes or machines must share them.
//!
//! [`Store`] is the one trait every backend implements: [`MemoryStore`] (embedded, the
//! default) and, behind features, Redis. A store is handed the quota on every call, so the same
//! store serves any number of limits, and every store takes the same decisions for the same
//! trace of calls — `tests/conformance.rs` runs one table of traces against each of them.

pub mod fallback;
#[cfg(feature = "redis")]
pub mod hybrid;
mod memory;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use fallback::{FallbackStats, FallbackStore, FallbackStoreBuilder};
#[cfg(feature = "redis")]
pub use hybrid::{HybridStore, HybridStoreBuilder};
pub use memory::{DEFAULT_MAX_KEYS, MemoryStore, MemoryStoreBuilder};
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreBuilder};

use crate::decision::Decision;
use crate::quota::{InsufficientCapacity, Quota};

/// Why a store could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The cost exceeds the quota's burst: it can never be granted. Not transient.
    #[error(transparent)]
    Capacity(#[from] InsufficientCapacity),
    /// The store did not answer in time. Transient.
    #[error("the store did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The store cannot be reached (connection refused or lost, circuit breaker open).
    /// Transient.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// The store answered with an error that retrying will not fix (a script error, a key of
    /// the wrong type). Not transient.
    #[error("the store failed: {0}")]
    Backend(String),
}

impl StoreError {
    /// Whether trying again later may succeed: timeouts and unreachable stores. Fail-open,
    /// fail-closed and local fallback apply to transient errors only.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Unavailable(_))
    }
}

/// One request in a batch for [`Store::acquire_many`].
#[derive(Debug, Clone, Copy)]
pub struct Acquire<'a> {
    /// The counter's key.
    pub key: &'a str,
    /// The quota to enforce on it.
    pub quota: &'a Quota,
    /// Units asked for (0 peeks).
    pub cost: u64,
}

/// A place to keep limits' state: the embedded [`MemoryStore`], Redis, or your own.
///
/// Every method is given the quota, so one store serves any number of limits; a key must always
/// be used with the same algorithm (the policy layer builds keys that guarantee it).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flowgate::{store::{MemoryStore, Store}, Quota};
/// let store = MemoryStore::new();
/// let quota = Quota::per_minute(100)?;
/// let decision = store.acquire("tenant:42", &quota, 1).await?;
/// assert!(decision.allowed);
/// assert_eq!(decision.remaining, 99);
/// # Ok(()) }
/// ```
pub trait Store: Send + Sync + 'static {
    /// Asks for `cost` units of `key`'s `quota`. A denial is `Ok` with `allowed == false`;
    /// `cost > burst` is [`StoreError::Capacity`].
    fn acquire(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// The answer to [`acquire`](Self::acquire) without waiting, from a store that decides in
    /// memory; `None` (the default) when the store has to be asked asynchronously. When it
    /// answers, it has taken the units exactly as `acquire` would have. Callers on a hot path
    /// (the HTTP layer) try it first, which spares them boxing `acquire`'s future.
    ///
    /// ```
    /// use flowgate::{store::{MemoryStore, Store}, Quota};
    /// let store = MemoryStore::new();
    /// let quota = Quota::per_minute(100)?;
    /// let decision = store.try_acquire_now("tenant:42", &quota, 1).expect("in memory")?;
    /// assert_eq!(decision.remaining, 99);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn try_acquire_now(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (key, quota, cost);
        None
    }

    /// Asks for several counters at once, each decided on its own (not all-or-nothing). Stores
    /// that talk to a server send them together; the default asks one after another. Requests
    /// for the same key within one call may be decided in either order, as concurrent calls
    /// would be.
    fn acquire_many(
        &self,
        requests: &[Acquire<'_>],
    ) -> impl Future<Output = Vec<Result<Decision, StoreError>>> + Send {
        async move {
            let mut decisions = Vec::with_capacity(requests.len());
            for request in requests {
                decisions.push(self.acquire(request.key, request.quota, request.cost).await);
            }
            decisions
        }
    }

    /// What a request would be told now, taking nothing.
    fn peek(
        &self,
        key: &str,
        quota: &Quota,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.acquire(key, quota, 0)
    }

    /// Gives back `units` taken earlier (a request another limit denied, cancelled work).
    fn refund(
        &self,
        key: &str,
        quota: &Quota,
        units: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Forgets `key`: its next request sees the full quota.
    fn reset(
        &self,
        key: &str,
        quota: &Quota,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A boxed future, for [`DynStore`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Store`] in a form that can be a trait object (`Arc<dyn DynStore>`), for choosing the
/// backend at run time. Every `Store` is a `DynStore`, and `Arc<dyn DynStore>` is a `Store`.
pub trait DynStore: Send + Sync + 'static {
    /// See [`Store::acquire`].
    fn acquire_boxed<'a>(
        &'a self,
        key: &'a str,
        quota: &'a Quota,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;
    /// See [`Store::try_acquire_now`].
    fn try_acquire_now_dyn(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>>;
    /// See [`Store::acquire_many`].
    fn acquire_many_boxed<'a>(
        &'a self,
        requests: &'a [Acquire<'a>],
    ) -> BoxFuture<'a, Vec<Result<Decision, StoreError>>>;
    /// See [`Store::refund`].
    fn refund_boxed<'a>(
        &'a self,
        key: &'a str,
        quota: &'a Quota,
        units: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    /// See [`Store::reset`].
    fn reset_boxed<'a>(
        &'a self,
        key: &'a str,
        quota: &'a Quota,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

impl<S: Store> DynStore for S {
    fn acquire_boxed<'a>(
        &'a self,
        key: &'a str,
        quota: &'a Quota,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.acquire(key, quota, cost))
    }
    fn try_acquire_now_dyn(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        self.try_acquire_now(key, quota, cost)
    }
    fn acquire_many_boxed<'a>(
        &'a self,
        requests: &'a [Acquire<'a>],
    ) -> BoxFuture<'a, Vec<Result<Decision, StoreError>>> {
        Box::pin(self.acquire_many(requests))
    }
    fn refund_boxed<'a>(
        &'a self,
        key: &'a str,
        quota: &'a Quota,
        units: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.refund(key, quota, units))
    }
    fn reset_boxed<'a>(
        &'a self,
        key: &'a str,
        quota: &'a Quota,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.reset(key, quota))
    }
}

impl Store for Arc<dyn DynStore> {
    async fn acquire(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, StoreError> {
        (**self).acquire_boxed(key, quota, cost).await
    }
    fn try_acquire_now(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        (**self).try_acquire_now_dyn(key, quota, cost)
    }
    async fn acquire_many(&self, requests: &[Acquire<'_>]) -> Vec<Result<Decision, StoreError>> {
        (**self).acquire_many_boxed(requests).await
    }
    async fn refund(&self, key: &str, quota: &Quota, units: u64) -> Result<(), StoreError> {
        (**self).refund_boxed(key, quota, units).await
    }
    async fn reset(&self, key: &str, quota: &Quota) -> Result<(), StoreError> {
        (**self).reset_boxed(key, quota).await
    }
}
