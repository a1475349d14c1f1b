//! The answer to "may this go through?": [`Decision`].

use std::time::Duration;

use crate::clock::Nanos;
use crate::quota::Quota;

/// The outcome of asking a limit for `cost` units.
///
/// A denial is a value, not an error: `allowed` is `false` and `retry_after` says how long until
/// the same cost would be allowed (if nothing else takes units meanwhile).
///
/// `remaining` counts down from [`burst`](Self::burst) (the quota's capacity), which may be
/// larger than [`limit`](Self::limit) (units per period): a token bucket of 100 per second with
/// bursts of 200 starts at `remaining: 199` after one request.
///
/// ```
/// use flowgate::{Quota, RateLimiter};
/// let limiter = RateLimiter::new(Quota::per_second(2));
/// assert!(limiter.check().allowed);
/// let second = limiter.check();
/// assert_eq!((second.allowed, second.remaining, second.burst), (true, 0, 2));
/// let third = limiter.check();
/// assert!(!third.allowed && third.retry_after > std::time::Duration::ZERO);
/// ```
#[must_use = "a decision says whether the request may go through"]
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the units were granted.
    pub allowed: bool,
    /// The quota's limit (units per period), for `RateLimit-Policy`'s `q`.
    pub limit: u64,
    /// The quota's capacity: the most units that can be taken at once, and so the most
    /// `remaining` can ever be. Equals `limit` for the window algorithms.
    pub burst: u64,
    /// Whole units that could still be taken right now, after this call.
    pub remaining: u64,
    /// Time until the limit is fully replenished (bucket full, window over, log empty); zero
    /// when it already is.
    pub reset_after: Duration,
    /// When denied: time until `cost` units would be granted. Zero when allowed — except for
    /// a charge ([`Ask::charge`](crate::store::Ask::charge)), which is always allowed and
    /// says here how long until the key is out of the debt it ran into.
    pub retry_after: Duration,
    /// Set when the store could not be asked and a [`FailMode`] decided instead.
    pub fallback: Option<FailMode>,
}

impl Decision {
    /// A granted request under `quota`.
    #[inline]
    pub(crate) fn allow(quota: &Quota, remaining: u64, reset_after: Nanos) -> Self {
        Decision {
            allowed: true,
            limit: quota.limit(),
            burst: quota.burst(),
            remaining,
            reset_after: Duration::from_nanos(reset_after),
            retry_after: Duration::ZERO,
            fallback: None,
        }
    }

    /// A denied request under `quota`. `retry_after` is never zero: a denial always has
    /// something to wait for.
    #[inline]
    pub(crate) fn deny(
        quota: &Quota,
        remaining: u64,
        reset_after: Nanos,
        retry_after: Nanos,
    ) -> Self {
        Decision {
            allowed: false,
            limit: quota.limit(),
            burst: quota.burst(),
            remaining,
            reset_after: Duration::from_nanos(reset_after),
            retry_after: Duration::from_nanos(retry_after.max(1)),
            fallback: None,
        }
    }

    /// What the renderer reports for a blocklist (zero units per `period`): nothing is left,
    /// and the request may try again after `period`.
    #[cfg(feature = "answer")]
    pub(crate) fn blocked(period: Duration) -> Self {
        Decision {
            allowed: false,
            limit: 0,
            burst: 0,
            remaining: 0,
            reset_after: period,
            retry_after: period.max(Duration::from_nanos(1)),
            fallback: None,
        }
    }

    /// The answer to a charge: this peek at the state after it, with `allowed` set (the
    /// charge was taken); `retry_after` stays the time until the key is out of debt.
    #[inline]
    pub(crate) fn charged(mut self) -> Self {
        self.allowed = true;
        self
    }

    /// A decision taken by a [`FailMode`] instead of the store, marked as such.
    pub(crate) fn with_fallback(mut self, mode: FailMode) -> Self {
        self.fallback = Some(mode);
        self
    }

    /// [`retry_after`](Self::retry_after) in whole seconds rounded up, as `Retry-After` wants:
    /// never 0 while denied, 0 when allowed.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after)
    }

    /// [`reset_after`](Self::reset_after) in whole seconds, rounded up.
    pub fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after)
    }
}

/// `d` in whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A denial from a limiter's leanest check ([`try_check`](crate::RateLimiter::try_check)):
/// only how long to wait, like governor's `NotUntil`.
///
/// ```
/// use flowgate::{Quota, RateLimiter};
/// let limiter = RateLimiter::new(Quota::per_hour(1));
/// assert!(limiter.try_check().is_ok());
/// let denied = limiter.try_check().unwrap_err();
/// assert!(denied.retry_after > std::time::Duration::from_secs(3500));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("rate limited: retry after {retry_after:?}")]
pub struct Denied {
    /// Time until the same request would be granted (never zero).
    pub retry_after: Duration,
}

impl Denied {
    #[inline]
    pub(crate) fn after(wait: Nanos) -> Self {
        Denied {
            retry_after: Duration::from_nanos(wait.max(1)),
        }
    }
}

/// What to do when the shared store cannot be reached (timeout, connection refused, open
/// circuit breaker). Applied by [`FallbackStore`](crate::store::FallbackStore), per request
/// ([`Ask::fail`](crate::store::Ask::fail)) or by the store's default.
///
/// The default is [`Open`](FailMode::Open) everywhere (the fallback store, the service's
/// `--fail`): a rate limiter that is down should not take the service it protects down with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FailMode {
    /// Allow the request: availability over enforcement.
    #[default]
    Open,
    /// Deny the request: enforcement over availability.
    Closed,
    /// Decide with an in-process limiter holding this instance's share of the quota.
    Local,
}

impl FailMode {
    /// The name used in configuration and metrics: `open`, `closed` or `local`.
    pub const fn name(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
            FailMode::Local => "local",
        }
    }
}

impl std::str::FromStr for FailMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(FailMode::Open),
            "closed" => Ok(FailMode::Closed),
            "local" => Ok(FailMode::Local),
            other => Err(format!(
                "unknown fail mode `{other}`; expected open, closed or local"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_round_up_and_are_never_zero_when_denied() {
        let q = Quota::per_second(1);
        let d = Decision::deny(&q, 0, 0, 1);
        assert_eq!(d.retry_after_secs(), 1);
        let d = Decision::deny(&q, 0, 0, 0);
        assert_eq!(d.retry_after, Duration::from_nanos(1));
        assert_eq!(d.retry_after_secs(), 1);
        let d = Decision::deny(&q, 0, 0, 2_000_000_000);
        assert_eq!(d.retry_after_secs(), 2);
        let d = Decision::deny(&q, 0, 0, 2_000_000_001);
        assert_eq!(d.retry_after_secs(), 3);
        assert_eq!(Decision::allow(&q, 0, 5).retry_after_secs(), 0);
    }

    #[cfg(feature = "answer")]
    #[test]
    fn a_blocklist_leaves_nothing_and_retries_after_its_period() {
        let blocked = Decision::blocked(Duration::from_secs(60));
        assert_eq!((blocked.limit, blocked.retry_after_secs()), (0, 60));
    }
}
