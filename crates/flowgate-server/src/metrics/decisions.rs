//! What the decision APIs decided: per domain and rule, as envoyproxy/ratelimit reports them
//! (`flowgate_hits_total`, `flowgate_over_limit_total`, `flowgate_near_limit_total`,
//! `flowgate_within_limit_total`, `flowgate_shadow_mode_total`, and the units charged,
//! `flowgate_charged_units_total`, with `detailed_metric` series
//! and `flowgate_detailed_metric_overflow_total`), and how long each decision took
//! (`flowgate_decision_duration_seconds{api}`).

use std::collections::{HashMap, HashSet};

use flowgate::Decision;
use flowgate::envoy::{AppliedLimit, DescriptorVerdict, Rule};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The most `detailed_metric` series kept at once (over all rules): each is one per descriptor
/// value, and values come from clients.
pub const MAX_DETAILED_SERIES: usize = 1000;

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

impl Api {
    /// Every API's label value, by discriminant.
    const LABELS: [&'static str; 4] = ["grpc", "json", "check", "gateway"];
}

/// Label of the decision-latency histogram.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabel {
    /// `grpc`, `json`, `check` or `gateway`.
    pub api: &'static str,
}

/// Labels of the per-rule counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    /// The rule's domain.
    pub domain: String,
    /// The rule's path (`key_value.key2`), or `_override`.
    pub rule: String,
}

impl RuleLabels {
    /// The labels of `rule`'s own series.
    fn of(rule: &Rule) -> Self {
        RuleLabels {
            domain: rule.domain.clone(),
            rule: rule.limit_path().to_owned(),
        }
    }
}

/// One rule's counters, resolved once per configuration so the hot path only does atomic adds.
#[derive(Debug, Clone)]
pub struct RuleCounters {
    hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
    charged_units: Counter,
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

/// Every per-rule counter family.
#[derive(Debug, Clone, Default)]
struct RuleFamilies {
    hits: Family<RuleLabels, Counter>,
    over_limit: Family<RuleLabels, Counter>,
    near_limit: Family<RuleLabels, Counter>,
    within_limit: Family<RuleLabels, Counter>,
    shadow_mode: Family<RuleLabels, Counter>,
    charged_units: Family<RuleLabels, Counter>,
}

/// The per-rule series that exist, so that a reload can drop those of removed rules.
#[derive(Debug, Default)]
struct Series {
    /// The running configuration's rules.
    rules: HashSet<RuleLabels>,
    /// Detailed series, each with the rule it belongs to.
    detailed: HashMap<RuleLabels, RuleLabels>,
}

/// The decision metrics.
#[derive(Debug)]
pub(super) struct Decisions {
    /// The per-rule families.
    rules: RuleFamilies,
    /// The per-rule series that exist.
    series: parking_lot::Mutex<Series>,
    /// `detailed_metric` values counted in their rule's series because of the bound.
    detailed_overflow: Counter,
    /// Requests the global shadow mode let through although a limit denied them.
    global_shadow: Counter,
    /// Decision latency per API, resolved once (by [`Api`]).
    latency: [Histogram; 4],
}

impl Decisions {
    /// Registers the decision metrics in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
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
        registry.register(
            "charged_units",
            "Units charged (usage reported after it happened, such as LLM tokens; taken even into debt), per rule",
            rules.charged_units.clone(),
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
        let latency = Api::LABELS.map(|api| latency.get_or_create_owned(&ApiLabel { api }));
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
        Decisions {
            rules,
            series: parking_lot::Mutex::default(),
            detailed_overflow,
            global_shadow,
            latency,
        }
    }

    /// Counts a request the global shadow mode let through although a limit denied it.
    pub(super) fn global_shadow_mode(&self) {
        self.global_shadow.inc();
    }

    /// Records how long a decision took.
    pub(super) fn observe_latency(&self, api: Api, seconds: f64) {
        self.latency[api as usize].observe(seconds);
    }

