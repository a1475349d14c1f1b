//! What a simulation compares: a [`Limiter`] (an algorithm, or the shaper) in a
//! [`Deployment`] (one process, a shared store, hybrid, fallback during an outage).

use std::fmt;
use std::time::Duration;

use crate::decision::FailMode;
use crate::quota::Algorithm;

/// What decides: one of the five algorithms, denying what does not fit, or the shaper,
/// delaying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limiter {
    /// The algorithm, as [`RateLimiter`](crate::RateLimiter) and every store run it.
    Algorithm(Algorithm),
    /// A leaky-bucket queue like [`Shaper`](crate::local) (feature `tokio`): requests wait
    /// for their turn at the rate instead of being denied, unless `max_queue` are already
    /// waiting or the wait would exceed `max_delay`.
    Shaper {
        /// Most requests waiting at once (per key).
        max_queue: usize,
        /// Longest a request may be asked to wait.
        max_delay: Duration,
    },
}

impl Limiter {
    /// The name in reports: the algorithm's (`"gcra"`, …) or `"shaper"`.
    pub fn name(&self) -> &'static str {
        match self {
            Limiter::Algorithm(a) => a.name(),
            Limiter::Shaper { .. } => "shaper",
        }
    }
}

/// A span of a simulation during which the shared store does not answer, as offsets from the
/// traffic's start.
///
/// ```
/// use std::time::Duration;
/// use flowgate::simulate::Outage;
/// let outage = Outage::new(Duration::from_secs(60), Duration::from_secs(120));
/// assert_eq!(outage.to_string(), "1m..2m");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Outage {
    /// When the store stops answering, after the traffic's start.
    pub from: Duration,
    /// When it answers again (exclusive).
    pub until: Duration,
}

impl Outage {
    /// The store is away from `from` until `until` after the start (empty if `until <= from`).
    pub fn new(from: Duration, until: Duration) -> Self {
        Outage { from, until }
    }
}

impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}..{}",
            super::format_duration(self.from),
            super::format_duration(self.until)
        )
    }
}

/// Where the limiter's state lives, and so what `instances` copies of a service see.
/// Requests are spread over the instances in turn (round robin, a retry going to the next
/// instance).
///
/// Every deployment runs the library's own code on a simulated clock: the in-process
/// [`KeyedRateLimiter`](crate::KeyedRateLimiter), the [`MemoryStore`](crate::store::MemoryStore)
/// (which takes, by the conformance table, the same decisions as the Redis store), the
/// [`HybridStore`](crate::store::HybridStore) and the
/// [`FallbackStore`](crate::store::FallbackStore).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Deployment {
    /// One in-process limiter sees every request (one instance, or a sticky load balancer).
    InProcess,
    /// Every instance limits on its own, with the whole quota: together they admit up to
    /// `instances` times the quota.
    PerInstance {
        /// Instances of the service.
        instances: u64,
    },
    /// One counter shared by every instance: the memory store in one process, Redis across
    /// machines (the same decisions, to the unit).
    Shared {
        /// Instances of the service.
        instances: u64,
    },
    /// [`HybridStore`](crate::store::HybridStore): each instance decides locally and syncs
    /// with the shared store every `sync_every` (the instances' syncs evenly staggered).
    Hybrid {
        /// Instances of the service.
        instances: u64,
        /// Time between one instance's syncs.
        sync_every: Duration,
    },
    /// Envoy's Rate Limit Quota Service: `envoys` Envoys enforce token buckets that one
    /// Flowgate instance assigns them every `report_every` from their reported demand, as
    /// `flowgate serve` does (`crate::rlqs`); requests go to the Envoys in turn. The limiter's
    /// algorithm does not matter: Envoys enforce token buckets.
    Rlqs {
        /// Envoys.
        envoys: u64,
        /// Their reporting interval, and the server's tick.
        report_every: Duration,
    },
    /// [`FallbackStore`](crate::store::FallbackStore) over the shared store, which is away
    /// during `outage`; meanwhile requests are decided by `mode`.
    Fallback {
        /// Instances of the service (a [`FailMode::Local`] instance gets `1 / instances` of
        /// the quota).
        instances: u64,
        /// What decides while the store is away.
        mode: FailMode,
        /// When the store is away.
        outage: Outage,
    },
}

impl Deployment {
    /// Instances of the service: 1 for [`InProcess`](Deployment::InProcess).
    pub fn instances(&self) -> u64 {
        match *self {
            Deployment::InProcess => 1,
            Deployment::PerInstance { instances }
            | Deployment::Shared { instances }
            | Deployment::Hybrid { instances, .. }
            | Deployment::Fallback { instances, .. } => instances.max(1),
            Deployment::Rlqs { envoys, .. } => envoys.max(1),
        }
    }
}

impl fmt::Display for Deployment {
    /// `in-process`, `per-instance x3`, `shared x3`, `hybrid x3 sync 50ms`,
    /// `fallback-local x3 outage 60s..120s`, `rlqs x20 report 1s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Deployment::InProcess => f.write_str("in-process"),
            Deployment::PerInstance { .. } => write!(f, "per-instance x{}", self.instances()),
            Deployment::Shared { .. } => write!(f, "shared x{}", self.instances()),
            Deployment::Hybrid { sync_every, .. } => write!(
                f,
                "hybrid x{} sync {}",
                self.instances(),
                super::format_duration(sync_every)
            ),
            Deployment::Fallback { mode, outage, .. } => write!(
                f,
                "fallback-{} x{} outage {outage}",
                mode.name(),
                self.instances()
            ),
            Deployment::Rlqs { report_every, .. } => write!(
                f,
                "rlqs x{} report {}",
                self.instances(),
                super::format_duration(report_every)
            ),
        }
    }
}

/// One row of a comparison: a limiter in a deployment.
///
/// ```
/// use flowgate::simulate::{Deployment, Limiter, Subject};
/// use flowgate::Algorithm;
/// let subject = Subject::new(Limiter::Algorithm(Algorithm::Gcra));
/// assert_eq!(subject.to_string(), "gcra");
/// let hybrid = subject.in_deployment(Deployment::Hybrid {
///     instances: 3,
///     sync_every: std::time::Duration::from_millis(50),
/// });
/// assert_eq!(hybrid.to_string(), "gcra, hybrid x3 sync 50ms");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subject {
    /// What decides.
    pub limiter: Limiter,
    /// Where its state lives.
    pub deployment: Deployment,
}

impl Subject {
    /// `limiter`, in process.
    pub fn new(limiter: Limiter) -> Self {
        Subject {
            limiter,
            deployment: Deployment::InProcess,
        }
    }

    /// The same limiter in another deployment.
    pub fn in_deployment(mut self, deployment: Deployment) -> Self {
        self.deployment = deployment;
        self
    }

    /// Every algorithm, then the shaper (queue of `max_queue`, waits up to `max_delay`), in
    /// process: the default comparison.
    pub fn every_limiter(max_queue: usize, max_delay: Duration) -> Vec<Subject> {
        Algorithm::ALL
            .into_iter()
            .map(Limiter::Algorithm)
            .chain([Limiter::Shaper {
                max_queue,
                max_delay,
            }])
            .map(Subject::new)
            .collect()
    }
}

impl fmt::Display for Subject {
    /// The limiter's name, then the deployment unless in process.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.limiter.name())?;
        if self.deployment != Deployment::InProcess {
            write!(f, ", {}", self.deployment)?;
        }
        Ok(())
    }
}
