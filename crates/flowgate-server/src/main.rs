//! `flowgate`: the rate-limit service. This file only parses flags; the server is in the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = flowgate_server::cli::Cli::parse();
    flowgate_server::cli::run(cli)
}
