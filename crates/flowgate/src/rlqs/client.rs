//! The client side of RLQS: what Envoy's `rate_limit_quota` filter does with each bucket, as
//! its API documentation describes it, as a pure state machine on an injected time. The
//! service's tests, `flowgate loadgen --rlqs` and `flowgate simulate`'s `rlqs` deployment all
//! drive fleets of these.
//!
//! * The first request matched into a bucket creates it in the "no assignment" state
//!   (`no_assignment_behavior`, allow all by default) and is reported at once
//!   ([`QuotaClient::take_first_reports`]); from then on every bucket is reported each
//!   interval ([`QuotaClient::take_reports`]), with the requests allowed and denied since the
//!   last report.
//! * An assignment ([`QuotaClient::assign`]) becomes the bucket's active one. A token bucket
//!   starts full; an assignment equal to the active one only extends its time to live (the
//!   bucket keeps its tokens), any other replaces it. A time to live of zero expires at once;
//!   none never expires.
//! * When the active assignment expires, `expired_assignment_behavior` applies (a fallback
//!   strategy, or the last assignment reused) for its timeout; without one, or after it, the
//!   bucket is abandoned.
//! * An abandon action ([`QuotaClient::abandon`]) erases the bucket: the next request
//!   matched into it starts over as the first.
//!
//! Token buckets are kept exactly (integer arithmetic), refilled continuously at
//! `tokens_per_fill` per `fill_interval`, where Envoy counts the fill interval in whole
//! seconds.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::{Nanos, nanos};

/// A token bucket as an assignment describes it (Envoy's `TokenBucket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    /// Capacity, and the tokens a new bucket starts with.
    pub max_tokens: u64,
    /// Tokens added per `fill_interval`.
    pub tokens_per_fill: u64,
    /// The fill interval (Envoy uses its whole seconds; less than one second counts as one).
    pub fill_interval: Duration,
}

/// What a bucket does with requests (Envoy's `RateLimitStrategy`, as the filter implements
/// it: blanket rules and token buckets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Allow every request.
    AllowAll,
    /// Deny every request.
    DenyAll,
    /// Allow a request when the bucket has a token.
    TokenBucket(TokenBucket),
}

impl Strategy {
    /// The token bucket enforcing `share` of a rule whose period is `period`: Envoy fills
    /// `tokens_per_fill` every `fill_interval` of whole seconds, so the interval is the period
    /// rounded up to whole seconds and the tokens scaled down to it — never a faster rate than
    /// the share. Tokens beyond `u32::MAX` per interval are capped (Envoy's field size). A
    /// share of no tokens denies everything.
    ///
    /// ```
    /// use std::time::Duration;
    /// use flowgate::rlqs::Share;
    /// use flowgate::rlqs::client::{Strategy, TokenBucket};
    /// // 3 per 1.5 s: 4 tokens every 2 s.
    /// let s = Strategy::for_share(Share { tokens: 3, bucket: 1 }, Duration::from_millis(1500));
    /// assert_eq!(s, Strategy::TokenBucket(TokenBucket {
    ///     max_tokens: 1,
    ///     tokens_per_fill: 4,
    ///     fill_interval: Duration::from_secs(2),
    /// }));
    /// ```
    pub fn for_share(share: super::Share, period: Duration) -> Strategy {
        if share.tokens == 0 {
            return Strategy::DenyAll;
        }
        let period_ns = period.as_nanos().max(1);
        let secs = period_ns.div_ceil(1_000_000_000).max(1);
        let per_fill = u128::from(share.tokens) * secs * 1_000_000_000 / period_ns;
        let cap = u128::from(u32::MAX);
        Strategy::TokenBucket(TokenBucket {
            max_tokens: share.bucket.min(u64::from(u32::MAX)),
            tokens_per_fill: u64::try_from(per_fill.clamp(1, cap)).unwrap_or(u64::from(u32::MAX)),
            fill_interval: Duration::from_secs(u64::try_from(secs).unwrap_or(u64::MAX)),
        })
    }
}

/// `expired_assignment_behavior`: what a bucket does once its assignment expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Apply `strategy` until `timeout` passes, then abandon the bucket.
    Fallback {
        /// The fallback strategy.
        strategy: Strategy,
        /// `expired_assignment_behavior_timeout`.
        timeout: Duration,
    },
    /// Keep applying the expired assignment until `timeout` passes, then abandon.
    ReuseLast {
        /// `expired_assignment_behavior_timeout`.
        timeout: Duration,
    },
}

