//! The HTTP API (axum):
//!
//! | route | what |
//! |---|---|
//! | `POST /json` | the RLS request/response in proto-JSON, as envoyproxy/ratelimit: 200 or 429 |
//! | `POST /v1/check` | Flowgate's JSON: per descriptor `allowed, limit, remaining, reset_after_ms, retry_after_ms, algorithm, name, shadow`; 200 or 429 |
//! | `GET /healthz` | the process is up |
//! | `GET /readyz` | a configuration is loaded and the store answers (503 otherwise; with Redis, Redis itself is asked) |
//! | `GET /metrics` | Prometheus / OpenMetrics text |
//! | `GET /v1/config` | the active rules and configuration version |
//!
//! Malformed bodies get 400 with an RFC 9457 `application/problem+json` body.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use flowgate::policy::descriptor::{Applied, Descriptor, Entry, LimitOverride, Status, Verdict};
use flowgate::policy::rules::{Rate, Unit};
use serde::{Deserialize, Serialize};

use super::problem::Problem;
use super::rls::{self, JsonRequest, JsonResponse};
use super::{Active, Service};
use crate::metrics::Api;

/// How long `/readyz` waits for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// The HTTP routes over `service`.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/json", post(json))
        .route("/v1/check", post(check))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/config", get(config))
        .with_state(service)
}

fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    let mut response = (status, serde_json::to_vec(body).unwrap_or_default()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn add_headers(response: &mut Response, headers: Vec<(&'static str, String)>, denied: bool) {
    let map: &mut HeaderMap = response.headers_mut();
    for (name, value) in headers {
        // `from_bytes` lower-cases the name, as HTTP/2 requires.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            map.insert(name, value);
        }
    }
    if denied {
        map.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
}

/// `POST /json`: envoyproxy/ratelimit's HTTP endpoint.
async fn json(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    let request = match serde_json::from_slice::<JsonRequest>(&body) {
        Ok(request) => request,
        Err(e) => {
            return Problem::bad_request(format!("invalid RateLimitRequest JSON: {e}"))
                .into_response();
        }
    };
    let parsed = request.into_proto().and_then(rls::parse_request);
    let (domain, descriptors, hits) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return Problem::bad_request(e.0).into_response(),
    };
    if service.is_noop() {
        let response = rls::noop_response(descriptors.len());
        return json_response(StatusCode::OK, &JsonResponse::from(&response));
    }
    let active = service.active();
    let verdict = service
        .decide(&active, Api::Json, &domain, &descriptors, hits)
        .await;
    match rls::response(&verdict) {
        Ok(response) => {
            let status = if verdict.allowed {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            json_response(status, &JsonResponse::from(&response))
        }
        Err(e) => Problem::unavailable(e.to_string()).into_response(),
    }
}

/// `/v1/check` request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    /// The domain.
    domain: String,
    /// The descriptors.
    descriptors: Vec<CheckDescriptor>,
    /// Units per descriptor (0 or absent: 1).
    #[serde(default)]
    hits_addend: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckDescriptor {
    entries: Vec<CheckEntry>,
    #[serde(default)]
    hits_addend: Option<u64>,
    #[serde(default)]
    limit: Option<CheckOverride>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckEntry {
    key: String,
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckOverride {
    requests_per_unit: u64,
    unit: String,
}

/// `/v1/check` response body.
#[derive(Debug, Serialize)]
struct CheckResponse<'a> {
    /// Whether the request may go through.
    allowed: bool,
    /// Version of the configuration that decided.
    config_version: u64,
    /// One per request descriptor.
    descriptors: Vec<CheckResult<'a>>,
}

#[derive(Debug, Serialize)]
struct CheckResult<'a> {
    /// ok | over_limit | unlimited | unmatched | replaced | error
    status: &'static str,
    /// Whether this descriptor lets the request through.
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reset_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    algorithm: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: Option<&'a str>,
    shadow: bool,
    hits: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

fn check_result<'a>(d: &'a flowgate::policy::descriptor::DescriptorVerdict<'a>) -> CheckResult<'a> {
    let applied = d.applied.as_ref();
    let rate = applied.map(Applied::rate);
    let mut result = CheckResult {
        status: "ok",
        allowed: d.allows(),
        limit: None,
        remaining: None,
        reset_after_ms: None,
        retry_after_ms: None,
        period_ms: rate.and_then(|r| r.period()).map(millis),
        algorithm: match rate {
            Some(Rate::Limited(q)) => Some(q.algorithm().name()),
            Some(Rate::Blocked { .. }) => Some("blocked"),
            _ => None,
        },
        name: applied.map(rls::limit_name),
        rule: match applied {
            Some(Applied::Rule(rule)) => Some(&rule.path),
            _ => None,
        },
        shadow: applied.is_some_and(|a| a.shadow_mode()),
        hits: d.hits,
        fallback: None,
        error: None,
    };
    match &d.status {
        Status::Checked(decision) => {
            result.status = if decision.allowed { "ok" } else { "over_limit" };
            result.limit = Some(decision.limit);
            result.remaining = Some(decision.remaining);
            result.reset_after_ms = Some(millis(decision.reset_after));
            result.retry_after_ms = Some(millis(decision.retry_after));
            result.fallback = decision.fallback.map(|m| format!("{m:?}").to_lowercase());
        }
        Status::Failed(e) => {
            result.status = if d.over_limit() {
                "over_limit"
            } else {
                "error"
            };
            result.limit = rate.and_then(|r| r.limit());
            result.remaining = Some(0);
            result.error = Some(e.to_string());
        }
        Status::Unlimited => result.status = "unlimited",
        Status::Unmatched => result.status = "unmatched",
        Status::Replaced => result.status = "replaced",
    }
    result
}

fn parse_check(body: &[u8]) -> Result<(String, Vec<Descriptor>, u64), Problem> {
    let request: CheckRequest = serde_json::from_slice(body)
        .map_err(|e| Problem::bad_request(format!("invalid check request JSON: {e}")))?;
    if request.domain.is_empty() {
        return Err(Problem::bad_request("`domain` must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(Problem::bad_request("`descriptors` must not be empty"));
    }
    let descriptors = request
        .descriptors
        .into_iter()
        .map(|d| {
            let limit = d
                .limit
                .map(|o| {
                    o.unit
                        .parse::<Unit>()
                        .map(|unit| LimitOverride {
                            requests_per_unit: o.requests_per_unit,
                            unit,
                        })
                        .map_err(|e| Problem::bad_request(e.to_string()))
                })
                .transpose()?;
            Ok(Descriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit,
                hits_addend: d.hits_addend,
            })
        })
        .collect::<Result<Vec<_>, Problem>>()?;
    Ok((request.domain, descriptors, request.hits_addend))
}

/// `POST /v1/check`: Flowgate's JSON decision API.
async fn check(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    let (domain, descriptors, hits) = match parse_check(&body) {
        Ok(parsed) => parsed,
        Err(problem) => return problem.into_response(),
    };
    let active = service.active();
    if service.is_noop() {
        return noop_check(&active, descriptors.len());
    }
    let verdict = service
        .decide(&active, Api::Check, &domain, &descriptors, hits)
        .await;
    if let Some(e) = rls::hard_failure(&verdict) {
        return Problem::unavailable(e.to_string()).into_response();
    }
    render_check(&active, &verdict)
}

fn render_check(active: &Active, verdict: &Verdict<'_>) -> Response {
    let body = CheckResponse {
        allowed: verdict.allowed,
        config_version: active.version,
        descriptors: verdict.descriptors.iter().map(check_result).collect(),
    };
    let status = if verdict.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut response = json_response(status, &body);
    add_headers(
        &mut response,
        rls::response_headers(verdict),
        !verdict.allowed,
    );
    response
}

/// The benchmark baseline's `/v1/check` answer: same shape, every descriptor unmatched.
fn noop_check(active: &Active, descriptors: usize) -> Response {
    let verdict = Verdict {
        allowed: true,
        descriptors: vec![
            flowgate::policy::descriptor::DescriptorVerdict {
                applied: None,
                status: Status::Unmatched,
                hits: 1,
            };
            descriptors
        ],
    };
    render_check(active, &verdict)
}

/// `GET /readyz`.
async fn readyz(State(service): State<Arc<Service>>) -> Response {
    let version = service.active().version;
    let store = service.store_reachable(READY_TIMEOUT).await;
    let backend = service.backend();
    let body = serde_json::json!({
        "ready": store,
        "config_version": version,
        "store": if store { "ok" } else { "unreachable" },
        "store_kind": backend.kind(),
        "breaker_open": backend.fallback_stats().is_some_and(|s| s.breaker_open),
    });
    let status = if store {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, &body)
}

/// `GET /metrics`.
async fn metrics(State(service): State<Arc<Service>>) -> Response {
    let mut response = service.metrics().encode().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// One rule in `GET /v1/config`.
#[derive(Debug, Serialize)]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    algorithm: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
    shadow_mode: bool,
    detailed_metric: bool,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    replaces: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    fail: Option<String>,
}

/// `GET /v1/config`.
async fn config(State(service): State<Arc<Service>>) -> Response {
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
                algorithm,
                burst,
                shadow_mode: rule.shadow_mode,
                detailed_metric: rule.detailed_metric,
                replaces: &rule.replaces,
                fail: rule.fail.map(|m| format!("{m:?}").to_lowercase()),
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
    let body = serde_json::json!({
        "version": active.version,
        "digest": format!("{:016x}", policy.digest),
        "loaded_at_unix": loaded_at,
        "files": policy.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
        "domains": domains,
        "rules": rules,
    });
    json_response(StatusCode::OK, &body)
}
