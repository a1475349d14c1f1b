//! The rule model: what a configuration says ([`DomainSpec`], [`RuleSpec`], [`LimitSpec`],
//! [`Rate`]), the validated [`Rule`]s a [`RuleSet`](super::RuleSet) holds, and why a rule set
//! can be refused ([`RuleError`]).

use std::fmt::Write as _;
use std::time::Duration;

use super::metadata::Metadata;
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
    /// with `*` is a [`Wildcard`](super::Wildcard): each `*` matches any run of characters.
    pub value: Option<String>,
    /// The limits applied when a request's descriptor ends at this rule: none, one, or
    /// several that must all allow ("10 per second and 10,000 per day"). Each is counted in
    /// its own counter; a request one refuses consumes nothing from the others. Several limits
    /// must differ in quota and in name, must each count (not `unlimited`, not 0 requests)
    /// and must not replace each other.
    pub limits: Vec<LimitSpec>,
    /// Count but never deny.
    pub shadow_mode: bool,
    /// Quota mode: a denial of this rule's limit denies the request only if every quota-mode
    /// limit of the request denies (see [`check`](super::check)).
    pub quota_mode: bool,
    /// Report metrics per descriptor value instead of per rule.
    pub detailed_metric: bool,
    /// Name metrics with the request's value at this level (see [`Rule::metric_name`]).
    pub value_to_metric: bool,
    /// Every value matching this rule's wildcard shares one counter (the wildcard's), for the
    /// limit of this rule and of the rules beneath it. Only for a wildcard value.
    pub share_threshold: bool,
    /// Returned in the response's dynamic metadata when a request's descriptor ends at this
    /// rule and passes.
    pub metadata: Option<Metadata>,
    /// Rules for the next entry of the descriptor.
    pub descriptors: Vec<RuleSpec>,
}

impl RuleSpec {
    /// A rule for `key` with any value, no limit and no children.
    pub fn new(key: impl Into<String>) -> Self {
        RuleSpec {
            key: key.into(),
            value: None,
            limits: Vec::new(),
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            value_to_metric: false,
            share_threshold: false,
            metadata: None,
            descriptors: Vec::new(),
        }
    }

