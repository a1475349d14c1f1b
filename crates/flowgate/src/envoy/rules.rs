//! The rule model: what a configuration says ([`DomainSpec`], [`RuleSpec`], [`LimitSpec`],
//! [`Rate`]), the validated [`Rule`]s a [`RuleSet`](super::RuleSet) holds, and why a rule set
//! can be refused ([`RuleError`]).

use std::fmt::Write as _;
use std::time::Duration;

use crate::decision::FailMode;
use crate::quota::Quota;

/// What a rule's limit does with matching requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// Counted against a quota.
    Limited(Quota),
    /// Always denied (`requests_per_unit: 0`, a blocklist). `period` is what denied requests
    /// are told to wait.
    Blocked {
        /// The rule's period, reported as the time to wait.
        period: Duration,
    },
    /// Always allowed, never counted (`unlimited: true`).
    Unlimited,
}

impl Rate {
    /// Units per period: the quota's limit, 0 when blocked, `None` when unlimited.
    pub fn limit(&self) -> Option<u64> {
        match self {
            Rate::Limited(quota) => Some(quota.limit()),
            Rate::Blocked { .. } => Some(0),
            Rate::Unlimited => None,
        }
    }

    /// The period the limit applies to; `None` when unlimited.
    pub fn period(&self) -> Option<Duration> {
        match self {
            Rate::Limited(quota) => Some(quota.period()),
            Rate::Blocked { period } => Some(*period),
            Rate::Unlimited => None,
        }
    }
}

/// The limit attached to a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitSpec {
    /// What the limit does.
    pub rate: Rate,
    /// An optional name, reported to clients and referred to by other rules' `replaces`.
    pub name: Option<String>,
    /// Names of limits this one replaces: when both match one request, those are skipped.
    pub replaces: Vec<String>,
    /// What to decide when the store cannot be reached; `None` leaves it to the store's default.
    pub fail: Option<FailMode>,
    /// Hits above zero are charges: usage that already happened, always taken, into debt past
    /// the limit if need be ([`Ask::charge`](crate::store::Ask::charge)); a hit of 0 checks
    /// (refused while in debt). For Envoy's `apply_on_stream_done` (Envoy Gateway's
    /// `cost.response`), whose call repeats the request's descriptors: docs/envoy.md.
    pub charge: bool,
}

impl LimitSpec {
    /// A limit with no name, no `replaces` and the store's default failure mode.
    pub fn new(rate: Rate) -> Self {
        LimitSpec {
            rate,
            name: None,
            replaces: Vec::new(),
            fail: None,
            charge: false,
        }
    }

    /// The same limit, charging its hits above zero (see [`charge`](Self::charge)).
    pub fn charged(mut self) -> Self {
        self.charge = true;
        self
    }

    /// The same limit with a name.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The same limit, replacing the limits with these names.
    pub fn replacing<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.replaces = names.into_iter().map(Into::into).collect();
        self
    }
}

/// One descriptor rule: a key, an optional value, an optional limit and nested rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// The descriptor entry's key.
    pub key: String,
    /// The entry's value: `None` matches every value (one counter per distinct value); a value
    /// ending in `*` matches every value starting with what precedes the `*`.
    pub value: Option<String>,
    /// The limit applied when a request's descriptor ends at this rule.
    pub limit: Option<LimitSpec>,
    /// Count but never deny.
    pub shadow_mode: bool,
    /// Report metrics per descriptor value instead of per rule.
    pub detailed_metric: bool,
    /// Rules for the next entry of the descriptor.
    pub descriptors: Vec<RuleSpec>,
}

impl RuleSpec {
    /// A rule for `key` with any value, no limit and no children.
    pub fn new(key: impl Into<String>) -> Self {
        RuleSpec {
            key: key.into(),
            value: None,
            limit: None,
            shadow_mode: false,
            detailed_metric: false,
            descriptors: Vec::new(),
        }
    }

