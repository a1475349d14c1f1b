//! Buckets: a `BucketId` checked and put in a canonical order, the rule it falls under (or the
//! blanket rule it gets), and assignments in their protobuf form.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy as StrategyPb,
};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket as TokenBucketPb};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as ActionPb, QuotaAssignmentAction,
};
use envoy_types::pb::google::protobuf::{Duration as DurationPb, UInt32Value};
use flowgate::FailMode;
use flowgate::envoy::{Entry, Rate, Rule, counter_key};
use flowgate::rlqs::client::{Strategy, TokenBucket};
use flowgate::rlqs::ledger::Terms;

use crate::api::Active;
use crate::config::rlqs::Unmatched;

/// Most entries a `BucketId` may have.
pub const MAX_BUCKET_ENTRIES: usize = 16;

/// Longest key or value of a `BucketId` entry, in bytes.
pub const MAX_BUCKET_TEXT: usize = 256;

/// A bucket's entries, sorted by key: its identity on a stream.
pub type BucketKey = Vec<Entry>;

/// Why a `BucketId` was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBucket(pub String);

/// Checks `id` (1 to [`MAX_BUCKET_ENTRIES`] entries, keys and values of 1 to
/// [`MAX_BUCKET_TEXT`] bytes) and answers its entries sorted by key.
pub fn normalize(id: Option<&BucketId>) -> Result<BucketKey, BadBucket> {
    let map: &HashMap<String, String> = match id {
        Some(id) if !id.bucket.is_empty() => &id.bucket,
        _ => return Err(BadBucket("a bucket_id must have at least one entry".into())),
    };
    if map.len() > MAX_BUCKET_ENTRIES {
        return Err(BadBucket(format!(
            "a bucket_id has {} entries; at most {MAX_BUCKET_ENTRIES} are accepted",
            map.len()
        )));
    }
    let mut entries = Vec::with_capacity(map.len());
    for (key, value) in map {
        if key.is_empty() || value.is_empty() {
            return Err(BadBucket(
                "bucket_id keys and values must not be empty".into(),
            ));
        }
        if key.len() > MAX_BUCKET_TEXT || value.len() > MAX_BUCKET_TEXT {
            return Err(BadBucket(format!(
                "bucket_id keys and values are at most {MAX_BUCKET_TEXT} bytes"
            )));
        }
        entries.push(Entry::new(key.as_str(), value.as_str()));
    }
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(entries)
}

/// Where a rule instance's shares are counted.
#[derive(Debug, Clone, PartialEq)]
pub struct Divided {
    /// The rule instance's ledger key (its counter key).
    pub rule: String,
    /// Its limit, fairness and ticks.
    pub terms: Terms,
    /// The rule's period (assignments' fill interval).
    pub period: Duration,
    /// What to do while the ledger cannot be reached (`None`: the server's default).
    pub fail: Option<FailMode>,
    /// The rule's domain and path, for metrics.
    pub labels: (String, String),
}

/// What a bucket is given.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// The same blanket rule every tick.
    Blanket(Strategy),
    /// A share of a rule instance's limit.
    Divided(Divided),
}

/// The target of the bucket `key` of `domain` under the running policy: the rule its entries
/// reach (`docs/rlqs.md`, "Buckets and rules"), else the domain's `unmatched` behaviour.
pub fn resolve(active: &Active, domain: &str, key: &BucketKey) -> Target {
    let policy = &active.policy;
    let config = policy.rlqs(domain);
    let terms = |limit| Terms {
        limit,
        fairness: config.fairness,
        timing: config.timing(),
    };
    let found = policy
        .rules
        .domain(domain)
        .and_then(|rules| rules.find_unordered(key))
        .and_then(|(limits, ordered)| Some((most_restrictive(limits)?, ordered)));
    match found {
        Some((rule, ordered)) => match rule.rate {
            Rate::Unlimited => Target::Blanket(Strategy::AllowAll),
            Rate::Blocked { .. } => Target::Blanket(Strategy::DenyAll),
            Rate::Limited(_) if rule.shadow_mode => Target::Blanket(Strategy::AllowAll),
            Rate::Limited(quota) => Target::Divided(Divided {
                rule: counter_key(domain, &ordered, &quota),
                terms: terms(quota.limit()),
                period: quota.period(),
                fail: rule.fail,
                labels: (domain.to_owned(), rule.path.clone()),
            }),
        },
        None => match config.unmatched {
            Unmatched::Allow => Target::Blanket(Strategy::AllowAll),
            Unmatched::Deny => Target::Blanket(Strategy::DenyAll),
            Unmatched::Divide(quota) => {
                let mut rule = counter_key(domain, key, &quota);
                rule.push_str("#unmatched");
                Target::Divided(Divided {
                    rule,
                    terms: terms(quota.limit()),
                    period: quota.period(),
                    fail: None,
                    labels: (domain.to_owned(), "_unmatched".to_owned()),
                })
            }
        },
    }
}

