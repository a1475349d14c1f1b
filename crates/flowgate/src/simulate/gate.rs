//! The deciders: each [`Deployment`] built from the library's own limiters and stores, on one
//! [`ManualClock`] per run.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::SimulateError;
use super::shaper::{ShaperModel, ShaperRule};
use super::subject::{Deployment, Limiter, Subject};
use super::traffic::KeyId;
use crate::clock::{Clock, ManualClock, Nanos, nanos};
use crate::decision::Decision;
use crate::local::KeyedRateLimiter;
use crate::quota::Quota;
use crate::store::{Ask, FallbackStore, HybridStore, MemoryStore, Store, StoreError};

/// What one request was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It goes through after `wait` ns (0 but for the shaper).
    Admitted {
        /// Time between arrival and release, in ns.
        wait: Nanos,
    },
    /// It was refused; the same request could succeed after `retry_after` ns.
    Denied {
        /// As [`Decision::retry_after`], in ns (never 0).
        retry_after: Nanos,
    },
}

impl From<Decision> for Verdict {
    fn from(d: Decision) -> Self {
        if d.allowed {
            Verdict::Admitted { wait: 0 }
        } else {
            Verdict::Denied {
                retry_after: nanos(d.retry_after).max(1),
            }
        }
    }
}

/// A memory store shared by the simulated instances.
type SharedMemory = Arc<MemoryStore<ManualClock>>;

/// How one subject decides.
enum Kind {
    /// One keyed limiter per instance (one in all for in-process).
    Keyed(Vec<KeyedRateLimiter<KeyId, ManualClock>>),
    /// One shaper per (instance, key).
    Shaper {
        rule: ShaperRule,
        instances: u64,
        shapers: HashMap<(u64, KeyId), ShaperModel>,
    },
    /// One memory store behind every instance.
    Shared(SharedMemory),
    /// A hybrid store per instance over one memory store, synced by the simulation.
    Hybrid {
        stores: Vec<HybridStore<SharedMemory>>,
        /// When each instance syncs next.
        next_sync: Vec<Nanos>,
        /// Time between an instance's syncs.
        every: Nanos,
    },
    /// A fallback store per instance over one memory store that is away for a while.
    Fallback(Vec<FallbackStore<OutageStore, ManualClock>>),
    /// A fleet of Envoys on the Rate Limit Quota Service.
    Rlqs(Box<super::rlqs::Fleet>),
}

/// A subject's decider: its deployment, its quota, its clock.
pub(super) struct Gate {
    kind: Kind,
    /// The quota the subject enforces (the run's quota with the subject's algorithm).
    quota: Quota,
    /// What the subject is called in errors.
    label: String,
}

