//! Redis failing under load: a SIGKILLed server, a slow network, a black hole. The store must
//! never panic, answer every call within its timeout, apply the fail mode, open its breaker so
//! a dead Redis costs nothing, and recover by itself.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowgate::store::{Ask, FallbackStore, RedisStore, Store};
use flowgate::{FailMode, Quota};
use flowgate_testing::proxy::{Fault, Proxy};
use flowgate_testing::redis::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(50);

use flowgate_testing::fault_slack as slack;

/// The tests here measure time; run them one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn fallback_store(url: String, mode: FailMode) -> Arc<FallbackStore<RedisStore>> {
    let redis = RedisStore::builder(url)
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    Arc::new(
        FallbackStore::builder(redis)
            .fail(mode)
            .failure_threshold(3)
            .open_for(Duration::from_millis(100))
            .build(),
    )
}

/// One call's record: when it started (since the test's start), how long it took, and whether
/// it fell back.
#[derive(Debug, Clone, Copy)]
struct Call {
    at: Duration,
    took: Duration,
    fallback: Option<FailMode>,
    allowed: bool,
}

/// Runs 8 callers against `store` until `until` (since `start`); every call must succeed
/// (fallbacks included): a transient error must never reach the caller.
fn load(
    store: &Arc<FallbackStore<RedisStore>>,
    start: Instant,
    until: Duration,
) -> Vec<tokio::task::JoinHandle<Vec<Call>>> {
    let quota = Quota::per_second(1_000_000_000);
    (0..8)
        .map(|caller| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut calls = Vec::new();
                let mut n = 0u64;
                while start.elapsed() < until {
                    n += 1;
                    let at = start.elapsed();
                    let key = format!("load:{caller}:{}", n % 50);
                    let d = store
                        .check(Ask::new(&key, &quota))
                        .await
                        .expect("fallback turns transient errors into decisions");
                    calls.push(Call {
                        at,
                        took: start.elapsed() - at,
                        fallback: d.fallback,
                        allowed: d.allowed,
                    });
                    // Don't spin while the breaker answers instantly.
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                calls
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_load_falls_back_within_the_timeout_and_recovers() {
    let _serial = SERIAL.lock().await;
    let Some(mut server) = RedisServer::start("sigkill_mid_load") else {
        return;
    };
    let store = fallback_store(server.url(), FailMode::Closed).await;
    let start = Instant::now();
    let tasks = load(&store, start, Duration::from_millis(2500));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killing = start.elapsed();
    server.kill();
    let killed = start.elapsed();
    tokio::time::sleep(Duration::from_millis(800)).await;
    server.restart();
    let back = start.elapsed();
    let mut calls = Vec::new();
    for t in tasks {
        calls.extend(t.await.unwrap());
    }
    calls.sort_by_key(|c| c.at);

    let slowest = calls.iter().map(|c| c.took).max().unwrap();
    println!("{} calls, slowest {slowest:?}", calls.len());
    for c in &calls {
        assert!(
            c.took <= TIMEOUT + slack(),
            "a call took {:?}: {c:?}",
            c.took
        );
        // Closed: every fallback denies; every real answer allows (the quota is huge).
        match c.fallback {
            Some(mode) => assert!(mode == FailMode::Closed && !c.allowed, "{c:?}"),
            None => assert!(c.allowed, "{c:?}"),
        }
    }
    let before = calls.iter().filter(|c| c.at + c.took < killing);
    assert!(before.clone().count() > 100);
    assert!(before.clone().all(|c| c.fallback.is_none()));
    let down = calls
        .iter()
        .filter(|c| c.at > killed + Duration::from_millis(50) && c.at < back);
    assert!(down.clone().all(|c| c.fallback.is_some()));
    let stats = store.stats();
    assert!(
        stats.breaker_opened >= 1 && stats.short_circuited > 0,
        "{stats:?}"
    );
    // Recovered within a second of Redis returning, and stayed recovered.
    let recovered = calls
        .iter()
        .find(|c| c.at > back && c.fallback.is_none())
        .expect("recovered");
    assert!(
        recovered.at - back < Duration::from_secs(1),
        "{recovered:?}"
    );
    let late = calls
        .iter()
        .filter(|c| c.at > back + Duration::from_secs(1));
    assert!(late.clone().count() > 10);
    assert!(late.clone().all(|c| c.fallback.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_black_holed_network_opens_the_breaker_and_recovery_closes_it() {
    let _serial = SERIAL.lock().await;
    let Some(server) = RedisServer::start("breaker_via_proxy") else {
        return;
    };
    let proxy = Proxy::start(server.port).await;
    let store = fallback_store(proxy.url(), FailMode::Open).await;
    let quota = Quota::per_second(1000);

    for (phase, fault) in [
        ("latency", Fault::Latency(Duration::from_millis(80))),
        ("black hole", Fault::BlackHole),
    ] {
        let d = store.check(Ask::new("k", &quota)).await.unwrap();
        assert_eq!(d.fallback, None, "{phase}: healthy before the fault");
        let opened_before = store.stats().breaker_opened;

        proxy.set(fault);
        // The first calls wait out the timeout, then the breaker opens.
        for _ in 0..3 {
            let t = Instant::now();
            let d = store.check(Ask::new("k", &quota)).await.unwrap();
            assert_eq!(d.fallback, Some(FailMode::Open), "{phase}");
            assert!(
                t.elapsed() >= TIMEOUT && t.elapsed() <= TIMEOUT + slack(),
                "{phase}: {:?}",
                t.elapsed()
            );
        }
        assert!(store.stats().breaker_open, "{phase}");
        assert_eq!(store.stats().breaker_opened, opened_before + 1);
        // Open: answers at once, without waiting on Redis — except one probe per open_for.
        let mut waited = 0;
        for _ in 0..1000 {
            let t = Instant::now();
            let d = store.check(Ask::new("k", &quota)).await.unwrap();
            assert_eq!(d.fallback, Some(FailMode::Open));
            if t.elapsed() > Duration::from_millis(2) {
                waited += 1;
            }
        }
        assert!(
            waited <= 1,
            "{phase}: {waited} calls waited with the breaker open"
        );

        proxy.set(Fault::None);
        let healed = Instant::now();
        loop {
            let d = store.check(Ask::new("k", &quota)).await.unwrap();
            if d.fallback.is_none() {
                break;
            }
            assert!(
                healed.elapsed() < Duration::from_secs(1),
                "{phase}: no recovery"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!store.stats().breaker_open, "{phase}");
        println!(
            "{phase}: recovered {:?} after the network healed",
            healed.elapsed()
        );
    }
}
