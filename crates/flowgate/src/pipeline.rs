//! One request against every limit it falls under: the pipeline every front end uses.
//!
//! A request often falls under several limits — per IP *and* per API key *and* per route. It
//! goes through only if every enforced limit allows it; units taken from the limits that
//! allowed are given back when another denies, so a denied request consumes nothing anywhere.
//! Shadow limits ([`Ask::shadow`]) are counted but never deny; quota-mode limits
//! ([`Ask::quota_mode`]) deny only together: the request is denied for them when every
//! quota-mode limit denies.
//!
//! [`decide`] does all of it over any [`Store`]: one ask goes straight to the store, several go
//! together ([`Store::check_many`]: one round trip where the store batches), and the refunds
//! follow a denial. A store that decides in this process (the memory store, a fallback or
//! hybrid store over it) is asked without waiting first — [`decide_now`] — so a hot path can
//! answer without creating a future; what it could not finish at once it hands back as
//! [`Unfinished`], which [`Unfinished::finish`] completes. The tower layer, the gateway, the
//! service's gRPC and HTTP APIs and the WebSocket limiter all call these and render the
//! [`Outcome`] as it is.

use smallvec::SmallVec;

use crate::decision::Decision;
use crate::store::{Ask, Store, StoreError};

/// Each limit's answer, in the order the asks were given (inline for up to two limits).
pub type Results = SmallVec<[Result<Decision, StoreError>; 2]>;

/// The answer to a request: whether it goes through, and each limit's own answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outcome {
    /// Whether every enforced limit granted its units.
    pub allowed: bool,
    /// Each limit's decision (or the store's error), in the order of the asks. Decisions of
    /// limits whose units were given back still show what that limit said at the time.
    pub results: Results,
}

impl Outcome {
    /// The outcome for `results` of `asks`: allowed when every enforced ask was granted and,
    /// if there are quota-mode asks, not all of them were denied.
    fn new(asks: &[Ask<'_>], results: Results) -> Self {
        let granted = |(ask, result): (&Ask<'_>, &Result<Decision, StoreError>)| {
            ask.shadow || matches!(result, Ok(d) if d.allowed)
        };
        if !asks.iter().any(|ask| ask.quota_mode) {
            let allowed = asks.iter().zip(&results).all(granted);
            return Outcome { allowed, results };
        }
        // Quota-mode limits in groups (a descriptor's several limits, `joins_previous`): a
        // group denies when any of its asks does.
        let (mut enforced_granted, mut quotas, mut quotas_denied) = (true, 0usize, 0usize);
        let mut group_denied = false;
        for (ask, result) in asks.iter().zip(&results) {
            let denied = !granted((ask, result));
            if ask.quota_mode {
                if !ask.joins_previous || quotas == 0 {
                    quotas += 1;
                    group_denied = false;
                }
                if denied && !group_denied {
                    group_denied = true;
                    quotas_denied += 1;
                }
            } else if denied {
                enforced_granted = false;
            }
        }
        let allowed = enforced_granted && (quotas == 0 || quotas_denied < quotas);
        Outcome { allowed, results }
    }

    /// The asks whose units must be given back: none when the request is allowed; otherwise
    /// every ask that took units from the store (a fallback's decision took none there),
    /// except charges: usage that happened stays charged.
    fn refunds<'o>(&'o self, asks: &'o [Ask<'o>]) -> impl Iterator<Item = usize> + 'o {
        asks.iter()
            .zip(&self.results)
            .enumerate()
            .filter(move |(_, (ask, result))| {
                !self.allowed
                    && !ask.charge
                    && ask.cost > 0
                    && matches!(result, Ok(d) if d.allowed && d.fallback.is_none())
            })
            .map(|(i, _)| i)
    }
}

/// What [`decide_now`] could not finish without waiting; [`finish`](Unfinished::finish) it with
/// the same store and asks.
#[derive(Debug)]
#[must_use = "the request is not decided until it is finished"]
pub struct Unfinished {
    /// Where the request stands.
    state: State,
}

#[derive(Debug)]
enum State {
    /// Nothing was asked: the store answers asynchronously.
    NotAsked,
    /// Decided, but these asks' units must still be given back (rare: a hybrid store that
    /// pushed them meanwhile), so boxed.
    Refunding(Box<(Outcome, SmallVec<[usize; 2]>)>),
}

