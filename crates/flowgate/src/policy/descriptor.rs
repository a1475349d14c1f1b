//! Checking request descriptors against a [`RuleSet`]: the envoyproxy/ratelimit request model.
//!
//! A request names a domain and carries one or more [`Descriptor`]s; each is matched to at most
//! one rule ([`RuleSet::find`]) or carries its own limit override, and [`check`] asks the store
//! for all of them at once with [`acquire_all`](super::acquire_all()): the request is allowed only
//! if every enforced limit allows, and a denied request consumes nothing anywhere.
//!
//! The envoyproxy/ratelimit rules, all implemented here:
//! * `hits_addend`: a descriptor's own value wins (0 peeks); otherwise the request's, where 0
//!   means 1.
//! * A descriptor's `limit` override replaces whatever rule matches (when the domain exists);
//!   it is enforced (no shadow mode) with the default algorithm.
//! * `unlimited` rules always allow; `requests_per_unit: 0` (blocked) always denies; a rule in
//!   shadow mode counts but never denies.
//! * A rule whose `name` is listed in the `replaces` of another rule matched by the same request
//!   is skipped.
//!
//! Counters are keyed by domain, the request's entries and the quota, so a rule whose quota is
//! unchanged by a configuration reload keeps its counters, and a changed one starts afresh.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use flowgate::policy::descriptor::{check, Descriptor, Entry};
//! use flowgate::policy::rules::{DomainSpec, LimitSpec, Rate, RuleSet, RuleSpec};
//! use flowgate::{store::MemoryStore, Quota};
//!
//! let rules = RuleSet::build(vec![DomainSpec::new("api", vec![
//!     RuleSpec::new("user").with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(2)?))),
//! ])])?;
//! let store = MemoryStore::new();
//! let request = [Descriptor::new(vec![Entry::new("user", "alice")])];
//! assert!(check(&rules, &store, "api", &request, 1).await.allowed);
//! assert!(check(&rules, &store, "api", &request, 1).await.allowed);
//! assert!(!check(&rules, &store, "api", &request, 1).await.allowed);
//! # Ok(()) }
//! ```

use std::time::Duration;

use crate::decision::{Decision, FailMode};
use crate::quota::{Algorithm, Quota, QuotaError};
use crate::store::{Acquire, FallbackStore, Store, StoreError};

use super::rules::{Rate, Rule, RuleSet, Unit, quota_suffix};
use super::{Outcome, acquire_all, settle};
use crate::clock::Clock;

/// The algorithm of rules that do not name one, and of limit overrides.
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::SlidingWindow;

/// One `(key, value)` entry of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Entry {
    /// The entry's key, e.g. `remote_address`.
    pub key: String,
    /// The entry's value, e.g. `10.0.0.1`.
    pub value: String,
}

impl Entry {
    /// An entry.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// A limit sent with the request instead of the configured one (Envoy's
/// `RateLimitDescriptor.limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests allowed per unit; 0 denies everything.
    pub requests_per_unit: u64,
    /// The period.
    pub unit: Unit,
}

/// One descriptor of a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// The entries, outermost first.
    pub entries: Vec<Entry>,
    /// A limit that overrides the configured rules.
    pub limit: Option<LimitOverride>,
    /// Units this descriptor costs; overrides the request's `hits_addend` (0 peeks).
    pub hits_addend: Option<u64>,
}

impl Descriptor {
    /// A descriptor with these entries, no override and the request's hits.
    pub fn new(entries: Vec<Entry>) -> Self {
        Descriptor {
            entries,
            limit: None,
            hits_addend: None,
        }
    }
}

/// The limit that was applied to a descriptor: a configured [`Rule`] or a request override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied<'r> {
    /// A rule of the configuration.
    Rule(&'r Rule),
    /// The descriptor's own limit, with the quota built from it (`None`: 0 per unit, blocked).
    Override(LimitOverride, Option<Quota>),
}

impl Applied<'_> {
    /// What the applied limit does.
    pub fn rate(&self) -> Rate {
        match self {
            Applied::Rule(rule) => rule.rate,
            Applied::Override(_, Some(quota)) => Rate::Limited(*quota),
            Applied::Override(o, None) => Rate::Blocked {
                period: o.unit.duration(),
            },
        }
    }

    /// The rule's name, if it has one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Applied::Rule(rule) => rule.name.as_deref(),
            Applied::Override(..) => None,
        }
    }

    /// Whether the limit counts without denying.
    pub fn shadow_mode(&self) -> bool {
        matches!(self, Applied::Rule(rule) if rule.shadow_mode)
    }

    /// The rule's failure mode (`fail`), if it sets one; overrides use the store's default.
    pub fn fail(&self) -> Option<FailMode> {
        match self {
            Applied::Rule(rule) => rule.fail,
            Applied::Override(..) => None,
        }
    }
}

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
    pub applied: Option<Applied<'r>>,
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

