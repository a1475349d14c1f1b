//! `POST /v1/check`: Flowgate's JSON decision API — per descriptor `allowed, limit, burst,
//! remaining, reset_after_ms, retry_after_ms, algorithm, name, shadow`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use flowgate::FailMode;
use flowgate::answer::Answer;
use flowgate::envoy::{AppliedLimit, DescriptorVerdict, Rate, Status, Verdict};
use serde::{Deserialize, Serialize};

use super::super::answer::limit_name;
use super::super::limits::InputLimits;
use super::super::problem::Problem;
use super::super::rls::json::{fits_u32, override_proto, unit_number};
use super::super::rls::{self, InvalidRequest, RlsRequest};
use super::super::{Active, Service};
use super::json_response;
use crate::metrics::Api;

/// `/v1/check` request body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckRequest {
    /// The domain (the byte limits on it, on keys and on values are in docs/service.md).
    #[schema(min_length = 1)]
    domain: String,
    /// The descriptors; all must allow the request.
    #[schema(min_items = 1, max_items = 64)]
    descriptors: Vec<CheckDescriptor>,
    /// Units per descriptor (0 or absent: 1).
    #[serde(default)]
    hits_addend: u64,
    /// Every descriptor's hits are a charge: usage that already happened (tokens an LLM
    /// response used), always taken, into debt past the limit (docs/service.md).
    #[serde(default)]
    charge: bool,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CheckDescriptor {
    #[schema(max_items = 16)]
    entries: Vec<CheckEntry>,
    /// Units this descriptor asks for, instead of the request's (at most 2^32 − 1).
    #[serde(default)]
    #[schema(maximum = 4294967295_u64)]
    hits_addend: Option<u64>,
    #[serde(default)]
    limit: Option<CheckOverride>,
    /// This descriptor's hits are a charge (see the request's `charge`).
    #[serde(default)]
    charge: bool,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CheckEntry {
    key: String,
    value: String,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CheckOverride {
    requests_per_unit: u64,
    /// `second`, `minute`, `hour`, `day`, `week`, `month` or `year` (any case).
    #[schema(
        pattern = "^(second|minute|hour|day|week|month|year|SECOND|MINUTE|HOUR|DAY|WEEK|MONTH|YEAR)$"
    )]
    unit: String,
}

/// `/v1/check` response body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct CheckResponse<'a> {
    /// Whether the request may go through.
    allowed: bool,
    /// Version of the configuration that decided.
    config_version: u64,
    /// One per request descriptor.
    descriptors: Vec<CheckResult<'a>>,
}

