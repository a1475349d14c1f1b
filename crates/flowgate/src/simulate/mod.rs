//! See what the limiter does: run the same traffic through several algorithms (and
//! deployments) with the same quota, on a simulated clock, and compare.
//!
//! A [`Simulation`] takes a [`Quota`], some [`Traffic`] — a built-in [`Scenario`], a CSV trace
//! ([`Traffic::from_csv`]) or requests pushed by hand — and the [`Subject`]s to compare: a
//! [`Limiter`] (one of the five algorithms, or the shaper) in a [`Deployment`] (in process,
//! per instance, a shared store, the hybrid store, the fallback store during an outage, a
//! fleet of Envoys on the Rate Limit Quota Service). It
//! answers a [`Report`]: per subject a [`Summary`] (admitted, denied, the most admitted in any
//! window of the period, the first denial, the shaper's waits) and a [`Series`] of admitted
//! and denied requests over time.
//!
//! Everything runs the library's own code — [`KeyedRateLimiter`](crate::KeyedRateLimiter),
//! [`MemoryStore`](crate::store::MemoryStore), [`HybridStore`](crate::store::HybridStore),
//! [`FallbackStore`](crate::store::FallbackStore) — on a [`ManualClock`](crate::clock::ManualClock)
//! set to each request's time, never the wall clock; the shaper is the same leaky-bucket
//! transition as `local::Shaper` (a test checks they agree). So a simulation is
//! deterministic: the same input gives the same report, to the unit, every time.
//!
//! ```
//! use flowgate::simulate::{Scenario, Simulation};
//! use flowgate::{Algorithm, Quota};
//!
//! // 100 per minute; 100 requests at 12:00:59 and 100 at 12:01:01.
//! let quota = Quota::per_minute(100);
//! let traffic = Scenario::Boundary.traffic(&quota, 1);
//! let report = Simulation::new(quota, &traffic).run()?;
//!
//! let run = |algorithm: Algorithm| {
//!     report.runs.iter().find(|r| r.subject.limiter.name() == algorithm.name()).unwrap()
//! };
//! // The fixed window lets all 200 through within two seconds...
//! assert_eq!(run(Algorithm::FixedWindow).summary.max_in_window, 200);
//! // ...the sliding log never more than 100 in any minute.
//! assert_eq!(run(Algorithm::SlidingLog).summary.max_in_window, 100);
//! # Ok::<(), flowgate::simulate::SimulateError>(())
//! ```

mod engine;
mod gate;
mod report;
mod rlqs;
mod rng;
mod scenario;
mod shaper;
mod subject;
mod trace;
mod traffic;

use std::time::Duration;

pub use report::{MAX_BUCKETS, Report, Run, Series, Summary, Waits};
pub use scenario::{SCENARIO_KEY, SCENARIO_START, STORM_ATTEMPTS, Scenario, UnknownScenario};
pub use subject::{Deployment, Limiter, Outage, Subject};
pub use trace::TraceError;
pub use traffic::{Arrival, KeyId, Retry, Traffic};

use crate::clock::{Nanos, nanos};
use crate::quota::{Quota, QuotaError};

/// How many buckets a report aims for when no bucket width is given.
pub const DEFAULT_BUCKETS: u64 = 100;

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimulateError {
    /// There is no traffic to simulate.
    #[error("there are no requests to simulate")]
    NoTraffic,
    /// There is nothing to compare.
    #[error("there are no limiters to simulate")]
    NoSubjects,
    /// A request asks for more than the subject can ever grant at once.
    #[error("{}a cost of {cost} can never be granted by {subject}: its capacity is {capacity}",
        if *line > 0 { format!("line {line}: ") } else { String::new() })]
    CostTooHigh {
        /// The trace line of the request (0 for generated traffic).
        line: u32,
        /// Its cost.
        cost: u64,
        /// The subject's capacity (its quota's burst).
        capacity: u64,
        /// The subject.
        subject: String,
    },
    /// The quota cannot be enforced by the subject's algorithm.
    #[error("{subject}: {error}")]
    Quota {
        /// The subject.
        subject: String,
        /// Why the quota does not fit the algorithm.
        error: QuotaError,
    },
    /// The shaper only runs in process.
    #[error("{subject}: the shaper queues in process; simulate it in-process or per-instance")]
    ShaperNotShared {
        /// The subject.
        subject: String,
    },
    /// The series would need more than [`MAX_BUCKETS`] buckets.
    #[error(
        "the chart would need {buckets} buckets (at most {MAX_BUCKETS}): choose a wider bucket"
    )]
    TooManyBuckets {
        /// Buckets needed.
        buckets: usize,
    },
    /// A limiter had to evict keys that were still active, so the run is not what the
    /// limiter would do with room for every key.
    #[error("{subject}: {keys} active keys were evicted; the result would not be exact")]
    Evicted {
        /// The subject.
        subject: String,
        /// Active keys evicted.
        keys: u64,
    },
    /// A store failed where it cannot (a simulated store decides in memory).
    #[error("the simulated store failed: {0}")]
    Store(String),
}