/// Which limit applies to each descriptor, before asking any store: [`RuleSet::find`], limit
/// overrides, `unlimited` and `replaces`. `applied` is `None` when no limit applies.
///
/// Each entry's `status` is `Unmatched`, `Replaced` or `Unlimited`, or a placeholder
/// `Checked` for the limits [`check`] then asks the store about; `hits` is the
/// descriptor's cost.
pub fn resolve<'r>(
    rules: &'r RuleSet,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
) -> Result<Vec<DescriptorVerdict<'r>>, QuotaError> {
    let request_hits = hits_addend.max(1);
    let hits = |d: &Descriptor| d.hits_addend.unwrap_or(request_hits);
    let Some(domain_rules) = rules.domain(domain) else {
        return Ok(descriptors
            .iter()
            .map(|d| DescriptorVerdict {
                applied: None,
                status: Status::Unmatched,
                hits: hits(d),
            })
            .collect());
    };
    let mut resolved = Vec::with_capacity(descriptors.len());
    for descriptor in descriptors {
        let applied = match descriptor.limit {
            Some(over) if over.requests_per_unit == 0 => Some(Applied::Override(over, None)),
            Some(over) => {
                let quota = Quota::new(over.requests_per_unit, over.unit.duration())?
                    .with_algorithm(DEFAULT_ALGORITHM)?;
                Some(Applied::Override(over, Some(quota)))
            }
            None => domain_rules.find(&descriptor.entries).map(Applied::Rule),
        };
        let status = match applied {
            None => Status::Unmatched,
            Some(Applied::Rule(rule)) if rule.rate == Rate::Unlimited => Status::Unlimited,
            Some(_) => Status::Checked(Decision {
                allowed: true,
                limit: 0,
                remaining: 0,
                reset_after: Duration::ZERO,
                retry_after: Duration::ZERO,
                fallback: None,
            }),
        };
        resolved.push(DescriptorVerdict {
            applied,
            status,
            hits: hits(descriptor),
        });
    }
    // `replaces`: a named rule is skipped when any matched rule (even an unlimited one) names it.
    let replaced: Vec<&str> = resolved
        .iter()
        .filter_map(|v| match v.applied {
            Some(Applied::Rule(rule)) => Some(rule.replaces.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    if !replaced.is_empty() {
        for v in &mut resolved {
            if let Some(Applied::Rule(rule)) = v.applied
                && rule.name.as_deref().is_some_and(|n| replaced.contains(&n))
            {
                v.status = Status::Replaced;
            }
        }
    }
    Ok(resolved)
}

/// The store key of a descriptor's counter: the domain, every entry, and the quota (algorithm,
/// limit, period, burst). Entries are escaped so that different descriptors never share a key;
/// a rule keeps its counters across reloads as long as its quota is unchanged.
///
/// ```
/// use flowgate::policy::descriptor::{counter_key, Entry};
/// use flowgate::Quota;
/// let quota = Quota::per_second(10)?;
/// assert_eq!(
///     counter_key("edge", &[Entry::new("ip", "10.0.0.1")], &quota),
///     "edge|ip=10.0.0.1#gcra:10:1000000000:10",
/// );
/// # Ok::<(), flowgate::QuotaError>(())
/// ```
pub fn counter_key(domain: &str, entries: &[Entry], quota: &Quota) -> String {
    let mut key = String::new();
    write_key(&mut key, domain, entries, &quota_suffix(quota));
    key
}

/// Appends the counter key of `entries` to `key`.
fn write_key(key: &mut String, domain: &str, entries: &[Entry], suffix: &str) {
    escape_into(key, domain);
    for entry in entries {
        key.push('|');
        escape_into(key, &entry.key);
        key.push('=');
        escape_into(key, &entry.value);
    }
    key.push_str(suffix);
}

thread_local! {
    /// A reused buffer for the counter key of a request asked of a store that answers at once.
    static KEY_SCRATCH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Appends `s` with the key's separators (`|`, `=`, `#`) and the escape character escaped.
fn escape_into(key: &mut String, s: &str) {
    if !s.bytes().any(|b| matches!(b, b'\\' | b'|' | b'=' | b'#')) {
        key.push_str(s);
        return;
    }
    for c in s.chars() {
        if matches!(c, '\\' | '|' | '=' | '#') {
            key.push('\\');
        }
        key.push(c);
    }
}

/// A denial for a blocked limit (`requests_per_unit: 0`): nothing is ever left, and the period
/// is the time to wait.
fn blocked(period: Duration) -> Decision {
    Decision {
        allowed: false,
        limit: 0,
        remaining: 0,
        reset_after: period,
        retry_after: period.max(Duration::from_nanos(1)),
        fallback: None,
    }
}

/// Checks a request against `rules`, counting in `store`. `hits_addend` is the request-level
/// cost (0 means 1); a descriptor's own `hits_addend` wins.
///
/// Every counted descriptor is sent to the store in one [`acquire_all`] call. If an enforced
/// limit denies (or a blocked rule matches), the request is denied and no unit is consumed.
/// An invalid limit override (a rate above one per nanosecond) is reported as
/// [`Status::Failed`] with a [`StoreError::Backend`] describing it.
pub async fn check<'r, S: Store>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
) -> Verdict<'r> {
    check_in(rules, &Plain(store), domain, descriptors, hits_addend).await
}

/// Like [`check`], counting in a [`FallbackStore`] that is told each rule's `fail` mode: while
/// the shared store (Redis) is away, a rule with `fail: closed` denies, `fail: local` decides
/// with this instance's share of the quota, and `fail: open` (or no `fail`, with the store's
/// default mode) allows. Such decisions carry [`Decision::fallback`].
pub async fn check_with_fallback<'r, S: Store, C: Clock + Clone>(
    rules: &'r RuleSet,
    store: &FallbackStore<S, C>,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
) -> Verdict<'r> {
    check_in(rules, &WithModes(store), domain, descriptors, hits_addend).await
}

