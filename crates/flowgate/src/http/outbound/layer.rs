//! [`OutboundLimitLayer`]: the layer, its builder, and the per-upstream lanes it keeps.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use parking_lot::Mutex;
use tower_layer::Layer;

use super::OutboundLimit;
use super::clock::PausableClock;
use super::error::OutboundError;
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::http::key::{Host, KeyExtractor};
use crate::local::queue::{Place, WaitQueue};
use crate::local::{RateLimiter, ReserveError};
use crate::quota::{Algorithm, Quota};

/// Default [`max_delay`](OutboundLimitLayerBuilder::max_delay): 30 s.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(30);
/// Default [`max_queue`](OutboundLimitLayerBuilder::max_queue): 10 000 waiting requests per key.
pub const DEFAULT_MAX_QUEUE: usize = 10_000;
/// Default [`max_keys`](OutboundLimitLayerBuilder::max_keys): 10 000 upstreams.
pub const DEFAULT_MAX_UPSTREAMS: usize = 10_000;

/// Paces an HTTP client's requests: each key (by default each upstream host) gets its own
/// quota, and a request waits for its turn — first come, first served — instead of failing,
/// unless its turn is more than `max_delay` away. An upstream's `429`/`503` with `Retry-After`
/// pauses that key for as long as asked.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use std::time::Duration;
/// use flowgate::{clock::TokioClock, http::outbound::OutboundLimitLayer, Quota};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// // The SMS gateway allows 5 requests per second; never wait more than 2 s.
/// let layer = OutboundLimitLayer::builder(Quota::per_second(5).with_burst(1)?)
///     .max_delay(Duration::from_secs(2))
///     .clock(TokioClock::new())
///     .build();
/// let client = layer.layer(service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
/// }));
/// let start = tokio::time::Instant::now();
/// for _ in 0..3 {
///     let request = http::Request::get("https://sms.example/send").body(())?;
///     client.clone().oneshot(request).await?;
/// }
/// assert_eq!(start.elapsed(), Duration::from_millis(400));
/// # Ok(()) }
/// ```
pub struct OutboundLimitLayer<C: Clock = MonotonicClock> {
    /// Settings and lanes, shared by the services the layer makes.
    pacer: Arc<Pacer<C>>,
}

impl<C: Clock> Clone for OutboundLimitLayer<C> {
    fn clone(&self) -> Self {
        OutboundLimitLayer {
            pacer: self.pacer.clone(),
        }
    }
}

impl<C: Clock> std::fmt::Debug for OutboundLimitLayer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundLimitLayer")
            .field("quota", &self.pacer.quota)
            .field("max_delay", &self.pacer.max_delay)
            .finish_non_exhaustive()
    }
}

impl OutboundLimitLayer<MonotonicClock> {
    /// Paces every upstream host to `quota`, with the default maximum delay and queue.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder for the maximum delay and queue, per-key quotas, the key and the clock.
    pub fn builder(quota: Quota) -> OutboundLimitLayerBuilder<MonotonicClock> {
        OutboundLimitLayerBuilder {
            quota,
            quotas: HashMap::new(),
            key: Box::new(Host),
            max_delay: DEFAULT_MAX_DELAY,
            max_queue: DEFAULT_MAX_QUEUE,
            max_keys: DEFAULT_MAX_UPSTREAMS,
            clock: MonotonicClock::new(),
        }
    }
}

impl<C: Clock + Clone> OutboundLimitLayer<C> {
    /// How much longer `key` is paused by an upstream's `Retry-After` (zero if it is not).
    pub fn paused_for(&self, key: &str) -> Duration {
        self.pacer
            .lanes
            .lock()
            .get(key)
            .map_or(Duration::ZERO, |lane| lane.clock.paused_for())
    }

    /// Requests waiting for their turn on `key` now.
    pub fn queued(&self, key: &str) -> usize {
        self.pacer
            .lanes
            .lock()
            .get(key)
            .map_or(0, |lane| lane.queue.len())
    }
}

impl<S, C: Clock> Layer<S> for OutboundLimitLayer<C> {
    type Service = OutboundLimit<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        OutboundLimit::new(inner, self.pacer.clone())
    }
}

