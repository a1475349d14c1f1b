//! A real server on loopback port 0, and real HTTP and gRPC clients for it.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use flowgate_server::server::{self, Listeners, ServerConfig};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A running server and its temporary configuration directory.
pub struct TestServer {
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    /// The gateway, when the configuration has an upstream.
    pub gateway: Option<SocketAddr>,
    /// The WebSocket gateway, when the configuration has a `websocket` section.
    pub websocket: Option<SocketAddr>,
    pub dir: tempfile::TempDir,
    pub files: Vec<PathBuf>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<std::io::Result<()>>>,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// An HTTP response: status, headers, body.
pub struct HttpResponse {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

impl TestServer {
    /// Writes `files` (name, YAML) into a temporary directory and serves them.
    pub async fn start(files: &[(&str, &str)]) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Vec::new();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            paths.push(path);
        }
        let config = ServerConfig::load(paths.clone()).unwrap();
        Self::start_with(config, dir, paths).await
    }

    /// Serves `config`.
    pub async fn start_with(
        config: ServerConfig,
        dir: tempfile::TempDir,
        files: Vec<PathBuf>,
    ) -> TestServer {
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (http_addr, grpc_addr) = (http.local_addr().unwrap(), grpc.local_addr().unwrap());
        let gateway = match config.upstream {
            Some(_) => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            None => None,
        };
        let gateway_addr = gateway.as_ref().map(|g| g.local_addr().unwrap());
        let websocket = match config.policy.websocket {
            Some(_) => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            None => None,
        };
        let websocket_addr = websocket.as_ref().map(|g| g.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(server::run(
            config,
            Listeners {
                http: Some(http),
                grpc: Some(grpc),
                gateway,
                websocket,
            },
            async {
                let _ = stopped.await;
            },
        ));
        TestServer {
            http: http_addr,
            grpc: grpc_addr,
            gateway: gateway_addr,
            websocket: websocket_addr,
            dir,
            files,
            stop: Some(stop),
            handle: Some(handle),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Stops the server and waits for it to finish.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.handle.take().unwrap())
            .await
            .expect("the server stops within 10 s")
            .unwrap()
            .unwrap();
    }

    pub async fn request(&self, method: &str, path: &str, body: &str) -> HttpResponse {
        self.request_with(method, path, &[], body).await
    }

    /// `method path` with extra `headers`.
    pub async fn request_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> HttpResponse {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{}{}", self.http, path))
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(10), self.client.request(request))
            .await
            .expect("answer within 10 s")
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        HttpResponse {
            status,
            headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    pub async fn post(&self, path: &str, body: &str) -> HttpResponse {
        self.request("POST", path, body).await
    }

    pub async fn get(&self, path: &str) -> HttpResponse {
        self.request("GET", path, "").await
    }

    pub async fn rls(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// The value of a metric series in `/metrics` (0 when absent).
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self.get("/metrics").await.body;
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request for `domain` with `descriptors`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// Calls ShouldRateLimit.
pub async fn should(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

/// A loopback address whose port was free a moment ago.
pub fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `GET path` over a fresh HTTP/1.1 connection; the whole response, or `None` if none came.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
}

/// `POST path` with a JSON `body` over a fresh HTTP/1.1 connection; the whole response.
pub fn http_post(addr: SocketAddr, path: &str, body: &str) -> String {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    exchange(addr, &request).expect("an answer")
}

/// Writes a raw `request` on a new connection; the whole response.
pub fn exchange_raw(addr: SocketAddr, request: &str) -> Option<String> {
    exchange(addr, request)
}

/// Writes `request` on a new connection and reads until the server closes it.
fn exchange(addr: SocketAddr, request: &str) -> Option<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    conn.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    Some(response)
}

/// Reads until the peer closes (`Ok(bytes)`), within [`crate::upstream::STEP`].
pub async fn until_closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let step = crate::upstream::STEP;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(step, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!("still open after {step:?}"),
        }
    }
}

/// Polls `series` until it is `value` (bounded by [`crate::upstream::STEP`]).
pub async fn wait_metric(server: &TestServer, series: &str, value: f64) {
    let deadline = std::time::Instant::now() + crate::upstream::STEP;
    loop {
        let now = server.metric(series).await;
        if now == value {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{series} is {now}, not {value}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