impl Gate {
    /// Builds `subject`'s decider for `quota` (whose algorithm is replaced by the subject's),
    /// for traffic of `keys` distinct keys starting at `start`, on `clock`.
    pub(super) fn new(
        subject: &Subject,
        quota: &Quota,
        keys: usize,
        start: Nanos,
        clock: &ManualClock,
    ) -> Result<Gate, SimulateError> {
        let label = subject.to_string();
        let instances = subject.deployment.instances();
        let quota = match subject.limiter {
            Limiter::Algorithm(algorithm) => {
                quota
                    .with_algorithm(algorithm)
                    .map_err(|error| SimulateError::Quota {
                        subject: label.clone(),
                        error,
                    })?
            }
            Limiter::Shaper { .. } => ShaperRule::new(quota, 0, Default::default()).quota,
        };
        // Room for every key, so no active key is ever evicted (which would make decisions
        // depend on the tables' random hash seeds); checked after the run.
        let max_keys = keys.saturating_add(64).saturating_mul(1024);
        let memory = || {
            Arc::new(
                MemoryStore::builder()
                    .clock(clock.clone())
                    .max_keys(max_keys)
                    .build(),
            )
        };
        let kind = match (subject.limiter, subject.deployment) {
            (
                Limiter::Shaper {
                    max_queue,
                    max_delay,
                },
                Deployment::InProcess | Deployment::PerInstance { .. },
            ) => Kind::Shaper {
                rule: ShaperRule::new(&quota, max_queue, max_delay),
                instances,
                shapers: HashMap::new(),
            },
            (Limiter::Shaper { .. }, _) => {
                return Err(SimulateError::ShaperNotShared { subject: label });
            }
            (
                Limiter::Algorithm(_),
                Deployment::Rlqs {
                    envoys,
                    report_every,
                },
            ) => Kind::Rlqs(Box::new(super::rlqs::Fleet::new(
                &quota,
                envoys,
                report_every,
                start,
                clock,
            ))),
            (Limiter::Algorithm(_), Deployment::InProcess | Deployment::PerInstance { .. }) => {
                Kind::Keyed(
                    (0..instances)
                        .map(|_| {
                            KeyedRateLimiter::builder(quota)
                                .clock(clock.clone())
                                .shards(1)
                                .max_keys(keys.saturating_add(1))
                                .build()
                        })
                        .collect(),
                )
            }
            (Limiter::Algorithm(_), Deployment::Shared { .. }) => Kind::Shared(memory()),
            (Limiter::Algorithm(_), Deployment::Hybrid { sync_every, .. }) => {
                let shared = memory();
                let every = nanos(sync_every).max(1_000_000);
                Kind::Hybrid {
                    stores: (0..instances)
                        .map(|i| {
                            HybridStore::builder(shared.clone())
                                .instances(instances)
                                .instance(i)
                                .sync_every(sync_every)
                                .build_manual()
                        })
                        .collect(),
                    // Evenly staggered: instance i first syncs (i + 1)/k of an interval in.
                    next_sync: (0..instances)
                        .map(|i| start + every / instances * (i + 1))
                        .collect(),
                    every,
                }
            }
            (Limiter::Algorithm(_), Deployment::Fallback { mode, outage, .. }) => {
                let shared = memory();
                let from = start.saturating_add(nanos(outage.from));
                let until = start.saturating_add(nanos(outage.until));
                Kind::Fallback(
                    (0..instances)
                        .map(|_| {
                            FallbackStore::builder(OutageStore {
                                inner: shared.clone(),
                                clock: clock.clone(),
                                from,
                                until,
                            })
                            .clock(clock.clone())
                            .fail(mode)
                            .instances(instances)
                            .build()
                        })
                        .collect(),
                )
            }
        };
        Ok(Gate { kind, quota, label })
    }

    /// The quota this subject enforces.
    pub(super) fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Decides one request for `key` (named `name`) from `instance`, at the clock's time.
    pub(super) fn decide(
        &mut self,
        instance: u64,
        key: KeyId,
        name: &str,
        cost: u64,
        now: Nanos,
    ) -> Result<Verdict, SimulateError> {
        let quota = &self.quota;
        let answered = |result: Option<Result<Decision, StoreError>>| match result {
            Some(Ok(decision)) => Ok(Verdict::from(decision)),
            Some(Err(e)) => Err(SimulateError::Store(e.to_string())),
            None => Err(SimulateError::Store(
                "the store did not answer synchronously".into(),
            )),
        };
        match &mut self.kind {
            Kind::Keyed(limiters) => {
                let limiter = &limiters[(instance % limiters.len() as u64) as usize];
                limiter
                    .check_key_n(&key, cost)
                    .map(Verdict::from)
                    .map_err(|e| SimulateError::Store(e.to_string()))
            }
            Kind::Shaper {
                rule,
                instances,
                shapers,
            } => Ok(shapers
                .entry((instance % *instances, key))
                .or_insert_with(|| ShaperModel::new(rule))
                .offer(rule, cost, now)),
            Kind::Shared(store) => answered(store.check_now(Ask::new(name, quota).cost(cost))),
            Kind::Hybrid { stores, .. } => {
                let store = &stores[(instance % stores.len() as u64) as usize];
                answered(store.check_now(Ask::new(name, quota).cost(cost)))
            }
            Kind::Fallback(stores) => {
                let store = &stores[(instance % stores.len() as u64) as usize];
                answered(store.check_now(Ask::new(name, quota).cost(cost)))
            }
            Kind::Rlqs(fleet) => Ok(if fleet.decide(instance, key, name, now)? {
                Verdict::Admitted { wait: 0 }
            } else {
                Verdict::Denied {
                    retry_after: nanos(quota.period()).max(1),
                }
            }),
        }
    }

