//! What is offered to the limiters: [`Traffic`] (requests in time order, their keys) and how
//! clients react to a denial ([`Retry`]).

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::Nanos;

/// A key's number in its [`Traffic`]: the index of its name in [`Traffic::keys`].
pub type KeyId = u32;

/// One request as first offered (a retry of it is scheduled by the simulation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// When it arrives, in nanoseconds since the Unix epoch (the same time line as every
    /// [`Clock`](crate::clock::Clock), so fixed windows fall where they would in production).
    pub at: Nanos,
    /// Whose request it is.
    pub key: KeyId,
    /// Units it asks for (at least 1).
    pub cost: u64,
    /// The line of the trace file it came from (1-based), or 0 for generated traffic: what
    /// errors about this request name.
    pub line: u32,
}

/// What a client does when it is denied.
///
/// ```
/// use std::time::Duration;
/// use flowgate::simulate::Retry;
/// // A client that tries 5 times, one second apart, whatever it is told:
/// let naive = Retry::Fixed { delay: Duration::from_secs(1), attempts: 5 };
/// // One that waits as long as `Retry-After` says (whole seconds, rounded up):
/// let polite = Retry::RetryAfter { attempts: 5 };
/// assert_ne!(naive, polite);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retry {
    /// Gives up at the first denial.
    #[default]
    Never,
    /// Tries again `delay` after each denial, up to `attempts` tries in all.
    Fixed {
        /// Time between a denial and the next try.
        delay: Duration,
        /// Tries in all, the first included (at least 1).
        attempts: u32,
    },
    /// Tries again after the denial's `Retry-After` (its `retry_after` in whole seconds,
    /// rounded up, as the HTTP header carries it), up to `attempts` tries in all.
    RetryAfter {
        /// Tries in all, the first included (at least 1).
        attempts: u32,
    },
}

impl Retry {
    /// Tries in all, the first included.
    pub fn attempts(&self) -> u32 {
        match *self {
            Retry::Never => 1,
            Retry::Fixed { attempts, .. } | Retry::RetryAfter { attempts } => attempts.max(1),
        }
    }
}

/// Requests in time order, each for a key, and what their clients do when denied.
///
/// Built from a built-in [`Scenario`](super::Scenario), a CSV trace
/// ([`Traffic::from_csv`]) or by hand:
///
/// ```
/// use flowgate::simulate::Traffic;
/// let mut traffic = Traffic::new("by hand");
/// traffic.push(2_000_000_000, "bob", 1);
/// traffic.push(1_000_000_000, "alice", 3);
/// assert_eq!(traffic.len(), 2);
/// assert_eq!(traffic.keys(), ["bob", "alice"]);
/// // Kept in time order:
/// assert_eq!(traffic.arrivals()[0].cost, 3);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Traffic {
    /// What the traffic is, for reports (a scenario's name, a file name).
    name: String,
    /// Key names, by [`KeyId`].
    keys: Vec<String>,
    /// Key names to ids, while building.
    ids: HashMap<String, KeyId>,
    /// The requests, sorted by time (stable: equal times keep the order they were pushed in).
    arrivals: Vec<Arrival>,
    /// The retry behaviour of every client.
    retry: Retry,
    /// When the traffic starts, for charts: the first arrival unless set earlier.
    start: Option<Nanos>,
    /// When it ends, for charts: the last arrival unless set later.
    end: Option<Nanos>,
}

impl Traffic {
    /// No requests yet; clients that never retry.
    pub fn new(name: impl Into<String>) -> Self {
        Traffic {
            name: name.into(),
            ..Traffic::default()
        }
    }

    /// The same traffic with clients that retry as `retry` says.
    pub fn with_retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the span reported and charted, e.g. a scenario's whole length when its last
    /// request comes early. Arrivals outside it still count; the span grows to hold them.
    pub fn with_span(mut self, start: Nanos, end: Nanos) -> Self {
        self.start = Some(start);
        self.end = Some(end.max(start));
        self
    }

