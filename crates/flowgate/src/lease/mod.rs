//! In-flight (concurrency) limits: at most `limit` leases held on a key at once, each with an
//! expiry, so that a holder that crashes without releasing loses its slot when its lease
//! expires instead of leaking it.
//!
//! A rate limit counts requests as they start; a concurrency limit counts requests *in
//! flight* ("at most 20 requests per customer at once", Stripe's concurrent-requests limiter,
//! APISIX `limit-conn`). [`Leases::acquire`] takes a slot and returns a [`LeaseId`] with its
//! expiry, [`Leases::renew`] extends it (a long request renews before it expires),
//! [`Leases::release`] ends it. An expired lease is no longer counted, whoever held it.
//!
//! Two implementations: [`MemoryLeases`] (this process) and, with feature `redis`,
//! [`RedisLeases`](crate::store::redis::RedisLeases) — one sorted set of lease expiries per key,
//! cleaned as it is read, changed by one atomic script on the server's time, so every
//! instance sharing the Redis (or Redis Cluster) shares the limit.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use flowgate::clock::ManualClock;
//! use flowgate::lease::{Acquired, Leases, MemoryLeases, Terms};
//!
//! let clock = ManualClock::new(0);
//! let leases = MemoryLeases::with_clock(clock.clone());
//! let terms = Terms::new(2, Duration::from_secs(30))?;
//! let Acquired::Granted { id: first, .. } = leases.acquire("customer:42", &terms).await? else {
//!     panic!("a slot is free");
//! };
//! leases.acquire("customer:42", &terms).await?;
//! // Both slots are held: the third caller may retry when the first lease expires.
//! assert_eq!(
//!     leases.acquire("customer:42", &terms).await?,
//!     Acquired::Full { held: 2, retry_after: Duration::from_secs(30) }
//! );
//! assert!(leases.release("customer:42", first).await?);
//! assert!(matches!(leases.acquire("customer:42", &terms).await?, Acquired::Granted { held: 2, .. }));
//! // A holder that never comes back loses its slot when its lease expires.
//! clock.advance(Duration::from_secs(30));
//! assert_eq!(leases.held("customer:42").await?, 0);
//! # Ok(()) }
//! ```

mod memory;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use memory::{DEFAULT_MAX_KEYS, MemoryLeases};

use crate::store::{BoxFuture, StoreError};

/// The store key of the concurrency limit `name`'s leases for `key`, in the
/// [one key grammar](crate::store::key) (`lease:checkout|key=customer-42`): what the tower
/// layer ([`InFlightLayer`](crate::http::InFlightLayer)) and the service's `/v1/leases` hold
/// leases under.
///
/// ```
/// assert_eq!(flowgate::lease::key("checkout", "a|b"), r"lease:checkout|key=a\|b");
/// ```
pub fn key(name: &str, key: &str) -> String {
    let mut out = String::with_capacity(name.len() + key.len() + 12);
    crate::store::key::KeyWriter::tagged(&mut out, "lease", name).field("key", key);
    out
}

/// The most leases one key may hold at once.
pub const MAX_LIMIT: u64 = 1_000_000;

/// The shortest lease: a millisecond.
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// The longest lease: a day. A request in flight longer renews its lease.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);

/// A concurrency limit: at most `limit` leases on a key at once, each lasting `ttl` unless
/// renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    limit: u64,
    ttl: Duration,
}

/// Why [`Terms::new`] refused its arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TermsError {
    /// The limit is 0 or above [`MAX_LIMIT`].
    #[error("a concurrency limit must be between 1 and {MAX_LIMIT}, not {0}")]
    Limit(u64),
    /// The lease time is outside [`MIN_TTL`]..=[`MAX_TTL`].
    #[error("a lease must last between 1ms and 24h, not {0:?}")]
    Ttl(Duration),
}

impl Terms {
    /// At most `limit` leases at once, each lasting `ttl` (kept to whole microseconds, the
    /// precision every store keeps).
    pub fn new(limit: u64, ttl: Duration) -> Result<Self, TermsError> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(TermsError::Limit(limit));
        }
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(TermsError::Ttl(ttl));
        }
        let ttl = Duration::from_micros(ttl.as_micros() as u64);
        Ok(Terms { limit, ttl })
    }

    /// The most leases held at once.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How long a lease lasts unless renewed.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// A lease's identity: 128 random bits, written as 32 lowercase hex digits. Only its holder
