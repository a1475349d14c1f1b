//! # Flowgate
//!
//! Rate limiting that is correct to the request.
//!
//! * **Algorithms** ([`algorithm`]): GCRA (token bucket), leaky bucket, fixed window,
//!   sliding-window counter and sliding log — each a compact state and one pure transition over
//!   an injected [`clock`].
//! * **In-process limiters** ([`local`]): [`RateLimiter`] for one limit and
//!   [`KeyedRateLimiter`] for millions of keys in bounded memory; lock-free, no allocation per
//!   check; waiting, reservations and shaping with the `tokio` feature.
//! * **Stores** ([`store`]): the [`Store`](store::Store) trait for limits shared across tasks
//!   and machines, with an embedded [`MemoryStore`](store::MemoryStore), Redis (feature
//!   `redis`) and the [`FallbackStore`](store::FallbackStore) that applies fail modes.
//! * **Simulation** (`simulate`, feature `simulate`): the same traffic through every algorithm
//!   and deployment on a simulated clock, to see how they differ before choosing.
//! * **Top keys** (`top`, feature `top`): the most limited keys of an unbounded stream in
//!   fixed memory (Space-Saving), cheap to feed from many threads.
//! * **The request pipeline** ([`pipeline`]): a request against every limit it falls under —
//!   all must allow, nothing is consumed when one denies — decided at once where the store
//!   allows; every front end (tower layer, gateway, service APIs, WebSocket) goes through it.
//! * **Answers** (`answer`, feature `answer`): the one renderer of decisions into the IETF
//!   `RateLimit` fields, `Retry-After`, problem+json bodies and gRPC statuses.
//! * **Envoy's quota protocol** ([`rlqs`]): one limit divided among the Envoys that enforce it
//!   themselves (RLQS): fair shares from reported demand, kept within a documented bound
//!   across Flowgate instances by the shared store.
//! * **Envoy's rate-limit model** (`envoy`, feature `envoy`): envoyproxy/ratelimit's domains,
//!   descriptors and rule trees.
//! * **WebSocket** (`ws`, feature `ws`): limits per connection, IP, user, room, slowmode and
//!   role, message costs, error frames and close codes, transport-agnostic.
//! * **Settings** (`settings`, feature `serde`): `Deserialize` for [`Quota`] and (with `ws`)
//!   the WebSocket policy, so a configuration file holds the same model as the code.
//! * **HTTP** (`http`, feature `tower`): a tower rate-limit layer for axum, hyper and tonic
//!   with the IETF `RateLimit` headers and problem+json refusals, key extractors that find the
//!   client behind trusted proxies, and an outbound layer that paces a client's own calls.
//!
//! The verbs are the same everywhere: `check` asks for units and takes them if granted
//! (answering a [`Decision`]), `try_check` is the leanest check, `peek` takes nothing,
//! `until_ready` waits, `reserve` takes ahead of time, `refund` gives back, `reset` forgets.
//!
//! ```
//! use flowgate::{Algorithm, KeyedRateLimiter, Quota};
//!
//! // 100 requests per minute per client, as an exact sliding log.
//! let quota = Quota::per_minute(100).with_algorithm(Algorithm::SlidingLog)?;
//! let limiter = KeyedRateLimiter::<String>::new(quota);
//! let decision = limiter.check_key("client-7");
//! assert!(decision.allowed);
//! assert_eq!(decision.remaining, 99);
//! # Ok::<(), flowgate::QuotaError>(())
//! ```
//!
//! ## Defaults
//!
//! One default per concept: [`Algorithm::default`] is GCRA (in the library and the service);
//! [`FailMode::default`] is open; [`DEFAULT_MAX_KEYS`] (2²⁰) bounds a keyed limiter and each
//! algorithm's map in the memory store; the clock is [`MonotonicClock`](clock::MonotonicClock).
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
#[cfg(feature = "answer")]
#[cfg_attr(docsrs, doc(cfg(feature = "answer")))]
pub mod answer;
#[cfg(feature = "calendar")]
#[cfg_attr(docsrs, doc(cfg(feature = "calendar")))]
pub mod calendar;
#[cfg(not(feature = "calendar"))]
#[path = "calendar_off.rs"]
mod calendar;
pub mod clock;
pub mod decision;
#[cfg(feature = "envoy")]
pub mod envoy;
#[cfg(feature = "tower")]
pub mod http;
pub mod lease;
pub mod local;
pub mod pipeline;
pub mod quota;
pub mod rlqs;
#[cfg(any(feature = "answer", feature = "envoy"))]
mod scratch;
#[cfg(feature = "serde")]
pub mod settings;
#[cfg(feature = "simulate")]
pub mod simulate;
pub mod store;
#[cfg(feature = "top")]
pub mod top;
#[cfg(feature = "ws")]
pub mod ws;

// docs/migration.md's examples run as doc-tests (governor and tower_governor are
// dev-dependencies), so the guide cannot drift from either API.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../../docs/migration.md")]
mod migration_guide {}

pub use decision::{Decision, Denied, FailMode};
pub use local::{DEFAULT_MAX_KEYS, KeyedRateLimiter, RateLimiter};
pub use quota::{Algorithm, InsufficientCapacity, Quota, QuotaError};