/// How far a simulation has got, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Offered requests decided so far, over all runs (retries not counted).
    pub done: u64,
    /// Offered requests over all runs: requests × subjects.
    pub total: u64,
}

/// A comparison to run: a quota, the traffic, the subjects. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Simulation<'t> {
    /// The quota every subject enforces, each with its own algorithm.
    quota: Quota,
    /// What is offered.
    traffic: &'t Traffic,
    /// What is compared, in report order.
    subjects: Vec<Subject>,
    /// The width of a series bucket; `None` for about [`DEFAULT_BUCKETS`] over the traffic.
    bucket: Option<Duration>,
}

impl<'t> Simulation<'t> {
    /// `traffic` under `quota`, compared across every algorithm and the shaper (a queue of
    /// `limit` requests, waits up to one period), in process.
    pub fn new(quota: Quota, traffic: &'t Traffic) -> Self {
        let max_queue = usize::try_from(quota.limit()).unwrap_or(usize::MAX);
        Simulation {
            subjects: Subject::every_limiter(max_queue, quota.period()),
            quota,
            traffic,
            bucket: None,
        }
    }

    /// Compares these subjects instead, in this order.
    pub fn subjects(mut self, subjects: Vec<Subject>) -> Self {
        self.subjects = subjects;
        self
    }

    /// Buckets of `width` for the series (default: a round width giving about
    /// [`DEFAULT_BUCKETS`] over the traffic's span; see [`round_bucket`]).
    pub fn bucket(mut self, width: Duration) -> Self {
        self.bucket = Some(width.max(Duration::from_nanos(1)));
        self
    }

    /// Runs every subject over the traffic.
    pub fn run(&self) -> Result<Report, SimulateError> {
        self.run_with_progress(|_| {})
    }

    /// [`run`](Self::run), calling `progress` every few thousand requests.
    pub fn run_with_progress(
        &self,
        mut progress: impl FnMut(Progress),
    ) -> Result<Report, SimulateError> {
        if self.traffic.is_empty() {
            return Err(SimulateError::NoTraffic);
        }
        if self.subjects.is_empty() {
            return Err(SimulateError::NoSubjects);
        }
        let traffic = self.traffic;
        let (start, mut end) = (traffic.start(), traffic.end());
        let bucket = self
            .bucket
            .unwrap_or_else(|| round_bucket(Duration::from_nanos((end - start) / DEFAULT_BUCKETS)));
        let width = nanos(bucket).max(1);
        let offered = traffic.len() as u64;
        let total = offered * self.subjects.len() as u64;
        let mut runs = Vec::with_capacity(self.subjects.len());
        for (i, subject) in self.subjects.iter().enumerate() {
            let before = offered * i as u64;
            let ran = engine::run(traffic, &self.quota, subject, width, &mut |done| {
                progress(Progress {
                    done: before + done,
                    total,
                })
            })?;
            end = end.max(ran.last);
            runs.push(ran.run);
        }
        // Every series over the same buckets, from start to end.
        let buckets = usize::try_from((end - start) / width + 1).unwrap_or(usize::MAX);
        if buckets > MAX_BUCKETS {
            return Err(SimulateError::TooManyBuckets { buckets });
        }
        for run in &mut runs {
            run.series.admitted.resize(buckets, 0);
            run.series.denied.resize(buckets, 0);
        }
        Ok(Report {
            quota: self.quota,
            traffic: traffic.name().to_owned(),
            offered,
            keys: traffic.keys().len() as u64,
            start,
            end,
            bucket,
            runs,
        })
    }
}