/// knows it, so only its holder can renew or release it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(u128);

impl LeaseId {
    /// A new, unpredictable id.
    pub fn random() -> Self {
        use std::hash::{BuildHasher, Hasher};
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // Two SipHash outputs under fresh random keys (std's `RandomState`) of a counter.
        let half = || {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
            h.finish()
        };
        LeaseId((u128::from(half()) << 64) | u128::from(half()))
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

/// A text that is not a [`LeaseId`] (32 hex digits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a lease id is 32 hexadecimal digits")]
pub struct BadLeaseId;

impl FromStr for LeaseId {
    type Err = BadLeaseId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BadLeaseId);
        }
        u128::from_str_radix(s, 16)
            .map(LeaseId)
            .map_err(|_| BadLeaseId)
    }
}

/// What [`Leases::acquire`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// A slot was free: the lease `id`, held until `expires_in` from now unless renewed or
    /// released; `held` leases on the key now, this one included.
    Granted {
        /// The new lease.
        id: LeaseId,
        /// How long until it expires.
        expires_in: Duration,
        /// Leases held on the key now, this one included.
        held: u64,
    },
    /// Every slot is held; the earliest lease expires in `retry_after` (sooner if released).
    Full {
        /// Leases held on the key.
        held: u64,
        /// Until the earliest held lease expires.
        retry_after: Duration,
    },
}

impl Acquired {
    /// For [`Full`](Acquired::Full): `Retry-After` in whole seconds, rounded up, at least 1;
    /// `None` for a granted lease.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Acquired::Granted { .. } => None,
            Acquired::Full { retry_after, .. } => {
                Some(crate::decision::ceil_secs(*retry_after).max(1))
            }
        }
    }
}

/// Leases on keys: at most a [`Terms::limit`] held at once per key. Expired leases are not
/// counted and are cleaned up as keys are read.
pub trait Leases: Send + Sync {
    /// Takes a slot on `key` if fewer than `terms.limit()` leases are held.
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        terms: &'a Terms,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>>;

    /// Extends lease `id` on `key` to `terms.ttl()` from now; false if it is not held any
    /// more (released, expired, or never granted).
    fn renew<'a>(
        &'a self,
        key: &'a str,
        id: LeaseId,
        terms: &'a Terms,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Ends lease `id` on `key`; false if it was not held (released already, or expired).
    fn release<'a>(&'a self, key: &'a str, id: LeaseId) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// How many leases `key` holds now.
    fn held<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;
}

/// Leases shared behind an `Arc` (one table for a layer and the code that inspects it).
impl<L: Leases + ?Sized> Leases for std::sync::Arc<L> {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        terms: &'a Terms,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        (**self).acquire(key, terms)
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        id: LeaseId,
        terms: &'a Terms,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).renew(key, id, terms)
    }

    fn release<'a>(&'a self, key: &'a str, id: LeaseId) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).release(key, id)
    }

    fn held<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        (**self).held(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_bounded_and_kept_to_microseconds() {
        assert_eq!(Terms::new(0, MIN_TTL), Err(TermsError::Limit(0)));
        assert_eq!(
            Terms::new(MAX_LIMIT + 1, MIN_TTL),
            Err(TermsError::Limit(MAX_LIMIT + 1))
        );
        let short = Duration::from_micros(999);
        assert_eq!(Terms::new(1, short), Err(TermsError::Ttl(short)));
        let long = MAX_TTL + Duration::from_nanos(1);
        assert_eq!(Terms::new(1, long), Err(TermsError::Ttl(long)));
        let t = Terms::new(5, Duration::from_nanos(1_500_999)).unwrap();
        assert_eq!((t.limit(), t.ttl()), (5, Duration::from_micros(1500)));
    }

    #[test]
    fn lease_ids_print_and_parse_as_32_hex_digits_and_differ() {
        let a = LeaseId::random();
        let b = LeaseId::random();
        assert_ne!(a, b);
        let text = a.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(text.parse::<LeaseId>(), Ok(a));
        assert_eq!(text.to_uppercase().parse::<LeaseId>(), Ok(a));
        for bad in [
            "",
            "xyz",
            &text[1..],
            &format!("{text}0"),
            "+0000000000000000000000000000001",
        ] {
            assert_eq!(bad.parse::<LeaseId>(), Err(BadLeaseId), "{bad:?}");
        }
    }
}
