//! `flowgate serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use tokio::net::TcpListener;

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
        tracing::info!(
            http = %args.http,
            grpc = %args.grpc,
            rules = config.policy.rules.rules().len(),
            "flowgate serving"
        );
        let listeners = Listeners {
            http: Some(http),
            grpc: Some(grpc),
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
