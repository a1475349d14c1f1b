//! `flowgate serve`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flowgate::FailMode;
use tokio::net::TcpListener;

use crate::backend::SharedOptions;
use crate::config::{ConfigErrors, ListenAddr, gateway, websocket};
use crate::gateway::Upstream;
use crate::server::{self, Listeners, ServerConfig};
use crate::tls::{CertificateFiles, ListenerTls, ServerCertificate, TlsFileError, TlsListener};

/// What `flowgate serve --help` says after the flags: the settings that have no flag.
pub(super) const ENVIRONMENT_HELP: &str = "\
Environment (no flag):
  FLOWGATE_ADMIN_TOKEN  Enables the admin endpoints (/v1/keys: read and reset counters) on the
                        HTTP API, for requests with `Authorization: Bearer <token>`; without
                        it they do not exist. Its value is never logged.
  FLOWGATE_DASHBOARD    `off` (or false, 0, no) turns the dashboard off, like --no-dashboard.
  RUST_LOG              Which log lines are written (default `info`).

Addresses (--http, --grpc, --gateway, --websocket, and `listen` in the files) are IP:PORT or
HOST:PORT; a host name is resolved at start, and the first address it resolves to is used
(the others are logged).";

/// Flags of `flowgate serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A configuration file (envoyproxy/ratelimit YAML, one domain per file); repeat for more.
    /// Without any, a built-in default policy is enforced (domain `default`).
    #[arg(long = "config", value_name = "FILE", env = "FLOWGATE_CONFIG")]
    pub config: Vec<PathBuf>,
    /// Rules also from an xDS management server (envoyproxy/ratelimit's
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`): `xds://HOST:PORT`, or `xdss://HOST:PORT` for TLS. Its
    /// `RateLimitConfig` resources are applied like a reload, beside the --config files (a
    /// domain may come from one or the other); without --config, no built-in policy.
    #[arg(long, value_name = "URL", env = "FLOWGATE_CONFIG_SOURCE")]
    pub config_source: Option<crate::xds::XdsUrl>,
    /// The node id sent to the xDS management server, which chooses the resources by it.
    #[arg(
        long,
        value_name = "ID",
        default_value = "default",
        requires = "config_source",
        env = "FLOWGATE_XDS_NODE_ID"
    )]
    pub xds_node_id: String,
    /// Node metadata sent to the xDS management server, `KEY=VALUE` (repeated or
    /// comma-separated).
    #[arg(long, value_name = "KEY=VALUE", value_delimiter = ',', value_parser = crate::xds::parse_metadata_pair, requires = "config_source", env = "FLOWGATE_XDS_NODE_METADATA")]
    pub xds_node_metadata: Vec<(String, String)>,
    /// CA certificates (PEM) an `xdss://` management server is verified against, instead of
    /// the system's roots.
    #[arg(
        long,
        value_name = "FILE",
        requires = "config_source",
        env = "FLOWGATE_XDS_CA_FILE"
    )]
    pub xds_ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM) presented to an `xdss://` management server; with
    /// --xds-key-file.
    #[arg(
        long,
        value_name = "FILE",
        requires = "config_source",
        requires = "xds_key_file",
        env = "FLOWGATE_XDS_CERT_FILE"
    )]
    pub xds_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --xds-cert-file.
    #[arg(
        long,
        value_name = "FILE",
        requires = "xds_cert_file",
        env = "FLOWGATE_XDS_KEY_FILE"
    )]
    pub xds_key_file: Option<PathBuf>,
    /// The name the `xdss://` management server's certificate must carry (default: the URL's
    /// host).
    #[arg(
        long,
        value_name = "NAME",
        requires = "config_source",
        env = "FLOWGATE_XDS_SERVER_NAME"
    )]
    pub xds_server_name: Option<String>,
    /// How long connecting to the xDS management server (TCP, TLS, HTTP/2) and opening the
    /// stream may take.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration, requires = "config_source", env = "FLOWGATE_XDS_CONNECT_TIMEOUT")]
    pub xds_connect_timeout: Duration,
    /// The largest message accepted from the xDS management server, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = crate::xds::DEFAULT_MAX_MESSAGE_BYTES, requires = "config_source", env = "FLOWGATE_XDS_MAX_MESSAGE_BYTES")]
    pub xds_max_message_bytes: usize,
    /// The first wait before reconnecting to the xDS management server; it doubles (with
    /// jitter) up to --xds-backoff-max.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = humantime::parse_duration, requires = "config_source", env = "FLOWGATE_XDS_BACKOFF_INITIAL")]
    pub xds_backoff_initial: Duration,
    /// The longest wait before reconnecting to the xDS management server.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration, requires = "config_source", env = "FLOWGATE_XDS_BACKOFF_MAX")]
    pub xds_backoff_max: Duration,
    /// Address of the HTTP API (IP:PORT or HOST:PORT).
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:8080",
        env = "FLOWGATE_HTTP"
    )]
    pub http: ListenAddr,
    /// Address of the Envoy rate-limit gRPC API (IP:PORT or HOST:PORT).
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:8081",
        env = "FLOWGATE_GRPC"
    )]
    pub grpc: ListenAddr,
    /// Count in Redis, so that every instance given the same Redis enforces one limit, e.g.
    /// `redis://127.0.0.1:6379/0`. Several URLs (repeated or comma-separated) are the seed
    /// nodes of a Redis Cluster. Without it, counters live in this process's memory.
    /// (`--help` never shows `FLOWGATE_REDIS`'s value: it may hold a password.)
    #[arg(
        long,
        value_name = "URL",
        value_delimiter = ',',
        env = "FLOWGATE_REDIS",
        hide_env_values = true
    )]
    pub redis: Vec<String>,
    /// CA certificates (PEM) that `rediss://` servers are verified against, instead of the
    /// system's roots.
    #[arg(
        long,
        value_name = "FILE",
        requires = "redis",
        env = "FLOWGATE_REDIS_CA_FILE"
    )]
    pub redis_ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM) presented to `rediss://` servers that require one
    /// (`tls-auth-clients yes`); with --redis-key-file.
    #[arg(
        long,
        value_name = "FILE",
        requires = "redis",
        requires = "redis_key_file",
        env = "FLOWGATE_REDIS_CERT_FILE"
    )]
    pub redis_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --redis-cert-file.
    #[arg(
        long,
        value_name = "FILE",
        requires = "redis_cert_file",
        env = "FLOWGATE_REDIS_KEY_FILE"
    )]
    pub redis_key_file: Option<PathBuf>,
    /// Treat a single `--redis` URL as a Redis Cluster seed node.
    #[arg(long, requires = "redis", env = "FLOWGATE_REDIS_CLUSTER")]
    pub redis_cluster: bool,
    /// Prefix of every Redis key (instances sharing a limit must use the same one).
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "flowgate:",
        requires = "redis",
        env = "FLOWGATE_REDIS_PREFIX"
    )]
    pub redis_prefix: String,
    /// Longest a Redis call may take before the request falls back to its rule's `fail` mode.
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = humantime::parse_duration, requires = "redis", env = "FLOWGATE_REDIS_TIMEOUT")]
    pub redis_timeout: Duration,
    /// What rules without a `fail` field do while Redis is away: `open` (allow), `closed`
    /// (deny) or `local` (this instance's share of the limit, see `--instances`).
    #[arg(long, value_name = "MODE", default_value = "open", value_parser = parse_fail_mode, env = "FLOWGATE_FAIL")]
    pub fail: FailMode,
    /// How many instances share the Redis: with `fail: local`, each grants 1/N of a limit.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..), env = "FLOWGATE_INSTANCES")]
    pub instances: u64,
    /// Runs the rate-limiting reverse proxy in front of this upstream (`http://host:port`);
    /// requests are checked with the configuration's `gateway` section (docs/service.md).
    #[arg(long, value_name = "URL", env = "FLOWGATE_UPSTREAM")]
    pub upstream: Option<Upstream>,
    /// CA certificates (PEM) that an `https://` upstream is verified against, instead of the
    /// system's roots.
    #[arg(
        long,
        value_name = "FILE",
        requires = "upstream",
        env = "FLOWGATE_UPSTREAM_CA_FILE"
    )]
    pub upstream_ca_file: Option<PathBuf>,
    /// Address of the gateway (with --upstream); overrides `gateway.listen`
    /// [default: 127.0.0.1:8000].
    #[arg(
        long,
        value_name = "ADDR",
        requires = "upstream",
        env = "FLOWGATE_GATEWAY"
    )]
    pub gateway: Option<ListenAddr>,
    /// Strict readiness: `/readyz` answers 503 while the store (Redis) does not answer. Off by
    /// default: a Redis outage is what each rule's `fail` mode is for, and must not take every
    /// instance out of the load balancer at once.
    #[arg(long, env = "FLOWGATE_READY_REQUIRES_STORE")]
    pub ready_requires_store: bool,
    /// On SIGTERM or ctrl-c, how long to keep serving while `/readyz` answers 503, so that
    /// load balancers take the instance out before its listeners close (`0s`: none).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration, env = "FLOWGATE_DRAIN_PERIOD")]
    pub drain_period: Duration,
    /// After the drain period, how long requests, streams and WebSocket connections in flight
    /// may take before their connections are closed.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration, env = "FLOWGATE_GRACE_PERIOD")]
    pub grace_period: Duration,
    /// Address of the WebSocket gateway, served when a configuration file has a `websocket`
    /// section; overrides `websocket.listen` [default: 127.0.0.1:8001].
    #[arg(long, value_name = "ADDR", env = "FLOWGATE_WEBSOCKET")]
    pub websocket: Option<ListenAddr>,
    /// Most RLQS streams (Envoys) served at once; more are refused with `RESOURCE_EXHAUSTED`.
    #[arg(long, value_name = "N", default_value_t = crate::rlqs::DEFAULT_MAX_STREAMS, value_parser = clap::value_parser!(usize), env = "FLOWGATE_RLQS_MAX_STREAMS")]
    pub rlqs_max_streams: usize,
    /// Most buckets one RLQS stream may report; a stream reporting more is ended with
    /// `RESOURCE_EXHAUSTED`.
    #[arg(long, value_name = "N", default_value_t = crate::rlqs::DEFAULT_MAX_BUCKETS_PER_STREAM, value_parser = clap::value_parser!(usize), env = "FLOWGATE_RLQS_MAX_BUCKETS")]
    pub rlqs_max_buckets: usize,
    /// Serve TLS with this PEM certificate chain (the server's certificate first), on the
    /// listeners of --tls-listeners; with --tls-key. Reloaded when the file changes and on
    /// SIGHUP (a broken file keeps the running certificate).
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        env = "FLOWGATE_TLS_CERT"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_cert",
        env = "FLOWGATE_TLS_KEY"
    )]
    pub tls_key: Option<PathBuf>,
    /// Which listeners serve TLS with --tls-cert (comma-separated): http, grpc, gateway,
    /// websocket; the others stay plain.
    #[arg(
        long,
        value_name = "LISTENERS",
        value_enum,
        value_delimiter = ',',
        default_values = ["http", "grpc", "gateway", "websocket"],
        env = "FLOWGATE_TLS_LISTENERS"
    )]
    pub tls_listeners: Vec<TlsListener>,
    /// Connections each client-facing listener (the HTTP and gRPC APIs, the gateway, the
    /// WebSocket gateway) holds open at once; more are closed as soon as accepted, and counted.
    #[arg(long, value_name = "N", default_value_t = crate::listen::DEFAULT_MAX_CONNECTIONS, env = "FLOWGATE_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// How long a client may take: on every listener, to send its first bytes (and to finish
    /// the TLS handshake); on the HTTP listeners — the HTTP API, the gateway and the WebSocket
    /// gateway — to send each request head, on a new connection and between requests (so also
    /// how long an idle keep-alive connection is kept).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration, env = "FLOWGATE_HEADER_READ_TIMEOUT")]
    pub header_read_timeout: Duration,
    /// The largest request head (request line and header fields) the HTTP listeners — the HTTP
    /// API, the gateway and the WebSocket gateway — read, in bytes; a larger one is answered
    /// 431.
    #[arg(long, value_name = "BYTES", default_value_t = crate::listen::DEFAULT_MAX_HEADER_BYTES, env = "FLOWGATE_MAX_HEADER_BYTES")]
    pub max_header_bytes: usize,
    /// The largest request body `/json` and `/v1/check` read, in bytes; a larger one is
    /// answered 413 (problem+json).
    #[arg(long, value_name = "BYTES", default_value_t = crate::api::DEFAULT_MAX_BODY_BYTES, env = "FLOWGATE_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,
    /// Log every gateway request at `info` under the target `flowgate::access` (peer, method,
    /// path without the query, status, time to the response head).
    #[arg(long, env = "FLOWGATE_ACCESS_LOG")]
    pub access_log: bool,
    /// Global shadow mode (envoyproxy/ratelimit's `SHADOW_MODE`): every request decided by the
    /// configuration's rules (gRPC, `/json`, `/v1/check`, the gateway) is allowed; limits are
    /// counted, and reported over limit per descriptor, as usual.
    #[arg(long, env = "FLOWGATE_SHADOW_MODE")]
    pub shadow_mode: bool,
    /// Global quota mode (envoyproxy/ratelimit's `QUOTA_MODE`): every limit in quota mode — a
    /// request is denied only when all of its limits deny.
    #[arg(long, env = "FLOWGATE_QUOTA_MODE")]
    pub quota_mode: bool,
    /// Fill the RLS response's `dynamic_metadata` (envoyproxy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA`): domain, descriptors, hits and the matched rules'
    /// `metadata` (docs/service.md).
    #[arg(long, env = "FLOWGATE_RESPONSE_DYNAMIC_METADATA")]
    pub response_dynamic_metadata: bool,
    /// Do not serve the live dashboard (`/dashboard`); also `FLOWGATE_NO_DASHBOARD=1` or
    /// `FLOWGATE_DASHBOARD=off`.
    #[arg(long, env = "FLOWGATE_NO_DASHBOARD")]
    pub no_dashboard: bool,
    /// Benchmark baseline: parse every request and answer in the same shape without deciding
    /// anything (see docs/service.md, "Benchmarks").
    #[arg(long, hide = true, env = "FLOWGATE_NOOP")]
    pub noop: bool,
    /// How log lines are written to stderr: `text` for people, `json` (one object per line)
    /// for log collectors.
    #[arg(
        long,
        value_name = "FORMAT",
        value_enum,
        default_value = "text",
        env = "FLOWGATE_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
}

