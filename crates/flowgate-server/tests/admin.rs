//! The admin endpoints over real HTTP: `GET /v1/keys/{domain}/{key}={value}/…` inspects a
//! counter and `DELETE` resets it, behind `Authorization: Bearer <FLOWGATE_ADMIN_TOKEN>`;
//! refused without the token, with a wrong one, and disabled (never open) when the variable is
//! unset — through `ServerConfig` and through the binary's environment.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flowgate_server::api::AdminToken;
use flowgate_server::server::ServerConfig;
use flowgate_testing::binary::Serving;
use flowgate_testing::server::{HttpResponse, TestServer};

const TOKEN: &str = "correct horse battery staple";

const API: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
"#;

async fn server(token: Option<&str>) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.yaml");
    std::fs::write(&path, API).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.admin_token = token.map(|t| AdminToken::new(t).unwrap());
    TestServer::start_with(config, dir, vec![path]).await
}

fn check(key: &str, value: &str) -> String {
    let value = serde_json::to_string(value).unwrap();
    format!(
        r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"{key}","value":{value}}}]}}]}}"#
    )
}

fn assert_problem(response: &HttpResponse, status: u16, type_end: &str) {
    assert_eq!(response.status, status, "{}", response.body);
    assert_eq!(
        response.header("content-type"),
        Some("application/problem+json")
    );
    let body = response.json();
    assert_eq!(body["status"], status, "{body}");
    assert!(body["type"].as_str().unwrap().ends_with(type_end), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_variable_the_endpoints_are_disabled_for_everyone() {
    let server = server(None).await;
    for method in ["GET", "DELETE"] {
        for auth in [&[][..], &[("authorization", "Bearer anything")][..]] {
            let response = server
                .request_with(method, "/v1/keys/api/user=u", auth, "")
                .await;
            assert_problem(&response, 404, "/admin-disabled");
            assert!(
                response.body.contains("FLOWGATE_ADMIN_TOKEN"),
                "{}",
                response.body
            );
        }
    }
    // An empty token is refused (too short).
    assert!(AdminToken::new("").is_err());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_token_is_refused_and_touches_nothing() {
    let server = server(Some(TOKEN)).await;
    for _ in 0..3 {
        server.post("/v1/check", &check("user", "u")).await;
    }
    let wrong = [
        format!("Bearer {TOKEN}x"),
        format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]),
        "Bearer wrong-token".to_owned(),
    ];
    for method in ["GET", "DELETE"] {
        let none = server
            .request_with(method, "/v1/keys/api/user=u", &[], "")
            .await;
        assert_problem(&none, 401, "/unauthorized");
        assert_eq!(
            none.header("www-authenticate"),
            Some("Bearer realm=\"flowgate-admin\"")
        );
        let basic = format!("Basic {TOKEN}");
        let other_scheme = server
            .request_with(
                method,
                "/v1/keys/api/user=u",
                &[("authorization", &basic)],
                "",
            )
            .await;
        assert_problem(&other_scheme, 401, "/unauthorized");
        for auth in &wrong {
            let response = server
                .request_with(
                    method,
                    "/v1/keys/api/user=u",
                    &[("authorization", auth)],
                    "",
                )
                .await;
            assert_problem(&response, 403, "/forbidden");
            assert!(!response.body.contains(TOKEN), "the token is never echoed");
        }
    }
    // No refused DELETE reset the counter: the user is still limited.
    assert_eq!(
        server.post("/v1/check", &check("user", "u")).await.status,
        429
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_token_a_counter_is_inspected_and_reset() {
    let server = server(Some(TOKEN)).await;
    let auth = format!("bearer {TOKEN}"); // the scheme is case-insensitive
    let auth = [("authorization", auth.as_str())];
    for _ in 0..2 {
        assert_eq!(
            server.post("/v1/check", &check("user", "ann")).await.status,
            200
        );
    }
    let seen = server
        .request_with("GET", "/v1/keys/api/user=ann", &auth, "")
        .await;
    assert_eq!(seen.status, 200, "{}", seen.body);
    assert_eq!(seen.header("cache-control"), Some("no-store"));
    let body = seen.json();
    assert_eq!(body["domain"], "api");
    assert_eq!(
        body["descriptor"],
        serde_json::json!([{"key": "user", "value": "ann"}])
    );
    assert_eq!(body["rule"], "user");
    assert_eq!(body["name"], "per_user");
    assert_eq!(body["counted"], true);
    assert_eq!(body["algorithm"], "gcra");
    assert_eq!(
        (body["limit"].as_u64(), body["burst"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(body["remaining"], 1, "{body}");
    assert!(body["reset_after_ms"].as_u64().unwrap() > 0, "{body}");
    assert!(
        body["key"]
            .as_str()
            .unwrap()
            .starts_with("api|user=ann#gcra:3:"),
        "{body}"
    );
    // Inspecting takes nothing.
    let again = server
        .request_with("GET", "/v1/keys/api/user=ann", &auth, "")
        .await;
    assert_eq!(again.json()["remaining"], 1);
    assert_eq!(
        server.post("/v1/check", &check("user", "ann")).await.status,
        200
    );
    assert_eq!(
        server.post("/v1/check", &check("user", "ann")).await.status,
        429
    );

    let reset = server
        .request_with("DELETE", "/v1/keys/api/user=ann", &auth, "")
        .await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert_eq!(reset.json()["remaining"], 3);
    assert_eq!(
        server.post("/v1/check", &check("user", "ann")).await.status,
        200
    );
    // Only that counter: another user's is untouched.
    server.post("/v1/check", &check("user", "bob")).await;
    let bob = server
        .request_with("GET", "/v1/keys/api/user=bob", &auth, "")
        .await;
    assert_eq!(bob.json()["remaining"], 2);

    // A value with `/` and spaces, percent-encoded in the path.
    assert_eq!(
        server
            .post("/v1/check", &check("path", "/a b"))
            .await
            .status,
        200
    );
    let path = server
        .request_with("GET", "/v1/keys/api/path=%2Fa%20b", &auth, "")
        .await;
    assert_eq!(path.status, 200, "{}", path.body);
    assert_eq!(path.json()["descriptor"][0]["value"], "/a b");
    assert_eq!(path.json()["remaining"], 0);

    // Uncounted rules say so; unmatched descriptors and malformed paths are problems.
    let free = server
        .request_with("GET", "/v1/keys/api/free=x", &auth, "")
        .await;
    assert_eq!(free.status, 200);
    assert_eq!(free.json()["counted"], false);
    assert!(free.json().get("remaining").is_none());
    let none = server
        .request_with("GET", "/v1/keys/api/nope=x", &auth, "")
        .await;
    assert_problem(&none, 404, "/no-rule");
    let unknown = server
        .request_with("GET", "/v1/keys/other/user=x", &auth, "")
        .await;
    assert_problem(&unknown, 404, "/no-rule");
    // (`/v1/keys/api`, a domain alone, lists its counters: tests/usage.rs.)
    for bad in [
        "/v1/keys/%FF",
        "/v1/keys/api/user",
        "/v1/keys/api/=x",
        "/v1/keys/api/user=%FF",
    ] {
        let response = server.request_with("GET", bad, &auth, "").await;
        assert_problem(&response, 400, "/bad-request");
    }
    server.stop().await;
}

/// The binary reads the token from `FLOWGATE_ADMIN_TOKEN`, and without it keeps the endpoints
/// disabled.
#[test]
fn the_binary_takes_the_token_from_its_environment() {
    for token in [Some(TOKEN), None] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flowgate"));
        command
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .env_remove("FLOWGATE_ADMIN_TOKEN")
            .stdout(Stdio::null());
        if let Some(token) = token {
            command.env("FLOWGATE_ADMIN_TOKEN", token);
        }
        let mut serving = Serving::start(&mut command);
        let http = serving.http;
        let request = format!(
            "GET /v1/keys/default/user=u HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        );
        let response = flowgate_testing::http::exchange_raw(http, &request).unwrap();
        let _ = serving.child.kill();
        serving.wait_exit(Duration::from_secs(10));
        let log = serving.log();
        assert!(!log.contains(TOKEN), "the token is never logged: {log}");
        match token {
            Some(_) => assert!(response.starts_with("HTTP/1.1 200"), "{response}"),
            None => assert!(response.starts_with("HTTP/1.1 404"), "{response}"),
        }
    }
}

/// `flowgate serve` with `FLOWGATE_ADMIN_TOKEN=token` on ports the system picks, serving.
fn serve_with_token(token: &str) -> Serving {
    Serving::start(
        Command::new(env!("CARGO_BIN_EXE_flowgate"))
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .env("FLOWGATE_ADMIN_TOKEN", token)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null()),
    )
}

fn admin_get(http: std::net::SocketAddr, token: &str) -> String {
    let request = format!(
        "GET /v1/keys/default/user=u HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    flowgate_testing::http::exchange_raw(http, &request).unwrap()
}

/// A token too short to be safe, or one no header could carry, stops the server before it
/// serves anything: the error names the variable and never shows the value.
#[test]
fn a_short_or_unusable_token_stops_the_server_with_an_error_that_never_shows_it() {
    for (token, says) in [
        (
            "Hunter2",
            "FLOWGATE_ADMIN_TOKEN is 7 bytes long; it must be at least 16",
        ),
        (
            "Hunter2\n",
            "FLOWGATE_ADMIN_TOKEN is 7 bytes long; it must be at least 16",
        ),
        (
            "Hunter2-Hunter2-\u{7}bell",
            "FLOWGATE_ADMIN_TOKEN has a byte that an HTTP header cannot carry",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_flowgate"))
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .env("FLOWGATE_ADMIN_TOKEN", token)
            .env("RUST_LOG", "debug")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{token:?}: {out:?}");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(log.contains(says), "{token:?}: {log}");
        assert!(!log.contains("Hunter2"), "the token is shown: {log}");
        assert!(!log.contains("flowgate serving"), "it served: {log}");
    }
}

/// A token read from a file (a Kubernetes Secret) ends with a newline that no request can
/// present: it is removed, the log says so (not the token), and the token works.
#[test]
fn a_token_with_a_trailing_newline_is_trimmed_said_so_and_works() {
    for stored in [format!("{TOKEN}\n"), format!("{TOKEN}\r\n")] {
        let served = serve_with_token(&stored);
        let answer = admin_get(served.http, TOKEN);
        let log = served.log();
        drop(served);
        assert!(answer.starts_with("HTTP/1.1 200"), "{stored:?}: {answer}");
        let line = log
            .lines()
            .find(|l| l.contains("surrounding whitespace removed"))
            .unwrap_or_else(|| panic!("no line about the newline: {log}"));
        assert!(
            line.contains("FLOWGATE_ADMIN_TOKEN") && line.contains("trailing_newline=true"),
            "{line}"
        );
        assert!(!log.contains(TOKEN), "the token is logged: {log}");
    }
}

/// Refused attempts are logged at WARN with the client's address and why — within a budget,
/// so that a flood of wrong tokens cannot flood the log.
#[test]
fn refused_admin_attempts_are_logged_with_the_client_address_and_cannot_flood_the_log() {
    let served = serve_with_token(TOKEN);
    let http = served.http;
    let started = Instant::now();
    let attempts = 60;
    for i in 0..attempts {
        let guess = format!("guess-{i:04}-0123456789");
        assert!(admin_get(http, &guess).starts_with("HTTP/1.1 403"));
    }
    let request = "GET /v1/keys/default/user=u HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert!(
        flowgate_testing::http::exchange_raw(http, request)
            .unwrap()
            .starts_with("HTTP/1.1 401")
    );
    let elapsed = started.elapsed();
    // Flushed as written; give the last line a moment.
    std::thread::sleep(Duration::from_millis(100));
    let log = served.log();
    drop(served);
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("admin: refused"))
        .collect();
    let budget = flowgate_server::api::REFUSALS_LOGGED_PER_MINUTE as usize;
    // The burst, and one more line for each 60 / budget seconds the flood took.
    let allowed = budget + (elapsed.as_secs() as usize * budget) / 60 + 1;
    assert!(
        (budget..=allowed).contains(&refused.len()),
        "{} lines for {attempts} refusals in {elapsed:?}:\n{log}",
        refused.len()
    );
    for line in &refused {
        assert!(line.contains(" WARN "), "{line}");
        assert!(line.contains("client=127.0.0.1"), "{line}");
        assert!(line.contains(r#"reason="wrong bearer token""#), "{line}");
        assert!(
            !line.contains("user=u"),
            "descriptor values are not logged: {line}"
        );
    }
    assert!(!log.contains("guess-"), "presented tokens are never logged");
}
