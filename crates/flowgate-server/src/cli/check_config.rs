//! `flowgate check-config FILE…`: validates configuration files offline.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config;

/// Flags of `flowgate check-config`.
#[derive(Debug, clap::Args)]
pub struct CheckConfigArgs {
    /// Configuration files (one domain each), validated together as `serve` would load them.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Prints every error to stderr as `file:line:column: field: message`; exit 1 if any.
pub(super) fn run(args: &CheckConfigArgs) -> ExitCode {
    match config::load(&args.files) {
        Ok(policy) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "ok: {} file(s), {} domain(s), {} limit(s)",
                policy.files.len(),
                policy.rules.domains().count(),
                policy.rules.rules().len()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{errors}");
            ExitCode::FAILURE
        }
    }
}
