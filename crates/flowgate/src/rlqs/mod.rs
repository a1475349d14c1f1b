//! Envoy's Rate Limit Quota Service (RLQS) without the wire: one rule's limit divided among
//! the Envoys that enforce it themselves.
//!
//! With RLQS an Envoy sorts its requests into buckets, enforces a quota assignment per bucket
//! locally (a token bucket, or a blanket allow/deny, with a time to live), and reports per
//! bucket how many requests it allowed and denied. The server decides the assignments; the
//! protocol leaves how to the server. Flowgate divides each rule's limit among the Envoys
//! reporting demand for it:
//!
//! * [`division`]: who gets what — a floor for everyone, max-min fairness on demand, every
//!   token bucket and the join budget kept within `limit × (1 + overshoot)`; pure and
//!   deterministic.
//! * [`demand`]: an Envoy's demand, from its reports, moving only beyond the noise so that
//!   steady demand keeps steady assignments.
//! * [`ledger`]: where members and divisions are kept so that several Flowgate instances
//!   hand out shares of one division per tick ([`MemoryLedger`] in process; Redis across
//!   instances with the `redis` feature).
//! * [`client`]: what an Envoy does with assignments, as its filter is documented to — for
//!   tests, load generation and simulation.
//!
//! The gRPC service itself is `flowgate serve`'s (`docs/rlqs.md`); `flowgate simulate`'s
//! `rlqs` deployment runs this module on a simulated clock.

pub mod client;
pub mod demand;
pub mod division;
pub mod ledger;

pub use demand::DemandEstimate;
pub use division::{Division, Fairness, Member, Share};
pub use ledger::{Ledger, MemoryLedger};
