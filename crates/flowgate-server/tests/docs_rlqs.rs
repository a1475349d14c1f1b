//! `docs/rlqs.md` is a working pair: its Flowgate file passes `flowgate check-config`, its
//! Envoy `rate_limit_quota` filter asks about that file's domain with the file's report
//! interval, and the bucket ids its `bucket_id_builder`s produce for sample requests each get
//! a share of a limited rule from a running server, over a real RLQS stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use flowgate::rlqs::client::Strategy;
use flowgate_server::rlqs::bucket::read_action;
use serde_json::Value;

use flowgate_testing::docs::marked_yaml;
use flowgate_testing::server::TestServer;

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

fn doc() -> String {
    flowgate_testing::docs::read("docs/rlqs.md")
}

/// The bucket id a `bucket_id_builder` makes for a request with `headers` (the value builders
/// the doc uses; any other fails the test, so the doc cannot drift beyond what is checked).
fn bucket_id(builder: &Value, headers: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    let mut id = BTreeMap::new();
    for (key, value) in builder.as_object().unwrap() {
        let v = if let Some(s) = value.get("string_value") {
            s.as_str().unwrap().to_owned()
        } else if let Some(custom) = value.get("custom_value") {
            let typed = &custom["typed_config"];
            assert_eq!(
                typed["@type"],
                "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
            );
            let header = typed["header_name"].as_str().unwrap();
            // Envoy cannot build the id without the header: the request is allowed, unreported.
            headers
                .iter()
                .find(|(h, _)| h.eq_ignore_ascii_case(header))?
                .1
                .to_owned()
        } else {
            panic!("docs/rlqs.md uses a value builder this test does not model: {value}");
        };
        id.insert(key.clone(), v);
    }
    Some(id)
}

/// The Envoy filter's domain, its matchers' (header, bucket settings), and the catch-all's.
fn envoy() -> (String, Vec<(String, Value)>, Value) {
    let config: Value = serde_saphyr::from_str(&marked_yaml(&doc(), "envoy: envoy.yaml")).unwrap();
    let hcm = &config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let filters = hcm["http_filters"].as_array().unwrap();
    assert_eq!(filters.last().unwrap()["name"], "envoy.filters.http.router");
    let quota = filters
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.rate_limit_quota")
        .expect("the rate_limit_quota filter");
    let typed = &quota["typed_config"];
    assert_eq!(
        typed["@type"],
        "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig"
    );
    let cluster = typed["rlqs_server"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .unwrap();
    let clusters = config["static_resources"]["clusters"].as_array().unwrap();
    let flowgate = clusters
        .iter()
        .find(|c| c["name"] == cluster)
        .expect("the RLQS cluster");
    assert!(
        flowgate["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            ["explicit_http_config"]
            .get("http2_protocol_options")
            .is_some(),
        "gRPC needs HTTP/2 to the RLQS cluster"
    );
    let settings = |action: &Value| {
        assert!(
            action["name"].as_str().is_some_and(|n| !n.is_empty()),
            "an action needs a name"
        );
        let typed = &action["typed_config"];
        assert_eq!(
            typed["@type"],
            "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings"
        );
        typed.clone()
    };
    let matchers = typed["bucket_matchers"]["matcher_list"]["matchers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let input = &m["predicate"]["single_predicate"]["input"]["typed_config"];
            assert_eq!(
                input["@type"],
                "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
            );
            let regex = &m["predicate"]["single_predicate"]["value_match"]["safe_regex"];
            assert!(
                regex.get("google_re2").is_some(),
                "safe_regex needs an engine"
            );
            assert_eq!(
                regex["regex"], ".+",
                "the doc's predicate: the header is present"
            );
            (
                input["header_name"].as_str().unwrap().to_owned(),
                settings(&m["on_match"]["action"]),
            )
        })
        .collect();
    let fallback = settings(&typed["bucket_matchers"]["on_no_match"]["action"]);
    (
        typed["domain"].as_str().unwrap().to_owned(),
        matchers,
        fallback,
    )
}

#[test]
fn the_flowgate_file_passes_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, marked_yaml(&doc(), "flowgate: edge.yaml")).unwrap();
    let out = Command::new(FLOWGATE)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test]
async fn envoys_buckets_get_shares_of_the_flowgate_rules() {
    let rules = marked_yaml(&doc(), "flowgate: edge.yaml");
    let file: Value = serde_saphyr::from_str(&rules).unwrap();
    let (domain, matchers, fallback) = envoy();
    assert_eq!(
        file["domain"],
        domain.as_str(),
        "the filter's domain is the file's"
    );
    let interval = file["rlqs"]["report_interval"].as_str().unwrap();
    for settings in matchers.iter().map(|(_, s)| s).chain([&fallback]) {
        assert_eq!(
            settings["reporting_interval"], interval,
            "reporting_interval = rlqs.report_interval"
        );
    }

    // Envoy takes the first matcher whose predicate holds, else `on_no_match`.
    let samples: [&[(&str, &str)]; 3] = [&[("x-tenant", "acme")], &[("X-Tenant", "globex")], &[]];
    let mut usages = Vec::new();
    for headers in samples {
        let settings = matchers
            .iter()
            .find(|(header, _)| headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(header)))
            .map_or(&fallback, |(_, s)| s);
        let id = bucket_id(&settings["bucket_id_builder"]["bucket_id_builder"], headers).unwrap();
        usages.push(BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: id.into_iter().collect(),
            }),
            time_elapsed: None,
            num_requests_allowed: 1,
            num_requests_denied: 0,
        });
    }

    let server = TestServer::start(&[("edge.yaml", &rules)]).await;
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut inbound = client
        .stream_rate_limit_quotas(outbound)
        .await
        .unwrap()
        .into_inner();
    tx.send(RateLimitQuotaUsageReports {
        domain: domain.clone(),
        bucket_quota_usages: usages,
    })
    .await
    .unwrap();
    let message = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .expect("an answer within 10 s")
        .unwrap()
        .unwrap();
    assert_eq!(message.bucket_action.len(), 3);
    for action in &message.bucket_action {
        let (what, key) = read_action(action).unwrap();
        let (strategy, ttl) = what.unwrap();
        // A share of a limited rule: a token bucket, valid for the file's assignment_ttl.
        assert!(
            matches!(strategy, Strategy::TokenBucket(_)),
            "{key:?}: {strategy:?}"
        );
        assert_eq!(ttl, Some(Duration::from_secs(3)));
    }
    server.stop().await;
}
