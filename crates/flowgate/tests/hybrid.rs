//! Hybrid mode on a real `redis-server`: three instances decide locally and sync every 20 ms;
//! offered 5× the limit, together they admit at least the limit and no more than the
//! documented bound for numbered instances, `2B` (see `store/hybrid.rs`).

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flowgate::store::{Ask, HybridStore, RedisStore, Store};
use flowgate::{Algorithm, Quota};
use flowgate_testing::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_at_five_times_the_limit_stay_within_the_bound() {
    let Some(server) = RedisServer::start("hybrid_bound") else {
        return;
    };
    const K: u64 = 3;
    const LIMIT: u64 = 300;
    for algorithm in [Algorithm::Gcra, Algorithm::SlidingLog] {
        // A day-long period: nothing replenishes during the test, so the bound is exact.
        let quota = Quota::new(LIMIT, Duration::from_secs(86_400))
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let mut instances = Vec::new();
        for i in 0..K {
            let redis = RedisStore::builder(server.url())
                .timeout(Duration::from_secs(2))
                .connect()
                .await
                .unwrap();
            instances.push(Arc::new(
                HybridStore::builder(redis)
                    .instances(K)
                    .instance(i)
                    .sync_every(Duration::from_millis(20))
                    .build(),
            ));
        }
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for instance in &instances {
            // Each instance gets 5 × LIMIT / K requests over ~0.6 s: 5× the limit in total.
            for _ in 0..5 {
                let (instance, admitted) = (instance.clone(), admitted.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..LIMIT / K {
                        if instance
                            .check(Ask::new("shared", &quota))
                            .await
                            .unwrap()
                            .allowed
                        {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::time::sleep(Duration::from_micros(6_000)).await;
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        for instance in &instances {
            instance.sync_now().await;
        }
        let admitted = admitted.load(Ordering::Relaxed);
        // Numbered instances: at most twice the limit (store/hybrid.rs).
        let bound = 2 * LIMIT;
        println!(
            "{algorithm}: {admitted} admitted for a limit of {LIMIT} (over-admission {}, bound {})",
            admitted.saturating_sub(LIMIT),
            bound - LIMIT
        );
        assert!(admitted >= LIMIT, "{algorithm}: under-admitted: {admitted}");
        assert!(admitted <= bound, "{algorithm}: {admitted} > bound {bound}");
        // Redis holds the whole limit as used.
        let left = instances[0]
            .inner()
            .peek(Ask::new("shared", &quota))
            .await
            .unwrap();
        assert_eq!(left.remaining, 0, "{algorithm}");
    }
}
