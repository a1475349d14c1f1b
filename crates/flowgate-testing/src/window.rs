//! Sequences of requests that must fall in one fixed (or calendar) window of the wall clock.
//!
//! A fixed window counts in periods aligned to the Unix epoch (window = ⌊now / period⌋), so a
//! test that takes 2 of a limit of 2 and expects the third refused fails when the minute ends
//! between two of its requests: the count starts again. [`in_one_window`] reads the clock
//! before and after a sequence; when a window's boundary fell between the two readings (the
//! server read its time in between), the sequence's outcome — pass or fail — is discarded and
//! it runs again, on fresh keys (at most [`ATTEMPTS`] times). Nothing else is retried: a
//! sequence that fails within one window fails the test.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flowgate::calendar::Calendar;
use flowgate::clock::{Clock, PreciseClock};

/// How a limit cuts time into windows.
#[derive(Debug, Clone, Copy)]
pub enum Window {
    /// Periods of this length from the Unix epoch on: a `fixed_window` limit's `unit`.
    Every(Duration),
    /// A calendar quota's periods (`calendar: true`).
    Calendar(&'static Calendar),
}

/// A `unit: second` fixed window.
pub const SECOND: Window = Window::Every(Duration::from_secs(1));
/// A `unit: minute` fixed window.
pub const MINUTE: Window = Window::Every(Duration::from_secs(60));
/// A `unit: hour` fixed window.
pub const HOUR: Window = Window::Every(Duration::from_secs(3_600));

/// How many times [`in_one_window`] runs a sequence whose run crossed a boundary.
pub const ATTEMPTS: u32 = 3;

impl Window {
    /// The window containing `unix_nanos` (its index, or its start for a calendar).
    fn index(self, unix_nanos: u64) -> i128 {
        match self {
            Window::Every(period) => i128::from(unix_nanos) / period.as_nanos() as i128,
            Window::Calendar(calendar) => {
                let at = jiff::Timestamp::from_nanosecond(i128::from(unix_nanos)).unwrap();
                i128::from(calendar.window(at).0.as_second())
            }
        }
    }
}

/// The earliest and latest of the clocks a server under test may count on: this process's
/// flowgate clock (an in-process server's) and the system clock (Redis's `TIME`). A `flowgate`
/// child process's clock is the system clock's when the child starts, then counts the CPU's
/// time-stamp counter: it strays from the system clock by far less than the time the child
/// takes to start and to be waited for, which the readings enclose.
///
/// No margin is added: a retry starts right after the boundary the last attempt crossed, and
/// a margin would cover that boundary again.
fn now() -> (u64, u64) {
    let flowgate = PreciseClock::new().now();
    let system = u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap();
    (flowgate.min(system), flowgate.max(system))
}

/// Reads the clocks before a sequence; [`Span::crossed`] afterwards says which of `windows`
/// changed in between.
struct Span<'a> {
    windows: &'a [Window],
    start: u64,
}

impl<'a> Span<'a> {
    fn begin(windows: &'a [Window]) -> Self {
        Span {
            windows,
            start: now().0,
        }
    }

    /// The first window whose boundary fell inside the span, if any.
    fn crossed(&self) -> Option<Window> {
        let end = now().1;
        self.windows
            .iter()
            .copied()
            .find(|w| w.index(self.start) != w.index(end))
    }
}

/// What one attempt came to.
fn settle<T>(attempt: u32, crossed: Option<Window>, outcome: std::thread::Result<T>) -> Option<T> {
    match (crossed, outcome) {
        (None, Ok(value)) => Some(value),
        (None, Err(panic)) => resume_unwind(panic),
        (Some(window), outcome) => {
            let failed = if outcome.is_err() { " (it failed)" } else { "" };
            assert!(
                attempt + 1 < ATTEMPTS,
                "each of {ATTEMPTS} attempts crossed a boundary of the {window:?} window{failed}: \
                 the sequence cannot be checked within one window"
            );
            eprintln!(
                "attempt {attempt} crossed a boundary of the {window:?} window{failed}; \
                 running the sequence again on fresh keys"
            );
            None
        }
    }
}