/// A bucket's configured behaviours (Envoy's `RateLimitQuotaBucketSettings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSettings {
    /// `no_assignment_behavior`: until the first assignment arrives (default allow all).
    pub no_assignment: Strategy,
    /// `expired_assignment_behavior`; `None` abandons a bucket when its assignment expires.
    pub expired: Option<Expired>,
}

impl Default for BucketSettings {
    /// Allow all without an assignment; abandon on expiry (Envoy's defaults).
    fn default() -> Self {
        BucketSettings {
            no_assignment: Strategy::AllowAll,
            expired: None,
        }
    }
}

/// A bucket's usage since its last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage<K> {
    /// The bucket.
    pub bucket: K,
    /// Requests allowed.
    pub allowed: u64,
    /// Requests denied.
    pub denied: u64,
    /// Time since the bucket's last report (0 for the first).
    pub elapsed: Duration,
}

/// Where a bucket stands, for inspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No assignment received yet.
    NoAssignment,
    /// Under an active assignment.
    Active(Strategy),
    /// The assignment expired; the expired-assignment behaviour applies.
    Expired(Strategy),
}

/// A token bucket's state, exact: tokens in units of `1 / fill_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Limiter {
    spec: TokenBucket,
    /// The fill interval in ns (whole seconds, at least one).
    fill_ns: u128,
    /// Tokens × `fill_ns`.
    units: u128,
    /// When `units` was last brought up to date.
    at: Nanos,
}

impl Limiter {
    /// A full bucket.
    fn new(spec: TokenBucket, now: Nanos) -> Limiter {
        let fill_ns = u128::from(spec.fill_interval.as_secs().max(1)) * 1_000_000_000;
        Limiter {
            spec,
            fill_ns,
            units: u128::from(spec.max_tokens) * fill_ns,
            at: now,
        }
    }

    fn take(&mut self, now: Nanos) -> bool {
        let capacity = u128::from(self.spec.max_tokens) * self.fill_ns;
        let elapsed = u128::from(now.saturating_sub(self.at));
        self.units = (self.units + elapsed * u128::from(self.spec.tokens_per_fill)).min(capacity);
        self.at = self.at.max(now);
        if self.units >= self.fill_ns {
            self.units -= self.fill_ns;
            true
        } else {
            false
        }
    }
}

/// A strategy with its token bucket's state, when it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Applied {
    strategy: Strategy,
    limiter: Option<Limiter>,
}

impl Applied {
    fn new(strategy: Strategy, now: Nanos) -> Applied {
        let limiter = match strategy {
            Strategy::TokenBucket(spec) => Some(Limiter::new(spec, now)),
            _ => None,
        };
        Applied { strategy, limiter }
    }

    fn allows(&mut self, now: Nanos) -> bool {
        match (self.strategy, &mut self.limiter) {
            (Strategy::AllowAll, _) => true,
            (Strategy::DenyAll, _) => false,
            (Strategy::TokenBucket(_), Some(limiter)) => limiter.take(now),
            (Strategy::TokenBucket(_), None) => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    NoAssignment(Applied),
    Active {
        applied: Applied,
        /// When it expires; `None`: never.
        expires_at: Option<Nanos>,
    },
    Expired {
        applied: Applied,
        /// When the bucket is abandoned.
        until: Nanos,
    },
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    state: State,
    allowed: u64,
    denied: u64,
    last_report: Nanos,
}

/// One Envoy's buckets under its filter's settings. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use flowgate::rlqs::client::{BucketSettings, QuotaClient, Strategy, TokenBucket};
/// const S: u64 = 1_000_000_000;
/// let mut envoy = QuotaClient::new(BucketSettings::default());
/// assert!(envoy.request(&"api", 0)); // no assignment: allowed, and reported at once
/// assert_eq!(envoy.take_first_reports().len(), 1);
/// let one_per_second = TokenBucket {
///     max_tokens: 1,
///     tokens_per_fill: 1,
///     fill_interval: Duration::from_secs(1),
/// };
/// envoy.assign(&"api", Strategy::TokenBucket(one_per_second), Some(Duration::from_secs(5)), 0);
/// assert!(envoy.request(&"api", 1));
/// assert!(!envoy.request(&"api", 2));
/// assert!(envoy.request(&"api", S + 1));
/// // Expired without an expired-assignment behaviour: abandoned, and the next request
/// // starts over.
/// assert!(envoy.request(&"api", 6 * S));
/// assert_eq!(envoy.take_first_reports().len(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct QuotaClient<K> {
    settings: BucketSettings,
    buckets: BTreeMap<K, Bucket>,
    /// Buckets created since the last [`QuotaClient::take_first_reports`].
    fresh: Vec<K>,
}

impl<K: Ord + Clone> QuotaClient<K> {
    /// An Envoy with no buckets yet, every bucket under `settings`.
    pub fn new(settings: BucketSettings) -> Self {
        QuotaClient {
            settings,
            buckets: BTreeMap::new(),
            fresh: Vec::new(),
        }
    }

