//! What a simulation found: per subject a [`Summary`] and a [`Series`] over time, and how
//! they are measured while the simulation runs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use super::gate::Verdict;
use super::subject::Subject;
use super::traffic::KeyId;
use crate::clock::Nanos;
use crate::quota::Quota;

/// The most buckets a series may have: a chart has no use for more, and it bounds memory.
pub const MAX_BUCKETS: usize = 100_000;

/// One subject's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary {
    /// Tries offered, retries included.
    pub requests: u64,
    /// Tries that were retries of a denied request.
    pub retries: u64,
    /// Tries admitted (for the shaper: admitted after their wait).
    pub admitted: u64,
    /// Tries denied (for the shaper: refused because the queue was full or the wait too long).
    pub denied: u64,
    /// Requests whose last try was denied: clients turned away for good.
    pub gave_up: u64,
    /// Units admitted.
    pub admitted_units: u64,
    /// The most units admitted for one key within any window of the quota's period (a
    /// window `(t − period, t]`, at release time): what the protected service saw at worst.
    /// The sliding log keeps it at or below the limit; the buckets (and the shaper) at
    /// `burst + limit`, as they refill while the window passes; the fixed window at twice
    /// the limit, across a boundary.
    pub max_in_window: u64,
    /// When the first denial came, after the traffic's start.
    pub first_denial: Option<Duration>,
    /// How long admitted requests waited: only for the shaper (the others never delay).
    pub wait: Option<Waits>,
}

/// Percentiles of the shaper's waits (nearest rank, over admitted requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Waits {
    /// The median wait.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The longest wait.
    pub max: Duration,
}

/// Requests admitted and denied per bucket of time, from the report's start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Series {
    /// Requests admitted (released, for the shaper) in each bucket.
    pub admitted: Vec<u64>,
    /// Requests denied in each bucket.
    pub denied: Vec<u64>,
}

/// One subject's result.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Run {
    /// What was simulated.
    pub subject: Subject,
    /// The quota it enforced (the simulation's, with the subject's algorithm).
    pub quota: Quota,
    /// Its figures.
    pub summary: Summary,
    /// Admitted and denied over time.
    pub series: Series,
}

/// The result of a [`Simulation`](super::Simulation): one [`Run`] per subject, in the order
/// the subjects were given, all over the same buckets of time.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The quota every subject enforced (each with its own algorithm).
    pub quota: Quota,
    /// The traffic's name.
    pub traffic: String,
    /// Requests offered (retries not counted).
    pub offered: u64,
    /// Distinct keys in the traffic.
    pub keys: u64,
    /// Where time 0 of the series is, in ns since the Unix epoch.
    pub start: Nanos,
    /// The end of the span covered (the traffic's end, or the last release if later).
    pub end: Nanos,
    /// The width of a series bucket.
    pub bucket: Duration,
    /// The subjects' results.
    pub runs: Vec<Run>,
}

/// One key's admitted units within the last period, for [`Summary::max_in_window`].
#[derive(Debug, Default)]
struct Window {
    /// `(release time, units)`, oldest first.
    admitted: VecDeque<(Nanos, u64)>,
    /// Sum of the units in `admitted`.
    units: u64,
}

/// Collects a run's figures as its requests are decided, in time order.
#[derive(Debug)]
pub(super) struct Recorder {
    start: Nanos,
    bucket: Nanos,
    period: Nanos,
    summary: Summary,
    series: Series,
    /// Per key, for `max_in_window`.
    windows: Vec<Window>,
    /// Admissions whose release (arrival + wait) is still ahead: `(release, key, units)`.
    /// Released in time order once the simulation's time passes them, so that every window
    /// sees its admissions in order.
    pending: BinaryHeap<Reverse<(Nanos, KeyId, u64)>>,
    /// The shaper's waits, when measuring them.
    waits: Option<Vec<Nanos>>,
    /// The latest release time seen.
    last: Nanos,
}

impl Recorder {
    /// A recorder for traffic of `keys` keys from `start`, with `bucket`-wide buckets and
    /// windows of `period`; `waits` when the subject delays instead of denying.
    pub(super) fn new(
        start: Nanos,
        bucket: Nanos,
        period: Nanos,
        keys: usize,
        waits: bool,
    ) -> Self {
        Recorder {
            start,
            bucket: bucket.max(1),
            period,
            summary: Summary {
                requests: 0,
                retries: 0,
                admitted: 0,
                denied: 0,
                gave_up: 0,
                admitted_units: 0,
                max_in_window: 0,
                first_denial: None,
                wait: None,
            },
            series: Series::default(),
            windows: (0..keys).map(|_| Window::default()).collect(),
            pending: BinaryHeap::new(),
            waits: waits.then(Vec::new),
            last: start,
        }
    }

