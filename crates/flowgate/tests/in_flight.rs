//! The in-flight layer (`http::InFlightLayer`): a request holds a lease from its arrival until
//! its response body ends or is dropped — a streaming response keeps its slot while it
//! streams; a full key is refused with 429 and `Retry-After`; a rejected key gets its status;
//! a lease store that cannot answer is 503 (`fail: closed`) or passes uncounted (`open`).
#![cfg(all(feature = "tower", feature = "axum"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use flowgate::FailMode;
use flowgate::http::InFlightLayer;
use flowgate::http::key::Header;
use flowgate::lease::{Leases, MemoryLeases, Terms};
use flowgate_testing::leases::AwayLeases;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};

/// A body that sends `first`, then ends when its sender fires (or is dropped).
struct Streaming {
    first: Option<Bytes>,
    end: oneshot::Receiver<()>,
}

impl Body for Streaming {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        Pin::new(&mut self.end).poll(cx).map(|_| None)
    }
}

fn request(key: Option<&str>) -> Request<()> {
    let mut request = Request::builder().uri("/");
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    request.body(()).unwrap()
}

/// Waits (bounded) until `key` of limit `name` holds `n` leases: giving one back runs on a
/// spawned task.
async fn until_held(leases: &MemoryLeases, name: &str, key: &str, n: u64) {
    let key = flowgate::lease::key(name, key);
    for _ in 0..1000 {
        if leases.held(&key).await.unwrap() == n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{key} never held {n}");
}

#[tokio::test]
async fn a_streaming_response_holds_its_slot_until_its_body_ends() {
    let leases = std::sync::Arc::new(MemoryLeases::new());
    let terms = Terms::new(2, Duration::from_secs(60)).unwrap();
    let layer = InFlightLayer::new(
        "per-key",
        leases.clone(),
        Header::new(http::HeaderName::from_static("x-api-key")),
        terms,
    );
    let (ends_tx, mut ends_rx) = tokio::sync::mpsc::unbounded_channel();
    let inner = tower::service_fn(move |_: Request<()>| {
        let (end, wait) = oneshot::channel();
        ends_tx.send(end).unwrap();
        async move {
            Ok::<_, Infallible>(Response::new(Streaming {
                first: Some(Bytes::from_static(b"first")),
                end: wait,
            }))
        }
    });
    let mut service = layer.layer(inner);

    let one = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("ann")))
        .await
        .unwrap();
    let two = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("ann")))
        .await
        .unwrap();
    assert_eq!(
        (one.status(), two.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    // Both still streaming: ann is full; bob is not.
    let full = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("ann")))
        .await
        .unwrap();
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(full.headers()["retry-after"], "60");
    assert_eq!(full.headers()["content-type"], "application/problem+json");
    let bob = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("bob")))
        .await
        .unwrap();
    assert_eq!(bob.status(), StatusCode::OK);
    drop(bob);
    // The first response's body ends: its slot comes back.
    let mut body = one.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first");
    let end = ends_rx.recv().await.unwrap();
    end.send(()).unwrap();
    assert!(body.frame().await.is_none());
    until_held(&leases, "per-key", "ann", 1).await;
    let three = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("ann")))
        .await
        .unwrap();
    assert_eq!(three.status(), StatusCode::OK);
    // A body dropped before its end gives its slot back too.
    drop(two);
    drop(three);
    until_held(&leases, "per-key", "ann", 0).await;
    // A request without the key is refused by the extractor (401), taking nothing.
    let anonymous = service
        .ready()
        .await
        .unwrap()
        .call(request(None))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_store_away_fails_closed_by_default_or_open_when_asked() {
    let terms = Terms::new(1, Duration::from_secs(1)).unwrap();
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
            Bytes::from_static(b"ok"),
        )))
    });
    let key = || Header::new(http::HeaderName::from_static("x-api-key"));
    let closed = InFlightLayer::new("n", AwayLeases, key(), terms).layer(inner);
    let answer = closed.oneshot(request(Some("ann"))).await.unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    let open = InFlightLayer::new("n", AwayLeases, key(), terms)
        .fail(FailMode::Open)
        .layer(inner);
    let answer = open.oneshot(request(Some("ann"))).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(answer.into_body().collect().await.unwrap().to_bytes(), "ok");
}
