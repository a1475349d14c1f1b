//! The service's APIs: [`grpc`] (Envoy RLS v3) and [`http`] (`/json`, `/v1/check`, health,
//! metrics, config), over one shared [`Service`]; [`answer`] renders every decision; [`noop`]
//! is the benchmark baseline, a separate service that production handlers know nothing of.

pub mod answer;
pub mod grpc;
pub mod http;
pub mod limits;
pub mod noop;
pub mod openapi;
// Public (hidden): the JSON parsers' error, for the fuzz targets (`flowgate_testing::fuzzing`).
#[doc(hidden)]
pub mod problem;
pub mod rls;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ::http::HeaderValue;
use arc_swap::ArcSwap;
use flowgate::answer::Answer;
use flowgate::envoy::{Descriptor, Modes, Verdict};

use flowgate::top::TopKeys;

use crate::backend::Backend;
pub use limits::InputLimits;

use crate::config::{ConfigErrors, Policy, XdsRules, reload};
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
    /// Each rule's `RateLimit-Policy` item, by rule id (formatted once per configuration).
    items: Vec<HeaderValue>,
}

impl Active {
    fn new(policy: Policy, version: u64, metrics: &Metrics) -> Self {
        Active {
            counters: metrics.rule_counters(policy.rules.rules()),
            items: answer::policy_items(policy.rules.rules()),
            policy,
            version,
        }
    }

    /// Each rule's metric counters, by rule id (as in `policy.rules.rules()`).
    pub fn rule_counters(&self) -> &[RuleCounters] {
        &self.counters
    }

    /// The client-visible answer to `verdict` (decided under this configuration).
    pub fn answer(&self, verdict: &Verdict<'_>) -> Answer {
        answer::answer(verdict, &self.items)
    }
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
    /// Set when the server begins to stop: `/readyz` then fails, so load balancers drain it.
    draining: AtomicBool,
    /// Whether `/readyz` also requires the store to answer (off by default: a store outage is
    /// what each rule's `fail` mode is for, and must not empty a load balancer's pool).
    ready_requires_store: AtomicBool,
    /// The bearer token of the admin endpoints; `None` disables them.
    admin_token: Option<AdminToken>,
    /// The last reload's outcome, for the dashboard (`None` until a reload is tried).
    last_reload: parking_lot::Mutex<Option<ReloadOutcome>>,
    /// Held while a new policy is built from the running one and installed (a file reload,
    /// an xDS version): neither loses the other's change.
    composing: parking_lot::Mutex<()>,
    /// The heaviest denied keys, per domain and descriptor (fixed memory).
    top_denied: TopKeys,
    /// What one API request may carry.
    input: InputLimits,
    /// The service-wide modes of the rate-limit APIs.
    rls: RlsSettings,
}

/// Service-wide settings of the rate-limit APIs (gRPC `ShouldRateLimit`, `POST /json`,
/// `POST /v1/check`), envoyproxy/ratelimit's `SHADOW_MODE`, `QUOTA_MODE` and
/// `RESPONSE_DYNAMIC_METADATA` (`flowgate serve --shadow-mode`, `--quota-mode`,
/// `--response-dynamic-metadata`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RlsSettings {
    /// The global shadow and quota modes.
    pub modes: Modes,
    /// Fill the RLS response's `dynamic_metadata` ([`rls::dynamic_metadata`]).
    pub dynamic_metadata: bool,
}

/// What the last configuration reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadOutcome {
    /// When it was tried (milliseconds since the Unix epoch).
    pub at_ms: u64,
    /// Whether the new configuration was installed.
    pub ok: bool,
    /// The version running after it.
    pub version: u64,
    /// Why the files were rejected (one line per error, with file:line:column); empty when ok.
    pub errors: Vec<String>,
    /// What changed: `files` or `xds`.
    pub source: &'static str,
}

