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
//! The YAML is read in `yaml/websocket.rs` (with positions); this module holds the validated
//! model. `limits` and `outbound` are the library's own model, [`WsPolicy`]: its fields are
//! the YAML's.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::str::FromStr;
use std::time::Duration;

use flowgate::http::key::{ClientIp, Header, JwtClaim};
use flowgate::ws::{Classifier, WsPolicy};
use http::uri::{Authority, PathAndQuery};

use super::address::ListenAddr;

/// Where the WebSocket gateway listens unless the file or `--websocket` says otherwise.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8001));
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
    pub listen: Option<ListenAddr>,
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
    /// The limits of client → upstream messages and of the upgrade. Two equal policies build
    /// the same limiter, so a reload that leaves them alone keeps the running limiter (its
    /// open connections, caps and penalty box).
    pub limits: WsPolicy,
    /// The limits of upstream → client messages (message layers only), if any.
    pub outbound: Option<WsPolicy>,
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

impl FromStr for SlowReader {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        [SlowReader::Pause, SlowReader::Drop, SlowReader::Close]
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| format!("unknown policy `{name}`; expected one of pause, drop, close"))
    }
}

impl<'de> serde::Deserialize<'de> for SlowReader {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
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

    /// The request target for a client's `path_and_query` (an empty path is `/`, RFC 9112
    /// §3.2.1: `http://host?q` is `/?q`).
    pub fn target(&self, path_and_query: Option<&PathAndQuery>) -> String {
        let pq = path_and_query.map_or("/", PathAndQuery::as_str);
        let slash = if pq.is_empty() || pq.starts_with('?') {
            "/"
        } else {
            ""
        };
        format!("{}{slash}{pq}", self.prefix)
    }
}

impl fmt::Display for WsUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ws://{}{}", self.authority, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_keep_the_prefix_and_give_an_empty_path_its_slash() {
        let target = |upstream: &str, client: &str| {
            let uri: http::Uri = client.parse().unwrap();
            WsUpstream::parse(upstream)
                .unwrap()
                .target(uri.path_and_query())
        };
        assert_eq!(target("ws://up:9000", "/chat?room=1"), "/chat?room=1");
        assert_eq!(target("ws://up:9000/ws", "/chat?room=1"), "/ws/chat?room=1");
        // Absolute form with an empty path (RFC 9112 §3.2.1).
        assert_eq!(target("ws://up:9000", "http://h?room=1"), "/?room=1");
        assert_eq!(target("ws://up:9000/ws", "http://h?room=1"), "/ws/?room=1");
        assert_eq!(target("ws://up:9000", "http://h"), "/");
    }
}
