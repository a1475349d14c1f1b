//! [`RuleSet`]: every domain's rule tree, built from specs and validated, and the matching of
//! request descriptors against it (see the [module docs](super) for the rules).

use std::collections::HashMap;
use std::ops::Range;

use super::descriptor::Entry;
use super::rules::{
    DomainSpec, Level as RuleLevel, LevelValue, LimitSpec, Rate, Rule, RuleError, RuleErrorKind,
    RulePath, RuleSpec, quota_suffix,
};
use super::wildcard::Wildcard;

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
    /// Rules whose value holds a `*`, most literal characters first (for trailing `*`: the
    /// longest prefix), then in definition order.
    wildcards: Vec<(Wildcard, Node)>,
    /// The rule without a value.
    any: Option<Node>,
}

/// A rule in the tree.
#[derive(Debug, Default)]
struct Node {
    /// Indices of the rule's limits in [`RuleSet::rules`] (empty: no limit).
    limits: Range<usize>,
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
                    .wildcards
                    .iter()
                    .find(|(wildcard, _)| wildcard.matches(&entry.value))
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
            set.load_level(
                &spec.domain,
                "",
                &mut root,
                spec.descriptors,
                &mut path,
                &mut Vec::new(),
            )?;
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
        levels: &mut Vec<RuleLevel>,
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
            let wildcard = spec.value.as_deref().and_then(Wildcard::new);
            if spec.share_threshold && wildcard.is_none() {
                return Err(fail(RuleErrorKind::ShareWithoutWildcard));
            }
            let key_rules = level.keys.entry(spec.key.clone()).or_default();
            let duplicate = match (&spec.value, &wildcard) {
                (None, _) => key_rules.any.is_some(),
                (Some(_), Some(w)) => key_rules.wildcards.iter().any(|(p, _)| p == w),
                (Some(value), None) => key_rules.exact.contains_key(value),
            };
            if duplicate {
                return Err(fail(RuleErrorKind::DuplicateRule {
                    key: spec.key,
                    value: spec.value,
                }));
            }
            levels.push(RuleLevel {
                key: spec.key.clone(),
                value: match (&spec.value, &wildcard) {
                    (None, _) => LevelValue::Any,
                    (Some(_), Some(w)) => LevelValue::Wildcard {
                        pattern: w.pattern().to_owned(),
                        shared: spec.share_threshold,
                    },
                    (Some(value), None) => LevelValue::Exact(value.clone()),
                },
                value_to_metric: spec.value_to_metric,
            });
            let mut node = Node::default();
            validate_limits(&spec.limits).map_err(fail)?;
            let (first, count) = (self.rules.len(), spec.limits.len());
            node.limits = first..first + count;
            for (limit_index, limit) in spec.limits.into_iter().enumerate() {
                let counter_suffix = match limit.rate {
                    Rate::Limited(quota) => quota_suffix(&quota),
                    _ => String::new(),
                };
                let unnamed = if count > 1 {
                    format!("{rule_path}#{limit_index}")
                } else {
                    rule_path.clone()
                };
                self.rules.push(Rule {
                    counter_suffix,
                    id: self.rules.len(),
                    limit_index,
                    limit_count: count,
                    domain: domain.to_owned(),
                    path: rule_path.clone(),
                    rate: limit.rate,
                    name: limit.name,
                    replaces: limit.replaces,
                    fail: limit.fail,
                    shadow_mode: spec.shadow_mode,
                    charge: limit.charge,
                    quota_mode: spec.quota_mode,
                    detailed_metric: spec.detailed_metric,
                    metadata: spec.metadata.clone(),
                    shares: levels.iter().any(|l| l.shared_pattern().is_some()),
                    levels: levels.clone(),
                    unnamed,
                });
            }
            self.load_level(
                domain,
                &rule_path,
                &mut node.children,
                spec.descriptors,
                path,
                levels,
            )?;
            levels.pop();
            // Re-borrow: loading children needed `self` mutably.
            let key_rules = level.keys.entry(spec.key).or_default();
            match (spec.value, wildcard) {
                (None, _) => key_rules.any = Some(node),
                (Some(_), Some(wildcard)) => {
                    key_rules.wildcards.push((wildcard, node));
                    // Stable: equally specific patterns keep their definition order.
                    key_rules
                        .wildcards
                        .sort_by_key(|(w, _)| std::cmp::Reverse(w.literal_len()));
                }
                (Some(value), None) => {
                    key_rules.exact.insert(value, node);
                }
            }
            path.rules.pop();
        }
        Ok(())
    }

    /// The rule whose limit applies to a request descriptor in `domain`, following
    /// envoyproxy/ratelimit's matching (see the [module docs](super)). `None` when the domain is
    /// unknown or no rule with a limit matches at the descriptor's depth. For a rule with
    /// several limits, its first; [`find_limits`](Self::find_limits) gives them all.
    pub fn find(&self, domain: &str, entries: &[Entry]) -> Option<&Rule> {
        self.find_limits(domain, entries).first()
    }

    /// Every limit of the rule a request descriptor in `domain` matches, in definition order:
    /// empty when [`find`](Self::find) finds nothing, one for most rules, several for a rule
    /// whose limits must all allow.
    pub fn find_limits(&self, domain: &str, entries: &[Entry]) -> &[Rule] {
        self.domain(domain)
            .map_or(&[][..], |rules| rules.find_limits(entries))
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
        self.find_limits(entries).first()
    }

    /// [`RuleSet::find_limits`] within this domain.
    pub fn find_limits(&self, entries: &[Entry]) -> &'a [Rule] {
        let mut level = self.root;
        let Some(last) = entries.len().checked_sub(1) else {
            return &[];
        };
        for (depth, entry) in entries.iter().enumerate() {
            let Some(node) = level.lookup(entry) else {
                return &[];
            };
            if depth == last {
                return &self.set.rules[node.limits.clone()];
            }
            if node.children.is_empty() {
                return &[];
            }
            level = &node.children;
        }
        &[]
    }

    /// The limits of the rule for an **unordered** set of entries — an RLQS `BucketId`, a map —
    /// (never empty; one for most rules, as [`find_limits`](Self::find_limits)) and the entries
    /// in the order the rule tree takes them (the descriptor they amount to).
    ///
    /// The tree is walked as [`find`](Self::find) walks a descriptor, except that the next
    /// entry is chosen among those not yet used: at each level, the first entry (in key
    /// order) whose key the level has a rule for and from which the rest can be matched.
    /// Every entry must be used, and the rule reached by the last must carry a limit. The
    /// search gives up (`None`) after [`MAX_BUCKET_STEPS`] rules tried.
    ///
    /// ```
    /// use flowgate::envoy::{DomainSpec, Entry, LimitSpec, Rate, RuleSet, RuleSpec};
    /// use flowgate::Quota;
    /// let limit = LimitSpec::new(Rate::Limited(Quota::per_second(10)));
    /// let rules = RuleSet::build(vec![DomainSpec::new("d", vec![
    ///     RuleSpec::new("tenant").with_children(vec![RuleSpec::new("path").with_limit(limit)]),
    /// ])]).unwrap();
    /// let bucket = [Entry::new("path", "/x"), Entry::new("tenant", "t1")];
    /// let (limits, ordered) = rules.domain("d").unwrap().find_unordered(&bucket).unwrap();
    /// assert_eq!(limits[0].path, "tenant.path");
    /// assert_eq!(ordered[0], Entry::new("tenant", "t1"));
    /// ```
    pub fn find_unordered(&self, entries: &[Entry]) -> Option<(&'a [Rule], Vec<Entry>)> {
        if entries.is_empty() {
            return None;
        }
        let mut sorted: Vec<&Entry> = entries.iter().collect();
        sorted.sort_by(|a, b| a.key.cmp(&b.key).then(a.value.cmp(&b.value)));
        let mut used = vec![false; sorted.len()];
        let mut path = Vec::with_capacity(sorted.len());
        let mut steps = MAX_BUCKET_STEPS;
        let limits = self.walk(self.root, &sorted, &mut used, &mut path, &mut steps)?;
        Some((&self.set.rules[limits], path.into_iter().cloned().collect()))
    }

    fn walk<'e>(
        &self,
        level: &'a Level,
        entries: &[&'e Entry],
        used: &mut [bool],
        path: &mut Vec<&'e Entry>,
        steps: &mut u32,
    ) -> Option<Range<usize>> {
        for i in 0..entries.len() {
            if used[i] {
                continue;
            }
            let Some(node) = level.lookup(entries[i]) else {
                continue;
            };
            *steps = steps.checked_sub(1)?;
            used[i] = true;
            path.push(entries[i]);
            let found = if path.len() == entries.len() {
                Some(node.limits.clone()).filter(|limits| !limits.is_empty())
            } else if node.children.is_empty() {
                None
            } else {
                self.walk(&node.children, entries, used, path, steps)
            };
            if found.is_some() {
                return found;
            }
            used[i] = false;
            path.pop();
        }
        None
    }
}

