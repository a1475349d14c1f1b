//! One counter of a rule set, looked at or forgotten by an operator: [`inspect`] and
//! [`reset`] find the rule a descriptor matches, build the counter key exactly as [`check`]
//! does, and [`peek`](Store::peek) or [`reset`](Store::reset) it in the store.
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
//! let Lookup::Counter(counter) = envoy::inspect(&rules, &store, "api", &alice).await? else {
//!     panic!("user=alice is counted");
//! };
//! assert_eq!(counter.decision.remaining, 0);
//! envoy::reset(&rules, &store, "api", &alice).await?;
//! let Lookup::Counter(counter) = envoy::inspect(&rules, &store, "api", &alice).await? else {
//!     panic!("user=alice is counted");
//! };
//! assert_eq!(counter.decision.remaining, 2);
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

/// What a descriptor's counter is, as [`inspect`] and [`reset`] find it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<'r> {
    /// No rule of the domain matches the entries (or the domain is unknown).
    NoRule,
    /// The matching rule keeps no counter: it is `unlimited` or blocks everything.
    NotCounted(&'r Rule),
    /// The matching rule's counter for these entries.
    Counter(CounterState<'r>),
}

/// One counter: its rule, its key in the store and what a request costing nothing would be
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

/// The counter `entries` of `domain` are counted in, peeked (nothing is taken).
pub async fn inspect<'r, S: Store + ?Sized>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    entries: &[Entry],
) -> Result<Lookup<'r>, StoreError> {
    let Some((rule, key, quota)) = counter(rules, domain, entries) else {
        return Ok(rules
            .find(domain, entries)
            .map_or(Lookup::NoRule, Lookup::NotCounted));
    };
    let decision = store.peek(Ask::new(&key, &quota)).await?;
    Ok(Lookup::Counter(CounterState {
        rule,
        key,
        decision,
    }))
}

/// Forgets the counter `entries` of `domain` are counted in: the next request sees the full
/// quota. Answers with the counter's state after the reset.
pub async fn reset<'r, S: Store + ?Sized>(
    rules: &'r RuleSet,
    store: &S,
    domain: &str,
    entries: &[Entry],
) -> Result<Lookup<'r>, StoreError> {
    let Some((_, key, quota)) = counter(rules, domain, entries) else {
        return inspect(rules, store, domain, entries).await;
    };
    store.reset(Ask::new(&key, &quota)).await?;
    inspect(rules, store, domain, entries).await
}

/// The counted rule `entries` match, their counter key and the rule's quota.
fn counter<'r>(
    rules: &'r RuleSet,
    domain: &str,
    entries: &[Entry],
) -> Option<(&'r Rule, String, crate::Quota)> {
    let rule = rules.find(domain, entries)?;
    let Rate::Limited(quota) = rule.rate else {
        return None;
    };
    let mut key = String::new();
    write_rule_key(&mut key, domain, entries, rule);
    Some((rule, key, quota))
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
        let Lookup::Counter(before) = inspect(&rules, &store, "d", &bob).await.unwrap() else {
            panic!("counted");
        };
        assert_eq!((before.decision.remaining, before.decision.burst), (1, 3));
        assert_eq!(before.rule.path, "user");
        assert!(before.key.starts_with("d|user=bob#"), "{}", before.key);
        // Inspecting takes nothing.
        let Lookup::Counter(again) = inspect(&rules, &store, "d", &bob).await.unwrap() else {
            panic!("counted");
        };
        assert_eq!(again.decision.remaining, 1);
        let Lookup::Counter(after) = reset(&rules, &store, "d", &bob).await.unwrap() else {
            panic!("counted");
        };
        assert_eq!(after.decision.remaining, 3);
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
