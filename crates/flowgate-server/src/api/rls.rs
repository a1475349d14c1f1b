//! The Envoy rate-limit service (RLS v3) model shared by gRPC and `POST /json`: requests to
//! [`Descriptor`]s, [`Verdict`]s to responses, and the proto-JSON mapping of both.
//!
//! Response semantics follow envoyproxy/ratelimit: one status per request descriptor, in
//! order; `OVER_LIMIT` for a descriptor over its limit (`OK` in shadow mode); `OK` with no
//! `current_limit` when no rule applies; `OK` with `limit_remaining = u32::MAX` for unlimited
//! rules; `overall_code` `OVER_LIMIT` when any descriptor is.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry as ProtoEntry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt64Value};
use flowgate::FailMode;
use flowgate::http::headers;
use flowgate::policy::descriptor::{
    Applied, Descriptor, DescriptorVerdict, Entry, LimitOverride, Status, Verdict,
};
use flowgate::policy::rules::{Rate, Unit};
use flowgate::store::StoreError;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// A request the service cannot take (gRPC `INVALID_ARGUMENT`, HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRequest(pub String);

/// The request's domain, descriptors and request-level `hits_addend`, validated as
/// envoyproxy/ratelimit does (a domain and at least one descriptor are required).
pub fn parse_request(
    request: RateLimitRequest,
) -> Result<(String, Vec<Descriptor>, u64), InvalidRequest> {
    if request.domain.is_empty() {
        return Err(InvalidRequest("rate limit domain must not be empty".into()));
    }
    if request.descriptors.is_empty() {
        return Err(InvalidRequest(
            "rate limit descriptor list must not be empty".into(),
        ));
    }
    let descriptors = request
        .descriptors
        .into_iter()
        .map(descriptor_from_proto)
        .collect::<Result<_, _>>()?;
    Ok((request.domain, descriptors, u64::from(request.hits_addend)))
}

fn descriptor_from_proto(d: RateLimitDescriptor) -> Result<Descriptor, InvalidRequest> {
    if d.is_negative_hits {
        return Err(InvalidRequest(
            "is_negative_hits (refilling a limit) is not supported".into(),
        ));
    }
    let limit = d
        .limit
        .map(|o| {
            Ok(LimitOverride {
                requests_per_unit: u64::from(o.requests_per_unit),
                unit: override_unit(o.unit)?,
            })
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
        hits_addend: d.hits_addend.map(|h| h.value),
    })
}

/// `envoy.type.v3.RateLimitUnit` → [`Unit`].
fn override_unit(unit: i32) -> Result<Unit, InvalidRequest> {
    match unit {
        1 => Ok(Unit::Second),
        2 => Ok(Unit::Minute),
        3 => Ok(Unit::Hour),
        4 => Ok(Unit::Day),
        5 => Ok(Unit::Month),
        6 => Ok(Unit::Year),
        7 => Ok(Unit::Week),
        other => Err(InvalidRequest(format!(
            "limit override has no valid unit ({other})"
        ))),
    }
}

/// The response `unit` for a period: the matching unit, or `UNKNOWN` for periods that are not
/// one (e.g. `period: 90s`).
fn proto_unit(period: Option<Duration>) -> ProtoUnit {
    match period.and_then(Unit::from_period) {
        Some(Unit::Second) => ProtoUnit::Second,
        Some(Unit::Minute) => ProtoUnit::Minute,
        Some(Unit::Hour) => ProtoUnit::Hour,
        Some(Unit::Day) => ProtoUnit::Day,
        Some(Unit::Week) => ProtoUnit::Week,
        Some(Unit::Month) => ProtoUnit::Month,
        Some(Unit::Year) => ProtoUnit::Year,
        None => ProtoUnit::Unknown,
    }
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// The name a limit is reported under: its `name`, else its rule path, else `override`.
pub fn limit_name<'a>(applied: &Applied<'a>) -> &'a str {
    match applied {
        Applied::Rule(rule) => rule.display_name(),
        Applied::Override(..) => "override",
    }
}

/// The first failure that must fail the whole call: a store error (not a capacity error) on a
/// limit that is enforced.
pub fn hard_failure<'v>(verdict: &'v Verdict<'_>) -> Option<&'v StoreError> {
    verdict.descriptors.iter().find_map(|d| match &d.status {
        Status::Failed(e)
            if !matches!(e, StoreError::Capacity(_))
                && !d.applied.is_some_and(|a| a.shadow_mode()) =>
        {
            Some(e)
        }
        _ => None,
    })
}

