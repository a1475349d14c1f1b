//! The gateway's in-flight limits (`gateway.in_flight`): a request holds a lease from its
//! arrival to the end of its response body. Responses are held open by an upstream that
//! answers `/hold/ID` with a first chunk and ends the body only when the test says so; the
//! tests wait on its signals, and read the leases held through `/v1/leases`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flowgate_server::backend::{Backend, SharedOptions};
use flowgate_server::config::{Policy, Source};
use flowgate_server::server::ServerConfig;
use flowgate_testing::STEP;
use flowgate_testing::leases::AwayLeases;
use flowgate_testing::redis::RedisServer;
use flowgate_testing::server::{TestServer, wait_metric};
use flowgate_testing::upstream::{Answer, client, send};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Channel, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// An upstream whose `/hold/ID` responses stay open: it sends `started;`, reports
/// `(ID, finish)` to the test, and ends the body with `done` when `finish` is sent (or
/// dropped). Anything else is answered `ok` at once.
struct Holding {
    addr: SocketAddr,
    started: mpsc::UnboundedReceiver<(String, oneshot::Sender<()>)>,
    /// The finish signals of the responses started and not yet finished, by ID.
    open: HashMap<String, oneshot::Sender<()>>,
}

impl Holding {
    async fn start() -> Holding {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, started) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let tx = tx.clone();
                        async move { Ok::<_, Infallible>(answer(request, tx)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Holding {
            addr,
            started,
            open: HashMap::new(),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits for the upstream to start the response `/hold/{id}`.
    async fn started(&mut self, id: &str) {
        while !self.open.contains_key(id) {
            let (started, finish) = tokio::time::timeout(STEP, self.started.recv())
                .await
                .expect("the upstream starts the response in time")
                .unwrap();
            self.open.insert(started, finish);
        }
    }

    /// Ends the body of `/hold/{id}`.
    fn finish(&mut self, id: &str) {
        let _ = self.open.remove(id).expect("started").send(());
    }

    /// How many `/hold` responses the upstream has started (the requests it was sent).
    fn count_started(&mut self) -> usize {
        while let Ok((id, finish)) = self.started.try_recv() {
            self.open.insert(id, finish);
        }
        self.open.len()
    }
}

fn answer(
    request: Request<Incoming>,
    started: mpsc::UnboundedSender<(String, oneshot::Sender<()>)>,
) -> Response<BoxBody<Bytes, Infallible>> {
    let Some(id) = request.uri().path().strip_prefix("/hold/") else {
        return Response::new(Full::new(Bytes::from_static(b"ok")).boxed());
    };
    let id = id.to_owned();
    let (mut body, rx) = Channel::<Bytes, Infallible>::new(1);
    tokio::spawn(async move {
        if body
            .send_data(Bytes::from_static(b"started;"))
            .await
            .is_err()
        {
            return;
        }
        let (finish, finished) = oneshot::channel();
        let _ = started.send((id, finish));
        let _ = finished.await;
        let _ = body.send_data(Bytes::from_static(b"done")).await;
    });
    Response::new(rx.boxed())
}

/// Limit 2 per `x-api-key`, each request also rate limited per key (`per_key_rate` an hour).
fn config(limit: u64, per_key_rate: u64) -> String {
    format!(
        r#"
domain: edge
gateway:
  descriptors:
    - [{{key: header, header: x-api-key}}]
  in_flight:
    - limit: checkout
      key: [{{key: header, header: x-api-key}}]
descriptors:
  - key: x-api-key
    rate_limit: {{unit: hour, requests_per_unit: {per_key_rate}, name: per_key}}
concurrency:
  - {{name: checkout, limit: {limit}, lease_time: 30s}}
"#
    )
}

async fn serve(yaml: &str, upstream: &str, backend: Option<Backend>) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.upstream = Some(upstream.parse().unwrap());
    if let Some(backend) = backend {
        config.backend = backend;
    }
    TestServer::start_with(config, dir, vec![path]).await
}

/// `GET path` as `key` through `server`'s gateway; the response head, its body unread.
async fn open(server: &TestServer, path: &str, key: &str) -> Response<Incoming> {
    let request = Request::get(format!("http://{}{path}", server.gateway.unwrap()))
        .header("x-api-key", key)
        .body(Full::default())
        .unwrap();
    tokio::time::timeout(STEP, client().request(request))
        .await
        .expect("a response head in time")
        .unwrap()
}

/// `GET path` as `key`, read whole.
async fn get(server: &TestServer, path: &str, key: &str) -> Answer {
    let request = Request::get(format!("http://{}{path}", server.gateway.unwrap()))
        .header("x-api-key", key)
        .body(Full::default())
        .unwrap();
    send(&client(), request).await
}

/// Leases of `checkout` that `key` holds, as `/v1/leases` counts them.
async fn held(server: &TestServer, key: &str) -> u64 {
    let answer = server.get(&format!("/v1/leases/checkout/{key}")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.json()["held"].as_u64().unwrap()
}

/// Waits (bounded) until `key` holds `n` leases: a release runs on a task of its own.
async fn wait_held(server: &TestServer, key: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let now = held(server, key).await;
        if now == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} holds {now} leases, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Reads a held response's body to its end.
async fn read_to_end(response: Response<Incoming>) -> Bytes {
    tokio::time::timeout(STEP, response.into_body().collect())
        .await
        .expect("the body ends in time")
        .unwrap()
        .to_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_third_request_in_flight_is_refused_until_a_body_ends() {
    let mut upstream = Holding::start().await;
    let server = serve(&config(2, 1000), &upstream.url(), None).await;
    let first = open(&server, "/hold/1", "alice").await;
    upstream.started("1").await;
    let second = open(&server, "/hold/2", "alice").await;
    upstream.started("2").await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    assert_eq!(held(&server, "alice").await, 2);

    // Both slots held: the third is refused at once, a problem like the gateway's other 429s.
    let third = get(&server, "/hold/3", "alice").await;
    assert_eq!(third.status, 429);
    assert_eq!(third.header("content-type"), "application/problem+json");
    assert_eq!(third.header("cache-control"), "no-store");
    assert_eq!(third.header("retry-after"), "30");
    let problem = third.json();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"][0], "checkout");
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("#quota-exceeded"),
        "{problem}"
    );
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("2 requests of `checkout` are in flight"),
        "{problem}"
    );
    assert_eq!(
        upstream.count_started(),
        2,
        "the refused request never left"
    );

    // Another key has slots of its own.
    let bob = open(&server, "/hold/b", "bob").await;
    upstream.started("b").await;
    assert_eq!(bob.status(), 200);
    assert_eq!(held(&server, "bob").await, 1);

    // The first body ends: its slot comes back, and the next request is admitted.
    upstream.finish("1");
    assert_eq!(&read_to_end(first).await[..], b"started;done");
    wait_held(&server, "alice", 1).await;
    let next = get(&server, "/plain", "alice").await;
    assert_eq!((next.status, &next.body[..]), (200, &b"ok"[..]));
    // A response read whole (known length) let its lease go too.
    wait_held(&server, "alice", 1).await;

    assert_eq!(
        server
            .metric(r#"flowgate_gateway_responses_total{outcome="in_flight_limited"}"#)
            .await,
        1.0
    );
    // alice's second and bob's are still in flight.
    wait_metric(&server, "flowgate_gateway_in_flight_leases", 2.0).await;
    upstream.finish("2");
    upstream.finish("b");
    read_to_end(second).await;
    read_to_end(bob).await;
    wait_metric(&server, "flowgate_gateway_in_flight_leases", 0.0).await;
    assert_eq!(held(&server, "alice").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_for_concurrency_spend_no_rate_units_and_rate_refusals_hold_no_lease() {
    let mut upstream = Holding::start().await;
    // One in flight per key; 3 requests an hour per key.
    let server = serve(&config(1, 3), &upstream.url(), None).await;
    let first = open(&server, "/hold/1", "carol").await;
    upstream.started("1").await;
    let remaining = |a: &Answer| a.header("ratelimit").to_owned();
    let state = first.headers()["ratelimit"].to_str().unwrap();
    assert!(state.starts_with(r#""per_key";r=2;"#), "{state}");
    // Refused for concurrency: the rate limit is not asked, so no unit is spent.
    let refused = get(&server, "/plain", "carol").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["violated-policies"][0], "checkout");
    upstream.finish("1");
    read_to_end(first).await;
    wait_held(&server, "carol", 0).await;
    let second = get(&server, "/plain", "carol").await;
    assert_eq!(second.status, 200);
    assert!(remaining(&second).contains("r=1"), "{}", remaining(&second));
    // A lease is released on a task of its own once the body has ended, which may be after
    // the client has read it: wait for it rather than race it.
    wait_held(&server, "carol", 0).await;
    let third = get(&server, "/plain", "carol").await;
    assert_eq!(third.status, 200);
    assert!(remaining(&third).contains("r=0"), "{}", remaining(&third));
    wait_held(&server, "carol", 0).await;
    // Refused by the rate limit: the lease it took is given back before the 429 is sent.
    let limited = get(&server, "/plain", "carol").await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.json()["violated-policies"][0], "per_key");
    assert_eq!(held(&server, "carol").await, 0);
    assert_eq!(
        server
            .metric(r#"flowgate_gateway_responses_total{outcome="limited"}"#)
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_mid_body_releases_its_lease() {
    let mut upstream = Holding::start().await;
    let server = serve(&config(1, 1000), &upstream.url(), None).await;
    let mut stream = TcpStream::connect(server.gateway.unwrap()).await.unwrap();
    stream
        .write_all(b"GET /hold/1 HTTP/1.1\r\nhost: gw\r\nx-api-key: dave\r\n\r\n")
        .await
        .unwrap();
    upstream.started("1").await;
    // Read until the first chunk has arrived: the response is streaming.
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("started;") {
        let n = tokio::time::timeout(STEP, stream.read(&mut buf))
            .await
            .expect("the first chunk in time")
            .unwrap();
        assert!(
            n > 0,
            "the gateway closed: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    assert_eq!(held(&server, "dave").await, 1);
    assert_eq!(get(&server, "/plain", "dave").await.status, 429);
    // The client goes away mid-body; the upstream's response is still open.
    drop(stream);
    wait_held(&server, "dave", 0).await;
    assert_eq!(get(&server, "/plain", "dave").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_streaming_past_the_lease_time_keeps_its_lease() {
    let mut upstream = Holding::start().await;
    // Leases of 1 s, renewed every 500 ms while their request is in flight.
    let yaml = config(1, 1000).replace("lease_time: 30s", "lease_time: 1s");
    let server = serve(&yaml, &upstream.url(), None).await;
    let first = open(&server, "/hold/1", "gina").await;
    upstream.started("1").await;
    // Real time has to pass here: three lease times, during which the lease must be renewed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(held(&server, "gina").await, 1, "renewed, not expired");
    assert_eq!(get(&server, "/plain", "gina").await.status, 429);
    assert_eq!(
        server.metric("flowgate_gateway_leases_lost_total").await,
        0.0
    );
    upstream.finish("1");
    read_to_end(first).await;
    wait_held(&server, "gina", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_away_refuses_with_503_when_closed_and_admits_when_open() {
    let upstream = Holding::start().await;
    let yaml = r#"
domain: edge
gateway:
  descriptors: [[{key: remote_address}]]
  in_flight:
    - {limit: strict, key: [{key: header, header: x-api-key}]}
    - {limit: lenient, key: [{key: remote_address}, {key: path}]}
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1000}
concurrency:
  - {name: strict, limit: 5, fail: closed}
  - {name: lenient, limit: 5, fail: open}
"#;
    let backend = Backend::default().with_shared_leases(Arc::new(AwayLeases));
    let server = serve(yaml, &upstream.url(), Some(backend)).await;
    // With an API key, the `strict` limit applies and fails closed.
    let closed = get(&server, "/plain", "erin").await;
    assert_eq!(closed.status, 503);
    assert_eq!(closed.header("content-type"), "application/problem+json");
    assert_eq!(closed.header("flowgate-fallback"), "closed");
    assert!(closed.header("retry-after").parse::<u64>().unwrap() >= 1);
    // Without one, only `lenient` applies (a request lacking a key's value holds no lease of
    // it), and it fails open.
    let request = Request::get(format!("http://{}/plain", server.gateway.unwrap()))
        .body(Full::default())
        .unwrap();
    let open = send(&client(), request).await;
    assert_eq!(open.status, 200);
    // A key value that cannot be a key (the header twice) is a 400, before any store call.
    let request = Request::get(format!("http://{}/plain", server.gateway.unwrap()))
        .header("x-api-key", "a")
        .header("x-api-key", "b")
        .body(Full::default())
        .unwrap();
    let rejected = send(&client(), request).await;
    assert_eq!(rejected.status, 400);
    assert_eq!(rejected.header("content-type"), "application/problem+json");
    assert!(
        rejected.json()["detail"]
            .as_str()
            .unwrap()
            .contains("more than once"),
        "{}",
        rejected.json()
    );
    assert_eq!(
        server
            .metric(r#"flowgate_gateway_responses_total{outcome="unavailable"}"#)
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_redis_never_exceed_the_limit_together() {
    let Some(redis) =
        RedisServer::start("two_gateways_sharing_redis_never_exceed_the_limit_together")
    else {
        return;
    };
    let mut upstream = Holding::start().await;
    let backend = || async {
        let store = flowgate::store::RedisStore::builder(redis.url())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let leases = Arc::new(store.leases());
        Backend::shared(Arc::new(store), SharedOptions::default()).with_shared_leases(leases)
    };
    let yaml = config(2, 1000);
    let a = serve(&yaml, &upstream.url(), Some(backend().await)).await;
    let b = serve(&yaml, &upstream.url(), Some(backend().await)).await;
    let servers = [Arc::new(a), Arc::new(b)];

    // Ten requests at once, alternately through each gateway: two are admitted, whatever the
    // order, since no lease is released meanwhile.
    let mut tasks = Vec::new();
    for i in 0..10 {
        let server = servers[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let response = open(&server, &format!("/hold/{i}"), "frank").await;
            (i, response)
        }));
    }
    let mut admitted = Vec::new();
    let mut refused = 0;
    for task in tasks {
        let (i, response) = task.await.unwrap();
        match response.status().as_u16() {
            200 => admitted.push((i, response)),
            429 => {
                read_to_end(response).await;
                refused += 1;
            }
            other => panic!("request {i}: {other}"),
        }
    }
    assert_eq!((admitted.len(), refused), (2, 8));
    for (i, _) in &admitted {
        upstream.started(&i.to_string()).await;
    }
    assert_eq!(upstream.count_started(), 2);
    assert_eq!(held(&servers[0], "frank").await, 2);
    assert_eq!(held(&servers[1], "frank").await, 2);

    // One body ends on one gateway: the other gateway admits the next request.
    let (i, response) = admitted.remove(0);
    let other = &servers[1 - i % 2];
    upstream.finish(&i.to_string());
    read_to_end(response).await;
    wait_held(other, "frank", 1).await;
    let next = get(other, "/plain", "frank").await;
    assert_eq!(next.status, 200);
    assert_eq!(get(other, "/plain", "frank").await.status, 200);
    let (j, last) = admitted.remove(0);
    upstream.finish(&j.to_string());
    read_to_end(last).await;
    wait_held(&servers[0], "frank", 0).await;
}

#[test]
fn an_unknown_concurrency_limit_is_an_error_at_its_line_and_field() {
    let error = |files: &[(&str, &str)]| {
        let sources = files
            .iter()
            .map(|(name, text)| Source {
                path: (*name).into(),
                text: (*text).to_owned(),
            })
            .collect();
        Policy::from_sources(sources)
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    let gateway = "domain: edge\ngateway:\n  descriptors: [[{key: remote_address}]]\n  in_flight:\n    - limit: checkuot\n      key: [{key: header, header: x-api-key}]\n    - {limit: checkout, key: []}\n    - {limit: checkout, key: [{key: cookie}]}\n    - {limit: checkout, key: [{key: path, as: p}]}\n";
    assert_eq!(
        error(&[
            ("gw.yaml", gateway),
            (
                "pay.yaml",
                "domain: pay\nconcurrency: [{name: checkout, limit: 2}]\n"
            ),
        ]),
        [
            "gw.yaml:7:30: `gateway.in_flight.key`: needs at least one entry, e.g. `[{key: remote_address}]`",
            "gw.yaml:8:37: `gateway.in_flight.key.key`: unknown source `cookie`; expected one of remote_address, header, path, method, host, jwt_claim, generic_key",
            "gw.yaml:9:47: `gateway.in_flight.key.as`: does not apply to an `in_flight` key (it names descriptor entries)",
        ]
    );
    let fixed = "domain: edge\ngateway:\n  descriptors: [[{key: remote_address}]]\n  in_flight:\n    - limit: checkuot\n      key: [{key: header, header: x-api-key}]\n";
    assert_eq!(
        error(&[
            ("gw.yaml", fixed),
            (
                "pay.yaml",
                "domain: pay\nconcurrency: [{name: checkout, limit: 2}]\n"
            ),
        ]),
        [
            "gw.yaml:5:14: `gateway.in_flight.limit`: no concurrency limit named `checkuot`; the configuration defines checkout"
        ]
    );
    assert_eq!(
        error(&[("gw.yaml", fixed)]),
        [
            "gw.yaml:5:14: `gateway.in_flight.limit`: no concurrency limit named `checkuot`; no file has a `concurrency` section"
        ]
    );
    // Defined by another file: fine.
    let ok = "domain: edge\ngateway:\n  descriptors: [[{key: remote_address}]]\n  in_flight:\n    - limit: checkout\n      key: [{key: header, header: x-api-key}]\n";
    let policy = Policy::from_sources(vec![
        Source {
            path: "gw.yaml".into(),
            text: ok.to_owned(),
        },
        Source {
            path: "pay.yaml".into(),
            text: "domain: pay\nconcurrency: [{name: checkout, limit: 2, lease_time: 5s}]\n"
                .to_owned(),
        },
    ])
    .unwrap();
    let in_flight = &policy.gateway.unwrap().in_flight;
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0].limit.terms.limit(), 2);
    assert_eq!(in_flight[0].limit.terms.ttl(), Duration::from_secs(5));
}

/// docs/service.md's `in_flight` example is valid and means what it says.
#[test]
fn the_documented_in_flight_section_is_valid() {
    let shown = flowgate_testing::docs::marked_yaml(
        &flowgate_testing::docs::read("docs/service.md"),
        "gateway-in-flight-yaml",
    );
    let policy = Policy::from_sources(vec![Source {
        path: "docs/service.md".into(),
        text: shown,
    }])
    .unwrap_or_else(|e| panic!("{e}"));
    let in_flight = policy.gateway.unwrap().in_flight;
    let summary: Vec<(String, u64, usize)> = in_flight
        .iter()
        .map(|item| (item.name.clone(), item.limit.terms.limit(), item.key.len()))
        .collect();
    assert_eq!(
        summary,
        [("checkout".into(), 20, 1), ("per_client".into(), 4, 2)]
    );
    assert_eq!(in_flight[1].limit.fail, flowgate::FailMode::Open);
}