/// Checks the limits of one rule: no empty or self-referring `replaces`; and when there are
/// several, none `unlimited`, no two with the same quota or name, none replacing another.
fn validate_limits(limits: &[LimitSpec]) -> Result<(), RuleErrorKind> {
    for (index, limit) in limits.iter().enumerate() {
        if limit.replaces.iter().any(String::is_empty) {
            return Err(RuleErrorKind::EmptyReplaces);
        }
        let siblings = || limits.iter().filter_map(|l| l.name.as_deref());
        if let Some(name) = limit.replaces.iter().find(|r| siblings().any(|n| n == *r)) {
            return Err(RuleErrorKind::ReplacesItself(name.clone()));
        }
        if limits.len() > 1 && !matches!(limit.rate, Rate::Limited(_)) {
            return Err(RuleErrorKind::UncountedAmongLimits);
        }
        let earlier = &limits[..index];
        if earlier.iter().any(|l| l.rate == limit.rate) {
            return Err(RuleErrorKind::DuplicateLimit {
                index,
                what: "quota",
            });
        }
        if limit.name.is_some() && earlier.iter().any(|l| l.name == limit.name) {
            return Err(RuleErrorKind::DuplicateLimit {
                index,
                what: "name",
            });
        }
    }
    Ok(())
}

