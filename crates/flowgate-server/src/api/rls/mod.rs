//! The Envoy rate-limit service (RLS v3) model shared by gRPC and `POST /json`: requests to
//! [`Descriptor`]s, [`Verdict`]s (and their [`Answer`]) to responses; [`json`] is the
//! proto-JSON mapping of both.
//!
//! Response semantics follow envoyproxy/ratelimit: one status per request descriptor, in
//! order; `OVER_LIMIT` for a descriptor over its limit (`OK` when its rule is in shadow mode);
//! `OK` with no `current_limit` when no rule applies; `OK` with `limit_remaining = u32::MAX`
//! for unlimited rules; `overall_code` `OVER_LIMIT` when an enforced descriptor is — not for
//! a quota-mode descriptor while another quota-mode descriptor passes, and never under the
//! global shadow mode. With `--response-dynamic-metadata`, [`dynamic_metadata`] fills the
//! response's `dynamic_metadata`.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{
    Duration as ProtoDuration, ListValue, Struct, Value as ProtoValue,
};
use flowgate::answer::Answer;
use flowgate::envoy::{
    AppliedLimit, Descriptor, DescriptorVerdict, Entry, LimitOverride, MetaValue, Metadata, Status,
    Unit, Verdict, merge_metadata,
};

pub mod json;

use super::limits::InputLimits;

/// A request the service cannot take (gRPC `INVALID_ARGUMENT`, HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRequest(pub String);

/// A rate-limit request as every front end takes it: gRPC, `POST /json` and `POST /v1/check`
/// all parse into this, through [`parse_request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsRequest {
    /// The domain.
    pub domain: String,
    /// The descriptors.
    pub descriptors: Vec<Descriptor>,
    /// The request-level `hits_addend` (0 means 1).
    pub hits_addend: u64,
}

/// The request's domain, descriptors and request-level `hits_addend`, validated as
/// envoyproxy/ratelimit does (a domain and at least one descriptor are required) and within
/// `limits`. The one way into the service: the JSON front ends build the proto first.
pub fn parse_request(
    request: RateLimitRequest,
    limits: &InputLimits,
) -> Result<RlsRequest, InvalidRequest> {
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
    Ok(RlsRequest {
        domain: request.domain,
        descriptors,
        hits_addend: u64::from(request.hits_addend),
    })
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
    let hits_addend = d
        .hits_addend
        .map(|h| {
            // Envoy's own request-level hits_addend is 32 bits; so is every cost we take.
            u32::try_from(h.value)
                .map(u64::from)
                .map_err(|_| InvalidRequest("descriptor hits_addend must fit in 32 bits".into()))
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
        hits_addend,
        charge: false,
    })
}

/// `envoy.type.v3.RateLimitUnit` → [`Unit`].
fn override_unit(unit: i32) -> Result<Unit, InvalidRequest> {
    Unit::from_proto_number(unit)
        .ok_or_else(|| InvalidRequest(format!("limit override has no valid unit ({unit})")))
}

