//! The gateway's limits: per client IP with the 429's IETF shape, trusted proxies, descriptors
//! whose source is missing, each rule's fail mode when the store is away, and reloads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use flowgate_server::backend::{Backend, SharedOptions};
use flowgate_server::server::ServerConfig;
use flowgate_testing::server::TestServer;
use flowgate_testing::upstream::*;
use http_body_util::Full;
use hyper::Request;

/// Five requests per hour per client IP, X-Forwarded-For believed from `trusted`.
fn per_ip(trusted: &str) -> String {
    format!(
        r#"
domain: edge
gateway:
  trusted_proxies: [{trusted}]
  descriptors:
    - [{{key: remote_address}}]
descriptors:
  - key: remote_address
    rate_limit: {{unit: hour, requests_per_unit: 5, name: per_ip}}
"#
    )
}

/// Sends `n` requests as `xff` (if any) and returns their statuses.
async fn statuses(server: &TestServer, n: usize, xff: Option<&str>) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let headers: Vec<(&str, &str)> = xff.map(|x| ("x-forwarded-for", x)).into_iter().collect();
        out.push(get(server, "/", &headers).await.status);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_per_client_ip_and_429s_have_the_ietf_shape() {
    let upstream = Upstream::start().await;
    // 127.0.0.1 is a trusted proxy: clients are told apart by X-Forwarded-For.
    let server = gateway(&per_ip("127.0.0.1/32"), &upstream.url()).await;
    let a = statuses(&server, 7, Some("203.0.113.1")).await;
    assert_eq!(a, [201, 201, 201, 201, 201, 429, 429]);
    let b = statuses(&server, 6, Some("198.51.100.2")).await;
    assert_eq!(b, [201, 201, 201, 201, 201, 429]);
    assert_eq!(upstream.seen().len(), 10, "denied requests never reach it");

    let allowed = get(&server, "/", &[("x-forwarded-for", "192.0.2.3")]).await;
    let state = sfv::Parser::new(allowed.header("ratelimit").as_bytes())
        .parse::<sfv::List>()
        .unwrap();
    let (item, params) = inner(&state[0]);
    assert_eq!(item.as_string().unwrap().as_str(), "per_ip");
    assert_eq!(
        params
            .get("r")
            .unwrap()
            .as_integer()
            .map(i64::from)
            .unwrap(),
        4
    );

    let denied = get(&server, "/", &[("x-forwarded-for", "203.0.113.1")]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("content-type"), "application/problem+json");
    assert_eq!(denied.header("cache-control"), "no-store");
    let retry: u64 = denied.header("retry-after").parse().unwrap();
    // Sliding window (the default): at most until the next window begins, plus the fifth of
    // it that the previous window's 5 must decay by to leave room for one.
    assert!((1..=3600 + 720).contains(&retry), "{retry}");
    let policy = sfv::Parser::new(denied.header("ratelimit-policy").as_bytes())
        .parse::<sfv::List>()
        .unwrap();
    let (item, params) = inner(&policy[0]);
    assert_eq!(item.as_string().unwrap().as_str(), "per_ip");
    assert_eq!(
        params
            .get("q")
            .unwrap()
            .as_integer()
            .map(i64::from)
            .unwrap(),
        5
    );
    assert_eq!(
        params
            .get("w")
            .unwrap()
            .as_integer()
            .map(i64::from)
            .unwrap(),
        3600
    );
    let state = sfv::Parser::new(denied.header("ratelimit").as_bytes())
        .parse::<sfv::List>()
        .unwrap();
    let (_, params) = inner(&state[0]);
    assert_eq!(
        params
            .get("r")
            .unwrap()
            .as_integer()
            .map(i64::from)
            .unwrap(),
        0
    );
    let t = params
        .get("t")
        .unwrap()
        .as_integer()
        .map(i64::from)
        .unwrap();
    assert_eq!(
        u64::try_from(t).unwrap(),
        retry,
        "t agrees with Retry-After"
    );
    let problem = denied.json();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"][0], "per_ip");
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("#quota-exceeded"),
        "{problem}"
    );

    assert_eq!(
        server
            .metric(r#"flowgate_gateway_responses_total{outcome="limited"}"#)
            .await,
        4.0
    );
    assert_eq!(
        server
            .metric(r#"flowgate_hits_total{domain="edge",rule="remote_address"}"#)
            .await,
        15.0
    );
    server.stop().await;
}

fn inner(member: &sfv::ListEntry) -> (&sfv::BareItem, &sfv::Parameters) {
    match member {
        sfv::ListEntry::Item(item) => (&item.bare_item, &item.params),
        sfv::ListEntry::InnerList(_) => panic!("an item, not an inner list"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_from_an_untrusted_peer_is_ignored() {
    let upstream = Upstream::start().await;
    let server = gateway(&per_ip("10.0.0.0/8"), &upstream.url()).await;
    // Every "client" is really 127.0.0.1, which is not trusted: one shared budget.
    let mut all = Vec::new();
    for i in 0..7 {
        let xff = format!("203.0.113.{i}");
        all.push(get(&server, "/", &[("x-forwarded-for", &xff)]).await.status);
    }
    assert_eq!(all, [201, 201, 201, 201, 201, 429, 429]);
    // The spoofed hop is not passed on either: the upstream sees the real peer only
    // (`forwarded: overwrite`, the default for peers that are not trusted proxies).
    assert_eq!(upstream.seen()[0].headers["x-forwarded-for"], "127.0.0.1");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_with_a_missing_source_are_skipped() {
    let upstream = Upstream::start().await;
    let yaml = r#"
domain: edge
gateway:
  descriptors:
    - [{key: header, header: x-api-key, as: api_key}, {key: method}]
    - [{key: generic_key, value: everyone}]
descriptors:
  - key: api_key
    descriptors:
      - key: method
        value: POST
        rate_limit: {unit: hour, requests_per_unit: 1, name: posts_per_key}
  - key: generic_key
    rate_limit: {unit: hour, requests_per_unit: 3, name: everyone}
"#;
    let server = gateway(yaml, &upstream.url()).await;
    let post = |key: Option<&'static str>| {
        let mut request = Request::post(format!("http://{}/", server.gateway.unwrap()));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        request.body(Full::default()).unwrap()
    };
    let c = client();
    assert_eq!(send(&c, post(Some("k1"))).await.status, 201);
    assert_eq!(send(&c, post(Some("k1"))).await.status, 429);
    // Without the header, only the `everyone` descriptor applies. (The denied request above
    // consumed nothing, so `everyone` has counted 1 so far.)
    assert_eq!(send(&c, post(None)).await.status, 201);
    assert_eq!(send(&c, post(Some("k2"))).await.status, 201);
    let last = send(&c, post(None)).await;
    assert_eq!(last.status, 429);
    assert_eq!(last.json()["violated-policies"][0], "everyone");
    server.stop().await;
}

/// A store that cannot be reached.
struct DownStore;

impl flowgate::store::Store for DownStore {
    async fn check(
        &self,
        _ask: flowgate::store::Ask<'_>,
    ) -> Result<flowgate::Decision, flowgate::store::StoreError> {
        Err(flowgate::store::StoreError::Unavailable(
            "test store is down".into(),
        ))
    }

    async fn refund(
        &self,
        _ask: flowgate::store::Ask<'_>,
    ) -> Result<(), flowgate::store::StoreError> {
        Ok(())
    }

    async fn reset(
        &self,
        _ask: flowgate::store::Ask<'_>,
    ) -> Result<(), flowgate::store::StoreError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_follows_each_rules_fail_mode() {
    let upstream = Upstream::start().await;
    let yaml = r#"
domain: edge
gateway:
  descriptors:
    - [{key: header, header: x-tier, as: tier}]
descriptors:
  - key: tier
    value: lenient
    rate_limit: {unit: second, requests_per_unit: 10, fail: open}
  - key: tier
    value: strict
    rate_limit: {unit: second, requests_per_unit: 10, fail: closed}
  - key: tier
    value: default
    rate_limit: {unit: second, requests_per_unit: 10}
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    // The fail modes are applied by the fallback store around a shared store; rules that name
    // none fail closed here.
    let options = SharedOptions {
        fail: flowgate::FailMode::Closed,
        instances: 1,
    };
    config.backend = Backend::shared(Arc::new(DownStore), options);
    config.upstream = Some(upstream.url().parse().unwrap());
    let server = TestServer::start_with(config, dir, vec![path]).await;

    let open = get(&server, "/", &[("x-tier", "lenient")]).await;
    assert_eq!(open.status, 201);
    assert_eq!(open.header("flowgate-fallback"), "open");
    for tier in ["strict", "default"] {
        let closed = get(&server, "/", &[("x-tier", tier)]).await;
        assert_eq!(closed.status, 503, "{tier}");
        assert_eq!(closed.header("content-type"), "application/problem+json");
        assert_eq!(closed.header("cache-control"), "no-store");
        assert_eq!(closed.header("flowgate-fallback"), "closed");
        assert!(closed.header("retry-after").parse::<u64>().unwrap() >= 1);
    }
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(
        server
            .metric(r#"flowgate_fallback_decisions_total{mode="open"}"#)
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_gateway_section_applies_without_a_restart() {
    let upstream = Upstream::start().await;
    let server = gateway(&per_ip("10.0.0.0/8"), &upstream.url()).await;
    assert_eq!(get(&server, "/", &[]).await.status, 201);
    // Now count per API key instead, 1 per hour.
    let by_key = r#"
domain: edge
gateway:
  descriptors:
    - [{key: header, header: x-api-key, as: api_key}]
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1, name: per_key}
"#;
    std::fs::write(&server.files[0], by_key).unwrap();
    // Bounded wait for the reload (file watching; 10 s at most).
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let version = server.get("/v1/config").await.json()["version"].as_u64();
        if version == Some(2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reload ({version:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let key = [("x-api-key", "k")];
    assert_eq!(get(&server, "/", &key).await.status, 201);
    let denied = get(&server, "/", &key).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.json()["violated-policies"][0], "per_key");
    // Without a key, the only descriptor is skipped: no limit applies.
    for _ in 0..3 {
        assert_eq!(get(&server, "/", &[]).await.status, 201);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_path_meets_its_rule_and_the_upstream_sees_the_keyed_path() {
    let upstream = Upstream::start().await;
    let yaml = r#"
domain: edge
gateway:
  descriptors:
    - [{key: path}]
descriptors:
  - key: path
    value: /upload
    rate_limit: {unit: hour, requests_per_unit: 1, name: uploads}
"#;
    let server = gateway(yaml, &upstream.url()).await;
    assert_eq!(get(&server, "/upload?n=1", &[]).await.status, 201);
    // What an upstream serves as `/upload` is `/upload` to the limit too (nginx normalises the
    // same way before it matches a location).
    for spelling in [
        "/%75pload",
        "/%75%70%6c%6f%61%64",
        "//upload",
        "/./upload",
        "/x/../upload",
        "/x/%2e%2e/upload",
        "/../upload",
    ] {
        let answer = get(&server, spelling, &[]).await;
        assert_eq!(answer.status, 429, "{spelling} got past the /upload rule");
        assert_eq!(answer.json()["violated-policies"][0], "uploads");
    }
    // Other paths are other keys; their normal form is what is forwarded, query untouched.
    assert_eq!(
        get(&server, "/a//b/./c/../d?q=%2e%2e", &[]).await.status,
        201
    );
    assert_eq!(get(&server, "/%2Fupload", &[]).await.status, 201);
    let uris: Vec<String> = upstream.seen().into_iter().map(|s| s.uri).collect();
    assert_eq!(uris, ["/upload?n=1", "/a/b/d?q=%2e%2e", "/%2Fupload"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_key_header_is_refused_not_keyed_on_one_of_its_values() {
    let upstream = Upstream::start().await;
    let yaml = r#"
domain: edge
gateway:
  descriptors:
    - [{key: header, header: x-api-key, as: api_key}]
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1, name: per_key}
"#;
    let server = gateway(yaml, &upstream.url()).await;
    assert_eq!(get(&server, "/", &[("x-api-key", "a")]).await.status, 201);
    assert_eq!(get(&server, "/", &[("x-api-key", "a")]).await.status, 429);
    // Keyed on `b` while the upstream might read `a` (or the other way round): refused.
    for pair in [["b", "a"], ["a", "b"], ["c", "c"]] {
        let answer = get(
            &server,
            "/",
            &[("x-api-key", pair[0]), ("x-api-key", pair[1])],
        )
        .await;
        assert_eq!(answer.status, 400, "{pair:?}");
        assert_eq!(answer.header("content-type"), "application/problem+json");
        let detail = answer.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("more than once"), "{detail}");
    }
    assert_eq!(
        upstream.seen().len(),
        1,
        "only the first request was forwarded"
    );
    assert_eq!(
        server
            .metric(r#"flowgate_gateway_responses_total{outcome="rejected"}"#)
            .await,
        3.0
    );
    server.stop().await;
}

/// With `usage_header`, the gateway checks `charge: true` rules with 0 units on the way in and
/// charges what the upstream reports: 5,000 tokens on a 1,000-per-minute budget leave the user
/// refused for the 240 s the debt takes to repay, while the per-address rule counts requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_charges_the_usage_the_upstream_reports() {
    let upstream = Upstream::start().await;
    let yaml = r#"
domain: edge
gateway:
  usage_header: x-usage-tokens
  descriptors:
    - [{key: remote_address}]
    - [{key: header, header: x-user, as: user}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 100, name: per_ip}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: gcra, charge: true, name: tokens}
"#;
    let server = gateway(yaml, &upstream.url()).await;
    let answered = get(&server, "/usage/5000", &[("x-user", "ann")]).await;
    assert_eq!(answered.status, 200);
    let refused = get(&server, "/", &[("x-user", "ann")]).await;
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").parse().unwrap();
    assert!((230..=240).contains(&retry), "retry-after: {retry}");
    // Another user is not charged; the per-address limit counted requests, not tokens (the
    // refused one took nothing).
    let other = get(&server, "/", &[("x-user", "bob")]).await;
    assert_eq!(other.status, 201);
    assert!(
        other.header("ratelimit").contains(r#""per_ip";r=98"#),
        "{}",
        other.header("ratelimit")
    );
    // A usage header that is not a 32-bit count is ignored.
    assert_eq!(
        get(&server, "/usage/99999999999", &[("x-user", "bob")])
            .await
            .status,
        200
    );
    assert_eq!(get(&server, "/", &[("x-user", "bob")]).await.status, 201);
    server.stop().await;
}

/// A rule with two limits behind the gateway: every limit must allow, `RateLimit-Policy`
/// has one item per limit, and a refusal by the tighter one burns nothing of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_with_several_limits_holds_each_and_lists_each_policy() {
    let upstream = Upstream::start().await;
    let yaml = r#"
domain: edge
gateway:
  descriptors:
    - [{key: remote_address}]
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: minute, requests_per_unit: 2, name: burst, algorithm: gcra}
      - {unit: hour, requests_per_unit: 3, name: hourly, algorithm: gcra}
"#;
    let server = gateway(yaml, &upstream.url()).await;
    assert_eq!(statuses(&server, 4, None).await, [201, 201, 429, 429]);
    let denied = get(&server, "/", &[]).await;
    assert_eq!(denied.status, 429);
    let policy = denied.header("ratelimit-policy");
    assert!(
        policy.contains("\"burst\";q=2;w=60") && policy.contains("\"hourly\";q=3;w=3600"),
        "{policy}"
    );
    let state = sfv::Parser::new(denied.header("ratelimit").as_bytes())
        .parse::<sfv::List>()
        .unwrap();
    assert_eq!(
        inner(&state[0]).0.as_string().unwrap().as_str(),
        "burst",
        "the binding limit"
    );
    // Only the two allowed requests reached the upstream; each limit has its own series.
    assert_eq!(upstream.seen().len(), 2);
    let metric = server
        .metric(r#"flowgate_within_limit_total{domain="edge",rule="remote_address#1"}"#)
        .await;
    assert!(metric >= 2.0, "{metric}");
    server.stop().await;
}