/// The smallest round width at least `at_least`: 1, 2 or 5 × a power of ten of
/// milliseconds below a second; then 1, 2, 5, 10, 15, 30 seconds or minutes; then 1, 2, 3, 6,
/// 12 hours or whole days. At least 1 ms.
///
/// ```
/// use std::time::Duration;
/// use flowgate::simulate::round_bucket;
/// assert_eq!(round_bucket(Duration::from_millis(1_200)), Duration::from_secs(2));
/// assert_eq!(round_bucket(Duration::from_millis(3)), Duration::from_millis(5));
/// assert_eq!(round_bucket(Duration::from_secs(70)), Duration::from_secs(120));
/// ```
pub fn round_bucket(at_least: Duration) -> Duration {
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;
    const M: u64 = 60 * S;
    const H: u64 = 60 * M;
    let n = nanos(at_least).max(MS);
    let mut candidates = Vec::new();
    let mut p = MS;
    while p < S {
        candidates.extend([p, 2 * p, 5 * p]);
        p *= 10;
    }
    for unit in [S, M] {
        candidates.extend([1, 2, 5, 10, 15, 30].map(|k| k * unit));
    }
    candidates.extend([1, 2, 3, 6, 12].map(|k| k * H));
    let chosen = match candidates.into_iter().find(|&c| c >= n) {
        Some(c) => c,
        None => n.div_ceil(24 * H) * 24 * H,
    };
    Duration::from_nanos(chosen)
}

