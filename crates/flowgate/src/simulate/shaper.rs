//! The shaper on a simulated clock: the rule of `local::Shaper` without its tokio timer.
//!
//! `Shaper::until_n_ready` reserves `cost` units of a leaky bucket with `max_delay` as the
//! most it may wait ([`Reserve::reserve`]); a reservation that must wait takes a place in the
//! shaper's [`WaitQueue`], and is given back (the caller refused) when the queue is full. Here
//! the same transition decides and the same queue bounds the waiters; what tokio's timer does
//! for the real shaper — end each wait at its departure time, which leaves the queue — the
//! model does with its departure heap on the simulated clock. A test (feature `tokio`) runs
//! the real shaper under tokio's paused clock and checks that both agree on every request.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::Arc;

use crate::algorithm::{LeakyBucket, Reserve, State};
use crate::clock::{Nanos, nanos};
use crate::local::queue::{Place, WaitQueue};
use crate::quota::{Algorithm, Quota};

use super::gate::Verdict;

/// One key's shaper.
#[derive(Debug)]
pub(super) struct ShaperModel {
    /// The leaky bucket that hands out departure times.
    bucket: LeakyBucket,
    /// The waiting requests' places, at most `max_queue`.
    queue: Arc<WaitQueue>,
    /// When each waiting request leaves (earliest first), holding its place until then.
    departures: BinaryHeap<Reverse<Departure>>,
}

/// A waiting request: when it leaves, and its place in the queue.
#[derive(Debug)]
struct Departure {
    at: Nanos,
    _place: Place,
}

impl PartialEq for Departure {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Departure {}

impl PartialOrd for Departure {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Departure {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.cmp(&other.at)
    }
}

/// The settings shared by every key's shaper.
#[derive(Debug, Clone, Copy)]
pub(super) struct ShaperRule {
    /// The quota as a leaky bucket (the shaper's).
    pub(super) quota: Quota,
    /// Most requests waiting at once.
    pub(super) max_queue: usize,
    /// Longest wait, in ns.
    pub(super) max_delay: Nanos,
}

impl ShaperRule {
    pub(super) fn new(quota: &Quota, max_queue: usize, max_delay: std::time::Duration) -> Self {
        ShaperRule {
            // As `Shaper::with_clock` does.
            quota: quota
                .with_algorithm(Algorithm::LeakyBucket)
                .unwrap_or(*quota),
            max_queue,
            max_delay: nanos(max_delay),
        }
    }
}

impl ShaperModel {
    pub(super) fn new(rule: &ShaperRule) -> Self {
        ShaperModel {
            bucket: LeakyBucket::default(),
            queue: WaitQueue::new(rule.max_queue),
            departures: BinaryHeap::new(),
        }
    }

    /// Offers `cost` units at `now`: admitted after a wait, or refused with the time after
    /// which trying again could succeed.
    pub(super) fn offer(&mut self, rule: &ShaperRule, cost: u64, now: Nanos) -> Verdict {
        while self.departures.peek().is_some_and(|Reverse(d)| d.at <= now) {
            self.departures.pop();
        }
        match self.bucket.reserve(&rule.quota, cost, now, rule.max_delay) {
            // Too long a wait: it would fit once the bucket has drained the excess.
            Err(wait) => Verdict::Denied {
                retry_after: wait - rule.max_delay,
            },
            Ok(0) => Verdict::Admitted { wait: 0 },
            Ok(wait) => match self.queue.join() {
                Ok(place) => {
                    self.departures.push(Reverse(Departure {
                        at: now + wait,
                        _place: place,
                    }));
                    Verdict::Admitted { wait }
                }
                Err(_) => {
                    // The shaper drops the reservation, which gives the units back; a place
                    // in the queue frees up when the first waiting request leaves.
                    self.bucket.refund(&rule.quota, cost, now);
                    let next = self.departures.peek().map_or(1, |Reverse(d)| d.at - now);
                    Verdict::Denied { retry_after: next }
                }
            },
        }
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::*;
    use crate::clock::TokioClock;
    use crate::local::{ShapeError, Shaper};
    use std::sync::Arc;
    use std::time::Duration;

    /// The real shaper, under tokio's paused clock, and the model agree on every request of
    /// a bursty trace: which are refused, and how long the others wait.
    #[tokio::test(start_paused = true)]
    async fn the_model_agrees_with_the_real_shaper() {
        let quota = Quota::per_second(10).with_burst(3).unwrap();
        let (max_queue, max_delay) = (4, Duration::from_millis(450));
        let rule = ShaperRule::new(&quota, max_queue, max_delay);
        let shaper = Arc::new(Shaper::with_clock(
            quota,
            max_queue,
            max_delay,
            TokioClock::new(),
        ));
        let mut rng = super::super::rng::SplitMix64::new(5);
        // Offsets in ms: bursts and gaps.
        let mut at = 0u64;
        let mut offsets = Vec::new();
        for _ in 0..60 {
            at += [0, 0, 0, 10, 40, 120, 300][rng.below(7) as usize];
            offsets.push(at);
        }
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for &ms in &offsets {
            tokio::time::sleep_until(start + Duration::from_millis(ms)).await;
            let shaper = shaper.clone();
            tasks.push(tokio::spawn(async move {
                let begun = tokio::time::Instant::now();
                match shaper.until_n_ready(1).await {
                    Ok(()) => Ok(begun.elapsed()),
                    Err(e) => Err(e),
                }
            }));
            // Let the task take its place in the queue before the next one arrives.
            tokio::task::yield_now().await;
        }
        let mut model = ShaperModel::new(&rule);
        let origin = 1_000_000_000_000;
        let mut refused = 0;
        for (task, &ms) in tasks.into_iter().zip(&offsets) {
            let real = task.await.unwrap();
            let modelled = model.offer(&rule, 1, origin + ms * 1_000_000);
            match (real, modelled) {
                (Ok(waited), Verdict::Admitted { wait }) => {
                    assert_eq!(waited, Duration::from_nanos(wait), "at {ms} ms")
                }
                (
                    Err(ShapeError::QueueFull { .. } | ShapeError::DelayTooLong { .. }),
                    Verdict::Denied { .. },
                ) => refused += 1,
                (real, modelled) => panic!("at {ms} ms: shaper {real:?}, model {modelled:?}"),
            }
        }
        // The trace exercises both outcomes.
        assert!(refused > 0 && refused < offsets.len());
    }
}
