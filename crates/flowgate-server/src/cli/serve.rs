//! `flowgate serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use tokio::net::TcpListener;

use crate::config::gateway::DEFAULT_LISTEN;
use crate::gateway::Upstream;
use crate::server::{self, Listeners, ServerConfig};

/// Flags of `flowgate serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A configuration file (envoyproxy/ratelimit YAML, one domain per file); repeat for more.
    /// Without any, a built-in default policy is enforced (domain `default`).
    #[arg(long = "config", value_name = "FILE")]
    pub config: Vec<PathBuf>,
    /// Address of the HTTP API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
    /// Address of the Envoy rate-limit gRPC API.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub grpc: SocketAddr,
    /// Runs the rate-limiting reverse proxy in front of this upstream (`http://host:port`);
    /// requests are checked with the configuration's `gateway` section (docs/service.md).
    #[arg(long, value_name = "URL")]
    pub upstream: Option<Upstream>,
    /// Address of the gateway (with --upstream); overrides `gateway.listen`
    /// [default: 127.0.0.1:8000].
    #[arg(long, value_name = "ADDR", requires = "upstream")]
    pub gateway: Option<SocketAddr>,
    /// Benchmark baseline: parse every request and answer in the same shape without deciding
    /// anything (see docs/service.md, "Benchmarks").
    #[arg(long, hide = true)]
    pub noop: bool,
}

pub(super) fn run(args: ServeArgs) -> ExitCode {
    let mut config = match ServerConfig::load(args.config) {
        Ok(config) => config,
        Err(errors) => {
            tracing::error!("invalid configuration:\n{errors}");
            return ExitCode::FAILURE;
        }
    };
    config.noop = args.noop;
    let gateway_addr = match &args.upstream {
        None => None,
        Some(upstream) => {
            if let Err(e) = crate::gateway::effective_config(&config.policy) {
                tracing::error!("{e}");
                return ExitCode::FAILURE;
            }
            let listen = args
                .gateway
                .or_else(|| config.policy.gateway.as_ref().and_then(|g| g.listen));
            let listen = match listen {
                Some(addr) => addr,
                None => match DEFAULT_LISTEN.parse() {
                    Ok(addr) => addr,
                    Err(e) => {
                        tracing::error!("bad default gateway address: {e}");
                        return ExitCode::FAILURE;
                    }
                },
            };
            config.upstream = Some(upstream.clone());
            Some(listen)
        }
    };
    let runtime = match super::runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let (http, grpc) = match (bind(args.http).await, bind(args.grpc).await) {
            (Ok(http), Ok(grpc)) => (http, grpc),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!("{e}");
                return ExitCode::FAILURE;
            }
        };
        let gateway = match gateway_addr {
            None => None,
            Some(addr) => match bind(addr).await {
                Ok(listener) => Some(listener),
                Err(e) => {
                    tracing::error!("{e}");
                    return ExitCode::FAILURE;
                }
            },
        };
        tracing::info!(
            http = %args.http,
            grpc = %args.grpc,
            rules = config.policy.rules.rules().len(),
            "flowgate serving"
        );
        if let (Some(addr), Some(upstream)) = (gateway_addr, &args.upstream) {
            tracing::info!(gateway = %addr, %upstream, "gateway proxying");
        }
        let listeners = Listeners {
            http: Some(http),
            grpc: Some(grpc),
            gateway,
        };
        match server::run(config, listeners, server::shutdown_signal()).await {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!("server failed: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))
}
