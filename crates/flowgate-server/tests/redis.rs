//! `flowgate serve --redis`: servers counting in real `redis-server` processes (and a real
//! 3-master Redis Cluster) started by the tests on free ports. Several servers sharing one Redis
//! enforce one limit; while Redis is away each rule's `fail` mode decides, marked in the answer
//! and the metrics; the service recovers when Redis returns.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowgate::FailMode;
use flowgate::store::RedisStore;
use flowgate_server::backend::{Backend, SharedOptions};
use flowgate_server::server::ServerConfig;
use flowgate_testing::binary::Serving;
use flowgate_testing::grpc::{OK, OVER_LIMIT, descriptor, request, should};
use flowgate_testing::http::{http_get, http_post};
use flowgate_testing::net::ClosedPort;
use flowgate_testing::redis::{RedisCluster, RedisServer};
use flowgate_testing::server::TestServer;
use flowgate_testing::window::{MINUTE, fresh, in_one_window};

const SHARED: &str = r#"
domain: shared
descriptors:
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: gcra}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_log}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;

const OUTAGE: &str = r#"
domain: outage
descriptors:
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 5, fail: open}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 5, fail: closed}
  - key: local
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: gcra, fail: local}
"#;

/// A server for `yaml`, counting in `store`.
async fn serve(yaml: &str, store: RedisStore, options: SharedOptions) -> TestServer {
    serve_with_upstream(yaml, store, options, None).await
}

/// [`serve`], with the gateway in front of `upstream` when given.
async fn serve_with_upstream(
    yaml: &str,
    store: RedisStore,
    options: SharedOptions,
    upstream: Option<&str>,
) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.backend = Backend::shared(Arc::new(store), options);
    config.upstream = upstream.map(|url| url.parse().unwrap());
    TestServer::start_with(config, dir, vec![path]).await
}

/// `/v1/check` body for one descriptor `key=value`.
fn check_body(domain: &str, key: &str, value: &str) -> String {
    format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    )
}

