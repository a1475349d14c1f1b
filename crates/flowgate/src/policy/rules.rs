//! Rule trees in the envoyproxy/ratelimit model: domains of nested descriptor rules, each of
//! which may carry a limit.
//!
//! A request descriptor is a list of `(key, value)` entries, e.g.
//! `[("remote_address", "10.0.0.1"), ("path", "/login")]`. A [`RuleSet`] walks it level by
//! level through its rule tree and answers with at most one [`Rule`]:
//!
//! * At each level, a rule with the entry's key **and** value wins over a rule whose value is a
//!   prefix pattern (`value: "/api/*"`; the longest matching prefix wins), which wins over a rule
//!   with the key only (no `value`: it matches every value and keeps one counter per value).
//! * A rule applies only at the depth of the request's descriptor: the limit of the rule reached
//!   by the **last** entry is returned; a limit on an intermediate rule does not apply to a longer
//!   descriptor, and a descriptor longer than the rule tree matches nothing.
//!
//! The tree is built from plain [`DomainSpec`]/[`RuleSpec`] values (the service parses them from
//! YAML) and validated: empty keys, duplicate rules, duplicate domains and self-replacing limits
//! are errors that point at the offending rule by index path.
//!
//! ```
//! use flowgate::policy::rules::{DomainSpec, LimitSpec, Rate, RuleSet, RuleSpec, Unit};
//! use flowgate::policy::descriptor::Entry;
//! use flowgate::Quota;
//!
//! let per_ip = RuleSpec::new("remote_address")
//!     .with_limit(LimitSpec::new(Rate::Limited(Quota::new(100, Unit::Minute.duration())?)));
//! let rules = RuleSet::build(vec![DomainSpec::new("edge", vec![per_ip])])?;
//! let rule = rules.find("edge", &[Entry::new("remote_address", "10.0.0.1")]).unwrap();
//! assert_eq!(rule.path, "remote_address");
//! assert!(rules.find("edge", &[Entry::new("path", "/")]).is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::fmt::Write as _;
use std::str::FromStr;
use std::time::Duration;

use crate::decision::FailMode;
use crate::quota::Quota;

use super::descriptor::Entry;

/// The time units of envoyproxy/ratelimit's `unit` field (and of the RLS protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as envoyproxy/ratelimit counts a month.
    Month,
    /// 365 days, as envoyproxy/ratelimit counts a year.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length in seconds.
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit's length.
    pub const fn duration(self) -> Duration {
        Duration::from_secs(self.seconds())
    }

    /// The unit's name as written in configuration files: `"second"`, `"minute"`, …
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit exactly `period` long, if there is one.
    pub fn from_period(period: Duration) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.duration() == period)
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A unit name that is not one of second, minute, hour, day, week, month, year.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown unit `{0}`; expected one of second, minute, hour, day, week, month, year")]
pub struct UnknownUnit(pub String);

impl FromStr for Unit {
    type Err = UnknownUnit;

    /// Parses a unit name, ignoring ASCII case (`SECOND` and `second` are both accepted, as
    /// envoyproxy/ratelimit does).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownUnit(s.to_owned()))
    }
}

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
}

