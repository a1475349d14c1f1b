//! The `websocket:` section: how the WebSocket gateway (`flowgate serve` with this section)
//! admits upgrades and limits the messages it relays between clients and a `ws://` upstream.
//!
//! ```yaml
//! domain: chat
//! websocket:
//!   listen: 127.0.0.1:8001            # optional; `--websocket ADDR` overrides
//!   upstream: ws://127.0.0.1:9000     # where connections are relayed (path and query kept)
//!   trusted_proxies: [10.0.0.0/8]     # whose X-Forwarded-For is believed
//!   jwt: {hs256_secret_env: JWT_SECRET}
//!   user: {source: jwt_claim, name: sub}       # or {source: header, name: x-user}
//!   role: {source: jwt_claim, name: role}
//!   room: {source: query, name: room}          # or {source: path}, {source: header, name: …}
//!   classify: {type: /type, cost: /symbols, room: /room}   # JSON pointers
//!   limits:
//!     connections_per_ip: {limit: 10, per: 1s, burst: 20}
//!     concurrent_per_ip: 50
//!     messages: {limit: 120, per: 60s}
//!     user_messages: {limit: 20, per: 30s}
//!     room_messages: {limit: 500, per: 1s}
//!     slowmode: 3s
//!     slowmode_exempt: [moderator]
//!     costs: {subscribe: 5, ping: 0}
//!     release: [unsubscribe]
//!     max_message_size: 65536
//!     close_after: {violations: 3, within: 10s}
//!   outbound: {messages: {limit: 1000, per: 1s}}   # upstream → client, optional
//!   buffer: {messages: 64, bytes: 1048576}         # per direction
//!   slow_reader: pause                             # pause | drop | close
//!   handshake_timeout: 10s
//!   idle_timeout: 5m
//! ```
//!
//! The YAML is parsed in `yaml/websocket.rs` (with positions); this module holds the validated
//! model.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use flowgate::Quota;
use flowgate::http::key::{ClientIp, Header, JwtClaim};
use flowgate::ws::{
    Classifier, ErrorFrame, PenaltyConfig, Scope, WsLimiter, WsLimiterBuilder, WsPolicyError,
};
use http::uri::{Authority, PathAndQuery};

/// Where the WebSocket gateway listens unless the file or `--websocket` says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8001";
/// How long the upgrade to the upstream may take by default (connect, request, `101`).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may carry no message in either direction by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Messages waiting to be written, per direction, by default.
pub const DEFAULT_BUFFER_MESSAGES: usize = 64;
/// Bytes waiting to be written, per direction, by default.
pub const DEFAULT_BUFFER_BYTES: usize = 1 << 20;
/// The largest message relayed when `limits.max_message_size` is not set (the WebSocket
/// library's own bound on a reassembled message, in both directions).
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 20;

/// The validated `websocket:` section of one configuration file.
#[derive(Debug, Clone)]
pub struct WebSocketConfig {
    /// `listen`, if given (`--websocket` overrides it; default [`DEFAULT_LISTEN`]).
    pub listen: Option<SocketAddr>,
    /// Where connections are relayed.
    pub upstream: WsUpstream,
    /// How the client's address is found (trusted proxies, IPv6 prefix).
    pub client_ip: ClientIp,
    /// Where the user comes from, if anywhere (a connection without one has no user layer).
    pub user: Option<KeySource>,
    /// Where the user's role comes from, if anywhere.
    pub role: Option<KeySource>,
    /// Where the connection's room comes from, if anywhere.
    pub room: Option<KeySource>,
    /// Reads each client message's type, cost and room.
    pub classifier: Classifier,
    /// The limits of client → upstream messages and of the upgrade.
    pub limits: WsLimits,
    /// The limits of upstream → client messages, if any.
    pub outbound: Option<WsLimits>,
    /// Messages waiting to be written, per direction.
    pub buffer_messages: usize,
    /// Bytes waiting to be written, per direction.
    pub buffer_bytes: usize,
    /// What happens to a peer that reads slower than the other side writes.
    pub slow_reader: SlowReader,
    /// The upgrade to the upstream: connect, request and its `101`.
    pub handshake_timeout: Duration,
    /// No message in either direction for this long closes the connection.
    pub idle_timeout: Duration,
}

