//! `GET /openapi.json` against the running server: real requests to every documented route,
//! each response's status, content type and body checked against the document (JSON bodies
//! with a JSON Schema validator), and every route of the document exercised.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use flowgate_server::api::AdminToken;
use flowgate_server::server::ServerConfig;
use flowgate_testing::server::TestServer;
use serde_json::Value;

const TOKEN: &str = "openapi-test-token";

const API: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1, name: per_user}
  - key: free
    rate_limit: {unlimited: true}
concurrency:
  - name: jobs
    limit: 1
"#;

/// A request to send (method, path, headers, body) and the status it must get.
type Request<'a> = (&'a str, String, Vec<(&'a str, String)>, String, u16);

/// The document's operation for `method` on the template `path` matches, and its template.
fn operation<'a>(doc: &'a Value, method: &str, path: &str) -> (&'a str, &'a Value) {
    let paths = doc["paths"].as_object().unwrap();
    let found = paths.iter().find(|(template, _)| matches(template, path));
    let (template, item) = found.unwrap_or_else(|| panic!("{path} is not in the document"));
    let op = &item[method.to_ascii_lowercase()];
    assert!(op.is_object(), "{method} {template} is not in the document");
    (template.as_str(), op)
}

/// Whether `path` fits `template`; the admin descriptor (`{descriptor}`, last) takes the rest
/// of the path: it spans segments.
fn matches(template: &str, path: &str) -> bool {
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    if p.len() < t.len() {
        return false;
    }
    for (i, part) in t.iter().enumerate() {
        let param = part.starts_with('{');
        if *part == "{descriptor}" && i == t.len() - 1 {
            return !p[i..].join("/").is_empty();
        }
        if !param && *part != p[i] {
            return false;
        }
    }
    t.len() == p.len()
}

/// Checks one response against the document; returns the route's `METHOD template`.
fn validate(
    doc: &Value,
    method: &str,
    path: &str,
    status: u16,
    content_type: &str,
    body: &str,
) -> String {
    let (template, op) = operation(doc, method, path);
    let what = format!("{method} {path} → {status}");
    let response = &op["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{what}: status not documented: {body}"
    );
    if status == 204 {
        assert!(
            body.is_empty() && response.get("content").is_none(),
            "{what}: a 204 has no content: {body}"
        );
        return format!("{method} {template}");
    }
    let media = content_type.split(';').next().unwrap().trim();
    let content = response["content"]
        .as_object()
        .unwrap_or_else(|| panic!("{what}: no content documented"));
    let (_, described) = content
        .iter()
        .find(|(documented, _)| documented.as_str() == media)
        .unwrap_or_else(|| {
            panic!(
                "{what}: content type {media} not documented (has {:?})",
                content.keys()
            )
        });
    if media.ends_with("json") {
        let instance: Value =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
        check_schema(doc, &described["schema"], &instance, &what);
    } else {
        assert!(!body.is_empty(), "{what}: empty body");
    }
    format!("{method} {template}")
}

/// Validates `instance` against `schema`, whose `$ref`s point into the document's components.
fn check_schema(doc: &Value, schema: &Value, instance: &Value, what: &str) {
    let mut schema = schema.clone();
    schema["components"] = doc["components"].clone();
    let validator =
        jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{what}: bad schema: {e}"));
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}: {errors:?}\nbody: {instance}");
}

