//! The `gateway:` section: how the reverse proxy (`flowgate serve --upstream URL`) turns each
//! HTTP request into rate-limit descriptors.
//!
//! ```yaml
//! domain: edge
//! gateway:
//!   listen: 127.0.0.1:8000          # optional; `--gateway ADDR` overrides
//!   trusted_proxies: [10.0.0.0/8]   # whose X-Forwarded-For is believed
//!   ipv6_prefix: 64                 # IPv6 clients are keyed by this prefix
//!   upstream_timeout: 30s           # until the upstream's response head
//!   upstream_max_connections: 1024  # open to the upstream at once (busy and idle)
//!   upstream_queue_timeout: 1s      # a request's wait for a connection when all are busy
//!   body_idle_timeout: 60s          # silence allowed in a request or response body
//!   forwarded: overwrite            # or append: clients' X-Forwarded-For/Forwarded
//!   usage_header: x-usage-tokens    # charge what the upstream says was used (`charge: true` rules)
//!   usage_json: /usage/total_tokens # or read it from the response body (JSON or server-sent events)
//!   jwt: {hs256_secret_env: JWT_SECRET}   # or {rs256_public_key_file: key.pem}
//!   descriptors:                    # each list is one request descriptor
//!     - [{key: remote_address}]
//!     - [{key: header, header: x-api-key, as: api_key}, {key: path}]
//!     - [{key: method}, {key: jwt_claim, claim: plan}]
//!   in_flight:                      # at most N requests in flight per key (leases)
//!     - limit: checkout             # a `concurrency` entry's name (its limit and lease_time)
//!       key: [{key: header, header: x-api-key}]   # the same sources as `descriptors`
//! descriptors: ...                  # the rules the descriptors above are matched against
//! concurrency:
//!   - {name: checkout, limit: 20, lease_time: 30s}
//! ```
//!
//! The YAML is read in `yaml/gateway.rs` (with positions); this module holds the validated
//! model.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use flowgate::http::key::{ClientIp, Header, JwtClaim};

use super::address::ListenAddr;
use super::concurrency::ConcurrencyLimit;

/// Where the gateway listens unless the file or `--gateway` says otherwise.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8000));

/// How long the gateway waits for the upstream's response head by default.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// The default [`GatewayConfig::upstream_max_connections`] (Envoy's default cluster
/// circuit-breaker limit).
pub const DEFAULT_UPSTREAM_MAX_CONNECTIONS: usize = 1024;

/// The default [`GatewayConfig::upstream_queue_timeout`].
pub const DEFAULT_UPSTREAM_QUEUE_TIMEOUT: Duration = Duration::from_secs(1);

/// The default [`GatewayConfig::body_idle_timeout`] (nginx's `client_body_timeout` and
/// `proxy_read_timeout`).
pub const DEFAULT_BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The validated `gateway:` section of one configuration file.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The domain of the file the section is in: the descriptors are checked against it.
    pub domain: String,
    /// `listen`, if given (`--gateway` overrides it; default [`DEFAULT_LISTEN`]).
    pub listen: Option<ListenAddr>,
    /// How the client's address is found (trusted proxies, IPv6 prefix).
    pub client_ip: ClientIp,
    /// The request descriptors, each a list of entries; all must allow a request.
    pub descriptors: Vec<Vec<EntryConfig>>,
    /// How long to wait for the upstream's response head before answering 504.
    pub upstream_timeout: Duration,
    /// Connections to the upstream open at once, busy and idle (read at start: a reload does
    /// not resize the pool).
    pub upstream_max_connections: usize,
    /// How long a request waits for an upstream connection when all are busy before it is
    /// answered 503 (read at start).
    pub upstream_queue_timeout: Duration,
    /// How long a request body (from the client) or a response body (from the upstream) may
    /// go without data before it is given up and its connections closed.
    pub body_idle_timeout: Duration,
    /// What happens to `X-Forwarded-For`/`Forwarded` sent by a client that is not a trusted
    /// proxy.
    pub forwarded: Forwarded,
    /// The upstream response header that reports the units a request used (e.g. LLM tokens):
    /// descriptors whose rule has `charge: true` are checked with 0 units on the way in and
    /// charged this many when the response head arrives.
    pub usage_header: Option<http::HeaderName>,
    /// Where the upstream's response body reports the units a request used: a JSON pointer
    /// (RFC 6901, e.g. `/usage/total_tokens`) into an `application/json` body or into the
    /// events of a `text/event-stream` body. Charged like `usage_header` when the body ends;
    /// the header, when the response has it, wins.
    pub usage_json: Option<String>,
    /// `in_flight`: the concurrency limits each request holds a lease of while it is in
    /// flight (its response body included); empty: none, and nothing is asked.
    pub in_flight: Vec<InFlightConfig>,
}