/// Builds an [`OutboundLimitLayer`].
pub struct OutboundLimitLayerBuilder<C> {
    quota: Quota,
    quotas: HashMap<String, Quota>,
    key: Box<dyn KeyExtractor>,
    max_delay: Duration,
    max_queue: usize,
    max_keys: usize,
    clock: C,
}

impl<C> std::fmt::Debug for OutboundLimitLayerBuilder<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundLimitLayerBuilder")
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

impl<C: Clock + Clone> OutboundLimitLayerBuilder<C> {
    /// The longest a request may wait for its turn; a request whose turn is further away fails
    /// at once with [`OutboundError::DelayTooLong`] (default [`DEFAULT_MAX_DELAY`]).
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// The most requests waiting per key; more fail with [`OutboundError::QueueFull`].
    pub fn max_queue(mut self, max_queue: usize) -> Self {
        self.max_queue = max_queue.max(1);
        self
    }

    /// The most keys tracked at once (idle ones are forgotten to make room).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// A different quota for `key` (e.g. `"api.bank.example"`): each upstream its own pace.
    pub fn quota_for(mut self, key: impl Into<String>, quota: Quota) -> Self {
        self.quotas.insert(key.into(), quota);
        self
    }

    /// Keys requests with `key` instead of by [`Host`].
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Box::new(key);
        self
    }

    /// Uses `clock` for pacing (e.g. [`TokioClock`](crate::clock::TokioClock) in tests with
    /// paused time).
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> OutboundLimitLayerBuilder<C2> {
        OutboundLimitLayerBuilder {
            quota: self.quota,
            quotas: self.quotas,
            key: self.key,
            max_delay: self.max_delay,
            max_queue: self.max_queue,
            max_keys: self.max_keys,
            clock,
        }
    }

    /// Builds the layer.
    pub fn build(self) -> OutboundLimitLayer<C> {
        // Waiting needs a bucket: window algorithms are paced as GCRA with the same rate.
        let bucket = |q: Quota| {
            if q.algorithm().has_burst() {
                q
            } else {
                q.with_algorithm(Algorithm::Gcra).unwrap_or(q)
            }
        };
        OutboundLimitLayer {
            pacer: Arc::new(Pacer {
                quota: bucket(self.quota),
                quotas: self
                    .quotas
                    .into_iter()
                    .map(|(k, q)| (k, bucket(q)))
                    .collect(),
                key: self.key,
                max_delay: self.max_delay,
                max_queue: self.max_queue,
                max_keys: self.max_keys,
                clock: self.clock,
                lanes: Mutex::new(HashMap::new()),
            }),
        }
    }
}

/// Settings and per-key lanes.
pub(crate) struct Pacer<C: Clock> {
    /// The quota of keys without their own.
    quota: Quota,
    /// Per-key quotas.
    quotas: HashMap<String, Quota>,
    /// Reads a request's key.
    pub(crate) key: Box<dyn KeyExtractor>,
    /// Longest wait for a turn.
    pub(crate) max_delay: Duration,
    /// Most waiting requests per key.
    max_queue: usize,
    /// Most keys tracked.
    max_keys: usize,
    /// Real time.
    clock: C,
    /// One lane per key.
    lanes: Mutex<HashMap<String, Arc<Lane<C>>>>,
}

/// One key's pace: a bucket on a clock that upstream pauses stop.
pub(crate) struct Lane<C: Clock> {
    /// Hands out turns.
    limiter: RateLimiter<PausableClock<C>>,
    /// The limiter's clock, to pause it.
    pub(crate) clock: PausableClock<C>,
    /// Requests holding a turn they have not used yet, at most `max_queue`.
    queue: Arc<WaitQueue>,
}