pub use http::admin::{
    AdminToken, AdminTokenError, MIN_ADMIN_TOKEN_BYTES, REFUSALS_LOGGED_PER_MINUTE,
};
pub use limits::DEFAULT_MAX_BODY_BYTES;

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("active", &self.active)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// A service enforcing `policy`, counting in `backend`.
    pub fn new(policy: Policy, backend: Backend) -> Self {
        let mut metrics = Metrics::new();
        if backend.fallback_stats().is_some() {
            let backend = backend.clone();
            metrics.watch_fallback(move || backend.fallback_stats().unwrap_or_default());
        }
        if backend.memory_stats().is_some() {
            let backend = backend.clone();
            metrics.watch_memory(move || backend.memory_stats().unwrap_or_default());
        }
        metrics.set_version(1);
        Service {
            active: ArcSwap::from_pointee(Active::new(policy, 1, &metrics)),
            backend,
            metrics,
            version: AtomicU64::new(1),
            draining: AtomicBool::new(false),
            ready_requires_store: AtomicBool::new(false),
            admin_token: None,
            last_reload: parking_lot::Mutex::new(None),
            composing: parking_lot::Mutex::new(()),
            top_denied: TopKeys::new(TOP_KEYS_CAPACITY),
            input: InputLimits::default(),
            rls: RlsSettings::default(),
        }
    }

    /// The service-wide modes of the rate-limit APIs.
    pub fn with_rls_settings(mut self, rls: RlsSettings) -> Self {
        self.rls = rls;
        self
    }

    /// The service-wide modes of the rate-limit APIs.
    pub fn rls_settings(&self) -> RlsSettings {
        self.rls
    }

    /// Enables the admin endpoints (`/v1/keys/...`) behind `token`.
    pub fn with_admin_token(mut self, token: Option<AdminToken>) -> Self {
        self.admin_token = token;
        self
    }

    /// The admin endpoints' token, when they are enabled.
    pub fn admin_token(&self) -> Option<&AdminToken> {
        self.admin_token.as_ref()
    }

    /// The last reload's outcome, once one was tried.
    pub fn last_reload(&self) -> Option<ReloadOutcome> {
        self.last_reload.lock().clone()
    }

    /// The heaviest denied keys (`domain/key=value/...`, as the admin endpoints name them).
    pub fn top_denied(&self) -> &TopKeys {
        &self.top_denied
    }

    /// The same service with other bounds on API requests (default [`InputLimits::default`]).
    pub fn with_input_limits(mut self, input: InputLimits) -> Self {
        self.input = input;
        self
    }

    /// The bounds on API requests.
    pub fn input_limits(&self) -> &InputLimits {
        &self.input
    }

    /// Makes `/readyz` fail while the store does not answer (strict readiness; see
    /// `--ready-requires-store`).
    pub fn require_store_for_readiness(&self, on: bool) {
        self.ready_requires_store.store(on, Ordering::Relaxed);
    }

    /// The largest request body the HTTP API reads (`--max-body-bytes`).
    pub fn max_body_bytes(&self) -> usize {
        self.input.max_body_bytes
    }

    /// Whether readiness requires the store.
    pub fn readiness_requires_store(&self) -> bool {
        self.ready_requires_store.load(Ordering::Relaxed)
    }

    /// Marks the server as stopping: `/readyz` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether the server is stopping.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
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

    /// Decides a request — `descriptors` of `domain`, `hits_addend` each unless a descriptor
    /// says (0 means 1) — against `active`, and records its metrics.
    pub async fn decide<'a>(
        &self,
        active: &'a Active,
        api: Api,
        domain: &str,
        descriptors: &[Descriptor],
        hits_addend: u64,
    ) -> Verdict<'a> {
        let started = Instant::now();
        let verdict = flowgate::envoy::check_with(
            &active.policy.rules,
            self.backend.store(),
            domain,
            descriptors,
            hits_addend,
            self.rls.modes,
        )
        .await;
        self.record(active, api, domain, descriptors, &verdict, started);
        verdict
    }

    /// [`decide`](Self::decide) when the store answers at once
    /// ([`check_now`](flowgate::envoy::check_now): the embedded store does); `None` when it
    /// must be waited for — then nothing was counted, and [`decide`](Self::decide) it is.
    pub fn decide_now<'a>(
        &self,
        active: &'a Active,
        api: Api,
        domain: &str,
        descriptors: &[Descriptor],
        hits_addend: u64,
    ) -> Option<Verdict<'a>> {
        let started = Instant::now();
        let verdict = flowgate::envoy::check_now(
            &active.policy.rules,
            self.backend.store(),
            domain,
            descriptors,
            hits_addend,
            self.rls.modes,
        )?;
        self.record(active, api, domain, descriptors, &verdict, started);
        Some(verdict)
    }

    /// The metrics of one decision: each limit's series, the denied keys, the latency.
    fn record(
        &self,
        active: &Active,
        api: Api,
        domain: &str,
        descriptors: &[Descriptor],
        verdict: &Verdict<'_>,
        started: Instant,
    ) {
        if verdict.shadowed {
            self.metrics.global_shadow_mode();
        }
        for (result, request) in verdict.descriptors.iter().zip(descriptors) {
            // Every limit of the descriptor's rule in its own series.
            for limit in result.limits() {
                self.metrics
                    .record(domain, limit, &active.counters, |rule| {
                        rule.metric_name(&request.entries)
                    });
            }
            if result.over_limit() {
                record_denied(&self.top_denied, domain, request, result.hits);
            }
        }
        self.metrics
            .observe_latency(api, started.elapsed().as_secs_f64());
    }

    /// Whether the store answers within `timeout` (a zero-cost peek of a probe key; a shared
    /// store is asked itself, not its fallback).
    pub async fn store_reachable(&self, timeout: Duration) -> bool {
        self.backend.reachable(timeout).await
    }
}

