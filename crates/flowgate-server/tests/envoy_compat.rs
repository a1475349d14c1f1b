//! The YAML fields and settings of envoyproxy/ratelimit (main, f2fb157) that Flowgate took on
//! for issue 23: wildcards anywhere in a value, `share_threshold`, `quota_mode`,
//! `value_to_metric`, `metadata` (with `--response-dynamic-metadata`) and the global shadow
//! mode — each through gRPC `ShouldRateLimit` and `POST /json`, against a real server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use flowgate::envoy::Modes;
use flowgate_server::api::RlsSettings;
use flowgate_server::server::ServerConfig;
use flowgate_testing::grpc::{OK, OVER_LIMIT, descriptor, request, should};
use flowgate_testing::server::TestServer;
use flowgate_testing::window::{HOUR, MINUTE, in_one_window};

const COMPAT: &str = r#"
domain: compat
descriptors:
  # README example 9: trailing, middle and multiple wildcards.
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: route
    value: /api/*/resource/*/action
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  # README example 11.
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
  # Quota mode.
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}
  # Metadata (as envoyproxy/ratelimit's test/config/metadata.yaml shapes it).
  - key: tenant
    metadata:
      team: payments
      limits: {tier: gold, burst: 2}
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: region
    metadata:
      limits: {tier: silver, zone: eu}
      tags: [a, 1, true, null]
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: open
    metadata: {never: returned}
    rate_limit: {unlimited: true}
  # README example 10: value_to_metric.
  - key: vroute
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
"#;

async fn compat() -> TestServer {
    TestServer::start(&[("compat.yaml", COMPAT)]).await
}

async fn compat_with(rls: RlsSettings) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compat.yaml");
    std::fs::write(&path, COMPAT).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.rls = rls;
    TestServer::start_with(config, dir, vec![path]).await
}

fn json_body(descriptors: &[&[(&str, &str)]]) -> String {
    let descriptors: Vec<serde_json::Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<serde_json::Value> = entries
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect();
            serde_json::json!({ "entries": entries })
        })
        .collect();
    serde_json::json!({"domain": "compat", "descriptors": descriptors}).to_string()
}