/// `RateLimit-Policy` and `RateLimit` for every checked limit of `verdict`, written by the
/// library's formatters (the same the tower layer and the gateway use); `None` when no limit
/// was checked. A blocklist rule (0 per unit), which has no quota, advertises `q=0`.
pub fn ratelimit_values(verdict: &Verdict<'_>) -> Option<(String, String)> {
    let mut policy = String::new();
    let mut state = String::new();
    for d in &verdict.descriptors {
        let (Some(applied), Status::Checked(decision)) = (&d.applied, &d.status) else {
            continue;
        };
        let name = limit_name(applied);
        let item = match applied.rate() {
            Rate::Limited(quota) => headers::policy_item(name, &quota),
            Rate::Blocked { period } => {
                let mut item = headers::sf_string(name);
                // Writing to a String cannot fail.
                let _ = write!(item, ";q=0;w={}", period.as_secs().max(1));
                item
            }
            Rate::Unlimited => continue,
        };
        if !policy.is_empty() {
            policy.push_str(", ");
            state.push_str(", ");
        }
        policy.push_str(&item);
        state.push_str(&headers::limit_item(name, decision));
    }
    (!policy.is_empty()).then_some((policy, state))
}

/// Seconds to wait before retrying a denied request: the longest wait among the enforced
/// denials, rounded up (never 0 when denied). `None` when allowed.
pub fn retry_after_secs(verdict: &Verdict<'_>) -> Option<u64> {
    if verdict.allowed {
        return None;
    }
    verdict
        .descriptors
        .iter()
        .filter(|d| !d.allows())
        .map(|d| match &d.status {
            Status::Checked(decision) => decision.retry_after_secs().max(1),
            _ => 1,
        })
        .max()
}

/// The `RateLimit-Policy`, `RateLimit` (and, when denied, `Retry-After`) headers of a verdict.
pub fn response_headers(verdict: &Verdict<'_>) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some((policy, state)) = ratelimit_values(verdict) {
        out.push(("RateLimit-Policy", policy));
        out.push(("RateLimit", state));
    }
    if let Some(secs) = retry_after_secs(verdict) {
        out.push(("Retry-After", secs.to_string()));
    }
    if let Some(mode) = fallback_mode(verdict) {
        out.push((FALLBACK_HEADER, mode.to_owned()));
    }
    out
}

/// Set on answers that a failure mode decided because the shared store was away: `open`,
/// `closed` or `local` (the first such descriptor's).
pub const FALLBACK_HEADER: &str = "Flowgate-Fallback";

/// The failure mode that decided some descriptor of `verdict`, if any did.
pub fn fallback_mode(verdict: &Verdict<'_>) -> Option<&'static str> {
    verdict.descriptors.iter().find_map(|d| match &d.status {
        Status::Checked(decision) => decision.fallback.map(FailMode::name),
        _ => None,
    })
}

fn status_of(d: &DescriptorVerdict<'_>) -> DescriptorStatus {
    let current_limit = |applied: &Applied<'_>, limit: u64| RateLimit {
        name: applied.name().unwrap_or_default().to_owned(),
        requests_per_unit: saturate(limit),
        unit: proto_unit(applied.rate().period()) as i32,
    };
    match (&d.status, &d.applied) {
        (Status::Checked(decision), Some(applied)) => DescriptorStatus {
            code: if d.allows() {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(current_limit(applied, decision.limit)),
            limit_remaining: saturate(decision.remaining),
            duration_until_reset: Some(proto_duration(decision.reset_after)),
            quota: None,
        },
        (Status::Failed(_), Some(applied)) => DescriptorStatus {
            code: if d.allows() {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(current_limit(
                applied,
                applied.rate().limit().unwrap_or_default(),
            )),
            limit_remaining: 0,
            duration_until_reset: None,
            quota: None,
        },
        (Status::Unlimited, _) => DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..Default::default()
        },
        _ => DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        },
    }
}

/// The RLS response for a verdict; an `Err` when an enforced limit's store failed, which the
/// caller reports as an error (gRPC `UNAVAILABLE`, HTTP 503) so Envoy applies its own failure
/// mode.
pub fn response(verdict: &Verdict<'_>) -> Result<RateLimitResponse, StoreError> {
    if let Some(e) = hard_failure(verdict) {
        return Err(e.clone());
    }
    Ok(RateLimitResponse {
        overall_code: if verdict.allowed {
            Code::Ok
        } else {
            Code::OverLimit
        } as i32,
        statuses: verdict.descriptors.iter().map(status_of).collect(),
        response_headers_to_add: response_headers(verdict)
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_owned(),
                value,
                raw_value: Vec::new(),
            })
            .collect(),
        ..Default::default()
    })
}

/// The benchmark baseline's answer: `OK` for every descriptor, nothing decided.
pub fn noop_response(descriptors: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![
            DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            };
            descriptors
        ],
        ..Default::default()
    }
}

// ---- proto-JSON (`POST /json`) ----

/// A number that proto-JSON may also send as a string.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
enum JsonInt {
    /// A JSON number.
    Number(u64),
    /// A decimal string.
    Text(#[serde(deserialize_with = "from_decimal")] u64),
}

impl JsonInt {
    fn get(self) -> u64 {
        match self {
            JsonInt::Number(n) | JsonInt::Text(n) => n,
        }
    }
}

fn from_decimal<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

/// An enum that proto-JSON may send by name or number.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum JsonEnum {
    /// The value's name, e.g. `"SECOND"`.
    Name(String),
    /// The value's number.
    Number(i32),
}