/// The limit RLQS divides among a rule's limits (`rate_limits`): the one with the lowest
/// long-run rate — units per second — the first defined on a tie. The others are not enforced
/// through RLQS: an Envoy's token bucket has one rate (docs/rlqs.md).
fn most_restrictive(limits: &[Rule]) -> Option<&Rule> {
    let per_nanos = |rule: &Rule| match rule.rate {
        Rate::Limited(quota) => (u128::from(quota.limit()), quota.period().as_nanos()),
        _ => (0, 1),
    };
    limits.iter().min_by(|a, b| {
        let ((a_units, a_nanos), (b_units, b_nanos)) = (per_nanos(a), per_nanos(b));
        (a_units * b_nanos).cmp(&(b_units * a_nanos))
    })
}

/// The metric label of `strategy`'s action.
pub fn action_name(strategy: &Strategy) -> &'static str {
    match strategy {
        Strategy::AllowAll => "allow_all",
        Strategy::DenyAll => "deny_all",
        Strategy::TokenBucket(_) => "token_bucket",
    }
}

fn duration(d: Duration) -> DurationPb {
    DurationPb {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// An assignment of `strategy` to bucket `id` for `ttl` (whole seconds).
pub fn assignment(id: &BucketId, strategy: &Strategy, ttl: Duration) -> BucketAction {
    let strategy = match strategy {
        Strategy::AllowAll => StrategyPb::BlanketRule(BlanketRule::AllowAll as i32),
        Strategy::DenyAll => StrategyPb::BlanketRule(BlanketRule::DenyAll as i32),
        Strategy::TokenBucket(tb) => StrategyPb::TokenBucket(TokenBucketPb {
            max_tokens: u32::try_from(tb.max_tokens).unwrap_or(u32::MAX),
            tokens_per_fill: Some(UInt32Value {
                value: u32::try_from(tb.tokens_per_fill).unwrap_or(u32::MAX),
            }),
            fill_interval: Some(duration(tb.fill_interval)),
        }),
    };
    BucketAction {
        bucket_id: Some(id.clone()),
        bucket_action: Some(ActionPb::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(duration(ttl)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

/// An abandon action for bucket `id`.
pub fn abandon(id: &BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(id.clone()),
        bucket_action: Some(ActionPb::AbandonAction(AbandonAction {})),
    }
}

/// An assignment as a client reads it: the strategy and its time to live.
pub type Assigned = (Strategy, Option<Duration>);

/// What an action tells a client: an assignment (strategy, time to live), an abandonment,
/// or nothing it understands (`None`). The inverse of [`assignment`] and [`abandon`], for
/// clients.
pub fn read_action(action: &BucketAction) -> Option<(Option<Assigned>, BucketKey)> {
    let key = normalize(action.bucket_id.as_ref()).ok()?;
    match action.bucket_action.as_ref()? {
        ActionPb::AbandonAction(_) => Some((None, key)),
        ActionPb::QuotaAssignmentAction(a) => {
            let ttl = a.assignment_time_to_live.as_ref().map(|d| {
                Duration::new(
                    u64::try_from(d.seconds).unwrap_or(0),
                    u32::try_from(d.nanos).unwrap_or(0),
                )
            });
            let strategy = match a
                .rate_limit_strategy
                .as_ref()
                .and_then(|s| s.strategy.as_ref())
            {
                // "If not set, allow all requests."
                None => Strategy::AllowAll,
                Some(StrategyPb::BlanketRule(rule)) => {
                    if *rule == BlanketRule::DenyAll as i32 {
                        Strategy::DenyAll
                    } else {
                        Strategy::AllowAll
                    }
                }
                Some(StrategyPb::TokenBucket(tb)) => {
                    let interval = tb.fill_interval.as_ref()?;
                    Strategy::TokenBucket(TokenBucket {
                        max_tokens: u64::from(tb.max_tokens),
                        tokens_per_fill: tb
                            .tokens_per_fill
                            .as_ref()
                            .map_or(1, |v| u64::from(v.value)),
                        fill_interval: Duration::new(
                            u64::try_from(interval.seconds).ok()?,
                            u32::try_from(interval.nanos).ok()?,
                        ),
                    })
                }
                // Not implemented by Envoy's filter either.
                Some(StrategyPb::RequestsPerTimeUnit(_)) => return None,
            };
            Some((Some((strategy, ttl)), key))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(pairs: &[(&str, &str)]) -> BucketId {
        BucketId {
            bucket: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn a_rule_with_several_limits_is_divided_by_its_lowest_long_run_rate() {
        use flowgate::Quota;
        use flowgate::envoy::{DomainSpec, LimitSpec, RuleSet, RuleSpec};
        let limit = |n, secs| {
            LimitSpec::new(Rate::Limited(
                Quota::new(n, Duration::from_secs(secs)).unwrap(),
            ))
        };
        let rules = RuleSet::build(vec![DomainSpec::new(
            "d",
            vec![
                RuleSpec::new("k")
                    .with_limit(limit(10, 1))
                    .with_limit(limit(10_000, 86_400))
                    .with_limit(limit(700, 60)),
                RuleSpec::new("tie")
                    .with_limit(limit(1, 1))
                    .with_limit(limit(60, 60)),
            ],
        )])
        .unwrap();
        let pick = |key| {
            let limits = rules.find_limits("d", &[Entry::new(key, "v")]);
            most_restrictive(limits).map(|r| r.rate.limit())
        };
        assert_eq!(pick("k"), Some(Some(10_000)), "0.12 per second, the lowest");
        assert_eq!(pick("tie"), Some(Some(1)), "the first on a tie");
        assert!(most_restrictive(&[]).is_none());
    }

    #[test]
    fn bucket_ids_are_checked_and_sorted() {
        let key = normalize(Some(&id(&[("b", "2"), ("a", "1")]))).unwrap();
        assert_eq!(key, vec![Entry::new("a", "1"), Entry::new("b", "2")]);
        assert!(normalize(None).is_err());
        assert!(normalize(Some(&id(&[]))).is_err());
        assert!(normalize(Some(&id(&[("a", "")]))).is_err());
        let long = "x".repeat(MAX_BUCKET_TEXT + 1);
        assert!(normalize(Some(&id(&[("a", &long)]))).is_err());
        let many: Vec<(String, String)> = (0..=MAX_BUCKET_ENTRIES)
            .map(|i| (format!("k{i}"), "v".to_owned()))
            .collect();
        let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert!(normalize(Some(&id(&refs))).is_err());
    }

    #[test]
    fn shares_become_token_buckets_in_whole_seconds_never_faster() {
        let s = |tokens, bucket| flowgate::rlqs::Share { tokens, bucket };
        let tb = |max, per, secs| {
            Strategy::TokenBucket(TokenBucket {
                max_tokens: max,
                tokens_per_fill: per,
                fill_interval: Duration::from_secs(secs),
            })
        };
        assert_eq!(
            Strategy::for_share(s(50, 1), Duration::from_secs(1)),
            tb(1, 50, 1)
        );
        assert_eq!(
            Strategy::for_share(s(50, 1), Duration::from_secs(60)),
            tb(1, 50, 60)
        );
        // 10 per 100 ms: 100 per second.
        assert_eq!(
            Strategy::for_share(s(10, 1), Duration::from_millis(100)),
            tb(1, 100, 1)
        );
        // 3 per 1.5 s: 2 s intervals of 4 tokens (2/s, as 3 per 1.5 s).
        assert_eq!(
            Strategy::for_share(s(3, 1), Duration::from_millis(1500)),
            tb(1, 4, 2)
        );
        // 1 per 1.5 s: 2 s intervals of 1 token — slower, never faster.
        assert_eq!(
            Strategy::for_share(s(1, 1), Duration::from_millis(1500)),
            tb(1, 1, 2)
        );
        assert_eq!(
            Strategy::for_share(s(0, 0), Duration::from_secs(1)),
            Strategy::DenyAll
        );
    }

    #[test]
    fn assignments_read_back() {
        let bucket = id(&[("name", "api")]);
        for strategy in [
            Strategy::AllowAll,
            Strategy::DenyAll,
            Strategy::for_share(
                flowgate::rlqs::Share {
                    tokens: 7,
                    bucket: 1,
                },
                Duration::from_secs(1),
            ),
        ] {
            let (what, key) =
                read_action(&assignment(&bucket, &strategy, Duration::from_secs(3))).unwrap();
            assert_eq!(what, Some((strategy, Some(Duration::from_secs(3)))));
            assert_eq!(key, vec![Entry::new("name", "api")]);
        }
        assert_eq!(read_action(&abandon(&bucket)).unwrap().0, None);
    }
}
