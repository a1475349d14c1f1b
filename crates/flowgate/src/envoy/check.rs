//! [`check`]: a request's descriptors against a [`RuleSet`], counted in a store through the
//! [`pipeline`](crate::pipeline), and the answer ([`Verdict`]).

use std::time::Duration;

use super::descriptor::Descriptor;
use super::key::{write_key, write_rule_key};
use super::resolve::{AppliedLimit, Resolved, resolve};
use super::rules::{Rate, quota_suffix};
use super::ruleset::RuleSet;
use crate::decision::Decision;
use crate::pipeline::{self, Results};
use crate::quota::Quota;
use crate::store::{Ask, Store, StoreError};

/// What happened to one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// No limit applies: no rule matched, or the domain is unknown.
    Unmatched,
    /// The matched rule was replaced by another matched rule's `replaces`.
    Replaced,
    /// The matched rule is `unlimited`.
    Unlimited,
    /// The matched limit allows nothing (`requests_per_unit: 0`): denied, to be tried again
    /// after `period`.
    Blocked {
        /// The limit's period.
        period: Duration,
    },
    /// The descriptor was counted: the store's decision — `allowed` is the limit's own answer;
    /// in shadow mode a denial does not deny the request — or why it could not decide (the
    /// store failed, or the cost can never fit the quota).
    Counted(Result<Decision, StoreError>),
}

/// One descriptor's part of a [`Verdict`]: its limit's answer. For a rule with several limits,
/// the **binding** one's — the one that refused (of several, the one with the longest wait),
/// or when all allow, the one with the least remaining — with the rest in
/// [`others`](Self::others).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorVerdict<'r> {
    /// The limit applied, if any (also set for `Unlimited` and `Replaced`).
    pub applied: Option<AppliedLimit<'r>>,
    /// What happened.
    pub status: Status,
    /// The units this descriptor asked for.
    pub hits: u64,
    /// Whether its hits were a charge ([`Ask::charge`](crate::store::Ask::charge)): usage that
    /// already happened, taken whatever the limit said.
    pub charge: bool,
    /// Whether a denial here denies the request: not in shadow mode (the rule's or the global
    /// one), and not a quota-mode limit while another quota-mode limit of the request passes.
    pub enforced: bool,
    /// The other limits of the descriptor's rule, in definition order, each with its own
    /// answer (and an empty `others`); empty for a rule with one limit.
    pub others: Vec<DescriptorVerdict<'r>>,
}

impl<'r> DescriptorVerdict<'r> {
    /// Every limit's answer: this (binding) one, then [`others`](Self::others).
    pub fn limits(&self) -> impl Iterator<Item = &DescriptorVerdict<'r>> {
        std::iter::once(self).chain(&self.others)
    }

    /// What picks the binding limit among a descriptor's limits, smallest first: a refusal
    /// (over the limit, or failed), the longest wait first; then the least remaining.
    fn binding_order(&self) -> (bool, std::cmp::Reverse<Duration>, u64) {
        let refuses = self.denies() || self.over_limit();
        let (wait, remaining) = match &self.status {
            Status::Counted(Ok(d)) => (d.retry_after, d.remaining),
            Status::Blocked { period } => (*period, 0),
            Status::Counted(Err(_)) => (Duration::MAX, 0),
            _ => (Duration::ZERO, u64::MAX),
        };
        let wait = if refuses { wait } else { Duration::ZERO };
        (!refuses, std::cmp::Reverse(wait), remaining)
    }

    /// Whether this descriptor lets the request through: everything but an enforced denial,
    /// block or failure.
    pub fn allows(&self) -> bool {
        !self.enforced || !self.denies()
    }

    /// Whether the limit itself says no — denied, blocked or failed — unless its rule is in
    /// shadow mode. What envoyproxy/ratelimit reports as the descriptor's `OVER_LIMIT`: the
    /// global shadow mode and quota mode change the request's answer, not this.
    pub fn denies(&self) -> bool {
        let shadow = self.applied.is_some_and(|a| a.shadow_mode());
        !shadow
            && match &self.status {
                Status::Counted(Ok(decision)) => !decision.allowed,
                Status::Counted(Err(_)) | Status::Blocked { .. } => true,
                _ => false,
            }
    }

    /// Whether the limit denied (or would have denied, in shadow mode).
    pub fn over_limit(&self) -> bool {
        matches!(
            &self.status,
            Status::Counted(Ok(Decision { allowed: false, .. }))
                | Status::Counted(Err(StoreError::Capacity(_)))
                | Status::Blocked { .. }
        )
    }
}

/// The answer to a request: allowed or not, and each descriptor's part in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<'r> {
    /// Whether every descriptor allows the request.
    pub allowed: bool,
    /// Whether the request would have been denied but the global shadow mode let it through.
    pub shadowed: bool,
    /// One entry per request descriptor, in order.
    pub descriptors: Vec<DescriptorVerdict<'r>>,
}

/// Service-wide modes of [`check_with`], as envoyproxy/ratelimit's `SHADOW_MODE` and
/// `QUOTA_MODE` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Modes {
    /// Every request is allowed; limits are counted (and reported over limit) as usual.
    pub shadow_mode: bool,
    /// Every limit is in quota mode.
    pub quota_mode: bool,
}

impl Modes {
    /// No global mode.
    pub const NONE: Modes = Modes {
        shadow_mode: false,
        quota_mode: false,
    };

