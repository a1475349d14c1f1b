//! Secrets never leave the process: a run of the real binary with a Redis password and an
//! HS256 secret, driven through every API, a Redis outage and a failed start, never shows
//! either in its logs (at `debug`), its error responses, `/v1/config`, `/readyz` or `/metrics`.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use flowgate_testing::binary::Serving;
use flowgate_testing::http::{http_get, http_post};
use flowgate_testing::net::ClosedPort;
use flowgate_testing::redis::RedisServer;

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");
const PASSWORD: &str = "Pw-7f3a9c1e-redis";
const JWT_SECRET: &str = "Jwt-b41d0e77-secret";

/// The whole answer to `request` sent on a new connection (empty if none came).
fn exchange(addr: SocketAddr, request: &str) -> String {
    let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return String::new();
    };
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer
}

fn assert_secret_free(what: &str, text: &str) {
    for secret in [PASSWORD, JWT_SECRET] {
        assert!(!text.contains(secret), "{what} shows a secret:\n{text}");
    }
}

#[test]
fn no_secret_in_logs_errors_config_or_metrics() {
    let what = "no_secret_in_logs_errors_config_or_metrics";
    // The password is set once the server runs (the helper's readiness probe has none).
    let Some(mut redis) = RedisServer::start(what) else {
        return;
    };
    let protect = |redis: &RedisServer| {
        assert_eq!(
            redis
                .cli(&["CONFIG", "SET", "requirepass", PASSWORD])
                .trim(),
            "OK"
        );
    };
    protect(&redis);
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", redis.port);
    let mut outputs = Vec::new();

    // A wrong password and an unreachable Redis: both fail to start, quoting the URL redacted.
    let wrong = format!("redis://:{PASSWORD}x@127.0.0.1:{}", redis.port);
    let closed = ClosedPort::new();
    let nowhere = format!("redis://:{PASSWORD}@{}", closed.addr());
    for bad in [&wrong, &nowhere] {
        let out = Command::new(FLOWGATE)
            .args(["serve", "--redis", bad, "--redis-timeout", "300ms"])
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .env("RUST_LOG", "debug")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("cannot connect to Redis at"), "{text}");
        assert!(text.contains(":***@127.0.0.1"), "{text}");
        outputs.push((format!("failed start with {bad}"), text.into_owned()));
    }

    // A running server with both secrets.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("edge.yaml");
    std::fs::write(
        &config,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100, fail: closed}\n  - key: plan\n    rate_limit: {unit: minute, requests_per_unit: 100}\ngateway:\n  jwt: {hs256_secret_env: FLOWGATE_TEST_JWT_SECRET}\n  descriptors:\n    - [{key: remote_address}]\n    - [{key: jwt_claim, claim: plan, as: plan}]\n",
    )
    .unwrap();
    // The upstream is a port nothing listens on: the gateway's 502 is one of the errors read.
    let upstream = ClosedPort::new();
    let mut serving = Serving::start(
        Command::new(FLOWGATE)
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--redis", &url, "--redis-timeout", "200ms"])
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(["--upstream", &format!("http://{}", upstream.addr())])
            .args(["--gateway", "127.0.0.1:0", "--drain-period", "0s"])
            .env("RUST_LOG", "debug")
            .env("FLOWGATE_TEST_JWT_SECRET", JWT_SECRET)
            .stdout(std::fs::File::create(dir.path().join("stdout")).unwrap()),
    );
    let (http, gateway) = (serving.http, serving.gateway.unwrap());
    let mut answers = Vec::new();
    let check = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}"#;
    let read_everything = |answers: &mut Vec<(String, String)>| {
        for path in ["/v1/config", "/readyz", "/metrics", "/v1/nowhere"] {
            answers.push((path.to_owned(), http_get(http, path).unwrap_or_default()));
        }
        answers.push(("/v1/check".into(), http_post(http, "/v1/check", check)));
        answers.push((
            "/v1/check, bad JSON".into(),
            http_post(http, "/v1/check", "{\"domain\": 7"),
        ));
        answers.push(("/json, bad JSON".into(), http_post(http, "/json", "[]")));
        for token in ["not.a.token", "eyJhbGciOiJIUzI1NiJ9.eyJwbGFuIjoieCJ9.c2ln"] {
            answers.push((
                format!("gateway with token {token}"),
                exchange(
                    gateway,
                    &format!(
                        "GET /x HTTP/1.1\r\nHost: app\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
                    ),
                ),
            ));
        }
    };
    read_everything(&mut answers);
    assert!(
        answers.iter().any(|(_, a)| a.starts_with("HTTP/1.1 502")),
        "the gateway's error was read: {answers:?}"
    );
    // Redis goes away: reconnect errors, fallback decisions (a 503 for `fail: closed`).
    redis.kill();
    for _ in 0..3 {
        read_everything(&mut answers);
    }
    assert!(
        answers
            .iter()
            .any(|(what, a)| what == "/v1/check" && a.starts_with("HTTP/1.1 503")),
        "a store error was answered: {answers:?}"
    );
    redis.restart();
    protect(&redis);
    read_everything(&mut answers);

    serving.signal("TERM");
    serving.wait_exit(Duration::from_secs(20));
    let stderr = serving.log();
    let stdout = std::fs::read_to_string(dir.path().join("stdout")).unwrap();
    assert!(stderr.contains("counting in Redis"), "{stderr}");
    assert!(stderr.contains(":***@127.0.0.1"), "{stderr}");
    outputs.push(("stderr".into(), stderr));
    outputs.push(("stdout".into(), stdout));
    for (what, text) in outputs.iter().chain(&answers) {
        assert_secret_free(what, text);
    }
}

