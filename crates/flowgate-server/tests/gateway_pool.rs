//! The gateway's upstream connection pool: connections shared across clients, closed ones
//! replaced, idle ones let go — counted by a real upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flowgate_testing::upstream::*;
use http_body_util::Full;
use hyper::Request;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_shared_and_closed_ones_replaced() {
    let upstream = Upstream::start().await;
    let server = gateway(PASS_ALL, &upstream.url()).await;
    // Ten clients one after another, each on its own connection: one upstream connection.
    for i in 0..10 {
        let answer = get(&server, &format!("/n/{i}"), &[]).await;
        assert_eq!(answer.status, 201);
    }
    assert_eq!(upstream.accepted(), 1, "the upstream connection is reused");
    assert_eq!(server.metric(CONNECTS).await, 1.0);
    assert_eq!(server.metric(IDLE).await, 1.0);
    // A response without a body (HEAD) gives its connection back too.
    let head = Request::head(format!("http://{}/head", server.gateway.unwrap()))
        .body(Full::default())
        .unwrap();
    let answer = send(&client(), head).await;
    assert_eq!((answer.status, answer.body.len()), (201, 0));
    assert_eq!(get(&server, "/after-head", &[]).await.status, 201);
    assert_eq!(upstream.accepted(), 1, "reused after a HEAD");

    // The upstream closes the connection after a response: the next request opens another.
    let bye = get(&server, "/close", &[]).await;
    assert_eq!((bye.status, &bye.body[..]), (200, &b"bye"[..]));
    assert!(
        bye.headers.get("connection").is_none(),
        "hop-by-hop Connection is not forwarded"
    );
    upstream.ended(1).await;
    assert_eq!(get(&server, "/after-close", &[]).await.status, 201);
    assert_eq!(upstream.accepted(), 2);

    // The upstream drops its idle connections (a keep-alive timeout): the pooled one is found
    // closed, and the request goes out on a new one instead of failing.
    upstream.close_idle();
    upstream.ended(2).await;
    assert_eq!(get(&server, "/after-idle-close", &[]).await.status, 201);
    assert_eq!(upstream.accepted(), 3);

    // Concurrent clients get connections of their own, all kept for later.
    let gateway = server.gateway.unwrap();
    let answers = futures_join_all((0..8).map(|i| {
        let request = Request::get(format!("http://{gateway}/c/{i}"))
            .body(Full::default())
            .unwrap();
        async move { send(&client(), request).await.status }
    }))
    .await;
    assert_eq!(answers, [201; 8]);
    let after_burst = upstream.accepted();
    assert!((3..=3 + 8).contains(&after_burst), "{after_burst}");
    for i in 0..8 {
        assert_eq!(get(&server, &format!("/again/{i}"), &[]).await.status, 201);
    }
    assert_eq!(
        upstream.accepted(),
        after_burst,
        "idle connections are reused"
    );
    assert_eq!(server.metric(CONNECTS).await, after_burst as f64);
    // All but the two the upstream closed are idle, ready for the next requests.
    assert_eq!(server.metric(IDLE).await, (after_burst - 2) as f64);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_the_upstream_closed_are_let_go() {
    let upstream = Upstream::start().await;
    let server = gateway(PASS_ALL, &upstream.url()).await;
    assert_eq!(get(&server, "/one", &[]).await.status, 201);
    assert_eq!(server.metric(IDLE).await, 1.0);
    // The upstream closes it while idle; nobody sends a request, so only the pool's sweeper
    // (every 5 s) can notice and close the gateway's end instead of leaving it in CLOSE_WAIT.
    upstream.close_idle();
    upstream.ended(1).await;
    let let_go = tokio::time::timeout(Duration::from_secs(12), async {
        while server.metric(IDLE).await != 0.0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(let_go.is_ok(), "the closed connection is still in the pool");
    assert_eq!(get(&server, "/two", &[]).await.status, 201);
    assert_eq!(server.metric(CONNECTS).await, 2.0);
    server.stop().await;
}

const CONNECTS: &str = "flowgate_gateway_upstream_connects_total";
const IDLE: &str = "flowgate_gateway_upstream_idle_connections";