fn codes(r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_anywhere_in_a_value() {
    // envoyproxy/ratelimit's fixed windows, aligned to the wall clock: the counts hold within
    // one minute, and a sequence the minute's end cut runs again, on a fresh server.
    in_one_window(&[MINUTE], async |_| {
        let server = compat().await;
        let mut rls = server.rls().await;
        let one = |k: &str, v: &str| request("compat", vec![descriptor(&[(k, v)])]);
        // Each matching value has its own counter (no share_threshold).
        for value in ["/api/123/action", "/api/user-id/action", "/api//action"] {
            assert_eq!(should(&mut rls, one("path", value)).await.overall_code, OK);
            assert_eq!(
                should(&mut rls, one("path", value)).await.overall_code,
                OVER_LIMIT,
                "{value}"
            );
        }
        // No match: no limit.
        let other = should(&mut rls, one("path", "/api/123/other")).await;
        assert_eq!(other.overall_code, OK);
        assert!(other.statuses[0].current_limit.is_none());
        let multi = "/api/v1/resource/123/action";
        assert!(
            should(&mut rls, one("route", multi)).await.statuses[0]
                .current_limit
                .is_some()
        );
        assert!(
            should(&mut rls, one("route", "/api/v1/resource/123"))
                .await
                .statuses[0]
                .current_limit
                .is_none()
        );
        // The same through /json.
        let denied = server
            .post("/json", &json_body(&[&[("route", multi)]]))
            .await;
        assert_eq!(denied.status, 429, "{}", denied.body);
        assert_eq!(denied.json()["statuses"][0]["code"], "OVER_LIMIT");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_shares_one_counter_among_a_wildcards_matches() {
    // envoyproxy/ratelimit's fixed windows, aligned to the wall clock: the counts hold within
    // one hour, and a sequence the hour's end cut runs again, on a fresh server.
    in_one_window(&[HOUR], async |_| {
        let server = compat().await;
        let mut rls = server.rls().await;
        let files = |k: &str, v: &str| request("compat", vec![descriptor(&[(k, v)])]);
        // README: 5 requests for files/a.pdf and 5 for files/b.csv (half by gRPC, half by /json),
        // then files/c.txt is over the limit.
        for _ in 0..5 {
            let r = should(&mut rls, files("files", "files/a.pdf")).await;
            assert_eq!(r.overall_code, OK);
            let r = server
                .post("/json", &json_body(&[&[("files", "files/b.csv")]]))
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
        }
        let c = should(&mut rls, files("files", "files/c.txt")).await;
        assert_eq!(codes(&c), [OVER_LIMIT]);
        let r = server
            .post("/json", &json_body(&[&[("files", "files/d")]]))
            .await;
        assert_eq!(
            (r.status, r.json()["overallCode"].clone()),
            (429, "OVER_LIMIT".into())
        );
        // Without share_threshold, each value keeps its own threshold.
        for _ in 0..10 {
            let r = should(&mut rls, files("files_no_share", "files_no_share/a.pdf")).await;
            assert_eq!(r.overall_code, OK);
        }
        let a = should(&mut rls, files("files_no_share", "files_no_share/a.pdf")).await;
        assert_eq!(a.overall_code, OVER_LIMIT);
        let b = should(&mut rls, files("files_no_share", "files_no_share/b.csv")).await;
        assert_eq!(b.overall_code, OK);
        assert_eq!(b.statuses[0].limit_remaining, 9);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_mode_denies_only_when_every_quota_descriptor_is_over() {
    // envoyproxy/ratelimit's fixed windows, aligned to the wall clock: the counts hold within
    // one minute, and a sequence the minute's end cut runs again, on a fresh server.
    in_one_window(&[MINUTE], async |_| {
        let server = compat().await;
        let mut rls = server.rls().await;
        let req = || {
            request(
                "compat",
                vec![
                    descriptor(&[("quota_a", "u")]),
                    descriptor(&[("quota_b", "u")]),
                    descriptor(&[("plain", "p")]),
                ],
            )
        };
        assert_eq!(codes(&should(&mut rls, req()).await), [OK, OK, OK]);
        // quota_a is over, quota_b passes: the descriptor says OVER_LIMIT, the request is OK.
        let r = should(&mut rls, req()).await;
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![OVER_LIMIT, OK, OK]));
        // Both over: OVER_LIMIT.
        let body = json_body(&[&[("quota_a", "u")], &[("quota_b", "u")], &[("plain", "p")]]);
        let r = server.post("/json", &body).await;
        assert_eq!(r.status, 429, "{}", r.body);
        let json = r.json();
        assert_eq!(json["overallCode"], "OVER_LIMIT");
        assert_eq!(json["statuses"][0]["code"], "OVER_LIMIT");
        assert_eq!(json["statuses"][1]["code"], "OVER_LIMIT");
        assert_eq!(json["statuses"][2]["code"], "OK");
        // A quota-mode descriptor alone that is over: denied (all of the one are over).
        let alone = should(
            &mut rls,
            request("compat", vec![descriptor(&[("quota_a", "u")])]),
        )
        .await;
        assert_eq!(alone.overall_code, OVER_LIMIT);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_quota_mode_puts_every_limit_in_quota_mode() {
    // envoyproxy/ratelimit's fixed windows, aligned to the wall clock: the counts hold within
    // one minute, and a sequence the minute's end cut runs again, on a fresh server.
    in_one_window(&[MINUTE], async |_| {
        let server = compat_with(RlsSettings {
            modes: Modes::new(false, true),
            dynamic_metadata: false,
        })
        .await;
        let mut rls = server.rls().await;
        let req = || {
            request(
                "compat",
                vec![
                    descriptor(&[("path", "/api/x/action")]),
                    descriptor(&[("plain", "p")]),
                ],
            )
        };
        assert_eq!(should(&mut rls, req()).await.overall_code, OK);
        let r = should(&mut rls, req()).await;
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![OVER_LIMIT, OK]));
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_shadow_mode_allows_and_still_reports_over_limit() {
    // envoyproxy/ratelimit's fixed windows, aligned to the wall clock: the counts hold within
    // one minute, and a sequence the minute's end cut runs again, on a fresh server (whose
    // metrics count only its own run).
    in_one_window(&[MINUTE], async |_| {
        let server = compat_with(RlsSettings {
            modes: Modes::new(true, false),
            dynamic_metadata: false,
        })
        .await;
        let mut rls = server.rls().await;
        let one = || request("compat", vec![descriptor(&[("path", "/api/1/action")])]);
        assert_eq!(should(&mut rls, one()).await.overall_code, OK);
        let r = should(&mut rls, one()).await;
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![OVER_LIMIT]));
        let r = server
            .post("/json", &json_body(&[&[("path", "/api/1/action")]]))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["overallCode"], "OK");
        assert_eq!(r.json()["statuses"][0]["code"], "OVER_LIMIT");
        assert_eq!(
            server.metric("flowgate_global_shadow_mode_total").await,
            2.0
        );
        // Counted as usual: the rule's over-limit series too.
        assert_eq!(
            server
                .metric(r#"flowgate_over_limit_total{domain="compat",rule="path_/api/*/action"}"#)
                .await,
            2.0
        );
        server.stop().await;
    })
    .await;
}

fn field<'a>(s: &'a Struct, name: &str) -> &'a Kind {
    s.fields
        .get(name)
        .and_then(|v| v.kind.as_ref())
        .unwrap_or_else(|| panic!("no `{name}` in {s:?}"))
}

fn text(v: &Value) -> &str {
    match &v.kind {
        Some(Kind::StringValue(s)) => s,
        other => panic!("not a string: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_of_passing_descriptors_goes_into_dynamic_metadata() {
    // envoyproxy/ratelimit's fixed windows, aligned to the wall clock: the counts hold within
    // one minute, and a sequence the minute's end cut runs again, on a fresh server.
    in_one_window(&[MINUTE], async |_| {
        let server = compat_with(RlsSettings {
            modes: Modes::NONE,
            dynamic_metadata: true,
        })
        .await;
        let mut rls = server.rls().await;
        let mut req = request(
            "compat",
            vec![
                descriptor(&[("tenant", "t1")]),
                descriptor(&[("region", "r1")]),
                descriptor(&[("open", "o")]),
            ],
        );
        req.hits_addend = 1;
        let r = should(&mut rls, req.clone()).await;
        let meta = r.dynamic_metadata.expect("dynamic_metadata");
        assert!(matches!(field(&meta, "domain"), Kind::StringValue(d) if d == "compat"));
        assert!(matches!(field(&meta, "hitsAddend"), Kind::NumberValue(n) if *n == 1.0));
        let Kind::ListValue(descriptors) = field(&meta, "descriptors") else {
            panic!("descriptors");
        };
        assert_eq!(descriptors.values.len(), 3);
        let Some(Kind::StructValue(first)) = &descriptors.values[0].kind else {
            panic!("a struct");
        };
        let Kind::ListValue(entries) = field(first, "entries") else {
            panic!("entries");
        };
        assert_eq!(text(&entries.values[0]), "tenant=t1");
        // Merged: the first descriptor's `limits.tier` wins, `limits.zone` and `tags` are added;
        // the unlimited rule's metadata is never returned.
        let Kind::StructValue(merged) = field(&meta, "metadata") else {
            panic!("metadata");
        };
        assert!(matches!(field(merged, "team"), Kind::StringValue(t) if t == "payments"));
        let Kind::StructValue(limits) = field(merged, "limits") else {
            panic!("limits");
        };
        assert!(matches!(field(limits, "tier"), Kind::StringValue(t) if t == "gold"));
        assert!(matches!(field(limits, "zone"), Kind::StringValue(t) if t == "eu"));
        assert!(matches!(field(limits, "burst"), Kind::NumberValue(n) if *n == 2.0));
        assert!(!merged.fields.contains_key("never"));
        // Now `tenant` is over its limit: only `region`'s metadata is returned.
        let r = server
            .post(
                "/json",
                &json_body(&[&[("tenant", "t1")], &[("region", "r1")]]),
            )
            .await;
        assert_eq!(r.status, 429, "{}", r.body);
        let json = r.json();
        let meta = &json["dynamicMetadata"];
        assert_eq!(meta["domain"], "compat");
        assert_eq!(meta["descriptors"][1]["entries"][0], "region=r1");
        assert_eq!(
            meta["metadata"],
            serde_json::json!({"limits": {"tier": "silver", "zone": "eu"}, "tags": ["a", 1, true, null]})
        );
        assert!(meta.get("hitsAddend").is_none());
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_setting_there_is_no_dynamic_metadata() {
    let server = compat().await;
    let mut rls = server.rls().await;
    let r = should(
        &mut rls,
        request("compat", vec![descriptor(&[("tenant", "t")])]),
    )
    .await;
    assert!(r.dynamic_metadata.is_none());
    let r = server
        .post("/json", &json_body(&[&[("tenant", "u")]]))
        .await;
    assert!(r.json().get("dynamicMetadata").is_none(), "{}", r.body);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_names_series_with_the_values() {
    let server = compat().await;
    let mut rls = server.rls().await;
    let req = |route: &str, method: &str, subject: &str| {
        request(
            "compat",
            vec![descriptor(&[
                ("vroute", route),
                ("http_method", method),
                ("subject_id", subject),
            ])],
        )
    };
    should(&mut rls, req("api", "GET", "123")).await;
    should(&mut rls, req("api", "GET", "124")).await;
    let body = r#"{"domain":"compat","descriptors":[{"entries":[
        {"key":"vroute","value":"web"},{"key":"http_method","value":"POST"},{"key":"subject_id","value":"456"}]}]}"#;
    assert_eq!(server.post("/json", body).await.status, 200);
    let series = |rule: &str| format!(r#"flowgate_hits_total{{domain="compat",rule="{rule}"}}"#);
    assert_eq!(
        server
            .metric(&series("vroute_api.http_method_GET.subject_id"))
            .await,
        2.0
    );
    assert_eq!(
        server
            .metric(&series("vroute_web.http_method_POST.subject_id"))
            .await,
        1.0
    );
    assert_eq!(
        server
            .metric(&series("vroute.http_method.subject_id"))
            .await,
        0.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_configuration_shows_the_new_fields() {
    let server = compat().await;
    let config = server.get("/v1/config").await.json();
    let rule = |path: &str| {
        config["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rule"] == path)
            .unwrap_or_else(|| panic!("no rule {path}"))
            .clone()
    };
    assert_eq!(rule("files_files/*")["share_threshold"], true);
    assert_eq!(
        rule("files_no_share_files_no_share/*")["share_threshold"],
        false
    );
    assert_eq!(rule("quota_a")["quota_mode"], true);
    assert_eq!(
        rule("vroute.http_method.subject_id")["value_to_metric"],
        true
    );
    assert_eq!(
        rule("tenant")["metadata"],
        serde_json::json!({"team": "payments", "limits": {"tier": "gold", "burst": 2}})
    );
    assert!(rule("plain").get("metadata").is_none());
    server.stop().await;
}
