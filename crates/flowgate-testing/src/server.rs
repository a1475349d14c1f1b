//! A real server in-process on listeners bound to loopback port 0, and its HTTP and gRPC
//! clients.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
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
    /// The HTTP API (`/v1/check`, `/json`, `/metrics`, admin, dashboard).
    pub http: SocketAddr,
    /// The gRPC API (Envoy's `ShouldRateLimit`).
    pub grpc: SocketAddr,
    /// The gateway, when the configuration has an upstream.
    pub gateway: Option<SocketAddr>,
    /// The WebSocket gateway, when the configuration has a `websocket` section.
    pub websocket: Option<SocketAddr>,
    /// The temporary directory holding the configuration files (removed when dropped).
    pub dir: tempfile::TempDir,
    /// The configuration files served, in `dir`.
    pub files: Vec<PathBuf>,
    /// Ends the server (dropped or sent: `stop`).
    stop: Option<oneshot::Sender<()>>,
    /// The server's task, awaited by `stop`.
    handle: Option<JoinHandle<std::io::Result<()>>>,
    /// One HTTP client (its own connection pool) for `request` and friends.
    client: Client<HttpConnector, Full<Bytes>>,
}

/// An HTTP response: status, headers, body.
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The response's header fields.
    pub headers: hyper::HeaderMap,
    /// The whole body (UTF-8).
    pub body: String,
}

impl HttpResponse {
    /// The body as JSON (panics, showing it, when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The value of header `name`, if present.
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

    /// `method path` with a JSON `body`.
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

    /// `POST path` with a JSON `body`.
    pub async fn post(&self, path: &str, body: &str) -> HttpResponse {
        self.request("POST", path, body).await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> HttpResponse {
        self.request("GET", path, "").await
    }

    /// A gRPC client of the rate-limit service.
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

/// Polls `series` until it is `value` (bounded by [`crate::STEP`]).
pub async fn wait_metric(server: &TestServer, series: &str, value: f64) {
    let deadline = std::time::Instant::now() + crate::STEP;
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
