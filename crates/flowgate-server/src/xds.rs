//! Rules from an xDS management server, as envoyproxy/ratelimit takes them
//! (`CONFIG_TYPE=GRPC_XDS_SOTW`, `src/provider/xds_grpc_sotw_provider.go`): one ADS stream
//! (`envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources`, state of
//! the world) subscribed to `RateLimitConfig` resources ([`crate::config::xds`]).
//!
//! Each version is applied like a reload ([`Service::apply_xds`]): a valid one is installed and
//! ACKed (the next request carries its `version_info` and the response's nonce); an invalid one
//! is NACKed (`error_detail` with the errors, `version_info` the last version applied) and the
//! running rules stay. While the server is away the last good rules keep being enforced; the
//! client reconnects with a bounded, jittered exponential backoff. Every phase is bounded:
//! connecting (TCP, TLS and HTTP/2) and opening the stream by the connect timeout, a silent
//! connection by HTTP/2 keep-alive pings, each message by its size.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::api::Service;
use crate::config::xds::proto::TYPE_URL;
use crate::tls::{CertificateFiles, MaybeTls, TlsFileError};

/// The default `--xds-connect-timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default `--xds-max-message-bytes` (gRPC's usual 4 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;
/// The default `--xds-backoff-initial`.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(500);
/// The default `--xds-backoff-max`.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The longest `error_detail` message a NACK carries (the log has every error).
const MAX_NACK_MESSAGE: usize = 16 << 10;
/// HTTP/2 keep-alive: a ping this often, and the connection is dropped when one goes
/// unanswered for [`KEEP_ALIVE_TIMEOUT`] (the stream may rightly be silent for hours).
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// See [`KEEP_ALIVE_INTERVAL`].
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The management server's address: `xds://HOST:PORT` (plain HTTP/2) or `xdss://HOST:PORT`
/// (TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsUrl {
    /// Whether to speak TLS (`xdss://`).
    pub tls: bool,
    /// The host name or IP address (IPv6 without brackets).
    pub host: String,
    /// The port.
    pub port: u16,
}

impl FromStr for XdsUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (tls, rest) = if let Some(rest) = s.strip_prefix("xdss://") {
            (true, rest)
        } else if let Some(rest) = s.strip_prefix("xds://") {
            (false, rest)
        } else {
            return Err(format!(
                "`{s}` is not an xDS management server: write xds://HOST:PORT (or xdss://HOST:PORT for TLS)"
            ));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("`{s}` has no port: write xds://HOST:PORT"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = port
            .parse()
            .map_err(|_| format!("`{s}`: `{port}` is not a port"))?;
        if host.is_empty() || host.contains(['/', '@', '?', '#']) {
            return Err(format!("`{s}`: write xds://HOST:PORT"));
        }
        Ok(XdsUrl {
            tls,
            host: host.to_owned(),
            port,
        })
    }
}

impl fmt::Display for XdsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "xdss" } else { "xds" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// TLS to the management server (`xdss://`).
#[derive(Debug, Clone, Default)]
pub struct XdsTlsFiles {
    /// CA certificates (PEM) the server is verified against; the system's when `None`.
    pub ca_file: Option<PathBuf>,
    /// The client certificate and key presented, when the server asks for one.
    pub client: Option<CertificateFiles>,
    /// The name the server's certificate must carry (SAN); the URL's host when `None`.
    pub server_name: Option<String>,
}

/// How to reach the management server and who to say this is.
#[derive(Clone)]
pub struct XdsOptions {
    /// The server.
    pub url: XdsUrl,
    /// The TLS client configuration (with `xdss://`), built at start.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The name the server's certificate is verified for.
    pub server_name: String,
    /// The node's `id`: the management server picks the resources by it.
    pub node_id: String,
    /// The node's `metadata`, as text values.
    pub node_metadata: Vec<(String, String)>,
    /// How long connecting (TCP, TLS, HTTP/2) and opening the stream may take.
    pub connect_timeout: Duration,
    /// The largest response accepted (a larger one ends the stream, which is retried).
    pub max_message_bytes: usize,
    /// The first wait before reconnecting.
    pub backoff_initial: Duration,
    /// The longest wait before reconnecting.
    pub backoff_max: Duration,
}

impl fmt::Debug for XdsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdsOptions")
            .field("url", &self.url)
            .field("tls", &self.tls.is_some())
            .field("server_name", &self.server_name)
            .field("node_id", &self.node_id)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl XdsOptions {
    /// Options for `url` with node `node_id` and the defaults; `tls` files are read now (errors
    /// name the file, never its contents), and only allowed with `xdss://`.
    pub fn new(url: XdsUrl, node_id: String, tls: XdsTlsFiles) -> Result<Self, String> {
        let has_files = tls.ca_file.is_some() || tls.client.is_some() || tls.server_name.is_some();
        if has_files && !url.tls {
            return Err(format!(
                "--xds-ca-file, --xds-cert-file and --xds-server-name are for TLS: write xdss:// instead of {url}"
            ));
        }
        let config = if url.tls {
            Some(
                crate::tls::grpc_client_config(tls.ca_file.as_deref(), tls.client.as_ref())
                    .map_err(|e: TlsFileError| format!("xDS TLS: {e}"))?,
            )
        } else {
            None
        };
        Ok(XdsOptions {
            server_name: tls.server_name.unwrap_or_else(|| url.host.clone()),
            url,
            tls: config,
            node_id,
            node_metadata: Vec::new(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
        })
    }

    /// The node sent in the first request of each stream.
    fn node(&self) -> Node {
        let fields = self
            .node_metadata
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Value {
                        kind: Some(Kind::StringValue(v.clone())),
                    },
                )
            })
            .collect();
        Node {
            id: self.node_id.clone(),
            metadata: (!self.node_metadata.is_empty()).then_some(Struct { fields }),
            user_agent_name: "flowgate".to_owned(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").to_owned(),
            )),
            ..Node::default()
        }
    }
}