/// The format of `flowgate serve`'s log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`).
    Json,
}

/// Whether `FLOWGATE_DASHBOARD` leaves the dashboard on: anything but `off`, `false`, `0`
/// or `no` (any case), or unset.
fn dashboard_env_allows() -> bool {
    std::env::var("FLOWGATE_DASHBOARD").map_or(true, |v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "off" | "false" | "0" | "no"
        )
    })
}

/// Why `flowgate serve` could not start, or stopped with an error. Each says what it is about;
/// it is printed once, by the caller.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A configuration file is invalid (every problem, with file, line, column and field).
    #[error("invalid configuration:\n{0}")]
    Config(#[from] ConfigErrors),
    /// The TLS certificate or key of `--tls-cert` cannot be used.
    #[error("TLS certificate: {0}")]
    Certificate(#[from] TlsFileError),
    /// A file of the Redis TLS flags cannot be used.
    #[error("{0}")]
    RedisTls(String),
    /// The xDS flags do not fit together, or a TLS file of theirs cannot be used.
    #[error("{0}")]
    Xds(String),
    /// `--upstream` and its CA file, or the gateway's configuration, do not fit together.
    #[error("{0}")]
    Gateway(String),
    /// `--websocket` was given but no file has a `websocket` section.
    #[error("--websocket needs a `websocket` section in a configuration file")]
    WebSocketWithoutSection,
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// Redis cannot be reached (the URL shown without its password).
    #[error("{0}")]
    Redis(String),
    /// A listener cannot be bound.
    #[error("cannot listen on {addr}: {error}")]
    Listen {
        /// The address (and the name it came from).
        addr: String,
        /// Why.
        error: std::io::Error,
    },
    /// `FLOWGATE_ADMIN_TOKEN` is set but cannot be used (its value is never shown).
    #[error("{0}")]
    AdminToken(#[from] crate::api::AdminTokenError),
    /// A server failed while serving.
    #[error("server failed: {0}")]
    Server(std::io::Error),
}

/// Runs `flowgate serve` until it is stopped (`Ok`) or fails.
pub(super) fn run(args: ServeArgs) -> Result<(), ServeError> {
    let mut config = match &args.config_source {
        None => ServerConfig::load(args.config)?,
        Some(url) => {
            let tls = crate::xds::XdsTlsFiles {
                ca_file: args.xds_ca_file.clone(),
                client: args
                    .xds_cert_file
                    .clone()
                    .zip(args.xds_key_file.clone())
                    .map(|(chain, key)| CertificateFiles { chain, key }),
                server_name: args.xds_server_name.clone(),
            };
            let mut xds = crate::xds::XdsOptions::new(url.clone(), args.xds_node_id.clone(), tls)
                .map_err(ServeError::Xds)?;
            xds.node_metadata = args.xds_node_metadata.clone();
            xds.connect_timeout = args.xds_connect_timeout;
            xds.max_message_bytes = args.xds_max_message_bytes;
            xds.backoff_initial = args.xds_backoff_initial;
            xds.backoff_max = args.xds_backoff_max;
            ServerConfig::load_with_xds(args.config, xds)?
        }
    };
    config.noop = args.noop;
    config.ready_requires_store = args.ready_requires_store;
    config.drain_period = args.drain_period;
    config.grace_period = args.grace_period;
    config.max_body_bytes = args.max_body_bytes;
    config.access_log = args.access_log;
    config.rls = crate::api::RlsSettings {
        modes: flowgate::envoy::Modes::new(args.shadow_mode, args.quota_mode),
        dynamic_metadata: args.response_dynamic_metadata,
    };
    config.listen = crate::listen::ListenLimits {
        max_connections: args.max_connections,
        header_read_timeout: args.header_read_timeout,
        max_header_bytes: args.max_header_bytes,
    };
    config.dashboard = !args.no_dashboard && dashboard_env_allows();
    // The admin endpoints exist only with a token; its value is never logged.
    config.admin_token = crate::api::AdminToken::from_env()?;
    if let (Some(chain), Some(key)) = (args.tls_cert, args.tls_key) {
        config.tls = Some(ListenerTls {
            certificate: ServerCertificate::load(CertificateFiles { chain, key })?,
            listeners: args.tls_listeners.clone(),
        });
    }
    let redis_tls = RedisTls::read(
        args.redis_ca_file.as_deref(),
        args.redis_cert_file
            .as_deref()
            .zip(args.redis_key_file.as_deref()),
    )
    .map_err(ServeError::RedisTls)?;
    let upstream = match (args.upstream, &args.upstream_ca_file) {
        (Some(upstream), Some(ca)) => Some(upstream.with_ca_file(ca).map_err(ServeError::Gateway)?),
        (upstream, _) => upstream,
    };
    let shared = SharedOptions {
        fail: args.fail,
        instances: args.instances,
    };
    config.rlqs = crate::rlqs::RlqsOptions {
        max_streams: args.rlqs_max_streams,
        max_buckets_per_stream: args.rlqs_max_buckets,
        fail: args.fail,
        instances: args.instances,
        ..crate::rlqs::RlqsOptions::default()
    };
    let gateway_addr = match &upstream {
        None => None,
        Some(upstream) => {
            crate::gateway::effective_config(&config.policy).map_err(ServeError::Gateway)?;
            config.upstream = Some(upstream.clone());
            Some(
                args.gateway
                    .or_else(|| {
                        config
                            .policy
                            .gateway
                            .as_ref()
                            .and_then(|g| g.listen.clone())
                    })
                    .unwrap_or_else(|| gateway::DEFAULT_LISTEN.into()),
            )
        }
    };
    let websocket_addr = match (&config.policy.websocket, args.websocket) {
        (None, None) => None,
        (None, Some(_)) => return Err(ServeError::WebSocketWithoutSection),
        (Some(section), flag) => Some(
            flag.or_else(|| section.listen.clone())
                .unwrap_or_else(|| websocket::DEFAULT_LISTEN.into()),
        ),
    };
    let (runtime, scheduler) = super::runtime().map_err(ServeError::Runtime)?;
    runtime.block_on(async move {
        if !args.redis.is_empty() {
            let redis = RedisArgs {
                urls: args.redis,
                cluster: args.redis_cluster,
                prefix: args.redis_prefix,
                timeout: args.redis_timeout,
                tls: redis_tls,
            };
            config.backend = connect_redis(redis, shared)
                .await
                .map_err(ServeError::Redis)?;
        }
        let http = bind(&args.http).await?;
        let grpc = bind(&args.grpc).await?;
        let gateway = match &gateway_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let websocket = match &websocket_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        if let Some(tls) = &config.tls {
            tracing::info!(listeners = ?tls.listeners, "serving TLS");
        }
        if config.rls.modes.shadow_mode {
            tracing::warn!("global shadow mode (--shadow-mode): every request is allowed");
        }
        if config.rls.modes.quota_mode || config.rls.dynamic_metadata {
            tracing::info!(
                quota_mode = config.rls.modes.quota_mode,
                response_dynamic_metadata = config.rls.dynamic_metadata,
                "rate-limit API modes"
            );
        }
        if let (Some(listener), Some(addr), Some(upstream)) = (&gateway, &gateway_addr, &upstream) {
            tracing::info!(gateway = %bound(listener, addr), %upstream, "gateway proxying");
        }
        if let (Some(listener), Some(addr)) = (&websocket, &websocket_addr) {
            tracing::info!(websocket = %bound(listener, addr), "websocket gateway relaying");
        }
        // Signals are handled from here on (a SIGTERM or SIGHUP after the line below never
        // kills the process by its default action).
        let shutdown = server::shutdown_signal();
        // Last, once every listener is bound; the addresses bound (`--http 127.0.0.1:0`: the
        // port the system chose), which tests read.
        tracing::info!(
            http = %bound(&http, &args.http),
            grpc = %bound(&grpc, &args.grpc),
            rules = config.policy.rules.rules().len(),
            store = config.backend.kind(),
            dashboard = config.dashboard,
            admin = config.admin_token.is_some(),
            scheduler,
            "flowgate serving"
        );
        let listeners = Listeners {
            http: Some(http),
            grpc: Some(grpc),
            gateway,
            websocket,
        };
        server::run(config, listeners, shutdown)
            .await
            .map_err(ServeError::Server)?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Binds `addr`; when it is a host name with several addresses, says which one is used.
async fn bind(addr: &ListenAddr) -> Result<TcpListener, ServeError> {
    if !addr.others().is_empty() {
        tracing::info!(
            name = addr.written(),
            listening = %addr.addr(),
            ignored = ?addr.others(),
            "a host name with several addresses: listening on the first"
        );
    }
    TcpListener::bind(addr.addr())
        .await
        .map_err(|error| ServeError::Listen {
            addr: addr.to_string(),
            error,
        })
}

/// The address `listener` is bound to (port 0 resolved), else as given.
fn bound(listener: &TcpListener, addr: &ListenAddr) -> SocketAddr {
    listener.local_addr().unwrap_or(addr.addr())
}

fn parse_fail_mode(s: &str) -> Result<FailMode, String> {
    s.parse()
}

/// Where and how to reach Redis.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
struct RedisArgs {
    urls: Vec<String>,
    cluster: bool,
    prefix: String,
    timeout: Duration,
    tls: RedisTls,
}

/// The PEM files for TLS to Redis, read at start (`rediss://` URLs).
#[derive(Default)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
struct RedisTls {
    /// `--redis-ca-file`.
    roots: Option<Vec<u8>>,
    /// `--redis-cert-file` and `--redis-key-file`.
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl RedisTls {
    /// Reads the files (errors name the file, never its contents).
    fn read(ca: Option<&Path>, client: Option<(&Path, &Path)>) -> Result<Self, String> {
        let read = |what: &str, path: &Path| {
            std::fs::read(path)
                .map_err(|e| format!("cannot read the Redis {what} {}: {e}", path.display()))
        };
        let roots = match ca {
            Some(path) => {
                let pem = read("CA file", path)?;
                crate::tls::certificates_from(path, &pem)
                    .map_err(|e| format!("Redis CA file {e}"))?;
                Some(pem)
            }
            None => None,
        };
        let client = match client {
            Some((cert, key)) => Some((read("certificate", cert)?, read("key", key)?)),
            None => None,
        };
        Ok(RedisTls { roots, client })
    }
}

#[cfg(feature = "redis")]
async fn connect_redis(
    redis: RedisArgs,
    shared: SharedOptions,
) -> Result<crate::backend::Backend, String> {
    use flowgate::store::RedisStore;
    // Logs and errors show the URLs without their passwords.
    let what = redis
        .urls
        .iter()
        .map(|url| crate::backend::redact_url(url))
        .collect::<Vec<_>>()
        .join(",");
    let redis_urls = redis.urls.clone();
    let builder = match <[String; 1]>::try_from(redis.urls) {
        Ok([url]) if !redis.cluster => RedisStore::builder(url),
        Ok(urls) => RedisStore::cluster_builder(urls),
        Err(urls) => RedisStore::cluster_builder(urls),
    };
    let builder = match redis.tls.roots {
        Some(roots) => builder.tls_roots(roots),
        None => builder,
    };
    let builder = match redis.tls.client {
        Some((chain, key)) => builder.tls_client_certificate(chain, key),
        None => builder,
    };
    let store = builder
        .prefix(redis.prefix)
        .timeout(redis.timeout)
        .connect()
        .await
        .map_err(|e| {
            let error = crate::backend::redact_redis_text(&e.to_string(), &redis_urls);
            format!("cannot connect to Redis at {what}: {error}")
        })?;
    tracing::info!(redis = %what, fail = ?shared.fail, instances = shared.instances, "counting in Redis");
    let ledger = std::sync::Arc::new(store.quota_ledger());
    let leases = std::sync::Arc::new(store.leases());
    let store = std::sync::Arc::new(store);
    Ok(crate::backend::Backend::shared(store.clone(), shared)
        .with_quota_ledger(ledger)
        .with_shared_leases(leases)
        .with_lister(store))
}

#[cfg(not(feature = "redis"))]
async fn connect_redis(
    _redis: RedisArgs,
    _shared: SharedOptions,
) -> Result<crate::backend::Backend, String> {
    Err("--redis needs flowgate built with the `redis` feature (on by default)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_serve_flag_can_come_from_its_environment_variable() {
        use clap::CommandFactory;
        #[derive(Debug, clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let command = Wrapper::command();
        let mut flags = 0;
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" {
                continue;
            }
            let expected = format!("FLOWGATE_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(expected.as_str()),
                "--{long}"
            );
            flags += 1;
        }
        assert!(flags >= 20, "{flags} flags");
    }
}
