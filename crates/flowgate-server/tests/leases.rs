//! In-flight limits over HTTP (`/v1/leases`): take, count, renew and release leases of a
//! configuration's `concurrency` limit; malformed input gets a problem; and, with two real
//! `flowgate` processes sharing a real `redis-server`, the instances together never grant more
//! than the limit, and the slots held by an instance that is killed come back when their
//! leases expire.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flowgate_testing::binary::Serving;
use flowgate_testing::http::{exchange_raw, parse};
use flowgate_testing::redis::RedisServer;
use flowgate_testing::server::{HttpResponse, TestServer};

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

const CONFIG: &str = r#"
domain: payments
concurrency:
  - name: checkout
    limit: 2
    lease_time: 30s
"#;

#[tokio::test]
async fn leases_are_taken_counted_renewed_and_released() {
    let server = TestServer::start(&[("payments.yaml", CONFIG)]).await;
    let first = server.post("/v1/leases/checkout/customer%2F42", "").await;
    assert_eq!(first.status, 201, "{}", first.body);
    let body = first.json();
    assert_eq!(body["held"], 1);
    assert_eq!(body["limit"], 2);
    assert_eq!(body["expires_in_ms"], 30_000);
    let lease = body["lease"].as_str().unwrap().to_owned();
    assert_eq!(lease.len(), 32);
    assert_eq!(
        server
            .post("/v1/leases/checkout/customer%2F42", "")
            .await
            .status,
        201
    );
    // Full: 429 with a problem and when to come back.
    let full = server.post("/v1/leases/checkout/customer%2F42", "").await;
    assert_eq!(full.status, 429, "{}", full.body);
    assert_eq!(
        full.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(full.header("retry-after"), Some("30"));
    assert!(
        full.body.contains("2 of 2 leases are held"),
        "{}",
        full.body
    );
    // Another key has its own slots.
    assert_eq!(
        server
            .post("/v1/leases/checkout/customer%2F7", "")
            .await
            .status,
        201
    );
    let held = server.get("/v1/leases/checkout/customer%2F42").await;
    assert_eq!((held.status, held.json()["held"].as_u64()), (200, Some(2)));
    // Renew, release, and a second release is a 404.
    let path = format!("/v1/leases/checkout/customer%2F42/{lease}");
    let renewed = server.request("PUT", &path, "").await;
    assert_eq!(renewed.status, 200, "{}", renewed.body);
    assert_eq!(renewed.json()["lease"], lease.as_str());
    assert_eq!(server.request("DELETE", &path, "").await.status, 204);
    let again = server.request("DELETE", &path, "").await;
    assert_eq!(again.status, 404, "{}", again.body);
    assert!(again.body.contains("lease-not-held"), "{}", again.body);
    assert_eq!(server.request("PUT", &path, "").await.status, 404);
    // The released slot is free again.
    let next = server.post("/v1/leases/checkout/customer%2F42", "").await;
    assert_eq!((next.status, next.json()["held"].as_u64()), (201, Some(2)));
    server.stop().await;
}

#[tokio::test]
async fn unknown_limits_and_malformed_ids_get_problems() {
    let server = TestServer::start(&[("payments.yaml", CONFIG)]).await;
    let unknown = server.post("/v1/leases/nope/k", "").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        unknown.body.contains("no concurrency limit named `nope`"),
        "{}",
        unknown.body
    );
    for id in ["xyz", "0123456789abcdef0123456789abcdeg", "00"] {
        let bad = server
            .request("DELETE", &format!("/v1/leases/checkout/k/{id}"), "")
            .await;
        assert_eq!(bad.status, 400, "{id}: {}", bad.body);
        assert!(bad.body.contains("32 hexadecimal digits"), "{}", bad.body);
    }
    // A path that does not decode (not UTF-8 once percent-decoded) is a problem too.
    let undecodable = server.post("/v1/leases/checkout/%FF", "").await;
    assert_eq!(undecodable.status, 400, "{}", undecodable.body);
    assert_eq!(
        undecodable.header("content-type"),
        Some("application/problem+json")
    );
    let stranger = "0123456789abcdef0123456789abcdef";
    let gone = server
        .request("PUT", &format!("/v1/leases/checkout/k/{stranger}"), "")
        .await;
    assert_eq!(gone.status, 404);
    server.stop().await;
}

