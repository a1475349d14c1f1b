//! In-process limiters: no store, no network, no allocation per check.
//!
//! * [`RateLimiter`]: one limit for the whole process (an outbound API's quota, a job queue).
//! * [`KeyedRateLimiter`]: one limit per key (per client IP, per API key, per user) for millions
//!   of keys in bounded memory.
//! * With the `tokio` feature: `until_ready` (and keyed, `n`-unit and jittered variants) and
//!   `reserve` to wait for capacity instead of being denied, on both limiters alike, and
//!   [`Shaper`], a leaky-bucket queue that delays requests to a steady rate.
//!
//! The verbs, the same on every limiter and store: `check` asks for units and takes them if
//! granted (a [`Decision`](crate::Decision)); `try_check` does the same on the leanest path
//! (`Ok` or how long to wait); `peek` checks without taking; `until_ready` waits until granted;
//! `reserve` takes units ahead of time; `refund` gives units back; `reset` forgets.
//!
//! Every limiter takes a [`Quota`](crate::Quota) with any [`Algorithm`](crate::Algorithm).
//! GCRA's state is one word updated by compare-and-swap; the leaky bucket and the window
//! algorithms use a 128-bit compare-and-swap; the sliding log, which keeps a time stamp per
//! request, a short mutex per key.

mod cell;
mod direct;
mod keyed;
#[cfg(any(feature = "tokio", feature = "simulate"))]
pub(crate) mod queue;
#[cfg(feature = "tokio")]
mod shaper;
pub(crate) mod table;
#[cfg(feature = "tokio")]
mod wait;

pub use direct::RateLimiter;
pub use keyed::{DEFAULT_MAX_KEYS, KeyedRateLimiter, KeyedRateLimiterBuilder};
#[cfg(feature = "tokio")]
pub use shaper::{ShapeError, Shaper};
pub use table::TableStats;
#[cfg(feature = "tokio")]
pub use wait::{Reservation, ReserveError};

pub(crate) use cell::{Cell, FixedCell, GcraCell, LeakyCell, LogCell, SlidingCell};

#[doc(hidden)]
pub mod __private {
    //! Internals exposed for the crate's loom model test only. Not a public API.
    pub use super::cell::{MODEL_GCRA_FRESH, model_gcra_check};
}

/// Calls `$body` with `$c` bound to the inner value of whichever variant `$value` is, for enums
/// with one variant per algorithm family: `Gcra`, `Leaky`, `Fixed`, `Sliding`, `Log`.
macro_rules! per_algorithm {
    ($enum:ident, $value:expr, $c:ident => $body:expr) => {
        match $value {
            $enum::Gcra($c) => $body,
            $enum::Leaky($c) => $body,
            $enum::Fixed($c) => $body,
            $enum::Sliding($c) => $body,
            $enum::Log($c) => $body,
        }
    };
}
pub(crate) use per_algorithm;

/// Converts a clock's lag to the `Duration` that decisions carry, for the re-check rule:
/// a denial with `retry_after` within the lag is re-checked with a precise reading.
pub(crate) fn lag_of(clock: &impl crate::clock::Clock) -> std::time::Duration {
    std::time::Duration::from_nanos(clock.max_lag())
}

/// Decides on the clock's cheap reading, re-checking with a precise one if the answer was a
/// denial that a lagging reading could have caused.
#[inline]
pub(crate) fn decide<C: crate::clock::Clock>(
    clock: &C,
    lag: std::time::Duration,
    f: impl Fn(crate::clock::Nanos) -> crate::Decision,
) -> crate::Decision {
    let decision = f(clock.recent());
    if decision.allowed || decision.retry_after > lag {
        decision
    } else {
        recheck(clock, f)
    }
}

/// [`decide`] for the lean fast path: `f` grants (`Ok`) or returns the wait in nanoseconds.
#[inline]
pub(crate) fn try_decide<C: crate::clock::Clock>(
    clock: &C,
    lag: crate::clock::Nanos,
    f: impl Fn(crate::clock::Nanos) -> Result<(), crate::clock::Nanos>,
) -> Result<(), crate::Denied> {
    match f(clock.recent()) {
        Ok(()) => Ok(()),
        Err(wait) if wait > lag => Err(crate::Denied::after(wait)),
        Err(_) => try_recheck(clock, f),
    }
}

#[cold]
#[inline(never)]
fn try_recheck<C: crate::clock::Clock>(
    clock: &C,
    f: impl Fn(crate::clock::Nanos) -> Result<(), crate::clock::Nanos>,
) -> Result<(), crate::Denied> {
    f(clock.now()).map_err(crate::Denied::after)
}

/// The rare second look of [`decide`], kept out of line so the common path stays small.
#[cold]
#[inline(never)]
fn recheck<C: crate::clock::Clock>(
    clock: &C,
    f: impl Fn(crate::clock::Nanos) -> crate::Decision,
) -> crate::Decision {
    f(clock.now())
}
