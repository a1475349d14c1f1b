//! What the dashboard shows, sampled once a second: [`Snapshot`], and the [`Sampler`] that
//! turns the service's counters into per-second rates.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use utoipa::ToSchema;

use crate::api::{Service, unix_millis};

/// How many top denied keys a snapshot lists.
pub const TOP_KEYS_SHOWN: usize = 10;

/// One second of the service, as the dashboard receives it (`GET /dashboard/snapshot`, and
/// each `snapshot` event of `GET /dashboard/events`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Snapshot {
    /// When it was taken (milliseconds since the Unix epoch).
    pub time_ms: u64,
    /// The running configuration and the last reload.
    pub config: ConfigView,
    /// The store's health.
    pub store: StoreView,
    /// Decisions taken by a failure mode because the store could not be asked, by mode.
    pub fallback: FallbackView,
    /// Every rule that counts, with its rates over the last sample.
    pub rules: Vec<RuleRate>,
    /// The keys denied most since the start (Space-Saving estimates).
    pub top_denied: Vec<TopKeyView>,
    /// Denied units recorded for `top_denied` in all.
    pub top_denied_total: u64,
    /// The WebSocket gateway, when it runs.
    pub websocket: Option<WebSocketView>,
    /// Envoy's Rate Limit Quota Service: streams, and the shares of each rule.
    pub rlqs: RlqsView,
}

/// The RLQS service on this instance.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RlqsView {
    /// Streams (Envoys) connected now.
    pub streams: usize,
    /// Buckets they report.
    pub buckets: usize,
    /// Per rule with buckets here.
    pub rules: Vec<RlqsRuleView>,
}

/// One rule's buckets on this instance and the shares they hold.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RlqsRuleView {
    /// The rule's domain.
    pub domain: String,
    /// The rule's path.
    pub rule: String,
    /// Its limit per period.
    pub limit: u64,
    /// Its period, ms.
    pub period_ms: u64,
    /// Rule instances (descriptor values) with buckets here.
    pub instances: usize,
    /// Buckets here.
    pub members: usize,
    /// Tokens per period they hold.
    pub tokens: u64,
}

/// The running configuration and the last reload.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConfigView {
    /// 1 for the configuration loaded at start, +1 per successful reload.
    pub version: u64,
    /// The `version_info` of the xDS management server's rules running, if any.
    pub xds_version: Option<String>,
    /// The last reload: `null` until one is tried.
    pub last_reload: Option<ReloadView>,
}

/// What the last reload did.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReloadView {
    /// When (milliseconds since the Unix epoch).
    pub at_ms: u64,
    /// Whether the new files were installed.
    pub ok: bool,
    /// The version running after it.
    pub version: u64,
    /// Why the files were rejected (file:line:column and the field); empty when ok.
    pub errors: Vec<String>,
    /// What changed: `files` or `xds`.
    pub source: &'static str,
}

/// The store's health.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StoreView {
    /// `local` (this process's memory) or `shared` (Redis).
    pub kind: &'static str,
    /// Whether the store itself answered a probe within a second.
    pub reachable: bool,
    /// Whether the shared store's circuit breaker is open (always `false` for `local`).
    pub breaker_open: bool,
    /// Calls to the shared store that failed transiently.
    pub failed_calls: u64,
    /// Requests decided by their fail mode without asking the store (breaker open).
    pub short_circuited: u64,
    /// Times the breaker opened.
    pub breaker_opened: u64,
}

/// Fallback decisions by mode, since the start.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FallbackView {
    /// Allowed by `fail: open`.
    pub open: u64,
    /// Denied by `fail: closed`.
    pub closed: u64,
    /// Decided by `fail: local`.
    pub local: u64,
}

/// One rule's traffic.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuleRate {
    /// The rule's domain.
    pub domain: String,
    /// The rule's path in its tree (`key_value.key2`).
    pub rule: String,
    /// The rule's name, if it has one.
    pub name: Option<String>,
    /// Units allowed per second over the last sample.
    pub allowed_per_sec: f64,
    /// Units denied (or over the limit in shadow mode) per second over the last sample.
    pub denied_per_sec: f64,
    /// Units allowed since the start.
    pub allowed_total: u64,
    /// Units denied since the start.
    pub denied_total: u64,
}

/// One heavily denied key.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopKeyView {
    /// `domain/key=value/...`: the key's admin path below `/v1/keys/`.
    pub key: String,
    /// Estimated denied units: at least the true count.
    pub count: u64,
    /// The most by which `count` may exceed the true count.
    pub error: u64,
}

/// The WebSocket gateway.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WebSocketView {
    /// Connections open now.
    pub connections: u64,
    /// Connections admitted since the start.
    pub opened_total: u64,
    /// Upgrades refused with 429 since the start.
    pub refused_upgrades_total: u64,
    /// Close frames the gateway sent, by code, since the start.
    pub closes: Vec<CloseCount>,
}

