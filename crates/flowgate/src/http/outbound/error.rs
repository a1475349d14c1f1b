//! [`OutboundError`]: why the outbound layer did not send a request.

use std::time::Duration;

use crate::http::key::KeyRejection;
use crate::quota::InsufficientCapacity;

/// Why [`OutboundLimit`](super::OutboundLimit) gave up on a request without sending it. The
/// service's error is a `BoxError`; downcast it to this type to tell these apart from the
/// inner client's errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    /// The request would wait longer than the configured maximum delay for its turn.
    #[error(
        "the request would wait {delay:?} for its turn, more than the maximum of {max_delay:?}"
    )]
    DelayTooLong {
        /// How long it would have waited (at least).
        delay: Duration,
        /// The configured maximum.
        max_delay: Duration,
    },
    /// The upstream asked us (with `Retry-After`) to wait longer than the maximum delay.
    #[error(
        "the upstream asked to pause for another {remaining:?}, more than the maximum delay of {max_delay:?}"
    )]
    Paused {
        /// How much longer the pause lasts.
        remaining: Duration,
        /// The configured maximum delay.
        max_delay: Duration,
    },
    /// `max_queue` requests to this key are already waiting.
    #[error("{max_queue} requests are already waiting for this upstream")]
    QueueFull {
        /// The configured queue length.
        max_queue: usize,
    },
    /// The request's cost exceeds the quota's burst: it could never be sent.
    #[error(transparent)]
    Capacity(#[from] InsufficientCapacity),
    /// The request's key could not be read (e.g. no host).
    #[error("no key for the request: {0}")]
    Key(#[from] KeyRejection),
    /// The layer already tracks `max_keys` upstreams, all of them busy.
    #[error("already pacing {max_keys} upstreams, all busy")]
    TooManyKeys {
        /// The configured bound.
        max_keys: usize,
    },
}