/// Where a value of the upgrade request comes from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// A request header (trimmed; at most 256 bytes of visible ASCII).
    Header(Header),
    /// A claim of the verified bearer token.
    JwtClaim(JwtClaim),
    /// A query parameter.
    Query(String),
    /// The request's path.
    Path,
}

/// What happens to a peer that cannot keep up (its buffer full).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlowReader {
    /// Stop reading from the other side until the buffer drains (TCP backpressure).
    Pause,
    /// Drop the messages that do not fit (counted).
    Drop,
    /// Close the connection with 1013 (try again later).
    Close,
}

impl SlowReader {
    /// Its name in configuration and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            SlowReader::Pause => "pause",
            SlowReader::Drop => "drop",
            SlowReader::Close => "close",
        }
    }
}

/// A `ws://host[:port][/path]` upstream. A path is prepended to each client's path; the
/// client's query is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsUpstream {
    /// `host[:port]` (port 80 when absent).
    pub authority: Authority,
    /// The path prefix, without a trailing `/` (empty for none).
    pub prefix: String,
}

impl WsUpstream {
    /// Parses `ws://host[:port][/prefix]`.
    pub fn parse(url: &str) -> Result<Self, &'static str> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| "not a URL; write e.g. ws://127.0.0.1:9000")?;
        match uri.scheme_str() {
            Some("ws") => {}
            Some("wss") => {
                return Err(
                    "only ws:// upstreams are supported (TLS to the upstream is not implemented)",
                );
            }
            Some(_) => return Err("only ws:// upstreams are supported"),
            None => return Err("give the scheme: ws://host:port"),
        }
        let authority = uri.authority().ok_or("no host")?.clone();
        if authority.as_str().contains('@') {
            return Err("user information is not supported");
        }
        if authority.host().is_empty() {
            return Err("no host");
        }
        if uri.query().is_some() {
            return Err("a query is not supported; connections keep their own query");
        }
        Ok(WsUpstream {
            authority,
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// `host:port` to connect to.
    pub fn address(&self) -> String {
        let port = self.authority.port_u16().unwrap_or(80);
        format!("{}:{port}", self.authority.host())
    }

    /// The request target for a client's `path_and_query`.
    pub fn target(&self, path_and_query: Option<&PathAndQuery>) -> String {
        let pq = path_and_query.map_or("/", PathAndQuery::as_str);
        format!("{}{pq}", self.prefix)
    }
}

impl fmt::Display for WsUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ws://{}{}", self.authority, self.prefix)
    }
}

/// `close_after`: close after `violations` rejections within `within`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseAfter {
    /// Rejections.
    pub violations: u64,
    /// Within this long.
    pub within: Duration,
}

/// Every limit of one direction, as configured: what [`WsLimiterBuilder`] is given. Two equal
/// `WsLimits` build the same limiter, so a reload that leaves them alone keeps the running
/// limiter (its open connections, caps and penalty box).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WsLimits {
    /// New connections per client IP.
    pub connections_per_ip: Option<Quota>,
    /// Connections open at once per client IP.
    pub concurrent_per_ip: Option<u32>,
    /// Connections open at once per user.
    pub concurrent_per_user: Option<u32>,
    /// Connections open at once on this instance.
    pub max_connections: Option<usize>,
    /// Messages per connection.
    pub messages: Option<Quota>,
    /// Messages per connection, by role.
    pub messages_for_role: BTreeMap<String, Quota>,
    /// Bytes per connection.
    pub bytes: Option<Quota>,
    /// Messages per user, across connections and instances.
    pub user_messages: Option<Quota>,
    /// Messages per user, by role.
    pub user_messages_for_role: BTreeMap<String, Quota>,
    /// Messages per room.
    pub room_messages: Option<Quota>,
    /// One message per interval per user and room.
    pub slowmode: Option<Duration>,
    /// Roles slowmode does not apply to.
    pub slowmode_exempt: Vec<String>,
    /// Protocol errors per connection (messages the upstream cannot be sent: invalid frames).
    pub errors: Option<Quota>,
    /// The largest message accepted (close 1009 beyond).
    pub max_message_size: Option<usize>,
    /// Cost per message type.
    pub costs: BTreeMap<String, u64>,
    /// Cost of other messages.
    pub default_cost: Option<u64>,
    /// Types that release resources: counted, never rejected.
    pub release: Vec<String>,
    /// Close after this many rejections within a time.
    pub close_after: Option<CloseAfter>,
    /// Close at this multiple of the connection rate.
    pub close_at_multiple: Option<u64>,
    /// The violation close code.
    pub close_code: Option<u16>,
    /// The violation close reason.
    pub close_reason: Option<String>,
    /// The error frame template.
    pub error_frame: Option<String>,
    /// The penalty box, if on.
    pub penalty_box: Option<PenaltyConfig>,
    /// Layers that count but never reject.
    pub dry_run: Vec<Scope>,
    /// Prefix of the store keys.
    pub key_prefix: Option<String>,
}

