//! `docs/envoy.md` is a working pair: its Flowgate file passes `flowgate check-config`, its
//! Envoy filter asks about that file's domain, and the descriptors its `rate_limits` actions
//! produce for a sample request each meet a limit of a running server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use serde_json::Value;

use flowgate_testing::docs::marked_yaml;
use flowgate_testing::grpc::{OK, OVER_LIMIT, Sample, descriptor, descriptor_for, request, should};
use flowgate_testing::server::TestServer;

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

fn doc() -> String {
    flowgate_testing::docs::read("docs/envoy.md")
}

/// A route's prefix and the actions of each of its `rate_limits` entries.
type Route = (String, Vec<Vec<Value>>);

/// The Envoy bootstrap's rate-limit domain and its routes.
fn envoy() -> (String, Vec<Route>) {
    let config: Value = serde_saphyr::from_str(&marked_yaml(&doc(), "envoy: envoy.yaml")).unwrap();
    let hcm = &config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let filters = hcm["http_filters"].as_array().unwrap();
    assert_eq!(
        filters.last().unwrap()["name"],
        "envoy.filters.http.router",
        "router last"
    );
    let ratelimit = filters
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        .expect("the rate-limit filter");
    let typed = &ratelimit["typed_config"];
    assert_eq!(typed["rate_limit_service"]["transport_api_version"], "V3");
    let cluster = typed["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .unwrap();
    let clusters = config["static_resources"]["clusters"].as_array().unwrap();
    let flowgate = clusters
        .iter()
        .find(|c| c["name"] == cluster)
        .expect("the RLS cluster");
    assert!(
        flowgate["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            ["explicit_http_config"]
            .get("http2_protocol_options")
            .is_some(),
        "gRPC needs HTTP/2 to the RLS cluster"
    );
    let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let prefix = r["match"]["prefix"].as_str().unwrap().to_owned();
            let limits = r["route"]["rate_limits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["actions"].as_array().unwrap().clone())
                .collect();
            (prefix, limits)
        })
        .collect();
    (typed["domain"].as_str().unwrap().to_owned(), routes)
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
async fn envoys_descriptors_meet_the_flowgate_rules() {
    let rules = marked_yaml(&doc(), "flowgate: edge.yaml");
    let (domain, routes) = envoy();
    let file_domain: Value = serde_saphyr::from_str(&rules).unwrap();
    assert_eq!(
        file_domain["domain"],
        domain.as_str(),
        "the filter's domain is the file's"
    );

    let server = TestServer::start(&[("edge.yaml", &rules)]).await;
    let mut rls = server.rls().await;
    let samples = [
        Sample {
            path: "/checkout/cart",
            remote_address: "10.0.0.7",
            headers: &[],
        },
        Sample {
            path: "/users",
            remote_address: "10.0.0.8",
            headers: &[("X-Api-Key", "key-1")],
        },
        Sample {
            path: "/users",
            remote_address: "10.0.0.9",
            headers: &[],
        },
    ];
    for sample in &samples {
        // Envoy takes the first route whose prefix matches.
        let (_, limits) = routes
            .iter()
            .find(|(prefix, _)| sample.path.starts_with(prefix.as_str()))
            .unwrap();
        let descriptors: Vec<_> = limits
            .iter()
            .filter_map(|actions| descriptor_for(actions, sample))
            .collect();
        let expected = 1 + sample.headers.len() + usize::from(sample.path.starts_with("/checkout"));
        assert_eq!(descriptors.len(), expected, "{}", sample.path);
        let answer = should(&mut rls, request(&domain, descriptors.clone())).await;
        assert_eq!(answer.overall_code, OK, "{answer:?}");
        if sample.path.starts_with("/checkout") {
            // The fields the doc shows for this request.
            let doc = doc();
            for (name, shown) in [("ratelimit-policy", true), ("ratelimit", false)] {
                let header = answer
                    .response_headers_to_add
                    .iter()
                    .find(|h| h.key == name)
                    .unwrap_or_else(|| panic!("no {name}: {answer:?}"));
                let line = format!("{name}: {}", header.value);
                // `t` counts down in time; the policy is exact.
                let expected = if shown {
                    line.clone()
                } else {
                    line.split(";t=").next().unwrap().to_owned()
                };
                assert!(
                    doc.contains(&expected),
                    "docs/envoy.md should show `{line}`"
                );
            }
        }
        for (status, d) in answer.statuses.iter().zip(&descriptors) {
            assert!(status.current_limit.is_some(), "no rule meets {d:?}");
        }
    }

    // The checkout rule: 5 per minute per address, the sixth refused.
    let sample = &samples[0];
    let (_, limits) = routes
        .iter()
        .find(|(p, _)| sample.path.starts_with(p.as_str()))
        .unwrap();
    let descriptors: Vec<_> = limits
        .iter()
        .filter_map(|actions| descriptor_for(actions, sample))
        .collect();
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(
            should(&mut rls, request(&domain, descriptors.clone()))
                .await
                .overall_code,
        );
    }
    // Four more allowed (the first came in the loop above), then refused.
    assert_eq!(codes, [OK, OK, OK, OK, OVER_LIMIT]);
    let refused = should(&mut rls, request(&domain, descriptors)).await;
    assert_eq!(refused.overall_code, OVER_LIMIT);
    let names: Vec<_> = refused
        .statuses
        .iter()
        .map(|s| s.current_limit.as_ref().unwrap().name.clone())
        .collect();
    assert_eq!(names, ["checkout", "per_address"]);
    server.stop().await;
}

/// The token-budget file of section 5 passes `check-config`, and served, a check (hits 0)
/// passes, the stream-done call's 5,000 tokens are charged (`OK`, nothing left), and the next
/// check is refused for about the 240 s the page says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_budget_charges_what_the_stream_done_call_reports() {
    let rules = marked_yaml(&doc(), "llm");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llm.yaml");
    std::fs::write(&path, &rules).unwrap();
    let out = Command::new(FLOWGATE)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = TestServer::start(&[("llm.yaml", &rules)]).await;
    let mut client = server.rls().await;
    let call = |hits: u64| {
        let mut d = descriptor(&[("user", "ann")]);
        d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
        request("llm", vec![d])
    };
    assert_eq!(should(&mut client, call(0)).await.overall_code, OK);
    let charged = should(&mut client, call(5000)).await;
    assert_eq!(charged.overall_code, OK);
    assert_eq!(charged.statuses[0].limit_remaining, 0);
    let refused = should(&mut client, call(0)).await;
    assert_eq!(refused.overall_code, OVER_LIMIT);
    let retry = refused
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "retry-after")
        .map(|h| h.value.parse::<u64>().unwrap())
        .unwrap();
    assert!((230..=240).contains(&retry), "retry-after: {retry}");
    server.stop().await;
}
