//! Errors of the rate-limit layer: [`Limits`](super::Limits) that cannot be enforced.
//!
//! The layer itself never fails a request with an error: denials, rejected keys and store
//! failures all become responses (429, 400/401, 503) with problem bodies, so the service's
//! error type is the inner service's.

use crate::quota::InsufficientCapacity;

/// Why [`Limits`](super::Limits) were refused when building the layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    /// There are no limits.
    #[error("no limits to enforce")]
    Empty,
    /// A limit's name is not 1–64 of ASCII letters, digits, `-`, `_`, `.`, `/`.
    #[error("limit name `{0}` must be 1-64 ASCII letters, digits, `-`, `_`, `.` or `/`")]
    InvalidName(String),
    /// Two limits share a name (their counters and headers would be confused).
    #[error("two limits are named `{0}`")]
    DuplicateName(String),
    /// A tier value is empty or `*` (reserved for `otherwise`).
    #[error("limit `{limit}`: tier `{tier}` must be non-empty and not `*`")]
    InvalidTier {
        /// The limit.
        limit: String,
        /// The tier value.
        tier: String,
    },
    /// `tier` or `otherwise` was called on a limit made with `Limit::new` (one quota for every
    /// key), where it would be ignored.
    #[error("limit `{limit}` has one quota for every key; `{method}` needs `Limit::tiered`")]
    NotTiered {
        /// The limit.
        limit: String,
        /// `tier` or `otherwise`.
        method: &'static str,
    },
    /// A limit's cost exceeds one of its quotas' burst: no request could ever pass.
    #[error("limit `{limit}`: {source}")]
    CostExceedsBurst {
        /// The limit.
        limit: String,
        /// The cost and the burst.
        source: InsufficientCapacity,
    },
    /// A limit names a fail mode ([`Limit::fail`](super::Limit::fail)) but the store would
    /// ignore it (a Redis store on its own): wrap the store in a
    /// [`FallbackStore`](crate::store::FallbackStore), or drop the mode.
    #[error(
        "limit `{0}` sets a fail mode, which this store does not apply: wrap it in a FallbackStore"
    )]
    FailModeIgnored(String),
}
