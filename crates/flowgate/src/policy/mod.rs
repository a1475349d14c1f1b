//! Policies: one request checked against several limits at once.
//!
//! A request often falls under several limits — per IP *and* per API key *and* per route. It
//! goes through only if every limit allows it; units taken from limits that allowed are given
//! back when another denies, so a denied request consumes nothing anywhere.
//! [`acquire_all`] implements exactly that over any [`Store`]; the service's descriptor
//! matching and the tower middleware build their lists of limits and call it.
//!
//! * [`rules`]: envoyproxy/ratelimit-style rule trees ([`RuleSet`](rules::RuleSet)): domains of
//!   nested descriptor rules with key / value / `*` prefix patterns, matched by depth.
//! * [`descriptor`]: checking a request's descriptors against a rule set
//!   ([`check`](descriptor::check)): `hits_addend`, limit overrides, `unlimited`, blocklists,
//!   shadow mode, `replaces`, and the store keys of the counters.

pub mod descriptor;
pub mod rules;

use crate::decision::Decision;
use crate::store::{Acquire, Store, StoreError};

/// The result of [`acquire_all`]: the overall verdict and each limit's own answer, in the
/// order the limits were given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whether every enforced limit granted its units.
    pub allowed: bool,
    /// Each limit's decision (or the store's error), in request order. Decisions of limits whose
    /// units were given back still show what that limit said at the time.
    pub results: Vec<Result<Decision, StoreError>>,
}

impl Outcome {
    /// The decision that should be reported for the request as a whole: the first enforced
    /// denial if any, else the granted decision with the fewest units remaining.
    pub fn binding(&self, enforced: impl Fn(usize) -> bool) -> Option<&Decision> {
        let decisions = || {
            self.results
                .iter()
                .enumerate()
                .filter(|(i, _)| enforced(*i))
                .filter_map(|(_, r)| r.as_ref().ok())
        };
        decisions()
            .find(|d| !d.allowed)
            .or_else(|| decisions().min_by_key(|d| d.remaining))
    }
}

/// Asks `store` for every request in `requests` (in one round trip where the store supports
/// it) and grants the whole only if every *enforced* one grants. `enforced(i)` says whether
/// request `i` may deny: shadow-mode limits count but never deny.
///
/// If any enforced limit denies or fails, every unit granted to the other requests is given
/// back, so nothing is consumed. (Refunds are best effort: a refund that fails is reported in
/// the logs by the caller's store, not retried.)
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flowgate::{policy::acquire_all, store::{Acquire, MemoryStore}, Quota};
///
/// let store = MemoryStore::new();
/// let per_ip = Quota::per_minute(100)?;
/// let per_route = Quota::per_minute(1)?;
/// let request = |ip| [
///     Acquire { key: ip, quota: &per_ip, cost: 1 },
///     Acquire { key: "route:/login", quota: &per_route, cost: 1 },
/// ];
/// assert!(acquire_all(&store, &request("ip:1"), |_| true).await.allowed);
/// // The route limit denies: the per-IP unit is given back.
/// assert!(!acquire_all(&store, &request("ip:1"), |_| true).await.allowed);
/// assert_eq!(store.acquire_now("ip:1", &per_ip, 0)?.remaining, 99);
/// # Ok(()) }
/// ```
pub async fn acquire_all<S: Store>(
    store: &S,
    requests: &[Acquire<'_>],
    enforced: impl Fn(usize) -> bool,
) -> Outcome {
    let results = store.acquire_many(requests).await;
    settle(store, requests, results, enforced).await
}

/// The second half of [`acquire_all`]: given the store's `results` for `requests`, gives back
/// every granted unit unless every enforced request was granted.
pub(crate) async fn settle<S: Store>(
    store: &S,
    requests: &[Acquire<'_>],
    results: Vec<Result<Decision, StoreError>>,
    enforced: impl Fn(usize) -> bool,
) -> Outcome {
    let allowed = results
        .iter()
        .enumerate()
        .filter(|(i, _)| enforced(*i))
        .all(|(_, r)| matches!(r, Ok(d) if d.allowed));
    if !allowed {
        for (request, result) in requests.iter().zip(&results) {
            if request.cost > 0 && matches!(result, Ok(d) if d.allowed && d.fallback.is_none()) {
                // Best effort: a store that failed to refund has already failed this request.
                let _ = store.refund(request.key, request.quota, request.cost).await;
            }
        }
    }
    Outcome { allowed, results }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
    use crate::clock::ManualClock;
    use crate::store::MemoryStore;

    #[tokio::test]
    async fn shadow_limits_count_but_never_deny_and_denials_refund_everything() {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(1 << 40))
            .build();
        let roomy = Quota::per_minute(10).unwrap();
        let tight = Quota::per_minute(1).unwrap();
        let requests = [
            Acquire {
                key: "a",
                quota: &roomy,
                cost: 2,
            },
            Acquire {
                key: "b",
                quota: &tight,
                cost: 1,
            },
        ];
        // "b" in shadow mode: both requests pass although "b" is exhausted the second time.
        for _ in 0..2 {
            assert!(acquire_all(&store, &requests, |i| i == 0).await.allowed);
        }
        assert_eq!(store.acquire_now("a", &roomy, 0).unwrap().remaining, 6);
        // Enforced: "b" denies, so "a"'s 2 units are refunded.
        let outcome = acquire_all(&store, &requests, |_| true).await;
        assert!(!outcome.allowed);
        assert!(!outcome.binding(|_| true).unwrap().allowed);
        assert_eq!(store.acquire_now("a", &roomy, 0).unwrap().remaining, 6);
        // Cost above the burst is an error, which denies and refunds too.
        let too_big = [
            Acquire {
                key: "a",
                quota: &roomy,
                cost: 1,
            },
            Acquire {
                key: "c",
                quota: &tight,
                cost: 5,
            },
        ];
        let outcome = acquire_all(&store, &too_big, |_| true).await;
        assert!(!outcome.allowed);
        assert!(matches!(outcome.results[1], Err(StoreError::Capacity(_))));
        assert_eq!(store.acquire_now("a", &roomy, 0).unwrap().remaining, 6);
    }
}
