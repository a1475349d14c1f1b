//! The event loop of one run: arrivals in time order, retries as they fall due, a
//! deployment's own timers (hybrid syncs), all on one [`ManualClock`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::SimulateError;
use super::gate::{Gate, Verdict};
use super::report::{Recorder, Run};
use super::subject::{Limiter, Subject};
use super::traffic::{Retry, Traffic};
use crate::clock::{ManualClock, Nanos, nanos};
use crate::quota::Quota;

/// How often (in tries decided) a run reports progress.
pub(super) const PROGRESS_EVERY: u64 = 8192;

/// What one run ended with, besides its [`Run`]: the last release time.
pub(super) struct Ran {
    pub(super) run: Run,
    pub(super) last: Nanos,
}

/// Runs `traffic` through `subject` under `quota`, measuring in buckets of `bucket` ns;
/// calls `progress` with the number of offered requests decided so far.
pub(super) fn run(
    traffic: &Traffic,
    quota: &Quota,
    subject: &Subject,
    bucket: Nanos,
    progress: &mut dyn FnMut(u64),
) -> Result<Ran, SimulateError> {
    let start = traffic.start();
    let clock = ManualClock::new(start);
    let mut gate = Gate::new(subject, quota, traffic.keys().len(), start, &clock)?;
    let capacity = gate.quota().burst();
    if let Some(a) = traffic.arrivals().iter().find(|a| a.cost > capacity) {
        return Err(SimulateError::CostTooHigh {
            line: a.line,
            cost: a.cost,
            capacity,
            subject: subject.to_string(),
        });
    }
    let shaper = matches!(subject.limiter, Limiter::Shaper { .. });
    let mut recorder = Recorder::new(
        start,
        bucket,
        nanos(quota.period()),
        traffic.keys().len(),
        shaper,
    );
    let retry = traffic.retry();
    let attempts = retry.attempts();
    let instances = subject.deployment.instances();
    let arrivals = traffic.arrivals();
    // Retries due: (time, order of scheduling, arrival index, try number from 0).
    let mut retries: BinaryHeap<Reverse<(Nanos, u64, usize, u32)>> = BinaryHeap::new();
    let (mut next, mut scheduled, mut decided) = (0usize, 0u64, 0u64);
    loop {
        // The next try: an arrival, or a retry due before it (an arrival first on a tie).
        let arrival = arrivals.get(next).map(|a| a.at);
        let due = retries.peek().map(|r| r.0.0);
        let take_retry = match (arrival, due) {
            (None, None) => break,
            (Some(a), Some(r)) => r < a,
            (None, Some(_)) => true,
            (Some(_), None) => false,
        };
        let (at, index, attempt) = if take_retry {
            let Some(Reverse((at, _, index, attempt))) = retries.pop() else {
                break;
            };
            (at, index, attempt)
        } else {
            next += 1;
            (arrivals[next - 1].at, next - 1, 0)
        };
        while let Some(tick) = gate.next_tick()
            && tick <= at
        {
            clock.set(tick);
            gate.tick(tick)?;
        }
        clock.set(at);
        let a = &arrivals[index];
        let instance = (index as u64).wrapping_add(u64::from(attempt)) % instances;
        let name = &traffic.keys()[a.key as usize];
        let verdict = gate.decide(instance, a.key, name, a.cost, at)?;
        recorder.record(a.key, a.cost, at, attempt > 0, verdict)?;
        if let Verdict::Denied { retry_after } = verdict {
            if attempt + 1 < attempts {
                let wait = match retry {
                    Retry::Fixed { delay, .. } => nanos(delay),
                    // `Retry-After` carries whole seconds, rounded up.
                    Retry::RetryAfter { .. } => retry_after.div_ceil(1_000_000_000) * 1_000_000_000,
                    Retry::Never => 0,
                };
                retries.push(Reverse((
                    at.saturating_add(wait.max(1)),
                    scheduled,
                    index,
                    attempt + 1,
                )));
                scheduled += 1;
            } else {
                recorder.gave_up();
            }
        }
        if attempt == 0 {
            decided += 1;
            if decided.is_multiple_of(PROGRESS_EVERY) {
                progress(decided);
            }
        }
    }
    progress(decided);
    gate.finish()?;
    let quota = *gate.quota();
    let (summary, series, last) = recorder.finish()?;
    Ok(Ran {
        run: Run {
            subject: *subject,
            quota,
            summary,
            series,
        },
        last,
    })
}
