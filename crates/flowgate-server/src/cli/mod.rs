//! Command-line interface: `flowgate serve`.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Flowgate: a rate limiter for a whole fleet.
#[derive(Debug, Parser)]
#[command(name = "flowgate", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs the service.
    Serve(ServeArgs),
}

/// Flags of `flowgate serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address of the HTTP API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
}

/// Runs a parsed command line; returns the process's exit code.
pub fn run(cli: Cli) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Serve(args) => runtime.block_on(async move {
            let listener = match tokio::net::TcpListener::bind(args.http).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!("cannot listen on {}: {e}", args.http);
                    return ExitCode::FAILURE;
                }
            };
            tracing::info!("HTTP API on http://{}", args.http);
            match crate::server::run(listener, crate::server::shutdown_signal()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("server failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }),
    }
}
