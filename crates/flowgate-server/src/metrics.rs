//! Prometheus metrics (OpenMetrics text on `GET /metrics`).
//!
//! Per domain and rule, as envoyproxy/ratelimit reports them: `flowgate_hits_total`,
//! `flowgate_over_limit_total`, `flowgate_near_limit_total` (≥ 80 % of the limit used),
//! `flowgate_within_limit_total`, `flowgate_shadow_mode_total` (denials let through by shadow
//! mode). Labels are `domain` and `rule` (the rule's path in its tree), so their number is
//! bounded by the number of rules; a rule with `detailed_metric: true`, or `value_to_metric:
//! true` on a level whose value the rule does not fix, gets one series per descriptor value
//! instead, named as envoyproxy/ratelimit names its stats
//! ([`Rule::metric_name`](flowgate::envoy::Rule::metric_name)), up to [`MAX_DETAILED_SERIES`]
//! in all (beyond, its values are counted in the rule's own series and
//! `flowgate_detailed_metric_overflow_total`). `flowgate_global_shadow_mode_total` counts the
//! requests the global shadow mode let through. A reload
//! drops the series of rules it removed (and their detailed series). Limit overrides sent by clients are counted under
//! `rule="_override"`.
//!
//! Service-wide: `flowgate_store_errors_total{kind}`, `flowgate_fallback_decisions_total{mode}`,
//! `flowgate_config_reloads_total{result}`, `flowgate_config_version`, and the latency of each
//! decision `flowgate_decision_duration_seconds{api}`.
//!
//! With a shared store (Redis), read from its fallback at each scrape:
//! `flowgate_store_failed_calls_total` (calls that failed transiently and fell back),
//! `flowgate_store_short_circuited_total` (requests decided by their `fail` mode without trying
//! the store, breaker open), `flowgate_store_breaker_opened_total` and
//! `flowgate_store_breaker_open` (1 while open).
//!
//! With the memory store, read from it at each scrape: `flowgate_memory_store_keys`,
//! `flowgate_memory_store_bytes` and `flowgate_memory_store_evicted_active_total` (counters
//! evicted while still active: more than `max_keys` per algorithm were active at once — each
//! is a limit silently reset; alert on any increase).
//!
//! The gateway: `flowgate_gateway_responses_total{outcome}` (forwarded, limited, rejected,
//! unavailable, bad_gateway, gateway_timeout), `flowgate_gateway_upstream_connects_total`
//! (connections opened to the upstream; with keep-alive working it stays far below the
//! forwarded responses) and `flowgate_gateway_upstream_idle_connections`.
//!
//! Every client-facing listener (see [`crate::listen`]):
//! `flowgate_listener_connections{listener}`, `flowgate_listener_refused_connections_total{listener}`
//! `flowgate_listener_timeouts_total{listener}`, `flowgate_listener_oversized_heads_total{listener}`
//! and `flowgate_listener_tls_handshake_failures_total{listener}`,
//! `listener` = http, grpc, gateway, websocket; `flowgate_http_oversized_bodies_total` (HTTP API
//! requests refused with 413).
//!
//! The WebSocket gateway, read from its limiters at each scrape (summed over the running one
//! and those a reload replaced while their connections live on):
//! `flowgate_ws_decisions_total{direction,scope,outcome}` (per layer: allowed, rejected,
//! dry_run, released), `flowgate_ws_refused_upgrades_total{scope}`,
//! `flowgate_ws_closes_total{code}` (close frames the gateway sent, by code),
//! `flowgate_ws_message_size_bytes{direction}` (a histogram), `flowgate_ws_connections`
//! (open now), `flowgate_ws_connections_opened_total`, `flowgate_ws_penalty_bans_total`,
//! `flowgate_ws_penalized_clients`, `flowgate_ws_slow_reader_total{direction,action}` (paused,
//! dropped, closed) and `flowgate_ws_upstream_failures_total{reason}` (connect, refused,
//! timeout). Every label has a fixed set of values (close codes: those the gateway sends).

use flowgate::FailMode;
use flowgate::envoy::Rule;
use flowgate::envoy::{AppliedLimit, DescriptorVerdict, Status};
use flowgate::local::TableStats;
use flowgate::store::{FallbackStats, StoreError};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::gateway::ws::WsTotals;

