//! A descriptor under two limits ("2 per second and 5 per day for each key", through
//! [`envoy::check`]) on every store — memory, a `redis-server`, a 3-master Redis Cluster — with
//! time from a manual clock: per-second refusals don't burn the daily quota, the daily
//! exhaustion refuses, and each refusal gives the other limit's unit back exactly.

#![cfg(feature = "envoy")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flowgate::clock::ManualClock;
use flowgate::envoy::{
    self, AppliedLimit, Descriptor, DomainSpec, Entry, LimitSpec, Rate, RuleSet, RuleSpec, Status,
};
use flowgate::store::{MemoryStore, Store};
use flowgate::{Algorithm, Quota};
use flowgate_testing::conformance::DEFAULT_START;

fn rules() -> RuleSet {
    let gcra = |n, period| {
        Quota::new(n, period)
            .unwrap()
            .with_algorithm(Algorithm::Gcra)
            .unwrap()
    };
    RuleSet::build(vec![DomainSpec::new(
        "api",
        vec![
            RuleSpec::new("key")
                .with_limit(
                    LimitSpec::new(Rate::Limited(gcra(2, Duration::from_secs(1)))).named("second"),
                )
                .with_limit(
                    LimitSpec::new(Rate::Limited(gcra(5, Duration::from_secs(86_400))))
                        .named("day"),
                ),
        ],
    )])
    .unwrap()
}

/// Each limit's `(allowed, remaining)`, in the rule's order, and the binding limit's name.
type Seen = (bool, &'static str, Vec<(bool, u64)>);

async fn request<S: Store>(rules: &RuleSet, store: &S, key: &str, hits: u64) -> Seen {
    let mut descriptor = Descriptor::new(vec![Entry::new("key", key)]);
    descriptor.hits_addend = Some(hits);
    let verdict = envoy::check(rules, store, "api", &[descriptor], 1).await;
    let d = &verdict.descriptors[0];
    fn name<'r>(d: &envoy::DescriptorVerdict<'r>) -> &'r str {
        match d.applied {
            Some(AppliedLimit::Rule(rule)) => rule.name.as_deref().unwrap(),
            other => panic!("{other:?}"),
        }
    }
    let binding = if name(d) == "second" { "second" } else { "day" };
    let mut limits: Vec<_> = d.limits().collect();
    limits.sort_by_key(|l| name(l) != "second");
    let each = limits
        .iter()
        .map(|l| match &l.status {
            Status::Counted(Ok(decision)) => (decision.allowed, decision.remaining),
            other => panic!("{other:?}"),
        })
        .collect();
    (verdict.allowed, binding, each)
}

/// The scenario, on keys under `prefix`.
async fn two_limits<S: Store>(store: &S, clock: &ManualClock, prefix: &str) {
    let rules = rules();
    let key = format!("{prefix}k");
    let key = key.as_str();
    clock.set(DEFAULT_START);
    // Second 1: two pass (the second binds, with the least remaining), the third is refused by
    // the second and gives the day's unit back.
    assert_eq!(
        request(&rules, store, key, 1).await,
        (true, "second", vec![(true, 1), (true, 4)])
    );
    assert_eq!(
        request(&rules, store, key, 1).await,
        (true, "second", vec![(true, 0), (true, 3)])
    );
    for _ in 0..3 {
        let (allowed, binding, _) = request(&rules, store, key, 1).await;
        assert_eq!((allowed, binding), (false, "second"));
    }
    assert_eq!(
        request(&rules, store, key, 0).await,
        (true, "second", vec![(true, 0), (true, 3)]),
        "the per-second refusals burnt none of the day"
    );
    // Second 2: two more pass; the day has 1 left.
    clock.advance(Duration::from_secs(1));
    assert!(request(&rules, store, key, 1).await.0);
    assert_eq!(
        request(&rules, store, key, 1).await,
        (true, "second", vec![(true, 0), (true, 1)])
    );
    // Second 3: one passes, then the day refuses and binds; the second's unit comes back.
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        request(&rules, store, key, 1).await,
        (true, "day", vec![(true, 1), (true, 0)])
    );
    let (allowed, binding, each) = request(&rules, store, key, 1).await;
    assert_eq!((allowed, binding, each[1].0), (false, "day", false));
    assert_eq!(
        request(&rules, store, key, 0).await,
        (true, "day", vec![(true, 1), (true, 0)]),
        "the daily refusal took nothing from the second"
    );
    // A cost of 2 with one unit of the second left: refused by the second, and by the day.
    let (allowed, binding, _) = request(&rules, store, key, 2).await;
    assert!(!allowed);
    assert_eq!(binding, "day", "the day's wait is the longer");
    // Second 4: the second is full again, the day is still exhausted: refused, and the
    // second's units are all given back.
    clock.advance(Duration::from_secs(1));
    assert!(!request(&rules, store, key, 2).await.0);
    assert_eq!(
        request(&rules, store, key, 0).await,
        (true, "day", vec![(true, 2), (true, 0)])
    );
    // The admin resets both.
    envoy::reset(&rules, store, "api", &[Entry::new("key", key)])
        .await
        .unwrap();
    assert_eq!(
        request(&rules, store, key, 0).await,
        (true, "second", vec![(true, 2), (true, 5)])
    );
}

#[tokio::test]
async fn memory_store() {
    let clock = ManualClock::new(DEFAULT_START);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    two_limits(&store, &clock, "memory:").await;
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use flowgate::store::RedisStore;
    use flowgate_testing::redis::{RedisCluster, RedisServer};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_server() {
        let Some(server) = RedisServer::start("several_limits") else {
            return;
        };
        let clock = ManualClock::new(DEFAULT_START);
        let store = RedisStore::builder(server.url())
            .clock(clock.clone())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        two_limits(&store, &clock, "redis:").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cluster_of_three_masters() {
        let Some(cluster) = RedisCluster::start("several_limits_cluster", 3, 0) else {
            return;
        };
        let clock = ManualClock::new(DEFAULT_START);
        let store = RedisStore::cluster_builder(cluster.urls())
            .clock(clock.clone())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        // Keys on several masters: the two limits' counters of each key may be apart.
        for n in 0..4 {
            two_limits(&store, &clock, &format!("cluster{n}:")).await;
        }
    }
}
