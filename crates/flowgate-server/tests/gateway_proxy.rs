//! The gateway as a reverse proxy, over real HTTP/1.1 on loopback: a real upstream (hyper)
//! behind `flowgate serve --upstream`, and a real client in front. Forwarding fidelity,
//! streaming both ways, hop-by-hop fields, requests it refuses, 502/504.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flowgate_testing::upstream::*;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_requests_reach_the_upstream_intact() {
    let upstream = Upstream::start().await;
    let server = gateway(PASS_ALL, &upstream.url()).await;
    let request = Request::put(format!(
        "http://{}/some/path?q=1&r=two%20words",
        server.gateway.unwrap()
    ))
    .header("host", "api.example:8443")
    .header("x-custom", "value")
    .header("x-multi", "a")
    .header("x-multi", "b")
    .header("authorization", "Bearer not-checked")
    .header("content-type", "text/plain")
    .body(Full::new(Bytes::from_static(b"hello upstream")))
    .unwrap();
    let answer = send(&client(), request).await;
    assert_eq!(answer.status, 201);
    assert_eq!(answer.header("x-echo"), "1");
    assert_eq!(&answer.body[..], b"hello upstream");
    // The RateLimit fields are added to the upstream's response.
    let policy = sfv::Parser::new(answer.header("ratelimit-policy").as_bytes())
        .parse::<sfv::List>()
        .unwrap();
    assert_eq!(policy.len(), 1);

    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    let seen = &seen[0];
    assert_eq!(seen.method, "PUT");
    assert_eq!(seen.uri, "/some/path?q=1&r=two%20words");
    assert_eq!(&seen.body[..], b"hello upstream");
    assert_eq!(
        seen.headers["host"], "api.example:8443",
        "original Host kept"
    );
    assert_eq!(seen.headers["x-custom"], "value");
    let multi: Vec<_> = seen.headers.get_all("x-multi").iter().collect();
    assert_eq!(multi, ["a", "b"]);
    assert_eq!(seen.headers["authorization"], "Bearer not-checked");
    assert_eq!(seen.headers["content-type"], "text/plain");
    assert_eq!(seen.headers["content-length"], "14");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(
        seen.headers["forwarded"],
        r#"for=127.0.0.1;host="api.example:8443";proto=http"#
    );
    assert_eq!(seen.headers["via"], "1.1 flowgate");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mebibyte_goes_up_and_down_byte_exact() {
    let upstream = Upstream::start().await;
    let server = gateway(PASS_ALL, &upstream.url()).await;
    let upload = Bytes::from(pattern(1 << 20));
    let request = Request::post(format!("http://{}/upload", server.gateway.unwrap()))
        .body(Full::new(upload.clone()))
        .unwrap();
    let answer = send(&client(), request).await;
    assert_eq!(answer.status, 201);
    assert_eq!(answer.body.len(), upload.len());
    assert!(answer.body == upload, "echoed body differs");
    assert!(upstream.seen()[0].body == upload, "uploaded body differs");

    let download = get(&server, &format!("/download/{}", 1 << 20), &[]).await;
    assert_eq!(download.status, 200);
    assert_eq!(download.header("content-length"), (1 << 20).to_string());
    assert!(download.body == pattern(1 << 20), "downloaded body differs");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_stream_before_the_upstream_finishes() {
    let mut upstream = Upstream::start().await;
    let server = gateway(PASS_ALL, &upstream.url()).await;
    let request = Request::get(format!("http://{}/stream", server.gateway.unwrap()))
        .body(Full::default())
        .unwrap();
    let response = tokio::time::timeout(STEP, client().request(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    // The first chunk arrives while the upstream is still waiting for the test.
    let first = tokio::time::timeout(STEP, body.frame())
        .await
        .expect("the first chunk arrives before the upstream finishes")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first chunk;");
    let release = upstream.release.take().unwrap();
    release.send(Bytes::from_static(b"second")).await.unwrap();
    let second = tokio::time::timeout(STEP, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(second.into_data().unwrap(), "second");
    drop(release);
    let rest = tokio::time::timeout(STEP, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert!(rest.is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_fields_are_stripped_both_ways() {
    let upstream = Upstream::start().await;
    let server = gateway(PASS_ALL, &upstream.url()).await;
    let answer = get(
        &server,
        "/hop",
        &[
            ("connection", "keep-alive, x-client-private"),
            ("x-client-private", "secret"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic dTpw"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("x-client-public", "kept"),
        ],
    )
    .await;
    assert_eq!(answer.status, 201);
    let seen = &upstream.seen()[0].headers;
    for gone in [
        "x-client-private",
        "keep-alive",
        "proxy-authorization",
        "te",
        "upgrade",
    ] {
        assert!(!seen.contains_key(gone), "{gone} reached the upstream");
    }
    assert!(
        seen.get("connection")
            .is_none_or(|c| !c.to_str().unwrap().contains("x-client-private"))
    );
    assert_eq!(seen["x-client-public"], "kept");

    let down = get(&server, "/download/10", &[]).await;
    for gone in ["x-upstream-private", "keep-alive", "proxy-authenticate"] {
        assert!(
            !down.headers.contains_key(gone),
            "{gone} reached the client"
        );
    }
    assert_eq!(down.header("x-upstream-public"), "kept");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_host_or_for_a_tunnel_are_refused_with_problems() {
    let upstream = Upstream::start().await;
    let server = gateway(PASS_ALL, &upstream.url()).await;
    let answer = raw(server.gateway.unwrap(), "GET / HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("Host"), "{answer}");
    let twice = raw(
        server.gateway.unwrap(),
        "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    )
    .await;
    assert!(twice.starts_with("HTTP/1.1 400"), "{twice}");
    let connect = raw(
        server.gateway.unwrap(),
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    )
    .await;
    assert!(connect.starts_with("HTTP/1.1 405"), "{connect}");
    assert!(upstream.seen().is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_502_problem() {
    // A port that nothing listens on.
    let closed = flowgate_testing::net::ClosedPort::new();
    let addr = closed.addr();
    let server = gateway(PASS_ALL, &format!("http://{addr}")).await;
    let answer = get(&server, "/", &[]).await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.header("content-type"), "application/problem+json");
    assert_eq!(answer.json()["status"], 502);
    // Generic: the client learns nothing of the upstream's address or the error.
    let body = answer.json().to_string();
    assert!(!body.contains(&addr.port().to_string()), "{body}");
    assert!(!body.contains("127.0.0.1"), "{body}");
    assert!(!body.to_lowercase().contains("refused"), "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_is_a_504_problem_after_the_timeout() {
    let upstream = Upstream::start().await;
    let yaml = PASS_ALL.replace("gateway:\n", "gateway:\n  upstream_timeout: 200ms\n");
    let server = gateway(&yaml, &upstream.url()).await;
    let started = std::time::Instant::now();
    let answer = get(&server, "/slow", &[]).await;
    assert_eq!(answer.status, 504);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(answer.header("content-type"), "application/problem+json");
    assert_eq!(answer.json()["status"], 504);
    let body = answer.json().to_string();
    assert!(!body.contains(&upstream.addr.port().to_string()), "{body}");
    // The gateway still serves others.
    assert_eq!(get(&server, "/fine", &[]).await.status, 201);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_clients_forwarding_fields_are_replaced_unless_appending_is_asked() {
    let spoofed = [
        ("x-forwarded-for", "203.0.113.9"),
        ("forwarded", "for=203.0.113.9"),
    ];
    let cases = [
        // Default: overwrite — the upstream sees only the real peer.
        (PASS_ALL.to_owned(), "127.0.0.1", r#"for=127.0.0.1;host="#),
        // `forwarded: append`: the chain is kept, this hop appended.
        (
            PASS_ALL.replace("gateway:\n", "gateway:\n  forwarded: append\n"),
            "203.0.113.9, 127.0.0.1",
            "for=203.0.113.9, for=127.0.0.1;host=",
        ),
        // From a trusted proxy the chain is always kept.
        (
            PASS_ALL.replace("gateway:\n", "gateway:\n  trusted_proxies: [127.0.0.0/8]\n"),
            "203.0.113.9, 127.0.0.1",
            "for=203.0.113.9, for=127.0.0.1;host=",
        ),
    ];
    for (yaml, xff, forwarded) in cases {
        let upstream = Upstream::start().await;
        let server = gateway(&yaml, &upstream.url()).await;
        assert_eq!(get(&server, "/f", &spoofed).await.status, 201);
        let seen = upstream.seen();
        assert_eq!(seen[0].headers["x-forwarded-for"], xff, "{yaml}");
        let got = seen[0].headers["forwarded"].to_str().unwrap();
        assert!(got.starts_with(forwarded), "{yaml}: {got}");
        server.stop().await;
    }
}