    /// Decides one request matched into `bucket` at `now`, creating the bucket (and
    /// queueing its first report) if it is new.
    pub fn request(&mut self, bucket: &K, now: Nanos) -> bool {
        self.expire(bucket, now);
        let settings = self.settings;
        let entry = self.buckets.entry(bucket.clone()).or_insert_with(|| {
            self.fresh.push(bucket.clone());
            Bucket {
                state: State::NoAssignment(Applied::new(settings.no_assignment, now)),
                allowed: 0,
                denied: 0,
                last_report: now,
            }
        });
        let allowed = match &mut entry.state {
            State::NoAssignment(applied)
            | State::Active { applied, .. }
            | State::Expired { applied, .. } => applied.allows(now),
        };
        if allowed {
            entry.allowed += 1;
        } else {
            entry.denied += 1;
        }
        allowed
    }

    /// The first reports of buckets created since the last call (Envoy sends each at once).
    pub fn take_first_reports(&mut self) -> Vec<Usage<K>> {
        let fresh = std::mem::take(&mut self.fresh);
        fresh
            .into_iter()
            .filter_map(|key| {
                let bucket = self.buckets.get_mut(&key)?;
                let usage = Usage {
                    bucket: key,
                    allowed: std::mem::take(&mut bucket.allowed),
                    denied: std::mem::take(&mut bucket.denied),
                    elapsed: Duration::ZERO,
                };
                Some(usage)
            })
            .collect()
    }

    /// The periodic report at `now`: every bucket's usage since its last report, in key
    /// order (expired buckets are abandoned first).
    pub fn take_reports(&mut self, now: Nanos) -> Vec<Usage<K>> {
        let keys: Vec<K> = self.buckets.keys().cloned().collect();
        for key in &keys {
            self.expire(key, now);
        }
        self.fresh.clear();
        self.buckets
            .iter_mut()
            .map(|(key, bucket)| {
                let elapsed = Duration::from_nanos(now.saturating_sub(bucket.last_report));
                bucket.last_report = now;
                Usage {
                    bucket: key.clone(),
                    allowed: std::mem::take(&mut bucket.allowed),
                    denied: std::mem::take(&mut bucket.denied),
                    elapsed,
                }
            })
            .collect()
    }

    /// Applies an assignment for `bucket` at `now`, valid for `ttl` (`None`: no expiry).
    /// Returns whether the bucket exists (an assignment for an unknown bucket is ignored, as
    /// Envoy does) — and replaced its token bucket if it has one and it changed.
    pub fn assign(
        &mut self,
        bucket: &K,
        strategy: Strategy,
        ttl: Option<Duration>,
        now: Nanos,
    ) -> bool {
        self.expire(bucket, now);
        let Some(entry) = self.buckets.get_mut(bucket) else {
            return false;
        };
        let expires_at = ttl.map(|ttl| now.saturating_add(nanos(ttl)));
        entry.state = match entry.state {
            State::Active { applied, .. } if applied.strategy == strategy => State::Active {
                applied,
                expires_at,
            },
            _ => State::Active {
                applied: Applied::new(strategy, now),
                expires_at,
            },
        };
        self.expire(bucket, now);
        true
    }

    /// Erases `bucket` (an abandon action): its usage is dropped and the next request
    /// matched into it is a first one again.
    pub fn abandon(&mut self, bucket: &K) {
        self.buckets.remove(bucket);
        self.fresh.retain(|k| k != bucket);
    }

    /// Where `bucket` stands at `now`, if it exists.
    pub fn phase(&mut self, bucket: &K, now: Nanos) -> Option<Phase> {
        self.expire(bucket, now);
        self.buckets.get(bucket).map(|b| match b.state {
            State::NoAssignment(_) => Phase::NoAssignment,
            State::Active { applied, .. } => Phase::Active(applied.strategy),
            State::Expired { applied, .. } => Phase::Expired(applied.strategy),
        })
    }

