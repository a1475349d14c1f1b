//! HTTP integration (feature `tower`): a tower rate-limit layer for axum, hyper and tonic, the
//! IETF `RateLimit` headers, key extractors that find the real client behind proxies, and an
//! outbound layer that paces a client's own calls.
//!
//! * [`RateLimitLayer`] / [`RateLimitService`]: checks each request against its [`Limits`] —
//!   one or more [`Limit`]s, each with a [key extractor](key), a quota (or quotas per tier) and
//!   optionally a fail mode — in any [`Store`](crate::store::Store). A request passes only if
//!   every limit allows it. One line for the common cases: [`RateLimitLayer::per_client_ip`],
//!   [`RateLimitLayer::per_peer_ip`], [`RateLimitLayer::global`].
//! * Answers are rendered by [`answer`](crate::answer), the one renderer shared with the
//!   gateway and the service: the `RateLimit-Policy` / `RateLimit` fields, `Retry-After`, the
//!   fallback marker, RFC 9457 problem bodies or gRPC statuses.
//! * [`InFlightLayer`]: at most N requests in flight per key, each holding a
//!   [lease](crate::lease) until its response body ends (memory, or shared through Redis).
//! * [`key`]: peer IP, client IP behind trusted proxies, header, JWT claim, route, composites.
//! * [`outbound`]: a client-side layer that waits its turn (FIFO, bounded delay) and honours
//!   an upstream's `Retry-After`.
//!
//! # Example (axum)
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use flowgate::{http::{key::{ClientIp, Header}, Limit, Limits, RateLimitLayer}, store::MemoryStore, Quota};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The common case is one line:
//! let per_ip = RateLimitLayer::per_client_ip(["10.0.0.0/8".parse()?], Quota::per_second(50));
//! # let _ = per_ip;
//! // Several limits:
//! let limits = Limits::new()
//!     // Per client IP, believing X-Forwarded-For only from our load balancers:
//!     .limit(Limit::new("per-ip", ClientIp::new(["10.0.0.0/8".parse()?]), Quota::per_second(50)))
//!     // Per API key, by plan:
//!     .limit(
//!         Limit::tiered(
//!             "per-key",
//!             Header::new(http::HeaderName::from_static("x-api-key")),
//!             Header::new(http::HeaderName::from_static("x-plan")),
//!         )
//!         .tier("free", Quota::per_second(10).with_burst(20)?)
//!         .tier("enterprise", Quota::per_second(500).with_burst(1000)?),
//!     );
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(MemoryStore::new(), limits)?);
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
//! # let _ = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok(()) }
//! ```
//!
//! # Where the layer goes
//!
//! Requests travel inward through the layers and responses outward. Put the rate-limit layer
//! *outside* whatever is expensive (authentication that hits a database, the handler) so that
//! floods are turned away cheaply, and *inside* the timeout so that a slow store cannot hold a
//! request past its deadline:
//!
//! ```text
//!            request                                           response
//!               │                                                 ▲
//!   ┌───────────▼─────────────────────────────────────────────────┴──────────┐
//!   │ tracing / metrics          sees every request, including 429s          │
//!   │ ┌─────────────────────────────────────────────────────────────────────┐│
//!   │ │ timeout                  bounds the whole request, limit included   ││
//!   │ │ ┌─────────────────────────────────────────────────────────────────┐ ││
//!   │ │ │ RateLimitLayer        429 / 503 here; adds RateLimit headers    │ ││
//!   │ │ │ ┌─────────────────────────────────────────────────────────────┐ │ ││
//!   │ │ │ │ authentication       only requests within the limit get here│ │ ││
//!   │ │ │ │ ┌─────────────────────────────────────────────────────────┐ │ │ ││
//!   │ │ │ │ │ handler                                                 │ │ │ ││
//!   │ │ │ │ └─────────────────────────────────────────────────────────┘ │ │ ││
//!   │ │ │ └─────────────────────────────────────────────────────────────┘ │ ││
//!   │ │ └─────────────────────────────────────────────────────────────────┘ ││
//!   │ └─────────────────────────────────────────────────────────────────────┘│
//!   └────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! Limits keyed by a verified identity (a JWT claim) verify the token themselves, so they can
//! sit outside authentication too; a limit keyed by something your authentication layer
//! computes (a user id in request extensions) must sit inside it — add a second
//! `RateLimitLayer` there. In axum, layers added later wrap the earlier ones:
//! `Router::new().layer(auth).layer(rate_limit).layer(timeout)` gives the onion above. A layer
//! added with `Router::layer` runs before routing; to key by axum's `MatchedPath`, use
//! `route_layer` (or [`key::Route`] with your templates, which works anywhere).
//!
//! # Cost
//!
//! One limit in a store that decides in memory ([`MemoryStore`](crate::store::MemoryStore),
//! or any store that implements [`Store::check_now`](crate::store::Store::check_now))
//! is decided inside `call`: the key is written into a reused buffer, nothing is boxed, and the
//! only allocation is the `RateLimit` value the response carries. Other stores (Redis) and
//! several limits go through the store's futures, boxed once per request. Figures
//! against tower_governor are in `BENCHMARKS.md`.
//!
//! # Store failures
//!
//! Fail modes are applied in one place, the [`FallbackStore`](crate::store::FallbackStore):
//! wrap a store that can fail (Redis) in one, and give limits their own mode with
//! [`Limit::fail`] (the mode travels with each request to the store). While the store is away,
//! `open` lets the request through marked `Flowgate-Fallback: open`, `local` decides with this
//! instance's share of the quota (`Flowgate-Fallback: local`), `closed` answers 503 with
//! `Retry-After` (`Flowgate-Fallback: closed`). A store error that reaches the layer without a
//! fallback store is answered 503 (transient) or 500. All are counted in [`RateLimitStats`].

mod body;
mod decide;
mod error;
mod future;
mod in_flight;
pub mod key;
mod layer;
mod limits;
pub mod outbound;
mod service;
mod stats;

pub use body::ResponseBody;
pub use error::LimitsError;
pub use future::ResponseFuture;
pub use in_flight::{InFlight, InFlightFuture, InFlightLayer, LeasedBody};
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use limits::{Limit, Limits};
pub use service::RateLimitService;
pub use stats::{RateLimitStats, StatsSnapshot};