/// Counters of the service's top denied keys: about 560 KiB (~140 bytes a counter), and an
/// error of about (denied units) / 4096 at most on each reported count.
pub const TOP_KEYS_CAPACITY: usize = 4096;

/// Counts a denied descriptor in `top` under its admin path (`domain/key=value/...`), built in
/// a reused buffer: a denial allocates nothing here.
fn record_denied(top: &TopKeys, domain: &str, request: &Descriptor, hits: u64) {
    thread_local! {
        static NAME: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    NAME.with_borrow_mut(|name| {
        name.clear();
        http::admin::write_path(name, domain, &request.entries);
        top.record_n(name.as_bytes(), hits.max(1));
    });
}

impl reload::Target for Service {
    fn current_digest(&self) -> u64 {
        self.active.load().policy.digest
    }

    fn current_references(&self) -> Vec<std::path::PathBuf> {
        let active = self.active.load();
        active
            .policy
            .references
            .iter()
            .map(|r| r.path.clone())
            .collect()
    }

    fn install(&self, policy: Policy) {
        let rules = policy.rules.rules().len();
        let version = self.install_from(policy, FILES);
        tracing::info!(version, rules, "configuration reloaded");
    }

    fn unchanged(&self) {
        let mut last = self.last_reload.lock();
        if last.as_ref().is_some_and(|r| !r.ok && r.source == FILES) {
            let version = self.active.load().version;
            tracing::info!(
                version,
                "configuration files are the running configuration again; the last reload error is cleared"
            );
            *last = Some(ReloadOutcome {
                at_ms: unix_millis(),
                ok: true,
                version,
                errors: Vec::new(),
                source: FILES,
            });
        }
    }

    fn rejected(&self, errors: &ConfigErrors) {
        tracing::error!("configuration rejected; the running policy stays live:\n{errors}");
        self.rejected_from(errors, FILES);
    }

    fn current_xds(&self) -> Option<XdsRules> {
        self.active.load().policy.xds.clone()
    }

    fn composing(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.composing.lock()
    }
}

/// [`ReloadOutcome::source`] of a reload of the configuration files.
const FILES: &str = "files";
/// [`ReloadOutcome::source`] of a version from the xDS management server.
const XDS: &str = "xds";

impl Service {
    /// Applies one version (`version_info` `xds_version`) of the xDS management server's
    /// `RateLimitConfig` resources as a reload does: decoded and validated with the running
    /// files' texts (a domain defined by both is an error), installed when valid and counted
    /// either way; the running policy stays when it is refused. Returns the configuration
    /// version then running (unchanged when the resources are the running ones), or why the
    /// version was refused.
    pub fn apply_xds(
        &self,
        xds_version: &str,
        resources: &[envoy_types::pb::google::protobuf::Any],
    ) -> Result<u64, ConfigErrors> {
        let _composing = self.composing.lock();
        let rules = match XdsRules::decode(xds_version, resources) {
            Ok(rules) => rules,
            Err(errors) => {
                tracing::warn!(
                    xds_version,
                    "xDS version refused; the running rules stay:\n{errors}"
                );
                self.rejected_from(&errors, XDS);
                return Err(errors);
            }
        };
        let active = self.active.load_full();
        if active.policy.xds.as_ref() == Some(&rules) {
            tracing::debug!(xds_version, "xDS version holds the running rules");
            return Ok(active.version);
        }
        let files = active.policy.sources.clone();
        drop(active);
        match Policy::compose(files, Some(rules), &mut Vec::new()) {
            Ok(policy) => {
                let rules = policy.rules.rules().len();
                let version = self.install_from(policy, XDS);
                tracing::info!(xds_version, version, rules, "xDS version applied");
                Ok(version)
            }
            Err(errors) => {
                tracing::warn!(
                    xds_version,
                    "xDS version refused; the running rules stay:\n{errors}"
                );
                self.rejected_from(&errors, XDS);
                Err(errors)
            }
        }
    }

    /// Makes `policy` the running one (changed by `source`); returns its version.
    fn install_from(&self, policy: Policy, source: &'static str) -> u64 {
        let version = self.version.fetch_add(1, Ordering::Relaxed) + 1;
        *self.last_reload.lock() = Some(ReloadOutcome {
            at_ms: unix_millis(),
            ok: true,
            version,
            errors: Vec::new(),
            source,
        });
        self.active
            .store(Arc::new(Active::new(policy, version, &self.metrics)));
        self.metrics.reloaded(source, true, version);
        version
    }

    /// Records a configuration from `source` that was refused.
    fn rejected_from(&self, errors: &ConfigErrors, source: &'static str) {
        *self.last_reload.lock() = Some(ReloadOutcome {
            at_ms: unix_millis(),
            ok: false,
            version: self.active.load().version,
            errors: errors.to_string().lines().map(str::to_owned).collect(),
            source,
        });
        self.metrics.reloaded(source, false, 0);
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
