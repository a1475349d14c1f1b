//! The `rlqs` deployment: a fleet of Envoys enforcing the assignments of one Flowgate
//! instance's Rate Limit Quota Service, on the simulated clock — the library's own
//! [`QuotaClient`] (each Envoy's filter), [`DemandEstimate`], [`Holding`] and ledger protocol
//! on a [`MemoryLedger`], as `flowgate serve` runs them.
//!
//! Requests go to the Envoys in turn (as to any deployment's instances); each key is a rule
//! instance of its own, divided among the Envoys that see it. Envoy `i` reports every
//! interval at offset `i / n` of it; the server ticks at whole intervals from the start.
//! Every request takes one token whatever its cost (Envoy's filter has no costs), and a
//! denied request is told to retry after a period.

use std::collections::HashMap;
use std::time::Duration;

use super::SimulateError;
use super::traffic::KeyId;
use crate::clock::{ManualClock, Nanos, nanos};
use crate::quota::Quota;
use crate::rlqs::client::{BucketSettings, QuotaClient, Strategy};
use crate::rlqs::ledger::{self, Holding, Joined, Terms, Timing};
use crate::rlqs::{DemandEstimate, Fairness, MemoryLedger};

/// What the server tracks of one Envoy's bucket.
#[derive(Debug, Default)]
struct Tracked {
    demand: DemandEstimate,
    holding: Holding,
}

/// One simulated Envoy.
struct Envoy {
    client: QuotaClient<KeyId>,
    /// What the server tracks of each of its buckets.
    buckets: HashMap<KeyId, Tracked>,
    /// When it reports next.
    next_report: Nanos,
}

/// The fleet and its server.
pub(super) struct Fleet {
    envoys: Vec<Envoy>,
    ledger: MemoryLedger<ManualClock>,
    terms: Terms,
    period: Duration,
    /// How long assignments are valid (three intervals).
    ttl: Duration,
    /// The report interval.
    every: Nanos,
    /// When the server ticks next.
    next_tick: Nanos,
    /// Each key's name (its rule instance in the ledger).
    names: HashMap<KeyId, String>,
}

/// Polls a memory ledger's future, which is ready at once.
fn now<F: std::future::Future>(f: F) -> Result<F::Output, SimulateError> {
    let mut f = std::pin::pin!(f);
    match f
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(v) => Ok(v),
        std::task::Poll::Pending => Err(SimulateError::Store(
            "the memory ledger did not answer at once".into(),
        )),
    }
}

fn member(envoy: usize) -> String {
    format!("envoy{envoy}")
}

impl Fleet {
    /// `envoys` Envoys reporting every `every`, dividing `quota`, from `start` on `clock`.
    pub(super) fn new(
        quota: &Quota,
        envoys: u64,
        every: Duration,
        start: Nanos,
        clock: &ManualClock,
    ) -> Fleet {
        let every_ns = nanos(every).max(1_000_000);
        let n = envoys.max(1);
        let ttl = Duration::from_secs(every.as_secs().max(1) * 3);
        Fleet {
            envoys: (0..n)
                .map(|i| Envoy {
                    client: QuotaClient::new(BucketSettings::default()),
                    buckets: HashMap::new(),
                    next_report: start + every_ns * (i + 1) / n,
                })
                .collect(),
            ledger: MemoryLedger::with_clock(clock.clone()),
            terms: Terms {
                limit: quota.limit(),
                fairness: Fairness::default(),
                timing: Timing {
                    tick: Duration::from_nanos(every_ns),
                    stale_after: ttl + Duration::from_nanos(every_ns * 2),
                },
            },
            period: quota.period(),
            ttl,
            every: every_ns,
            next_tick: start + every_ns,
            names: HashMap::new(),
        }
    }

    /// Envoy `envoy` decides a request for `key` (`name`) at `now`: whether it is allowed.
    pub(super) fn decide(
        &mut self,
        envoy: u64,
        key: KeyId,
        name: &str,
        now: Nanos,
    ) -> Result<bool, SimulateError> {
        self.names.entry(key).or_insert_with(|| name.to_owned());
        let i = usize::try_from(envoy).unwrap_or(0) % self.envoys.len();
        let allowed = self.envoys[i].client.request(&key, now);
        // A new bucket is reported at once and joins its rule instance.
        for usage in self.envoys[i].client.take_first_reports() {
            let rule = self.names[&usage.bucket].clone();
            let joined = now_or(ledger::join(&self.ledger, &rule, &self.terms, &member(i)))?;
            let tracked = self.envoys[i].buckets.entry(usage.bucket).or_default();
            tracked.holding = Holding::default();
            tracked.demand = DemandEstimate::default();
            tracked
                .demand
                .report(usage.allowed + usage.denied, now, nanos(self.period));
            if let Joined::Claimed { share, tick } = joined {
                tracked.holding.claimed(tick, share);
                let strategy = Strategy::for_share(share, self.period);
                self.envoys[i]
                    .client
                    .assign(&usage.bucket, strategy, Some(self.ttl), now);
            }
        }
        Ok(allowed)
    }