    /// The same rule, matching only `value` (or a [`Wildcard`](super::Wildcard) with `*`).
    pub fn with_value(mut self, value: impl Into<String>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// The same rule with one more limit: once for a rule with one limit, again for each
    /// further limit that must allow too.
    ///
    /// ```
    /// use flowgate::envoy::{DomainSpec, Entry, LimitSpec, Rate, RuleSet, RuleSpec};
    /// use flowgate::Quota;
    /// use std::time::Duration;
    /// let per_day = Quota::new(10_000, Duration::from_secs(86_400)).unwrap();
    /// let rules = RuleSet::build(vec![DomainSpec::new("api", vec![
    ///     RuleSpec::new("api_key")
    ///         .with_limit(LimitSpec::new(Rate::Limited(Quota::per_second(10))))
    ///         .with_limit(LimitSpec::new(Rate::Limited(per_day))),
    /// ])]).unwrap();
    /// let limits = rules.find_limits("api", &[Entry::new("api_key", "k1")]);
    /// assert_eq!(limits.len(), 2);
    /// assert_eq!(limits[1].rate.limit(), Some(10_000));
    /// ```
    pub fn with_limit(mut self, limit: LimitSpec) -> Self {
        self.limits.push(limit);
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

    /// The same rule with `detailed_metric`.
    pub fn detailed(mut self) -> Self {
        self.detailed_metric = true;
        self
    }

    /// The same rule in quota mode.
    pub fn quota(mut self) -> Self {
        self.quota_mode = true;
        self
    }

    /// The same rule, its wildcard's matches sharing one counter.
    pub fn sharing_threshold(mut self) -> Self {
        self.share_threshold = true;
        self
    }

    /// The same rule, naming metrics with the request's value.
    pub fn value_to_metric(mut self) -> Self {
        self.value_to_metric = true;
        self
    }

    /// The same rule with metadata.
    pub fn with_metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = Some(metadata);
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

/// One limit of a rule, as built into a [`RuleSet`](super::RuleSet): a rule with several
/// limits ([`RuleSpec::limits`]) is several `Rule`s with the same path, one after the other in
/// [`RuleSet::rules`](super::RuleSet::rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Position in [`RuleSet::rules`](super::RuleSet::rules): a small, dense id for per-rule
    /// (per-limit) metrics.
    pub id: usize,
    /// Which of its rule's limits this is (0 for the first or only one).
    pub limit_index: usize,
    /// How many limits its rule has (1 for most rules).
    pub limit_count: usize,
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
    /// Quota mode (see [`RuleSpec::quota_mode`]).
    pub quota_mode: bool,
    /// Report metrics per descriptor value.
    pub detailed_metric: bool,
    /// The rule's metadata.
    pub metadata: Option<Metadata>,
    /// How the rule and each of its ancestors was matched, outermost first: one per entry of
    /// the descriptors it applies to.
    pub levels: Vec<Level>,
    /// The end of this rule's counter keys (its quota), built once; see
    /// [`counter_key`](super::counter_key).
    pub(super) counter_suffix: String,
    /// Whether a level shares its counter (`share_threshold`), computed once.
    pub(super) shares: bool,
    /// The name shown when the limit has none: the path, with `#index` for a rule with several
    /// limits ([`display_name`](Rule::display_name)), built once.
    pub(super) unnamed: String,
}

/// How a rule, or one of its ancestors, matches its entry of a descriptor: what counter keys
/// and metric names make of the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// The entry's key.
    pub key: String,
    /// How the value is matched.
    pub value: LevelValue,
    /// `value_to_metric` at this level.
    pub value_to_metric: bool,
}

/// How a [`Level`] matches the entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LevelValue {
    /// Any value (no `value` in the rule).
    Any,
    /// Exactly this value.
    Exact(String),
    /// A wildcard pattern; `shared`: `share_threshold`, every match counts in one counter.
    Wildcard {
        /// The pattern as written.
        pattern: String,
        /// `share_threshold`.
        shared: bool,
    },
}

impl Level {
    /// The pattern that stands for the request's value in counter keys, if this level shares
    /// one counter among its matches.
    pub fn shared_pattern(&self) -> Option<&str> {
        match &self.value {
            LevelValue::Wildcard {
                pattern,
                shared: true,
            } => Some(pattern),
            _ => None,
        }
    }
}

/// The end of a counter key (after its `#`): the quota's algorithm, limit, period and burst
/// (and calendar, for a calendar quota), so a counter is only ever used with one quota.
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
    // A calendar's windows are keyed otherwise than a period's: never share a counter.
    if let Some(calendar) = quota.window_calendar() {
        let _ = write!(suffix, ":{calendar}");
    }
    suffix
}

/// The quota a [`quota_suffix`] was written from, if this build can rebuild it (a calendar
/// quota needs the `calendar` feature) and it writes back to the same suffix.
pub(crate) fn parse_quota_suffix(suffix: &str) -> Option<Quota> {
    let mut parts = suffix.splitn(5, ':');
    let algorithm: crate::Algorithm = parts.next()?.parse().ok()?;
    let limit: u64 = parts.next()?.parse().ok()?;
    let period: u64 = parts.next()?.parse().ok()?;
    let burst: u64 = parts.next()?.parse().ok()?;
    let quota = match parts.next() {
        None => Quota::new(limit, Duration::from_nanos(period))
            .and_then(|q| q.with_algorithm(algorithm))
            .and_then(|q| q.with_burst(burst))
            .ok()?,
        Some(calendar) => parse_calendar(limit, calendar)?,
    };
    (quota_suffix(&quota) == suffix).then_some(quota)
}

/// A calendar quota of `limit` per `calendar` (`month@Europe/Berlin`).
#[cfg(feature = "calendar")]
fn parse_calendar(limit: u64, calendar: &str) -> Option<Quota> {
    use crate::calendar::{Calendar, CalendarUnit};
    let (unit, zone) = calendar.split_once('@')?;
    let unit: CalendarUnit = unit.parse().ok()?;
    Quota::per_calendar(limit, Calendar::new(unit, zone).ok()?).ok()
}

