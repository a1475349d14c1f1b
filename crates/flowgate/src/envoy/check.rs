//! [`check`]: a request's descriptors against a [`RuleSet`], counted in a store, and the
//! answer ([`Verdict`]).

use super::descriptor::Descriptor;
use super::key::{KEY_SCRATCH, write_key};
use super::resolve::{AppliedLimit, resolve};
use super::rules::{Rate, quota_suffix};
use super::ruleset::RuleSet;
use crate::decision::Decision;
use crate::limits::check_all;
use crate::quota::Quota;
use crate::store::{Ask, Store, StoreError};

/// What happened to one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// No limit applies: no rule matched, or the domain is unknown.
    Unmatched,
    /// The matched rule was replaced by another matched rule's `replaces`.
    Replaced,
    /// The matched rule is `unlimited`.
    Unlimited,
    /// The descriptor was counted (or blocked). `decision.allowed` is the limit's own answer;
    /// in shadow mode a denial does not deny the request.
    Checked(Decision),
    /// The store failed, or the cost can never fit the quota.
    Failed(StoreError),
}

/// One descriptor's part of a [`Verdict`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorVerdict<'r> {
    /// The limit applied, if any (also set for `Unlimited` and `Replaced`).
    pub applied: Option<AppliedLimit<'r>>,
    /// What happened.
    pub status: Status,
    /// The units this descriptor asked for.
    pub hits: u64,
}

impl DescriptorVerdict<'_> {
    /// Whether this descriptor lets the request through: everything but an enforced denial or
    /// failure.
    pub fn allows(&self) -> bool {
        let shadow = self.applied.is_some_and(|a| a.shadow_mode());
        match &self.status {
            Status::Checked(decision) => decision.allowed || shadow,
            Status::Failed(_) => shadow,
            _ => true,
        }
    }

    /// Whether the limit denied (or would have denied, in shadow mode).
    pub fn over_limit(&self) -> bool {
        matches!(&self.status, Status::Checked(d) if !d.allowed)
            || matches!(self.status, Status::Failed(StoreError::Capacity(_)))
    }
}

/// The answer to a request: allowed or not, and each descriptor's part in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<'r> {
    /// Whether every descriptor allows the request.
    pub allowed: bool,
    /// One entry per request descriptor, in order.
    pub descriptors: Vec<DescriptorVerdict<'r>>,
}

/// Checks a request against `rules`, counting in `store`. `hits_addend` is the request-level
/// cost (0 means 1); a descriptor's own `hits_addend` wins.
///
/// Every counted descriptor is sent to the store at once ([`check_all`]), each with its rule's
/// `fail` mode. If an enforced limit denies (or a blocked rule matches), the request is denied
/// and no unit is consumed. An invalid limit override (a rate above one per nanosecond) is
/// reported as [`Status::Failed`] with a [`StoreError::Backend`] describing it.
///
/// Everything that needs no waiting is done in plain functions: a request with one counted
/// limit, in a store that answers at once ([`Store::check_now`]: the memory store, a fallback
/// store over it), never reaches an `.await` and allocates no key.
pub async fn check<'r, S: Store + ?Sized>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
) -> Verdict<'r> {
    match check_at_once(rules, store, domain, descriptors, hits_addend) {
        AtOnce::Done(verdict) => verdict,
        AtOnce::Ask(mut pending) => {
            let results = ask_store(store, domain, descriptors, &pending).await;
            pending.apply(results.into_iter());
            pending.into_verdict()
        }
    }
}

/// What [`check_at_once`] got to.
enum AtOnce<'r> {
    /// The whole answer.
    Done(Verdict<'r>),
    /// The store must be waited for.
    Ask(Pending<'r>),
}

/// The matched descriptors of a request, before the store's answers are in.
struct Pending<'r> {
    verdicts: Vec<DescriptorVerdict<'r>>,
    /// A blocked, enforced limit denies the request whatever the others say: the others are
    /// then only peeked, so nothing is consumed.
    blocked_enforced: bool,
}

impl<'r> Pending<'r> {
    /// The quota of a descriptor the store is asked about.
    fn counted(v: &DescriptorVerdict<'r>) -> Option<Quota> {
        match (&v.status, v.applied?.rate()) {
            (Status::Checked(_), Rate::Limited(quota)) => Some(quota),
            _ => None,
        }
    }

    /// The units to ask for: none (a peek) when a blocked limit denies anyway.
    fn cost(&self, hits: u64) -> u64 {
        if self.blocked_enforced { 0 } else { hits }
    }