    /// These modes.
    pub const fn new(shadow_mode: bool, quota_mode: bool) -> Modes {
        Modes {
            shadow_mode,
            quota_mode,
        }
    }
}

/// Checks a request against `rules`, counting in `store`. `hits_addend` is the request-level
/// cost (0 means 1); a descriptor's own `hits_addend` wins.
///
/// Every counted descriptor is asked of the store together ([`pipeline::decide`]), each with
/// its rule's `fail` mode and shadow flag: if an enforced limit denies (or a blocked rule
/// matches), the request is denied and no unit is consumed. An invalid limit override (a rate
/// above one per nanosecond) is reported as a [`StoreError::Backend`] describing it.
///
/// Rules' `fail` modes are applied by the store: wrap a store that can be away (Redis) in a
/// [`FallbackStore`](crate::store::FallbackStore) (see [`Store::applies_fail_modes`]); over
/// a bare one, its errors are reported as they are.
///
/// A request with one counted limit, in a store that answers at once ([`Store::check_now`]:
/// the memory store, a fallback store over it), is decided without allocating its key.
pub async fn check<'r, S: Store + ?Sized>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
) -> Verdict<'r> {
    check_with(rules, store, domain, descriptors, hits_addend, Modes::NONE).await
}

/// [`check`] under service-wide [`Modes`]. Quota mode (a rule's `quota_mode`, or every rule
/// with [`Modes::quota_mode`]) follows envoyproxy/ratelimit: the request is denied when an
/// enforced limit outside quota mode denies, or when **every** quota-mode limit of the request
/// denies; a quota-mode limit that denies while another passes is reported over its limit
/// and does not deny. The global shadow mode allows every request and counts as usual,
/// reporting each limit's own answer ([`DescriptorVerdict::denies`]) and
/// [`Verdict::shadowed`].
pub async fn check_with<'r, S: Store + ?Sized>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
    modes: Modes,
) -> Verdict<'r> {
    let plan = match Plan::of(rules, domain, descriptors, hits_addend, modes) {
        Ok(plan) => plan,
        Err(verdict) => return verdict,
    };
    if let Some(outcome) = plan.outcome_now(store, domain, descriptors) {
        return plan.verdict(outcome.results);
    }
    let keys: Vec<String> = plan
        .counted
        .iter()
        .map(|counted| {
            let mut key = String::new();
            plan.write_key(&mut key, domain, descriptors, counted);
            key
        })
        .collect();
    let asks: Vec<Ask<'_>> = plan
        .counted
        .iter()
        .zip(&keys)
        .map(|(counted, key)| plan.ask(key, counted))
        .collect();
    let outcome = pipeline::decide(store, &asks).await;
    plan.verdict(outcome.results)
}

/// [`check_with`]'s verdict when it can be had without waiting: the request counts one limit
/// or none, and the store answers at once ([`Store::check_now`]: the memory store does,
/// Redis does not). `None` when it cannot — then nothing was counted, and [`check_with`]
/// decides the request. The same steps as [`check_with`], which takes this path itself first.
///
/// ```
/// use flowgate::Quota;
/// use flowgate::envoy::{
///     Descriptor, DomainSpec, Entry, LimitSpec, Modes, Rate, RuleSet, RuleSpec, check_now,
/// };
/// use flowgate::store::MemoryStore;
///
/// let rules = RuleSet::build(vec![DomainSpec::new("api", vec![
///     RuleSpec::new("user").with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(1)))),
/// ])])
/// .unwrap();
/// let store = MemoryStore::new();
/// let request = [Descriptor::new(vec![Entry::new("user", "alice")])];
/// let first = check_now(&rules, &store, "api", &request, 1, Modes::NONE).unwrap();
/// let second = check_now(&rules, &store, "api", &request, 1, Modes::NONE).unwrap();
/// assert!(first.allowed && !second.allowed);
/// ```
pub fn check_now<'r, S: Store + ?Sized>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
    modes: Modes,
) -> Option<Verdict<'r>> {
    match Plan::of(rules, domain, descriptors, hits_addend, modes) {
        Ok(plan) => {
            let outcome = plan.outcome_now(store, domain, descriptors)?;
            Some(plan.verdict(outcome.results))
        }
        Err(verdict) => Some(verdict),
    }
}

/// A limit the store is asked about.
struct Counted {
    /// Its index in the resolved limits.
    index: usize,
    /// The quota it is counted under.
    quota: Quota,
    /// Whether the ask before it is another limit of the same descriptor.
    after_sibling: bool,
}

/// A resolved request, before the store's answers are in.
struct Plan<'r> {
    /// Every descriptor's limits (one each, unless a rule has several).
    resolved: Vec<Resolved<'r>>,
    /// How many descriptors the request has.
    descriptors: usize,
    /// The descriptors asked of the store, in request order (inline: no allocation for up to
    /// two).
    counted: smallvec::SmallVec<[Counted; 2]>,
    /// A blocked, enforced limit denies the request whatever the others say (outside quota
    /// mode, or every quota-mode limit blocked): the others are then only peeked, so nothing
    /// is consumed.
    blocked_enforced: bool,
    /// Whether some descriptor is a quota-mode limit.
    has_quota: bool,
    /// The service-wide modes.
    modes: Modes,
}

