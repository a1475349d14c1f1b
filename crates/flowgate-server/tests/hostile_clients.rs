//! Hostile clients against the gateway and the HTTP API: request-smuggling probes (CL+TE,
//! TE+CL, conflicting and repeated Content-Length, obs-fold, non-chunked TE, TE on
//! HTTP/1.0) and slowloris (connections that send their head a byte at a time, or never
//! finish it) while other clients are served.
//!
//! What closes a connection that makes no progress is the listeners' timeouts (issue 11);
//! these tests hold what must be true whatever those are: a probe never smuggles a second
//! request to the upstream, and slow connections do not slow other clients down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flowgate_testing::upstream::{self, PASS_ALL, STEP, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes `raw`, then reads until the peer closes (bounded): everything it answered, and
/// whether it closed the connection (rather than keeping it for another request).
async fn exchange(addr: SocketAddr, raw: &[u8]) -> (String, bool) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(raw).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(2);
    let closed = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

/// A smuggled request's marker: the upstream must never see this path.
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_probes_never_reach_the_upstream_as_a_second_request() {
    let upstream = Upstream::start().await;
    let server = upstream::gateway(PASS_ALL, &upstream.url()).await;
    let gateway = server.gateway.unwrap();

    // Rejected outright with 400, nothing forwarded.
    let rejected: &[(&str, String)] = &[
        (
            "conflicting Content-Length",
            format!(
                "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcd{SMUGGLED}"
            ),
        ),
        (
            "Content-Length list",
            format!("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 4, 40\r\n\r\nabcd{SMUGGLED}"),
        ),
        (
            "obs-fold",
            format!(
                "POST /a HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n{SMUGGLED}"
            ),
        ),
        (
            "Transfer-Encoding not ending in chunked",
            format!(
                "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n{SMUGGLED}"
            ),
        ),
        (
            "Transfer-Encoding on HTTP/1.0",
            format!(
                "POST /a HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}"
            ),
        ),
        (
            "space before the colon",
            format!("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length : 4\r\n\r\nabcd{SMUGGLED}"),
        ),
        (
            "two Host fields",
            format!("GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n{SMUGGLED}"),
        ),
    ];
    for (probe, raw) in rejected {
        let (answer, closed) = exchange(gateway, raw.as_bytes()).await;
        assert_eq!(status(&answer), 400, "{probe}: {answer}");
        assert!(closed, "{probe}: the connection is closed after a 400");
        assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{probe}: {answer}");
    }
    assert!(
        upstream.seen().is_empty(),
        "rejected probes reached the upstream: {:?}",
        upstream.seen()
    );

    // CL together with TE (either order): the body is read as chunked (TE wins, RFC 9112
    // §6.3), Content-Length is dropped, the request is re-framed towards the upstream and the
    // client's connection is closed after the answer, so the bytes after the chunked body are
    // never parsed as a request.
    for raw in [
        format!(
            "POST /cl-te HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}"
        ),
        format!(
            "POST /te-cl HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 60\r\n\r\n3\r\nabc\r\n0\r\n\r\n{SMUGGLED}"
        ),
    ] {
        let (answer, closed) = exchange(gateway, raw.as_bytes()).await;
        assert!(
            closed,
            "the connection is closed after a CL+TE request: {answer}"
        );
        assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    }
    // Identical repeated Content-Length is one length (RFC 9110 §8.6), forwarded once.
    let (answer, _) = exchange(
        gateway,
        b"POST /dup HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    )
    .await;
    assert!(status(&answer) < 300, "{answer}");

    let seen = upstream.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(paths, ["/cl-te", "/te-cl", "/dup"], "{seen:?}");
    for s in &seen {
        assert!(
            s.headers.get_all("content-length").iter().count() <= 1,
            "{s:?}"
        );
        assert!(
            !(s.headers.contains_key("content-length")
                && s.headers.contains_key("transfer-encoding")),
            "both framings forwarded: {s:?}"
        );
    }
    assert_eq!(&seen[0].body[..], b"");
    assert_eq!(&seen[1].body[..], b"abc");
    assert_eq!(&seen[2].body[..], b"abc");
    server.stop().await;
}

/// Opens `n` connections that send part of a request head, a byte at a time, and never
/// finish it; returns them (dropping closes them).
async fn slowloris(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        streams.push(s);
    }
    streams
}

/// The slowest of `n` sequential `GET path` on fresh connections.
async fn slowest_of(addr: SocketAddr, path: &str, n: usize) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..n {
        let started = Instant::now();
        let (answer, _) = exchange(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(status(&answer) < 300, "{answer}");
        slowest = slowest.max(started.elapsed());
    }
    slowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_do_not_slow_other_clients() {
    let upstream = Upstream::start().await;
    let server = upstream::gateway(PASS_ALL, &upstream.url()).await;
    let gateway = server.gateway.unwrap();
    let targets = [(server.http, "/healthz"), (gateway, "/a")];
    let mut before = Vec::new();
    for (addr, path) in targets {
        before.push(slowest_of(addr, path, 20).await);
    }
    let mut held = Vec::new();
    for (addr, _) in targets {
        held.extend(slowloris(addr, 250).await);
    }
    // The slow clients keep trickling bytes while the others are served.
    let trickle = tokio::spawn(async move {
        for _ in 0..20 {
            for s in held.iter_mut() {
                let _ = s.write_all(b"a").await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        held
    });
    for ((addr, path), before) in targets.into_iter().zip(before) {
        let during = slowest_of(addr, path, 50).await;
        eprintln!(
            "{addr}{path}: slowest of 20 before {before:?}, of 50 beside 250 slowloris connections {during:?}"
        );
        assert!(
            during < Duration::from_millis(250),
            "{addr}{path}: {during:?} beside slowloris connections"
        );
    }
    let held = tokio::time::timeout(STEP, trickle).await.unwrap().unwrap();
    drop(held);
    server.stop().await;
}
