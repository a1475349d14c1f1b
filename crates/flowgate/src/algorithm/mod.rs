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
