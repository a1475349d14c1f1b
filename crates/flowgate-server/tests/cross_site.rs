//! A web page can make a browser send a "simple" cross-origin `POST` — `text/plain`, a form,
//! `multipart/form-data`, or no type — without a CORS preflight. `POST /v1/check` and
//! `POST /json` refuse all of them (415, problem+json) before reading the body, so such a page
//! spends nothing; `application/json` (which needs a preflight the API never grants) works.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use flowgate_testing::http::exchange_raw;
use flowgate_testing::server::TestServer;

const API: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

const BODY: &str =
    r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"victim"}]}]}"#;

/// `POST path` with `content_type` (none when `None`), over a fresh connection: the status
/// and the whole response.
fn post(server: &TestServer, path: &str, content_type: Option<&str>) -> (u16, String) {
    let header = content_type.map_or(String::new(), |t| format!("Content-Type: {t}\r\n"));
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\nConnection: close\r\n{header}Content-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let response = exchange_raw(server.http, &request).unwrap();
    (response[9..12].parse().unwrap(), response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_cross_site_posts_are_refused_and_spend_nothing() {
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let simple = [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ];
    for path in ["/v1/check", "/json"] {
        for content_type in simple {
            let (status, response) = post(&server, path, content_type);
            assert_eq!(status, 415, "{path} {content_type:?}: {response}");
            assert!(
                response
                    .to_ascii_lowercase()
                    .contains("content-type: application/problem+json"),
                "{response}"
            );
            assert!(response.contains("unsupported-media-type"), "{response}");
            assert!(
                !response
                    .to_ascii_lowercase()
                    .contains("access-control-allow"),
                "no CORS grant: {response}"
            );
        }
    }
    // Nothing was spent: the victim still has its whole quota of 2.
    let json = "application/json; charset=utf-8";
    assert_eq!(post(&server, "/v1/check", Some(json)).0, 200);
    assert_eq!(post(&server, "/json", Some("Application/JSON")).0, 200);
    assert_eq!(post(&server, "/v1/check", Some("application/json")).0, 429);
    assert_eq!(
        server
            .metric(r#"flowgate_hits_total{domain="api",rule="user"}"#)
            .await,
        3.0
    );
    // Other methods and routes are untouched by the guard.
    assert_eq!(server.get("/v1/check").await.status, 405);
    assert_eq!(server.get("/healthz").await.status, 200);
    server.stop().await;
}