/// Sends `calls` requests for `key=value`, alternating between `servers` over gRPC, two at a
/// time (one per server); returns how many were allowed.
async fn admitted(servers: &[&TestServer], key: &str, value: &str, calls: usize) -> usize {
    let mut clients = Vec::new();
    for server in servers {
        clients.push(server.rls().await);
    }
    let mut allowed = 0;
    let mut sent = 0;
    while sent < calls {
        let mut answers = Vec::new();
        for client in &mut clients {
            if sent == calls {
                break;
            }
            sent += 1;
            let mut client = client.clone();
            let req = request("shared", vec![descriptor(&[(key, value)])]);
            answers.push(tokio::spawn(async move { should(&mut client, req).await }));
        }
        for answer in answers {
            let response = answer.await.unwrap();
            match response.overall_code {
                OK => allowed += 1,
                OVER_LIMIT => {}
                other => panic!("unexpected code {other}: {response:?}"),
            }
        }
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_sharing_one_redis_enforce_one_limit() {
    let Some(redis) = RedisServer::start("two_servers_sharing_one_redis_enforce_one_limit") else {
        return;
    };
    let connect = || {
        RedisStore::builder(redis.url())
            .timeout(Duration::from_secs(2))
            .connect()
    };
    let a = serve(SHARED, connect().await.unwrap(), SharedOptions::default()).await;
    let b = serve(SHARED, connect().await.unwrap(), SharedOptions::default()).await;
    for key in ["gcra", "fixed", "log", "sliding"] {
        // `fixed` counts in the minute of Redis's clock: a run its end cut runs again, for a
        // fresh value.
        let allowed = in_one_window(&[MINUTE], async |attempt| {
            admitted(&[&a, &b], key, &fresh("alice", attempt), 40).await
        })
        .await;
        assert_eq!(allowed, 10, "{key}: two servers, one limit of 10");
    }
    // The answers came from Redis, not a fallback.
    let check = b
        .post("/v1/check", &check_body("shared", "gcra", "bob"))
        .await;
    assert_eq!(check.status, 200, "{}", check.body);
    assert_eq!(check.json()["descriptors"][0]["remaining"], 9);
    assert!(check.json()["descriptors"][0]["fallback"].is_null());
    assert_eq!(check.header("flowgate-fallback"), None);
    let ready = a.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json()["store_kind"], "shared");
    assert_eq!(a.metric("flowgate_store_breaker_open").await, 0.0);
    a.stop().await;
    b.stop().await;
}

/// A token budget charged on one instance refuses the user on the other: the debt is in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_on_one_server_refuses_the_next_request_on_the_other() {
    const BUDGET: &str = r#"
domain: llm
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000, charge: true}
"#;
    let Some(redis) = RedisServer::start("a_charge_on_one_server_refuses_on_the_other") else {
        return;
    };
    let connect = || {
        RedisStore::builder(redis.url())
            .timeout(Duration::from_secs(2))
            .connect()
    };
    let a = serve(BUDGET, connect().await.unwrap(), SharedOptions::default()).await;
    let b = serve(BUDGET, connect().await.unwrap(), SharedOptions::default()).await;
    let body = |hits: u64| {
        format!(
            r#"{{"domain":"llm","descriptors":[{{"entries":[{{"key":"user","value":"ann"}}],"hits_addend":{hits}}}]}}"#
        )
    };
    // Before: b checks (0 units) and is allowed.
    let before = b.post("/v1/check", &body(0)).await;
    assert_eq!(before.status, 200, "{}", before.body);
    // 5,000 tokens used, reported to a: taken into debt, answered OK.
    let charged = a.post("/v1/check", &body(5000)).await;
    assert_eq!(charged.status, 200, "{}", charged.body);
    assert_eq!(charged.json()["descriptors"][0]["remaining"], 0);
    // b refuses ann for the debt: 4,000 tokens at 1,000 a minute, 240 s.
    let refused = b.post("/v1/check", &body(0)).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let retry = refused.json()["descriptors"][0]["retry_after_ms"]
        .as_u64()
        .unwrap();
    assert!((239_000..=240_000).contains(&retry), "{retry}");
    assert_eq!(refused.header("flowgate-fallback"), None);
    // Another user is not affected.
    let other = b
        .post(
            "/v1/check",
            r#"{"domain":"llm","descriptors":[{"entries":[{"key":"user","value":"bob"}],"hits_addend":0}]}"#,
        )
        .await;
    assert_eq!(other.status, 200, "{}", other.body);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_follows_each_rules_fail_mode_and_recovers() {
    let Some(mut redis) =
        RedisServer::start("redis_outage_follows_each_rules_fail_mode_and_recovers")
    else {
        return;
    };
    let timeout = Duration::from_millis(50);
    let store = RedisStore::builder(redis.url())
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    let options = SharedOptions {
        fail: FailMode::Closed,
        instances: 2,
    };
    let strict = {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, OUTAGE).unwrap();
        let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
        config.backend = Backend::shared(Arc::new(store.clone()), options);
        config.ready_requires_store = true;
        TestServer::start_with(config, dir, vec![path]).await
    };
    let server = serve(OUTAGE, store, options).await;
    let check = |key: &str| check_body("outage", key, "x");

    let before = server.post("/v1/check", &check("closed")).await;
    assert_eq!(before.status, 200, "{}", before.body);
    assert_eq!(before.header("flowgate-fallback"), None);

    redis.kill();

    // fail: open allows, marked.
    for _ in 0..3 {
        let started = Instant::now();
        let open = server.post("/v1/check", &check("open")).await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "answered in {:?}",
            started.elapsed()
        );
        assert_eq!(open.status, 200, "{}", open.body);
        assert_eq!(open.header("flowgate-fallback"), Some("open"));
        assert_eq!(open.json()["descriptors"][0]["fallback"], "open");
    }
    // fail: closed denies — 503 (the store, not the client, is at fault) — marked, with a
    // Retry-After.
    let closed = server.post("/v1/check", &check("closed")).await;
    assert_eq!(closed.status, 503, "{}", closed.body);
    assert_eq!(closed.header("flowgate-fallback"), Some("closed"));
    assert!(closed.header("retry-after").is_some());
    // fail: local grants this instance's share: 5 / 2 instances = 2.
    let mut local = Vec::new();
    for _ in 0..4 {
        let answer = server.post("/v1/check", &check("local")).await;
        assert_eq!(answer.header("flowgate-fallback"), Some("local"));
        local.push(answer.status);
    }
    assert_eq!(local, [200, 200, 429, 429]);
    // The same over gRPC: the mark is in response_headers_to_add.
    let mut client = server.rls().await;
    let response = should(
        &mut client,
        request("outage", vec![descriptor(&[("open", "grpc")])]),
    )
    .await;
    assert_eq!(response.overall_code, OK);
    assert!(
        response
            .response_headers_to_add
            .iter()
            .any(|h| h.key == "flowgate-fallback" && h.value == "open"),
        "{response:?}"
    );

    // Fleet-safe readiness: the store's outage is reported, not turned into unreadiness (every
    // instance would leave the load balancer at once; the fail modes handle the outage).
    let ready = server.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json()["store"], "unreachable");
    assert_eq!(ready.json()["ready"], true);
    // Strict readiness (`--ready-requires-store`) is the old behaviour, for those who want it.
    let ready = strict.get("/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert_eq!(ready.json()["store_required"], true);
    strict.stop().await;
    assert!(
        server
            .metric("flowgate_fallback_decisions_total{mode=\"open\"}")
            .await
            >= 4.0
    );
    assert!(
        server
            .metric("flowgate_fallback_decisions_total{mode=\"closed\"}")
            .await
            >= 1.0
    );
    assert!(
        server
            .metric("flowgate_fallback_decisions_total{mode=\"local\"}")
            .await
            >= 4.0
    );
    assert!(server.metric("flowgate_store_breaker_opened_total").await >= 1.0);

    // Redis returns (empty: it keeps nothing on disk); the service follows within seconds.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = server.post("/v1/check", &check("closed")).await;
        if answer.status == 200 && answer.header("flowgate-fallback").is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery: {}", answer.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready = server.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(server.metric("flowgate_store_breaker_open").await, 0.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_a_redis_cluster_enforce_one_limit() {
    let Some(cluster) =
        RedisCluster::start("two_servers_on_a_redis_cluster_enforce_one_limit", 3, 0)
    else {
        return;
    };
    let connect = || {
        RedisStore::cluster_builder(cluster.urls())
            .timeout(Duration::from_secs(2))
            .connect()
    };
    let a = serve(SHARED, connect().await.unwrap(), SharedOptions::default()).await;
    let b = serve(SHARED, connect().await.unwrap(), SharedOptions::default()).await;
    // Distinct values spread the counters over the three masters.
    for (key, value) in [
        ("gcra", "a"),
        ("fixed", "b"),
        ("log", "c"),
        ("sliding", "d"),
    ] {
        for user in 0..3 {
            let value = format!("{value}{user}");
            // `fixed` counts in the minute of Redis's clock: a run its end cut runs again, for
            // a fresh value.
            let allowed = in_one_window(&[MINUTE], async |attempt| {
                admitted(&[&a, &b], key, &fresh(&value, attempt), 25).await
            })
            .await;
            assert_eq!(allowed, 10, "{key}={value}: two servers, one limit of 10");
        }
    }
    a.stop().await;
    b.stop().await;
}

