//! The `concurrency` section of a configuration file: named in-flight limits, held by leases
//! that callers take and give back through the HTTP API (`/v1/leases`, docs/service.md).
//!
//! ```yaml
//! domain: payments
//! concurrency:
//!   - name: checkout        # /v1/leases/checkout/{key}
//!     limit: 20             # leases held at once per key, across every instance
//!     lease_time: 30s       # a lease not renewed or released by then expires (default 30s)
//!     fail: closed          # the shared store away: closed (503, the default) | open
//! ```

use std::time::Duration;

use flowgate::FailMode;
use flowgate::lease::Terms;

/// The default lease time.
pub const DEFAULT_LEASE_TIME: Duration = Duration::from_secs(30);

/// One named in-flight limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyLimit {
    /// The limit and the lease time.
    pub terms: Terms,
    /// What to answer when the shared store cannot be reached: `Closed` refuses (503),
    /// `Open` grants a lease that is not counted anywhere.
    pub fail: FailMode,
}