    /// When the deployment next does something on its own (a hybrid instance's sync).
    pub(super) fn next_tick(&self) -> Option<Nanos> {
        match &self.kind {
            Kind::Hybrid { next_sync, .. } => next_sync.iter().copied().min(),
            Kind::Rlqs(fleet) => Some(fleet.next_event()),
            _ => None,
        }
    }

    /// Does what is due at `now` (the clock reads `now`).
    pub(super) fn tick(&mut self, now: Nanos) -> Result<(), SimulateError> {
        if let Kind::Rlqs(fleet) = &mut self.kind {
            return fleet.tick(now);
        }
        if let Kind::Hybrid {
            stores,
            next_sync,
            every,
        } = &mut self.kind
        {
            for (store, next) in stores.iter().zip(next_sync.iter_mut()) {
                if *next <= now {
                    now_or_never(store.sync_now()).ok_or_else(|| {
                        SimulateError::Store("the shared store did not answer at once".into())
                    })?;
                    *next += *every;
                }
            }
        }
        Ok(())
    }

    /// Checks that the run was faithful: no key that still mattered was evicted.
    pub(super) fn finish(&self) -> Result<(), SimulateError> {
        let evicted: u64 = match &self.kind {
            Kind::Keyed(limiters) => limiters.iter().map(|l| l.stats().evicted_active).sum(),
            Kind::Shared(store) => store.stats().evicted_active,
            Kind::Hybrid { stores, .. } => stores
                .first()
                .map_or(0, |s| s.inner().stats().evicted_active),
            Kind::Fallback(stores) => stores
                .first()
                .map_or(0, |s| s.inner().inner.stats().evicted_active),
            Kind::Shaper { .. } | Kind::Rlqs(_) => 0,
        };
        if evicted > 0 {
            return Err(SimulateError::Evicted {
                subject: self.label.clone(),
                keys: evicted,
            });
        }
        Ok(())
    }
}

/// Polls `future` once: its output if it is ready at once (every future of a memory store
/// is), `None` otherwise.
fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// The shared store during a simulated outage: the memory store, which does not answer
/// (a transient [`StoreError::Unavailable`]) from `from` until `until`.
#[derive(Debug)]
pub(super) struct OutageStore {
    inner: SharedMemory,
    clock: ManualClock,
    /// When the outage starts.
    from: Nanos,
    /// When it ends (exclusive).
    until: Nanos,
}

impl OutageStore {
    fn down(&self) -> Result<(), StoreError> {
        let now = self.clock.now();
        if self.from <= now && now < self.until {
            Err(StoreError::Unavailable("simulated outage".into()))
        } else {
            Ok(())
        }
    }
}

impl Store for OutageStore {
    async fn check(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
        self.down()?;
        self.inner.check(ask).await
    }

    fn check_now(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
        match self.down() {
            Ok(()) => self.inner.check_now(ask),
            Err(e) => Some(Err(e)),
        }
    }

    async fn refund(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        self.down()?;
        self.inner.refund(ask).await
    }

    fn refund_now(&self, ask: Ask<'_>) -> Option<Result<(), StoreError>> {
        match self.down() {
            Ok(()) => self.inner.refund_now(ask),
            Err(e) => Some(Err(e)),
        }
    }

    async fn reset(&self, ask: Ask<'_>) -> Result<(), StoreError> {
        self.down()?;
        self.inner.reset(ask).await
    }
}
