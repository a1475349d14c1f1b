//! docs/llm-token-budgets.md played end to end: the guide's Flowgate file (`docs/llm/llm.yaml`)
//! in front of a small OpenAI-compatible upstream that streams server-sent events and answers
//! JSON. Users are allowed until the tokens charged pass their budget, then refused with a
//! `Retry-After` that reflects the debt; others are unaffected; the stream is not buffered;
//! usage that cannot be read is counted, not charged, and breaks nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use flowgate_server::server::ServerConfig;
use flowgate_testing::server::{TestServer, wait_metric};
use flowgate_testing::upstream::{STEP, client, get};
use http_body_util::{BodyExt, Channel, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// The chunks of a streamed completion (OpenAI's shape with `include_usage`: `"usage": null`
/// in every chunk, then one with the usage, then `[DONE]`).
fn events(total: u64) -> Vec<Bytes> {
    let chunk = |text: &str| {
        Bytes::from(format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}],\"usage\":null}}\n\n"
        ))
    };
    vec![
        chunk("Hel"),
        chunk("lo"),
        Bytes::from(format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{total}}}}}\n\n",
            total / 2,
            total - total / 2
        )),
        Bytes::from_static(b"data: [DONE]\n\n"),
    ]
}

/// What the upstream answers (by path):
/// * `/stream/N`: the events of a completion of N tokens, each its own chunk; with `?gate`,
///   the first alone until the test calls `gate.notify_one()`; `/stream/none`: without the
///   usage event;
/// * `/json/N`: a completion of N tokens as one JSON document;
/// * `/json/bad`: one whose `total_tokens` is not a number;
/// * `/cut`: the first event (with `?usage`: and the usage event of 250 tokens), then
///   (released by `gate`) the body breaks off.
async fn answer(
    request: Request<Incoming>,
    gate: Arc<Notify>,
) -> Response<BoxBody<Bytes, std::io::Error>> {
    let path = request.uri().path().to_owned();
    let gated = request.uri().query() == Some("gate");
    if let Some(n) = path.strip_prefix("/stream/") {
        let chunks = match n {
            // A stream asked for without `include_usage`: no usage event.
            "none" => {
                let mut chunks = events(0);
                chunks.remove(2);
                chunks
            }
            n => events(n.parse().unwrap()),
        };
        let (mut tx, body) = Channel::<Bytes, std::io::Error>::new(1);
        tokio::spawn(async move {
            for (i, chunk) in chunks.into_iter().enumerate() {
                if i == 1 && gated {
                    gate.notified().await;
                }
                if tx.send_data(chunk).await.is_err() {
                    return;
                }
            }
        });
        return Response::builder()
            .header("content-type", "text/event-stream")
            .body(body.boxed())
            .unwrap();
    }
    if path == "/cut" {
        let with_usage = request.uri().query() == Some("usage");
        let (mut tx, body) = Channel::<Bytes, std::io::Error>::new(1);
        tokio::spawn(async move {
            let mut sent = vec![events(0).remove(0)];
            if with_usage {
                sent.push(events(250).remove(2));
            }
            for chunk in sent {
                if tx.send_data(chunk).await.is_err() {
                    return;
                }
            }
            // Once the client has the first event, the body ends with an error: the
            // upstream's connection breaks mid-body.
            gate.notified().await;
            tx.abort(std::io::Error::other("cut"));
        });
        return Response::builder()
            .header("content-type", "text/event-stream")
            .body(body.boxed())
            .unwrap();
    }
    let usage = match path.strip_prefix("/json/") {
        Some("bad") => "\"lots\"".to_owned(),
        Some(n) => n.to_owned(),
        None => panic!("unexpected path {path}"),
    };
    let json = format!(
        r#"{{"id":"c2","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"Hi"}}}}],"usage":{{"prompt_tokens":1,"completion_tokens":1,"total_tokens":{usage}}}}}"#
    );
    Response::builder()
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(json))
                .map_err(|never| match never {})
                .boxed(),
        )
        .unwrap()
}

