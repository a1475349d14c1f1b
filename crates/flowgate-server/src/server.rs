//! The server: `run(config, listeners, shutdown)` serves the HTTP and gRPC APIs (and, with an
//! upstream, the gateway; with a `websocket` section, the WebSocket gateway) until `shutdown` completes, then stops accepting and finishes
//! in-flight calls.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, AdminToken, Service};
use crate::backend::Backend;
use crate::config::{self, ConfigErrors, Policy, reload};
use crate::dashboard::{self, Dashboard};
use crate::gateway::ws::{self as ws_gateway, WsGateway};
use crate::gateway::{self, Gateway, Upstream};
use crate::listen::{Acceptor, ListenLimits};
use crate::tls::{ListenerTls, TlsListener};

/// What the server enforces and where it keeps its counters.
pub struct ServerConfig {
    /// The configuration files (one domain each); empty for the built-in policy.
    pub files: Vec<PathBuf>,
    /// The validated policy loaded from `files`.
    pub policy: Policy,
    /// Where counters live.
    pub backend: Backend,
    /// Whether to watch `files` and reload on change and SIGHUP.
    pub watch: bool,
    /// Benchmark baseline: answer without deciding (see `docs/service.md`).
    pub noop: bool,
    /// Where the gateway forwards allowed requests; required with a gateway listener.
    pub upstream: Option<Upstream>,
    /// Strict readiness: `/readyz` fails while the store does not answer (default off).
    pub ready_requires_store: bool,
    /// After the shutdown signal, how long everything is still served while `/readyz` answers
    /// 503, so that load balancers stop sending before the listeners close (0 here;
    /// `flowgate serve` defaults to [`DEFAULT_DRAIN_PERIOD`]).
    pub drain_period: Duration,
    /// Once the listeners stop accepting, how long requests, streams and WebSocket
    /// connections in flight may take before their connections are closed.
    pub grace_period: Duration,
    /// The connection cap of every client-facing listener (HTTP and gRPC APIs, gateway,
    /// WebSocket gateway), and the gateways' header limits.
    pub listen: ListenLimits,
    /// The largest request body the HTTP API reads (`413` beyond).
    pub max_body_bytes: usize,
    /// Log every gateway request (`--access-log`).
    pub access_log: bool,
    /// Serve the live dashboard at `/dashboard` (default on; `--no-dashboard`).
    pub dashboard: bool,
    /// The admin endpoints' token (`FLOWGATE_ADMIN_TOKEN`); `None` disables them.
    pub admin_token: Option<AdminToken>,
    /// TLS on the listeners (`--tls-cert`, `--tls-key`, `--tls-listeners`); the certificate
    /// is reloaded when its files change and on SIGHUP (with [`ServerConfig::watch`]).
    pub tls: Option<ListenerTls>,
    /// The RLQS service on the gRPC listener (`--rlqs-*`).
    pub rlqs: crate::rlqs::RlqsOptions,
    /// The rate-limit APIs' global modes (`--shadow-mode`, `--quota-mode`,
    /// `--response-dynamic-metadata`).
    pub rls: api::RlsSettings,
    /// Rules also from this xDS management server (`--config-source xds://…`).
    pub xds: Option<crate::xds::XdsOptions>,
}

/// `flowgate serve`'s default [`ServerConfig::drain_period`]: a few probe periods of a
/// typical load balancer.
pub const DEFAULT_DRAIN_PERIOD: Duration = Duration::from_secs(5);

/// The default [`ServerConfig::grace_period`].
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("files", &self.files)
            .field("backend", &self.backend)
            .field("watch", &self.watch)
            .field("noop", &self.noop)
            .field("upstream", &self.upstream)
            .field("drain_period", &self.drain_period)
            .field("grace_period", &self.grace_period)
            .field("listen", &self.listen)
            .field("dashboard", &self.dashboard)
            .field("admin", &self.admin_token.is_some())
            .field("tls", &self.tls.as_ref().map(|tls| &tls.listeners))
            .field("xds", &self.xds)
            .finish_non_exhaustive()
    }
}

impl ServerConfig {
    /// Loads `files` (the built-in policy when empty) with the in-memory store, watching the
    /// files for changes.
    pub fn load(files: Vec<PathBuf>) -> Result<Self, ConfigErrors> {
        let policy = config::load(&files)?;
        Ok(Self::with_policy(files, policy))
    }

    /// Loads `files` (no rules when empty: they come from xDS) and follows the xDS management
    /// server of `xds`, with the in-memory store, watching the files for changes.
    pub fn load_with_xds(
        files: Vec<PathBuf>,
        xds: crate::xds::XdsOptions,
    ) -> Result<Self, ConfigErrors> {
        let policy = config::load_beside_xds(&files)?;
        let mut config = Self::with_policy(files, policy);
        config.xds = Some(xds);
        Ok(config)
    }

