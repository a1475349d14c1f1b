//! What a limit allows: [`Quota`] (limit per period, burst, algorithm) and [`Algorithm`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::calendar::Calendar;
use crate::clock::Nanos;

/// `d` in nanoseconds, saturating (a `const` form of [`crate::clock::nanos`]).
const fn duration_nanos(d: Duration) -> Nanos {
    let n = d.as_nanos();
    if n > Nanos::MAX as u128 {
        Nanos::MAX
    } else {
        n as Nanos
    }
}

/// The largest span of time a quota may cover (its period, or `burst × interval`): 2^61 ns,
/// about 73 years. Keeping spans this small leaves the top bits of a time stamp free, so sums
/// like `now + span` can never overflow before the year 2262.
pub const MAX_SPAN: Nanos = 1 << 61;

/// Which algorithm enforces a [`Quota`].
///
/// | algorithm | state per key | exact? | bursts |
/// |---|---|---|---|
/// | [`Gcra`](Algorithm::Gcra) | one time stamp | yes: ≤ `burst + rate·t` in any `t` | up to `burst` |
/// | [`LeakyBucket`](Algorithm::LeakyBucket) | level + time stamp | same decisions as GCRA | up to `burst` |
/// | [`FixedWindow`](Algorithm::FixedWindow) | window + count | ≤ `limit` per aligned window; up to 2× across a boundary | |
/// | [`SlidingWindow`](Algorithm::SlidingWindow) | window + 2 counts | approximate: < 2 × `limit` in any window, ≈ `limit` for steady traffic | |
/// | [`SlidingLog`](Algorithm::SlidingLog) | ≤ `limit` time stamps | yes: ≤ `limit` in any window of `period` | |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Generic cell rate algorithm: a token bucket kept as one "theoretical arrival time".
    #[default]
    Gcra,
    /// Leaky bucket as a meter (ITU-T I.371 continuous-state form): the bucket's level drains
    /// at `limit / period`; a request that would overflow `burst` is denied. For queueing
    /// instead of denying, see the shaper in [`crate::local`].
    LeakyBucket,
    /// At most `limit` units per window of `period`, windows aligned to the Unix epoch — or,
    /// for a calendar quota (`Quota::per_calendar`, feature `calendar`), per calendar day,
    /// week, month or year in a time zone.
    FixedWindow,
    /// The current window's count plus the previous window's, weighted by how much of it still
    /// overlaps the sliding window (Cloudflare's sliding-window counter).
    SlidingWindow,
    /// The time stamp of every admitted request in the last `period`: exact, memory grows
    /// with `limit`.
    SlidingLog,
}

impl Algorithm {
    /// Every algorithm, in a fixed order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ];

    /// The algorithm's position in [`Algorithm::ALL`], for tables indexed by algorithm.
    pub(crate) const fn index(self) -> usize {
        match self {
            Algorithm::Gcra => 0,
            Algorithm::LeakyBucket => 1,
            Algorithm::FixedWindow => 2,
            Algorithm::SlidingWindow => 3,
            Algorithm::SlidingLog => 4,
        }
    }

    /// The algorithm's name as written in configuration files, e.g. `"sliding_window"`.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
        }
    }

    /// Whether the algorithm has a `burst` separate from its `limit` (the bucket algorithms).
    pub const fn has_burst(self) -> bool {
        matches!(self, Algorithm::Gcra | Algorithm::LeakyBucket)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown algorithm name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown algorithm `{0}`; expected one of gcra, token_bucket, leaky_bucket, fixed_window, sliding_window, sliding_log"
)]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    /// Parses a configuration name; `token_bucket` is accepted as another name for `gcra`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gcra" | "token_bucket" => Ok(Algorithm::Gcra),
            "leaky_bucket" => Ok(Algorithm::LeakyBucket),
            "fixed_window" => Ok(Algorithm::FixedWindow),
            "sliding_window" => Ok(Algorithm::SlidingWindow),
            "sliding_log" => Ok(Algorithm::SlidingLog),
            other => Err(UnknownAlgorithm(other.to_owned())),
        }
    }
}

