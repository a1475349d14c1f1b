//! A progress bar on stderr for long simulations, only when stderr is a terminal.

use std::io::IsTerminal as _;

use flowgate::simulate::Progress;

/// Requests (over all limiters) below which a run is too short to be worth a bar.
const WORTH_A_BAR: u64 = 200_000;

/// Reports a simulation's progress, or nothing.
pub(super) struct Bar(Option<indicatif::ProgressBar>);

impl Bar {
    /// A bar for `total` requests, unless `quiet`, stderr is not a terminal, or the run is
    /// short.
    pub(super) fn new(title: &str, total: u64, quiet: bool) -> Bar {
        if quiet || total < WORTH_A_BAR || !std::io::stderr().is_terminal() {
            return Bar(None);
        }
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{msg} {bar:40} {percent:>3}% ({eta} left)")
        {
            bar.set_style(style);
        }
        bar.set_message(title.to_owned());
        Bar(Some(bar))
    }

    /// Moves the bar to `progress`.
    pub(super) fn update(&self, progress: Progress) {
        if let Some(bar) = &self.0 {
            bar.set_position(progress.done);
        }
    }

    /// Removes the bar.
    pub(super) fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}
