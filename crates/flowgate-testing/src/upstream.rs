//! A real HTTP/1.1 upstream (hyper) for the gateway tests, and a real client for the gateway.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

use crate::server::TestServer;

pub use crate::STEP;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The request method.
    pub method: String,
    /// The request target, as received.
    pub uri: String,
    /// The header fields, as received.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

/// The body of the upstream's responses.
pub type UpstreamBody = BoxBody<Bytes, Infallible>;

/// A real upstream on 127.0.0.1:0:
/// * `/download/N`: N deterministic bytes, with hop-by-hop fields in the response;
/// * `/stream`: one chunk, then waits for the test to send the rest over `release`;
/// * `/slow`: answers only when the test says so (never, in the 504 test);
/// * `/close`: answers `Connection: close` and closes the connection;
/// * anything else: records the request and echoes its body.
///
/// It counts the connections it accepted and those that have ended, and can close its idle
/// ones (`close_idle`), as an upstream's keep-alive timeout would.
pub struct Upstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Every request it answered whole, in order.
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Chunks for `/stream`'s body after the first; dropping it ends the body.
    pub release: Option<mpsc::Sender<Bytes>>,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    /// Connections ended so far.
    pub ended: Arc<AtomicUsize>,
    /// Bumped to close the idle connections (`close_idle`).
    pub close_idle: watch::Sender<u32>,
    /// Stops accepting when dropped.
    pub _stop: oneshot::Sender<()>,
}

/// The `n` deterministic bytes `/download/N` answers (for byte-exact comparisons).
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

impl Upstream {
    /// Starts it on 127.0.0.1:0.
    pub async fn start() -> Upstream {
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

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` connections have ended.
    pub async fn ended(&self, n: usize) {
        tokio::time::timeout(STEP, async {
            while self.ended.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} upstream connections should have ended"));
    }

    /// Closes every idle connection, as a keep-alive timeout does.
    pub fn close_idle(&self) {
        self.close_idle.send_modify(|n| *n += 1);
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A copy of the requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// The upstream's answer to one request (see [`Upstream`]).
pub async fn answer(
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
    if let Some(n) = path.strip_prefix("/usage/") {
        // What an LLM upstream reports after answering: the tokens the request used.
        return Response::builder()
            .header("x-usage-tokens", n)
            .body(Full::new(Bytes::from_static(b"answered")).boxed())
            .unwrap();
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
    // A body cut short (the gateway gave it up) is answered 400 — on a connection that is
    // closing anyway — and not recorded as a request seen whole.
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Response::builder()
            .status(400)
            .body(Full::new(Bytes::from_static(b"incomplete body")).boxed())
            .unwrap();
    };
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
pub async fn gateway(yaml: &str, upstream: &str) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.upstream = Some(upstream.parse().unwrap());
    TestServer::start_with(config, dir, vec![path]).await
}

/// A fresh client (its own connection pool).
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A response the gateway's client read whole.
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The response's header fields.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Answer {
    /// The value of header `name` (panics when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
            .to_str()
            .unwrap()
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// Sends `request` with `client` and reads the whole answer, each within [`STEP`].
pub async fn send(
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

/// `GET path` through `server`'s gateway with extra `headers`, on a fresh client.
pub async fn get(server: &TestServer, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = Request::get(format!("http://{}{path}", server.gateway.unwrap()));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    send(&client(), request.body(Full::default()).unwrap()).await
}

/// Runs the futures concurrently on the test's runtime and returns their outputs in order.
pub async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
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

/// Writes `raw` on a new connection to `addr` and reads the whole answer (the gateway closes
/// the connection after an error).
pub async fn raw(addr: SocketAddr, raw: &str) -> String {
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

/// A gateway section that lets everything through (one descriptor per client address).
pub const PASS_ALL: &str = r#"
domain: edge
gateway:
  descriptors:
    - [{key: remote_address}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"#;
