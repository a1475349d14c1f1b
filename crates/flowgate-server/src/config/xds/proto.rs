//! envoyproxy/ratelimit's `RateLimitConfig`, the resource an xDS management server sends, as
//! prost messages written by hand (no protoc): a copy of
//! `api/ratelimit/config/ratelimit/v3/rls_conf.proto` in envoyproxy/ratelimit at commit
//! f2fb15770f7fd1c88ca6c3a1b58ee513917ace96 — same field numbers and types. `envoy-types`
//! does not carry these messages.

use envoy_types::pb::google::protobuf::Struct;

/// The type URL of the resource in `DiscoveryRequest`/`DiscoveryResponse` and in each `Any`.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Rate limit configuration for a single domain.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    /// Name of the configuration, unique among the resources.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The domain.
    #[prost(string, tag = "2")]
    pub domain: String,
    /// The descriptors.
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// One descriptor rule.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The entry key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The entry value; empty matches any value.
    #[prost(string, tag = "2")]
    pub value: String,
    /// The limit, if any.
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    /// Nested rules.
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Count but never deny.
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    /// Metrics per descriptor value.
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    /// A denial denies only when every quota-mode limit of the request denies.
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    /// Returned in the response's dynamic metadata.
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<Struct>,
}

/// A descriptor's limit.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// The unit ([`RateLimitUnit`]; 0 = unknown).
    #[prost(enumeration = "RateLimitUnit", tag = "1")]
    pub unit: i32,
    /// Requests per unit.
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// Always allow.
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    /// The limit's name (for `replaces`).
    #[prost(string, tag = "4")]
    pub name: String,
    /// Limits this one replaces.
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// A limit replaced by another.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    /// The replaced limit's name.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// The unit of a limit. The numbers are the proto's (`WEEK` is 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RateLimitUnit {
    /// Not set.
    Unknown = 0,
    /// A second.
    Second = 1,
    /// A minute.
    Minute = 2,
    /// An hour.
    Hour = 3,
    /// A day.
    Day = 4,
    /// A week.
    Week = 7,
    /// A month.
    Month = 5,
    /// A year.
    Year = 6,
}
