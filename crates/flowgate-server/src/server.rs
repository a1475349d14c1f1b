//! The server: `run(config, listeners, shutdown)` serves the HTTP and gRPC APIs (and, with an
//! upstream, the gateway; with a `websocket` section, the WebSocket gateway) until `shutdown` completes, then stops accepting and finishes
//! in-flight calls.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, Service};
use crate::backend::Backend;
use crate::config::{self, ConfigErrors, Policy, reload};
use crate::gateway::ws::{self as ws_gateway, WsGateway};
use crate::gateway::{self, Gateway, Upstream};

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
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("files", &self.files)
            .field("backend", &self.backend)
            .field("watch", &self.watch)
            .field("noop", &self.noop)
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl ServerConfig {
    /// Loads `files` (the built-in policy when empty) with the in-memory store, watching the
    /// files for changes.
    pub fn load(files: Vec<PathBuf>) -> Result<Self, ConfigErrors> {
        let policy = config::load(&files)?;
        Ok(ServerConfig {
            files,
            policy,
            backend: Backend::default(),
            watch: true,
            noop: false,
            upstream: None,
            ready_requires_store: false,
        })
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

/// Serves until `shutdown` completes, then finishes in-flight requests and returns.
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
    let service = Arc::new(Service::new(config.policy, config.backend));
    service.require_store_for_readiness(config.ready_requires_store);
    let (stop, stopped) = watch::channel(false);
    let signal = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let mut tasks = tokio::task::JoinSet::new();
    if config.watch {
        let target: Arc<dyn reload::Target> = service.clone();
        tasks.spawn(reload_task(config.files, target, signal(stopped.clone())));
    }
    if let Some(listener) = listeners.http {
        let router = if noop {
            api::noop::router()
        } else {
            api::http::router(service.clone())
        };
        let shutdown = signal(stopped.clone());
        tasks.spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
        });
    }
    if let Some(listener) = listeners.grpc {
        let shutdown = signal(stopped.clone());
        if noop {
            tasks.spawn(api::grpc::serve(
                listener,
                api::noop::NoopRls::server(),
                shutdown,
            ));
        } else {
            tasks.spawn(api::grpc::serve(
                listener,
                api::grpc::Rls::server(service.clone()),
                shutdown,
            ));
        }
    }
    if let (Some(listener), Some((upstream, fallback))) = (listeners.gateway, gateway_setup) {
        let gateway = Arc::new(Gateway::new(service.clone(), upstream, fallback));
        tasks.spawn(gateway::serve(listener, gateway, signal(stopped.clone())));
    }
    if let Some(listener) = listeners.websocket {
        let gateway = WsGateway::new(service.clone());
        tasks.spawn(ws_gateway::serve(
            listener,
            gateway,
            signal(stopped.clone()),
        ));
    }
    drop(stopped);

    // Stop everything when asked, or as soon as one server fails.
    let mut result = Ok(());
    tokio::pin!(shutdown);
    loop {
        if tasks.is_empty() {
            shutdown.as_mut().await;
            break;
        }
        tokio::select! {
            () = shutdown.as_mut() => break,
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
    let _ = stop.send(true);
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Err(e)) = joined
            && result.is_ok()
        {
            result = Err(e);
        }
    }
    result
}

async fn reload_task(
    files: Vec<PathBuf>,
    target: Arc<dyn reload::Target>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    reload::watch(files, target, shutdown).await;
    Ok(())
}

/// Completes on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
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
