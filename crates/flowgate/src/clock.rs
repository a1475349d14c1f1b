//! Time sources.
//!
//! Every limiter and store reads time through a [`Clock`], so tests can drive time by hand
//! ([`ManualClock`]) and production code pays as little as possible per reading.
//!
//! Time is a [`Nanos`]: nanoseconds since the Unix epoch. [`MonotonicClock`] anchors itself to
//! the wall clock once, when the process first uses it, and then only moves forward, so fixed
//! windows line up with wall-clock minutes and hours while the clock itself never jumps back.
//!
//! Reading a precise clock costs more than the rest of a rate-limit check (the x86 `rdtsc`
//! instruction alone takes ~13 ns on the machine we measure on), so a clock also offers a
//! [`Clock::recent`] reading that is refreshed in the background and costs one atomic load.
//! A recent reading is never ahead of the true time and lags it by at most [`Clock::max_lag`].
//! Limiters decide on the recent reading and re-check with a precise one only when a request is
//! denied but would be allowed within `max_lag`; because every algorithm admits less when time
//! runs behind, a lagging reading can never admit more than the quota.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch. Fits until the year 2262.
pub type Nanos = u64;

/// A source of time for limiters and stores.
///
/// Implementations must be monotonic: `now()` never returns less than an earlier `now()`.
pub trait Clock: Send + Sync + 'static {
    /// The current time, precisely.
    fn now(&self) -> Nanos;

    /// A cheap reading that is never ahead of [`now`](Clock::now) and lags it by at most
    /// [`max_lag`](Clock::max_lag). Defaults to `now()`.
    #[inline]
    fn recent(&self) -> Nanos {
        self.now()
    }

    /// How far [`recent`](Clock::recent) may lag behind [`now`](Clock::now). Zero for clocks
    /// whose `recent()` is precise.
    #[inline]
    fn max_lag(&self) -> Nanos {
        0
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
    #[inline]
    fn recent(&self) -> Nanos {
        (**self).recent()
    }
    #[inline]
    fn max_lag(&self) -> Nanos {
        (**self).max_lag()
    }
}

/// How often the background thread refreshes [`MonotonicClock::recent`].
const TICK: Duration = Duration::from_millis(1);

/// The lag we promise for [`MonotonicClock::recent`]: ten ticks, which leaves room for the
/// refresh thread being scheduled late on a busy machine. Should it be later still, the only
/// effect is that a request is denied a few milliseconds early; nothing is ever over-admitted.
const MAX_LAG: Nanos = 10 * TICK.as_nanos() as Nanos;

/// The process-wide anchor: a TSC-based clock and the Unix time it corresponds to.
struct Anchor {
    /// Reads the CPU's time-stamp counter and scales it to nanoseconds (~13 ns a reading).
    clock: quanta::Clock,
    /// `clock.raw()` when the anchor was taken.
    raw_origin: u64,
    /// Unix time, in nanoseconds, when the anchor was taken.
    unix_origin: Nanos,
    /// The latest precise reading, refreshed every [`TICK`] by the refresh thread; what
    /// `recent()` returns. 0 until the thread's first reading.
    recent: AtomicU64,
}

/// The anchor, set once on first use.
static ANCHOR: OnceLock<Anchor> = OnceLock::new();

/// Whether the refresh thread has been started (or its start attempted).
static REFRESH_STARTED: AtomicBool = AtomicBool::new(false);

impl Anchor {
    #[inline(always)]
    fn get() -> &'static Anchor {
        match ANCHOR.get() {
            Some(anchor) => anchor,
            None => Self::init(),
        }
    }

    #[cold]
    fn init() -> &'static Anchor {
        ANCHOR.get_or_init(|| {
            let clock = quanta::Clock::new();
            let unix_origin = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as Nanos);
            Anchor {
                raw_origin: clock.raw(),
                clock,
                unix_origin,
                recent: AtomicU64::new(0),
            }
        })
    }

    /// `recent()` before the refresh thread's first reading: starts the thread (once), and
    /// answers with a precise reading that it also stores as the first `recent` value, so the
    /// readings that follow never fall behind it. If the thread cannot be started, `recent`
    /// goes back to 0 and every reading stays precise.
    #[cold]
    #[inline(never)]
    fn recent_before_refresh(&'static self) -> Nanos {
        let now = self.precise();
        if !REFRESH_STARTED.load(Ordering::Relaxed) && !REFRESH_STARTED.swap(true, Ordering::AcqRel)
        {
            self.recent.fetch_max(now, Ordering::Relaxed);
            // The thread holds only a `'static` reference and lives as long as the process.
            let spawned = std::thread::Builder::new()
                .name("flowgate-clock".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(TICK);
                        self.recent.fetch_max(self.precise(), Ordering::Relaxed);
                    }
                });
            if spawned.is_err() {
                self.recent.store(0, Ordering::Relaxed);
            }
        }
        now
    }

    #[inline]
    fn precise(&self) -> Nanos {
        let elapsed = self.clock.delta_as_nanos(self.raw_origin, self.clock.raw());
        self.unix_origin + elapsed
    }
}

