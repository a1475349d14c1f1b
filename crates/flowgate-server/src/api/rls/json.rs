//! The proto-JSON form of the RLS request and response, for `POST /json` (what
//! envoyproxy/ratelimit's HTTP endpoint speaks).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry as ProtoEntry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt64Value};
use flowgate::envoy::Unit;
use serde::{Deserialize, Serialize};

use super::InvalidRequest;

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
        Ok(RateLimitRequest {
            domain: self.domain,
            hits_addend: fits_u32(self.hits_addend.map_or(0, JsonInt::get), "hits_addend")?,
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
                                Some(JsonEnum::Name(name)) => unit_number(&name)?,
                            };
                            override_proto(o.requests_per_unit.map_or(0, JsonInt::get), unit)
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

/// `n` as the proto's `uint32` field `name`, or the 400 every front end gives for it.
pub(crate) fn fits_u32(n: u64, name: &str) -> Result<u32, InvalidRequest> {
    u32::try_from(n).map_err(|_| InvalidRequest(format!("{name} must fit in 32 bits")))
}

/// A unit named in JSON (`"minute"`, `"MINUTE"`) as its proto number.
pub(crate) fn unit_number(name: &str) -> Result<i32, InvalidRequest> {
    name.parse::<Unit>()
        .map(Unit::proto_number)
        .map_err(|e| InvalidRequest(e.to_string()))
}

/// A descriptor's limit override as the proto carries it.
pub(crate) fn override_proto(
    requests_per_unit: u64,
    unit: i32,
) -> Result<RateLimitOverride, InvalidRequest> {
    Ok(RateLimitOverride {
        requests_per_unit: fits_u32(requests_per_unit, "requests_per_unit")?,
        unit,
    })
}

/// `RateLimitResponse` in canonical proto-JSON: lowerCamelCase names, enums by name, default
/// values omitted, durations as `"1.5s"`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JsonResponse {
    overall_code: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
    /// `dynamic_metadata` (a `google.protobuf.Struct`, as a JSON object), with
    /// `--response-dynamic-metadata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    dynamic_metadata: Option<serde_json::Value>,
}

/// A `google.protobuf.Struct` in proto-JSON: a JSON object.
fn struct_json(s: &envoy_types::pb::google::protobuf::Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

/// A `google.protobuf.Value` in proto-JSON.
fn value_json(v: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        // Whole numbers as integers (`2`, not `2.0`), as protojson writes them.
        #[allow(clippy::cast_possible_truncation, clippy::float_cmp)]
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 => {
            serde_json::Value::from(*n as i64)
        }
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_json).collect())
        }
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
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

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct JsonLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "is_zero")]
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
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
            dynamic_metadata: r.dynamic_metadata.as_ref().map(struct_json),
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
