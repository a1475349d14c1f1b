//! Bounds on input, each with its answer: request body size (413), descriptors per request,
//! entries per descriptor, key and value length (400 with a problem; gRPC
//! `INVALID_ARGUMENT` / `OUT_OF_RANGE`), header count and size (431 from the HTTP/1
//! parser, on the API and on the gateway). WebSocket message size (close 1009) is covered in
//! `websocket.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use flowgate_server::api::limits::{
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_DESCRIPTORS, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
};
use flowgate_testing::grpc::{descriptor, request};
use flowgate_testing::http::{http_post, parse};
use flowgate_testing::server::TestServer;
use flowgate_testing::upstream::{self, PASS_ALL, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const API: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
"#;

/// A `/v1/check` body with `descriptors` descriptors of `entries` entries (`key`, `value`).
fn check_body(descriptors: usize, entries: usize, key: &str, value: &str) -> String {
    let entry = format!(r#"{{"key":"{key}","value":"{value}"}}"#);
    let entries = vec![entry; entries].join(",");
    let descriptor = format!(r#"{{"entries":[{entries}]}}"#);
    let descriptors = vec![descriptor; descriptors].join(",");
    format!(r#"{{"domain":"api","descriptors":[{descriptors}]}}"#)
}

fn assert_problem(response: &flowgate_testing::server::HttpResponse, status: u16, detail: &str) {
    assert_eq!(response.status, status, "{}", response.body);
    assert_eq!(
        response.header("content-type"),
        Some("application/problem+json"),
        "{}",
        response.body
    );
    let json = response.json();
    assert_eq!(json["status"], status);
    assert!(
        json["detail"].as_str().unwrap().contains(detail),
        "{detail:?} not in {}",
        response.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_answers_each_bound_with_a_problem() {
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let long_key = "k".repeat(DEFAULT_MAX_KEY_BYTES + 1);
    let long_value = "v".repeat(DEFAULT_MAX_VALUE_BYTES + 1);
    for path in ["/v1/check", "/json"] {
        // At every bound: accepted.
        let at = server
            .post(path, &check_body(DEFAULT_MAX_DESCRIPTORS, 1, "user", "u"))
            .await;
        assert_eq!(at.status, 200, "{path}: {}", at.body);
        let at = server
            .post(path, &check_body(1, DEFAULT_MAX_ENTRIES, "user", "u"))
            .await;
        assert_eq!(at.status, 200, "{path}: {}", at.body);
        let key = "k".repeat(DEFAULT_MAX_KEY_BYTES);
        let value = "v".repeat(DEFAULT_MAX_VALUE_BYTES);
        assert_eq!(
            server
                .post(path, &check_body(1, 1, &key, &value))
                .await
                .status,
            200
        );
        // One past each: 400 with the bound named.
        let over = check_body(DEFAULT_MAX_DESCRIPTORS + 1, 1, "user", "u");
        assert_problem(&server.post(path, &over).await, 400, "65 descriptors");
        let over = check_body(1, DEFAULT_MAX_ENTRIES + 1, "user", "u");
        assert_problem(&server.post(path, &over).await, 400, "has 17 entries");
        let over = check_body(1, 1, &long_key, "u");
        assert_problem(&server.post(path, &over).await, 400, "the key is 257 bytes");
        let over = check_body(1, 1, "user", &long_value);
        assert_problem(
            &server.post(path, &over).await,
            400,
            "the value is 4097 bytes",
        );
        // A body past the limit: 413, unread.
        let huge = format!(
            r#"{{"domain":"api","descriptors":[],"pad":"{}"}}"#,
            "x".repeat(DEFAULT_MAX_BODY_BYTES)
        );
        // Over a raw connection that carries on when writing the unread rest fails.
        assert_problem(
            &parse(&http_post(server.http, path, &huge)),
            413,
            "the request body is over",
        );
    }
    // Still serving.
    assert_eq!(
        server
            .post("/v1/check", &check_body(1, 1, "user", "u"))
            .await
            .status,
        200
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refuses_requests_beyond_the_bounds() {
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let mut client = server.rls().await;
    let many = request(
        "api",
        vec![descriptor(&[("user", "u")]); DEFAULT_MAX_DESCRIPTORS + 1],
    );
    let status = client.should_rate_limit(many).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("65 descriptors"), "{status:?}");
    let long = "v".repeat(DEFAULT_MAX_VALUE_BYTES + 1);
    let status = client
        .should_rate_limit(request("api", vec![descriptor(&[("user", &long)])]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let huge = "v".repeat(DEFAULT_MAX_BODY_BYTES);
    let status = client
        .should_rate_limit(request("api", vec![descriptor(&[("user", &huge)])]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
    // The connection and the service are fine afterwards.
    let ok = flowgate_testing::grpc::should(
        &mut client,
        request("api", vec![descriptor(&[("user", "u")])]),
    )
    .await;
    assert_eq!(ok.overall_code, flowgate_testing::grpc::OK);
    server.stop().await;
}

/// Writes `head` and reads the status line of the answer (or `None` when the connection is
/// closed without one), within 5 s.
async fn status_of(addr: SocketAddr, head: &[u8]) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // The server may answer (and close) before it has read everything.
    let _ = stream.write_all(head).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while !out.windows(2).any(|w| w == b"\r\n") {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("an answer or a close within 5 s")
        {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&out);
    line.split(' ').nth(1).and_then(|s| s.parse().ok())
}

fn head_with(headers: usize, value_len: usize) -> Vec<u8> {
    let mut head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..headers {
        head.extend_from_slice(format!("x-h{i}: {}\r\n", "a".repeat(value_len)).as_bytes());
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    head
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_or_too_large_headers_get_431_on_the_api_and_the_gateway() {
    let upstream = Upstream::start().await;
    let server = upstream::gateway(PASS_ALL, &upstream.url()).await;
    let gateway = server.gateway.unwrap();
    for addr in [server.http, gateway] {
        let small = status_of(addr, &head_with(20, 10)).await;
        assert!(small.is_some_and(|s| s < 300), "{small:?}");
        // hyper's HTTP/1 parser: at most 100 header lines; a head of at most ~400 KiB.
        assert_eq!(status_of(addr, &head_with(150, 10)).await, Some(431));
        assert_eq!(status_of(addr, &head_with(1, 600 * 1024)).await, Some(431));
    }
    assert_eq!(
        upstream.accepted(),
        1,
        "only the small request reached the upstream"
    );
    server.stop().await;
}
