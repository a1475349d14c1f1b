//! [`RateLimitLayer`]: the tower layer, and its builder.

use std::sync::Arc;

use tower_layer::Layer;

use super::RateLimit;
use super::check::{Options, Shared};
use super::error::PolicyError;
use super::policy::Policy;
use super::stats::RateLimitStats;
use crate::decision::FailMode;
use crate::store::Store;

/// Applies a [`Policy`] to every request: a tower [`Layer`] for axum, hyper, tonic and any
/// other tower stack. See the [module documentation](super) for where to put it.
///
/// ```
/// use flowgate::{http::{key::PeerIp, Limit, Policy, RateLimitLayer}, store::MemoryStore, Quota};
///
/// let policy = Policy::new().limit(Limit::new("per-ip", PeerIp::new(), Quota::per_second(10)?));
/// let layer = RateLimitLayer::new(MemoryStore::new(), policy)?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimitLayer<St> {
    /// Store, policy, options and counters, shared by every service the layer makes.
    shared: Arc<Shared<St>>,
}

impl<St> Clone for RateLimitLayer<St> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<St> std::fmt::Debug for RateLimitLayer<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policy", &self.shared.policy)
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl<St: Store> RateLimitLayer<St> {
    /// Enforces `policy` with counters in `store`, failing closed (503) when the store is
    /// unavailable. Fails if the policy is empty, has invalid or duplicate names, or a cost no
    /// quota could ever grant.
    pub fn new(store: St, policy: Policy) -> Result<Self, PolicyError> {
        Self::builder(store, policy).build()
    }

    /// A builder, for the fail mode and legacy headers.
    pub fn builder(store: St, policy: Policy) -> RateLimitLayerBuilder<St> {
        RateLimitLayerBuilder {
            store,
            policy,
            options: Options {
                on_store_error: FailMode::Closed,
                legacy_headers: false,
            },
        }
    }

    /// The layer's outcome counters (shared with every service it made).
    pub fn stats(&self) -> Arc<RateLimitStats> {
        self.shared.stats.clone()
    }
}

impl<S, St> Layer<S> for RateLimitLayer<St> {
    type Service = RateLimit<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_shared(inner, self.shared.clone())
    }
}

/// Builds a [`RateLimitLayer`].
#[derive(Debug)]
pub struct RateLimitLayerBuilder<St> {
    store: St,
    policy: Policy,
    options: Options,
}

impl<St: Store> RateLimitLayerBuilder<St> {
    /// What a transient store error (timeout, unreachable) does to a request:
    /// [`FailMode::Open`] lets it through, marked with `Flowgate-Fallback: open` and counted in
    /// [`StatsSnapshot::fail_open`](super::StatsSnapshot::fail_open); [`FailMode::Closed`]
    /// (the default) answers 503 with a problem body. For [`FailMode::Local`], wrap the store in
    /// the fallback store, which decides locally and marks its decisions; errors that still reach
    /// the layer are then answered 503.
    pub fn on_store_error(mut self, mode: FailMode) -> Self {
        self.options.on_store_error = mode;
        self
    }

    /// Also sends `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` for the
    /// binding limit, for clients that predate the IETF fields (default: off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.options.legacy_headers = on;
        self
    }

    /// Checks the policy and builds the layer.
    pub fn build(self) -> Result<RateLimitLayer<St>, PolicyError> {
        self.policy.validate()?;
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                store: self.store,
                policy: self.policy,
                options: self.options,
                stats: Arc::default(),
            }),
        })
    }
}