impl LimitSpec {
    /// A limit with no name, no `replaces` and the store's default failure mode.
    pub fn new(rate: Rate) -> Self {
        LimitSpec {
            rate,
            name: None,
            replaces: Vec::new(),
            fail: None,
        }
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

/// A rule that carries a limit, as built into a [`RuleSet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Position in [`RuleSet::rules`]: a small, dense id for per-rule metrics.
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
    /// Report metrics per descriptor value.
    pub detailed_metric: bool,
    /// The end of this rule's counter keys (its quota), built once; see
    /// [`counter_key`](super::descriptor::counter_key).
    counter_suffix: String,
}

/// The end of a counter key: the quota's algorithm, limit, period and burst, so a counter is
/// only ever used with one quota.
pub(crate) fn quota_suffix(quota: &Quota) -> String {
    let mut suffix = String::with_capacity(40);
    // Writing to a String cannot fail.
    let _ = write!(
        suffix,
        "#{}:{}:{}:{}",
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

/// Where a [`RuleError`] is: the domain's index in the list given to [`RuleSet::build`], then
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

/// Hash maps of the rule tree: foldhash, fast on short strings (matching is on the hot path;
/// keys come from configuration, so flooding is not a concern).
type Map<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// The rules for the next entry of a descriptor, by key.
#[derive(Debug, Default)]
struct Level {
    /// Rules by entry key.
    keys: Map<KeyRules>,
}

/// Every rule at one level for one key.
#[derive(Debug, Default)]
struct KeyRules {
    /// Rules with an exact value.
    exact: Map<Node>,
    /// Rules whose value ends in `*`, by prefix, longest prefix first.
    prefixes: Vec<(String, Node)>,
    /// The rule without a value.
    any: Option<Node>,
}

/// A rule in the tree.
#[derive(Debug, Default)]
struct Node {
    /// Index of the rule's limit in [`RuleSet::rules`], if it has one.
    rule: Option<usize>,
    /// Rules for the next entry.
    children: Level,
}

impl Level {
    fn lookup(&self, entry: &Entry) -> Option<&Node> {
        let rules = self.keys.get(entry.key.as_str())?;
        rules
            .exact
            .get(entry.value.as_str())
            .or_else(|| {
                rules
                    .prefixes
                    .iter()
                    .find(|(prefix, _)| entry.value.starts_with(prefix.as_str()))
                    .map(|(_, node)| node)
            })
            .or(rules.any.as_ref())
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Every domain's rule tree, ready for matching. Immutable: build a new one to change rules.
#[derive(Debug, Default)]
pub struct RuleSet {
    /// The tree of each domain.
    domains: Map<Level>,
    /// Every rule that has a limit, in definition order.
    rules: Vec<Rule>,
}

impl RuleSet {
    /// Builds and validates the rule trees of `domains`.
    pub fn build(domains: Vec<DomainSpec>) -> Result<RuleSet, RuleError> {
        let mut set = RuleSet::default();
        for (index, spec) in domains.into_iter().enumerate() {
            let at = |kind| RuleError {
                path: RulePath {
                    domain: index,
                    rules: Vec::new(),
                },
                kind,
            };
            if spec.domain.is_empty() {
                return Err(at(RuleErrorKind::EmptyDomain));
            }
            if set.domains.contains_key(&spec.domain) {
                return Err(at(RuleErrorKind::DuplicateDomain(spec.domain)));
            }
            let mut root = Level::default();
            let mut path = RulePath {
                domain: index,
                rules: Vec::new(),
            };
            set.load_level(&spec.domain, "", &mut root, spec.descriptors, &mut path)?;
            set.domains.insert(spec.domain, root);
        }
        Ok(set)
    }

    fn load_level(
        &mut self,
        domain: &str,
        parent: &str,
        level: &mut Level,
        specs: Vec<RuleSpec>,
        path: &mut RulePath,
    ) -> Result<(), RuleError> {
        for (index, spec) in specs.into_iter().enumerate() {
            path.rules.push(index);
            let fail = |kind| RuleError {
                path: path.clone(),
                kind,
            };
            if spec.key.is_empty() {
                return Err(fail(RuleErrorKind::EmptyKey));
            }
            let segment = match &spec.value {
                Some(value) => format!("{}_{}", spec.key, value),
                None => spec.key.clone(),
            };
            let rule_path = if parent.is_empty() {
                segment
            } else {
                format!("{parent}.{segment}")
            };
            let key_rules = level.keys.entry(spec.key.clone()).or_default();
            let duplicate = match &spec.value {
                None => key_rules.any.is_some(),
                Some(value) => match value.strip_suffix('*') {
                    Some(prefix) => key_rules.prefixes.iter().any(|(p, _)| p == prefix),
                    None => key_rules.exact.contains_key(value),
                },
            };
            if duplicate {
                return Err(fail(RuleErrorKind::DuplicateRule {
                    key: spec.key,
                    value: spec.value,
                }));
            }
            let mut node = Node::default();
            if let Some(limit) = spec.limit {
                if limit.replaces.iter().any(String::is_empty) {
                    return Err(fail(RuleErrorKind::EmptyReplaces));
                }
                if let Some(name) = &limit.name
                    && limit.replaces.contains(name)
                {
                    return Err(fail(RuleErrorKind::ReplacesItself(name.clone())));
                }
                node.rule = Some(self.rules.len());
                let counter_suffix = match limit.rate {
                    Rate::Limited(quota) => quota_suffix(&quota),
                    _ => String::new(),
                };
                self.rules.push(Rule {
                    counter_suffix,
                    id: self.rules.len(),
                    domain: domain.to_owned(),
                    path: rule_path.clone(),
                    rate: limit.rate,
                    name: limit.name,
                    replaces: limit.replaces,
                    fail: limit.fail,
                    shadow_mode: spec.shadow_mode,
                    detailed_metric: spec.detailed_metric,
                });
            }
            self.load_level(
                domain,
                &rule_path,
                &mut node.children,
                spec.descriptors,
                path,
            )?;
            // Re-borrow: loading children needed `self` mutably.
            let key_rules = level.keys.entry(spec.key).or_default();
            match spec.value {
                None => key_rules.any = Some(node),
                Some(value) => match value.strip_suffix('*') {
                    Some(prefix) => {
                        key_rules.prefixes.push((prefix.to_owned(), node));
                        key_rules
                            .prefixes
                            .sort_by_key(|p| std::cmp::Reverse(p.0.len()));
                    }
                    None => {
                        key_rules.exact.insert(value, node);
                    }
                },
            }
            path.rules.pop();
        }
        Ok(())
    }

    /// The rule whose limit applies to a request descriptor in `domain`, following
    /// envoyproxy/ratelimit's matching (see the [module docs](self)). `None` when the domain is
    /// unknown or no rule with a limit matches at the descriptor's depth.
    pub fn find(&self, domain: &str, entries: &[Entry]) -> Option<&Rule> {
        self.domain(domain)?.find(entries)
    }

    /// The rules of `domain`, for several lookups in one domain.
    pub fn domain(&self, domain: &str) -> Option<DomainRules<'_>> {
        self.domains
            .get(domain)
            .map(|root| DomainRules { set: self, root })
    }

    /// Whether `domain` has rules (even an empty list of them).
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The names of every domain.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Every rule that carries a limit, in definition order; `rules()[r.id] == r`.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }
}

/// The rules of one domain of a [`RuleSet`] ([`RuleSet::domain`]).
#[derive(Debug, Clone, Copy)]
pub struct DomainRules<'a> {
    /// The whole set, which owns the rules.
    set: &'a RuleSet,
    /// The domain's top level.
    root: &'a Level,
}

impl<'a> DomainRules<'a> {
    /// [`RuleSet::find`] within this domain.
    pub fn find(&self, entries: &[Entry]) -> Option<&'a Rule> {
        let mut level = self.root;
        let last = entries.len().checked_sub(1)?;
        for (depth, entry) in entries.iter().enumerate() {
            let node = level.lookup(entry)?;
            if depth == last {
                return node.rule.map(|i| &self.set.rules[i]);
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(n: u64) -> LimitSpec {
        LimitSpec::new(Rate::Limited(Quota::per_minute(n).unwrap()))
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
        pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
    }

    fn path_of(set: &RuleSet, domain: &str, pairs: &[(&str, &str)]) -> Option<String> {
        set.find(domain, &entries(pairs)).map(|r| r.path.clone())
    }

    fn sample() -> RuleSet {
        RuleSet::build(vec![DomainSpec::new(
            "d",
            vec![
                RuleSpec::new("key").with_limit(limited(1)),
                RuleSpec::new("key")
                    .with_value("special")
                    .with_limit(limited(2)),
                RuleSpec::new("path")
                    .with_value("/api/*")
                    .with_limit(limited(3)),
                RuleSpec::new("path")
                    .with_value("/api/v2/*")
                    .with_limit(limited(4)),
                RuleSpec::new("client")
                    .with_limit(limited(5))
                    .with_children(vec![RuleSpec::new("route").with_limit(limited(6))]),
                RuleSpec::new("outer").with_children(vec![
                    RuleSpec::new("inner")
                        .with_value("x")
                        .with_limit(limited(7)),
                ]),
            ],
        )])
        .unwrap()
    }

    #[test]
    fn key_and_value_beats_prefix_beats_key_only() {
        let set = sample();
        assert_eq!(
            path_of(&set, "d", &[("key", "special")]).unwrap(),
            "key_special"
        );
        assert_eq!(path_of(&set, "d", &[("key", "other")]).unwrap(), "key");
        assert_eq!(
            path_of(&set, "d", &[("path", "/api/x")]).unwrap(),
            "path_/api/*"
        );
        assert_eq!(
            path_of(&set, "d", &[("path", "/api/v2/y")]).unwrap(),
            "path_/api/v2/*"
        );
        assert_eq!(path_of(&set, "d", &[("path", "/web")]), None);
    }

    #[test]
    fn a_limit_applies_only_at_the_depth_of_the_descriptor() {
        let set = sample();
        assert_eq!(path_of(&set, "d", &[("client", "a")]).unwrap(), "client");
        assert_eq!(
            path_of(&set, "d", &[("client", "a"), ("route", "r")]).unwrap(),
            "client.route"
        );
        // Longer than the tree, or an intermediate rule without a limit: nothing.
        assert_eq!(
            path_of(&set, "d", &[("client", "a"), ("route", "r"), ("x", "y")]),
            None
        );
        assert_eq!(path_of(&set, "d", &[("key", "a"), ("route", "r")]), None);
        assert_eq!(path_of(&set, "d", &[("outer", "o")]), None);
        assert_eq!(
            path_of(&set, "d", &[("outer", "o"), ("inner", "x")]).unwrap(),
            "outer.inner_x"
        );
        assert_eq!(path_of(&set, "d", &[("outer", "o"), ("inner", "y")]), None);
        assert_eq!(path_of(&set, "d", &[]), None);
        assert_eq!(path_of(&set, "other", &[("key", "a")]), None);
    }

    #[test]
    fn invalid_rules_are_rejected_with_their_path() {
        let dup = RuleSet::build(vec![DomainSpec::new(
            "d",
            vec![RuleSpec::new("a").with_children(vec![
                RuleSpec::new("b").with_value("1"),
                RuleSpec::new("b").with_value("1"),
            ])],
        )])
        .unwrap_err();
        assert_eq!(dup.path.rules, vec![0, 1]);
        assert!(matches!(dup.kind, RuleErrorKind::DuplicateRule { .. }));
        let empty = RuleSet::build(vec![
            DomainSpec::new("d", vec![]),
            DomainSpec::new("e", vec![RuleSpec::new("")]),
        ])
        .unwrap_err();
        assert_eq!(
            (empty.path.domain, empty.kind),
            (1, RuleErrorKind::EmptyKey)
        );
        let twice = RuleSet::build(vec![
            DomainSpec::new("d", vec![]),
            DomainSpec::new("d", vec![]),
        ])
        .unwrap_err();
        assert_eq!(twice.kind, RuleErrorKind::DuplicateDomain("d".into()));
        let own = RuleSet::build(vec![DomainSpec::new(
            "d",
            vec![RuleSpec::new("a").with_limit(limited(1).named("n").replacing(["n"]))],
        )])
        .unwrap_err();
        assert_eq!(own.kind, RuleErrorKind::ReplacesItself("n".into()));
    }

    #[test]
    fn units_parse_in_any_case() {
        assert_eq!("MINUTE".parse::<Unit>(), Ok(Unit::Minute));
        assert_eq!(
            Unit::from_period(Duration::from_secs(86_400)),
            Some(Unit::Day)
        );
        assert!("fortnight".parse::<Unit>().is_err());
    }
}
