//! [`RateLimitLayer`]: the tower layer, its one-line constructors, and its builder.

use std::sync::Arc;

use tower_layer::Layer;

use super::RateLimitService;
use super::decide::{Options, Shared};
use super::error::LimitsError;
use super::key::{ClientIp, Global, PeerIp};
use super::limits::{Limit, Limits};
use super::stats::RateLimitStats;
use crate::quota::Quota;
use crate::store::{MemoryStore, Store};

/// Applies [`Limits`] to every request: a tower [`Layer`] for axum, hyper, tonic and any other
/// tower stack. See the [module documentation](super) for where to put it.
///
/// The common cases take one line (counters in a [`MemoryStore`]):
///
/// ```
/// use flowgate::{http::RateLimitLayer, Quota};
///
/// // 10 requests per second per client IP, X-Forwarded-For believed only from 10.0.0.0/8:
/// let per_client = RateLimitLayer::per_client_ip(["10.0.0.0/8".parse()?], Quota::per_second(10));
/// // 1,000 per second for everyone together:
/// let global = RateLimitLayer::global(Quota::per_second(1_000));
/// # let _ = (per_client, global);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Anything else — several limits, tiers, costs, another store — goes through [`Limits`]:
///
/// ```
/// use flowgate::{http::{key::PeerIp, Limit, Limits, RateLimitLayer}, store::MemoryStore, Quota};
///
/// let limits = Limits::new().limit(Limit::new("per-ip", PeerIp::new(), Quota::per_second(10)));
/// let layer = RateLimitLayer::new(MemoryStore::new(), limits)?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimitLayer<St> {
    /// Store, limits, options and counters, shared by every service the layer makes.
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
            .field("limits", &self.shared.limits)
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer<MemoryStore> {
    /// `quota` per connection address (the TCP peer: no proxy is believed), named `per-ip`,
    /// counted in a new [`MemoryStore`].
    pub fn per_peer_ip(quota: Quota) -> Self {
        Self::one(Limit::new("per-ip", PeerIp::new(), quota))
    }

    /// `quota` per client IP, named `per-ip`: the connection address, or — for requests from
    /// `trusted_proxies` — the rightmost untrusted address of `X-Forwarded-For` / `Forwarded`
    /// (see [`ClientIp`]). Counted in a new [`MemoryStore`].
    pub fn per_client_ip(
        trusted_proxies: impl IntoIterator<Item = ipnet::IpNet>,
        quota: Quota,
    ) -> Self {
        Self::one(Limit::new("per-ip", ClientIp::new(trusted_proxies), quota))
    }

    /// `quota` for every request together, named `global`, counted in a new [`MemoryStore`].
    pub fn global(quota: Quota) -> Self {
        Self::one(Limit::new("global", Global::default(), quota))
    }

    /// A layer of one valid limit (a valid name, cost 1): building it cannot fail.
    fn one(limit: Limit) -> Self {
        RateLimitLayer::from_parts(
            MemoryStore::new(),
            Limits::new().limit(limit),
            Options {
                legacy_headers: false,
            },
        )
    }
}

impl<St: Store> RateLimitLayer<St> {
    /// Enforces `limits` with counters in `store`. Fails if there are no limits, a name is
    /// invalid or repeated, a tier is given to an untiered limit, a cost could never be
    /// granted, or a limit names a fail mode the store would ignore.
    ///
    /// A store error reaches clients as 503 (`Retry-After: 1`); for fail open, closed or local
    /// per limit ([`Limit::fail`]), wrap the store in a
    /// [`FallbackStore`](crate::store::FallbackStore) — a limit with a fail mode over a store
    /// that does not apply it is refused here ([`LimitsError::FailModeIgnored`]).
    pub fn new(store: St, limits: Limits) -> Result<Self, LimitsError> {
        Self::builder(store, limits).build()
    }

    /// A builder, for the legacy headers.
    pub fn builder(store: St, limits: Limits) -> RateLimitLayerBuilder<St> {
        RateLimitLayerBuilder {
            store,
            limits,
            options: Options {
                legacy_headers: false,
            },
        }
    }
}

impl<St> RateLimitLayer<St> {
    fn from_parts(store: St, limits: Limits, options: Options) -> Self {
        RateLimitLayer {
            shared: Arc::new(Shared {
                store,
                limits,
                options,
                stats: Arc::default(),
            }),
        }
    }

    /// The layer's outcome counters (shared with every service it made).
    pub fn stats(&self) -> Arc<RateLimitStats> {
        self.shared.stats.clone()
    }
}

impl<S, St> Layer<S> for RateLimitLayer<St> {
    type Service = RateLimitService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService::from_shared(inner, self.shared.clone())
    }
}

/// Builds a [`RateLimitLayer`].
#[derive(Debug)]
pub struct RateLimitLayerBuilder<St> {
    store: St,
    limits: Limits,
    options: Options,
}

impl<St: Store> RateLimitLayerBuilder<St> {
    /// Also sends `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` for the
    /// binding limit, for clients that predate the IETF fields (default: off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.options.legacy_headers = on;
        self
    }

    /// Checks the limits and builds the layer.
    pub fn build(self) -> Result<RateLimitLayer<St>, LimitsError> {
        self.limits.validate()?;
        if !self.store.applies_fail_modes()
            && let Some(limit) = self.limits.iter().find(|l| l.fail_mode().is_some())
        {
            return Err(LimitsError::FailModeIgnored(limit.name().to_owned()));
        }
        Ok(RateLimitLayer::from_parts(
            self.store,
            self.limits,
            self.options,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_line_layers_hold_valid_limits() {
        for layer in [
            RateLimitLayer::per_peer_ip(Quota::per_second(1)),
            RateLimitLayer::per_client_ip([], Quota::per_second(1)),
            RateLimitLayer::global(Quota::per_second(1)),
        ] {
            assert_eq!(layer.shared.limits.validate(), Ok(()));
        }
    }

    /// A store that reports its outages instead of applying fail modes.
    struct Remote;

    impl Store for Remote {
        async fn check(
            &self,
            _: crate::store::Ask<'_>,
        ) -> Result<crate::Decision, crate::store::StoreError> {
            Err(crate::store::StoreError::Unavailable("away".into()))
        }
        async fn refund(&self, _: crate::store::Ask<'_>) -> Result<(), crate::store::StoreError> {
            Ok(())
        }
        async fn reset(&self, _: crate::store::Ask<'_>) -> Result<(), crate::store::StoreError> {
            Ok(())
        }
    }

    #[test]
    fn a_fail_mode_the_store_would_ignore_is_refused() {
        use crate::FailMode;
        let limit = || Limit::new("all", Global::default(), Quota::per_second(5));
        let with_mode = || Limits::new().limit(limit().fail(FailMode::Local));
        assert_eq!(
            RateLimitLayer::new(Remote, with_mode()).err(),
            Some(LimitsError::FailModeIgnored("all".into()))
        );
        assert!(RateLimitLayer::new(Remote, Limits::new().limit(limit())).is_ok());
        let fallback = crate::store::FallbackStore::builder(Remote).build();
        assert!(RateLimitLayer::new(fallback, with_mode()).is_ok());
        assert!(RateLimitLayer::new(crate::store::MemoryStore::new(), with_mode()).is_ok());
    }
}