/// Runs `sequence(attempt)` (attempt 0, 1, …: it makes its keys, or its server, fresh with
/// it) until one run starts and ends inside one window of each of `windows`, at most
/// [`ATTEMPTS`] times, and returns that run's value. A run that crosses a boundary is
/// discarded, whatever it came to (a panic included); a panic in a run that crossed none
/// fails the test as it is.
pub async fn in_one_window<T>(windows: &[Window], mut sequence: impl AsyncFnMut(u32) -> T) -> T {
    for attempt in 0..ATTEMPTS {
        let span = Span::begin(windows);
        let outcome = caught(sequence(attempt)).await;
        if let Some(value) = settle(attempt, span.crossed(), outcome) {
            return value;
        }
    }
    unreachable!("settle fails the last attempt")
}

/// [`in_one_window`] for a blocking `sequence`.
pub fn in_one_window_blocking<T>(windows: &[Window], mut sequence: impl FnMut(u32) -> T) -> T {
    for attempt in 0..ATTEMPTS {
        let span = Span::begin(windows);
        let outcome = catch_unwind(AssertUnwindSafe(|| sequence(attempt)));
        if let Some(value) = settle(attempt, span.crossed(), outcome) {
            return value;
        }
    }
    unreachable!("settle fails the last attempt")
}

/// `key` for attempt 0, a key of its own for each later attempt (`key-retry1`, …).
pub fn fresh(key: &str, attempt: u32) -> String {
    match attempt {
        0 => key.to_owned(),
        n => format!("{key}-retry{n}"),
    }
}

/// `future`'s output, or its panic.
async fn caught<F: Future>(future: F) -> std::thread::Result<F::Output> {
    let mut future = pin!(future);
    std::future::poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_aligned_to_the_epoch_and_calendars_to_their_periods() {
        let minute = 60_000_000_000;
        assert_eq!(MINUTE.index(minute - 1), 0);
        assert_eq!(MINUTE.index(minute), 1);
        assert_eq!(HOUR.index(59 * minute), 0);
        let month =
            Calendar::new(flowgate::calendar::CalendarUnit::Month, "Europe/Berlin").unwrap();
        // 1 February 2026, 00:00 in Berlin is 23:00 UTC on 31 January.
        let feb = 1_769_900_400_000_000_000;
        assert_ne!(
            Window::Calendar(month).index(feb - 1),
            Window::Calendar(month).index(feb)
        );
        assert_eq!(
            Window::Calendar(month).index(feb),
            Window::Calendar(month).index(feb + minute)
        );
    }

    #[test]
    fn a_run_that_crossed_is_discarded_and_one_that_did_not_is_kept() {
        assert_eq!(settle(0, None, Ok(7)), Some(7));
        assert_eq!(settle(0, Some(MINUTE), Ok(7)), None);
        let refused = || -> Box<dyn std::any::Any + Send> { Box::new("refused") };
        assert_eq!(settle::<u8>(1, Some(MINUTE), Err(refused())), None);
        let last = catch_unwind(|| settle(ATTEMPTS - 1, Some(MINUTE), Ok(7)));
        assert!(last.is_err(), "the last attempt that crosses fails");
        let failed = catch_unwind(|| settle::<u8>(0, None, Err(refused())));
        assert!(
            failed.is_err(),
            "a failure within one window is not retried"
        );
    }

    #[test]
    fn a_sequence_that_always_crosses_runs_each_attempt_then_fails() {
        let mut runs = Vec::new();
        let every_nanosecond = Window::Every(Duration::from_nanos(1));
        let failed = catch_unwind(AssertUnwindSafe(|| {
            in_one_window_blocking(&[every_nanosecond], |attempt| runs.push(attempt))
        }));
        assert!(failed.is_err());
        assert_eq!(runs, [0, 1, 2]);
        assert_eq!(
            (fresh("k", 0), fresh("k", 2)),
            ("k".into(), "k-retry2".into())
        );
    }

    #[tokio::test]
    async fn the_async_form_returns_the_value_and_passes_a_panic_on() {
        // No window: nothing to cross, one run.
        assert_eq!(in_one_window(&[], async |attempt| attempt + 5).await, 5);
        let panicked = caught(async { panic!("in the sequence") }).await;
        assert!(panicked.is_err());
    }
}