/// Without the `calendar` feature, no calendar quota can be rebuilt.
#[cfg(not(feature = "calendar"))]
fn parse_calendar(_limit: u64, _calendar: &str) -> Option<Quota> {
    None
}

impl Rule {
    /// The quota part of this rule's counter keys.
    pub(crate) fn counter_suffix(&self) -> &str {
        &self.counter_suffix
    }

    /// The name to show clients: the limit's `name`, else its path (for a rule with several
    /// limits, followed by `#` and the limit's index, so every limit's name is distinct).
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.unnamed)
    }

    /// The limit's own series name: its [`path`](Rule::path), followed by `#` and its index for
    /// one of a rule's several limits (`api_key#0`, `api_key#1`), so each limit is counted
    /// apart in metrics.
    pub fn limit_path(&self) -> &str {
        &self.unnamed
    }

    /// Whether some level shares its counter among its wildcard's matches (`share_threshold`).
    pub fn shares_counter(&self) -> bool {
        self.shares
    }

    /// Whether the metric name depends on the request: `detailed_metric`, or `value_to_metric`
    /// at a level whose value is not fixed by the rule (no value, or an unshared wildcard).
    pub fn metric_per_value(&self) -> bool {
        self.detailed_metric
            || self.levels.iter().any(|l| {
                l.value_to_metric
                    && matches!(
                        l.value,
                        LevelValue::Any | LevelValue::Wildcard { shared: false, .. }
                    )
            })
    }

    /// The name of the metric series a request descriptor (`entries`, which this rule matched)
    /// is counted under, as envoyproxy/ratelimit names its stats (without the domain):
    ///
    /// * `detailed_metric`: every entry as `key_value`, but a `share_threshold` level as
    ///   `key_pattern`;
    /// * otherwise, per level: an exact rule value as `key_value`; a wildcard as `key_pattern`,
    ///   or `key_value` with `value_to_metric` (unless `share_threshold`); a rule without value
    ///   as `key`, or `key_value` with `value_to_metric`.
    ///
    /// Without either flag this is [`path`](Rule::path). For one of a rule's several limits,
    /// `#` and the limit's index follow, as in [`limit_path`](Rule::limit_path).
    pub fn metric_name(&self, entries: &[crate::envoy::Entry]) -> String {
        let mut name = String::new();
        for (i, (level, entry)) in self.levels.iter().zip(entries).enumerate() {
            if i > 0 {
                name.push('.');
            }
            name.push_str(&entry.key);
            let value: &str = match (&level.value, self.detailed_metric) {
                (
                    LevelValue::Wildcard {
                        pattern,
                        shared: true,
                    },
                    _,
                ) => pattern,
                (_, true) => &entry.value,
                (LevelValue::Exact(v), false) => v,
                (LevelValue::Wildcard { .. }, false) if level.value_to_metric => &entry.value,
                (LevelValue::Wildcard { pattern, .. }, false) => pattern,
                (LevelValue::Any, false) if level.value_to_metric => &entry.value,
                (LevelValue::Any, false) => "",
            };
            if !value.is_empty() {
                name.push('_');
                name.push_str(value);
            }
        }
        if self.limit_count > 1 {
            // Writing to a String cannot fail.
            let _ = write!(name, "#{}", self.limit_index);
        }
        name
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
    /// A limit that replaces itself, or another limit of its own rule.
    #[error("limit `{0}` must not replace itself or another limit of its rule")]
    ReplacesItself(String),
    /// A limit of a rule with several that is `unlimited` (it would have no effect) or blocks
    /// everything (the others would have none).
    #[error("a rule with several limits must not have an `unlimited` one or one of 0 requests")]
    UncountedAmongLimits,
    /// Two limits of one rule with the same quota (they would share one counter) or the same
    /// name.
    #[error("limit {index} of this rule repeats the {what} of another of its limits")]
    DuplicateLimit {
        /// The repeating limit's index in [`RuleSpec::limits`].
        index: usize,
        /// `quota` or `name`.
        what: &'static str,
    },
    /// `share_threshold` on a rule whose value has no `*`.
    #[error("`share_threshold` needs a wildcard value (with `*`)")]
    ShareWithoutWildcard,
}
