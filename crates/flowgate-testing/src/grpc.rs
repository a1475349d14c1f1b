//! gRPC (Envoy's `ShouldRateLimit`) requests for a server under test.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde_json::Value;
use tonic::transport::Channel;

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request for `domain` with `descriptors`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// Calls ShouldRateLimit.
pub async fn should(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

/// `overall_code` / `code` of a descriptor that is within its limit.
pub const OK: i32 = 1;
/// `overall_code` / `code` of a descriptor over its limit.
pub const OVER_LIMIT: i32 = 2;

/// A request as Envoy sees it.
pub struct Sample<'a> {
    /// The request's path.
    pub path: &'a str,
    /// The client's address.
    pub remote_address: &'a str,
    /// The request's headers.
    pub headers: &'a [(&'a str, &'a str)],
}

/// The descriptor one `rate_limits` entry's actions make for `sample` (the actions used in the
/// doc; any other action fails the test, so the doc cannot drift beyond what is checked).
/// `None` when an action skips the descriptor (`skip_if_absent`).
pub fn descriptor_for(actions: &[Value], sample: &Sample<'_>) -> Option<RateLimitDescriptor> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for action in actions {
        let (name, body) = action.as_object().unwrap().iter().next().unwrap();
        match name.as_str() {
            "remote_address" => {
                entries.push(("remote_address".into(), sample.remote_address.into()))
            }
            "generic_key" => entries.push((
                body.get("descriptor_key")
                    .and_then(Value::as_str)
                    .unwrap_or("generic_key")
                    .into(),
                body["descriptor_value"].as_str().unwrap().into(),
            )),
            "request_headers" => {
                let header = body["header_name"].as_str().unwrap();
                match sample
                    .headers
                    .iter()
                    .find(|(h, _)| h.eq_ignore_ascii_case(header))
                {
                    Some((_, value)) => entries.push((
                        body["descriptor_key"].as_str().unwrap().into(),
                        (*value).into(),
                    )),
                    // Envoy drops the entry with `skip_if_absent`, else the whole descriptor.
                    None if body["skip_if_absent"] == Value::Bool(true) => {}
                    None => return None,
                }
            }
            other => panic!("the document uses action `{other}`, which this test does not model"),
        }
    }
    if entries.is_empty() {
        return None;
    }
    let borrowed: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    Some(descriptor(&borrowed))
}