/// A duration as the command line takes it: `250ms`, `1s`, `90s`, `5m`, `2h`, `1500us`.
///
/// ```
/// use std::time::Duration;
/// use flowgate::simulate::format_duration;
/// assert_eq!(format_duration(Duration::from_secs(300)), "5m");
/// assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
/// ```
pub fn format_duration(d: Duration) -> String {
    let n: Nanos = nanos(d);
    const UNITS: [(Nanos, &str); 6] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    if n == 0 {
        return "0s".into();
    }
    for (unit, name) in UNITS {
        if n.is_multiple_of(unit) {
            return format!("{}{name}", n / unit);
        }
    }
    format!("{n}ns")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::decision::FailMode;

    fn run_of<'r>(report: &'r Report, name: &str) -> &'r Run {
        report
            .runs
            .iter()
            .find(|r| r.subject.to_string() == name)
            .unwrap()
    }

    #[test]
    fn the_boundary_spike_passes_a_fixed_window_and_not_a_sliding_log() {
        let quota = Quota::per_minute(100);
        let traffic = Scenario::Boundary.traffic(&quota, 1);
        let report = Simulation::new(quota, &traffic).run().unwrap();
        let fixed = &run_of(&report, "fixed_window").summary;
        assert_eq!(
            (fixed.admitted, fixed.denied, fixed.max_in_window),
            (200, 0, 200)
        );
        let log = &run_of(&report, "sliding_log").summary;
        assert_eq!((log.admitted, log.max_in_window), (100, 100));
        assert_eq!(log.first_denial, Some(Duration::from_secs(61)));
        // GCRA refills 100/60 per second: 3 more after two seconds.
        let gcra = &run_of(&report, "gcra").summary;
        assert_eq!(gcra.admitted, 103);
        // The leaky bucket decides as GCRA does.
        assert_eq!(run_of(&report, "leaky_bucket").summary.admitted, 103);
        // The shaper queues the second hundred behind the first, up to its queue of 100.
        let shaper = &run_of(&report, "shaper").summary;
        assert!(shaper.wait.unwrap().max <= Duration::from_secs(60));
        // A bucket admits up to burst + rate × t in any span t: 100 + 100 in a minute.
        assert!(shaper.max_in_window <= 200, "{}", shaper.max_in_window);
        for run in &report.runs {
            assert_eq!(run.series.admitted.len(), run.series.denied.len());
            assert_eq!(
                run.series.admitted.iter().sum::<u64>(),
                run.summary.admitted
            );
        }
    }

    #[test]
    fn honouring_retry_after_serves_more_clients_with_fewer_tries() {
        let quota = Quota::per_minute(100)
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap();
        let subjects = vec![Subject::new(Limiter::Algorithm(Algorithm::FixedWindow))];
        let naive = Scenario::RetryStorm.traffic(&quota, 1);
        let polite = Scenario::RetryStormHonoured.traffic(&quota, 1);
        let naive = Simulation::new(quota, &naive)
            .subjects(subjects.clone())
            .run()
            .unwrap();
        let polite = Simulation::new(quota, &polite)
            .subjects(subjects)
            .run()
            .unwrap();
        let (n, p) = (&naive.runs[0].summary, &polite.runs[0].summary);
        assert_eq!(n.admitted, 100);
        assert_eq!(n.gave_up, 100);
        assert_eq!(n.requests, 100 + 100 * u64::from(STORM_ATTEMPTS));
        // The polite clients wait for the next window and all get through.
        assert_eq!((p.admitted, p.gave_up), (200, 0));
        assert!(
            p.requests < n.requests / 3,
            "{} vs {}",
            p.requests,
            n.requests
        );
    }

    #[test]
    fn deployments_differ_as_documented() {
        let quota = Quota::per_minute(100)
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap();
        let traffic = Scenario::FlashCrowd.traffic(&quota, 7);
        let log = Limiter::Algorithm(Algorithm::SlidingLog);
        let k = 4;
        let subjects = [
            Deployment::InProcess,
            Deployment::Shared { instances: k },
            Deployment::PerInstance { instances: k },
            Deployment::Hybrid {
                instances: k,
                sync_every: Duration::from_millis(500),
            },
            Deployment::Fallback {
                instances: k,
                mode: FailMode::Local,
                outage: Outage::new(Duration::from_secs(60), Duration::from_secs(120)),
            },
            Deployment::Fallback {
                instances: k,
                mode: FailMode::Open,
                outage: Outage::new(Duration::from_secs(60), Duration::from_secs(120)),
            },
        ]
        .map(|d| Subject::new(log).in_deployment(d))
        .to_vec();
        let report = Simulation::new(quota, &traffic)
            .subjects(subjects)
            .run()
            .unwrap();
        let s: Vec<&Summary> = report.runs.iter().map(|r| &r.summary).collect();
        // A shared store decides exactly as one process does.
        assert_eq!(s[0], s[1]);
        assert!(s[0].max_in_window <= 100);
        // Separate limiters admit up to k times as much.
        assert!(s[2].max_in_window > 300, "{}", s[2].max_in_window);
        // Hybrid overshoots by at most the documented bound for numbered instances, 2B.
        assert!(s[3].max_in_window <= 200, "{}", s[3].max_in_window);
        // A local fallback starts from fresh local counters: a window that straddles the
        // outage's start holds what the store admitted before it plus the instances' shares.
        assert!(s[4].max_in_window <= 200, "{}", s[4].max_in_window);
        // Fail-open admits everything while the store is away.
        assert!(s[5].max_in_window > 500, "{}", s[5].max_in_window);
    }

    #[test]
    fn the_same_input_gives_the_same_report_and_errors_are_clear() {
        let quota = Quota::per_second(20).with_burst(40).unwrap();
        let traffic = Scenario::Bursty.traffic(&quota, 9);
        let a = Simulation::new(quota, &traffic).run().unwrap();
        let b = Simulation::new(quota, &traffic).run().unwrap();
        assert_eq!(a, b);

        let mut heavy = Traffic::new("heavy");
        heavy.push(0, "k", 30);
        let err = Simulation::new(quota, &heavy).run().unwrap_err();
        // GCRA has a burst of 40; the first window algorithm only 20.
        assert_eq!(
            err.to_string(),
            "a cost of 30 can never be granted by fixed_window: its capacity is 20"
        );
        let shaper_shared = Subject::new(Limiter::Shaper {
            max_queue: 1,
            max_delay: Duration::from_secs(1),
        })
        .in_deployment(Deployment::Shared { instances: 2 });
        assert!(matches!(
            Simulation::new(quota, &traffic)
                .subjects(vec![shaper_shared])
                .run(),
            Err(SimulateError::ShaperNotShared { .. })
        ));
        assert_eq!(
            Simulation::new(quota, &Traffic::new("none")).run(),
            Err(SimulateError::NoTraffic)
        );
        assert!(matches!(
            Simulation::new(quota, &traffic)
                .bucket(Duration::from_nanos(1))
                .run(),
            Err(SimulateError::TooManyBuckets { .. })
        ));
    }

    #[test]
    fn durations_and_buckets_are_round() {
        assert_eq!(format_duration(Duration::from_millis(50)), "50ms");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(round_bucket(Duration::ZERO), Duration::from_millis(1));
        assert_eq!(
            round_bucket(Duration::from_secs(2 * 86_400 + 1)),
            Duration::from_secs(3 * 86_400)
        );
    }
}
