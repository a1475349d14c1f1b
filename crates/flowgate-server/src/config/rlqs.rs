//! The `rlqs` section of a configuration file: how Envoy's Rate Limit Quota Service divides
//! this domain's limits (see `docs/rlqs.md`).
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: tenant
//!     rate_limit: {unit: second, requests_per_unit: 1000}
//! rlqs:
//!   report_interval: 1s     # the Envoys' reporting_interval; the division's tick
//!   assignment_ttl: 3s      # whole seconds; assignments are refreshed every tick
//!   abandon_after: 30s      # a bucket that reports no requests this long is abandoned
//!   unmatched: allow        # buckets no rule matches: allow | deny | divide
//!   unmatched_limit: {limit: 100, per: 1s}   # with `divide`: each such bucket's limit
//!   fairness: {floor: 0.2, headroom: 1.1, burst: 0.02, overshoot: 0.05, join_budget: 0.02}
//! ```

use std::time::Duration;

use flowgate::Quota;
use flowgate::rlqs::Fairness;
use flowgate::rlqs::ledger::Timing;

/// What buckets that match no rule are assigned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unmatched {
    /// A blanket `ALLOW_ALL` (as envoyproxy/ratelimit allows descriptors without a rule).
    Allow,
    /// A blanket `DENY_ALL`.
    Deny,
    /// This limit, divided like a rule's, per bucket.
    Divide(Quota),
}

/// A domain's RLQS settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlqsConfig {
    /// How often Envoys are expected to report (their `reporting_interval`): the length of a
    /// division's tick.
    pub report_interval: Duration,
    /// How long each assignment is valid (whole seconds: Envoy ignores fractions).
    pub assignment_ttl: Duration,
    /// A bucket whose reports say no requests for this long is abandoned.
    pub abandon_after: Duration,
    /// What buckets that match no rule get.
    pub unmatched: Unmatched,
    /// How each rule's limit is divided.
    pub fairness: Fairness,
}

/// The default report interval.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// The default assignment time to live.
pub const DEFAULT_ASSIGNMENT_TTL: Duration = Duration::from_secs(3);
/// The default idle time before a bucket is abandoned.
pub const DEFAULT_ABANDON_AFTER: Duration = Duration::from_secs(30);

impl Default for RlqsConfig {
    fn default() -> Self {
        RlqsConfig {
            report_interval: DEFAULT_REPORT_INTERVAL,
            assignment_ttl: DEFAULT_ASSIGNMENT_TTL,
            abandon_after: DEFAULT_ABANDON_AFTER,
            unmatched: Unmatched::Allow,
            fairness: Fairness::default(),
        }
    }
}

impl RlqsConfig {
    /// Ticks of the report interval; a member counts in divisions until its last assignment
    /// may have expired and two more ticks passed.
    pub fn timing(&self) -> Timing {
        Timing {
            tick: self.report_interval,
            stale_after: self.assignment_ttl + self.report_interval * 2,
        }
    }
}
