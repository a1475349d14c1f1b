//! Prometheus metrics (OpenMetrics text on `GET /metrics`): one registry, [`Metrics`], with a
//! part per subsystem, each in its own file with the series it exports:
//!
//! * `decisions.rs`: per domain and rule, as envoyproxy/ratelimit reports them:
//!   `flowgate_hits_total`, `flowgate_over_limit_total`, `flowgate_near_limit_total` (≥ 80 % of
//!   the limit used), `flowgate_within_limit_total`, `flowgate_shadow_mode_total` (denials let
//!   through by shadow mode). Labels are `domain` and `rule` (the rule's path in its tree), so
//!   their number is bounded by the number of rules; a rule with `detailed_metric: true` gets
//!   one series per descriptor value instead (so does `value_to_metric: true` on a level whose
//!   value the rule does not fix, named as envoyproxy/ratelimit names its stats), up to
//!   [`MAX_DETAILED_SERIES`] in all (beyond, its values are counted in the rule's own series and
//!   `flowgate_detailed_metric_overflow_total`); `flowgate_global_shadow_mode_total` counts
//!   the requests the global shadow mode let through. A reload drops the series of rules it removed
//!   (and their detailed series). Limit overrides sent by clients are counted under
//!   `rule="_override"`. And the latency of each decision,
//!   `flowgate_decision_duration_seconds{api}`.
//! * `store.rs`: `flowgate_store_errors_total{kind}`, `flowgate_fallback_decisions_total{mode}`;
//!   with a shared store (Redis), read from its fallback at each scrape:
//!   `flowgate_store_failed_calls_total` (calls that failed transiently and fell back),
//!   `flowgate_store_short_circuited_total` (requests decided by their `fail` mode without
//!   trying the store, breaker open), `flowgate_store_breaker_opened_total` and
//!   `flowgate_store_breaker_open` (1 while open).
//! * `memory.rs`: with the memory store, read from it at each scrape.
//! * `reloads.rs`: `flowgate_config_reloads_total{result,source}`, `flowgate_config_version`.
//! * `gateway.rs`: the HTTP gateway's responses, upstream pool and unread usage reports.
//! * `listener.rs`: every client-facing listener (see [`crate::listen`]) and the HTTP API's
//!   body bound.
//! * `websocket.rs`: the WebSocket gateway, read from its limiters at each scrape.
//!
//! This module depends on nothing else in the crate (only on the library and
//! `prometheus-client`): the subsystems import it, never the other way round (a test checks).

mod decisions;
mod gateway;
mod listener;
mod memory;
mod reloads;
mod rlqs;
mod store;
mod websocket;

use flowgate::envoy::{DescriptorVerdict, Rule, Status};
use flowgate::local::TableStats;
use flowgate::store::{FallbackStats, StoreError};
use prometheus_client::registry::Registry;

pub use decisions::{Api, ApiLabel, MAX_DETAILED_SERIES, RuleCounters, RuleLabels};
pub use gateway::{GatewayOutcome, OutcomeLabel, ReasonLabel, UpstreamMetrics, UsageUnread};
pub use listener::{ListenerLabel, ListenerMetrics};
pub use reloads::ResultLabel;
pub use rlqs::{
    ActionLabel as RlqsActionLabel, DecisionLabel as RlqsDecisionLabel, RlqsMetrics,
    RuleShares as RlqsRuleShares, Snapshot as RlqsSnapshot,
};
pub use store::{KindLabel, ModeLabel};
pub use websocket::WsTotals;