const GATEWAY: &str = r#"
domain: edge
gateway:
  descriptors:
    - [{key: header, header: x-tier, as: tier}]
descriptors:
  - key: tier
    value: local
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: gcra, fail: local}
  - key: tier
    value: closed
    rate_limit: {unit: minute, requests_per_unit: 4, fail: closed}
"#;

/// `GET /` through the gateway at `addr` with header `x-tier: tier`: status and the fallback
/// mark.
async fn through_gateway(addr: std::net::SocketAddr, tier: &str) -> (u16, Option<String>) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<hyper::body::Bytes>>();
    let request = hyper::Request::get(format!("http://{addr}/"))
        .header("x-tier", tier)
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .unwrap()
        .unwrap();
    let mark = response
        .headers()
        .get("flowgate-fallback")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status().as_u16(), mark)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_on_redis_follows_each_rules_fail_mode_while_redis_is_away() {
    let Some(mut redis) = RedisServer::start("the_gateway_on_redis_follows_each_rules_fail_mode")
    else {
        return;
    };
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_url = format!("http://{}", upstream.local_addr().unwrap());
    tokio::spawn(async move {
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        axum::serve(upstream, app).await
    });
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let options = SharedOptions {
        fail: FailMode::Open,
        instances: 2,
    };
    let server = serve_with_upstream(GATEWAY, store, options, Some(&upstream_url)).await;
    let gateway = server.gateway.unwrap();

    // Redis decides: four per minute.
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let (status, mark) = through_gateway(gateway, "closed").await;
        assert_eq!(mark, None);
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429]);

    redis.kill();
    // fail: local — this instance's share of 4 over 2 instances: two forwarded, then 429.
    let mut local = Vec::new();
    for _ in 0..3 {
        let (status, mark) = through_gateway(gateway, "local").await;
        assert_eq!(mark.as_deref(), Some("local"));
        local.push(status);
    }
    assert_eq!(local, [200, 200, 429]);
    // fail: closed — refused (503: the store is away) without reaching the upstream.
    let (status, mark) = through_gateway(gateway, "closed").await;
    assert_eq!((status, mark.as_deref()), (503, Some("closed")));
    server.stop().await;
}

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

#[test]
fn the_binary_counts_in_redis_with_the_redis_flag_and_refuses_to_start_without_it() {
    let Some(redis) = RedisServer::start("the_binary_counts_in_redis_with_the_redis_flag") else {
        return;
    };
    // Nothing listens there: a clear error and exit code 1.
    let closed = ClosedPort::new();
    let nowhere = format!("redis://{}", closed.addr());
    let out = std::process::Command::new(FLOWGATE)
        .args(["serve", "--redis", &nowhere, "--redis-timeout", "200ms"])
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot connect to Redis at"), "{stderr}");

    let serving = Serving::start(
        std::process::Command::new(FLOWGATE)
            .args(["serve", "--redis", &redis.url()])
            // Not the 50 ms default: on a loaded test machine the check must reach Redis.
            .args(["--redis-timeout", "5s"])
            .args(["--fail", "local", "--instances", "3"])
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .stdout(std::process::Stdio::null()),
    );
    let http = serving.http;
    let ready = http_get(http, "/readyz").expect("an answer");
    // One check of the built-in policy writes its counter into this Redis.
    let body = r#"{"domain":"default","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let checked = http_post(http, "/v1/check", body);
    let keys = redis.cli(&["KEYS", "flowgate:*"]);
    drop(serving);
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(ready.contains(r#""store_kind":"shared""#), "{ready}");
    assert!(checked.starts_with("HTTP/1.1 200"), "{checked}");
    assert!(keys.contains("user=u"), "keys in Redis: {keys}");
}