/// The most `detailed_metric` series kept at once (over all rules): each is one per descriptor
/// value, and values come from clients.
pub const MAX_DETAILED_SERIES: usize = 1000;

/// The per-rule series that exist, so that a reload can drop those of removed rules.
#[derive(Debug, Default)]
struct Series {
    /// The running configuration's rules.
    rules: std::collections::HashSet<RuleLabels>,
    /// Detailed series, each with the rule it belongs to.
    detailed: std::collections::HashMap<RuleLabels, RuleLabels>,
}

/// The API a decision was asked through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Envoy RLS over gRPC.
    Grpc = 0,
    /// `POST /json`.
    Json = 1,
    /// `POST /v1/check`.
    Check = 2,
    /// The reverse proxy.
    Gateway = 3,
}

/// What the gateway answered a request with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayOutcome {
    /// Passed to the upstream; its response went back.
    Forwarded = 0,
    /// 429: over a limit.
    Limited = 1,
    /// 400 (or 401): the request could not be keyed or was malformed.
    Rejected = 2,
    /// 503: the store failed and the limit fails closed.
    Unavailable = 3,
    /// 502: the upstream could not be reached or answered badly.
    BadGateway = 4,
    /// 504: the upstream did not answer in time.
    GatewayTimeout = 5,
}

impl GatewayOutcome {
    /// Every outcome's label value, by discriminant.
    const LABELS: [&'static str; 6] = [
        "forwarded",
        "limited",
        "rejected",
        "unavailable",
        "bad_gateway",
        "gateway_timeout",
    ];
}

/// Label of the gateway's response counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// What the gateway answered.
    pub outcome: &'static str,
}

/// Labels of the per-rule counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    /// The rule's domain.
    pub domain: String,
    /// The rule's path (`key_value.key2`), or `_override`.
    pub rule: String,
}

/// Labels naming one value of a small fixed set.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// The value.
    pub kind: &'static str,
}

/// Label of the decision-latency histogram.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabel {
    /// `grpc`, `json`, `check` or `gateway`.
    pub api: &'static str,
}

/// Label of the listener metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// `http`, `grpc`, `gateway` or `websocket`.
    pub listener: &'static str,
}

/// Label of the reload counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `failed`.
    pub result: &'static str,
}

/// Label of the fallback counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    /// `open`, `closed` or `local`.
    pub mode: &'static str,
}

/// Every per-rule counter family.
#[derive(Debug, Clone, Default)]
struct RuleFamilies {
    hits: Family<RuleLabels, Counter>,
    over_limit: Family<RuleLabels, Counter>,
    near_limit: Family<RuleLabels, Counter>,
    within_limit: Family<RuleLabels, Counter>,
    shadow_mode: Family<RuleLabels, Counter>,
}

/// One rule's counters, resolved once per configuration so the hot path only does atomic adds.
#[derive(Debug, Clone)]
pub struct RuleCounters {
    hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
}

impl RuleCounters {
    /// Units allowed so far (`flowgate_within_limit_total` of the rule).
    pub fn allowed(&self) -> u64 {
        self.within_limit.get()
    }

    /// Units denied so far, or let through by shadow mode (`flowgate_over_limit_total`).
    pub fn denied(&self) -> u64 {
        self.over_limit.get()
    }
}

/// The service's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Where every metric is registered, for encoding.
    registry: Registry,
    rules: RuleFamilies,
    store_errors: Family<KindLabel, Counter>,
    fallbacks: Family<ModeLabel, Counter>,
    /// The same decisions by mode (`[open, closed, local]`), for the dashboard to read
    /// without creating series.
    fallback_totals: [Counter; 3],
    reloads: Family<ResultLabel, Counter>,
    version: Gauge,
    /// Decision latency per API, resolved once: `[grpc, json, check, gateway]`.
    latency: [Histogram; 4],
    /// The gateway's responses by outcome, resolved once (by `GatewayOutcome`).
    gateway: [Counter; 6],
    /// The gateway's connection pool.
    upstream: UpstreamMetrics,
    /// Where the WebSocket gateway's counters are read from, once it runs.
    websocket: WsSource,
    /// Open connections per listener.
    listener_open: Family<ListenerLabel, Gauge>,
    /// Connections refused per listener.
    listener_refused: Family<ListenerLabel, Counter>,
    /// Request heads that came too late, per listener.
    listener_timeouts: Family<ListenerLabel, Counter>,
    /// Request heads that were too large, per listener.
    listener_oversized: Family<ListenerLabel, Counter>,
    /// TLS handshakes that failed or timed out, per listener.
    listener_tls_failures: Family<ListenerLabel, Counter>,
    /// HTTP API request bodies over the limit.
    http_oversized_bodies: Counter,
    /// The per-rule series that exist.
    series: parking_lot::Mutex<Series>,
    /// `detailed_metric` values counted in their rule's series because of the bound.
    detailed_overflow: Counter,
    /// Requests the global shadow mode let through although a limit denied them.
    global_shadow: Counter,
}