/// The service's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Where every metric is registered, for encoding.
    registry: Registry,
    /// Per-rule counters and decision latency.
    decisions: decisions::Decisions,
    /// Store errors and fallback decisions.
    store: store::StoreMetrics,
    /// Reloads and the running version.
    reloads: reloads::ReloadMetrics,
    /// The gateway's responses and pool.
    gateway: gateway::GatewayMetrics,
    /// The listeners.
    listeners: listener::ListenerFamilies,
    /// Where the WebSocket gateway's counters are read from, once it runs.
    websocket: websocket::WsSource,
    /// The RLQS service's metrics.
    rlqs: RlqsMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("flowgate");
        let decisions = decisions::Decisions::register(&mut registry);
        let store = store::StoreMetrics::register(&mut registry);
        let reloads = reloads::ReloadMetrics::register(&mut registry);
        let gateway = gateway::GatewayMetrics::register(&mut registry);
        let websocket = websocket::WsSource::default();
        registry.register_collector(Box::new(websocket::WsCollector(websocket.clone())));
        let listeners = listener::ListenerFamilies::register(&mut registry);
        let rlqs = RlqsMetrics::register(&mut registry);
        Metrics {
            registry,
            decisions,
            store,
            reloads,
            gateway,
            listeners,
            websocket,
            rlqs,
        }
    }

    /// The RLQS service's metrics.
    pub fn rlqs(&self) -> &RlqsMetrics {
        &self.rlqs
    }

    /// The metrics of the listener named `listener`, for its [`Acceptor`](crate::listen::Acceptor).
    pub fn listener(&self, listener: &'static str) -> ListenerMetrics {
        self.listeners.listener(listener)
    }

    /// Counts a request the global shadow mode let through although a limit denied it.
    pub fn global_shadow_mode(&self) {
        self.decisions.global_shadow_mode();
    }

    /// Counts an HTTP API request refused for its body's size.
    pub fn oversized_body(&self) {
        self.listeners.oversized_body();
    }

    /// The gateway pool's metrics, for it to update.
    pub fn upstream(&self) -> UpstreamMetrics {
        self.gateway.upstream()
    }

    /// Counts one response of the gateway.
    pub fn gateway_response(&self, outcome: GatewayOutcome) {
        self.gateway.response(outcome);
    }

    /// Counts an in-flight lease the gateway took for a request.
    pub fn gateway_lease_taken(&self) {
        self.gateway.lease_taken();
    }

    /// Counts an in-flight lease the gateway no longer holds (released, or lost).
    pub fn gateway_lease_ended(&self) {
        self.gateway.lease_ended();
    }

    /// Counts an in-flight lease that expired while its request was in flight.
    pub fn gateway_lease_lost(&self) {
        self.gateway.lease_lost();
    }

    /// Counts a usage report of an upstream response that the gateway could not read.
    pub fn usage_unread(&self, reason: UsageUnread) {
        self.gateway.usage_unread(reason);
    }

    /// Decisions taken by a failure mode so far, as `(mode, count)` for open, closed, local.
    pub fn fallback_totals(&self) -> [(&'static str, u64); 3] {
        self.store.fallback_totals()
    }

    /// The WebSocket gateway's counters, once it runs.
    pub fn websocket_totals(&self) -> Option<WsTotals> {
        self.websocket.read()
    }

    /// The counters of each rule of a new configuration, indexed by `Rule::id`; the series of
    /// rules it no longer has (and their detailed series) stop being exported.
    pub fn rule_counters(&self, rules: &[Rule]) -> Vec<RuleCounters> {
        self.decisions.rule_counters(rules)
    }

    /// Counts one descriptor's outcome. `counters` are the running configuration's, by rule id;
    /// `detail` builds the series name of rules whose name depends on the request
    /// ([`Rule::metric_per_value`](flowgate::envoy::Rule::metric_per_value): `detailed_metric`,
    /// `value_to_metric`).
    pub fn record(
        &self,
        domain: &str,
        verdict: &DescriptorVerdict<'_>,
        counters: &[RuleCounters],
        detail: impl FnOnce(&flowgate::envoy::Rule) -> String,
    ) {
        let decision = match &verdict.status {
            Status::Counted(Ok(decision)) => Some(decision),
            // Denied without counts: a blocklist, or a cost that can never fit.
            Status::Blocked { .. } | Status::Counted(Err(StoreError::Capacity(_))) => None,
            Status::Counted(Err(e)) => {
                self.store.error(e);
                return;
            }
            _ => return,
        };
        if let Some(mode) = decision.and_then(|d| d.fallback) {
            self.store.fallback_decision(mode);
        }
        self.decisions
            .count(domain, verdict, decision, counters, detail);
    }

    /// Records how long a decision took.
    pub fn observe_latency(&self, api: Api, seconds: f64) {
        self.decisions.observe_latency(api, seconds);
    }

    /// Counts a reload of `source` (`files` or `xds`) and, when it succeeded, the new version.
    pub fn reloaded(&self, source: &'static str, ok: bool, version: u64) {
        self.reloads.reloaded(source, ok, version);
    }

    /// Sets the configuration version (at start).
    pub fn set_version(&self, version: u64) {
        self.reloads.set_version(version);
    }

    /// Exports a shared store's fallback counts, read by `stats` at each scrape.
    pub fn watch_fallback(&mut self, stats: impl Fn() -> FallbackStats + Send + Sync + 'static) {
        self.registry
            .register_collector(Box::new(store::FallbackCollector(Box::new(stats))));
    }

    /// Exports the memory store's size and evictions, read by `stats` at each scrape.
    pub fn watch_memory(&mut self, stats: impl Fn() -> TableStats + Send + Sync + 'static) {
        self.registry
            .register_collector(Box::new(memory::MemoryCollector(Box::new(stats))));
    }

    /// Exports the WebSocket gateway's counters, read by `totals` at each scrape.
    pub fn watch_websocket(&self, totals: impl Fn() -> WsTotals + Send + Sync + 'static) {
        self.websocket.set(totals);
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use super::Metrics;

    /// The value of `series` (name and labels, exactly as encoded) in an OpenMetrics `text`.
    pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn families_have_help_and_type_and_the_text_ends_as_openmetrics_requires() {
        let text = Metrics::new().encode();
        assert!(text.ends_with("# EOF\n"), "{text}");
        // The families with series from the start (the others appear with their first series).
        for family in [
            "flowgate_config_version",
            "flowgate_decision_duration_seconds",
            "flowgate_gateway_responses",
            "flowgate_gateway_upstream_connects",
            "flowgate_http_oversized_bodies",
            "flowgate_detailed_metric_overflow",
            "flowgate_gateway_usage_unread",
        ] {
            assert!(
                text.contains(&format!("# HELP {family} ")),
                "{family}: {text}"
            );
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "{family}: {text}"
            );
        }
    }

    /// The crate paths (`crate::…`, `super::…` out of the module) that `source` names outside
    /// test code.
    fn outside_references(source: &str, depth: usize) -> Vec<String> {
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        let mut found = Vec::new();
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            // `crate::metrics::…` is this module; anything else in the crate is not.
            for (at, _) in line.match_indices("crate::") {
                if !line[at..].starts_with("crate::metrics") {
                    found.push(line.to_owned());
                }
            }
            // From a file `depth` levels below the crate root, `super::` that many times leaves
            // the module.
            if depth > 0 && line.contains(&"super::".repeat(depth)) {
                found.push(line.to_owned());
            }
        }
        found
    }

    #[test]
    fn metrics_imports_nothing_else_of_the_crate_so_no_import_cycle_runs_through_it() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics");
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.map(|e| e.path()).unwrap_or_default();
            let Ok(source) = std::fs::read_to_string(&path) else {
                continue;
            };
            // `mod.rs` is one level below the crate root, its siblings two.
            let depth = if path.ends_with("mod.rs") { 1 } else { 2 };
            let outside = outside_references(&source, depth);
            assert!(
                outside.is_empty(),
                "{} reaches out of `metrics`: {outside:#?}",
                path.display()
            );
            files += 1;
        }
        assert!(files >= 8, "read only {files} files of {}", dir.display());
        // The check itself sees an import when there is one.
        assert_eq!(
            outside_references("use crate::gateway::ws::WsTotals;", 2).len(),
            1
        );
        assert_eq!(
            outside_references("use super::super::api::Service;", 2).len(),
            1
        );
        assert!(outside_references("use crate::metrics::Api;", 2).is_empty());
    }
}