impl CheckResponse<'static> {
    /// The benchmark baseline's answer: allowed, every descriptor unmatched.
    pub(crate) fn unmatched(descriptors: usize) -> Self {
        let unmatched = || CheckResult {
            status: "unmatched",
            allowed: true,
            limit: None,
            burst: None,
            remaining: None,
            reset_after_ms: None,
            retry_after_ms: None,
            period_ms: None,
            algorithm: None,
            name: None,
            rule: None,
            shadow: false,
            hits: 1,
            fallback: None,
            error: None,
            limits: Vec::new(),
        };
        CheckResponse {
            allowed: true,
            config_version: 0,
            descriptors: (0..descriptors).map(|_| unmatched()).collect(),
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct CheckResult<'a> {
    /// ok | over_limit | unlimited | unmatched | replaced | error
    status: &'static str,
    /// Whether this descriptor lets the request through.
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u64>,
    /// What `remaining` counts down from: the quota's capacity (its burst).
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
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
    fallback: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// For a rule with several limits (`rate_limits`): every limit's own result, in the
    /// rule's order; the fields above are the binding limit's (the one that refused, or the
    /// one with the least remaining). Absent for a rule with one limit.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(no_recursion)]
    limits: Vec<CheckResult<'a>>,
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// A descriptor's result: its binding limit's, and for a rule with several limits, each
/// limit's in `limits`.
fn check_result<'a>(d: &'a DescriptorVerdict<'a>) -> CheckResult<'a> {
    let mut result = limit_result(d);
    if !d.others.is_empty() {
        let mut limits: Vec<&DescriptorVerdict<'a>> = d.limits().collect();
        limits.sort_by_key(|l| match l.applied {
            Some(AppliedLimit::Rule(rule)) => rule.limit_index,
            _ => 0,
        });
        result.limits = limits.into_iter().map(limit_result).collect();
    }
    result
}

/// One limit's result.
fn limit_result<'a>(d: &'a DescriptorVerdict<'a>) -> CheckResult<'a> {
    let applied = d.applied.as_ref();
    let rate = applied.map(AppliedLimit::rate);
    let mut result = CheckResult {
        status: "ok",
        allowed: d.allows(),
        limit: None,
        burst: None,
        remaining: None,
        reset_after_ms: None,
        retry_after_ms: None,
        period_ms: rate.and_then(|r| r.period()).map(millis),
        algorithm: match rate {
            Some(Rate::Limited(q)) => Some(q.algorithm().name()),
            Some(Rate::Blocked { .. }) => Some("blocked"),
            _ => None,
        },
        name: applied.map(limit_name),
        rule: match applied {
            Some(AppliedLimit::Rule(rule)) => Some(&rule.path),
            _ => None,
        },
        shadow: applied.is_some_and(|a| a.shadow_mode()),
        hits: d.hits,
        fallback: None,
        error: None,
        limits: Vec::new(),
    };
    match &d.status {
        Status::Counted(Ok(decision)) => {
            result.status = if decision.allowed { "ok" } else { "over_limit" };
            result.limit = Some(decision.limit);
            result.burst = Some(decision.burst);
            result.remaining = Some(decision.remaining);
            result.reset_after_ms = Some(millis(decision.reset_after));
            result.retry_after_ms = Some(millis(decision.retry_after));
            result.fallback = decision.fallback.map(FailMode::name);
        }
        Status::Blocked { period } => {
            result.status = "over_limit";
            result.limit = Some(0);
            result.burst = Some(0);
            result.remaining = Some(0);
            result.reset_after_ms = Some(millis(*period));
            result.retry_after_ms = Some(millis(*period));
        }
        Status::Counted(Err(e)) => {
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
        _ => result.status = "error",
    }
    result
}

/// The `/v1/check` request, through the same validation as gRPC and `/json`
/// ([`rls::parse_request`]), or the 400 for it.
#[doc(hidden)]
pub fn parse_check(body: &[u8], limits: &InputLimits) -> Result<RlsRequest, Problem> {
    let request: CheckRequest = serde_json::from_slice(body)
        .map_err(|e| Problem::bad_request(format!("invalid check request JSON: {e}")))?;
    let charges: Vec<bool> = request
        .descriptors
        .iter()
        .map(|d| d.charge || request.charge)
        .collect();
    let mut parsed = request
        .into_proto()
        .and_then(|request| rls::parse_request(request, limits))
        .map_err(|e| Problem::bad_request(e.0))?;
    for (descriptor, charge) in parsed.descriptors.iter_mut().zip(charges) {
        descriptor.charge = charge;
    }
    Ok(parsed)
}

impl CheckRequest {
    /// The protobuf request (numbers the proto cannot carry are refused as on `/json`).
    fn into_proto(self) -> Result<RateLimitRequest, InvalidRequest> {
        let descriptors = self
            .descriptors
            .into_iter()
            .map(|d| {
                Ok(RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    limit: d
                        .limit
                        .map(|o| override_proto(o.requests_per_unit, unit_number(&o.unit)?))
                        .transpose()?,
                    hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                    is_negative_hits: false,
                })
            })
            .collect::<Result<_, InvalidRequest>>()?;
        Ok(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend: fits_u32(self.hits_addend, "hits_addend")?,
        })
    }
}

/// `POST /v1/check`.
#[utoipa::path(
    post,
    path = "/v1/check",
    tag = "decisions",
    request_body = CheckRequest,
    responses(
        (status = 200, description = "Allowed", body = CheckResponse<'_>),
        (status = 429, description = "Over a limit (the IETF RateLimit headers and Retry-After are set)", body = CheckResponse<'_>),
        (status = 400, description = "Malformed request", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is over --max-body-bytes", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "The request is not `Content-Type: application/json` (a guard against cross-site requests)", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The store could not be asked and a limit fails closed", body = crate::api::openapi::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn check(
    State(service): State<Arc<Service>>,
    _: super::media_type::JsonBody,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let body = match super::body_or_problem(&service, body) {
        Ok(body) => body,
        Err(problem) => return problem.into_response(),
    };
    let request = match parse_check(&body, service.input_limits()) {
        Ok(request) => request,
        Err(problem) => return problem.into_response(),
    };
    let active = service.active();
    let verdict = service
        .decide(
            &active,
            Api::Check,
            &request.domain,
            &request.descriptors,
            request.hits_addend,
        )
        .await;
    render(&active, &verdict, active.answer(&verdict))
}

/// The `/v1/check` response for `verdict`: its JSON (status 200, 429, or 503 when a limit
/// fails closed) with the answer's headers; a store that could not answer is a problem
/// (503/500), as on the other front ends.
pub(crate) fn render(active: &Active, verdict: &Verdict<'_>, answer: Answer) -> Response {
    let answer = match answer.decided() {
        Ok(answer) => answer,
        Err(failure) => return (*failure).map(axum::body::Body::from),
    };
    let kind = answer.kind();
    let body = CheckResponse {
        allowed: verdict.allowed,
        config_version: active.version,
        descriptors: verdict.descriptors.iter().map(check_result).collect(),
    };
    let mut response = json_response(kind.status(), &body);
    answer.apply(response.headers_mut());
    response
}