    /// The counters of each rule of a new configuration, indexed by `Rule::id`; the series of
    /// rules it no longer has (and their detailed series) stop being exported.
    pub(super) fn rule_counters(&self, rules: &[Rule]) -> Vec<RuleCounters> {
        let labels: HashSet<RuleLabels> = rules.iter().map(RuleLabels::of).collect();
        {
            let mut series = self.series.lock();
            let gone: Vec<RuleLabels> = series.rules.difference(&labels).cloned().collect();
            for old in &gone {
                self.remove_series(old);
            }
            let mut dropped = Vec::new();
            series.detailed.retain(|detail, rule| {
                let keep = labels.contains(rule);
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
            .map(|rule| self.counters(RuleLabels::of(rule)))
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
            &f.charged_units,
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
            charged_units: self.rules.charged_units.get_or_create_owned(&labels),
        }
    }

    /// Counts one descriptor that was decided (`decision`) or whose cost can never fit
    /// (`None`: counted as over the limit). `counters` are the running configuration's, by
    /// rule id; `detail` builds the series name of rules whose name depends on the request
    /// ([`Rule::metric_per_value`](flowgate::envoy::Rule::metric_per_value): `detailed_metric`,
    /// `value_to_metric`).
    pub(super) fn count(
        &self,
        domain: &str,
        verdict: &DescriptorVerdict<'_>,
        decision: Option<&Decision>,
        counters: &[RuleCounters],
        detail: impl FnOnce(&flowgate::envoy::Rule) -> String,
    ) {
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
                        series.detailed.insert(labels.clone(), RuleLabels::of(rule));
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
        if verdict.charge && decision.is_some() {
            counters.charged_units.inc_by(hits);
        }
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
}

#[cfg(test)]
mod tests {
    use flowgate::envoy::{
        Descriptor, DomainSpec, Entry, LimitOverride, LimitSpec, Rate, RuleSet, RuleSpec, Unit,
    };
    use flowgate::store::MemoryStore;
    use flowgate::{Quota, envoy};

    use super::super::Metrics;
    use super::super::tests::sample;
    use super::*;

    fn rules(with_admin: bool) -> RuleSet {
        let mut detailed =
            RuleSpec::new("tenant").with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(1))));
        detailed.detailed_metric = true;
        let mut domain = vec![
            RuleSpec::new("user")
                .with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(5))).named("per_user")),
            RuleSpec::new("probe")
                .with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(1))))
                .shadow(),
            detailed,
        ];
        if with_admin {
            domain.push(
                RuleSpec::new("admin")
                    .with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(1)))),
            );
        }
        RuleSet::build(vec![DomainSpec::new("api", domain)]).unwrap()
    }

    /// Decides `(key, value)` `times` times under `rules` and records every descriptor.
    async fn decide(
        metrics: &Metrics,
        rules: &RuleSet,
        store: &MemoryStore,
        counters: &[RuleCounters],
        descriptor: Descriptor,
        times: usize,
    ) {
        let request = [descriptor];
        for _ in 0..times {
            let verdict = envoy::check(rules, store, "api", &request, 1).await;
            for result in &verdict.descriptors {
                metrics.record("api", result, counters, |_| {
                    let e = &request[0].entries[0];
                    format!("{}_{}", e.key, e.value)
                });
            }
        }
    }

    fn one(key: &str, value: &str) -> Descriptor {
        Descriptor::new(vec![Entry::new(key, value)])
    }

    #[tokio::test]
    async fn rule_series_count_hits_allowed_near_denied_and_shadow() {
        let metrics = Metrics::new();
        let rules = rules(false);
        let store = MemoryStore::new();
        let counters = metrics.rule_counters(rules.rules());
        decide(&metrics, &rules, &store, &counters, one("user", "ann"), 7).await;
        decide(&metrics, &rules, &store, &counters, one("probe", "x"), 3).await;
        let text = metrics.encode();
        let user = r#"{domain="api",rule="user"}"#;
        assert_eq!(
            sample(&text, &format!("flowgate_hits_total{user}")),
            Some(7.0)
        );
        assert_eq!(
            sample(&text, &format!("flowgate_within_limit_total{user}")),
            Some(5.0)
        );
        // 5 per minute: the 4th and 5th leave 1 and 0 of 5, ≥ 80 % used.
        assert_eq!(
            sample(&text, &format!("flowgate_near_limit_total{user}")),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, &format!("flowgate_over_limit_total{user}")),
            Some(2.0)
        );
        assert_eq!((counters[0].allowed(), counters[0].denied()), (5, 2));
        let probe = r#"{domain="api",rule="probe"}"#;
        assert_eq!(
            sample(&text, &format!("flowgate_shadow_mode_total{probe}")),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, &format!("flowgate_over_limit_total{probe}")),
            Some(2.0)
        );
    }

    #[tokio::test]
    async fn detailed_series_are_bounded_and_overrides_share_one_series() {
        let metrics = Metrics::new();
        let rules = rules(false);
        let store = MemoryStore::new();
        let counters = metrics.rule_counters(rules.rules());
        for i in 0..MAX_DETAILED_SERIES + 3 {
            let tenant = one("tenant", &format!("t{i}"));
            decide(&metrics, &rules, &store, &counters, tenant, 1).await;
        }
        let text = metrics.encode();
        assert_eq!(
            sample(
                &text,
                r#"flowgate_hits_total{domain="api",rule="tenant_t0"}"#
            ),
            Some(1.0)
        );
        let last = MAX_DETAILED_SERIES - 1;
        let series = format!(r#"flowgate_hits_total{{domain="api",rule="tenant_t{last}"}}"#);
        assert_eq!(sample(&text, &series), Some(1.0));
        let over = MAX_DETAILED_SERIES;
        let series = format!(r#"flowgate_hits_total{{domain="api",rule="tenant_t{over}"}}"#);
        assert_eq!(sample(&text, &series), None, "beyond the bound");
        assert_eq!(
            sample(&text, r#"flowgate_hits_total{domain="api",rule="tenant"}"#),
            Some(3.0),
            "values beyond the bound are counted in the rule's own series"
        );
        assert_eq!(
            sample(&text, "flowgate_detailed_metric_overflow_total"),
            Some(3.0)
        );

        let mut overridden = one("user", "bob");
        overridden.limit = Some(LimitOverride {
            requests_per_unit: 2,
            unit: Unit::Minute,
        });
        decide(&metrics, &rules, &store, &counters, overridden, 3).await;
        let text = metrics.encode();
        let series = r#"{domain="api",rule="_override"}"#;
        assert_eq!(
            sample(&text, &format!("flowgate_hits_total{series}")),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, &format!("flowgate_over_limit_total{series}")),
            Some(1.0)
        );
    }

    #[tokio::test]
    async fn a_reload_drops_the_series_of_removed_rules_and_their_details() {
        let metrics = Metrics::new();
        let (before, after) = (rules(true), rules(false));
        let store = MemoryStore::new();
        let counters = metrics.rule_counters(before.rules());
        decide(&metrics, &before, &store, &counters, one("admin", "a"), 1).await;
        decide(&metrics, &before, &store, &counters, one("tenant", "t"), 1).await;
        let text = metrics.encode();
        assert!(text.contains(r#"rule="admin""#), "{text}");
        assert!(text.contains(r#"rule="tenant_t""#), "{text}");

        // The same rules minus `admin`: its series go, the others stay.
        let counters = metrics.rule_counters(after.rules());
        let text = metrics.encode();
        assert!(!text.contains(r#"rule="admin""#), "{text}");
        assert!(text.contains(r#"rule="tenant_t""#), "{text}");
        decide(&metrics, &after, &store, &counters, one("user", "u"), 1).await;
        assert_eq!(
            sample(
                &metrics.encode(),
                r#"flowgate_hits_total{domain="api",rule="user"}"#
            ),
            Some(1.0)
        );

        // A configuration without the detailed rule drops its value series too.
        let only_user = RuleSet::build(vec![DomainSpec::new(
            "api",
            vec![
                RuleSpec::new("user")
                    .with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(5)))),
            ],
        )])
        .unwrap();
        metrics.rule_counters(only_user.rules());
        let text = metrics.encode();
        assert!(!text.contains("tenant"), "{text}");
        assert_eq!(
            sample(&text, r#"flowgate_hits_total{domain="api",rule="user"}"#),
            Some(1.0),
            "a rule kept by the reload keeps its counts"
        );
    }

    #[tokio::test]
    async fn charged_units_count_charges_only() {
        let metrics = Metrics::new();
        let rules = RuleSet::build(vec![DomainSpec::new(
            "api",
            vec![
                RuleSpec::new("user")
                    .with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(1000))).charged()),
                RuleSpec::new("ip")
                    .with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(10)))),
            ],
        )])
        .unwrap();
        let store = MemoryStore::new();
        let counters = metrics.rule_counters(rules.rules());
        let record = |verdict: &envoy::Verdict<'_>| {
            for result in &verdict.descriptors {
                metrics.record("api", result, &counters, |_| String::new());
            }
        };
        // The check on the way in (0 units), then the usage: 5000 units, into debt.
        let mut user = one("user", "ann");
        user.hits_addend = Some(0);
        record(&envoy::check(&rules, &store, "api", &[user.clone()], 1).await);
        user.hits_addend = Some(5000);
        record(&envoy::check(&rules, &store, "api", &[user], 1).await);
        record(&envoy::check(&rules, &store, "api", &[one("ip", "a")], 3).await);
        let text = metrics.encode();
        assert_eq!(
            sample(
                &text,
                r#"flowgate_charged_units_total{domain="api",rule="user"}"#
            ),
            Some(5000.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"flowgate_charged_units_total{domain="api",rule="ip"}"#
            ),
            Some(0.0),
            "ordinary hits are not charges"
        );
    }

    #[test]
    fn latency_is_observed_per_api() {
        let metrics = Metrics::new();
        metrics.observe_latency(Api::Grpc, 0.000_02);
        metrics.observe_latency(Api::Grpc, 0.5);
        metrics.observe_latency(Api::Gateway, 0.001);
        let text = metrics.encode();
        let count = |api: &str| {
            sample(
                &text,
                &format!(r#"flowgate_decision_duration_seconds_count{{api="{api}"}}"#),
            )
        };
        assert_eq!(count("grpc"), Some(2.0));
        assert_eq!(count("gateway"), Some(1.0));
        assert_eq!(
            count("json"),
            Some(0.0),
            "every API's series exists from the start"
        );
        assert_eq!(count("check"), Some(0.0));
        assert_eq!(
            sample(
                &text,
                r#"flowgate_decision_duration_seconds_bucket{le="4e-5",api="grpc"}"#
            )
            .or_else(|| sample(
                &text,
                r#"flowgate_decision_duration_seconds_bucket{le="0.00004",api="grpc"}"#
            )),
            Some(1.0),
            "{text}"
        );
    }
}