impl<C: Clock + Clone> Pacer<C> {
    /// The lane for `key`, made on first use.
    fn lane(&self, key: String) -> Result<Arc<Lane<C>>, OutboundError> {
        let mut lanes = self.lanes.lock();
        if let Some(lane) = lanes.get(&key) {
            return Ok(lane.clone());
        }
        if lanes.len() >= self.max_keys {
            // Forget lanes nobody holds, that are not paused and whose bucket is full again:
            // a fresh lane would decide exactly the same.
            lanes.retain(|_, lane| {
                Arc::strong_count(lane) > 1
                    || !lane.clock.paused_for().is_zero()
                    || lane.limiter.peek().remaining < lane.limiter.quota().burst()
            });
            if lanes.len() >= self.max_keys {
                return Err(OutboundError::TooManyKeys {
                    max_keys: self.max_keys,
                });
            }
        }
        let quota = self.quotas.get(&key).copied().unwrap_or(self.quota);
        let clock = PausableClock::new(self.clock.clone());
        let lane = Arc::new(Lane {
            limiter: RateLimiter::with_clock(quota, clock.clone()),
            clock,
            queue: WaitQueue::new(self.max_queue),
        });
        lanes.insert(key, lane.clone());
        Ok(lane)
    }

    /// Takes a turn for a request to `parts`' key, or says why it cannot have one.
    pub(crate) fn turn(&self, parts: &Parts, cost: u64) -> Result<Turn<C>, OutboundError> {
        let lane = self.lane(self.key.extract(parts)?)?;
        let paused = lane.clock.paused_for();
        if paused >= self.max_delay && !paused.is_zero() {
            return Err(OutboundError::Paused {
                remaining: paused,
                max_delay: self.max_delay,
            });
        }
        let place = lane.queue.join().map_err(|full| OutboundError::QueueFull {
            max_queue: full.max_queue,
        })?;
        // From here on, dropping `turn` leaves the queue (and refunds once armed).
        let mut turn = Turn {
            _place: place,
            lane,
            cost: 0,
            at: 0,
            deadline: tokio::time::Instant::now() + self.max_delay,
            max_delay: self.max_delay,
        };
        let reservation = turn
            .lane
            .limiter
            .reserve(cost, self.max_delay.saturating_sub(paused))
            .map_err(|e| match e {
                ReserveError::TooLong { wait, .. } => OutboundError::DelayTooLong {
                    delay: wait + paused,
                    max_delay: self.max_delay,
                },
                ReserveError::Capacity(c) => OutboundError::Capacity(c),
                // Every lane's quota is a bucket (see `build`).
                ReserveError::NotABucket(_) => OutboundError::DelayTooLong {
                    delay: Duration::MAX,
                    max_delay: self.max_delay,
                },
            })?;
        turn.at = turn.lane.clock.now() + crate::clock::nanos(reservation.delay());
        reservation.commit();
        turn.cost = cost;
        Ok(turn)
    }
}

/// A request's place in its lane's queue: units taken for a time on the lane's clock. Dropped
/// before it is used, it gives the units back.
pub(crate) struct Turn<C: Clock> {
    /// The lane.
    pub(crate) lane: Arc<Lane<C>>,
    /// Units taken (0 until taken, and after the turn is used).
    cost: u64,
    /// When the turn comes, on the lane's (pausable) clock.
    at: Nanos,
    /// The latest real time the request may leave.
    deadline: tokio::time::Instant,
    /// For the error.
    max_delay: Duration,
    /// The request's place in the lane's queue, left when the turn is dropped.
    _place: Place,
}

impl<C: Clock> Turn<C> {
    /// Waits for the turn, following pauses that begin meanwhile; fails if that would pass the
    /// deadline. Returns the lane, to report the response to.
    pub(crate) async fn wait(mut self) -> Result<Arc<Lane<C>>, OutboundError> {
        loop {
            let wait = self.lane.clock.real_wait_until(self.at);
            if wait.is_zero() {
                break;
            }
            if tokio::time::Instant::now() + wait > self.deadline {
                return Err(OutboundError::DelayTooLong {
                    delay: wait,
                    max_delay: self.max_delay,
                });
            }
            tokio::time::sleep(wait).await;
        }
        self.cost = 0;
        Ok(self.lane.clone())
    }
}

impl<C: Clock> Drop for Turn<C> {
    fn drop(&mut self) {
        if self.cost > 0 {
            self.lane.limiter.refund(self.cost);
        }
    }
}