    /// Records one try of `cost` units for `key` at `now` (times never go back between
    /// calls); `retry` if it repeats a denied one.
    pub(super) fn record(
        &mut self,
        key: KeyId,
        cost: u64,
        now: Nanos,
        retry: bool,
        verdict: Verdict,
    ) -> Result<(), super::SimulateError> {
        self.release_until(now)?;
        let s = &mut self.summary;
        s.requests += 1;
        s.retries += u64::from(retry);
        match verdict {
            Verdict::Admitted { wait } => {
                s.admitted += 1;
                s.admitted_units += cost;
                if let Some(waits) = &mut self.waits {
                    waits.push(wait);
                }
                self.pending.push(Reverse((now + wait, key, cost)));
                if wait == 0 {
                    self.release_until(now)?;
                }
            }
            Verdict::Denied { .. } => {
                s.denied += 1;
                if s.first_denial.is_none() {
                    s.first_denial = Some(Duration::from_nanos(now.saturating_sub(self.start)));
                }
                *bucket(&mut self.series.denied, self.start, self.bucket, now)? += 1;
                self.last = self.last.max(now);
            }
        }
        Ok(())
    }

    /// Counts a request whose last try was denied.
    pub(super) fn gave_up(&mut self) {
        self.summary.gave_up += 1;
    }

    /// Releases admissions due by `now`, in time order.
    fn release_until(&mut self, now: Nanos) -> Result<(), super::SimulateError> {
        while let Some(&Reverse((at, key, units))) = self.pending.peek() {
            if at > now {
                break;
            }
            self.pending.pop();
            *bucket(&mut self.series.admitted, self.start, self.bucket, at)? += 1;
            self.last = self.last.max(at);
            let w = &mut self.windows[key as usize];
            while let Some(&(t, u)) = w.admitted.front() {
                if t + self.period > at {
                    break;
                }
                w.units -= u;
                w.admitted.pop_front();
            }
            w.admitted.push_back((at, units));
            w.units += units;
            self.summary.max_in_window = self.summary.max_in_window.max(w.units);
        }
        Ok(())
    }

    /// The run's figures, once every request is decided; and the last release time.
    pub(super) fn finish(mut self) -> Result<(Summary, Series, Nanos), super::SimulateError> {
        self.release_until(Nanos::MAX)?;
        if let Some(mut waits) = self.waits.take() {
            waits.sort_unstable();
            let rank = |p: u64| -> Duration {
                if waits.is_empty() {
                    return Duration::ZERO;
                }
                // Nearest rank: the smallest wait with at least p % of the waits at or below.
                let n = waits.len() as u64;
                let index = (p * n).div_ceil(100).max(1) - 1;
                Duration::from_nanos(waits[index as usize])
            };
            self.summary.wait = Some(Waits {
                p50: rank(50),
                p99: rank(99),
                max: rank(100),
            });
        }
        Ok((self.summary, self.series, self.last))
    }
}

/// The counter of the bucket holding `at`, growing the series as needed.
fn bucket(
    series: &mut Vec<u64>,
    start: Nanos,
    width: Nanos,
    at: Nanos,
) -> Result<&mut u64, super::SimulateError> {
    let index = (at.saturating_sub(start) / width) as usize;
    if index >= MAX_BUCKETS {
        return Err(super::SimulateError::TooManyBuckets {
            buckets: index.saturating_add(1),
        });
    }
    if index >= series.len() {
        series.resize(index + 1, 0);
    }
    Ok(&mut series[index])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_the_busiest_window_per_key_and_wait_percentiles() {
        let s = 1_000_000_000;
        let mut r = Recorder::new(0, s, 10 * s, 2, true);
        let ok = Verdict::Admitted { wait: 0 };
        // Key 0: 3 units at 0 s, 4 at 9 s (window (−1, 9]: 7), 5 at 10 s (window (0, 10]: 9).
        r.record(0, 3, 0, false, ok).unwrap();
        r.record(0, 4, 9 * s, false, ok).unwrap();
        // Key 1 alone never exceeds 6.
        r.record(1, 6, 9 * s, false, ok).unwrap();
        r.record(0, 5, 10 * s, false, Verdict::Admitted { wait: 0 })
            .unwrap();
        r.record(1, 1, 11 * s, true, Verdict::Denied { retry_after: 1 })
            .unwrap();
        r.gave_up();
        let (summary, series, last) = r.finish().unwrap();
        assert_eq!(summary.max_in_window, 9);
        assert_eq!(
            (
                summary.requests,
                summary.admitted,
                summary.denied,
                summary.retries
            ),
            (5, 4, 1, 1)
        );
        assert_eq!((summary.gave_up, summary.admitted_units), (1, 18));
        assert_eq!(summary.first_denial, Some(Duration::from_secs(11)));
        assert_eq!(series.admitted, [1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1]);
        assert_eq!(series.denied, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(last, 11 * s);
        assert_eq!(summary.wait, Some(Waits::default()));
    }

    #[test]
    fn delayed_releases_are_counted_when_they_happen() {
        let s = 1_000_000_000;
        let mut r = Recorder::new(0, s, 2 * s, 1, true);
        // Three requests at 0 released at 0, 1 s and 2 s: no window of 2 s holds more than 2.
        for wait in [0, s, 2 * s] {
            r.record(0, 1, 0, false, Verdict::Admitted { wait })
                .unwrap();
        }
        let (summary, series, last) = r.finish().unwrap();
        assert_eq!(summary.max_in_window, 2);
        assert_eq!(series.admitted, [1, 1, 1]);
        assert_eq!(last, 2 * s);
        let waits = summary.wait.unwrap();
        assert_eq!(
            (waits.p50, waits.p99, waits.max),
            (
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_secs(2)
            )
        );
    }
}