#[test]
fn bad_concurrency_sections_are_refused_with_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "domain: d\nconcurrency:\n  - name: a b\n    limit: 0\n  - name: ok\n    limit: 5\n    lease_time: 2 days\n    fail: local\n  - name: ok\n    limit: 1\n",
    )
    .unwrap();
    let out = Command::new(FLOWGATE)
        .args(["check-config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    for expected in [
        "bad.yaml:3:11: `concurrency.name`: must be letters",
        "bad.yaml:4:12: `concurrency.limit`: a concurrency limit must be between 1 and",
        "bad.yaml:7:17: `concurrency.lease_time`: a lease must last",
        "bad.yaml:8:11: `concurrency.fail`: unknown value `local`",
        "bad.yaml:9:11: `concurrency.name`: `ok` is defined twice",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

/// docs/service.md's `concurrency` example is valid and says what docs/concurrency/payments.yaml
/// (which its commands serve) says.
#[test]
fn the_documented_section_is_valid_and_matches_the_served_file() {
    use flowgate_server::config::{Policy, Source};
    let shown = flowgate_testing::docs::marked_yaml(
        &flowgate_testing::docs::read("docs/service.md"),
        "concurrency-yaml",
    );
    let load = |path: &str, text: String| {
        Policy::from_sources(vec![Source {
            path: path.into(),
            text,
        }])
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .concurrency
    };
    let served = load(
        "docs/concurrency/payments.yaml",
        flowgate_testing::docs::read("docs/concurrency/payments.yaml"),
    );
    assert_eq!(load("docs/service.md", shown), served);
    let checkout = served["checkout"];
    assert_eq!(
        (checkout.terms.limit(), checkout.terms.ttl()),
        (20, Duration::from_secs(30))
    );
}

/// `method path` on `addr` over a fresh connection.
fn call(addr: SocketAddr, method: &str, path: &str) -> HttpResponse {
    let raw = exchange_raw(
        addr,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        ),
    )
    .expect("an answer");
    parse(&raw)
}

fn serve_on(redis: &RedisServer, config: &std::path::Path) -> Serving {
    Serving::start(
        Command::new(FLOWGATE)
            .args(["serve", "--redis", &redis.url()])
            // A loaded test machine may take Redis past the 50 ms default: a timeout would be
            // a 503, which this test is not about.
            .args(["--redis-timeout", "5s"])
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .arg("--config")
            .arg(config)
            .stdout(Stdio::null()),
    )
}

#[test]
fn two_instances_share_the_limit_and_a_killed_instances_leases_expire() {
    let Some(redis) = RedisServer::start("leases_two_instances_http") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("payments.yaml");
    std::fs::write(
        &config,
        "domain: payments\nconcurrency:\n  - name: checkout\n    limit: 5\n    lease_time: 2s\n",
    )
    .unwrap();
    let mut one = serve_on(&redis, &config);
    let two = serve_on(&redis, &config);
    // 24 callers at once, half on each instance: exactly 5 leases granted in all.
    let addrs = [one.http, two.http];
    let granted: usize = std::thread::scope(|s| {
        let calls: Vec<_> = (0..24)
            .map(|i| {
                let addr = addrs[i % 2];
                s.spawn(move || call(addr, "POST", "/v1/leases/checkout/shared").status)
            })
            .collect();
        calls
            .into_iter()
            .map(|c| c.join().unwrap())
            .inspect(|&status| assert!(status == 201 || status == 429, "{status}"))
            .filter(|&status| status == 201)
            .count()
    });
    assert_eq!(granted, 5);
    // The instance that holds some of them is killed: nobody will release them.
    one.child.kill().unwrap();
    one.child.wait().unwrap();
    let refused = call(two.http, "POST", "/v1/leases/checkout/shared");
    assert_eq!(refused.status, 429, "{}", refused.body);
    // When the leases expire (2 s after they were taken, on Redis's clock) every slot is free
    // again.
    let started = Instant::now();
    let held = loop {
        let answer = call(two.http, "GET", "/v1/leases/checkout/shared");
        assert_eq!(answer.status, 200, "{}", answer.body);
        let held = answer.json()["held"].as_u64().unwrap();
        if held == 0 || started.elapsed() > Duration::from_secs(10) {
            break held;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(held, 0, "the leases did not expire within 10 s");
    let back = call(two.http, "POST", "/v1/leases/checkout/shared");
    assert_eq!((back.status, back.json()["held"].as_u64()), (201, Some(1)));
}
