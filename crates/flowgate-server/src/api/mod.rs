//! The service's APIs: [`grpc`] (Envoy RLS v3) and [`http`] (`/json`, `/v1/check`, health,
//! metrics, config), over one shared [`Service`].

pub mod grpc;
pub mod http;
mod problem;
pub mod rls;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use flowgate::policy::descriptor::{Descriptor, Verdict};

use crate::backend::Backend;

use crate::config::{ConfigErrors, Policy, reload};
use crate::metrics::{Api, Metrics, RuleCounters};

/// The running policy and what belongs to it.
#[derive(Debug)]
pub struct Active {
    /// The validated configuration.
    pub policy: Policy,
    /// 1 for the configuration loaded at start, +1 per successful reload.
    pub version: u64,
    /// Each rule's metric counters, by rule id.
    counters: Vec<RuleCounters>,
}

/// Everything the APIs share: the running policy, the store and the metrics.
pub struct Service {
    /// The running policy; replaced whole on reload, read without locks.
    active: ArcSwap<Active>,
    /// Where the counters live.
    backend: Backend,
    /// Every metric.
    metrics: Metrics,
    /// The last version handed out.
    version: AtomicU64,
    /// Benchmark baseline: parse requests and answer in the same shape, deciding nothing.
    noop: bool,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("active", &self.active)
            .field("noop", &self.noop)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// A service enforcing `policy`, counting in `backend`.
    pub fn new(policy: Policy, backend: Backend) -> Self {
        let mut metrics = Metrics::new();
        if let Backend::Shared(store) = &backend {
            let store = store.clone();
            metrics.watch_fallback(move || store.stats());
        }
        let counters = metrics.rule_counters(policy.rules.rules());
        metrics.set_version(1);
        Service {
            active: ArcSwap::from_pointee(Active {
                policy,
                version: 1,
                counters,
            }),
            backend,
            metrics,
            version: AtomicU64::new(1),
            noop: false,
        }
    }

    /// The same service as a benchmark baseline: requests are parsed and answered in the same
    /// shape (every descriptor `OK`), but nothing is matched, counted or recorded.
    pub fn into_noop(mut self) -> Self {
        self.noop = true;
        self
    }

    /// Whether this is the no-op baseline.
    pub fn is_noop(&self) -> bool {
        self.noop
    }

    /// The running policy.
    pub fn active(&self) -> Arc<Active> {
        self.active.load_full()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Where the counters live.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Decides a request against `active` and records its metrics.
    pub async fn decide<'a>(
        &self,
        active: &'a Active,
        api: Api,
        domain: &str,
        descriptors: &[Descriptor],
        hits_addend: u64,
    ) -> Verdict<'a> {
        let started = Instant::now();
        let verdict = self
            .backend
            .check(&active.policy.rules, domain, descriptors, hits_addend)
            .await;
        for (result, request) in verdict.descriptors.iter().zip(descriptors) {
            self.metrics
                .record(domain, result, &active.counters, || detail_name(request));
        }
        self.metrics
            .observe_latency(api, started.elapsed().as_secs_f64());
        verdict
    }

    /// Whether the store answers within `timeout` (a zero-cost peek of a probe key; a shared
    /// store is asked itself, not its fallback).
    pub async fn store_reachable(&self, timeout: Duration) -> bool {
        self.backend.reachable(timeout).await
    }
}

/// The metric series name of a `detailed_metric` rule: the request's descriptor as
/// envoyproxy/ratelimit writes it (`key_value.key2_value2`).
fn detail_name(request: &Descriptor) -> String {
    let mut name = String::new();
    for (i, entry) in request.entries.iter().enumerate() {
        if i > 0 {
            name.push('.');
        }
        name.push_str(&entry.key);
        if !entry.value.is_empty() {
            name.push('_');
            name.push_str(&entry.value);
        }
    }
    name
}

impl reload::Target for Service {
    fn current_digest(&self) -> u64 {
        self.active.load().policy.digest
    }

    fn install(&self, policy: Policy) {
        let version = self.version.fetch_add(1, Ordering::Relaxed) + 1;
        let counters = self.metrics.rule_counters(policy.rules.rules());
        tracing::info!(
            version,
            rules = policy.rules.rules().len(),
            "configuration reloaded"
        );
        self.active.store(Arc::new(Active {
            policy,
            version,
            counters,
        }));
        self.metrics.reloaded(true, version);
    }

    fn rejected(&self, errors: &ConfigErrors) {
        tracing::error!("configuration rejected; the running policy stays live:\n{errors}");
        self.metrics.reloaded(false, 0);
    }
}
