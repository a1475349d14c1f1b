//! RedisStore on a real Redis Cluster (redis-server processes with `cluster-enabled yes` on free
//! ports, joined by `redis-cli --cluster create`): the conformance table, exact accuracy across
//! instances, and a key's slot migrating and its master failing over under load.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flowgate::clock::ManualClock;
use flowgate::store::{Ask, MemoryStore, RedisStore, Store, StoreError};
use flowgate::{Algorithm, Quota};
use flowgate_testing::conformance::{DEFAULT_START, run_table};
use flowgate_testing::redis::RedisCluster;

async fn store(cluster: &RedisCluster) -> RedisStore {
    RedisStore::cluster_builder(cluster.urls())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_passes_the_conformance_table_and_admits_exactly_the_bound() {
    let Some(cluster) = RedisCluster::start("cluster_conformance", 3, 0) else {
        return;
    };
    // The table, with time from a manual clock; its keys spread over all three masters.
    let clock = ManualClock::new(DEFAULT_START);
    let replay = RedisStore::cluster_builder(cluster.urls())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    run_table(&replay, &clock, "conformance:").await;
    let masters: std::collections::HashSet<usize> = (0..33)
        .map(|n| cluster.master_of(&replay.redis_key(&format!("conformance:{n}"), Algorithm::Gcra)))
        .collect();
    assert_eq!(masters.len(), 3, "the table's keys cover every master");

    // Batches spanning slots and nodes decide like the memory store.
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let quota = Quota::per_second(3)
        .with_algorithm(Algorithm::SlidingWindow)
        .unwrap();
    let keys: Vec<String> = (0..24).map(|k| format!("spread:{k}")).collect();
    for _ in 0..4 {
        let requests: Vec<Ask<'_>> = keys.iter().map(|key| Ask::new(key, &quota)).collect();
        assert_eq!(
            replay.check_many(&requests).await,
            memory.check_many(&requests).await
        );
        clock.advance(Duration::from_millis(300));
    }

    // Four instances, server time, one hot key: exactly the bound.
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(store(&cluster).await);
    }
    for algorithm in [Algorithm::Gcra, Algorithm::SlidingLog] {
        let quota = Quota::new(200, Duration::from_secs(86_400))
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let granted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for s in &stores {
            for _ in 0..8 {
                let (s, granted) = (s.clone(), granted.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..40 {
                        if s.check(Ask::new("hot", &quota)).await.unwrap().allowed {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(granted.load(Ordering::Relaxed), 200, "{algorithm}");
    }
}

/// Calls `check` on `key` in a loop until `stop`; counts grants, transient errors, and any
/// other error (there must be none). Panics in the store would fail the task.
fn hammer(
    store: RedisStore,
    key: &'static str,
    quota: Quota,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64, Vec<StoreError>)> {
    tokio::spawn(async move {
        let (mut granted, mut transient, mut other) = (0, 0, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            match store.check(Ask::new(key, &quota)).await {
                Ok(d) if d.allowed => granted += 1,
                Ok(_) => {}
                Err(e) if e.is_transient() => {
                    transient += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => other.push(e),
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (granted, transient, other)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_migration_and_failover_do_not_break_the_store() {
    let Some(mut cluster) = RedisCluster::start("cluster_migration_failover", 3, 1) else {
        return;
    };
    let store = store(&cluster).await;
    let quota = Quota::new(100_000, Duration::from_secs(86_400))
        .unwrap()
        .with_algorithm(Algorithm::FixedWindow)
        .unwrap();
    let key = "migrating";
    let redis_key = store.redis_key(key, Algorithm::FixedWindow);
    assert!(store.check(Ask::new(key, &quota)).await.unwrap().allowed);

    // ---- migrate the key's slot to another master while it is in use
    let stop = Arc::new(AtomicBool::new(false));
    let load = hammer(store.clone(), key, quota, stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let from = cluster.master_of(&redis_key);
    let to = (0..cluster.masters).find(|&m| m != from).unwrap();
    let slot = cluster.nodes[0]
        .cli(&["cluster", "keyslot", &redis_key])
        .trim()
        .to_owned();
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    let (source, target) = (&cluster.nodes[from], &cluster.nodes[to]);
    target.cli(&["cluster", "setslot", &slot, "importing", &from_id]);
    source.cli(&["cluster", "setslot", &slot, "migrating", &to_id]);
    tokio::time::sleep(Duration::from_millis(200)).await; // ASK redirections meanwhile
    source.cli(&[
        "migrate",
        "127.0.0.1",
        &target.port.to_string(),
        &redis_key,
        "0",
        "5000",
    ]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    for m in 0..cluster.masters {
        cluster.nodes[m].cli(&["cluster", "setslot", &slot, "node", &to_id]);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (granted, transient, other) = load.await.unwrap();
    assert!(other.is_empty(), "non-transient errors: {other:?}");
    assert_eq!(cluster.master_of(&redis_key), to);
    // The count moved with the key: every grant is in it.
    // (A call that failed transiently may still have counted.)
    let counted = 100_000 - store.peek(Ask::new(key, &quota)).await.unwrap().remaining;
    assert!(
        counted > granted && counted <= granted + 1 + transient,
        "counted {counted}, granted {granted}, transient errors {transient}"
    );
    println!("migration: {granted} grants, {transient} transient errors");

    // ---- kill the key's master; its replica takes over
    let stop = Arc::new(AtomicBool::new(false));
    let load = hammer(store.clone(), key, quota, stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let master = cluster.master_of(&redis_key);
    cluster.nodes[master].kill();
    let killed = Instant::now();
    // Wait until a replica has taken over and the store is served again: 50 calls in a row.
    let mut in_a_row = 0;
    let mut failures = 0;
    while in_a_row < 50 {
        if killed.elapsed() > Duration::from_secs(6) {
            let live = cluster
                .nodes
                .iter()
                .find(|n| flowgate_testing::redis::listening(n.port))
                .unwrap();
            panic!("no failover: {}", live.cli(&["cluster", "nodes"]));
        }
        match store.check(Ask::new(key, &quota).cost(0)).await {
            Ok(_) => in_a_row += 1,
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                failures += 1;
                in_a_row = 0;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let recovered = killed.elapsed();
    assert_ne!(cluster.master_of(&redis_key), master);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (granted, transient, other) = load.await.unwrap();
    assert!(other.is_empty(), "non-transient errors: {other:?}");
    assert!(granted > 0);
    assert!(store.check(Ask::new(key, &quota)).await.unwrap().allowed);
    println!(
        "failover: served again after {recovered:?} ({failures} failed calls); {granted} grants, {transient} transient errors"
    );
}