/// Serves [`answer`] on `listener`; `gate` releases the gated streams.
fn serve_upstream(listener: TcpListener, gate: Arc<Notify>) {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let gate = gate.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let gate = gate.clone();
                    async move { Ok::<_, Infallible>(answer(request, gate).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

/// The guide's Flowgate file served with a gateway in front of an upstream on `listener`.
async fn start() -> (TestServer, Arc<Notify>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let gate = Arc::new(Notify::new());
    serve_upstream(listener, gate.clone());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llm.yaml");
    std::fs::write(&path, flowgate_testing::docs::read("docs/llm/llm.yaml")).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.upstream = Some(upstream.parse().unwrap());
    (TestServer::start_with(config, dir, vec![path]).await, gate)
}

const MINUTE: &str = r#"flowgate_charged_units_total{domain="llm",rule="budget_minute.user"}"#;
const DAY: &str = r#"flowgate_charged_units_total{domain="llm",rule="budget_day.user"}"#;

fn unread(reason: &str) -> String {
    format!(r#"flowgate_gateway_usage_unread_total{{reason="{reason}"}}"#)
}

/// `GET path` as `user` through the gateway: the response's first frame (its head must be
/// `200 text/event-stream`) and the rest of its body, still to be read.
async fn first_event(server: &TestServer, path: &str, user: &str) -> (Bytes, Incoming) {
    let request = Request::get(format!("http://{}{path}", server.gateway.unwrap()))
        .header("x-user", user)
        .body(Full::default())
        .unwrap();
    let response = tokio::time::timeout(STEP, client().request(request))
        .await
        .expect("the head in time")
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let first = tokio::time::timeout(STEP, body.frame())
        .await
        .expect("the first event in time, before the upstream sends more")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    (first, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_refuses_once_the_charged_usage_passes_it_and_the_stream_is_never_held() {
    let (server, gate) = start().await;

    // Ann's streamed completion of 600 tokens: the first event reaches her while the upstream
    // still holds the rest, which it sends only once she has it.
    let (first, body) = first_event(&server, "/stream/600?gate", "ann").await;
    let sent = events(600);
    assert_eq!(first, sent[0]);
    gate.notify_one();
    let rest = tokio::time::timeout(STEP, body.collect())
        .await
        .expect("the rest in time")
        .unwrap()
        .to_bytes();
    assert_eq!(rest, sent[1..].concat(), "every byte passed on unchanged");
    // Charged before the stream's end went on to the client.
    assert_eq!(server.metric(MINUTE).await, 600.0);
    assert_eq!(server.metric(DAY).await, 600.0);

    // 400 tokens left: the next completion passes, and its 600 are charged all the same.
    let json = get(&server, "/json/600", &[("x-user", "ann")]).await;
    assert_eq!(json.status, 200);
    assert_eq!(json.json()["usage"]["total_tokens"], 600);
    wait_metric(&server, MINUTE, 1200.0).await;

    // 200 tokens of debt on the minute budget (60 ms a token): refused for 12 s.
    let refused = get(&server, "/stream/10", &[("x-user", "ann")]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), "application/problem+json");
    let retry: u64 = refused.header("retry-after").parse().unwrap();
    assert!((11..=12).contains(&retry), "retry-after: {retry}");
    assert!(
        refused.header("ratelimit").contains("tokens_per_minute"),
        "{}",
        refused.header("ratelimit")
    );

    // Bob has his own budget.
    let bob = get(&server, "/stream/100", &[("x-user", "bob")]).await;
    assert_eq!(bob.status, 200);
    assert_eq!(bob.body, events(100).concat());
    assert_eq!(server.metric(MINUTE).await, 1300.0);
    assert_eq!(server.metric(&unread("missing")).await, 0.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_that_cannot_be_read_is_counted_and_not_charged() {
    let (server, gate) = start().await;

    // Not a number: passed on as it came, counted, nothing charged.
    let bad = get(&server, "/json/bad", &[("x-user", "cy")]).await;
    assert_eq!(bad.status, 200);
    assert_eq!(bad.json()["usage"]["total_tokens"], "lots");
    wait_metric(&server, &unread("invalid"), 1.0).await;
    assert_eq!(server.metric(MINUTE).await, 0.0);

    // Cut short before the usage: the client sees the body break, the gateway counts it.
    let (first, body) = first_event(&server, "/cut", "cy").await;
    assert_eq!(first, events(0)[0]);
    gate.notify_one();
    let rest = tokio::time::timeout(STEP, body.collect())
        .await
        .expect("the body ends in time");
    assert!(rest.is_err(), "the client sees the body cut short");
    wait_metric(&server, &unread("cut_short"), 1.0).await;
    assert_eq!(server.metric(MINUTE).await, 0.0);

    // The client goes away mid-stream, before the usage: counted likewise.
    let (_, body) = first_event(&server, "/stream/300?gate", "cy").await;
    drop(body);
    wait_metric(&server, &unread("cut_short"), 2.0).await;
    gate.notify_one();

    // A stream without usage: counted as missing.
    let none = get(&server, "/stream/none", &[("x-user", "cy")]).await;
    assert_eq!(none.status, 200);
    wait_metric(&server, &unread("missing"), 1.0).await;
    assert_eq!(server.metric(MINUTE).await, 0.0);

    // Nothing was charged: a large completion still passes, and is charged.
    let ok = get(&server, "/json/900", &[("x-user", "cy")]).await;
    assert_eq!(ok.status, 200);
    wait_metric(&server, MINUTE, 900.0).await;

    // Cut short after the usage: the tokens were used, and are charged.
    let (_, body) = first_event(&server, "/cut?usage", "dee").await;
    gate.notify_one();
    let rest = tokio::time::timeout(STEP, body.collect())
        .await
        .expect("the body ends in time");
    assert!(rest.is_err(), "the client sees the body cut short");
    wait_metric(&server, MINUTE, 1150.0).await;
    assert_eq!(server.metric(&unread("cut_short")).await, 2.0);
    server.stop().await;
}