/// The default clock: monotonic, anchored to Unix time when first used, with a cheap
/// [`recent`](Clock::recent) reading refreshed every millisecond by one background thread.
///
/// **The thread**: the first `recent()` reading in the process (a limiter's or the memory
/// store's first check) starts one thread, `flowgate-clock`, shared by every clock and limiter,
/// which wakes every millisecond to refresh the reading for the rest of the process. Creating
/// a `MonotonicClock` starts nothing, and `now()` never needs the thread. To have no thread at
/// all, give limiters a [`PreciseClock`] (each check then reads the time-stamp counter, ~13 ns).
///
/// ```
/// use flowgate::clock::{Clock, MonotonicClock};
/// let clock = MonotonicClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// assert!(clock.recent() <= clock.now());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    _private: (),
}

impl MonotonicClock {
    /// Returns the process-wide monotonic clock (anchoring it to Unix time on first use; the
    /// refresh thread starts with the first `recent()` reading).
    pub fn new() -> Self {
        Anchor::get();
        MonotonicClock { _private: () }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Nanos {
        Anchor::get().precise()
    }

    #[inline]
    fn recent(&self) -> Nanos {
        let anchor = Anchor::get();
        match anchor.recent.load(Ordering::Relaxed) {
            // The refresh thread has not read the clock yet, or could not be started.
            0 => anchor.recent_before_refresh(),
            recent => recent,
        }
    }

    #[inline]
    fn max_lag(&self) -> Nanos {
        MAX_LAG
    }
}

/// A clock that reads the precise time on every call: no background thread, ~13 ns a read.
#[derive(Debug, Clone, Copy, Default)]
pub struct PreciseClock {
    _private: (),
}

impl PreciseClock {
    /// Returns a precise clock on the same time line as [`MonotonicClock`].
    pub fn new() -> Self {
        PreciseClock { _private: () }
    }
}

impl Clock for PreciseClock {
    #[inline]
    fn now(&self) -> Nanos {
        Anchor::get().precise()
    }
}

/// A clock that only moves when told to: for tests and for replaying traces.
///
/// Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use flowgate::clock::{Clock, ManualClock};
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_micros(1));
/// assert_eq!(clock.now(), 2_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `start` until moved.
    pub fn new(start: Nanos) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = Nanos::try_from(by.as_nanos()).unwrap_or(Nanos::MAX);
        // Saturate rather than wrap: a test that advances past the year 2262 sees time stop.
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the time to `to`. Setting it backwards is allowed (to test that limiters cope), but
    /// real clocks never do that.
    pub fn set(&self, to: Nanos) {
        self.now.store(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}

/// A clock that follows tokio's timer, so that `tokio::time::pause()` and `advance()` drive the
/// limiters in tests of async code.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    /// tokio's time when this clock was made; readings are offsets from it.
    origin: tokio::time::Instant,
    /// The Unix time that `origin` stands for.
    unix_origin: Nanos,
}

#[cfg(feature = "tokio")]
impl TokioClock {
    /// A clock reading tokio's (possibly paused) time, anchored to the current Unix time.
    pub fn new() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
            unix_origin: MonotonicClock::new().now(),
        }
    }
}

#[cfg(feature = "tokio")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        let elapsed = tokio::time::Instant::now().duration_since(self.origin);
        self.unix_origin + Nanos::try_from(elapsed.as_nanos()).unwrap_or(Nanos::MAX / 2)
    }
}

/// Converts a [`Duration`] to [`Nanos`], saturating at `Nanos::MAX`.
#[inline]
pub fn nanos(d: Duration) -> Nanos {
    Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_is_unix_time_and_recent_lags_within_bound() {
        let clock = MonotonicClock::new();
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let now = clock.now();
        // Anchored to the wall clock: within a second of SystemTime.
        assert!(now.abs_diff(nanos(unix)) < 1_000_000_000);
        let recent = clock.recent();
        let after = clock.now();
        assert!(recent <= after);
        assert!(clock.max_lag() > 0);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(5);
        assert_eq!(clock.now(), 5);
        assert_eq!(clock.recent(), 5);
        clock.advance(Duration::from_nanos(10));
        assert_eq!(clock.clone().now(), 15);
        clock.set(3);
        assert_eq!(clock.now(), 3);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), Nanos::MAX);
    }
}