/// A password that makes its URL unparsable (`#` ends a URL's authority; so do `/` and `?`)
/// is hidden too, whether the URL comes from `--redis` or `FLOWGATE_REDIS`, alone, as a
/// cluster seed, in a list, or without a scheme: neither the password nor the URL appears.
#[test]
fn a_redis_url_that_does_not_parse_is_quoted_without_its_password() {
    let secret = "Pw#9c2e-unparsable";
    let urls = [
        format!("redis://:{secret}@127.0.0.1:6380"),
        format!("redis://app:{secret}@127.0.0.1:6380/0"),
        format!("redis://:{}@127.0.0.1:6380", secret.replace('#', "/")),
        format!("rediss://:{}@127.0.0.1:6380", secret.replace('#', "?")),
        format!(":{secret}@127.0.0.1:6380"),
    ];
    for url in &urls {
        let hidden = url
            .split('@')
            .next()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .to_owned();
        for (how, cluster) in [
            ("flag", false),
            ("env", false),
            ("flag", true),
            ("list", false),
        ] {
            let mut command = Command::new(FLOWGATE);
            command
                .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
                .env("RUST_LOG", "debug")
                .env_remove("FLOWGATE_REDIS");
            match how {
                "env" => {
                    command.env("FLOWGATE_REDIS", url);
                }
                "list" => {
                    command.args(["--redis", &format!("redis://127.0.0.1:1,{url}")]);
                }
                _ => {
                    command.args(["--redis", url]);
                }
            }
            if cluster {
                command.arg("--redis-cluster");
            }
            let out = command.output().unwrap();
            let what = format!("{url} by {how} (cluster: {cluster})");
            assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
            let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
            assert!(
                text.contains("cannot connect to Redis at"),
                "{what}: {text}"
            );
            assert!(text.contains("***@127.0.0.1:6380"), "{what}: {text}");
            assert!(
                !text.contains(url.as_str()),
                "{what}: the URL is shown: {text}"
            );
            assert!(
                !text.contains(&hidden),
                "{what}: the password is shown: {text}"
            );
        }
    }
}