    /// Writes the store's `results` (one per counted descriptor, in order) into the verdicts.
    fn apply(&mut self, mut results: impl Iterator<Item = Result<Decision, StoreError>>) {
        let blocked_enforced = self.blocked_enforced;
        for v in &mut self.verdicts {
            if !matches!(v.status, Status::Checked(_)) {
                continue;
            }
            match v.applied.map(|a| a.rate()) {
                Some(Rate::Blocked { period }) => {
                    v.status = Status::Checked(Decision::blocked(period));
                }
                Some(Rate::Limited(_)) => {
                    v.status = match results.next() {
                        Some(Ok(decision)) if blocked_enforced && v.hits > 0 => {
                            // Peeked only: report what the limit would have said, unconsumed.
                            Status::Checked(Decision {
                                allowed: decision.remaining >= v.hits,
                                ..decision
                            })
                        }
                        Some(Ok(decision)) => Status::Checked(decision),
                        Some(Err(e)) => Status::Failed(e),
                        None => Status::Failed(StoreError::Backend("store gave no answer".into())),
                    };
                }
                _ => {}
            }
        }
    }

    fn into_verdict(self) -> Verdict<'r> {
        Verdict {
            allowed: self.verdicts.iter().all(DescriptorVerdict::allows),
            descriptors: self.verdicts,
        }
    }
}

/// The counter key of `descriptor` as `v` counts it, appended to `key`.
fn write_counter_key(
    key: &mut String,
    domain: &str,
    v: &DescriptorVerdict<'_>,
    descriptor: &Descriptor,
    quota: &Quota,
) {
    match v.applied {
        Some(AppliedLimit::Rule(rule)) => {
            write_key(key, domain, &descriptor.entries, rule.counter_suffix());
        }
        _ => write_key(key, domain, &descriptor.entries, &quota_suffix(quota)),
    }
}

/// Matches the request and, when no counted limit or exactly one on a store that answers at
/// once is involved, decides it without waiting.
fn check_at_once<'r, S: Store + ?Sized>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
) -> AtOnce<'r> {
    let verdicts = match resolve(rules, domain, descriptors, hits_addend) {
        Ok(verdicts) => verdicts,
        Err(e) => {
            let request_hits = hits_addend.max(1);
            let failed = |d: &Descriptor| DescriptorVerdict {
                applied: None,
                status: Status::Failed(StoreError::Backend(format!("invalid limit override: {e}"))),
                hits: d.hits_addend.unwrap_or(request_hits),
            };
            return AtOnce::Done(Verdict {
                allowed: false,
                descriptors: descriptors.iter().map(failed).collect(),
            });
        }
    };
    let blocked_enforced = verdicts.iter().any(|v| {
        matches!(v.status, Status::Checked(_))
            && v.applied
                .is_some_and(|a| matches!(a.rate(), Rate::Blocked { .. }) && !a.shadow_mode())
    });
    let mut pending = Pending {
        verdicts,
        blocked_enforced,
    };
    let mut counted = pending
        .verdicts
        .iter()
        .enumerate()
        .filter_map(|(i, v)| Some((i, Pending::counted(v)?)));
    let answer = match (counted.next(), counted.next()) {
        (None, _) => None,
        (Some((i, quota)), None) => {
            // One limit: nothing to give back on a denial. A store that answers at once gets
            // the key in a reused buffer, so nothing is allocated.
            let v = &pending.verdicts[i];
            let cost = pending.cost(v.hits);
            let fail = v.applied.and_then(|a| a.fail());
            let now = KEY_SCRATCH.with_borrow_mut(|key| {
                key.clear();
                write_counter_key(key, domain, v, &descriptors[i], &quota);
                store.check_now(Ask::new(key, &quota).cost(cost).fail(fail))
            });
            match now {
                Some(answer) => Some(answer),
                None => return AtOnce::Ask(pending),
            }
        }
        (Some(_), Some(_)) => return AtOnce::Ask(pending),
    };
    pending.apply(answer.into_iter());
    AtOnce::Done(pending.into_verdict())
}