/// `RateLimitRequest` in proto-JSON (field names in lowerCamelCase or as in the .proto).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: Option<JsonInt>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: Option<JsonInt>,
    #[serde(default, alias = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requestsPerUnit")]
    requests_per_unit: Option<JsonInt>,
    #[serde(default)]
    unit: Option<JsonEnum>,
}

impl JsonRequest {
    /// The protobuf request.
    pub fn into_proto(self) -> Result<RateLimitRequest, InvalidRequest> {
        let hits_addend = self.hits_addend.map_or(0, JsonInt::get);
        Ok(RateLimitRequest {
            domain: self.domain,
            hits_addend: u32::try_from(hits_addend)
                .map_err(|_| InvalidRequest("hits_addend must fit in 32 bits".into()))?,
            descriptors: self
                .descriptors
                .into_iter()
                .map(|d| {
                    let limit = d
                        .limit
                        .map(|o| {
                            let unit = match o.unit {
                                None => 0,
                                Some(JsonEnum::Number(n)) => n,
                                Some(JsonEnum::Name(name)) => match name.parse::<Unit>() {
                                    Ok(Unit::Second) => 1,
                                    Ok(Unit::Minute) => 2,
                                    Ok(Unit::Hour) => 3,
                                    Ok(Unit::Day) => 4,
                                    Ok(Unit::Month) => 5,
                                    Ok(Unit::Year) => 6,
                                    Ok(Unit::Week) => 7,
                                    Err(e) => return Err(InvalidRequest(e.to_string())),
                                },
                            };
                            let requests = o.requests_per_unit.map_or(0, JsonInt::get);
                            Ok(RateLimitOverride {
                                requests_per_unit: u32::try_from(requests).map_err(|_| {
                                    InvalidRequest("requests_per_unit must fit in 32 bits".into())
                                })?,
                                unit,
                            })
                        })
                        .transpose()?;
                    Ok(RateLimitDescriptor {
                        entries: d
                            .entries
                            .into_iter()
                            .map(|e| ProtoEntry {
                                key: e.key,
                                value: e.value,
                            })
                            .collect(),
                        limit,
                        hits_addend: d.hits_addend.map(|h| UInt64Value { value: h.get() }),
                        is_negative_hits: d.is_negative_hits,
                    })
                })
                .collect::<Result<_, _>>()?,
        })
    }
}

/// `RateLimitResponse` in canonical proto-JSON: lowerCamelCase names, enums by name, default
/// values omitted, durations as `"1.5s"`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonResponse {
    overall_code: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimit>,
    #[serde(skip_serializing_if = "is_zero")]
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "is_zero")]
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Debug, Serialize)]
struct JsonHeader {
    key: String,
    value: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// A duration in proto-JSON: seconds with 0, 3, 6 or 9 decimals and an `s`.
fn json_duration(d: &ProtoDuration) -> String {
    let nanos = d.nanos.unsigned_abs();
    if nanos == 0 {
        format!("{}s", d.seconds)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}.{:03}s", d.seconds, nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}.{:06}s", d.seconds, nanos / 1_000)
    } else {
        format!("{}.{:09}s", d.seconds, nanos)
    }
}

impl From<&RateLimitResponse> for JsonResponse {
    fn from(r: &RateLimitResponse) -> Self {
        JsonResponse {
            overall_code: code_name(r.overall_code),
            statuses: r
                .statuses
                .iter()
                .map(|s| JsonStatus {
                    code: code_name(s.code),
                    current_limit: s.current_limit.as_ref().map(|l| JsonLimit {
                        name: l.name.clone(),
                        requests_per_unit: l.requests_per_unit,
                        unit: ProtoUnit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name()),
                    }),
                    limit_remaining: s.limit_remaining,
                    duration_until_reset: s.duration_until_reset.as_ref().map(json_duration),
                })
                .collect(),
            response_headers_to_add: r
                .response_headers_to_add
                .iter()
                .map(|h| JsonHeader {
                    key: h.key.clone(),
                    value: h.value.clone(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_json_durations_use_3_6_or_9_decimals() {
        let d = |seconds, nanos| json_duration(&ProtoDuration { seconds, nanos });
        assert_eq!(d(5, 0), "5s");
        assert_eq!(d(1, 500_000_000), "1.500s");
        assert_eq!(d(0, 1_000), "0.000001s");
        assert_eq!(d(0, 1), "0.000000001s");
    }

    #[test]
    fn json_requests_accept_both_field_spellings_and_string_integers() {
        let r: JsonRequest = serde_json::from_str(
            r#"{"domain":"d","hitsAddend":"2","descriptors":[{"entries":[{"key":"k","value":"v"}],"hits_addend":3,"limit":{"requestsPerUnit":5,"unit":"MINUTE"}}]}"#,
        )
        .unwrap();
        let proto = r.into_proto().unwrap();
        assert_eq!(proto.hits_addend, 2);
        assert_eq!(proto.descriptors[0].hits_addend.unwrap().value, 3);
        assert_eq!(proto.descriptors[0].limit.unwrap().unit, 2);
        assert!(serde_json::from_str::<JsonRequest>(r#"{"domian":"d"}"#).is_err());
    }
}