    /// Serves `policy`, loaded from `files`.
    fn with_policy(files: Vec<PathBuf>, policy: Policy) -> Self {
        ServerConfig {
            files,
            policy,
            backend: Backend::default(),
            watch: true,
            noop: false,
            upstream: None,
            ready_requires_store: false,
            drain_period: Duration::ZERO,
            grace_period: DEFAULT_GRACE_PERIOD,
            listen: ListenLimits::default(),
            max_body_bytes: api::DEFAULT_MAX_BODY_BYTES,
            access_log: false,
            dashboard: true,
            admin_token: None,
            tls: None,
            rlqs: crate::rlqs::RlqsOptions::default(),
            rls: api::RlsSettings::default(),
            xds: None,
        }
    }
}

/// The sockets to serve on; any may be absent.
#[derive(Debug, Default)]
pub struct Listeners {
    /// The HTTP API.
    pub http: Option<TcpListener>,
    /// The gRPC API.
    pub grpc: Option<TcpListener>,
    /// The gateway (reverse proxy); needs [`ServerConfig::upstream`].
    pub gateway: Option<TcpListener>,
    /// The WebSocket gateway; relays to the running configuration's `websocket` section's
    /// upstream (upgrades are answered 503 while the configuration has none).
    pub websocket: Option<TcpListener>,
}

/// Serves until `shutdown` completes, then drains and returns:
///
/// 1. `/readyz` answers 503 (`"draining": true`) while everything is still served, for
///    [`ServerConfig::drain_period`];
/// 2. every listener stops accepting; requests, response streams and WebSocket connections in
///    flight get up to [`ServerConfig::grace_period`] to finish (WebSocket relays are closed
///    with 1001 at once), then their connections are closed.
///
/// A server that fails ends the others at once (no drain period).
///
/// Fails at once (`InvalidInput`) when a gateway listener is given without an upstream, or
/// when the policy does not say which domain the gateway checks (several files and no
/// `gateway` section).
pub async fn run(
    config: ServerConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let gateway_setup = match (&listeners.gateway, config.upstream) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the gateway needs an upstream (--upstream URL)",
            ));
        }
        (Some(_), Some(upstream)) => Some((
            upstream,
            gateway::effective_config(&config.policy)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
        )),
    };
    let noop = config.noop;
    let (drain_period, grace_period) = (config.drain_period, config.grace_period);
    let limits = config.listen;
    let access_log = config.access_log;
    let input = api::InputLimits {
        max_body_bytes: config.max_body_bytes,
        ..api::InputLimits::default()
    };
    let quota_ledger = config.backend.quota_ledger();
    // The admin endpoints list counters: the default memory store then keeps their names.
    let backend = if config.admin_token.is_some() {
        config.backend.listing()
    } else {
        config.backend
    };
    let service = Arc::new(
        Service::new(config.policy, backend)
            .with_admin_token(config.admin_token)
            .with_input_limits(input)
            .with_rls_settings(config.rls),
    );
    service.require_store_for_readiness(config.ready_requires_store);
    let (stop, stopped) = watch::channel(false);
    let signal = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let mut tasks = tokio::task::JoinSet::new();
    if config.watch {
        let target: Arc<dyn reload::Target> = service.clone();
        tasks.spawn(reload_task(config.files, target, signal(stopped.clone())));
        if let Some(tls) = &config.tls {
            let certificate = tls.certificate.clone();
            let shutdown = signal(stopped.clone());
            tasks.spawn(async move {
                certificate.watch(shutdown).await;
                Ok(())
            });
        }
    }
    if let Some(xds) = config.xds {
        tasks.spawn(crate::xds::run(
            xds,
            service.clone(),
            signal(stopped.clone()),
        ));
    }
    let tls = config.tls;
    let tls_for = |listener| tls.as_ref().and_then(|tls| tls.acceptor(listener));
    if let Some(listener) = listeners.http {
        let router = if noop {
            api::noop::router()
        } else if config.dashboard {
            let dashboard = Dashboard::new(service.clone());
            tasks.spawn(dashboard.clone().run(signal(stopped.clone())));
            api::http::router(service.clone()).merge(dashboard::router(dashboard))
        } else {
            api::http::router(service.clone())
        };
        let shutdown = signal(stopped.clone());
        let acceptor = Acceptor::new(listener, limits, service.metrics().listener("http"))
            .with_tls(tls_for(TlsListener::Http));
        tasks.spawn(api::http::serve(acceptor, router, shutdown, grace_period));
    }
    // Envoy's Rate Limit Quota Service, beside ShouldRateLimit on the gRPC listener.
    let rlqs = (listeners.grpc.is_some() && !noop)
        .then(|| crate::rlqs::Rlqs::new(service.clone(), quota_ledger, config.rlqs));
    if let Some(rlqs) = &rlqs {
        tasks.spawn(rlqs.clone().run(signal(stopped.clone())));
    }
    if let Some(listener) = listeners.grpc {
        let shutdown = signal(stopped.clone());
        // HTTP/2's client preface: 24 bytes, all due within the header read timeout.
        let acceptor = Acceptor::new(listener, limits, service.metrics().listener("grpc"))
            .with_tls(tls_for(TlsListener::Grpc))
            .with_opening_bytes(24);
        if noop {
            tasks.spawn(api::grpc::serve(
                acceptor,
                api::noop::NoopRls::server(),
                shutdown,
                grace_period,
            ));
        } else if let Some(rlqs) = &rlqs {
            tasks.spawn(api::grpc::serve(
                acceptor,
                crate::rlqs::GrpcRoutes::new(
                    api::grpc::Rls::server(service.clone()),
                    rlqs.server(),
                ),
                shutdown,
                grace_period,
            ));
        }
    }
    if let (Some(listener), Some((upstream, fallback))) = (listeners.gateway, gateway_setup) {
        let gateway =
            Arc::new(Gateway::new(service.clone(), upstream, fallback).with_access_log(access_log));
        let acceptor = Acceptor::new(listener, limits, service.metrics().listener("gateway"))
            .with_tls(tls_for(TlsListener::Gateway));
        tasks.spawn(gateway::serve(
            acceptor,
            gateway,
            signal(stopped.clone()),
            grace_period,
        ));
    }
    if let Some(listener) = listeners.websocket {
        let gateway = WsGateway::new(service.clone());
        let acceptor = Acceptor::new(listener, limits, service.metrics().listener("websocket"))
            .with_tls(tls_for(TlsListener::Websocket));
        tasks.spawn(ws_gateway::serve(
            acceptor,
            gateway,
            signal(stopped.clone()),
            grace_period,
        ));
    }
    drop(stopped);

    // Stop everything when asked, or as soon as one server fails.
    let mut result = Ok(());
    let mut asked = false;
    tokio::pin!(shutdown);
    loop {
        if tasks.is_empty() {
            shutdown.as_mut().await;
            asked = true;
            break;
        }
        tokio::select! {
            () = shutdown.as_mut() => {
                asked = true;
                break;
            }
            joined = tasks.join_next() => match joined {
                Some(Ok(Ok(()))) | None => {}
                Some(Ok(Err(e))) => {
                    result = Err(e);
                    break;
                }
                Some(Err(e)) => {
                    result = Err(std::io::Error::other(e));
                    break;
                }
            },
        }
    }
    service.start_draining();
    if let Some(rlqs) = &rlqs {
        rlqs.drain();
    }
    if asked && !drain_period.is_zero() {
        tracing::info!(
            "draining: /readyz answers 503; still serving for {}",
            humantime::format_duration(drain_period)
        );
        tokio::time::sleep(drain_period).await;
    }
    tracing::info!(
        "no longer accepting connections; up to {} for the ones in flight",
        humantime::format_duration(grace_period)
    );
    let _ = stop.send(true);
    let finished = async {
        while let Some(joined) = tasks.join_next().await {
            if let Ok(Err(e)) = joined
                && result.is_ok()
            {
                result = Err(e);
            }
        }
    };
    if tokio::time::timeout(grace_period, finished).await.is_err() {
        tracing::warn!(
            "connections still busy after the grace period ({}); closing them",
            humantime::format_duration(grace_period)
        );
        tasks.abort_all();
    }
    result
}

