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

/// The tokio runtime `serve` runs on, with its scheduler's name for the log; or the reason
/// there is none.
///
/// With more than one CPU to run on, or `TOKIO_WORKER_THREADS` set, tokio's multi-thread
/// scheduler (one worker per CPU, or as many as the variable says). With one CPU (a container
/// limited to one, `taskset -c 0`: what `std::thread::available_parallelism` reports), its
/// current-thread scheduler: there one worker would have no one to share work with, and the
/// multi-thread scheduler keeps at most 256 ready tasks in that worker's own queue and puts the
/// rest in a global queue it looks at only every few dozen polls — so under overload the
/// connections whose tasks land there wait several times longer than the others. Measured:
/// 1,000 WebSocket connections relayed by one core, p99 174–185 ms with the multi-thread
/// scheduler against 73–116 ms with the current-thread one (its run queue is one FIFO), at the
/// same rate within the noise (BENCHMARKS.md, "The WebSocket gateway beside nginx").
fn runtime() -> Result<(tokio::runtime::Runtime, &'static str), std::io::Error> {
    let one_cpu = std::env::var_os("TOKIO_WORKER_THREADS").is_none()
        && std::thread::available_parallelism().is_ok_and(|n| n.get() == 1);
    if one_cpu {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok((runtime, "current-thread"))
    } else {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        Ok((runtime, "multi-thread"))
    }
}