/// Why a [`Quota`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// `limit` was 0. (To deny everything, don't build a quota: deny.)
    #[error("limit must be at least 1")]
    ZeroLimit,
    /// `period` was zero.
    #[error("period must be longer than zero")]
    ZeroPeriod,
    /// `burst` was 0.
    #[error("burst must be at least 1")]
    ZeroBurst,
    /// More than one event per nanosecond.
    #[error("{limit} per {period:?} is more than one per nanosecond")]
    RateTooHigh {
        /// The requested limit.
        limit: u64,
        /// The requested period.
        period: Duration,
    },
    /// The period, or `burst` intervals, would span more than [`MAX_SPAN`] (~73 years).
    #[error("the quota spans more than 73 years ({what})")]
    TooLong {
        /// Which span overflowed.
        what: &'static str,
    },
    /// A window algorithm was given a burst different from its limit.
    #[error("burst applies to gcra and leaky_bucket only; {algorithm} allows `limit` per window")]
    BurstNotApplicable {
        /// The window algorithm.
        algorithm: Algorithm,
    },
    /// Calendar periods are windows: only `fixed_window` enforces them.
    #[error("a calendar quota is a fixed window; {algorithm} cannot enforce calendar periods")]
    CalendarNeedsFixedWindow {
        /// The algorithm asked for.
        algorithm: Algorithm,
    },
    /// `sliding_window` keeps its counts in 32 bits.
    #[error("sliding_window supports limits up to {max}, got {limit}")]
    LimitTooLarge {
        /// The requested limit.
        limit: u64,
        /// The largest supported limit.
        max: u64,
    },
}

/// How much an [`Algorithm`] lets through: `limit` units per `period`, with bursts of up to
/// `burst` units.
///
/// Quotas are validated when built and are cheap to copy. The period can be any duration, not
/// only a second or a minute.
///
/// ```
/// use std::time::Duration;
/// use flowgate::{Algorithm, Quota};
///
/// // 100 requests per 5 minutes, bursts of 20, as a sliding log:
/// let quota = Quota::new(100, Duration::from_secs(300))?
///     .with_algorithm(Algorithm::SlidingLog)?;
/// assert_eq!(quota.limit(), 100);
///
/// // 10 per second with bursts of 20, token bucket:
/// let quota = Quota::per_second(10).with_burst(20)?;
/// assert_eq!(quota.emission_interval(), Duration::from_millis(100));
///
/// // Nonsense is rejected with a reason:
/// assert!(Quota::new(5, Duration::ZERO).is_err());
/// # Ok::<(), flowgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    /// Units allowed per period.
    limit: u64,
    /// The period, in nanoseconds.
    period: Nanos,
    /// Capacity: the most units that can be taken at once after a quiet spell.
    burst: u64,
    /// The algorithm that enforces the quota.
    algorithm: Algorithm,
    /// `period / limit` rounded up: the time one unit takes to replenish (GCRA's `T`).
    /// Rounding up means the quota errs on the side of admitting slightly less, never more.
    interval: Nanos,
    /// `burst × interval`: how far ahead of now the bucket may be filled (GCRA's `τ`).
    tolerance: Nanos,
    /// `⌊(2^64 − 1) / interval⌋`, so whole units in a span are a multiplication, not a
    /// division (a 64-bit divide costs more than the rest of a check).
    interval_reciprocal: u64,
    /// For a calendar quota, the calendar whose periods are the windows (`period` is then the
    /// unit's nominal length); `None` for windows of `period` aligned to the Unix epoch.
    calendar: Option<&'static Calendar>,
}

impl Quota {
    /// `limit` units per `period`, burst `limit`, algorithm [`Algorithm::Gcra`]. Fails for a
    /// zero limit or period, more than one unit per nanosecond, or a period over 73 years.
    pub const fn new(limit: u64, period: Duration) -> Result<Self, QuotaError> {
        Self::build(limit, duration_nanos(period), limit, Algorithm::Gcra, None)
    }

    /// `limit` units per period of `calendar` (per calendar day, ISO week, month or year in a
    /// time zone), enforced as a [fixed window](Algorithm::FixedWindow) whose windows are the
    /// calendar's periods: the count starts again at each local midnight that begins a period.
    ///
    /// ```
    /// use flowgate::calendar::{Calendar, CalendarUnit};
    /// use flowgate::Quota;
    ///
    /// let quota = Quota::per_calendar(10_000, Calendar::utc(CalendarUnit::Month))?;
    /// assert_eq!(quota.limit(), 10_000);
    /// assert_eq!(quota.calendar().unwrap().to_string(), "month@UTC");
    /// # Ok::<(), flowgate::QuotaError>(())
    /// ```
    #[cfg(feature = "calendar")]
    #[cfg_attr(docsrs, doc(cfg(feature = "calendar")))]
    pub fn per_calendar(limit: u64, calendar: &'static Calendar) -> Result<Self, QuotaError> {
        let period = calendar.unit().nominal_seconds() * 1_000_000_000;
        Self::build(limit, period, limit, Algorithm::FixedWindow, Some(calendar))
    }

