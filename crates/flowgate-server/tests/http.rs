//! The HTTP API over real HTTP/1.1 on loopback: `/json`, `/v1/check`, problem details,
//! health, readiness, configuration and metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use flowgate_testing::http::{http_post, parse};
use flowgate_testing::server::TestServer;

const API: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: gcra, burst: 2, name: per_user}
  - key: ip
    detailed_metric: true
    rate_limit: {period: 90s, requests_per_unit: 5, algorithm: sliding_log}
  # GCRA, not a fixed window: a window aligned to the wall clock's minute starts again when a
  # run crosses the minute's end between two checks of `beta`, which the second must find over.
  - key: beta
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: gcra}
"#;

async fn api() -> TestServer {
    TestServer::start(&[("api.yaml", API)]).await
}

fn check_body(key: &str, value: &str) -> String {
    format!(
        r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_endpoint_speaks_rls_proto_json_with_200_and_429() {
    let server = api().await;
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let first = server.post("/json", body).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let json = first.json();
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0]["code"], "OK");
    assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
    assert_eq!(json["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(json["statuses"][0]["currentLimit"]["name"], "per_user");
    assert_eq!(json["statuses"][0]["limitRemaining"], 1);
    assert!(
        json["statuses"][0]["durationUntilReset"]
            .as_str()
            .unwrap()
            .ends_with('s')
    );
    assert_eq!(json["responseHeadersToAdd"][0]["key"], "ratelimit-policy");
    // snake_case field names are accepted too.
    let snake = r#"{"domain":"api","hits_addend":1,"descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    assert_eq!(server.post("/json", snake).await.status, 200);
    let denied = server.post("/json", body).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.json()["overallCode"], "OVER_LIMIT");
    assert_eq!(denied.json()["statuses"][0]["code"], "OVER_LIMIT");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_endpoint_reports_every_limit_with_ietf_headers() {
    let server = api().await;
    let body = r#"{"domain":"api","descriptors":[
        {"entries":[{"key":"user","value":"a"}]},
        {"entries":[{"key":"ip","value":"1.2.3.4"}], "hits_addend": 2},
        {"entries":[{"key":"other","value":"x"}]}]}"#;
    let r = server.post("/v1/check", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let json = r.json();
    assert_eq!(json["allowed"], true);
    assert_eq!(json["config_version"], 1);
    let user = &json["descriptors"][0];
    assert_eq!(user["status"], "ok");
    assert_eq!(user["limit"], 2);
    assert_eq!(user["remaining"], 1);
    assert_eq!(user["algorithm"], "gcra");
    assert_eq!(user["name"], "per_user");
    assert_eq!(user["shadow"], false);
    assert_eq!(user["retry_after_ms"], 0);
    let ip = &json["descriptors"][1];
    assert_eq!(
        (ip["limit"].as_u64(), ip["remaining"].as_u64()),
        (Some(5), Some(3))
    );
    assert_eq!(ip["period_ms"], 90_000);
    assert_eq!(ip["algorithm"], "sliding_log");
    assert_eq!(json["descriptors"][2]["status"], "unmatched");
    assert_eq!(
        r.header("ratelimit-policy").unwrap(),
        "\"per_user\";q=2;w=60, \"ip\";q=5;w=90"
    );
    assert!(
        r.header("ratelimit")
            .unwrap()
            .starts_with("\"per_user\";r=1;t=")
    );
    assert!(r.header("retry-after").is_none());

    server.post("/v1/check", &check_body("user", "a")).await;
    let denied = server.post("/v1/check", &check_body("user", "a")).await;
    assert_eq!(denied.status, 429);
    let d = &denied.json()["descriptors"][0];
    assert_eq!(
        (d["status"].as_str(), d["allowed"].as_bool()),
        (Some("over_limit"), Some(false))
    );
    let retry_ms = d["retry_after_ms"].as_u64().unwrap();
    assert!(retry_ms > 0 && retry_ms <= 30_000, "{retry_ms}");
    let retry_after: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(
        retry_after,
        retry_ms.div_ceil(1000),
        "whole seconds rounded up"
    );
    assert_eq!(denied.header("cache-control"), Some("no-store"));
    assert!(denied.header("ratelimit").unwrap().contains(";r=0;"));
    // Shadow mode: reported over the limit, allowed.
    server.post("/v1/check", &check_body("beta", "b")).await;
    let shadow = server.post("/v1/check", &check_body("beta", "b")).await;
    assert_eq!(shadow.status, 200);
    let s = &shadow.json()["descriptors"][0];
    assert_eq!(
        (
            s["status"].as_str(),
            s["allowed"].as_bool(),
            s["shadow"].as_bool()
        ),
        (Some("over_limit"), Some(true), Some(true))
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_problem_details_never_a_crash() {
    let server = api().await;
    let bad = [
        ("/v1/check", ""),
        ("/v1/check", "{"),
        ("/v1/check", "[]"),
        ("/v1/check", r#"{"domain":"api"}"#),
        (
            "/v1/check",
            r#"{"domain":"","descriptors":[{"entries":[]}]}"#,
        ),
        ("/v1/check", r#"{"domain":"api","descriptors":[]}"#),
        (
            "/v1/check",
            r#"{"domain":"api","descriptors":[{"entries":[{"key":1}]}]}"#,
        ),
        (
            "/v1/check",
            r#"{"domain":"api","descriptors":[{"entries":[]}],"extra":1}"#,
        ),
        (
            "/v1/check",
            r#"{"domain":"api","descriptors":[{"entries":[],"limit":{"requests_per_unit":1,"unit":"fortnight"}}]}"#,
        ),
        (
            "/v1/check",
            r#"{"domain":"api","descriptors":[{"entries":[]}],"hits_addend":-1}"#,
        ),
        ("/json", "not json"),
        (
            "/json",
            r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"u"}],"limit":{"requests_per_unit":1}}]}"#,
        ),
        (
            "/json",
            r#"{"domain":"api","descriptors":[{"entries":[],"isNegativeHits":true}]}"#,
        ),
        (
            "/json",
            r#"{"domain":"api","hits_addend":99999999999,"descriptors":[{"entries":[]}]}"#,
        ),
        ("/json", r#"{"descriptors":[{"entries":[]}]}"#),
        ("/json", "\u{0}\u{1}\u{2}"),
    ];
    for (path, body) in bad {
        let r = server.post(path, body).await;
        assert_eq!(r.status, 400, "{path} {body:?} → {} {}", r.status, r.body);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        let problem = r.json();
        assert_eq!(problem["status"], 400);
        assert!(problem["type"].as_str().unwrap().starts_with("https://"));
        assert!(!problem["detail"].as_str().unwrap().is_empty());
    }
    // The server is still fine.
    assert_eq!(
        server
            .post("/v1/check", &check_body("user", "z"))
            .await
            .status,
        200
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_config() {
    let server = api().await;
    let health = server.get("/healthz").await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let ready = server.get("/readyz").await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["store"], "ok");
    let config = server.get("/v1/config").await.json();
    assert_eq!(config["version"], 1);
    assert_eq!(config["domains"][0], "api");
    let rules = config["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 3);
    assert_eq!(rules[0]["rule"], "user");
    assert_eq!(rules[0]["burst"], 2);
    assert_eq!(rules[1]["period_ms"], 90_000);
    assert_eq!(rules[2]["shadow_mode"], true);
    assert!(config["files"][0].as_str().unwrap().ends_with("api.yaml"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_hits_per_rule_with_bounded_labels() {
    let server = api().await;
    for _ in 0..3 {
        server.post("/v1/check", &check_body("user", "m")).await;
    }
    for value in ["1.1.1.1", "2.2.2.2"] {
        server.post("/v1/check", &check_body("ip", value)).await;
    }
    for _ in 0..2 {
        server.post("/v1/check", &check_body("beta", "b")).await;
    }
    let user = |m: &str| format!("flowgate_{m}_total{{domain=\"api\",rule=\"user\"}}");
    assert_eq!(server.metric(&user("hits")).await, 3.0);
    assert_eq!(server.metric(&user("within_limit")).await, 2.0);
    assert_eq!(server.metric(&user("over_limit")).await, 1.0);
    // The second call used 2 of 2: near the limit.
    assert_eq!(server.metric(&user("near_limit")).await, 1.0);
    let beta = |m: &str| format!("flowgate_{m}_total{{domain=\"api\",rule=\"beta\"}}");
    assert_eq!(server.metric(&beta("shadow_mode")).await, 1.0);
    assert_eq!(server.metric(&beta("over_limit")).await, 1.0);
    // detailed_metric: one series per value.
    assert_eq!(
        server
            .metric("flowgate_hits_total{domain=\"api\",rule=\"ip_1.1.1.1\"}")
            .await,
        1.0
    );
    let text = server.get("/metrics").await.body;
    assert!(
        !text.contains("rule=\"user_m\""),
        "values never label non-detailed rules"
    );
    assert!(
        text.contains("flowgate_decision_duration_seconds_count{api=\"check\"} 7"),
        "{text}"
    );
    assert!(text.contains("flowgate_config_version 1"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_a_413_problem_and_counted() {
    let server = api().await;
    // The default limit: 64 KiB.
    let padding = " ".repeat(70 * 1024);
    for path in ["/v1/check", "/json"] {
        let big = format!("{}{padding}", check_body("user", "big"));
        // Answered before the body is read: over a raw connection that carries on when
        // writing the rest of the body fails (a client library may report the reset instead).
        let answer = parse(&http_post(server.http, path, &big));
        assert_eq!(answer.status, 413, "{path}: {}", answer.body);
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(answer.json()["status"], 413);
        assert!(
            answer.json()["detail"]
                .as_str()
                .unwrap()
                .contains("65536 bytes")
        );
    }
    assert_eq!(
        server.metric("flowgate_http_oversized_bodies_total").await,
        2.0
    );
    // Under it, the same padding is whitespace JSON accepts.
    let fits = format!("{}{}", check_body("user", "fits"), " ".repeat(60 * 1024));
    assert_eq!(server.post("/v1/check", &fits).await.status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_stores_keys_and_active_evictions_are_exported() {
    use flowgate::clock::PreciseClock;
    use flowgate::store::MemoryStore;
    use flowgate_server::backend::Backend;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.yaml");
    std::fs::write(&path, API).unwrap();
    let mut config = flowgate_server::server::ServerConfig::load(vec![path.clone()]).unwrap();
    let store = MemoryStore::builder()
        .clock(PreciseClock::new())
        .max_keys(64)
        .build();
    config.backend = Backend::memory(Arc::new(store));
    let server = TestServer::start_with(config, dir, vec![path]).await;
    assert_eq!(server.metric("flowgate_memory_store_keys").await, 0.0);
    assert_eq!(
        server
            .metric("flowgate_memory_store_evicted_active_total")
            .await,
        0.0
    );
    // Far more active users (each within its minute) than the store may hold.
    for i in 0..1000 {
        let answer = server
            .post("/v1/check", &check_body("user", &format!("u{i}")))
            .await;
        assert_eq!(answer.status, 200);
    }
    let keys = server.metric("flowgate_memory_store_keys").await;
    assert!(keys > 0.0 && keys < 1000.0, "{keys}");
    assert!(server.metric("flowgate_memory_store_bytes").await > 0.0);
    assert!(
        server
            .metric("flowgate_memory_store_evicted_active_total")
            .await
            > 0.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_metric_series_are_bounded() {
    let server = api().await;
    let max = flowgate_server::metrics::MAX_DETAILED_SERIES;
    for i in 0..max + 5 {
        let answer = server
            .post(
                "/v1/check",
                &check_body("ip", &format!("10.0.{}.{}", i / 256, i % 256)),
            )
            .await;
        assert_eq!(answer.status, 200);
    }
    let text = server.get("/metrics").await.body;
    let series = text
        .lines()
        .filter(|l| l.starts_with("flowgate_hits_total{domain=\"api\",rule=\"ip_"))
        .count();
    assert_eq!(series, max, "one series per value up to the bound");
    assert_eq!(
        server
            .metric("flowgate_detailed_metric_overflow_total")
            .await,
        5.0
    );
    // The overflow is counted in the rule's own series.
    assert_eq!(
        server
            .metric("flowgate_hits_total{domain=\"api\",rule=\"ip\"}")
            .await,
        5.0
    );
    server.stop().await;
}
