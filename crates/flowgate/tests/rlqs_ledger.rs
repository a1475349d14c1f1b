//! The RLQS ledger on a real `redis-server` and a real 3-master Redis Cluster: the same
//! script of ticks, joins, claims and removals gives exactly what the memory ledger gives
//! (a conformance run on injected time), two instances ticking at once on the server's own
//! `TIME` get one division, and every key expires.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flowgate::clock::{ManualClock, Nanos};
use flowgate::rlqs::ledger::{self, Joined, Ledger, Terms, Timing};
use flowgate::rlqs::{Fairness, MemoryLedger};
use flowgate::store::RedisStore;
use flowgate_testing::redis::{RedisCluster, RedisServer};

const S: Nanos = 1_000_000_000;
const START: Nanos = 1_800_000_000 * S;

fn terms(limit: u64) -> Terms {
    Terms {
        limit,
        fairness: Fairness::default(),
        timing: Timing {
            tick: Duration::from_secs(1),
            stale_after: Duration::from_secs(3),
        },
    }
}

/// What one step of the script answered, comparable across ledgers.
#[derive(Debug, PartialEq)]
enum Seen {
    Tick { number: u64, division: String },
    Join { joined: Joined },
}

/// Runs the conformance script on `ledger` (whose time is `clock`) for rule instance `rule`.
async fn script(ledger: &dyn Ledger, clock: &ManualClock, rule: &str) -> Vec<Seen> {
    let t = terms(1000);
    let mut seen = Vec::new();
    let tick = async |demands: &[(&str, Option<u64>)]| {
        let tick = ledger::tick(ledger, rule, &t, demands).await.unwrap();
        Seen::Tick {
            number: tick.number,
            division: tick.current.encode(),
        }
    };
    // A fresh rule: members claim a quarter of what is left each.
    for member in ["a:1", "b:2", "c:3", "d:4"] {
        let joined = ledger::join(ledger, rule, &t, member).await.unwrap();
        seen.push(Seen::Join { joined });
    }
    clock.advance(Duration::from_millis(1500));
    seen.push(tick(&[("a:1", Some(700)), ("b:2", Some(50))]).await);
    seen.push(tick(&[("c:3", Some(400))]).await);
    // This tick's budget still carries the last tick's claims: a joiner waits.
    let joined = ledger::join(ledger, rule, &t, "x:9").await.unwrap();
    seen.push(Seen::Join { joined });
    clock.advance(Duration::from_secs(1));
    seen.push(tick(&[("a:1", Some(700)), ("b:2", Some(50)), ("c:3", Some(400))]).await);
    // d never reported again; it goes stale. A joiner claims within the next tick.
    let joined = ledger::join(ledger, rule, &t, "e:5").await.unwrap();
    let claimed_in = match joined {
        Joined::Claimed { tick, .. } => tick,
        Joined::Waiting => 0,
    };
    seen.push(Seen::Join { joined });
    ledger.remove(rule, &["b:2"]).await.unwrap();
    clock.advance(Duration::from_secs(2));
    seen.push(tick(&[("a:1", Some(100)), ("c:3", Some(400)), ("e:5", Some(10))]).await);
    clock.advance(Duration::from_secs(1));
    seen.push(tick(&[("a:1", Some(100)), ("e:5", Some(10))]).await);
    // A claim for a tick that has passed.
    let claim = ledger::Claim {
        ask: 1,
        fraction: 0.5,
        burst: 0.02,
        budget: 100,
    };
    let late = ledger
        .claim(rule, &t.timing, claimed_in, &claim)
        .await
        .unwrap();
    assert_eq!(late, ledger::Claimed::TickPassed);
    seen
}

async fn conforms(redis: &RedisStore, clock: &ManualClock, rules: &[&str]) {
    let memory = MemoryLedger::with_clock(clock.clone());
    let quota = redis.quota_ledger();
    for rule in rules {
        clock.set(START);
        let expected = script(&memory, clock, rule).await;
        clock.set(START);
        let got = script(&quota, clock, rule).await;
        assert_eq!(got, expected, "rule {rule}");
        // The script covers: claims on a fresh rule and later, a wait, stale and removed
        // members.
        assert!(matches!(
            expected[0],
            Seen::Join {
                joined: Joined::Claimed { .. }
            }
        ));
        assert!(expected.iter().any(|s| matches!(
            s,
            Seen::Join {
                joined: Joined::Waiting
            }
        )));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_ledger_matches_the_memory_ledger_and_expires_its_keys() {
    let Some(server) = RedisServer::start("rlqs_ledger_server") else {
        return;
    };
    let clock = ManualClock::new(START);
    let redis = RedisStore::builder(server.url())
        .clock(clock.clone())
        .prefix("t:")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    conforms(
        &redis,
        &clock,
        &["edge|user=ann#gcra:1000:1000000000:1000", "a{b}c%7D"],
    )
    .await;
    let keys = server.cli(&["--scan", "--pattern", "t:rlqs:*"]);
    assert!(keys.lines().count() >= 6, "{keys}");
    for key in keys.lines() {
        let ttl: i64 = server.cli(&["pttl", key]).trim().parse().unwrap();
        assert!(ttl > 0, "{key} has no expiry ({ttl})");
    }
    // Braces in a rule are escaped: its keys share one hash tag.
    assert!(keys.contains("t:rlqs:{a%7Bb%7Dc%257D}:m"), "{keys}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_ledger_on_a_cluster_matches_the_memory_ledger() {
    let Some(cluster) = RedisCluster::start("rlqs_ledger_cluster", 3, 0) else {
        return;
    };
    let clock = ManualClock::new(START);
    let redis = RedisStore::cluster_builder(cluster.urls())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let rules: Vec<String> = (0..9).map(|i| format!("d|k=v{i}#q")).collect();
    let masters: std::collections::HashSet<usize> = rules
        .iter()
        .map(|r| cluster.master_of(&format!("flowgate:rlqs:{{{r}}}:m")))
        .collect();
    assert_eq!(masters.len(), 3, "the rules' keys cover every master");
    let refs: Vec<&str> = rules.iter().map(String::as_str).collect();
    conforms(&redis, &clock, &refs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_ticking_at_once_get_one_division() {
    let Some(server) = RedisServer::start("rlqs_ledger_two_instances") else {
        return;
    };
    // Two instances: separate connections, the server's own TIME.
    let connect = || async {
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap()
            .quota_ledger()
    };
    let (one, two) = (connect().await, connect().await);
    let t = terms(500);
    for round in 0..20 {
        let rule = format!("race{round}");
        let a = async {
            ledger::tick(&one, &rule, &t, &[("x:1", Some(300)), ("x:2", Some(20))])
                .await
                .unwrap()
        };
        let b = async {
            ledger::tick(&two, &rule, &t, &[("y:1", Some(900))])
                .await
                .unwrap()
        };
        let (a, b) = tokio::join!(a, b);
        if a.number == b.number {
            assert_eq!(a.current, b.current, "round {round}");
            assert!(a.current.pool() <= 500);
        }
    }
}
