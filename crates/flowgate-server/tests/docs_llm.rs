//! `docs/llm-token-budgets.md`: the Flowgate file it shows is `docs/llm/llm.yaml` (which its
//! commands serve, `docs_commands.rs`, and the end-to-end test plays, `llm_token_budget.rs`),
//! and its Envoy route does what the guide says against a running server: the request path
//! checks with 0, the stream-done call charges the tokens, the next request is refused. The
//! Envoy Gateway cost reads the metadata the route's `format` names.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

use flowgate_testing::docs::{marked_yaml, read};
use flowgate_testing::grpc::{OK, OVER_LIMIT, Sample, descriptor_for, request, should};
use flowgate_testing::server::TestServer;

fn doc() -> String {
    read("docs/llm-token-budgets.md")
}

#[test]
fn the_guide_shows_the_file_its_commands_serve() {
    assert_eq!(
        marked_yaml(&doc(), "llm.yaml"),
        read("docs/llm/llm.yaml"),
        "the block under <!-- llm.yaml --> is docs/llm/llm.yaml"
    );
}

/// The route's `rate_limits` entries: (actions, stream done, `hits_addend`).
fn route() -> Vec<(Vec<Value>, bool, Value)> {
    let route: Value = serde_saphyr::from_str(&marked_yaml(&doc(), "envoy route")).unwrap();
    route["rate_limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["actions"].as_array().unwrap().clone(),
                entry["apply_on_stream_done"] == Value::Bool(true),
                entry["hits_addend"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn envoys_calls_check_then_charge_and_refuse_in_debt() {
    let server = TestServer::start(&[("llm.yaml", &read("docs/llm/llm.yaml"))]).await;
    let mut rls = server.rls().await;
    let entries = route();
    assert_eq!(entries.len(), 4, "a check and a charge per budget");
    let ann = Sample {
        path: "/v1/chat/completions",
        remote_address: "10.0.0.7",
        headers: &[("x-user", "ann")],
    };
    let descriptors = |stream_done: bool| {
        entries
            .iter()
            .filter(|(_, done, _)| *done == stream_done)
            .map(|(actions, _, hits)| {
                let d = descriptor_for(actions, &ann).unwrap();
                (d, hits.clone())
            })
            .collect::<Vec<_>>()
    };
    // Each charge has the same descriptor as a check.
    let checks = descriptors(false);
    let charges = descriptors(true);
    assert_eq!(
        checks.iter().map(|(d, _)| d).collect::<Vec<_>>(),
        charges.iter().map(|(d, _)| d).collect::<Vec<_>>()
    );
    for (_, hits) in &checks {
        assert_eq!(hits["number"], 0, "the request path only checks");
    }
    let check = |tokens_used: Option<u32>| {
        let set = if tokens_used.is_some() {
            &charges
        } else {
            &checks
        };
        let mut list = Vec::new();
        for (d, _) in set {
            let mut d = d.clone();
            // What Envoy puts in `hits_addend`: 0, or the tokens the format reads.
            d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value {
                value: tokens_used.unwrap_or(0).into(),
            });
            list.push(d);
        }
        request("llm", list)
    };
    let answer = should(&mut rls, check(None)).await;
    assert_eq!(answer.overall_code, OK, "{answer:?}");
    for status in &answer.statuses {
        assert!(
            status.current_limit.is_some(),
            "every descriptor meets a rule: {answer:?}"
        );
    }
    // The stream is done: 1,200 tokens, charged (Envoy ignores the answer; it is OK).
    let answer = should(&mut rls, check(Some(1200))).await;
    assert_eq!(answer.overall_code, OK, "{answer:?}");
    // The next request: the minute budget is 200 tokens in debt.
    let answer = should(&mut rls, check(None)).await;
    assert_eq!(answer.overall_code, OVER_LIMIT, "{answer:?}");
    assert_eq!(answer.statuses[0].code, OVER_LIMIT, "the minute budget");
    assert_eq!(answer.statuses[1].code, OK, "the day budget has room");
    server.stop().await;
}

#[test]
fn envoy_gateways_cost_reads_the_metadata_the_route_charges() {
    let cost: Value = serde_saphyr::from_str(&marked_yaml(&doc(), "envoy gateway cost")).unwrap();
    let cost = &cost["cost"];
    assert_eq!(cost["request"]["from"], "Number");
    assert_eq!(cost["request"]["number"], 0);
    assert_eq!(cost["response"]["from"], "Metadata");
    let metadata = &cost["response"]["metadata"];
    let named = format!(
        "%DYNAMIC_METADATA({}:{})%",
        metadata["namespace"].as_str().unwrap(),
        metadata["key"].as_str().unwrap()
    );
    for (_, stream_done, hits) in route() {
        if stream_done {
            assert_eq!(hits["format"], named.as_str());
        }
    }
}