/// How [`check_in`] asks for units: from a plain [`Store`], or from a [`FallbackStore`] told
/// each limit's failure mode.
trait Counters: Sync {
    /// Asks for one limit's units without waiting, if the store can answer at once.
    fn try_now(&self, request: Acquire<'_>) -> Option<Result<Decision, StoreError>>;

    /// Asks for one limit's units.
    fn acquire_one(
        &self,
        request: Acquire<'_>,
        fail: Option<FailMode>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Asks for every limit's units; gives them back unless every enforced one grants.
    fn acquire_every(
        &self,
        requests: &[Acquire<'_>],
        fails: &[Option<FailMode>],
        enforced: impl Fn(usize) -> bool + Send,
    ) -> impl Future<Output = Outcome> + Send;
}

/// A store whose errors are reported as they are.
struct Plain<'s, S>(&'s S);

impl<S: Store> Counters for Plain<'_, S> {
    fn try_now(&self, request: Acquire<'_>) -> Option<Result<Decision, StoreError>> {
        self.0
            .try_acquire_now(request.key, request.quota, request.cost)
    }

    fn acquire_one(
        &self,
        request: Acquire<'_>,
        _fail: Option<FailMode>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.0.acquire(request.key, request.quota, request.cost)
    }

    fn acquire_every(
        &self,
        requests: &[Acquire<'_>],
        _fails: &[Option<FailMode>],
        enforced: impl Fn(usize) -> bool + Send,
    ) -> impl Future<Output = Outcome> + Send {
        acquire_all(self.0, requests, enforced)
    }
}

/// A fallback store, told each limit's failure mode.
struct WithModes<'s, S, C: Clock>(&'s FallbackStore<S, C>);

impl<S: Store, C: Clock + Clone> Counters for WithModes<'_, S, C> {
    /// Never: the fallback's breaker and modes are applied on the way to the store.
    fn try_now(&self, _request: Acquire<'_>) -> Option<Result<Decision, StoreError>> {
        None
    }

    fn acquire_one(
        &self,
        request: Acquire<'_>,
        fail: Option<FailMode>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let mode = fail.unwrap_or(self.0.fail_mode());
        self.0
            .acquire_with(request.key, request.quota, request.cost, mode)
    }