/// The most rules [`DomainRules::find_unordered`] tries for one set of entries.
pub const MAX_BUCKET_STEPS: u32 = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;

    fn limited(n: u64) -> LimitSpec {
        LimitSpec::new(Rate::Limited(Quota::per_minute(n)))
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
    fn unordered_entries_find_the_rule_whose_path_uses_them_all() {
        let set = sample();
        let d = set.domain("d").unwrap();
        let find = |pairs: &[(&str, &str)]| {
            d.find_unordered(&entries(pairs))
                .map(|(r, order)| (r[0].path.clone(), order))
        };
        let (path, order) = find(&[("route", "r"), ("client", "a")]).unwrap();
        assert_eq!(path, "client.route");
        assert_eq!(order, entries(&[("client", "a"), ("route", "r")]));
        assert_eq!(
            find(&[("inner", "x"), ("outer", "o")]).unwrap().0,
            "outer.inner_x"
        );
        assert_eq!(find(&[("key", "special")]).unwrap().0, "key_special");
        // Every entry must be used; an intermediate rule without a limit matches nothing.
        assert_eq!(find(&[("client", "a"), ("x", "y")]), None);
        assert_eq!(find(&[("outer", "o")]), None);
        assert_eq!(find(&[]), None);
        // A tree that takes two keys in either order answers the first in key order.
        let both = RuleSet::build(vec![DomainSpec::new(
            "d",
            vec![
                RuleSpec::new("a").with_children(vec![RuleSpec::new("b").with_limit(limited(1))]),
                RuleSpec::new("b").with_children(vec![RuleSpec::new("a").with_limit(limited(2))]),
            ],
        )])
        .unwrap();
        let (limits, _) = both
            .domain("d")
            .unwrap()
            .find_unordered(&entries(&[("b", "1"), ("a", "2")]))
            .unwrap();
        assert_eq!(limits[0].path, "a.b");
    }

    #[test]
    fn an_unordered_search_is_bounded() {
        // Sixteen keys, each allowed at every level: a perfect trap for a search that
        // explores every order. It gives up after MAX_BUCKET_STEPS rules.
        fn level(depth: usize) -> Vec<RuleSpec> {
            (0..16)
                .map(|k| {
                    let rule = RuleSpec::new(format!("k{k:02}"));
                    if depth == 0 {
                        rule
                    } else {
                        rule.with_children(level(depth - 1))
                    }
                })
                .collect()
        }
        let set = RuleSet::build(vec![DomainSpec::new("d", level(2))]).unwrap();
        let many: Vec<Entry> = (0..16)
            .map(|k| Entry::new(format!("k{k:02}"), "v"))
            .collect();
        assert_eq!(set.domain("d").unwrap().find_unordered(&many), None);
    }

    #[test]
    fn the_most_literal_wildcard_wins_then_definition_order() {
        let set = RuleSet::build(vec![DomainSpec::new(
            "w",
            vec![
                RuleSpec::new("p").with_value("*x").with_limit(limited(1)),
                RuleSpec::new("p").with_value("a*").with_limit(limited(2)),
                RuleSpec::new("p")
                    .with_value("a*b*c")
                    .with_limit(limited(3)),
                RuleSpec::new("p").with_value("abc").with_limit(limited(4)),
            ],
        )])
        .unwrap();
        assert_eq!(path_of(&set, "w", &[("p", "abc")]).unwrap(), "p_abc");
        assert_eq!(path_of(&set, "w", &[("p", "a1b2c")]).unwrap(), "p_a*b*c");
        // `*x` and `a*` are as specific: the first defined wins.
        assert_eq!(path_of(&set, "w", &[("p", "ax")]).unwrap(), "p_*x");
        assert_eq!(path_of(&set, "w", &[("p", "a")]).unwrap(), "p_a*");
        assert_eq!(path_of(&set, "w", &[("p", "b")]), None);
    }

    #[test]
    fn metric_names_follow_value_to_metric_share_threshold_and_detailed_metric() {
        let limit = || limited(60);
        let set = RuleSet::build(vec![
            // README example 10.
            DomainSpec::new(
                "example10",
                vec![RuleSpec::new("route").value_to_metric().with_children(vec![
                    RuleSpec::new("http_method")
                        .value_to_metric()
                        .with_children(vec![RuleSpec::new("subject_id").with_limit(limit())]),
                ])],
            ),
            DomainSpec::new(
                "example10_wildcard",
                vec![RuleSpec::new("user").value_to_metric().with_children(vec![
                    RuleSpec::new("action")
                        .with_value("read*")
                        .value_to_metric()
                        .with_children(vec![RuleSpec::new("resource").with_limit(limit())]),
                ])],
            ),
            // README example 11, with the pattern as envoyproxy/ratelimit's code writes it.
            DomainSpec::new(
                "example11_metrics",
                vec![
                    RuleSpec::new("route")
                        .with_value("api/*")
                        .sharing_threshold()
                        .value_to_metric()
                        .with_children(vec![RuleSpec::new("method").with_limit(limit())]),
                ],
            ),
            DomainSpec::new(
                "detailed",
                vec![
                    RuleSpec::new("a")
                        .with_value("x*")
                        .sharing_threshold()
                        .with_children(vec![RuleSpec::new("b").with_limit(limit()).detailed()]),
                    RuleSpec::new("c").with_value("y*").with_limit(limit()),
                ],
            ),
        ])
        .unwrap();
        let name = |domain: &str, pairs: &[(&str, &str)]| {
            let e = entries(pairs);
            let rule = set.find(domain, &e).unwrap();
            (rule.metric_per_value(), rule.metric_name(&e))
        };
        assert_eq!(
            name(
                "example10",
                &[
                    ("route", "api"),
                    ("http_method", "GET"),
                    ("subject_id", "123")
                ]
            ),
            (true, "route_api.http_method_GET.subject_id".to_owned())
        );
        assert_eq!(
            name(
                "example10_wildcard",
                &[
                    ("user", "alice"),
                    ("action", "readfile"),
                    ("resource", "documents")
                ]
            ),
            (true, "user_alice.action_readfile.resource".to_owned())
        );
        assert_eq!(
            name(
                "example11_metrics",
                &[("route", "api/v1"), ("method", "GET")]
            ),
            (false, "route_api/*.method".to_owned())
        );
        assert_eq!(
            name("detailed", &[("a", "x1"), ("b", "v")]),
            (true, "a_x*.b_v".to_owned())
        );
        let e = entries(&[("c", "y2")]);
        let plain = set.find("detailed", &e).unwrap();
        assert_eq!(
            (plain.metric_per_value(), plain.metric_name(&e)),
            (false, plain.path.clone())
        );
    }

    #[test]
    fn share_threshold_needs_a_wildcard() {
        let err = RuleSet::build(vec![DomainSpec::new(
            "d",
            vec![RuleSpec::new("a").with_value("x").sharing_threshold()],
        )])
        .unwrap_err();
        assert_eq!(err.kind, RuleErrorKind::ShareWithoutWildcard);
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
}
