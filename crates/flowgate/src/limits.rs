//! One request checked against several limits at once.
//!
//! A request often falls under several limits — per IP *and* per API key *and* per route. It
//! goes through only if every limit allows it; units taken from limits that allowed are given
//! back when another denies, so a denied request consumes nothing anywhere. [`check_all`]
//! implements exactly that over any [`Store`]; the tower layer and the Envoy descriptor check
//! ([`crate::envoy`]) build their lists of limits and call it.

use crate::decision::Decision;
use crate::store::{Ask, Store, StoreError};

/// The result of [`check_all`]: the overall answer and each limit's own, in the order the
/// limits were given.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outcome {
    /// Whether every enforced limit granted its units.
    pub allowed: bool,
    /// Each limit's decision (or the store's error), in request order. Decisions of limits whose
    /// units were given back still show what that limit said at the time.
    pub results: Vec<Result<Decision, StoreError>>,
}

/// Asks `store` for every one of `asks` (in one round trip where the store supports it) and
/// grants the whole only if every *enforced* one grants. `enforced(i)` says whether ask `i` may
/// deny: shadow-mode limits count but never deny.
///
/// If any enforced limit denies or fails, every unit granted to the other asks is given back,
/// so nothing is consumed. (Refunds are best effort: a refund that fails is not retried; the
/// store has failed this request already.)
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flowgate::{limits::check_all, store::{Ask, MemoryStore, Store}, Quota};
///
/// let store = MemoryStore::new();
/// let per_ip = Quota::per_minute(100);
/// let per_route = Quota::per_minute(1);
/// let request = |ip| [Ask::new(ip, &per_ip), Ask::new("route:/login", &per_route)];
/// assert!(check_all(&store, &request("ip:1"), |_| true).await.allowed);
/// // The route limit denies: the per-IP unit is given back.
/// assert!(!check_all(&store, &request("ip:1"), |_| true).await.allowed);
/// assert_eq!(store.peek("ip:1", &per_ip).await?.remaining, 99);
/// # Ok(()) }
/// ```
pub async fn check_all<S: Store + ?Sized>(
    store: &S,
    asks: &[Ask<'_>],
    enforced: impl Fn(usize) -> bool,
) -> Outcome {
    let results = store.check_many(asks).await;
    settle(store, asks, results, enforced).await
}

/// The second half of [`check_all`]: given the store's `results` for `asks`, gives back every
/// granted unit unless every enforced ask was granted.
pub(crate) async fn settle<S: Store + ?Sized>(
    store: &S,
    asks: &[Ask<'_>],
    results: Vec<Result<Decision, StoreError>>,
    enforced: impl Fn(usize) -> bool,
) -> Outcome {
    let allowed = results
        .iter()
        .enumerate()
        .filter(|(i, _)| enforced(*i))
        .all(|(_, r)| matches!(r, Ok(d) if d.allowed));
    if !allowed {
        for (ask, result) in asks.iter().zip(&results) {
            if ask.cost > 0 && matches!(result, Ok(d) if d.allowed && d.fallback.is_none()) {
                // Best effort: a store that failed to refund has already failed this request.
                let _ = store.refund(ask.key, ask.quota, ask.cost).await;
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
        let roomy = Quota::per_minute(10);
        let tight = Quota::per_minute(1);
        let requests = [Ask::new("a", &roomy).cost(2), Ask::new("b", &tight)];
        // "b" in shadow mode: both requests pass although "b" is exhausted the second time.
        for _ in 0..2 {
            assert!(check_all(&store, &requests, |i| i == 0).await.allowed);
        }
        assert_eq!(store.peek("a", &roomy).await.unwrap().remaining, 6);
        // Enforced: "b" denies, so "a"'s 2 units are refunded.
        let outcome = check_all(&store, &requests, |_| true).await;
        assert!(!outcome.allowed);
        assert!(!outcome.results[1].as_ref().unwrap().allowed);
        assert_eq!(store.peek("a", &roomy).await.unwrap().remaining, 6);
        // Cost above the burst is an error, which denies and refunds too.
        let too_big = [Ask::new("a", &roomy), Ask::new("c", &tight).cost(5)];
        let outcome = check_all(&store, &too_big, |_| true).await;
        assert!(!outcome.allowed);
        assert!(matches!(outcome.results[1], Err(StoreError::Capacity(_))));
        assert_eq!(store.peek("a", &roomy).await.unwrap().remaining, 6);
    }
}
