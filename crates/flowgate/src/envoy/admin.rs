//! The counters of a rule set, looked at or forgotten by an operator: [`inspect`] and
//! [`reset`] find the rule a descriptor matches, build each of its limits' counter key exactly
//! as [`check`] does, and [`peek`](Store::peek) or [`reset`](Store::reset) them in the store
//! (a rule with several limits has one counter per limit).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use flowgate::envoy::{self, Descriptor, DomainSpec, Entry, LimitSpec, Lookup, Rate, RuleSet, RuleSpec};
//! use flowgate::{store::MemoryStore, Quota};
//!
//! let rules = RuleSet::build(vec![DomainSpec::new("api", vec![
//!     RuleSpec::new("user").with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(2)))),
//! ])])?;
//! let store = MemoryStore::new();
//! let alice = [Entry::new("user", "alice")];
//! envoy::check(&rules, &store, "api", &[Descriptor::new(alice.to_vec())], 2).await;
//! let Lookup::Counters(counters) = envoy::inspect(&rules, &store, "api", &alice).await? else {
//!     panic!("user=alice is counted");
//! };
//! assert_eq!(counters[0].decision.remaining, 0);
//! envoy::reset(&rules, &store, "api", &alice).await?;
//! let Lookup::Counters(counters) = envoy::inspect(&rules, &store, "api", &alice).await? else {
//!     panic!("user=alice is counted");
//! };
//! assert_eq!(counters[0].decision.remaining, 2);
//! # Ok(()) }
//! ```
//!
//! [`check`]: super::check

use super::descriptor::Entry;
use super::key::write_rule_key;
use super::rules::{Rate, Rule};
use super::ruleset::RuleSet;
use crate::decision::Decision;
use crate::store::{Ask, Store, StoreError};

/// What a descriptor's counters are, as [`inspect`] and [`reset`] find them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<'r> {
    /// No rule of the domain matches the entries (or the domain is unknown).
    NoRule,
    /// The matching rule keeps no counter: it is `unlimited` or blocks everything.
    NotCounted(&'r Rule),
    /// The matching rule's counters for these entries: one per limit, in the rule's order
    /// (never empty).
    Counters(Vec<CounterState<'r>>),
}

/// One counter: its rule (limit), its key in the store and what a request costing nothing would be
/// told now (for [`reset`], the state after the reset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterState<'r> {
    /// The rule the entries match.
    pub rule: &'r Rule,
    /// The counter's key in the store (as [`counter_key`](super::counter_key) builds it).
    pub key: String,
    /// The counter's state: `remaining` of `burst`, `reset_after`.
    pub decision: Decision,
}

/// The counters `entries` of `domain` are counted in, peeked (nothing is taken).
pub async fn inspect<'r, S: Store + ?Sized>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    entries: &[Entry],
) -> Result<Lookup<'r>, StoreError> {
    let limits = rules.find_limits(domain, entries);
    let counted = counters(domain, entries, limits);
    if counted.is_empty() {
        return Ok(limits.first().map_or(Lookup::NoRule, Lookup::NotCounted));
    }
    let mut states = Vec::with_capacity(counted.len());
    for (rule, key, quota) in counted {
        let decision = store.peek(Ask::new(&key, &quota)).await?;
        states.push(CounterState {
            rule,
            key,
            decision,
        });
    }
    Ok(Lookup::Counters(states))
}

/// Forgets the counters `entries` of `domain` are counted in (every limit of their rule): the
/// next request sees the full quotas. Answers with the counters' state after the reset.
pub async fn reset<'r, S: Store + ?Sized>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    entries: &[Entry],
) -> Result<Lookup<'r>, StoreError> {
    for (_, key, quota) in counters(domain, entries, rules.find_limits(domain, entries)) {
        store.reset(Ask::new(&key, &quota)).await?;
    }
    inspect(rules, store, domain, entries).await
}

/// The counted limits among `limits` (of the rule `entries` match), with their counter keys
/// and quotas.
fn counters<'r>(
    domain: &str,
    entries: &[Entry],
    limits: &'r [Rule],
) -> Vec<(&'r Rule, String, crate::Quota)> {
    limits
        .iter()
        .filter_map(|rule| {
            let Rate::Limited(quota) = rule.rate else {
                return None;
            };
            let mut key = String::new();
            write_rule_key(&mut key, domain, entries, rule);
            Some((rule, key, quota))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::{Descriptor, DomainSpec, LimitSpec, RuleSpec, check};
    use crate::quota::Quota;
    use crate::store::MemoryStore;

    fn rules() -> RuleSet {
        RuleSet::build(vec![DomainSpec::new(
            "d",
            vec![
                RuleSpec::new("user")
                    .with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(3)))),
                RuleSpec::new("open").with_limit(LimitSpec::new(Rate::Unlimited)),
            ],
        )])
        .unwrap()
    }

    #[tokio::test]
    async fn inspect_sees_what_check_counted_and_reset_forgets_it() {
        let rules = rules();
        let store = MemoryStore::new();
        let bob = [Entry::new("user", "bob")];
        let request = [Descriptor::new(bob.to_vec())];
        check(&rules, &store, "d", &request, 2).await;
        let Lookup::Counters(before) = inspect(&rules, &store, "d", &bob).await.unwrap() else {
            panic!("counted");
        };
        let before = &before[0];
        assert_eq!((before.decision.remaining, before.decision.burst), (1, 3));
        assert_eq!(before.rule.path, "user");
        assert!(before.key.starts_with("d|user=bob#"), "{}", before.key);
        // Inspecting takes nothing.
        let Lookup::Counters(again) = inspect(&rules, &store, "d", &bob).await.unwrap() else {
            panic!("counted");
        };
        assert_eq!(again[0].decision.remaining, 1);
        let Lookup::Counters(after) = reset(&rules, &store, "d", &bob).await.unwrap() else {
            panic!("counted");
        };
        assert_eq!(after[0].decision.remaining, 3);
        assert!(check(&rules, &store, "d", &request, 3).await.allowed);
    }

    #[tokio::test]
    async fn unmatched_and_uncounted_entries_are_told_apart() {
        let rules = rules();
        let store = MemoryStore::new();
        let lookup = |entries: Vec<Entry>, domain: &'static str| {
            let (rules, store) = (&rules, &store);
            async move { inspect(rules, store, domain, &entries).await.unwrap() }
        };
        assert_eq!(
            lookup(vec![Entry::new("nope", "x")], "d").await,
            Lookup::NoRule
        );
        assert_eq!(
            lookup(vec![Entry::new("user", "x")], "other").await,
            Lookup::NoRule
        );
        assert!(matches!(
            lookup(vec![Entry::new("open", "x")], "d").await,
            Lookup::NotCounted(rule) if rule.path == "open"
        ));
    }
}
