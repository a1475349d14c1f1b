//! A descriptor under several limits (`rate_limits`: "2 per minute and 3 per hour for each
//! API key") through every front end of the service: `POST /v1/check` (the binding limit, every
//! limit in `limits`), the `RateLimit-Policy` header (one item per limit), `POST /json` and
//! `ShouldRateLimit` (the binding limit's status), the admin endpoints (every limit's counter,
//! all reset at once) and per-limit metrics. A refusal by one limit takes nothing from the
//! other.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use flowgate_server::api::AdminToken;
use flowgate_server::server::ServerConfig;
use flowgate_testing::grpc::{OK, OVER_LIMIT, descriptor, request, should};
use flowgate_testing::server::TestServer;

const TOKEN: &str = "correct horse battery staple";

const API: &str = r#"
domain: api
descriptors:
  - key: api_key
    rate_limits:
      - {unit: minute, requests_per_unit: 2, name: per_minute, algorithm: gcra}
      - {unit: hour, requests_per_unit: 3, algorithm: gcra}
"#;

fn check(value: &str) -> String {
    format!(
        r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"api_key","value":"{value}"}}]}}]}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_front_end_answers_with_the_binding_limit_and_refunds_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.yaml");
    std::fs::write(&path, API).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.admin_token = Some(AdminToken::new(TOKEN).unwrap());
    let server = TestServer::start_with(config, dir, vec![path]).await;

    // 1st: both allow; the least remaining binds (the minute: 1 left, the hour: 2).
    let first = server.post("/v1/check", &check("k1")).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let body = first.json();
    let d = &body["descriptors"][0];
    assert_eq!(
        (d["name"].as_str(), d["remaining"].as_u64()),
        (Some("per_minute"), Some(1))
    );
    let limits = d["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2, "{body}");
    assert_eq!(limits[1]["name"], "api_key#1");
    assert_eq!(limits[1]["remaining"], 2);
    let policy = first.header("ratelimit-policy").unwrap();
    assert!(
        policy.contains("\"per_minute\";q=2;w=60") && policy.contains("\"api_key#1\";q=3;w=3600"),
        "{policy}"
    );
    assert_eq!(server.post("/v1/check", &check("k1")).await.status, 200);

    // 3rd: the minute refuses, and binds; the hour allowed but gets its unit back.
    let refused = server.post("/v1/check", &check("k1")).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let body = refused.json();
    let d = &body["descriptors"][0];
    assert_eq!(
        (d["name"].as_str(), d["status"].as_str()),
        (Some("per_minute"), Some("over_limit"))
    );
    assert_eq!(d["limits"][1]["status"], "ok");
    let json = server.post("/json", &check("k1")).await;
    assert_eq!(json.status, 429, "{}", json.body);
    let mut grpc = server.rls().await;
    let answer = should(
        &mut grpc,
        request("api", vec![descriptor(&[("api_key", "k1")])]),
    )
    .await;
    assert_eq!(answer.overall_code, OVER_LIMIT);
    let status = &answer.statuses[0];
    assert_eq!(status.current_limit.as_ref().unwrap().requests_per_unit, 2);
    assert_eq!(status.current_limit.as_ref().unwrap().name, "per_minute");

    // The admin sees both counters: the hour lost only the two allowed requests' units.
    let auth = [("authorization", &*format!("Bearer {TOKEN}"))];
    let keys = server
        .request_with("GET", "/v1/keys/api/api_key=k1", &auth, "")
        .await;
    assert_eq!(keys.status, 200, "{}", keys.body);
    let view = keys.json();
    assert_eq!(view["name"], "per_minute");
    let limits = view["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2, "{view}");
    assert_eq!(
        (
            limits[0]["remaining"].as_u64(),
            limits[1]["remaining"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_ne!(limits[0]["key"], limits[1]["key"]);
    // Each limit is counted in its own series.
    let over = server
        .metric(r#"flowgate_over_limit_total{domain="api",rule="api_key#0"}"#)
        .await;
    assert_eq!(over, 3.0);

    // DELETE resets both; the next request is allowed again.
    let reset = server
        .request_with("DELETE", "/v1/keys/api/api_key=k1", &auth, "")
        .await;
    let view = reset.json();
    let left: Vec<u64> = view["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["remaining"].as_u64().unwrap())
        .collect();
    assert_eq!(left, [2, 3], "{view}");
    let answer = should(
        &mut grpc,
        request("api", vec![descriptor(&[("api_key", "k1")])]),
    )
    .await;
    assert_eq!(answer.overall_code, OK);
    server.stop().await;
}

/// docs/choosing.md's rule under a rate and a calendar quota: the second's 10 go through, the
/// 11th is refused by the rate, which binds, and the month's quota counts only the 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_and_quota_in_choosing_md_work_as_it_says() {
    let yaml = flowgate_testing::docs::marked_yaml(
        &flowgate_testing::docs::read("docs/choosing.md"),
        "choosing-rate-and-quota",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.yaml");
    std::fs::write(&path, yaml).unwrap();
    let config = ServerConfig::load(vec![path.clone()]).unwrap();
    let server = TestServer::start_with(config, dir, vec![path]).await;
    // The second's 10 fit in one second unless the machine stalls across a boundary: then the
    // refusal comes later, never earlier, so count the granted requests until the first one
    // refused, in a bounded loop.
    let mut granted = 0;
    let refused = loop {
        let answer = server.post("/v1/check", &check("k1")).await;
        if answer.status != 200 {
            break answer;
        }
        granted += 1;
        assert!(granted <= 1_000, "never refused");
    };
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert!(granted >= 10, "refused after {granted}");
    let body = refused.json();
    let d = &body["descriptors"][0];
    assert_eq!(d["name"], "api_key#0", "{body}");
    let limits = d["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2, "{body}");
    assert_eq!(limits[0]["remaining"], 0, "{body}");
    // The month allowed this request too (its unit is given back after the answer).
    assert_eq!(limits[1]["allowed"], true, "{body}");
    assert_eq!(limits[1]["remaining"], 10_000 - granted - 1, "{body}");
    // The month renews at midnight on the 1st in Berlin: at most 31 days away.
    let reset = limits[1]["reset_after_ms"].as_u64().unwrap();
    assert!(reset > 0 && reset <= 31 * 86_400_000, "{body}");
}
