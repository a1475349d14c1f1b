//! The outbound (client-side) limiter: pacing, FIFO order, bounded waits and `Retry-After`.
//! Logic tests run on tokio's paused clock; one short test runs over real HTTP on loopback.
#![cfg(feature = "tower")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flowgate::Quota;
use flowgate::clock::TokioClock;
use flowgate::http::outbound::{BoxError, OutboundError, OutboundLimitLayer};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt, service_fn};

/// What the fake upstream saw: (request id, path, arrival time).
type Log = Arc<Mutex<Vec<(usize, String, Instant)>>>;

/// An upstream that records arrivals and answers 429 + `Retry-After` to the paths in `throttle`.
fn upstream(
    log: Log,
    throttle: &'static [&'static str],
    retry_after: &'static str,
) -> impl Service<
    Request<usize>,
    Response = Response<()>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |request: Request<usize>| {
        let log = log.clone();
        async move {
            let path = request.uri().path().to_owned();
            let mut log = log.lock().unwrap();
            let seen = log.iter().filter(|(_, p, _)| *p == path).count();
            log.push((*request.body(), path.clone(), Instant::now()));
            let mut response = Response::new(());
            if throttle.contains(&path.as_str()) && seen == 0 {
                *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                response
                    .headers_mut()
                    .insert("retry-after", retry_after.parse().unwrap());
            }
            Ok(response)
        }
    })
}

fn request(host: &str, path: &str, id: usize) -> Request<usize> {
    Request::get(format!("http://{host}{path}"))
        .body(id)
        .unwrap()
}

fn outbound_error(e: BoxError) -> OutboundError {
    *e.downcast::<OutboundError>().unwrap()
}

#[tokio::test(start_paused = true)]
async fn paces_50_calls_to_the_rate_in_fifo_order() {
    let log = Log::default();
    let layer = OutboundLimitLayer::builder(Quota::per_second(20).with_burst(1).unwrap())
        .clock(TokioClock::new())
        .build();
    let client = layer.layer(upstream(log.clone(), &[], ""));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for id in 0..50 {
        let call = client.clone().oneshot(request("bank.example", "/pay", id));
        tasks.push(tokio::spawn(call));
        tokio::task::yield_now().await;
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let log = log.lock().unwrap();
    let ids: Vec<_> = log.iter().map(|e| e.0).collect();
    assert_eq!(ids, (0..50).collect::<Vec<_>>(), "first come, first served");
    for (i, (_, _, at)) in log.iter().enumerate() {
        assert_eq!(*at - start, Duration::from_millis(50 * i as u64));
    }
    let rate = 49.0 / (log[49].2 - log[0].2).as_secs_f64();
    assert!((rate - 20.0).abs() <= 20.0 * 0.05, "{rate}/s");
}

#[tokio::test(start_paused = true)]
async fn obeys_retry_after_by_pausing_only_that_key() {
    let log = Log::default();
    let layer = OutboundLimitLayer::builder(Quota::per_second(10).with_burst(1).unwrap())
        .max_delay(Duration::from_secs(5))
        .clock(TokioClock::new())
        .build();
    let client = layer.layer(upstream(log.clone(), &["/throttled"], "2"));
    let start = Instant::now();
    let mut tasks = Vec::new();
    let paths = ["/a", "/b", "/throttled", "/c", "/d"];
    for (id, path) in paths.iter().enumerate() {
        tasks.push(tokio::spawn(client.clone().oneshot(request(
            "sms.example",
            path,
            id,
        ))));
        tokio::task::yield_now().await;
    }
    // Another upstream, called during the pause, is not held up by it.
    let other = tokio::spawn({
        let client = client.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            client.oneshot(request("other.example", "/x", 99)).await
        }
    });
    let statuses: Vec<_> = futures_join(tasks).await;
    assert_eq!(statuses[2], StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(other.await.unwrap().unwrap().status(), 200);
    let at = |id: usize| {
        let log = log.lock().unwrap();
        let entry = log.iter().find(|e| e.0 == id).unwrap();
        entry.2 - start
    };
    assert_eq!(at(0), Duration::ZERO);
    assert_eq!(at(1), Duration::from_millis(100));
    assert_eq!(at(2), Duration::from_millis(200));
    // The 429 at 200 ms paused the key for 2 s; the queue resumes at the steady pace.
    assert_eq!(at(3), Duration::from_millis(2_300));
    assert_eq!(at(4), Duration::from_millis(2_400));
    assert_eq!(at(99), Duration::from_secs(1));
    assert_eq!(layer.paused_for("sms.example"), Duration::ZERO);

    // A pause longer than the maximum delay makes new requests fail at once.
    let log = Log::default();
    let layer = OutboundLimitLayer::builder(Quota::per_second(10))
        .max_delay(Duration::from_secs(1))
        .clock(TokioClock::new())
        .build();
    let client = layer.layer(upstream(log.clone(), &["/throttled"], "30"));
    let response = client
        .clone()
        .oneshot(request("sms.example", "/throttled", 0))
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(layer.paused_for("sms.example"), Duration::from_secs(30));
    let before = Instant::now();
    let error = client
        .clone()
        .oneshot(request("sms.example", "/a", 1))
        .await
        .unwrap_err();
    assert_eq!(Instant::now(), before);
    assert!(matches!(
        outbound_error(error),
        OutboundError::Paused { remaining, .. } if remaining == Duration::from_secs(30)
    ));
}

async fn futures_join(
    tasks: Vec<tokio::task::JoinHandle<Result<Response<()>, BoxError>>>,
) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap().unwrap().status());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn waits_are_bounded_and_cancelled_waiters_give_their_turn_back() {
    let log = Log::default();
    let layer = OutboundLimitLayer::builder(Quota::per_second(10).with_burst(1).unwrap())
        .max_delay(Duration::from_millis(250))
        .max_queue(3)
        .clock(TokioClock::new())
        .build();
    let client = layer.layer(upstream(log.clone(), &[], ""));
    let start = Instant::now();
    client.clone().oneshot(request("h", "/", 0)).await.unwrap();
    let second = tokio::spawn(client.clone().oneshot(request("h", "/", 1)));
    let third = tokio::spawn(client.clone().oneshot(request("h", "/", 2)));
    tokio::task::yield_now().await;
    assert_eq!(layer.queued("h"), 2);
    // A fourth would leave at 300 ms > 250 ms: refused at once, nothing taken.
    let error = client
        .clone()
        .oneshot(request("h", "/", 3))
        .await
        .unwrap_err();
    assert_eq!(Instant::now(), start);
    assert!(matches!(
        outbound_error(error),
        OutboundError::DelayTooLong { delay, .. } if delay == Duration::from_millis(300)
    ));
    // The third gives up: its turn (200 ms) is free again for the next caller.
    third.abort();
    let _ = third.await;
    tokio::task::yield_now().await;
    assert_eq!(layer.queued("h"), 1);
    let next = tokio::spawn(client.clone().oneshot(request("h", "/", 4)));
    second.await.unwrap().unwrap();
    next.await.unwrap().unwrap();
    let log = log.lock().unwrap();
    let times: Vec<_> = log.iter().map(|e| (e.0, e.2 - start)).collect();
    assert_eq!(
        times,
        [
            (0, Duration::ZERO),
            (1, Duration::from_millis(100)),
            (4, Duration::from_millis(200))
        ]
    );
}