/// Close frames of one code.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CloseCount {
    /// The close code (1008, 1009, 4008, …).
    pub code: u16,
    /// How many.
    pub count: u64,
}

/// Turns counters into rates: remembers the previous sample's totals.
#[derive(Debug, Default)]
pub struct Sampler {
    /// `(allowed, denied)` totals per `(domain, rule)` at the previous sample, and when.
    previous: HashMap<(String, String), (u64, u64)>,
    /// When the previous sample was taken.
    at: Option<Instant>,
}

impl Sampler {
    /// Samples `service` now.
    pub async fn sample(&mut self, service: &Service) -> Snapshot {
        let now = Instant::now();
        let elapsed = self
            .at
            .map_or(0.0, |at| now.duration_since(at).as_secs_f64());
        self.at = Some(now);
        let active = service.active();
        let mut previous = HashMap::with_capacity(self.previous.len());
        let rules = active
            .policy
            .rules
            .rules()
            .iter()
            .zip(active.rule_counters())
            .filter(|(rule, _)| rule.rate.limit().is_some())
            .map(|(rule, counters)| {
                let (allowed, denied) = (counters.allowed(), counters.denied());
                // A rule with several limits shows each (`path#index`).
                let key = (rule.domain.clone(), rule.limit_path().to_owned());
                let rate = |now: u64, before: Option<u64>| match before {
                    Some(before) if elapsed > 0.0 => now.saturating_sub(before) as f64 / elapsed,
                    _ => 0.0,
                };
                let before = self.previous.get(&key).copied();
                let view = RuleRate {
                    domain: rule.domain.clone(),
                    rule: key.1.clone(),
                    name: rule.name.clone(),
                    allowed_per_sec: rate(allowed, before.map(|b| b.0)),
                    denied_per_sec: rate(denied, before.map(|b| b.1)),
                    allowed_total: allowed,
                    denied_total: denied,
                };
                previous.insert(key, (allowed, denied));
                view
            })
            .collect();
        self.previous = previous;
        let backend = service.backend();
        let stats = backend.fallback_stats().unwrap_or_default();
        let reachable = service.store_reachable(Duration::from_secs(1)).await;
        let [open, closed, local] = service.metrics().fallback_totals().map(|(_, n)| n);
        let top = service.top_denied();
        Snapshot {
            time_ms: unix_millis(),
            config: ConfigView {
                version: active.version,
                xds_version: active.policy.xds.as_ref().map(|x| x.version.clone()),
                last_reload: service.last_reload().map(|r| ReloadView {
                    at_ms: r.at_ms,
                    ok: r.ok,
                    version: r.version,
                    errors: r.errors,
                    source: r.source,
                }),
            },
            store: StoreView {
                kind: backend.kind(),
                reachable,
                breaker_open: stats.breaker_open,
                failed_calls: stats.store_errors,
                short_circuited: stats.short_circuited,
                breaker_opened: stats.breaker_opened,
            },
            fallback: FallbackView {
                open,
                closed,
                local,
            },
            rules,
            top_denied: top
                .top(TOP_KEYS_SHOWN)
                .into_iter()
                .map(|k| TopKeyView {
                    key: k.key,
                    count: k.count,
                    error: k.error,
                })
                .collect(),
            top_denied_total: top.total(),
            websocket: service.metrics().websocket_totals().map(|ws| {
                let mut closes: Vec<CloseCount> = Vec::new();
                for (code, count) in ws.inbound.closes.iter().chain(&ws.outbound.closes) {
                    match closes.iter_mut().find(|c| c.code == *code) {
                        Some(c) => c.count += count,
                        None => closes.push(CloseCount {
                            code: *code,
                            count: *count,
                        }),
                    }
                }
                closes.sort_unstable_by_key(|c| c.code);
                WebSocketView {
                    connections: ws.inbound.live,
                    opened_total: ws.inbound.opened,
                    refused_upgrades_total: ws.inbound.refused.iter().map(|(_, n)| n).sum(),
                    closes,
                }
            }),
            rlqs: rlqs_view(service.metrics().rlqs().snapshot()),
        }
    }
}

fn rlqs_view(s: crate::rlqs::Snapshot) -> RlqsView {
    RlqsView {
        streams: s.streams,
        buckets: s.buckets,
        rules: s
            .rules
            .into_iter()
            .map(|r| RlqsRuleView {
                domain: r.domain,
                rule: r.rule,
                limit: r.limit,
                period_ms: r.period_ms,
                instances: r.instances,
                members: r.members,
                tokens: r.tokens,
            })
            .collect(),
    }
}
