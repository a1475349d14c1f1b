//! The gateway's bounds towards the upstream, over real HTTP/1.1 on loopback: at most
//! `upstream_max_connections` connections (a request beyond waits `upstream_queue_timeout`,
//! then 503), `body_idle_timeout` for a stalled upload and a stalled response, and an upload
//! aborted midway gives its upstream connection back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use flowgate_server::server::ServerConfig;
use flowgate_testing::http::until_closed;
use flowgate_testing::server::{TestServer, wait_metric};
use flowgate_testing::upstream::*;
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// PASS_ALL with `extra` lines added to its `gateway` section.
async fn bounded_gateway(upstream: &Upstream, extra: &str) -> TestServer {
    let yaml = PASS_ALL.replacen("gateway:\n", &format!("gateway:\n{extra}"), 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.upstream = Some(upstream.url().parse().unwrap());
    TestServer::start_with(config, dir, vec![path]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_upstream_connection_cap_wait_then_get_503() {
    let upstream = Upstream::start().await;
    let server = bounded_gateway(
        &upstream,
        "  upstream_max_connections: 2\n  upstream_queue_timeout: 300ms\n",
    )
    .await;
    let gateway = server.gateway.unwrap();
    // Two requests the upstream never answers hold both connections.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(gateway).await.unwrap();
        stream
            .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        held.push(stream);
    }
    wait_metric(&server, "flowgate_gateway_upstream_connections", 2.0).await;
    // A third waits for the queue timeout, then is refused without a third connection.
    let started = Instant::now();
    let third = get(&server, "/third", &[]).await;
    let waited = started.elapsed();
    assert_eq!(third.status, 503, "{:?}", third.body);
    assert!(waited >= Duration::from_millis(290), "{waited:?}");
    assert_eq!(upstream.accepted(), 2);
    assert_eq!(
        server.metric("flowgate_gateway_upstream_busy_total").await,
        1.0
    );
    assert_eq!(
        server
            .metric("flowgate_gateway_upstream_queued_total")
            .await,
        1.0
    );

    // A held request's client goes away: its connection closes, and a waiting request gets
    // the slot instead of a 503.
    let waiting = tokio::spawn(async move {
        let request = hyper::Request::get(format!("http://{gateway}/fourth"))
            .body(http_body_util::Full::default())
            .unwrap();
        send(&client(), request).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(held.pop());
    let fourth = waiting.await.unwrap();
    assert_eq!(fourth.status, 201);
    assert_eq!(
        upstream.accepted(),
        3,
        "the freed slot opened one connection"
    );
    drop(held);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_aborted_midway_gives_its_upstream_connection_back() {
    let upstream = Upstream::start().await;
    let server = bounded_gateway(&upstream, "  upstream_max_connections: 1\n").await;
    let gateway = server.gateway.unwrap();
    let mut upload = TcpStream::connect(gateway).await.unwrap();
    upload
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
        .await
        .unwrap();
    upload.write_all(&pattern(65_536)).await.unwrap();
    wait_metric(&server, "flowgate_gateway_upstream_connections", 1.0).await;
    // The client goes away with 960 KiB unsent.
    drop(upload);
    upstream.ended(1).await;
    wait_metric(&server, "flowgate_gateway_upstream_connections", 0.0).await;
    // The one slot is free: the next request is answered (it would wait and get 503 if the
    // aborted upload still held it).
    let next = get(&server, "/after", &[]).await;
    assert_eq!(next.status, 201);
    assert!(
        upstream.seen().iter().all(|s| s.uri != "/upload"),
        "the truncated upload was not delivered as a whole request"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_answered_408_after_the_body_idle_timeout() {
    let upstream = Upstream::start().await;
    let server = bounded_gateway(&upstream, "  body_idle_timeout: 200ms\n").await;
    let mut upload = TcpStream::connect(server.gateway.unwrap()).await.unwrap();
    upload
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nhalf")
        .await
        .unwrap();
    let started = Instant::now();
    // The client keeps the connection open and sends nothing more.
    let answer = until_closed(&mut upload).await;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_secs(5),
        "{took:?}"
    );
    upstream.ended(1).await;
    assert_eq!(
        server
            .metric("flowgate_gateway_request_body_timeouts_total")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_response_is_cut_after_the_body_idle_timeout() {
    let upstream = Upstream::start().await;
    let server = bounded_gateway(&upstream, "  body_idle_timeout: 200ms\n").await;
    // `/stream` sends one chunk, then nothing (the test never releases more).
    let request = hyper::Request::get(format!("http://{}/stream", server.gateway.unwrap()))
        .body(http_body_util::Full::default())
        .unwrap();
    let response = tokio::time::timeout(STEP, client().request(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    let started = Instant::now();
    let body = tokio::time::timeout(STEP, response.into_body().collect())
        .await
        .expect("the stalled body is cut, not left open");
    assert!(body.is_err(), "a cut body is an error to the client");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(190), "{took:?}");
    upstream.ended(1).await;
    assert_eq!(
        server
            .metric("flowgate_gateway_response_body_timeouts_total")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_the_clients_408_even_when_the_upstream_timeout_is_shorter() {
    let upstream = Upstream::start().await;
    // The upstream would be given up after 200 ms of silence; the client's body after 600 ms.
    let server = bounded_gateway(
        &upstream,
        "  upstream_timeout: 200ms\n  body_idle_timeout: 600ms\n",
    )
    .await;
    let mut upload = TcpStream::connect(server.gateway.unwrap()).await.unwrap();
    upload
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nhalf")
        .await
        .unwrap();
    let started = Instant::now();
    // The client keeps the connection open and sends nothing more: the gateway is waiting on
    // the client, not on the upstream.
    let answer = until_closed(&mut upload).await;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(took >= Duration::from_millis(590), "{took:?}");
    upstream.ended(1).await;
    for (outcome, n) in [("rejected", 1.0), ("gateway_timeout", 0.0)] {
        let series = format!(r#"flowgate_gateway_responses_total{{outcome="{outcome}"}}"#);
        assert_eq!(server.metric(&series).await, n, "{series}");
    }

    // An upload that keeps coming is not cut by the upstream timeout either, and an upstream
    // that then stays silent still gets its 504.
    let mut slow = TcpStream::connect(server.gateway.unwrap()).await.unwrap();
    slow.write_all(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n")
        .await
        .unwrap();
    for byte in [b"a", b"b", b"c", b"d", b"e", b"f"] {
        tokio::time::sleep(Duration::from_millis(100)).await;
        slow.write_all(byte).await.unwrap();
    }
    // Read the head (the connection stays open: a 504 is not the client's fault).
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(STEP, tokio::io::AsyncReadExt::read(&mut slow, &mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(n > 0, "closed without an answer");
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_body_is_the_clients_400_not_an_upstream_failure() {
    let upstream = Upstream::start().await;
    let server = bounded_gateway(&upstream, "").await;
    // Chunk lines ended by a bare LF: the HTTP/1 parser refuses the body once it reaches it,
    // after the request has gone upstream.
    let mut upload = TcpStream::connect(server.gateway.unwrap()).await.unwrap();
    upload
        .write_all(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n",
        )
        .await
        .unwrap();
    let answer = until_closed(&mut upload).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    for (outcome, n) in [("rejected", 1.0), ("bad_gateway", 0.0)] {
        let series = format!(r#"flowgate_gateway_responses_total{{outcome="{outcome}"}}"#);
        assert_eq!(server.metric(&series).await, n, "{series}");
    }
    assert!(
        upstream.seen().iter().all(|s| s.uri != "/upload"),
        "the malformed upload was not delivered as a whole request"
    );
    server.stop().await;
}
