//! # Flowgate
//!
//! Rate limiting that is correct to the request.
//!
//! * **Algorithms** ([`algorithm`]): GCRA (token bucket), leaky bucket, fixed window,
//!   sliding-window counter and sliding log — each a compact state and one pure transition over
//!   an injected [`clock`].
//! * **In-process limiters** ([`local`]): [`RateLimiter`](local::RateLimiter) for one limit and
//!   [`KeyedRateLimiter`](local::KeyedRateLimiter) for millions of keys in bounded memory;
//!   lock-free, no allocation per check; waiting and shaping with the `tokio` feature.
//! * **Stores** ([`store`]): the [`Store`](store::Store) trait for limits shared across tasks
//!   and machines, with an embedded [`MemoryStore`](store::MemoryStore).
//! * **HTTP** (`http`, feature `tower`): a tower rate-limit layer for axum, hyper and tonic
//!   with the IETF `RateLimit` headers and problem+json refusals, key extractors that find the
//!   client behind trusted proxies, and an outbound layer that paces a client's own calls.
//!
//! ```
//! use flowgate::{local::KeyedRateLimiter, Algorithm, Quota};
//!
//! // 100 requests per minute per client, as an exact sliding log.
//! let quota = Quota::per_minute(100)?.with_algorithm(Algorithm::SlidingLog)?;
//! let limiter = KeyedRateLimiter::<String>::new(quota);
//! let decision = limiter.check_key("client-7");
//! assert!(decision.allowed);
//! assert_eq!(decision.remaining, 99);
//! # Ok::<(), flowgate::QuotaError>(())
//! ```
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

pub mod algorithm;
pub mod clock;
pub mod decision;
#[cfg(feature = "tower")]
pub mod http;
pub mod local;
pub mod policy;
pub mod quota;
pub mod store;

pub use decision::{Decision, Denied, FailMode};
pub use quota::{Algorithm, InsufficientCapacity, Quota, QuotaError};
