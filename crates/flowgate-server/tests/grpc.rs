//! ShouldRateLimit over real gRPC (tonic client, loopback): every matching rule of
//! envoyproxy/ratelimit, unlimited / shadow / blocklist / replaces, hits_addend, overrides,
//! response fields and headers, several domains in several files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::google::protobuf::UInt64Value;
use flowgate_testing::grpc::{OK, OVER_LIMIT, descriptor, request, should};
use flowgate_testing::server::TestServer;
use flowgate_testing::window::{HOUR, MINUTE, in_one_window};

const EDGE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: remote_address
    value: "10.0.0.9"
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window, name: api}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
    descriptors:
      - key: route
        value: "/upload"
        rate_limit: {unit: hour, requests_per_unit: 1, algorithm: fixed_window}
  - key: partner
    value: trusted
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window, name: per_user}
  - key: plan
    value: premium
    rate_limit:
      unit: minute
      requests_per_unit: 50
      algorithm: fixed_window
      replaces: [{name: per_user}]
"#;

async fn edge() -> TestServer {
    TestServer::start(&[("edge.yaml", EDGE)]).await
}

fn codes(r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_only_rules_count_each_value_and_key_value_beats_key_only() {
    // The counts hold within one minute of the fixed windows (aligned to the wall clock):
    // a sequence the minute's end cut runs again, on a fresh server.
    in_one_window(&[MINUTE], async |_| {
        let server = edge().await;
        let mut rls = server.rls().await;
        let ip = |v: &str| request("edge", vec![descriptor(&[("remote_address", v)])]);
        for remaining in [2, 1, 0] {
            let r = should(&mut rls, ip("10.0.0.1")).await;
            assert_eq!(r.overall_code, OK);
            let status = &r.statuses[0];
            assert_eq!(status.limit_remaining, remaining);
            let limit = status.current_limit.as_ref().unwrap();
            assert_eq!(
                (limit.requests_per_unit, limit.unit),
                (3, 2),
                "3 per MINUTE"
            );
            let reset = status.duration_until_reset.unwrap();
            assert!(reset.seconds <= 60 && (reset.seconds > 0 || reset.nanos > 0));
        }
        let denied = should(&mut rls, ip("10.0.0.1")).await;
        assert_eq!(
            (denied.overall_code, codes(&denied)),
            (OVER_LIMIT, vec![OVER_LIMIT])
        );
        // Another value has its own counter.
        assert_eq!(should(&mut rls, ip("10.0.0.2")).await.overall_code, OK);
        // The key+value rule wins for 10.0.0.9: 1 per minute.
        assert_eq!(should(&mut rls, ip("10.0.0.9")).await.overall_code, OK);
        assert_eq!(
            should(&mut rls, ip("10.0.0.9")).await.overall_code,
            OVER_LIMIT
        );
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_depth_and_unmatched_descriptors() {
    // The counts hold within one minute (`/api/*`) and one hour (`/upload`) of the fixed
    // windows: a sequence a boundary cut runs again, on a fresh server.
    in_one_window(&[MINUTE, HOUR], async |_| {
        let server = edge().await;
        let mut rls = server.rls().await;
        // `/api/*` is one rule with one counter per path value.
        for path in ["/api/a", "/api/a"] {
            let r = should(
                &mut rls,
                request("edge", vec![descriptor(&[("path", path)])]),
            )
            .await;
            assert_eq!(r.overall_code, OK);
            assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "api");
        }
        let r = should(
            &mut rls,
            request("edge", vec![descriptor(&[("path", "/api/a")])]),
        )
        .await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        let r = should(
            &mut rls,
            request("edge", vec![descriptor(&[("path", "/web")])]),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        assert!(r.statuses[0].current_limit.is_none(), "no rule: no limit");
        // Depth: tenant alone and tenant+route/upload have their own limits; a deeper or
        // different route matches nothing.
        let upload = || descriptor(&[("tenant", "t1"), ("route", "/upload")]);
        assert_eq!(
            should(&mut rls, request("edge", vec![upload()]))
                .await
                .overall_code,
            OK
        );
        assert_eq!(
            should(&mut rls, request("edge", vec![upload()]))
                .await
                .overall_code,
            OVER_LIMIT
        );
        let tenant = should(
            &mut rls,
            request("edge", vec![descriptor(&[("tenant", "t1")])]),
        )
        .await;
        assert_eq!(tenant.statuses[0].limit_remaining, 99);
        let other = should(
            &mut rls,
            request(
                "edge",
                vec![descriptor(&[("tenant", "t1"), ("route", "/other")])],
            ),
        )
        .await;
        assert!(other.statuses[0].current_limit.is_none());
        let deeper = should(
            &mut rls,
            request(
                "edge",
                vec![descriptor(&[
                    ("tenant", "t1"),
                    ("route", "/upload"),
                    ("x", "y"),
                ])],
            ),
        )
        .await;
        assert!(deeper.statuses[0].current_limit.is_none());
        // Unknown domain: everything is allowed.
        let unknown = should(
            &mut rls,
            request("nope", vec![descriptor(&[("remote_address", "a")])]),
        )
        .await;
        assert_eq!(unknown.overall_code, OK);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_blocklist_shadow_and_replaces() {
    let server = edge().await;
    let mut rls = server.rls().await;
    for _ in 0..5 {
        let r = should(
            &mut rls,
            request("edge", vec![descriptor(&[("partner", "trusted")])]),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    }
    let banned = should(
        &mut rls,
        request("edge", vec![descriptor(&[("banned", "x")])]),
    )
    .await;
    assert_eq!(banned.overall_code, OVER_LIMIT);
    assert_eq!(
        banned.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
    // A blocklist rule has no quota: its policy advertises q=0 over its unit.
    let header = |name: &str| {
        banned
            .response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    assert_eq!(
        header("ratelimit-policy").as_deref(),
        Some("\"banned\";q=0;w=1")
    );
    assert_eq!(header("ratelimit").as_deref(), Some("\"banned\";r=0;t=1"));
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    // Shadow mode: over the limit on the second call, but OK.
    for _ in 0..3 {
        let r = should(
            &mut rls,
            request("edge", vec![descriptor(&[("trial", "t")])]),
        )
        .await;
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![OK]));
    }
    // premium replaces per_user: the user's limit of 2 is not consulted or counted.
    let both = || {
        request(
            "edge",
            vec![
                descriptor(&[("user", "u1")]),
                descriptor(&[("plan", "premium")]),
            ],
        )
    };
    for _ in 0..4 {
        let r = should(&mut rls, both()).await;
        assert_eq!(r.overall_code, OK);
        assert!(r.statuses[0].current_limit.is_none(), "replaced");
    }
    let alone = should(
        &mut rls,
        request("edge", vec![descriptor(&[("user", "u1")])]),
    )
    .await;
    assert_eq!(
        alone.statuses[0].limit_remaining, 1,
        "untouched by the replaced calls"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_rules_and_limit_overrides() {
    // The counts hold within one hour of the fixed windows: a sequence the hour's end cut runs
    // again, on a fresh server.
    in_one_window(&[HOUR], async |_| {
        let server = edge().await;
        let mut rls = server.rls().await;
        let tenant = |hits: Option<u64>| {
            let mut d = descriptor(&[("tenant", "h")]);
            d.hits_addend = hits.map(|value| UInt64Value { value });
            d
        };
        // Request-level 0 means 1.
        let r = should(&mut rls, request("edge", vec![tenant(None)])).await;
        assert_eq!(r.statuses[0].limit_remaining, 99);
        // Request-level 10.
        let mut req = request("edge", vec![tenant(None)]);
        req.hits_addend = 10;
        assert_eq!(should(&mut rls, req).await.statuses[0].limit_remaining, 89);
        // The descriptor's own hits_addend wins over the request's.
        let mut req = request("edge", vec![tenant(Some(5))]);
        req.hits_addend = 10;
        assert_eq!(should(&mut rls, req).await.statuses[0].limit_remaining, 84);
        // A descriptor hits_addend of 0 only looks.
        let mut req = request("edge", vec![tenant(Some(0))]);
        req.hits_addend = 10;
        assert_eq!(should(&mut rls, req).await.statuses[0].limit_remaining, 84);
        // More than the limit can ever grant: over the limit.
        let r = should(&mut rls, request("edge", vec![tenant(Some(1000))])).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        // A limit override replaces the configured rule: 1 per hour (RateLimitUnit HOUR = 3).
        let mut over = descriptor(&[("tenant", "o")]);
        over.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 3,
        });
        let r = should(&mut rls, request("edge", vec![over.clone()])).await;
        assert_eq!(r.overall_code, OK);
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (1, 3));
        assert_eq!(
            should(&mut rls, request("edge", vec![over]))
                .await
                .overall_code,
            OVER_LIMIT
        );
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_status_per_descriptor_ietf_headers_and_denials_consume_nothing() {
    // The counts hold within one minute (the address) and one hour (`tenant`) of the fixed
    // windows: a sequence a boundary cut runs again, on a fresh server.
    in_one_window(&[MINUTE, HOUR], async |_| {
        let server = edge().await;
        let mut rls = server.rls().await;
        let req = || {
            request(
                "edge",
                vec![
                    descriptor(&[("tenant", "z")]),
                    descriptor(&[("remote_address", "10.0.0.9")]),
                    descriptor(&[("nothing", "x")]),
                ],
            )
        };
        let r = should(&mut rls, req()).await;
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![OK, OK, OK]));
        let headers: Vec<(String, String)> = r
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        assert_eq!(headers[0].0, "ratelimit-policy");
        assert_eq!(
            headers[0].1,
            "\"tenant\";q=100;w=3600, \"remote_address_10.0.0.9\";q=1;w=60"
        );
        assert_eq!(headers[1].0, "ratelimit");
        assert!(
            headers[1].1.starts_with("\"tenant\";r=99;t="),
            "{headers:?}"
        );
        let r = should(&mut rls, req()).await;
        assert_eq!(
            (r.overall_code, codes(&r)),
            (OVER_LIMIT, vec![OK, OVER_LIMIT, OK])
        );
        let retry = r
            .response_headers_to_add
            .iter()
            .find(|h| h.key == "retry-after")
            .unwrap();
        let secs: u64 = retry.value.parse().unwrap();
        assert!((1..=60).contains(&secs));
        // The denied request's unit on `tenant` was given back.
        let t = should(
            &mut rls,
            request("edge", vec![descriptor(&[("tenant", "z")])]),
        )
        .await;
        assert_eq!(t.statuses[0].limit_remaining, 98);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_domains_in_three_files_and_invalid_requests() {
    let files = [
        (
            "a.yaml",
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        ),
        (
            "b.yaml",
            "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
        ),
        (
            "c.yaml",
            "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
        ),
    ];
    let server = TestServer::start(&files).await;
    let mut rls = server.rls().await;
    for (domain, limit) in [("a", 1), ("b", 2), ("c", 3)] {
        let r = should(&mut rls, request(domain, vec![descriptor(&[("k", "v")])])).await;
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            limit
        );
    }
    let empty_domain = rls
        .should_rate_limit(request("", vec![descriptor(&[("k", "v")])]))
        .await
        .unwrap_err();
    assert_eq!(empty_domain.code(), tonic::Code::InvalidArgument);
    let no_descriptors = rls
        .should_rate_limit(request("a", vec![]))
        .await
        .unwrap_err();
    assert_eq!(no_descriptors.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

/// The gRPC server runs tonic's generated service straight on hyper's HTTP/2 connection: other
/// methods and services of the same connection are answered `UNIMPLEMENTED` (12), a request
/// whose body is not one whole gRPC message `INTERNAL` (13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_methods_are_unimplemented_and_truncated_bodies_fail() {
    let server = edge().await;
    let tcp = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let grpc_status = async |client: &mut h2::client::SendRequest<bytes::Bytes>,
                             path: &str,
                             body: &'static [u8]| {
        let request = http::Request::post(format!("http://{}{path}", server.grpc))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        // The server may answer an unknown method at once, before the message, and reset the
        // stream (NO_ERROR): then h2 refuses the data (`InactiveStreamId`). That is allowed
        // only for an answer that did not need the message (checked below).
        let sent = send.send_data(bytes::Bytes::from_static(body), true);
        let response = response.await.unwrap();
        assert_eq!(response.status(), 200);
        let (parts, mut body) = response.into_parts();
        // Trailers-only answers carry grpc-status in the headers; others in the trailers.
        let status = match parts.headers.get("grpc-status") {
            Some(status) => status.to_str().unwrap().to_owned(),
            None => {
                while let Some(chunk) = body.data().await {
                    chunk.unwrap();
                }
                let trailers = body.trailers().await.unwrap().unwrap();
                trailers["grpc-status"].to_str().unwrap().to_owned()
            }
        };
        if let Err(e) = sent {
            assert_eq!(
                status, "12",
                "{path}: the message was refused ({e}) before the answer"
            );
        }
        status
    };
    // {domain: "edge", descriptors: [{user: u}]}, as one length-prefixed message.
    const CALL: &[u8] = b"\x00\x00\x00\x00\x13\x0a\x04edge\x12\x0b\x0a\x09\x0a\x04user\x12\x01u";
    let rls = "/envoy.service.ratelimit.v3.RateLimitService";
    assert_eq!(
        grpc_status(&mut client, &format!("{rls}/ShouldRateLimit"), CALL).await,
        "0"
    );
    assert_eq!(
        grpc_status(&mut client, &format!("{rls}/Other"), CALL).await,
        "12"
    );
    assert_eq!(
        grpc_status(&mut client, "/grpc.health.v1.Health/Check", b"").await,
        "12"
    );
    assert_eq!(
        grpc_status(&mut client, &format!("{rls}/ShouldRateLimit"), &CALL[..9]).await,
        "13"
    );
    server.stop().await;
}