/// Parses `--xds-node-metadata`'s `KEY=VALUE`.
pub fn parse_metadata_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("`{s}` is not KEY=VALUE")),
    }
}

/// Bounded exponential backoff with jitter: the n-th wait is uniformly random in
/// `[d/2, d]`, `d = min(max, initial × 2ⁿ)`.
#[derive(Debug)]
struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
    /// Random keys (the standard library's, per process): the jitter's source.
    random: RandomState,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            attempt: 0,
            random: RandomState::new(),
        }
    }

    fn next(&mut self) -> Duration {
        let d = self
            .initial
            .saturating_mul(1 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let unit = (self.random.hash_one(self.attempt) >> 11) as f64 / (1u64 << 53) as f64;
        d / 2 + d.mul_f64(unit / 2.0)
    }

    fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// Follows the management server until `shutdown` completes, applying each version to
/// `service`; reconnects (with backoff) whenever the stream ends or cannot be opened.
pub async fn run(
    options: XdsOptions,
    service: Arc<Service>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    let mut backoff = Backoff::new(options.backoff_initial, options.backoff_max);
    // The last version applied: sent again on a new stream, so a restarted server knows.
    let mut applied = String::new();
    tracing::info!(server = %options.url, node = %options.node_id, "following the xDS management server");
    loop {
        let ended = tokio::select! {
            () = &mut shutdown => return Ok(()),
            ended = follow(&options, &service, &mut applied, &mut backoff) => ended,
        };
        let wait = backoff.next();
        tracing::warn!(
            server = %options.url,
            retry_in = ?wait,
            "xDS management server: {ended}; the running rules stay"
        );
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One stream: connects, subscribes and applies responses until the stream ends; says why.
async fn follow(
    options: &XdsOptions,
    service: &Arc<Service>,
    applied: &mut String,
    backoff: &mut Backoff,
) -> String {
    let channel = match tokio::time::timeout(options.connect_timeout, connect(options)).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => return format!("cannot connect: {}", error_chain(&e)),
        Err(_) => {
            return format!(
                "cannot connect: no connection within {}",
                humantime::format_duration(options.connect_timeout)
            );
        }
    };
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(options.max_message_bytes);
    let (requests, outgoing) = mpsc::channel::<DiscoveryRequest>(4);
    let outgoing = futures_util::stream::unfold(outgoing, |mut rx| async move {
        rx.recv().await.map(|request| (request, rx))
    });
    let first = DiscoveryRequest {
        version_info: applied.clone(),
        node: Some(options.node()),
        type_url: TYPE_URL.to_owned(),
        ..DiscoveryRequest::default()
    };
    if requests.send(first).await.is_err() {
        return "the request stream closed".to_owned();
    }
    let opened = tokio::time::timeout(
        options.connect_timeout,
        client.stream_aggregated_resources(outgoing),
    )
    .await;
    let mut responses = match opened {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => return format!("the stream was refused: {status}"),
        Err(_) => return "the stream did not open within the connect timeout".to_owned(),
    };
    tracing::info!(server = %options.url, "xDS stream open");
    loop {
        let response = match responses.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return "the server ended the stream".to_owned(),
            Err(status) => return format!("the stream failed: {status}"),
        };
        backoff.reset();
        let Some(reply) = answer(service, applied, response).await else {
            continue;
        };
        if requests.send(reply).await.is_err() {
            return "the request stream closed".to_owned();
        }
    }
}

/// Applies `response` and returns the ACK or NACK to send (`None` for a type not asked for).
async fn answer(
    service: &Arc<Service>,
    applied: &mut String,
    response: DiscoveryResponse,
) -> Option<DiscoveryRequest> {
    if response.type_url != TYPE_URL {
        tracing::warn!(
            type_url = response.type_url,
            "xDS response of a type not subscribed to; ignored"
        );
        return None;
    }
    let DiscoveryResponse {
        version_info,
        resources,
        nonce,
        ..
    } = response;
    let applying = service.clone();
    let version = version_info.clone();
    // Building a policy may read key files: off the async threads.
    let outcome =
        tokio::task::spawn_blocking(move || applying.apply_xds(&version, &resources)).await;
    let error_detail = match outcome {
        Ok(Ok(_)) => {
            applied.clone_from(&version_info);
            None
        }
        Ok(Err(errors)) => Some(Status {
            code: tonic::Code::InvalidArgument as i32,
            message: bounded(errors.to_string(), MAX_NACK_MESSAGE),
            details: Vec::new(),
        }),
        Err(e) => Some(Status {
            code: tonic::Code::Internal as i32,
            message: format!("applying the version failed: {e}"),
            details: Vec::new(),
        }),
    };
    Some(DiscoveryRequest {
        version_info: applied.clone(),
        type_url: TYPE_URL.to_owned(),
        response_nonce: nonce,
        error_detail,
        ..DiscoveryRequest::default()
    })
}

/// `text` cut to at most `max` bytes (at a character boundary).
fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// `e` and its sources, `: `-separated.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

/// An HTTP/2 channel to the server (TLS with `xdss://`).
async fn connect(
    options: &XdsOptions,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let scheme = if options.url.tls { "https" } else { "http" };
    let uri = format!("{scheme}://{}", AuthorityOf(&options.url));
    let endpoint = tonic::transport::Endpoint::from_shared(uri)?
        .connect_timeout(options.connect_timeout)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    endpoint
        .connect_with_connector(Connector {
            host: options.url.host.clone(),
            port: options.url.port,
            tls: options.tls.clone(),
            server_name: options.server_name.clone(),
        })
        .await
}

/// `host:port` of a URL, IPv6 in brackets.
struct AuthorityOf<'a>(&'a XdsUrl);

