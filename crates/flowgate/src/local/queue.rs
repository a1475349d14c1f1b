//! [`WaitQueue`]: the bounded queue of callers waiting for their turn — the one behind the
//! [`Shaper`](super::Shaper), the outbound layer's lanes and the simulator's shaper model.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Callers waiting for their turn, at most `max` at once. A caller holds a [`Place`] while it
/// waits; dropping the place — its turn came, it gave up, or its future was dropped — leaves
/// the queue. The order of turns is the bucket's (reservations are granted in call order);
/// the queue only bounds how many wait.
#[derive(Debug)]
pub(crate) struct WaitQueue {
    /// Most callers waiting at once.
    max: usize,
    /// Callers waiting now.
    waiting: AtomicUsize,
}

/// The queue was full: `max_queue` callers were already waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueFull {
    /// The queue's bound.
    pub(crate) max_queue: usize,
}

/// A caller's place in a [`WaitQueue`], given back on drop.
#[derive(Debug)]
pub(crate) struct Place(Arc<WaitQueue>);

impl WaitQueue {
    /// A queue for at most `max` callers (0: nobody may wait).
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(WaitQueue {
            max,
            waiting: AtomicUsize::new(0),
        })
    }

    /// Callers waiting now.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Takes a place, unless `max` callers are waiting already.
    pub(crate) fn join(self: &Arc<Self>) -> Result<Place, QueueFull> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .map(|_| Place(self.clone()))
            .map_err(|_| QueueFull {
                max_queue: self.max,
            })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_given_back() {
        let queue = WaitQueue::new(2);
        let a = queue.join().unwrap();
        let b = queue.join().unwrap();
        assert_eq!(queue.join().unwrap_err(), QueueFull { max_queue: 2 });
        assert_eq!(queue.len(), 2);
        drop(a);
        let c = queue.join().unwrap();
        drop((b, c));
        assert_eq!(queue.len(), 0);
        assert!(WaitQueue::new(0).join().is_err());
    }
}