impl<'r> Plan<'r> {
    /// The plan for `descriptors` under `rules`, or the verdict of a request whose limit
    /// overrides are invalid (every descriptor failed).
    fn of(
        rules: &'r RuleSet,
        domain: &str,
        descriptors: &[Descriptor],
        hits_addend: u64,
        modes: Modes,
    ) -> Result<Self, Verdict<'r>> {
        match resolve(rules, domain, descriptors, hits_addend) {
            Ok(resolved) => Ok(Plan::new(resolved, descriptors.len(), modes)),
            Err(e) => {
                let request_hits = hits_addend.max(1);
                let failed = |d: &Descriptor| DescriptorVerdict {
                    applied: None,
                    status: Status::Counted(Err(StoreError::Backend(format!(
                        "invalid limit override: {e}"
                    )))),
                    hits: d.hits_addend.unwrap_or(request_hits),
                    charge: false,
                    enforced: !modes.shadow_mode,
                    others: Vec::new(),
                };
                Err(Verdict {
                    allowed: modes.shadow_mode,
                    shadowed: modes.shadow_mode,
                    descriptors: descriptors.iter().map(failed).collect(),
                })
            }
        }
    }

    /// The outcome, when the plan counts one limit (its key in a reused buffer) or none and
    /// the store answers at once; else `None`, nothing asked.
    fn outcome_now<S: Store + ?Sized>(
        &self,
        store: &S,
        domain: &str,
        descriptors: &[Descriptor],
    ) -> Option<pipeline::Outcome> {
        match self.counted.as_slice() {
            [] => pipeline::decide_now(store, &[]).ok(),
            [only] => crate::scratch::with_buffer(|key| {
                self.write_key(key, domain, descriptors, only);
                pipeline::decide_now(store, &[self.ask(key, only)]).ok()
            }),
            _ => None,
        }
    }

    fn new(resolved: Vec<Resolved<'r>>, descriptors: usize, modes: Modes) -> Self {
        let mut counted = smallvec::SmallVec::with_capacity(resolved.len());
        // One pass: what is counted, whether a blocked limit outside quota mode is enforced,
        // and whether every quota-mode limit is blocked and enforced (a shadow quota-mode
        // limit never denies, so its group never denies either).
        let (mut blocked_outside_quota, mut has_quota, mut quotas_all_blocked) =
            (false, false, true);
        for (index, r) in resolved.iter().enumerate() {
            let Some(applied) = live(r) else { continue };
            let rate = applied.rate();
            let quota = !matches!(rate, Rate::Unlimited)
                && (modes.quota_mode
                    || matches!(applied, AppliedLimit::Rule(rule) if rule.quota_mode));
            let blocked_enforced = matches!(rate, Rate::Blocked { .. }) && !applied.shadow_mode();
            if let Rate::Limited(quota) = rate {
                let after_sibling = counted
                    .last()
                    .is_some_and(|c: &Counted| resolved[c.index].descriptor == r.descriptor);
                counted.push(Counted {
                    index,
                    quota,
                    after_sibling,
                });
            }
            if quota {
                has_quota = true;
                quotas_all_blocked &= blocked_enforced;
            } else {
                blocked_outside_quota |= blocked_enforced;
            }
        }
        let blocked_enforced =
            !modes.shadow_mode && (blocked_outside_quota || has_quota && quotas_all_blocked);
        Plan {
            resolved,
            descriptors,
            counted,
            blocked_enforced,
            has_quota,
            modes,
        }
    }

    /// Appends the counter key of `counted` to `key`: the rule's own suffix, or one built from
    /// an override's quota.
    fn write_key(
        &self,
        key: &mut String,
        domain: &str,
        descriptors: &[Descriptor],
        counted: &Counted,
    ) {
        let entries = &descriptors[self.resolved[counted.index].descriptor].entries;
        match self.resolved[counted.index].applied {
            Some(AppliedLimit::Rule(rule)) => write_rule_key(key, domain, entries, rule),
            _ => write_key(key, domain, entries, &quota_suffix(&counted.quota)),
        }
    }

    /// The ask for `counted`, counted in `key`: the descriptor's hits, or none (a peek) when a
    /// blocked limit denies anyway — unless they are a charge, usage that happened anyway.
    fn ask<'a>(&self, key: &'a str, counted: &'a Counted) -> Ask<'a> {
        let r = &self.resolved[counted.index];
        let peek_only = self.blocked_enforced && !r.charge;
        let quota_mode = self.has_quota && is_quota(r, self.modes);
        // Another limit of the same quota-mode descriptor, right before it among the asks.
        let joins_previous = quota_mode && counted.after_sibling;
        Ask::new(key, &counted.quota)
            .cost(if peek_only { 0 } else { r.hits })
            .charge(r.charge)
            .fail(r.applied.and_then(|a| a.fail()))
            .shadow(self.modes.shadow_mode || r.applied.is_some_and(|a| a.shadow_mode()))
            .quota_mode(quota_mode)
            .joins_previous(joins_previous)
    }

    /// The verdict, given the store's `results` for the counted descriptors (in order).
    fn verdict(self, results: Results) -> Verdict<'r> {
        let mut results = results.into_iter();
        let mut counted = self.counted.iter().peekable();
        let mut descriptors: Vec<DescriptorVerdict<'r>> = self
            .resolved
            .iter()
            .copied()
            .enumerate()
            .map(|(i, r)| {
                let status = match r.applied.map(|a| a.rate()) {
                    None => Status::Unmatched,
                    Some(_) if r.replaced => Status::Replaced,
                    Some(Rate::Unlimited) => Status::Unlimited,
                    Some(Rate::Blocked { period }) => Status::Blocked { period },
                    Some(Rate::Limited(_)) => {
                        debug_assert_eq!(counted.peek().map(|c| c.index), Some(i));
                        counted.next();
                        let result = results.next().unwrap_or_else(|| {
                            Err(StoreError::Backend("the store gave no answer".into()))
                        });
                        Status::Counted(match result {
                            // Peeked only: what the limit would have said, unconsumed.
                            Ok(decision) if self.blocked_enforced && r.hits > 0 && !r.charge => {
                                Ok(Decision {
                                    allowed: decision.remaining >= r.hits,
                                    ..decision
                                })
                            }
                            other => other,
                        })
                    }
                };
                DescriptorVerdict {
                    applied: r.applied,
                    status,
                    hits: r.hits,
                    charge: r.charge,
                    enforced: true,
                    others: Vec::new(),
                }
            })
            .collect();
        let mut allowed = true;
        if self.has_quota {
            // Quota mode: its descriptors deny only if all of them do (a descriptor denies when
            // any of its limits does).
            let quota = |i: usize| is_quota(&self.resolved[i], self.modes);
            let mut denying = smallvec::SmallVec::<[bool; 4]>::from_elem(false, self.descriptors);
            let mut is_quota_descriptor = denying.clone();
            for (i, d) in descriptors.iter().enumerate() {
                if quota(i) {
                    let at = self.resolved[i].descriptor;
                    is_quota_descriptor[at] = true;
                    denying[at] |= d.denies();
                }
            }
            let mut quota_descriptors = (0..self.descriptors).filter(|&at| is_quota_descriptor[at]);
            let quotas_all_deny = quota_descriptors.clone().next().is_some()
                && quota_descriptors.all(|at| denying[at]);
            for (i, d) in descriptors.iter_mut().enumerate() {
                let enforced = !quota(i) || quotas_all_deny;
                allowed &= !enforced || !d.denies();
                d.enforced = enforced && !self.modes.shadow_mode;
            }
        } else {
            for d in &mut descriptors {
                allowed &= !d.denies();
                d.enforced = !self.modes.shadow_mode;
            }
        }
        if descriptors.len() > self.descriptors {
            descriptors = self.bind(descriptors);
        }
        Verdict {
            allowed: allowed || self.modes.shadow_mode,
            shadowed: !allowed && self.modes.shadow_mode,
            descriptors,
        }
    }

    /// One verdict per descriptor from one per limit: a rule's several limits become its
    /// binding limit's verdict, the others beside it.
    fn bind(&self, limits: Vec<DescriptorVerdict<'r>>) -> Vec<DescriptorVerdict<'r>> {
        let mut out: Vec<DescriptorVerdict<'r>> = Vec::with_capacity(self.descriptors);
        let mut group: Vec<DescriptorVerdict<'r>> = Vec::new();
        let mut limits = limits.into_iter().zip(&self.resolved).peekable();
        while let Some((verdict, r)) = limits.next() {
            group.push(verdict);
            if limits
                .peek()
                .is_some_and(|(_, next)| next.descriptor == r.descriptor)
            {
                continue;
            }
            let binding = group
                .iter()
                .enumerate()
                .min_by_key(|(_, d)| d.binding_order())
                .map_or(0, |(i, _)| i);
            let mut first = group.remove(binding);
            first.others = std::mem::take(&mut group);
            out.push(first);
        }
        out
    }
}