/// The response `unit` for a period: the matching unit, or `UNKNOWN` for periods that are not
/// one (e.g. `period: 90s`).
fn proto_unit(period: Option<Duration>) -> i32 {
    period
        .and_then(Unit::from_period)
        .map_or(ProtoUnit::Unknown as i32, Unit::proto_number)
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
        unit: proto_unit(applied.rate().period()),
    };
    let code = if d.denies() {
        Code::OverLimit
    } else {
        Code::Ok
    } as i32;
    match (&d.status, &d.applied) {
        (Status::Counted(Ok(decision)), Some(applied)) => DescriptorStatus {
            code,
            current_limit: Some(current_limit(applied, decision.limit)),
            limit_remaining: saturate(flowgate::answer::headers::remaining(decision)),
            duration_until_reset: Some(proto_duration(decision.reset_after)),
            quota: None,
        },
        (Status::Blocked { period }, Some(applied)) => DescriptorStatus {
            code,
            current_limit: Some(current_limit(applied, 0)),
            limit_remaining: 0,
            duration_until_reset: Some(proto_duration(*period)),
            quota: None,
        },
        (Status::Counted(Err(_)), Some(applied)) => DescriptorStatus {
            code,
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
/// denied (or fails closed), the answer's headers in `response_headers_to_add`. For an answer
/// the limits decided; a store that could not answer (and no fail mode decided) is reported
/// by the caller as an error instead (gRPC `UNAVAILABLE`/`INTERNAL`, HTTP 503/500), so that
/// Envoy applies its own `failure_mode_deny`.
pub fn response(verdict: &Verdict<'_>, answer: Answer) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: if answer.kind().over_limit() {
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
    }
}

/// The response's `dynamic_metadata`, as envoyproxy/ratelimit builds it (with its
/// `RESPONSE_DYNAMIC_METADATA`): `domain`; `descriptors`, one per request descriptor, each
/// with its `entries` as `"key=value"` strings, its `limit` override (as
/// `"requests_per_unit:N unit:UNIT"`) and its `hitsAddend` when set; the request's `hitsAddend`
/// when not 0; and `metadata`: the `metadata` of the rules matched by the descriptors that
/// passed (not over their limit; not unlimited or replaced), merged in request order — a
/// structure present in several is merged recursively, otherwise the first value wins. No
/// `metadata` field when there is none.
pub fn dynamic_metadata(request: &RlsRequest, verdict: &Verdict<'_>) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("domain".to_owned(), string(&request.domain));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut f = std::collections::BTreeMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| string(&format!("{}={}", e.key, e.value)))
                .collect();
            f.insert("entries".to_owned(), list(entries));
            if let Some(limit) = d.limit {
                let unit = ProtoUnit::try_from(limit.unit.proto_number())
                    .map_or("UNKNOWN", |u| u.as_str_name());
                f.insert(
                    "limit".to_owned(),
                    string(&format!(
                        "requests_per_unit:{} unit:{unit}",
                        limit.requests_per_unit
                    )),
                );
            }
            if let Some(hits) = d.hits_addend {
                f.insert("hitsAddend".to_owned(), number(hits as f64));
            }
            value(Kind::StructValue(Struct {
                fields: f.into_iter().collect(),
            }))
        })
        .collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".to_owned(), number(request.hits_addend as f64));
    }
    let mut merged = Metadata::new();
    for d in &verdict.descriptors {
        let passed = matches!(d.status, Status::Counted(_) | Status::Blocked { .. }) && !d.denies();
        if let (true, Some(AppliedLimit::Rule(rule))) = (passed, d.applied)
            && let Some(metadata) = &rule.metadata
        {
            merge_metadata(&mut merged, metadata);
        }
    }
    if !merged.is_empty() {
        fields.insert(
            "metadata".to_owned(),
            meta_value(&MetaValue::Struct(merged)),
        );
    }
    Struct {
        fields: fields.into_iter().collect(),
    }
}

fn value(kind: Kind) -> ProtoValue {
    ProtoValue { kind: Some(kind) }
}

fn string(s: &str) -> ProtoValue {
    value(Kind::StringValue(s.to_owned()))
}

fn number(n: f64) -> ProtoValue {
    value(Kind::NumberValue(n))
}

fn list(values: Vec<ProtoValue>) -> ProtoValue {
    value(Kind::ListValue(ListValue { values }))
}

/// A rule's metadata value as a `google.protobuf.Value`.
fn meta_value(v: &MetaValue) -> ProtoValue {
    match v {
        MetaValue::Null => value(Kind::NullValue(0)),
        MetaValue::Bool(b) => value(Kind::BoolValue(*b)),
        MetaValue::Number(n) => number(*n),
        MetaValue::String(s) => string(s),
        MetaValue::List(l) => list(l.iter().map(meta_value).collect()),
        MetaValue::Struct(m) => value(Kind::StructValue(Struct {
            fields: m.iter().map(|(k, v)| (k.clone(), meta_value(v))).collect(),
        })),
    }
}
