//! The five algorithms, each a compact state and a pure transition.
//!
//! Every state implements [`State`]: `check(&mut state, quota, cost, now) -> Decision` is the
//! whole algorithm. It changes the state only when it grants a cost above zero, so a denied
//! request consumes nothing and a cost of 0 is a side-effect-free peek. No state reads a clock:
//! time comes in as `now`, which makes every transition replayable from a trace (see the
//! conformance table in `tests/conformance/`).
//!
//! Transitions tolerate `now` going backwards (a lagging clock reading racing a precise one):
//! they then never admit more than if time had stood still.
//!
//! Callers check `cost <= quota.burst()` first ([`Quota::check_cost`]); a transition given a
//! larger cost denies it without consuming anything.
//!
//! **Charges** ([`State::charge`]) record usage that already happened (tokens an LLM reported
//! after the response): they always consume, whatever the cost, and may run the key into
//! *debt* — past its limit — so that it is refused until the debt is repaid:
//!
//! | algorithm | a charge of `cost` at `now` | refused until |
//! |---|---|---|
//! | `gcra` | `tat = max(tat, now) + cost·T` | `tat − τ + T` (one unit fits again) |
//! | `leaky_bucket` | level `+= cost·T` (same as GCRA, the I.371 meter form) | the level drains to `τ − T` |
//! | `fixed_window` | the window's count `+= cost`, past `limit` | the window ends (debt is per window) |
//! | `sliding_window` | the current window's count `+= cost`, past `limit` | the weighted estimate falls below `limit` (at most two windows) |
//! | `sliding_log` | `cost` units logged at `now`; the log keeps the newest `limit` units | the charge's units start leaving the window |
//!
//! The window algorithms forget a window's count when the window is over, so their debt never
//! outlasts it (one window for `fixed_window`, two for `sliding_window`). The sliding log holds
//! at most `limit` units (its memory bound); keeping the newest ones takes exactly the same
//! decisions for every cost ≥ 1 as an unbounded log would, and a peek (cost 0) on a full log
//! is allowed with `remaining: 0` where an unbounded one would deny it.
//!
//! So that every store (Lua counts in doubles) keeps the same state to the unit, a charge
//! counts at most [`MAX_CHARGE`] units, a bucket's debt stops growing at [`MAX_DEBT`] beyond a
//! full bucket's tolerance, a fixed window's count at `limit + MAX_CHARGE`, and a sliding
//! window's counts at 2^32 − 1 (its state is packed in 128 bits; its limit is at most that).

mod fixed_window;
mod gcra;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;

pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use leaky_bucket::LeakyBucket;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::Quota;

/// The most units one [`State::charge`] counts (2^43, 8.8 trillion); a larger charge counts as
/// this many. Keeps the Redis scripts' products exact.
pub const MAX_CHARGE: u64 = 1 << 43;

/// How far past a full bucket's tolerance charges can push a bucket algorithm's debt: 2^50 µs
/// (about 35.7 years), in nanoseconds. Keeps the Redis scripts' time stamps exact.
pub const MAX_DEBT: Nanos = (1 << 50) * 1000;

/// A window algorithm's count after charging `cost` on `count`: at most `cap`, never below
/// `count`.
#[inline]
pub(crate) fn charged_count(count: u64, cost: u64, cap: u64) -> u64 {
    count
        .saturating_add(cost.min(MAX_CHARGE))
        .min(cap.max(count))
}

/// A bucket algorithm's time spoken for ahead of now after charging `cost` on `pending`: at
/// most `τ + MAX_DEBT`, never below `pending`.
#[inline]
pub(crate) fn charged_span(pending: Nanos, cost: u64, quota: &Quota) -> Nanos {
    let span = cost.min(MAX_CHARGE).saturating_mul(quota.interval_nanos());
    let cap = quota
        .tolerance_nanos()
        .saturating_add(MAX_DEBT)
        .max(pending);
    pending.saturating_add(span).min(cap)
}

/// One key's state under one algorithm, and the algorithm's transitions.
///
/// `Default` is the state of a key never seen (a full bucket, an empty window).
pub trait State: Default + Clone + Send + Sync + 'static {
    /// Asks for `cost` units at `now`. Grants them and updates the state if they fit;
    /// otherwise leaves the state unchanged.
    fn check(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision;

    /// Gives back `units` taken earlier (a cancelled reservation, a request that another limit
    /// denied). Never replenishes beyond a fresh state.
    fn refund(&mut self, quota: &Quota, units: u64, now: Nanos);

    /// Takes `cost` units at `now` whatever the state: usage that already happened. May run
    /// the key into debt (see the [module docs](self) for each algorithm); never fails. A cost
    /// of 0 changes nothing.
    ///
    /// Returns the state after it as a peek sees it, but `allowed` (the charge was taken):
    /// `remaining` is 0 while in debt, `reset_after` reaches to the end of the debt, and
    /// `retry_after` is the time until the key is out of debt (zero if it is not in debt).
    fn charge(&mut self, quota: &Quota, cost: u64, now: Nanos) -> Decision;

    /// The time from which this state is indistinguishable from [`Default`]: after it, the key
    /// can be forgotten without changing any future decision.
    fn idle_at(&self, quota: &Quota) -> Nanos;
}

/// Bucket algorithms can hand out units ahead of time: instead of denying, a caller reserves
/// the units and waits until they would have been granted. Used by reservations and the
/// shaper.
pub trait Reserve {
    /// Takes `cost` units at `now`, even if they are only available later, unless that is
    /// more than `max_wait` away. Returns the wait (`Ok`, units taken) or the wait that was
    /// too long (`Err`, nothing taken).
    fn reserve(
        &mut self,
        quota: &Quota,
        cost: u64,
        now: Nanos,
        max_wait: Nanos,
    ) -> Result<Nanos, Nanos>;
}