/// One `in_flight` item: at most `limit.terms.limit()` requests in flight per key built from
/// `key`, held as leases of the `concurrency` limit `name`.
#[derive(Debug, Clone)]
pub struct InFlightConfig {
    /// The `concurrency` limit's name (the leases' namespace, shared with `/v1/leases/{name}`).
    pub name: String,
    /// The limit and lease time, resolved from the `concurrency` section when the
    /// configuration is loaded.
    pub limit: ConcurrencyLimit,
    /// The entries whose values, joined, key the leases (a request that lacks one of them
    /// holds no lease of this limit).
    pub key: Vec<EntryConfig>,
}

/// What the gateway does with the `X-Forwarded-For` and `Forwarded` fields of a request from a
/// peer that is not a trusted proxy (from a trusted one, earlier hops are always kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Forwarded {
    /// Replace them with this hop only (default): an upstream reading the leftmost entry
    /// cannot be given a made-up address.
    #[default]
    Overwrite,
    /// Keep them and append this hop (the upstream judges the chain itself).
    Append,
}

impl GatewayConfig {
    /// The section used when `--upstream` is given but no file has one: one descriptor,
    /// `[remote_address]` (the peer's address; no proxy is trusted), against `domain`.
    pub fn default_for(domain: impl Into<String>) -> Self {
        GatewayConfig {
            domain: domain.into(),
            listen: None,
            client_ip: ClientIp::new([]),
            descriptors: vec![vec![EntryConfig {
                key: "remote_address".into(),
                source: Source::RemoteAddress,
            }]],
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            upstream_max_connections: DEFAULT_UPSTREAM_MAX_CONNECTIONS,
            upstream_queue_timeout: DEFAULT_UPSTREAM_QUEUE_TIMEOUT,
            body_idle_timeout: DEFAULT_BODY_IDLE_TIMEOUT,
            forwarded: Forwarded::Overwrite,
            usage_header: None,
            usage_json: None,
            in_flight: Vec::new(),
        }
    }
}

/// One entry of a request descriptor: the descriptor key it is sent as, and where its value
/// comes from.
#[derive(Debug, Clone)]
pub struct EntryConfig {
    /// The descriptor entry's key (what the rules' `key` matches): `as`, else the source's
    /// default name.
    pub key: String,
    /// Where the value comes from.
    pub source: Source,
}

/// Where a descriptor entry's value comes from. A source that a request lacks (no such
/// header, no valid token, no such claim) skips the whole descriptor, as Envoy does.
#[derive(Debug, Clone)]
pub enum Source {
    /// `remote_address`: the client's address (trusted-proxy aware; IPv6 by prefix). Never
    /// missing.
    RemoteAddress,
    /// `header`: a request header's value (trimmed; at most 256 bytes of visible ASCII, else
    /// 400).
    Header(Header),
    /// `path`: the request's path, without the query.
    Path,
    /// `method`: the request method (`GET`).
    Method,
    /// `host`: the request's host (lower-case, with the port if given).
    Host,
    /// `jwt_claim`: a claim of the verified bearer token.
    JwtClaim(JwtClaim),
    /// `generic_key`: a fixed value.
    Generic(String),
}

impl Source {
    /// The source names the `key` field accepts.
    pub const NAMES: &'static str =
        "remote_address, header, path, method, host, jwt_claim, generic_key";
}