impl fmt::Display for AuthorityOf<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.host.contains(':') {
            write!(f, "[{}]:{}", self.0.host, self.0.port)
        } else {
            write!(f, "{}:{}", self.0.host, self.0.port)
        }
    }
}

/// The connection under the channel: TCP, then TLS when configured.
#[derive(Clone)]
struct Connector {
    host: String,
    port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
    server_name: String,
}

/// A connection to the management server.
type Connection = TokioIo<MaybeTls<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = Connection;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Connection>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect((this.host.as_str(), this.port)).await?;
            tcp.set_nodelay(true)?;
            let Some(config) = this.tls else {
                return Ok(TokioIo::new(MaybeTls::Plain(tcp)));
            };
            let name =
                rustls::pki_types::ServerName::try_from(this.server_name.clone()).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("`{}` is not a server name: {e}", this.server_name),
                    )
                })?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(MaybeTls::Tls(Box::new(tls))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_host_and_port_and_say_whether_tls() {
        let plain: XdsUrl = "xds://127.0.0.1:18000".parse().unwrap();
        assert_eq!(
            plain,
            XdsUrl {
                tls: false,
                host: "127.0.0.1".into(),
                port: 18000
            }
        );
        let tls: XdsUrl = "xdss://[::1]:443".parse().unwrap();
        assert!(tls.tls);
        assert_eq!(tls.host, "::1");
        assert_eq!(tls.to_string(), "xdss://[::1]:443");
        for bad in [
            "http://a:1",
            "xds://a",
            "xds://a:port",
            "xds://:1",
            "xds://u@a:1",
        ] {
            assert!(bad.parse::<XdsUrl>().is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_to_its_bound_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        let waits: Vec<Duration> = (0..10).map(|_| b.next()).collect();
        for (n, wait) in waits.iter().enumerate() {
            let d = Duration::from_millis(500)
                .saturating_mul(1 << n)
                .min(Duration::from_secs(30));
            assert!(*wait >= d / 2 && *wait <= d, "{n}: {wait:?} for {d:?}");
        }
        b.reset();
        assert!(b.next() <= Duration::from_millis(500));
    }

    #[test]
    fn a_nack_message_is_bounded_at_a_character() {
        assert_eq!(bounded("ééé".to_owned(), 3), "é");
        assert_eq!(bounded("abc".to_owned(), 10), "abc");
    }
}
