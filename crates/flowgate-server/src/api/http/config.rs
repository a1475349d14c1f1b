//! `GET /v1/config`: the active rules and configuration version.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use flowgate::FailMode;
use flowgate::envoy::{MetaValue, Rate, Unit};
use serde::Serialize;

use super::super::Service;
use super::check::millis;
use super::json_response;

/// One rule in `GET /v1/config`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct RuleView<'a> {
    domain: &'a str,
    rule: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    requests_per_unit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unit: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    period_ms: Option<u64>,
    /// A calendar quota's period and zone, e.g. `month@Europe/Berlin`: its windows renew at
    /// local midnight (`period_ms` is then the unit's nominal length).
    #[serde(skip_serializing_if = "Option::is_none")]
    calendar: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    algorithm: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
    shadow_mode: bool,
    detailed_metric: bool,
    quota_mode: bool,
    /// `value_to_metric` on the rule or one of its ancestors.
    value_to_metric: bool,
    /// `share_threshold` on the rule or one of its ancestors.
    share_threshold: bool,
    /// The rule's `metadata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    metadata: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    replaces: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    fail: Option<&'static str>,
}

/// `GET /v1/config` response body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ConfigResponse<'a> {
    /// 1 for the configuration loaded at start, +1 per successful reload.
    version: u64,
    /// A digest of the files' contents (hex).
    digest: String,
    /// When the files were loaded (seconds since the Unix epoch).
    loaded_at_unix: u64,
    /// The files, one domain each (empty for the built-in policy).
    files: Vec<String>,
    /// The `version_info` of the xDS management server's rules running (absent without
    /// `--config-source`, or until its first version is applied).
    #[serde(skip_serializing_if = "Option::is_none")]
    xds_version: Option<&'a str>,
    /// The names of the xDS resources (`RateLimitConfig`) running, in the order sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    xds_resources: Option<Vec<&'a str>>,
    /// The domains, sorted.
    domains: Vec<&'a str>,
    /// Every rule that carries a limit.
    rules: Vec<RuleView<'a>>,
}

/// `GET /v1/config`.
#[utoipa::path(
    get,
    path = "/v1/config",
    tag = "operations",
    responses((status = 200, description = "The running configuration", body = ConfigResponse<'_>))
)]
pub(crate) async fn config(State(service): State<Arc<Service>>) -> Response {
    let active = service.active();
    let policy = &active.policy;
    let rules: Vec<RuleView<'_>> = policy
        .rules
        .rules()
        .iter()
        .map(|rule| {
            let period = rule.rate.period();
            let (kind, algorithm, burst) = match rule.rate {
                Rate::Limited(q) => ("limited", Some(q.algorithm().name()), Some(q.burst())),
                Rate::Blocked { .. } => ("blocked", None, None),
                Rate::Unlimited => ("unlimited", None, None),
            };
            RuleView {
                domain: &rule.domain,
                rule: &rule.path,
                name: rule.name.as_deref(),
                kind,
                requests_per_unit: rule.rate.limit(),
                unit: period.and_then(Unit::from_period).map(Unit::name),
                period_ms: period.map(millis),
                calendar: match rule.rate {
                    Rate::Limited(q) => q.calendar().map(ToString::to_string),
                    _ => None,
                },
                algorithm,
                burst,
                shadow_mode: rule.shadow_mode,
                detailed_metric: rule.detailed_metric,
                quota_mode: rule.quota_mode,
                value_to_metric: rule.levels.iter().any(|l| l.value_to_metric),
                share_threshold: rule.shares_counter(),
                metadata: rule
                    .metadata
                    .as_ref()
                    .map(|m| meta_json(&MetaValue::Struct(m.clone()))),
                replaces: &rule.replaces,
                fail: rule.fail.map(FailMode::name),
            }
        })
        .collect();
    let mut domains: Vec<&str> = policy.rules.domains().collect();
    domains.sort_unstable();
    let loaded_at = policy
        .loaded_at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let body = ConfigResponse {
        version: active.version,
        digest: format!("{:016x}", policy.digest),
        loaded_at_unix: loaded_at,
        files: policy
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect(),
        xds_version: policy.xds.as_ref().map(|x| x.version.as_str()),
        xds_resources: policy
            .xds
            .as_ref()
            .map(|x| x.resources.iter().map(|r| r.name.as_str()).collect()),
        domains,
        rules,
    };
    json_response(StatusCode::OK, &body)
}

/// A rule's metadata value as JSON.
fn meta_json(v: &MetaValue) -> serde_json::Value {
    match v {
        MetaValue::Null => serde_json::Value::Null,
        MetaValue::Bool(b) => serde_json::Value::Bool(*b),
        // Whole numbers as integers (`2`, not `2.0`), as in `dynamicMetadata`.
        #[allow(clippy::cast_possible_truncation, clippy::float_cmp)]
        MetaValue::Number(n) if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 => {
            serde_json::Value::from(*n as i64)
        }
        MetaValue::Number(n) => serde_json::Number::from_f64(*n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        MetaValue::String(s) => serde_json::Value::String(s.clone()),
        MetaValue::List(l) => serde_json::Value::Array(l.iter().map(meta_json).collect()),
        MetaValue::Struct(m) => {
            serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), meta_json(v))).collect())
        }
    }
}
