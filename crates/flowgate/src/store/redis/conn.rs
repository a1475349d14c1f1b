//! Connections to one Redis server or a Redis Cluster, running the scripts.
//!
//! Both kinds are multiplexed: one TCP connection per server, shared by every clone, with
//! concurrent commands pipelined on it. A single server is reached through redis-rs's
//! `ConnectionManager`, which reconnects in the background after the server went away; a
//! cluster through its cluster client, which routes by key slot, follows `MOVED`/`ASK`
//! redirections and refreshes the slot map after failovers.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use super::script::{Script, malformed};
use crate::store::StoreError;

/// A shared connection; clones are cheap and use the same sockets.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server (or a proxy in front of several).
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Connection::Single(_) => "Connection::Single",
            Connection::Cluster(_) => "Connection::Cluster",
        })
    }
}

/// The least time a connection attempt is given, whatever the call timeout: a TLS handshake
/// takes round trips of its own (to a managed Redis in another zone, tens of milliseconds),
/// and reconnecting happens beside the calls, which the store bounds by its timeout anyway.
pub(super) const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// `redis://` URLs: one for a single server, one or more seed nodes for a cluster.
    pub(super) urls: Vec<String>,
    /// Whether `urls` are cluster nodes.
    pub(super) cluster: bool,
    /// Bound on each connection attempt and each response.
    pub(super) timeout: Duration,
    /// Certificates for `rediss://` URLs other than the system's roots.
    #[cfg(feature = "redis-tls")]
    pub(super) tls: Option<TlsFiles>,
}

/// PEM certificates for TLS to Redis: roots to trust instead of the system's, and a client
/// certificate for servers that ask for one (`tls-auth-clients yes`).
#[cfg(feature = "redis-tls")]
#[derive(Clone, Default)]
pub(super) struct TlsFiles {
    /// Root certificates (PEM); `None`: the system's.
    pub(super) roots: Option<Vec<u8>>,
    /// Client certificate chain and private key (PEM).
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "redis-tls")]
impl std::fmt::Debug for TlsFiles {
    /// Never the key: only what is configured.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("roots", &self.roots.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

#[cfg(feature = "redis-tls")]
impl TlsFiles {
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client.clone().map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.roots.clone(),
        }
    }
}

impl Connection {
    /// Connects (for a single server, retrying a few times). Each connection attempt gets
    /// `timeout`, but at least [`MIN_CONNECT_TIMEOUT`].
    pub(super) async fn connect(target: &Target) -> Result<Self, StoreError> {
        let timeout = target.timeout;
        let connect_timeout = timeout.max(MIN_CONNECT_TIMEOUT);
        if target.cluster {
            let builder = ClusterClient::builder(target.urls.iter().map(String::as_str));
            #[cfg(feature = "redis-tls")]
            let builder = match &target.tls {
                Some(tls) => builder.certs(tls.certificates()),
                None => builder,
            };
            let client = builder
                .connection_timeout(connect_timeout)
                .response_timeout(timeout)
                .retries(3)
                .min_retry_wait(5)
                .max_retry_wait(100)
                .build()
                .map_err(convert)?;
            let conn = client.get_async_connection().await.map_err(convert)?;
            return Ok(Connection::Cluster(conn));
        }
        let url = target
            .urls
            .first()
            .ok_or_else(|| StoreError::Backend("no Redis URL given".into()))?;
        #[cfg(feature = "redis-tls")]
        let client = match &target.tls {
            Some(tls) => redis::Client::build_with_tls(url.as_str(), tls.certificates()),
            None => redis::Client::open(url.as_str()),
        }
        .map_err(convert)?;
        #[cfg(not(feature = "redis-tls"))]
        let client = redis::Client::open(url.as_str()).map_err(convert)?;
        // Reconnect quickly after an outage: the circuit breaker, not the connection, decides
        // how often a dead server is tried.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(timeout))
            .set_min_delay(Duration::from_millis(5))
            .set_max_delay(Duration::from_millis(100))
            .set_number_of_retries(2);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(convert)?;
        Ok(Connection::Single(conn))
    }

    /// Whether this is a cluster connection (requests are grouped by slot).
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }

    /// Sends one command; an error reply from the server is an `Err` too.
    async fn send(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let reply = match self {
            Connection::Single(c) => c.clone().req_packed_command(cmd).await,
            Connection::Cluster(c) => c.clone().req_packed_command(cmd).await,
        };
        reply.and_then(Value::extract_error)
    }

    /// Runs `script` on `keys` with `args`: `EVALSHA`, and `EVAL` with the source if the
    /// server does not know the script yet (first use, restart, failover). Returns the
    /// script's array of integers.
    pub(super) async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        header: &[String],
        args: &[u64],
    ) -> Result<Vec<i64>, StoreError> {
        let reply = self.eval_value(script, keys, header, args).await?;
        match reply {
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::Int(i) => Ok(i),
                    _ => Err(malformed()),
                })
                .collect(),
            _ => Err(malformed()),
        }
    }

    /// Runs `script` like [`Connection::eval`], answering its reply as it came.
    pub(super) async fn eval_value(
        &self,
        script: &Script,
        keys: &[String],
        header: &[String],
        args: &[u64],
    ) -> Result<Value, StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&script.sha)
            .arg(keys.len())
            .arg(keys)
            .arg(header)
            .arg(args);
        let reply = match self.send(&cmd).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(&script.source)
                    .arg(keys.len())
                    .arg(keys)
                    .arg(header)
                    .arg(args);
                self.send(&cmd).await
            }
            other => other,
        };
        reply.map_err(convert)
    }

    /// Sends one command and answers its reply.
    pub(super) async fn command(&self, cmd: &Cmd) -> Result<Value, StoreError> {
        self.send(cmd).await.map_err(convert)
    }

    /// Sends one command to the master serving `slot` (on a single server: to it).
    pub(super) async fn command_at(&self, cmd: Cmd, slot: u16) -> Result<Value, StoreError> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let reply = match self {
            Connection::Single(c) => c.clone().req_packed_command(&cmd).await,
            Connection::Cluster(c) => {
                let route = Route::new(slot, SlotAddr::Master);
                c.clone()
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await
            }
        };
        reply.and_then(Value::extract_error).map_err(convert)
    }

    /// Deletes `keys` (all in one slot).
    pub(super) async fn del(&self, keys: &[String]) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(keys);
        self.send(&cmd).await.map(drop).map_err(convert)
    }
}

/// Classifies a client error: the server or the network failing is transient, anything the
/// server rejected for what was asked is not.
pub(super) fn convert(e: RedisError) -> StoreError {
    if e.is_timeout() {
        return StoreError::Unavailable(format!("Redis timed out: {e}"));
    }
    let transient = match e.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound | ErrorKind::Parse => true,
        ErrorKind::Server(kind) => matches!(
            kind,
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
        ),
        _ => e.is_connection_dropped() || e.is_connection_refusal(),
    };
    if transient {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Backend(e.to_string())
    }
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag — the part between
/// the first `{` and the next `}`, if not empty — or of the whole key, modulo 16384.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        // Examples from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
    }
}