/// Serves `handler` over HTTP/1 on 127.0.0.1, port 0.
async fn serve<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handler = handler.clone();
            let service = hyper::service::service_fn(move |r| {
                let f = handler(r);
                async move { Ok::<_, std::convert::Infallible>(f.await) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    addr
}

#[tokio::test]
async fn paces_real_http_calls_within_5_percent_and_honours_retry_after() {
    let arrivals = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
    let addr = serve({
        let arrivals = arrivals.clone();
        move |request: Request<hyper::body::Incoming>| {
            let arrivals = arrivals.clone();
            async move {
                let path = request.uri().path().to_owned();
                let mut arrivals = arrivals.lock().unwrap();
                let first_throttled = path == "/throttled" && !arrivals.iter().any(|a| a.0 == path);
                arrivals.push((path, Instant::now()));
                let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
                if first_throttled {
                    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    response
                        .headers_mut()
                        .insert("retry-after", "1".parse().unwrap());
                }
                response
            }
        }
    })
    .await;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let warm = http.clone();
    let layer = OutboundLimitLayer::builder(Quota::per_second(100).with_burst(1).unwrap())
        .max_delay(Duration::from_secs(5))
        .build();
    let client = layer.layer(http);
    let get = |path: &str, id: usize| {
        Request::get(format!("http://{addr}{path}?id={id}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };

    // Open the keep-alive connection first, so the first paced call does not pay for it.
    warm.oneshot(get("/warm-up", 0)).await.unwrap();
    let mut tasks = Vec::new();
    for id in 0..50 {
        tasks.push(tokio::spawn(client.clone().oneshot(get("/pace", id))));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status(), 200);
    }
    let times: Vec<_> = arrivals
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.0 == "/pace")
        .map(|a| a.1)
        .collect();
    assert_eq!(times.len(), 50);
    // The rate is the slope of arrival time over arrival number (least squares), which one
    // late arrival on a busy machine cannot skew much; the span must agree too.
    let secs: Vec<f64> = times
        .iter()
        .map(|t| (*t - times[0]).as_secs_f64())
        .collect();
    let n = secs.len() as f64;
    let mean_i = (n - 1.0) / 2.0;
    let mean_t = secs.iter().sum::<f64>() / n;
    let (mut cov, mut var) = (0.0, 0.0);
    for (i, t) in secs.iter().enumerate() {
        cov += (i as f64 - mean_i) * (t - mean_t);
        var += (i as f64 - mean_i).powi(2);
    }
    let rate = var / cov;
    let span = secs[49];
    println!("paced 50 loopback calls at {rate:.2} requests/s over {span:.3} s (configured 100/s)");
    assert!((rate - 100.0).abs() <= 5.0, "{rate:.1} requests/s");
    assert!(span >= 0.49 * 0.95, "{span:.3} s: faster than the rate");

    // Retry-After: 1 from the upstream pauses the next request for (at least) a second.
    let throttled = client.clone().oneshot(get("/throttled", 0)).await.unwrap();
    assert_eq!(throttled.status(), 429);
    let after = client.clone().oneshot(get("/throttled", 1)).await.unwrap();
    assert_eq!(after.status(), 200);
    let arrivals = arrivals.lock().unwrap();
    let throttled: Vec<_> = arrivals.iter().filter(|a| a.0 == "/throttled").collect();
    let gap = throttled[1].1 - throttled[0].1;
    assert!(gap >= Duration::from_secs(1), "{gap:?}");
    assert!(gap < Duration::from_millis(1_500), "{gap:?}");
}