    /// When the fleet next does something on its own: a report or a tick.
    pub(super) fn next_event(&self) -> Nanos {
        self.envoys
            .iter()
            .map(|e| e.next_report)
            .min()
            .unwrap_or(Nanos::MAX)
            .min(self.next_tick)
    }

    /// Reports and ticks due at `now`.
    pub(super) fn tick(&mut self, now: Nanos) -> Result<(), SimulateError> {
        let period = nanos(self.period);
        for envoy in &mut self.envoys {
            if envoy.next_report > now {
                continue;
            }
            for usage in envoy.client.take_reports(now) {
                let tracked = envoy.buckets.entry(usage.bucket).or_default();
                tracked.demand.report_with_denials(
                    usage.allowed + usage.denied,
                    usage.denied,
                    now,
                    period,
                );
            }
            envoy.next_report += self.every;
        }
        if self.next_tick > now {
            return Ok(());
        }
        self.next_tick += self.every;
        let mut keys: Vec<KeyId> = self.names.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            let rule = self.names[&key].clone();
            let demands: Vec<(String, Option<u64>)> = self
                .envoys
                .iter()
                .enumerate()
                .filter_map(|(i, e)| {
                    e.buckets
                        .get(&key)
                        .map(|t| (member(i), t.demand.per_period()))
                })
                .collect();
            if demands.is_empty() {
                continue;
            }
            let refs: Vec<(&str, Option<u64>)> =
                demands.iter().map(|(m, d)| (m.as_str(), *d)).collect();
            let tick = now_or(ledger::tick(&self.ledger, &rule, &self.terms, &refs))?;
            for (i, envoy) in self.envoys.iter_mut().enumerate() {
                let Some(tracked) = envoy.buckets.get_mut(&key) else {
                    continue;
                };
                let mut share = tracked
                    .holding
                    .apply(tick.number, tick.current.get(&member(i)));
                if share.is_none() {
                    let claimed = now_or(ledger::claim_first_share(
                        &self.ledger,
                        &rule,
                        &self.terms,
                        &tick,
                    ))?;
                    if let Joined::Claimed { share: s, tick } = claimed {
                        tracked.holding.claimed(tick, s);
                        share = Some(s);
                    }
                }
                if let Some(share) = share {
                    let strategy = Strategy::for_share(share, self.period);
                    envoy.client.assign(&key, strategy, Some(self.ttl), now);
                }
            }
        }
        Ok(())
    }
}

/// A ledger call's answer, which the memory ledger gives at once.
fn now_or<T, E: std::fmt::Display>(
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, SimulateError> {
    now(f)?.map_err(|e| SimulateError::Store(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::super::{Deployment, Limiter, Scenario, Simulation, Subject};
    use crate::{Algorithm, Quota};
    use std::time::Duration;

    fn rlqs(envoys: u64, every: Duration) -> Subject {
        Subject::new(Limiter::Algorithm(Algorithm::Gcra)).in_deployment(Deployment::Rlqs {
            envoys,
            report_every: every,
        })
    }

    #[test]
    fn a_fleet_stays_within_the_bound_and_runs_the_same_every_time() {
        let quota = Quota::per_minute(6000);
        for scenario in [Scenario::Steady, Scenario::FlashCrowd, Scenario::Bursty] {
            let traffic = scenario.traffic(&quota, 7);
            let simulation = Simulation::new(quota, &traffic).subjects(vec![
                rlqs(20, Duration::from_secs(1)),
                rlqs(5, Duration::from_secs(5)),
            ]);
            let report = simulation.run().unwrap();
            for run in &report.runs {
                // limit × (1 + overshoot), plus the new buckets of changed assignments (a
                // bucket is 2 % of a share: 1 % of the limit in all at most per change).
                assert!(
                    run.summary.max_in_window <= 6300 + 120,
                    "{scenario}, {}: {} in a minute",
                    run.subject,
                    run.summary.max_in_window
                );
                assert!(run.summary.admitted > 0);
            }
            assert_eq!(
                simulation.run().unwrap().runs[0].summary,
                report.runs[0].summary
            );
        }
        assert_eq!(
            rlqs(20, Duration::from_secs(1)).to_string(),
            "gcra, rlqs x20 report 1s"
        );
    }
}