    /// How many buckets exist.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no bucket exists.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Moves `bucket` through expiry and abandonment as due at `now`.
    fn expire(&mut self, bucket: &K, now: Nanos) {
        let expired = self.settings.expired;
        let Some(entry) = self.buckets.get_mut(bucket) else {
            return;
        };
        let abandon = loop {
            match entry.state {
                State::Active {
                    applied,
                    expires_at: Some(at),
                } if at <= now => {
                    entry.state = match expired {
                        None => break true,
                        Some(Expired::ReuseLast { timeout }) => State::Expired {
                            applied,
                            until: at.saturating_add(nanos(timeout)),
                        },
                        Some(Expired::Fallback { strategy, timeout }) => State::Expired {
                            applied: if applied.strategy == strategy {
                                applied
                            } else {
                                Applied::new(strategy, at)
                            },
                            until: at.saturating_add(nanos(timeout)),
                        },
                    };
                }
                State::Expired { until, .. } if until <= now => break true,
                _ => break false,
            }
        };
        if abandon {
            self.abandon(bucket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn bucket(max: u64, per_second: u64) -> Strategy {
        Strategy::TokenBucket(TokenBucket {
            max_tokens: max,
            tokens_per_fill: per_second,
            fill_interval: Duration::from_secs(1),
        })
    }

    #[test]
    fn a_token_bucket_starts_full_and_refills_at_its_rate() {
        let mut c = QuotaClient::new(BucketSettings::default());
        c.request(&1, 0);
        c.assign(&1, bucket(3, 10), None, 0);
        let admitted = (0..100).filter(|i| c.request(&1, i * S / 100)).count();
        // 3 at once, then 10 per second over the second.
        assert_eq!(admitted, 3 + 9);
        let reports = c.take_reports(S);
        assert_eq!((reports[0].allowed, reports[0].denied), (1 + 12, 88));
        assert_eq!(reports[0].elapsed, Duration::from_secs(1));
    }

    #[test]
    fn the_same_assignment_extends_and_keeps_tokens_a_new_one_refills() {
        let mut c = QuotaClient::new(BucketSettings::default());
        c.request(&1, 0);
        c.assign(&1, bucket(2, 1), Some(Duration::from_secs(2)), 0);
        assert!(c.request(&1, 0) && c.request(&1, 0) && !c.request(&1, 0));
        // Same strategy: extended, still empty.
        c.assign(&1, bucket(2, 1), Some(Duration::from_secs(2)), S / 2);
        assert!(!c.request(&1, S / 2));
        assert_eq!(c.phase(&1, 2 * S), Some(Phase::Active(bucket(2, 1))));
        // A different one: a new, full bucket.
        c.assign(&1, bucket(2, 2), Some(Duration::from_secs(2)), S / 2);
        assert!(c.request(&1, S / 2) && c.request(&1, S / 2));
    }

    #[test]
    fn expiry_follows_the_expired_assignment_behaviour_then_abandons() {
        let settings = BucketSettings {
            no_assignment: Strategy::DenyAll,
            expired: Some(Expired::Fallback {
                strategy: Strategy::AllowAll,
                timeout: Duration::from_secs(10),
            }),
        };
        let mut c = QuotaClient::new(settings);
        assert!(!c.request(&"b", 0));
        c.assign(&"b", Strategy::DenyAll, Some(Duration::ZERO), S);
        assert_eq!(c.phase(&"b", S), Some(Phase::Expired(Strategy::AllowAll)));
        assert!(c.request(&"b", 2 * S));
        assert_eq!(c.phase(&"b", 11 * S), None);
        // Starts over: no assignment, reported at once.
        c.take_first_reports();
        assert!(!c.request(&"b", 12 * S));
        assert_eq!(c.take_first_reports().len(), 1);

        let mut reuse = QuotaClient::new(BucketSettings {
            no_assignment: Strategy::AllowAll,
            expired: Some(Expired::ReuseLast {
                timeout: Duration::from_secs(1),
            }),
        });
        reuse.request(&0, 0);
        reuse.assign(&0, Strategy::DenyAll, Some(Duration::from_secs(1)), 0);
        assert_eq!(reuse.phase(&0, S), Some(Phase::Expired(Strategy::DenyAll)));
        assert!(!reuse.request(&0, S));
        assert_eq!(reuse.phase(&0, 2 * S), None);
    }

    #[test]
    fn unknown_buckets_ignore_assignments_and_abandon_erases() {
        let mut c: QuotaClient<u8> = QuotaClient::new(BucketSettings::default());
        assert!(!c.assign(&7, Strategy::DenyAll, None, 0));
        c.request(&7, 0);
        c.take_first_reports();
        assert!(c.assign(&7, Strategy::DenyAll, None, 0));
        assert!(!c.request(&7, 1));
        c.abandon(&7);
        assert!(c.is_empty());
        assert!(c.request(&7, 2));
        assert_eq!(c.take_first_reports()[0].allowed, 1);
    }
}