/// Decides the request formed by `asks` without waiting, if `store` answers at once
/// ([`Store::check_now`]); otherwise hands back what is left to do. Nothing is taken twice:
/// an [`Unfinished`] request has either asked nothing yet or is only owed refunds.
///
/// ```
/// use flowgate::{pipeline::decide_now, store::{Ask, MemoryStore}, Quota};
///
/// let store = MemoryStore::new();
/// let (per_ip, per_route) = (Quota::per_minute(100), Quota::per_minute(1));
/// let asks = [Ask::new("ip:1", &per_ip), Ask::new("route:/login", &per_route)];
/// let first = decide_now(&store, &asks).expect("the memory store answers at once");
/// assert!(first.allowed);
/// let second = decide_now(&store, &asks).expect("in memory");
/// assert!(!second.allowed); // the route limit denies; the per-IP unit was given back
/// assert_eq!(second.results[0].as_ref().unwrap().remaining, 98);
/// ```
pub fn decide_now<S: Store + ?Sized>(store: &S, asks: &[Ask<'_>]) -> Result<Outcome, Unfinished> {
    let mut results = Results::new();
    for ask in asks {
        match store.check_now(*ask) {
            Some(result) => results.push(result),
            None if results.is_empty() => {
                return Err(Unfinished {
                    state: State::NotAsked,
                });
            }
            // A store answers every ask at once or none; one that breaks that contract has
            // failed this ask.
            None => results.push(Err(StoreError::Backend(
                "the store answered some asks at once and not others".into(),
            ))),
        }
    }
    let outcome = Outcome::new(asks, results);
    let mut owed = SmallVec::<[usize; 2]>::new();
    for i in outcome.refunds(asks) {
        if store.refund_now(asks[i]).is_none() {
            owed.push(i);
        }
    }
    if owed.is_empty() {
        Ok(outcome)
    } else {
        Err(Unfinished {
            state: State::Refunding(Box::new((outcome, owed))),
        })
    }
}

/// Decides the request formed by `asks` in `store`: allowed only if every enforced ask is
/// granted, and nothing consumed when it is not. Asks [`decide_now`] first.
///
/// Refunds are best effort: one that fails is not retried (the store has failed this request
/// already).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flowgate::{pipeline::decide, store::{Ask, MemoryStore, Store}, Quota};
///
/// let store = MemoryStore::new();
/// let per_ip = Quota::per_minute(100);
/// let per_route = Quota::per_minute(1);
/// let request = |ip| [Ask::new(ip, &per_ip), Ask::new("route:/login", &per_route)];
/// assert!(decide(&store, &request("ip:1")).await.allowed);
/// // The route limit denies: the per-IP unit is given back.
/// assert!(!decide(&store, &request("ip:1")).await.allowed);
/// assert_eq!(store.peek(Ask::new("ip:1", &per_ip)).await?.remaining, 99);
/// // A shadow limit is counted but never denies.
/// let tried = [Ask::new("ip:2", &per_ip), Ask::new("route:/login", &per_route).shadow(true)];
/// assert!(decide(&store, &tried).await.allowed);
/// # Ok(()) }
/// ```
pub async fn decide<S: Store + ?Sized>(store: &S, asks: &[Ask<'_>]) -> Outcome {
    match decide_now(store, asks) {
        Ok(outcome) => outcome,
        Err(unfinished) => unfinished.finish(store, asks).await,
    }
}

impl Unfinished {
    /// Completes the request in `store` (the store and asks given to [`decide_now`]).
    pub async fn finish<S: Store + ?Sized>(self, store: &S, asks: &[Ask<'_>]) -> Outcome {
        let (outcome, owed) = match self.state {
            State::Refunding(refunding) => *refunding,
            State::NotAsked => {
                let results: Results = match asks {
                    [] => Results::new(),
                    [ask] => smallvec::smallvec![store.check(*ask).await],
                    _ => store.check_many(asks).await.into(),
                };
                let outcome = Outcome::new(asks, results);
                let owed = outcome.refunds(asks).collect();
                (outcome, owed)
            }
        };
        for i in owed {
            // Best effort: a store that failed to refund has already failed this request.
            let _ = store.refund(asks[i]).await;
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
    use crate::clock::ManualClock;
    use crate::store::MemoryStore;

    #[tokio::test]
    async fn quota_mode_limits_deny_only_when_all_of_them_deny() {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(1 << 40))
            .build();
        let (one, two, roomy) = (
            Quota::per_minute(1),
            Quota::per_minute(2),
            Quota::per_minute(10),
        );
        let asks = [
            Ask::new("plain", &roomy),
            Ask::new("q1", &one).quota_mode(true),
            Ask::new("q2", &two).quota_mode(true),
        ];
        let peek = |key, quota| store.peek(Ask::new(key, quota));
        // 1st: all grant. 2nd: q1 denies, q2 grants: allowed. 3rd: both deny: denied, and
        // "plain" is refunded.
        assert!(decide(&store, &asks).await.allowed);
        let second = decide(&store, &asks).await;
        assert!(second.allowed);
        assert!(!second.results[1].as_ref().unwrap().allowed);
        assert!(!decide(&store, &asks).await.allowed);
        assert_eq!(peek("plain", &roomy).await.unwrap().remaining, 8);
        // An enforced denial denies whatever the quotas say; a shadow quota never denies.
        let with_shadow = [
            asks[1],
            asks[2],
            Ask::new("s", &one).quota_mode(true).shadow(true),
        ];
        for _ in 0..3 {
            assert!(decide(&store, &with_shadow).await.allowed);
        }
        let enforced = [
            Ask::new("e", &one).cost(2),
            Ask::new("q3", &roomy).quota_mode(true),
        ];
        assert!(matches!(
            decide(&store, &enforced).await.results[0],
            Err(StoreError::Capacity(_))
        ));
        assert!(!decide(&store, &enforced).await.allowed);
    }

    #[tokio::test]
    async fn shadow_limits_count_but_never_deny_and_denials_refund_everything() {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(1 << 40))
            .build();
        let roomy = Quota::per_minute(10);
        let tight = Quota::per_minute(1);
        let requests = [
            Ask::new("a", &roomy).cost(2),
            Ask::new("b", &tight).shadow(true),
        ];
        // "b" in shadow mode: both requests pass although "b" is exhausted the second time.
        for _ in 0..2 {
            assert!(decide(&store, &requests).await.allowed);
        }
        let peek = |key| store.peek(Ask::new(key, &roomy));
        assert_eq!(peek("a").await.unwrap().remaining, 6);
        // Enforced: "b" denies, so "a"'s 2 units are refunded.
        let enforced = [requests[0], requests[1].shadow(false)];
        let outcome = decide(&store, &enforced).await;
        assert!(!outcome.allowed);
        assert!(!outcome.results[1].as_ref().unwrap().allowed);
        assert_eq!(peek("a").await.unwrap().remaining, 6);
        // Cost above the burst is an error, which denies and refunds too.
        let too_big = [Ask::new("a", &roomy), Ask::new("c", &tight).cost(5)];
        let outcome = decide(&store, &too_big).await;
        assert!(!outcome.allowed);
        assert!(matches!(outcome.results[1], Err(StoreError::Capacity(_))));
        assert_eq!(peek("a").await.unwrap().remaining, 6);
    }

    #[tokio::test]
    async fn a_charge_is_never_refunded_when_another_limit_denies() {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(1 << 40))
            .build();
        let (roomy, tight) = (Quota::per_minute(10), Quota::per_minute(1));
        assert!(decide(&store, &[Ask::new("b", &tight)]).await.allowed);
        let asks = [
            Ask::new("a", &roomy).cost(25).charge(true),
            Ask::new("b", &tight),
        ];
        let outcome = decide(&store, &asks).await;
        assert!(!outcome.allowed);
        assert!(outcome.results[0].as_ref().unwrap().allowed);
        let a = store.peek(Ask::new("a", &roomy)).await.unwrap();
        assert_eq!((a.allowed, a.remaining), (false, 0), "still in debt: {a:?}");
    }

    /// The memory store without its at-once answers: every request goes through the futures.
    struct Waiting(MemoryStore<ManualClock>);

    impl Store for Waiting {
        async fn check(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
            self.0.check(ask).await
        }
        async fn refund(&self, ask: Ask<'_>) -> Result<(), StoreError> {
            self.0.refund(ask).await
        }
        async fn reset(&self, ask: Ask<'_>) -> Result<(), StoreError> {
            self.0.reset(ask).await
        }
    }

    /// Answers checks at once but refunds only asynchronously (a hybrid store whose units
    /// were pushed meanwhile).
    struct RefundsLater(MemoryStore<ManualClock>);

    impl Store for RefundsLater {
        async fn check(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
            self.0.check(ask).await
        }
        fn check_now(&self, ask: Ask<'_>) -> Option<Result<Decision, StoreError>> {
            self.0.check_now(ask)
        }
        async fn refund(&self, ask: Ask<'_>) -> Result<(), StoreError> {
            self.0.refund(ask).await
        }
        async fn reset(&self, ask: Ask<'_>) -> Result<(), StoreError> {
            self.0.reset(ask).await
        }
    }

    proptest::proptest! {
        /// At once, through the futures, or with refunds left for later: the same decisions
        /// and the same counts, for any mix of limits, costs and shadow flags.
        #[test]
        fn every_path_decides_alike(
            requests in proptest::collection::vec(
                proptest::collection::vec((0usize..3, 0u64..4, proptest::bool::ANY), 1..4),
                1..30,
            ),
        ) {
            let quotas = [Quota::per_minute(3), Quota::per_minute(5), Quota::per_minute(8)];
            let memory = || MemoryStore::builder().clock(ManualClock::new(1 << 40)).build();
            let (now, waiting, later) = (memory(), Waiting(memory()), RefundsLater(memory()));
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            for request in &requests {
                let keys: Vec<String> = request.iter().map(|(k, ..)| format!("k{k}")).collect();
                let asks: Vec<Ask<'_>> = request
                    .iter()
                    .zip(&keys)
                    .map(|((k, cost, shadow), key)| {
                        Ask::new(key, &quotas[*k]).cost(*cost).shadow(*shadow)
                    })
                    .collect();
                let a = decide_now(&now, &asks).unwrap();
                let b = rt.block_on(decide(&waiting, &asks));
                let c = rt.block_on(decide(&later, &asks));
                proptest::prop_assert_eq!(&a, &b);
                proptest::prop_assert_eq!(&a, &c);
            }
            for (i, quota) in quotas.iter().enumerate() {
                let key = format!("k{i}");
                let peek = |s: &MemoryStore<ManualClock>| {
                    s.check_now(Ask::new(&key, quota).cost(0)).unwrap().unwrap().remaining
                };
                proptest::prop_assert_eq!(peek(&now), peek(&waiting.0));
                proptest::prop_assert_eq!(peek(&now), peek(&later.0));
            }
        }
    }
}