/// SIGHUP as received since [`shutdown_signal`] was called, for the reload task to take (once).
#[cfg(unix)]
static EARLY_HANGUP: parking_lot::Mutex<Option<tokio::signal::unix::Signal>> =
    parking_lot::Mutex::new(None);

/// The SIGHUP stream [`shutdown_signal`] opened, holding every SIGHUP sent since (the reload
/// task takes it, so that a SIGHUP sent right after `flowgate serving` is answered); `None`
/// when it was not called (a server run in a test process) or was taken already.
#[cfg(unix)]
pub(crate) fn take_early_hangup() -> Option<tokio::signal::unix::Signal> {
    EARLY_HANGUP.lock().take()
}

async fn reload_task(
    files: Vec<PathBuf>,
    target: Arc<dyn reload::Target>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    reload::watch(files, target, shutdown).await;
    Ok(())
}

/// Completes on ctrl-c or SIGTERM. SIGTERM's handler is installed when this is called, not
/// when the future is first polled: from then on a SIGTERM is never lost nor fatal (call it
/// before announcing that the server serves). Also installs SIGHUP's handler, so that a SIGHUP
/// that comes before the reload watcher listens does not kill the process either.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    // (Also starts receiving SIGHUP, for the reload task: see `take_early_hangup`.)
    #[cfg(unix)]
    let term = {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            // Kept for the reload task, which starts later: a SIGHUP sent in between is
            // neither fatal nor lost.
            Ok(hangup) => *EARLY_HANGUP.lock() = Some(hangup),
            Err(e) => tracing::warn!("cannot handle SIGHUP: {e}"),
        }
        signal(SignalKind::terminate())
    };
    async move {
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        #[cfg(unix)]
        let term = async move {
            match term {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            () = ctrl_c => {},
            () = term => {},
        }
    }
}
