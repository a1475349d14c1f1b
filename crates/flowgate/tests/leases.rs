//! Leases (in-flight limits) on memory, a real `redis-server` and a real 3-master Redis
//! Cluster: the same script of acquires, renewals, releases and expiries gives the same
//! answers on every store (the leases' conformance rows, on injected time), many callers at
//! once through two instances never hold more than the limit together, and Redis keys expire
//! with their last lease.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flowgate::clock::{ManualClock, Nanos};
use flowgate::lease::{Acquired, LeaseId, Leases, MemoryLeases, Terms};
use flowgate::store::RedisStore;
use flowgate_testing::redis::{RedisCluster, RedisServer};

const S: Nanos = 1_000_000_000;
const START: Nanos = 1_800_000_000 * S;

/// One step's answer, comparable across stores (lease ids are random: only whether one was
/// granted is compared).
#[derive(Debug, PartialEq)]
enum Seen {
    Granted { expires_in: Duration, held: u64 },
    Full { held: u64, retry_after: Duration },
    Done(bool),
    Held(u64),
}

fn seen(acquired: Acquired) -> (Seen, Option<LeaseId>) {
    match acquired {
        Acquired::Granted {
            id,
            expires_in,
            held,
        } => (Seen::Granted { expires_in, held }, Some(id)),
        Acquired::Full { held, retry_after } => (Seen::Full { held, retry_after }, None),
    }
}

/// The conformance script on `leases` (whose time is `clock`) for `key`.
async fn script(leases: &dyn Leases, clock: &ManualClock, key: &str) -> Vec<Seen> {
    let terms = Terms::new(3, Duration::from_secs(10)).unwrap();
    let mut out = Vec::new();
    let mut ids = Vec::new();
    // Three slots fill; the fourth caller is told when the earliest lease ends.
    for _ in 0..3 {
        let (s, id) = seen(leases.acquire(key, &terms).await.unwrap());
        out.push(s);
        ids.push(id.unwrap());
        clock.advance(Duration::from_secs(1));
    }
    out.push(seen(leases.acquire(key, &terms).await.unwrap()).0);
    // Releasing one frees a slot at once; releasing it again does nothing.
    out.push(Seen::Done(leases.release(key, ids[1]).await.unwrap()));
    out.push(Seen::Done(leases.release(key, ids[1]).await.unwrap()));
    out.push(Seen::Held(leases.held(key).await.unwrap()));
    let (s, id) = seen(leases.acquire(key, &terms).await.unwrap());
    out.push(s);
    ids[1] = id.unwrap();
    // The first lease is renewed just before it expires; the third is left to expire.
    clock.advance(Duration::from_millis(6_999));
    out.push(Seen::Done(leases.renew(key, ids[0], &terms).await.unwrap()));
    out.push(seen(leases.acquire(key, &terms).await.unwrap()).0);
    clock.advance(Duration::from_millis(2_001));
    // Now 12 s in: the third (taken at 2 s) has just expired; the renewed first holds until
    // 19.999 s, the one taken at 3 s until 13 s.
    out.push(Seen::Held(leases.held(key).await.unwrap()));
    out.push(Seen::Done(leases.renew(key, ids[2], &terms).await.unwrap()));
    out.push(Seen::Done(leases.release(key, ids[2]).await.unwrap()));
    let (s, _) = seen(leases.acquire(key, &terms).await.unwrap());
    out.push(s);
    out.push(seen(leases.acquire(key, &terms).await.unwrap()).0);
    // An id that was never granted cannot renew or release anything.
    let stranger = LeaseId::random();
    out.push(Seen::Done(
        leases.renew(key, stranger, &terms).await.unwrap(),
    ));
    out.push(Seen::Done(leases.release(key, stranger).await.unwrap()));
    // Long after, every lease has expired: the key is free.
    clock.advance(Duration::from_secs(60));
    out.push(Seen::Held(leases.held(key).await.unwrap()));
    out
}

fn expected() -> Vec<Seen> {
    let granted = |held| Seen::Granted {
        expires_in: Duration::from_secs(10),
        held,
    };
    vec![
        granted(1),
        granted(2),
        granted(3),
        Seen::Full {
            held: 3,
            retry_after: Duration::from_secs(7),
        },
        Seen::Done(true),
        Seen::Done(false),
        Seen::Held(2),
        granted(3),
        Seen::Done(true),
        Seen::Full {
            held: 3,
            retry_after: Duration::from_millis(2_001),
        },
        Seen::Held(2),
        Seen::Done(false),
        Seen::Done(false),
        granted(3),
        Seen::Full {
            held: 3,
            retry_after: Duration::from_secs(1),
        },
        Seen::Done(false),
        Seen::Done(false),
        Seen::Held(0),
    ]
}

#[tokio::test]
async fn memory_leases_follow_the_script() {
    let clock = ManualClock::new(START);
    let leases = MemoryLeases::with_clock(clock.clone());
    assert_eq!(script(&leases, &clock, "customer:42").await, expected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_leases_follow_the_script_and_expire_their_keys() {
    let Some(server) = RedisServer::start("leases_server") else {
        return;
    };
    let clock = ManualClock::new(START);
    let leases = RedisStore::builder(server.url())
        .clock(clock.clone())
        .prefix("t:")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
        .leases();
    assert_eq!(script(&leases, &clock, "customer:{42}").await, expected());
    // Braces are escaped inside the hash tag.
    let terms = Terms::new(1, Duration::from_secs(5)).unwrap();
    leases.acquire("customer:{42}", &terms).await.unwrap();
    let keys = server.cli(&["--scan", "--pattern", "t:lease:*"]);
    assert_eq!(keys.trim(), "t:lease:{customer:%7B42%7D}");
    let ttl: i64 = server.cli(&["pttl", keys.trim()]).trim().parse().unwrap();
    assert!(
        (5_000..=6_000).contains(&ttl),
        "expires with its last lease: {ttl}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_leases_follow_the_script_on_every_master() {
    let Some(cluster) = RedisCluster::start("leases_cluster", 3, 0) else {
        return;
    };
    let clock = ManualClock::new(START);
    let leases = RedisStore::cluster_builder(cluster.urls())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
        .leases();
    let keys: Vec<String> = (0..9).map(|i| format!("tenant:{i}")).collect();
    let masters: std::collections::HashSet<usize> = keys
        .iter()
        .map(|k| cluster.master_of(&format!("flowgate:lease:{{{k}}}")))
        .collect();
    assert_eq!(masters.len(), 3, "the keys cover every master");
    for key in &keys {
        assert_eq!(script(&leases, &clock, key).await, expected(), "{key}");
    }
}

/// Many callers through two instances (separate connections, the server's own time): never
/// more than the limit held at once, and every slot is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_hold_more_than_the_limit_together() {
    let Some(server) = RedisServer::start("leases_two_instances") else {
        return;
    };
    let connect = || async {
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap()
            .leases()
    };
    let instances = [connect().await, connect().await];
    let terms = Terms::new(5, Duration::from_secs(60)).unwrap();
    let in_flight = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for caller in 0..40 {
        let leases = instances[caller % 2].clone();
        let (in_flight, most, granted) = (in_flight.clone(), most.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                if let Acquired::Granted { id, .. } =
                    leases.acquire("shared", &terms).await.unwrap()
                {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    granted.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    assert!(leases.release("shared", id).await.unwrap());
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(most.load(Ordering::SeqCst) <= 5, "{most:?} held at once");
    assert!(granted.load(Ordering::SeqCst) >= 5);
    assert_eq!(instances[0].held("shared").await.unwrap(), 0);
}
