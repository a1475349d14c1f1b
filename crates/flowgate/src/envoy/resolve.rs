//! Which limit applies to each descriptor of a request, before any store is asked.

use super::descriptor::{Descriptor, LimitOverride};
use super::rules::{Rate, Rule};
use super::ruleset::RuleSet;
use crate::decision::FailMode;
use crate::quota::{Algorithm, Quota, QuotaError};

/// The limit that was applied to a descriptor: a configured [`Rule`] or a request override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppliedLimit<'r> {
    /// A rule of the configuration.
    Rule(&'r Rule),
    /// The descriptor's own limit, with the quota built from it (`None`: 0 per unit, blocked).
    Override(LimitOverride, Option<Quota>),
}

impl AppliedLimit<'_> {
    /// What the applied limit does.
    pub fn rate(&self) -> Rate {
        match self {
            AppliedLimit::Rule(rule) => rule.rate,
            AppliedLimit::Override(_, Some(quota)) => Rate::Limited(*quota),
            AppliedLimit::Override(o, None) => Rate::Blocked {
                period: o.unit.duration(),
            },
        }
    }

    /// The rule's name, if it has one.
    pub fn name(&self) -> Option<&str> {
        match self {
            AppliedLimit::Rule(rule) => rule.name.as_deref(),
            AppliedLimit::Override(..) => None,
        }
    }

    /// Whether the limit counts without denying.
    pub fn shadow_mode(&self) -> bool {
        matches!(self, AppliedLimit::Rule(rule) if rule.shadow_mode)
    }

    /// The rule's failure mode (`fail`), if it sets one; overrides use the store's default.
    pub fn fail(&self) -> Option<FailMode> {
        match self {
            AppliedLimit::Rule(rule) => rule.fail,
            AppliedLimit::Override(..) => None,
        }
    }
}

/// Which limit applies to one descriptor, before any store is asked: one per descriptor, or
/// one per limit of a rule with several (consecutive, in the rule's order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved<'r> {
    /// The index of the request descriptor this limit applies to.
    pub descriptor: usize,
    /// The limit that matched (`None`: no rule matched, or the domain is unknown).
    pub applied: Option<AppliedLimit<'r>>,
    /// Whether another matched rule's `replaces` names this one: it is skipped.
    pub replaced: bool,
    /// The units the descriptor costs.
    pub hits: u64,
    /// Whether they are a charge: the descriptor says so, or its rule charges hits above 0.
    pub charge: bool,
}

/// Which limits apply to each descriptor, before asking any store: [`RuleSet::find_limits`],
/// limit overrides and `replaces` (a limit's name, replaced by any other limit matched). `hits_addend` is the request's cost (0 means 1); a descriptor's
/// own wins. An invalid override (a rate above one per nanosecond) is an error.
pub fn resolve<'r>(
    rules: &'r RuleSet,
    domain: &str,
    descriptors: &[Descriptor],
    hits_addend: u64,
) -> Result<Vec<Resolved<'r>>, QuotaError> {
    let request_hits = hits_addend.max(1);
    let domain_rules = rules.domain(domain);
    let mut resolved = Vec::with_capacity(descriptors.len());
    for (index, descriptor) in descriptors.iter().enumerate() {
        let hits = descriptor.hits_addend.unwrap_or(request_hits);
        let mut push = |applied: Option<AppliedLimit<'r>>| {
            let rule_charges = matches!(applied, Some(AppliedLimit::Rule(rule)) if rule.charge);
            resolved.push(Resolved {
                descriptor: index,
                applied,
                replaced: false,
                hits,
                charge: descriptor.charge || (rule_charges && hits > 0),
            });
        };
        match (domain_rules, descriptor.limit) {
            (None, _) => push(None),
            (Some(_), Some(over)) if over.requests_per_unit == 0 => {
                push(Some(AppliedLimit::Override(over, None)));
            }
            (Some(_), Some(over)) => {
                let quota = Quota::new(over.requests_per_unit, over.unit.duration())?
                    .with_algorithm(Algorithm::default())?;
                push(Some(AppliedLimit::Override(over, Some(quota))));
            }
            (Some(domain_rules), None) => match domain_rules.find_limits(&descriptor.entries) {
                [] => push(None),
                limits => limits
                    .iter()
                    .for_each(|rule| push(Some(AppliedLimit::Rule(rule)))),
            },
        }
    }
    // `replaces`: a named rule is skipped when any matched rule (even an unlimited one) names it.
    let replaced: Vec<&str> = resolved
        .iter()
        .filter_map(|r| match r.applied {
            Some(AppliedLimit::Rule(rule)) => Some(rule.replaces.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    if !replaced.is_empty() {
        for r in &mut resolved {
            if let Some(AppliedLimit::Rule(rule)) = r.applied
                && rule.name.as_deref().is_some_and(|n| replaced.contains(&n))
            {
                r.replaced = true;
            }
        }
    }
    Ok(resolved)
}
