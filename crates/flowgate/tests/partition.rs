//! A network partition between the store and Redis, made with a real network: Redis runs in
//! a network namespace this test creates, reached over a veth pair; the partition takes the
//! namespace's end of the link down (packets are dropped, as when a cable or a switch fails —
//! no reset, no error: a black hole), and healing brings it back up.
//!
//! Needs root and iproute2 (`ip netns`); without them the test is skipped with a loud message,
//! unless `FLOWGATE_REQUIRE_NETNS=1` makes that a failure.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowgate::store::{Ask, FallbackStore, RedisStore, Store};
use flowgate::{FailMode, Quota};

const TIMEOUT: Duration = Duration::from_millis(50);

use flowgate_testing::fault_slack as slack;

/// A network namespace holding a `redis-server`, linked to this namespace by a veth pair.
struct Netns {
    name: String,
    /// The namespace's end of the link.
    inner: String,
    /// Redis's address.
    addr: String,
    redis: Option<Child>,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Netns {
    /// Creates the namespace and link and starts Redis in it; `None` (after a loud message)
    /// where namespaces cannot be made.
    fn start(what: &str) -> Option<Netns> {
        let id = std::process::id() % 100_000;
        let name = format!("flowgate-part-{id}");
        let (outer, inner) = (format!("fgo{id}"), format!("fgi{id}"));
        // A /30 of 10.201.0.0/16 from the process id, so parallel runs do not collide.
        let net = (id % 16_000) * 4;
        let (a, b) = (net / 256, net % 256);
        let (outer_ip, inner_ip) = (
            format!("10.201.{a}.{}", b + 1),
            format!("10.201.{a}.{}", b + 2),
        );
        let made = ip(&["netns", "add", &name])
            && ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])
            && ip(&["link", "set", &inner, "netns", &name])
            && ip(&["addr", "add", &format!("{outer_ip}/30"), "dev", &outer])
            && ip(&["link", "set", &outer, "up"])
            && ip(&[
                "netns",
                "exec",
                &name,
                "ip",
                "addr",
                "add",
                &format!("{inner_ip}/30"),
                "dev",
                &inner,
            ])
            && ip(&["netns", "exec", &name, "ip", "link", "set", &inner, "up"])
            && ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"]);
        if !made {
            ip(&["netns", "del", &name]);
            ip(&["link", "del", &outer]);
            if std::env::var("FLOWGATE_REQUIRE_NETNS").as_deref() == Ok("1") {
                panic!("{what}: cannot create a network namespace but FLOWGATE_REQUIRE_NETNS=1");
            }
            eprintln!(
                "\n!!!!!!!! SKIPPED {what}: cannot create a network namespace (needs root and iproute2; set FLOWGATE_REQUIRE_NETNS=1 to make this an error) !!!!!!!!\n"
            );
            return None;
        }
        let port = "6390";
        let redis = Command::new("ip")
            .args([
                "netns",
                "exec",
                &name,
                "redis-server",
                "--bind",
                &inner_ip,
                "--port",
                port,
            ])
            .args([
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                "/tmp",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut netns = Netns {
            name,
            inner,
            addr: format!("{inner_ip}:{port}"),
            redis: None,
        };
        netns.redis = Some(redis.expect("redis-server in the namespace"));
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect_timeout(
            &netns.addr.parse().unwrap(),
            Duration::from_millis(100),
        )
        .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "redis-server in the namespace never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(netns)
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Takes the namespace's end of the link down (true) or up (false).
    fn partition(&self, cut: bool) {
        let state = if cut { "down" } else { "up" };
        assert!(ip(&[
            "netns",
            "exec",
            &self.name,
            "ip",
            "link",
            "set",
            &self.inner,
            state
        ]));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut redis) = self.redis.take() {
            let _ = redis.kill();
            let _ = redis.wait();
        }
        // Deleting the namespace deletes the veth pair with it.
        ip(&["netns", "del", &self.name]);
    }
}

#[derive(Debug, Clone, Copy)]
struct Call {
    at: Duration,
    took: Duration,
    fallback: Option<FailMode>,
    allowed: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_from_redis_falls_back_locally_within_the_bound_and_heals() {
    let what = "a_partition_from_redis";
    let have_redis = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_redis {
        // Says so loudly (or fails, with FLOWGATE_REQUIRE_REDIS=1).
        assert!(flowgate_testing::redis::RedisServer::start(what).is_none());
        return;
    }
    let Some(redis) = Netns::start(what) else {
        return;
    };
    let store = RedisStore::builder(redis.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let store = Arc::new(
        FallbackStore::builder(store)
            .fail(FailMode::Local)
            .failure_threshold(3)
            .open_for(Duration::from_millis(100))
            .build(),
    );
    // One key, 100 per hour (nothing refills within the test): Redis's count and, during the
    // partition, this instance's local share (all of it: one instance) — at most 200 admitted.
    let quota = Quota::per_hour(100);
    let start = Instant::now();
    let run_for = Duration::from_millis(3500);
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut calls = Vec::new();
                while start.elapsed() < run_for {
                    let at = start.elapsed();
                    let d = store
                        .check(Ask::new("partitioned", &quota))
                        .await
                        .expect("fallback turns transient errors into decisions");
                    calls.push(Call {
                        at,
                        took: start.elapsed() - at,
                        fallback: d.fallback,
                        allowed: d.allowed,
                    });
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                calls
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cut = start.elapsed();
    redis.partition(true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.partition(false);
    let healed = start.elapsed();
    let mut calls = Vec::new();
    for caller in callers {
        calls.extend(caller.await.unwrap());
    }
    calls.sort_by_key(|c| c.at);

    let slowest = calls.iter().map(|c| c.took).max().unwrap();
    let admitted = calls.iter().filter(|c| c.allowed).count();
    let local = calls.iter().filter(|c| c.fallback.is_some()).count();
    let recovered = calls
        .iter()
        .find(|c| c.at > healed && c.fallback.is_none())
        .map(|c| c.at - healed);
    println!(
        "{} calls, slowest {slowest:?}, admitted {admitted} (bound 200), {local} decided locally, recovered {recovered:?} after healing",
        calls.len()
    );
    for c in &calls {
        assert!(
            c.took <= TIMEOUT + slack(),
            "a call took {:?}: {c:?}",
            c.took
        );
        if let Some(mode) = c.fallback {
            assert_eq!(mode, FailMode::Local, "{c:?}");
        }
    }
    assert!(
        calls
            .iter()
            .filter(|c| c.at + c.took < cut)
            .all(|c| c.fallback.is_none())
    );
    let during = calls
        .iter()
        .filter(|c| c.at > cut + Duration::from_millis(200) && c.at + c.took < healed);
    assert!(during.clone().count() > 50);
    assert!(during.clone().all(|c| c.fallback == Some(FailMode::Local)));
    // Exact while Redis answers, this instance's share while it does not: never more.
    assert!(
        admitted <= 200,
        "{admitted} admitted against a bound of 200"
    );
    assert!(
        admitted >= 150,
        "both the shared and the local quota were used: {admitted}"
    );
    let stats = store.stats();
    assert!(
        stats.breaker_opened >= 1 && stats.short_circuited > 0,
        "{stats:?}"
    );
    let recovered = recovered.expect("decisions came from Redis again after healing");
    assert!(
        recovered < Duration::from_secs(1),
        "recovered {recovered:?} after healing"
    );
}