    /// The calendar whose periods are this quota's windows, if it is a calendar quota
    /// ([`Quota::per_calendar`]).
    #[cfg(feature = "calendar")]
    #[cfg_attr(docsrs, doc(cfg(feature = "calendar")))]
    #[inline]
    pub fn calendar(&self) -> Option<&'static Calendar> {
        self.calendar
    }

    /// The calendar of a calendar quota, whatever the features (an uninhabited type without
    /// `calendar`).
    #[inline]
    pub(crate) fn window_calendar(&self) -> Option<&'static Calendar> {
        self.calendar
    }

    /// The same quota with another limit (and, for the bucket algorithms, burst): same period
    /// or calendar, same algorithm.
    pub fn with_limit(self, limit: u64, burst: u64) -> Result<Self, QuotaError> {
        let burst = if self.algorithm.has_burst() {
            burst
        } else {
            limit
        };
        Self::build(limit, self.period, burst, self.algorithm, self.calendar)
    }

    /// `limit` per second (burst `limit`, GCRA).
    ///
    /// The common quotas are built without a `Result`, as governor's are: the only invalid
    /// inputs are a limit of 0 and more than 10⁹ per second, which panic with a message — at
    /// compile time when used in a `const`:
    ///
    /// ```
    /// use flowgate::Quota;
    /// const PER_IP: Quota = Quota::per_second(50);
    /// assert_eq!(PER_IP.limit(), 50);
    /// ```
    ///
    /// # Panics
    ///
    /// If `limit` is 0 or above 1,000,000,000. Use [`Quota::new`] for a `Result` instead.
    pub const fn per_second(limit: u64) -> Self {
        Self::per(limit, 1)
    }

    /// `limit` per minute (burst `limit`, GCRA). Panics like [`per_second`](Self::per_second).
    pub const fn per_minute(limit: u64) -> Self {
        Self::per(limit, 60)
    }

    /// `limit` per hour (burst `limit`, GCRA). Panics like [`per_second`](Self::per_second).
    pub const fn per_hour(limit: u64) -> Self {
        Self::per(limit, 3_600)
    }

    /// `limit` per day (burst `limit`, GCRA). Panics like [`per_second`](Self::per_second).
    pub const fn per_day(limit: u64) -> Self {
        Self::per(limit, 86_400)
    }

    /// `limit` per `seconds`, panicking on an invalid quota.
    const fn per(limit: u64, seconds: u64) -> Self {
        match Self::build(limit, seconds * 1_000_000_000, limit, Algorithm::Gcra, None) {
            Ok(quota) => quota,
            Err(QuotaError::ZeroLimit) => {
                panic!("a quota's limit must be at least 1 (to deny everything, deny)")
            }
            Err(_) => panic!("a quota may not allow more than one unit per nanosecond"),
        }
    }

    /// The same quota with a different burst (capacity). Only GCRA and the leaky bucket have a
    /// burst separate from the limit.
    pub fn with_burst(self, burst: u64) -> Result<Self, QuotaError> {
        Self::build(
            self.limit,
            self.period,
            burst,
            self.algorithm,
            self.calendar,
        )
    }

    /// The same quota enforced by another algorithm. Switching to a window algorithm resets the
    /// burst to the limit.
    pub fn with_algorithm(self, algorithm: Algorithm) -> Result<Self, QuotaError> {
        let burst = if algorithm.has_burst() {
            self.burst
        } else {
            self.limit
        };
        Self::build(self.limit, self.period, burst, algorithm, self.calendar)
    }

    const fn build(
        limit: u64,
        period: Nanos,
        burst: u64,
        algorithm: Algorithm,
        calendar: Option<&'static Calendar>,
    ) -> Result<Self, QuotaError> {
        if calendar.is_some() && !matches!(algorithm, Algorithm::FixedWindow) {
            return Err(QuotaError::CalendarNeedsFixedWindow { algorithm });
        }
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if period == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        if period > MAX_SPAN {
            return Err(QuotaError::TooLong { what: "period" });
        }
        if limit > period {
            return Err(QuotaError::RateTooHigh {
                limit,
                period: Duration::from_nanos(period),
            });
        }
        if !algorithm.has_burst() && burst != limit {
            return Err(QuotaError::BurstNotApplicable { algorithm });
        }
        if matches!(algorithm, Algorithm::SlidingWindow) && limit > u32::MAX as u64 {
            return Err(QuotaError::LimitTooLarge {
                limit,
                max: u32::MAX as u64,
            });
        }
        let interval = period.div_ceil(limit);
        let tolerance = match burst.checked_mul(interval) {
            Some(t) if t <= MAX_SPAN => t,
            _ => return Err(QuotaError::TooLong { what: "burst" }),
        };
        Ok(Quota {
            limit,
            period,
            burst,
            algorithm,
            interval,
            tolerance,
            interval_reciprocal: u64::MAX / interval,
            calendar,
        })
    }

    /// Units allowed per period.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period over which `limit` applies.
    #[inline]
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period)
    }

    /// The period in nanoseconds.
    #[inline]
    pub(crate) fn period_nanos(&self) -> Nanos {
        self.period
    }

    /// The most units that can be taken at once after a quiet spell. Equals `limit` for the
    /// window algorithms. A request costing more is an error, not a denial.
    #[inline]
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The algorithm enforcing this quota.
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The time one unit takes to replenish: `period / limit`, rounded up to the nanosecond.
    #[inline]
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    /// [`emission_interval`](Self::emission_interval) in nanoseconds.
    #[inline]
    pub(crate) fn interval_nanos(&self) -> Nanos {
        self.interval
    }

    /// `burst × emission_interval`, in nanoseconds: the bucket algorithms' capacity in time.
    #[inline]
    pub(crate) fn tolerance_nanos(&self) -> Nanos {
        self.tolerance
    }

    /// Whole units that replenish in `span` nanoseconds: `⌊span / interval⌋`, computed by
    /// multiplying with the precomputed reciprocal and correcting the estimate once (it is
    /// never more than one too small).
    #[inline]
    pub(crate) fn units_in(&self, span: Nanos) -> u64 {
        let estimate = ((u128::from(span) * u128::from(self.interval_reciprocal)) >> 64) as u64;
        if span - estimate * self.interval >= self.interval {
            estimate + 1
        } else {
            estimate
        }
    }

    /// Checks that `cost` units can ever be granted at once.
    #[inline]
    pub fn check_cost(&self, cost: u64) -> Result<(), InsufficientCapacity> {
        if cost > self.burst {
            Err(InsufficientCapacity {
                cost,
                capacity: self.burst,
            })
        } else {
            Ok(())
        }
    }
}