/// Reads the WebSocket gateway's counters.
#[derive(Clone, Default)]
struct WsSource(std::sync::Arc<parking_lot::Mutex<Option<TotalsFn>>>);

/// A function returning the WebSocket gateway's counters.
type TotalsFn = Box<dyn Fn() -> WsTotals + Send + Sync>;

impl std::fmt::Debug for WsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WsSource")
    }
}

/// What the gateway's pool of upstream connections reports.
#[derive(Debug, Clone, Default)]
pub struct UpstreamMetrics {
    /// Connections opened (attempts that got a TCP connection).
    pub connects: Counter,
    /// Connections idle in the pool now.
    pub idle: Gauge,
    /// Connections open now, busy and idle.
    pub open: Gauge,
    /// Requests that found every connection busy and had to wait.
    pub queued: Counter,
    /// Requests refused (503) because every connection stayed busy for the queue timeout.
    pub busy: Counter,
    /// Request bodies (client uploads) given up after the body idle timeout.
    pub request_body_timeouts: Counter,
    /// Response bodies (from the upstream) given up after the body idle timeout.
    pub response_body_timeouts: Counter,
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
        let rules = RuleFamilies::default();
        registry.register("hits", "Units asked for, per rule", rules.hits.clone());
        registry.register(
            "over_limit",
            "Units denied (or that shadow mode let through), per rule",
            rules.over_limit.clone(),
        );
        registry.register(
            "near_limit",
            "Units allowed with at least 80% of the limit used, per rule",
            rules.near_limit.clone(),
        );
        registry.register(
            "within_limit",
            "Units allowed, per rule",
            rules.within_limit.clone(),
        );
        registry.register(
            "shadow_mode",
            "Units over the limit that shadow mode let through, per rule",
            rules.shadow_mode.clone(),
        );
        let store_errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "store_errors",
            "Store calls that failed, by kind (timeout, unavailable, backend)",
            store_errors.clone(),
        );
        let fallbacks = Family::<ModeLabel, Counter>::default();
        registry.register(
            "fallback_decisions",
            "Decisions taken by a failure mode because the store could not be asked",
            fallbacks.clone(),
        );
        let reloads = Family::<ResultLabel, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration reloads, by result (ok, failed)",
            reloads.clone(),
        );
        let version = Gauge::default();
        registry.register(
            "config_version",
            "Version of the running configuration (1 at start, +1 per reload)",
            version.clone(),
        );
        let latency = Family::<ApiLabel, Histogram>::new_with_constructor(|| {
            // 10 µs … ~84 ms.
            Histogram::new(exponential_buckets(0.000_01, 2.0, 14))
        });
        registry.register(
            "decision_duration_seconds",
            "Time to decide one request, by API",
            latency.clone(),
        );
        let latency = ["grpc", "json", "check", "gateway"]
            .map(|api| latency.get_or_create_owned(&ApiLabel { api }));
        let outcomes = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "gateway_responses",
            "Responses of the reverse proxy, by outcome",
            outcomes.clone(),
        );
        let gateway = GatewayOutcome::LABELS
            .map(|outcome| outcomes.get_or_create_owned(&OutcomeLabel { outcome }));
        let upstream = UpstreamMetrics::default();
        registry.register(
            "gateway_upstream_connects",
            "Connections the gateway opened to its upstream",
            upstream.connects.clone(),
        );
        registry.register(
            "gateway_upstream_idle_connections",
            "Keep-alive connections to the upstream idle in the gateway's pool",
            upstream.idle.clone(),
        );
        registry.register(
            "gateway_upstream_connections",
            "Connections to the upstream open now, busy and idle (at most upstream_max_connections)",
            upstream.open.clone(),
        );
        registry.register(
            "gateway_upstream_queued",
            "Requests that found every upstream connection busy and waited for one",
            upstream.queued.clone(),
        );
        registry.register(
            "gateway_upstream_busy",
            "Requests answered 503 because every upstream connection stayed busy for upstream_queue_timeout",
            upstream.busy.clone(),
        );
        registry.register(
            "gateway_request_body_timeouts",
            "Client request bodies given up after body_idle_timeout without data",
            upstream.request_body_timeouts.clone(),
        );
        registry.register(
            "gateway_response_body_timeouts",
            "Upstream response bodies given up after body_idle_timeout without data",
            upstream.response_body_timeouts.clone(),
        );
        let websocket = WsSource::default();
        registry.register_collector(Box::new(WsCollector(websocket.clone())));
        let listener_open = Family::<ListenerLabel, Gauge>::default();
        registry.register(
            "listener_connections",
            "Client connections open now, per listener",
            listener_open.clone(),
        );
        let listener_refused = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "listener_refused_connections",
            "Client connections closed as soon as accepted because the listener was full",
            listener_refused.clone(),
        );
        let listener_timeouts = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "listener_timeouts",
            "Client connections closed because a request head did not arrive in time",
            listener_timeouts.clone(),
        );
        let listener_oversized = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "listener_oversized_heads",
            "Request heads over the size limit (answered 431), per listener",
            listener_oversized.clone(),
        );
        let listener_tls_failures = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "listener_tls_handshake_failures",
            "TLS handshakes that failed or did not finish within the header read timeout, per listener",
            listener_tls_failures.clone(),
        );
        let http_oversized_bodies = Counter::default();
        registry.register(
            "http_oversized_bodies",
            "HTTP API requests refused (413) because their body was over --max-body-bytes",
            http_oversized_bodies.clone(),
        );
        let detailed_overflow = Counter::default();
        registry.register(
            "detailed_metric_overflow",
            "Hits of detailed_metric rules counted in the rule's own series because MAX_DETAILED_SERIES value series exist",
            detailed_overflow.clone(),
        );
        let global_shadow = Counter::default();
        registry.register(
            "global_shadow_mode",
            "Requests allowed by the global shadow mode (--shadow-mode) although a limit denied them",
            global_shadow.clone(),
        );
        Metrics {
            series: parking_lot::Mutex::default(),
            detailed_overflow,
            global_shadow,
            http_oversized_bodies,
            listener_oversized,
            listener_tls_failures,
            listener_open,
            listener_refused,
            listener_timeouts,
            websocket,
            registry,
            rules,
            store_errors,
            fallbacks,
            fallback_totals: Default::default(),
            reloads,
            version,
            latency,
            gateway,
            upstream,
        }
    }

    /// The metrics of the listener named `listener`, for its [`Acceptor`](crate::listen::Acceptor).
    pub fn listener(&self, listener: &'static str) -> crate::listen::ListenerMetrics {
        let label = ListenerLabel { listener };
        crate::listen::ListenerMetrics {
            open: self.listener_open.get_or_create_owned(&label),
            refused: self.listener_refused.get_or_create_owned(&label),
            timeouts: self.listener_timeouts.get_or_create_owned(&label),
            oversized: self.listener_oversized.get_or_create_owned(&label),
            tls_failures: self.listener_tls_failures.get_or_create_owned(&label),
        }
    }

    /// Counts a request the global shadow mode let through although a limit denied it.
    pub fn global_shadow_mode(&self) {
        self.global_shadow.inc();
    }

    /// Counts an HTTP API request refused for its body's size.
    pub fn oversized_body(&self) {
        self.http_oversized_bodies.inc();
    }

    /// The gateway pool's metrics, for it to update.
    pub fn upstream(&self) -> UpstreamMetrics {
        self.upstream.clone()
    }

    /// Counts one response of the gateway.
    pub fn gateway_response(&self, outcome: GatewayOutcome) {
        self.gateway[outcome as usize].inc();
    }

    /// Counts a decision that a failure mode took because the store could not be asked.
    fn fallback_decision(&self, mode: FailMode) {
        self.fallbacks
            .get_or_create(&ModeLabel { mode: mode.name() })
            .inc();
        let i = match mode {
            FailMode::Open => 0,
            FailMode::Closed => 1,
            FailMode::Local => 2,
            // A mode this build does not know of has no total of its own.
            _ => return,
        };
        self.fallback_totals[i].inc();
    }

    /// Decisions taken by a failure mode so far, as `(mode, count)` for open, closed, local.
    pub fn fallback_totals(&self) -> [(&'static str, u64); 3] {
        let [open, closed, local] = &self.fallback_totals;
        [
            ("open", open.get()),
            ("closed", closed.get()),
            ("local", local.get()),
        ]
    }

    /// The WebSocket gateway's counters, once it runs.
    pub fn websocket_totals(&self) -> Option<WsTotals> {
        self.websocket.0.lock().as_ref().map(|read| read())
    }

    /// The counters of each rule of a new configuration, indexed by `Rule::id`; the series of
    /// rules it no longer has (and their detailed series) stop being exported.
    pub fn rule_counters(&self, rules: &[Rule]) -> Vec<RuleCounters> {
        let labels: std::collections::HashSet<RuleLabels> = rules
            .iter()
            .map(|rule| RuleLabels {
                domain: rule.domain.clone(),
                rule: rule.path.clone(),
            })
            .collect();
        {
            let mut series = self.series.lock();
            let gone: Vec<RuleLabels> = series.rules.difference(&labels).cloned().collect();
            for old in &gone {
                self.remove_series(old);
            }
            let rules_now = &labels;
            let mut dropped = Vec::new();
            series.detailed.retain(|detail, rule| {
                let keep = rules_now.contains(rule);
                if !keep {
                    dropped.push(detail.clone());
                }
                keep
            });
            for detail in &dropped {
                self.remove_series(detail);
            }
            series.rules.clone_from(&labels);
        }
        rules
            .iter()
            .map(|rule| {
                self.counters(RuleLabels {
                    domain: rule.domain.clone(),
                    rule: rule.path.clone(),
                })
            })
            .collect()
    }

    /// Stops exporting the per-rule series of `labels`.
    fn remove_series(&self, labels: &RuleLabels) {
        let f = &self.rules;
        for family in [
            &f.hits,
            &f.over_limit,
            &f.near_limit,
            &f.within_limit,
            &f.shadow_mode,
        ] {
            family.remove(labels);
        }
    }

    fn counters(&self, labels: RuleLabels) -> RuleCounters {
        RuleCounters {
            hits: self.rules.hits.get_or_create_owned(&labels),
            over_limit: self.rules.over_limit.get_or_create_owned(&labels),
            near_limit: self.rules.near_limit.get_or_create_owned(&labels),
            within_limit: self.rules.within_limit.get_or_create_owned(&labels),
            shadow_mode: self.rules.shadow_mode.get_or_create_owned(&labels),
        }
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
                let kind = match e {
                    StoreError::Timeout(_) => "timeout",
                    StoreError::Unavailable(_) => "unavailable",
                    _ => "backend",
                };
                self.store_errors.get_or_create(&KindLabel { kind }).inc();
                return;
            }
            _ => return,
        };
        if let Some(mode) = decision.and_then(|d| d.fallback) {
            self.fallback_decision(mode);
        }
        let owned;
        let counters = match verdict.applied {
            Some(AppliedLimit::Rule(rule)) if !rule.metric_per_value() => {
                match counters.get(rule.id) {
                    Some(c) => c,
                    None => return,
                }
            }
            Some(AppliedLimit::Rule(rule)) => {
                let labels = RuleLabels {
                    domain: rule.domain.clone(),
                    rule: detail(rule),
                };
                let mut series = self.series.lock();
                let known = series.detailed.contains_key(&labels);
                if known || series.detailed.len() < MAX_DETAILED_SERIES {
                    if !known {
                        let of = RuleLabels {
                            domain: rule.domain.clone(),
                            rule: rule.path.clone(),
                        };
                        series.detailed.insert(labels.clone(), of);
                    }
                    drop(series);
                    owned = self.counters(labels);
                    &owned
                } else {
                    drop(series);
                    self.detailed_overflow.inc();
                    match counters.get(rule.id) {
                        Some(c) => c,
                        None => return,
                    }
                }
            }
            Some(AppliedLimit::Override(..)) => {
                owned = self.counters(RuleLabels {
                    domain: domain.to_owned(),
                    rule: "_override".to_owned(),
                });
                &owned
            }
            None => return,
        };
        let hits = verdict.hits;
        counters.hits.inc_by(hits);
        match decision {
            Some(d) if d.allowed => {
                counters.within_limit.inc_by(hits);
                // Near: 80 % or more of the capacity is used.
                let used = d.burst.saturating_sub(d.remaining);
                if d.burst > 0 && used.saturating_mul(10) >= d.burst.saturating_mul(8) {
                    counters.near_limit.inc_by(hits);
                }
            }
            _ => {
                counters.over_limit.inc_by(hits);
                if verdict.applied.is_some_and(|a| a.shadow_mode()) {
                    counters.shadow_mode.inc_by(hits);
                }
            }
        }
    }

    /// Records how long a decision took.
    pub fn observe_latency(&self, api: Api, seconds: f64) {
        self.latency[api as usize].observe(seconds);
    }

    /// Counts a reload and, when it succeeded, the new version.
    pub fn reloaded(&self, ok: bool, version: u64) {
        let result = if ok { "ok" } else { "failed" };
        self.reloads.get_or_create(&ResultLabel { result }).inc();
        if ok {
            self.version.set(i64::try_from(version).unwrap_or(i64::MAX));
        }
    }

    /// Sets the configuration version (at start).
    pub fn set_version(&self, version: u64) {
        self.version.set(i64::try_from(version).unwrap_or(i64::MAX));
    }

    /// Exports a shared store's fallback counts, read by `stats` at each scrape.
    pub fn watch_fallback(&mut self, stats: impl Fn() -> FallbackStats + Send + Sync + 'static) {
        self.registry
            .register_collector(Box::new(FallbackCollector(Box::new(stats))));
    }

    /// Exports the memory store's size and evictions, read by `stats` at each scrape.
    pub fn watch_memory(&mut self, stats: impl Fn() -> TableStats + Send + Sync + 'static) {
        self.registry
            .register_collector(Box::new(MemoryCollector(Box::new(stats))));
    }

    /// Exports the WebSocket gateway's counters, read by `totals` at each scrape.
    pub fn watch_websocket(&self, totals: impl Fn() -> WsTotals + Send + Sync + 'static) {
        *self.websocket.0.lock() = Some(Box::new(totals));
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Reads the memory store's [`TableStats`] at each scrape.
struct MemoryCollector(Box<dyn Fn() -> TableStats + Send + Sync>);

impl std::fmt::Debug for MemoryCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryCollector")
    }
}