/// Asks the store about every counted descriptor of `pending` and waits: one ask directly,
/// several at once with [`check_all`]'s all-or-nothing.
async fn ask_store<S: Store + ?Sized>(
    store: &S,
    domain: &str,
    descriptors: &[Descriptor],
    pending: &Pending<'_>,
) -> Vec<Result<Decision, StoreError>> {
    let mut keys = Vec::new();
    let mut counted = Vec::new();
    for (v, descriptor) in pending.verdicts.iter().zip(descriptors) {
        if let (Some(quota), Some(applied)) = (Pending::counted(v), v.applied) {
            let mut key = String::new();
            write_counter_key(&mut key, domain, v, descriptor, &quota);
            keys.push(key);
            counted.push((quota, pending.cost(v.hits), applied));
        }
    }
    let asks: Vec<Ask<'_>> = keys
        .iter()
        .zip(&counted)
        .map(|(key, (quota, cost, applied))| Ask::new(key, quota).cost(*cost).fail(applied.fail()))
        .collect();
    if let [ask] = asks.as_slice() {
        return vec![store.check(*ask).await];
    }
    check_all(store, &asks, |i| !counted[i].2.shadow_mode())
        .await
        .results
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::envoy::{DomainSpec, Entry, LimitOverride, LimitSpec, RuleSpec, Unit};
    use crate::quota::{Algorithm, Quota};
    use crate::store::MemoryStore;
    use std::time::Duration;

    fn per_minute(n: u64) -> LimitSpec {
        LimitSpec::new(Rate::Limited(
            Quota::per_minute(n)
                .with_algorithm(Algorithm::FixedWindow)
                .unwrap(),
        ))
    }

    fn store() -> MemoryStore<ManualClock> {
        MemoryStore::builder()
            .clock(ManualClock::new(1 << 40))
            .build()
    }

    fn one(key: &str, value: &str) -> Descriptor {
        Descriptor::new(vec![Entry::new(key, value)])
    }

    fn rules() -> RuleSet {
        RuleSet::build(vec![DomainSpec::new(
            "d",
            vec![
                RuleSpec::new("user").with_limit(per_minute(3).named("per_user")),
                RuleSpec::new("user")
                    .with_value("vip")
                    .with_limit(LimitSpec::new(Rate::Unlimited).replacing(["global"])),
                RuleSpec::new("user")
                    .with_value("banned")
                    .with_limit(LimitSpec::new(Rate::Blocked {
                        period: Duration::from_secs(60),
                    })),
                RuleSpec::new("route").with_limit(per_minute(1)).shadow(),
                RuleSpec::new("global").with_limit(per_minute(2).named("global")),
                RuleSpec::new("premium")
                    .with_limit(per_minute(100).named("premium").replacing(["per_user"])),
            ],
        )])
        .unwrap()
    }

    fn remaining(v: &Verdict<'_>, i: usize) -> u64 {
        match &v.descriptors[i].status {
            Status::Checked(d) => d.remaining,
            other => panic!("descriptor {i} not checked: {other:?}"),
        }
    }

    /// The memory store without its at-once answer: every request goes through `check`'s
    /// future and an owned key.
    struct Waiting(MemoryStore<ManualClock>);

    impl Store for Waiting {
        async fn check(&self, ask: Ask<'_>) -> Result<Decision, StoreError> {
            self.0.check(ask).await
        }
        async fn refund(&self, key: &str, quota: &Quota, units: u64) -> Result<(), StoreError> {
            self.0.refund(key, quota, units).await
        }
        async fn reset(&self, key: &str, quota: &Quota) -> Result<(), StoreError> {
            self.0.reset(key, quota).await
        }
    }

    #[tokio::test]
    async fn answering_at_once_and_through_the_future_agree() {
        let rules = rules();
        let (at_once, waiting) = (store(), Waiting(store()));
        let requests: Vec<Vec<Descriptor>> = vec![
            vec![one("user", "a")],
            vec![one("user", "a|b=c#\\")],
            vec![one("route", "r")],
            vec![one("user", "banned")],
            vec![one("global", "g"), one("user", "a")],
            vec![one("premium", "p"), one("user", "a")],
            vec![one("nothing", "x")],
        ];
        for round in 0..5 {
            for request in &requests {
                for hits in [0, 1, 2] {
                    let a = check(&rules, &at_once, "d", request, hits).await;
                    let b = check(&rules, &waiting, "d", request, hits).await;
                    assert_eq!(a, b, "round {round}, {request:?}, hits {hits}");
                }
            }
        }
    }

    #[tokio::test]
    async fn hits_addend_descriptor_wins_and_request_zero_means_one() {
        let (rules, store) = (rules(), store());
        let v = check(&rules, &store, "d", &[one("user", "a")], 0).await;
        assert_eq!(
            (v.allowed, remaining(&v, 0), v.descriptors[0].hits),
            (true, 2, 1)
        );
        let mut d = one("user", "a");
        d.hits_addend = Some(2);
        let v = check(&rules, &store, "d", &[d.clone()], 1).await;
        assert_eq!((v.allowed, remaining(&v, 0)), (true, 0));
        d.hits_addend = Some(0);
        let v = check(&rules, &store, "d", &[d], 5).await;
        assert_eq!((v.allowed, remaining(&v, 0)), (true, 0), "0 peeks");
        let v = check(&rules, &store, "d", &[one("user", "a")], 1).await;
        assert!(!v.allowed && v.descriptors[0].over_limit());
        // Above the quota's capacity: an error, reported as over the limit.
        let v = check(&rules, &store, "d", &[one("user", "b")], 4).await;
        assert!(!v.allowed && v.descriptors[0].over_limit());
    }

    #[tokio::test]
    async fn unlimited_blocked_shadow_and_unmatched() {
        let (rules, store) = (rules(), store());
        for _ in 0..10 {
            let v = check(&rules, &store, "d", &[one("user", "vip")], 1).await;
            assert!(v.allowed);
            assert_eq!(v.descriptors[0].status, Status::Unlimited);
        }
        let v = check(&rules, &store, "d", &[one("user", "banned")], 1).await;
        assert!(!v.allowed);
        assert!(
            matches!(&v.descriptors[0].status, Status::Checked(d) if !d.allowed && d.limit == 0)
        );
        // Shadow mode: the second call is over the limit but allowed.
        for n in 0..2 {
            let v = check(&rules, &store, "d", &[one("route", "r")], 1).await;
            assert!(v.allowed);
            assert_eq!(v.descriptors[0].over_limit(), n == 1);
        }
        let v = check(&rules, &store, "d", &[one("nothing", "x")], 1).await;
        assert!(v.allowed && v.descriptors[0].status == Status::Unmatched);
        let v = check(&rules, &store, "unknown", &[one("user", "a")], 1).await;
        assert!(v.allowed && v.descriptors[0].status == Status::Unmatched);
    }

    #[tokio::test]
    async fn replaces_skips_the_named_rule_and_denials_consume_nothing() {
        let (rules, store) = (rules(), store());
        // premium replaces per_user: per_user's counter is untouched.
        let request = [one("user", "a"), one("premium", "p")];
        let v = check(&rules, &store, "d", &request, 1).await;
        assert!(v.allowed);
        assert_eq!(v.descriptors[0].status, Status::Replaced);
        assert_eq!(remaining(&v, 1), 99);
        // An unlimited rule may replace too.
        let v = check(
            &rules,
            &store,
            "d",
            &[one("user", "vip"), one("global", "g")],
            1,
        )
        .await;
        assert_eq!(v.descriptors[1].status, Status::Replaced);
        // global allows twice; the third request is denied and user a's unit is refunded.
        for _ in 0..2 {
            assert!(
                check(&rules, &store, "d", &[one("global", "g")], 1)
                    .await
                    .allowed
            );
        }
        let v = check(
            &rules,
            &store,
            "d",
            &[one("user", "a"), one("global", "g")],
            1,
        )
        .await;
        assert!(!v.allowed);
        let v = check(&rules, &store, "d", &[one("user", "a")], 1).await;
        assert_eq!(remaining(&v, 0), 2, "the denied request consumed nothing");
        // A blocked rule denies and the others are only peeked.
        let v = check(
            &rules,
            &store,
            "d",
            &[one("user", "a"), one("user", "banned")],
            1,
        )
        .await;
        assert!(!v.allowed);
        assert_eq!(remaining(&v, 0), 2);
        let v = check(&rules, &store, "d", &[one("user", "a")], 0).await;
        assert_eq!(remaining(&v, 0), 1);
    }

    #[tokio::test]
    async fn limit_overrides_replace_the_configured_rule() {
        let (rules, store) = (rules(), store());
        let mut d = one("user", "a");
        d.limit = Some(LimitOverride {
            requests_per_unit: 1,
            unit: Unit::Hour,
        });
        let v = check(&rules, &store, "d", &[d.clone()], 1).await;
        assert!(v.allowed);
        assert!(matches!(
            v.descriptors[0].applied,
            Some(AppliedLimit::Override(..))
        ));
        assert!(!check(&rules, &store, "d", &[d.clone()], 1).await.allowed);
        d.limit = Some(LimitOverride {
            requests_per_unit: 0,
            unit: Unit::Second,
        });
        assert!(!check(&rules, &store, "d", &[d], 1).await.allowed);
    }
}