/// Why a `limits` block cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// The library refused the policy.
    #[error(transparent)]
    Policy(#[from] WsPolicyError),
    /// The error frame template is wrong.
    #[error(transparent)]
    Frame(#[from] flowgate::ws::UnknownPlaceholder),
}

impl WsLimits {
    /// Builds the limiter these limits describe.
    pub fn build(&self) -> Result<WsLimiter, LimitsError> {
        let mut b: WsLimiterBuilder = WsLimiter::builder();
        if let Some(q) = self.connections_per_ip {
            b = b.connections_per_ip(q);
        }
        if let Some(n) = self.concurrent_per_ip {
            b = b.concurrent_per_ip(n);
        }
        if let Some(n) = self.concurrent_per_user {
            b = b.concurrent_per_user(n);
        }
        if let Some(n) = self.max_connections {
            b = b.max_connections(n);
        }
        if let Some(q) = self.messages {
            b = b.messages(q);
        }
        for (role, q) in &self.messages_for_role {
            b = b.messages_for_role(role.clone(), *q);
        }
        if let Some(q) = self.bytes {
            b = b.bytes(q);
        }
        if let Some(q) = self.user_messages {
            b = b.user_messages(q);
        }
        for (role, q) in &self.user_messages_for_role {
            b = b.user_messages_for_role(role.clone(), *q);
        }
        if let Some(q) = self.room_messages {
            b = b.room_messages(q);
        }
        if let Some(d) = self.slowmode {
            b = b.slowmode(d);
        }
        for role in &self.slowmode_exempt {
            b = b.slowmode_exempt(role.clone());
        }
        if let Some(q) = self.errors {
            b = b.errors(q);
        }
        if let Some(n) = self.max_message_size {
            b = b.max_message_size(n);
        }
        for (kind, cost) in &self.costs {
            b = b.cost(kind.clone(), *cost);
        }
        if let Some(cost) = self.default_cost {
            b = b.default_cost(cost);
        }
        for kind in &self.release {
            b = b.release(kind.clone());
        }
        if let Some(c) = self.close_after {
            b = b.close_after(c.violations, c.within);
        }
        if let Some(m) = self.close_at_multiple {
            b = b.close_at_multiple(m);
        }
        if self.close_code.is_some() || self.close_reason.is_some() {
            b = b.close_code(
                self.close_code
                    .unwrap_or(flowgate::ws::close_code::POLICY_VIOLATION),
                self.close_reason
                    .as_deref()
                    .unwrap_or("rate limit exceeded"),
            );
        }
        if let Some(template) = &self.error_frame {
            b = b.error_frame(ErrorFrame::template(template)?);
        }
        if let Some(p) = self.penalty_box {
            b = b.penalty_box(p);
        }
        for scope in &self.dry_run {
            b = b.dry_run(*scope);
        }
        if let Some(prefix) = &self.key_prefix {
            b = b.key_prefix(prefix.clone());
        }
        Ok(b.build()?)
    }

    /// The largest message these limits accept, else [`DEFAULT_MAX_MESSAGE`].
    pub fn max_message(&self) -> usize {
        self.max_message_size.unwrap_or(DEFAULT_MAX_MESSAGE)
    }
}
