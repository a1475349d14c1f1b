//! Which limit applies to each descriptor of a request, before any store is asked.

use std::time::Duration;

use super::check::{DescriptorVerdict, Status};
use super::descriptor::{Descriptor, LimitOverride};
use super::rules::{Rate, Rule};
use super::ruleset::RuleSet;
use crate::decision::{Decision, FailMode};
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

/// Which limit applies to each descriptor, before asking any store: [`RuleSet::find`], limit
/// overrides, `unlimited` and `replaces`. `applied` is `None` when no limit applies.
///
/// Each entry's `status` is `Unmatched`, `Replaced` or `Unlimited`, or a placeholder
/// `Checked` for the limits [`check`](super::check) then asks the store about; `hits` is the
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
            Some(over) if over.requests_per_unit == 0 => Some(AppliedLimit::Override(over, None)),
            Some(over) => {
                let quota = Quota::new(over.requests_per_unit, over.unit.duration())?
                    .with_algorithm(Algorithm::default())?;
                Some(AppliedLimit::Override(over, Some(quota)))
            }
            None => domain_rules
                .find(&descriptor.entries)
                .map(AppliedLimit::Rule),
        };
        let status = match applied {
            None => Status::Unmatched,
            Some(AppliedLimit::Rule(rule)) if rule.rate == Rate::Unlimited => Status::Unlimited,
            Some(_) => Status::Checked(Decision {
                allowed: true,
                limit: 0,
                burst: 0,
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
            Some(AppliedLimit::Rule(rule)) => Some(rule.replaces.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    if !replaced.is_empty() {
        for v in &mut resolved {
            if let Some(AppliedLimit::Rule(rule)) = v.applied
                && rule.name.as_deref().is_some_and(|n| replaced.contains(&n))
            {
                v.status = Status::Replaced;
            }
        }
    }
    Ok(resolved)
}