    /// The same rule, matching only `value` (or a prefix pattern ending in `*`).
    pub fn with_value(mut self, value: impl Into<String>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// The same rule with a limit.
    pub fn with_limit(mut self, limit: LimitSpec) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The same rule with nested rules.
    pub fn with_children(mut self, descriptors: Vec<RuleSpec>) -> Self {
        self.descriptors = descriptors;
        self
    }

    /// The same rule in shadow mode.
    pub fn shadow(mut self) -> Self {
        self.shadow_mode = true;
        self
    }
}

/// The rules of one domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainSpec {
    /// The domain's name, as sent in each request.
    pub domain: String,
    /// Its top-level rules.
    pub descriptors: Vec<RuleSpec>,
}

impl DomainSpec {
    /// A domain with these top-level rules.
    pub fn new(domain: impl Into<String>, descriptors: Vec<RuleSpec>) -> Self {
        DomainSpec {
            domain: domain.into(),
            descriptors,
        }
    }
}

/// A rule that carries a limit, as built into a [`RuleSet`](super::RuleSet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Position in [`RuleSet::rules`](super::RuleSet::rules): a small, dense id for per-rule metrics.
    pub id: usize,
    /// The domain the rule belongs to.
    pub domain: String,
    /// The rule's place in its domain's tree, as envoyproxy/ratelimit names it in its stats:
    /// `key` or `key_value` per level, joined by `.` (e.g. `remote_address.path_/login`).
    pub path: String,
    /// What the limit does.
    pub rate: Rate,
    /// The limit's name, if given.
    pub name: Option<String>,
    /// Names of the limits this one replaces.
    pub replaces: Vec<String>,
    /// What to decide when the store cannot be reached.
    pub fail: Option<FailMode>,
    /// Count but never deny.
    pub shadow_mode: bool,
    /// Hits above zero are charges ([`LimitSpec::charge`]).
    pub charge: bool,
    /// Report metrics per descriptor value.
    pub detailed_metric: bool,
    /// The end of this rule's counter keys (its quota), built once; see
    /// [`counter_key`](super::counter_key).
    pub(super) counter_suffix: String,
}

/// The end of a counter key (after its `#`): the quota's algorithm, limit, period and burst,
/// so a counter is only ever used with one quota.
pub(crate) fn quota_suffix(quota: &Quota) -> String {
    let mut suffix = String::with_capacity(40);
    // Writing to a String cannot fail.
    let _ = write!(
        suffix,
        "{}:{}:{}:{}",
        quota.algorithm().name(),
        quota.limit(),
        quota.period_nanos(),
        quota.burst()
    );
    suffix
}

impl Rule {
    /// The quota part of this rule's counter keys.
    pub(crate) fn counter_suffix(&self) -> &str {
        &self.counter_suffix
    }

    /// The name to show clients: the limit's `name`, else its path.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.path)
    }
}

/// Where a [`RuleError`] is: the domain's index in the list given to [`RuleSet::build`](super::RuleSet::build), then
/// the index of the rule at each level (`[1, 0, 2]`: domain 1, its first rule, that rule's
/// third child). An empty `rules` path points at the domain itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RulePath {
    /// Index of the domain.
    pub domain: usize,
    /// Index of the rule at each level.
    pub rules: Vec<usize>,
}

/// Why a rule set could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}")]
pub struct RuleError {
    /// Which domain or rule is at fault.
    pub path: RulePath,
    /// What is wrong with it.
    pub kind: RuleErrorKind,
}

/// What is wrong in a [`RuleError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleErrorKind {
    /// A domain with an empty name.
    #[error("the domain must not be empty")]
    EmptyDomain,
    /// Two domains with the same name.
    #[error("domain `{0}` is defined twice")]
    DuplicateDomain(String),
    /// A rule with an empty key.
    #[error("the descriptor key must not be empty")]
    EmptyKey,
    /// Two sibling rules with the same key and value.
    #[error("duplicate rule: another rule at this level has key `{key}`{}", value.as_ref().map(|v| format!(" and value `{v}`")).unwrap_or_else(|| " and no value".to_owned()))]
    DuplicateRule {
        /// The repeated key.
        key: String,
        /// The repeated value.
        value: Option<String>,
    },
    /// An empty name in `replaces`.
    #[error("`replaces` must not contain an empty name")]
    EmptyReplaces,
    /// A limit that replaces itself.
    #[error("limit `{0}` must not replace itself")]
    ReplacesItself(String),
}
