//! Outbound limiting: pace your own calls to a rate-limited upstream (a bank's API, an SMS
//! gateway) instead of being refused by it.
//!
//! [`OutboundLimitLayer`] wraps an HTTP client (hyper-util's, reqwest's tower service, any
//! `Service<http::Request<B>>`). Each request takes its turn when it is made — turns are handed
//! out in call order, so requests leave first come, first served — and waits for it, at most
//! `max_delay`; beyond that it fails at once with [`OutboundError::DelayTooLong`] rather than
//! waiting in vain. Turns come from a GCRA bucket per key ([`crate::local::RateLimiter`]
//! reservations), so a quiet spell allows a burst of `burst` requests and then the steady rate.
//!
//! When the upstream answers `429` (or `503`) with `Retry-After`, the key is paused for that
//! long: its bucket's clock stands still, so waiting requests move back by the pause and resume
//! at the steady rate afterwards — no burst into an upstream that just asked for quiet. A
//! request whose turn would then fall beyond its deadline fails with
//! [`OutboundError::DelayTooLong`]; new requests during a pause longer than `max_delay` fail
//! with [`OutboundError::Paused`]. The 429 response itself is returned to the caller (add a
//! retry layer outside this one to retry it).
//!
//! Waiting uses tokio's timer: call the service from within a tokio runtime.

mod clock;
mod error;
mod layer;
mod service;

pub use error::OutboundError;
pub use layer::{
    DEFAULT_MAX_DELAY, DEFAULT_MAX_QUEUE, DEFAULT_MAX_UPSTREAMS, OutboundLimitLayer,
    OutboundLimitLayerBuilder,
};
pub use service::{BoxError, OutboundLimit, ResponseFuture};
