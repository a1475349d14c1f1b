//! The Envoy rate-limit service (RLS v3) model shared by gRPC and `POST /json`: requests to
//! [`Descriptor`]s, [`Verdict`]s (and their [`Answer`]) to responses; [`json`] is the
//! proto-JSON mapping of both.
//!
//! Response semantics follow envoyproxy/ratelimit: one status per request descriptor, in
//! order; `OVER_LIMIT` for a descriptor over its limit (`OK` in shadow mode); `OK` with no
//! `current_limit` when no rule applies; `OK` with `limit_remaining = u32::MAX` for unlimited
//! rules; `overall_code` `OVER_LIMIT` when any descriptor is.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use flowgate::envoy::{
    AppliedLimit, Descriptor, DescriptorVerdict, Entry, LimitOverride, Status, Unit, Verdict,
};
use flowgate::http::answer::{Answer, AnswerKind};

pub mod json;

use super::limits::InputLimits;

/// A request the service cannot take (gRPC `INVALID_ARGUMENT`, HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRequest(pub String);

/// The request's domain, descriptors and request-level `hits_addend`, validated as
/// envoyproxy/ratelimit does (a domain and at least one descriptor are required) and within
/// `limits`.
pub fn parse_request(
    request: RateLimitRequest,
    limits: &InputLimits,
) -> Result<(String, Vec<Descriptor>, u64), InvalidRequest> {
    if request.domain.is_empty() {
        return Err(InvalidRequest("rate limit domain must not be empty".into()));
    }
    if request.descriptors.is_empty() {
        return Err(InvalidRequest(
            "rate limit descriptor list must not be empty".into(),
        ));
    }
    limits.check(
        &request.domain,
        request
            .descriptors
            .iter()
            .map(|d| d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()))),
    )?;
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

fn status_of(d: &DescriptorVerdict<'_>) -> DescriptorStatus {
    let current_limit = |applied: &AppliedLimit<'_>, limit: u64| RateLimit {
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

/// The RLS response for a verdict and its [`Answer`]: `overall_code` `OVER_LIMIT` when a limit
/// denied (or fails closed), the answer's headers in `response_headers_to_add`. An `Err` (the
/// answer's kind) when a store could not answer and no fail mode decided, which the caller
/// reports as an error (gRPC `UNAVAILABLE`/`INTERNAL`, HTTP 503/500) so that Envoy applies its
/// own `failure_mode_deny`.
pub fn response(verdict: &Verdict<'_>, answer: Answer) -> Result<RateLimitResponse, AnswerKind> {
    let kind = answer.kind();
    if matches!(kind, AnswerKind::Unavailable | AnswerKind::Failed) {
        return Err(kind);
    }
    Ok(RateLimitResponse {
        overall_code: if kind.over_limit() {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses: verdict.descriptors.iter().map(status_of).collect(),
        response_headers_to_add: answer
            .into_headers()
            .map(|(name, value)| HeaderValue {
                key: name.as_str().to_owned(),
                value: value.to_str().unwrap_or_default().to_owned(),
                raw_value: Vec::new(),
            })
            .collect(),
        ..Default::default()
    })
}