/// `/dashboard/events` until an event's data satisfies `wanted` (within 10 s): status,
/// content type and that data.
fn event_where(server: &TestServer, wanted: impl Fn(&Value) -> bool) -> (u16, String, Value) {
    let mut conn = TcpStream::connect(server.http).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.write_all(
        b"GET /dashboard/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
    )
    .unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 8192];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|v| wanted(v));
        if let Some(data) = found {
            let status = text[9..12].parse().unwrap();
            let content_type = text
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-type:")
                        .map(|v| v.trim().to_owned())
                })
                .unwrap();
            return (status, content_type, data);
        }
        assert!(
            Instant::now() < deadline,
            "no such event within 10 s: {text}"
        );
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended: {text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_of_the_running_server_matches_openapi_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.yaml");
    std::fs::write(&path, API).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.admin_token = AdminToken::new(TOKEN).ok();
    let server = TestServer::start_with(config, dir, vec![path]).await;

    let document = server.get("/openapi.json").await;
    assert_eq!(document.status, 200);
    let doc = document.json();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );

    let auth = format!("Bearer {TOKEN}");
    let check = |value: &str| {
        format!(
            r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}]}}"#
        )
    };
    let json = |value: &str| {
        format!(
            r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}]}}"#
        )
    };
    let requests: Vec<Request<'_>> = vec![
        ("POST", "/v1/check".into(), vec![], check("a"), 200),
        ("POST", "/v1/check".into(), vec![], check("a"), 429),
        ("POST", "/v1/check".into(), vec![], "{".into(), 400),
        ("POST", "/json".into(), vec![], json("b"), 200),
        ("POST", "/json".into(), vec![], json("b"), 429),
        ("POST", "/json".into(), vec![], "[]".into(), 400),
        ("GET", "/healthz".into(), vec![], String::new(), 200),
        ("GET", "/readyz".into(), vec![], String::new(), 200),
        ("GET", "/metrics".into(), vec![], String::new(), 200),
        ("GET", "/v1/config".into(), vec![], String::new(), 200),
        ("GET", "/openapi.json".into(), vec![], String::new(), 200),
        (
            "GET",
            "/v1/keys/api/user=a".into(),
            vec![("authorization", auth.clone())],
            String::new(),
            200,
        ),
        (
            "GET",
            "/v1/keys/api/free=a".into(),
            vec![("authorization", auth.clone())],
            String::new(),
            200,
        ),
        (
            "GET",
            "/v1/keys/api/nope=a".into(),
            vec![("authorization", auth.clone())],
            String::new(),
            404,
        ),
        (
            "GET",
            "/v1/keys/api/user".into(),
            vec![("authorization", auth.clone())],
            String::new(),
            400,
        ),
        (
            "GET",
            "/v1/keys/api/user=a".into(),
            vec![],
            String::new(),
            401,
        ),
        (
            "GET",
            "/v1/keys/api/user=a".into(),
            vec![("authorization", "Bearer nope".into())],
            String::new(),
            403,
        ),
        (
            "DELETE",
            "/v1/keys/api/user=a".into(),
            vec![("authorization", auth.clone())],
            String::new(),
            200,
        ),
        (
            "GET",
            "/v1/keys/api?prefix=user%3D&limit=1".into(),
            vec![("authorization", auth.clone())],
            String::new(),
            200,
        ),
        (
            "GET",
            "/v1/keys/api?limit=0".into(),
            vec![("authorization", auth.clone())],
            String::new(),
            400,
        ),
        ("GET", "/v1/keys/api".into(), vec![], String::new(), 401),
        (
            "GET",
            "/v1/keys/api".into(),
            vec![("authorization", "Bearer nope".into())],
            String::new(),
            403,
        ),
        (
            "DELETE",
            "/v1/keys/api/user=a".into(),
            vec![],
            String::new(),
            401,
        ),
        ("GET", "/dashboard".into(), vec![], String::new(), 200),
        (
            "GET",
            "/dashboard/page.js".into(),
            vec![],
            String::new(),
            200,
        ),
        (
            "GET",
            "/dashboard/page.css".into(),
            vec![],
            String::new(),
            200,
        ),
        (
            "GET",
            "/dashboard/snapshot".into(),
            vec![],
            String::new(),
            200,
        ),
    ];
    let mut covered = BTreeSet::new();
    for (method, path, headers, body, status) in &requests {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let response = server.request_with(method, path, &headers, body).await;
        assert_eq!(
            response.status, *status,
            "{method} {path}: {}",
            response.body
        );
        let content_type = response
            .header("content-type")
            .unwrap_or_default()
            .to_owned();
        covered.insert(validate(
            &doc,
            method,
            path,
            response.status,
            &content_type,
            &response.body,
        ));
    }
    // Leases: the id the first answer gives is renewed and released.
    let lease = |method: &'static str, path: String, status: u16| {
        let server = &server;
        let doc = &doc;
        async move {
            let response = server.request(method, &path, "").await;
            assert_eq!(
                response.status, status,
                "{method} {path}: {}",
                response.body
            );
            let content_type = response
                .header("content-type")
                .unwrap_or_default()
                .to_owned();
            let route = validate(doc, method, &path, status, &content_type, &response.body);
            (route, response)
        }
    };
    let (route, granted) = lease("POST", "/v1/leases/jobs/k".into(), 201).await;
    covered.insert(route);
    let id = granted.json()["lease"].as_str().unwrap().to_owned();
    for (method, path, status) in [
        ("POST", "/v1/leases/jobs/k".to_owned(), 429),
        ("POST", "/v1/leases/nope/k".to_owned(), 404),
        ("GET", "/v1/leases/jobs/k".to_owned(), 200),
        ("PUT", format!("/v1/leases/jobs/k/{id}"), 200),
        ("PUT", "/v1/leases/jobs/k/not-an-id".to_owned(), 400),
        ("DELETE", format!("/v1/leases/jobs/k/{id}"), 204),
        ("DELETE", format!("/v1/leases/jobs/k/{id}"), 404),
        ("PUT", format!("/v1/leases/jobs/k/{id}"), 404),
    ] {
        covered.insert(lease(method, path, status).await.0);
    }
    // Bodies that are not declared JSON: 415 (sent raw, as the client above always says JSON).
    for path in ["/v1/check", "/json"] {
        let body = check("c");
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let response = flowgate_testing::http::exchange_raw(server.http, &request).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let status: u16 = head[9..12].parse().unwrap();
        assert_eq!(status, 415, "{response}");
        let content_type = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-type:")
                    .map(|v| v.trim().to_owned())
            })
            .unwrap();
        covered.insert(validate(&doc, "POST", path, status, &content_type, body));
    }
    // The event stream: its events' data are Snapshots; the denials above reach its top keys.
    let (status, content_type, snapshot) = event_where(&server, |s| {
        s["top_denied"].as_array().is_some_and(|t| !t.is_empty())
    });
    covered.insert(validate(
        &doc,
        "GET",
        "/dashboard/events",
        status,
        &content_type,
        "event stream",
    ));
    check_schema(
        &doc,
        &serde_json::json!({"$ref": "#/components/schemas/Snapshot"}),
        &snapshot,
        "snapshot event",
    );
    let keys: BTreeSet<&str> = snapshot["top_denied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from(["api/user=a", "api/user=b"]),
        "{snapshot}"
    );

    // The schemas have teeth: a snapshot missing its rules, or with a wrong type, fails.
    let mut schema = serde_json::json!({"$ref": "#/components/schemas/Snapshot"});
    schema["components"] = doc["components"].clone();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut broken = snapshot.clone();
    broken.as_object_mut().unwrap().remove("rules");
    assert!(!validator.is_valid(&broken));
    broken = snapshot.clone();
    broken["time_ms"] = Value::from("soon");
    assert!(!validator.is_valid(&broken));

    // Every route of the document was exercised.
    let documented: BTreeSet<String> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(template, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|m| ["get", "post", "delete", "put", "patch"].contains(&m.as_str()))
                .map(move |m| format!("{} {template}", m.to_ascii_uppercase()))
        })
        .collect();
    assert_eq!(
        documented, covered,
        "every documented route is tested, and only those"
    );
    server.stop().await;
}
