//! Bounded listeners: a connection flood beyond `max_connections` is refused at once and
//! counted, and frees nothing it does not hold; a client that sends its request head too slowly,
//! or keeps an idle keep-alive connection, is closed after the header read timeout and counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use flowgate_server::listen::ListenLimits;
use flowgate_server::server::ServerConfig;
use flowgate_testing::http::until_closed;
use flowgate_testing::server::{TestServer, wait_metric};
use flowgate_testing::upstream::{STEP, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const EDGE: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100000}\n";

async fn gateway(upstream: &Upstream, limits: ListenLimits) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, EDGE).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.upstream = Some(upstream.url().parse().unwrap());
    config.listen = limits;
    TestServer::start_with(config, dir, vec![path]).await
}

/// Sends `head` (part of a request head) to `addr`, then nothing: the server must close the
/// connection once `timeout` has passed (not before), answering `408` or nothing.
async fn slow_head_is_closed(addr: std::net::SocketAddr, head: &[u8], timeout: Duration) {
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(head).await.unwrap();
    let started = Instant::now();
    let answer = until_closed(&mut slow).await;
    // The server's clock starts at accept, a moment before the test's.
    assert!(
        started.elapsed() >= timeout.mul_f64(0.8),
        "closed before the timeout"
    );
    // hyper answers 408 when it gives up on a head.
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_beyond_the_cap_is_refused_at_once_and_counted() {
    let upstream = Upstream::start().await;
    let limits = ListenLimits {
        max_connections: 4,
        ..ListenLimits::default()
    };
    let server = gateway(&upstream, limits).await;
    let addr = server.gateway.unwrap();
    // Four idle clients fill the gateway.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    wait_metric(
        &server,
        "flowgate_listener_connections{listener=\"gateway\"}",
        4.0,
    )
    .await;
    // The flood: each is closed before any byte, without waiting for a timeout.
    for _ in 0..20 {
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let _ = extra.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let started = Instant::now();
        assert!(until_closed(&mut extra).await.is_empty());
        assert!(started.elapsed() < Duration::from_secs(2), "refused slowly");
    }
    wait_metric(
        &server,
        "flowgate_listener_refused_connections_total{listener=\"gateway\"}",
        20.0,
    )
    .await;
    // One held connection still works; closing them frees their slots.
    held[0]
        .write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut held[0]).await;
    assert!(answer.starts_with(b"HTTP/1.1 201"), "{answer:?}");
    drop(held);
    wait_metric(
        &server,
        "flowgate_listener_connections{listener=\"gateway\"}",
        0.0,
    )
    .await;
    let mut again = TcpStream::connect(addr).await.unwrap();
    again
        .write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert!(until_closed(&mut again).await.starts_with(b"HTTP/1.1 201"));
    // The HTTP API has its own cap and counters.
    assert_eq!(
        server
            .metric("flowgate_listener_refused_connections_total{listener=\"http\"}")
            .await,
        0.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_heads_and_idle_keep_alive_are_closed_after_the_header_read_timeout() {
    let upstream = Upstream::start().await;
    let timeout = Duration::from_millis(300);
    let limits = ListenLimits {
        header_read_timeout: timeout,
        ..ListenLimits::default()
    };
    let server = gateway(&upstream, limits).await;
    let addr = server.gateway.unwrap();

    // Slowloris: half a head, then nothing.
    slow_head_is_closed(addr, b"GET / HTTP/1.1\r\nHost: x\r\n", timeout).await;

    // Idle keep-alive: one request answered, then silence closes the connection.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(STEP, idle.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 201"));
    let answered = Instant::now();
    until_closed(&mut idle).await;
    assert!(answered.elapsed() >= timeout / 2, "closed too early");
    wait_metric(
        &server,
        "flowgate_listener_timeouts_total{listener=\"gateway\"}",
        2.0,
    )
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_over_the_size_limit_is_answered_431_and_counted() {
    let upstream = Upstream::start().await;
    let limits = ListenLimits {
        max_header_bytes: 4096,
        ..ListenLimits::default()
    };
    let server = gateway(&upstream, limits).await;
    let addr = server.gateway.unwrap();
    let mut big = TcpStream::connect(addr).await.unwrap();
    let filler = "a".repeat(5000);
    big.write_all(format!("GET /ok HTTP/1.1\r\nHost: x\r\nX-Big: {filler}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let answer = until_closed(&mut big).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    wait_metric(
        &server,
        "flowgate_listener_oversized_heads_total{listener=\"gateway\"}",
        1.0,
    )
    .await;
    // Under the limit: forwarded.
    let mut fine = TcpStream::connect(addr).await.unwrap();
    let filler = "a".repeat(3000);
    fine.write_all(
        format!("GET /ok HTTP/1.1\r\nHost: x\r\nX-Big: {filler}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    assert!(until_closed(&mut fine).await.starts_with(b"HTTP/1.1 201"));
    assert!(
        upstream
            .seen()
            .iter()
            .all(|seen| seen.headers.get("x-big").is_none_or(|v| v.len() == 3000))
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_and_http_apis_are_capped_too() {
    let upstream = Upstream::start().await;
    let limits = ListenLimits {
        max_connections: 2,
        ..ListenLimits::default()
    };
    let server = gateway(&upstream, limits).await;
    for (addr, listener) in [(server.grpc, "grpc"), (server.http, "http")] {
        let held = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        let open = format!("flowgate_listener_connections{{listener=\"{listener}\"}}");
        // The test's own scrapes go to the HTTP API: count them only once they are done.
        if listener == "grpc" {
            wait_metric(&server, &open, 2.0).await;
        }
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        assert!(until_closed(&mut extra).await.is_empty(), "{listener}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{listener}: refused slowly"
        );
        drop(held);
        if listener == "grpc" {
            wait_metric(
                &server,
                "flowgate_listener_refused_connections_total{listener=\"grpc\"}",
                1.0,
            )
            .await;
            // Freed slots serve gRPC again.
            let mut rls = server.rls().await;
            let answer = flowgate_testing::grpc::should(
                &mut rls,
                flowgate_testing::grpc::request(
                    "edge",
                    vec![flowgate_testing::grpc::descriptor(&[(
                        "remote_address",
                        "a",
                    )])],
                ),
            )
            .await;
            assert_eq!(answer.overall_code, flowgate_testing::grpc::OK);
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_and_grpc_apis_close_slow_and_silent_clients_and_refuse_oversized_heads() {
    let timeout = Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, EDGE).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.listen = ListenLimits {
        header_read_timeout: timeout,
        max_header_bytes: 4096,
        ..ListenLimits::default()
    };
    let server = TestServer::start_with(config, dir, vec![path]).await;

    // HTTP API, slowloris: half a head, then nothing — closed after the timeout.
    slow_head_is_closed(
        server.http,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
        timeout,
    )
    .await;

    // HTTP API, a head over the limit: 431.
    let mut big = TcpStream::connect(server.http).await.unwrap();
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(8192)
    );
    big.write_all(head.as_bytes()).await.unwrap();
    let answer = until_closed(&mut big).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // gRPC: a connection that never sends its HTTP/2 preface is closed after the timeout.
    let mut silent = TcpStream::connect(server.grpc).await.unwrap();
    let started = Instant::now();
    let _ = until_closed(&mut silent).await;
    // The server's clock starts at accept, a moment before the test's.
    assert!(
        started.elapsed() >= timeout.mul_f64(0.8),
        "closed before the timeout"
    );

    // gRPC: a client trickling its preface, a byte every 100 ms, is closed after the timeout
    // too (the whole 24-byte preface is due within it).
    let mut trickle = TcpStream::connect(server.grpc).await.unwrap();
    let started = Instant::now();
    let mut closed = false;
    for byte in b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" {
        if trickle.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 64];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(100), trickle.read(&mut buf)).await
        {
            closed = true;
            break;
        }
    }
    assert!(closed, "a trickled preface was waited for");
    // The server's clock starts at accept, a moment before the test's.
    assert!(
        started.elapsed() >= timeout.mul_f64(0.8),
        "closed before the timeout"
    );

    // Counted per listener; the HTTP API still answers.
    wait_metric(
        &server,
        "flowgate_listener_timeouts_total{listener=\"grpc\"}",
        2.0,
    )
    .await;
    assert!(
        server
            .metric("flowgate_listener_timeouts_total{listener=\"http\"}")
            .await
            >= 1.0
    );
    assert_eq!(
        server
            .metric("flowgate_listener_oversized_heads_total{listener=\"http\"}")
            .await,
        1.0
    );
    assert_eq!(server.get("/healthz").await.status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_gateway_closes_a_slow_upgrade_request() {
    let timeout = Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.yaml");
    // The upstream is never reached: the upgrade request never completes.
    std::fs::write(
        &path,
        "domain: chat\nwebsocket:\n  upstream: ws://127.0.0.1:9\n  limits:\n    messages: {limit: 10, per: 1s}\n",
    )
    .unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.listen = ListenLimits {
        header_read_timeout: timeout,
        ..ListenLimits::default()
    };
    let server = TestServer::start_with(config, dir, vec![path]).await;
    slow_head_is_closed(
        server.websocket.unwrap(),
        b"GET /chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",
        timeout,
    )
    .await;
    wait_metric(
        &server,
        "flowgate_listener_timeouts_total{listener=\"websocket\"}",
        1.0,
    )
    .await;
    server.stop().await;
}
