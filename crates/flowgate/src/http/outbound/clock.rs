//! [`PausableClock`]: time that stands still while an upstream has asked us to wait.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{Clock, Nanos, nanos};

/// The pauses so far, on the base clock.
#[derive(Debug, Default)]
struct Pauses {
    /// Total length of the pauses that ended before `start`.
    completed: Nanos,
    /// Start of the latest pause.
    start: Nanos,
    /// End of the latest pause (`start` if there was none).
    end: Nanos,
}

/// A clock that runs like its base clock except during pauses, when it stands still.
///
/// The outbound limiter's bucket runs on it: an upstream's `Retry-After` pauses the key, so
/// nothing refills during the pause and the queue resumes at the steady rate where it left off
/// (no burst after the pause), with every waiter's turn moved back by the pause.
#[derive(Debug, Clone)]
pub(crate) struct PausableClock<C> {
    /// Real time.
    base: C,
    /// Shared by clones: the limiter's clock and the key's handle are the same clock.
    pauses: Arc<Mutex<Pauses>>,
}

impl<C: Clock> PausableClock<C> {
    pub(crate) fn new(base: C) -> Self {
        PausableClock {
            base,
            pauses: Arc::default(),
        }
    }

    /// The paused time for base time `t`.
    fn at(p: &Pauses, t: Nanos) -> Nanos {
        let in_pause = t.clamp(p.start, p.end.max(p.start)) - p.start;
        t.saturating_sub(p.completed).saturating_sub(in_pause)
    }

    /// Stops time from now for `d` (or extends a pause in progress to end at least then).
    pub(crate) fn pause_for(&self, d: Duration) {
        let now = self.base.now();
        let until = now.saturating_add(nanos(d));
        let mut p = self.pauses.lock();
        if now < p.end {
            p.end = p.end.max(until);
        } else {
            p.completed = p.completed.saturating_add(p.end - p.start);
            p.start = now;
            p.end = until;
        }
    }

    /// How much longer the pause in progress lasts (zero when not paused).
    pub(crate) fn paused_for(&self) -> Duration {
        let now = self.base.now();
        Duration::from_nanos(self.pauses.lock().end.saturating_sub(now))
    }

    /// The real time until this clock reads `target`, given no further pause.
    pub(crate) fn real_wait_until(&self, target: Nanos) -> Duration {
        let now = self.base.now();
        let p = self.pauses.lock();
        let remaining_pause = p.end.saturating_sub(now);
        let ahead = target.saturating_sub(Self::at(&p, now));
        Duration::from_nanos(ahead.saturating_add(remaining_pause))
    }
}

impl<C: Clock> Clock for PausableClock<C> {
    fn now(&self) -> Nanos {
        let now = self.base.now();
        Self::at(&self.pauses.lock(), now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn time_stands_still_during_pauses_and_never_goes_back() {
        let base = ManualClock::new(1_000);
        let clock = PausableClock::new(base.clone());
        assert_eq!(clock.now(), 1_000);
        clock.pause_for(Duration::from_nanos(100));
        base.advance(Duration::from_nanos(60));
        assert_eq!(clock.now(), 1_000);
        assert_eq!(clock.paused_for(), Duration::from_nanos(40));
        assert_eq!(clock.real_wait_until(1_010), Duration::from_nanos(50));
        // Extending a pause in progress.
        clock.pause_for(Duration::from_nanos(100));
        base.advance(Duration::from_nanos(100));
        assert_eq!(clock.now(), 1_000);
        base.advance(Duration::from_nanos(10));
        assert_eq!(clock.now(), 1_010);
        // A second pause adds up.
        clock.pause_for(Duration::from_nanos(5));
        base.advance(Duration::from_nanos(20));
        assert_eq!(clock.now(), 1_025);
        assert_eq!(clock.paused_for(), Duration::ZERO);
        assert_eq!(clock.real_wait_until(1_025), Duration::ZERO);
    }
}
