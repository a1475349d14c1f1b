//! Command-line interface: `flowgate serve`, `flowgate check-config`, `flowgate export`,
//! `flowgate loadgen` (feature `loadgen`), `flowgate simulate` (feature `simulate`).

mod check_config;
pub mod export;
#[cfg(feature = "loadgen")]
pub mod loadgen;
mod serve;
#[cfg(feature = "simulate")]
pub mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use check_config::CheckConfigArgs;
pub use export::ExportArgs;
#[cfg(feature = "loadgen")]
pub use loadgen::LoadgenArgs;
pub use serve::{LogFormat, ServeArgs, ServeError};
#[cfg(feature = "simulate")]
pub use simulate::SimulateArgs;

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
    /// Runs the service: Envoy RLS gRPC and the HTTP API.
    #[command(after_help = serve::ENVIRONMENT_HELP)]
    Serve(Box<ServeArgs>),
    /// Validates configuration files without starting anything (exit 0 if all are valid).
    CheckConfig(CheckConfigArgs),
    /// Writes a domain's usage (every counter, its limit, used and remaining units, reset
    /// time) as CSV or JSON lines, from a running service's admin API (token from
    /// FLOWGATE_ADMIN_TOKEN).
    Export(ExportArgs),
    /// Drives load at a rate-limit service (gRPC RLS, /json, /v1/check) and reports
    /// throughput and latency percentiles.
    #[cfg(feature = "loadgen")]
    Loadgen(LoadgenArgs),
    /// Runs traffic (a built-in scenario, a CSV trace, a configuration's rules) through every
    /// algorithm with the same quota on a simulated clock, and shows how they differ.
    #[cfg(feature = "simulate")]
    Simulate(SimulateArgs),
}

/// Runs a parsed command line; returns the process's exit code.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => {
            init_logging(args.log_format);
            match serve::run(*args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::CheckConfig(args) => check_config::run(&args),
        Command::Export(args) => export::run(&args),
        #[cfg(feature = "loadgen")]
        Command::Loadgen(args) => loadgen::run(&args),
        #[cfg(feature = "simulate")]
        Command::Simulate(args) => simulate::run(&args),
    }
}

/// Log lines to stderr at `RUST_LOG`'s levels (default `info`), as `format` says. Text lines
/// are coloured only when stderr is a terminal (and `NO_COLOR` is not set): a file or a log
/// collector gets plain text.
fn init_logging(format: serve::LogFormat) {
    use std::io::IsTerminal as _;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        );
    match format {
        serve::LogFormat::Text => logs.init(),
        serve::LogFormat::Json => logs.json().init(),
    }
}

/// A multi-threaded tokio runtime, or the reason there is none.
fn runtime() -> Result<tokio::runtime::Runtime, std::io::Error> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}