/// The limit that applies to `r`, unless another rule replaced it.
fn live<'r>(r: &Resolved<'r>) -> Option<AppliedLimit<'r>> {
    r.applied.filter(|_| !r.replaced)
}

/// Whether `r` is a quota-mode limit that counts or blocks (its rule's `quota_mode`, or every
/// limit under the global quota mode).
fn is_quota(r: &Resolved<'_>, modes: Modes) -> bool {
    match live(r) {
        Some(a) if !matches!(a.rate(), Rate::Unlimited) => {
            modes.quota_mode || matches!(a, AppliedLimit::Rule(rule) if rule.quota_mode)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::envoy::{DomainSpec, Entry, LimitOverride, LimitSpec, Rule, RuleSpec, Unit};
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
            Status::Counted(Ok(d)) => d.remaining,
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
        async fn refund(&self, ask: Ask<'_>) -> Result<(), StoreError> {
            self.0.refund(ask).await
        }
        async fn reset(&self, ask: Ask<'_>) -> Result<(), StoreError> {
            self.0.reset(ask).await
        }
    }

    fn compat_rules() -> RuleSet {
        RuleSet::build(vec![DomainSpec::new(
            "c",
            vec![
                // README example 11: files/* share one threshold, files_no_share/* do not.
                RuleSpec::new("files")
                    .with_value("files/*")
                    .sharing_threshold()
                    .with_limit(per_minute(10)),
                RuleSpec::new("files_no_share")
                    .with_value("files_no_share/*")
                    .with_limit(per_minute(10)),
                // Shared at an outer level, limited beneath it.
                RuleSpec::new("route")
                    .with_value("api/*")
                    .sharing_threshold()
                    .value_to_metric()
                    .with_children(vec![RuleSpec::new("method").with_limit(per_minute(2))]),
                RuleSpec::new("path")
                    .with_value("/api/*/action")
                    .with_limit(per_minute(1)),
                RuleSpec::new("q1").quota().with_limit(per_minute(1)),
                RuleSpec::new("q2").quota().with_limit(per_minute(2)),
                RuleSpec::new("plain").with_limit(per_minute(100)),
            ],
        )])
        .unwrap()
    }

    #[tokio::test]
    async fn share_threshold_counts_every_match_in_one_counter() {
        let (rules, store) = (compat_rules(), store());
        for i in 0..10 {
            let file = if i % 2 == 0 {
                "files/a.pdf"
            } else {
                "files/b.csv"
            };
            let v = check(&rules, &store, "c", &[one("files", file)], 1).await;
            assert!(v.allowed, "request {i}");
        }
        let v = check(&rules, &store, "c", &[one("files", "files/c.txt")], 1).await;
        assert!(!v.allowed, "the shared threshold of 10 is reached");
        for _ in 0..10 {
            let v = check(
                &rules,
                &store,
                "c",
                &[one("files_no_share", "files_no_share/a.pdf")],
                1,
            )
            .await;
            assert!(v.allowed);
        }
        let v = check(
            &rules,
            &store,
            "c",
            &[one("files_no_share", "files_no_share/a.pdf")],
            1,
        )
        .await;
        assert!(!v.allowed);
        let v = check(
            &rules,
            &store,
            "c",
            &[one("files_no_share", "files_no_share/b.csv")],
            1,
        )
        .await;
        assert!(v.allowed, "isolated thresholds");
        // An outer shared level: api/v1 and api/v2 share per method, GET and POST apart.
        let req = |route: &str, method: &str| {
            vec![Descriptor::new(vec![
                Entry::new("route", route),
                Entry::new("method", method),
            ])]
        };
        assert!(
            check(&rules, &store, "c", &req("api/v1", "GET"), 1)
                .await
                .allowed
        );
        assert!(
            check(&rules, &store, "c", &req("api/v2", "GET"), 1)
                .await
                .allowed
        );
        assert!(
            !check(&rules, &store, "c", &req("api/v3", "GET"), 1)
                .await
                .allowed
        );
        assert!(
            check(&rules, &store, "c", &req("api/v3", "POST"), 1)
                .await
                .allowed
        );
        // The admin lookup reads the same shared counter.
        let lookup = crate::envoy::inspect(&rules, &store, "c", &req("api/zzz", "GET")[0].entries)
            .await
            .unwrap();
        let crate::envoy::Lookup::Counters(states) = lookup else {
            panic!("{lookup:?}");
        };
        let state = &states[0];
        assert!(state.key.contains("route=api/*|"), "{}", state.key);
        assert_eq!(state.decision.remaining, 0);
    }

    #[tokio::test]
    async fn middle_and_multiple_wildcards_match() {
        let (rules, store) = (compat_rules(), store());
        let v = check(&rules, &store, "c", &[one("path", "/api/123/action")], 1).await;
        assert!(
            matches!(v.descriptors[0].applied, Some(AppliedLimit::Rule(r)) if r.path == "path_/api/*/action")
        );
        let v = check(&rules, &store, "c", &[one("path", "/api/123/other")], 1).await;
        assert_eq!(v.descriptors[0].status, Status::Unmatched);
    }

    #[tokio::test]
    async fn quota_mode_denies_only_when_every_quota_limit_denies() {
        let (rules, store) = (compat_rules(), store());
        let request = [one("q1", "u"), one("q2", "u"), one("plain", "p")];
        let v = check(&rules, &store, "c", &request, 1).await;
        assert!(v.allowed && v.descriptors.iter().all(|d| !d.denies()));
        // q1 is exhausted: reported over its limit, but q2 passes, so the request does.
        let v = check(&rules, &store, "c", &request, 1).await;
        assert!(v.allowed);
        assert!(v.descriptors[0].denies() && !v.descriptors[0].enforced);
        assert!(v.descriptors[0].allows());
        // Both exhausted: denied, and `plain` keeps its units.
        let v = check(&rules, &store, "c", &request, 1).await;
        assert!(!v.allowed);
        assert!(v.descriptors[0].enforced && v.descriptors[1].enforced);
        let v = check(&rules, &store, "c", &[one("plain", "p")], 1).await;
        assert_eq!(
            remaining(&v, 0),
            97,
            "two units taken before, none by the denied request"
        );
        // The global quota mode puts every limit in quota mode: `plain` alone passing is enough.
        let modes = Modes::new(false, true);
        let v = check_with(&rules, &store, "c", &request, 1, modes).await;
        assert!(v.allowed);
    }

    #[tokio::test]
    async fn global_shadow_mode_allows_and_reports_the_limits_answers() {
        let (rules, store) = (rules(), store());
        let modes = Modes::new(true, false);
        let request = [one("global", "g")];
        for n in 0..3 {
            let v = check_with(&rules, &store, "d", &request, 1, modes).await;
            assert!(v.allowed);
            assert_eq!((v.shadowed, v.descriptors[0].denies()), (n == 2, n == 2));
        }
        let v = check_with(&rules, &store, "d", &[one("user", "banned")], 1, modes).await;
        assert!(v.allowed && v.shadowed && v.descriptors[0].denies());
        let v = check(&rules, &store, "d", &request, 1).await;
        assert!(!v.allowed && !v.shadowed);
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

    /// `check_now` gives `check_with`'s verdict whenever it gives one (twin stores, the same
    /// requests in the same order), and where it gives none — several limits counted, or a
    /// store that must be waited for — it has counted nothing.
    #[tokio::test]
    async fn check_now_decides_as_check_with_or_counts_nothing() {
        let rules = rules();
        let (now, with) = (store(), store());
        let invalid = Descriptor {
            limit: Some(LimitOverride {
                requests_per_unit: u64::MAX,
                unit: Unit::Second,
            }),
            ..one("user", "o")
        };
        let requests: Vec<Vec<Descriptor>> = vec![
            vec![one("user", "a")],
            vec![one("route", "r")],
            vec![one("user", "banned")],
            vec![one("user", "vip")],
            vec![one("nothing", "x")],
            vec![],
            vec![invalid],
            vec![one("global", "g"), one("user", "a")],
        ];
        let mut decided_now = 0;
        for round in 0..5 {
            for request in &requests {
                for hits in [0, 1, 2] {
                    let expected = check_with(&rules, &with, "d", request, hits, Modes::NONE).await;
                    let got = match check_now(&rules, &now, "d", request, hits, Modes::NONE) {
                        Some(verdict) => {
                            decided_now += 1;
                            verdict
                        }
                        // Nothing counted: the full check on the same store agrees.
                        None => check_with(&rules, &now, "d", request, hits, Modes::NONE).await,
                    };
                    assert_eq!(got, expected, "round {round}, {request:?}, hits {hits}");
                }
            }
        }
        // All but the request with two limits.
        assert_eq!(decided_now, 5 * 7 * 3);

        let waiting = Waiting(store());
        let request = [one("user", "w")];
        for _ in 0..5 {
            assert!(check_now(&rules, &waiting, "d", &request, 1, Modes::NONE).is_none());
        }
        for i in 0..3 {
            let v = check_with(&rules, &waiting, "d", &request, 1, Modes::NONE).await;
            assert!(v.allowed, "request {i}: check_now counted");
        }
        assert!(
            !check_with(&rules, &waiting, "d", &request, 1, Modes::NONE)
                .await
                .allowed
        );
    }

    /// Envoy Gateway's token budget: the request path checks with `hits_addend: 0`, the
    /// response path (`apply_on_stream_done`) repeats the descriptors with the tokens used.
    #[tokio::test]
    async fn a_charged_rule_takes_the_tokens_used_and_refuses_until_repaid() {
        let quota = Quota::per_minute(1000); // GCRA: T = 60 ms
        let rules = RuleSet::build(vec![DomainSpec::new(
            "llm",
            vec![RuleSpec::new("user").with_limit(LimitSpec::new(Rate::Limited(quota)).charged())],
        )])
        .unwrap();
        let clock = ManualClock::new(1 << 40);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let mut request = one("user", "ann");
        request.hits_addend = Some(0);
        assert!(
            check(&rules, &store, "llm", &[request.clone()], 0)
                .await
                .allowed
        );
        // The response used 5000 tokens: charged although the burst is 1000.
        let v = check(&rules, &store, "llm", &[one("user", "ann")], 5000).await;
        assert!(v.allowed && !v.descriptors[0].over_limit());
        let Status::Counted(Ok(charged)) = &v.descriptors[0].status else {
            panic!("{v:?}")
        };
        assert_eq!(charged.remaining, 0);
        assert_eq!(charged.reset_after, Duration::from_secs(300));
        assert_eq!(charged.retry_after, Duration::from_secs(240));
        // The next request is refused until the debt of 4000 tokens is repaid.
        let v = check(&rules, &store, "llm", &[request.clone()], 0).await;
        assert!(!v.allowed && v.descriptors[0].over_limit());
        let Status::Counted(Ok(refused)) = &v.descriptors[0].status else {
            panic!("{v:?}")
        };
        assert_eq!(refused.retry_after, Duration::from_secs(240));
        clock.advance(Duration::from_secs(240) - Duration::from_nanos(1));
        assert!(
            !check(&rules, &store, "llm", &[request.clone()], 0)
                .await
                .allowed
        );
        clock.advance(Duration::from_nanos(1));
        assert!(check(&rules, &store, "llm", &[request], 0).await.allowed);
        // A descriptor may say it is a charge itself, on any rule.
        let (rules, store) = (super::tests::rules(), super::tests::store());
        let mut charge = one("user", "a");
        charge.charge = true;
        let v = check(&rules, &store, "d", &[charge.clone()], 10).await;
        assert!(v.allowed);
        assert!(
            !check(&rules, &store, "d", &[one("user", "a")], 1)
                .await
                .allowed
        );
        // Beside a blocked limit, which denies the request, the charge is still taken (usage
        // that happened), and never refunded.
        let mut other = charge;
        other.entries = vec![Entry::new("user", "b")];
        let v = check(&rules, &store, "d", &[one("user", "banned"), other], 2).await;
        assert!(!v.allowed);
        assert_eq!(remaining(&v, 1), 1, "the charge of 2 was taken: {v:?}");
        assert!(
            check(&rules, &store, "d", &[one("user", "b")], 1)
                .await
                .allowed
        );
        assert!(
            !check(&rules, &store, "d", &[one("user", "b")], 1)
                .await
                .allowed
        );
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
        assert_eq!(
            v.descriptors[0].status,
            Status::Blocked {
                period: Duration::from_secs(60)
            }
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

    /// "2 per minute and 5 per hour for each key" (fixed windows), and a quota-mode pair.
    fn two_limit_rules() -> RuleSet {
        let hourly = || {
            LimitSpec::new(Rate::Limited(
                Quota::new(5, Duration::from_secs(3600))
                    .unwrap()
                    .with_algorithm(Algorithm::FixedWindow)
                    .unwrap(),
            ))
        };
        RuleSet::build(vec![DomainSpec::new(
            "m",
            vec![
                RuleSpec::new("key")
                    .with_limit(per_minute(2).named("minute"))
                    .with_limit(hourly().named("hour")),
                RuleSpec::new("q")
                    .quota()
                    .with_limit(per_minute(1))
                    .with_limit(hourly()),
                RuleSpec::new("q2").quota().with_limit(per_minute(3)),
                RuleSpec::new("charged")
                    .with_limit(per_minute(2).charged())
                    .with_limit(hourly().charged()),
                RuleSpec::new("qr")
                    .quota()
                    .with_limit(per_minute(5).named("qr_minute"))
                    .with_limit(hourly()),
                RuleSpec::new("replacer").with_limit(per_minute(100).replacing(["qr_minute"])),
            ],
        )])
        .unwrap()
    }

    /// A descriptor that takes nothing (`hits_addend: 0`).
    fn peek(key: &str, value: &str) -> Descriptor {
        let mut d = one(key, value);
        d.hits_addend = Some(0);
        d
    }

    fn binding(v: &Verdict<'_>, i: usize) -> (Option<String>, u64, bool) {
        let d = &v.descriptors[i];
        let Status::Counted(Ok(decision)) = &d.status else {
            panic!("{d:?}")
        };
        let Some(AppliedLimit::Rule(rule)) = d.applied else {
            panic!("{d:?}")
        };
        (rule.name.clone(), decision.remaining, decision.allowed)
    }

    #[tokio::test]
    async fn every_limit_of_a_rule_must_allow_and_a_refusal_burns_none() {
        let rules = two_limit_rules();
        let clock = ManualClock::new(1 << 40);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let key = [one("key", "k1")];
        // All allow: the binding limit is the one with the least remaining.
        let v = check(&rules, &store, "m", &key, 1).await;
        assert!(v.allowed);
        assert_eq!(binding(&v, 0), (Some("minute".into()), 1, true));
        assert_eq!(v.descriptors[0].others.len(), 1);
        assert_eq!(v.descriptors[0].limits().count(), 2);
        assert!(check(&rules, &store, "m", &key, 1).await.allowed);
        // The minute refuses: named as binding, and the hour's unit is given back.
        let v = check(&rules, &store, "m", &key, 1).await;
        assert!(!v.allowed);
        assert_eq!(binding(&v, 0), (Some("minute".into()), 0, false));
        let Status::Counted(Ok(hour)) = &v.descriptors[0].others[0].status else {
            panic!("{v:?}")
        };
        // What the hour said at the time; its unit was given back (seen below).
        assert_eq!((hour.allowed, hour.remaining), (true, 2));
        for _ in 0..5 {
            assert!(!check(&rules, &store, "m", &key, 1).await.allowed);
        }
        clock.advance(Duration::from_secs(60));
        // 3 of the hour left: 2 now, 1 the next minute, then the hour refuses.
        assert!(check(&rules, &store, "m", &key, 1).await.allowed);
        let v = check(&rules, &store, "m", &key, 1).await;
        assert_eq!(binding(&v, 0), (Some("minute".into()), 0, true));
        clock.advance(Duration::from_secs(60));
        let v = check(&rules, &store, "m", &key, 1).await;
        assert!(v.allowed);
        assert_eq!(binding(&v, 0), (Some("hour".into()), 0, true));
        let v = check(&rules, &store, "m", &key, 1).await;
        assert!(!v.allowed);
        assert_eq!(binding(&v, 0), (Some("hour".into()), 0, false));
        // The minute allowed (its answer at the time)…
        let Status::Counted(Ok(minute)) = &v.descriptors[0].others[0].status else {
            panic!("{v:?}")
        };
        assert_eq!((minute.allowed, minute.remaining), (true, 0));
        // …but its unit was given back: the admin sees 1 left, and resets both counters.
        let entries = &key[0].entries;
        let crate::envoy::Lookup::Counters(counters) =
            crate::envoy::inspect(&rules, &store, "m", entries)
                .await
                .unwrap()
        else {
            panic!("counted")
        };
        let left: Vec<u64> = counters.iter().map(|c| c.decision.remaining).collect();
        assert_eq!(left, [1, 0]);
        assert_ne!(counters[0].key, counters[1].key);
        crate::envoy::reset(&rules, &store, "m", entries)
            .await
            .unwrap();
        let v = check(&rules, &store, "m", &[peek("key", "k1")], 1).await;
        let left: Vec<u64> = v.descriptors[0]
            .limits()
            .map(|d| match &d.status {
                Status::Counted(Ok(d)) => d.remaining,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(left, [2, 5]);
    }

    #[tokio::test]
    async fn several_limits_beside_other_descriptors_refund_exactly() {
        /// Four requests of `key` (2 per minute, 5 per hour) with `other`; then what is left.
        async fn run<S: Store>(rules: &RuleSet, store: &S) -> Verdict<'static> {
            let request = [one("key", "a"), one("q2", "x")];
            for n in 0..4 {
                let v = check(rules, store, "m", &request, 1).await;
                assert_eq!(v.allowed, n < 2, "request {n}");
            }
            let v = check(rules, store, "m", &[peek("key", "a"), peek("q2", "x")], 1).await;
            let left = v.descriptors.iter().flat_map(DescriptorVerdict::limits);
            let left: Vec<Status> = left.map(|d| d.status.clone()).collect();
            Verdict {
                allowed: v.allowed,
                shadowed: false,
                descriptors: left
                    .into_iter()
                    .map(|status| DescriptorVerdict {
                        applied: None,
                        status,
                        hits: 0,
                        charge: false,
                        enforced: true,
                        others: Vec::new(),
                    })
                    .collect(),
            }
        }
        let rules = two_limit_rules();
        let a = run(&rules, &store()).await;
        let b = run(&rules, &Waiting(store())).await;
        assert_eq!(a, b, "at once and through the futures");
        let left: Vec<u64> = a
            .descriptors
            .iter()
            .map(|d| match &d.status {
                Status::Counted(Ok(d)) => d.remaining,
                other => panic!("{other:?}"),
            })
            .collect();
        // key: minute 0 of 2, hour 3 of 5; q2 (alone in quota mode): 1 of 3.
        assert_eq!(left, [0, 3, 1]);
    }

    #[tokio::test]
    async fn a_quota_mode_descriptor_with_several_limits_denies_when_any_of_them_does() {
        let rules = two_limit_rules();
        let store = store();
        let request = [one("q", "u"), one("q2", "u")];
        // 1st: both pass. 2nd: q's minute denies (so q denies), q2 passes: allowed.
        assert!(check(&rules, &store, "m", &request, 1).await.allowed);
        let v = check(&rules, &store, "m", &request, 1).await;
        assert!(v.allowed && v.descriptors[0].denies() && !v.descriptors[0].enforced);
        // 3rd: q2 passes again; 4th: q2 exhausted too, so denied, and nothing is consumed.
        assert!(check(&rules, &store, "m", &request, 1).await.allowed);
        let v = check(&rules, &store, "m", &request, 1).await;
        assert!(!v.allowed);
        let v = check(&rules, &store, "m", &[peek("q", "u")], 1).await;
        let Status::Counted(Ok(hour)) = &v.descriptors[0].others[0].status else {
            panic!("{v:?}")
        };
        assert_eq!(
            hour.remaining, 2,
            "taken by the three allowed requests only"
        );
    }

    #[tokio::test]
    async fn quota_groups_follow_descriptors_when_a_limit_is_replaced() {
        // qr's minute is replaced: its hour alone is asked, right after q2's ask, and must not
        // be taken for another limit of q2's descriptor.
        let rules = two_limit_rules();
        let store = store();
        let request = [one("q2", "x"), one("qr", "x"), one("replacer", "x")];
        for n in 0..4 {
            let v = check(&rules, &store, "m", &request, 1).await;
            assert!(v.allowed, "request {n}: qr's hour allows: {v:?}");
        }
        let v = check(&rules, &store, "m", &[peek("qr", "x")], 1).await;
        let left: Vec<(Option<&str>, u64)> = v.descriptors[0]
            .limits()
            .map(|d| match (&d.applied, &d.status) {
                (Some(AppliedLimit::Rule(rule)), Status::Counted(Ok(d))) => {
                    (rule.name.as_deref(), d.remaining)
                }
                other => panic!("{other:?}"),
            })
            .collect();
        // The hour binds (least remaining): four allowed requests took four of its units;
        // the replaced minute none.
        assert_eq!(left, [(None, 1), (Some("qr_minute"), 5)]);
    }

    #[tokio::test]
    async fn a_charge_is_taken_on_every_limit() {
        let rules = two_limit_rules();
        let store = store();
        let v = check(&rules, &store, "m", &[one("charged", "c")], 3).await;
        assert!(v.allowed, "a charge is taken whatever the limits say");
        let v = check(&rules, &store, "m", &[peek("charged", "c")], 1).await;
        assert!(!v.allowed);
        let left: Vec<(bool, u64)> = v.descriptors[0]
            .limits()
            .map(|d| match &d.status {
                Status::Counted(Ok(d)) => (d.allowed, d.remaining),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(left, [(false, 0), (true, 2)]);
    }

    #[test]
    fn several_limits_are_validated() {
        let build = |rule: RuleSpec| RuleSet::build(vec![DomainSpec::new("d", vec![rule])]);
        let err = |rule| build(rule).unwrap_err().kind;
        let rule = || RuleSpec::new("k").with_limit(per_minute(1).named("a"));
        assert_eq!(
            err(rule().with_limit(per_minute(1))),
            crate::envoy::RuleErrorKind::DuplicateLimit {
                index: 1,
                what: "quota"
            }
        );
        assert_eq!(
            err(rule().with_limit(per_minute(2).named("a"))),
            crate::envoy::RuleErrorKind::DuplicateLimit {
                index: 1,
                what: "name"
            }
        );
        assert_eq!(
            err(rule().with_limit(per_minute(2).replacing(["a"]))),
            crate::envoy::RuleErrorKind::ReplacesItself("a".into())
        );
        assert_eq!(
            err(rule().with_limit(LimitSpec::new(Rate::Unlimited))),
            crate::envoy::RuleErrorKind::UncountedAmongLimits
        );
        let set = build(rule().with_limit(per_minute(2))).unwrap();
        let names: Vec<&str> = set.rules().iter().map(Rule::display_name).collect();
        assert_eq!(names, ["a", "k#1"]);
        let entries = [Entry::new("k", "v")];
        let paths: Vec<String> = set
            .rules()
            .iter()
            .map(|r| r.metric_name(&entries))
            .collect();
        assert_eq!(paths, ["k#0", "k#1"], "each limit in its own series");
        assert_eq!(set.find_limits("d", &entries).len(), 2);
        assert_eq!(set.find("d", &[Entry::new("k", "v")]).unwrap().id, 0);
    }
}