    /// Adds a request for `key` at `at` (nanoseconds since the Unix epoch) asking for `cost`
    /// units. Requests may be pushed in any order (one pushed before earlier ones costs a
    /// move of those after it); requests at the same time keep the order they were pushed in.
    pub fn push(&mut self, at: Nanos, key: &str, cost: u64) {
        let key = self.intern(key);
        let arrival = Arrival {
            at,
            key,
            cost,
            line: 0,
        };
        if self.arrivals.last().is_none_or(|last| last.at <= at) {
            self.arrivals.push(arrival);
        } else {
            // After every request at or before `at`: equal times keep the order pushed.
            let index = self.arrivals.partition_point(|a| a.at <= at);
            self.arrivals.insert(index, arrival);
        }
    }

    /// Sorts arrivals pushed with [`push_unsorted`](Self::push_unsorted) into time order
    /// (stably).
    pub(super) fn sort(&mut self) {
        self.arrivals.sort_by_key(|a| a.at);
    }

    /// Appends a request without keeping time order: for parsers, which call
    /// [`sort`](Self::sort) once at the end.
    pub(super) fn push_unsorted(&mut self, at: Nanos, key: &str, cost: u64, line: u32) {
        let key = self.intern(key);
        self.arrivals.push(Arrival {
            at,
            key,
            cost,
            line,
        });
    }

    fn intern(&mut self, key: &str) -> KeyId {
        match self.ids.get(key) {
            Some(&id) => id,
            None => {
                let id = self.keys.len() as KeyId;
                self.keys.push(key.to_owned());
                self.ids.insert(key.to_owned(), id);
                id
            }
        }
    }

    /// The traffic's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Key names; [`Arrival::key`] indexes them.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The requests, in time order.
    pub fn arrivals(&self) -> &[Arrival] {
        &self.arrivals
    }

    /// Requests offered (retries not counted).
    pub fn len(&self) -> usize {
        self.arrivals.len()
    }

    /// Whether there are no requests.
    pub fn is_empty(&self) -> bool {
        self.arrivals.is_empty()
    }

    /// How clients retry.
    pub fn retry(&self) -> Retry {
        self.retry
    }

    /// When the traffic starts: the span's start or the first arrival, whichever is earlier
    /// (0 for no traffic).
    pub fn start(&self) -> Nanos {
        let first = self.arrivals.first().map(|a| a.at);
        match (self.start, first) {
            (Some(s), Some(f)) => s.min(f),
            (s, f) => s.or(f).unwrap_or(0),
        }
    }

    /// When the traffic ends: the span's end or the last arrival, whichever is later.
    pub fn end(&self) -> Nanos {
        let last = self.arrivals.last().map_or(0, |a| a.at);
        self.end.map_or(last, |e| e.max(last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_time_order_stably_and_interns_keys() {
        let mut t = Traffic::new("t");
        t.push(5, "a", 1);
        t.push(5, "b", 2);
        t.push(3, "a", 3);
        t.push(5, "c", 4);
        let order: Vec<(Nanos, u64)> = t.arrivals().iter().map(|a| (a.at, a.cost)).collect();
        assert_eq!(order, [(3, 3), (5, 1), (5, 2), (5, 4)]);
        assert_eq!(t.keys(), ["a", "b", "c"]);
        assert_eq!(t.arrivals()[0].key, 0);
        assert_eq!((t.start(), t.end()), (3, 5));
        let t = t.with_span(0, 100);
        assert_eq!((t.start(), t.end()), (0, 100));
    }

    #[test]
    fn attempts_are_at_least_one() {
        assert_eq!(Retry::Never.attempts(), 1);
        assert_eq!(Retry::RetryAfter { attempts: 0 }.attempts(), 1);
        let fixed = Retry::Fixed {
            delay: Duration::from_secs(1),
            attempts: 4,
        };
        assert_eq!(fixed.attempts(), 4);
    }
}
