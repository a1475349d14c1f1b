//! The gateway over real HTTP/1.1 on loopback: a real upstream (hyper) behind `flowgate serve
//! --upstream`, and a real client in front. Forwarding fidelity, streaming both ways, limits
//! per client IP with the 429's shape, trusted proxies, hop-by-hop fields, 502/504, and the
//! `gateway` section's configuration errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestServer;
use flowgate_server::backend::{Backend, SharedOptions};
use flowgate_server::config::{Policy, Source};
use flowgate_server::server::ServerConfig;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Channel, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

/// How long any single step may take before the test fails (never a timing assumption).
const STEP: Duration = Duration::from_secs(10);

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    headers: HeaderMap,
    body: Bytes,
}

type UpstreamBody = BoxBody<Bytes, Infallible>;

/// A real upstream on 127.0.0.1:0:
/// * `/download/N`: N deterministic bytes, with hop-by-hop fields in the response;
/// * `/stream`: one chunk, then waits for the test to send the rest over `release`;
/// * `/slow`: answers only when the test says so (never, in the 504 test);
/// * `/close`: answers `Connection: close` and closes the connection;
/// * anything else: records the request and echoes its body.
///
/// It counts the connections it accepted and those that have ended, and can close its idle
/// ones (`close_idle`), as an upstream's keep-alive timeout would.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Chunks for `/stream`'s body after the first; dropping it ends the body.
    release: Option<mpsc::Sender<Bytes>>,
    accepted: Arc<AtomicUsize>,
    ended: Arc<AtomicUsize>,
    close_idle: watch::Sender<u32>,
    _stop: oneshot::Sender<()>,
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (release, stream_rx) = mpsc::channel::<Bytes>(4);
        let stream_rx = Arc::new(tokio::sync::Mutex::new(Some(stream_rx)));
        let (stop, mut stopped) = oneshot::channel::<()>();
        let (close_idle, mut close_rx) = watch::channel(0u32);
        let accepted = Arc::new(AtomicUsize::new(0));
        let ended = Arc::new(AtomicUsize::new(0));
        let seen_by_server = seen.clone();
        let (accepted_by_server, ended_by_server) = (accepted.clone(), ended.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = &mut stopped => return,
                    accepted = listener.accept() => accepted.unwrap(),
                };
                accepted_by_server.fetch_add(1, Ordering::SeqCst);
                let seen = seen_by_server.clone();
                let stream_rx = stream_rx.clone();
                let ended = ended_by_server.clone();
                // Only closings asked for after this connection was accepted concern it.
                close_rx.borrow_and_update();
                let mut close_rx = close_rx.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let seen = seen.clone();
                        let stream_rx = stream_rx.clone();
                        async move { Ok::<_, Infallible>(answer(request, seen, stream_rx).await) }
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(connection);
                    loop {
                        tokio::select! {
                            _ = connection.as_mut() => break,
                            // Closes the connection now if idle, else after its response.
                            Ok(()) = close_rx.changed() => connection.as_mut().graceful_shutdown(),
                        }
                    }
                    ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Upstream {
            addr,
            seen,
            release: Some(release),
            accepted,
            ended,
            close_idle,
            _stop: stop,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` connections have ended.
    async fn ended(&self, n: usize) {
        tokio::time::timeout(STEP, async {
            while self.ended.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} upstream connections should have ended"));
    }

    /// Closes every idle connection, as a keep-alive timeout does.
    fn close_idle(&self) {
        self.close_idle.send_modify(|n| *n += 1);
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn answer(
    request: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stream_rx: Arc<tokio::sync::Mutex<Option<mpsc::Receiver<Bytes>>>>,
) -> Response<UpstreamBody> {
    let path = request.uri().path().to_owned();
    if let Some(n) = path.strip_prefix("/download/") {
        let body = pattern(n.parse().unwrap());
        return Response::builder()
            .header("content-type", "application/octet-stream")
            .header("connection", "x-upstream-private")
            .header("x-upstream-private", "secret")
            .header("keep-alive", "timeout=5")
            .header("proxy-authenticate", "Basic")
            .header("x-upstream-public", "kept")
            .body(Full::new(Bytes::from(body)).boxed())
            .unwrap();
    }
    if path == "/stream" {
        let (mut tx, body) = Channel::<Bytes, Infallible>::new(1);
        let mut rx = stream_rx.lock().await.take().expect("one /stream request");
        tokio::spawn(async move {
            tx.send_data(Bytes::from_static(b"first chunk;"))
                .await
                .unwrap();
            while let Some(chunk) = rx.recv().await {
                if tx.send_data(chunk).await.is_err() {
                    return;
                }
            }
        });
        return Response::new(body.boxed());
    }
    if path == "/close" {
        return Response::builder()
            .header("connection", "close")
            .body(Full::new(Bytes::from_static(b"bye")).boxed())
            .unwrap();
    }
    if path == "/slow" {
        std::future::pending::<()>().await;
    }
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    Response::builder()
        .status(201)
        .header("x-echo", "1")
        .body(Full::new(body).boxed())
        .unwrap()
}

/// Serves `yaml` (one file) with a gateway in front of `upstream`.
async fn gateway(yaml: &str, upstream: &str) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.upstream = Some(upstream.parse().unwrap());
    TestServer::start_with(config, dir, vec![path]).await
}

/// A fresh client (its own connection pool).
fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
            .to_str()
            .unwrap()
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Answer {
    let response = tokio::time::timeout(STEP, client.request(request))
        .await
        .expect("an answer in time")
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = tokio::time::timeout(STEP, response.into_body().collect())
        .await
        .expect("the body in time")
        .unwrap()
        .to_bytes();
    Answer {
        status,
        headers,
        body,
    }
}

async fn get(server: &TestServer, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = Request::get(format!("http://{}{path}", server.gateway.unwrap()));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    send(&client(), request.body(Full::default()).unwrap()).await
}

const PASS_ALL: &str = r#"
domain: edge
gateway:
  descriptors:
    - [{key: remote_address}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"#;

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

/// Runs the futures concurrently on the test's runtime and returns their outputs in order.
async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
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

/// Five requests per hour per client IP, X-Forwarded-For believed from `trusted`.
fn per_ip(trusted: &str) -> String {
    format!(
        r#"
domain: edge
gateway:
  trusted_proxies: [{trusted}]
  descriptors:
    - [{{key: remote_address}}]
descriptors:
  - key: remote_address
    rate_limit: {{unit: hour, requests_per_unit: 5, name: per_ip}}
"#
    )
}

/// Sends `n` requests as `xff` (if any) and returns their statuses.
async fn statuses(server: &TestServer, n: usize, xff: Option<&str>) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let headers: Vec<(&str, &str)> = xff.map(|x| ("x-forwarded-for", x)).into_iter().collect();
        out.push(get(server, "/", &headers).await.status);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_per_client_ip_and_429s_have_the_ietf_shape() {
    let upstream = Upstream::start().await;
    // 127.0.0.1 is a trusted proxy: clients are told apart by X-Forwarded-For.
    let server = gateway(&per_ip("127.0.0.1/32"), &upstream.url()).await;
    let a = statuses(&server, 7, Some("203.0.113.1")).await;
    assert_eq!(a, [201, 201, 201, 201, 201, 429, 429]);
    let b = statuses(&server, 6, Some("198.51.100.2")).await;
    assert_eq!(b, [201, 201, 201, 201, 201, 429]);
    assert_eq!(upstream.seen().len(), 10, "denied requests never reach it");

    let allowed = get(&server, "/", &[("x-forwarded-for", "192.0.2.3")]).await;
    let state = sfv::Parser::new(allowed.header("ratelimit").as_bytes())
        .parse::<sfv::List>()
        .unwrap();
    let (item, params) = inner(&state[0]);
    assert_eq!(item.as_string().unwrap().as_str(), "per_ip");
    assert_eq!(
        params
            .get("r")
            .unwrap()
            .as_integer()
            .map(i64::from)
            .unwrap(),
        4
    );

    let denied = get(&server, "/", &[("x-forwarded-for", "203.0.113.1")]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("content-type"), "application/problem+json");
    assert_eq!(denied.header("cache-control"), "no-store");
    let retry: u64 = denied.header("retry-after").parse().unwrap();
    // Sliding window (the default): at most until the next window begins, plus the fifth of
    // it that the previous window's 5 must decay by to leave room for one.
    assert!((1..=3600 + 720).contains(&retry), "{retry}");
    let policy = sfv::Parser::new(denied.header("ratelimit-policy").as_bytes())
        .parse::<sfv::List>()
        .unwrap();
    let (item, params) = inner(&policy[0]);
    assert_eq!(item.as_string().unwrap().as_str(), "per_ip");
    assert_eq!(
        params
            .get("q")
            .unwrap()
            .as_integer()
            .map(i64::from)
            .unwrap(),
        5
    );
    assert_eq!(
        params
            .get("w")
            .unwrap()
            .as_integer()
            .map(i64::from)
            .unwrap(),
        3600
    );
    let state = sfv::Parser::new(denied.header("ratelimit").as_bytes())
        .parse::<sfv::List>()
        .unwrap();
    let (_, params) = inner(&state[0]);
    assert_eq!(
        params
            .get("r")
            .unwrap()
            .as_integer()
            .map(i64::from)
            .unwrap(),
        0
    );
    let t = params
        .get("t")
        .unwrap()
        .as_integer()
        .map(i64::from)
        .unwrap();
    assert_eq!(
        u64::try_from(t).unwrap(),
        retry,
        "t agrees with Retry-After"
    );
    let problem = denied.json();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"][0], "per_ip");
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("#quota-exceeded"),
        "{problem}"
    );

    assert_eq!(
        server
            .metric(r#"flowgate_gateway_responses_total{outcome="limited"}"#)
            .await,
        4.0
    );
    assert_eq!(
        server
            .metric(r#"flowgate_hits_total{domain="edge",rule="remote_address"}"#)
            .await,
        15.0
    );
    server.stop().await;
}

fn inner(member: &sfv::ListEntry) -> (&sfv::BareItem, &sfv::Parameters) {
    match member {
        sfv::ListEntry::Item(item) => (&item.bare_item, &item.params),
        sfv::ListEntry::InnerList(_) => panic!("an item, not an inner list"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_from_an_untrusted_peer_is_ignored() {
    let upstream = Upstream::start().await;
    let server = gateway(&per_ip("10.0.0.0/8"), &upstream.url()).await;
    // Every "client" is really 127.0.0.1, which is not trusted: one shared budget.
    let mut all = Vec::new();
    for i in 0..7 {
        let xff = format!("203.0.113.{i}");
        all.push(get(&server, "/", &[("x-forwarded-for", &xff)]).await.status);
    }
    assert_eq!(all, [201, 201, 201, 201, 201, 429, 429]);
    // The spoofed hop is passed on (the upstream decides whom it trusts), with ours appended.
    assert_eq!(
        upstream.seen()[0].headers["x-forwarded-for"],
        "203.0.113.0, 127.0.0.1"
    );
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

/// Writes `raw` on a new connection to `addr` and reads the whole answer (the gateway closes
/// the connection after an error).
async fn raw(addr: SocketAddr, raw: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(raw.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(STEP, stream.read(&mut buf))
            .await
            .expect("the gateway answers")
            .unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if out.windows(4).any(|w| w == b"\r\n\r\n") && String::from_utf8_lossy(&out).contains('}') {
            break;
        }
    }
    String::from_utf8(out).unwrap()
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
    // A port that nothing listens on any more.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let server = gateway(PASS_ALL, &format!("http://{addr}")).await;
    let answer = get(&server, "/", &[]).await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.header("content-type"), "application/problem+json");
    assert_eq!(answer.json()["status"], 502);
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
    // The gateway still serves others.
    assert_eq!(get(&server, "/fine", &[]).await.status, 201);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_with_a_missing_source_are_skipped() {
    let upstream = Upstream::start().await;
    let yaml = r#"
domain: edge
gateway:
  descriptors:
    - [{key: header, header: x-api-key, as: api_key}, {key: method}]
    - [{key: generic_key, value: everyone}]
descriptors:
  - key: api_key
    descriptors:
      - key: method
        value: POST
        rate_limit: {unit: hour, requests_per_unit: 1, name: posts_per_key}
  - key: generic_key
    rate_limit: {unit: hour, requests_per_unit: 3, name: everyone}
"#;
    let server = gateway(yaml, &upstream.url()).await;
    let post = |key: Option<&'static str>| {
        let mut request = Request::post(format!("http://{}/", server.gateway.unwrap()));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        request.body(Full::default()).unwrap()
    };
    let c = client();
    assert_eq!(send(&c, post(Some("k1"))).await.status, 201);
    assert_eq!(send(&c, post(Some("k1"))).await.status, 429);
    // Without the header, only the `everyone` descriptor applies. (The denied request above
    // consumed nothing, so `everyone` has counted 1 so far.)
    assert_eq!(send(&c, post(None)).await.status, 201);
    assert_eq!(send(&c, post(Some("k2"))).await.status, 201);
    let last = send(&c, post(None)).await;
    assert_eq!(last.status, 429);
    assert_eq!(last.json()["violated-policies"][0], "everyone");
    server.stop().await;
}

fn config_errors(yaml: &str) -> Vec<String> {
    let source = Source {
        path: PathBuf::from("gw.yaml"),
        text: yaml.to_owned(),
    };
    Policy::from_sources(vec![source])
        .unwrap_err()
        .0
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn gateway_section_errors_name_file_line_column_and_field() {
    let errors = config_errors(
        "domain: d\ngateway:\n  listen: nowhere\n  trusted_proxies: [10.0.0.0/8, ten]\n  ipv6_prefix: 129\n  upstream_timeout: soon\n  descriptors:\n    - [{key: header}]\n    - [{key: cookie}]\n    - [{key: path, header: x}]\n    - [{key: jwt_claim, claim: sub}]\n",
    );
    assert_eq!(
        errors,
        [
            "gw.yaml:3:11: `gateway.listen`: `nowhere` is not an address; write e.g. `127.0.0.1:8000`",
            "gw.yaml:4:33: `gateway.trusted_proxies`: `ten` is not a network or address; write e.g. `10.0.0.0/8` or `192.0.2.1`",
            "gw.yaml:5:16: `gateway.ipv6_prefix`: must be between 0 and 128",
            "gw.yaml:6:21: `gateway.upstream_timeout`: `soon` is not a duration (expected number at 0); write e.g. `30s`, `500ms`",
            "gw.yaml:8:8: `gateway.descriptors.header`: is required with `key: header`",
            "gw.yaml:9:14: `gateway.descriptors.key`: unknown source `cookie`; expected one of remote_address, header, path, method, host, jwt_claim, generic_key",
            "gw.yaml:10:28: `gateway.descriptors.header`: does not apply to `key: path`",
            "gw.yaml:11:14: `gateway.descriptors.key`: `jwt_claim` needs a `gateway.jwt` block saying how tokens are verified",
        ]
    );
    let unknown =
        config_errors("domain: d\ngateway:\n  descriptors: [[{key: path}]]\n  listn: x\n");
    assert!(
        unknown[0].starts_with("gw.yaml:4:3: unknown field `listn`"),
        "{unknown:?}"
    );
    let missing = config_errors("domain: d\ngateway:\n  listen: 127.0.0.1:1\n");
    assert_eq!(
        missing,
        [
            "gw.yaml:3:3: `gateway.descriptors`: is required: the request descriptors to check, e.g. `[[{key: remote_address}]]`"
        ]
    );
    let env = config_errors(
        "domain: d\ngateway:\n  jwt: {hs256_secret_env: FLOWGATE_TEST_UNSET_VARIABLE}\n  descriptors: [[{key: jwt_claim, claim: plan}]]\n",
    );
    assert_eq!(
        env,
        [
            "gw.yaml:3:27: `gateway.jwt.hs256_secret_env`: the environment variable `FLOWGATE_TEST_UNSET_VARIABLE` is not set"
        ]
    );
}

#[test]
fn only_one_file_may_have_a_gateway_section() {
    let file = |name: &str, domain: &str| Source {
        path: PathBuf::from(name),
        text: format!("domain: {domain}\ngateway:\n  descriptors: [[{{key: path}}]]\n"),
    };
    let errors = Policy::from_sources(vec![file("a.yaml", "a"), file("b.yaml", "b")]).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "b.yaml:3:3: `gateway`: only one configuration file may have a `gateway` section; a.yaml has one too"
    );
}

/// A store that cannot be reached.
struct DownStore;

impl flowgate::store::Store for DownStore {
    async fn check(
        &self,
        _ask: flowgate::store::Ask<'_>,
    ) -> Result<flowgate::Decision, flowgate::store::StoreError> {
        Err(flowgate::store::StoreError::Unavailable(
            "test store is down".into(),
        ))
    }

    async fn refund(
        &self,
        _key: &str,
        _quota: &flowgate::Quota,
        _units: u64,
    ) -> Result<(), flowgate::store::StoreError> {
        Ok(())
    }

    async fn reset(
        &self,
        _key: &str,
        _quota: &flowgate::Quota,
    ) -> Result<(), flowgate::store::StoreError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_follows_each_rules_fail_mode() {
    let upstream = Upstream::start().await;
    let yaml = r#"
domain: edge
gateway:
  descriptors:
    - [{key: header, header: x-tier, as: tier}]
descriptors:
  - key: tier
    value: lenient
    rate_limit: {unit: second, requests_per_unit: 10, fail: open}
  - key: tier
    value: strict
    rate_limit: {unit: second, requests_per_unit: 10, fail: closed}
  - key: tier
    value: default
    rate_limit: {unit: second, requests_per_unit: 10}
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    // The fail modes are applied by the fallback store around a shared store; rules that name
    // none fail closed here.
    let options = SharedOptions {
        fail: flowgate::FailMode::Closed,
        instances: 1,
    };
    config.backend = Backend::shared(Arc::new(DownStore), options);
    config.upstream = Some(upstream.url().parse().unwrap());
    let server = TestServer::start_with(config, dir, vec![path]).await;

    let open = get(&server, "/", &[("x-tier", "lenient")]).await;
    assert_eq!(open.status, 201);
    assert_eq!(open.header("flowgate-fallback"), "open");
    for tier in ["strict", "default"] {
        let closed = get(&server, "/", &[("x-tier", tier)]).await;
        assert_eq!(closed.status, 503, "{tier}");
        assert_eq!(closed.header("content-type"), "application/problem+json");
        assert_eq!(closed.header("cache-control"), "no-store");
        assert_eq!(closed.header("flowgate-fallback"), "closed");
        assert!(closed.header("retry-after").parse::<u64>().unwrap() >= 1);
    }
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(
        server
            .metric(r#"flowgate_fallback_decisions_total{mode="open"}"#)
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_gateway_section_applies_without_a_restart() {
    let upstream = Upstream::start().await;
    let server = gateway(&per_ip("10.0.0.0/8"), &upstream.url()).await;
    assert_eq!(get(&server, "/", &[]).await.status, 201);
    // Now count per API key instead, 1 per hour.
    let by_key = r#"
domain: edge
gateway:
  descriptors:
    - [{key: header, header: x-api-key, as: api_key}]
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1, name: per_key}
"#;
    std::fs::write(&server.files[0], by_key).unwrap();
    // Bounded wait for the reload (file watching; 10 s at most).
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let version = server.get("/v1/config").await.json()["version"].as_u64();
        if version == Some(2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reload ({version:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let key = [("x-api-key", "k")];
    assert_eq!(get(&server, "/", &key).await.status, 201);
    let denied = get(&server, "/", &key).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.json()["violated-policies"][0], "per_key");
    // Without a key, the only descriptor is skipped: no limit applies.
    for _ in 0..3 {
        assert_eq!(get(&server, "/", &[]).await.status, 201);
    }
    server.stop().await;
}