    async fn acquire_every(
        &self,
        requests: &[Acquire<'_>],
        fails: &[Option<FailMode>],
        enforced: impl Fn(usize) -> bool + Send,
    ) -> Outcome {
        let default = self.0.fail_mode();
        let modes: Vec<FailMode> = fails.iter().map(|f| f.unwrap_or(default)).collect();
        let results = self.0.acquire_many_with(requests, &modes).await;
        settle(self.0, requests, results, enforced).await
    }
}

async fn check_in<'r, C: Counters>(
    rules: &'r RuleSet,
    store: &C,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
) -> Verdict<'r> {
    // Everything that needs no waiting is done in plain functions: most requests (one counted
    // limit, a store that answers at once) never reach an `.await`.
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
                Some(Rate::Blocked { period }) => v.status = Status::Checked(blocked(period)),
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
        Some(Applied::Rule(rule)) => {
            write_key(key, domain, &descriptor.entries, rule.counter_suffix());
        }
        _ => write_key(key, domain, &descriptor.entries, &quota_suffix(quota)),
    }
}

/// Matches the request and, when no counted limit or exactly one on a store that answers at
/// once is involved, decides it without waiting.
fn check_at_once<'r, C: Counters>(
    rules: &'r RuleSet,
    store: &C,
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
            let now = KEY_SCRATCH.with_borrow_mut(|key| {
                key.clear();
                write_counter_key(key, domain, v, &descriptors[i], &quota);
                store.try_now(Acquire {
                    key,
                    quota: &quota,
                    cost,
                })
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

/// Asks the store about every counted descriptor of `pending` and waits: one request
/// directly, several at once with [`acquire_all`](super::acquire_all())'s all-or-nothing.
async fn ask_store<C: Counters>(
    store: &C,
    domain: &str,
    descriptors: &[Descriptor],
    pending: &Pending<'_>,
) -> Vec<Result<Decision, StoreError>> {
    let mut keys = Vec::new();
    let mut quotas = Vec::new();
    for (v, descriptor) in pending.verdicts.iter().zip(descriptors) {
        if let (Some(quota), Some(applied)) = (Pending::counted(v), v.applied) {
            let mut key = String::new();
            write_counter_key(&mut key, domain, v, descriptor, &quota);
            keys.push(key);
            quotas.push((
                quota,
                pending.cost(v.hits),
                applied.shadow_mode(),
                applied.fail(),
            ));
        }
    }
    let requests: Vec<Acquire<'_>> = keys
        .iter()
        .zip(&quotas)
        .map(|(key, (quota, cost, _, _))| Acquire {
            key,
            quota,
            cost: *cost,
        })
        .collect();
    if let [request] = requests.as_slice() {
        return vec![store.acquire_one(*request, quotas[0].3).await];
    }
    let fails: Vec<Option<FailMode>> = quotas.iter().map(|q| q.3).collect();
    store
        .acquire_every(&requests, &fails, |i| !quotas[i].2)
        .await
        .results
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::policy::rules::{DomainSpec, LimitSpec, RuleSpec};
    use crate::store::MemoryStore;

    fn per_minute(n: u64) -> LimitSpec {
        LimitSpec::new(Rate::Limited(
            Quota::per_minute(n)
                .unwrap()
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

    /// The memory store without its at-once answer: every request goes through `acquire`'s
    /// future and an owned key.
    struct Waiting(MemoryStore<ManualClock>);

    impl Store for Waiting {
        async fn acquire(
            &self,
            key: &str,
            quota: &Quota,
            cost: u64,
        ) -> Result<Decision, StoreError> {
            self.0.acquire(key, quota, cost).await
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
            Some(Applied::Override(..))
        ));
        assert!(!check(&rules, &store, "d", &[d.clone()], 1).await.allowed);
        d.limit = Some(LimitOverride {
            requests_per_unit: 0,
            unit: Unit::Second,
        });
        assert!(!check(&rules, &store, "d", &[d], 1).await.allowed);
    }

    #[test]
    fn counter_keys_are_unambiguous_and_include_the_quota() {
        let q = Quota::per_second(1).unwrap();
        let a = counter_key("d", &[Entry::new("a|b", "c")], &q);
        let b = counter_key("d", &[Entry::new("a", "b=c")], &q);
        let c = counter_key("d", &[Entry::new("a", "b"), Entry::new("", "c")], &q);
        assert!(a != b && b != c && a != c, "{a} {b} {c}");
        assert_ne!(
            counter_key("d", &[Entry::new("a", "b")], &q),
            counter_key("d", &[Entry::new("a", "b")], &Quota::per_second(2).unwrap())
        );
    }
}