/// A request asked for more units than the quota can ever grant at once (`cost > burst`).
///
/// This is an error rather than a denial because waiting would not help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a cost of {cost} can never be granted: the quota's capacity is {capacity}")]
pub struct InsufficientCapacity {
    /// The requested cost.
    pub cost: u64,
    /// The quota's capacity (burst).
    pub capacity: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_nonsense_with_a_reason() {
        let s = Duration::from_secs(1);
        assert_eq!(Quota::new(0, s), Err(QuotaError::ZeroLimit));
        assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
        assert_eq!(
            Quota::per_second(1).with_burst(0),
            Err(QuotaError::ZeroBurst)
        );
        assert!(matches!(
            Quota::new(2_000_000_000, s),
            Err(QuotaError::RateTooHigh { .. })
        ));
        assert_eq!(
            Quota::new(1, Duration::from_secs(u64::MAX)),
            Err(QuotaError::TooLong { what: "period" })
        );
        assert_eq!(
            Quota::per_second(1).with_burst(u64::MAX),
            Err(QuotaError::TooLong { what: "burst" })
        );
        let window = Quota::new(10, s)
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap();
        assert_eq!(
            window.with_burst(20),
            Err(QuotaError::BurstNotApplicable {
                algorithm: Algorithm::FixedWindow
            })
        );
        assert!(matches!(
            Quota::new(u64::from(u32::MAX) + 1, Duration::from_secs(10))
                .unwrap()
                .with_algorithm(Algorithm::SlidingWindow),
            Err(QuotaError::LimitTooLarge { .. })
        ));
    }

    #[test]
    #[should_panic(expected = "at least 1")]
    fn the_infallible_constructors_panic_with_a_message() {
        let _ = Quota::per_minute(0);
    }

    #[test]
    fn interval_rounds_up_so_the_rate_never_exceeds_the_quota() {
        let q = Quota::new(3, Duration::from_secs(1)).unwrap();
        assert_eq!(q.interval_nanos(), 333_333_334);
        assert!(q.interval_nanos() * 3 >= 1_000_000_000);
        assert_eq!(q.tolerance_nanos(), 3 * 333_333_334);
    }

    #[test]
    fn units_in_matches_division() {
        for interval in [1u64, 2, 3, 7, 999, 1_000_000, 333_333_334, (1 << 61) / 3] {
            let q = Quota::new(1, Duration::from_nanos(interval)).unwrap();
            assert_eq!(q.interval_nanos(), interval);
            for span in [
                0,
                1,
                interval - 1,
                interval,
                interval + 1,
                5 * interval + 3,
                u64::MAX,
            ] {
                assert_eq!(q.units_in(span), span / interval, "{span} / {interval}");
            }
        }
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
        }
        assert_eq!("token_bucket".parse::<Algorithm>(), Ok(Algorithm::Gcra));
        assert!("fixed".parse::<Algorithm>().is_err());
    }

    #[test]
    fn switching_to_a_window_algorithm_resets_burst() {
        let q = Quota::per_second(10)
            .with_burst(30)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap();
        assert_eq!(q.burst(), 10);
        assert_eq!(q.check_cost(11).unwrap_err().capacity, 10);
    }
}