impl Collector for MemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stats = (self.0)();
        let gauges = [
            (
                "memory_store_keys",
                "Counters the in-memory store holds now",
                stats.keys,
            ),
            (
                "memory_store_bytes",
                "Bytes the in-memory store's tables have allocated",
                stats.bytes,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        let evicted = ConstCounter::new(stats.evicted_active);
        let metric = encoder.encode_descriptor(
            "memory_store_evicted_active",
            "Active counters dropped because more than max_keys were active at once (each a silent limit reset)",
            None,
            evicted.metric_type(),
        )?;
        evicted.encode(metric)
    }
}

/// Reads a shared store's [`FallbackStats`] at each scrape.
struct FallbackCollector(Box<dyn Fn() -> FallbackStats + Send + Sync>);

impl std::fmt::Debug for FallbackCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FallbackCollector")
    }
}

impl Collector for FallbackCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stats = (self.0)();
        let counters = [
            (
                "store_failed_calls",
                "Calls to the shared store that failed transiently (their requests fell back)",
                stats.store_errors,
            ),
            (
                "store_short_circuited",
                "Requests decided by their fail mode without asking the store (breaker open)",
                stats.short_circuited,
            ),
            (
                "store_breaker_opened",
                "Times the shared store's circuit breaker opened",
                stats.breaker_opened,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let open = ConstGauge::new(i64::from(stats.breaker_open));
        open.encode(encoder.encode_descriptor(
            "store_breaker_open",
            "1 while the shared store's circuit breaker is open",
            None,
            open.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Reads the WebSocket gateway's [`WsTotals`] at each scrape.
struct WsCollector(WsSource);

impl std::fmt::Debug for WsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WsCollector")
    }
}

/// The direction label's values, by index.
const DIRECTIONS: [&str; 2] = ["inbound", "outbound"];

impl Collector for WsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let totals = match self.0.0.lock().as_ref() {
            Some(read) => read(),
            None => return Ok(()),
        };
        let sides = [&totals.inbound, &totals.outbound];
        let mut family = encoder.encode_descriptor(
            "ws_decisions",
            "WebSocket message decisions, by direction, layer and outcome",
            None,
            MetricType::Counter,
        )?;
        for (direction, stats) in DIRECTIONS.iter().zip(sides) {
            for (scope, outcome, n) in &stats.decisions {
                let labels = [
                    ("direction", *direction),
                    ("scope", scope.name()),
                    ("outcome", outcome.name()),
                ];
                ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "ws_refused_upgrades",
            "WebSocket upgrades refused with 429, by the cap or rate that refused",
            None,
            MetricType::Counter,
        )?;
        for (scope, n) in &totals.inbound.refused {
            ConstCounter::new(*n).encode(family.encode_family(&[("scope", scope.name())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "ws_closes",
            "Close frames the WebSocket gateway sent, by code",
            None,
            MetricType::Counter,
        )?;
        let mut closes: Vec<(u16, u64)> = totals.inbound.closes.clone();
        for (code, n) in &totals.outbound.closes {
            match closes.iter_mut().find(|(c, _)| c == code) {
                Some((_, m)) => *m += n,
                None => closes.push((*code, *n)),
            }
        }
        closes.sort_unstable();
        for (code, n) in closes {
            let code = code.to_string();
            ConstCounter::new(n).encode(family.encode_family(&[("code", code.as_str())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "ws_message_size_bytes",
            "Sizes of the WebSocket messages judged, by direction",
            None,
            MetricType::Histogram,
        )?;
        for (direction, stats) in DIRECTIONS.iter().zip(sides) {
            if stats.size_buckets.is_empty() {
                continue;
            }
            let buckets: Vec<(f64, u64)> = flowgate::ws::SIZE_BUCKETS
                .iter()
                .map(|b| *b as f64)
                .chain([f64::INFINITY])
                .zip(stats.size_buckets.iter().copied())
                .collect();
            let count = stats.size_buckets.iter().sum();
            family
                .encode_family(&[("direction", *direction)])?
                .encode_histogram::<Vec<(String, String)>>(
                    stats.size_sum as f64,
                    count,
                    &buckets,
                    None,
                )?;
        }
        let gauges = [
            (
                "ws_connections",
                "WebSocket connections open now (admitted, not yet closed)",
                totals.inbound.live,
            ),
            (
                "ws_penalized_clients",
                "Clients the WebSocket penalty box remembers now",
                totals.penalized,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let mut family = encoder.encode_descriptor(
            "ws_tracked",
            "What the WebSocket limiters hold now: sessions, and IPs and users with open connections (all 0 when no connection is open)",
            None,
            MetricType::Gauge,
        )?;
        let (sessions, ips, users) = totals.tracked;
        for (what, n) in [("sessions", sessions), ("ips", ips), ("users", users)] {
            ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
                .encode(family.encode_family(&[("what", what)])?)?;
        }
        let gauges = [(
            "ws_relays",
            "WebSocket connections being relayed now",
            totals.relays,
        )];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let counters = [
            (
                "ws_connections_opened",
                "WebSocket connections admitted",
                totals.inbound.opened,
            ),
            (
                "ws_penalty_bans",
                "Bans the WebSocket penalty box handed out",
                totals.inbound.banned,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let mut family = encoder.encode_descriptor(
            "ws_slow_reader",
            "Messages a slow reader's full buffer paused, dropped or closed, by the direction of the messages",
            None,
            MetricType::Counter,
        )?;
        for (direction, counts) in DIRECTIONS.iter().zip(totals.slow) {
            for (action, n) in ["paused", "dropped", "closed"].iter().zip(counts) {
                let labels = [("direction", *direction), ("action", *action)];
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "ws_upstream_failures",
            "WebSocket upgrades that did not reach the upstream, by reason",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in ["connect", "refused", "timeout"]
            .iter()
            .zip(totals.upstream_failures)
        {
            ConstCounter::new(n).encode(family.encode_family(&[("reason", *reason)])?)?;
        }
        Ok(())
    }
}
