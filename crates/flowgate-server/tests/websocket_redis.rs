//! The WebSocket gateway across instances: two `flowgate serve` instances counting in one real
//! `redis-server` (and in a real 3-master Redis Cluster), started by the test on free ports,
//! enforce one per-user and one per-room limit exactly, whichever instance each message goes
//! through.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use flowgate::store::RedisStore;
use flowgate_server::backend::{Backend, SharedOptions};
use flowgate_server::server::ServerConfig;
use flowgate_testing::redis::{RedisCluster, RedisServer};
use flowgate_testing::server::TestServer;
use flowgate_testing::ws::{EchoUpstream, Got, is_error_frame, next, open, send};

/// Per user 10 messages an hour; per room 25 an hour (no refill during the test); users from `x-user`, rooms from the
/// `room` query parameter.
fn yaml(upstream: &str) -> String {
    format!(
        "domain: chat\nwebsocket:\n  upstream: {upstream}\n  user: {{source: header, name: x-user}}\n  room: {{source: query, name: room}}\n  limits:\n    user_messages: {{limit: 10, per: 1h}}\n    room_messages: {{limit: 25, per: 1h}}\n"
    )
}

async fn instance(upstream: &EchoUpstream, store: RedisStore) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.yaml");
    std::fs::write(&path, yaml(&upstream.url())).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.backend = Backend::shared(Arc::new(store), SharedOptions::default());
    TestServer::start_with(config, dir, vec![path]).await
}

/// Sends `per_socket` messages on each of `sockets` in turn; returns (forwarded, rejected by
/// `scope`).
async fn exchange(
    sockets: &mut [flowgate_testing::ws::Ws],
    per_socket: usize,
    scope: &str,
) -> (usize, usize) {
    let (mut forwarded, mut rejected) = (0, 0);
    for round in 0..per_socket {
        for ws in sockets.iter_mut() {
            send(ws, &format!("m{round}")).await;
            match next(ws).await {
                Got::Text(t) if t.starts_with('m') => forwarded += 1,
                got if is_error_frame(&got, scope) => rejected += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    (forwarded, rejected)
}

/// One user on both instances, then a room filled from both instances.
async fn one_limit_across_two_instances(a: &TestServer, b: &TestServer) {
    let (wa, wb) = (a.websocket.unwrap(), b.websocket.unwrap());
    // One user, two connections on each instance: 10 in all.
    let mut ann = vec![
        open(wa, "/?room=ann-room", &[("x-user", "ann")]).await,
        open(wb, "/?room=ann-room", &[("x-user", "ann")]).await,
        open(wa, "/?room=ann-room", &[("x-user", "ann")]).await,
        open(wb, "/?room=ann-room", &[("x-user", "ann")]).await,
    ];
    assert_eq!(exchange(&mut ann, 5, "user").await, (10, 10));
    // One room, ten users (each within their own 10), half on each instance: 25 in all.
    let mut members = Vec::new();
    for i in 0..10 {
        let addr = if i % 2 == 0 { wa } else { wb };
        let user = format!("member{i}");
        members.push(open(addr, "/?room=hall", &[("x-user", user.as_str())]).await);
    }
    assert_eq!(exchange(&mut members, 4, "room").await, (25, 15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_one_redis_enforce_one_user_and_one_room_limit() {
    let Some(redis) =
        RedisServer::start("two_gateways_sharing_one_redis_enforce_one_user_and_one_room_limit")
    else {
        return;
    };
    let upstream = EchoUpstream::start().await;
    let connect = || {
        RedisStore::builder(redis.url())
            .timeout(Duration::from_secs(2))
            .connect()
    };
    let a = instance(&upstream, connect().await.unwrap()).await;
    let b = instance(&upstream, connect().await.unwrap()).await;
    one_limit_across_two_instances(&a, &b).await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_a_redis_cluster_enforce_one_user_and_one_room_limit() {
    let Some(cluster) = RedisCluster::start(
        "two_gateways_on_a_redis_cluster_enforce_one_user_and_one_room_limit",
        3,
        0,
    ) else {
        return;
    };
    let upstream = EchoUpstream::start().await;
    let connect = || {
        RedisStore::cluster_builder(cluster.urls())
            .timeout(Duration::from_secs(2))
            .connect()
    };
    let a = instance(&upstream, connect().await.unwrap()).await;
    let b = instance(&upstream, connect().await.unwrap()).await;
    one_limit_across_two_instances(&a, &b).await;
    a.stop().await;
    b.stop().await;
}
