//! A service that must pace its own calls to an SMS gateway.
//!
//! ```text
//! cargo run -p example-outbound-client
//! ```
//!
//! Starts a stand-in SMS gateway on loopback that allows 5 messages per second (Flowgate's
//! rate-limit layer on the gateway side answers 429 with `Retry-After` beyond that), then sends
//! 10 messages as fast as it can — several are refused — and 10 more through
//! [`OutboundLimitLayer`] paced at 5 per second: each waits its turn, in order, and none is
//! refused. Had the gateway asked for a pause (`429` + `Retry-After`), the layer would have
//! held the queue for that long.

#![allow(clippy::print_stdout)] // a demo that reports what it did

use std::error::Error;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use flowgate::Quota;
use flowgate::http::key::Global;
use flowgate::http::outbound::{BoxError, OutboundLimitLayer};
use flowgate::http::{Limit, Limits, RateLimitLayer};
use flowgate::store::MemoryStore;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, Service, ServiceExt};

/// The gateway's published limit: 5 messages per second (bursts of 2 absorb network jitter).
fn gateway_quota() -> Result<Quota, flowgate::QuotaError> {
    Quota::per_second(5).with_burst(2)
}

/// Starts the stand-in gateway on 127.0.0.1, port 0, and returns its base URL.
async fn start_gateway() -> Result<String, Box<dyn Error>> {
    let policy = Limits::new().limit(Limit::new("sms", Global::default(), gateway_quota()?));
    let app = Router::new()
        .route("/send", post(|| async { "queued\n" }))
        .layer(RateLimitLayer::new(MemoryStore::new(), policy)?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// Sends `n` messages through `client`, all at once, and reports how each fared.
async fn send_all<S>(
    client: S,
    url: &str,
    n: usize,
) -> Result<Vec<(StatusCode, Duration)>, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<hyper::body::Incoming>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
{
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let request = Request::post(format!("{url}/send?to=+15550000{i:03}"))
            .body(Full::new(Bytes::from(format!("message {i}"))))?;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let response = client.oneshot(request).await.map_err(Into::into)?;
            Ok::<_, BoxError>((response.status(), start.elapsed()))
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await??);
    }
    Ok(results)
}

fn print(label: &str, results: &[(StatusCode, Duration)]) {
    println!("{label}:");
    for (i, (status, at)) in results.iter().enumerate() {
        println!("  message {i:2}  {:>4} ms  {status}", at.as_millis());
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = start_gateway().await.map_err(|e| e.to_string())?;
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();

    let unpaced = send_all(http.clone(), &url, 10).await?;
    print("unpaced", &unpaced);
    tokio::time::sleep(Duration::from_secs(1)).await; // let the gateway's bucket refill

    // Our side: 5 per second, one at a time, never more than 5 s of waiting.
    let pacer = OutboundLimitLayer::builder(Quota::per_second(5).with_burst(1)?)
        .max_delay(Duration::from_secs(5))
        .build();
    let paced = send_all(pacer.layer(http), &url, 10).await?;
    print("paced at 5/s", &paced);

    let refused = |r: &[(StatusCode, Duration)]| r.iter().filter(|(s, _)| *s == 429).count();
    println!(
        "refused by the gateway: {} of 10 unpaced, {} of 10 paced",
        refused(&unpaced),
        refused(&paced)
    );
    if refused(&paced) > 0 {
        return Err("a paced message was refused".into());
    }
    Ok(())
}
