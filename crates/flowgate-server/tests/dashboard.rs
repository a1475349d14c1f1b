//! The dashboard over real HTTP: its security headers (no inline script, framed by its own
//! origin only), the bound on event streams that clients cannot use to lock operators out, and
//! the last reload's result, which a restored file clears.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use flowgate_server::api::AdminToken;
use flowgate_server::dashboard::{MAX_PER_CLIENT, MAX_SUBSCRIBERS, RESERVED_FOR_ADMIN};
use flowgate_server::server::ServerConfig;
use flowgate_testing::server::TestServer;

const TOKEN: &str = "dashboard-test-admin-token";

const EDGE: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_runs_no_inline_code_and_may_be_framed_by_its_own_origin_only() {
    let server = TestServer::start(&[("edge.yaml", EDGE)]).await;
    let page = server.get("/dashboard").await;
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy").unwrap().to_owned();
    let directives: Vec<&str> = csp.split(';').map(str::trim).collect();
    for wanted in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'self'",
        "base-uri 'none'",
    ] {
        assert!(directives.contains(&wanted), "{wanted} missing: {csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(page.header("x-frame-options"), Some("SAMEORIGIN"));
    // So the page must hold no inline script or style to work.
    let html = &page.body;
    assert!(html.contains(r#"<script src="dashboard/page.js" defer></script>"#));
    assert!(html.contains(r#"<link rel="stylesheet" href="dashboard/page.css">"#));
    assert_eq!(html.matches("<script").count(), 1, "{html}");
    assert!(!html.contains("<style"), "{html}");
    assert!(!html.contains("style="), "{html}");
    assert!(!html.contains(" on"), "no inline event handlers: {html}");
    for (path, content_type, sample) in [
        (
            "/dashboard/page.js",
            "text/javascript; charset=utf-8",
            "new EventSource",
        ),
        ("/dashboard/page.css", "text/css; charset=utf-8", "#conn"),
    ] {
        let file = server.get(path).await;
        assert_eq!(file.status, 200, "{path}");
        assert_eq!(file.header("content-type"), Some(content_type), "{path}");
        assert_eq!(file.header("x-content-type-options"), Some("nosniff"));
        assert!(file.body.contains(sample), "{path}");
    }
    server.stop().await;
}

/// Opens `GET /dashboard/events` from `from` (a loopback address; port 0), with `headers`:
/// the open connection once the status line is read, and the status.
async fn open_stream(server: SocketAddr, from: IpAddr, headers: &str) -> (TcpStream, u16) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut conn = socket.connect(server).await.unwrap();
    let request = format!(
        "GET /dashboard/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n{headers}\r\n"
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut head))
        .await
        .expect("a status line within 5 s")
        .unwrap();
    let status = std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap();
    (conn, status)
}

/// The `n`th loopback address (Linux routes all of 127.0.0.0/8 to this host).
fn loopback(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 1, u8::try_from(n).unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_the_token_cannot_take_every_stream_from_operators() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, EDGE).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.admin_token = Some(AdminToken::new(TOKEN).unwrap());
    let server = TestServer::start_with(config, dir, vec![path]).await;
    let http = server.http;
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");

    let mut held = Vec::new();
    // One address gets its share, no more.
    for _ in 0..MAX_PER_CLIENT {
        let (conn, status) = open_stream(http, loopback(1), "").await;
        assert_eq!(status, 200);
        held.push(conn);
    }
    assert_eq!(
        open_stream(http, loopback(1), "").await.1,
        503,
        "over its share"
    );
    // Many addresses take everything but the reserve...
    let unreserved = MAX_SUBSCRIBERS - RESERVED_FOR_ADMIN;
    let mut n = 2;
    while held.len() < unreserved {
        for _ in 0..MAX_PER_CLIENT.min(unreserved - held.len()) {
            let (conn, status) = open_stream(http, loopback(n), "").await;
            assert_eq!(status, 200, "address {n}");
            held.push(conn);
        }
        n += 1;
    }
    assert_eq!(
        open_stream(http, loopback(n + 1), "").await.1,
        503,
        "the reserve is not for clients without the token"
    );
    // ...a wrong token gets nothing...
    assert_eq!(
        open_stream(http, loopback(n + 1), "Authorization: Bearer nope\r\n")
            .await
            .1,
        403
    );
    // ...and operators still get a stream, from an address that holds its share too.
    for _ in 0..RESERVED_FOR_ADMIN {
        let (conn, status) = open_stream(http, loopback(1), &bearer).await;
        assert_eq!(status, 200);
        held.push(conn);
    }
    assert_eq!(
        open_stream(http, loopback(1), &bearer).await.1,
        503,
        "{MAX_SUBSCRIBERS} in all"
    );
    // A closed stream frees its place.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (conn, status) = open_stream(http, loopback(1), &bearer).await;
        if status == 200 {
            held.push(conn);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed stream's place never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(held);
    server.stop().await;
}

/// Replaces `path`'s content at once, as a deployment tool does (written elsewhere, renamed into
/// place): `fs::write` truncates first, and the watcher could read the empty file between.
fn replace(path: &std::path::Path, text: &str) {
    let staging = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(staging.path(), text).unwrap();
    staging.persist(path).unwrap();
}

/// The dashboard's last reload, polled until `done` says it is what is wanted (10 s at most).
async fn wait_reload(
    server: &TestServer,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reload =
            server.get("/dashboard/snapshot").await.json()["config"]["last_reload"].clone();
        if done(&reload) {
            return reload;
        }
        assert!(Instant::now() < deadline, "last reload still {reload}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restoring_a_broken_file_clears_the_reload_error_and_breaking_it_again_shows_it_again() {
    let server = TestServer::start(&[("edge.yaml", EDGE)]).await;
    let broken = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5, colour: red}\n";
    replace(&server.files[0], broken);
    let rejected = wait_reload(&server, |r| r["ok"] == false).await;
    assert!(
        rejected["errors"].to_string().contains("colour"),
        "{rejected}"
    );
    // Back to what runs: nothing to install, and the error is gone.
    replace(&server.files[0], EDGE);
    let cleared = wait_reload(&server, |r| r["ok"] == true).await;
    assert_eq!(cleared["version"], 1, "{cleared}");
    assert_eq!(cleared["errors"], serde_json::json!([]), "{cleared}");
    assert_eq!(server.get("/v1/config").await.json()["version"], 1);
    // The same breakage again is news again.
    replace(&server.files[0], broken);
    wait_reload(&server, |r| r["ok"] == false).await;
    assert_eq!(
        server
            .metric("flowgate_config_reloads_total{result=\"failed\",source=\"files\"}")
            .await,
        2.0
    );
    server.stop().await;
}
